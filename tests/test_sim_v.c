/* test_sim_v.c: the V-shaped kinds (zb-v, v-half, v-min, dualpipe-v) in the simulator, against
 * closed forms on uniform chains: 2 p one-layer stages in the V placement on p workers, every
 * chunk's F = BI = BW = one slot, free communication, one minibatch of m micro-batches. A worker
 * computes 6 m slots; the makespan is 6 m + X slots, the bubble fraction X / (6 m + X) on every
 * worker alike, and X is, with e as in the generators (schedule.c):
 *   zb-v        p - 1 + max(0, 2p - 2 - m)   (m >= p)
 *   v-half      3p + floor(p/2) - 2 - (p mod 2)
 *   v-min       4p - 5 + (2 if 3 divides p)
 *   dualpipe-v  p - 1                          (m >= 2p)
 * The papers state their bubbles for a worker's own span (first compute to last): zero for ZB-V
 * when F = B = W, and for DualPipeV (PP/2 - 1)(F&B + B - 3W) over PP = 2p stages, which is 0 per
 * worker here beyond the fill since BI and BW of a backward are one slot each; a flush with a step
 * that waits for every worker adds the fill, p - 1 slots (the last worker's first forward). ZB-V
 * needs m >= 2p - 2 for its warm-up to fill: with fewer, 2p - 2 - m slots more. V-Half's and
 * V-Min's bubbles are given as about p/(2m) and 2p/(3m) of the run (3p and 4p slots): the
 * building blocks repeated every 6 slots make them exactly the constants above, independent of m.
 * The peak activations, in (unit, chunk) pairs in flight (each half of a micro-batch's stage
 * activations), over the workers: zb-v 2p (p micro-batches, 1F1B's), v-half 2 floor((p + 2) / 2),
 * v-min 2 floor((p + 4) / 3) (the paper's (p + 2) // 2 and (p + 4) // 3 micro-batches), dualpipe-v
 * 2p + 1 (DualPipeV's PP + 1). The test prints the table (docs/explanation/schedules.md). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

/* 2 P one-layer stages, stage s on rank plan_v_rank(s, P, 1, 0). */
static Plan *v_plan(int P) {
    Plan *p = calloc(1, sizeof *p);
    int S = 2 * P;
    p->n_stages = p->n_layers = S;
    p->stages = calloc((size_t)S, sizeof *p->stages);
    for (int i = 0; i < S; i++) {
        PlanStage *st = &p->stages[i];
        st->n_layers = 1;
        st->layers = malloc(sizeof(int));
        st->layers[0] = i;
        st->replicas = 1;
        st->ranks = malloc(sizeof(int));
        st->ranks[0] = plan_v_rank(i, P, 1, 0);
    }
    p->n_workers = P;
    p->chunks = 2;
    p->v_shape = 1;
    return p;
}

static void free_plan(Plan *p) {
    for (int i = 0; i < p->n_stages; i++) free(p->stages[i].layers), free(p->stages[i].ranks);
    free(p->stages);
    free(p);
}

static int extra_slots(SchedKind k, int p, int m) {
    switch (k) {
    case SCHED_ZB_V: return p - 1 + (2 * p - 2 - m > 0 ? 2 * p - 2 - m : 0);
    case SCHED_V_HALF: return 3 * p + p / 2 - 2 - p % 2;
    case SCHED_V_MIN: return 4 * p - 5 + (p % 3 == 0 ? 2 : 0);
    case SCHED_DUALPIPE_V: return p - 1;
    default: fail_msg("kind %d", (int)k);
    }
    return -1;
}

static int peak_pairs(SchedKind k, int p) {
    switch (k) {
    case SCHED_ZB_V: return 2 * p;
    case SCHED_V_HALF: return 2 * ((p + 2) / 2);
    case SCHED_V_MIN: return 2 * ((p + 4) / 3);
    case SCHED_DUALPIPE_V: return 2 * p + 1;
    default: fail_msg("kind %d", (int)k);
    }
    return -1;
}

static const SchedKind KINDS[] = {SCHED_ZB_V, SCHED_V_HALF, SCHED_V_MIN, SCHED_DUALPIPE_V};

/* Builds kind k on the V plan of P workers (m micro-batches, n minibatches) and simulates it with
 * F = 1, BI = BW = 1 per chunk and one byte of activations per unit and chunk. */
static int run_v(SchedKind k, int P, int m, int n, int recompute, Schedule *s, SimResult *r, Err *err) {
    Plan *p = v_plan(P);
    SchedOpts o = {.kind = k, .n_minibatches = n, .n_micro = m, .recompute = recompute};
    int rc = sched_build(p, &o, s, err);
    free_plan(p);
    if (rc) return rc;
    SimCosts c = {2 * P, calloc((size_t)2 * P, sizeof(SimStageCost))};
    for (int i = 0; i < 2 * P; i++)
        c.stage[i] = (SimStageCost){.fwd_s = 1, .bwd_s = 2, .bwd_in_s = 1, .bwd_w_s = 1, .param_bytes = 1,
                                    .stash_bytes = 1};
    SimOpts so = {NULL, 1, 0, 0, 0, 0, NULL, 0};
    rc = sim_run(s, &c, &so, r, err);
    sim_costs_release(&c);
    if (rc) sched_release(s);
    return rc;
}

/* The closed forms for p in {2, 4, 8} and m in {p, 2p, 4p}, printed as a table. */
static void test_closed_forms(void **state) {
    (void)state;
    print_message("%-11s %2s %3s %10s %10s %12s %16s  per worker\n", "kind", "p", "m", "bubble", "form", "makespan",
                  "peak (pairs)");
    for (size_t ki = 0; ki < sizeof KINDS / sizeof KINDS[0]; ki++)
        for (int P = 2; P <= 8; P *= 2)
            for (int mult = 1; mult <= 4; mult *= 2) {
                SchedKind k = KINDS[ki];
                int m = mult * P;
                Schedule s;
                SimResult r;
                Err err = {0};
                int rc = run_v(k, P, m, 1, 0, &s, &r, &err);
                if (k == SCHED_DUALPIPE_V && m < 2 * P) {   /* DualPipeV is defined for m >= 2p */
                    assert_int_equal(rc, PD_EINVAL);
                    assert_non_null(strstr(err.msg, "at least"));
                    print_message("%-11s %2d %3d %10s (needs m >= 2p)\n", sched_kind_name(k), P, m, "-");
                    continue;
                }
                if (rc) fail_msg("%s p %d m %d: %s", sched_kind_name(k), P, m, err.msg);
                int X = extra_slots(k, P, m);
                double form = (double)X / (6.0 * m + X);
                char per[128] = "";
                size_t len = 0;
                int peak = 0;
                for (int w = 0; w < P; w++) {
                    len += (size_t)snprintf(per + len, sizeof per - len, "%s%d", w ? " " : "", r.max_inflight[w]);
                    if (r.max_inflight[w] > peak) peak = r.max_inflight[w];
                    /* the simulator's activations: one byte per (unit, chunk) pair in flight */
                    assert_true(r.mem[w].activations == r.max_inflight[w]);
                    /* every worker computes its 6 m slots */
                    assert_true(fabs(r.busy_fraction[w] * r.makespan_s - 6.0 * m) < 1e-9);
                }
                print_message("%-11s %2d %3d %10.6f %10.6f %12g %9d (%d)  %s\n", sched_kind_name(k), P, m,
                              r.bubble_fraction, form, r.makespan_s, peak, peak_pairs(k, P), per);
                if (fabs(r.makespan_s - (6.0 * m + X)) > 1e-9)
                    fail_msg("%s p %d m %d: makespan %g, want 6m + %d = %d", sched_kind_name(k), P, m, r.makespan_s, X,
                             6 * m + X);
                if (fabs(r.bubble_fraction - form) > 1e-12)
                    fail_msg("%s p %d m %d: bubble %.12f, want %.12f", sched_kind_name(k), P, m, r.bubble_fraction, form);
                assert_int_equal(peak, peak_pairs(k, P));
                if (k == SCHED_ZB_V && m >= 2 * P)   /* every worker at 1F1B's peak */
                    for (int w = 0; w < P; w++) assert_int_equal(r.max_inflight[w], 2 * P);
                sim_result_release(&r);
                sched_release(&s);
            }
}

/* The analysis accepts them: one version (a flush), every forward's unit leaves flight at its BW,
 * the turn at the last worker is a message to itself, and two minibatches take twice one. */
static void test_analysis_and_turn(void **state) {
    (void)state;
    for (size_t ki = 0; ki < sizeof KINDS / sizeof KINDS[0]; ki++) {
        SchedKind k = KINDS[ki];
        int P = 4, m = 8;
        Schedule s;
        SimResult r, r2;
        Err err = {0};
        if (run_v(k, P, m, 1, 0, &s, &r, &err)) fail_msg("%s: %s", sched_kind_name(k), err.msg);
        SchedAnalysis a;
        assert_int_equal(sched_analyze(&s, &a, &err), PD_OK);
        for (int w = 0; w < P; w++) {
            assert_int_equal(a.workers[w].n_versions, 2);
            assert_int_equal(a.workers[w].max_versions_alive, 1);
            assert_int_equal(a.workers[w].n_chunks, 2);
            assert_int_equal(a.workers[w].n_units, 2 * m);
            assert_int_equal(a.workers[w].max_inflight, r.max_inflight[w]);
            assert_int_equal(s.workers[w].stages[0], w);
            assert_int_equal(s.workers[w].stages[1], 2 * P - 1 - w);
        }
        int self = 0;
        for (int i = 0; i < s.workers[P - 1].n; i++) {
            const Instr *in = &s.workers[P - 1].ins[i];
            self += (in->op == OP_SEND_ACT || in->op == OP_SEND_GRAD) && in->peer == P - 1;
        }
        assert_int_equal(self, 2 * m);   /* each unit's activation and gradient at the turn */
        sched_analysis_release(&a);
        sched_release(&s);
        if (run_v(k, P, m, 2, 0, &s, &r2, &err)) fail_msg("%s: %s", sched_kind_name(k), err.msg);
        assert_true(fabs(r2.makespan_s - 2 * r.makespan_s) < 1e-9);
        sim_result_release(&r2);
        sim_result_release(&r);
        sched_release(&s);
        /* with recomputation: one forward more per backward that does not follow its own forward */
        if (run_v(k, P, m, 1, 1, &s, &r, &err)) fail_msg("%s recompute: %s", sched_kind_name(k), err.msg);
        sim_result_release(&r);
        sched_release(&s);
    }
}

/* What a V kind refuses: a round-robin plan, too few micro-batches for zb-v. */
static void test_refusals(void **state) {
    (void)state;
    Plan *p = v_plan(4);
    p->stages[7].ranks[0] = 3;   /* stage 7 must be with stage 0 */
    p->stages[4].ranks[0] = 0;
    SchedOpts o = {.kind = SCHED_ZB_V, .n_minibatches = 1, .n_micro = 4};
    Schedule s;
    Err err = {0};
    assert_int_equal(sched_build(p, &o, &s, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "V placement"));
    free_plan(p);
    p = v_plan(4);
    o.n_micro = 3;
    assert_int_equal(sched_build(p, &o, &s, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "at least 4"));
    free_plan(p);
    SchedKind k;
    assert_int_equal(sched_kind_parse("dualpipe-v", &k), PD_OK);
    assert_int_equal(k, SCHED_DUALPIPE_V);
    assert_string_equal(sched_kind_name(SCHED_V_HALF), "v-half");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_closed_forms),
        cmocka_unit_test(test_analysis_and_turn),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
