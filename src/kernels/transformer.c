/* transformer.c: the fast versions of the transformer kernels: token/position embedding,
 * layer norm, GELU, causal multi-head attention, and a vectorisable expf (kern_expf_vec).
 * The naive twins are in transformer_ref.c, the oneDNN primitives in transformer_dnnl.c.
 *
 * Layer norm and attention are descriptors with two algorithms (KTF_LOOPS: C loops and
 * per-(sample, head) sgemm calls; KTF_DNNL: oneDNN primitives); KTF_AUTO picks the measured
 * faster one, oneDNN for both. Measured on the gpt-mini shapes, 1 thread, CPU time per call
 * (AMD EPYC, AVX-512; best of 30):
 *     layer norm (2048 rows, 128):          loops fwd 58 us, bwd 226 us;   oneDNN 52, 124
 *     attention (32 x 64 tokens, 4 x 32):   loops fwd 1090 us, bwd 1300 us; oneDNN 920, 1210
 * oneDNN attention: six matmul primitives over all (sample, head) pairs at once on strided
 * views of the fused qkv buffer (no copies; oneDNN runs them as its jit gemm per pair), the
 * softmax one primitive over all rows with the causal entries set to -inf. Per-(sample, head)
 * dnnl_sgemm calls were ~10% faster on attention (~0.5% of a gpt-mini step), OpenBLAS's
 * Haswell kernel 1.3-2x slower. Note: oneDNN's gemm (sgemm and the matmul's gemm:jit) takes
 * its packing buffer from malloc on every call (~70 KB; glibc reuses the block, no page
 * faults); nothing of ours allocates after init. Dense head-major copies would get oneDNN's
 * brgemm matmul (scratchpad only), at the cost of the copies.
 * GELU and the loops' softmax use a polynomial exp (kern_expf_vec) because libm's calls are
 * not vectorised without -ffast-math. Nothing here starts threads except oneDNN (its OpenMP
 * team, kern_set_threads); every reduction runs in a fixed order, so results are bitwise
 * reproducible for a given thread count. */
/* gcc -O2's "very cheap" vectoriser cost model vectorises none of these loops (trip counts
 * unknown at compile time); the dynamic model does, with identical results (no reassociation:
 * reductions stay scalar; -std=c11 keeps fp-contract off). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif
#include <math.h>
#include <string.h>

#include "transformer_impl.h"

/* exp(x) for x in [-87.3, 88.3] (clamped outside): Cody-Waite range reduction x = k ln2 + r,
 * |r| <= ln2/2, a degree-6 polynomial for e^r (Cephes' expf coefficients), 2^k by exponent
 * bits. Written without branches or libm calls so loops over it vectorise. */
static inline float expf_vec(float x) {
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.3f ? 88.3f : x;
    const float magic = 12582912.0f;   // 1.5 * 2^23: adding it rounds to an integer
    float k = (x * 1.44269504088896341f + magic) - magic;
    float r = x - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    float p = 1.9875691500E-4f;
    p = p * r + 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)k + 127) << 23;
    float s;
    memcpy(&s, &e, sizeof s);
    return p * s;
}

float kern_expf_vec(float x) { return expf_vec(x); }

/* ---- embedding ------------------------------------------------------------------------- */
void kern_embed_fwd(const float *tok, const float *w, const float *pos, float *y, int n, int t, int d, int v) {
    for (int i = 0; i < n; i++)
        for (int s = 0; s < t; s++) {
            int id = (int)tok[(size_t)i * t + s];
            PD_ASSERTF(id >= 0 && id < v && (float)id == tok[(size_t)i * t + s], "token %g not in [0, %d)",
                       (double)tok[(size_t)i * t + s], v);
            float *restrict yr = y + ((size_t)i * t + s) * d;
            const float *restrict wr = w + (size_t)id * d;
            if (pos) {
                const float *restrict pr = pos + (size_t)s * d;
                for (int k = 0; k < d; k++) yr[k] = wr[k] + pr[k];
            } else {
                memcpy(yr, wr, (size_t)d * sizeof(float));
            }
        }
}

void kern_embed_bwd(const float *tok, const float *dy, float *dw, float *dpos, int n, int t, int d, int v) {
    for (int i = 0; i < n; i++)
        for (int s = 0; s < t; s++) {
            const float *restrict g = dy + ((size_t)i * t + s) * d;
            if (dw) {
                float *restrict wr = dw + (size_t)(int)tok[(size_t)i * t + s] * d;
                for (int k = 0; k < d; k++) wr[k] += g[k];
            }
            if (dpos) {
                float *restrict pr = dpos + (size_t)s * d;
                for (int k = 0; k < d; k++) pr[k] += g[k];
            }
        }
}

/* ---- layer norm -------------------------------------------------------------------------- */
typedef struct LnImpl {
    TfDnnl *dnnl;
    float *scratch;   /* dnnl: mean, var (eval), dx (rows_max, d), dg, db (d each) */
    float *rowbuf;    /* loops: 3 rows of d */
} LnImpl;

size_t kern_layernorm_saved_floats(int rows) { return 2 * (size_t)rows; }

int kern_layernorm_init(KLayerNorm *k, int algo, int rows_max, int d, float eps, Err *err) {
    memset(k, 0, sizeof *k);
    k->rows_max = rows_max;
    k->d = d;
    k->eps = eps;
    k->algo = algo == KTF_AUTO ? KTF_DNNL : algo;   // measured: see the file comment
    LnImpl *im = pd_calloc(sizeof *im);
    k->impl = im;
    im->rowbuf = pd_alloc_f32(3 * (size_t)d);
    if (k->algo == KTF_DNNL) {
        int rc = tf_dnnl_layernorm_new(&im->dnnl, rows_max, d, eps, err);
        if (rc) {
            kern_layernorm_release(k);
            return rc;
        }
        im->scratch = pd_alloc_f32(2 * (size_t)rows_max + (size_t)rows_max * d + 2 * (size_t)d);
    }
    return PD_OK;
}

void kern_layernorm_release(KLayerNorm *k) {
    LnImpl *im = k->impl;
    if (im) {
        tf_dnnl_free(im->dnnl);
        pd_free(im->scratch);
        pd_free(im->rowbuf);
        pd_free(im);
    }
    k->impl = NULL;
}

/* Sum of a[0 .. n) in 16 interleaved partial sums (a fixed order, so deterministic; and
 * vectorisable where one running sum is not). */
static inline float sum16(const float *restrict a, int n) {
    float p[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) p[j] += a[i + j];
    float s = 0;
    for (int j = 0; j < 16; j++) s += p[j];
    for (; i < n; i++) s += a[i];
    return s;
}

void kern_layernorm_fwd(KLayerNorm *k, int rows, const float *x, const float *g, const float *b, float *y,
                        float *saved) {
    PD_ASSERTF(rows <= k->rows_max, "layernorm: %d rows, built for %d", rows, k->rows_max);
    const int d = k->d;
    LnImpl *im = k->impl;
    if (k->algo == KTF_DNNL) {
        float *mean = saved ? saved : im->scratch, *var = mean + rows;
        tf_dnnl_layernorm_fwd(im->dnnl, rows, x, g, b, y, mean, var);
        return;
    }
    const float inv_d = 1.0f / (float)d;
    for (int r = 0; r < rows; r++) {
        const float *restrict xr = x + (size_t)r * d;
        float *restrict yr = y + (size_t)r * d;
        const float mean = sum16(xr, d) * inv_d;
        for (int c = 0; c < d; c++) yr[c] = (xr[c] - mean) * (xr[c] - mean);   // y as scratch
        const float var = sum16(yr, d) * inv_d, rstd = 1.0f / sqrtf(var + k->eps);
        for (int c = 0; c < d; c++) yr[c] = (xr[c] - mean) * rstd * g[c] + b[c];
        if (saved) {
            saved[r] = mean;
            saved[rows + r] = var;
        }
    }
}

void kern_layernorm_bwd(KLayerNorm *k, int rows, const float *x, const float *g, const float *saved, const float *dy,
                        float *dx, float *dg, float *db) {
    PD_ASSERTF(rows <= k->rows_max, "layernorm: %d rows, built for %d", rows, k->rows_max);
    const int d = k->d;
    LnImpl *im = k->impl;
    if (k->algo == KTF_DNNL) {   // oneDNN writes; our contract accumulates
        float *sdx = im->scratch + 2 * (size_t)k->rows_max, *sdg = sdx + (size_t)k->rows_max * d, *sdb = sdg + d;
        tf_dnnl_layernorm_bwd(im->dnnl, rows, x, g, saved, saved + rows, dy, sdx, sdg, sdb);
        if (dx)
            for (size_t i = 0; i < (size_t)rows * d; i++) dx[i] += sdx[i];
        for (int c = 0; c < d; c++) {
            if (dg) dg[c] += sdg[c];
            if (db) db[c] += sdb[c];
        }
        return;
    }
    const float inv_d = 1.0f / (float)d;
    float *restrict xh = im->rowbuf, *restrict gx = xh + d, *restrict pr = gx + d;   // xhat, dy g, dy g xhat
    for (int r = 0; r < rows; r++) {
        const float *restrict xr = x + (size_t)r * d, *restrict gr = dy + (size_t)r * d;
        const float mean = saved[r], rstd = 1.0f / sqrtf(saved[rows + r] + k->eps);
        for (int c = 0; c < d; c++) {
            xh[c] = (xr[c] - mean) * rstd;
            gx[c] = gr[c] * g[c];
            pr[c] = gx[c] * xh[c];
        }
        if (dg)
            for (int c = 0; c < d; c++) dg[c] += gr[c] * xh[c];
        if (db)
            for (int c = 0; c < d; c++) db[c] += gr[c];
        if (!dx) continue;
        const float a = sum16(gx, d) * inv_d, cm = sum16(pr, d) * inv_d;
        float *restrict dr = dx + (size_t)r * d;
        for (int c = 0; c < d; c++) dr[c] += rstd * (gx[c] - a - xh[c] * cm);
    }
}

/* ---- GELU ---------------------------------------------------------------------------------- */
#define GELU_C 0.7978845608028654f   // sqrt(2 / pi)
#define GELU_A 0.044715f

/* tanh form: 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = c (x + a x^3) */
void kern_gelu_fwd(const float *restrict x, float *restrict y, size_t count, int tanh_approx) {
    if (tanh_approx) {
        for (size_t i = 0; i < count; i++) {
            float v = x[i], u = GELU_C * (v + GELU_A * v * v * v);
            y[i] = v / (1.0f + expf_vec(-2.0f * u));
        }
    } else {
        for (size_t i = 0; i < count; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.7071067811865476f));
    }
}

/* d gelu(v) / dv, both forms */
static inline float gelu_grad_tanh(float v) {
    float v2 = v * v, u = GELU_C * (v + GELU_A * v2 * v);
    float s = 1.0f / (1.0f + expf_vec(-2.0f * u));   // sigmoid(2u) = (1 + tanh u) / 2
    float du = GELU_C * (1.0f + 3.0f * GELU_A * v2);
    return s + v * 2.0f * s * (1.0f - s) * du;
}
static inline float gelu_grad_erf(float v) {
    float cdf = 0.5f * (1.0f + erff(v * 0.7071067811865476f));
    float pdf = 0.3989422804014327f * expf(-0.5f * v * v);
    return cdf + v * pdf;
}

void kern_gelu_bwd(const float *restrict x, const float *restrict dy, float *restrict dx, size_t count,
                   int tanh_approx, int set) {
    if (tanh_approx && set)   /* set: written as onto zeros, dx not read */
        for (size_t i = 0; i < count; i++) dx[i] = 0.0f + dy[i] * gelu_grad_tanh(x[i]);
    else if (tanh_approx)
        for (size_t i = 0; i < count; i++) dx[i] += dy[i] * gelu_grad_tanh(x[i]);
    else if (set)
        for (size_t i = 0; i < count; i++) dx[i] = 0.0f + dy[i] * gelu_grad_erf(x[i]);
    else
        for (size_t i = 0; i < count; i++) dx[i] += dy[i] * gelu_grad_erf(x[i]);
}

/* ---- causal multi-head self-attention ----------------------------------------------------------- */
/* Row-major C = alpha op(A) op(B) + beta C: kern_sgemm (oneDNN's sgemm). */
#define gemm kern_sgemm

typedef struct AttnImpl {
    TfDnnl *softmax;  /* KTF_DNNL: softmax primitives over (n * heads * T, T) */
    TfAttn *mm;       /* KTF_DNNL: batched matmuls */
    float *ds;        /* backward: dP then dS, (T, T) per (sample, head) for loops, all of them for dnnl */
} AttnImpl;

int kern_attention_init(KAttn *a, int algo, int n_max, int t, int heads, int hd, int causal, Err *err) {
    return kern_attention_init_prec(a, algo, KPREC_FP32, n_max, t, heads, hd, causal, err);
}

/* bf16: bytes of KSCR_BF16 for n samples: qkv (n, T, 3D), dy (n, T, D), then P or dS (n, H, T, T) */
static size_t attn_bf16_bytes(const KAttn *a, int n) {
    const size_t d = (size_t)a->heads * a->hd, r = (size_t)n * a->t;
    return ((r * 3 * d * 2 + 63) / 64 + (r * d * 2 + 63) / 64) * 64 + r * a->heads * a->t * 2 + 128;
}

typedef struct AttnBf16 {
    uint16_t *qkv, *dy, *p;
} AttnBf16;

static AttnBf16 attn_bf16(const KAttn *a, int n) {
    const size_t d = (size_t)a->heads * a->hd, r = (size_t)n * a->t;
    char *b = kern_scratch(KSCR_BF16, attn_bf16_bytes(a, a->n_max));
    b += (64 - (uintptr_t)b % 64) % 64;
    AttnBf16 s;
    s.qkv = (uint16_t *)b;
    b += (r * 3 * d * 2 + 63) / 64 * 64;
    s.dy = (uint16_t *)b;
    b += (r * d * 2 + 63) / 64 * 64;
    s.p = (uint16_t *)b;
    return s;
}

int kern_attention_init_prec(KAttn *a, int algo, int prec, int n_max, int t, int heads, int hd, int causal,
                             Err *err) {
    PD_ASSERTF(prec >= 0 && prec < KPREC_COUNT, "precision %d", prec);
    memset(a, 0, sizeof *a);
    *a = (KAttn){.n_max = n_max, .t = t, .heads = heads, .hd = hd, .causal = causal};
    if (kern_precision_check(prec, err)) return PD_EINVAL;
    a->algo = algo == KTF_AUTO ? KTF_DNNL : algo;   // measured: see the file comment
    a->prec = a->algo == KTF_DNNL ? prec : KPREC_FP32;
    AttnImpl *im = pd_calloc(sizeof *im);
    a->impl = im;
    size_t per = (size_t)t * t;
    if (a->algo == KTF_DNNL) {
        int rc = tf_dnnl_softmax_new(&im->softmax, n_max * heads * t, t, err);
        if (!rc) rc = tf_dnnl_attn_new(&im->mm, n_max, t, heads, hd, a->prec == KPREC_BF16, err);
        if (!rc && a->prec == KPREC_BF16) kern_scratch(KSCR_BF16, attn_bf16_bytes(a, n_max));   // grown at build time
        if (rc) {
            kern_attention_release(a);
            return rc;
        }
        im->ds = pd_alloc_f32((size_t)n_max * heads * per);
    } else {
        im->ds = pd_alloc_f32(per);
    }
    return PD_OK;
}

void kern_attention_release(KAttn *a) {
    AttnImpl *im = a->impl;
    if (im) {
        tf_dnnl_free(im->softmax);
        tf_dnnl_attn_free(im->mm);
        pd_free(im->ds);
        pd_free(im);
    }
    a->impl = NULL;
}

/* Softmax of row p[0 .. len) in place; p[len .. t) = 0. */
static inline void softmax_row(float *restrict p, int len, int t) {
    float m = p[0];
    for (int j = 1; j < len; j++) m = p[j] > m ? p[j] : m;
    for (int j = 0; j < len; j++) p[j] = expf_vec(p[j] - m);   // vectorised
    float s = 0;
    for (int j = 0; j < len; j++) s += p[j];
    const float inv = 1.0f / s;
    for (int j = 0; j < len; j++) p[j] *= inv;
    for (int j = len; j < t; j++) p[j] = 0.0f;
}

/* The kept copies' layout: qkv (n, T, 3D) in bf16, then P (n, H, T, T) in bf16. */
static size_t keep_qkv_bytes(int n, int t, int heads, int hd) {
    return ((size_t)n * t * 3 * heads * hd * 2 + 63) / 64 * 64;
}

size_t kern_attention_keep_bytes(int prec, int n, int t, int heads, int hd) {
    if (prec != KPREC_BF16) return 0;
    return keep_qkv_bytes(n, t, heads, hd) + (size_t)n * heads * t * t * 2;
}

void kern_attention_fwd(KAttn *a, int n, const float *qkv, float *y, float *p) {
    kern_attention_fwd_kx(a, n, qkv, y, p, NULL);
}

/* The causal mask on n samples' scores (n, heads, T, T): -inf above the diagonal. */
static void mask_scores(const KAttn *a, int n, float *p) {
    const int t = a->t;
    for (size_t m = 0; m < (size_t)n * a->heads; m++)
        for (int i = 0; i < t; i++) {
            float *row = p + (m * t + i) * t;
            for (int j = i + 1; j < t; j++) row[j] = -INFINITY;
        }
}

/* The bf16 forward from qkv's bf16 copy (b.qkv): scores, mask and softmax in float32 (p), P's
 * copy into b.p, then the values into y (float32), or into yb as bf16 where given. */
static void attn_fwd_bf16(KAttn *a, int n, AttnBf16 b, float *y, uint16_t *yb, float *p) {
    const int t = a->t, heads = a->heads, d = heads * a->hd;
    AttnImpl *im = a->impl;
    tf_dnnl_attn_mm(im->mm, TF_MM_SCORES, n, b.qkv, b.qkv + d, p);
    if (a->causal) mask_scores(a, n, p);
    tf_dnnl_softmax_fwd(im->softmax, n * heads * t, p, p);
    kern_f32_to_bf16(p, b.p, (size_t)n * t * heads * t);
    if (yb) tf_dnnl_attn_mm(im->mm, TF_MM_VALUES_B, n, b.p, b.qkv + 2 * d, yb);
    else tf_dnnl_attn_mm(im->mm, TF_MM_VALUES, n, b.p, b.qkv + 2 * d, y);
}

int kern_attention_takes_bf16(const KAttn *a) { return a->impl && a->algo == KTF_DNNL && a->prec == KPREC_BF16; }

void kern_attention_fwd_kb(KAttn *a, int n, float *p, void *keep, uint16_t *yb) {
    PD_ASSERTF(n <= a->n_max, "attention: %d samples, built for %d", n, a->n_max);
    PD_ASSERTF(kern_attention_takes_bf16(a) && keep && yb, "attention: a bf16 forward on float32 products");
    AttnBf16 b = {.qkv = keep, .p = (uint16_t *)((char *)keep + keep_qkv_bytes(n, a->t, a->heads, a->hd))};
    attn_fwd_bf16(a, n, b, NULL, yb, p);
}

void kern_attention_fwd_kx(KAttn *a, int n, const float *qkv, float *y, float *p, void *keep) {
    PD_ASSERTF(n <= a->n_max, "attention: %d samples, built for %d", n, a->n_max);
    const int t = a->t, heads = a->heads, hd = a->hd, d = heads * hd, ld = 3 * d;
    const float scale = 1.0f / sqrtf((float)hd);
    AttnImpl *im = a->impl;
    if (a->algo == KTF_DNNL && a->prec == KPREC_BF16) {
        AttnBf16 b = attn_bf16(a, n);
        if (keep) {   // the bf16 operands go where the backward finds them
            b.qkv = keep;
            b.p = (uint16_t *)((char *)keep + keep_qkv_bytes(n, t, heads, hd));
        }
        kern_f32_to_bf16(qkv, b.qkv, (size_t)n * t * ld);
        attn_fwd_bf16(a, n, b, y, NULL, p);
        return;
    }
    if (a->algo == KTF_DNNL) {
        tf_dnnl_attn_mm(im->mm, TF_MM_SCORES, n, qkv, qkv + d, p);
        if (a->causal) mask_scores(a, n, p);
        tf_dnnl_softmax_fwd(im->softmax, n * heads * t, p, p);
        tf_dnnl_attn_mm(im->mm, TF_MM_VALUES, n, p, qkv + 2 * d, y);
        return;
    }
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++) {
            const float *q = qkv + (size_t)i * t * ld + (size_t)h * hd, *k = q + d, *v = q + 2 * d;
            float *ph = p + ((size_t)i * heads + h) * t * t;
            gemm('N', 'T', t, t, hd, scale, q, ld, k, ld, 0.0f, ph, t);
            for (int r = 0; r < t; r++) softmax_row(ph + (size_t)r * t, a->causal ? r + 1 : t, t);
            gemm('N', 'N', t, hd, t, 1.0f, ph, t, v, ld, 0.0f, y + (size_t)i * t * d + (size_t)h * hd, d);
        }
}

/* dQ = scale dS K, dK = scale dS^T Q for one (sample, head); q points at its q columns. */
static void attn_dqk(const float *q, const float *ds, float *dq, int t, int d, int hd, float scale) {
    const int ld = 3 * d;
    gemm('N', 'N', t, hd, t, scale, ds, t, q + d, ld, 0.0f, dq, ld);
    gemm('T', 'N', t, hd, t, scale, ds, t, q, ld, 0.0f, dq + d, ld);
}

void kern_attention_bwd(KAttn *a, int n, const float *qkv, const float *p, const float *dy, float *dqkv) {
    kern_attention_bwd_kx(a, n, qkv, p, dy, dqkv, NULL);
}

void kern_attention_bwd_kx(KAttn *a, int n, const float *qkv, const float *p, const float *dy, float *dqkv,
                           const void *keep) {
    PD_ASSERTF(n <= a->n_max, "attention: %d samples, built for %d", n, a->n_max);
    const int t = a->t, heads = a->heads, hd = a->hd, d = heads * hd, ld = 3 * d;
    const float scale = 1.0f / sqrtf((float)hd);
    AttnImpl *im = a->impl;
    if (a->algo == KTF_DNNL && a->prec == KPREC_BF16) {   // the same on bf16 copies; dS goes in scratch
        const size_t r = (size_t)n * t;
        AttnBf16 b = attn_bf16(a, n);
        const uint16_t *q16 = b.qkv, *p16 = b.p;
        if (keep) {
            q16 = keep;
            p16 = (const uint16_t *)((const char *)keep + keep_qkv_bytes(n, t, heads, hd));
        } else {
            kern_f32_to_bf16(qkv, b.qkv, r * ld);
            kern_f32_to_bf16(p, b.p, r * heads * t);
        }
        kern_f32_to_bf16(dy, b.dy, r * d);
        tf_dnnl_attn_mm(im->mm, TF_MM_DP, n, b.dy, q16 + 2 * d, im->ds);
        tf_dnnl_attn_mm(im->mm, TF_MM_DV, n, p16, b.dy, dqkv + 2 * d);
        tf_dnnl_softmax_bwd(im->softmax, n * heads * t, p, im->ds, im->ds);
        kern_f32_to_bf16(im->ds, b.p, r * heads * t);
        tf_dnnl_attn_mm(im->mm, TF_MM_DQ, n, b.p, q16 + d, dqkv);
        tf_dnnl_attn_mm(im->mm, TF_MM_DK, n, b.p, q16, dqkv + d);
        return;
    }
    if (a->algo == KTF_DNNL) {   // dP = dY V^T, dV = P^T dY, dS = softmax'(dP), dQ, dK
        tf_dnnl_attn_mm(im->mm, TF_MM_DP, n, dy, qkv + 2 * d, im->ds);
        tf_dnnl_attn_mm(im->mm, TF_MM_DV, n, p, dy, dqkv + 2 * d);
        tf_dnnl_softmax_bwd(im->softmax, n * heads * t, p, im->ds, im->ds);
        tf_dnnl_attn_mm(im->mm, TF_MM_DQ, n, im->ds, qkv + d, dqkv);
        tf_dnnl_attn_mm(im->mm, TF_MM_DK, n, im->ds, qkv, dqkv + d);
        return;
    }
    float *ds = im->ds;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++) {   // dP = dO V^T, dV = P^T dO; dS = P (dP - rowsum(P dP))
            const size_t off = (size_t)i * t * ld + (size_t)h * hd;
            const float *v = qkv + off + 2 * d, *ph = p + ((size_t)i * heads + h) * t * t,
                        *go = dy + (size_t)i * t * d + (size_t)h * hd;
            gemm('N', 'T', t, t, hd, 1.0f, go, d, v, ld, 0.0f, ds, t);
            gemm('T', 'N', t, hd, t, 1.0f, ph, t, go, d, 0.0f, dqkv + off + 2 * d, ld);
            for (int r = 0; r < t; r++) {
                const int len = a->causal ? r + 1 : t;
                const float *restrict pr = ph + (size_t)r * t;
                float *restrict dr = ds + (size_t)r * t;
                float s = 0;
                for (int j = 0; j < len; j++) s += pr[j] * dr[j];
                for (int j = 0; j < len; j++) dr[j] = pr[j] * (dr[j] - s);
                for (int j = len; j < t; j++) dr[j] = 0.0f;
            }
            attn_dqk(qkv + off, ds, dqkv + off, t, d, hd, scale);
        }
}
