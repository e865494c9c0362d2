/* conv.c: 2-D convolution, fast version (forward, backward data, backward weights/bias):
 * picks, per shape, between two measured candidates, and implements candidate (b) here;
 * candidate (a), oneDNN 2.6, is in conv_dnnl.c.
 *
 * Measured (tools/kbench.c, fwd+bwd with dx, dW, db, N = 64, 1 thread, median of 5, ms;
 * AMD EPYC with AVX-512, a 2-core VM shared with other jobs, so +-15%):
 *   shape                      im2col   dnnl(any)  dnnl(plain nchw)
 *   lenet 1->6 5x5 @28          7.0      9.0        6.2
 *   lenet 6->16 5x5 @14         3.0      1.8        3.7
 *   vgg 1->16 @32               7.5      9.4       13.0
 *   vgg 16->16 @32             27.2     28.7       58.5
 *   vgg 16->32 @16             14.1      7.2       19.5
 *   vgg 32->32 @16             23.6     10.1       29.9
 *   vgg 32->64 @8              10.5      4.3        7.8
 *   vgg 64->64 @8              15.3      6.8       12.7
 *   vgg 64->128 @4              7.2      3.1        5.7
 *   vgg 128->128 @4            13.5      6.2        9.9
 *   vgg 128->128 @2             3.9      1.6        6.3
 *   resnet 1->16 @32 (no bias)  2.0      3.2        2.7
 *   resnet 16->16 @32          20.2     10.9       29.0
 *   resnet 16->32 s2 @32        9.8      7.1       12.4
 *   resnet 16->32 1x1 s2        3.1      6.9        3.0
 *   resnet 32->32 @16          29.6     14.3       56.0
 *   resnet 32->64 s2 @16       11.8      6.3        9.4
 *   resnet 32->64 1x1 s2        1.1      0.9        1.1
 *   resnet 64->64 @8           20.3      9.4       19.4
 * oneDNN with its blocked layouts wins by ~2x wherever there are >= 6 input channels and
 * a spatial kernel (the reorders to/from NCHW included); im2col wins for one input
 * channel (oneDNN's blocked layouts pad C = 1 to 16) and for thin 1x1 convolutions (where
 * the reorders dominate). Plain-layout oneDNN never wins by enough to keep. But the table
 * times each shape alone, from and to NCHW: inside a chain of nChw16c layers (a residual
 * stage, nn_plan_layouts) an im2col 1x1 shortcut forces its block's input to NCHW, two
 * reorders each way per step, which cost more than it saves (resnet20, 1 thread: step 113 ->
 * 106 ms fp32, 81 -> 74 ms bf16 with oneDNN's 16->32 1x1). So conv_pick: im2col if c == 1,
 * or for a 1x1 kernel with c < 32 whose c or k is not a multiple of the block width
 * (kern_blk_width: 16, or 8 on AVX2); else oneDNN.
 * PyTorch 1.13 (F.conv2d [+ relu] fwd+bwd, 1 thread, same machine, one noisy run), ms:
 * lenet 1->6 48.4, lenet 6->16 1.8, vgg 16->16 @32 66.7, vgg 32->32 @16 6.5, vgg 64->64 @8
 * 6.1, vgg 128->128 @2 1.8, resnet 16->16 @32 37.5, resnet 1x1 16->32 s2 36.1, resnet
 * 64->64 @8 6.2: our choice is on par or faster except 32->32 @16 (10.1 vs 6.5).
 *
 * Candidate (c), the dense matrix (conv_dense.c), where the plane is smaller than the kernel's
 * window (H*W < R*S) and the matrix is at most CONV_DENSE_PICK floats: the same outputs in 4/9
 * of the multiply-adds on vgg16's 2x2 planes. tools/kbench.c on an AMD EPYC (Zen 3, AVX2), same
 * columns as above, ms: vgg 128->128 @2 im2col 5.0, dnnl 4.3, dnnl-plain 9.1, dense 2.0 (its
 * GEMMs at ~110 GFLOP/s counted as the direct form's work). Not measured on AVX-512, where the
 * table above has oneDNN at 1.6; the dense form's GEMMs are the same 4/9 of the work there.
 *
 * Candidate (b), im2col + OpenBLAS sgemm: a chunk of nb samples is unfolded into
 * col (C*R*S, nb*OH*OW) and multiplied by W (K, C*R*S) in one GEMM; nb is chosen so that
 * the GEMM's wide side has >= CONV_COLS_MIN columns (small late-layer planes such as 2x2
 * would otherwise give GEMMs of width 4) while col stays <= CONV_COL_MAX floats.
 * Backward: g = dy (masked by y > 0 with fuse_relu) gathered to (K, nb*OH*OW);
 * dW += g col^T; dcol = W^T g into the col buffer; col2im adds into dx. All scratch is
 * allocated in kern_conv2d_init; nothing per call.
 *
 * What it does not do: groups, dilation, asymmetric stride/padding. */
/* -O2 alone (gcc 12's very-cheap cost model) leaves the backward's relu-masked gather scalar. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "conv_impl.h"

enum { CONV_COLS_MIN = 512, CONV_COL_MAX = 1 << 21 };

typedef struct ConvImpl {
    int algo;        /* KCONV_IM2COL, KCONV_DNNL, KCONV_DNNL_PLAIN, KCONV_DENSE */
    ConvDnnl *dnnl;  /* the oneDNN state when algo is one of its two */
    ConvDense *dense;   /* the dense matrix's state when algo is KCONV_DENSE */
    int nb;       /* samples per GEMM chunk */
    int direct;   /* 1x1, stride 1, pad 0, nb == 1: col is x itself */
    float *col;   /* (C*R*S, nb*OH*OW), reused as dcol in backward */
    float *tmp;   /* (K, nb*OH*OW): forward output chunk / backward gathered dy */
} ConvImpl;

/* The measured choice (see the table at the top of this file). */
enum { CONV_DENSE_PICK = 1 << 22 };
static int conv_pick(const KConv *cv) {
    if ((size_t)cv->h * cv->w < (size_t)cv->r * cv->s && cv->c > 1 && conv_dense_floats(cv) <= CONV_DENSE_PICK)
        return KCONV_DENSE;
    const int B = kern_blk_width();
    if (cv->c == 1 || (cv->r == 1 && cv->s == 1 && cv->c < 32 && (cv->c % B || cv->k % B))) return KCONV_IM2COL;
    return KCONV_DNNL;
}

int kern_conv2d_init(KConv *cv, int n_max, int c, int h, int w, int k, int r, int s, int stride, int pad,
                     int has_bias, int fuse_relu, Err *err) {
    return kern_conv2d_init_algo(cv, KCONV_AUTO, n_max, c, h, w, k, r, s, stride, pad, has_bias, fuse_relu, err);
}

int kern_conv2d_algo(const KConv *cv) { return ((const ConvImpl *)cv->impl)->algo; }

int kern_conv2d_init_algo(KConv *cv, int algo, int n_max, int c, int h, int w, int k, int r, int s, int stride,
                          int pad, int has_bias, int fuse_relu, Err *err) {
    return kern_conv2d_init_prec(cv, algo, KPREC_FP32, n_max, c, h, w, k, r, s, stride, pad, has_bias, fuse_relu,
                                 err);
}

static int conv_init(KConv *cv, int algo, int prec, const ConvDnnlForce *force, int n_max, int c, int h, int w, int k,
                     int r, int s, int stride, int pad, int has_bias, int fuse_relu, Err *err);

int kern_conv2d_init_prec(KConv *cv, int algo, int prec, int n_max, int c, int h, int w, int k, int r, int s,
                          int stride, int pad, int has_bias, int fuse_relu, Err *err) {
    return conv_init(cv, algo, prec, NULL, n_max, c, h, w, k, r, s, stride, pad, has_bias, fuse_relu, err);
}

int kern_conv2d_init_fmt(KConv *cv, int prec, int fmt, int keep_any, int n_max, int c, int h, int w, int k, int r,
                         int s, int stride, int pad, int has_bias, int fuse_relu, Err *err) {
    const ConvDnnlForce force = {.fmt = fmt, .keep_any = keep_any};
    return conv_init(cv, KCONV_DNNL, prec, &force, n_max, c, h, w, k, r, s, stride, pad, has_bias, fuse_relu, err);
}

static int conv_init(KConv *cv, int algo, int prec, const ConvDnnlForce *force, int n_max, int c, int h, int w, int k,
                     int r, int s, int stride, int pad, int has_bias, int fuse_relu, Err *err) {
    memset(cv, 0, sizeof *cv);
    PD_ASSERTF(algo >= 0 && algo < KCONV_ALGO_COUNT, "algo %d", algo);
    PD_ASSERTF(prec >= 0 && prec < KPREC_COUNT, "precision %d", prec);
    if (n_max < 1 || c < 1 || h < 1 || w < 1 || k < 1 || r < 1 || s < 1 || stride < 1 || pad < 0)
        return err_set(err, PD_EINVAL,
                       "conv2d: bad shape n_max=%d c=%d h=%d w=%d k=%d r=%d s=%d stride=%d pad=%d", n_max, c, h,
                       w, k, r, s, stride, pad);
    if (h + 2 * pad < r || w + 2 * pad < s)
        return err_set(err, PD_EINVAL, "conv2d: kernel %dx%d larger than padded input %dx%d", r, s, h + 2 * pad,
                       w + 2 * pad);
    if (kern_precision_check(prec, err)) return PD_EINVAL;
    *cv = (KConv){.n_max = n_max, .c = c, .h = h, .w = w, .k = k, .r = r, .s = s, .stride = stride, .pad = pad,
                  .oh = (h + 2 * pad - r) / stride + 1, .ow = (w + 2 * pad - s) / stride + 1,
                  .has_bias = has_bias, .fuse_relu = fuse_relu};
    ConvImpl *im = pd_calloc(sizeof *im);
    im->algo = algo == KCONV_AUTO ? conv_pick(cv) : algo;
    cv->impl = im;
    if (im->algo == KCONV_DENSE) {   // float32 only, as im2col
        int rc = conv_dense_new(cv, &im->dense, err);
        if (rc) kern_conv2d_release(cv);
        return rc;
    }
    if (im->algo != KCONV_IM2COL) {
        cv->prec = prec;   // im2col is float32 only
        int rc = conv_dnnl_new(cv, im->algo == KCONV_DNNL, force, &im->dnnl, err);
        if (rc) kern_conv2d_release(cv);
        return rc;
    }
    const size_t p = (size_t)cv->oh * cv->ow, crs = (size_t)c * r * s;
    int nb = (int)((CONV_COLS_MIN + p - 1) / p);
    if (nb > n_max) nb = n_max;
    while (nb > 1 && crs * nb * p > CONV_COL_MAX) nb--;
    im->nb = nb;
    im->direct = r == 1 && s == 1 && stride == 1 && pad == 0 && nb == 1;
    if (!im->direct) im->col = pd_alloc(sizeof(float) * crs * nb * p);
    else im->col = pd_alloc(sizeof(float) * crs * p);   // dcol in backward
    im->tmp = pd_alloc(sizeof(float) * (size_t)k * nb * p);
    return PD_OK;
}

void kern_conv2d_release(KConv *cv) {
    if (!cv) return;
    ConvImpl *im = cv->impl;
    if (im) {
        conv_dnnl_free(im->dnnl);
        conv_dense_free(im->dense);
        pd_free(im->col);
        pd_free(im->tmp);
        pd_free(im);
    }
    cv->impl = NULL;
}

/* col (C*R*S, nb*P): column s*P + oy*OW + ox of row (c*R + r)*S + q holds
 * x[s, c, oy*stride - pad + r, ox*stride - pad + q] (0 outside). */
static void im2col(const KConv *cv, const float *x, int nb, float *col) {
    const int H = cv->h, W = cv->w, OH = cv->oh, OW = cv->ow, st = cv->stride, pd = cv->pad;
    const size_t P = (size_t)OH * OW, ld = (size_t)nb * P;
    for (int c = 0; c < cv->c; c++)
        for (int r = 0; r < cv->r; r++)
            for (int q = 0; q < cv->s; q++) {
                float *row = col + ((size_t)(c * cv->r + r) * cv->s + q) * ld;
                // valid ox: 0 <= ox*st - pd + q < W
                int ox0 = pd - q > 0 ? (pd - q + st - 1) / st : 0;
                int ox1 = (W - 1 + pd - q) / st + 1;
                if (W - 1 + pd - q < 0) ox1 = 0;
                if (ox1 > OW) ox1 = OW;
                if (ox0 > ox1) ox0 = ox1;
                for (int s = 0; s < nb; s++) {
                    const float *xc = x + ((size_t)s * cv->c + c) * H * W;
                    float *dst = row + s * P;
                    for (int oy = 0; oy < OH; oy++, dst += OW) {
                        int iy = oy * st - pd + r;
                        if (iy < 0 || iy >= H) {
                            memset(dst, 0, sizeof(float) * OW);
                            continue;
                        }
                        const float *src = xc + (size_t)iy * W - pd + q;
                        for (int ox = 0; ox < ox0; ox++) dst[ox] = 0;
                        if (st == 1) memcpy(dst + ox0, src + ox0, sizeof(float) * (ox1 - ox0));
                        else
                            for (int ox = ox0; ox < ox1; ox++) dst[ox] = src[ox * st];
                        for (int ox = ox1; ox < OW; ox++) dst[ox] = 0;
                    }
                }
            }
}

/* The adjoint of im2col: dx[s, c, iy, ix] += every col entry that was read from it. */
static void col2im_add(const KConv *cv, const float *col, int nb, float *dx) {
    const int H = cv->h, W = cv->w, OH = cv->oh, OW = cv->ow, st = cv->stride, pd = cv->pad;
    const size_t P = (size_t)OH * OW, ld = (size_t)nb * P;
    for (int c = 0; c < cv->c; c++)
        for (int r = 0; r < cv->r; r++)
            for (int q = 0; q < cv->s; q++) {
                const float *row = col + ((size_t)(c * cv->r + r) * cv->s + q) * ld;
                int ox0 = pd - q > 0 ? (pd - q + st - 1) / st : 0;
                int ox1 = (W - 1 + pd - q) / st + 1;
                if (W - 1 + pd - q < 0) ox1 = 0;
                if (ox1 > OW) ox1 = OW;
                if (ox0 > ox1) ox0 = ox1;
                for (int s = 0; s < nb; s++) {
                    float *xc = dx + ((size_t)s * cv->c + c) * H * W;
                    const float *src = row + s * P;
                    for (int oy = 0; oy < OH; oy++, src += OW) {
                        int iy = oy * st - pd + r;
                        if (iy < 0 || iy >= H) continue;
                        float *d = xc + (size_t)iy * W - pd + q;
                        if (st == 1)
                            for (int ox = ox0; ox < ox1; ox++) d[ox] += src[ox];
                        else
                            for (int ox = ox0; ox < ox1; ox++) d[ox * st] += src[ox];
                    }
                }
            }
}

/* im2col writes y, and reads dy, blocked where k is a multiple of B (kern_blk_width): its
 * GEMM's (K, cols) result goes out through a transposing copy instead of a straight one (the
 * same numbers), so a first layer with one input channel hands oneDNN's layer after it
 * nChw{B}c, without the reorders (vgg16: 1.5-2 ms of a step each way). */
#if defined(__AVX512F__)
/* r[0..16) := its transpose (r[i] lane j -> r[j] lane i): unpacks within 128-bit lanes, then
 * two rounds of lane shuffles. */
static inline void tr16x16(__m512 r[16]) {
    __m512 t[16];
    for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 4; k++) {
        __m512d a = _mm512_castps_pd(t[4 * k]), b = _mm512_castps_pd(t[4 * k + 2]);
        __m512d c = _mm512_castps_pd(t[4 * k + 1]), d = _mm512_castps_pd(t[4 * k + 3]);
        r[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        r[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        r[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int k = 0; k < 2; k++)
        for (int m = 0; m < 4; m++) {
            t[8 * k + m] = _mm512_shuffle_f32x4(r[8 * k + m], r[8 * k + m + 4], 0x88);
            t[8 * k + m + 4] = _mm512_shuffle_f32x4(r[8 * k + m], r[8 * k + m + 4], 0xdd);
        }
    for (int m = 0; m < 8; m++) {
        r[m] = _mm512_shuffle_f32x4(t[m], t[m + 8], 0x88);
        r[m + 8] = _mm512_shuffle_f32x4(t[m], t[m + 8], 0xdd);
    }
}
#endif
#if defined(__AVX2__)
/* r[0..8) := its transpose: unpacks and shuffles within 128-bit lanes, then the lanes swapped. */
static inline void tr8x8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int k = 0; k < 4; k++) {
        t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 2; k++) {
        u[4 * k] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
        u[4 * k + 1] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
        u[4 * k + 2] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
        u[4 * k + 3] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
    }
    for (int m = 0; m < 4; m++) {
        r[m] = _mm256_permute2f128_ps(u[m], u[m + 4], 0x20);
        r[m + 4] = _mm256_permute2f128_ps(u[m], u[m + 4], 0x31);
    }
}
#endif

/* src's B rows (row j at src + j ld, P values each) plus bias[j] (NULL: none), relu'd if
 * relu, into dst as P pixels of B channels (nChw{B}c), B x B tiles at a time (transposed in
 * registers with AVX-512 (B = 16) or AVX2 (B = 8); a strided copy ran at 3 ns per element).
 * The same additions and relu as the plain epilogue, so the same bits. */
static void to_blk(const float *src, size_t ld, size_t P, const float *bias, int relu, float *dst, const int B) {
    size_t i0 = 0;
#if defined(__AVX512F__)
    if (B == 16) {
        const __m512 zero = _mm512_setzero_ps();
        for (; i0 + 16 <= P; i0 += 16) {
            __m512 r[16];
            for (int j = 0; j < 16; j++)
                r[j] = _mm512_add_ps(_mm512_loadu_ps(src + (size_t)j * ld + i0), _mm512_set1_ps(bias ? bias[j] : 0.0f));
            tr16x16(r);
            for (int i = 0; i < 16; i++) {
                __m512 v = relu ? _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r[i], zero, _CMP_GT_OQ), r[i]) : r[i];
                _mm512_storeu_ps(dst + (i0 + (size_t)i) * 16, v);
            }
        }
    }
#endif
#if defined(__AVX2__)
    if (B == 8) {
        const __m256 zero = _mm256_setzero_ps();
        for (; i0 + 8 <= P; i0 += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++)
                r[j] = _mm256_add_ps(_mm256_loadu_ps(src + (size_t)j * ld + i0), _mm256_set1_ps(bias ? bias[j] : 0.0f));
            tr8x8(r);
            for (int i = 0; i < 8; i++) {
                __m256 v = relu ? _mm256_and_ps(_mm256_cmp_ps(r[i], zero, _CMP_GT_OQ), r[i]) : r[i];
                _mm256_storeu_ps(dst + (i0 + (size_t)i) * 8, v);
            }
        }
    }
#endif
    float t[16][16];
    for (; i0 < P; i0 += (size_t)B) {
        const size_t len = P - i0 < (size_t)B ? P - i0 : (size_t)B;
        for (int j = 0; j < B; j++) {
            const float *restrict r = src + (size_t)j * ld + i0;
            const float bj = bias ? bias[j] : 0.0f;
            for (size_t i = 0; i < len; i++) t[i][j] = r[i] + bj;
        }
        float *restrict d = dst + i0 * (size_t)B;
        for (size_t i = 0; i < len; i++)
            for (int j = 0; j < B; j++) d[i * (size_t)B + (size_t)j] = relu && !(t[i][j] > 0) ? 0.0f : t[i][j];
    }
}

/* The way back: P pixels of B channels (src, nChw{B}c; masked by y > 0 where y is given) into
 * B rows of dst (row j at dst + j ld). */
static void from_blk(const float *src, const float *y, size_t P, float *dst, size_t ld, const int B) {
    size_t i0 = 0;
#if defined(__AVX512F__)
    if (B == 16) {
        const __m512 zero = _mm512_setzero_ps();
        for (; i0 + 16 <= P; i0 += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) {
                const size_t o = (i0 + (size_t)i) * 16;
                r[i] = _mm512_loadu_ps(src + o);
                if (y) r[i] = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_loadu_ps(y + o), zero, _CMP_GT_OQ), r[i]);
            }
            tr16x16(r);
            for (int j = 0; j < 16; j++) _mm512_storeu_ps(dst + (size_t)j * ld + i0, r[j]);
        }
    }
#endif
#if defined(__AVX2__)
    if (B == 8) {
        const __m256 zero = _mm256_setzero_ps();
        for (; i0 + 8 <= P; i0 += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++) {
                const size_t o = (i0 + (size_t)i) * 8;
                r[i] = _mm256_loadu_ps(src + o);
                if (y) r[i] = _mm256_and_ps(_mm256_cmp_ps(_mm256_loadu_ps(y + o), zero, _CMP_GT_OQ), r[i]);
            }
            tr8x8(r);
            for (int j = 0; j < 8; j++) _mm256_storeu_ps(dst + (size_t)j * ld + i0, r[j]);
        }
    }
#endif
    float t[16][16];
    for (; i0 < P; i0 += (size_t)B) {
        const size_t len = P - i0 < (size_t)B ? P - i0 : (size_t)B;
        const float *restrict s = src + i0 * (size_t)B, *restrict yy = y ? y + i0 * (size_t)B : NULL;
        for (size_t i = 0; i < len; i++)
            for (int j = 0; j < B; j++)
                t[j][i] = yy && !(yy[i * (size_t)B + (size_t)j] > 0) ? 0.0f : s[i * (size_t)B + (size_t)j];
        for (int j = 0; j < B; j++) {
            float *restrict r = dst + (size_t)j * ld + i0;
            for (size_t i = 0; i < len; i++) r[i] = t[j][i];
        }
    }
}

int kern_conv2d_layouts(const KConv *cv) {
    const ConvImpl *im = cv->impl;
    if (im->dense) return 0;
    return im->dnnl ? conv_dnnl_layouts(im->dnnl) : cv->k % kern_blk_width() == 0 ? KCONV_Y_BLK : 0;
}

void kern_conv2d_fwd(KConv *cv, int n, const float *x, const float *w, const float *b, float *y) {
    kern_conv2d_fwd_lay(cv, n, 0, x, w, b, y);
}

void kern_conv2d_bwd(KConv *cv, int n, const float *x, const float *w, const float *y, const float *dy,
                     float *dx, float *dw, float *db) {
    kern_conv2d_bwd_set(cv, n, 0, 0, x, w, y, dy, dx, dw, db);
}

void kern_conv2d_bwd_lay(KConv *cv, int n, int lay, const float *x, const float *w, const float *y,
                         const float *dy, float *dx, float *dw, float *db) {
    kern_conv2d_bwd_set(cv, n, lay, 0, x, w, y, dy, dx, dw, db);
}

size_t kern_conv2d_keep_bytes(const KConv *cv, int n) {
    const ConvImpl *im = cv->impl;
    return im && im->dnnl ? conv_dnnl_keep_bytes(im->dnnl, n) : 0;
}

void kern_conv2d_keep_read(KConv *cv, int n, const void *keep, float *x) {
    ConvImpl *im = cv->impl;
    PD_ASSERTF(im->dnnl && conv_dnnl_keep_bytes(im->dnnl, n), "conv2d: keeps nothing");
    conv_dnnl_keep_read(im->dnnl, cv, n, keep, x);
}

void kern_conv2d_fwd_lay(KConv *cv, int n, int lay, const float *x, const float *w, const float *b, float *y) {
    kern_conv2d_fwd_kx(cv, n, lay, x, w, b, y, NULL);
}

void kern_conv2d_fwd_kx(KConv *cv, int n, int lay, const float *x, const float *w, const float *b, float *y,
                        void *keep) {
    PD_ASSERTF(n >= 0 && n <= cv->n_max, "n=%d n_max=%d", n, cv->n_max);
    ConvImpl *im = cv->impl;
    if (im->dnnl) {
        conv_dnnl_fwd(im->dnnl, cv, n, lay, x, w, b, y, keep);
        return;
    }
    if (im->dense) {
        PD_ASSERTF(lay == 0, "conv2d (dense): layout %d", lay);
        conv_dense_fwd(im->dense, cv, n, x, w, b, y);
        return;
    }
    PD_ASSERTF((lay & ~kern_conv2d_layouts(cv)) == 0, "conv2d (im2col): layout %d", lay);
    const int K = cv->k, CRS = cv->c * cv->r * cv->s;
    const size_t P = (size_t)cv->oh * cv->ow, X = (size_t)cv->c * cv->h * cv->w;
    for (int s0 = 0; s0 < n; s0 += im->nb) {
        const int nb = n - s0 < im->nb ? n - s0 : im->nb;
        const float *col = x + s0 * X;
        if (!im->direct) {
            im2col(cv, x + s0 * X, nb, im->col);
            col = im->col;
        }
        const int cols = (int)(nb * P);
        float *out = nb == 1 && !lay ? y + s0 * K * P : im->tmp;   // (K, nb*P)
        kern_sgemm('N', 'N', K, cols, CRS, 1.0f, w, CRS, col, cols, 0.0f, out,
                    cols);
        if (lay) {   /* nChw{B}c: y[s, k/B, i, k%B], B channels' values of a pixel together */
            const int B = kern_blk_width();
            for (int s = 0; s < nb; s++)
                for (int kb = 0; kb < K / B; kb++)
                    to_blk(out + (size_t)kb * B * cols + s * P, cols, P, cv->has_bias && b ? b + kb * B : NULL,
                           cv->fuse_relu, y + ((size_t)(s0 + s) * K + (size_t)kb * B) * P, B);
            continue;
        }
        for (int s = 0; s < nb; s++)
            for (int k = 0; k < K; k++) {
                const float *src = out + (size_t)k * cols + s * P;   // may equal dst (nb == 1)
                float *dst = y + ((size_t)(s0 + s) * K + k) * P;
                const float bk = cv->has_bias && b ? b[k] : 0.0f;
                if (cv->fuse_relu)
                    for (size_t i = 0; i < P; i++) {
                        float v = src[i] + bk;
                        dst[i] = v > 0 ? v : 0.0f;
                    }
                else
                    for (size_t i = 0; i < P; i++) dst[i] = src[i] + bk;   // in place when nb == 1
            }
    }
}

void kern_conv2d_bwd_set(KConv *cv, int n, int lay, int set, const float *x, const float *w, const float *y,
                         const float *dy, float *dx, float *dw, float *db) {
    kern_conv2d_bwd_kx(cv, n, lay, set, x, NULL, w, y, dy, dx, dw, db);
}

void kern_conv2d_bwd_kx(KConv *cv, int n, int lay, int set, const float *x, const void *keep, const float *w,
                        const float *y, const float *dy, float *dx, float *dw, float *db) {
    PD_ASSERTF(n >= 0 && n <= cv->n_max, "n=%d n_max=%d", n, cv->n_max);
    ConvImpl *im = cv->impl;
    if (im->dnnl) {
        conv_dnnl_bwd(im->dnnl, cv, n, lay, set, x, keep, w, y, dy, dx, dw, db);
        return;
    }
    if (im->dense) {
        PD_ASSERTF(lay == 0, "conv2d (dense): layout %d", lay);
        conv_dense_bwd(im->dense, cv, n, set, x, w, y, dy, dx, dw, db);
        return;
    }
    PD_ASSERTF((lay & ~kern_conv2d_layouts(cv)) == 0, "conv2d (im2col): layout %d", lay);
    const int K = cv->k, CRS = cv->c * cv->r * cv->s;
    const size_t P = (size_t)cv->oh * cv->ow, X = (size_t)cv->c * cv->h * cv->w;
    if (!cv->has_bias) db = NULL;
    if (dx && (set & KSET_DX)) memset(dx, 0, (size_t)n * X * sizeof(float));   /* col2im adds */
    const int wset = (set & KSET_DW) != 0;   /* the first chunk writes dW and db */
    if (wset && n == 0) {
        if (dw) memset(dw, 0, (size_t)K * CRS * sizeof(float));
        if (db) memset(db, 0, (size_t)K * sizeof(float));
    }
    for (int s0 = 0; s0 < n; s0 += im->nb) {
        const int nb = n - s0 < im->nb ? n - s0 : im->nb;
        const int cols = (int)(nb * P);
        // g (K, nb*P): dy of the chunk, masked by y > 0 with fuse_relu
        const float *g = dy + s0 * K * P;
        if (lay) {   /* from nChw{B}c (see the forward) */
            const int B = kern_blk_width();
            for (int s = 0; s < nb; s++)
                for (int kb = 0; kb < K / B; kb++) {
                    const size_t off = ((size_t)(s0 + s) * K + (size_t)kb * B) * P;
                    from_blk(dy + off, cv->fuse_relu ? y + off : NULL, P, im->tmp + (size_t)kb * B * cols + s * P,
                             cols, B);
                }
            g = im->tmp;
        } else if (nb > 1 || cv->fuse_relu) {
            for (int s = 0; s < nb; s++)
                for (int k = 0; k < K; k++) {
                    const float *restrict src = dy + ((size_t)(s0 + s) * K + k) * P;
                    const float *restrict yy = y + ((size_t)(s0 + s) * K + k) * P;
                    float *restrict dst = im->tmp + (size_t)k * cols + s * P;
                    if (cv->fuse_relu)
                        for (size_t i = 0; i < P; i++) dst[i] = yy[i] > 0 ? src[i] : 0.0f;
                    else
                        memcpy(dst, src, sizeof(float) * P);
                }
            g = im->tmp;
        }
        if (db)   /* 16 interleaved partial sums: a fixed order, and vectorised where one running
                   * sum is a chain of dependent adds (vgg16's first layer: 1 ms of its step) */
            for (int k = 0; k < K; k++) {
                const float *restrict gk = g + (size_t)k * cols;
                float p[16] = {0}, sum = 0;
                int i = 0;
                for (; i + 16 <= cols; i += 16)
                    for (int j = 0; j < 16; j++) p[j] += gk[i + j];
                for (int j = 0; j < 16; j++) sum += p[j];
                for (; i < cols; i++) sum += gk[i];
                db[k] = (wset && s0 == 0 ? 0.0f : db[k]) + sum;
            }
        if (dw) {
            const float *col = x + s0 * X;
            if (!im->direct) {
                im2col(cv, x + s0 * X, nb, im->col);
                col = im->col;
            }
            // dW (K, CRS) += g (K, cols) col^T (cols, CRS)
            kern_sgemm('N', 'T', K, CRS, cols, 1.0f, g, cols, col, cols, wset && s0 == 0 ? 0.0f : 1.0f, dw,
                        CRS);
        }
        if (dx) {
            if (im->direct) {   // dx (C, P) += W^T g directly
                kern_sgemm('T', 'N', CRS, cols, K, 1.0f, w, CRS, g, cols, 1.0f,
                            dx + s0 * X, cols);
            } else {
                kern_sgemm('T', 'N', CRS, cols, K, 1.0f, w, CRS, g, cols, 0.0f,
                            im->col, cols);
                col2im_add(cv, im->col, nb, dx + s0 * X);
            }
        }
    }
}
