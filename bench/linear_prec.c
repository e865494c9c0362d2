/* linear_prec.c: the linear kernels (kernels.h, KLinear) alone at vgg16's 2048 x 2048 layer and
 * 64 rows, float32 against bf16: the forward, the backward's input gradient, its weight
 * gradient, and the two together, each writing its output (KSET_*), as the first backward after
 * an optimizer step does. The same buffers every call, so the 16.8 MB weight and gradient may
 * stay in cache between calls, which they do not inside the model (docs/explanation/
 * performance.md). Prints the fastest of REPS calls (default 30) after one untimed call, in ms.
 * Build after the project (cmake --build build), then run:
 *   cc -O2 -march=native -D_POSIX_C_SOURCE=200809L -Isrc/core -Isrc/kernels bench/linear_prec.c \
 *      build/libpd_kernels.a build/libpd_core.a -lopenblas -ldnnl -lcjson -lz -lm -lpthread \
 *      -o out/linear_prec && OMP_NUM_THREADS=1 out/linear_prec [REPS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

enum { N = 64, IN = 2048, OUT = 2048 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 30;
    if (reps < 1) {
        fprintf(stderr, "usage: linear_prec [REPS >= 1]\n");
        return 2;
    }
    float *x = malloc(sizeof(float) * N * IN), *w = malloc(sizeof(float) * IN * OUT), *b = calloc(OUT, sizeof(float));
    float *y = malloc(sizeof(float) * N * OUT), *dy = malloc(sizeof(float) * N * OUT), *dx = malloc(sizeof(float) * N * IN);
    float *dw = malloc(sizeof(float) * IN * OUT), *db = malloc(sizeof(float) * OUT);
    uint16_t *xb = malloc(sizeof(uint16_t) * N * IN);
    if (!x || !w || !b || !y || !dy || !dx || !dw || !db || !xb) return 1;
    for (long i = 0; i < (long)N * IN; i++) x[i] = 0.1f * (float)(i % 7);
    for (long i = 0; i < (long)IN * OUT; i++) w[i] = 0.01f * (float)(i % 11) - 0.05f;
    for (long i = 0; i < (long)N * OUT; i++) dy[i] = 0.1f * (float)(i % 5) - 0.2f;
    printf("linear %d x %d -> %d, fastest of %d calls, ms\n%-6s %9s %14s %16s %14s\n", N, IN, OUT, reps, "", "forward",
           "backward data", "backward weight", "backward both");
    for (int prec = 0; prec < KPREC_COUNT; prec++) {
        KLinear k;
        Err e = {0};
        if (kern_linear_init(&k, prec, N, IN, OUT, 1, &e)) {
            fprintf(stderr, "linear_prec: %s\n", e.msg);
            return 1;
        }
        uint16_t *keep = prec == KPREC_BF16 ? xb : NULL;
        double best[4] = {1e30, 1e30, 1e30, 1e30};
        for (int r = 0; r <= reps; r++) {   /* r 0: untimed */
            double t[5];
            t[0] = now();
            kern_linear_fwd_kx(&k, N, x, w, b, y, keep);
            t[1] = now();
            kern_linear_bwd_kx(&k, N, x, keep, w, dy, dx, NULL, NULL, KSET_DX);
            t[2] = now();
            kern_linear_bwd_kx(&k, N, x, keep, w, dy, NULL, dw, db, KSET_DW);
            t[3] = now();
            kern_linear_bwd_kx(&k, N, x, keep, w, dy, dx, dw, db, KSET_DX | KSET_DW);
            t[4] = now();
            for (int i = 0; r > 0 && i < 4; i++)
                if (t[i + 1] - t[i] < best[i]) best[i] = t[i + 1] - t[i];
        }
        printf("%-6s %9.3f %14.3f %16.3f %14.3f\n", kern_precision_name(prec), best[0] * 1e3, best[1] * 1e3,
               best[2] * 1e3, best[3] * 1e3);
        kern_linear_release(&k);
    }
    free(x), free(w), free(b), free(y), free(dy), free(dx), free(dw), free(db), free(xb);
    return 0;
}
