/* test_sim.c: the simulator against closed forms and against the dependencies it must
 * respect. Analytic cases: GPipe's bubble (S-1)/(m+S-1); 1f1b's steady state equals the
 * slowest stage's f+b; replication divides the time by r plus the ring all-reduce; a
 * bandwidth-bound link sets the period to the transfer time. Random plans of every kind
 * complete without deadlock, every instruction's start and end equal what the model's
 * equations give from the earlier ones (an independent restatement of the model), and
 * weight versions alive stay within the schedule's bound. Broken schedules are reported
 * (deadlock, unmatched send), memory figures match a hand count, the SVG and Chrome
 * trace contain every event; the network stack's CPU adds to shared cores' load. PD_SIM_BIG=1 also times 1024 workers x 1000 minibatches. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim.h"

/* cmocka's assert_float_equal compares floats; these figures need doubles. */
#define assert_near(a, b, tol)                                                                          \
    do {                                                                                                \
        double a_ = (a), b_ = (b);                                                                      \
        if (!(fabs(a_ - b_) <= (tol))) fail_msg("%s = %.15g, want %.15g (tolerance %g)", #a, a_, b_, (double)(tol)); \
    } while (0)

static Plan *make_plan(int n, const int *rep) {
    Plan *p = calloc(1, sizeof *p);
    p->n_stages = n;
    p->n_layers = n;
    p->stages = calloc((size_t)n, sizeof *p->stages);
    int rank = 0;
    for (int i = 0; i < n; i++) {
        PlanStage *st = &p->stages[i];
        st->n_layers = 1;
        st->layers = malloc(sizeof(int));
        st->layers[0] = i;
        st->replicas = rep ? rep[i] : 1;
        st->ranks = malloc((size_t)st->replicas * sizeof(int));
        for (int j = 0; j < st->replicas; j++) st->ranks[j] = rank++;
    }
    p->n_workers = rank;
    return p;
}

static void free_plan(Plan *p) {
    for (int i = 0; i < p->n_stages; i++) {
        free(p->stages[i].layers);
        free(p->stages[i].ranks);
    }
    free(p->stages);
    free(p);
}

static void build(const Plan *p, SchedKind k, int n_mb, int n_micro, int vs, Schedule *s) {
    SchedOpts o = {k, n_mb, n_micro, vs, 0, 0};
    Err err = {0};
    if (sched_build(p, &o, s, &err)) fail_msg("sched_build: %s", err.msg);
}

static SimCosts uniform_costs(int n, double f, double b) {
    PD_ASSERT(n > 0);
    SimCosts c = {n, calloc((size_t)n, sizeof(SimStageCost))};
    for (int i = 0; i < n; i++) c.stage[i] = (SimStageCost){.fwd_s = f, .bwd_s = b};
    return c;
}

static void run(const Schedule *s, const SimCosts *c, const Cluster *cl, SimResult *r) {
    SimOpts o = {cl, 1, 0, 0, 0, 0, NULL, 0};
    Err err = {0};
    if (sim_run(s, c, &o, r, &err)) fail_msg("sim_run: %s", err.msg);
}

static void test_gpipe_bubble(void **state) {
    (void)state;
    int cases[][2] = {{4, 8}, {2, 1}, {8, 32}, {5, 3}};
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        int S = cases[t][0], m = cases[t][1];
        Plan *p = make_plan(S, NULL);
        Schedule s;
        build(p, SCHED_GPIPE, 5, m, 0, &s);
        SimCosts c = uniform_costs(S, 1.0, 2.0);
        SimResult r;
        run(&s, &c, NULL, &r);
        double want = (double)(S - 1) / (m + S - 1);
        assert_near(r.bubble_fraction, want, 1e-9);
        assert_near(r.time_per_minibatch_s, (m + S - 1) * 3.0, 1e-9);
        assert_near(r.makespan_s, 5 * (m + S - 1) * 3.0, 1e-9);
        for (int i = 0; i < S; i++) assert_int_equal(r.versions_alive[i], 1);
        sim_result_release(&r);
        sim_costs_release(&c);
        sched_release(&s);
        free_plan(p);
    }
}

static void test_1f1b_steady_state(void **state) {
    (void)state;
    /* unequal stages: the slowest (f + b = 5) sets the period */
    double fb[][2] = {{1, 2}, {2, 3}, {1, 1}, {0.5, 1.5}};
    Plan *p = make_plan(4, NULL);
    Schedule s;
    build(p, SCHED_1F1B, 64, 1, 0, &s);
    SimCosts c = uniform_costs(4, 0, 0);
    for (int i = 0; i < 4; i++) c.stage[i].fwd_s = fb[i][0], c.stage[i].bwd_s = fb[i][1];
    SimResult r;
    run(&s, &c, NULL, &r);
    assert_near(r.time_per_minibatch_s, 5.0, 1e-9);
    assert_near(r.minibatches_per_s, 0.2, 1e-12);
    /* the bottleneck stage is busy nearly all the time; 1f1b stashes at most warmup versions */
    assert_true(r.busy_fraction[1] > 0.95);
    for (int i = 0; i < 4; i++) assert_true(r.versions_alive[i] <= s.stages[i].warmup);
    assert_int_equal(r.versions_alive[0], 4);
    assert_int_equal(r.versions_alive[3], 1);
    sim_result_release(&r);
    sched_release(&s);
    /* equal stages: period f + b exactly, and pipelining beats model parallel by S */
    for (int i = 0; i < 4; i++) c.stage[i].fwd_s = 1, c.stage[i].bwd_s = 2;
    build(p, SCHED_1F1B, 64, 1, 0, &s);
    run(&s, &c, NULL, &r);
    assert_near(r.time_per_minibatch_s, 3.0, 1e-9);
    sim_result_release(&r);
    sched_release(&s);
    build(p, SCHED_MP, 16, 1, 0, &s);
    run(&s, &c, NULL, &r);
    assert_near(r.time_per_minibatch_s, 12.0, 1e-9);
    assert_near(r.bubble_fraction, 0.75, 1e-9);
    sim_result_release(&r);
    sched_release(&s);
    sim_costs_release(&c);
    free_plan(p);
}

static void test_replication(void **state) {
    (void)state;
    /* one stage replicated r times: time per minibatch (f + b + allreduce) / r */
    Cluster cl = {.n_levels = 1, .level = {{64, 1e9, 1e-5}}};
    for (int r_ = 1; r_ <= 4; r_++) {
        int rep[1] = {r_};
        Plan *p = make_plan(1, rep);
        Schedule s;
        build(p, SCHED_1F1B, 64, 1, 0, &s);
        SimCosts c = uniform_costs(1, 0.01, 0.02);
        c.stage[0].param_bytes = 4e6;
        SimResult r;
        run(&s, &c, &cl, &r);
        double ar = r_ > 1 ? 2.0 * (r_ - 1) / r_ * 4e6 / 1e9 + 2.0 * (r_ - 1) * 1e-5 : 0;
        assert_near(r.time_per_minibatch_s, (0.03 + ar) / r_, 1e-12);
        sim_result_release(&r);
        sched_release(&s);
        /* dp on the same ranks is the same computation */
        build(p, SCHED_DP, 64, 1, 0, &s);
        run(&s, &c, &cl, &r);
        assert_near(r.time_per_minibatch_s, (0.03 + ar) / r_, 1e-12);
        sim_result_release(&r);
        sched_release(&s);
        sim_costs_release(&c);
        free_plan(p);
    }
    /* a 2x slower stage replicated twice balances the pipeline (no communication cost) */
    int rep[2] = {2, 1};
    Plan *p = make_plan(2, rep);
    Schedule s;
    build(p, SCHED_1F1B, 64, 1, 0, &s);
    SimCosts c = uniform_costs(2, 1, 2);
    c.stage[0].fwd_s = 2, c.stage[0].bwd_s = 4;
    SimResult r;
    run(&s, &c, NULL, &r);
    assert_near(r.time_per_minibatch_s, 3.0, 1e-9);
    sim_result_release(&r);
    sched_release(&s);
    sim_costs_release(&c);
    free_plan(p);
}

/* A replicated stage's all-reduce overlaps the backward before it, bucket by bucket, as the
 * runtime's gradient buckets do: sim_costs_from_profile forms the buckets from the last layer
 * down (SIM_BUCKET_BYTES each), and the ring of a bucket ready halfway through the backward is
 * done by the backward's end; what is left moves after it. Worked by hand below. */
static void test_bucket_overlap(void **state) {
    (void)state;
    ProfileLayer L[3];
    memset(L, 0, sizeof L);
    for (int i = 0; i < 3; i++) L[i].fwd_s = 0.01, L[i].bwd_s = 0.02;
    L[0].param_bytes = 1000;
    L[1].param_bytes = 2 << 20;   /* with layer 2 past the bucket size: one bucket with it */
    L[2].param_bytes = 3 << 20;
    Profile prof = {.n_layers = 3, .layers = L, .input_bytes = 0};
    Plan *p = make_plan(1, (int[]){2});
    free(p->stages[0].layers);
    p->stages[0].n_layers = 3, p->stages[0].layers = malloc(3 * sizeof(int));
    for (int i = 0; i < 3; i++) p->stages[0].layers[i] = i;
    Schedule s;
    build(p, SCHED_DP, 8, 1, 0, &s);
    SimCosts c;
    Err err = {0};
    assert_int_equal(sim_costs_from_profile(&s, &prof, &c, &err), PD_OK);
    assert_int_equal(c.stage[0].n_buckets, 2);
    assert_near(c.stage[0].bucket_bytes[0], 5 << 20, 0);
    assert_near(c.stage[0].bucket_ready[0], 2.0 / 3, 1e-12);   /* layers 2 and 1 of the backward */
    assert_near(c.stage[0].bucket_bytes[1], 1000, 0);
    assert_near(c.stage[0].bucket_ready[1], 1.0, 1e-12);
    /* 2 replicas, r = 2: a bucket's ring moves its bytes once. Bucket 0 (5 MiB) is ready 40 ms
     * into the 60 ms backward and takes 10 ms at this rate: done before the backward ends; bucket
     * 1 (1000 bytes) moves after it. A round: 30 + 60 ms of compute and 1000 bytes. */
    const double bw = (5 << 20) / 0.010;
    Cluster cl = {.n_levels = 1, .level = {{2, bw, 0}}};
    SimResult r;
    run(&s, &c, &cl, &r);
    assert_near(r.time_per_minibatch_s, (0.09 + 1000 / bw) / 2, 1e-9);
    sim_result_release(&r);
    /* a quarter of the rate: 40 ms from 40 ms into the backward on, 20 of them left at its end,
     * then bucket 1 */
    cl.level[0].bandwidth = bw / 4;
    run(&s, &c, &cl, &r);
    assert_near(r.time_per_minibatch_s, (0.09 + 0.020 + 1000 / (bw / 4)) / 2, 1e-9);
    sim_result_release(&r);
    /* without buckets (costs made by hand): the whole ring after the backward */
    c.stage[0].n_buckets = 0;
    run(&s, &c, &cl, &r);
    assert_near(r.time_per_minibatch_s, (0.09 + ((5 << 20) + 1000) / (bw / 4)) / 2, 1e-9);
    sim_result_release(&r);
    sched_release(&s);
    sim_costs_release(&c);
    free_plan(p);
}

/* Interleaved over two pipelines (2 positions x 2 chunks x 2 replicas): each chunk's gradient
 * all-reduce may start at the chunk's own last backward, before the other chunk's backwards and
 * all-reduces (runtime.c, last_backward_before_ar). With one bucket, ready at the backward's
 * end, and a ring of T = 15 ms: chunk 0's all-reduce, whose last backward comes just before
 * it, takes T; chunk 1's, whose last backward ended at least two backwards (40 ms) earlier, was
 * done by the time the worker reaches it and takes no time. */
static void test_interleaved_chunk_overlap(void **state) {
    (void)state;
    int reps[4] = {2, 2, 2, 2};
    Plan *p = make_plan(4, reps);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++) p->stages[i].ranks[j] = (i % 2) * 2 + j;
    p->n_workers = 4;
    Schedule s;
    build(p, SCHED_INTERLEAVED, 2, 8, 0, &s);
    SimCosts c = uniform_costs(4, 0.010, 0.020);
    const double T = 0.015, bytes = 1e6;
    for (int i = 0; i < 4; i++) {
        c.stage[i].param_bytes = bytes;
        c.stage[i].n_buckets = 1;
        c.stage[i].bucket_bytes[0] = bytes;
        c.stage[i].bucket_ready[0] = 1.0;
    }
    Cluster cl = {.n_levels = 1, .level = {{4, bytes / T, 0}}};   /* r = 2: the ring moves the bytes once */
    SimResult r;
    run(&s, &c, &cl, &r);
    int seen[2] = {0, 0};
    for (int w = 0; w < 4; w++) {
        const SchedWorker *sw = &s.workers[w];
        for (int i = 0; i < sw->n; i++) {
            if (sw->ins[i].op != OP_ALLREDUCE) continue;
            double d = r.end[w][i] - r.start[w][i];
            if (sw->ins[i].chunk == 0) assert_near(d, T, 1e-9);
            else assert_near(d, 0, 1e-9);
            seen[sw->ins[i].chunk]++;
        }
    }
    assert_int_equal(seen[0], 8);   /* 4 workers x 2 minibatches, each chunk */
    assert_int_equal(seen[1], 8);
    sim_result_release(&r);
    sim_costs_release(&c);
    sched_release(&s);
    free_plan(p);
}

/* Cluster.wake_s: a worker that waited on a receive resumes wake_s late, but only where its
 * machine's cores are all computing for others as it wakes. Four stages of 1f1b-flush on one
 * machine: with 2 cores a waking stage often finds both busy, and the minibatch takes longer;
 * with a core per worker nothing changes. */
static void test_wake(void **state) {
    (void)state;
    Plan *p = make_plan(4, NULL);
    Schedule s;
    build(p, SCHED_1F1B_FLUSH, 8, 4, 0, &s);
    SimCosts c = uniform_costs(4, 0.01, 0.02);
    SimResult r0, r1;
    for (int cores = 2; cores <= 4; cores += 2) {
        Cluster cl = {.n_levels = 1, .level = {{4, 1e15, 0}}, .cores_per_machine = cores};
        run(&s, &c, &cl, &r0);
        cl.wake_s = 0.003;
        run(&s, &c, &cl, &r1);
        if (cores == 2) assert_true(r1.time_per_minibatch_s > r0.time_per_minibatch_s + 0.001);   /* 0.270 -> 0.272 s */
        else assert_near(r1.time_per_minibatch_s, r0.time_per_minibatch_s, 1e-12);
        sim_result_release(&r0);
        sim_result_release(&r1);
    }
    /* the cluster file carries it, and refuses it negative */
    Cluster w = {.n_levels = 1, .level = {{2, 1e9, 0}}, .wake_s = 0.004};
    cJSON *o = cJSON_CreateObject();
    cluster_to_json(&w, o);   /* written, then read as a plan file carries it */
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    o = cJSON_Parse(text);
    free(text);
    Cluster back;
    Err err = {0};
    if (cluster_from_json(o, "w.json", &back, &err) != PD_OK) fail_msg("%s", err.msg);
    assert_near(back.wake_s, 0.004, 0);
    cJSON_Delete(o);
    o = cJSON_Parse("{\"levels\": [{\"workers\": 2, \"bandwidth\": 1e9}], \"wake_s\": -1}");
    assert_int_not_equal(cluster_from_json(o, "neg.json", &back, &err), PD_OK);
    assert_non_null(strstr(err.msg, "wake_s"));
    cJSON_Delete(o);
    sched_release(&s);
    sim_costs_release(&c);
    free_plan(p);
}

/* The full oracle of a run's times (below). */
static void check_times(const Schedule *s, const SimCosts *c, const Cluster *cl, const SimResult *r);

static void test_bandwidth_bound(void **state) {
    (void)state;
    /* stage 0's outgoing link carries 1 MB of activations per minibatch at 1 MB/s, stage 1's
     * 1 MB of gradients back, and compute is negligible: the transfer time (latency + bytes / bandwidth) is the period */
    Plan *p = make_plan(4, NULL);
    Schedule s;
    build(p, SCHED_1F1B, 40, 1, 0, &s);
    SimCosts c = uniform_costs(4, 0, 0);
    c.stage[1].in_bytes = 1e6;
    Cluster cl = {.n_levels = 1, .level = {{4, 1e6, 0.01}}};
    SimResult r;
    run(&s, &c, &cl, &r);
    /* the link is busy 1 s per minibatch; the latency (after the last byte) does not hold it */
    assert_true(r.time_per_minibatch_s >= 1.0 - 1e-9 && r.time_per_minibatch_s <= 1.01 + 1e-9);
    /* worker 0's warm-up sends to worker 1 at time 0 go over the pair's one connection one
     * after the other: the k-th arrives at k + latency, not all at 4 + latency as four shared flows would */
    const SchedWorker *w = &s.workers[0];
    int k = 0;
    for (int i = 0; i < w->n && k < 3; i++)
        if (w->ins[i].op == OP_SEND_ACT) {
            k++;
            assert_near(r.start[0][i], 0, 1e-12);
            assert_near(r.end[0][i], k + 0.01, 1e-9);
        }
    assert_int_equal(k, 3);
    check_times(&s, &c, &cl, &r);
    sim_result_release(&r);
    /* two levels: ranks 0, 1 in different level-0 groups use level 1 */
    Cluster cl2 = {.n_levels = 2, .level = {{1, 1e9, 0}, {4, 2e6, 0}}};
    assert_int_equal(cluster_link_level(&cl2, 0, 1), 1);
    assert_int_equal(cluster_link_level(&cl2, 1, 1), -1);
    run(&s, &c, &cl2, &r);
    assert_near(r.time_per_minibatch_s, 0.5, 1e-9);
    sim_result_release(&r);
    /* with compute c per stage the 1F1B order puts 2 transfers and the compute of one
     * stage pair in each two-minibatch cycle: the period lies in [T, (2T + 4 f) / 2] */
    for (int i = 0; i < 4; i++) c.stage[i].fwd_s = c.stage[i].bwd_s = 0.1;
    run(&s, &c, &cl, &r);
    assert_true(r.time_per_minibatch_s >= 1.01 - 1e-9);
    assert_true(r.time_per_minibatch_s <= (2 * 1.01 + 0.4) / 2 + 1e-9);
    sim_result_release(&r);
    sched_release(&s);
    sim_costs_release(&c);
    free_plan(p);
}

/* Two replicas of stage 0 finish their first forward at the same moment and send to stage 1:
 * each has its own outgoing link, but stage 1 has one incoming link, which they share fairly:
 * both arrive at 2.1 (one after the other they would arrive at 1.1 and 2.1). With stage 1's
 * own link at half the rate, each gets a quarter; with replica 0's own link at a fifth, the
 * fair share gives replica 0 its 0.2 MB/s and replica 1 the 0.8 left. */
static void test_incoming_link(void **state) {
    (void)state;
    int rep[2] = {2, 1};
    Plan *p = make_plan(2, rep);
    Schedule s;
    build(p, SCHED_1F1B, 8, 1, 0, &s);
    SimCosts c = uniform_costs(2, 0.1, 0.1);
    c.stage[1].in_bytes = 1e6;
    Cluster cl = {.n_levels = 1, .level = {{3, 1e6, 0}}};
    const double want[3][2] = {{2.1, 2.1}, {4.1, 4.1}, {5.1, 1.35}};
    for (int v = 0; v < 3; v++) {
        if (v == 1) cl.n_hosts = 3, cl.host[2].bandwidth = 5e5;
        if (v == 2) cl.host[2].bandwidth = 0, cl.host[0].bandwidth = 2e5;
        SimResult r;
        run(&s, &c, &cl, &r);
        double start[2] = {-1, -1}, end[2] = {-1, -1};
        for (int w = 0; w < 2; w++)
            for (int i = 0; i < s.workers[w].n; i++)
                if (s.workers[w].ins[i].op == OP_SEND_ACT) {
                    start[w] = r.start[w][i], end[w] = r.end[w][i];
                    break;
                }
        for (int w = 0; w < 2; w++) {
            assert_near(start[w], 0.1, 1e-12);
            if (fabs(end[w] - want[v][w]) > 1e-9) fail_msg("case %d: replica %d's transfer ends at %.12g, want %.12g", v, w, end[w], want[v][w]);
        }
        check_times(&s, &c, &cl, &r);
        sim_result_release(&r);
    }
    sched_release(&s);
    sim_costs_release(&c);
    free_plan(p);
}

/* A host's own latency (tools/cluster.sh --host-delay: the delay on what it receives) replaces
 * the level's for every message into it, and only for those; it survives a cluster file. */
static void test_host_latency(void **state) {
    (void)state;
    Plan *p = make_plan(2, NULL);
    Schedule s;
    build(p, SCHED_1F1B, 8, 1, 0, &s);
    SimCosts c = uniform_costs(2, 0, 0);
    c.stage[1].in_bytes = 1e6;   /* 1 MB each way at 10 MB/s: 0.1 s on the link */
    Cluster cl = {.n_levels = 1, .level = {{2, 1e7, 0.01}}, .n_hosts = 2};
    cl.host[1].latency = 0.03, cl.host[1].has_latency = 1;
    assert_near(cluster_link_latency(&cl, 0, 1), 0.03, 0);
    assert_near(cluster_link_latency(&cl, 1, 0), 0.01, 0);
    assert_true(cluster_heterogeneous(&cl));
    SimResult r;
    run(&s, &c, &cl, &r);
    int act = -1, grad = -1;
    for (int i = 0; i < s.workers[0].n && act < 0; i++)
        if (s.workers[0].ins[i].op == OP_SEND_ACT) act = i;
    for (int i = 0; i < s.workers[1].n && grad < 0; i++)
        if (s.workers[1].ins[i].op == OP_SEND_GRAD) grad = i;
    assert_true(act >= 0 && grad >= 0);
    assert_near(r.end[0][act] - r.start[0][act], 0.1 + 0.03, 1e-9);   /* into worker 1: its own */
    assert_near(r.end[1][grad] - r.start[1][grad], 0.1 + 0.01, 1e-9);  /* into worker 0: the level's */
    sim_result_release(&r);
    cJSON *o = cJSON_Parse("{\"levels\": [{\"workers\": 2, \"bandwidth\": 1e7, \"latency\": 0.01}], "
                           "\"hosts\": [{\"latency\": 0}, {\"latency\": 0.03}]}");
    Cluster got;
    Err err = {0};
    if (cluster_from_json(o, "c.json", &got, &err) != PD_OK) fail_msg("%s", err.msg);
    cJSON_Delete(o);
    assert_near(cluster_link_latency(&got, 1, 0), 0, 0);   /* a host's own 0 is 0, not the level's */
    assert_near(cluster_link_latency(&got, 0, 1), 0.03, 0);
    cJSON *back = cJSON_CreateObject();
    cluster_to_json(&got, back);
    char *text = cJSON_PrintUnformatted(back);
    cJSON_Delete(back);
    back = cJSON_Parse(text);
    free(text);
    Cluster again;
    if (cluster_from_json(back, "back", &again, &err) != PD_OK) fail_msg("%s", err.msg);
    cJSON_Delete(back);
    assert_int_equal(again.host[0].has_latency, 1);
    assert_near(cluster_link_latency(&again, 0, 1), 0.03, 0);
    o = cJSON_Parse("{\"levels\": [{\"workers\": 2, \"bandwidth\": 1e7}], \"hosts\": [{\"latency\": -1}]}");
    assert_int_not_equal(cluster_from_json(o, "c.json", &got, &err), PD_OK);
    assert_non_null(strstr(err.msg, "latency"));
    cJSON_Delete(o);
    sched_release(&s);
    sim_costs_release(&c);
    free_plan(p);
}

/* A heterogeneous cluster: a host's own link caps every message to or from it, a host's speed
 * divides its compute, and both survive the cluster and plan files. */
static void test_heterogeneous(void **state) {
    (void)state;
    Plan *p = make_plan(4, NULL);
    Schedule s;
    build(p, SCHED_1F1B, 40, 1, 0, &s);
    SimCosts c = uniform_costs(4, 0, 0);
    c.stage[1].in_bytes = 1e6;   /* stage 0 -> 1: 1 MB each way per minibatch */
    Cluster cl = {.n_levels = 1, .level = {{4, 1e7, 0}}};
    SimResult r;
    run(&s, &c, &cl, &r);
    assert_near(r.time_per_minibatch_s, 0.1, 1e-9);   /* 1 MB at 10 MB/s */
    sim_result_release(&r);
    cl.n_hosts = 2, cl.host[1].bandwidth = 2e6;         /* worker 1's own link: 2 MB/s */
    assert_near(cluster_link_bandwidth(&cl, 0, 1), 2e6, 0);
    assert_near(cluster_link_bandwidth(&cl, 0, 2), 1e7, 0);
    assert_true(cluster_heterogeneous(&cl));
    run(&s, &c, &cl, &r);
    assert_near(r.time_per_minibatch_s, 0.5, 1e-9);
    sim_result_release(&r);
    cl.host[1].bandwidth = 0;   /* the slow link on a worker the transfer does not touch */
    cl.n_hosts = 4, cl.host[3].bandwidth = 2e6;
    run(&s, &c, &cl, &r);
    assert_near(r.time_per_minibatch_s, 0.1, 1e-9);
    sim_result_release(&r);
    /* compute: worker 2 at half speed makes its stage the bottleneck at twice its time */
    SimCosts d = uniform_costs(4, 0.01, 0.02);
    Cluster fast = {.n_levels = 1, .level = {{4, 1e12, 0}}};
    run(&s, &d, &fast, &r);
    assert_near(r.time_per_minibatch_s, 0.03, 1e-9);
    sim_result_release(&r);
    fast.n_hosts = 3, fast.host[2].speed = 0.5;
    assert_near(cluster_worker_speed(&fast, 2), 0.5, 0);
    assert_near(cluster_worker_speed(&fast, 3), 1.0, 0);
    run(&s, &d, &fast, &r);
    assert_near(r.time_per_minibatch_s, 0.06, 1e-9);
    assert_near(r.slowdown[2], 2.0, 1e-12);
    sim_result_release(&r);
    /* files: the hosts round-trip through a cluster file and a plan */
    char path[] = "/tmp/pd_test_cluster_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *js = "{\"levels\": [{\"workers\": 4, \"bandwidth\": 1e8}], \"hosts\": [{}, {\"speed\": 0.5}, "
                     "{\"bandwidth\": 1.2e6}]}";
    assert_int_equal(write(fd, js, strlen(js)), (ssize_t)strlen(js));
    close(fd);
    Cluster got;
    Err err = {0};
    assert_int_equal(cluster_load(path, &got, &err), PD_OK);
    assert_int_equal(got.n_hosts, 3);
    assert_near(cluster_worker_speed(&got, 1), 0.5, 0);
    assert_near(cluster_link_bandwidth(&got, 2, 3), 1.2e6, 0);
    assert_near(cluster_link_bandwidth(&got, 0, 1), 1e8, 0);
    p->cluster = got;
    p->n_workers = 4, p->noam = 4, p->pipeline_s = p->single_s = p->dp_s = 1;
    if (plan_save(p, path, &err) != PD_OK) fail_msg("plan_save: %s", err.msg);
    Plan *q = plan_load(path, &err);
    assert_non_null(q);
    assert_int_equal(q->cluster.n_hosts, 3);
    assert_near(q->cluster.host[1].speed, 0.5, 0);
    assert_near(q->cluster.host[2].bandwidth, 1.2e6, 0);
    plan_free(q);
    /* more hosts than workers, a bad speed: refused, naming the host */
    const char *bad[] = {"{\"levels\": [{\"workers\": 2, \"bandwidth\": 1e8}], \"hosts\": [{}, {}, {}]}",
                         "{\"levels\": [{\"workers\": 2, \"bandwidth\": 1e8}], \"hosts\": [{\"speed\": -1}]}",
                         "{\"levels\": [{\"workers\": 2, \"bandwidth\": 1e8}], \"hosts\": [{\"rate\": 1}]}"};
    for (int k = 0; k < 3; k++) {
        cJSON *o = cJSON_Parse(bad[k]);
        Err e = {0};
        assert_int_not_equal(cluster_from_json(o, "c.json", &got, &e), PD_OK);
        assert_non_null(strstr(e.msg, k == 0 ? "hosts" : "host"));
        cJSON_Delete(o);
    }
    unlink(path);
    sched_release(&s);
    sim_costs_release(&c);
    sim_costs_release(&d);
    free_plan(p);
}

/* Shared cores and the network stack's CPU: 4 equal stages (f + b = 30 ms) on one machine of
 * 2 cores take 4 x 30 / 2 = 60 ms per minibatch; with 1 MB crossing each of the 3 boundaries
 * both ways per minibatch and 1e-8 s of CPU per byte, the machine also spends 60 ms per
 * minibatch moving them: (4 x 30 + 60) / 2 = 90 ms. All-reduces count nothing. The field
 * survives a cluster file. */
static void test_net_cpu(void **state) {
    (void)state;
    Plan *p = make_plan(4, NULL);
    Schedule s;
    build(p, SCHED_1F1B, 40, 1, 0, &s);
    SimCosts c = uniform_costs(4, 0.01, 0.02);
    for (int i = 1; i < 4; i++) c.stage[i].in_bytes = 1e6;
    Cluster cl = {.n_levels = 1, .level = {{4, 1e15, 0}}, .cores_per_machine = 2};
    SimResult r;
    run(&s, &c, &cl, &r);
    /* in the steady state all four compute at once, at half speed; fewer in the fill and drain */
    assert_near(r.time_per_minibatch_s, 0.06, 1e-9);
    for (int w = 0; w < 4; w++) assert_true(r.slowdown[w] > 1.8 && r.slowdown[w] <= 2.0 + 1e-12);
    check_times(&s, &c, &cl, &r);
    sim_result_release(&r);
    cl.net_cpu_per_byte = 1e-8;
    run(&s, &c, &cl, &r);
    /* the ends carry 10 ms of network CPU per minibatch, the middle stages 20 */
    assert_near(r.time_per_minibatch_s, 0.09, 1e-9);
    assert_true(r.slowdown[1] > r.slowdown[0] && r.slowdown[2] > r.slowdown[3]);
    check_times(&s, &c, &cl, &r);
    sim_result_release(&r);
    /* cores oversubscribed deliver 0.8 of their speed: (120 + 60) ms / (2 x 0.8) */
    cl.core_efficiency = 0.8;
    run(&s, &c, &cl, &r);
    assert_near(r.time_per_minibatch_s, 0.1125, 1e-9);
    check_times(&s, &c, &cl, &r);
    sim_result_release(&r);
    assert_near(cluster_compute_slowdown(&cl, 0, NULL, 4), 2 / 0.8, 1e-12);   /* the planner's estimate too */
    cl.core_efficiency = 0;
    cl.cores_per_machine = 0;   /* a core per worker: the network's CPU takes none of theirs */
    run(&s, &c, &cl, &r);
    for (int w = 0; w < 4; w++) assert_near(r.slowdown[w], 1.0, 0);
    sim_result_release(&r);
    sched_release(&s);
    sim_costs_release(&c);
    free_plan(p);

    /* one stage on 2 replicas sharing 1 core: their all-reduces add nothing (they block the
     * workers, so their network CPU does not fall on compute) */
    int rep[] = {2};
    p = make_plan(1, rep);
    build(p, SCHED_1F1B, 40, 1, 0, &s);
    c = uniform_costs(1, 0.01, 0.02);
    c.stage[0].param_bytes = 1e6;
    Cluster one = {.n_levels = 1, .level = {{2, 1e15, 0}}, .cores_per_machine = 1, .net_cpu_per_byte = 1e-8};
    run(&s, &c, &one, &r);
    assert_near(r.slowdown[0], 2.0, 1e-12);
    sim_result_release(&r);
    sched_release(&s);
    sim_costs_release(&c);
    free_plan(p);

    /* the cluster file: read, written, refused when negative */
    const char *js = "{\"levels\": [{\"workers\": 4, \"bandwidth\": 1e8}], \"cores_per_machine\": 2, "
                     "\"net_cpu_per_byte\": 6.2e-9, \"core_efficiency\": 0.9}";
    cJSON *o = cJSON_Parse(js);
    Cluster got;
    Err err = {0};
    assert_int_equal(cluster_from_json(o, "c.json", &got, &err), PD_OK);
    cJSON_Delete(o);
    assert_near(got.net_cpu_per_byte, 6.2e-9, 0);
    cJSON *back = cJSON_CreateObject();
    cluster_to_json(&got, back);   /* as a plan file carries it: written, then read */
    char *text = cJSON_PrintUnformatted(back);
    cJSON_Delete(back);
    back = cJSON_Parse(text);
    free(text);
    Cluster again;
    if (cluster_from_json(back, "back", &again, &err) != PD_OK) fail_msg("%s", err.msg);
    assert_near(again.net_cpu_per_byte, 6.2e-9, 0);
    assert_near(again.core_efficiency, 0.9, 0);
    cJSON_Delete(back);
    o = cJSON_Parse("{\"levels\": [{\"workers\": 4, \"bandwidth\": 1e8}], \"net_cpu_per_byte\": -1}");
    assert_int_not_equal(cluster_from_json(o, "c.json", &got, &err), PD_OK);
    assert_non_null(strstr(err.msg, "net_cpu_per_byte"));
    cJSON_Delete(o);
    o = cJSON_Parse("{\"levels\": [{\"workers\": 4, \"bandwidth\": 1e8}], \"core_efficiency\": 1.5}");
    assert_int_not_equal(cluster_from_json(o, "c.json", &got, &err), PD_OK);
    assert_non_null(strstr(err.msg, "core_efficiency"));
    cJSON_Delete(o);
}

/* An independent statement of the model, checked on every instruction: with the times
 * the simulator reports for earlier instructions, each start and end must be exactly
 * what the model's equations give (no unexplained idle, no overlap, no early start).
 * Together these determine every time, so they are a full oracle for the run. */
static int level_of(const Cluster *cl, int a, int b) {
    long span = 1;
    for (int l = 0; l < cl->n_levels; l++) {
        span *= cl->level[l].workers;
        if (a / span == b / span) return l;
    }
    return cl->n_levels - 1;
}

static double xfer(const Cluster *cl, int a, int b, double bytes) {
    if (!cl || cl->n_levels == 0 || bytes <= 0) return 0;
    const ClusterLevel *L = &cl->level[level_of(cl, a, b)];
    return L->latency + bytes / L->bandwidth;
}

#define CHECK_T(cond, fmt, ...)                                                                           \
    do {                                                                                                   \
        if (!(cond))                                                                                       \
            fail_msg("%s: worker %d instruction %d (%s mb %d): start %.12g end %.12g: " fmt,                \
                     sched_kind_name(s->kind), w, i, sched_op_name((InstrOp)in->op), in->mb, a, b, __VA_ARGS__); \
    } while (0)

/* Transfers as the model states them: a pair of workers' messages go one after the other
 * (one connection), and the connections with a message under way share the links max-min
 * fairly, each end's link giving a connection at most the least of the level's bandwidth and
 * that worker's own (hosts). Checked from the reported times alone: sweeping the times at
 * which messages start and finish, the rates the fair share gives over each interval must add
 * up to every message's bytes by its reported end (less the level's latency). */
typedef struct Xfer {
    double sent, t0, t1, bytes, c_out, c_in, got;
    int a, b, w, i;
    int ar;   /* a ring all-reduce's transfer: its end is found, not read (t1: when its bytes are in) */
} Xfer;

static double own_rate(const Cluster *cl, int r, double bw) {
    return r < cl->n_hosts && cl->host[r].bandwidth > 0 && cl->host[r].bandwidth < bw ? cl->host[r].bandwidth : bw;
}

static int cmp_pair(const void *pa, const void *pb) {
    const Xfer *x = pa, *y = pb;
    if (x->a != y->a) return x->a - y->a;
    if (x->b != y->b) return x->b - y->b;
    return x->i - y->i;
}

typedef struct XEv {
    double t;
    int add, k;
} XEv;

static int cmp_xev(const void *pa, const void *pb) {
    const XEv *x = pa, *y = pb;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->add - y->add;   /* ends before starts */
}

/* One step of a sweep over events sorted by cmp_xev: ev[e] enters or leaves the active set
 * act[0..*na); returns the time until the next event (0 after the last). */
static double sweep_step(const XEv *ev, int ne, int e, int *act, int *na) {
    if (ev[e].add) act[(*na)++] = ev[e].k;
    else
        for (int k = 0; k < *na; k++)
            if (act[k] == ev[e].k) {
                act[k] = act[--*na];
                break;
            }
    return e + 1 < ne ? ev[e + 1].t - ev[e].t : 0;
}

/* Max-min fair rates of the n transfers act[] by progressive filling (x[k]: bytes/s). */
static void fair_rates(const Xfer *xf, const int *act, int n, int W, double *x, double *used, double *growc, int *frozen) {
    for (int k = 0; k < n; k++) x[k] = 0, frozen[k] = 0;
    for (int left = n; left > 0;) {
        for (int l = 0; l < 2 * W; l++) used[l] = growc[l] = 0;
        for (int k = 0; k < n; k++) {
            const Xfer *f = &xf[act[k]];
            used[f->a] += x[k] * f->c_out, used[W + f->b] += x[k] * f->c_in;
            if (!frozen[k]) growc[f->a] += f->c_out, growc[W + f->b] += f->c_in;
        }
        double step = INFINITY;
        for (int l = 0; l < 2 * W; l++)
            if (growc[l] > 0 && (1 - used[l]) / growc[l] < step) step = (1 - used[l]) / growc[l];
        for (int k = 0; k < n; k++)
            if (!frozen[k]) x[k] += step, used[xf[act[k]].a] += step * xf[act[k]].c_out, used[W + xf[act[k]].b] += step * xf[act[k]].c_in;
        for (int k = 0; k < n; k++) {
            const Xfer *f = &xf[act[k]];
            if (!frozen[k] && (used[f->a] >= 1 - 1e-9 || used[W + f->b] >= 1 - 1e-9)) frozen[k] = 1, left--;
        }
    }
}

/* The outermost level any two replicas of stage st cross (their ring's latency is this level's). */
static int ring_level(const Cluster *cl, const SchedStage *g) {
    int lv = 0;
    for (int j = 0; j < g->replicas; j++)
        for (int q = j + 1; q < g->replicas; q++) {
            int l = level_of(cl, g->ranks[j], g->ranks[q]);
            if (l > lv) lv = l;
        }
    return lv;
}

static void fair_links(const Schedule *s, const SimCosts *c, const Cluster *cl, const SimResult *r) {
    if (!cl || cl->n_levels == 0) return;
    int W = s->n_ranks, n = 0;
    size_t total = 0;
    for (int w = 0; w < W; w++) total += (size_t)s->workers[w].n;
    Xfer *xf = malloc((total + 1) * sizeof(Xfer));
    for (int w = 0; w < W; w++)
        for (int i = 0; i < s->workers[w].n; i++) {
            const Instr *x = &s->workers[w].ins[i];
            if (x->op == OP_ALLREDUCE) {
                /* replica k sends 2 (r - 1) / r of the stage's parameter bytes to replica k + 1,
                 * from the all-reduce's start, on the same links as everything else */
                const SchedStage *g = &s->stages[x->peer];
                const int rr = g->replicas;
                if (rr < 2 || c->stage[x->peer].param_bytes <= 0) continue;
                int k = 0;
                while (g->ranks[k] != w) k++;
                const int b = g->ranks[(k + 1) % rr];
                const ClusterLevel *L = &cl->level[level_of(cl, w, b)];
                xf[n++] = (Xfer){r->start[w][i], r->start[w][i], INFINITY, 2.0 * (rr - 1) / rr * c->stage[x->peer].param_bytes,
                                 1 / own_rate(cl, w, L->bandwidth), 1 / own_rate(cl, b, L->bandwidth), 0, w, b, w, i, 1};
                continue;
            }
            if (x->op != OP_SEND_ACT && x->op != OP_SEND_GRAD) continue;
            int st = sched_instr_stage(&s->workers[w], x);
            double bytes = x->op == OP_SEND_ACT ? c->stage[st + 1].in_bytes : c->stage[st].in_bytes;
            if (bytes <= 0) continue;
            const ClusterLevel *L = &cl->level[level_of(cl, w, x->peer)];
            xf[n++] = (Xfer){r->start[w][i], 0, r->end[w][i] - L->latency, bytes, 1 / own_rate(cl, w, L->bandwidth),
                             1 / own_rate(cl, x->peer, L->bandwidth), 0, w, x->peer, w, i, 0};
        }
    qsort(xf, (size_t)n, sizeof(Xfer), cmp_pair);
    for (int k = 0; k < n; k++) {   /* a pair's messages one after the other, in the order sent */
        if (xf[k].ar) continue;
        int same = k > 0 && xf[k - 1].a == xf[k].a && xf[k - 1].b == xf[k].b;
        if (same && xf[k - 1].ar) fail_msg("worker %d sends to %d beside their all-reduce", xf[k].a, xf[k].b);
        xf[k].t0 = same && xf[k - 1].t1 > xf[k].sent ? xf[k - 1].t1 : xf[k].sent;
        if (xf[k].t1 < xf[k].t0 - 1e-9 * (1 + xf[k].t0))
            fail_msg("worker %d's send (instruction %d) to %d ends at %.12g before it can start, %.12g", xf[k].w, xf[k].i, xf[k].b,
                     xf[k].t1, xf[k].t0);
    }
    XEv *ev = malloc((2 * (size_t)n + 1) * sizeof(XEv));
    int ne = 0;
    for (int k = 0; k < n; k++) {
        ev[ne++] = (XEv){xf[k].t0, 1, k};
        if (!xf[k].ar) ev[ne++] = (XEv){xf[k].t1, 0, k};
    }
    qsort(ev, (size_t)ne, sizeof(XEv), cmp_xev);
    int *act = malloc(((size_t)n + 1) * sizeof(int)), *frozen = malloc(((size_t)n + 1) * sizeof(int)), na = 0;
    double *x = malloc(((size_t)n + 1) * sizeof(double)), *used = malloc(2 * (size_t)W * sizeof(double)),
           *growc = malloc(2 * (size_t)W * sizeof(double));
    /* sweep: between two events the active transfers move at their fair rates; an all-reduce's
     * transfer leaves when its bytes are in (an event found on the way) */
    double t = ne ? ev[0].t : 0;
    for (int e = 0; e < ne || na > 0;) {
        while (e < ne && ev[e].t <= t) sweep_step(ev, ne, e++, act, &na);
        double tn = e < ne ? ev[e].t : INFINITY;
        if (na == 0) {
            t = tn;
            continue;
        }
        fair_rates(xf, act, na, W, x, used, growc, frozen);
        double dt = tn - t;
        int fill = -1;
        for (int k = 0; k < na; k++)
            if (xf[act[k]].ar && (xf[act[k]].bytes - xf[act[k]].got) / x[k] <= dt)
                dt = (xf[act[k]].bytes - xf[act[k]].got) / x[k], fill = k;
        if (!isfinite(dt)) fail_msg("transfers that never end (%d under way at %.12g)", na, t);
        for (int k = 0; k < na; k++) xf[act[k]].got += x[k] * dt;
        t += dt;
        if (fill >= 0) {
            xf[act[fill]].got = xf[act[fill]].bytes;
            xf[act[fill]].t1 = t;
            act[fill] = act[--na];
        }
    }
    for (int k = 0; k < n; k++)
        if (fabs(xf[k].got - xf[k].bytes) > 1e-6 * xf[k].bytes)
            fail_msg("%s: worker %d's send (instruction %d) to %d, %.12g to %.12g: the fair share moves %.9g bytes of %.9g",
                     sched_kind_name(s->kind), xf[k].w, xf[k].i, xf[k].b, xf[k].t0, xf[k].t1, xf[k].got, xf[k].bytes);
    /* an all-reduce ends, for every replica, its ring's latencies after its last transfer */
    for (int k = 0; k < n; k++) {
        if (!xf[k].ar) continue;
        const Instr *in = &s->workers[xf[k].w].ins[xf[k].i];
        const SchedStage *g = &s->stages[in->peer];
        double last = 0;
        for (int q = 0; q < n; q++)
            if (xf[q].ar && xf[q].t0 == xf[k].t0 && s->workers[xf[q].w].ins[xf[q].i].peer == in->peer) last = fmax(last, xf[q].t1);
        double want = last + 2.0 * (g->replicas - 1) * cl->level[ring_level(cl, g)].latency, got = r->end[xf[k].w][xf[k].i];
        if (fabs(got - want) > 1e-9 * (1 + want))
            fail_msg("%s: worker %d's all-reduce (instruction %d) ends at %.12g, its ring's last transfer in at %.12g + latency: %.12g",
                     sched_kind_name(s->kind), xf[k].w, xf[k].i, got, last, want);
    }
    free(xf), free(ev), free(act), free(frozen), free(x), free(used), free(growc);
}

/* Instruction i of worker w's compute time at full speed (0: not a compute). */
static double full_speed(const Schedule *s, const SimCosts *c, int w, int i) {
    const Instr *in = &s->workers[w].ins[i];
    if (in->op != OP_FORWARD && in->op != OP_RECOMPUTE && in->op != OP_BACKWARD && in->op != OP_BACKWARD_B &&
        in->op != OP_BACKWARD_W)
        return 0;
    const SimStageCost *sc = &c->stage[sched_instr_stage(&s->workers[w], in)];
    const Instr *nx = i + 1 < s->workers[w].n ? &s->workers[w].ins[i + 1] : NULL, *pv = i ? in - 1 : NULL;
    int fused = in->op == OP_BACKWARD_B && nx && nx->op == OP_BACKWARD_W && nx->mb == in->mb && nx->chunk == in->chunk;
    int fused_w = in->op == OP_BACKWARD_W && pv && pv->op == OP_BACKWARD_B && pv->mb == in->mb && pv->chunk == in->chunk;
    return in->op == OP_FORWARD || in->op == OP_RECOMPUTE ? sc->fwd_s
           : in->op == OP_BACKWARD                        ? sc->bwd_s
           : fused                                        ? sc->bwd_s
           : fused_w                                      ? 0
           : in->op == OP_BACKWARD_B ? (sc->bwd_in_s + sc->bwd_w_s > 0 ? sc->bwd_in_s : sc->bwd_s / 2)
                                     : (sc->bwd_in_s + sc->bwd_w_s > 0 ? sc->bwd_w_s : sc->bwd_s / 2);
}

/* Each worker's factor on its compute apart from sharing cores: 1 / its host's speed, times
 * (1 + its network CPU / its compute) where a machine's cores are shared: half of every
 * message's bytes x net_cpu_per_byte on each end. */
static double *compute_factors(const Schedule *s, const SimCosts *c, const Cluster *cl) {
    int W = s->n_ranks;
    double *f = calloc((size_t)W + 1, sizeof(double)), *net = calloc((size_t)W + 1, sizeof(double)),
           *load = calloc((size_t)W + 1, sizeof(double));
    int shared = cl && cl->n_levels > 0 && cl->cores_per_machine > 0;
    for (int w = 0; w < W; w++)
        for (int i = 0; i < s->workers[w].n; i++) {
            const Instr *x = &s->workers[w].ins[i];
            load[w] += full_speed(s, c, w, i);
            if (shared && (x->op == OP_SEND_ACT || x->op == OP_SEND_GRAD)) {
                int st = sched_instr_stage(&s->workers[w], x);
                double bytes = x->op == OP_SEND_ACT ? c->stage[st + 1].in_bytes : c->stage[st].in_bytes;
                net[w] += 0.5 * cl->net_cpu_per_byte * bytes, net[x->peer] += 0.5 * cl->net_cpu_per_byte * bytes;
            }
        }
    for (int w = 0; w < W; w++) {
        double speed = cl && w < cl->n_hosts && cl->host[w].speed > 0 ? cl->host[w].speed : 1;
        f[w] = (load[w] > 0 ? 1 + net[w] / load[w] : 1) / speed;
    }
    free(net), free(load);
    return f;
}

/* Shared cores as the model states them: on each machine (a level-0 group of workers) the
 * workers computing at once each run at min(1, cores / how many) of their speed. Checked from
 * the reported times alone, as fair_links does: the rates over each interval between compute
 * starts and ends must add up to every compute instruction's work by its reported end. */
static void shared_cores(const Schedule *s, const SimCosts *c, const Cluster *cl, const SimResult *r, const double *slow) {
    int W = s->n_ranks, per = cl->level[0].workers;
    size_t total = 0;
    for (int w = 0; w < W; w++) total += (size_t)s->workers[w].n;
    XEv *ev = malloc((2 * total + 1) * sizeof(XEv));
    double *work = malloc((total + 1) * sizeof(double)), *got = calloc(total + 1, sizeof(double));
    int *who = malloc((total + 1) * sizeof(int)), *ins = malloc((total + 1) * sizeof(int)), *act = malloc((total + 1) * sizeof(int));
    for (int m0 = 0; m0 < W; m0 += per) {
        int n = 0, ne = 0, na = 0;
        for (int w = m0; w < m0 + per && w < W; w++)
            for (int i = 0; i < s->workers[w].n; i++) {
                double d = full_speed(s, c, w, i) * slow[w];
                if (d <= 0) continue;
                work[n] = d, got[n] = 0, who[n] = w, ins[n] = i;
                ev[ne++] = (XEv){r->start[w][i], 1, n}, ev[ne++] = (XEv){r->end[w][i], 0, n};
                n++;
            }
        qsort(ev, (size_t)ne, sizeof(XEv), cmp_xev);
        for (int k = 0; k < ne; k++) {
            double dt = sweep_step(ev, ne, k, act, &na);
            if (dt <= 0 || na == 0) continue;
            /* every core busy: each at E of its speed; fewer busy: in proportion from 1 for one */
            double E = cl->core_efficiency > 0 ? cl->core_efficiency : 1, C = cl->cores_per_machine;
            double busy = C > 1 ? fmin(1, (na - 1) / (C - 1)) : (na > 1);
            double rate = (na > C ? C / na : 1) * (1 - (1 - E) * busy);
            for (int q = 0; q < na; q++) got[act[q]] += rate * dt;
        }
        for (int k = 0; k < n; k++)
            if (fabs(got[k] - work[k]) > 1e-7 * (1 + work[k]))
                fail_msg("%s: worker %d instruction %d (%.12g to %.12g): its share of the cores does %.12g s of its %.12g",
                         sched_kind_name(s->kind), who[k], ins[k], r->start[who[k]][ins[k]], r->end[who[k]][ins[k]], got[k], work[k]);
    }
    free(ev), free(work), free(got), free(who), free(ins), free(act);
}

static void check_times(const Schedule *s, const SimCosts *c, const Cluster *cl, const SimResult *r) {
    int U = s->n_units, W = s->n_ranks;
    int shared = cl && cl->n_levels > 0 && cl->cores_per_machine > 0;
    double *slow = compute_factors(s, c, cl);
    fair_links(s, c, cl, r);
    if (shared) shared_cores(s, c, cl, r, slow);
    size_t na = (size_t)U * (size_t)(s->n_stages + 1) * 2;
    double *arrive = malloc(na * sizeof(double));
    for (size_t i = 0; i < na; i++) arrive[i] = -1;
    /* arrival time of each worker at its k-th all-reduce: the end of what came before */
    double **ar_at = calloc((size_t)W, sizeof(double *));
    for (int w = 0; w < W; w++) {
        ar_at[w] = malloc(((size_t)s->workers[w].n + 1) * sizeof(double));
        double t = 0;
        int k = 0;
        for (int i = 0; i < s->workers[w].n; i++) {
            const Instr *in = &s->workers[w].ins[i];
            int st = sched_instr_stage(&s->workers[w], in);
            if (in->op == OP_SEND_ACT) arrive[((size_t)(st + 1) * U + in->mb) * 2] = r->end[w][i];
            if (in->op == OP_SEND_GRAD) arrive[((size_t)(st - 1) * U + in->mb) * 2 + 1] = r->end[w][i];
            if (in->op == OP_ALLREDUCE) ar_at[w][k++] = t;
            if (in->op != OP_SEND_ACT && in->op != OP_SEND_GRAD) t = r->end[w][i];
        }
    }
    for (int w = 0; w < W; w++) {
        double t = 0;
        int k = 0;
        for (int i = 0; i < s->workers[w].n; i++) {
            const Instr *in = &s->workers[w].ins[i];
            int st = sched_instr_stage(&s->workers[w], in);
            double a = r->start[w][i], b = r->end[w][i], tol = 1e-9 * (1 + fabs(b));
            switch (in->op) {
            case OP_FORWARD:
            case OP_RECOMPUTE:
            case OP_BACKWARD:
            case OP_BACKWARD_B:
            case OP_BACKWARD_W: {
                double d = full_speed(s, c, w, i) * slow[w];
                if (shared) /* no sooner than alone on a core; its end: shared_cores */
                    CHECK_T(fabs(a - t) <= tol && b - a >= d - tol, "want %.12g + at least %.12g", t, d);
                else
                    CHECK_T(fabs(a - t) <= tol && fabs(b - a - d) <= tol, "want %.12g + %.12g", t, d);
                break;
            }
            case OP_SEND_ACT:
            case OP_SEND_GRAD: {
                double bytes = in->op == OP_SEND_ACT ? c->stage[st + 1].in_bytes : c->stage[st].in_bytes;
                /* posted when the worker reaches it; no cluster or no bytes: there at once, else
                 * no sooner than alone on the link (its end: fair_links) */
                double d = xfer(cl, w, in->peer, bytes);
                CHECK_T(fabs(a - t) <= tol && (d > 0 ? b - a >= d - tol : fabs(b - a) <= tol), "want %.12g + at least %.12g", t, d);
                continue;   /* the worker does not wait for a send */
            }
            case OP_RECV_ACT:
            case OP_RECV_GRAD: {
                double got = arrive[((size_t)st * U + in->mb) * 2 + (in->op == OP_RECV_GRAD)];
                CHECK_T(got >= 0, "no matching send%s", "");
                CHECK_T(fabs(a - t) <= tol && fabs(b - fmax(t, got)) <= tol, "want %.12g, arrival %.12g", t, got);
                break;
            }
            case OP_ALLREDUCE: {
                const SchedStage *g = &s->stages[st];
                double start = 0;
                for (int j = 0; j < g->replicas; j++) start = fmax(start, ar_at[g->ranks[j]][k]);
                double ring = 0;
                if (cl && cl->n_levels && g->replicas > 1) {
                    int lv = ring_level(cl, g), rr = g->replicas;
                    double bw = INFINITY;   /* the ring's slowest hop, hosts' own links included */
                    for (int j = 0; j < rr; j++) {
                        int x = g->ranks[j], y = g->ranks[(j + 1) % rr];
                        bw = fmin(bw, own_rate(cl, y, own_rate(cl, x, cl->level[level_of(cl, x, y)].bandwidth)));
                    }
                    ring = 2.0 * (rr - 1) / rr * c->stage[st].param_bytes / bw +
                           2.0 * (rr - 1) * cl->level[lv].latency;
                }
                k++;
                /* no sooner than the ring alone on its links (its end: fair_links) */
                CHECK_T(fabs(a - start) <= tol && b - a >= ring - 1e-9 * (1 + b), "want %.12g + at least %.12g", start, ring);
                break;
            }
            default: CHECK_T(fabs(a - t) <= tol && fabs(b - a) <= tol, "want %.12g", t); break;
            }
            t = b;
        }
    }
    for (int w = 0; w < W; w++) free(ar_at[w]);
    free(ar_at);
    free(slow);
    free(arrive);
}

static void test_random_plans(void **state) {
    (void)state;
    Rng rng;
    rng_init(&rng, 11, 200, 0);
    int worst_vs = 0, vs_fail = 0;
    for (int trial = 0; trial < 120; trial++) {
        int S = 1 + (int)rng_below(&rng, 16), rep[16];
        for (int i = 0; i < S; i++) rep[i] = 1 + (int)rng_below(&rng, 4);
        Plan *p = make_plan(S, rep);
        int N = 1 + (int)rng_below(&rng, 64);
        SimCosts c = uniform_costs(S, 0, 0);
        for (int i = 0; i < S; i++) {
            c.stage[i].fwd_s = 0.5 + rng_uniform_f64(&rng);
            c.stage[i].bwd_s = 2 * c.stage[i].fwd_s * (0.5 + rng_uniform_f64(&rng));
            c.stage[i].param_bytes = 1e6 * rng_uniform_f64(&rng);
            c.stage[i].in_bytes = i ? 1e6 * rng_uniform_f64(&rng) : 0;
            c.stage[i].stash_bytes = 1e5;
        }
        Cluster cl = {.n_levels = 2, .level = {{1 + (int)rng_below(&rng, 8), 4e6, 1e-3}, {64, 1e6, 1e-2}}};
        if (trial % 3 == 2) {   /* machines of a few cores shared by their workers, the network stack's CPU on them */
            cl.cores_per_machine = 1 + (int)rng_below(&rng, 3);
            cl.net_cpu_per_byte = rng_below(&rng, 2) ? 0 : 1e-7 * rng_uniform_f64(&rng);
            cl.core_efficiency = rng_below(&rng, 2) ? 0 : 0.5 + 0.5 * rng_uniform_f64(&rng);
        }
        if (trial % 3 == 1) {   /* some workers with links of their own, slower or faster than the levels' */
            cl.n_hosts = p->n_workers < PD_MAX_HOSTS ? p->n_workers : PD_MAX_HOSTS;
            for (int h = 0; h < cl.n_hosts; h++)
                cl.host[h].bandwidth = rng_below(&rng, 2) ? 0 : 2e5 + 4e6 * rng_uniform_f64(&rng);
        }
        /* every kind on plans of one stage per rank (interleaved: test_new_kinds_random; asp:
         * its runtime's tests), and (last) 1f1b with vertical sync */
        static const int kinds[] = {SCHED_1F1B, SCHED_GPIPE, SCHED_1F1B_FLUSH, SCHED_2BW, SCHED_DP,
                                    SCHED_MP,   SCHED_ZB_H1, SCHED_ZB_H2,     SCHED_1F1B};
        const int nk = (int)(sizeof kinds / sizeof kinds[0]);
        for (int kk = 0; kk < nk; kk++) {
            int vs = kk == nk - 1, kind = kinds[kk];
            int M = 1;
            if (kind == SCHED_GPIPE || kind == SCHED_1F1B_FLUSH || kind == SCHED_ZB_H1 || kind == SCHED_ZB_H2)
                M = 1 + (int)rng_below(&rng, 8);
            if (kind == SCHED_2BW) M = p->n_workers + (int)rng_below(&rng, 3);
            if (kind == SCHED_ZB_H1 && rng_below(&rng, 2))   /* a measured split, not half/half */
                for (int i = 0; i < S; i++) c.stage[i].bwd_in_s = 0.4 * c.stage[i].bwd_s, c.stage[i].bwd_w_s = 0.7 * c.stage[i].bwd_s;
            SchedOpts o = {(SchedKind)kind, N, M, vs, !vs && rng_below(&rng, 3) == 0, 0};
            Schedule s;
            Err err = {0};
            if (sched_build(p, &o, &s, &err)) {
                /* only vertical sync may be out of reach, and only with replication */
                assert_true(vs);
                assert_non_null(strstr(err.msg, "vertical sync"));
                vs_fail++;
                continue;
            }
            SimCosts cc = c;
            SimStageCost one;
            if (kind == SCHED_DP) {   /* one stage: the whole model */
                one = (SimStageCost){.stash_bytes = 1e5};
                for (int i = 0; i < S; i++) one.fwd_s += c.stage[i].fwd_s, one.bwd_s += c.stage[i].bwd_s,
                                            one.param_bytes += c.stage[i].param_bytes;
                cc = (SimCosts){1, &one};
            }
            SimResult r;
            SimOpts so = {&cl, 1, 0, 0, 0, 0, NULL, 0};
            if (sim_run(&s, &cc, &so, &r, &err)) {
                sched_dump(&s, stderr, 1, 1);
                fail_msg("%s, %d minibatches x %d, %d stages: %s", sched_kind_name((SchedKind)kind), N, M, S, err.msg);
            }
            check_times(&s, &cc, &cl, &r);
            for (int i = 0; i < s.n_stages; i++) {
                int bound = kind == SCHED_1F1B && !vs ? s.stages[i].warmup : kind == SCHED_2BW ? 2 : 1;
                if (vs) {
                    if (r.versions_alive[i] > worst_vs) worst_vs = r.versions_alive[i];
                    continue;
                }
                if (r.versions_alive[i] > bound)
                    fail_msg("%s: stage %d has %d versions alive, bound %d", sched_kind_name((SchedKind)kind), i,
                             r.versions_alive[i], bound);
            }
            assert_true(r.bubble_fraction >= -1e-12 && r.bubble_fraction < 1);
            sim_result_release(&r);
            sched_release(&s);
        }
        sim_costs_release(&c);
        free_plan(p);
    }
    print_message("vertical sync: at most %d versions alive at a stage; %d replicated plans refused\n", worst_vs, vs_fail);
}

/* Interleaved plans (V chunks round-robin on P positions, d = 1..3 replicated pipelines) and the
 * zb kinds on straight plans, with recomputation or not, random costs and a two-level cluster:
 * no deadlock, every time as the model's equations give (check_times), one weight version. A
 * list with two instructions swapped so that a receive precedes the send it needs is reported
 * as a deadlock. */
static void test_new_kinds_random(void **state) {
    (void)state;
    Rng rng;
    rng_init(&rng, 12, 300, 0);
    for (int trial = 0; trial < 150; trial++) {
        int P = 2 + (int)rng_below(&rng, 5), V = 2 + (int)rng_below(&rng, 3), S = P * V;
        int d = 1 + (int)rng_below(&rng, 3);
        int M = P * d * (1 + (int)rng_below(&rng, 3)), N = 1 + (int)rng_below(&rng, 3), rc = (int)rng_below(&rng, 2);
        int reps[24];
        for (int i = 0; i < S; i++) reps[i] = d;
        Plan *p = make_plan(S, NULL), *pd = make_plan(S, reps);
        for (int i = 0; i < S; i++)
            for (int j = 0; j < d; j++) pd->stages[i].ranks[j] = (i % P) * d + j;
        pd->n_workers = P * d;
        SimCosts c = uniform_costs(S, 0, 0);
        for (int i = 0; i < S; i++) {
            c.stage[i].fwd_s = 0.5 + rng_uniform_f64(&rng);
            c.stage[i].bwd_s = 2 * c.stage[i].fwd_s * (0.5 + rng_uniform_f64(&rng));
            c.stage[i].param_bytes = 1e6 * rng_uniform_f64(&rng);
            c.stage[i].in_bytes = i ? 1e6 * rng_uniform_f64(&rng) : 0;
            c.stage[i].stash_bytes = c.stage[i].in_bytes + 1e5;
        }
        Cluster cl = {.n_levels = 2, .level = {{1 + (int)rng_below(&rng, 4), 4e6, 1e-3}, {64, 1e6, 1e-2}}};
        SchedOpts o = {.kind = SCHED_INTERLEAVED, .n_minibatches = N, .n_micro = M, .recompute = rc};
        Schedule s;
        Err err = {0};
        if (sched_build(pd, &o, &s, &err)) fail_msg("interleaved %d x %d x %d, M %d: %s", P, V, d, M, err.msg);
        SimResult r;
        SimOpts so = {&cl, 1, 0, 0, 0, 0, NULL, 0};
        if (sim_run(&s, &c, &so, &r, &err)) {
            sched_dump(&s, stderr, 1, 0);
            fail_msg("interleaved %d positions x %d chunks x %d pipelines, %d x %d: %s", P, V, d, N, M, err.msg);
        }
        check_times(&s, &c, &cl, &r);
        for (int i = 0; i < S; i++) assert_int_equal(r.versions_alive[i], 1);
        sim_result_release(&r);
        {
            SchedWorker *w = &s.workers[(P - 1) * d];
            int j = -1;
            for (int i = 0; i < w->n && j < 0; i++)
                if (w->ins[i].op == OP_RECV_ACT && w->ins[i].chunk == V - 1) j = i;
            PD_ASSERT(j >= 0);
            /* the last stage's first activation receive, moved to the front of the list of
             * position P-1 (pipeline 0), waits for a unit worker 0 sends only after it receives
             * from there */
            Instr moved = w->ins[j];
            memmove(w->ins + 1, w->ins, (size_t)j * sizeof *w->ins);
            w->ins[0] = moved;
            assert_int_equal(sim_run(&s, &c, &so, &r, &err), PD_EINVAL);
            assert_non_null(strstr(err.msg, "deadlock"));
        }
        sched_release(&s);
        /* the zb kinds on the same stages as a straight pipeline (replicated: test_random_plans) */
        for (int i = 0; i < S; i++) p->stages[i].ranks[0] = i;
        p->n_workers = S;
        for (int k = SCHED_ZB_H1; k <= SCHED_ZB_H2; k++) {
            o = (SchedOpts){.kind = (SchedKind)k, .n_minibatches = N, .n_micro = 1 + (int)rng_below(&rng, 2 * S),
                            .recompute = rc};
            if (sched_build(p, &o, &s, &err)) fail_msg("%s: %s", sched_kind_name((SchedKind)k), err.msg);
            if (sim_run(&s, &c, &so, &r, &err)) fail_msg("%s: %s", sched_kind_name((SchedKind)k), err.msg);
            check_times(&s, &c, &cl, &r);
            sim_result_release(&r);
            sched_release(&s);
        }
        sim_costs_release(&c);
        free_plan(p);
        free_plan(pd);
    }
}

static void push(SchedWorker *w, int op, int mb, int peer, int v) {
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 8;
        w->ins = realloc(w->ins, (size_t)w->cap * sizeof *w->ins);
    }
    w->ins[w->n++] = (Instr){op, mb, peer, v, 0};
}

/* A hand-made two-worker schedule (no generator) released with free(). */
static void hand_schedule(Schedule *s) {
    memset(s, 0, sizeof *s);
    s->kind = SCHED_1F1B;
    s->n_minibatches = s->n_units = 1;
    s->n_micro = 1;
    s->n_stages = 2;
    s->stages = calloc(2, sizeof *s->stages);
    s->n_ranks = 2;
    s->workers = calloc(2, sizeof *s->workers);
    for (int i = 0; i < 2; i++) {
        s->stages[i].replicas = 1;
        s->stages[i].ranks = malloc(sizeof(int));
        s->stages[i].ranks[0] = i;
        s->workers[i].stage = i;
    }
}

static void free_hand(Schedule *s) {
    for (int i = 0; i < s->n_stages; i++) free(s->stages[i].ranks);
    free(s->stages);
    for (int i = 0; i < s->n_ranks; i++) free(s->workers[i].ins);
    free(s->workers);
}

static void test_deadlock(void **state) {
    (void)state;
    SimCosts c = uniform_costs(2, 1, 1);
    SimOpts o = {NULL, 1, 0, 0, 0, 0, NULL, 0};
    Err err = {0};
    SimResult r;
    /* each worker receives before it sends */
    Schedule s;
    hand_schedule(&s);
    push(&s.workers[0], OP_RECV_GRAD, 0, 1, -1);
    push(&s.workers[0], OP_FORWARD, 0, -1, 0);
    push(&s.workers[0], OP_SEND_ACT, 0, 1, -1);
    push(&s.workers[1], OP_RECV_ACT, 0, 0, -1);
    push(&s.workers[1], OP_FORWARD, 0, -1, 0);
    push(&s.workers[1], OP_SEND_GRAD, 0, 0, -1);
    assert_int_equal(sim_run(&s, &c, &o, &r, &err), PD_EINVAL);
    print_message("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "deadlock"));
    assert_non_null(strstr(err.msg, "worker 0 at instruction 0 (RG0<1)"));
    assert_non_null(strstr(err.msg, "worker 1 at instruction 0 (RA0<0)"));
    free_hand(&s);
    /* a receive whose sender finished without sending */
    hand_schedule(&s);
    push(&s.workers[0], OP_FORWARD, 0, -1, 0);
    push(&s.workers[1], OP_RECV_ACT, 0, 0, -1);
    assert_int_equal(sim_run(&s, &c, &o, &r, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "finished without sending"));
    free_hand(&s);
    /* a send nobody receives */
    hand_schedule(&s);
    push(&s.workers[0], OP_FORWARD, 0, -1, 0);
    push(&s.workers[0], OP_SEND_ACT, 0, 1, -1);
    assert_int_equal(sim_run(&s, &c, &o, &r, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "never receives"));
    free_hand(&s);
    /* an all-reduce one replica never joins */
    hand_schedule(&s);
    s.n_stages = 1;
    s.stages[0].replicas = 2;
    s.stages[0].ranks = realloc(s.stages[0].ranks, 2 * sizeof(int));
    s.stages[0].ranks[1] = 1;
    s.workers[1].stage = 0;
    push(&s.workers[0], OP_ALLREDUCE, -1, 0, 1);
    push(&s.workers[0], OP_STEP, -1, -1, 1);
    push(&s.workers[1], OP_STEP, -1, -1, 1);
    SimCosts c1 = uniform_costs(1, 1, 1);
    assert_int_equal(sim_run(&s, &c1, &o, &r, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "waits for 1 of 2 replicas"));
    s.n_stages = 2;
    free_hand(&s);
    /* a forward reading a version its worker does not have yet */
    hand_schedule(&s);
    push(&s.workers[0], OP_FORWARD, 0, -1, 1);
    assert_int_equal(sim_run(&s, &c, &o, &r, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "version 1"));
    free_hand(&s);
    sim_costs_release(&c);
    sim_costs_release(&c1);
}

static void test_memory(void **state) {
    (void)state;
    Plan *p = make_plan(2, NULL);
    Schedule s;
    build(p, SCHED_1F1B, 10, 1, 0, &s);
    SimCosts c = uniform_costs(2, 1, 1);
    for (int i = 0; i < 2; i++) c.stage[i].param_bytes = 1000, c.stage[i].stash_bytes = 10;
    SimOpts o = {NULL, 2, 0, 0, 0, 0, NULL, 0};   /* Adam: two state tensors */
    Err err = {0};
    SimResult r;
    assert_int_equal(sim_run(&s, &c, &o, &r, &err), PD_OK);
    /* stage 0 admits 2: two minibatches in flight, two versions (stash + newest) */
    assert_int_equal(r.max_inflight[0], 2);
    assert_int_equal(r.versions_alive[0], 2);
    assert_near(r.mem[0].peak, 1000 * 2 + 1000 + 2000 + 2 * 10, 1e-9);
    assert_int_equal(r.max_inflight[1], 1);
    assert_int_equal(r.versions_alive[1], 1);
    assert_near(r.mem[1].peak, 1000 + 1000 + 2000 + 10, 1e-9);
    /* what the runtime allocates up front: the most versions, in-flight units + 2 slots */
    assert_int_equal(r.worker_versions[0], 2);
    assert_int_equal(r.slots[0], 2 + SCHED_SLOTS_AHEAD);
    assert_near(r.mem[0].alloc_stashed, 1000, 0);
    assert_near(r.mem[0].alloc_activations, 4 * 10, 0);
    assert_near(r.mem[0].allocated, 1000 * 2 + 1000 + 2000 + 4 * 10, 0);
    assert_int_equal(r.worker_versions[1], 1);
    assert_int_equal(r.slots[1], 3);
    assert_near(r.mem[1].allocated, 1000 + 1000 + 2000 + 3 * 10, 0);
    sim_result_release(&r);
    sched_release(&s);
    /* gpipe holds all m micro-batches' activations and one version */
    build(p, SCHED_GPIPE, 2, 6, 0, &s);
    assert_int_equal(sim_run(&s, &c, &o, &r, &err), PD_OK);
    assert_int_equal(r.max_inflight[0], 6);
    assert_near(r.mem[0].peak, 1000 + 1000 + 2000 + 6 * 10, 1e-9);
    assert_int_equal(r.slots[0], 8);
    assert_near(r.mem[0].allocated, 1000 + 1000 + 2000 + 8 * 10, 0);
    sim_result_release(&r);
    sched_release(&s);
    sim_costs_release(&c);
    free_plan(p);
}

static void test_costs_from_profile(void **state) {
    (void)state;
    ProfileLayer L[5];
    memset(L, 0, sizeof L);
    for (int i = 0; i < 5; i++) {
        L[i].fwd_s = 0.1 * (i + 1);
        L[i].bwd_s = 0.2 * (i + 1);
        L[i].act_bytes = 100.0 * (i + 1);
        L[i].param_bytes = 10.0 * i;
    }
    Profile prof = {.n_layers = 5, .layers = L, .input_bytes = 50};
    int rep[2] = {1, 1};
    Plan *p = make_plan(2, rep);
    free(p->stages[0].layers), free(p->stages[1].layers);
    p->stages[0].n_layers = 2, p->stages[0].layers = malloc(2 * sizeof(int));
    p->stages[0].layers[0] = 0, p->stages[0].layers[1] = 1;
    p->stages[1].n_layers = 3, p->stages[1].layers = malloc(3 * sizeof(int));
    for (int i = 0; i < 3; i++) p->stages[1].layers[i] = 2 + i;
    Schedule s;
    build(p, SCHED_1F1B, 2, 1, 0, &s);
    SimCosts c;
    Err err = {0};
    assert_int_equal(sim_costs_from_profile(&s, &prof, &c, &err), PD_OK);
    assert_near(c.stage[0].fwd_s, 0.3, 1e-12);
    assert_near(c.stage[1].bwd_s, 0.2 * 12, 1e-12);
    assert_near(c.stage[0].param_bytes, 10, 1e-12);
    assert_near(c.stage[0].in_bytes, 50, 1e-12);
    assert_near(c.stage[1].in_bytes, 200, 1e-12);   /* layer 1's output */
    assert_near(c.stage[1].stash_bytes, 200 + 300 + 400 + 500, 1e-12);
    sim_costs_release(&c);
    /* the cuts' prices: charged only where the stage boundary is (layer 1's output, layer 2's
     * input), the backward's between its passes as the layer's is (layer 2: BI 1/4 of it) */
    for (int i = 0; i < 5; i++) {
        L[i].cut_out_fwd_s = 0.01 * (i + 1), L[i].cut_out_bwd_s = 0.02 * (i + 1);
        L[i].cut_in_fwd_s = 0.001 * (i + 1), L[i].cut_in_bwd_s = 0.002 * (i + 1);
    }
    L[2].bwd_in_s = 0.15, L[2].bwd_w_s = 0.45;
    assert_int_equal(sim_costs_from_profile(&s, &prof, &c, &err), PD_OK);
    assert_near(c.stage[0].fwd_s, 0.3 + 0.02, 1e-12);
    assert_near(c.stage[0].bwd_s, 0.6 + 0.04, 1e-12);
    assert_near(c.stage[0].bwd_in_s + c.stage[0].bwd_w_s, 0.6 + 0.04, 1e-12);
    assert_near(c.stage[1].fwd_s, 1.2 + 0.003, 1e-12);
    assert_near(c.stage[1].bwd_s, 2.4 + 0.006, 1e-12);
    assert_near(c.stage[1].bwd_in_s, 0.15 + 0.4 + 0.5 + 0.006 / 4, 1e-12);
    sim_costs_release(&c);
    for (int i = 0; i < 5; i++) L[i].cut_out_fwd_s = L[i].cut_out_bwd_s = L[i].cut_in_fwd_s = L[i].cut_in_bwd_s = 0;
    L[2].bwd_in_s = L[2].bwd_w_s = 0;
    /* a skip edge 0 -> 3 also crosses the boundary */
    int edges[5][2] = {{0, 1}, {1, 2}, {2, 3}, {3, 4}, {0, 3}};
    prof.n_edges = 5, prof.edges = edges;
    assert_int_equal(sim_costs_from_profile(&s, &prof, &c, &err), PD_OK);
    assert_near(c.stage[1].in_bytes, 300, 1e-12);
    sim_costs_release(&c);
    p->stages[1].layers[2] = 9;
    sched_release(&s);
    build(p, SCHED_1F1B, 2, 1, 0, &s);
    assert_int_equal(sim_costs_from_profile(&s, &prof, &c, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "layer 9"));
    sched_release(&s);
    free_plan(p);
}

static void test_pictures(void **state) {
    (void)state;
    int rep[3] = {1, 2, 1};
    Plan *p = make_plan(3, rep);
    Schedule s;
    build(p, SCHED_1F1B, 12, 1, 0, &s);
    SimCosts c = uniform_costs(3, 1e-3, 2e-3);
    c.stage[1].in_bytes = c.stage[2].in_bytes = 1e5;
    c.stage[1].param_bytes = 1e6;
    Cluster cl = {.n_levels = 1, .level = {{8, 1e9, 1e-5}}};
    SimResult r;
    run(&s, &c, &cl, &r);
    int n;
    TraceEvent *ev = sim_events(&s, &r, &n);
    int n_compute = 0;
    for (int i = 0; i < n; i++) n_compute += ev[i].kind == TRACE_FWD || ev[i].kind == TRACE_BWD;
    assert_int_equal(n_compute, 2 * 12 * 3);
    char path[] = "/tmp/pd_test_sim_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    Err err = {0};
    SvgOpts so = {.title = "test <1f1b>", .show_comm = 1};
    assert_int_equal(sim_svg_write(path, ev, n, s.n_ranks, &so, &err), PD_OK);
    char *text;
    size_t len;
    assert_int_equal(pd_read_file(path, 1 << 24, &text, &len, &err), PD_OK);
    assert_non_null(strstr(text, "<svg"));
    assert_non_null(strstr(text, "test &lt;1f1b&gt;"));
    int boxes = 0;
    for (const char *q = text; (q = strstr(q, "<title>forward")) || 0; q++) boxes++;
    for (const char *q = text; (q = strstr(q, "<title>backward")) || 0; q++) boxes++;
    assert_int_equal(boxes, n_compute);
    assert_non_null(strstr(text, "<title>all-reduce"));
    pd_free(text);
    const char *labels[4] = {"w0 s0", "w1 s1", "w2 s1", "w3 <s2>"};
    so.row_labels = labels;
    assert_int_equal(sim_svg_write(path, ev, n, s.n_ranks, &so, &err), PD_OK);
    assert_int_equal(pd_read_file(path, 1 << 24, &text, &len, &err), PD_OK);
    assert_non_null(strstr(text, ">w2 s1</text>"));
    assert_non_null(strstr(text, ">w3 &lt;s2&gt;</text>"));
    assert_null(strstr(text, ">worker 1</text>"));
    pd_free(text);
    /* measured traces carry clock readings: the axis starts at the first event */
    for (int i = 0; i < n; i++) ev[i].start += 5000, ev[i].end += 5000;
    so.width = 1000;
    assert_int_equal(sim_svg_write(path, ev, n, s.n_ranks, &so, &err), PD_OK);
    for (int i = 0; i < n; i++) ev[i].start -= 5000, ev[i].end -= 5000;
    assert_int_equal(pd_read_file(path, 1 << 24, &text, &len, &err), PD_OK);
    double xmin = 1e9, xmax = -1;   /* over the compute boxes */
    for (const char *q = text; (q = strstr(q, "<rect x=\"")); q++) {
        const char *gt = strchr(q, '>');
        if (strncmp(gt, "><title>forward", 15) && strncmp(gt, "><title>backward", 16)) continue;
        double x = atof(q + 9);
        xmin = x < xmin ? x : xmin, xmax = x > xmax ? x : xmax;
    }
    assert_true(xmin >= 60 && xmin < 100 && xmax > 500 && xmax <= 1000);
    assert_non_null(strstr(text, ">0ms</text>"));
    pd_free(text);
    assert_int_equal(sim_trace_write(path, ev, n, &err), PD_OK);
    assert_int_equal(pd_read_file(path, 1 << 24, &text, &len, &err), PD_OK);
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    cJSON *arr = cJSON_GetObjectItem(j, "traceEvents");
    int nx = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, arr) nx += !strcmp(cJSON_GetObjectItem(it, "ph")->valuestring, "X");
    assert_int_equal(nx, n);
    cJSON_Delete(j);
    pd_free(text);
    assert_int_equal(sim_svg_write("/nonexistent/dir/x.svg", ev, n, s.n_ranks, &so, &err), PD_EIO);
    unlink(path);
    free(ev);
    sim_result_release(&r);
    sim_costs_release(&c);
    sched_release(&s);
    free_plan(p);
}

/* Straight pipeline of W stages x N minibatches: time it. */
static double time_big(int W, int N, SchedKind k, int M) {
    Plan *p = make_plan(W, NULL);
    double t0 = pd_now();
    Schedule s;
    build(p, k, N, M, 0, &s);
    SimCosts c = uniform_costs(W, 1e-3, 2e-3);
    for (int i = 1; i < W; i++) c.stage[i].in_bytes = 1e5;
    Cluster cl = {.n_levels = 2, .level = {{8, 1e10, 1e-6}, {1 << 12, 1e9, 1e-5}}};
    SimResult r;
    run(&s, &c, &cl, &r);
    double dt = pd_now() - t0;
    print_message("%d workers x %d minibatches (%s): build + simulate %.2f s, %.3f ms per minibatch\n", W, N,
                  sched_kind_name(k), dt, r.time_per_minibatch_s * 1e3);
    assert_true(r.time_per_minibatch_s >= 3e-3 - 1e-12);
    sim_result_release(&r);
    sim_costs_release(&c);
    sched_release(&s);
    free_plan(p);
    return dt;
}

static void test_scale(void **state) {
    (void)state;
    time_big(128, 200, SCHED_1F1B, 1);   /* the time is printed, not asserted */
    if (getenv("PD_SIM_BIG")) {
        time_big(1024, 1000, SCHED_1F1B, 1);
        time_big(1024, 100, SCHED_GPIPE, 10);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpipe_bubble),      cmocka_unit_test(test_1f1b_steady_state),
        cmocka_unit_test(test_replication),       cmocka_unit_test(test_bucket_overlap), cmocka_unit_test(test_interleaved_chunk_overlap),
        cmocka_unit_test(test_wake),       cmocka_unit_test(test_bandwidth_bound), cmocka_unit_test(test_incoming_link),
        cmocka_unit_test(test_random_plans),      cmocka_unit_test(test_new_kinds_random),
        cmocka_unit_test(test_deadlock),          cmocka_unit_test(test_heterogeneous),
        cmocka_unit_test(test_host_latency),
        cmocka_unit_test(test_memory),            cmocka_unit_test(test_costs_from_profile),
        cmocka_unit_test(test_pictures),          cmocka_unit_test(test_scale),
        cmocka_unit_test(test_net_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
