/* schedule.h: schedules as data. A schedule is, for each worker (rank), the ordered list
 * of instructions it executes: forward/backward of a unit, sends and receives of
 * activations and gradients, all-reduce within a stage's replicas, optimizer step, flush.
 * The simulator (sim.h) and the runtime interpret exactly these lists. Semantics (weight
 * versions, when replicas synchronise, gradient scaling) are in docs/explanation/schedules.md.
 *
 * Units. Work is counted in *units*: one unit is one profile minibatch worth of samples
 * (what the profile timed). Kinds without micro-batches (1f1b, dp, model-parallel) have
 * one unit per minibatch; gpipe, 1f1b-flush and 2bw split each minibatch (optimizer step)
 * into n_micro units. Instr.mb is the global unit index u = minibatch * n_micro + micro.
 *
 * This module runs nothing and times nothing. */
#ifndef PD_SCHEDULE_H
#define PD_SCHEDULE_H

#include <stdint.h>
#include <stdio.h>

#include "core.h"
#include "plan.h"

typedef enum SchedKind {
    SCHED_1F1B,        /* PipeDream: NOAM admitted, then 1F1B, round-robin replicas, weight stashing */
    SCHED_GPIPE,       /* all forwards of a minibatch's micro-batches, all backwards, flush */
    SCHED_1F1B_FLUSH,  /* 1F1B within a minibatch of micro-batches, flush at its end */
    SCHED_2BW,         /* PipeDream-2BW: 1F1B without flush, double-buffered weights */
    SCHED_DP,          /* data parallel BSP: every worker the whole model */
    SCHED_MP,          /* model parallel: replica 0 of each stage, one minibatch in flight */
    SCHED_ASP,         /* asynchronous parallel: every worker the whole model, no synchronisation
                        * (lists: F u, B u, U per own unit; the runtime's rt_asp.c, docs/explanation/asp.md) */
    SCHED_ZB_H1,       /* Zero Bubble's ZB-H1: 1F1B-flush with backward split into BI (input gradient)
                        * and BW (weight gradient), BW deferred into the drain (peak memory of 1f1b-flush) */
    SCHED_ZB_H2,       /* Zero Bubble's ZB-H2 with a flush: ZB-H1 with 2(S-s)-1 warm-up forwards (more memory) */
    SCHED_INTERLEAVED, /* Megatron's interleaved 1F1B: several stages (chunks) per worker, flush per minibatch */
    /* The V-shaped kinds: 2 chunks per worker in the V placement (sched_v_chunk), backward split
     * into BI and BW, a flush per minibatch (docs/explanation/schedules.md, "V-shaped schedules"). */
    SCHED_ZB_V,        /* Zero Bubble's ZB-V: no bubble beyond the fill when F = B = W, 1F1B's activation memory */
    SCHED_V_HALF,      /* V-Half (controllable memory): about half of 1F1B's activation memory */
    SCHED_V_MIN,       /* V-Min (controllable memory): about a third of 1F1B's activation memory */
    SCHED_DUALPIPE_V,  /* DeepSeek's DualPipeV: DualPipe folded into a V, forward and backward in pairs */
    SCHED_COUNT
} SchedKind;

typedef enum InstrOp {
    OP_FORWARD,    /* mb, version read */
    OP_BACKWARD,   /* mb, version read (the one its forward used: weight stashing) */
    OP_SEND_ACT,   /* mb, peer: the output activation of this stage for mb to peer (async) */
    OP_RECV_ACT,   /* mb, peer: blocks until mb's input activation from peer has arrived */
    OP_SEND_GRAD,  /* mb, peer: the gradient w.r.t. this stage's input for mb to peer (async) */
    OP_RECV_GRAD,  /* mb, peer: blocks until the gradient for mb from peer has arrived */
    OP_ALLREDUCE,  /* peer = stage group, version = the version the following step writes;
                    * collective over all replicas of the stage, in the same order on each */
    OP_STEP,       /* optimizer step; version = the version it writes (weights after it) */
    OP_FLUSH,      /* marker: no unit in flight at this worker; stashes may be freed */
    /* Added with the zero-bubble kinds and recomputation (docs/explanation/schedules.md); the kinds above
     * never emit them unless SchedOpts.recompute is set (OP_RECOMPUTE only). */
    OP_BACKWARD_B, /* zb kinds: mb, version: the input-gradient half of backward (what SEND_GRAD sends);
                    * keeps what BW needs (the unit stays in flight) */
    OP_BACKWARD_W, /* zb kinds: mb, version (the one F and BI read): the weight-gradient half,
                    * accumulated into the gradient buffer; the unit leaves flight */
    OP_RECOMPUTE,  /* recompute: mb, version (the one F read): the forward again from the kept
                    * stage input, restoring the unit's activations for its backward */
    OP_COUNT
} InstrOp;

/* 20 bytes; unused fields are -1 (chunk: 0). An initialiser naming only the first four
 * fields leaves chunk 0, the worker's first (for every kind but interleaved: only) stage.
 * Messages are (kind, sender, receiver, unit, boundary): the boundary is the stage an
 * activation feeds / whose input gradient it is (docs/explanation/schedules.md, interleaved). */
typedef struct Instr {
    int32_t op;       /* InstrOp */
    int32_t mb;       /* global unit index, or -1 */
    int32_t peer;     /* send/recv: the other rank; all-reduce: the stage index; else -1 */
    int32_t version;  /* F/B/BI/BW/R: version read; all-reduce/step: version written; else -1 */
    int32_t chunk;    /* which of the worker's stages (SchedWorker.stages[chunk]) the instruction is
                       * for; 0 except in interleaved; step and flush cover every chunk (0) */
} Instr;

typedef struct SchedStage {
    int n_layers;
    int *layers;      /* profile layer indices (owned copy) */
    int replicas;
    int *ranks;       /* replicas entries (owned copy) */
    int warmup;       /* forwards a replica admits before its first backward (1F1B kinds) */
} SchedStage;

typedef struct SchedWorker {
    int stage;        /* -1: idle rank (no instructions); several chunks: its first stage (= stages[0]) */
    int replica;      /* index among the stage's ranks */
    int n_chunks;     /* stages this worker runs: 1 (0 for idle ranks) except interleaved and the V kinds (2) */
    int *stages;      /* n_chunks global stage indices, ascending (owned); NULL for idle ranks */
    int n;            /* instructions */
    int cap;
    Instr *ins;
} SchedWorker;

typedef struct Schedule {
    SchedKind kind;
    int n_minibatches;    /* optimizer-step minibatches (1f1b/dp/mp: = units) */
    int n_micro;          /* units per minibatch (1 unless gpipe, 1f1b-flush, 2bw) */
    int n_units;          /* n_minibatches * n_micro */
    int vertical_sync;
    int recompute;        /* backwards are preceded by OP_RECOMPUTE; only stage inputs are kept */
    int n_chunks;         /* stages per worker: 1 except interleaved (V) */
    int n_stages;
    SchedStage *stages;
    int n_ranks;          /* workers are ranks 0..n_ranks-1 (max plan rank + 1) */
    SchedWorker *workers; /* n_ranks entries */
} Schedule;

typedef struct SchedOpts {
    SchedKind kind;
    int n_minibatches;   /* >= 1 */
    int n_micro;         /* >= 1; must be 1 for dp, model-parallel, asp and 1f1b with vertical sync */
    int vertical_sync;   /* 1f1b only */
    int recompute;       /* keep only each unit's stage input between its forward and backward,
                          * recompute the forward (OP_RECOMPUTE) before it (kinds that cannot refuse) */
    int inflight;        /* 1f1b only: the units stage 0 (each of its replicas) admits before its first
                          * backward, its in-flight depth D; of S stages, stage i admits
                          * 1 + ceil((D - 1) (S - 1 - i) / (S - 1)), the same number more per boundary
                          * after it, or its NOAM share if that is more. 0, or no more than NOAM: NOAM.
                          * A deeper pipeline hides a link's latency (sched_inflight_hides) */
} SchedOpts;

/* Builds the schedule of o->kind for plan p into *out, which the caller releases with
 * sched_release. p is borrowed (its stages and ranks are copied). Fails with PD_EINVAL
 * and a message (out zeroed) when options do not apply to the kind, the plan is
 * malformed (ranks missing or repeated), or the kind cannot honour its weight-version
 * rule for this plan (2bw with too few micro-batches, vertical sync out of reach). */
int  sched_build(const Plan *p, const SchedOpts *o, Schedule *out, Err *err);
void sched_release(Schedule *s);   /* zeroed is fine */

/* 1 for the kinds that split each minibatch (optimizer step) into n_micro units, each unit's
 * loss scaled by 1/n_micro, replicas summing their share: gpipe, 1f1b-flush, 2bw, zb-h1, zb-h2
 * and interleaved. 1f1b, dp, model-parallel and asp run one unit per minibatch. */
static inline int sched_kind_microbatched(SchedKind k) {
    return k == SCHED_GPIPE || k == SCHED_1F1B_FLUSH || k == SCHED_2BW || k == SCHED_ZB_H1 || k == SCHED_ZB_H2 ||
           k == SCHED_INTERLEAVED || k == SCHED_ZB_V || k == SCHED_V_HALF || k == SCHED_V_MIN || k == SCHED_DUALPIPE_V;
}
/* 1 for the V-shaped kinds (zb-v, v-half, v-min, dualpipe-v): two stages per worker in the V placement. */
static inline int sched_kind_v(SchedKind k) {
    return k == SCHED_ZB_V || k == SCHED_V_HALF || k == SCHED_V_MIN || k == SCHED_DUALPIPE_V;
}
/* 1 for the kinds that accept n_micro > 1: the micro-batched kinds and 1f1b, which with M
 * micro-batches per minibatch steps once per minibatch (local accumulation) instead of after
 * every unit; the replicas of a stage then share the minibatch's micro-batches. */
static inline int sched_kind_takes_micro(SchedKind k) { return sched_kind_microbatched(k) || k == SCHED_1F1B; }
/* 1 when kind k with n_micro units per minibatch steps once per minibatch of units that share
 * it (replicas sum their already 1/n_micro-scaled gradients): the micro-batched kinds, and
 * 1f1b with n_micro > 1. 0: a step per unit (replicas average their minibatches). */
static inline int sched_splits_minibatch(SchedKind k, int n_micro) {
    return sched_kind_microbatched(k) || n_micro > 1;
}
/* Chunks (stages per worker) an interleaved plan may have: 2..SCHED_MAX_CHUNKS. The one limit
 * of `plan --chunks`/`--max-chunks`, `simulate --chunks`, `train --chunks` and launch, so that
 * a plan written is a plan train runs (train's per-chunk tables hold RT_MAX_CHUNKS). */
#define SCHED_MAX_CHUNKS 8
static inline int sched_chunks_ok(int chunks) { return chunks >= 2 && chunks <= SCHED_MAX_CHUNKS; }
/* Micro-batches per minibatch of asynchronous 1f1b when none are given on two or more workers:
 * a step per minibatch of 4 units, so a unit's gradient crosses at most one update (one unit
 * per minibatch, PipeDream's original, makes stage 0's cross p - 1 and trains worse; it stays
 * available as --microbatches 1). */
#define SCHED_1F1B_DEFAULT_MICRO 4
/* Micro-batches per minibatch when none are given: one per worker of the plan for a
 * micro-batched kind (so interleaved, which needs a multiple of the workers, always runs; two
 * for dualpipe-v, which needs them),
 * SCHED_1F1B_DEFAULT_MICRO for 1f1b on two or more workers, 1 for the others. The default of
 * `train`, `simulate`, `launch` and the planner alike. */
static inline int sched_default_micro(SchedKind k, int n_workers) {
    if (n_workers <= 1) return 1;
    if (k == SCHED_DUALPIPE_V) return 2 * n_workers;   /* it needs 2 per worker */
    if (sched_kind_microbatched(k)) return n_workers;
    return k == SCHED_1F1B ? SCHED_1F1B_DEFAULT_MICRO : 1;
}
/* The default for a minibatch of `minibatch` samples: sched_default_micro, 1f1b's lowered to
 * the largest count that divides the minibatch (the micro-batched kinds keep theirs, and a
 * minibatch they do not divide is the caller's error to report). */
static inline int sched_default_micro_for(SchedKind k, int n_workers, int minibatch) {
    int m = sched_default_micro(k, n_workers);
    if (k == SCHED_1F1B)
        while (m > 1 && minibatch % m) m--;
    return m;
}

/* The in-flight depth that hides a link's latency in asynchronous 1f1b on a straight chain of P
 * stages whose units each take t_s of compute (forward and backward) at every stage, with a
 * latency of lat_s per message. Stage i's backward of a unit and its next forward wait on what
 * the stages after it do: for stages i < j, the units stage i holds beyond stage j's must cover
 * the j - i + 1 stages' compute of a unit and the j - i round trips between them,
 * (w_i - w_j + 1) t >= (j - i + 1) t + 2 (j - i) lat. So each boundary needs
 * h = ceil(1 + 2 lat / t) more units in flight before it, and stage 0, of P - 1 boundaries,
 * D = 1 + (P - 1) h (SchedOpts.inflight; lat 0: P, NOAM). With h per boundary a unit takes the
 * most over spans d = j - i of ((d + 1) t + 2 d lat) / (d h + 1), and t from this h on. */
static inline int sched_inflight_hides(int P, double t_s, double lat_s) {
    double x = 1 + 2 * lat_s / t_s;
    long h = (long)x;   /* the ceiling, a rounding error above an integer taken as exact */
    if (x - (double)h > 1e-9) h++;
    return 1 + (P - 1) * (int)h;
}

/* Interleaved (Megatron-LM's interleaved 1F1B): the worker at pipeline position r of P runs V
 * chunks (chunk c = stage r + c P) and, per minibatch, m micro-batches of its own (a multiple
 * of P), m V forwards and as many backwards. The i-th forward is for chunk
 * sched_interleaved_chunk(i, P, V, 1), the i-th backward for chunk (..., 0), counted down from
 * the last, both for own micro-batch sched_interleaved_micro(i, P, V); the worker runs
 * sched_interleaved_warmup(P, V, r, m) forwards before its first backward (all of them when
 * m = P). */
static inline int sched_interleaved_chunk(int i, int P, int V, int forward) {
    int c = (i % (P * V)) / P;
    return forward ? c : V - 1 - c;
}
static inline int sched_interleaved_micro(int i, int P, int V) { return (i / (P * V)) * P + i % P; }
static inline int sched_interleaved_warmup(int P, int V, int r, int m) {
    int total = m * V, warm = m == P ? total : 2 * (P - r - 1) + (V - 1) * P;
    return warm < total ? warm : total;
}

/* The V placement (plan_v_rank): of 2 P stages, the worker at pipeline position i holds stage i as
 * its chunk 0 (on the way down) and stage 2 P - 1 - i as its chunk 1 (on the way back up). */
static inline int sched_v_chunk(int stage, int P) { return stage < P ? 0 : 1; }
static inline int sched_v_stage(int position, int chunk, int P) { return chunk ? 2 * P - 1 - position : position; }

/* "1f1b", "gpipe", "1f1b-flush", "2bw", "dp", "model-parallel" (also "mp"), "asp", "zb-h1",
 * "zb-h2", "interleaved", "zb-v", "v-half", "v-min", "dualpipe-v". */
const char *sched_kind_name(SchedKind k);
int         sched_kind_parse(const char *name, SchedKind *out);   /* PD_OK or PD_EINVAL */
const char *sched_op_name(InstrOp op);   /* "F", "B", "SA", "RA", "SG", "RG", "AR", "STEP", "FLUSH", "BI", "BW", "R" */

/* Short text of one instruction: "F3" "B3" "SA3>2" "RA3<1" "SG3>0" "RG3<2" "AR(s1)" "U1"
 * (step writing version 1) "FLUSH" "BI3" "BW3" "R3"; with versions, F/B/BI/BW/R get "@v"
 * ("F3@1"). In a schedule with several chunks per worker, instructions of chunk c > 0 get
 * ".c" after the unit ("F3.1", "SA3.1>2", "F3.1@0"). Returns buf. */
char *sched_instr_str(const Instr *in, int with_version, char *buf, size_t n);
/* Writes one line per worker: "w<rank> s<stage>: F0 F1 B0 ..." ("s0,4" for several chunks).
 * compute_only: only compute (F, B, BI, BW, R: the human view, e.g. "F0 F1 F2 B0 F3 B1");
 * else every instruction. */
void sched_dump(const Schedule *s, FILE *f, int compute_only, int with_versions);
/* The compute-only line of one worker into buf (truncated to n); returns buf. */
char *sched_worker_str(const Schedule *s, int rank, char *buf, size_t n);

/* 1 for the ops that compute (F, B, BI, BW, R), and the stage an instruction of worker w
 * is for (w->stages[in->chunk]; w->stage when the worker has no stage list). */
static inline int sched_op_computes(int op) {
    return op == OP_FORWARD || op == OP_BACKWARD || op == OP_BACKWARD_B || op == OP_BACKWARD_W || op == OP_RECOMPUTE;
}
static inline int sched_instr_stage(const SchedWorker *w, const Instr *in) {
    return w->stages && in->chunk > 0 && in->chunk < w->n_chunks ? w->stages[in->chunk] : w->stage;
}

/* 1 for the kinds whose backwards are split into BI and BW (the zb and V-shaped kinds). */
static inline int sched_splits_backward(const Schedule *s) {
    return s->kind == SCHED_ZB_H1 || s->kind == SCHED_ZB_H2 || sched_kind_v(s->kind);
}
/* 1 if instruction i of w is a BI whose BW (same unit and chunk) is the next instruction: the
 * runtime runs the pair as one whole backward, and the simulator charges it so. */
static inline int sched_bw_follows(const SchedWorker *w, int i) {
    const Instr *a = &w->ins[i], *b = i + 1 < w->n ? a + 1 : NULL;
    return a->op == OP_BACKWARD_B && b && b->op == OP_BACKWARD_W && b->mb == a->mb && b->chunk == a->chunk;
}

/* The replica of stage st that runs unit u: round-robin, u mod replicas (replica 0 for
 * model-parallel); sched_rank_of: that replica's rank. */
int sched_replica_of(const Schedule *s, int st, int u);
int sched_rank_of(const Schedule *s, int st, int u);

/* ---- analysis: what a worker's list implies for memory --------------------------------- */
/* The ONE definition of weight-version liveness, units in flight and activation slots; the
 * runtime allocates by it and the simulator predicts memory by it (docs/explanation/schedules.md,
 * "Schedule analysis"). Instruction indices are into the worker's list. */

/* Activation slots beyond the units in flight: see SchedWorkerInfo.n_slots. */
enum { SCHED_SLOTS_AHEAD = 2 };

typedef struct SchedWorkerInfo {
    int stage;                /* the worker's stage; -1: idle rank (everything below 0 / NULL) */
    int reads_input;          /* runs stage 0: reads the training data itself (no activation receives) */
    int n_versions;           /* weight versions it ever has: the steps in its list + 1 (version 0) */
    int *last_read;           /* n_versions entries (malloc'd): the index of the last forward or backward
                               * reading version v, -1 if none reads it */
    /* Version v is alive from its step (version 0: from the start) to the step writing v + 1
     * (exclusive), and beyond that through last_read[v] if a later instruction still reads it
     * (a stash). So a step updates in place unless the old newest is read later. */
    int max_versions_alive;   /* the most versions alive at one instruction (1 for an empty list) */
    int peak_at;              /* the first instruction with that many alive; -1 for an empty list */
    int max_inflight;         /* the most units between their forward and their last backward op (B, or BW
                               * for split backwards), both included; with several chunks, (unit, chunk) pairs */
    int n_slots;              /* activation slots a runtime allocates: max_inflight + SCHED_SLOTS_AHEAD */
    /* Added with recomputation and chunks: */
    int n_chunks;             /* the worker's stages (1 unless interleaved) */
    int max_full;             /* the most units holding every activation of their stage at once. Without
                               * recompute = max_inflight. With recompute a unit holds only its stage input
                               * from its forward to its OP_RECOMPUTE (its forward builds the activations
                               * and drops them: counted during the forward), and everything from the
                               * recompute to its last backward op; a unit whose backward is the next
                               * compute after its forward (no recompute emitted) keeps them throughout.
                               * A recomputing runtime allocates n_slots slots of inputs, gradients and
                               * labels, and max_full activation contexts */
    /* Added with staleness compensation (docs/explanation/staleness.md): */
    int *delay;               /* n entries (malloc'd): for a compute instruction (F, B, BI, BW, R), its unit's
                               * delay: the updates that land on its stage between the version the unit
                               * reads and the step that applies the unit's own gradient (the first step
                               * after its last backward op, B or BW): that step's version - 1 - the
                               * version read; 0 when no step follows. -1 for other instructions */
    int n_units;              /* forwards in the list (units, or (unit, chunk) pairs) */
    double delay_mean;        /* the mean and most of delay[] over the forwards (0 without any) */
    int delay_max;
    int max_predicted;        /* the most distinct (version, delay > 0) pairs of one chunk held by its units
                               * in flight (from the forward to the last backward op) at once: the weight
                               * buffers a runtime that predicts each unit's weights (its forward and
                               * backward read version v advanced by delay d) holds besides the versions */
} SchedWorkerInfo;

typedef struct SchedAnalysis {
    int n_ranks, n_stages;
    SchedWorkerInfo *workers;   /* n_ranks entries */
    int *stage_versions;        /* n_stages: the most max_versions_alive over the stage's replicas */
} SchedAnalysis;

/* Analyses every worker of s into *out (released with sched_analysis_release; zeroed on
 * failure). Fails with PD_EINVAL and a message naming the worker and the instruction when
 * a step does not write the version after the newest, or a forward/backward reads a version
 * the worker does not have (negative, or not written yet). O(instructions). */
int  sched_analyze(const Schedule *s, SchedAnalysis *out, Err *err);
void sched_analysis_release(SchedAnalysis *a);   /* zeroed is fine */
/* The same for one rank (what a runtime worker needs for itself). */
int  sched_analyze_worker(const Schedule *s, int rank, SchedWorkerInfo *out, Err *err);
void sched_worker_info_release(SchedWorkerInfo *wi);   /* zeroed is fine */
/* Per instruction i of rank's list (wi from sched_analyze[_worker] of the same schedule):
 * alive[i] = weight versions alive during instruction i, inflight[i] = units in flight
 * during it (a forward counts its unit, a backward still does). Either array may be NULL;
 * their maxima are wi->max_versions_alive and wi->max_inflight. Nothing for idle ranks. */
void sched_worker_counts(const Schedule *s, int rank, const SchedWorkerInfo *wi, int *alive, int *inflight);
/* The same per chunk: inflight and full (either may be NULL) get n x wi->n_chunks entries,
 * [i * n_chunks + c] = units of chunk c in flight / holding full activations during instruction
 * i (max_full's rule); alive as above. The simulator's memory weighs them by each chunk's bytes. */
void sched_worker_counts_chunks(const Schedule *s, int rank, const SchedWorkerInfo *wi, int *alive, int *inflight,
                                int *full);

#endif
