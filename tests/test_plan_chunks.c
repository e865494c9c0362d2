/* test_plan_chunks.c: interleaved plans (`pipedream plan --chunks V`, plan_chunks.c).
 * Exhaustive search on random small chains and DAGs, for every d dividing the W workers into
 * P = W / d >= 2 positions: every chain of predecessor-closed node sets {} = D0 < D1 < ... <
 * D_{VP} = all nodes (found by testing all 2^n subsets), replica j of stage i on rank
 * (i mod P) d + j, its time max(our model's compute of d replicas, the boundaries before and
 * after it at the bandwidth of the link between the positions, over d,
 * docs/explanation/planner.md); the DP's bottleneck for each d must equal the minimum, the
 * plan with --straight is d = 1's, and the plan without is the d whose plan predicts the
 * shortest minibatch. Also the plan's shape (round-robin ranks, chunks, noam), validation
 * errors, the JSON round trip and plan_interleave. V-placed plans (--v-shape): the DP's slowest
 * worker (the sum of its two stages) equals the exhaustive search's. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan_impl.h"

#define MAXN 10

static double uni(Rng *r, double lo, double hi) { return lo + (hi - lo) * rng_uniform_f64(r); }

typedef struct Brute {
    const Profile *prof;
    const Cluster *cl;
    const PlanOpts *o;
    int n, W, NS, d;   /* d replicas a stage: P = W / d positions */
    uint32_t pred[MAXN], downs[1 << MAXN], full;
    int nd;
    double ratio, best;
} Brute;

static double cut_bytes(const Brute *b, uint32_t D) {
    double s = 0;
    for (int v = 0; v < b->n; v++) {
        if (!(D >> v & 1)) continue;
        int leaves = 0;
        for (int w = 0; w < b->n; w++) leaves |= !(D >> w & 1) && (b->pred[w] >> v & 1);
        if (leaves) s += b->prof->layers[v].act_bytes;
    }
    return s;
}

static double link_t(const Brute *b, int x, int y, double bytes) {
    long span = 1;
    int lvl = 0;
    for (int l = 0; l < b->cl->n_levels; l++) {
        if (x / span != y / span) lvl = l;
        span *= b->cl->level[l].workers;
    }
    return 2 * bytes / b->ratio / b->cl->level[lvl].bandwidth + 2 * b->cl->level[lvl].latency;
}

/* Stage m (0-based) runs E \ D; cur: the bottleneck of the stages before, with the boundary
 * before this stage already charged to it (the boundary is charged to both sides). */
static void rec(Brute *b, uint32_t D, int m, double cur) {
    if (m == b->NS) {
        if (D == b->full && (isnan(b->best) || cur < b->best)) b->best = cur;
        return;
    }
    for (int q = 0; q < b->nd; q++) {
        uint32_t E = b->downs[q];
        if ((E & D) != D || E == D) continue;
        double C = 0, Pb = 0;
        for (int v = 0; v < b->n; v++)
            if ((E & ~D) >> v & 1) C += b->prof->layers[v].fwd_s + b->prof->layers[v].bwd_s, Pb += b->prof->layers[v].param_bytes;
        const int P = b->W / b->d;
        double t = fmax(cur, plan_ours_stage_compute(b->cl, b->o, C, Pb, (m % P) * b->d, b->d));
        if (m > 0) t = fmax(t, link_t(b, ((m - 1) % P) * b->d, (m % P) * b->d, cut_bytes(b, D)) / b->d);
        rec(b, E, m + 1, t);
    }
}

/* A random chain (dag 0) or DAG of 2..MAXN layers, a cluster of 2 or 4 workers, options, and
 * the brute force's view of them (every predecessor-closed node set). */
static void random_case(Rng *rng, int dag, Profile *prof, Cluster *cl, PlanOpts *o, Brute *b) {
    int n = 2 + (int)rng_below(rng, MAXN - 1);
    memset(prof, 0, sizeof *prof);
    memset(cl, 0, sizeof *cl);
    memset(o, 0, sizeof *o);
    snprintf(prof->model, sizeof prof->model, "random");
    prof->n_layers = n;
    prof->layers = calloc((size_t)n, sizeof *prof->layers);
    memset(b, 0, sizeof *b);
    b->prof = prof;
    b->n = n;
    for (int i = 0; i < n; i++) {
        ProfileLayer *l = &prof->layers[i];
        snprintf(l->name, sizeof l->name, "l%d", i);
        snprintf(l->type, sizeof l->type, "linear");
        l->fwd_s = uni(rng, 1e-3, 1e-1);
        l->bwd_s = uni(rng, 1e-3, 2e-1);
        l->act_bytes = uni(rng, 1e5, 1e8);
        l->param_bytes = uni(rng, 1e5, 1e8);
        if (i > 0 && !dag) b->pred[i] = 1u << (i - 1);
    }
    if (dag) {
        prof->edges = calloc((size_t)n * n, sizeof *prof->edges);
        for (int y = 1; y < n; y++) {
            int any = 0;
            for (int x = 0; x < y; x++)
                if (rng_below(rng, 3) == 0) prof->edges[prof->n_edges][0] = x, prof->edges[prof->n_edges++][1] = y, any = 1;
            if (!any) {
                int x = (int)rng_below(rng, (uint32_t)y);
                prof->edges[prof->n_edges][0] = x, prof->edges[prof->n_edges++][1] = y;
            }
        }
        for (int e = 0; e < prof->n_edges; e++) b->pred[prof->edges[e][1]] |= 1u << prof->edges[e][0];
    }
    cl->n_levels = 1 + (int)rng_below(rng, 2);
    for (int l = 0; l < cl->n_levels; l++)
        cl->level[l] = (ClusterLevel){2, uni(rng, 1e8, 2e10), rng_below(rng, 2) ? 0 : uni(rng, 0, 1e-4)};
    b->cl = cl;
    b->W = cluster_total_workers(cl);
    o->chunks = 2 + (int)rng_below(rng, 2);
    o->activation_compression = rng_below(rng, 2) ? 0 : uni(rng, 0.5, 4);
    b->ratio = o->activation_compression > 0 ? o->activation_compression : 1;
    b->o = o;
    b->full = (1u << n) - 1;
    for (uint32_t m = 1; m <= b->full; m++) {
        int closed = 1;
        for (int v = 0; v < n && closed; v++) closed = !((m >> v & 1) && (b->pred[v] & ~m));
        if (closed) b->downs[b->nd++] = m;
    }
}

/* The cut states the DPs work on (the graph is not needed after). */
static void cut_states(const Profile *prof, int trial, PStates *st) {
    PGraph g;
    Err err = {0};
    memset(st, 0, sizeof *st);
    if (pgraph_build(prof, &g, &err) || pstates_build(&g, 4000000, st, &err)) fail_msg("trial %d: %s", trial, err.msg);
    pgraph_release(&g);
}

static void test_exhaustive(void **state) {
    (void)state;
    Rng rng;
    rng_init(&rng, 21, 0, 0);
    int checked = 0, checked_d[2] = {0, 0}, chose_d = 0;
    for (int trial = 0; trial < 300; trial++) {
        Profile prof;
        Cluster cl;
        PlanOpts o;
        Brute b;
        random_case(&rng, trial % 2, &prof, &cl, &o, &b);
        const int n = b.n;
        /* each d: the DP's bottleneck against the brute force's, and the plan's minibatch time */
        PStates st;
        cut_states(&prof, trial, &st);
        Err err = {0};
        double pipe[5] = {NAN, NAN, NAN, NAN, NAN};
        int best_d = 0;
        for (b.d = 1; b.d <= b.W / 2; b.d++) {
            if (b.W % b.d) continue;
            b.NS = o.chunks * (b.W / b.d);
            b.best = NAN;
            rec(&b, 0, 0, 0);
            PSolution sol;
            int rc = plan_dp_chunks_d(&st, &cl, &o, b.d, &sol, &err);
            if (isnan(b.best)) {   /* fewer cut states than stages */
                assert_int_equal(rc, PD_EINVAL);
                assert_non_null(strstr(err.msg, "stages"));
                continue;
            }
            if (rc) fail_msg("trial %d d=%d: %s", trial, b.d, err.msg);
            double bott = 0;
            for (int q = 0; q < sol.n_stages; q++) bott = fmax(bott, sol.st[q].time_s);
            if (fabs(bott - b.best) > 1e-9 * b.best)
                fail_msg("trial %d d=%d: DP %.12g, brute force %.12g", trial, b.d, bott, b.best);
            pipe[b.d] = sol.pipeline_s;
            if (!best_d || sol.pipeline_s < pipe[best_d]) best_d = b.d;
            checked_d[b.d > 1]++;
            psolution_release(&sol);
        }
        pstates_release(&st);
        /* the planner: without --straight the d of the shortest minibatch, with it d = 1 */
        for (int straight = 0; straight < 2; straight++) {
            o.straight = straight;
            int d = straight ? (isnan(pipe[1]) ? 0 : 1) : best_d;
            Plan *p = plan_new(&prof, &cl, &o, &err);
            if (!d) {
                assert_null(p);
                assert_non_null(strstr(err.msg, "stages"));
                continue;
            }
            if (!p) fail_msg("trial %d: %s", trial, err.msg);
            const int P = b.W / d;
            assert_int_equal(p->chunks, o.chunks);
            assert_int_equal(p->n_workers, b.W);
            assert_int_equal(p->n_stages, o.chunks * P);
            assert_int_equal(p->noam, P);
            double per[8] = {0}, worst = 0;
            for (int q = 0; q < p->n_stages; q++) {
                assert_int_equal(p->stages[q].replicas, d);
                for (int j = 0; j < d; j++) assert_int_equal(p->stages[q].ranks[j], (q % P) * d + j);
                per[q % P] += p->stages[q].time_s;
            }
            for (int w = 0; w < P; w++) worst = fmax(worst, per[w]);
            assert_true(fabs(p->pipeline_s - worst) <= 1e-12 * worst);
            assert_true(fabs(p->pipeline_s - pipe[d]) <= 1e-12 * pipe[d]);
            assert_int_equal(plan_validate(p, n, &err), PD_OK);
            checked++;
            chose_d += d > 1;
            plan_free(p);
        }
        profile_release(&prof);
    }
    print_message("%d interleaved plans checked; the DP equal to the exhaustive search for %d one-replica and %d "
                  "replicated solutions; %d plans chose replicas\n", checked, checked_d[0], checked_d[1], chose_d);
    assert_true(checked > 100);
    assert_true(checked_d[1] > 30);
    assert_true(chose_d > 5);
}

/* V placement: every chain {} = D0 < ... < D_2P = all nodes, stage m on position
 * plan_v_position(m, P), its time max(compute, the boundaries on either side; none between the
 * two stages of one position), a position's time the sum of its two stages'; the best chain's
 * slowest position. */
static void rec_v(Brute *b, uint32_t *D, int m) {
    const int P = b->W / b->d;
    if (m == b->NS) {
        if (D[m] != b->full) return;
        double per[8] = {0}, worst = 0;
        for (int q = 0; q < b->NS; q++) {
            double C = 0, Pb = 0;
            for (int v = 0; v < b->n; v++)
                if ((D[q + 1] & ~D[q]) >> v & 1) C += b->prof->layers[v].fwd_s + b->prof->layers[v].bwd_s, Pb += b->prof->layers[v].param_bytes;
            const int pos = plan_v_position(q, P);
            double t = plan_ours_stage_compute(b->cl, b->o, C, Pb, pos * b->d, b->d);
            if (q > 0 && plan_v_position(q - 1, P) != pos)
                t = fmax(t, link_t(b, plan_v_position(q - 1, P) * b->d, pos * b->d, cut_bytes(b, D[q])) / b->d);
            if (q < b->NS - 1 && plan_v_position(q + 1, P) != pos)
                t = fmax(t, link_t(b, pos * b->d, plan_v_position(q + 1, P) * b->d, cut_bytes(b, D[q + 1])) / b->d);
            per[pos] += t;
        }
        for (int w = 0; w < P; w++) worst = fmax(worst, per[w]);
        if (isnan(b->best) || worst < b->best) b->best = worst;
        return;
    }
    for (int q = 0; q < b->nd; q++) {
        uint32_t E = b->downs[q];
        if ((E & D[m]) != D[m] || E == D[m]) continue;
        D[m + 1] = E;
        rec_v(b, D, m + 1);
    }
}

static void test_v_exhaustive(void **state) {
    (void)state;
    Rng rng;
    rng_init(&rng, 22, 0, 0);
    int checked = 0, dags = 0;
    for (int trial = 0; trial < 200; trial++) {
        Profile prof;
        Cluster cl;
        PlanOpts o;
        Brute b;
        random_case(&rng, trial % 2, &prof, &cl, &o, &b);
        o.chunks = 2, o.v_shape = 1;
        PStates st;
        cut_states(&prof, trial, &st);
        Err err = {0};
        for (b.d = 1; b.d <= b.W / 2; b.d++) {
            if (b.W % b.d) continue;
            b.NS = 2 * (b.W / b.d);
            b.best = NAN;
            uint32_t D[9] = {0};
            rec_v(&b, D, 0);
            PSolution sol;
            int rc = plan_dp_chunks_d(&st, &cl, &o, b.d, &sol, &err);
            if (isnan(b.best)) {
                assert_int_equal(rc, PD_EINVAL);
                continue;
            }
            if (rc) fail_msg("trial %d d=%d: %s", trial, b.d, err.msg);
            if (fabs(sol.pipeline_s - b.best) > 1e-9 * b.best)
                fail_msg("trial %d d=%d: V DP %.12g, brute force %.12g", trial, b.d, sol.pipeline_s, b.best);
            checked++;
            dags += trial % 2;
            psolution_release(&sol);
        }
        pstates_release(&st);
        profile_release(&prof);
    }
    print_message("%d V-placed plans: the DP's slowest worker equal to the exhaustive search's (%d on DAGs)\n", checked,
                  dags);
    assert_true(checked > 100);
    assert_true(dags > 30);
}

static void chain(Profile *prof, int n) {
    memset(prof, 0, sizeof *prof);
    snprintf(prof->model, sizeof prof->model, "chain");
    prof->n_layers = n;
    prof->layers = calloc((size_t)n, sizeof *prof->layers);
    for (int i = 0; i < n; i++) {
        snprintf(prof->layers[i].name, sizeof prof->layers[i].name, "l%d", i);
        snprintf(prof->layers[i].type, sizeof prof->layers[i].type, "linear");
        prof->layers[i].fwd_s = 0.005, prof->layers[i].bwd_s = 0.010;
    }
}

/* Validation, JSON, plan_interleave, and the options --chunks refuses. */
static void test_shape(void **state) {
    (void)state;
    Profile prof;
    chain(&prof, 8);
    Cluster cl = {.n_levels = 1, .level = {{4, 1e9, 0}}};
    PlanOpts o = {0};
    o.chunks = 2;
    o.straight = 1;   /* one replica a stage (without: the d predicted fastest, test_exhaustive) */
    Err err = {0};
    Plan *p = plan_new(&prof, &cl, &o, &err);
    assert_non_null(p);
    assert_int_equal(p->n_stages, 8);
    assert_int_equal(p->noam, 4);
    for (int s = 0; s < 8; s++) assert_int_equal(p->stages[s].n_layers, 1);
    char path[] = "/tmp/pd_plan_chunks_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(plan_save(p, path, &err), PD_OK);
    Plan *q = plan_load(path, &err);
    assert_non_null(q);
    assert_int_equal(q->chunks, 2);
    assert_int_equal(q->n_workers, 4);
    plan_free(q);
    unlink(path);
    p->stages[5].ranks[0] = 0;   /* not round-robin */
    assert_int_equal(plan_validate(p, 8, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "replica 0 of stage 5 must be on rank 1"));
    plan_free(p);
    /* plan_interleave: a straight plan of 8 stages on 8 workers -> 2 chunks on 4 */
    Cluster c8 = {.n_levels = 1, .level = {{8, 1e9, 0}}};
    PlanOpts so = {0};
    so.straight = 1;
    p = plan_new(&prof, &c8, &so, &err);
    assert_non_null(p);
    assert_int_equal(plan_interleave(p, 3, &err), PD_EINVAL);
    assert_int_equal(plan_interleave(p, 2, &err), PD_OK);
    assert_int_equal(p->n_workers, 4);
    for (int s = 0; s < 8; s++) assert_int_equal(p->stages[s].ranks[0], s % 4);
    assert_int_equal(plan_validate(p, 8, &err), PD_OK);
    assert_true(fabs(p->pipeline_s - 0.030) < 1e-12);
    plan_free(p);
    /* plan_interleave with data parallelism: 4 stages of 2 replicas each (8 workers) -> 2
     * chunks on 2 positions of 2 replicas (4 workers), replica j of stage s on rank (s mod 2) 2 + j */
    Cluster c4 = {.n_levels = 1, .level = {{4, 1e9, 0}}};
    p = plan_new(&prof, &c4, &so, &err);
    assert_non_null(p);
    assert_int_equal(p->n_stages, 4);
    for (int s = 0; s < 4; s++) {
        free(p->stages[s].ranks);
        p->stages[s].ranks = malloc(2 * sizeof(int));
        p->stages[s].replicas = 2;
        p->stages[s].ranks[0] = 2 * s, p->stages[s].ranks[1] = 2 * s + 1;
    }
    p->n_workers = 8;
    p->cluster.level[0].workers = 8;
    p->stages[3].replicas = 1;   /* unequal replicas: refused, p unchanged */
    assert_int_equal(plan_interleave(p, 2, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "stage 3 has 1 replicas and stage 0 2"));
    assert_int_equal(p->stages[1].ranks[0], 2);
    p->stages[3].replicas = 2;
    assert_int_equal(plan_interleave(p, 2, &err), PD_OK);
    assert_int_equal(p->n_workers, 4);
    assert_int_equal(p->noam, 2);
    static const int want[4][2] = {{0, 1}, {2, 3}, {0, 1}, {2, 3}};
    for (int s = 0; s < 4; s++)
        for (int j = 0; j < 2; j++) assert_int_equal(p->stages[s].ranks[j], want[s][j]);
    assert_int_equal(plan_validate(p, 8, &err), PD_OK);
    p->stages[2].ranks[1] = 3;   /* replica 1 of stage 2 off its pipeline */
    assert_int_equal(plan_validate(p, 8, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "replica 1 of stage 2 must be on rank 1"));
    p->stages[2].ranks[1] = 1;
    p->stages[1].replicas = 1;
    assert_int_equal(plan_validate(p, 8, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "stage 1 has 1 replicas, stage 0 has 2"));
    plan_free(p);
    /* refused combinations */
    o.cost_model = COST_PIPEDREAM;
    assert_null(plan_new(&prof, &cl, &o, &err));
    assert_non_null(strstr(err.msg, "--chunks"));
    o.cost_model = COST_OURS;
    o.chunks = 3;   /* 12 stages from 8 layers: refused one replica a stage, so 2 pipelines of 6 */
    o.straight = 1;
    assert_null(plan_new(&prof, &cl, &o, &err));
    assert_non_null(strstr(err.msg, "needs 12 stages"));
    o.straight = 0;
    p = plan_new(&prof, &cl, &o, &err);
    if (!p) fail_msg("--chunks 3 on 4 workers: %s", err.msg);
    assert_int_equal(p->n_stages, 6);
    assert_int_equal(p->stages[0].replicas, 2);
    assert_int_equal(p->n_workers, 4);
    plan_free(p);
    profile_release(&prof);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exhaustive),
        cmocka_unit_test(test_v_exhaustive),
        cmocka_unit_test(test_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
