/* data_augment.c: augmentation of image training samples (data.h, DataAugment): a random crop
 * of the sample padded with black, and a left-right mirror, drawn from the stream
 * (seed, RNG_STREAM_AUGMENT, global minibatch), so every worker that fetches a minibatch
 * augments it the same way. Also the parser of the CLI's --augment value.
 * Not here: colour jitter, scaling, anything for text. */
#include <stdlib.h>
#include <string.h>

#include "data.h"

#define AUG_MAX_PAD 64

/* One sample (c, h, w): shifted by (dy, dx) (the crop at offset (pad + dy, pad + dx) of the
 * padded sample), black where the window leaves the image; then mirrored when flip. */
static void aug_sample(float *x, float *tmp, int c, int h, int w, int dy, int dx, int flip, float black) {
    for (int ch = 0; ch < c; ch++) {
        const float *in = x + (size_t)ch * h * w;
        float *o = tmp + (size_t)ch * h * w;
        for (int i = 0; i < h; i++) {
            int si = i + dy;
            for (int j = 0; j < w; j++) {
                int sj = j + dx;
                float v = si >= 0 && si < h && sj >= 0 && sj < w ? in[(size_t)si * w + sj] : black;
                o[(size_t)i * w + (flip ? w - 1 - j : j)] = v;
            }
        }
    }
    memcpy(x, tmp, (size_t)c * h * w * sizeof(float));
}

void data_augment_batch(const Dataset *d, uint64_t seed, uint64_t g, float *x, int count) {
    const DataAugment *a = &d->aug;
    if (a->pad <= 0 && !a->flip) return;
    size_t numel = data_sample_numel(d);
    float *tmp = pd_alloc_f32(numel);
    Rng r;
    rng_init(&r, seed, RNG_STREAM_AUGMENT, g);
    for (int i = 0; i < count; i++) {
        int dy = 0, dx = 0, flip = 0;
        if (a->pad > 0) {
            dx = (int)rng_below(&r, (uint32_t)(2 * a->pad + 1)) - a->pad;
            dy = (int)rng_below(&r, (uint32_t)(2 * a->pad + 1)) - a->pad;
        }
        if (a->flip) flip = (int)rng_below(&r, 2);
        if (dy || dx || flip) aug_sample(x + (size_t)i * numel, tmp, d->c, d->h, d->w, dy, dx, flip, d->black);
    }
    pd_free(tmp);
}

int data_augment_parse(const char *spec, DataAugment *out, Err *err) {
    memset(out, 0, sizeof *out);
    if (!spec || !*spec) return err_set(err, PD_EINVAL, "augmentation: empty (expected crop=P, flip, or both)");
    if (!strcmp(spec, "none")) return PD_OK;
    const char *p = spec;
    while (*p) {
        size_t n = strcspn(p, ",");
        if (n == 4 && !strncmp(p, "flip", 4)) {
            out->flip = 1;
        } else if (n > 5 && !strncmp(p, "crop=", 5)) {
            char num[16], *end;
            if (n - 5 >= sizeof num) return err_set(err, PD_EINVAL, "augmentation \"%s\": crop padding too long", spec);
            memcpy(num, p + 5, n - 5);
            num[n - 5] = 0;
            long v = strtol(num, &end, 10);
            if (*end || v < 1 || v > AUG_MAX_PAD)
                return err_set(err, PD_EINVAL, "augmentation \"%s\": crop=%s: expected a padding in 1..%d pixels", spec,
                               num, AUG_MAX_PAD);
            out->pad = (int)v;
        } else {
            return err_set(err, PD_EINVAL, "augmentation \"%s\": unknown part \"%.*s\" (expected crop=P, flip)", spec,
                           (int)n, p);
        }
        p += n;
        if (*p == ',') p++;
    }
    return PD_OK;
}
