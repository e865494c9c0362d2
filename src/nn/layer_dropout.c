/* layer_dropout.c: "dropout": inverted dropout with probability "p" in [0, 1). In training
 * mode element i of minibatch mb is kept iff the i-th uniform of Philox(seed, stream =
 * RNG_STREAM_DROPOUT << 32 | layer id, substream = mb) is >= p, so a mask does not depend on
 * which worker draws it; in eval mode it is the identity. Saved: the mask (1 byte/element). */
#include "nn_impl.h"

#include <string.h>

static int dropout_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    double p;
    int rc = jobj_num(j, "p", 1, 0.0, 0.999, &p, err);
    if (rc) return rc;
    l->p = (float)p;
    l->out = l->in;
    return PD_OK;
}

static size_t dropout_saved(const Layer *l, int n_max) { return (size_t)n_max * shape_numel(l->in); }

static void dropout_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                            void *saved) {
    size_t cnt = (size_t)r->n * shape_numel(l->in);
    if (!r->train) {
        memcpy(y, x, cnt * sizeof(float));
        return;
    }
    kern_dropout_fwd(x, y, saved, cnt, l->p, r->seed, ((uint64_t)RNG_STREAM_DROPOUT << 32) | l->uid, r->minibatch);
}

static void dropout_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                             const void *saved, const float *dy, float *dx, float *dw) {
    if (!dx) return;
    size_t cnt = (size_t)r->n * shape_numel(l->in);
    if (!r->train) {
        for (size_t i = 0; i < cnt; i++) dx[i] += dy[i];
        return;
    }
    kern_dropout_bwd(dy, saved, dx, cnt, l->p);
}

const LayerOps LAYER_DROPOUT = {
    .name = "dropout",
    .parse = dropout_parse,
    .saved_bytes = dropout_saved,
    .forward = dropout_forward,
    .backward = dropout_backward,
};
