/* rt_result.c: a worker's figures (RtWorkerResult) as a training session moves them: added up
 * over segments (rt_result_add), packed into the bytes a worker sends to rank 0 and unpacked
 * there (rt_result_pack, rt_result_unpack), and released. */
#include <stdlib.h>
#include <string.h>

#include "rt_impl.h"
#include "rt_session.h"

/* Adds one segment's figures to the worker's totals (loss history and events moved to the
 * run's unit numbering and clock). */
void rt_result_add(RtWorkerResult *acc, RtWorkerResult *seg, uint64_t unit_base, double t_off) {
    acc->rank = seg->rank, acc->stage = seg->stage, acc->replica = seg->replica;
    acc->wall_s += seg->wall_s, acc->compute_s += seg->compute_s, acc->wait_s += seg->wait_s;
    acc->compute_cpu_s += seg->compute_cpu_s;
    acc->n_fwd += seg->n_fwd, acc->n_bwd += seg->n_bwd;
    acc->n_chunks = seg->n_chunks;
    for (int c = 0; c < RT_MAX_CHUNKS; c++)
        acc->chunk_compute_s[c] += seg->chunk_compute_s[c], acc->chunk_fwd[c] += seg->chunk_fwd[c],
        acc->chunk_cpu_s[c] += seg->chunk_cpu_s[c], acc->chunk_act_wire[c] += seg->chunk_act_wire[c],
        acc->chunk_act_raw[c] += seg->chunk_act_raw[c], acc->chunk_grad_wire[c] += seg->chunk_grad_wire[c],
        acc->chunk_grad_raw[c] += seg->chunk_grad_raw[c];
    acc->loss_sum += seg->loss_sum, acc->units_done += seg->units_done;
    if (seg->last_n && (!acc->last_n || seg->last_mb > acc->last_mb))
        acc->last_loss = seg->last_loss, acc->last_mb = seg->last_mb, acc->last_n = seg->last_n;
    if (seg->max_versions > acc->max_versions) acc->max_versions = seg->max_versions;
    acc->n_delayed += seg->n_delayed, acc->delay_sum += seg->delay_sum;
    acc->bytes_sent += seg->bytes_sent;
    acc->grad_norm_sum += seg->grad_norm_sum, acc->n_norms += seg->n_norms, acc->n_clipped += seg->n_clipped;
    if (seg->grad_norm_max > acc->grad_norm_max) acc->grad_norm_max = seg->grad_norm_max;
    if (seg->delay_max > acc->delay_max) acc->delay_max = seg->delay_max;
    if (seg->mem.total > acc->mem.total) acc->mem = seg->mem;
    if (seg->n_hist) {
        float *h = realloc(acc->hist, (size_t)(acc->n_hist + seg->n_hist) * 3 * sizeof(float));
        PD_ASSERT(h);
        acc->hist = h;
        for (int k = 0; k < seg->n_hist; k++) {
            float *d = &h[3 * (acc->n_hist + k)];
            memcpy(d, &seg->hist[3 * k], 3 * sizeof(float));
            d[0] += (float)unit_base;
        }
        acc->n_hist += seg->n_hist;
    }
    if (seg->n_events) {
        RtEvent *e = realloc(acc->events, (size_t)(acc->n_events + seg->n_events) * sizeof *e);
        PD_ASSERT(e);
        acc->events = e;
        for (int k = 0; k < seg->n_events; k++) {
            RtEvent x = seg->events[k];
            x.mb += (int)unit_base, x.t0 += t_off, x.t1 += t_off;
            e[acc->n_events + k] = x;
        }
        acc->n_events += seg->n_events;
    }
    rt_asp_acc_add(acc, seg);
    rt_result_release(seg);
}

/* The fixed part of a worker's figures on the wire (host byte order, as comm assumes). */
typedef struct Wire {
    int64_t rank, stage, replica, n_fwd, n_bwd, units_done, test_correct, test_total, max_versions, n_events,
        n_hist, crc, n_params, n_state;
    double wall_s, compute_s, wait_s, loss_sum, last_loss, test_loss_sum;
    RtMem mem;
    int64_t asp_applied, asp_staleness_max, asp_pulls;   /* asp (rt_asp.c) */
    double asp_staleness_mean, asp_pull_ms_mean, asp_pull_ms_max;
    int64_t n_chunks, chunk_fwd[RT_MAX_CHUNKS], chunk_crc[RT_MAX_CHUNKS];   /* several stages per rank */
    double chunk_compute_s[RT_MAX_CHUNKS];
    double cpu_s;
    int64_t pid, n_delayed, delay_sum, delay_max;   /* staleness: the delays its units crossed */
    double grad_norm_sum, grad_norm_max;             /* gradient clipping */
    int64_t n_norms, n_clipped;
    double bytes_sent;
    double compute_cpu_s, chunk_cpu_s[RT_MAX_CHUNKS];
    int64_t last_mb, last_n;
    double act_wire[RT_MAX_CHUNKS], act_raw[RT_MAX_CHUNKS], grad_wire[RT_MAX_CHUNKS], grad_raw[RT_MAX_CHUNKS];
} Wire;

char *rt_result_pack(const RtWorkerResult *a, size_t *n) {
    Wire x = {a->rank, a->stage, a->replica, a->n_fwd, a->n_bwd, a->units_done, a->test_correct, a->test_total,
              a->max_versions, a->n_events, a->n_hist, a->params_crc, (int64_t)a->n_params, (int64_t)a->n_state,
              a->wall_s, a->compute_s, a->wait_s, a->loss_sum, a->last_loss, a->test_loss_sum, a->mem,
              a->asp_applied, a->asp_staleness_max, a->asp_pulls, a->asp_staleness_mean, a->asp_pull_ms_mean,
              a->asp_pull_ms_max, a->n_chunks, {0}, {0}, {0}, a->cpu_s, a->pid, a->n_delayed, a->delay_sum,
              a->delay_max, a->grad_norm_sum, a->grad_norm_max, a->n_norms, a->n_clipped, a->bytes_sent,
              a->compute_cpu_s, {0}, a->last_mb, a->last_n, {0}, {0}, {0}, {0}};
    for (int c = 0; c < RT_MAX_CHUNKS; c++)
        x.chunk_fwd[c] = a->chunk_fwd[c], x.chunk_crc[c] = a->chunk_crc[c], x.chunk_compute_s[c] = a->chunk_compute_s[c],
        x.chunk_cpu_s[c] = a->chunk_cpu_s[c], x.act_wire[c] = a->chunk_act_wire[c], x.act_raw[c] = a->chunk_act_raw[c],
        x.grad_wire[c] = a->chunk_grad_wire[c], x.grad_raw[c] = a->chunk_grad_raw[c];
    size_t ne = (size_t)a->n_events, nh = (size_t)a->n_hist;
    *n = sizeof x + ne * sizeof(RtEvent) + nh * 3 * sizeof(float);
    char *buf = malloc(*n);
    PD_ASSERT(buf);
    memcpy(buf, &x, sizeof x);
    if (ne) memcpy(buf + sizeof x, a->events, ne * sizeof(RtEvent));
    if (nh) memcpy(buf + sizeof x + ne * sizeof(RtEvent), a->hist, nh * 3 * sizeof(float));
    return buf;
}

int rt_result_unpack(const void *buf, size_t n, int rank, RtWorkerResult *o, Err *err) {
    memset(o, 0, sizeof *o);
    Wire y;
    if (n < sizeof y) return err_set(err, PD_ECOMM, "results: rank %d sent %zu bytes", rank, n);
    memcpy(&y, buf, sizeof y);
    if (y.n_events < 0 || y.n_hist < 0 || y.n_events > (int64_t)(n / sizeof(RtEvent)) ||
        y.n_hist > (int64_t)(n / (3 * sizeof(float))) ||
        n != sizeof y + (size_t)y.n_events * sizeof(RtEvent) + (size_t)y.n_hist * 3 * sizeof(float))
        return err_set(err, PD_ECOMM, "results: rank %d sent %zu bytes for %lld events and %lld losses", rank, n,
                       (long long)y.n_events, (long long)y.n_hist);
    *o = (RtWorkerResult){.rank = (int)y.rank, .stage = (int)y.stage, .replica = (int)y.replica,
                          .n_params = (size_t)y.n_params, .n_state = (size_t)y.n_state,
                          .params_crc = (uint32_t)y.crc, .max_versions = (int)y.max_versions,
                          .loss_sum = y.loss_sum, .last_loss = y.last_loss, .units_done = (int)y.units_done,
                          .test_correct = y.test_correct, .test_total = y.test_total, .n_hist = (int)y.n_hist,
                          .wall_s = y.wall_s, .compute_s = y.compute_s, .wait_s = y.wait_s,
                          .n_fwd = (int)y.n_fwd, .n_bwd = (int)y.n_bwd, .n_events = (int)y.n_events,
                          .test_loss_sum = y.test_loss_sum, .mem = y.mem, .asp_applied = y.asp_applied,
                          .asp_staleness_max = (int)y.asp_staleness_max, .asp_pulls = y.asp_pulls,
                          .asp_staleness_mean = y.asp_staleness_mean, .asp_pull_ms_mean = y.asp_pull_ms_mean,
                          .asp_pull_ms_max = y.asp_pull_ms_max, .n_chunks = (int)y.n_chunks, .cpu_s = y.cpu_s,
                          .pid = y.pid, .n_delayed = (int)y.n_delayed, .delay_sum = (long)y.delay_sum,
                          .delay_max = (int)y.delay_max, .grad_norm_sum = y.grad_norm_sum,
                          .grad_norm_max = y.grad_norm_max, .n_norms = (int)y.n_norms, .n_clipped = (int)y.n_clipped,
                          .bytes_sent = y.bytes_sent, .compute_cpu_s = y.compute_cpu_s,
                          .last_mb = y.last_mb, .last_n = (int)y.last_n};
    for (int c = 0; c < RT_MAX_CHUNKS; c++)
        o->chunk_fwd[c] = (int)y.chunk_fwd[c], o->chunk_crc[c] = (uint32_t)y.chunk_crc[c],
        o->chunk_compute_s[c] = y.chunk_compute_s[c], o->chunk_cpu_s[c] = y.chunk_cpu_s[c],
        o->chunk_act_wire[c] = y.act_wire[c], o->chunk_act_raw[c] = y.act_raw[c], o->chunk_grad_wire[c] = y.grad_wire[c],
        o->chunk_grad_raw[c] = y.grad_raw[c];
    const char *p = (const char *)buf + sizeof y;
    if (y.n_events) {
        o->events = malloc((size_t)y.n_events * sizeof(RtEvent));
        PD_ASSERT(o->events);
        memcpy(o->events, p, (size_t)y.n_events * sizeof(RtEvent));
        p += (size_t)y.n_events * sizeof(RtEvent);
    }
    if (y.n_hist) {
        o->hist = malloc((size_t)y.n_hist * 3 * sizeof(float));
        PD_ASSERT(o->hist);
        memcpy(o->hist, p, (size_t)y.n_hist * 3 * sizeof(float));
    }
    return PD_OK;
}

void rt_result_release(RtWorkerResult *r) {
    if (!r) return;
    pd_free(r->params);
    pd_free(r->final.state);
    pd_free(r->final.opt_m);
    pd_free(r->final.opt_v);
    free(r->events);
    free(r->hist);
    memset(r, 0, sizeof *r);
}
