/* test_runtime.c: the pipelined runtime against two oracles.
 *  - Asynchronous schedules (1f1b with and without vertical sync, 2bw) on 2, 3 and 4 stages,
 *    with and without a replicated stage: the threads transport must end with weights
 *    BITWISE equal to the serial single-process emulation of the same instruction lists,
 *    and every forward/backward must use the version the schedule names.
 *  - Synchronous schedules (gpipe, 1f1b-flush, dp, a one-stage plan), on a small MLP and on
 *    a small CNN with batch norm and dropout: the weights after 20 steps equal plain
 *    sequential minibatch SGD written directly on the nn API (rt_sequential, rt_fixture.h: forward/backward of each
 *    unit in order, gradients accumulated, one optimizer step per minibatch), up to
 *    summation order: |got - want| <= 2e-5 + 2e-4 |want|. The only difference between the
 *    two computations is the order of float additions (gradient sums over replicas and
 *    micro-batches), whose rounding error after 20 steps of lr 0.05 is far below that
 *    bound, while a wrong version, a lost or doubled micro-batch or a wrong scale moves
 *    weights by more than 1e-3 relative.
 *  - The zero-bubble kinds (zb-h1, zb-h2: backward split into BI and BW) equal sequential SGD
 *    as above, and their final weights equal 1f1b-flush's BITWISE (same units, same flush
 *    points, same order of every gradient addition); threads equal the emulation bitwise.
 * And the profiler's output for a small MLP, the simulator's gradient buckets against the
 * runtime's, and how a stopping rank tells a lost peer (rt_fail_pid_gone: a live process is
 * not gone, a zombie not yet reaped is, a reaped one is). The MPI transport is checked by
 * tests/cli/runtime_mpi.sh. */
#include "rt_fixture.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels.h"
#include "runtime.h"
#include "rt_impl.h"
#include "sim.h"

static char mlp_path[64], cnn_path[64];
static Dataset train;

static int setup(void **state) {
    (void)state;
    rt_fixture_setup(mlp_path, cnn_path, &train);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    rt_fixture_teardown(mlp_path, cnn_path, &train);
    return 0;
}

static RtConfig config(const char *model, const Schedule *s, int B) {
    RtConfig c = {0};
    c.model_path = model;
    c.sched = s;
    c.unit_batch = B;
    c.opt = optim_defaults(OPT_SGD, 0.05f);
    c.opt.momentum = 0.9f;
    c.seed = 11;
    c.train = &train;
    c.recv_timeout_s = 60;
    c.trace = 1;
    c.threads = 1;
    return c;
}

/* Asserts that w, the n weights of layers [first, last), moved away from their initial
 * values (model_init_params with the same seed): training happened. */
static void assert_moved(const Model *m, int first, int last, uint64_t seed, const float *w, size_t n) {
    assert_int_equal(model_param_count(m, first, last), n);
    assert_true(n > 0);
    float *w0 = pd_alloc_f32(n);
    model_init_params(m, first, last, seed, w0);
    double moved = 0;
    for (size_t i = 0; i < n; i++) moved = fmax(moved, fabs((double)w[i] - w0[i]));
    pd_free(w0);
    if (!(moved > 1e-3)) fail_msg("layers [%d, %d): weights within %g of their initial values", first, last, moved);
}

/* Forward, backward and the zb kinds' split backward (BI, BW). */
static int is_fb(int op) { return op == OP_FORWARD || op == OP_BACKWARD || op == OP_BACKWARD_B || op == OP_BACKWARD_W; }

/* Every forward/backward event used the version the schedule names, in the same order. */
static void check_versions(const Schedule *s, const RtWorkerResult *res) {
    for (int r = 0; r < s->n_ranks; r++) {
        const SchedWorker *w = &s->workers[r];
        int e = 0;
        for (int i = 0; i < w->n; i++) {
            const Instr *in = &w->ins[i];
            if (!is_fb(in->op)) continue;
            while (e < res[r].n_events && !is_fb(res[r].events[e].op)) e++;
            assert_true(e < res[r].n_events);
            assert_int_equal(res[r].events[e].op, in->op);
            assert_int_equal(res[r].events[e].mb, in->mb);
            assert_int_equal(res[r].events[e].version, in->version);
            e++;
        }
    }
}

/* The schedule so on the plan of bounds and reps, run by the emulation and by threads: the
 * versions the schedule names, the same weights bit for bit, training happened. */
static void run_async_opts(const char *model, int n_stages, const int *bounds, const int *reps, SchedOpts so) {
    const SchedKind kind = so.kind;
    TPlan tp;
    tplan(&tp, n_stages, bounds, reps);
    Schedule s;
    Err err = {0};
    if (sched_build(&tp.p, &so, &s, &err)) fail_msg("sched_build: %s", err.msg);
    RtConfig cfg = config(model, &s, 8);
    RtWorkerResult a[16], b[16];
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    if (rt_emulate(&cfg, a, &err)) fail_msg("emulate: %s", err.msg);
    if (rt_run_threads(&cfg, b, &err)) fail_msg("threads: %s", err.msg);
    check_versions(&s, a);
    check_versions(&s, b);
    Model *m = model_load(model, &err);
    if (!m) fail_msg("%s", err.msg);
    int stashed = 0;
    for (int r = 0; r < s.n_ranks; r++) {
        assert_int_equal(a[r].n_params, b[r].n_params);
        if (memcmp(a[r].params, b[r].params, a[r].n_params * sizeof(float)) != 0)
            fail_msg("%s stages=%d rank %d: threads and emulation differ", sched_kind_name(kind), n_stages, r);
        assert_int_equal(a[r].n_fwd, b[r].n_fwd);
        if (a[r].max_versions > 1) stashed = 1;
        assert_moved(m, bounds[a[r].stage], bounds[a[r].stage + 1], cfg.seed, a[r].params, a[r].n_params);
    }
    model_free(m);
    /* Replicas of a stage hold identical weights after a synchronised step. */
    for (int i = 0; i < n_stages; i++)
        for (int j = 1; j < reps[i]; j++) {
            int r0 = tp.st[i].ranks[0], rj = tp.st[i].ranks[j];
            assert_memory_equal(a[r0].params, a[rj].params, a[r0].n_params * sizeof(float));
        }
    if (kind == SCHED_1F1B && n_stages > 1) assert_true(stashed);   /* weight stashing happened */
    if (kind == SCHED_2BW)
        for (int r = 0; r < s.n_ranks; r++) assert_true(a[r].max_versions <= 2);
    for (int r = 0; r < s.n_ranks; r++) {
        rt_result_release(&a[r]);
        rt_result_release(&b[r]);
    }
    sched_release(&s);
}

static void run_async_case(const char *model, int n_stages, const int *bounds, const int *reps, SchedKind kind,
                           int vsync, int n_mb, int n_micro) {
    run_async_opts(model, n_stages, bounds, reps,
                   (SchedOpts){.kind = kind, .n_minibatches = n_mb, .n_micro = n_micro, .vertical_sync = vsync});
}

/* 1f1b with a deeper pipeline (SchedOpts.inflight, what a plan on links with latency records):
 * 7 units in flight at stage 0 of 4, more weight versions stashed, threads = emulation. */
static void test_async_inflight(void **st) {
    (void)st;
    const int b4[] = {0, 2, 3, 4, 5}, r1[] = {1, 1, 1, 1};   /* MLP: 0 flatten, 1-4 linear */
    run_async_opts(mlp_path, 4, b4, r1, (SchedOpts){.kind = SCHED_1F1B, .n_minibatches = 12, .n_micro = 1, .inflight = 7});
}

static void test_async_equals_emulation(void **state) {
    (void)state;
    /* MLP top-level layers: 0 flatten, 1-4 linear */
    int b2[] = {0, 2, 5}, b3[] = {0, 2, 3, 5}, b4[] = {0, 2, 3, 4, 5};
    int r11[] = {1, 1}, r21[] = {2, 1}, r111[] = {1, 1, 1}, r121[] = {1, 2, 1}, r1111[] = {1, 1, 1, 1};
    run_async_case(mlp_path, 2, b2, r11, SCHED_1F1B, 0, 12, 1);
    run_async_case(mlp_path, 2, b2, r21, SCHED_1F1B, 0, 12, 1);
    run_async_case(mlp_path, 3, b3, r111, SCHED_1F1B, 0, 12, 1);
    run_async_case(mlp_path, 3, b3, r121, SCHED_1F1B, 0, 12, 1);
    run_async_case(mlp_path, 4, b4, r1111, SCHED_1F1B, 0, 12, 1);
    run_async_case(mlp_path, 3, b3, r111, SCHED_1F1B, 1, 12, 1);
    run_async_case(mlp_path, 4, b4, r1111, SCHED_1F1B, 1, 12, 1);
    run_async_case(mlp_path, 2, b2, r11, SCHED_2BW, 0, 6, 4);
    run_async_case(mlp_path, 4, b4, r1111, SCHED_2BW, 0, 5, 4);
    run_async_case(mlp_path, 3, b3, r121, SCHED_2BW, 0, 5, 4);
    /* CNN with batch norm and dropout: 0 conv,1 bn,2 pool,3 flatten,4 linear,5 dropout,6 linear */
    int c3[] = {0, 2, 5, 7};
    run_async_case(cnn_path, 3, c3, r121, SCHED_1F1B, 0, 10, 1);
}

static void run_sync_case(const char *model, int n_stages, const int *bounds, const int *reps, SchedKind kind,
                          int n_micro) {
    TPlan tp;
    tplan(&tp, n_stages, bounds, reps);
    Schedule s;
    Err err = {0};
    const int steps = rt_oracle_steps(model == cnn_path, 20), B = 8;
    /* units per optimizer step: micro-batches, or (dp, one-unit rounds) one per replica */
    int per = kind == SCHED_DP ? tp.p.n_workers : n_micro;
    SchedOpts so = {.kind = kind, .n_minibatches = kind == SCHED_DP ? steps * per : steps, .n_micro = n_micro};
    if (sched_build(&tp.p, &so, &s, &err)) fail_msg("sched_build: %s", err.msg);
    RtConfig cfg = config(model, &s, B);
    RtWorkerResult res[16];
    memset(res, 0, sizeof res);
    if (rt_run_threads(&cfg, res, &err)) fail_msg("threads: %s", err.msg);
    size_t np;
    float *want = rt_sequential(model, &train, steps, per, B, &np);
    Model *m = model_load(model, &err);
    int stages = kind == SCHED_DP ? 1 : n_stages;
    for (int i = 0; i < stages; i++) {
        const SchedStage *ss = &s.stages[i];
        size_t off = model_param_offset(m, ss->layers[0]);
        for (int j = 0; j < ss->replicas; j++) {
            const RtWorkerResult *r = &res[ss->ranks[j]];
            char what[96];
            snprintf(what, sizeof what, "%s stage %d replica %d", sched_kind_name(kind), i, j);
            assert_int_equal(tu_compare(what, r->params, want + off, r->n_params, 2e-4, 2e-5), 0);
            assert_moved(m, ss->layers[0], ss->layers[0] + ss->n_layers, cfg.seed, r->params, r->n_params);
        }
    }
    model_free(m);
    pd_free(want);
    for (int r = 0; r < 16; r++) rt_result_release(&res[r]);
    sched_release(&s);
}

static void test_sync_equals_sequential(void **state) {
    (void)state;
    int b1[] = {0, 5}, b2[] = {0, 2, 5}, b3[] = {0, 2, 3, 5};
    int r1[] = {1}, r11[] = {1, 1}, r121[] = {1, 2, 1}, r2[] = {2};
    run_sync_case(mlp_path, 1, b1, r1, SCHED_1F1B, 1);       /* one-stage plan */
    run_sync_case(mlp_path, 2, b2, r11, SCHED_GPIPE, 4);
    run_sync_case(mlp_path, 3, b3, r121, SCHED_GPIPE, 4);
    run_sync_case(mlp_path, 3, b3, r121, SCHED_1F1B_FLUSH, 4);
    run_sync_case(mlp_path, 1, b1, r2, SCHED_DP, 1);
    int c3[] = {0, 2, 5, 7}, c1[] = {0, 7};
    int r3[] = {3};
    run_sync_case(cnn_path, 3, c3, r121, SCHED_GPIPE, 4);
    run_sync_case(cnn_path, 3, c3, r121, SCHED_1F1B_FLUSH, 2);
    run_sync_case(cnn_path, 1, c1, r3, SCHED_DP, 1);
    /* the zero-bubble kinds: the split backward (BI, then BW deferred) */
    int b4[] = {0, 2, 3, 4, 5}, r1111[] = {1, 1, 1, 1};
    run_sync_case(mlp_path, 3, b3, r121, SCHED_ZB_H1, 4);
    run_sync_case(mlp_path, 4, b4, r1111, SCHED_ZB_H1, 8);
    run_sync_case(mlp_path, 4, b4, r1111, SCHED_ZB_H2, 8);
    run_sync_case(cnn_path, 3, c3, r121, SCHED_ZB_H1, 4);
}

/* Runs kind on threads and returns every rank's results in res. */
static void run_threads(const char *model, const TPlan *tp, SchedKind kind, int n_mb, int n_micro, Schedule *s,
                        RtWorkerResult *res) {
    Err err = {0};
    SchedOpts so = {.kind = kind, .n_minibatches = n_mb, .n_micro = n_micro};
    if (sched_build(&tp->p, &so, s, &err)) fail_msg("sched_build: %s", err.msg);
    RtConfig cfg = config(model, s, 8);
    if (rt_run_threads(&cfg, res, &err)) fail_msg("%s threads: %s", sched_kind_name(kind), err.msg);
    check_versions(s, res);
}

/* zb-h1 and zb-h2 run the units of 1f1b-flush, with the same flush points, and each layer's
 * weight gradient of a unit is added at the same place in the same order (the split layers'
 * in BW, the others' in BI; units in order): the final weights are BITWISE 1f1b-flush's. The
 * serial emulation of the same lists gives the same bits too, and the weight passes ran. */
static void zb_case(const char *model, int n_stages, const int *bounds, const int *reps, SchedKind kind, int n_mb,
                    int n_micro) {
    TPlan tp;
    tplan(&tp, n_stages, bounds, reps);
    Schedule sz, sf;
    RtWorkerResult z[16], f[16];
    memset(z, 0, sizeof z);
    memset(f, 0, sizeof f);
    run_threads(model, &tp, kind, n_mb, n_micro, &sz, z);
    run_threads(model, &tp, SCHED_1F1B_FLUSH, n_mb, n_micro, &sf, f);
    for (int r = 0; r < sz.n_ranks; r++) {
        char what[96];
        snprintf(what, sizeof what, "%s stages=%d rank %d", sched_kind_name(kind), n_stages, r);
        assert_int_equal(z[r].n_params, f[r].n_params);
        if (memcmp(z[r].params, f[r].params, z[r].n_params * sizeof(float))) {
            tu_compare(what, z[r].params, f[r].params, z[r].n_params, 0, 0);
            fail_msg("%s: final weights differ from 1f1b-flush's", what);
        }
        assert_int_equal(z[r].n_bwd, f[r].n_bwd);
        assert_int_equal(z[r].n_wgrad, z[r].n_bwd);   /* one BW per BI */
        assert_int_equal(f[r].n_wgrad, 0);
        assert_true(z[r].n_bwd == n_mb * n_micro / reps[z[r].stage]);
    }
    run_async_case(model, n_stages, bounds, reps, kind, 0, n_mb, n_micro);   /* emulation == threads */
    for (int r = 0; r < 16; r++) rt_result_release(&z[r]), rt_result_release(&f[r]);
    sched_release(&sz);
    sched_release(&sf);
}

/* The deadlock checks cover the zb kinds: their lists run in the emulation and the simulator;
 * with worker 0's first gradient receive moved before the activation send it depends on, both
 * report a deadlock (instead of hanging). */
static void test_zb_deadlock(void **state) {
    (void)state;
    TPlan tp;
    tplan(&tp, 2, (int[]){0, 2, 5}, (int[]){1, 1});
    for (int kind = SCHED_ZB_H1; kind <= SCHED_ZB_H2; kind++) {
        Schedule s;
        Err err = {0};
        SchedOpts so = {.kind = (SchedKind)kind, .n_minibatches = 2, .n_micro = 4};
        if (sched_build(&tp.p, &so, &s, &err)) fail_msg("sched_build: %s", err.msg);
        SimCosts c = {2, calloc(2, sizeof(SimStageCost))};
        for (int i = 0; i < 2; i++) c.stage[i] = (SimStageCost){.fwd_s = 1e-3, .bwd_s = 2e-3, .in_bytes = 1e3, .stash_bytes = 2e3};
        SimOpts o = {NULL, 1, 0, 0, 0, 0, NULL, 0};
        SimResult sr;
        if (sim_run(&s, &c, &o, &sr, &err)) fail_msg("%s: %s", sched_kind_name(s.kind), err.msg);
        sim_result_release(&sr);
        rt_move_recv_before_send(&s.workers[0]);
        assert_int_equal(sim_run(&s, &c, &o, &sr, &err), PD_EINVAL);
        assert_non_null(strstr(err.msg, "deadlock"));
        RtConfig cfg = config(mlp_path, &s, 8);
        RtWorkerResult res[2];
        memset(res, 0, sizeof res);
        err = (Err){0};
        assert_int_not_equal(rt_emulate(&cfg, res, &err), PD_OK);
        if (!strstr(err.msg, "deadlock")) fail_msg("%s: emulation: %s", sched_kind_name(s.kind), err.msg);
        print_message("%s, a receive moved: %s\n", sched_kind_name(s.kind), err.msg);
        for (int r = 0; r < 2; r++) rt_result_release(&res[r]);
        sim_costs_release(&c);
        sched_release(&s);
    }
}

static void test_zb_equals_1f1b_flush(void **state) {
    (void)state;
    int b2[] = {0, 2, 5}, b3[] = {0, 2, 3, 5}, b4[] = {0, 2, 3, 4, 5};
    int r11[] = {1, 1}, r121[] = {1, 2, 1}, r1111[] = {1, 1, 1, 1};
    zb_case(mlp_path, 2, b2, r11, SCHED_ZB_H1, 3, 4);
    zb_case(mlp_path, 4, b4, r1111, SCHED_ZB_H1, 3, 8);
    zb_case(mlp_path, 4, b4, r1111, SCHED_ZB_H2, 3, 8);
    zb_case(mlp_path, 3, b3, r121, SCHED_ZB_H1, 3, 4);
    int c3[] = {0, 2, 5, 7};
    zb_case(cnn_path, 3, c3, r121, SCHED_ZB_H1, 3, 4);
    zb_case(cnn_path, 3, c3, r121, SCHED_ZB_H2, 2, 6);
}


/* The independent oracle of 1F1B semantics for a straight pipeline (one replica per stage):
 * stage s's forward of unit u reads version v_s(u) (the version its F instruction names),
 * its backward uses the same weights, and version k+1 of stage s is one optimizer step from
 * version k with the gradient of the k-th backward at s (units in order). Computed here
 * unit by unit with the nn API, with every version kept, nothing shared with the runtime's
 * store, slots or messages. */
static void check_1f1b_oracle(const char *model, int n_stages, const int *bounds, int vsync, int n_mb) {
    int reps[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    TPlan tp;
    tplan(&tp, n_stages, bounds, reps);
    Schedule s;
    Err err = {0};
    SchedOpts so = {.kind = SCHED_1F1B, .n_minibatches = n_mb, .n_micro = 1, .vertical_sync = vsync};
    if (sched_build(&tp.p, &so, &s, &err)) fail_msg("sched_build: %s", err.msg);
    const int B = 8;
    RtConfig cfg = config(model, &s, B);
    RtWorkerResult res[8];
    memset(res, 0, sizeof res);
    if (rt_run_threads(&cfg, res, &err)) fail_msg("threads: %s", err.msg);

    Model *m = model_load(model, &err);
    int nl = model_n_layers(m);
    if (model_build(m, 0, nl, B, &err)) fail_msg("%s", err.msg);
    /* per stage: every version's weights, the state, the optimizer, a context */
    float **W[8];
    float *st[8], *dw[8];
    Optim opt[8];
    NnCtx *ctx[8];
    int *vF[8];
    size_t np[8];
    OptConfig oc = cfg.opt;
    for (int i = 0; i < n_stages; i++) {
        int a = bounds[i], b = bounds[i + 1];
        np[i] = model_param_count(m, a, b);
        W[i] = calloc((size_t)n_mb + 1, sizeof(float *));
        W[i][0] = pd_alloc_f32(np[i]);
        model_init_params(m, a, b, cfg.seed, W[i][0]);
        size_t ns = model_state_count(m, a, b);
        st[i] = pd_alloc_f32(ns ? ns : 1);
        model_init_state(m, a, b, st[i]);
        dw[i] = pd_alloc_f32(np[i]);
        optim_init(&opt[i], &oc, np[i]);
        ctx[i] = nnctx_new(m, a, b, B);
        vF[i] = calloc((size_t)n_mb, sizeof(int));
        const SchedWorker *sw = &s.workers[tp.st[i].ranks[0]];
        for (int k = 0; k < sw->n; k++)
            if (sw->ins[k].op == OP_FORWARD) vF[i][sw->ins[k].mb] = sw->ins[k].version;
    }
    DataSampler ds;
    if (data_sampler_init(&ds, &train, B, cfg.seed, 1, 1, &err)) fail_msg("%s", err.msg);
    int32_t labels[64];
    float dl[64 * 10];
    float *x0 = pd_alloc_f32((size_t)B * 784);
    float *gbuf[9];
    for (int i = 0; i <= n_stages; i++) gbuf[i] = pd_alloc_f32((size_t)B * 1024);
    for (int u = 0; u < n_mb; u++) {
        assert_int_equal(data_sampler_get(&ds, (uint64_t)u, x0, labels), B);
        const float *x = x0;
        NnRun run = {.n = B, .train = 1, .seed = cfg.seed, .minibatch = (uint64_t)u};
        for (int i = 0; i < n_stages; i++) {
            assert_true(vF[i][u] <= u);   /* the version exists: steps only come from earlier units */
            x = model_forward(m, ctx[i], W[i][vF[i][u]], st[i], x, &run);
        }
        memset(dl, 0, sizeof dl);
        kern_xent_fwd_bwd(x, labels, dl, B, 10, 1.0f, NULL);   /* the runtime's loss kernel */
        const float *dy = dl;
        for (int i = n_stages - 1; i >= 0; i--) {
            float *dx = i ? gbuf[i] : NULL;
            if (dx) memset(dx, 0, (size_t)B * 1024 * sizeof(float));
            memset(dw[i], 0, np[i] * sizeof(float));
            model_backward(m, ctx[i], W[i][vF[i][u]], dy, dx, dw[i]);
            dy = dx;
            W[i][u + 1] = pd_alloc_f32(np[i]);
            memcpy(W[i][u + 1], W[i][u], np[i] * sizeof(float));
            optim_step(&opt[i], W[i][u + 1], dw[i]);
        }
    }
    for (int i = 0; i < n_stages; i++) {
        const RtWorkerResult *r = &res[tp.st[i].ranks[0]];
        assert_int_equal(r->n_params, np[i]);
        char what[64];
        snprintf(what, sizeof what, "1f1b%s oracle stage %d", vsync ? "+vsync" : "", i);
        /* the same float operations in the same order: bitwise */
        assert_int_equal(tu_compare(what, r->params, W[i][n_mb], np[i], 0, 0), 0);
        for (int v = 0; v <= n_mb; v++) pd_free(W[i][v]);
        free(W[i]);
        pd_free(st[i]);
        pd_free(dw[i]);
        optim_release(&opt[i]);
        nnctx_free(ctx[i]);
        free(vF[i]);
    }
    for (int i = 0; i <= n_stages; i++) pd_free(gbuf[i]);
    pd_free(x0);
    data_sampler_release(&ds);
    model_free(m);
    for (int r = 0; r < 8; r++) rt_result_release(&res[r]);
    sched_release(&s);
}

static void test_1f1b_oracle(void **state) {
    (void)state;
    int b2[] = {0, 2, 5}, b3[] = {0, 2, 3, 5}, b4[] = {0, 2, 3, 4, 5}, c3[] = {0, 2, 5, 7};
    check_1f1b_oracle(mlp_path, 2, b2, 0, 12);
    check_1f1b_oracle(mlp_path, 3, b3, 0, 12);
    check_1f1b_oracle(mlp_path, 4, b4, 0, 12);
    check_1f1b_oracle(mlp_path, 4, b4, 1, 12);
    check_1f1b_oracle(cnn_path, 3, c3, 0, 10);
    check_1f1b_oracle(cnn_path, 3, c3, 1, 10);
}

static void test_bad_launch(void **state) {
    (void)state;
    /* A plan whose stage runs layers the model does not have: a clear error, no hang. */
    int b2[] = {0, 2, 9}, r11[] = {1, 1};
    TPlan tp;
    tplan(&tp, 2, b2, r11);
    Schedule s;
    Err err = {0};
    SchedOpts so = {.kind = SCHED_1F1B, .n_minibatches = 4, .n_micro = 1};
    assert_int_equal(sched_build(&tp.p, &so, &s, &err), PD_OK);
    RtConfig cfg = config(mlp_path, &s, 8);
    RtWorkerResult res[4];
    memset(res, 0, sizeof res);
    assert_int_not_equal(rt_run_threads(&cfg, res, &err), PD_OK);
    assert_non_null(strstr(err.msg, "layer 8"));
    for (int r = 0; r < 4; r++) rt_result_release(&res[r]);
    sched_release(&s);
}

/* The profiler (rt_profile; its timing, rt_time_layers, is also what `bench --layers` prints):
 * one entry per top-level layer with the model's byte counts, times that are finite and
 * positive where a layer computes, a profile that validates; bad options are refused. */
static void test_profiler(void **state) {
    (void)state;
    RtProfileOpts o = {.minibatch = 8, .warmup = 1, .iterations = 3, .measured_on = "test"};
    Profile p;
    Err err = {0};
    if (rt_profile(mlp_path, &o, &p, &err)) fail_msg("%s", err.msg);
    assert_string_equal(p.model, "tiny-mlp");
    assert_int_equal(p.minibatch, 8);
    assert_int_equal(p.iterations, 3);
    assert_true(p.input_bytes == 4.0 * 8 * 784);
    assert_int_equal(p.n_layers, 5);
    static const double act[5] = {784, 24, 24, 16, 10};
    static const double par[5] = {0, 784 * 24 + 24, 24 * 24 + 24, 24 * 16 + 16, 16 * 10 + 10};
    for (int i = 0; i < 5; i++) {
        const ProfileLayer *l = &p.layers[i];
        assert_string_equal(l->type, i ? "linear" : "flatten");
        assert_true(l->act_bytes == 4.0 * 8 * act[i]);
        assert_true(l->param_bytes == 4.0 * par[i]);
        assert_true(isfinite(l->fwd_s) && isfinite(l->bwd_s) && l->fwd_s >= 0 && l->bwd_s >= 0);
        if (i) assert_true(l->fwd_s > 0 && l->bwd_s > 0);
        /* the split backward: the linears have a weight pass (layer 1's input gradient is not
         * wanted, as at a pipeline's input stage, but it runs), flatten has none: all in BI */
        if (i) {
            assert_true(l->bwd_in_s > 0 && l->bwd_w_s > 0);
        } else {
            assert_true(l->bwd_w_s == 0);
            assert_true(l->bwd_in_s == l->bwd_s);
        }
    }
    assert_int_equal(profile_validate(&p, &err), PD_OK);
    for (int i = 0; i < 5; i++)   /* no blocked layouts in a multi-layer perceptron: no cut prices */
        assert_true(p.layers[i].cut_out_fwd_s + p.layers[i].cut_out_bwd_s + p.layers[i].cut_in_fwd_s +
                        p.layers[i].cut_in_bwd_s == 0);
    profile_release(&p);
    /* a convolution, pool and convolution passing nChw16c between them, then flatten and a
     * linear layer on plain data: the cuts are priced on the two sides of the blocked
     * boundaries (0 | 1, 1 | 2) alone, the layers timed with the layouts they have inside */
    char conv_path[64];
    rt_write_tmp(conv_path, "{\"name\": \"blk\", \"input\": [16, 8, 8], \"layers\": ["
                            "{\"type\": \"conv2d\", \"in\": 16, \"out\": 16, \"kernel\": 3, \"pad\": 1, \"relu\": true},"
                            "{\"type\": \"maxpool\", \"kernel\": 2},"
                            "{\"type\": \"conv2d\", \"in\": 16, \"out\": 16, \"kernel\": 3, \"pad\": 1},"
                            "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"in\": 256, \"out\": 10}]}");
    if (rt_profile(conv_path, &o, &p, &err)) fail_msg("%s", err.msg);
    unlink(conv_path);
    assert_int_equal(p.n_layers, 5);
    assert_int_equal(profile_validate(&p, &err), PD_OK);
    for (int i = 0; i < 5; i++) {
        const ProfileLayer *l = &p.layers[i];
        double out = l->cut_out_fwd_s + l->cut_out_bwd_s, in = l->cut_in_fwd_s + l->cut_in_bwd_s;
        assert_true(isfinite(out) && isfinite(in) && out >= 0 && in >= 0);
        if (i >= 2) assert_true(out == 0);
        if (i == 0 || i >= 3) assert_true(in == 0);
        assert_true(l->fwd_s > 0 || i == 3);
    }
    profile_release(&p);
    o.iterations = 0;
    assert_int_equal(rt_profile(mlp_path, &o, &p, &err), PD_EINVAL);
}

/* The simulator's gradient buckets are the runtime's: on vgg16 (16.8 MB and 2.4 MB linear
 * layers, convolutions of every size), for one stage of every layer and for a two-stage cut,
 * sim_costs_from_profile forms as many buckets as rt_buckets with its default size
 * (SIM_BUCKET_BYTES against RT_BUCKET_BYTES), of the same bytes, each ready once the backward
 * has passed the layers rt_buckets puts in it and those after. */
static void test_buckets_agree(void **state) {
    (void)state;
    Err err = {0};
    Model *m = model_load(tu_src("models/vgg16.json"), &err);
    if (!m) fail_msg("%s", err.msg);
    int nl = model_n_layers(m);
    assert_true(nl <= 32);
    ProfileLayer L[32];
    memset(L, 0, sizeof L);
    for (int i = 0; i < nl; i++) {
        L[i].fwd_s = 0.001;
        L[i].bwd_s = 0.001 * (i + 1);   /* unequal, so a shifted boundary changes the ready share */
        L[i].param_bytes = 4.0 * (double)(model_param_offset(m, i + 1) - model_param_offset(m, i));
    }
    Profile prof = {.minibatch = 8, .n_layers = nl, .layers = L};
    int cut = nl / 2;
    const int one[] = {0, nl}, two[] = {0, cut, nl};
    for (int c = 0; c < 2; c++) {
        int n_stages = c + 1;
        TPlan tp;
        tplan(&tp, n_stages, c ? two : one, (int[]){2, 1});
        Schedule s;
        SchedOpts so = {.kind = c ? SCHED_1F1B : SCHED_DP, .n_minibatches = 4, .n_micro = 1};
        if (sched_build(&tp.p, &so, &s, &err)) fail_msg("sched_build: %s", err.msg);
        SimCosts sc;
        if (sim_costs_from_profile(&s, &prof, &sc, &err)) fail_msg("%s", err.msg);
        for (int st = 0; st < n_stages; st++) {
            const int *b = c ? two : one;
            int layer[32];
            size_t lo[32], n[32];
            int nb = rt_buckets(m, b[st], b[st + 1], 0, layer, lo, n);
            assert_true(nb > (st == n_stages - 1 ? 1 : 0));   /* the linear layers make several */
            assert_int_equal(sc.stage[st].n_buckets, nb);
            double total = 0;
            for (int i = b[st]; i < b[st + 1]; i++) total += L[i].bwd_s;
            for (int k = 0; k < nb; k++) {
                assert_true(sc.stage[st].bucket_bytes[k] == 4.0 * (double)n[k]);
                double done = 0;
                for (int i = layer[k]; i < b[st + 1]; i++) done += L[i].bwd_s;
                assert_true(fabs(sc.stage[st].bucket_ready[k] - done / total) < 1e-12);
            }
        }
        sim_costs_release(&sc);
        sched_release(&s);
    }
    model_free(m);
}

/* A killed rank whose parent has not reaped it is a zombie: kill(pid, 0) still succeeds, but
 * the rank is gone; a rank that lives is not. */
static void test_fail_pid_gone(void **state) {
    (void)state;
    pid_t live = fork();
    assert_true(live >= 0);
    if (live == 0) {
        for (;;) pause();
    }
    assert_int_equal(rt_fail_pid_gone(live), 0);
    assert_int_equal(rt_fail_pid_gone(getpid()), 0);
    assert_int_equal(kill(live, SIGKILL), 0);
    siginfo_t si;
    memset(&si, 0, sizeof si);   /* wait for its death without reaping it: a zombie */
    assert_int_equal(waitid(P_PID, (id_t)live, &si, WEXITED | WNOWAIT), 0);
    assert_int_equal(kill(live, 0), 0);
    assert_int_equal(rt_fail_pid_gone(live), 1);
    assert_int_equal(waitpid(live, NULL, 0), live);
    assert_int_equal(rt_fail_pid_gone(live), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_async_equals_emulation),
        cmocka_unit_test(test_async_inflight),
        cmocka_unit_test(test_sync_equals_sequential),
        cmocka_unit_test(test_1f1b_oracle),
        cmocka_unit_test(test_zb_equals_1f1b_flush),
        cmocka_unit_test(test_zb_deadlock),
        cmocka_unit_test(test_bad_launch),
        cmocka_unit_test(test_profiler),
        cmocka_unit_test(test_buckets_agree),
        cmocka_unit_test(test_fail_pid_gone),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
