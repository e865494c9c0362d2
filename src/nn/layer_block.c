/* layer_block.c: "block": one top-level layer made of residual steps without activation,
 * x <- x + chain_k(x) for k = 0 .. S-1: the pre-norm transformer block (GPT-2) is
 *   {"type": "block", "steps": [[layernorm, attention], [layernorm, dense, gelu, dense]]}.
 * Being one top-level layer, a block is never split between pipeline stages (stages cut
 * between blocks). Key "steps": a non-empty array of non-empty arrays of layers (any kinds);
 * every chain must map the block's input shape to itself. Parameters follow in step order,
 * named layers.<i>.steps.<k>.<j>.* (sub-layer j of step k); sub-layers get uids
 * ((block uid + 1) << 16) | (1 + j') with j' counting through all steps, as in "residual".
 * Saved per minibatch: each step's output except the last (which is the block's), and per
 * step every sub-layer's output and saved state. */
#include "nn_impl.h"

#include <string.h>

/* ---- one step: y = x + chain(x); sub[0 .. n_body) is the chain ---------------------------- */
static size_t chain_max_act(const Layer *s) {
    size_t m = shape_numel(s->in);
    for (int k = 0; k < s->n_body; k++)
        if (shape_numel(s->sub[k].out) > m) m = shape_numel(s->sub[k].out);
    return m;
}

static int step_build(Layer *s, int n_max, Err *err) {
    for (int k = 0; k < s->n_body; k++) {
        int rc = nn_layer_build(&s->sub[k], n_max, err);
        if (rc) return rc;
    }
    s->scratch = pd_alloc_f32((size_t)n_max * 2 * chain_max_act(s));   // ping-pong gradients
    return PD_OK;
}

static void step_release(Layer *s) {
    for (int k = 0; s->sub && k < s->n_body; k++) nn_layer_release(&s->sub[k]);
    pd_free(s->scratch);
    s->scratch = NULL;
}

static size_t step_saved(const Layer *s, int n) {
    size_t b = 0;
    for (int k = 0; k < s->n_body; k++)
        b += nn_align((size_t)n * shape_numel(s->sub[k].out) * sizeof(float)) + nn_layer_saved_bytes(&s->sub[k], n);
    return b;
}

/* Sub-layer k's output and saved state inside saved, for n samples. */
static void sub_bufs(const Layer *s, const void *saved, int n, int k, float **y, void **sv) {
    char *p = (char *)saved;
    for (int i = 0; i <= k; i++) {
        *y = (float *)p;
        p += nn_align((size_t)n * shape_numel(s->sub[i].out) * sizeof(float));
        size_t sb = nn_layer_saved_bytes(&s->sub[i], n);
        *sv = sb ? p : NULL;
        p += sb;
    }
}

static void step_forward(Layer *s, const NnRun *r, const float *w, float *state, const float *x, float *y,
                         void *saved) {
    const float *in = x;
    for (int k = 0; k < s->n_body; k++) {
        Layer *c = &s->sub[k];
        float *yk;
        void *sv;
        sub_bufs(s, saved, r->n, k, &yk, &sv);
        c->ops->forward(c, r, w + c->param_off, state ? state + c->state_off : NULL, in, yk, sv);
        in = yk;
    }
    size_t cnt = (size_t)r->n * shape_numel(s->out);
    for (size_t i = 0; i < cnt; i++) y[i] = x[i] + in[i];
}

static void step_backward(Layer *s, const NnRun *r, const float *w, const float *x, const float *y,
                          const void *saved, const float *dy, float *dx, float *dw) {
    float *pp[2] = {s->scratch, s->scratch + (size_t)s->built_n * chain_max_act(s)};
    const float *g = dy;
    for (int k = s->n_body - 1; k >= 0; k--) {
        Layer *c = &s->sub[k];
        float *yk, *yp = NULL;
        void *sv, *svp;
        sub_bufs(s, saved, r->n, k, &yk, &sv);
        if (k > 0) sub_bufs(s, saved, r->n, k - 1, &yp, &svp);
        float *dk = dx;   // the chain's first layer goes into dx directly
        if (k > 0) dk = pp[k & 1];
        nn_sub_set(c, dk, k > 0 || (s->set & KSET_DX), r->n);
        c->ops->backward(c, r, w + c->param_off, k > 0 ? yp : x, yk, sv, g, dk, dw + c->param_off);
        g = dk;
    }
    if (dx) {   // the identity path
        size_t cnt = (size_t)r->n * shape_numel(s->out);
        for (size_t i = 0; i < cnt; i++) dx[i] += dy[i];
    }
}

static const LayerOps STEP = {
    .name = "block step",
    .build = step_build,
    .release = step_release,
    .saved_bytes = step_saved,
    .forward = step_forward,
    .backward = step_backward,
    .sets = KSET_DX,
};

/* ---- the block ----------------------------------------------------------------------------- */
static int parse_step(Layer *l, Layer *s, const cJSON *arr, int k, int *j_all, const char *ctx, Err *err) {
    memset(s, 0, sizeof *s);
    s->ops = &STEP;
    s->in = l->in;
    s->top = l->top;
    s->uid = l->uid;
    char sp[160];
    snprintf(sp, sizeof sp, "%s.steps.%d", l->path, k);
    if (strlen(sp) >= sizeof s->path) return err_set(err, PD_EINVAL, "%s: steps[%d]: name %s too long", ctx, k, sp);
    memcpy(s->path, sp, strlen(sp) + 1);
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) == 0)
        return err_set(err, PD_EINVAL, "%s: steps[%d]: expected a non-empty array of layers", ctx, k);
    s->n_body = cJSON_GetArraySize(arr);
    s->sub = pd_calloc(sizeof(Layer) * (size_t)s->n_body);
    Shape cur = l->in;
    int j = 0;
    for (const cJSON *o = arr->child; o; o = o->next, j++) {
        Layer *c = &s->sub[j];
        char path[160], c2[300];
        snprintf(path, sizeof path, "%s.%d", s->path, j);
        snprintf(c2, sizeof c2, "%s: steps[%d][%d]", ctx, k, j);
        int rc = nn_layer_parse(c, o, cur, path, c2, ((l->uid + 1) << 16) | (uint64_t)(1 + (*j_all)++), l->top, err);
        if (rc) return rc;
        c->param_off = s->n_params;
        c->state_off = s->n_state;
        s->n_params += c->n_params;
        s->n_state += c->n_state;
        s->flops += c->flops;
        cur = c->out;
    }
    if (!shape_eq(cur, l->in))
        return err_set(err, PD_EINVAL, "%s: steps[%d]: output %s differs from the block's input %s", ctx, k,
                       nn_shape_str(cur), nn_shape_str(l->in));
    s->out = l->in;
    return PD_OK;
}

static int block_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    const cJSON *steps = jobj_get(j, "steps");
    if (!steps) return err_set(err, PD_EINVAL, "%s: missing required key \"steps\"", ctx);
    if (!cJSON_IsArray(steps) || cJSON_GetArraySize(steps) == 0)
        return err_set(err, PD_EINVAL, "%s: key \"steps\": expected a non-empty array of layer arrays", ctx);
    l->n_body = cJSON_GetArraySize(steps);
    l->sub = pd_calloc(sizeof(Layer) * (size_t)l->n_body);
    int k = 0, j_all = 0;
    for (const cJSON *a = steps->child; a; a = a->next, k++) {
        Layer *s = &l->sub[k];
        int rc = parse_step(l, s, a, k, &j_all, ctx, err);
        if (rc) return rc;
        s->param_off = l->n_params;
        s->state_off = l->n_state;
        l->n_params += s->n_params;
        l->n_state += s->n_state;
        l->flops += s->flops;
    }
    l->out = l->in;
    return PD_OK;
}

static int block_build(Layer *l, int n_max, Err *err) {
    for (int k = 0; k < l->n_body; k++) {
        int rc = nn_layer_build(&l->sub[k], n_max, err);
        if (rc) return rc;
    }
    l->scratch = pd_alloc_f32((size_t)n_max * 2 * shape_numel(l->in));   // ping-pong gradients between steps
    return PD_OK;
}

static void block_release(Layer *l) {
    for (int k = 0; l->sub && k < l->n_body; k++) nn_layer_release(&l->sub[k]);
    pd_free(l->scratch);
    l->scratch = NULL;
}

/* Saved layout: per step k, its output (k < S-1 only) then its saved state. */
static size_t block_saved(const Layer *l, int n) {
    size_t b = 0;
    for (int k = 0; k < l->n_body; k++) {
        if (k < l->n_body - 1) b += nn_align((size_t)n * shape_numel(l->in) * sizeof(float));
        b += nn_layer_saved_bytes(&l->sub[k], n);
    }
    return b;
}

static void step_bufs(const Layer *l, const void *saved, int n, int k, float **y, void **sv) {
    char *p = (char *)saved;
    for (int i = 0; i <= k; i++) {
        *y = NULL;
        if (i < l->n_body - 1) {
            *y = (float *)p;
            p += nn_align((size_t)n * shape_numel(l->in) * sizeof(float));
        }
        size_t sb = nn_layer_saved_bytes(&l->sub[i], n);
        *sv = sb ? p : NULL;
        p += sb;
    }
}

static void block_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                          void *saved) {
    const float *in = x;
    for (int k = 0; k < l->n_body; k++) {
        Layer *s = &l->sub[k];
        float *yk;
        void *sv;
        step_bufs(l, saved, r->n, k, &yk, &sv);
        if (k == l->n_body - 1) yk = y;
        s->ops->forward(s, r, w + s->param_off, state ? state + s->state_off : NULL, in, yk, sv);
        in = yk;
    }
}

static void block_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                           const void *saved, const float *dy, float *dx, float *dw) {
    float *pp[2] = {l->scratch, l->scratch + (size_t)l->built_n * shape_numel(l->in)};
    const float *g = dy;
    for (int k = l->n_body - 1; k >= 0; k--) {
        Layer *s = &l->sub[k];
        float *yk, *yp = NULL;
        void *sv, *svp;
        step_bufs(l, saved, r->n, k, &yk, &sv);
        if (k > 0) step_bufs(l, saved, r->n, k - 1, &yp, &svp);
        float *dk = dx;
        if (k > 0) dk = pp[k & 1];
        nn_sub_set(s, dk, k > 0 || (l->set & KSET_DX), r->n);
        s->ops->backward(s, r, w + s->param_off, k > 0 ? yp : x, k == l->n_body - 1 ? y : yk, sv, g, dk,
                         dw + s->param_off);
        g = dk;
    }
}

const LayerOps LAYER_BLOCK = {
    .name = "block",
    .parse = block_parse,
    .build = block_build,
    .release = block_release,
    .saved_bytes = block_saved,
    .forward = block_forward,
    .backward = block_backward,
    .sets = KSET_DX,
};
