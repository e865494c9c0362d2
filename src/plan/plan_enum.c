/* plan_enum.c: every plan of a small model (the schedule search's exhaustive candidates,
 * src/sim/search.c): each chain of cut states D1 < D2 < ... < DS = every node (proper subsets)
 * with replicas r_i >= 1 summing to all the workers (straight: 1 each) on consecutive ranks,
 * or with o->chunks = V >= 2, for each d dividing the W workers into P = W / d >= 2 positions
 * (straight: d = 1), each chain of V P stages of d replicas placed round-robin. Stage times by
 * our model (plan_ours.c) or the interleaved one (plan_chunks.c). */
#include "plan_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct Enum {
    const PStates *s;
    int W, V, straight, limit;
    int d;           /* interleaved: replicas of every stage (positions W / d) */
    long count;
    int *to, *rep;   /* the chain being built */
    /* building: */
    int build;
    const Profile *prof;
    const PGraph *g;
    const Cluster *cl;
    const PlanOpts *o;
    Plan **out;
    int n;
    Err *err;
    int rc;
} Enum;

static void emit(Enum *e, int S) {
    e->count++;
    if (!e->build || e->rc) return;
    PSolution sol = {S, calloc((size_t)S, sizeof(PStageRange)), 0, 0, 0};
    PD_ASSERT(sol.st);
    for (int q = 0; q < S; q++) sol.st[q] = (PStageRange){q ? e->to[q - 1] : -1, e->to[q], e->rep[q], 0};
    if (e->V > 1) psolution_times_chunks(e->s, e->cl, e->o, &sol);
    else psolution_times_ours(e->s, e->cl, e->o, &sol);
    Plan *p = plan_from_solution(e->prof, e->g, e->s, &sol, e->cl, e->o, e->err);
    free(sol.st);
    if (!p) { /* a stage with no layers of its own (only for DAG index ranges; not here) */
        e->rc = PD_EINVAL;
        return;
    }
    e->out[e->n++] = p;
}

/* Stages 0..m-1 chosen, the last ending at cut k (-1: none), `used` workers. */
static void rec(Enum *e, int k, int m, int used) {
    if (e->count > e->limit || e->rc) return;
    const PStates *s = e->s;
    int last = s->n - 1;
    if (e->V > 1 ? m == e->V * (e->W / e->d) : used == e->W) {
        if (k == last) emit(e, m);
        return;
    }
    if (k == last) return;
    for (int j = k + 1; j < s->n; j++) {
        if (k >= 0 && !pstates_before(s, k, j)) continue;
        e->to[m] = j;
        if (e->V > 1) {
            e->rep[m] = e->d;
            rec(e, j, m + 1, used + e->d);
        } else
            for (int r = 1; used + r <= e->W && (r == 1 || !e->straight); r++) {
                e->rep[m] = r;
                rec(e, j, m + 1, used + r);
            }
        if (e->count > e->limit) return;
    }
}

int plan_enumerate(const Profile *prof, const Cluster *cl, const PlanOpts *o, int limit, Plan ***out, int *n, Err *err) {
    *out = NULL;
    *n = 0;
    if (cluster_check(cl, err)) return PD_EINVAL;
    PGraph g;
    PStates s;
    memset(&s, 0, sizeof s);
    if (pgraph_build(prof, &g, err)) return PD_EINVAL;
    int rc = pstates_build(&g, o->max_states > 0 ? o->max_states : 4000000, &s, err);
    if (rc) {
        pgraph_release(&g);
        return rc;
    }
    int W = cluster_total_workers(cl), V = o->chunks > 1 ? o->chunks : 1, maxS = V > 1 ? V * W : W;
    PlanOpts po = *o;
    po.memory_limit = 0;
    po.allow_idle = 0;
    Enum e = {&s, W, V, o->straight, limit, 1, 0, malloc(sizeof(int) * (size_t)(maxS + 1)), malloc(sizeof(int) * (size_t)(maxS + 1)),
              0, prof, &g, cl, &po, NULL, 0, err, PD_OK};
    PD_ASSERT(e.to && e.rep);
    /* interleaved: every d that leaves 2 or more positions (straight: 1) */
    const int dmax = V > 1 && !o->straight ? W / 2 : 1;
    for (e.d = 1; e.d <= dmax; e.d++)
        if (W % e.d == 0) rec(&e, -1, 0, 0);   /* count */
    if (e.count > limit) {
        rc = err_set(err, PD_EINVAL, "more than %d plans", limit);
    } else {
        e.build = 1;
        e.out = malloc(sizeof(Plan *) * (size_t)(e.count + 1));
        PD_ASSERT(e.out);
        e.count = 0;
        for (e.d = 1; e.d <= dmax && !e.rc; e.d++)
            if (W % e.d == 0) rec(&e, -1, 0, 0);
        rc = e.rc;
        if (rc) {
            for (int i = 0; i < e.n; i++) plan_free(e.out[i]);
            free(e.out);
        } else {
            *out = e.out;
            *n = e.n;
        }
    }
    free(e.to);
    free(e.rep);
    pstates_release(&s);
    pgraph_release(&g);
    return rc;
}
