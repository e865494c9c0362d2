/* plan.h: clusters, plans and the partitioner (PipeDream's dynamic program). A plan says
 * which layers each stage runs, how many replicas each stage has and which ranks run
 * them. Plans are JSON files; see docs/reference/formats.md. Runs nothing; see schedule.h. */
#ifndef PD_PLAN_H
#define PD_PLAN_H

#include <stdint.h>

#include "core.h"
#include "profile.h"

#define PD_MAX_LEVELS 8

/* Levels innermost first: level 0 groups level[0].workers workers (e.g. GPUs of a
 * server) joined at level[0].bandwidth; level 1 groups level[1].workers such groups... */
typedef struct ClusterLevel {
    int workers;
    double bandwidth;   /* bytes/s, > 0 */
    double latency;     /* seconds per message, >= 0 */
} ClusterLevel;

struct cJSON;

/* Workers that may differ from the rest (Cluster.host): their compute speed and link rate. */
#define PD_MAX_HOSTS 64

typedef struct ClusterHost {
    double speed;       /* compute speed relative to the profile's machine (0 or 1: as profiled) */
    double bandwidth;   /* bytes/s of the worker's own link, each direction (0: only the level's) */
    double latency;     /* with has_latency: seconds a message INTO this worker takes after its last
                         * byte leaves, in place of the level's (the delay on a host's ingress,
                         * tools/cluster.sh --host-delay) */
    int has_latency;
} ClusterHost;

typedef struct Cluster {
    int n_levels;
    ClusterLevel level[PD_MAX_LEVELS];
    double memory_per_worker;   /* bytes; 0 = unlimited */
    int cores_per_machine;      /* cores of one machine (a level-0 group of workers); 0 = a core per
                                 * worker. The simulator slows the compute of the workers a machine
                                 * runs by max(1, k / cores), k the workers on it weighted by their
                                 * compute (cluster_compute_slowdown) */
    double net_cpu_per_byte;    /* seconds of CPU a byte moved between workers costs the cores of
                                 * its machines (both ends together: half on the sender's machine,
                                 * half on the receiver's), counted with the compute when workers
                                 * share cores (cores_per_machine); 0 = the network costs no CPU.
                                 * Hosts emulated on one machine (tools/cluster.sh) pay their
                                 * network stack on the cores they compute on */
    /* Each core's speed, relative to one core computing alone, while every core of the machine
     * computes (caches and memory shared; with more workers than cores, also the kernel's time
     * slicing between them): 0 or 1: as alone. bench/core_efficiency.sh measures it. The
     * simulator scales the shares of a machine's cores by it (cluster_core_efficiency). */
    double core_efficiency;
    /* Seconds a worker loses each time it resumes from a wait: a receive whose message had not
     * arrived when the worker reached it, or an all-reduce it waited in. Where ranks share
     * cores, the waking rank polls (comm_mpi.c's naps) and then waits for a core held by a
     * computing rank; a schedule that blocks and wakes often (1f1b-flush, micro-batches) pays
     * it often. 0: nothing. `train --calibrated-cluster` fits it to a run; only the simulator
     * uses it (the planner's DP does not). */
    double wake_s;
    /* A heterogeneous cluster: host[r] describes worker r (r < n_hosts); the others, and every
     * worker when n_hosts is 0, are as the levels say. A message from a to b moves at the
     * least of the level's bandwidth and a's and b's own (cluster_link_bandwidth); a worker's
     * compute takes the profile's time / speed (cluster_worker_speed). */
    int n_hosts;
    ClusterHost host[PD_MAX_HOSTS];
} Cluster;

/* The rate a message from worker a to worker b moves at: the joining level's bandwidth, capped
 * by either worker's own link. a == b: the level 0 bandwidth (not used for transfers). */
double cluster_link_bandwidth(const Cluster *cl, int a, int b);
/* The latency of a message from worker a to worker b: b's own (Cluster.host) when it has one,
 * else the joining level's. */
double cluster_link_latency(const Cluster *cl, int a, int b);
/* Worker r's own link rate (Cluster.host), bytes/s; infinite when it has none. */
double cluster_own_bandwidth(const Cluster *cl, int r);
/* Multiplies every bandwidth of the cluster, its levels' and its hosts' own links, by f > 0. */
void cluster_scale_bandwidth(Cluster *cl, double f);
/* The speed of each of a machine's cores, relative to one computing alone, while n of its workers
 * compute: 1 for one, core_efficiency (E) once every core is busy (n >= cores), in
 * between in proportion, 1 - (1 - E) (n - 1) / (cores - 1); 1 without cores_per_machine or E. */
double cluster_core_efficiency(const Cluster *cl, double n);
/* Worker r's compute speed relative to the profile (1 unless host[r].speed says otherwise). */
double cluster_worker_speed(const Cluster *cl, int r);
/* 1 if some worker differs from the levels' description. */
int    cluster_heterogeneous(const Cluster *cl);
/* Adds cl's keys (levels, memory_per_worker, cores_per_machine, net_cpu_per_byte, core_efficiency,
 * hosts) to the JSON object o. */
void   cluster_to_json(const Cluster *cl, struct cJSON *o);

/* The factor by which the compute of rank r slows when the ranks of its machine share its
 * cores: max(1, k / cores / core_efficiency) (1 when k <= cores), k the sum of their load over the machine (1 without
 * cores_per_machine). load[q] in [0, 1]: the part of the time the machine's busiest worker
 * computes that rank q computes too (0: idle), i.e. how many workers contend on average;
 * NULL: every rank below n_ranks computes all the time. */
double cluster_compute_slowdown(const Cluster *cl, int r, const double *load, int n_ranks);

/* Reads a cluster JSON file (docs/reference/formats.md). On error returns non-zero with err naming
 * the file and key; *out is zeroed. */
int cluster_load(const char *path, Cluster *out, Err *err);
int cluster_from_json(const struct cJSON *o, const char *ctx, Cluster *out, Err *err);
/* Checks 1..PD_MAX_LEVELS levels, workers >= 1, bandwidth > 0, latency >= 0, memory >= 0. */
int cluster_check(const Cluster *cl, Err *err);
int cluster_total_workers(const Cluster *cl);
/* The level whose link joins ranks a and b (ranks numbered innermost-first): the
 * outermost level at which their groups differ; -1 if a == b. */
int cluster_link_level(const Cluster *cl, int a, int b);

typedef enum CostModel { COST_OURS, COST_PIPEDREAM, COST_COUNT } CostModel;

typedef struct PlanOpts {
    CostModel cost_model;
    int straight;                  /* no replication */
    int allow_idle;                /* authors' --use_fewer_machines */
    double memory_limit;           /* bytes; 0 = no memory constraint */
    double activation_compression; /* authors' ratio; 0 = unset (compat: transfers ignored) */
    /* Added after the first contract (zero = the default): */
    int overlap_allreduce;         /* ours: stage time max(compute, all-reduce) instead of the sum */
    int no_pruning;                /* testing: the compat DP's plain inner loops, no bounds */
    long max_states;               /* limit on cut states (0 = 4,000,000) */
    int chunks;                    /* ours: V >= 2 writes an interleaved plan of V x P stages with d
                                    * replicas each on P = workers / d positions, the d predicted
                                    * fastest (straight: 1), replica j of stage i on rank
                                    * (i mod P) d + j (plan_chunks.c); 0/1: plain */
    int pipelines;                 /* with chunks >= 2: d, the data-parallel pipelines, given (>= 1,
                                    * dividing the workers into 2 or more positions); 0: the
                                    * planner's choice */
    int v_shape;                   /* with chunks = 2: the V placement (plan_v_rank) instead of round-robin */
    /* ours: the bytes per worker a stage needs under memory_limit, instead of the 1F1B stash rule
     * (the schedule search's per-kind estimates); NULL: plan_ours_stash. in_bytes: what crosses
     * the cut before the stage (0 for the first). A plan made with it is not re-checked by
     * plan_check_memory, and the pointer is not kept in the plan. */
    double (*stage_memory)(const void *ctx, int workers_from_here, int replicas, double act, double par,
                           double in_bytes);
    const void *stage_memory_ctx;
} PlanOpts;

typedef struct PlanStage {
    int n_layers;
    int *layers;        /* profile layer indices, ascending */
    int replicas;
    int *ranks;         /* replicas entries */
    double compute_s;   /* fwd+bwd of one minibatch on one replica */
    double time_s;      /* predicted time per minibatch for the stage (with replication/comm) */
} PlanStage;

typedef struct Plan {
    char model[64];
    int n_layers;            /* of the profile */
    int n_stages;
    PlanStage *stages;
    int n_workers;           /* workers used (sum of replicas) */
    int noam;                /* ceil(n_workers / stages[0].replicas) */
    double pipeline_s;       /* predicted time per minibatch of the pipeline */
    double single_s;         /* one worker */
    double dp_s;             /* data parallel on the same cluster */
    PlanOpts opts;
    Cluster cluster;
    uint32_t profile_checksum;
    /* Added: the profile's edges (NULL/0 for a chain), so plan_validate can check that
     * DAG stages are contiguous (no edge goes to an earlier stage). */
    int n_edges;
    int (*edges)[2];
    /* Added: stages per worker. 0 or 1: every rank runs one stage. V >= 2 (`pipedream plan
     * --chunks V`): V x P stages with the same d replicas each, n_workers = P d, replica j of
     * stage i on rank (i mod P) d + j, for --schedule interleaved only. */
    int chunks;
    /* Added with the V-shaped schedules: 1 when the chunks = 2 stages per worker are placed in a V
     * (plan_v_rank; `pipedream plan --v-shape`, JSON "placement": "v"), for zb-v, v-half, v-min and
     * dualpipe-v; 0: round-robin (interleaved). */
    int v_shape;
    /* The schedule a search chose for the plan (`plan --choose-schedule`; JSON "schedule"):
     * kind name ("" = none), micro-batches per minibatch, recomputation. */
    char schedule[24];
    int schedule_micro, schedule_recompute;
    /* 1f1b's in-flight depth (SchedOpts.inflight; JSON "schedule": "inflight", absent when 0): the
     * depth `plan` chose to hide the links' latency; 0: NOAM. */
    int schedule_inflight;
    /* The simulator's figure for the plan (`plan` scores its candidates with it; JSON
     * "predicted.simulated"): the time per minibatch (one profile minibatch) and samples/s
     * under sim_schedule with sim_micro micro-batches per step; sim_s 0 = not simulated. */
    double sim_s, sim_samples_per_s;
    char sim_schedule[24];
    int sim_micro;
    /* The codecs of the boundaries' messages (`plan --wire`; JSON "wire": per boundary b, between
     * stages b and b + 1, {"act": NAME, "grad": NAME}): NULL = none chosen; else 2 (n_stages - 1)
     * codes, numbered as train's RT_WIRE_* (plan_wire_name), activations at [2 b], gradients at
     * [2 b + 1]. */
    int *wire;
} Plan;

/* The wire codecs' names, numbered as the runtime's RT_WIRE_*: "fp32", "bf16", "int8", "int4",
 * "delta" (PLAN_WIRE_COUNT of them) and back (-1: unknown). */
enum { PLAN_WIRE_COUNT = 5 };
const char *plan_wire_name(int wire);
int plan_wire_parse(const char *name);

/* Partitions prof over cl. Returns a plan the caller owns (plan_free), or NULL with err. */
Plan *plan_new(const Profile *prof, const Cluster *cl, const PlanOpts *o, Err *err);
/* The plan of one worker: one stage of all n_layers layers, one replica on rank 0, a cluster of
 * that one worker (the plan of one-worker training). Caller frees (plan_free). */
Plan *plan_single(const char *model, int n_layers);
void  plan_free(Plan *p);    /* NULL is fine */
/* Checks every layer in exactly one stage, contiguous stages (for a chain: consecutive
 * index ranges in order; with edges: no edge into an earlier stage), replicas >= 1
 * summing to n_workers, ranks distinct and below n_workers, noam. Fails with a message
 * naming the problem. */
int   plan_validate(const Plan *p, int n_layers, Err *err);
/* With p->opts.memory_limit > 0: fails naming the first stage whose predicted bytes per
 * worker (plan_stage_memory) exceed it. The compat model's hierarchical memory check
 * lives inside its DP only, so for COST_PIPEDREAM with several levels or allow_idle this
 * passes. */
int   plan_check_memory(const Plan *p, const Profile *prof, Err *err);
/* Predicted bytes per worker of stage s: k * (activations + parameters of the stage),
 * k = stashed minibatches: ours ceil(workers from s to the end / replicas), the authors'
 * ceil(workers after s / replicas) (docs/explanation/planner.md). */
double plan_stage_memory(const Plan *p, const Profile *prof, int s);
/* Writes the human-readable table `pipedream plan` prints. */
void  plan_print(const Plan *p, FILE *f);
const char *plan_cost_model_name(CostModel m);
/* COST_COUNT if name is not "ours" or "pipedream". */
CostModel plan_cost_model_parse(const char *name);
int   plan_save(const Plan *p, const char *path, Err *err);
Plan *plan_load(const char *path, Err *err);
/* The largest plan file plan_load reads. */
#define PLAN_MAX_BYTES ((size_t)64 << 20)
/* A plan from the text of a plan file (NUL-terminated); path names it in error messages. */
Plan *plan_parse(const char *text, const char *path, Err *err);
/* The stage a rank runs, or -1; *replica receives its index among the stage's ranks. In an
 * interleaved plan (chunks >= 2): its first stage. */
int   plan_stage_of_rank(const Plan *p, int rank, int *replica);
/* Interleaved placement: on W pipeline positions of d replicas each, stage s runs at position
 * s mod W, its replica j on rank (s mod W) d + j. */
static inline int plan_interleaved_rank(int s, int W, int d, int j) { return (s % W) * d + j; }
/* V placement (the V-shaped schedules): 2 W stages on W pipeline positions, stage s at position s
 * on the way down (s < W) and 2 W - 1 - s on the way back up, so position i holds stages i and
 * 2 W - 1 - i and the last stage's output lands where the first stage is; replica j on rank
 * position d + j. */
static inline int plan_v_position(int s, int W) { return s < W ? s : 2 * W - 1 - s; }
static inline int plan_v_rank(int s, int W, int d, int j) { return plan_v_position(s, W) * d + j; }
/* The rank of replica j of stage s in a plan of several stages per worker: V or round-robin. */
static inline int plan_chunk_rank(int v_shape, int s, int W, int d, int j) {
    return v_shape ? plan_v_rank(s, W, d, j) : plan_interleaved_rank(s, W, d, j);
}
/* Turns a plan of S stages with d replicas each into an interleaved one of V chunks on W = S / V
 * pipeline positions: replica j of stage i on rank (i mod W) d + j (d = 1: rank i mod W),
 * n_workers W d, chunks V, pipeline_s the largest per-position sum of stage times. Replica j of
 * every stage is one whole pipeline (data parallelism over d pipelines). Fails (p unchanged)
 * unless V >= 2 divides S, S / V >= 2 and every stage has the same replicas. */
int   plan_interleave(Plan *p, int V, Err *err);
/* The same for the V placement: a plan of S = 2 W stages with d replicas each onto W positions,
 * replica j of stage i on rank plan_v_rank(i, W, d, j), chunks 2, v_shape 1. Fails (p unchanged)
 * unless S is even, S / 2 >= 2 and every stage has the same replicas. */
int   plan_place_v(Plan *p, Err *err);
/* Every plan of prof over all of cl's workers by our model's placement: each chain of cut
 * states (the partitioner's) with replicas summing to the workers (o->straight: one each),
 * or with o->chunks = V >= 2, for each d dividing the workers into P >= 2 positions (straight:
 * d = 1), each chain of V x P stages of d replicas round-robin; stage
 * times by our cost model (o's compression and overlap; no memory limit). *out gets a
 * malloc'd array of *n plans (free each with plan_free, then the array). Fails with PD_EINVAL
 * ("more than LIMIT plans", nothing returned) when there are more than limit. */
int   plan_enumerate(const Profile *prof, const Cluster *cl, const PlanOpts *o, int limit, Plan ***out, int *n, Err *err);

#endif
