/* rt_tie.c: tied parameters whose two layers run on different stages ("tie" in the model JSON,
 * nn.h). Each owner stage keeps its copy; at every optimizer step the two owners swap their
 * (replica-reduced) gradient for the tensor and both take g = g_source + g_mirror, the source
 * (lower) layer's first, so the same update leaves the copies bitwise equal. A tie inside one
 * stage is model_tie_fold's, in the step itself.
 *
 * Only the kinds whose stages step once per minibatch in lockstep (gpipe, 1f1b-flush, zb-h1,
 * zb-h2, model-parallel) may split a tie: step k of each stage then applies the same
 * minibatch's gradients. The asynchronous kinds step each stage at its own time, so a copy
 * would be updated from gradients of different weight versions than the other: refused.
 *
 * Messages: the lower stage sends its part as COMM_GRAD, the higher as COMM_ACT, both with
 * mb = the version the step writes; the pipeline never sends those kinds in those directions,
 * so they match nothing else. Replica r of a stage receives from replica r mod R' of the other
 * stage (R' its replicas) and sends to every replica q of it with q mod R = r. */
#include "rt_impl.h"

#include <stdlib.h>
#include <string.h>

struct RtTie {
    size_t lo, n;          /* the tensor in this stage's range (floats) */
    int is_src;            /* this stage holds the source (lower) layer */
    int from;              /* rank it receives the other part from */
    int *to, n_to;         /* ranks it sends its part to */
    float *sbuf, *rbuf;    /* (n): its part as sent, the other part */
    CommReq *rr, **rs;     /* the receive; the sends (n_to) */
    int posted;            /* this step's messages are posted (a blocked step comes back) */
};

static int stage_of(const Schedule *s, int layer) {
    for (int st = 0; st < s->n_stages; st++)
        for (int i = 0; i < s->stages[st].n_layers; i++)
            if (s->stages[st].layers[i] == layer) return st;
    return -1;
}

static int kind_steps_in_lockstep(SchedKind k) {
    return k == SCHED_GPIPE || k == SCHED_1F1B_FLUSH || k == SCHED_ZB_H1 || k == SCHED_ZB_H2 || k == SCHED_MP;
}

int rt_tie_init(Worker *w, Err *err) {
    int nt;
    const ParamTie *ties = model_ties(w->m, &nt);
    if (!nt) return PD_OK;
    const Schedule *s = w->s;
    int np;
    const ParamInfo *pt = model_param_tensors(w->m, &np);
    if (s->kind == SCHED_ASP)
        return err_set(err, PD_EINVAL, "%s: tied parameters (%s ties to %s) are not supported by asp",
                       model_name(w->m), pt[ties[0].dst].name, pt[ties[0].src].name);
    w->xtie = calloc((size_t)nt, sizeof *w->xtie);
    PD_ASSERT(w->xtie);
    size_t base = model_param_offset(w->m, w->first);
    for (int t = 0; t < nt; t++) {
        const ParamInfo *ps = &pt[ties[t].src], *pd = &pt[ties[t].dst];
        int ss = stage_of(s, ps->layer), sd = stage_of(s, pd->layer);
        if (ss == sd) continue;   /* one stage: model_tie_fold */
        int mine_src = ss == w->stage, mine_dst = sd == w->stage;
        if (!mine_src && !mine_dst) continue;
        if (s->n_chunks > 1)
            return err_set(err, PD_EINVAL, "%s: %s (stage %d) ties to %s (stage %d): schedule %s cannot split a tie "
                           "over stages; plan both layers onto one stage", model_name(w->m), pd->name, sd, ps->name, ss,
                           sched_kind_name(s->kind));
        if (!kind_steps_in_lockstep(s->kind))
            return err_set(err, PD_EINVAL, "%s: %s (stage %d) ties to %s (stage %d), but schedule %s steps its stages "
                           "at different times, so the two copies would diverge: use 1f1b-flush, gpipe, zb-h1, zb-h2 "
                           "or model-parallel, or plan both layers onto one stage", model_name(w->m), pd->name, sd,
                           ps->name, ss, sched_kind_name(s->kind));
        const ParamInfo *p = mine_src ? ps : pd;
        const SchedStage *me = &s->stages[w->stage], *other = &s->stages[mine_src ? sd : ss];
        int r = w->sw->replica;
        RtTie *x = &w->xtie[w->n_xtie++];
        x->lo = p->offset - base;
        x->n = shape_numel(p->shape);
        x->is_src = mine_src;
        x->from = other->ranks[r % other->replicas];
        x->to = calloc((size_t)other->replicas, sizeof(int));
        x->rs = calloc((size_t)other->replicas, sizeof(CommReq *));
        PD_ASSERT(x->to && x->rs);
        for (int q = 0; q < other->replicas; q++)
            if (q % me->replicas == r) x->to[x->n_to++] = other->ranks[q];
        x->sbuf = pd_alloc_f32(x->n);
        x->rbuf = pd_alloc_f32(x->n);
    }
    return PD_OK;
}

size_t rt_tie_bytes(const Worker *w) {
    size_t b = 0;
    for (int t = 0; t < w->n_xtie; t++) b += 2 * w->xtie[t].n * sizeof(float);
    return b;
}

void rt_tie_release(Worker *w) {
    for (int t = 0; t < w->n_xtie; t++) {
        RtTie *x = &w->xtie[t];
        comm_cancel(w->c, &x->rr);
        for (int k = 0; k < x->n_to; k++) comm_cancel(w->c, &x->rs[k]);
        free(x->to);
        free(x->rs);
        pd_free(x->sbuf);
        pd_free(x->rbuf);
    }
    free(w->xtie);
    w->xtie = NULL;
    w->n_xtie = 0;
}

int rt_tie_exchange(Worker *w, int version, int blocking, int *done, Err *err) {
    *done = 0;
    int rc = PD_OK;
    for (int t = 0; t < w->n_xtie && !rc; t++) {   /* post once per step (a blocked step comes back) */
        RtTie *x = &w->xtie[t];
        if (x->posted) continue;
        x->posted = 1;
        memcpy(x->sbuf, w->dw + x->lo, x->n * sizeof(float));
        CommKind out = x->is_src ? COMM_GRAD : COMM_ACT, in = x->is_src ? COMM_ACT : COMM_GRAD;
        rc = comm_irecv(w->c, x->from, in, version, shape1((int)x->n), x->rbuf, &x->rr, err);
        for (int k = 0; k < x->n_to && !rc; k++)
            rc = comm_isend(w->c, x->to[k], out, version, version, shape1((int)x->n), x->sbuf, &x->rs[k], err);
    }
    for (int t = 0; t < w->n_xtie && !rc; t++) {
        RtTie *x = &w->xtie[t];
        if (!x->rr) continue;
        if (blocking) {
            rc = comm_wait(w->c, &x->rr, w->cfg->recv_timeout_s, NULL, err);
        } else {
            int ok = 0;
            rc = comm_test(w->c, &x->rr, &ok, NULL, err);
            if (!rc && !ok) return PD_OK;   /* not yet: the step is tried again */
        }
    }
    if (rc) return err_prefix(err, "tied-parameter exchange of step %d", version);
    for (int t = 0; t < w->n_xtie && !rc; t++) {
        RtTie *x = &w->xtie[t];
        for (int k = 0; k < x->n_to && !rc; k++) rc = comm_wait(w->c, &x->rs[k], w->cfg->recv_timeout_s, NULL, err);
        x->posted = 0;
        float *g = w->dw + x->lo;
        const float *o = x->rbuf;
        if (x->is_src)
            for (size_t i = 0; i < x->n; i++) g[i] = g[i] + o[i];
        else
            for (size_t i = 0; i < x->n; i++) g[i] = o[i] + g[i];
    }
    if (rc) return err_prefix(err, "tied-parameter exchange of step %d", version);
    *done = 1;
    return PD_OK;
}
