/* rt_vstore.c: a stage's weight versions and staleness compensation. The version store holds
 * the versions its list reads (rt_vstore_plan sizes it from the schedule analysis), a step
 * writes the next one in place or beside a stashed one, and versions nobody reads again are
 * dropped; the weights a unit computes with are its version's, or with --staleness predict or
 * lookahead that version moved ahead (rt_forward_weights), shared by the units of one key. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rt_impl.h"

/* The store's plan from the schedule analysis (sched_analyze_worker, the one definition the
 * simulator predicts memory by): the last reader of every version, and as many buffers as
 * versions are ever alive at once under the rule vstore_* below apply (a step updates in
 * place unless the old newest is read later). The lists come from sched_build, which never
 * breaks the analysis's checks (step versions consecutive, reads of existing versions). */
void rt_vstore_plan(Worker *w) {
    SchedWorkerInfo wi;
    Err e = {0};
    int rc = sched_analyze_worker(w->s, w->rank, &wi, &e);
    PD_ASSERTF(rc == PD_OK, "%s", e.msg);
    free(w->last_read);
    free(w->delay);
    w->n_versions = wi.n_versions;
    w->last_read = wi.last_read;   /* taken over (malloc'd) */
    w->delay = wi.delay;           /* taken over */
    w->delay_max = wi.delay_max;
    w->n_vslots = wi.max_versions_alive;
    if (w->ci == 0) {   /* the list's figures, once per rank */
        w->res->n_delayed = wi.n_units;
        w->res->delay_sum = (long)(wi.delay_mean * wi.n_units + 0.5);
        w->res->delay_max = wi.delay_max;
    }
    /* predicted weights: one buffer per key in flight (grown, never shrunk, across lists) */
    int need = w->cfg->staleness & (RT_STALE_PREDICT | RT_STALE_LOOKAHEAD) ? wi.max_predicted : 0;
    if (need > w->n_pred) {
        w->pbuf = realloc(w->pbuf, (size_t)need * sizeof *w->pbuf);
        w->pver = realloc(w->pver, (size_t)need * sizeof(int));
        w->pdel = realloc(w->pdel, (size_t)need * sizeof(int));
        w->pstep = realloc(w->pstep, (size_t)need * sizeof(int));
        w->pref = realloc(w->pref, (size_t)need * sizeof(int));
        PD_ASSERT(w->pbuf && w->pver && w->pdel && w->pstep && w->pref);
        for (int k = w->n_pred; k < need; k++) w->pbuf[k] = pd_alloc_f32(w->np), w->pref[k] = 0;
        w->n_pred = need;
    }
    for (int k = 0; k < w->n_pred; k++) w->pref[k] = 0;
    wi.last_read = NULL, wi.delay = NULL;
    sched_worker_info_release(&wi);
}

float *rt_vstore_get(Worker *w, int version) {
    for (int k = 0; k < w->n_vslots; k++)
        if (w->vver[k] == version) return w->vbuf[k];
    PD_ASSERTF(0, "rank %d: weight version %d is not in the store (newest %d)", w->rank, version, w->newest);
    return NULL;
}

int rt_vstore_slot_of(Worker *w, int version) {
    for (int k = 0; k < w->n_vslots; k++)
        if (w->vver[k] == version) return k;
    return -1;
}

/* After instruction pc: drop versions older than the newest that nobody reads again. */
void rt_vstore_collect(Worker *w, int pc) {
    for (int k = 0; k < w->n_vslots; k++) {
        int v = w->vver[k];
        if (v >= 0 && v != w->newest && w->last_read[v] <= pc) w->vver[k] = -1;
    }
    int n = 0;
    for (int k = 0; k < w->n_vslots; k++) n += w->vver[k] >= 0;
    if (n > w->res->max_versions) w->res->max_versions = n;
}

/* lr-warmup: the factor on the scheduled lr of step t (0-based) of this stage. */
void rt_stale_lr_scale(Worker *w, long t) {
    if (w->cfg->staleness & RT_STALE_LR_WARMUP)
        w->opt.lr_scale = rt_stale_lr_factor(w->delay_max + 1, t, w->cfg->staleness_warmup);
}

/* The optimizer step writing version `to` from the newest and the accumulated gradient. */
void rt_vstore_step(Worker *w, int to, int pc) {
    PD_ASSERT(to == w->newest + 1);
    int old = rt_vstore_slot_of(w, w->newest);
    PD_ASSERT(old >= 0);
    int dst = old;
    if (w->last_read[w->newest] > pc) {   /* stashed: someone still reads the old version */
        dst = rt_vstore_slot_of(w, -1);
        PD_ASSERTF(dst >= 0, "rank %d: no free weight slot for version %d", w->rank, to);
        memcpy(w->vbuf[dst], w->vbuf[old], w->np * sizeof(float));
    }
    rt_stale_lr_scale(w, w->opt.step);
    if (w->np) optim_step(&w->opt, w->vbuf[dst], w->dw);
    w->vver[dst] = to;
    w->newest = to;
    if (w->np) model_grads_discard(w->m, w->first, w->last);   /* the next backward writes it */
}

/* ---- staleness compensation ------------------------------------------------------------- */

int rt_staleness_parse(const char *s, int *flags, Err *err) {
    static const struct { const char *name; int flag; } methods[] = {
        {"none", RT_STALE_NONE}, {"predict", RT_STALE_PREDICT}, {"lookahead", RT_STALE_LOOKAHEAD},
        {"lr-warmup", RT_STALE_LR_WARMUP}};
    *flags = 0;
    const char *p = s;
    do {
        size_t n = strcspn(p, "+");
        int found = -1;
        for (size_t k = 0; k < sizeof methods / sizeof methods[0]; k++)
            if (strlen(methods[k].name) == n && !strncmp(methods[k].name, p, n)) found = (int)k;
        if (found < 0 || (found == 0 && (p != s || p[n])))
            return err_set(err, PD_EINVAL, "--staleness %s: '%.*s' is not one of none, predict, lookahead, lr-warmup "
                           "(join methods with '+', e.g. predict+lr-warmup)", s, (int)n, p);
        *flags |= methods[found].flag;
        p += n;
    } while (*p++ == '+');
    if ((*flags & RT_STALE_PREDICT) && (*flags & RT_STALE_LOOKAHEAD))
        return err_set(err, PD_EINVAL, "--staleness %s: predict and lookahead both move the weights a unit reads; pick one", s);
    return PD_OK;
}

const char *rt_staleness_name(int flags, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s%s", flags & RT_STALE_PREDICT ? "predict" : "",
             flags & RT_STALE_LOOKAHEAD ? "lookahead" : "",
             (flags & RT_STALE_LR_WARMUP) && (flags & ~RT_STALE_LR_WARMUP) ? "+" : "",
             flags & RT_STALE_LR_WARMUP ? "lr-warmup" : "");
    if (!flags) snprintf(buf, n, "none");
    return buf;
}

int rt_staleness_default(SchedKind kind) {
    return kind == SCHED_1F1B || kind == SCHED_ASP ? RT_STALE_LOOKAHEAD
           : kind == SCHED_2BW                     ? RT_STALE_PREDICT
                                                   : RT_STALE_NONE;
}

double rt_stale_lr_factor(int D, long t, int K) {
    if (D <= 1) return 1.0;
    if (K <= 0) K = RT_STALE_WARMUP_STEPS;
    double f = (double)t / K;
    return pow((double)D, -(1.0 - (f < 1.0 ? f : 1.0)));
}

/* The weights unit sl (whose forward is instruction `in`) computes with: its version, or with
 * prediction or look-ahead and a delay d > 0, that version moved ahead along the optimizer's
 * last update, by d updates (predict) or by the momentum (lookahead), computed by the first
 * forward of its key (version, d, steps done) and shared by the units holding the key. */
const float *rt_forward_weights(Worker *w, Slot *sl, const Instr *in) {
    sl->pslot = -1;
    int d = w->delay[w->pc];
    const float *wv = rt_vstore_get(w, in->version);
    if (d <= 0 || !(w->cfg->staleness & (RT_STALE_PREDICT | RT_STALE_LOOKAHEAD)) || !w->np) return wv;
    int steps = (int)w->opt.step, k, free_k = -1;
    for (k = 0; k < w->n_pred; k++) {
        if (w->pref[k] && w->pver[k] == in->version && w->pdel[k] == d && w->pstep[k] == steps) break;
        if (!w->pref[k] && free_k < 0) free_k = k;
    }
    if (k == w->n_pred) {
        PD_ASSERTF(free_k >= 0, "rank %d: no free buffer for the predicted weights of unit %d", w->rank, in->mb);
        k = free_k;
        float scale = w->cfg->staleness & RT_STALE_PREDICT ? (float)d
                      : optim_is_adam(w->opt.c.kind) ? w->opt.c.beta1 : w->opt.c.momentum;
        optim_predict(&w->opt, wv, w->pbuf[k], scale);
        w->pver[k] = in->version, w->pdel[k] = d, w->pstep[k] = steps;
    }
    w->pref[k]++;
    sl->pslot = k;
    return w->pbuf[k];
}

/* The weights a unit's backward reads: those its forward used (weight stashing; predicted ones
 * included), or with --no-stash the newest. */
const float *rt_unit_weights(Worker *w, const Slot *sl, int version) {
    if (w->cfg->no_stash) return rt_vstore_get(w, w->newest);
    return sl->pslot >= 0 ? w->pbuf[sl->pslot] : rt_vstore_get(w, version);
}
