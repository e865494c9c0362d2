/* comm_impl.h: what comm.c (the common layer) and the two transports (comm_mpi.c,
 * comm_threads.c) share: the ops table, the Comm / CommReq / CommGroup structs.
 * The common layer builds and checks headers, computes tags and runs the deadline loop; a
 * transport only moves bytes and matches (source, tag). Not a public header. */
#ifndef PD_COMM_IMPL_H
#define PD_COMM_IMPL_H

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
/* Tag layout (docs/comm.md): data tags 0 .. 2*KINDS*window - 1 (comm_tag), then one tag per
 * control channel. The whole range must be a C int (the tag type of both transports), and
 * even MPI's smallest allowed MPI_TAG_UB (32767) must leave a window of at least 1. */
_Static_assert((int64_t)2 * COMM_KIND_COUNT * COMM_TAG_WINDOW + COMM_CTRL_TAG_COUNT - 1 <= 2147483647,
               "data and control tags fit in an int");
_Static_assert((32767 + 1 - COMM_CTRL_TAG_COUNT) / (2 * COMM_KIND_COUNT) >= 1,
               "the smallest MPI tag space still holds a window and the control tags");

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
    /* Sets up the transport's part of g (comm.c has checked the list, exchanged it with
     * the members and filled comm, rank, size, ranks): g->ctx. On failure g->ctx is NULL
     * and nothing is left to free. */
    int (*group_new)(CommGroup *g, Err *err);
    void (*group_free)(CommGroup *g);   /* frees g->ctx only (comm.c frees g) */
    int (*allreduce)(CommGroup *g, float *buf, size_t n, CommOp op, Err *err);
    void (*free)(Comm *c);
} CommOps;

struct Comm {
    const CommOps *ops;
    void *ctx;              /* the transport's state */
    int rank, size;
    int64_t tag_window;     /* COMM_TAG_WINDOW, or less if MPI's tag space is small */
    double coll_timeout;    /* seconds, 0 = none */
    int64_t coll_seq;       /* control-plane collectives started on this rank */
};

struct CommGroup {
    Comm *comm;
    int rank, size;         /* the caller's position in the list; its length */
    int *ranks;             /* world ranks in group order (owned) */
    void *ctx;              /* the transport's state */
};

/* Absolute deadline for a collective on c: 0 or pd_now() + timeout. */
double comm_coll_deadline(const Comm *c);

#endif
