/* kernels.h: forward/backward compute on plain float32 buffers, NCHW layout, batch-major.
 * Each kernel has a fast version (oneDNN or OpenBLAS, whichever measured faster) and a
 * naive reference twin kern_*_ref kept forever for tests. Contract shared by all:
 *   - shapes in comments: (N, C, H, W) etc.; n is the minibatch size of this call and may
 *     be smaller than the n_max a descriptor was initialised with (last batch, eval);
 *   - backward ACCUMULATES (+=) into dx, dw, db; any of dx, dw, db may be NULL (not wanted);
 *   - nothing is allocated per call: descriptors own their primitives and scratch,
 *     created once in *_init; per-minibatch saved state (pool argmax, bn statistics, lstm
 *     gates) lives in caller-owned buffers whose sizes the *_saved_floats functions give;
 *   - kernels are not thread-safe on one descriptor (a worker runs one thing at a time);
 *   - kern_set_threads sets the threads used by OpenBLAS, oneDNN and kern_parallel_for for
 *     the calling thread; every fast kernel runs on them (results are bitwise the same for a
 *     given thread count; the element-wise ones also across thread counts).
 * Descriptors with _init return PD_OK or an error (e.g. a shape oneDNN rejects); they are
 * released with _release (safe on a zeroed or failed descriptor). */
#ifndef PD_KERNELS_H
#define PD_KERNELS_H

#include <stdint.h>

#include "core.h"

void kern_set_threads(int n);
/* Parallel loop on the calling thread's kernel threads (the OpenMP team oneDNN uses, so no
 * second pool competes for the cores): fn(ctx, begin, end) is called on disjoint ranges that
 * cover [0, n), at most one per thread, each at least min_chunk long (so small loops stay on
 * the calling thread); every boundary is a multiple of align (>= 1). Each element's result
 * must depend on that element alone for results to be independent of the thread count. */
typedef void (*KernRangeFn)(void *ctx, size_t begin, size_t end);
void kern_parallel_for(size_t n, size_t min_chunk, size_t align, KernRangeFn fn, void *ctx);
/* Row-major C (m, n) = alpha op(A) op(B) + beta C, op = transpose when ta/tb is 'T': oneDNN's
 * sgemm (it picks AVX-512 where the CPU has it), or on AVX2 CPUs OpenBLAS for the products
 * oneDNN's AVX2 kernels run slowly (kern_basic.c); deterministic for a given thread count. With
 * beta 0, C's old contents are not read. */
void kern_sgemm(char ta, char tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                float beta, float *c, int ldc);

/* ---- precision ------------------------------------------------------------------------ */
/* The compute precision of the matrix products (convolution, linear, attention). KPREC_FP32:
 * everything in float32. KPREC_BF16: the products' inputs (activations, weights, incoming
 * gradients) are rounded to bfloat16 and multiplied by oneDNN's bf16 primitives, which
 * accumulate in float32 and write float32 outputs; buffers, gradients, parameters and every
 * element-wise step stay float32. Descriptors take it in init (nothing else changes). */
enum { KPREC_FP32 = 0, KPREC_BF16 = 1, KPREC_COUNT = 2 };
/* "fp32" / "bf16" -> KPREC_*; -1 if unknown. */
int         kern_precision_parse(const char *s);
const char *kern_precision_name(int prec);
/* 1 if this CPU runs the bf16 products (oneDNN 2.6: AVX-512 and up), probed once per process;
 * kern_cpu_isa: the widest instruction set oneDNN uses here, as oneDNN names it ("avx2",
 * "avx512_core_bf16", ...).
 * kern_precision_check: PD_OK, or for a precision this CPU cannot run an error naming the CPU's
 * instruction set; the bf16 descriptors' init functions return it. */
int         kern_bf16_available(void);
const char *kern_cpu_isa(void);
int         kern_precision_check(int prec, Err *err);
/* y[i] = x[i] rounded to bfloat16 (pd_bf16_pack: nearest, ties to even; NaN stays NaN), as the
 * upper 16 bits of a float32; threaded like the element-wise kernels. */
void kern_f32_to_bf16(const float *x, uint16_t *y, size_t count);
/* g[i] = bf16 of (y[i] > 0 ? dy[i] : 0): kern_relu_mask then kern_f32_to_bf16 in one pass
 * (bitwise their result), for a relu-fused bf16 backward that takes the masked gradient only
 * in bf16. */
void kern_relu_mask_bf16(const float *y, const float *dy, uint16_t *g, size_t count);
/* The float32 value of a bfloat16 (exact). */
static inline float kern_bf16_to_f32(uint16_t b) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)b << 16};
    return v.f;
}

/* ---- linear: y(N,O) = x(N,I) · W(O,I)^T + b(O) --------------------------------------- */
void kern_linear_fwd(const float *x, const float *w, const float *b, float *y, int n, int in, int out);
void kern_linear_bwd(const float *x, const float *w, const float *dy, float *dx, float *dw, float *db, int n,
                     int in, int out);
/* What a backward writes rather than adds to (its earlier contents are then never read):
 * KSET_DX the input gradient, KSET_DW the weight and bias gradients. Assigning gives the
 * same numbers as adding onto zeros (up to the sign of a zero) without reading the buffer
 * first: for vgg16's 2048 x 2048 weight gradient at bf16, about 40% of the time
 * (bench/matmul_sum.c). */
enum { KSET_DX = 1, KSET_DW = 2 };
void kern_linear_bwd_set(const float *x, const float *w, const float *dy, float *dx, float *dw, float *db, int n,
                         int in, int out, int set);
void kern_linear_fwd_ref(const float *x, const float *w, const float *b, float *y, int n, int in, int out);
/* The same behind a descriptor that carries the precision (KPREC_*): for up to n_max rows.
 * KPREC_FP32 calls kern_linear_fwd/bwd (bitwise those); KPREC_BF16 runs oneDNN matmul
 * primitives on bf16 copies of x, W and dy (made per call in the calling thread's KSCR_BF16
 * scratch, sized in init) with float32 accumulation into y, dx (+=), dW (+=); db is summed
 * in float32. Primitives for n_max and for the last other row count are cached (as conv). */
typedef struct KLinear {
    int n_max, in, out, has_bias, prec;
    void *impl;   /* oneDNN state (bf16), owned */
} KLinear;
/* has_bias: forward calls pass b (else NULL). */
int  kern_linear_init(KLinear *k, int prec, int n_max, int in, int out, int has_bias, Err *err);
void kern_linear_release(KLinear *k);
void kern_linear_fwd_k(KLinear *k, int n, const float *x, const float *w, const float *b, float *y);
void kern_linear_bwd_k(KLinear *k, int n, const float *x, const float *w, const float *dy, float *dx, float *dw,
                       float *db, int set);   /* set: KSET_* */
/* The same, with x's bf16 copy kept between them (bf16 only; ignored at fp32 and where NULL):
 * the forward writes it to xb (n x in), the backward's weight product reads it instead of
 * converting x again. It is a function of x alone, so the results are bitwise the plain
 * calls'. kern_linear_keep_bytes: its size for n rows (0 at fp32). */
size_t kern_linear_keep_bytes(int prec, int n, int in);
void kern_linear_fwd_kx(KLinear *k, int n, const float *x, const float *w, const float *b, float *y, uint16_t *xb);
/* bf16 only, for a consumer that takes bf16: _fwd_kb writes y as bf16 (yb, n x out: the
 * float32 sum with the bias, rounded once, as kern_f32_to_bf16 of _fwd_kx's y); _fwd_bx takes
 * x already as bf16 (xb, n x in, e.g. a producer's _kb output) and writes float32 y. */
void kern_linear_fwd_kb(KLinear *k, int n, const float *x, const float *w, const float *b, uint16_t *yb,
                        uint16_t *xb);
void kern_linear_fwd_bx(KLinear *k, int n, const uint16_t *xb, const float *w, const float *b, float *y);
void kern_linear_bwd_kx(KLinear *k, int n, const float *x, const uint16_t *xb, const float *w, const float *dy,
                        float *dx, float *dw, float *db, int set);
void kern_linear_bwd_ref(const float *x, const float *w, const float *dy, float *dx, float *dw, float *db,
                         int n, int in, int out);

/* ---- conv2d: y(N,K,OH,OW) = conv(x(N,C,H,W), W(K,C,R,S)) + b(K), square stride/pad ---- */
typedef struct KConv {
    int n_max, c, h, w, k, r, s, stride, pad, oh, ow;
    int has_bias;
    int fuse_relu;   /* forward applies relu to y; backward then expects y (post-relu) too */
    int prec;        /* KPREC_* in use: bf16 only with the oneDNN implementations */
    void *impl;      /* primitives and scratch, owned */
} KConv;
int  kern_conv2d_init(KConv *cv, int n_max, int c, int h, int w, int k, int r, int s, int stride, int pad,
                      int has_bias, int fuse_relu, Err *err);
void kern_conv2d_release(KConv *cv);
/* Addition for benchmarks and tests: the same with the implementation forced.
 * KCONV_AUTO is what kern_conv2d_init does (the measured choice, see conv.c). KCONV_DENSE (the
 * convolution as one dense matrix, conv_dense.c) returns PD_EINVAL where that matrix would be
 * over 2^24 floats. */
enum { KCONV_AUTO = 0, KCONV_IM2COL = 1, KCONV_DNNL = 2, KCONV_DNNL_PLAIN = 3, KCONV_DENSE = 4, KCONV_ALGO_COUNT = 5 };
int  kern_conv2d_init_algo(KConv *cv, int algo, int n_max, int c, int h, int w, int k, int r, int s, int stride,
                           int pad, int has_bias, int fuse_relu, Err *err);
/* The same at a precision (KPREC_*). KPREC_BF16 runs the oneDNN implementations with bf16
 * src, weights and diff_dst and float32 dst, diff_src, diff_weights, bias; where KCONV_AUTO
 * picks im2col (one input channel, thin 1x1: see conv.c) the convolution stays float32
 * (cv->prec says which). The blocked layouts (KCONV_*_BLK, below) stay float32 at the
 * interface: a bf16 call converts a blocked x or dy element-wise where a plain one reorders. */
int  kern_conv2d_init_prec(KConv *cv, int algo, int prec, int n_max, int c, int h, int w, int k, int r, int s,
                           int stride, int pad, int has_bias, int fuse_relu, Err *err);
/* The implementation in use (KCONV_IM2COL, KCONV_DNNL, KCONV_DNNL_PLAIN or KCONV_DENSE). */
int  kern_conv2d_algo(const KConv *cv);
/* b may be NULL when !has_bias. */
void kern_conv2d_fwd(KConv *cv, int n, const float *x, const float *w, const float *b, float *y);
/* y is the forward output (needed when fuse_relu: the relu mask is y > 0); dy is the
 * gradient w.r.t. y. */
void kern_conv2d_bwd(KConv *cv, int n, const float *x, const float *w, const float *y, const float *dy,
                     float *dx, float *dw, float *db);
/* Blocked activations: the same with x, dx (KCONV_X_BLK in lay) and/or y, dy (KCONV_Y_BLK)
 * in oneDNN's channel-blocked layout, (N, C/B, H, W, B) with B = kern_blk_width() (nChw16c or
 * nChw8c), instead of NCHW; the same size, as only channel counts that are multiples of B
 * qualify. Consecutive layers that keep their activations so skip the reorders a plain call
 * makes around every primitive; results are bitwise those of the plain call, reordered.
 * kern_conv2d_layouts says which of the two the descriptor takes (im2col: y, dy where k is a
 * multiple of B, x never; oneDNN: both, or none where it chose other layouts). */
enum { KCONV_X_BLK = 1, KCONV_Y_BLK = 2 };
/* B: the channel block of oneDNN's float32 convolutions on this CPU, 16 where it runs AVX-512
 * code, 8 on AVX2 CPUs (the width of a vector register in floats). The blocked kernels below
 * (max pool, average pool, batch norm) take it as their last argument, blk, 8 or 16. */
int  kern_blk_width(void);
int  kern_conv2d_layouts(const KConv *cv);
void kern_conv2d_fwd_lay(KConv *cv, int n, int lay, const float *x, const float *w, const float *b, float *y);
void kern_conv2d_bwd_lay(KConv *cv, int n, int lay, const float *x, const float *w, const float *y,
                         const float *dy, float *dx, float *dw, float *db);
/* The same writing rather than adding to dx (set has KSET_DX: with dx blocked, oneDNN's
 * backward-data writes it in place) and dW, db (KSET_DW); their old contents are not read. */
void kern_conv2d_bwd_set(KConv *cv, int n, int lay, int set, const float *x, const float *w, const float *y,
                         const float *dy, float *dx, float *dw, float *db);
/* bf16 (oneDNN): the forward's bf16 copy of x kept for the backward-weights pass, which then
 * does not convert x again; only where that pass reads x in the forward's layout.
 * kern_conv2d_keep_bytes: its size for n samples, 0 where nothing is kept (float32, im2col,
 * layouts that differ). keep: caller-owned, that size, written by _fwd_kx and read by the
 * _bwd_kx of the same minibatch; NULL keeps nothing (the plain calls). Same bits either way. */
size_t kern_conv2d_keep_bytes(const KConv *cv, int n);
void kern_conv2d_fwd_kx(KConv *cv, int n, int lay, const float *x, const float *w, const float *b, float *y,
                        void *keep);
void kern_conv2d_bwd_kx(KConv *cv, int n, int lay, int set, const float *x, const void *keep, const float *w,
                        const float *y, const float *dy, float *dx, float *dw, float *db);
/* Addition for tests: the oneDNN candidate with its activations' layout forced rather than
 * chosen (fmt: KCONV_FMT_*, for src, dst, diff_src and diff_dst; the weights' stays chosen), so
 * that the paths another CPU's choice takes (NHWC, the other block width) run on this one; and
 * keep_any: x kept at float32 too, wherever the forward reorders it (keep_bytes then counts
 * it). fmt KCONV_FMT_ANY is KCONV_DNNL's choice. PD_EINVAL where oneDNN refuses. */
enum { KCONV_FMT_ANY, KCONV_FMT_NCHW, KCONV_FMT_NHWC, KCONV_FMT_NCHW8C, KCONV_FMT_NCHW16C, KCONV_FMT_COUNT };
int  kern_conv2d_init_fmt(KConv *cv, int prec, int fmt, int keep_any, int n_max, int c, int h, int w, int k, int r,
                          int s, int stride, int pad, int has_bias, int fuse_relu, Err *err);
/* The x a forward kept for n samples (keep, in the primitives' layout and type) as float32
 * NCHW, (n, C, H, W): what a test compares with x. Only where keep_bytes(n) > 0. */
void kern_conv2d_keep_read(KConv *cv, int n, const void *keep, float *x);
void kern_conv2d_fwd_ref(const KConv *cv, int n, const float *x, const float *w, const float *b, float *y);
void kern_conv2d_bwd_ref(const KConv *cv, int n, const float *x, const float *w, const float *y,
                         const float *dy, float *dx, float *dw, float *db);

/* ---- max pool (k×k window, stride, no padding) ----------------------------------------- */
/* argmax: (N,C,OH,OW) int32, the flat index within the (H,W) plane of each maximum; saved
 * by forward for backward. oh = (h - k)/stride + 1. Backward adds into dx, or with set
 * (KSET_DX) writes it (each plane zeroed just before its gradients go in). */
void kern_maxpool_fwd(const float *x, float *y, int32_t *argmax, int n, int c, int h, int w, int k, int stride);
void kern_maxpool_bwd(const float *dy, const int32_t *argmax, float *dx, int n, int c, int h, int w, int k,
                      int stride, int set);
/* The same on blocked activations (blk channels per block, c a multiple of blk, see
 * kern_blk_width): argmax holds, per output element (in y's layout), the flat index within
 * the (H, W) plane of its maximum. */
void kern_maxpool_fwd_blk(const float *x, float *y, int32_t *argmax, int n, int c, int h, int w, int k, int stride,
                          int blk);
void kern_maxpool_bwd_blk(const float *dy, const int32_t *argmax, float *dx, int n, int c, int h, int w, int k,
                          int stride, int set, int blk);
void kern_maxpool_fwd_ref(const float *x, float *y, int32_t *argmax, int n, int c, int h, int w, int k,
                          int stride);
void kern_maxpool_bwd_ref(const float *dy, const int32_t *argmax, float *dx, int n, int c, int h, int w, int k,
                          int stride);

/* ---- global average pool: (N,C,H,W) -> (N,C) ---------------------------------------------- */
void kern_gap_fwd(const float *x, float *y, int n, int c, int hw);
void kern_gap_bwd(const float *dy, float *dx, int n, int c, int hw);
/* The same with x and dx blocked (blk channels per block, c a multiple of blk), y and dy plain
 * (n, c): bitwise the plain kernels' results. */
void kern_gap_fwd_blk(const float *x, float *y, int n, int c, int hw, int blk);
void kern_gap_bwd_blk(const float *dy, float *dx, int n, int c, int hw, int blk);
void kern_gap_fwd_ref(const float *x, float *y, int n, int c, int hw);
void kern_gap_bwd_ref(const float *dy, float *dx, int n, int c, int hw);

/* ---- relu (elementwise, count elements) ---------------------------------------------------- */
void kern_relu_fwd(const float *x, float *y, size_t count);
/* dx += dy * (y > 0); y is the forward output. */
void kern_relu_bwd(const float *y, const float *dy, float *dx, size_t count);
/* Per-thread scratch for temporaries that live only within one call: a kernel's reorder
 * buffers, a layer's masked gradient. Slot `slot` of the calling thread, at least `bytes`
 * long, 64-byte aligned, contents undefined. It grows (never shrinks) when a call asks for
 * more, so after a model's first step on a thread nothing is allocated; descriptors ask for
 * their size in *_init so that the growth usually happens at build time. One slot per user
 * that may be live at once (a residual block nests its sub-layers' calls: it takes
 * KSCR_RESIDUAL + its nesting depth). Freed at thread exit (and kern_scratch_release for
 * the calling thread). Not for data that must survive the call. */
enum { KSCR_CONV = 0, KSCR_BN, KSCR_LSTM, KSCR_LAYER, KSCR_BF16, KSCR_RESIDUAL, KSCR_COUNT = KSCR_RESIDUAL + 8 };
void *kern_scratch(int slot, size_t bytes);
void  kern_scratch_release(void);
/* Bytes the calling thread's scratch holds: in slot `slot` (0 if never asked for), and in all
 * slots together. What a model built on a fresh thread asks for at build time is what its
 * calls use (the memory ledger counts it: RtMem.scratch, ProfileLayer.scratch). */
size_t kern_scratch_slot_bytes(int slot);
size_t kern_scratch_bytes(void);
/* Fused-relu helpers for the layers (threaded like every element-wise pass): y = max(y, 0)
 * in place; g = dy * (y > 0), overwriting g; y = max(a + b, 0); y += x. */
void kern_relu_inplace(float *y, size_t count);
void kern_relu_mask(const float *y, const float *dy, float *g, size_t count);
void kern_add_relu(const float *a, const float *b, float *y, size_t count);
void kern_accumulate(float *y, const float *x, size_t count);
void kern_relu_fwd_ref(const float *x, float *y, size_t count);
void kern_relu_bwd_ref(const float *y, const float *dy, float *dx, size_t count);

/* ---- dropout (inverted: kept elements scaled by 1/(1-p)) ----------------------------------- */
/* The mask is a pure function of (seed, stream, substream): element i is kept iff the i-th
 * uniform of rng_init(seed, stream, substream) is >= p. mask (count bytes) is saved. */
void kern_dropout_fwd(const float *x, float *y, uint8_t *mask, size_t count, float p, uint64_t seed,
                      uint64_t stream, uint64_t substream);
void kern_dropout_bwd(const float *dy, const uint8_t *mask, float *dx, size_t count, float p);
void kern_dropout_fwd_ref(const float *x, float *y, uint8_t *mask, size_t count, float p, uint64_t seed,
                          uint64_t stream, uint64_t substream);
void kern_dropout_bwd_ref(const float *dy, const uint8_t *mask, float *dx, size_t count, float p);

/* ---- batch norm over (N, H, W) per channel C ---------------------------------------------- */
/* Training: y = gamma * (x - mean) / sqrt(var + eps) + beta with batch statistics (biased
 * variance); running_mean/var updated as PyTorch does: r = (1 - momentum) * r + momentum *
 * stat, with the UNBIASED variance (count/(count-1)) for running_var. saved: 2*C floats
 * (mean, inv_std) for backward. Evaluation: uses the running statistics, saves nothing.
 * relu (fast versions only): y = max(bn(x), 0), the relu that follows fused; backward then
 * takes that y and masks dy by y > 0 itself (y may be NULL without relu). The _ref twins
 * are plain batch norm (tests compose them with kern_relu_*_ref). */
void kern_bn_fwd_train(const float *x, const float *gamma, const float *beta, float *y, float *running_mean,
                       float *running_var, float *saved, int n, int c, int hw, float eps, float momentum, int relu);
void kern_bn_fwd_eval(const float *x, const float *gamma, const float *beta, float *y, const float *running_mean,
                      const float *running_var, int n, int c, int hw, float eps, int relu);
void kern_bn_bwd(const float *x, const float *gamma, const float *saved, const float *y, const float *dy, float *dx,
                 float *dgamma, float *dbeta, int n, int c, int hw, int relu);
/* The same on blocked activations (x, y, dx, dy; blk channels per block, c a multiple of blk,
 * see kern_blk_width): bitwise the plain kernels' results, reordered (per channel the same
 * operations in the same order); gamma, beta, the statistics and saved stay per channel. */
void kern_bn_fwd_train_blk(const float *x, const float *gamma, const float *beta, float *y, float *running_mean,
                           float *running_var, float *saved, int n, int c, int hw, float eps, float momentum,
                           int relu, int blk);
void kern_bn_fwd_eval_blk(const float *x, const float *gamma, const float *beta, float *y, const float *running_mean,
                          const float *running_var, int n, int c, int hw, float eps, int relu, int blk);
void kern_bn_bwd_blk(const float *x, const float *gamma, const float *saved, const float *y, const float *dy,
                     float *dx, float *dgamma, float *dbeta, int n, int c, int hw, int relu, int blk);
/* The backwards with set & KSET_DX: dx written, bitwise as onto zeros (its old contents not
 * read). */
void kern_bn_bwd_set(const float *x, const float *gamma, const float *saved, const float *y, const float *dy,
                     float *dx, float *dgamma, float *dbeta, int n, int c, int hw, int relu, int set);
void kern_bn_bwd_blk_set(const float *x, const float *gamma, const float *saved, const float *y, const float *dy,
                         float *dx, float *dgamma, float *dbeta, int n, int c, int hw, int relu, int set, int blk);
void kern_bn_fwd_train_ref(const float *x, const float *gamma, const float *beta, float *y,
                           float *running_mean, float *running_var, float *saved, int n, int c, int hw,
                           float eps, float momentum);
void kern_bn_fwd_eval_ref(const float *x, const float *gamma, const float *beta, float *y,
                          const float *running_mean, const float *running_var, int n, int c, int hw, float eps);
void kern_bn_bwd_ref(const float *x, const float *gamma, const float *saved, const float *dy, float *dx,
                     float *dgamma, float *dbeta, int n, int c, int hw);

/* ---- LSTM, one layer, PyTorch's gate order (i, f, g, o) ------------------------------------ */
/* x: (T, N, I) time-major; h0 = c0 = 0. Weights as PyTorch stores them, one block:
 *   w_ih (4H, I), w_hh (4H, H), b_ih (4H), b_hh (4H)   (the caller passes four pointers).
 * y: (T, N, H), all hidden states. saved: kern_lstm_saved_floats(T, N, H) floats (gates
 * after activation and cell states per step), written by forward, read by backward.
 * Backward runs BPTT: dy (T, N, H) is the gradient w.r.t. every y; dx (T, N, I). */
typedef struct KLstm {
    int t, n_max, in, hid;
    void *impl;   /* scratch, owned */
} KLstm;
int    kern_lstm_init(KLstm *l, int t, int n_max, int in, int hid, Err *err);
void   kern_lstm_release(KLstm *l);
size_t kern_lstm_saved_floats(int t, int n, int hid);
void kern_lstm_fwd(KLstm *l, int n, const float *x, const float *w_ih, const float *w_hh, const float *b_ih,
                   const float *b_hh, float *y, float *saved);
void kern_lstm_bwd(KLstm *l, int n, const float *x, const float *w_ih, const float *w_hh, const float *y,
                   const float *saved, const float *dy, float *dx, float *dw_ih, float *dw_hh, float *db_ih,
                   float *db_hh);
void kern_lstm_fwd_ref(const KLstm *l, int n, const float *x, const float *w_ih, const float *w_hh,
                       const float *b_ih, const float *b_hh, float *y, float *saved);
void kern_lstm_bwd_ref(const KLstm *l, int n, const float *x, const float *w_ih, const float *w_hh,
                       const float *y, const float *saved, const float *dy, float *dx, float *dw_ih,
                       float *dw_hh, float *db_ih, float *db_hh);

/* ---- zero-pad (N,C,H,W) -> (N,C,H+2p,W+2p) and its backward (crop) ------------------------- */
void kern_pad_fwd(const float *x, float *y, int n, int c, int h, int w, int p);
void kern_pad_bwd(const float *dy, float *dx, int n, int c, int h, int w, int p);
void kern_pad_fwd_ref(const float *x, float *y, int n, int c, int h, int w, int p);
void kern_pad_bwd_ref(const float *dy, float *dx, int n, int c, int h, int w, int p);

/* ---- softmax cross-entropy on logits (N, K), integer labels, mean over N ----------------- */
/* Returns the mean loss; if dlogits is non-NULL, dlogits += (softmax - onehot) * scale / N
 * (scale = 1 for a plain minibatch; micro-batching passes N_micro/N_total). correct, if
 * non-NULL, receives the number of argmax hits. */
float kern_xent_fwd_bwd(const float *logits, const int32_t *labels, float *dlogits, int n, int k, float scale,
                        int *correct);
float kern_xent_fwd_bwd_ref(const float *logits, const int32_t *labels, float *dlogits, int n, int k,
                            float scale, int *correct);

/* Flatten is a reshape: no kernel. */

/* ==== transformer kernels (transformer.c; naive twins in transformer_ref.c) ================
 * Sequences are batch-major (N, T, D). Same contract as above: backward accumulates (+=),
 * any gradient output may be NULL, nothing allocated per call. */

/* exp(x) within 2 ulp of expf for x in [-87.3, 88.3] (clamped outside), written so that
 * loops over it vectorise (libm's expf does not without -ffast-math). */
float kern_expf_vec(float x);

/* ---- embedding: y(N,T,D) = W[tok] + P[t] ------------------------------------------------- */
/* tok (N, T): token ids stored as floats (exact integers in [0, V)); w (V, D); pos (T, D) or
 * NULL (no position embedding); dpos may be NULL. */
void kern_embed_fwd(const float *tok, const float *w, const float *pos, float *y, int n, int t, int d, int v);
void kern_embed_bwd(const float *tok, const float *dy, float *dw, float *dpos, int n, int t, int d, int v);
void kern_embed_fwd_ref(const float *tok, const float *w, const float *pos, float *y, int n, int t, int d, int v);
void kern_embed_bwd_ref(const float *tok, const float *dy, float *dw, float *dpos, int n, int t, int d, int v);

/* Algorithms of the transformer descriptors: KTF_AUTO (the measured default, see
 * transformer.c), KTF_LOOPS (C loops / sgemm calls), KTF_DNNL (oneDNN primitives). */
enum { KTF_AUTO = 0, KTF_LOOPS = 1, KTF_DNNL = 2, KTF_ALGO_COUNT = 3 };

/* ---- layer norm over the last dimension D of (rows, D), PyTorch's nn.LayerNorm ----------- */
/* y = (x - mean) / sqrt(var + eps) * g + b, biased variance. saved: kern_layernorm_saved_floats
 * (rows) floats = mean (rows) then var (rows), written by forward (may be NULL in eval), read by
 * backward. A descriptor serves up to rows_max rows per call. */
typedef struct KLayerNorm {
    int rows_max, d, algo;
    float eps;
    void *impl;   /* oneDNN primitives (KTF_DNNL) and scratch, owned */
} KLayerNorm;
int    kern_layernorm_init(KLayerNorm *k, int algo, int rows_max, int d, float eps, Err *err);
void   kern_layernorm_release(KLayerNorm *k);
size_t kern_layernorm_saved_floats(int rows);
void kern_layernorm_fwd(KLayerNorm *k, int rows, const float *x, const float *g, const float *b, float *y,
                        float *saved);
void kern_layernorm_bwd(KLayerNorm *k, int rows, const float *x, const float *g, const float *saved, const float *dy,
                        float *dx, float *dg, float *db);
void kern_layernorm_fwd_ref(const float *x, const float *g, const float *b, float *y, float *saved, int rows, int d,
                            float eps);
void kern_layernorm_bwd_ref(const float *x, const float *g, const float *saved, const float *dy, float *dx,
                            float *dg, float *db, int rows, int d, float eps);

/* ---- GELU, elementwise: tanh_approx 1 = PyTorch's approximate="tanh", 0 = exact (erf) ---- */
void kern_gelu_fwd(const float *x, float *y, size_t count, int tanh_approx);
/* dx += dy * gelu'(x); x is the forward INPUT. */
void kern_gelu_bwd(const float *x, const float *dy, float *dx, size_t count, int tanh_approx,
                   int set);   /* set (KSET_DX): dx written, not added to */
void kern_gelu_fwd_ref(const float *x, float *y, size_t count, int tanh_approx);
void kern_gelu_bwd_ref(const float *x, const float *dy, float *dx, size_t count, int tanh_approx);

/* ---- multi-head self-attention core (no projections) ------------------------------------- */
/* qkv (N, T, 3D), each row [q | k | v], D = heads * hd, head h in columns h*hd .. h*hd+hd of
 * each part (PyTorch: qkv.view(N, T, 3, H, hd)). y (N, T, D) = concat over heads of
 * softmax(q k^T / sqrt(hd) [+ causal mask]) v. p (N, H, T, T): the probabilities, saved for
 * backward (masked entries 0). Backward writes dqkv (N, T, 3D). The descriptor holds the
 * shapes and backward scratch for up to n_max samples. */
typedef struct KAttn {
    int n_max, t, heads, hd, causal, algo;
    int prec;     /* KPREC_* in use */
    void *impl;   /* scratch and oneDNN softmax primitives (KTF_DNNL), owned */
} KAttn;
int  kern_attention_init(KAttn *a, int algo, int n_max, int t, int heads, int hd, int causal, Err *err);
/* The same at a precision: KPREC_BF16 (KTF_DNNL / KTF_AUTO only; KTF_LOOPS stays float32,
 * a->prec says which) runs the six matrix products on bf16 copies of qkv, dy, the
 * probabilities and dS (made per call in the calling thread's KSCR_BF16 scratch) with float32
 * accumulation and outputs; the mask and softmax stay float32. */
int  kern_attention_init_prec(KAttn *a, int algo, int prec, int n_max, int t, int heads, int hd, int causal,
                              Err *err);
void kern_attention_release(KAttn *a);
void kern_attention_fwd(KAttn *a, int n, const float *qkv, float *y, float *p);
void kern_attention_bwd(KAttn *a, int n, const float *qkv, const float *p, const float *dy, float *dqkv);
/* The same, where the caller keeps the bf16 copies of qkv and P that the forward's products
 * make (kern_attention_keep_bytes bytes for n samples at `keep`, 64-byte aligned; 0 bytes at
 * fp32; keep is not touched unless the products run in bf16, a->prec): the backward reads them
 * instead of converting qkv and p again. keep must be what the forward of the same qkv wrote;
 * the bits are the plain calls'. */
size_t kern_attention_keep_bytes(int prec, int n, int t, int heads, int hd);
void kern_attention_fwd_kx(KAttn *a, int n, const float *qkv, float *y, float *p, void *keep);
void kern_attention_bwd_kx(KAttn *a, int n, const float *qkv, const float *p, const float *dy, float *dqkv,
                           const void *keep);
/* Where the products run in bf16 (kern_attention_takes_bf16), the forward with its operands
 * and result in bf16: qkv already in keep's first part (where _fwd_kx would put its copy; e.g.
 * written there by kern_linear_fwd_kb), y written as bf16 (yb, n x T x D). p and keep's P as
 * _fwd_kx; the backward is _bwd_kx with this keep (its float32 qkv is then not read: NULL). */
int  kern_attention_takes_bf16(const KAttn *a);
void kern_attention_fwd_kb(KAttn *a, int n, float *p, void *keep, uint16_t *yb);
/* scratch: (T, T) floats */
void kern_attention_fwd_ref(const float *qkv, float *y, float *p, int n, int t, int heads, int hd, int causal);
void kern_attention_bwd_ref(const float *qkv, const float *p, const float *dy, float *dqkv, float *scratch, int n,
                            int t, int heads, int hd, int causal);
/* ==== end of transformer kernels ============================================================ */

/* ---- wire codecs: activations and gradients between pipeline stages (codec.c) -------------- */
/* A message of n float32 values as bytes, plain data in and out (the runtime sends the bytes).
 *   KCODEC_FP32  the floats as they are (4n bytes).
 *   KCODEC_BF16  core's pd_bf16_pack / pd_bf16_unpack (2n bytes).
 *   KCODEC_INT8  rows of `block` values (the last may be shorter), each with a float32 scale
 *                s = maxabs / 127 and the values q = round(x / s) (nearest, ties to even) in
 *                int8: ceil(n / block) * 4 + n bytes, the scales first, then the values.
 *   KCODEC_INT4  groups of `block` values (32 or 64), each with a float32 scale s = maxabs / 7
 *                and the values in -7..7 as 4-bit two's complement, two to a byte (value i in
 *                byte i / 2, the low nibble first): ceil(n / block) * 4 + ceil(n / 2) bytes.
 *                With stochastic rounding (KCodec.stochastic, for gradients) q = floor(x / s + u),
 *                u uniform in [0, 1) from a counter-based generator of (seed, message id, index):
 *                unbiased, and the same bits for the same seed and message on every run and CPU.
 * Symmetric: decode gives q * s. Error: |x - decode(x)| <= s / 2 at nearest, < s stochastic.
 * Non-finite input: the scale comes from the finite values of the row or group alone; +-Inf
 * saturates to +-127 (+-7), NaN encodes as 0, and encode returns how many non-finite values it
 * met, so a caller can fail naming them (a row of a NaN among finite values keeps its other
 * values' precision). FP32 and BF16 carry them as they are (BF16: NaN the quiet one), and count
 * them too. A row whose scale would be below FLT_MIN (maxabs under 127 * FLT_MIN, 7 * FLT_MIN)
 * encodes as zeros with scale 0, and one reaching FLT_MAX takes the float below maxabs / qmax
 * where qmax times that would overflow (so decode gives no Inf).
 * Encode and decode run AVX-512, AVX2 or scalar code, whichever the CPU has (checked once at run
 * time); the bytes and floats are the same on each. */
enum { KCODEC_FP32, KCODEC_BF16, KCODEC_INT8, KCODEC_INT4, KCODEC_COUNT };
typedef struct KCodec {
    int codec;        /* KCODEC_* */
    int block;        /* INT8: row length (>= 1); INT4: group size, 32 or 64; else unused */
    int stochastic;   /* INT4: stochastic rounding (else nearest) */
    uint64_t seed;    /* the stochastic rounding's seed */
} KCodec;
/* Bytes of n values encoded (the runtime's and the simulator's cost of a message). */
size_t kern_codec_bytes(const KCodec *c, size_t n);
/* "fp32", "bf16", "int8", "int4" and back (-1: unknown). */
const char *kern_codec_name(int codec);
int kern_codec_parse(const char *name);
/* out: kern_codec_bytes(c, n) bytes. msg: the message's id (with the seed, it keys the
 * stochastic rounding; ignored otherwise). Returns the count of non-finite values in x. */
size_t kern_codec_encode(const KCodec *c, uint64_t msg, const float *x, size_t n, uint8_t *out);
void   kern_codec_decode(const KCodec *c, const uint8_t *in, size_t n, float *y);

/* Delta messages (after AQ-SGD): both ends keep a sample's last activation, the reference, as
 * a store encoded by `ref` (KCODEC_INT8, _BF16 or _FP32; kern_codec_bytes(ref, n) bytes; a
 * store of zero bytes is a zero reference, so a first message is x itself quantized). The
 * sender sends c's encoding of x - r (c: INT8 or INT4); the receiver reconstructs y = r + q s
 * (one rounding: fmaf), and both store y, so their references stay bitwise equal.
 * delta_encode: tmp n floats; returns the non-finite count of x - r. delta_decode: y = r + q s. */
size_t kern_codec_delta_encode(const KCodec *c, uint64_t msg, const float *x, const float *r, size_t n, uint8_t *out,
                               float *tmp);
void   kern_codec_delta_decode(const KCodec *c, const uint8_t *in, const float *r, size_t n, float *y);
/* The reference of a store as floats, and a reconstruction stored (returns its non-finite count). */
void   kern_codec_ref_load(const KCodec *ref, const uint8_t *store, size_t n, float *r);
size_t kern_codec_ref_store(const KCodec *ref, const float *y, size_t n, uint8_t *store);
/* The two ends in one call each. send: encodes x against store into out, then updates store
 * with what the receiver will reconstruct (tmp: 2n floats). recv: y = the reconstruction, and
 * the store updated. Both return the non-finite count (x - r; y). */
size_t kern_codec_delta_send(const KCodec *c, const KCodec *ref, uint64_t msg, const float *x, size_t n,
                             uint8_t *store, uint8_t *out, float *tmp);
size_t kern_codec_delta_recv(const KCodec *c, const KCodec *ref, const uint8_t *in, size_t n, uint8_t *store,
                             float *y);
/* Error feedback (gradients): v = x + e, out = encode(v), e = v - decode(out), so the error of
 * step t is sent with step t + 1. e: n floats carried between calls (zeros at first); tmp: n
 * floats. Returns the non-finite count of v. */
size_t kern_codec_ef_encode(const KCodec *c, uint64_t msg, const float *x, float *e, size_t n, uint8_t *out,
                            float *tmp);
/* Addition for tests: run the codecs' KCODEC_ISA_* code (KCODEC_ISA_AUTO: the best this CPU
 * has, the default). PD_EINVAL where the CPU lacks that instruction set (nothing changes).
 * Not thread-safe: call it with no codec running. */
enum { KCODEC_ISA_AUTO = -1, KCODEC_ISA_SCALAR = 0, KCODEC_ISA_AVX2 = 1, KCODEC_ISA_AVX512 = 2, KCODEC_ISA_COUNT = 3 };
int kern_codec_isa_force(int isa);
/* The instruction set the codecs run now (KCODEC_ISA_*). */
int kern_codec_isa(void);

#endif
