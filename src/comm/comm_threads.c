/* comm_threads.c: the in-process transport: n endpoints (one per worker thread) sharing a
 * mailbox guarded by one mutex. Matching follows MPI: per destination, a FIFO of
 * unexpected messages and a FIFO of posted receives; a message matches the first posted
 * receive with the same (source, tag), and a receive the first unexpected message with the
 * same (source, tag), so messages with equal (source, tag) are non-overtaking. Sends are
 * eager: the payload is copied into the mailbox (or straight into a posted receive's
 * buffer), so a send completes at once. Collectives run in rounds on a shared group state
 * (arrive, the last arrival acts, everyone leaves); all-reduce sums in group rank order.
 * Control blocks (comm.c's control plane) go through the same per-destination FIFO of
 * unexpected messages, on their own tags; a control receive takes the first one from any of
 * its peers, waiting on the endpoint's condition variable.
 * What it does not: flow control (an unmatched send holds its copy until received).
 * Aborts and closed endpoints wake every waiter, so a failed worker never hangs the others. */
#include "comm_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct TMsg {          /* a sent message nobody has received yet */
    struct TMsg *next;
    int src, tag;
    int ctrl;                  /* a control block: data is it (malloc'd), len bytes; hdr unused */
    CommHeader hdr;
    void *data;                /* data message: copy of hdr.count floats (pd_alloc'd), NULL if 0 */
    size_t len;
} TMsg;

typedef struct TReq {
    CommReq base;
    struct TReq *next;         /* in the owner's posted list */
    int posted;                /* still in the posted list */
    int done;
    size_t cap;                /* floats base.buf can take */
} TReq;

typedef struct TEndpoint {
    TMsg *unexp_head, *unexp_tail;   /* messages to this rank, unmatched, in arrival order */
    TReq *posted_head, *posted_tail; /* receives of this rank, unmatched, in post order */
    pthread_cond_t cv;               /* signalled when one of its receives completes */
    int closed;
} TEndpoint;

typedef struct TGroupState {   /* shared by the members of one group */
    struct TGroupState *next;  /* registry */
    int n, *ranks;             /* world ranks in group order */
    char *joined;              /* [n] member i has attached */
    int refs;
    int arrived, broken;
    char why[200];             /* what broke it, for every member's message */
    uint64_t gen;              /* completed rounds */
    float **bufs;              /* [n] all-reduce: member buffers of this round */
    size_t *counts;            /* [n] */
    int *ops, *vals;           /* [n] */
    int result, bad;           /* of the last round */
    float *scratch;            /* all-reduce result, cap floats */
    size_t cap;
} TGroupState;

typedef struct TBox {
    pthread_mutex_t mu;
    pthread_cond_t coll_cv;    /* collective rounds */
    int n, refs;
    TEndpoint *ep;             /* [n] */
    int aborted, abort_rank, abort_code;
    char abort_msg[256];
    TGroupState *groups;       /* registry of user groups */
    TGroupState *world;        /* all ranks: barrier and agree */
} TBox;

typedef struct TComm {         /* Comm.ctx of one endpoint */
    TBox *box;
} TComm;

typedef struct TGroup {        /* CommGroup.ctx */
    TGroupState *gs;
} TGroup;

static const CommOps THREADS_OPS;

/* ---- helpers (called with box->mu held unless said otherwise) --------------------- */

static void wake_all(TBox *b) {
    pthread_cond_broadcast(&b->coll_cv);
    for (int i = 0; i < b->n; i++) pthread_cond_broadcast(&b->ep[i].cv);
}

/* Waits on cv until woken or the absolute deadline (pd_now seconds; 0 = forever).
 * Returns 0, or ETIMEDOUT once the deadline has passed. */
static int timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline) {
    if (deadline <= 0) {
        pthread_cond_wait(cv, mu);
        return 0;
    }
    if (pd_now() >= deadline) return ETIMEDOUT;
    struct timespec ts;
    ts.tv_sec = (time_t)deadline;
    ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    int rc = pthread_cond_timedwait(cv, mu, &ts);
    return rc == ETIMEDOUT || pd_now() >= deadline ? ETIMEDOUT : 0;
}

static int aborted_err(const TBox *b, int me, Err *err) {
    return err_set(err, PD_ECOMM, "rank %d: aborted by rank %d (code %d): %s", me, b->abort_rank, b->abort_code,
                   b->abort_msg);
}

/* Delivers message (hdr, data) into posted receive r: copies the payload only if it fits
 * exactly (otherwise the header check in comm.c reports the mismatch). */
static void deliver(TReq *r, const CommHeader *hdr, const void *data) {
    r->base.hdr = *hdr;
    if (hdr->count == r->cap && hdr->count > 0) memcpy(r->base.buf, data, hdr->count * sizeof(float));
    r->done = 1;
}

static void msg_free(TMsg *m) {
    if (m->ctrl) free(m->data);
    else pd_free(m->data);
    free(m);
}

static void group_state_free(TGroupState *gs) {
    if (!gs) return;
    free(gs->ranks);
    free(gs->joined);
    free(gs->bufs);
    free(gs->counts);
    free(gs->ops);
    free(gs->vals);
    pd_free(gs->scratch);
    free(gs);
}

static TGroupState *group_state_new(const int *ranks, int n) {
    TGroupState *gs = calloc(1, sizeof *gs);
    PD_ASSERT(gs);
    gs->n = n;
    gs->ranks = malloc((size_t)n * sizeof(int));
    gs->joined = calloc((size_t)n, 1);
    gs->bufs = calloc((size_t)n, sizeof(float *));
    gs->counts = calloc((size_t)n, sizeof(size_t));
    gs->ops = calloc((size_t)n, sizeof(int));
    gs->vals = calloc((size_t)n, sizeof(int));
    PD_ASSERT(gs->ranks && gs->joined && gs->bufs && gs->counts && gs->ops && gs->vals);
    memcpy(gs->ranks, ranks, (size_t)n * sizeof(int));
    return gs;
}

static void box_free(TBox *b) {
    for (int i = 0; i < b->n; i++) {
        for (TMsg *m = b->ep[i].unexp_head, *nx; m; m = nx) {
            nx = m->next;
            msg_free(m);
        }
        pthread_cond_destroy(&b->ep[i].cv);
    }
    for (TGroupState *g = b->groups, *nx; g; g = nx) {
        nx = g->next;
        group_state_free(g);
    }
    group_state_free(b->world);
    pthread_cond_destroy(&b->coll_cv);
    pthread_mutex_destroy(&b->mu);
    free(b->ep);
    free(b);
}

static int init_cond(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);   /* the clock of pd_now() */
    int rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc;
}

/* ---- creation and closing --------------------------------------------------------- */

int comm_threads_create(int n, Comm **eps, Err *err) {
    if (n < 1) return err_set(err, PD_EINVAL, "threads transport: %d endpoints (need at least 1)", n);
    TBox *b = calloc(1, sizeof *b);
    PD_ASSERT(b);
    b->n = n;
    b->refs = n;
    b->ep = calloc((size_t)n, sizeof *b->ep);
    PD_ASSERT(b->ep);
    PD_ASSERT(pthread_mutex_init(&b->mu, NULL) == 0);
    PD_ASSERT(init_cond(&b->coll_cv) == 0);
    for (int i = 0; i < n; i++) PD_ASSERT(init_cond(&b->ep[i].cv) == 0);
    int *all = malloc((size_t)n * sizeof(int));
    PD_ASSERT(all);
    for (int i = 0; i < n; i++) all[i] = i;
    b->world = group_state_new(all, n);
    free(all);
    for (int i = 0; i < n; i++) {
        Comm *c = calloc(1, sizeof *c);
        TComm *t = calloc(1, sizeof *t);
        PD_ASSERT(c && t);
        t->box = b;
        c->ops = &THREADS_OPS;
        c->ctx = t;
        c->rank = i;
        c->size = n;
        c->tag_window = COMM_TAG_WINDOW;
        eps[i] = c;
    }
    return PD_OK;
}

/* Marks rank me's endpoint closed and wakes everyone (peers waiting on it then fail). */
static void close_endpoint(TBox *b, int me) {
    pthread_mutex_lock(&b->mu);
    b->ep[me].closed = 1;
    wake_all(b);
    pthread_mutex_unlock(&b->mu);
}

static void t_free(Comm *c) {
    TComm *t = c->ctx;
    TBox *b = t->box;
    pthread_mutex_lock(&b->mu);
    b->ep[c->rank].closed = 1;
    wake_all(b);
    int last = --b->refs == 0;
    pthread_mutex_unlock(&b->mu);
    if (last) box_free(b);
    free(t);
    free(c);
}

/* ---- point to point --------------------------------------------------------------- */

static CommReq *t_req_new(Comm *c) {
    (void)c;
    TReq *r = calloc(1, sizeof *r);
    PD_ASSERT(r);
    return &r->base;
}

static int t_isend(Comm *c, CommReq *req, const float *data, Err *err) {
    TBox *b = ((TComm *)c->ctx)->box;
    TReq *r = (TReq *)req;
    const CommHeader *hdr = &req->hdr;
    const int peer = req->peer, tag = req->tag;
    int rc = PD_OK;
    pthread_mutex_lock(&b->mu);
    if (b->aborted) {
        rc = aborted_err(b, c->rank, err);
        goto out;
    }
    if (b->ep[peer].closed) {
        rc = err_set(err, PD_ECOMM, "rank %d: sending %s of minibatch %" PRId64 " to rank %d: its endpoint is closed",
                     c->rank, comm_kind_name(req->kind), req->mb, peer);
        goto out;
    }
    TEndpoint *d = &b->ep[peer];
    TReq *prev = NULL, *p = d->posted_head;
    while (p && !(p->base.peer == c->rank && p->base.tag == tag)) {
        prev = p;
        p = p->next;
    }
    if (p) {   /* a receive is waiting: copy straight into its buffer */
        if (prev) prev->next = p->next;
        else d->posted_head = p->next;
        if (d->posted_tail == p) d->posted_tail = prev;
        p->posted = 0;
        p->next = NULL;
        deliver(p, hdr, data);
        pthread_cond_broadcast(&d->cv);
    } else {   /* keep a copy until a receive is posted */
        TMsg *m = calloc(1, sizeof *m);
        PD_ASSERT(m);
        m->src = c->rank;
        m->tag = tag;
        m->hdr = *hdr;
        if (hdr->count > 0) {
            m->data = pd_alloc(hdr->count * sizeof(float));
            memcpy(m->data, data, hdr->count * sizeof(float));
        }
        if (d->unexp_tail) d->unexp_tail->next = m;
        else d->unexp_head = m;
        d->unexp_tail = m;
    }
    r->done = 1;   /* eager: complete once handed over */
out:
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static int t_irecv(Comm *c, CommReq *req, size_t cap, Err *err) {
    TBox *b = ((TComm *)c->ctx)->box;
    TReq *r = (TReq *)req;
    int rc = PD_OK;
    r->cap = cap;
    pthread_mutex_lock(&b->mu);
    if (b->aborted) {
        rc = aborted_err(b, c->rank, err);
        goto out;
    }
    TEndpoint *me = &b->ep[c->rank];
    TMsg *prev = NULL, *m = me->unexp_head;
    while (m && !(!m->ctrl && m->src == req->peer && m->tag == req->tag)) {
        prev = m;
        m = m->next;
    }
    if (m) {   /* already here */
        if (prev) prev->next = m->next;
        else me->unexp_head = m->next;
        if (me->unexp_tail == m) me->unexp_tail = prev;
        deliver(r, &m->hdr, m->data);
        msg_free(m);
    } else {
        r->posted = 1;
        if (me->posted_tail) me->posted_tail->next = r;
        else me->posted_head = r;
        me->posted_tail = r;
    }
out:
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static int t_wait(Comm *c, CommReq *req, double deadline, Err *err) {
    TBox *b = ((TComm *)c->ctx)->box;
    TReq *r = (TReq *)req;
    TEndpoint *me = &b->ep[c->rank];
    int st;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        if (r->done) {
            st = COMM_DONE;
            break;
        }
        if (b->aborted) {
            st = -aborted_err(b, c->rank, err);
            break;
        }
        if (b->ep[req->peer].closed) {
            st = -err_set(err, PD_ECOMM,
                          "rank %d: rank %d closed its endpoint (its worker ended) before sending %s of minibatch %" PRId64,
                          c->rank, req->peer, comm_kind_name(req->kind), req->mb);
            break;
        }
        if (deadline < 0 || timed_wait(&me->cv, &b->mu, deadline) == ETIMEDOUT) {
            st = r->done ? COMM_DONE : COMM_PENDING;
            break;
        }
    }
    pthread_mutex_unlock(&b->mu);
    return st;
}

/* Unlinks a posted receive (mu held). */
static void unpost(TEndpoint *me, TReq *r) {
    if (!r->posted) return;
    TReq *prev = NULL, *p = me->posted_head;
    while (p && p != r) {
        prev = p;
        p = p->next;
    }
    PD_ASSERT(p == r);
    if (prev) prev->next = r->next;
    else me->posted_head = r->next;
    if (me->posted_tail == r) me->posted_tail = prev;
    r->posted = 0;
    r->next = NULL;
}

static void t_cancel(Comm *c, CommReq *req) {
    TBox *b = ((TComm *)c->ctx)->box;
    pthread_mutex_lock(&b->mu);
    unpost(&b->ep[c->rank], (TReq *)req);
    pthread_mutex_unlock(&b->mu);
}

static void t_req_free(Comm *c, CommReq *req) {
    t_cancel(c, req);
    free(req);
}

/* ---- control plane ---------------------------------------------------------------- */

/* Appends a block to peer's unexpected messages (eager, like data sends) and wakes it. */
static int t_ctrl_post(Comm *c, int peer, int tag, void *blob, size_t len, Err *err) {
    TBox *b = ((TComm *)c->ctx)->box;
    int rc = PD_OK;
    pthread_mutex_lock(&b->mu);
    if (b->aborted) {
        rc = aborted_err(b, c->rank, err);
    } else if (b->ep[peer].closed) {
        rc = err_set(err, PD_ECOMM, "rank %d: sending to rank %d: its endpoint is closed (its worker ended)", c->rank,
                     peer);
    } else {
        TMsg *m = calloc(1, sizeof *m);
        PD_ASSERT(m);
        m->src = c->rank;
        m->tag = tag;
        m->ctrl = 1;
        m->data = blob;
        m->len = len;
        TEndpoint *d = &b->ep[peer];
        if (d->unexp_tail) d->unexp_tail->next = m;
        else d->unexp_head = m;
        d->unexp_tail = m;
        blob = NULL;
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&b->mu);
    free(blob);
    return rc;
}

/* Eager: a posted block is already the peer's. */
static int t_ctrl_flush(Comm *c, int peer, int tag, double deadline, int *late, Err *err) {
    (void)c, (void)peer, (void)tag, (void)deadline, (void)late, (void)err;
    return COMM_DONE;
}

/* The earliest control block on tag from any of peers in me's unexpected messages. */
static TMsg *find_ctrl(TEndpoint *me, const int *peers, int np, int tag, TMsg **prev_out) {
    TMsg *prev = NULL;
    for (TMsg *m = me->unexp_head; m; prev = m, m = m->next) {
        if (!m->ctrl || m->tag != tag) continue;
        for (int i = 0; i < np; i++)
            if (peers[i] == m->src) {
                *prev_out = prev;
                return m;
            }
    }
    return NULL;
}

static int t_ctrl_take(Comm *c, const int *peers, int np, int tag, double deadline, int *from, void **blob,
                       size_t *len, Err *err) {
    TBox *b = ((TComm *)c->ctx)->box;
    TEndpoint *me = &b->ep[c->rank];
    int st, timed_out = 0;
    *from = -1;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        TMsg *prev = NULL, *m = find_ctrl(me, peers, np, tag, &prev);
        if (m) {
            if (prev) prev->next = m->next;
            else me->unexp_head = m->next;
            if (me->unexp_tail == m) me->unexp_tail = prev;
            *from = m->src;
            *blob = m->data;
            *len = m->len;
            free(m);
            st = COMM_DONE;
            break;
        }
        if (b->aborted) {
            st = -aborted_err(b, c->rank, err);
            break;
        }
        int gone = -1;
        for (int i = 0; i < np && gone < 0; i++)
            if (b->ep[peers[i]].closed) gone = peers[i];
        if (gone >= 0) {   /* it sent nothing we wait for, and never will */
            *from = gone;
            st = -err_set(err, PD_ECOMM, "rank %d: rank %d closed its endpoint (its worker ended) without sending",
                          c->rank, gone);
            break;
        }
        if (timed_out || deadline < 0) {
            *from = peers[0];
            st = COMM_PENDING;
            break;
        }
        /* on expiry, one more pass looks for a block that came with the deadline */
        timed_out = timed_wait(&me->cv, &b->mu, deadline) == ETIMEDOUT;
    }
    pthread_mutex_unlock(&b->mu);
    return st;
}

/* ---- collectives: rounds on a group state ----------------------------------------- */

/* Member `me` (group position; world rank `wr`) enters a round of gs. The last arrival
 * runs last(gs) under the lock before releasing everyone. Returns PD_OK or PD_ECOMM
 * (abort, a member's endpoint closed before arriving, deadline: the group is then broken). */
static int round_sync(TBox *b, TGroupState *gs, int wr, double deadline, void (*last)(TGroupState *), Err *err) {
    int rc = PD_OK;
    pthread_mutex_lock(&b->mu);
    if (b->aborted) {
        rc = aborted_err(b, wr, err);
        goto out;
    }
    if (gs->broken) {
        rc = err_set(err, PD_ECOMM, "rank %d: collective on a broken group (%s)", wr, gs->why);
        goto out;
    }
    if (++gs->arrived == gs->n) {
        gs->arrived = 0;
        gs->gen++;
        if (last) last(gs);
        pthread_cond_broadcast(&b->coll_cv);
        goto out;
    }
    uint64_t gen = gs->gen;
    for (;;) {
        if (gs->gen != gen) break;
        if (b->aborted) {
            rc = aborted_err(b, wr, err);
            break;
        }
        if (gs->broken) {
            rc = err_set(err, PD_ECOMM, "rank %d: collective failed: %s", wr, gs->why);
            break;
        }
        int gone = -1;
        for (int i = 0; i < gs->n && gone < 0; i++)
            if (b->ep[gs->ranks[i]].closed) gone = gs->ranks[i];
        if (gone >= 0) {
            gs->broken = 1;
            snprintf(gs->why, sizeof gs->why, "rank %d closed its endpoint without joining", gone);
            rc = err_set(err, PD_ECOMM, "rank %d: collective failed: %s", wr, gs->why);
            break;
        }
        if (timed_wait(&b->coll_cv, &b->mu, deadline) == ETIMEDOUT && gs->gen == gen) {
            gs->broken = 1;
            snprintf(gs->why, sizeof gs->why, "timed out on rank %d with %d of %d ranks arrived", wr, gs->arrived,
                     gs->n);
            rc = err_set(err, PD_ECOMM, "rank %d: collective failed: %s", wr, gs->why);
            break;
        }
    }
    if (rc) pthread_cond_broadcast(&b->coll_cv);   /* others see broken */
out:
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static int t_barrier(Comm *c, Err *err) {
    TBox *b = ((TComm *)c->ctx)->box;
    return round_sync(b, b->world, c->rank, comm_coll_deadline(c), NULL, err);
}

static void agree_last(TGroupState *gs) {
    gs->result = gs->vals[0];
    for (int i = 1; i < gs->n; i++)
        if (gs->vals[i] > gs->result) gs->result = gs->vals[i];
}

static int t_agree(Comm *c, int rc, int *out, Err *err) {
    TBox *b = ((TComm *)c->ctx)->box;
    pthread_mutex_lock(&b->mu);
    b->world->vals[c->rank] = rc;
    pthread_mutex_unlock(&b->mu);
    int st = round_sync(b, b->world, c->rank, comm_coll_deadline(c), agree_last, err);
    if (st) return st;
    /* result stays until the next round completes, which needs this rank to arrive */
    pthread_mutex_lock(&b->mu);
    *out = b->world->result;
    pthread_mutex_unlock(&b->mu);
    return PD_OK;
}

static void t_abort(Comm *c, int code, const char *msg) {
    TBox *b = ((TComm *)c->ctx)->box;
    pthread_mutex_lock(&b->mu);
    if (!b->aborted) {
        b->aborted = 1;
        b->abort_rank = c->rank;
        b->abort_code = code;
        snprintf(b->abort_msg, sizeof b->abort_msg, "%s", msg);
    }
    wake_all(b);
    pthread_mutex_unlock(&b->mu);
}

static void t_group_free(CommGroup *g) {
    TBox *b = ((TComm *)g->comm->ctx)->box;
    TGroupState *gs = ((TGroup *)g->ctx)->gs;
    pthread_mutex_lock(&b->mu);
    if (--gs->refs == 0) {
        TGroupState **pp = &b->groups;
        while (*pp != gs) pp = &(*pp)->next;
        *pp = gs->next;
        group_state_free(gs);
    }
    pthread_mutex_unlock(&b->mu);
    free(g->ctx);
}

/* Joins (or starts) the shared state of the group with this list that this member has
 * not joined yet. */
static int t_group_new(CommGroup *g, Err *err) {
    Comm *c = g->comm;
    TBox *b = ((TComm *)c->ctx)->box;
    const int n = g->size, me = g->rank;
    pthread_mutex_lock(&b->mu);
    TGroupState *gs = b->groups;
    for (; gs; gs = gs->next)
        if (gs->n == n && !memcmp(gs->ranks, g->ranks, (size_t)n * sizeof(int)) && !gs->joined[me]) break;
    if (!gs) {
        gs = group_state_new(g->ranks, n);
        gs->next = b->groups;
        b->groups = gs;
    }
    gs->joined[me] = 1;
    gs->refs++;
    pthread_mutex_unlock(&b->mu);

    TGroup *tg = calloc(1, sizeof *tg);
    PD_ASSERT(tg);
    tg->gs = gs;
    g->ctx = tg;
    /* collective, as under MPI: everyone has joined when anyone returns */
    int rc = round_sync(b, gs, c->rank, comm_coll_deadline(c), NULL, err);
    if (rc) {
        t_group_free(g);
        g->ctx = NULL;
    }
    return rc;
}

static void allreduce_last(TGroupState *gs) {
    gs->bad = 0;
    for (int i = 1; i < gs->n; i++)
        if (gs->counts[i] != gs->counts[0] || gs->ops[i] != gs->ops[0]) gs->bad = 1;
    if (!gs->bad && gs->counts[0] > gs->cap) {
        pd_free(gs->scratch);
        gs->scratch = pd_alloc(gs->counts[0] * sizeof(float));
        gs->cap = gs->counts[0];
    }
}

static int t_allreduce(CommGroup *g, float *buf, size_t n, CommOp op, Err *err) {
    Comm *c = g->comm;
    TBox *b = ((TComm *)c->ctx)->box;
    TGroupState *gs = ((TGroup *)g->ctx)->gs;
    double deadline = comm_coll_deadline(c);
    pthread_mutex_lock(&b->mu);
    gs->bufs[g->rank] = buf;
    gs->counts[g->rank] = n;
    gs->ops[g->rank] = op;
    pthread_mutex_unlock(&b->mu);
    int rc = round_sync(b, gs, c->rank, deadline, allreduce_last, err);
    if (rc) return err_prefix(err, "all-reduce of %zu floats", n);
    /* bufs, counts, bad and scratch stay put until the next round 1 completes, which needs
     * every member to arrive again; the mutex above made the other members' stores visible. */
    if (gs->bad) {
        char list[256];
        size_t len = 0;
        list[0] = 0;
        for (int i = 0; i < gs->n && len + 40 < sizeof list; i++)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s rank %d: %zu floats op %d", i ? "," : "",
                                    gs->ranks[i], gs->counts[i], gs->ops[i]);
        return err_set(err, PD_ECOMM, "rank %d: all-reduce: members disagree on size or op:%s", c->rank, list);
    }
    /* each member sums a slice of the elements, in group rank order */
    size_t chunk = (n + (size_t)gs->n - 1) / (size_t)gs->n;
    size_t lo = chunk * (size_t)g->rank, hi = lo + chunk < n ? lo + chunk : n;
    if (lo < hi) {
        const float *xs[gs->n];
        for (int i = 0; i < gs->n; i++) xs[i] = gs->bufs[i] + lo;
        comm_sum_serial(xs, gs->n, hi - lo, op, gs->scratch + lo);
    }
    rc = round_sync(b, gs, c->rank, deadline, NULL, err);
    if (rc) return err_prefix(err, "all-reduce of %zu floats", n);
    if (n > 0) memcpy(buf, gs->scratch, n * sizeof(float));
    return PD_OK;
}

static const CommOps THREADS_OPS = {
    .name = "threads",
    .req_new = t_req_new,
    .isend = t_isend,
    .irecv = t_irecv,
    .wait = t_wait,
    .cancel = t_cancel,
    .req_free = t_req_free,
    .ctrl_post = t_ctrl_post,
    .ctrl_flush = t_ctrl_flush,
    .ctrl_take = t_ctrl_take,
    .barrier = t_barrier,
    .agree = t_agree,
    .abort = t_abort,
    .group_new = t_group_new,
    .group_free = t_group_free,
    .allreduce = t_allreduce,
    .free = t_free,
};

/* ---- running workers -------------------------------------------------------------- */

typedef struct RunArg {
    Comm *c;
    CommWorkerFn fn;
    void *arg;
    int rc;
} RunArg;

static void *run_one(void *p) {
    RunArg *a = p;
    a->rc = a->fn(a->c, a->c->rank, a->arg);
    /* a worker that has ended will send nothing more: peers still waiting on it fail */
    close_endpoint(((TComm *)a->c->ctx)->box, a->c->rank);
    return NULL;
}

int comm_threads_run(int n, CommWorkerFn fn, void *arg, int *rcs, Err *err) {
    if (n < 1) return err_set(err, PD_EINVAL, "threads transport: %d workers (need at least 1)", n);
    Comm **eps = calloc((size_t)n, sizeof *eps);
    RunArg *ra = calloc((size_t)n, sizeof *ra);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    PD_ASSERT(eps && ra && th);
    int rc = comm_threads_create(n, eps, err);
    if (rc) goto cleanup;
    int started = 0;
    for (; started < n; started++) {
        ra[started] = (RunArg){eps[started], fn, arg, PD_OK};
        if (pthread_create(&th[started], NULL, run_one, &ra[started]) != 0) break;
    }
    if (started < n) {
        comm_abort(eps[0], PD_ENOMEM, "could not start all worker threads");
        rc = err_set(err, PD_ENOMEM, "threads transport: could not start worker thread %d of %d", started, n);
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < n; i++) {
        if (rcs) rcs[i] = i < started ? ra[i].rc : PD_ENOMEM;
        if (i < started && ra[i].rc > rc) rc = ra[i].rc;
    }
    if (rc && err && !err->code) err_set(err, rc, "threads transport: a worker failed with code %d", rc);
    for (int i = 0; i < n; i++) comm_free(eps[i]);
cleanup:
    free(eps);
    free(ra);
    free(th);
    return rc;
}
