/* sgemm_peak.c: the machine's single-thread sgemm speed, the reference for "GFLOP/s as a share
 * of peak" (docs/explanation/performance.md): dnnl_sgemm (oneDNN's JIT, AVX-512 where the CPU has it) on
 * M = N = K = 1024, the best of 10 timed calls after 2 untimed ones; prints GFLOP/s. Run with
 * OMP_NUM_THREADS=1. Built by bench/vgg16_vs_peak.sh. */
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(void) {
    const int n = 1024;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
    if (!a || !b || !c) return 1;
    for (long i = 0; i < (long)n * n; i++) a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f, c[i] = 0;
    double best = 1e30;
    for (int r = 0; r < 12; r++) {
        double t = now();
        if (dnnl_sgemm('N', 'N', n, n, n, 1.0f, a, n, b, n, 0.0f, c, n) != dnnl_success) return 1;
        t = now() - t;
        if (r >= 2 && t < best) best = t;
    }
    printf("%.1f\n", 2.0 * n * n * n / best / 1e9);
    free(a), free(b), free(c);
    return 0;
}
