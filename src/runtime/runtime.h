/* runtime.h: the pipelined training runtime. Each worker builds only its stage's layers and
 * executes its instruction list from the schedule module (schedule.h): receive activations,
 * forward, send; receive gradients, backward, send; all-reduce among replicas; optimizer
 * step. Weight versions are kept in a per-stage store that holds exactly the versions the
 * instruction list still reads (weight stashing) and frees each after its last reader.
 *
 * Three ways to run the same instruction lists, which must give bitwise identical weights:
 *   - rt_worker_run on every rank of an MPI job (comm_mpi_create);
 *   - rt_run_threads: one thread per worker in this process (threads transport);
 *   - rt_emulate: ONE thread executes every worker's list serially, always advancing the
 *     first worker that can proceed, with all-reduces summed serially in group rank
 *     order (comm_sum_serial). It is the oracle for the asynchronous schedules.
 *
 * Units (schedule.h): unit u carries `unit_batch` samples, the data sampler's global
 * minibatch u (drop_last, so every unit is full). Labels travel from the input stage to the
 * last stage as control messages. The loss of a unit is scaled by 1/n_micro so that a
 * minibatch's accumulated gradient is the mean over its micro-batches; replicas all-reduce
 * their gradients before each step: the mean where each replica's gradient is a whole
 * minibatch's, the sum where replicas share a minibatch's micro-batches (rt_bucket.c,
 * rt_allreduce_op).
 *
 * Not here: planning (plan.h), the schedule's shape (schedule.h), checkpoints. */
#ifndef PD_RUNTIME_H
#define PD_RUNTIME_H

#include <stdint.h>

#include "comm.h"
#include "data.h"
#include "nn.h"
#include "plan.h"
#include "schedule.h"
#include "sim.h"

/* A worker's training state over its stage's layer range: where a run continues from (a
 * checkpoint, or the previous segment of a segmented run). Buffers in the range layouts of
 * nn.h; opt_v only for Adam. A worker with several stages (interleaved: its chunks, ascending)
 * has their ranges concatenated in chunk order in each buffer. */
typedef struct RtStageState {
    float *params, *state, *opt_m, *opt_v;
    long opt_step;
} RtStageState;

typedef struct RtConfig {
    const char *model_path;   /* model JSON; every worker reads it (unless model is given) */
    Model *model;             /* borrowed, may be NULL: this worker's model, loaded and not yet built
                               * (one process, one worker: the session parses the JSON once) */
    const Schedule *sched;    /* borrowed: the instruction lists (and stages) to run */
    int unit_batch;           /* samples per unit (micro-batch) */
    OptConfig opt;
    uint64_t seed;            /* init, dropout, shuffle */
    const Dataset *train;     /* borrowed; read by the input stage only */
    const Dataset *test;      /* borrowed, may be NULL: evaluation after training */
    double recv_timeout_s;    /* deadline on every receive (0 = none) */
    int trace;                /* record a trace of every instruction */
    int threads;              /* kernel threads per worker (0: leave as is); set on each worker's thread */
    int progress;             /* last stage, replica 0: 1 = a live line on stderr (\r), 2 = a line every 10 s */
    uint64_t unit_base;       /* global index of unit 0: the data minibatch and dropout key of unit u
                               * is unit_base + u (a run continued from a checkpoint) */
    int units_total;          /* for the progress line: units of the whole run (0: this schedule's) */
    double progress_t0;       /* for the progress line's rate: when the run started (pd_now; 0 = now) */
    uint64_t progress_u0;     /* ... and the global units done then */
    const RtStageState *init; /* per rank (sched->n_ranks entries), or NULL: fresh from seed */
    int nan_check;            /* RT_NAN_LOSS (default 0), RT_NAN_ALL: also every stage's gradients, RT_NAN_OFF */
    int no_stash;             /* ablation: backward uses the newest weights, not its forward's version */
    size_t bucket_bytes;      /* gradient bucket size for replicated stages (0: RT_BUCKET_BYTES, 4 MiB) */
    int64_t eval_base;        /* message id of the first evaluation batch (0: the one after the list's
                               * last unit); a session gives every evaluation its own ids */
    int staleness;            /* RT_STALE_* flags: compensation for delayed gradients (below) */
    int staleness_warmup;     /* RT_STALE_LR_WARMUP: the optimizer steps K of the warm-up (0: RT_STALE_WARMUP_STEPS) */
    int wire;                 /* RT_WIRE_*: how activations travel between stages (RT_WIRE_FP32, 0:
                               * as they are; docs/reference/train.md, --wire) */
    int wire_grad;            /* RT_WIRE_*: how activation gradients travel back (not RT_WIRE_DELTA) */
    const int *wire_at;       /* NULL, or per boundary b (between stages b and b + 1) its activations'
                               * RT_WIRE_* at [2 b] and its gradients' at [2 b + 1] (a plan's), in place
                               * of wire and wire_grad */
    int error_feedback;       /* gradients: a message's quantization error is added to the next one
                               * of the same boundary and micro-batch position (rt_wire.c) */
    int64_t train_n;          /* samples in the training set (RT_WIRE_DELTA's references are kept per
                               * sample: every rank keys them by the sampler's dataset positions) */
    long run_minibatches;     /* the whole run's minibatches, for the lr schedule's default length
                               * (opt.decay_steps 0: rt_run_steps; 0 here: this schedule's) */
    int precision;            /* compute precision of the matrix products, KPREC_* (0: float32;
                               * model_set_precision) */
} RtConfig;

/* The wire codecs (kernels.h, KCODEC_*): fp32, bf16, int8 (a scale per row), int4 (a scale per
 * group of 64; gradients round stochastically), delta (activations only: per training sample,
 * the int4 difference from its last activation kept at both ends as int8; int8 itself in the
 * data's first epoch and in evaluation). */
enum { RT_WIRE_FP32 = 0, RT_WIRE_BF16 = 1, RT_WIRE_INT8 = 2, RT_WIRE_INT4 = 3, RT_WIRE_DELTA = 4, RT_WIRE_COUNT = 5 };
/* "fp32" .. "delta" and back (-1: unknown). */
const char *rt_wire_name(int wire);
int rt_wire_parse(const char *name);
enum { RT_FIT_NONE = 0, RT_FIT_CORE_EFFICIENCY, RT_FIT_WAKE, RT_FIT_LINK_RATE };

/* The optimizer steps a stage takes over a run of `minibatches` (0: s's own) of kind s->kind:
 * one per minibatch, or one per round of r minibatches where the stage's r replicas average
 * whole minibatches (1f1b with one unit per minibatch, dp). The learning-rate schedule's
 * length when none is given. */
long rt_run_steps(const Schedule *s, int stage, long minibatches);
/* 1 if global gradient-norm clipping is defined for s: every stage's step applies the gradient of
 * the same minibatch, computed on the weights being updated (no unit delayed: the flushing kinds,
 * data and model parallelism, 1f1b on one stage); else 0 with err saying why. */
int  rt_clip_allowed(const Schedule *s, Err *err);

/* Staleness compensation (docs/explanation/staleness.md). A unit's delay d is the number of
 * updates that land on its stage between the weight version it reads and the step that applies
 * its own gradient (SchedWorkerInfo.delay, from the instruction list). With d = 0 (one stage,
 * the flushing kinds, a pipeline's last stage) every method leaves the run bitwise unchanged.
 *   RT_STALE_PREDICT    weight prediction (SpecTrain): the unit's forward and backward run on its
 *                       version advanced by d predicted updates, W - d * (the optimizer's last
 *                       update, optim_predict), computed at the forward and stashed for the backward.
 *   RT_STALE_LOOKAHEAD  a Nesterov look-ahead for delayed units: the version advanced by momentum
 *                       (SGD's momentum, Adam's beta1) times the last update.
 *   RT_STALE_LR_WARMUP  per-stage learning-rate warm-up (after PipeMare): step t of a stage whose
 *                       units' most delay is D uses lr / (D + 1)^(1 - min(t / K, 1)) (PipeMare divides
 *                       by D, which leaves a stage one update late at full rate).
 * Flags combine ("predict+lr-warmup"; not predict with lookahead). */
enum { RT_STALE_NONE = 0, RT_STALE_PREDICT = 1, RT_STALE_LOOKAHEAD = 2, RT_STALE_LR_WARMUP = 4 };
#define RT_STALE_WARMUP_STEPS 500
/* Parses "none", "predict", "lookahead", "lr-warmup" or a '+'-joined combination (not predict
 * with lookahead) into *flags; PD_OK or PD_EINVAL with err naming the bad word. */
int rt_staleness_parse(const char *s, int *flags, Err *err);
/* RtTrainSpec.staleness's default: rt_staleness_default(kind). 1f1b: lookahead (its units cross
 * up to warm-up - 1 steps, where predict collapsed vgg16's recipe and lookahead did not); 2bw:
 * predict (every unit crosses exactly one step, and where the newer version exists the
 * prediction is that version: the best on gpt-mini); asp: lookahead (pulls hand out the shard
 * moved ahead; the only method for delays known only at run time); none for the rest (their
 * units are never delayed). docs/explanation/staleness.md has the measurements. */
#define RT_STALE_DEFAULT (-1)
int rt_staleness_default(SchedKind kind);
/* The name of flags as rt_staleness_parse reads it ("none", "predict+lr-warmup"); returns buf. */
const char *rt_staleness_name(int flags, char *buf, size_t n);
/* The learning-rate factor RT_STALE_LR_WARMUP applies at step t (0-based) of a stage whose most
 * delay is D: 1 / D^(1 - min(t / K, 1)); 1 when D <= 1. */
double rt_stale_lr_factor(int D, long t, int K);

enum { RT_NAN_LOSS = 0, RT_NAN_ALL = 1, RT_NAN_OFF = 2 };

/* One executed instruction, for traces and timelines. */
typedef struct RtEvent {
    int32_t op;        /* InstrOp */
    int32_t mb;
    int32_t version;   /* version read (F/B) or written (step), -1 otherwise */
    double t0, t1;     /* seconds since the worker started */
} RtEvent;

/* Bytes a worker allocated for its stage, by category (rt_worker_init; zero on idle ranks;
 * several chunks: their sums, each chunk with its own slots).
 * versions x params and slots x (activations / slots) are what the simulator predicts from the
 * schedule analysis (SimMem.allocated, docs/explanation/schedules.md). */
typedef struct RtMem {
    size_t params;        /* one weight version's buffer */
    size_t grads;         /* the gradient buffer (dw) */
    size_t opt_state;     /* optimizer state: SGD momentum / Adam first moment (+ Adam second) */
    size_t stashed;       /* the version store's other buffers: (versions - 1) x params */
    size_t activations;   /* slots x (context (nnctx_bytes) + dy + dx + label buffers) */
    size_t comm;          /* message buffers of its own: none in pipelines (messages go to and from
                           * slots); asp: its push and answer buffers */
    size_t workspace;     /* running statistics (batch norm) */
    size_t scratch;       /* the kernels' per-thread scratch (kern_scratch_bytes) of the worker's
                           * thread after its stages' build: call-local temporaries, and at bf16
                           * the bf16 copies of the products' operands. rt_emulate's workers share
                           * one thread: each counts the arena its own build asked for */
    size_t predicted;     /* staleness prediction or look-ahead: the predicted weights, n x params
                           * (SchedWorkerInfo.max_predicted buffers) */
    size_t total;         /* the sum of the above */
    int versions, slots;  /* weight-version buffers and activation slots (SchedWorkerInfo) */
} RtMem;

/* The most stages (chunks) one worker runs (interleaved); a plan with more is refused. */
#define RT_MAX_CHUNKS 8

/* What one worker reports. */
typedef struct RtWorkerResult {
    int rank, stage, replica;   /* stage: its first (interleaved: chunk 0's) */
    int n_chunks;               /* stages it ran: 1, or interleaved's V */
    uint32_t chunk_crc[RT_MAX_CHUNKS];         /* CRC-32 of each chunk's slice of params */
    double chunk_compute_s[RT_MAX_CHUNKS];     /* compute_s by chunk (a step: each chunk's own) */
    int chunk_fwd[RT_MAX_CHUNKS];              /* forwards by chunk */
    size_t n_params, n_state;   /* floats of the stage's parameters and running statistics */
    float *params;           /* newest weights of the stage range (n_params; several chunks: their
                              * ranges concatenated), owned */
    uint32_t params_crc;     /* CRC-32 of params */
    RtStageState final;      /* params (= the field above), state and optimizer at the end; owned */
    int max_versions;        /* most weight versions alive at once */
    int n_delayed;           /* forwards in its list; their delays' sum and most (SchedWorkerInfo.delay):
                              * the staleness a unit's gradient crossed */
    long delay_sum;
    int delay_max;
    /* last stage only (zero elsewhere): */
    double loss_sum;         /* sum of unit losses (unscaled) */
    double last_loss;        /* the sum of its units' losses of minibatch last_mb (the newest it
                              * computed the loss of; with replicas, part of that minibatch's
                              * units), over last_n units */
    int64_t last_mb;         /* its global minibatch index (meaningful when last_n > 0) */
    int last_n;
    int units_done;
    long test_correct, test_total;
    double test_loss_sum;    /* sum over test samples of their loss (evaluation) */
    int n_hist;              /* units this worker computed the loss of */
    float *hist;             /* (n_hist, 3): unit, loss, training accuracy of the unit; owned */
    /* timing */
    double wall_s;           /* from start to the end of the instruction list */
    double compute_s;        /* in forward/backward/step */
    double compute_cpu_s;    /* ... of which the calling thread was on a CPU (its CPU clock; the
                              * kernels' other threads, --threads > 1, not counted) */
    double chunk_cpu_s[RT_MAX_CHUNKS];         /* compute_cpu_s by chunk */
    double wait_s;           /* blocked in receives and all-reduces */
    double grad_norm_sum, grad_norm_max;   /* gradient clipping: the global norms before clipping */
    int n_norms, n_clipped;  /* ... how many steps, and how many of them clipped */
    double bytes_sent;       /* the session: bytes this rank handed to the transport while training */
    /* the payload bytes of the activations each chunk sent to the next stage and of the gradients
     * it sent to the previous one, as encoded (wire) and as fp32 would have been (raw) */
    double chunk_act_wire[RT_MAX_CHUNKS], chunk_act_raw[RT_MAX_CHUNKS];
    double chunk_grad_wire[RT_MAX_CHUNKS], chunk_grad_raw[RT_MAX_CHUNKS];
    int n_fwd, n_bwd;       /* forwards; backwards (B, or the zb kinds' BI) */
    int n_wgrad;             /* the zb kinds' weight passes (BW) */
    int n_events;
    RtEvent *events;         /* when cfg->trace, owned */
    RtMem mem;               /* what it allocated (filled by rt_worker_init) */
    /* asp only (zero otherwise; rt_asp.c, docs/explanation/asp.md): gradients applied to this rank's shard of
     * the parameters, their staleness (the shard's version when applied - the version the
     * gradient was computed from), and the round trip of this worker's pulls (its push sent ..
     * every shard back) */
    long asp_applied;
    double asp_staleness_mean;
    int asp_staleness_max;
    long asp_pulls;
    double asp_pull_ms_mean, asp_pull_ms_max;
    /* sessions (rt_session.c): CPU seconds of this worker's process during its training
     * segments, and the process (workers on threads of one process share its clock) */
    double cpu_s;
    int64_t pid;
} RtWorkerResult;

void rt_result_release(RtWorkerResult *r);

/* Runs rank comm_rank(c)'s list of cfg->sched over c (asp: as rt_asp_worker_run without a
 * log), then (if cfg->test) the evaluation pass. Every rank must call it with the same configuration. Returns PD_OK, or an error with
 * err naming the rank, the instruction and the minibatch (a timeout names the peer). */
int rt_worker_run(Comm *c, const RtConfig *cfg, RtWorkerResult *res, Err *err);

/* One thread per rank over the threads transport; res has sched->n_ranks entries. On
 * failure: the code and message of the first worker that failed on its own. */
int rt_run_threads(const RtConfig *cfg, RtWorkerResult *res, Err *err);

/* The serial single-process emulation (see above); res has sched->n_ranks entries. A
 * schedule that cannot progress is reported as a deadlock naming the blocked workers. Not
 * for asp (PD_EINVAL). */
int rt_emulate(const RtConfig *cfg, RtWorkerResult *res, Err *err);

/* ---- checkpoints (rt_ckpt.c) ---------------------------------------------------------------- */
/* A whole model's training state, buffers in the whole-model layouts of nn.h (caller-owned). */
typedef struct RtCkpt {
    float *params, *state, *opt_m, *opt_v;   /* opt_v NULL unless Adam */
    long opt_step;
    uint64_t minibatches_done, units_done, seed;
    char schedule[32];
    OptConfig opt;               /* the optimizer and its hyper-parameters (load: NAN where the file
                                  * records none) */
    double data_mean, data_std;  /* the statistics the input images were standardised with (NAN: none,
                                  * as for text) */
} RtCkpt;

/* "<dir>/ckpt-<minibatches>.safetensors" (ckpt_name) into path: the name every rank gives the
 * checkpoint after that many minibatches. PD_EINVAL if it does not fit into n bytes. */
int rt_ckpt_path(const char *dir, uint64_t minibatches, char *path, size_t n, Err *err);
/* Writes rt_ckpt_path(dir, c->minibatches_done) atomically (ckpt.h), tensors named by global
 * layer, metadata with the optimizer's name and hyper-parameters and the input statistics; the
 * written path goes to path_out (if non-NULL). */
int rt_ckpt_save(const char *dir, const Model *m, const RtCkpt *c, char *path_out, size_t n, Err *err);
/* Reads a checkpoint of model m into c's buffers (sized for m; opt_v given means this run uses
 * Adam) and fields. Fails naming the file if it is of another model, was taken with another
 * optimizer than c's buffers are for ("taken with --optimizer adam, this run has --optimizer
 * sgd"), lacks a tensor, has a wrong shape, or is damaged. */
int rt_ckpt_load(const char *path, const Model *m, RtCkpt *c, Err *err);
/* The hyper-parameters of run that differ from those a checkpoint records (taken; NAN: not
 * recorded, never a difference), as flags: was gets "--lr 0.001 --momentum 0.9", now the run's
 * values of the same flags (each n bytes). Returns how many differ. */
int rt_ckpt_opt_changes(const OptConfig *taken, const OptConfig *run, char *was, char *now, size_t n);

/* Checkpoints without a shared filesystem (docs/explanation/checkpoints.md): every rank has a
 * checkpoint directory of its own, which may or may not be rank 0's. */
/* dir with "%r" replaced by rank and "%%" by "%" into out (n bytes): a directory per rank on
 * one machine. NULL stays NULL (*out untouched). PD_EINVAL for another "%" or a path too long. */
int rt_ckpt_dir_of_rank(const char *dir, int rank, char *out, size_t n, Err *err);
/* Both directories of a rank's run (RtTrainSpec.checkpoint_dir and .resume) so made, into
 * dirs[0] and dirs[1], the pointers moved there. */
int rt_ckpt_spec_dirs(const char **checkpoint_dir, const char **resume, int rank, char dirs[2][4096], Err *err);
/* Collective, after every rank made its directory dir: the rank that keeps the second copy of
 * each checkpoint, *partner (the same on every rank): the highest rank whose directory is not
 * rank 0's (rank 0 writes a marker file there, each rank looks for it), -1 when every rank sees
 * rank 0's directory (a shared filesystem: one copy). Returns this rank's error, if any, having
 * done its part of the collective. */
int rt_ckpt_partner(Comm *c, const char *dir, double timeout_s, int *partner, Err *err);
/* Between rank 0 and partner (others, and partner -1: nothing): rank 0 sends the checkpoint
 * file at path, partner writes the same bytes atomically to its own path and verifies them. */
int rt_ckpt_replicate(Comm *c, int partner, const char *path, double timeout_s, Err *err);
/* Collective, before a resume from dir (each rank's own): the ranks agree on the newest
 * checkpoint complete in any of their directories, and those whose directory lacks it receive
 * it from the lowest rank that has it, written atomically into dir (created if missing), so
 * that ckpt_latest(dir) finds it everywhere. Nothing anywhere: PD_OK, nothing done. Every rank
 * returns the same code (an agreement ends it); a failing rank's err says why. */
int rt_ckpt_fetch_newest(Comm *c, const char *dir, double timeout_s, Err *err);
/* A weights file (`train --save`): parameters, state, model name and the input statistics
 * (when finite), written atomically. */
int rt_weights_save(const char *path, const Model *m, const float *params, const float *state, double data_mean,
                    double data_std, Err *err);
/* Reads only the parameters, state and input statistics (NAN when absent) of a weights file
 * (train --save, tools/export_torch.py, any checkpoint) into c; optimizer buffers and counters
 * are left as they are. */
int rt_weights_load(const char *path, const Model *m, RtCkpt *c, Err *err);

/* ---- the profiler (profiler.c) ------------------------------------------------------------ */
typedef struct RtProfileOpts {
    int minibatch;       /* samples per minibatch */
    int threads;         /* kernel threads; 0 = leave as is */
    int warmup;          /* untimed steps first */
    int iterations;      /* timed steps; the median is recorded */
    int rounds;          /* repeat warmup + iterations this many times (0 or 1: once) and keep
                          * one round whole, by the sum of its layers' times: the median
                          * round (the machine's typical speed, which a run meets), or with
                          * keep_fastest the fastest (its speed when nothing slows it; this
                          * VM's comes in spells: docs/reference/formats.md) */
    int keep_fastest;
    int progress;        /* a progress line on stderr */
    const char *measured_on;   /* free text for the profile (host, CPU); may be NULL */
    int precision;       /* KPREC_* the model runs at (0: float32), as training will */
    int small_batch;     /* also time every layer at this many samples, 1 .. minibatch - 1, in each
                          * round after the minibatch (Profile.small_batch); 0: not */
} RtProfileOpts;

/* Times o->warmup + o->iterations training steps (o->rounds times) of the model (synthetic data, whole model
 * on this thread) and fills *out (caller releases with profile_release): per top-level layer
 * the median forward and backward seconds (backward includes the layer's share of the SGD
 * update, which a stage pays after every backward), output activation bytes and parameter
 * bytes for a minibatch; with o->small_batch, the same times at that batch, from the same round.
 * Returns PD_OK or an error naming the model file. */
int rt_profile(const char *model_path, const RtProfileOpts *o, Profile *out, Err *err);

/* The timing rt_profile records (and `pipedream bench --layers` prints): each top-level layer
 * of m, built for B samples with a vector of logits as output, runs as its own range [i, i+1),
 * its ends in the layouts the whole model has there (model_cut_layouts), on input x (B
 * samples) and labels: forwards in order, the loss, backwards in reverse order,
 * each followed by the layer's share of an SGD step (lr 0.01, momentum 0.9), timed with the
 * backward. w and st are the whole model's parameters (updated) and state. warmup untimed
 * rounds, then iterations timed ones; fwd_s[i], bwd_s[i] get the median seconds. progress: a
 * progress line on stderr. */
void rt_time_layers(Model *m, float *w, float *st, const float *x, const int32_t *labels, int B, int warmup,
                    int iterations, int progress, double *fwd_s, double *bwd_s);
/* The same, also timing each layer's backward split as the zb kinds run it (model_backward_b,
 * then model_backward_w, on scratch gradients, beside the whole backward; each timed only in
 * the iterations where it runs before the other, alternately, so that neither finds the
 * layer's data in cache from the other): bwd_in_s[i] = the median input-gradient pass,
 * bwd_w_s[i] = the median weight pass plus the layer's optimizer step share (as bwd_s has it).
 * A layer without a weight pass of its own (model_layer_splits == 0) gets bwd_in_s = bwd_s and
 * bwd_w_s = 0 exactly; with iterations == 1 the split is not timed (both 0). step_s (may be
 * NULL): step_s[i] = the median of the layer's optimizer step alone, the part of bwd_s (and
 * bwd_w_s) a micro-batched schedule pays once per minibatch, not per unit (0 without weights).
 * ends (n_layers entries, NULL: all plain, each layer as if a stage of its own): layer i's
 * layouts (NN_END_X, NN_END_Y: its input, its output channel-blocked), as model_cut_layouts
 * gives them for the model whole or cut at some boundaries. */
void rt_time_layers_split(Model *m, float *w, float *st, const float *x, const int32_t *labels, int B, int warmup,
                          int iterations, int progress, const unsigned char *ends, double *fwd_s, double *bwd_s,
                          double *bwd_in_s, double *bwd_w_s, double *step_s);

/* ---- training sessions (rt_session.c) -------------------------------------------------------
 * A whole training run: set-up checks on every rank (model, plan, data, checkpoint directory,
 * resume file) agreed before the first step, the schedule run as segments of
 * checkpoint_every minibatches by workers that persist across segments, a checkpoint after
 * each segment (gathered on rank 0 over the control plane, written atomically, its success
 * agreed by every rank before any rank calls it "the last checkpoint"), evaluation, and the
 * figures of every worker gathered on rank 0. Every wait is bounded by timeout_s.
 *
 * Failures: before the first step, every rank returns the failing rank's error ("rank R
 * (stage S): cause"). During a segment, the rank that fails ends the job (comm_abort: MPI
 * aborts every rank; threads: every peer unwinds) with a message naming its rank, stage,
 * cause and the last checkpoint that was written and agreed (or "none"). A rank lost to a
 * signal is named by the others (rt_fail.c).
 *
 * One-worker training is a session too: plan NULL is one stage of the whole model on one
 * worker (plan_single), the same flags, checks, checkpoints, evaluations and summary. */
typedef struct RtTrainSpec {
    const char *model_path;
    const Plan *plan;            /* borrowed; checked against the model; NULL: one stage on one worker */
    SchedKind kind;
    int n_micro;                 /* units per minibatch (1 unless a micro-batch kind) */
    int vertical_sync;
    int inflight;                /* 1f1b: the units stage 0 admits before its first backward
                                  * (SchedOpts.inflight, a plan's schedule.inflight); 0: as many as stages */
    int wire;                    /* RtConfig.wire: RT_WIRE_* of the activations */
    int wire_grad;               /* RtConfig.wire_grad: RT_WIRE_* of the gradients, or -1: as wire
                                  * (fp32 where wire is delta) */
    int error_feedback;          /* RtConfig.error_feedback */
    const int *wire_at;          /* RtConfig.wire_at (a plan's, Plan.wire), in place of wire and wire_grad */
    int epochs;                  /* training length, when steps == 0 */
    int steps;                   /* minibatches (optimizer steps); 0: from epochs */
    int minibatch;               /* samples per minibatch (n_micro units) */
    OptConfig opt;
    uint64_t seed;
    const char *data_dir;        /* IDX directory (NULL: DATA_DEFAULT_IDX_DIR), its images standardised
                                  * with its training split's mean and std (data_stats; a resumed run:
                                  * the checkpoint's) */
    const char *text;            /* or a plain-text file: byte-level language-model data (data.h) */
    const Dataset *train;        /* or, borrowed and optional, the data itself: used as given (not
                                  * standardised) instead of reading data_dir or text */
    const Dataset *test;         /* ... and its test set (NULL with train given: no evaluation) */
    int threads;                 /* kernel threads per worker */
    double timeout_s;            /* deadline of every wait: messages, control, collectives */
    int checkpoint_every;        /* minibatches per segment; 0 = one segment, no checkpoints */
    const char *checkpoint_dir;  /* created if missing (mkdir -p) */
    int keep_last;               /* keep only the newest keep_last checkpoints of the run (0: all;
                                  * ckpt_prune: never the one a resume needs) */
    const char *resume;          /* directory: continue from its newest valid checkpoint */
    const char *init_weights;    /* or a weights file (a checkpoint's names): start from these
                                  * parameters and state, optimizer fresh, minibatch 0 */
    int trace;                   /* record every instruction (timelines) */
    int progress;                /* see RtConfig.progress */
    int nan_check;               /* RT_NAN_* */
    const Profile *profile;      /* optional: the simulator's prediction for the same run */
    const char *progress_file;   /* optional: rank 0 appends a JSON line per checkpoint: every rank's
                                  * figures of the segment just ended beside the prediction */
    int eval_every;              /* minibatches between test-set evaluations (0: only at the end);
                                  * the pipeline drains there, as at a checkpoint */
    double target_accuracy;      /* stop at the first evaluation reaching it (0: never) */
    int no_stash;                /* ablation of weight stashing (RtConfig.no_stash) */
    int staleness;               /* RT_STALE_* (RtConfig.staleness), or RT_STALE_DEFAULT */
    int staleness_warmup;        /* RtConfig.staleness_warmup */
    int recompute;               /* keep only stage inputs; recompute the forward before backward */
    const char *save;            /* write the final weights here (rt_weights_save); NULL: no file */
    int precision;               /* RtConfig.precision */
    int fit;                     /* RT_FIT_*: with a profile, the figure of the plan's cluster at which
                                  * the simulator predicts the run's time per unit
                                  * (RtTrainSummary.fitted_*): its core efficiency; its wake_s
                                  * (plan.h), the core efficiency staying the plan's; or one factor
                                  * on every link's bandwidth (levels and hosts) */
} RtTrainSpec;

/* One evaluation during a run: after `minibatches` (of the whole run, resumed ones included),
 * `train_s` seconds of training in this run (evaluations and checkpoint writes excluded). */
typedef struct RtEvalPoint {
    uint64_t minibatches;
    double epoch, train_s, test_accuracy, test_loss;
} RtEvalPoint;

typedef struct RtStageSummary {
    int replicas;
    double measured_ms;          /* mean forward+backward compute per unit over replicas */
    double predicted_ms;         /* the simulator's (NAN without a profile) */
    double busy;                 /* compute / wall, mean over replicas */
    double cpu_ms;               /* of measured_ms, the time its thread was on a CPU (NAN: not
                                  * measured, or kernels on several threads) */
    int versions;                /* most weight versions alive at a replica */
    uint32_t weights_crc;        /* CRC-32 of replica 0's final weights */
    RtMem mem;                   /* what replica 0 allocated, by category (the memory ledger) */
    double predicted_bytes;      /* the simulator's allocation for that worker (NAN without a profile) */
    double predicted_activation_bytes, predicted_stashed_bytes, predicted_scratch_bytes;
    int wire_act, wire_grad;     /* RT_WIRE_* of its output's activations and of its input's gradients */
    double act_wire_bytes, act_raw_bytes;    /* the activations it sent to the next stage (replicas
                                              * summed), as sent and as fp32 */
    double grad_wire_bytes, grad_raw_bytes;  /* the gradients it sent to the previous stage */
    double delay_mean;           /* updates a unit's gradient crossed on this stage: mean and most */
    int delay_max;
} RtStageSummary;

typedef struct RtTrainSummary {
    char model[64], schedule[32], transport[16], optimizer[8];
    char staleness[48];          /* the compensation the run used (rt_staleness_name) */
    char precision[8];           /* "fp32" or "bf16" (kern_precision_name) */
    int workers, stages, steps, units, unit_batch;
    int minibatch, threads;      /* samples per minibatch, kernel threads per worker */
    double lr;
    char lr_schedule[16];        /* optim_lr_sched_name */
    char wire[8];                /* the activations' codec (rt_wire_name; a plan's per boundary: "plan") */
    char wire_grad[8];           /* the gradients' */
    int error_feedback;
    double wire_ratio;           /* activation and gradient payload bytes as fp32 over as sent (NAN: none sent) */
    double bytes_sent;           /* bytes all ranks handed to the transport while training (comm_bytes_sent) */
    double grad_norm_mean, grad_norm_max;   /* --clip-grad-norm: the global gradient norms before clipping (NAN: off) */
    int clip_steps, clipped_steps;          /* ... over how many steps, and how many were scaled down */
    double epochs;               /* passes over the training set the run's minibatches make (resumed
                                  * ones included) */
    double samples_per_cpu_s;    /* samples per CPU second of the job's processes (training only) */
    double data_mean, data_std;  /* what the input images were standardised with (NAN: text, given data) */
    char predicted_note[256];    /* what the prediction is: "same plan and profile", "no profile given",
                                  * or the simulator's error */
    double final_loss;           /* mean loss of the last minibatch (NAN if none) */
    double mean_loss;            /* mean over the run's units */
    double test_accuracy;        /* NAN without a test set */
    double samples_per_s, time_per_unit_ms, overhead_pct, wall_s;
    double predicted_time_per_unit_ms;   /* the simulator's run of the same units, fill and drain
                                          * included, over its units: what time_per_unit_ms
                                          * (the run's wall time over its units) should be */
    double predicted_steady_ms;          /* the simulator's steady state per unit (sim.h's
                                          * time_per_unit_s): the figure a long run approaches */
    /* RtTrainSpec.fit, RT_FIT_CORE_EFFICIENCY: the plan's cluster's core_efficiency at which the
     * simulator's run of the same units takes the measured time per unit (NAN: not fitted;
     * fitted_note says why), and that prediction */
    double fitted_core_efficiency, fitted_time_per_unit_ms;
    double fitted_wake_s;        /* RT_FIT_WAKE: the wake_s found (NAN: not fitted) */
    double fitted_link_scale;    /* RT_FIT_LINK_RATE: the factor on every bandwidth (NAN: not fitted) */
    char fitted_note[160];
    uint64_t resumed_from;       /* minibatches done by the checkpoint resumed from (0: fresh) */
    int checkpoints;             /* written by this run */
    char last_checkpoint[4096];  /* path of the newest agreed checkpoint, "" if none */
    RtStageSummary *stage;       /* stages entries, owned */
    RtWorkerResult *res;         /* workers entries (figures, events, loss history), owned */
    int n_sim_events;            /* the simulator's timeline of the same run (with a profile and a
                                  * trace), to draw beside the measured one */
    TraceEvent *sim_events;      /* owned */
    int n_evals;                 /* evaluations during the run (--eval-every), and the last one */
    RtEvalPoint *evals;          /* owned */
    double test_loss;            /* mean test loss after training (NAN without a test set) */
    uint64_t target_minibatches; /* minibatches when target_accuracy was reached (0: not reached) */
    double target_train_s;       /* training seconds then */
    /* asp (rt_asp_summarize sets asp_figures): staleness of the applied gradients over all
     * shards (NAN / -1 without any), pull round trips (NAN without any) */
    int asp_figures;
    double staleness_mean, pull_ms_mean, pull_ms_max;
    int staleness_max;
} RtTrainSummary;

/* Runs the session described by spec. c: this process's MPI endpoint (every rank calls, the
 * summary is filled on rank 0 only), or NULL: one thread per worker of the plan in this
 * process. Returns PD_OK or an error (err as described above). */
int  rt_train(Comm *c, const RtTrainSpec *spec, RtTrainSummary *out, Err *err);
void rt_train_summary_release(RtTrainSummary *s);

/* ---- asynchronous parallel training (rt_asp.c, docs/explanation/asp.md) ------------------------------------
 * sched_build(SCHED_ASP) gives the stage table of dp (every rank a replica of the whole model)
 * and per worker F u, B u, U for its own units; those lists alone would train the replicas
 * apart, so rt_worker_run, rt_run_threads, a session (rt_train) and the functions below run
 * asp's pushes and pulls instead (rt_asp.c), and rt_emulate refuses it. The parameters are sharded over the replicas; each worker pushes every gradient
 * to the shards' owners, which apply it at once and answer with the shard for its next unit.
 *
 * RtAspLog (tests, analysis): what one rank's shard [lo, hi) of the whole model's parameter
 * buffer applied, in order: unit[k] is the unit whose gradient made version k + 1 of the shard,
 * from[k] the shard version that gradient was computed from (staleness k - from[k]). */
typedef struct RtAspLog {
    int rank;
    size_t lo, hi;
    int n, cap;
    int32_t *unit, *from;   /* n entries each, owned */
} RtAspLog;
void rt_asp_log_release(RtAspLog *l);   /* zeroed is fine */

/* rt_worker_run for cfg->sched of kind asp (another kind is an error), on every rank of c
 * (all of them replicas); log (optional) gets this rank's shard log. Afterwards every rank's res holds the same final
 * weights and optimizer state. */
int rt_asp_worker_run(Comm *c, const RtConfig *cfg, RtWorkerResult *res, RtAspLog *log, Err *err);
/* One thread per rank over the threads transport; res (and logs, optional) sched->n_ranks entries.
 * On failure: the code and message of the first worker that failed on its own. */
int rt_asp_run_threads(const RtConfig *cfg, RtWorkerResult *res, RtAspLog *logs, Err *err);
/* Sessions: adds one segment's asp figures to a worker's totals (weighted means, maxima), and
 * fills out's staleness_* and pull_ms_* from every worker's totals. */
void rt_asp_acc_add(RtWorkerResult *acc, const RtWorkerResult *seg);
void rt_asp_summarize(const RtWorkerResult *res, int n, RtTrainSummary *out);

#endif
