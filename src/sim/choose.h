/* choose.h: the last word on `pipedream plan`'s plan (docs/explanation/planner.md "The
 * simulator disposes"). The partitioner's dynamic program proposes; candidates cheap to get
 * besides its plan (the straight split, data parallelism, its plan under other options, every
 * plan, or every straight plan, when there are few enough) are each run by the simulator under the schedule the plan
 * will run, on the cluster (core sharing included; on a heterogeneous cluster, the best few
 * also on every placement of their stages on the workers), and the fastest whose simulated
 * peak memory fits the limit is written. Scores with plan_search_score (search.h). */
#ifndef PD_CHOOSE_H
#define PD_CHOOSE_H

#include <stdio.h>

#include "search.h"

/* Heterogeneous clusters (cluster_heterogeneous): the best candidates are also tried on every
 * other placement of their ranks, up to CHOOSE_PLACE_WORKERS workers and CHOOSE_PLACE_BUDGET
 * placements in all (every candidate of a 4-worker plan of vgg16: 3109 x 23, ~5 s). */
#define CHOOSE_PLACE_BUDGET 100000L
#define CHOOSE_PLACE_WORKERS 6

typedef struct ChooseOpts {
    SchedKind kind;            /* the schedule the plan will run; 0 = 1f1b */
    int n_micro;               /* units per optimizer step (`plan --units-per-step`); 0 = 1 */
    double opt_state_factor;   /* 0 or 1 SGD with momentum, 2 Adam */
    int exhaustive;            /* also every plan when there are at most this many (else every straight plan,
                                * if that few); 0 = 10000; < 0: never */
    PlanOpts plan;             /* the partitioner's options (ours; memory_limit: the limit on the simulated peak) */
} ChooseOpts;

typedef struct ChooseCand {
    Plan *plan;                /* owned by the result */
    char source[40];           /* where it came from: "planner", "straight", "data parallel", ... */
    int enumerated;            /* from plan_enumerate, not proposed by the partitioner */
    SearchCand score;          /* score.fits: simulated and its peak fits the limit */
    int n_alike;               /* candidates alike to this one (choose_alike) folded into it, not listed */
    int alike_of;              /* the planner's own plan, kept though alike to an earlier candidate: that
                                * candidate's index; -1 otherwise */
} ChooseCand;

/* Two candidates are alike when they differ only in which side of some cuts a few layers run
 * that have no parameters and leave the tensor crossing the cut as large as it was (a flatten,
 * an activation), and the simulator's times for them are within CHOOSE_ALIKE of each other: a
 * run could not tell them apart. plan_choose keeps the faster (the earlier listed) of each such
 * group and folds the rest into it, so the list shows plans that differ. */
#define CHOOSE_ALIKE 0.005
int choose_alike(const ChooseCand *a, const ChooseCand *b, const Profile *prof);

typedef struct ChooseResult {
    int n;
    ChooseCand *c;             /* fitting first, then fastest first (ties: the partitioner's proposals in their
                                * order, then the enumerated by less memory) */
    int chosen;                /* index of the plan to write: 0, or the planner's when nothing fits */
    int picked;                /* a candidate the caller writes instead (`plan --pick`), listed and marked '>'; -1 none */
    int planner;               /* index of the partitioner's own plan */
    int none_fit;              /* no candidate's simulated peak fits the limit */
    int n_folded;              /* candidates folded into an alike one (ChooseCand.n_alike) */
    int n_enumerated;          /* plans enumerated (0: the model has too many) */
    int enumerated_straight;   /* ... and they are the straight ones only */
    SchedKind kind;
    int n_micro, samples_per_unit;
    double memory_limit;
} ChooseResult;

/* Proposes and scores. prof is what the partitioner sees (its step spread over n_micro units),
 * sim_prof what the simulator runs (NULL: prof). Fails (out zeroed) only when the partitioner
 * finds no plan, with its message. */
int  plan_choose(const Profile *prof, const Profile *sim_prof, const Cluster *cl, const ChooseOpts *o, ChooseResult *out,
                 Err *err);
void plan_choose_release(ChooseResult *r);
/* The top candidates (up to top, plus the planner's own), one line each, the choice marked;
 * explain: what the choice's time goes to and what made the runner-up (and the planner's own
 * plan) slower, and the memory, from a second simulation of each (sim_prof, cl). */
void plan_choose_print(const ChooseResult *r, int top, int explain, const Profile *sim_prof, const Cluster *cl,
                       double opt_state_factor, FILE *f);

#endif
