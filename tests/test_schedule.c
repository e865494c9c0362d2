/* test_schedule.c: the schedule generators. Exact instruction sequences written out by
 * hand for small cases (1f1b straight and round-robin, gpipe, 1f1b-flush, 2bw, dp,
 * model-parallel), structural invariants for random plans of every kind (sends match
 * receives one to one, every stage sees every unit once, each forward has one backward
 * on the same worker with the same weight version where stashing applies, steps numbered
 * consecutively, replicas all-reduce in the same order), and the errors. The analysis
 * (versions alive, last readers, units in flight, slots) against hand counts, its errors,
 * and on random plans of every kind against the runtime's former weight-store walk and a
 * brute-force restatement of the liveness rule. Deadlock freedom and timing are checked by
 * test_sim. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "schedule.h"

/* A plan with n stages, replicas rep[i] (ranks consecutive), one layer per stage. */
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
        st->replicas = rep[i];
        st->ranks = malloc((size_t)rep[i] * sizeof(int));
        for (int j = 0; j < rep[i]; j++) st->ranks[j] = rank++;
    }
    p->n_workers = rank;
    p->noam = (rank + rep[0] - 1) / rep[0];
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
    int rc = sched_build(p, &o, s, &err);
    if (rc) fail_msg("sched_build: %s", err.msg);
}

static void full_line(const Schedule *s, int rank, int with_v, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < s->workers[rank].n; i++) {
        char t[48];
        sched_instr_str(&s->workers[rank].ins[i], with_v, t, sizeof t);
        k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? " " : "", t);
    }
}

static void expect_line(const Schedule *s, int rank, const char *want) {
    char buf[4096];
    sched_worker_str(s, rank, buf, sizeof buf);
    if (strcmp(buf, want)) fail_msg("worker %d:\n got  %s\n want %s", rank, buf, want);
}

static void expect_full(const Schedule *s, int rank, int with_v, const char *want) {
    char buf[8192];
    full_line(s, rank, with_v, buf, sizeof buf);
    if (strcmp(buf, want)) fail_msg("worker %d:\n got  %s\n want %s", rank, buf, want);
}

static void test_1f1b_straight(void **state) {
    (void)state;
    int rep[4] = {1, 1, 1, 1};
    Plan *p = make_plan(4, rep);
    Schedule s;
    build(p, SCHED_1F1B, 8, 1, 0, &s);
    assert_int_equal(s.stages[0].warmup, 4);   /* NOAM */
    assert_int_equal(s.stages[3].warmup, 1);
    expect_line(&s, 0, "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
    expect_line(&s, 1, "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
    expect_line(&s, 3, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
    /* weight stashing: the backward reads its forward's version; forwards read the newest */
    char buf[4096];
    full_line(&s, 0, 1, buf, sizeof buf);
    assert_non_null(strstr(buf, "F0@0 SA0>1 F1@0 SA1>1 F2@0 SA2>1 F3@0 SA3>1 RG0<1 B0@0 U1 F4@1 SA4>1 RG1<1 B1@0 U2 F5@2"));
    assert_non_null(strstr(buf, "RG7<1 B7@4 U8"));
    expect_full(&s, 3, 1,
                "RA0<2 F0@0 B0@0 SG0>2 U1 RA1<2 F1@1 B1@1 SG1>2 U2 RA2<2 F2@2 B2@2 SG2>2 U3 RA3<2 F3@3 B3@3 SG3>2 U4 "
                "RA4<2 F4@4 B4@4 SG4>2 U5 RA5<2 F5@5 B5@5 SG5>2 U6 RA6<2 F6@6 B6@6 SG6>2 U7 RA7<2 F7@7 B7@7 SG7>2 U8");
    sched_release(&s);

    /* vertical sync: every stage reads the version the input stage read */
    build(p, SCHED_1F1B, 10, 1, 1, &s);
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < s.workers[r].n; i++) {
            const Instr *in = &s.workers[r].ins[i];
            if (in->op == OP_FORWARD || in->op == OP_BACKWARD) {
                int want = in->mb - 4 + 1 > 0 ? in->mb - 4 + 1 : 0;   /* stage 0: F(t) after B(t-4) */
                assert_int_equal(in->version, want);
            }
        }
    sched_release(&s);
    free_plan(p);
}

static void test_1f1b_round_robin(void **state) {
    (void)state;
    int rep[2] = {1, 2};   /* rank 0 | ranks 1, 2 */
    Plan *p = make_plan(2, rep);
    Schedule s;
    build(p, SCHED_1F1B, 5, 1, 0, &s);
    assert_int_equal(s.stages[0].warmup, 3);   /* NOAM = ceil(3 / 1) */
    assert_int_equal(s.stages[1].warmup, 1);   /* ceil(2 / 2) */
    expect_full(&s, 0, 0,
                "F0 SA0>1 F1 SA1>2 F2 SA2>1 RG0<1 B0 U1 F3 SA3>2 RG1<2 B1 U2 F4 SA4>1 RG2<1 B2 U3 RG3<2 B3 U4 RG4<1 B4 U5");
    /* replica 0 of stage 1 runs units 0, 2, 4; replica 1 units 1, 3 and joins round 3 with nothing */
    expect_full(&s, 1, 1,
                "RA0<0 F0@0 B0@0 SG0>0 AR(s1) U1 RA2<0 F2@1 B2@1 SG2>0 AR(s1) U2 RA4<0 F4@2 B4@2 SG4>0 AR(s1) U3");
    expect_full(&s, 2, 1, "RA1<0 F1@0 B1@0 SG1>0 AR(s1) U1 RA3<0 F3@1 B3@1 SG3>0 AR(s1) U2 AR(s1) U3");
    sched_release(&s);
    free_plan(p);

    int rep2[2] = {2, 1};   /* ranks 0, 1 | rank 2: NOAM = ceil(3 / 2) = 2 */
    p = make_plan(2, rep2);
    build(p, SCHED_1F1B, 6, 1, 0, &s);
    assert_int_equal(s.stages[0].warmup, 2);
    expect_line(&s, 0, "F0 F2 B0 F4 B2 B4");
    expect_line(&s, 1, "F1 F3 B1 F5 B3 B5");
    expect_line(&s, 2, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
    sched_release(&s);
    free_plan(p);
}

static void test_gpipe_flush_2bw(void **state) {
    (void)state;
    int rep[2] = {1, 1};
    Plan *p = make_plan(2, rep);
    Schedule s;
    build(p, SCHED_GPIPE, 2, 3, 0, &s);
    expect_line(&s, 0, "F0 F1 F2 B0 B1 B2 F3 F4 F5 B3 B4 B5");
    expect_full(&s, 1, 1,
                "RA0<0 F0@0 RA1<0 F1@0 RA2<0 F2@0 B0@0 SG0>0 B1@0 SG1>0 B2@0 SG2>0 U1 FLUSH "
                "RA3<0 F3@1 RA4<0 F4@1 RA5<0 F5@1 B3@1 SG3>0 B4@1 SG4>0 B5@1 SG5>0 U2 FLUSH");
    sched_release(&s);

    build(p, SCHED_1F1B_FLUSH, 2, 4, 0, &s);
    expect_line(&s, 0, "F0 F1 B0 F2 B1 F3 B2 B3 F4 F5 B4 F6 B5 F7 B6 B7");
    expect_line(&s, 1, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
    sched_release(&s);

    /* 2bw: minibatch k reads version max(k - 1, 0); steps after the last backward of k */
    build(p, SCHED_2BW, 3, 2, 0, &s);
    expect_full(&s, 0, 1,
                "F0@0 SA0>1 F1@0 SA1>1 RG0<1 B0@0 F2@0 SA2>1 RG1<1 B1@0 U1 F3@0 SA3>1 RG2<1 B2@0 F4@1 SA4>1 "
                "RG3<1 B3@0 U2 F5@1 SA5>1 RG4<1 B4@1 RG5<1 B5@1 U3");
    sched_release(&s);

    /* 1f1b with 2 micro-batches: 2bw's order and steps, but a forward reads the newest
     * version (F3 after U1 reads 1, where 2bw's reads 0) */
    build(p, SCHED_1F1B, 3, 2, 0, &s);
    expect_full(&s, 0, 1,
                "F0@0 SA0>1 F1@0 SA1>1 RG0<1 B0@0 F2@0 SA2>1 RG1<1 B1@0 U1 F3@1 SA3>1 RG2<1 B2@0 F4@1 SA4>1 "
                "RG3<1 B3@1 U2 F5@2 SA5>1 RG4<1 B4@1 RG5<1 B5@2 U3");
    expect_full(&s, 1, 1,
                "RA0<0 F0@0 B0@0 SG0>0 RA1<0 F1@0 B1@0 SG1>0 U1 RA2<0 F2@1 B2@1 SG2>0 RA3<0 F3@1 B3@1 SG3>0 U2 "
                "RA4<0 F4@2 B4@2 SG4>0 RA5<0 F5@2 B5@2 SG5>0 U3");
    sched_release(&s);
    free_plan(p);
}

static void test_dp_mp(void **state) {
    (void)state;
    int rep[2] = {2, 1};
    Plan *p = make_plan(2, rep);
    Schedule s;
    build(p, SCHED_DP, 5, 1, 0, &s);
    assert_int_equal(s.n_stages, 1);
    assert_int_equal(s.stages[0].n_layers, 2);
    assert_int_equal(s.stages[0].replicas, 3);
    expect_full(&s, 0, 1, "F0@0 B0@0 AR(s0) U1 F3@1 B3@1 AR(s0) U2");
    expect_full(&s, 2, 1, "F2@0 B2@0 AR(s0) U1 AR(s0) U2");
    sched_release(&s);

    build(p, SCHED_MP, 3, 1, 0, &s);
    expect_full(&s, 0, 1, "F0@0 SA0>2 RG0<2 B0@0 U1 F1@1 SA1>2 RG1<2 B1@1 U2 F2@2 SA2>2 RG2<2 B2@2 U3");
    assert_int_equal(s.workers[1].n, 0);   /* replica 1 idle */
    assert_int_equal(s.workers[1].stage, -1);
    sched_release(&s);
    free_plan(p);
}

static void test_errors(void **state) {
    (void)state;
    int rep[4] = {1, 1, 1, 1};
    Plan *p = make_plan(4, rep);
    Schedule s;
    Err err = {0};
    SchedOpts o = {SCHED_DP, 4, 2, 0, 0, 0};
    assert_int_equal(sched_build(p, &o, &s, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "micro-batches"));
    o = (SchedOpts){SCHED_1F1B, 4, 2, 1, 0, 0};   /* vertical sync runs one unit per minibatch */
    assert_int_equal(sched_build(p, &o, &s, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "vertical sync"));
    o = (SchedOpts){SCHED_GPIPE, 4, 2, 1, 0, 0};
    assert_int_equal(sched_build(p, &o, &s, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "vertical sync"));
    o = (SchedOpts){SCHED_2BW, 6, 1, 0, 0, 0};   /* 4 stages need more micro-batches per minibatch */
    assert_int_equal(sched_build(p, &o, &s, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "2bw"));
    o = (SchedOpts){SCHED_2BW, 6, 3, 0, 0, 0};   /* warm-up 4 <= micro-batches + 1: fine */
    assert_int_equal(sched_build(p, &o, &s, &err), PD_OK);
    sched_release(&s);
    o = (SchedOpts){SCHED_GPIPE, 0, 1, 0, 0, 0};
    assert_int_equal(sched_build(p, &o, &s, &err), PD_EINVAL);
    p->stages[2].ranks[0] = 1;   /* rank 1 in two stages */
    o = (SchedOpts){SCHED_GPIPE, 2, 2, 0, 0, 0};
    assert_int_equal(sched_build(p, &o, &s, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "rank 1"));
    free_plan(p);
    SchedKind k;
    for (int i = 0; i < SCHED_COUNT; i++) {
        assert_int_equal(sched_kind_parse(sched_kind_name((SchedKind)i), &k), PD_OK);
        assert_int_equal(k, i);
    }
    assert_int_equal(sched_kind_parse("pipedream", &k), PD_EINVAL);
}

/* The stage a worker's instruction is for, by the worker's stage list. */
static int stage_of(const SchedWorker *w, const Instr *in) {
    assert_true(in->chunk >= 0 && in->chunk < (w->n_chunks > 0 ? w->n_chunks : 1));
    return w->stages ? w->stages[in->chunk] : w->stage;
}

/* The worker that runs stage st's unit u (every (stage, unit) is run by one worker). */
static int peer_stage(const Schedule *s, int peer, int want) {
    const SchedWorker *w = &s->workers[peer];
    for (int c = 0; c < w->n_chunks; c++)
        if (w->stages[c] == want) return want;
    return w->stage;
}

/* The kinds the random tests build on plans of one stage per rank (interleaved needs several
 * stages per worker: test_schedule_kinds.c, test_sim.c; asp is tested with its runtime). */
static const int KINDS[] = {SCHED_1F1B, SCHED_GPIPE, SCHED_1F1B_FLUSH, SCHED_2BW, SCHED_DP, SCHED_MP, SCHED_ZB_H1, SCHED_ZB_H2};
enum { N_KINDS = sizeof KINDS / sizeof KINDS[0] };

/* Structural invariants of any schedule, checked from the lists alone: every (stage, unit)
 * has one forward and one backward (B, or BI then BW for the zb kinds) on one worker, with
 * the forward's version (stashing), a recompute (R) only between them with that version;
 * sends match receives one to one between the right stages; steps numbered consecutively
 * and replicas all-reduce in the same order. */
static void check_structure(const Schedule *s) {
    int S = s->n_stages, U = s->n_units;
    int zb = s->kind == SCHED_ZB_H1 || s->kind == SCHED_ZB_H2;
    int *fwd_at = calloc((size_t)S * U, sizeof(int));    /* forwards of (stage, unit) */
    int *fwd_rank = malloc((size_t)S * U * sizeof(int));
    int *fwd_ver = malloc((size_t)S * U * sizeof(int));
    int *bwd_at = calloc((size_t)S * U, sizeof(int));
    int *w_at = calloc((size_t)S * U, sizeof(int));      /* BW of (stage, unit) */
    int *rec_at = calloc((size_t)S * U, sizeof(int));    /* R of (stage, unit) */
    int *sends = calloc((size_t)S * U * 2, sizeof(int)); /* (stage boundary, unit, kind) */
    int *recvs = calloc((size_t)S * U * 2, sizeof(int));
    for (int r = 0; r < s->n_ranks; r++) {
        const SchedWorker *w = &s->workers[r];
        int steps = 0, ars = 0;
        for (int i = 0; i < w->n; i++) {
            const Instr *in = &w->ins[i];
            int st = stage_of(w, in);
            size_t x = (size_t)st * U + (size_t)(in->mb >= 0 ? in->mb : 0);
            switch (in->op) {
            case OP_FORWARD:
                assert_true(in->mb >= 0 && in->mb < U);
                fwd_at[x]++;
                fwd_rank[x] = r;
                fwd_ver[x] = in->version;
                assert_true(in->version >= 0 && in->version <= steps);
                if (s->kind != SCHED_1F1B && s->kind != SCHED_2BW) assert_int_equal(in->version, steps);
                break;
            case OP_RECOMPUTE:
                assert_true(s->recompute);
                assert_int_equal(fwd_at[x], 1);
                assert_int_equal(bwd_at[x], 0);
                assert_int_equal(fwd_rank[x], r);
                assert_int_equal(fwd_ver[x], in->version);
                rec_at[x]++;
                break;
            case OP_BACKWARD:
            case OP_BACKWARD_B:
                assert_int_equal(in->op == OP_BACKWARD_B, zb);
                assert_int_equal(fwd_at[x], 1);   /* after its forward */
                assert_int_equal(fwd_rank[x], r);
                assert_int_equal(fwd_ver[x], in->version);   /* stashing */
                bwd_at[x]++;
                break;
            case OP_BACKWARD_W:
                assert_true(zb);
                assert_int_equal(bwd_at[x], 1);   /* after its BI, same worker and version */
                assert_int_equal(fwd_rank[x], r);
                assert_int_equal(fwd_ver[x], in->version);
                w_at[x]++;
                break;
            case OP_SEND_ACT:
                assert_int_equal(peer_stage(s, in->peer, st + 1), st + 1);
                sends[x * 2]++;
                break;
            case OP_RECV_ACT:
                assert_int_equal(peer_stage(s, in->peer, st - 1), st - 1);
                recvs[(x - (size_t)U) * 2]++;
                break;
            case OP_SEND_GRAD:
                assert_int_equal(peer_stage(s, in->peer, st - 1), st - 1);
                sends[(x - (size_t)U) * 2 + 1]++;
                break;
            case OP_RECV_GRAD:
                assert_int_equal(peer_stage(s, in->peer, st + 1), st + 1);
                recvs[x * 2 + 1]++;
                break;
            case OP_ALLREDUCE:
                assert_int_equal(in->peer, st);
                assert_int_equal(in->version, steps + 1);
                ars++;
                break;
            case OP_STEP: assert_int_equal(in->version, ++steps); break;
            default: break;
            }
        }
        if (w->stage >= 0) {
            const SchedStage *g = &s->stages[w->stage];
            int flush = sched_splits_minibatch(s->kind, s->n_micro);   /* a step per minibatch */
            int want = flush ? s->n_minibatches : (U + g->replicas - 1) / g->replicas;
            assert_int_equal(steps, want);
            assert_int_equal(ars, g->replicas > 1 ? want * w->n_chunks : 0);
        }
    }
    for (int st = 0; st < S; st++)
        for (int u = 0; u < U; u++) {
            assert_int_equal(fwd_at[st * U + u], 1);
            assert_int_equal(bwd_at[st * U + u], 1);
            assert_int_equal(w_at[st * U + u], zb);
            assert_true(rec_at[st * U + u] <= s->recompute);
            if (st < S - 1)
                for (int k = 0; k < 2; k++) {
                    assert_int_equal(sends[(st * U + u) * 2 + k], 1);
                    assert_int_equal(recvs[(st * U + u) * 2 + k], 1);
                }
        }
    free(fwd_at), free(fwd_rank), free(fwd_ver), free(bwd_at), free(w_at), free(rec_at), free(sends), free(recvs);
}

static void test_random_structure(void **state) {
    (void)state;
    Rng rng;
    rng_init(&rng, 7, 100, 0);
    for (int trial = 0; trial < 150; trial++) {
        int S = 1 + (int)rng_below(&rng, 16), rep[16];
        for (int i = 0; i < S; i++) rep[i] = 1 + (int)rng_below(&rng, 4);
        Plan *p = make_plan(S, rep);
        int N = 1 + (int)rng_below(&rng, 64);
        for (int kk = 0; kk < N_KINDS; kk++) {
            int k = KINDS[kk], M = 1;
            if (k == SCHED_GPIPE || k == SCHED_1F1B_FLUSH || k == SCHED_ZB_H1 || k == SCHED_ZB_H2)
                M = 1 + (int)rng_below(&rng, 8);
            if (k == SCHED_2BW) M = p->n_workers + (int)rng_below(&rng, 3);
            if (k == SCHED_1F1B && rng_below(&rng, 2)) M = 2 + (int)rng_below(&rng, 7);
            for (int rc = 0; rc < 2; rc++) {
                SchedOpts o = {(SchedKind)k, N, M, 0, rc, 0};
                Schedule s;
                Err err = {0};
                if (sched_build(p, &o, &s, &err)) fail_msg("sched_build: %s", err.msg);
                check_structure(&s);
                sched_release(&s);
            }
        }
        /* vertical sync: stage s reads floor(v0 * r_0 / r_s) where v0 is what the input
         * stage's list reads for the same minibatch */
        SchedOpts o = {SCHED_1F1B, N, 1, 1, 0, 0};
        Schedule s;
        Err err = {0};
        if (sched_build(p, &o, &s, &err) == PD_OK) {
            check_structure(&s);
            int *v0 = malloc((size_t)N * sizeof(int));
            for (int r = 0; r < s.n_ranks; r++)
                for (int i = 0; r < s.n_ranks && s.workers[r].stage == 0 && i < s.workers[r].n; i++)
                    if (s.workers[r].ins[i].op == OP_FORWARD) v0[s.workers[r].ins[i].mb] = s.workers[r].ins[i].version;
            for (int r = 0; r < s.n_ranks; r++) {
                int st = s.workers[r].stage;
                for (int i = 0; i < s.workers[r].n; i++) {
                    const Instr *in = &s.workers[r].ins[i];
                    if (in->op != OP_FORWARD) continue;
                    assert_int_equal(in->version, v0[in->mb] * s.stages[0].replicas / s.stages[st].replicas);
                }
            }
            free(v0);
            sched_release(&s);
        } else {
            assert_non_null(strstr(err.msg, "vertical sync"));
        }
        free_plan(p);
    }
}

/* ---- analysis ---------------------------------------------------------------------- */

/* The maxima of the per-instruction counts are the info's. */
static void check_counts(const Schedule *s, int r, const SchedWorkerInfo *wi) {
    if (s->workers[r].stage < 0) {   /* idle: nothing */
        assert_int_equal(wi->max_versions_alive + wi->max_inflight + wi->n_slots + wi->n_versions, 0);
        return;
    }
    int n = s->workers[r].n;
    int *alive = malloc(((size_t)n + 1) * sizeof(int)), *fly = malloc(((size_t)n + 1) * sizeof(int));
    sched_worker_counts(s, r, wi, alive, fly);
    int ma = n ? 0 : 1, at = -1, mf = 0;
    for (int i = 0; i < n; i++) {
        if (alive[i] > ma) ma = alive[i], at = i;
        if (fly[i] > mf) mf = fly[i];
    }
    assert_int_equal(ma, wi->max_versions_alive);
    assert_int_equal(at, wi->peak_at);
    assert_int_equal(mf, wi->max_inflight);
    free(alive), free(fly);
}

static void test_analysis(void **state) {
    (void)state;
    int rep1[4] = {1, 1, 1, 1};
    Plan *p = make_plan(4, rep1);
    Schedule s;
    SchedAnalysis a;
    Err err = {0};
    build(p, SCHED_1F1B, 8, 1, 0, &s);
    assert_int_equal(sched_analyze(&s, &a, &err), PD_OK);
    assert_int_equal(a.n_ranks, 4);
    for (int r = 0; r < 4; r++) {
        const SchedWorkerInfo *wi = &a.workers[r];
        assert_int_equal(wi->stage, r);
        assert_int_equal(wi->reads_input, r == 0);
        assert_int_equal(wi->n_versions, 9);   /* 8 steps */
        assert_int_equal(wi->max_versions_alive, 4 - r);   /* = warm-up */
        assert_int_equal(wi->max_inflight, 4 - r);
        assert_int_equal(wi->n_slots, 4 - r + SCHED_SLOTS_AHEAD);
        assert_int_equal(a.stage_versions[r], 4 - r);
        check_counts(&s, r, wi);
    }
    /* worker 0: F0 SA0 F1 SA1 F2 SA2 F3 SA3 RG0 B0 U1 F4 SA4 RG1 B1 U2 F5 SA5 RG2 B2 U3: at
     * U3 (index 20) versions 0..2 are still read by B3..B5: 4 alive */
    assert_int_equal(a.workers[0].peak_at, 20);
    assert_int_equal(s.workers[0].ins[20].op, OP_STEP);
    /* last stage: RA F B SG U per unit, forward i reads version i: read last by B_i */
    for (int v = 0; v < 8; v++) assert_int_equal(a.workers[3].last_read[v], 5 * v + 2);
    assert_int_equal(a.workers[3].last_read[8], -1);   /* written by the last step, never read */
    assert_int_equal(a.workers[3].peak_at, 0);
    sched_analysis_release(&a);
    sched_release(&s);
    /* gpipe: one version, all of a minibatch's micro-batches in flight */
    build(p, SCHED_GPIPE, 2, 3, 0, &s);
    assert_int_equal(sched_analyze(&s, &a, &err), PD_OK);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(a.workers[r].max_versions_alive, 1);
        assert_int_equal(a.workers[r].max_inflight, 3);
        assert_int_equal(a.workers[r].n_versions, 3);
        assert_int_equal(a.workers[r].last_read[2], -1);
        check_counts(&s, r, &a.workers[r]);
    }
    sched_analysis_release(&a);
    sched_release(&s);
    /* 2bw: two versions everywhere (minibatch k + 1 reads version k after the step to k + 1) */
    build(p, SCHED_2BW, 5, 4, 0, &s);
    assert_int_equal(sched_analyze(&s, &a, &err), PD_OK);
    for (int r = 0; r < 4; r++) assert_int_equal(a.workers[r].max_versions_alive, 2);
    sched_analysis_release(&a);
    sched_release(&s);
    free_plan(p);
    /* dp: every rank reads input; model-parallel: replicas beyond the first are idle */
    int rep2[2] = {2, 1};
    p = make_plan(2, rep2);
    build(p, SCHED_DP, 4, 1, 0, &s);
    assert_int_equal(sched_analyze(&s, &a, &err), PD_OK);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(a.workers[r].reads_input, 1);
        assert_int_equal(a.workers[r].max_versions_alive, 1);
        assert_int_equal(a.workers[r].max_inflight, 1);
    }
    sched_analysis_release(&a);
    sched_release(&s);
    build(p, SCHED_MP, 4, 1, 0, &s);
    assert_int_equal(sched_analyze(&s, &a, &err), PD_OK);
    assert_int_equal(a.workers[1].stage, -1);
    assert_int_equal(a.workers[1].n_slots, 0);
    assert_int_equal(a.workers[1].max_versions_alive, 0);
    assert_null(a.workers[1].last_read);
    assert_int_equal(a.workers[0].reads_input, 1);
    assert_int_equal(a.workers[2].reads_input, 0);
    check_counts(&s, 1, &a.workers[1]);
    sched_analysis_release(&a);
    sched_release(&s);
    free_plan(p);
}

/* A one-worker schedule with the given (op, mb, version) triples, released with sched_release. */
static void one_worker(Schedule *s, int n, const int (*ins)[3]) {
    int rep[1] = {1};
    Plan *p = make_plan(1, rep);
    build(p, SCHED_DP, 1, 1, 0, s);
    free_plan(p);
    SchedWorker *w = &s->workers[0];
    PD_ASSERT(w->cap >= n);
    w->n = n;
    for (int i = 0; i < n; i++) w->ins[i] = (Instr){ins[i][0], ins[i][1], -1, ins[i][2], 0};
}

static void test_analysis_errors(void **state) {
    (void)state;
    Schedule s;
    SchedAnalysis a;
    Err err = {0};
    const int skip[][3] = {{OP_FORWARD, 0, 0}, {OP_BACKWARD, 0, 0}, {OP_STEP, -1, 2}};
    one_worker(&s, 3, skip);
    assert_int_equal(sched_analyze(&s, &a, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "worker 0 instruction 2 (U2): step writes version 2 after version 0"));
    assert_null(a.workers);
    sched_release(&s);
    const int future[][3] = {{OP_FORWARD, 0, 0}, {OP_STEP, -1, 1}, {OP_FORWARD, 1, 2}};
    one_worker(&s, 3, future);
    assert_int_equal(sched_analyze(&s, &a, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "worker 0 instruction 2 (F1@2): reads weight version 2 but has 1"));
    sched_release(&s);
    const int negative[][3] = {{OP_FORWARD, 0, 0}, {OP_BACKWARD, 0, -1}};
    one_worker(&s, 2, negative);
    SchedWorkerInfo wi;
    assert_int_equal(sched_analyze_worker(&s, 0, &wi, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "instruction 1 (B0@-1): reads weight version -1"));
    assert_null(wi.last_read);
    sched_release(&s);
    /* an update in place, then a stash: F0@0 U1 F1@1 U2 B1@1 -> version 1 stashed at U2 */
    const int stash[][3] = {{OP_FORWARD, 0, 0}, {OP_STEP, -1, 1}, {OP_FORWARD, 1, 1}, {OP_STEP, -1, 2}, {OP_BACKWARD, 1, 1}};
    one_worker(&s, 5, stash);
    assert_int_equal(sched_analyze_worker(&s, 0, &wi, &err), PD_OK);
    assert_int_equal(wi.n_versions, 3);
    assert_int_equal(wi.last_read[0], 0);
    assert_int_equal(wi.last_read[1], 4);
    assert_int_equal(wi.max_versions_alive, 2);
    assert_int_equal(wi.peak_at, 3);
    assert_int_equal(wi.max_inflight, 2);
    int alive[5], fly[5];
    sched_worker_counts(&s, 0, &wi, alive, fly);
    const int want_alive[5] = {1, 1, 1, 2, 2}, want_fly[5] = {1, 1, 2, 2, 2};
    assert_memory_equal(alive, want_alive, sizeof alive);
    assert_memory_equal(fly, want_fly, sizeof fly);
    sched_worker_info_release(&wi);
    sched_release(&s);
}

/* The runtime's weight store before the analysis existed (O(instructions x versions)): the
 * oracle for max_versions_alive. */
static int store_oracle(const SchedWorker *sw) {
    int maxv = 0;
    for (int i = 0; i < sw->n; i++)
        if (sw->ins[i].version > maxv) maxv = sw->ins[i].version;
    int nv = maxv + 1, *last = malloc((size_t)nv * sizeof(int));
    for (int v = 0; v < nv; v++) last[v] = -1;
    for (int i = 0; i < sw->n; i++)
        if (sched_op_computes(sw->ins[i].op)) last[sw->ins[i].version] = i;   /* F, B, and BI, BW, R */
    char *alive = calloc((size_t)nv, 1);
    alive[0] = 1;
    int n_alive = 1, most = 1, newest = 0;
    for (int i = 0; i < sw->n; i++) {
        const Instr *in = &sw->ins[i];
        if (in->op == OP_STEP) {
            if (last[newest] > i) n_alive++;
            else alive[newest] = 0;
            alive[in->version] = 1;
            newest = in->version;
        }
        if (n_alive > most) most = n_alive;
        for (int v = 0; v < newest; v++)
            if (alive[v] && last[v] <= i) alive[v] = 0, n_alive--;
    }
    free(alive), free(last);
    return most;
}

static void test_analysis_random(void **state) {
    (void)state;
    Rng rng;
    rng_init(&rng, 8, 100, 0);
    for (int trial = 0; trial < 120; trial++) {
        int S = 1 + (int)rng_below(&rng, 12), rep[16];
        for (int i = 0; i < S; i++) rep[i] = 1 + (int)rng_below(&rng, 4);
        Plan *p = make_plan(S, rep);
        int N = 1 + (int)rng_below(&rng, 40);
        for (int kk = 0; kk <= N_KINDS; kk++) {   /* N_KINDS: 1f1b with vertical sync */
            int k = kk < N_KINDS ? KINDS[kk] : SCHED_COUNT, M = 1, vs = kk == N_KINDS;
            SchedKind kind = vs ? SCHED_1F1B : (SchedKind)k;
            if (k == SCHED_GPIPE || k == SCHED_1F1B_FLUSH || k == SCHED_ZB_H1 || k == SCHED_ZB_H2)
                M = 1 + (int)rng_below(&rng, 8);
            if (k == SCHED_2BW) M = p->n_workers + (int)rng_below(&rng, 3);
            if (k == SCHED_1F1B && rng_below(&rng, 2)) M = 2 + (int)rng_below(&rng, 7);
            SchedOpts o = {kind, N, M, vs, !vs && rng_below(&rng, 2), 0};
            Schedule s;
            SchedAnalysis a;
            Err err = {0};
            if (sched_build(p, &o, &s, &err)) continue;   /* vertical sync out of reach */
            assert_int_equal(sched_analyze(&s, &a, &err), PD_OK);
            for (int r = 0; r < s.n_ranks; r++) {
                const SchedWorker *w = &s.workers[r];
                const SchedWorkerInfo *wi = &a.workers[r];
                if (w->stage < 0) continue;
                assert_int_equal(wi->max_versions_alive, store_oracle(w));
                check_counts(&s, r, wi);
                /* alive at i by the definition: created at or before i, and before the next
                 * step or not after its last reader */
                int *created = malloc(((size_t)wi->n_versions + 1) * sizeof(int));
                int *alive = malloc(((size_t)w->n + 1) * sizeof(int));
                created[0] = -1;
                for (int i = 0, v = 0; i < w->n; i++)
                    if (w->ins[i].op == OP_STEP) created[++v] = i;
                created[wi->n_versions] = w->n;
                sched_worker_counts(&s, r, wi, alive, NULL);
                for (int i = 0; i < w->n; i += 1 + (int)rng_below(&rng, 4)) {
                    int n = 0;
                    for (int v = 0; v < wi->n_versions; v++)
                        n += created[v] <= i && (i < created[v + 1] || i <= wi->last_read[v]);
                    assert_int_equal(alive[i], n);
                }
                free(created), free(alive);
                /* one stashed version per warm-up forward at most (docs/explanation/schedules.md); with
                 * micro-batches a replica may also step past minibatches it has no unit of while
                 * its units in flight still read theirs, so one more */
                if (kind == SCHED_1F1B && !vs)
                    assert_true(wi->max_versions_alive <= s.stages[w->stage].warmup + (M > 1));
                if (kind == SCHED_2BW) assert_true(wi->max_versions_alive <= 2);
                if (kind != SCHED_1F1B && kind != SCHED_2BW) assert_int_equal(wi->max_versions_alive, 1);
                assert_int_equal(wi->n_slots, wi->max_inflight + SCHED_SLOTS_AHEAD);
            }
            sched_analysis_release(&a);
            sched_release(&s);
        }
        free_plan(p);
    }
}

/* The one micro-batch predicate: sched_build takes several micro-batches per minibatch exactly
 * for the kinds it names (interleaved on a plan of 4 stages on 2 ranks), and the default is one
 * per worker for those kinds, 1 for the others. */
static void test_microbatched_kinds(void **state) {
    (void)state;
    int rep[4] = {1, 1, 1, 1};
    Plan *p = make_plan(4, rep);
    for (int i = 0; i < SCHED_COUNT; i++) {
        SchedKind k = (SchedKind)i;
        int micro = sched_kind_microbatched(k), takes = sched_kind_takes_micro(k);
        assert_int_equal(micro, k == SCHED_GPIPE || k == SCHED_1F1B_FLUSH || k == SCHED_2BW || k == SCHED_ZB_H1 ||
                                    k == SCHED_ZB_H2 || k == SCHED_INTERLEAVED || sched_kind_v(k));
        assert_int_equal(takes, micro || k == SCHED_1F1B);
        int dflt = k == SCHED_DUALPIPE_V ? 8 : micro ? 4 : k == SCHED_1F1B ? SCHED_1F1B_DEFAULT_MICRO : 1;
        assert_int_equal(sched_default_micro(k, 4), dflt);
        assert_int_equal(sched_default_micro(k, 1), 1);
        /* 1f1b's default lowered to a count that divides the minibatch; the others keep theirs */
        assert_int_equal(sched_default_micro_for(k, 4, 30), k == SCHED_1F1B ? 3 : dflt);
        assert_int_equal(sched_default_micro_for(k, 4, 7), k == SCHED_1F1B ? 1 : dflt);
        if (k == SCHED_INTERLEAVED) {   /* stage i on rank i mod 2 */
            p->stages[2].ranks[0] = 0, p->stages[3].ranks[0] = 1, p->n_workers = 2;
        }
        if (sched_kind_v(k)) {   /* the V: stages 0 and 3 on rank 0, 1 and 2 on rank 1 */
            p->stages[2].ranks[0] = 1, p->stages[3].ranks[0] = 0, p->n_workers = 2;
        }
        Schedule s;
        Err err = {0};
        SchedOpts o = {k, 4, 4, 0, 0, 0};
        int rc = sched_build(p, &o, &s, &err);
        if (takes && rc) fail_msg("%s with 4 micro-batches: %s", sched_kind_name(k), err.msg);
        if (!takes) {
            assert_int_equal(rc, PD_EINVAL);
            assert_non_null(strstr(err.msg, "micro-batches apply only to 1f1b, gpipe, 1f1b-flush, 2bw, zb-h1, zb-h2, "
                                            "interleaved and the V kinds"));
        }
        sched_release(&s);
        if (k == SCHED_INTERLEAVED || sched_kind_v(k))
            p->stages[2].ranks[0] = 2, p->stages[3].ranks[0] = 3, p->n_workers = 4;
    }
    free_plan(p);
}

/* The interleaved order written out by hand (Megatron-LM's get_model_chunk_id): 2 positions,
 * 2 chunks, 4 own micro-batches. Forwards run micro-batches 0 1 on chunk 0, 0 1 on chunk 1,
 * then 2 3 likewise; backwards the same micro-batches from the last chunk down. Warm-up at
 * position r of P with V chunks: 2 (P - r - 1) + (V - 1) P, at most m V, all when m = P. */
static void test_interleaved_order(void **st) {
    (void)st;
    static const int fchunk[8] = {0, 0, 1, 1, 0, 0, 1, 1}, micro[8] = {0, 1, 0, 1, 2, 3, 2, 3};
    for (int i = 0; i < 8; i++) {
        assert_int_equal(sched_interleaved_chunk(i, 2, 2, 1), fchunk[i]);
        assert_int_equal(sched_interleaved_chunk(i, 2, 2, 0), 1 - fchunk[i]);
        assert_int_equal(sched_interleaved_micro(i, 2, 2), micro[i]);
    }
    assert_int_equal(sched_interleaved_chunk(5, 2, 3, 1), 2);   /* 3 chunks: 0 0 1 1 2 2 */
    assert_int_equal(sched_interleaved_chunk(5, 2, 3, 0), 0);
    assert_int_equal(sched_interleaved_warmup(4, 2, 0, 8), 10);
    assert_int_equal(sched_interleaved_warmup(4, 2, 3, 8), 4);
    assert_int_equal(sched_interleaved_warmup(4, 2, 0, 4), 8);   /* m = P: every forward first */
    assert_int_equal(sched_interleaved_warmup(2, 4, 0, 2), 8);
    assert_int_equal(sched_interleaved_warmup(4, 3, 0, 4), 12);
    assert_int_equal(plan_interleaved_rank(5, 2, 3, 1), 4);      /* stage 5 at position 1, replica 1 */
    assert_int_equal(plan_interleaved_rank(2, 4, 1, 0), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_microbatched_kinds),
        cmocka_unit_test(test_interleaved_order),
        cmocka_unit_test(test_analysis),        cmocka_unit_test(test_analysis_errors),
        cmocka_unit_test(test_analysis_random),
        cmocka_unit_test(test_1f1b_straight),   cmocka_unit_test(test_1f1b_round_robin),
        cmocka_unit_test(test_gpipe_flush_2bw), cmocka_unit_test(test_dp_mp),
        cmocka_unit_test(test_errors),          cmocka_unit_test(test_random_structure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
