/* plan_ours.c: our cost model (--cost-model ours, the default; docs/explanation/planner.md) and its
 * dynamic program. Flat over ranks: stage s of r replicas runs on the next r ranks
 * (innermost levels first), so the DP knows where every stage sits and charges each
 * transfer at the bandwidth of the slowest link it crosses:
 *   stage time  = max(compute part, boundary before, boundary after)
 *   compute     = (C + AR) / r, or max(C, AR) / r with overlap_allreduce,
 *                 AR = 4 (r-1)/r * P / B_span + 2 (r-1) latency_span (0 for r = 1)
 *   boundary    = (2 * bytes / ratio / B_link + 2 latency_link) / min(r_before, r_after)
 *   memory      = ceil(workers from s to the end / r) * (activations + parameters)
 * Transfers are always counted; the ratio (--activation-compression) defaults to 1.
 * DP state: (cut j, workers used m, replicas of the last stage r), value the bottleneck
 * so far; a step appends one stage. It does not know the authors' quirks (plan_compat.c). */
#include "plan_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int span_level(const Cluster *cl, int first, int r) { return cluster_link_level(cl, first, first + r - 1); }

double plan_ours_stage_compute(const Cluster *cl, const PlanOpts *o, double C, double P, int first_rank, int r) {
    double ar = 0;
    if (r > 1) {
        const ClusterLevel *lv = &cl->level[span_level(cl, first_rank, r)];
        ar = 4.0 * (r - 1) / r * P / lv->bandwidth + 2.0 * (r - 1) * lv->latency;
    }
    if (o->overlap_allreduce) return (C > ar ? C : ar) / r;
    return (C + ar) / r;
}

double plan_ours_boundary(const Cluster *cl, double bytes, int prev_first_rank, int prev_r, int r) {
    int lvl = cluster_link_level(cl, prev_first_rank, prev_first_rank + prev_r + r - 1);
    const ClusterLevel *lv = &cl->level[lvl < 0 ? 0 : lvl];
    int rmin = prev_r < r ? prev_r : r;
    return (2.0 * bytes / lv->bandwidth + 2.0 * lv->latency) / rmin;
}

double plan_ours_stash(int workers_from_here, int r, double act, double par) {
    return (double)((workers_from_here + r - 1) / r) * (act + par);
}

static double stage_mem(const PlanOpts *o, int from_here, int r, double act, double par, double in) {
    return o->stage_memory ? o->stage_memory(o->stage_memory_ctx, from_here, r, act, par, in)
                           : plan_ours_stash(from_here, r, act, par);
}

typedef struct FEnt {
    double t;   /* NaN = unreachable */
    int k, rp;  /* previous cut and its last stage's replicas; k = -1: one stage */
} FEnt;

/* One DP over exactly Wt workers (ranks 0..Wt-1), or up to Wt if any_final. */
static int run(const PStates *s, const Cluster *cl, const PlanOpts *o, int Wt, int any_final, FEnt *F,
               double *best_t, int *best_m, int *best_r) {
    const int n = s->n;
    const double ratio = o->activation_compression > 0 ? o->activation_compression : 1.0;
    const int rcap = o->straight ? 1 : Wt;
#define FI(j, m, r) F[((size_t)(j) * (Wt + 1) + (m)) * (Wt + 1) + (r)]
    for (size_t x = 0; x < (size_t)n * (Wt + 1) * (Wt + 1); x++) F[x] = (FEnt){NAN, -1, 0};
    for (int j = 0; j < n; j++) {
        for (int r = 1; r <= rcap; r++) { /* one stage: D_j on ranks 0..r-1 */
            if (o->memory_limit > 0 && stage_mem(o, Wt, r, s->ACT[j], s->PAR[j], 0) > o->memory_limit) continue;
            FI(j, r, r) = (FEnt){plan_ours_stage_compute(cl, o, s->C[j], s->PAR[j], 0, r), -1, 0};
        }
        for (int k = 0; k < j; k++) {
            if (!pstates_before(s, k, j)) continue;
            double Cst = s->C[j] - s->C[k], Pst = s->PAR[j] - s->PAR[k], Ast = s->ACT[j] - s->ACT[k];
            double bytes = s->OX[k] / ratio;
            for (int r = 1; r <= rcap; r++)
                for (int mp = 1; mp + r <= Wt; mp++) {
                    if (o->memory_limit > 0 && stage_mem(o, Wt - mp, r, Ast, Pst, s->OX[k]) > o->memory_limit) continue;
                    double comp = plan_ours_stage_compute(cl, o, Cst, Pst, mp, r);
                    FEnt *dst = &FI(j, mp + r, r);
                    for (int rp = 1; rp <= mp && rp <= rcap; rp++) {
                        const FEnt *pre = &FI(k, mp, rp);
                        if (isnan(pre->t)) continue;
                        double t = pre->t > comp ? pre->t : comp;
                        double bnd = plan_ours_boundary(cl, bytes, mp - rp, rp, r);
                        if (bnd > t) t = bnd;
                        if (isnan(dst->t) || t < dst->t) *dst = (FEnt){t, k, rp};
                    }
                }
        }
    }
    *best_t = NAN;
    for (int m = any_final ? 1 : Wt; m <= Wt; m++)
        for (int r = 1; r <= rcap && r <= m; r++) {
            double t = FI(n - 1, m, r).t;
            if (!isnan(t) && (isnan(*best_t) || t < *best_t)) {
                *best_t = t;
                *best_m = m;
                *best_r = r;
            }
        }
#undef FI
    return PD_OK;
}

int plan_dp_ours(const PStates *s, const Cluster *cl, const PlanOpts *o, PSolution *out, Err *err) {
    memset(out, 0, sizeof *out);
    const int n = s->n, W = cluster_total_workers(cl);
    double work = (double)n * n / 2 * W * W * W;
    if (work > 2e12)
        return err_set(err, PD_EINVAL, "our cost model on %d cut states and %d workers would take too long (about "
                       "%.0e steps); compress the graph's branches", n, W, work);
    double need = (double)n * (W + 1) * (W + 1) * sizeof(FEnt);
    if (need > 8e9)
        return err_set(err, PD_EINVAL, "our cost model on %d cut states and %d workers needs %.1f GB of tables", n, W,
                       need / 1e9);
    FEnt *F = malloc((size_t)need);
    FEnt *Fbest = NULL;
    PD_ASSERT(F);
    double best_t = NAN;
    int best_m = 0, best_r = 0, best_W = 0;
    if (o->allow_idle && o->memory_limit > 0) {
        /* The stash count depends on the workers used: one DP per total, fewest first. */
        Fbest = malloc((size_t)need);
        PD_ASSERT(Fbest);
        for (int Wt = 1; Wt <= W; Wt++) {
            double t;
            int m = 0, r = 0;
            run(s, cl, o, Wt, 0, F, &t, &m, &r);
            if (!isnan(t) && (isnan(best_t) || t < best_t)) {
                best_t = t;
                best_m = m;
                best_r = r;
                best_W = Wt;
                FEnt *tmp = Fbest;
                Fbest = F;
                F = tmp;
            }
        }
    } else {
        run(s, cl, o, W, o->allow_idle, F, &best_t, &best_m, &best_r);
        best_W = W;
        Fbest = F;
        F = NULL;
    }
    int rc = PD_OK;
    if (isnan(best_t)) {
        rc = err_set(err, PD_EINVAL, "no feasible plan: no partition of the %d cut states over %d workers%s%s", n, W,
                     o->memory_limit > 0 ? " fits the memory limit" : "",
                     o->straight ? " as a straight pipeline (more workers than cut states? try --allow-idle)" : "");
        goto done;
    }
    {
        const int Wt = best_W;
#define FB(j, m, r) Fbest[((size_t)(j) * (Wt + 1) + (m)) * (Wt + 1) + (r)]
        int cnt = 0, j = n - 1, m = best_m, r = best_r;
        int *to = malloc(sizeof(int) * (n + 1)), *rs = malloc(sizeof(int) * (n + 1));
        PD_ASSERT(to && rs);
        for (;;) {
            const FEnt *e = &FB(j, m, r);
            PD_ASSERT(!isnan(e->t));
            to[cnt] = j;
            rs[cnt] = r;
            cnt++;
            if (e->k < 0) break;
            int k = e->k, rp = e->rp;
            m -= r;
            j = k;
            r = rp;
        }
#undef FB
        out->n_stages = cnt;
        out->st = calloc((size_t)cnt, sizeof *out->st);
        PD_ASSERT(out->st);
        for (int q = 0; q < cnt; q++) {
            int src = cnt - 1 - q;
            PStageRange *st = &out->st[q];
            st->to = to[src];
            st->from = q == 0 ? -1 : out->st[q - 1].to;
            st->replicas = rs[src];
        }
        psolution_times_ours(s, cl, o, out);
        free(to);
        free(rs);
        out->pipeline_s = best_t;
        out->dp_s = plan_ours_stage_compute(cl, o, s->C[n - 1], s->PAR[n - 1], 0, W);
    }
done:
    free(F);
    free(Fbest);
    return rc;
}

void psolution_times_ours(const PStates *s, const Cluster *cl, const PlanOpts *o, PSolution *sol) {
    const double ratio = o->activation_compression > 0 ? o->activation_compression : 1.0;
    int first = 0, cnt = sol->n_stages;
    for (int q = 0; q < cnt; q++) {
        PStageRange *st = &sol->st[q];
        double C = s->C[st->to] - (st->from >= 0 ? s->C[st->from] : 0);
        double P = s->PAR[st->to] - (st->from >= 0 ? s->PAR[st->from] : 0);
        st->time_s = plan_ours_stage_compute(cl, o, C, P, first, st->replicas);
        first += st->replicas;
    }
    first = 0;
    for (int q = 0; q + 1 < cnt; q++) { /* the boundaries, charged to both sides */
        PStageRange *a = &sol->st[q], *b = &sol->st[q + 1];
        double bnd = plan_ours_boundary(cl, s->OX[a->to] / ratio, first, a->replicas, b->replicas);
        if (bnd > a->time_s) a->time_s = bnd;
        if (bnd > b->time_s) b->time_s = bnd;
        first += a->replicas;
    }
    sol->pipeline_s = 0;
    for (int q = 0; q < cnt; q++)
        if (sol->st[q].time_s > sol->pipeline_s) sol->pipeline_s = sol->st[q].time_s;
    sol->single_s = s->C[s->n - 1];
    sol->dp_s = plan_ours_stage_compute(cl, o, s->C[s->n - 1], s->PAR[s->n - 1], 0, first + (cnt ? sol->st[cnt - 1].replicas : 0));
}
