/* imgwrite.c: the tests' image encoder: writes the first samples of an IDX set (data_load_idx)
 * as an image folder in torchvision's ImageFolder layout, OUT/train/<label>/<index>.png|.jpg
 * and OUT/test/<label>/<index>.png|.jpg, with libpng or libjpeg-turbo, so that the folder
 * reader is tested on files a real encoder made. Grey images, one per sample, pixels as in
 * the IDX file (PNG: losslessly; JPEG: at the quality given).
 * usage: imgwrite IDX_DIR OUT png|jpeg N_TRAIN N_TEST [QUALITY] */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jpeglib.h>
#include <png.h>

#include "data.h"

static int write_png(const char *path, const uint8_t *pix, int h, int w) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = (png_uint_32)w, img.height = (png_uint_32)h, img.format = PNG_FORMAT_GRAY;
    if (!png_image_write_to_file(&img, path, 0, pix, 0, NULL)) {
        fprintf(stderr, "imgwrite: %s: %s\n", path, img.message);
        return 1;
    }
    return 0;
}

static int write_jpeg(const char *path, const uint8_t *pix, int h, int w, int quality) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "imgwrite: %s: %s\n", path, strerror(errno));
        return 1;
    }
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w, c.image_height = (JDIMENSION)h, c.input_components = 1;
    c.in_color_space = JCS_GRAYSCALE;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)(pix + (size_t)c.next_scanline * w);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    return fclose(f) != 0;
}

static int write_split(const char *idx, const char *out, const char *split, int jpeg, size_t n, int quality) {
    Dataset d;
    Err err = {0};
    if (data_load_idx(idx, split, &d, &err)) {
        fprintf(stderr, "imgwrite: %s\n", err.msg);
        return 1;
    }
    if (n > d.n) n = d.n;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", out, split);
    mkdir(out, 0755);
    mkdir(p, 0755);
    for (int k = 0; k < d.n_classes; k++) {
        snprintf(p, sizeof p, "%s/%s/%d", out, split, k);
        mkdir(p, 0755);
    }
    size_t numel = data_sample_numel(&d);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        snprintf(p, sizeof p, "%s/%s/%d/%06zu.%s", out, split, d.y[i], i, jpeg ? "jpg" : "png");
        rc = jpeg ? write_jpeg(p, d.pix + i * numel, d.h, d.w, quality) : write_png(p, d.pix + i * numel, d.h, d.w);
    }
    data_release(&d);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 6 || (strcmp(argv[3], "png") && strcmp(argv[3], "jpeg"))) {
        fprintf(stderr, "usage: imgwrite IDX_DIR OUT png|jpeg N_TRAIN N_TEST [QUALITY]\n");
        return 2;
    }
    int jpeg = !strcmp(argv[3], "jpeg"), quality = argc > 6 ? atoi(argv[6]) : 90;
    if (write_split(argv[1], argv[2], "train", jpeg, (size_t)atol(argv[4]), quality)) return 1;
    return write_split(argv[1], argv[2], "test", jpeg, (size_t)atol(argv[5]), quality);
}
