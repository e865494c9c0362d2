/* rt_fixture.h: what the runtime tests (test_runtime*.c, test_memory.c) share: their two models
 * written to temporary files, hand-made plans of layer ranges, and comparing runs' final states. Header
 * only (static inline), so each test links only what it already links. */
#ifndef PD_RT_FIXTURE_H
#define PD_RT_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "data.h"
#include "kernels.h"
#include "nn.h"
#include "plan.h"
#include "runtime.h"
#include "schedule.h"
#include "testutil.h"

/* Writes text to a new file /tmp/pd_rt_model_XXXXXX; path (>= 32 bytes) gets its name. */
static inline void rt_write_tmp(char *path, const char *text) {
    strcpy(path, "/tmp/pd_rt_model_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

/* The two models the runtime tests train: an MLP of linear layers with fused relus, and a
 * small CNN with the layers that keep state or saved data (batch norm: running statistics;
 * max pool: indices; dropout: masks). */
#define RT_MLP_JSON \
    "{\"name\": \"tiny-mlp\", \"input\": [1, 28, 28], \"layers\": [" \
    "{\"type\": \"flatten\"}," \
    "{\"type\": \"linear\", \"in\": 784, \"out\": 24, \"relu\": true}," \
    "{\"type\": \"linear\", \"in\": 24, \"out\": 24, \"relu\": true}," \
    "{\"type\": \"linear\", \"in\": 24, \"out\": 16, \"relu\": true}," \
    "{\"type\": \"linear\", \"in\": 16, \"out\": 10}]}"
#define RT_CNN_JSON \
    "{\"name\": \"tiny-cnn\", \"input\": [1, 28, 28], \"layers\": [" \
    "{\"type\": \"conv2d\", \"in\": 1, \"out\": 4, \"kernel\": 3, \"stride\": 2, \"pad\": 1, \"bias\": false}," \
    "{\"type\": \"batchnorm\", \"features\": 4, \"relu\": true}," \
    "{\"type\": \"maxpool\", \"kernel\": 2, \"stride\": 2}," \
    "{\"type\": \"flatten\"}," \
    "{\"type\": \"linear\", \"in\": 196, \"out\": 32, \"relu\": true}," \
    "{\"type\": \"dropout\", \"p\": 0.3}," \
    "{\"type\": \"linear\", \"in\": 32, \"out\": 10}]}"

/* A deeper MLP for interleaved plans (up to 8 one-layer stages after the flatten's): 9 layers. */
#define RT_MLP9_JSON \
    "{\"name\": \"tiny-mlp9\", \"input\": [1, 28, 28], \"layers\": [" \
    "{\"type\": \"flatten\"}," \
    "{\"type\": \"linear\", \"in\": 784, \"out\": 16, \"relu\": true}," \
    "{\"type\": \"linear\", \"in\": 16, \"out\": 16, \"relu\": true}," \
    "{\"type\": \"linear\", \"in\": 16, \"out\": 16, \"relu\": true}," \
    "{\"type\": \"linear\", \"in\": 16, \"out\": 16, \"relu\": true}," \
    "{\"type\": \"linear\", \"in\": 16, \"out\": 16, \"relu\": true}," \
    "{\"type\": \"linear\", \"in\": 16, \"out\": 16, \"relu\": true}," \
    "{\"type\": \"linear\", \"in\": 16, \"out\": 12, \"relu\": true}," \
    "{\"type\": \"linear\", \"in\": 12, \"out\": 10}]}"

/* Writes both to temporary files (paths >= 32 bytes each); rt_models_remove deletes them. */
static inline void rt_models_write(char *mlp_path, char *cnn_path) {
    rt_write_tmp(mlp_path, RT_MLP_JSON);
    rt_write_tmp(cnn_path, RT_CNN_JSON);
}
static inline void rt_models_remove(const char *mlp_path, const char *cnn_path) {
    unlink(mlp_path);
    unlink(cnn_path);
}

/* The runtime tests' fixture: the two models written, and 640 synthetic 28x28 samples. */
static inline void rt_fixture_setup(char *mlp_path, char *cnn_path, Dataset *train) {
    rt_models_write(mlp_path, cnn_path);
    Err err = {0};
    if (data_synthetic(640, 1, 28, 28, 10, 7, train, &err)) fail_msg("%s", err.msg);
}
static inline void rt_fixture_teardown(const char *mlp_path, const char *cnn_path, Dataset *train) {
    rt_models_remove(mlp_path, cnn_path);
    data_release(train);
}

/* A plan with stages given as layer ranges [bounds[i], bounds[i+1]) and replica counts;
 * ranks assigned in stage order. */
typedef struct TPlan {
    Plan p;
    PlanStage st[8];
    int layers[8][32];
    int ranks[8][8];
} TPlan;

static inline void tplan(TPlan *t, int n_stages, const int *bounds, const int *reps) {
    memset(t, 0, sizeof *t);
    int rank = 0;
    for (int i = 0; i < n_stages; i++) {
        PlanStage *s = &t->st[i];
        s->n_layers = bounds[i + 1] - bounds[i];
        s->layers = t->layers[i];
        for (int l = 0; l < s->n_layers; l++) s->layers[l] = bounds[i] + l;
        s->replicas = reps[i];
        s->ranks = t->ranks[i];
        for (int r = 0; r < reps[i]; r++) s->ranks[r] = rank++;
    }
    t->p.n_stages = n_stages;
    t->p.stages = t->st;
    t->p.n_layers = bounds[n_stages];
    t->p.n_workers = rank;
    t->p.noam = (rank + reps[0] - 1) / reps[0];
}

/* The optimizer steps a synchronous schedule is compared with rt_sequential over. A schedule
 * adds its units' gradients in its own order, so the two part by rounding; in the CNN the relu
 * before the max pool turns such differences into other argmax choices within a few steps,
 * after which the runs part by far more (3e-8 after 3 steps, 6e-5 after 4, 2e-3 after 20 on an
 * AVX2 CPU whose sgemm rounds otherwise than AVX-512's). So the CNN compares after 2 steps, where
 * a wrong unit, mask or gradient already shows by 1e-3; the MLPs, which have no such switch,
 * after many. */
static inline int rt_oracle_steps(int cnn, int steps) { return cnn ? 2 : steps; }

/* The synchronous kinds' oracle: sequential minibatch SGD on the whole model (SGD lr 0.05,
 * momentum 0.9, seed 11: the runtime tests' config), written directly on the nn API. For
 * minibatch k, units k*per .. k*per+per-1 of train each forward/backward with loss scale 1/per,
 * then one step. Returns the whole model's final parameters (pd_free), their count in *np_out. */
static inline float *rt_sequential(const char *model, const Dataset *train, int steps, int per, int B, size_t *np_out) {
    Err err = {0};
    Model *m = model_load(model, &err);
    if (!m) fail_msg("%s", err.msg);
    int nl = model_n_layers(m);
    if (model_build(m, 0, nl, B, &err)) fail_msg("%s", err.msg);
    size_t np = model_param_count(m, 0, nl), ns = model_state_count(m, 0, nl);
    float *w = pd_alloc_f32(np), *dw = pd_alloc_f32(np), *st = pd_alloc_f32(ns ? ns : 1);
    model_init_params(m, 0, nl, 11, w);
    model_init_state(m, 0, nl, st);
    OptConfig oc = optim_defaults(OPT_SGD, 0.05f);
    oc.momentum = 0.9f;
    Optim opt;
    optim_init(&opt, &oc, np);
    NnCtx *ctx = nnctx_new(m, 0, nl, B);
    DataSampler ds;
    if (data_sampler_init(&ds, train, B, 11, 1, 1, &err)) fail_msg("%s", err.msg);
    int32_t labels[64];
    float dl[64 * 10];
    assert_true(B <= 64);
    for (int k = 0; k < steps; k++) {
        memset(dw, 0, np * sizeof(float));
        for (int j = 0; j < per; j++) {
            int u = k * per + j;
            assert_int_equal(data_sampler_get(&ds, (uint64_t)u, nnctx_input(ctx), labels), B);
            NnRun run = {.n = B, .train = 1, .seed = 11, .minibatch = (uint64_t)u};
            const float *y = model_forward(m, ctx, w, st, nnctx_input(ctx), &run);
            memset(dl, 0, sizeof dl);
            kern_xent_fwd_bwd_ref(y, labels, dl, B, 10, 1.0f / (float)per, NULL);
            model_backward(m, ctx, w, dl, NULL, dw);
        }
        model_tie_fold(m, 0, nl, dw);   /* tied parameters: one summed gradient (nn.h) */
        optim_step(&opt, w, dw);
    }
    data_sampler_release(&ds);
    nnctx_free(ctx);
    optim_release(&opt);
    pd_free(dw);
    pd_free(st);
    model_free(m);
    *np_out = np;
    return w;
}

/* Breaks worker w's list on purpose: its first gradient receive moved before its first
 * activation send, on which that gradient depends (the deadlock checks use it). */
static inline void rt_move_recv_before_send(SchedWorker *w) {
    int sa = -1, rg = -1;
    for (int i = 0; i < w->n; i++) {
        if (sa < 0 && w->ins[i].op == OP_SEND_ACT) sa = i;
        if (rg < 0 && w->ins[i].op == OP_RECV_GRAD) rg = i;
    }
    PD_ASSERT(sa >= 0 && rg > sa);
    Instr moved = w->ins[rg];
    memmove(w->ins + sa + 1, w->ins + sa, (size_t)(rg - sa) * sizeof *w->ins);
    w->ins[sa] = moved;
}


/* Releases the n results of a run. */
static inline void rt_results_release(RtWorkerResult *res, int n) {
    for (int r = 0; r < n; r++) rt_result_release(&res[r]);
}

/* Every rank's final state bitwise equal in two runs of n ranks (weights and their CRC, running
 * statistics, momentum); what names the comparison in a failure. */
static inline void rt_assert_same_results(const char *what, const RtWorkerResult *a, const RtWorkerResult *b, int n) {
    for (int r = 0; r < n; r++) {
        char t[160];
        snprintf(t, sizeof t, "%s rank %d", what, r);
        assert_int_equal(a[r].n_params, b[r].n_params);
        assert_int_equal(a[r].n_state, b[r].n_state);
        if (memcmp(a[r].params, b[r].params, a[r].n_params * sizeof(float))) {
            tu_compare(t, a[r].params, b[r].params, a[r].n_params, 0, 0);
            fail_msg("%s: weights differ", t);
        }
        if (a[r].n_state && memcmp(a[r].final.state, b[r].final.state, a[r].n_state * sizeof(float)))
            fail_msg("%s: running statistics differ", t);
        if (memcmp(a[r].final.opt_m, b[r].final.opt_m, a[r].n_params * sizeof(float)))
            fail_msg("%s: momentum differs", t);
        assert_int_equal(a[r].params_crc, b[r].params_crc);
    }
}

#endif
