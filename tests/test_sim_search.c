/* test_sim_search.c: the planner that chooses the schedule (plan_search, src/sim/search.c).
 *
 * Exhaustive search on random small chains and DAGs (at most 5 layers, 2-4 workers on one or
 * two levels, random times, sizes, bandwidths and a memory limit that binds sometimes): the
 * brute force enumerates, independently of plan_enumerate, every chain of predecessor-closed
 * node sets {} = D0 < D1 < ... < DS = all nodes (all 2^n subsets tested) with every replica
 * vector summing to the workers on consecutive ranks, and for every d dividing the W workers
 * into P >= 2 positions every chain of 2P sets of d replicas placed round-robin (interleaved, 2
 * chunks, replica j of set i on rank (i mod P) d + j) and in a V (replica j of set i on rank
 * plan_v_rank(i, P, d, j), for the V kinds); on each, every kind of the search's default set (dp
 * once), micro-batches {1, 2, 4} x workers, with and without recomputation; each scored by
 * plan_search_score (the search's simulation). The search's choice must have the brute
 * force's minimum time per unit among the candidates that fit, fit itself, and its runner-up
 * must be of another kind or recomputation setting. With the partitioner's plans only
 * (exhaustive off) the choice still fits and is never faster than the optimum.
 *
 * And the case the search is for: the authors' vgg16 and resnet50 profiles on 4 workers with a memory
 * limit at which 1f1b on the partitioner's plan does not fit: the search finds a plan that
 * fits and reports what it gave up. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "search.h"

#define MAXN 5

static double uni(Rng *r, double lo, double hi) { return lo + (hi - lo) * rng_uniform_f64(r); }

typedef struct Brute {
    const Profile *prof;
    const Cluster *cl;
    int n, W, V, d;   /* d: interleaved, the replicas of every stage */
    int vs;           /* with V = 2: the V placement */
    uint32_t pred[MAXN], downs[1 << MAXN], full;
    int nd;
    uint32_t chain[16];
    int rep[16];
    double limit, best;
    int count, dp_done;
} Brute;

static Plan *make(const Brute *b, int S) {
    Plan *p = calloc(1, sizeof *p);
    snprintf(p->model, sizeof p->model, "random");
    p->n_layers = b->n;
    p->n_stages = S;
    p->stages = calloc((size_t)S, sizeof *p->stages);
    int rank = 0;
    for (int s = 0; s < S; s++) {
        PlanStage *st = &p->stages[s];
        uint32_t set = b->chain[s] & ~(s ? b->chain[s - 1] : 0);
        st->layers = malloc(sizeof(int) * MAXN);
        for (int v = 0; v < b->n; v++)
            if (set >> v & 1) st->layers[st->n_layers++] = v;
        st->replicas = b->rep[s];
        st->ranks = malloc(sizeof(int) * (size_t)st->replicas);
        for (int r = 0; r < st->replicas; r++)
            st->ranks[r] = b->vs ? plan_v_rank(s, b->W / b->d, b->d, r) : b->V > 1 ? (s % (b->W / b->d)) * b->d + r : rank++;
    }
    p->n_workers = b->W;
    p->chunks = b->V > 1 ? b->V : 0;
    p->v_shape = b->vs;
    p->noam = (b->W + p->stages[0].replicas - 1) / p->stages[0].replicas;
    p->cluster = *b->cl;
    p->n_edges = b->prof->n_edges;   /* borrowed */
    p->edges = b->prof->edges;
    return p;
}

static void score_all(Brute *b, int S) {
    static const int kinds[] = {SCHED_1F1B, SCHED_GPIPE, SCHED_1F1B_FLUSH, SCHED_2BW, SCHED_DP, SCHED_ZB_H1, SCHED_ZB_H2,
                                SCHED_INTERLEAVED, SCHED_ZB_V, SCHED_V_HALF, SCHED_V_MIN, SCHED_DUALPIPE_V};
    Plan *p = make(b, S);
    Err err = {0};
    if (plan_validate(p, b->n, &err)) fail_msg("brute-force plan: %s", err.msg);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        SchedKind kind = (SchedKind)kinds[k];
        if (sched_kind_v(kind) ? !b->vs : (kind == SCHED_INTERLEAVED) != (b->V > 1 && !b->vs)) continue;
        if (kind == SCHED_DP && b->dp_done++) continue;   /* dp runs the whole model on every worker: once */
        int micro = kind != SCHED_1F1B && kind != SCHED_DP;
        for (int m = 1; m <= (micro ? 4 : 1); m *= 2)
            for (int rc = 0; rc < 2; rc++) {
                SearchCand c;
                if (plan_search_score(p, b->prof, b->cl, kind, micro ? m * b->W : 1, rc, 1, &c, &err)) continue;
                b->count++;
                if (b->limit > 0 && c.peak_bytes > b->limit) continue;
                if (isnan(b->best) || c.unit_s < b->best) b->best = c.unit_s;
            }
    }
    for (int s = 0; s < S; s++) free(p->stages[s].layers), free(p->stages[s].ranks);
    free(p->stages);
    free(p);
}

/* Stages 0..m-1 chosen (chain[m-1] the last set), `used` workers. */
static void rec(Brute *b, int m, int used) {
    uint32_t D = m ? b->chain[m - 1] : 0;
    if (D == b->full) {
        if (b->V > 1 ? m == b->V * (b->W / b->d) : used == b->W) score_all(b, m);
        return;
    }
    if (b->V > 1 ? m == b->V * (b->W / b->d) : used == b->W) return;
    for (int q = 0; q < b->nd; q++) {
        uint32_t E = b->downs[q];
        if ((E & D) != D || E == D) continue;
        b->chain[m] = E;
        if (b->V > 1) {
            b->rep[m] = b->d;
            rec(b, m + 1, used + b->d);
        } else
            for (int r = 1; used + r <= b->W; r++) {
                b->rep[m] = r;
                rec(b, m + 1, used + r);
            }
    }
}

static void random_profile(Rng *rng, Profile *prof, Brute *b, int dag) {
    int n = 1 + (int)rng_below(rng, MAXN);
    memset(prof, 0, sizeof *prof);
    snprintf(prof->model, sizeof prof->model, "random");
    prof->n_layers = n;
    prof->layers = calloc((size_t)n, sizeof *prof->layers);
    prof->input_bytes = uni(rng, 0, 1e6);
    for (int i = 0; i < n; i++) {
        ProfileLayer *l = &prof->layers[i];
        snprintf(l->name, sizeof l->name, "l%d", i);
        snprintf(l->type, sizeof l->type, "linear");
        l->fwd_s = uni(rng, 1e-3, 1e-2);
        l->bwd_s = uni(rng, 1e-3, 2e-2);
        if (rng_below(rng, 2)) l->bwd_in_s = uni(rng, 0.2, 0.8) * l->bwd_s, l->bwd_w_s = l->bwd_s - l->bwd_in_s;
        l->act_bytes = uni(rng, 1e5, 1e7);
        l->param_bytes = uni(rng, 1e5, 1e7);
        if (i > 0 && !dag) b->pred[i] = 1u << (i - 1);
    }
    if (dag && n > 1) {
        prof->edges = calloc((size_t)n * n, sizeof *prof->edges);
        for (int y = 1; y < n; y++) {
            int any = 0;
            for (int x = 0; x < y; x++)
                if (rng_below(rng, 2) == 0) prof->edges[prof->n_edges][0] = x, prof->edges[prof->n_edges++][1] = y, any = 1;
            if (!any) {
                int x = (int)rng_below(rng, (uint32_t)y);
                prof->edges[prof->n_edges][0] = x, prof->edges[prof->n_edges++][1] = y;
            }
        }
        for (int e = 0; e < prof->n_edges; e++) b->pred[prof->edges[e][1]] |= 1u << prof->edges[e][0];
    }
    b->n = n;
    b->full = (1u << n) - 1;
    for (uint32_t m = 1; m <= b->full; m++) {
        int closed = 1;
        for (int v = 0; v < n && closed; v++) closed = !((m >> v & 1) && (b->pred[v] & ~m));
        if (closed) b->downs[b->nd++] = m;
    }
}

static void test_exhaustive(void **state) {
    (void)state;
    Rng rng;
    rng_init(&rng, 31, 0, 0);
    int bound = 0, interleaved_won = 0, recompute_won = 0, v_won = 0;
    for (int trial = 0; trial < 40; trial++) {
        Profile prof;
        Brute b = {0};
        random_profile(&rng, &prof, &b, trial % 2);
        Cluster cl = {0};
        if (rng_below(&rng, 2)) {
            cl.n_levels = 1;
            cl.level[0] = (ClusterLevel){2 + (int)rng_below(&rng, 2), uni(&rng, 1e8, 1e10), uni(&rng, 0, 1e-4)};
        } else {
            cl.n_levels = 2;
            cl.level[0] = (ClusterLevel){2, uni(&rng, 1e9, 1e10), 0};
            cl.level[1] = (ClusterLevel){2, uni(&rng, 1e8, 1e9), uni(&rng, 0, 1e-4)};
        }
        b.prof = &prof;
        b.cl = &cl;
        b.W = cluster_total_workers(&cl);
        /* the memory limit: none, or between the smallest and the largest plain peak */
        SearchOpts o = {0};
        o.max_chunks = 2;   /* the brute force tries 1 and 2 chunks */
        SearchResult r;
        Err err = {0};
        if (plan_search(&prof, &cl, &o, &r, &err)) fail_msg("trial %d: %s", trial, err.msg);
        double lo = INFINITY, hi = 0;
        for (int i = 0; i < r.n_candidates; i++) lo = fmin(lo, r.all[i].peak_bytes), hi = fmax(hi, r.all[i].peak_bytes);
        plan_search_release(&r);
        if (trial % 4) o.memory_limit = lo + (hi - lo) * uni(&rng, 0, 0.6);
        b.limit = o.memory_limit;
        b.best = NAN;
        b.V = 1, b.d = 1;
        rec(&b, 0, 0);
        for (b.V = 2, b.d = 1; b.d <= b.W / 2; b.d++)
            if (b.W % b.d == 0) rec(&b, 0, 0);
        for (b.V = 2, b.vs = 1, b.d = 1; b.d <= b.W / 2; b.d++)
            if (b.W % b.d == 0) rec(&b, 0, 0);
        b.vs = 0;
        if (plan_search(&prof, &cl, &o, &r, &err)) fail_msg("trial %d: %s", trial, err.msg);
        assert_true(r.exhaustive);
        if (r.n_candidates != b.count)
            fail_msg("trial %d: %d candidates scored, the brute force has %d", trial, r.n_candidates, b.count);
        assert_int_equal(r.found, !isnan(b.best));
        if (r.found) {
            if (fabs(r.best.unit_s - b.best) > 1e-12 * b.best)
                fail_msg("trial %d: search %.15g s per unit, brute force %.15g", trial, r.best.unit_s, b.best);
            assert_true(r.best.fits);
            assert_true(!(o.memory_limit > 0) || r.best.peak_bytes <= o.memory_limit);
            if (r.runner_up.plan) {
                assert_true(r.runner_up.kind != r.best.kind || r.runner_up.recompute != r.best.recompute);
                assert_true(r.runner_up.unit_s >= r.best.unit_s * (1 - 1e-12));
            }
            assert_true(r.fastest.unit_s <= r.best.unit_s * (1 + 1e-12));
            bound += o.memory_limit > 0 && !r.fastest.fits;
            interleaved_won += r.best.kind == SCHED_INTERLEAVED;
            v_won += sched_kind_v(r.best.kind);
            recompute_won += r.best.recompute;
            /* the partitioner's plans only: a plan that fits, never better than the optimum */
            SearchOpts od = o;
            od.exhaustive = -1;
            SearchResult rd;
            assert_int_equal(plan_search(&prof, &cl, &od, &rd, &err), PD_OK);
            assert_false(rd.exhaustive);
            if (rd.found) {
                assert_true(!(o.memory_limit > 0) || rd.best.peak_bytes <= o.memory_limit);
                assert_true(rd.best.unit_s >= b.best * (1 - 1e-12));
            }
            plan_search_release(&rd);
        }
        plan_search_release(&r);
        profile_release(&prof);
    }
    print_message("memory limit binding in %d cases; interleaved chosen %d times, a V kind %d times, recomputation "
                  "%d times\n", bound, interleaved_won, v_won, recompute_won);
    assert_true(bound > 5);
    assert_true(v_won > 0);   /* the V placement is searched, and wins somewhere */
}

/* The authors' profiles under a memory limit that 1f1b on the partitioner's plan exceeds. */
static void test_authors_profiles(void **state) {
    (void)state;
    static const char *names[] = {"vgg16", "resnet50"};
    for (int i = 0; i < 2; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/data/pipedream-profiles/%s/graph.txt", names[i]);
        Profile prof;
        Err err = {0};
        if (profile_load(tu_src(rel), &prof, &err)) fail_msg("%s", err.msg);
        Cluster cl = {.n_levels = 1, .level = {{4, 1e10, 0}}};
        SearchOpts o = {0};
        SearchResult r;
        assert_int_equal(plan_search(&prof, &cl, &o, &r, &err), PD_OK);
        double need = r.baseline.peak_bytes;   /* 1f1b on the partitioner's plan */
        assert_true(r.baseline.plan && need > 0);
        plan_search_release(&r);
        o.memory_limit = 0.5 * need;
        assert_int_equal(plan_search(&prof, &cl, &o, &r, &err), PD_OK);
        assert_false(r.baseline.fits);
        assert_true(r.found);
        assert_true(r.best.peak_bytes <= o.memory_limit);
        assert_true(r.runner_up.plan != NULL);
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        plan_search_print(&r, f);
        fclose(f);
        print_message("%s, limit %.4g GB (1f1b on the partitioner's plan needs %.4g):\n%s", names[i], o.memory_limit / 1e9,
                      need / 1e9, buf);
        assert_non_null(strstr(buf, "choice: "));
        assert_non_null(strstr(buf, "runner-up: "));
        assert_non_null(strstr(buf, "gave up: "));
        free(buf);
        plan_search_release(&r);
        profile_release(&prof);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exhaustive),
        cmocka_unit_test(test_authors_profiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
