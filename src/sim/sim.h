/* sim.h: the discrete-event simulator. It executes a schedule's instruction lists
 * (schedule.h) against per-stage costs and a network model and reports time per
 * minibatch, throughput, per-worker busy fraction, bubble fraction, peak memory, weight
 * versions alive, and every instruction's start and end. It detects deadlock (a worker
 * waiting on a receive or all-reduce that can never complete) and names the workers and
 * instructions involved. It also draws timelines (SVG) and writes Chrome trace JSON from
 * a generic event list, so a measured runtime trace can be drawn the same way.
 *
 * Model (docs/explanation/schedules.md):
 *   - a worker runs its list in order; forward/backward of a unit take the stage's
 *     profile times (a replica computes a whole unit); a unit smaller than the profile's
 *     minibatch takes each time's fixed part plus the rest in proportion (sim_costs_scale);
 *     where a machine's workers share its cores (Cluster.cores_per_machine), the workers
 *     computing at once each run at min(1, cores / how many) of their speed (processor
 *     sharing), and each worker's compute carries its network stack's CPU
 *     (Cluster.net_cpu_per_byte: half of each message's on each end);
 *   - a send is asynchronous: the message is posted when the worker reaches it; messages
 *     between one ordered pair of workers go one after the other (one connection); each
 *     worker has one outgoing and one incoming link (full duplex), and the connections with a
 *     message under way share them max-min fairly, as TCP flows do: a connection from a to b
 *     moves at most at the bandwidth of the cluster level joining them (cluster_link_level),
 *     capped by a's and b's own links (Cluster.host), and a link's rate is divided equally
 *     among its connections except where one is held lower elsewhere. A message arrives the
 *     link's latency after its last byte leaves (cluster_link_latency: the receiver's own, else
 *     the level's; the latency does not hold the link); a receive blocks until it has arrived. So compute and communication overlap;
 *   - an all-reduce starts when the last replica arrives and takes the ring time
 *     2 (r-1) / r * bytes / bw + 2 (r-1) * latency, at the slowest level among the group;
 *     it blocks its workers. The runtime starts the ring on each gradient bucket as soon as
 *     the backward before the all-reduce has finished the bucket's layers
 *     (SimStageCost.n_buckets), so the part of the ring that fits in that backward (bucket by
 *     bucket, at the ring's rate, from the time the last replica has the bucket) is done when
 *     the last replica arrives; the rest then moves on the links, shared with the transfers in
 *     flight;
 *   - a step takes the stage's measured optimizer step (SimStageCost.step_s) plus SimOpts.step_s;
 *     a flush takes no time. */
#ifndef PD_SIM_H
#define PD_SIM_H

#include <stdio.h>

#include "core.h"
#include "plan.h"
#include "profile.h"
#include "schedule.h"

/* The runtime's default gradient bucket (RT_BUCKET_BYTES, runtime's rt_impl.h; test_runtime checks
 * they agree) and the most buckets a stage's costs list. */
#define SIM_BUCKET_BYTES ((double)(4 << 20))
enum { SIM_MAX_BUCKETS = 32 };

typedef struct SimStageCost {
    double fwd_s, bwd_s;    /* per unit on one replica (a recompute takes fwd_s) */
    double param_bytes;     /* weights of the stage (one version) */
    double in_bytes;        /* activation received from the previous stage per unit (= gradient sent back) */
    double stash_bytes;     /* activations kept per unit between its forward and backward (in_bytes included) */
    /* Added: the split backward of the zb kinds, input gradient (BI) and weight gradient (BW);
     * both 0: half of bwd_s each (sim_bwd_in, sim_bwd_w). */
    double bwd_in_s, bwd_w_s;
    /* Of stash_bytes: the gradient buffers a unit holds (the zb kinds' kept output gradients;
     * with our profiles (saved_measured) also w.r.t. the stage's output, and its input past
     * stage 0) and the stage's output (our profiles; 0 otherwise). A recomputing runtime keeps these per unit in flight besides the input;
     * the recomputed context is the rest (its own copy of the input included). */
    double grad_bytes, out_bytes;
    /* The stage's optimizer step, charged at each step instruction (the profile's step_s, which
     * bwd_s, bwd_in_s and bwd_w_s here exclude; 0 for profiles without it). Per step, not per
     * unit: sim_costs_scale leaves it. */
    double step_s;
    /* The kernels' per-thread scratch the stage's build asks for (our profiles' per-layer
     * scratch: per slot the stage's largest, summed over slots; 0 otherwise), and the part of
     * it that does not grow with the unit's batch (sim_costs_scale scales the rest). */
    double scratch_bytes, scratch_fixed_bytes;
    /* The parts of fwd_s, bwd_s, bwd_in_s and bwd_w_s that do not shrink with the unit's batch
     * (sim_costs_scale scales only the rest). A layer's time is taken as affine in the batch n,
     * through its two measurements (profile minibatch B: t_B; small_batch b: t_b):
     * t(n) = fixed + (t_B - fixed) n / B with fixed = t_b - (t_B - t_b) b / (B - b), clamped to
     * [0, t_B]; per stage the sum over its layers (the optimizer step taken out of both backward
     * times first). All 0 when the profile has no small-batch times: times then scale linearly. */
    double fwd_fixed_s, bwd_fixed_s, bwd_in_fixed_s, bwd_w_fixed_s;
    /* A replicated stage's gradient buckets, which the runtime all-reduces while the backward
     * before the all-reduce runs (rt_bucket.c, rt_buckets): from the stage's last layer down, a
     * bucket closes once it holds SIM_BUCKET_BYTES of parameters, the first layer closing the
     * last. In the order they become ready: bucket_bytes[b] its parameter bytes, bucket_ready[b]
     * the share of the stage's backward time done when it is (the backward times of its layers
     * and of every later one, over the stage's). Beyond SIM_MAX_BUCKETS the rest go into the
     * last. n_buckets 0: one all-reduce after the backward. */
    int n_buckets;
    double bucket_bytes[SIM_MAX_BUCKETS], bucket_ready[SIM_MAX_BUCKETS];
} SimStageCost;

static inline double sim_bwd_in(const SimStageCost *c) { return c->bwd_in_s + c->bwd_w_s > 0 ? c->bwd_in_s : c->bwd_s / 2; }
static inline double sim_bwd_w(const SimStageCost *c) { return c->bwd_in_s + c->bwd_w_s > 0 ? c->bwd_w_s : c->bwd_s / 2; }

typedef struct SimCosts {
    int n_stages;
    SimStageCost *stage;    /* owned when made by sim_costs_from_profile (sim_costs_release) */
} SimCosts;

/* Per-stage costs of schedule s from profile prof: sums of layer times (the split backward
 * from each layer's backward_input_s / backward_weight_s, or half of its backward each when
 * the profile has no split) and parameter bytes; in_bytes of stage i > 0 = bytes of every
 * layer before stage i with an edge into stage i or later (a chain: the previous stage's last layer), prof->input_bytes for
 * stage 0 (read locally, not transferred); stash_bytes = in_bytes + the stage's layer
 * outputs. Fails if a stage names a layer outside the profile. */
int  sim_costs_from_profile(const Schedule *s, const Profile *prof, SimCosts *out, Err *err);
/* The zb kinds (sched_splits_backward) also keep in stash_bytes, from BI to BW, the gradient
 * w.r.t. the output of each layer of the stage but its last that has a weight pass: measured
 * (backward_weight_s > 0), or, without the split in the profile, any layer with parameters
 * (as the times count half of its backward for BW). */
static inline int sim_layer_keeps_grad(const ProfileLayer *L) {
    return L->bwd_in_s + L->bwd_w_s > 0 ? L->bwd_w_s > 0 : L->param_bytes > 0;
}
void sim_costs_release(SimCosts *c);
/* Costs of units of f times the profile's minibatch (micro-batches: f = 1/M): of each compute
 * time (fwd_s, bwd_s, bwd_in_s, bwd_w_s) the part above its fixed part scaled by f,
 * t(f) = fixed + (t - fixed) f (no fixed part: t f; f = 1 leaves every time exactly as it is);
 * every per-unit byte count scaled by f, parameter bytes and step_s unchanged; of the scratch,
 * the part above scratch_fixed_bytes scaled by f. */
void sim_costs_scale(SimCosts *c, double f);

typedef struct SimOpts {
    const Cluster *cluster;     /* NULL or n_levels == 0: free communication */
    double opt_state_factor;    /* optimizer state in units of params (SGD+momentum 1, Adam 2) */
    double step_s;              /* time of one optimizer step (default 0) */
    int samples_per_unit;       /* for samples/s (profile minibatch); 0 = unknown */
    int predicts_weights;       /* the run predicts delayed units' weights (staleness prediction or
                                 * look-ahead): SchedWorkerInfo.max_predicted buffers of params more */
    double wire_factor;         /* bytes on the wire per byte of activation or gradient between stages:
                                 * 0 or 1 fp32, 0.5 bf16 (train --wire bf16); without wire_at */
    const int *wire_at;         /* NULL, or per boundary b (stages b, b + 1) the codec of its activations
                                 * at [2 b] and of its gradients at [2 b + 1], numbered as the runtime's
                                 * RT_WIRE_* (KCODEC_* and SIM_WIRE_DELTA): a message costs its encoded
                                 * bytes (sim_wire_bytes) and its encoding and decoding
                                 * (sim_wire_codec_s) at the sender and the receiver */
    int error_feedback;         /* with wire_at: gradients carry their error (more encoding time) */
} SimOpts;

/* The codecs' cost (sim_wire.c). SIM_WIRE_DELTA is RT_WIRE_DELTA: differences costed as int4
 * with groups of 64 (the steady state after the data's first epoch). sim_wire_bytes: bytes of a
 * message whose fp32 form has fp32_bytes (int8: a scale per 64 values, the runtime's shortest
 * row). sim_wire_codec_s: the seconds encoding (enc 1) or decoding (enc 0) it takes a core,
 * from constants measured once (sim_wire.c says how); bf16 and fp32: 0. */
enum { SIM_WIRE_DELTA = 4, SIM_WIRE_COUNT = 5 };
double sim_wire_bytes(int wire, double fp32_bytes);
double sim_wire_codec_s(int wire, int grad, int error_feedback, int enc, double fp32_bytes);
/* `plan --wire auto`: per boundary of s and direction, the first codec of `allow` (a bit per
 * codec; delta never for gradients) in the order fp32, bf16, int8, int4, delta (each costs more
 * compute and accuracy than the one before) under which the link carries a unit's message in
 * no more time than the slowest stage computes a unit (its forward and backward over its
 * replicas, with the codecs' time); if none does, the allowed one with the fewest bytes. Writes
 * 2 (n_stages - 1) codes into wire (SimOpts.wire_at). Fails when allow has no codec for a
 * direction. */
int sim_wire_auto(const Schedule *s, const SimCosts *c, const Cluster *cl, unsigned allow, int error_feedback, int *wire,
                  Err *err);

typedef struct SimMem {
    double params;        /* one version of the stage's weights (of all its chunks: interleaved) */
    double grads;         /* gradient buffer (one version) */
    double opt_state;
    double stashed;       /* extra weight versions at the peak (versions alive - 1) x params */
    double activations;   /* activations held at the peak: units in flight x stash_bytes; recomputing,
                           * units in flight x in_bytes + units with full activations x the rest */
    double peak;          /* the maximum over time of the sum */
    /* What a runtime that allocates every buffer up front for the whole run (ours) holds,
     * by the schedule analysis (schedule.h): the most versions alive, and n_slots units of
     * stash_bytes (the runtime's slot: its context, gradient and label buffers). */
    double alloc_stashed;       /* (max_versions_alive - 1) x params */
    double alloc_activations;   /* n_slots x stash_bytes (the largest chunk's); recomputing: n_slots x
                                 * (in + out + grad bytes) + max(max_full, 1) x (stash - grad bytes) */
    double alloc_predicted;     /* predicts_weights: max_predicted x params, else 0 */
    double scratch;             /* the kernels' scratch of the worker's thread: its stage's
                                 * scratch_bytes (several chunks: the largest; they share one arena) */
    double allocated;           /* params + grads + opt_state + alloc_stashed + alloc_activations
                                 * + alloc_predicted + scratch */
} SimMem;

typedef struct SimResult {
    int n_ranks;
    double makespan_s;
    double time_per_minibatch_s;   /* steady state, per optimizer-step minibatch */
    double time_per_unit_s;        /* = time_per_minibatch_s / n_micro */
    double minibatches_per_s;
    double samples_per_s;          /* 0 if samples_per_unit unknown */
    double bubble_fraction;        /* 1 - mean busy fraction of active workers */
    double *busy_fraction;         /* per rank: compute time / makespan */
    double *slowdown;              /* per rank: its compute's time over the run against its profile
                                    * time (sharing its machine's cores, its network CPU, its host's
                                    * speed; 1: a core of its own) */
    SimMem *mem;                   /* per rank */
    int *max_inflight;             /* per rank: most units between forward and backward ((unit, chunk) pairs) */
    int *worker_versions;          /* per rank: most weight versions alive at once (0: idle) */
    int *slots;                    /* per rank: activation slots a runtime allocates (SchedWorkerInfo.n_slots) */
    int *versions_alive;           /* per stage: most weight versions alive at a replica */
    double **start, **end;         /* per rank, per instruction (see sim_run) */
    int n_messages;
    double *times_;                /* internal: storage of start and end */
    /* Added: */
    int *max_full;                 /* per rank: most units holding full activations (= max_inflight
                                    * unless the schedule recomputes; SchedWorkerInfo.max_full) */
    double *wire_bytes, *raw_bytes;   /* per boundary b (n_stages - 1 of them): the bytes sent across it,
                                       * activations at [2 b], gradients at [2 b + 1], as the codec
                                       * makes them and as fp32 */
} SimResult;

/* Runs schedule s with costs c. Fills *out (caller releases with sim_result_release).
 * start/end per instruction: compute: its run; send: the transfer on its link (posted to
 * arrival); receive: from reaching it to the data being there; all-reduce: from the last
 * replica's arrival to completion (the collective itself; a worker waiting for the others
 * before that is idle). Fails with PD_EINVAL and a message (out zeroed) on deadlock, naming every
 * blocked worker with its instruction and what it waits for, on a send nobody receives,
 * or if costs do not match the schedule. Cost: O(instructions), memory 16 bytes each. */
int  sim_run(const Schedule *s, const SimCosts *c, const SimOpts *o, SimResult *out, Err *err);
void sim_result_release(SimResult *r);

/* Writes the figures of r (and per-worker/per-stage arrays) as one JSON object. */
void sim_print_json(const Schedule *s, const SimResult *r, FILE *f);
/* A short human table. */
void sim_print_summary(const Schedule *s, const SimResult *r, FILE *f);

/* ---- timelines ------------------------------------------------------------------- */
/* TRACE_BWD is a whole backward or zb's input-gradient half (BI); TRACE_WGRAD zb's weight-gradient
 * half (BW); TRACE_RECOMPUTE a recomputed forward. */
typedef enum TraceKind {
    TRACE_FWD, TRACE_BWD, TRACE_SEND, TRACE_RECV_WAIT, TRACE_ALLREDUCE, TRACE_STEP, TRACE_WGRAD, TRACE_RECOMPUTE, TRACE_COUNT
} TraceKind;

/* One box on a timeline; generic so measured runtime traces draw the same way. */
typedef struct TraceEvent {
    int worker;       /* row */
    int kind;         /* TraceKind */
    int mb;           /* unit / minibatch number for the label and colour; -1 none */
    int peer;         /* send: destination; else -1 */
    double start, end;   /* seconds */
} TraceEvent;

/* The timeline kind of an instruction op (TRACE_SEND for both sends, ...), or -1 for ops
 * that draw nothing (flush). Shared by simulated and measured timelines. */
int sim_trace_kind(int op);

/* Events of a simulated run: every compute, send, blocking receive wait, all-reduce and
 * step with nonzero duration. Returns a malloc'd array (free()) and its length in *n. */
TraceEvent *sim_events(const Schedule *s, const SimResult *r, int *n);

typedef struct SvgOpts {
    const char *title;    /* NULL: none */
    int show_comm;        /* draw sends and all-reduces as thin bars under each row */
    int width;            /* pixels; 0 = from the number of boxes per row (900-3000) */
    const char *const *row_labels;   /* n_workers labels (borrowed), or NULL: "worker i" */
} SvgOpts;

/* Writes an SVG timeline: one row per worker, forward/backward boxes coloured by mb
 * (backward darker) and labelled with it when wide enough, idle time blank, a time axis
 * starting at the earliest event (times may be clock readings; labels are relative). A run
 * too long to read whole (over 160 boxes in a row) is drawn as sim_svg_fill_steady's windows
 * with a stretch of 30 units. Fails with PD_EIO naming path. */
int sim_svg_write(const char *path, const TraceEvent *ev, int n, int n_workers, const SvgOpts *o, Err *err);

/* Time windows [t0, t1] of a timeline, in the events' clock, drawn side by side at one scale
 * with a break between (boxes clipped at the edges), each under its label; n 0: the whole run. */
enum { SVG_MAX_WINDOWS = 4 };
typedef struct SvgWindows {
    int n;
    double t[SVG_MAX_WINDOWS][2];
    char label[SVG_MAX_WINDOWS][80];
} SvgWindows;
/* Sets *w to a readable part of a long run: the start (units 0 .. max(8, 3 n_workers) - 1: the
 * fill and the steady state that follows) and `stretch` units (e.g. 30: boxes stay wide enough
 * for their numbers) from the middle of the training units (those with a backward), each
 * window from the first start to the last end of
 * those units' compute boxes. A short run (fewer than 2 x fill + stretch units) keeps n = 0:
 * the whole run. Returns w->n. */
int sim_svg_fill_steady(const TraceEvent *ev, int n, int n_workers, int stretch, SvgWindows *w);
/* One timeline of a picture of several stacked ones (e.g. measured above simulated): its
 * events, rows, options (o.title heads the panel) and windows. */
typedef struct SvgPanel {
    const TraceEvent *ev;
    int n, n_workers;
    SvgOpts o;
    SvgWindows win;
} SvgPanel;
/* Writes the panels top to bottom, each panel's windows filling the width (each its own time
 * scale: its axis is labelled in seconds from its first event); width from p[0].o.width, else
 * ~18 px per box of the busiest row in the windows (900-3000); title (NULL: none) above all.
 * Fails with PD_EIO naming path. */
int sim_svg_write_panels(const char *path, const SvgPanel *p, int n_panels, const char *title, Err *err);
/* Writes Chrome trace-event JSON (chrome://tracing, Perfetto): one "X" event per box,
 * pid 0, tid = worker, microseconds. */
int sim_trace_write(const char *path, const TraceEvent *ev, int n, Err *err);

#endif
