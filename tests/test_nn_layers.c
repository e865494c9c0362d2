/* test_nn_layers.c: every layer kind against PyTorch (tests/ref/nn_layers.bin, written by
 * tools/gen_ref.py): outputs, input and parameter gradients, batch-norm running statistics;
 * dropout by its mask (a pure function of seed, layer and minibatch); optimizers against
 * PyTorch's update rules written out by hand on a few elements. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "nn.h"

typedef struct Case {
    const char *name;
    const char *json;   /* model with this one layer (the input shape per sample) */
    int eval;
} Case;

#define M(in, layer) "{\"name\": \"t\", \"input\": " in ", \"layers\": [" layer "]}"

static const Case CASES[] = {
    {"linear", M("[20]", "{\"type\": \"linear\", \"in\": 20, \"out\": 7}"), 0},
    {"linear_relu_nobias", M("[20]", "{\"type\": \"linear\", \"in\": 20, \"out\": 7, \"bias\": false, \"relu\": true}"), 0},
    {"conv", M("[3, 8, 8]", "{\"type\": \"conv2d\", \"in\": 3, \"out\": 5, \"kernel\": 3, \"pad\": 1}"), 0},
    {"conv_relu_s2", M("[3, 9, 9]", "{\"type\": \"conv2d\", \"in\": 3, \"out\": 4, \"kernel\": 3, \"stride\": 2, "
                                    "\"bias\": false, \"relu\": true}"), 0},
    {"conv_5x5", M("[2, 7, 7]", "{\"type\": \"conv2d\", \"in\": 2, \"out\": 3, \"kernel\": 5, \"pad\": 2}"), 0},
    {"maxpool", M("[3, 8, 8]", "{\"type\": \"maxpool\", \"kernel\": 2}"), 0},
    {"maxpool_k3s2", M("[3, 9, 9]", "{\"type\": \"maxpool\", \"kernel\": 3, \"stride\": 2}"), 0},
    {"gap", M("[5, 6, 6]", "{\"type\": \"gap\"}"), 0},
    {"relu", M("[3, 5, 5]", "{\"type\": \"relu\"}"), 0},
    {"batchnorm", M("[5, 6, 6]", "{\"type\": \"batchnorm\", \"features\": 5}"), 0},
    {"batchnorm_relu", M("[3, 5, 5]", "{\"type\": \"batchnorm\", \"features\": 3, \"relu\": true}"), 0},
    {"batchnorm_eval", M("[3, 5, 5]", "{\"type\": \"batchnorm\", \"features\": 3}"), 1},
    {"batchnorm1d", M("[6]", "{\"type\": \"batchnorm\", \"features\": 6}"), 0},
    {"lstm", M("[5, 6]", "{\"type\": \"lstm\", \"in\": 6, \"hidden\": 8}"), 0},
    {"flatten", M("[3, 4, 4]", "{\"type\": \"flatten\"}"), 0},
    {"reshape", M("[3, 4, 4]", "{\"type\": \"reshape\", \"shape\": [4, 12]}"), 0},
    {"pad", M("[3, 5, 5]", "{\"type\": \"pad\", \"pad\": 2}"), 0},
    {"last_step", M("[5, 8]", "{\"type\": \"last_step\"}"), 0},
    {"residual_identity",
     M("[4, 6, 6]", "{\"type\": \"residual\", \"body\": ["
                    "{\"type\": \"conv2d\", \"in\": 4, \"out\": 4, \"kernel\": 3, \"pad\": 1, \"bias\": false},"
                    "{\"type\": \"batchnorm\", \"features\": 4, \"relu\": true},"
                    "{\"type\": \"conv2d\", \"in\": 4, \"out\": 4, \"kernel\": 3, \"pad\": 1, \"bias\": false},"
                    "{\"type\": \"batchnorm\", \"features\": 4}]}"), 0},
    {"residual_conv",
     M("[4, 8, 8]", "{\"type\": \"residual\", \"body\": ["
                    "{\"type\": \"conv2d\", \"in\": 4, \"out\": 8, \"kernel\": 3, \"stride\": 2, \"pad\": 1, \"bias\": false},"
                    "{\"type\": \"batchnorm\", \"features\": 8, \"relu\": true},"
                    "{\"type\": \"conv2d\", \"in\": 8, \"out\": 8, \"kernel\": 3, \"pad\": 1, \"bias\": false},"
                    "{\"type\": \"batchnorm\", \"features\": 8}], \"shortcut\": ["
                    "{\"type\": \"conv2d\", \"in\": 4, \"out\": 8, \"kernel\": 1, \"stride\": 2, \"bias\": false},"
                    "{\"type\": \"batchnorm\", \"features\": 8}]}"), 0},
};
enum { N_CASES = sizeof CASES / sizeof CASES[0] };

static RefFile REF;

static const RefTensor *get(const char *c, const char *what) {
    char name[128];
    snprintf(name, sizeof name, "%s.%s", c, what);
    return tu_ref_get(&REF, name);
}

static int has(const char *c, const char *what) {
    char name[128];
    snprintf(name, sizeof name, "%s.%s", c, what);
    for (int i = 0; i < REF.count; i++)
        if (!strcmp(REF.t[i].name, name)) return 1;
    return 0;
}

static void run_case(const Case *c) {
    Err err = {0};
    Model *m = model_parse(c->json, c->name, &err);
    if (!m) fail_msg("%s", err.msg);
    const RefTensor *x = get(c->name, "x");
    int n = x->shape.d[0], nl = model_n_layers(m);
    assert_int_equal(model_build(m, 0, nl, n, &err), PD_OK);
    size_t np = model_param_count(m, 0, nl), ns = model_state_count(m, 0, nl);
    float *w = pd_alloc_f32(np + 1), *dw = pd_alloc_f32(np + 1), *state = pd_alloc_f32(ns + 1);
    int npt;
    const ParamInfo *pt = model_param_tensors(m, &npt);
    for (int k = 0; k < npt; k++) {
        char what[32];
        snprintf(what, sizeof what, "w.%d", k);
        const RefTensor *t = get(c->name, what);
        assert_int_equal(shape_numel(t->shape), shape_numel(pt[k].shape));
        memcpy(w + pt[k].offset, t->data, shape_numel(t->shape) * sizeof(float));
    }
    assert_false(has(c->name, "w.99"));
    if (ns) {
        const RefTensor *s0 = get(c->name, "state0");
        assert_int_equal(shape_numel(s0->shape), ns);
        memcpy(state, s0->data, ns * sizeof(float));
    }
    NnCtx *ctx = nnctx_new(m, 0, nl, n);
    NnRun run = {.n = n, .train = !c->eval, .seed = 1, .minibatch = 0};
    const float *y = model_forward(m, ctx, w, ns ? state : NULL, x->data, &run);
    const RefTensor *yr = get(c->name, "y");
    Shape out = model_layer_out_shape(m, nl - 1);
    assert_int_equal(shape_numel(yr->shape), (size_t)n * shape_numel(out));
    size_t bad = tu_compare(c->name, y, yr->data, shape_numel(yr->shape), 1e-4, 1e-5);
    const RefTensor *dy = get(c->name, "dy"), *dxr = get(c->name, "dx");
    float *dx = pd_alloc_f32(shape_numel(x->shape));
    model_backward(m, ctx, w, dy->data, dx, dw);
    bad += tu_compare("dx", dx, dxr->data, shape_numel(x->shape), 1e-4, 1e-5);
    for (int k = 0; k < npt; k++) {
        char what[32];
        snprintf(what, sizeof what, "dw.%d", k);
        const RefTensor *t = get(c->name, what);
        bad += tu_compare(pt[k].name, dw + pt[k].offset, t->data, shape_numel(t->shape), 1e-4, 1e-5);
    }
    if (ns) bad += tu_compare("state", state, get(c->name, "state")->data, ns, 1e-5, 1e-6);
    if (bad) fail_msg("case %s: %zu mismatches", c->name, bad);
    nnctx_free(ctx);
    pd_free(w);
    pd_free(dw);
    pd_free(dx);
    pd_free(state);
    model_free(m);
}

static void test_layers_vs_pytorch(void **st) {
    (void)st;
    for (int i = 0; i < N_CASES; i++) run_case(&CASES[i]);
}

/* Dropout: y = x * keep / (1 - p) with keep_i = (i-th uniform of Philox(seed, DROPOUT << 32 |
 * layer, minibatch) >= p); backward uses the same mask; eval is the identity; another
 * minibatch index gives another mask. */
static void test_dropout_mask(void **st) {
    (void)st;
    Err err = {0};
    Model *m = model_parse(M("[10]", "{\"type\": \"relu\"}, {\"type\": \"dropout\", \"p\": 0.3}"), "drop", &err);
    if (!m) fail_msg("%s", err.msg);
    const int n = 50, f = 10;
    assert_int_equal(model_build(m, 0, 2, n, &err), PD_OK);
    float *x = pd_alloc_f32(n * f), *dx = pd_alloc_f32(n * f), *dy = pd_alloc_f32(n * f), w = 0;
    for (int i = 0; i < n * f; i++) {
        x[i] = 1.0f + (float)(i % 7);
        dy[i] = 0.5f + (float)(i % 3);
    }
    NnCtx *ctx = nnctx_new(m, 1, 2, n);
    NnRun run = {.n = n, .train = 1, .seed = 77, .minibatch = 5};
    const float *y = model_forward(m, ctx, &w, NULL, x, &run);
    model_backward(m, ctx, &w, dy, dx, &w);
    Rng r;
    rng_init(&r, 77, ((uint64_t)RNG_STREAM_DROPOUT << 32) | 1, 5);
    int kept = 0;
    for (int i = 0; i < n * f; i++) {
        int keep = rng_uniform(&r) >= 0.3f;
        kept += keep;
        float want = keep ? x[i] / 0.7f : 0.0f, wantd = keep ? dy[i] / 0.7f : 0.0f;
        assert_float_equal(y[i], want, 1e-5 * want + 1e-7);
        assert_float_equal(dx[i], wantd, 1e-5 * wantd + 1e-7);
    }
    assert_true(kept > 300 && kept < 400);
    /* another minibatch: another mask */
    NnRun run2 = run;
    run2.minibatch = 6;
    y = model_forward(m, ctx, &w, NULL, x, &run2);
    int diff = 0;
    rng_init(&r, 77, ((uint64_t)RNG_STREAM_DROPOUT << 32) | 1, 5);
    for (int i = 0; i < n * f; i++) diff += (y[i] != 0.0f) != (rng_uniform(&r) >= 0.3f);
    assert_true(diff > 50);
    /* eval: identity */
    run.train = 0;
    y = model_forward(m, ctx, &w, NULL, x, &run);
    for (int i = 0; i < n * f; i++) assert_float_equal(y[i], x[i], 0);
    nnctx_free(ctx);
    pd_free(x);
    pd_free(dx);
    pd_free(dy);
    model_free(m);
}

/* SGD (momentum, weight decay), Adam and AdamW against the update rules evaluated in double. */
static void test_optimizers(void **st) {
    (void)st;
    enum { N = 5, STEPS = 4 };
    for (int kind = 0; kind < OPT_KIND_COUNT; kind++) {
        OptConfig c = optim_defaults((OptKind)kind, 0.1f);
        c.momentum = 0.9f;
        c.weight_decay = 0.01f;
        Optim o;
        optim_init(&o, &c, N);
        float w[N] = {1, -2, 0.5f, 3, -0.25f}, g[N];
        double wd[N], m[N] = {0}, v[N] = {0};
        for (int i = 0; i < N; i++) wd[i] = w[i];
        for (int s = 1; s <= STEPS; s++) {
            for (int i = 0; i < N; i++) g[i] = (float)(0.3 * (i + 1) * (s % 2 ? 1 : -1) + 0.1 * w[i]);
            for (int i = 0; i < N; i++) {
                double d = g[i] + (kind == OPT_ADAMW ? 0.0 : 0.01 * wd[i]);
                if (kind == OPT_ADAMW) wd[i] *= 1 - 0.1 * 0.01;   /* decoupled: the decay first */
                if (kind == OPT_SGD) {
                    m[i] = s == 1 ? d : 0.9 * m[i] + d;
                    wd[i] -= 0.1 * m[i];
                } else {
                    m[i] = 0.9 * m[i] + 0.1 * d;
                    v[i] = 0.999 * v[i] + 0.001 * d * d;
                    double mh = m[i] / (1 - pow(0.9, s)), vh = sqrt(v[i]) / sqrt(1 - pow(0.999, s));
                    wd[i] -= 0.1 * mh / (vh + 1e-8);
                }
            }
            optim_step(&o, w, g);
            for (int i = 0; i < N; i++) assert_float_equal(w[i], wd[i], 1e-5 * fabs(wd[i]) + 1e-6);
        }
        optim_release(&o);
    }
    assert_int_equal(optim_kind_parse("adam"), OPT_ADAM);
    assert_int_equal(optim_kind_parse("sgd"), OPT_SGD);
    assert_int_equal(optim_kind_parse("adamw"), OPT_ADAMW);
    assert_int_equal(optim_kind_parse("rmsprop"), -1);
}

/* The learning-rate schedule at its corners: warm-up from lr/W, the peak right after it, the
 * cosine's midpoint, the floor at decay_steps and after; linear halfway; constant with a
 * warm-up; and an optimizer step takes the scheduled lr (SGD without momentum: w -= lr g). */
static void test_lr_schedule(void **st) {
    (void)st;
    OptConfig c = optim_defaults(OPT_SGD, 1.0f);
    c.lr_sched = LR_COSINE, c.warmup = 4, c.decay_steps = 14, c.min_lr = 0.1f;
    assert_float_equal(optim_lr(&c, 0), 0.25, 1e-12);
    assert_float_equal(optim_lr(&c, 3), 1.0, 1e-12);
    assert_float_equal(optim_lr(&c, 4), 1.0, 1e-12);
    assert_float_equal(optim_lr(&c, 9), 0.1 + 0.9 * 0.5, 1e-7);   /* halfway through the decay */
    assert_float_equal(optim_lr(&c, 14), 0.1, 1e-7);
    assert_float_equal(optim_lr(&c, 1000), 0.1, 1e-7);
    c.lr_sched = LR_LINEAR;
    assert_float_equal(optim_lr(&c, 9), 0.1 + 0.9 * 0.5, 1e-7);
    assert_float_equal(optim_lr(&c, 14), 0.1, 1e-7);
    c.lr_sched = LR_CONSTANT;
    assert_float_equal(optim_lr(&c, 1), 0.5, 1e-12);
    assert_float_equal(optim_lr(&c, 1000), 1.0, 1e-12);
    c.warmup = 0;
    assert_float_equal(optim_lr(&c, 0), 1.0, 1e-12);
    c.lr_sched = LR_COSINE, c.warmup = 2, c.decay_steps = 10, c.min_lr = 0.0f;
    Optim o;
    optim_init(&o, &c, 1);
    float w = 0.0f, g = 1.0f;
    double want = 0.0;
    for (long t = 0; t < 12; t++) {
        optim_step(&o, &w, &g);
        want -= (float)optim_lr(&c, t);
        assert_float_equal(w, want, 1e-6);
    }
    optim_release(&o);
    assert_int_equal(optim_lr_sched_parse("cosine"), LR_COSINE);
    assert_int_equal(optim_lr_sched_parse("step"), -1);
    assert_string_equal(optim_lr_sched_name(LR_LINEAR), "linear");
}

/* Clipping's pieces: the sum of squares in double and independent of how the buffer is split,
 * PyTorch's factor (clamped at 1, 1e-6 added to the norm), and the scaling. */
static void test_clip_pieces(void **st) {
    (void)st;
    enum { N = 1003 };
    float g[N];
    double want = 0.0;
    for (int i = 0; i < N; i++) g[i] = (float)((i * 37) % 101 - 50) / 25.0f, want += (double)g[i] * g[i];
    assert_float_equal(optim_sumsq(g, N), want, 1e-9 * want);
    assert_float_equal(optim_sumsq(g, 5), (double)g[0] * g[0] + (double)g[1] * g[1] + (double)g[2] * g[2] +
                                              (double)g[3] * g[3] + (double)g[4] * g[4], 1e-12);
    assert_float_equal(optim_clip_coef(4.0, 1.0f), 1.0f / (2.0f + 1e-6f), 0);
    assert_float_equal(optim_clip_coef(0.25, 1.0f), 1.0f, 0);
    float h[3] = {3, -4, 0};
    optim_scale(h, 3, optim_clip_coef(optim_sumsq(h, 3), 1.0f));
    assert_float_equal(sqrt(optim_sumsq(h, 3)), 1.0, 1e-6);
}

/* A chain of one-layer contexts ctx[0 .. nl) run as one range: forward of n samples from x
 * (returns the last output), then backward of dy into dx and dw (both zeroed by the caller). */
static const float *run_chain(Model *m, NnCtx **ctx, int nl, const float *w, const float *x, const float *dy, int n,
                              size_t nx, float *dx, float *dw) {
    NnRun run = {.n = n, .train = 1, .seed = 1, .minibatch = 0};
    const float *a = x;
    for (int i = 0; i < nl; i++) a = model_forward(m, ctx[i], w + model_param_offset(m, i), NULL, a, &run);
    float *g = calloc(nx * 4, sizeof(float)), *g2 = calloc(nx * 4, sizeof(float));
    memcpy(g, dy, sizeof(float) * n * shape_numel(model_layer_out_shape(m, nl - 1)));
    for (int i = nl - 1; i >= 0; i--) {
        size_t in = (size_t)n * shape_numel(model_layer_in_shape(m, i));
        memset(g2, 0, sizeof(float) * in);
        model_backward(m, ctx[i], w + model_param_offset(m, i), g, i ? g2 : dx, dw + model_param_offset(m, i));
        memcpy(g, g2, sizeof(float) * in);
    }
    free(g), free(g2);
    return a;
}

/* Blocked activations inside a range (model.c's plan_layouts): a range whose convolutions,
 * pool and relu pass the blocked layout between them gives bitwise what the same layers give run as
 * one-layer ranges (every activation plain), for the output, dx and dW, with the whole and
 * the split backward, at n_max and at a smaller n. The same one-layer ranges given the ends
 * the whole range has (model_cut_layouts, nnctx_set_ends: the profiler's timing), or those of
 * the range cut before the pool, give the same bits too. */
static void test_blocked_range_vs_layers(void **st) {
    (void)st;
    enum { n_max_of_blocked = 3 };
    static const char *json = M("[16, 8, 8]",
        "{\"type\": \"conv2d\", \"in\": 16, \"out\": 16, \"kernel\": 3, \"pad\": 1, \"relu\": true},"
        "{\"type\": \"maxpool\", \"kernel\": 2},"
        "{\"type\": \"conv2d\", \"in\": 16, \"out\": 32, \"kernel\": 3, \"pad\": 1},"
        "{\"type\": \"relu\"},"
        "{\"type\": \"conv2d\", \"in\": 32, \"out\": 16, \"kernel\": 3, \"pad\": 1, \"bias\": false, \"relu\": true},"
        "{\"type\": \"flatten\"},"
        "{\"type\": \"linear\", \"in\": 256, \"out\": 10}");
    Err err = {0};
    KConv probe;   /* the range's first convolution keeps oneDNN's blocked layout (nChw16c, or nChw8c on AVX2) */
    assert_int_equal(kern_conv2d_init_algo(&probe, KCONV_DNNL, n_max_of_blocked, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, &err), PD_OK);
    const int blocked = kern_conv2d_layouts(&probe) == (KCONV_X_BLK | KCONV_Y_BLK);
    kern_conv2d_release(&probe);
    if (!blocked) {   /* oneDNN chose a plain layout on this CPU (NHWC, say): no blocked range to test */
        tu_skip("oneDNN chose no blocked layout for a 16-channel convolution on this CPU");
        return;
    }
    Model *m = model_parse(json, "blocked", &err);
    assert_non_null(m);
    const int nl = model_n_layers(m), n_max = n_max_of_blocked;
    assert_int_equal(model_build(m, 0, nl, n_max, &err), PD_OK);
    const size_t np = model_param_count(m, 0, nl), nx = (size_t)n_max * 16 * 8 * 8;
    float *w = pd_alloc_f32(np), *x = pd_alloc_f32(nx), dy[3 * 10];
    model_init_params(m, 0, nl, 7, w);
    for (size_t i = 0; i < nx; i++) x[i] = (float)((i * 7919) % 23) / 11.0f - 1.0f;
    for (int i = 0; i < 3 * 10; i++) dy[i] = (float)(i % 7) / 3.0f - 1.0f;
    NnCtx *whole = nnctx_new(m, 0, nl, n_max);
    NnCtx *one[16], *in_ends[2][16];
    for (int i = 0; i < nl; i++) one[i] = nnctx_new(m, i, i + 1, n_max);
    /* the layouts: inside, every activation between the convolutions, pool and relu blocked;
     * cut after the first convolution, the pool (layout-preserving) plain on both sides */
    unsigned char ends[2][16], cut[16] = {1};
    static const unsigned char want[2][7] = {{NN_END_Y, NN_END_X | NN_END_Y, NN_END_X | NN_END_Y, NN_END_X | NN_END_Y, NN_END_X, 0, 0},
                                             {0, 0, NN_END_Y, NN_END_X | NN_END_Y, NN_END_X, 0, 0}};
    model_cut_layouts(m, 0, nl, NULL, ends[0]);
    model_cut_layouts(m, 0, nl, cut, ends[1]);
    assert_int_equal(nl, 7);
    assert_memory_equal(ends[0], want[0], 7);
    assert_memory_equal(ends[1], want[1], 7);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < nl; i++) {
            in_ends[k][i] = nnctx_new(m, i, i + 1, n_max);
            assert_int_equal(nnctx_set_ends(in_ends[k][i], ends[k][i] & NN_END_X, ends[k][i] & NN_END_Y), 1);
        }
    /* ends a layer cannot meet are refused: the pool blocked on one side only, flatten's input */
    assert_int_equal(nnctx_set_ends(one[1], 0, 1), 0);
    assert_int_equal(nnctx_set_ends(one[1], 1, 0), 0);
    assert_int_equal(nnctx_set_ends(one[5], 1, 0), 0);
    for (int n = n_max; n >= 2; n--) {
        NnRun run = {.n = n, .train = 1, .seed = 1, .minibatch = 0};
        /* the plain chain */
        float *dw = calloc(np, sizeof(float)), *dx = calloc(nx, sizeof(float));
        float out[3 * 10];
        memcpy(out, run_chain(m, one, nl, w, x, dy, n, nx, dx, dw), sizeof(float) * n * 10);
        /* the chains with the range's layouts, whole and cut */
        for (int k = 0; k < 2; k++) {
            float *dw_c = calloc(np, sizeof(float)), *dx_c = calloc(nx, sizeof(float));
            assert_memory_equal(run_chain(m, in_ends[k], nl, w, x, dy, n, nx, dx_c, dw_c), out, sizeof(float) * n * 10);
            /* the first convolution's output left blocked (the same numbers in another order)
             * inside, plain where the range is cut after it */
            const size_t y0 = sizeof(float) * n * 16 * 8 * 8;
            if (k == 0) assert_memory_not_equal(nnctx_output(in_ends[k][0]), nnctx_output(one[0]), y0);
            else assert_memory_equal(nnctx_output(in_ends[k][0]), nnctx_output(one[0]), y0);
            assert_memory_equal(dx_c, dx, sizeof(float) * n * 16 * 8 * 8);
            assert_memory_equal(dw_c, dw, sizeof(float) * np);
            free(dw_c), free(dx_c);
        }
        /* the range */
        const float *b = model_forward(m, whole, w, NULL, x, &run);
        assert_memory_equal(b, out, sizeof(float) * n * 10);
        float *dw_r = calloc(np, sizeof(float)), *dx_r = calloc(nx, sizeof(float));
        model_backward(m, whole, w, dy, dx_r, dw_r);
        assert_memory_equal(dx_r, dx, sizeof(float) * n * 16 * 8 * 8);
        assert_memory_equal(dw_r, dw, sizeof(float) * np);
        /* the split backward of the range */
        float *keep = calloc(model_split_floats(m, 0, nl, n_max) + 1, sizeof(float));
        float *dw_s = calloc(np, sizeof(float)), *dx_s = calloc(nx, sizeof(float));
        model_backward_b(m, whole, w, dy, dx_s, dw_s, keep);
        model_backward_w(m, whole, w, dy, keep, dw_s, NULL, NULL);
        assert_memory_equal(dx_s, dx, sizeof(float) * n * 16 * 8 * 8);
        assert_memory_equal(dw_s, dw, sizeof(float) * np);
        free(dw), free(dx), free(dw_r), free(dx_r), free(keep), free(dw_s), free(dx_s);
    }
    for (int i = 0; i < nl; i++) nnctx_free(one[i]), nnctx_free(in_ends[0][i]), nnctx_free(in_ends[1][i]);
    nnctx_free(whole);
    pd_free(w);
    pd_free(x);
    model_free(m);
}

/* Residual blocks on blocked data (layer_residual.c's per-call planning, batch norm on
 * blocked data): a chain of resnet-style blocks run as one range (inside it the first block turns
 * plain data blocked, the middle ones stay blocked, the last turns it plain again for gap)
 * gives bitwise what the same sub-layers give run one by one as one-layer ranges of a
 * flattened model (every activation plain) with the add and relu written out here: the
 * output, dx, dW and the running statistics, in training and in eval, at n_max and a smaller
 * n. Residual blocks have no split backward (they run whole in BI), so the split passes are
 * checked to equal the whole one. */
#define CONV(i, o, s, k, p) "{\"type\": \"conv2d\", \"in\": " #i ", \"out\": " #o ", \"kernel\": " #k \
    ", \"stride\": " #s ", \"pad\": " #p ", \"bias\": false}"
#define BN(c, r) "{\"type\": \"batchnorm\", \"features\": " #c ", \"relu\": " r "}"
#define BODY(i, o, s) CONV(i, o, s, 3, 1) "," BN(o, "true") "," CONV(o, o, 1, 3, 1) "," BN(o, "false")
#define TAIL "{\"type\": \"gap\"}, {\"type\": \"linear\", \"in\": 32, \"out\": 10}"
#define RES_JSON(in) M(in, \
        "{\"type\": \"residual\", \"body\": [" BODY(16, 16, 1) "]}," \
        "{\"type\": \"residual\", \"body\": [" BODY(16, 16, 1) "]}," \
        "{\"type\": \"residual\", \"body\": [" BODY(16, 32, 2) "], \"shortcut\": [" CONV(16, 32, 2, 1, 0) "," BN(32, "false") "]}," \
        "{\"type\": \"residual\", \"body\": [" BODY(32, 32, 1) "]}," TAIL)
static void check_residual_vs_flat(const char *json, const char *const flat[3], int h) {
    /* the flat layers' blocks: body [a, b), shortcut [b, c) (empty: identity) */
    static const int blk[4][3] = {{0, 4, 4}, {4, 8, 8}, {8, 12, 14}, {14, 18, 18}};
    Err err = {0};
    Model *m = model_parse(json, "res", &err), *fm[3];
    assert_non_null(m);
    const int nl = model_n_layers(m), n_max = 3;
    assert_int_equal(model_build(m, 0, nl, n_max, &err), PD_OK);
    const size_t np = model_param_count(m, 0, nl), ns = model_state_count(m, 0, nl);
    struct {
        Model *m;
        int i;
        NnCtx *c;
        size_t po, so;
    } fl[20];
    int nf = 0;
    size_t po = 0, so = 0;
    for (int p = 0; p < 3; p++) {
        fm[p] = model_parse(flat[p], "flat", &err);
        if (!fm[p]) fail_msg("%s", err.msg);
        const int k = model_n_layers(fm[p]);
        assert_int_equal(model_build(fm[p], 0, k, n_max, &err), PD_OK);
        for (int i = 0; i < k; i++, nf++) {
            fl[nf].m = fm[p], fl[nf].i = i, fl[nf].c = nnctx_new(fm[p], i, i + 1, n_max);
            fl[nf].po = po + model_param_offset(fm[p], i), fl[nf].so = so + model_state_offset(fm[p], i);
        }
        po += model_param_count(fm[p], 0, k), so += model_state_count(fm[p], 0, k);
    }
    assert_int_equal(nf, 20);
    assert_int_equal(po, np);
    assert_int_equal(so, ns);
    const size_t nx = (size_t)n_max * 16 * h * h, big = nx * 2;
    float *w = pd_alloc_f32(np), *x = pd_alloc_f32(nx), dy[3 * 10];
    float *st_m = pd_alloc_f32(ns), *st_f = pd_alloc_f32(ns);
    model_init_params(m, 0, nl, 7, w);
    for (size_t i = 0; i < nx; i++) x[i] = (float)((i * 7919) % 23) / 11.0f - 1.0f;
    for (int i = 0; i < 3 * 10; i++) dy[i] = (float)(i % 7) / 3.0f - 1.0f;
    NnCtx *whole = nnctx_new(m, 0, nl, n_max);
    float *yb[4], *dsum = pd_alloc_f32(big), *g = pd_alloc_f32(big), *g2 = pd_alloc_f32(big), *dxb = pd_alloc_f32(big);
    for (int k = 0; k < 4; k++) yb[k] = pd_alloc_f32(big);
#define FWD(k, in) model_forward(fl[k].m, fl[k].c, w + fl[k].po, st_f + fl[k].so, in, &run)
#define BWD(k, gi, dxi) model_backward(fl[k].m, fl[k].c, w + fl[k].po, gi, dxi, dw + fl[k].po)
#define OUT(k) shape_numel(model_layer_out_shape(fl[k].m, fl[k].i))
#define IN(k) shape_numel(model_layer_in_shape(fl[k].m, fl[k].i))
    for (int pass = 0; pass < 4; pass++) {
        const int n = pass & 1 ? 2 : n_max, train = pass < 2;
        NnRun run = {.n = n, .train = train, .seed = 1, .minibatch = 0};
        model_init_state(m, 0, nl, st_m);
        memcpy(st_f, st_m, sizeof(float) * ns);
        /* the flat, plain chain */
        const float *a = x;
        for (int k = 0; k < 4; k++) {
            const float *bo = a, *so = a;
            for (int i = blk[k][0]; i < blk[k][1]; i++) bo = FWD(i, bo);
            for (int i = blk[k][1]; i < blk[k][2]; i++) so = FWD(i, so);
            const size_t cnt = (size_t)n * OUT(blk[k][1] - 1);
            for (size_t e = 0; e < cnt; e++) {
                float v = bo[e] + so[e];
                yb[k][e] = v > 0 ? v : 0.0f;
            }
            a = yb[k];
        }
        float out[3 * 10];
        memcpy(out, FWD(19, FWD(18, a)), sizeof(float) * n * 10);
        float *dw = calloc(np, sizeof(float)), *dx = calloc(nx, sizeof(float));
        memset(g2, 0, sizeof(float) * big);
        BWD(19, dy, g2);
        memset(g, 0, sizeof(float) * big);
        BWD(18, g2, g);   // g: the gradient w.r.t. the last block's output
        for (int k = 3; k >= 0; k--) {
            const size_t cnt = (size_t)n * OUT(blk[k][1] - 1), cin = (size_t)n * IN(blk[k][0]);
            for (size_t e = 0; e < cnt; e++) dsum[e] = yb[k][e] > 0 ? g[e] : 0.0f;
            memset(dxb, 0, sizeof(float) * big);
            for (int c0 = 0; c0 < 2; c0++) {   // body, then shortcut (identity: dsum itself)
                const int lo = blk[k][c0], hi = blk[k][c0 + 1];
                if (lo == hi) {
                    if (c0) for (size_t e = 0; e < cin; e++) dxb[e] += dsum[e];
                    continue;
                }
                memcpy(g, dsum, sizeof(float) * cnt);
                for (int i = hi - 1; i >= lo; i--) {
                    const size_t in = (size_t)n * IN(i);
                    if (i == lo) {
                        BWD(i, g, dxb);
                    } else {
                        memset(g2, 0, sizeof(float) * in);
                        BWD(i, g, g2);
                        memcpy(g, g2, sizeof(float) * in);
                    }
                }
            }
            memcpy(g, dxb, sizeof(float) * cin);
        }
        memcpy(dx, g, sizeof(float) * n * 16 * h * h);
        /* the range */
        const float *b = model_forward(m, whole, w, st_m, x, &run);
        assert_memory_equal(b, out, sizeof(float) * n * 10);
        assert_memory_equal(st_m, st_f, sizeof(float) * ns);
        float *dw_r = calloc(np, sizeof(float)), *dx_r = calloc(nx, sizeof(float));
        model_backward(m, whole, w, dy, dx_r, dw_r);
        assert_memory_equal(dx_r, dx, sizeof(float) * n * 16 * h * h);
        assert_memory_equal(dw_r, dw, sizeof(float) * np);
        float *keep = calloc(model_split_floats(m, 0, nl, n_max) + 1, sizeof(float));
        float *dw_s = calloc(np, sizeof(float)), *dx_s = calloc(nx, sizeof(float));
        model_backward_b(m, whole, w, dy, dx_s, dw_s, keep);
        model_backward_w(m, whole, w, dy, keep, dw_s, NULL, NULL);
        assert_memory_equal(dx_s, dx, sizeof(float) * n * 16 * h * h);
        assert_memory_equal(dw_s, dw, sizeof(float) * np);
        free(dw), free(dx), free(dw_r), free(dx_r), free(keep), free(dw_s), free(dx_s);
    }
#undef FWD
#undef BWD
#undef OUT
#undef IN
    for (int i = 0; i < nf; i++) nnctx_free(fl[i].c);
    nnctx_free(whole);
    for (int k = 0; k < 4; k++) pd_free(yb[k]);
    float *all[] = {w, x, st_m, st_f, dsum, g, g2, dxb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
    model_free(m);
    for (int p = 0; p < 3; p++) model_free(fm[p]);
}

/* the same sub-layers flat, in three shape-chained pieces (the shortcut apart), whose
 * parameters and statistics, one piece after the other, are laid out as the model's */
#define FLAT(in, mid) {M(in, BODY(16, 16, 1) "," BODY(16, 16, 1) "," BODY(16, 32, 2)), \
                       M(in, CONV(16, 32, 2, 1, 0) "," BN(32, "false")), M(mid, BODY(32, 32, 1) "," TAIL)}
static void test_blocked_residual_vs_flat(void **st) {
    (void)st;
    static const char *const flat8[3] = FLAT("[16, 8, 8]", "[32, 4, 4]"), *const flat6[3] = FLAT("[16, 6, 6]", "[32, 3, 3]");
    check_residual_vs_flat(RES_JSON("[16, 8, 8]"), flat8, 8);
    check_residual_vs_flat(RES_JSON("[16, 6, 6]"), flat6, 6);   // planes of 36 and 9 pixels: partial tiles
}

static int setup(void **st) {
    (void)st;
    tu_ref_load(&REF, "nn_layers.bin");
    return 0;
}
static int teardown(void **st) {
    (void)st;
    tu_ref_free(&REF);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layers_vs_pytorch),
        cmocka_unit_test(test_dropout_mask),
        cmocka_unit_test(test_optimizers),
        cmocka_unit_test(test_lr_schedule),
        cmocka_unit_test(test_clip_pieces),
        cmocka_unit_test(test_blocked_range_vs_layers),
        cmocka_unit_test(test_blocked_residual_vs_flat),
    };
    return tu_run_group(tests, setup, teardown);
}
