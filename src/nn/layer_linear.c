/* layer_linear.c: "linear": y(N, out) = x(N, in) W(out, in)^T + b(out), optionally relu'd.
 * Keys: "in" (must equal the incoming 1-D shape), "out", "bias" (default true), "relu"
 * (default false: fuses a following relu into this top-level layer). Parameters: weight
 * (out, in), bias (out), PyTorch's nn.Linear layout; "init" (init.c, docs/reference/formats.md) takes
 * fan_in = in, fan_out = out. */
#include "nn_impl.h"

#include <string.h>

static int linear_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    int rc;
    l->bias = 1;
    if ((rc = jobj_int(j, "in", 1, 1, 1 << 24, &l->cin, err)) || (rc = jobj_int(j, "out", 1, 1, 1 << 24, &l->cout, err)) ||
        (rc = jobj_bool(j, "bias", 0, &l->bias, err)) || (rc = jobj_bool(j, "relu", 0, &l->relu, err)))
        return rc;
    if (l->in.ndim != 1)
        return err_set(err, PD_EINVAL, "%s: incoming shape %s is not 1-D (add a \"flatten\" layer before it)", ctx,
                       nn_shape_str(l->in));
    if (l->in.d[0] != l->cin)
        return err_set(err, PD_EINVAL, "%s: key \"in\": %d, but the incoming shape is %s", ctx, l->cin,
                       nn_shape_str(l->in));
    l->out = shape1(l->cout);
    nn_add_param(l, "weight", shape2(l->cout, l->cin), PARAM_WEIGHT, l->cin);
    if (l->bias) nn_add_param(l, "bias", shape1(l->cout), PARAM_BIAS, l->cin);
    l->flops = 2.0 * l->cin * l->cout;
    return PD_OK;
}

static int linear_build(Layer *l, int n_max, Err *err) {
    int rc = kern_linear_init(&l->lin[0], l->prec, n_max, l->cin, l->cout, l->bias, err);
    if (rc) return rc;
    if (l->relu) l->scratch = pd_alloc_f32((size_t)n_max * l->cout);
    return PD_OK;
}

static void linear_release(Layer *l) {
    kern_linear_release(&l->lin[0]);
    pd_free(l->scratch);
    l->scratch = NULL;
}

static void linear_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                           void *saved) {
    const float *b = l->bias ? w + (size_t)l->cout * l->cin : NULL;
    kern_linear_fwd_k(&l->lin[0], r->n, x, w, b, y);
    if (l->relu) kern_relu_inplace(y, (size_t)r->n * l->cout);
}

static void linear_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                            const void *saved, const float *dy, float *dx, float *dw) {
    size_t cnt = (size_t)r->n * l->cout;
    if (l->relu) {   // dy through the fused relu: g = dy * (y > 0)
        kern_relu_mask(y, dy, l->scratch, cnt);
        dy = l->scratch;
    }
    kern_linear_bwd_k(&l->lin[0], r->n, x, w, dy, dx, dw, l->bias ? dw + (size_t)l->cout * l->cin : NULL, l->set);
}

/* The split backward: the same masking and the same GEMMs as linear_backward, one half each
 * (kern_linear_bwd computes dx, dW and db independently), so the sum is bitwise backward's. The
 * relu mask is applied again in the weight pass (y is still in the context). */
static void linear_backward_data(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                                 const void *saved, const float *dy, float *dx) {
    if (!dx) return;
    size_t cnt = (size_t)r->n * l->cout;
    if (l->relu) {
        kern_relu_mask(y, dy, l->scratch, cnt);
        dy = l->scratch;
    }
    kern_linear_bwd_k(&l->lin[0], r->n, x, w, dy, dx, NULL, NULL, l->set);
}

static void linear_backward_weights(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                                    const void *saved, const float *dy, float *dw) {
    size_t cnt = (size_t)r->n * l->cout;
    if (l->relu) {
        kern_relu_mask(y, dy, l->scratch, cnt);
        dy = l->scratch;
    }
    kern_linear_bwd_k(&l->lin[0], r->n, x, w, dy, NULL, dw, l->bias ? dw + (size_t)l->cout * l->cin : NULL, l->set);
}

const LayerOps LAYER_LINEAR = {
    .name = "linear",
    .parse = linear_parse,
    .build = linear_build,
    .release = linear_release,
    .forward = linear_forward,
    .backward = linear_backward,
    .backward_data = linear_backward_data,
    .sets = KSET_DX | KSET_DW,
    .backward_weights = linear_backward_weights,
};
