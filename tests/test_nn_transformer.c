/* test_nn_transformer.c: the transformer and language-model layer kinds (embed, layernorm,
 * gelu, dense, attention, block) and models (models/gpt-mini.json, models/lstm-lm.json):
 *   - each layer kind against PyTorch (tests/ref/nn_transformer.bin, tools/gen_ref.py):
 *     outputs, input and parameter gradients;
 *   - the fast kernels against their naive twins on random data (several shapes, n < n_max);
 *   - the two models against PyTorch (tests/ref/nn_model_<name>.bin): logits, the loss over
 *     every position, parameter gradients, and 5 Adam steps through the Trainer;
 *   - pipeline stages cut between blocks give exactly the whole model's results;
 *   - same bits for the same seed; model JSON errors of the new kinds; parameter counts. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "nn.h"

#define M(in, layer) "{\"name\": \"t\", \"input\": " in ", \"layers\": [" layer "]}"
#define LN(d) "{\"type\": \"layernorm\", \"features\": " #d "}"
#define BLOCK(d, h, hid, approx)                                                                              \
    "{\"type\": \"block\", \"steps\": [[" LN(d) ", {\"type\": \"attention\", \"dim\": " #d ", \"heads\": " #h \
    "}], [" LN(d) ", {\"type\": \"dense\", \"in\": " #d ", \"out\": " #hid "}, {\"type\": \"gelu\", "         \
    "\"approximate\": \"" approx "\"}, {\"type\": \"dense\", \"in\": " #hid ", \"out\": " #d "}]]}"

typedef struct Case {
    const char *name;
    const char *json;
    int no_dx;   /* embed: token ids have no gradient */
} Case;

static const Case CASES[] = {
    {"embed_pos", M("[5]", "{\"type\": \"embed\", \"vocab\": 11, \"dim\": 6, \"positions\": 5}"), 1},
    {"embed", M("[5]", "{\"type\": \"embed\", \"vocab\": 11, \"dim\": 6}"), 1},
    {"layernorm", M("[5, 8]", LN(8)), 0},
    {"layernorm_1d", M("[7]", "{\"type\": \"layernorm\", \"features\": 7, \"eps\": 0.001}"), 0},
    {"gelu_tanh", M("[5, 8]", "{\"type\": \"gelu\", \"approximate\": \"tanh\"}"), 0},
    {"gelu", M("[5, 8]", "{\"type\": \"gelu\"}"), 0},
    {"dense", M("[5, 8]", "{\"type\": \"dense\", \"in\": 8, \"out\": 6}"), 0},
    {"dense_nobias", M("[5, 8]", "{\"type\": \"dense\", \"in\": 8, \"out\": 6, \"bias\": false}"), 0},
    {"attention", M("[5, 8]", "{\"type\": \"attention\", \"dim\": 8, \"heads\": 2}"), 0},
    {"attention_full_nobias",
     M("[6, 12]", "{\"type\": \"attention\", \"dim\": 12, \"heads\": 3, \"causal\": false, \"bias\": false}"), 0},
    {"attention_1head", M("[7, 8]", "{\"type\": \"attention\", \"dim\": 8, \"heads\": 1, \"causal\": true}"), 0},
    {"block", M("[5, 8]", BLOCK(8, 2, 32, "tanh")), 0},
    {"block_erf", M("[6, 8]", BLOCK(8, 4, 16, "none")), 0},
};
enum { N_CASES = sizeof CASES / sizeof CASES[0] };

static RefFile REF;

static const RefTensor *get(const char *c, const char *what) {
    char name[128];
    snprintf(name, sizeof name, "%s.%s", c, what);
    return tu_ref_get(&REF, name);
}

static void run_case(const Case *c) {
    Err err = {0};
    Model *m = model_parse(c->json, c->name, &err);
    if (!m) fail_msg("%s", err.msg);
    const RefTensor *x = get(c->name, "x");
    int n = x->shape.d[0], nl = model_n_layers(m);
    assert_int_equal(model_build(m, 0, nl, n + 2, &err), PD_OK);   // built larger than run
    size_t np = model_param_count(m, 0, nl);
    float *w = pd_alloc_f32(np + 1), *dw = pd_alloc_f32(np + 1);
    int npt;
    const ParamInfo *pt = model_param_tensors(m, &npt);
    for (int k = 0; k < npt; k++) {
        char what[32];
        snprintf(what, sizeof what, "w.%d", k);
        const RefTensor *t = get(c->name, what);
        assert_int_equal(shape_numel(t->shape), shape_numel(pt[k].shape));
        memcpy(w + pt[k].offset, t->data, shape_numel(t->shape) * sizeof(float));
    }
    NnCtx *ctx = nnctx_new(m, 0, nl, n + 2);
    NnRun run = {.n = n, .train = 1, .seed = 1, .minibatch = 0};
    const float *y = model_forward(m, ctx, w, NULL, x->data, &run);
    const RefTensor *yr = get(c->name, "y");
    assert_int_equal(shape_numel(yr->shape), (size_t)n * shape_numel(model_layer_out_shape(m, nl - 1)));
    size_t bad = tu_compare(c->name, y, yr->data, shape_numel(yr->shape), 1e-4, 1e-5);
    const RefTensor *dy = get(c->name, "dy");
    float *dx = pd_alloc_f32(shape_numel(x->shape));
    model_backward(m, ctx, w, dy->data, dx, dw);
    if (c->no_dx) {
        for (size_t i = 0; i < shape_numel(x->shape); i++) bad += dx[i] != 0.0f;
    } else {
        bad += tu_compare("dx", dx, get(c->name, "dx")->data, shape_numel(x->shape), 1e-4, 1e-5);
    }
    for (int k = 0; k < npt; k++) {
        char what[32];
        snprintf(what, sizeof what, "dw.%d", k);
        const RefTensor *t = get(c->name, what);
        bad += tu_compare(pt[k].name, dw + pt[k].offset, t->data, shape_numel(t->shape), 1e-4, 1e-5);
    }
    if (bad) fail_msg("case %s: %zu mismatches", c->name, bad);
    nnctx_free(ctx);
    pd_free(w);
    pd_free(dw);
    pd_free(dx);
    model_free(m);
}

static void test_layers_vs_pytorch(void **st) {
    (void)st;
    for (int i = 0; i < N_CASES; i++) run_case(&CASES[i]);
}

/* ---- fast kernels against the naive twins -------------------------------------------------- */
static void fill(float *a, size_t n, Rng *r, float scale) {
    for (size_t i = 0; i < n; i++) a[i] = (rng_uniform(r) * 2.0f - 1.0f) * scale;
}

static void test_kernels_vs_ref(void **st) {
    (void)st;
    Rng r;
    rng_init(&r, 42, 0, 0);
    size_t bad = 0;
    /* expf_vec */
    for (int i = 0; i < 20000; i++) {
        float x = -87.0f + 175.0f * (float)i / 20000.0f, a = kern_expf_vec(x), b = expf(x);
        if (fabsf(a - b) > 3e-7f * b) {
            if (bad++ < 5) print_message("expf_vec(%g) = %.9g, expf %.9g\n", (double)x, (double)a, (double)b);
        }
    }
    /* attention: several shapes, causal and not, every algorithm, n < n_max */
    const int shapes[][4] = {{2, 5, 2, 4}, {3, 17, 4, 8}, {1, 64, 4, 32}, {2, 9, 1, 16}};
    for (int algo = KTF_LOOPS; algo < KTF_ALGO_COUNT; algo++)
        for (int s = 0; s < 4; s++)
            for (int causal = 0; causal < 2; causal++) {
                int n = shapes[s][0], t = shapes[s][1], h = shapes[s][2], hd = shapes[s][3], d = h * hd;
                size_t nq = (size_t)n * t * 3 * d, ny = (size_t)n * t * d, np = (size_t)n * h * t * t;
                float *qkv = pd_alloc_f32(nq), *y1 = pd_alloc_f32(ny), *y2 = pd_alloc_f32(ny), *p1 = pd_alloc_f32(np),
                      *p2 = pd_alloc_f32(np), *dy = pd_alloc_f32(ny), *g1 = pd_alloc_f32(nq), *g2 = pd_alloc_f32(nq),
                      *sc = pd_alloc_f32((size_t)t * t);
                fill(qkv, nq, &r, 2.0f);
                fill(dy, ny, &r, 1.0f);
                fill(g1, nq, &r, 1.0f);   // garbage that both must overwrite
                memcpy(g2, g1, nq * sizeof(float));
                KAttn ka;
                Err err = {0};
                if (kern_attention_init(&ka, algo, n + 1, t, h, hd, causal, &err)) fail_msg("%s", err.msg);
                for (int rep = 0; rep < 2; rep++) {   // twice: the second call reuses what the first made
                    kern_attention_fwd(&ka, n, qkv, y1, p1);
                    kern_attention_fwd_ref(qkv, y2, p2, n, t, h, hd, causal);
                    bad += tu_compare("attention y", y1, y2, ny, 1e-4, 1e-5);
                    bad += tu_compare("attention p", p1, p2, np, 1e-4, 1e-6);
                }
                kern_attention_bwd(&ka, n, qkv, p1, dy, g1);
                kern_attention_bwd_ref(qkv, p2, dy, g2, sc, n, t, h, hd, causal);
                bad += tu_compare("attention dqkv", g1, g2, nq, 1e-3, 1e-5);
                if (bad) fail_msg("attention algo %d shape %d causal %d: %zu mismatches", algo, s, causal, bad);
                kern_attention_release(&ka);
                pd_free(qkv), pd_free(y1), pd_free(y2), pd_free(p1), pd_free(p2), pd_free(dy), pd_free(g1);
                pd_free(g2), pd_free(sc);
            }
    /* layer norm (every algorithm, fewer rows than built), gelu, embed */
    {
        int rows = 37, d = 128;
        size_t c = (size_t)rows * d;
        float *x = pd_alloc_f32(c), *g = pd_alloc_f32(d), *b = pd_alloc_f32(d), *y1 = pd_alloc_f32(c),
              *y2 = pd_alloc_f32(c), *s1 = pd_alloc_f32(2 * rows), *s2 = pd_alloc_f32(2 * rows), *dy = pd_alloc_f32(c),
              *dx1 = pd_alloc_f32(c), *dx2 = pd_alloc_f32(c), *dg1 = pd_alloc_f32(d), *dg2 = pd_alloc_f32(d),
              *db1 = pd_alloc_f32(d), *db2 = pd_alloc_f32(d);
        fill(x, c, &r, 3.0f);
        for (size_t i = 0; i < c; i++) x[i] += 1.5f;
        fill(g, d, &r, 1.0f);
        fill(b, d, &r, 1.0f);
        fill(dy, c, &r, 1.0f);
        kern_layernorm_fwd_ref(x, g, b, y2, s2, rows, d, 1e-5f);
        kern_layernorm_bwd_ref(x, g, s2, dy, dx2, dg2, db2, rows, d, 1e-5f);
        for (int algo = KTF_LOOPS; algo < KTF_ALGO_COUNT; algo++)
            for (int nr = rows; nr >= rows - 5; nr -= 5) {   // built rows, then fewer
                KLayerNorm kl;
                Err err = {0};
                if (kern_layernorm_init(&kl, algo, rows, d, 1e-5f, &err)) fail_msg("%s", err.msg);
                memset(dx1, 0, c * sizeof(float));
                memset(dg1, 0, d * sizeof(float));
                memset(db1, 0, d * sizeof(float));
                kern_layernorm_fwd(&kl, nr, x, g, b, y1, s1);
                bad += tu_compare("layernorm y", y1, y2, (size_t)nr * d, 1e-4, 1e-5);
                bad += tu_compare("layernorm mean", s1, s2, (size_t)nr, 1e-5, 1e-6);
                bad += tu_compare("layernorm var", s1 + nr, s2 + rows, (size_t)nr, 1e-4, 1e-6);
                if (nr == rows) {   // backward over all rows: the parameter gradients sum them
                    kern_layernorm_bwd(&kl, nr, x, g, s1, dy, dx1, dg1, db1);
                    bad += tu_compare("layernorm dx", dx1, dx2, c, 1e-4, 1e-5);
                    bad += tu_compare("layernorm dg", dg1, dg2, d, 1e-4, 1e-5);
                    bad += tu_compare("layernorm db", db1, db2, d, 1e-4, 1e-5);
                }
                kern_layernorm_fwd(&kl, nr, x, g, b, y1, NULL);   // eval: no saved state
                bad += tu_compare("layernorm eval y", y1, y2, (size_t)nr * d, 1e-4, 1e-5);
                if (bad) fail_msg("layernorm algo %d rows %d: %zu mismatches", algo, nr, bad);
                kern_layernorm_release(&kl);
            }
        for (int ta = 0; ta < 2; ta++) {
            fill(x, c, &r, 6.0f);
            memset(dx1, 0, c * sizeof(float));
            memset(dx2, 0, c * sizeof(float));
            kern_gelu_fwd(x, y1, c, ta);
            kern_gelu_fwd_ref(x, y2, c, ta);
            bad += tu_compare("gelu y", y1, y2, c, 1e-5, 1e-6);
            kern_gelu_bwd(x, dy, dx1, c, ta, 0);
            kern_gelu_bwd_ref(x, dy, dx2, c, ta);
            bad += tu_compare("gelu dx", dx1, dx2, c, 1e-5, 1e-6);
            for (size_t i = 0; i < c; i++) dx2[i] = 1e30f;   /* set: written over, as onto zeros */
            kern_gelu_bwd(x, dy, dx2, c, ta, KSET_DX);
            bad += tu_compare("gelu dx (set)", dx2, dx1, c, 0, 0);
        }
        /* embed: 37 rows as (n 1, t 37) over a vocabulary of 5 (repeated ids accumulate) */
        float tok[37], w[5 * 128], pos[37 * 128];
        for (int i = 0; i < 37; i++) tok[i] = (float)(i * 7 % 5);
        fill(w, 5 * 128, &r, 1.0f);
        fill(pos, 37 * 128, &r, 1.0f);
        kern_embed_fwd(tok, w, pos, y1, 1, 37, 128, 5);
        kern_embed_fwd_ref(tok, w, pos, y2, 1, 37, 128, 5);
        bad += tu_compare("embed y", y1, y2, c, 0, 0);
        float dw1[5 * 128] = {0}, dw2[5 * 128] = {0};
        memset(dx1, 0, c * sizeof(float));
        memset(dx2, 0, c * sizeof(float));
        kern_embed_bwd(tok, dy, dw1, dx1, 1, 37, 128, 5);
        kern_embed_bwd_ref(tok, dy, dw2, dx2, 1, 37, 128, 5);
        bad += tu_compare("embed dw", dw1, dw2, 5 * 128, 1e-6, 1e-6);
        bad += tu_compare("embed dpos", dx1, dx2, c, 0, 0);
        pd_free(x), pd_free(g), pd_free(b), pd_free(y1), pd_free(y2), pd_free(s1), pd_free(s2), pd_free(dy);
        pd_free(dx1), pd_free(dx2), pd_free(dg1), pd_free(dg2), pd_free(db1), pd_free(db2);
    }
    if (bad) fail_msg("%zu mismatches between fast and reference kernels", bad);
}

/* ---- the language models against PyTorch ---------------------------------------------------- */
static Model *load(const char *name) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s.json", name);
    Err err = {0};
    Model *m = model_load(tu_src(rel), &err);
    if (!m) fail_msg("%s", err.msg);
    return m;
}

/* tools/torch_models.py hash_values (the twin in test_nn_models.c) */
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

static void check_lm(const char *name) {
    char file[64];
    snprintf(file, sizeof file, "nn_model_%s.bin", name);
    RefFile rf;
    tu_ref_load(&rf, file);
    Model *m = load(name);
    Err err = {0};
    const RefTensor *x = tu_ref_get(&rf, "x"), *tg = tu_ref_get(&rf, "targets");
    int n = x->shape.d[0], t = x->shape.d[1], classes;
    assert_int_equal(model_loss_positions(m, &classes), t);
    assert_int_equal(classes, 256);
    OptConfig oc = optim_defaults(OPT_ADAM, tu_ref_get(&rf, "steps.lr")->data[0]);
    Trainer tr;
    assert_int_equal(trainer_init(&tr, m, n, &oc, 1, &err), PD_OK);
    assert_int_equal(tr.positions, t);
    hash_fill(m, tr.w);
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)n * t);
    for (int i = 0; i < n * t; i++) lab[i] = (int32_t)tg->data[i];
    /* forward, loss and gradients of one minibatch, no update */
    NnRun run = {.n = n, .train = 1, .seed = 1, .minibatch = 0};
    const float *logits = model_forward(m, tr.ctx, tr.w, tr.state, x->data, &run);
    size_t bad = tu_compare("logits", logits, tu_ref_get(&rf, "logits")->data, (size_t)n * t * 256, 1e-4, 1e-5);
    memset(tr.dlogits, 0, sizeof(float) * (size_t)n * t * 256);
    float loss = kern_xent_fwd_bwd(logits, lab, tr.dlogits, n * t, 256, 1.0f, NULL);
    bad += tu_compare("loss", &loss, tu_ref_get(&rf, "loss")->data, 1, 1e-5, 1e-6);
    memset(tr.dw, 0, tr.n_params * sizeof(float));
    model_backward(m, tr.ctx, tr.w, tr.dlogits, NULL, tr.dw);
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
        double mx = 0;
        for (size_t i = 0; i < cnt; i++) {
            got[i] = tr.dw[pt[k].offset + i * stride];
            mx = fmax(mx, fabs(gr->data[i]));
        }
        bad += tu_compare(pt[k].name, got, gr->data, cnt, 1e-3, 1e-4 * mx + 1e-7);
        free(got);
    }
    /* Adam steps through the trainer from the same weights */
    const RefTensor *sx = tu_ref_get(&rf, "steps.x"), *stg = tu_ref_get(&rf, "steps.targets"),
                    *sloss = tu_ref_get(&rf, "steps.loss"), *srtol = tu_ref_get(&rf, "steps.rtol");
    hash_fill(m, tr.w);
    int steps = sx->shape.d[0];
    size_t per = (size_t)n * t;
    for (int s = 0; s < steps; s++) {
        for (size_t i = 0; i < per; i++) lab[i] = (int32_t)stg->data[s * per + i];
        loss = trainer_step(&tr, sx->data + s * per, lab, n, (uint64_t)s, NULL);
        char what[64];
        snprintf(what, sizeof what, "%s step %d loss", name, s);
        bad += tu_compare(what, &loss, sloss->data + s, 1, srtol->data[s], 1e-6);
    }
    if (bad) fail_msg("%s: %zu mismatches against PyTorch", name, bad);
    free(lab);
    trainer_release(&tr);
    model_free(m);
    tu_ref_free(&rf);
}

static void test_gpt_mini_vs_pytorch(void **st) { (void)st; check_lm("gpt-mini"); }
static void test_lstm_lm_vs_pytorch(void **st) { (void)st; check_lm("lstm-lm"); }

/* ---- stages cut between blocks; determinism ---------------------------------------------------- */
/* Runs the whole model and the chain of stages [cuts[i], cuts[i+1]) on the same data; outputs,
 * input-less gradients must agree exactly. */
static void check_stages(const char *name, const int *cuts, int nc) {
    Model *m = load(name);
    Err err = {0};
    int nl = model_n_layers(m), n = 3, t = model_input_shape(m).d[0], classes;
    int pos = model_loss_positions(m, &classes);
    for (int i = 0; i + 1 < nc; i++) assert_int_equal(model_build(m, cuts[i], cuts[i + 1], n, &err), PD_OK);
    size_t np = model_param_count(m, 0, nl), nout = (size_t)n * pos * classes;
    float *w = pd_alloc_f32(np), *dw1 = pd_alloc_f32(np), *dw2 = pd_alloc_f32(np), *x = pd_alloc_f32((size_t)n * t),
          *dy = pd_alloc_f32(nout);
    model_init_params(m, 0, nl, 9, w);
    Rng r;
    rng_init(&r, 5, 0, 0);
    for (int i = 0; i < n * t; i++) x[i] = (float)rng_below(&r, 256);
    for (size_t i = 0; i < nout; i++) dy[i] = (rng_uniform(&r) - 0.5f) * 1e-2f;
    NnRun run = {.n = n, .train = 1, .seed = 3, .minibatch = 11};
    NnCtx *full = nnctx_new(m, 0, nl, n);
    const float *yf = model_forward(m, full, w, NULL, x, &run);
    model_backward(m, full, w, dy, NULL, dw1);
    NnCtx *c[8];
    const float *in = x;
    for (int i = 0; i + 1 < nc; i++) {
        c[i] = nnctx_new(m, cuts[i], cuts[i + 1], n);
        if (i > 0) {   // "receive" into the stage's input buffer
            memcpy(nnctx_input(c[i]), in, (size_t)n * shape_numel(model_layer_in_shape(m, cuts[i])) * sizeof(float));
            in = nnctx_input(c[i]);
        }
        in = model_forward(m, c[i], w + model_param_offset(m, cuts[i]), NULL, in, &run);
    }
    size_t bad = tu_compare("staged output", in, yf, nout, 0, 0);
    float *g = NULL;
    const float *gin = dy;
    for (int i = nc - 2; i >= 0; i--) {
        float *gx = NULL;
        if (i > 0) gx = pd_alloc_f32((size_t)n * shape_numel(model_layer_in_shape(m, cuts[i])));
        model_backward(m, c[i], w + model_param_offset(m, cuts[i]), gin, gx, dw2 + model_param_offset(m, cuts[i]));
        pd_free(g);
        g = gx;
        gin = gx;
    }
    pd_free(g);
    bad += tu_compare("staged dw", dw2, dw1, np, 0, 0);
    if (bad) fail_msg("%s: stages differ from the whole model", name);
    for (int i = 0; i + 1 < nc; i++) nnctx_free(c[i]);
    nnctx_free(full);
    pd_free(w), pd_free(dw1), pd_free(dw2), pd_free(x), pd_free(dy);
    model_free(m);
}

static void test_stages_between_blocks(void **st) {
    (void)st;
    const int a[] = {0, 1, 3, 5, 7}, b[] = {0, 2, 4, 6, 7}, c[] = {0, 1, 2, 3, 4};
    check_stages("gpt-mini", a, 5);
    check_stages("gpt-mini", b, 5);
    check_stages("lstm-lm", c, 5);
}

/* Same seed, same data: the same bits, twice; and a different seed differs. */
static float train_some(Model *m, uint64_t seed, float *w_out, size_t np) {
    Err err = {0};
    OptConfig oc = optim_defaults(OPT_ADAM, 1e-3f);
    Trainer tr;
    assert_int_equal(trainer_init(&tr, m, 4, &oc, seed, &err), PD_OK);
    float x[4 * 64];
    int32_t y[4 * 64];
    float loss = 0;
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < 4 * 64; i++) {
            x[i] = (float)((i * 31 + s * 7) % 256);
            y[i] = (i * 31 + s * 7 + 1) % 256;
        }
        loss = trainer_step(&tr, x, y, 4, (uint64_t)s, NULL);
    }
    memcpy(w_out, tr.w, np * sizeof(float));
    trainer_release(&tr);
    return loss;
}

static void test_determinism(void **st) {
    (void)st;
    Model *m = load("gpt-mini");
    size_t np = model_param_count(m, 0, model_n_layers(m));
    float *a = pd_alloc_f32(np), *b = pd_alloc_f32(np), *c = pd_alloc_f32(np);
    float la = train_some(m, 7, a, np), lb = train_some(m, 7, b, np), lc = train_some(m, 8, c, np);
    assert_true(la == lb);
    assert_int_equal(memcmp(a, b, np * sizeof(float)), 0);
    assert_true(la != lc);
    pd_free(a), pd_free(b), pd_free(c);
    model_free(m);
}

/* ---- model JSON, counts ----------------------------------------------------------------------- */
static void expect_error(const char *json, const char *want) {
    Err err = {0};
    Model *m = model_parse(json, "t.json", &err);
    if (m) fail_msg("accepted: %s", json);
    assert_int_equal(err.code, PD_EINVAL);
    if (!strstr(err.msg, want)) fail_msg("message \"%s\" lacks \"%s\"", err.msg, want);
}

static void test_json_errors(void **st) {
    (void)st;
    expect_error(M("[4, 8]", "{\"type\": \"attention\", \"dim\": 8, \"heads\": 3}"),
                 "layer 0 (attention): key \"heads\": 3 does not divide dim 8");
    expect_error(M("[4, 8]", "{\"type\": \"attention\", \"dim\": 6, \"heads\": 2}"),
                 "key \"dim\": 6, but the incoming shape (4, 8) is not (T, 6)");
    expect_error(M("[4, 8]", LN(6)), "layer 0 (layernorm): key \"features\": 6, but the incoming shape is (4, 8)");
    expect_error(M("[4, 8]", "{\"type\": \"gelu\", \"approximate\": \"sigmoid\"}"), "key \"approximate\"");
    expect_error(M("[4]", "{\"type\": \"embed\", \"vocab\": 10, \"dim\": 8, \"positions\": 5}"),
                 "key \"positions\": 5, but the incoming sequence has 4 tokens");
    expect_error(M("[4, 8]", "{\"type\": \"embed\", \"vocab\": 10, \"dim\": 8}"), "not a sequence of token ids");
    expect_error(M("[4, 8]", "{\"type\": \"dense\", \"in\": 7, \"out\": 3}"), "layer 0 (dense): key \"in\": 7");
    expect_error(M("[4, 8]", "{\"type\": \"block\", \"steps\": [[{\"type\": \"dense\", \"in\": 8, \"out\": 3}]]}"),
                 "layer 0 (block): steps[0]: output (4, 3) differs from the block's input (4, 8)");
    expect_error(M("[4, 8]", "{\"type\": \"block\", \"steps\": [[" LN(8) "], []]}"),
                 "layer 0 (block): steps[1]: expected a non-empty array of layers");
    expect_error(M("[4, 8]", "{\"type\": \"block\", \"steps\": [[{\"type\": \"gelu\", \"aproximate\": \"tanh\"}]]}"),
                 "layer 0 (block): steps[0][0] (gelu): unknown key \"aproximate\"");
    expect_error(M("[4, 8]", "{\"type\": \"block\"}"), "missing required key \"steps\"");
}

static void test_counts_and_names(void **st) {
    (void)st;
    Model *m = load("gpt-mini");
    int nl = model_n_layers(m);
    assert_int_equal(nl, 7);
    /* embed 256*128 + 64*128; per block 2*256 (ln) + 384*128+384 + 128*128+128 + 512*128+512 +
     * 128*512+128; final ln 256; head 128*256+256 */
    size_t blk = 2 * 256 + 384 * 128 + 384 + 128 * 128 + 128 + 512 * 128 + 512 + 128 * 512 + 128;
    assert_int_equal(model_param_count(m, 0, nl), 256 * 128 + 64 * 128 + 4 * blk + 256 + 128 * 256 + 256);
    int npt;
    const ParamInfo *pt = model_param_tensors(m, &npt);
    assert_int_equal(npt, 2 + 4 * 12 + 2 + 2);
    assert_string_equal(pt[0].name, "layers.0.weight");
    assert_string_equal(pt[1].name, "layers.0.pos_weight");
    assert_string_equal(pt[4].name, "layers.1.steps.0.1.qkv.weight");
    assert_string_equal(pt[13].name, "layers.1.steps.1.3.bias");
    for (int i = 1; i <= 4; i++) assert_string_equal(model_layer_type(m, i), "block");
    assert_int_equal(model_input_vocab(m), 256);
    Shape o = model_layer_out_shape(m, nl - 1);
    assert_int_equal(o.ndim, 2);
    assert_int_equal(o.d[0], 64);
    assert_int_equal(o.d[1], 256);
    /* forward FLOPs per sample: 64 tokens * 2 * (per-token matmul weights) + attention 4 T^2 d */
    double want = 4 * (2.0 * 64 * (4.0 * 128 * 128 + 2 * 128 * 512) + 4.0 * 64 * 64 * 128) + 2.0 * 64 * 128 * 256;
    if (fabs(model_flops(m) - want) > 1e-6 * want) fail_msg("flops %g, want %g", model_flops(m), want);
    model_free(m);
    m = load("lenet5");
    assert_int_equal(model_input_vocab(m), 0);
    model_free(m);
    m = load("lstm-lm");
    assert_int_equal(model_param_count(m, 0, model_n_layers(m)),
                     256 * 256 + 2 * (4 * 256 * 512 + 8 * 256) + 256 * 256 + 256);
    model_free(m);
}

static int setup(void **st) {
    (void)st;
    tu_ref_load(&REF, "nn_transformer.bin");
    return 0;
}
static int teardown(void **st) {
    (void)st;
    tu_ref_free(&REF);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layers_vs_pytorch),   cmocka_unit_test(test_kernels_vs_ref),
        cmocka_unit_test(test_gpt_mini_vs_pytorch), cmocka_unit_test(test_lstm_lm_vs_pytorch),
        cmocka_unit_test(test_stages_between_blocks), cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_json_errors),         cmocka_unit_test(test_counts_and_names),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
