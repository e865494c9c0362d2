/* test_core.c: Philox known answers (Random123's test vectors), RNG determinism and
 * distribution, permutations, strict JSON reading, atomic writes, JSON values and files. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_philox_known_answers(void **state) {
    (void)state;
    static const struct {
        uint32_t ctr[4], key[2], want[4];
    } KAT[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
        {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
         {0xffffffffu, 0xffffffffu},
         {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
        {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
         {0xa4093822u, 0x299f31d0u},
         {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
    };
    for (size_t t = 0; t < sizeof KAT / sizeof KAT[0]; t++) {
        uint32_t out[4];
        rng_philox(KAT[t].ctr, KAT[t].key, out);
        for (int i = 0; i < 4; i++) assert_int_equal(out[i], KAT[t].want[i]);
    }
}

/* rng_blocks (sixteen blocks at a time with AVX-512, eight with AVX2) gives rng_u32's words bitwise:
 * from block 0, from an odd block, across a carry into the counter's high word, with tails. */
static void test_rng_blocks(void **state) {
    (void)state;
    Rng r;
    rng_init(&r, 9, 5, (uint64_t)3 << 40 | 17);
    static uint32_t got[4 * 100];
    const uint64_t starts[] = {0, 7, 0xfffffff9ull, 0x1fffffff0ull};
    const size_t lens[] = {100, 16, 33, 1};
    for (size_t s = 0; s < sizeof starts / sizeof *starts; s++)
        for (size_t l = 0; l < sizeof lens / sizeof *lens; l++) {
            rng_blocks(&r, starts[s], lens[l], got);
            for (size_t b = 0; b < lens[l]; b++) {
                uint64_t k = starts[s] + b;
                uint32_t ctr[4] = {(uint32_t)k, (uint32_t)(k >> 32), r.ctr[2], r.ctr[3]}, want[4];
                rng_philox(ctr, r.key, want);
                for (int w = 0; w < 4; w++) assert_int_equal(got[4 * b + w], want[w]);
            }
        }
    /* and the stream's own words from its start */
    rng_blocks(&r, 0, 100, got);
    for (int i = 0; i < 400; i++) assert_int_equal(got[i], rng_u32(&r));
}

static void test_rng_streams(void **state) {
    (void)state;
    Rng a, b, c;
    rng_init(&a, 42, 3, 7);
    rng_init(&b, 42, 3, 7);
    rng_init(&c, 42, 3, 8);
    int same_c = 0;
    for (int i = 0; i < 1000; i++) {
        uint32_t x = rng_u32(&a), y = rng_u32(&b), z = rng_u32(&c);
        assert_int_equal(x, y);
        same_c += x == z;
    }
    assert_true(same_c < 3);
    /* uniform: mean 0.5, all in [0,1); normal: mean 0, variance 1 */
    Rng r;
    rng_init(&r, 1, 2, 3);
    double s = 0, s2 = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        float u = rng_uniform(&r);
        assert_true(u >= 0.0f && u < 1.0f);
        s += u;
    }
    assert_true(fabs(s / n - 0.5) < 0.005);
    s = 0;
    for (int i = 0; i < n; i++) {
        double z = rng_normal(&r);
        s += z;
        s2 += z * z;
    }
    assert_true(fabs(s / n) < 0.01);
    assert_true(fabs(s2 / n - 1.0) < 0.02);
    /* rng_below: every value of a small range hit roughly equally */
    int hist[7] = {0};
    for (int i = 0; i < 70000; i++) hist[rng_below(&r, 7)]++;
    for (int k = 0; k < 7; k++) assert_true(abs(hist[k] - 10000) < 500);
}

static void test_permutation(void **state) {
    (void)state;
    enum { N = 1000 };
    uint32_t p[N], q[N];
    int seen[N] = {0};
    rng_permutation(5, RNG_STREAM_SHUFFLE, 0, p, N);
    rng_permutation(5, RNG_STREAM_SHUFFLE, 0, q, N);
    assert_memory_equal(p, q, sizeof p);
    int fixed = 0;
    for (int i = 0; i < N; i++) {
        assert_true(p[i] < N);
        assert_int_equal(seen[p[i]], 0);
        seen[p[i]] = 1;
        fixed += p[i] == (uint32_t)i;
    }
    assert_true(fixed < 10);
    rng_permutation(5, RNG_STREAM_SHUFFLE, 1, q, N);
    assert_true(memcmp(p, q, sizeof p) != 0);
}

static void test_jobj(void **state) {
    (void)state;
    cJSON *o = cJSON_Parse("{\"a\": 3, \"b\": 2.5, \"s\": \"x\", \"t\": true, \"typo\": 1}");
    JObj j;
    Err err = {0};
    int a = 0, t = 0;
    double b = 0;
    const char *s = NULL;
    assert_int_equal(jobj_init(&j, o, &err, "f.json: layer %d", 4), PD_OK);
    assert_int_equal(jobj_int(&j, "a", 1, 0, 10, &a, &err), PD_OK);
    assert_int_equal(a, 3);
    assert_int_equal(jobj_num(&j, "b", 1, 0, 10, &b, &err), PD_OK);
    assert_true(b == 2.5);
    assert_int_equal(jobj_str(&j, "s", 1, &s, &err), PD_OK);
    assert_string_equal(s, "x");
    assert_int_equal(jobj_bool(&j, "t", 1, &t, &err), PD_OK);
    assert_int_equal(t, 1);
    assert_int_equal(jobj_int(&j, "missing", 0, 0, 10, &a, &err), PD_OK);
    assert_int_equal(jobj_int(&j, "missing", 1, 0, 10, &a, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "f.json: layer 4"));
    assert_non_null(strstr(err.msg, "missing"));
    assert_int_equal(jobj_int(&j, "b", 1, 0, 10, &a, &err), PD_EINVAL);   /* 2.5 not an integer */
    assert_int_equal(jobj_int(&j, "a", 1, 5, 10, &a, &err), PD_EINVAL);   /* out of range */
    assert_int_equal(jobj_done(&j, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "\"typo\""));
    cJSON_Delete(o);
}

static void test_files(void **state) {
    (void)state;
    char path[] = "/tmp/pd_test_core_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    Err err = {0};
    assert_int_equal(pd_write_file_atomic(path, "hello", 5, &err), PD_OK);
    char *buf;
    size_t len;
    assert_int_equal(pd_read_file(path, 100, &buf, &len, &err), PD_OK);
    assert_int_equal(len, 5);
    assert_string_equal(buf, "hello");
    pd_free(buf);
    assert_int_equal(pd_read_file(path, 3, &buf, &len, &err), PD_EINVAL);
    unlink(path);
    assert_int_equal(pd_read_file(path, 100, &buf, &len, &err), PD_EIO);
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(pd_crc32("123456789", 9), 0xCBF43926u);
}

/* Names in dir, "|"-separated and sorted, into buf. */
static const char *listing(const char *dir, char *buf, size_t n) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls -A %s | tr '\\n' '|'", dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t k = fread(buf, 1, n - 1, p);
    buf[k] = 0;
    pclose(p);
    return buf;
}

/* pd_atomic_* in pieces; a failed write leaves the old file and no temporary file; the
 * JSON helpers: bit-exact numbers, integers, the file's newline, parse errors with the line. */
static void test_atomic_json(void **state) {
    (void)state;
    char dir[] = "/tmp/pd_test_core_XXXXXX", path[256], bad[256], names[256];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/f.json", dir);
    snprintf(bad, sizeof bad, "%s/nodir/f.json", dir);
    Err err = {0};
    PdAtomicFile f;
    assert_int_equal(pd_atomic_open(&f, path, &err), PD_OK);
    assert_int_equal(pd_atomic_write(&f, "{\"n\": 3, ", 9, &err), PD_OK);
    assert_int_equal(access(path, F_OK), -1);   /* nothing at path before the commit */
    assert_int_equal(pd_atomic_write(&f, "\"x\": 2.5}", 10, &err), PD_OK);
    assert_int_equal(pd_atomic_commit(&f, &err), PD_OK);
    assert_string_equal(listing(dir, names, sizeof names), "f.json|");
    assert_int_equal(pd_write_file_atomic(bad, "x", 1, &err), PD_EIO);
    assert_non_null(strstr(err.msg, bad));
    assert_string_equal(listing(dir, names, sizeof names), "f.json|");

    char *text;
    assert_int_equal(pd_read_file(path, 100, &text, NULL, &err), PD_OK);
    cJSON *o = pd_json_parse(text, path, &err);
    pd_free(text);
    assert_non_null(o);
    int n = 0;
    assert_int_equal(pd_json_int(cJSON_GetObjectItem(o, "n"), &n), PD_OK);
    assert_int_equal(n, 3);
    assert_int_equal(pd_json_int(cJSON_GetObjectItem(o, "x"), &n), PD_EINVAL);
    assert_int_equal(pd_json_int(NULL, &n), PD_EINVAL);
    cJSON_Delete(o);

    const double v = 0.1 + 0.2;   /* needs 17 digits */
    o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "v", pd_json_num(v));
    cJSON_AddItemToObject(o, "big", pd_json_num(2e9));
    cJSON_AddItemToObject(o, "nan", pd_json_num(NAN));
    cJSON_AddItemToObject(o, "inf", pd_json_num(-INFINITY));
    assert_int_equal(pd_json_save(o, path, &err), PD_OK);
    cJSON_Delete(o);
    size_t len;
    assert_int_equal(pd_read_file(path, 100, &text, &len, &err), PD_OK);
    assert_true(len > 2 && text[len - 1] == '\n' && text[len - 2] == '}');
    o = pd_json_parse(text, path, &err);
    pd_free(text);
    assert_non_null(o);
    assert_true(cJSON_GetObjectItem(o, "v")->valuedouble == v);
    assert_int_equal(pd_json_int(cJSON_GetObjectItem(o, "big"), &n), PD_EINVAL);   /* beyond 1e9 */
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "nan")));   /* valid JSON: no NaN or infinity in it */
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "inf")));
    cJSON_Delete(o);

    assert_null(pd_json_parse("{\n\"a\": 1,\n}\n", "t.json", &err));
    assert_int_equal(err.code, PD_EINVAL);
    assert_string_equal(err.msg, "t.json:3: not valid JSON");
    unlink(path);
    assert_int_equal(rmdir(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers), cmocka_unit_test(test_rng_blocks),
        cmocka_unit_test(test_rng_streams),
        cmocka_unit_test(test_permutation),          cmocka_unit_test(test_jobj),
        cmocka_unit_test(test_files),                cmocka_unit_test(test_atomic_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
