/* kern_basic.c: the fast versions of the small kernels: linear, relu, max pool, global
 * average pool, dropout, zero-pad/crop, softmax cross-entropy; and the shared machinery:
 * the thread setting, kern_parallel_for and kern_sgemm. Convolution is in conv.c, LSTM in
 * lstm.c, batch norm in bn.c.
 *
 * Threads. Debian's libdnnl 2.6 is built with OpenMP (it links libgomp), so its thread count
 * is OpenMP's nthreads-var ICV, which is per calling thread. We do not link -fopenmp
 * ourselves; instead we look up the few libgomp entry points we need (omp_set_num_threads,
 * omp_get_max_threads, omp_get_thread_num, omp_get_num_threads and GOMP_parallel, the call
 * `#pragma omp parallel` compiles to) in the libgomp that libdnnl already loaded. So every
 * kernel runs on ONE team of threads, oneDNN's: kern_parallel_for hands our element-wise
 * loops to that team, and kern_sgemm is oneDNN's sgemm (which also uses it). OpenBLAS (the
 * pthread build) is held to one thread: kern_sgemm hands it the products oneDNN's AVX2 kernels
 * run slowly, split over the same team (at kern_sgemm). A program that runs kernels on several
 * threads calls kern_set_threads on each (threads it creates afterwards inherit the setting).
 *
 * GEMM. oneDNN's sgemm JIT-compiles for the CPU it finds (AVX-512 here; on AVX2 CPUs two
 * kinds of product go to OpenBLAS instead, see kern_sgemm) while OpenBLAS runs
 * the kernel the environment's OPENBLAS_CORETYPE names (Haswell, AVX2, on the development
 * machines): measured 1 thread, best of 10, GFLOP/s (M, N, K):
 *     (1024, 1024, 1024) OpenBLAS 107, oneDNN 201;  (64, 1024, 784) 105 vs 188;
 *     (1792, 1024, 256) 88 vs 211;  (64, 1024, 256) 108 vs 206.
 *
 * The element-wise and pooling loops are memory-bound: plain C written so that gcc -O2
 * -march=native vectorises the inner loop (restrict pointers, unit stride, selects), split
 * over the threads in chunks of >= KB_GRAIN elements. Every element (or, for reductions,
 * every plane / sample) is computed by one thread in a fixed order, so results do not depend
 * on the thread count. */
/* -O2 alone (gcc 12's very-cheap cost model) leaves the select loops (relu_mask_r: a
 * mispredicted branch per element) and the add loops scalar. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif
#include <cblas.h>
#include <dlfcn.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <string.h>

#include "kernels.h"

/* Elements below which a loop stays on the calling thread: a parallel region costs a few
 * microseconds, about what one core needs for 32K floats of an element-wise pass. */
enum { KB_GRAIN = 32768 };

typedef struct Gomp {
    void (*set_num)(int);
    int (*max_threads)(void);
    int (*thread_num)(void);
    int (*num_threads)(void);
    void (*parallel)(void (*fn)(void *), void *data, unsigned n, unsigned flags);
} Gomp;
static Gomp g_omp;
static pthread_once_t g_omp_once = PTHREAD_ONCE_INIT;

static void omp_lookup(void) {
    void *h = dlopen("libgomp.so.1", RTLD_LAZY);   /* already loaded by libdnnl: just a handle */
    if (!h) return;                                /* kept open: the pointers must stay valid */
    *(void **)&g_omp.set_num = dlsym(h, "omp_set_num_threads");
    *(void **)&g_omp.max_threads = dlsym(h, "omp_get_max_threads");
    *(void **)&g_omp.thread_num = dlsym(h, "omp_get_thread_num");
    *(void **)&g_omp.num_threads = dlsym(h, "omp_get_num_threads");
    *(void **)&g_omp.parallel = dlsym(h, "GOMP_parallel");
    if (!g_omp.max_threads || !g_omp.thread_num || !g_omp.num_threads || !g_omp.parallel)
        g_omp.parallel = NULL;   /* kern_parallel_for runs serially then */
}

static const Gomp *omp(void) {
    pthread_once(&g_omp_once, omp_lookup);
    return &g_omp;
}

void kern_set_threads(int n) {
    PD_ASSERT(n >= 1);
    openblas_set_num_threads(1);   // kern_sgemm runs it on our team's threads
    if (omp()->set_num) omp()->set_num(n);
}

typedef struct ParJob {
    size_t n, align;
    KernRangeFn fn;
    void *ctx;
} ParJob;

static void par_body(void *p) {
    const ParJob *j = p;
    const size_t t = (size_t)g_omp.thread_num(), nt = (size_t)g_omp.num_threads();
    const size_t units = (j->n + j->align - 1) / j->align;   // split in whole align-blocks
    size_t b = units * t / nt * j->align, e = units * (t + 1) / nt * j->align;
    if (e > j->n) e = j->n;
    if (b < e) j->fn(j->ctx, b, e);
}

void kern_parallel_for(size_t n, size_t min_chunk, size_t align, KernRangeFn fn, void *ctx) {
    if (n == 0) return;
    if (align < 1) align = 1;
    if (min_chunk < 1) min_chunk = 1;
    const Gomp *g = omp();
    size_t nt = g->parallel ? (size_t)g->max_threads() : 1, by_size = n / min_chunk;
    if (nt > by_size) nt = by_size;
    if (nt > (n + align - 1) / align) nt = (n + align - 1) / align;
    if (nt <= 1) {
        fn(ctx, 0, n);
        return;
    }
    ParJob j = {n, align, fn, ctx};
    g->parallel(par_body, &j, (unsigned)nt, 0);
}

/* Two exceptions to oneDNN's sgemm, on AVX2 CPUs (oneDNN's gemm then runs its AVX2 kernels),
 * where OpenBLAS, which packs its operands first, is measured faster:
 *  - C = A B, neither transposed, with few rows (m <= 256) and B's rows a multiple of 2 KB apart
 *    (ldb a multiple of 512 floats): oneDNN reads B in place and rows that far apart fall into
 *    the same cache sets, at half speed. A linear layer's input gradient is that product
 *    (dx = dy W, ldb = the layer's input width: 1024, 2048 in mlp and vgg16).
 *  - C = A^T B (a weight gradient: linear, LSTM), unless C is wide (n > 512) and the sum short
 *    (k < 256): oneDNN runs it at 35-50 GFLOP/s where A's rows are a multiple of 2 KB apart and C
 *    is narrow; on the wide, short ones the two are even, and oneDNN keeps them.
 * bench/sgemm_shapes.c, an AMD EPYC (Zen 3), 1 thread, the middle of three runs, ms, oneDNN
 * against OpenBLAS, (m, n, k): NN (64, 2048, 2048) 12.81, 6.39; (64, 1024, 1024) 2.94, 1.54;
 * but (64, 2000, 2048) 5.42, 6.20 and (2048, 2048, 64) 5.92, 6.00, where oneDNN stays; TN (1024,
 * 256, 1728) (LSTM's dW_hh) 22.64, 9.96; (2048, 128, 64) 0.84, 0.39; (1024, 1024, 64) 1.48, 1.47.
 * On AVX-512 oneDNN's kernels show neither slowdown and run every product. */
static int g_gemm_avx2;
static pthread_once_t g_gemm_once = PTHREAD_ONCE_INIT;

static void gemm_isa(void) {
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), avx512 = (unsigned)dnnl_cpu_isa_avx512_core;
    g_gemm_avx2 = (isa & avx512) != avx512;   // the ISA values are bit sets (avx2_vnni has no avx512 bits)
}

/* oneDNN's direct convolutions block channels by its vector width: 16 floats with AVX-512,
 * 8 below it (nChw8c on AVX2, checked with ONEDNN_VERBOSE; conv_dnnl.c keeps a layout only
 * where the primitives chose exactly it). */
int kern_blk_width(void) {
    pthread_once(&g_gemm_once, gemm_isa);
    return g_gemm_avx2 ? 8 : 16;
}

static int sgemm_to_openblas(char ta, char tb, int m, int n, int k, int ldb) {
    pthread_once(&g_gemm_once, gemm_isa);
    if (!g_gemm_avx2) return 0;
    if (ta == 'T' && tb == 'N') return n <= 512 || k >= 256;
    return ta == 'N' && tb == 'N' && m <= 256 && k >= 32 && ldb % 512 == 0;
}

/* OpenBLAS runs single-threaded inside our one team (its own pool would contend with the OpenMP
 * team spinning on the same cores: 30% slower at 2 threads): C's columns are split into blocks
 * of whole 16s, each a product of its own: deterministic for a given thread count, as oneDNN's
 * sgemm is (the bits may differ between thread counts, as oneDNN's do on AVX2). */
typedef struct GemmCols {
    int ta, m, k, lda, ldb, ldc;
    float alpha, beta;
    const float *a, *b;
    float *c;
} GemmCols;

static void gemm_cols_r(void *p, size_t b, size_t e) {
    const GemmCols *j = p;
    cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans, CblasNoTrans, j->m, (int)(e - b), j->k, j->alpha,
                j->a, j->lda, j->b + b, j->ldb, j->beta, j->c + b, j->ldc);
}

void kern_sgemm(char ta, char tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0) return;
    if (sgemm_to_openblas(ta, tb, m, n, k, ldb)) {
        GemmCols j = {ta == 'T', m, k, lda, ldb, ldc, alpha, beta, a, b, c};
        kern_parallel_for((size_t)n, 64, 16, gemm_cols_r, &j);
        return;
    }
    dnnl_status_t s = dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    PD_ASSERTF(s == dnnl_success, "dnnl_sgemm(%c, %c, %d, %d, %d): status %d", ta, tb, m, n, k, (int)s);
}

/* ---- per-thread scratch ------------------------------------------------------------------ */
/* Each thread's arena hangs off a pthread key (freed by its destructor at thread exit) and
 * is also linked into a global list, so that it stays reachable (leak checkers) while the
 * thread lives. */
typedef struct Arena {
    void *p[KSCR_COUNT];
    size_t n[KSCR_COUNT];
    struct Arena *prev, *next;
} Arena;
static pthread_key_t g_arena_key;
static pthread_once_t g_arena_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_arena_mu = PTHREAD_MUTEX_INITIALIZER;
static Arena *g_arenas;

static void arena_free(void *v) {
    Arena *a = v;
    if (!a) return;
    pthread_mutex_lock(&g_arena_mu);
    if (a->prev) a->prev->next = a->next;
    else g_arenas = a->next;
    if (a->next) a->next->prev = a->prev;
    pthread_mutex_unlock(&g_arena_mu);
    for (int i = 0; i < KSCR_COUNT; i++) pd_free(a->p[i]);
    pd_free(a);
}

static void arena_key(void) { PD_ASSERT(pthread_key_create(&g_arena_key, arena_free) == 0); }

void *kern_scratch(int slot, size_t bytes) {
    PD_ASSERTF(slot >= 0 && slot < KSCR_COUNT, "scratch slot %d", slot);
    pthread_once(&g_arena_once, arena_key);
    Arena *a = pthread_getspecific(g_arena_key);
    if (!a) {
        a = pd_calloc(sizeof *a);
        pthread_mutex_lock(&g_arena_mu);
        a->next = g_arenas;
        if (g_arenas) g_arenas->prev = a;
        g_arenas = a;
        pthread_mutex_unlock(&g_arena_mu);
        PD_ASSERT(pthread_setspecific(g_arena_key, a) == 0);
    }
    if (a->n[slot] < bytes) {
        pd_free(a->p[slot]);
        a->p[slot] = pd_alloc(bytes);
        a->n[slot] = bytes;
    }
    if (!a->p[slot]) {   // bytes == 0 on a fresh slot: still a valid pointer
        a->p[slot] = pd_alloc(64);
        a->n[slot] = 64;
    }
    return a->p[slot];
}

size_t kern_scratch_slot_bytes(int slot) {
    PD_ASSERTF(slot >= 0 && slot < KSCR_COUNT, "scratch slot %d", slot);
    pthread_once(&g_arena_once, arena_key);
    const Arena *a = pthread_getspecific(g_arena_key);
    return a ? a->n[slot] : 0;
}

size_t kern_scratch_bytes(void) {
    size_t n = 0;
    for (int i = 0; i < KSCR_COUNT; i++) n += kern_scratch_slot_bytes(i);
    return n;
}

void kern_scratch_release(void) {
    pthread_once(&g_arena_once, arena_key);
    Arena *a = pthread_getspecific(g_arena_key);
    if (!a) return;
    PD_ASSERT(pthread_setspecific(g_arena_key, NULL) == 0);
    arena_free(a);
}

/* ---- linear -------------------------------------------------------------------------- */
typedef struct BiasJob {
    const float *dy;
    float *db;
    int n, out;
    int set;   /* db is written, not added to */
} BiasJob;

static void bias_cols(void *p, size_t b, size_t e) {   // db[o] (+)= sum_i dy[i, o], o in [b, e)
    const BiasJob *j = p;
    float *restrict d = j->db;
    if (j->set)   // the first row assigns: the same additions as onto zeros
        for (size_t o = b; o < e; o++) d[o] = 0.0f + j->dy[o];
    for (int i = j->set ? 1 : 0; i < j->n; i++) {
        const float *restrict g = j->dy + (size_t)i * j->out;
        for (size_t o = b; o < e; o++) d[o] += g[o];
    }
}

void kern_linear_fwd(const float *x, const float *w, const float *b, float *y, int n, int in, int out) {
    if (n == 0 || out == 0) return;
    float beta = 0.0f;
    if (b) {   // y starts as the bias rows, then y += x W^T
        for (int i = 0; i < n; i++) memcpy(y + (size_t)i * out, b, sizeof(float) * out);
        beta = 1.0f;
    }
    kern_sgemm('N', 'T', n, out, in, 1.0f, x, in, w, in, beta, y, out);
}

void kern_linear_bwd_set(const float *x, const float *w, const float *dy, float *dx, float *dw, float *db, int n,
                         int in, int out, int set) {
    if (n == 0) {
        if (dw && (set & KSET_DW)) memset(dw, 0, (size_t)out * in * sizeof(float));
        if (db && (set & KSET_DW)) memset(db, 0, (size_t)out * sizeof(float));
        return;
    }
    if (dx)   // dx (N,I) (+)= dy (N,O) W (O,I)
        kern_sgemm('N', 'N', n, in, out, 1.0f, dy, out, w, in, set & KSET_DX ? 0.0f : 1.0f, dx, in);
    if (dw)   // dW (O,I) (+)= dy^T x
        kern_sgemm('T', 'N', out, in, n, 1.0f, dy, out, x, in, set & KSET_DW ? 0.0f : 1.0f, dw, in);
    if (db) {
        BiasJob j = {dy, db, n, out, (set & KSET_DW) != 0};
        kern_parallel_for((size_t)out, KB_GRAIN / (n > 0 ? (size_t)n : 1) + 1, 16, bias_cols, &j);
    }
}

void kern_linear_bwd(const float *x, const float *w, const float *dy, float *dx, float *dw, float *db, int n,
                     int in, int out) {
    kern_linear_bwd_set(x, w, dy, dx, dw, db, n, in, out, 0);
}

/* ---- relu and the other element-wise passes ---------------------------------------------- */
typedef struct EwJob {
    const float *a, *b;
    float *y;
} EwJob;

static void relu_fwd_r(void *p, size_t b, size_t e) {
    const EwJob *j = p;
    const float *restrict x = j->a;
    float *restrict y = j->y;
    for (size_t i = b; i < e; i++) y[i] = x[i] > 0 ? x[i] : 0.0f;
}

static void relu_inplace_r(void *p, size_t b, size_t e) {
    float *y = ((const EwJob *)p)->y;
    for (size_t i = b; i < e; i++) y[i] = y[i] > 0 ? y[i] : 0.0f;
}

static void relu_bwd_r(void *p, size_t b, size_t e) {   // a = y, b = dy; y = dx (+=)
    const EwJob *j = p;
    const float *restrict yv = j->a, *restrict g = j->b;
    float *restrict d = j->y;
    for (size_t i = b; i < e; i++) d[i] += yv[i] > 0 ? g[i] : 0.0f;
}

static void relu_mask_r(void *p, size_t b, size_t e) {   // y = b * (a > 0)
    const EwJob *j = p;
    const float *restrict yv = j->a, *restrict g = j->b;
    float *restrict d = j->y;
    for (size_t i = b; i < e; i++) d[i] = yv[i] > 0 ? g[i] : 0.0f;
}

static void add_relu_r(void *p, size_t b, size_t e) {
    const EwJob *j = p;
    const float *restrict u = j->a, *restrict v = j->b;
    float *restrict y = j->y;
    for (size_t i = b; i < e; i++) {
        float s = u[i] + v[i];
        y[i] = s > 0 ? s : 0.0f;
    }
}

static void acc_r(void *p, size_t b, size_t e) {
    const EwJob *j = p;
    const float *restrict u = j->a;
    float *restrict y = j->y;
    for (size_t i = b; i < e; i++) y[i] += u[i];
}

static void ew(KernRangeFn fn, const float *a, const float *b, float *y, size_t count) {
    EwJob j = {a, b, y};
    kern_parallel_for(count, KB_GRAIN, 16, fn, &j);
}

void kern_relu_fwd(const float *x, float *y, size_t count) { ew(relu_fwd_r, x, NULL, y, count); }
void kern_relu_bwd(const float *y, const float *dy, float *dx, size_t count) { ew(relu_bwd_r, y, dy, dx, count); }
void kern_relu_inplace(float *y, size_t count) { ew(relu_inplace_r, NULL, NULL, y, count); }
void kern_relu_mask(const float *y, const float *dy, float *g, size_t count) { ew(relu_mask_r, y, dy, g, count); }
void kern_add_relu(const float *a, const float *b, float *y, size_t count) { ew(add_relu_r, a, b, y, count); }
void kern_accumulate(float *y, const float *x, size_t count) { ew(acc_r, x, NULL, y, count); }

/* ---- max pool ------------------------------------------------------------------------ */
typedef struct PoolJob {
    const float *x, *dy;
    float *y, *dx;
    int32_t *am;
    const int32_t *cam;
    int h, w, k, stride, oh, ow;
    int set;   /* backward: each plane of dx zeroed just before its gradients go in */
    int blk;   /* blocked kernels: channels per block (8 or 16) */
} PoolJob;

#if defined(__AVX2__)
/* Even and odd floats of the 16 at p, each 8 in order: the two columns of 8 pooling windows. */
static inline void pool2_split(const float *p, __m256 *even, __m256 *odd) {
    const __m256 lo = _mm256_loadu_ps(p), hi = _mm256_loadu_ps(p + 8);
    const __m256 e = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)), o = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
    *even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
    *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
}

/* One output row of the 2x2, stride 2 pool, 8 windows at a time in AVX2 registers, with the
 * scalar loop's compares (a > b, ordered) and selects, so the same values and argmax bits;
 * returns the first window left for it. Rows r0, r1 of the input; i0 the index of r0[0]. */
static int pool2_row_avx2(const float *r0, const float *r1, float *yo, int32_t *ao, int32_t i0, int w, int ow) {
    const __m256i step = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), wv = _mm256_set1_epi32(w);
    int ox = 0;
    for (; ox + 8 <= ow; ox += 8) {
        __m256 a0, a1, b0, b1;
        pool2_split(r0 + 2 * ox, &a0, &a1);
        pool2_split(r1 + 2 * ox, &b0, &b1);
        const __m256 ta = _mm256_cmp_ps(a1, a0, _CMP_GT_OQ), tb = _mm256_cmp_ps(b1, b0, _CMP_GT_OQ);
        const __m256 ma = _mm256_blendv_ps(a0, a1, ta), mb = _mm256_blendv_ps(b0, b1, tb);
        const __m256 tm = _mm256_cmp_ps(mb, ma, _CMP_GT_OQ);
        const __m256i c = _mm256_add_epi32(_mm256_set1_epi32(i0 + 2 * ox), step);
        const __m256i ia = _mm256_sub_epi32(c, _mm256_castps_si256(ta));   /* a true mask is -1 */
        const __m256i ib = _mm256_sub_epi32(_mm256_add_epi32(c, wv), _mm256_castps_si256(tb));
        _mm256_storeu_ps(yo + ox, _mm256_blendv_ps(ma, mb, tm));
        _mm256_storeu_si256((__m256i *)(void *)(ao + ox), _mm256_blendv_epi8(ia, ib, _mm256_castps_si256(tm)));
    }
    return ox;
}
#endif

static void pool_fwd_r(void *p, size_t p0, size_t p1) {   // planes [p0, p1)
    const PoolJob *j = p;
    const int h = j->h, w = j->w, k = j->k, stride = j->stride, oh = j->oh, ow = j->ow;
    for (size_t q = p0; q < p1; q++) {
        const float *xp = j->x + q * h * w;
        float *yp = j->y + q * oh * ow;
        int32_t *ap = j->am + q * oh * ow;
        if (k == 2 && stride == 2) {   // the reference models' pool: unrolled, same tie rule (first max)
            /* selects, not branches: which of the four wins is data-dependent, and the
             * mispredicted branches cost vgg16 ~3 ms per step (4 of its 78) */
            for (int oy = 0; oy < oh; oy++) {
                const float *restrict r0 = xp + 2 * oy * w, *restrict r1 = r0 + w;
                float *restrict yo = yp + oy * ow;
                int32_t *restrict ao = ap + oy * ow;
                const int32_t i0 = 2 * oy * w;
#if defined(__AVX2__)
                int ox = pool2_row_avx2(r0, r1, yo, ao, i0, w, ow);
#else
                int ox = 0;
#endif
                for (; ox < ow; ox++) {
                    const float a0 = r0[2 * ox], a1 = r0[2 * ox + 1], b0 = r1[2 * ox], b1 = r1[2 * ox + 1];
                    const int32_t c = i0 + 2 * ox;
                    const int ta = a1 > a0, tb = b1 > b0;
                    const float ma = ta ? a1 : a0, mb = tb ? b1 : b0;
                    const int32_t ia = c + ta, ib = c + w + tb;
                    const int tm = mb > ma;   // ties keep the first row: the scan order's first max
                    yo[ox] = tm ? mb : ma;
                    ao[ox] = tm ? ib : ia;
                }
            }
            continue;
        }
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) {
                int best = oy * stride * w + ox * stride;
                float m = xp[best];
                for (int r = 0; r < k; r++) {
                    const float *row = xp + (oy * stride + r) * w + ox * stride;
                    for (int q2 = 0; q2 < k; q2++)
                        if (row[q2] > m) m = row[q2], best = (oy * stride + r) * w + ox * stride + q2;
                }
                yp[oy * ow + ox] = m;
                ap[oy * ow + ox] = best;
            }
    }
}

static void pool_bwd_r(void *p, size_t p0, size_t p1) {
    const PoolJob *j = p;
    const size_t o = (size_t)j->oh * j->ow, hw = (size_t)j->h * j->w;
    for (size_t q = p0; q < p1; q++) {
        const float *g = j->dy + q * o;
        const int32_t *a = j->cam + q * o;
        float *d = j->dx + q * hw;
        if (j->set) memset(d, 0, hw * sizeof(float));   /* in cache for the scatter */
        for (size_t i = 0; i < o; i++) d[a[i]] += g[i];
    }
}

static size_t plane_grain(size_t plane) { return KB_GRAIN / (plane ? plane : 1) + 1; }

void kern_maxpool_fwd(const float *x, float *y, int32_t *argmax, int n, int c, int h, int w, int k, int stride) {
    PoolJob j = {.x = x, .y = y, .am = argmax, .h = h, .w = w, .k = k, .stride = stride,
                 .oh = (h - k) / stride + 1, .ow = (w - k) / stride + 1};
    kern_parallel_for((size_t)n * c, plane_grain((size_t)h * w), 1, pool_fwd_r, &j);
}

void kern_maxpool_bwd(const float *dy, const int32_t *argmax, float *dx, int n, int c, int h, int w, int k,
                      int stride, int set) {
    PoolJob j = {.dy = dy, .dx = dx, .cam = argmax, .h = h, .w = w, .k = k, .stride = stride,
                 .oh = (h - k) / stride + 1, .ow = (w - k) / stride + 1, .set = set};
    kern_parallel_for((size_t)n * c, plane_grain((size_t)h * w), 1, pool_bwd_r, &j);
}

/* Blocked (nChw8c / nChw16c, B channels per block): a "plane" q is (sample, block of B
 * channels), each pixel B contiguous floats, one per channel; the B lanes go through the
 * plain kernel's scan (first max wins) at once. Each body is compiled for B = 8 and B = 16. */
static inline __attribute__((always_inline)) void pool_fwd_blk_body(const PoolJob *j, size_t p0, size_t p1,
                                                                    const int B) {
    const int h = j->h, w = j->w, k = j->k, stride = j->stride, oh = j->oh, ow = j->ow;
    for (size_t q = p0; q < p1; q++) {
        const float *xp = j->x + q * h * w * B;
        float *yp = j->y + q * oh * ow * B;
        int32_t *ap = j->am + q * oh * ow * B;
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) {
                float m[16];
                int32_t a[16];
                const int i0 = oy * stride * w + ox * stride;
                for (int l = 0; l < B; l++) m[l] = xp[(size_t)i0 * B + l], a[l] = i0;
                for (int r = 0; r < k; r++)
                    for (int q2 = 0; q2 < k; q2++) {
                        const int i = (oy * stride + r) * w + ox * stride + q2;
                        const float *restrict v = xp + (size_t)i * B;
                        for (int l = 0; l < B; l++) {
                            const int t = v[l] > m[l];
                            m[l] = t ? v[l] : m[l];
                            a[l] = t ? i : a[l];
                        }
                    }
                float *restrict yo = yp + ((size_t)oy * ow + ox) * B;
                int32_t *restrict ao = ap + ((size_t)oy * ow + ox) * B;
                for (int l = 0; l < B; l++) yo[l] = m[l], ao[l] = a[l];
            }
    }
}

#if defined(__AVX2__)
/* B = 8 in AVX2 registers (gcc leaves the loops above scalar for it: 2 ns per input element on
 * vgg16's first pool, against 0.3 here): the same compare (v > m, ordered) and selects, so the
 * same values and argmax bits. */
static void pool_fwd_blk8_avx2(const PoolJob *j, size_t p0, size_t p1) {
    const int h = j->h, w = j->w, k = j->k, stride = j->stride, oh = j->oh, ow = j->ow;
    for (size_t q = p0; q < p1; q++) {
        const float *xp = j->x + q * h * w * 8;
        float *yp = j->y + q * oh * ow * 8;
        int32_t *ap = j->am + q * oh * ow * 8;
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) {
                const int i0 = oy * stride * w + ox * stride;
                __m256 m = _mm256_loadu_ps(xp + (size_t)i0 * 8);
                __m256i a = _mm256_set1_epi32(i0);
                for (int r = 0; r < k; r++)
                    for (int q2 = 0; q2 < k; q2++) {
                        const int i = (oy * stride + r) * w + ox * stride + q2;
                        const __m256 v = _mm256_loadu_ps(xp + (size_t)i * 8);
                        const __m256 t = _mm256_cmp_ps(v, m, _CMP_GT_OQ);
                        m = _mm256_blendv_ps(m, v, t);
                        a = _mm256_blendv_epi8(a, _mm256_set1_epi32(i), _mm256_castps_si256(t));
                    }
                _mm256_storeu_ps(yp + ((size_t)oy * ow + ox) * 8, m);
                _mm256_storeu_si256((__m256i *)(void *)(ap + ((size_t)oy * ow + ox) * 8), a);
            }
    }
}
#endif

static void pool_fwd_blk_r(void *p, size_t p0, size_t p1) {
    const PoolJob *j = p;
#if defined(__AVX2__)
    if (j->blk == 8) pool_fwd_blk8_avx2(j, p0, p1);
#else
    if (j->blk == 8) pool_fwd_blk_body(j, p0, p1, 8);
#endif
    else pool_fwd_blk_body(j, p0, p1, 16);
}

static void pool_bwd_blk_r(void *p, size_t p0, size_t p1) {
    const PoolJob *j = p;
    const size_t o = (size_t)j->oh * j->ow, hw = (size_t)j->h * j->w, B = (size_t)j->blk;
    for (size_t q = p0; q < p1; q++) {
        const float *g = j->dy + q * o * B;
        const int32_t *a = j->cam + q * o * B;
        float *d = j->dx + q * hw * B;
        if (j->set) memset(d, 0, hw * B * sizeof(float));
        for (size_t i = 0; i < o * B; i++) d[(size_t)a[i] * B + (i & (B - 1))] += g[i];
    }
}

void kern_maxpool_fwd_blk(const float *x, float *y, int32_t *argmax, int n, int c, int h, int w, int k, int stride,
                          int blk) {
    PD_ASSERTF((blk == 8 || blk == 16) && c % blk == 0, "maxpool (blocked by %d): %d channels", blk, c);
    PoolJob j = {.x = x, .y = y, .am = argmax, .h = h, .w = w, .k = k, .stride = stride,
                 .oh = (h - k) / stride + 1, .ow = (w - k) / stride + 1, .blk = blk};
    kern_parallel_for((size_t)n * (c / blk), plane_grain((size_t)h * w * blk), 1, pool_fwd_blk_r, &j);
}

void kern_maxpool_bwd_blk(const float *dy, const int32_t *argmax, float *dx, int n, int c, int h, int w, int k,
                          int stride, int set, int blk) {
    PD_ASSERTF((blk == 8 || blk == 16) && c % blk == 0, "maxpool (blocked by %d): %d channels", blk, c);
    PoolJob j = {.dy = dy, .dx = dx, .cam = argmax, .h = h, .w = w, .k = k, .stride = stride,
                 .oh = (h - k) / stride + 1, .ow = (w - k) / stride + 1, .set = set, .blk = blk};
    kern_parallel_for((size_t)n * (c / blk), plane_grain((size_t)h * w * blk), 1, pool_bwd_blk_r, &j);
}

/* ---- global average pool --------------------------------------------------------------- */
typedef struct GapJob {
    const float *x;
    float *y;
    int hw;
    int blk;   /* blocked kernels: channels per block (8 or 16) */
} GapJob;

static void gap_fwd_r(void *p, size_t p0, size_t p1) {
    const GapJob *j = p;
    const float inv = 1.0f / (float)j->hw;
    for (size_t q = p0; q < p1; q++) {
        const float *restrict xp = j->x + q * j->hw;
        float s = 0;
        for (int i = 0; i < j->hw; i++) s += xp[i];
        j->y[q] = s * inv;
    }
}

static void gap_bwd_r(void *p, size_t p0, size_t p1) {   // x = dy (per plane), y = dx
    const GapJob *j = p;
    const float inv = 1.0f / (float)j->hw;
    for (size_t q = p0; q < p1; q++) {
        float g = j->x[q] * inv;
        float *restrict d = j->y + q * j->hw;
        for (int i = 0; i < j->hw; i++) d[i] += g;
    }
}

void kern_gap_fwd(const float *x, float *y, int n, int c, int hw) {
    GapJob j = {x, y, hw, 0};
    kern_parallel_for((size_t)n * c, plane_grain((size_t)hw), 1, gap_fwd_r, &j);
}

void kern_gap_bwd(const float *dy, float *dx, int n, int c, int hw) {
    GapJob j = {dy, dx, hw, 0};
    kern_parallel_for((size_t)n * c, plane_grain((size_t)hw), 1, gap_bwd_r, &j);
}

/* Blocked: x (n, c/B, hw, B). Each channel's sum runs over the positions in order, as the
 * plain kernel's, so the results are bitwise the same; the B channels of a block side by side. */
static inline __attribute__((always_inline)) void gap_fwd_blk_body(const GapJob *j, size_t b0, size_t b1,
                                                                   const int B) {
    const float inv = 1.0f / (float)j->hw;
    for (size_t q = b0; q < b1; q++) {   // q = sample * (c/B) + block
        const float *restrict xp = j->x + q * (size_t)j->hw * B;
        float s[16] = {0};
        for (int i = 0; i < j->hw; i++)
            for (int k = 0; k < B; k++) s[k] += xp[(size_t)i * B + k];
        for (int k = 0; k < B; k++) j->y[q * B + k] = s[k] * inv;
    }
}

static void gap_fwd_blk_r(void *p, size_t b0, size_t b1) {
    const GapJob *j = p;
    if (j->blk == 8) gap_fwd_blk_body(j, b0, b1, 8);
    else gap_fwd_blk_body(j, b0, b1, 16);
}

static void gap_bwd_blk_r(void *p, size_t b0, size_t b1) {   // x = dy (n, c), y = dx blocked
    const GapJob *j = p;
    const float inv = 1.0f / (float)j->hw;
    const size_t B = (size_t)j->blk;
    for (size_t q = b0; q < b1; q++) {
        float g[16];
        for (size_t k = 0; k < B; k++) g[k] = j->x[q * B + k] * inv;
        float *restrict d = j->y + q * (size_t)j->hw * B;
        for (int i = 0; i < j->hw; i++)
            for (size_t k = 0; k < B; k++) d[(size_t)i * B + k] += g[k];
    }
}

void kern_gap_fwd_blk(const float *x, float *y, int n, int c, int hw, int blk) {
    PD_ASSERTF((blk == 8 || blk == 16) && c % blk == 0, "gap (blocked by %d): %d channels", blk, c);
    GapJob j = {x, y, hw, blk};
    kern_parallel_for((size_t)n * (c / blk), plane_grain((size_t)hw * blk), 1, gap_fwd_blk_r, &j);
}

void kern_gap_bwd_blk(const float *dy, float *dx, int n, int c, int hw, int blk) {
    PD_ASSERTF((blk == 8 || blk == 16) && c % blk == 0, "gap (blocked by %d): %d channels", blk, c);
    GapJob j = {dy, dx, hw, blk};
    kern_parallel_for((size_t)n * (c / blk), plane_grain((size_t)hw * blk), 1, gap_bwd_blk_r, &j);
}

/* ---- dropout ------------------------------------------------------------------------- */
typedef struct DropJob {
    const float *x;
    float *y;
    uint8_t *mask;
    const uint8_t *cmask;
    float scale;
    uint32_t keep_min;
    uint64_t seed, stream, substream;
} DropJob;

/* Element i is kept iff its uniform, (word >> 8) / 2^24 with word i % 4 of Philox block i / 4
 * of the stream, is >= p: as integers, iff word >> 8 >= keep_min = ceil(p 2^24) (exact: p
 * has 24 significant bits). The words come 64 at a time (rng_blocks); a chunk starts at a
 * multiple of 64 (kern_parallel_for's alignment below). The selects write x * scale or +0.0,
 * so the vector and scalar paths agree bitwise. */
static void drop_fwd_r(void *p, size_t b, size_t e) {
    const DropJob *j = p;
    Rng r;
    rng_init(&r, j->seed, j->stream, j->substream);
    uint8_t *restrict m = j->mask;
    const float *restrict x = j->x;
    float *restrict y = j->y;
    const uint32_t keep_min = j->keep_min;
    uint32_t words[64];
    for (size_t i0 = b; i0 < e; i0 += 64) {
        size_t len = e - i0 < 64 ? e - i0 : 64, i = 0;
        rng_blocks(&r, i0 / 4, (len + 3) / 4, words);
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
        const __m512i kmin = _mm512_set1_epi32((int)keep_min);
        const __m512 sc = _mm512_set1_ps(j->scale);
        for (; i + 16 <= len; i += 16) {
            __m512i w = _mm512_srli_epi32(_mm512_loadu_si512((const void *)(words + i)), 8);
            __mmask16 keep = _mm512_cmpge_epu32_mask(w, kmin);
            _mm_storeu_si128((__m128i *)(void *)(m + i0 + i), _mm_maskz_set1_epi8(keep, 1));
            _mm512_storeu_ps(y + i0 + i, _mm512_maskz_mul_ps(keep, _mm512_loadu_ps(x + i0 + i), sc));
        }
#elif defined(__AVX2__)
        /* word >> 8 < 2^24 and keep_min <= 2^24: a signed compare with keep_min - 1 is exact.
         * 32 at a time: four lane masks packed to 32 bytes, then put back in element order. */
        const __m256i kmin1 = _mm256_set1_epi32((int)keep_min - 1);
        const __m256 sc = _mm256_set1_ps(j->scale);
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), one = _mm256_set1_epi8(1);
        for (; i + 32 <= len; i += 32) {
            __m256i k[4];
            for (int q = 0; q < 4; q++) {
                __m256i w = _mm256_srli_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(words + i + 8 * q)), 8);
                k[q] = _mm256_cmpgt_epi32(w, kmin1);
                __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i0 + i + 8 * q), sc);
                _mm256_storeu_ps(y + i0 + i + 8 * q, _mm256_and_ps(v, _mm256_castsi256_ps(k[q])));
            }
            __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(k[0], k[1]), _mm256_packs_epi32(k[2], k[3]));
            b = _mm256_and_si256(_mm256_permutevar8x32_epi32(b, order), one);
            _mm256_storeu_si256((__m256i *)(void *)(m + i0 + i), b);
        }
#endif
        for (; i < len; i++) {
            m[i0 + i] = (words[i] >> 8) >= keep_min;
            y[i0 + i] = m[i0 + i] ? x[i0 + i] * j->scale : 0.0f;
        }
    }
}

static void drop_bwd_r(void *p, size_t b, size_t e) {   // x = dy, y = dx
    const DropJob *j = p;
    const float *restrict g = j->x;
    const uint8_t *restrict m = j->cmask;
    float *restrict d = j->y;
    size_t i = b;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    const __m512 sc = _mm512_set1_ps(j->scale);
    for (; i + 16 <= e; i += 16) {
        __mmask16 keep = _mm_test_epi8_mask(_mm_loadu_si128((const __m128i *)(const void *)(m + i)),
                                            _mm_set1_epi8(-1));
        __m512 t = _mm512_maskz_mul_ps(keep, _mm512_loadu_ps(g + i), sc);
        _mm512_storeu_ps(d + i, _mm512_add_ps(_mm512_loadu_ps(d + i), t));
    }
#elif defined(__AVX2__)
    const __m256 sc = _mm256_set1_ps(j->scale);
    for (; i + 8 <= e; i += 8) {
        __m256i keep = _mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(m + i))),
                                          _mm256_setzero_si256());
        __m256 t = _mm256_and_ps(_mm256_mul_ps(_mm256_loadu_ps(g + i), sc), _mm256_castsi256_ps(keep));
        _mm256_storeu_ps(d + i, _mm256_add_ps(_mm256_loadu_ps(d + i), t));
    }
#endif
    for (; i < e; i++) d[i] += m[i] ? g[i] * j->scale : 0.0f;
}

void kern_dropout_fwd(const float *x, float *y, uint8_t *mask, size_t count, float p, uint64_t seed, uint64_t stream,
                      uint64_t substream) {
    DropJob j = {.x = x, .y = y, .mask = mask, .scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f,
                 .keep_min = (uint32_t)ceil((double)p * 16777216.0), .seed = seed, .stream = stream,
                 .substream = substream};
    kern_parallel_for(count, KB_GRAIN / 8, 64, drop_fwd_r, &j);
}

void kern_dropout_bwd(const float *dy, const uint8_t *mask, float *dx, size_t count, float p) {
    DropJob j = {.x = dy, .y = dx, .cmask = mask, .scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f};
    kern_parallel_for(count, KB_GRAIN, 64, drop_bwd_r, &j);
}

/* ---- pad / crop ---------------------------------------------------------------------- */
typedef struct PadJob {
    const float *x;
    float *y;
    int h, w, p;
} PadJob;

static void pad_fwd_r(void *a, size_t q0, size_t q1) {
    const PadJob *j = a;
    const int h = j->h, w = j->w, p = j->p, ph = h + 2 * p, pw = w + 2 * p;
    for (size_t q = q0; q < q1; q++) {
        float *yp = j->y + q * ph * pw;
        const float *xp = j->x + q * h * w;
        memset(yp, 0, sizeof(float) * (size_t)p * pw);
        for (int i = 0; i < h; i++) {
            float *row = yp + (size_t)(i + p) * pw;
            memset(row, 0, sizeof(float) * p);
            memcpy(row + p, xp + (size_t)i * w, sizeof(float) * w);
            memset(row + p + w, 0, sizeof(float) * p);
        }
        memset(yp + (size_t)(h + p) * pw, 0, sizeof(float) * (size_t)p * pw);
    }
}

static void pad_bwd_r(void *a, size_t q0, size_t q1) {   // x = dy (padded), y = dx
    const PadJob *j = a;
    const int h = j->h, w = j->w, p = j->p, ph = h + 2 * p, pw = w + 2 * p;
    for (size_t q = q0; q < q1; q++)
        for (int i = 0; i < h; i++) {
            const float *restrict g = j->x + (q * ph + i + p) * pw + p;
            float *restrict d = j->y + (q * h + i) * w;
            for (int k = 0; k < w; k++) d[k] += g[k];
        }
}

void kern_pad_fwd(const float *x, float *y, int n, int c, int h, int w, int p) {
    PadJob j = {x, y, h, w, p};
    kern_parallel_for((size_t)n * c, plane_grain((size_t)(h + 2 * p) * (w + 2 * p)), 1, pad_fwd_r, &j);
}

void kern_pad_bwd(const float *dy, float *dx, int n, int c, int h, int w, int p) {
    PadJob j = {dy, dx, h, w, p};
    kern_parallel_for((size_t)n * c, plane_grain((size_t)(h + 2 * p) * (w + 2 * p)), 1, pad_bwd_r, &j);
}

/* ---- softmax cross-entropy ----------------------------------------------------------- */
/* Samples are split into at most XENT_BLOCKS blocks whose size depends on n alone; each
 * block's loss is summed in sample order (in double) by one thread, then the blocks in block
 * order: the same bits for every thread count (for n <= XENT_BLOCKS, the plain serial sum). */
enum { XENT_BLOCKS = 64 };
/* Up to XENT_KEEP classes a row's exponentials are computed once and kept for its gradient
 * (the same values: the gradient's bits do not depend on it). */
enum { XENT_KEEP = 1024 };

typedef struct XentJob {
    const float *logits;
    const int32_t *labels;
    float *dlogits;
    int n, k, bs;
    float f;
    double loss[XENT_BLOCKS];
    int hits[XENT_BLOCKS];
} XentJob;

static void xent_r(void *p, size_t b0, size_t b1) {
    XentJob *j = p;
    const int k = j->k;
    float ex[XENT_KEEP];
    for (size_t blk = b0; blk < b1; blk++) {
        double loss = 0;
        int hits = 0;
        int i1 = (int)(blk + 1) * j->bs < j->n ? (int)(blk + 1) * j->bs : j->n;
        for (int i = (int)blk * j->bs; i < i1; i++) {
            const float *z = j->logits + (size_t)i * k;
            const int32_t lab = j->labels[i];
            PD_ASSERTF(lab >= 0 && lab < k, "label %d of sample %d not in [0, %d)", lab, i, k);
            int am = 0;
            for (int c = 1; c < k; c++)
                if (z[c] > z[am]) am = c;
            hits += am == lab;
            const float m = z[am];
            float s = 0;
            const int keep = j->dlogits && k <= XENT_KEEP;   // the exponentials, for the gradient
            for (int c = 0; c < k; c++) {
                const float e = expf(z[c] - m);
                if (keep) ex[c] = e;
                s += e;
            }
            loss += (double)logf(s) + m - z[lab];
            if (j->dlogits) {
                float *d = j->dlogits + (size_t)i * k;
                const float inv = j->f / s;
                if (keep)
                    for (int c = 0; c < k; c++) d[c] += ex[c] * inv;
                else
                    for (int c = 0; c < k; c++) d[c] += expf(z[c] - m) * inv;
                d[lab] -= j->f;
            }
        }
        j->loss[blk] = loss;
        j->hits[blk] = hits;
    }
}

float kern_xent_fwd_bwd(const float *logits, const int32_t *labels, float *dlogits, int n, int k, float scale,
                        int *correct) {
    XentJob j = {.logits = logits, .labels = labels, .dlogits = dlogits, .n = n, .k = k,
                 .bs = (n + XENT_BLOCKS - 1) / XENT_BLOCKS, .f = scale / (float)n};
    if (j.bs < 1) j.bs = 1;
    const int nblk = (n + j.bs - 1) / j.bs;
    kern_parallel_for((size_t)nblk, (size_t)(8192 / ((size_t)j.bs * k + 1)) + 1, 1, xent_r, &j);
    double loss = 0;   // sum over the minibatch in double: n terms of very different size
    int hits = 0;
    for (int b = 0; b < nblk; b++) {
        loss += j.loss[b];
        hits += j.hits[b];
    }
    if (correct) *correct = hits;
    return (float)(loss / n);
}
