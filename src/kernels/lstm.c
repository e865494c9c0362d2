/* lstm.c: one LSTM layer (PyTorch gate order i, f, g, o; h0 = c0 = 0), fast version.
 *
 * Forward: the input projection of all T steps is one GEMM, gates (T*N, 4H) =
 * x (T*N, I) W_ih^T + (b_ih + b_hh), written straight into the saved gate block; then per
 * step one GEMM adds h_{t-1} (N, H) W_hh^T, and one pass applies the activations in place
 * and produces c_t and h_t = y_t.
 * Backward (BPTT): per step only what is sequential: dh_t = dy_t + dA_{t+1} W_hh (one GEMM)
 * and the element-wise gate derivatives into dA (T, N, 4H); after the loop the weight and
 * input gradients are three GEMMs over all steps at once: dW_ih += dA^T x,
 * dW_hh += dA[1..T)^T y[0..T-1), dx += dA W_ih, and the biases are column sums of dA.
 * Scratch (dA, dh, bias sum) is allocated once in kern_lstm_init for n_max.
 *
 * saved layout (shared with kern_ref.c), for the n of the call:
 *   gates (T, N, 4H) after activation, then cells (T, N, H). */
#include <math.h>
#include <string.h>

#include "kernels.h"

typedef struct LstmImpl {
    float *da;     /* (T, n_max, 4H): gradient w.r.t. the gate pre-activations */
    float *dh;     /* (n_max, H) */
    float *dc;     /* (n_max, H): carried from step t+1 */
    float *bsum;   /* (4H): b_ih + b_hh */
} LstmImpl;

int kern_lstm_init(KLstm *l, int t, int n_max, int in, int hid, Err *err) {
    memset(l, 0, sizeof *l);
    if (t < 1 || n_max < 1 || in < 1 || hid < 1)
        return err_set(err, PD_EINVAL, "lstm: bad shape t=%d n_max=%d in=%d hid=%d", t, n_max, in, hid);
    *l = (KLstm){.t = t, .n_max = n_max, .in = in, .hid = hid};
    LstmImpl *im = pd_calloc(sizeof *im);
    im->da = pd_alloc(sizeof(float) * (size_t)t * n_max * 4 * hid);
    im->dh = pd_alloc(sizeof(float) * (size_t)n_max * hid);
    im->dc = pd_alloc(sizeof(float) * (size_t)n_max * hid);
    im->bsum = pd_alloc(sizeof(float) * 4 * (size_t)hid);
    l->impl = im;
    return PD_OK;
}

void kern_lstm_release(KLstm *l) {
    if (!l) return;
    LstmImpl *im = l->impl;
    if (im) {
        pd_free(im->da);
        pd_free(im->dh);
        pd_free(im->dc);
        pd_free(im->bsum);
        pd_free(im);
    }
    l->impl = NULL;
}

size_t kern_lstm_saved_floats(int t, int n, int hid) { return (size_t)t * n * 5 * hid; }

static inline float sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

void kern_lstm_fwd(KLstm *l, int n, const float *x, const float *w_ih, const float *w_hh, const float *b_ih,
                   const float *b_hh, float *y, float *saved) {
    PD_ASSERTF(n >= 0 && n <= l->n_max, "n=%d n_max=%d", n, l->n_max);
    if (n == 0) return;
    LstmImpl *im = l->impl;
    const int T = l->t, IN = l->in, H = l->hid, G = 4 * H;
    float *gates = saved, *cells = saved + (size_t)T * n * G;
    for (int j = 0; j < G; j++) im->bsum[j] = b_ih[j] + b_hh[j];
    for (size_t row = 0; row < (size_t)T * n; row++) memcpy(gates + row * G, im->bsum, sizeof(float) * G);
    // gates (T*N, 4H) += x (T*N, I) W_ih^T
    kern_sgemm('N', 'T', T * n, G, IN, 1.0f, x, IN, w_ih, IN, 1.0f, gates, G);
    for (int t = 0; t < T; t++) {
        float *gt = gates + (size_t)t * n * G;
        float *ct = cells + (size_t)t * n * H, *ht = y + (size_t)t * n * H;
        const float *cp = t ? ct - (size_t)n * H : NULL;
        if (t)   // gates_t (N, 4H) += h_{t-1} (N, H) W_hh^T
            kern_sgemm('N', 'T', n, G, H, 1.0f, ht - (size_t)n * H, H, w_hh, H,
                        1.0f, gt, G);
        for (int b = 0; b < n; b++) {
            float *restrict g = gt + (size_t)b * G;
            float *restrict c = ct + (size_t)b * H;
            float *restrict h = ht + (size_t)b * H;
            for (int j = 0; j < H; j++) {
                float ig = sigmoidf(g[j]), fg = sigmoidf(g[H + j]), gg = tanhf(g[2 * H + j]);
                float og = sigmoidf(g[3 * H + j]);
                g[j] = ig;
                g[H + j] = fg;
                g[2 * H + j] = gg;
                g[3 * H + j] = og;
                float cv = ig * gg + (cp ? fg * cp[(size_t)b * H + j] : 0.0f);
                c[j] = cv;
                h[j] = og * tanhf(cv);
            }
        }
    }
}

void kern_lstm_bwd(KLstm *l, int n, const float *x, const float *w_ih, const float *w_hh, const float *y,
                   const float *saved, const float *dy, float *dx, float *dw_ih, float *dw_hh, float *db_ih,
                   float *db_hh) {
    PD_ASSERTF(n >= 0 && n <= l->n_max, "n=%d n_max=%d", n, l->n_max);
    if (n == 0) return;
    LstmImpl *im = l->impl;
    const int T = l->t, IN = l->in, H = l->hid, G = 4 * H;
    const float *gates = saved, *cells = saved + (size_t)T * n * G;
    float *da = im->da, *dh = im->dh, *dc = im->dc;
    memset(dc, 0, sizeof(float) * (size_t)n * H);
    for (int t = T - 1; t >= 0; t--) {
        // dh (N, H) = dy_t + dA_{t+1} (N, 4H) W_hh (4H, H)
        memcpy(dh, dy + (size_t)t * n * H, sizeof(float) * (size_t)n * H);
        if (t < T - 1)
            kern_sgemm('N', 'N', n, H, G, 1.0f, da + (size_t)(t + 1) * n * G, G,
                        w_hh, H, 1.0f, dh, H);
        const float *gt = gates + (size_t)t * n * G, *ct = cells + (size_t)t * n * H;
        const float *cp = t ? ct - (size_t)n * H : NULL;
        float *dat = da + (size_t)t * n * G;
        for (int b = 0; b < n; b++) {
            const float *restrict g = gt + (size_t)b * G;
            const float *restrict c = ct + (size_t)b * H;
            const float *restrict hgrad = dh + (size_t)b * H;
            float *restrict cgrad = dc + (size_t)b * H;
            float *restrict a = dat + (size_t)b * G;
            for (int j = 0; j < H; j++) {
                float ig = g[j], fg = g[H + j], gg = g[2 * H + j], og = g[3 * H + j];
                float tc = tanhf(c[j]);
                float dcv = cgrad[j] + hgrad[j] * og * (1.0f - tc * tc);
                float cprev = cp ? cp[(size_t)b * H + j] : 0.0f;
                a[j] = dcv * gg * ig * (1.0f - ig);
                a[H + j] = dcv * cprev * fg * (1.0f - fg);
                a[2 * H + j] = dcv * ig * (1.0f - gg * gg);
                a[3 * H + j] = hgrad[j] * tc * og * (1.0f - og);
                cgrad[j] = dcv * fg;
            }
        }
    }
    const int rows = T * n;
    if (dw_ih)   // dW_ih (4H, I) += dA^T (4H, T*N) x (T*N, I)
        kern_sgemm('T', 'N', G, IN, rows, 1.0f, da, G, x, IN, 1.0f, dw_ih, IN);
    if (dw_hh && T > 1)   // dW_hh (4H, H) += dA[1..T)^T y[0..T-1)
        kern_sgemm('T', 'N', G, H, (T - 1) * n, 1.0f, da + (size_t)n * G, G, y, H,
                    1.0f, dw_hh, H);
    if (dx)   // dx (T*N, I) += dA (T*N, 4H) W_ih (4H, I)
        kern_sgemm('N', 'N', rows, IN, G, 1.0f, da, G, w_ih, IN, 1.0f, dx, IN);
    if (db_ih || db_hh) {
        float *bs = im->bsum;   // column sums of dA (the same for both biases)
        memset(bs, 0, sizeof(float) * G);
        for (int r = 0; r < rows; r++) {
            const float *restrict a = da + (size_t)r * G;
            for (int j = 0; j < G; j++) bs[j] += a[j];
        }
        if (db_ih)
            for (int j = 0; j < G; j++) db_ih[j] += bs[j];
        if (db_hh)
            for (int j = 0; j < G; j++) db_hh[j] += bs[j];
    }
}
