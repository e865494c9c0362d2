/* data_text.c: byte-level text for language models (data.h, "text"): the file's bytes are
 * the tokens, the last part is held out, sequences are consecutive windows of T + 1 bytes, and
 * the training order follows the Dataset contract (data_epoch_order, data_batch_pos). */
#include "data.h"

#include <string.h>

static int split_text(TextData *d, const char *name, int ctx, double frac, Err *err) {
    if (ctx < 1) return err_set(err, PD_EINVAL, "%s: context length %d: expected >= 1", name, ctx);
    if (!(frac > 0.0 && frac < 1.0))
        return err_set(err, PD_EINVAL, "%s: held-out fraction %g: expected in (0, 1)", name, frac);
    size_t tail = (size_t)((double)d->n_bytes * frac);
    if (tail < (size_t)ctx + 1) tail = (size_t)ctx + 1;   // at least one held-out sequence
    if (tail >= d->n_bytes)
        return err_set(err, PD_EINVAL, "%s: %zu bytes: too short for a training and a held-out sequence of %d tokens",
                       name, d->n_bytes, ctx);
    d->split = d->n_bytes - tail;
    d->ctx = ctx;
    d->n_train = d->split >= 1 ? (d->split - 1) / (size_t)ctx : 0;
    d->n_test = (tail - 1) / (size_t)ctx;
    if (d->n_train == 0)
        return err_set(err, PD_EINVAL, "%s: %zu bytes: too short for a training sequence of %d tokens (and a held-out "
                       "tail of %zu bytes)", name, d->n_bytes, ctx, tail);
    if (d->n_train > UINT32_MAX) return err_set(err, PD_EINVAL, "%s: more than 2^32 sequences", name);
    return PD_OK;
}

int data_text_from_bytes(const void *bytes, size_t n, const char *name, int ctx, double test_fraction, TextData *out,
                         Err *err) {
    memset(out, 0, sizeof *out);
    out->bytes = pd_alloc(n ? n : 1);
    if (n) memcpy(out->bytes, bytes, n);
    out->n_bytes = n;
    int rc = split_text(out, name, ctx, test_fraction, err);
    if (rc) data_text_release(out);
    return rc;
}

int data_text_load(const char *path, int ctx, double test_fraction, TextData *out, Err *err) {
    memset(out, 0, sizeof *out);
    char *text = NULL;
    size_t len = 0;
    int rc = pd_read_file(path, DATA_TEXT_MAX_BYTES, &text, &len, err);
    if (rc) return rc;
    out->bytes = (uint8_t *)text;   // pd_read_file's buffer (pd_alloc'd, NUL-terminated)
    out->n_bytes = len;
    rc = split_text(out, path, ctx, test_fraction, err);
    if (rc) data_text_release(out);
    return rc;
}

void data_text_release(TextData *d) {
    if (!d) return;
    pd_free(d->bytes);
    memset(d, 0, sizeof *d);
}

void data_text_batch(const TextData *d, int test, const uint32_t *order, size_t first, int count, float *x,
                     int32_t *y) {
    size_t n = test ? d->n_test : d->n_train, base = test ? d->split : 0, t = (size_t)d->ctx;
    PD_ASSERTF(first + (size_t)count <= n, "sequences %zu + %d of %zu", first, count, n);
    for (int i = 0; i < count; i++) {
        size_t s = order ? order[first + (size_t)i] : first + (size_t)i;
        PD_ASSERT(s < n);
        const uint8_t *b = d->bytes + base + s * t;
        float *xr = x + (size_t)i * t;
        for (size_t k = 0; k < t; k++) xr[k] = (float)b[k];
        if (y) {
            int32_t *yr = y + (size_t)i * t;
            for (size_t k = 0; k < t; k++) yr[k] = b[k + 1];
        }
    }
}

int data_text_sampler_init(TextSampler *s, const TextData *d, int batch, uint64_t seed, Err *err) {
    memset(s, 0, sizeof *s);
    if (batch < 1) return err_set(err, PD_EINVAL, "batch size %d: expected >= 1", batch);
    s->d = d;
    s->seed = seed;
    s->batch = batch;
    s->n_batches = data_batches_per_epoch(d->n_train, batch, 0);
    s->epoch = UINT64_MAX;
    s->order = pd_alloc(d->n_train * sizeof(uint32_t));
    return PD_OK;
}

void data_text_sampler_release(TextSampler *s) {
    if (!s) return;
    pd_free(s->order);
    memset(s, 0, sizeof *s);
}

int data_text_sampler_get(TextSampler *s, uint64_t g, float *x, int32_t *y) {
    PD_ASSERT(s->order != NULL);
    DataBatchPos p = data_batch_pos(s->d->n_train, s->batch, 0, g);
    if (p.epoch != s->epoch) {
        data_epoch_order(s->d->n_train, s->seed, p.epoch, 1, s->order);
        s->epoch = p.epoch;
    }
    data_text_batch(s->d, 0, s->order, p.first, p.count, x, y);
    return p.count;
}
