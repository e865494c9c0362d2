/* test_runtime_v.c: the runtime executes the V-shaped kinds (zb-v, v-half, v-min, dualpipe-v): a
 * plan of 2 P stages in the V placement (plan_place_v), rank i holding stages i and 2 P - 1 - i,
 * the last stage's loss on rank 0 with the first stage's data, and the turn at rank P - 1 a
 * message to itself.
 *  - Every stage's final weights equal 1f1b-flush's on the straight plan of the same stages with
 *    the same micro-batches, bit for bit: each stage adds its units' weight gradients (BW, in
 *    unit order per chunk) in 1f1b-flush's order, and BI + BW is the whole backward's arithmetic.
 *  - The emulation equals the threads transport bitwise; --recompute changes no bit.
 *  - A run continued from another's final state (RtConfig.init, a rank's chunks concatenated:
 *    what a checkpoint's resume gives the ranks) equals the uninterrupted run bitwise.
 * On a 5-layer MLP (4 stages, P = 2), a 9-layer MLP (8 stages, P = 4) and a CNN with batch norm and
 * dropout (4 stages). MPI: tests/cli/sched_v.sh. */
#include "rt_fixture.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

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

static const SchedKind KINDS[] = {SCHED_ZB_V, SCHED_V_HALF, SCHED_V_MIN, SCHED_DUALPIPE_V};

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

/* kind on the n_stages stages [bounds[i], bounds[i+1]): V-placed for a V kind, straight (stage i
 * on rank i) otherwise. */
static void build(TPlan *tp, Schedule *s, SchedKind kind, int n_stages, const int *bounds, int steps, int M,
                  int recompute) {
    int reps[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    Err err = {0};
    tplan(tp, n_stages, bounds, reps);
    if (sched_kind_v(kind) && plan_place_v(&tp->p, &err)) fail_msg("plan_place_v: %s", err.msg);
    SchedOpts so = {.kind = kind, .n_minibatches = steps, .n_micro = M, .recompute = recompute};
    if (sched_build(&tp->p, &so, s, &err)) fail_msg("sched_build %s: %s", sched_kind_name(kind), err.msg);
}

/* Stage by stage: the V run's weights and running statistics (a rank's two chunks concatenated)
 * against 1f1b-flush's (one stage a rank), bitwise. */
static void assert_stages_equal(const char *what, const Schedule *v, const RtWorkerResult *rv, const Schedule *f,
                                const RtWorkerResult *rf, const char *model) {
    Err err = {0};
    Model *m = model_load(model, &err);
    assert_non_null(m);
    for (int r = 0; r < v->n_ranks; r++) {
        const SchedWorker *sw = &v->workers[r];
        assert_int_equal(sw->n_chunks, 2);
        assert_int_equal(rv[r].n_chunks, 2);
        size_t off = 0, soff = 0;
        for (int c = 0; c < 2; c++) {
            int st = sw->stages[c];
            const SchedStage *ss = &v->stages[st];
            int first = ss->layers[0], last = ss->layers[ss->n_layers - 1] + 1;
            size_t n = model_param_count(m, first, last), ns = model_state_count(m, first, last);
            const RtWorkerResult *o = &rf[f->stages[st].ranks[0]];
            assert_int_equal(o->n_params, n);
            char t[200];
            snprintf(t, sizeof t, "%s: stage %d (rank %d chunk %d) against 1f1b-flush", what, st, r, c);
            if (n && memcmp(rv[r].params + off, o->params, n * sizeof(float))) {
                tu_compare(t, rv[r].params + off, o->params, n, 0, 0);
                fail_msg("%s: weights differ", t);
            }
            if (ns && memcmp(rv[r].final.state + soff, o->final.state, ns * sizeof(float)))
                fail_msg("%s: running statistics differ", t);
            off += n, soff += ns;
        }
        assert_int_equal(off, rv[r].n_params);
    }
    model_free(m);
}

/* For every V kind: V == 1f1b-flush stage by stage, emulation == threads, --recompute == without,
 * all bitwise; the counts of computes (a BI and a BW per unit and chunk). */
static void run_case(const char *model, int n_stages, const int *bounds, int M) {
    const int steps = model == cnn_path ? 2 : 4;
    TPlan tf;
    Schedule sf;
    build(&tf, &sf, SCHED_1F1B_FLUSH, n_stages, bounds, steps, M, 0);
    RtConfig cf = config(model, &sf);
    RtWorkerResult f[8];
    memset(f, 0, sizeof f);
    Err err = {0};
    if (rt_run_threads(&cf, f, &err)) fail_msg("1f1b-flush: %s", err.msg);
    for (size_t ki = 0; ki < sizeof KINDS / sizeof KINDS[0]; ki++) {
        SchedKind k = KINDS[ki];
        if (k == SCHED_DUALPIPE_V && M < n_stages) continue;   /* it needs 2 per worker */
        TPlan tv;
        Schedule s, sr;
        build(&tv, &s, k, n_stages, bounds, steps, M, 0);
        build(&tv, &sr, k, n_stages, bounds, steps, M, 1);
        int P = n_stages / 2;
        assert_int_equal(s.n_ranks, P);
        RtConfig cv = config(model, &s), cvr = config(model, &sr);
        RtWorkerResult th[4], em[4], thr[4];
        memset(th, 0, sizeof th), memset(em, 0, sizeof em), memset(thr, 0, sizeof thr);
        if (rt_run_threads(&cv, th, &err)) fail_msg("%s threads: %s", sched_kind_name(k), err.msg);
        if (rt_emulate(&cv, em, &err)) fail_msg("%s emulation: %s", sched_kind_name(k), err.msg);
        if (rt_run_threads(&cvr, thr, &err)) fail_msg("%s threads --recompute: %s", sched_kind_name(k), err.msg);
        char what[120];
        snprintf(what, sizeof what, "%s %d stages M=%d", sched_kind_name(k), n_stages, M);
        assert_stages_equal(what, &s, th, &sf, f, model);
        for (int r = 0; r < P; r++) {
            assert_int_equal(th[r].n_fwd, steps * M * 2);
            assert_int_equal(th[r].n_bwd, steps * M * 2);
            assert_int_equal(th[r].units_done, r == 0 ? steps * M : 0);   /* the loss on rank 0 */
        }
        rt_assert_same_results(what, th, em, P);
        snprintf(what, sizeof what, "%s %d stages M=%d --recompute", sched_kind_name(k), n_stages, M);
        rt_assert_same_results(what, th, thr, P);
        print_message("%s %d stages, M = %d: weights = 1f1b-flush's, emulation and --recompute bitwise\n",
                      sched_kind_name(k), n_stages, M);
        rt_results_release(th, P), rt_results_release(em, P), rt_results_release(thr, P);
        sched_release(&s);
        sched_release(&sr);
    }
    rt_results_release(f, n_stages);
    sched_release(&sf);
}

static void test_v_equals_1f1b_flush(void **state) {
    (void)state;
    int b4[] = {0, 2, 3, 4, 5};
    run_case(mlp_path, 4, b4, 2);   /* P = 2, m = p (not dualpipe-v) */
    run_case(mlp_path, 4, b4, 4);
    run_case(mlp_path, 4, b4, 8);
    int b8[] = {0, 2, 3, 4, 5, 6, 7, 8, 9};
    run_case(mlp9_path, 8, b8, 8);  /* P = 4 */
    int c4[] = {0, 2, 4, 5, 7};     /* conv+bn | pool+flatten | linear | dropout+linear */
    run_case(cnn_path, 4, c4, 4);
}

/* A run continued from another's final state (each rank's chunks concatenated, unit_base moved
 * on) ends where the uninterrupted run does, bit for bit: rank 1's chunk 0 (pool, flatten) has no
 * parameters, its chunk 1 has. */
static void test_v_continue(void **state) {
    (void)state;
    int c4[] = {0, 2, 4, 5, 7};
    for (size_t ki = 0; ki < sizeof KINDS / sizeof KINDS[0]; ki++) {
        SchedKind k = KINDS[ki];
        TPlan tp;
        Schedule whole, half;
        build(&tp, &whole, k, 4, c4, 4, 4, 0);
        build(&tp, &half, k, 4, c4, 2, 4, 0);
        RtConfig cw = config(cnn_path, &whole), c1 = config(cnn_path, &half), c2 = config(cnn_path, &half);
        RtWorkerResult a[2], b[2], c[2];
        memset(a, 0, sizeof a), memset(b, 0, sizeof b), memset(c, 0, sizeof c);
        Err err = {0};
        if (rt_run_threads(&cw, a, &err)) fail_msg("%s", err.msg);
        if (rt_run_threads(&c1, b, &err)) fail_msg("%s", err.msg);
        RtStageState init[2] = {b[0].final, b[1].final};
        c2.init = init;
        c2.unit_base = 2 * 4;
        if (rt_run_threads(&c2, c, &err)) fail_msg("%s", err.msg);
        char what[64];
        snprintf(what, sizeof what, "%s continued", sched_kind_name(k));
        rt_assert_same_results(what, a, c, 2);
        rt_results_release(a, 2), rt_results_release(b, 2), rt_results_release(c, 2);
        sched_release(&whole);
        sched_release(&half);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v_equals_1f1b_flush),
        cmocka_unit_test(test_v_continue),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
