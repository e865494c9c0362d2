/* sgemm_shapes.c: oneDNN's dnnl_sgemm against OpenBLAS's cblas_sgemm, and kern_sgemm (which
 * picks between them, kern_basic.c), one thread, on the products of the models' layers where
 * the two libraries part on AVX2 CPUs: a linear layer's input gradient dx = dy W (NN, few rows,
 * ldb its input width), weight gradients dW = dy^T x (TN: linear, LSTM), and their neighbours
 * that stay with oneDNN. Row-major, ld = the row length, C += A B. Prints, per shape, the
 * fastest of REPS calls (default 15) of each after one untimed call, in ms; kern_sgemm's time
 * matches the library it took. Build after the project (cmake
 * --build build), then run:
 *   cc -O2 -march=native -D_POSIX_C_SOURCE=200809L -Isrc/core -Isrc/kernels bench/sgemm_shapes.c \
 *      build/libpd_kernels.a build/libpd_core.a -lopenblas -ldnnl -lcjson -lz -lm -lpthread \
 *      -o out/sgemm_shapes && OMP_NUM_THREADS=1 out/sgemm_shapes [REPS] */
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static const struct {
    char ta;
    int m, n, k;
    const char *what;
} SHAPES[] = {
    {'N', 64, 2048, 2048, "vgg16 2048x2048 dx"},
    {'N', 64, 1024, 1024, "mlp 1024x1024 dx"},
    {'N', 256, 1024, 256, "NN, ldb 1024"},
    {'N', 64, 2000, 2048, "NN, ldb 2000 (stays)"},
    {'N', 2048, 2048, 64, "NN, many rows (stays)"},
    {'T', 1024, 256, 1728, "lstm dW_hh"},
    {'T', 2048, 128, 64, "TN, narrow"},
    {'T', 2048, 2048, 64, "vgg16 2048x2048 dW"},
    {'T', 1024, 1024, 64, "mlp dW (stays)"},
};

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 15;
    kern_set_threads(1);
    printf("%-24s %2s %5s %5s %5s %9s %9s %9s\n", "product", "op", "m", "n", "k", "oneDNN", "OpenBLAS", "kern");
    for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++) {
        const char ta = SHAPES[s].ta;
        const int m = SHAPES[s].m, n = SHAPES[s].n, k = SHAPES[s].k, lda = ta == 'N' ? k : m;
        float *a = pd_alloc_f32((size_t)m * k), *b = pd_alloc_f32((size_t)k * n), *c = pd_alloc_f32((size_t)m * n);
        for (size_t i = 0; i < (size_t)m * k; i++) a[i] = (float)(i % 7) * 0.1f;
        for (size_t i = 0; i < (size_t)k * n; i++) b[i] = (float)(i % 5) * 0.1f;
        for (size_t i = 0; i < (size_t)m * n; i++) c[i] = 0.0f;
        double best[3] = {1e9, 1e9, 1e9};
        for (int r = 0; r <= reps; r++) {
            double t0 = now();
            dnnl_sgemm(ta, 'N', m, n, k, 1.0f, a, lda, b, n, 1.0f, c, n);
            double t1 = now();
            cblas_sgemm(CblasRowMajor, ta == 'T' ? CblasTrans : CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, lda, b,
                        n, 1.0f, c, n);
            double t2 = now();
            kern_sgemm(ta, 'N', m, n, k, 1.0f, a, lda, b, n, 1.0f, c, n);
            double t3 = now(), d[3] = {t1 - t0, t2 - t1, t3 - t2};
            for (int i = 0; r > 0 && i < 3; i++)
                if (d[i] < best[i]) best[i] = d[i];
        }
        printf("%-24s %cN %5d %5d %5d %9.3f %9.3f %9.3f\n", SHAPES[s].what, ta, m, n, k, 1e3 * best[0], 1e3 * best[1],
               1e3 * best[2]);
        pd_free(a);
        pd_free(b);
        pd_free(c);
    }
    return 0;
}
