/* plan_impl.h: what the planner's .c files share: the profile as a graph with bitsets
 * (after the authors' preprocessing), the cut states (antichains, stored as the set of
 * nodes before the cut), and the two dynamic programs. Not a public interface. */
#ifndef PD_PLAN_IMPL_H
#define PD_PLAN_IMPL_H

#include <stdint.h>

#include "plan.h"

/* The profile as the planner sees it: Input sources and __getitem__ sinks removed
 * (docs/explanation/authors-planner.md §3.2), nodes in the profile's topological order. */
typedef struct PGraph {
    int n;                 /* kept nodes */
    int words;             /* 64-bit words per node bitset */
    int *layer;            /* (n) kept node -> profile layer index */
    int *node_of_layer;    /* (n_layers) profile layer -> kept node, or -1 if removed */
    double *ct, *act, *par;/* (n) fwd+bwd seconds, output bytes, parameter bytes */
    uint64_t *pred;        /* (n, words) strict ancestors */
    uint64_t *outs;        /* (n, words) direct successors */
    int source0;           /* the authors' sources()[0]: first kept source in file order */
} PGraph;

/* Cut states: a state is a set D of nodes closed under predecessors (what runs before
 * the cut), reachable from {source0} by the authors' moves (D -> D + v + pred(v) for a
 * node v outside D fed from D). Sorted by |D| then discovery, which is topological;
 * k is a valid earlier cut of j iff D_k is a proper subset of D_j. */
typedef struct PStates {
    int n, words;
    uint64_t *down;        /* (n, words) */
    double *C, *ACT, *PAR; /* sums over D of ct (seconds), act, par (bytes) */
    double *OA;            /* authors' output bytes: over their augmented antichain */
    double *OX;            /* exact: bytes of nodes in D with an edge leaving D */
} PStates;

int  pgraph_build(const Profile *prof, PGraph *g, Err *err);
void pgraph_release(PGraph *g);
/* Fails with PD_EINVAL if there are more than max_states states, or if the last state
 * does not contain every node (a node not reachable from the first source). */
int  pstates_build(const PGraph *g, long max_states, PStates *s, Err *err);
void pstates_release(PStates *s);

static inline int bits_subset(const uint64_t *a, const uint64_t *b, int words) {
    for (int w = 0; w < words; w++)
        if (a[w] & ~b[w]) return 0;
    return 1;
}
/* k is an earlier cut than j (D_k a proper subset of D_j); states are size-sorted. */
static inline int pstates_before(const PStates *s, int k, int j) {
    return k < j && bits_subset(s->down + (size_t)k * s->words, s->down + (size_t)j * s->words, s->words);
}

/* The result of a DP: stages as state ranges (cut_before, cut_after], with replicas. */
typedef struct PStageRange {
    int from, to;       /* the stage runs D_to minus D_from; from = -1 for the first stage */
    int replicas;
    double time_s;      /* the model's time per minibatch for the stage */
} PStageRange;

typedef struct PSolution {
    int n_stages;
    PStageRange *st;    /* in pipeline order */
    double pipeline_s, single_s, dp_s;
} PSolution;

/* The authors' optimizer (--cost-model pipedream), docs/explanation/authors-planner.md §3. */
int plan_dp_compat(const PStates *s, const Cluster *cl, const PlanOpts *o, PSolution *out, Err *err);
/* Ours (docs/explanation/planner.md): flat over ranks, topology-aware bandwidths, exact 1F1B stash. */
int plan_dp_ours(const PStates *s, const Cluster *cl, const PlanOpts *o, PSolution *out, Err *err);
void psolution_release(PSolution *s);
/* The plan of a solution (stages as state ranges with replicas, ranks consecutive; o->chunks
 * >= 2: round-robin): layers assigned, removed layers placed, validated (no memory check).
 * NULL with err if a stage would be empty. Borrowed inputs. */
Plan *plan_from_solution(const Profile *prof, const PGraph *g, const PStates *s, const PSolution *sol,
                         const Cluster *cl, const PlanOpts *o, Err *err);
/* Stage times of a solution whose ranges and replicas are set (ranks consecutive from 0), by
 * our model (time_s, pipeline_s = the largest, single_s, dp_s), or for an interleaved one
 * (every stage d replicas, round-robin positions; pipeline_s = the largest per-position sum). */
void psolution_times_ours(const PStates *s, const Cluster *cl, const PlanOpts *o, PSolution *sol);
void psolution_times_chunks(const PStates *s, const Cluster *cl, const PlanOpts *o, PSolution *sol);
/* Interleaved plans (o->chunks >= 2): V x P stages of d replicas on P = W / d positions,
 * replica j of stage i on rank (i mod P) d + j; d = o->pipelines when given, else the d (1 with
 * o->straight) whose plan predicts the shortest minibatch. plan_dp_chunks_d: the best plan for
 * one d. */
int plan_dp_chunks(const PStates *s, const Cluster *cl, const PlanOpts *o, PSolution *out, Err *err);
int plan_dp_chunks_d(const PStates *s, const Cluster *cl, const PlanOpts *o, int d, PSolution *out, Err *err);

/* Ours' cost of one stage and of one cut, shared with the exhaustive-search tests. */
double plan_ours_stage_compute(const Cluster *cl, const PlanOpts *o, double C, double P, int first_rank, int r);
double plan_ours_boundary(const Cluster *cl, double bytes, int prev_first_rank, int prev_r, int r);
double plan_ours_stash(int workers_from_here, int r, double act, double par);

#endif
