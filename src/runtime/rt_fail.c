/* rt_fail.c: naming a lost rank under MPI. When a rank dies, mpirun sends SIGTERM to the
 * others. Each rank's handler then says who it is, which ranks are gone (probing the pids
 * every rank shared at start-up, meaningful on this host: no such process, or a zombie that
 * its killed parent has not reaped) with their stages, and the newest agreed checkpoint to
 * resume from; then it waits LINGER_NS and exits 1. The wait keeps a rank that is only
 * stopping visible to the others' probes, whose SIGTERM may come later (a loaded machine),
 * so that they do not name it lost with the one that died; mpirun's SIGKILL comes after 1 s.
 * Everything the handler prints is prepared beforehand (async-signal-safe: write, kill, open,
 * read, nanosleep, _exit). Under the threads transport (one process) nothing is installed. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rt_impl.h"

#define FAIL_MAX_RANKS 1024
#define LINGER_NS 300000000L
static volatile sig_atomic_t g_n;
static pid_t g_pid[FAIL_MAX_RANKS];
static int g_stage[FAIL_MAX_RANKS];
static int g_rank = -1;
static char g_ckpt[4200] = "none";

static size_t put_int(char *b, long v) {
    char t[24];
    size_t n = 0, k = 0;
    if (v < 0) b[k++] = '-', v = -v;
    do t[n++] = (char)('0' + v % 10), v /= 10; while (v);
    while (n) b[k++] = t[--n];
    return k;
}

static size_t put_str(char *b, const char *s) {
    size_t k = 0;
    while (s[k]) b[k] = s[k], k++;
    return k;
}

/* Is process pid gone: none such, or a zombie (state Z or X in /proc/PID/stat)? Async-signal-
 * safe. */
int rt_fail_pid_gone(pid_t pid) {
    if (kill(pid, 0) != 0) return errno == ESRCH;
    char path[40], b[512];
    size_t k = put_str(path, "/proc/");
    k += put_int(path + k, (long)pid);
    k += put_str(path + k, "/stat");
    path[k] = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return errno == ENOENT;
    ssize_t n = read(fd, b, sizeof b - 1);
    close(fd);
    if (n <= 0) return 0;
    const char *st = NULL;   /* "PID (COMM) S ...": the state follows the last ')' */
    for (ssize_t i = 0; i < n; i++)
        if (b[i] == ')') st = b + i;
    return st && st + 2 < b + n && (st[2] == 'Z' || st[2] == 'X');
}

static void on_term(int sig) {
    char b[6000];
    size_t k = 0;
    k += put_str(b + k, "pipedream: rank ");
    k += put_int(b + k, g_rank);
    k += put_str(b + k, " (stage ");
    k += put_int(b + k, g_rank >= 0 && g_rank < FAIL_MAX_RANKS ? g_stage[g_rank] : -1);
    k += put_str(b + k, "): stopping on signal ");
    k += put_int(b + k, sig);
    int lost = 0;
    for (int r = 0; r < g_n && k < sizeof b - 4400; r++) {
        if (g_pid[r] <= 0 || r == g_rank) continue;
        if (rt_fail_pid_gone(g_pid[r])) {
            k += put_str(b + k, lost++ ? ", " : ": lost ");
            k += put_str(b + k, "rank ");
            k += put_int(b + k, r);
            k += put_str(b + k, " (stage ");
            k += put_int(b + k, g_stage[r]);
            k += put_str(b + k, ")");
        }
    }
    if (!lost) k += put_str(b + k, ": the job is ending (a rank failed or mpirun was interrupted)");
    k += put_str(b + k, "; last checkpoint to resume from: ");
    for (size_t i = 0; g_ckpt[i] && k < sizeof b - 2; i++) b[k++] = g_ckpt[i];
    b[k++] = '\n';
    ssize_t wr = write(2, b, k);
    (void)wr;
    struct timespec linger = {0, LINGER_NS};
    nanosleep(&linger, NULL);
    _exit(1);
}

int rt_fail_setup(Comm *c, const Schedule *s, double timeout_s, Err *err) {
    int n = comm_size(c), me = comm_rank(c);
    if (strcmp(comm_name(c), "mpi") != 0 || n > FAIL_MAX_RANKS) return PD_OK;
    int64_t *pids = calloc((size_t)n, sizeof *pids);
    PD_ASSERT(pids);
    int64_t mine = (int64_t)getpid();
    int rc = comm_gather_i64(c, 0, &mine, 1, pids, timeout_s, err);
    if (!rc) rc = comm_bcast_i64(c, 0, pids, n, timeout_s, err);
    if (!rc) {
        for (int r = 0; r < n; r++) {
            g_pid[r] = (pid_t)pids[r];
            g_stage[r] = r < s->n_ranks ? s->workers[r].stage : -1;
        }
        g_rank = me;
        g_n = n;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_term;
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
    }
    free(pids);
    return rc;
}

void rt_fail_set_checkpoint(const char *path) {
    /* not async-signal-safe against the handler mid-copy, but the handler only reads bytes up
     * to a NUL that is always present */
    size_t n = strlen(path);
    if (n >= sizeof g_ckpt) n = sizeof g_ckpt - 1;
    g_ckpt[n] = 0;
    memcpy(g_ckpt, path[0] ? path : "none", path[0] ? n : 5);
}
