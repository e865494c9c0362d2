/* comm_mpi.c: the MPI transport (one rank per process). Point-to-point: every message is
 * two MPI messages on a private duplicate of MPI_COMM_WORLD, the 64-byte header (tag t,
 * MPI_BYTE) and the payload (tag t + 1, MPI_FLOAT, possibly empty), so the payload lands in
 * the receiver's buffer without a staging copy; t comes from (kind, minibatch), see
 * comm_tag. Waits poll MPI_Test (spin, then yield, then short sleeps) so that they can give
 * up at a deadline instead of blocking forever. Collectives (barrier, agree) are the
 * non-blocking MPI ones polled the same way. Group all-reduce is NOT MPI_Allreduce (its
 * summation order is unspecified): comm_ar.c runs a ring on the group messages this file
 * provides, one MPI message (MPI_BYTE) per piece or notice on the group's own communicator
 * (MPI_Comm_create_group over the listed ranks, group rank = list position).
 * Control blocks (comm_ctrl.c's control plane) are one MPI message each (header and payload
 * packed, MPI_BYTE) on the channel's tag, above every data tag; a control receive matches
 * with MPI_Improbe (source by source, so it can give up at a deadline without taking
 * anything) and receives the matched message with MPI_Imrecv at its exact size. Sends in
 * flight are kept (request and block) until they complete.
 * Error handler MPI_ERRORS_RETURN everywhere: MPI failures come back as PD_ECOMM.
 * Threads: MPI_THREAD_MULTIPLE where MPI gives it: the all-reduce progress thread (comm_ar.c)
 * calls the group-message functions below while the caller's thread uses the rest. Without
 * it (PD_COMM_PROGRESS=caller, or an MPI that gives only FUNNELED) one thread calls MPI. */
#include "comm_impl.h"

#include <inttypes.h>
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct MPend {     /* a control block in flight */
    MPI_Request rq;
    void *blob;            /* malloc'd; freed when rq completes */
    int peer, tag;         /* peer -1: a receive that gave up at its deadline mid-transfer */
} MPend;

typedef struct MComm {
    MPI_Comm comm;         /* duplicate of MPI_COMM_WORLD, errors return */
    int finalize;          /* we initialised MPI, so comm_free finalises it */
    MPend *pend;           /* control blocks in flight */
    int npend, cap;
} MComm;

typedef struct MReq {
    CommReq base;
    MPI_Request r[2];      /* header, payload */
    int got[2];
} MReq;

typedef struct MGroup {
    MPI_Comm comm;         /* the group's communicator, errors return */
} MGroup;

static const CommOps MPI_OPS;

static int mpi_err(Err *err, int me, int mrc, const char *fmt_what, const char *what2) {
    char s[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(mrc, s, &len);
    return err_set(err, PD_ECOMM, "rank %d: MPI error in %s%s: %s", me, fmt_what, what2 ? what2 : "", s);
}

/* A wait's phases, seconds, from the environment once: spin until PD_COMM_SPIN_US (default
 * 50), yield the core until PD_COMM_YIELD_US (default 0: no yielding), nap at most
 * PD_COMM_NAP_MAX_US (default 1000, at least 50). */
static double env_us(const char *name, long dflt, long lo, long hi) {
    const char *e = getenv(name);
    long us = e && *e ? strtol(e, NULL, 10) : dflt;
    return (us < lo ? lo : us > hi ? hi : us) * 1e-6;
}
static double spin_s(void) {
    static double v = -1;
    if (v < 0) v = env_us("PD_COMM_SPIN_US", 50, 0, 1000000);
    return v;
}
static double yield_s(void) {
    static double v = -1;
    if (v < 0) v = env_us("PD_COMM_YIELD_US", 0, 0, 1000000);
    return v;
}
static double nap_max_s(void) {
    static double v = -1;
    if (v < 0) v = env_us("PD_COMM_NAP_MAX_US", 1000, 50, 1000000);
    return v;
}

/* Waiting without burning a core: spin briefly (latency), then nap for 1/20 of the wait so
 * far (50 us .. nap_max_s()): a wait ends at most ~5% later than its message came, and a long
 * one polls MPI a few hundred times a second, not 10,000 times. No yielding by default: where
 * ranks share cores (the emulated cluster, or more ranks than cores), a yielding rank keeps
 * its fair share of the core and every poll (an MPI_Test runs Open MPI's progress engine over
 * every socket) is taken from a computing rank; on 4 emulated hosts sharing 2 cores, spinning
 * 200 us and yielding until 5 ms cost vgg16's 1f1b 5% and 1f1b-flush 14% of their throughput
 * against this policy (docs/explanation/communication.md, "Waiting"). */
static void backoff(double t0) {
    double el = pd_now() - t0;
    if (el < spin_s()) return;
    if (el < yield_s()) {
        sched_yield();
        return;
    }
    double nap = el / 20, mx = nap_max_s();
    if (nap > mx) nap = mx;
    if (nap < 5e-5) nap = 5e-5;
    struct timespec ts = {0, (long)(nap * 1e9)};
    nanosleep(&ts, NULL);
}

/* Polls until all n requests complete (PD_OK) or the absolute deadline passes (0 = none):
 * then returns PD_ECOMM naming what. */
static int poll_all(MPI_Request *rq, int n, double deadline, int me, const char *what, Err *err) {
    double t0 = pd_now();
    for (;;) {
        int flag = 0;
        int mrc = MPI_Testall(n, rq, &flag, MPI_STATUSES_IGNORE);
        if (mrc != MPI_SUCCESS) return mpi_err(err, me, mrc, what, NULL);
        if (flag) return PD_OK;
        if (deadline > 0 && pd_now() >= deadline)
            return err_set(err, PD_ECOMM, "rank %d: %s timed out after %.3g s (a rank is missing or dead)", me, what,
                           pd_now() - t0);
        backoff(t0);
    }
}

/* ---- creation --------------------------------------------------------------------- */

int comm_mpi_create(int *argc, char ***argv, Comm **out, Err *err) {
    *out = NULL;
    CommProgress mode;
    long nap_ns;
    int rc = comm_progress_mode(&mode, &nap_ns, err);
    if (rc) return rc;
    /* a progress thread calls MPI beside the caller: MPI_THREAD_MULTIPLE */
    const int want = mode == COMM_PROGRESS_CALLER ? MPI_THREAD_FUNNELED : MPI_THREAD_MULTIPLE;
    int inited = 0, provided = 0, finalize = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        /* Open MPI's TCP transport sends a message above its eager limit (64 KiB) by
         * rendezvous: the data moves only after the receiver's go-ahead, and then only while
         * the sender is inside an MPI call, so a stage's activation (hundreds of KB) waits on
         * the sender's next comm call while it computes, and the go-ahead queues behind the
         * receiver's own outgoing data on a slow link. Eager up to 4 MiB: the whole message
         * goes to the socket at once (bench/results/2026-12-03-eager-limit-pairs.md). A value the user set wins. */
        setenv("OMPI_MCA_btl_tcp_eager_limit", "4194304", 0);
        setenv("OMPI_MCA_btl_tcp_max_send_size", "4194304", 0);
        if (MPI_Init_thread(argc, argv, want, &provided) != MPI_SUCCESS)
            return err_set(err, PD_ECOMM, "MPI_Init_thread failed");
        finalize = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_FUNNELED) {
        if (finalize) MPI_Finalize();
        return err_set(err, PD_ECOMM, "MPI provides thread level %d, need MPI_THREAD_FUNNELED", provided);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MComm *m = calloc(1, sizeof *m);
    Comm *c = calloc(1, sizeof *c);
    PD_ASSERT(m && c);
    int mrc = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    if (mrc != MPI_SUCCESS) {
        free(m);
        free(c);
        if (finalize) MPI_Finalize();
        return mpi_err(err, -1, mrc, "MPI_Comm_dup", NULL);
    }
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    m->finalize = finalize;
    MPI_Comm_rank(m->comm, &c->rank);
    MPI_Comm_size(m->comm, &c->size);
    /* the tag space must hold 2 * COMM_KIND_COUNT tags per minibatch of the window, then
     * the control channels' tags, then the all-reduce tags (docs/explanation/communication.md, tag layout) */
    int *tag_ub = NULL, flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag);
    int64_t ub = flag && tag_ub ? (int64_t)*tag_ub : 32767;
    c->tag_window = comm_tag_window_for_ub(ub);
    if (c->tag_window < 1) {
        MPI_Comm_free(&m->comm);
        free(m);
        free(c);
        if (finalize) MPI_Finalize();
        return err_set(err, PD_ECOMM, "MPI_TAG_UB is %" PRId64 ": too small for the data and control tags", ub);
    }
    PD_ASSERT(comm_ar_tag(COMM_AR_WINDOW - 1, 1, c->tag_window) <= ub &&
              comm_ctrl_tag(COMM_CTRL_TAG_COUNT - 1, c->tag_window) < comm_ar_tag(0, 0, c->tag_window) &&
              comm_tag(COMM_KIND_COUNT - 1, c->tag_window - 1, 1, c->tag_window) < comm_ctrl_tag(0, c->tag_window));
    c->ops = &MPI_OPS;
    c->ctx = m;
    const int threads_ok = provided >= MPI_THREAD_MULTIPLE;
    if (!threads_ok && mode != COMM_PROGRESS_CALLER) {
        static atomic_int said;   /* once per process */
        if (!atomic_exchange(&said, 1))
            pd_log(LOG_WARN, "rank %d: comm: MPI gives thread level %d, not MPI_THREAD_MULTIPLE (%d): no all-reduce "
                   "progress thread, all-reduces advance only inside comm calls", c->rank, provided,
                   MPI_THREAD_MULTIPLE);
    }
    comm_ar_init(c, mode, nap_ns, threads_ok);
    *out = c;
    return PD_OK;
}

static void m_free(Comm *c) {
    MComm *m = c->ctx;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) {
        /* control blocks still in flight (only after a timeout): a completed one is freed;
         * one that is not is released to MPI and its block leaked on purpose (MPI may still
         * read or write it; cancelling sends is unreliable) */
        for (int i = 0; i < m->npend; i++) {
            int done = 0;
            if (MPI_Test(&m->pend[i].rq, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) free(m->pend[i].blob);
            else if (m->pend[i].rq != MPI_REQUEST_NULL) MPI_Request_free(&m->pend[i].rq);
        }
        MPI_Comm_free(&m->comm);
        if (m->finalize) MPI_Finalize();
    }
    free(m->pend);
    free(m);
    free(c);
}

/* ---- point to point --------------------------------------------------------------- */

static CommReq *m_req_new(Comm *c) {
    (void)c;
    MReq *r = calloc(1, sizeof *r);
    PD_ASSERT(r);
    r->r[0] = r->r[1] = MPI_REQUEST_NULL;
    return &r->base;
}

static int m_isend(Comm *c, CommReq *req, const float *data, Err *err) {
    MComm *m = c->ctx;
    MReq *r = (MReq *)req;
    if (req->hdr.count > (uint64_t)INT_MAX)
        return err_set(err, PD_EINVAL, "rank %d: message of %" PRIu64 " floats is too large for one MPI message",
                       c->rank, req->hdr.count);
    /* the header's send buffer is the request's copy */
    int mrc = MPI_Isend(&req->hdr, (int)sizeof(CommHeader), MPI_BYTE, req->peer, req->tag, m->comm, &r->r[0]);
    if (mrc == MPI_SUCCESS)
        mrc = MPI_Isend(data, (int)req->hdr.count, MPI_FLOAT, req->peer, req->tag + 1, m->comm, &r->r[1]);
    if (mrc != MPI_SUCCESS) {
        if (r->r[0] != MPI_REQUEST_NULL) MPI_Request_free(&r->r[0]);
        r->got[0] = r->got[1] = 1;
        return mpi_err(err, c->rank, mrc, "MPI_Isend", NULL);
    }
    return PD_OK;
}

static int m_irecv(Comm *c, CommReq *req, size_t cap, Err *err) {
    MComm *m = c->ctx;
    MReq *r = (MReq *)req;
    if (cap > (size_t)INT_MAX)
        return err_set(err, PD_EINVAL, "rank %d: receive of %zu floats is too large for one MPI message", c->rank, cap);
    int mrc = MPI_Irecv(&req->hdr, (int)sizeof(CommHeader), MPI_BYTE, req->peer, req->tag, m->comm, &r->r[0]);
    if (mrc == MPI_SUCCESS)
        mrc = MPI_Irecv(req->buf, (int)cap, MPI_FLOAT, req->peer, req->tag + 1, m->comm, &r->r[1]);
    if (mrc != MPI_SUCCESS) {
        if (r->r[0] != MPI_REQUEST_NULL) {
            MPI_Cancel(&r->r[0]);
            MPI_Wait(&r->r[0], MPI_STATUS_IGNORE);
        }
        r->got[0] = r->got[1] = 1;
        return mpi_err(err, c->rank, mrc, "MPI_Irecv", NULL);
    }
    return PD_OK;
}

static int m_wait(Comm *c, CommReq *req, double deadline, Err *err) {
    MReq *r = (MReq *)req;
    double t0 = pd_now();
    for (;;) {
        for (int i = 0; i < 2; i++) {
            if (r->got[i]) continue;
            int flag = 0;
            MPI_Status st;
            int mrc = MPI_Test(&r->r[i], &flag, &st);
            if (mrc != MPI_SUCCESS) {
                int cls = 0;
                MPI_Error_class(mrc, &cls);
                r->got[i] = 1;
                r->r[i] = MPI_REQUEST_NULL;   /* an erroneous request is completed */
                /* a payload longer than posted: the header check names the real problem */
                if (i == 1 && req->is_recv && cls == MPI_ERR_TRUNCATE) continue;
                char what[128];
                snprintf(what, sizeof what, "%s %s of minibatch %" PRId64 " %s rank %d",
                         req->is_recv ? "receiving" : "sending", comm_kind_name(req->kind), req->mb,
                         req->is_recv ? "from" : "to", req->peer);
                return -mpi_err(err, c->rank, mrc, what, NULL);
            }
            if (flag) r->got[i] = 1;
        }
        if (r->got[0] && r->got[1]) return COMM_DONE;
        if (deadline < 0 || (deadline > 0 && pd_now() >= deadline)) return COMM_PENDING;
        backoff(t0);
    }
}

static void m_cancel(Comm *c, CommReq *req) {
    MReq *r = (MReq *)req;
    for (int i = 0; i < 2; i++) {
        if (r->got[i] || r->r[i] == MPI_REQUEST_NULL) continue;
        if (req->is_recv) {   /* an unmatched receive cancels at once */
            MPI_Cancel(&r->r[i]);
            MPI_Wait(&r->r[i], MPI_STATUS_IGNORE);
        } else {              /* the send goes on in the background (see comm.h) */
            MPI_Request_free(&r->r[i]);
        }
        r->got[i] = 1;
    }
}

static void m_req_free(Comm *c, CommReq *req) {
    m_cancel(c, req);
    free(req);
}

/* ---- control plane ---------------------------------------------------------------- */

static void pend_push(MComm *m, MPI_Request rq, void *blob, int peer, int tag) {
    if (m->npend == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 16;
        m->pend = realloc(m->pend, (size_t)m->cap * sizeof *m->pend);
        PD_ASSERT(m->pend);
    }
    m->pend[m->npend++] = (MPend){rq, blob, peer, tag};
}

/* Frees the blocks whose requests completed. PD_OK, or PD_ECOMM on an MPI error. */
static int pend_reap(Comm *c, MComm *m, Err *err) {
    for (int i = 0; i < m->npend;) {
        int done = 0;
        MPend *e = &m->pend[i];
        int mrc = MPI_Test(&e->rq, &done, MPI_STATUS_IGNORE);
        if (mrc != MPI_SUCCESS || done) {
            int peer = e->peer;
            free(e->blob);
            *e = m->pend[--m->npend];
            if (mrc != MPI_SUCCESS) {
                char what[64];
                snprintf(what, sizeof what, "a control message %s rank %d", peer >= 0 ? "to" : "from", peer);
                return mpi_err(err, c->rank, mrc, what, NULL);
            }
            continue;
        }
        i++;
    }
    return PD_OK;
}

static int m_ctrl_post(Comm *c, int peer, int tag, void *blob, size_t len, Err *err) {
    MComm *m = c->ctx;
    if (len > (size_t)INT_MAX) {
        free(blob);
        return err_set(err, PD_EINVAL, "rank %d: control message of %zu bytes is too large for one MPI message",
                       c->rank, len);
    }
    MPI_Request rq;
    int mrc = MPI_Isend(blob, (int)len, MPI_BYTE, peer, tag, m->comm, &rq);
    if (mrc != MPI_SUCCESS) {
        free(blob);
        return mpi_err(err, c->rank, mrc, "MPI_Isend (control message)", NULL);
    }
    pend_push(m, rq, blob, peer, tag);
    return PD_OK;
}

static int m_ctrl_flush(Comm *c, int peer, int tag, double deadline, int *late, Err *err) {
    MComm *m = c->ctx;
    double t0 = pd_now();
    for (;;) {
        int rc = pend_reap(c, m, err);
        if (rc) return -rc;
        int first = -1;   /* the lowest peer still being sent to */
        for (int i = 0; i < m->npend; i++) {
            const MPend *e = &m->pend[i];
            if (e->peer >= 0 && e->tag == tag && (peer < 0 || e->peer == peer) && (first < 0 || e->peer < first))
                first = e->peer;
        }
        if (first < 0) return COMM_DONE;
        if (deadline < 0 || (deadline > 0 && pd_now() >= deadline)) {
            *late = first;
            return COMM_PENDING;
        }
        backoff(t0);
    }
}

static int m_ctrl_take(Comm *c, const int *peers, int np, int tag, double deadline, int *from, void **blob,
                       size_t *len, Err *err) {
    MComm *m = c->ctx;
    double t0 = pd_now();
    *from = -1;
    for (;;) {
        for (int i = 0; i < np; i++) {
            int flag = 0, cnt = 0;
            MPI_Message msg;
            MPI_Status st;
            int mrc = MPI_Improbe(peers[i], tag, m->comm, &flag, &msg, &st);
            if (mrc == MPI_SUCCESS && !flag) continue;
            if (mrc == MPI_SUCCESS) mrc = MPI_Get_count(&st, MPI_BYTE, &cnt);
            *from = peers[i];
            if (mrc != MPI_SUCCESS) return -mpi_err(err, c->rank, mrc, "MPI_Improbe (control message)", NULL);
            void *buf = malloc(cnt > 0 ? (size_t)cnt : 1);
            PD_ASSERT(buf);
            MPI_Request rq;
            mrc = MPI_Imrecv(buf, cnt, MPI_BYTE, &msg, &rq);
            if (mrc != MPI_SUCCESS) {
                free(buf);
                return -mpi_err(err, c->rank, mrc, "MPI_Imrecv (control message)", NULL);
            }
            double t1 = pd_now();
            for (;;) {   /* matched: the transfer runs (large messages take a while) */
                int done = 0;
                mrc = MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
                if (mrc != MPI_SUCCESS) {
                    free(buf);
                    return -mpi_err(err, c->rank, mrc, "receiving a control message", NULL);
                }
                if (done) {
                    *blob = buf;
                    *len = (size_t)cnt;
                    return COMM_DONE;
                }
                if (deadline > 0 && pd_now() >= deadline) {   /* the message is lost to us */
                    pend_push(m, rq, buf, -1, tag);
                    return COMM_PENDING;
                }
                backoff(t1);
            }
        }
        if (deadline < 0 || (deadline > 0 && pd_now() >= deadline)) {
            *from = np > 0 ? peers[0] : -1;
            return COMM_PENDING;
        }
        backoff(t0);
    }
}

/* ---- collectives ------------------------------------------------------------------ */

static int m_barrier(Comm *c, Err *err) {
    MComm *m = c->ctx;
    MPI_Request rq;
    int mrc = MPI_Ibarrier(m->comm, &rq);
    if (mrc != MPI_SUCCESS) return mpi_err(err, c->rank, mrc, "MPI_Ibarrier", NULL);
    return poll_all(&rq, 1, comm_coll_deadline(c), c->rank, "barrier", err);
}

static int m_agree(Comm *c, int rc, int *out, Err *err) {
    MComm *m = c->ctx;
    MPI_Request rq;
    int mrc = MPI_Iallreduce(&rc, out, 1, MPI_INT, MPI_MAX, m->comm, &rq);
    if (mrc != MPI_SUCCESS) return mpi_err(err, c->rank, mrc, "MPI_Iallreduce", NULL);
    return poll_all(&rq, 1, comm_coll_deadline(c), c->rank, "agree", err);
}

static void m_abort(Comm *c, int code, const char *msg) {
    MComm *m = c->ctx;
    fprintf(stderr, "pipedream: rank %d: abort: %s\n", c->rank, msg);
    fflush(stderr);
    MPI_Abort(m->comm, code ? code : 1);
    abort();   /* MPI_Abort does not return; if it did, still never continue */
}

static int m_group_new(CommGroup *g, Err *err) {
    Comm *c = g->comm;
    MComm *m = c->ctx;
    MPI_Group world = MPI_GROUP_NULL, sub = MPI_GROUP_NULL;
    MPI_Comm gc = MPI_COMM_NULL;
    g->ctx = NULL;
    /* the members have all arrived (comm_ctrl.c exchanged the lists within the deadline), so
     * this blocking call does not wait for a missing one */
    int mrc = MPI_Comm_group(m->comm, &world);
    if (mrc == MPI_SUCCESS) mrc = MPI_Group_incl(world, g->size, g->ranks, &sub);   /* list order = group rank order */
    if (mrc == MPI_SUCCESS) mrc = MPI_Comm_create_group(m->comm, sub, 0, &gc);
    if (sub != MPI_GROUP_NULL) MPI_Group_free(&sub);
    if (world != MPI_GROUP_NULL) MPI_Group_free(&world);
    if (mrc != MPI_SUCCESS) return mpi_err(err, c->rank, mrc, "MPI_Comm_create_group", NULL);
    MPI_Comm_set_errhandler(gc, MPI_ERRORS_RETURN);
    int grank = -1;
    MPI_Comm_rank(gc, &grank);
    PD_ASSERTF(grank == g->rank, "group rank %d, position in list %d", grank, g->rank);
    MGroup *mg = calloc(1, sizeof *mg);
    PD_ASSERT(mg);
    mg->comm = gc;
    g->ctx = mg;
    return PD_OK;
}

/* A broken group's communicator is not freed: a failed or cancelled all-reduce may have left
 * messages in flight on it, and once freed its context id can be reused by a later
 * communicator, which such a message could then reach (Open MPI crashes on one in
 * MPI_Comm_create_group). MPI_Finalize releases it. */
static void m_group_free(CommGroup *g) {
    MGroup *mg = g->ctx;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && !g->broken) MPI_Comm_free(&mg->comm);
    free(mg);
}

/* ---- group messages (the all-reduce engine's) --------------------------------------- */

/* A group message is one MPI message in r[1] of an MReq (r[0] unused). */
static int m_g_post(CommGroup *g, int is_recv, int peer, int tag, void *buf, size_t bytes, CommReq **out, Err *err) {
    Comm *c = g->comm;
    MGroup *mg = g->ctx;
    *out = NULL;
    if (bytes > (size_t)INT_MAX)
        return err_set(err, PD_EINVAL, "rank %d: all-reduce message of %zu bytes is too large for MPI", c->rank, bytes);
    MReq *r = (MReq *)m_req_new(c);
    r->base.is_recv = is_recv;
    r->base.peer = peer;
    r->base.tag = tag;
    r->base.buf = buf;
    r->got[0] = 1;
    int mrc = is_recv ? MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, mg->comm, &r->r[1])
                      : MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, mg->comm, &r->r[1]);
    if (mrc != MPI_SUCCESS) {
        free(r);
        char what[96];
        snprintf(what, sizeof what, "all-reduce (%s group rank %d)", is_recv ? "MPI_Irecv from" : "MPI_Isend to", peer);
        return mpi_err(err, c->rank, mrc, what, NULL);
    }
    *out = &r->base;
    return PD_OK;
}

static int m_g_isend(CommGroup *g, int peer, int tag, const void *data, size_t bytes, CommReq **out, Err *err) {
    return m_g_post(g, 0, peer, tag, (void *)data, bytes, out, err);
}

static int m_g_irecv(CommGroup *g, int peer, int tag, void *buf, size_t bytes, CommReq **out, Err *err) {
    return m_g_post(g, 1, peer, tag, buf, bytes, out, err);
}

static int m_g_test(CommGroup *g, CommReq *req, size_t *got, Err *err) {
    MReq *r = (MReq *)req;
    if (r->got[1]) return COMM_DONE;
    int flag = 0;
    MPI_Status st;
    int mrc = MPI_Test(&r->r[1], &flag, &st);
    if (mrc != MPI_SUCCESS) {
        r->got[1] = 1;
        r->r[1] = MPI_REQUEST_NULL;   /* an erroneous request is completed */
        char what[96];
        snprintf(what, sizeof what, "all-reduce (%s rank %d)", req->is_recv ? "receiving from" : "sending to",
                 g->ranks[req->peer]);
        return -mpi_err(err, g->comm->rank, mrc, what, NULL);
    }
    if (!flag) return COMM_PENDING;
    r->got[1] = 1;
    if (req->is_recv && got) {
        int cnt = 0;
        MPI_Get_count(&st, MPI_BYTE, &cnt);
        *got = (size_t)cnt;
    }
    return COMM_DONE;
}

/* A pending receive is cancelled (an unmatched one goes at once; a matched one is given a
 * moment to finish); what cannot be withdrawn is left to MPI: returns 0 then. */
static int m_g_free(CommGroup *g, CommReq *req) {
    (void)g;
    MReq *r = (MReq *)req;
    int clean = 1;
    if (!r->got[1] && r->r[1] != MPI_REQUEST_NULL) {
        int done = 0;
        if (req->is_recv) {
            MPI_Cancel(&r->r[1]);
            double t0 = pd_now();
            while (MPI_Test(&r->r[1], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done && pd_now() - t0 < 0.5)
                backoff(t0);
        } else {
            MPI_Test(&r->r[1], &done, MPI_STATUS_IGNORE);
        }
        if (!done && r->r[1] != MPI_REQUEST_NULL) {
            MPI_Request_free(&r->r[1]);
            clean = 0;
        }
    }
    free(r);
    return clean;
}

static uint64_t m_events(Comm *c) {
    (void)c;
    return 0;
}

static void m_idle(Comm *c, uint64_t mark, double t0, double deadline) {
    (void)c, (void)mark, (void)deadline;
    backoff(t0);
}

static const CommOps MPI_OPS = {
    .name = "mpi",
    .req_new = m_req_new,
    .isend = m_isend,
    .irecv = m_irecv,
    .wait = m_wait,
    .cancel = m_cancel,
    .req_free = m_req_free,
    .ctrl_post = m_ctrl_post,
    .ctrl_flush = m_ctrl_flush,
    .ctrl_take = m_ctrl_take,
    .barrier = m_barrier,
    .agree = m_agree,
    .abort = m_abort,
    .group_new = m_group_new,
    .group_free = m_group_free,
    .g_isend = m_g_isend,
    .g_irecv = m_g_irecv,
    .g_test = m_g_test,
    .g_free = m_g_free,
    .events = m_events,
    .idle = m_idle,
    .has_events = 0,
    .free = m_free,
};
