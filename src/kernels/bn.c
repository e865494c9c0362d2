/* bn.c: batch normalisation over (N, HW) per channel, fast version: plain C loops, one
 * channel at a time, each (sample, channel) plane a unit-stride run that gcc vectorises.
 * Sums of a plane are taken in float (at most 32x32 = 1024 terms in the reference models)
 * and summed across planes in double, so the statistics stay accurate for large N*HW.
 * Not oneDNN: its batch norm needs its own stats layout and reorders for the plain NCHW we
 * pass, and at these sizes the kernel is a few passes over <= 4 MiB (memory-bound either
 * way). Does not handle running-statistics semantics beyond PyTorch's (momentum form). */
#include <math.h>

#include "kernels.h"

void kern_bn_fwd_train(const float *x, const float *gamma, const float *beta, float *y, float *running_mean,
                       float *running_var, float *saved, int n, int c, int hw, float eps, float momentum) {
    const double cnt = (double)n * hw;
    for (int ch = 0; ch < c; ch++) {
        double s = 0;
        for (int i = 0; i < n; i++) {
            const float *restrict xp = x + ((size_t)i * c + ch) * hw;
            float ps = 0;
            for (int j = 0; j < hw; j++) ps += xp[j];
            s += ps;
        }
        const double mean = s / cnt;
        const float mf = (float)mean;
        double s2 = 0;   // two-pass variance: no cancellation for large means
        for (int i = 0; i < n; i++) {
            const float *restrict xp = x + ((size_t)i * c + ch) * hw;
            float ps = 0;
            for (int j = 0; j < hw; j++) {
                float d = xp[j] - mf;
                ps += d * d;
            }
            s2 += ps;
        }
        const double var = s2 / cnt;
        const float inv_std = (float)(1.0 / sqrt(var + eps));
        const float a = gamma[ch] * inv_std, b = beta[ch] - mf * a;   // y = a x + b
        for (int i = 0; i < n; i++) {
            const float *restrict xp = x + ((size_t)i * c + ch) * hw;
            float *restrict yp = y + ((size_t)i * c + ch) * hw;
            for (int j = 0; j < hw; j++) yp[j] = a * xp[j] + b;
        }
        const double unbiased = cnt > 1 ? var * cnt / (cnt - 1) : var;
        running_mean[ch] = (float)((1.0 - momentum) * running_mean[ch] + momentum * mean);
        running_var[ch] = (float)((1.0 - momentum) * running_var[ch] + momentum * unbiased);
        saved[ch] = mf;
        saved[c + ch] = inv_std;
    }
}

void kern_bn_fwd_eval(const float *x, const float *gamma, const float *beta, float *y, const float *running_mean,
                      const float *running_var, int n, int c, int hw, float eps) {
    for (int ch = 0; ch < c; ch++) {
        const float inv_std = (float)(1.0 / sqrt((double)running_var[ch] + eps));
        const float a = gamma[ch] * inv_std, b = beta[ch] - running_mean[ch] * a;
        for (int i = 0; i < n; i++) {
            const float *restrict xp = x + ((size_t)i * c + ch) * hw;
            float *restrict yp = y + ((size_t)i * c + ch) * hw;
            for (int j = 0; j < hw; j++) yp[j] = a * xp[j] + b;
        }
    }
}

/* dx = gamma * inv_std * (dy - mean(dy) - xh * mean(dy * xh)), xh = (x - mean) * inv_std. */
void kern_bn_bwd(const float *x, const float *gamma, const float *saved, const float *dy, float *dx,
                 float *dgamma, float *dbeta, int n, int c, int hw) {
    const double cnt = (double)n * hw;
    for (int ch = 0; ch < c; ch++) {
        const float mean = saved[ch], inv_std = saved[c + ch];
        double sdy = 0, sdyx = 0;   // sum dy, sum dy * (x - mean)
        for (int i = 0; i < n; i++) {
            const float *restrict xp = x + ((size_t)i * c + ch) * hw;
            const float *restrict gp = dy + ((size_t)i * c + ch) * hw;
            float a = 0, b = 0;
            for (int j = 0; j < hw; j++) {
                a += gp[j];
                b += gp[j] * (xp[j] - mean);
            }
            sdy += a;
            sdyx += b;
        }
        const double sdyxh = sdyx * inv_std;
        if (dgamma) dgamma[ch] += (float)sdyxh;
        if (dbeta) dbeta[ch] += (float)sdy;
        if (!dx) continue;
        // dx = k1 * dy + k2 * (x - mean) + k0
        const float k1 = gamma[ch] * inv_std;
        const float k2 = (float)(-(double)gamma[ch] * inv_std * inv_std * inv_std * sdyx / cnt);
        const float k0 = (float)(-(double)gamma[ch] * inv_std * sdy / cnt);
        for (int i = 0; i < n; i++) {
            const float *restrict xp = x + ((size_t)i * c + ch) * hw;
            const float *restrict gp = dy + ((size_t)i * c + ch) * hw;
            float *restrict dp = dx + ((size_t)i * c + ch) * hw;
            for (int j = 0; j < hw; j++) dp[j] += k1 * gp[j] + k2 * (xp[j] - mean) + k0;
        }
    }
}
