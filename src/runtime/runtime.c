/* runtime.c: executes a worker's instruction list (schedule.h) with real layers, data and
 * messages. One Worker holds a stage's model range, its weight-version store, one slot per
 * unit in flight (activations context, gradient buffers, posted receives, pending sends)
 * and the optimizer. The same rt_exec drives the MPI/threads runs (blocking waits, real
 * all-reduce) and the serial emulation (non-blocking tests; the emulator performs
 * all-reduces itself in group rank order). Evaluation, asp, sessions (segments, checkpoints,
 * result gathering) and the CLI live elsewhere (rt_eval.c, rt_asp.c, rt_session.c, cli). */
#include "runtime.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "rt_impl.h"

/* ---- weight-version store -------------------------------------------------------------- */

/* The store's plan from the schedule analysis (sched_analyze_worker, the one definition the
 * simulator predicts memory by): the last reader of every version, and as many buffers as
 * versions are ever alive at once under the rule vstore_* below apply (a step updates in
 * place unless the old newest is read later). The lists come from sched_build, which never
 * breaks the analysis's checks (step versions consecutive, reads of existing versions). */
static void vstore_plan(Worker *w) {
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

static size_t split_floats(const Worker *w);

/* What the worker allocated for its stage, by category (RtMem): the version store, the
 * gradient and optimizer buffers, the running statistics and the activation slots (with,
 * for the zb kinds, the output gradients BI keeps for BW); the rank's kernel scratch is
 * worker_mem's. */
static void stage_mem(const Worker *w, RtMem *m) {
    size_t f = sizeof(float), B = (size_t)w->cfg->unit_batch, slot = 0;
    memset(m, 0, sizeof *m);
    if (w->stage < 0) return;
    m->versions = w->n_vslots;
    m->slots = w->n_slots;
    m->params = w->np * f;
    m->stashed = (size_t)(w->n_vslots - 1) * w->np * f;
    m->grads = w->np * f;
    m->opt_state = w->np * f * (w->opt.v ? 2 : 1);
    m->workspace = w->nst * f;
    if (w->n_slots) {
        const Slot *sl = &w->slots[0];
        slot = (w->recompute ? (shape_numel(w->in_shape) + shape_numel(w->out_shape)) * f : nnctx_bytes(sl->ctx)) +
               shape_numel(w->out_shape) * f + (sl->dx ? shape_numel(w->in_shape) * f : 0) +
               B * w->tlen * (f + sizeof(int32_t)) + (sl->keep ? split_floats(w) * f : 0);
    }
    m->activations = (size_t)w->n_slots * slot;
    if (w->recompute) {   /* the contexts lent from forward or recompute to backward */
        m->activations += (size_t)w->n_pool * nnctx_bytes(w->pool[0]);
        m->workspace += w->nst * f;   /* the recompute's scratch statistics */
    }
    m->comm = rt_tie_bytes(w);
    m->predicted = (size_t)w->n_pred * w->np * f;
    m->total = m->params + m->stashed + m->grads + m->opt_state + m->activations + m->comm + m->workspace + m->predicted;
}

/* The rank's allocation: its stages' summed (versions: per stage, the same for every chunk since
 * they share one list's versions; slots: all chunks'). */
static void worker_mem(Worker *w) {
    RtMem *m = &w->res->mem;
    stage_mem(w, m);
    for (int c = 1; c < w->n_chunk; c++) {
        RtMem x;
        stage_mem(w->chunk[c], &x);
        m->params += x.params, m->grads += x.grads, m->opt_state += x.opt_state, m->stashed += x.stashed;
        m->activations += x.activations, m->comm += x.comm, m->workspace += x.workspace, m->total += x.total;
        m->predicted += x.predicted;
        m->slots += x.slots;
    }
    /* the kernels' scratch of this thread: its chunks' layers share it (rt_worker_init let the
     * thread's earlier arena go before building) */
    m->scratch = kern_scratch_bytes();
    m->total += m->scratch;
}

static float *vstore_get(Worker *w, int version) {
    for (int k = 0; k < w->n_vslots; k++)
        if (w->vver[k] == version) return w->vbuf[k];
    PD_ASSERTF(0, "rank %d: weight version %d is not in the store (newest %d)", w->rank, version, w->newest);
    return NULL;
}

static int vstore_slot_of(Worker *w, int version) {
    for (int k = 0; k < w->n_vslots; k++)
        if (w->vver[k] == version) return k;
    return -1;
}

/* After instruction pc: drop versions older than the newest that nobody reads again. */
static void vstore_collect(Worker *w, int pc) {
    for (int k = 0; k < w->n_vslots; k++) {
        int v = w->vver[k];
        if (v >= 0 && v != w->newest && w->last_read[v] <= pc) w->vver[k] = -1;
    }
    int n = 0;
    for (int k = 0; k < w->n_vslots; k++) n += w->vver[k] >= 0;
    if (n > w->res->max_versions) w->res->max_versions = n;
}

/* lr-warmup: the factor on the scheduled lr of step t (0-based) of this stage. */
static void stale_lr_scale(Worker *w, long t) {
    if (w->cfg->staleness & RT_STALE_LR_WARMUP)
        w->opt.lr_scale = rt_stale_lr_factor(w->delay_max + 1, t, w->cfg->staleness_warmup);
}

/* The optimizer step writing version `to` from the newest and the accumulated gradient. */
static void vstore_step(Worker *w, int to, int pc) {
    PD_ASSERT(to == w->newest + 1);
    int old = vstore_slot_of(w, w->newest);
    PD_ASSERT(old >= 0);
    int dst = old;
    if (w->last_read[w->newest] > pc) {   /* stashed: someone still reads the old version */
        dst = vstore_slot_of(w, -1);
        PD_ASSERTF(dst >= 0, "rank %d: no free weight slot for version %d", w->rank, to);
        memcpy(w->vbuf[dst], w->vbuf[old], w->np * sizeof(float));
    }
    stale_lr_scale(w, w->opt.step);
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
static const float *forward_weights(Worker *w, Slot *sl, const Instr *in) {
    sl->pslot = -1;
    int d = w->delay[w->pc];
    const float *wv = vstore_get(w, in->version);
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
static const float *unit_weights(Worker *w, const Slot *sl, int version) {
    if (w->cfg->no_stash) return vstore_get(w, w->newest);
    return sl->pslot >= 0 ? w->pbuf[sl->pslot] : vstore_get(w, version);
}

/* ---- slots: one per unit in flight ------------------------------------------------------ */

/* Floats of a slot's keep buffer (zb kinds: what BI keeps for BW). */
static size_t split_floats(const Worker *w) {
    return model_split_floats(w->m, w->first, w->last, w->cfg->unit_batch);
}

/* How replicas combine gradients. 1f1b (one unit per minibatch), dp and model-parallel: each
 * replica's gradient is that of one whole minibatch, and a round of r minibatches makes one
 * step: the mean. The micro-batch kinds and 1f1b with micro-batches: replicas share one
 * minibatch's micro-batches, each already scaled by 1/n_micro: the sum is the minibatch's
 * mean gradient. */
static CommOp rt_allreduce_op(const Schedule *s) {
    return sched_splits_minibatch(s->kind, s->n_micro) ? COMM_SUM : COMM_MEAN;
}

/* ---- gradient buckets: all-reduce while backward runs ---------------------------------------- */

int rt_buckets(const Model *m, int first, int last, size_t bucket_bytes, int *layer, size_t *lo, size_t *n) {
    size_t cap = bucket_bytes ? bucket_bytes : RT_BUCKET_BYTES, base = model_param_offset(m, first);
    int nb = 0, end = last;
    for (int i = last - 1; i >= first; i--) {
        size_t floats = model_param_offset(m, end) - model_param_offset(m, i);
        if (floats * sizeof(float) >= cap || i == first) {
            if (floats) {
                layer[nb] = i;
                lo[nb] = model_param_offset(m, i) - base;
                n[nb] = floats;
                nb++;
            }
            end = i;
        }
    }
    return nb;
}

/* Starts the all-reduce of bucket b (idempotent). */
static int bucket_start(Worker *w, int b, Err *err) {
    if (w->bk_ar[b]) return PD_OK;
    return comm_group_iallreduce(w->group, w->dw + w->bk_lo[b], w->bk_n[b], rt_allreduce_op(w->s), &w->bk_ar[b], err);
}

typedef struct BkHook {
    Worker *w;
    Err *err;
    int rc;
} BkHook;

/* After top-level layer i's backward: every bucket whose layers are all done starts, and the
 * all-reduces in flight advance. */
static void bucket_hook(void *arg, int i) {
    BkHook *h = arg;
    Worker *w = h->w;
    if (h->rc) return;
    int any = -1;
    for (int b = 0; b < w->n_buckets && !h->rc; b++) {
        if (w->bk_layer[b] >= i) h->rc = bucket_start(w, b, h->err);
        if (w->bk_ar[b]) any = b;
    }
    int done;
    if (!h->rc && any >= 0) h->rc = comm_ar_test(w->bk_ar[any], &done, h->err);
}

/* The stage's all-reduce: buckets not started yet start now, then all complete in order. The
 * result is the same whether or not they overlapped the backward (same buckets, same order). */
static int bucket_allreduce(Worker *w, Err *err) {
    int rc = PD_OK;
    for (int b = 0; b < w->n_buckets && !rc; b++) rc = bucket_start(w, b, err);
    for (int b = 0; b < w->n_buckets && !rc; b++) rc = comm_ar_wait(&w->bk_ar[b], w->cfg->recv_timeout_s, err);
    for (int b = 0; b < w->n_buckets; b++) comm_ar_cancel(&w->bk_ar[b]);
    return rc;
}

/* True if the backward at pc is the last of its chunk before the chunk's all-reduce: the
 * chunk's all-reduce comes before the step, with no backward of the chunk between (other
 * chunks' instructions may: interleaved runs the later chunks' last backwards first, and each
 * chunk's buckets then reduce during the others' backwards). Its gradient is then final, so
 * the backward may start the buckets. */
static int last_backward_before_ar(const Worker *w, int pc) {
    const Instr *ins = w->sw->ins;
    const int c = ins[pc].chunk;
    for (int k = pc + 1; k < w->sw->n; k++) {
        int op = ins[k].op;
        if (op == OP_STEP) return 0;
        if (ins[k].chunk != c) continue;
        if (op == OP_ALLREDUCE) return 1;
        if (op == OP_BACKWARD || op == OP_BACKWARD_B || op == OP_BACKWARD_W) return 0;
    }
    return 0;
}

/* Completes a slot's pending sends (blocking, counted as waiting) so its buffers may be
 * reused. */
static int slot_drain(Worker *w, Slot *sl, Err *err) {
    CommReq **rq[3] = {&sl->s_act, &sl->s_grad, &sl->s_lab};
    double t0 = pd_now();
    int rc = PD_OK;
    for (int i = 0; i < 3 && !rc; i++) rc = comm_wait(w->c, rq[i], w->cfg->recv_timeout_s, NULL, err);
    if (w->res) w->res->wait_s += pd_now() - t0;
    return rc;
}

/* True if every send of the slot has completed (tests them; completes what is done). */
static int slot_sends_done(Worker *w, Slot *sl, Err *err, int *rc) {
    CommReq **rq[3] = {&sl->s_act, &sl->s_grad, &sl->s_lab};
    for (int i = 0; i < 3; i++) {
        int done = 1;
        if (*rq[i] && (*rc = comm_test(w->c, rq[i], &done, NULL, err)) != PD_OK) return 0;
        if (!done) return 0;
    }
    return 1;
}

static Slot *slot_find(Worker *w, int u) {
    for (int k = 0; k < w->n_slots; k++)
        if (w->slots[k].unit == u) return &w->slots[k];
    return NULL;
}

static Slot *slot_claim(Slot *f, int u) {
    f->unit = u;
    f->fused = 0;
    f->act_ready = f->grad_ready = f->lab_ready = 0;
    f->act_in = f->grad_in = 0;
    f->version = -1;
    f->pslot = -1;
    return f;
}

/* The slot of unit u, claiming a free one if u has none: preferably one whose sends have
 * completed, else (may_wait) the first free one after waiting for its sends. NULL if none is
 * free, or none is ready and !may_wait. */
static Slot *slot_for(Worker *w, int u, int may_wait, Err *err, int *rc) {
    *rc = PD_OK;
    Slot *sl = slot_find(w, u);
    if (sl) return sl;
    Slot *busy = NULL;
    for (int k = 0; k < w->n_slots; k++) {
        Slot *f = &w->slots[k];
        if (f->unit >= 0) continue;
        if (slot_sends_done(w, f, err, rc)) return slot_claim(f, u);
        if (*rc) return NULL;
        if (!busy) busy = f;
    }
    if (!busy || !may_wait) return NULL;
    if ((*rc = slot_drain(w, busy, err)) != PD_OK) return NULL;
    return slot_claim(busy, u);
}

static void slot_free(Slot *sl) { sl->unit = -1; }

/* Where a unit's stage input lives, and the output its activation send reads. */
static float *slot_in(const Worker *w, Slot *sl) { return w->recompute ? sl->in_buf : nnctx_input(sl->ctx); }
static const float *slot_out(const Worker *w, const Slot *sl) {
    return w->recompute && !sl->ctx ? sl->out_buf : nnctx_output(sl->ctx);
}

/* ---- the wire format (RtConfig.wire) ------------------------------------------------------- */
/* A message of n floats travels as n bf16 values in ceil(n / 2) float-sized words (the comm
 * layer moves bytes). The shape both ends post for it: */
static Shape wire_shape(const Worker *w, Shape s) {
    return w->cfg->wire == RT_WIRE_BF16 ? shape1((int)((shape_numel(s) + 1) / 2)) : s;
}

/* What a send of the n floats at x reads: x itself, or the slot's bf16 buffer packed from it. */
static const float *wire_out(const Worker *w, const float *x, uint16_t *packed, Shape s) {
    if (w->cfg->wire != RT_WIRE_BF16) return x;
    pd_bf16_pack(x, packed, shape_numel(s));
    return (const float *)(const void *)packed;
}

/* Where a receive of shape s lands: dst, or the slot's bf16 buffer (unpacked by wire_in). */
static float *wire_dst(const Worker *w, float *dst, uint16_t *packed) {
    return w->cfg->wire == RT_WIRE_BF16 ? (float *)(void *)packed : dst;
}

/* After a receive completed: widens the bf16 message into dst, once (*done). */
static void wire_in(const Worker *w, const uint16_t *packed, float *dst, Shape s, int *done) {
    if (w->cfg->wire != RT_WIRE_BF16 || *done) return;
    pd_bf16_unpack(packed, dst, shape_numel(s));
    *done = 1;
}

/* Recompute: lends a free pool context to the slot / takes it back. */
static int ctx_lend(Worker *w, Slot *sl, Err *err) {
    for (int k = 0; k < w->n_pool; k++)
        if (!w->pool_busy[k]) {
            w->pool_busy[k] = 1;
            sl->ctx = w->pool[k];
            return PD_OK;
        }
    return err_set(err, PD_EINVAL, "rank %d: unit %d needs an activation context, all %d are lent", w->rank, sl->unit,
                   w->n_pool);
}

static void ctx_return(Worker *w, Slot *sl) {
    if (!w->recompute || !sl->ctx) return;
    for (int k = 0; k < w->n_pool; k++)
        if (w->pool[k] == sl->ctx) w->pool_busy[k] = 0;
    sl->ctx = NULL;
}

/* Recompute: does the unit of the forward at pc keep its activations (its backward is this
 * worker's next compute instruction, so no recompute was scheduled)? */
static int keeps_activations(const Worker *w, int pc) {
    int u = w->sw->ins[pc].mb;
    for (int k = pc + 1; k < w->sw->n; k++) {
        const Instr *x = &w->sw->ins[k];
        if (!sched_op_computes(x->op)) continue;
        return x->mb == u && x->chunk == w->sw->ins[pc].chunk && (x->op == OP_BACKWARD || x->op == OP_BACKWARD_B);
    }
    return 0;
}

/* Posts the receives of instruction `in` if not posted yet (returns PD_OK if it cannot:
 * no free slot, it will be posted when executed). Ahead of its instruction it never waits: a
 * slot whose sends are still on the wire (a slow link) is not drained for it, since the rank
 * would stop there with the next instruction's input already in. */
static int post_recv(Worker *w, const Instr *in, int ahead, Err *err) {
    int rc;
    const Schedule *s = w->s;
    if (in->op == OP_RECV_ACT) {
        Slot *sl = slot_for(w, in->mb, !ahead, err, &rc);
        if (!sl) return rc;
        if (!sl->act_ready && !sl->r_act) {
            rc = comm_irecv(w->c, in->peer, COMM_ACT, rt_msg_id(s, in->mb, w->stage), wire_shape(w, w->in_shape),
                            wire_dst(w, slot_in(w, sl), sl->w_act_in), &sl->r_act, err);
            if (rc) return rc;
        }
        if (w->is_last && !w->is_input && !sl->lab_ready && !sl->r_lab) {
            int src = sched_rank_of(s, 0, in->mb);
            rc = comm_irecv(w->c, src, COMM_CTRL, in->mb, shape1(w->cfg->unit_batch * w->tlen), sl->labels_f, &sl->r_lab,
                            err);
            if (rc) return rc;
        }
    } else if (in->op == OP_RECV_GRAD) {
        Slot *sl = slot_find(w, in->mb);
        if (!sl) return PD_OK;   /* posted ahead of its forward: posted later */
        if (!sl->grad_ready && !sl->r_grad) {
            rc = comm_irecv(w->c, in->peer, COMM_GRAD, rt_msg_id(s, in->mb, w->stage + 1), wire_shape(w, w->out_shape),
                            wire_dst(w, sl->dy, sl->w_grad_in), &sl->r_grad, err);
            if (rc) return rc;
        }
    }
    return PD_OK;
}

/* Waits (blocking) or tests (non-blocking) one request; *ready set when complete. */
static int await(Worker *w, CommReq **rq, int *ready, int blocking, Err *err) {
    if (*ready) return PD_OK;
    if (!*rq) return PD_OK;
    int rc;
    if (blocking) {
        double t0 = pd_now();
        rc = comm_wait(w->c, rq, w->cfg->recv_timeout_s, NULL, err);
        w->res->wait_s += pd_now() - t0;
        if (rc) return rc;
        *ready = 1;
    } else {
        int done = 0;
        rc = comm_test(w->c, rq, &done, NULL, err);
        if (rc) return rc;
        if (done) *ready = 1;
    }
    return PD_OK;
}

static void trace_add(Worker *w, const Instr *in, double t0, double t1) {
    RtWorkerResult *r = w->res;
    if (!w->cfg->trace) return;
    if (r->n_events == w->events_cap) {
        w->events_cap = w->events_cap ? 2 * w->events_cap : 256;
        RtEvent *ne = realloc(r->events, (size_t)w->events_cap * sizeof *ne);
        PD_ASSERT(ne);
        r->events = ne;
    }
    r->events[r->n_events++] = (RtEvent){in->op, in->mb, in->version, t0 - w->t_start, t1 - w->t_start};
}

/* Fills the input (and labels) of unit u at the input stage from the data sampler. */
static int load_unit(Worker *w, Slot *sl, int u, Err *err) {
    int n = data_sampler_get(&w->sampler, w->cfg->unit_base + (uint64_t)u, slot_in(w, sl), sl->labels);
    if (n != w->cfg->unit_batch)
        return err_set(err, PD_EINVAL, "rank %d: unit %d has %d samples, expected %d", w->rank, u, n,
                       w->cfg->unit_batch);
    if (w->is_last) return PD_OK;
    for (int i = 0; i < n * w->tlen; i++) sl->labels_f[i] = (float)sl->labels[i];
    int dst = sched_rank_of(w->s, w->s->n_stages - 1, u);
    return comm_isend(w->c, dst, COMM_CTRL, u, 0, shape1(n * w->tlen), sl->labels_f, &sl->s_lab, err);
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

static int do_forward(Worker *w, const Instr *in, Err *err) {
    int rc;
    Slot *sl = slot_for(w, in->mb, 1, err, &rc);
    if (!sl) return rc ? rc : err_set(err, PD_EINVAL, "rank %d: no free slot for unit %d", w->rank, in->mb);
    if (w->is_input && (rc = load_unit(w, sl, in->mb, err))) return rc;
    if (w->is_last && !w->is_input)
        for (int i = 0; i < w->cfg->unit_batch * w->tlen; i++) sl->labels[i] = (int32_t)sl->labels_f[i];
    const float *wv = forward_weights(w, sl, in);
    NnRun run = {.n = w->cfg->unit_batch, .train = 1, .seed = w->cfg->seed,
                 .minibatch = w->cfg->unit_base + (uint64_t)in->mb};
    if (w->recompute && (rc = ctx_lend(w, sl, err))) return rc;
    const float *y = model_forward(w->m, sl->ctx, wv, w->state, slot_in(w, sl), &run);
    sl->version = in->version;
    /* recompute: keep only the input; R rebuilds the rest (the last stage's loss reads y first) */
    int drop = w->recompute && !keeps_activations(w, w->pc);
    if (drop && !w->is_last) {
        memcpy(sl->out_buf, y, shape_numel(w->out_shape) * sizeof(float));
        ctx_return(w, sl);
    }
    if (w->is_last) {
        int B = w->cfg->unit_batch, rows = B * w->tlen;   /* one row of logits per target */
        memset(sl->dy, 0, (size_t)rows * w->classes * sizeof(float));
        int correct = 0;
        float loss = kern_xent_fwd_bwd(y, sl->labels, sl->dy, rows, w->classes, 1.0f / (float)w->s->n_micro, &correct);
        if (!isfinite(loss) && w->cfg->nan_check != RT_NAN_OFF)
            return err_set(err, PD_EINVAL, "the loss is %g at minibatch %llu (unit %d of this run)", (double)loss,
                           (unsigned long long)(w->cfg->unit_base + (uint64_t)in->mb) / (unsigned)w->s->n_micro, in->mb);
        w->res->loss_sum += loss;
        float *h = &w->res->hist[3 * w->res->n_hist++];
        h[0] = (float)in->mb, h[1] = loss, h[2] = (float)correct / (float)rows;
        w->res->units_done++;
        if (w->cfg->progress && w->sw->replica == 0) rt_progress(w, in->mb, in->mb + 1 >= w->s->n_units, loss);
        rt_last_loss_add(w->res, (int64_t)((w->cfg->unit_base + (uint64_t)in->mb) / (unsigned)w->s->n_micro), loss);
        sl->grad_ready = 1;
        if (drop) ctx_return(w, sl);
    }
    w->res->n_fwd++;
    return PD_OK;
}

void rt_last_loss_add(RtWorkerResult *r, int64_t mb, double loss) {
    if (r->last_n == 0 || mb > r->last_mb) r->last_mb = mb, r->last_loss = 0, r->last_n = 0;
    if (mb == r->last_mb) r->last_loss += loss, r->last_n++;
}

/* Recompute: unit mb's forward again from its kept input, with its forward's version and
 * dropout key, into a lent context. Running statistics go to scratch: F updated the real ones. */
static int do_recompute(Worker *w, const Instr *in, Err *err) {
    Slot *sl = slot_find(w, in->mb);
    PD_ASSERTF(sl && sl->version == in->version, "rank %d: recompute of unit %d (version %d) without its forward",
               w->rank, in->mb, in->version);
    if (sl->ctx) return PD_OK;   /* kept */
    int rc = ctx_lend(w, sl, err);
    if (rc) return rc;
    if (w->nst) memcpy(w->state_scratch, w->state, w->nst * sizeof(float));
    NnRun run = {.n = w->cfg->unit_batch, .train = 1, .seed = w->cfg->seed,
                 .minibatch = w->cfg->unit_base + (uint64_t)in->mb};
    /* the forward's weights (so --no-stash keeps its forward's activations) */
    const float *wv = sl->pslot >= 0 ? w->pbuf[sl->pslot] : vstore_get(w, in->version);
    model_forward(w->m, sl->ctx, wv, w->state_scratch, slot_in(w, sl), &run);
    return PD_OK;
}

static int unit_done(Worker *w, Slot *sl, const Instr *in, Err *err);

/* B, or the zb kinds' BI (in->op == OP_BACKWARD_B): the input gradient, and the weight
 * gradient of the layers that do not split; the unit then keeps its slot until its BW. */
static int do_backward(Worker *w, const Instr *in, Err *err) {
    int half = in->op == OP_BACKWARD_B;
    Slot *sl = slot_find(w, in->mb);
    PD_ASSERTF(sl && sl->grad_ready, "rank %d: backward of unit %d before its gradient", w->rank, in->mb);
    PD_ASSERTF(sl->version == in->version, "rank %d: unit %d forward used version %d, backward asks %d", w->rank,
               in->mb, sl->version, in->version);
    int rc = comm_wait(w->c, &sl->s_act, w->cfg->recv_timeout_s, NULL, err);   /* output no longer sent */
    if (rc) return rc;
    /* weight stashing: the weights its forward used; --no-stash (an ablation): the newest */
    const float *wv = unit_weights(w, sl, in->version);
    float *dx = NULL;
    if (!w->is_input) {
        dx = sl->dx;
        memset(dx, 0, shape_numel(w->in_shape) * sizeof(float));
    }
    /* A BI whose BW is the very next instruction (the input stage of zb-h1, which sends no
     * gradient back and defers nothing) runs the whole backward at once: the same numbers
     * (model_backward_b + model_backward_w are bitwise model_backward), without keeping the
     * output gradients in memory in between or the split's second relu mask. */
    sl->fused = half && sched_bw_follows(w->sw, w->pc);
    if (half && !sl->fused) {   /* BW follows later: no bucket may start before it */
        model_backward_b(w->m, sl->ctx, wv, sl->dy, dx, w->dw, sl->keep);
        w->res->n_bwd++;
        return PD_OK;
    }
    if (sl->fused) {   /* the buckets start with the layers' weight gradients, as in BW */
        w->res->n_bwd++;
        if (w->group && w->n_buckets && last_backward_before_ar(w, w->pc + 1)) {
            BkHook h = {w, err, PD_OK};
            model_backward_hook(w->m, sl->ctx, wv, sl->dy, dx, w->dw, bucket_hook, &h);
            return h.rc;
        }
        model_backward(w->m, sl->ctx, wv, sl->dy, dx, w->dw);
        return PD_OK;
    }
    if (w->group && w->n_buckets && last_backward_before_ar(w, w->pc)) {
        BkHook h = {w, err, PD_OK};
        model_backward_hook(w->m, sl->ctx, wv, sl->dy, dx, w->dw, bucket_hook, &h);
        if (h.rc) return h.rc;
    } else {
        model_backward(w->m, sl->ctx, wv, sl->dy, dx, w->dw);
    }
    w->res->n_bwd++;
    return unit_done(w, sl, in, err);
}

/* After a unit's last backward op (B, or BW): its activations go back to the pool
 * (recompute), the gradient is checked (--nan-check all), and the slot is free: at the input
 * stage, which sends nothing back, once its sends have completed (its activation has been
 * received, since its gradient came back); elsewhere SG frees it, or BW, which comes after SG,
 * without waiting for the gradient's send to complete (the previous stage may not have posted
 * its receive yet; slot_for completes it before the slot is reused). */
static int unit_done(Worker *w, Slot *sl, const Instr *in, Err *err) {
    ctx_return(w, sl);
    if (sl->pslot >= 0) {   /* its predicted weights: one holder fewer */
        w->pref[sl->pslot]--;
        sl->pslot = -1;
    }
    if (w->cfg->nan_check == RT_NAN_ALL)
        for (size_t i = 0; i < w->np; i++)
            if (!isfinite(w->dw[i]))
                return err_set(err, PD_EINVAL,
                               "gradient of parameter %zu of the stage is %g after minibatch %llu", i, (double)w->dw[i],
                               (unsigned long long)(w->cfg->unit_base + (uint64_t)in->mb) / (unsigned)w->s->n_micro);
    if (w->is_input) {
        int rc = slot_drain(w, sl, err);
        if (rc) return rc;
        slot_free(sl);
    } else if (in->op == OP_BACKWARD_W) {
        slot_free(sl);
    }
    return PD_OK;
}

/* The zb kinds' BW: the weight gradient of the splitting layers from what the unit's BI kept
 * (its activations and slot->keep), with the version its F and BI read; the unit leaves
 * flight. When it is the last compute before the all-reduce, gradient buckets start as its
 * layers finish, as after a whole backward. */
static int do_backward_w(Worker *w, const Instr *in, Err *err) {
    Slot *sl = slot_find(w, in->mb);
    PD_ASSERTF(sl && sl->version == in->version, "rank %d: weight pass of unit %d (version %d) without its forward",
               w->rank, in->mb, in->version);
    const float *wv = unit_weights(w, sl, in->version);
    if (sl->fused) {   /* its BI ran the whole backward */
        sl->fused = 0;
    } else if (w->group && w->n_buckets && last_backward_before_ar(w, w->pc)) {
        BkHook h = {w, err, PD_OK};
        model_backward_w(w->m, sl->ctx, wv, sl->dy, sl->keep, w->dw, bucket_hook, &h);
        if (h.rc) return h.rc;
    } else {
        model_backward_w(w->m, sl->ctx, wv, sl->dy, sl->keep, w->dw, NULL, NULL);
    }
    w->res->n_wgrad++;
    return unit_done(w, sl, in, err);
}

/* The Worker of the stage an instruction is for (chunk 0 owns the list; see rt_impl.h), told
 * where the list stands. */
static Worker *chunk_of(Worker *w, const Instr *in) {
    if (!w->chunk) return w;
    PD_ASSERTF(in->chunk >= 0 && in->chunk < w->n_chunk, "rank %d: instruction for chunk %d of %d", w->rank, in->chunk,
               w->n_chunk);
    Worker *x = w->chunk[in->chunk];
    x->pc = w->pc;
    x->t_start = w->t_start;
    return x;
}

/* Global gradient-norm clipping before a step (RtConfig.opt.clip_norm; only where every
 * stage's step applies the same minibatch's gradient, rt_clip_allowed): replica 0 of every stage
 * contributes its sum of squares, split into two floats (high part, remainder) at the stage's
 * place in a vector of 2 n_stages that all ranks sum; every place has one non-zero contributor,
 * so the sum is exact in any order, and every rank adds the places in stage order: all ranks
 * get the same factor, the one-worker run's up to rounding. */
static int clip_gradients(Worker *w, Err *err) {
    const Schedule *s = w->s;
    if (!w->clip_buf) w->clip_buf = malloc(2 * (size_t)s->n_stages * sizeof(float));
    PD_ASSERT(w->clip_buf);
    float *v = w->clip_buf;
    memset(v, 0, 2 * (size_t)s->n_stages * sizeof(float));
    for (int c = 0; c < w->n_chunk; c++) {
        Worker *y = rt_chunk(w, c);
        if (s->stages[y->stage].ranks[0] != w->rank) continue;   /* replicas hold the same sum */
        /* a tied tensor counts once: not its mirror (model_tie_mirror_sumsq) */
        double ss = optim_sumsq(y->dw, y->np) - model_tie_mirror_sumsq(y->m, y->first, y->last, y->dw);
        if (ss < 0.0) ss = 0.0;
        v[2 * y->stage] = (float)ss;
        v[2 * y->stage + 1] = (float)(ss - (double)(float)ss);
    }
    if (w->everyone) {
        double a0 = pd_now();
        int rc = comm_group_allreduce(w->everyone, v, 2 * (size_t)s->n_stages, COMM_SUM, err);
        w->res->wait_s += pd_now() - a0;
        if (rc) return rc;
    }
    double total = 0.0;
    for (int st = 0; st < s->n_stages; st++) total += (double)v[2 * st] + (double)v[2 * st + 1];
    float coef = optim_clip_coef(total, w->cfg->opt.clip_norm);
    for (int c = 0; c < w->n_chunk; c++) {
        Worker *y = rt_chunk(w, c);
        optim_scale(y->dw, y->np, coef);
    }
    w->res->grad_norm_sum += sqrt(total);
    if (sqrt(total) > w->res->grad_norm_max) w->res->grad_norm_max = sqrt(total);
    w->res->n_norms++;
    w->res->n_clipped += coef < 1.0f;
    return PD_OK;
}

/* Executes instructions from w->pc until the list ends (RT_DONE), a receive is not ready in
 * non-blocking mode (RT_BLOCKED), or, in emulation, an all-reduce is reached (RT_AT_AR: the
 * emulator performs it and advances pc). Errors return RT_ERR with err set. Each instruction
 * runs on the Worker of its chunk (x; w itself with one stage); a step steps every chunk. */
int rt_exec(Worker *w, int blocking, Err *err) {
    const SchedWorker *sw = w->sw;
    while (w->pc < sw->n) {
        const Instr *in = &sw->ins[w->pc];
        Worker *x = chunk_of(w, in);
        double t0 = pd_now(), c0 = t0, q0 = pd_thread_cpu();
        int rc = PD_OK, computes = 0;
        Slot *sl;
        switch ((InstrOp)in->op) {
        case OP_RECV_ACT:
            if ((rc = post_recv(x, in, 0, err))) break;
            sl = slot_find(x, in->mb);
            if (!sl) {
                if (!blocking) return RT_BLOCKED;
                rc = err_set(err, PD_EINVAL, "rank %d: no free slot to receive unit %d", w->rank, in->mb);
                break;
            }
            if ((rc = await(x, &sl->r_act, &sl->act_ready, blocking, err))) break;
            if ((rc = await(x, &sl->r_lab, &sl->lab_ready, blocking, err))) break;
            if (!sl->act_ready || (x->is_last && !x->is_input && !sl->lab_ready)) return RT_BLOCKED;
            wire_in(x, sl->w_act_in, slot_in(x, sl), x->in_shape, &sl->act_in);
            break;
        case OP_RECV_GRAD:
            if ((rc = post_recv(x, in, 0, err))) break;
            sl = slot_find(x, in->mb);
            PD_ASSERTF(sl, "rank %d: gradient for unit %d without its forward", w->rank, in->mb);
            if ((rc = await(x, &sl->r_grad, &sl->grad_ready, blocking, err))) break;
            if (!sl->grad_ready) return RT_BLOCKED;
            wire_in(x, sl->w_grad_in, sl->dy, x->out_shape, &sl->grad_in);
            break;
        case OP_FORWARD:
            rc = do_forward(x, in, err);
            computes = 1;
            w->res->chunk_fwd[in->chunk]++;
            break;
        case OP_BACKWARD:
        case OP_BACKWARD_B:
            rc = do_backward(x, in, err);
            computes = 1;
            break;
        case OP_BACKWARD_W:
            rc = do_backward_w(x, in, err);
            computes = 1;
            break;
        case OP_SEND_ACT:
            sl = slot_find(x, in->mb);
            PD_ASSERT(sl);
            rc = comm_isend(x->c, in->peer, COMM_ACT, rt_msg_id(x->s, in->mb, x->stage + 1), sl->version,
                            wire_shape(x, x->out_shape), wire_out(x, slot_out(x, sl), sl->w_act_out, x->out_shape),
                            &sl->s_act, err);
            break;
        case OP_SEND_GRAD:
            sl = slot_find(x, in->mb);
            PD_ASSERT(sl);
            rc = comm_isend(x->c, in->peer, COMM_GRAD, rt_msg_id(x->s, in->mb, x->stage), sl->version,
                            wire_shape(x, x->in_shape), wire_out(x, sl->dx, sl->w_grad_out, x->in_shape), &sl->s_grad,
                            err);
            /* its buffers stay untouched until the send completes (slot_drain); a split
             * backward's unit stays until its BW */
            if (!x->split) slot_free(sl);
            break;
        case OP_ALLREDUCE:
            if (x->np) model_grads_settle(x->m, x->first, x->last, x->dw);   /* read whole from here */
            if (!x->group) return RT_AT_AR;
            if (x->np) {
                double a0 = pd_now();
                rc = bucket_allreduce(x, err);
                w->res->wait_s += pd_now() - a0;
            }
            break;
        case OP_RECOMPUTE:
            rc = do_recompute(x, in, err);
            computes = 1;
            break;
        case OP_STEP:   /* every chunk: they share the list's versions */
            for (int c = 0; c < w->n_chunk; c++) {   /* the gradients are read whole from here */
                Worker *y = rt_chunk(w, c);
                if (y->np) model_grads_settle(y->m, y->first, y->last, y->dw);
            }
            if (w->n_xtie) {   /* tied parameters split over stages: the other owner's gradient first */
                double a0 = pd_now();
                int ready = 0;
                rc = rt_tie_exchange(w, in->version, blocking, &ready, err);
                w->res->wait_s += pd_now() - a0;
                if (rc) break;
                if (!ready) return RT_BLOCKED;
                c0 = pd_now();
                q0 = pd_thread_cpu();
            }
            for (int c = 0; c < w->n_chunk; c++) {   /* ties inside a stage: one summed gradient */
                Worker *y = rt_chunk(w, c);
                if (y->np) model_tie_fold(y->m, y->first, y->last, y->dw);
            }
            if (w->cfg->opt.clip_norm > 0.0f && (rc = clip_gradients(w, err))) break;
            for (int c = 0; c < w->n_chunk; c++) {
                Worker *y = rt_chunk(w, c);
                double s0 = pd_now(), u0 = pd_thread_cpu();
                vstore_step(y, in->version, w->pc);
                w->res->chunk_compute_s[c] += pd_now() - s0;
                w->res->chunk_cpu_s[c] += pd_thread_cpu() - u0;
            }
            w->res->compute_s += pd_now() - c0;
            w->res->compute_cpu_s += pd_thread_cpu() - q0;
            break;
        case OP_FLUSH:
            for (int c = 0; c < w->n_chunk; c++) {
                Worker *y = rt_chunk(w, c);
                for (int k = 0; k < y->n_slots; k++)
                    PD_ASSERTF(y->slots[k].unit < 0 || y->slots[k].version < 0, "rank %d: unit %d of stage %d in flight at a flush",
                               w->rank, y->slots[k].unit, y->stage);
            }
            break;
        default:   /* not an instruction of any list sched_build makes */
            rc = err_set(err, PD_EINVAL, "the runtime does not execute %s instructions", sched_op_name((InstrOp)in->op));
        }
        if (computes) {
            double dt = pd_now() - c0, dq = pd_thread_cpu() - q0;
            w->res->compute_s += dt;
            w->res->chunk_compute_s[in->chunk] += dt;
            w->res->compute_cpu_s += dq;
            w->res->chunk_cpu_s[in->chunk] += dq;
        }
        if (rc) {
            char t[64];
            err_prefix(err, "rank %d (stage %d), instruction %d (%s)", w->rank, x->stage, w->pc,
                       sched_instr_str(in, 1, t, sizeof t));
            return RT_ERR;
        }
        trace_add(w, in, t0, pd_now());
        for (int c = 0; c < w->n_chunk; c++) vstore_collect(rt_chunk(w, c), w->pc);
        w->pc++;
        /* Post the receives of the next few instructions ahead, so they overlap compute. Units
         * take slots in the order of their receives: one that gets none now stops the posting,
         * or a later unit could take the slot it will need. */
        for (int k = w->pc, seen = 0; k < sw->n && seen < 4; k++) {
            const Instr *nx = &sw->ins[k];
            if (nx->op != OP_RECV_ACT && nx->op != OP_RECV_GRAD) continue;
            seen++;
            Worker *y = rt_chunk(w, nx->chunk);
            if ((rc = post_recv(y, nx, 1, err))) {
                char t[64];
                err_prefix(err, "rank %d (stage %d), posting instruction %d (%s) ahead", w->rank,
                           sched_instr_stage(sw, nx), k, sched_instr_str(nx, 1, t, sizeof t));
                return RT_ERR;
            }
            if (nx->op == OP_RECV_ACT && !slot_find(y, nx->mb)) break;
        }
    }
    return RT_DONE;
}

/* ---- worker set-up ---------------------------------------------------------------------- */

static void worker_warmup(Worker *w);
static void stage_release(Worker *w);

/* Activation slots and contexts of chunk c of a rank: its most units in flight (with full
 * activations) + SCHED_SLOTS_AHEAD, from the analysis's per-chunk counts. With one chunk these
 * are SchedWorkerInfo's n_slots and max_full. */
static void chunk_slots(const Schedule *s, int rank, const SchedWorkerInfo *wi, int c, int *n_slots, int *max_full) {
    if (wi->n_chunks <= 1) {
        *n_slots = wi->n_slots, *max_full = wi->max_full;
        return;
    }
    int n = s->workers[rank].n, nc = wi->n_chunks;
    int *fly = malloc(((size_t)n * nc + 1) * sizeof(int)), *full = malloc(((size_t)n * nc + 1) * sizeof(int));
    PD_ASSERT(fly && full);
    sched_worker_counts_chunks(s, rank, wi, NULL, fly, full);
    int mi = 0, mf = 0;
    for (int i = 0; i < n; i++) {
        if (fly[(size_t)i * nc + c] > mi) mi = fly[(size_t)i * nc + c];
        if (full[(size_t)i * nc + c] > mf) mf = full[(size_t)i * nc + c];
    }
    free(fly), free(full);
    *n_slots = mi + SCHED_SLOTS_AHEAD, *max_full = mf;
}

/* Builds w (cfg, s, c, rank, res, sw set) for its stage: chunk ci of the rank. lead: chunk 0,
 * whose Model it borrows (NULL for chunk 0 itself). p_off, s_off: where its parameters and
 * running statistics start in the rank's RtStageState (its chunks' ranges, concatenated). */
static int stage_init(Worker *w, const Worker *lead, size_t p_off, size_t s_off, Err *err) {
    const RtConfig *cfg = w->cfg;
    const Schedule *s = w->s;
    RtWorkerResult *res = w->res;
    int rank = w->rank;
    const SchedStage *st = &s->stages[w->stage];
    w->is_input = w->stage == 0;
    w->is_last = w->stage == s->n_stages - 1;
    w->first = st->layers[0];
    w->last = st->layers[st->n_layers - 1] + 1;
    for (int i = 1; i < st->n_layers; i++)
        if (st->layers[i] != st->layers[i - 1] + 1)
            return err_set(err, PD_EINVAL, "stage %d: layers are not contiguous (%d after %d)", w->stage,
                           st->layers[i], st->layers[i - 1]);
    if (lead) {
        w->m = lead->m;
        w->m_borrowed = 1;
    } else if (cfg->model) {
        w->m = cfg->model;
        w->m_borrowed = 1;
    } else if (!(w->m = model_load(cfg->model_path, err))) {
        return err->code;
    }
    int nl = model_n_layers(w->m);
    if (w->last > nl)
        return err_set(err, PD_EINVAL, "%s: the plan's stage %d runs layer %d, the model has %d layers",
                       cfg->model_path, w->stage, w->last - 1, nl);
    int B = cfg->unit_batch;
    model_set_precision(w->m, cfg->precision);
    int rc = model_build(w->m, w->first, w->last, B, err);
    if (rc) return rc;
    Shape ins = model_layer_in_shape(w->m, w->first), outs = model_layer_out_shape(w->m, w->last - 1);
    w->in_shape.ndim = ins.ndim + 1;
    w->in_shape.d[0] = B;
    for (int i = 0; i < ins.ndim; i++) w->in_shape.d[i + 1] = ins.d[i];
    w->out_shape.ndim = outs.ndim + 1;
    w->out_shape.d[0] = B;
    for (int i = 0; i < outs.ndim; i++) w->out_shape.d[i + 1] = outs.d[i];
    int K = 0;
    w->tlen = model_loss_positions(w->m, &K);   /* the whole model's output decides the loss */
    if (w->is_last) {
        if (outs.ndim < 1 || outs.ndim > 2 || outs.d[outs.ndim - 1] != K)
            return err_set(err, PD_EINVAL, "%s: the last layer's output is not logits, (classes) or (positions, classes)",
                           cfg->model_path);
        w->classes = K;
    }
    if (w->is_input) {
        if (!cfg->train) return err_set(err, PD_EINVAL, "rank %d: the input stage has no training data", rank);
        Shape mi = model_input_shape(w->m);
        if (data_targets(cfg->train) != w->tlen)
            return err_set(err, PD_EINVAL, "the data has %d targets per sample, the model's loss %d", data_targets(cfg->train),
                           w->tlen);
        if ((size_t)cfg->train->c * cfg->train->h * cfg->train->w != shape_numel(mi))
            return err_set(err, PD_EINVAL, "the data's samples (%dx%dx%d) do not fit the model input (%zu values)",
                           cfg->train->c, cfg->train->h, cfg->train->w, shape_numel(mi));
        rc = data_sampler_init(&w->sampler, cfg->train, B, cfg->seed, 1, 1, err);
        if (rc) return rc;
        w->has_sampler = 1;
    }
    /* parameters: version 0 = the init of the whole model's layers in this range */
    w->np = model_param_count(w->m, w->first, w->last);
    w->nst = model_state_count(w->m, w->first, w->last);
    vstore_plan(w);
    w->vbuf = calloc((size_t)w->n_vslots, sizeof(float *));
    w->vver = malloc((size_t)w->n_vslots * sizeof(int));
    PD_ASSERT(w->vbuf && w->vver);
    for (int k = 0; k < w->n_vslots; k++) {
        w->vbuf[k] = pd_alloc_f32(w->np);
        w->vver[k] = -1;
    }
    w->vver[0] = 0;
    w->newest = 0;
    w->state = pd_alloc_f32(w->nst);
    w->dw = pd_alloc_f32(w->np);
    int nl_range = w->last - w->first;
    w->bk_layer = malloc((size_t)nl_range * sizeof(int));
    w->bk_lo = malloc((size_t)nl_range * sizeof(size_t));
    w->bk_n = malloc((size_t)nl_range * sizeof(size_t));
    PD_ASSERT(w->bk_layer && w->bk_lo && w->bk_n);
    w->n_buckets = rt_buckets(w->m, w->first, w->last, cfg->bucket_bytes, w->bk_layer, w->bk_lo, w->bk_n);
    w->bk_ar = calloc((size_t)(w->n_buckets ? w->n_buckets : 1), sizeof(CommAr *));
    PD_ASSERT(w->bk_ar);
    OptConfig oc = cfg->opt;
    if (oc.decay_steps <= 0) oc.decay_steps = rt_run_steps(s, w->stage, cfg->run_minibatches);
    optim_init(&w->opt, &oc, w->np);
    const RtStageState *from = cfg->init ? &cfg->init[rank] : NULL;
    if (from && from->params) {   /* continue: weights, running statistics, optimizer state */
        memcpy(w->vbuf[0], from->params + p_off, w->np * sizeof(float));
        if (w->nst) memcpy(w->state, from->state + s_off, w->nst * sizeof(float));
        if (w->np && from->opt_m) memcpy(w->opt.m, from->opt_m + p_off, w->np * sizeof(float));
        if (w->np && w->opt.v && from->opt_v) memcpy(w->opt.v, from->opt_v + p_off, w->np * sizeof(float));
        w->opt.step = from->opt_step;
        if (w->opt.step > 0) stale_lr_scale(w, w->opt.step - 1);   /* the last step's, for prediction */
    } else {
        model_init_params(w->m, w->first, w->last, cfg->seed, w->vbuf[0]);
        model_init_state(w->m, w->first, w->last, w->state);
    }
    if (w->is_last) {
        int nf = 0;
        for (int i = 0; i < w->sw->n; i++) nf += w->sw->ins[i].op == OP_FORWARD;
        res->hist = malloc(((size_t)nf * 3 + 1) * sizeof(float));
        PD_ASSERT(res->hist);
    }
    /* slots: most units in flight + those received ahead (SchedWorkerInfo.n_slots) */
    SchedWorkerInfo wi;
    if ((rc = sched_analyze_worker(s, rank, &wi, err))) return rc;
    int max_full;
    chunk_slots(s, rank, &wi, w->ci, &w->n_slots, &max_full);
    w->recompute = s->recompute;
    w->split = sched_splits_backward(s);
    w->n_pool = w->recompute ? (max_full > 0 ? max_full : 1) : 0;
    sched_worker_info_release(&wi);
    if (w->recompute) {   /* max_full contexts for the whole range; slots keep inputs and outputs */
        w->pool = calloc((size_t)w->n_pool, sizeof(NnCtx *));
        w->pool_busy = calloc((size_t)w->n_pool, 1);
        PD_ASSERT(w->pool && w->pool_busy);
        for (int k = 0; k < w->n_pool; k++) w->pool[k] = nnctx_new(w->m, w->first, w->last, B);
        w->state_scratch = pd_alloc_f32(w->nst);
    }
    w->slots = calloc((size_t)w->n_slots, sizeof(Slot));
    PD_ASSERT(w->slots);
    for (int k = 0; k < w->n_slots; k++) {
        Slot *sl = &w->slots[k];
        sl->unit = -1;
        if (w->recompute) {
            sl->in_buf = pd_alloc_f32(shape_numel(w->in_shape));
            sl->out_buf = pd_alloc_f32(shape_numel(w->out_shape));
        } else {
            sl->ctx = nnctx_new(w->m, w->first, w->last, B);
        }
        sl->dy = pd_alloc_f32(shape_numel(w->out_shape));
        sl->dx = w->is_input ? NULL : pd_alloc_f32(shape_numel(w->in_shape));
        sl->keep = w->split ? pd_alloc_f32(split_floats(w)) : NULL;
        sl->labels_f = pd_alloc_f32((size_t)B * w->tlen);
        sl->labels = pd_calloc((size_t)B * w->tlen * sizeof(int32_t));
        if (cfg->wire == RT_WIRE_BF16) {   /* rounded up to whole float-sized words */
            size_t ni = (shape_numel(w->in_shape) + 1) / 2 * 2, no = (shape_numel(w->out_shape) + 1) / 2 * 2;
            if (!w->is_input) sl->w_act_in = pd_calloc(ni * 2), sl->w_grad_out = pd_calloc(ni * 2);
            if (!w->is_last) sl->w_act_out = pd_calloc(no * 2), sl->w_grad_in = pd_calloc(no * 2);
        }
    }
    if ((rc = rt_tie_init(w, err))) return rc;
    worker_warmup(w);
    return PD_OK;
}

int rt_worker_init(Worker *w, Comm *c, const RtConfig *cfg, int rank, RtWorkerResult *res, Err *err) {
    memset(w, 0, sizeof *w);
    memset(res, 0, sizeof *res);
    const Schedule *s = cfg->sched;
    w->cfg = cfg;
    w->s = s;
    w->c = c;
    w->rank = rank;
    w->res = res;
    w->sw = &s->workers[rank];
    w->stage = w->sw->stage;
    w->n_chunk = 1;
    res->rank = rank;
    res->stage = w->stage;
    res->replica = w->sw->replica;
    res->n_chunks = 1;
    w->t_start = pd_now();
    if (w->stage < 0) return PD_OK;   /* idle rank */
    /* The thread's kernel scratch starts empty, so that what the stages' build asks for is
     * what the ledger counts (RtMem.scratch). No kernel keeps a pointer into it between calls. */
    kern_scratch_release();
    int V = w->sw->n_chunks > 1 ? w->sw->n_chunks : 1;
    if (V > RT_MAX_CHUNKS)
        return err_set(err, PD_EINVAL, "rank %d runs %d stages (chunks); the runtime runs at most %d per worker", rank, V,
                       RT_MAX_CHUNKS);
    int rc = stage_init(w, NULL, 0, 0, err);
    if (rc || V == 1) {
        if (!rc) worker_mem(w);
        return rc;
    }
    /* several stages: chunk c >= 1 is a Worker of its own over the same list and result */
    w->chunk = calloc((size_t)V, sizeof(Worker *));
    PD_ASSERT(w->chunk);
    w->chunk[0] = w;
    w->n_chunk = res->n_chunks = V;
    size_t p_off = w->np, s_off = w->nst;
    for (int k = 1; k < V && !rc; k++) {
        Worker *x = calloc(1, sizeof *x);
        PD_ASSERT(x);
        w->chunk[k] = x;
        x->cfg = cfg, x->s = s, x->c = c, x->rank = rank, x->res = res, x->sw = w->sw, x->t_start = w->t_start;
        x->ci = k, x->n_chunk = V;
        x->stage = w->sw->stages[k];
        rc = stage_init(x, w, p_off, s_off, err);
        p_off += x->np, s_off += x->nst;
    }
    if (!rc) worker_mem(w);
    return rc;
}

/* One forward and backward on zeros through slot 0 before the clock starts, so that kernel
 * libraries create their primitives and scratch (oneDNN does so on first use) outside the
 * measured run. Running statistics and gradients are restored afterwards: the warm-up leaves
 * no trace in the training state. */
static void worker_warmup(Worker *w) {
    Slot *sl = &w->slots[0];
    if (w->recompute) sl->ctx = w->pool[0];   /* lent for the warm-up only */
    float *saved = pd_alloc_f32(w->nst);
    if (w->nst) memcpy(saved, w->state, w->nst * sizeof(float));
    int B = w->cfg->unit_batch;
    memset(nnctx_input(sl->ctx), 0, shape_numel(w->in_shape) * sizeof(float));
    NnRun run = {.n = B, .train = 1, .seed = w->cfg->seed, .minibatch = 0};
    model_forward(w->m, sl->ctx, w->vbuf[0], w->state, nnctx_input(sl->ctx), &run);
    memset(sl->dy, 0, shape_numel(w->out_shape) * sizeof(float));
    model_backward(w->m, sl->ctx, w->vbuf[0], sl->dy, sl->dx, w->dw);
    if (w->nst) memcpy(w->state, saved, w->nst * sizeof(float));
    if (w->np) memset(w->dw, 0, w->np * sizeof(float));
    if (sl->dx) memset(sl->dx, 0, shape_numel(w->in_shape) * sizeof(float));
    if (w->recompute) sl->ctx = NULL;
    pd_free(saved);
}

void rt_worker_release(Worker *w) {
    for (int k = 1; w->chunk && k < w->n_chunk; k++)
        if (w->chunk[k]) {
            stage_release(w->chunk[k]);
            free(w->chunk[k]);
        }
    free(w->chunk);
    stage_release(w);
}

/* Frees what stage_init made (and the sampler, group and model of chunk 0). */
static void stage_release(Worker *w) {
    if (w->slots) {
        for (int k = 0; k < w->n_slots; k++) {
            Slot *sl = &w->slots[k];
            comm_cancel(w->c, &sl->r_act);
            comm_cancel(w->c, &sl->r_grad);
            comm_cancel(w->c, &sl->r_lab);
            comm_cancel(w->c, &sl->s_act);
            comm_cancel(w->c, &sl->s_grad);
            comm_cancel(w->c, &sl->s_lab);
            if (!w->recompute) nnctx_free(sl->ctx);
            pd_free(sl->in_buf);
            pd_free(sl->out_buf);
            pd_free(sl->dy);
            pd_free(sl->dx);
            pd_free(sl->keep);
            pd_free(sl->labels_f);
            pd_free(sl->labels);
            pd_free(sl->w_act_in), pd_free(sl->w_act_out), pd_free(sl->w_grad_in), pd_free(sl->w_grad_out);
        }
        free(w->slots);
    }
    if (w->vbuf)
        for (int k = 0; k < w->n_vslots; k++) pd_free(w->vbuf[k]);
    free(w->vbuf);
    free(w->vver);
    free(w->last_read);
    free(w->delay);
    for (int k = 0; k < w->n_pred; k++) pd_free(w->pbuf[k]);
    free(w->pbuf), free(w->pver), free(w->pdel), free(w->pstep), free(w->pref);
    pd_free(w->state);
    pd_free(w->dw);
    if (w->bk_ar)
        for (int b = 0; b < w->n_buckets; b++) comm_ar_cancel(&w->bk_ar[b]);
    if (w->pool)
        for (int k = 0; k < w->n_pool; k++) nnctx_free(w->pool[k]);
    free(w->pool);
    free(w->pool_busy);
    pd_free(w->state_scratch);
    free(w->bk_ar);
    free(w->bk_layer);
    free(w->bk_lo);
    free(w->bk_n);
    optim_release(&w->opt);
    rt_tie_release(w);
    if (w->has_sampler) data_sampler_release(&w->sampler);
    comm_group_free(w->group);
    comm_group_free(w->everyone);
    free(w->clip_buf);
    if (!w->m_borrowed) model_free(w->m);
    memset(w, 0, sizeof *w);
}

/* Copies the newest weights, running statistics and optimizer state into the result: the
 * rank's chunks' ranges concatenated in chunk order (one range with one stage). */
void rt_worker_finish(Worker *w) {
    RtWorkerResult *r = w->res;
    r->wall_s = pd_now() - w->t_start;
    if (w->stage < 0) return;
    size_t np = 0, nst = 0;
    for (int c = 0; c < w->n_chunk; c++) {
        const Worker *x = rt_chunk(w, c);
        np += x->np, nst += x->nst;
    }
    int adam = w->opt.v != NULL;
    r->n_chunks = w->n_chunk;
    r->n_params = np;
    r->n_state = nst;
    r->params = pd_alloc_f32(np);
    r->final.params = r->params;
    r->final.state = pd_alloc_f32(nst);
    r->final.opt_m = pd_alloc_f32(np);
    if (adam) r->final.opt_v = pd_alloc_f32(np);
    size_t po = 0, so = 0;
    for (int c = 0; c < w->n_chunk; c++) {
        Worker *x = rt_chunk(w, c);
        size_t n = x->np * sizeof(float);
        memcpy(r->params + po, vstore_get(x, x->newest), n);
        r->chunk_crc[c] = pd_crc32(r->params + po, n);
        if (x->nst) memcpy(r->final.state + so, x->state, x->nst * sizeof(float));
        if (x->np) memcpy(r->final.opt_m + po, x->opt.m, n);
        if (adam && x->np) memcpy(r->final.opt_v + po, x->opt.v, n);
        po += x->np, so += x->nst;
    }
    r->params_crc = pd_crc32(r->params, np * sizeof(float));
    /* a chunk without parameters never steps its optimizer: the rank's count is its chunks' most */
    r->final.opt_step = 0;
    for (int c = 0; c < w->n_chunk; c++) {
        const Worker *x = rt_chunk(w, c);
        if (x->opt.step > r->final.opt_step) r->final.opt_step = x->opt.step;
    }
}

int rt_worker_drain(Worker *w, Err *err) {
    int rc = PD_OK;
    for (int c = 0; c < w->n_chunk && !rc; c++) {
        Worker *x = rt_chunk(w, c);
        for (int k = 0; k < x->n_slots && !rc; k++) rc = slot_drain(x, &x->slots[k], err);
    }
    return rc;
}

/* rt_worker_bind for one stage (chunk) of the rank. */
static int stage_bind(Worker *w, const RtConfig *cfg, RtWorkerResult *res, Err *err) {
    const Schedule *s = cfg->sched;
    w->cfg = cfg;
    w->s = s;
    w->sw = &s->workers[w->rank];
    w->res = res;
    w->pc = 0;
    w->events_cap = 0;
    w->t_start = pd_now();
    if (w->stage < 0) return PD_OK;
    for (int k = 0; k < w->n_slots; k++)
        PD_ASSERTF(w->slots[k].unit < 0 && !w->slots[k].s_act && !w->slots[k].s_grad && !w->slots[k].s_lab,
                   "rank %d: bound to a new list with unit %d in flight", w->rank, w->slots[k].unit);
    /* the newest weights become version 0 of the new list */
    int keep = vstore_slot_of(w, w->newest);
    PD_ASSERT(keep >= 0);
    for (int k = 0; k < w->n_vslots; k++) w->vver[k] = -1;
    w->vver[keep] = 0;
    w->newest = 0;
    int have = w->n_vslots;
    free(w->last_read);
    w->last_read = NULL;
    vstore_plan(w);
    if (w->n_vslots > have) {   /* a longer list than the first: grow the store */
        float **nb = realloc(w->vbuf, (size_t)w->n_vslots * sizeof *nb);
        int *nv = realloc(w->vver, (size_t)w->n_vslots * sizeof *nv);
        PD_ASSERT(nb && nv);
        w->vbuf = nb, w->vver = nv;
        for (int k = have; k < w->n_vslots; k++) w->vbuf[k] = pd_alloc_f32(w->np), w->vver[k] = -1;
    } else {
        w->n_vslots = have;
    }
    SchedWorkerInfo wi;
    int rc = sched_analyze_worker(s, w->rank, &wi, err);
    if (rc) return rc;
    int need, need_full;
    chunk_slots(s, w->rank, &wi, w->ci, &need, &need_full);
    sched_worker_info_release(&wi);
    if (w->recompute != s->recompute)
        return err_set(err, PD_EINVAL, "rank %d: a worker built %s recomputation bound to a list %s it", w->rank,
                       w->recompute ? "with" : "without", s->recompute ? "with" : "without");
    if (w->split != sched_splits_backward(s))
        return err_set(err, PD_EINVAL, "rank %d: a worker built %s split backwards bound to a list %s them", w->rank,
                       w->split ? "with" : "without", w->split ? "without" : "with");
    if (w->recompute && need_full > w->n_pool)
        return err_set(err, PD_EINVAL, "rank %d: the list needs %d activation contexts, %d were made", w->rank, need_full,
                       w->n_pool);
    if (need > w->n_slots)   /* segments only get shorter; a longer list needs a new worker */
        return err_set(err, PD_EINVAL, "rank %d: the list needs %d activation slots, %d were made", w->rank, need,
                       w->n_slots);
    if (w->is_last) {
        int nf = 0;
        for (int i = 0; i < w->sw->n; i++) nf += w->sw->ins[i].op == OP_FORWARD;
        res->hist = malloc(((size_t)nf * 3 + 1) * sizeof(float));
        PD_ASSERT(res->hist);
    }
    return PD_OK;
}

int rt_worker_bind(Worker *w, const RtConfig *cfg, RtWorkerResult *res, Err *err) {
    const Schedule *s = cfg->sched;
    PD_ASSERT(w->rank < s->n_ranks && s->workers[w->rank].stage == w->stage);
    PD_ASSERT(w->stage < 0 || (s->workers[w->rank].n_chunks > 1 ? s->workers[w->rank].n_chunks : 1) == w->n_chunk);
    memset(res, 0, sizeof *res);
    res->rank = w->rank;
    res->stage = w->stage;
    res->replica = s->workers[w->rank].replica;
    res->n_chunks = w->n_chunk;
    int rc = PD_OK;
    for (int c = 0; c < w->n_chunk && !rc; c++) rc = stage_bind(rt_chunk(w, c), cfg, res, err);
    if (!rc && w->stage >= 0) worker_mem(w);
    return rc;
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

/* ---- the three ways to run ---------------------------------------------------------------- */

int rt_worker_replica_groups(Worker *w, Err *err) {
    if (w->stage < 0 || w->s->kind == SCHED_ASP) return PD_OK;   /* asp all-reduces nothing */
    /* chunk by chunk, so stage by stage ascending: the members of a group hold the same chunks
     * (replicas of one pipeline position) and so create their groups in the same order */
    for (int c = 0; c < w->n_chunk; c++) {
        Worker *x = rt_chunk(w, c);
        const SchedStage *st = &w->s->stages[x->stage];
        if (st->replicas < 2) continue;
        int rc = comm_group_new(w->c, st->ranks, st->replicas, &x->group, err);
        if (rc) return rc;
    }
    return PD_OK;
}

int rt_worker_group(Worker *w, Err *err) {
    int rc = rt_worker_replica_groups(w, err);
    return rc ? rc : rt_worker_clip_group(w, err);
}

int rt_worker_clip_group(Worker *w, Err *err) {
    if (w->stage < 0 || w->cfg->opt.clip_norm <= 0.0f) return PD_OK;
    /* every rank that runs a stage, ascending */
    const Schedule *s = w->s;
    int rc = PD_OK;
    int *ranks = malloc((size_t)s->n_ranks * sizeof(int)), n = 0;
    PD_ASSERT(ranks);
    for (int r = 0; r < s->n_ranks; r++)
        if (s->workers[r].stage >= 0) ranks[n++] = r;
    if (n > 1) rc = comm_group_new(w->c, ranks, n, &w->everyone, err);
    free(ranks);
    return rc;
}

int rt_clip_allowed(const Schedule *s, Err *err) {
    if (s->kind == SCHED_ASP)
        return err_set(err, PD_EINVAL, "--clip-grad-norm: asp applies every worker's gradient on its own, at its "
                       "own time: there is no global gradient to take the norm of");
    for (int r = 0; r < s->n_ranks; r++) {
        if (s->workers[r].stage < 0) continue;
        SchedWorkerInfo wi;
        int rc = sched_analyze_worker(s, r, &wi, err);
        if (rc) return rc;
        int d = wi.delay_max;
        sched_worker_info_release(&wi);
        if (d > 0)
            return err_set(err, PD_EINVAL, "--clip-grad-norm needs every stage to step on the same minibatch's "
                           "gradient; with %s%s the stages update at different times (units cross up to %d "
                           "updates on rank %d): use a flushing schedule (1f1b-flush, gpipe, zb-h1, interleaved) "
                           "or dp", sched_kind_name(s->kind), s->vertical_sync ? " --vertical-sync" : "", d, r);
    }
    return PD_OK;
}

long rt_run_steps(const Schedule *s, int stage, long minibatches) {
    long n = minibatches > 0 ? minibatches : s->n_minibatches;
    if (s->kind == SCHED_ASP || stage < 0 || sched_splits_minibatch(s->kind, s->n_micro)) return n;
    int r = s->stages[stage].replicas;   /* a round of r minibatches makes one step */
    return (n + r - 1) / r;
}

int rt_worker_segment(Worker *w, RtAspLog *log, Err *err) {
    if (w->stage < 0) return PD_OK;
    int st = w->s->kind == SCHED_ASP ? rt_asp_exec(w, log, err) : rt_exec(w, 1, err);
    if (st == RT_ERR) return err->code ? err->code : PD_ECOMM;
    return rt_worker_drain(w, err);   /* all sends complete before buffers are reused or go away */
}

/* rt_worker_run and rt_asp_worker_run (asp_only: a schedule of another kind is a set-up
 * error, like a plan for another number of ranks). */
static int worker_run(Comm *c, const RtConfig *cfg, RtWorkerResult *res, RtAspLog *log, int asp_only, Err *err) {
    Worker w;
    memset(&w, 0, sizeof w);
    int rank = comm_rank(c);
    if (cfg->threads > 0) kern_set_threads(cfg->threads);   /* per thread for OpenMP: here */
    const Schedule *s = cfg->sched;
    int rc = PD_OK;
    if (asp_only && s->kind != SCHED_ASP)
        rc = err_set(err, PD_EINVAL, "rt_asp_worker_run: the schedule is %s, not asp", sched_kind_name(s->kind));
    else if (comm_size(c) != s->n_ranks)
        rc = err_set(err, PD_EINVAL, "the plan needs %d workers but %d were started", s->n_ranks, comm_size(c));
    else
        rc = rt_worker_init(&w, c, cfg, rank, res, err);
    /* Every rank checks its set-up and all agree before the first message (PRK bail-out). */
    int all = comm_agree(c, rc);
    if (all != PD_OK) {
        if (w.cfg) rt_worker_release(&w);
        if (rc) return rc;
        return err_set(err, PD_ECOMM, "rank %d: another rank failed to set up (see its message)", rank);
    }
    rc = rt_worker_group(&w, err);
    w.t_start = pd_now();
    if (!rc) rc = rt_worker_segment(&w, log, err);
    if (!rc) rt_worker_finish(&w);
    if (!rc && cfg->test) rc = rt_eval(&w, err);
    rt_worker_release(&w);
    return rc;
}

int rt_worker_run(Comm *c, const RtConfig *cfg, RtWorkerResult *res, Err *err) {
    return worker_run(c, cfg, res, NULL, 0, err);
}

int rt_asp_worker_run(Comm *c, const RtConfig *cfg, RtWorkerResult *res, RtAspLog *log, Err *err) {
    return worker_run(c, cfg, res, log, 1, err);
}

int rt_first_failure(int rc, const int *rcs, const Err *errs, int n, Err *err) {
    int pick = -1;
    for (int r = 0; r < n && pick < 0; r++)
        if (rcs[r] && rcs[r] != PD_ECOMM) pick = r;
    for (int r = 0; r < n && pick < 0; r++)
        if (rcs[r]) pick = r;
    if (pick < 0) return rc;
    *err = errs[pick];
    return rcs[pick];
}

typedef struct ThreadArg {
    const RtConfig *cfg;
    RtWorkerResult *res;
    RtAspLog *logs;   /* NULL, or one per rank */
    int asp_only;
    Err *errs;
} ThreadArg;

static int thread_main(Comm *c, int rank, void *arg) {
    ThreadArg *a = arg;
    return worker_run(c, a->cfg, &a->res[rank], a->logs ? &a->logs[rank] : NULL, a->asp_only, &a->errs[rank]);
}

/* rt_run_threads and rt_asp_run_threads: worker_run on one thread per rank. */
static int run_threads(const RtConfig *cfg, RtWorkerResult *res, RtAspLog *logs, int asp_only, Err *err) {
    int n = cfg->sched->n_ranks;
    Err *errs = calloc((size_t)n, sizeof(Err));
    int *rcs = calloc((size_t)n, sizeof(int));
    PD_ASSERT(errs && rcs);
    ThreadArg a = {cfg, res, logs, asp_only, errs};
    int rc = comm_threads_run(n, thread_main, &a, rcs, err);
    if (rc) rc = rt_first_failure(rc, rcs, errs, n, err);
    free(errs);
    free(rcs);
    return rc;
}

int rt_run_threads(const RtConfig *cfg, RtWorkerResult *res, Err *err) { return run_threads(cfg, res, NULL, 0, err); }

int rt_asp_run_threads(const RtConfig *cfg, RtWorkerResult *res, RtAspLog *logs, Err *err) {
    return run_threads(cfg, res, logs, 1, err);
}

int rt_emulate(const RtConfig *cfg, RtWorkerResult *res, Err *err) {
    const Schedule *s = cfg->sched;
    int n = s->n_ranks, rc = PD_OK;
    if (s->kind == SCHED_ASP)   /* its owners apply pushes as they arrive: no serial order to emulate */
        return err_set(err, PD_EINVAL, "rt_emulate: asp is not emulated (rt_asp_run_threads runs it)");
    if (cfg->opt.clip_norm > 0.0f)   /* its all-reduce over every rank is not emulated */
        return err_set(err, PD_EINVAL, "rt_emulate: gradient clipping is not emulated (rt_run_threads runs it)");
    if (cfg->threads > 0) kern_set_threads(cfg->threads);
    Comm **eps = calloc((size_t)n, sizeof(Comm *));
    Worker *ws = calloc((size_t)n, sizeof(Worker));
    int *state = calloc((size_t)n, sizeof(int));
    PD_ASSERT(eps && ws && state);
    if ((rc = comm_threads_create(n, eps, err))) goto out;
    for (int r = 0; r < n && !rc; r++) rc = rt_worker_init(&ws[r], eps[r], cfg, r, &res[r], err);
    if (rc) goto out;
    for (int r = 0; r < n; r++) state[r] = ws[r].stage < 0 ? RT_DONE : RT_BLOCKED;
    const float **parts = malloc((size_t)n * sizeof(float *));
    PD_ASSERT(parts);
    for (;;) {
        int progress = 0, pending = 0;
        for (int r = 0; r < n; r++) {
            if (state[r] == RT_DONE) continue;
            int pc0 = ws[r].pc;
            state[r] = rt_exec(&ws[r], 0, err);
            if (state[r] == RT_ERR) {
                rc = err->code ? err->code : PD_ECOMM;
                goto out_parts;
            }
            if (ws[r].pc != pc0) progress = 1;
            if (state[r] != RT_DONE) pending = 1;
        }
        /* All-reduces whose whole group has arrived: sum in group rank order. A rank at an
         * all-reduce is at the one of the stage its instruction names (its chunk's, interleaved). */
        for (int st = 0; st < s->n_stages; st++) {
            const SchedStage *ss = &s->stages[st];
            int ready = ss->replicas > 1;
            for (int j = 0; j < ss->replicas && ready; j++) {
                const Worker *wj = &ws[ss->ranks[j]];
                ready = state[ss->ranks[j]] == RT_AT_AR && wj->sw->ins[wj->pc].peer == st;
            }
            if (!ready) continue;
            const int c = ws[ss->ranks[0]].sw->ins[ws[ss->ranks[0]].pc].chunk;
            Worker *x0 = rt_chunk(&ws[ss->ranks[0]], c);
            for (int b = 0; b < x0->n_buckets; b++) {   /* bucket by bucket, as the transports do */
                for (int j = 0; j < ss->replicas; j++) parts[j] = rt_chunk(&ws[ss->ranks[j]], c)->dw + x0->bk_lo[b];
                comm_sum_serial(parts, ss->replicas, x0->bk_n[b], rt_allreduce_op(s), x0->dw + x0->bk_lo[b]);
            }
            for (int j = 0; j < ss->replicas; j++) {
                Worker *wj = &ws[ss->ranks[j]], *xj = rt_chunk(wj, c);
                if (j) memcpy(xj->dw, x0->dw, xj->np * sizeof(float));
                for (int k = 0; k < wj->n_chunk; k++) vstore_collect(rt_chunk(wj, k), wj->pc);
                wj->pc++;
                state[wj->rank] = RT_BLOCKED;
            }
            progress = 1;
        }
        if (!pending) break;
        if (!progress) {
            char msg[400];
            size_t k = 0;
            for (int r = 0; r < n && k < sizeof msg - 40; r++)
                if (state[r] != RT_DONE) {
                    char t[48];
                    k += (size_t)snprintf(msg + k, sizeof msg - k, " rank %d at %s;", r,
                                          sched_instr_str(&ws[r].sw->ins[ws[r].pc], 0, t, sizeof t));
                }
            rc = err_set(err, PD_EINVAL, "emulation: deadlock:%s", msg);
            goto out_parts;
        }
    }
    for (int r = 0; r < n; r++) rt_worker_finish(&ws[r]);
out_parts:
    free(parts);
out:
    for (int r = 0; r < n; r++)
        if (ws[r].cfg) rt_worker_release(&ws[r]);
    for (int r = 0; r < n; r++) comm_free(eps[r]);
    free(eps);
    free(ws);
    free(state);
    return rc;
}
