/* rt_wire.c: how a worker's messages travel between stages (RtConfig.wire, wire_grad, wire_at,
 * error_feedback): each of its four messages per unit gets a codec (kernels.h, KCODEC_*), and
 * a send encodes its floats into the slot's buffer, a receive decodes them, with what the codec
 * keeps across units: the per-sample references of delta and the carried error of error
 * feedback. It counts the bytes each chunk sends, as sent and as fp32.
 *
 * The layout of the codecs on a message of a unit (B samples of m values each):
 *   int8: a scale per row, a row being the smallest run of trailing dimensions of a sample
 *         that holds at least 64 values (a token's features, a feature map's rows), or the
 *         whole sample; rows never straddle samples.
 *   int4: a scale per group of 64 values of the whole message; on gradients, stochastic
 *         rounding keyed by (seed, global unit * stages + boundary).
 *   delta (activations): per sample, in order, its encoding against its reference, which both
 *         ends keep by the sample's dataset position (the sampler's order of its epoch, so a
 *         rank that reads no data knows it too): int8 rows in the data's first epoch, then the
 *         int4 difference (nearest, groups of 64 within the sample); the references are int8
 *         rows, zero before a sample's first message (after a resume: a plain int4 message).
 *         Every sample crosses a boundary once an epoch, in unit order at both ends, so the two
 *         stores stay bitwise equal. Evaluation messages are int8 rows, the stores untouched.
 *   error feedback (gradients): the error a message left (sent minus what was wanted) is
 *         added to the next gradient of the same boundary and the same micro-batch position
 *         (global unit mod micro-batches), so every sample position of a minibatch carries
 *         its own residual; a resumed run starts them at zero.
 * Messages travel in whole float-sized words (the comm layer counts floats); the bytes past
 * an encoding are zero. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "rt_impl.h"

#define INT4_GROUP 64
#define ROW_MIN 64

static const char *const g_wire_names[RT_WIRE_COUNT] = {"fp32", "bf16", "int8", "int4", "delta"};

const char *rt_wire_name(int wire) { return wire >= 0 && wire < RT_WIRE_COUNT ? g_wire_names[wire] : "?"; }

int rt_wire_parse(const char *name) {
    for (int i = 0; name && i < RT_WIRE_COUNT; i++)
        if (!strcmp(name, g_wire_names[i])) return i;
    return -1;
}

/* The int8 row of a sample of shape s without its batch dimension (s.d[1 ..]). */
static int row_of(Shape s) {
    size_t r = 1;
    for (int i = s.ndim - 1; i >= 1; i--) {
        r *= (size_t)s.d[i];
        if (r >= ROW_MIN) break;
    }
    return (int)r;
}

static size_t words(size_t bytes) { return (bytes + 3) / 4; }

/* The codec of boundary b's activations (grad 0) or gradients (grad 1). */
static int wire_of(const RtConfig *cfg, int b, int grad) {
    if (cfg->wire_at) return cfg->wire_at[2 * b + grad];
    return grad ? cfg->wire_grad : cfg->wire;
}

static int dir_init(Worker *w, RtWireDir *d, int b, int grad, int sending, Shape s, Err *err) {
    const RtConfig *cfg = w->cfg;
    memset(d, 0, sizeof *d);
    d->boundary = b;
    d->wire = wire_of(cfg, b, grad);
    d->n = shape_numel(s);
    if (d->wire < 0 || d->wire >= RT_WIRE_COUNT || (grad && d->wire == RT_WIRE_DELTA))
        return err_set(err, PD_EINVAL, "boundary %d: no %s codec %d", b, grad ? "gradient" : "activation", d->wire);
    if (d->wire == RT_WIRE_FP32) return PD_OK;
    size_t B = (size_t)cfg->unit_batch, m = d->n / B;
    int row = row_of(s);
    KCodec i8 = {.codec = KCODEC_INT8, .block = row};
    switch (d->wire) {
    case RT_WIRE_BF16: d->kc = (KCodec){.codec = KCODEC_BF16}; break;
    case RT_WIRE_INT8: d->kc = i8; break;
    case RT_WIRE_INT4:
        d->kc = (KCodec){.codec = KCODEC_INT4, .block = INT4_GROUP, .stochastic = grad, .seed = cfg->seed};
        break;
    default:   /* delta */
        d->kc = (KCodec){.codec = KCODEC_INT4, .block = INT4_GROUP};
        d->kc_first = d->ref = i8;
        for (int k = 0; k < w->s->n_stages; k++)
            if (w->s->stages[k].replicas != 1)
                return err_set(err, PD_EINVAL,
                               "--wire delta keeps references per pair of stages: stage %d has %d replicas (delta needs "
                               "one each)", k, w->s->stages[k].replicas);
        if (cfg->train_n < (int64_t)B)
            return err_set(err, PD_EINVAL, "--wire delta: the training set's size (%lld samples) is not known here",
                           (long long)cfg->train_n);
        d->ref_bytes = kern_codec_bytes(&d->ref, m);
        d->store = calloc((size_t)cfg->train_n, d->ref_bytes);
        d->tmp = pd_alloc_f32(2 * m);
        if (!d->store) return err_set(err, PD_ENOMEM, "--wire delta: no memory for %lld references of %zu bytes",
                                      (long long)cfg->train_n, d->ref_bytes);
    }
    size_t big = d->wire == RT_WIRE_DELTA ? kern_codec_bytes(&i8, m) * B : kern_codec_bytes(&d->kc, d->n);
    d->cap = 4 * words(big);
    if (grad && sending && cfg->error_feedback) {
        d->n_ef = w->s->n_micro > 0 ? w->s->n_micro : 1;
        d->ef = calloc((size_t)d->n_ef, sizeof(float *));
        PD_ASSERT(d->ef);
        d->tmp = pd_alloc_f32(d->n);
    }
    return PD_OK;
}

int rt_wire_init(Worker *w, Err *err) {
    int rc = PD_OK;
    int first = w->stage == 0, last = w->stage == w->s->n_stages - 1;
    if (!first) {
        if ((rc = dir_init(w, &w->wire_ain, w->stage - 1, 0, 0, w->in_shape, err))) return rc;
        if ((rc = dir_init(w, &w->wire_gout, w->stage - 1, 1, 1, w->in_shape, err))) return rc;
    }
    if (!last) {
        if ((rc = dir_init(w, &w->wire_aout, w->stage, 0, 1, w->out_shape, err))) return rc;
        if ((rc = dir_init(w, &w->wire_gin, w->stage, 1, 0, w->out_shape, err))) return rc;
    }
    w->wire_epoch = UINT64_MAX;
    return PD_OK;
}

static void dir_release(RtWireDir *d) {
    free(d->store);
    pd_free(d->tmp);
    for (int k = 0; k < d->n_ef; k++) pd_free(d->ef[k]);
    free(d->ef);
    memset(d, 0, sizeof *d);
}

void rt_wire_release(Worker *w) {
    dir_release(&w->wire_ain), dir_release(&w->wire_aout), dir_release(&w->wire_gin), dir_release(&w->wire_gout);
    free(w->wire_order);
    w->wire_order = NULL;
}

/* delta: the dataset positions of unit u's samples (unit_batch of them), and its epoch. */
static const uint32_t *unit_positions(Worker *w, int64_t u, uint64_t *epoch) {
    const RtConfig *cfg = w->cfg;
    DataBatchPos p = data_batch_pos((size_t)cfg->train_n, cfg->unit_batch, 1, cfg->unit_base + (uint64_t)u);
    if (!w->wire_order) {
        w->wire_order = malloc((size_t)cfg->train_n * sizeof(uint32_t));
        PD_ASSERT(w->wire_order);
    }
    if (w->wire_epoch != p.epoch) {
        data_epoch_order((size_t)cfg->train_n, cfg->seed, p.epoch, 1, w->wire_order);
        w->wire_epoch = p.epoch;
    }
    *epoch = p.epoch;
    return w->wire_order + p.first;
}

/* Bytes of unit u's message of n floats under d (eval: an evaluation batch). */
static size_t msg_bytes(Worker *w, const RtWireDir *d, int64_t u, size_t n, int eval) {
    if (d->wire != RT_WIRE_DELTA) return kern_codec_bytes(&d->kc, n);
    if (eval) return kern_codec_bytes(&d->ref, n);
    const size_t B = (size_t)w->cfg->unit_batch, m = d->n / B;
    const uint64_t epoch = data_batch_pos((size_t)w->cfg->train_n, w->cfg->unit_batch, 1,
                                          w->cfg->unit_base + (uint64_t)u).epoch;
    return B * kern_codec_bytes(epoch == 0 ? &d->kc_first : &d->kc, m);
}

/* Evaluation sends bf16 activations as fp32 (as it always has). */
int rt_wire_plain(const RtWireDir *d, int eval) { return d->wire == RT_WIRE_FP32 || (eval && d->wire == RT_WIRE_BF16); }

Shape rt_wire_shape(Worker *w, const RtWireDir *d, Shape s, int64_t u, int eval) {
    if (rt_wire_plain(d, eval)) return s;
    return shape1((int)words(msg_bytes(w, d, u, shape_numel(s), eval)));
}

/* The key of unit u's stochastic rounding at d's boundary. */
static uint64_t msg_key(const Worker *w, const RtWireDir *d, int64_t u) {
    return (w->cfg->unit_base + (uint64_t)u) * (uint64_t)w->s->n_stages + (uint64_t)d->boundary;
}

const float *rt_wire_send(Worker *w, RtWireDir *d, int64_t u, const float *x, size_t n, uint8_t *buf, int eval) {
    const int act = d == &w->wire_aout;
    size_t bytes;
    PD_ASSERTF(eval ? n <= d->n : n == d->n, "a message of %zu values where %zu are expected", n, d->n);
    if (rt_wire_plain(d, eval)) {
        bytes = 4 * n;
    } else if (d->wire == RT_WIRE_DELTA && !eval) {
        const size_t B = (size_t)w->cfg->unit_batch, m = n / B;
        uint64_t epoch;
        const uint32_t *pos = unit_positions(w, u, &epoch);
        const KCodec *kc = epoch == 0 ? &d->kc_first : &d->kc;
        const size_t each = kern_codec_bytes(kc, m);
        for (size_t i = 0; i < B; i++)
            kern_codec_delta_send(kc, &d->ref, msg_key(w, d, u), x + i * m, m, d->store + (size_t)pos[i] * d->ref_bytes,
                                  buf + i * each, d->tmp);
        bytes = B * each;
    } else {
        const KCodec *kc = d->wire == RT_WIRE_DELTA ? &d->ref : &d->kc;
        PD_ASSERTF(!eval || !d->ef, "an evaluation gradient");
        int k = (int)((w->cfg->unit_base + (uint64_t)u) % (uint64_t)(d->n_ef ? d->n_ef : 1));
        if (d->ef && !d->ef[k]) d->ef[k] = pd_alloc_f32(n);   /* zeros */
        if (d->ef) kern_codec_ef_encode(kc, msg_key(w, d, u), x, d->ef[k], n, buf, d->tmp);
        else kern_codec_encode(kc, msg_key(w, d, u), x, n, buf);
        bytes = kern_codec_bytes(kc, n);
    }
    if (!eval) {
        double sent = 4.0 * (double)words(bytes);
        if (act) w->res->chunk_act_wire[w->ci] += sent, w->res->chunk_act_raw[w->ci] += 4.0 * (double)n;
        else w->res->chunk_grad_wire[w->ci] += sent, w->res->chunk_grad_raw[w->ci] += 4.0 * (double)n;
    }
    if (rt_wire_plain(d, eval)) return x;
    memset(buf + bytes, 0, 4 * words(bytes) - bytes);
    return (const float *)(const void *)buf;
}

void rt_wire_recv(Worker *w, RtWireDir *d, int64_t u, const uint8_t *buf, float *x, size_t n, int eval) {
    if (rt_wire_plain(d, eval)) return;
    if (d->wire == RT_WIRE_DELTA && !eval) {
        const size_t B = (size_t)w->cfg->unit_batch, m = d->n / B;
        uint64_t epoch;
        const uint32_t *pos = unit_positions(w, u, &epoch);
        const KCodec *kc = epoch == 0 ? &d->kc_first : &d->kc;
        const size_t each = kern_codec_bytes(kc, m);
        for (size_t i = 0; i < B; i++)
            kern_codec_delta_recv(kc, &d->ref, buf + i * each, m, d->store + (size_t)pos[i] * d->ref_bytes, x + i * m);
        return;
    }
    kern_codec_decode(d->wire == RT_WIRE_DELTA ? &d->ref : &d->kc, buf, n, x);
}
