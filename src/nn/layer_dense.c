/* layer_dense.c: "dense": PyTorch's nn.Linear applied to the last dimension of any incoming
 * shape, e.g. every position of a (T, in) sequence: y[..., :] = x[..., :] W^T + b. Keys
 * "in" (must equal the last dimension), "out", "bias" (default true). Parameters: weight
 * (out, in), bias (out), init as nn.Linear. (For a 1-D input it computes what "linear" does;
 * "linear" stays the kind for classifier heads, "dense" is the per-position one.) */
#include "nn_impl.h"

static int dense_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    int rc;
    l->bias = 1;
    if ((rc = jobj_int(j, "in", 1, 1, 1 << 24, &l->cin, err)) || (rc = jobj_int(j, "out", 1, 1, 1 << 24, &l->cout, err)) ||
        (rc = jobj_bool(j, "bias", 0, &l->bias, err)))
        return rc;
    if (l->in.d[l->in.ndim - 1] != l->cin)
        return err_set(err, PD_EINVAL, "%s: key \"in\": %d, but the incoming shape is %s", ctx, l->cin,
                       nn_shape_str(l->in));
    l->out = l->in;
    l->out.d[l->out.ndim - 1] = l->cout;
    nn_add_param(l, "weight", shape2(l->cout, l->cin), PARAM_WEIGHT, l->cin);
    if (l->bias) nn_add_param(l, "bias", shape1(l->cout), PARAM_BIAS, l->cin);
    l->flops = 2.0 * (double)(shape_numel(l->in) / (size_t)l->cin) * l->cin * l->cout;
    return PD_OK;
}

static int rows(const Layer *l, int n) { return n * (int)(shape_numel(l->in) / (size_t)l->cin); }

static int dense_build(Layer *l, int n_max, Err *err) {
    return kern_linear_init(&l->lin[0], l->prec, rows(l, n_max), l->cin, l->cout, l->bias, err);
}

static void dense_release(Layer *l) { kern_linear_release(&l->lin[0]); }

/* Saved state at bf16: x's bf16 copy, made by the forward's product and read by the weight
 * gradient's, which would otherwise convert x again (a transformer's MLP: its input is the
 * largest operand these products convert). None at fp32. */
static size_t dense_saved(const Layer *l, int n_max) { return kern_linear_keep_bytes(l->prec, rows(l, n_max), l->cin); }

static void dense_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                          void *saved) {
    kern_linear_fwd_kx(&l->lin[0], rows(l, r->n), x, w, l->bias ? w + (size_t)l->cout * l->cin : NULL, y, saved);
}

static void dense_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                           const void *saved, const float *dy, float *dx, float *dw) {
    kern_linear_bwd_kx(&l->lin[0], rows(l, r->n), x, saved, w, dy, dx, dw, l->bias ? dw + (size_t)l->cout * l->cin : NULL,
                       l->set);
}

/* The split backward: kern_linear_bwd's dx GEMM, then its dW GEMM and db sums (independent
 * of each other, so the halves are bitwise the whole). */
static void dense_backward_data(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                                const void *saved, const float *dy, float *dx) {
    if (dx) kern_linear_bwd_k(&l->lin[0], rows(l, r->n), x, w, dy, dx, NULL, NULL, l->set);
}

static void dense_backward_weights(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                                    const void *saved, const float *dy, float *dw) {
    kern_linear_bwd_kx(&l->lin[0], rows(l, r->n), x, saved, w, dy, NULL, dw, l->bias ? dw + (size_t)l->cout * l->cin : NULL,
                       l->set);
}

const LayerOps LAYER_DENSE = {
    .name = "dense",
    .parse = dense_parse,
    .build = dense_build,
    .release = dense_release,
    .saved_bytes = dense_saved,
    .forward = dense_forward,
    .backward = dense_backward,
    .backward_data = dense_backward_data,
    .sets = KSET_DX | KSET_DW,
    .backward_weights = dense_backward_weights,
};
