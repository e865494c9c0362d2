/* rt_record.c: what a running worker records for its result, whether rt_exec or asp runs it:
 * the trace events, the newest minibatch's loss, and the progress line on stderr. */
#include <stdio.h>
#include <stdlib.h>

#include "rt_impl.h"

void rt_trace_add(Worker *w, int op, int mb, int version, double t0, double t1) {
    RtWorkerResult *r = w->res;
    if (!w->cfg->trace) return;
    if (r->n_events == w->events_cap) {
        w->events_cap = w->events_cap ? 2 * w->events_cap : 256;
        RtEvent *ne = realloc(r->events, (size_t)w->events_cap * sizeof *ne);
        PD_ASSERT(ne);
        r->events = ne;
    }
    r->events[r->n_events++] = (RtEvent){op, mb, version, t0 - w->t_start, t1 - w->t_start};
}

void rt_progress(Worker *w, int u, int last, float loss) {
    double now = pd_now(), t0 = w->cfg->progress_t0 > 0 ? w->cfg->progress_t0 : w->t_start, el = now - t0;
    if (!last && now - w->last_progress < (w->cfg->progress == 1 ? 0.25 : 10.0)) return;
    w->last_progress = now;
    long total = w->cfg->units_total > 0 ? w->cfg->units_total : w->s->n_units;
    long done = (long)w->cfg->unit_base + u + 1;
    double rate = (double)(done - (long)w->cfg->progress_u0) * w->cfg->unit_batch / (el > 0 ? el : 1e-9);
    double eta = (double)w->cfg->unit_batch * (double)(total - done) / (rate > 0 ? rate : 1);
    fprintf(stderr, "%sunit %ld/%ld  loss %.4f  %.0f samples/s  elapsed %.0f s  ETA %.0f s%s",
            w->cfg->progress == 1 ? "\r" : "", done, total, (double)loss, rate, el, eta,
            w->cfg->progress == 1 && !last ? "   " : "\n");
    fflush(stderr);
}

void rt_last_loss_add(RtWorkerResult *r, int64_t mb, double loss) {
    if (r->last_n == 0 || mb > r->last_mb) r->last_mb = mb, r->last_loss = 0, r->last_n = 0;
    if (mb == r->last_mb) r->last_loss += loss, r->last_n++;
}
