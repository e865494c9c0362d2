/* plan_chunks.c: plans for the interleaved schedule (`pipedream plan --chunks V`, docs/explanation/planner.md)
 * and for the V-shaped ones (--v-shape: 2 P stages, worker i holding stages i and 2 P - 1 - i, plan_v_rank).
 * V x P stages in a straight line on P pipeline positions, each stage with d replicas (P d = the
 * workers; d = 1 with --straight): replica j of stage i on rank (i mod P) d + j, replica j of
 * every stage one whole pipeline. For each d the DP splits the cut states into V P consecutive
 * stages minimising the bottleneck stage time max(C, boundary before, boundary after), a stage
 * costed as our model costs d replicas (compute and their all-reduce over d, plan_ours.c) and a
 * boundary as in our model (2 bytes / ratio / B_link + 2 latency_link, the link between the
 * positions' first ranks, over d: each pipeline carries its share). A worker runs all its
 * chunks per minibatch, so the plan's predicted time per minibatch is the largest per-position
 * sum of its stages' times; the d with the smallest wins (ties: the fewer replicas).
 * V-placed plans pair stage i with stage 2 P - 1 - i on one worker, so the bottleneck stage is the
 * wrong objective there (one heavy layer would sit beside a heavy partner): their DP walks the V
 * from both ends at once and minimises the slowest worker's sum itself (plan_dp_v_d). */
#include "plan_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct CEnt {
    double t;   /* NaN = unreachable */
    int k;      /* previous cut; -1: first stage */
} CEnt;

static double chunk_boundary(const Cluster *cl, double bytes, int a, int b) {
    int lvl = cluster_link_level(cl, a, b);
    const ClusterLevel *lv = &cl->level[lvl < 0 ? 0 : lvl];
    return 2.0 * bytes / lv->bandwidth + 2.0 * lv->latency;
}

/* Stage m (0-based) of a solution on P positions of d replicas: its compute (our model's for d
 * replicas of C seconds and Pb parameter bytes) and the boundary before it (m >= 1). */
static double chunk_stage(const Cluster *cl, const PlanOpts *o, double C, double Pb, int m, int P, int d) {
    return plan_ours_stage_compute(cl, o, C, Pb, plan_chunk_rank(o->v_shape, m, P, d, 0), d);
}
/* The boundary before stage m: none between the two stages of one worker (the V's turn). */
static double chunk_cut(const Cluster *cl, const PlanOpts *o, double bytes, int m, int P, int d) {
    int a = plan_chunk_rank(o->v_shape, m - 1, P, d, 0), b = plan_chunk_rank(o->v_shape, m, P, d, 0);
    return a == b ? 0.0 : chunk_boundary(cl, bytes, a, b) / d;
}

/* The time of stage m over states (k, j] as psolution_times_chunks charges it: its compute, or a
 * boundary on either side if slower (none at the V's turn, both sides on one worker). */
static double v_stage(const PStates *s, const Cluster *cl, const PlanOpts *o, int k, int j, int m, int P, int d) {
    const double ratio = o->activation_compression > 0 ? o->activation_compression : 1.0;
    double C = s->C[j] - (k >= 0 ? s->C[k] : 0), Pb = s->PAR[j] - (k >= 0 ? s->PAR[k] : 0);
    double t = chunk_stage(cl, o, C, Pb, m, P, d), b;
    if (m > 0 && (b = chunk_cut(cl, o, s->OX[k] / ratio, m, P, d)) > t) t = b;
    if (m < 2 * P - 1 && (b = chunk_cut(cl, o, s->OX[j] / ratio, m + 1, P, d)) > t) t = b;
    return t;
}

static int v_before(const PStates *s, int k, int j) { return k < 0 ? j >= 0 : pstates_before(s, k, j); }

/* The V's DP, outside in. After workers 0..w-1 the state is (a, b): the cut after worker w-1's
 * first stage and the cut before its second; its value the slowest of those workers' sums.
 * Worker w takes (a, a'] and (b', b]; the innermost one meets itself at the turn (a' = b').
 * O(P n^4) at most: plan_dp_v_fits says when that is affordable (84 cut states on 4 workers: 0.3 s;
 * beyond, the bottleneck-stage DP). */
static int plan_dp_v_fits(int n, int P) { return (double)n * n * n * n * P < 2e8; }

static int plan_dp_v_d(const PStates *s, const Cluster *cl, const PlanOpts *o, int d, PSolution *out, Err *err) {
    const int n = s->n, P = cluster_total_workers(cl) / d, NS = 2 * P;
#define VI(a, b) ((size_t)((a) + 1) * n + (b))   /* a in -1..n-1, b in 0..n-1 */
    const size_t NSt = (size_t)(n + 1) * n;
    double *cur = malloc(NSt * sizeof *cur), *nxt = malloc(NSt * sizeof *nxt);
    int *back = malloc((size_t)P * NSt * sizeof *back);
    PD_ASSERT(cur && nxt && back);
    for (size_t x = 0; x < NSt; x++) cur[x] = NAN;
    cur[VI(-1, n - 1)] = 0;
    double best = NAN;
    int best_a = -2, best_t = -1, best_b = -1;
    for (int w = 0; w < P; w++) {
        const int inner = w == P - 1, left = NS - 2 * w - 2;   /* stages still to place inside */
        for (size_t x = 0; x < NSt; x++) nxt[x] = NAN;
        for (int a = -1; a < n; a++)
            for (int b = a + 1; b < n; b++) {
                double v = cur[VI(a, b)];
                if (isnan(v)) continue;
                for (int a2 = a + 1; a2 < b; a2++) {
                    if (!v_before(s, a, a2)) continue;
                    double tl = v_stage(s, cl, o, a, a2, w, P, d);
                    if (inner) {
                        if (!pstates_before(s, a2, b)) continue;
                        double t = fmax(v, tl + v_stage(s, cl, o, a2, b, NS - 1 - w, P, d));
                        if (isnan(best) || t < best) best = t, best_a = a, best_t = a2, best_b = b;
                        continue;
                    }
                    for (int b2 = a2 + left; b2 < b; b2++) {
                        if (!pstates_before(s, b2, b) || !pstates_before(s, a2, b2)) continue;
                        double t = fmax(v, tl + v_stage(s, cl, o, b2, b, NS - 1 - w, P, d));
                        size_t y = VI(a2, b2);
                        if (isnan(nxt[y]) || t < nxt[y]) nxt[y] = t, back[(size_t)w * NSt + y] = (int)VI(a, b);
                    }
                }
            }
        double *t = cur;
        cur = nxt, nxt = t;
    }
    int rc = PD_OK;
    if (isnan(best)) {
        rc = err_set(err, PD_EINVAL, "no partition of the %d cut states into %d stages", n, NS);
        goto done;
    }
    /* the cuts c_0 = -1 < c_1 < ... < c_NS = n - 1; stage m runs (c_m, c_m+1] */
    int *c = malloc((size_t)(NS + 1) * sizeof *c);
    PD_ASSERT(c);
    c[P - 1] = best_a, c[P] = best_t, c[P + 1] = best_b;
    for (int w = P - 2; w >= 0; w--) {
        int prev = back[(size_t)w * NSt + VI(c[w + 1], c[NS - 1 - w])];
        c[w] = prev / n - 1, c[NS - w] = prev % n;
    }
    out->n_stages = NS;
    out->st = calloc((size_t)NS, sizeof *out->st);
    PD_ASSERT(out->st);
    for (int m = 0; m < NS; m++) out->st[m] = (PStageRange){.from = c[m], .to = c[m + 1], .replicas = d};
    free(c);
    psolution_times_chunks(s, cl, o, out);
#undef VI
done:
    free(cur), free(nxt), free(back);
    return rc;
}

int plan_dp_chunks_d(const PStates *s, const Cluster *cl, const PlanOpts *o, int d, PSolution *out, Err *err) {
    memset(out, 0, sizeof *out);
    const int n = s->n, W = cluster_total_workers(cl), V = o->chunks;
    if (d < 1 || W % d || W / d < 2)
        return err_set(err, PD_EINVAL, "--chunks: %d pipelines do not split %d workers into pipelines of 2 or more", d, W);
    const int P = W / d, NS = V * P;
    if (NS > n)
        return err_set(err, PD_EINVAL, "--chunks %d on %d workers needs %d stages but the model has only %d cut states", V,
                       W, NS, n);
    if ((double)n * n * NS > 4e11)
        return err_set(err, PD_EINVAL, "--chunks %d on %d cut states and %d workers would take too long", V, n, W);
    if (o->v_shape && plan_dp_v_fits(n, P)) return plan_dp_v_d(s, cl, o, d, out, err);
    const double ratio = o->activation_compression > 0 ? o->activation_compression : 1.0;
    CEnt *G = malloc((size_t)n * (NS + 1) * sizeof *G);
    PD_ASSERT(G);
#define GI(j, m) G[(size_t)(j) * (NS + 1) + (m)]
    for (size_t x = 0; x < (size_t)n * (NS + 1); x++) G[x] = (CEnt){NAN, -1};
    for (int j = 0; j < n; j++) {
        GI(j, 1) = (CEnt){chunk_stage(cl, o, s->C[j], s->PAR[j], 0, P, d), -1};
        for (int k = 0; k < j; k++) {
            if (!pstates_before(s, k, j)) continue;
            double C = s->C[j] - s->C[k], Pb = s->PAR[j] - s->PAR[k];
            for (int m = 2; m <= NS && m <= j + 1; m++) {
                const CEnt *pre = &GI(k, m - 1);
                if (isnan(pre->t)) continue;
                double bnd = chunk_cut(cl, o, s->OX[k] / ratio, m - 1, P, d);
                double c = chunk_stage(cl, o, C, Pb, m - 1, P, d);
                double t = pre->t > c ? pre->t : c;
                if (bnd > t) t = bnd;
                CEnt *dst = &GI(j, m);
                if (isnan(dst->t) || t < dst->t) *dst = (CEnt){t, k};
            }
        }
    }
    int rc = PD_OK;
    if (isnan(GI(n - 1, NS).t)) {
        rc = err_set(err, PD_EINVAL, "no partition of the %d cut states into %d stages", n, NS);
        goto done;
    }
    out->n_stages = NS;
    out->st = calloc((size_t)NS, sizeof *out->st);
    PD_ASSERT(out->st);
    for (int m = NS, j = n - 1; m >= 1; m--) {
        PStageRange *st = &out->st[m - 1];
        st->to = j;
        st->from = GI(j, m).k;
        st->replicas = d;
        j = st->from;
    }
    psolution_times_chunks(s, cl, o, out);
#undef GI
done:
    free(G);
    return rc;
}

int plan_dp_chunks(const PStates *s, const Cluster *cl, const PlanOpts *o, PSolution *out, Err *err) {
    memset(out, 0, sizeof *out);
    const int W = cluster_total_workers(cl);
    if (W < 2) return err_set(err, PD_EINVAL, "--chunks needs at least 2 workers");
    if (o->pipelines > 0) return plan_dp_chunks_d(s, cl, o, o->pipelines, out, err);
    int rc = PD_EINVAL;
    Err first = {0};
    for (int d = 1; d <= (o->straight ? 1 : W / 2); d++) {
        if (W % d) continue;
        PSolution x;
        Err e = {0};
        if (plan_dp_chunks_d(s, cl, o, d, &x, &e)) {
            if (d == 1) first = e;   /* d = 1 has the most stages: its refusal is the one to report */
            continue;
        }
        if (rc || x.pipeline_s < out->pipeline_s) {
            if (!rc) psolution_release(out);
            *out = x;
            rc = PD_OK;
        } else {
            psolution_release(&x);
        }
    }
    if (rc) {
        if (first.code) *err = first;
        else err_set(err, PD_EINVAL, "--chunks %d: no interleaved plan on %d workers", o->chunks, W);
    }
    return rc;
}

void psolution_times_chunks(const PStates *s, const Cluster *cl, const PlanOpts *o, PSolution *sol) {
    const double ratio = o->activation_compression > 0 ? o->activation_compression : 1.0;
    const int W = cluster_total_workers(cl), NS = sol->n_stages, d = sol->st[0].replicas, P = W / d;
    double *per = calloc((size_t)P, sizeof(double));
    PD_ASSERT(per);
    for (int q = 0; q < NS; q++) {
        PStageRange *st = &sol->st[q];
        double C = s->C[st->to] - (st->from >= 0 ? s->C[st->from] : 0);
        double Pb = s->PAR[st->to] - (st->from >= 0 ? s->PAR[st->from] : 0);
        st->time_s = chunk_stage(cl, o, C, Pb, q, P, d);
        if (q > 0) {
            double bnd = chunk_cut(cl, o, s->OX[st->from] / ratio, q, P, d);
            if (bnd > st->time_s) st->time_s = bnd;
            if (bnd > sol->st[q - 1].time_s) sol->st[q - 1].time_s = bnd;
        }
    }
    for (int q = 0; q < NS; q++) per[plan_chunk_rank(o->v_shape, q, P, 1, 0)] += sol->st[q].time_s;
    sol->pipeline_s = 0;
    for (int w = 0; w < P; w++)
        if (per[w] > sol->pipeline_s) sol->pipeline_s = per[w];
    free(per);
    sol->single_s = s->C[s->n - 1];
    sol->dp_s = plan_ours_stage_compute(cl, o, s->C[s->n - 1], s->PAR[s->n - 1], 0, W);
}
