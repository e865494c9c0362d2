/* test_memory.c: the runtime's allocation equals the simulator's prediction. For plans and
 * schedules of every kind (1f1b on 2 and 3 stages with a replicated stage, with vertical
 * sync, gpipe, 1f1b-flush, 2bw, dp, model-parallel with idle ranks), a short run of the
 * runtime (serial emulation or threads) reports what each worker allocated (RtMem), and the
 * simulator run on the same schedule must predict:
 *   - the same number of weight-version buffers and activation slots per worker (both read
 *     the schedule analysis, sched_analyze), and the run must have used every version
 *     buffer it allocated (RtWorkerResult.max_versions);
 *   - the same bytes in every category when its costs are given the runtime's bytes of one
 *     version and of one slot: versions x param_bytes + slots x stash_bytes (+ gradients and
 *     optimizer state) is exactly what the runtime allocated.
 * zb-h1 and zb-h2 too: their slots also hold the output gradients a unit's BI keeps for its BW.
 * The runtime's per-slot bytes are also recomputed here from the nn API (context, gradient
 * and label buffers), so RtMem is checked against the allocation itself, not only against
 * the simulator. Linked with pd_runtime (CMakeLists.txt). */
#include "rt_fixture.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime.h"
#include "sim.h"

static char mlp_path[64], cnn_path[64];
static Dataset train;
enum { B = 4 };

static int setup(void **state) {
    (void)state;
    rt_models_write(mlp_path, cnn_path);
    Err err = {0};
    if (data_synthetic(320, 1, 28, 28, 10, 7, &train, &err)) fail_msg("%s", err.msg);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    rt_models_remove(mlp_path, cnn_path);
    data_release(&train);
    return 0;
}

/* Bytes of one activation slot of the stage running layers [first, last), from the nn API:
 * the context, dy (output), dx (input, not at the input stage), float and int labels, and for
 * the zb kinds (split) the output gradients BI keeps for BW (model_split_floats). */
static size_t slot_bytes(const char *model, int first, int last, int is_input, int split) {
    Err err = {0};
    Model *m = model_load(model, &err);
    if (!m) fail_msg("%s", err.msg);
    if (model_build(m, first, last, B, &err)) fail_msg("%s", err.msg);
    NnCtx *c = nnctx_new(m, first, last, B);
    size_t n = nnctx_bytes(c) + (size_t)B * shape_numel(model_layer_out_shape(m, last - 1)) * sizeof(float) +
               (is_input ? 0 : (size_t)B * shape_numel(model_layer_in_shape(m, first)) * sizeof(float)) +
               (size_t)B * (sizeof(float) + sizeof(int32_t)) +
               (split ? model_split_floats(m, first, last, B) * sizeof(float) : 0);
    nnctx_free(c);
    model_free(m);
    return n;
}

typedef struct Case {
    const char *model;
    int n_stages;
    int bounds[6], reps[5];
    SchedKind kind;
    int n_mb, n_micro, vsync;
    int threads;   /* rt_run_threads instead of rt_emulate */
    int adam;
} Case;

static void run_case(const Case *k) {
    TPlan tp;
    tplan(&tp, k->n_stages, k->bounds, k->reps);
    Schedule s;
    Err err = {0};
    SchedOpts so = {.kind = k->kind, .n_minibatches = k->n_mb, .n_micro = k->n_micro, .vertical_sync = k->vsync};
    if (sched_build(&tp.p, &so, &s, &err)) fail_msg("sched_build: %s", err.msg);
    RtConfig cfg = {0};
    cfg.model_path = k->model;
    cfg.sched = &s;
    cfg.unit_batch = B;
    cfg.opt = optim_defaults(k->adam ? OPT_ADAM : OPT_SGD, 0.01f);
    cfg.opt.momentum = k->adam ? 0 : 0.9f;
    cfg.seed = 5;
    cfg.train = &train;
    cfg.recv_timeout_s = 60;
    cfg.threads = 1;
    RtWorkerResult res[16];
    memset(res, 0, sizeof res);
    PD_ASSERT(s.n_ranks <= 16);
    int rc = k->threads ? rt_run_threads(&cfg, res, &err) : rt_emulate(&cfg, res, &err);
    if (rc) fail_msg("%s %s: %s", sched_kind_name(k->kind), k->threads ? "threads" : "emulation", err.msg);

    SchedAnalysis an;
    if (sched_analyze(&s, &an, &err)) fail_msg("sched_analyze: %s", err.msg);
    /* The simulator's costs from the runtime's bytes of one version and one slot (replica 0). */
    SimCosts c = {s.n_stages, calloc((size_t)s.n_stages, sizeof(SimStageCost))};
    PD_ASSERT(c.stage);
    for (int i = 0; i < s.n_stages; i++) {
        const RtMem *m0 = &res[s.stages[i].ranks[0]].mem;
        assert_true(m0->slots > 0);
        c.stage[i].fwd_s = 1e-3;
        c.stage[i].bwd_s = 2e-3;
        c.stage[i].param_bytes = (double)m0->params;
        c.stage[i].stash_bytes = (double)(m0->activations / (size_t)m0->slots);
        c.stage[i].scratch_bytes = (double)m0->scratch;
        assert_int_equal(m0->activations % (size_t)m0->slots, 0);
        const SchedStage *ss = &s.stages[i];
        size_t want = slot_bytes(k->model, ss->layers[0], ss->layers[ss->n_layers - 1] + 1, i == 0,
                                 sched_splits_backward(&s));
        if (m0->activations / (size_t)m0->slots != want)
            fail_msg("stage %d: the runtime counts %zu bytes per slot, the nn API gives %zu", i,
                     m0->activations / (size_t)m0->slots, want);
    }
    SimOpts o = {NULL, k->adam ? 2 : 1, 0, 0, 0, 0, NULL, 0};   /* SGD allocates its momentum buffer, Adam two */
    SimResult sr;
    if (sim_run(&s, &c, &o, &sr, &err)) fail_msg("sim_run: %s", err.msg);

    for (int r = 0; r < s.n_ranks; r++) {
        const RtMem *m = &res[r].mem;
        const SimMem *p = &sr.mem[r];
        const SchedWorkerInfo *wi = &an.workers[r];
        char what[96];
        snprintf(what, sizeof what, "%s stages=%d rank %d", sched_kind_name(k->kind), k->n_stages, r);
        if (s.workers[r].stage < 0) {   /* idle (model-parallel): nothing allocated, nothing predicted */
            assert_int_equal(m->total, 0);
            assert_int_equal(m->slots, 0);
            assert_int_equal(sr.slots[r], 0);
            assert_int_equal(sr.worker_versions[r], 0);
            continue;
        }
        print_message("%s: versions %d slots %d (in flight %d), bytes: params %zu stashed %zu activations %zu total %zu\n",
                      what, m->versions, m->slots, wi->max_inflight, m->params, m->stashed, m->activations, m->total);
        /* counts: runtime == simulator == analysis */
        if (m->versions != sr.worker_versions[r] || m->slots != sr.slots[r])
            fail_msg("%s: runtime %d versions %d slots, simulator %d versions %d slots", what, m->versions, m->slots,
                     sr.worker_versions[r], sr.slots[r]);
        assert_int_equal(m->versions, wi->max_versions_alive);
        assert_int_equal(m->slots, wi->n_slots);
        assert_int_equal(m->slots, sr.max_inflight[r] + SCHED_SLOTS_AHEAD);
        /* every allocated version buffer was in use at some point of the run */
        assert_int_equal(res[r].max_versions, m->versions);
        /* bytes */
        assert_int_equal(m->params, res[r].n_params * sizeof(float));
        assert_int_equal(m->workspace, res[r].n_state * sizeof(float));
        assert_int_equal(m->total, m->params + m->grads + m->opt_state + m->stashed + m->activations + m->comm + m->workspace +
                                       m->scratch);
        /* the kernel scratch each worker's build asked for: replicas alike (each built on an empty arena) */
        assert_int_equal(m->scratch, res[s.stages[s.workers[r].stage].ranks[0]].mem.scratch);
        if (p->params != (double)m->params || p->grads != (double)m->grads || p->opt_state != (double)m->opt_state ||
            p->alloc_stashed != (double)m->stashed || p->alloc_activations != (double)m->activations ||
            p->allocated != (double)(m->total - m->workspace - m->comm))
            fail_msg("%s: predicted params %.0f grads %.0f opt %.0f stashed %.0f activations %.0f allocated %.0f; "
                     "runtime %zu %zu %zu %zu %zu %zu",
                     what, p->params, p->grads, p->opt_state, p->alloc_stashed, p->alloc_activations, p->allocated,
                     m->params, m->grads, m->opt_state, m->stashed, m->activations, m->total - m->workspace - m->comm);
        /* the time-varying peak never exceeds the allocation */
        assert_true(p->peak <= p->allocated);
    }
    for (int i = 0; i < s.n_stages; i++) {
        int most = 0;
        for (int j = 0; j < s.stages[i].replicas; j++)
            if (res[s.stages[i].ranks[j]].mem.versions > most) most = res[s.stages[i].ranks[j]].mem.versions;
        assert_int_equal(sr.versions_alive[i], most);
        assert_int_equal(an.stage_versions[i], most);
    }
    sim_result_release(&sr);
    sim_costs_release(&c);
    sched_analysis_release(&an);
    for (int r = 0; r < s.n_ranks; r++) rt_result_release(&res[r]);
    sched_release(&s);
}

/* MLP top-level layers: 0 flatten, 1-4 linear. CNN: 0 conv, 1 bn, 2 pool, 3 flatten, 4
 * linear, 5 dropout, 6 linear. */
static void test_1f1b(void **state) {
    (void)state;
    run_case(&(Case){mlp_path, 2, {0, 2, 5}, {2, 1}, SCHED_1F1B, 8, 1, 0, 0, 0});
    run_case(&(Case){mlp_path, 3, {0, 2, 3, 5}, {1, 2, 1}, SCHED_1F1B, 9, 1, 0, 1, 0});
    run_case(&(Case){mlp_path, 3, {0, 2, 3, 5}, {1, 1, 1}, SCHED_1F1B, 8, 1, 1, 0, 1});   /* vertical sync, Adam */
    run_case(&(Case){cnn_path, 3, {0, 2, 5, 7}, {1, 2, 1}, SCHED_1F1B, 8, 1, 0, 0, 0});
}

static void test_flush_kinds(void **state) {
    (void)state;
    run_case(&(Case){mlp_path, 2, {0, 2, 5}, {1, 1}, SCHED_GPIPE, 3, 4, 0, 0, 0});
    run_case(&(Case){mlp_path, 3, {0, 2, 3, 5}, {1, 2, 1}, SCHED_GPIPE, 2, 4, 0, 1, 0});
    run_case(&(Case){cnn_path, 3, {0, 2, 5, 7}, {1, 2, 1}, SCHED_1F1B_FLUSH, 3, 4, 0, 0, 0});
    run_case(&(Case){mlp_path, 3, {0, 2, 3, 5}, {1, 1, 1}, SCHED_1F1B_FLUSH, 3, 3, 0, 0, 1});
}

/* The zb kinds: slots live from a unit's forward to its BW and hold the output gradients its
 * BI keeps. */
static void test_zb(void **state) {
    (void)state;
    run_case(&(Case){mlp_path, 3, {0, 2, 3, 5}, {1, 1, 1}, SCHED_ZB_H1, 2, 6, 0, 0, 0});
    run_case(&(Case){mlp_path, 3, {0, 2, 3, 5}, {1, 2, 1}, SCHED_ZB_H1, 2, 4, 0, 1, 0});
    run_case(&(Case){cnn_path, 3, {0, 2, 5, 7}, {1, 1, 1}, SCHED_ZB_H1, 2, 4, 0, 1, 1});
    run_case(&(Case){cnn_path, 2, {0, 5, 7}, {1, 1}, SCHED_ZB_H2, 2, 4, 0, 0, 0});
    run_case(&(Case){mlp_path, 4, {0, 2, 3, 4, 5}, {1, 1, 1, 1}, SCHED_ZB_H2, 2, 8, 0, 1, 0});
    /* zb-h1 defers BWs so that every worker holds up to warmup_0 units, the input stage's:
     * the most slots over the workers are 1f1b-flush's, the later stages hold more */
    TPlan tp;
    tplan(&tp, 4, (int[]){0, 2, 3, 4, 5}, (int[]){1, 1, 1, 1});
    Schedule a, b;
    Err err = {0};
    SchedOpts oa = {.kind = SCHED_ZB_H1, .n_minibatches = 2, .n_micro = 8}, ob = oa;
    ob.kind = SCHED_1F1B_FLUSH;
    if (sched_build(&tp.p, &oa, &a, &err) || sched_build(&tp.p, &ob, &b, &err)) fail_msg("%s", err.msg);
    int most_a = 0, most_b = 0;
    for (int r = 0; r < 4; r++) {
        SchedWorkerInfo wa, wb;
        if (sched_analyze_worker(&a, r, &wa, &err) || sched_analyze_worker(&b, r, &wb, &err)) fail_msg("%s", err.msg);
        assert_true(wa.n_slots >= wb.n_slots);
        if (wa.n_slots > most_a) most_a = wa.n_slots;
        if (wb.n_slots > most_b) most_b = wb.n_slots;
        sched_worker_info_release(&wa);
        sched_worker_info_release(&wb);
    }
    assert_int_equal(most_a, most_b);
    sched_release(&a);
    sched_release(&b);
}

static void test_2bw_dp_mp(void **state) {
    (void)state;
    run_case(&(Case){mlp_path, 3, {0, 2, 3, 5}, {1, 1, 1}, SCHED_2BW, 4, 3, 0, 0, 0});
    run_case(&(Case){mlp_path, 3, {0, 2, 3, 5}, {1, 2, 1}, SCHED_2BW, 4, 4, 0, 1, 0});
    run_case(&(Case){mlp_path, 3, {0, 2, 3, 5}, {1, 1, 1}, SCHED_DP, 6, 1, 0, 0, 1});
    run_case(&(Case){cnn_path, 2, {0, 3, 7}, {2, 1}, SCHED_DP, 6, 1, 0, 1, 0});
    run_case(&(Case){mlp_path, 2, {0, 2, 5}, {2, 1}, SCHED_MP, 4, 1, 0, 0, 0});   /* rank 1 idle */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_1f1b),
        cmocka_unit_test(test_flush_kinds),
        cmocka_unit_test(test_2bw_dp_mp),
        cmocka_unit_test(test_zb),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
