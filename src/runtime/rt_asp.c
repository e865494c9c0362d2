/* rt_asp.c: asynchronous parallel training (--schedule asp; docs/explanation/asp.md), the paper's
 * asynchronous baseline. Every rank holds the whole model, like dp, and trains on its own
 * units (round-robin: replica j of R takes units j, j + R, j + 2R, ...; data and dropout keys
 * are those of dp and of sequential SGD). Nobody waits for anybody else's step: the whole
 * model's parameter buffer is cut into R contiguous shards (shard_lo), shard j is owned
 * by replica j, which keeps its master copy and its optimizer state, and acts as that shard's
 * parameter server.
 *
 * A worker's unit: forward and backward on its local copy of the weights; PUSH the gradient's
 * shard o to owner o for every o (non-blocking; its own shard is applied at once); each owner
 * applies the optimizer step to its master shard when the push arrives (version + 1) and
 * answers with the shard as it is then (the PULL for the worker's next unit), so a worker
 * always reads its own previous updates. No barrier, no all-reduce. The first unit of a
 * segment reads the weights every rank starts the segment with (identical everywhere).
 *
 * Messages (point-to-point, comm_isend/irecv; N = units of the segment; each (source, kind,
 * minibatch id) is used once, so no two ever match the same receive):
 *
 *   push   worker -> owner o   COMM_GRAD  mb = unit u   version = shard version u was computed from
 *   pull   owner o -> worker   COMM_ACT   mb = the worker's next unit   version = shard version
 *   final  owner o -> all      COMM_ACT / COMM_GRAD / COMM_CTRL  mb = N: the shard's weights,
 *                              optimizer first moment (momentum), Adam's second moment
 *
 * An owner has one receive posted per worker (that worker's next unit; a worker cannot push
 * again before the pull that answers its push), so pushes are taken in each worker's order
 * and counted: the run ends when every owner has applied N gradients and every worker's
 * pushes have completed; then the owners send their shards (and optimizer state) to every
 * rank, and receiving all R - 1 of them is the agreement that everyone is done. Every rank
 * then holds the same final weights and optimizer state, so evaluation, checkpoints and the
 * weights CRC work as for dp. Batch-norm running statistics stay per replica (as in dp).
 *
 * Serving happens only when the worker polls: point-to-point messages move only inside the
 * caller's comm calls (comm's progress thread advances all-reduces only; asp has none), so a
 * push that arrives while its owner computes waits for that owner's next poll (between
 * forward and backward, after its own pushes, and while it waits for its pulls). The pull
 * round trip (push sent .. every shard back) measures that delay.
 *
 * Staleness of an applied gradient = the shard's version when applied - the version it was
 * computed from (0 on one rank: that is sequential SGD, bit for bit). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "rt_impl.h"

typedef struct Asp {
    Worker *w;
    Comm *c;
    RtAspLog *log;
    int R, me;              /* replicas; this rank's replica index (= its shard) */
    const int *ranks;       /* replica j's rank */
    int N;                  /* units of the segment */
    size_t *lo;             /* R + 1 shard bounds */
    float *wl;              /* the local weights (whole model): the newest version's buffer */
    float *master;          /* this rank's shard, master copy */
    Optim so;               /* the optimizer over the shard: views into w->opt */
    long ver;               /* the shard's version: gradients applied in this segment */
    /* owner side, per replica p */
    float **pushbuf;        /* where p's next push lands */
    CommReq **rpush;
    int *next;              /* index of p's next unit to be pushed (units p + next * R) */
    float **replybuf;       /* snapshot of the shard for p's pull (MPI borrows it until sent) */
    CommReq **sreply;
    /* worker side, per owner o */
    CommReq **spush, **rpull;
    long *pulled;           /* version of shard o in wl */
    /* the final exchange's requests, and the rank at the other end of each */
    CommReq **fin;
    int *fin_peer, n_fin;
    /* figures */
    double stale_sum, pull_sum, pull_max, apply_s, fb_s;
    int stale_max;
    long pulls;
} Asp;

/* Shard k of P parameters over R owners starts at floor(k P / R) (k = R: P), without overflow. */
static size_t shard_lo(size_t P, int R, int k) {
    size_t q = P / (size_t)R, r = P % (size_t)R;
    return q * (size_t)k + r * (size_t)k / (size_t)R;
}
static size_t len_of(const Asp *a, int o) { return a->lo[o + 1] - a->lo[o]; }
static int units_of(const Asp *a, int p) { return p < a->N ? (a->N - p + a->R - 1) / a->R : 0; }

static void log_apply(Asp *a, int u, long from) {
    RtAspLog *l = a->log;
    if (!l) return;
    PD_ASSERT(l->n < l->cap);
    l->unit[l->n] = u;
    l->from[l->n] = (int32_t)from;
    l->n++;
}

/* The optimizer step of the master shard with gradient g of unit u, computed from version
 * `from` of the shard. */
static void apply(Asp *a, int u, long from, const float *g) {
    double t0 = pd_now();
    PD_ASSERTF(from >= 0 && from <= a->ver, "rank %d: gradient of unit %d from shard version %ld, shard at %ld",
               a->w->rank, u, from, a->ver);
    int stale = (int)(a->ver - from);
    if (a->so.n) optim_step(&a->so, a->master, g);
    else a->so.step++;
    a->ver++;
    a->stale_sum += stale;
    if (stale > a->stale_max) a->stale_max = stale;
    a->w->res->asp_applied++;
    log_apply(a, u, from);
    double t1 = pd_now();
    a->apply_s += t1 - t0;
    rt_trace_add(a->w, OP_STEP, u, (int)from, t0, t1);
}

/* Copies the shard as a pull hands it out into dst: the master, or with --staleness lookahead
 * and several workers the master moved ahead by the momentum (SGD's, Adam's beta1) times the
 * last update (optim_predict with the shard's optimizer state now): a Nesterov look-ahead for
 * the updates other workers' gradients make while the puller computes on it. One worker's
 * gradients are never stale, and it reads the master (sequential SGD, bit for bit). */
static void pull_copy(Asp *a, float *dst) {
    size_t n = len_of(a, a->me);
    if (!n) return;
    const OptConfig *oc = &a->so.c;
    if (a->R > 1 && (a->w->cfg->staleness & RT_STALE_LOOKAHEAD))
        optim_predict(&a->so, a->master, dst, optim_is_adam(oc->kind) ? oc->beta1 : oc->momentum);
    else
        memcpy(dst, a->master, n * sizeof(float));
}

/* Owner: replica p's push (header hdr) has arrived in pushbuf[p]: apply it, answer with the
 * shard for p's next unit and post the receive of that unit's push. */
static int take_push(Asp *a, int p, const CommHeader *hdr, Err *err) {
    int u = p + a->next[p] * a->R;
    apply(a, u, hdr->version, a->pushbuf[p]);
    a->next[p]++;
    if (a->next[p] >= units_of(a, p)) return PD_OK;
    int un = u + a->R, rc;
    size_t n = len_of(a, a->me);
    /* the previous answer to p was received before p pushed again: its send completes now */
    if ((rc = comm_wait(a->c, &a->sreply[p], a->w->cfg->recv_timeout_s, NULL, err))) return rc;
    pull_copy(a, a->replybuf[p]);
    if ((rc = comm_isend(a->c, a->ranks[p], COMM_ACT, un, a->ver, shape1((int)n), a->replybuf[p], &a->sreply[p], err)))
        return rc;
    return comm_irecv(a->c, a->ranks[p], COMM_GRAD, un, shape1((int)n), a->pushbuf[p], &a->rpush[p], err);
}

/* Owner: takes every push that has arrived, completes answers that were received. Returns
 * PD_OK; *did = 1 if anything happened. */
static int serve(Asp *a, int *did, Err *err) {
    int rc;
    for (int p = 0; p < a->R; p++) {
        if (p == a->me) continue;
        int done = 0;
        CommHeader h;
        if (a->rpush[p]) {
            if ((rc = comm_test(a->c, &a->rpush[p], &done, &h, err))) return rc;
            if (done) {
                if ((rc = take_push(a, p, &h, err))) return rc;
                *did = 1;
            }
        }
        if (a->sreply[p] && (rc = comm_test(a->c, &a->sreply[p], &done, NULL, err))) return rc;
    }
    return PD_OK;
}

/* What a poll loop waits for: returns how many requests are still pending (testing them),
 * names the first in what; *rc set on an error. */
typedef int (*AspPending)(Asp *a, Err *err, int *rc, char *what, size_t n);

/* Polls until nothing is pending, serving pushes meanwhile, and between rounds that found
 * nothing waits as comm's own waits do (comm_idle); gives up when nothing has moved for the
 * receive deadline, naming what it was waiting for. */
static int poll_until(Asp *a, AspPending pending, Err *err) {
    double deadline = a->w->cfg->recv_timeout_s, t_last = pd_now();
    int rc = PD_OK, before = -1;
    char what[200];
    for (;;) {
        int did = 0;
        uint64_t mark = comm_events(a->c);
        if ((rc = serve(a, &did, err))) return rc;
        what[0] = 0;
        int left = pending(a, err, &rc, what, sizeof what);
        if (rc) return rc;
        if (!left) return PD_OK;
        if (did || left != before) {
            t_last = pd_now();
            before = left;
            continue;
        }
        comm_idle(a->c, mark, t_last, deadline > 0 ? t_last + deadline : 0);
        if (deadline > 0 && pd_now() - t_last > deadline)
            return err_set(err, PD_ECOMM, "rank %d: asp: timed out after %g s waiting for %s", a->w->rank, deadline,
                           what);
    }
}

/* Worker: its pushes not yet taken, its pulls not yet back. */
static int worker_pending(Asp *a, Err *err, int *rc, char *what, size_t n) {
    int left = 0;
    for (int o = 0; o < a->R; o++) {
        int done = 0;
        CommHeader h;
        if (a->rpull[o]) {
            if ((*rc = comm_test(a->c, &a->rpull[o], &done, &h, err))) return 1;
            if (done) a->pulled[o] = h.version;
            else if (!left++) snprintf(what, n, "rank %d to answer a push (shard %d)", a->ranks[o], o);
        }
        if (a->spush[o]) {
            if ((*rc = comm_test(a->c, &a->spush[o], &done, NULL, err))) return 1;
            if (!done && !left++) snprintf(what, n, "rank %d to take a push (shard %d)", a->ranks[o], o);
        }
    }
    return left;
}

/* Owner: pushes still expected, answers not yet taken. */
static int owner_pending(Asp *a, Err *err, int *rc, char *what, size_t n) {
    int left = 0;
    for (int p = 0; p < a->R; p++) {
        if (p == a->me) continue;
        if (a->next[p] < units_of(a, p) && !left++)
            snprintf(what, n, "rank %d to push the gradient of unit %d (shard %d has %ld of %d)", a->ranks[p],
                     p + a->next[p] * a->R, a->me, a->ver, a->N);
        int done = 0;
        if (a->sreply[p]) {
            if ((*rc = comm_test(a->c, &a->sreply[p], &done, NULL, err))) return 1;
            if (!done && !left++) snprintf(what, n, "rank %d to take its pull", a->ranks[p]);
        }
    }
    return left;
}

/* The final exchange's messages. */
static int fin_pending(Asp *a, Err *err, int *rc, char *what, size_t n) {
    int left = 0;
    for (int k = 0; k < a->n_fin; k++) {
        int done = 0;
        CommHeader h;
        if (!a->fin[k]) continue;
        if ((*rc = comm_test(a->c, &a->fin[k], &done, &h, err))) return 1;
        if (!done && !left++)
            snprintf(what, n, "rank %d: the final shards and optimizer state (message %d of %d)", a->fin_peer[k], k + 1,
                     a->n_fin);
    }
    return left;
}

/* Every owner sends its shard's weights and optimizer state to every other rank, which take
 * them into their local buffers: afterwards every rank holds the same final model. Message
 * kinds of the weights, the first moment and Adam's second moment (minibatch id N). */
static const CommKind FIN_KIND[3] = {COMM_ACT, COMM_GRAD, COMM_CTRL};

static int final_exchange(Asp *a, Err *err) {
    Worker *w = a->w;
    int R = a->R, me = a->me, adam = w->opt.v != NULL, rc = PD_OK;
    size_t nm = len_of(a, me);
    if (nm) memcpy(a->wl + a->lo[me], a->master, nm * sizeof(float));
    a->fin = calloc((size_t)(6 * R + 1), sizeof(CommReq *));
    a->fin_peer = calloc((size_t)(6 * R + 1), sizeof(int));
    PD_ASSERT(a->fin && a->fin_peer);
    a->n_fin = 0;
    for (int o = 0; o < R && !rc; o++) {   /* the others' shards: weights, m (, v) */
        if (o == me) continue;
        size_t lo = a->lo[o];
        Shape sh = shape1((int)len_of(a, o));
        int r = a->ranks[o];
        for (int k = 0; k < 2 + adam && !rc; k++) {
            float *dst = k == 0 ? a->wl + lo : k == 1 ? w->opt.m + lo : w->opt.v + lo;
            a->fin_peer[a->n_fin] = r;
            rc = comm_irecv(a->c, r, FIN_KIND[k], a->N, sh, dst, &a->fin[a->n_fin++], err);
        }
    }
    Shape sh = shape1((int)nm);
    size_t lo = a->lo[me];
    for (int p = 0; p < R && !rc; p++) {   /* this shard to every other rank */
        if (p == me) continue;
        int r = a->ranks[p];
        for (int k = 0; k < 2 + adam && !rc; k++) {
            const float *src = k == 0 ? a->master : k == 1 ? w->opt.m + lo : w->opt.v + lo;
            a->fin_peer[a->n_fin] = r;
            rc = comm_isend(a->c, r, FIN_KIND[k], a->N, a->ver, sh, src, &a->fin[a->n_fin++], err);
        }
    }
    if (!rc) rc = poll_until(a, fin_pending, err);
    return rc;
}

/* ---- one worker's segment ---------------------------------------------------------------- */

/* Forward of unit u (the i-th of this worker) on the local weights: data, loss, its gradient
 * into slot 0's dy. */
static int forward(Asp *a, int u, int i, Err *err) {
    Worker *w = a->w;
    Slot *sl = &w->slots[0];
    int B = w->cfg->unit_batch;
    double t0 = pd_now();
    int n = data_sampler_get(&w->sampler, w->cfg->unit_base + (uint64_t)u, nnctx_input(sl->ctx), sl->labels);
    if (n != B) return err_set(err, PD_EINVAL, "rank %d: unit %d has %d samples, expected %d", w->rank, u, n, B);
    NnRun run = {.n = B, .train = 1, .seed = w->cfg->seed, .minibatch = w->cfg->unit_base + (uint64_t)u};
    const float *y = model_forward(w->m, sl->ctx, a->wl, w->state, nnctx_input(sl->ctx), &run);
    memset(sl->dy, 0, (size_t)B * w->classes * sizeof(float));
    int correct = 0;
    float loss = kern_xent_fwd_bwd(y, sl->labels, sl->dy, B, w->classes, 1.0f, &correct);
    if (!isfinite(loss) && w->cfg->nan_check != RT_NAN_OFF)
        return err_set(err, PD_EINVAL, "the loss is %g at minibatch %llu (unit %d of this run)", (double)loss,
                       (unsigned long long)(w->cfg->unit_base + (uint64_t)u), u);
    RtWorkerResult *r = w->res;
    r->loss_sum += loss;
    float *h = &r->hist[3 * r->n_hist++];
    h[0] = (float)u, h[1] = loss, h[2] = (float)correct / (float)B;
    r->units_done++;
    rt_last_loss_add(r, (int64_t)(w->cfg->unit_base + (uint64_t)u), loss);
    r->n_fwd++;
    double t1 = pd_now();
    r->compute_s += t1 - t0;
    rt_trace_add(a->w, OP_FORWARD, u, i, t0, t1);
    if (w->cfg->progress && a->me == 0) rt_progress(w, u, u + a->R >= a->N, loss);
    return PD_OK;
}

static int backward(Asp *a, int u, int i, Err *err) {
    Worker *w = a->w;
    Slot *sl = &w->slots[0];
    double t0 = pd_now();
    if (w->np) model_grads_discard(w->m, w->first, w->last);   /* the backward writes dw */
    model_backward(w->m, sl->ctx, a->wl, sl->dy, NULL, w->dw);
    w->res->n_bwd++;
    if (w->cfg->nan_check == RT_NAN_ALL)
        for (size_t k = 0; k < w->np; k++)
            if (!isfinite(w->dw[k]))
                return err_set(err, PD_EINVAL, "gradient of parameter %zu is %g after minibatch %llu", k,
                               (double)w->dw[k], (unsigned long long)(w->cfg->unit_base + (uint64_t)u));
    double t1 = pd_now();
    w->res->compute_s += t1 - t0;
    rt_trace_add(a->w, OP_BACKWARD, u, i, t0, t1);
    return PD_OK;
}

/* Pushes unit u's gradient (every shard; its own applied at once) and, if there is a next
 * unit, starts its pull: the receives of the other shards into the local weights and the
 * own shard copied from the master. */
static int push_pull(Asp *a, int u, int has_next, Err *err) {
    Worker *w = a->w;
    int rc;
    for (int o = 0; o < a->R; o++) {
        if (o == a->me) continue;
        size_t lo = a->lo[o];
        if ((rc = comm_isend(a->c, a->ranks[o], COMM_GRAD, u, a->pulled[o], shape1((int)len_of(a, o)), w->dw + lo,
                             &a->spush[o], err)))
            return rc;
    }
    apply(a, u, a->pulled[a->me], w->dw + a->lo[a->me]);
    if (!has_next) return PD_OK;
    for (int o = 0; o < a->R; o++) {
        if (o == a->me) continue;
        size_t lo = a->lo[o];
        if ((rc = comm_irecv(a->c, a->ranks[o], COMM_ACT, u + a->R,
                             shape1((int)len_of(a, o)), a->wl + lo, &a->rpull[o], err)))
            return rc;
    }
    pull_copy(a, a->wl + a->lo[a->me]);
    a->pulled[a->me] = a->ver;
    return PD_OK;
}

/* The segment's figures over every rank, on rank 0: each owner must have applied every unit's
 * gradient once; one line on stderr (at the run's last segment, or always with progress).
 * Collective over every rank of c. */
typedef struct AspWire {
    int64_t applied, stale_max, pulls, n_fwd;
    double stale_sum, pull_sum, pull_max, fb_s;
} AspWire;

static int report(Asp *a, Err *err) {
    Worker *w = a->w;
    RtWorkerResult *r = w->res;
    AspWire x = {a->ver, a->stale_max, a->pulls, r->n_fwd, a->stale_sum, a->pull_sum, a->pull_max, a->fb_s};
    void **parts = NULL;
    size_t *sizes = NULL;
    int rc = comm_gather(a->c, 0, &x, sizeof x, &parts, &sizes, w->cfg->recv_timeout_s, err);
    if (rc || w->rank != 0) return rc;
    AspWire t = {0};
    for (int k = 0; k < comm_size(a->c) && !rc; k++) {
        AspWire y;
        if (sizes[k] != sizeof y) {
            rc = err_set(err, PD_ECOMM, "asp: rank %d sent %zu bytes of figures, expected %zu", k, sizes[k], sizeof y);
            break;
        }
        memcpy(&y, parts[k], sizeof y);
        if (y.applied != a->N)
            rc = err_set(err, PD_EINVAL, "asp: rank %d applied %lld gradients to its shard, expected %d", k,
                         (long long)y.applied, a->N);
        t.applied += y.applied, t.pulls += y.pulls, t.n_fwd += y.n_fwd;
        t.stale_sum += y.stale_sum, t.pull_sum += y.pull_sum, t.fb_s += y.fb_s;
        if (y.stale_max > t.stale_max) t.stale_max = y.stale_max;
        if (y.pull_max > t.pull_max) t.pull_max = y.pull_max;
    }
    comm_parts_free(parts, sizes, comm_size(a->c));
    int last = w->cfg->units_total <= 0 || (long)w->cfg->unit_base + a->N >= (long)w->cfg->units_total;
    if (!rc && (last || w->cfg->progress))
        fprintf(stderr,
                "pipedream: asp: %d minibatches, each gradient applied once at each of %d shards; staleness mean "
                "%.2f, max %lld; pull round trip mean %.3f ms, max %.3f ms (forward+backward %.3f ms per unit)\n",
                a->N, a->R, t.applied ? t.stale_sum / (double)t.applied : 0.0, (long long)t.stale_max,
                t.pulls ? 1e3 * t.pull_sum / (double)t.pulls : 0.0, 1e3 * t.pull_max,
                t.n_fwd ? 1e3 * t.fb_s / (double)t.n_fwd : 0.0);
    return rc;
}

static void asp_free(Asp *a, int keep_send_buffers) {
    int R = a->R;
    for (int k = 0; k < R; k++) {
        if (a->rpush) comm_cancel(a->c, &a->rpush[k]);
        if (a->rpull) comm_cancel(a->c, &a->rpull[k]);
        if (a->sreply) comm_cancel(a->c, &a->sreply[k]);
        if (a->spush) comm_cancel(a->c, &a->spush[k]);
    }
    for (int k = 0; k < a->n_fin; k++) comm_cancel(a->c, &a->fin[k]);
    if (!keep_send_buffers) {   /* MPI: a cancelled send may still read its buffer (comm_cancel) */
        for (int k = 0; k < R && a->replybuf; k++) pd_free(a->replybuf[k]);
        pd_free(a->master);
    }
    for (int k = 0; k < R && a->pushbuf; k++) pd_free(a->pushbuf[k]);
    free(a->pushbuf), free(a->replybuf), free(a->rpush), free(a->sreply), free(a->spush), free(a->rpull);
    free(a->next), free(a->pulled), free(a->lo), free(a->fin), free(a->fin_peer);
}

int rt_asp_exec(Worker *w, RtAspLog *log, Err *err) {
    const Schedule *s = w->s;
    PD_ASSERT(s->kind == SCHED_ASP && s->n_stages == 1 && w->stage == 0);
    Asp a;
    memset(&a, 0, sizeof a);
    a.w = w, a.c = w->c, a.log = log;
    a.R = s->stages[0].replicas, a.me = w->sw->replica, a.ranks = s->stages[0].ranks, a.N = s->n_units;
    int R = a.R, me = a.me, rc = PD_OK;
    if (comm_size(w->c) != R) {
        err_set(err, PD_EINVAL, "rank %d: asp needs every rank to be a replica: %d of %d are", w->rank, R,
                comm_size(w->c));
        return RT_ERR;
    }
    a.lo = malloc((size_t)(R + 1) * sizeof(size_t));
    a.pushbuf = calloc((size_t)R, sizeof(float *));
    a.replybuf = calloc((size_t)R, sizeof(float *));
    a.rpush = calloc((size_t)R, sizeof(CommReq *));
    a.sreply = calloc((size_t)R, sizeof(CommReq *));
    a.spush = calloc((size_t)R, sizeof(CommReq *));
    a.rpull = calloc((size_t)R, sizeof(CommReq *));
    a.next = calloc((size_t)R, sizeof(int));
    a.pulled = calloc((size_t)R, sizeof(long));   /* every rank starts from the same weights: version 0 */
    PD_ASSERT(a.lo && a.pushbuf && a.replybuf && a.rpush && a.sreply && a.spush && a.rpull && a.next && a.pulled);
    for (int k = 0; k <= R; k++) a.lo[k] = shard_lo(w->np, R, k);
    if (w->np / (size_t)R >= (size_t)INT32_MAX) {   /* message shapes are int */
        err_set(err, PD_EINVAL, "rank %d: asp: shards of %zu parameters are too large for one message", w->rank,
                w->np / (size_t)R);
        asp_free(&a, 0);
        return RT_ERR;
    }
    size_t nm = len_of(&a, me);
    a.wl = rt_vstore_get(w, w->newest);
    a.master = pd_alloc_f32(nm ? nm : 1);
    if (nm) memcpy(a.master, a.wl + a.lo[me], nm * sizeof(float));
    a.so = (Optim){.c = w->opt.c, .n = nm, .step = w->opt.step, .lr_scale = 1.0, .m = w->opt.m + a.lo[me],
                   .v = w->opt.v ? w->opt.v + a.lo[me] : NULL};
    size_t extra = nm;
    for (int p = 0; p < R; p++) {
        if (p == me || !units_of(&a, p)) continue;
        a.pushbuf[p] = pd_alloc_f32(nm ? nm : 1), extra += nm;
        if (units_of(&a, p) > 1) a.replybuf[p] = pd_alloc_f32(nm ? nm : 1), extra += nm;
    }
    w->res->mem.comm += extra * sizeof(float);
    w->res->mem.total += extra * sizeof(float);
    w->res->max_versions = 1;
    if (log) {
        memset(log, 0, sizeof *log);
        log->rank = w->rank, log->lo = a.lo[me], log->hi = a.lo[me + 1], log->cap = a.N;
        log->unit = malloc(((size_t)a.N + 1) * sizeof(int32_t));
        log->from = malloc(((size_t)a.N + 1) * sizeof(int32_t));
        PD_ASSERT(log->unit && log->from);
    }
    for (int p = 0; p < R && !rc; p++)
        if (p != me && units_of(&a, p))
            rc = comm_irecv(a.c, a.ranks[p], COMM_GRAD, p, shape1((int)nm), a.pushbuf[p], &a.rpush[p], err);
    double waited = 0;
    int n_me = units_of(&a, me);
    for (int i = 0; i < n_me && !rc; i++) {
        int u = me + i * R, did = 0, has_next = i + 1 < n_me;
        double ts = pd_now(), cs = w->res->compute_s, as = a.apply_s;
        if ((rc = serve(&a, &did, err))) break;
        if ((rc = forward(&a, u, i, err))) break;
        if ((rc = serve(&a, &did, err))) break;   /* pushes that came during the forward */
        if ((rc = backward(&a, u, i, err))) break;
        double t0 = pd_now();
        if ((rc = push_pull(&a, u, has_next, err))) break;
        double t1 = pd_now();
        if ((rc = poll_until(&a, worker_pending, err))) break;
        double t2 = pd_now();
        /* communication: all but the forward, the backward and the optimizer steps */
        waited += (t2 - ts) - (w->res->compute_s - cs) - (a.apply_s - as);
        if (has_next) {
            a.pulls++;
            a.pull_sum += t2 - t0;
            if (t2 - t0 > a.pull_max) a.pull_max = t2 - t0;
            rt_trace_add(w, OP_RECV_ACT, u + R, -1, t1, t2);
        }
    }
    if (!rc) {   /* this worker is done; the shard takes the others' remaining pushes */
        double t1 = pd_now(), ap1 = a.apply_s;
        rc = poll_until(&a, owner_pending, err);
        if (!rc) rc = final_exchange(&a, err);
        waited += pd_now() - t1 - (a.apply_s - ap1);
    }
    if (!rc) {
        PD_ASSERTF(a.ver == a.N, "rank %d: shard %d applied %ld of %d gradients", w->rank, me, a.ver, a.N);
        w->opt.step = a.so.step;
        RtWorkerResult *r = w->res;
        a.fb_s = r->compute_s;
        r->compute_s += a.apply_s;
        r->asp_staleness_mean = a.ver ? a.stale_sum / (double)a.ver : 0;
        r->asp_staleness_max = a.stale_max;
        r->asp_pulls = a.pulls;
        r->asp_pull_ms_mean = a.pulls ? 1e3 * a.pull_sum / (double)a.pulls : 0;
        r->asp_pull_ms_max = 1e3 * a.pull_max;
        double t1 = pd_now();
        rc = report(&a, err);
        r->wait_s += waited + pd_now() - t1;
    }
    asp_free(&a, rc && strcmp(comm_name(a.c), "threads") != 0);
    return rc ? RT_ERR : RT_DONE;
}

/* ---- the log ------------------------------------------------------------------------------- */

void rt_asp_log_release(RtAspLog *l) {
    if (!l) return;
    free(l->unit);
    free(l->from);
    memset(l, 0, sizeof *l);
}

/* ---- figures across segments and workers (the session) ------------------------------------ */

void rt_asp_acc_add(RtWorkerResult *acc, const RtWorkerResult *seg) {
    long n = acc->asp_applied + seg->asp_applied, p = acc->asp_pulls + seg->asp_pulls;
    if (n)
        acc->asp_staleness_mean = (acc->asp_staleness_mean * (double)acc->asp_applied +
                                   seg->asp_staleness_mean * (double)seg->asp_applied) / (double)n;
    if (p)
        acc->asp_pull_ms_mean = (acc->asp_pull_ms_mean * (double)acc->asp_pulls +
                                 seg->asp_pull_ms_mean * (double)seg->asp_pulls) / (double)p;
    acc->asp_applied = n, acc->asp_pulls = p;
    if (seg->asp_staleness_max > acc->asp_staleness_max) acc->asp_staleness_max = seg->asp_staleness_max;
    if (seg->asp_pull_ms_max > acc->asp_pull_ms_max) acc->asp_pull_ms_max = seg->asp_pull_ms_max;
}

void rt_asp_summarize(const RtWorkerResult *res, int n, RtTrainSummary *out) {
    RtWorkerResult t = {0};
    for (int r = 0; r < n; r++) rt_asp_acc_add(&t, &res[r]);
    out->asp_figures = 1;
    out->staleness_mean = t.asp_applied ? t.asp_staleness_mean : NAN;
    out->staleness_max = t.asp_applied ? t.asp_staleness_max : -1;
    out->pull_ms_mean = t.asp_pulls ? t.asp_pull_ms_mean : NAN;
    out->pull_ms_max = t.asp_pulls ? t.asp_pull_ms_max : NAN;
}
