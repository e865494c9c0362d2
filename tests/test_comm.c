/* test_comm.c: the comm module over the threads transport: the shared checks of
 * tests/mpi/comm_checks.h (ping-pong with headers, out-of-order tags, receives posted before
 * sends, header mismatches named, deadline expiry, all-reduce bitwise equal to its serial
 * reference comm_sum_serial, agree, 1000 messages in flight, bad arguments; the control
 * plane: byte round trips, channels, control vs data tags, oversize messages, timeouts
 * naming the late rank, broadcast, gather, agree_t, recovery after a late rank, group lists;
 * the ring all-reduce: exactness for every group size, outstanding all-reduces with
 * point-to-point traffic, bytes sent, a late member named, groups of one, buckets finished
 * by the progress thread while the caller computes, a member that never comes) on 4 worker
 * threads, the all-reduce checks also on 1, 2, 3 and 5, plus what only threads can show in
 * one process: a worker that ends early or aborts does not hang the others (data, control,
 * collectives, all-reduce), collective deadlines, a single rank talking to itself, the tag
 * layout for any tag space, the serial oracle; the progress modes (PD_COMM_PROGRESS: thread,
 * spin, caller, a bad value), and a progress thread that naps instead of spinning.
 * The same checks run over MPI in test_comm_mpi.c. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpi/comm_checks.h"

static void run_case(const ChkCase *k) {
    Err err = {0};
    int rcs[CHK_NRANKS];
    int rc = comm_threads_run(CHK_NRANKS, k->fn, NULL, rcs, &err);
    if (rc) fprintf(stderr, "%s: rc %d (ranks %d %d %d %d): %s\n", k->name, rc, rcs[0], rcs[1], rcs[2], rcs[3], err.msg);
    assert_int_equal(rc, PD_OK);
}

#define SHARED(name) \
    static void test_##name(void **s) { (void)s; run_case(chk_case(#name)); }
SHARED(pingpong)
SHARED(out_of_order)
SHARED(posted_first)
SHARED(mismatch)
SHARED(deadline)
SHARED(allreduce)
SHARED(agree)
SHARED(many)
SHARED(bad_args)
SHARED(ctrl_bytes)
SHARED(ctrl_channels)
SHARED(ctrl_vs_data)
SHARED(ctrl_oversize)
SHARED(ctrl_timeout)
SHARED(bcast)
SHARED(gather)
SHARED(agree_t)
SHARED(coll_timeout)
SHARED(group_lists)
SHARED(ctrl_bad_args)
SHARED(ar_exact)
SHARED(ar_outstanding)
SHARED(ar_bytes)
SHARED(ar_timeout)
SHARED(ar_single)
SHARED(ar_background)
SHARED(ar_abandon)

/* The all-reduce checks on 1, 2, 3 and 5 threads (groups of up to 5 members). */
static void test_ar_sizes(void **s) {
    (void)s;
    const char *names[7] = {"ar_exact", "ar_outstanding", "ar_bytes", "ar_timeout", "ar_single", "ar_background",
                            "ar_abandon"};
    const int ns[4] = {1, 2, 3, 5};
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 7; k++) {
            Err err = {0};
            int rcs[5] = {0};
            int rc = comm_threads_run(ns[i], chk_case(names[k])->fn, NULL, rcs, &err);
            if (rc) fprintf(stderr, "%s on %d threads: rc %d: %s\n", names[k], ns[i], rc, err.msg);
            assert_int_equal(rc, PD_OK);
        }
}

/* A member that ends without joining an all-reduce: the others (no deadline) fail at once
 * naming it, from comm_group_allreduce and from comm_ar_wait; nobody hangs. */
static int w_ar_gone(Comm *c, int rank, void *arg) {
    char *msgs = arg;
    Err err = {0};
    const int all[4] = {0, 1, 2, 3};
    CommGroup *g = NULL;
    int rc = comm_group_new(c, all, 4, &g, &err);
    if (rc) return rc;
    if (rank == 2) {
        comm_group_free(g);
        return PD_EIO;
    }
    float x[1000] = {0};
    if (rank == 0) {
        rc = comm_group_allreduce(g, x, 1000, COMM_MEAN, &err);
    } else {
        CommAr *a = NULL;
        rc = comm_group_iallreduce(g, x, 1000, COMM_MEAN, &a, &err);
        if (!rc) rc = comm_ar_wait(&a, 0, &err);
        comm_ar_cancel(&a);
    }
    snprintf(msgs + 512 * rank, 512, "%s", err.msg);
    comm_group_free(g);
    return rc;
}

static void test_ar_peer_gone(void **s) {
    (void)s;
    char msgs[CHK_NRANKS * 512] = {0};
    int rcs[CHK_NRANKS];
    Err err = {0};
    comm_threads_run(CHK_NRANKS, w_ar_gone, msgs, rcs, &err);
    for (int r = 0; r < CHK_NRANKS; r++) {
        if (r == 2) continue;
        if (rcs[r] != PD_ECOMM || !strstr(msgs + 512 * r, "rank 2 closed its endpoint"))
            fprintf(stderr, "rank %d: rc %d: %s\n", r, rcs[r], msgs + 512 * r);
        assert_int_equal(rcs[r], PD_ECOMM);
        assert_non_null(strstr(msgs + 512 * r, "rank 2 closed its endpoint"));
        assert_non_null(strstr(msgs + 512 * r, "all-reduce #0 of 1000 floats"));
    }
}

/* Rank 0 fails at once; rank 1 waits (no deadline) for a message from it, ranks 2 and 3
 * for a barrier it never joins: all fail with PD_ECOMM naming rank 0 instead of hanging. */
static int w_early_exit(Comm *c, int rank, void *arg) {
    char *msgs = arg;
    Err err = {0};
    if (rank == 0) return PD_EIO;
    int rc;
    if (rank == 1) {
        float y[3];
        CommReq *rq = NULL;
        rc = comm_irecv(c, 0, COMM_ACT, 5, shape1(3), y, &rq, &err);
        if (!rc) rc = comm_wait(c, &rq, 0, NULL, &err);
        comm_cancel(c, &rq);
    } else {
        rc = comm_barrier(c, &err);
    }
    snprintf(msgs + 512 * rank, 512, "%s", err.msg);
    return rc;
}

static void test_early_exit_codes(void **s) {
    (void)s;
    char msgs[CHK_NRANKS * 512] = {0};
    int rcs[CHK_NRANKS];
    Err err = {0};
    int rc = comm_threads_run(CHK_NRANKS, w_early_exit, msgs, rcs, &err);
    assert_int_equal(rc, PD_ECOMM);   /* the max of the codes: PD_ECOMM > PD_EIO */
    assert_int_equal(rcs[0], PD_EIO);
    for (int r = 1; r < CHK_NRANKS; r++) {
        assert_int_equal(rcs[r], PD_ECOMM);
        if (!strstr(msgs + 512 * r, "rank 0")) fprintf(stderr, "rank %d: %s\n", r, msgs + 512 * r);
        assert_non_null(strstr(msgs + 512 * r, "rank 0"));
    }
    assert_non_null(strstr(msgs + 512 * 1, "activation of minibatch 5"));
    assert_non_null(strstr(msgs + 512 * 2, "without joining"));
}

/* Rank 2 aborts after a barrier; the others are blocked (no deadline) in a receive, a
 * barrier and an all-reduce: each gets PD_ECOMM "aborted by rank 2 (code 7): boom". */
static int w_abort(Comm *c, int rank, void *arg) {
    char *msgs = arg;
    Err err = {0};
    int rc = comm_barrier(c, &err);
    if (rc) return rc;
    const int all[4] = {0, 1, 2, 3};
    CommGroup *g = NULL;
    rc = comm_group_new(c, all, 4, &g, &err);
    if (rc) return rc;
    if (rank == 2) {
        nanosleep(&(struct timespec){0, 20000000}, NULL);
        comm_abort(c, 7, "boom");
        comm_group_free(g);
        return PD_OK;
    }
    if (rank == 0) {
        float y[1];
        CommReq *rq = NULL;
        rc = comm_irecv(c, 1, COMM_GRAD, 0, shape1(1), y, &rq, &err);
        if (!rc) rc = comm_wait(c, &rq, 0, NULL, &err);
        comm_cancel(c, &rq);
    } else if (rank == 1) {
        float x[5] = {0};
        rc = comm_group_allreduce(g, x, 5, COMM_SUM, &err);
    } else {
        rc = comm_barrier(c, &err);
    }
    comm_group_free(g);
    snprintf(msgs + 512 * rank, 512, "%s", err.msg);
    return rc;
}

static void test_abort_wakes_everyone(void **s) {
    (void)s;
    char msgs[CHK_NRANKS * 512] = {0};
    int rcs[CHK_NRANKS];
    Err err = {0};
    comm_threads_run(CHK_NRANKS, w_abort, msgs, rcs, &err);
    assert_int_equal(rcs[2], PD_OK);
    for (int r = 0; r < CHK_NRANKS; r++) {
        if (r == 2) continue;
        assert_int_equal(rcs[r], PD_ECOMM);
        if (!strstr(msgs + 512 * r, "aborted by rank 2 (code 7): boom")) fprintf(stderr, "rank %d: %s\n", r, msgs + 512 * r);
        assert_non_null(strstr(msgs + 512 * r, "aborted by rank 2 (code 7): boom"));
    }
}

/* With a collective deadline of 0.2 s, ranks 0-2 in a barrier that rank 3 does not join
 * (it waits for rank 0's message, sent after rank 0's barrier failed) time out. */
static int w_coll_timeout(Comm *c, int rank, void *arg) {
    double *dt = arg;
    Err err = {0};
    comm_set_coll_timeout(c, 0.2);
    CommReq *rq = NULL;
    float v[1] = {1};
    if (rank == 3) {
        int rc = comm_irecv(c, 0, COMM_CTRL, 0, shape1(1), v, &rq, &err);
        if (!rc) rc = comm_wait(c, &rq, 10, NULL, &err);
        return rc;
    }
    double t0 = pd_now();
    int rc = comm_barrier(c, &err);
    dt[rank] = pd_now() - t0;
    if (rc != PD_ECOMM) return PD_EINVAL;
    if (rank == 0) {
        if (!strstr(err.msg, "timed out")) return PD_EINVAL;
        if (comm_isend(c, 3, COMM_CTRL, 0, 0, shape1(1), v, &rq, &err) || comm_wait(c, &rq, 10, NULL, &err))
            return PD_EIO;
    }
    return PD_OK;
}

static void test_collective_deadline(void **s) {
    (void)s;
    double dt[CHK_NRANKS] = {0};
    int rcs[CHK_NRANKS];
    Err err = {0};
    int rc = comm_threads_run(CHK_NRANKS, w_coll_timeout, dt, rcs, &err);
    assert_int_equal(rc, PD_OK);
    for (int r = 0; r < 3; r++) assert_true(dt[r] > 0.15);   /* it waited for the deadline */
}

/* One rank: messages to itself, and an all-reduce over a group of one leaves the data. */
static int w_single(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    if (rank != 0 || comm_size(c) != 1 || strcmp(comm_name(c), "threads")) return PD_EINVAL;
    float x[4] = {1, 2, 3, 4}, y[4] = {0};
    CommReq *sq = NULL, *rq = NULL;
    if (comm_isend(c, 0, COMM_ACT, 1, 3, shape2(2, 2), x, &sq, &err)) return PD_EIO;
    x[0] = 100;   /* eager copy: the send already took the data */
    if (comm_irecv(c, 0, COMM_ACT, 1, shape2(2, 2), y, &rq, &err) || comm_wait(c, &rq, 1, NULL, &err) ||
        comm_wait(c, &sq, 1, NULL, &err))
        return PD_EIO;
    if (y[0] != 1 || y[3] != 4) return PD_EINVAL;
    const int me[1] = {0};
    CommGroup *g = NULL;
    if (comm_group_new(c, me, 1, &g, &err)) return PD_EIO;
    float z[3] = {0.1f, -3.0f, 7.5f};
    int rc = comm_group_allreduce(g, z, 3, COMM_MEAN, &err);
    comm_group_free(g);
    if (rc || z[0] != 0.1f || z[1] != -3.0f || z[2] != 7.5f) return PD_EINVAL;
    /* the control plane on one rank: to itself, and collectives of one */
    unsigned char m[5] = {1, 2, 3, 4, 5}, r[5] = {0};
    size_t got = 0;
    if (comm_ctrl_send(c, 0, 9, m, 5, 1, &err) || comm_ctrl_recv(c, 0, 9, r, 5, &got, 1, &err) || got != 5 ||
        memcmp(m, r, 5))
        return PD_EIO;
    int64_t v = (int64_t)1 << 62, all[1] = {0};
    void **parts;
    size_t *sizes;
    if (comm_bcast_i64(c, 0, &v, 1, 1, &err) || v != (int64_t)1 << 62 || comm_gather_i64(c, 0, &v, 1, all, 1, &err) ||
        all[0] != v || comm_gather(c, 0, m, 0, &parts, &sizes, 1, &err) || sizes[0] != 0 || !parts[0])
        return PD_EIO;
    comm_parts_free(parts, sizes, 1);
    int who = -3;
    if (comm_agree_t(c, PD_EIO, 1, &who, &err) != PD_EIO || who != 0) return PD_EINVAL;
    return comm_agree(c, PD_EIO) == PD_EIO ? PD_OK : PD_EINVAL;
}

static void test_single_rank(void **s) {
    (void)s;
    Err err = {0};
    assert_int_equal(comm_threads_run(1, w_single, NULL, NULL, &err), PD_OK);
    Comm *eps[1];
    assert_int_equal(comm_threads_create(0, eps, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "0 endpoints"));
}

/* Rank 3 ends at once. Ranks 0-2, with no deadline, wait for it: a control receive, an
 * agree (every one says who: 3), a gather to rank 0 and a broadcast from it; each fails
 * with PD_ECOMM naming rank 3 instead of hanging. The agree's leftovers do not disturb the
 * gather. */
static int w_ctrl_gone(Comm *c, int rank, void *arg) {
    char *msgs = arg;
    Err err = {0};
    if (rank == 3) return PD_EIO;
    char *m = msgs + 2048 * rank;
    unsigned char b[4];
    int rc = comm_ctrl_recv(c, 3, 0, b, sizeof b, NULL, 0, &err);
    snprintf(m, 512, "%d %.400s", rc, err.msg);
    int who = -5;
    rc = comm_agree_t(c, PD_OK, 0, &who, &err);
    snprintf(m + 512, 512, "%d %d %.400s", rc, who, err.msg);
    int64_t v = rank, all[4];
    rc = comm_gather_i64(c, 0, &v, 1, all, 0, &err);
    snprintf(m + 1024, 512, "%d %.400s", rc, err.msg);
    rc = comm_bcast(c, 3, b, sizeof b, 0, &err);
    snprintf(m + 1536, 512, "%d %.400s", rc, err.msg);
    /* stay until all three are done (a rank that has ended is rightly named too) */
    const int three[3] = {0, 1, 2};
    CommGroup *g = NULL;
    float one[1] = {1};
    if ((rc = comm_group_new(c, three, 3, &g, &err))) return rc;
    rc = comm_group_allreduce(g, one, 1, COMM_SUM, &err);
    comm_group_free(g);
    return rc;
}

static void test_ctrl_peer_gone(void **s) {
    (void)s;
    char msgs[CHK_NRANKS * 2048] = {0};
    int rcs[CHK_NRANKS];
    Err err = {0};
    comm_threads_run(CHK_NRANKS, w_ctrl_gone, msgs, rcs, &err);
    for (int r = 0; r < 3; r++) assert_int_equal(rcs[r], PD_OK);
    for (int r = 0; r < 3; r++) {
        const char *m = msgs + 2048 * r;
        if (r == 0)
            for (int i = 0; i < 4; i++) fprintf(stderr, "rank %d [%d]: %s\n", r, i, m + 512 * i);
        char want[16];
        snprintf(want, sizeof want, "%d ", PD_ECOMM);
        assert_true(!strncmp(m, want, strlen(want)) && strstr(m, "rank 3 closed its endpoint") &&
                    strstr(m, "control channel 0"));
        snprintf(want, sizeof want, "%d 3 ", PD_ECOMM);   /* rc, who */
        assert_true(!strncmp(m + 512, want, strlen(want)) && strstr(m + 512, "rank 3"));
        if (r == 0) {   /* the root waits for rank 3; the others' parts went */
            snprintf(want, sizeof want, "%d ", PD_ECOMM);
            assert_true(!strncmp(m + 1024, want, strlen(want)) && strstr(m + 1024, "rank 3"));
        } else {
            assert_true(!strncmp(m + 1024, "0 ", 2));
        }
        snprintf(want, sizeof want, "%d ", PD_ECOMM);
        assert_true(!strncmp(m + 1536, want, strlen(want)) && strstr(m + 1536, "rank 3"));
    }
}

/* The tag layout for any tag space: data tags below the control range, the control range
 * below the all-reduce range, all within MPI_TAG_UB, for the usual (2^31 - 1), the smallest
 * MPI allows (32767) and the smallest that works. */
static void test_tag_layout(void **s) {
    (void)s;
    const int64_t ubs[4] = {2147483647, 32767, 2 * COMM_KIND_COUNT + COMM_CTRL_TAG_COUNT + COMM_AR_TAG_COUNT - 1,
                            100000};
    assert_int_equal(comm_tag_window_for_ub(ubs[0]), 1 << 20);
    assert_int_equal(comm_tag_window_for_ub(ubs[1]), 5109);   /* docs/explanation/communication.md */
    assert_int_equal(comm_tag_window_for_ub(ubs[2]), 1);
    assert_int_equal(comm_tag_window_for_ub(ubs[2] - 1), 0);
    for (int u = 0; u < 4; u++) {
        const int64_t w = comm_tag_window_for_ub(ubs[u]);
        assert_true(w >= 1);
        const int lo = comm_ctrl_tag(0, w), chi = comm_ctrl_tag(COMM_CTRL_TAG_COUNT - 1, w);
        const int alo = comm_ar_tag(0, 0, w), hi = comm_ar_tag(COMM_AR_WINDOW - 1, 1, w);
        assert_true(chi + 1 == alo && hi == alo + COMM_AR_TAG_COUNT - 1);
        assert_true(hi <= ubs[u]);
        assert_true(comm_tag_window_for_ub(ubs[u]) == (int64_t)1 << 20 || hi + 2 * COMM_KIND_COUNT > ubs[u]);
        const int64_t mbs[6] = {0, 1, w - 1, w, 7 * w + 3, (int64_t)1 << 53};
        for (int k = 0; k < COMM_KIND_COUNT; k++)
            for (int i = 0; i < 6; i++)
                for (int part = 0; part < 2; part++) {
                    int t = comm_tag((CommKind)k, mbs[i], part, w);
                    assert_true(t >= 0 && t < lo);
                }
        /* all-reduce #seq: its own pair of tags, shared only with seq +- COMM_AR_WINDOW */
        const int64_t seqs[5] = {0, 1, COMM_AR_WINDOW - 1, COMM_AR_WINDOW + 2, ((int64_t)1 << 40) + 3};
        for (int i = 0; i < 5; i++)
            for (int part = 0; part < 2; part++) {
                int t = comm_ar_tag(seqs[i], part, w);
                assert_true(t >= alo && t <= hi);
                assert_int_equal(t, comm_ar_tag(seqs[i] + COMM_AR_WINDOW, part, w));
                assert_int_equal(t, alo + 2 * (int)(seqs[i] % COMM_AR_WINDOW) + part);
            }
    }
    assert_string_equal(comm_kind_name((CommKind)COMM_CTRL_BYTES), "control message");
}

/* The serial oracle itself: the stated order matters (chunk k of n over r, summed from
 * x_{k+1} round to x_k), MEAN divides that sum, the chunk boundaries are floor(k n / r). */
static void test_sum_serial(void **s) {
    (void)s;
    /* n = 1: the element is in chunk r - 1, whose order is the plain rank order */
    const float a[1] = {1e8f}, b[1] = {1.0f}, c[1] = {-1e8f};
    const float *abc[3] = {a, b, c}, *acb[3] = {a, c, b};
    float o1[1], o2[1], o3[1];
    comm_sum_serial(abc, 3, 1, COMM_SUM, o1);   /* (1e8 + 1) - 1e8 = 0 in float */
    comm_sum_serial(acb, 3, 1, COMM_SUM, o2);   /* (1e8 - 1e8) + 1 = 1 */
    comm_sum_serial(acb, 3, 1, COMM_MEAN, o3);
    assert_true(o1[0] == 0.0f);
    assert_true(o2[0] == 1.0f);
    assert_true(o3[0] == 1.0f / 3.0f);
    /* n = 3 over 3: element k is chunk k, summed x_{k+1} + x_{k+2} + x_k: with 1e8 and -1e8
     * first and 1 last it is 1 (the plain rank order would give 0 for elements 0 and 1) */
    float x[3][3];
    for (int k = 0; k < 3; k++) {
        x[(k + 1) % 3][k] = 1e8f;
        x[(k + 2) % 3][k] = -1e8f;
        x[k][k] = 1.0f;
    }
    const float *xs[3] = {x[0], x[1], x[2]};
    float o[3];
    comm_sum_serial(xs, 3, 3, COMM_SUM, o);
    for (int k = 0; k < 3; k++) assert_true(o[k] == 1.0f);
    comm_sum_serial(xs, 3, 3, COMM_MEAN, x[1]);   /* out may alias an input */
    for (int k = 0; k < 3; k++) assert_true(x[1][k] == 1.0f / 3.0f);
    /* one member: a copy (no division, so even MEAN leaves the bits) */
    const float one[2] = {0.1f, -7.0f}, *ones[1] = {one};
    comm_sum_serial(ones, 1, 2, COMM_MEAN, o);
    assert_true(o[0] == 0.1f && o[1] == -7.0f);
    /* chunk boundaries */
    const size_t want[5] = {0, 2, 5, 7, 10};
    for (int k = 0; k <= 4; k++) assert_int_equal(comm_ar_chunk(10, 4, k), want[k]);
    assert_int_equal(comm_ar_chunk(1, 4, 3), 0);
    assert_int_equal(comm_ar_chunk(1, 4, 4), 1);
    assert_true(comm_ar_chunk(SIZE_MAX, 3, 2) == SIZE_MAX / 3 * 2);
    assert_true(comm_ar_chunk(SIZE_MAX - 1, 7, 5) == (size_t)((unsigned __int128)(SIZE_MAX - 1) * 5 / 7));
    assert_int_equal(comm_tag(COMM_GRAD, 5, 1, 1 << 20), (5 * 3 + 1) * 2 + 1);
    assert_int_equal(comm_tag(COMM_GRAD, 5 + (1 << 20), 1, 1 << 20), comm_tag(COMM_GRAD, 5, 1, 1 << 20));
}


/* ---- progress modes -------------------------------------------------------------------- */

/* The all-reduce checks under each PD_COMM_PROGRESS mode (read when the transport is made):
 * the same results whoever moves the ring; comm_ar_progress_thread says which. */
static int w_mode(Comm *c, int rank, void *arg) {
    (void)rank;
    return comm_ar_progress_thread(c) == *(int *)arg ? PD_OK : PD_EINVAL;
}

static void test_progress_modes(void **s) {
    (void)s;
    const char *modes[4] = {"caller", "spin", "thread:0", "thread:1000"};
    const int thread[4] = {0, 1, 1, 1};
    const char *names[4] = {"ar_background", "ar_outstanding", "ar_abandon", "ar_timeout"};
    for (int m = 0; m < 4; m++) {
        setenv("PD_COMM_PROGRESS", modes[m], 1);
        Err err = {0};
        int want = thread[m];
        assert_int_equal(comm_threads_run(3, w_mode, &want, NULL, &err), PD_OK);
        for (int k = 0; k < 4; k++) {
            int rc = comm_threads_run(3, chk_case(names[k])->fn, NULL, NULL, &err);
            if (rc) fprintf(stderr, "%s with PD_COMM_PROGRESS=%s: rc %d: %s\n", names[k], modes[m], rc, err.msg);
            assert_int_equal(rc, PD_OK);
        }
    }
    const char *bad[4] = {"threads", "thread:", "thread:-1", "thread:5x"};
    for (int b = 0; b < 4; b++) {
        setenv("PD_COMM_PROGRESS", bad[b], 1);
        Comm *eps[2] = {0};
        Err err = {0};
        assert_int_equal(comm_threads_create(2, eps, &err), PD_EINVAL);
        assert_non_null(strstr(err.msg, "PD_COMM_PROGRESS="));
        assert_non_null(strstr(err.msg, bad[b]));
        assert_null(eps[0]);
    }
    unsetenv("PD_COMM_PROGRESS");
    Err err = {0};
    int want = 1;   /* the default has a thread */
    assert_int_equal(comm_threads_run(2, w_mode, &want, NULL, &err), PD_OK);
}

/* Ranks 0 and 1 start an all-reduce that rank 2 joins only after 0.8 s: meanwhile nothing
 * can move, and the waiting costs next to no CPU (callers asleep in comm_ar_wait, the
 * progress threads waiting for a delivery). A spinning thread (PD_COMM_PROGRESS=spin) would
 * burn a core each: this fails then. */
typedef struct NapArg {
    double wall, cpu;
} NapArg;

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int w_ar_nap(Comm *c, int rank, void *arg) {
    NapArg *na = arg;
    Err err = {0};
    const int all[3] = {0, 1, 2};
    const size_t n = 100003;
    CommGroup *g = NULL;
    int rc = comm_group_new(c, all, 3, &g, &err);
    if (rc) return rc;
    float *x = pd_alloc_f32(n), *want = pd_alloc_f32(n);
    chk_rand(x, n, rank, 31);
    chk_expect(all, 3, n, COMM_SUM, 31, want, NULL);
    if (rank == 2) {
        struct timespec ts = {0, 800000000};
        nanosleep(&ts, NULL);
    }
    CommAr *a = NULL;
    rc = comm_group_iallreduce(g, x, n, COMM_SUM, &a, &err);
    double t0 = pd_now(), c0 = cpu_now();
    if (!rc) rc = comm_ar_wait(&a, 30, &err);
    if (rank == 0) {
        na->wall = pd_now() - t0;
        na->cpu = cpu_now() - c0;
    }
    if (!rc && chk_first_diff(x, want, n) != n) rc = PD_EINVAL;
    pd_free(x);
    pd_free(want);
    comm_group_free(g);
    return rc;
}

static void test_ar_nap(void **s) {
    (void)s;
    NapArg na = {0};
    Err err = {0};
    int rc = comm_threads_run(3, w_ar_nap, &na, NULL, &err);
    if (rc) fprintf(stderr, "ar_nap: rc %d: %s\n", rc, err.msg);
    assert_int_equal(rc, PD_OK);
    printf("ar_nap: rank 0 waited %.3f s; the process used %.3f s of CPU meanwhile\n", na.wall, na.cpu);
    assert_true(na.wall >= 0.5);
    assert_true(na.cpu < 0.25 * na.wall);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sum_serial),
        cmocka_unit_test(test_pingpong),
        cmocka_unit_test(test_out_of_order),
        cmocka_unit_test(test_posted_first),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_allreduce),
        cmocka_unit_test(test_agree),
        cmocka_unit_test(test_many),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_tag_layout),
        cmocka_unit_test(test_ctrl_bytes),
        cmocka_unit_test(test_ctrl_channels),
        cmocka_unit_test(test_ctrl_vs_data),
        cmocka_unit_test(test_ctrl_oversize),
        cmocka_unit_test(test_ctrl_timeout),
        cmocka_unit_test(test_bcast),
        cmocka_unit_test(test_gather),
        cmocka_unit_test(test_agree_t),
        cmocka_unit_test(test_coll_timeout),
        cmocka_unit_test(test_group_lists),
        cmocka_unit_test(test_ctrl_bad_args),
        cmocka_unit_test(test_ctrl_peer_gone),
        cmocka_unit_test(test_ar_exact),
        cmocka_unit_test(test_ar_outstanding),
        cmocka_unit_test(test_ar_bytes),
        cmocka_unit_test(test_ar_timeout),
        cmocka_unit_test(test_ar_single),
        cmocka_unit_test(test_ar_background),
        cmocka_unit_test(test_ar_abandon),
        cmocka_unit_test(test_progress_modes),
        cmocka_unit_test(test_ar_nap),
        cmocka_unit_test(test_ar_sizes),
        cmocka_unit_test(test_ar_peer_gone),
        cmocka_unit_test(test_early_exit_codes),
        cmocka_unit_test(test_abort_wakes_everyone),
        cmocka_unit_test(test_collective_deadline),
        cmocka_unit_test(test_single_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
