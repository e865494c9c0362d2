/* layer_last_step.c: "last_step": a sequence (T, H) -> its last element (H), as PyTorch's
 * out[:, -1, :] after an LSTM. No keys. */
#include "nn_impl.h"

#include <string.h>

static int last_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    if (l->in.ndim != 2)
        return err_set(err, PD_EINVAL, "%s: incoming shape %s is not a sequence (T, H)", ctx, nn_shape_str(l->in));
    l->out = shape1(l->in.d[1]);
    return PD_OK;
}

/* x (N, T, H) -> y (N, H) = x[:, T-1, :] */
static void last_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                         void *saved) {
    int t = l->in.d[0], h = l->in.d[1];
    for (int i = 0; i < r->n; i++)
        memcpy(y + (size_t)i * h, x + ((size_t)i * t + (t - 1)) * h, (size_t)h * sizeof(float));
}

static void last_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                          const void *saved, const float *dy, float *dx, float *dw) {
    if (!dx) return;
    int t = l->in.d[0], h = l->in.d[1];
    for (int i = 0; i < r->n; i++) {
        float *d = dx + ((size_t)i * t + (t - 1)) * h;
        const float *g = dy + (size_t)i * h;
        for (int k = 0; k < h; k++) d[k] += g[k];
    }
}

const LayerOps LAYER_LAST_STEP = {
    .name = "last_step", .parse = last_parse, .forward = last_forward, .backward = last_backward};
