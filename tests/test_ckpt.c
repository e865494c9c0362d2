/* test_ckpt.c: checkpoint files. Round trips of every dtype the runtime uses, checked
 * bitwise and against an independent parse of the header (cJSON) and of the data section
 * (raw bytes, pd_crc32); crafted bad files, each rejected with the expected message;
 * atomic writes (no temporary left behind, failures leave the old file); ckpt_latest;
 * and tools/read_ckpt.py (pure Python) agreeing with C on every tensor. */
#include "testutil.h"

#include "ckpt.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers --------------------------------------------------------------------- */
static char g_dir[256];

static int setup_dir(void **state) {
    (void)state;
    strcpy(g_dir, "/tmp/pd_test_ckpt_XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    return 0;
}

static void rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
            chmod(p, 0755);
            rm_tree(p);
        } else {
            unlink(p);
        }
    }
    closedir(d);
    rmdir(dir);
}

static int teardown_dir(void **state) {
    (void)state;
    rm_tree(g_dir);
    return 0;
}

static const char *tpath(const char *name) {
    static char buf[16][1024];   /* a few results may be held at once */
    static int k;
    k = (k + 1) % 16;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

/* Names of the entries in g_dir (sorted, joined by '|'). */
static const char *dir_listing(const char *dir) {
    static char out[4096];
    char names[64][256];
    int n = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) && n < 64)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) snprintf(names[n++], 256, "%s", e->d_name);
    closedir(d);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(names[j], names[i]) < 0) {
                char t[256];
                memcpy(t, names[i], 256), memcpy(names[i], names[j], 256), memcpy(names[j], t, 256);
            }
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        if (i) strcat(out, "|");
        strcat(out, names[i]);
    }
    return out;
}

static unsigned char *slurp(const char *path, size_t *len) {
    char *buf;
    Err err = {0};
    assert_int_equal(pd_read_file(path, 1 << 28, &buf, len, &err), PD_OK);
    return (unsigned char *)buf;
}

static void spit(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (len) assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* Writes the raw safetensors bytes: 8-byte length, header (as given, unpadded), data. */
static void craft(const char *path, uint64_t hlen_field, const char *header, const void *data, size_t dlen) {
    size_t hl = strlen(header);
    unsigned char *b = malloc(8 + hl + dlen + 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hlen_field >> (8 * i));
    memcpy(b + 8, header, hl);
    if (dlen) memcpy(b + 8 + hl, data, dlen);
    spit(path, b, 8 + hl + dlen);
    free(b);
}

static void craft_h(const char *path, const char *header, size_t dlen) {
    unsigned char *d = calloc(dlen + 1, 1);
    for (size_t i = 0; i < dlen; i++) d[i] = (unsigned char)(i * 7 + 1);
    craft(path, strlen(header), header, d, dlen);
    free(d);
}

/* Asserts that opening (and verifying) path fails with code and a message containing
 * every substring given (NULL-terminated), and the path. */
static void expect_bad_code(const char *path, int code, const char *sub1, const char *sub2) {
    Ckpt *ck = (Ckpt *)1;
    Err err = {0};
    int rc = ckpt_open(path, &ck, &err);
    if (rc != code || !strstr(err.msg, path) || (sub1 && !strstr(err.msg, sub1)) || (sub2 && !strstr(err.msg, sub2)))
        fprintf(stderr, "file %s: rc %d (want %d), message: %s\n  wanted: \"%s\" \"%s\"\n", path, rc, code, err.msg,
                sub1 ? sub1 : "", sub2 ? sub2 : "");
    assert_int_equal(rc, code);
    assert_null(ck);
    assert_non_null(strstr(err.msg, path));
    if (sub1) assert_non_null(strstr(err.msg, sub1));
    if (sub2) assert_non_null(strstr(err.msg, sub2));
    Err err2 = {0};
    assert_int_equal(ckpt_verify(path, &err2), code);
    assert_string_equal(err.msg, err2.msg);
}
static void expect_bad(const char *path, const char *sub1, const char *sub2) {
    expect_bad_code(path, PD_EINVAL, sub1, sub2);
}

/* ---- a checkpoint with every dtype the runtime uses ------------------------------ */
typedef struct Fixture {
    float w1[6], w2[2 * 3 * 4], scalar, empty[1];
    double d[5];
    int64_t rng[4];
    int32_t counts[3];
    uint8_t bytes[13];
} Fixture;

static void fixture_fill(Fixture *f, uint64_t seed) {
    Rng r;
    rng_init(&r, seed, 99, 0);
    for (int i = 0; i < 6; i++) f->w1[i] = rng_normal(&r);
    for (int i = 0; i < 24; i++) f->w2[i] = rng_normal(&r) * 1e-3f;
    f->w2[5] = -0.0f;
    f->w2[6] = 1e-40f;   /* subnormal: bits must survive */
    f->scalar = 3.25f;
    for (int i = 0; i < 5; i++) f->d[i] = rng_uniform_f64(&r) * 1e300;
    for (int i = 0; i < 4; i++) f->rng[i] = (int64_t)rng_u64(&r);
    f->rng[0] = INT64_MIN;
    for (int i = 0; i < 3; i++) f->counts[i] = -7 * i;
    for (int i = 0; i < 13; i++) f->bytes[i] = (uint8_t)rng_u32(&r);
}

/* Adds the fixture's tensors (in an order that the writer's layout must change). */
static void fixture_add(CkptWriter *w, Fixture *f) {
    Err err = {0};
    int64_t s_bytes[1] = {13}, s_rng[1] = {4}, s_cnt[1] = {3}, s_d[2] = {5, 1}, s_empty[2] = {0, 7};
    assert_int_equal(ckpt_writer_add(w, "rng.state", CKPT_U8, 1, s_bytes, f->bytes, &err), PD_OK);
    assert_int_equal(ckpt_writer_add_f32(w, "layers.0.weight", shape2(2, 3), f->w1, &err), PD_OK);
    assert_int_equal(ckpt_writer_add(w, "rng.counters", CKPT_I64, 1, s_rng, f->rng, &err), PD_OK);
    assert_int_equal(ckpt_writer_add_f32(w, "layers.7.conv \"odd\" \\ name/é", shape3(2, 3, 4), f->w2, &err), PD_OK);
    assert_int_equal(ckpt_writer_add(w, "counts", CKPT_I32, 1, s_cnt, f->counts, &err), PD_OK);
    assert_int_equal(ckpt_writer_add(w, "scalar", CKPT_F32, 0, NULL, &f->scalar, &err), PD_OK);
    assert_int_equal(ckpt_writer_add(w, "adam.v", CKPT_F64, 2, s_d, f->d, &err), PD_OK);
    assert_int_equal(ckpt_writer_add(w, "empty", CKPT_F32, 2, s_empty, NULL, &err), PD_OK);
    assert_int_equal(ckpt_writer_meta(w, "step", "1234", &err), PD_OK);
    assert_int_equal(ckpt_writer_meta(w, "note", "line1\nline2 \"quoted\" \x01 ünïcode", &err), PD_OK);
    assert_int_equal(ckpt_writer_meta(w, "empty", "", &err), PD_OK);
}

static const char *write_fixture(const char *name, Fixture *f, uint64_t seed) {
    fixture_fill(f, seed);
    CkptWriter *w = ckpt_writer_new();
    fixture_add(w, f);
    Err err = {0};
    const char *p = tpath(name);
    int rc = ckpt_write(w, p, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, PD_OK);
    ckpt_writer_free(w);
    return p;
}

static void check_tensor(const Ckpt *ck, const char *name, CkptDtype dt, int ndim, const int64_t *shape,
                         const void *want, size_t nbytes) {
    const CkptTensor *t = ckpt_find(ck, name);
    assert_non_null(t);
    assert_string_equal(t->name, name);
    assert_int_equal(t->dtype, dt);
    assert_int_equal(t->ndim, ndim);
    for (int i = 0; i < ndim; i++) assert_int_equal(t->shape[i], shape[i]);
    assert_int_equal(t->nbytes, nbytes);
    assert_int_equal(t->end - t->begin, nbytes);
    assert_int_equal((uintptr_t)t->data % ckpt_dtype_size(dt), 0);
    if (nbytes) assert_memory_equal(t->data, want, nbytes);   /* bitwise */
}

static void test_roundtrip(void **state) {
    (void)state;
    Fixture f;
    const char *path = write_fixture("a.safetensors", &f, 1);
    assert_string_equal(dir_listing(g_dir), "a.safetensors");
    Ckpt *ck = NULL;
    Err err = {0};
    assert_int_equal(ckpt_open(path, &ck, &err), PD_OK);
    assert_string_equal(ckpt_path(ck), path);
    assert_int_equal(ckpt_count(ck), 8);
    int64_t s23[2] = {2, 3}, s234[3] = {2, 3, 4}, s13[1] = {13}, s4[1] = {4}, s3[1] = {3}, s51[2] = {5, 1},
            s07[2] = {0, 7};
    check_tensor(ck, "layers.0.weight", CKPT_F32, 2, s23, f.w1, sizeof f.w1);
    check_tensor(ck, "layers.7.conv \"odd\" \\ name/é", CKPT_F32, 3, s234, f.w2, sizeof f.w2);
    check_tensor(ck, "rng.state", CKPT_U8, 1, s13, f.bytes, 13);
    check_tensor(ck, "rng.counters", CKPT_I64, 1, s4, f.rng, sizeof f.rng);
    check_tensor(ck, "counts", CKPT_I32, 1, s3, f.counts, sizeof f.counts);
    check_tensor(ck, "scalar", CKPT_F32, 0, NULL, &f.scalar, 4);
    check_tensor(ck, "adam.v", CKPT_F64, 2, s51, f.d, sizeof f.d);
    check_tensor(ck, "empty", CKPT_F32, 2, s07, NULL, 0);
    assert_int_equal(ckpt_find(ck, "scalar")->numel, 1);
    assert_int_equal(ckpt_find(ck, "empty")->numel, 0);
    assert_null(ckpt_find(ck, "layers.0"));
    assert_null(ckpt_find(ck, "zzz"));
    assert_null(ckpt_find(ck, ""));
    /* file order: ascending, contiguous offsets; larger elements first */
    uint64_t pos = 0;
    size_t prev_es = 8;
    for (int i = 0; i < ckpt_count(ck); i++) {
        const CkptTensor *t = ckpt_tensor(ck, i);
        assert_int_equal(t->begin, pos);
        pos = t->end;
        assert_true(ckpt_dtype_size(t->dtype) <= prev_es || t->nbytes == 0);
        if (t->nbytes) prev_es = ckpt_dtype_size(t->dtype);
        assert_ptr_equal(ckpt_find(ck, t->name), t);
    }
    assert_string_equal(ckpt_meta(ck, "step"), "1234");
    assert_string_equal(ckpt_meta(ck, "note"), "line1\nline2 \"quoted\" \x01 ünïcode");
    assert_string_equal(ckpt_meta(ck, "empty"), "");
    assert_string_equal(ckpt_meta(ck, "pipedream.format"), "1");
    assert_null(ckpt_meta(ck, "nope"));
    assert_int_equal(ckpt_meta_count(ck), 5);
    const char *k, *v;
    ckpt_meta_at(ck, 0, &k, &v);
    assert_string_equal(k, "step");

    /* independent look at the bytes: header length, padding, cJSON parse, CRC */
    size_t len;
    unsigned char *raw = slurp(path, &len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | raw[i];
    assert_int_equal(n % 8, 0);
    assert_true(8 + n + pos == len);
    cJSON *h = cJSON_ParseWithLength((const char *)raw + 8, (size_t)n);
    assert_non_null(h);
    assert_int_equal(cJSON_GetArraySize(h), 9);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(h, "__metadata__");
    char crc[16];
    snprintf(crc, sizeof crc, "%08x", (unsigned)pd_crc32(raw + 8 + n, (size_t)pos));
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(meta, "pipedream.crc32")->valuestring, crc);
    assert_string_equal(ckpt_meta(ck, "pipedream.crc32"), crc);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(h, "layers.7.conv \"odd\" \\ name/é");
    assert_non_null(e);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(e, "dtype")->valuestring, "F32");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    uint64_t b = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble;
    assert_memory_equal(raw + 8 + n + b, f.w2, sizeof f.w2);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(e, "shape")), 3);
    cJSON_Delete(h);
    pd_free(raw);

    /* ckpt_copy: checked copies */
    float w1[6] = {0};
    assert_int_equal(ckpt_copy_f32(ck, "layers.0.weight", shape2(2, 3), w1, &err), PD_OK);
    assert_memory_equal(w1, f.w1, sizeof w1);
    assert_int_equal(ckpt_copy_f32(ck, "layers.0.weight", shape2(3, 2), w1, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "has shape [2, 3], expected [3, 2]"));
    assert_int_equal(ckpt_copy_f32(ck, "rng.counters", shape1(4), w1, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "is I64, expected F32"));
    assert_int_equal(ckpt_copy_f32(ck, "missing", shape1(4), w1, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "no tensor \"missing\""));
    assert_non_null(strstr(err.msg, path));
    int64_t rng[4];
    assert_int_equal(ckpt_copy(ck, "rng.counters", CKPT_I64, 1, s4, rng, &err), PD_OK);
    assert_memory_equal(rng, f.rng, sizeof rng);
    ckpt_close(ck);
    assert_int_equal(ckpt_verify(path, &err), PD_OK);
}

/* A checkpoint with no tensors and one with only metadata are valid; so is a foreign file
 * without pipedream metadata and with tensors in any header order. */
static void test_minimal_and_foreign(void **state) {
    (void)state;
    CkptWriter *w = ckpt_writer_new();
    Err err = {0};
    Ckpt *ck;
    assert_int_equal(ckpt_write(w, tpath("empty.safetensors"), &err), PD_OK);
    assert_int_equal(ckpt_open(tpath("empty.safetensors"), &ck, &err), PD_OK);
    assert_int_equal(ckpt_count(ck), 0);
    assert_string_equal(ckpt_meta(ck, "pipedream.crc32"), "00000000");
    ckpt_close(ck);
    ckpt_writer_free(w);

    craft_h(tpath("empty_obj"), "{}", 0);
    assert_int_equal(ckpt_open(tpath("empty_obj"), &ck, &err), PD_OK);
    assert_int_equal(ckpt_count(ck), 0);
    assert_int_equal(ckpt_meta_count(ck), 0);
    ckpt_close(ck);

    /* as the reference writer may emit it: whitespace, escapes, entries out of offset order */
    const char *h = " {\n \"b\" : {\"shape\": [2], \"dtype\": \"I16\", \"data_offsets\": [8, 12]},\n"
                    "  \"a\\u00e9\\ud83d\\ude00\": {\"data_offsets\": [0, 8], \"dtype\": \"BF16\", \"shape\": [2, 2]},"
                    " \"__metadata__\": {\"format\": \"pt\"}}\t\r\n  ";
    unsigned char data[12];
    for (int i = 0; i < 12; i++) data[i] = (unsigned char)(i + 100);
    craft(tpath("foreign"), strlen(h), h, data, 12);
    assert_int_equal(ckpt_open(tpath("foreign"), &ck, &err), PD_OK);
    assert_int_equal(ckpt_count(ck), 2);
    const CkptTensor *t = ckpt_find(ck, "a\xc3\xa9\xf0\x9f\x98\x80");
    assert_non_null(t);
    assert_int_equal(t->dtype, CKPT_BF16);
    assert_memory_equal(t->data, data, 8);
    assert_ptr_equal(ckpt_tensor(ck, 0), t);
    t = ckpt_find(ck, "b");
    assert_int_equal(t->dtype, CKPT_I16);
    assert_memory_equal(t->data, data + 8, 4);
    assert_string_equal(ckpt_meta(ck, "format"), "pt");
    ckpt_close(ck);
}

static void test_writer_errors(void **state) {
    (void)state;
    CkptWriter *w = ckpt_writer_new();
    Err err = {0};
    float x[4] = {0};
    int64_t s[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, neg[1] = {-1}, big[3] = {INT64_MAX, INT64_MAX, 2};
    assert_int_equal(ckpt_writer_add(w, "x", CKPT_F32, 1, s, x, &err), PD_OK);
    assert_int_equal(ckpt_writer_add(w, "x", CKPT_F32, 1, s, x, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "added twice"));
    assert_int_equal(ckpt_writer_add(w, "__metadata__", CKPT_F32, 1, s, x, &err), PD_EINVAL);
    assert_int_equal(ckpt_writer_add(w, "", CKPT_F32, 1, s, x, &err), PD_EINVAL);
    assert_int_equal(ckpt_writer_add(w, "bad\xff", CKPT_F32, 1, s, x, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "UTF-8"));
    assert_int_equal(ckpt_writer_add(w, "y", CKPT_F32, 9, s, x, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "9 dimensions"));
    assert_int_equal(ckpt_writer_add(w, "y", CKPT_F32, 1, neg, x, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "negative"));
    assert_int_equal(ckpt_writer_add(w, "y", CKPT_F32, 3, big, x, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "overflows"));
    assert_int_equal(ckpt_writer_add(w, "y", CKPT_F32, 1, s, NULL, &err), PD_EINVAL);
    assert_int_equal(ckpt_writer_meta(w, "pipedream.crc32", "0", &err), PD_EINVAL);
    assert_int_equal(ckpt_writer_meta(w, "pipedream.format", "2", &err), PD_EINVAL);
    assert_int_equal(ckpt_writer_meta(w, "k", "v", &err), PD_OK);
    assert_int_equal(ckpt_writer_meta(w, "k", "w", &err), PD_EINVAL);
    assert_int_equal(ckpt_writer_meta(w, "", "w", &err), PD_EINVAL);
    ckpt_writer_free(w);
    assert_int_equal(ckpt_dtype_parse("F32"), CKPT_F32);
    assert_int_equal(ckpt_dtype_parse("U8"), CKPT_U8);
    assert_int_equal(ckpt_dtype_parse("f32"), -1);
    assert_int_equal(ckpt_dtype_size(CKPT_I64), 8);
    assert_int_equal(ckpt_dtype_size(CKPT_BF16), 2);
}

/* ---- bad files ------------------------------------------------------------------- */
static void test_truncated(void **state) {
    (void)state;
    Fixture f;
    const char *path = write_fixture("good.safetensors", &f, 2);
    size_t len;
    unsigned char *raw = slurp(path, &len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | raw[i];
    const char *p = tpath("cut");
    size_t cuts[] = {0, 1, 7, 8, 9, 8 + n / 2, 8 + n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        spit(p, raw, cuts[i]);
        expect_bad(p, "truncated", NULL);
    }
    /* cut inside the data: the message gives the expected and the actual size */
    size_t dcuts[] = {8 + n, 8 + n + 1, len - 13, len - 1};
    for (size_t i = 0; i < sizeof dcuts / sizeof dcuts[0]; i++) {
        spit(p, raw, dcuts[i]);
        char want[128];
        snprintf(want, sizeof want, "need %zu bytes, the file has %zu", len, dcuts[i]);
        expect_bad(p, "truncated", want);
    }
    /* one byte too many */
    unsigned char *more = malloc(len + 1);
    memcpy(more, raw, len);
    more[len] = 0;
    spit(p, more, len + 1);
    expect_bad(p, "1 bytes after the last tensor", NULL);
    free(more);
    /* a flipped data bit: checksum */
    raw[len - 20] ^= 0x10;
    spit(p, raw, len);
    expect_bad(p, "checksum mismatch", NULL);
    raw[len - 20] ^= 0x10;
    spit(p, raw, len);
    Err err = {0};
    assert_int_equal(ckpt_verify(p, &err), PD_OK);
    pd_free(raw);
    expect_bad_code(tpath("does-not-exist"), PD_EIO, "cannot open", NULL);
    expect_bad(g_dir, "not a regular file", NULL);
}

typedef struct BadCase {
    const char *header;
    size_t dlen;
    const char *want1, *want2;
} BadCase;

static void test_bad_headers(void **state) {
    (void)state;
    const char *p = tpath("bad");
    /* header length fields that lie */
    craft(p, UINT64_MAX, "{}", NULL, 0);
    expect_bad(p, "larger than the limit", NULL);
    craft(p, (uint64_t)1 << 40, "{}", NULL, 0);
    expect_bad(p, "larger than the limit", NULL);
    craft(p, 1000, "{}", NULL, 0);
    expect_bad(p, "the header needs 1000 bytes, only 2 follow", "truncated");

    static const BadCase cases[] = {
        {"hello", 0, "expected '{'", "header byte 0"},
        {"", 0, "expected '{'", NULL},
        {"[1, 2]", 0, "must be a JSON object", NULL},
        {"\"str\"", 0, "must be a JSON object", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, "',' or '}' in the header", NULL},
        {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor \"a\": missing key \"dtype\"", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "missing key \"shape\"", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "missing key \"data_offsets\"", NULL},
        {"{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype \"F33\"", NULL},
        {"{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype is not a string", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", 4, "tensor \"a\": unknown key \"extra\"", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "duplicate key \"dtype\"", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "shape [2] of F32 needs more than the 4 bytes", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "shape [1] of F32 is 4 bytes but data_offsets [0, 8] span 8", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "a dimension is negative", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "is not an integer", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, "leading zero", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}", 4, "too large", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,4]}}", 4, "needs more than the 4 bytes", NULL},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4611686018427387904,4,0],\"data_offsets\":[0,4]}}", 4, "is 0 bytes but", NULL},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, "more than 8 dimensions", NULL},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, "two integers", NULL},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1, "two integers", NULL},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,0]}}", 1, "end before they begin", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12, "overlap another tensor", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
         12, "gap in the data section: bytes [4, 8)", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "gap in the data section: bytes [0, 4)", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "truncated", "need"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[18446744073709551614,18446744073709551615]}}", 4, "gap", NULL},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
         2, "duplicate tensor name \"a\"", NULL},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 2, "1 bytes after the last tensor", NULL},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[1,5]}}",
         5, "not a multiple of the F32 element size", NULL},
        {"{\"__metadata__\":{\"k\":1}}", 0, "metadata value of \"k\" is not a string", NULL},
        {"{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "duplicate metadata key \"k\"", NULL},
        {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate \"__metadata__\"", NULL},
        {"{\"__metadata__\":{\"pipedream.crc32\":\"xyz\"}}", 0, "is not 8 hex digits", NULL},
        {"{\"__metadata__\":{\"pipedream.crc32\":\"00000001\"}}", 0, "checksum mismatch", NULL},
        {"{\"__metadata__\":{\"pipedream.format\":\"2\"}}", 0, "is not supported", NULL},
        {"{} x", 0, "unexpected characters after the header object", NULL},
        {"{}{}", 0, "unexpected characters", NULL},
        {"{\"a\\ud800\":{}}", 0, "lone high surrogate", NULL},
        {"{\"a\\udc00\":{}}", 0, "lone low surrogate", NULL},
        {"{\"a\\u0000\":{}}", 0, "NUL character", NULL},
        {"{\"a\\q\":{}}", 0, "bad escape", NULL},
        {"{\"a\xff\":{}}", 0, "not valid UTF-8", NULL},
        {"{\"a\xc0\x80\":{}}", 0, "not valid UTF-8", NULL},
        {"{\"a\n\":{}}", 0, "control character", NULL},
        {"{\"abc", 0, "unterminated string", NULL},
        {"{\"a\":[]}", 0, "'{' opening a tensor entry", NULL},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},}", 1, "expected a tensor name", NULL},
        {"{1:2}", 0, "expected a tensor name", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        craft_h(p, cases[i].header, cases[i].dlen);
        expect_bad(p, cases[i].want1, cases[i].want2);
    }
}

/* Deep nesting, long strings and many entries must neither recurse deeply nor allocate
 * much more than the file. */
static void test_hostile_sizes(void **state) {
    (void)state;
    const char *p = tpath("deep");
    size_t n = 200000;
    char *h = malloc(n + 1);
    memset(h, '[', n);
    h[0] = '{', h[1] = '"', h[2] = 'a', h[3] = '"', h[4] = ':';
    h[n] = 0;
    craft_h(p, h, 0);
    expect_bad(p, "'{' opening a tensor entry", NULL);
    /* 20000 zero-size tensors: valid */
    size_t cap = 20000 * 64 + 16, k = 0;
    char *big = malloc(cap);
    k += (size_t)snprintf(big + k, cap - k, "{");
    for (int i = 0; i < 20000; i++)
        k += (size_t)snprintf(big + k, cap - k, "%s\"t%d\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}",
                              i ? "," : "", i);
    snprintf(big + k, cap - k, "}");
    craft_h(p, big, 0);
    Ckpt *ck;
    Err err = {0};
    assert_int_equal(ckpt_open(p, &ck, &err), PD_OK);
    assert_int_equal(ckpt_count(ck), 20000);
    assert_non_null(ckpt_find(ck, "t12345"));
    assert_null(ckpt_find(ck, "t20000"));
    ckpt_close(ck);
    free(big);
    free(h);
}

/* ---- atomicity ------------------------------------------------------------------- */
static void test_atomic(void **state) {
    (void)state;
    Fixture f, g;
    char path[1024];
    snprintf(path, sizeof path, "%s", write_fixture("ckpt.safetensors", &f, 3));
    /* overwrite with other contents: the new file replaces the old one, nothing else stays */
    write_fixture("ckpt.safetensors", &g, 4);
    assert_string_equal(dir_listing(g_dir), "ckpt.safetensors");
    Ckpt *ck;
    Err err = {0};
    assert_int_equal(ckpt_open(path, &ck, &err), PD_OK);
    assert_memory_equal(ckpt_find(ck, "layers.0.weight")->data, g.w1, sizeof g.w1);
    ckpt_close(ck);

    /* a directory that does not exist: error, nothing created */
    CkptWriter *w = ckpt_writer_new();
    fixture_add(w, &f);
    assert_int_equal(ckpt_write(w, tpath("nodir/x.safetensors"), &err), PD_EIO);
    assert_non_null(strstr(err.msg, "nodir/x.safetensors"));
    assert_string_equal(dir_listing(g_dir), "ckpt.safetensors");

    /* the rename fails (target is a non-empty directory): the temporary file is removed */
    assert_int_equal(mkdir(tpath("adir"), 0755), 0);
    spit(tpath("adir/keep"), "x", 1);
    assert_int_equal(ckpt_write(w, tpath("adir"), &err), PD_EIO);
    assert_non_null(strstr(err.msg, "rename"));
    assert_string_equal(dir_listing(g_dir), "adir|ckpt.safetensors");

    /* a write that fails half-way (file size limit, like a full disk): the old file stays */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 300;   /* the header fits, the data does not */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = ckpt_write(w, path, &err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, SIG_DFL);
    assert_int_equal(rc, PD_EIO);
    assert_non_null(strstr(err.msg, "failed"));
    assert_string_equal(dir_listing(g_dir), "adir|ckpt.safetensors");
    assert_int_equal(ckpt_open(path, &ck, &err), PD_OK);
    assert_memory_equal(ckpt_find(ck, "layers.0.weight")->data, g.w1, sizeof g.w1);
    ckpt_close(ck);

    /* a directory we may not write to (meaningless as root, who may write anywhere) */
    if (geteuid() != 0) {
        assert_int_equal(mkdir(tpath("ro"), 0555), 0);
        assert_int_equal(ckpt_write(w, tpath("ro/x.safetensors"), &err), PD_EIO);
        assert_string_equal(dir_listing(tpath("ro")), "");
    }
    ckpt_writer_free(w);
}

/* ---- ckpt_latest ----------------------------------------------------------------- */
static void test_latest(void **state) {
    (void)state;
    char out[1024], name[64];
    Err err = {0};
    assert_int_equal(ckpt_latest(g_dir, out, sizeof out, &err), PD_OK);
    assert_string_equal(out, "");   /* fresh run */

    assert_int_equal(ckpt_name(10, name, sizeof name, &err), PD_OK);
    assert_string_equal(name, "ckpt-0000000010.safetensors");
    assert_int_equal(ckpt_name(10, name, 10, &err), PD_EINVAL);
    uint64_t step = 0;
    assert_true(ckpt_name_parse("ckpt-0000000010.safetensors", &step));
    assert_int_equal(step, 10);
    assert_true(ckpt_name_parse("ckpt-12345678901.safetensors", &step));
    assert_int_equal(step, 12345678901ull);
    assert_false(ckpt_name_parse("ckpt-10.safetensors", &step));
    assert_false(ckpt_name_parse("ckpt-0000000010.safetensors.tmp.1.0", &step));
    assert_false(ckpt_name_parse("ckpt-00000000x0.safetensors", &step));
    assert_false(ckpt_name_parse("ckpt-99999999999999999999999.safetensors", &step));

    Fixture f;
    write_fixture("ckpt-0000000010.safetensors", &f, 5);
    write_fixture("ckpt-0000000020.safetensors", &f, 6);
    assert_int_equal(ckpt_latest(g_dir, out, sizeof out, &err), PD_OK);
    assert_string_equal(out, tpath("ckpt-0000000020.safetensors"));
    /* newer: a corrupt file, a truncated file, a temporary file, files of other names */
    const char *c30 = write_fixture("ckpt-0000000030.safetensors", &f, 7);
    size_t len;
    unsigned char *raw = slurp(c30, &len);
    raw[len - 1] ^= 1;
    spit(c30, raw, len);
    spit(tpath("ckpt-0000000040.safetensors"), raw, len / 2);
    raw[len - 1] ^= 1;
    spit(tpath("ckpt-0000000050.safetensors.tmp.123.0"), raw, len);   /* valid contents, temporary name */
    spit(tpath("ckpt-70.safetensors"), raw, len);
    spit(tpath("notes.txt"), "x", 1);
    assert_int_equal(mkdir(tpath("ckpt-0000000060.safetensors"), 0755), 0);   /* not a file */
    pd_free(raw);
    assert_int_equal(ckpt_latest(g_dir, out, sizeof out, &err), PD_OK);
    assert_string_equal(out, tpath("ckpt-0000000020.safetensors"));
    /* a longer step number sorts numerically */
    write_fixture("ckpt-00000000100.safetensors", &f, 8);
    assert_int_equal(ckpt_latest(g_dir, out, sizeof out, &err), PD_OK);
    assert_string_equal(out, tpath("ckpt-00000000100.safetensors"));
    assert_int_equal(ckpt_latest(g_dir, out, 8, &err), PD_EINVAL);
    assert_int_equal(ckpt_latest(tpath("nope"), out, sizeof out, &err), PD_EIO);
    assert_non_null(strstr(err.msg, "nope"));
}

/* ---- ckpt_prune: --keep-last ------------------------------------------------------ */
static void test_prune(void **state) {
    (void)state;
    Err err = {0};
    char name[64];
    for (int s = 10; s <= 50; s += 10) {
        assert_int_equal(ckpt_name((uint64_t)s, name, sizeof name, &err), PD_OK);
        spit(tpath(name), "x", 1);
    }
    spit(tpath("ckpt-0000000100.safetensors"), "damaged", 7);   /* newer than the run's newest */
    spit(tpath("ckpt-0000000020.safetensors.tmp.1.0"), "x", 1);
    spit(tpath("notes.txt"), "x", 1);
    /* the run's newest is 40: keep it and the one before; 50 and 100 are not the run's to judge */
    assert_int_equal(ckpt_prune(g_dir, 2, 40, &err), 2);
    assert_string_equal(dir_listing(g_dir), "ckpt-0000000020.safetensors.tmp.1.0|ckpt-0000000030.safetensors|"
                                            "ckpt-0000000040.safetensors|ckpt-0000000050.safetensors|"
                                            "ckpt-0000000100.safetensors|notes.txt");
    assert_int_equal(ckpt_prune(g_dir, 1, 50, &err), 2);
    assert_string_equal(dir_listing(g_dir), "ckpt-0000000020.safetensors.tmp.1.0|ckpt-0000000050.safetensors|"
                                            "ckpt-0000000100.safetensors|notes.txt");
    assert_int_equal(ckpt_prune(g_dir, 5, 50, &err), 0);
    assert_int_equal(ckpt_prune(tpath("nope"), 1, 50, &err), -1);
    assert_non_null(strstr(err.msg, "nope"));
}

/* ---- tools/read_ckpt.py agrees with C -------------------------------------------- */
static void test_python_reader(void **state) {
    (void)state;
    if (system("python3 -c 'import json, struct, zlib' >/dev/null 2>&1") != 0) tu_skip("python3 not found");
    Fixture f;
    fixture_fill(&f, 9);
    CkptWriter *w = ckpt_writer_new();
    Err err = {0};
    int64_t s13[1] = {13}, s4[1] = {4}, s3[1] = {3}, s51[2] = {5, 1};
    assert_int_equal(ckpt_writer_add_f32(w, "layers.0.weight", shape2(2, 3), f.w1, &err), PD_OK);
    assert_int_equal(ckpt_writer_add_f32(w, "layers.7.weight", shape3(2, 3, 4), f.w2, &err), PD_OK);
    assert_int_equal(ckpt_writer_add(w, "rng.state", CKPT_U8, 1, s13, f.bytes, &err), PD_OK);
    assert_int_equal(ckpt_writer_add(w, "rng.counters", CKPT_I64, 1, s4, f.rng, &err), PD_OK);
    assert_int_equal(ckpt_writer_add(w, "counts", CKPT_I32, 1, s3, f.counts, &err), PD_OK);
    assert_int_equal(ckpt_writer_add(w, "adam.v", CKPT_F64, 2, s51, f.d, &err), PD_OK);
    assert_int_equal(ckpt_writer_meta(w, "step", "77", &err), PD_OK);
    const char *path = tpath("py.safetensors");
    assert_int_equal(ckpt_write(w, path, &err), PD_OK);
    ckpt_writer_free(w);

    char cmd[2048];
    snprintf(cmd, sizeof cmd, "python3 %s %s", tu_src("tools/read_ckpt.py"), path);
    FILE *pp = popen(cmd, "r");
    assert_non_null(pp);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, pp);
    out[n] = 0;
    assert_int_equal(pclose(pp), 0);

    Ckpt *ck;
    assert_int_equal(ckpt_open(path, &ck, &err), PD_OK);
    for (int i = 0; i < ckpt_count(ck); i++) {
        const CkptTensor *t = ckpt_tensor(ck, i);
        char sum[64], shape[128], line[512];
        if (t->dtype == CKPT_F32 || t->dtype == CKPT_F64) {
            double s = 0;
            for (size_t j = 0; j < t->numel; j++)
                s += t->dtype == CKPT_F32 ? (double)((const float *)t->data)[j] : ((const double *)t->data)[j];
            snprintf(sum, sizeof sum, "%.17g", s);
        } else {
            uint64_t s = 0;
            for (size_t j = 0; j < t->numel; j++)
                s += t->dtype == CKPT_U8    ? ((const uint8_t *)t->data)[j]
                     : t->dtype == CKPT_I32 ? (uint64_t)(int64_t)((const int32_t *)t->data)[j]
                                            : (uint64_t)((const int64_t *)t->data)[j];
            snprintf(sum, sizeof sum, "%llu", (unsigned long long)s);
        }
        size_t k = (size_t)snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < t->ndim; d++) k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        snprintf(shape + k, sizeof shape - k, "]");
        snprintf(line, sizeof line, "%s %s %s %s %08x\n", t->name, ckpt_dtype_name(t->dtype), shape, sum,
                 (unsigned)pd_crc32(t->data, t->nbytes));
        if (!strstr(out, line)) fprintf(stderr, "python output:\n%s\nmissing line: %s", out, line);
        assert_non_null(strstr(out, line));
    }
    ckpt_close(ck);
    assert_non_null(strstr(out, "meta step=77\n"));
    assert_non_null(strstr(out, "meta pipedream.format=1\n"));
    assert_non_null(strstr(out, "crc32 ok\n"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_minimal_and_foreign, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_writer_errors, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_truncated, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_bad_headers, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_hostile_sizes, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_atomic, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_latest, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_prune, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_python_reader, setup_dir, teardown_dir),
    };
    pd_log_set_level(LOG_ERROR);   /* ckpt_latest warns about the bad files on purpose */
    return tu_run_group(tests, NULL, NULL);
}
