/* search.h: the planner that chooses the schedule too (`pipedream plan --choose-schedule`,
 * docs/explanation/planner.md "Choosing the schedule"). Given a profile, a cluster and a per-worker
 * memory limit it searches partition x replication x kind x micro-batches x chunks x
 * recomputation for the plan with the shortest simulated time per unit (one profile
 * minibatch of samples) whose worst worker's simulated peak memory (SimMem.peak) fits, and
 * keeps what it needs to say why: the runner-up of another kind or recomputation setting,
 * the fastest candidate regardless of memory, and 1f1b on the partitioner's plan.
 *
 * Partitions: every plan (plan_enumerate) when the model is small enough (at most
 * SearchOpts.exhaustive plans of each shape), else the partitioner's (plan_new) without and
 * with the memory limit at several scales (its 1F1B stash rule is not the simulator's), with
 * and without replication, its interleaved plans for V = 2..max_chunks and its V-placed one. Every candidate
 * is scored by the simulator (sim_run) on the cluster. */
#ifndef PD_SEARCH_H
#define PD_SEARCH_H

#include <stdio.h>

#include "sim.h"

typedef struct SearchOpts {
    double memory_limit;       /* bytes per worker, against the worst worker's simulated peak; 0 = none */
    double opt_state_factor;   /* optimizer state in units of params: 0 or 1 SGD with momentum, 2 Adam */
    unsigned kinds;            /* bit k: consider SchedKind k; 0 = 1f1b, gpipe, 1f1b-flush, 2bw, dp, zb-h1,
                                * zb-h2, interleaved and the V kinds (zb-v, v-half, v-min, dualpipe-v) */
    int max_chunks;            /* interleaved: V = 2..max_chunks; 0 = 4; 1 = none */
    int n_micro;               /* micro-batch counts per minibatch for the kinds with micro-batches, as */
    int micro[8];              /* multiples of the workers; n_micro 0 = {1, 2, 4} */
    int recompute;             /* 0: with and without; 1: only without; 2: only with */
    int exhaustive;            /* enumerate every plan when there are at most this many of a shape; 0 =
                                * 2000; < 0: never (the partitioner's plans only) */
    PlanOpts plan;             /* for the partitions: activation_compression, overlap_allreduce, max_states */
} SearchOpts;

typedef struct SearchCand {
    const Plan *plan;          /* borrowed from SearchResult.parts; NULL: no candidate */
    SchedKind kind;
    int n_micro, recompute;
    int inflight;              /* 1f1b's in-flight depth (SchedOpts.inflight); 0: NOAM */
    double unit_s;             /* simulated steady-state time per unit */
    double minibatch_s;        /* per optimizer step (n_micro units) */
    double bubble;             /* SimResult.bubble_fraction */
    double peak_bytes;         /* the worst worker's SimMem.peak */
    double alloc_bytes;        /* the worst worker's SimMem.allocated */
    int fits;
    int part;                  /* index into SearchResult.parts */
} SearchCand;

typedef struct SearchResult {
    int found;                 /* some candidate fits */
    SearchCand best;           /* the fastest that fits (ties: less memory, then enumeration order) */
    SearchCand runner_up;      /* the fastest fitting candidate of another (kind, recompute); plan NULL: none */
    SearchCand fastest;        /* the fastest of all, fitting or not */
    SearchCand baseline;       /* 1f1b without recomputation on the partitioner's plan (no memory limit) */
    double memory_limit;
    int exhaustive;            /* the partitions were every plan */
    int n_parts, n_candidates, n_fit;
    Plan **parts;              /* owned */
    SearchCand *all;           /* every candidate scored, n_candidates entries (in search order) */
} SearchResult;

/* Runs the search. Fails with a message (out zeroed) on a bad profile or cluster; finding
 * nothing that fits is not a failure (found = 0, fastest and baseline say what it would need). */
int  plan_search(const Profile *prof, const Cluster *cl, const SearchOpts *o, SearchResult *out, Err *err);
void plan_search_release(SearchResult *r);
/* The choice, the runner-up, what the limit cost, and the baseline, in a few lines. */
void plan_search_print(const SearchResult *r, FILE *f);
/* Every candidate, one line each: partition, shape, kind, micro-batches, recomputation, time
 * per unit, peak memory, whether it fits, layers per stage. */
void plan_search_print_all(const SearchResult *r, FILE *f);
/* The in-flight depth of asynchronous 1f1b with n_micro micro-batches per minibatch on plan p: of
 * NOAM (inflight 0) and depths NOAM + 1, 2, 3, 4, 6, 8, ... 64, each simulated on cl as the search
 * scores (a link's latency stalls a pipeline with too few units in flight: sched_inflight_hides), the
 * smallest whose time per unit is within a fraction tol of the best, among those whose peak memory
 * fits memory_limit (0: none; NOAM is kept though it does not). Fills *out (inflight 0 when NOAM is
 * near enough). Fails only when the simulation does. */
int  plan_search_depth(const Plan *p, const Profile *prof, const Cluster *cl, int n_micro, double opt_state_factor,
                       double memory_limit, double tol, SearchCand *out, Err *err);
/* Same stages, layers and replicas (and chunks): the same partition. */
int  plan_same_partition(const Plan *a, const Plan *b);
/* A hash of what plan_same_partition compares: equal partitions hash alike, so a list of
 * thousands deduplicates by comparing hashes first. */
uint64_t plan_partition_hash(const Plan *p);
/* "4 stages (replicas 2+1+1)", "8 stages, 2 per worker" or "4 stages, 2 per worker, 2 pipelines" into buf. */
void plan_search_shape(const Plan *p, char *buf, size_t n);

/* What a simulated run's time per unit went to. */
typedef enum SearchBottleneck { WHY_COMPUTE, WHY_ALLREDUCE, WHY_LINK, WHY_BUBBLE } SearchBottleneck;
typedef struct SearchWhy {
    double unit_s;             /* simulated steady-state time per unit */
    int worker, stage;         /* the busiest worker (compute + all-reduce) and its stage */
    double compute_s;          /* its compute per unit of the pipeline (averaged over the run, core sharing included) */
    double slowdown;           /* the factor its compute was slowed by, sharing cores */
    double allreduce_s;        /* its all-reduces per unit */
    int ar_worker, ar_stage;   /* the worker with the longest all-reduces (-1: none) */
    double ar_s;               /* its all-reduces per unit */
    int link_worker, link_stage;   /* the worker with the busiest outgoing link (-1: no transfers) */
    double link_s;             /* that link's transfers per unit */
    double idle_s;             /* unit_s - max(compute + all-reduce, link): the bubble and waits */
    SearchBottleneck bottleneck;   /* the largest of compute_s, allreduce_s, link_s, idle_s */
} SearchWhy;
/* Simulates one candidate as plan_search_score does and says what its time went to. */
int  plan_search_why(const Plan *p, const Profile *prof, const Cluster *cl, SchedKind kind, int n_micro, int recompute,
                     double opt_state_factor, SearchWhy *out, Err *err);
/* Scores one candidate as the search does (the same simulation length and memory figure). */
int  plan_search_score(const Plan *p, const Profile *prof, const Cluster *cl, SchedKind kind, int n_micro, int recompute,
                       double opt_state_factor, SearchCand *out, Err *err);

#endif
