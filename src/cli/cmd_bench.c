/* cmd_bench.c: `pipedream bench MODEL.json`: throughput of full training steps (forward,
 * loss, backward, SGD update) on synthetic data, after warm-up; one JSON line with the
 * median samples/s over repetitions and the achieved GFLOP/s (3x the analytic forward FLOPs
 * of the model's layers), and the resident memory before the model was loaded and its
 * high-water mark after the timed steps (/proc/self/status). --layers adds each top-level
 * layer's forward and backward time (rt_time_layers, as the profiler measures them:
 * one-layer ranges with the layouts each layer has inside the model, the layer's SGD update in
 * its backward), to find where time goes. Not a profiler for planning (see `pipedream profile`).
 * --precision takes a comma-separated list (fp32,bf16): each precision gets its own built
 * model and its repetitions are interleaved with the others' (so a slow spell of a shared
 * machine hits all alike); one JSON line per precision, in the order given. Token models
 * (an "embed" first layer) get token ids in [0, vocab) and a target per position. */
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
           "  --precision P   fp32 (default) or bf16, or a comma-separated list such as\n"
           "                  fp32,bf16: each is timed in the same run, repetitions interleaved\n"
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

/* One precision's model, trainer and timings. */
typedef struct BenchRun {
    int prec;
    Model *m;
    Trainer t;
    int have_t;
    double *sps;   /* (reps) samples/s */
} BenchRun;

enum { BENCH_MAX_PREC = 4 };

/* Parses "fp32", "bf16,fp32", ... into prec[] and their count into *n: CLI_OK, or the
 * code of the message printed (cli_parse_precision's, or CLI_USAGE). */
static int parse_precisions(const char *cmd, const char *v, int *prec, int *n) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", v);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == BENCH_MAX_PREC) return cli_usage_error(cmd, "--precision: at most %d values", BENCH_MAX_PREC);
        int rc = cli_parse_precision(cmd, tok, &prec[*n]);
        if (rc) return rc;
        ++*n;
    }
    return *n ? CLI_OK : cli_usage_error(cmd, "--precision: expected fp32 or bf16");
}

/* 4 distinct minibatches of synthetic data for m: images, or for token models token ids in
 * [0, vocab) and a target per position (fixed patterns, as the profiler's). */
static int bench_data(const Model *m, int batch, int classes, Dataset *d, Err *err) {
    Shape in = model_input_shape(m);
    int vocab = model_input_vocab(m), cl = 0, tpos = model_loss_positions(m, &cl);
    size_t n = (size_t)batch * 4;
    if (in.ndim != 3 && vocab <= 0)
        return err_set(err, PD_EINVAL, "%s: bench needs an image input (C, H, W) or token ids", model_name(m));
    int c = in.ndim == 3 ? in.d[0] : 1, h = in.ndim == 3 ? in.d[1] : 1, w = in.d[in.ndim - 1];
    int rc = data_synthetic(n, c, h, w, classes, 7, d, err);
    if (rc || (vocab <= 0 && tpos <= 1)) return rc;
    int32_t *y = pd_alloc(n * (size_t)tpos * sizeof(int32_t));
    for (size_t i = 0; i < n * (size_t)tpos; i++) y[i] = (int32_t)((i * 31 + 5) % (size_t)classes);
    if (vocab > 0)
        for (size_t i = 0; i < n * shape_numel(in); i++) d->x[i] = (float)((i * 131 + 7) % (size_t)vocab);
    pd_free(d->y);
    d->y = y, d->y_len = tpos;
    return PD_OK;
}

int cmd_bench(int argc, char **argv) {
    const char *cmd = "bench";
    if (cli_wants_help(argc, argv)) {
        help();
        return CLI_OK;
    }
    const char *path = NULL;
    int batch = 64, threads = 1, steps = 10, reps = 5, warmup = 3, layers = 0;
    int prec[BENCH_MAX_PREC] = {KPREC_FP32}, n_prec = 1;
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
            strcmp(a, "--warmup") && strcmp(a, "--precision"))
            return cli_usage_error(cmd, "unknown option \"%s\"", a);
        if (!(v = cli_value(cmd, argc, argv, &i))) return CLI_USAGE;
        if (!strcmp(a, "--minibatch")) rc = cli_parse_int(cmd, a, v, 1, 65536, &batch);
        else if (!strcmp(a, "--threads")) rc = cli_parse_int(cmd, a, v, 1, 1024, &threads);
        else if (!strcmp(a, "--steps")) rc = cli_parse_int(cmd, a, v, 1, 1000000, &steps);
        else if (!strcmp(a, "--reps")) rc = cli_parse_int(cmd, a, v, 1, 1000, &reps);
        else if (!strcmp(a, "--precision")) {
            rc = parse_precisions(cmd, v, prec, &n_prec);
        } else rc = cli_parse_int(cmd, a, v, 0, 1000000, &warmup);
        if (rc) return rc;
    }
    if (!path) return cli_usage_error(cmd, "missing MODEL.json");
    kern_set_threads(threads);
    const long rss_start = status_kb("VmRSS:");   /* before the model: the program alone */
    Err err = {0};
    BenchRun runs[BENCH_MAX_PREC];
    memset(runs, 0, sizeof runs);
    Dataset d = {0};
    int ret = CLI_FAIL;
    OptConfig oc = optim_defaults(OPT_SGD, 0.01f);
    oc.momentum = 0.9f;
    for (int k = 0; k < n_prec; k++) {
        BenchRun *b = &runs[k];
        b->prec = prec[k];
        b->sps = calloc((size_t)reps, sizeof *b->sps);
        if (!(b->m = model_load(path, &err))) goto fail;
        model_set_precision(b->m, b->prec);
        if (trainer_init(&b->t, b->m, batch, &oc, 1, &err)) goto fail;
        b->have_t = 1;
    }
    /* all allocated before timing */
    if (bench_data(runs[0].m, batch, runs[0].t.classes, &d, &err)) goto fail;
    size_t per = data_sample_numel(&d) * (size_t)batch, yper = (size_t)batch * (d.y_len > 0 ? d.y_len : 1);
    for (int k = 0; k < n_prec; k++)
        for (int i = 0; i < warmup; i++)
            trainer_step(&runs[k].t, d.x + (size_t)(i % 4) * per, d.y + (i % 4) * yper, batch, (uint64_t)i, NULL);
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < n_prec; k++) {
            uint64_t g = (uint64_t)warmup + (uint64_t)r * steps;
            double t0 = pd_now();
            for (int i = 0; i < steps; i++, g++)
                trainer_step(&runs[k].t, d.x + (size_t)(g % 4) * per, d.y + (g % 4) * yper, batch, g, NULL);
            runs[k].sps[r] = (double)steps * batch / (pd_now() - t0);
        }
    const long peak_rss = status_kb("VmHWM:");   /* high-water mark: build, warm-up, steps (all precisions) */
    for (int k = 0; k < n_prec; k++) {
        BenchRun *b = &runs[k];
        double *sps = b->sps;
        qsort(sps, (size_t)reps, sizeof *sps, cmp_dbl);
        double med = reps % 2 ? sps[reps / 2] : 0.5 * (sps[reps / 2 - 1] + sps[reps / 2]);
        double fps = model_flops(b->m);
        printf("{\"model\": \"%s\", \"precision\": \"%s\", \"minibatch\": %d, \"threads\": %d, \"steps\": %d, "
               "\"reps\": %d, \"samples_per_s\": %.1f, \"min_samples_per_s\": %.1f, \"max_samples_per_s\": %.1f, "
               "\"step_ms\": %.3f, \"fwd_flops_per_sample\": %.0f, \"gflops\": %.2f, \"rss_start_kb\": %ld, "
               "\"peak_rss_kb\": %ld",
               model_name(b->m), kern_precision_name(b->prec), batch, threads, steps, reps, med, sps[0],
               sps[reps - 1], 1e3 * batch / med, fps, 3.0 * fps * med / 1e9, rss_start, peak_rss);
        if (layers) {
            int nl = model_n_layers(b->m);
            double *fw = calloc((size_t)nl, sizeof *fw), *bw = calloc((size_t)nl, sizeof *bw);
            rt_time_layers(b->m, b->t.w, b->t.state, d.x, d.y, batch, 1, reps, 0, fw, bw);
            printf(", \"layers\": [");
            for (int i = 0; i < nl; i++)
                printf("%s{\"layer\": %d, \"type\": \"%s\", \"fwd_ms\": %.3f, \"bwd_ms\": %.3f, \"fwd_mflops\": %.2f}",
                       i ? ", " : "", i, model_layer_type(b->m, i), 1e3 * fw[i], 1e3 * bw[i],
                       model_layer_flops(b->m, i) * batch / 1e6);
            printf("]");
            free(fw);
            free(bw);
        }
        printf("}\n");
    }
    ret = CLI_OK;
    goto done;
fail:
    ret = cli_fail(&err);
done:
    data_release(&d);
    for (int k = 0; k < n_prec; k++) {
        if (runs[k].have_t) trainer_release(&runs[k].t);
        model_free(runs[k].m);
        free(runs[k].sps);
    }
    return ret;
}
