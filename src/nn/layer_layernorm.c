/* layer_layernorm.c: "layernorm": PyTorch's nn.LayerNorm(features, eps) over the last
 * dimension of any incoming shape, e.g. every position of a (T, D) sequence. Keys:
 * "features" (must equal the last dimension), "eps" (default 1e-5). Parameters: weight
 * (gamma, init 1) and bias (beta, init 0), (features) each. Saved: mean and variance per row
 * (kern_layernorm_*: C loops or oneDNN's layer normalization, KTF_AUTO). */
#include "nn_impl.h"

static int layernorm_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    double eps = 1e-5;
    int rc;
    if ((rc = jobj_int(j, "features", 1, 1, 1 << 24, &l->cin, err)) || (rc = jobj_num(j, "eps", 0, 1e-12, 1.0, &eps, err)))
        return rc;
    if (l->in.d[l->in.ndim - 1] != l->cin)
        return err_set(err, PD_EINVAL, "%s: key \"features\": %d, but the incoming shape is %s", ctx, l->cin,
                       nn_shape_str(l->in));
    l->eps = (float)eps;
    l->out = l->in;
    nn_add_param(l, "weight", shape1(l->cin), PARAM_GAMMA, 1);
    nn_add_param(l, "bias", shape1(l->cin), PARAM_BETA, 1);
    return PD_OK;
}

static int rows(const Layer *l, int n) { return n * (int)(shape_numel(l->in) / (size_t)l->cin); }

static size_t layernorm_saved(const Layer *l, int n_max) {
    return kern_layernorm_saved_floats(rows(l, n_max)) * sizeof(float);
}

static int layernorm_build(Layer *l, int n_max, Err *err) {
    return kern_layernorm_init(&l->ln, KTF_AUTO, rows(l, n_max), l->cin, l->eps, err);
}

static void layernorm_release(Layer *l) { kern_layernorm_release(&l->ln); }

static void layernorm_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                              void *saved) {
    kern_layernorm_fwd(&l->ln, rows(l, r->n), x, w, w + l->cin, y, saved);
}

static void layernorm_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                               const void *saved, const float *dy, float *dx, float *dw) {
    kern_layernorm_bwd(&l->ln, rows(l, r->n), x, w, saved, dy, dx, dw, dw + l->cin);
}

/* The split backward: kern_layernorm_bwd computes dx and the gamma/beta sums independently,
 * each only when asked for (its C loops split for real; its oneDNN path computes all three and
 * keeps what was asked), so the halves are bitwise the whole. */
static void layernorm_backward_data(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                                    const void *saved, const float *dy, float *dx) {
    if (dx) kern_layernorm_bwd(&l->ln, rows(l, r->n), x, w, saved, dy, dx, NULL, NULL);
}

static void layernorm_backward_weights(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                                    const void *saved, const float *dy, float *dw) {
    kern_layernorm_bwd(&l->ln, rows(l, r->n), x, w, saved, dy, NULL, dw, dw + l->cin);
}

const LayerOps LAYER_LAYERNORM = {
    .name = "layernorm",
    .parse = layernorm_parse,
    .build = layernorm_build,
    .release = layernorm_release,
    .saved_bytes = layernorm_saved,
    .forward = layernorm_forward,
    .backward = layernorm_backward,
    .backward_data = layernorm_backward_data,
    .backward_weights = layernorm_backward_weights,
};
