/* fuzz_plan.c: the cluster and plan JSON readers (src/plan, cluster_load / plan_load) on
 * arbitrary files. Byte 0 chooses the reader (even: cluster, odd: plan). */
#include "fuzz_util.h"

#include "plan.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    pd_log_set_level(LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
    if (len < 1) return 0;
    const char *path = fuzz_write(fuzz_dir("plan"), "in.json", data + 1, len - 1);
    Err err = {0};
    if (data[0] & 1) {
        Plan *p = plan_load(path, &err);
        if (p) {
            plan_validate(p, p->n_layers, &err);
            for (int r = 0; r < p->n_workers && r < 1024; r++) {
                int rep;
                (void)plan_stage_of_rank(p, r, &rep);
            }
            plan_free(p);
        }
    } else {
        Cluster c;
        if (cluster_load(path, &c, &err) == PD_OK && cluster_check(&c, &err) == PD_OK) {
            int n = cluster_total_workers(&c);
            for (int a = 0; a < n && a < 64; a++) (void)cluster_link_level(&c, 0, a);
        }
    }
    return 0;
}
