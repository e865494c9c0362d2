/* codec.c: the wire codecs of activations and gradients between pipeline stages (kernels.h,
 * KCODEC_*): int8 with a scale per row, int4 with a scale per group (nearest or stochastic
 * rounding), bf16 and fp32 as they are (bf16 is core's pd_bf16_pack), and the two ways of using
 * them across steps: deltas against a kept reference, and error feedback. It moves no bytes;
 * the runtime sends what it writes.
 *
 * Three implementations of the inner loops (absolute maximum, quantize, dequantize), scalar,
 * AVX2 and AVX-512, picked once at run time from the CPU (__builtin_cpu_supports) and compiled
 * with __attribute__((target)), so one build serves every CPU. They give the same bits: the
 * scale and its inverse are computed once per row in scalar code; each value then goes through
 * the same operations in the same order (one multiply, or one fused multiply-add, then the
 * clamp and the rounding), and the maximum is exact in any order. A SIMD loop hands its tail to
 * the scalar one. The fused roundings are written out (fmaf, _fmadd_ps); every other a * b + c
 * stays two roundings because the build is ISO C11 (CMAKE_C_EXTENSIONS OFF), where GCC fuses
 * none on its own (-ffp-contract=off).
 *
 * The stochastic rounding draws u in [0, 1) for value i of a message from a counter-based
 * generator: two rounds of a 32-bit integer hash of i keyed by (seed, message id). No state,
 * so a message's rounding is repeatable from its id alone, and the SIMD paths draw 8 or 16 at
 * once with the same bits. */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "kernels.h"

#define Q8 127.0f
#define Q4 7.0f

/* ---- the stochastic rounding's generator --------------------------------------------------- */
typedef struct Key {
    uint32_t k0, k1;
} Key;

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static Key key_of(uint64_t seed, uint64_t msg) {
    const uint64_t k = mix64(seed ^ mix64(msg + 0x9e3779b97f4a7c15ULL));
    return (Key){(uint32_t)k, (uint32_t)(k >> 32)};
}

static inline uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    return x ^ (x >> 16);
}

/* u in [0, 1), 24 random bits: exact as a float */
static inline float unif(const Key *k, uint32_t i) { return (float)(mix32(mix32(i ^ k->k0) + k->k1) >> 8) * 0x1p-24f; }

/* ---- scalar ------------------------------------------------------------------------------- */
/* The largest |x| among the finite values of x (n) in *m (0 if none); returns how many are not finite. */
static size_t absmax_scalar(const float *x, size_t n, float *m) {
    float mx = 0.0f;
    size_t nf = 0;
    for (size_t i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        if (a < INFINITY) mx = a > mx ? a : mx;
        else nf++;
    }
    *m = mx;
    return nf;
}

/* One value: t = x * inv (NaN: 0), clamped to [-qm, qm], rounded to nearest even. */
static inline int q_near(float x, float inv, float qm) {
    float t = x * inv;
    if (t != t) return 0;
    t = t < -qm ? -qm : t > qm ? qm : t;
    return (int)nearbyintf(t);
}

/* One value, stochastically: floor(x * inv + u) (one rounding; NaN: 0), clamped. */
static inline int q_stoch(float x, float inv, float u, float qm) {
    float t = fmaf(x, inv, u);
    if (t != t) return 0;
    t = floorf(t);
    return (int)(t < -qm ? -qm : t > qm ? qm : t);
}

static inline float dq(int q, float s, const float *r, size_t i) { return r ? fmaf((float)q, s, r[i]) : (float)q * s; }

static void q8_scalar(const float *x, size_t n, float inv, int8_t *q) {
    for (size_t i = 0; i < n; i++) q[i] = (int8_t)q_near(x[i], inv, Q8);
}

static void dq8_scalar(const int8_t *q, size_t n, float s, const float *r, float *y) {
    for (size_t i = 0; i < n; i++) y[i] = dq(q[i], s, r, i);
}

/* n values from x to the nibbles at out (x[0] the low nibble of out[0]); i0: x[0]'s index in
 * its message (the generator's counter); k NULL: nearest. */
static inline int q4_one(const float *x, size_t j, float inv, const Key *k, uint32_t i0) {
    return k ? q_stoch(x[j], inv, unif(k, i0 + (uint32_t)j), Q4) : q_near(x[j], inv, Q4);
}

static void q4_scalar(const float *x, size_t n, float inv, const Key *k, uint32_t i0, uint8_t *out) {
    size_t j = 0;
    for (; j + 2 <= n; j += 2)
        out[j / 2] = (uint8_t)((q4_one(x, j, inv, k, i0) & 15) | (q4_one(x, j + 1, inv, k, i0) & 15) << 4);
    if (j < n) out[j / 2] = (uint8_t)(q4_one(x, j, inv, k, i0) & 15);
}

static inline int nib(const uint8_t *in, size_t j) {
    const int v = (in[j / 2] >> (4 * (j & 1))) & 15;
    return v >= 8 ? v - 16 : v;
}

static void dq4_scalar(const uint8_t *in, size_t n, float s, const float *r, float *y) {
    for (size_t j = 0; j < n; j++) y[j] = dq(nib(in, j), s, r, j);
}

/* ---- AVX2 --------------------------------------------------------------------------------- */
#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static size_t absmax_avx2(const float *x, size_t n, float *m) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
    __m256 mx = _mm256_setzero_ps();
    size_t nf = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), absm);
        const __m256 fin = _mm256_cmp_ps(a, inf, _CMP_LT_OQ);
        mx = _mm256_max_ps(mx, _mm256_and_ps(a, fin));
        nf += 8 - (size_t)__builtin_popcount((unsigned)_mm256_movemask_ps(fin));
    }
    float lane[8], t;
    _mm256_storeu_ps(lane, mx);
    nf += absmax_scalar(x + i, n - i, &t);
    for (int l = 0; l < 8; l++) t = lane[l] > t ? lane[l] : t;
    *m = t;
    return nf;
}

/* t (NaN: 0) clamped to [-qm, qm] */
AVX2 static inline __m256 clamp8(__m256 t, float qm) {
    t = _mm256_and_ps(t, _mm256_cmp_ps(t, t, _CMP_ORD_Q));
    return _mm256_min_ps(_mm256_max_ps(t, _mm256_set1_ps(-qm)), _mm256_set1_ps(qm));
}

AVX2 static void q8_avx2(const float *x, size_t n, float inv, int8_t *q) {
    const __m256 vi = _mm256_set1_ps(inv);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 t = clamp8(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi), Q8);
        __m256i v = _mm256_cvtps_epi32(_mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        _mm_storel_epi64((__m128i *)(void *)(q + i), _mm_packs_epi16(w, w));
    }
    q8_scalar(x + i, n - i, inv, q + i);
}

AVX2 static inline __m256 dq8v(__m256 f, __m256 s, const float *r, size_t i) {
    return r ? _mm256_fmadd_ps(f, s, _mm256_loadu_ps(r + i)) : _mm256_mul_ps(f, s);
}

AVX2 static void dq8_avx2(const int8_t *q, size_t n, float s, const float *r, float *y) {
    const __m256 vs = _mm256_set1_ps(s);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(q + i)));
        _mm256_storeu_ps(y + i, dq8v(_mm256_cvtepi32_ps(v), vs, r, i));
    }
    dq8_scalar(q + i, n - i, s, r ? r + i : NULL, y + i);
}

AVX2 static inline __m256i mix32_8(__m256i x) {
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x7feb352dU));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x846ca68bU));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

/* u for the 8 values from counter c */
AVX2 static inline __m256 unif8(const Key *k, uint32_t c) {
    __m256i i = _mm256_add_epi32(_mm256_set1_epi32((int)c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i h = mix32_8(_mm256_add_epi32(mix32_8(_mm256_xor_si256(i, _mm256_set1_epi32((int)k->k0))),
                                         _mm256_set1_epi32((int)k->k1)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8)), _mm256_set1_ps(0x1p-24f));
}

/* 8 values in -7..7 (int32 lanes) as 4 bytes, lane 0 the low nibble */
AVX2 static inline uint32_t pack4_8(__m256i v) {
    v = _mm256_sllv_epi32(_mm256_and_si256(v, _mm256_set1_epi32(15)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    __m128i o = _mm_or_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    o = _mm_or_si128(o, _mm_shuffle_epi32(o, _MM_SHUFFLE(1, 0, 3, 2)));
    o = _mm_or_si128(o, _mm_shuffle_epi32(o, _MM_SHUFFLE(2, 3, 0, 1)));
    return (uint32_t)_mm_cvtsi128_si32(o);
}

AVX2 static void q4_avx2(const float *x, size_t n, float inv, const Key *k, uint32_t i0, uint8_t *out) {
    const __m256 vi = _mm256_set1_ps(inv);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 xv = _mm256_loadu_ps(x + i);
        __m256 t;
        if (k) {
            t = _mm256_fmadd_ps(xv, vi, unif8(k, i0 + (uint32_t)i));
            t = _mm256_and_ps(t, _mm256_cmp_ps(t, t, _CMP_ORD_Q));
            t = clamp8(_mm256_floor_ps(t), Q4);
        } else {
            t = _mm256_round_ps(clamp8(_mm256_mul_ps(xv, vi), Q4), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        }
        const uint32_t w = pack4_8(_mm256_cvtps_epi32(t));
        memcpy(out + i / 2, &w, 4);
    }
    q4_scalar(x + i, n - i, inv, k, i0 + (uint32_t)i, out + i / 2);
}

AVX2 static void dq4_avx2(const uint8_t *in, size_t n, float s, const float *r, float *y) {
    const __m256 vs = _mm256_set1_ps(s);
    const __m256i shl = _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint32_t w;
        memcpy(&w, in + i / 2, 4);
        __m256i v = _mm256_srai_epi32(_mm256_sllv_epi32(_mm256_set1_epi32((int)w), shl), 28);
        _mm256_storeu_ps(y + i, dq8v(_mm256_cvtepi32_ps(v), vs, r, i));
    }
    dq4_scalar(in + i / 2, n - i, s, r ? r + i : NULL, y + i);
}

/* ---- AVX-512 ------------------------------------------------------------------------------ */
#define AVX512 __attribute__((target("avx512f,avx2,fma")))

AVX512 static size_t absmax_avx512(const float *x, size_t n, float *m) {
    const __m512 inf = _mm512_set1_ps(INFINITY);
    __m512 mx = _mm512_setzero_ps();
    size_t nf = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + i));
        const __mmask16 fin = _mm512_cmp_ps_mask(a, inf, _CMP_LT_OQ);
        mx = _mm512_mask_max_ps(mx, fin, mx, a);
        nf += 16 - (size_t)__builtin_popcount((unsigned)fin);
    }
    float lane[16], t;
    _mm512_storeu_ps(lane, mx);
    nf += absmax_scalar(x + i, n - i, &t);
    for (int l = 0; l < 16; l++) t = lane[l] > t ? lane[l] : t;
    *m = t;
    return nf;
}

AVX512 static inline __m512 clamp16(__m512 t, float qm) {
    t = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(t, t, _CMP_ORD_Q), t);
    return _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-qm)), _mm512_set1_ps(qm));
}

AVX512 static void q8_avx512(const float *x, size_t n, float inv, int8_t *q) {
    const __m512 vi = _mm512_set1_ps(inv);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 t = clamp16(_mm512_mul_ps(_mm512_loadu_ps(x + i), vi), Q8);
        __m512i v = _mm512_cvtps_epi32(_mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm_storeu_si128((__m128i *)(void *)(q + i), _mm512_cvtepi32_epi8(v));
    }
    q8_scalar(x + i, n - i, inv, q + i);
}

AVX512 static inline __m512 dq16v(__m512 f, __m512 s, const float *r, size_t i) {
    return r ? _mm512_fmadd_ps(f, s, _mm512_loadu_ps(r + i)) : _mm512_mul_ps(f, s);
}

AVX512 static void dq8_avx512(const int8_t *q, size_t n, float s, const float *r, float *y) {
    const __m512 vs = _mm512_set1_ps(s);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(q + i)));
        _mm512_storeu_ps(y + i, dq16v(_mm512_cvtepi32_ps(v), vs, r, i));
    }
    dq8_scalar(q + i, n - i, s, r ? r + i : NULL, y + i);
}

AVX512 static inline __m512i mix32_16(__m512i x) {
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32((int)0x7feb352dU));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32((int)0x846ca68bU));
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

AVX512 static inline __m512 unif16(const Key *k, uint32_t c) {
    __m512i i = _mm512_add_epi32(_mm512_set1_epi32((int)c),
                                 _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    __m512i h = mix32_16(_mm512_add_epi32(mix32_16(_mm512_xor_si512(i, _mm512_set1_epi32((int)k->k0))),
                                          _mm512_set1_epi32((int)k->k1)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(h, 8)), _mm512_set1_ps(0x1p-24f));
}

/* 16 values in -7..7 as 8 bytes: each half as pack4_8 does */
AVX512 static inline uint64_t pack4_16(__m512i v) {
    const __m512i sh = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    v = _mm512_sllv_epi32(_mm512_and_si512(v, _mm512_set1_epi32(15)), sh);
    uint32_t w[2];
    for (int h = 0; h < 2; h++) {
        const __m256i q = h ? _mm512_extracti64x4_epi64(v, 1) : _mm512_castsi512_si256(v);
        __m128i o = _mm_or_si128(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
        o = _mm_or_si128(o, _mm_shuffle_epi32(o, _MM_SHUFFLE(1, 0, 3, 2)));
        o = _mm_or_si128(o, _mm_shuffle_epi32(o, _MM_SHUFFLE(2, 3, 0, 1)));
        w[h] = (uint32_t)_mm_cvtsi128_si32(o);
    }
    return (uint64_t)w[0] | (uint64_t)w[1] << 32;
}

AVX512 static void q4_avx512(const float *x, size_t n, float inv, const Key *k, uint32_t i0, uint8_t *out) {
    const __m512 vi = _mm512_set1_ps(inv);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 xv = _mm512_loadu_ps(x + i);
        __m512 t;
        if (k) {
            t = _mm512_fmadd_ps(xv, vi, unif16(k, i0 + (uint32_t)i));
            t = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(t, t, _CMP_ORD_Q), t);
            t = clamp16(_mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC), Q4);
        } else {
            t = _mm512_roundscale_ps(clamp16(_mm512_mul_ps(xv, vi), Q4), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        }
        const uint64_t w = pack4_16(_mm512_cvtps_epi32(t));
        memcpy(out + i / 2, &w, 8);
    }
    q4_scalar(x + i, n - i, inv, k, i0 + (uint32_t)i, out + i / 2);
}

AVX512 static void dq4_avx512(const uint8_t *in, size_t n, float s, const float *r, float *y) {
    const __m512 vs = _mm512_set1_ps(s);
    const __m512i shl = _mm512_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0, 28, 24, 20, 16, 12, 8, 4, 0);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        uint32_t w[2];
        memcpy(w, in + i / 2, 8);
        __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32((int)w[0])),
                                       _mm256_set1_epi32((int)w[1]), 1);
        v = _mm512_srai_epi32(_mm512_sllv_epi32(v, shl), 28);
        _mm512_storeu_ps(y + i, dq16v(_mm512_cvtepi32_ps(v), vs, r, i));
    }
    dq4_scalar(in + i / 2, n - i, s, r ? r + i : NULL, y + i);
}

/* ---- dispatch ----------------------------------------------------------------------------- */
typedef struct Ops {
    size_t (*absmax)(const float *x, size_t n, float *m);
    void (*q8)(const float *x, size_t n, float inv, int8_t *q);
    void (*dq8)(const int8_t *q, size_t n, float s, const float *r, float *y);
    void (*q4)(const float *x, size_t n, float inv, const Key *k, uint32_t i0, uint8_t *out);
    void (*dq4)(const uint8_t *in, size_t n, float s, const float *r, float *y);
} Ops;

static const Ops g_table[KCODEC_ISA_COUNT] = {
    [KCODEC_ISA_SCALAR] = {absmax_scalar, q8_scalar, dq8_scalar, q4_scalar, dq4_scalar},
    [KCODEC_ISA_AVX2] = {absmax_avx2, q8_avx2, dq8_avx2, q4_avx2, dq4_avx2},
    [KCODEC_ISA_AVX512] = {absmax_avx512, q8_avx512, dq8_avx512, q4_avx512, dq4_avx512},
};
static int g_best, g_isa;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void isa_probe(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        g_best = KCODEC_ISA_AVX512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) g_best = KCODEC_ISA_AVX2;
    else g_best = KCODEC_ISA_SCALAR;
    g_isa = g_best;
}

static const Ops *ops(void) {
    pthread_once(&g_once, isa_probe);
    return &g_table[g_isa];
}

int kern_codec_isa(void) {
    pthread_once(&g_once, isa_probe);
    return g_isa;
}

int kern_codec_isa_force(int isa) {
    pthread_once(&g_once, isa_probe);
    if (isa == KCODEC_ISA_AUTO) isa = g_best;
    if (isa < 0 || isa > g_best) return PD_EINVAL;   // each level's CPUs run the ones below it
    g_isa = isa;
    return PD_OK;
}

/* ---- messages ----------------------------------------------------------------------------- */
static void check(const KCodec *c) {
    PD_ASSERTF(c->codec >= 0 && c->codec < KCODEC_COUNT, "codec %d", c->codec);
    if (c->codec == KCODEC_INT8) PD_ASSERTF(c->block >= 1, "int8 row length %d", c->block);
    if (c->codec == KCODEC_INT4) PD_ASSERTF(c->block == 32 || c->block == 64, "int4 group %d", c->block);
}

static size_t blocks(size_t n, int block) { return (n + (size_t)block - 1) / (size_t)block; }

size_t kern_codec_bytes(const KCodec *c, size_t n) {
    check(c);
    switch (c->codec) {
    case KCODEC_FP32: return 4 * n;
    case KCODEC_BF16: return 2 * n;
    case KCODEC_INT8: return 4 * blocks(n, c->block) + n;
    default: return 4 * blocks(n, c->block) + (n + 1) / 2;
    }
}

static const char *const g_names[KCODEC_COUNT] = {"fp32", "bf16", "int8", "int4"};
_Static_assert(sizeof g_names / sizeof *g_names == KCODEC_COUNT, "a name per codec");

const char *kern_codec_name(int codec) { return codec >= 0 && codec < KCODEC_COUNT ? g_names[codec] : "?"; }

int kern_codec_parse(const char *name) {
    for (int i = 0; name && i < KCODEC_COUNT; i++)
        if (!strcmp(name, g_names[i])) return i;
    return -1;
}

/* The scale of a row whose finite values reach m, and its inverse; 0 and 0 below FLT_MIN. Near
 * FLT_MAX, m / qm rounded to nearest can make qm s overflow: then it is the float below. */
static void scale_of(float m, float qm, float *s, float *inv) {
    *s = m / qm;
    if (!isfinite(qm * *s)) *s = nextafterf(*s, 0.0f);
    *inv = *s < FLT_MIN ? 0.0f : qm / m;
    if (*s < FLT_MIN) *s = 0.0f;
}

size_t kern_codec_encode(const KCodec *c, uint64_t msg, const float *x, size_t n, uint8_t *out) {
    check(c);
    const Ops *o = ops();
    float m, s, inv;
    size_t nf = 0;
    if (c->codec == KCODEC_FP32 || c->codec == KCODEC_BF16) {
        nf = o->absmax(x, n, &m);
        if (c->codec == KCODEC_FP32) memcpy(out, x, 4 * n);
        else {
            PD_ASSERTF((uintptr_t)out % 2 == 0, "bf16 message at an odd address");
            pd_bf16_pack(x, (uint16_t *)(void *)out, n);
        }
        return nf;
    }
    const size_t L = (size_t)c->block, nb = blocks(n, c->block);
    uint8_t *vals = out + 4 * nb;
    const int four = c->codec == KCODEC_INT4;
    Key key;
    if (four && c->stochastic) {
        PD_ASSERTF(n <= UINT32_MAX, "stochastic int4 message of %zu values", n);
        key = key_of(c->seed, msg);
    }
    for (size_t b = 0; b < nb; b++) {
        const size_t i0 = b * L, len = n - i0 < L ? n - i0 : L;
        nf += o->absmax(x + i0, len, &m);
        scale_of(m, four ? Q4 : Q8, &s, &inv);
        memcpy(out + 4 * b, &s, 4);
        if (four) o->q4(x + i0, len, inv, c->stochastic ? &key : NULL, (uint32_t)i0, vals + i0 / 2);
        else o->q8(x + i0, len, inv, (int8_t *)(void *)(vals + i0));
    }
    return nf;
}

/* y = decode(in) (r NULL) or r + decode(in), one rounding (r may be y) */
static void decode_onto(const KCodec *c, const uint8_t *in, size_t n, const float *r, float *y) {
    check(c);
    const Ops *o = ops();
    if (c->codec == KCODEC_FP32 || c->codec == KCODEC_BF16) {
        PD_ASSERTF(!r, "a delta of %s", kern_codec_name(c->codec));
        if (c->codec == KCODEC_FP32) memcpy(y, in, 4 * n);
        else {
            PD_ASSERTF((uintptr_t)in % 2 == 0, "bf16 message at an odd address");
            pd_bf16_unpack((const uint16_t *)(const void *)in, y, n);
        }
        return;
    }
    const size_t L = (size_t)c->block, nb = blocks(n, c->block);
    const uint8_t *vals = in + 4 * nb;
    for (size_t b = 0; b < nb; b++) {
        const size_t i0 = b * L, len = n - i0 < L ? n - i0 : L;
        float s;
        memcpy(&s, in + 4 * b, 4);
        if (c->codec == KCODEC_INT4) o->dq4(vals + i0 / 2, len, s, r ? r + i0 : NULL, y + i0);
        else o->dq8((const int8_t *)(const void *)(vals + i0), len, s, r ? r + i0 : NULL, y + i0);
    }
}

void kern_codec_decode(const KCodec *c, const uint8_t *in, size_t n, float *y) { decode_onto(c, in, n, NULL, y); }

/* ---- deltas and error feedback ------------------------------------------------------------ */
static void check_delta(const KCodec *c) {
    PD_ASSERTF(c->codec == KCODEC_INT8 || c->codec == KCODEC_INT4, "a delta encoded as %s", kern_codec_name(c->codec));
}

static void check_ref(const KCodec *ref) {
    PD_ASSERTF(ref->codec != KCODEC_INT4, "a reference kept as int4");
}

size_t kern_codec_delta_encode(const KCodec *c, uint64_t msg, const float *x, const float *r, size_t n, uint8_t *out,
                               float *tmp) {
    check_delta(c);
    for (size_t i = 0; i < n; i++) tmp[i] = x[i] - r[i];
    return kern_codec_encode(c, msg, tmp, n, out);
}

void kern_codec_delta_decode(const KCodec *c, const uint8_t *in, const float *r, size_t n, float *y) {
    check_delta(c);
    decode_onto(c, in, n, r, y);
}

void kern_codec_ref_load(const KCodec *ref, const uint8_t *store, size_t n, float *r) {
    check_ref(ref);
    kern_codec_decode(ref, store, n, r);
}

size_t kern_codec_ref_store(const KCodec *ref, const float *y, size_t n, uint8_t *store) {
    check_ref(ref);
    return kern_codec_encode(ref, 0, y, n, store);
}

size_t kern_codec_delta_send(const KCodec *c, const KCodec *ref, uint64_t msg, const float *x, size_t n,
                             uint8_t *store, uint8_t *out, float *tmp) {
    float *r = tmp, *y = tmp + n;
    kern_codec_ref_load(ref, store, n, r);
    const size_t nf = kern_codec_delta_encode(c, msg, x, r, n, out, y);
    kern_codec_delta_decode(c, out, r, n, y);   // what the receiver reconstructs
    kern_codec_ref_store(ref, y, n, store);
    return nf;
}

size_t kern_codec_delta_recv(const KCodec *c, const KCodec *ref, const uint8_t *in, size_t n, uint8_t *store,
                             float *y) {
    kern_codec_ref_load(ref, store, n, y);
    kern_codec_delta_decode(c, in, y, n, y);
    return kern_codec_ref_store(ref, y, n, store);
}

size_t kern_codec_ef_encode(const KCodec *c, uint64_t msg, const float *x, float *e, size_t n, uint8_t *out,
                            float *tmp) {
    for (size_t i = 0; i < n; i++) tmp[i] = x[i] + e[i];
    const size_t nf = kern_codec_encode(c, msg, tmp, n, out);
    kern_codec_decode(c, out, n, e);
    for (size_t i = 0; i < n; i++) e[i] = tmp[i] - e[i];
    return nf;
}
