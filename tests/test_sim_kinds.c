/* test_sim_kinds.c: the kinds past PipeDream's (zb-h1, zb-h2, interleaved) and recomputation
 * in the simulator, against closed forms on uniform chains with free communication:
 *   1f1b-flush  bubble (p-1)(F+B)       / (M(F+B)   + (p-1)(F+B))      = (p-1)/(M+p-1)
 *   zb-h1       bubble (p-1)(F+B-W)     / (M(F+B+W) + (p-1)(F+B-W))    (B, W: the backward's halves)
 *   interleaved bubble (p-1)(F+B)/V     / (M(F+B)   + (p-1)(F+B)/V)    (F, B of a worker's V chunks)
 * (for p = 4, F = 10 ms, B = 20 ms, M = 8: 3/11, 1/9 and (3*30/2)/(240+45));
 * ZB-H1's peak activation memory equals 1F1B-flush's; recomputation's memory (inputs of the
 * units in flight plus one unit's activations) and time (one more forward per backward that
 * does not follow its own forward); the split backward from a profile; the optimizer step
 * (a profile's step_s) charged once per step: 1f1b-flush's minibatch (M + p - 1)(F + B) + S; units
 * smaller than the profile's minibatch costed from its two batches (fixed parts). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim.h"

#define assert_near(a, b, tol)                                                                          \
    do {                                                                                                \
        double a_ = (a), b_ = (b);                                                                      \
        if (!(fabs(a_ - b_) <= (tol))) fail_msg("%s = %.15g, want %.15g (tolerance %g)", #a, a_, b_, (double)(tol)); \
    } while (0)

/* S one-layer stages; V = 1: stage i on rank i; V > 1: S = V p stages round-robin on p ranks. */
static Plan *chain_plan(int S, int V) {
    Plan *p = calloc(1, sizeof *p);
    p->n_stages = S;
    p->n_layers = S;
    p->stages = calloc((size_t)S, sizeof *p->stages);
    for (int i = 0; i < S; i++) {
        PlanStage *st = &p->stages[i];
        st->n_layers = 1;
        st->layers = malloc(sizeof(int));
        st->layers[0] = i;
        st->replicas = 1;
        st->ranks = malloc(sizeof(int));
        st->ranks[0] = i % (S / V);
    }
    p->n_workers = S / V;
    return p;
}

static void free_plan(Plan *p) {
    for (int i = 0; i < p->n_stages; i++) free(p->stages[i].layers), free(p->stages[i].ranks);
    free(p->stages);
    free(p);
}

static SimCosts costs(int S, double f, double b, double in, double stash) {
    SimCosts c = {S, calloc((size_t)S, sizeof(SimStageCost))};
    for (int i = 0; i < S; i++) c.stage[i] = (SimStageCost){.fwd_s = f, .bwd_s = b, .param_bytes = 1000, .in_bytes = in,
                                                           .stash_bytes = stash};
    return c;
}

/* Builds kind on plan p (M micro-batches, n minibatches) and simulates it with free links. */
static void sim(const Plan *p, SchedKind k, int n, int M, int rc, const SimCosts *c, Schedule *s, SimResult *r) {
    SchedOpts o = {.kind = k, .n_minibatches = n, .n_micro = M, .recompute = rc};
    Err err = {0};
    if (sched_build(p, &o, s, &err)) fail_msg("sched_build %s: %s", sched_kind_name(k), err.msg);
    SimOpts so = {NULL, 1, 0, 0, 0, 0, NULL, 0};
    if (sim_run(s, c, &so, r, &err)) fail_msg("sim_run %s: %s", sched_kind_name(k), err.msg);
}

static double max_activations(const SimResult *r) {
    double m = 0;
    for (int w = 0; w < r->n_ranks; w++)
        if (r->mem[w].activations > m) m = r->mem[w].activations;
    return m;
}

/* The three bubbles for p = 4, F = 10 ms, B = 20 ms, M = 8. */
static void test_three_bubbles(void **state) {
    (void)state;
    Schedule s;
    SimResult r;
    Plan *p = chain_plan(4, 1);
    SimCosts c = costs(4, 0.010, 0.020, 0, 0);
    sim(p, SCHED_1F1B_FLUSH, 1, 8, 0, &c, &s, &r);
    assert_near(r.bubble_fraction, 3.0 / 11, 1e-9);
    assert_near(r.makespan_s, 0.330, 1e-12);
    print_message("1f1b-flush: bubble %.9f (3/11 = %.9f), makespan %.6g s\n", r.bubble_fraction, 3.0 / 11, r.makespan_s);
    sim_result_release(&r), sched_release(&s);
    sim(p, SCHED_ZB_H1, 1, 8, 0, &c, &s, &r);
    assert_near(r.bubble_fraction, 1.0 / 9, 1e-9);
    assert_near(r.makespan_s, 0.270, 1e-12);
    print_message("zb-h1: bubble %.9f (1/9 = %.9f), makespan %.6g s\n", r.bubble_fraction, 1.0 / 9, r.makespan_s);
    sim_result_release(&r), sched_release(&s);
    sim_costs_release(&c);
    free_plan(p);
    /* 8 one-layer stages of half the work, 2 chunks per worker */
    p = chain_plan(8, 2);
    c = costs(8, 0.005, 0.010, 0, 0);
    sim(p, SCHED_INTERLEAVED, 1, 8, 0, &c, &s, &r);
    assert_near(r.bubble_fraction, (3 * 0.030 / 2) / (0.240 + 0.045), 1e-9);
    assert_near(r.makespan_s, 0.285, 1e-12);
    print_message("interleaved: bubble %.9f ((3*30/2)/(240+45) = %.9f), makespan %.6g s\n", r.bubble_fraction,
                  (3 * 0.030 / 2) / (0.240 + 0.045), r.makespan_s);
    sim_result_release(&r), sched_release(&s);
    sim_costs_release(&c);
    free_plan(p);
}

/* The closed forms over pipeline depths, micro-batch counts, chunk counts and splits. */
static void test_closed_forms(void **state) {
    (void)state;
    Schedule s;
    SimResult r;
    for (int P = 2; P <= 6; P++)
        for (int mult = 1; mult <= 3; mult++) {
            int M = mult * P;
            double F = 1, B = 2;
            Plan *p = chain_plan(P, 1);
            SimCosts c = costs(P, F, B, 0, 0);
            sim(p, SCHED_1F1B_FLUSH, 2, M, 0, &c, &s, &r);
            /* two minibatches: the second's fill overlaps nothing (a flush), so each costs the same */
            assert_near(r.makespan_s, 2 * (M * (F + B) + (P - 1) * (F + B)), 1e-9);
            sim_result_release(&r), sched_release(&s);
            double splits[][2] = {{1, 1}, {0.5, 1.5}, {1.2, 0.8}};
            for (int k = 0; k < 3; k++) {
                double Bi = splits[k][0], Bw = splits[k][1];
                for (int i = 0; i < P; i++) c.stage[i].bwd_in_s = Bi, c.stage[i].bwd_w_s = Bw;
                sim(p, SCHED_ZB_H1, 1, M, 0, &c, &s, &r);
                double busy = M * (F + Bi + Bw), bub = (P - 1) * (F + Bi - Bw);
                /* the last stage idles (p-1) F before its first forward, so the form needs W <= B;
                 * else the bubble is (p-1) F */
                if (Bw <= Bi) {
                    assert_near(r.makespan_s, busy + bub, 1e-9);
                    assert_near(r.bubble_fraction, bub / (busy + bub), 1e-9);
                } else {
                    assert_near(r.makespan_s, busy + (P - 1) * F, 1e-9);
                }
                sim_result_release(&r), sched_release(&s);
            }
            sim_costs_release(&c);
            free_plan(p);
            for (int V = 2; V <= 4; V++) {
                p = chain_plan(P * V, V);
                c = costs(P * V, F / V, B / V, 0, 0);
                sim(p, SCHED_INTERLEAVED, 1, M, 0, &c, &s, &r);
                double busy = M * (F + B), bub = (P - 1) * (F + B) / V;
                if (M > P) {   /* M = p: Megatron runs all forwards first (more bubble) */
                    assert_near(r.makespan_s, busy + bub, 1e-9);
                    assert_near(r.bubble_fraction, bub / (busy + bub), 1e-9);
                }
                sim_result_release(&r), sched_release(&s);
                sim_costs_release(&c);
                free_plan(p);
            }
        }
}

/* ZB-H1 holds as many units (forward to weight gradient) as 1F1B-flush's input stage at every
 * stage: the peak over workers is the same. zb-h2 holds 2p - 1 at the input stage. */
static void test_zb_memory(void **state) {
    (void)state;
    for (int P = 1; P <= 6; P++)
        for (int M = 1; M <= 3 * P; M++) {
            Plan *p = chain_plan(P, 1);
            SimCosts c = costs(P, 1, 2, 100, 1000);
            Schedule s;
            SimResult r1, rz, r2;
            sim(p, SCHED_1F1B_FLUSH, 2, M, 0, &c, &s, &r1);
            sched_release(&s);
            sim(p, SCHED_ZB_H1, 2, M, 0, &c, &s, &rz);
            sched_release(&s);
            sim(p, SCHED_ZB_H2, 2, M, 0, &c, &s, &r2);
            sched_release(&s);
            assert_near(max_activations(&rz), max_activations(&r1), 0);
            int want = M < P ? M : P;
            assert_near(max_activations(&r1), want * 1000.0, 0);
            for (int w = 0; w < P; w++) {
                assert_true(rz.max_inflight[w] <= want);
                assert_int_equal(r1.max_inflight[w], M < P - w ? M : P - w);
                int h2 = 2 * (P - w) - 1 + w;   /* warm-up 2(p - w) - 1, w deferred weight passes */
                assert_true(r2.max_inflight[w] <= (M < h2 ? M : h2));
                assert_int_equal(rz.worker_versions[w], 1);
            }
            assert_int_equal(r2.max_inflight[0], M < 2 * P - 1 ? M : 2 * P - 1);
            /* and zb-h2 is never slower than zb-h1 here */
            assert_true(r2.makespan_s <= rz.makespan_s + 1e-9);
            sim_result_release(&r1), sim_result_release(&rz), sim_result_release(&r2);
            sim_costs_release(&c);
            free_plan(p);
        }
}

/* Recomputation: only inputs stay per unit in flight, plus one unit's activations while it is
 * recomputed and run backward (or during a forward); a backward that follows its own forward
 * needs no recompute (the last stage). */
static void test_recompute(void **state) {
    (void)state;
    const int P = 4, M = 8;
    Plan *p = chain_plan(P, 1);
    SimCosts c = costs(P, 1, 2, 100, 1000);
    Schedule s;
    SimResult r0, r1;
    sim(p, SCHED_1F1B_FLUSH, 1, M, 0, &c, &s, &r0);
    sched_release(&s);
    sim(p, SCHED_1F1B_FLUSH, 1, M, 1, &c, &s, &r1);
    for (int w = 0; w < P; w++) {
        int fly = P - w;
        assert_int_equal(r0.max_inflight[w], fly);
        assert_int_equal(r0.max_full[w], fly);
        assert_near(r0.mem[w].activations, fly * 1000.0, 0);
        assert_int_equal(r1.max_inflight[w], fly);
        assert_int_equal(r1.max_full[w], 1);
        assert_near(r1.mem[w].activations, fly * 100.0 + 900.0, 0);
        /* recomputes: every backward but those right after their forward */
        int nr = 0, nb = 0;
        for (int i = 0; i < s.workers[w].n; i++) nr += s.workers[w].ins[i].op == OP_RECOMPUTE,
                                                   nb += s.workers[w].ins[i].op == OP_BACKWARD;
        assert_int_equal(nb, M);
        assert_int_equal(nr, w == P - 1 ? 0 : M);
        assert_near(r1.busy_fraction[w] * r1.makespan_s, M * (3.0 + (w == P - 1 ? 0 : 1)), 1e-9);
        /* allocated: slots of inputs, max_full contexts, each with its own copy of the input as
         * the runtime's (nnctx_new) has */
        assert_near(r1.mem[w].alloc_activations, (fly + SCHED_SLOTS_AHEAD) * 100.0 + 1000.0, 0);
    }
    assert_true(r1.makespan_s > r0.makespan_s);
    sim_result_release(&r0), sim_result_release(&r1);
    sched_release(&s);
    /* every kind runs with recomputation and keeps at most as much as without */
    static const int kinds[] = {SCHED_1F1B, SCHED_GPIPE, SCHED_1F1B_FLUSH, SCHED_2BW, SCHED_DP,
                                SCHED_MP,   SCHED_ZB_H1, SCHED_ZB_H2,     SCHED_INTERLEAVED};
    for (size_t kk = 0; kk < sizeof kinds / sizeof kinds[0]; kk++) {
        int k = kinds[kk];
        Plan *q = k == SCHED_INTERLEAVED ? chain_plan(2 * P, 2) : p;
        SimCosts cq = k == SCHED_INTERLEAVED ? costs(2 * P, 0.5, 1, 100, 1000) : c;
        if (k == SCHED_DP) cq = costs(1, 4, 8, 100, 1000);
        int Mk = k == SCHED_1F1B || k == SCHED_DP || k == SCHED_MP ? 1 : M;
        sim(q, (SchedKind)k, 3, Mk, 0, &cq, &s, &r0);
        sched_release(&s);
        sim(q, (SchedKind)k, 3, Mk, 1, &cq, &s, &r1);
        for (int w = 0; w < s.n_ranks; w++) {
            assert_true(r1.mem[w].peak <= r0.mem[w].peak + 1e-9);
            assert_true(r1.max_full[w] <= r0.max_full[w]);
        }
        sim_result_release(&r0), sim_result_release(&r1);
        sched_release(&s);
        if (k == SCHED_INTERLEAVED) free_plan(q), sim_costs_release(&cq);
        if (k == SCHED_DP) sim_costs_release(&cq);
    }
    sim_costs_release(&c);
    free_plan(p);
}

/* Interleaved memory: a worker's chunks are weighed by their own bytes. */
static void test_interleaved_memory(void **state) {
    (void)state;
    Plan *p = chain_plan(8, 2);
    SimCosts c = costs(8, 1, 2, 0, 0);
    for (int i = 0; i < 8; i++) c.stage[i].stash_bytes = i < 4 ? 10 : 1000, c.stage[i].param_bytes = i + 1;
    Schedule s;
    SimResult r;
    sim(p, SCHED_INTERLEAVED, 1, 8, 0, &c, &s, &r);
    SchedAnalysis a;
    Err err = {0};
    assert_int_equal(sched_analyze(&s, &a, &err), PD_OK);
    for (int w = 0; w < 4; w++) {
        const SchedWorkerInfo *wi = &a.workers[w];
        int n = s.workers[w].n, *fly = malloc((size_t)n * 2 * sizeof(int));
        sched_worker_counts_chunks(&s, w, wi, NULL, fly, NULL);
        double best = 0;
        for (int i = 0; i < n; i++) {
            double b = fly[2 * i] * 10.0 + fly[2 * i + 1] * 1000.0;
            if (b > best) best = b;
        }
        assert_near(r.mem[w].activations, best, 0);
        assert_near(r.mem[w].params, (w + 1) + (w + 5), 0);
        /* Megatron's warm-up: 2 (p - r - 1) + (V - 1) p forwards before the first backward */
        assert_int_equal(s.stages[w].warmup, 2 * (4 - w - 1) + 4);
        free(fly);
    }
    sched_analysis_release(&a);
    sim_result_release(&r), sched_release(&s);
    sim_costs_release(&c);
    free_plan(p);
}

/* Profiles: the split backward per layer, half/half when absent. */
static void test_split_from_profile(void **state) {
    (void)state;
    ProfileLayer L[3] = {{.fwd_s = 1, .bwd_s = 4}, {.fwd_s = 1, .bwd_s = 2, .bwd_in_s = 0.5, .bwd_w_s = 1.25}, {.fwd_s = 1, .bwd_s = 6}};
    for (int i = 0; i < 3; i++) snprintf(L[i].type, sizeof L[i].type, "x");
    Profile prof = {.n_layers = 3, .layers = L};
    Plan *p = chain_plan(1, 1);
    p->n_layers = 3;
    p->stages[0].n_layers = 3;
    p->stages[0].layers = realloc(p->stages[0].layers, 3 * sizeof(int));
    for (int i = 0; i < 3; i++) p->stages[0].layers[i] = i;
    SchedOpts o = {.kind = SCHED_ZB_H1, .n_minibatches = 1, .n_micro = 1};
    Schedule s;
    Err err = {0};
    assert_int_equal(sched_build(p, &o, &s, &err), PD_OK);
    SimCosts c;
    assert_int_equal(sim_costs_from_profile(&s, &prof, &c, &err), PD_OK);
    assert_near(c.stage[0].bwd_s, 12, 0);
    assert_near(c.stage[0].bwd_in_s, 2 + 0.5 + 3, 0);
    assert_near(c.stage[0].bwd_w_s, 2 + 1.25 + 3, 0);
    sim_costs_release(&c);
    sched_release(&s);
    free_plan(p);
    /* the profile JSON: both keys or neither; written back only when measured */
    const char *head = "{\"format\": \"pipedream-profile\", \"version\": 1, \"model\": \"m\", \"minibatch\": 8, \"layers\": [";
    char text[1024];
    snprintf(text, sizeof text, "%s{\"name\": \"a\", \"type\": \"linear\", \"forward_s\": 1, \"backward_s\": 2, "
             "\"activation_bytes\": 4, \"parameter_bytes\": 8, \"backward_input_s\": 0.75, \"backward_weight_s\": 1.5}, "
             "{\"name\": \"b\", \"type\": \"linear\", \"forward_s\": 1, \"backward_s\": 2, \"activation_bytes\": 4, "
             "\"parameter_bytes\": 8}]}", head);
    Profile q;
    assert_int_equal(profile_parse(text, "t.json", &q, &err), PD_OK);
    assert_near(q.layers[0].bwd_in_s, 0.75, 0);
    assert_near(q.layers[0].bwd_w_s, 1.5, 0);
    assert_near(q.layers[1].bwd_in_s + q.layers[1].bwd_w_s, 0, 0);
    char path[] = "/tmp/pd_split_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(profile_save(&q, path, &err), PD_OK);
    Profile q2;
    assert_int_equal(profile_load(path, &q2, &err), PD_OK);
    assert_near(q2.layers[0].bwd_w_s, 1.5, 0);
    assert_near(q2.layers[1].bwd_w_s, 0, 0);
    unlink(path);
    profile_release(&q), profile_release(&q2);
    snprintf(text, sizeof text, "%s{\"name\": \"a\", \"type\": \"linear\", \"forward_s\": 1, \"backward_s\": 2, "
             "\"activation_bytes\": 4, \"parameter_bytes\": 8, \"backward_input_s\": 0.75}]}", head);
    assert_int_equal(profile_parse(text, "t.json", &q, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "both backward_input_s and backward_weight_s"));
}

/* A profile's step_s: taken out of backward (and of the split pass that holds it), charged at
 * each step instruction on the worker's stages, not scaled with the unit's batch. A uniform
 * chain of p one-layer stages whose backward b includes a step t: 1F1B-flush's minibatch of M
 * units takes (M + p - 1)(f + b - t) + t (the input worker steps last, once); with the step
 * left in backward (t = 0 in the profile) it would be (M + p - 1)(f + b). */
static void test_step_once_per_minibatch(void **state) {
    (void)state;
    enum { P = 4, M = 8 };
    const double f = 0.010, b = 0.020, t = 0.004;
    ProfileLayer L[P];
    for (int i = 0; i < P; i++) {
        L[i] = (ProfileLayer){.fwd_s = f, .bwd_s = b, .bwd_in_s = 0.008, .bwd_w_s = 0.012, .step_s = t, .param_bytes = 64};
        snprintf(L[i].type, sizeof L[i].type, "linear");
    }
    L[1].bwd_in_s = b, L[1].bwd_w_s = 0;   /* a layer whose whole backward (and step) is in BI */
    Profile prof = {.n_layers = P, .layers = L, .minibatch = 16};
    Plan *p = chain_plan(P, 1);
    SchedOpts o = {.kind = SCHED_1F1B_FLUSH, .n_minibatches = 1, .n_micro = M};
    Schedule s;
    Err err = {0};
    assert_int_equal(sched_build(p, &o, &s, &err), PD_OK);
    SimCosts c;
    assert_int_equal(sim_costs_from_profile(&s, &prof, &c, &err), PD_OK);
    assert_near(c.stage[0].bwd_s, b - t, 1e-15);
    assert_near(c.stage[0].step_s, t, 0);
    assert_near(c.stage[0].bwd_w_s, 0.012 - t, 1e-15);   /* the weight pass held the step */
    assert_near(c.stage[0].bwd_in_s, 0.008, 0);
    assert_near(c.stage[1].bwd_in_s, b - t, 1e-15);       /* ... here the input pass did */
    assert_near(c.stage[1].bwd_w_s, 0, 0);
    sim_costs_scale(&c, 4);                                /* units of 4x the profile's batch */
    assert_near(c.stage[0].bwd_s, 4 * (b - t), 1e-15);
    assert_near(c.stage[0].step_s, t, 0);                 /* per parameter, not per sample */
    sim_costs_scale(&c, 0.25);
    SimOpts so = {NULL, 1, 0, 0, 0, 0, NULL, 0};
    SimResult r;
    assert_int_equal(sim_run(&s, &c, &so, &r, &err), PD_OK);
    assert_near(r.makespan_s, (M + P - 1) * (f + b - t) + t, 1e-12);
    sim_result_release(&r);
    sim_costs_release(&c);
    for (int i = 0; i < P; i++) L[i].step_s = 0;   /* unmeasured: the step stays in every backward */
    assert_int_equal(sim_costs_from_profile(&s, &prof, &c, &err), PD_OK);
    assert_int_equal(sim_run(&s, &c, &so, &r, &err), PD_OK);
    assert_near(r.makespan_s, (M + P - 1) * (f + b), 1e-12);
    sim_result_release(&r);
    sim_costs_release(&c);
    sched_release(&s);
    free_plan(p);
    /* the profile file: step_s read back, and refused when larger than backward_s */
    const char *head = "{\"format\": \"pipedream-profile\", \"version\": 1, \"model\": \"m\", \"minibatch\": 8, \"layers\": [";
    char text[512];
    Profile q;
    snprintf(text, sizeof text, "%s{\"name\": \"a\", \"type\": \"linear\", \"forward_s\": 1, \"backward_s\": 2, "
             "\"activation_bytes\": 4, \"parameter_bytes\": 8, \"step_s\": 0.5}]}", head);
    assert_int_equal(profile_parse(text, "t.json", &q, &err), PD_OK);
    assert_near(q.layers[0].step_s, 0.5, 0);
    profile_release(&q);
    snprintf(text, sizeof text, "%s{\"name\": \"a\", \"type\": \"linear\", \"forward_s\": 1, \"backward_s\": 2, "
             "\"activation_bytes\": 4, \"parameter_bytes\": 8, \"step_s\": 3}]}", head);
    assert_int_equal(profile_parse(text, "t.json", &q, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "step_s 3 exceeds backward_s 2"));
}

/* A unit smaller than the profile's minibatch: each time is affine in the batch through the
 * profile's two batches (B = 64, b = 16), its fixed part t_b - (t_B - t_b) b / (B - b) clamped to
 * [0, t_B] (the step taken out of both backward times first), and only the rest scales. Without
 * small-batch times, or at f = 1, the costs are exactly the linear ones. */
static void test_affine_batch(void **state) {
    (void)state;
    const double ms = 1e-3;
    ProfileLayer L[2] = {
        /* forward 8 ms at 64, 4 at 16; backward 12 (10 + a 2 ms step) and 5 (3 + the step), split */
        {.fwd_s = 8 * ms, .bwd_s = 12 * ms, .bwd_in_s = 4 * ms, .bwd_w_s = 8 * ms, .step_s = 2 * ms, .param_bytes = 64,
         .small_fwd_s = 4 * ms, .small_bwd_s = 5 * ms, .small_bwd_in_s = 1 * ms, .small_bwd_w_s = 4 * ms},
        /* no split; a forward almost all fixed, a backward (and its halves) below the line: 0 */
        {.fwd_s = 2 * ms, .bwd_s = 3 * ms, .param_bytes = 64, .small_fwd_s = 1.9 * ms, .small_bwd_s = 0.2 * ms}};
    snprintf(L[0].type, sizeof L[0].type, "linear");
    snprintf(L[1].type, sizeof L[1].type, "linear");
    Profile prof = {.n_layers = 2, .layers = L, .minibatch = 64, .small_batch = 16};
    Err err = {0};
    assert_int_equal(profile_validate(&prof, &err), PD_OK);
    Plan *p = chain_plan(2, 1);
    SchedOpts o = {.kind = SCHED_1F1B_FLUSH, .n_minibatches = 1, .n_micro = 4};
    Schedule s;
    assert_int_equal(sched_build(p, &o, &s, &err), PD_OK);
    SimCosts c;
    assert_int_equal(sim_costs_from_profile(&s, &prof, &c, &err), PD_OK);
    const SimStageCost *a = &c.stage[0], *b = &c.stage[1];
    assert_near(a->fwd_fixed_s, 8.0 / 3 * ms, 1e-15);            /* 4 - 4 * 16/48 */
    assert_near(a->bwd_fixed_s, 2.0 / 3 * ms, 1e-15);            /* 3 - 7 * 16/48 */
    assert_near(a->bwd_in_fixed_s, 0, 1e-18);                    /* 1 - 3 * 16/48 */
    assert_near(a->bwd_w_fixed_s, 2.0 / 3 * ms, 1e-15);          /* 2 - 4 * 16/48 */
    assert_near(b->fwd_fixed_s, (1.9 - 0.1 / 3) * ms, 1e-15);
    assert_near(b->bwd_fixed_s, 0, 0);                           /* 0.2 - 2.8/3 < 0 */
    assert_near(b->bwd_in_fixed_s, 0, 0);
    assert_near(b->bwd_w_fixed_s, 0, 0);
    assert_near(a->step_s, 2 * ms, 0);
    sim_costs_scale(&c, 0.5);                                    /* units of 32 */
    assert_near(a->fwd_s, (8.0 / 3 + 16.0 / 3 * 0.5) * ms, 1e-15);   /* 5.333 ms, not 4 */
    assert_near(a->bwd_s, (2.0 / 3 + 28.0 / 3 * 0.5) * ms, 1e-15);
    assert_near(a->bwd_in_s, 2 * ms, 1e-15);
    assert_near(a->bwd_w_s, (2.0 / 3 + 16.0 / 3 * 0.5) * ms, 1e-15);
    assert_near(b->fwd_s, (1.9 - 0.1 / 3 + (0.1 + 0.1 / 3) * 0.5) * ms, 1e-15);
    assert_near(b->bwd_s, 1.5 * ms, 1e-15);
    assert_near(a->step_s, 2 * ms, 0);                           /* per step, not per sample */
    sim_costs_scale(&c, 0.5);                                    /* units of 16: the measurement */
    assert_near(a->fwd_s, 4 * ms, 1e-15);
    assert_near(a->bwd_s, 3 * ms, 1e-15);
    assert_near(b->fwd_s, 1.9 * ms, 1e-15);
    sim_costs_scale(&c, 4);                                      /* back to 64 */
    assert_near(a->fwd_s, 8 * ms, 1e-15);
    assert_near(a->bwd_w_s, 6 * ms, 1e-15);
    sim_costs_release(&c);
    /* a small batch above the line: the fixed part is at most the whole time */
    L[1].small_fwd_s = 2.5 * ms;
    assert_int_equal(sim_costs_from_profile(&s, &prof, &c, &err), PD_OK);
    assert_near(c.stage[1].fwd_fixed_s, 2 * ms, 0);
    sim_costs_scale(&c, 0.25);
    assert_near(c.stage[1].fwd_s, 2 * ms, 0);
    sim_costs_release(&c);
    /* f = 1 leaves every time bit for bit; so does any f without small-batch times (an old
     * profile, the authors'): exactly the linear costs t f */
    SimCosts lin, aff;
    assert_int_equal(sim_costs_from_profile(&s, &prof, &lin, &err), PD_OK);
    assert_int_equal(sim_costs_from_profile(&s, &prof, &aff, &err), PD_OK);
    sim_costs_scale(&aff, 1);
    assert_memory_equal(aff.stage, lin.stage, 2 * sizeof *aff.stage);
    sim_costs_release(&aff);
    prof.small_batch = 0;
    for (int i = 0; i < 2; i++) L[i].small_fwd_s = L[i].small_bwd_s = L[i].small_bwd_in_s = L[i].small_bwd_w_s = 0;
    const double fs[] = {1, 0.25, 1.0 / 3, 0.125, 1.0 / 7, 2, 4};
    for (size_t k = 0; k < sizeof fs / sizeof fs[0]; k++) {
        assert_int_equal(sim_costs_from_profile(&s, &prof, &aff, &err), PD_OK);
        for (int i = 0; i < 2; i++)
            assert_true(aff.stage[i].fwd_fixed_s == 0 && aff.stage[i].bwd_fixed_s == 0 &&
                        aff.stage[i].bwd_in_fixed_s == 0 && aff.stage[i].bwd_w_fixed_s == 0);
        sim_costs_scale(&aff, fs[k]);
        for (int i = 0; i < 2; i++) {   /* bit for bit the times the linear rule gives */
            const SimStageCost *x = &aff.stage[i], *y = &lin.stage[i];
            assert_true(x->fwd_s == y->fwd_s * fs[k] && x->bwd_s == y->bwd_s * fs[k]);
            assert_true(x->bwd_in_s == y->bwd_in_s * fs[k] && x->bwd_w_s == y->bwd_w_s * fs[k]);
            assert_true(x->step_s == y->step_s);
        }
        sim_costs_release(&aff);
    }
    sim_costs_release(&lin);
    sched_release(&s);
    free_plan(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_three_bubbles),      cmocka_unit_test(test_closed_forms),
        cmocka_unit_test(test_zb_memory),          cmocka_unit_test(test_recompute),
        cmocka_unit_test(test_interleaved_memory), cmocka_unit_test(test_split_from_profile),
        cmocka_unit_test(test_step_once_per_minibatch), cmocka_unit_test(test_affine_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
