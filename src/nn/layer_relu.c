/* layer_relu.c: "relu": elementwise max(x, 0), any shape. No keys. (conv2d, linear and
 * batchnorm can fuse it with "relu": true instead.) */
#include "nn_impl.h"

static int relu_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    l->out = l->in;
    return PD_OK;
}

static void relu_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                         void *saved) {
    kern_relu_fwd(x, y, (size_t)r->n * shape_numel(l->in));
}

static void relu_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                          const void *saved, const float *dy, float *dx, float *dw) {
    if (dx) kern_relu_bwd(y, dy, dx, (size_t)r->n * shape_numel(l->in));
}

/* Element-wise: any layout, as long as it is the same size (channels in whole blocks). */
static int relu_layouts(const Layer *l) {
    return l->in.ndim == 3 && l->in.d[0] % kern_blk_width() == 0 ? NN_BLK_IN | NN_BLK_SAME : 0;
}

const LayerOps LAYER_RELU = {.name = "relu",
                             .parse = relu_parse,
                             .forward = relu_forward,
                             .backward = relu_backward,
                             .layouts = relu_layouts};
