/* test_data.c: the data module. IDX and CIFAR-10 files are crafted by the test itself in
 * a temporary directory (gzip and raw), so each error path is checked against the exact
 * bytes that cause it; the order functions are checked against brute-force enumeration.
 * If the Debian Fashion-MNIST files are installed, they are loaded and their label
 * histogram checked (skipped otherwise). */
#include "testutil.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "data.h"

/* ---- temporary directories and crafted files -------------------------------------- */

typedef struct TmpDir {
    char path[256];
} TmpDir;

static void tmp_new(TmpDir *t) {
    snprintf(t->path, sizeof t->path, "/tmp/pd_test_data_XXXXXX");
    assert_non_null(mkdtemp(t->path));
}

static void tmp_remove(TmpDir *t) {
    DIR *d = opendir(t->path);
    assert_non_null(d);
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", t->path, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(t->path);
}

static void put_be32(unsigned char *b, uint32_t v) {
    b[0] = (unsigned char)(v >> 24);
    b[1] = (unsigned char)(v >> 16);
    b[2] = (unsigned char)(v >> 8);
    b[3] = (unsigned char)v;
}

/* Writes dir/name (gz = 0) or dir/name.gz (gz = 1): the magic, ndim dims, then len bytes of
 * data. */
static void write_idx(const TmpDir *t, const char *name, int gz, uint32_t magic, int ndim, const uint32_t *dims,
                      const unsigned char *data, size_t len) {
    unsigned char hdr[16];
    put_be32(hdr, magic);
    for (int i = 0; i < ndim; i++) put_be32(hdr + 4 * (1 + i), dims[i]);
    size_t hl = 4 * (size_t)(1 + ndim);
    char p[512];
    snprintf(p, sizeof p, "%s/%s%s", t->path, name, gz ? ".gz" : "");
    if (gz) {
        gzFile f = gzopen(p, "wb");
        assert_non_null(f);
        assert_int_equal(gzwrite(f, hdr, (unsigned)hl), (int)hl);
        if (len) assert_int_equal(gzwrite(f, data, (unsigned)len), (int)len);
        assert_int_equal(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(p, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(hdr, 1, hl, f), hl);
        if (len) assert_int_equal(fwrite(data, 1, len, f), len);
        assert_int_equal(fclose(f), 0);
    }
}

static void write_raw(const TmpDir *t, const char *name, const void *data, size_t len) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", t->path, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    if (len) assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* A small, valid MNIST-style set: N images of R x C; pixel bytes cover 0 and 255. */
enum { N = 5, R = 3, C = 4 };
static unsigned char g_pix[N * R * C], g_lab[N];

static void make_bytes(void) {
    for (int i = 0; i < N * R * C; i++) g_pix[i] = (unsigned char)((i * 37 + 11) % 256);
    g_pix[0] = 0;
    g_pix[7] = 255;
    for (int i = 0; i < N; i++) g_lab[i] = (unsigned char)((i * 3) % 10);
}

/* Writes the prefix ("train" / "t10k") image and label files with the given overrides. */
static void write_set(const TmpDir *t, const char *prefix, int gz, uint32_t img_magic, uint32_t n_img,
                      size_t pix_len, uint32_t n_lab, size_t lab_len) {
    char ni[64], nl[64];
    snprintf(ni, sizeof ni, "%s-images-idx3-ubyte", prefix);
    snprintf(nl, sizeof nl, "%s-labels-idx1-ubyte", prefix);
    uint32_t di[3] = {n_img, R, C}, dl[1] = {n_lab};
    write_idx(t, ni, gz, img_magic, 3, di, g_pix, pix_len);
    write_idx(t, nl, gz, 0x801, 1, dl, g_lab, lab_len);
}

static void expect_err(int rc, const Err *err, int code, const char *substr) {
    if (rc != code || !strstr(err->msg, substr))
        fprintf(stderr, "got rc %d \"%s\", want rc %d containing \"%s\"\n", rc, err->msg, code, substr);
    assert_int_equal(rc, code);
    assert_non_null(strstr(err->msg, substr));
}

static void check_small_set(const Dataset *d) {
    assert_int_equal(d->n, N);
    assert_int_equal(d->c, 1);
    assert_int_equal(d->h, R);
    assert_int_equal(d->w, C);
    assert_int_equal(d->n_classes, 10);
    assert_non_null(d->pix);   /* kept as bytes */
    assert_null(d->x);
    for (int i = 0; i < N * R * C; i++) assert_true(data_value(d, (size_t)i) == (float)g_pix[i] / 255.0f);
    assert_true(data_value(d, 0) == 0.0f);
    assert_true(data_value(d, 7) == 1.0f);
    for (int i = 0; i < N; i++) assert_int_equal(d->y[i], g_lab[i]);
    /* a minibatch in a given order: each element is its byte / 255 (the float x = b / 255.0f
     * held before bytes were kept), and after data_normalize (x - mean) * (1 / std) of that,
     * bit for bit */
    size_t numel = (size_t)R * C;
    uint32_t order[N];
    for (int i = 0; i < N; i++) order[i] = (uint32_t)(N - 1 - i);
    float *x = malloc((size_t)N * numel * sizeof(float));
    int32_t y[N];
    Dataset e = *d;   /* a shallow copy to normalise: its own table, the same bytes */
    data_normalize(&e, 0.3f, 0.7f);
    for (int pass = 0; pass < 2; pass++) {
        data_batch(pass ? &e : d, order, 0, N, x, y);
        for (int i = 0; i < N; i++) {
            assert_int_equal(y[i], g_lab[N - 1 - i]);
            for (size_t j = 0; j < numel; j++) {
                float v = (float)g_pix[(size_t)(N - 1 - i) * numel + j] / 255.0f;
                if (pass) v = (v - 0.3f) * (1.0f / 0.7f);
                assert_memory_equal(&x[(size_t)i * numel + j], &v, sizeof v);
            }
        }
    }
    free(x);
}

/* ---- IDX ------------------------------------------------------------------------- */

static void test_idx_good(void **state) {
    (void)state;
    make_bytes();
    for (int gz = 0; gz <= 1; gz++) {
        TmpDir t;
        tmp_new(&t);
        write_set(&t, "train", gz, 0x803, N, sizeof g_pix, N, sizeof g_lab);
        write_set(&t, "t10k", gz, 0x803, N, sizeof g_pix, N, sizeof g_lab);
        Dataset d;
        Err err = {0};
        assert_int_equal(data_load_idx(t.path, "train", &d, &err), PD_OK);
        check_small_set(&d);
        data_release(&d);
        assert_int_equal(data_load(gz ? "mnist" : "fashion-mnist", t.path, "test", &d, &err), PD_OK);
        check_small_set(&d);
        data_release(&d);
        tmp_remove(&t);
    }
}

static void test_idx_errors(void **state) {
    (void)state;
    make_bytes();
    Dataset d;
    Err err = {0};
    for (int gz = 0; gz <= 1; gz++) {
        TmpDir t;
        tmp_new(&t);
        /* missing files */
        expect_err(data_load_idx(t.path, "train", &d, &err), &err, PD_EIO, "train-images-idx3-ubyte.gz: cannot open");
        assert_non_null(strstr(err.msg, "nor "));
        assert_null(d.x);
        /* bad magic */
        write_set(&t, "train", gz, 0x804, N, sizeof g_pix, N, sizeof g_lab);
        expect_err(data_load_idx(t.path, "train", &d, &err), &err, PD_EINVAL,
                   "bad magic number 0x00000804, expected 0x00000803");
        assert_non_null(strstr(err.msg, "train-images-idx3-ubyte"));
        /* truncated image data: 3 whole images and a part */
        write_set(&t, "train", gz, 0x803, N, sizeof g_pix - 17, N, sizeof g_lab);
        expect_err(data_load_idx(t.path, "train", &d, &err), &err, PD_EINVAL,
                   "truncated data: expected 5 images (60 bytes), found 43 bytes (3 complete images)");
        /* truncated labels */
        write_set(&t, "train", gz, 0x803, N, sizeof g_pix, N, 2);
        expect_err(data_load_idx(t.path, "train", &d, &err), &err, PD_EINVAL, "expected 5 labels (5 bytes), found 2");
        assert_non_null(strstr(err.msg, "train-labels-idx1-ubyte"));
        /* trailing data: header says 4 images, 5 are there */
        write_set(&t, "train", gz, 0x803, 4, sizeof g_pix, 4, 4);
        expect_err(data_load_idx(t.path, "train", &d, &err), &err, PD_EINVAL, "trailing data after the 4 images");
        /* count mismatch */
        write_set(&t, "train", gz, 0x803, N, sizeof g_pix, N - 1, N - 1);
        expect_err(data_load_idx(t.path, "train", &d, &err), &err, PD_EINVAL, "declares 4 labels but");
        assert_non_null(strstr(err.msg, "declares 5 images"));
        /* label out of range */
        g_lab[3] = 10;
        write_set(&t, "train", gz, 0x803, N, sizeof g_pix, N, sizeof g_lab);
        expect_err(data_load_idx(t.path, "train", &d, &err), &err, PD_EINVAL, "label 10 at index 3 is out of range");
        make_bytes();
        /* zero images; absurd image sides; a count above the limit */
        write_set(&t, "train", gz, 0x803, 0, 0, 0, 0);
        expect_err(data_load_idx(t.path, "train", &d, &err), &err, PD_EINVAL, "declares 0 images, expected 1..");
        write_set(&t, "train", gz, 0x803, 0xFFFFFFFFu, sizeof g_pix, 0xFFFFFFFFu, sizeof g_lab);
        expect_err(data_load_idx(t.path, "train", &d, &err), &err, PD_EINVAL, "declares 4294967295 images");
        uint32_t dwide[3] = {N, 5000, 5000};
        write_idx(&t, "train-images-idx3-ubyte", gz, 0x803, 3, dwide, g_pix, sizeof g_pix);
        expect_err(data_load_idx(t.path, "train", &d, &err), &err, PD_EINVAL, "images of 5000 x 5000");
        /* truncated header */
        write_idx(&t, "train-images-idx3-ubyte", gz, 0x803, 1, dwide, NULL, 0);
        expect_err(data_load_idx(t.path, "train", &d, &err), &err, PD_EINVAL,
                   "truncated header: expected 16 bytes, found 8");
        /* unknown split */
        expect_err(data_load_idx(t.path, "valid", &d, &err), &err, PD_EINVAL, "unknown split \"valid\"");
        assert_null(d.x);
        tmp_remove(&t);
    }
}

/* A header that claims 10M images of 4096 x 4096 (6.7e14 floats) over a few bytes must
 * fail as truncated without allocating for the claim: under ASan with
 * allocator_may_return_null=0 an attempt aborts the test. */
static void test_idx_huge_claim(void **state) {
    (void)state;
    make_bytes();
    for (int gz = 0; gz <= 1; gz++) {
        TmpDir t;
        tmp_new(&t);
        uint32_t di[3] = {DATA_MAX_SAMPLES, 4096, 4096}, dl[1] = {DATA_MAX_SAMPLES};
        write_idx(&t, "train-images-idx3-ubyte", gz, 0x803, 3, di, g_pix, sizeof g_pix);
        write_idx(&t, "train-labels-idx1-ubyte", gz, 0x801, 1, dl, g_lab, sizeof g_lab);
        Dataset d;
        Err err = {0};
        expect_err(data_load_idx(t.path, "train", &d, &err), &err, PD_EINVAL,
                   "truncated data: expected 10000000 images (167772160000000 bytes), found 60 bytes");
        tmp_remove(&t);
    }
}

/* A gzip file cut short, and one whose compressed bytes are corrupt. */
static void test_idx_bad_gzip(void **state) {
    (void)state;
    TmpDir t;
    tmp_new(&t);
    enum { BIG = 20000 };
    unsigned char *pix = malloc(BIG * R * C);
    Rng r;
    rng_init(&r, 5, 9, 0);
    for (int i = 0; i < BIG * R * C; i++) pix[i] = (unsigned char)rng_below(&r, 256);   /* incompressible */
    uint32_t di[3] = {BIG, R, C};
    write_idx(&t, "train-images-idx3-ubyte", 1, 0x803, 3, di, pix, BIG * R * C);
    unsigned char lab[BIG];
    memset(lab, 1, sizeof lab);
    uint32_t dl[1] = {BIG};
    write_idx(&t, "train-labels-idx1-ubyte", 1, 0x801, 1, dl, lab, sizeof lab);
    char p[512];
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", t.path);
    char *buf;
    size_t len;
    Err err = {0};
    assert_int_equal(pd_read_file(p, 1u << 26, &buf, &len, &err), PD_OK);
    Dataset d;
    /* cut in half */
    write_raw(&t, "train-images-idx3-ubyte.gz", buf, len / 2);
    expect_err(data_load_idx(t.path, "train", &d, &err), &err, PD_EINVAL, "truncated data: expected 20000 images");
    /* corrupt the middle: random bytes are stored, not deflated, so the CRC catches it */
    for (size_t i = len / 2; i < len / 2 + 64; i++) buf[i] = (char)0xff;
    write_raw(&t, "train-images-idx3-ubyte.gz", buf, len);
    expect_err(data_load_idx(t.path, "train", &d, &err), &err, PD_EINVAL, "train-images-idx3-ubyte.gz: gzip error: ");
    assert_non_null(strstr(err.msg, "incorrect data check"));
    assert_null(strstr(err.msg + 1, t.path));   /* the path once, not twice */
    pd_free(buf);
    /* compressible data: corrupting the deflate stream itself is a gzip error too */
    for (int i = 0; i < BIG * R * C; i++) pix[i] = (unsigned char)(i % 7 == 0 ? i % 251 : 0);
    write_idx(&t, "train-images-idx3-ubyte", 1, 0x803, 3, di, pix, BIG * R * C);
    assert_int_equal(pd_read_file(p, 1u << 26, &buf, &len, &err), PD_OK);
    assert_true(len < BIG * R * C / 4);
    for (size_t i = len / 3; i < len / 3 + 16; i++) buf[i] = (char)(buf[i] ^ 0x5a);
    write_raw(&t, "train-images-idx3-ubyte.gz", buf, len);
    expect_err(data_load_idx(t.path, "train", &d, &err), &err, PD_EINVAL, "train-images-idx3-ubyte.gz: gzip error: ");
    pd_free(buf);
    free(pix);
    tmp_remove(&t);
}

/* ---- CIFAR-10 -------------------------------------------------------------------- */

enum { REC = 3073 };

/* Writes a CIFAR batch file of nrec records: record r of file f has label (f + r) % 10 and
 * pixel j = (f * 31 + r * 7 + j) % 256. */
static void write_cifar(const TmpDir *t, const char *name, int f, int nrec) {
    unsigned char *b = malloc((size_t)nrec * REC);
    for (int r = 0; r < nrec; r++) {
        b[(size_t)r * REC] = (unsigned char)((f + r) % 10);
        for (int j = 0; j < 3072; j++) b[(size_t)r * REC + 1 + j] = (unsigned char)((f * 31 + r * 7 + j) % 256);
    }
    write_raw(t, name, b, (size_t)nrec * REC);
    free(b);
}

static void test_cifar(void **state) {
    (void)state;
    TmpDir t;
    tmp_new(&t);
    const int recs[5] = {2, 3, 1, 1, 2};
    char name[64];
    for (int f = 0; f < 5; f++) {
        snprintf(name, sizeof name, "data_batch_%d.bin", f + 1);
        write_cifar(&t, name, f, recs[f]);
    }
    write_cifar(&t, "test_batch.bin", 7, 4);
    Dataset d;
    Err err = {0};
    assert_int_equal(data_load_cifar10(t.path, "train", &d, &err), PD_OK);
    assert_int_equal(d.n, 9);
    assert_int_equal(d.c, 3);
    assert_int_equal(d.h, 32);
    assert_int_equal(d.w, 32);
    assert_int_equal(d.n_classes, 10);
    size_t k = 0;
    for (int f = 0; f < 5; f++)
        for (int r = 0; r < recs[f]; r++, k++) {
            assert_int_equal(d.y[k], (f + r) % 10);
            for (int j = 0; j < 3072; j += 101)
                assert_true(fabs(d.x[k * 3072 + (size_t)j] - ((f * 31 + r * 7 + j) % 256) / 255.0) < 1e-7);
        }
    data_release(&d);
    assert_int_equal(data_load("cifar10", t.path, "test", &d, &err), PD_OK);
    assert_int_equal(d.n, 4);
    assert_int_equal(d.y[3], 0);
    data_release(&d);

    /* size not a multiple of the record */
    write_cifar(&t, "test_batch.bin", 7, 2);
    char p[512];
    snprintf(p, sizeof p, "%s/test_batch.bin", t.path);
    assert_int_equal(truncate(p, 2 * REC - 5), 0);
    expect_err(data_load_cifar10(t.path, "test", &d, &err), &err, PD_EINVAL,
               "size 6141 bytes is not a non-zero multiple of the 3073-byte record");
    assert_null(d.x);
    write_raw(&t, "test_batch.bin", "", 0);
    expect_err(data_load_cifar10(t.path, "test", &d, &err), &err, PD_EINVAL, "size 0 bytes");
    /* label out of range in record 1 */
    write_cifar(&t, "test_batch.bin", 9, 3);   /* labels 9, 10 % 10 = 0, 1 */
    FILE *fp = fopen(p, "r+b");
    assert_non_null(fp);
    fseek(fp, REC, SEEK_SET);
    fputc(10, fp);
    fclose(fp);
    expect_err(data_load_cifar10(t.path, "test", &d, &err), &err, PD_EINVAL,
               "test_batch.bin: record 1: label 10 is out of range");
    /* a missing training batch */
    snprintf(p, sizeof p, "%s/data_batch_3.bin", t.path);
    unlink(p);
    expect_err(data_load_cifar10(t.path, "train", &d, &err), &err, PD_EIO, "data_batch_3.bin: cannot open");
    expect_err(data_load_cifar10(t.path, "dev", &d, &err), &err, PD_EINVAL, "unknown split");
    expect_err(data_load("cifar10", NULL, "test", &d, &err), &err, PD_EINVAL, "no directory");
    expect_err(data_load("imagenet", NULL, "test", &d, &err), &err, PD_EINVAL, "unknown dataset kind");
    tmp_remove(&t);
}

/* ---- synthetic ------------------------------------------------------------------- */

static void test_synthetic(void **state) {
    (void)state;
    Dataset a, b, c, e;
    Err err = {0};
    assert_int_equal(data_synthetic(2000, 1, 8, 8, 10, 7, &a, &err), PD_OK);
    assert_int_equal(data_synthetic(2000, 1, 8, 8, 10, 7, &b, &err), PD_OK);
    assert_int_equal(data_synthetic(300, 1, 8, 8, 10, 7, &c, &err), PD_OK);
    assert_int_equal(data_synthetic(2000, 1, 8, 8, 10, 8, &e, &err), PD_OK);
    assert_int_equal(a.n, 2000);
    assert_int_equal(data_sample_numel(&a), 64);
    size_t numel = 64;
    /* deterministic, prefix-stable, seed-dependent */
    assert_memory_equal(a.x, b.x, 2000 * numel * sizeof(float));
    assert_memory_equal(a.y, b.y, 2000 * sizeof(int32_t));
    assert_memory_equal(a.x, c.x, 300 * numel * sizeof(float));
    assert_memory_equal(a.y, c.y, 300 * sizeof(int32_t));
    size_t same = 0;
    for (size_t i = 0; i < 2000 * numel; i++) same += a.x[i] == e.x[i];
    assert_true(same < 100);
    /* range and class balance */
    int hist[10] = {0};
    for (size_t i = 0; i < 2000 * numel; i++) assert_true(a.x[i] >= 0.0f && a.x[i] < 1.0f);
    for (size_t i = 0; i < 2000; i++) {
        assert_true(a.y[i] >= 0 && a.y[i] < 10);
        hist[a.y[i]]++;
    }
    for (int k = 0; k < 10; k++) assert_true(hist[k] > 140 && hist[k] < 260);
    /* learnable: a nearest-class-mean classifier fitted on the first half scores > 95%
     * on the second half (chance is 10%) */
    double mean[10][64] = {{0}};
    int cnt[10] = {0};
    for (size_t i = 0; i < 1000; i++) {
        cnt[a.y[i]]++;
        for (size_t j = 0; j < numel; j++) mean[a.y[i]][j] += a.x[i * numel + j];
    }
    for (int k = 0; k < 10; k++)
        for (size_t j = 0; j < numel; j++) mean[k][j] /= cnt[k] ? cnt[k] : 1;
    int right = 0;
    for (size_t i = 1000; i < 2000; i++) {
        int best = -1;
        double bd = 1e300;
        for (int k = 0; k < 10; k++) {
            double dd = 0;
            for (size_t j = 0; j < numel; j++) dd += (a.x[i * numel + j] - mean[k][j]) * (a.x[i * numel + j] - mean[k][j]);
            if (dd < bd) bd = dd, best = k;
        }
        right += best == a.y[i];
    }
    assert_true(right > 950);
    data_release(&a);
    data_release(&b);
    data_release(&c);
    data_release(&e);
    expect_err(data_synthetic(0, 1, 8, 8, 10, 7, &a, &err), &err, PD_EINVAL, "0 samples");
    expect_err(data_synthetic(10, 1, 0, 8, 10, 7, &a, &err), &err, PD_EINVAL, "sample shape (1, 0, 8)");
    expect_err(data_synthetic(10, 1, 8, 8, 0, 7, &a, &err), &err, PD_EINVAL, "0 classes");
    assert_null(a.x);
    data_release(&a);   /* zeroed: fine */
    data_release(NULL);
}

/* ---- order, batches, sharding ---------------------------------------------------- */

static void test_epoch_order(void **state) {
    (void)state;
    enum { M = 1000 };
    uint32_t o0[M], o0b[M], o1[M], ref[M];
    data_epoch_order(M, 42, 0, 1, o0);
    data_epoch_order(M, 42, 0, 1, o0b);
    data_epoch_order(M, 42, 1, 1, o1);
    unsigned char seen[M] = {0};
    for (int i = 0; i < M; i++) {
        assert_true(o0[i] < M);
        assert_int_equal(seen[o0[i]], 0);
        seen[o0[i]] = 1;
    }
    assert_memory_equal(o0, o0b, sizeof o0);
    int same = 0, fixed = 0;
    for (int i = 0; i < M; i++) same += o0[i] == o1[i], fixed += o0[i] == (uint32_t)i;
    assert_true(same < 20);
    assert_true(fixed < 20);
    /* the contract: exactly core's permutation on the shuffle stream, substream = epoch */
    rng_permutation(42, RNG_STREAM_SHUFFLE, 1, ref, M);
    assert_memory_equal(o1, ref, sizeof ref);
    data_epoch_order(M, 42, 3, 0, o0);
    for (int i = 0; i < M; i++) assert_int_equal(o0[i], i);
}

static void test_batch_pos_and_copy(void **state) {
    (void)state;
    /* brute force: walk epochs batch by batch and compare every global index */
    for (int drop = 0; drop <= 1; drop++)
        for (size_t n = 1; n <= 23; n++)
            for (int bs = 1; bs <= 9; bs++) {
                size_t nb = data_batches_per_epoch(n, bs, drop);
                assert_int_equal(nb, drop ? n / (size_t)bs : (n + (size_t)bs - 1) / (size_t)bs);
                if (nb == 0) continue;
                uint64_t g = 0;
                for (uint64_t ep = 0; ep < 3; ep++) {
                    size_t covered = 0;
                    for (size_t first = 0; first + (drop ? (size_t)bs : 1) <= n; first += (size_t)bs, g++) {
                        DataBatchPos p = data_batch_pos(n, bs, drop, g);
                        assert_int_equal(p.epoch, ep);
                        assert_int_equal(p.batch, first / (size_t)bs);
                        assert_int_equal(p.first, first);
                        int want = (int)(n - first < (size_t)bs ? n - first : (size_t)bs);
                        assert_int_equal(p.count, want);
                        covered += (size_t)p.count;
                    }
                    assert_int_equal(covered, drop ? n / (size_t)bs * (size_t)bs : n);
                }
            }
    /* data_batch copies the ordered samples */
    Dataset d;
    Err err = {0};
    assert_int_equal(data_synthetic(10, 2, 3, 1, 4, 1, &d, &err), PD_OK);
    uint32_t order[10] = {9, 3, 0, 7, 1, 2, 8, 4, 6, 5};
    float x[3 * 6];
    int32_t y[3];
    data_batch(&d, order, 4, 3, x, y);
    for (int i = 0; i < 3; i++) {
        assert_memory_equal(x + i * 6, d.x + order[4 + i] * 6, 6 * sizeof(float));
        assert_int_equal(y[i], d.y[order[4 + i]]);
    }
    data_batch(&d, NULL, 7, 3, x, NULL);
    assert_memory_equal(x, d.x + 7 * 6, 3 * 6 * sizeof(float));
    data_release(&d);
}

static void test_sharding(void **state) {
    (void)state;
    for (uint64_t nb = 0; nb <= 40; nb++)
        for (int size = 1; size <= 7; size++) {
            int hits[41] = {0};
            size_t total = 0;
            for (int rank = 0; rank < size; rank++) {
                uint64_t mb[41];
                size_t k = data_shard_minibatches(nb, rank, size, mb);
                assert_int_equal(k, data_shard_count(nb, rank, size));
                assert_int_equal(data_shard_minibatches(nb, rank, size, NULL), k);
                for (size_t i = 0; i < k; i++) {
                    assert_true(mb[i] < nb);
                    assert_int_equal(mb[i] % (uint64_t)size, rank);   /* round-robin */
                    if (i) assert_true(mb[i] > mb[i - 1]);
                    hits[mb[i]]++;
                }
                total += k;
            }
            assert_int_equal(total, nb);
            for (uint64_t i = 0; i < nb; i++) assert_int_equal(hits[i], 1);
        }
    /* slices of one minibatch: contiguous, cover [0, count), sizes differ by <= 1 */
    for (int count = 0; count <= 30; count++)
        for (int size = 1; size <= 8; size++) {
            int next = 0, lo = 1 << 30, hi = -1;
            for (int rank = 0; rank < size; rank++) {
                int first, len;
                data_shard_range(count, rank, size, &first, &len);
                assert_int_equal(first, next);
                next += len;
                if (len < lo) lo = len;
                if (len > hi) hi = len;
            }
            assert_int_equal(next, count);
            assert_true(hi - lo <= 1);
        }
}

static void test_sampler(void **state) {
    (void)state;
    Dataset d;
    Err err = {0};
    assert_int_equal(data_synthetic(23, 1, 2, 2, 3, 11, &d, &err), PD_OK);
    enum { B = 5 };
    for (int drop = 0; drop <= 1; drop++) {
        DataSampler s;
        assert_int_equal(data_sampler_init(&s, &d, B, 99, 1, drop, &err), PD_OK);
        assert_int_equal(s.n_batches, drop ? 4 : 5);
        /* forward over 3 epochs vs a manual walk; then backwards (random access) */
        float x[B * 4], xr[B * 4], xb[12][B * 4];
        int32_t y[B], yr[B];
        uint32_t order[23];
        size_t total = 3 * s.n_batches;
        for (uint64_t g = 0; g < total; g++) {
            int cnt = data_sampler_get(&s, g, x, y);
            uint64_t ep = g / s.n_batches;
            size_t b = (size_t)(g % s.n_batches);
            data_epoch_order(23, 99, ep, 1, order);
            int want = (int)(23 - b * B < B ? 23 - b * B : B);
            assert_int_equal(cnt, want);
            data_batch(&d, order, b * B, cnt, xr, yr);
            assert_memory_equal(x, xr, (size_t)cnt * 4 * sizeof(float));
            assert_memory_equal(y, yr, (size_t)cnt * sizeof(int32_t));
            if (g < 12) memcpy(xb[g], x, sizeof x);
        }
        for (int g = 11; g >= 0; g--) {
            int cnt = data_sampler_get(&s, (uint64_t)g, x, y);
            assert_memory_equal(x, xb[g], (size_t)cnt * 4 * sizeof(float));
        }
        data_sampler_release(&s);
    }
    DataSampler s;
    expect_err(data_sampler_init(&s, &d, 24, 1, 1, 1, &err), &err, PD_EINVAL, "larger than the 23 samples");
    expect_err(data_sampler_init(&s, &d, 0, 1, 1, 0, &err), &err, PD_EINVAL, "batch size 0");
    data_truncate(&d, 10);
    assert_int_equal(d.n, 10);
    data_release(&d);
}

/* ---- the installed Fashion-MNIST ------------------------------------------------- */

static void test_fashion_mnist(void **state) {
    (void)state;
    if (access(DATA_DEFAULT_IDX_DIR "/train-images-idx3-ubyte.gz", R_OK) != 0 &&
        access(DATA_DEFAULT_IDX_DIR "/train-images-idx3-ubyte", R_OK) != 0) {
        tu_skip("Fashion-MNIST is not installed in " DATA_DEFAULT_IDX_DIR " (dataset-fashion-mnist)");
    }
    const char *splits[2] = {"train", "test"};
    const size_t want[2] = {60000, 10000};
    for (int s = 0; s < 2; s++) {
        Dataset d;
        Err err = {0};
        int rc = data_load_idx(NULL, splits[s], &d, &err);
        if (rc) fprintf(stderr, "%s\n", err.msg);
        assert_int_equal(rc, PD_OK);
        assert_int_equal(d.n, want[s]);
        assert_int_equal(d.c, 1);
        assert_int_equal(d.h, 28);
        assert_int_equal(d.w, 28);
        size_t hist[10] = {0};
        for (size_t i = 0; i < d.n; i++) hist[d.y[i]]++;
        for (int k = 0; k < 10; k++) assert_int_equal(hist[k], want[s] / 10);
        float lo = 1, hi = 0;
        double sum = 0;
        for (size_t i = 0; i < d.n * 784; i++) {
            float v = data_value(&d, i);
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
            sum += v;
        }
        assert_true(lo == 0.0f && hi == 1.0f);
        /* torchvision's FashionMNIST mean after ToTensor is 0.2860 (train) */
        assert_true(fabs(sum / (double)(d.n * 784) - 0.286) < 0.005);
        if (s == 0) {   /* the training split's statistics, rounded: exactly the constants recipes use */
            double mean, std;
            data_stats(&d, &mean, &std);
            assert_true(mean == 0.286 && std == 0.353);
            assert_true((float)mean == 0.2860f && (float)std == 0.3530f);
        }
        data_release(&d);
    }
}

static void test_normalize(void **state) {
    (void)state;
    Dataset d, e;
    Err err = {0};
    assert_int_equal(data_synthetic(50, 1, 4, 4, 3, 9, &d, &err), PD_OK);
    assert_int_equal(data_synthetic(50, 1, 4, 4, 3, 9, &e, &err), PD_OK);
    data_normalize(&d, 0.25f, 0.5f);
    for (size_t i = 0; i < 50 * 16; i++) assert_float_equal(d.x[i], (e.x[i] - 0.25f) / 0.5f, 1e-6);
    assert_memory_equal(d.y, e.y, 50 * sizeof(int32_t));
    data_release(&d);
    data_release(&e);
}

/* data_stats: mean and population std over every value, rounded to 4 decimals. */
static void test_stats(void **state) {
    (void)state;
    Dataset d = {0};
    float x[8] = {0, 0, 0, 0, 1, 1, 1, 1};   /* mean 0.5, std 0.5 */
    d.x = x, d.n = 2, d.c = 1, d.h = 2, d.w = 2;
    double m, s;
    data_stats(&d, &m, &s);
    assert_true(m == 0.5 && s == 0.5);
    float y[3] = {0.1f, 0.2f, 0.6f};   /* mean 0.3, std sqrt(0.14 / 3) = 0.21602 */
    d.x = y, d.n = 3, d.h = 1, d.w = 1;
    data_stats(&d, &m, &s);
    assert_true(m == 0.3 && s == 0.216);
}

/* data_splits_open: an IDX directory read for a model, checked against it, standardised with the
 * training split's statistics; text read as sequences of the model's context. */
static void test_splits(void **state) {
    (void)state;
    TmpDir t;
    tmp_new(&t);
    write_set(&t, "train", 0, 0x803, N, sizeof g_pix, N, sizeof g_lab);
    write_set(&t, "t10k", 0, 0x803, N, sizeof g_pix, N, sizeof g_lab);
    DataFit fit = {"m", shape3(1, R, C), shape1(10)};
    DataSplits d;
    Err err = {0};
    assert_int_equal(data_splits_open(t.path, NULL, &fit, 1, &d, &err), PD_OK);
    assert_int_equal(d.train.n, N);
    assert_int_equal(d.test.n, N);
    double m, s;
    data_stats(&d.train, &m, &s);
    assert_true(d.mean == m && d.std == s && s > 0);
    float x0 = data_value(&d.test, 7);
    assert_int_equal(data_splits_standardise(&d, m, s, &err), PD_OK);
    assert_float_equal(data_value(&d.test, 7), (x0 - (float)m) * (1.0f / (float)s), 1e-6);
    data_splits_release(&d);
    /* only the test split: no statistics */
    assert_int_equal(data_splits_open(t.path, NULL, &fit, 0, &d, &err), PD_OK);
    assert_int_equal(d.train.n, 0);
    assert_true(isnan(d.mean));
    data_splits_release(&d);
    /* models that do not fit */
    fit.output = shape1(5);
    expect_err(data_splits_open(t.path, NULL, &fit, 1, &d, &err), &err, PD_EINVAL, "m: output (5) for 10 classes");
    fit.output = shape1(10), fit.input = shape3(1, R, R);
    expect_err(data_splits_open(t.path, NULL, &fit, 1, &d, &err), &err, PD_EINVAL,
               "m: input (1, 3, 3) does not match the data's samples (1, 3, 4)");
    /* text: a model of context 4 over 256 byte classes */
    char p[512];
    snprintf(p, sizeof p, "%s/t.txt", t.path);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    for (int i = 0; i < 100; i++) fputs("the lord is my shepherd. ", f);
    fclose(f);
    DataFit lm = {"lm", shape1(4), shape2(4, 256)};
    assert_int_equal(data_splits_open(NULL, p, &lm, 1, &d, &err), PD_OK);
    assert_true(d.text && d.train.n > 0 && d.test.n > 0 && d.train.y_len == 4 && isnan(d.mean));
    assert_int_equal(data_splits_standardise(&d, 0.5, 0.5, &err), PD_OK);   /* text: nothing to do */
    assert_true(d.test.x[0] == (float)'t' || d.test.x[0] >= 0);
    data_splits_release(&d);
    expect_err(data_splits_open(NULL, p, &fit, 1, &d, &err), &err, PD_EINVAL, "a text model takes (T) byte tokens");
    unlink(p);
    tmp_remove(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idx_good),       cmocka_unit_test(test_idx_errors),
        cmocka_unit_test(test_idx_huge_claim), cmocka_unit_test(test_idx_bad_gzip),
        cmocka_unit_test(test_cifar),          cmocka_unit_test(test_synthetic),
        cmocka_unit_test(test_epoch_order),    cmocka_unit_test(test_batch_pos_and_copy),
        cmocka_unit_test(test_sharding),       cmocka_unit_test(test_sampler),
        cmocka_unit_test(test_fashion_mnist),  cmocka_unit_test(test_normalize),
        cmocka_unit_test(test_stats),          cmocka_unit_test(test_splits),
    };
    return tu_run_group(tests, NULL, NULL);
}
