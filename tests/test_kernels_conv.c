/* test_kernels_conv.c: kern_conv2d_* (fast) against kern_conv2d_*_ref, and the _ref
 * backward against central finite differences of the _ref forward, over odd shapes:
 * batch 3, non-square inputs, stride 2, padding 0/1/2, 1x1 and 5x5 kernels, n smaller
 * than n_max (and several n on one descriptor), fused and unfused relu, with and without
 * bias, backward onto prefilled dx/dw/db (+= semantics). */
#include <math.h>

#include "test_kernels_util.h"

typedef struct ConvCase {
    int n_max, n, c, h, w, k, r, s, stride, pad, bias, relu, fd;
} ConvCase;

typedef struct ConvCtx {
    KConv *cv;
    int n;
    float *x, *w, *b, *y, *r;
} ConvCtx;

static double conv_loss(void *p) {
    ConvCtx *c = p;
    kern_conv2d_fwd_ref(c->cv, c->n, c->x, c->w, c->b, c->y);
    return tk_dot(c->r, c->y, (size_t)c->n * c->cv->k * c->cv->oh * c->cv->ow);
}

static void check_conv(const ConvCase *t, int algo, uint64_t tag, int fd) {
    KConv cv;
    Err err = {0};
    int rc = kern_conv2d_init_algo(&cv, algo, t->n_max, t->c, t->h, t->w, t->k, t->r, t->s, t->stride, t->pad,
                                   t->bias, t->relu, &err);
    if (rc) print_message("%s\n", err.msg);
    assert_int_equal(rc, PD_OK);
    if (algo != KCONV_AUTO) assert_int_equal(kern_conv2d_algo(&cv), algo);
    assert_int_equal(cv.oh, (t->h + 2 * t->pad - t->r) / t->stride + 1);
    static const char *names[] = {"auto", "im2col", "dnnl", "dnnl-plain", "dense"};
    print_message("  conv[%s] n=%d/%d c=%d %dx%d k=%d %dx%d s%d p%d bias=%d relu=%d\n", names[algo], t->n,
                  t->n_max, t->c, t->h, t->w, t->k, t->r, t->s, t->stride, t->pad, t->bias, t->relu);
    /* two batch sizes on one descriptor: n_max and the case's n (primitive caching) */
    int ns[2] = {t->n_max, t->n};
    for (int pass = 0; pass < 2; pass++) {
        const int n = ns[pass];
        size_t nx = (size_t)n * t->c * t->h * t->w, nw = (size_t)t->k * t->c * t->r * t->s;
        size_t ny = (size_t)n * t->k * cv.oh * cv.ow;
        ConvCtx c = {&cv, n, tk_rand(nx, tag + 1, -1, 1), tk_rand(nw, tag + 2, -1, 1),
                     t->bias ? tk_rand(t->k, tag + 3, -1, 1) : NULL, pd_alloc_f32(ny), tk_rand(ny, tag + 4, -1, 1)};
        float *y = tk_rand(ny, tag + 5, -9, 9);   // garbage: forward must overwrite
        kern_conv2d_fwd(&cv, n, c.x, c.w, c.b, y);
        kern_conv2d_fwd_ref(&cv, n, c.x, c.w, c.b, c.y);
        assert_int_equal(tu_compare("conv fwd", y, c.y, ny, 1e-4, 1e-5), 0);
        if (t->relu) {
            size_t zeros = 0;
            for (size_t i = 0; i < ny; i++) zeros += c.y[i] == 0.0f;
            assert_true(zeros > 0 && zeros < ny);   // the relu did something, not everything
        }
        float *pre_x = tk_rand(nx, tag + 6, -1, 1), *pre_w = tk_rand(nw, tag + 7, -1, 1);
        float *pre_b = tk_rand(t->k, tag + 8, -1, 1);
        float *dx = tk_copy(pre_x, nx), *dw = tk_copy(pre_w, nw), *db = tk_copy(pre_b, t->k);
        float *rdx = tk_copy(pre_x, nx), *rdw = tk_copy(pre_w, nw), *rdb = tk_copy(pre_b, t->k);
        kern_conv2d_bwd(&cv, n, c.x, c.w, y, c.r, dx, dw, db);
        kern_conv2d_bwd_ref(&cv, n, c.x, c.w, c.y, c.r, rdx, rdw, rdb);
        assert_int_equal(tu_compare("conv dx", dx, rdx, nx, 1e-4, 1e-4), 0);
        assert_int_equal(tu_compare("conv dw", dw, rdw, nw, 1e-4, 1e-4), 0);
        assert_int_equal(tu_compare("conv db", db, rdb, t->k, 1e-4, 1e-4), 0);
        if (!t->bias) assert_memory_equal(db, pre_b, sizeof(float) * t->k);
        /* only some gradients wanted */
        float *dx2 = tk_copy(pre_x, nx);
        kern_conv2d_bwd(&cv, n, c.x, c.w, y, c.r, dx2, NULL, NULL);
        assert_int_equal(tu_compare("conv dx only", dx2, rdx, nx, 1e-4, 1e-4), 0);
        float *dw2 = tk_copy(pre_w, nw);
        kern_conv2d_bwd(&cv, n, c.x, c.w, y, c.r, NULL, dw2, NULL);
        assert_int_equal(tu_compare("conv dw only", dw2, rdw, nw, 1e-4, 1e-4), 0);

        if (fd && t->fd && pass == 1) {
            tk_sub(rdx, pre_x, nx);
            tk_sub(rdw, pre_w, nw);
            tk_sub(rdb, pre_b, t->k);
            float *g = pd_alloc_f32(nx > nw ? nx : nw);
            const float eps = t->relu ? 1e-3f : 0.1f;   // linear unless relu: large eps is exact
            const double tol = t->relu ? 1e-2 : 1e-4;
            tk_fd(conv_loss, &c, c.x, nx, eps, g);
            tk_check_grad("conv dx", rdx, g, nx, tol);
            tk_fd(conv_loss, &c, c.w, nw, eps, g);
            tk_check_grad("conv dw", rdw, g, nw, tol);
            if (t->bias) {
                tk_fd(conv_loss, &c, c.b, t->k, eps, g);
                tk_check_grad("conv db", rdb, g, t->k, tol);
            }
            pd_free(g);
        }
        float *all[] = {c.x, c.w, c.b, c.y, c.r, y, pre_x, pre_w, pre_b, dx, dw, db, rdx, rdw, rdb, dx2, dw2};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
    }
    kern_conv2d_release(&cv);
    kern_conv2d_release(&cv);   // twice is fine
}

static void test_conv_odd_shapes(void **state) {
    (void)state;
    static const ConvCase cases[] = {
        /* n_max n  c  h  w  k  r  s st pad bias relu fd */
        {3, 3, 2, 5, 7, 4, 3, 3, 1, 1, 1, 0, 1},     // batch 3, non-square, 3x3 pad 1
        {4, 3, 3, 6, 5, 4, 5, 5, 1, 2, 1, 1, 1},     // 5x5 pad 2, fused relu, n < n_max
        {2, 2, 3, 7, 7, 4, 3, 3, 2, 1, 0, 0, 1},     // stride 2, no bias
        {3, 2, 4, 6, 6, 5, 1, 1, 2, 0, 0, 0, 1},     // 1x1 stride 2 (resnet shortcut)
        {2, 1, 3, 4, 5, 6, 1, 1, 1, 0, 1, 1, 1},     // 1x1 stride 1 pad 0
        {2, 2, 2, 6, 8, 3, 3, 3, 1, 0, 1, 0, 1},     // pad 0
        {3, 2, 2, 5, 5, 3, 3, 2, 2, 2, 1, 1, 1},     // non-square kernel, stride 2, pad 2
        {5, 3, 3, 2, 2, 4, 3, 3, 1, 1, 1, 1, 1},     // 2x2 plane: several samples per GEMM
        {20, 19, 3, 8, 8, 5, 3, 3, 1, 1, 1, 0, 0},   // chunks of 8 samples, ragged last chunk
        {64, 5, 4, 2, 2, 8, 3, 3, 1, 1, 0, 1, 0},
    };
    for (int algo = 0; algo < KCONV_ALGO_COUNT; algo++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)   // finite differences once (ref only)
            check_conv(&cases[i], algo, 100 * (i + 1), algo == 0);
}

/* Shapes of the reference models (smaller batch): fast vs ref only. */
static void test_conv_model_shapes(void **state) {
    (void)state;
    static const ConvCase cases[] = {
        {4, 3, 1, 28, 28, 6, 5, 5, 1, 2, 1, 1, 0},    // lenet5 conv1
        {4, 4, 6, 14, 14, 16, 5, 5, 1, 0, 1, 1, 0},   // lenet5 conv2
        {4, 4, 16, 16, 16, 32, 3, 3, 1, 1, 1, 1, 0},  // vgg16 block 2
        {4, 4, 128, 2, 2, 128, 3, 3, 1, 1, 1, 1, 0},  // vgg16 block 5
        {4, 2, 16, 32, 32, 32, 3, 3, 2, 1, 0, 0, 0},  // resnet20 downsampling 3x3
        {4, 2, 32, 16, 16, 64, 1, 1, 2, 0, 0, 0, 0},  // resnet20 1x1 shortcut
    };
    for (int algo = KCONV_IM2COL; algo <= KCONV_DNNL; algo++)   // two of the three kern_conv2d_init picks from
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_conv(&cases[i], algo, 1000 * (i + 1), 0);
    check_conv(&cases[3], KCONV_DENSE, 7000, 0);   // and the third, where it is picked
}

static void test_conv_bad_shapes(void **state) {
    (void)state;
    KConv cv;
    Err err = {0};
    assert_int_equal(kern_conv2d_init(&cv, 2, 3, 2, 2, 4, 5, 5, 1, 0, 1, 0, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "conv2d"));
    kern_conv2d_release(&cv);
    assert_int_equal(kern_conv2d_init(&cv, 0, 3, 8, 8, 4, 3, 3, 1, 1, 1, 0, &err), PD_EINVAL);
    kern_conv2d_release(&cv);
}

/* kern_conv2d_init's measured choice (see conv.c). */
static void test_conv_auto_choice(void **state) {
    (void)state;
    KConv cv;
    Err err = {0};
    assert_int_equal(kern_conv2d_init(&cv, 4, 1, 28, 28, 6, 5, 5, 1, 2, 1, 1, &err), PD_OK);
    assert_int_equal(kern_conv2d_algo(&cv), KCONV_IM2COL);
    kern_conv2d_release(&cv);
    assert_int_equal(kern_conv2d_init(&cv, 4, 16, 16, 16, 32, 3, 3, 1, 1, 1, 1, &err), PD_OK);
    assert_int_equal(kern_conv2d_algo(&cv), KCONV_DNNL);
    kern_conv2d_release(&cv);
    /* thin 1x1: oneDNN where both channel counts fill the blocks (16, or 8 on AVX2: a chain
     * stays blocked), else im2col */
    assert_int_equal(kern_conv2d_init(&cv, 4, 16, 32, 32, 32, 1, 1, 2, 0, 0, 0, &err), PD_OK);
    assert_int_equal(kern_conv2d_algo(&cv), KCONV_DNNL);
    kern_conv2d_release(&cv);
    assert_int_equal(kern_conv2d_init(&cv, 4, 12, 32, 32, 16, 1, 1, 2, 0, 0, 0, &err), PD_OK);
    assert_int_equal(kern_conv2d_algo(&cv), KCONV_IM2COL);
    kern_conv2d_release(&cv);
    assert_int_equal(kern_conv2d_init(&cv, 4, 16, 32, 32, 20, 1, 1, 1, 0, 0, 0, &err), PD_OK);
    assert_int_equal(kern_conv2d_algo(&cv), KCONV_IM2COL);
    kern_conv2d_release(&cv);
    assert_int_equal(kern_conv2d_init(&cv, 4, 8, 32, 32, 16, 1, 1, 2, 0, 0, 0, &err), PD_OK);
    assert_int_equal(kern_conv2d_algo(&cv), kern_blk_width() == 8 ? KCONV_DNNL : KCONV_IM2COL);
    kern_conv2d_release(&cv);
    /* planes smaller than the window: the dense matrix (vgg16's 2x2 layers), unless too large */
    assert_int_equal(kern_conv2d_init(&cv, 4, 128, 2, 2, 128, 3, 3, 1, 1, 1, 1, &err), PD_OK);
    assert_int_equal(kern_conv2d_algo(&cv), KCONV_DENSE);
    assert_int_equal(kern_conv2d_layouts(&cv), 0);
    kern_conv2d_release(&cv);
    assert_int_equal(kern_conv2d_init(&cv, 4, 1024, 2, 2, 1024, 3, 3, 1, 1, 1, 1, &err), PD_OK);
    assert_int_equal(kern_conv2d_algo(&cv), KCONV_DNNL);
    kern_conv2d_release(&cv);
    assert_int_equal(kern_conv2d_init(&cv, 4, 64, 4, 4, 64, 3, 3, 1, 1, 1, 1, &err), PD_OK);
    assert_int_equal(kern_conv2d_algo(&cv), KCONV_DNNL);   // 16 pixels >= 9 taps
    kern_conv2d_release(&cv);
    /* forced where the matrix would be too large: refused, naming it */
    assert_int_equal(kern_conv2d_init_algo(&cv, KCONV_DENSE, 4, 64, 32, 32, 64, 3, 3, 1, 1, 1, 1, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "dense"));
    assert_null(cv.impl);
}

/* nChw{B}c <-> NCHW for the layout tests (c a multiple of B). */
static float *to_blk(const float *a, int n, int c, int hw, int B) {
    float *b = pd_alloc_f32((size_t)n * c * hw);
    for (int s = 0; s < n; s++)
        for (int ch = 0; ch < c; ch++)
            for (int i = 0; i < hw; i++)
                b[(((size_t)s * (c / B) + ch / B) * hw + i) * B + ch % B] = a[((size_t)s * c + ch) * hw + i];
    return b;
}

static float *from_blk(const float *b, int n, int c, int hw, int B) {
    float *a = pd_alloc_f32((size_t)n * c * hw);
    for (int s = 0; s < n; s++)
        for (int ch = 0; ch < c; ch++)
            for (int i = 0; i < hw; i++)
                a[((size_t)s * c + ch) * hw + i] = b[(((size_t)s * (c / B) + ch / B) * hw + i) * B + ch % B];
    return a;
}

/* The layouts cv offers (kern_conv2d_layouts) are only ones whose channels fill the blocks: x
 * where c is a multiple of B, y where k is. Which of them oneDNN chose is its business. */
static int offered(const KConv *cv, const ConvCase *t, int B) {
    const int lay = kern_conv2d_layouts(cv);
    assert_int_equal(lay & ~(KCONV_X_BLK | KCONV_Y_BLK), 0);
    if (t->c % B) assert_false(lay & KCONV_X_BLK);
    if (t->k % B) assert_false(lay & KCONV_Y_BLK);
    return lay;
}

/* For one descriptor, at n_max and at t->n: every layout it offers gives bitwise the plain
 * call's results, reordered: forward, backward onto prefilled gradients (whole, dx only, dW
 * only), and kern_conv2d_bwd_set (dx, and dW with db, written over what they held: the numbers
 * of a backward onto zeros). Returns how many blocked layouts were run. */
static int check_lays(KConv *cv, const ConvCase *t, int B, uint64_t tag0) {
    const int layouts = offered(cv, t, B);
    const int ns[2] = {t->n_max, t->n};
    int ran = 0;
    for (int pass = 0; pass < 2; pass++) {
        const int n = ns[pass], xhw = t->h * t->w, yhw = cv->oh * cv->ow;
        const size_t nx = (size_t)n * t->c * xhw, nw = (size_t)t->k * t->c * t->r * t->s, ny = (size_t)n * t->k * yhw;
        const uint64_t tag = tag0 + 10 * pass;
        float *x = tk_rand(nx, tag + 1, -1, 1), *w = tk_rand(nw, tag + 2, -1, 1), *b = tk_rand(t->k, tag + 3, -1, 1);
        float *dy = tk_rand(ny, tag + 4, -1, 1), *pre_x = tk_rand(nx, tag + 5, -1, 1);
        float *pre_w = tk_rand(nw, tag + 6, -1, 1), *pre_b = tk_rand(t->k, tag + 7, -1, 1);
        float *y = pd_alloc_f32(ny), *dx = tk_copy(pre_x, nx), *dw = tk_copy(pre_w, nw), *db = tk_copy(pre_b, t->k);
        kern_conv2d_fwd(cv, n, x, w, b, y);
        kern_conv2d_bwd(cv, n, x, w, y, dy, dx, dw, db);
        for (int lay = 0; lay <= 3; lay++) {
            if (lay & ~layouts) continue;
            ran += lay != 0;
            const int xb = lay & KCONV_X_BLK, yb = lay & KCONV_Y_BLK;
            float *lx = xb ? to_blk(x, n, t->c, xhw, B) : tk_copy(x, nx);
            float *ldy = yb ? to_blk(dy, n, t->k, yhw, B) : tk_copy(dy, ny);
            float *lpre = xb ? to_blk(pre_x, n, t->c, xhw, B) : tk_copy(pre_x, nx);
            float *ly = tk_rand(ny, tag + 8, -9, 9);   // garbage: forward must overwrite
            float *ldx = tk_copy(lpre, nx), *ldw = tk_copy(pre_w, nw), *ldb = tk_copy(pre_b, t->k);
            kern_conv2d_fwd_lay(cv, n, lay, lx, w, b, ly);
            kern_conv2d_bwd_lay(cv, n, lay, lx, w, ly, ldy, ldx, ldw, ldb);
            float *gy = yb ? from_blk(ly, n, t->k, yhw, B) : tk_copy(ly, ny);
            float *gdx = xb ? from_blk(ldx, n, t->c, xhw, B) : tk_copy(ldx, nx);
            assert_memory_equal(gy, y, sizeof(float) * ny);
            assert_memory_equal(gdx, dx, sizeof(float) * nx);
            assert_memory_equal(ldw, dw, sizeof(float) * nw);
            assert_memory_equal(ldb, db, sizeof(float) * t->k);
            /* the split passes */
            float *ldx2 = tk_copy(lpre, nx), *ldw2 = tk_copy(pre_w, nw);
            kern_conv2d_bwd_lay(cv, n, lay, lx, w, ly, ldy, ldx2, NULL, NULL);
            kern_conv2d_bwd_lay(cv, n, lay, lx, w, ly, ldy, NULL, ldw2, NULL);
            assert_memory_equal(ldx2, ldx, sizeof(float) * nx);
            assert_memory_equal(ldw2, dw, sizeof(float) * nw);
            /* dx written: over values no gradient has, whole and split */
            float *ldx0 = pd_alloc_f32(nx), *ldx3 = tk_rand(nx, tag + 9, 1e6, 2e6), *ldx4 = tk_copy(ldx3, nx);
            float *ldw3 = tk_copy(pre_w, nw);
            kern_conv2d_bwd_lay(cv, n, lay, lx, w, ly, ldy, ldx0, NULL, NULL);   /* onto zeros */
            kern_conv2d_bwd_set(cv, n, lay, KSET_DX, lx, w, ly, ldy, ldx3, ldw3, NULL);
            kern_conv2d_bwd_set(cv, n, lay, KSET_DX, lx, w, ly, ldy, ldx4, NULL, NULL);
            assert_int_equal(tu_compare("conv dx (set)", ldx3, ldx0, nx, 0, 0), 0);
            assert_int_equal(tu_compare("conv dx (set, alone)", ldx4, ldx0, nx, 0, 0), 0);
            assert_memory_equal(ldw3, dw, sizeof(float) * nw);   /* dW still added to */
            /* dW and db written (KSET_DW), with and without dx, against onto zeros */
            float *ldw0 = pd_alloc_f32(nw), *ldb0 = pd_alloc_f32(t->k);
            float *ldw5 = tk_rand(nw, tag + 10, 1e6, 2e6), *ldb5 = tk_rand(t->k, tag + 11, 1e6, 2e6);
            float *ldw6 = tk_copy(ldw5, nw), *ldb6 = tk_copy(ldb5, t->k), *ldx5 = tk_copy(ldx3, nx);
            kern_conv2d_bwd_lay(cv, n, lay, lx, w, ly, ldy, NULL, ldw0, ldb0);
            kern_conv2d_bwd_set(cv, n, lay, KSET_DW, lx, w, ly, ldy, NULL, ldw5, ldb5);
            kern_conv2d_bwd_set(cv, n, lay, KSET_DX | KSET_DW, lx, w, ly, ldy, ldx5, ldw6, ldb6);
            assert_int_equal(tu_compare("conv dw (set)", ldw5, ldw0, nw, 0, 0), 0);
            assert_int_equal(tu_compare("conv dw (set, with dx)", ldw6, ldw0, nw, 0, 0), 0);
            assert_int_equal(tu_compare("conv dx (set, with dw)", ldx5, ldx0, nx, 0, 0), 0);
            if (t->bias) {
                assert_int_equal(tu_compare("conv db (set)", ldb5, ldb0, t->k, 0, 0), 0);
                assert_int_equal(tu_compare("conv db (set, with dx)", ldb6, ldb0, t->k, 0, 0), 0);
            }
            float *all[] = {lx, ldy, lpre, ly, ldx, ldw, ldb, gy, gdx, ldx2, ldw2, ldx0, ldx3, ldx4, ldw3,
                            ldw0, ldb0, ldw5, ldb5, ldw6, ldb6, ldx5};
            for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
        }
        float *all[] = {x, w, b, dy, pre_x, pre_w, pre_b, y, dx, dw, db};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
    }
    return ran;
}

/* The blocked layouts each descriptor offers (check_lays), oneDNN's (x and y, where its
 * primitives chose nChw{B}c) and im2col's (y only, k a multiple of the block), in this CPU's
 * block width (kern_blk_width), at both precisions: bf16 takes float32 nChw{B}c too, converted
 * element-wise where the plain call reorders (both round to nearest even), so the results are
 * bitwise the same as well. */
static void test_conv_blocked_layouts(void **state) {
    (void)state;
    static const ConvCase cases[] = {
        /* n_max n  c  h  w  k  r  s st pad bias relu */
        {3, 2, 16, 7, 5, 32, 3, 3, 1, 1, 1, 1, 0},
        {3, 1, 32, 6, 6, 16, 3, 3, 2, 1, 0, 0, 0},
        {2, 2, 16, 4, 4, 16, 3, 3, 1, 1, 1, 0, 0},
        {3, 1, 32, 6, 6, 16, 3, 3, 2, 1, 0, 1, 0},   // relu without bias: bf16 masks dy straight to bf16
    };
    static const ConvCase im2col_cases[] = {
        {3, 2, 1, 7, 5, 16, 3, 3, 1, 1, 1, 1, 0},    // vgg16's first layer, small
        {3, 3, 1, 6, 6, 32, 3, 3, 2, 1, 0, 1, 0},    // two blocks, stride 2, relu without bias
        {2, 1, 8, 4, 4, 16, 1, 1, 1, 0, 1, 0, 0},    // 1x1 on x itself (no col)
        {4, 4, 1, 3, 3, 16, 2, 2, 1, 0, 1, 0, 0},    // several samples per GEMM
        {3, 2, 1, 5, 5, 24, 3, 3, 1, 1, 1, 1, 0},    // three blocks of 8 (plain where the block is 16)
    };
    const size_t n_dnnl = sizeof cases / sizeof *cases, n_im = sizeof im2col_cases / sizeof *im2col_cases;
    /* the channel block of the blocked kernels: AVX-512's vector width in floats, else AVX2's */
    const int B = kern_blk_width();
    assert_int_equal(B, !strncmp(kern_cpu_isa(), "avx512", 6) ? 16 : 8);
    int skipped = 0;
    for (size_t ci = 0; ci < 2 * n_dnnl + n_im; ci++) {
        const int im = ci >= 2 * n_dnnl;
        const ConvCase *t = im ? &im2col_cases[ci - 2 * n_dnnl] : &cases[ci % n_dnnl];
        const int prec = !im && ci >= n_dnnl ? KPREC_BF16 : KPREC_FP32;
        if (prec == KPREC_BF16 && !kern_bf16_available()) {
            skipped++;
            continue;
        }
        KConv cv;
        Err err = {0};
        assert_int_equal(kern_conv2d_init_prec(&cv, im ? KCONV_IM2COL : KCONV_DNNL, prec, t->n_max, t->c, t->h, t->w,
                                               t->k, t->r, t->s, t->stride, t->pad, t->bias, t->relu, &err),
                         PD_OK);
        assert_int_equal(cv.prec, prec);
        /* im2col's layouts are its own, not a library's choice */
        if (im) assert_int_equal(kern_conv2d_layouts(&cv), t->k % B ? 0 : KCONV_Y_BLK);
        print_message("  conv[%s, %s] c=%d k=%d: blocked layouts %d\n", im ? "im2col" : "dnnl",
                      kern_precision_name(prec), t->c, t->k, kern_conv2d_layouts(&cv));
        check_lays(&cv, t, B, 5000 + 100 * ci);
        kern_conv2d_release(&cv);
    }
    /* im2col: no blocked output where k does not fill the blocks */
    KConv cv;
    Err err = {0};
    assert_int_equal(kern_conv2d_init_algo(&cv, KCONV_IM2COL, 2, 1, 4, 4, 20, 3, 3, 1, 1, 1, 0, &err), PD_OK);
    assert_int_equal(kern_conv2d_layouts(&cv), 0);
    kern_conv2d_release(&cv);
    if (skipped)
        tu_skip("%d of %zu cases: oneDNN runs no bf16 on this CPU (%s)", skipped, 2 * n_dnnl + n_im, kern_cpu_isa());
}

/* The oneDNN candidate with its activations' layout forced (kern_conv2d_init_fmt): NCHW, NHWC
 * (what oneDNN picks for bf16 on AMX), nChw8c and nChw16c (the other CPU's block, or this one's)
 * on this CPU, so every path a CPU's choice can lead to runs here. For each: the results against
 * the reference kernels, every blocked layout the descriptor then offers bitwise against its
 * plain calls (check_lays), and the kept x (keep_any: kept at float32 too, wherever the forward
 * reorders it): read back it is x (bf16: x rounded), a forward that keeps gives the same y, a
 * backward reading it the same gradients, and a kept x with its signs flipped negates dW alone,
 * with x plain and, where offered, blocked (where a float32 x is already in the primitive's
 * layout, nothing is kept or read). */
static void test_conv_forced_layouts(void **state) {
    (void)state;
    static const ConvCase cases[] = {
        /* n_max n  c  h  w  k  r  s st pad bias relu */
        {3, 2, 16, 6, 5, 32, 3, 3, 1, 1, 1, 1, 0},
        {2, 1, 6, 7, 7, 16, 3, 3, 2, 1, 0, 0, 0},   // c fills no block: padded in the blocked layouts
        {2, 2, 32, 4, 4, 8, 1, 1, 1, 0, 1, 0, 0},   // k = 8: one block of 8, half of one of 16
    };
    static const char *names[KCONV_FMT_COUNT] = {"any", "nchw", "nhwc", "nChw8c", "nChw16c"};
    const int B = kern_blk_width(), n_cases = sizeof cases / sizeof *cases;
    int skipped = 0, ran_blk = 0;
    for (int prec = 0; prec < KPREC_COUNT; prec++) {
        if (prec == KPREC_BF16 && !kern_bf16_available()) {
            skipped += (KCONV_FMT_COUNT - 1) * n_cases;
            continue;
        }
        for (int fmt = KCONV_FMT_NCHW; fmt < KCONV_FMT_COUNT; fmt++)
            for (int ci = 0; ci < n_cases; ci++) {
                const ConvCase *t = &cases[ci];
                KConv cv;
                Err err = {0};
                int rc = kern_conv2d_init_fmt(&cv, prec, fmt, 1, t->n_max, t->c, t->h, t->w, t->k, t->r, t->s,
                                              t->stride, t->pad, t->bias, t->relu, &err);
                if (rc) print_message("%s\n", err.msg);
                if (rc && prec == KPREC_BF16 && strstr(err.msg, "unimplemented")) continue;   // no bf16 code for it
                assert_int_equal(rc, PD_OK);
                print_message("  conv[%s, %s] c=%d k=%d: blocked layouts %d, keeps %zu bytes\n", names[fmt],
                              kern_precision_name(prec), t->c, t->k, kern_conv2d_layouts(&cv),
                              kern_conv2d_keep_bytes(&cv, t->n_max));
                const uint64_t tag = 9000 + 1000 * prec + 100 * fmt + 10 * ci;
                const int ns[2] = {t->n_max, t->n};
                for (int pass = 0; pass < 2; pass++) {
                    const int n = ns[pass];
                    const size_t nx = (size_t)n * t->c * t->h * t->w, nw = (size_t)t->k * t->c * t->r * t->s;
                    const size_t ny = (size_t)n * t->k * cv.oh * cv.ow;
                    float *x = tk_rand(nx, tag + 1, -1, 1), *w = tk_rand(nw, tag + 2, -1, 1);
                    float *b = t->bias ? tk_rand(t->k, tag + 3, -1, 1) : NULL, *dy = tk_rand(ny, tag + 4, -1, 1);
                    float *y = pd_alloc_f32(ny), *yr = pd_alloc_f32(ny);
                    float *dx = pd_alloc_f32(nx), *dw = pd_alloc_f32(nw), *db = pd_alloc_f32(t->k);
                    float *rdx = pd_alloc_f32(nx), *rdw = pd_alloc_f32(nw), *rdb = pd_alloc_f32(t->k);
                    kern_conv2d_fwd(&cv, n, x, w, b, y);
                    kern_conv2d_fwd_ref(&cv, n, x, w, b, yr);
                    kern_conv2d_bwd_set(&cv, n, 0, KSET_DX | KSET_DW, x, w, y, dy, dx, dw, db);
                    kern_conv2d_bwd_ref(&cv, n, x, w, y, dy, rdx, rdw, rdb);
                    /* bf16: the relative error of 8 significant bits (test_kernels_bf16.c) */
                    const double tol = prec == KPREC_BF16 ? 3e-2 : 1e-4;
                    assert_int_equal(tu_compare("conv fwd", y, yr, ny, tol, tol), 0);
                    assert_int_equal(tu_compare("conv dx", dx, rdx, nx, tol, tol), 0);
                    assert_int_equal(tu_compare("conv dw", dw, rdw, nw, tol, tol * 10), 0);
                    if (t->bias) assert_int_equal(tu_compare("conv db", db, rdb, t->k, tol, tol * 10), 0);
                    /* the kept x, with x plain and (where offered) blocked */
                    const size_t kb = kern_conv2d_keep_bytes(&cv, n);
                    if (fmt != KCONV_FMT_NCHW || prec == KPREC_BF16) assert_true(kb >= nx * (prec ? 2 : 4));
                    else assert_int_equal(kb, 0);
                    for (int xb = 0; kb && xb <= (kern_conv2d_layouts(&cv) & KCONV_X_BLK); xb += KCONV_X_BLK) {
                        char *keep = pd_alloc(kb);
                        memset(keep, 0xab, kb);   // NaN as bf16 and float32: read where not written shows
                        float *lx = xb ? to_blk(x, n, t->c, t->h * t->w, B) : tk_copy(x, nx);
                        float *y1 = pd_alloc_f32(ny), *dx1 = pd_alloc_f32(nx), *dw1 = pd_alloc_f32(nw);
                        float *db1 = pd_alloc_f32(t->k), *ldx = pd_alloc_f32(nx);
                        kern_conv2d_fwd_kx(&cv, n, xb, lx, w, b, y1, keep);
                        assert_memory_equal(y1, y, ny * sizeof(float));
                        const int written = !xb || prec == KPREC_BF16;
                        if (written) {
                            float *back = pd_alloc_f32(nx), *want = tk_copy(x, nx);
                            if (prec == KPREC_BF16) {
                                uint16_t *h16 = pd_alloc(nx * 2);
                                pd_bf16_pack(x, h16, nx);
                                pd_bf16_unpack(h16, want, nx);
                                pd_free(h16);
                            }
                            kern_conv2d_keep_read(&cv, n, keep, back);
                            assert_memory_equal(back, want, nx * sizeof(float));
                            pd_free(back);
                            pd_free(want);
                        }
                        kern_conv2d_bwd_kx(&cv, n, xb, KSET_DX | KSET_DW, lx, keep, w, y, dy, ldx, dw1, db1);
                        float *gdx = xb ? from_blk(ldx, n, t->c, t->h * t->w, B) : tk_copy(ldx, nx);
                        assert_memory_equal(gdx, dx, nx * sizeof(float));
                        assert_memory_equal(dw1, dw, nw * sizeof(float));
                        if (t->bias) assert_memory_equal(db1, db, t->k * sizeof(float));
                        if (written) {   // the backward reads the kept x, not x
                            if (prec == KPREC_BF16)
                                for (size_t i = 0; i < kb / 2; i++) ((uint16_t *)keep)[i] ^= 0x8000;
                            else
                                for (size_t i = 0; i < kb / 4; i++) ((uint32_t *)keep)[i] ^= 0x80000000u;
                            kern_conv2d_bwd_kx(&cv, n, xb, KSET_DX | KSET_DW, lx, keep, w, y, dy, ldx, dw1, db1);
                            float *gdx2 = xb ? from_blk(ldx, n, t->c, t->h * t->w, B) : tk_copy(ldx, nx);
                            assert_memory_equal(gdx2, dx, nx * sizeof(float));
                            for (size_t i = 0; i < nw; i++) assert_true(dw1[i] == -dw[i]);
                            if (t->bias) assert_memory_equal(db1, db, t->k * sizeof(float));
                            pd_free(gdx2);
                        }
                        float *all[] = {lx, y1, dx1, dw1, db1, ldx, gdx};
                        for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
                        pd_free(keep);
                    }
                    float *all[] = {x, w, b, dy, y, yr, dx, dw, db, rdx, rdw, rdb};
                    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
                }
                ran_blk += check_lays(&cv, t, B, tag + 50);
                kern_conv2d_release(&cv);
            }
    }
    /* this CPU's own block, forced, is offered wherever the channels fill it */
    assert_true(ran_blk > 0);
    if (skipped) tu_skip("%d cases: oneDNN runs no bf16 on this CPU (%s)", skipped, kern_cpu_isa());
}

/* Max pooling on nChw8c and nChw16c (both on every CPU): the plain kernel's values and
 * gradients, reordered (ties too: a plane of repeated values); backward writing dx (KSET_DX) as
 * onto zeros, in both layouts. */
static void test_maxpool_blocked(void **state) {
    (void)state;
    const int shapes[][5] = {{2, 32, 8, 6, 2}, {3, 16, 7, 7, 3}, {1, 16, 4, 4, 2}, {2, 24, 5, 5, 2}};   // n c h w k
    for (int B = 8; B <= 16; B += 8)
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int st = 0; st < 2; st++) {   // stride k, then 1
            if (shapes[si][1] % B) continue;
            const int n = shapes[si][0], c = shapes[si][1], h = shapes[si][2], w = shapes[si][3], k = shapes[si][4];
            const int stride = st ? 1 : k, oh = (h - k) / stride + 1, ow = (w - k) / stride + 1;
            const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * oh * ow;
            float *x = tk_rand(nx, 7000 + si, -1, 1), *dy = tk_rand(ny, 7100 + si, -1, 1);
            if (si == 2)
                for (size_t i = 0; i < nx; i++) x[i] = (float)(i % 3);   // ties
            float *y = pd_alloc_f32(ny), *dx = tk_rand(nx, 7200 + si, -1, 1);
            int32_t *am = pd_alloc(sizeof(int32_t) * ny), *bam = pd_alloc(sizeof(int32_t) * ny);
            float *bx = to_blk(x, n, c, h * w, B), *bdy = to_blk(dy, n, c, oh * ow, B), *bdx = to_blk(dx, n, c, h * w, B);
            float *by = pd_alloc_f32(ny);
            kern_maxpool_fwd(x, y, am, n, c, h, w, k, stride);
            kern_maxpool_bwd(dy, am, dx, n, c, h, w, k, stride, 0);
            kern_maxpool_fwd_blk(bx, by, bam, n, c, h, w, k, stride, B);
            kern_maxpool_bwd_blk(bdy, bam, bdx, n, c, h, w, k, stride, 0, B);
            float *gy = from_blk(by, n, c, oh * ow, B), *gdx = from_blk(bdx, n, c, h * w, B);
            assert_memory_equal(gy, y, sizeof(float) * ny);
            assert_memory_equal(gdx, dx, sizeof(float) * nx);
            /* set: dx written over values no gradient has, the numbers of onto zeros, both layouts */
            float *z = pd_alloc_f32(nx), *bz = pd_alloc_f32(nx);
            float *g1 = tk_rand(nx, 7300 + si, 1e6, 2e6), *g2 = tk_rand(nx, 7400 + si, 1e6, 2e6);
            kern_maxpool_bwd(dy, am, z, n, c, h, w, k, stride, 0);
            kern_maxpool_bwd(dy, am, g1, n, c, h, w, k, stride, KSET_DX);
            kern_maxpool_bwd_blk(bdy, bam, bz, n, c, h, w, k, stride, 0, B);
            kern_maxpool_bwd_blk(bdy, bam, g2, n, c, h, w, k, stride, KSET_DX, B);
            assert_memory_equal(g1, z, sizeof(float) * nx);
            assert_memory_equal(g2, bz, sizeof(float) * nx);
            void *all[] = {x, dy, y, dx, am, bam, bx, bdy, bdx, by, gy, gdx, z, bz, g1, g2};
            for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
        }
}

/* Global average pooling from nChw8c and nChw16c: bitwise the plain kernels (sums in the same
 * order), with the gradient added to what dx held. */
static void test_gap_blocked(void **state) {
    (void)state;
    const int shapes[][3] = {{2, 32, 64}, {3, 16, 49}, {1, 48, 1}, {2, 40, 9}};   // n c hw
    for (int B = 8; B <= 16; B += 8)
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int n = shapes[si][0], c = shapes[si][1], hw = shapes[si][2];
        if (c % B) continue;
        const size_t nx = (size_t)n * c * hw, ny = (size_t)n * c;
        float *x = tk_rand(nx, 7300 + si, -1, 1), *dy = tk_rand(ny, 7400 + si, -1, 1);
        float *y = pd_alloc_f32(ny), *by = pd_alloc_f32(ny), *dx = tk_rand(nx, 7500 + si, -1, 1);
        float *bx = to_blk(x, n, c, hw, B), *bdx = to_blk(dx, n, c, hw, B);
        kern_gap_fwd(x, y, n, c, hw);
        kern_gap_bwd(dy, dx, n, c, hw);
        kern_gap_fwd_blk(bx, by, n, c, hw, B);
        kern_gap_bwd_blk(dy, bdx, n, c, hw, B);
        float *gdx = from_blk(bdx, n, c, hw, B);
        assert_memory_equal(by, y, sizeof(float) * ny);
        assert_memory_equal(gdx, dx, sizeof(float) * nx);
        void *all[] = {x, dy, y, by, dx, bx, bdx, gdx};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
    }
}

/* The dense matrix's backward writing (kern_conv2d_bwd_set): dx (KSET_DX) and dW, db (KSET_DW)
 * over values no gradient has give the numbers of a backward onto zeros, whole and split, and
 * at n = 0 writing means zeros; with a fused relu the masked entries give nothing. */
static void test_conv_dense_set(void **state) {
    (void)state;
    KConv cv;
    Err err = {0};
    const int n = 3, c = 6, h = 2, w = 2, k = 5;
    assert_int_equal(kern_conv2d_init(&cv, n, c, h, w, k, 3, 3, 1, 1, 1, 1, &err), PD_OK);
    assert_int_equal(kern_conv2d_algo(&cv), KCONV_DENSE);
    const size_t nx = (size_t)n * c * h * w, nw = (size_t)k * c * 9, ny = (size_t)n * k * cv.oh * cv.ow;
    float *x = tk_rand(nx, 8001, -1, 1), *wt = tk_rand(nw, 8002, -1, 1), *b = tk_rand(k, 8003, -1, 1);
    float *dy = tk_rand(ny, 8004, -1, 1), *y = pd_alloc_f32(ny);
    kern_conv2d_fwd(&cv, n, x, wt, b, y);
    float *dx0 = pd_calloc(sizeof(float) * nx), *dw0 = pd_calloc(sizeof(float) * nw), *db0 = pd_calloc(sizeof(float) * k);
    kern_conv2d_bwd(&cv, n, x, wt, y, dy, dx0, dw0, db0);   // onto zeros
    float *dx1 = tk_rand(nx, 8005, 1e6, 2e6), *dw1 = tk_rand(nw, 8006, 1e6, 2e6), *db1 = tk_rand(k, 8007, 1e6, 2e6);
    kern_conv2d_bwd_set(&cv, n, 0, KSET_DX | KSET_DW, x, wt, y, dy, dx1, dw1, db1);
    assert_int_equal(tu_compare("dense dx (set)", dx1, dx0, nx, 0, 0), 0);
    assert_int_equal(tu_compare("dense dw (set)", dw1, dw0, nw, 0, 0), 0);
    assert_int_equal(tu_compare("dense db (set)", db1, db0, k, 0, 0), 0);
    float *dx2 = tk_rand(nx, 8008, 1e6, 2e6), *dw2 = tk_rand(nw, 8009, 1e6, 2e6);
    kern_conv2d_bwd_set(&cv, n, 0, KSET_DX, x, wt, y, dy, dx2, NULL, NULL);
    kern_conv2d_bwd_set(&cv, n, 0, KSET_DW, x, wt, y, dy, NULL, dw2, NULL);
    assert_int_equal(tu_compare("dense dx (set, alone)", dx2, dx0, nx, 0, 0), 0);
    assert_int_equal(tu_compare("dense dw (set, alone)", dw2, dw0, nw, 0, 0), 0);
    /* the relu: where y is 0, dy changes nothing */
    float *dy2 = tk_copy(dy, ny), *dx3 = pd_calloc(sizeof(float) * nx), *dw3 = pd_calloc(sizeof(float) * nw);
    size_t masked = 0;
    for (size_t i = 0; i < ny; i++)
        if (y[i] == 0.0f) dy2[i] += 100.0f, masked++;
    assert_true(masked > 0 && masked < ny);
    kern_conv2d_bwd(&cv, n, x, wt, y, dy2, dx3, dw3, NULL);
    assert_int_equal(tu_compare("dense dx (relu mask)", dx3, dx0, nx, 0, 0), 0);
    assert_int_equal(tu_compare("dense dw (relu mask)", dw3, dw0, nw, 0, 0), 0);
    /* n = 0 */
    kern_conv2d_bwd_set(&cv, 0, 0, KSET_DW, x, wt, y, dy, NULL, dw2, db1);
    for (size_t i = 0; i < nw; i++) assert_true(dw2[i] == 0.0f);
    for (int i = 0; i < k; i++) assert_true(db1[i] == 0.0f);
    float *all[] = {x, wt, b, dy, y, dx0, dw0, db0, dx1, dw1, db1, dx2, dw2, dy2, dx3, dw3};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
    kern_conv2d_release(&cv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gap_blocked),
        cmocka_unit_test(test_conv_odd_shapes),
        cmocka_unit_test(test_conv_model_shapes),
        cmocka_unit_test(test_conv_bad_shapes),
        cmocka_unit_test(test_conv_auto_choice),
        cmocka_unit_test(test_conv_dense_set),
        cmocka_unit_test(test_conv_blocked_layouts),
        cmocka_unit_test(test_conv_forced_layouts),
        cmocka_unit_test(test_maxpool_blocked),
    };
    return tu_run_group(tests, NULL, NULL);
}
