/* test_comm.c: the comm module over the threads transport: the shared checks of
 * tests/mpi/comm_checks.h (ping-pong with headers, out-of-order tags, receives posted before
 * sends, header mismatches named, deadline expiry, all-reduce bitwise equal to the serial
 * rank-order sum, agree, 1000 messages in flight, bad arguments) on 4 worker threads, plus
 * what only threads can show in one process: a worker that ends early or aborts does not
 * hang the others, collective deadlines, a single rank talking to itself.
 * The same checks run over MPI in test_comm_mpi.c. */
#include "testutil.h"

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

static void test_pingpong(void **s) { (void)s; run_case(&CHK_CASES[0]); }
static void test_out_of_order(void **s) { (void)s; run_case(&CHK_CASES[1]); }
static void test_posted_first(void **s) { (void)s; run_case(&CHK_CASES[2]); }
static void test_mismatch(void **s) { (void)s; run_case(&CHK_CASES[3]); }
static void test_deadline(void **s) { (void)s; run_case(&CHK_CASES[4]); }
static void test_allreduce(void **s) { (void)s; run_case(&CHK_CASES[5]); }
static void test_agree(void **s) { (void)s; run_case(&CHK_CASES[6]); }
static void test_many(void **s) { (void)s; run_case(&CHK_CASES[7]); }
static void test_bad_args(void **s) { (void)s; run_case(&CHK_CASES[8]); }

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
    double t0 = pd_now();
    int rc = comm_threads_run(CHK_NRANKS, w_early_exit, msgs, rcs, &err);
    assert_true(pd_now() - t0 < 5);
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
    for (int r = 0; r < 3; r++) assert_true(dt[r] > 0.15 && dt[r] < 2.0);
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

/* The serial oracle itself: rank order matters, and MEAN divides the rank-order sum. */
static void test_sum_serial(void **s) {
    (void)s;
    const float a[1] = {1e8f}, b[1] = {1.0f}, c[1] = {-1e8f};
    const float *abc[3] = {a, b, c}, *acb[3] = {a, c, b};
    float o1[1], o2[1], o3[1];
    comm_sum_serial(abc, 3, 1, COMM_SUM, o1);   /* (1e8 + 1) - 1e8 = 0 in float */
    comm_sum_serial(acb, 3, 1, COMM_SUM, o2);   /* (1e8 - 1e8) + 1 = 1 */
    comm_sum_serial(acb, 3, 1, COMM_MEAN, o3);
    assert_true(o1[0] == 0.0f);
    assert_true(o2[0] == 1.0f);
    assert_true(o3[0] == 1.0f / 3.0f);
    assert_int_equal(comm_tag(COMM_GRAD, 5, 1, 1 << 20), (5 * 3 + 1) * 2 + 1);
    assert_int_equal(comm_tag(COMM_GRAD, 5 + (1 << 20), 1, 1 << 20), comm_tag(COMM_GRAD, 5, 1, 1 << 20));
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
        cmocka_unit_test(test_early_exit_codes),
        cmocka_unit_test(test_abort_wakes_everyone),
        cmocka_unit_test(test_collective_deadline),
        cmocka_unit_test(test_single_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
