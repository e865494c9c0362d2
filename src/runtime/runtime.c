/* runtime.c: the instruction interpreter, rt_exec: executes a worker's instruction list
 * (schedule.h) with real layers, data and messages, one named step per instruction, on the
 * slots (one per unit in flight: activations context, gradient buffers, posted receives,
 * pending sends) and, for messages, the wire format. The same rt_exec drives the MPI/threads
 * runs (blocking waits, real all-reduce) and the serial emulation (non-blocking; the emulator
 * performs all-reduces itself in group rank order). The version store is rt_vstore.c's, the
 * buckets rt_bucket.c's, set-up rt_worker.c's, the run drivers rt_run.c's, what a worker
 * records rt_record.c's. */
#include "runtime.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "rt_impl.h"

/* ---- slots: one per unit in flight ------------------------------------------------------ */

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

/* ---- the wire format (RtConfig.wire; rt_wire.c) -------------------------------------------- */
/* Where a receive lands: dst itself (fp32), or the slot's buffer of the encoded message
 * (decoded by wire_in). */
static float *wire_dst(const RtWireDir *d, float *dst, uint8_t *buf) {
    return d->wire == RT_WIRE_FP32 ? dst : (float *)(void *)buf;
}

/* After a receive completed: decodes unit u's message into dst, once (*done). */
static void wire_in(Worker *w, RtWireDir *d, int u, const uint8_t *buf, float *dst, int *done) {
    if (d->wire == RT_WIRE_FP32 || *done) return;
    rt_wire_recv(w, d, u, buf, dst, d->n, 0);
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
            rc = comm_irecv(w->c, in->peer, COMM_ACT, rt_msg_id(s, in->mb, w->stage),
                            rt_wire_shape(w, &w->wire_ain, w->in_shape, in->mb, 0),
                            wire_dst(&w->wire_ain, slot_in(w, sl), sl->w_act_in), &sl->r_act, err);
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
            rc = comm_irecv(w->c, in->peer, COMM_GRAD, rt_msg_id(s, in->mb, w->stage + 1),
                            rt_wire_shape(w, &w->wire_gin, w->out_shape, in->mb, 0),
                            wire_dst(&w->wire_gin, sl->dy, sl->w_grad_in), &sl->r_grad, err);
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

/* ---- the instructions ---------------------------------------------------------------------- */

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

/* F: unit in->mb's forward on the weights it reads (rt_forward_weights): the input stage loads its
 * data first, the last stage then computes its loss and the gradient of the logits. */
static int exec_forward(Worker *w, const Instr *in, Err *err) {
    int rc;
    w->res->chunk_fwd[in->chunk]++;
    Slot *sl = slot_for(w, in->mb, 1, err, &rc);
    if (!sl) return rc ? rc : err_set(err, PD_EINVAL, "rank %d: no free slot for unit %d", w->rank, in->mb);
    if (w->is_input && (rc = load_unit(w, sl, in->mb, err))) return rc;
    if (w->is_last && !w->is_input)
        for (int i = 0; i < w->cfg->unit_batch * w->tlen; i++) sl->labels[i] = (int32_t)sl->labels_f[i];
    const float *wv = rt_forward_weights(w, sl, in);
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

/* Recompute: unit mb's forward again from its kept input, with its forward's version and
 * dropout key, into a lent context. Running statistics go to scratch: F updated the real ones. */
static int exec_recompute(Worker *w, const Instr *in, Err *err) {
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
    const float *wv = sl->pslot >= 0 ? w->pbuf[sl->pslot] : rt_vstore_get(w, in->version);
    model_forward(w->m, sl->ctx, wv, w->state_scratch, slot_in(w, sl), &run);
    return PD_OK;
}

static int unit_done(Worker *w, Slot *sl, const Instr *in, Err *err);

/* B, or the zb kinds' BI (in->op == OP_BACKWARD_B): the input gradient, and the weight
 * gradient of the layers that do not split; the unit then keeps its slot until its BW. */
static int exec_backward(Worker *w, const Instr *in, Err *err) {
    int half = in->op == OP_BACKWARD_B;
    Slot *sl = slot_find(w, in->mb);
    PD_ASSERTF(sl && sl->grad_ready, "rank %d: backward of unit %d before its gradient", w->rank, in->mb);
    PD_ASSERTF(sl->version == in->version, "rank %d: unit %d forward used version %d, backward asks %d", w->rank,
               in->mb, sl->version, in->version);
    int rc = comm_wait(w->c, &sl->s_act, w->cfg->recv_timeout_s, NULL, err);   /* output no longer sent */
    if (rc) return rc;
    /* weight stashing: the weights its forward used; --no-stash (an ablation): the newest */
    const float *wv = rt_unit_weights(w, sl, in->version);
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
        if (w->group && w->n_buckets && rt_last_backward_before_ar(w, w->pc + 1)) {
            RtBucketHook h = {w, err, PD_OK};
            model_backward_hook(w->m, sl->ctx, wv, sl->dy, dx, w->dw, rt_bucket_hook, &h);
            return h.rc;
        }
        model_backward(w->m, sl->ctx, wv, sl->dy, dx, w->dw);
        return PD_OK;
    }
    if (w->group && w->n_buckets && rt_last_backward_before_ar(w, w->pc)) {
        RtBucketHook h = {w, err, PD_OK};
        model_backward_hook(w->m, sl->ctx, wv, sl->dy, dx, w->dw, rt_bucket_hook, &h);
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
static int exec_backward_w(Worker *w, const Instr *in, Err *err) {
    Slot *sl = slot_find(w, in->mb);
    PD_ASSERTF(sl && sl->version == in->version, "rank %d: weight pass of unit %d (version %d) without its forward",
               w->rank, in->mb, in->version);
    const float *wv = rt_unit_weights(w, sl, in->version);
    if (sl->fused) {   /* its BI ran the whole backward */
        sl->fused = 0;
    } else if (w->group && w->n_buckets && rt_last_backward_before_ar(w, w->pc)) {
        RtBucketHook h = {w, err, PD_OK};
        model_backward_w(w->m, sl->ctx, wv, sl->dy, sl->keep, w->dw, rt_bucket_hook, &h);
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

/* Each returns PD_OK when its instruction is done, an error code with err set, or one of these
 * when the list stops at it for now (rt_exec then returns RT_BLOCKED or RT_AT_AR): */
enum { EXEC_BLOCKED = -1, EXEC_AT_AR = -2 };

/* RA: unit in->mb's activation (and, at the last stage, its labels) has arrived. */
static int exec_recv_act(Worker *x, const Instr *in, int blocking, Err *err) {
    int rc = post_recv(x, in, 0, err);
    if (rc) return rc;
    Slot *sl = slot_find(x, in->mb);
    if (!sl) {
        if (!blocking) return EXEC_BLOCKED;
        return err_set(err, PD_EINVAL, "rank %d: no free slot to receive unit %d", x->rank, in->mb);
    }
    if ((rc = await(x, &sl->r_act, &sl->act_ready, blocking, err))) return rc;
    if ((rc = await(x, &sl->r_lab, &sl->lab_ready, blocking, err))) return rc;
    if (!sl->act_ready || (x->is_last && !x->is_input && !sl->lab_ready)) return EXEC_BLOCKED;
    wire_in(x, &x->wire_ain, in->mb, sl->w_act_in, slot_in(x, sl), &sl->act_in);
    return PD_OK;
}

/* RG: the gradient w.r.t. unit in->mb's output has arrived. */
static int exec_recv_grad(Worker *x, const Instr *in, int blocking, Err *err) {
    int rc = post_recv(x, in, 0, err);
    if (rc) return rc;
    Slot *sl = slot_find(x, in->mb);
    PD_ASSERTF(sl, "rank %d: gradient for unit %d without its forward", x->rank, in->mb);
    if ((rc = await(x, &sl->r_grad, &sl->grad_ready, blocking, err))) return rc;
    if (!sl->grad_ready) return EXEC_BLOCKED;
    wire_in(x, &x->wire_gin, in->mb, sl->w_grad_in, sl->dy, &sl->grad_in);
    return PD_OK;
}

/* SA: unit in->mb's output to the next stage. */
static int exec_send_act(Worker *x, const Instr *in, Err *err) {
    Slot *sl = slot_find(x, in->mb);
    PD_ASSERT(sl);
    RtWireDir *d = &x->wire_aout;
    const float *m = rt_wire_send(x, d, in->mb, slot_out(x, sl), d->n, sl->w_act_out, 0);
    return comm_isend(x->c, in->peer, COMM_ACT, rt_msg_id(x->s, in->mb, x->stage + 1), sl->version,
                      rt_wire_shape(x, d, x->out_shape, in->mb, 0), m, &sl->s_act, err);
}

/* SG: the gradient w.r.t. unit in->mb's input to the previous stage. */
static int exec_send_grad(Worker *x, const Instr *in, Err *err) {
    Slot *sl = slot_find(x, in->mb);
    PD_ASSERT(sl);
    RtWireDir *d = &x->wire_gout;
    const float *m = rt_wire_send(x, d, in->mb, sl->dx, d->n, sl->w_grad_out, 0);
    int rc = comm_isend(x->c, in->peer, COMM_GRAD, rt_msg_id(x->s, in->mb, x->stage), sl->version,
                        rt_wire_shape(x, d, x->in_shape, in->mb, 0), m, &sl->s_grad, err);
    /* its buffers stay untouched until the send completes (slot_drain); a split backward's
     * unit stays until its BW */
    if (!x->split) slot_free(sl);
    return rc;
}

/* AR: the chunk's gradient, settled, summed over its replicas (in emulation: by the emulator). */
static int exec_allreduce(Worker *x, Err *err) {
    if (x->np) model_grads_settle(x->m, x->first, x->last, x->dw);   /* read whole from here */
    if (!x->group) return EXEC_AT_AR;
    if (!x->np) return PD_OK;
    double a0 = pd_now();
    int rc = rt_bucket_allreduce(x, err);
    x->res->wait_s += pd_now() - a0;
    return rc;
}

/* Compute time of an instruction of chunk c that began at t0 (thread CPU q0). */
static void count_compute(Worker *w, int c, double t0, double q0) {
    double dt = pd_now() - t0, dq = pd_thread_cpu() - q0;
    w->res->compute_s += dt;
    w->res->chunk_compute_s[c] += dt;
    w->res->compute_cpu_s += dq;
    w->res->chunk_cpu_s[c] += dq;
}

/* ST: every chunk steps to in->version (they share the list's versions): gradients settled,
 * tied parameters' gradients exchanged and folded, clipped, then the optimizer. Its compute
 * time starts at c0 (thread CPU q0), or after the tie exchange's wait. */
static int exec_step(Worker *w, const Instr *in, int blocking, double c0, double q0, Err *err) {
    int rc;
    for (int c = 0; c < w->n_chunk; c++) {   /* the gradients are read whole from here */
        Worker *y = rt_chunk(w, c);
        if (y->np) model_grads_settle(y->m, y->first, y->last, y->dw);
    }
    if (w->n_xtie) {   /* tied parameters split over stages: the other owner's gradient first */
        double a0 = pd_now();
        int ready = 0;
        rc = rt_tie_exchange(w, in->version, blocking, &ready, err);
        w->res->wait_s += pd_now() - a0;
        if (rc) return rc;
        if (!ready) return EXEC_BLOCKED;
        c0 = pd_now();
        q0 = pd_thread_cpu();
    }
    for (int c = 0; c < w->n_chunk; c++) {   /* ties inside a stage: one summed gradient */
        Worker *y = rt_chunk(w, c);
        if (y->np) model_tie_fold(y->m, y->first, y->last, y->dw);
    }
    if (w->cfg->opt.clip_norm > 0.0f && (rc = clip_gradients(w, err))) return rc;
    for (int c = 0; c < w->n_chunk; c++) {
        Worker *y = rt_chunk(w, c);
        double s0 = pd_now(), u0 = pd_thread_cpu();
        rt_vstore_step(y, in->version, w->pc);
        w->res->chunk_compute_s[c] += pd_now() - s0;
        w->res->chunk_cpu_s[c] += pd_thread_cpu() - u0;
    }
    w->res->compute_s += pd_now() - c0;
    w->res->compute_cpu_s += pd_thread_cpu() - q0;
    return PD_OK;
}

/* FL: no unit of any chunk is in flight. */
static int exec_flush(const Worker *w) {
    for (int c = 0; c < w->n_chunk; c++) {
        const Worker *y = rt_chunk((Worker *)w, c);
        for (int k = 0; k < y->n_slots; k++)
            PD_ASSERTF(y->slots[k].unit < 0 || y->slots[k].version < 0, "rank %d: unit %d of stage %d in flight at a flush",
                       w->rank, y->slots[k].unit, y->stage);
    }
    return PD_OK;
}

/* Posts the receives of the next few instructions after w->pc ahead, so they overlap compute.
 * Units take slots in the order of their receives: one that gets none now stops the posting,
 * or a later unit could take the slot it will need. */
static int post_ahead(Worker *w, Err *err) {
    const SchedWorker *sw = w->sw;
    for (int k = w->pc, seen = 0; k < sw->n && seen < 4; k++) {
        const Instr *nx = &sw->ins[k];
        if (nx->op != OP_RECV_ACT && nx->op != OP_RECV_GRAD) continue;
        seen++;
        Worker *y = rt_chunk(w, nx->chunk);
        int rc = post_recv(y, nx, 1, err);
        if (rc) {
            char t[64];
            err_prefix(err, "rank %d (stage %d), posting instruction %d (%s) ahead", w->rank, sched_instr_stage(sw, nx), k,
                       sched_instr_str(nx, 1, t, sizeof t));
            return rc;
        }
        if (nx->op == OP_RECV_ACT && !slot_find(y, nx->mb)) break;
    }
    return PD_OK;
}

/* ---- the interpreter ------------------------------------------------------------------------ */

/* Executes instructions from w->pc until the list ends (RT_DONE), a receive is not ready in
 * non-blocking mode (RT_BLOCKED), or, in emulation, an all-reduce is reached (RT_AT_AR: the
 * emulator performs it and advances pc). Errors return RT_ERR with err set. Each instruction
 * runs on the Worker of its chunk (x; w itself with one stage); a step steps every chunk. */
int rt_exec(Worker *w, int blocking, Err *err) {
    const SchedWorker *sw = w->sw;
    while (w->pc < sw->n) {
        const Instr *in = &sw->ins[w->pc];
        Worker *x = chunk_of(w, in);
        double t0 = pd_now(), q0 = pd_thread_cpu();
        int rc;
        switch ((InstrOp)in->op) {
        case OP_RECV_ACT:   rc = exec_recv_act(x, in, blocking, err); break;
        case OP_RECV_GRAD:  rc = exec_recv_grad(x, in, blocking, err); break;
        case OP_FORWARD:    rc = exec_forward(x, in, err); break;
        case OP_BACKWARD:
        case OP_BACKWARD_B: rc = exec_backward(x, in, err); break;
        case OP_BACKWARD_W: rc = exec_backward_w(x, in, err); break;
        case OP_RECOMPUTE:  rc = exec_recompute(x, in, err); break;
        case OP_SEND_ACT:   rc = exec_send_act(x, in, err); break;
        case OP_SEND_GRAD:  rc = exec_send_grad(x, in, err); break;
        case OP_ALLREDUCE:  rc = exec_allreduce(x, err); break;
        case OP_STEP:       rc = exec_step(w, in, blocking, t0, q0, err); break;
        case OP_FLUSH:      rc = exec_flush(w); break;
        default:   /* not an instruction of any list sched_build makes */
            rc = err_set(err, PD_EINVAL, "the runtime does not execute %s instructions", sched_op_name((InstrOp)in->op));
        }
        if (sched_op_computes(in->op)) count_compute(w, in->chunk, t0, q0);
        if (rc == EXEC_BLOCKED) return RT_BLOCKED;
        if (rc == EXEC_AT_AR) return RT_AT_AR;
        if (rc) {
            char t[64];
            err_prefix(err, "rank %d (stage %d), instruction %d (%s)", w->rank, x->stage, w->pc,
                       sched_instr_str(in, 1, t, sizeof t));
            return RT_ERR;
        }
        rt_trace_add(w, in->op, in->mb, in->version, t0, pd_now());
        for (int c = 0; c < w->n_chunk; c++) rt_vstore_collect(rt_chunk(w, c), w->pc);
        w->pc++;
        if (post_ahead(w, err)) return RT_ERR;
    }
    return RT_DONE;
}

int rt_worker_drain(Worker *w, Err *err) {
    int rc = PD_OK;
    for (int c = 0; c < w->n_chunk && !rc; c++) {
        Worker *x = rt_chunk(w, c);
        for (int k = 0; k < x->n_slots && !rc; k++) rc = slot_drain(x, &x->slots[k], err);
    }
    return rc;
}
