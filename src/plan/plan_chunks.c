/* plan_chunks.c: plans for the interleaved schedule (`pipedream plan --chunks V`, docs/explanation/planner.md).
 * V x W one-replica stages in a straight line, stage i on rank i mod W (worker w holds stages
 * w, w + W, ...). The DP splits the cut states into V W consecutive stages minimising the
 * bottleneck stage time max(C, boundary before, boundary after), with boundaries charged as in
 * our model (2 bytes / ratio / B_link + 2 latency_link, the link between ranks (i-1) mod W and
 * i mod W). A worker runs all its chunks per minibatch, so the plan's predicted time per
 * minibatch is the largest per-worker sum of its stages' times. */
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

int plan_dp_chunks(const PStates *s, const Cluster *cl, const PlanOpts *o, PSolution *out, Err *err) {
    memset(out, 0, sizeof *out);
    const int n = s->n, W = cluster_total_workers(cl), V = o->chunks, NS = V * W;
    if (W < 2) return err_set(err, PD_EINVAL, "--chunks needs at least 2 workers");
    if (NS > n)
        return err_set(err, PD_EINVAL, "--chunks %d on %d workers needs %d stages but the model has only %d cut states", V,
                       W, NS, n);
    if ((double)n * n * NS > 4e11)
        return err_set(err, PD_EINVAL, "--chunks %d on %d cut states and %d workers would take too long", V, n, W);
    const double ratio = o->activation_compression > 0 ? o->activation_compression : 1.0;
    CEnt *G = malloc((size_t)n * (NS + 1) * sizeof *G);
    PD_ASSERT(G);
#define GI(j, m) G[(size_t)(j) * (NS + 1) + (m)]
    for (size_t x = 0; x < (size_t)n * (NS + 1); x++) G[x] = (CEnt){NAN, -1};
    for (int j = 0; j < n; j++) {
        GI(j, 1) = (CEnt){s->C[j], -1};
        for (int k = 0; k < j; k++) {
            if (!pstates_before(s, k, j)) continue;
            double C = s->C[j] - s->C[k];
            for (int m = 2; m <= NS && m <= j + 1; m++) {
                const CEnt *pre = &GI(k, m - 1);
                if (isnan(pre->t)) continue;
                double bnd = chunk_boundary(cl, s->OX[k] / ratio, (m - 2) % W, (m - 1) % W);
                double t = pre->t > C ? pre->t : C;
                if (bnd > t) t = bnd;
                CEnt *d = &GI(j, m);
                if (isnan(d->t) || t < d->t) *d = (CEnt){t, k};
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
        st->replicas = 1;
        j = st->from;
    }
    psolution_times_chunks(s, cl, o, out);
#undef GI
done:
    free(G);
    return rc;
}

void psolution_times_chunks(const PStates *s, const Cluster *cl, const PlanOpts *o, PSolution *sol) {
    const double ratio = o->activation_compression > 0 ? o->activation_compression : 1.0;
    const int W = cluster_total_workers(cl), NS = sol->n_stages;
    double *per = calloc((size_t)W, sizeof(double));
    PD_ASSERT(per);
    for (int q = 0; q < NS; q++) {
        PStageRange *st = &sol->st[q];
        st->time_s = s->C[st->to] - (st->from >= 0 ? s->C[st->from] : 0);
        if (q > 0) {
            double bnd = chunk_boundary(cl, s->OX[st->from] / ratio, (q - 1) % W, q % W);
            if (bnd > st->time_s) st->time_s = bnd;
            if (bnd > sol->st[q - 1].time_s) sol->st[q - 1].time_s = bnd;
        }
    }
    for (int q = 0; q < NS; q++) per[q % W] += sol->st[q].time_s;
    sol->pipeline_s = 0;
    for (int w = 0; w < W; w++)
        if (per[w] > sol->pipeline_s) sol->pipeline_s = per[w];
    free(per);
    sol->single_s = s->C[s->n - 1];
    sol->dp_s = plan_ours_stage_compute(cl, o, s->C[s->n - 1], s->PAR[s->n - 1], 0, W);
}
