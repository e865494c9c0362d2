/* test_comm_mpi.c: the comm module over MPI. Run plainly (as ctest does), it re-launches
 * itself under `mpirun -np 4 --oversubscribe` and passes if every rank passed; under mpirun
 * (OMPI_COMM_WORLD_SIZE is set) each rank runs the checks of tests/mpi/comm_checks.h, the
 * same ones test_comm.c runs over threads (ping-pong, out-of-order tags, receives posted
 * first, mismatched headers, deadline expiry, all-reduce bitwise equal to the serial
 * rank-order sum, agree, 1000 messages in flight, bad arguments; the control plane: byte
 * round trips, channels, control vs data tags, oversize messages, timeouts naming the late
 * rank, broadcast, gather, agree_t, recovery after a late rank, group lists, bad
 * arguments), all on one comm one after the other, and the ranks agree on the outcome.
 * Skips (exit 0, "SKIP" on stdout) if /usr/bin/mpirun is missing.
 *
 * PD_COMM_BENCH=1 test_comm_mpi: ping-pong latency and bandwidth between 2 ranks for 4 KB,
 * 256 KB and 4 MB messages, through comm (header + payload) and through raw MPI_Send/Recv. */
#include "testutil.h"

#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mpi/comm_checks.h"

#define MPIRUN "/usr/bin/mpirun"

/* ---- under mpirun ------------------------------------------------------------------ */

static int run_checks(Comm *c) {
    const int rank = comm_rank(c);
    int failed = 0;
    if (comm_size(c) != CHK_NRANKS || strcmp(comm_name(c), "mpi")) {
        fprintf(stderr, "rank %d: need %d MPI ranks, got %d (%s)\n", rank, CHK_NRANKS, comm_size(c), comm_name(c));
        return 1;
    }
    for (int i = 0; i < CHK_NCASES; i++) {
        double t0 = pd_now();
        int rc = CHK_CASES[i].fn(c, rank, NULL);
        int all = comm_agree(c, rc);
        if (rank == 0) printf("%-4s %-14s %.3f s\n", all ? "FAIL" : "ok", CHK_CASES[i].name, pd_now() - t0);
        fflush(stdout);
        failed |= all != PD_OK;
    }
    return failed;
}

/* Ping-pong between ranks 0 and 1: half the round-trip time, rank 0's view. */
static int run_bench(Comm *c) {
    const int rank = comm_rank(c);
    if (comm_size(c) != 2) return 1;
    const size_t sizes[3] = {4096, 256 * 1024, 4 * 1024 * 1024};
    const int iters[3] = {4000, 1000, 100};
    float *x = pd_alloc_f32(sizes[2] / 4), *y = pd_alloc_f32(sizes[2] / 4);
    Err err = {0};
    if (rank == 0) printf("%-9s %-8s %12s %12s\n", "path", "bytes", "latency_us", "GB/s");
    for (int s = 0; s < 3; s++) {
        const int n = (int)(sizes[s] / 4), warm = iters[s] / 10;
        for (int path = 0; path < 2; path++) {
            double t0 = 0;
            for (int it = 0; it < warm + iters[s]; it++) {
                if (it == warm) {
                    MPI_Barrier(MPI_COMM_WORLD);
                    t0 = pd_now();
                }
                CommReq *sq = NULL, *rq = NULL;
                int rc = PD_OK;
                if (path == 0 && rank == 0) {
                    rc |= comm_irecv(c, 1, COMM_GRAD, it, shape1(n), y, &rq, &err);
                    rc |= comm_isend(c, 1, COMM_ACT, it, 0, shape1(n), x, &sq, &err);
                    rc |= comm_wait(c, &sq, 30, NULL, &err);
                    rc |= comm_wait(c, &rq, 30, NULL, &err);
                } else if (path == 0) {
                    rc |= comm_irecv(c, 0, COMM_ACT, it, shape1(n), y, &rq, &err);
                    rc |= comm_wait(c, &rq, 30, NULL, &err);
                    rc |= comm_isend(c, 0, COMM_GRAD, it, 0, shape1(n), y, &sq, &err);
                    rc |= comm_wait(c, &sq, 30, NULL, &err);
                } else if (rank == 0) {
                    MPI_Send(x, n, MPI_FLOAT, 1, 7, MPI_COMM_WORLD);
                    MPI_Recv(y, n, MPI_FLOAT, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else {
                    MPI_Recv(y, n, MPI_FLOAT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(y, n, MPI_FLOAT, 0, 7, MPI_COMM_WORLD);
                }
                if (rc) {
                    fprintf(stderr, "rank %d: bench: %s\n", rank, err.msg);
                    return 1;
                }
            }
            double half = (pd_now() - t0) / iters[s] / 2;
            if (rank == 0)
                printf("%-9s %-8zu %12.2f %12.3f\n", path ? "raw-MPI" : "comm", sizes[s], half * 1e6,
                       (double)sizes[s] / half * 1e-9);
        }
    }
    pd_free(x);
    pd_free(y);
    return 0;
}

static int mpi_main(int argc, char **argv, int bench) {
    Err err = {0};
    Comm *c = NULL;
    if (comm_mpi_create(&argc, &argv, &c, &err)) {
        fprintf(stderr, "comm_mpi_create: %s\n", err.msg);
        return 1;
    }
    comm_set_coll_timeout(c, 60);   /* a broken check fails instead of hanging the test */
    int failed = bench ? run_bench(c) : run_checks(c);
    comm_free(c);
    return failed;
}

/* ---- launcher ---------------------------------------------------------------------- */

static int launch(int np, int timeout_s) {
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        perror("readlink /proc/self/exe");
        return 1;
    }
    self[len] = 0;
    char nps[16];
    snprintf(nps, sizeof nps, "%d", np);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
        /* Open MPI's own allocations are not ours to police (LeakSanitizer, sanitizer builds) */
        setenv("LSAN_OPTIONS", "detect_leaks=0", 0);
        char *args[] = {"mpirun", "-np", nps, "--oversubscribe", self, NULL};
        execv(MPIRUN, args);
        perror("execv " MPIRUN);
        _exit(127);
    }
    double t0 = pd_now();
    for (;;) {
        int st = 0;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) {
            if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
            fprintf(stderr, "mpirun -np %d %s: %s %d\n", np, self, WIFEXITED(st) ? "exit status" : "signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            return 1;
        }
        if (pd_now() - t0 > timeout_s) {
            fprintf(stderr, "mpirun -np %d: no result after %d s: killing it\n", np, timeout_s);
            kill(pid, SIGTERM);
            nanosleep(&(struct timespec){2, 0}, NULL);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return 1;
        }
        nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
}

int main(int argc, char **argv) {
    const int bench = getenv("PD_COMM_BENCH") && atoi(getenv("PD_COMM_BENCH"));
    if (getenv("OMPI_COMM_WORLD_SIZE")) return mpi_main(argc, argv, bench);
    if (access(MPIRUN, X_OK) != 0) {
        printf("SKIP: %s not found\n", MPIRUN);
        return 0;
    }
    double t0 = pd_now();
    int rc = launch(bench ? 2 : CHK_NRANKS, 120);
    printf("%s: mpirun run %s in %.1f s\n", argv[0], rc ? "FAILED" : "passed", pd_now() - t0);
    return rc;
}
