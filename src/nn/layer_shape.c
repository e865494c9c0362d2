/* layer_shape.c: the layers that only move data: "flatten" (any shape -> 1-D), "reshape"
 * (key "shape": the per-sample target shape, same element count; e.g. an image (1, 28, 28)
 * read as a sequence of 28 rows of 28 features), "pad" (key "pad": zero padding of H and W
 * on each side), "last_step" (a sequence (T, H) -> its last element (H)). Flatten and
 * reshape copy (cheap next to any compute layer) so every top-level layer owns its output. */
#include "nn_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

static int flatten_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    l->out = shape1((int)shape_numel(l->in));
    return PD_OK;
}

static int reshape_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    const cJSON *a = jobj_get(j, "shape");
    if (!a) return err_set(err, PD_EINVAL, "%s: missing required key \"shape\"", ctx);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) < 1 || cJSON_GetArraySize(a) > 3)
        return err_set(err, PD_EINVAL, "%s: key \"shape\": expected an array of 1 to 3 positive integers", ctx);
    int d[3], k = 0;
    for (const cJSON *c = a->child; c; c = c->next) {
        if (!cJSON_IsNumber(c) || c->valuedouble != floor(c->valuedouble) || c->valuedouble < 1 ||
            c->valuedouble > 1e8)
            return err_set(err, PD_EINVAL, "%s: key \"shape\": expected positive integers", ctx);
        d[k++] = (int)c->valuedouble;
    }
    l->out = shape_make(k, d);
    if (shape_numel(l->out) != shape_numel(l->in))
        return err_set(err, PD_EINVAL, "%s: key \"shape\": %s has %zu elements, the incoming shape %s has %zu", ctx,
                       nn_shape_str(l->out), shape_numel(l->out), nn_shape_str(l->in), shape_numel(l->in));
    return PD_OK;
}

static void copy_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                         void *saved) {
    memcpy(y, x, (size_t)r->n * shape_numel(l->in) * sizeof(float));
}

static void copy_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                          const void *saved, const float *dy, float *dx, float *dw) {
    if (!dx) return;
    size_t cnt = (size_t)r->n * shape_numel(l->in);
    for (size_t i = 0; i < cnt; i++) dx[i] += dy[i];
}

const LayerOps LAYER_FLATTEN = {
    .name = "flatten", .parse = flatten_parse, .forward = copy_forward, .backward = copy_backward};
const LayerOps LAYER_RESHAPE = {
    .name = "reshape", .parse = reshape_parse, .forward = copy_forward, .backward = copy_backward};

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
