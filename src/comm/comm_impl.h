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
    int (*barrier)(Comm *c, Err *err);
    int (*agree)(Comm *c, int rc, int *out, Err *err);   /* *out = max over ranks */
    void (*abort)(Comm *c, int code, const char *msg);
    int (*group_new)(Comm *c, const int *ranks, int n, int me, CommGroup **out, Err *err);
    void (*group_free)(CommGroup *g);
    int (*allreduce)(CommGroup *g, float *buf, size_t n, CommOp op, Err *err);
    void (*free)(Comm *c);
} CommOps;

struct Comm {
    const CommOps *ops;
    void *ctx;              /* the transport's state */
    int rank, size;
    int64_t tag_window;     /* COMM_TAG_WINDOW, or less if MPI's tag space is small */
    double coll_timeout;    /* seconds, 0 = none */
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
