/* comm_checks.h: the transport checks shared by tests/test_comm.c (threads transport, under
 * cmocka) and tests/test_comm_mpi.c (MPI, under mpirun): the same functions run on every
 * rank of either transport, so both are held to the same semantics. Each check is a
 * CommWorkerFn: it returns PD_OK, or prints "rank R: <check>: <what>" on stderr and returns
 * PD_EINVAL. They need 4 ranks. Oracles: payloads are a pure function of (source, kind, mb,
 * index); all-reduce is compared bitwise with comm_sum_serial in group rank order. */
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
        CHECK(dt >= 0.2 && dt < 1.5, "timed out after %.3f s for a 0.2 s deadline", dt);
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
static void chk_rand(float *x, size_t n, int world_rank, int salt) {
    Rng r;
    rng_init(&r, 1234, (uint64_t)salt, (uint64_t)world_rank);
    for (size_t i = 0; i < n; i++) x[i] = rng_normal(&r) * ldexpf(1.0f, (int)rng_below(&r, 24) - 12);
}

/* One all-reduce of n floats on g, checked bitwise against the serial rank-order sum of
 * every member's data (regenerated here from the members' world ranks). */
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
    CHECK(first == n, "all-reduce of %zu floats op %d: element %zu: got %.9g, serial rank-order sum %.9g", n, (int)op,
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

typedef struct ChkCase {
    const char *name;
    CommWorkerFn fn;
} ChkCase;

static const ChkCase CHK_CASES[] = {
    {"pingpong", chk_pingpong},       {"out_of_order", chk_out_of_order}, {"posted_first", chk_posted_first},
    {"mismatch", chk_mismatch},       {"deadline", chk_deadline},         {"allreduce", chk_allreduce},
    {"agree", chk_agree},             {"many", chk_many},                 {"bad_args", chk_bad_args},
};
enum { CHK_NCASES = sizeof CHK_CASES / sizeof CHK_CASES[0] };

#endif
