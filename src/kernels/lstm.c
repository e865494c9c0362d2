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
 * Scratch: dA (T, n, 4H) lives only during backward, so it is the calling thread's
 * KSCR_LSTM slot (kern_scratch; 7 MB per layer of the lstm model at N = 64, shared by its two
 * layers); dh, dc and the bias sum are small and owned, allocated in kern_lstm_init.
 *
 * The element-wise gate passes run on the kernel threads (samples split over them; each
 * element's result depends on that element alone) and are vectorised: sigmoid and tanh are
 * written with lstm_expf below (Cephes' single-precision exp: range reduction by ln 2 and a
 * degree-6 polynomial, ~1 ulp), which gcc vectorises where libm's expf/tanhf are scalar calls.
 * The GEMMs are kern_sgemm (oneDNN).
 *
 * saved layout (shared with kern_ref.c), for the n of the call:
 *   gates (T, N, 4H) after activation, then cells (T, N, H). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic", "no-trapping-math")
#endif
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

typedef struct LstmImpl {
    float *dh;     /* (n_max, H) */
    float *dc;     /* (n_max, H): carried from step t+1 */
    float *zero;   /* (H): c_{-1} */
    float *bsum;   /* (4H): b_ih + b_hh */
} LstmImpl;

static size_t da_bytes(int t, int n, int hid) { return sizeof(float) * (size_t)t * n * 4 * hid; }

int kern_lstm_init(KLstm *l, int t, int n_max, int in, int hid, Err *err) {
    memset(l, 0, sizeof *l);
    if (t < 1 || n_max < 1 || in < 1 || hid < 1)
        return err_set(err, PD_EINVAL, "lstm: bad shape t=%d n_max=%d in=%d hid=%d", t, n_max, in, hid);
    *l = (KLstm){.t = t, .n_max = n_max, .in = in, .hid = hid};
    LstmImpl *im = pd_calloc(sizeof *im);
    im->dh = pd_alloc(sizeof(float) * (size_t)n_max * hid);
    im->dc = pd_alloc(sizeof(float) * (size_t)n_max * hid);
    im->bsum = pd_alloc(sizeof(float) * 4 * (size_t)hid);
    im->zero = pd_alloc_f32((size_t)hid);
    l->impl = im;
    kern_scratch(KSCR_LSTM, da_bytes(t, n_max, hid));   // grown at build time on this thread
    return PD_OK;
}

void kern_lstm_release(KLstm *l) {
    if (!l) return;
    LstmImpl *im = l->impl;
    if (im) {
        pd_free(im->dh);
        pd_free(im->dc);
        pd_free(im->bsum);
        pd_free(im->zero);
        pd_free(im);
    }
    l->impl = NULL;
}

size_t kern_lstm_saved_floats(int t, int n, int hid) { return (size_t)t * n * 5 * hid; }

/* exp(x), x clamped to [-87.3, 88.3]: Cephes expf (n = round(x / ln 2), r = x - n ln 2 in two
 * parts, e^r by its minimax polynomial, times 2^n built in the exponent bits). */
static inline float lstm_expf(float x) {
    x = x < -87.3f ? -87.3f : x > 88.3f ? 88.3f : x;
    int32_t k = (int32_t)(x * 1.44269504088896341f + 128.5f) - 128;   // round(x / ln 2): the sum is > 0
    float n = (float)k;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = (k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);   // 2^k
    return p * scale;
}

static inline float sigm(float v) { return 1.0f / (1.0f + lstm_expf(-v)); }
static inline float tanh_(float v) { return 1.0f - 2.0f / (1.0f + lstm_expf(2.0f * v)); }

typedef struct GateJob {
    float *gt, *ct, *ht, *at, *cgrad;
    const float *cp, *hgrad, *cgt, *cct, *zero;
    int H;
} GateJob;

/* One sample's row (restrict parameters: what lets gcc vectorise without alias checks). */
static void gate_fwd_row(float *restrict gi, float *restrict gf, float *restrict gg_, float *restrict go,
                         float *restrict c, float *restrict h, const float *restrict cp, int H) {
    for (int j = 0; j < H; j++) {
        float ig = sigm(gi[j]), fg = sigm(gf[j]), gg = tanh_(gg_[j]), og = sigm(go[j]);
        gi[j] = ig;
        gf[j] = fg;
        gg_[j] = gg;
        go[j] = og;
        float cv = ig * gg + fg * cp[j];
        c[j] = cv;
        h[j] = og * tanh_(cv);
    }
}

static void gate_bwd_row(const float *restrict gi, const float *restrict gf, const float *restrict gg_,
                         const float *restrict go, const float *restrict c, const float *restrict cp,
                         const float *restrict hgrad, float *restrict cgrad, float *restrict ai, float *restrict af,
                         float *restrict ag, float *restrict ao, int H) {
    for (int j = 0; j < H; j++) {
        float ig = gi[j], fg = gf[j], gg = gg_[j], og = go[j];
        float tc = tanh_(c[j]);
        float dcv = cgrad[j] + hgrad[j] * og * (1.0f - tc * tc);
        ai[j] = dcv * gg * ig * (1.0f - ig);
        af[j] = dcv * cp[j] * fg * (1.0f - fg);
        ag[j] = dcv * ig * (1.0f - gg * gg);
        ao[j] = hgrad[j] * tc * og * (1.0f - og);
        cgrad[j] = dcv * fg;
    }
}

/* forward, samples [b0, b1) of one step: activations in place, c_t, h_t */
static void gates_fwd_r(void *p, size_t b0, size_t b1) {
    const GateJob *jb = p;
    const int H = jb->H, G = 4 * H;
    for (size_t b = b0; b < b1; b++) {
        float *g = jb->gt + b * G;
        const float *cp = jb->cp ? jb->cp + b * H : jb->zero;   // c_{-1} = 0
        gate_fwd_row(g, g + H, g + 2 * H, g + 3 * H, jb->ct + b * H, jb->ht + b * H, cp, H);
    }
}

/* backward, samples [b0, b1) of one step: dA_t from dh_t and dc (carried), dc updated */
static void gates_bwd_r(void *p, size_t b0, size_t b1) {
    const GateJob *jb = p;
    const int H = jb->H, G = 4 * H;
    for (size_t b = b0; b < b1; b++) {
        const float *g = jb->cgt + b * G;
        const float *cp = jb->cp ? jb->cp + b * H : jb->zero;
        float *a = jb->at + b * G;
        gate_bwd_row(g, g + H, g + 2 * H, g + 3 * H, jb->cct + b * H, cp, jb->hgrad + b * H, jb->cgrad + b * H, a,
                     a + H, a + 2 * H, a + 3 * H, H);
    }
}

static size_t sample_grain(int H) { return (size_t)(16384 / (4 * H) + 1); }

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
        if (t)   // gates_t (N, 4H) += h_{t-1} (N, H) W_hh^T
            kern_sgemm('N', 'T', n, G, H, 1.0f, ht - (size_t)n * H, H, w_hh, H, 1.0f, gt, G);
        GateJob jb = {.gt = gt, .ct = ct, .ht = ht, .cp = t ? ct - (size_t)n * H : NULL, .zero = im->zero, .H = H};
        kern_parallel_for((size_t)n, sample_grain(H), 1, gates_fwd_r, &jb);
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
    float *da = kern_scratch(KSCR_LSTM, da_bytes(T, n, H)), *dh = im->dh, *dc = im->dc;
    memset(dc, 0, sizeof(float) * (size_t)n * H);
    for (int t = T - 1; t >= 0; t--) {
        // dh (N, H) = dy_t + dA_{t+1} (N, 4H) W_hh (4H, H)
        memcpy(dh, dy + (size_t)t * n * H, sizeof(float) * (size_t)n * H);
        if (t < T - 1) kern_sgemm('N', 'N', n, H, G, 1.0f, da + (size_t)(t + 1) * n * G, G, w_hh, H, 1.0f, dh, H);
        const float *ct = cells + (size_t)t * n * H;
        GateJob jb = {.cgt = gates + (size_t)t * n * G, .cct = ct, .hgrad = dh, .cgrad = dc,
                      .at = da + (size_t)t * n * G, .cp = t ? ct - (size_t)n * H : NULL, .zero = im->zero,
                      .H = H};
        kern_parallel_for((size_t)n, sample_grain(H), 1, gates_bwd_r, &jb);
    }
    const int rows = T * n;
    if (dw_ih)   // dW_ih (4H, I) += dA^T (4H, T*N) x (T*N, I)
        kern_sgemm('T', 'N', G, IN, rows, 1.0f, da, G, x, IN, 1.0f, dw_ih, IN);
    if (dw_hh && T > 1)   // dW_hh (4H, H) += dA[1..T)^T y[0..T-1)
        kern_sgemm('T', 'N', G, H, (T - 1) * n, 1.0f, da + (size_t)n * G, G, y, H, 1.0f, dw_hh, H);
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
