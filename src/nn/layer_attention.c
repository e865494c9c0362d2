/* layer_attention.c: "attention": multi-head self-attention on a (T, dim) sequence, GPT-2's
 * attention module: qkv = x Wqkv^T + bqkv (one (3 dim, dim) projection: q, k, v stacked),
 * per head softmax(q k^T / sqrt(dim/heads)) v with a causal mask (position t attends to
 * positions <= t), heads concatenated, then y = att Wproj^T + bproj. No dropout. Keys: "dim"
 * (must equal the incoming feature size), "heads" (must divide dim), "causal" (default
 * true), "bias" (default true). Parameters (PyTorch order): qkv.weight (3 dim, dim),
 * qkv.bias (3 dim), proj.weight (dim, dim), proj.bias (dim); init as nn.Linear.
 * Saved per sample: qkv (T, 3 dim), att (T, dim), probabilities (heads, T, T); at bf16 also the
 * bf16 copies of the two projections' inputs, x and att (kern_linear_fwd_kx), so that their
 * weight gradients do not convert them again. Where the core's products run in bf16 (oneDNN),
 * qkv and att exist only as bf16: the qkv projection writes qkv's bf16 copy straight into the
 * core's kept operands (kern_linear_fwd_kb), the core writes att as bf16 into the output
 * projection's kept input (kern_attention_fwd_kb), which reads it as it is
 * (kern_linear_fwd_bx); the same bits as rounding the float32 ones, and no float32 qkv or att
 * is saved. */
#include "nn_impl.h"


static int attention_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    int rc;
    l->bias = 1;
    l->relu = 1;   // causal
    if ((rc = jobj_int(j, "dim", 1, 1, 1 << 16, &l->cin, err)) || (rc = jobj_int(j, "heads", 1, 1, 1 << 16, &l->k, err)) ||
        (rc = jobj_bool(j, "causal", 0, &l->relu, err)) || (rc = jobj_bool(j, "bias", 0, &l->bias, err)))
        return rc;
    if (l->in.ndim != 2 || l->in.d[1] != l->cin)
        return err_set(err, PD_EINVAL, "%s: key \"dim\": %d, but the incoming shape %s is not (T, %d)", ctx, l->cin,
                       nn_shape_str(l->in), l->cin);
    if (l->cin % l->k)
        return err_set(err, PD_EINVAL, "%s: key \"heads\": %d does not divide dim %d", ctx, l->k, l->cin);
    if (l->in.d[0] > 4096) return err_set(err, PD_EINVAL, "%s: sequences longer than 4096 are not supported", ctx);
    int d = l->cin;
    double t = l->in.d[0];
    l->out = l->in;
    nn_add_param(l, "qkv.weight", shape2(3 * d, d), PARAM_WEIGHT, d);
    if (l->bias) nn_add_param(l, "qkv.bias", shape1(3 * d), PARAM_BIAS, d);
    nn_add_param(l, "proj.weight", shape2(d, d), PARAM_WEIGHT, d);
    if (l->bias) nn_add_param(l, "proj.bias", shape1(d), PARAM_BIAS, d);
    l->flops = 2.0 * t * 4.0 * d * d + 4.0 * t * t * d;
    return PD_OK;
}

static size_t per_sample(const Layer *l, int which) {   // 0: qkv, 1: att, 2: probabilities
    size_t t = (size_t)l->in.d[0], d = (size_t)l->cin;
    return which == 0 ? t * 3 * d : which == 1 ? t * d : (size_t)l->k * t * t;
}

static size_t keep_bytes(const Layer *l, int n) {   // one projection input's bf16 copy (0 at fp32)
    return nn_align(kern_linear_keep_bytes(l->prec, n * l->in.d[0], l->cin));
}

static size_t attn_keep_bytes(const Layer *l, int n) {   // the core's bf16 qkv and P (0 at fp32)
    return nn_align(kern_attention_keep_bytes(l->prec, n, l->in.d[0], l->k, l->cin / l->k));
}

/* qkv and att in bf16 only: built, with bf16 products in the core (then in the projections too:
 * all three take the layer's precision) */
static int bf16_only(const Layer *l) { return kern_attention_takes_bf16(&l->attn); }

static size_t f32_bytes(const Layer *l, int n, int which) {   // saved float32 qkv (0) or att (1)
    return bf16_only(l) ? 0 : nn_align((size_t)n * per_sample(l, which) * sizeof(float));
}

static size_t attention_saved(const Layer *l, int n) {
    return f32_bytes(l, n, 0) + f32_bytes(l, n, 1) + nn_align((size_t)n * per_sample(l, 2) * sizeof(float)) +
           2 * keep_bytes(l, n) + attn_keep_bytes(l, n);
}

/* xb[0], xb[1]: the bf16 copies of x and att; *ak: the core's kept copies (NULL at fp32);
 * qkv, att: NULL where they are bf16 only. */
static void parts(const Layer *l, const void *saved, int n, float **qkv, float **att, float **p, uint16_t **xb,
                  void **ak) {
    char *s = (char *)saved;
    *qkv = f32_bytes(l, n, 0) ? (float *)s : NULL;
    s += f32_bytes(l, n, 0);
    *att = f32_bytes(l, n, 1) ? (float *)s : NULL;
    s += f32_bytes(l, n, 1);
    *p = (float *)s;
    s += nn_align((size_t)n * per_sample(l, 2) * sizeof(float));
    size_t kb = keep_bytes(l, n);
    xb[0] = kb ? (uint16_t *)s : NULL;
    xb[1] = kb ? (uint16_t *)(s + kb) : NULL;
    *ak = attn_keep_bytes(l, n) ? s + 2 * kb : NULL;
}

static int attention_build(Layer *l, int n_max, Err *err) {
    const int t = l->in.d[0], d = l->cin;
    int rc = kern_attention_init_prec(&l->attn, KTF_AUTO, l->prec, n_max, t, l->k, d / l->k, l->relu, err);
    if (!rc) rc = kern_linear_init(&l->lin[0], l->prec, n_max * t, d, 3 * d, l->bias, err);
    if (!rc) rc = kern_linear_init(&l->lin[1], l->prec, n_max * t, d, d, l->bias, err);
    if (rc) return rc;
    /* backward scratch: dqkv (n, T, 3d), datt (n, T, d) */
    l->scratch = pd_alloc_f32((size_t)n_max * (per_sample(l, 0) + per_sample(l, 1)));
    return PD_OK;
}

static void attention_release(Layer *l) {
    kern_attention_release(&l->attn);
    kern_linear_release(&l->lin[0]);
    kern_linear_release(&l->lin[1]);
    pd_free(l->scratch);
    l->scratch = NULL;
}

static void attention_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                              void *saved) {
    int n = r->n, t = l->in.d[0], d = l->cin;
    const float *wqkv = w, *bqkv = l->bias ? w + (size_t)3 * d * d : NULL;
    const float *wp = w + (size_t)3 * d * d + (l->bias ? 3 * d : 0), *bp = l->bias ? wp + (size_t)d * d : NULL;
    float *qkv, *att, *p;
    uint16_t *xb[2];
    void *ak;
    parts(l, saved, n, &qkv, &att, &p, xb, &ak);
    if (!qkv) {   // bf16 only: qkv into the core's keep, att into the projection's
        kern_linear_fwd_kb(&l->lin[0], n * t, x, wqkv, bqkv, ak, xb[0]);
        kern_attention_fwd_kb(&l->attn, n, p, ak, xb[1]);
        kern_linear_fwd_bx(&l->lin[1], n * t, xb[1], wp, bp, y);
        return;
    }
    kern_linear_fwd_kx(&l->lin[0], n * t, x, wqkv, bqkv, qkv, xb[0]);
    kern_attention_fwd_kx(&l->attn, n, qkv, att, p, ak);
    kern_linear_fwd_kx(&l->lin[1], n * t, att, wp, bp, y, xb[1]);
}

static void attention_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                               const void *saved, const float *dy, float *dx, float *dw) {
    int n = r->n, t = l->in.d[0], d = l->cin;
    size_t boff = l->bias ? (size_t)3 * d : 0;
    const float *wqkv = w, *wp = w + (size_t)3 * d * d + boff;
    float *dwqkv = dw, *dbqkv = l->bias ? dw + (size_t)3 * d * d : NULL;
    float *dwp = dw + (size_t)3 * d * d + boff, *dbp = l->bias ? dwp + (size_t)d * d : NULL;
    float *qkv, *att, *p;
    uint16_t *xb[2];
    void *ak;
    parts(l, saved, n, &qkv, &att, &p, xb, &ak);
    float *dqkv = l->scratch, *datt = dqkv + (size_t)l->built_n * per_sample(l, 0);
    kern_linear_bwd_kx(&l->lin[1], n * t, att, xb[1], wp, dy, datt, dwp, dbp, KSET_DX);   /* datt written */
    kern_attention_bwd_kx(&l->attn, n, qkv, p, datt, dqkv, ak);
    kern_linear_bwd_kx(&l->lin[0], n * t, x, xb[0], wqkv, dqkv, dx, dwqkv, dbqkv, l->set & KSET_DX);
}

const LayerOps LAYER_ATTENTION = {
    .name = "attention",
    .parse = attention_parse,
    .build = attention_build,
    .release = attention_release,
    .saved_bytes = attention_saved,
    .sets = KSET_DX,
    .forward = attention_forward,
    .backward = attention_backward,
};
