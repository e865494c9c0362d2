/* data.c: the Dataset container, synthetic data, and the deterministic order of samples:
 * epoch permutations, minibatch positions, sharding over replicas, and a sampler that
 * caches one epoch's order. The file readers are in data_idx.c, data_cifar.c, data_folder.c
 * and data_tokens.c.
 * Nothing here depends on which worker calls it: every result is a pure function of
 * (seed, epoch, index). */
#include "data.h"

#include <string.h>

size_t data_sample_numel(const Dataset *d) { return (size_t)d->c * (size_t)d->h * (size_t)d->w; }

void data_release(Dataset *d) {
    if (!d) return;
    pd_free(d->x);
    pd_free(d->pix);
    pd_free(d->y);
    memset(d, 0, sizeof *d);
}

void data_truncate(Dataset *d, size_t n) {
    PD_ASSERTF(n <= d->n, "truncate to %zu of %zu samples", n, d->n);
    d->n = n;   /* the buffers keep their size; data_release frees them whole */
}

int data_load(const char *kind, const char *dir, const char *split, Dataset *out, Err *err) {
    memset(out, 0, sizeof *out);
    if (!kind) return err_set(err, PD_EINVAL, "no dataset kind given");
    if (!strcmp(kind, "fashion-mnist") || !strcmp(kind, "mnist") || !strcmp(kind, "idx"))
        return data_load_idx(dir, split, out, err);
    if (!strcmp(kind, "cifar10")) {
        if (!dir) return err_set(err, PD_EINVAL, "cifar10: no directory given (it has no default)");
        return data_load_cifar10(dir, split, out, err);
    }
    return err_set(err, PD_EINVAL, "unknown dataset kind \"%s\" (expected fashion-mnist, mnist, idx or cifar10)",
                   kind);
}

/* ---- synthetic ------------------------------------------------------------------- */

/* Substreams of RNG_STREAM_SYNTH: sample i uses substream i (< 2^63); class prototype k
 * uses 2^63 + k, so the two never collide. */
#define SYNTH_PROTO_BASE (1ull << 63)

int data_synthetic(size_t n, int c, int h, int w, int n_classes, uint64_t seed, Dataset *out, Err *err) {
    memset(out, 0, sizeof *out);
    if (n < 1 || n > DATA_MAX_SAMPLES)
        return err_set(err, PD_EINVAL, "synthetic data: %zu samples, expected 1..%u", n, DATA_MAX_SAMPLES);
    if (c < 1 || h < 1 || w < 1 || (uint64_t)c * (uint64_t)h * (uint64_t)w > (1u << 24))
        return err_set(err, PD_EINVAL, "synthetic data: sample shape (%d, %d, %d): expected each >= 1 and at most "
                       "2^24 elements", c, h, w);
    size_t numel = (size_t)c * (size_t)h * (size_t)w;
    if (n_classes < 1 || (uint64_t)n_classes * numel > (1ull << 28))
        return err_set(err, PD_EINVAL, "synthetic data: %d classes of %zu elements: expected 1 or more classes and "
                       "at most 2^28 prototype elements", n_classes, numel);
    if ((uint64_t)n * numel > (1ull << 31))
        return err_set(err, PD_EINVAL, "synthetic data: %zu samples of %zu elements is more than 2^31 floats", n,
                       numel);

    float *proto = pd_alloc_f32((size_t)n_classes * numel);   /* (n_classes, c, h, w) */
    for (int k = 0; k < n_classes; k++) {
        Rng r;
        rng_init(&r, seed, RNG_STREAM_SYNTH, SYNTH_PROTO_BASE + (uint64_t)k);
        for (size_t j = 0; j < numel; j++) proto[(size_t)k * numel + j] = rng_uniform(&r);
    }
    out->n = n;
    out->c = c;
    out->h = h;
    out->w = w;
    out->n_classes = n_classes;
    out->x = pd_alloc_f32(n * numel);
    out->y = pd_alloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) {
        Rng r;
        rng_init(&r, seed, RNG_STREAM_SYNTH, i);
        int32_t y = (int32_t)rng_below(&r, (uint32_t)n_classes);
        const float *p = proto + (size_t)y * numel;
        float *x = out->x + i * numel;
        for (size_t j = 0; j < numel; j++) x[j] = 0.5f * p[j] + 0.5f * rng_uniform(&r);
        out->y[i] = y;
    }
    pd_free(proto);
    return PD_OK;
}

/* ---- order ----------------------------------------------------------------------- */

size_t data_batches_per_epoch(size_t n, int batch, int drop_last) {
    PD_ASSERTF(batch >= 1, "batch %d", batch);
    size_t b = (size_t)batch;
    return drop_last ? n / b : (n + b - 1) / b;
}

void data_epoch_order(size_t n, uint64_t seed, uint64_t epoch, int shuffle, uint32_t *order) {
    PD_ASSERTF(n <= UINT32_MAX, "%zu samples", n);
    if (shuffle) {
        rng_permutation(seed, RNG_STREAM_SHUFFLE, epoch, order, n);
    } else {
        for (size_t i = 0; i < n; i++) order[i] = (uint32_t)i;
    }
}

void data_batch(const Dataset *d, const uint32_t *order, size_t first, int count, float *x, int32_t *y) {
    PD_ASSERTF(count >= 0 && first <= d->n && (size_t)count <= d->n - first, "samples [%zu, %zu) of %zu", first,
               first + (size_t)(count > 0 ? count : 0), d->n);
    size_t numel = data_sample_numel(d);
    for (int i = 0; i < count; i++) {
        size_t s = order ? order[first + (size_t)i] : first + (size_t)i;
        PD_ASSERTF(s < d->n, "order[%zu] = %zu, n = %zu", first + (size_t)i, s, d->n);
        float *o = x + (size_t)i * numel;
        if (d->pix) {
            const uint8_t *p = d->pix + s * numel;
            for (size_t j = 0; j < numel; j++) o[j] = d->lut[p[j]];
        } else {
            memcpy(o, d->x + s * numel, numel * sizeof(float));
        }
        if (y) {
            size_t t = (size_t)data_targets(d);
            memcpy(y + (size_t)i * t, d->y + s * t, t * sizeof(int32_t));
        }
    }
}

DataBatchPos data_batch_pos(size_t n, int batch, int drop_last, uint64_t g) {
    size_t nb = data_batches_per_epoch(n, batch, drop_last);
    PD_ASSERTF(nb > 0, "no minibatch of %d in %zu samples", batch, n);
    DataBatchPos p;
    p.epoch = g / nb;
    p.batch = (size_t)(g % nb);
    p.first = p.batch * (size_t)batch;
    size_t left = n - p.first;
    p.count = left < (size_t)batch ? (int)left : batch;
    return p;
}

/* ---- sharding -------------------------------------------------------------------- */

size_t data_shard_count(uint64_t n_batches, int rank, int size) {
    PD_ASSERTF(size >= 1 && rank >= 0 && rank < size, "rank %d of %d", rank, size);
    if ((uint64_t)rank >= n_batches) return 0;
    return (size_t)((n_batches - (uint64_t)rank - 1) / (uint64_t)size + 1);
}

size_t data_shard_minibatches(uint64_t n_batches, int rank, int size, uint64_t *out) {
    size_t k = data_shard_count(n_batches, rank, size);
    if (out)
        for (size_t i = 0; i < k; i++) out[i] = (uint64_t)rank + (uint64_t)i * (uint64_t)size;
    return k;
}

void data_shard_range(int count, int rank, int size, int *first, int *len) {
    PD_ASSERTF(count >= 0 && size >= 1 && rank >= 0 && rank < size, "count %d, rank %d of %d", count, rank, size);
    int base = count / size, rem = count % size;
    *len = base + (rank < rem);
    *first = rank * base + (rank < rem ? rank : rem);
}

/* ---- sampler --------------------------------------------------------------------- */

int data_sampler_init(DataSampler *s, const Dataset *d, int batch, uint64_t seed, int shuffle, int drop_last,
                      Err *err) {
    memset(s, 0, sizeof *s);
    if (batch < 1) return err_set(err, PD_EINVAL, "batch size %d: expected >= 1", batch);
    size_t nb = data_batches_per_epoch(d->n, batch, drop_last);
    if (nb == 0)
        return err_set(err, PD_EINVAL, "batch size %d is larger than the %zu samples (with drop_last: no minibatch)",
                       batch, d->n);
    s->d = d;
    s->seed = seed;
    s->batch = batch;
    s->shuffle = shuffle;
    s->drop_last = drop_last;
    s->n_batches = nb;
    s->epoch = UINT64_MAX;
    s->order = pd_alloc((d->n ? d->n : 1) * sizeof(uint32_t));
    return PD_OK;
}

void data_sampler_release(DataSampler *s) {
    if (!s) return;
    pd_free(s->order);
    memset(s, 0, sizeof *s);
}

int data_sampler_get(DataSampler *s, uint64_t g, float *x, int32_t *y) {
    PD_ASSERT(s->order != NULL);
    DataBatchPos p = data_batch_pos(s->d->n, s->batch, s->drop_last, g);
    if (p.epoch != s->epoch) {
        data_epoch_order(s->d->n, s->seed, p.epoch, s->shuffle, s->order);
        s->epoch = p.epoch;
    }
    data_batch(s->d, s->order, p.first, p.count, x, y);
    if (s->d->aug.pad > 0 || s->d->aug.flip) data_augment_batch(s->d, s->seed, g, x, p.count);
    return p.count;
}

void data_normalize(Dataset *d, float mean, float std) {
    PD_ASSERT(std > 0);
    size_t n = d->n * data_sample_numel(d);
    float inv = 1.0f / std;
    d->black = (d->black - mean) * inv;
    if (d->pix) {   /* every element of byte b held lut[b]: the same operation on each */
        for (int b = 0; b < 256; b++) d->lut[b] = (d->lut[b] - mean) * inv;
        return;
    }
    for (size_t i = 0; i < n; i++) d->x[i] = (d->x[i] - mean) * inv;
}
