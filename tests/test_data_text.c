/* test_data_text.c: byte-level text data (data.h "text"): the split into training text and a
 * held-out tail, sequence contents (inputs and next-byte targets), the sampler's order
 * (the Dataset contract: every training sequence once per epoch, a pure function of seed and
 * epoch), reading a file equals reading bytes, and errors. The text is generated here. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"

static char *gen_text(size_t n) {
    static const char *words[] = {"In ", "the ", "beginning ", "God ", "created ", "heaven ", "and ", "earth. ", "\n"};
    char *s = malloc(n + 1);
    Rng r;
    rng_init(&r, 3, 9, 0);
    size_t k = 0;
    while (k < n) {
        const char *w = words[rng_below(&r, 9)];
        for (size_t i = 0; w[i] && k < n; i++) s[k++] = w[i];
    }
    s[n] = 0;
    return s;
}

static void test_split_and_contents(void **st) {
    (void)st;
    const size_t n = 10000;
    char *s = gen_text(n);
    s[17] = (char)0xE2;   // bytes above 127 are tokens too
    TextData d;
    Err err = {0};
    assert_int_equal(data_text_from_bytes(s, n, "gen", 16, 0.1, &d, &err), PD_OK);
    assert_int_equal(d.split, 9000);
    assert_int_equal(d.n_train, (9000 - 1) / 16);
    assert_int_equal(d.n_test, (1000 - 1) / 16);
    float x[3 * 16];
    int32_t y[3 * 16];
    uint32_t order[3] = {5, 1, (uint32_t)d.n_train - 1};
    data_text_batch(&d, 0, order, 0, 3, x, y);
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 16; t++) {
            assert_true(x[i * 16 + t] == (float)(uint8_t)s[order[i] * 16 + t]);
            assert_int_equal(y[i * 16 + t], (uint8_t)s[order[i] * 16 + t + 1]);
        }
    assert_true(x[1 * 16 + 1] == 226.0f);   // byte 17 = position 1 of sequence 1
    data_text_batch(&d, 1, NULL, d.n_test - 2, 2, x, y);   // the tail: the last two sequences
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < 16; t++) {
            size_t b = 9000 + (d.n_test - 2 + (size_t)i) * 16 + (size_t)t;
            assert_true(x[i * 16 + t] == (float)(uint8_t)s[b]);
            assert_int_equal(y[i * 16 + t], (uint8_t)s[b + 1]);
            assert_true(b + 1 < n);
        }
    data_text_release(&d);
    free(s);
}

static void test_sampler_order(void **st) {
    (void)st;
    const size_t n = 5000;
    char *s = gen_text(n);
    TextData d;
    Err err = {0};
    assert_int_equal(data_text_from_bytes(s, n, "gen", 8, 0.05, &d, &err), PD_OK);
    TextSampler a, b;
    const int B = 7;
    assert_int_equal(data_text_sampler_init(&a, &d, B, 11, &err), PD_OK);
    assert_int_equal(data_text_sampler_init(&b, &d, B, 11, &err), PD_OK);
    assert_int_equal(a.n_batches, (d.n_train + B - 1) / B);
    uint32_t *order = malloc(d.n_train * sizeof(uint32_t));
    int *seen = calloc(d.n_train, sizeof(int));
    float x[7 * 8], x2[7 * 8];
    int32_t y[7 * 8], y2[7 * 8];
    for (uint64_t epoch = 0; epoch < 2; epoch++) {
        data_epoch_order(d.n_train, 11, epoch, 1, order);
        memset(seen, 0, d.n_train * sizeof(int));
        for (size_t bi = 0; bi < a.n_batches; bi++) {
            uint64_t g = epoch * a.n_batches + bi;
            int cnt = data_text_sampler_get(&a, g, x, y);
            assert_int_equal(cnt, bi + 1 < a.n_batches ? B : (int)(d.n_train - bi * B));
            for (int i = 0; i < cnt; i++) {
                uint32_t q = order[bi * B + (size_t)i];
                seen[q]++;
                assert_true(x[i * 8] == (float)(uint8_t)s[q * 8]);
            }
        }
        for (size_t q = 0; q < d.n_train; q++) assert_int_equal(seen[q], 1);
    }
    /* random access equals sequential access; another seed gives another order */
    assert_int_equal(data_text_sampler_get(&b, 3, x2, y2), data_text_sampler_get(&a, 3, x, y));
    assert_memory_equal(x, x2, sizeof x);
    assert_memory_equal(y, y2, sizeof y);
    TextSampler c;
    assert_int_equal(data_text_sampler_init(&c, &d, B, 12, &err), PD_OK);
    data_text_sampler_get(&c, 3, x2, y2);
    assert_true(memcmp(x, x2, sizeof x) != 0);
    data_text_sampler_release(&a);
    data_text_sampler_release(&b);
    data_text_sampler_release(&c);
    data_text_release(&d);
    free(order);
    free(seen);
    free(s);
}

static void test_file_and_errors(void **st) {
    (void)st;
    const size_t n = 3000;
    char *s = gen_text(n);
    char path[] = "/tmp/pd_text_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, s, n), (ssize_t)n);
    close(fd);
    TextData a, b;
    Err err = {0};
    assert_int_equal(data_text_load(path, 32, 0.1, &a, &err), PD_OK);
    assert_int_equal(data_text_from_bytes(s, n, "gen", 32, 0.1, &b, &err), PD_OK);
    assert_int_equal(a.n_train, b.n_train);
    assert_int_equal(a.n_test, b.n_test);
    assert_int_equal(a.split, b.split);
    assert_memory_equal(a.bytes, b.bytes, n);
    data_text_release(&a);
    data_text_release(&b);
    /* too short: the held-out tail takes everything */
    assert_int_equal(data_text_from_bytes(s, 40, "short", 32, 0.1, &a, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "short: 40 bytes: too short"));
    assert_null(a.bytes);
    assert_int_equal(data_text_from_bytes(s, 100, "x", 32, 1.5, &a, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "held-out fraction"));
    assert_int_equal(data_text_from_bytes(s, 100, "x", 0, 0.1, &a, &err), PD_EINVAL);
    unlink(path);
    assert_int_equal(data_text_load(path, 32, 0.1, &a, &err), PD_EIO);
    assert_non_null(strstr(err.msg, path));
    data_text_release(NULL);
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_and_contents),
        cmocka_unit_test(test_sampler_order),
        cmocka_unit_test(test_file_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
