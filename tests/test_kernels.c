/* test_kernels.c: the small kernels (linear, relu, max pool, global average pool, dropout,
 * pad, softmax cross-entropy, batch norm). For each: the fast version against its _ref
 * twin (forward and backward, backward onto prefilled buffers so += is checked), and the
 * _ref backward against central finite differences of the _ref forward through a random
 * linear functional L = sum(r * y). Convolution: test_kernels_conv.c; LSTM:
 * test_kernels_lstm.c. */
#include <cblas.h>
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>

#include "test_kernels_util.h"

/* ---- linear -------------------------------------------------------------------------- */
typedef struct LinCtx {
    float *x, *w, *b, *y, *r;
    int n, in, out;
} LinCtx;

static double lin_loss(void *p) {
    LinCtx *c = p;
    kern_linear_fwd_ref(c->x, c->w, c->b, c->y, c->n, c->in, c->out);
    return tk_dot(c->r, c->y, (size_t)c->n * c->out);
}

static void check_linear(int n, int in, int out, int with_bias, int fd) {
    size_t nx = (size_t)n * in, nw = (size_t)out * in, ny = (size_t)n * out;
    LinCtx c = {tk_rand(nx, 1, -1, 1), tk_rand(nw, 2, -1, 1), with_bias ? tk_rand(out, 3, -1, 1) : NULL,
                pd_alloc_f32(ny), tk_rand(ny, 4, -1, 1), n, in, out};
    float *y = pd_alloc_f32(ny);
    kern_linear_fwd(c.x, c.w, c.b, y, n, in, out);
    kern_linear_fwd_ref(c.x, c.w, c.b, c.y, n, in, out);
    assert_int_equal(tu_compare("linear fwd", y, c.y, ny, 1e-4, 1e-5), 0);

    /* backward onto prefilled buffers: fast vs ref */
    float *pre_x = tk_rand(nx, 5, -1, 1), *pre_w = tk_rand(nw, 6, -1, 1), *pre_b = tk_rand(out, 7, -1, 1);
    float *dx = tk_copy(pre_x, nx), *dw = tk_copy(pre_w, nw), *db = tk_copy(pre_b, out);
    float *rdx = tk_copy(pre_x, nx), *rdw = tk_copy(pre_w, nw), *rdb = tk_copy(pre_b, out);
    kern_linear_bwd(c.x, c.w, c.r, dx, dw, db, n, in, out);
    kern_linear_bwd_ref(c.x, c.w, c.r, rdx, rdw, rdb, n, in, out);
    assert_int_equal(tu_compare("linear dx", dx, rdx, nx, 1e-4, 1e-5), 0);
    assert_int_equal(tu_compare("linear dw", dw, rdw, nw, 1e-4, 1e-5), 0);
    assert_int_equal(tu_compare("linear db", db, rdb, out, 1e-4, 1e-5), 0);
    /* NULL gradients are skipped */
    kern_linear_bwd(c.x, c.w, c.r, NULL, NULL, db, n, in, out);

    /* ref backward vs finite differences (L is linear in each argument: eps can be large) */
    if (!fd) nx = nw = 0, with_bias = 0;   // large shape: fast vs ref only
    tk_sub(rdx, pre_x, nx);
    tk_sub(rdw, pre_w, nw);
    tk_sub(rdb, pre_b, out);
    float *g = pd_alloc_f32(nx > nw ? nx : nw + 1);
    if (fd) {
        tk_fd(lin_loss, &c, c.x, nx, 0.1f, g);
        tk_check_grad("linear dx", rdx, g, nx, 1e-4);
        tk_fd(lin_loss, &c, c.w, nw, 0.1f, g);
        tk_check_grad("linear dw", rdw, g, nw, 1e-4);
    }
    if (with_bias) {
        tk_fd(lin_loss, &c, c.b, out, 0.1f, g);
        tk_check_grad("linear db", rdb, g, out, 1e-4);
    }
    float *all[] = {c.x, c.w, c.b, c.y, c.r, y, pre_x, pre_w, pre_b, dx, dw, db, rdx, rdw, rdb, g};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
}

static void test_linear(void **state) {
    (void)state;
    check_linear(3, 7, 5, 1, 1);
    check_linear(1, 1, 1, 1, 1);
    check_linear(17, 40, 9, 0, 1);
    check_linear(64, 120, 84, 1, 0);
    check_linear(5, 1024, 10, 1, 0);
    check_linear(64, 1024, 96, 1, 0);   // dx = dy W with W's rows 4 KB apart (kern_sgemm's exception)
}

/* kern_sgemm against a double-precision product, on the four transpositions and on the shapes
 * it hands to OpenBLAS on AVX2 CPUs (A^T B; A B with m <= 256 and ldb a multiple of 512) as well
 * as their neighbours, at 1 and 2 threads: alpha and beta applied, beta = 0 writes over NaN (the
 * product's old contents are never read), padding columns past n left alone, and a second call
 * bitwise the first. */
static void test_sgemm(void **state) {
    (void)state;
    static const struct { char ta, tb; int m, n, k, pad; } cases[] = {
        {'N', 'N', 64, 1024, 96, 0}, {'N', 'N', 64, 1021, 96, 3}, {'N', 'N', 16, 2048, 40, 0},
        {'N', 'N', 257, 512, 64, 0}, {'N', 'N', 64, 1000, 96, 0}, {'N', 'T', 64, 1024, 96, 0},
        {'T', 'N', 96, 1024, 64, 0}, {'T', 'T', 33, 512, 70, 0}, {'T', 'N', 512, 256, 80, 0},
    };
    const size_t n_cases = sizeof cases / sizeof *cases;
    for (size_t ci = 0; ci < 2 * n_cases; ci++) {
        kern_set_threads(ci < n_cases ? 1 : 2);   // 2: the columns split in blocks
        const size_t t = ci % n_cases;
        const char ta = cases[t].ta, tb = cases[t].tb;
        const int m = cases[t].m, n = cases[t].n, k = cases[t].k, pad = cases[t].pad;
        const int lda = (ta == 'N' ? k : m), ldb = (tb == 'N' ? n : k) + pad, ldc = n + pad;
        const size_t na = (size_t)(ta == 'N' ? m : k) * lda, nb = (size_t)(tb == 'N' ? k : n) * ldb, nc = (size_t)m * ldc;
        float *a = tk_rand(na, 100 + ci, -1, 1), *b = tk_rand(nb, 200 + ci, -1, 1), *c0 = tk_rand(nc, 300 + ci, -1, 1);
        float *c = tk_copy(c0, nc), *c2 = pd_alloc_f32(nc), *want = pd_alloc_f32(nc);
        const float alpha = 0.5f, beta = 2.0f;
        for (int i = 0; i < m; i++)
            for (int j = 0; j < ldc; j++) {
                double acc = 0;
                for (int p = 0; p < k && j < n; p++)
                    acc += (double)(ta == 'N' ? a[(size_t)i * lda + p] : a[(size_t)p * lda + i]) *
                           (tb == 'N' ? b[(size_t)p * ldb + j] : b[(size_t)j * ldb + p]);
                want[(size_t)i * ldc + j] = j < n ? (float)(alpha * acc + beta * c0[(size_t)i * ldc + j]) : c0[(size_t)i * ldc + j];
            }
        kern_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        char what[64];
        snprintf(what, sizeof what, "sgemm %c%c %dx%dx%d ldb %d", ta, tb, m, n, k, ldb);
        assert_int_equal(tu_compare(what, c, want, nc, 1e-5, 1e-5), 0);
        for (size_t i = 0; i < nc; i++) c2[i] = NAN;
        for (int i = 0; i < m; i++)
            for (int j = n; j < ldc; j++) c2[(size_t)i * ldc + j] = c0[(size_t)i * ldc + j];
        kern_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, 0.0f, c2, ldc);
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) want[(size_t)i * ldc + j] -= beta * c0[(size_t)i * ldc + j];
        assert_int_equal(tu_compare(what, c2, want, nc, 1e-4, 1e-5), 0);
        memcpy(c, c0, nc * sizeof(float));
        kern_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        memcpy(c2, c0, nc * sizeof(float));
        kern_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c2, ldc);
        assert_memory_equal(c, c2, nc * sizeof(float));
        float *all[] = {a, b, c0, c, c2, want};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
    }
    kern_set_threads(1);
}

/* ---- relu ---------------------------------------------------------------------------- */
typedef struct EwCtx {
    float *x, *y, *r;
    size_t n;
} EwCtx;

static double relu_loss(void *p) {
    EwCtx *c = p;
    kern_relu_fwd_ref(c->x, c->y, c->n);
    return tk_dot(c->r, c->y, c->n);
}

static void test_relu(void **state) {
    (void)state;
    const size_t n = 1001;
    EwCtx c = {tk_rand(n, 10, -1, 1), pd_alloc_f32(n), tk_rand(n, 11, -1, 1), n};
    for (size_t i = 0; i < n; i++)   // keep away from the kink for the finite differences
        if (fabsf(c.x[i]) < 0.05f) c.x[i] = 0.5f;
    c.x[7] = 0.0f;                   // the kink itself: y = 0, gradient 0 (PyTorch's choice)
    float *y = pd_alloc_f32(n);
    kern_relu_fwd(c.x, y, n);
    kern_relu_fwd_ref(c.x, c.y, n);
    assert_int_equal(tu_compare("relu fwd", y, c.y, n, 0, 0), 0);
    float *pre = tk_rand(n, 12, -1, 1), *dx = tk_copy(pre, n), *rdx = tk_copy(pre, n);
    kern_relu_bwd(y, c.r, dx, n);
    kern_relu_bwd_ref(c.y, c.r, rdx, n);
    assert_int_equal(tu_compare("relu bwd", dx, rdx, n, 0, 0), 0);
    assert_true(rdx[7] == pre[7]);
    tk_sub(rdx, pre, n);
    float *g = pd_alloc_f32(n);
    c.x[7] = 0.5f;   // central differences straddle the kink; compare elsewhere
    tk_fd(relu_loss, &c, c.x, n, 1e-2f, g);
    g[7] = rdx[7];
    tk_check_grad("relu dx", rdx, g, n, 1e-4);
    float *all[] = {c.x, c.y, c.r, y, pre, dx, rdx, g};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
}

/* ---- max pool ------------------------------------------------------------------------ */
typedef struct PoolCtx {
    float *x, *y, *r;
    int32_t *am;
    int n, c, h, w, k, s, oh, ow;
} PoolCtx;

static double pool_loss(void *p) {
    PoolCtx *c = p;
    kern_maxpool_fwd_ref(c->x, c->y, c->am, c->n, c->c, c->h, c->w, c->k, c->s);
    return tk_dot(c->r, c->y, (size_t)c->n * c->c * c->oh * c->ow);
}

/* The kernel against the reference (forward bit for bit, backward); fd: also the reference's
 * gradient against finite differences (random values: the more windows, the likelier two values
 * of one lie within the step, so the wide shapes leave it out). */
static void check_pool(int n, int ch, int h, int w, int k, int s, int fd) {
    int oh = (h - k) / s + 1, ow = (w - k) / s + 1;
    size_t nx = (size_t)n * ch * h * w, ny = (size_t)n * ch * oh * ow;
    PoolCtx c = {tk_rand(nx, 20, -1, 1), pd_alloc_f32(ny), tk_rand(ny, 21, -1, 1), calloc(ny, 4),
                 n, ch, h, w, k, s, oh, ow};
    float *y = pd_alloc_f32(ny);
    int32_t *am = calloc(ny, 4);
    if (nx > 5) c.x[5] = c.x[4];   // a tie: the first maximum wins in both versions
    kern_maxpool_fwd(c.x, y, am, n, ch, h, w, k, s);
    kern_maxpool_fwd_ref(c.x, c.y, c.am, n, ch, h, w, k, s);
    assert_int_equal(tu_compare("maxpool fwd", y, c.y, ny, 0, 0), 0);
    assert_memory_equal(am, c.am, ny * 4);
    for (size_t i = 0; i < ny; i++) assert_true(c.am[i] >= 0 && c.am[i] < h * w);
    float *pre = tk_rand(nx, 22, -1, 1), *dx = tk_copy(pre, nx), *rdx = tk_copy(pre, nx);
    kern_maxpool_bwd(c.r, am, dx, n, ch, h, w, k, s, 0);
    kern_maxpool_bwd_ref(c.r, c.am, rdx, n, ch, h, w, k, s);
    assert_int_equal(tu_compare("maxpool bwd", dx, rdx, nx, 1e-6, 1e-6), 0);
    tk_sub(rdx, pre, nx);
    float *g = pd_alloc_f32(nx);
    if (fd) {
        if (nx > 5) c.x[5] = 5.0f;   // undo the tie before differentiating
        kern_maxpool_fwd_ref(c.x, c.y, c.am, n, ch, h, w, k, s);
        memset(rdx, 0, sizeof(float) * nx);
        kern_maxpool_bwd_ref(c.r, c.am, rdx, n, ch, h, w, k, s);
        tk_fd(pool_loss, &c, c.x, nx, 1e-3f, g);
        tk_check_grad("maxpool dx", rdx, g, nx, 1e-3);
    }
    float *all[] = {c.x, c.y, c.r, y, pre, dx, rdx, g};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
    free(c.am);
    free(am);
}

/* Plain 2x2 pooling on wide rows of three values, so most windows hold ties (in a row or across
 * the two), and an infinity: values and argmax equal the reference's bit for bit. */
static void check_ties_pool(void) {
    const int n = 2, ch = 2, h = 6, w = 36, oh = 3, ow = 18;
    size_t nx = (size_t)n * ch * h * w, ny = (size_t)n * ch * oh * ow;
    float *x = pd_alloc_f32(nx), *y = pd_alloc_f32(ny), *ry = pd_alloc_f32(ny);
    int32_t *am = calloc(ny, 4), *ram = calloc(ny, 4);
    for (size_t i = 0; i < nx; i++) x[i] = (float)((i * 7 + i / 5) % 3) - 1.0f;
    x[3] = -INFINITY, x[w + 10] = INFINITY, x[2 * w + 17] = -INFINITY;
    kern_maxpool_fwd(x, y, am, n, ch, h, w, 2, 2);
    kern_maxpool_fwd_ref(x, ry, ram, n, ch, h, w, 2, 2);
    assert_memory_equal(y, ry, ny * sizeof(float));
    assert_memory_equal(am, ram, ny * 4);
    pd_free(x), pd_free(y), pd_free(ry);
    free(am), free(ram);
}

static void test_maxpool(void **state) {
    (void)state;
    check_pool(2, 3, 8, 8, 2, 2, 1);
    check_pool(3, 2, 7, 9, 2, 2, 1);    // odd sizes: last row/column dropped
    check_pool(2, 2, 7, 6, 3, 2, 1);    // overlapping windows
    check_pool(1, 3, 5, 5, 3, 1, 1);
    check_pool(2, 3, 6, 40, 2, 2, 0);   // rows of 20 windows: vector blocks of 8 and a tail of 4
    check_pool(1, 2, 5, 17, 2, 2, 0);   // 8 windows and an odd last column dropped
    check_ties_pool();
}

/* ---- global average pool --------------------------------------------------------------- */
typedef struct GapCtx {
    float *x, *y, *r;
    int n, c, hw;
} GapCtx;

static double gap_loss(void *p) {
    GapCtx *c = p;
    kern_gap_fwd_ref(c->x, c->y, c->n, c->c, c->hw);
    return tk_dot(c->r, c->y, (size_t)c->n * c->c);
}

static void test_gap(void **state) {
    (void)state;
    const int n = 3, ch = 5, hw = 49;
    size_t nx = (size_t)n * ch * hw, ny = (size_t)n * ch;
    GapCtx c = {tk_rand(nx, 30, -1, 1), pd_alloc_f32(ny), tk_rand(ny, 31, -1, 1), n, ch, hw};
    float *y = pd_alloc_f32(ny);
    kern_gap_fwd(c.x, y, n, ch, hw);
    kern_gap_fwd_ref(c.x, c.y, n, ch, hw);
    assert_int_equal(tu_compare("gap fwd", y, c.y, ny, 1e-5, 1e-6), 0);
    float *pre = tk_rand(nx, 32, -1, 1), *dx = tk_copy(pre, nx), *rdx = tk_copy(pre, nx);
    kern_gap_bwd(c.r, dx, n, ch, hw);
    kern_gap_bwd_ref(c.r, rdx, n, ch, hw);
    assert_int_equal(tu_compare("gap bwd", dx, rdx, nx, 1e-6, 1e-7), 0);
    tk_sub(rdx, pre, nx);
    float *g = pd_alloc_f32(nx);
    tk_fd(gap_loss, &c, c.x, nx, 0.1f, g);
    tk_check_grad("gap dx", rdx, g, nx, 1e-4);
    float *all[] = {c.x, c.y, c.r, y, pre, dx, rdx, g};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
}

/* ---- dropout ------------------------------------------------------------------------- */
static void test_dropout(void **state) {
    (void)state;
    const size_t n = 20000;
    const float p = 0.3f;
    float *x = tk_rand(n, 40, -1, 1), *y = pd_alloc_f32(n), *y2 = pd_alloc_f32(n), *yr = pd_alloc_f32(n);
    uint8_t *m = malloc(n), *m2 = malloc(n), *mr = malloc(n);
    kern_dropout_fwd(x, y, m, n, p, 7, 3, 11);
    kern_dropout_fwd_ref(x, yr, mr, n, p, 7, 3, 11);
    assert_memory_equal(m, mr, n);
    assert_memory_equal(y, yr, n * sizeof(float));   // bitwise: the same product or +0.0
    kern_set_threads(2);   // two chunks, the second starting inside the stream
    memset(m2, 0, n);
    kern_dropout_fwd(x, y2, m2, n, p, 7, 3, 11);
    kern_set_threads(1);
    assert_memory_equal(m2, mr, n);
    assert_memory_equal(y2, yr, n * sizeof(float));
    /* the mask is the documented function of the RNG */
    Rng r;
    rng_init(&r, 7, 3, 11);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(m[i], rng_uniform(&r) >= p);
        kept += m[i];
        if (m[i]) assert_true(fabsf(y[i] - x[i] / (1 - p)) < 1e-6f);
        else assert_true(y[i] == 0.0f);
    }
    double frac = (double)kept / n;   // binomial sd = sqrt(.21/20000) = .0032
    print_message("  dropout keep fraction %.4f (expected %.2f)\n", frac, 1 - p);
    assert_true(fabs(frac - (1 - p)) < 0.015);
    kern_dropout_fwd(x, y2, m2, n, p, 7, 3, 11);   // same key: same mask
    assert_memory_equal(m, m2, n);
    kern_dropout_fwd(x, y2, m2, n, p, 7, 3, 12);   // another substream: another mask
    size_t same = 0;
    for (size_t i = 0; i < n; i++) same += m[i] == m2[i];
    assert_true(same < n * 0.65);   // independent masks agree on 0.7^2 + 0.3^2 = 58%
    kern_dropout_fwd(x, y2, m2, n, p, 7, 4, 11);   // another stream
    same = 0;
    for (size_t i = 0; i < n; i++) same += m[i] == m2[i];
    assert_true(same < n * 0.65);
    /* backward: dx += dy * mask / (1 - p); it is the exact derivative of the linear map */
    float *dy = tk_rand(n, 41, -1, 1), *pre = tk_rand(n, 42, -1, 1);
    float *dx = tk_copy(pre, n), *rdx = tk_copy(pre, n);
    kern_dropout_bwd(dy, m, dx, n, p);
    kern_dropout_bwd_ref(dy, m, rdx, n, p);
    assert_memory_equal(dx, rdx, n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        double want = pre[i] + (m[i] ? dy[i] / (1.0 - p) : 0.0);
        assert_true(fabs(rdx[i] - want) < 1e-5);
    }
    /* p = 0 keeps everything unchanged */
    kern_dropout_fwd(x, y2, m2, n, 0.0f, 1, 2, 3);
    assert_int_equal(tu_compare("dropout p=0", y2, x, n, 0, 0), 0);
    float *all[] = {x, y, y2, yr, dy, pre, dx, rdx};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
    free(m);
    free(m2);
    free(mr);
}

/* ---- pad ----------------------------------------------------------------------------- */
typedef struct PadCtx {
    float *x, *y, *r;
    int n, c, h, w, p;
} PadCtx;

static double pad_loss(void *q) {
    PadCtx *c = q;
    kern_pad_fwd_ref(c->x, c->y, c->n, c->c, c->h, c->w, c->p);
    return tk_dot(c->r, c->y, (size_t)c->n * c->c * (c->h + 2 * c->p) * (c->w + 2 * c->p));
}

static void test_pad(void **state) {
    (void)state;
    for (int p = 0; p <= 2; p++) {
        const int n = 2, ch = 3, h = 5, w = 7;
        size_t nx = (size_t)n * ch * h * w, ny = (size_t)n * ch * (h + 2 * p) * (w + 2 * p);
        PadCtx c = {tk_rand(nx, 50, -1, 1), pd_alloc_f32(ny), tk_rand(ny, 51, -1, 1), n, ch, h, w, p};
        float *y = tk_rand(ny, 52, -1, 1);   // garbage first: the border must be written as 0
        kern_pad_fwd(c.x, y, n, ch, h, w, p);
        kern_pad_fwd_ref(c.x, c.y, n, ch, h, w, p);
        assert_int_equal(tu_compare("pad fwd", y, c.y, ny, 0, 0), 0);
        float *pre = tk_rand(nx, 53, -1, 1), *dx = tk_copy(pre, nx), *rdx = tk_copy(pre, nx);
        kern_pad_bwd(c.r, dx, n, ch, h, w, p);
        kern_pad_bwd_ref(c.r, rdx, n, ch, h, w, p);
        assert_int_equal(tu_compare("pad bwd", dx, rdx, nx, 0, 0), 0);
        tk_sub(rdx, pre, nx);
        float *g = pd_alloc_f32(nx);
        tk_fd(pad_loss, &c, c.x, nx, 0.1f, g);
        tk_check_grad("pad dx", rdx, g, nx, 1e-4);
        float *all[] = {c.x, c.y, c.r, y, pre, dx, rdx, g};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
    }
}

/* ---- softmax cross-entropy ----------------------------------------------------------- */
typedef struct XentCtx {
    float *z;
    int32_t *lab;
    int n, k;
} XentCtx;

static double xent_loss(void *p) {
    XentCtx *c = p;
    return kern_xent_fwd_bwd_ref(c->z, c->lab, NULL, c->n, c->k, 1.0f, NULL);
}

static void test_xent(void **state) {
    (void)state;
    const int n = 7, k = 10;
    XentCtx c = {tk_rand((size_t)n * k, 60, -4, 4), malloc(sizeof(int32_t) * n), n, k};
    for (int i = 0; i < n; i++) c.lab[i] = (i * 3) % k;
    c.z[2 * k + 6] = 9.0f;   // sample 2 (label 6) predicted right for sure
    /* independent double-precision oracle: log-sum-exp without max shift (fine for |z| <= 9) */
    double want = 0;
    int want_hits = 0;
    float *wantd = pd_alloc_f32((size_t)n * k);
    for (int i = 0; i < n; i++) {
        double s = 0;
        int am = 0;
        for (int j = 0; j < k; j++) {
            s += exp((double)c.z[i * k + j]);
            if (c.z[i * k + j] > c.z[i * k + am]) am = j;
        }
        want += (log(s) - c.z[i * k + c.lab[i]]) / n;
        want_hits += am == c.lab[i];
        for (int j = 0; j < k; j++) wantd[i * k + j] = (float)((exp((double)c.z[i * k + j]) / s - (j == c.lab[i])) * 0.5 / n);
    }
    assert_true(want_hits >= 1);
    float *pre = tk_rand((size_t)n * k, 61, -1, 1);
    float *d = tk_copy(pre, (size_t)n * k), *rd = tk_copy(pre, (size_t)n * k);
    int hits = -1, rhits = -1;
    float loss = kern_xent_fwd_bwd(c.z, c.lab, d, n, k, 0.5f, &hits);
    float rloss = kern_xent_fwd_bwd_ref(c.z, c.lab, rd, n, k, 0.5f, &rhits);
    print_message("  xent loss %.7f ref %.7f double %.7f\n", loss, rloss, want);
    assert_true(fabs(loss - want) < 1e-5 * fabs(want) + 1e-6);
    assert_true(fabs(rloss - want) < 1e-6 * fabs(want) + 1e-7);
    assert_int_equal(hits, want_hits);
    assert_int_equal(rhits, want_hits);
    tk_sub(d, pre, (size_t)n * k);
    tk_sub(rd, pre, (size_t)n * k);
    assert_int_equal(tu_compare("xent dlogits", d, wantd, (size_t)n * k, 1e-4, 1e-6), 0);
    assert_int_equal(tu_compare("xent dlogits ref", rd, wantd, (size_t)n * k, 1e-4, 1e-6), 0);
    /* finite differences of the mean loss = dlogits at scale 1 = 2 * (scale 0.5 result) */
    float *g = pd_alloc_f32((size_t)n * k);
    tk_fd(xent_loss, &c, c.z, (size_t)n * k, 1e-2f, g);
    for (int i = 0; i < n * k; i++) rd[i] *= 2;
    tk_check_grad("xent dlogits", rd, g, (size_t)n * k, 1e-3);
    /* numerically stable: huge logits give finite results */
    for (int i = 0; i < n * k; i++) c.z[i] = 1000.0f + (float)(i % k);
    memset(d, 0, sizeof(float) * n * k);
    loss = kern_xent_fwd_bwd(c.z, c.lab, d, n, k, 1.0f, NULL);
    assert_true(isfinite(loss) && loss > 0);
    for (int i = 0; i < n * k; i++) assert_true(isfinite(d[i]));
    float *all[] = {c.z, wantd, pre, d, rd, g};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
    free(c.lab);
}

/* ---- batch norm ---------------------------------------------------------------------- */
typedef struct BnCtx {
    float *x, *gamma, *beta, *y, *rm, *rv, *saved, *r;
    int n, c, hw;
} BnCtx;

static double bn_loss(void *p) {
    BnCtx *c = p;
    kern_bn_fwd_train_ref(c->x, c->gamma, c->beta, c->y, c->rm, c->rv, c->saved, c->n, c->c, c->hw, 1e-5f, 0.1f);
    return tk_dot(c->r, c->y, (size_t)c->n * c->c * c->hw);
}

/* The fused relu: fast bn+relu forward (train, eval) and backward against the _ref bn
 * composed with the _ref relu. */
static void check_bn_relu(int n, int ch, int hw) {
    size_t nx = (size_t)n * ch * hw;
    float *x = tk_rand(nx, 80, -1, 3), *gm = tk_rand(ch, 81, 0.5f, 1.5f), *bt = tk_rand(ch, 82, -1, 1);
    float *dy = tk_rand(nx, 83, -1, 1), *pre = tk_rand(nx, 84, -1, 1);
    float *rm = pd_alloc_f32(ch), *rv = pd_alloc_f32(ch), *rrm = pd_alloc_f32(ch), *rrv = pd_alloc_f32(ch);
    float *y = pd_alloc_f32(nx), *yb = pd_alloc_f32(nx), *yr = pd_alloc_f32(nx), *sv = pd_alloc_f32(2 * ch),
          *svr = pd_alloc_f32(2 * ch), *g = pd_alloc_f32(nx);
    float *dx = tk_copy(pre, nx), *rdx = tk_copy(pre, nx), *dg = pd_alloc_f32(ch), *db = pd_alloc_f32(ch),
          *rdg = pd_alloc_f32(ch), *rdb = pd_alloc_f32(ch);
    for (int i = 0; i < ch; i++) rv[i] = rrv[i] = 1.0f;
    kern_bn_fwd_train(x, gm, bt, y, rm, rv, sv, n, ch, hw, 1e-5f, 0.1f, 1);
    kern_bn_fwd_train_ref(x, gm, bt, yb, rrm, rrv, svr, n, ch, hw, 1e-5f, 0.1f);
    kern_relu_fwd_ref(yb, yr, nx);
    assert_int_equal(tu_compare("bn+relu fwd train", y, yr, nx, 1e-4, 1e-5), 0);
    assert_int_equal(tu_compare("bn+relu running var", rv, rrv, ch, 1e-5, 1e-6), 0);
    size_t zeros = 0;
    for (size_t i = 0; i < nx; i++) zeros += y[i] == 0.0f;
    assert_true(zeros > nx / 5 && zeros < nx * 4 / 5);   // the mask matters
    kern_bn_bwd(x, gm, sv, y, dy, dx, dg, db, n, ch, hw, 1);
    memset(g, 0, sizeof(float) * nx);
    kern_relu_bwd_ref(yr, dy, g, nx);
    kern_bn_bwd_ref(x, gm, svr, g, rdx, rdg, rdb, n, ch, hw);
    assert_int_equal(tu_compare("bn+relu dx", dx, rdx, nx, 1e-3, 1e-5), 0);
    assert_int_equal(tu_compare("bn+relu dgamma", dg, rdg, ch, 1e-4, 1e-5), 0);
    assert_int_equal(tu_compare("bn+relu dbeta", db, rdb, ch, 1e-4, 1e-5), 0);
    kern_bn_fwd_eval(x, gm, bt, y, rm, rv, n, ch, hw, 1e-5f, 1);
    kern_bn_fwd_eval_ref(x, gm, bt, yb, rm, rv, n, ch, hw, 1e-5f);
    kern_relu_fwd_ref(yb, yr, nx);
    assert_int_equal(tu_compare("bn+relu fwd eval", y, yr, nx, 1e-4, 1e-5), 0);
    /* same bits on 1 and 2 threads (one channel = one thread, fixed order) */
    float *y1 = pd_alloc_f32(nx), *dx1 = tk_copy(pre, nx), *dx2 = tk_copy(pre, nx);
    for (int t = 1; t <= 2; t++) {
        kern_set_threads(t);
        for (int i = 0; i < ch; i++) rm[i] = 0, rv[i] = 1;
        kern_bn_fwd_train(x, gm, bt, t == 1 ? y1 : y, rm, rv, sv, n, ch, hw, 1e-5f, 0.1f, 1);
        kern_bn_bwd(x, gm, sv, y1, dy, t == 1 ? dx1 : dx2, NULL, NULL, n, ch, hw, 1);
    }
    kern_set_threads(1);
    assert_memory_equal(y1, y, sizeof(float) * nx);
    assert_memory_equal(dx1, dx2, sizeof(float) * nx);
    float *all[] = {x, gm, bt, dy, pre, rm, rv, rrm, rrv, y, yb, yr, sv, svr, g, dx, rdx, dg, db, rdg, rdb, y1, dx1, dx2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
}

static void check_bn(int n, int ch, int hw) {
    size_t nx = (size_t)n * ch * hw;
    BnCtx c = {tk_rand(nx, 70, -1, 3), tk_rand(ch, 71, 0.5f, 1.5f), tk_rand(ch, 72, -1, 1), pd_alloc_f32(nx),
               pd_alloc_f32(ch), pd_alloc_f32(ch), pd_alloc_f32(2 * ch), tk_rand(nx, 73, -1, 1), n, ch, hw};
    float *x2 = tk_rand(nx, 74, -2, 2);
    float *rm = pd_alloc_f32(ch), *rv = pd_alloc_f32(ch), *rrm = pd_alloc_f32(ch), *rrv = pd_alloc_f32(ch);
    for (int i = 0; i < ch; i++) rv[i] = rrv[i] = 1.0f;   // PyTorch's initial running stats
    float *y = pd_alloc_f32(nx), *yr = pd_alloc_f32(nx), *saved = pd_alloc_f32(2 * ch), *savedr = pd_alloc_f32(2 * ch);
    /* two training steps on different batches */
    for (int step = 0; step < 2; step++) {
        const float *xs = step ? x2 : c.x;
        kern_bn_fwd_train(xs, c.gamma, c.beta, y, rm, rv, saved, n, ch, hw, 1e-5f, 0.1f, 0);
        kern_bn_fwd_train_ref(xs, c.gamma, c.beta, yr, rrm, rrv, savedr, n, ch, hw, 1e-5f, 0.1f);
        assert_int_equal(tu_compare("bn fwd train", y, yr, nx, 1e-4, 1e-5), 0);
        assert_int_equal(tu_compare("bn saved", saved, savedr, 2 * ch, 1e-5, 1e-6), 0);
    }
    assert_int_equal(tu_compare("bn running mean", rm, rrm, ch, 1e-5, 1e-6), 0);
    assert_int_equal(tu_compare("bn running var", rv, rrv, ch, 1e-5, 1e-6), 0);
    /* hand computation of the running stats after the two steps */
    for (int k = 0; k < ch; k++) {
        double m_[2], v_[2], cnt = (double)n * hw;
        for (int step = 0; step < 2; step++) {
            const float *xs = step ? x2 : c.x;
            double s = 0, s2 = 0;
            for (int i = 0; i < n; i++)
                for (int j = 0; j < hw; j++) s += xs[((size_t)i * ch + k) * hw + j];
            m_[step] = s / cnt;
            for (int i = 0; i < n; i++)
                for (int j = 0; j < hw; j++) {
                    double d = xs[((size_t)i * ch + k) * hw + j] - m_[step];
                    s2 += d * d;
                }
            v_[step] = s2 / (cnt - 1);
        }
        double wm = 0.9 * (0.9 * 0 + 0.1 * m_[0]) + 0.1 * m_[1];
        double wv = 0.9 * (0.9 * 1 + 0.1 * v_[0]) + 0.1 * v_[1];
        assert_true(fabs(rm[k] - wm) < 1e-5);
        assert_true(fabs(rv[k] - wv) < 1e-5 * wv);
    }
    /* eval */
    kern_bn_fwd_eval(c.x, c.gamma, c.beta, y, rm, rv, n, ch, hw, 1e-5f, 0);
    kern_bn_fwd_eval_ref(c.x, c.gamma, c.beta, yr, rm, rv, n, ch, hw, 1e-5f);
    assert_int_equal(tu_compare("bn fwd eval", y, yr, nx, 1e-4, 1e-5), 0);
    for (int k = 0; k < ch; k++) {
        size_t i0 = (size_t)k * hw;   // sample 0, channel k, first pixel
        double want = c.gamma[k] * (c.x[i0] - rm[k]) / sqrt(rv[k] + 1e-5) + c.beta[k];
        assert_true(fabs(yr[i0] - want) < 1e-4);
    }
    /* backward: fast vs ref, onto prefilled buffers */
    kern_bn_fwd_train_ref(c.x, c.gamma, c.beta, yr, rrm, rrv, savedr, n, ch, hw, 1e-5f, 0.1f);
    kern_bn_fwd_train(c.x, c.gamma, c.beta, y, rm, rv, saved, n, ch, hw, 1e-5f, 0.1f, 0);
    float *pre = tk_rand(nx, 75, -1, 1), *preg = tk_rand(ch, 76, -1, 1), *preb = tk_rand(ch, 77, -1, 1);
    float *dx = tk_copy(pre, nx), *dg = tk_copy(preg, ch), *dbt = tk_copy(preb, ch);
    float *rdx = tk_copy(pre, nx), *rdg = tk_copy(preg, ch), *rdb = tk_copy(preb, ch);
    kern_bn_bwd(c.x, c.gamma, saved, NULL, c.r, dx, dg, dbt, n, ch, hw, 0);
    kern_bn_bwd_ref(c.x, c.gamma, savedr, c.r, rdx, rdg, rdb, n, ch, hw);
    assert_int_equal(tu_compare("bn dx", dx, rdx, nx, 1e-3, 1e-5), 0);
    assert_int_equal(tu_compare("bn dgamma", dg, rdg, ch, 1e-4, 1e-5), 0);
    assert_int_equal(tu_compare("bn dbeta", dbt, rdb, ch, 1e-4, 1e-5), 0);
    /* ref backward vs finite differences */
    tk_sub(rdx, pre, nx);
    tk_sub(rdg, preg, ch);
    tk_sub(rdb, preb, ch);
    float *g = pd_alloc_f32(nx);
    tk_fd(bn_loss, &c, c.x, nx, 1e-2f, g);
    tk_check_grad("bn dx", rdx, g, nx, 1e-2);
    tk_fd(bn_loss, &c, c.gamma, ch, 1e-2f, g);
    tk_check_grad("bn dgamma", rdg, g, ch, 1e-3);
    tk_fd(bn_loss, &c, c.beta, ch, 1e-2f, g);
    tk_check_grad("bn dbeta", rdb, g, ch, 1e-3);
    float *all[] = {c.x, c.gamma, c.beta, c.y, c.rm, c.rv, c.saved, c.r, x2, rm, rv, rrm, rrv, y, yr, saved, savedr,
                    pre, preg, preb, dx, dg, dbt, rdx, rdg, rdb, g};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
}

/* nChw{B}c <-> NCHW (c a multiple of B) */
static float *bn_to_blk(const float *a, int n, int c, int hw, int back, int B) {
    float *b = pd_alloc_f32((size_t)n * c * hw);
    for (int s = 0; s < n; s++)
        for (int ch = 0; ch < c; ch++)
            for (int i = 0; i < hw; i++) {
                size_t pl = ((size_t)s * c + ch) * hw + i, bl = (((size_t)s * (c / B) + ch / B) * hw + i) * B + ch % B;
                if (back) b[pl] = a[bl];
                else b[bl] = a[pl];
            }
    return b;
}

/* The blocked kernels, nChw8c and nChw16c (both on every CPU): bitwise the plain fast kernels'
 * results, reordered (forward train and eval, saved and running statistics, backward onto
 * prefilled gradients), with and without the fused relu, on 1 and 2 threads, planes with and
 * without a tail past 16 pixels. */
static void check_bn_blk(int n, int ch, int hw, int relu, int B) {
    size_t nx = (size_t)n * ch * hw;
    float *x = tk_rand(nx, 90, -1, 3), *gm = tk_rand(ch, 91, 0.5f, 1.5f), *bt = tk_rand(ch, 92, -1, 1);
    float *dy = tk_rand(nx, 93, -1, 1), *pre = tk_rand(nx, 94, -1, 1), *preg = tk_rand(ch, 95, -1, 1);
    float *rm = tk_rand(ch, 96, -1, 1), *rv = tk_rand(ch, 97, 0.5f, 2), *y = pd_alloc_f32(nx), *ye = pd_alloc_f32(nx);
    float *sv = pd_alloc_f32(2 * ch), *dx = tk_copy(pre, nx), *dg = tk_copy(preg, ch), *db = tk_copy(preg, ch);
    float *brm = tk_copy(rm, ch), *brv = tk_copy(rv, ch);
    kern_bn_fwd_train(x, gm, bt, y, rm, rv, sv, n, ch, hw, 1e-5f, 0.1f, relu);
    kern_bn_bwd(x, gm, sv, relu ? y : NULL, dy, dx, dg, db, n, ch, hw, relu);
    kern_bn_fwd_eval(x, gm, bt, ye, rm, rv, n, ch, hw, 1e-5f, relu);
    float *bx = bn_to_blk(x, n, ch, hw, 0, B), *bdy = bn_to_blk(dy, n, ch, hw, 0, B);
    for (int t = 1; t <= 2; t++) {
        kern_set_threads(t);
        float *by = tk_rand(nx, 98, -9, 9), *bye = tk_rand(nx, 99, -9, 9), *bsv = pd_alloc_f32(2 * ch);
        float *bdx = bn_to_blk(pre, n, ch, hw, 0, B), *bdg = tk_copy(preg, ch), *bdb = tk_copy(preg, ch);
        float *rm2 = tk_copy(brm, ch), *rv2 = tk_copy(brv, ch);
        kern_bn_fwd_train_blk(bx, gm, bt, by, rm2, rv2, bsv, n, ch, hw, 1e-5f, 0.1f, relu, B);
        kern_bn_bwd_blk(bx, gm, bsv, relu ? by : NULL, bdy, bdx, bdg, bdb, n, ch, hw, relu, B);
        kern_bn_fwd_eval_blk(bx, gm, bt, bye, rm2, rv2, n, ch, hw, 1e-5f, relu, B);
        float *gy = bn_to_blk(by, n, ch, hw, 1, B), *gye = bn_to_blk(bye, n, ch, hw, 1, B);
        float *gdx = bn_to_blk(bdx, n, ch, hw, 1, B);
        assert_memory_equal(gy, y, sizeof(float) * nx);
        assert_memory_equal(bsv, sv, sizeof(float) * 2 * ch);
        assert_memory_equal(rm2, rm, sizeof(float) * ch);
        assert_memory_equal(rv2, rv, sizeof(float) * ch);
        assert_memory_equal(gdx, dx, sizeof(float) * nx);
        assert_memory_equal(bdg, dg, sizeof(float) * ch);
        assert_memory_equal(bdb, db, sizeof(float) * ch);
        assert_memory_equal(gye, ye, sizeof(float) * nx);
        /* KSET_DX: dx written over garbage, bitwise the plain kernel's onto zeros, both layouts */
        float *zdx = pd_calloc(sizeof(float) * nx), *sdx = tk_rand(nx, 77, -5, 5), *sbdx = tk_rand(nx, 78, -5, 5);
        kern_bn_bwd(x, gm, sv, relu ? y : NULL, dy, zdx, NULL, NULL, n, ch, hw, relu);
        kern_bn_bwd_set(x, gm, sv, relu ? y : NULL, dy, sdx, NULL, NULL, n, ch, hw, relu, KSET_DX);
        kern_bn_bwd_blk_set(bx, gm, bsv, relu ? by : NULL, bdy, sbdx, NULL, NULL, n, ch, hw, relu, KSET_DX, B);
        float *gsdx = bn_to_blk(sbdx, n, ch, hw, 1, B);
        assert_memory_equal(sdx, zdx, sizeof(float) * nx);
        assert_memory_equal(gsdx, zdx, sizeof(float) * nx);
        float *all[] = {by, bye, bsv, bdx, bdg, bdb, rm2, rv2, gy, gye, gdx, zdx, sdx, sbdx, gsdx};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
    }
    kern_set_threads(1);
    float *all[] = {x, gm, bt, dy, pre, preg, rm, rv, y, ye, sv, dx, dg, db, brm, brv, bx, bdy};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
}

static void test_bn(void **state) {
    (void)state;
    check_bn(3, 4, 10);
    check_bn(5, 2, 1);   // (N, C) input as after a linear layer
    check_bn(2, 3, 37);  // planes longer than the 16 summing lanes, with a tail
    check_bn_relu(3, 4, 10);
    check_bn_relu(16, 16, 1024);   // a resnet20 stage-1 channel at N = 16: threaded, vectorised
    for (int B = 8; B <= 16; B += 8) {
        check_bn_blk(3, 16, 10, 0, B);   // a tail only
        check_bn_blk(2, 32, 37, 1, B);   // 2 or 4 blocks, 2 lane rounds and a tail
        check_bn_blk(4, 48, 64, 1, B);
        check_bn_blk(2, 16, 49, 0, B);
    }
    check_bn_blk(2, 24, 37, 1, 8);   // three blocks of 8 (no whole block of 16)
}

/* ---- threads ------------------------------------------------------------------------ */
static void test_set_threads(void **state) {
    (void)state;
    int (*omp_max)(void) = NULL;
    void *h = dlopen("libgomp.so.1", RTLD_LAZY);   // loaded by libdnnl
    if (h) *(void **)&omp_max = dlsym(h, "omp_get_max_threads");
    kern_set_threads(2);
    assert_int_equal(openblas_get_num_threads(), 1);   // kern_sgemm splits its products over our team
    if (omp_max) assert_int_equal(omp_max(), 2);
    kern_set_threads(1);
    assert_int_equal(openblas_get_num_threads(), 1);
    if (omp_max) assert_int_equal(omp_max(), 1);
    assert_non_null(omp_max);   // libgomp is there (libdnnl links it): the setting reached oneDNN
    if (h) dlclose(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear), cmocka_unit_test(test_sgemm), cmocka_unit_test(test_relu), cmocka_unit_test(test_maxpool),
        cmocka_unit_test(test_gap),    cmocka_unit_test(test_dropout), cmocka_unit_test(test_pad),
        cmocka_unit_test(test_xent),   cmocka_unit_test(test_bn),      cmocka_unit_test(test_set_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
