/* transformer_ref.c: the naive reference twins of the transformer kernels (transformer.c):
 * loops that read like the math, accumulating in double, libm's exp/tanh/erf. Oracles for
 * the fast versions (tests/test_nn_transformer.c, test_kernels_vs_ref) and checked themselves against
 * PyTorch through the layer tests. */
#include <math.h>
#include <string.h>

#include "kernels.h"

#define PI_D 3.14159265358979323846

void kern_embed_fwd_ref(const float *tok, const float *w, const float *pos, float *y, int n, int t, int d, int v) {
    for (int i = 0; i < n; i++)
        for (int s = 0; s < t; s++) {
            int id = (int)tok[i * t + s];
            PD_ASSERT(id >= 0 && id < v);
            for (int k = 0; k < d; k++)
                y[((size_t)i * t + s) * d + k] = w[(size_t)id * d + k] + (pos ? pos[(size_t)s * d + k] : 0.0f);
        }
}

void kern_embed_bwd_ref(const float *tok, const float *dy, float *dw, float *dpos, int n, int t, int d, int v) {
    for (int i = 0; i < n; i++)
        for (int s = 0; s < t; s++)
            for (int k = 0; k < d; k++) {
                float g = dy[((size_t)i * t + s) * d + k];
                if (dw) dw[(size_t)(int)tok[i * t + s] * d + k] += g;
                if (dpos) dpos[(size_t)s * d + k] += g;
            }
}

/* saved: mean (rows) then biased variance (rows) */
void kern_layernorm_fwd_ref(const float *x, const float *g, const float *b, float *y, float *saved, int rows, int d,
                            float eps) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * d;
        double mean = 0, var = 0;
        for (int k = 0; k < d; k++) mean += xr[k];
        mean /= d;
        for (int k = 0; k < d; k++) var += (xr[k] - mean) * (xr[k] - mean);
        var /= d;
        double rstd = 1.0 / sqrt(var + eps);
        for (int k = 0; k < d; k++) y[(size_t)r * d + k] = (float)((xr[k] - mean) * rstd * g[k] + b[k]);
        if (saved) {
            saved[r] = (float)mean;
            saved[rows + r] = (float)var;
        }
    }
}

void kern_layernorm_bwd_ref(const float *x, const float *g, const float *saved, const float *dy, float *dx,
                            float *dg, float *db, int rows, int d, float eps) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * d, *gr = dy + (size_t)r * d;
        double mean = saved[r], rstd = 1.0 / sqrt((double)saved[rows + r] + eps), a = 0, c = 0;
        for (int k = 0; k < d; k++) {
            double xh = (xr[k] - mean) * rstd;
            a += (double)gr[k] * g[k];
            c += (double)gr[k] * g[k] * xh;
            if (dg) dg[k] += (float)(gr[k] * xh);
            if (db) db[k] += gr[k];
        }
        a /= d;
        c /= d;
        if (dx)
            for (int k = 0; k < d; k++) {
                double xh = (xr[k] - mean) * rstd;
                dx[(size_t)r * d + k] += (float)(rstd * ((double)gr[k] * g[k] - a - xh * c));
            }
    }
}

void kern_gelu_fwd_ref(const float *x, float *y, size_t count, int tanh_approx) {
    for (size_t i = 0; i < count; i++) {
        double v = x[i];
        y[i] = tanh_approx ? (float)(0.5 * v * (1.0 + tanh(sqrt(2.0 / PI_D) * (v + 0.044715 * v * v * v))))
                           : (float)(0.5 * v * (1.0 + erf(v / sqrt(2.0))));
    }
}

void kern_gelu_bwd_ref(const float *x, const float *dy, float *dx, size_t count, int tanh_approx) {
    for (size_t i = 0; i < count; i++) {
        double v = x[i], d;
        if (tanh_approx) {
            double c = sqrt(2.0 / PI_D), th = tanh(c * (v + 0.044715 * v * v * v));
            d = 0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * c * (1.0 + 3.0 * 0.044715 * v * v);
        } else {
            d = 0.5 * (1.0 + erf(v / sqrt(2.0))) + v * exp(-0.5 * v * v) / sqrt(2.0 * PI_D);
        }
        dx[i] += (float)(dy[i] * d);
    }
}

/* qkv (N, T, 3D) = [q | k | v], head h uses columns h*hd .. h*hd + hd of each. */
void kern_attention_fwd_ref(const float *qkv, float *y, float *p, int n, int t, int heads, int hd, int causal) {
    const int d = heads * hd;
    const double scale = 1.0 / sqrt((double)hd);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++) {
            float *ph = p + ((size_t)i * heads + h) * t * t;
            for (int r = 0; r < t; r++) {
                const float *q = qkv + ((size_t)i * t + r) * 3 * d + h * hd;
                double m = -INFINITY, s = 0, sc[4096];
                PD_ASSERT(t <= 4096);
                for (int j = 0; j < t; j++) {
                    if (causal && j > r) continue;
                    const float *k = qkv + ((size_t)i * t + j) * 3 * d + d + h * hd;
                    double dot = 0;
                    for (int e = 0; e < hd; e++) dot += (double)q[e] * k[e];
                    sc[j] = dot * scale;
                    if (sc[j] > m) m = sc[j];
                }
                for (int j = 0; j < t; j++)
                    if (!(causal && j > r)) s += exp(sc[j] - m);
                for (int j = 0; j < t; j++) ph[(size_t)r * t + j] = causal && j > r ? 0.0f : (float)(exp(sc[j] - m) / s);
                for (int e = 0; e < hd; e++) {
                    double o = 0;
                    for (int j = 0; j < t; j++)
                        o += (double)ph[(size_t)r * t + j] * qkv[((size_t)i * t + j) * 3 * d + 2 * d + h * hd + e];
                    y[((size_t)i * t + r) * d + h * hd + e] = (float)o;
                }
            }
        }
}

void kern_attention_bwd_ref(const float *qkv, const float *p, const float *dy, float *dqkv, float *scratch, int n,
                            int t, int heads, int hd, int causal) {
    const int d = heads * hd, ld = 3 * d;
    const double scale = 1.0 / sqrt((double)hd);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++) {
            const float *ph = p + ((size_t)i * heads + h) * t * t;
#define Q(r, e) qkv[((size_t)i * t + (r)) * ld + h * hd + (e)]
#define K(r, e) qkv[((size_t)i * t + (r)) * ld + d + h * hd + (e)]
#define V(r, e) qkv[((size_t)i * t + (r)) * ld + 2 * d + h * hd + (e)]
#define DQ(r, e) dqkv[((size_t)i * t + (r)) * ld + h * hd + (e)]
#define DK(r, e) dqkv[((size_t)i * t + (r)) * ld + d + h * hd + (e)]
#define DV(r, e) dqkv[((size_t)i * t + (r)) * ld + 2 * d + h * hd + (e)]
#define DY(r, e) dy[((size_t)i * t + (r)) * d + h * hd + (e)]
            for (int r = 0; r < t; r++) {   // dS row r = P * (dP - sum(P dP)), dP = dO V^T
                double dp[4096], s = 0;
                for (int j = 0; j < t; j++) {
                    dp[j] = 0;
                    for (int e = 0; e < hd; e++) dp[j] += (double)DY(r, e) * V(j, e);
                    s += ph[(size_t)r * t + j] * dp[j];
                }
                for (int j = 0; j < t; j++) scratch[(size_t)r * t + j] = (float)(ph[(size_t)r * t + j] * (dp[j] - s));
            }
            (void)causal;   // masked entries have P = 0, so dS = 0 there
            for (int j = 0; j < t; j++)
                for (int e = 0; e < hd; e++) {
                    double dv = 0, dk = 0, dq = 0;
                    for (int r = 0; r < t; r++) {
                        dv += (double)ph[(size_t)r * t + j] * DY(r, e);
                        dk += (double)scratch[(size_t)r * t + j] * Q(r, e);
                        dq += (double)scratch[(size_t)j * t + r] * K(r, e);
                    }
                    DV(j, e) = (float)dv;
                    DK(j, e) = (float)(dk * scale);
                    DQ(j, e) = (float)(dq * scale);
                }
#undef Q
#undef K
#undef V
#undef DQ
#undef DK
#undef DV
#undef DY
        }
}
