/* data_image.c: one image file to a model's pixels (data.h, data_image_read): PNG through
 * libpng's simplified reader, JPEG through libjpeg-turbo, both to 8-bit RGB; then grey
 * conversion when the model takes one channel, and the scale-to-cover plus centre crop to the
 * model's (h, w) with bilinear interpolation.
 * Not here: which files make a data set (data_folder.c), 16-bit precision (read as 8 bits). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>

#include "data.h"

#define IMG_MAX_SIDE 16384

/* ---- PNG ----------------------------------------------------------------------------- */

static int png_decode(const char *path, uint8_t **rgb, int *w, int *h, Err *err) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path))
        return err_set(err, PD_EINVAL, "%s: not a readable PNG image: %s", path, img.message);
    if (img.width == 0 || img.height == 0 || img.width > IMG_MAX_SIDE || img.height > IMG_MAX_SIDE) {
        png_image_free(&img);
        return err_set(err, PD_EINVAL, "%s: PNG image of %u x %u pixels, expected each side in 1..%d", path, img.width,
                       img.height, IMG_MAX_SIDE);
    }
    img.format = PNG_FORMAT_RGB;   /* grey replicated; alpha composited over black */
    uint8_t *buf = malloc(PNG_IMAGE_SIZE(img));
    if (!buf) {
        png_image_free(&img);
        return err_set(err, PD_ENOMEM, "%s: out of memory", path);
    }
    if (!png_image_finish_read(&img, NULL, buf, 0, NULL)) {
        free(buf);
        return err_set(err, PD_EINVAL, "%s: PNG image does not decode: %s", path, img.message);
    }
    *rgb = buf, *w = (int)img.width, *h = (int)img.height;
    return PD_OK;
}

/* ---- JPEG ---------------------------------------------------------------------------- */

typedef struct JpegErr {
    struct jpeg_error_mgr mgr;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
} JpegErr;

static void jpeg_fail(j_common_ptr c) {
    JpegErr *e = (JpegErr *)c->err;
    (*c->err->format_message)(c, e->msg);
    longjmp(e->jump, 1);
}

/* Counts warnings (level -1: damaged or truncated data, which the decoder pads over) without
 * printing them; trace messages (level >= 0) are dropped. */
static void jpeg_quiet(j_common_ptr c, int level) {
    if (level < 0) c->err->num_warnings++;
}

static int jpeg_decode(const char *path, uint8_t **rgb, int *w, int *h, Err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, PD_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct jpeg_decompress_struct d;
    JpegErr je;
    uint8_t *volatile buf = NULL;
    d.err = jpeg_std_error(&je.mgr);
    je.mgr.error_exit = jpeg_fail;
    je.mgr.emit_message = jpeg_quiet;
    if (setjmp(je.jump)) {
        jpeg_destroy_decompress(&d);
        fclose(f);
        free(buf);
        return err_set(err, PD_EINVAL, "%s: JPEG image does not decode: %s", path, je.msg);
    }
    jpeg_create_decompress(&d);
    jpeg_stdio_src(&d, f);
    jpeg_read_header(&d, TRUE);
    d.out_color_space = JCS_RGB;   /* grey replicated, CMYK refused by the library */
    jpeg_start_decompress(&d);
    if (d.output_width == 0 || d.output_height == 0 || d.output_width > IMG_MAX_SIDE ||
        d.output_height > IMG_MAX_SIDE || d.output_components != 3) {
        snprintf(je.msg, sizeof je.msg, "%u x %u pixels of %d components, expected each side in 1..%d and RGB",
                 d.output_width, d.output_height, d.output_components, IMG_MAX_SIDE);
        longjmp(je.jump, 1);
    }
    size_t stride = (size_t)d.output_width * 3;
    buf = malloc(stride * d.output_height);
    if (!buf) {
        snprintf(je.msg, sizeof je.msg, "out of memory");
        longjmp(je.jump, 1);
    }
    while (d.output_scanline < d.output_height) {
        JSAMPROW row = buf + stride * d.output_scanline;
        jpeg_read_scanlines(&d, &row, 1);
    }
    if (je.mgr.num_warnings > 0) {   /* a truncated or damaged stream decodes with warnings only */
        snprintf(je.msg, sizeof je.msg, "damaged or truncated data (%ld warnings)", je.mgr.num_warnings);
        longjmp(je.jump, 1);
    }
    jpeg_finish_decompress(&d);
    *w = (int)d.output_width, *h = (int)d.output_height;
    jpeg_destroy_decompress(&d);
    fclose(f);
    *rgb = buf;
    return PD_OK;
}

/* ---- to the model's shape ------------------------------------------------------------- */

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    if (n < k) return 0;
    for (size_t i = 0; i < k; i++)
        if (tolower((unsigned char)s[n - k + i]) != suf[i]) return 0;
    return 1;
}

/* The RGB image (sh, sw, 3) to out (c, h, w): each channel of the scaled-to-cover, centre-cropped
 * image, bilinear with pixel centres at half-integers and edges clamped. */
static void image_fit(const uint8_t *rgb, int sw, int sh, int c, int h, int w, uint8_t *out) {
    size_t plane = (size_t)h * w;
    uint8_t *grey = NULL;
    const uint8_t *src = rgb;
    int sc = 3;
    if (c == 1) {   /* luma first, so that a grey image's values pass unchanged */
        grey = malloc((size_t)sw * sh);
        PD_ASSERT(grey);
        for (size_t i = 0; i < (size_t)sw * sh; i++) {
            const uint8_t *p = rgb + 3 * i;
            grey[i] = (uint8_t)((299u * p[0] + 587u * p[1] + 114u * p[2] + 500u) / 1000u);
        }
        src = grey, sc = 1;
    }
    if (sw == w && sh == h) {
        for (int ch = 0; ch < c; ch++)
            for (size_t i = 0; i < plane; i++) out[ch * plane + i] = src[i * (size_t)sc + (size_t)ch];
        free(grey);
        return;
    }
    double s = fmax((double)h / sh, (double)w / sw);   /* scale that covers (h, w) */
    double oy = ((double)sh * s - h) / 2, ox = ((double)sw * s - w) / 2;
    for (int i = 0; i < h; i++) {
        double fy = (i + oy + 0.5) / s - 0.5;
        if (fy < 0) fy = 0;
        if (fy > sh - 1) fy = sh - 1;
        int y0 = (int)fy, y1 = y0 + 1 < sh ? y0 + 1 : y0;
        double ay = fy - y0;
        for (int j = 0; j < w; j++) {
            double fx = (j + ox + 0.5) / s - 0.5;
            if (fx < 0) fx = 0;
            if (fx > sw - 1) fx = sw - 1;
            int x0 = (int)fx, x1 = x0 + 1 < sw ? x0 + 1 : x0;
            double ax = fx - x0;
            for (int ch = 0; ch < c; ch++) {
                double a = src[((size_t)y0 * sw + x0) * sc + ch], b = src[((size_t)y0 * sw + x1) * sc + ch];
                double cc = src[((size_t)y1 * sw + x0) * sc + ch], dd = src[((size_t)y1 * sw + x1) * sc + ch];
                double v = (1 - ay) * ((1 - ax) * a + ax * b) + ay * ((1 - ax) * cc + ax * dd);
                out[ch * plane + (size_t)i * w + j] = (uint8_t)lround(v < 0 ? 0 : v > 255 ? 255 : v);
            }
        }
    }
    free(grey);
}

int data_image_read(const char *path, int c, int h, int w, uint8_t *out, Err *err) {
    PD_ASSERTF((c == 1 || c == 3) && h >= 1 && w >= 1, "image shape (%d, %d, %d)", c, h, w);
    uint8_t *rgb = NULL;
    int sw = 0, sh = 0, rc;
    if (ends_with(path, ".png")) rc = png_decode(path, &rgb, &sw, &sh, err);
    else if (ends_with(path, ".jpg") || ends_with(path, ".jpeg")) rc = jpeg_decode(path, &rgb, &sw, &sh, err);
    else rc = err_set(err, PD_EINVAL, "%s: not an image file (expected .png, .jpg or .jpeg)", path);
    if (rc) return rc;
    image_fit(rgb, sw, sh, c, h, w, out);
    free(rgb);
    return PD_OK;
}
