/* test_data_folder.c: image folders, augmentation and token shards (data.h) in one process:
 * PNG and JPEG files written here with libpng and libjpeg-turbo decode to their pixels (grey
 * as is, colour to luma, other sizes scaled to cover and cropped at the centre, against a
 * bilinear formula written out here); a folder reads the same from its decode cache as from
 * its images; data_dir_kind; augmentation against a crop and mirror computed here from the
 * same random draws, and the sampler applies it; token shards laid out as next-token
 * sequences, with their errors. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>
#include <png.h>

#include "data.h"

static void expect_err(int rc, const Err *err, int code, const char *substr) {
    if (rc != code || !strstr(err->msg, substr))
        fprintf(stderr, "got rc %d \"%s\", want rc %d containing \"%s\"\n", rc, err->msg, code, substr);
    assert_int_equal(rc, code);
    assert_non_null(strstr(err->msg, substr));
}

static char g_dir[256];

static const char *path_in(const char *rel) {
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", g_dir, rel);
    return p[k];
}

static void write_png(const char *path, const uint8_t *pix, int w, int h, int rgb) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = (png_uint_32)w, img.height = (png_uint_32)h, img.format = rgb ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
    assert_true(png_image_write_to_file(&img, path, 0, pix, 0, NULL));
}

static void write_jpeg_grey(const char *path, const uint8_t *pix, int w, int h) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w, c.image_height = (JDIMENSION)h, c.input_components = 1;
    c.in_color_space = JCS_GRAYSCALE;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 100, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)(pix + (size_t)c.next_scanline * w);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    fclose(f);
}

static int setup(void **st) {
    (void)st;
    snprintf(g_dir, sizeof g_dir, "/tmp/pd_test_folder_XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    return 0;
}

static int teardown(void **st) {
    (void)st;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : 1;
}

/* Grey pass through, RGB to luma, and scale-to-cover + centre crop against the formula. */
static void test_image_read(void **st) {
    (void)st;
    Err err = {0};
    uint8_t g[6 * 4], out[3 * 6 * 4];
    for (int i = 0; i < 24; i++) g[i] = (uint8_t)(i * 11 + 3);
    write_png(path_in("g.png"), g, 6, 4, 0);   /* width 6, height 4 */
    assert_int_equal(data_image_read(path_in("g.png"), 1, 4, 6, out, &err), PD_OK);
    assert_memory_equal(out, g, 24);
    assert_int_equal(data_image_read(path_in("g.png"), 3, 4, 6, out, &err), PD_OK);   /* grey to RGB: replicated */
    for (int c = 0; c < 3; c++) assert_memory_equal(out + c * 24, g, 24);
    uint8_t rgb[2 * 3] = {200, 10, 40, 0, 255, 0};   /* two pixels */
    write_png(path_in("c.png"), rgb, 2, 1, 1);
    assert_int_equal(data_image_read(path_in("c.png"), 1, 1, 2, out, &err), PD_OK);
    assert_int_equal(out[0], (299 * 200 + 587 * 10 + 114 * 40 + 500) / 1000);
    assert_int_equal(out[1], (587 * 255 + 500) / 1000);
    assert_int_equal(data_image_read(path_in("c.png"), 3, 1, 2, out, &err), PD_OK);   /* planes: R then G then B */
    assert_int_equal(out[0], 200), assert_int_equal(out[1], 0), assert_int_equal(out[2], 10);
    assert_int_equal(out[3], 255), assert_int_equal(out[4], 40), assert_int_equal(out[5], 0);

    /* (4, 6) to (2, 2): scale 0.5 covers (2, 3); the centre crop drops half a column each side */
    assert_int_equal(data_image_read(path_in("g.png"), 1, 2, 2, out, &err), PD_OK);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            double s = 0.5, ox = (6 * s - 2) / 2, fy = (i + 0.5) / s - 0.5, fx = (j + ox + 0.5) / s - 0.5;
            int y0 = (int)fy, x0 = (int)fx;
            double ay = fy - y0, ax = fx - x0;
            double v = (1 - ay) * ((1 - ax) * g[y0 * 6 + x0] + ax * g[y0 * 6 + x0 + 1]) +
                       ay * ((1 - ax) * g[(y0 + 1) * 6 + x0] + ax * g[(y0 + 1) * 6 + x0 + 1]);
            assert_int_equal(out[i * 2 + j], (int)lround(v));
        }
    /* JPEG at quality 100: close to its pixels */
    uint8_t flat[8 * 8];
    memset(flat, 120, sizeof flat);
    write_jpeg_grey(path_in("f.jpg"), flat, 8, 8);
    assert_int_equal(data_image_read(path_in("f.jpg"), 1, 8, 8, out, &err), PD_OK);
    for (int i = 0; i < 64; i++) assert_true(abs((int)out[i] - 120) <= 1);
    /* errors name the file */
    FILE *f = fopen(path_in("bad.png"), "wb");
    fputs("\x89PNG\r\n\x1a\n garbage", f);
    fclose(f);
    expect_err(data_image_read(path_in("bad.png"), 1, 2, 2, out, &err), &err, PD_EINVAL, "bad.png: ");
    f = fopen(path_in("bad.jpg"), "wb");
    fputs("\xff\xd8\xff garbage", f);
    fclose(f);
    expect_err(data_image_read(path_in("bad.jpg"), 1, 2, 2, out, &err), &err, PD_EINVAL, "bad.jpg: JPEG image does not decode");
    expect_err(data_image_read(path_in("g.gif"), 1, 2, 2, out, &err), &err, PD_EINVAL, "g.gif: not an image file");
}

/* A small folder: classes by name, samples in class then name order; the cache gives the same. */
static void test_folder_and_cache(void **st) {
    (void)st;
    const char *cls[3] = {"ant", "bee", "cat"};
    for (int s = 0; s < 2; s++) {
        mkdir(path_in(s ? "set/test" : "set/train"), 0755);
        mkdir(path_in("set"), 0755);
        mkdir(path_in(s ? "set/test" : "set/train"), 0755);
        for (int k = 0; k < 3; k++) {
            char p[128];
            snprintf(p, sizeof p, "set/%s/%s", s ? "test" : "train", cls[2 - k]);   /* made out of order */
            mkdir(path_in(p), 0755);
            for (int i = 0; i < 2 + k; i++) {
                uint8_t px[4 * 4];
                for (int j = 0; j < 16; j++) px[j] = (uint8_t)(40 * (2 - k) + 10 * i + j);
                snprintf(p, sizeof p, "set/%s/%s/%c.png", s ? "test" : "train", cls[2 - k], 'e' - i);
                write_png(path_in(p), px, 4, 4, 0);
            }
        }
    }
    assert_string_equal(data_dir_kind(path_in("set")), "folder");
    assert_string_equal(data_dir_kind(NULL), "idx");
    Dataset a, b;
    Err err = {0};
    int cached = -1;
    assert_int_equal(data_load_folder(path_in("set"), "train", 1, 4, 4, &a, &cached, &err), PD_OK);
    assert_int_equal(cached, 0);
    assert_int_equal(a.n, 9);
    assert_int_equal(a.n_classes, 3);
    /* cat was written with 2 images (k = 0), bee 3, ant 4: labels 0 0 0 0 1 1 1 2 2 */
    const int32_t want_y[9] = {0, 0, 0, 0, 1, 1, 1, 2, 2};
    assert_memory_equal(a.y, want_y, sizeof want_y);
    /* ant (k = 2) images named e, d, c, b hold base 0 + 10 i; sorted b (i = 3) first */
    assert_int_equal(a.pix[0], 30);
    assert_true(a.lut[255] == 1.0f && a.lut[51] == 51.0f / 255.0f);
    assert_int_equal(data_load_folder(path_in("set"), "train", 1, 4, 4, &b, &cached, &err), PD_OK);
    assert_int_equal(cached, 1);
    assert_int_equal(b.n, a.n);
    assert_memory_equal(b.pix, a.pix, 9 * 16);
    assert_memory_equal(b.y, a.y, 9 * sizeof(int32_t));
    data_release(&b);
    /* another shape is another cache */
    assert_int_equal(data_load_folder(path_in("set"), "train", 3, 2, 2, &b, &cached, &err), PD_OK);
    assert_int_equal(cached, 0);
    data_release(&b);
    data_release(&a);
    /* errors */
    mkdir(path_in("set/test/dog"), 0755);
    expect_err(data_load_folder(path_in("set"), "test", 1, 4, 4, &a, NULL, &err), &err, PD_EINVAL,
               "set/test/dog: a class that");
    expect_err(data_load_folder(path_in("nothere"), "train", 1, 4, 4, &a, NULL, &err), &err, PD_EIO,
               "nothere/train: missing");
}

/* Crop with padding and mirror: each sample against its own draws applied by hand. */
static void test_augment(void **st) {
    (void)st;
    Dataset d;
    Err err = {0};
    assert_int_equal(data_synthetic(40, 2, 5, 6, 3, 9, &d, &err), PD_OK);
    data_normalize(&d, 0.5f, 0.25f);
    assert_true(d.black == (0.0f - 0.5f) * (1.0f / 0.25f));
    assert_int_equal(data_augment_parse("crop=2,flip", &d.aug, &err), PD_OK);
    assert_true(d.aug.pad == 2 && d.aug.flip == 1);
    DataSampler s;
    assert_int_equal(data_sampler_init(&s, &d, 8, 4, 1, 1, &err), PD_OK);
    const size_t numel = 60;
    float x[8 * 60], plain[8 * 60];
    int32_t y[8];
    for (uint64_t g = 0; g < 7; g++) {
        int n = data_sampler_get(&s, g, x, y);
        DataBatchPos p = data_batch_pos(d.n, 8, 1, g);
        uint32_t order[40];
        data_epoch_order(d.n, 4, p.epoch, 1, order);
        data_batch(&d, order, p.first, n, plain, NULL);
        Rng r;
        rng_init(&r, 4, RNG_STREAM_AUGMENT, g);
        int moved = 0;
        for (int i = 0; i < n; i++) {
            int ox = (int)rng_below(&r, 5), oy = (int)rng_below(&r, 5), fl = (int)rng_below(&r, 2);
            moved += ox != 2 || oy != 2 || fl;
            for (int c = 0; c < 2; c++)
                for (int yy = 0; yy < 5; yy++)
                    for (int xx = 0; xx < 6; xx++) {
                        int sx = fl ? 5 - xx : xx;   /* mirrored window column */
                        int py = yy + oy - 2, px = sx + ox - 2;   /* in the unpadded image */
                        float want = py >= 0 && py < 5 && px >= 0 && px < 6 ? plain[i * numel + c * 30 + py * 6 + px]
                                                                            : d.black;
                        assert_true(x[i * numel + c * 30 + yy * 6 + xx] == want);
                    }
        }
        assert_true(moved > 0);
    }
    data_sampler_release(&s);
    expect_err(data_augment_parse("crop=0", &d.aug, &err), &err, PD_EINVAL, "crop=0");
    expect_err(data_augment_parse("flip,spin", &d.aug, &err), &err, PD_EINVAL, "unknown part \"spin\"");
    assert_int_equal(data_augment_parse("none", &d.aug, &err), PD_OK);
    assert_true(d.aug.pad == 0 && d.aug.flip == 0);
    data_release(&d);
}

static void write_shard(const char *path, const uint16_t *tok, int n, int magic) {
    int32_t hd[256] = {magic, 1, n};
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(hd, 4, 256, f), 256);
    assert_int_equal(fwrite(tok, 2, (size_t)n, f), (size_t)n);
    fclose(f);
}

static void test_tokens(void **st) {
    (void)st;
    mkdir(path_in("tok"), 0755);
    uint16_t t[100];
    for (int i = 0; i < 100; i++) t[i] = (uint16_t)(i * 37 % 1000);
    write_shard(path_in("tok/x_train_001.bin"), t, 50, DATA_TOKENS_MAGIC);
    write_shard(path_in("tok/x_train_000.bin"), t + 50, 50, DATA_TOKENS_MAGIC);   /* name order: 000 first */
    write_shard(path_in("tok/x_val.bin"), t, 21, DATA_TOKENS_MAGIC);
    Dataset d;
    Err err = {0};
    assert_int_equal(data_tokens_dataset(path_in("tok"), "train", 8, &d, &err), PD_OK);
    assert_int_equal(d.n, (100 - 1) / 8);
    assert_int_equal(d.y_len, 8);
    int maxt = 0;
    for (int i = 0; i < 100; i++) maxt = t[i] > maxt ? t[i] : maxt;
    assert_int_equal(d.n_classes, maxt + 1);
    for (size_t s = 0; s < d.n; s++)
        for (int k = 0; k < 8; k++) {
            size_t at = s * 8 + (size_t)k, src = (at + 50) % 100, nxt = (at + 51) % 100;   /* 000 = t[50..100) first */
            assert_true(d.x[at] == (float)t[src]);
            assert_int_equal(d.y[at], t[nxt]);
        }
    data_release(&d);
    assert_int_equal(data_tokens_dataset(path_in("tok"), "val", 8, &d, &err), PD_OK);
    assert_int_equal(d.n, 2);
    data_release(&d);
    expect_err(data_tokens_dataset(path_in("tok"), "val", 21, &d, &err), &err, PD_EINVAL, "hold no sequence of 21");
    /* bytes per token: tokenizer lengths 1 + (id % 3) */
    FILE *f = fopen(path_in("tok/tokenizer.json"), "w");
    fputs("{\"token_bytes\": [", f);
    for (int i = 0; i < 1000; i++) fprintf(f, "%s%d", i ? "," : "", 1 + i % 3);
    fputs("]}", f);
    fclose(f);
    double bpt, want = 0;
    assert_int_equal(data_tokens_bytes_per_token(path_in("tok"), 8, &bpt, &err), PD_OK);
    for (int i = 1; i <= 16; i++) want += 1 + t[i] % 3;
    assert_true(fabs(bpt - want / 16) < 1e-12);
    write_shard(path_in("tok/y_val.bin"), t, 5, 12345);
    expect_err(data_tokens_dataset(path_in("tok"), "val", 8, &d, &err), &err, PD_EINVAL, "y_val.bin: magic 12345");
    unlink(path_in("tok/y_val.bin"));
    write_shard(path_in("tok/y_val.bin"), t, 5, DATA_TOKENS_MAGIC);
    assert_int_equal(truncate(path_in("tok/y_val.bin"), 1024 + 8), 0);
    expect_err(data_tokens_dataset(path_in("tok"), "val", 8, &d, &err), &err, PD_EINVAL, "declares 5 tokens");
    mkdir(path_in("empty"), 0755);
    expect_err(data_tokens_dataset(path_in("empty"), "train", 8, &d, &err), &err, PD_EINVAL, "no train shard");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_image_read),
        cmocka_unit_test(test_folder_and_cache),
        cmocka_unit_test(test_augment),
        cmocka_unit_test(test_tokens),
    };
    return tu_run_group(tests, setup, teardown);
}
