/* rng.c: Philox4x32-10 and the streams built on it. Every number is a pure function of
 * (seed, stream, substream, position), never of call order across workers. */
#include "core.h"

#include <math.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void rng_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

#if defined(__AVX512F__)
/* The high 32 bits of a * m in every 32-bit lane (m < 2^32 the same in all lanes). */
static inline __m512i mulhi_epu32(__m512i a, __m512i m) {
    __m512i even = _mm512_srli_epi64(_mm512_mul_epu32(a, m), 32);   // lanes 0, 2, ...: hi in the low half
    __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);    // lanes 1, 3, ...: hi in the high half
    return _mm512_mask_mov_epi32(even, 0xAAAA, odd);
}

/* Sixteen consecutive blocks from counter (lo, hi), block b in lane b; out as rng_blocks. */
static void philox16(const uint32_t key[2], uint64_t block, uint32_t c2, uint32_t c3, uint32_t *out) {
    const __m512i m0 = _mm512_set1_epi32((int)PHILOX_M0), m1 = _mm512_set1_epi32((int)PHILOX_M1);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i lo = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)block), lane);
    /* the carry into the high word where the low word wrapped within the sixteen */
    __mmask16 wrap = _mm512_cmplt_epu32_mask(lo, lane);
    __m512i hi = _mm512_mask_add_epi32(_mm512_set1_epi32((int)(uint32_t)(block >> 32)), wrap,
                                       _mm512_set1_epi32((int)(uint32_t)(block >> 32)), _mm512_set1_epi32(1));
    __m512i c0 = lo, c1 = hi, x2 = _mm512_set1_epi32((int)c2), x3 = _mm512_set1_epi32((int)c3);
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        __m512i hi0 = mulhi_epu32(c0, m0), lo0 = _mm512_mullo_epi32(c0, m0);
        __m512i hi1 = mulhi_epu32(x2, m1), lo1 = _mm512_mullo_epi32(x2, m1);
        c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32((int)k0));
        c1 = lo1;
        x2 = _mm512_xor_si512(_mm512_xor_si512(hi0, x3), _mm512_set1_epi32((int)k1));
        x3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    /* 4 x 16 -> 16 x 4: within each 128-bit lane j, u_q holds block 4 j + q's four words */
    __m512i t0 = _mm512_unpacklo_epi32(c0, c1), t1 = _mm512_unpacklo_epi32(x2, x3);
    __m512i t2 = _mm512_unpackhi_epi32(c0, c1), t3 = _mm512_unpackhi_epi32(x2, x3);
    __m512i u[4] = {_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1), _mm512_unpacklo_epi64(t2, t3),
                    _mm512_unpackhi_epi64(t2, t3)};
    uint32_t tmp[4][16];
    for (int q = 0; q < 4; q++) _mm512_storeu_si512((void *)tmp[q], u[q]);
    for (int j = 0; j < 4; j++)
        for (int q = 0; q < 4; q++) memcpy(out + 16 * j + 4 * q, &tmp[q][4 * j], 16);
}
#elif defined(__AVX2__)
/* Eight consecutive blocks from counter (lo, hi), block b in lane b; out as rng_blocks. The
 * products' two halves come from _mm256_mul_epu32 on the even and the odd lanes. */
static void philox8(const uint32_t key[2], uint64_t block, uint32_t c2, uint32_t c3, uint32_t *out) {
    const __m256i m0 = _mm256_set1_epi32((int)PHILOX_M0), m1 = _mm256_set1_epi32((int)PHILOX_M1);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i sign = _mm256_set1_epi32(INT32_MIN);
    __m256i lo = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)block), lane);
    /* the carry into the high word where the low word wrapped within the eight (lo < lane,
     * unsigned: compared as signed after flipping the sign bits) */
    __m256i wrap = _mm256_cmpgt_epi32(_mm256_xor_si256(lane, sign), _mm256_xor_si256(lo, sign));
    __m256i hi = _mm256_sub_epi32(_mm256_set1_epi32((int)(uint32_t)(block >> 32)), wrap);
    __m256i c0 = lo, c1 = hi, x2 = _mm256_set1_epi32((int)c2), x3 = _mm256_set1_epi32((int)c3);
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        __m256i e0 = _mm256_mul_epu32(c0, m0), o0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
        __m256i e1 = _mm256_mul_epu32(x2, m1), o1 = _mm256_mul_epu32(_mm256_srli_epi64(x2, 32), m1);
        __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(e0, 32), o0, 0xAA);
        __m256i lo0 = _mm256_blend_epi32(e0, _mm256_slli_epi64(o0, 32), 0xAA);
        __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(e1, 32), o1, 0xAA);
        __m256i lo1 = _mm256_blend_epi32(e1, _mm256_slli_epi64(o1, 32), 0xAA);
        c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32((int)k0));
        c1 = lo1;
        x2 = _mm256_xor_si256(_mm256_xor_si256(hi0, x3), _mm256_set1_epi32((int)k1));
        x3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    /* 4 x 8 -> 8 x 4: u_q holds block q in its low 128 bits and block q + 4 in its high */
    __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpacklo_epi32(x2, x3);
    __m256i t2 = _mm256_unpackhi_epi32(c0, c1), t3 = _mm256_unpackhi_epi32(x2, x3);
    __m256i u0 = _mm256_unpacklo_epi64(t0, t1), u1 = _mm256_unpackhi_epi64(t0, t1);
    __m256i u2 = _mm256_unpacklo_epi64(t2, t3), u3 = _mm256_unpackhi_epi64(t2, t3);
    _mm256_storeu_si256((__m256i *)(void *)(out + 0), _mm256_permute2x128_si256(u0, u1, 0x20));
    _mm256_storeu_si256((__m256i *)(void *)(out + 8), _mm256_permute2x128_si256(u2, u3, 0x20));
    _mm256_storeu_si256((__m256i *)(void *)(out + 16), _mm256_permute2x128_si256(u0, u1, 0x31));
    _mm256_storeu_si256((__m256i *)(void *)(out + 24), _mm256_permute2x128_si256(u2, u3, 0x31));
}
#endif

void rng_blocks(const Rng *r, uint64_t block, size_t nblk, uint32_t *out) {
    size_t b = 0;
#if defined(__AVX512F__)
    for (; b + 16 <= nblk; b += 16) philox16(r->key, block + b, r->ctr[2], r->ctr[3], out + 4 * b);
#elif defined(__AVX2__)
    for (; b + 8 <= nblk; b += 8) philox8(r->key, block + b, r->ctr[2], r->ctr[3], out + 4 * b);
#endif
    for (; b < nblk; b++) {
        uint64_t k = block + b;
        uint32_t ctr[4] = {(uint32_t)k, (uint32_t)(k >> 32), r->ctr[2], r->ctr[3]};
        rng_philox(ctr, r->key, out + 4 * b);
    }
}

/* splitmix64 finaliser: mixes (seed, stream) into one 64-bit Philox key. */
static uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void rng_init(Rng *r, uint64_t seed, uint64_t stream, uint64_t substream) {
    uint64_t k = mix64(seed ^ mix64(stream));
    r->key[0] = (uint32_t)k;
    r->key[1] = (uint32_t)(k >> 32);
    r->ctr[0] = r->ctr[1] = 0;
    r->ctr[2] = (uint32_t)substream;
    r->ctr[3] = (uint32_t)(substream >> 32);
    r->pos = 4;
}

uint32_t rng_u32(Rng *r) {
    if (r->pos == 4) {
        rng_philox(r->ctr, r->key, r->buf);
        if (++r->ctr[0] == 0) ++r->ctr[1];
        r->pos = 0;
    }
    return r->buf[r->pos++];
}

uint64_t rng_u64(Rng *r) {
    uint64_t hi = rng_u32(r);
    return (hi << 32) | rng_u32(r);
}

float rng_uniform(Rng *r) { return (float)(rng_u32(r) >> 8) * (1.0f / 16777216.0f); }

double rng_uniform_f64(Rng *r) { return (double)(rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

float rng_normal(Rng *r) {
    double u1 = rng_uniform_f64(r), u2 = rng_uniform_f64(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint32_t rng_below(Rng *r, uint32_t n) {
    PD_ASSERT(n > 0);
    /* Lemire's nearly-divisionless method with rejection: unbiased. */
    uint64_t m = (uint64_t)rng_u32(r) * n;
    uint32_t lo = (uint32_t)m;
    if (lo < n) {
        uint32_t t = (uint32_t)(-n) % n;
        while (lo < t) {
            m = (uint64_t)rng_u32(r) * n;
            lo = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

void rng_permutation(uint64_t seed, uint64_t stream, uint64_t substream, uint32_t *perm, size_t n) {
    PD_ASSERT(n <= UINT32_MAX);
    Rng r;
    rng_init(&r, seed, stream, substream);
    for (size_t i = 0; i < n; i++) perm[i] = (uint32_t)i;
    for (size_t i = n; i > 1; i--) {
        uint32_t j = rng_below(&r, (uint32_t)i);
        uint32_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}
