/* comm_impl.h: what comm.c, comm_ctrl.c and comm_ar.c (the common layer) and the two transports
 * (comm_mpi.c, comm_threads.c) share: the ops table, the Comm / CommReq / CommGroup structs.
 * The common layer builds and checks headers, computes tags and runs the deadline loop; a
 * transport only moves bytes and matches (source, tag). Not a public header. */
#ifndef PD_COMM_IMPL_H
#define PD_COMM_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "comm.h"

/* Minibatches mb and mb + COMM_TAG_WINDOW share a tag; the header check tells them apart. */
#define COMM_TAG_WINDOW ((int64_t)1 << 20)

_Static_assert(sizeof(CommHeader) == 64, "CommHeader is 64 bytes on the wire");
_Static_assert(COMM_KIND_COUNT == 3, "tag scheme and comm_kind_name know three kinds");
_Static_assert(COMM_CTRL_BYTES >= COMM_KIND_COUNT, "a control header's kind is no CommKind");

/* Control channels after the caller's 0..COMM_CHANNELS-1: the comm's own. */
enum { COMM_CH_COLL = COMM_CHANNELS,        /* broadcast, gather, agree */
       COMM_CH_GROUP = COMM_CHANNELS + 1 }; /* group set-up (members only) */
_Static_assert(COMM_CH_GROUP + 1 == COMM_CTRL_TAG_COUNT, "every control channel has its tag");
/* Tag layout (docs/explanation/communication.md): data tags 0 .. 2*KINDS*window - 1 (comm_tag), then one tag per
 * control channel, then two per all-reduce sequence number modulo COMM_AR_WINDOW (notices,
 * ring pieces). The whole range must be a C int (the tag type of both transports), and
 * even MPI's smallest allowed MPI_TAG_UB (32767) must leave a window of at least 1. */
#define COMM_RESERVED_TAGS (COMM_CTRL_TAG_COUNT + COMM_AR_TAG_COUNT)   /* above the data tags */
_Static_assert((int64_t)2 * COMM_KIND_COUNT * COMM_TAG_WINDOW + COMM_RESERVED_TAGS - 1 <= 2147483647,
               "data, control and all-reduce tags fit in an int");
_Static_assert((32767 + 1 - COMM_RESERVED_TAGS) / (2 * COMM_KIND_COUNT) >= 1,
               "the smallest MPI tag space still holds a window, the control and the all-reduce tags");
_Static_assert(COMM_AR_TAG_COUNT == 2 * COMM_AR_WINDOW, "two tags per all-reduce: notices and pieces");
_Static_assert(COMM_AR_PIECE * sizeof(float) <= 2147483647, "a piece is one MPI message (int count)");

/* One request. A transport allocates it (with its own state after this common part) in
 * req_new and frees it in req_free. */
struct CommReq {
    int is_recv;
    int peer;
    int tag;                /* header tag; payload tag = tag + 1 */
    CommKind kind;          /* recv: what was posted */
    int64_t mb;
    Shape shape;
    float *buf;             /* recv: destination (numel(shape) floats) */
    CommHeader hdr;         /* send: the header sent; recv: the header received */
};

/* Result of a transport's progress/wait call. */
enum { COMM_PENDING = 0, COMM_DONE = 1 };

typedef struct CommOps {
    const char *name;
    /* A new, idle request; comm.c fills its common part, then starts it with isend or
     * irecv (so a request is complete before another thread can see it). */
    CommReq *(*req_new)(Comm *c);
    /* Start sending r->hdr (tag r->tag) and r->hdr.count floats of data (tag r->tag + 1)
     * to r->peer. On failure the transport has undone its part; comm.c frees r. */
    int (*isend)(Comm *c, CommReq *r, const float *data, Err *err);
    /* Post a receive from r->peer: header (tag r->tag) into r->hdr, payload (tag
     * r->tag + 1, at most cap floats) into r->buf. Failure: as isend. */
    int (*irecv)(Comm *c, CommReq *r, size_t cap, Err *err);
    /* Wait for r until the absolute time deadline (pd_now() seconds; 0 = forever; < 0 =
     * only test once).
     * Returns COMM_DONE, COMM_PENDING (deadline passed) or -PD_ECOMM with err set (peer
     * gone, abort, MPI error; r is then finished and may be freed). */
    int (*wait)(Comm *c, CommReq *r, double deadline, Err *err);
    void (*cancel)(Comm *c, CommReq *r);   /* give up a pending request (not freed) */
    void (*req_free)(Comm *c, CommReq *r);
    /* Control plane. A control message travels as one block: its CommHeader, then
     * hdr.count payload bytes; blocks are malloc'd. ctrl_post hands blob (len bytes) to the
     * transport for peer on tag; the transport owns blob from then on (also on failure).
     * Returns PD_OK or PD_ECOMM (threads: peer closed, abort; MPI: MPI error). */
    int (*ctrl_post)(Comm *c, int peer, int tag, void *blob, size_t len, Err *err);
    /* Waits until every posted block on tag to peer (-1: to anyone) is the transport's
     * for good (threads: at once; MPI: its send completed) or the absolute deadline (0 =
     * none). COMM_DONE, COMM_PENDING (*late = a peer still being sent to), or -PD_ECOMM. */
    int (*ctrl_flush)(Comm *c, int peer, int tag, double deadline, int *late, Err *err);
    /* Takes the first block on tag from any of peers[0..np-1] (from each peer in send
     * order). COMM_DONE: *from, *blob (malloc'd, caller frees), *len. COMM_PENDING: the
     * deadline (0 = none) passed; *from = a peer that is still awaited (MPI: a block whose
     * transfer had started is then lost). -PD_ECOMM, *from = the peer at fault or -1: a
     * listed peer closed its endpoint with nothing for us, abort, MPI error. */
    int (*ctrl_take)(Comm *c, const int *peers, int np, int tag, double deadline, int *from, void **blob,
                     size_t *len, Err *err);
    int (*barrier)(Comm *c, Err *err);
    int (*agree)(Comm *c, int rc, int *out, Err *err);   /* *out = max over ranks */
    void (*abort)(Comm *c, int code, const char *msg);
    /* Sets up the transport's part of g (comm.c has checked the list, comm_ctrl.c exchanged it with
     * the members and filled comm, rank, size, ranks): g->ctx. On failure g->ctx is NULL
     * and nothing is left to free. */
    int (*group_new)(CommGroup *g, Err *err);
    void (*group_free)(CommGroup *g);   /* frees g->ctx only (comm.c frees g) */
    /* Group messages, for the all-reduce engine (comm_ar.c): `bytes` raw bytes (no header)
     * to / from group rank peer of g on tag, in the group's own context (MPI: the group's
     * communicator; threads: matched on (group, source, tag)), so they never match a data or
     * control message, nor another group's. Messages with equal (source, tag) match
     * receives in posting order. A request from g_isend / g_irecv (common part: is_recv,
     * peer = group rank, tag, buf) is finished with g_test and freed with g_free. */
    int (*g_isend)(CommGroup *g, int peer, int tag, const void *data, size_t bytes, CommReq **out, Err *err);
    int (*g_irecv)(CommGroup *g, int peer, int tag, void *buf, size_t bytes, CommReq **out, Err *err);
    /* Tests once: COMM_DONE (receives: *got = bytes that came; more than posted is an
     * error), COMM_PENDING, or -PD_ECOMM with err set (peer's endpoint closed, abort, MPI
     * error; the request is then finished). */
    int (*g_test)(CommGroup *g, CommReq *r, size_t *got, Err *err);
    /* Frees r, withdrawing it first if pending. Returns 1, or 0 if the transport may still
     * use r's buffer (MPI: a matched receive or a send that could not be withdrawn was left
     * to MPI): the caller must then keep that buffer alive. */
    int (*g_free)(CommGroup *g, CommReq *r);
    /* Waiting without spinning: events(c) is a counter that changes whenever something may
     * have completed on c (threads: a message delivered to it, abort, an endpoint closed;
     * MPI: always 0). idle(c, mark, t0, deadline) returns at once if events(c) != mark, else
     * after something happened or a short nap (MPI: spin, yield (PD_COMM_YIELD_US) or nap by how long
     * since t0), or at the absolute deadline (0 = none). */
    uint64_t (*events)(Comm *c);
    void (*idle)(Comm *c, uint64_t mark, double t0, double deadline);
    /* 1: idle wakes when something is delivered (threads), so the progress thread waits in
     * it; 0: it cannot tell (MPI), so the progress thread naps instead (comm_ar.c: 100 us,
     * doubling to 1 ms while nothing moves). */
    int has_events;
    void (*free)(Comm *c);
} CommOps;

/* How the running all-reduces of a Comm advance (comm.h, "Progress"). */
typedef enum CommProgress {
    COMM_PROGRESS_THREAD = 0,   /* a progress thread that naps between passes (the default) */
    COMM_PROGRESS_SPIN = 1,     /* a progress thread that never naps (for measuring only) */
    COMM_PROGRESS_CALLER = 2,   /* no thread: inside the caller's comm calls only */
} CommProgress;

struct Comm {
    const CommOps *ops;
    void *ctx;              /* the transport's state */
    int rank, size;
    int64_t tag_window;     /* COMM_TAG_WINDOW, or less if MPI's tag space is small */
    double coll_timeout;    /* seconds, 0 = none */
    int64_t coll_seq;       /* control-plane collectives started on this rank */
    _Atomic uint64_t bytes_sent;   /* comm_bytes_sent (the progress thread adds to it too) */
    /* The all-reduce engine's (comm_ar.c). ar_mu guards ars / ars_tail, every running
     * CommAr and the all-reduce fields of this Comm's groups; the progress thread holds it
     * while it makes a pass, never while it naps. */
    CommAr *ars, *ars_tail; /* all-reduces still running, in start order */
    CommProgress ar_mode;   /* fixed at creation (comm_ar_init) */
    long ar_nap_ns;         /* COMM_PROGRESS_THREAD: nap between passes that moved nothing */
    pthread_mutex_t ar_mu;
    pthread_cond_t ar_work; /* the thread waits here while nothing runs; comm_free wakes it */
    pthread_t ar_thread;
    int ar_thread_on;       /* started (at the first all-reduce with more than one member) */
    int ar_stop;            /* comm_free asks the thread to end */
};

struct CommGroup {
    Comm *comm;
    int rank, size;         /* the caller's position in the list; its length */
    int *ranks;             /* world ranks in group order (owned) */
    void *ctx;              /* the transport's state */
    int64_t ar_seq;         /* all-reduces started on this group by this member */
    int ar_running;         /* of them, still running */
    int broken;             /* an all-reduce failed or was cancelled: why says which */
    char why[320];
};

/* Absolute deadline for a collective on c: 0 or pd_now() + timeout. */
double comm_coll_deadline(const Comm *c);

/* The CRC a header carries: of its bytes before the crc field (data and control headers). */
static inline uint32_t comm_header_crc(const CommHeader *h) { return pd_crc32(h, offsetof(CommHeader, crc)); }

/* comm_ctrl.c: the members of a new group (ranks, n; the caller among them) send each other
 * their lists on the group set-up channel and compare them, within the collective deadline
 * (comm_group_new, after its argument checks). PD_OK, or PD_ECOMM naming a missing member or
 * a member whose list differs. */
int comm_group_exchange(Comm *c, const int *ranks, int n, Err *err);

/* The all-reduce engine (comm_ar.c).
 * comm_progress_mode reads PD_COMM_PROGRESS (comm.h) into *mode and *nap_ns: PD_OK, or
 * PD_EINVAL naming a value it does not know. A transport calls it before it creates
 * anything, and comm_ar_init(c, mode, nap_ns, threads_ok) once c is otherwise complete;
 * threads_ok = 0 (MPI without MPI_THREAD_MULTIPLE) turns a thread mode into
 * COMM_PROGRESS_CALLER. comm_ar_fini (comm_free, after comm_ar_detach) stops and joins the
 * thread.
 * comm_ar_progress_all advances every running all-reduce of c without blocking and returns
 * 1 if anything moved; where a progress thread does that, it returns 0 at once.
 * comm_ar_caller_progress: whether a waiting caller must call it (no thread, and
 * all-reduces are running). comm_ar_detach fails every running all-reduce of c (g == NULL)
 * or of g, with why, and forgets them (comm_free, comm_group_free). */
int comm_progress_mode(CommProgress *mode, long *nap_ns, Err *err);
void comm_ar_init(Comm *c, CommProgress mode, long nap_ns, int threads_ok);
void comm_ar_fini(Comm *c);
int comm_ar_progress_all(Comm *c);
int comm_ar_caller_progress(Comm *c);
void comm_ar_detach(Comm *c, CommGroup *g, const char *why);

#endif
