/* comm.c: the data plane and groups of comm.h, transport-independent: argument checks,
 * message headers (building, checking what arrived against what was posted), the tag scheme,
 * the waits with their deadlines and error messages, progress of the running all-reduces
 * (comm_ar.c) while a receive is awaited; group set-up (checks, the CommGroup; the members'
 * exchange of their lists is comm_ctrl.c's). The control plane and its collectives are in
 * comm_ctrl.c. The transports (comm_mpi.c, comm_threads.c) only move bytes, match
 * (source, tag) and run barrier and agree. */
#include "comm_impl.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const char *const KIND_NAMES[] = {"activation", "gradient", "control"};
_Static_assert(sizeof KIND_NAMES / sizeof KIND_NAMES[0] == COMM_KIND_COUNT, "one name per kind");

const char *comm_kind_name(CommKind k) {
    if ((int)k == COMM_CTRL_BYTES) return "control message";
    return (k >= 0 && k < COMM_KIND_COUNT) ? KIND_NAMES[k] : "unknown-kind";
}

int comm_tag(CommKind kind, int64_t mb, int part, int64_t window) {
    PD_ASSERT(kind >= 0 && kind < COMM_KIND_COUNT && mb >= 0 && (part == 0 || part == 1) && window > 0);
    return (int)(((mb % window) * COMM_KIND_COUNT + kind) * 2 + part);
}

int comm_ctrl_tag(int channel, int64_t window) {
    PD_ASSERTF(channel >= 0 && channel < COMM_CTRL_TAG_COUNT && window >= 1 && window <= COMM_TAG_WINDOW,
               "control channel %d, window %" PRId64, channel, window);
    return (int)(2 * COMM_KIND_COUNT * window + channel);
}

int comm_ar_tag(int64_t seq, int part, int64_t window) {
    PD_ASSERTF(seq >= 0 && (part == 0 || part == 1) && window >= 1 && window <= COMM_TAG_WINDOW,
               "all-reduce #%" PRId64 ", part %d, window %" PRId64, seq, part, window);
    return (int)(2 * COMM_KIND_COUNT * window + COMM_CTRL_TAG_COUNT + 2 * (seq % COMM_AR_WINDOW) + part);
}

int64_t comm_tag_window_for_ub(int64_t tag_ub) {
    int64_t w = (tag_ub + 1 - COMM_RESERVED_TAGS) / (2 * COMM_KIND_COUNT);
    if (w > COMM_TAG_WINDOW) w = COMM_TAG_WINDOW;
    return w >= 1 ? w : 0;
}

int comm_rank(const Comm *c) { return c->rank; }
int comm_size(const Comm *c) { return c->size; }
const char *comm_name(const Comm *c) { return c->ops->name; }
int64_t comm_tag_window(const Comm *c) { return c->tag_window; }
uint64_t comm_bytes_sent(const Comm *c) { return c->bytes_sent; }
void comm_set_coll_timeout(Comm *c, double seconds) { c->coll_timeout = seconds > 0 ? seconds : 0; }

double comm_coll_deadline(const Comm *c) { return c->coll_timeout > 0 ? pd_now() + c->coll_timeout : 0; }

void comm_free(Comm *c) {
    if (!c) return;
    comm_ar_detach(c, NULL, "the comm was freed");
    comm_ar_fini(c);   /* the progress thread, if any, ends before the transport goes */
    c->ops->free(c);
}

/* Validates the common arguments of isend/irecv. */
static int check_args(const Comm *c, const char *what, int peer, CommKind kind, int64_t mb, Shape shape,
                      const void *data, Err *err) {
    if (peer < 0 || peer >= c->size)
        return err_set(err, PD_EINVAL, "rank %d: %s: peer %d is not in 0..%d", c->rank, what, peer, c->size - 1);
    if (kind < 0 || kind >= COMM_KIND_COUNT)
        return err_set(err, PD_EINVAL, "rank %d: %s: unknown message kind %d", c->rank, what, (int)kind);
    if (mb < 0) return err_set(err, PD_EINVAL, "rank %d: %s: minibatch %" PRId64 " < 0", c->rank, what, mb);
    if (shape.ndim < 0 || shape.ndim > PD_MAX_DIMS)
        return err_set(err, PD_EINVAL, "rank %d: %s: ndim %d not in 0..%d", c->rank, what, shape.ndim, PD_MAX_DIMS);
    for (int i = 0; i < shape.ndim; i++)
        if (shape.d[i] < 0)
            return err_set(err, PD_EINVAL, "rank %d: %s: negative dimension %d", c->rank, what, shape.d[i]);
    if (!data && shape_numel(shape) > 0)
        return err_set(err, PD_EINVAL, "rank %d: %s: NULL buffer for %zu floats", c->rank, what, shape_numel(shape));
    return PD_OK;
}

/* A new request of the transport's with its common part filled (not started). */
static CommReq *req_new(Comm *c, int is_recv, int peer, CommKind kind, int64_t mb, Shape shape, float *buf) {
    CommReq *r = c->ops->req_new(c);
    r->is_recv = is_recv;
    r->peer = peer;
    r->tag = comm_tag(kind, mb, 0, c->tag_window);
    r->kind = kind;
    r->mb = mb;
    r->shape = shape;
    r->buf = buf;
    return r;
}

int comm_isend(Comm *c, int peer, CommKind kind, int64_t mb, int64_t version, Shape shape,
               const float *data, CommReq **req, Err *err) {
    *req = NULL;
    int rc = check_args(c, "send", peer, kind, mb, shape, data, err);
    if (rc) return rc;
    CommHeader h;
    memset(&h, 0, sizeof h);
    h.magic = COMM_MAGIC;
    h.kind = kind;
    h.mb = mb;
    h.version = version;
    h.ndim = shape.ndim;
    for (int i = 0; i < shape.ndim; i++) h.dims[i] = shape.d[i];
    h.count = shape_numel(shape);
    h.crc = comm_header_crc(&h);
    CommReq *r = req_new(c, 0, peer, kind, mb, shape, NULL);
    r->hdr = h;   /* the transport sends from here */
    rc = c->ops->isend(c, r, data, err);
    if (rc) {
        c->ops->req_free(c, r);
        return rc;
    }
    c->bytes_sent += sizeof h + h.count * sizeof(float);
    *req = r;
    return PD_OK;
}

int comm_irecv(Comm *c, int peer, CommKind kind, int64_t mb, Shape shape, float *buf, CommReq **req, Err *err) {
    *req = NULL;
    int rc = check_args(c, "receive", peer, kind, mb, shape, buf, err);
    if (rc) return rc;
    CommReq *r = req_new(c, 1, peer, kind, mb, shape, buf);
    rc = c->ops->irecv(c, r, shape_numel(shape), err);
    if (rc) {
        c->ops->req_free(c, r);
        return rc;
    }
    *req = r;
    return PD_OK;
}

static void header_shape_str(const CommHeader *h, char *buf, size_t n) {
    Shape s = {.ndim = 0};
    if (h->ndim >= 0 && h->ndim <= PD_MAX_DIMS) {
        s.ndim = h->ndim;
        for (int i = 0; i < h->ndim; i++) s.d[i] = h->dims[i];
        shape_str(s, buf, n);
    } else {
        snprintf(buf, n, "<ndim %d>", (int)h->ndim);
    }
}

/* Checks the header that arrived for r against what r was posted for. */
static int check_header(const Comm *c, const CommReq *r, Err *err) {
    const CommHeader *h = &r->hdr;
    char want[96], got[96];
    shape_str(r->shape, want, sizeof want);
    if (h->magic != COMM_MAGIC)
        return err_set(err, PD_ECOMM,
                       "rank %d: message from rank %d (awaited: %s of minibatch %" PRId64 "): bad magic 0x%08x, "
                       "not a pipedream message",
                       c->rank, r->peer, comm_kind_name(r->kind), r->mb, h->magic);
    if (h->crc != comm_header_crc(h))
        return err_set(err, PD_ECOMM,
                       "rank %d: message from rank %d (awaited: %s of minibatch %" PRId64 "): corrupt header "
                       "(CRC 0x%08x, computed 0x%08x)",
                       c->rank, r->peer, comm_kind_name(r->kind), r->mb, h->crc, comm_header_crc(h));
    header_shape_str(h, got, sizeof got);
    if (h->kind != (int32_t)r->kind || h->mb != r->mb)
        return err_set(err, PD_ECOMM,
                       "rank %d: message from rank %d: expected %s of minibatch %" PRId64 ", got %s of minibatch %" PRId64,
                       c->rank, r->peer, comm_kind_name(r->kind), r->mb, comm_kind_name((CommKind)h->kind), h->mb);
    int same = h->ndim == r->shape.ndim && h->count == shape_numel(r->shape);
    for (int i = 0; same && i < r->shape.ndim; i++) same = h->dims[i] == r->shape.d[i];
    if (!same)
        return err_set(err, PD_ECOMM,
                       "rank %d: message from rank %d: %s of minibatch %" PRId64 ": expected shape %s, got shape %s "
                       "(%" PRIu64 " floats)",
                       c->rank, r->peer, comm_kind_name(r->kind), r->mb, want, got, h->count);
    return PD_OK;
}

static int finish(Comm *c, CommReq **req, CommHeader *hdr, Err *err) {
    CommReq *r = *req;
    int rc = r->is_recv ? check_header(c, r, err) : PD_OK;
    if (hdr) *hdr = r->hdr;
    c->ops->req_free(c, r);
    *req = NULL;
    return rc;
}

/* The transport's wait for r, advancing the running all-reduces of c meanwhile where no
 * progress thread does (then they move only inside comm calls). Otherwise the transport
 * waits alone. */
static int wait_req(Comm *c, CommReq *r, double deadline, Err *err) {
    double t0 = pd_now();
    for (;;) {
        if (!comm_ar_caller_progress(c)) return c->ops->wait(c, r, deadline, err);
        uint64_t mark = c->ops->events(c);
        int moved = comm_ar_progress_all(c);
        int st = c->ops->wait(c, r, -1, err);
        if (st != COMM_PENDING || deadline < 0 || (deadline > 0 && pd_now() >= deadline)) return st;
        if (moved) {
            t0 = pd_now();
            continue;
        }
        c->ops->idle(c, mark, t0, deadline);
    }
}

static int progress(Comm *c, CommReq **req, double deadline, int *done, CommHeader *hdr, Err *err) {
    *done = 0;
    if (!*req) {
        *done = 1;
        return PD_OK;
    }
    int st = wait_req(c, *req, deadline, err);
    if (st < 0) {
        c->ops->req_free(c, *req);
        *req = NULL;
        *done = 1;
        return -st;
    }
    if (st == COMM_PENDING) return PD_OK;
    *done = 1;
    return finish(c, req, hdr, err);
}

int comm_wait(Comm *c, CommReq **req, double deadline_s, CommHeader *hdr, Err *err) {
    if (!*req) return PD_OK;
    double t0 = pd_now();
    double deadline = deadline_s > 0 ? t0 + deadline_s : 0;
    int done;
    int rc = progress(c, req, deadline, &done, hdr, err);
    if (rc || done) return rc;
    const CommReq *r = *req;
    if (r->is_recv)
        return err_set(err, PD_ECOMM,
                       "rank %d: timed out after %.3g s waiting for %s of minibatch %" PRId64 " from rank %d",
                       c->rank, pd_now() - t0, comm_kind_name(r->kind), r->mb, r->peer);
    return err_set(err, PD_ECOMM,
                   "rank %d: timed out after %.3g s sending %s of minibatch %" PRId64 " to rank %d "
                   "(it has not received it)",
                   c->rank, pd_now() - t0, comm_kind_name(r->kind), r->mb, r->peer);
}

int comm_test(Comm *c, CommReq **req, int *done, CommHeader *hdr, Err *err) {
    return progress(c, req, -1, done, hdr, err);
}

uint64_t comm_events(Comm *c) { return c->ops->events(c); }

void comm_idle(Comm *c, uint64_t mark, double t0, double deadline) { c->ops->idle(c, mark, t0, deadline); }

void comm_cancel(Comm *c, CommReq **req) {
    if (!*req) return;
    c->ops->cancel(c, *req);
    c->ops->req_free(c, *req);
    *req = NULL;
}

int comm_barrier(Comm *c, Err *err) { return c->ops->barrier(c, err); }

int comm_agree(Comm *c, int rc) {
    PD_ASSERTF(rc >= 0, "comm_agree: code %d < 0", rc);
    Err err = {0};
    int out = rc;
    if (c->ops->agree(c, rc, &out, &err) != PD_OK) {
        pd_log(LOG_ERROR, "%s", err.msg);
        return rc > PD_ECOMM ? rc : PD_ECOMM;
    }
    return out;
}

void comm_abort(Comm *c, int code, const char *msg) { c->ops->abort(c, code, msg ? msg : ""); }

/* ---- groups ---------------------------------------------------------------------- */

/* One place for group set-up (both transports): the argument checks, the members'
 * exchange of their lists (so a missing member is named and different lists fail on every
 * member instead of hanging), the CommGroup itself; the transport adds its context. */
int comm_group_new(Comm *c, const int *ranks, int n, CommGroup **out, Err *err) {
    *out = NULL;
    if (n < 1 || n > c->size)
        return err_set(err, PD_EINVAL, "rank %d: group of %d ranks (world has %d)", c->rank, n, c->size);
    if (!ranks) return err_set(err, PD_EINVAL, "rank %d: group: NULL list of ranks", c->rank);
    int me = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= c->size)
            return err_set(err, PD_EINVAL, "rank %d: group member %d is not in 0..%d", c->rank, ranks[i], c->size - 1);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return err_set(err, PD_EINVAL, "rank %d: rank %d appears twice in a group", c->rank, ranks[i]);
        if (ranks[i] == c->rank) me = i;
    }
    if (me < 0) return err_set(err, PD_EINVAL, "rank %d: creating a group it is not a member of", c->rank);
    int rc = comm_group_exchange(c, ranks, n, err);
    if (rc) return rc;
    CommGroup *g = calloc(1, sizeof *g);
    PD_ASSERT(g);
    g->comm = c;
    g->rank = me;   /* the list order is the group rank order, on both transports */
    g->size = n;
    g->ranks = malloc((size_t)n * sizeof(int));
    PD_ASSERT(g->ranks);
    memcpy(g->ranks, ranks, (size_t)n * sizeof(int));
    rc = c->ops->group_new(g, err);
    if (rc) {
        free(g->ranks);
        free(g);
        return err_prefix(err, "creating a group of %d ranks", n);
    }
    *out = g;
    return PD_OK;
}

void comm_group_free(CommGroup *g) {
    if (!g) return;
    comm_ar_detach(g->comm, g, "its group was freed");
    if (g->ctx) g->comm->ops->group_free(g);
    free(g->ranks);
    free(g);
}

int comm_group_rank(const CommGroup *g) { return g->rank; }
int comm_group_size(const CommGroup *g) { return g->size; }
