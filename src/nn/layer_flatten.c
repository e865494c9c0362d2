/* layer_flatten.c: the layers that only reshape: "flatten" (any shape -> 1-D, no keys) and
 * "reshape" (key "shape": the per-sample target shape with the same element count; e.g. an
 * image (1, 28, 28) read as a sequence of 28 rows of 28 features). Both copy (cheap next to
 * any compute layer), so every top-level layer owns its output buffer and a stage boundary
 * may fall right after them. */
#include "nn_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

static int flatten_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    if (shape_numel(l->in) > NN_MAX_NUMEL)
        return err_set(err, PD_EINVAL, "%s: incoming shape %s is too large", ctx, nn_shape_str(l->in));
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

