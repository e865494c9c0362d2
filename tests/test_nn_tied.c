/* test_nn_tied.c: tied parameters ("tie" in the model JSON) on one worker.
 *  - parsing: the tie names the source tensor; an unknown name, a shape mismatch, a tie to the
 *    same or a later layer, a tie to a mirror, a second tie of one source, an "init" of the tied
 *    weight and a tie on a layer without weight are errors naming the file, layer and key;
 *  - init: the mirror holds the source's values, every other tensor the untied model's;
 *  - training: trainer_step on a tiny language model whose output head shares the token
 *    embedding (vocab 32, dim 8) equals, BITWISE over 6 SGD steps, an independent computation on
 *    the untied twin (same JSON without "tie"): forward, loss and backward of the twin, the two
 *    tensors' gradients summed by hand (embedding's first), w -= lr * g on every parameter; and
 *    the two copies stay bitwise equal after every step. */
#include "testutil.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "kernels.h"
#include "nn.h"

#define LM(tie) \
    "{\"name\": \"tied-lm\", \"input\": [6], \"layers\": [" \
    "{\"type\": \"embed\", \"vocab\": 32, \"dim\": 8, \"positions\": 6}," \
    "{\"type\": \"layernorm\", \"features\": 8}," \
    "{\"type\": \"dense\", \"in\": 8, \"out\": 32" tie "}]}"

static Model *parse_ok(const char *json) {
    Err err = {0};
    Model *m = model_parse(json, "tied.json", &err);
    if (!m) fail_msg("%s", err.msg);
    return m;
}

static void parse_fails(const char *json, const char *want) {
    Err err = {0};
    Model *m = model_parse(json, "tied.json", &err);
    if (m) fail_msg("parsed, want an error containing: %s", want);
    if (!strstr(err.msg, want)) fail_msg("error \"%s\" does not contain \"%s\"", err.msg, want);
}

static void test_parse(void **state) {
    (void)state;
    Model *m = parse_ok(LM(", \"bias\": false, \"tie\": \"layers.0.weight\""));
    int nt, np;
    const ParamTie *t = model_ties(m, &nt);
    const ParamInfo *pt = model_param_tensors(m, &np);
    assert_int_equal(nt, 1);
    assert_string_equal(pt[t[0].src].name, "layers.0.weight");
    assert_string_equal(pt[t[0].dst].name, "layers.2.weight");
    model_free(m);
    parse_fails(LM(", \"tie\": \"layers.0.weights\""), "tied.json: layer layers.2 (dense): key \"tie\": no parameter \"layers.0.weights\"");
    parse_fails(LM(", \"tie\": \"layers.0.pos_weight\""), "key \"tie\": layers.0.pos_weight is (6, 8), this layer's weight (32, 8)");
    parse_fails(LM(", \"tie\": \"layers.2.weight\""), "belongs to the same top-level layer 2");
    parse_fails(LM(", \"tie\": \"layers.0.weight\", \"init\": {\"weight\": \"zeros\"}"), "the weight is tied to layers.0.weight");
    parse_fails(LM(", \"tie\": 3"), "tie");
    parse_fails("{\"name\": \"x\", \"input\": [6], \"layers\": [{\"type\": \"embed\", \"vocab\": 8, \"dim\": 8, \"tie\": "
                "\"layers.1.weight\"}, {\"type\": \"dense\", \"in\": 8, \"out\": 8}]}",
                "a layer can only tie to a parameter of an earlier top-level layer");
    parse_fails("{\"name\": \"x\", \"input\": [6], \"layers\": [{\"type\": \"embed\", \"vocab\": 8, \"dim\": 8}, "
                "{\"type\": \"gelu\", \"tie\": \"layers.0.weight\"}]}", "this layer has no weight to tie");
    const char *three = "{\"name\": \"x\", \"input\": [6], \"layers\": [{\"type\": \"embed\", \"vocab\": 8, \"dim\": 8}, "
                        "{\"type\": \"dense\", \"in\": 8, \"out\": 8, \"tie\": \"layers.0.weight\"}, "
                        "{\"type\": \"dense\", \"in\": 8, \"out\": 8, \"tie\": \"%s\"}]}";
    char buf[512];
    snprintf(buf, sizeof buf, three, "layers.0.weight");
    parse_fails(buf, "layers.0.weight is already tied by another layer");
    snprintf(buf, sizeof buf, three, "layers.1.weight");
    parse_fails(buf, "is already tied itself");
}

/* The mirror starts as its source; the other tensors as in the untied model. */
static void test_init(void **state) {
    (void)state;
    Model *a = parse_ok(LM(", \"tie\": \"layers.0.weight\"")), *b = parse_ok(LM(""));
    size_t n = model_param_count(a, 0, 3);
    assert_int_equal(n, model_param_count(b, 0, 3));
    float *wa = pd_alloc_f32(n), *wb = pd_alloc_f32(n), *w2 = pd_alloc_f32(n);
    model_init_params(a, 0, 3, 5, wa);
    model_init_params(b, 0, 3, 5, wb);
    int np;
    const ParamInfo *pt = model_param_tensors(a, &np);
    assert_int_equal(np, 6);   /* weight, pos_weight, gamma, beta, head weight, head bias */
    size_t head = pt[4].offset, bias = head + 32 * 8;
    assert_memory_equal(wa + head, wa, 32 * 8 * sizeof(float));
    assert_memory_not_equal(wb + head, wb, 32 * 8 * sizeof(float));
    assert_memory_equal(wa, wb, head * sizeof(float));
    assert_memory_equal(wa + bias, wb + bias, 32 * sizeof(float));
    /* a range holding only the head: the same mirror values (a pure function of seed and layers) */
    model_init_params(a, 2, 3, 5, w2);
    assert_memory_equal(w2, wa + head, (n - head) * sizeof(float));
    pd_free(wa), pd_free(wb), pd_free(w2);
    model_free(a), model_free(b);
}

static void test_train_equals_independent(void **state) {
    (void)state;
    enum { N = 4, T = 6, V = 32, STEPS = 6 };
    const float lr = 0.5f;
    Model *a = parse_ok(LM(", \"bias\": false, \"tie\": \"layers.0.weight\"")), *b = parse_ok(LM(", \"bias\": false"));
    Err err = {0};
    OptConfig oc = optim_defaults(OPT_SGD, lr);
    Trainer t;
    if (trainer_init(&t, a, N, &oc, 3, &err)) fail_msg("%s", err.msg);
    size_t n = t.n_params;
    int np;
    const ParamInfo *pt = model_param_tensors(a, &np);
    size_t head = pt[np - 1].offset, tn = (size_t)V * 8;
    /* the twin: same initial values, its own buffers */
    if (model_build(b, 0, 3, N, &err)) fail_msg("%s", err.msg);
    float *w = pd_alloc_f32(n), *dw = pd_alloc_f32(n), *dl = pd_alloc_f32((size_t)N * T * V);
    memcpy(w, t.w, n * sizeof(float));
    NnCtx *c = nnctx_new(b, 0, 3, N);
    Rng r;
    rng_init(&r, 9, 0, 0);
    for (int s = 0; s < STEPS; s++) {
        float x[N * T];
        int32_t y[N * T];
        for (int i = 0; i < N * T; i++) {
            x[i] = (float)(rng_u32(&r) % V);
            y[i] = (int32_t)(rng_u32(&r) % V);
        }
        float la = trainer_step(&t, x, y, N, (uint64_t)s, NULL);
        NnRun run = {.n = N, .train = 1, .seed = 3, .minibatch = (uint64_t)s};
        const float *logits = model_forward(b, c, w, NULL, x, &run);
        memset(dl, 0, (size_t)N * T * V * sizeof(float));
        float lb = kern_xent_fwd_bwd(logits, y, dl, N * T, V, 1.0f, NULL);
        memset(dw, 0, n * sizeof(float));
        model_backward(b, c, w, dl, NULL, dw);
        for (size_t i = 0; i < tn; i++) dw[i] = dw[head + i] = dw[i] + dw[head + i];
        for (size_t i = 0; i < n; i++) w[i] -= lr * dw[i];
        assert_true(la == lb);
        assert_memory_equal(t.w, t.w + head, tn * sizeof(float));
        if (memcmp(t.w, w, n * sizeof(float))) {
            tu_compare("tied trainer vs independent", t.w, w, n, 0, 0);
            fail_msg("step %d: the tied trainer differs from the independent computation", s);
        }
    }
    nnctx_free(c);
    pd_free(w), pd_free(dw), pd_free(dl);
    trainer_release(&t);
    model_free(a), model_free(b);
}

/* models/gpt-small.json: its head ties to the token embedding; parameter count (the mirror
 * included, as in every buffer and file) and forward FLOPs as models/MODELS.md gives them. */
static void test_gpt_small(void **state) {
    (void)state;
    Err err = {0};
    Model *m = model_load(tu_src("models/gpt-small.json"), &err);
    if (!m) fail_msg("%s", err.msg);
    int nt, np, nl = model_n_layers(m);
    const ParamTie *t = model_ties(m, &nt);
    const ParamInfo *pt = model_param_tensors(m, &np);
    assert_int_equal(nl, 9);
    assert_int_equal(nt, 1);
    assert_string_equal(pt[t[0].src].name, "layers.0.weight");
    assert_string_equal(pt[t[0].dst].name, "layers.8.weight");
    assert_int_equal(model_param_count(m, 0, nl), 4902912);   /* 4,837,376 distinct + the 65,536 mirror */
    double f = model_flops(m) / 1e6;
    if (fabs(f - 1325.4) > 0.1) fail_msg("gpt-small: %.2f MFLOPs forward per sample, MODELS.md says 1325.4", f);
    model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_train_equals_independent),
        cmocka_unit_test(test_gpt_small),
    };
    return tu_run_group(tests, NULL, NULL);
}
