/* test_runtime_tied.c: tied parameters ("tie" in the model JSON) in the pipelined runtime.
 * An MLP whose layer 5 ties its weight to layer 2's, planned so that the two layers land on
 * stages 0 and 3 of four:
 *  - 1f1b-flush over threads, after each of 1..4 minibatches (one run per length): the two
 *    copies are BITWISE equal, and the whole model equals one-worker sequential SGD with the
 *    tied gradient summed (rt_sequential) within 1e-4 relative;
 *  - gpipe with stages 0 and 3 replicated twice: all four copies bitwise equal, and the same
 *    sequential result (the exchange composes with the replicas' all-reduce);
 *  - the serial emulation equals the threads transport bitwise;
 *  - zb-h1, zb-h2 and model-parallel: the same checks as 1f1b-flush;
 *  - 1f1b and 2bw (stages step at their own times) and interleaved refuse the split tie, naming
 *    both tensors; with both layers on one stage, 1f1b runs and keeps the copies equal. */
#include "rt_fixture.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runtime.h"

#define TIED_JSON \
    "{\"name\": \"tied-mlp\", \"input\": [1, 28, 28], \"layers\": [" \
    "{\"type\": \"flatten\"}," \
    "{\"type\": \"linear\", \"in\": 784, \"out\": 16, \"relu\": true}," \
    "{\"type\": \"linear\", \"in\": 16, \"out\": 16, \"relu\": true}," \
    "{\"type\": \"linear\", \"in\": 16, \"out\": 16, \"relu\": true}," \
    "{\"type\": \"linear\", \"in\": 16, \"out\": 16, \"relu\": true}," \
    "{\"type\": \"linear\", \"in\": 16, \"out\": 16, \"relu\": true, \"tie\": \"layers.2.weight\"}," \
    "{\"type\": \"linear\", \"in\": 16, \"out\": 10}]}"

static char path[64];
static Dataset train;
static Model *model;
static size_t src_off, dst_off, tie_n;   /* the two copies in the whole model's buffer */

static int setup(void **state) {
    (void)state;
    rt_write_tmp(path, TIED_JSON);
    Err err = {0};
    if (data_synthetic(640, 1, 28, 28, 10, 7, &train, &err)) fail_msg("%s", err.msg);
    if (!(model = model_load(path, &err))) fail_msg("%s", err.msg);
    int nt, np;
    const ParamTie *t = model_ties(model, &nt);
    const ParamInfo *pt = model_param_tensors(model, &np);
    assert_int_equal(nt, 1);
    assert_string_equal(pt[t[0].src].name, "layers.2.weight");
    assert_string_equal(pt[t[0].dst].name, "layers.5.weight");
    src_off = pt[t[0].src].offset;
    dst_off = pt[t[0].dst].offset;
    tie_n = shape_numel(pt[t[0].src].shape);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    unlink(path);
    data_release(&train);
    model_free(model);
    return 0;
}

static RtConfig config(const Schedule *s) {
    RtConfig c = {0};
    c.model_path = path;
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

/* The whole model's weights from the results of replica `rep` of every stage (clamped). */
static void gather(const TPlan *tp, const RtWorkerResult *res, int rep, float *w) {
    for (int st = 0; st < tp->p.n_stages; st++) {
        const PlanStage *ps = &tp->st[st];
        const RtWorkerResult *r = &res[ps->ranks[rep < ps->replicas ? rep : ps->replicas - 1]];
        size_t off = model_param_offset(model, ps->layers[0]);
        assert_int_equal(r->n_params, model_param_count(model, ps->layers[0], ps->layers[ps->n_layers - 1] + 1));
        memcpy(w + off, r->params, r->n_params * sizeof(float));
    }
}

/* Runs kind for n_mb minibatches of n_micro units on threads (or the emulation); res gets
 * every rank's result. Returns PD_OK or the error (err). */
static int run(const TPlan *tp, SchedKind kind, int n_mb, int n_micro, int emulate, RtWorkerResult *res, Err *err) {
    Schedule s;
    SchedOpts so = {.kind = kind, .n_minibatches = n_mb, .n_micro = n_micro};
    if (sched_build(&tp->p, &so, &s, err)) fail_msg("sched_build: %s", err->msg);
    RtConfig cfg = config(&s);
    int rc = emulate ? rt_emulate(&cfg, res, err) : rt_run_threads(&cfg, res, err);
    sched_release(&s);
    return rc;
}

/* Every replica's copies equal each other bitwise, and the model equals sequential SGD. */
static void check_case(const TPlan *tp, const RtWorkerResult *res, int n_mb, int per, const char *what) {
    size_t np = model_param_count(model, 0, model_n_layers(model)), np_seq;
    float *w = pd_alloc_f32(np), *w0 = pd_alloc_f32(np);
    float *seq = rt_sequential(path, &train, n_mb, per, 8, &np_seq);
    assert_int_equal(np, np_seq);
    gather(tp, res, 0, w0);
    for (int rep = 0; rep < 2; rep++) {
        gather(tp, res, rep, w);
        if (memcmp(w + src_off, w + dst_off, tie_n * sizeof(float)))
            fail_msg("%s, replica %d: the tied copies differ", what, rep);
        if (memcmp(w, w0, np * sizeof(float))) fail_msg("%s: replica %d differs from replica 0", what, rep);
    }
    if (tu_compare(what, w, seq, np, 1e-4, 1e-6)) fail_msg("%s: differs from sequential SGD", what);
    double moved = 0;
    float *init = pd_alloc_f32(np);
    model_init_params(model, 0, model_n_layers(model), 11, init);
    assert_memory_equal(init + src_off, init + dst_off, tie_n * sizeof(float));   /* the mirror starts equal */
    for (size_t i = 0; i < tie_n; i++) moved = fmax(moved, fabs(w[src_off + i] - init[src_off + i]));
    assert_true(moved > 1e-4);
    pd_free(init);
    pd_free(seq);
    pd_free(w);
    pd_free(w0);
}

static void test_flush_four_stages(void **state) {
    (void)state;
    int b[] = {0, 3, 4, 5, 7}, r[] = {1, 1, 1, 1};
    TPlan tp;
    tplan(&tp, 4, b, r);
    for (int n_mb = 1; n_mb <= 4; n_mb++) {
        RtWorkerResult res[8], em[8];
        memset(res, 0, sizeof res);
        memset(em, 0, sizeof em);
        Err err = {0};
        if (run(&tp, SCHED_1F1B_FLUSH, n_mb, 4, 0, res, &err)) fail_msg("1f1b-flush: %s", err.msg);
        char what[64];
        snprintf(what, sizeof what, "1f1b-flush, %d minibatches", n_mb);
        check_case(&tp, res, n_mb, 4, what);
        if (run(&tp, SCHED_1F1B_FLUSH, n_mb, 4, 1, em, &err)) fail_msg("emulation: %s", err.msg);
        for (int k = 0; k < 4; k++) {
            assert_int_equal(res[k].n_params, em[k].n_params);
            if (memcmp(res[k].params, em[k].params, res[k].n_params * sizeof(float)))
                fail_msg("%s: rank %d: threads and emulation differ", what, k);
        }
        rt_results_release(res, 8);
        rt_results_release(em, 8);
    }
}

static void test_gpipe_replicas(void **state) {
    (void)state;
    int b[] = {0, 3, 4, 5, 7}, r[] = {2, 1, 1, 2};
    TPlan tp;
    tplan(&tp, 4, b, r);
    RtWorkerResult res[8];
    memset(res, 0, sizeof res);
    Err err = {0};
    if (run(&tp, SCHED_GPIPE, 3, 4, 0, res, &err)) fail_msg("gpipe: %s", err.msg);
    check_case(&tp, res, 3, 4, "gpipe, replicas 2-1-1-2");
    rt_results_release(res, 8);
    /* the zb kinds split backwards; the exchange sits at the same step */
    int r1[] = {1, 1, 1, 1};
    tplan(&tp, 4, b, r1);
    if (run(&tp, SCHED_ZB_H1, 2, 4, 0, res, &err)) fail_msg("zb-h1: %s", err.msg);
    check_case(&tp, res, 2, 4, "zb-h1");
    rt_results_release(res, 8);
    if (run(&tp, SCHED_ZB_H2, 2, 4, 0, res, &err)) fail_msg("zb-h2: %s", err.msg);
    check_case(&tp, res, 2, 4, "zb-h2");
    rt_results_release(res, 8);
    /* model-parallel: one minibatch in flight, every stage steps once per minibatch */
    if (run(&tp, SCHED_MP, 3, 1, 0, res, &err)) fail_msg("model-parallel: %s", err.msg);
    check_case(&tp, res, 3, 1, "model-parallel");
    rt_results_release(res, 8);
}

static void test_async_refused(void **state) {
    (void)state;
    int b[] = {0, 3, 4, 5, 7}, r[] = {1, 1, 1, 1};
    TPlan tp;
    tplan(&tp, 4, b, r);
    SchedKind kinds[] = {SCHED_1F1B, SCHED_2BW};
    for (int k = 0; k < 2; k++) {
        RtWorkerResult res[8];
        memset(res, 0, sizeof res);
        Err err = {0};
        assert_int_equal(run(&tp, kinds[k], 2, kinds[k] == SCHED_2BW ? 4 : 1, 0, res, &err), PD_EINVAL);
        assert_non_null(strstr(err.msg, "layers.5.weight (stage 3) ties to layers.2.weight (stage 0)"));
        assert_non_null(strstr(err.msg, "steps its stages at different times"));
        rt_results_release(res, 8);
    }
    /* interleaved: stages 0 and 3 are chunks of two workers; refused too */
    TPlan ti;
    tplan(&ti, 4, b, r);
    Err e2 = {0};
    if (plan_interleave(&ti.p, 2, &e2)) fail_msg("plan_interleave: %s", e2.msg);
    Schedule si;
    SchedOpts so = {.kind = SCHED_INTERLEAVED, .n_minibatches = 1, .n_micro = 2};
    if (sched_build(&ti.p, &so, &si, &e2)) fail_msg("sched_build: %s", e2.msg);
    RtConfig ci = config(&si);
    RtWorkerResult ri[8];
    memset(ri, 0, sizeof ri);
    assert_int_equal(rt_run_threads(&ci, ri, &e2), PD_EINVAL);
    assert_non_null(strstr(e2.msg, "schedule interleaved cannot split a tie over stages"));
    rt_results_release(ri, 8);
    sched_release(&si);
    /* both layers on one stage: 1f1b folds the tie inside the stage */
    int b2[] = {0, 1, 7}, r2[] = {1, 1};
    tplan(&tp, 2, b2, r2);
    RtWorkerResult res[8];
    memset(res, 0, sizeof res);
    Err err = {0};
    if (run(&tp, SCHED_1F1B, 4, 1, 0, res, &err)) fail_msg("1f1b, one stage holding the tie: %s", err.msg);
    size_t base = model_param_offset(model, 1);
    assert_memory_equal(res[1].params + (src_off - base), res[1].params + (dst_off - base), tie_n * sizeof(float));
    rt_results_release(res, 8);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flush_four_stages),
        cmocka_unit_test(test_gpipe_replicas),
        cmocka_unit_test(test_async_refused),
    };
    return tu_run_group(tests, setup, teardown);
}
