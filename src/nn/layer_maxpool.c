/* layer_maxpool.c: "maxpool": k x k max pooling, no padding. Keys: "kernel", "stride"
 * (default = kernel). Input (C, H, W), output (C, (H-k)/s+1, (W-k)/s+1). Saved per
 * minibatch: the argmax of every output (int32). Takes oneDNN's blocked activations (nChw16c,
 * nChw8c on AVX2) between convolutions when its channels are a multiple of the block (model.c
 * decides). */
#include "nn_impl.h"

static int pool_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    int rc;
    if ((rc = jobj_int(j, "kernel", 1, 1, 64, &l->k, err))) return rc;
    l->stride = l->k;
    if ((rc = jobj_int(j, "stride", 0, 1, 64, &l->stride, err))) return rc;
    if (l->in.ndim != 3)
        return err_set(err, PD_EINVAL, "%s: incoming shape %s is not (C, H, W)", ctx, nn_shape_str(l->in));
    if (l->in.d[1] < l->k || l->in.d[2] < l->k)
        return err_set(err, PD_EINVAL, "%s: kernel %d is larger than the input %s", ctx, l->k, nn_shape_str(l->in));
    l->out = shape3(l->in.d[0], (l->in.d[1] - l->k) / l->stride + 1, (l->in.d[2] - l->k) / l->stride + 1);
    return PD_OK;
}

static size_t pool_saved(const Layer *l, int n_max) { return (size_t)n_max * shape_numel(l->out) * sizeof(int32_t); }

static void pool_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                         void *saved) {
    if (l->lay & KCONV_X_BLK)
        kern_maxpool_fwd_blk(x, y, saved, r->n, l->in.d[0], l->in.d[1], l->in.d[2], l->k, l->stride, kern_blk_width());
    else kern_maxpool_fwd(x, y, saved, r->n, l->in.d[0], l->in.d[1], l->in.d[2], l->k, l->stride);
}

static void pool_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                          const void *saved, const float *dy, float *dx, float *dw) {
    if (!dx) return;
    const int c = l->in.d[0], h = l->in.d[1], wd = l->in.d[2], set = l->set & KSET_DX;
    if (l->lay & KCONV_X_BLK) kern_maxpool_bwd_blk(dy, saved, dx, r->n, c, h, wd, l->k, l->stride, set, kern_blk_width());
    else kern_maxpool_bwd(dy, saved, dx, r->n, c, h, wd, l->k, l->stride, set);
}

/* Channel-wise: pools the blocked layout in place of NCHW when its channels come in blocks. */
static int pool_layouts(const Layer *l) { return l->in.d[0] % kern_blk_width() == 0 ? NN_BLK_IN | NN_BLK_SAME : 0; }

const LayerOps LAYER_MAXPOOL = {
    .name = "maxpool",
    .parse = pool_parse,
    .saved_bytes = pool_saved,
    .forward = pool_forward,
    .backward = pool_backward,
    .sets = KSET_DX,
    .layouts = pool_layouts,
};
