/* kern_ref.c: the naive reference twin kern_*_ref of every kernel in kernels.h: plain
 * loops that read like the math, kept forever as the oracle of the fast versions (and
 * checked themselves against finite differences in tests/test_kernels*.c). Accumulations
 * that feed a result use double where it is free, so the reference is the more accurate
 * side of a comparison. Speed is not a goal here; nothing in this file is called by the
 * fast kernels. */
#include <math.h>
#include <string.h>

#include "kernels.h"

/* ---- linear -------------------------------------------------------------------------- */
void kern_linear_fwd_ref(const float *x, const float *w, const float *b, float *y, int n, int in, int out) {
    for (int i = 0; i < n; i++)             // x (N, I), w (O, I), y (N, O)
        for (int o = 0; o < out; o++) {
            double s = b ? b[o] : 0.0;
            for (int k = 0; k < in; k++) s += (double)x[(size_t)i * in + k] * w[(size_t)o * in + k];
            y[(size_t)i * out + o] = (float)s;
        }
}

void kern_linear_bwd_ref(const float *x, const float *w, const float *dy, float *dx, float *dw, float *db,
                         int n, int in, int out) {
    if (dx)
        for (int i = 0; i < n; i++)
            for (int k = 0; k < in; k++) {
                double s = 0;
                for (int o = 0; o < out; o++) s += (double)dy[(size_t)i * out + o] * w[(size_t)o * in + k];
                dx[(size_t)i * in + k] += (float)s;
            }
    if (dw)
        for (int o = 0; o < out; o++)
            for (int k = 0; k < in; k++) {
                double s = 0;
                for (int i = 0; i < n; i++) s += (double)dy[(size_t)i * out + o] * x[(size_t)i * in + k];
                dw[(size_t)o * in + k] += (float)s;
            }
    if (db)
        for (int o = 0; o < out; o++) {
            double s = 0;
            for (int i = 0; i < n; i++) s += dy[(size_t)i * out + o];
            db[o] += (float)s;
        }
}

/* ---- conv2d -------------------------------------------------------------------------- */
void kern_conv2d_fwd_ref(const KConv *cv, int n, const float *x, const float *w, const float *b, float *y) {
    const int C = cv->c, H = cv->h, W = cv->w, K = cv->k, R = cv->r, S = cv->s, OH = cv->oh, OW = cv->ow;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < K; k++)
            for (int oy = 0; oy < OH; oy++)
                for (int ox = 0; ox < OW; ox++) {
                    double s = (cv->has_bias && b) ? b[k] : 0.0;
                    for (int c = 0; c < C; c++)
                        for (int r = 0; r < R; r++) {
                            int iy = oy * cv->stride - cv->pad + r;
                            if (iy < 0 || iy >= H) continue;
                            for (int q = 0; q < S; q++) {
                                int ix = ox * cv->stride - cv->pad + q;
                                if (ix < 0 || ix >= W) continue;
                                s += (double)x[(((size_t)i * C + c) * H + iy) * W + ix] *
                                     w[(((size_t)k * C + c) * R + r) * S + q];
                            }
                        }
                    float v = (float)s;
                    if (cv->fuse_relu && v < 0) v = 0;
                    y[(((size_t)i * K + k) * OH + oy) * OW + ox] = v;
                }
}

void kern_conv2d_bwd_ref(const KConv *cv, int n, const float *x, const float *w, const float *y,
                         const float *dy, float *dx, float *dw, float *db) {
    const int C = cv->c, H = cv->h, W = cv->w, K = cv->k, R = cv->r, S = cv->s, OH = cv->oh, OW = cv->ow;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < K; k++)
            for (int oy = 0; oy < OH; oy++)
                for (int ox = 0; ox < OW; ox++) {
                    size_t yi = (((size_t)i * K + k) * OH + oy) * OW + ox;
                    float g = dy[yi];
                    if (cv->fuse_relu && !(y[yi] > 0)) g = 0;
                    if (g == 0) continue;
                    if (db && cv->has_bias) db[k] += g;
                    for (int c = 0; c < C; c++)
                        for (int r = 0; r < R; r++) {
                            int iy = oy * cv->stride - cv->pad + r;
                            if (iy < 0 || iy >= H) continue;
                            for (int q = 0; q < S; q++) {
                                int ix = ox * cv->stride - cv->pad + q;
                                if (ix < 0 || ix >= W) continue;
                                size_t xi = (((size_t)i * C + c) * H + iy) * W + ix;
                                size_t wi = (((size_t)k * C + c) * R + r) * S + q;
                                if (dx) dx[xi] += g * w[wi];
                                if (dw) dw[wi] += g * x[xi];
                            }
                        }
                }
}

/* ---- max pool ------------------------------------------------------------------------ */
void kern_maxpool_fwd_ref(const float *x, float *y, int32_t *argmax, int n, int c, int h, int w, int k,
                          int stride) {
    int oh = (h - k) / stride + 1, ow = (w - k) / stride + 1;
    for (size_t p = 0; p < (size_t)n * c; p++)
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) {
                int best = (oy * stride) * w + ox * stride;
                for (int r = 0; r < k; r++)
                    for (int q = 0; q < k; q++) {
                        int idx = (oy * stride + r) * w + ox * stride + q;
                        if (x[p * h * w + idx] > x[p * h * w + best]) best = idx;   // first maximum wins
                    }
                y[(p * oh + oy) * ow + ox] = x[p * h * w + best];
                argmax[(p * oh + oy) * ow + ox] = best;
            }
}

void kern_maxpool_bwd_ref(const float *dy, const int32_t *argmax, float *dx, int n, int c, int h, int w, int k,
                          int stride) {
    int oh = (h - k) / stride + 1, ow = (w - k) / stride + 1;
    for (size_t p = 0; p < (size_t)n * c; p++)
        for (int o = 0; o < oh * ow; o++) dx[p * h * w + argmax[p * oh * ow + o]] += dy[p * oh * ow + o];
}

/* ---- global average pool --------------------------------------------------------------- */
void kern_gap_fwd_ref(const float *x, float *y, int n, int c, int hw) {
    for (size_t p = 0; p < (size_t)n * c; p++) {
        double s = 0;
        for (int i = 0; i < hw; i++) s += x[p * hw + i];
        y[p] = (float)(s / hw);
    }
}

void kern_gap_bwd_ref(const float *dy, float *dx, int n, int c, int hw) {
    for (size_t p = 0; p < (size_t)n * c; p++)
        for (int i = 0; i < hw; i++) dx[p * hw + i] += dy[p] / (float)hw;
}

/* ---- relu ---------------------------------------------------------------------------- */
void kern_relu_fwd_ref(const float *x, float *y, size_t count) {
    for (size_t i = 0; i < count; i++) y[i] = x[i] > 0 ? x[i] : 0.0f;
}

void kern_relu_bwd_ref(const float *y, const float *dy, float *dx, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (y[i] > 0) dx[i] += dy[i];
}

/* ---- dropout ------------------------------------------------------------------------- */
void kern_dropout_fwd_ref(const float *x, float *y, uint8_t *mask, size_t count, float p, uint64_t seed,
                          uint64_t stream, uint64_t substream) {
    Rng r;
    rng_init(&r, seed, stream, substream);
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (size_t i = 0; i < count; i++) {
        mask[i] = rng_uniform(&r) >= p;
        y[i] = mask[i] ? x[i] * scale : 0.0f;
    }
}

void kern_dropout_bwd_ref(const float *dy, const uint8_t *mask, float *dx, size_t count, float p) {
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (size_t i = 0; i < count; i++)
        if (mask[i]) dx[i] += dy[i] * scale;
}

/* ---- batch norm ---------------------------------------------------------------------- */
void kern_bn_fwd_train_ref(const float *x, const float *gamma, const float *beta, float *y,
                           float *running_mean, float *running_var, float *saved, int n, int c, int hw,
                           float eps, float momentum) {
    double cnt = (double)n * hw;
    for (int ch = 0; ch < c; ch++) {
        double s = 0, s2 = 0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < hw; j++) s += x[((size_t)i * c + ch) * hw + j];
        double mean = s / cnt;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < hw; j++) {
                double d = x[((size_t)i * c + ch) * hw + j] - mean;
                s2 += d * d;
            }
        double var = s2 / cnt;
        double inv_std = 1.0 / sqrt(var + eps);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < hw; j++) {
                size_t k = ((size_t)i * c + ch) * hw + j;
                y[k] = (float)(gamma[ch] * (x[k] - mean) * inv_std + beta[ch]);
            }
        double unbiased = cnt > 1 ? var * cnt / (cnt - 1) : var;
        running_mean[ch] = (float)((1.0 - momentum) * running_mean[ch] + momentum * mean);
        running_var[ch] = (float)((1.0 - momentum) * running_var[ch] + momentum * unbiased);
        saved[ch] = (float)mean;
        saved[c + ch] = (float)inv_std;
    }
}

void kern_bn_fwd_eval_ref(const float *x, const float *gamma, const float *beta, float *y,
                          const float *running_mean, const float *running_var, int n, int c, int hw, float eps) {
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++) {
            double inv_std = 1.0 / sqrt((double)running_var[ch] + eps);
            for (int j = 0; j < hw; j++) {
                size_t k = ((size_t)i * c + ch) * hw + j;
                y[k] = (float)(gamma[ch] * (x[k] - (double)running_mean[ch]) * inv_std + beta[ch]);
            }
        }
}

/* With xh = (x - mean) * inv_std and g = dy * gamma, over the M = N*HW values of a channel:
 *   dx = inv_std * (g - mean(g) - xh * mean(g * xh)),  dgamma = sum(dy * xh),  dbeta = sum(dy). */
void kern_bn_bwd_ref(const float *x, const float *gamma, const float *saved, const float *dy, float *dx,
                     float *dgamma, float *dbeta, int n, int c, int hw) {
    double cnt = (double)n * hw;
    for (int ch = 0; ch < c; ch++) {
        double mean = saved[ch], inv_std = saved[c + ch];
        double sdy = 0, sdyxh = 0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < hw; j++) {
                size_t k = ((size_t)i * c + ch) * hw + j;
                sdy += dy[k];
                sdyxh += dy[k] * (x[k] - mean) * inv_std;
            }
        if (dgamma) dgamma[ch] += (float)sdyxh;
        if (dbeta) dbeta[ch] += (float)sdy;
        if (!dx) continue;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < hw; j++) {
                size_t k = ((size_t)i * c + ch) * hw + j;
                double xh = (x[k] - mean) * inv_std;
                dx[k] += (float)(gamma[ch] * inv_std * (dy[k] - sdy / cnt - xh * sdyxh / cnt));
            }
    }
}

/* ---- LSTM ---------------------------------------------------------------------------- */
/* saved layout (shared with lstm.c), for the n of the call:
 *   gates (T, N, 4H): i, f, g, o after their activations; then cells (T, N, H): c_t. */
static double sigm(double v) { return 1.0 / (1.0 + exp(-v)); }

void kern_lstm_fwd_ref(const KLstm *l, int n, const float *x, const float *w_ih, const float *w_hh,
                       const float *b_ih, const float *b_hh, float *y, float *saved) {
    const int T = l->t, I = l->in, H = l->hid, G = 4 * H;
    float *gates = saved, *cells = saved + (size_t)T * n * G;
    for (int t = 0; t < T; t++)
        for (int b = 0; b < n; b++) {
            const float *xt = x + ((size_t)t * n + b) * I;
            const float *hp = t ? y + ((size_t)(t - 1) * n + b) * H : NULL;
            const float *cp = t ? cells + ((size_t)(t - 1) * n + b) * H : NULL;
            float *gt = gates + ((size_t)t * n + b) * G;
            for (int j = 0; j < G; j++) {
                double a = (double)b_ih[j] + b_hh[j];
                for (int k = 0; k < I; k++) a += (double)w_ih[(size_t)j * I + k] * xt[k];
                if (hp)
                    for (int k = 0; k < H; k++) a += (double)w_hh[(size_t)j * H + k] * hp[k];
                gt[j] = (float)(j >= 2 * H && j < 3 * H ? tanh(a) : sigm(a));
            }
            for (int j = 0; j < H; j++) {
                double c = (double)gt[H + j] * (cp ? cp[j] : 0.0) + (double)gt[j] * gt[2 * H + j];
                cells[((size_t)t * n + b) * H + j] = (float)c;
                y[((size_t)t * n + b) * H + j] = (float)(gt[3 * H + j] * tanh(c));
            }
        }
}

void kern_lstm_bwd_ref(const KLstm *l, int n, const float *x, const float *w_ih, const float *w_hh,
                       const float *y, const float *saved, const float *dy, float *dx, float *dw_ih,
                       float *dw_hh, float *db_ih, float *db_hh) {
    const int T = l->t, I = l->in, H = l->hid, G = 4 * H;
    const float *gates = saved, *cells = saved + (size_t)T * n * G;
    /* carries from step t+1 and per-step pre-activation gradient, one sample at a time */
    double *dh = pd_calloc(sizeof(double) * H), *dc = pd_calloc(sizeof(double) * H);
    double *da = pd_calloc(sizeof(double) * G);
    for (int b = 0; b < n; b++) {
        memset(dh, 0, sizeof(double) * H);
        memset(dc, 0, sizeof(double) * H);
        for (int t = T - 1; t >= 0; t--) {
            const float *gt = gates + ((size_t)t * n + b) * G;
            const float *ct = cells + ((size_t)t * n + b) * H;
            const float *cp = t ? cells + ((size_t)(t - 1) * n + b) * H : NULL;
            const float *hp = t ? y + ((size_t)(t - 1) * n + b) * H : NULL;
            const float *xt = x + ((size_t)t * n + b) * I;
            for (int j = 0; j < H; j++) {
                double ig = gt[j], fg = gt[H + j], gg = gt[2 * H + j], og = gt[3 * H + j];
                double tc = tanh(ct[j]);
                double h = dh[j] + dy[((size_t)t * n + b) * H + j];
                double c = dc[j] + h * og * (1 - tc * tc);
                da[j] = c * gg * ig * (1 - ig);
                da[H + j] = c * (cp ? cp[j] : 0.0) * fg * (1 - fg);
                da[2 * H + j] = c * ig * (1 - gg * gg);
                da[3 * H + j] = h * tc * og * (1 - og);
                dc[j] = c * fg;
            }
            for (int j = 0; j < G; j++) {
                if (db_ih) db_ih[j] += (float)da[j];
                if (db_hh) db_hh[j] += (float)da[j];
                if (dw_ih)
                    for (int k = 0; k < I; k++) dw_ih[(size_t)j * I + k] += (float)(da[j] * xt[k]);
                if (dw_hh && hp)
                    for (int k = 0; k < H; k++) dw_hh[(size_t)j * H + k] += (float)(da[j] * hp[k]);
            }
            if (dx)
                for (int k = 0; k < I; k++) {
                    double s = 0;
                    for (int j = 0; j < G; j++) s += da[j] * w_ih[(size_t)j * I + k];
                    dx[((size_t)t * n + b) * I + k] += (float)s;
                }
            for (int k = 0; k < H; k++) {
                double s = 0;
                for (int j = 0; j < G; j++) s += da[j] * w_hh[(size_t)j * H + k];
                dh[k] = s;
            }
        }
    }
    pd_free(dh);
    pd_free(dc);
    pd_free(da);
}

/* ---- pad / crop ---------------------------------------------------------------------- */
void kern_pad_fwd_ref(const float *x, float *y, int n, int c, int h, int w, int p) {
    int ph = h + 2 * p, pw = w + 2 * p;
    for (size_t q = 0; q < (size_t)n * c; q++)
        for (int i = 0; i < ph; i++)
            for (int j = 0; j < pw; j++) {
                int si = i - p, sj = j - p;
                y[(q * ph + i) * pw + j] = (si >= 0 && si < h && sj >= 0 && sj < w) ? x[(q * h + si) * w + sj] : 0;
            }
}

void kern_pad_bwd_ref(const float *dy, float *dx, int n, int c, int h, int w, int p) {
    int ph = h + 2 * p, pw = w + 2 * p;
    for (size_t q = 0; q < (size_t)n * c; q++)
        for (int i = 0; i < h; i++)
            for (int j = 0; j < w; j++) dx[(q * h + i) * w + j] += dy[(q * ph + i + p) * pw + j + p];
}

/* ---- softmax cross-entropy ----------------------------------------------------------- */
float kern_xent_fwd_bwd_ref(const float *logits, const int32_t *labels, float *dlogits, int n, int k,
                            float scale, int *correct) {
    double loss = 0;
    int hits = 0;
    for (int i = 0; i < n; i++) {
        const float *z = logits + (size_t)i * k;
        PD_ASSERTF(labels[i] >= 0 && labels[i] < k, "label %d of sample %d not in [0, %d)", labels[i], i, k);
        int am = 0;
        for (int j = 1; j < k; j++)
            if (z[j] > z[am]) am = j;
        hits += am == labels[i];
        double m = z[am], s = 0;
        for (int j = 0; j < k; j++) s += exp(z[j] - m);
        loss += log(s) + m - z[labels[i]];
        if (dlogits)
            for (int j = 0; j < k; j++) {
                double pj = exp(z[j] - m) / s;
                dlogits[(size_t)i * k + j] += (float)((pj - (j == labels[i])) * scale / n);
            }
    }
    if (correct) *correct = hits;
    return (float)(loss / n);
}
