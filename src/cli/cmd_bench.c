/* cmd_bench.c: `pipedream bench MODEL.json`: throughput of full training steps (forward,
 * loss, backward, SGD update) on synthetic data, after warm-up; one JSON line with the
 * median samples/s over repetitions and the achieved GFLOP/s (3x the analytic forward FLOPs
 * of the model's layers). --layers adds each top-level layer's forward and backward time
 * (run as one-layer ranges), to find where time goes. Not a profiler for planning (see
 * `pipedream profile`). */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "data.h"
#include "kernels.h"
#include "nn.h"

static void help(void) {
    printf("usage: pipedream bench MODEL.json [options]\n\n"
           "Times full training steps on synthetic data; prints one JSON line.\n\n"
           "options:\n"
           "  --minibatch B   samples per minibatch (default 64)\n"
           "  --threads T     compute threads (default 1)\n"
           "  --steps N       steps per repetition (default 10)\n"
           "  --reps R        repetitions; the median is reported (default 5)\n"
           "  --warmup N      untimed steps first (default 3)\n"
           "  --layers        also time each top-level layer's forward and backward\n");
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Per-layer forward/backward seconds (median of reps) with one-layer ranges chained. */
static int time_layers(Model *m, const Trainer *t, const float *x, const int32_t *lab, int n, int reps, double *fw,
                       double *bw) {
    int nl = model_n_layers(m);
    NnCtx **c = calloc((size_t)nl, sizeof *c);
    float **g = calloc((size_t)nl + 1, sizeof *g);
    double *tf = calloc((size_t)reps * nl, sizeof *tf), *tb = calloc((size_t)reps * nl, sizeof *tb);
    for (int i = 0; i < nl; i++) {
        c[i] = nnctx_new(m, i, i + 1, n);
        g[i] = pd_alloc_f32((size_t)n * shape_numel(model_layer_in_shape(m, i)));
    }
    g[nl] = pd_alloc_f32((size_t)n * t->classes);
    for (int r = 0; r < reps + 1; r++) {   // first round is warm-up
        const float *in = x;
        for (int i = 0; i < nl; i++) {
            NnRun run = {.n = n, .train = 1, .seed = 1, .minibatch = (uint64_t)r};
            double t0 = pd_now();
            in = model_forward(m, c[i], t->w + model_param_offset(m, i), t->state + model_state_offset(m, i), in, &run);
            if (r) tf[(r - 1) * nl + i] = pd_now() - t0;
        }
        memset(g[nl], 0, (size_t)n * t->classes * sizeof(float));
        kern_xent_fwd_bwd(in, lab, g[nl], n, t->classes, 1.0f, NULL);
        for (int i = nl - 1; i >= 0; i--) {
            if (i) memset(g[i], 0, (size_t)n * shape_numel(model_layer_in_shape(m, i)) * sizeof(float));
            double t0 = pd_now();
            model_backward(m, c[i], t->w + model_param_offset(m, i), g[i + 1], i ? g[i] : NULL,
                           t->dw + model_param_offset(m, i));
            if (r) tb[(r - 1) * nl + i] = pd_now() - t0;
        }
    }
    double *col = calloc((size_t)reps, sizeof *col);
    for (int i = 0; i < nl; i++) {
        for (int r = 0; r < reps; r++) col[r] = tf[r * nl + i];
        qsort(col, (size_t)reps, sizeof *col, cmp_dbl);
        fw[i] = col[reps / 2];
        for (int r = 0; r < reps; r++) col[r] = tb[r * nl + i];
        qsort(col, (size_t)reps, sizeof *col, cmp_dbl);
        bw[i] = col[reps / 2];
    }
    for (int i = 0; i <= nl; i++) {
        if (i < nl) nnctx_free(c[i]);
        pd_free(g[i]);
    }
    free(c);
    free(g);
    free(tf);
    free(tb);
    free(col);
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
    qsort(sps, (size_t)reps, sizeof *sps, cmp_dbl);
    double med = reps % 2 ? sps[reps / 2] : 0.5 * (sps[reps / 2 - 1] + sps[reps / 2]);
    double fps = model_flops(m);
    printf("{\"model\": \"%s\", \"minibatch\": %d, \"threads\": %d, \"steps\": %d, \"reps\": %d, "
           "\"samples_per_s\": %.1f, \"min_samples_per_s\": %.1f, \"max_samples_per_s\": %.1f, \"step_ms\": %.3f, "
           "\"fwd_flops_per_sample\": %.0f, \"gflops\": %.2f",
           model_name(m), batch, threads, steps, reps, med, sps[0], sps[reps - 1], 1e3 * batch / med, fps,
           3.0 * fps * med / 1e9);
    free(sps);
    if (layers) {
        int nl = model_n_layers(m);
        double *fw = calloc((size_t)nl, sizeof *fw), *bw = calloc((size_t)nl, sizeof *bw);
        time_layers(m, &t, d.x, d.y, batch, reps, fw, bw);
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
