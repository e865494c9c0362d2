/* layer_gap.c: "gap": global average pooling (C, H, W) -> (C). No keys. x may arrive in
 * oneDNN's blocked layout (C a multiple of kern_blk_width(): the end of a blocked residual
 * stage); y is always plain. */
#include "nn_impl.h"

static int gap_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    if (l->in.ndim != 3)
        return err_set(err, PD_EINVAL, "%s: incoming shape %s is not (C, H, W)", ctx, nn_shape_str(l->in));
    l->out = shape1(l->in.d[0]);
    return PD_OK;
}

static void gap_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                        void *saved) {
    if (l->lay & KCONV_X_BLK) kern_gap_fwd_blk(x, y, r->n, l->in.d[0], l->in.d[1] * l->in.d[2], kern_blk_width());
    else kern_gap_fwd(x, y, r->n, l->in.d[0], l->in.d[1] * l->in.d[2]);
}

static void gap_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                         const void *saved, const float *dy, float *dx, float *dw) {
    if (!dx) return;
    if (l->lay & KCONV_X_BLK) kern_gap_bwd_blk(dy, dx, r->n, l->in.d[0], l->in.d[1] * l->in.d[2], kern_blk_width());
    else kern_gap_bwd(dy, dx, r->n, l->in.d[0], l->in.d[1] * l->in.d[2]);
}

static int gap_layouts(const Layer *l) { return l->in.d[0] % kern_blk_width() == 0 ? NN_BLK_IN : 0; }

const LayerOps LAYER_GAP = {.name = "gap",
                            .parse = gap_parse,
                            .forward = gap_forward,
                            .backward = gap_backward,
                            .layouts = gap_layouts};
