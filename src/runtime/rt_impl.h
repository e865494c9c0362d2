/* rt_impl.h: the Worker and Slot structs and the helpers the runtime's files share: runtime.c
 * (the instruction interpreter), rt_vstore.c (weight versions, staleness), rt_bucket.c
 * (gradient buckets), rt_worker.c (set-up), rt_run.c (run drivers), rt_record.c (what a
 * worker records), rt_eval.c, rt_asp.c, rt_tie.c and rt_session.c. Not a public header. */
#ifndef PD_RT_IMPL_H
#define PD_RT_IMPL_H

#include <sys/types.h>

#include "kernels.h"
#include "runtime.h"

enum { RT_DONE = 0, RT_BLOCKED = 1, RT_AT_AR = 2, RT_ERR = 3 };

/* One unit in flight at a worker: its activations context and message buffers. */
typedef struct Slot {
    int unit;                 /* -1: free (its sends may still be completing) */
    NnCtx *ctx;               /* input copy, activations, saved state (recompute: a pool context
                               * while the unit holds one, else NULL) */
    float *in_buf, *out_buf;  /* recompute only: the kept stage input (B, in) and the output to send */
    float *dy;                /* (B, out): gradient from the next stage, or dlogits */
    float *dx;                /* (B, in): gradient for the previous stage (NULL at stage 0) */
    float *keep;              /* zb kinds: the output gradients of the splitting layers, kept by BI
                               * for BW (model_split_floats); NULL otherwise */
    int fused;                /* zb kinds: BI ran the whole backward (its BW is the next instruction),
                               * so BW has nothing left to compute */
    float *labels_f;          /* (B): labels as a control message payload */
    int32_t *labels;          /* (B) */
    CommReq *r_act, *r_grad, *r_lab;   /* posted receives */
    CommReq *s_act, *s_grad, *s_lab;   /* sends not yet completed */
    int act_ready, grad_ready, lab_ready;
    int version;              /* weight version its forward used */
    int pslot;                /* staleness prediction: the predicted weights it computes with (Worker.pbuf), -1: none */
    /* a codec other than fp32 (rt_wire.c): the messages as encoded, what receives land in (decoded
     * into the input / dy once arrived, act_in and grad_in then set) and what sends read (encoded
     * from the output / dx); NULL with fp32 or where the stage has no such message */
    uint8_t *w_act_in, *w_act_out, *w_grad_in, *w_grad_out;
    int act_in, grad_in;
} Slot;

typedef struct RtTie RtTie;

/* One of a worker's four messages per unit (activation in and out, gradient in and out) as the
 * wire carries it (rt_wire.c). */
typedef struct RtWireDir {
    int wire;                 /* RT_WIRE_*; RT_WIRE_FP32: the floats as they are, no buffer */
    KCodec kc;                /* its codec (delta: the differences'; kc_first: the first epoch's) */
    KCodec kc_first;
    size_t n;                 /* floats of a unit's message (unit_batch samples of n / unit_batch) */
    size_t cap;               /* bytes of its largest encoding, in whole float-sized words */
    int boundary;             /* between stages boundary and boundary + 1 */
    /* delta: each training sample's reference, ref_bytes bytes at store + position * ref_bytes */
    KCodec ref;
    size_t ref_bytes;
    uint8_t *store;
    float *tmp;               /* 2 n / unit_batch floats */
    /* error feedback (a gradient sent): the carried error per micro-batch position, n_ef of n floats */
    float **ef;
    int n_ef;
} RtWireDir;

typedef struct Worker {
    /* A rank that runs several stages (interleaved: its chunks) is one Worker per stage. The one
     * its caller holds is chunk 0: it owns the list's position (pc), the result, the events and
     * chunk[]; chunk[c] (c >= 1) are built for sw->stages[c] and share cfg, s, sw, c, res and the
     * Model (borrowed from chunk 0), each with its own layer range, weight versions, gradient
     * buffer, optimizer state and slots. rt_exec runs each instruction on chunk[in->chunk] and
     * a step on every chunk. chunk == NULL: one stage (every kind but interleaved). */
    struct Worker **chunk;
    int n_chunk, ci;          /* chunks of the rank (1 without), this one's index */
    const RtConfig *cfg;
    const Schedule *s;
    const SchedWorker *sw;
    Comm *c;
    CommGroup *group;         /* replicas of this stage (NULL: one replica, or emulation) */
    CommGroup *everyone;      /* gradient clipping: every rank that runs a stage (NULL: one, or no clipping) */
    float *clip_buf;          /* gradient clipping: 2 n_stages floats (clip_gradients) */
    RtWorkerResult *res;
    int rank, stage, first, last;
    int is_input, is_last, classes;
    int tlen;                 /* targets per sample: 1 (a class), or T (a language model's positions) */
    /* gradient buckets (replicated stages): bucket b is the contiguous part [lo[b], lo[b] + n[b])
     * of dw holding top-level layers [layer[b], ...); buckets are numbered from the LAST layer,
     * all-reduced as soon as the last backward before an all-reduce has finished their layers */
    int n_buckets;
    int *bk_layer;
    size_t *bk_lo, *bk_n;
    CommAr **bk_ar;           /* started all-reduces (NULL: not started) */
    /* recomputation (the schedule's recompute): slots keep only inputs; max_full contexts are
     * lent to a unit from its forward (or recompute) to its backward */
    int recompute, n_pool;
    int split;                /* the list splits backwards (BI, BW: the zb kinds): a unit keeps its slot,
                               * activations and slot->keep from its BI to its BW */
    NnCtx **pool;
    char *pool_busy;
    float *state_scratch;     /* running statistics a recompute may write (the real ones: once, in F) */
    Shape in_shape, out_shape;   /* with the batch dimension */
    Model *m;
    int m_borrowed;           /* m is cfg->model: not freed here */
    size_t np, nst;
    float *state, *dw;
    Optim opt;
    /* weight versions: n_vslots buffers; vver[k] = version held by slot k, -1 = free */
    int n_vslots, n_versions, newest;
    float **vbuf;
    int *vver;
    int *last_read;           /* per version: index of its last reading instruction */
    /* staleness compensation (RtConfig.staleness): each instruction's unit delay (SchedWorkerInfo.delay),
     * the most of them, and the predicted weights: n_pred buffers, each a key (version, delay, steps
     * done at the forward) held by pref units from their forward to their last backward op */
    int *delay;
    int delay_max;
    int n_pred;
    float **pbuf;
    int *pver, *pdel, *pstep, *pref;
    Slot *slots;
    int n_slots;
    RtTie *xtie;              /* tied parameters whose other layer is on another stage (rt_tie.c) */
    int n_xtie;
    DataSampler sampler;
    int has_sampler;
    RtWireDir wire_ain, wire_aout, wire_gin, wire_gout;   /* rt_wire.c */
    uint32_t *wire_order;     /* delta: the data's order of epoch wire_epoch (UINT64_MAX: none yet) */
    uint64_t wire_epoch;
    int pc;
    double t_start;
    int events_cap;
    double last_progress;
} Worker;

/* The message id of unit u's activation into stage `boundary`, or of the gradient w.r.t. that
 * stage's input (training and evaluation alike). With one stage per rank the unit alone tells
 * messages apart (a rank gets one kind of message per unit from a peer); with several, the
 * same two ranks exchange one per chunk, so the id carries the boundary too
 * (docs/explanation/schedules.md, interleaved). */
static inline int64_t rt_msg_id(const Schedule *s, int64_t u, int boundary) {
    return s->n_chunks > 1 ? u * s->n_stages + boundary : u;
}

/* rt_wire.c: the codecs of a worker's messages (RtConfig.wire, wire_grad, wire_at,
 * error_feedback). rt_wire_init (after the shapes and the stage are known) sets up w's four
 * RtWireDir and returns PD_EINVAL for a combination it cannot run; rt_wire_release frees them.
 * rt_wire_shape: the shape unit u's message d travels as (shape1 of its float-sized words), or
 * s itself where it travels as floats (rt_wire_plain). rt_wire_send: what a send of unit u's floats x reads (x
 * itself, or buf after encoding them; counts the bytes into w->res); rt_wire_recv: decodes
 * what landed in buf into x (n floats: the unit's, or an evaluation batch's). Evaluation (eval
 * set): no reference or error is read or kept; delta travels as int8, bf16 as fp32. */
int    rt_wire_init(Worker *w, Err *err);
void   rt_wire_release(Worker *w);
int    rt_wire_plain(const RtWireDir *d, int eval);
Shape  rt_wire_shape(Worker *w, const RtWireDir *d, Shape s, int64_t u, int eval);
const float *rt_wire_send(Worker *w, RtWireDir *d, int64_t u, const float *x, size_t n, uint8_t *buf, int eval);
void   rt_wire_recv(Worker *w, RtWireDir *d, int64_t u, const uint8_t *buf, float *x, size_t n, int eval);

/* rt_record.c. The progress line on stderr (RtConfig.progress) after unit u of w's list, whose
 * loss was loss; last: w computes no later unit of the list (that line is always written). */
void rt_progress(Worker *w, int u, int last, float loss);
/* Counts a unit's loss toward the newest minibatch's (RtWorkerResult.last_loss): a newer
 * minibatch mb starts the sum again. */
void rt_last_loss_add(RtWorkerResult *r, int64_t mb, double loss);
/* With RtConfig.trace: appends the event (op, unit mb, version, from t0 to t1 on pd_now's
 * clock) to w's result, its times from w->t_start. */
void rt_trace_add(Worker *w, int op, int mb, int version, double t0, double t1);

/* rt_vstore.c: the weight-version store of a stage (Worker.vbuf, vver, last_read) and the
 * staleness compensation of its units (Worker.pbuf ...).
 * rt_vstore_plan: the store's plan from the schedule analysis (the last reader of every
 * version, the buffers alive at once, the units' delays; the list's delay figures into
 * w->res from chunk 0), and the predicted-weights buffers it needs.
 * rt_vstore_get: the buffer holding version (asserts it is held); rt_vstore_slot_of: its
 * index, -1 if none (-1: a free one).
 * rt_vstore_collect: after instruction pc, drops versions older than the newest that
 * nobody reads again (and counts the most held).
 * rt_vstore_step: the optimizer step writing version `to` (the newest + 1) from the newest
 * and w->dw, in place unless the old newest is read after pc.
 * rt_stale_lr_scale: --staleness lr-warmup's factor for step t (0-based) into w->opt.
 * rt_forward_weights: the weights the forward `in` of unit sl computes with (its version's,
 * or predicted ahead), setting sl->pslot; rt_unit_weights: those a backward reads. */
void rt_vstore_plan(Worker *w);
float *rt_vstore_get(Worker *w, int version);
int  rt_vstore_slot_of(Worker *w, int version);
void rt_vstore_collect(Worker *w, int pc);
void rt_vstore_step(Worker *w, int to, int pc);
void rt_stale_lr_scale(Worker *w, long t);
const float *rt_forward_weights(Worker *w, Slot *sl, const Instr *in);
const float *rt_unit_weights(Worker *w, const Slot *sl, int version);

/* rt_bucket.c: how replicas combine gradients (sum or mean, by the kind); whether the
 * backward at pc is the last of its chunk before the chunk's all-reduce (so buckets may start
 * while it runs); the hook that starts them (arg: an RtBucketHook, whose rc holds the first
 * error); and the all-reduce instruction: every bucket started, then completed in order. */
typedef struct RtBucketHook {
    Worker *w;
    Err *err;
    int rc;
} RtBucketHook;
CommOp rt_allreduce_op(const Schedule *s);
int  rt_last_backward_before_ar(const Worker *w, int pc);
void rt_bucket_hook(void *arg, int i);
int  rt_bucket_allreduce(Worker *w, Err *err);

/* Chunk c of the rank w leads (w itself when the rank runs one stage; c < w->n_chunk). */
static inline Worker *rt_chunk(Worker *w, int c) { return w->chunk ? w->chunk[c] : w; }

int  rt_worker_init(Worker *w, Comm *c, const RtConfig *cfg, int rank, RtWorkerResult *res, Err *err);
void rt_worker_release(Worker *w);
/* Binds an initialised worker whose previous list has finished (sends drained) to cfg's
 * schedule (same plan and kind, any length): its newest weights become version 0, the
 * optimizer state, running statistics, slots and models stay. res is the new list's result. */
int  rt_worker_bind(Worker *w, const RtConfig *cfg, RtWorkerResult *res, Err *err);
/* Completes every slot's pending sends (so that buffers may be reused or freed). */
int  rt_worker_drain(Worker *w, Err *err);
/* After comm_threads_run failed: copies into err the error of the first worker that failed on
 * its own (not with PD_ECOMM because a peer went away), else of the first that failed; returns
 * its code (rc if none failed). */
int  rt_first_failure(int rc, const int *rcs, const Err *errs, int n, Err *err);
/* The gradient buckets of layers [first, last) of m: from the last layer down, layers are
 * added to a bucket until it holds at least bucket_bytes (0: RT_BUCKET_BYTES). Writes up to
 * last - first buckets (first layer, offset from the range's start, floats); returns how many. A
 * pure function of the model and bucket_bytes, so every replica and the emulation agree. */
#define RT_BUCKET_BYTES ((size_t)4 << 20)
int  rt_buckets(const Model *m, int first, int last, size_t bucket_bytes, int *layer, size_t *lo, size_t *n);
void rt_worker_finish(Worker *w);
int  rt_exec(Worker *w, int blocking, Err *err);
/* The group of w's replicas for its all-reduces (w->group), when its stage has several and
 * the kind all-reduces (every kind but asp), then, with gradient clipping, the group of every
 * rank that runs a stage (w->everyone). Collective over the stage's replicas, then over all. */
int  rt_worker_group(Worker *w, Err *err);
/* The first half of rt_worker_group alone: each chunk's group of its stage's replicas (x->group,
 * for stages with two or more). */
int  rt_worker_replica_groups(Worker *w, Err *err);
/* The second half of rt_worker_group alone: w->everyone, with gradient clipping. */
int  rt_worker_clip_group(Worker *w, Err *err);
/* Runs w's list (bound, t_start set) to its end over MPI or threads: rt_exec, or rt_asp_exec
 * for asp (log: optional, RtAspLog), then completes its sends. Returns PD_OK or the error. */
int  rt_worker_segment(Worker *w, RtAspLog *log, Err *err);
/* Forward-only pass of cfg->test through replica 0 of every stage; the last stage counts
 * correct answers into w->res. Collective over the workers of replica 0. */
int  rt_eval(Worker *w, Err *err);

/* rt_tie.c: the tied parameters of w's stage whose other end is on another stage. rt_tie_init
 * (after the stage is built) refuses a split tie under a kind whose stages do not step in
 * lockstep, and any tie under asp. rt_tie_exchange, at the step writing `version` (after the
 * replicas' all-reduce): swaps the tensor's gradient with the other owner and leaves the sum,
 * source's first, in w->dw; *done = 0 when not blocking and the other part has not arrived
 * (call again: nothing is sent twice). */
int    rt_tie_init(Worker *w, Err *err);
int    rt_tie_exchange(Worker *w, int version, int blocking, int *done, Err *err);
size_t rt_tie_bytes(const Worker *w);   /* its exchange buffers */
void   rt_tie_release(Worker *w);

/* rt_asp.c: runs the worker's asp segment (cfg->sched of kind SCHED_ASP, every rank of w->c a
 * replica) instead of rt_exec: its units with pushes and pulls, serving its shard, then every
 * shard to every rank, so that all ranks end with the same newest weights and optimizer state.
 * Collective over w->c. log: optional (RtAspLog). Returns RT_DONE, or RT_ERR with err set. */
int  rt_asp_exec(Worker *w, RtAspLog *log, Err *err);

/* rt_fail.c (MPI only; no-ops under threads): every rank learns every rank's pid, then a
 * SIGTERM/SIGINT handler names the lost ranks and the last checkpoint before exiting 1. */
int  rt_fail_setup(Comm *c, const Schedule *s, double timeout_s, Err *err);
void rt_fail_set_checkpoint(const char *path);   /* "" or "none": none yet */
int  rt_fail_pid_gone(pid_t pid);   /* no such process, or a zombie (async-signal-safe) */

#endif
