/* kbench.c: times fwd+bwd of the reference models' conv shapes (minibatch 64) for each
 * conv implementation (im2col+sgemm, oneDNN with its own layouts, oneDNN plain NCHW, the dense
 * matrix where it fits) at
 * 1 thread, plus the LSTM layers, and prints a table. Each kernel is checked against the
 * _ref forward once before it is timed. Not part of ctest; build by hand after building
 * pd_kernels:
 *   cc -O2 -march=native -D_POSIX_C_SOURCE=200809L -Isrc/core -Isrc/kernels tools/kbench.c \
 *      build-kernels/libpd_kernels.a build-kernels/libpd_core.a -lopenblas -ldnnl -lcjson -lz -lm \
 *      -o build-kernels/kbench && build-kernels/kbench [reps]
 * Reports the median of reps timings (default 7) after one warm-up. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

typedef struct Shape_ {
    const char *name;
    int c, h, w, k, r, stride, pad, bias, relu;
} BShape;

static const BShape SHAPES[] = {
    {"lenet conv1 1->6 5x5 @28", 1, 28, 28, 6, 5, 1, 2, 1, 1},
    {"lenet conv2 6->16 5x5 @14", 6, 14, 14, 16, 5, 1, 0, 1, 1},
    {"vgg 1->16 @32", 1, 32, 32, 16, 3, 1, 1, 1, 1},
    {"vgg 16->16 @32", 16, 32, 32, 16, 3, 1, 1, 1, 1},
    {"vgg 16->32 @16", 16, 16, 16, 32, 3, 1, 1, 1, 1},
    {"vgg 32->32 @16", 32, 16, 16, 32, 3, 1, 1, 1, 1},
    {"vgg 32->64 @8", 32, 8, 8, 64, 3, 1, 1, 1, 1},
    {"vgg 64->64 @8", 64, 8, 8, 64, 3, 1, 1, 1, 1},
    {"vgg 64->128 @4", 64, 4, 4, 128, 3, 1, 1, 1, 1},
    {"vgg 128->128 @4", 128, 4, 4, 128, 3, 1, 1, 1, 1},
    {"vgg 128->128 @2", 128, 2, 2, 128, 3, 1, 1, 1, 1},
    {"resnet 1->16 @32", 1, 32, 32, 16, 3, 1, 1, 0, 0},
    {"resnet 16->16 @32", 16, 32, 32, 16, 3, 1, 1, 0, 0},
    {"resnet 16->32 s2 @32", 16, 32, 32, 32, 3, 2, 1, 0, 0},
    {"resnet 16->32 1x1 s2", 16, 32, 32, 32, 1, 2, 0, 0, 0},
    {"resnet 32->32 @16", 32, 16, 16, 32, 3, 1, 1, 0, 0},
    {"resnet 32->64 s2 @16", 32, 16, 16, 64, 3, 2, 1, 0, 0},
    {"resnet 32->64 1x1 s2", 32, 16, 16, 64, 1, 2, 0, 0, 0},
    {"resnet 64->64 @8", 64, 8, 8, 64, 3, 1, 1, 0, 0},
};

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static float *rnd(size_t n, uint64_t tag) {
    float *a = pd_alloc_f32(n);
    Rng r;
    rng_init(&r, 1, 2, tag);
    for (size_t i = 0; i < n; i++) a[i] = rng_uniform(&r) * 2 - 1;
    return a;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    const int N = 64;
    kern_set_threads(1);
    static const char *names[] = {"auto", "im2col", "dnnl", "dnnl-plain", "dense"};
    printf("conv fwd+bwd (dx, dw, db), N=%d, 1 thread, median of %d, ms [GFLOP/s of the direct form]\n", N, reps);
    printf("%-26s %16s %16s %16s %16s   best\n", "shape", names[1], names[2], names[3], names[4]);
    double tot[KCONV_ALGO_COUNT] = {0};
    for (size_t si = 0; si < sizeof SHAPES / sizeof *SHAPES; si++) {
        const BShape *s = &SHAPES[si];
        printf("%-26s", s->name);
        double best = 1e30;
        int besta = 0;
        for (int algo = 1; algo < KCONV_ALGO_COUNT; algo++) {
            KConv cv;
            Err err = {0};
            if (kern_conv2d_init_algo(&cv, algo, N, s->c, s->h, s->w, s->k, s->r, s->r, s->stride, s->pad, s->bias,
                                      s->relu, &err)) {
                printf(" %16s", "n/a");
                continue;
            }
            size_t nx = (size_t)N * s->c * s->h * s->w, nw = (size_t)s->k * s->c * s->r * s->r;
            size_t ny = (size_t)N * s->k * cv.oh * cv.ow;
            float *x = rnd(nx, 1), *w = rnd(nw, 2), *b = rnd(s->k, 3), *y = pd_alloc_f32(ny), *yr = pd_alloc_f32(ny);
            float *dy = rnd(ny, 4), *dx = pd_alloc_f32(nx), *dw = pd_alloc_f32(nw), *db = pd_alloc_f32(s->k);
            kern_conv2d_fwd(&cv, N, x, w, b, y);
            kern_conv2d_fwd_ref(&cv, N, x, w, b, yr);
            double e = 0;
            for (size_t i = 0; i < ny; i++) e = fmax(e, fabs(y[i] - yr[i]));
            if (e > 1e-3) {
                fprintf(stderr, "%s %s: max abs err %g vs ref\n", s->name, names[algo], e);
                return 1;
            }
            double t[64];
            int nr = reps > 64 ? 64 : reps;
            for (int rep = -1; rep < nr; rep++) {
                double t0 = pd_now();
                kern_conv2d_fwd(&cv, N, x, w, b, y);
                kern_conv2d_bwd(&cv, N, x, w, y, dy, dx, dw, db);
                if (rep >= 0) t[rep] = pd_now() - t0;
            }
            qsort(t, nr, sizeof *t, cmp_d);
            double med = t[nr / 2];
            double flops = 3.0 * 2.0 * ny * s->c * s->r * s->r;   // fwd + bwd data + bwd weights
            printf(" %8.3f [%5.1f]", med * 1e3, flops / med * 1e-9);
            tot[algo] += med;
            if (med < best) best = med, besta = algo;
            float *all[] = {x, w, b, y, yr, dy, dx, dw, db};
            for (size_t i = 0; i < 9; i++) pd_free(all[i]);
            kern_conv2d_release(&cv);
        }
        KConv cv;
        Err err = {0};
        kern_conv2d_init(&cv, N, s->c, s->h, s->w, s->k, s->r, s->r, s->stride, s->pad, s->bias, s->relu, &err);
        printf("   %s (auto: %s)\n", names[besta], names[kern_conv2d_algo(&cv)]);
        kern_conv2d_release(&cv);
    }
    /* dense runs only where its matrix fits (n/a elsewhere): no total */
    printf("%-26s %16.3f %16.3f %16.3f %16s   (sum, ms)\n", "total", tot[1] * 1e3, tot[2] * 1e3, tot[3] * 1e3, "-");

    /* LSTM layers of the lstm model, T = 28 */
    const int lin[2] = {28, 256};
    for (int li = 0; li < 2; li++) {
        KLstm l;
        Err err = {0};
        const int T = 28, I = lin[li], H = 256, G = 4 * H;
        kern_lstm_init(&l, T, N, I, H, &err);
        float *x = rnd((size_t)T * N * I, 5), *wi = rnd((size_t)G * I, 6), *wh = rnd((size_t)G * H, 7);
        float *bi = rnd(G, 8), *bh = rnd(G, 9), *y = pd_alloc_f32((size_t)T * N * H);
        float *sv = pd_alloc_f32(kern_lstm_saved_floats(T, N, H)), *dy = rnd((size_t)T * N * H, 10);
        float *dx = pd_alloc_f32((size_t)T * N * I), *dwi = pd_alloc_f32((size_t)G * I), *dwh = pd_alloc_f32((size_t)G * H);
        float *dbi = pd_alloc_f32(G), *dbh = pd_alloc_f32(G);
        for (size_t i = 0; i < (size_t)G * H; i++) wh[i] *= 0.06f, wi[i % ((size_t)G * I)] *= 1.0f;
        double t[64], tf[64];
        int nr = reps > 64 ? 64 : reps;
        for (int rep = -1; rep < nr; rep++) {
            double t0 = pd_now();
            kern_lstm_fwd(&l, N, x, wi, wh, bi, bh, y, sv);
            double t1 = pd_now();
            kern_lstm_bwd(&l, N, x, wi, wh, y, sv, dy, dx, dwi, dwh, dbi, dbh);
            if (rep >= 0) t[rep] = pd_now() - t0, tf[rep] = t1 - t0;
        }
        qsort(t, nr, sizeof *t, cmp_d);
        qsort(tf, nr, sizeof *tf, cmp_d);
        double flops = 3.0 * 2.0 * T * N * G * (I + H);
        printf("lstm %3d->256 T=28 N=64: fwd %.3f ms, fwd+bwd %.3f ms [%.1f GFLOP/s]\n", I, tf[nr / 2] * 1e3,
               t[nr / 2] * 1e3, flops / t[nr / 2] * 1e-9);
        float *all[] = {x, wi, wh, bi, bh, y, sv, dy, dx, dwi, dwh, dbi, dbh};
        for (size_t i = 0; i < 13; i++) pd_free(all[i]);
        kern_lstm_release(&l);
    }
    return 0;
}
