/* test_nn_split.c: the split backward of the zero-bubble kinds (model_backward_b, then
 * model_backward_w) leaves dx and dw BITWISE as model_backward does, for every layer kind that
 * splits (linear with and without fused relu and bias, dense, conv2d on both of its algorithms
 * (im2col: one input channel or 1x1; oneDNN: the rest), embed, layernorm) and around kinds
 * that do not (batchnorm, lstm, attention, block, residual, dropout, pool): whole ranges with
 * and without an input gradient, and ranges starting inside the model. Also: the data pass
 * leaves the weight gradient of splitting layers alone (it is all in the weight pass), the
 * weight pass changes it, and the weight pass calls its hook once per layer, descending. And
 * a discarded gradient buffer (model_grads_discard) is written, not added to, by the next
 * backward, whole or split, and zeroed by model_grads_settle. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "nn.h"

enum { N = 3 };

typedef struct Net {
    const char *name;
    const char *json;
    int vocab;   /* > 0: token-id inputs in [0, vocab) */
} Net;

static const Net NETS[] = {
    {"mlp", "{\"name\": \"mlp\", \"input\": [1, 6, 6], \"layers\": ["
            "{\"type\": \"flatten\"},"
            "{\"type\": \"linear\", \"in\": 36, \"out\": 20, \"relu\": true},"
            "{\"type\": \"linear\", \"in\": 20, \"out\": 16, \"bias\": false},"
            "{\"type\": \"dropout\", \"p\": 0.25},"
            "{\"type\": \"linear\", \"in\": 16, \"out\": 12, \"bias\": false, \"relu\": true},"
            "{\"type\": \"linear\", \"in\": 12, \"out\": 5}]}", 0},
    {"cnn", "{\"name\": \"cnn\", \"input\": [1, 10, 10], \"layers\": ["
            "{\"type\": \"conv2d\", \"in\": 1, \"out\": 4, \"kernel\": 3, \"pad\": 1, \"relu\": true},"
            "{\"type\": \"conv2d\", \"in\": 4, \"out\": 6, \"kernel\": 3, \"pad\": 1},"
            "{\"type\": \"maxpool\", \"kernel\": 2},"
            "{\"type\": \"conv2d\", \"in\": 6, \"out\": 6, \"kernel\": 3, \"stride\": 2, \"bias\": false, \"relu\": true},"
            "{\"type\": \"batchnorm\", \"features\": 6, \"relu\": true},"
            "{\"type\": \"conv2d\", \"in\": 6, \"out\": 8, \"kernel\": 1, \"relu\": true},"
            "{\"type\": \"pad\", \"pad\": 1},"
            "{\"type\": \"gap\"},"
            "{\"type\": \"linear\", \"in\": 8, \"out\": 4}]}", 0},
    {"resnet", "{\"name\": \"res\", \"input\": [3, 8, 8], \"layers\": ["
               "{\"type\": \"conv2d\", \"in\": 3, \"out\": 4, \"kernel\": 3, \"pad\": 1, \"relu\": true},"
               "{\"type\": \"residual\", \"body\": ["
               "{\"type\": \"conv2d\", \"in\": 4, \"out\": 4, \"kernel\": 3, \"pad\": 1, \"bias\": false},"
               "{\"type\": \"batchnorm\", \"features\": 4, \"relu\": true},"
               "{\"type\": \"conv2d\", \"in\": 4, \"out\": 4, \"kernel\": 3, \"pad\": 1, \"bias\": false}]},"
               "{\"type\": \"flatten\"},"
               "{\"type\": \"linear\", \"in\": 256, \"out\": 3}]}", 0},
    {"gpt", "{\"name\": \"gpt\", \"input\": [6], \"layers\": ["
            "{\"type\": \"embed\", \"vocab\": 11, \"dim\": 8, \"positions\": 6},"
            "{\"type\": \"layernorm\", \"features\": 8},"
            "{\"type\": \"dense\", \"in\": 8, \"out\": 12},"
            "{\"type\": \"gelu\"},"
            "{\"type\": \"dense\", \"in\": 12, \"out\": 8, \"bias\": false},"
            "{\"type\": \"block\", \"steps\": [[{\"type\": \"layernorm\", \"features\": 8},"
            " {\"type\": \"attention\", \"dim\": 8, \"heads\": 2, \"causal\": true}],"
            " [{\"type\": \"dense\", \"in\": 8, \"out\": 8}]]},"
            "{\"type\": \"attention\", \"dim\": 8, \"heads\": 2},"
            "{\"type\": \"layernorm\", \"features\": 8},"
            "{\"type\": \"dense\", \"in\": 8, \"out\": 11}]}", 11},
    {"lstm", "{\"name\": \"lstm\", \"input\": [5, 4], \"layers\": ["
             "{\"type\": \"dense\", \"in\": 4, \"out\": 6},"
             "{\"type\": \"lstm\", \"in\": 6, \"hidden\": 7},"
             "{\"type\": \"last_step\"},"
             "{\"type\": \"linear\", \"in\": 7, \"out\": 3}]}", 0},
};
enum { N_NETS = sizeof NETS / sizeof NETS[0] };

static void fill(Rng *r, float *x, size_t n, int vocab) {
    for (size_t i = 0; i < n; i++)
        x[i] = vocab ? (float)(int)(rng_uniform(r) * (float)vocab) : 2.0f * rng_uniform(r) - 1.0f;
}

typedef struct Seen {
    int n, last;
    int order_ok;
} Seen;

static void seen_layer(void *arg, int i) {
    Seen *s = arg;
    if (s->n && i != s->last - 1) s->order_ok = 0;
    s->last = i;
    s->n++;
}

/* One range [first, last) of net: backward whole against BI + BW, bitwise. */
static void check_range(const Net *net, Model *m, int first, int last, int want_dx) {
    char what[160];
    snprintf(what, sizeof what, "%s [%d, %d)%s", net->name, first, last, want_dx ? "" : " without dx");
    Err err = {0};
    if (model_build(m, first, last, N, &err)) fail_msg("%s: %s", what, err.msg);
    size_t np = model_param_count(m, first, last), ns = model_state_count(m, first, last);
    Shape in = model_layer_in_shape(m, first), out = model_layer_out_shape(m, last - 1);
    size_t nin = (size_t)N * shape_numel(in), nout = (size_t)N * shape_numel(out);
    float *w = pd_alloc_f32(np + 1), *state = pd_alloc_f32(ns + 1), *x = pd_alloc_f32(nin), *dy = pd_alloc_f32(nout);
    float *dw0 = pd_alloc_f32(np + 1), *dwa = pd_alloc_f32(np + 1), *dwb = pd_alloc_f32(np + 1);
    float *dx0 = pd_alloc_f32(nin), *dxa = pd_alloc_f32(nin), *dxb = pd_alloc_f32(nin);
    size_t nk = model_split_floats(m, first, last, N);
    float *keep = pd_alloc_f32(nk + 1);
    Rng r;
    rng_init(&r, 17, 3, (uint64_t)first * 100 + (uint64_t)last);
    model_init_params(m, first, last, 9, w);
    model_init_state(m, first, last, state);
    fill(&r, x, nin, first == 0 ? net->vocab : 0);
    fill(&r, dy, nout, 0);
    fill(&r, dw0, np, 0);   /* backward accumulates: start from something */
    fill(&r, dx0, nin, 0);
    NnCtx *c = nnctx_new(m, first, last, N);
    NnRun run = {.n = N, .train = 1, .seed = 4, .minibatch = 2};
    model_forward(m, c, w, state, x, &run);

    memcpy(dwa, dw0, np * sizeof(float));
    memcpy(dxa, dx0, nin * sizeof(float));
    model_backward(m, c, w, dy, want_dx ? dxa : NULL, dwa);

    memcpy(dwb, dw0, np * sizeof(float));
    memcpy(dxb, dx0, nin * sizeof(float));
    model_backward_b(m, c, w, dy, want_dx ? dxb : NULL, dwb, keep);
    if (memcmp(dxa, dxb, nin * sizeof(float))) {
        tu_compare(what, dxb, dxa, nin, 0, 0);
        fail_msg("%s: the input gradient of BI differs from backward's", what);
    }
    /* the splitting layers' weight gradients are untouched by BI */
    int n_pt = 0, split_params = 0;
    const ParamInfo *pt = model_param_tensors(m, &n_pt);
    size_t base = model_param_offset(m, first);
    for (int k = 0; k < n_pt; k++) {
        if (pt[k].layer < first || pt[k].layer >= last) continue;
        const char *t = model_layer_type(m, pt[k].layer);
        int splits = !strcmp(t, "linear") || !strcmp(t, "dense") || !strcmp(t, "conv2d") || !strcmp(t, "embed") ||
                     !strcmp(t, "layernorm");
        size_t off = pt[k].offset - base, n = shape_numel(pt[k].shape);
        if (splits) {
            split_params = 1;
            if (memcmp(dwb + off, dw0 + off, n * sizeof(float)))
                fail_msg("%s: BI changed %s, the weight pass's", what, pt[k].name);
        } else if (!memcmp(dwb + off, dw0 + off, n * sizeof(float))) {
            fail_msg("%s: BI left %s (a layer that does not split) alone", what, pt[k].name);
        }
    }
    Seen s = {0, 0, 1};
    model_backward_w(m, c, w, dy, keep, dwb, seen_layer, &s);
    if (s.n != last - first || s.last != first || !s.order_ok)
        fail_msg("%s: the weight pass's hook ran %d times, last for layer %d (want %d, %d, descending)", what, s.n,
                 s.last, last - first, first);
    if (memcmp(dwa, dwb, np * sizeof(float))) {
        tu_compare(what, dwb, dwa, np, 0, 0);
        fail_msg("%s: the weight gradient of BI + BW differs from backward's", what);
    }
    if (split_params && !memcmp(dwb, dw0, np * sizeof(float))) fail_msg("%s: no gradient at all", what);

    /* model_grads_discard: the next backward writes the gradient over what was there (here
     * values no gradient has), whole or split, the numbers of a backward onto zeros; the one
     * after adds again; model_grads_settle zeroes what no backward wrote. */
    float *dwz = pd_alloc_f32(np + 1), *dwg = pd_alloc_f32(np + 1);
    model_backward(m, c, w, dy, NULL, dwz);   /* onto zeros */
    for (int split = 0; split < 2; split++) {
        for (size_t k = 0; k < np; k++) dwg[k] = 1e30f;
        model_grads_discard(m, first, last);
        if (split) {
            model_backward_b(m, c, w, dy, NULL, dwg, keep);
            model_backward_w(m, c, w, dy, keep, dwg, NULL, NULL);
        } else {
            model_backward(m, c, w, dy, NULL, dwg);
        }
        if (tu_compare(what, dwg, dwz, np, 0, 0)) fail_msg("%s: a discarded gradient was added to (split %d)", what, split);
    }
    memcpy(dwa, dwz, np * sizeof(float));
    model_backward(m, c, w, dy, NULL, dwa);   /* twice onto zeros */
    model_backward(m, c, w, dy, NULL, dwg);   /* after the written one: adds */
    if (tu_compare(what, dwg, dwa, np, 0, 0)) fail_msg("%s: the backward after a discard did not add", what);
    for (size_t k = 0; k < np; k++) dwg[k] = 1e30f;
    model_grads_discard(m, first, last);
    model_grads_settle(m, first, last, dwg);
    for (size_t k = 0; k < np; k++)
        if (dwg[k] != 0.0f) fail_msg("%s: settle left parameter %zu's gradient at %g", what, k, (double)dwg[k]);
    model_backward(m, c, w, dy, NULL, dwg);   /* settled: adds onto the zeros */
    if (tu_compare(what, dwg, dwz, np, 0, 0)) fail_msg("%s: the backward after settle did not add", what);
    pd_free(dwz), pd_free(dwg);
    print_message("%s: %zu parameters, %zu floats kept from BI to BW: bitwise equal\n", what, np, nk);
    nnctx_free(c);
    pd_free(w), pd_free(state), pd_free(x), pd_free(dy), pd_free(dw0), pd_free(dwa), pd_free(dwb);
    pd_free(dx0), pd_free(dxa), pd_free(dxb), pd_free(keep);
}

static void test_split_equals_whole(void **st) {
    (void)st;
    for (int k = 0; k < N_NETS; k++) {
        Err err = {0};
        Model *m = model_parse(NETS[k].json, NETS[k].name, &err);
        if (!m) fail_msg("%s", err.msg);
        int n = model_n_layers(m);
        check_range(&NETS[k], m, 0, n, 0);
        check_range(&NETS[k], m, 0, n, 1);
        check_range(&NETS[k], m, 1, n, 1);
        check_range(&NETS[k], m, 0, n - 1, 1);
        check_range(&NETS[k], m, n - 1, n, 1);
        model_free(m);
    }
}

/* The keep buffer holds, per splitting layer below the range's last, N x its output. */
static void test_split_floats(void **st) {
    (void)st;
    Err err = {0};
    Model *m = model_parse(NETS[0].json, "mlp", &err);   /* flatten, linear x2, dropout, linear x2 */
    if (!m) fail_msg("%s", err.msg);
    assert_int_equal(model_split_floats(m, 0, 6, 4), 0 + 80 + 64 + 0 + 48);   /* 4x20, 4x16, (dropout), 4x12 */
    assert_int_equal(model_split_floats(m, 0, 1, 4), 0);
    assert_int_equal(model_split_floats(m, 2, 5, 1), 16);   /* 16 floats: one 64-byte line */
    assert_int_equal(model_split_floats(m, 2, 5, 2), 32);
    assert_int_equal(model_split_floats(m, 3, 4, 4), 0);
    model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_equals_whole),
        cmocka_unit_test(test_split_floats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
