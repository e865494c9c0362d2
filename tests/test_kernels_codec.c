/* test_kernels_codec.c: the wire codecs (kern_codec_*, codec.c) against what their definition
 * in kernels.h promises, computed here independently: message sizes, each value within half a
 * scale of its original (a whole scale under stochastic rounding), the scale from the finite
 * values of its row, NaN and Inf counted and encoded as documented, all zeros, one huge value
 * among small ones, tails of every length up to two groups and one, stochastic rounding
 * repeatable from (seed, message id) and unbiased on average, deltas whose two ends keep bitwise
 * the same reference, error feedback's carried error, and the scalar, AVX2 and AVX-512 code
 * giving the same bytes and floats (each ISA skips where the CPU lacks it). */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "test_kernels_util.h"

/* An exact-size heap buffer, so that ASan sees a write one byte past a message. */
static uint8_t *msg_alloc(size_t bytes) {
    uint8_t *m = malloc(bytes ? bytes : 1);
    assert_non_null(m);
    memset(m, 0x5a, bytes);
    return m;
}

static float scale_at(const uint8_t *m, size_t b) {
    float s;
    memcpy(&s, m + 4 * b, 4);
    return s;
}

/* The largest |x| over x's finite values, written out here (the oracle of the scale). */
static float finite_max(const float *x, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i]) && fabsf(x[i]) > m) m = fabsf(x[i]);
    return m;
}

/* Checks one message of x (n) under c against the definition: each row's or group's scale is
 * maxabs / qmax of its finite values (0 below FLT_MIN), and each decoded finite value is within
 * `half` scales of x (0.5 nearest, 1 stochastic; plus float32 rounding); Inf decodes to
 * +-qmax s, NaN to 0. Returns the non-finite count encode gave. */
static size_t check_msg(const KCodec *c, uint64_t id, const float *x, size_t n) {
    const size_t bytes = kern_codec_bytes(c, n);
    uint8_t *m = msg_alloc(bytes);
    float *y = pd_alloc_f32(n ? n : 1);
    const size_t nf = kern_codec_encode(c, id, x, n, m);
    kern_codec_decode(c, m, n, y);
    const float qm = c->codec == KCODEC_INT4 ? 7.0f : 127.0f;
    const double half = c->stochastic ? 1.0 : 0.5;
    size_t want_nf = 0;
    for (size_t b0 = 0, b = 0; b0 < n; b0 += (size_t)c->block, b++) {
        const size_t len = n - b0 < (size_t)c->block ? n - b0 : (size_t)c->block;
        const float mx = finite_max(x + b0, len), s = scale_at(m, b);
        float want = mx / qm;
        if (!isfinite(qm * want)) want = nextafterf(want, 0.0f);   // qmax s stays finite
        if (mx / qm < FLT_MIN) assert_true(s == 0.0f);
        else assert_true(s == want);
        for (size_t i = b0; i < b0 + len; i++) {
            if (isnan(x[i])) {
                want_nf++;
                assert_true(y[i] == 0.0f);
            } else if (isinf(x[i])) {
                want_nf++;
                assert_true(y[i] == (x[i] > 0 ? qm : -qm) * s && isfinite(y[i]));
            } else {
                const double err = fabs((double)x[i] - y[i]), tol = half * s * (1 + 1e-5) + 1e-6 * fabs(x[i]) +
                                                                  (s == 0 ? 127.0 * FLT_MIN : 0);
                if (!(err <= tol))
                    fail_msg("%s block %d value %zu of %zu: x %.9g decoded %.9g, |err| %.3g > %.3g (scale %.3g)",
                             kern_codec_name(c->codec), c->block, i, n, x[i], y[i], err, tol, s);
            }
        }
    }
    assert_int_equal(nf, want_nf);
    free(m);
    pd_free(y);
    return nf;
}

static void test_codec_sizes(void **state) {
    (void)state;
    KCodec f = {KCODEC_FP32, 0, 0, 0}, h = {KCODEC_BF16, 0, 0, 0}, i8 = {KCODEC_INT8, 4, 0, 0},
           i4 = {KCODEC_INT4, 32, 0, 0};
    assert_int_equal(kern_codec_bytes(&f, 10), 40);
    assert_int_equal(kern_codec_bytes(&h, 10), 20);
    assert_int_equal(kern_codec_bytes(&i8, 10), 3 * 4 + 10);   // rows of 4, 4, 2
    assert_int_equal(kern_codec_bytes(&i8, 0), 0);
    assert_int_equal(kern_codec_bytes(&i4, 65), 3 * 4 + 33);   // groups of 32, 32, 1
    assert_int_equal(kern_codec_bytes(&i4, 64), 2 * 4 + 32);
    assert_int_equal(kern_codec_bytes(&i4, 0), 0);
    i4.block = 64;
    assert_int_equal(kern_codec_bytes(&i4, 65), 2 * 4 + 33);
    for (int k = 0; k < KCODEC_COUNT; k++) assert_int_equal(kern_codec_parse(kern_codec_name(k)), k);
    assert_int_equal(kern_codec_parse("int2"), -1);
    assert_int_equal(kern_codec_parse(NULL), -1);
}

/* Random messages, rows and groups of several lengths with a shorter last one. */
static void test_codec_roundtrip(void **state) {
    (void)state;
    static const int rows[] = {1, 7, 64, 100};
    for (size_t r = 0; r < sizeof rows / sizeof *rows; r++) {
        float *x = tk_rand(1000, 10 + r, -3, 3);
        const KCodec c = {KCODEC_INT8, rows[r], 0, 0};
        assert_int_equal(check_msg(&c, 0, x, 1000), 0);
        pd_free(x);
    }
    for (int g = 32; g <= 64; g += 32)
        for (int st = 0; st < 2; st++) {
            float *x = tk_rand(1001, 20 + g + st, -2, 5);
            const KCodec c = {KCODEC_INT4, g, st, 7};
            assert_int_equal(check_msg(&c, 3, x, 1001), 0);
            pd_free(x);
        }
    /* fp32 is the floats; bf16 is core's rounding */
    float *x = tk_rand(33, 30, -1, 1), *y = pd_alloc_f32(33);
    uint16_t *want = pd_alloc(66);
    const KCodec f = {KCODEC_FP32, 0, 0, 0}, h = {KCODEC_BF16, 0, 0, 0};
    uint8_t *m = pd_alloc(4 * 33);
    assert_int_equal(kern_codec_encode(&f, 0, x, 33, m), 0);
    kern_codec_decode(&f, m, 33, y);
    assert_memory_equal(x, y, 33 * sizeof(float));
    assert_int_equal(kern_codec_encode(&h, 0, x, 33, m), 0);
    pd_bf16_pack(x, want, 33);
    assert_memory_equal(m, want, 66);
    kern_codec_decode(&h, m, 33, y);
    for (int i = 0; i < 33; i++) assert_true(fabsf(y[i] - x[i]) <= fabsf(x[i]) * 0x1p-8f);
    pd_free(x);
    pd_free(y);
    pd_free(want);
    pd_free(m);
}

/* NaN and +-Inf among finite values: counted, the scale from the finite ones (the row keeps
 * its precision), Inf saturated, NaN 0; a row of them alone, and all zeros, encode as zeros. */
static void test_codec_nonfinite(void **state) {
    (void)state;
    float x[40];
    tk_fill(x, 40, 40, -1, 1);
    x[3] = NAN;
    x[17] = INFINITY;
    x[30] = -INFINITY;
    const KCodec cs[] = {{KCODEC_INT8, 40, 0, 0}, {KCODEC_INT8, 16, 0, 0}, {KCODEC_INT4, 32, 0, 0},
                         {KCODEC_INT4, 32, 1, 5}};
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) assert_int_equal(check_msg(&cs[k], 1, x, 40), 3);
    const KCodec f = {KCODEC_FP32, 0, 0, 0}, h = {KCODEC_BF16, 0, 0, 0};
    uint8_t m[160];
    assert_int_equal(kern_codec_encode(&f, 0, x, 40, m), 3);
    assert_int_equal(kern_codec_encode(&h, 0, x, 40, m), 3);
    /* nothing finite, and nothing at all */
    float bad[5] = {NAN, INFINITY, -INFINITY, NAN, INFINITY}, zero[70] = {0}, y[70];
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) {
        assert_int_equal(check_msg(&cs[k], 2, bad, 5), 5);
        assert_int_equal(check_msg(&cs[k], 2, zero, 70), 0);
        uint8_t *z = msg_alloc(kern_codec_bytes(&cs[k], 70));
        kern_codec_encode(&cs[k], 2, zero, 70, z);
        kern_codec_decode(&cs[k], z, 70, y);
        for (int i = 0; i < 70; i++) assert_true(y[i] == 0.0f);
        free(z);
    }
    /* a row whose scale would be subnormal is zeros with scale 0 */
    float tiny[8] = {1e-39f, -2e-39f, 0, 3e-40f, 0, 0, 0, 1e-45f};
    assert_int_equal(check_msg(&cs[0], 0, tiny, 8), 0);
}

/* One huge value among small ones: its row's scale follows it (the small values there round to
 * 0, within the bound), while the next row keeps its own fine scale. */
static void test_codec_huge(void **state) {
    (void)state;
    float *x = tk_rand(128, 50, -1e-3f, 1e-3f);
    x[5] = 3e30f;
    const KCodec c8 = {KCODEC_INT8, 64, 0, 0}, c4 = {KCODEC_INT4, 64, 0, 0};
    check_msg(&c8, 0, x, 128);
    check_msg(&c4, 0, x, 128);
    uint8_t *m = msg_alloc(kern_codec_bytes(&c8, 128));
    float *y = pd_alloc_f32(128);
    kern_codec_encode(&c8, 0, x, 128, m);
    kern_codec_decode(&c8, m, 128, y);
    assert_true(y[5] == 3e30f);   // 127 * (3e30 / 127) rounds back
    for (int i = 64; i < 128; i++) assert_true(fabsf(y[i] - x[i]) <= 1e-3f / 254 * 1.001f);
    x[5] = FLT_MAX;   // the largest finite value: no overflow in the scale or its inverse
    check_msg(&c8, 0, x, 128);
    check_msg(&c4, 0, x, 128);
    free(m);
    pd_free(x);
    pd_free(y);
}

/* Every length 0 .. 2G + 1 (the SIMD loops' tails, odd nibble counts, a last group of one),
 * each codec and rounding. */
static void test_codec_tails(void **state) {
    (void)state;
    for (int g = 32; g <= 64; g += 32)
        for (size_t n = 0; n <= (size_t)(2 * g + 1); n++) {
            float *x = tk_rand(n, 60 + n, -4, 4);
            const KCodec cs[] = {{KCODEC_INT8, g, 0, 0}, {KCODEC_INT8, 5, 0, 0}, {KCODEC_INT4, g, 0, 0},
                                 {KCODEC_INT4, g, 1, 11}};
            for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) check_msg(&cs[k], n, x, n);
            pd_free(x);
        }
}

/* Stochastic rounding: the same (seed, message id) gives the same bytes, another id or seed
 * other bytes; nearest ignores both. Unbiased: over many messages the mean of each decoded
 * value is its x (to a few standard errors), while nearest keeps its rounding error. */
static void test_codec_stochastic(void **state) {
    (void)state;
    enum { N = 64, T = 4000 };
    float x[N];
    tk_fill(x, N, 70, -6.9f, 6.9f);
    x[0] = 7.0f;   // scale 1: x / s is x
    KCodec c = {KCODEC_INT4, 64, 1, 42};
    const size_t bytes = kern_codec_bytes(&c, N);
    uint8_t a[64], b[64];
    kern_codec_encode(&c, 9, x, N, a);
    kern_codec_encode(&c, 9, x, N, b);
    assert_memory_equal(a, b, bytes);
    kern_codec_encode(&c, 10, x, N, b);
    assert_memory_not_equal(a, b, bytes);
    c.seed = 43;
    kern_codec_encode(&c, 9, x, N, b);
    assert_memory_not_equal(a, b, bytes);
    c.stochastic = 0;
    kern_codec_encode(&c, 9, x, N, a);
    kern_codec_encode(&c, 10, x, N, b);
    assert_memory_equal(a, b, bytes);
    c.stochastic = 1;
    double mean[N] = {0};
    float y[N];
    for (int t = 0; t < T; t++) {
        kern_codec_encode(&c, (uint64_t)t, x, N, a);
        kern_codec_decode(&c, a, N, y);
        for (int i = 0; i < N; i++) mean[i] += y[i] / T;
    }
    double worst = 0;
    for (int i = 0; i < N; i++) {
        const double d = fabs(mean[i] - x[i]);   // standard error <= 0.5 / sqrt(T) = 0.008
        worst = d > worst ? d : worst;
        assert_true(d < 0.04);
    }
    print_message("  stochastic int4: worst |mean - x| over %d messages %.4f (scale 1)\n", T, worst);
}

/* Deltas: a sample's activation drifting over epochs, sent and received with separate stores:
 * the stores stay bitwise equal, the receiver's y is within half a delta scale of x, and from
 * the second epoch on the error is below plain int8's. The first message (zeroed stores) is x
 * itself encoded. */
static void test_codec_delta(void **state) {
    (void)state;
    enum { N = 300, E = 6 };
    const KCodec refs[] = {{KCODEC_INT8, 100, 0, 0}, {KCODEC_BF16, 0, 0, 0}};
    const KCodec cs[] = {{KCODEC_INT8, 100, 0, 0}, {KCODEC_INT4, 32, 0, 0}, {KCODEC_INT4, 32, 1, 3}};
    for (size_t ri = 0; ri < 2; ri++)
        for (size_t ci = 0; ci < 3; ci++) {
            const KCodec *ref = &refs[ri], *c = &cs[ci];
            const size_t sb = kern_codec_bytes(ref, N), mb = kern_codec_bytes(c, N);
            uint8_t *s_send = calloc(1, sb), *s_recv = calloc(1, sb), *m = msg_alloc(mb), *plain = msg_alloc(mb);
            float *x = tk_rand(N, 80, -2, 2), *y = pd_alloc_f32(N), *tmp = pd_alloc_f32(2 * N), *dx = pd_alloc_f32(N);
            double err_plain = 0, err_delta = 0;
            for (int e = 0; e < E; e++) {
                if (e) {   // small drift
                    tk_fill(dx, N, 90 + e, -0.01f, 0.01f);
                    for (int i = 0; i < N; i++) x[i] += dx[i];
                }
                assert_int_equal(kern_codec_delta_send(c, ref, (uint64_t)e, x, N, s_send, m, tmp), 0);
                if (e == 0) {
                    kern_codec_encode(c, 0, x, N, plain);
                    assert_memory_equal(m, plain, mb);
                }
                assert_int_equal(kern_codec_delta_recv(c, ref, m, N, s_recv, y), 0);
                assert_memory_equal(s_send, s_recv, sb);
                assert_memory_equal(tmp + N, y, N * sizeof(float));   // the sender's own reconstruction
                for (int b = 0; b * c->block < N; b++) {
                    const float s = scale_at(m, (size_t)b);
                    for (int i = b * c->block; i < N && i < (b + 1) * c->block; i++)
                        assert_true(fabsf(x[i] - y[i]) <= (c->stochastic ? 1.0f : 0.5f) * s * 1.001f + 1e-6f);
                }
                if (e >= 1) {
                    const KCodec p8 = {KCODEC_INT8, 100, 0, 0};
                    uint8_t *pm = msg_alloc(kern_codec_bytes(&p8, N));
                    float *py = pd_alloc_f32(N);
                    kern_codec_encode(&p8, 0, x, N, pm);
                    kern_codec_decode(&p8, pm, N, py);
                    for (int i = 0; i < N; i++) {
                        err_plain += fabsf(x[i] - py[i]);
                        err_delta += fabsf(x[i] - y[i]);
                    }
                    free(pm);
                    pd_free(py);
                }
            }
            print_message("  delta %s against %s: mean error %.2e, plain int8 %.2e\n", kern_codec_name(c->codec),
                          kern_codec_name(ref->codec), err_delta / (N * (E - 1)), err_plain / (N * (E - 1)));
            assert_true(err_delta < err_plain);
            /* a non-finite value is counted at both ends */
            x[7] = NAN;
            assert_int_equal(kern_codec_delta_send(c, ref, 99, x, N, s_send, m, tmp), 1);
            free(s_send);
            free(s_recv);
            free(m);
            free(plain);
            float *all[] = {x, y, tmp, dx};
            for (size_t i = 0; i < 4; i++) pd_free(all[i]);
        }
}

/* Error feedback: e after a step is (x + e_before) - decode(message), exactly; and with a
 * gradient too small for its group's scale (it always rounds to 0 alone), the decoded messages
 * of T steps add up to T x within half a scale, because the error is carried. */
static void test_codec_error_feedback(void **state) {
    (void)state;
    enum { N = 32, T = 10 };
    const KCodec c = {KCODEC_INT4, 32, 0, 0};
    float x[N], e[N] = {0}, e0[N], v[N], y[N], sum[N] = {0}, tmp[N];
    for (int i = 0; i < N; i++) x[i] = 0.1f;
    x[0] = 7.0f;   // scale 1: 0.1 alone always rounds to 0
    uint8_t m[4 + 16];
    for (int t = 0; t < T; t++) {
        memcpy(e0, e, sizeof e);
        assert_int_equal(kern_codec_ef_encode(&c, (uint64_t)t, x, e, N, m, tmp), 0);
        kern_codec_decode(&c, m, N, y);
        for (int i = 0; i < N; i++) {
            v[i] = x[i] + e0[i];
            assert_true(e[i] == v[i] - y[i]);
            sum[i] += y[i];
        }
    }
    for (int i = 1; i < N; i++) assert_true(fabsf(sum[i] - T * 0.1f) <= 0.5f + 1e-5f);
    assert_true(sum[1] > 0.5f);   // it did send the small values
    float inf[N];
    memcpy(inf, x, sizeof x);
    inf[4] = INFINITY;
    assert_int_equal(kern_codec_ef_encode(&c, 0, inf, e, N, m, tmp), 1);
}

/* The scalar code against one ISA's, bitwise: every codec and rounding, lengths around the
 * vector widths, NaN and Inf sprinkled in, decode alone and onto a reference (deltas). */
static void same_as_scalar(int isa, const char *name) {
    if (kern_codec_isa_force(isa) != PD_OK) {
        tu_skip("this CPU has no %s", name);
        return;
    }
    static const size_t ns[] = {0, 1, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 100, 129, 1000};
    const KCodec cs[] = {{KCODEC_INT8, 1000, 0, 0}, {KCODEC_INT8, 9, 0, 0}, {KCODEC_INT8, 64, 0, 0},
                         {KCODEC_INT4, 32, 0, 0},   {KCODEC_INT4, 64, 0, 0}, {KCODEC_INT4, 32, 1, 77},
                         {KCODEC_INT4, 64, 1, 78},  {KCODEC_FP32, 0, 0, 0},  {KCODEC_BF16, 0, 0, 0}};
    int cases = 0;
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
        for (size_t ci = 0; ci < sizeof cs / sizeof *cs; ci++) {
            const size_t n = ns[ni], bytes = kern_codec_bytes(&cs[ci], n);
            float *x = tk_rand(n, 100 + ni, -50, 50), *r = tk_rand(n, 200 + ni, -1, 1);
            for (size_t i = 3; i < n; i += 37) x[i] = i % 3 == 0 ? NAN : i % 3 == 1 ? INFINITY : -INFINITY;
            uint8_t *m[2] = {msg_alloc(bytes), msg_alloc(bytes)};
            float *y[2] = {pd_alloc_f32(n ? n : 1), pd_alloc_f32(n ? n : 1)};
            float *d[2] = {pd_alloc_f32(n ? n : 1), pd_alloc_f32(n ? n : 1)};
            size_t nf[2];
            for (int v = 0; v < 2; v++) {
                assert_int_equal(kern_codec_isa_force(v ? isa : KCODEC_ISA_SCALAR), PD_OK);
                assert_int_equal(kern_codec_isa(), v ? isa : KCODEC_ISA_SCALAR);
                nf[v] = kern_codec_encode(&cs[ci], 5, x, n, m[v]);
                kern_codec_decode(&cs[ci], m[v], n, y[v]);
                if (cs[ci].codec >= KCODEC_INT8) kern_codec_delta_decode(&cs[ci], m[v], r, n, d[v]);
            }
            assert_int_equal(nf[0], nf[1]);
            assert_memory_equal(m[0], m[1], bytes);
            assert_memory_equal(y[0], y[1], n * sizeof(float));
            assert_memory_equal(d[0], d[1], n * sizeof(float));
            cases++;
            for (int v = 0; v < 2; v++) {
                free(m[v]);
                pd_free(y[v]);
                pd_free(d[v]);
            }
            pd_free(x);
            pd_free(r);
        }
    assert_int_equal(kern_codec_isa_force(KCODEC_ISA_AUTO), PD_OK);
    print_message("  %s = scalar: %d messages\n", name, cases);
}

static void test_codec_avx2(void **state) {
    (void)state;
    same_as_scalar(KCODEC_ISA_AVX2, "AVX2");
}

static void test_codec_avx512(void **state) {
    (void)state;
    same_as_scalar(KCODEC_ISA_AVX512, "AVX-512");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codec_sizes),      cmocka_unit_test(test_codec_roundtrip),
        cmocka_unit_test(test_codec_nonfinite),  cmocka_unit_test(test_codec_huge),
        cmocka_unit_test(test_codec_tails),      cmocka_unit_test(test_codec_stochastic),
        cmocka_unit_test(test_codec_delta),      cmocka_unit_test(test_codec_error_feedback),
        cmocka_unit_test(test_codec_avx2),       cmocka_unit_test(test_codec_avx512),
    };
    return tu_run_group(tests, NULL, NULL);
}
