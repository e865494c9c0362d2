/* test_kernels_util.h: helpers shared by tests/test_kernels*.c: random buffers from the
 * Philox RNG, the random linear functional L = sum(r * y) in double, and a central
 * finite-difference gradient of any scalar function of a float buffer. Header-only
 * (static functions), so each test executable stays one .c file. */
#ifndef PD_TEST_KERNELS_UTIL_H
#define PD_TEST_KERNELS_UTIL_H

#include <string.h>

#include "kernels.h"
#include "testutil.h"

/* Fills a[0..n) with uniforms in [lo, hi), a pure function of tag. */
static inline void tk_fill(float *a, size_t n, uint64_t tag, float lo, float hi) {
    Rng r;
    rng_init(&r, 12345, 99, tag);
    for (size_t i = 0; i < n; i++) a[i] = lo + (hi - lo) * rng_uniform(&r);
}

static inline float *tk_rand(size_t n, uint64_t tag, float lo, float hi) {
    float *a = pd_alloc_f32(n ? n : 1);
    tk_fill(a, n, tag, lo, hi);
    return a;
}

static inline float *tk_copy(const float *a, size_t n) {
    float *b = pd_alloc_f32(n ? n : 1);
    memcpy(b, a, sizeof(float) * n);
    return b;
}

static inline double tk_dot(const float *r, const float *y, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)r[i] * y[i];
    return s;
}

/* Central differences of f (a scalar function of p[0..n), evaluated through ctx) into
 * g[0..n): g[j] = (f(p + eps e_j) - f(p - eps e_j)) / (2 eps). p is restored. */
typedef double (*TkLoss)(void *ctx);
static inline void tk_fd(TkLoss f, void *ctx, float *p, size_t n, float eps, float *g) {
    for (size_t j = 0; j < n; j++) {
        float keep = p[j];
        p[j] = keep + eps;
        double lp = f(ctx);
        p[j] = keep - eps;
        double lm = f(ctx);
        p[j] = keep;
        g[j] = (float)((lp - lm) / (2.0 * eps));
    }
}

/* a[i] -= b[i]: turns a gradient accumulated onto a prefilled buffer back into the
 * gradient itself (tests prefill to check += semantics). */
static inline void tk_sub(float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) a[i] -= b[i];
}

/* Asserts that the normalised error between analytic and numeric gradients is below tol,
 * printing it either way for the log. */
static inline void tk_check_grad(const char *what, const float *analytic, const float *numeric, size_t n,
                                 double tol) {
    double e = tu_rel_err(analytic, numeric, n);
    print_message("  %-28s fd rel err %.2e (n=%zu)\n", what, e, n);
    assert_true(e < tol);
}

#endif
