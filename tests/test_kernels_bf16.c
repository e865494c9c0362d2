/* test_kernels_bf16.c: the bf16 precision (KPREC_BF16) of the matrix-product kernels (linear,
 * conv2d, attention) against their float32 reference twins, and the float32 path of the same
 * descriptors bitwise equal to the plain kernels.
 *
 * The bound. bf16 keeps 8 significant bits: rounding x to bf16 changes it by a relative
 * |d| <= u = 2^-8 (3.9e-3). A product term x_k w_k of two rounded inputs is off by a relative
 * <= 2u + u^2; accumulation is float32 (its error ~1e-7, negligible). With inputs uniform in
 * [-1, 1] the rounding errors are independent with zero mean, so the norm-wise relative error
 * of a whole output, ||got - ref|| / ||ref||, is about the RMS of the per-term error, ~u
 * (measured 2-3e-3 below). We assert it is below 1e-2 (2.5u: margin for the terms' spread)
 * AND above 1e-4: float32 with a different summation order stays below 1e-6, so a kernel
 * that silently ran in float32 fails the lower bound. The linear's db is a float32 sum of the
 * float32 dy (float32 tolerance); the convolution's is oneDNN's, from the bf16 diff_dst (upper
 * bound only). */
#include <math.h>

#include "test_kernels_util.h"

#define BF16_MAX 1e-2
#define BF16_MIN 1e-4

/* ||got - want|| / ||want||, in double */
static double rel(const float *got, const float *want, size_t n) {
    double e = 0, w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        e += d * d;
        w += (double)want[i] * want[i];
    }
    return sqrt(e / (w > 0 ? w : 1e-300));
}

static void check_bf16(const char *what, const float *got, const float *want, size_t n) {
    double e = rel(got, want, n);
    print_message("  %-26s bf16 rel err %.2e (n=%zu)\n", what, e, n);
    assert_true(e < BF16_MAX);
    assert_true(e > BF16_MIN);
}

/* The bf16 products need oneDNN's bf16 primitives, which this CPU may not have (AVX2): the
 * tests of their numbers skip there; test_bf16_refused checks what a user gets instead. */
static int need_bf16(void) {
    if (kern_bf16_available()) return 1;
    tu_skip("oneDNN has no bf16 products on this CPU (%s)", kern_cpu_isa());
    return 0;
}

static void test_precision_names(void **state) {
    (void)state;
    assert_int_equal(kern_precision_parse("fp32"), KPREC_FP32);
    assert_int_equal(kern_precision_parse("bf16"), KPREC_BF16);
    assert_int_equal(kern_precision_parse("fp16"), -1);
    assert_int_equal(kern_precision_parse("BF16"), -1);
    assert_int_equal(kern_precision_parse(NULL), -1);
    assert_string_equal(kern_precision_name(KPREC_BF16), "bf16");
    assert_string_equal(kern_precision_name(KPREC_FP32), "fp32");
}

static void test_bf16_rounding(void **state) {
    (void)state;
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1); 1 + 3 * 2^-8 rounds up to
     * 1 + 2^-6 (even); 1 + 2^-8 + 2^-20 is above halfway: 1 + 2^-7 */
    const float x[] = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -2.5f, 0.0f,
                       INFINITY, 0x1.fep127f, 1e-40f};
    const float want[] = {1.0f, 1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -2.5f, 0.0f, INFINITY, 0x1.fep127f, -1};   // the largest bf16
    uint16_t y[sizeof x / sizeof *x + 1];
    const size_t n = sizeof x / sizeof *x;
    kern_f32_to_bf16(x, y, n);
    for (size_t i = 0; i + 1 < n; i++) assert_true(kern_bf16_to_f32(y[i]) == want[i]);
    assert_true(fabsf(kern_bf16_to_f32(y[n - 1]) - 1e-40f) <= 0x1p-134f);   // subnormals: half their spacing
    const float nan = NAN;
    kern_f32_to_bf16(&nan, y, 1);
    assert_true(isnan(kern_bf16_to_f32(y[0])));
    /* a long buffer (the threaded path): every value within half a bf16 ulp */
    size_t big = 100003;
    float *a = tk_rand(big, 900, -1000, 1000);
    uint16_t *b = pd_alloc(big * sizeof *b);
    kern_f32_to_bf16(a, b, big);
    for (size_t i = 0; i < big; i++) assert_true(fabsf(kern_bf16_to_f32(b[i]) - a[i]) <= fabsf(a[i]) * 0x1p-8f);
    pd_free(a);
    pd_free(b);
    /* bitwise the one-element rule (nearest, ties to even, any NaN -> 0x7fc0) on every kind of
     * bit pattern (ties, NaNs of both signs and any payload, infinities, subnormals), at every
     * start offset and tail length of the vector loop */
    const size_t m = 4099;
    uint32_t *u = pd_alloc(m * sizeof *u);
    Rng r;
    rng_init(&r, 901, 0, 0);
    for (size_t i = 0; i < m; i++) {
        uint32_t v = rng_u32(&r);
        switch (i % 8) {
        case 1: v = (v & 0xffff0000u) | 0x8000u; break;           // a tie
        case 2: v = (v & 0x807fffffu) | 0x7f800000u; break;       // NaN or infinity
        case 3: v &= 0x807fffffu; break;                           // subnormal or zero
        case 4: v = (v & 0xffff0000u) | 0x7fffu; break;           // just below a tie
        default: break;
        }
        u[i] = v;
    }
    uint16_t *got = pd_alloc(m * sizeof *got);
    for (size_t off = 0; off < 17; off++) {
        size_t len = m - off - (off * 5) % 16;
        memset(got, 0xa5, m * sizeof *got);
        kern_f32_to_bf16((const float *)(const void *)(u + off), got + off, len);
        for (size_t i = 0; i < len; i++) {
            uint32_t v = u[off + i];
            uint16_t want = (v & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : (uint16_t)((v + 0x7fffu + ((v >> 16) & 1u)) >> 16);
            assert_int_equal(got[off + i], want);
        }
        if (off + len < m) assert_int_equal(got[off + len], 0xa5a5);   // nothing past the end
    }
    pd_free(u);
    pd_free(got);
}

/* ---- linear ---------------------------------------------------------------------------------- */
static void check_linear(int n_max, int in, int out, int bias, uint64_t tag) {
    print_message("  linear n_max=%d in=%d out=%d bias=%d\n", n_max, in, out, bias);
    KLinear kb, kf;
    Err err = {0};
    assert_int_equal(kern_linear_init(&kb, KPREC_BF16, n_max, in, out, bias, &err), PD_OK);
    assert_int_equal(kern_linear_init(&kf, KPREC_FP32, n_max, in, out, bias, &err), PD_OK);
    int ns[3] = {n_max, n_max / 2 + 1, n_max};   // both cached row counts, then back
    for (int pass = 0; pass < 3; pass++) {
        const int n = ns[pass];
        size_t nx = (size_t)n * in, nw = (size_t)out * in, ny = (size_t)n * out;
        float *x = tk_rand(nx, tag + 1, -1, 1), *w = tk_rand(nw, tag + 2, -1, 1);
        float *b = bias ? tk_rand(out, tag + 3, -1, 1) : NULL, *dy = tk_rand(ny, tag + 4, -1, 1);
        float *y = tk_rand(ny, tag + 5, -9, 9), *yr = pd_alloc_f32(ny), *yf = pd_alloc_f32(ny), *yp = pd_alloc_f32(ny);
        kern_linear_fwd_k(&kb, n, x, w, b, y);
        kern_linear_fwd_ref(x, w, b, yr, n, in, out);
        check_bf16("linear fwd", y, yr, ny);
        /* float32 descriptor: bitwise the plain kernel */
        kern_linear_fwd_k(&kf, n, x, w, b, yf);
        kern_linear_fwd(x, w, b, yp, n, in, out);
        assert_memory_equal(yf, yp, ny * sizeof(float));

        float *pre_x = tk_rand(nx, tag + 6, -1, 1), *pre_w = tk_rand(nw, tag + 7, -1, 1);
        float *pre_b = tk_rand(out, tag + 8, -1, 1);
        float *dx = tk_copy(pre_x, nx), *dw = tk_copy(pre_w, nw), *db = tk_copy(pre_b, out);
        float *rdx = pd_alloc_f32(nx), *rdw = pd_alloc_f32(nw), *rdb = pd_alloc_f32(out);
        kern_linear_bwd_k(&kb, n, x, w, dy, dx, dw, bias ? db : NULL, 0);
        kern_linear_bwd_ref(x, w, dy, rdx, rdw, bias ? rdb : NULL, n, in, out);
        tk_sub(dx, pre_x, nx);   // += onto the prefilled buffers
        tk_sub(dw, pre_w, nw);
        tk_sub(db, pre_b, out);
        check_bf16("linear dx", dx, rdx, nx);
        check_bf16("linear dw", dw, rdw, nw);
        if (bias) assert_int_equal(tu_compare("linear db (float32 sums)", db, rdb, out, 1e-4, 1e-5), 0);
        /* dx and dw alone give the same as together */
        float *dx1 = pd_alloc_f32(nx), *dw1 = pd_alloc_f32(nw), *dx2 = pd_alloc_f32(nx), *dw2 = pd_alloc_f32(nw);
        kern_linear_bwd_k(&kb, n, x, w, dy, dx1, dw1, NULL, 0);
        kern_linear_bwd_k(&kb, n, x, w, dy, dx2, NULL, NULL, 0);
        kern_linear_bwd_k(&kb, n, x, w, dy, NULL, dw2, NULL, 0);
        assert_memory_equal(dx1, dx2, nx * sizeof(float));
        assert_memory_equal(dw1, dw2, nw * sizeof(float));
        if (bias) {   // with db (dy converted in the same pass as it is summed), and db alone
            float *dx3 = pd_alloc_f32(nx), *dw3 = pd_alloc_f32(nw), *db3 = pd_alloc_f32(out), *db4 = pd_alloc_f32(out);
            kern_linear_bwd_k(&kb, n, x, w, dy, dx3, dw3, db3, 0);
            kern_linear_bwd_k(&kb, n, x, w, dy, NULL, NULL, db4, 0);
            assert_memory_equal(dx3, dx1, nx * sizeof(float));
            assert_memory_equal(dw3, dw1, nw * sizeof(float));
            assert_memory_equal(db3, db4, out * sizeof(float));
            float *more[] = {dx3, dw3, db3, db4};
            for (size_t i = 0; i < sizeof more / sizeof *more; i++) pd_free(more[i]);
        }
        /* float32 descriptor backward: bitwise the plain kernel */
        float *fdx = pd_alloc_f32(nx), *fdw = pd_alloc_f32(nw), *fdb = pd_alloc_f32(out);
        float *pdx = pd_alloc_f32(nx), *pdw = pd_alloc_f32(nw), *pdb = pd_alloc_f32(out);
        kern_linear_bwd_k(&kf, n, x, w, dy, fdx, fdw, fdb, 0);
        kern_linear_bwd(x, w, dy, pdx, pdw, pdb, n, in, out);
        assert_memory_equal(fdx, pdx, nx * sizeof(float));
        assert_memory_equal(fdw, pdw, nw * sizeof(float));
        assert_memory_equal(fdb, pdb, out * sizeof(float));
        /* KSET_*: written over whatever was there, the same numbers as added onto zeros (dx1,
         * dw1 above; fdx, fdw, fdb); garbage left behind would show. Both descriptors. */
        for (int set = 1; set <= (KSET_DX | KSET_DW); set++) {
            KLinear *kk[2] = {&kb, &kf};
            for (int d = 0; d < 2; d++) {
                float *sx = tk_rand(nx, tag + 9, 1e6, 2e6), *sw = tk_rand(nw, tag + 10, 1e6, 2e6);
                float *sb = tk_rand(out, tag + 11, 1e6, 2e6);
                float *zx = pd_alloc_f32(nx), *zw = pd_alloc_f32(nw), *zb = pd_alloc_f32(out);   /* zeros */
                if (!(set & KSET_DX)) memcpy(sx, zx, nx * sizeof(float));
                if (!(set & KSET_DW)) memcpy(sw, zw, nw * sizeof(float)), memcpy(sb, zb, out * sizeof(float));
                kern_linear_bwd_k(kk[d], n, x, w, dy, sx, sw, bias ? sb : NULL, set);
                kern_linear_bwd_k(kk[d], n, x, w, dy, zx, zw, bias ? zb : NULL, 0);
                assert_int_equal(tu_compare("linear dx (set)", sx, zx, nx, 0, 0), 0);
                assert_int_equal(tu_compare("linear dw (set)", sw, zw, nw, 0, 0), 0);
                if (bias) assert_int_equal(tu_compare("linear db (set)", sb, zb, out, 0, 0), 0);
                float *tmp[] = {sx, sw, sb, zx, zw, zb};
                for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) pd_free(tmp[i]);
            }
        }
        float *all[] = {x, w, b, dy, y, yr, yf, yp, pre_x, pre_w, pre_b, dx, dw, db, rdx, rdw, rdb,
                        dx1, dw1, dx2, dw2, fdx, fdw, fdb, pdx, pdw, pdb};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
    }
    kern_linear_release(&kb);
    kern_linear_release(&kf);
}

static void test_linear_bf16(void **state) {
    (void)state;
    if (!need_bf16()) return;
    check_linear(37, 70, 45, 1, 100);
    check_linear(64, 128, 384, 1, 200);   // gpt-mini's qkv projection, 64 rows
    check_linear(9, 33, 10, 0, 300);
}

/* x's bf16 copy kept from the forward (kern_linear_fwd_kx) is pd_bf16_pack's, and the backward
 * that reads it gives the plain calls' bits; a kept copy that is not x's changes dW alone (so
 * it is read); at fp32 none is asked for and any given is ignored. */
static void test_linear_keep(void **state) {
    (void)state;
    if (!need_bf16()) return;
    const int n = 48, in = 40, out = 24;
    Err err = {0};
    KLinear k;
    assert_int_equal(kern_linear_init(&k, KPREC_BF16, n, in, out, 1, &err), PD_OK);
    assert_int_equal(kern_linear_keep_bytes(KPREC_BF16, n, in), (size_t)n * in * 2);
    assert_int_equal(kern_linear_keep_bytes(KPREC_FP32, n, in), 0);
    size_t nx = (size_t)n * in, nw = (size_t)out * in, ny = (size_t)n * out;
    float *x = tk_rand(nx, 11, -1, 1), *w = tk_rand(nw, 12, -1, 1), *b = tk_rand(out, 13, -1, 1);
    float *dy = tk_rand(ny, 14, -1, 1), *y0 = pd_alloc_f32(ny), *y1 = pd_alloc_f32(ny);
    uint16_t *xb = pd_alloc(nx * 2), *want = pd_alloc(nx * 2);
    kern_linear_fwd_k(&k, n, x, w, b, y0);
    kern_linear_fwd_kx(&k, n, x, w, b, y1, xb);
    pd_bf16_pack(x, want, nx);
    assert_memory_equal(xb, want, nx * 2);
    assert_memory_equal(y0, y1, ny * sizeof(float));
    /* y straight to bf16 is the float32 y rounded (once); x given as bf16 gives the float32 y */
    uint16_t *yb = pd_alloc(ny * 2), *ywant = pd_alloc(ny * 2), *xb2 = pd_alloc(nx * 2);
    kern_linear_fwd_kb(&k, n, x, w, b, yb, xb2);
    pd_bf16_pack(y0, ywant, ny);
    assert_memory_equal(yb, ywant, ny * 2);
    assert_memory_equal(xb2, want, nx * 2);
    memset(y1, 0, ny * sizeof(float));
    kern_linear_fwd_bx(&k, n, xb, w, b, y1);
    assert_memory_equal(y0, y1, ny * sizeof(float));
    for (size_t i = 0; i < nx; i++) xb2[i] ^= 0x8000;   /* it reads xb: -x gives -y + 2b */
    kern_linear_fwd_bx(&k, n, xb2, w, b, y1);
    for (size_t i = 0; i < ny; i++) assert_float_equal(y1[i], -y0[i] + 2 * b[i % out], 1e-5);
    pd_free(yb);
    pd_free(ywant);
    pd_free(xb2);
    float *g[2][3];   /* dx, dw, db: plain, kept */
    for (int v = 0; v < 2; v++) {
        g[v][0] = tk_rand(nx, 20, -1, 1), g[v][1] = tk_rand(nw, 21, -1, 1), g[v][2] = tk_rand(out, 22, -1, 1);
        if (v) kern_linear_bwd_kx(&k, n, x, xb, w, dy, g[v][0], g[v][1], g[v][2], 0);
        else kern_linear_bwd_k(&k, n, x, w, dy, g[v][0], g[v][1], g[v][2], 0);
    }
    assert_memory_equal(g[0][0], g[1][0], nx * sizeof(float));
    assert_memory_equal(g[0][1], g[1][1], nw * sizeof(float));
    assert_memory_equal(g[0][2], g[1][2], out * sizeof(float));
    /* another kept copy (x's negative): dW differs, dx does not */
    for (size_t i = 0; i < nx; i++) xb[i] ^= 0x8000;
    float *dx2 = tk_rand(nx, 20, -1, 1), *dw2 = tk_rand(nw, 21, -1, 1);
    kern_linear_bwd_kx(&k, n, x, xb, w, dy, dx2, dw2, NULL, KSET_DX | KSET_DW);
    kern_linear_bwd_k(&k, n, x, w, dy, g[0][0], g[0][1], NULL, KSET_DX | KSET_DW);
    assert_memory_equal(dx2, g[0][0], nx * sizeof(float));
    for (size_t i = 0; i < nw; i++) assert_true(dw2[i] == -g[0][1][i]);
    kern_linear_release(&k);
    /* fp32: the kept copy is neither written nor read */
    assert_int_equal(kern_linear_init(&k, KPREC_FP32, n, in, out, 1, &err), PD_OK);
    memset(xb, 0xab, nx * 2);
    kern_linear_fwd_kx(&k, n, x, w, b, y1, xb);
    for (size_t i = 0; i < nx; i++) assert_int_equal(xb[i], 0xabab);
    kern_linear_release(&k);
    float *all[] = {x, w, b, dy, y0, y1, g[0][0], g[0][1], g[0][2], g[1][0], g[1][1], g[1][2], dx2, dw2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
    pd_free(xb);
    pd_free(want);
}

/* ---- conv2d ---------------------------------------------------------------------------------- */
static void check_conv(int n_max, int n, int c, int h, int k, int r, int stride, int pad, int bias, int relu,
                       uint64_t tag) {
    print_message("  conv n=%d/%d c=%d %dx%d k=%d %dx%d s%d p%d bias=%d relu=%d\n", n, n_max, c, h, h, k, r, r,
                  stride, pad, bias, relu);
    KConv cv;
    Err err = {0};
    int rc = kern_conv2d_init_prec(&cv, KCONV_AUTO, KPREC_BF16, n_max, c, h, h, k, r, r, stride, pad, bias, relu,
                                   &err);
    if (rc) print_message("%s\n", err.msg);
    assert_int_equal(rc, PD_OK);
    assert_int_equal(kern_conv2d_algo(&cv), KCONV_DNNL);
    assert_int_equal(cv.prec, KPREC_BF16);
    /* blocked layouts only where the channels fill the blocks; which, oneDNN chooses */
    const int B = kern_blk_width(), lay = kern_conv2d_layouts(&cv);
    assert_int_equal(lay & ~((c % B ? 0 : KCONV_X_BLK) | (k % B ? 0 : KCONV_Y_BLK)), 0);
    size_t nx = (size_t)n * c * h * h, nw = (size_t)k * c * r * r, ny = (size_t)n * k * cv.oh * cv.ow;
    float *x = tk_rand(nx, tag + 1, -1, 1), *w = tk_rand(nw, tag + 2, -1, 1);
    float *b = bias ? tk_rand(k, tag + 3, -1, 1) : NULL, *dy = tk_rand(ny, tag + 4, -1, 1);
    float *y = tk_rand(ny, tag + 5, -9, 9), *yr = pd_alloc_f32(ny);
    kern_conv2d_fwd(&cv, n, x, w, b, y);
    kern_conv2d_fwd_ref(&cv, n, x, w, b, yr);
    check_bf16("conv fwd", y, yr, ny);
    float *pre_x = tk_rand(nx, tag + 6, -1, 1), *pre_w = tk_rand(nw, tag + 7, -1, 1), *pre_b = tk_rand(k, tag + 8, -1, 1);
    float *dx = tk_copy(pre_x, nx), *dw = tk_copy(pre_w, nw), *db = tk_copy(pre_b, k);
    float *rdx = pd_alloc_f32(nx), *rdw = pd_alloc_f32(nw), *rdb = pd_alloc_f32(k);
    /* the reference backward gets the bf16 forward's y, so both mask dy by the same relu */
    kern_conv2d_bwd(&cv, n, x, w, y, dy, dx, dw, db);
    kern_conv2d_bwd_ref(&cv, n, x, w, y, dy, rdx, rdw, rdb);
    tk_sub(dx, pre_x, nx);
    tk_sub(dw, pre_w, nw);
    tk_sub(db, pre_b, k);
    check_bf16("conv dx", dx, rdx, nx);
    check_bf16("conv dw", dw, rdw, nw);
    if (bias) {   // oneDNN sums db from the bf16 diff_dst: within the bound, maybe exact
        double e = rel(db, rdb, k);
        print_message("  %-26s bf16 rel err %.2e (n=%d)\n", "conv db", e, k);
        assert_true(e < BF16_MAX);
    }
    kern_conv2d_release(&cv);
    float *all[] = {x, w, b, dy, y, yr, pre_x, pre_w, pre_b, dx, dw, db, rdx, rdw, rdb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
}

static void test_conv_bf16(void **state) {
    (void)state;
    if (!need_bf16()) return;
    check_conv(4, 4, 16, 12, 32, 3, 1, 1, 1, 1, 1000);
    check_conv(5, 3, 16, 9, 16, 3, 2, 1, 0, 0, 2000);   // n < n_max: the second cached slot
    check_conv(2, 2, 32, 8, 64, 1, 2, 0, 0, 0, 3000);   // 1x1, c >= 32: oneDNN
    check_conv(3, 3, 6, 10, 16, 5, 1, 2, 1, 0, 4000);
}

/* The float32 precision is the plain descriptor bitwise; a bf16 request where the measured
 * choice is im2col (one input channel) stays float32. */
static void test_conv_fp32_unchanged(void **state) {
    (void)state;
    KConv a, b, c1;
    Err err = {0};
    assert_int_equal(kern_conv2d_init_algo(&a, KCONV_AUTO, 3, 16, 10, 10, 32, 3, 3, 1, 1, 1, 1, &err), PD_OK);
    assert_int_equal(kern_conv2d_init_prec(&b, KCONV_AUTO, KPREC_FP32, 3, 16, 10, 10, 32, 3, 3, 1, 1, 1, 1, &err), PD_OK);
    assert_int_equal(b.prec, KPREC_FP32);
    assert_int_equal(kern_conv2d_layouts(&a), kern_conv2d_layouts(&b));
    size_t nx = 3 * 16 * 100, nw = 32 * 16 * 9, ny = 3 * 32 * 100;
    float *x = tk_rand(nx, 1, -1, 1), *w = tk_rand(nw, 2, -1, 1), *bb = tk_rand(32, 3, -1, 1),
          *dy = tk_rand(ny, 4, -1, 1);
    float *ya = pd_alloc_f32(ny), *yb = pd_alloc_f32(ny);
    float *dxa = pd_alloc_f32(nx), *dxb = pd_alloc_f32(nx), *dwa = pd_alloc_f32(nw), *dwb = pd_alloc_f32(nw);
    float *dba = pd_alloc_f32(32), *dbb = pd_alloc_f32(32);
    kern_conv2d_fwd(&a, 3, x, w, bb, ya);
    kern_conv2d_fwd(&b, 3, x, w, bb, yb);
    assert_memory_equal(ya, yb, ny * sizeof(float));
    kern_conv2d_bwd(&a, 3, x, w, ya, dy, dxa, dwa, dba);
    kern_conv2d_bwd(&b, 3, x, w, yb, dy, dxb, dwb, dbb);
    assert_memory_equal(dxa, dxb, nx * sizeof(float));
    assert_memory_equal(dwa, dwb, nw * sizeof(float));
    assert_memory_equal(dba, dbb, 32 * sizeof(float));
    if (kern_bf16_available()) {
        assert_int_equal(kern_conv2d_init_prec(&c1, KCONV_AUTO, KPREC_BF16, 3, 1, 10, 10, 8, 3, 3, 1, 1, 1, 0, &err),
                         PD_OK);
        assert_int_equal(kern_conv2d_algo(&c1), KCONV_IM2COL);
        assert_int_equal(c1.prec, KPREC_FP32);
        kern_conv2d_release(&c1);
    }
    kern_conv2d_release(&a);
    kern_conv2d_release(&b);
    float *all[] = {x, w, bb, dy, ya, yb, dxa, dxb, dwa, dwb, dba, dbb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
}

/* ---- attention ------------------------------------------------------------------------------- */
static void check_attention(int n_max, int n, int t, int heads, int hd, int causal, uint64_t tag) {
    print_message("  attention n=%d/%d t=%d heads=%d hd=%d causal=%d\n", n, n_max, t, heads, hd, causal);
    KAttn a, f;
    Err err = {0};
    assert_int_equal(kern_attention_init_prec(&a, KTF_AUTO, KPREC_BF16, n_max, t, heads, hd, causal, &err), PD_OK);
    assert_int_equal(a.prec, KPREC_BF16);
    assert_int_equal(kern_attention_init_prec(&f, KTF_AUTO, KPREC_FP32, n_max, t, heads, hd, causal, &err), PD_OK);
    const int d = heads * hd;
    size_t nq = (size_t)n * t * 3 * d, ny = (size_t)n * t * d, np = (size_t)n * heads * t * t;
    /* q and k scaled up so that the probabilities are far from uniform (softmax sensitive) */
    float *qkv = tk_rand(nq, tag + 1, -2, 2), *dy = tk_rand(ny, tag + 2, -1, 1);
    float *y = tk_rand(ny, tag + 3, -9, 9), *p = pd_alloc_f32(np), *yr = pd_alloc_f32(ny), *pr = pd_alloc_f32(np);
    kern_attention_fwd(&a, n, qkv, y, p);
    kern_attention_fwd_ref(qkv, yr, pr, n, t, heads, hd, causal);
    check_bf16("attention y", y, yr, ny);
    check_bf16("attention p", p, pr, np);
    float *pre = tk_rand(nq, tag + 4, -1, 1), *dq = tk_copy(pre, nq), *dqr = pd_alloc_f32(nq);   // overwritten
    float *scr = pd_alloc_f32((size_t)t * t);
    kern_attention_bwd(&a, n, qkv, pr, dy, dq);   // both from the reference probabilities
    kern_attention_bwd_ref(qkv, pr, dy, dqr, scr, n, t, heads, hd, causal);
    check_bf16("attention dqkv", dq, dqr, nq);
    /* float32 precision: bitwise kern_attention_init's descriptor */
    KAttn g;
    assert_int_equal(kern_attention_init(&g, KTF_AUTO, n_max, t, heads, hd, causal, &err), PD_OK);
    float *y1 = pd_alloc_f32(ny), *y2 = pd_alloc_f32(ny), *p1 = pd_alloc_f32(np), *p2 = pd_alloc_f32(np);
    float *d1 = pd_alloc_f32(nq), *d2 = pd_alloc_f32(nq);
    kern_attention_fwd(&f, n, qkv, y1, p1);
    kern_attention_fwd(&g, n, qkv, y2, p2);
    assert_memory_equal(y1, y2, ny * sizeof(float));
    assert_memory_equal(p1, p2, np * sizeof(float));
    kern_attention_bwd(&f, n, qkv, p1, dy, d1);
    kern_attention_bwd(&g, n, qkv, p2, dy, d2);
    assert_memory_equal(d1, d2, nq * sizeof(float));
    kern_attention_release(&a);
    kern_attention_release(&f);
    kern_attention_release(&g);
    float *all[] = {qkv, dy, y, p, yr, pr, pre, dq, dqr, scr, y1, y2, p1, p2, d1, d2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
}

static void test_attention_bf16(void **state) {
    (void)state;
    if (!need_bf16()) return;
    check_attention(3, 3, 16, 2, 8, 1, 5000);
    check_attention(4, 2, 64, 4, 32, 1, 6000);   // gpt-mini's shape, n < n_max
    check_attention(2, 2, 10, 3, 4, 0, 7000);
}

/* The attention core's kept bf16 qkv and P: written by the forward as pd_bf16_pack makes them,
 * read by the backward (the same bits as converting again; a different copy changes dqkv), and
 * untouched at fp32. */
static void test_attention_keep(void **state) {
    (void)state;
    if (!need_bf16()) return;
    const int n = 3, t = 12, heads = 2, hd = 8, d = heads * hd;
    Err err = {0};
    KAttn a;
    assert_int_equal(kern_attention_init_prec(&a, KTF_AUTO, KPREC_BF16, n, t, heads, hd, 1, &err), PD_OK);
    size_t nq = (size_t)n * t * 3 * d, ny = (size_t)n * t * d, np = (size_t)n * heads * t * t;
    size_t qb = (nq * 2 + 63) / 64 * 64;
    assert_int_equal(kern_attention_keep_bytes(KPREC_BF16, n, t, heads, hd), qb + np * 2);
    assert_int_equal(kern_attention_keep_bytes(KPREC_FP32, n, t, heads, hd), 0);
    float *qkv = tk_rand(nq, 31, -2, 2), *dy = tk_rand(ny, 32, -1, 1);
    float *y0 = pd_alloc_f32(ny), *y1 = pd_alloc_f32(ny), *p0 = pd_alloc_f32(np), *p1 = pd_alloc_f32(np);
    char *keep = pd_alloc(qb + np * 2);
    uint16_t *want = pd_alloc(nq * 2 > np * 2 ? nq * 2 : np * 2);
    kern_attention_fwd(&a, n, qkv, y0, p0);
    kern_attention_fwd_kx(&a, n, qkv, y1, p1, keep);
    assert_memory_equal(y0, y1, ny * sizeof(float));
    assert_memory_equal(p0, p1, np * sizeof(float));
    pd_bf16_pack(qkv, want, nq);
    assert_memory_equal(keep, want, nq * 2);
    pd_bf16_pack(p0, want, np);
    assert_memory_equal(keep + qb, want, np * 2);
    float *g0 = tk_rand(nq, 33, -1, 1), *g1 = tk_rand(nq, 34, -1, 1);
    kern_attention_bwd(&a, n, qkv, p0, dy, g0);
    kern_attention_bwd_kx(&a, n, qkv, p0, dy, g1, keep);
    assert_memory_equal(g0, g1, nq * sizeof(float));
    /* qkv given as bf16 in keep and y written as bf16: y0 rounded, the same p and kept P, and
     * the backward from that keep alone (no float32 qkv) as before */
    assert_true(kern_attention_takes_bf16(&a));
    char *keep2 = pd_alloc(qb + np * 2);
    uint16_t *yb = pd_alloc(ny * 2), *ywant = pd_alloc(ny * 2);
    pd_bf16_pack(qkv, (uint16_t *)keep2, nq);
    memset(p1, 0, np * sizeof(float));
    kern_attention_fwd_kb(&a, n, p1, keep2, yb);
    assert_memory_equal(p0, p1, np * sizeof(float));
    assert_memory_equal(keep2, keep, qb + np * 2);
    pd_bf16_pack(y0, ywant, ny);
    assert_memory_equal(yb, ywant, ny * 2);
    kern_attention_bwd_kx(&a, n, NULL, p0, dy, g1, keep2);
    assert_memory_equal(g0, g1, nq * sizeof(float));
    pd_free(keep2);
    pd_free(yb);
    pd_free(ywant);
    /* another kept qkv, its v negated: the backward reads it (dS, so dq and dk, negate; dv not) */
    uint16_t *kq = (uint16_t *)keep;
    for (size_t r = 0; r < (size_t)n * t; r++)
        for (int c = 2 * d; c < 3 * d; c++) kq[r * 3 * d + c] ^= 0x8000;
    kern_attention_bwd_kx(&a, n, qkv, p0, dy, g1, keep);
    for (size_t r = 0; r < (size_t)n * t; r++)
        for (int c = 0; c < 3 * d; c++) {
            float w = g0[r * 3 * d + c], got = g1[r * 3 * d + c];
            if (c < 2 * d) assert_true(got == -w);
            else assert_true(got == w);
        }
    kern_attention_release(&a);
    /* fp32: the kept copies are neither written nor read */
    assert_int_equal(kern_attention_init_prec(&a, KTF_AUTO, KPREC_FP32, n, t, heads, hd, 1, &err), PD_OK);
    assert_false(kern_attention_takes_bf16(&a));
    memset(keep, 0xab, qb + np * 2);
    kern_attention_fwd_kx(&a, n, qkv, y1, p1, keep);
    kern_attention_bwd_kx(&a, n, qkv, p1, dy, g1, keep);
    for (size_t i = 0; i < qb + np * 2; i++) assert_int_equal((unsigned char)keep[i], 0xab);
    kern_attention_release(&a);
    float *all[] = {qkv, dy, y0, y1, p0, p1, g0, g1};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
    pd_free(keep);
    pd_free(want);
}

/* bf16 convolution: the forward's converted x, kept (kern_conv2d_fwd_kx), is x rounded to bf16
 * in whatever layout the primitives chose (read back through kern_conv2d_keep_read), and the
 * backward reads it instead of converting x again: the same bits, at n_max and at a second batch
 * size; a kept x with its signs flipped negates dW exactly and leaves dx and db. Where the
 * primitives chose layouts that keep nothing (keep_bytes 0), a keep passed in is neither written
 * nor read. At float32 nothing is kept. test_kernels_conv's test_conv_forced_layouts runs the
 * same with each layout forced. */
static void test_conv_keep(void **state) {
    (void)state;
    if (!need_bf16()) return;
    const int nmax = 4, c = 16, hw = 8, k = 32;
    Err err = {0};
    KConv cv;
    assert_int_equal(kern_conv2d_init_prec(&cv, KCONV_AUTO, KPREC_BF16, nmax, c, hw, hw, k, 3, 3, 1, 1, 1, 0, &err),
                     PD_OK);
    assert_int_equal(cv.prec, KPREC_BF16);
    const size_t plane = (size_t)hw * hw, nw = (size_t)k * c * 9;
    print_message("  keeps %zu bytes for %d samples (blocked layouts %d)\n", kern_conv2d_keep_bytes(&cv, nmax), nmax,
                  kern_conv2d_layouts(&cv));
    for (int n = nmax; n >= 3; n--) {
        const size_t nx = (size_t)n * c * plane, ny = (size_t)n * k * plane, kb = kern_conv2d_keep_bytes(&cv, n);
        if (kb) assert_true(kb >= nx * 2);
        float *x = tk_rand(nx, 41 + n, -1, 1), *w = tk_rand(nw, 42, -1, 1), *b = tk_rand(k, 43, -1, 1),
              *dy = tk_rand(ny, 44, -1, 1);
        float *y0 = pd_alloc_f32(ny), *y1 = pd_alloc_f32(ny), *dx0 = pd_alloc_f32(nx), *dx1 = pd_alloc_f32(nx);
        float *dw0 = pd_alloc_f32(nw), *dw1 = pd_alloc_f32(nw), *db0 = pd_alloc_f32(k), *db1 = pd_alloc_f32(k);
        const size_t kbytes = kb ? kb : nx * 2;   /* a keep the descriptor must leave alone when kb is 0 */
        uint16_t *keep = pd_alloc(kbytes), *half = pd_alloc(nx * 2);
        float *back = pd_alloc_f32(nx), *want = pd_alloc_f32(nx);
        memset(keep, 0xab, kbytes);
        kern_conv2d_fwd(&cv, n, x, w, b, y0);
        kern_conv2d_fwd_kx(&cv, n, 0, x, w, b, y1, keep);
        assert_memory_equal(y0, y1, ny * sizeof(float));
        if (kb) {
            pd_bf16_pack(x, half, nx);
            pd_bf16_unpack(half, want, nx);
            kern_conv2d_keep_read(&cv, n, keep, back);
            assert_memory_equal(back, want, nx * sizeof(float));
        } else {
            for (size_t i = 0; i < kbytes / 2; i++) assert_int_equal(keep[i], 0xabab);
        }
        kern_conv2d_bwd_set(&cv, n, 0, KSET_DX | KSET_DW, x, w, y0, dy, dx0, dw0, db0);
        kern_conv2d_bwd_kx(&cv, n, 0, KSET_DX | KSET_DW, x, keep, w, y0, dy, dx1, dw1, db1);
        assert_memory_equal(dx0, dx1, nx * sizeof(float));
        assert_memory_equal(dw0, dw1, nw * sizeof(float));
        assert_memory_equal(db0, db1, k * sizeof(float));
        if (kb) {
            for (size_t i = 0; i < kb / 2; i++) keep[i] ^= 0x8000;
            kern_conv2d_bwd_kx(&cv, n, 0, KSET_DX | KSET_DW, x, keep, w, y0, dy, dx1, dw1, db1);
            assert_memory_equal(dx0, dx1, nx * sizeof(float));
            assert_memory_equal(db0, db1, k * sizeof(float));
            for (size_t i = 0; i < nw; i++) assert_true(dw1[i] == -dw0[i]);
        }
        float *all[] = {x, w, b, dy, y0, y1, dx0, dx1, dw0, dw1, db0, db1, back, want};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
        pd_free(keep);
        pd_free(half);
    }
    kern_conv2d_release(&cv);
    assert_int_equal(kern_conv2d_init_prec(&cv, KCONV_AUTO, KPREC_FP32, nmax, c, hw, hw, k, 3, 3, 1, 1, 1, 0, &err),
                     PD_OK);
    assert_int_equal(kern_conv2d_keep_bytes(&cv, nmax), 0);
    kern_conv2d_release(&cv);
}

/* Whether bf16 runs here follows the instruction set oneDNN found (its bf16 primitives start at
 * avx512_core); where it does not, every bf16 descriptor is refused with an error that names the
 * CPU's instruction set, and float32 is unaffected. */
static void test_bf16_refused(void **state) {
    (void)state;
    const char *isa = kern_cpu_isa();
    if (!strncmp(isa, "avx512_core", 11)) assert_true(kern_bf16_available());
    if (!strcmp(isa, "avx2") || !strcmp(isa, "avx2_vnni") || !strcmp(isa, "avx") || !strcmp(isa, "sse41"))
        assert_false(kern_bf16_available());
    Err err = {0};
    assert_int_equal(kern_precision_check(KPREC_FP32, &err), PD_OK);
    if (kern_bf16_available()) {
        assert_int_equal(kern_precision_check(KPREC_BF16, &err), PD_OK);
        return;
    }
    assert_int_equal(kern_precision_check(KPREC_BF16, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "bf16 compute is not available on this CPU"));
    assert_non_null(strstr(err.msg, isa));
    KLinear k;
    KConv cv;
    KAttn at;
    err = (Err){0};
    assert_int_equal(kern_linear_init(&k, KPREC_BF16, 8, 16, 16, 1, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "not available"));
    err = (Err){0};   // a shape oneDNN would run, and one im2col would
    assert_int_equal(kern_conv2d_init_prec(&cv, KCONV_AUTO, KPREC_BF16, 2, 16, 8, 8, 16, 3, 3, 1, 1, 1, 0, &err),
                     PD_EINVAL);
    assert_non_null(strstr(err.msg, "not available"));
    assert_int_equal(kern_conv2d_init_prec(&cv, KCONV_AUTO, KPREC_BF16, 2, 1, 8, 8, 4, 3, 3, 1, 1, 1, 0, &err),
                     PD_EINVAL);
    err = (Err){0};
    assert_int_equal(kern_attention_init_prec(&at, KTF_AUTO, KPREC_BF16, 2, 8, 2, 4, 1, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "not available"));
    assert_int_equal(kern_linear_init(&k, KPREC_FP32, 8, 16, 16, 1, &err), PD_OK);
    kern_linear_release(&k);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_precision_names),   cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_linear_bf16),       cmocka_unit_test(test_linear_keep),
        cmocka_unit_test(test_conv_bf16),
        cmocka_unit_test(test_conv_fp32_unchanged), cmocka_unit_test(test_attention_bf16),
        cmocka_unit_test(test_attention_keep),     cmocka_unit_test(test_conv_keep),
        cmocka_unit_test(test_bf16_refused),
    };
    return tu_run_group(tests, NULL, NULL);
}
