/* conv_dense.c: the third candidate for conv2d: the convolution as one dense matrix, for
 * planes smaller than the kernel's window.
 *
 * A convolution is a linear map from a sample's input (C, H, W) to its output (K, OH, OW).
 * Written out as a matrix M, (K*P) x (C*HW) with P = OH*OW, entry ((k, o), (c, i)) is the
 * weight W[k, c, r, s] of the tap (r, s) that joins output pixel o to input pixel i, or 0 where
 * no tap does. Then, with x and y as (n, C*HW) and (n, K*P) row-major (which is NCHW):
 *   y = x M^T (+ bias, relu),   dx = g M,   dM = g^T x,   dW[k, c, r, s] = the sum of dM over
 *   the (o, i) pairs that tap (r, s) joins,
 * three GEMMs of K*P*C*HW multiply-adds per sample, where im2col and oneDNN's direct kernels do
 * K*C*R*S*P, counting the padding's zeros. The dense form does less work wherever HW < R*S:
 * vgg16's 2x2 planes under a 3x3 kernel with padding 1 (4 of the 9 taps touch the plane), where
 * it does 4/9 of the multiply-adds, and in three plain, well-shaped GEMMs (64 x 512 x 512).
 * On an AVX2 core (tools/kbench.c, N = 64, 1 thread) 128->128 @2 took 4.5 ms with oneDNN
 * (whose backward-weights is its gemm fallback there) and 4.9 with im2col; see conv.c for
 * this candidate's figure and the choice.
 *
 * M is rebuilt from W on every call (the weights change every step, and a pipeline's backward
 * runs on the stashed weights of its own forward): K*P*C*HW writes, 262,144 for 128->128 @2,
 * small against the GEMMs. Its gradient dM has the same size. Both and the masked dy live in
 * the descriptor, allocated in init; nothing is allocated per call. Float32 only, plain
 * layouts only. */
#include <string.h>

#include "conv_impl.h"

struct ConvDense {
    size_t rows, cols;   /* K*P, C*HW */
    int32_t *tap;        /* (P, HW): r*S + s of the tap joining output o and input i, or -1 */
    float *m, *dm;       /* (rows, cols): M, and dM before it is folded into dW */
    float *g;            /* (n_max, rows): dy masked by y > 0 (fuse_relu) */
};

size_t conv_dense_floats(const KConv *cv) {
    return (size_t)cv->k * cv->oh * cv->ow * (size_t)cv->c * cv->h * cv->w;
}

int conv_dense_new(const KConv *cv, ConvDense **out, Err *err) {
    *out = NULL;
    const size_t P = (size_t)cv->oh * cv->ow, HW = (size_t)cv->h * cv->w, mf = conv_dense_floats(cv);
    if (mf > CONV_DENSE_MAX)
        return err_set(err, PD_EINVAL,
                       "conv2d (dense): %d->%d channels on a %dx%d plane would need a %zu x %zu matrix (over %d "
                       "floats)",
                       cv->c, cv->k, cv->h, cv->w, (size_t)cv->k * P, (size_t)cv->c * HW, CONV_DENSE_MAX);
    ConvDense *d = pd_calloc(sizeof *d);
    d->rows = (size_t)cv->k * P;
    d->cols = (size_t)cv->c * HW;
    d->tap = pd_alloc(sizeof(int32_t) * P * HW);
    for (int oy = 0; oy < cv->oh; oy++)
        for (int ox = 0; ox < cv->ow; ox++)
            for (int iy = 0; iy < cv->h; iy++)
                for (int ix = 0; ix < cv->w; ix++) {
                    const int r = iy - oy * cv->stride + cv->pad, s = ix - ox * cv->stride + cv->pad;
                    const size_t o = (size_t)oy * cv->ow + ox, i = (size_t)iy * cv->w + ix;
                    d->tap[o * HW + i] = r >= 0 && r < cv->r && s >= 0 && s < cv->s ? r * cv->s + s : -1;
                }
    d->m = pd_alloc(sizeof(float) * mf);
    d->dm = pd_alloc(sizeof(float) * mf);
    d->g = pd_alloc(sizeof(float) * (size_t)cv->n_max * d->rows);
    *out = d;
    return PD_OK;
}

void conv_dense_free(ConvDense *d) {
    if (!d) return;
    pd_free(d->tap);
    pd_free(d->m);
    pd_free(d->dm);
    pd_free(d->g);
    pd_free(d);
}

typedef struct DenseJob {
    const KConv *cv;
    const ConvDense *d;
    const float *w;
    float *dw;
    int set;
} DenseJob;

/* M's rows of output channels [k0, k1) from W */
static void build_r(void *p, size_t k0, size_t k1) {
    const DenseJob *j = p;
    const KConv *cv = j->cv;
    const size_t P = (size_t)cv->oh * cv->ow, HW = (size_t)cv->h * cv->w, RS = (size_t)cv->r * cv->s;
    for (size_t k = k0; k < k1; k++)
        for (size_t o = 0; o < P; o++) {
            float *restrict row = j->d->m + (k * P + o) * j->d->cols;
            const int32_t *restrict tap = j->d->tap + o * HW;
            for (int c = 0; c < cv->c; c++) {
                const float *restrict wk = j->w + (k * (size_t)cv->c + (size_t)c) * RS;
                float *restrict rc = row + (size_t)c * HW;
                for (size_t i = 0; i < HW; i++) rc[i] = tap[i] >= 0 ? wk[tap[i]] : 0.0f;
            }
        }
}

/* dW's output channels [k0, k1) from dM: each tap's entries summed in (o, i) order */
static void fold_r(void *p, size_t k0, size_t k1) {
    const DenseJob *j = p;
    const KConv *cv = j->cv;
    const size_t P = (size_t)cv->oh * cv->ow, HW = (size_t)cv->h * cv->w, RS = (size_t)cv->r * cv->s;
    for (size_t k = k0; k < k1; k++)
        for (int c = 0; c < cv->c; c++) {
            float *restrict dwk = j->dw + (k * (size_t)cv->c + (size_t)c) * RS;
            if (j->set) memset(dwk, 0, sizeof(float) * RS);   /* then as onto zeros */
            for (size_t o = 0; o < P; o++) {
                const float *restrict dr = j->d->dm + (k * P + o) * j->d->cols + (size_t)c * HW;
                const int32_t *restrict tap = j->d->tap + o * HW;
                for (size_t i = 0; i < HW; i++)
                    if (tap[i] >= 0) dwk[tap[i]] += dr[i];
            }
        }
}

static void build_m(const KConv *cv, const ConvDense *d, const float *w) {
    DenseJob j = {.cv = cv, .d = d, .w = w};
    kern_parallel_for((size_t)cv->k, 1, 1, build_r, &j);
}

void conv_dense_fwd(ConvDense *d, const KConv *cv, int n, const float *x, const float *w, const float *b, float *y) {
    if (n == 0) return;
    build_m(cv, d, w);
    kern_sgemm('N', 'T', n, (int)d->rows, (int)d->cols, 1.0f, x, (int)d->cols, d->m, (int)d->cols, 0.0f, y,
               (int)d->rows);
    const size_t P = (size_t)cv->oh * cv->ow;
    if (!(cv->has_bias && b) && !cv->fuse_relu) return;
    for (int s = 0; s < n; s++)
        for (int k = 0; k < cv->k; k++) {
            float *restrict yk = y + ((size_t)s * cv->k + (size_t)k) * P;
            const float bk = cv->has_bias && b ? b[k] : 0.0f;
            if (cv->fuse_relu)
                for (size_t i = 0; i < P; i++) {
                    const float v = yk[i] + bk;
                    yk[i] = v > 0 ? v : 0.0f;
                }
            else
                for (size_t i = 0; i < P; i++) yk[i] += bk;
        }
}

void conv_dense_bwd(ConvDense *d, const KConv *cv, int n, int set, const float *x, const float *w, const float *y,
                    const float *dy, float *dx, float *dw, float *db) {
    const size_t P = (size_t)cv->oh * cv->ow, ny = (size_t)n * d->rows;
    const int wset = (set & KSET_DW) != 0;
    if (!cv->has_bias) db = NULL;
    if (n == 0) {   /* nothing to add; writing means zeros */
        if (wset && dw) memset(dw, 0, sizeof(float) * (size_t)cv->k * cv->c * cv->r * cv->s);
        if (wset && db) memset(db, 0, sizeof(float) * (size_t)cv->k);
        return;
    }
    const float *g = dy;
    if (cv->fuse_relu) {
        kern_relu_mask(y, dy, d->g, ny);
        g = d->g;
    }
    if (db)
        for (int k = 0; k < cv->k; k++) {   /* samples in order, each plane's pixels in order */
            float sum = 0;
            for (int s = 0; s < n; s++) {
                const float *restrict gk = g + ((size_t)s * cv->k + (size_t)k) * P;
                for (size_t i = 0; i < P; i++) sum += gk[i];
            }
            db[k] = (wset ? 0.0f : db[k]) + sum;
        }
    if (dx) {
        build_m(cv, d, w);
        kern_sgemm('N', 'N', n, (int)d->cols, (int)d->rows, 1.0f, g, (int)d->rows, d->m, (int)d->cols,
                   set & KSET_DX ? 0.0f : 1.0f, dx, (int)d->cols);
    }
    if (dw) {
        kern_sgemm('T', 'N', (int)d->rows, (int)d->cols, n, 1.0f, g, (int)d->rows, x, (int)d->cols, 0.0f, d->dm,
                   (int)d->cols);
        DenseJob j = {.cv = cv, .d = d, .dw = dw, .set = wset};
        kern_parallel_for((size_t)cv->k, 1, 1, fold_r, &j);
    }
}
