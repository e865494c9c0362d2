/* layer_conv2d.c: "conv2d": square kernel, stride and zero padding, optional bias and fused
 * relu (the kernel applies it; backward masks with y > 0).
 * Keys: "in" (channels, must equal the incoming C), "out", "kernel", "stride" (default 1),
 * "pad" (default 0), "bias" (default true), "relu" (default false). Input (C, H, W), output
 * (out, OH, OW). Parameters: weight (out, in, k, k), bias (out): nn.Conv2d's layout; "init"
 * (init.c, docs/reference/formats.md) takes fan_in = in k k, fan_out = out k k, as PyTorch. */
#include "nn_impl.h"

static int conv_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    int rc;
    l->bias = 1;
    l->stride = 1;
    l->pad = 0;
    if ((rc = jobj_int(j, "in", 1, 1, 1 << 20, &l->cin, err)) || (rc = jobj_int(j, "out", 1, 1, 1 << 20, &l->cout, err)) ||
        (rc = jobj_int(j, "kernel", 1, 1, 64, &l->k, err)) || (rc = jobj_int(j, "stride", 0, 1, 64, &l->stride, err)) ||
        (rc = jobj_int(j, "pad", 0, 0, 64, &l->pad, err)) || (rc = jobj_bool(j, "bias", 0, &l->bias, err)) ||
        (rc = jobj_bool(j, "relu", 0, &l->relu, err)))
        return rc;
    if (l->in.ndim != 3)
        return err_set(err, PD_EINVAL, "%s: incoming shape %s is not (C, H, W)", ctx, nn_shape_str(l->in));
    if (l->in.d[0] != l->cin)
        return err_set(err, PD_EINVAL, "%s: key \"in\": %d channels, but the incoming shape is %s", ctx, l->cin,
                       nn_shape_str(l->in));
    int h = l->in.d[1], w = l->in.d[2];
    if (h + 2 * l->pad < l->k || w + 2 * l->pad < l->k)
        return err_set(err, PD_EINVAL, "%s: kernel %d is larger than the padded input %s", ctx, l->k,
                       nn_shape_str(l->in));
    int oh = (h + 2 * l->pad - l->k) / l->stride + 1, ow = (w + 2 * l->pad - l->k) / l->stride + 1;
    l->out = shape3(l->cout, oh, ow);
    int fan_in = l->cin * l->k * l->k;
    nn_add_param(l, "weight", shape4(l->cout, l->cin, l->k, l->k), PARAM_WEIGHT, fan_in);
    if (l->bias) nn_add_param(l, "bias", shape1(l->cout), PARAM_BIAS, fan_in);
    l->flops = 2.0 * l->cout * (double)fan_in * oh * ow;
    return PD_OK;
}

static int conv_build(Layer *l, int n_max, Err *err) {
    return kern_conv2d_init_prec(&l->conv, KCONV_AUTO, l->prec, n_max, l->cin, l->in.d[1], l->in.d[2], l->cout,
                                 l->k, l->k, l->stride, l->pad, l->bias, l->relu, err);
}

static void conv_release(Layer *l) { kern_conv2d_release(&l->conv); }

/* bf16: x as the forward converted it, for the weight gradient (kern_conv2d_keep_bytes) */
static size_t conv_saved(const Layer *l, int n_max) { return kern_conv2d_keep_bytes(&l->conv, n_max); }

static void conv_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                         void *saved) {
    const float *b = l->bias ? w + (size_t)l->cout * l->cin * l->k * l->k : NULL;
    kern_conv2d_fwd_kx(&l->conv, r->n, l->lay, x, w, b, y, saved);
}

static void conv_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                          const void *saved, const float *dy, float *dx, float *dw) {
    float *db = l->bias ? dw + (size_t)l->cout * l->cin * l->k * l->k : NULL;
    kern_conv2d_bwd_kx(&l->conv, r->n, l->lay, l->set, x, saved, w, y, dy, dx, dw, db);
}

/* The split backward: kern_conv2d_bwd computes dx (oneDNN's backward-data primitive, or W^T g
 * and col2im) and dW, db (backward-weights, or g col^T and row sums) independently from the
 * masked dy, each only when asked for, so the halves are bitwise the whole. The relu mask is
 * applied in both (from y, still in the context). */
static void conv_backward_data(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                               const void *saved, const float *dy, float *dx) {
    if (dx) kern_conv2d_bwd_set(&l->conv, r->n, l->lay, l->set, x, w, y, dy, dx, NULL, NULL);
}

static void conv_backward_weights(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                                    const void *saved, const float *dy, float *dw) {
    float *db = l->bias ? dw + (size_t)l->cout * l->cin * l->k * l->k : NULL;
    kern_conv2d_bwd_kx(&l->conv, r->n, l->lay, l->set, x, saved, w, y, dy, NULL, dw, db);
}

/* oneDNN's blocked layouts where its primitives use them (kern_conv2d_layouts): vgg16's and
 * resnet20's 16..128-channel convolutions; an im2col one's output where its channels fill blocks. */
static int conv_layouts(const Layer *l) {
    const int k = kern_conv2d_layouts(&l->conv);
    return (k & KCONV_X_BLK ? NN_BLK_IN : 0) | (k & KCONV_Y_BLK ? NN_BLK_OUT : 0);
}

const LayerOps LAYER_CONV2D = {
    .name = "conv2d",
    .parse = conv_parse,
    .build = conv_build,
    .release = conv_release,
    .saved_bytes = conv_saved,
    .forward = conv_forward,
    .backward = conv_backward,
    .backward_data = conv_backward_data,
    .backward_weights = conv_backward_weights,
    .layouts = conv_layouts,
    .sets = KSET_DX | KSET_DW,
};
