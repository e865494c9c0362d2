/* rt_worker.c: a worker's set-up and tear-down. rt_worker_init builds a rank's stage (or, with
 * several chunks, one Worker per stage): its layer range, weight-version store, gradient
 * buckets, optimizer, slots and memory ledger; rt_worker_bind rebinds it to the next segment's
 * list, rt_worker_finish copies out its final state, and the groups its all-reduces use are
 * made here. Running the list is runtime.c's (rt_exec). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "rt_impl.h"

static void worker_warmup(Worker *w);
static void stage_release(Worker *w);

/* Floats of a slot's keep buffer (zb kinds: what BI keeps for BW). */
static size_t split_floats(const Worker *w) {
    return model_split_floats(w->m, w->first, w->last, w->cfg->unit_batch);
}

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

/* The last stage's loss history in res: (unit, loss, accuracy) for each forward of its list. */
static void hist_alloc(const Worker *w, RtWorkerResult *res) {
    int nf = 0;
    for (int i = 0; i < w->sw->n; i++) nf += w->sw->ins[i].op == OP_FORWARD;
    res->hist = malloc(((size_t)nf * 3 + 1) * sizeof(float));
    PD_ASSERT(res->hist);
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
    rt_vstore_plan(w);
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
        if (w->opt.step > 0) rt_stale_lr_scale(w, w->opt.step - 1);   /* the last step's, for prediction */
    } else {
        model_init_params(w->m, w->first, w->last, cfg->seed, w->vbuf[0]);
        model_init_state(w->m, w->first, w->last, w->state);
    }
    if (w->is_last) hist_alloc(w, res);
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
    if ((rc = rt_wire_init(w, err))) return rc;
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
        /* the encoded messages (rt_wire.c), in whole float-sized words */
        if (w->wire_ain.cap) sl->w_act_in = pd_calloc(w->wire_ain.cap);
        if (w->wire_gout.cap) sl->w_grad_out = pd_calloc(w->wire_gout.cap);
        if (w->wire_aout.cap) sl->w_act_out = pd_calloc(w->wire_aout.cap);
        if (w->wire_gin.cap) sl->w_grad_in = pd_calloc(w->wire_gin.cap);
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
    rt_wire_release(w);
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
        memcpy(r->params + po, rt_vstore_get(x, x->newest), n);
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
    int keep = rt_vstore_slot_of(w, w->newest);
    PD_ASSERT(keep >= 0);
    for (int k = 0; k < w->n_vslots; k++) w->vver[k] = -1;
    w->vver[keep] = 0;
    w->newest = 0;
    int have = w->n_vslots;
    free(w->last_read);
    w->last_read = NULL;
    rt_vstore_plan(w);
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
    if (w->is_last) hist_alloc(w, res);
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

/* ---- groups, and what the schedule allows -------------------------------------------------- */

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

