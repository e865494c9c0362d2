/* comm_checks.h: the transport checks shared by tests/test_comm.c (threads transport, under
 * cmocka) and tests/test_comm_mpi.c (MPI, under mpirun): the same functions run on every
 * rank of either transport, so both are held to the same semantics. Each check is a
 * CommWorkerFn: it returns PD_OK, or prints "rank R: <check>: <what>" on stderr and returns
 * PD_EINVAL. They need 4 ranks, except the all-reduce checks (ar_*), which run on any
 * number (test_comm.c also runs them on 1, 2, 3 and 5 threads). Oracles: payloads are a
 * pure function of (source, kind, mb, index); all-reduce is compared bitwise with
 * comm_sum_serial (the ring order of comm.h) over every member's data, regenerated from the
 * members' world ranks; control payloads are a pure function of (source, channel, message,
 * index).
 * Checks leave the comm clean (every message sent is received, collectives line up), since
 * under MPI they all run one after the other on one comm. */
#ifndef PD_COMM_CHECKS_H
#define PD_COMM_CHECKS_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "core.h"

#define CHK_NRANKS 4

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", comm_rank(c), \
                    __func__, __LINE__, #cond);                                \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
            return PD_EINVAL;                                                  \
        }                                                                      \
    } while (0)
#define CHECK_OK(expr, err)                                                    \
    do {                                                                       \
        int chk_rc_ = (expr);                                                  \
        CHECK(chk_rc_ == PD_OK, "rc %d: %s", chk_rc_, (err).msg);              \
    } while (0)

/* The payload value of element i of the message (src, kind, mb): exact in float. */
static inline float chk_val(int src, int kind, int64_t mb, size_t i) {
    return (float)(src * 100000 + kind * 30000 + (int)(mb % 1000) * 17 + (int)(i % 4093)) * 0.25f;
}

static inline void chk_fill(float *x, size_t n, int src, int kind, int64_t mb) {
    for (size_t i = 0; i < n; i++) x[i] = chk_val(src, kind, mb, i);
}

/* Index of the first element that is not the payload of (src, kind, mb), or -1. */
static inline long chk_bad(const float *x, size_t n, int src, int kind, int64_t mb) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != chk_val(src, kind, mb, i)) return (long)i;
    return -1;
}

/* Ping-pong in pairs (0,1), (2,3): activations out, gradients (twice the values) back;
 * headers (kind, mb, version, shape) arrive as sent. */
static int chk_pingpong(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    const int peer = rank ^ 1, even = !(rank & 1);
    const Shape s = shape2(3, 5);
    float x[15], y[15];
    for (int64_t mb = 0; mb < 50; mb++) {
        CommReq *rq = NULL;
        CommHeader h;
        if (even) {
            chk_fill(x, 15, rank, COMM_ACT, mb);
            CHECK_OK(comm_isend(c, peer, COMM_ACT, mb, 1000 + mb, s, x, &rq, &err), err);
            CHECK_OK(comm_wait(c, &rq, 10, NULL, &err), err);
            CHECK_OK(comm_irecv(c, peer, COMM_GRAD, mb, s, y, &rq, &err), err);
            CHECK_OK(comm_wait(c, &rq, 10, &h, &err), err);
            CHECK(rq == NULL, "request not freed");
            for (int i = 0; i < 15; i++) CHECK(y[i] == 2 * x[i], "mb %" PRId64 " [%d]: %g != %g", mb, i, y[i], 2 * x[i]);
            CHECK(h.kind == COMM_GRAD && h.mb == mb && h.version == 2000 + mb, "header kind %d mb %" PRId64
                  " version %" PRId64, h.kind, h.mb, h.version);
        } else {
            CHECK_OK(comm_irecv(c, peer, COMM_ACT, mb, s, y, &rq, &err), err);
            CHECK_OK(comm_wait(c, &rq, 10, &h, &err), err);
            long bad = chk_bad(y, 15, peer, COMM_ACT, mb);
            CHECK(bad < 0, "mb %" PRId64 ": element %ld wrong", mb, bad);
            CHECK(h.magic == COMM_MAGIC && h.kind == COMM_ACT && h.mb == mb && h.version == 1000 + mb &&
                      h.ndim == 2 && h.dims[0] == 3 && h.dims[1] == 5 && h.count == 15,
                  "header kind %d mb %" PRId64 " version %" PRId64 " ndim %d count %" PRIu64, h.kind, h.mb, h.version,
                  h.ndim, h.count);
            for (int i = 0; i < 15; i++) x[i] = 2 * y[i];
            CHECK_OK(comm_isend(c, peer, COMM_GRAD, mb, 2000 + mb, s, x, &rq, &err), err);
            CHECK_OK(comm_wait(c, &rq, 10, NULL, &err), err);
        }
    }
    return PD_OK;
}

/* Rank 0 sends minibatches 0..9 (activation and gradient each) to rank 1 in order; rank 1
 * posts the receives in reverse and completes them in a scrambled order. Tags keep them
 * apart; a zero-length control message too. */
static int chk_out_of_order(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    enum { NMB = 10, LEN = 33 };
    if (rank == 0) {
        float x[2][NMB][LEN];
        CommReq *rq[2][NMB];
        for (int mb = 0; mb < NMB; mb++)
            for (int k = 0; k < 2; k++) {
                chk_fill(x[k][mb], LEN, 0, k, mb);
                CHECK_OK(comm_isend(c, 1, (CommKind)k, mb, 0, shape1(LEN), x[k][mb], &rq[k][mb], &err), err);
            }
        CommReq *z = NULL;
        CHECK_OK(comm_isend(c, 1, COMM_CTRL, 5, 0, shape1(0), NULL, &z, &err), err);
        for (int mb = 0; mb < NMB; mb++)
            for (int k = 0; k < 2; k++) CHECK_OK(comm_wait(c, &rq[k][mb], 10, NULL, &err), err);
        CHECK_OK(comm_wait(c, &z, 10, NULL, &err), err);
    } else if (rank == 1) {
        float y[2][NMB][LEN];
        CommReq *rq[2][NMB];
        CommReq *z = NULL;
        CHECK_OK(comm_irecv(c, 0, COMM_CTRL, 5, shape1(0), NULL, &z, &err), err);
        for (int mb = NMB - 1; mb >= 0; mb--)
            for (int k = 1; k >= 0; k--)
                CHECK_OK(comm_irecv(c, 0, (CommKind)k, mb, shape1(LEN), y[k][mb], &rq[k][mb], &err), err);
        for (int j = 0; j < 2 * NMB; j++) {
            int idx = (j * 7) % (2 * NMB);   /* 7 is coprime with 20: a permutation */
            int mb = idx / 2, k = idx % 2;
            CHECK_OK(comm_wait(c, &rq[k][mb], 10, NULL, &err), err);
            long bad = chk_bad(y[k][mb], LEN, 0, k, mb);
            CHECK(bad < 0, "%s mb %d: element %ld wrong", comm_kind_name((CommKind)k), mb, bad);
        }
        CommHeader h;
        CHECK_OK(comm_wait(c, &z, 10, &h, &err), err);
        CHECK(h.kind == COMM_CTRL && h.mb == 5 && h.count == 0, "control header");
    }
    return PD_OK;
}

/* Receives posted before the sends exist: not complete until the peer sends, then correct. */
static int chk_posted_first(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    enum { LEN = 1000 };
    float buf[LEN];
    const int peer = (rank + 1) % CHK_NRANKS, from = (rank + CHK_NRANKS - 1) % CHK_NRANKS;
    CommReq *rq = NULL, *sq = NULL;
    CHECK_OK(comm_irecv(c, from, COMM_ACT, 42, shape2(10, 100), buf, &rq, &err), err);
    int done = 1;
    CHECK_OK(comm_test(c, &rq, &done, NULL, &err), err);
    CHECK(!done && rq != NULL, "receive completed before anything was sent");
    CHECK_OK(comm_barrier(c, &err), err);   /* every receive is posted now */
    float x[LEN];
    chk_fill(x, LEN, rank, COMM_ACT, 42);
    CHECK_OK(comm_isend(c, peer, COMM_ACT, 42, 7, shape2(10, 100), x, &sq, &err), err);
    CHECK_OK(comm_wait(c, &rq, 10, NULL, &err), err);
    CHECK_OK(comm_wait(c, &sq, 10, NULL, &err), err);
    long bad = chk_bad(buf, LEN, from, COMM_ACT, 42);
    CHECK(bad < 0, "element %ld wrong", bad);
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

/* A message that is not what the receiver posted fails with a message naming peer and
 * expected vs got: a shape mismatch, and a minibatch that shares the tag (mb + window). */
static int chk_mismatch(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    const int64_t far = 3 + comm_tag_window(c);
    float x[6] = {1, 2, 3, 4, 5, 6}, y[6];
    CommReq *rq = NULL;
    if (rank == 0) {
        CHECK_OK(comm_isend(c, 1, COMM_ACT, 7, 0, shape2(2, 3), x, &rq, &err), err);
        CHECK_OK(comm_wait(c, &rq, 10, NULL, &err), err);
        CHECK_OK(comm_isend(c, 1, COMM_GRAD, far, 0, shape1(6), x, &rq, &err), err);
        CHECK_OK(comm_wait(c, &rq, 10, NULL, &err), err);
        CHECK_OK(comm_isend(c, 1, COMM_ACT, 8, 0, shape1(6), x, &rq, &err), err);   /* longer than posted */
        CHECK_OK(comm_wait(c, &rq, 10, NULL, &err), err);
    } else if (rank == 1) {
        CHECK_OK(comm_irecv(c, 0, COMM_ACT, 7, shape2(3, 2), y, &rq, &err), err);
        int rc = comm_wait(c, &rq, 10, NULL, &err);
        CHECK(rc == PD_ECOMM && rq == NULL, "rc %d", rc);
        CHECK(strstr(err.msg, "from rank 0") && strstr(err.msg, "expected shape (3, 2), got shape (2, 3)") &&
                  strstr(err.msg, "minibatch 7"),
              "message: %s", err.msg);
        err = (Err){0};
        CHECK_OK(comm_irecv(c, 0, COMM_GRAD, 3, shape1(6), y, &rq, &err), err);
        rc = comm_wait(c, &rq, 10, NULL, &err);
        char want[128];
        snprintf(want, sizeof want, "expected gradient of minibatch 3, got gradient of minibatch %" PRId64, far);
        CHECK(rc == PD_ECOMM && strstr(err.msg, want) && strstr(err.msg, "from rank 0"), "rc %d message: %s", rc,
              err.msg);
        err = (Err){0};
        CHECK_OK(comm_irecv(c, 0, COMM_ACT, 8, shape1(4), y, &rq, &err), err);
        rc = comm_wait(c, &rq, 10, NULL, &err);
        CHECK(rc == PD_ECOMM && strstr(err.msg, "expected shape (4), got shape (6)"), "rc %d message: %s", rc,
              err.msg);
    }
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

/* A receive that nothing matches times out at about its deadline, naming what it waited
 * for; the request stays pending, can be cancelled, and the tag is then free again. */
static int chk_deadline(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    float y[4];
    CommReq *rq = NULL;
    if (rank == 1) {
        CHECK_OK(comm_irecv(c, 0, COMM_GRAD, 99, shape1(4), y, &rq, &err), err);
        double t0 = pd_now();
        int rc = comm_wait(c, &rq, 0.2, NULL, &err);
        double dt = pd_now() - t0;
        CHECK(rc == PD_ECOMM, "rc %d", rc);
        CHECK(dt >= 0.2, "timed out after %.3f s for a 0.2 s deadline", dt);
        CHECK(strstr(err.msg, "timed out") && strstr(err.msg, "gradient of minibatch 99 from rank 0"),
              "message: %s", err.msg);
        CHECK(rq != NULL, "a timed-out request stays pending");
        comm_cancel(c, &rq);
        CHECK(rq == NULL, "cancel frees");
    }
    CHECK_OK(comm_barrier(c, &err), err);
    /* now the message comes; a new receive gets it (the cancelled one took nothing) */
    if (rank == 0) {
        float x[4];
        chk_fill(x, 4, 0, COMM_GRAD, 99);
        CHECK_OK(comm_isend(c, 1, COMM_GRAD, 99, 0, shape1(4), x, &rq, &err), err);
        CHECK_OK(comm_wait(c, &rq, 10, NULL, &err), err);
    } else if (rank == 1) {
        CHECK_OK(comm_irecv(c, 0, COMM_GRAD, 99, shape1(4), y, &rq, &err), err);
        CHECK_OK(comm_wait(c, &rq, 10, NULL, &err), err);
        CHECK(chk_bad(y, 4, 0, COMM_GRAD, 99) < 0, "payload after cancel");
    }
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

/* Values with very different magnitudes, so that the summation order shows in the bits. */
static inline void chk_rand(float *x, size_t n, int world_rank, int salt) {
    Rng r;
    rng_init(&r, 1234, (uint64_t)salt, (uint64_t)world_rank);
    for (size_t i = 0; i < n; i++) x[i] = rng_normal(&r) * ldexpf(1.0f, (int)rng_below(&r, 24) - 12);
}

/* What the all-reduce of n floats (op) over the members ranks[0..gn-1] must give, each
 * member's data being chk_rand(world rank, salt): comm_sum_serial into want; the plain
 * rank-order sum x_0 + x_1 + ... into plain (optional). */
static void chk_expect(const int *ranks, int gn, size_t n, CommOp op, int salt, float *want, float *plain) {
    float **xs = calloc((size_t)gn, sizeof *xs);
    PD_ASSERT(xs);
    for (int i = 0; i < gn; i++) {
        xs[i] = pd_alloc_f32(n + 1);
        chk_rand(xs[i], n, ranks[i], salt);
    }
    comm_sum_serial((const float *const *)xs, gn, n, op, want);
    if (plain)
        for (size_t i = 0; i < n; i++) {
            float s = xs[0][i];
            for (int g = 1; g < gn; g++) s = s + xs[g][i];
            plain[i] = op == COMM_MEAN && gn > 1 ? s / (float)gn : s;
        }
    for (int i = 0; i < gn; i++) pd_free(xs[i]);
    free(xs);
}

/* Index of the first element of x (n) whose bits differ from want's, or n. */
static size_t chk_first_diff(const float *x, const float *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&x[i], &want[i], sizeof(float))) return i;
    return n;
}

/* One all-reduce of n floats on g, checked bitwise against comm_sum_serial of every
 * member's data (regenerated here from the members' world ranks). */
static int chk_allreduce_one(Comm *c, CommGroup *g, const int *ranks, size_t n, CommOp op, int salt) {
    Err err = {0};
    const int gn = comm_group_size(g);
    float *buf = pd_alloc_f32(n + 1), *want = pd_alloc_f32(n + 1), *rev = pd_alloc_f32(n + 1);
    float **xs = calloc((size_t)gn, sizeof *xs);
    const float **rx = calloc((size_t)gn, sizeof *rx);
    PD_ASSERT(xs && rx);
    for (int i = 0; i < gn; i++) {
        xs[i] = pd_alloc_f32(n + 1);
        chk_rand(xs[i], n, ranks[i], salt);
    }
    chk_rand(buf, n, comm_rank(c), salt);
    comm_sum_serial((const float *const *)xs, gn, n, op, want);
    for (int i = 0; i < gn; i++) rx[i] = xs[gn - 1 - i];
    comm_sum_serial(rx, gn, n, op, rev);
    int rc = comm_group_allreduce(g, buf, n, op, &err);
    size_t first = n;
    for (size_t i = 0; i < n && first == n; i++)
        if (memcmp(&buf[i], &want[i], sizeof(float))) first = i;
    size_t order_matters = 0;
    for (size_t i = 0; i < n; i++) order_matters += memcmp(&rev[i], &want[i], sizeof(float)) != 0;
    for (int i = 0; i < gn; i++) pd_free(xs[i]);
    free(xs);
    free(rx);
    float got0 = first < n ? buf[first] : 0, want0 = first < n ? want[first] : 0;
    pd_free(buf);
    pd_free(want);
    pd_free(rev);
    CHECK(rc == PD_OK, "all-reduce of %zu: rc %d: %s", n, rc, err.msg);
    CHECK(first == n, "all-reduce of %zu floats op %d: element %zu: got %.9g, comm_sum_serial %.9g", n, (int)op,
          first, got0, want0);
    /* the data is such that another order gives other bits (so the test can fail) */
    CHECK(gn < 3 || n < 1000 || order_matters > 0, "reverse order gave the same bits: weak test data");
    return PD_OK;
}

/* All-reduce over the world and over two pairs (one listed in reverse rank order), sizes
 * 0, 7 and 150001 (more than two chain chunks), sum and mean; then members disagreeing on the
 * size get PD_ECOMM on every member. */
static int chk_allreduce(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    const int world[CHK_NRANKS] = {0, 1, 2, 3};
    const int pair_a[2] = {0, 2}, pair_b[2] = {3, 1};
    CommGroup *gw = NULL, *gp = NULL;
    CHECK_OK(comm_group_new(c, world, CHK_NRANKS, &gw, &err), err);
    const int *pair = (rank == 0 || rank == 2) ? pair_a : pair_b;
    CHECK_OK(comm_group_new(c, pair, 2, &gp, &err), err);
    CHECK(comm_group_size(gp) == 2 && comm_group_rank(gp) == (pair[0] == rank ? 0 : 1), "group rank");
    CHECK(comm_group_rank(gw) == rank && comm_group_size(gw) == CHK_NRANKS, "world group rank");
    const size_t sizes[3] = {0, 7, 150001};
    int rc = PD_OK;
    for (int s = 0; s < 3 && !rc; s++)
        for (int op = 0; op < COMM_OP_COUNT && !rc; op++) {
            rc = chk_allreduce_one(c, gw, world, sizes[s], (CommOp)op, 10 * s + op);
            if (!rc) rc = chk_allreduce_one(c, gp, pair, sizes[s], (CommOp)op, 100 + 10 * s + op);
        }
    if (!rc) {   /* rank 3 brings one float more */
        float buf[9] = {0};
        int r2 = comm_group_allreduce(gw, buf, rank == 3 ? 9 : 8, COMM_SUM, &err);
        if (r2 != PD_ECOMM || !strstr(err.msg, "disagree")) {
            fprintf(stderr, "rank %d: size mismatch: rc %d: %s\n", rank, r2, err.msg);
            rc = PD_EINVAL;
        }
    }
    comm_group_free(gp);
    comm_group_free(gw);
    return rc;
}

/* agree returns the largest code on every rank. */
static int chk_agree(Comm *c, int rank, void *arg) {
    (void)arg;
    int a = comm_agree(c, PD_OK);
    CHECK(a == PD_OK, "all OK agreed %d", a);
    a = comm_agree(c, rank == 2 ? PD_EIO : rank == 3 ? PD_EINVAL : PD_OK);
    CHECK(a == PD_EIO, "agreed %d, want %d", a, PD_EIO);
    a = comm_agree(c, rank == 0 ? PD_ECOMM : PD_OK);
    CHECK(a == PD_ECOMM, "agreed %d, want %d", a, PD_ECOMM);
    return PD_OK;
}

/* 1000 messages in flight from every rank to the next, all sends started before any
 * receive is waited for, receives posted half before and half after: none lost or mixed. */
static int chk_many(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    enum { N = 1000, LEN = 16 };
    const int to = (rank + 1) % CHK_NRANKS, from = (rank + CHK_NRANKS - 1) % CHK_NRANKS;
    float *out = pd_alloc_f32((size_t)N * LEN), *in = pd_alloc_f32((size_t)N * LEN);
    CommReq **sq = calloc(N, sizeof *sq), **rq = calloc(N, sizeof *rq);
    PD_ASSERT(sq && rq);
    int rc = PD_OK;
    for (int i = 0; i < N / 2 && !rc; i++)
        rc = comm_irecv(c, from, (CommKind)(i % 3), i, shape1(LEN), in + (size_t)i * LEN, &rq[i], &err);
    for (int i = 0; i < N && !rc; i++) {
        chk_fill(out + (size_t)i * LEN, LEN, rank, i % 3, i);
        rc = comm_isend(c, to, (CommKind)(i % 3), i, i, shape1(LEN), out + (size_t)i * LEN, &sq[i], &err);
    }
    for (int i = N / 2; i < N && !rc; i++)
        rc = comm_irecv(c, from, (CommKind)(i % 3), i, shape1(LEN), in + (size_t)i * LEN, &rq[i], &err);
    for (int i = N - 1; i >= 0 && !rc; i--) {
        CommHeader h;
        rc = comm_wait(c, &rq[i], 20, &h, &err);
        if (!rc && (h.version != i || chk_bad(in + (size_t)i * LEN, LEN, from, i % 3, i) >= 0))
            rc = err_set(&err, PD_EINVAL, "message %d: wrong payload or version %" PRId64, i, h.version);
    }
    for (int i = 0; i < N && !rc; i++) rc = comm_wait(c, &sq[i], 20, NULL, &err);
    for (int i = 0; i < N; i++) {
        comm_cancel(c, &rq[i]);
        comm_cancel(c, &sq[i]);
    }
    free(sq);
    free(rq);
    pd_free(out);
    pd_free(in);
    CHECK(rc == PD_OK, "rc %d: %s", rc, err.msg);
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

/* Bad arguments are PD_EINVAL with a message, not a crash. */
static int chk_bad_args(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    float x[2] = {0};
    CommReq *rq = (CommReq *)1;
    int rc = comm_isend(c, CHK_NRANKS, COMM_ACT, 0, 0, shape1(2), x, &rq, &err);
    CHECK(rc == PD_EINVAL && rq == NULL && strstr(err.msg, "peer 4"), "rc %d: %s", rc, err.msg);
    rc = comm_irecv(c, 0, COMM_ACT, -1, shape1(2), x, &rq, &err);
    CHECK(rc == PD_EINVAL && strstr(err.msg, "minibatch -1"), "rc %d: %s", rc, err.msg);
    rc = comm_irecv(c, 0, COMM_ACT, 0, shape1(2), NULL, &rq, &err);
    CHECK(rc == PD_EINVAL && strstr(err.msg, "NULL"), "rc %d: %s", rc, err.msg);
    const int dup[2] = {rank, rank};
    CommGroup *g = NULL;
    rc = comm_group_new(c, dup, 2, &g, &err);
    CHECK(rc == PD_EINVAL && g == NULL && strstr(err.msg, "twice"), "rc %d: %s", rc, err.msg);
    const int other[1] = {(rank + 1) % CHK_NRANKS};
    rc = comm_group_new(c, other, 1, &g, &err);
    CHECK(rc == PD_EINVAL && strstr(err.msg, "not a member"), "rc %d: %s", rc, err.msg);
    return PD_OK;
}

/* ---- control plane ---------------------------------------------------------------- */

static inline unsigned char chk_byte(int src, int ch, int k, size_t i) {
    return (unsigned char)(src * 31 + ch * 7 + k * 13 + (int)(i % 251) * 11 + (int)(i >> 8) * 3 + 1);
}

static inline void chk_bytes(unsigned char *x, size_t n, int src, int ch, int k) {
    for (size_t i = 0; i < n; i++) x[i] = chk_byte(src, ch, k, i);
}

/* Index of the first byte that is not (src, ch, k)'s, or -1. */
static inline long chk_bytes_bad(const unsigned char *x, size_t n, int src, int ch, int k) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != chk_byte(src, ch, k, i)) return (long)i;
    return -1;
}

/* Byte round trips in pairs (0,1), (2,3) of odd lengths, 0 and more than 1 MiB included:
 * the odd rank receives (into a buffer of exactly the size, a larger one, or an allocated
 * one, in turn), checks, and echoes a transformed copy that the even rank checks. */
static int chk_ctrl_bytes(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    const size_t lens[] = {0, 1, 3, 63, 64, 65, 1000, 4097, 65537, ((size_t)1 << 20) + 7};
    enum { NL = sizeof lens / sizeof lens[0] };
    const size_t maxn = lens[NL - 1] + 16;
    const int peer = rank ^ 1, even = !(rank & 1), ch = 3 + rank / 2;
    unsigned char *x = malloc(maxn), *y = malloc(maxn);
    PD_ASSERT(x && y);
    for (int li = 0; li < NL; li++) {
        const size_t n = lens[li];
        size_t got = 12345;
        unsigned char *in = y;
        void *alloc = NULL;
        const int from = even ? rank : peer;
        if (even) {
            chk_bytes(x, n, rank, ch, li);
            CHECK_OK(comm_ctrl_send(c, peer, ch, x, n, 30, &err), err);
        }
        if (li % 3 == 0) {
            CHECK_OK(comm_ctrl_recv(c, peer, ch, y, n, &got, 30, &err), err);
        } else if (li % 3 == 1) {
            CHECK_OK(comm_ctrl_recv(c, peer, ch, y, n + 16, &got, 30, &err), err);
        } else {
            CHECK_OK(comm_ctrl_recv_alloc(c, peer, ch, &alloc, &got, 30, &err), err);
            CHECK(alloc != NULL, "recv_alloc of %zu bytes gave NULL", n);
            in = alloc;
        }
        CHECK(got == n, "length %zu: received %zu bytes", n, got);
        if (even) {   /* the echo: every byte xor 0x5a */
            for (size_t i = 0; i < n; i++) CHECK(in[i] == (x[i] ^ 0x5a), "echo of %zu bytes: byte %zu", n, i);
        } else {
            long bad = chk_bytes_bad(in, n, from, ch, li);
            CHECK(bad < 0, "%zu bytes from rank %d: byte %ld wrong", n, peer, bad);
            for (size_t i = 0; i < n; i++) x[i] = in[i] ^ 0x5a;
            CHECK_OK(comm_ctrl_send(c, peer, ch, x, n, 30, &err), err);
        }
        free(alloc);
    }
    free(x);
    free(y);
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

/* Channels and sources keep conversations apart and each in order: rank 0 sends messages
 * 0..9 on channels 0, 1, 17 and 63 interleaved, ranks 2 and 3 send 0..9 on channel 0; rank 1
 * reads them channel by channel and source by source, in an order unlike the sending one. */
static int chk_ctrl_channels(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    enum { NK = 10 };
    const int chans[4] = {0, 1, 17, 63};
    if (rank == 0) {
        for (int k = 0; k < NK; k++)
            for (int j = 0; j < 4; j++) {
                unsigned char x[64];
                chk_bytes(x, (size_t)k + 5, 0, chans[j], k);
                CHECK_OK(comm_ctrl_send(c, 1, chans[j], x, (size_t)k + 5, 10, &err), err);
            }
    } else if (rank >= 2) {
        for (int k = 0; k < NK; k++) {
            unsigned char x[64];
            chk_bytes(x, (size_t)k + 5, rank, 0, k);
            CHECK_OK(comm_ctrl_send(c, 1, 0, x, (size_t)k + 5, 10, &err), err);
        }
    } else {
        const int order[6][2] = {{0, 63}, {3, 0}, {0, 17}, {2, 0}, {0, 1}, {0, 0}};   /* (source, channel) */
        for (int o = 0; o < 6; o++)
            for (int k = 0; k < NK; k++) {
                unsigned char y[64];
                size_t got = 0;
                const int src = order[o][0], ch = order[o][1];
                CHECK_OK(comm_ctrl_recv(c, src, ch, y, sizeof y, &got, 10, &err), err);
                long bad = chk_bytes_bad(y, got, src, ch, k);
                CHECK(got == (size_t)k + 5 && bad < 0, "rank %d channel %d message %d: %zu bytes, byte %ld wrong "
                      "(another channel's, source's or message's)", src, ch, k, got, bad);
            }
    }
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

/* Control messages never meet data messages, whatever the minibatch: the tag ranges are
 * disjoint (checked for minibatch 0, window multiples and the old hand-picked ids), and on
 * the wire rank 1's receives posted for (kind, mb) stay empty while control messages
 * (plain and a broadcast) and a data message go by; then each gets its own. */
static int chk_ctrl_vs_data(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    const int64_t w = comm_tag_window(c);
    const int64_t mbs[] = {0, w, 2 * w, 5 * w, (int64_t)1 << 40, (int64_t)1 << 50, (int64_t)1 << 52};
    enum { NMB = sizeof mbs / sizeof mbs[0], NR = NMB * COMM_KIND_COUNT };
    const int ctrl0 = comm_ctrl_tag(0, w);
    CHECK(ctrl0 == 2 * COMM_KIND_COUNT * w, "control tags start at %d", ctrl0);
    for (int k = 0; k < COMM_KIND_COUNT; k++)
        for (int i = 0; i < NMB; i++)
            for (int part = 0; part < 2; part++) {
                const int64_t ms[3] = {mbs[i], mbs[i] + w - 1, mbs[i] + 1};
                for (int j = 0; j < 3; j++) {
                    int t = comm_tag((CommKind)k, ms[j], part, w);
                    CHECK(t >= 0 && t < ctrl0, "tag %d of (%s, mb %" PRId64 ") meets the control range", t,
                          comm_kind_name((CommKind)k), ms[j]);
                }
            }
    CHECK(comm_ctrl_tag(COMM_CTRL_TAG_COUNT - 1, w) - ctrl0 == COMM_CTRL_TAG_COUNT - 1, "one tag per channel");

    float in[NR][4], extra[4];
    CommReq *rq[NR] = {0}, *xq = NULL;
    const unsigned char msg[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    const int chans[3] = {0, 1, COMM_CHANNELS - 1};
    if (rank == 1)   /* posted in the order rank 0 will send: mbs sharing a tag match in order */
        for (int i = 0; i < NMB; i++)
            for (int k = 0; k < COMM_KIND_COUNT; k++)
                CHECK_OK(comm_irecv(c, 0, (CommKind)k, mbs[i], shape1(4), in[i * COMM_KIND_COUNT + k],
                                    &rq[i * COMM_KIND_COUNT + k], &err), err);
    CHECK_OK(comm_barrier(c, &err), err);
    unsigned char b[16] = {0};
    if (rank == 0) {
        float x[4];
        chk_fill(x, 4, 0, COMM_CTRL, 7);
        CHECK_OK(comm_isend(c, 1, COMM_CTRL, 7, 0, shape1(4), x, &xq, &err), err);   /* a data message first */
        CHECK_OK(comm_wait(c, &xq, 10, NULL, &err), err);
        for (int j = 0; j < 3; j++) CHECK_OK(comm_ctrl_send(c, 1, chans[j], msg, sizeof msg, 10, &err), err);
        memcpy(b, msg, sizeof b);
    }
    CHECK_OK(comm_bcast(c, 0, b, sizeof b, 10, &err), err);
    CHECK(!memcmp(b, msg, sizeof b), "broadcast payload");
    if (rank == 1) {
        for (int j = 0; j < 3; j++) {
            unsigned char y[16];
            size_t got = 0;
            CHECK_OK(comm_ctrl_recv(c, 0, chans[j], y, sizeof y, &got, 10, &err), err);
            CHECK(got == sizeof msg && !memcmp(y, msg, sizeof msg), "channel %d: not the control message", chans[j]);
        }
        for (int r = 0; r < NR; r++) {   /* the control messages have all arrived: none matched */
            int done = 1;
            CHECK_OK(comm_test(c, &rq[r], &done, NULL, &err), err);
            CHECK(!done, "receive of (%s, mb %" PRId64 ") matched a control message",
                  comm_kind_name((CommKind)(r % COMM_KIND_COUNT)), mbs[r / COMM_KIND_COUNT]);
        }
        CHECK_OK(comm_irecv(c, 0, COMM_CTRL, 7, shape1(4), extra, &xq, &err), err);
        CHECK_OK(comm_wait(c, &xq, 10, NULL, &err), err);
        CHECK(chk_bad(extra, 4, 0, COMM_CTRL, 7) < 0, "the data message got lost among control ones");
    }
    CHECK_OK(comm_barrier(c, &err), err);
    if (rank == 0) {
        for (int i = 0; i < NMB; i++)
            for (int k = 0; k < COMM_KIND_COUNT; k++) {
                float x[4];
                chk_fill(x, 4, 0, k, mbs[i]);
                CHECK_OK(comm_isend(c, 1, (CommKind)k, mbs[i], 0, shape1(4), x, &xq, &err), err);
                CHECK_OK(comm_wait(c, &xq, 10, NULL, &err), err);
            }
    } else if (rank == 1) {
        for (int r = 0; r < NR; r++) {
            CommHeader h;
            CHECK_OK(comm_wait(c, &rq[r], 10, &h, &err), err);
            const int k = r % COMM_KIND_COUNT;
            const int64_t mb = mbs[r / COMM_KIND_COUNT];
            CHECK(h.kind == k && h.mb == mb && chk_bad(in[r], 4, 0, k, mb) < 0, "(%s, mb %" PRId64 ") payload",
                  comm_kind_name((CommKind)k), mb);
        }
    }
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

/* A message longer than the receive buffer fails naming both sizes; it is consumed, and
 * the next message on the channel arrives normally. */
static int chk_ctrl_oversize(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    unsigned char x[100], y[99];
    if (rank == 0) {
        chk_bytes(x, 100, 0, 2, 0);
        CHECK_OK(comm_ctrl_send(c, 1, 2, x, 100, 10, &err), err);
        chk_bytes(x, 10, 0, 2, 1);
        CHECK_OK(comm_ctrl_send(c, 1, 2, x, 10, 10, &err), err);
    } else if (rank == 1) {
        size_t got = 7;
        int rc = comm_ctrl_recv(c, 0, 2, y, sizeof y, &got, 10, &err);
        CHECK(rc == PD_ECOMM && got == 0, "rc %d got %zu", rc, got);
        CHECK(strstr(err.msg, "100 bytes") && strstr(err.msg, "99") && strstr(err.msg, "rank 0") &&
                  strstr(err.msg, "control channel 2"),
              "message: %s", err.msg);
        CHECK_OK(comm_ctrl_recv(c, 0, 2, y, sizeof y, &got, 10, &err), err);
        CHECK(got == 10 && chk_bytes_bad(y, 10, 0, 2, 1) < 0, "the next message: %zu bytes", got);
    }
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

/* A receive from a rank that does not send times out at its deadline naming that rank and
 * the channel; the message sent later is then received normally. A 2 MiB send to a rank
 * that is busy elsewhere either completes at once (threads: eager) or times out naming the
 * receiver (MPI: the peer must receive it), and arrives all the same. */
static int chk_ctrl_timeout(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    const size_t big = (size_t)2 << 20;
    unsigned char y[8];
    if (rank == 1) {
        double t0 = pd_now();
        int rc = comm_ctrl_recv(c, 2, 5, y, sizeof y, NULL, 0.3, &err);
        double dt = pd_now() - t0;
        CHECK(rc == PD_ECOMM, "rc %d", rc);
        CHECK(dt >= 0.3, "returned after %.3f s for a 0.3 s deadline", dt);
        CHECK(strstr(err.msg, "rank 1: timed out") && strstr(err.msg, "waiting for rank 2") &&
                  strstr(err.msg, "control channel 5"),
              "message: %s", err.msg);
    } else if (rank == 0) {
        unsigned char *x = malloc(big);
        PD_ASSERT(x);
        chk_bytes(x, big, 0, 7, 0);
        int rc = comm_ctrl_send(c, 3, 7, x, big, 0.3, &err);
        free(x);   /* the send copied it */
        CHECK(rc == PD_OK || (rc == PD_ECOMM && strstr(err.msg, "sending to rank 3") &&
                              strstr(err.msg, "control channel 7")),
              "rc %d: %s", rc, err.msg);
    }
    CHECK_OK(comm_barrier(c, &err), err);
    if (rank == 2) {
        unsigned char x[8];
        chk_bytes(x, 8, 2, 5, 0);
        CHECK_OK(comm_ctrl_send(c, 1, 5, x, 8, 10, &err), err);
    } else if (rank == 1) {
        size_t got = 0;
        CHECK_OK(comm_ctrl_recv(c, 2, 5, y, sizeof y, &got, 10, &err), err);
        CHECK(got == 8 && chk_bytes_bad(y, 8, 2, 5, 0) < 0, "late message: %zu bytes", got);
    } else if (rank == 3) {
        void *p = NULL;
        size_t got = 0;
        CHECK_OK(comm_ctrl_recv_alloc(c, 0, 7, &p, &got, 30, &err), err);
        long bad = chk_bytes_bad(p, got, 0, 7, 0);
        free(p);
        CHECK(got == big && bad < 0, "2 MiB message: %zu bytes, byte %ld wrong", got, bad);
    }
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

static const int64_t CHK_I64[5] = {((int64_t)1 << 53) + 1, INT64_MAX, INT64_MIN, -(((int64_t)1 << 60) + 3),
                                   (int64_t)0x0123456789abcdefLL};

/* Broadcast from every root, sizes 0 to over 1 MiB; int64 values above 2^53 exact; a rank
 * that expects another size fails naming both, the others do not. */
static int chk_bcast(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    const size_t sizes[4] = {0, 5, 4097, ((size_t)1 << 20) + 3};
    unsigned char *buf = malloc(sizes[3]);
    PD_ASSERT(buf);
    for (int root = 0; root < CHK_NRANKS; root++)
        for (int s = 0; s < 4; s++) {
            if (rank == root) chk_bytes(buf, sizes[s], root, 99, s);
            else memset(buf, 0xee, sizes[s]);
            CHECK_OK(comm_bcast(c, root, buf, sizes[s], 30, &err), err);
            long bad = chk_bytes_bad(buf, sizes[s], root, 99, s);
            CHECK(bad < 0, "broadcast of %zu bytes from rank %d: byte %ld wrong", sizes[s], root, bad);
        }
    free(buf);
    int64_t v[5] = {0};
    if (rank == 2) memcpy(v, CHK_I64, sizeof v);
    CHECK_OK(comm_bcast_i64(c, 2, v, 5, 10, &err), err);
    for (int i = 0; i < 5; i++) CHECK(v[i] == CHK_I64[i], "int64 %d: %" PRId64 " != %" PRId64, i, v[i], CHK_I64[i]);
    unsigned char m[16] = {0};
    int rc = comm_bcast(c, 1, m, rank == 3 ? 8 : 16, 10, &err);
    if (rank == 3)
        CHECK(rc == PD_ECOMM && strstr(err.msg, "16 bytes") && strstr(err.msg, "expected 8") &&
                  strstr(err.msg, "rank 1"),
              "rc %d: %s", rc, err.msg);
    else
        CHECK(rc == PD_OK, "rc %d: %s", rc, err.msg);
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

/* Gather to roots 0 and 3 of sizes that differ by rank (0 and over 1 MiB included); int64
 * values above 2^53 exact. */
static int chk_gather(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    for (int t = 0; t < 3; t++) {
        const int root = t == 0 ? 0 : t == 1 ? 3 : 1;
        size_t n_of[CHK_NRANKS];
        for (int r = 0; r < CHK_NRANKS; r++) n_of[r] = t == 0 ? (size_t)r * 1000 + 3 : t == 1 ? (size_t)(r != 1) * 77
                                                                                        : (r == 2 ? ((size_t)1 << 20) + 1 : 9);
        unsigned char *mine = malloc(n_of[rank] + 1);
        PD_ASSERT(mine);
        chk_bytes(mine, n_of[rank], rank, 40 + t, root);
        void **parts = (void **)1;
        size_t *sizes = (size_t *)1;
        CHECK_OK(comm_gather(c, root, mine, n_of[rank], &parts, &sizes, 30, &err), err);
        free(mine);
        if (rank != root) {
            CHECK(parts == NULL && sizes == NULL, "non-root gets NULL");
            continue;
        }
        for (int r = 0; r < CHK_NRANKS; r++) {
            CHECK(parts[r] != NULL && sizes[r] == n_of[r], "part of rank %d: %zu bytes, want %zu", r, sizes[r], n_of[r]);
            long bad = chk_bytes_bad(parts[r], sizes[r], r, 40 + t, root);
            CHECK(bad < 0, "part of rank %d: byte %ld wrong", r, bad);
        }
        comm_parts_free(parts, sizes, CHK_NRANKS);
    }
    int64_t mine[3] = {CHK_I64[0] + 2 * rank, INT64_MIN + rank, INT64_MAX - rank}, all[CHK_NRANKS * 3];
    memset(all, 0, sizeof all);
    CHECK_OK(comm_gather_i64(c, 2, mine, 3, rank == 2 ? all : NULL, 10, &err), err);
    if (rank == 2)
        for (int r = 0; r < CHK_NRANKS; r++) {
            const int64_t want[3] = {CHK_I64[0] + 2 * r, INT64_MIN + r, INT64_MAX - r};
            for (int i = 0; i < 3; i++)
                CHECK(all[r * 3 + i] == want[i], "rank %d value %d: %" PRId64 " != %" PRId64, r, i, all[r * 3 + i],
                      want[i]);
        }
    return PD_OK;
}

/* agree_t: the largest code and the lowest rank that brought it, on every rank; the
 * caller's err stays as it was on success; many in a row stay in step. */
static int chk_agree_t(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    int who = 7;
    int a = comm_agree_t(c, PD_OK, 10, &who, &err);
    CHECK(a == PD_OK && who == -1, "all OK: agreed %d, who %d: %s", a, who, err.msg);
    err_set(&err, PD_EIO, "my own error");
    a = comm_agree_t(c, rank == 2 ? PD_EIO : rank == 3 ? PD_EINVAL : PD_OK, 10, &who, &err);
    CHECK(a == PD_EIO && who == 2, "agreed %d who %d, want %d who 2", a, who, PD_EIO);
    CHECK(err.code == PD_EIO && !strcmp(err.msg, "my own error"), "err overwritten: %s", err.msg);
    a = comm_agree_t(c, (rank == 1 || rank == 3) ? PD_ECOMM : PD_OK, 10, &who, &err);
    CHECK(a == PD_ECOMM && who == 1, "agreed %d who %d, want %d who 1", a, who, PD_ECOMM);
    for (int k = 0; k < 200; k++) {
        /* rank k % 4 brings k % 5, rank (k + 1) % 4 brings 1 when k is even */
        int codes[CHK_NRANKS] = {0}, want = 0, wwho = -1;
        codes[(k + 1) % CHK_NRANKS] = k % 2 == 0 ? 1 : 0;
        codes[k % CHK_NRANKS] = k % 5;
        for (int r = 0; r < CHK_NRANKS; r++)
            if (codes[r] > want) want = codes[r], wwho = r;
        const int code = codes[rank];
        a = comm_agree_t(c, code, 10, &who, &err);
        CHECK(a == want && who == wwho, "round %d: agreed %d who %d, want %d who %d", k, a, who, want, wwho);
    }
    a = comm_agree_t(c, PD_OK, 0, NULL, &err);   /* no deadline, no who */
    CHECK(a == PD_OK, "agreed %d", a);
    return PD_OK;
}

/* A late rank is named by the ranks that wait for it, within a bounded time; the late rank
 * may then catch up, and the comm is usable again (the failed collectives' leftovers are
 * dropped). Rank 3 is late for a gather (root 0), an agree and a broadcast (its own). */
static int chk_coll_timeout(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    const double T = 1.5;
    int64_t v = rank, all[CHK_NRANKS];
    int who = 9;
    /* gather: the root names rank 3; the others' part is done */
    if (rank != 3) {
        double t0 = pd_now();
        int rc = comm_gather_i64(c, 0, &v, 1, all, T, &err);
        double dt = pd_now() - t0;
        if (rank == 0) {
            CHECK(rc == PD_ECOMM && strstr(err.msg, "timed out") && strstr(err.msg, "waiting for rank 3") &&
                      strstr(err.msg, "gather"),
                  "rc %d: %s", rc, err.msg);
            CHECK(dt >= T, "root returned after %.3f s for a %g s deadline", dt, T);
        } else {
            CHECK(rc == PD_OK, "rc %d: %s", rc, err.msg);
        }
    }
    CHECK_OK(comm_barrier(c, &err), err);
    if (rank == 3) CHECK_OK(comm_gather_i64(c, 0, &v, 1, NULL, T, &err), err);   /* late; its part goes */
    /* agree: everyone names rank 3 */
    if (rank != 3) {
        double t0 = pd_now();
        int rc = comm_agree_t(c, PD_OK, T, &who, &err);
        double dt = pd_now() - t0;
        CHECK(rc == PD_ECOMM && who == 3 && strstr(err.msg, "waiting for rank 3") && strstr(err.msg, "agree"),
              "rc %d who %d: %s", rc, who, err.msg);
        CHECK(dt >= T, "returned after %.3f s for a %g s deadline", dt, T);
    }
    CHECK_OK(comm_barrier(c, &err), err);
    if (rank == 3) {   /* late, it still hears everyone (their contributions were sent) */
        int rc = comm_agree_t(c, PD_EIO, 10, &who, &err);
        CHECK(rc == PD_EIO && who == 3, "late agree: %d who %d: %s", rc, who, err.msg);
    }
    /* broadcast from a late root */
    unsigned char b[8] = {0};
    if (rank != 3) {
        int rc = comm_bcast(c, 3, b, sizeof b, T, &err);
        CHECK(rc == PD_ECOMM && strstr(err.msg, "waiting for rank 3") && strstr(err.msg, "broadcast"), "rc %d: %s",
              rc, err.msg);
    }
    CHECK_OK(comm_barrier(c, &err), err);
    if (rank == 3) CHECK_OK(comm_bcast(c, 3, b, sizeof b, T, &err), err);
    /* in step again: leftovers are dropped, results are right */
    int a = comm_agree_t(c, rank == 1 ? PD_EIO : PD_OK, 10, &who, &err);
    CHECK(a == PD_EIO && who == 1, "after recovery: agreed %d who %d: %s", a, who, err.msg);
    v = 1000 + rank;
    CHECK_OK(comm_gather_i64(c, 0, &v, 1, rank == 0 ? all : NULL, 10, &err), err);
    if (rank == 0)
        for (int r = 0; r < CHK_NRANKS; r++) CHECK(all[r] == 1000 + r, "gather after recovery: [%d] = %" PRId64, r, all[r]);
    if (rank == 3) memcpy(b, "recover", 8);
    CHECK_OK(comm_bcast(c, 3, b, sizeof b, 10, &err), err);
    CHECK(!memcmp(b, "recover", 8), "broadcast after recovery");
    return PD_OK;
}

/* Members passing different lists to comm_group_new all fail (nobody hangs); then the right
 * lists work. */
static int chk_group_lists(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    CommGroup *g = (CommGroup *)1;
    if (rank < 2) {
        const int l0[2] = {0, 1}, l1[2] = {1, 0};
        int rc = comm_group_new(c, rank == 0 ? l0 : l1, 2, &g, &err);
        const char *theirs = rank == 0 ? "rank 1 passed the list (1, 0), this rank (0, 1)"
                                       : "rank 0 passed the list (0, 1), this rank (1, 0)";
        CHECK(rc == PD_ECOMM && g == NULL && strstr(err.msg, theirs), "rc %d: %s", rc, err.msg);
    }
    CHECK_OK(comm_barrier(c, &err), err);
    const int pa[2] = {0, 1}, pb[2] = {3, 2};
    CHECK_OK(comm_group_new(c, rank < 2 ? pa : pb, 2, &g, &err), err);
    CHECK(comm_group_rank(g) == (rank < 2 ? rank : 3 - rank) && comm_group_size(g) == 2, "group rank");
    float x[3] = {(float)rank, 1, 2};
    int rc = comm_group_allreduce(g, x, 3, COMM_SUM, &err);
    comm_group_free(g);
    CHECK(rc == PD_OK && x[0] == (rank < 2 ? 1.0f : 5.0f) && x[1] == 2.0f, "rc %d x0 %g", rc, x[0]);
    return PD_OK;
}

/* Bad arguments to the control plane are PD_EINVAL before anything is sent (collectives
 * stay in step: an agree afterwards works). */
static int chk_ctrl_bad_args(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    unsigned char x[8] = {0};
    void *p = (void *)1, **parts = (void **)1;
    size_t *sizes = (size_t *)1, got = 5;
    int rc = comm_ctrl_send(c, CHK_NRANKS, 0, x, 8, 1, &err);
    CHECK(rc == PD_EINVAL && strstr(err.msg, "peer 4"), "rc %d: %s", rc, err.msg);
    rc = comm_ctrl_send(c, 0, COMM_CHANNELS, x, 8, 1, &err);
    CHECK(rc == PD_EINVAL && strstr(err.msg, "channel 64"), "rc %d: %s", rc, err.msg);
    rc = comm_ctrl_send(c, 0, -1, x, 8, 1, &err);
    CHECK(rc == PD_EINVAL && strstr(err.msg, "channel -1"), "rc %d: %s", rc, err.msg);
    rc = comm_ctrl_send(c, 0, 0, NULL, 8, 1, &err);
    CHECK(rc == PD_EINVAL && strstr(err.msg, "NULL"), "rc %d: %s", rc, err.msg);
    rc = comm_ctrl_recv(c, 0, 0, NULL, 8, &got, 1, &err);
    CHECK(rc == PD_EINVAL && got == 0 && strstr(err.msg, "NULL"), "rc %d: %s", rc, err.msg);
    rc = comm_ctrl_recv_alloc(c, -1, 0, &p, NULL, 1, &err);
    CHECK(rc == PD_EINVAL && p == NULL && strstr(err.msg, "peer -1"), "rc %d: %s", rc, err.msg);
    rc = comm_bcast(c, CHK_NRANKS, x, 8, 1, &err);
    CHECK(rc == PD_EINVAL && strstr(err.msg, "root 4"), "rc %d: %s", rc, err.msg);
    rc = comm_gather(c, -1, x, 8, &parts, &sizes, 1, &err);
    CHECK(rc == PD_EINVAL && parts == NULL && sizes == NULL && strstr(err.msg, "root -1"), "rc %d: %s", rc, err.msg);
    rc = comm_gather_i64(c, 0, NULL, -1, NULL, 1, &err);
    CHECK(rc == PD_EINVAL && strstr(err.msg, "-1 int64"), "rc %d: %s", rc, err.msg);
    rc = comm_bcast_i64(c, 0, NULL, -2, 1, &err);
    CHECK(rc == PD_EINVAL && strstr(err.msg, "-2 int64"), "rc %d: %s", rc, err.msg);
    int who = 0;
    rc = comm_agree_t(c, PD_OK, 10, &who, &err);
    CHECK(rc == PD_OK && who == -1, "agree after bad arguments: %d: %s", rc, err.msg);
    return PD_OK;
}

/* ---- all-reduce (the ring) ------------------------------------------------------------
 * These run on any number of ranks: groups are built from comm_size(c); ranks outside a
 * group skip it (and meet the others at a barrier). */

/* The world ranks of the group of r members "list" l: l = 0: (0, 1, ..., r - 1); l = 1: the
 * top r ranks listed downwards (size - 1, ..., size - r), so group order != world order. */
static void chk_ar_list(int size, int r, int l, int *ranks) {
    for (int j = 0; j < r; j++) ranks[j] = l == 0 ? j : size - 1 - j;
}

static int chk_in(const int *ranks, int n, int rank) {
    for (int j = 0; j < n; j++)
        if (ranks[j] == rank) return 1;
    return 0;
}

/* One all-reduce of n floats over g (members ranks), blocking or not: bitwise equal to
 * comm_sum_serial on every member; for 3+ members and enough data, other bits than the plain
 * rank-order sum (so the ring order is really the one computed, and the test can fail). */
static int chk_ar_one(Comm *c, CommGroup *g, const int *ranks, size_t n, CommOp op, int salt, int nonblocking) {
    Err err = {0};
    const int gn = comm_group_size(g);
    float *buf = pd_alloc_f32(n + 1), *want = pd_alloc_f32(n + 1), *plain = pd_alloc_f32(n + 1);
    chk_expect(ranks, gn, n, op, salt, want, plain);
    chk_rand(buf, n, comm_rank(c), salt);
    int rc;
    if (nonblocking) {
        CommAr *a = NULL;
        rc = comm_group_iallreduce(g, buf, n, op, &a, &err);
        int done = 0;
        for (double t0 = pd_now(); !rc && !done && pd_now() - t0 < 60;) rc = comm_ar_test(a, &done, &err);
        if (!rc && !done) rc = err_set(&err, PD_ECOMM, "not done after 60 s of comm_ar_test");
        int rc2 = comm_ar_wait(&a, 10, &err);
        if (!rc) rc = rc2;
        comm_ar_cancel(&a);
    } else {
        rc = comm_group_allreduce(g, buf, n, op, &err);
    }
    size_t first = chk_first_diff(buf, want, n);
    size_t ring_vs_plain = 0;
    for (size_t i = 0; i < n; i++) ring_vs_plain += memcmp(&plain[i], &want[i], sizeof(float)) != 0;
    float got0 = first < n ? buf[first] : 0, want0 = first < n ? want[first] : 0;
    pd_free(buf);
    pd_free(want);
    pd_free(plain);
    CHECK(rc == PD_OK, "all-reduce of %zu over %d: rc %d: %s", n, gn, rc, err.msg);
    CHECK(first == n, "all-reduce of %zu floats over %d op %d: element %zu: got %.9g, comm_sum_serial %.9g", n, gn,
          (int)op, first, got0, want0);
    CHECK(gn < 3 || n < 1000 || ring_vs_plain > 0, "the ring order gave the plain rank order's bits: weak test data");
    CHECK(gn > 2 || ring_vs_plain == 0, "%d members: the ring order must equal the plain rank order", gn);
    return PD_OK;
}

/* Bitwise equality with comm_sum_serial for every group size 1 .. size (two lists each),
 * n = 0, 1, r - 1, r + 1, 7, 1001 and 300007 (> 1 MiB, several pieces per chunk), SUM and
 * MEAN, blocking and (alternately) non-blocking. */
static int chk_ar_exact(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    const int size = comm_size(c);
    int *ranks = malloc((size_t)size * sizeof *ranks);
    PD_ASSERT(ranks);
    int rc = PD_OK;
    for (int r = 1; r <= size && !rc; r++)
        for (int l = 0; l < 2 && !rc; l++) {
            chk_ar_list(size, r, l, ranks);
            if (!chk_in(ranks, r, rank)) continue;
            CommGroup *g = NULL;
            rc = comm_group_new(c, ranks, r, &g, &err);
            if (rc) {
                fprintf(stderr, "rank %d: group of %d: %s\n", rank, r, err.msg);
                break;
            }
            const size_t sizes[7] = {0, 1, (size_t)r - 1, (size_t)r + 1, 7, 1001, 300007};
            for (int si = 0; si < 7 && !rc; si++)
                for (int op = 0; op < COMM_OP_COUNT && !rc; op++)
                    rc = chk_ar_one(c, g, ranks, sizes[si], (CommOp)op, 1000 + 100 * r + 10 * si + op + 50 * l,
                                    (si + op + l) % 2);
            comm_group_free(g);
        }
    free(ranks);
    if (rc) return rc;
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

/* Several all-reduces outstanding at once: five on the world group and two on a pair group
 * (the same sequence numbers, so the same tags, between the same ranks: groups keep them
 * apart), started in the same order everywhere; meanwhile point-to-point gradients go round
 * the ranks on minibatch tags (0, 1, window - 1, window + 5, 2^40) and are waited for with
 * comm_wait (which advances the all-reduces); one all-reduce is polled to completion with
 * comm_ar_test, the world ones are completed in reverse order. Then members that disagree on
 * the op all fail, naming it, and the group is broken. */
static int chk_ar_outstanding(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    const int size = comm_size(c);
    enum { K = 5, KP = 2, LEN = 1000, NMB = 5 };
    const size_t ns[K] = {300007, 5, 0, 70001, 1}, nps[KP] = {131075, 3};
    int *world = malloc((size_t)size * sizeof *world);
    PD_ASSERT(world);
    for (int j = 0; j < size; j++) world[j] = j;
    int pair[2] = {rank & ~1, (rank & ~1) + 1}, np = pair[1] < size ? 2 : 1;
    if (np == 1) pair[0] = rank;
    CommGroup *gw = NULL, *gp = NULL;
    CHECK_OK(comm_group_new(c, world, size, &gw, &err), err);
    CHECK_OK(comm_group_new(c, pair, np, &gp, &err), err);
    float *bw[K], *bp[KP];
    CommAr *aw[K] = {0}, *ap[KP] = {0};
    for (int k = 0; k < K; k++) {
        bw[k] = pd_alloc_f32(ns[k] + 1);
        chk_rand(bw[k], ns[k], rank, 300 + k);
        CHECK_OK(comm_group_iallreduce(gw, bw[k], ns[k], (CommOp)(k % 2), &aw[k], &err), err);
        if (k < KP) {
            bp[k] = pd_alloc_f32(nps[k] + 1);
            chk_rand(bp[k], nps[k], rank, 400 + k);
            CHECK_OK(comm_group_iallreduce(gp, bp[k], nps[k], COMM_SUM, &ap[k], &err), err);
        }
    }
    /* point to point meanwhile, on minibatch tags */
    const int64_t w = comm_tag_window(c), mbs[NMB] = {0, 1, w - 1, w + 5, (int64_t)1 << 40};
    const int to = (rank + 1) % size, from = (rank + size - 1) % size;
    float *out = pd_alloc_f32((size_t)NMB * LEN), *in = pd_alloc_f32((size_t)NMB * LEN);
    CommReq *rq[NMB] = {0}, *sq[NMB] = {0};
    for (int i = 0; i < NMB; i++)
        CHECK_OK(comm_irecv(c, from, COMM_GRAD, mbs[i], shape1(LEN), in + (size_t)i * LEN, &rq[i], &err), err);
    for (int i = 0; i < NMB; i++) {
        chk_fill(out + (size_t)i * LEN, LEN, rank, COMM_GRAD, mbs[i]);
        CHECK_OK(comm_isend(c, to, COMM_GRAD, mbs[i], i, shape1(LEN), out + (size_t)i * LEN, &sq[i], &err), err);
    }
    for (int i = NMB - 1; i >= 0; i--) {
        CHECK_OK(comm_wait(c, &rq[i], 30, NULL, &err), err);
        long bad = chk_bad(in + (size_t)i * LEN, LEN, from, COMM_GRAD, mbs[i]);
        CHECK(bad < 0, "gradient of minibatch %" PRId64 ": element %ld wrong", mbs[i], bad);
    }
    for (int i = 0; i < NMB; i++) CHECK_OK(comm_wait(c, &sq[i], 30, NULL, &err), err);
    pd_free(out);
    pd_free(in);
    /* the pair's second one, by polling */
    int done = 0;
    for (double t0 = pd_now(); !done && pd_now() - t0 < 60;) CHECK_OK(comm_ar_test(ap[1], &done, &err), err);
    CHECK(done, "pair all-reduce not done after 60 s of comm_ar_test");
    CHECK_OK(comm_ar_wait(&ap[1], 10, &err), err);
    CHECK(ap[1] == NULL, "wait frees");
    for (int k = K - 1; k >= 0; k--) CHECK_OK(comm_ar_wait(&aw[k], 30, &err), err);
    CHECK_OK(comm_ar_wait(&ap[0], 30, &err), err);
    int rc = PD_OK;
    for (int k = 0; k < K + KP && !rc; k++) {
        const int isw = k < K;
        const size_t n = isw ? ns[k] : nps[k - K];
        float *want = pd_alloc_f32(n + 1);
        chk_expect(isw ? world : pair, isw ? size : np, n, isw ? (CommOp)(k % 2) : COMM_SUM, isw ? 300 + k : 400 + k - K,
                   want, NULL);
        size_t first = chk_first_diff(isw ? bw[k] : bp[k - K], want, n);
        pd_free(want);
        if (first < n) {
            fprintf(stderr, "rank %d: %s all-reduce %d (%zu floats): element %zu differs from comm_sum_serial\n", rank,
                    isw ? "world" : "pair", isw ? k : k - K, n, first);
            rc = PD_EINVAL;
        }
    }
    for (int k = 0; k < K; k++) pd_free(bw[k]);
    for (int k = 0; k < KP; k++) pd_free(bp[k]);
    if (rc) return rc;
    /* members disagreeing on the op: every member fails, naming it; the group is broken */
    if (size > 1) {
        float x[9] = {0};
        CommAr *a = NULL;
        CHECK_OK(comm_group_iallreduce(gw, x, 9, rank == size - 1 ? COMM_MEAN : COMM_SUM, &a, &err), err);
        rc = comm_ar_wait(&a, 30, &err);
        CHECK(rc == PD_ECOMM && a == NULL && strstr(err.msg, "disagree on size or op") && strstr(err.msg, "op "),
              "rc %d: %s", rc, err.msg);
        rc = comm_group_iallreduce(gw, x, 9, COMM_SUM, &a, &err);
        CHECK(rc == PD_ECOMM && a == NULL && strstr(err.msg, "broken group") && strstr(err.msg, "disagree"), "rc %d: %s",
              rc, err.msg);
    }
    comm_group_free(gp);
    comm_group_free(gw);
    free(world);
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

/* comm_bytes_sent: an all-reduce of n floats by group rank g of r adds exactly
 * 4 (2n - len(g) - len(g + 1)) + 24 (r - 1) bytes (pieces and notices), within 8 bytes of
 * 2 (r - 1) / r * 4n + 24 (r - 1); a data message adds 64 + 4 count, a control message 64 + n. */
static int chk_ar_bytes(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    const int size = comm_size(c);
    int *ranks = malloc((size_t)size * sizeof *ranks);
    PD_ASSERT(ranks);
    const int rs[3] = {size, size > 1 ? 2 : 1, 1};
    for (int t = 0; t < 3; t++) {
        const int r = rs[t];
        chk_ar_list(size, r, t == 1, ranks);
        if (r == 1) ranks[0] = rank;   /* everyone, alone */
        if (!chk_in(ranks, r, rank)) continue;
        CommGroup *g = NULL;
        CHECK_OK(comm_group_new(c, ranks, r, &g, &err), err);
        const int me = comm_group_rank(g);
        const size_t sizes[3] = {1000003, 5, 0};
        for (int si = 0; si < 3; si++) {
            const size_t n = sizes[si];
            float *x = pd_alloc_f32(n + 1);
            const uint64_t b0 = comm_bytes_sent(c);
            CHECK_OK(comm_group_allreduce(g, x, n, COMM_SUM, &err), err);
            const uint64_t got = comm_bytes_sent(c) - b0;
            pd_free(x);
            const size_t len_me = comm_ar_chunk(n, r, me + 1) - comm_ar_chunk(n, r, me);
            const int nx = (me + 1) % r;
            const size_t len_next = comm_ar_chunk(n, r, nx + 1) - comm_ar_chunk(n, r, nx);
            const uint64_t want = r == 1 ? 0 : 4 * (2 * (uint64_t)n - len_me - len_next) + 24 * (uint64_t)(r - 1);
            CHECK(got == want, "group of %d, %zu floats: %" PRIu64 " bytes sent, want %" PRIu64, r, n, got, want);
            const double ideal = 2.0 * (r - 1) / r * 4.0 * (double)n + 24.0 * (r - 1);
            CHECK(fabs((double)got - ideal) <= 8, "group of %d, %zu floats: %" PRIu64 " bytes, ideal %.1f", r, n, got,
                  ideal);
            if (rank == 0 && si == 0 && getenv("PD_COMM_VERBOSE"))
                printf("ar_bytes: group of %d, %zu floats: %" PRIu64 " bytes sent by rank 0 (2(r-1)/r * 4n = %.0f)\n", r,
                       n, got, 2.0 * (r - 1) / r * 4.0 * (double)n);
        }
        comm_group_free(g);
    }
    free(ranks);
    CHECK_OK(comm_barrier(c, &err), err);
    /* a data message and a control message, to the next rank */
    const int to = (rank + 1) % size, from = (rank + size - 1) % size;
    float x[10] = {0}, y[10];
    unsigned char m[5] = {1, 2, 3, 4, 5}, mm[5];
    CommReq *rq = NULL, *sq = NULL;
    CHECK_OK(comm_irecv(c, from, COMM_ACT, 77, shape1(10), y, &rq, &err), err);
    uint64_t b0 = comm_bytes_sent(c);
    CHECK_OK(comm_isend(c, to, COMM_ACT, 77, 0, shape1(10), x, &sq, &err), err);
    CHECK(comm_bytes_sent(c) - b0 == 64 + 40, "data message: %" PRIu64 " bytes", comm_bytes_sent(c) - b0);
    CHECK_OK(comm_wait(c, &rq, 30, NULL, &err), err);
    CHECK_OK(comm_wait(c, &sq, 30, NULL, &err), err);
    b0 = comm_bytes_sent(c);   /* even ranks to the next one */
    if (rank % 2 == 0 && rank + 1 < size) {
        CHECK_OK(comm_ctrl_send(c, rank + 1, 11, m, 5, 30, &err), err);
        CHECK(comm_bytes_sent(c) - b0 == 64 + 5, "control message: %" PRIu64 " bytes", comm_bytes_sent(c) - b0);
    }
    if (rank % 2 == 1) CHECK_OK(comm_ctrl_recv(c, rank - 1, 11, mm, 5, NULL, 30, &err), err);
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

/* A member that starts late is named by every other member within the deadline (not just
 * by its ring neighbour); the all-reduce stays pending, completes once it comes, and is
 * right. */
static int chk_ar_timeout(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    const int size = comm_size(c);
    if (size < 2) return PD_OK;
    const int late = 1;
    const double T = 0.5;
    const size_t n = 100003;
    int *world = malloc((size_t)size * sizeof *world);
    PD_ASSERT(world);
    for (int j = 0; j < size; j++) world[j] = j;
    CommGroup *g = NULL;
    CHECK_OK(comm_group_new(c, world, size, &g, &err), err);
    float *x = pd_alloc_f32(n), *want = pd_alloc_f32(n);
    chk_rand(x, n, rank, 77);
    chk_expect(world, size, n, COMM_SUM, 77, want, NULL);
    CommAr *a = NULL;
    if (rank != late) {
        CHECK_OK(comm_group_iallreduce(g, x, n, COMM_SUM, &a, &err), err);
        double t0 = pd_now();
        int rc = comm_ar_wait(&a, T, &err);
        double dt = pd_now() - t0;
        char who[64];
        snprintf(who, sizeof who, "waiting for rank %d (group rank %d), which has not started it", late, late);
        CHECK(rc == PD_ECOMM && a != NULL && strstr(err.msg, "timed out") && strstr(err.msg, who) &&
                  strstr(err.msg, "all-reduce #0 of 100003 floats"),
              "rc %d: %s", rc, err.msg);
        CHECK(dt >= T, "returned after %.3f s for a %g s deadline", dt, T);
    }
    CHECK_OK(comm_barrier(c, &err), err);
    if (rank == late) CHECK_OK(comm_group_iallreduce(g, x, n, COMM_SUM, &a, &err), err);
    CHECK_OK(comm_ar_wait(&a, 30, &err), err);
    size_t first = chk_first_diff(x, want, n);
    pd_free(x);
    pd_free(want);
    CHECK(first == n, "late all-reduce: element %zu differs from comm_sum_serial", first);
    comm_group_free(g);
    free(world);
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

/* Groups of one (nothing moves, nothing is counted, the bits stay, MEAN too), bad
 * arguments, NULL handles; and a cancelled all-reduce breaks its group on every member. */
static int chk_ar_single(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    const int me[1] = {rank};
    CommGroup *g = NULL;
    CHECK_OK(comm_group_new(c, me, 1, &g, &err), err);
    const size_t sizes[3] = {0, 1, 1001};
    for (int si = 0; si < 3; si++)
        for (int op = 0; op < COMM_OP_COUNT; op++) {
            const size_t n = sizes[si];
            float *x = pd_alloc_f32(n + 1), *y = pd_alloc_f32(n + 1);
            chk_rand(x, n, rank, 5);
            if (n) memcpy(y, x, n * sizeof *x);
            uint64_t b0 = comm_bytes_sent(c);
            CommAr *a = NULL;
            int done = 0;
            CHECK_OK(comm_group_iallreduce(g, x, n, (CommOp)op, &a, &err), err);
            CHECK_OK(comm_ar_test(a, &done, &err), err);
            CHECK(done, "a group of one is done at once");
            CHECK_OK(comm_ar_wait(&a, 1, &err), err);
            CHECK_OK(comm_group_allreduce(g, x, n, (CommOp)op, &err), err);
            CHECK(a == NULL && comm_bytes_sent(c) == b0, "bytes sent by a group of one");
            CHECK(n == 0 || !memcmp(x, y, n * sizeof *x), "a group of one changed the data (n %zu op %d)", n, op);
            pd_free(x);
            pd_free(y);
        }
    float x[4] = {0};
    CommAr *a = (CommAr *)1;
    int rc = comm_group_iallreduce(g, x, 4, COMM_OP_COUNT, &a, &err);
    CHECK(rc == PD_EINVAL && a == NULL && strstr(err.msg, "unknown op"), "rc %d: %s", rc, err.msg);
    rc = comm_group_iallreduce(g, NULL, 4, COMM_SUM, &a, &err);
    CHECK(rc == PD_EINVAL && a == NULL && strstr(err.msg, "NULL"), "rc %d: %s", rc, err.msg);
    CHECK_OK(comm_ar_wait(&a, 1, &err), err);   /* NULL: nothing to do */
    comm_ar_cancel(&a);
    comm_group_free(g);
    /* Cancelled before it finished: the group is broken. Rank 0 starts one and cancels it
     * before the others start (it cannot have finished: their notices are missing); then
     * the others start theirs, which cannot finish (rank 0 will not pass its part), time
     * out, and are cancelled in turn. (A cancel after the end just frees the handle.) */
    const int size = comm_size(c);
    if (size > 1) {
        int *world = malloc((size_t)size * sizeof *world);
        PD_ASSERT(world);
        for (int j = 0; j < size; j++) world[j] = j;
        CHECK_OK(comm_group_new(c, world, size, &g, &err), err);
        free(world);
        if (rank == 0) {
            CHECK_OK(comm_group_iallreduce(g, x, 4, COMM_SUM, &a, &err), err);
            comm_ar_cancel(&a);
            CHECK(a == NULL, "cancel frees");
        }
        CHECK_OK(comm_barrier(c, &err), err);
        if (rank != 0) {
            CHECK_OK(comm_group_iallreduce(g, x, 4, COMM_SUM, &a, &err), err);
            rc = comm_ar_wait(&a, 0.3, &err);
            CHECK(rc == PD_ECOMM && a != NULL && strstr(err.msg, "timed out"), "rc %d: %s", rc, err.msg);
            comm_ar_cancel(&a);
        }
        err = (Err){0};
        rc = comm_group_iallreduce(g, x, 4, COMM_SUM, &a, &err);
        CHECK(rc == PD_ECOMM && a == NULL && strstr(err.msg, "broken") && strstr(err.msg, "cancelled"), "rc %d: %s",
              rc, err.msg);
        CHECK_OK(comm_barrier(c, &err), err);
        comm_group_free(g);
    }
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

/* Busy "compute" for seconds of wall time, calling nothing of comm (a layer's backward). */
static inline double chk_compute(double seconds) {
    volatile double x = 0;
    for (double t0 = pd_now(); pd_now() - t0 < seconds;)
        for (int i = 0; i < 2000; i++) x = x + (double)i * 1e-9;
    return x;
}

/* Gradient buckets: K all-reduces of mixed sizes (empty, tiny, several pieces per chunk)
 * started one by one with compute in between (its length differs by rank and bucket, so
 * timing differs everywhere), then the caller computes. With a progress thread
 * (comm_ar_progress_thread) nothing but comm_ar_test, which then only looks, is called
 * until all have finished: the thread alone must finish them. Without one, comm_ar_test
 * moves them. Completed in a shuffled order; each is bitwise comm_sum_serial. */
static int chk_ar_background(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    const int size = comm_size(c);
    enum { K = 24 };
    int *world = malloc((size_t)size * sizeof *world);
    PD_ASSERT(world);
    for (int j = 0; j < size; j++) world[j] = j;
    CommGroup *g = NULL;
    CHECK_OK(comm_group_new(c, world, size, &g, &err), err);
    const int bg = comm_ar_progress_thread(c);
    size_t n[K];
    float *x[K];
    CommAr *a[K] = {0};
    for (int k = 0; k < K; k++) {
        n[k] = k % 4 == 0 ? 70001 + (size_t)k : k % 4 == 1 ? (size_t)k / 4 : k % 4 == 2 ? 300007 - (size_t)k : 4099;
        x[k] = pd_alloc_f32(n[k] + 1);
        chk_rand(x[k], n[k], rank, 600 + k);
        chk_compute(1e-4 * (double)((rank * 7 + k * 3) % 5));
        CHECK_OK(comm_group_iallreduce(g, x[k], n[k], (CommOp)(k % 2), &a[k], &err), err);
    }
    int all = 0;
    for (double t0 = pd_now(); !all && pd_now() - t0 < 60;) {
        chk_compute(2e-3);
        all = 1;
        for (int k = 0; k < K; k++) {
            int done = 0;
            CHECK_OK(comm_ar_test(a[k], &done, &err), err);
            all &= done;
        }
    }
    CHECK(all, "%d all-reduces not finished after 60 s (%s)", K,
          bg ? "progress thread: only it could move them" : "moved by comm_ar_test");
    int rc = PD_OK;
    for (int i = 0; i < K; i++) {
        const int k = (i * 7) % K;   /* 7 and 24 are coprime: every k once */
        CHECK_OK(comm_ar_wait(&a[k], 30, &err), err);
        float *want = pd_alloc_f32(n[k] + 1);
        chk_expect(world, size, n[k], (CommOp)(k % 2), 600 + k, want, NULL);
        size_t first = chk_first_diff(x[k], want, n[k]);
        pd_free(want);
        if (first < n[k]) {
            fprintf(stderr, "rank %d: bucket %d (%zu floats): element %zu differs from comm_sum_serial\n", rank, k, n[k],
                    first);
            rc = PD_EINVAL;
        }
    }
    for (int k = 0; k < K; k++) pd_free(x[k]);
    comm_group_free(g);
    free(world);
    if (rc) return rc;
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

/* A member that does not come while all-reduces are in flight (on the progress thread where
 * there is one): the others time out within the deadline naming it, then free the group
 * with them still running: each then ends "its group was freed" (the thread lets go of
 * them) and its handle is freed by comm_ar_wait. The late member starts its copy after the
 * barrier and cancels it (its group is broken too, so no member frees a communicator with
 * messages in flight). Then the comm works on: a fresh group all-reduces exactly. */
static int chk_ar_abandon(Comm *c, int rank, void *arg) {
    (void)arg;
    Err err = {0};
    const int size = comm_size(c);
    if (size < 2) return PD_OK;
    const int late = size - 1;
    const double T = 0.3;
    enum { K = 3 };
    const size_t n = 100003;
    int *world = malloc((size_t)size * sizeof *world);
    PD_ASSERT(world);
    for (int j = 0; j < size; j++) world[j] = j;
    CommGroup *g = NULL;
    CHECK_OK(comm_group_new(c, world, size, &g, &err), err);
    float *x = pd_alloc_f32((size_t)K * n);
    chk_rand(x, (size_t)K * n, rank, 91);
    CommAr *a[K] = {0};
    if (rank != late) {
        for (int k = 0; k < K; k++) CHECK_OK(comm_group_iallreduce(g, x + (size_t)k * n, n, COMM_SUM, &a[k], &err), err);
        double t0 = pd_now();
        int rc = comm_ar_wait(&a[K - 1], T, &err);
        double dt = pd_now() - t0;
        char who[96];
        snprintf(who, sizeof who, "waiting for rank %d (group rank %d), which has not started it", late, late);
        CHECK(rc == PD_ECOMM && a[K - 1] != NULL && strstr(err.msg, "timed out") && strstr(err.msg, who),
              "rc %d: %s", rc, err.msg);
        CHECK(dt >= T, "returned after %.3f s for a %g s deadline", dt, T);
        comm_group_free(g);   /* with all K still running */
        for (int k = 0; k < K; k++) {
            err = (Err){0};
            rc = comm_ar_wait(&a[k], 5, &err);
            CHECK(rc == PD_ECOMM && a[k] == NULL && strstr(err.msg, "its group was freed"), "#%d: rc %d: %s", k, rc,
                  err.msg);
        }
    }
    CHECK_OK(comm_barrier(c, &err), err);
    if (rank == late) {
        CHECK_OK(comm_group_iallreduce(g, x, n, COMM_SUM, &a[0], &err), err);
        comm_ar_cancel(&a[0]);
        comm_group_free(g);
    }
    pd_free(x);
    CHECK_OK(comm_barrier(c, &err), err);
    CHECK_OK(comm_group_new(c, world, size, &g, &err), err);
    int rc = chk_ar_one(c, g, world, 70001, COMM_MEAN, 92, 1);
    comm_group_free(g);
    free(world);
    if (rc) return rc;
    return comm_barrier(c, &err) == PD_OK ? PD_OK : PD_EINVAL;
}

typedef struct ChkCase {
    const char *name;
    CommWorkerFn fn;
} ChkCase;

static const ChkCase CHK_CASES[] = {
    {"pingpong", chk_pingpong},       {"out_of_order", chk_out_of_order}, {"posted_first", chk_posted_first},
    {"mismatch", chk_mismatch},       {"deadline", chk_deadline},         {"allreduce", chk_allreduce},
    {"agree", chk_agree},             {"many", chk_many},                 {"bad_args", chk_bad_args},
    {"ctrl_bytes", chk_ctrl_bytes},   {"ctrl_channels", chk_ctrl_channels}, {"ctrl_vs_data", chk_ctrl_vs_data},
    {"ctrl_oversize", chk_ctrl_oversize}, {"ctrl_timeout", chk_ctrl_timeout}, {"bcast", chk_bcast},
    {"gather", chk_gather},           {"agree_t", chk_agree_t},           {"coll_timeout", chk_coll_timeout},
    {"group_lists", chk_group_lists}, {"ctrl_bad_args", chk_ctrl_bad_args},
    {"ar_exact", chk_ar_exact},       {"ar_outstanding", chk_ar_outstanding}, {"ar_bytes", chk_ar_bytes},
    {"ar_timeout", chk_ar_timeout},   {"ar_single", chk_ar_single},       {"ar_background", chk_ar_background},
    {"ar_abandon", chk_ar_abandon},
};
enum { CHK_NCASES = sizeof CHK_CASES / sizeof CHK_CASES[0] };

/* The case called name (tests refer to cases by name). */
static inline const ChkCase *chk_case(const char *name) {
    for (int i = 0; i < CHK_NCASES; i++)
        if (!strcmp(CHK_CASES[i].name, name)) return &CHK_CASES[i];
    PD_ASSERTF(0, "no check called %s", name);
    return NULL;
}

#endif
