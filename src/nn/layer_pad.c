/* layer_pad.c: "pad": zero padding of H and W by "pad" on each side, (C, H, W) ->
 * (C, H + 2p, W + 2p) (MODELS.md's pad32). */
#include "nn_impl.h"

static int pad_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    int rc = jobj_int(j, "pad", 1, 0, 1024, &l->pad, err);
    if (rc) return rc;
    if (l->in.ndim != 3)
        return err_set(err, PD_EINVAL, "%s: incoming shape %s is not (C, H, W)", ctx, nn_shape_str(l->in));
    l->out = shape3(l->in.d[0], l->in.d[1] + 2 * l->pad, l->in.d[2] + 2 * l->pad);
    return PD_OK;
}

static void pad_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                        void *saved) {
    kern_pad_fwd(x, y, r->n, l->in.d[0], l->in.d[1], l->in.d[2], l->pad);
}

static void pad_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                         const void *saved, const float *dy, float *dx, float *dw) {
    if (dx) kern_pad_bwd(dy, dx, r->n, l->in.d[0], l->in.d[1], l->in.d[2], l->pad);
}

const LayerOps LAYER_PAD = {.name = "pad", .parse = pad_parse, .forward = pad_forward, .backward = pad_backward};

