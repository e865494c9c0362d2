/* layer_embed.c: "embed": token embedding plus an optional learned position embedding, the
 * input layer of a language model. The input is a sequence of T token ids stored as floats
 * (exact integers in [0, vocab): the data readers write them so), shape (T); the output
 * (T, dim) is y[t] = weight[tok[t]] + pos_weight[t] (PyTorch: nn.Embedding(vocab, dim)(tok) +
 * nn.Embedding(T, dim)(arange(T))). Keys: "vocab", "dim", "positions" (the context length T:
 * adds the position embedding; must equal the input length; absent or 0 = none).
 * Parameters: weight (vocab, dim), pos_weight (T, dim); default init uniform(-1, 1) (fan_in 1).
 * No input gradient (token ids are not differentiable): dx is left untouched. */
#include "nn_impl.h"

static int embed_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    int rc, pos = 0;
    if ((rc = jobj_int(j, "vocab", 1, 1, 1 << 24, &l->cin, err)) || (rc = jobj_int(j, "dim", 1, 1, 1 << 20, &l->cout, err)) ||
        (rc = jobj_int(j, "positions", 0, 0, 1 << 20, &pos, err)))
        return rc;
    if (l->in.ndim != 1)
        return err_set(err, PD_EINVAL, "%s: incoming shape %s is not a sequence of token ids (T)", ctx,
                       nn_shape_str(l->in));
    int t = l->in.d[0];
    if (pos && pos != t)
        return err_set(err, PD_EINVAL, "%s: key \"positions\": %d, but the incoming sequence has %d tokens", ctx, pos,
                       t);
    l->k = pos;   // 0: no position embedding
    l->out = shape2(t, l->cout);
    nn_add_param(l, "weight", shape2(l->cin, l->cout), PARAM_WEIGHT, 1);
    if (pos) nn_add_param(l, "pos_weight", shape2(t, l->cout), PARAM_WEIGHT, 1);
    return PD_OK;
}

static void embed_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                          void *saved) {
    int t = l->in.d[0], d = l->cout, v = l->cin;
    kern_embed_fwd(x, w, l->k ? w + (size_t)v * d : NULL, y, r->n, t, d, v);
}

static void embed_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                           const void *saved, const float *dy, float *dx, float *dw) {
    int t = l->in.d[0], d = l->cout, v = l->cin;
    kern_embed_bwd(x, dy, dw, l->k ? dw + (size_t)v * d : NULL, r->n, t, d, v);
}

/* The split backward: token ids have no gradient, so the data pass does nothing and the
 * weight pass is the whole backward (an input stage's embedding is all BW). */
static void embed_backward_data(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                                const void *saved, const float *dy, float *dx) {}

static void embed_backward_weights(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                                    const void *saved, const float *dy, float *dw) {
    embed_backward(l, r, w, x, y, saved, dy, NULL, dw);
}

const LayerOps LAYER_EMBED = {
    .name = "embed",
    .parse = embed_parse,
    .forward = embed_forward,
    .backward = embed_backward,
    .backward_data = embed_backward_data,
    .backward_weights = embed_backward_weights,
};
