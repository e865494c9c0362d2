/* test_sim_latency.c: a link's latency in the simulator, and how many units in flight hide it, on a
 * uniform chain of P = 4 stages (F = 10 ms, B = 20 ms per unit: t = 30 ms) whose messages take
 * lat = 20 ms one way (a 40 ms round trip) and no time on the wire. Closed forms:
 *   1f1b, h more units in flight per boundary (depth D = 1 + (P - 1) h at stage 0, 1 + (P - 1 - i) h
 *     at stage i): for stages i < j, stage i's units beyond stage j's, d h + 1 of them (d = j - i),
 *     must cover d + 1 stages' compute and d round trips, so a unit takes the most over d of
 *     max(t, ((d + 1) t + 2 d lat) / (d h + 1)); hidden from h = ceil(1 + 2 lat / t) on
 *     (sched_inflight_hides: D = 10 here). NOAM (h = 1, D = P) stalls: (4 t + 6 lat) / 4 = 60 ms a unit.
 *   1f1b with M micro-batches per minibatch (units of t / M) at NOAM depth: a minibatch takes
 *     M (t / M + 2 (P - 1) lat / P) = t + 2 (P - 1) lat M / P: more micro-batches stall more, since
 *     1F1B's order holds P units in flight however small; the depth for t / M hides it again.
 *   gpipe, M micro-batches: every one of them in flight, but the flush waits for the last one's
 *     round trip: (M + P - 1) t / M + 2 (P - 1) lat per minibatch, the latency never hidden.
 * Without latency every depth takes t. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define assert_near(a, b, tol)                                                                          \
    do {                                                                                                \
        double a_ = (a), b_ = (b);                                                                      \
        if (!(fabs(a_ - b_) <= (tol))) fail_msg("%s = %.15g, want %.15g (tolerance %g)", #a, a_, b_, (double)(tol)); \
    } while (0)

enum { P = 4 };
static const double F = 0.010, B = 0.020, LAT = 0.020;

static Plan *chain_plan(void) {
    Plan *p = calloc(1, sizeof *p);
    p->n_stages = P;
    p->n_layers = P;
    p->stages = calloc(P, sizeof *p->stages);
    for (int i = 0; i < P; i++) {
        PlanStage *st = &p->stages[i];
        st->n_layers = 1;
        st->layers = malloc(sizeof(int));
        st->layers[0] = i;
        st->replicas = 1;
        st->ranks = malloc(sizeof(int));
        st->ranks[0] = i;
    }
    p->n_workers = P;
    return p;
}

static void free_plan(Plan *p) {
    for (int i = 0; i < p->n_stages; i++) free(p->stages[i].layers), free(p->stages[i].ranks);
    free(p->stages);
    free(p);
}

/* Time per minibatch of kind k with M micro-batches per minibatch and depth D (0: the kind's own) on
 * the chain, every message lat late; 1 KB messages on links of 1 TB/s (1 ns each). */
static double minibatch_s(SchedKind k, int M, int D, double lat) {
    Plan *p = chain_plan();
    SimCosts c = {P, calloc(P, sizeof(SimStageCost))};
    for (int i = 0; i < P; i++)
        c.stage[i] = (SimStageCost){.fwd_s = F, .bwd_s = B, .param_bytes = 1000, .in_bytes = 1000, .stash_bytes = 2000};
    sim_costs_scale(&c, 1.0 / M);
    Cluster cl;
    memset(&cl, 0, sizeof cl);
    cl.n_levels = 1;
    cl.level[0] = (ClusterLevel){P, 1e12, lat};
    int n = k == SCHED_1F1B ? (8 * (D > P ? D : P) + 16) / M + 8 : 8;
    SchedOpts o = {.kind = k, .n_minibatches = n, .n_micro = M, .inflight = D};
    Schedule s;
    SimResult r;
    Err err = {0};
    if (sched_build(p, &o, &s, &err)) fail_msg("sched_build %s: %s", sched_kind_name(k), err.msg);
    SimOpts so = {.cluster = &cl, .opt_state_factor = 1};
    if (sim_run(&s, &c, &so, &r, &err)) fail_msg("sim_run %s: %s", sched_kind_name(k), err.msg);
    /* the depth is what stage 0 holds: its most units between forward and backward */
    if (k == SCHED_1F1B) assert_int_equal(r.max_inflight[0], D > P ? D : P);
    double t = r.time_per_minibatch_s;
    sim_result_release(&r);
    sched_release(&s);
    sim_costs_release(&c);
    free_plan(p);
    return t;
}

/* The closed form of the header for h units per boundary. */
static double unit_s_depth(int h, double t, double lat) {
    double worst = t;
    for (int d = 1; d < P; d++) {
        double u = ((d + 1) * t + 2 * d * lat) / (d * h + 1);
        if (u > worst) worst = u;
    }
    return worst;
}

static void test_depth_hides_latency(void **state) {
    (void)state;
    double t = F + B;
    int hide = sched_inflight_hides(P, t, LAT);
    assert_int_equal(hide, 10);   /* 1 + 3 ceil(1 + 40 / 30) */
    assert_int_equal(sched_inflight_hides(P, t, 0), P);
    for (int h = 1; h <= 4; h++)
        assert_near(minibatch_s(SCHED_1F1B, 1, 1 + (P - 1) * h, LAT), unit_s_depth(h, t, LAT), 1e-6);
    assert_near(minibatch_s(SCHED_1F1B, 1, 0, LAT), 0.060, 1e-6);
    assert_near(minibatch_s(SCHED_1F1B, 1, hide, LAT), t, 1e-6);
    /* the stall is the latency's: without it NOAM already keeps every stage busy */
    assert_near(minibatch_s(SCHED_1F1B, 1, 0, 0), t, 1e-6);
    assert_near(minibatch_s(SCHED_1F1B, 1, hide, 0), t, 1e-6);
    /* one short of the depth per boundary stalls */
    assert_true(minibatch_s(SCHED_1F1B, 1, hide - (P - 1), LAT) > t * 1.1);
}

static void test_microbatches_need_depth(void **state) {
    (void)state;
    double t = F + B;
    for (int M = 1; M <= 8; M *= 2) {
        assert_near(minibatch_s(SCHED_1F1B, M, 0, LAT), t + 2 * (P - 1) * LAT * M / P, 1e-6);
        int hide = sched_inflight_hides(P, t / M, LAT);
        assert_near(minibatch_s(SCHED_1F1B, M, hide, LAT), t, 1e-6);
    }
}

static void test_flush_pays_round_trip(void **state) {
    (void)state;
    double t = F + B;
    for (int M = 1; M <= 16; M *= 2) {
        assert_near(minibatch_s(SCHED_GPIPE, M, 0, LAT), (M + P - 1) * t / M + 2 * (P - 1) * LAT, 1e-6);
        assert_near(minibatch_s(SCHED_GPIPE, M, 0, 0), (M + P - 1) * t / M, 1e-6);
    }
}

/* A depth is 1f1b's alone, and a depth within NOAM changes nothing. */
static void test_depth_options(void **state) {
    (void)state;
    Plan *p = chain_plan();
    Schedule s, s0;
    Err err = {0};
    SchedOpts o = {.kind = SCHED_GPIPE, .n_minibatches = 4, .n_micro = 4, .inflight = 6};
    assert_int_equal(sched_build(p, &o, &s, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "only to 1f1b"));
    o = (SchedOpts){.kind = SCHED_1F1B, .n_minibatches = 12, .n_micro = 1, .inflight = 3};
    SchedOpts o0 = {.kind = SCHED_1F1B, .n_minibatches = 12, .n_micro = 1};
    assert_int_equal(sched_build(p, &o, &s, &err), PD_OK);
    assert_int_equal(sched_build(p, &o0, &s0, &err), PD_OK);
    for (int w = 0; w < P; w++) {
        assert_int_equal(s.workers[w].n, s0.workers[w].n);
        assert_memory_equal(s.workers[w].ins, s0.workers[w].ins, (size_t)s.workers[w].n * sizeof(Instr));
    }
    sched_release(&s);
    sched_release(&s0);
    /* depth 8: 1 + ceil(7 (3 - i) / 3) at stage i */
    o.inflight = 8;
    assert_int_equal(sched_build(p, &o, &s, &err), PD_OK);
    static const int want[P] = {8, 6, 4, 1};
    for (int i = 0; i < P; i++) assert_int_equal(s.stages[i].warmup, want[i]);
    sched_release(&s);
    free_plan(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_depth_hides_latency),
        cmocka_unit_test(test_microbatches_need_depth),
        cmocka_unit_test(test_flush_pays_round_trip),
        cmocka_unit_test(test_depth_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
