/* comm.h: the transport between pipeline workers. One interface (an ops table plus a
 * context, like ggml's backends) with two implementations:
 *   - MPI (comm_mpi_create): one rank per process, between processes and hosts;
 *   - threads (comm_threads_create / comm_threads_run): n endpoints in one process sharing a
 *     mailbox, for tests and single-host runs.
 * Both have the same semantics, checked by the same tests (tests/test_comm.c,
 * tests/test_comm_mpi.c). What it does: point-to-point messages (a checked header plus a
 * float payload) with non-blocking send/receive, receives posted ahead, waits with
 * deadlines; group all-reduce (a ring: reduce-scatter + all-gather, bandwidth-optimal,
 * non-blocking, several outstanding per group) with a fixed, stated summation order (bitwise
 * equal on both transports and to a serial reference, comm_sum_serial); barrier; agree
 * (all-reduce MAX of an error code); abort; a typed control plane (byte messages on channels, and broadcast, gather and
 * agree built on them) on a tag range of its own, every call with a deadline that names the
 * late rank. What it does not: schedule anything, own tensors, retry, or survive the loss
 * of a rank (a dead peer becomes an error naming it, then the runtime aborts).
 * See docs/explanation/communication.md.
 *
 * Threading: an endpoint (Comm) is used by one thread at a time (the caller's). Besides it,
 * each Comm may have one progress thread of its own that advances its running all-reduces
 * (see "Progress" below); under MPI that needs MPI_THREAD_MULTIPLE. */
#ifndef PD_COMM_H
#define PD_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

typedef enum CommKind {
    COMM_ACT = 0,    /* forward activations */
    COMM_GRAD = 1,   /* backward gradients (w.r.t. activations) */
    COMM_CTRL = 2,   /* control (runtime-defined small payloads; mb is a sequence number) */
    COMM_KIND_COUNT
} CommKind;

typedef enum CommOp { COMM_SUM = 0, COMM_MEAN = 1, COMM_OP_COUNT } CommOp;

#define COMM_MAGIC 0x4d434450u   /* "PDCM" little-endian */

/* The header that travels in front of every payload: 64 bytes, fixed layout, host byte
 * order (hosts of one job are assumed to share endianness). crc = pd_crc32 of the 56 bytes
 * before it. Filled by comm_isend; a receiver gets it from comm_wait/comm_test. */
typedef struct CommHeader {
    uint32_t magic;           /* COMM_MAGIC */
    int32_t kind;             /* CommKind */
    int64_t mb;               /* minibatch id, >= 0 */
    int64_t version;          /* weight version the sender used (information only: not checked) */
    int32_t ndim;             /* shape of the payload */
    int32_t dims[PD_MAX_DIMS];
    uint64_t count;           /* payload floats = product of dims */
    uint32_t crc;             /* CRC-32 of the bytes above */
    uint32_t pad;             /* zero */
} CommHeader;

/* CommHeader.kind of a control-plane message (comm_ctrl_*, comm_bcast, ...). Not a CommKind:
 * comm_isend cannot send one. Its header reads differently: count = payload BYTES (exact),
 * ndim = 0, dims[0] = channel, dims[1] = operation (0 message, 1 broadcast, 2 gather,
 * 3 agree, 4 group set-up), dims[2] = root (or -1), mb = collective sequence number (0 for
 * a plain message), version = 0. See docs/explanation/communication.md, "Control plane". */
#define COMM_CTRL_BYTES 3

typedef struct Comm Comm;
typedef struct CommGroup CommGroup;
typedef struct CommReq CommReq;

/* ---- creation -------------------------------------------------------------------- */
/* MPI transport. Initialises MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE) (FUNNELED with
 * PD_COMM_PROGRESS=caller) unless it is already initialised; it needs at least FUNNELED, and
 * without MULTIPLE it runs without a progress thread (said once on stderr). Duplicates
 * MPI_COMM_WORLD and sets MPI_ERRORS_RETURN on it, so MPI failures come back as PD_ECOMM
 * instead of aborting. argc/argv may be NULL. Returns PD_OK and *out (caller owns:
 * comm_free), or PD_ECOMM, or PD_EINVAL for a PD_COMM_PROGRESS it does not know. Call once
 * per process: comm_free finalises MPI if this call initialised it. */
int comm_mpi_create(int *argc, char ***argv, Comm **out, Err *err);

/* Threads transport: n endpoints (ranks 0..n-1) sharing one mailbox. eps[r] is rank r's
 * endpoint; the caller owns each (comm_free; the mailbox goes with the last). A message is
 * copied when sent (eager), so a send completes at once and its buffer may be reused as
 * soon as comm_isend returns. Returns PD_OK, or PD_EINVAL if n < 1 or PD_COMM_PROGRESS is
 * unknown. */
int comm_threads_create(int n, Comm **eps, Err *err);

/* Runs fn(eps[r], r, arg) on n threads (one per rank) over a fresh threads transport and
 * joins them. When a worker returns (say, early on an error) its endpoint is closed at
 * once, so peers waiting for a message it never sent fail with PD_ECOMM naming it instead
 * of hanging. rcs (optional, n entries) gets each worker's return code. Returns the maximum of the codes (PD_OK if all
 * succeeded), or PD_EINVAL/PD_ENOMEM if the threads could not be started. */
typedef int (*CommWorkerFn)(Comm *c, int rank, void *arg);
int comm_threads_run(int n, CommWorkerFn fn, void *arg, int *rcs, Err *err);

/* Frees the endpoint; NULL is fine. Pending requests must have been waited for or
 * cancelled. Running all-reduces fail ("the comm was freed") and its progress thread is
 * joined before the transport goes. Threads: peers waiting for a message from this rank that was never sent
 * now fail with PD_ECOMM ("rank r closed its endpoint ..."). MPI: frees the communicator and finalises MPI
 * if comm_mpi_create initialised it. */
void comm_free(Comm *c);

int comm_rank(const Comm *c);
int comm_size(const Comm *c);
const char *comm_name(const Comm *c);   /* "mpi" or "threads" */

/* Deadline (seconds, 0 = none, the default) for collectives: barrier, agree, group
 * creation and all-reduce. On expiry they return PD_ECOMM and the comm is unusable except
 * for comm_abort/comm_free. */
void comm_set_coll_timeout(Comm *c, double seconds);

/* ---- point to point -------------------------------------------------------------- */
/* Starts sending a message to peer (0..size-1, self included): header (kind, mb >= 0,
 * version, shape) + payload of shape_numel(shape) floats from data (may be NULL when that is
 * 0; a message without payload has shape1(0), not the 0-d shape, which holds one float). The message matches only a receive posted by peer for the same source, kind and
 * minibatch (see docs/explanation/communication.md, tag scheme); messages with the same (source, kind, mb) arrive
 * in send order. data is borrowed: it must stay valid and unchanged until the request
 * completes (the threads transport copies at once, MPI may not). Returns PD_OK and *req
 * (complete it with comm_wait/comm_test), or PD_ECOMM (MPI failure; threads: peer's
 * endpoint closed, or aborted) / PD_EINVAL (bad arguments) with *req = NULL. */
int comm_isend(Comm *c, int peer, CommKind kind, int64_t mb, int64_t version, Shape shape,
               const float *data, CommReq **req, Err *err);

/* Posts a receive of the message (peer, kind, mb) into buf (shape_numel(shape) floats,
 * borrowed until the request completes). Post receives ahead of time so that communication
 * overlaps compute. On completion the header is checked: magic and CRC, then kind, minibatch
 * and shape against what was posted; a mismatch fails with PD_ECOMM naming the peer and
 * expected vs got (buf's contents are then unspecified). Returns PD_OK and *req, or
 * PD_ECOMM / PD_EINVAL with *req = NULL. */
int comm_irecv(Comm *c, int peer, CommKind kind, int64_t mb, Shape shape, float *buf,
               CommReq **req, Err *err);

/* Waits for *req to complete, at most deadline_s seconds (0 = no deadline). While it waits
 * it also advances every outstanding all-reduce of c (as comm_ar_test does; so does
 * comm_test).
 * - Completed: frees the request, sets *req = NULL, copies the header into *hdr (optional;
 *   for receives it is the header that arrived) and returns PD_OK, or PD_ECOMM if the
 *   received header did not match (message names peer, expected vs got).
 * - Deadline passed: returns PD_ECOMM naming what was awaited (peer, kind, minibatch) and
 *   leaves *req pending: wait again, or give it up with comm_cancel.
 * - Peer gone (threads: its endpoint closed; MPI: an MPI error): PD_ECOMM, request freed.
 * *req == NULL returns PD_OK at once (so arrays of optional requests are easy). */
int comm_wait(Comm *c, CommReq **req, double deadline_s, CommHeader *hdr, Err *err);

/* Like comm_wait with no waiting: sets *done; when done, behaves as comm_wait. */
int comm_test(Comm *c, CommReq **req, int *done, CommHeader *hdr, Err *err);

/* A caller's own poll loop (comm_test over several requests) waits between rounds as
 * comm_wait does: take mark = comm_events(c) before a round; if nothing completed,
 * comm_idle(c, mark, t0, deadline) returns once something may have happened on c (threads:
 * a message delivered to it, an endpoint closed, abort), or after a pause that grows with
 * the time since t0, when the caller last saw something move (MPI, which cannot tell: spin
 * for PD_COMM_SPIN_US, default 50 us, yield the core until PD_COMM_YIELD_US, default 0, then
 * nap 1/20 of the wait so far, 50 us .. PD_COMM_NAP_MAX_US, default 1000), or at the absolute
 * deadline (0 = none). */
uint64_t comm_events(Comm *c);
void comm_idle(Comm *c, uint64_t mark, double t0, double deadline);

/* Gives up a pending request and frees it (*req = NULL). A receive is withdrawn (a message
 * that arrives later stays for a later receive). A send: threads: nothing to undo; MPI: the
 * request is released with MPI_Request_free, so the data must stay valid until comm_free.
 * NULL is fine. */
void comm_cancel(Comm *c, CommReq **req);

/* ---- control plane ----------------------------------------------------------------------
 * Small typed messages between ranks, on a tag range reserved for them (disjoint from every
 * (kind, minibatch) tag of comm_isend/comm_irecv, on both transports). A channel (0 ..
 * COMM_CHANNELS-1) separates independent conversations; messages from one source on one
 * channel arrive in send order. Every call is blocking and bounded: timeout_s > 0 is the
 * deadline (0 = none); on expiry PD_ECOMM with a message naming the peer being waited for
 * ("rank 0: timed out after 5 s waiting for rank 2 (control channel 3)"). A closed/aborted
 * peer is PD_ECOMM naming it. Bad arguments (peer or root out of range, channel out of
 * range, NULL buffer with n > 0, n > COMM_CTRL_MAX) are PD_EINVAL, checked before anything
 * is sent (a collective then has not started on this rank).
 *
 * Sends are like MPI_Send: the data is copied at once (buf may be reused on return), and
 * the call returns when the transport has the message for good. Threads: at once (eager).
 * MPI: small messages at once; large ones (above Open MPI's eager limit, a few KB) when the
 * peer has received them. So two ranks must not both send large control messages to each
 * other before receiving (under MPI that is a timeout naming the other). A send that timed
 * out stays queued and may still be delivered. Sending to oneself works (threads; MPI for
 * small messages). */
#define COMM_CHANNELS 64
#define COMM_CTRL_MAX ((size_t)2147483647 - 64)   /* payload bytes of one control message */
int comm_ctrl_send(Comm *c, int peer, int channel, const void *buf, size_t n, double timeout_s, Err *err);
/* Receives one message from peer on channel into buf (cap bytes). *n_out = bytes received
 * (optional). A message longer than cap fails with PD_ECOMM naming sizes (the message is
 * consumed: the next receive gets the next message). */
int comm_ctrl_recv(Comm *c, int peer, int channel, void *buf, size_t cap, size_t *n_out, double timeout_s, Err *err);
/* Same, any length: *out is malloc'd (caller frees; non-NULL even for 0 bytes). */
int comm_ctrl_recv_alloc(Comm *c, int peer, int channel, void **out, size_t *n_out, double timeout_s, Err *err);

/* Collectives over all ranks of c (every rank calls, same root, same n where stated), on
 * the control plane (their own internal channel, never one of the caller's). Every rank
 * must call the same sequence of them (as in MPI); each carries a sequence number, so a
 * rank that calls a different one fails with PD_ECOMM ("ranks called different
 * collectives") instead of mixing data. The deadline covers the whole call. After one
 * failed on some ranks (a timeout), the others may still call it late: the leftover
 * messages of a failed collective are recognised by their sequence number and dropped by
 * the next one, so the comm stays usable. Cost: broadcast and gather are flat (root sends
 * to / receives from each rank); agree is all-to-all (size * (size - 1) tiny messages),
 * which is what lets every rank name the late one. */
int comm_bcast(Comm *c, int root, void *buf, size_t n, double timeout_s, Err *err);           /* same n everywhere */
int comm_bcast_i64(Comm *c, int root, int64_t *v, int n, double timeout_s, Err *err);
/* Each rank contributes n bytes (n may differ by rank). Root gets parts[r] (malloc'd, its
 * own included) and sizes[r], arrays of comm_size entries (caller frees with comm_parts_free);
 * elsewhere *parts = NULL, *sizes = NULL. */
int comm_gather(Comm *c, int root, const void *mine, size_t n, void ***parts, size_t **sizes, double timeout_s, Err *err);
void comm_parts_free(void **parts, size_t *sizes, int n);
int comm_gather_i64(Comm *c, int root, const int64_t *mine, int n, int64_t *all /* root: size*n */, double timeout_s, Err *err);
/* Agreement with a deadline: every rank returns the max of rc over ranks (codes >= 0); on
 * failure (timeout, peer gone) returns PD_ECOMM with err naming the late rank. Also
 * *who (optional) = the lowest rank that contributed the max code (-1 if all PD_OK), so
 * that everyone can say which rank failed. On failure *who = the lowest rank this rank did
 * not hear from (the late or gone one). err is only written on failure (on success a
 * message already in it, say the caller's own, stays). */
int comm_agree_t(Comm *c, int rc, double timeout_s, int *who, Err *err);

/* ---- collectives ----------------------------------------------------------------- */
/* Blocks until every rank has entered. PD_OK or PD_ECOMM. */
int comm_barrier(Comm *c, Err *err);

/* All-reduce MAX of rc over all ranks: every rank returns the same, largest code, so all
 * ranks leave together (`if (comm_agree(comm, rc) != PD_OK) return rc;`). If the
 * communication itself fails, returns PD_ECOMM (or rc if larger). Codes are >= 0. */
int comm_agree(Comm *c, int rc);

/* Ends the job because of a failure on this rank. MPI: prints "pipedream: rank R: abort:
 * msg" on stderr and calls MPI_Abort(code) (does not return). Threads: marks the shared
 * mailbox aborted and wakes everyone: every pending and later operation of every endpoint
 * returns PD_ECOMM with "aborted by rank R: msg"; it returns (the library never exits the
 * process), and the workers unwind. */
void comm_abort(Comm *c, int code, const char *msg);

/* A group of ranks (a replicated stage) for all-reduce. Called by every member of ranks
 * (only by them), with the same list in the same order; the order is the group's rank order
 * and so the summation order. ranks are distinct, in 0..size-1, and include the caller.
 * Create once and reuse (MPI: MPI_Comm_create_group). The members first exchange their
 * lists on the control plane within the collective deadline (comm_set_coll_timeout): a
 * member that does not come is named, and members passing different lists all fail with
 * PD_ECOMM ("rank 1 passed the list (1, 0), this rank (0, 1)") instead of hanging.
 * Returns PD_OK and *out (caller owns: comm_group_free, before comm_free), or PD_EINVAL /
 * PD_ECOMM. */
int comm_group_new(Comm *c, const int *ranks, int n, CommGroup **out, Err *err);
/* NULL is fine; not collective under threads. All-reduces still running on g fail ("group
 * freed"): their handles must still be freed with comm_ar_wait / comm_ar_cancel. comm_free
 * does the same for every all-reduce still running on the Comm. */
void comm_group_free(CommGroup *g);
int comm_group_rank(const CommGroup *g);   /* position of the caller in ranks */
int comm_group_size(const CommGroup *g);

/* ---- group all-reduce ---------------------------------------------------------------
 * Ring all-reduce (reduce-scatter, then all-gather, around the group in group rank order),
 * bandwidth-optimal: each member sends 2(r-1)/r of the buffer, where r = group size.
 *
 * The order, for a group of r members with buffers x_0 .. x_{r-1} (x_g: group rank g's):
 * the buffer is split into r contiguous chunks, chunk k = [lo(k), lo(k+1)) with
 * lo(k) = floor(k * n / r) (comm_ar_chunk). Every element i of chunk k is exactly the float
 * computation
 *     s = x_{k+1}[i]; for j = 2..r: s = s + x_{(k+j) mod r}[i];   (COMM_MEAN: s = s / (float)r)
 * i.e. starting at group rank k+1 and going up the ring, ending with group rank k's own
 * (chunk r-1 is the plain rank order x_0 + x_1 + ... + x_{r-1}). The result is the same bits
 * on every member, on both transports, and in comm_sum_serial; it depends on n, r and the
 * group order only, not on timing or pieces. r = 2: x_1 + x_0 == x_0 + x_1 bitwise, so two
 * replicas sum exactly as a plain rank-order sum. A group of one leaves buf unchanged.
 *
 * Non-blocking: comm_group_iallreduce starts one and returns at once. Any number up to
 * COMM_AR_WINDOW may be outstanding on a group (gradient buckets): every member must start
 * the same all-reduces (same n and op) in the same order (each gets the group's next
 * sequence number, which its tags carry: docs/explanation/communication.md, tag layout); they may be completed
 * in any order. buf is borrowed until the all-reduce completes: do not read or write it
 * before then.
 *
 * Progress. A ring step needs this member's code to run (add the piece that came, send it
 * on), so someone must call the engine while the caller computes. By default each Comm has
 * a progress thread for that (comm_ar_progress_thread() says whether it has), started at
 * its first all-reduce of more than one member and joined by comm_free:
 *   - it makes passes over every running all-reduce of the Comm (test what arrived, reduce,
 *     post the next sends and receives) under a mutex that the API calls also take, so the
 *     engine's state has one owner at a time and the caller never blocks on the network
 *     inside comm_group_iallreduce or comm_ar_test;
 *   - after a pass that moved nothing it naps, not spins: the ranks of a job may share
 *     cores with the compute threads, and a spinning thread would take a core from one.
 *     MPI cannot say when a message comes, so the nap is timed: 100 us after a pass that
 *     moved something, doubling up to 1 ms while passes move nothing (a member still in
 *     its backward); at 1 Gbit/s 1 ms is 125 KB, which the kernel's socket buffers absorb,
 *     and a 60 KiB piece takes 0.5 ms. The threads transport waits until something is
 *     delivered to the endpoint. While no all-reduce runs it sleeps on a condition
 *     variable;
 *   - under MPI its messages are on the group's own communicator, so they never match the
 *     caller's point-to-point or control messages (which go on as before, on the caller's
 *     thread); MPI must give MPI_THREAD_MULTIPLE;
 *   - a caller in comm_ar_wait has nothing else to do, so it makes passes too, polling as
 *     every comm wait does (comm_idle; MPI: spin briefly, then naps of 1/20 of the
 *     wait so far; threads: until a delivery): shorter latency than the thread's naps once the ring only waits for
 *     handshakes (shared memory).
 * The summation order is the engine's, whoever runs it: the results do not depend on which
 * thread moved a piece or when (the tests compare bitwise with comm_sum_serial).
 * Without the thread (PD_COMM_PROGRESS=caller, MPI without MPI_THREAD_MULTIPLE, or a thread
 * that could not be made), all-reduces move only inside comm calls on this Comm:
 * comm_ar_test, comm_ar_wait, comm_wait and comm_test each advance EVERY outstanding
 * all-reduce of the Comm as far as it can go without blocking. Then call comm_ar_test now
 * and then (say, between layers of backward) to overlap, and do not block in other calls
 * (barrier, agree, the control plane, group set-up) while all-reduces are outstanding: those
 * do not advance them, and a member waiting there can stall the ring. (Calling comm_ar_test
 * between layers is harmless with the thread: it only looks.)
 * PD_COMM_PROGRESS (read when the Comm is created): "thread" (the default), "thread:US"
 * (first nap US microseconds, 0 .. 1000000; 0 = never nap), "spin" (never nap: for
 * measuring what a spinning thread costs), "caller" (no thread: as before the thread
 * existed); anything else fails the creation with PD_EINVAL.
 *
 * Large chunks move in pieces of COMM_AR_PIECE floats, pipelined (a piece is forwarded as
 * soon as it arrived and was added). Members first send each other a 24-byte notice
 * (sequence number, n, op), so members that disagree on n or op all fail with PD_ECOMM
 * ("members disagree on size or op") and a timeout names the member that has not started.
 *
 * Returns PD_OK and *out, or PD_EINVAL (op unknown, NULL buffer with n > 0, more than
 * COMM_AR_WINDOW outstanding on g: nothing started, no sequence number used) or PD_ECOMM (the
 * group is broken: an all-reduce on it failed or was cancelled, the message says which). */
#define COMM_AR_WINDOW 1024            /* all-reduces outstanding on one group, at most */
/* 60 KiB: under Open MPI's TCP eager limit (64 KiB with its headers), so a piece is sent
 * at once instead of by rendezvous, whose go-ahead message queues behind this rank's own
 * outgoing data on a shaped full-duplex link (256 KiB pieces reached half the link rate at
 * 100 Mbit/s on the emulated cluster, 60 KiB pieces 96%: bench/results/2026-12-03-cluster-dp-vs-ddp.md). */
#define COMM_AR_PIECE ((size_t)15360)  /* floats per pipelined piece */
typedef struct CommAr CommAr;
int comm_group_iallreduce(CommGroup *g, float *buf, size_t n, CommOp op, CommAr **out, Err *err);

/* Without a progress thread, advances every outstanding all-reduce of a's Comm (never
 * blocks); with one, only looks. Sets *done when a has finished. Returns PD_OK, or a's error (then *done = 1). Either way a is still the
 * caller's: free it with comm_ar_wait (which returns the same result) or comm_ar_cancel. */
int comm_ar_test(CommAr *a, int *done, Err *err);

/* Completes *a, waiting at most timeout_s seconds (0 = no deadline) while advancing every
 * outstanding all-reduce of the Comm (beside the progress thread, if there is one).
 * - Finished: frees it, *a = NULL, returns PD_OK (buf holds the result) or its error
 *   (PD_ECOMM: members disagree on n or op, a member's endpoint closed, abort, MPI error).
 * - Deadline passed: returns PD_ECOMM naming the member it waits for and leaves *a pending
 *   (wait again, or comm_ar_cancel). The late member is the lowest group member whose notice
 *   has not come ("rank 0: timed out after 0.5 s in all-reduce #3 of 1000 floats: waiting
 *   for rank 1 (group rank 1), which has not started it"); if every member started, the ring
 *   neighbour this member waits for ("waiting for rank 3 (group rank 3) to pass piece 2 of
 *   step 1 of 6").
 * *a == NULL returns PD_OK at once. */
int comm_ar_wait(CommAr **a, double timeout_s, Err *err);

/* Gives up *a and frees it (*a = NULL; NULL is fine). If it had not finished, the group is
 * broken: later all-reduces on it fail at once, the other members' copies of this one fail
 * or time out. MPI: a send or receive that cannot be withdrawn is left to MPI, so buf must
 * then stay valid until comm_free. */
void comm_ar_cancel(CommAr **a);

/* 1 if all-reduces on c advance on c's own progress thread (started at the first one),
 * 0 if only inside comm calls (see "Progress" above). */
int comm_ar_progress_thread(const Comm *c);

/* Blocking all-reduce: comm_group_iallreduce, then comm_ar_wait with the collective
 * deadline (comm_set_coll_timeout); on a timeout the all-reduce is cancelled (the group is
 * then broken). Same order and result as above. Returns PD_OK, or PD_EINVAL / PD_ECOMM. */
int comm_group_allreduce(CommGroup *g, float *buf, size_t n, CommOp op, Err *err);

/* The serial reference of comm_group_allreduce: out = the all-reduce of the nx buffers x[0..nx-1]
 * (n floats each; x[g] is group rank g's), in exactly the order above (chunks of n over nx,
 * each summed from x[k+1] round to x[k]; / nx for COMM_MEAN); nx = 1 copies x[0]. For
 * single-process emulations and tests. out may alias any x[g]. An emulation of bucketed
 * all-reduces must call it once per bucket, with the bucket's own n (the chunks are the
 * bucket's). */
void comm_sum_serial(const float *const *x, int nx, size_t n, CommOp op, float *out);

/* Chunk k (0..r) boundary of the all-reduce of n floats over r members: floor(k * n / r),
 * computed without overflow. Chunk k is [comm_ar_chunk(n, r, k), comm_ar_chunk(n, r, k + 1)). */
size_t comm_ar_chunk(size_t n, int r, int k);

/* Bytes this endpoint has handed to the transport for sending, since it was created: every
 * data message (64-byte header + 4 * count payload, comm_isend), every control message
 * (64-byte header + payload: comm_ctrl_send, broadcast, gather, agree_t, group set-up) and
 * every all-reduce message (4 * floats of each ring piece, and a 24-byte notice to each other
 * member; no headers). An all-reduce of n floats by group rank g of r therefore adds exactly
 * 4 * (2n - len(g) - len(g + 1 mod r)) + 24 (r - 1) bytes, len(k) = chunk k's floats; that is
 * 2 (r - 1) / r * 4n + 24 (r - 1) within 8 bytes. Not counted: MPI's own collectives
 * (comm_barrier, comm_agree) and MPI's envelopes. */
uint64_t comm_bytes_sent(const Comm *c);

/* Helpers for messages and logs. */
const char *comm_kind_name(CommKind k);   /* "activation", "gradient", "control" */
/* Minibatches mb and mb + window map to the same tag on c (2^20, or less where MPI's tag
 * space is smaller); the header check still tells them apart. */
int64_t comm_tag_window(const Comm *c);
/* The MPI tag of (kind, mb, part) (part 0 = header, 1 = payload): see docs/explanation/communication.md.
 * window = how many consecutive minibatches get distinct tags. Always < 2 * COMM_KIND_COUNT
 * * window. */
int comm_tag(CommKind kind, int64_t mb, int part, int64_t window);
/* The tag of control channel ch: 2 * COMM_KIND_COUNT * window + ch, above every comm_tag of
 * that window. ch is 0 .. COMM_CHANNELS - 1 for callers; the comm's own collectives use
 * COMM_CHANNELS and COMM_CHANNELS + 1 (COMM_CTRL_TAG_COUNT channels in all). */
#define COMM_CTRL_TAG_COUNT (COMM_CHANNELS + 2)
int comm_ctrl_tag(int channel, int64_t window);
/* The tags of group all-reduce number seq (its group's sequence number): part 0 = the
 * members' notices, part 1 = the ring's pieces: 2 * COMM_KIND_COUNT * window +
 * COMM_CTRL_TAG_COUNT + 2 * (seq mod COMM_AR_WINDOW) + part, above every control tag. */
#define COMM_AR_TAG_COUNT (2 * COMM_AR_WINDOW)
int comm_ar_tag(int64_t seq, int part, int64_t window);
/* The tag window for a transport whose largest tag is tag_ub (MPI_TAG_UB): the largest
 * window <= 2^20 with 2 * COMM_KIND_COUNT * window + COMM_CTRL_TAG_COUNT + COMM_AR_TAG_COUNT
 * - 1 <= tag_ub, or 0 if none (tag_ub < 2 * COMM_KIND_COUNT + COMM_CTRL_TAG_COUNT +
 * COMM_AR_TAG_COUNT - 1 = 2119; MPI guarantees 32767, which gives 5109). */
int64_t comm_tag_window_for_ub(int64_t tag_ub);

#endif
