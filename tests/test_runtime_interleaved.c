/* test_runtime_interleaved.c: the runtime executes Megatron's interleaved 1F1B, a rank holding
 * V stages (chunks) of a straight plan, stage i on rank i mod W (docs/explanation/schedules.md).
 *  - Flush per minibatch: after the run every stage's weights equal sequential minibatch SGD on
 *    the same micro-batches up to summation order (rt_sequential, the tolerance of the other
 *    flushed kinds in test_runtime.c), on a 5-layer MLP (4 stages, V = 2), a 9-layer MLP (6 and
 *    8 stages: V = 3, 4) and a CNN with batch norm and dropout (4 stages, V = 2), with
 *    M = W (every forward first) and M > W micro-batches.
 *  - The threads transport equals the serial emulation bitwise; --recompute changes no bit.
 *  - A run continued from another's final state (RtConfig.init: a rank's chunks concatenated)
 *    equals the uninterrupted run bitwise; the memory ledger sums the chunks.
 *  - The emulation's deadlock check covers interleaved lists.
 * Messages between the same two ranks for different chunks carry the stage boundary in their
 * id; were they told apart by unit alone, rank 1 of a 2 x 2 plan would take chunk 1's input for
 * chunk 0's (same shapes in the MLPs) and the weights would leave the oracle's. MPI:
 * tests/cli/runtime_mpi.sh. */
#include "rt_fixture.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"
#include "sim.h"

static char mlp_path[64], cnn_path[64], mlp9_path[64];
static Dataset train;

static int setup(void **state) {
    (void)state;
    rt_fixture_setup(mlp_path, cnn_path, &train);
    rt_write_tmp(mlp9_path, RT_MLP9_JSON);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    rt_fixture_teardown(mlp_path, cnn_path, &train);
    unlink(mlp9_path);
    return 0;
}

static RtConfig config(const char *model, const Schedule *s) {
    RtConfig c = {0};
    c.model_path = model;
    c.sched = s;
    c.unit_batch = 8;
    c.opt = optim_defaults(OPT_SGD, 0.05f);
    c.opt.momentum = 0.9f;
    c.seed = 11;
    c.train = &train;
    c.recv_timeout_s = 60;
    c.threads = 1;
    return c;
}

/* The plan of n_stages stages [bounds[i], bounds[i+1]) with d replicas each interleaved in V
 * chunks (d pipelines), and its schedule. */
static void build_d(TPlan *tp, Schedule *s, int n_stages, const int *bounds, int V, int d, int steps, int M,
                    int recompute) {
    int reps[8];
    for (int i = 0; i < 8; i++) reps[i] = d;
    Err err = {0};
    tplan(tp, n_stages, bounds, reps);
    if (plan_interleave(&tp->p, V, &err)) fail_msg("plan_interleave: %s", err.msg);
    SchedOpts so = {.kind = SCHED_INTERLEAVED, .n_minibatches = steps, .n_micro = M, .recompute = recompute};
    if (sched_build(&tp->p, &so, s, &err)) fail_msg("sched_build: %s", err.msg);
    assert_int_equal(s->n_chunks, V);
}

static void build(TPlan *tp, Schedule *s, int n_stages, const int *bounds, int V, int steps, int M, int recompute) {
    build_d(tp, s, n_stages, bounds, V, 1, steps, M, recompute);
}

/* (a) threads == sequential SGD up to summation order, stage by stage; (b) emulation ==
 * threads bitwise; (c) --recompute == without, bitwise, on threads and emulation. */
static void run_case_d(const char *model, int n_stages, const int *bounds, int V, int d, int M) {
    const int steps = rt_oracle_steps(model == cnn_path, 8);
    TPlan tp;
    Schedule s, sr;
    build_d(&tp, &s, n_stages, bounds, V, d, steps, M, 0);
    build_d(&tp, &sr, n_stages, bounds, V, d, steps, M, 1);
    int W = s.n_ranks;
    assert_int_equal(W, n_stages / V * d);
    RtConfig cfg = config(model, &s), cfgr = config(model, &sr);
    RtWorkerResult th[8], em[8], thr[8], emr[8];
    memset(th, 0, sizeof th), memset(em, 0, sizeof em), memset(thr, 0, sizeof thr), memset(emr, 0, sizeof emr);
    Err err = {0};
    if (rt_run_threads(&cfg, th, &err)) fail_msg("threads: %s", err.msg);
    if (rt_emulate(&cfg, em, &err)) fail_msg("emulation: %s", err.msg);
    if (rt_run_threads(&cfgr, thr, &err)) fail_msg("threads --recompute: %s", err.msg);
    if (rt_emulate(&cfgr, emr, &err)) fail_msg("emulation --recompute: %s", err.msg);
    char what[96];
    snprintf(what, sizeof what, "interleaved %d stages V=%d d=%d M=%d", n_stages, V, d, M);
    /* (a) */
    size_t np;
    float *want = rt_sequential(model, &train, steps, M, 8, &np);
    Model *m = model_load(model, &err);
    assert_non_null(m);
    size_t total = 0;
    for (int r = 0; r < W; r++) {
        const SchedWorker *sw = &s.workers[r];
        assert_int_equal(th[r].n_chunks, V);
        assert_int_equal(th[r].n_fwd, steps * M / d * V);
        assert_int_equal(th[r].n_bwd, steps * M / d * V);
        size_t off = 0;
        for (int c = 0; c < V; c++) {
            const SchedStage *st = &s.stages[sw->stages[c]];
            int first = st->layers[0], last = st->layers[st->n_layers - 1] + 1;
            size_t n = model_param_count(m, first, last);
            char t[160];
            snprintf(t, sizeof t, "%s: stage %d (rank %d chunk %d)", what, sw->stages[c], r, c);
            assert_int_equal(tu_compare(t, th[r].params + off, want + model_param_offset(m, first), n, 2e-4, 2e-5), 0);
            assert_int_equal(th[r].chunk_crc[c], pd_crc32(th[r].params + off, n * sizeof(float)));
            assert_int_equal(th[r].chunk_fwd[c], steps * M / d);
            off += n;
        }
        assert_int_equal(off, th[r].n_params);
        if (sw->replica == 0) total += off;
        /* the ledger: every chunk's weights, gradients and momentum; one version (flush) */
        assert_int_equal(th[r].mem.params, off * sizeof(float));
        assert_int_equal(th[r].mem.grads, off * sizeof(float));
        assert_int_equal(th[r].mem.stashed, 0);
        assert_true(th[r].mem.slots >= V * (1 + SCHED_SLOTS_AHEAD));
    }
    assert_int_equal(total, np);
    /* the last stage's loss history: every unit once, each replica (pipeline) its M / d */
    for (int r = 0; r < W; r++) {
        int last = s.workers[r].stages[V - 1] == n_stages - 1;
        assert_int_equal(th[r].units_done, last ? steps * M / d : 0);
    }
    /* (b), (c) */
    rt_assert_same_results(what, th, em, W);
    snprintf(what, sizeof what, "interleaved %d stages V=%d d=%d M=%d --recompute", n_stages, V, d, M);
    rt_assert_same_results(what, th, thr, W);
    rt_assert_same_results(what, thr, emr, W);
    print_message("%s: weights = sequential SGD, emulation and --recompute bitwise\n", what);
    model_free(m);
    pd_free(want);
    rt_results_release(th, W), rt_results_release(em, W), rt_results_release(thr, W), rt_results_release(emr, W);
    sched_release(&s);
    sched_release(&sr);
}

static void run_case(const char *model, int n_stages, const int *bounds, int V, int M) {
    run_case_d(model, n_stages, bounds, V, 1, M);
}

static void test_interleaved_equals_sequential(void **state) {
    (void)state;
    int b4[] = {0, 2, 3, 4, 5};
    run_case(mlp_path, 4, b4, 2, 2);   /* M = W: all forwards, then all backwards */
    run_case(mlp_path, 4, b4, 2, 4);
    run_case(mlp_path, 4, b4, 2, 6);
    int b6[] = {0, 2, 3, 4, 5, 7, 9}, b8[] = {0, 2, 3, 4, 5, 6, 7, 8, 9};
    run_case(mlp9_path, 6, b6, 3, 4);
    run_case(mlp9_path, 8, b8, 4, 4);
    run_case(mlp9_path, 8, b8, 2, 8);   /* 4 workers of 2 chunks */
    int c4[] = {0, 2, 4, 5, 7};         /* conv+bn | pool+flatten | linear | dropout+linear */
    run_case(cnn_path, 4, c4, 2, 4);
}

/* Data parallelism over whole interleaved pipelines: every stage d replicas, replica j of each
 * stage pipeline j, the chunks' gradients all-reduced before the step; the same oracle. */
static void test_interleaved_replicated(void **state) {
    (void)state;
    int b4[] = {0, 2, 3, 4, 5};
    run_case_d(mlp_path, 4, b4, 2, 2, 4);   /* 2 pipelines of 2 workers, 2 micro-batches each: all forwards first */
    run_case_d(mlp_path, 4, b4, 2, 2, 8);
    run_case_d(mlp_path, 4, b4, 2, 3, 12);  /* 6 workers */
    int b8[] = {0, 2, 3, 4, 5, 6, 7, 8, 9};
    run_case_d(mlp9_path, 8, b8, 4, 2, 8);  /* 4 workers of 4 chunks */
    int c4[] = {0, 2, 4, 5, 7};
    run_case_d(cnn_path, 4, c4, 2, 2, 8);   /* batch norm's statistics per replica, dropout per unit */
}

/* A run continued from another's final state (init: each rank's chunks concatenated, unit_base
 * moved on) ends where the uninterrupted run does, bit for bit. Rank 1's first chunk has no
 * parameters, so it never steps its optimizer: the rank's optimizer step count must come from
 * its other chunk (SGD's first step differs from later ones). */
static void test_interleaved_continue(void **state) {
    (void)state;
    int c4[] = {0, 2, 4, 5, 7};   /* rank 1's chunk 0 (maxpool, flatten) has no parameters */
    TPlan tp;
    Schedule whole, half;
    build(&tp, &whole, 4, c4, 2, 6, 4, 0);
    build(&tp, &half, 4, c4, 2, 3, 4, 0);
    RtConfig cw = config(cnn_path, &whole), c1 = config(cnn_path, &half), c2 = config(cnn_path, &half);
    RtWorkerResult a[2], b[2], c[2];
    memset(a, 0, sizeof a), memset(b, 0, sizeof b), memset(c, 0, sizeof c);
    Err err = {0};
    if (rt_run_threads(&cw, a, &err)) fail_msg("%s", err.msg);
    if (rt_run_threads(&c1, b, &err)) fail_msg("%s", err.msg);
    RtStageState init[2] = {b[0].final, b[1].final};
    c2.init = init;
    c2.unit_base = 3 * 4;
    if (rt_emulate(&c2, c, &err)) fail_msg("%s", err.msg);
    rt_assert_same_results("interleaved continued", a, c, 2);
    rt_results_release(a, 2), rt_results_release(b, 2), rt_results_release(c, 2);
    sched_release(&whole);
    sched_release(&half);
}

/* With rank 0's first gradient receive moved before the first activation send it depends on,
 * the emulation reports a deadlock (naming the chunk) instead of hanging. */
static void test_interleaved_deadlock(void **state) {
    (void)state;
    TPlan tp;
    Schedule s;
    int b4[] = {0, 2, 3, 4, 5};
    build(&tp, &s, 4, b4, 2, 1, 4, 0);
    rt_move_recv_before_send(&s.workers[0]);
    RtConfig cfg = config(mlp_path, &s);
    RtWorkerResult res[2];
    memset(res, 0, sizeof res);
    Err err = {0};
    assert_int_not_equal(rt_emulate(&cfg, res, &err), PD_OK);
    if (!strstr(err.msg, "deadlock")) fail_msg("emulation: %s", err.msg);
    print_message("interleaved, a receive moved: %s\n", err.msg);
    rt_results_release(res, 2);
    sched_release(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interleaved_equals_sequential),
        cmocka_unit_test(test_interleaved_replicated),
        cmocka_unit_test(test_interleaved_continue),
        cmocka_unit_test(test_interleaved_deadlock),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
