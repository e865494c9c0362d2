/* test_nn_models.c: the five reference models (models/NAME.json) against PyTorch
 * (tests/ref/nn_model_NAME.bin, tools/gen_ref.py): logits, loss, input gradient, parameter
 * gradients (sampled), batch-norm statistics, and the losses of 10 SGD steps; parameter
 * counts and FLOPs of MODELS.md; model JSON errors; layer ranges (pipeline stages) equal the
 * whole model; several minibatches in flight with their own weights equal one at a time;
 * initialisation. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "nn.h"

/* Under AddressSanitizer (~10x slower) the 10-step runs stop after 3 steps; the release
 * build checks all 10. */
#ifdef __SANITIZE_ADDRESS__
enum { MAX_STEPS = 3 };
#else
enum { MAX_STEPS = 10 };
#endif

static const char *NAMES[] = {"mlp", "lenet5", "vgg16", "resnet20", "lstm"};
enum { N_MODELS = 5 };

static Model *load(const char *name) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s.json", name);
    Err err = {0};
    Model *m = model_load(tu_src(rel), &err);
    if (!m) fail_msg("%s", err.msg);
    return m;
}

/* The deterministic weights of tools/torch_models.py hash_fill (an integer hash of tensor j
 * and element i). */
static void hash_fill(const Model *m, float *w) {
    int n;
    const ParamInfo *pt = model_param_tensors(m, &n);
    for (int j = 0; j < n; j++) {
        size_t cnt = shape_numel(pt[j].shape);
        for (size_t i = 0; i < cnt; i++) {
            uint32_t x = (uint32_t)i * 0x9E3779B1u + (uint32_t)j * 0x85EBCA77u + 0x165667B1u;
            x ^= x >> 15;
            x *= 0x2C1B3C6Du;
            x ^= x >> 12;
            x *= 0x297A2D39u;
            x ^= x >> 15;
            double u = (double)(x >> 8) / 16777216.0, v;
            if (pt[j].kind == PARAM_GAMMA) v = 1.0 + 0.1 * (2.0 * u - 1.0);
            else if (pt[j].kind == PARAM_BETA) v = 0.1 * (2.0 * u - 1.0);
            else v = (2.0 * u - 1.0) / sqrt((double)pt[j].fan_in);
            w[pt[j].offset + i] = (float)v;
        }
    }
}

/* Elements that differ at all (quiet: for checks that things DO differ). */
static size_t n_differ(const float *a, const float *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += a[i] != b[i];
    return d;
}

static void test_param_counts_and_flops(void **st) {
    (void)st;
    const size_t params[N_MODELS] = {1863690, 61706, 5401530, 272186, 821770};
    const double mflops[N_MODELS] = {3.72, 0.83, 48.2, 81.0, 45.7};
    for (int k = 0; k < N_MODELS; k++) {
        Model *m = load(NAMES[k]);
        int nl = model_n_layers(m);
        assert_int_equal(model_param_count(m, 0, nl), params[k]);
        assert_int_equal(model_param_offset(m, nl), params[k]);
        double f = model_flops(m) / 1e6;
        if (fabs(f - mflops[k]) > 0.006 * mflops[k]) fail_msg("%s: %.3f MFLOPs, MODELS.md says %.2f", NAMES[k], f, mflops[k]);
        Shape o = model_layer_out_shape(m, nl - 1);
        assert_int_equal(o.ndim, 1);
        assert_int_equal(o.d[0], 10);
        model_free(m);
    }
}

static void check_model(const char *name) {
    char file[64];
    snprintf(file, sizeof file, "nn_model_%s.bin", name);
    RefFile rf;
    tu_ref_load(&rf, file);
    Model *m = load(name);
    Err err = {0};
    int nl = model_n_layers(m), train = strcmp(name, "vgg16") != 0;
    const RefTensor *x = tu_ref_get(&rf, "x"), *lab = tu_ref_get(&rf, "labels");
    int n = x->shape.d[0];
    assert_int_equal(model_build(m, 0, nl, n, &err), PD_OK);
    size_t np = model_param_count(m, 0, nl), ns = model_state_count(m, 0, nl);
    float *w = pd_alloc_f32(np), *dw = pd_alloc_f32(np), *state = pd_alloc_f32(ns + 1);
    float *dx = pd_alloc_f32(shape_numel(x->shape)), dl[64 * 10];
    int32_t labels[64];
    for (int i = 0; i < n; i++) labels[i] = (int32_t)lab->data[i];
    hash_fill(m, w);
    model_init_state(m, 0, nl, state);
    NnCtx *ctx = nnctx_new(m, 0, nl, n);
    NnRun run = {.n = n, .train = train, .seed = 1, .minibatch = 0};
    const float *logits = model_forward(m, ctx, w, state, x->data, &run);
    size_t bad = tu_compare("logits", logits, tu_ref_get(&rf, "logits")->data, (size_t)n * 10, 1e-4, 1e-5);
    memset(dl, 0, sizeof dl);
    float loss = kern_xent_fwd_bwd(logits, labels, dl, n, 10, 1.0f, NULL);
    bad += tu_compare("loss", &loss, tu_ref_get(&rf, "loss")->data, 1, 1e-5, 1e-6);
    model_backward(m, ctx, w, dl, dx, dw);
    bad += tu_compare("dx", dx, tu_ref_get(&rf, "dx")->data, shape_numel(x->shape), 1e-3, 1e-6);
    int npt;
    const ParamInfo *pt = model_param_tensors(m, &npt);
    for (int k = 0; k < npt; k++) {
        char g[32], s[40];
        snprintf(g, sizeof g, "grad.%d", k);
        snprintf(s, sizeof s, "grad.%d.stride", k);
        const RefTensor *gr = tu_ref_get(&rf, g);
        size_t stride = (size_t)tu_ref_get(&rf, s)->data[0], cnt = shape_numel(gr->shape);
        assert_int_equal((shape_numel(pt[k].shape) + stride - 1) / stride, cnt);
        float *got = malloc(cnt * sizeof(float));
        for (size_t i = 0; i < cnt; i++) got[i] = dw[pt[k].offset + i * stride];
        /* gradient entries near zero are sums of cancelling terms: atol scaled to the tensor */
        double mx = 0;
        for (size_t i = 0; i < cnt; i++) mx = fmax(mx, fabs(gr->data[i]));
        bad += tu_compare(pt[k].name, got, gr->data, cnt, 1e-3, 1e-4 * mx + 1e-7);
        free(got);
    }
    if (ns) bad += tu_compare("bn state", state, tu_ref_get(&rf, "state")->data, ns, 1e-4, 1e-6);
    /* without dx (the data needs no gradient: the first parameterised layer skips its
     * input-gradient pass, the layers before it everything): the same weight gradients, bitwise */
    float *dw2 = pd_alloc_f32(np);
    model_backward(m, ctx, w, dl, NULL, dw2);
    if (memcmp(dw, dw2, np * sizeof(float))) fail_msg("%s: weight gradients differ without dx", name);
    pd_free(dw2);
    /* 10 SGD steps from the same weights and state */
    const RefTensor *sx = tu_ref_get(&rf, "steps.x"), *sl = tu_ref_get(&rf, "steps.labels"),
                    *sloss = tu_ref_get(&rf, "steps.loss"), *srtol = tu_ref_get(&rf, "steps.rtol");
    hash_fill(m, w);
    model_init_state(m, 0, nl, state);
    OptConfig oc = optim_defaults(OPT_SGD, tu_ref_get(&rf, "steps.lr")->data[0]);
    oc.momentum = 0.9f;
    Optim opt;
    optim_init(&opt, &oc, np);
    int steps = sx->shape.d[0];
    size_t per = shape_numel(sx->shape) / (size_t)steps;
    if (steps > MAX_STEPS) steps = MAX_STEPS;
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < n; i++) labels[i] = (int32_t)sl->data[s * n + i];
        run.minibatch = (uint64_t)s;
        logits = model_forward(m, ctx, w, state, sx->data + s * per, &run);
        memset(dl, 0, sizeof dl);
        loss = kern_xent_fwd_bwd(logits, labels, dl, n, 10, 1.0f, NULL);
        char what[64];
        snprintf(what, sizeof what, "%s step %d loss", name, s);
        bad += tu_compare(what, &loss, sloss->data + s, 1, srtol->data[s], 1e-6);
        memset(dw, 0, np * sizeof(float));
        model_backward(m, ctx, w, dl, NULL, dw);
        optim_step(&opt, w, dw);
    }
    if (bad) fail_msg("%s: %zu mismatches against PyTorch", name, bad);
    optim_release(&opt);
    nnctx_free(ctx);
    pd_free(w);
    pd_free(dw);
    pd_free(dx);
    pd_free(state);
    model_free(m);
    tu_ref_free(&rf);
}

static void test_mlp_vs_pytorch(void **st) { (void)st; check_model("mlp"); }
static void test_lenet5_vs_pytorch(void **st) { (void)st; check_model("lenet5"); }
static void test_vgg16_vs_pytorch(void **st) { (void)st; check_model("vgg16"); }
static void test_resnet20_vs_pytorch(void **st) { (void)st; check_model("resnet20"); }
static void test_lstm_vs_pytorch(void **st) { (void)st; check_model("lstm"); }

/* ---- model JSON errors ---------------------------------------------------------------- */
static void expect_error(const char *json, const char *want) {
    Err err = {0};
    Model *m = model_parse(json, "t.json", &err);
    if (m) fail_msg("accepted: %s", json);
    assert_int_equal(err.code, PD_EINVAL);
    if (!strstr(err.msg, want)) fail_msg("message \"%s\" lacks \"%s\"", err.msg, want);
}

#define HEAD "{\"name\": \"t\", \"input\": [1, 28, 28], \"layers\": ["
static void test_json_errors(void **st) {
    (void)st;
    expect_error(HEAD "{\"type\": \"flatten\"}, {\"type\": \"conv3d\"}]}", "t.json: layer 1: unknown layer type \"conv3d\"");
    expect_error(HEAD "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"in\": 784}]}",
                 "t.json: layer 1 (linear): missing required key \"out\"");
    expect_error(HEAD "{\"type\": \"conv2d\", \"in\": 1, \"out\": 4, \"kernel\": 3, \"kernal\": 3}]}",
                 "t.json: layer 0 (conv2d): unknown key \"kernal\"");
    expect_error(HEAD "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"in\": 100, \"out\": 10}]}",
                 "t.json: layer 1 (linear): key \"in\": 100, but the incoming shape is (784)");
    expect_error(HEAD "{\"type\": \"linear\", \"in\": 784, \"out\": 10}]}", "not 1-D (add a \"flatten\"");
    expect_error(HEAD "{\"type\": \"conv2d\", \"in\": 3, \"out\": 4, \"kernel\": 3}]}",
                 "layer 0 (conv2d): key \"in\": 3 channels, but the incoming shape is (1, 28, 28)");
    expect_error(HEAD "{\"type\": \"residual\", \"body\": [{\"type\": \"conv2d\", \"in\": 1, \"out\": 4, \"kernel\": 3, "
                      "\"pad\": 1}, {\"type\": \"batchnorm\", \"features\": 5}]}]}",
                 "t.json: layer 0 (residual): body[1] (batchnorm): key \"features\": 5");
    expect_error(HEAD "{\"type\": \"residual\", \"body\": [{\"type\": \"conv2d\", \"in\": 1, \"out\": 4, \"kernel\": 3, "
                      "\"pad\": 1}]}]}",
                 "body output (4, 28, 28) differs from shortcut output (1, 28, 28)");
    expect_error(HEAD "{\"type\": \"dropout\"}]}", "layer 0 (dropout): missing required key \"p\"");
    expect_error(HEAD "{\"type\": \"dropout\", \"p\": 1.5}]}", "key \"p\": 1.5 is outside");
    expect_error(HEAD "{\"type\": \"reshape\", \"shape\": [27, 28]}]}", "has 756 elements");
    expect_error(HEAD "{\"type\": \"flatten\"}], \"optimizer\": \"sgd\"}", "t.json: unknown key \"optimizer\"");
    expect_error("{\"name\": \"t\", \"layers\": [{\"type\": \"flatten\"}]}", "missing required key \"input\"");
    expect_error(HEAD "{\"type\": \"flatten\"},]}", "t.json: line 1: invalid JSON");
    expect_error(HEAD "{\"type\": \"maxpool\", \"kernel\": 40}]}", "kernel 40 is larger than the input");
    expect_error("{\"name\": \"t\", \"input\": [1000000, 1000000, 1000], \"layers\": [{\"type\": \"flatten\"}]}",
                 "layer 0 (flatten): incoming shape (1000000, 1000000, 1000) is too large");
    expect_error(HEAD "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"in\": 784, \"out\": 16000000}]}",
                 "parameter count 12560000000 is larger than");
    Err err = {0};
    assert_null(model_load("/nonexistent/model.json", &err));
    assert_int_equal(err.code, PD_EIO);
    assert_non_null(strstr(err.msg, "/nonexistent/model.json"));
}

/* ---- ranges and minibatches in flight ------------------------------------------------------ */
/* Runs forward+backward of [0, nl) and of [0, cut) + [cut, nl) (two stages, own buffers at
 * their offsets) on the same data; everything must agree exactly. */
static void check_split(const char *name, int cut) {
    Model *m = load(name);
    Err err = {0};
    int nl = model_n_layers(m), n = 3;
    assert_int_equal(model_build(m, 0, cut, n, &err), PD_OK);   // stages build their own ranges
    assert_int_equal(model_build(m, cut, nl, n, &err), PD_OK);
    size_t np = model_param_count(m, 0, nl), ns = model_state_count(m, 0, nl), nin = (size_t)n * 784;
    float *w = pd_alloc_f32(np), *dw1 = pd_alloc_f32(np), *dw2 = pd_alloc_f32(np), *s1 = pd_alloc_f32(ns + 1),
          *s2 = pd_alloc_f32(ns + 1), *x = pd_alloc_f32(nin), *dx1 = pd_alloc_f32(nin), *dx2 = pd_alloc_f32(nin);
    model_init_params(m, 0, nl, 9, w);
    model_init_state(m, 0, nl, s1);
    model_init_state(m, 0, nl, s2);
    Rng r;
    rng_init(&r, 5, 0, 0);
    for (size_t i = 0; i < nin; i++) x[i] = rng_uniform(&r);
    float dy[30];
    for (int i = 0; i < 30; i++) dy[i] = rng_uniform(&r) - 0.5f;
    NnRun run = {.n = n, .train = 1, .seed = 3, .minibatch = 11};
    NnCtx *full = nnctx_new(m, 0, nl, n), *a = nnctx_new(m, 0, cut, n), *b = nnctx_new(m, cut, nl, n);
    const float *yf = model_forward(m, full, w, s1, x, &run);
    model_backward(m, full, w, dy, dx1, dw1);
    size_t pc = model_param_offset(m, cut), sc = model_state_offset(m, cut);
    const float *ya = model_forward(m, a, w, s2, x, &run);
    Shape mid = model_layer_out_shape(m, cut - 1);
    memcpy(nnctx_input(b), ya, (size_t)n * shape_numel(mid) * sizeof(float));   // "receive"
    const float *yb = model_forward(m, b, w + pc, s2 + sc, nnctx_input(b), &run);
    size_t bad = tu_compare("split output", yb, yf, 30, 0, 0);
    float *g = pd_alloc_f32((size_t)n * shape_numel(mid));
    model_backward(m, b, w + pc, dy, g, dw2 + pc);
    model_backward(m, a, w, g, dx2, dw2);
    bad += tu_compare("split dx", dx2, dx1, nin, 0, 0);
    bad += tu_compare("split dw", dw2, dw1, np, 0, 0);
    bad += tu_compare("split state", s2, s1, ns, 0, 0);
    if (bad) fail_msg("%s split at %d differs", name, cut);
    /* init of a range equals the slice of the full init */
    float *wr = pd_alloc_f32(np - pc + 1);
    model_init_params(m, cut, nl, 9, wr);
    assert_int_equal(tu_compare("range init", wr, w + pc, np - pc, 0, 0), 0);
    pd_free(wr);
    pd_free(g);
    nnctx_free(full);
    nnctx_free(a);
    nnctx_free(b);
    float *bufs[] = {w, dw1, dw2, s1, s2, x, dx1, dx2};
    for (int i = 0; i < 8; i++) pd_free(bufs[i]);
    model_free(m);
}

static void test_ranges_equal_whole(void **st) {
    (void)st;
    check_split("lenet5", 3);
    check_split("resnet20", 6);
    check_split("lstm", 2);
}

/* Two minibatches in flight with two weight versions (interleaved forward A, forward B,
 * backward A, backward B) give the results of running them one at a time. */
static void test_two_in_flight(void **st) {
    (void)st;
    Err err = {0};
    const char *json = "{\"name\": \"t\", \"input\": [1, 28, 28], \"layers\": ["
                       "{\"type\": \"conv2d\", \"in\": 1, \"out\": 4, \"kernel\": 3, \"stride\": 2, \"bias\": false},"
                       "{\"type\": \"batchnorm\", \"features\": 4, \"relu\": true},"
                       "{\"type\": \"maxpool\", \"kernel\": 2}, {\"type\": \"flatten\"},"
                       "{\"type\": \"linear\", \"in\": 144, \"out\": 32, \"relu\": true},"
                       "{\"type\": \"dropout\", \"p\": 0.5}, {\"type\": \"linear\", \"in\": 32, \"out\": 10}]}";
    Model *m = model_parse(json, "t", &err);
    if (!m) fail_msg("%s", err.msg);
    int nl = model_n_layers(m), n = 4;
    assert_int_equal(model_build(m, 0, nl, n, &err), PD_OK);
    size_t np = model_param_count(m, 0, nl), ns = model_state_count(m, 0, nl);
    float *w[2], *dw[2][2], *dx[2][2], *s[2], *x[2], out[2][2][40], dy[40];
    for (int k = 0; k < 2; k++) {
        w[k] = pd_alloc_f32(np);
        model_init_params(m, 0, nl, 100 + (uint64_t)k, w[k]);
        s[k] = pd_alloc_f32(ns);
        model_init_state(m, 0, nl, s[k]);
        x[k] = pd_alloc_f32((size_t)n * 784);
        for (int i = 0; i < n * 784; i++) x[k][i] = (float)((i * 7 + k * 13) % 17) / 17.0f;
        for (int v = 0; v < 2; v++) {
            dw[k][v] = pd_alloc_f32(np);
            dx[k][v] = pd_alloc_f32((size_t)n * 784);
        }
    }
    for (int i = 0; i < 40; i++) dy[i] = (float)(i % 5) - 2.0f;
    NnCtx *c[2] = {nnctx_new(m, 0, nl, n), nnctx_new(m, 0, nl, n)};
    NnRun run[2] = {{.n = n, .train = 1, .seed = 1, .minibatch = 0}, {.n = n, .train = 1, .seed = 1, .minibatch = 1}};
    /* one at a time (state s[0]) */
    for (int k = 0; k < 2; k++) {
        memcpy(out[k][0], model_forward(m, c[0], w[k], s[0], x[k], &run[k]), 40 * sizeof(float));
        model_backward(m, c[0], w[k], dy, dx[k][0], dw[k][0]);
    }
    /* interleaved (state s[1]) */
    for (int k = 0; k < 2; k++)
        memcpy(out[k][1], model_forward(m, c[k], w[k], s[1], x[k], &run[k]), 40 * sizeof(float));
    for (int k = 0; k < 2; k++) model_backward(m, c[k], w[k], dy, dx[k][1], dw[k][1]);
    size_t bad = 0;
    for (int k = 0; k < 2; k++) {
        bad += tu_compare("in flight y", out[k][1], out[k][0], 40, 0, 0);
        bad += tu_compare("in flight dx", dx[k][1], dx[k][0], (size_t)n * 784, 0, 0);
        bad += tu_compare("in flight dw", dw[k][1], dw[k][0], np, 0, 0);
    }
    bad += tu_compare("in flight state", s[1], s[0], ns, 0, 0);
    assert_int_equal(bad, 0);
    /* and the two versions really differ */
    assert_true(n_differ(out[1][0], out[0][0], 40) > 20);
    for (int k = 0; k < 2; k++) {
        nnctx_free(c[k]);
        pd_free(w[k]);
        pd_free(s[k]);
        pd_free(x[k]);
        for (int v = 0; v < 2; v++) {
            pd_free(dw[k][v]);
            pd_free(dx[k][v]);
        }
    }
    model_free(m);
}

/* PyTorch's default init: uniform(+-1/sqrt(fan_in)) (mean 0, variance bound^2 / 3), gamma 1,
 * beta 0; a pure function of the seed. */
static void test_init(void **st) {
    (void)st;
    Model *m = load("resnet20");
    int nl = model_n_layers(m), npt;
    size_t np = model_param_count(m, 0, nl);
    float *w = pd_alloc_f32(np), *w2 = pd_alloc_f32(np);
    model_init_params(m, 0, nl, 1, w);
    model_init_params(m, 0, nl, 1, w2);
    assert_int_equal(tu_compare("same seed", w2, w, np, 0, 0), 0);
    model_init_params(m, 0, nl, 2, w2);
    assert_true(n_differ(w2, w, np) > np / 2);
    const ParamInfo *pt = model_param_tensors(m, &npt);
    for (int k = 0; k < npt; k++) {
        size_t cnt = shape_numel(pt[k].shape);
        const float *d = w + pt[k].offset;
        if (pt[k].kind == PARAM_GAMMA || pt[k].kind == PARAM_BETA) {
            for (size_t i = 0; i < cnt; i++) assert_float_equal(d[i], pt[k].kind == PARAM_GAMMA ? 1.0f : 0.0f, 0);
            continue;
        }
        double bound = 1.0 / sqrt(pt[k].fan_in), s = 0, s2 = 0;
        for (size_t i = 0; i < cnt; i++) {
            assert_true(fabs(d[i]) <= bound);
            s += d[i];
            s2 += (double)d[i] * d[i];
        }
        if (cnt >= 9000) {
            double var = bound * bound / 3;
            assert_true(fabs(s / cnt) < 0.05 * bound);
            assert_true(fabs(s2 / cnt - var) < 0.05 * var);
        }
    }
    assert_string_equal(pt[0].name, "layers.1.weight");
    assert_string_equal(pt[3].name, "layers.3.body.0.weight");
    pd_free(w);
    pd_free(w2);
    model_free(m);
}

/* The one-worker Trainer (used by `pipedream train`) reproduces PyTorch's 10 SGD steps of
 * lenet5 from the same weights: loss and argmax hits per step. */
static void test_trainer_vs_pytorch(void **st) {
    (void)st;
    RefFile rf;
    tu_ref_load(&rf, "nn_model_lenet5.bin");
    Model *m = load("lenet5");
    Err err = {0};
    OptConfig oc = optim_defaults(OPT_SGD, tu_ref_get(&rf, "steps.lr")->data[0]);
    oc.momentum = 0.9f;
    const RefTensor *sx = tu_ref_get(&rf, "steps.x"), *sl = tu_ref_get(&rf, "steps.labels"),
                    *sloss = tu_ref_get(&rf, "steps.loss"), *srtol = tu_ref_get(&rf, "steps.rtol");
    int steps = sx->shape.d[0], n = sx->shape.d[1];
    Trainer t;
    assert_int_equal(trainer_init(&t, m, 8, &oc, 1, &err), PD_OK);   // n_max 8 > n = 4
    assert_int_equal(t.classes, 10);
    hash_fill(m, t.w);
    int32_t labels[8];
    size_t bad = 0;
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < n; i++) labels[i] = (int32_t)sl->data[s * n + i];
        int correct = -1;
        float loss = trainer_step(&t, sx->data + (size_t)s * n * 784, labels, n, (uint64_t)s, &correct);
        assert_true(correct >= 0 && correct <= n);
        bad += tu_compare("trainer loss", &loss, sloss->data + s, 1, srtol->data[s], 1e-6);
    }
    assert_int_equal(bad, 0);
    int correct = -1;
    float el = trainer_eval(&t, sx->data, labels, n, &correct);
    assert_true(isfinite(el) && correct >= 0 && correct <= n);
    trainer_release(&t);
    model_free(m);
    tu_ref_free(&rf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_param_counts_and_flops),
        cmocka_unit_test(test_json_errors),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_ranges_equal_whole),
        cmocka_unit_test(test_two_in_flight),
        cmocka_unit_test(test_mlp_vs_pytorch),
        cmocka_unit_test(test_lenet5_vs_pytorch),
        cmocka_unit_test(test_vgg16_vs_pytorch),
        cmocka_unit_test(test_resnet20_vs_pytorch),
        cmocka_unit_test(test_lstm_vs_pytorch),
        cmocka_unit_test(test_trainer_vs_pytorch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
