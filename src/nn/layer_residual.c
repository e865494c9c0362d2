/* layer_residual.c: "residual": one top-level layer y = relu(body(x) + shortcut(x)), the
 * unit a partitioner must not split. Keys: "body" (non-empty array of layers), "shortcut"
 * (array of layers; absent or empty = identity). Sub-layers are any kinds; their parameters
 * follow in order body then shortcut (as a PyTorch module registering body before
 * shortcut), named layers.<i>.body.<k>.* and layers.<i>.shortcut.<k>.*.
 * Saved per minibatch: each sub-layer's output and saved state, laid out for the run's n.
 *
 * Layouts: x and y may each be blocked (nChw16c, nChw8c on AVX2: KCONV_X_BLK / KCONV_Y_BLK
 * in l->lay) when the channels come in whole blocks. Per call the body and the shortcut are planned like a
 * range (nn_plan_layouts) from x's layout to y's, so in resnet20 a whole chain of blocks
 * keeps its activations blocked, and the add and relu run on whatever layout y has; an
 * identity shortcut whose x is in the other layout is reordered on the fly inside the add
 * (and its gradient likewise). Results are bitwise the all-plain ones, reordered. */
/* add_across's tile loops: -O2 alone (gcc 12's very-cheap cost model) leaves them scalar */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif
#include "nn_impl.h"


static int parse_chain(Layer *l, const cJSON *arr, const char *key, int base, int count, Shape in, const char *ctx,
                       Err *err) {
    int k = 0;
    Shape cur = in;
    for (const cJSON *o = arr ? arr->child : NULL; o; o = o->next, k++) {
        Layer *s = &l->sub[base + k];
        char path[160], c2[300];
        snprintf(path, sizeof path, "%s.%s.%d", l->path, key, k);
        snprintf(c2, sizeof c2, "%s: %s[%d]", ctx, key, k);
        int rc = nn_layer_parse(s, o, cur, path, c2, ((l->uid + 1) << 16) | (uint64_t)(1 + base + k), l->top, err);
        if (rc) return rc;
        s->param_off = l->n_params;
        s->state_off = l->n_state;
        l->n_params += s->n_params;
        l->n_state += s->n_state;
        l->flops += s->flops;
        cur = s->out;
    }
    PD_ASSERT(k == count);
    return PD_OK;
}

static int residual_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    const cJSON *body = jobj_get(j, "body"), *sc = jobj_get(j, "shortcut");
    if (!body) return err_set(err, PD_EINVAL, "%s: missing required key \"body\"", ctx);
    if (!cJSON_IsArray(body) || cJSON_GetArraySize(body) == 0)
        return err_set(err, PD_EINVAL, "%s: key \"body\": expected a non-empty array of layers", ctx);
    if (sc && !cJSON_IsArray(sc))
        return err_set(err, PD_EINVAL, "%s: key \"shortcut\": expected an array of layers", ctx);
    l->n_body = cJSON_GetArraySize(body);
    l->n_short = sc ? cJSON_GetArraySize(sc) : 0;
    l->sub = pd_calloc(sizeof(Layer) * (size_t)(l->n_body + l->n_short));
    int rc = parse_chain(l, body, "body", 0, l->n_body, l->in, ctx, err);
    if (!rc) rc = parse_chain(l, sc, "shortcut", l->n_body, l->n_short, l->in, ctx, err);
    if (rc) return rc;
    Shape bo = l->sub[l->n_body - 1].out, so = l->n_short ? l->sub[l->n_body + l->n_short - 1].out : l->in;
    if (!shape_eq(bo, so))
        return err_set(err, PD_EINVAL, "%s: body output %s differs from shortcut output %s", ctx, nn_shape_str(bo),
                       nn_shape_str(so));
    l->out = bo;
    return PD_OK;
}

static size_t max_act(const Layer *l) {
    size_t m = shape_numel(l->in);
    for (int k = 0; k < l->n_body + l->n_short; k++)
        if (shape_numel(l->sub[k].out) > m) m = shape_numel(l->sub[k].out);
    return m;
}

/* Backward scratch: dsum (n, out), then two ping-pong gradient buffers (n, max activation).
 * It lives only during residual_backward, so it is the thread's kern_scratch slot
 * KSCR_RESIDUAL + nesting depth (a residual inside a body takes the next slot), shared by all
 * residual blocks of the model instead of owned by each (resnet20: 9 x 12 MB at N = 64). */
static _Thread_local int g_depth;

static size_t scratch_bytes(const Layer *l, int n) {
    return (size_t)n * (shape_numel(l->out) + 2 * max_act(l)) * sizeof(float);
}

/* Plans the sub-layers' layouts for x blocked (xb) and y blocked (yb) into lay; 0: impossible. */
static int plan(const Layer *l, int xb, int yb, unsigned char *lay) {
    return nn_plan_layouts(l->sub, l->n_body, xb, yb, lay) &&
           (!l->n_short || nn_plan_layouts(l->sub + l->n_body, l->n_short, xb, yb, lay + l->n_body));
}

/* NN_BLK_IN | NN_BLK_OUT when every combination of x's and y's layouts can be planned (so a
 * block can turn plain data blocked and back: the first and last of a chain), NN_BLK_IN |
 * NN_BLK_SAME when only equal ones can, else nothing. */
static int caps(Layer *l) {
    if (l->in.ndim != 3 || l->out.ndim != 3 || l->in.d[0] % kern_blk_width() || l->out.d[0] % kern_blk_width()) return 0;
    int ok[2][2];
    for (int xb = 0; xb < 2; xb++)
        for (int yb = 0; yb < 2; yb++) ok[xb][yb] = plan(l, xb, yb, l->sub_lay);
    if (ok[0][0] && ok[0][1] && ok[1][0] && ok[1][1]) return NN_BLK_IN | NN_BLK_OUT;
    return ok[0][0] && ok[1][1] ? NN_BLK_IN | NN_BLK_SAME : 0;
}

static int residual_build(Layer *l, int n_max, Err *err) {
    for (int k = 0; k < l->n_body + l->n_short; k++) {
        int rc = nn_layer_build(&l->sub[k], n_max, err);
        if (rc) return rc;
    }
    kern_scratch(KSCR_RESIDUAL, scratch_bytes(l, n_max));   // grown at build time on this thread
    l->sub_lay = pd_calloc((size_t)(l->n_body + l->n_short));
    l->sub_caps = caps(l);
    return PD_OK;
}

static void residual_release(Layer *l) {
    for (int k = 0; l->sub && k < l->n_body + l->n_short; k++) nn_layer_release(&l->sub[k]);
    pd_free(l->sub_lay);
    l->sub_lay = NULL;
    l->sub_caps = 0;
}

static int residual_layouts(const Layer *l) { return l->sub_caps; }

/* This call's sub-layer layouts (l->lay from the caller) into l->sub_lay. */
static void plan_call(Layer *l) {
    const int ok = plan(l, !!(l->lay & KCONV_X_BLK), !!(l->lay & KCONV_Y_BLK), l->sub_lay);
    PD_ASSERTF(ok, "%s: layouts 0x%x not planned", l->path, (unsigned)l->lay);
}

/* The identity shortcut across layouts: y = max(a + b, 0) (a given) or y += b (a NULL), where
 * y and a are in layout yb and b in the other one (blocked: (N, C/B, HW, B), B =
 * kern_blk_width()). Serial: only a chain's first or last block meets it, once per pass. Tile
 * by tile: per sample and block of B channels, 16 pixels x B channels, contiguous (p * B + l)
 * blocked and B rows of 16 (l * hw + p) plain; b's tile is first transposed into y's order, so
 * that the arithmetic runs on unit-stride rows. */
static void add_across(const float *a, const float *b, float *y, int n, Shape sh, int yb) {
    const int c = sh.d[0], hw = sh.d[1] * sh.d[2], B = kern_blk_width();
    float t[16][16];
    for (size_t o = 0; o < (size_t)n * c * hw; o += (size_t)B * hw)   // one sample's B channels
        for (int p0 = 0; p0 < hw; p0 += 16) {
            const int np = hw - p0 < 16 ? hw - p0 : 16;
            /* t: y's tile order (pixel-major blocked, channel-major plain); rows of len */
            const int rows = yb ? np : B, len = yb ? B : np;
            if (yb)
                for (int l = 0; l < B; l++) {
                    const float *src = b + o + (size_t)l * hw + p0;
                    for (int q = 0; q < np; q++) t[q][l] = src[q];
                }
            else
                for (int q = 0; q < np; q++) {
                    const float *src = b + o + (size_t)(p0 + q) * B;
                    for (int l = 0; l < B; l++) t[l][q] = src[l];
                }
            for (int r = 0; r < rows; r++) {
                const size_t at = yb ? o + (size_t)(p0 + r) * B : o + (size_t)r * hw + p0;
                float *restrict yr = y + at;
                const float *restrict tr = t[r];
                if (a) {
                    const float *restrict ar = a + at;
                    for (int k = 0; k < len; k++) {
                        float v = ar[k] + tr[k];
                        yr[k] = v > 0 ? v : 0.0f;
                    }
                } else {
                    for (int k = 0; k < len; k++) yr[k] += tr[k];
                }
            }
        }
}

static size_t residual_saved(const Layer *l, int n) {
    size_t b = 0;
    for (int k = 0; k < l->n_body + l->n_short; k++)
        b += nn_align((size_t)n * shape_numel(l->sub[k].out) * sizeof(float)) + nn_layer_saved_bytes(&l->sub[k], n);
    return b;
}

/* Sub-layer k's output and saved state inside saved, for n samples. */
static void sub_bufs(const Layer *l, void *saved, int n, int k, float **y, void **sv) {
    char *p = saved;
    for (int i = 0; i <= k; i++) {
        *y = (float *)p;
        p += nn_align((size_t)n * shape_numel(l->sub[i].out) * sizeof(float));
        size_t sb = nn_layer_saved_bytes(&l->sub[i], n);
        *sv = sb ? p : NULL;
        p += sb;
    }
}

static void residual_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                             void *saved) {
    const float *bo = x, *so = x;
    plan_call(l);
    for (int k = 0; k < l->n_body + l->n_short; k++) {
        Layer *s = &l->sub[k];
        s->lay = l->sub_lay[k];
        float *yk;
        void *sv;
        sub_bufs(l, saved, r->n, k, &yk, &sv);
        const float *in = k < l->n_body ? bo : so;   // both chains start at x
        s->ops->forward(s, r, w + s->param_off, state ? state + s->state_off : NULL, in, yk, sv);
        if (k < l->n_body) bo = yk;
        else so = yk;
    }
    const int xb = !!(l->lay & KCONV_X_BLK), yb = !!(l->lay & KCONV_Y_BLK);
    if (!l->n_short && xb != yb) add_across(bo, x, y, r->n, l->out, yb);
    else kern_add_relu(bo, so, y, (size_t)r->n * shape_numel(l->out));
}

/* Backward through sub-layers [a, b) (one chain), from g; the chain's input gradient goes
 * to dx (may be NULL): written where dx_fresh (its old contents not wanted), else added. */
static void chain_backward(Layer *l, const NnRun *r, const float *w, const float *x, const void *saved, int a, int b,
                           const float *g, float *dx, int dx_fresh, float *dw, float *scratch) {
    float *pp[2] = {scratch + (size_t)r->n * shape_numel(l->out),
                    scratch + (size_t)r->n * (shape_numel(l->out) + max_act(l))};
    for (int k = b - 1; k >= a; k--) {
        Layer *s = &l->sub[k];
        float *yk, *yp = NULL;
        void *sv, *svp;
        sub_bufs(l, (void *)saved, r->n, k, &yk, &sv);
        if (k > a) sub_bufs(l, (void *)saved, r->n, k - 1, &yp, &svp);
        const float *in = k > a ? yp : x;
        float *dk = k > a ? pp[k & 1] : dx;
        nn_sub_set(s, dk, k > a || dx_fresh, r->n);
        s->lay = l->sub_lay[k];
        s->ops->backward(s, r, w + s->param_off, in, yk, sv, g, dk, dw + s->param_off);
        g = dk;
    }
}

static void residual_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                              const void *saved, const float *dy, float *dx, float *dw) {
    size_t cnt = (size_t)r->n * shape_numel(l->out);
    PD_ASSERTF(KSCR_RESIDUAL + g_depth < KSCR_COUNT, "residual blocks nested %d deep", g_depth + 1);
    float *scratch = kern_scratch(KSCR_RESIDUAL + g_depth, scratch_bytes(l, r->n));
    g_depth++;
    plan_call(l);
    float *dsum = scratch;   // dL/d(body + shortcut) = dy * (y > 0)
    kern_relu_mask(y, dy, dsum, cnt);
    /* the body's gradient is written into dx where it may be (Layer.set), the shortcut's added */
    chain_backward(l, r, w, x, saved, 0, l->n_body, dsum, dx, (l->set & KSET_DX) != 0, dw, scratch);
    if (l->n_short) chain_backward(l, r, w, x, saved, l->n_body, l->n_body + l->n_short, dsum, dx, 0, dw, scratch);
    else if (dx && !(l->lay & KCONV_X_BLK) != !(l->lay & KCONV_Y_BLK))
        add_across(NULL, dsum, dx, r->n, l->out, !!(l->lay & KCONV_X_BLK));
    else if (dx) kern_accumulate(dx, dsum, cnt);
    g_depth--;
}

const LayerOps LAYER_RESIDUAL = {
    .name = "residual",
    .parse = residual_parse,
    .build = residual_build,
    .release = residual_release,
    .saved_bytes = residual_saved,
    .sets = KSET_DX,
    .forward = residual_forward,
    .backward = residual_backward,
    .layouts = residual_layouts,
};
