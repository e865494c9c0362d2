/* comm_ctrl.c: the control plane of comm.h (byte messages on channels, each a checked block)
 * and the collectives built on it: broadcast, gather, agree with a deadline, and the members'
 * exchange of their lists when a group is set up (comm_group_exchange). Transport-independent:
 * the transports (comm_mpi.c, comm_threads.c) post, flush and take the blocks. */
#include "comm_impl.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- control plane ---------------------------------------------------------------- */
/* A control message is one block: a CommHeader (kind COMM_CTRL_BYTES, count = payload
 * bytes, dims[0] = channel, dims[1] = operation, dims[2] = root, mb = collective sequence
 * number) and the payload, sent on the channel's own tag (comm_ctrl_tag). The transports
 * move blocks; everything else is here. */

enum { OP_MSG = 0, OP_BCAST = 1, OP_GATHER = 2, OP_AGREE = 3, OP_GROUP = 4, OP_COUNT };
static const char *const OP_NAMES[OP_COUNT] = {"message", "broadcast", "gather", "agree", "group set-up"};

static const char *op_name(int op) { return op >= 0 && op < OP_COUNT ? OP_NAMES[op] : "unknown operation"; }

static double deadline_of(double timeout_s) { return timeout_s > 0 ? pd_now() + timeout_s : 0; }

/* Appends " (what)" to the message already in err; returns code. */
static int err_suffix(Err *err, int code, const char *what) {
    if (!err) return code;
    char m[sizeof err->msg];
    snprintf(m, sizeof m, "%s", err->msg);
    return err_set(err, code, "%s (%s)", m, what);
}

static int timeout_err(const Comm *c, Err *err, double timeout_s, const char *doing, const char *peers,
                       const char *what) {
    return err_set(err, PD_ECOMM, "rank %d: timed out after %g s %s %s (%s)", c->rank, timeout_s, doing, peers, what);
}

/* Packs (header, payload) into a block and hands it to the transport for peer. */
static int ctrl_post(Comm *c, int peer, int channel, int op, int root, int64_t seq, const void *buf, size_t n,
                     Err *err) {
    unsigned char *blob = malloc(sizeof(CommHeader) + n);
    if (!blob) return err_set(err, PD_ENOMEM, "rank %d: no memory for a control message of %zu bytes", c->rank, n);
    CommHeader h;
    memset(&h, 0, sizeof h);
    h.magic = COMM_MAGIC;
    h.kind = COMM_CTRL_BYTES;
    h.mb = seq;
    h.dims[0] = channel;
    h.dims[1] = op;
    h.dims[2] = root;
    h.count = n;
    h.crc = comm_header_crc(&h);
    memcpy(blob, &h, sizeof h);
    if (n) memcpy(blob + sizeof h, buf, n);
    int rc = c->ops->ctrl_post(c, peer, comm_ctrl_tag(channel, c->tag_window), blob, sizeof h + n, err);
    if (!rc) c->bytes_sent += sizeof h + n;
    return rc;
}

/* Checks a block that came from rank `from` on channel: PD_OK and *h, or PD_ECOMM. */
static int ctrl_check(const Comm *c, int from, int channel, const void *blob, size_t len, CommHeader *h, Err *err) {
    if (len < sizeof *h)
        return err_set(err, PD_ECOMM, "rank %d: control message from rank %d on control channel %d: %zu bytes, "
                       "shorter than its header", c->rank, from, channel, len);
    memcpy(h, blob, sizeof *h);
    if (h->magic != COMM_MAGIC)
        return err_set(err, PD_ECOMM, "rank %d: control message from rank %d on control channel %d: bad magic 0x%08x, "
                       "not a pipedream message", c->rank, from, channel, h->magic);
    if (h->crc != comm_header_crc(h))
        return err_set(err, PD_ECOMM, "rank %d: control message from rank %d on control channel %d: corrupt header "
                       "(CRC 0x%08x, computed 0x%08x)", c->rank, from, channel, h->crc, comm_header_crc(h));
    if (h->kind != COMM_CTRL_BYTES || h->dims[0] != channel || h->count != (uint64_t)(len - sizeof *h))
        return err_set(err, PD_ECOMM, "rank %d: control message from rank %d on control channel %d: header says %s "
                       "on channel %d with %" PRIu64 " bytes, %zu arrived", c->rank, from, channel,
                       comm_kind_name((CommKind)h->kind), h->dims[0], h->count, len - sizeof *h);
    return PD_OK;
}

static int check_ctrl_args(const Comm *c, const char *what, int peer, int channel, const void *buf, size_t n,
                           Err *err) {
    if (peer < 0 || peer >= c->size)
        return err_set(err, PD_EINVAL, "rank %d: %s: peer %d is not in 0..%d", c->rank, what, peer, c->size - 1);
    if (channel < 0 || channel >= COMM_CHANNELS)
        return err_set(err, PD_EINVAL, "rank %d: %s: control channel %d is not in 0..%d", c->rank, what, channel,
                       COMM_CHANNELS - 1);
    if (!buf && n > 0) return err_set(err, PD_EINVAL, "rank %d: %s: NULL buffer", c->rank, what);
    if (n > COMM_CTRL_MAX)
        return err_set(err, PD_EINVAL, "rank %d: %s: %zu bytes, more than a control message holds (%zu)", c->rank,
                       what, n, COMM_CTRL_MAX);
    return PD_OK;
}

int comm_ctrl_send(Comm *c, int peer, int channel, const void *buf, size_t n, double timeout_s, Err *err) {
    int rc = check_ctrl_args(c, "control send", peer, channel, buf, n, err);
    if (rc) return rc;
    char what[64], who[24];
    snprintf(what, sizeof what, "control channel %d", channel);
    double deadline = deadline_of(timeout_s);
    rc = ctrl_post(c, peer, channel, OP_MSG, -1, 0, buf, n, err);
    if (rc) return err_suffix(err, rc, what);
    int late = -1;
    int st = c->ops->ctrl_flush(c, peer, comm_ctrl_tag(channel, c->tag_window), deadline, &late, err);
    if (st < 0) return err_suffix(err, -st, what);
    if (st == COMM_PENDING) {
        snprintf(who, sizeof who, "rank %d", peer);
        snprintf(what, sizeof what, "control channel %d: it has not received the message", channel);
        return timeout_err(c, err, timeout_s, "sending to", who, what);
    }
    return PD_OK;
}

/* Takes the next plain message from peer on channel: *blob (caller frees) and *h. */
static int ctrl_take1(Comm *c, int peer, int channel, double timeout_s, void **blob, CommHeader *h, Err *err) {
    char what[48], who[24];
    snprintf(what, sizeof what, "control channel %d", channel);
    int from = -1;
    size_t len = 0;
    *blob = NULL;
    int st = c->ops->ctrl_take(c, &peer, 1, comm_ctrl_tag(channel, c->tag_window), deadline_of(timeout_s), &from,
                               blob, &len, err);
    if (st < 0) return err_suffix(err, -st, what);
    if (st == COMM_PENDING) {
        snprintf(who, sizeof who, "rank %d", peer);
        return timeout_err(c, err, timeout_s, "waiting for", who, what);
    }
    int rc = ctrl_check(c, peer, channel, *blob, len, h, err);
    if (!rc && h->dims[1] != OP_MSG)
        rc = err_set(err, PD_ECOMM, "rank %d: control channel %d: rank %d sent a %s, not a message", c->rank, channel,
                     peer, op_name(h->dims[1]));
    if (rc) {
        free(*blob);
        *blob = NULL;
    }
    return rc;
}

int comm_ctrl_recv(Comm *c, int peer, int channel, void *buf, size_t cap, size_t *n_out, double timeout_s,
                   Err *err) {
    if (n_out) *n_out = 0;
    int rc = check_ctrl_args(c, "control receive", peer, channel, buf, cap > 0, err);   /* any cap is fine */
    if (rc) return rc;
    void *blob;
    CommHeader h;
    if ((rc = ctrl_take1(c, peer, channel, timeout_s, &blob, &h, err))) return rc;
    const size_t n = (size_t)h.count;
    if (n > cap) {
        free(blob);
        return err_set(err, PD_ECOMM, "rank %d: control message from rank %d on control channel %d has %zu bytes, "
                       "the buffer holds %zu", c->rank, peer, channel, n, cap);
    }
    if (n) memcpy(buf, (unsigned char *)blob + sizeof h, n);
    free(blob);
    if (n_out) *n_out = n;
    return PD_OK;
}

/* Turns a block into its payload alone, in place: malloc'd, non-NULL even when empty. */
static void *payload_only(void *blob, size_t n) {
    memmove(blob, (unsigned char *)blob + sizeof(CommHeader), n);
    void *p = realloc(blob, n ? n : 1);
    return p ? p : blob;
}

int comm_ctrl_recv_alloc(Comm *c, int peer, int channel, void **out, size_t *n_out, double timeout_s, Err *err) {
    *out = NULL;
    if (n_out) *n_out = 0;
    int rc = check_ctrl_args(c, "control receive", peer, channel, NULL, 0, err);
    if (rc) return rc;
    void *blob;
    CommHeader h;
    if ((rc = ctrl_take1(c, peer, channel, timeout_s, &blob, &h, err))) return rc;
    *out = payload_only(blob, (size_t)h.count);
    if (n_out) *n_out = (size_t)h.count;
    return PD_OK;
}

/* ---- collectives on the control plane --------------------------------------------- */

typedef struct Coll {
    Comm *c;
    int op, root, channel, tag;
    int64_t seq;           /* this rank's collective number: every rank counts the same */
    double timeout, deadline;
    char what[96];         /* "broadcast #3, root 0": for messages */
} Coll;

static void coll_init(Coll *k, Comm *c, int op, int root, int channel, int64_t seq, double timeout_s) {
    k->c = c;
    k->op = op;
    k->root = root;
    k->channel = channel;
    k->tag = comm_ctrl_tag(channel, c->tag_window);
    k->seq = seq;
    k->timeout = timeout_s;
    k->deadline = deadline_of(timeout_s);
    if (root >= 0) snprintf(k->what, sizeof k->what, "%s #%" PRId64 ", root %d", op_name(op), seq, root);
    else snprintf(k->what, sizeof k->what, "%s #%" PRId64, op_name(op), seq);
}

static void coll_start(Coll *k, Comm *c, int op, int root, double timeout_s) {
    coll_init(k, c, op, root, COMM_CH_COLL, c->coll_seq++, timeout_s);
}

static int coll_post(Coll *k, int peer, const void *buf, size_t n, Err *err) {
    int rc = ctrl_post(k->c, peer, k->channel, k->op, k->root, k->seq, buf, n, err);
    return rc ? err_suffix(err, rc, k->what) : PD_OK;
}

/* Waits until this collective's sends are the transport's (MPI: received, if large). */
static int coll_flush(Coll *k, int *late, Err *err) {
    int st = k->c->ops->ctrl_flush(k->c, -1, k->tag, k->deadline, late, err);
    if (st < 0) return err_suffix(err, -st, k->what);
    if (st == COMM_PENDING) {
        char who[24], what[128];
        snprintf(who, sizeof who, "rank %d", *late);
        snprintf(what, sizeof what, "%s: it has not received it", k->what);
        return timeout_err(k->c, err, k->timeout, "sending to", who, what);
    }
    return PD_OK;
}

/* What to do with the block of one member; takes blob. */
typedef int (*CollFn)(Coll *k, int from, void *blob, const CommHeader *h, void *arg, Err *err);

/* Receives this collective's block from each of peers[0..np-1] (ascending), in arrival
 * order, and hands each to fn. Blocks of earlier collectives (that failed on this rank,
 * then were completed late by the sender) are dropped. On failure *late = the lowest
 * rank not heard from (or the one that sent something wrong) and err names it. */
static int coll_recv_all(Coll *k, const int *peers, int np, CollFn fn, void *arg, int *late, Err *err) {
    Comm *c = k->c;
    *late = -1;
    if (np == 0) return PD_OK;
    int *pend = malloc((size_t)np * sizeof *pend);
    PD_ASSERT(pend);
    memcpy(pend, peers, (size_t)np * sizeof *pend);
    int rc = PD_OK;
    while (np > 0 && !rc) {
        int from = -1;
        void *blob = NULL;
        size_t len = 0;
        int st = c->ops->ctrl_take(c, pend, np, k->tag, k->deadline, &from, &blob, &len, err);
        if (st < 0) {
            *late = from >= 0 ? from : pend[0];
            rc = err_suffix(err, -st, k->what);
            break;
        }
        if (st == COMM_PENDING) {
            char who[256];
            size_t n = 0;
            who[0] = 0;
            for (int i = 0; i < np && n + 40 < sizeof who; i++) {
                if (i == 8) {
                    snprintf(who + n, sizeof who - n, " and %d more", np - i);
                    break;
                }
                n += (size_t)snprintf(who + n, sizeof who - n, "%srank %d", i ? ", " : "", pend[i]);
            }
            *late = pend[0];
            rc = timeout_err(c, err, k->timeout, "waiting for", who, k->what);
            break;
        }
        CommHeader h;
        rc = ctrl_check(c, from, k->channel, blob, len, &h, err);
        if (!rc && h.mb < k->seq) {   /* left over from a collective that failed here */
            free(blob);
            continue;
        }
        if (!rc && (h.mb != k->seq || h.dims[1] != k->op || h.dims[2] != k->root))
            rc = err_set(err, PD_ECOMM, "rank %d: ranks called different collectives: this rank is in %s, rank %d "
                         "sent %s #%" PRId64 " (root %d)", c->rank, k->what, from, op_name(h.dims[1]), h.mb,
                         h.dims[2]);
        if (rc) {
            *late = from;
            free(blob);
            break;
        }
        int i = 0;
        while (pend[i] != from) i++;
        memmove(pend + i, pend + i + 1, (size_t)(np - i - 1) * sizeof *pend);
        np--;
        rc = fn(k, from, blob, &h, arg, err);
        if (rc) *late = from;
    }
    free(pend);
    return rc;
}

/* Every rank but `skip`, ascending: *n entries, malloc'd. */
static int *others(const Comm *c, int skip, int *n) {
    int *v = malloc((size_t)(c->size > 1 ? c->size - 1 : 1) * sizeof *v);
    PD_ASSERT(v);
    *n = 0;
    for (int r = 0; r < c->size; r++)
        if (r != skip) v[(*n)++] = r;
    return v;
}

static int check_coll_args(const Comm *c, const char *what, int root, const void *buf, size_t n, Err *err) {
    if (root < 0 || root >= c->size)
        return err_set(err, PD_EINVAL, "rank %d: %s: root %d is not in 0..%d", c->rank, what, root, c->size - 1);
    if (!buf && n > 0) return err_set(err, PD_EINVAL, "rank %d: %s: NULL buffer for %zu bytes", c->rank, what, n);
    if (n > COMM_CTRL_MAX)
        return err_set(err, PD_EINVAL, "rank %d: %s: %zu bytes, more than a control message holds (%zu)", c->rank,
                       what, n, COMM_CTRL_MAX);
    return PD_OK;
}

typedef struct BcastArg {
    void *buf;
    size_t n;
} BcastArg;

static int bcast_got(Coll *k, int from, void *blob, const CommHeader *h, void *arg, Err *err) {
    BcastArg *a = arg;
    int rc = PD_OK;
    if (h->count != a->n)
        rc = err_set(err, PD_ECOMM, "rank %d: %s: rank %d sent %" PRIu64 " bytes, this rank expected %zu (ranks "
                     "passed different sizes)", k->c->rank, k->what, from, h->count, a->n);
    else if (a->n)
        memcpy(a->buf, (unsigned char *)blob + sizeof *h, a->n);
    free(blob);
    return rc;
}

enum { BCAST_ONE_BY_ONE = 1 << 20 };   /* bytes: larger broadcasts hold one copy at a time */

int comm_bcast(Comm *c, int root, void *buf, size_t n, double timeout_s, Err *err) {
    int rc = check_coll_args(c, "broadcast", root, buf, n, err);
    if (rc) return rc;
    Coll k;
    coll_start(&k, c, OP_BCAST, root, timeout_s);
    int late = -1;
    if (c->rank == root) {
        for (int i = 1; i < c->size && !rc; i++) {
            rc = coll_post(&k, (root + i) % c->size, buf, n, err);
            if (!rc && n >= BCAST_ONE_BY_ONE) rc = coll_flush(&k, &late, err);
        }
        return rc ? rc : coll_flush(&k, &late, err);
    }
    BcastArg a = {buf, n};
    return coll_recv_all(&k, &root, 1, bcast_got, &a, &late, err);
}

int comm_bcast_i64(Comm *c, int root, int64_t *v, int n, double timeout_s, Err *err) {
    if (n < 0) return err_set(err, PD_EINVAL, "rank %d: broadcast of %d int64 values", c->rank, n);
    return comm_bcast(c, root, v, (size_t)n * sizeof *v, timeout_s, err);
}

typedef struct GatherArg {
    void **parts;
    size_t *sizes;
} GatherArg;

static int gather_got(Coll *k, int from, void *blob, const CommHeader *h, void *arg, Err *err) {
    (void)k;
    (void)err;
    GatherArg *a = arg;
    a->sizes[from] = (size_t)h->count;
    a->parts[from] = payload_only(blob, (size_t)h->count);
    return PD_OK;
}

void comm_parts_free(void **parts, size_t *sizes, int n) {
    if (parts)
        for (int i = 0; i < n; i++) free(parts[i]);
    free(parts);
    free(sizes);
}

int comm_gather(Comm *c, int root, const void *mine, size_t n, void ***parts, size_t **sizes, double timeout_s,
                Err *err) {
    *parts = NULL;
    *sizes = NULL;
    int rc = check_coll_args(c, "gather", root, mine, n, err);
    if (rc) return rc;
    Coll k;
    coll_start(&k, c, OP_GATHER, root, timeout_s);
    int late = -1;
    if (c->rank != root) {
        rc = coll_post(&k, root, mine, n, err);
        return rc ? rc : coll_flush(&k, &late, err);
    }
    GatherArg a = {calloc((size_t)c->size, sizeof(void *)), calloc((size_t)c->size, sizeof(size_t))};
    a.parts[root] = malloc(n ? n : 1);
    PD_ASSERT(a.parts && a.sizes && a.parts[root]);
    if (n) memcpy(a.parts[root], mine, n);
    a.sizes[root] = n;
    int np;
    int *peers = others(c, root, &np);
    rc = coll_recv_all(&k, peers, np, gather_got, &a, &late, err);
    free(peers);
    if (rc) {
        comm_parts_free(a.parts, a.sizes, c->size);
        return rc;
    }
    *parts = a.parts;
    *sizes = a.sizes;
    return PD_OK;
}

int comm_gather_i64(Comm *c, int root, const int64_t *mine, int n, int64_t *all, double timeout_s, Err *err) {
    if (n < 0) return err_set(err, PD_EINVAL, "rank %d: gather of %d int64 values", c->rank, n);
    if (c->rank == root && !all && n > 0)
        return err_set(err, PD_EINVAL, "rank %d: gather of %d int64 values: NULL result on the root", c->rank, n);
    void **parts;
    size_t *sizes;
    const size_t bytes = (size_t)n * sizeof(int64_t);
    int rc = comm_gather(c, root, mine, bytes, &parts, &sizes, timeout_s, err);
    if (rc || c->rank != root) return rc;
    for (int r = 0; r < c->size && !rc; r++) {
        if (sizes[r] != bytes)
            rc = err_set(err, PD_ECOMM, "rank %d: gather of int64 values (root %d): rank %d sent %zu bytes, this rank "
                         "expected %d values (%zu bytes)", c->rank, root, r, sizes[r], n, bytes);
        else if (bytes)
            memcpy(all + (size_t)r * (size_t)n, parts[r], bytes);
    }
    comm_parts_free(parts, sizes, c->size);
    return rc;
}

static int agree_got(Coll *k, int from, void *blob, const CommHeader *h, void *arg, Err *err) {
    int *codes = arg;
    int64_t v = -1;
    if (h->count == sizeof v) memcpy(&v, (unsigned char *)blob + sizeof *h, sizeof v);
    free(blob);
    if (v < 0 || v > INT32_MAX)
        return err_set(err, PD_ECOMM, "rank %d: %s: rank %d sent a bad code (%" PRIu64 " bytes)", k->c->rank, k->what,
                       from, h->count);
    codes[from] = (int)v;
    return PD_OK;
}

int comm_agree_t(Comm *c, int rc, double timeout_s, int *who, Err *err) {
    PD_ASSERTF(rc >= 0, "comm_agree_t: code %d < 0", rc);
    if (who) *who = -1;
    Coll k;
    coll_start(&k, c, OP_AGREE, -1, timeout_s);
    int *codes = calloc((size_t)c->size, sizeof *codes), np, late = -1;
    PD_ASSERT(codes);
    int *peers = others(c, c->rank, &np);
    codes[c->rank] = rc;
    const int64_t mine = rc;
    Err e = {0};   /* the caller's err is written only on failure */
    int st = PD_OK;
    for (int i = 0; i < np && !st; i++) {
        st = coll_post(&k, peers[i], &mine, sizeof mine, &e);
        if (st) late = peers[i];
    }
    if (!st) st = coll_recv_all(&k, peers, np, agree_got, codes, &late, &e);
    if (!st) st = coll_flush(&k, &late, &e);
    free(peers);
    int best = rc, lowest = -1;
    for (int r = 0; r < c->size; r++)
        if (codes[r] > best) best = codes[r];
    for (int r = 0; r < c->size && lowest < 0; r++)
        if (best > PD_OK && codes[r] == best) lowest = r;
    free(codes);
    if (st) {
        if (who) *who = late;
        if (err) {
            *err = e;
            err->code = PD_ECOMM;
        }
        return PD_ECOMM;
    }
    if (who) *who = lowest;
    return best;
}

/* ---- group set-up: the members compare their lists --------------------------------- */

/* Writes "(a, b, c)" (at most ~16 entries) into buf. */
static void list_str(const int *v, int n, char *buf, size_t cap) {
    size_t len = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < n && len + 16 < cap; i++) {
        if (i == 16) {
            len += (size_t)snprintf(buf + len, cap - len, ", ... %d more", n - i);
            break;
        }
        len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? ", " : "", v[i]);
    }
    if (len + 2 <= cap) snprintf(buf + len, cap - len, ")");
}

typedef struct GroupArg {
    const int32_t *mine;
    int n;
    const char *mylist;
} GroupArg;

static int group_got(Coll *k, int from, void *blob, const CommHeader *h, void *arg, Err *err) {
    GroupArg *a = arg;
    const size_t bytes = (size_t)a->n * sizeof(int32_t);
    int same = h->count == bytes && !memcmp((unsigned char *)blob + sizeof *h, a->mine, bytes);
    if (!same) {
        int m = (int)(h->count / sizeof(int32_t));
        int *theirs = malloc((size_t)(m > 0 ? m : 1) * sizeof *theirs);
        PD_ASSERT(theirs);
        for (int i = 0; i < m; i++) {
            int32_t v;
            memcpy(&v, (unsigned char *)blob + sizeof *h + (size_t)i * sizeof v, sizeof v);
            theirs[i] = v;
        }
        char tl[160];
        list_str(theirs, m, tl, sizeof tl);
        free(theirs);
        err_set(err, PD_ECOMM, "rank %d: creating a group: rank %d passed the list %s, this rank %s (members must "
                "pass the same list in the same order)", k->c->rank, from, tl, a->mylist);
    }
    free(blob);
    return same ? PD_OK : PD_ECOMM;
}

/* The members of a new group send each other their lists (on the group set-up channel)
 * and compare them: within the collective deadline every member has come, and the lists
 * agree. A failure leaves the lists of the members not yet heard queued: group set-up
 * on this comm is then unreliable (the runtime aborts anyway). */
int comm_group_exchange(Comm *c, const int *ranks, int n, Err *err) {
    if (n == 1) return PD_OK;
    char mylist[72];
    list_str(ranks, n, mylist, sizeof mylist);
    Coll k;
    coll_init(&k, c, OP_GROUP, -1, COMM_CH_GROUP, 0, c->coll_timeout);
    snprintf(k.what, sizeof k.what, "group set-up of %s", mylist);
    int32_t *mine = malloc((size_t)n * sizeof *mine);
    int *peers = malloc((size_t)n * sizeof *peers), np = 0, late = -1;
    PD_ASSERT(mine && peers);
    for (int i = 0; i < n; i++) mine[i] = ranks[i];
    for (int r = 0; r < c->size; r++)   /* ascending, so the lowest missing member is named first */
        for (int i = 0; i < n; i++)
            if (ranks[i] == r && r != c->rank) peers[np++] = r;
    int rc = PD_OK;
    for (int i = 0; i < np && !rc; i++) rc = coll_post(&k, peers[i], mine, (size_t)n * sizeof *mine, err);
    GroupArg a = {mine, n, mylist};
    if (!rc) rc = coll_recv_all(&k, peers, np, group_got, &a, &late, err);
    if (!rc) rc = coll_flush(&k, &late, err);
    free(mine);
    free(peers);
    return rc;
}
