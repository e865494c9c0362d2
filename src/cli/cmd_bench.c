/* cmd_bench.c: `pipedream bench MODEL.json`: throughput of full training steps (forward,
 * loss, backward, SGD update) on synthetic data, after warm-up; one JSON line with the
 * median samples/s over repetitions and the achieved GFLOP/s (3x the analytic forward FLOPs
 * of the model's layers), and the resident memory before the model was loaded and its
 * high-water mark after the timed steps (/proc/self/status). --layers adds each top-level
 * layer's forward and backward time (rt_time_layers, as the profiler measures them:
 * one-layer ranges, the layer's SGD update in
 * its backward), to find where time goes. Not a profiler for planning (see `pipedream profile`). */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "data.h"
#include "kernels.h"
#include "nn.h"
#include "runtime.h"

static void help(void) {
    printf("usage: pipedream bench MODEL.json [options]\n\n"
           "Times full training steps on synthetic data; prints one JSON line.\n\n"
           "options:\n"
           "  --minibatch B   samples per minibatch (default 64)\n"
           "  --threads T     compute threads (default 1)\n"
           "  --steps N       steps per repetition (default 10)\n"
           "  --reps R        repetitions; the median is reported (default 5)\n"
           "  --warmup N      untimed steps first (default 3)\n"
           "  --layers        also time each top-level layer's forward and backward\n"
           "                  (with its SGD update, as `pipedream profile` does)\n");
}

/* A "VmRSS:" / "VmHWM:" line of /proc/self/status in KiB (0 where there is none). */
static long status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = 0;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl)) v = strtol(line + kl, NULL, 10);
    if (f) fclose(f);
    return v;
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int cmd_bench(int argc, char **argv) {
    const char *cmd = "bench";
    if (cli_wants_help(argc, argv)) {
        help();
        return CLI_OK;
    }
    const char *path = NULL;
    int batch = 64, threads = 1, steps = 10, reps = 5, warmup = 3, layers = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int rc = CLI_OK;
        if (a[0] != '-') {
            if (path) return cli_usage_error(cmd, "unexpected argument \"%s\"", a);
            path = a;
            continue;
        }
        if (!strcmp(a, "--layers")) {
            layers = 1;
            continue;
        }
        if (strcmp(a, "--minibatch") && strcmp(a, "--threads") && strcmp(a, "--steps") && strcmp(a, "--reps") &&
            strcmp(a, "--warmup"))
            return cli_usage_error(cmd, "unknown option \"%s\"", a);
        if (!(v = cli_value(cmd, argc, argv, &i))) return CLI_USAGE;
        if (!strcmp(a, "--minibatch")) rc = cli_parse_int(cmd, a, v, 1, 65536, &batch);
        else if (!strcmp(a, "--threads")) rc = cli_parse_int(cmd, a, v, 1, 1024, &threads);
        else if (!strcmp(a, "--steps")) rc = cli_parse_int(cmd, a, v, 1, 1000000, &steps);
        else if (!strcmp(a, "--reps")) rc = cli_parse_int(cmd, a, v, 1, 1000, &reps);
        else rc = cli_parse_int(cmd, a, v, 0, 1000000, &warmup);
        if (rc) return rc;
    }
    if (!path) return cli_usage_error(cmd, "missing MODEL.json");
    kern_set_threads(threads);
    const long rss_start = status_kb("VmRSS:");   /* before the model: the program alone */
    Err err = {0};
    Model *m = model_load(path, &err);
    if (!m) return cli_fail(&err);
    Trainer t;
    Dataset d = {0};
    Shape in = model_input_shape(m);
    int ret = CLI_FAIL;
    if (in.ndim != 3) {
        err_set(&err, PD_EINVAL, "%s: bench needs an image input (C, H, W)", path);
        model_free(m);
        return cli_fail(&err);
    }
    OptConfig oc = optim_defaults(OPT_SGD, 0.01f);
    oc.momentum = 0.9f;
    if (trainer_init(&t, m, batch, &oc, 1, &err)) {
        model_free(m);
        return cli_fail(&err);
    }
    /* 4 distinct minibatches of synthetic data, all allocated before timing */
    if (data_synthetic((size_t)batch * 4, in.d[0], in.d[1], in.d[2], t.classes, 7, &d, &err)) goto fail;
    size_t per = data_sample_numel(&d) * (size_t)batch;
    for (int i = 0; i < warmup; i++) trainer_step(&t, d.x + (size_t)(i % 4) * per, d.y + (i % 4) * batch, batch, (uint64_t)i, NULL);
    double *sps = calloc((size_t)reps, sizeof *sps);
    uint64_t g = (uint64_t)warmup;
    for (int r = 0; r < reps; r++) {
        double t0 = pd_now();
        for (int i = 0; i < steps; i++, g++)
            trainer_step(&t, d.x + (size_t)(g % 4) * per, d.y + (g % 4) * batch, batch, g, NULL);
        sps[r] = (double)steps * batch / (pd_now() - t0);
    }
    const long peak_rss = status_kb("VmHWM:");   /* high-water mark: build, warm-up, steps */
    qsort(sps, (size_t)reps, sizeof *sps, cmp_dbl);
    double med = reps % 2 ? sps[reps / 2] : 0.5 * (sps[reps / 2 - 1] + sps[reps / 2]);
    double fps = model_flops(m);
    printf("{\"model\": \"%s\", \"minibatch\": %d, \"threads\": %d, \"steps\": %d, \"reps\": %d, "
           "\"samples_per_s\": %.1f, \"min_samples_per_s\": %.1f, \"max_samples_per_s\": %.1f, \"step_ms\": %.3f, "
           "\"fwd_flops_per_sample\": %.0f, \"gflops\": %.2f, \"rss_start_kb\": %ld, \"peak_rss_kb\": %ld",
           model_name(m), batch, threads, steps, reps, med, sps[0], sps[reps - 1], 1e3 * batch / med, fps,
           3.0 * fps * med / 1e9, rss_start, peak_rss);
    free(sps);
    if (layers) {
        int nl = model_n_layers(m);
        double *fw = calloc((size_t)nl, sizeof *fw), *bw = calloc((size_t)nl, sizeof *bw);
        rt_time_layers(m, t.w, t.state, d.x, d.y, batch, 1, reps, 0, fw, bw);
        printf(", \"layers\": [");
        for (int i = 0; i < nl; i++)
            printf("%s{\"layer\": %d, \"type\": \"%s\", \"fwd_ms\": %.3f, \"bwd_ms\": %.3f, \"fwd_mflops\": %.2f}",
                   i ? ", " : "", i, model_layer_type(m, i), 1e3 * fw[i], 1e3 * bw[i],
                   model_layer_flops(m, i) * batch / 1e6);
        printf("]");
        free(fw);
        free(bw);
    }
    printf("}\n");
    ret = CLI_OK;
    goto done;
fail:
    ret = cli_fail(&err);
done:
    data_release(&d);
    trainer_release(&t);
    model_free(m);
    return ret;
}
