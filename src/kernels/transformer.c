/* transformer.c: the fast versions of the transformer kernels: token/position embedding,
 * layer norm, GELU, causal multi-head attention, and a vectorisable expf (kern_expf_vec).
 * The naive twins are in transformer_ref.c.
 *
 * Implementation choices (measured on the gpt-mini shapes, 1 thread, see
 * docs/transformer.md):
 *   - attention: per (sample, head) OpenBLAS sgemm calls on strided views of the fused qkv
 *     buffer (no transposes or copies), the softmax fused in between, causal rows only up to
 *     the diagonal;
 *   - layer norm, GELU, softmax: plain C loops that gcc -O2 -march=native vectorises, with
 *     exp computed by a polynomial (kern_expf_vec, within 2 ulp of expf) because libm's
 *     expf/tanhf calls are not vectorised without -ffast-math.
 * Nothing is threaded except the sgemm calls (OpenBLAS's threads); every reduction runs in a
 * fixed order, so results are bitwise reproducible for a given thread count. */
/* gcc -O2's "very cheap" vectoriser cost model vectorises none of these loops (trip counts
 * unknown at compile time); the dynamic model does, with identical results (no reassociation:
 * reductions stay scalar; -std=c11 keeps fp-contract off). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif
#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <string.h>

#include "kernels.h"

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
void kern_layernorm_fwd(const float *x, const float *g, const float *b, float *y, float *saved, int rows, int d,
                        float eps) {
    const float inv_d = 1.0f / (float)d;
    for (int r = 0; r < rows; r++) {
        const float *restrict xr = x + (size_t)r * d;
        float *restrict yr = y + (size_t)r * d;
        float s = 0;
        for (int k = 0; k < d; k++) s += xr[k];
        const float mean = s * inv_d;
        float q = 0;
        for (int k = 0; k < d; k++) {
            float c = xr[k] - mean;
            q += c * c;
        }
        const float rstd = 1.0f / sqrtf(q * inv_d + eps);
        for (int k = 0; k < d; k++) yr[k] = (xr[k] - mean) * rstd * g[k] + b[k];
        if (saved) {
            saved[2 * (size_t)r] = mean;
            saved[2 * (size_t)r + 1] = rstd;
        }
    }
}

void kern_layernorm_bwd(const float *x, const float *g, const float *saved, const float *dy, float *dx, float *dg,
                        float *db, int rows, int d) {
    const float inv_d = 1.0f / (float)d;
    for (int r = 0; r < rows; r++) {
        const float *restrict xr = x + (size_t)r * d, *restrict gr = dy + (size_t)r * d;
        const float mean = saved[2 * (size_t)r], rstd = saved[2 * (size_t)r + 1];
        float a = 0, c = 0;   // mean of dxhat and of dxhat * xhat
        for (int k = 0; k < d; k++) {
            float xh = (xr[k] - mean) * rstd, dxh = gr[k] * g[k];
            a += dxh;
            c += dxh * xh;
            if (dg) dg[k] += gr[k] * xh;
            if (db) db[k] += gr[k];
        }
        a *= inv_d;
        c *= inv_d;
        if (dx) {
            float *restrict dr = dx + (size_t)r * d;
            for (int k = 0; k < d; k++) {
                float xh = (xr[k] - mean) * rstd;
                dr[k] += rstd * (gr[k] * g[k] - a - xh * c);
            }
        }
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

void kern_gelu_bwd(const float *restrict x, const float *restrict dy, float *restrict dx, size_t count,
                   int tanh_approx) {
    if (tanh_approx) {
        for (size_t i = 0; i < count; i++) {
            float v = x[i], v2 = v * v, u = GELU_C * (v + GELU_A * v2 * v);
            float s = 1.0f / (1.0f + expf_vec(-2.0f * u));   // sigmoid(2u) = (1 + tanh u) / 2
            float du = GELU_C * (1.0f + 3.0f * GELU_A * v2);
            dx[i] += dy[i] * (s + v * 2.0f * s * (1.0f - s) * du);
        }
    } else {
        for (size_t i = 0; i < count; i++) {
            float v = x[i];
            float cdf = 0.5f * (1.0f + erff(v * 0.7071067811865476f));
            float pdf = 0.3989422804014327f * expf(-0.5f * v * v);
            dx[i] += dy[i] * (cdf + v * pdf);
        }
    }
}

/* ---- causal multi-head self-attention ----------------------------------------------------------- */
/* Row-major C = alpha op(A) op(B) + beta C through oneDNN's sgemm (JIT for the CPU found). */
static void gemm(char ta, char tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                 float beta, float *c, int ldc) {
    dnnl_status_t s = dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    PD_ASSERTF(s == dnnl_success, "dnnl_sgemm(%c, %c, %d, %d, %d): status %d", ta, tb, m, n, k, (int)s);
}

size_t kern_attention_scratch_floats(int t) { return (size_t)t * t; }

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

void kern_attention_fwd(const float *qkv, float *y, float *p, int n, int t, int heads, int hd, int causal) {
    const int d = heads * hd, ld = 3 * d;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++) {
            const float *q = qkv + (size_t)i * t * ld + (size_t)h * hd, *k = q + d, *v = q + 2 * d;
            float *ph = p + ((size_t)i * heads + h) * t * t;
            gemm('N', 'T', t, t, hd, scale, q, ld, k, ld, 0.0f, ph, t);
            for (int r = 0; r < t; r++) softmax_row(ph + (size_t)r * t, causal ? r + 1 : t, t);
            gemm('N', 'N', t, hd, t, 1.0f, ph, t, v, ld, 0.0f,
                        y + (size_t)i * t * d + (size_t)h * hd, d);
        }
}

void kern_attention_bwd(const float *qkv, const float *p, const float *dy, float *dqkv, float *scratch, int n, int t,
                        int heads, int hd, int causal) {
    const int d = heads * hd, ld = 3 * d;
    const float scale = 1.0f / sqrtf((float)hd);
    float *ds = scratch;   // (t, t): dP, then dS in place
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++) {
            const size_t off = (size_t)i * t * ld + (size_t)h * hd;
            const float *q = qkv + off, *k = q + d, *v = q + 2 * d;
            float *dq = dqkv + off, *dk = dq + d, *dv = dq + 2 * d;
            const float *ph = p + ((size_t)i * heads + h) * t * t, *go = dy + (size_t)i * t * d + (size_t)h * hd;
            gemm('N', 'T', t, t, hd, 1.0f, go, d, v, ld, 0.0f, ds, t);
            gemm('T', 'N', t, hd, t, 1.0f, ph, t, go, d, 1.0f, dv, ld);
            for (int r = 0; r < t; r++) {
                const int len = causal ? r + 1 : t;
                const float *restrict pr = ph + (size_t)r * t;
                float *restrict dr = ds + (size_t)r * t;
                float s = 0;
                for (int j = 0; j < len; j++) s += pr[j] * dr[j];
                for (int j = 0; j < len; j++) dr[j] = pr[j] * (dr[j] - s);
                for (int j = len; j < t; j++) dr[j] = 0.0f;
            }
            gemm('N', 'N', t, hd, t, scale, ds, t, k, ld, 1.0f, dq, ld);
            gemm('T', 'N', t, hd, t, scale, ds, t, q, ld, 1.0f, dk, ld);
        }
}
