/* test_nn_export.c: the round trip of tools/export_torch.py: PyTorch modules exported to model
 * JSON (tests/ref/export_<case>.json) give PyTorch's forward output, loss, input gradient,
 * parameter gradients and batch-norm statistics for the same weights (tests/ref/export_<case>.bin,
 * tools/gen_ref.py export): the CNN of tests/cli/export_cnn.py (conv, batch norm, relu, max
 * pool, a residual add, dropout, linear) in eval and in training mode, a small GPT (blocks
 * grouped from PyTorch's residual steps) and an LSTM language model. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "nn.h"

static void check_case(const char *name) {
    char rel[128];
    snprintf(rel, sizeof rel, "tests/ref/export_%s.json", name);
    Err err = {0};
    Model *m = model_load(tu_src(rel), &err);
    if (!m) fail_msg("%s", err.msg);
    snprintf(rel, sizeof rel, "export_%s.bin", name);
    RefFile rf;
    tu_ref_load(&rf, rel);
    const RefTensor *x = tu_ref_get(&rf, "x"), *tg = tu_ref_get(&rf, "targets");
    int n = x->shape.d[0], nl = model_n_layers(m), classes, pos = model_loss_positions(m, &classes);
    int train = tu_ref_get(&rf, "train")->data[0] != 0.0f;
    assert_int_equal(model_build(m, 0, nl, n, &err), PD_OK);
    size_t np = model_param_count(m, 0, nl), ns = model_state_count(m, 0, nl);
    float *w = pd_alloc_f32(np + 1), *dw = pd_alloc_f32(np + 1), *state = pd_alloc_f32(ns + 1);
    float *dx = pd_alloc_f32(shape_numel(x->shape)), *dl = pd_alloc_f32((size_t)n * pos * classes);
    int npt;
    const ParamInfo *pt = model_param_tensors(m, &npt);
    for (int k = 0; k < npt; k++) {
        char what[32];
        snprintf(what, sizeof what, "w.%d", k);
        const RefTensor *t = tu_ref_get(&rf, what);
        assert_int_equal(shape_numel(t->shape), shape_numel(pt[k].shape));
        memcpy(w + pt[k].offset, t->data, shape_numel(t->shape) * sizeof(float));
    }
    if (ns) memcpy(state, tu_ref_get(&rf, "state0")->data, ns * sizeof(float));
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)n * pos);
    for (int i = 0; i < n * pos; i++) lab[i] = (int32_t)tg->data[i];
    NnCtx *ctx = nnctx_new(m, 0, nl, n);
    NnRun run = {.n = n, .train = train, .seed = 1, .minibatch = 0};
    const float *y = model_forward(m, ctx, w, ns ? state : NULL, x->data, &run);
    size_t bad = tu_compare("logits", y, tu_ref_get(&rf, "logits")->data, (size_t)n * pos * classes, 1e-4, 1e-5);
    float loss = kern_xent_fwd_bwd(y, lab, dl, n * pos, classes, 1.0f, NULL);
    bad += tu_compare("loss", &loss, tu_ref_get(&rf, "loss")->data, 1, 1e-5, 1e-6);
    model_backward(m, ctx, w, dl, dx, dw);
    if (pos == 1) bad += tu_compare("dx", dx, tu_ref_get(&rf, "dx")->data, shape_numel(x->shape), 1e-3, 1e-6);
    for (int k = 0; k < npt; k++) {
        char what[32];
        snprintf(what, sizeof what, "grad.%d", k);
        const RefTensor *t = tu_ref_get(&rf, what);
        double mx = 0;
        for (size_t i = 0; i < shape_numel(t->shape); i++) mx = fmax(mx, fabs(t->data[i]));
        /* 1e-6 floor: a conv bias before batch norm has a gradient of pure rounding noise */
        bad += tu_compare(pt[k].name, dw + pt[k].offset, t->data, shape_numel(t->shape), 1e-3, 1e-4 * mx + 1e-6);
    }
    if (ns) bad += tu_compare("bn state", state, tu_ref_get(&rf, "state")->data, ns, 1e-4, 1e-6);
    if (bad) fail_msg("export %s: %zu mismatches against PyTorch", name, bad);
    free(lab);
    nnctx_free(ctx);
    pd_free(w), pd_free(dw), pd_free(state), pd_free(dx), pd_free(dl);
    model_free(m);
    tu_ref_free(&rf);
}

static void test_cnn_eval(void **st) { (void)st; check_case("cnn_eval"); }
static void test_cnn_train(void **st) { (void)st; check_case("cnn_train"); }
static void test_gpt(void **st) { (void)st; check_case("gpt"); }
static void test_lstm_lm(void **st) { (void)st; check_case("lstm_lm"); }

/* The exported CNN keeps PyTorch's structure: the residual add is one top-level layer. */
static void test_structure(void **st) {
    (void)st;
    Err err = {0};
    Model *m = model_load(tu_src("tests/ref/export_cnn_train.json"), &err);
    if (!m) fail_msg("%s", err.msg);
    const char *want[] = {"conv2d", "batchnorm", "maxpool", "residual", "conv2d", "maxpool", "flatten",
                          "dropout", "linear", "linear"};
    assert_int_equal(model_n_layers(m), 10);
    for (int i = 0; i < 10; i++) assert_string_equal(model_layer_type(m, i), want[i]);
    model_free(m);
    m = model_load(tu_src("tests/ref/export_gpt.json"), &err);
    if (!m) fail_msg("%s", err.msg);
    assert_int_equal(model_n_layers(m), 5);   // embed, 2 blocks (2 steps each), layernorm, dense
    assert_string_equal(model_layer_type(m, 1), "block");
    assert_string_equal(model_layer_type(m, 2), "block");
    model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cnn_eval), cmocka_unit_test(test_cnn_train), cmocka_unit_test(test_gpt),
        cmocka_unit_test(test_lstm_lm),  cmocka_unit_test(test_structure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
