/* layer_gelu.c: "gelu": PyTorch's nn.GELU(approximate=...), elementwise on any shape. Key
 * "approximate": "none" (default, the erf form) or "tanh". No parameters; backward reads the
 * forward input. */
#include "nn_impl.h"

#include <string.h>

static int gelu_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    const char *a = "none";
    int rc = jobj_str(j, "approximate", 0, &a, err);
    if (rc) return rc;
    if (strcmp(a, "none") && strcmp(a, "tanh"))
        return err_set(err, PD_EINVAL, "%s: key \"approximate\": expected \"none\" or \"tanh\", got \"%s\"", ctx, a);
    l->k = !strcmp(a, "tanh");
    l->out = l->in;
    return PD_OK;
}

static void gelu_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                         void *saved) {
    kern_gelu_fwd(x, y, (size_t)r->n * shape_numel(l->in), l->k);
}

static void gelu_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y, const void *saved,
                          const float *dy, float *dx, float *dw) {
    if (dx) kern_gelu_bwd(x, dy, dx, (size_t)r->n * shape_numel(l->in), l->k, l->set & KSET_DX);
}

const LayerOps LAYER_GELU = {
    .name = "gelu",
    .parse = gelu_parse,
    .forward = gelu_forward,
    .backward = gelu_backward,
    .sets = KSET_DX,
};
