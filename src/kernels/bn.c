/* bn.c: batch normalisation over (N, HW) per channel, fast version, with the relu that
 * follows it fused into both directions (forward writes max(bn(x), 0); backward masks dy by
 * y > 0 on the fly, so no masked copy of dy is ever stored).
 *
 * Work split: channels are shared out over the kernel threads (kern_parallel_for); one
 * channel is computed entirely by one thread in a fixed order, so the results are the same
 * bits for every thread count. A channel's N planes are unit-stride runs of HW floats; at the
 * reference models' sizes one channel is <= 64 x 1024 floats = 256 KiB, so the second and
 * third passes over it hit the L2 cache.
 *
 * Reductions: a plane is summed into 16 float lanes (vectorised: each lane is its own
 * running sum, no reassociation needed), the lanes in a fixed order, and the planes in
 * double; two passes (mean, then squared deviations), so no cancellation for large means.
 *
 * Not oneDNN's batch-normalization primitive: around it this
 * module's contract would need extra passes (backward accumulates into dx: a separate
 * diff_src and a += pass; the fused-relu backward wants the primitive's workspace saved per
 * minibatch, or a masked copy of dy), so it makes 4-5 passes over the tensor where this makes
 * 2 (backward) and 3, two of them in L2 (forward). Not measured against it: see
 * docs/explanation/performance.md for what was measured. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif
#include <math.h>

#include "kernels.h"

enum { LANES = 16 };

/* sum of p[0..n) in a fixed order: 16 running lanes, then the lanes. */
static inline float sum_lanes(const float *restrict p, int n) {
    float acc[LANES] = {0};
    int j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < LANES; k++) acc[k] += p[j + k];
    for (int k = 0; j < n; j++, k++) acc[k] += p[j];
    float s = 0;
    for (int k = 0; k < LANES; k++) s += acc[k];
    return s;
}

/* sum of (p - m)^2 */
static inline float sumsq_lanes(const float *restrict p, float m, int n) {
    float acc[LANES] = {0};
    int j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < LANES; k++) {
            float d = p[j + k] - m;
            acc[k] += d * d;
        }
    for (int k = 0; j < n; j++, k++) {
        float d = p[j] - m;
        acc[k] += d * d;
    }
    float s = 0;
    for (int k = 0; k < LANES; k++) s += acc[k];
    return s;
}

static inline void affine(const float *restrict x, float *restrict y, float a, float b, int n, int relu) {
    if (relu)
        for (int j = 0; j < n; j++) {
            float v = a * x[j] + b;
            y[j] = v > 0.0f ? v : 0.0f;
        }
    else
        for (int j = 0; j < n; j++) y[j] = a * x[j] + b;
}

typedef struct BnJob {
    const float *x, *gamma, *beta, *saved, *y, *dy;
    float *yo, *rm, *rv, *so, *dx, *dgamma, *dbeta;
    const float *crm, *crv;
    int n, c, hw, relu, set;   /* set: dx written (as onto zeros), not added to */
    float eps, momentum;
} BnJob;

static void fwd_train_r(void *p, size_t c0, size_t c1) {
    const BnJob *j = p;
    const int n = j->n, c = j->c, hw = j->hw;
    const double cnt = (double)n * hw;
    for (int ch = (int)c0; ch < (int)c1; ch++) {
        double s = 0;
        for (int i = 0; i < n; i++) s += sum_lanes(j->x + ((size_t)i * c + ch) * hw, hw);
        const double mean = s / cnt;
        const float mf = (float)mean;
        double s2 = 0;   // two-pass variance: no cancellation for large means
        for (int i = 0; i < n; i++) s2 += sumsq_lanes(j->x + ((size_t)i * c + ch) * hw, mf, hw);
        const double var = s2 / cnt;
        const float inv_std = (float)(1.0 / sqrt(var + j->eps));
        const float a = j->gamma[ch] * inv_std, b = j->beta[ch] - mf * a;   // y = a x + b
        for (int i = 0; i < n; i++) {
            size_t o = ((size_t)i * c + ch) * hw;
            affine(j->x + o, j->yo + o, a, b, hw, j->relu);
        }
        const double unbiased = cnt > 1 ? var * cnt / (cnt - 1) : var;
        j->rm[ch] = (float)((1.0 - j->momentum) * j->rm[ch] + j->momentum * mean);
        j->rv[ch] = (float)((1.0 - j->momentum) * j->rv[ch] + j->momentum * unbiased);
        j->so[ch] = mf;
        j->so[c + ch] = inv_std;
    }
}

static void fwd_eval_r(void *p, size_t c0, size_t c1) {
    const BnJob *j = p;
    const int n = j->n, c = j->c, hw = j->hw;
    for (int ch = (int)c0; ch < (int)c1; ch++) {
        const float inv_std = (float)(1.0 / sqrt((double)j->crv[ch] + j->eps));
        const float a = j->gamma[ch] * inv_std, b = j->beta[ch] - j->crm[ch] * a;
        for (int i = 0; i < n; i++) {
            size_t o = ((size_t)i * c + ch) * hw;
            affine(j->x + o, j->yo + o, a, b, hw, j->relu);
        }
    }
}

/* sums of g and g * (x - mean) over a plane, g = dy (masked by y > 0 with relu) */
static inline void bwd_sums(const float *restrict x, const float *restrict y, const float *restrict dy, float mean,
                            int n, int relu, float *sg, float *sgx) {
    float a[LANES] = {0}, b[LANES] = {0};
    int j = 0;
    if (relu) {
        for (; j + LANES <= n; j += LANES)
            for (int k = 0; k < LANES; k++) {
                float g = y[j + k] > 0.0f ? dy[j + k] : 0.0f;
                a[k] += g;
                b[k] += g * (x[j + k] - mean);
            }
        for (int k = 0; j < n; j++, k++) {
            float g = y[j] > 0.0f ? dy[j] : 0.0f;
            a[k] += g;
            b[k] += g * (x[j] - mean);
        }
    } else {
        for (; j + LANES <= n; j += LANES)
            for (int k = 0; k < LANES; k++) {
                a[k] += dy[j + k];
                b[k] += dy[j + k] * (x[j + k] - mean);
            }
        for (int k = 0; j < n; j++, k++) {
            a[k] += dy[j];
            b[k] += dy[j] * (x[j] - mean);
        }
    }
    float s = 0, t = 0;
    for (int k = 0; k < LANES; k++) {
        s += a[k];
        t += b[k];
    }
    *sg = s;
    *sgx = t;
}

/* One plane's dx (hw elements of one channel): += (or, set, = 0.0f +, bitwise the same onto
 * zeros) k1 g + k2 (x - mean) + k0, g masked by y > 0 under relu; relu and set constant at each
 * call, so each case compiles to its own loop. */
static inline __attribute__((always_inline)) void bwd_dx_plane(float *restrict dp, const float *restrict xp,
                                                               const float *restrict gp, const float *restrict yp,
                                                               float k1, float k2, float k0, float mean, int hw,
                                                               int relu, int set) {
    for (int q = 0; q < hw; q++) {
        const float g = !relu || yp[q] > 0.0f ? gp[q] : 0.0f;
        const float v = k1 * g + k2 * (xp[q] - mean) + k0;
        if (set) dp[q] = 0.0f + v;
        else dp[q] += v;
    }
}

static void bwd_r(void *p, size_t c0, size_t c1) {
    const BnJob *j = p;
    const int n = j->n, c = j->c, hw = j->hw, relu = j->relu;
    const double cnt = (double)n * hw;
    for (int ch = (int)c0; ch < (int)c1; ch++) {
        const float mean = j->saved[ch], inv_std = j->saved[c + ch];
        double sdy = 0, sdyx = 0;   // sum g, sum g * (x - mean)
        for (int i = 0; i < n; i++) {
            size_t o = ((size_t)i * c + ch) * hw;
            float a, b;
            bwd_sums(j->x + o, relu ? j->y + o : NULL, j->dy + o, mean, hw, relu, &a, &b);
            sdy += a;
            sdyx += b;
        }
        if (j->dgamma) j->dgamma[ch] += (float)(sdyx * inv_std);
        if (j->dbeta) j->dbeta[ch] += (float)sdy;
        if (!j->dx) continue;
        // dx += k1 * g + k2 * (x - mean) + k0
        const float g0 = j->gamma[ch];
        const float k1 = g0 * inv_std;
        const float k2 = (float)(-(double)g0 * inv_std * inv_std * inv_std * sdyx / cnt);
        const float k0 = (float)(-(double)g0 * inv_std * sdy / cnt);
        for (int i = 0; i < n; i++) {
            size_t o = ((size_t)i * c + ch) * hw;
            const float *xp = j->x + o, *gp = j->dy + o, *yp = relu ? j->y + o : NULL;
            float *dp = j->dx + o;
            if (relu && j->set) bwd_dx_plane(dp, xp, gp, yp, k1, k2, k0, mean, hw, 1, 1);
            else if (relu) bwd_dx_plane(dp, xp, gp, yp, k1, k2, k0, mean, hw, 1, 0);
            else if (j->set) bwd_dx_plane(dp, xp, gp, yp, k1, k2, k0, mean, hw, 0, 1);
            else bwd_dx_plane(dp, xp, gp, yp, k1, k2, k0, mean, hw, 0, 0);
        }
    }
}

/* one channel is >= 1 unit of work; split only when a channel has enough elements */
static size_t ch_grain(int n, int hw) {
    size_t per = (size_t)n * hw;
    return per >= 4096 ? 1 : 4096 / (per ? per : 1) + 1;
}

void kern_bn_fwd_train(const float *x, const float *gamma, const float *beta, float *y, float *running_mean,
                       float *running_var, float *saved, int n, int c, int hw, float eps, float momentum, int relu) {
    BnJob j = {.x = x, .gamma = gamma, .beta = beta, .yo = y, .rm = running_mean, .rv = running_var, .so = saved,
               .n = n, .c = c, .hw = hw, .relu = relu, .eps = eps, .momentum = momentum};
    kern_parallel_for((size_t)c, ch_grain(n, hw), 1, fwd_train_r, &j);
}

void kern_bn_fwd_eval(const float *x, const float *gamma, const float *beta, float *y, const float *running_mean,
                      const float *running_var, int n, int c, int hw, float eps, int relu) {
    BnJob j = {.x = x, .gamma = gamma, .beta = beta, .yo = y, .crm = running_mean, .crv = running_var, .n = n,
               .c = c, .hw = hw, .relu = relu, .eps = eps};
    kern_parallel_for((size_t)c, ch_grain(n, hw), 1, fwd_eval_r, &j);
}

/* dx += gamma * inv_std * (g - mean(g) - xh * mean(g * xh)), xh = (x - mean) * inv_std. */
void kern_bn_bwd(const float *x, const float *gamma, const float *saved, const float *y, const float *dy, float *dx,
                 float *dgamma, float *dbeta, int n, int c, int hw, int relu) {
    kern_bn_bwd_set(x, gamma, saved, y, dy, dx, dgamma, dbeta, n, c, hw, relu, 0);
}

void kern_bn_bwd_set(const float *x, const float *gamma, const float *saved, const float *y, const float *dy,
                     float *dx, float *dgamma, float *dbeta, int n, int c, int hw, int relu, int set) {
    PD_ASSERT(!relu || y);
    BnJob j = {.x = x, .gamma = gamma, .saved = saved, .y = y, .dy = dy, .dx = dx, .dgamma = dgamma, .dbeta = dbeta,
               .n = n, .c = c, .hw = hw, .relu = relu, .set = (set & KSET_DX) != 0};
    kern_parallel_for((size_t)c, ch_grain(n, hw), 1, bwd_r, &j);
}

/* ---- blocked: (N, C/B, HW, B), B = 8 or 16, the B lanes of a pixel are B consecutive channels
 * Each channel's arithmetic is the plain kernels' above, step for step: a plane's pixel j
 * goes into running sum j % 16, those 16 sums are added in order, the planes in double in
 * sample order, and every element gets the same expression. So the results are bitwise the
 * plain kernels', reordered (tests/test_kernels.c checks it), whatever the layout of a
 * model's activations. The 16 x B running sums (pixel lane x channel) are 16 vectors. Each
 * function below takes B as a constant and is compiled for both widths (blk_pass_r).
 *
 * Work split: a channel block is B of the channels (resnet20's first stage has one or two),
 * too coarse for the threads, so the units are planes (sample, block): each pass over
 * the data is a kern_parallel_for over them, writing per-plane float sums to scratch
 * (KSCR_BN), and between passes one thread adds those up per channel in sample order, as
 * the plain kernel does: the same bits for every thread count. */

/* out[l] = sum_lanes of channel l's plane; with m: of (x - m[l])^2 (sumsq_lanes) */
static inline __attribute__((always_inline)) void sum_blk(const float *restrict p, const float *restrict m, int hw,
                                                          float *restrict out, const int B) {
    float acc[LANES][16] = {{0}};
    int j = 0;
    if (m) {
        for (; j + LANES <= hw; j += LANES)
            for (int k = 0; k < LANES; k++)
                for (int l = 0; l < B; l++) {
                    float d = p[(size_t)(j + k) * B + l] - m[l];
                    acc[k][l] += d * d;
                }
        for (int k = 0; j < hw; j++, k++)
            for (int l = 0; l < B; l++) {
                float d = p[(size_t)j * B + l] - m[l];
                acc[k][l] += d * d;
            }
    } else {
        for (; j + LANES <= hw; j += LANES)
            for (int k = 0; k < LANES; k++)
                for (int l = 0; l < B; l++) acc[k][l] += p[(size_t)(j + k) * B + l];
        for (int k = 0; j < hw; j++, k++)
            for (int l = 0; l < B; l++) acc[k][l] += p[(size_t)j * B + l];
    }
    for (int l = 0; l < B; l++) out[l] = 0;
    for (int k = 0; k < LANES; k++)
        for (int l = 0; l < B; l++) out[l] += acc[k][l];
}

static inline __attribute__((always_inline)) void affine_blk(const float *restrict x, float *restrict y,
                                                             const float *restrict a, const float *restrict b, int hw,
                                                             int relu, const int B) {
    if (relu)
        for (int q = 0; q < hw; q++)
            for (int l = 0; l < B; l++) {
                float v = a[l] * x[(size_t)q * B + l] + b[l];
                y[(size_t)q * B + l] = v > 0.0f ? v : 0.0f;
            }
    else
        for (int q = 0; q < hw; q++)
            for (int l = 0; l < B; l++) y[(size_t)q * B + l] = a[l] * x[(size_t)q * B + l] + b[l];
}

/* bwd_sums per channel of a block (y NULL: no relu) */
static inline __attribute__((always_inline)) void bwd_sums_blk(const float *restrict x, const float *restrict y,
                                                               const float *restrict dy, const float *restrict mean,
                                                               int hw, float *restrict sg, float *restrict sgx,
                                                               const int B) {
    float a[LANES][16] = {{0}}, b[LANES][16] = {{0}};
    for (int q = 0; q < hw; q++) {
        const int k = q % LANES;
        const size_t o = (size_t)q * B;
        if (y)
            for (int l = 0; l < B; l++) {
                float g = y[o + l] > 0.0f ? dy[o + l] : 0.0f;
                a[k][l] += g;
                b[k][l] += g * (x[o + l] - mean[l]);
            }
        else
            for (int l = 0; l < B; l++) {
                a[k][l] += dy[o + l];
                b[k][l] += dy[o + l] * (x[o + l] - mean[l]);
            }
    }
    for (int l = 0; l < B; l++) sg[l] = sgx[l] = 0;
    for (int k = 0; k < LANES; k++)
        for (int l = 0; l < B; l++) {
            sg[l] += a[k][l];
            sgx[l] += b[k][l];
        }
}

/* One pass over planes: u = i * nb + cb (memory order). The per-channel arrays (c floats)
 * live in the job: m (means), a, b (affine: y = a x + b; backward: dx += a g + b (x - m) + k0),
 * k0; per-plane sums go to pa[u * B + l] and pb. */
typedef struct BlkJob {
    const float *x, *y, *dy;
    float *yo, *dx;
    float *m, *a, *b, *k0, *pa, *pb;
    int nb, hw, relu, pass, set;   /* set: P_BWD_DX writes dx (as onto zeros) */
    int blk;                       /* B: channels per block */
} BlkJob;
enum { P_SUM, P_SUMSQ, P_AFFINE, P_BWD_SUMS, P_BWD_DX };

/* One plane's dx: += (or, set, = 0.0f +, bitwise the same onto zeros) k1 g + k2 (x - m) + k0,
 * g masked by y > 0 under relu; relu and set constant at each call, so each case compiles to
 * its own loop. */
static inline __attribute__((always_inline)) void bwd_dx_blk(float *restrict dp, const float *restrict xp,
                                                             const float *restrict gp, const float *restrict yp,
                                                             const BlkJob *j, size_t c0, int hw, int relu, int set,
                                                             const int B) {
    const float *restrict mp = j->m + c0, *restrict k1 = j->a + c0, *restrict k2 = j->b + c0, *restrict k0 = j->k0 + c0;
    for (int q = 0; q < hw * B; q += B)
        for (int l = 0; l < B; l++) {
            const float g = !relu || yp[q + l] > 0.0f ? gp[q + l] : 0.0f;
            const float v = k1[l] * g + k2[l] * (xp[q + l] - mp[l]) + k0[l];
            if (set) dp[q + l] = 0.0f + v;
            else dp[q + l] += v;
        }
}

static inline __attribute__((always_inline)) void blk_pass_body(const BlkJob *j, size_t u0, size_t u1,
                                                                const int B) {
    const int nb = j->nb, hw = j->hw;
    for (size_t u = u0; u < u1; u++) {
        const int cb = (int)(u % (size_t)nb);
        const size_t o = u * (size_t)hw * B, c0 = (size_t)cb * B;
        switch (j->pass) {
        case P_SUM: sum_blk(j->x + o, NULL, hw, j->pa + u * B, B); break;
        case P_SUMSQ: sum_blk(j->x + o, j->m + c0, hw, j->pa + u * B, B); break;
        case P_AFFINE: affine_blk(j->x + o, j->yo + o, j->a + c0, j->b + c0, hw, j->relu, B); break;
        case P_BWD_SUMS:
            bwd_sums_blk(j->x + o, j->relu ? j->y + o : NULL, j->dy + o, j->m + c0, hw, j->pa + u * B,
                         j->pb + u * B, B);
            break;
        case P_BWD_DX: {
            const float *xp = j->x + o, *gp = j->dy + o, *yp = j->relu ? j->y + o : NULL;
            float *dp = j->dx + o;
            if (j->relu && j->set) bwd_dx_blk(dp, xp, gp, yp, j, c0, hw, 1, 1, B);
            else if (j->relu) bwd_dx_blk(dp, xp, gp, yp, j, c0, hw, 1, 0, B);
            else if (j->set) bwd_dx_blk(dp, xp, gp, yp, j, c0, hw, 0, 1, B);
            else bwd_dx_blk(dp, xp, gp, yp, j, c0, hw, 0, 0, B);
            break;
        }
        }
    }
}

static void blk_pass_r(void *p, size_t u0, size_t u1) {
    const BlkJob *j = p;
    if (j->blk == 8) blk_pass_body(j, u0, u1, 8);
    else blk_pass_body(j, u0, u1, 16);
}

static void blk_pass(BlkJob *j, int pass, int n) {
    j->pass = pass;
    const size_t per = (size_t)j->hw * (size_t)j->blk;   // elements per plane
    kern_parallel_for((size_t)n * j->nb, per >= 4096 ? 1 : 4096 / per + 1, 1, blk_pass_r, j);
}

/* Scratch for n samples, c channels: 4 per-channel arrays and 2 per-plane sum arrays. */
static BlkJob blk_job(int n, int c, int hw, int relu, int blk) {
    PD_ASSERTF((blk == 8 || blk == 16) && c % blk == 0, "batchnorm (blocked by %d): %d channels", blk, c);
    float *s = kern_scratch(KSCR_BN, sizeof(float) * (4 + 2 * (size_t)n) * c);
    BlkJob j = {.nb = c / blk, .blk = blk, .hw = hw, .relu = relu, .m = s, .a = s + c, .b = s + 2 * c, .k0 = s + 3 * c,
                .pa = s + 4 * c, .pb = s + (4 + (size_t)n) * c};
    return j;
}

/* Per channel ch, the sum over samples of the per-plane sums p, in double, in sample order. */
static double plane_total(const float *p, int n, int c, int ch) {
    double s = 0;
    for (int i = 0; i < n; i++) s += p[(size_t)i * c + ch];
    return s;
}

void kern_bn_fwd_train_blk(const float *x, const float *gamma, const float *beta, float *y, float *running_mean,
                           float *running_var, float *saved, int n, int c, int hw, float eps, float momentum,
                           int relu, int blk) {
    BlkJob j = blk_job(n, c, hw, relu, blk);
    j.x = x, j.yo = y;
    const double cnt = (double)n * hw;
    double *mean = (double *)j.a;   // a and b are free until the affine pass: c doubles
    blk_pass(&j, P_SUM, n);
    for (int ch = 0; ch < c; ch++) {
        mean[ch] = plane_total(j.pa, n, c, ch) / cnt;
        j.m[ch] = (float)mean[ch];
    }
    blk_pass(&j, P_SUMSQ, n);
    for (int ch = 0; ch < c; ch++) {
        const double var = plane_total(j.pa, n, c, ch) / cnt, mu = mean[ch];
        const float mf = j.m[ch], inv_std = (float)(1.0 / sqrt(var + eps));
        const double unbiased = cnt > 1 ? var * cnt / (cnt - 1) : var;
        running_mean[ch] = (float)((1.0 - momentum) * running_mean[ch] + momentum * mu);
        running_var[ch] = (float)((1.0 - momentum) * running_var[ch] + momentum * unbiased);
        saved[ch] = mf;
        saved[c + ch] = inv_std;
    }
    for (int ch = 0; ch < c; ch++) {   // after the loop above: a, b overwrite the double means
        j.a[ch] = gamma[ch] * saved[c + ch];
        j.b[ch] = beta[ch] - saved[ch] * j.a[ch];
    }
    blk_pass(&j, P_AFFINE, n);
}

void kern_bn_fwd_eval_blk(const float *x, const float *gamma, const float *beta, float *y, const float *running_mean,
                          const float *running_var, int n, int c, int hw, float eps, int relu, int blk) {
    BlkJob j = blk_job(n, c, hw, relu, blk);
    j.x = x, j.yo = y;
    for (int ch = 0; ch < c; ch++) {
        const float inv_std = (float)(1.0 / sqrt((double)running_var[ch] + eps));
        j.a[ch] = gamma[ch] * inv_std;
        j.b[ch] = beta[ch] - running_mean[ch] * j.a[ch];
    }
    blk_pass(&j, P_AFFINE, n);
}

void kern_bn_bwd_blk(const float *x, const float *gamma, const float *saved, const float *y, const float *dy,
                     float *dx, float *dgamma, float *dbeta, int n, int c, int hw, int relu, int blk) {
    kern_bn_bwd_blk_set(x, gamma, saved, y, dy, dx, dgamma, dbeta, n, c, hw, relu, 0, blk);
}

void kern_bn_bwd_blk_set(const float *x, const float *gamma, const float *saved, const float *y, const float *dy,
                         float *dx, float *dgamma, float *dbeta, int n, int c, int hw, int relu, int set, int blk) {
    PD_ASSERT(!relu || y);
    BlkJob j = blk_job(n, c, hw, relu, blk);
    j.x = x, j.y = y, j.dy = dy, j.dx = dx, j.set = (set & KSET_DX) != 0;
    const double cnt = (double)n * hw;
    for (int ch = 0; ch < c; ch++) j.m[ch] = saved[ch];
    blk_pass(&j, P_BWD_SUMS, n);
    for (int ch = 0; ch < c; ch++) {
        const float inv_std = saved[c + ch], g0 = gamma[ch];
        const double sdy = plane_total(j.pa, n, c, ch), sdyx = plane_total(j.pb, n, c, ch);
        if (dgamma) dgamma[ch] += (float)(sdyx * inv_std);
        if (dbeta) dbeta[ch] += (float)sdy;
        j.a[ch] = g0 * inv_std;   // k1, k2, k0 of bwd_r
        j.b[ch] = (float)(-(double)g0 * inv_std * inv_std * inv_std * sdyx / cnt);
        j.k0[ch] = (float)(-(double)g0 * inv_std * sdy / cnt);
    }
    if (dx) blk_pass(&j, P_BWD_DX, n);
}
