/* test_runtime_session.c: a training session (rt_train, rt_session.c), part by part, on
 * synthetic data given in the spec (RtTrainSpec.train / .test):
 *   - the segment loop: where segments end (rt_segment_end), and a session whose segments end
 *     at checkpoints and evaluations writes, evaluates and prunes where it should;
 *   - resume slicing: rt_stage_state_slice gives an interleaved rank its chunks' ranges,
 *     concatenated; a resumed interleaved session ends bitwise where an uninterrupted one does;
 *   - evaluation and target accuracy: the log of evaluations, stopping at the first that
 *     reaches the target;
 *   - the result gather: a worker's figures packed and unpacked unchanged, damaged bytes refused;
 *   - the summary: the simulator's error reported, not taken for a missing profile;
 *   - one-worker training (no plan) is minibatch SGD on the whole model; --save writes the
 *     final weights; checkpoints record the optimizer (another is an error naming both) and
 *     its hyper-parameters (changes named). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "rt_fixture.h"
#include "rt_session.h"
#include "runtime.h"

static char mlp_path[64], cnn_path[64], mlp9_path[64];
static Dataset train, test;

static int setup(void **state) {
    (void)state;
    rt_fixture_setup(mlp_path, cnn_path, &train);
    rt_write_tmp(mlp9_path, RT_MLP9_JSON);
    Err err = {0};
    if (data_synthetic(200, 1, 28, 28, 10, 8, &test, &err)) fail_msg("%s", err.msg);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    rt_fixture_teardown(mlp_path, cnn_path, &train);
    unlink(mlp9_path);
    data_release(&test);
    return 0;
}

static OptConfig sgd(float lr, float momentum) {
    OptConfig o = optim_defaults(OPT_SGD, lr);
    o.momentum = momentum;
    return o;
}

/* The runtime tests' recipe (rt_fixture.h: SGD lr 0.05, momentum 0.9, seed 11) on the synthetic
 * data, minibatch 16. */
static RtTrainSpec spec(const char *model, const Plan *plan, SchedKind kind, int micro, int steps) {
    return (RtTrainSpec){.model_path = model, .plan = plan, .kind = kind, .n_micro = micro, .steps = steps,
                         .minibatch = 16, .opt = sgd(0.05f, 0.9f), .seed = 11, .threads = 1, .timeout_s = 60,
                         .train = &train, .test = &test};
}

/* tplan's plan with a cluster of its workers (a session validates the plan). */
static void tplan_c(TPlan *t, int n_stages, const int *bounds, const int *reps) {
    tplan(t, n_stages, bounds, reps);
    t->p.cluster.n_levels = 1;
    t->p.cluster.level[0] = (ClusterLevel){.workers = t->p.n_workers, .bandwidth = 1e10, .latency = 0};
}

static void run(const RtTrainSpec *sp, RtTrainSummary *out) {
    Err err = {0};
    if (rt_train(NULL, sp, out, &err)) fail_msg("rt_train: %s", err.msg);
}

static void tmpdir(char *dir) {
    strcpy(dir, "/tmp/pd_rt_session_XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void rmdir_all(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static int exists(const char *dir, int mb) {
    char p[600];
    snprintf(p, sizeof p, "%s/ckpt-%010d.safetensors", dir, mb);
    return access(p, R_OK) == 0;
}

/* ---- the segment loop --------------------------------------------------------------------------- */

static void test_segment_end(void **state) {
    (void)state;
    assert_int_equal(rt_segment_end(0, 10, 0, 0), 10);    /* one segment */
    assert_int_equal(rt_segment_end(0, 10, 4, 0), 4);     /* checkpoints */
    assert_int_equal(rt_segment_end(4, 10, 4, 0), 8);
    assert_int_equal(rt_segment_end(8, 10, 4, 0), 10);    /* the end comes first */
    assert_int_equal(rt_segment_end(0, 10, 4, 3), 3);     /* evaluations too */
    assert_int_equal(rt_segment_end(3, 10, 4, 3), 4);
    assert_int_equal(rt_segment_end(4, 10, 4, 3), 6);
    assert_int_equal(rt_segment_end(5, 10, 4, 3), 6);     /* resumed off the grid: the next multiple */
    assert_int_equal(rt_segment_end(9, 10, 4, 3), 10);
}

/* Segments end at checkpoints (6, 12) and evaluations (4, 8): checkpoints written at 6 and 12
 * (--keep-last 1: only 12 stays), evaluations after 4, 8 and at the end, the summary's test
 * accuracy the last one's; a synchronous kind ends where one segment does, bitwise. */
static void test_session_segments(void **state) {
    (void)state;
    int b[3] = {0, 2, 5}, r[2] = {1, 1};
    TPlan tp;
    tplan_c(&tp, 2, b, r);
    char dir[64];
    tmpdir(dir);
    RtTrainSpec sp = spec(mlp_path, &tp.p, SCHED_1F1B_FLUSH, 2, 12);
    RtTrainSummary one, seg;
    run(&sp, &one);
    assert_int_equal(one.n_evals, 1);
    sp.checkpoint_every = 6, sp.checkpoint_dir = dir, sp.eval_every = 4;
    run(&sp, &seg);
    assert_true(exists(dir, 6) && exists(dir, 12));
    assert_int_equal(seg.n_evals, 3);
    for (int i = 0; i < 3; i++) assert_int_equal(seg.evals[i].minibatches, 4 * (i + 1));
    assert_true(seg.test_accuracy == seg.evals[2].test_accuracy && seg.test_loss == seg.evals[2].test_loss);
    assert_true(seg.evals[0].epoch == 4.0 * 16 / 640);
    assert_true(seg.evals[0].train_s > 0 && seg.evals[1].train_s > seg.evals[0].train_s);
    for (int i = 0; i < 2; i++) assert_int_equal(seg.stage[i].weights_crc, one.stage[i].weights_crc);
    assert_int_equal(seg.steps, 12);
    assert_int_equal(seg.units, 24);
    rt_train_summary_release(&seg);
    rmdir_all(dir);
    tmpdir(dir);
    sp.checkpoint_dir = dir, sp.keep_last = 1;
    run(&sp, &seg);
    assert_true(!exists(dir, 6) && exists(dir, 12));
    char want[600];
    snprintf(want, sizeof want, "%s/ckpt-%010d.safetensors", dir, 12);
    assert_string_equal(seg.last_checkpoint, want);
    rt_train_summary_release(&seg);
    rt_train_summary_release(&one);
    rmdir_all(dir);
}

/* ---- resume slicing ------------------------------------------------------------------------------ */

/* An interleaved plan of 4 stages of tiny-mlp9 on 2 ranks (stage i on rank i mod 2). */
static void interleaved_plan(TPlan *tp) {
    int b[5] = {0, 3, 5, 7, 9}, r[4] = {1, 1, 1, 1};
    tplan_c(tp, 4, b, r);
    tp->ranks[2][0] = 0, tp->ranks[3][0] = 1;
    tp->p.n_workers = 2, tp->p.chunks = 2, tp->p.noam = 2;
}

static void test_state_slice(void **state) {
    (void)state;
    Err err = {0};
    Model *m = model_load(mlp9_path, &err);
    if (!m) fail_msg("%s", err.msg);
    int nl = model_n_layers(m);
    size_t np = model_param_count(m, 0, nl);
    RtCkpt c = {.params = pd_alloc_f32(np), .opt_m = pd_alloc_f32(np), .opt_v = pd_alloc_f32(np),
                .state = pd_alloc_f32(1), .opt_step = 7};
    for (size_t i = 0; i < np; i++) c.params[i] = (float)i, c.opt_m[i] = -(float)i, c.opt_v[i] = 2.0f * (float)i;
    TPlan tp;
    interleaved_plan(&tp);
    Schedule s;
    SchedOpts so = {.kind = SCHED_INTERLEAVED, .n_minibatches = 1, .n_micro = 2};
    if (sched_build(&tp.p, &so, &s, &err)) fail_msg("%s", err.msg);
    int b[5] = {0, 3, 5, 7, 9};
    for (int rank = 0; rank < 2; rank++) {
        RtStageState st;
        assert_int_equal(rt_stage_state_slice(m, &s, rank, &c, &st), 1);
        assert_int_equal(st.opt_step, 7);
        size_t k = 0;
        for (int chunk = 0; chunk < 2; chunk++) {   /* stages rank and rank + 2, in that order */
            int first = b[rank + 2 * chunk], last = b[rank + 2 * chunk + 1];
            size_t o = model_param_offset(m, first), n = model_param_count(m, first, last);
            for (size_t i = 0; i < n; i++, k++) {
                assert_true(st.params[k] == (float)(o + i));
                assert_true(st.opt_m[k] == -(float)(o + i) && st.opt_v[k] == 2.0f * (float)(o + i));
            }
        }
        rt_stage_state_free(&st);
    }
    sched_release(&s);
    /* one stage per rank: pointers into the checkpoint's buffers */
    TPlan t2;
    int b2[3] = {0, 4, 9}, r2[2] = {1, 1};
    tplan(&t2, 2, b2, r2);
    SchedOpts s1 = {.kind = SCHED_1F1B, .n_minibatches = 1, .n_micro = 1};
    if (sched_build(&t2.p, &s1, &s, &err)) fail_msg("%s", err.msg);
    RtStageState st;
    assert_int_equal(rt_stage_state_slice(m, &s, 1, &c, &st), 0);
    assert_ptr_equal(st.params, c.params + model_param_offset(m, 4));
    assert_ptr_equal(st.opt_v, c.opt_v + model_param_offset(m, 4));
    assert_int_equal(rt_stage_state_slice(m, &s, 5, &c, &st), 0);   /* not in the plan: nothing */
    assert_null(st.params);
    sched_release(&s);
    pd_free(c.params), pd_free(c.opt_m), pd_free(c.opt_v), pd_free(c.state);
    model_free(m);
}

/* Interleaved, 8 minibatches, checkpoints every 4; resumed from the one after 4 (each rank its
 * chunks' slices of the checkpoint): the same weights, bitwise. */
static void test_session_resume_interleaved(void **state) {
    (void)state;
    TPlan tp;
    interleaved_plan(&tp);
    char dir[64];
    tmpdir(dir);
    RtTrainSpec sp = spec(mlp9_path, &tp.p, SCHED_INTERLEAVED, 2, 8);
    sp.checkpoint_every = 4, sp.checkpoint_dir = dir;
    RtTrainSummary a, b;
    run(&sp, &a);
    char p8[600];
    snprintf(p8, sizeof p8, "%s/ckpt-%010d.safetensors", dir, 8);
    assert_int_equal(unlink(p8), 0);
    sp.resume = dir;
    run(&sp, &b);
    assert_int_equal(b.resumed_from, 4);
    assert_int_equal(b.stages, 4);
    for (int i = 0; i < 4; i++) assert_int_equal(a.stage[i].weights_crc, b.stage[i].weights_crc);
    rt_train_summary_release(&a);
    rt_train_summary_release(&b);
    rmdir_all(dir);
}

/* ---- evaluation and target accuracy -------------------------------------------------------------- */

static void test_eval_log(void **state) {
    (void)state;
    RtEvalLog log = {0};
    int64_t ct[2] = {30, 100};
    const RtEvalPoint *p = rt_eval_log_add(&log, 10, 64, 640, 1.5, ct, 250.0);
    assert_int_equal(p->minibatches, 10);
    assert_true(p->epoch == 1.0 && p->train_s == 1.5 && p->test_accuracy == 0.3 && p->test_loss == 2.5);
    int64_t ct2[2] = {45, 100};
    p = rt_eval_log_add(&log, 20, 64, 640, 3.0, ct2, 200.0);
    assert_int_equal(log.n, 2);
    assert_true(log.ct[0] == 45 && log.loss_sum == 200.0 && p->test_accuracy == 0.45);
    assert_false(rt_target_reached(0, p));      /* no target */
    assert_true(rt_target_reached(0.45, p));
    assert_false(rt_target_reached(0.46, p));
    rt_eval_log_release(&log);
    assert_null(log.pts);
}

/* A target between the first and the last evaluation's accuracy stops the run at the first
 * evaluation reaching it. */
static void test_session_target(void **state) {
    (void)state;
    int b[3] = {0, 2, 5}, r[2] = {1, 1};
    TPlan tp;
    tplan_c(&tp, 2, b, r);
    RtTrainSpec sp = spec(mlp_path, &tp.p, SCHED_1F1B, 1, 24);
    sp.eval_every = 4;
    RtTrainSummary a, t;
    run(&sp, &a);
    assert_int_equal(a.n_evals, 6);
    assert_true(a.target_minibatches == 0);
    int k = -1;   /* the first evaluation better than the first one */
    for (int i = 1; i < a.n_evals && k < 0; i++)
        if (a.evals[i].test_accuracy > a.evals[0].test_accuracy) k = i;
    if (k < 0) fail_msg("no evaluation improved on the first (%.4f)", a.evals[0].test_accuracy);
    sp.target_accuracy = a.evals[k].test_accuracy;
    run(&sp, &t);
    assert_int_equal(t.target_minibatches, a.evals[k].minibatches);
    assert_int_equal(t.steps, (int)a.evals[k].minibatches);
    assert_int_equal(t.n_evals, k + 1);
    assert_true(t.test_accuracy == a.evals[k].test_accuracy && t.target_train_s > 0);
    rt_train_summary_release(&a);
    rt_train_summary_release(&t);
}

/* ---- the result gather --------------------------------------------------------------------------- */

static void test_result_pack(void **state) {
    (void)state;
    RtWorkerResult a = {.rank = 3, .stage = 1, .replica = 1, .n_chunks = 2, .n_params = 77, .n_state = 5,
                        .params_crc = 0xdeadbeef, .max_versions = 3, .loss_sum = 12.5, .last_loss = 2.25, .last_mb = 41, .last_n = 3,
                        .units_done = 9, .test_correct = 40, .test_total = 100, .test_loss_sum = 123.25,
                        .wall_s = 1.5, .compute_s = 1.25, .wait_s = 0.125, .n_fwd = 9, .n_bwd = 9,
                        .asp_applied = 4, .asp_staleness_mean = 1.5, .asp_staleness_max = 3, .asp_pulls = 2,
                        .asp_pull_ms_mean = 0.5, .asp_pull_ms_max = 0.75, .cpu_s = 2.5, .pid = 4242,
                        .n_delayed = 9, .delay_sum = 12, .delay_max = 2};
    a.chunk_crc[1] = 7, a.chunk_compute_s[1] = 0.5, a.chunk_fwd[1] = 4;
    a.mem.total = 1000, a.mem.versions = 3;
    RtEvent ev[2] = {{OP_FORWARD, 1, 0, 0.1, 0.2}, {OP_BACKWARD, 1, 0, 0.3, 0.5}};
    float hist[6] = {0, 2.5f, 0.25f, 1, 2.0f, 0.5f};
    a.events = ev, a.n_events = 2, a.hist = hist, a.n_hist = 2;
    size_t n;
    char *buf = rt_result_pack(&a, &n);
    RtWorkerResult b;
    Err err = {0};
    assert_int_equal(rt_result_unpack(buf, n, 3, &b, &err), PD_OK);
    assert_int_equal(b.rank, 3);
    assert_int_equal(b.replica, 1);
    assert_int_equal(b.n_chunks, 2);
    assert_int_equal(b.n_params, 77);
    assert_int_equal(b.params_crc, 0xdeadbeef);
    assert_true(b.loss_sum == 12.5 && b.last_loss == 2.25 && b.test_loss_sum == 123.25);
    assert_true(b.last_mb == 41 && b.last_n == 3);
    assert_true(b.test_correct == 40 && b.test_total == 100 && b.units_done == 9);
    assert_true(b.wall_s == 1.5 && b.compute_s == 1.25 && b.wait_s == 0.125 && b.cpu_s == 2.5 && b.pid == 4242);
    assert_true(b.asp_applied == 4 && b.asp_staleness_max == 3 && b.asp_pull_ms_max == 0.75);
    assert_true(b.n_delayed == 9 && b.delay_sum == 12 && b.delay_max == 2);
    assert_true(b.chunk_crc[1] == 7 && b.chunk_compute_s[1] == 0.5 && b.chunk_fwd[1] == 4);
    assert_true(b.mem.total == 1000 && b.mem.versions == 3);
    assert_int_equal(b.n_events, 2);
    assert_memory_equal(b.events, ev, sizeof ev);
    assert_int_equal(b.n_hist, 2);
    assert_memory_equal(b.hist, hist, sizeof hist);
    rt_result_release(&b);
    /* a record cut short, or with a tail it does not announce */
    assert_int_equal(rt_result_unpack(buf, n - 1, 3, &b, &err), PD_ECOMM);
    assert_non_null(strstr(err.msg, "rank 3 sent"));
    assert_int_equal(rt_result_unpack(buf, 10, 2, &b, &err), PD_ECOMM);
    free(buf);
}

/* ---- the summary --------------------------------------------------------------------------------- */

/* A profile the simulator cannot use for the plan (fewer layers): the summary says why there is
 * no prediction; a usable one predicts. */
static void test_summary_prediction(void **state) {
    (void)state;
    int b[3] = {0, 2, 5}, r[2] = {1, 1};
    TPlan tp;
    tplan_c(&tp, 2, b, r);
    Schedule s;
    SchedOpts so = {.kind = SCHED_1F1B, .n_minibatches = 4, .n_micro = 1};
    Err err = {0};
    if (sched_build(&tp.p, &so, &s, &err)) fail_msg("%s", err.msg);
    ProfileLayer layers[5];
    memset(layers, 0, sizeof layers);
    for (int i = 0; i < 5; i++) layers[i].fwd_s = 1e-3, layers[i].bwd_s = 2e-3, layers[i].act_bytes = 1e3;
    Profile prof = {.minibatch = 16, .n_layers = 3, .layers = layers};
    RtTrainSpec sp = spec(mlp_path, &tp.p, SCHED_1F1B, 1, 4);
    sp.profile = &prof;
    for (int usable = 0; usable < 2; usable++) {
        prof.n_layers = usable ? 5 : 3;
        RtTrainSummary out;
        memset(&out, 0, sizeof out);
        out.res = calloc(2, sizeof *out.res);
        for (int k = 0; k < 2; k++) out.res[k].rank = k, out.res[k].stage = k, out.res[k].wall_s = 1;
        rt_summarize(&sp, &s, 16, "threads", 640, NAN, NAN, &out);
        if (usable) {
            assert_string_equal(out.predicted_note, "same plan and profile");
            assert_true(isfinite(out.predicted_time_per_unit_ms));
            /* measured is the run's wall over its units, so the prediction is the simulated run's:
             * 4 minibatches on the bottleneck stage (9 ms each) plus stage 0's first forward
             * (2 ms) and last backward (4 ms) at least, against 9 ms per unit in steady state */
            assert_true(out.predicted_steady_ms >= 9.0 - 1e-9);
            assert_true(out.predicted_time_per_unit_ms >= (4 * 9.0 + 2.0 + 4.0) / 4 - 1e-9);
        } else {
            assert_non_null(strstr(out.predicted_note, "simulator: "));
            assert_non_null(strstr(out.predicted_note, "the profile has 3 layers"));
            assert_true(isnan(out.predicted_time_per_unit_ms));
        }
        rt_train_summary_release(&out);
    }
    sp.profile = NULL;
    RtTrainSummary out;
    memset(&out, 0, sizeof out);
    out.res = calloc(2, sizeof *out.res);
    rt_summarize(&sp, &s, 16, "threads", 640, NAN, NAN, &out);
    assert_string_equal(out.predicted_note, "no profile given");
    rt_train_summary_release(&out);
    sched_release(&s);
}

/* ---- one worker, --save, the optimizer in checkpoints -------------------------------------------- */

/* No plan: one stage of the whole model on one worker, which is minibatch SGD (rt_sequential);
 * --save writes its final weights. */
static void test_session_one_worker(void **state) {
    (void)state;
    char dir[64], path[128];
    tmpdir(dir);
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    RtTrainSpec sp = spec(mlp_path, NULL, SCHED_1F1B, 1, 10);
    sp.save = path;
    RtTrainSummary a;
    run(&sp, &a);
    assert_int_equal(a.workers, 1);
    assert_int_equal(a.stages, 1);
    assert_int_equal(a.steps, 10);
    assert_true(isnan(a.data_mean) && isnan(a.data_std));   /* given data: used as it is */
    assert_true(a.epochs == 10.0 * 16 / 640);
    size_t np;
    float *want = rt_sequential(mlp_path, &train, 10, 1, 16, &np);
    Err err = {0};
    Model *m = model_load(mlp_path, &err);
    float *got = pd_alloc_f32(np), *st = pd_alloc_f32(1);
    RtCkpt w = {.params = got, .state = st};
    if (rt_weights_load(path, m, &w, &err)) fail_msg("%s", err.msg);
    assert_true(isnan(w.data_mean));
    for (size_t i = 0; i < np; i++)
        if (fabsf(got[i] - want[i]) > 1e-5f * (1 + fabsf(want[i]))) fail_msg("param %zu: %g, sequential %g", i, got[i], want[i]);
    assert_int_equal(pd_crc32(got, np * sizeof(float)), a.stage[0].weights_crc);
    pd_free(got), pd_free(st), pd_free(want);
    model_free(m);
    rt_train_summary_release(&a);
    rmdir_all(dir);
}

/* The final loss is the last minibatch's, whose micro-batches a replicated last stage's replicas
 * share (2 of 4 each): as one worker's, from the first minibatch on (before, each replica
 * averaged its last 4 units, which spanned two minibatches, and reported 0 after one). */
static void test_final_loss_replicas(void **state) {
    (void)state;
    int b[3] = {0, 2, 5}, r[2] = {1, 2};
    TPlan tp;
    tplan_c(&tp, 2, b, r);
    for (int steps = 1; steps <= 3; steps += 2) {
        RtTrainSpec one = spec(mlp_path, NULL, SCHED_1F1B_FLUSH, 4, steps), rep = one;
        rep.plan = &tp.p;
        RtTrainSummary a, c;
        run(&one, &a);
        run(&rep, &c);
        assert_int_equal(c.workers, 3);
        /* the one worker's: the mean of its last 4 units' losses, from its loss history */
        const RtWorkerResult *w0 = &a.res[0];
        double sum = 0;
        int n = 0;
        for (int k = 0; k < w0->n_hist; k++)
            if (w0->hist[3 * k] >= 4 * (steps - 1)) sum += w0->hist[3 * k + 1], n++;
        assert_int_equal(n, 4);
        if (fabs(a.final_loss - sum / n) > 1e-6 * fabs(a.final_loss))
            fail_msg("%d steps: final loss %.9g, the last minibatch's units %.9g", steps, a.final_loss, sum / n);
        if (fabs(c.final_loss - a.final_loss) > 1e-5 * fabs(a.final_loss))
            fail_msg("%d steps: final loss %.9g with replicas, %.9g one worker", steps, c.final_loss, a.final_loss);
        rt_train_summary_release(&a);
        rt_train_summary_release(&c);
    }
}

/* An Adam checkpoint resumed with SGD: an error naming both (before, Adam's first moment became
 * SGD's momentum); hyper-parameters recorded and their changes named. */
static void test_ckpt_optimizer(void **state) {
    (void)state;
    char dir[64];
    tmpdir(dir);
    RtTrainSpec sp = spec(mlp_path, NULL, SCHED_1F1B, 1, 4);
    sp.opt = optim_defaults(OPT_ADAM, 1e-3f);
    sp.checkpoint_every = 4, sp.checkpoint_dir = dir;
    RtTrainSummary a;
    run(&sp, &a);
    rt_train_summary_release(&a);
    RtTrainSpec r = spec(mlp_path, NULL, SCHED_1F1B, 1, 8);
    r.resume = dir;
    Err err = {0};
    assert_int_equal(rt_train(NULL, &r, &a, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "taken with --optimizer adam, this run has --optimizer sgd"));
    /* what the checkpoint records */
    Model *m = model_load(mlp_path, &err);
    size_t np = model_param_count(m, 0, model_n_layers(m));
    RtCkpt c = {.params = pd_alloc_f32(np), .opt_m = pd_alloc_f32(np), .opt_v = pd_alloc_f32(np),
                .state = pd_alloc_f32(1)};
    char p[600];
    snprintf(p, sizeof p, "%s/ckpt-%010d.safetensors", dir, 4);
    if (rt_ckpt_load(p, m, &c, &err)) fail_msg("%s", err.msg);
    assert_int_equal(c.opt.kind, OPT_ADAM);
    assert_true(c.opt.lr == 1e-3f && c.opt.beta1 == 0.9f && c.opt.beta2 == 0.999f && c.opt.eps == 1e-8f);
    assert_true(c.opt.weight_decay == 0 && isnan(c.opt.momentum));
    char was[128], now[128];
    OptConfig run2 = optim_defaults(OPT_ADAM, 1e-3f);
    assert_int_equal(rt_ckpt_opt_changes(&c.opt, &run2, was, now, sizeof was), 0);
    run2.lr = 2e-3f, run2.weight_decay = 0.5f;
    assert_int_equal(rt_ckpt_opt_changes(&c.opt, &run2, was, now, sizeof was), 2);
    assert_string_equal(was, "--lr 0.001 --weight-decay 0");
    assert_string_equal(now, "--lr 0.002 --weight-decay 0.5");
    pd_free(c.params), pd_free(c.opt_m), pd_free(c.opt_v), pd_free(c.state);
    /* an SGD checkpoint in an Adam run */
    c = (RtCkpt){.params = pd_alloc_f32(np), .opt_m = pd_alloc_f32(np), .state = pd_alloc_f32(1)};
    RtCkpt s = c;
    s.opt = sgd(0.05f, 0.9f), s.seed = 1, s.data_mean = s.data_std = NAN;
    if (rt_ckpt_save(dir, m, &s, NULL, 0, &err)) fail_msg("%s", err.msg);   /* minibatch 0 */
    RtCkpt back = c;
    snprintf(p, sizeof p, "%s/ckpt-%010d.safetensors", dir, 0);
    if (rt_ckpt_load(p, m, &back, &err)) fail_msg("%s", err.msg);
    assert_true(back.opt.kind == OPT_SGD && back.opt.lr == 0.05f && back.opt.momentum == 0.9f);
    back.opt_v = pd_alloc_f32(np);
    assert_int_equal(rt_ckpt_load(p, m, &back, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "taken with --optimizer sgd, this run has --optimizer adam"));
    pd_free(back.opt_v);
    pd_free(c.params), pd_free(c.opt_m), pd_free(c.state);
    model_free(m);
    rmdir_all(dir);
}

/* The name every rank gives a checkpoint, checked: a directory too long for it is an error,
 * never a name cut short. */
static void test_ckpt_path(void **state) {
    (void)state;
    char p[4096], dir[4100];
    Err err = {0};
    assert_int_equal(rt_ckpt_path("/tmp/x", 12, p, sizeof p, &err), PD_OK);
    assert_string_equal(p, "/tmp/x/ckpt-0000000012.safetensors");
    memset(dir, 'd', 4080);
    dir[0] = '/', dir[4080] = 0;
    assert_int_equal(rt_ckpt_path(dir, 12, p, sizeof p, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "too long"));
    assert_int_equal(rt_ckpt_path("/tmp/x", 12, p, 20, &err), PD_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_segment_end),
        cmocka_unit_test(test_session_segments),
        cmocka_unit_test(test_state_slice),
        cmocka_unit_test(test_session_resume_interleaved),
        cmocka_unit_test(test_eval_log),
        cmocka_unit_test(test_session_target),
        cmocka_unit_test(test_result_pack),
        cmocka_unit_test(test_summary_prediction),
        cmocka_unit_test(test_session_one_worker),
        cmocka_unit_test(test_final_loss_replicas),
        cmocka_unit_test(test_ckpt_optimizer),
        cmocka_unit_test(test_ckpt_path),
    };
    return tu_run_group(tests, setup, teardown);
}
