/* comm_threads.c: the in-process transport: n endpoints (one per worker thread) sharing a
 * mailbox guarded by one mutex. Matching follows MPI: per destination, a FIFO of
 * unexpected messages and a FIFO of posted receives; a message matches the first posted
 * receive with the same (source, tag), and a receive the first unexpected message with the
 * same (source, tag), so messages with equal (source, tag) are non-overtaking. Sends are
 * eager: the payload is copied into the mailbox (or straight into a posted receive's
 * buffer), so a send completes at once. Barrier, agree and group set-up run in rounds on a
 * shared group state (arrive, the last arrival acts, everyone leaves). Group messages (the
 * all-reduce engine's, comm_ar.c) are raw bytes in the same FIFOs, matched on (source, tag)
 * and the group's id (its context, like an MPI communicator's), so they never match data,
 * control or another group's messages. Each endpoint counts events (deliveries to it,
 * aborts, closed endpoints) so that a waiter can sleep on its condition variable without
 * missing one.
 * Control blocks (comm_ctrl.c's control plane) go through the same per-destination FIFO of
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
    int ctx;                   /* 0: data or control; > 0: a message of the group with that id */
    int ctrl;                  /* a control block: data is it (malloc'd), len bytes; hdr unused */
    CommHeader hdr;            /* data message (ctx 0, not ctrl) */
    void *data;                /* data message: copy of hdr.count floats; group message: len bytes
                                  (pd_alloc'd, NULL if empty) */
    size_t len;
} TMsg;

typedef struct TReq {
    CommReq base;
    struct TReq *next;         /* in the owner's posted list */
    int posted;                /* still in the posted list */
    int done;
    int ctx;                   /* as TMsg.ctx */
    size_t cap;                /* data: floats base.buf can take; group message: bytes */
    size_t got;                /* group message received: its bytes (copied only if <= cap) */
} TReq;

typedef struct TEndpoint {
    TMsg *unexp_head, *unexp_tail;   /* messages to this rank, unmatched, in arrival order */
    TReq *posted_head, *posted_tail; /* receives of this rank, unmatched, in post order */
    pthread_cond_t cv;               /* signalled when one of its receives completes */
    uint64_t events;                 /* bumped with every signal of cv */
    int closed;
} TEndpoint;

typedef struct TGroupState {   /* shared by the members of one group */
    struct TGroupState *next;  /* registry */
    int id;                    /* > 0, unique in the box: the context of its messages */
    int n, *ranks;             /* world ranks in group order */
    char *joined;              /* [n] member i has attached */
    int refs;
    int arrived, broken;
    char why[200];             /* what broke it, for every member's message */
    uint64_t gen;              /* completed rounds */
    int *vals;                 /* [n] agree: the codes of this round */
    int result;                /* of the last round */
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
    int next_group_id;
} TBox;

/* ---- an endpoint's two queues (the box's mu held) ---------------------------------------- */

static void unexp_push(TEndpoint *d, TMsg *m) {
    if (d->unexp_tail) d->unexp_tail->next = m;
    else d->unexp_head = m;
    d->unexp_tail = m;
}

/* Unlinks m, which follows prev (NULL: m is the head), from me's unexpected messages. */
static void unexp_unlink(TEndpoint *me, TMsg *prev, TMsg *m) {
    if (prev) prev->next = m->next;
    else me->unexp_head = m->next;
    if (me->unexp_tail == m) me->unexp_tail = prev;
}

/* The earliest unexpected message of me from src on (ctx, tag), data or group (not a control
 * block), unlinked; NULL if none has arrived. */
static TMsg *unexp_take(TEndpoint *me, int ctx, int src, int tag) {
    TMsg *prev = NULL, *m = me->unexp_head;
    while (m && !(!m->ctrl && m->ctx == ctx && m->src == src && m->tag == tag)) {
        prev = m;
        m = m->next;
    }
    if (m) unexp_unlink(me, prev, m);
    return m;
}

static void posted_push(TEndpoint *me, TReq *r) {
    r->posted = 1;
    if (me->posted_tail) me->posted_tail->next = r;
    else me->posted_head = r;
    me->posted_tail = r;
}

/* The earliest receive posted at d for a message from src on (ctx, tag), unlinked; NULL if
 * none is waiting. */
static TReq *posted_take(TEndpoint *d, int ctx, int src, int tag) {
    TReq *prev = NULL, *p = d->posted_head;
    while (p && !(p->ctx == ctx && p->base.peer == src && p->base.tag == tag)) {
        prev = p;
        p = p->next;
    }
    if (!p) return NULL;
    if (prev) prev->next = p->next;
    else d->posted_head = p->next;
    if (d->posted_tail == p) d->posted_tail = prev;
    p->posted = 0;
    p->next = NULL;
    return p;
}

typedef struct TComm {         /* Comm.ctx of one endpoint */
    TBox *box;
} TComm;

typedef struct TGroup {        /* CommGroup.ctx */
    TGroupState *gs;
} TGroup;

static const CommOps THREADS_OPS;

/* ---- helpers (called with box->mu held unless said otherwise) --------------------- */

static void signal_ep(TEndpoint *e) {
    e->events++;
    pthread_cond_broadcast(&e->cv);
}

static void wake_all(TBox *b) {
    pthread_cond_broadcast(&b->coll_cv);
    for (int i = 0; i < b->n; i++) signal_ep(&b->ep[i]);
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

/* Delivers a group message of len bytes: copied if it fits (a longer one is an error in
 * t_g_test). */
static void deliver_raw(TReq *r, const void *data, size_t len) {
    r->got = len;
    if (len <= r->cap && len > 0) memcpy(r->base.buf, data, len);
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
    free(gs->vals);
    free(gs);
}

static TGroupState *group_state_new(const int *ranks, int n) {
    TGroupState *gs = calloc(1, sizeof *gs);
    PD_ASSERT(gs);
    gs->n = n;
    gs->ranks = malloc((size_t)n * sizeof(int));
    gs->joined = calloc((size_t)n, 1);
    gs->vals = calloc((size_t)n, sizeof(int));
    PD_ASSERT(gs->ranks && gs->joined && gs->vals);
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
    CommProgress mode;
    long nap_ns;
    int rc = comm_progress_mode(&mode, &nap_ns, err);
    if (rc) return rc;
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
        comm_ar_init(c, mode, nap_ns, 1);   /* the mailbox is one mutex: any thread may call */
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
    TReq *p = posted_take(d, 0, c->rank, tag);
    if (p) {   /* a receive is waiting: copy straight into its buffer */
        deliver(p, hdr, data);
        signal_ep(d);
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
        unexp_push(d, m);
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
    TMsg *m = unexp_take(me, 0, req->peer, req->tag);
    if (m) {   /* already here */
        deliver(r, &m->hdr, m->data);
        msg_free(m);
    } else {
        posted_push(me, r);
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
        unexp_push(d, m);
        blob = NULL;
        signal_ep(d);
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
            unexp_unlink(me, prev, m);
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
        gs->id = ++b->next_group_id;
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

/* ---- group messages (the all-reduce engine's) --------------------------------------- */

/* Eager, like t_isend; but a message to an endpoint that has closed is dropped instead of
 * failing: the members that wait for that rank name it (its notice or pieces never come),
 * rather than each blaming whichever neighbour failed first. */
static int t_g_isend(CommGroup *g, int peer, int tag, const void *data, size_t bytes, CommReq **out, Err *err) {
    Comm *c = g->comm;
    TBox *b = ((TComm *)c->ctx)->box;
    const int id = ((TGroup *)g->ctx)->gs->id, to = g->ranks[peer];
    int rc = PD_OK;
    *out = NULL;
    pthread_mutex_lock(&b->mu);
    if (b->aborted) {
        rc = aborted_err(b, c->rank, err);
        goto out;
    }
    TEndpoint *d = &b->ep[to];
    /* closed: dropped below, it can never be received */
    TReq *p = d->closed ? NULL : posted_take(d, id, c->rank, tag);
    if (p) {   /* a receive is waiting: copy straight into its buffer */
        deliver_raw(p, data, bytes);
        signal_ep(d);
    } else if (!d->closed) {   /* keep a copy until a receive is posted */
        TMsg *m = calloc(1, sizeof *m);
        PD_ASSERT(m);
        m->src = c->rank;
        m->tag = tag;
        m->ctx = id;
        m->len = bytes;
        if (bytes > 0) {
            m->data = pd_alloc(bytes);
            memcpy(m->data, data, bytes);
        }
        unexp_push(d, m);
    }
    TReq *r = (TReq *)t_req_new(c);
    r->base.is_recv = 0;
    r->base.peer = to;
    r->base.tag = tag;
    r->ctx = id;
    r->done = 1;   /* eager */
    *out = &r->base;
out:
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static int t_g_irecv(CommGroup *g, int peer, int tag, void *buf, size_t bytes, CommReq **out, Err *err) {
    Comm *c = g->comm;
    TBox *b = ((TComm *)c->ctx)->box;
    const int id = ((TGroup *)g->ctx)->gs->id, from = g->ranks[peer];
    TReq *r = (TReq *)t_req_new(c);
    r->base.is_recv = 1;
    r->base.peer = from;
    r->base.tag = tag;
    r->base.buf = buf;
    r->ctx = id;
    r->cap = bytes;
    int rc = PD_OK;
    pthread_mutex_lock(&b->mu);
    if (b->aborted) {
        rc = aborted_err(b, c->rank, err);
        goto out;
    }
    TEndpoint *me = &b->ep[c->rank];
    TMsg *m = unexp_take(me, id, from, tag);
    if (m) {   /* already here */
        deliver_raw(r, m->data, m->len);
        msg_free(m);
    } else {
        posted_push(me, r);
    }
out:
    pthread_mutex_unlock(&b->mu);
    if (rc) {
        free(r);
        return rc;
    }
    *out = &r->base;
    return PD_OK;
}

static int t_g_test(CommGroup *g, CommReq *req, size_t *got, Err *err) {
    Comm *c = g->comm;
    TBox *b = ((TComm *)c->ctx)->box;
    TReq *r = (TReq *)req;
    int st = COMM_PENDING;
    pthread_mutex_lock(&b->mu);
    if (r->done) {
        if (req->is_recv && r->got > r->cap)
            st = -err_set(err, PD_ECOMM, "rank %d: all-reduce: rank %d sent %zu bytes, this rank expected %zu", c->rank,
                          req->peer, r->got, r->cap);
        else st = COMM_DONE;
        if (got) *got = r->got;
    } else if (b->aborted) {
        st = -aborted_err(b, c->rank, err);
    } else if (b->ep[req->peer].closed) {
        st = -err_set(err, PD_ECOMM, "rank %d: all-reduce: rank %d closed its endpoint (its worker ended) before "
                      "sending its part", c->rank, req->peer);
    }
    pthread_mutex_unlock(&b->mu);
    return st;
}

static int t_g_free(CommGroup *g, CommReq *req) {
    t_req_free(g->comm, req);
    return 1;
}

static uint64_t t_events(Comm *c) {
    TBox *b = ((TComm *)c->ctx)->box;
    pthread_mutex_lock(&b->mu);
    uint64_t v = b->ep[c->rank].events;
    pthread_mutex_unlock(&b->mu);
    return v;
}

static void t_idle(Comm *c, uint64_t mark, double t0, double deadline) {
    (void)t0;
    TBox *b = ((TComm *)c->ctx)->box;
    TEndpoint *me = &b->ep[c->rank];
    pthread_mutex_lock(&b->mu);
    if (me->events == mark && !b->aborted) timed_wait(&me->cv, &b->mu, deadline);
    pthread_mutex_unlock(&b->mu);
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
    .g_isend = t_g_isend,
    .g_irecv = t_g_irecv,
    .g_test = t_g_test,
    .g_free = t_g_free,
    .events = t_events,
    .idle = t_idle,
    .has_events = 1,
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
