/* kern_basic.c: the fast versions of the small kernels: linear (OpenBLAS sgemm), relu,
 * max pool, global average pool, dropout, zero-pad/crop, softmax cross-entropy, and the
 * thread setting. Convolution is in conv.c, LSTM in lstm.c, batch norm in bn.c.
 *
 * The element-wise and pooling kernels are memory-bound: plain C loops written so that
 * gcc -O2 -march=native vectorises the inner loop (restrict pointers, unit stride, no
 * branches where a select will do). They are not threaded: at the reference models'
 * sizes (at most 64x16x32x32 floats = 4 MiB) a parallel region costs more than it saves,
 * and pipeline workers are already one process per core.
 *
 * Threads: OpenBLAS (the pthread build) is set with openblas_set_num_threads. Debian's
 * libdnnl 2.6 is built with OpenMP (it links libgomp), so its thread count is OpenMP's
 * nthreads-var ICV. We do not link -fopenmp ourselves (it would add a second, direct
 * dependency on libgomp and change nothing else); instead kern_set_threads looks up
 * omp_set_num_threads in the libgomp that libdnnl already loaded (dlopen of an already
 * loaded library just returns its handle). nthreads-var is per thread in OpenMP, so the
 * setting applies to oneDNN calls made from the calling thread (and threads it creates
 * afterwards inherit it); a program that runs kernels on several threads calls
 * kern_set_threads on each. */
#include <cblas.h>
#include <dlfcn.h>
#include <math.h>
#include <string.h>

#include "kernels.h"

void kern_set_threads(int n) {
    PD_ASSERT(n >= 1);
    openblas_set_num_threads(n);
    void *h = dlopen("libgomp.so.1", RTLD_LAZY);
    if (h) {
        void (*set)(int);
        *(void **)&set = dlsym(h, "omp_set_num_threads");
        if (set) set(n);
        dlclose(h);   /* drops our reference only; libdnnl keeps it loaded */
    }
}

/* ---- linear -------------------------------------------------------------------------- */
void kern_linear_fwd(const float *x, const float *w, const float *b, float *y, int n, int in, int out) {
    if (n == 0 || out == 0) return;
    float beta = 0.0f;
    if (b) {   // y starts as the bias rows, then y += x W^T
        for (int i = 0; i < n; i++) memcpy(y + (size_t)i * out, b, sizeof(float) * out);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w, in, beta, y, out);
}

void kern_linear_bwd(const float *x, const float *w, const float *dy, float *dx, float *dw, float *db, int n,
                     int in, int out) {
    if (n == 0) return;
    if (dx)   // dx (N,I) += dy (N,O) W (O,I)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1.0f, dy, out, w, in, 1.0f, dx, in);
    if (dw)   // dW (O,I) += dy^T x
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
    if (db)
        for (int i = 0; i < n; i++) {
            const float *restrict g = dy + (size_t)i * out;
            float *restrict d = db;
            for (int o = 0; o < out; o++) d[o] += g[o];
        }
}

/* ---- relu ---------------------------------------------------------------------------- */
void kern_relu_fwd(const float *restrict x, float *restrict y, size_t count) {
    for (size_t i = 0; i < count; i++) y[i] = x[i] > 0 ? x[i] : 0.0f;
}

void kern_relu_bwd(const float *restrict y, const float *restrict dy, float *restrict dx, size_t count) {
    for (size_t i = 0; i < count; i++) dx[i] += y[i] > 0 ? dy[i] : 0.0f;
}

/* ---- max pool ------------------------------------------------------------------------ */
void kern_maxpool_fwd(const float *x, float *y, int32_t *argmax, int n, int c, int h, int w, int k, int stride) {
    const int oh = (h - k) / stride + 1, ow = (w - k) / stride + 1;
    for (size_t p = 0; p < (size_t)n * c; p++) {
        const float *xp = x + p * h * w;
        float *yp = y + p * oh * ow;
        int32_t *ap = argmax + p * oh * ow;
        if (k == 2 && stride == 2) {   // the reference models' pool: unrolled, same tie rule (first max)
            for (int oy = 0; oy < oh; oy++) {
                const float *r0 = xp + 2 * oy * w, *r1 = r0 + w;
                for (int ox = 0; ox < ow; ox++) {
                    int i0 = 2 * oy * w + 2 * ox;
                    float m = r0[2 * ox];
                    int a = i0;
                    if (r0[2 * ox + 1] > m) m = r0[2 * ox + 1], a = i0 + 1;
                    if (r1[2 * ox] > m) m = r1[2 * ox], a = i0 + w;
                    if (r1[2 * ox + 1] > m) m = r1[2 * ox + 1], a = i0 + w + 1;
                    yp[oy * ow + ox] = m;
                    ap[oy * ow + ox] = a;
                }
            }
            continue;
        }
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) {
                int best = oy * stride * w + ox * stride;
                float m = xp[best];
                for (int r = 0; r < k; r++) {
                    const float *row = xp + (oy * stride + r) * w + ox * stride;
                    for (int q = 0; q < k; q++)
                        if (row[q] > m) m = row[q], best = (oy * stride + r) * w + ox * stride + q;
                }
                yp[oy * ow + ox] = m;
                ap[oy * ow + ox] = best;
            }
    }
}

void kern_maxpool_bwd(const float *dy, const int32_t *argmax, float *dx, int n, int c, int h, int w, int k,
                      int stride) {
    const size_t o = (size_t)((h - k) / stride + 1) * ((w - k) / stride + 1), hw = (size_t)h * w;
    for (size_t p = 0; p < (size_t)n * c; p++) {
        const float *g = dy + p * o;
        const int32_t *a = argmax + p * o;
        float *d = dx + p * hw;
        for (size_t i = 0; i < o; i++) d[a[i]] += g[i];
    }
}

/* ---- global average pool --------------------------------------------------------------- */
void kern_gap_fwd(const float *x, float *y, int n, int c, int hw) {
    const float inv = 1.0f / (float)hw;
    for (size_t p = 0; p < (size_t)n * c; p++) {
        const float *restrict xp = x + p * hw;
        float s = 0;
        for (int i = 0; i < hw; i++) s += xp[i];
        y[p] = s * inv;
    }
}

void kern_gap_bwd(const float *dy, float *dx, int n, int c, int hw) {
    const float inv = 1.0f / (float)hw;
    for (size_t p = 0; p < (size_t)n * c; p++) {
        float g = dy[p] * inv;
        float *restrict d = dx + p * hw;
        for (int i = 0; i < hw; i++) d[i] += g;
    }
}

/* ---- dropout ------------------------------------------------------------------------- */
void kern_dropout_fwd(const float *restrict x, float *restrict y, uint8_t *restrict mask, size_t count, float p,
                      uint64_t seed, uint64_t stream, uint64_t substream) {
    Rng r;
    rng_init(&r, seed, stream, substream);
    const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (size_t i = 0; i < count; i++) mask[i] = rng_uniform(&r) >= p;   // the RNG is the cost here
    for (size_t i = 0; i < count; i++) y[i] = mask[i] ? x[i] * scale : 0.0f;
}

void kern_dropout_bwd(const float *restrict dy, const uint8_t *restrict mask, float *restrict dx, size_t count,
                      float p) {
    const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (size_t i = 0; i < count; i++) dx[i] += mask[i] ? dy[i] * scale : 0.0f;
}

/* ---- pad / crop ---------------------------------------------------------------------- */
void kern_pad_fwd(const float *x, float *y, int n, int c, int h, int w, int p) {
    const int ph = h + 2 * p, pw = w + 2 * p;
    for (size_t q = 0; q < (size_t)n * c; q++) {
        float *yp = y + q * ph * pw;
        const float *xp = x + q * h * w;
        memset(yp, 0, sizeof(float) * (size_t)p * pw);
        for (int i = 0; i < h; i++) {
            float *row = yp + (size_t)(i + p) * pw;
            memset(row, 0, sizeof(float) * p);
            memcpy(row + p, xp + (size_t)i * w, sizeof(float) * w);
            memset(row + p + w, 0, sizeof(float) * p);
        }
        memset(yp + (size_t)(h + p) * pw, 0, sizeof(float) * (size_t)p * pw);
    }
}

void kern_pad_bwd(const float *dy, float *dx, int n, int c, int h, int w, int p) {
    const int ph = h + 2 * p, pw = w + 2 * p;
    for (size_t q = 0; q < (size_t)n * c; q++)
        for (int i = 0; i < h; i++) {
            const float *restrict g = dy + (q * ph + i + p) * pw + p;
            float *restrict d = dx + (q * h + i) * w;
            for (int j = 0; j < w; j++) d[j] += g[j];
        }
}

/* ---- softmax cross-entropy ----------------------------------------------------------- */
float kern_xent_fwd_bwd(const float *logits, const int32_t *labels, float *dlogits, int n, int k, float scale,
                        int *correct) {
    double loss = 0;   // sum over the minibatch in double: n terms of very different size
    int hits = 0;
    const float f = scale / (float)n;
    for (int i = 0; i < n; i++) {
        const float *z = logits + (size_t)i * k;
        PD_ASSERTF(labels[i] >= 0 && labels[i] < k, "label %d of sample %d not in [0, %d)", labels[i], i, k);
        int am = 0;
        for (int j = 1; j < k; j++)
            if (z[j] > z[am]) am = j;
        hits += am == labels[i];
        const float m = z[am];
        float s = 0;
        for (int j = 0; j < k; j++) s += expf(z[j] - m);
        loss += (double)logf(s) + m - z[labels[i]];
        if (dlogits) {
            float *d = dlogits + (size_t)i * k;
            const float inv = f / s;
            for (int j = 0; j < k; j++) d[j] += expf(z[j] - m) * inv;
            d[labels[i]] -= f;
        }
    }
    if (correct) *correct = hits;
    return (float)(loss / n);
}
