/* test_plan.c: the planner against exhaustive search on random small profiles, for both
 * cost models, plus the plan's invariants, JSON round trip, determinism and plan_validate.
 *
 * What the brute force enumerates (independently of the DP and of plan_graph.c's sums):
 *  - ours: every chain of node sets {} = D0 < D1 < ... < DS = all nodes where each Di is
 *    closed under predecessors (found by testing all 2^n subsets), and every replica vector
 *    (r1..rS), ri >= 1 (all 1 when straight), summing to the total W' of workers used
 *    (W' = W, or any W' <= W with allow_idle). Stage s runs on ranks sum(r<s)..; its cost is
 *    computed from the formulas in docs/explanation/planner.md with the test's own link-level
 *    arithmetic; the value is the max over stages and boundaries; memory per the stash rule.
 *  - pipedream (compat), per level l from the innermost, exactly as the authors' recursion:
 *    for every row i (only row 0 at the last level), column j >= i and worker count m+1 of
 *    that level: all sequences i <= k1 < k2 < ... < kS = j of state indices where the first
 *    stage is the index range i..k1 (the initialisation formula, with /nw) and each later
 *    stage runs D_kt minus D_k(t-1) with k(t-1) a proper subset of kt (recurrence formula,
 *    transfers when a ratio is given); replicas summing to m+1 (at most m+1 with
 *    allow_idle when j > i; all 1 when straight); the authors' stash rule. Segment times
 *    are C differences at level 0 and the level below's optimum on all its workers above.
 *    States and their order come from pstates_build; their C/ACT/PAR/OA sums are
 *    recomputed here from the nodes, OA by the definition in the authors' code. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan_impl.h"

#define MAXN 12

typedef struct Case {
    Profile prof;
    Cluster cl;
    PlanOpts o;
    int n;
    uint32_t pred[MAXN];   /* direct predecessors */
    uint32_t anc[MAXN];    /* all ancestors */
} Case;

static double uni(Rng *r, double lo, double hi) { return lo + (hi - lo) * rng_uniform_f64(r); }

static void make_case(Case *c, Rng *rng, int dag, int max_n, int max_w, int max_levels) {
    memset(c, 0, sizeof *c);
    int n = 1 + (int)rng_below(rng, (uint32_t)max_n);
    c->n = n;
    Profile *p = &c->prof;
    snprintf(p->model, sizeof p->model, "random");
    p->n_layers = n;
    p->layers = calloc((size_t)n, sizeof *p->layers);
    for (int i = 0; i < n; i++) {
        ProfileLayer *l = &p->layers[i];
        snprintf(l->name, sizeof l->name, "l%d", i);
        snprintf(l->type, sizeof l->type, "linear");
        int zero = rng_below(rng, 8) == 0;
        l->fwd_s = zero ? 0 : uni(rng, 1e-3, 1e-1);
        l->bwd_s = zero ? 0 : uni(rng, 1e-3, 2e-1);
        l->act_bytes = rng_below(rng, 6) == 0 ? 0 : uni(rng, 1e5, 1e8);
        l->param_bytes = rng_below(rng, 3) == 0 ? 0 : uni(rng, 1e5, 4e8);
    }
    if (dag && n > 1) {
        p->edges = calloc((size_t)(n * n), sizeof *p->edges);
        for (int b = 1; b < n; b++) {
            int any = 0;
            for (int a = 0; a < b; a++)
                if (rng_below(rng, 3) == 0) {
                    p->edges[p->n_edges][0] = a;
                    p->edges[p->n_edges++][1] = b;
                    any = 1;
                }
            if (!any) { /* every node but 0 has an input: one source */
                p->edges[p->n_edges][0] = (int)rng_below(rng, (uint32_t)b);
                p->edges[p->n_edges++][1] = b;
            }
        }
    }
    for (int i = 1; i < n && p->n_edges == 0; i++) c->pred[i] = 1u << (i - 1);
    for (int e = 0; e < p->n_edges; e++) c->pred[p->edges[e][1]] |= 1u << p->edges[e][0];
    for (int v = 0; v < n; v++) {
        c->anc[v] = c->pred[v];
        for (int a = 0; a < v; a++)
            if (c->pred[v] >> a & 1) c->anc[v] |= c->anc[a];
    }
    /* 1-3 levels, at most max_w workers in all */
    int levels = 1 + (int)rng_below(rng, (uint32_t)max_levels), total = 1;
    c->cl.n_levels = 0;
    for (int l = 0; l < levels; l++) {
        int w = 1 + (int)rng_below(rng, 4);
        while (w > 1 && total * w > max_w) w--;
        total *= w;
        c->cl.level[c->cl.n_levels++] = (ClusterLevel){w, uni(rng, 1e8, 2e10), rng_below(rng, 2) ? 0 : uni(rng, 0, 1e-4)};
    }
    c->o.straight = rng_below(rng, 4) == 0;
    c->o.allow_idle = rng_below(rng, 3) == 0;
    c->o.activation_compression = rng_below(rng, 3) == 0 ? 0 : (rng_below(rng, 2) ? 1 : uni(rng, 0.5, 4));
    c->o.overlap_allreduce = rng_below(rng, 3) == 0;
    if (rng_below(rng, 3) == 0) { /* a limit that binds sometimes */
        double tot = 0;
        for (int i = 0; i < n; i++) tot += p->layers[i].act_bytes + p->layers[i].param_bytes;
        c->o.memory_limit = tot * uni(rng, 0.2, 2.5);
    }
}

static void free_case(Case *c) { profile_release(&c->prof); }

/* ---- ours: brute force ----------------------------------------------------------- */

static int link_level(const Cluster *cl, int a, int b) { /* outermost level whose groups differ */
    if (a == b) return -1;
    int lvl = -1;
    long span = 1;
    for (int l = 0; l < cl->n_levels; l++) {
        if (a / span != b / span) lvl = l;
        span *= cl->level[l].workers;
    }
    return lvl;
}

typedef struct Ours {
    const Case *c;
    uint32_t downs[1 << MAXN];
    int nd;
    uint32_t full;
    int Wt;
    double best;
} Ours;

static void ours_sums(const Case *c, uint32_t set, double *C, double *A, double *P) {
    *C = *A = *P = 0;
    for (int v = 0; v < c->n; v++)
        if (set >> v & 1) {
            *C += c->prof.layers[v].fwd_s + c->prof.layers[v].bwd_s;
            *A += c->prof.layers[v].act_bytes;
            *P += c->prof.layers[v].param_bytes;
        }
}

static double ours_cut_bytes(const Case *c, uint32_t D) {
    double b = 0;
    for (int v = 0; v < c->n; v++) {
        if (!(D >> v & 1)) continue;
        int leaves = 0;
        for (int w = 0; w < c->n; w++)
            if (!(D >> w & 1) && (c->pred[w] >> v & 1)) leaves = 1;
        if (leaves) b += c->prof.layers[v].act_bytes;
    }
    return b;
}

static void ours_rec(Ours *s, uint32_t D, int used, int prev_r, double cur) {
    const Case *c = s->c;
    const Cluster *cl = &c->cl;
    if (D == s->full) {
        if (used == s->Wt && (isnan(s->best) || cur < s->best)) s->best = cur;
        return;
    }
    double ratio = c->o.activation_compression > 0 ? c->o.activation_compression : 1;
    for (int q = 0; q < s->nd; q++) {
        uint32_t E = s->downs[q];
        if ((E & D) != D || E == D) continue;
        double C, A, P;
        ours_sums(c, E & ~D, &C, &A, &P);
        for (int r = 1; used + r <= s->Wt && (r == 1 || !c->o.straight); r++) {
            if (c->o.memory_limit > 0 && ceil((double)(s->Wt - used) / r) * (A + P) > c->o.memory_limit) continue;
            double ar = 0;
            if (r > 1) {
                const ClusterLevel *lv = &cl->level[link_level(cl, used, used + r - 1)];
                ar = 4.0 * (r - 1) / r * P / lv->bandwidth + 2.0 * (r - 1) * lv->latency;
            }
            double t = c->o.overlap_allreduce ? fmax(C, ar) / r : (C + ar) / r;
            if (D) {
                int l = link_level(cl, used - prev_r, used + r - 1);
                const ClusterLevel *lv = &cl->level[l];
                double b = (2.0 * ours_cut_bytes(c, D) / ratio / lv->bandwidth + 2.0 * lv->latency) /
                           (prev_r < r ? prev_r : r);
                t = fmax(t, b);
            }
            ours_rec(s, E, used + r, r, fmax(cur, t));
        }
    }
}

static double ours_brute(const Case *c) {
    static Ours s;
    memset(&s, 0, sizeof s);
    s.c = c;
    s.full = (1u << c->n) - 1;
    for (uint32_t m = 1; m <= s.full; m++) {
        int closed = 1;
        for (int v = 0; v < c->n && closed; v++)
            if ((m >> v & 1) && (c->pred[v] & ~m)) closed = 0;
        if (closed) s.downs[s.nd++] = m;
    }
    int W = cluster_total_workers(&c->cl);
    double best = NAN;
    for (int Wt = c->o.allow_idle ? 1 : W; Wt <= W; Wt++) {
        s.Wt = Wt;
        s.best = NAN;
        ours_rec(&s, 0, 0, 0, 0);
        if (!isnan(s.best) && (isnan(best) || s.best < best)) best = s.best;
    }
    return best;
}

/* ---- compat: brute force --------------------------------------------------------- */

typedef struct Compat {
    const Case *c;
    int ns;
    uint32_t D[4096];
    double C[4096], ACT[4096], PAR[4096], OA[4096];
    double *T;              /* (ns+1, ns) segment times of the current level; NULL = C differences */
    int N, final;
    double B, nw;
    /* enumeration state */
    int i, j, m;
    double best;
} Compat;

static double seg_of(const double *v, int i, int j) {
    if (i == 0) return v[j];
    if (j < i) return NAN;
    return v[j] - v[i - 1];
}

static double compat_T(const Compat *s, int i, int j) {
    return s->T ? s->T[(size_t)i * s->ns + j] : seg_of(s->C, i, j);
}

/* Later stages: the last cut is k (stage ends), workers used so far `used`, value cur. */
static void compat_rec(Compat *s, int k, int used, double cur) {
    const PlanOpts *o = &s->c->o;
    const int budget = s->m + 1;
    if (k == s->j) {
        int ok = o->allow_idle && s->j > s->i ? used <= budget : used == budget;
        if (ok && (isnan(s->best) || cur < s->best)) s->best = cur;
        return;
    }
    for (int k2 = k + 1; k2 <= s->j; k2++) {
        if ((s->D[k] & s->D[k2]) != s->D[k] || s->D[k] == s->D[k2]) continue; /* proper subset */
        double T = compat_T(s, k + 1, k2);
        if (isnan(T)) continue;
        double par = seg_of(s->PAR, k + 1, k2), act = seg_of(s->ACT, k + 1, k2);
        for (int r = 1; used + r <= budget && (r == 1 || !o->straight); r++) {
            if (o->memory_limit > 0 && (act + par) * ceil((double)(s->N - (used + r)) / r) > o->memory_limit) continue;
            double t = (T + 4.0 * (r - 1) * par / (s->B * r)) / r;
            if (o->activation_compression > 0) {
                t = fmax(t, 2.0 * s->OA[k] / (s->B * r) / o->activation_compression);
                if (k2 < s->ns - 1) t = fmax(t, 2.0 * s->OA[k2] / (s->B * r) / o->activation_compression);
            }
            compat_rec(s, k2, used + r, fmax(cur, t));
        }
    }
}

static double compat_value(Compat *s, int i, int j, int m) {
    const PlanOpts *o = &s->c->o;
    s->i = i;
    s->j = j;
    s->m = m;
    s->best = NAN;
    for (int k1 = i; k1 <= j; k1++) { /* the first stage: the index range i..k1 */
        double T = compat_T(s, i, k1);
        if (isnan(T)) continue;
        double par = seg_of(s->PAR, i, k1), act = seg_of(s->ACT, i, k1);
        for (int r = 1; r <= m + 1 && (r == 1 || !o->straight); r++) {
            if (o->memory_limit > 0 && ceil((double)(s->N - r) / r) * (act + par) > o->memory_limit) continue;
            double t = (T + 4.0 * (r - 1) * par / (s->B * r) / s->nw) / r;
            compat_rec(s, k1, r, t);
        }
    }
    return s->best;
}

static double compat_brute(const Case *c, const PStates *st) {
    static Compat s;
    memset(&s, 0, sizeof s);
    s.c = c;
    s.ns = st->n;
    PD_ASSERT(st->n <= 4096 && st->words == 1);
    for (int q = 0; q < st->n; q++) {
        uint32_t D = (uint32_t)st->down[q];
        s.D[q] = D;
        for (int v = 0; v < c->n; v++) {
            if (!(D >> v & 1)) continue;
            const ProfileLayer *l = &c->prof.layers[v];
            s.C[q] += l->fwd_s + l->bwd_s;
            s.ACT[q] += l->act_bytes;
            s.PAR[q] += l->param_bytes;
        }
        /* OA: the antichain (no successor in D) plus the authors' extra nodes */
        for (int v = 0; v < c->n; v++) {
            if (!(D >> v & 1)) continue;
            int is_max = 1;
            for (int w = 0; w < c->n; w++)
                if ((D >> w & 1) && (c->pred[w] >> v & 1)) is_max = 0;
            int extra = 0;
            for (int a = 0; a < c->n && !is_max && !extra; a++) {
                if (!(D >> a & 1) || !(c->anc[a] >> v & 1)) continue;
                int a_max = 1;
                for (int w = 0; w < c->n; w++)
                    if ((D >> w & 1) && (c->pred[w] >> a & 1)) a_max = 0;
                if (!a_max) continue;
                for (int o = 0; o < c->n; o++)
                    if ((c->pred[o] >> v & 1) && !(c->anc[a] >> o & 1) && o != a) extra = 1;
            }
            if (is_max || extra) s.OA[q] += c->prof.layers[v].act_bytes;
        }
    }
    const int L = c->cl.n_levels, ns = s.ns;
    double *next = malloc(sizeof(double) * (size_t)(ns + 1) * ns);
    double nw = 1, result = NAN;
    for (int l = 0; l < L; l++) {
        s.N = c->cl.level[l].workers;
        s.B = c->cl.level[l].bandwidth;
        s.nw = nw;
        s.final = l == L - 1;
        if (s.final) {
            result = compat_value(&s, 0, ns - 1, s.N - 1);
            break;
        }
        for (int i = 0; i <= ns; i++)
            for (int j = 0; j < ns; j++) next[(size_t)i * ns + j] = j >= i ? compat_value(&s, i, j, s.N - 1) : NAN;
        free(s.T);
        s.T = next;
        next = malloc(sizeof(double) * (size_t)(ns + 1) * ns);
        nw = s.N;
    }
    free(next);
    free(s.T);
    return result;
}

/* ---- the checks ------------------------------------------------------------------ */

static int close_rel(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(fabs(a), fabs(b)) + 1e-300; }

static void check_plan_shape(const Plan *p, const Case *c) {
    Err err = {0};
    assert_int_equal(plan_validate(p, c->n, &err), PD_OK);
    int W = cluster_total_workers(&c->cl);
    assert_true(p->n_workers <= W);
    if (!c->o.allow_idle) assert_int_equal(p->n_workers, W);
    int rank = 0;
    for (int s = 0; s < p->n_stages; s++) {
        if (c->o.straight) assert_int_equal(p->stages[s].replicas, 1);
        for (int r = 0; r < p->stages[s].replicas; r++) assert_int_equal(p->stages[s].ranks[r], rank++);
    }
    int r0 = p->stages[0].replicas;
    assert_int_equal(p->noam, (p->n_workers + r0 - 1) / r0);
    double worst = 0;
    for (int s = 0; s < p->n_stages; s++) worst = fmax(worst, p->stages[s].time_s);
    if (c->o.cost_model == COST_OURS) assert_true(close_rel(worst, p->pipeline_s)); /* the bottleneck */
}

static void run_random(int model, int dag, int cases, int max_n, int max_w, int max_levels, uint64_t seed) {
    Rng rng;
    rng_init(&rng, seed, 77, (uint64_t)(model * 2 + dag));
    int compared = 0, infeasible = 0, crashes = 0;
    for (int t = 0; t < cases; t++) {
        Case c;
        make_case(&c, &rng, dag, max_n, max_w, max_levels);
        c.o.cost_model = model;
        if (model == COST_PIPEDREAM) c.o.overlap_allreduce = 0;
        Err err = {0};
        Plan *p = plan_new(&c.prof, &c.cl, &c.o, &err);
        double want;
        if (model == COST_OURS) {
            want = ours_brute(&c);
        } else {
            PGraph g;
            PStates st;
            assert_int_equal(pgraph_build(&c.prof, &g, &err), PD_OK);
            assert_int_equal(pstates_build(&g, 100000, &st, &err), PD_OK);
            want = compat_brute(&c, &st);
            pstates_release(&st);
            pgraph_release(&g);
        }
        if (!p && strstr(err.msg, "zero compute time")) {
            assert_true(want == 0); /* nothing to balance: an error, not a plan */
            infeasible++;
        } else if (!p && strstr(err.msg, "unrelated cut states")) {
            crashes++; /* the compat optimum uses a garbage segment: no runnable plan */
            assert_true(model == COST_PIPEDREAM && c.cl.n_levels > 1 && dag);
            assert_non_null(strstr(err.msg, "unrelated"));
        } else if (!p && strstr(err.msg, "crashes here (TypeError")) {
            crashes++; /* the authors' program crashes too: nothing to compare */
            assert_true(model == COST_PIPEDREAM && c.o.allow_idle && c.o.memory_limit > 0);
        } else if (isnan(want)) {
            if (p) fprintf(stderr, "case %d: brute force finds no plan, the planner %.17g\n", t, p->pipeline_s);
            assert_null(p);
            assert_non_null(strstr(err.msg, "no feasible"));
            infeasible++;
        } else {
            if (!p || !close_rel(p->pipeline_s, want)) {
                fprintf(stderr, "case %d (model %d, dag %d, n %d, levels %d, W %d, straight %d, idle %d, mem %g, "
                        "ratio %g, overlap %d): planner %s %.17g, brute force %.17g\n",
                        t, model, dag, c.n, c.cl.n_levels, cluster_total_workers(&c.cl), c.o.straight, c.o.allow_idle,
                        c.o.memory_limit, c.o.activation_compression, c.o.overlap_allreduce, p ? "" : err.msg,
                        p ? p->pipeline_s : NAN, want);
                fail();
            }
            check_plan_shape(p, &c);
            compared++;
        }
        plan_free(p);
        free_case(&c);
    }
    print_message("model %d dag %d: %d compared with brute force, %d infeasible in both, %d authors' crashes\n",
                  model, dag, compared, infeasible, crashes);
    assert_true(compared > cases / 2);
}

static void test_ours_chain_exhaustive(void **state) {
    (void)state;
    run_random(COST_OURS, 0, 1000, 10, 8, 3, 1);
}
static void test_ours_dag_exhaustive(void **state) {
    (void)state;
    run_random(COST_OURS, 1, 600, 7, 8, 3, 2);
}
static void test_compat_chain_exhaustive(void **state) {
    (void)state;
    run_random(COST_PIPEDREAM, 0, 1000, 10, 8, 1, 3); /* one level: the whole range */
    run_random(COST_PIPEDREAM, 0, 400, 6, 8, 3, 4);  /* hierarchical */
}
static void test_compat_dag_exhaustive(void **state) {
    (void)state;
    run_random(COST_PIPEDREAM, 1, 600, 7, 8, 1, 5);
    run_random(COST_PIPEDREAM, 1, 300, 5, 8, 3, 6);
}

/* Same inputs, same plan (boundaries and replicas, not only the value). */
static void test_deterministic(void **state) {
    (void)state;
    Rng rng;
    rng_init(&rng, 9, 1, 1);
    for (int t = 0; t < 30; t++) {
        Case c;
        make_case(&c, &rng, t % 2, 9, 8, 2);
        c.o.memory_limit = 0;
        c.o.cost_model = t % 3 == 0 ? COST_PIPEDREAM : COST_OURS;
        Err err = {0};
        Plan *a = plan_new(&c.prof, &c.cl, &c.o, &err), *b = plan_new(&c.prof, &c.cl, &c.o, &err);
        assert_true((a == NULL) == (b == NULL));
        if (a) {
            assert_int_equal(a->n_stages, b->n_stages);
            for (int s = 0; s < a->n_stages; s++) {
                assert_int_equal(a->stages[s].replicas, b->stages[s].replicas);
                assert_int_equal(a->stages[s].n_layers, b->stages[s].n_layers);
                assert_memory_equal(a->stages[s].layers, b->stages[s].layers, sizeof(int) * a->stages[s].n_layers);
            }
            assert_true(a->pipeline_s == b->pipeline_s);
        }
        plan_free(a);
        plan_free(b);
        free_case(&c);
    }
}

static void test_plan_json_round_trip(void **state) {
    (void)state;
    Rng rng;
    rng_init(&rng, 11, 1, 1);
    char path[128];
    snprintf(path, sizeof path, "/tmp/pd_test_plan_%d.json", (int)getpid());
    for (int t = 0; t < 6; t++) {
        Case c;
        make_case(&c, &rng, t % 2, 8, 8, 2);
        c.o.memory_limit = 0;
        c.o.straight = 0;
        c.o.cost_model = t % 3 == 0 ? COST_PIPEDREAM : COST_OURS;
        c.prof.checksum = 0xdeadbeefu;
        Err err = {0};
        Plan *a = plan_new(&c.prof, &c.cl, &c.o, &err);
        assert_non_null(a);
        assert_int_equal(plan_save(a, path, &err), PD_OK);
        Plan *b = plan_load(path, &err);
        if (!b) fprintf(stderr, "%s\n", err.msg);
        assert_non_null(b);
        assert_int_equal(b->n_stages, a->n_stages);
        assert_int_equal(b->n_workers, a->n_workers);
        assert_int_equal(b->noam, a->noam);
        assert_int_equal(b->profile_checksum, 0xdeadbeefu);
        assert_true(b->pipeline_s == a->pipeline_s && b->single_s == a->single_s && b->dp_s == a->dp_s);
        assert_int_equal(b->opts.cost_model, a->opts.cost_model);
        assert_true(b->opts.activation_compression == a->opts.activation_compression);
        assert_int_equal(b->cluster.n_levels, a->cluster.n_levels);
        assert_int_equal(b->n_edges, a->n_edges);
        for (int s = 0; s < a->n_stages; s++) {
            assert_int_equal(b->stages[s].replicas, a->stages[s].replicas);
            assert_memory_equal(b->stages[s].layers, a->stages[s].layers, sizeof(int) * a->stages[s].n_layers);
            assert_memory_equal(b->stages[s].ranks, a->stages[s].ranks, sizeof(int) * a->stages[s].replicas);
            assert_true(b->stages[s].time_s == a->stages[s].time_s);
            int rep = -1;
            assert_int_equal(plan_stage_of_rank(b, b->stages[s].ranks[0], &rep), s);
            assert_int_equal(rep, 0);
        }
        assert_int_equal(plan_stage_of_rank(b, b->n_workers, NULL), -1);
        plan_free(a);
        plan_free(b);
        free_case(&c);
    }
    unlink(path);
}

/* A chain of n layers, layer i taking fwd_s * (i + 1) seconds forward and backward. */
static void small_chain(Profile *prof, int n, double fwd_s) {
    memset(prof, 0, sizeof *prof);
    prof->n_layers = n;
    prof->layers = calloc((size_t)n, sizeof *prof->layers);
    for (int i = 0; i < n; i++) prof->layers[i].fwd_s = prof->layers[i].bwd_s = fwd_s * (i + 1);
}

/* plan_validate catches each broken invariant, naming it. */
static void test_validate(void **state) {
    (void)state;
    Profile prof;
    small_chain(&prof, 4, 0.01);
    Cluster cl = {.n_levels = 1, .level = {{4, 1e9, 0}}};
    PlanOpts o = {0};
    o.straight = 1;
    Err err = {0};
    Plan *p = plan_new(&prof, &cl, &o, &err);
    assert_non_null(p);
    assert_int_equal(p->n_stages, 4);
    assert_int_equal(plan_validate(p, 4, &err), PD_OK);
    assert_int_equal(plan_validate(p, 5, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "the profile has 5"));
    int saved = p->stages[1].layers[0];
    p->stages[1].layers[0] = 0; /* layer 0 twice, layer 1 nowhere */
    assert_int_equal(plan_validate(p, 4, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "layer 0 is in stage 0 and in stage 1"));
    p->stages[1].layers[0] = saved;
    int a = p->stages[1].layers[0];
    p->stages[1].layers[0] = p->stages[2].layers[0];
    p->stages[2].layers[0] = a; /* stages 1 and 2 swapped: not contiguous in order */
    assert_int_equal(plan_validate(p, 4, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "not contiguous"));
    p->stages[2].layers[0] = p->stages[1].layers[0];
    p->stages[1].layers[0] = a;
    p->stages[3].replicas = 2;
    p->stages[3].ranks = realloc(p->stages[3].ranks, 2 * sizeof(int));
    p->stages[3].ranks[1] = 0;
    assert_int_equal(plan_validate(p, 4, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "replicas sum to 5"));
    p->n_workers = 5;
    assert_int_equal(plan_validate(p, 4, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "cluster has 4"));
    p->cluster.level[0].workers = 5;
    assert_int_equal(plan_validate(p, 4, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "rank 0 runs two stages"));
    p->stages[3].ranks[1] = 4;
    p->noam = 7;
    assert_int_equal(plan_validate(p, 4, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "noam"));
    p->noam = 5;
    assert_int_equal(plan_validate(p, 4, &err), PD_OK);
    /* memory: a limit the plan exceeds */
    p->opts.memory_limit = 1;
    prof.layers[3].param_bytes = 100;
    assert_int_equal(plan_check_memory(p, &prof, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "stage 3"));
    plan_free(p);
    profile_release(&prof);
}

/* Bad clusters and options give clear errors. */
static void test_bad_cluster(void **state) {
    (void)state;
    Profile prof;
    small_chain(&prof, 2, 1);
    PlanOpts o = {0};
    Err err = {0};
    Cluster cl = {.n_levels = 1, .level = {{4, 0, 0}}};
    assert_null(plan_new(&prof, &cl, &o, &err));
    assert_non_null(strstr(err.msg, "bandwidth must be a positive"));
    cl.level[0] = (ClusterLevel){0, 1e9, 0};
    assert_null(plan_new(&prof, &cl, &o, &err));
    assert_non_null(strstr(err.msg, "workers must be at least 1"));
    cl.level[0] = (ClusterLevel){2, 1e9, -1};
    assert_null(plan_new(&prof, &cl, &o, &err));
    assert_non_null(strstr(err.msg, "latency"));
    cl.level[0] = (ClusterLevel){2, NAN, 0};
    assert_null(plan_new(&prof, &cl, &o, &err));
    assert_non_null(strstr(err.msg, "bandwidth"));
    cl.level[0] = (ClusterLevel){2, 1e9, 0};
    cl.n_levels = 0;
    assert_null(plan_new(&prof, &cl, &o, &err));
    assert_non_null(strstr(err.msg, "levels"));
    cl.n_levels = 1;
    prof.layers[1].bwd_s = NAN;
    assert_null(plan_new(&prof, &cl, &o, &err));
    assert_non_null(strstr(err.msg, "not finite"));
    prof.layers[1].bwd_s = 0;
    o.straight = 1;
    cl.level[0].workers = 3; /* 3 stages from 2 layers */
    assert_null(plan_new(&prof, &cl, &o, &err));
    assert_non_null(strstr(err.msg, "no feasible plan"));
    o.cost_model = COST_PIPEDREAM;
    assert_null(plan_new(&prof, &cl, &o, &err));
    assert_non_null(strstr(err.msg, "no feasible"));
    o.allow_idle = 1; /* two of three workers is fine then */
    Plan *p = plan_new(&prof, &cl, &o, &err);
    assert_non_null(p);
    assert_int_equal(p->n_workers, 2);
    plan_free(p);
    /* a cluster file with a typo */
    char path[128];
    snprintf(path, sizeof path, "/tmp/pd_test_cluster_%d.json", (int)getpid());
    FILE *f = fopen(path, "w");
    fputs("{\"levels\": [{\"workers\": 4, \"bandwith\": 1e9}]}", f);
    fclose(f);
    Cluster c2;
    assert_int_equal(cluster_load(path, &c2, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "bandwidth"));
    f = fopen(path, "w");
    fputs("{\"format\": \"pipedream-cluster\", \"levels\": [{\"workers\": 4, \"bandwidth\": 1e10, \"latency\": 1e-6}, "
          "{\"workers\": 2, \"bandwidth\": 1e9}], \"memory_per_worker\": 16e9}",
          f);
    fclose(f);
    assert_int_equal(cluster_load(path, &c2, &err), PD_OK);
    assert_int_equal(c2.n_levels, 2);
    assert_int_equal(cluster_total_workers(&c2), 8);
    assert_true(c2.level[0].latency == 1e-6 && c2.level[1].bandwidth == 1e9 && c2.memory_per_worker == 16e9);
    assert_int_equal(cluster_link_level(&c2, 0, 3), 0);
    assert_int_equal(cluster_link_level(&c2, 3, 4), 1);
    assert_int_equal(cluster_link_level(&c2, 5, 5), -1);
    unlink(path);
    profile_release(&prof);
}

/* plan_single: one stage of every layer on rank 0, valid, and saved and loaded like any plan. */
static void test_single(void **state) {
    (void)state;
    Plan *p = plan_single("tiny", 5);
    Err err = {0};
    assert_int_equal(plan_validate(p, 5, &err), PD_OK);
    assert_int_equal(p->n_stages, 1);
    assert_int_equal(p->n_workers, 1);
    assert_int_equal(p->stages[0].n_layers, 5);
    assert_int_equal(p->stages[0].layers[4], 4);
    assert_int_equal(p->stages[0].ranks[0], 0);
    assert_string_equal(p->model, "tiny");
    assert_int_equal(cluster_check(&p->cluster, &err), PD_OK);
    plan_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ours_chain_exhaustive),   cmocka_unit_test(test_ours_dag_exhaustive),
        cmocka_unit_test(test_compat_chain_exhaustive), cmocka_unit_test(test_compat_dag_exhaustive),
        cmocka_unit_test(test_deterministic),           cmocka_unit_test(test_plan_json_round_trip),
        cmocka_unit_test(test_validate),                cmocka_unit_test(test_bad_cluster),
        cmocka_unit_test(test_single),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
