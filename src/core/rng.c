/* rng.c: Philox4x32-10 and the streams built on it. Every number is a pure function of
 * (seed, stream, substream, position), never of call order across workers. */
#include "core.h"

#include <math.h>

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
