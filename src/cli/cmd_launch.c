/* cmd_launch.c: `pipedream launch`: elastic training over the hosts of a hostfile. Plans for
 * the hosts alive (one worker each), runs `mpirun ... pipedream train --plan ... --checkpoint-*`
 * and supervises it: when the job fails, it names the lost host (the runtime's "lost rank"
 * lines, rank i runs on the i-th host of the attempt's hostfile; then a probe of each host),
 * drops it, plans again for the hosts left and relaunches with --resume from the last
 * checkpoint. When the hostfile changes, hosts listed and answering are taken in at the next
 * checkpoint if the planner predicts a gain (the job restarts from there). Stragglers (a host
 * computing slower than its prediction; a slow link, found by probing the links when the
 * pipeline runs slower than predicted) are reported and planned around the same way. Every
 * membership change goes to the event log (JSON lines) and the summary. */
#define _DEFAULT_SOURCE   /* usleep, realpath, setpgid, getline */
#include "choose.h"
#include "cli.h"
#include "comm.h"
#include "plan.h"
#include "profile.h"
#include "search.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dirent.h>

#define MAX_HOSTS 256
#define MAX_ARGS 512

static void help(FILE *f) {
    fprintf(f,
            "usage: pipedream launch --hosts HOSTFILE --profile PROFILE.json --run-dir DIR\n"
            "                        [--checkpoint-every N] [--min-hosts K] [--bandwidth B]\n"
            "                        [--events FILE.jsonl] [--mpirun-args \"ARGS\"] [--probe-timeout S]\n"
            "                        [--grace S] [--max-restarts R] [--straight] [--mpirun PATH]\n"
            "                        [--straggler-factor F | --no-stragglers] [--no-replan]\n"
            "                        MODEL.json [-- TRAIN_FLAGS...]\n\n"
            "Trains MODEL.json over the hosts of an Open MPI hostfile (lines \"host [slots=N]\",\n"
            "# comments), one worker per host, and keeps training when hosts fail: it plans the\n"
            "stages for the hosts alive, runs mpirun ... pipedream train --plan DIR/plan-K.json\n"
            "--checkpoint-every N --checkpoint-dir DIR/ckpt, and when the job fails it names the\n"
            "failed host, drops it, plans again for the hosts left and resumes from the last\n"
            "checkpoint. It stops when training completes (exit 0) or fewer than --min-hosts\n"
            "hosts are left (exit 1).\n\n"
            "  --hosts HOSTFILE        the hosts; re-read at each relaunch (hosts removed from it\n"
            "                          are not used again) and whenever it changes: hosts listed that\n"
            "                          answer are taken in at the next checkpoint if the planner\n"
            "                          predicts a faster minibatch (the job restarts from there)\n"
            "  --profile FILE          the model's profile (pipedream profile), for the planner\n"
            "  --run-dir DIR           plans, hostfiles, each attempt's output, checkpoints (DIR/ckpt)\n"
            "  --checkpoint-every N    minibatches between checkpoints (default 50)\n"
            "  --min-hosts K           give up when fewer hosts are left (default 1)\n"
            "  --bandwidth B           bytes/s between hosts, for the planner (default 1.25e8: 1 Gbit/s)\n"
            "  --straight              plan without replication (one stage per host)\n"
            "  --events FILE           JSON lines: one per start, failure, membership change,\n"
            "                          recovery and end (docs/howto/elastic.md)\n"
            "  --mpirun PATH           the mpirun to run (default: mpirun from PATH)\n"
            "  --mpirun-args \"ARGS\"    more mpirun arguments, split at spaces (e.g. the emulated\n"
            "                          cluster's: tools/cluster.sh mpirun-args)\n"
            "  --probe-timeout S       seconds a host has to run 'true' under mpirun after a\n"
            "                          failure before it counts as lost (default 20)\n"
            "  --grace S               seconds mpirun has to end after the first failure line before\n"
            "                          it is killed (default 10)\n"
            "  --max-restarts R        give up after R relaunches (default 16)\n"
            "  --straggler-factor F    report a host whose compute per unit exceeds F times the\n"
            "                          profile's prediction (scaled by the median host's measured\n"
            "                          over predicted, when over 1) at 2 checkpoints in a row\n"
            "                          (default 2; a straggler event, a stderr line, the summary)\n"
            "  --no-stragglers         do not watch for stragglers\n"
            "  --no-replan             report stragglers but keep the plan (default: re-plan around\n"
            "                          them at the next checkpoint when predicted 10%% faster)\n"
            "  --link-probe-bytes N    bytes each way of a link probe (default 1e6)\n"
            "  -- TRAIN_FLAGS          passed to every pipedream train (not --plan, --workers,\n"
            "                          --checkpoint-every, --checkpoint-dir, --resume or --progress-file:\n"
            "                          launch sets them),\n"
            "                          e.g. -- --steps N --minibatch B --data DIR --seed S --timeout S\n"
            "                          --keep-last K --schedule KIND --microbatches M\n");
}

typedef struct Host {
    char name[256];
} Host;
struct Plan;

typedef struct Launch {
    const char *hostfile, *profile, *run_dir, *model, *events_path, *mpirun, *mpirun_args;
    int ckpt_every, min_hosts, straight, max_restarts;
    double bandwidth, probe_timeout, grace;
    char **train_args;
    int n_train_args;
    char exe[PATH_MAX], ckpt_dir[PATH_MAX];
    FILE *events;
    double t0;
    /* re-admission: the hostfile's modification time at the last look; dropped hosts and the
     * modification time when they were dropped (taken back only after the file changed) */
    struct timespec hf_seen;
    Host dropped[MAX_HOSTS];
    struct timespec dropped_at[MAX_HOSTS];
    int n_dropped;
    /* stragglers: the attempt's progress file (train --progress-file), how far it is read, per
     * rank the checkpoints in a row over --straggler-factor, whether reported; all reported */
    double straggler_factor;
    char progress[PATH_MAX + 32];
    long progress_at;
    int over[MAX_HOSTS], reported[MAX_HOSTS];
    char stragglers[1024];
    int n_stragglers, n_listed;   /* reports; hosts in stragglers[] (each once) */
    /* re-planning (off with --no-replan): what launch has learnt about hosts, by name (a
     * compute straggler's speed relative to the others, a slow link's measured rate), planned
     * with as a heterogeneous cluster from then on; the schedule the job runs (scores plans);
     * per rank its last compute over prediction; checkpoints in a row whose time per unit is
     * over --straggler-factor times the slowest stage's prediction; a re-plan asked for, links
     * to probe first, and the time per unit when this attempt last probed them (0: not yet) */
    int replan;
    struct Known { char name[256]; double speed, bandwidth; } known[MAX_HOSTS];
    int n_known;
    SchedKind kind;
    int micro, chunks, wire_bf16, recompute;   /* train's --microbatches (0: its default), --chunks, --wire, --recompute */
    double opt_state_factor;
    double ratio[MAX_HOSTS];
    int slow_rows, replan_wanted, probe_wanted;
    double probe_wall;
    double restart_s;      /* what the last restart by launch took (job ended to training again); 10 before one */
    double restart_from;   /* when launch ended the last attempt to restart it (0: it did not) */
    long stall_ck;         /* the checkpoint after which an overdue next one had the links probed */
    double job_timeout;    /* train's --timeout (its default, 300, unless the train flags give one) */
    double best_pace, probe_pace;   /* this attempt's least s per minibatch between checkpoints; at the last probe */
    double probe_bytes;
    int n_replans;
} Launch;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static volatile sig_atomic_t g_stop;
static volatile pid_t g_child;
static void on_signal(int sig) {
    g_stop = sig;
    if (g_child > 0) kill(g_child, SIGTERM);
}

/* "DIR/ckpt-<minibatches>.safetensors", or "none" when there is no checkpoint (mb < 0). */
static const char *ckpt_name(const char *dir, long mb, char *b, size_t n) {
    if (mb < 0) snprintf(b, n, "none");
    else snprintf(b, n, "%s/ckpt-%010ld.safetensors", dir, mb);
    return b;
}

/* ---- hosts -------------------------------------------------------------------------------- */

/* Reads an Open MPI hostfile: the first word of each line, '#' to the end of a line ignored,
 * duplicates once. Returns the count or -1 (message printed). */
static int read_hostfile(const char *path, Host *out, int max) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "pipedream: error: cannot read the hostfile %s: %s\n", path, strerror(errno));
        return -1;
    }
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char word[256];
        if (sscanf(line, " %255s", word) != 1) continue;
        int dup = 0;
        for (int i = 0; i < n; i++) dup |= !strcmp(out[i].name, word);
        if (dup) continue;
        if (n == max) {
            fclose(f);
            fprintf(stderr, "pipedream: error: %s: more than %d hosts\n", path, max);
            return -1;
        }
        snprintf(out[n++].name, sizeof out[0].name, "%s", word);
    }
    fclose(f);
    return n;
}

static int write_hostfile(const char *path, const Host *h, int n) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    for (int i = 0; i < n; i++) fprintf(f, "%s slots=1\n", h[i].name);
    return fclose(f);
}

/* ---- child processes ---------------------------------------------------------------------- */

/* argv of mpirun: the binary, --mpirun-args split at spaces, then extra (NULL-terminated),
 * whatever their lengths. The caller frees *buf (the strings of --mpirun-args) and the array. */
static char **mpirun_argv(const Launch *L, char **buf, char *const *extra) {
    size_t n_extra = 0, max = 2;
    while (extra[n_extra]) n_extra++;
    *buf = strdup(L->mpirun_args ? L->mpirun_args : "");
    PD_ASSERT(*buf);
    for (const char *c = *buf; *c; c++) max += *c == ' ' || *c == '\t' || *c == '\n';
    max += strlen(*buf) / 2 + 1 + n_extra;
    char **argv = malloc(max * sizeof *argv);
    PD_ASSERT(argv);
    size_t n = 0;
    argv[n++] = (char *)L->mpirun;
    for (char *save = NULL, *t = strtok_r(*buf, " \t\n", &save); t; t = strtok_r(NULL, " \t\n", &save)) argv[n++] = t;
    for (size_t i = 0; i < n_extra; i++) argv[n++] = extra[i];
    PD_ASSERT(n < max);
    argv[n] = NULL;
    return argv;
}

/* pipe(2) with both ends closed on exec. */
static int cloexec_pipe(int p[2]) {
    if (pipe(p)) return -1;
    fcntl(p[0], F_SETFD, FD_CLOEXEC);
    fcntl(p[1], F_SETFD, FD_CLOEXEC);
    return 0;
}

/* Forks argv in a process group of its own with stdout to out_path (NULL: /dev/null) and
 * stderr into a pipe (*err_fd). Returns its pid, or -1 with errno set when it could not start
 * (no pipe, no fork, or exec failed: the program is missing or cannot run); nothing is left
 * open then. The child inherits no descriptor of ours but the three. */
static pid_t spawn(char **argv, const char *out_path, int *err_fd) {
    int p[2], x[2];   /* p: its stderr; x: closed on a successful exec, else the errno of exec */
    if (cloexec_pipe(p)) return -1;
    if (cloexec_pipe(x)) {
        int e = errno;
        close(p[0]), close(p[1]);
        errno = e;
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(p[0]), close(p[1]), close(x[0]), close(x[1]);
        errno = e;
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);   /* its own group: a signal to the launcher's group does not reach it twice */
        signal(SIGPIPE, SIG_DFL);   /* launch ignores it; exec would keep that */
        int o = open(out_path ? out_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (o >= 0) dup2(o, 1);
        dup2(p[1], 2);
        int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (nul >= 0) dup2(nul, 0);
        execvp(argv[0], argv);
        int e = errno;
        ssize_t w = write(x[1], &e, sizeof e);
        (void)w;
        _exit(127);
    }
    close(p[1]);
    close(x[1]);
    int e = 0;
    ssize_t got;
    while ((got = read(x[0], &e, sizeof e)) < 0 && errno == EINTR) {}
    close(x[0]);
    if (got == (ssize_t)sizeof e) {   /* exec failed */
        close(p[0]);
        waitpid(pid, NULL, 0);
        errno = e;
        return -1;
    }
    *err_fd = p[0];
    return pid;
}

static void kill_wait(pid_t pid, int *status) {
    kill(pid, SIGTERM);
    for (int i = 0; i < 50; i++) {
        if (waitpid(pid, status, WNOHANG) == pid) return;
        usleep(100000);
    }
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    waitpid(pid, status, 0);
}

/* Ends what is left of process group pgid (its leader has ended): SIGTERM, then SIGKILL to
 * whatever is still there a second later. */
static void end_group(pid_t pgid) {
    if (kill(-pgid, SIGTERM)) return;
    for (int i = 0; i < 10 && !kill(-pgid, 0); i++) usleep(100000);
    kill(-pgid, SIGKILL);
}

/* Runs argv (stdout to out_path, stderr discarded) for at most `seconds`, then ends it. 1 when
 * it ended by itself (*status: waitpid's), 0 when it was ended at the time limit, -1 when it
 * could not start or launch is stopping (a signal): then it says nothing about the host. */
static int run_quietly(char **argv, const char *out_path, double seconds, int *status) {
    int fd;
    pid_t pid = spawn(argv, out_path, &fd), job = g_child;
    *status = 0;
    if (pid < 0) return -1;
    g_child = pid;
    double end = now_s() + seconds;
    int done = 0, open = 1;
    char sink[4096];
    while (now_s() < end && !g_stop) {
        if (waitpid(pid, status, WNOHANG) == pid) {
            done = 1;
            break;
        }
        struct pollfd pf = {fd, POLLIN, 0};
        if (!open) usleep(100000);
        else if (poll(&pf, 1, 100) > 0 && read(fd, sink, sizeof sink) <= 0) open = 0;
    }
    if (!done) kill_wait(pid, status);
    end_group(pid);   /* anything it left in its group */
    g_child = job;
    close(fd);
    return done ? 1 : g_stop ? -1 : 0;
}

/* Does host h run `true` under mpirun within the probe timeout? 1 yes, 0 no, -1 unknown
 * (launch is stopping, or mpirun cannot run at all). */
static int probe_host(const Launch *L, const Host *h) {
    char *extra[] = {"--host", (char *)h->name, "-np", "1", "true", NULL};
    char *buf, **argv = mpirun_argv(L, &buf, extra);
    int status, done = run_quietly(argv, NULL, L->probe_timeout, &status);
    free(argv), free(buf);
    if (done < 0) return -1;
    return done && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* ---- one attempt -------------------------------------------------------------------------- */

#define MAX_RANKS MAX_HOSTS
typedef struct Attempt {
    int status;                  /* waitpid's */
    double t_start, t_fail;      /* t_fail: first error line, else mpirun's end (0: no failure) */
    double t_training;           /* rank 0's "training ..." line (0: none) */
    double t_ck[2];              /* the two newest checkpoints of this attempt */
    long ck_mb[2];
    int lost[MAX_RANKS];         /* named lost by a survivor */
    int spoke[MAX_RANKS];        /* printed its own stopping or error line */
    int late[MAX_RANKS];         /* waited for in a timeout message */
    int any_spoke;
    char daemon_lost[8][256];    /* Open MPI's "Remote daemon: ... on node HOST" */
    int n_daemon_lost;
    int ck_seen;                 /* a checkpoint line since the last look */
    long n_mb;                   /* the run's minibatches (rank 0's "training" line) */
    int grow;                    /* ended by launch to take hosts in or re-plan (below) */
    double t_kill;               /* when launch ended it for that */
    char first_error[512];
} Attempt;

/* The line without Open MPI's output tag ("[1,0]<stderr>:", mpirun --tag-output). */
static const char *untagged(const char *s) {
    const char *p;
    if (s[0] == '[' && (p = strstr(s, "]<stderr>:")) && p - s < 32) return p + 10;
    return s;
}

/* The last occurrence of key in s, or NULL. */
static const char *last_of(const char *s, const char *key) {
    const char *hit = NULL;
    for (const char *p = strstr(s, key); p; p = strstr(p + 1, key)) hit = p;
    return hit;
}

/* What a line at the start of which the job's processes report themselves says: the rank (or
 * -1) and whether it is a failure. Failures are the typed lines alone, never words in other
 * text (the checkpoint and resume lines quote the user's paths):
 *   "pipedream: failed: train rank R exit S"        train's last line when it fails (cli.h)
 *   "pipedream: rank R (stage S): stopping on signal" the runtime ending on a signal (a rank lost)
 *   "pipedream: rank R: abort: ..."                    the runtime ending the job (MPI_Abort)
 *   "pipedream: error: rank R ..."                     a rank's error line (who spoke; no failure)
 * and Open MPI's lines for a rank or daemon lost ("mpirun noticed that process rank ...",
 * "ORTE has lost communication with a remote daemon"). */
static int failure_line(const char *s, int *rank) {
    int r = -1, n = 0;
    *rank = -1;
    if (!strncmp(s, CLI_FAILED_LINE, strlen(CLI_FAILED_LINE))) {
        if (sscanf(s + strlen(CLI_FAILED_LINE), "train rank %d", &r) == 1) *rank = r;
        return 1;
    }
    if (sscanf(s, "pipedream: rank %d%n", &r, &n) == 1 && n > 0) {
        *rank = r;
        const char *rest = s + n;
        if (!strncmp(rest, ": abort: ", 9)) return 1;
        if (!strncmp(rest, " (stage ", 8) && (rest = strchr(rest, ')')) && !strncmp(rest, "): stopping on signal", 21))
            return 1;
        return 0;
    }
    if (sscanf(s, "pipedream: error: rank %d%n", &r, &n) == 1 && n > 0) *rank = r;
    /* mpirun's own reports of a rank or daemon it lost (Open MPI's help texts, each starting
     * a line) */
    const char *w = strchr(s, ' ');   /* "<mpirun's name> noticed that process rank ..." */
    return (w && w - s < 32 && (!strncmp(w, " noticed that process rank ", 27) || !strncmp(w, " noticed that the job aborted", 29))) ||
           !strncmp(s, "ORTE has lost communication with a remote daemon", 48) ||
           !strncmp(s, "An ORTE daemon has unexpectedly failed", 38);
}

/* Reads what one stderr line says about the run. */
static void scan_line(Attempt *A, const char *raw, double t) {
    int r;
    const char *p, *line = untagged(raw);
    if (!strncmp(line, "pipedream: checkpoint ", 22) && (p = last_of(line, "/ckpt-"))) {
        A->t_ck[0] = A->t_ck[1], A->ck_mb[0] = A->ck_mb[1];
        A->t_ck[1] = t, A->ck_mb[1] = atol(p + 6);
        A->ck_seen = 1;
    }
    if (!strncmp(line, "pipedream: training ", 20) && !A->t_training) {
        A->t_training = t;
        if ((p = last_of(line, "), "))) A->n_mb = atol(p + 3);
    }
    int failed = failure_line(line, &r);
    if (r >= 0 && r < MAX_RANKS) A->spoke[r] = A->any_spoke = 1;
    if (!failed) {
        /* Open MPI's own report of a lost daemon names the host (a failure only once a rank or
         * mpirun's exit status says so) */
        const char *q = line + strspn(line, " \t");
        if (!strncmp(q, "Remote daemon:", 14) && (p = strstr(q, " on node ")) && A->n_daemon_lost < 8)
            sscanf(p + 9, "%255s", A->daemon_lost[A->n_daemon_lost++]);
        return;
    }
    if (!A->t_fail) {
        A->t_fail = t;
        snprintf(A->first_error, sizeof A->first_error, "%.500s", line);
    }
    for (p = strstr(line, "lost rank "); p; p = strstr(p + 1, ", rank ")) {
        r = atoi(p + (p[0] == 'l' ? 10 : 7));
        if (r >= 0 && r < MAX_RANKS) A->lost[r]++;
    }
    if ((p = strstr(line, "timed out")) && (p = strstr(p, "for rank ")) && (r = atoi(p + 9)) >= 0 && r < MAX_RANKS)
        A->late[r]++;
}

/* A failure being recovered from: when it was detected (0: none), what the relaunch resumes. */
typedef struct Recovery {
    double t_detect, total_s;
    int attempt, hosts;
    long resume_mb;
} Recovery;

static FILE *event_begin(const Launch *L, const char *kind);
static void event_end(FILE *f);
static void json_str(FILE *f, const char *s);

/* The relaunch trains again (rank 0's "training" line): the recovery ends. */
static void recovered(const Launch *L, Recovery *rec, double t) {
    double dt = t - rec->t_detect;
    rec->total_s += dt;
    rec->t_detect = 0;
    fprintf(stderr, "pipedream: launch: training again on %d host%s %.1f s after the failure was detected\n",
            rec->hosts, rec->hosts == 1 ? "" : "s", dt);
    FILE *e = event_begin(L, "recovered");
    if (e) fprintf(e, ",\"attempt\":%d,\"hosts\":%d,\"recovery_s\":%.3f,\"resume_minibatches\":%ld", rec->attempt,
                   rec->hosts, dt, rec->resume_mb);
    event_end(e);
}

/* Hosts to take in at a checkpoint: the candidates that answer, and the plan with them. */
typedef struct Grow {
    const Profile *prof;
    const Host *hosts;
    int n_hosts;
    const Plan *plan;
    Host add[MAX_HOSTS];
    int n_add;
    Plan *next;
    /* or a re-plan around stragglers (replan_check): the hosts of the next attempt (the
     * current ones, or without a straggler), the predicted times and why */
    int replan;
    Host next_hosts[MAX_HOSTS];
    int n_next;
    double t_now, t_next;
    char why[512];
} Grow;
static int replan_check(Launch *L, Grow *g, long remaining);
static int grow_check(Launch *L, Grow *g);
static long newest_ckpt(const char *dir);

/* The lower median of x[0..n) (the (n - 1) / 2-th smallest: of 2 hosts, the faster one, so
 * that a straggler is never its own measure), 0 when n is 0. */
static double median_of(const double *x, int n) {
    double s[MAX_HOSTS];
    if (n <= 0) return 0;
    if (n > MAX_HOSTS) n = MAX_HOSTS;
    memcpy(s, x, sizeof *s * (size_t)n);
    for (int i = 1; i < n; i++)   /* insertion sort: a handful of hosts */
        for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
            double t = s[j];
            s[j] = s[j - 1], s[j - 1] = t;
        }
    return s[(n - 1) / 2];
}

/* A straggler report: counted, and the host listed once (for the done line and event). */
static void note_straggler(Launch *L, const char *name) {
    L->n_stragglers++;
    size_t n = strlen(name), k = strlen(L->stragglers);
    for (const char *p = L->stragglers; (p = strstr(p, name)); p += n)
        if ((p == L->stragglers || p[-1] == ' ') && (p[n] == 0 || p[n] == ' ')) return;
    if (k + n + 2 < sizeof L->stragglers) {
        snprintf(L->stragglers + k, sizeof L->stragglers - k, "%s%s", k ? " " : "", name);
        L->n_listed++;
    }
}

/* The number after "key": in [s, end), or NAN. */
static double num_in(const char *s, const char *end, const char *key) {
    const char *p = strstr(s, key);
    return p && p < end ? strtod(p + strlen(key), NULL) : NAN;
}

/* Reads the progress lines the job appended since the last look (one per checkpoint: every
 * rank's compute per unit beside the prediction, train --progress-file). A rank over
 * --straggler-factor times its prediction scaled by the median rank's measured/predicted
 * (when over 1; and by 10% of the largest stage's) at 2 checkpoints in a row is reported once
 * per attempt: on stderr, a straggler event, the summary. A rank's figures cover all its stages
 * (chunks of an interleaved plan) and the prediction one of them: it counts chunks times
 * (the stages of a worker are the model's layers cut evenly enough for that). */
static void straggler_check(Launch *L, const Host *hosts, int n_hosts, int chunks) {
    FILE *f = fopen(L->progress, "r");
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    fseek(f, L->progress_at, SEEK_SET);
    while ((got = getline(&line, &cap, f)) > 0) {
        size_t n = (size_t)got;
        if (line[n - 1] != '\n') break;   /* not complete yet: read it next time */
        L->progress_at += (long)n;
        long mb = (long)num_in(line, line + n, "\"minibatches\":");
        /* a stage too small to hold the pipeline back is no straggler: the excess must be at
         * least 10% of the largest stage's prediction */
        const double V = chunks > 1 ? chunks : 1;
        double most = 0, most_busy = 0, wall = NAN;
        for (const char *p = strstr(line, "\"predicted_ms_per_unit\":"); p; p = strstr(p + 1, "\"predicted_ms_per_unit\":")) {
            double x = strtod(p + 24, NULL);
            const char *b = strstr(p, "\"predicted_busy_ms_per_unit\":");
            double busy = b ? strtod(b + 29, NULL) + (V - 1) * x : NAN;   /* sends: all chunks' already */
            if (V * x > most) most = V * x;
            if (busy > most_busy) most_busy = busy;
        }
        /* the pipeline's pace: rank 0's wall time per unit (waits and the rest), against the
         * slowest stage's predicted compute and sends; over the factor twice in a row, with no
         * host computing slowly enough to explain it, launch probes the links (replan_check) */
        const char *r0 = strstr(line, "{\"rank\":0,");
        if (r0) wall = num_in(r0, line + n, "\"wait_ms_per_unit\":") + num_in(r0, line + n, "\"busy_ms_per_unit\":");
        L->slow_rows = most_busy > 0 && wall > L->straggler_factor * most_busy ? L->slow_rows + 1 : 0;
        int reported_before = L->n_stragglers;
        /* every rank's figures, then the (lower) median rank's compute over its prediction: a
         * machine slower than its profile throughout (ranks sharing cores, another CPU) slows
         * every rank alike, and a straggler is slow against the others, not the profile */
        int rk[MAX_HOSTS], stg[MAX_HOSTS], k = 0;
        double msr[MAX_HOSTS], prd[MAX_HOSTS], ratio[MAX_HOSTS];
        for (const char *p = strstr(line, "{\"rank\":"); p && k < MAX_HOSTS;) {
            const char *next = strstr(p + 1, "{\"rank\":"), *end = next ? next : line + n;
            int r = atoi(p + 8), st = (int)num_in(p, end, "\"stage\":");
            double ms = num_in(p, end, "\"compute_ms_per_unit\":"), pred = V * num_in(p, end, "\"predicted_ms_per_unit\":");
            p = next;
            if (r < 0 || r >= n_hosts || r >= MAX_HOSTS || !(pred > 0) || !(ms >= 0)) continue;
            rk[k] = r, stg[k] = st, msr[k] = ms, prd[k] = pred, ratio[k] = ms / pred, k++;
        }
        double med = median_of(ratio, k), typical = med > 1 ? med : 1;
        for (int i = 0; i < k; i++) {
            int r = rk[i], st = stg[i];
            double ms = msr[i], pred = prd[i];
            L->ratio[r] = ms / pred;
            L->over[r] = ms > L->straggler_factor * typical * pred && ms - typical * pred >= 0.1 * typical * most
                             ? L->over[r] + 1 : 0;
            if (L->over[r] < 2 || L->reported[r]) continue;
            L->reported[r] = 1;
            fprintf(stderr, "pipedream: launch: straggler: %s (rank %d, stage %d) computes %.3f ms per unit, "
                    "%.1fx the predicted %.3f (the median host %.1fx), at 2 checkpoints in a row (minibatch %ld)\n",
                    hosts[r].name, r, st, ms, ms / pred, pred, med, mb);
            FILE *e = event_begin(L, "straggler");
            if (e) {
                fputs(",\"host\":", e);
                json_str(e, hosts[r].name);
                fprintf(e, ",\"rank\":%d,\"stage\":%d,\"measured_ms_per_unit\":%.4f,\"predicted_ms_per_unit\":%.4f,"
                        "\"factor\":%.3f,\"checkpoint_minibatches\":%ld", r, st, ms, pred, ms / pred, mb);
            }
            event_end(e);
            note_straggler(L, hosts[r].name);
        }
        if (L->n_stragglers > reported_before) L->replan_wanted = 1;
        else if (L->slow_rows >= 2 && !L->probe_wanted && (!(L->probe_wall > 0) || wall > L->straggler_factor * L->probe_wall)) {
            /* once, and again only when the pace has since slowed by the factor again */
            fprintf(stderr, "pipedream: launch: %.3f ms per unit, over %g times the slowest stage's predicted %.3f, "
                    "at 2 checkpoints in a row (minibatch %ld), and no host computes slowly enough to explain it: "
                    "probing the links\n", wall, L->straggler_factor, most_busy, mb);
            L->replan_wanted = L->probe_wanted = 1;
            L->probe_wall = wall;
        }
    }
    free(line);
    fclose(f);
}

/* At each checkpoint: the time per minibatch between the last two (training and checkpoints
 * alike, from the lines' arrival). Over --straggler-factor times the attempt's best so far, and
 * that much over the pace of the last probe, the pace has dropped mid-run: probe the links. */
static void pace_check(Launch *L, const Attempt *A) {
    if (!(A->t_ck[0] > 0) || A->ck_mb[1] <= A->ck_mb[0] || !(L->straggler_factor > 0)) return;
    double pace = (A->t_ck[1] - A->t_ck[0]) / (double)(A->ck_mb[1] - A->ck_mb[0]);
    if (!(L->best_pace > 0) || pace < L->best_pace) L->best_pace = pace;
    if (pace > L->straggler_factor * L->best_pace && !(pace <= L->straggler_factor * L->probe_pace)) {
        fprintf(stderr, "pipedream: launch: %.4g s per minibatch between the checkpoints at %ld and %ld, %.1f times this "
                "attempt's best: probing the links\n", pace, A->ck_mb[0], A->ck_mb[1], pace / L->best_pace);
        L->replan_wanted = L->probe_wanted = 1;
        L->probe_pace = pace;
    }
}

/* Runs one mpirun to its end, relaying its stderr to ours and into err_path. When the hostfile
 * changes it probes and plans (grow_check); with hosts to take in, it ends the job at the next
 * checkpoint (A->grow) so that the next attempt resumes from there on more hosts. */
static int run_attempt(Launch *L, char **argv, const char *out_path, const char *err_path, Attempt *A,
                       Recovery *rec, Grow *g) {
    memset(A, 0, sizeof *A);
    A->t_start = now_s();
    FILE *log = fopen(err_path, "we");
    int fd;
    pid_t pid = spawn(argv, out_path, &fd);
    if (pid < 0) {
        int e = errno;
        if (log) fclose(log);
        snprintf(A->first_error, sizeof A->first_error, "cannot run %.400s: %s", argv[0], strerror(e));
        fprintf(stderr, "pipedream: error: launch: %s\n", A->first_error);
        return -1;
    }
    g_child = pid;
    char buf[8192], line[4096];
    size_t ln = 0;
    int eof = 0, killed = 0, pending = 0, reaped = 0;
    double t_kill = 0, t_exit = 0;
    /* mpirun's stderr until it closes, or until 2 s after mpirun ended (a process it left
     * behind may hold the pipe open) */
    while (!eof) {
        if (!reaped && waitpid(pid, &A->status, WNOHANG) == pid) reaped = 1, t_exit = now_s();
        if (reaped && now_s() - t_exit > 2) break;
        struct pollfd pf = {fd, POLLIN, 0};
        int k = poll(&pf, 1, 200);
        if (k > 0) {
            ssize_t n = read(fd, buf, sizeof buf);
            if (n <= 0) {
                eof = 1;
                n = 0;
            }
            fwrite(buf, 1, (size_t)n, stderr);
            if (log) fwrite(buf, 1, (size_t)n, log);
            for (ssize_t i = 0; i < n; i++) {
                if (buf[i] == '\n' || ln == sizeof line - 1) {
                    line[ln] = 0;
                    scan_line(A, line, now_s());
                    if (rec->t_detect > 0 && A->t_training > 0) recovered(L, rec, A->t_training);
                    if (A->ck_seen && pending && !killed && !reaped && !A->t_fail && A->ck_mb[1] < A->n_mb) {
                        if (g->replan)
                            fprintf(stderr, "pipedream: launch: re-planning (%s): predicted %.4g s per minibatch instead of %.4g; "
                                    "restarting from the newest checkpoint\n", g->why, g->t_next, g->t_now);
                        else
                            fprintf(stderr, "pipedream: launch: taking in %d host%s: predicted %.4g s per minibatch instead of %.4g; "
                                    "restarting from the newest checkpoint\n", g->n_add, g->n_add == 1 ? "" : "s",
                                    g->next->pipeline_s, g->plan->pipeline_s);
                        kill(pid, SIGTERM);
                        killed = A->grow = 1;
                        t_kill = A->t_kill = now_s();
                    }
                    if (A->ck_seen && g) pace_check(L, A);
                    A->ck_seen = 0;
                    ln = 0;
                } else {
                    line[ln++] = buf[i];
                }
            }
        }
        if (L->straggler_factor > 0 && g) straggler_check(L, g->hosts, g->n_hosts, g->plan->chunks);
        /* the hostfile changed: probe and plan now, end the job at the next checkpoint */
        if (!eof && !pending && !killed && !A->t_fail && A->t_training > 0 && grow_check(L, g)) pending = 1;
        /* a checkpoint overdue by 2 x --straggler-factor times the last interval, and by more
         * than the job's --timeout (a host that stopped answering has failed the job by then):
         * the pace has dropped; probe the links now rather than wait for two slow lines */
        double since = now_s() - (A->t_ck[1] > 0 ? A->t_ck[1] : A->t_training);
        double last = A->t_ck[1] > 0 ? A->t_ck[1] - (A->t_ck[0] > 0 ? A->t_ck[0] : A->t_training) : 0;
        if (!eof && !pending && !killed && !A->t_fail && g && L->straggler_factor > 0 && last > 0 &&
            A->ck_mb[1] != L->stall_ck && since > 2 * L->straggler_factor * last && since > L->job_timeout) {
            fprintf(stderr, "pipedream: launch: no checkpoint for %.1f s, %.1f times the last interval: probing the links\n",
                    since, since / last);
            L->stall_ck = A->ck_mb[1];
            L->replan_wanted = L->probe_wanted = 1;
        }
        /* a straggler reported, or a pipeline slower than predicted: probe, plan around it */
        if (!eof && !pending && !killed && !reaped && !A->t_fail && A->t_training > 0 && L->replan_wanted && g &&
            replan_check(L, g, A->n_mb - A->ck_mb[1])) {
            pending = 1;
            /* the next checkpoint at the pace predicted now, against redoing the work since the
             * last one at the new plan's pace and a restart: restart now when that is sooner */
            since = now_s() - (A->t_ck[1] > 0 ? A->t_ck[1] : A->t_training);
            double wait = L->ckpt_every * g->t_now - since, redo = since * g->t_next / g->t_now + L->restart_s;
            if (wait > redo) {
                fprintf(stderr, "pipedream: launch: re-planning (%s): predicted %.4g s per minibatch instead of %.4g; "
                        "restarting now from the newest checkpoint (the next is about %.0f s away at this pace)\n",
                        g->why, g->t_next, g->t_now, wait);
                kill(pid, SIGTERM);
                killed = A->grow = 1;
                t_kill = A->t_kill = now_s();
            }
        }
        /* a host gone silent can keep mpirun waiting: end it once the grace is over */
        if (!eof && !killed && !reaped && g_stop) {
            fprintf(stderr, "pipedream: launch: stopping on signal %d: ending mpirun\n", (int)g_stop);
            kill(pid, SIGTERM);
            killed = 1;
            t_kill = now_s();
        } else if (!eof && !killed && !reaped && A->t_fail && now_s() - A->t_fail > L->grace) {
            fprintf(stderr, "pipedream: launch: mpirun still running %.0f s after the failure: ending it\n",
                    now_s() - A->t_fail);
            kill(pid, SIGTERM);
            killed = 1;
            t_kill = now_s();
        } else if (killed && !reaped && now_s() - t_kill > 10) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
        }
    }
    close(fd);
    if (!reaped) waitpid(pid, &A->status, 0);
    end_group(pid);   /* what mpirun left in its group (it has ended) */
    g_child = 0;
    if (log) fclose(log);
    if (!(WIFEXITED(A->status) && WEXITSTATUS(A->status) == 0) && !A->t_fail) A->t_fail = now_s();
    return 0;
}

/* Minibatches the failed attempt A trained since its newest checkpoint, which the relaunch
 * does again: the time from that checkpoint (or the training line) to the failure, at the pace
 * between its last two checkpoints (or from the training line to its one checkpoint, or, with
 * none, the plan's predicted seconds per minibatch). 0 to ckpt_every. */
static long lost_estimate(const Attempt *A, int ckpt_every, double predicted_s) {
    double from = A->t_ck[1] > 0 ? A->t_ck[1] : A->t_training;
    double pace = A->t_ck[0] > 0 && A->ck_mb[1] > A->ck_mb[0] ? (A->t_ck[1] - A->t_ck[0]) / (double)(A->ck_mb[1] - A->ck_mb[0])
                  : A->t_ck[1] > 0 && A->t_training > 0 ? (A->t_ck[1] - A->t_training) / (double)ckpt_every
                  : predicted_s;
    if (!(from > 0) || !(pace > 0) || !(A->t_fail > from)) return 0;
    double n = (A->t_fail - from) / pace + 0.5;
    return n > ckpt_every ? ckpt_every : (long)n;
}

/* ---- plans and events --------------------------------------------------------------------- */

/* What launch has learnt about host name (NULL: nothing). */
static struct Known *known_of(Launch *L, const char *name, int add) {
    for (int i = 0; i < L->n_known; i++)
        if (!strcmp(L->known[i].name, name)) return &L->known[i];
    if (!add || L->n_known >= MAX_HOSTS) return NULL;
    struct Known *k = &L->known[L->n_known++];
    snprintf(k->name, sizeof k->name, "%s", name);
    k->speed = k->bandwidth = 0;
    return k;
}

/* The cluster of these hosts: n workers at --bandwidth, and, when launch knows some of them to
 * be slower (a compute straggler's speed, a slow link's rate), a heterogeneous cluster that
 * says so (worker r = hosts[r]). */
static void cluster_for(Launch *L, const Host *hosts, int n, Cluster *cl) {
    memset(cl, 0, sizeof *cl);
    cl->n_levels = 1;
    cl->level[0].workers = n;
    cl->level[0].bandwidth = L->bandwidth;
    for (int r = 0; r < n && n <= PD_MAX_HOSTS; r++) {
        const struct Known *k = known_of(L, hosts[r].name, 0);
        if (!k) continue;
        cl->n_hosts = n;
        cl->host[r].speed = k->speed;
        cl->host[r].bandwidth = k->bandwidth;
    }
}

/* What checkpoints cost per minibatch on cl: every --checkpoint-every minibatches rank 0 gathers
 * each stage's parameters and optimizer state (1 + opt_state_factor times the parameters) from
 * the stage's first replica, over that rank's link and rank 0's. A slow link under a stage with
 * large weights can cost more here than in training. */
static double ckpt_cost(const Launch *L, const Plan *p, const Profile *prof, const Cluster *cl) {
    double t = 0;
    for (int s = 0; s < p->n_stages; s++) {
        int r = p->stages[s].ranks[0];
        if (r == 0) continue;
        double bytes = 0;
        for (int i = 0; i < p->stages[s].n_layers; i++) bytes += prof->layers[p->stages[s].layers[i]].param_bytes;
        t += bytes * (1 + L->opt_state_factor) / cluster_link_bandwidth(cl, r, 0);
    }
    return t / L->ckpt_every;
}

/* The job's micro-batches per minibatch on n workers: train's --microbatches, or its default. */
static int job_micro(const Launch *L, int n) { return L->micro > 0 ? L->micro : sched_default_micro(L->kind, n); }

/* The time per minibatch of p on cl: the simulator's under the job's schedule, plus the
 * checkpoints' share (1e300: none). */
static double plan_score(const Launch *L, const Plan *p, const Profile *prof, const Cluster *cl) {
    SearchCand sc;
    Err err = {0};
    if (!p || plan_search_score(p, prof, cl, L->kind, job_micro(L, p->n_workers), L->recompute, L->opt_state_factor, &sc,
                                &err))
        return 1e300;
    return sc.minibatch_s + ckpt_cost(L, p, prof, cl);
}

/* The plan for these hosts, for the job's schedule, micro-batches, chunks and wire format. A
 * homogeneous cluster under 1f1b with one unit per minibatch, or an interleaved job: the
 * partitioner's (plan_new, as `pipedream plan PROFILE --workers n --bandwidth B [--chunks V]
 * [--wire bf16]`). Another schedule, or some host known slower: the candidates of `pipedream
 * plan` scored by the simulator under the job's schedule, on every placement of their stages
 * (plan_choose), so that a slow link carries the smallest activations and a slow host the
 * least work. */
static Plan *plan_for(Launch *L, const Profile *prof, const Host *hosts, int n, Err *err) {
    Cluster cl;
    cluster_for(L, hosts, n, &cl);
    PlanOpts o;
    memset(&o, 0, sizeof o);
    o.cost_model = COST_OURS;
    o.straight = L->straight;
    o.chunks = L->chunks;
    o.activation_compression = L->wire_bf16 ? 2 : 0;   /* train --wire bf16: half the bytes on every link */
    int simple = L->kind == SCHED_1F1B && job_micro(L, n) == 1;   /* the partitioner's own model is 1f1b's */
    if ((!cluster_heterogeneous(&cl) && simple) || L->chunks > 1) {   /* (the candidates have no interleaved plans) */
        Plan *p = plan_new(prof, &cl, &o, err);
        double t = p && cluster_heterogeneous(&cl) ? plan_score(L, p, prof, &cl) : 1e300;
        if (t < 1e300) p->pipeline_s = t;
        return p;
    }
    ChooseOpts co = {.kind = L->kind, .n_micro = job_micro(L, n), .opt_state_factor = L->opt_state_factor, .plan = o};
    ChooseResult r;
    if (plan_choose(prof, prof, &cl, &co, &r, err)) return NULL;
    Plan *p = r.c[r.chosen].plan;
    r.c[r.chosen].plan = NULL;   /* ours now */
    if (r.c[r.chosen].score.minibatch_s < 1e300) p->pipeline_s = r.c[r.chosen].score.minibatch_s;
    plan_choose_release(&r);
    return p;
}

/* ---- links and re-planning ---------------------------------------------------------------- */

/* `pipedream launch --link-probe BYTES` under mpirun -np 2: rank 0 sends BYTES to rank 1 and
 * gets them back (after a 64 KiB exchange that opens the connection), and prints the rate of
 * the timed exchange in bytes/s: 2 BYTES / its time. */
static int link_probe_main(const char *bytes_arg) {
    double b = atof(bytes_arg);
    if (!(b >= 1 && b <= 1e9)) return cli_usage_error("launch", "--link-probe: bytes from 1 to 1e9 (got %s)", bytes_arg);
    size_t n = (size_t)b, warm = 65536;
    Comm *c = NULL;
    Err err = {0};
    if (comm_mpi_create(NULL, NULL, &c, &err)) return cli_fail(&err);
    int rc = CLI_FAIL;
    char *buf = calloc(n > warm ? n : warm, 1);
    if (!buf || comm_size(c) != 2) {
        fprintf(stderr, "pipedream: error: launch --link-probe runs on 2 ranks\n");
    } else if (comm_rank(c) == 0) {
        double t0 = 0;
        if (!comm_ctrl_send(c, 1, 0, buf, warm, 60, &err) && !comm_ctrl_recv(c, 1, 0, buf, warm, NULL, 60, &err) &&
            (t0 = now_s(), !comm_ctrl_send(c, 1, 0, buf, n, 120, &err)) && !comm_ctrl_recv(c, 1, 0, buf, n, NULL, 120, &err)) {
            printf("%.6g\n", 2.0 * (double)n / (now_s() - t0));
            rc = CLI_OK;
        }
    } else {
        if (!comm_ctrl_recv(c, 0, 0, buf, warm, NULL, 60, &err) && !comm_ctrl_send(c, 0, 0, buf, warm, 60, &err) &&
            !comm_ctrl_recv(c, 0, 0, buf, n, NULL, 120, &err) && !comm_ctrl_send(c, 0, 0, buf, n, 120, &err))
            rc = CLI_OK;
    }
    if (rc != CLI_OK && err.msg[0]) fprintf(stderr, "pipedream: error: launch --link-probe: %s\n", err.msg);
    free(buf);
    fflush(stdout);
    comm_free(c);
    return rc;
}

/* The rate between hosts a and b (bytes/s, both ways: their slower link's), by running the
 * probe above on them; 0 when it fails or takes longer than --probe-timeout. */
static double probe_link(const Launch *L, const Host *a, const Host *b) {
    char hosts[520], bytes[32], out[PATH_MAX + 32];
    snprintf(hosts, sizeof hosts, "%s,%s", a->name, b->name);
    snprintf(bytes, sizeof bytes, "%.0f", L->probe_bytes);
    snprintf(out, sizeof out, "%s/link-probe.out", L->run_dir);
    char *extra[] = {"--host", hosts, "-np", "2", (char *)L->exe, "launch", "--link-probe", bytes, NULL};
    char *buf, **argv = mpirun_argv(L, &buf, extra);
    int status, done = run_quietly(argv, out, L->probe_timeout, &status);
    free(argv), free(buf);
    double rate = 0;
    FILE *f = fopen(out, "r");
    if (f) {
        if (fscanf(f, "%lf", &rate) != 1) rate = 0;
        fclose(f);
    }
    unlink(out);
    return done == 1 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && rate > 0 ? rate : 0;
}

/* Each host's link: probes host r with r + 1 around the ring (r with the other host when there
 * are two); a link is at least as fast as the faster of its two probes. A host whose estimate
 * is under --bandwidth / --straggler-factor, and under the fastest host's by that factor, is a
 * straggler: reported, and known to the planner at the rate measured. Returns how many. */
static int probe_links(Launch *L, const Host *hosts, int n) {
    double pair[MAX_HOSTS] = {0}, est[MAX_HOSTS] = {0}, best = 0;
    if (n < 2) return 0;
    int m = n == 2 ? 1 : n;
    for (int r = 0; r < m && !g_stop; r++) pair[r] = probe_link(L, &hosts[r], &hosts[(r + 1) % n]);
    for (int r = 0; r < n; r++) {
        double left = pair[(r + m - 1) % m], right = pair[r % m];
        est[r] = left > right ? left : right;
        if (est[r] > best) best = est[r];
    }
    fprintf(stderr, "pipedream: launch: links (MB/s, %.3g MB each way):", L->probe_bytes / 1e6);
    for (int r = 0; r < n; r++) fprintf(stderr, " %s %.3g", hosts[r].name, est[r] / 1e6);
    fputc('\n', stderr);
    int slow = 0;
    for (int r = 0; r < n && n > 2; r++) {
        if (!(est[r] > 0) || est[r] * L->straggler_factor >= L->bandwidth || est[r] * L->straggler_factor >= best) continue;
        struct Known *k = known_of(L, hosts[r].name, 1);
        if (!k) continue;
        k->bandwidth = est[r];
        slow++;
        fprintf(stderr, "pipedream: launch: straggler: %s (rank %d): its link moves %.3g MB/s, under 1/%g of both "
                "--bandwidth (%.3g MB/s) and the fastest host's (%.3g MB/s)\n", hosts[r].name, r, est[r] / 1e6,
                L->straggler_factor, L->bandwidth / 1e6, best / 1e6);
        FILE *e = event_begin(L, "straggler");
        if (e) {
            fputs(",\"host\":", e);
            json_str(e, hosts[r].name);
            fprintf(e, ",\"rank\":%d,\"link_bytes_per_s\":%.6g,\"bandwidth\":%.6g", r, est[r], L->bandwidth);
        }
        event_end(e);
        note_straggler(L, hosts[r].name);
    }
    return slow;
}

/* Same stages, layers and ranks. */
static int same_plan(const Plan *a, const Plan *b) {
    if (!plan_same_partition(a, b)) return 0;
    for (int st = 0; st < a->n_stages; st++)
        for (int i = 0; i < a->stages[st].replicas; i++)
            if (a->stages[st].ranks[i] != b->stages[st].ranks[i]) return 0;
    return 1;
}

/* A straggler was reported or the pipeline runs slower than predicted (straggler_check): probe
 * the links if asked, learn the compute stragglers' speeds (each host's compute over prediction
 * against the median host's), and with re-planning on, plan for every host as it is now known
 * and for the hosts without each straggler; when the best of those is another plan, predicted
 * at least 10% faster than the current plan on the cluster as now known, and the time it saves
 * over the minibatches left exceeds a restart's, it becomes g->next (the job ends at the next
 * checkpoint) and 1. */
static int replan_check(Launch *L, Grow *g, long remaining) {
    L->replan_wanted = 0;
    int n = g->n_hosts;
    if (L->probe_wanted) {
        L->probe_wanted = 0;
        probe_links(L, g->hosts, n);
    }
    double measured[MAX_HOSTS];
    int k = 0;
    for (int r = 0; r < n; r++)
        if (L->ratio[r] > 0) measured[k++] = L->ratio[r];
    double median = median_of(measured, k);
    for (int r = 0; r < n && median > 0; r++)
        if (L->reported[r] && L->ratio[r] > 0) {
            struct Known *kn = known_of(L, g->hosts[r].name, 1);
            if (kn) kn->speed = median / L->ratio[r] < 1 ? median / L->ratio[r] : 1;
        }
    if (!L->replan) return 0;
    Cluster cl;
    cluster_for(L, g->hosts, n, &cl);
    if (!cluster_heterogeneous(&cl)) return 0;
    double t_now = plan_score(L, g->plan, g->prof, &cl), best = t_now;
    Plan *choice = NULL;
    Err err = {0};
    /* every host, placed by what is known of them */
    Plan *p = plan_for(L, g->prof, g->hosts, n, &err);
    double tp = p ? plan_score(L, p, g->prof, &cl) : 1e300;
    if (p && tp < best) {
        best = tp, choice = p;
        g->n_next = n;
        memcpy(g->next_hosts, g->hosts, sizeof(Host) * (size_t)n);
        snprintf(g->why, sizeof g->why, "the stages placed around the slower hosts");
    } else {
        plan_free(p);
    }
    /* without each straggler */
    for (int s = 0; s < n && n - 1 >= L->min_hosts; s++) {
        const struct Known *kn = known_of(L, g->hosts[s].name, 0);
        if (!kn || (!(kn->speed > 0 && kn->speed < 1) && !(kn->bandwidth > 0))) continue;
        Host rest[MAX_HOSTS];
        int m = 0;
        for (int r = 0; r < n; r++)
            if (r != s) rest[m++] = g->hosts[r];
        Err e2 = {0};
        Plan *q = plan_for(L, g->prof, rest, m, &e2);
        Cluster cq;
        cluster_for(L, rest, m, &cq);
        double t = q ? plan_score(L, q, g->prof, &cq) : 1e300;
        if (q && t < best) {
            plan_free(choice);
            best = t, choice = q;
            g->n_next = m;
            memcpy(g->next_hosts, rest, sizeof(Host) * (size_t)m);
            snprintf(g->why, sizeof g->why, "without the straggler %s", g->hosts[s].name);
        } else {
            plan_free(q);
        }
    }
    if (choice && g->n_next == n && same_plan(choice, g->plan)) plan_free(choice), choice = NULL;
    if (!choice || !(best < 0.9 * t_now)) {
        fprintf(stderr, "pipedream: launch: no plan predicted 10%% faster than the current one (%.4g s per minibatch on "
                "the hosts as now known): not re-planning\n", t_now);
        plan_free(choice);
        return 0;
    }
    /* a restart costs about what the last one took; the saving must be larger */
    double saving = (t_now - best) * (double)remaining;
    if (saving < L->restart_s) {
        fprintf(stderr, "pipedream: launch: a new plan (%s) would save a predicted %.3g s over the %ld minibatches left, "
                "less than a restart (about %.3g s): not re-planning\n", g->why, saving, remaining, L->restart_s);
        plan_free(choice);
        return 0;
    }
    g->replan = 1;
    g->next = choice;
    g->t_now = t_now, g->t_next = best;
    return 1;
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void json_hosts(FILE *f, const Host *h, int n) {
    fputc('[', f);
    for (int i = 0; i < n; i++) {
        if (i) fputc(',', f);
        json_str(f, h[i].name);
    }
    fputc(']', f);
}

/* {"stages": S, "layers": [[first, last], ...], "replicas": [...], "predicted_s": x} */
static void json_plan(FILE *f, const Plan *p) {
    if (!p) {
        fputs("null", f);
        return;
    }
    fprintf(f, "{\"stages\":%d,\"layers\":[", p->n_stages);
    for (int s = 0; s < p->n_stages; s++)
        fprintf(f, "%s[%d,%d]", s ? "," : "", p->stages[s].layers[0], p->stages[s].layers[p->stages[s].n_layers - 1]);
    fputs("],\"replicas\":[", f);
    for (int s = 0; s < p->n_stages; s++) fprintf(f, "%s%d", s ? "," : "", p->stages[s].replicas);
    fprintf(f, "],\"predicted_s_per_minibatch\":%.6g}", p->pipeline_s);
}

/* The fields every change of hosts or plan ends with: hosts and plans before and after, and
 * the checkpoint the next attempt resumes from. */
static void json_change(FILE *e, const Host *before, int nb, const Host *after, int na, const Plan *pb, const Plan *pa,
                        long ck) {
    fputs(",\"hosts_before\":", e);
    json_hosts(e, before, nb);
    fputs(",\"hosts_after\":", e);
    json_hosts(e, after, na);
    fputs(",\"plan_before\":", e);
    json_plan(e, pb);
    fputs(",\"plan_after\":", e);
    json_plan(e, pa);
    fprintf(e, ",\"checkpoint_minibatches\":%ld", ck > 0 ? ck : 0);
}

/* Is name among hosts[0..n)? */
static int host_in(const char *name, const Host *hosts, int n) {
    for (int j = 0; j < n; j++)
        if (!strcmp(name, hosts[j].name)) return 1;
    return 0;
}

static void plan_brief(const Plan *p, char *b, size_t n) {
    size_t k = (size_t)snprintf(b, n, "%d stage%s", p->n_stages, p->n_stages == 1 ? "" : "s");
    for (int s = 0; s < p->n_stages && k < n; s++)
        k += (size_t)snprintf(b + k, n - k, "%s layers %d-%d x%d", s ? "," : ":", p->stages[s].layers[0],
                              p->stages[s].layers[p->stages[s].n_layers - 1], p->stages[s].replicas);
}

/* Starts an event line: {"event": kind, "t": seconds since launch, "time": UTC. The caller
 * adds its fields and ends it with event_end. */
static FILE *event_begin(const Launch *L, const char *kind) {
    if (!L->events) return NULL;
    char ts[32];
    struct timespec w;
    clock_gettime(CLOCK_REALTIME, &w);
    size_t k = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", gmtime(&w.tv_sec));
    snprintf(ts + k, sizeof ts - k, ".%03dZ", (int)(w.tv_nsec / 1000000));
    fprintf(L->events, "{\"event\":\"%s\",\"t\":%.3f,\"time\":\"%s\"", kind, now_s() - L->t0, ts);
    return L->events;
}
static void event_end(FILE *f) {
    if (!f) return;
    fputs("}\n", f);
    fflush(f);
}

/* The newest ckpt-<minibatches>.safetensors in dir: its minibatches, or -1. */
static long newest_ckpt(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    long best = -1;
    for (struct dirent *e; (e = readdir(d));) {
        long mb;
        char tail[32];
        if (sscanf(e->d_name, "ckpt-%ld.%31s", &mb, tail) == 2 && !strcmp(tail, "safetensors") && mb > best)
            best = mb;
    }
    closedir(d);
    return best;
}

/* ---- the loop ----------------------------------------------------------------------------- */

/* Does the attempt's stdout hold the training summary (printed once training completed)? */
static int has_summary(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char l[65536];
    int yes = 0;
    while (!yes && fgets(l, sizeof l, f)) yes = strstr(l, "\"steps\":") != NULL;
    fclose(f);
    return yes;
}

static int status_text(int st, char *b, size_t n) {
    if (WIFEXITED(st)) return snprintf(b, n, "mpirun exited %d", WEXITSTATUS(st));
    if (WIFSIGNALED(st)) return snprintf(b, n, "mpirun killed by signal %d", WTERMSIG(st));
    return snprintf(b, n, "mpirun status %d", st);
}

static int ts_after(struct timespec a, struct timespec b) {
    return a.tv_sec > b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec > b.tv_nsec);
}

/* When the hostfile changed since the last look: its hosts not in g->hosts (a dropped one only
 * if the file changed after it was dropped) that answer a probe; if the planner predicts a
 * faster minibatch with them, g->add and g->next (the caller's) and 1. */
static int grow_check(Launch *L, Grow *g) {
    struct stat st;
    if (!g || stat(L->hostfile, &st) || !ts_after(st.st_mtim, L->hf_seen)) return 0;
    L->hf_seen = st.st_mtim;
    Host listed[MAX_HOSTS];
    int n_listed = read_hostfile(L->hostfile, listed, MAX_HOSTS);
    g->n_add = 0;
    for (int i = 0; i < n_listed && g->n_hosts + g->n_add < MAX_HOSTS; i++) {
        int skip = 0;
        for (int j = 0; j < g->n_hosts; j++) skip |= !strcmp(listed[i].name, g->hosts[j].name);
        for (int j = 0; j < L->n_dropped; j++)
            skip |= !strcmp(listed[i].name, L->dropped[j].name) && !ts_after(st.st_mtim, L->dropped_at[j]);
        if (skip) continue;
        if (probe_host(L, &listed[i]) == 1) g->add[g->n_add++] = listed[i];
        else fprintf(stderr, "pipedream: launch: %s is listed but does not answer: not taken in\n", listed[i].name);
    }
    if (!g->n_add) return 0;
    Err err = {0};
    Host all[MAX_HOSTS];
    memcpy(all, g->hosts, sizeof(Host) * (size_t)g->n_hosts);
    memcpy(all + g->n_hosts, g->add, sizeof(Host) * (size_t)g->n_add);
    g->next = plan_for(L, g->prof, all, g->n_hosts + g->n_add, &err);
    if (g->next && g->next->pipeline_s < g->plan->pipeline_s) return 1;
    if (g->next)
        fprintf(stderr, "pipedream: launch: %d more host%s would not be faster (predicted %.4g s per minibatch, now %.4g): not taken in\n",
                g->n_add, g->n_add == 1 ? "" : "s", g->next->pipeline_s, g->plan->pipeline_s);
    else
        fprintf(stderr, "pipedream: launch: no plan for %d hosts: %s\n", g->n_hosts + g->n_add, err.msg);
    plan_free(g->next);
    g->next = NULL;
    g->n_add = 0;
    return 0;
}

static int supervise(Launch *L, const Profile *prof) {
    Host hosts[MAX_HOSTS];
    int n_hosts, restarts = 0, changes = 0, rc = CLI_FAIL;
    Recovery rec = {0};
    long total_lost = 0, ck_last_failure = -2;
    Plan *plan = NULL;
    Err err = {0};
    struct stat st0;
    if (!stat(L->hostfile, &st0)) L->hf_seen = st0.st_mtim;
    if ((n_hosts = read_hostfile(L->hostfile, hosts, MAX_HOSTS)) < 0) return CLI_FAIL;
    static Grow g;
    char ckn[PATH_MAX + 64];
    for (int attempt = 0;; attempt++) {
        if (g_stop) {   /* a signal while launch was between attempts (probing, planning) */
            fprintf(stderr, "pipedream: launch: stopped on signal %d\n", (int)g_stop);
            FILE *e = event_begin(L, "stopped");
            if (e) fprintf(e, ",\"signal\":%d", (int)g_stop);
            event_end(e);
            break;
        }
        if (n_hosts < L->min_hosts) {
            fprintf(stderr, "pipedream: error: launch: %d host%s left, fewer than --min-hosts %d; last checkpoint: %s\n",
                    n_hosts, n_hosts == 1 ? "" : "s", L->min_hosts, ckpt_name(L->ckpt_dir, newest_ckpt(L->ckpt_dir), ckn, sizeof ckn));
            FILE *e = event_begin(L, "gave_up");
            if (e) fprintf(e, ",\"reason\":\"fewer than %d hosts\",\"hosts\":", L->min_hosts), json_hosts(e, hosts, n_hosts);
            event_end(e);
            break;
        }
        if (!plan && !(plan = plan_for(L, prof, hosts, n_hosts, &err))) {
            rc = cli_fail(&err);
            break;
        }
        char plan_path[PATH_MAX + 32], hf_path[PATH_MAX + 32], out_path[PATH_MAX + 32], err_path[PATH_MAX + 32];
        snprintf(plan_path, sizeof plan_path, "%s/plan-%d.json", L->run_dir, attempt);
        snprintf(hf_path, sizeof hf_path, "%s/hosts-%d", L->run_dir, attempt);
        snprintf(out_path, sizeof out_path, "%s/train-%d.out", L->run_dir, attempt);
        snprintf(err_path, sizeof err_path, "%s/train-%d.err", L->run_dir, attempt);
        if (plan_save(plan, plan_path, &err)) {
            rc = cli_fail(&err);
            break;
        }
        if (write_hostfile(hf_path, hosts, n_hosts)) {
            fprintf(stderr, "pipedream: error: cannot write %s: %s\n", hf_path, strerror(errno));
            break;
        }
        long resume_mb = newest_ckpt(L->ckpt_dir);
        char np[16], every[16];
        char **extra = malloc((size_t)(L->n_train_args + 32) * sizeof *extra);   /* 7 + train's + at most 13 */
        PD_ASSERT(extra);
        snprintf(np, sizeof np, "%d", n_hosts);
        snprintf(every, sizeof every, "%d", L->ckpt_every);
        int k = 0;
        const char *fixed[] = {"--hostfile", hf_path, "-np", np, L->exe, "train", L->model};
        for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) extra[k++] = (char *)fixed[i];
        for (int i = 0; i < L->n_train_args; i++) extra[k++] = L->train_args[i];
        const char *mine[] = {"--plan", plan_path, "--checkpoint-every", every, "--checkpoint-dir", L->ckpt_dir};
        for (size_t i = 0; i < sizeof mine / sizeof *mine; i++) extra[k++] = (char *)mine[i];
        /* stragglers: every rank's figures at each checkpoint, beside the profile's prediction */
        snprintf(L->progress, sizeof L->progress, "%s/progress-%d.jsonl", L->run_dir, attempt);
        unlink(L->progress);
        L->progress_at = 0;
        memset(L->over, 0, sizeof L->over), memset(L->reported, 0, sizeof L->reported);
        memset(L->ratio, 0, sizeof L->ratio);
        L->slow_rows = L->replan_wanted = L->probe_wanted = 0;
        L->probe_wall = 0;
        L->stall_ck = -1;
        L->best_pace = L->probe_pace = 0;
        if (L->straggler_factor > 0) {
            int has_prof = 0;
            for (int i = 0; i < L->n_train_args; i++) has_prof |= !strcmp(L->train_args[i], "--profile");
            extra[k++] = "--progress-file", extra[k++] = L->progress;
            if (!has_prof) extra[k++] = "--profile", extra[k++] = (char *)L->profile;
        }
        if (resume_mb > 0) extra[k++] = "--resume", extra[k++] = (char *)L->ckpt_dir;
        extra[k] = NULL;
        PD_ASSERT(k < L->n_train_args + 32);
        char *buf, **argv = mpirun_argv(L, &buf, extra);
        free(extra);

        char brief[512];
        plan_brief(plan, brief, sizeof brief);
        fprintf(stderr, "pipedream: launch: attempt %d on %d host%s (%s)%s\n", attempt, n_hosts, n_hosts == 1 ? "" : "s",
                brief, resume_mb > 0 ? ", resuming" : "");
        FILE *e = event_begin(L, "start");
        if (e) {
            fprintf(e, ",\"attempt\":%d,\"hosts\":", attempt);
            json_hosts(e, hosts, n_hosts);
            fputs(",\"plan\":", e);
            json_plan(e, plan);
            fprintf(e, ",\"plan_file\":");
            json_str(e, plan_path);
            fprintf(e, ",\"resume_minibatches\":%ld", resume_mb > 0 ? resume_mb : 0);
        }
        event_end(e);

        Attempt A;
        rec.attempt = attempt, rec.hosts = n_hosts, rec.resume_mb = resume_mb;
        g = (Grow){.prof = prof, .hosts = hosts, .n_hosts = n_hosts, .plan = plan};
        int started = !run_attempt(L, argv, out_path, err_path, &A, &rec, &g);
        free(argv), free(buf);
        if (!started) {   /* mpirun cannot run at all: no host is to blame */
            e = event_begin(L, "gave_up");
            if (e) fputs(",\"reason\":", e), json_str(e, A.first_error);
            event_end(e);
            break;
        }
        if (L->restart_from > 0 && A.t_training > 0) L->restart_s = A.t_training - L->restart_from;
        L->restart_from = 0;
        char st[64];
        status_text(A.status, st, sizeof st);
        if (g_stop) {
            fprintf(stderr, "pipedream: launch: stopped on signal %d (%s)\n", (int)g_stop, st);
            e = event_begin(L, "stopped");
            if (e) fprintf(e, ",\"signal\":%d", (int)g_stop);
            event_end(e);
            break;
        }
        /* completed: exit 0, or a summary written before the job was ended anyway */
        int completed = (WIFEXITED(A.status) && WEXITSTATUS(A.status) == 0) || has_summary(out_path);
        if (A.grow && !completed) L->restart_from = A.t_kill;
        if (A.grow && !completed && g.replan) {
            long ck = newest_ckpt(L->ckpt_dir);
            int dropped = g.n_next != n_hosts;
            e = event_begin(L, "replan");
            if (e) {
                fprintf(e, ",\"attempt\":%d,\"reason\":", attempt);
                json_str(e, g.why);
                fprintf(e, ",\"predicted_s_per_minibatch_before\":%.6g,\"predicted_s_per_minibatch_after\":%.6g,\"removed\":[",
                        g.t_now, g.t_next);
                for (int r = 0, c = 0; r < n_hosts; r++)
                    if (!host_in(hosts[r].name, g.next_hosts, g.n_next)) fprintf(e, "%s", c++ ? "," : ""), json_str(e, hosts[r].name);
                fputc(']', e);
                json_change(e, hosts, n_hosts, g.next_hosts, g.n_next, plan, g.next, ck);
            }
            event_end(e);
            fprintf(stderr, "pipedream: launch: re-planned %s; %d host%s; resuming from minibatch %ld\n", g.why, g.n_next,
                    g.n_next == 1 ? "" : "s", ck > 0 ? ck : 0);
            /* a host left out stays out until the hostfile changes, as a dropped one */
            struct stat stf;
            struct timespec hf_now = stat(L->hostfile, &stf) ? L->hf_seen : stf.st_mtim;
            for (int r = 0; r < n_hosts && dropped; r++)
                if (!host_in(hosts[r].name, g.next_hosts, g.n_next) && L->n_dropped < MAX_HOSTS)
                    L->dropped_at[L->n_dropped] = hf_now, L->dropped[L->n_dropped++] = hosts[r];
            n_hosts = g.n_next;
            memcpy(hosts, g.next_hosts, sizeof(Host) * (size_t)n_hosts);
            plan_free(plan);
            plan = g.next;
            g.next = NULL;
            changes += dropped;
            L->n_replans++;
            continue;
        }
        if (A.grow && !completed) {
            long ck = newest_ckpt(L->ckpt_dir);
            Host after[MAX_HOSTS];
            memcpy(after, hosts, sizeof(Host) * (size_t)n_hosts);
            memcpy(after + n_hosts, g.add, sizeof(Host) * (size_t)g.n_add);
            e = event_begin(L, "membership");
            if (e) {
                fprintf(e, ",\"attempt\":%d,\"reason\":\"hosts listed and answering; the planner predicts %.6g s per minibatch instead of %.6g\",\"added\":",
                        attempt, g.next->pipeline_s, plan->pipeline_s);
                json_hosts(e, g.add, g.n_add);
                fputs(",\"removed\":[]", e);
                json_change(e, hosts, n_hosts, after, n_hosts + g.n_add, plan, g.next, ck);
            }
            event_end(e);
            fprintf(stderr, "pipedream: launch: took in");
            for (int i = 0; i < g.n_add; i++) fprintf(stderr, " %s", g.add[i].name);
            fprintf(stderr, "; %d hosts; resuming from minibatch %ld\n", n_hosts + g.n_add, ck > 0 ? ck : 0);
            n_hosts += g.n_add;
            memcpy(hosts, after, sizeof(Host) * (size_t)n_hosts);
            plan_free(plan);
            plan = g.next;
            g.next = NULL;
            changes++;
            continue;
        }
        plan_free(g.next);
        g.next = NULL;
        if (completed) {
            /* the train summary (stdout of the last attempt) is launch's stdout */
            FILE *o = fopen(out_path, "r");
            long steps = -1;
            if (o) {
                char l[65536];
                while (fgets(l, sizeof l, o)) {
                    fputs(l, stdout);
                    const char *p = strstr(l, "\"steps\":");
                    if (p) steps = atol(p + 8);
                }
                fclose(o);
            }
            fflush(stdout);
            fprintf(stderr, "pipedream: launch: done: %ld minibatches on %d host%s, %d membership change%s, %ld minibatches lost (estimated), %.1f s recovering",
                    steps, n_hosts, n_hosts == 1 ? "" : "s", changes, changes == 1 ? "" : "s", total_lost, rec.total_s);
            if (L->n_listed) fprintf(stderr, ", straggler%s: %s", L->n_listed == 1 ? "" : "s", L->stragglers);
            if (L->n_replans) fprintf(stderr, ", %d re-plan%s", L->n_replans, L->n_replans == 1 ? "" : "s");
            fputc('\n', stderr);
            e = event_begin(L, "done");
            if (e) {
                fprintf(e, ",\"steps\":%ld,\"hosts\":", steps);
                json_hosts(e, hosts, n_hosts);
                fprintf(e, ",\"membership_changes\":%d,\"minibatches_lost\":%ld,\"recovery_s\":%.3f,\"replans\":%d,\"stragglers\":[",
                        changes, total_lost, rec.total_s, L->n_replans);
                char sl[sizeof L->stragglers], *save = NULL;
                snprintf(sl, sizeof sl, "%s", L->stragglers);
                int c = 0;
                for (char *h = strtok_r(sl, " ", &save); h; h = strtok_r(NULL, " ", &save)) {
                    if (c++) fputc(',', e);
                    json_str(e, h);
                }
                fputc(']', e);
            }
            event_end(e);
            rc = CLI_OK;
            break;
        }

        /* A failure. Gone: the hosts whose daemon Open MPI lost, the ranks a survivor named
         * lost that did not speak themselves; failing those, the ranks that stayed silent
         * while others stopped, or the rank most waited for in timeouts (rank r runs on host
         * r of the attempt's hostfile). Then every other host whose rank printed nothing and that
         * does not answer a probe. */
        rec.t_detect = A.t_fail;
        if (WIFEXITED(A.status) && WEXITSTATUS(A.status) == 127 && !A.any_spoke && !A.t_training) {
            /* mpirun, or the program it was to run, was not found: no host is to blame */
            fprintf(stderr, "pipedream: error: launch: %s before any rank started (a program not found: %s or %s); "
                    "last checkpoint: %s\n", st, L->mpirun, L->exe,
                    ckpt_name(L->ckpt_dir, newest_ckpt(L->ckpt_dir), ckn, sizeof ckn));
            e = event_begin(L, "gave_up");
            if (e) fputs(",\"reason\":\"mpirun exited 127 before any rank started (a program not found)\"", e);
            event_end(e);
            break;
        }
        int gone[MAX_HOSTS] = {0}, n_gone = 0;
        for (int i = 0; i < A.n_daemon_lost; i++)
            for (int r = 0; r < n_hosts; r++)
                if (!gone[r] && !strcmp(A.daemon_lost[i], hosts[r].name)) gone[r] = 1, n_gone++;
        for (int r = 0; r < n_hosts; r++)
            if (!gone[r] && A.lost[r] && !A.spoke[r]) gone[r] = 1, n_gone++;
        if (!n_gone && A.any_spoke)
            for (int r = 0; r < n_hosts; r++)
                if (!A.spoke[r]) gone[r] = 1, n_gone++;
        if (!n_gone) {
            int worst = -1;
            for (int r = 0; r < n_hosts; r++)
                if (A.late[r] && (worst < 0 || A.late[r] > A.late[worst])) worst = r;
            if (worst >= 0) gone[worst] = 1, n_gone++;
        }
        for (int r = 0; r < n_hosts && !g_stop; r++)
            if (!gone[r] && !A.spoke[r] && !probe_host(L, &hosts[r])) {   /* a rank that spoke was reachable */
                fprintf(stderr, "pipedream: launch: host %s does not answer (rank %d)\n", hosts[r].name, r);
                gone[r] = 1, n_gone++;
            }
        if (g_stop) {   /* interrupted while probing: what the probes did not finish says nothing */
            fprintf(stderr, "pipedream: launch: stopped on signal %d while probing after the failure (%s)\n", (int)g_stop, st);
            e = event_begin(L, "stopped");
            if (e) fprintf(e, ",\"signal\":%d,\"attempt\":%d", (int)g_stop, attempt);
            event_end(e);
            break;
        }
        long ck = newest_ckpt(L->ckpt_dir);
        /* work since the checkpoint: the time since it, at the pace between the last two */
        long lost_mb = lost_estimate(&A, L->ckpt_every, plan->pipeline_s);
        total_lost += lost_mb;
        Host after[MAX_HOSTS];
        int n_after = 0;
        struct stat stf;
        struct timespec hf_now = stat(L->hostfile, &stf) ? L->hf_seen : stf.st_mtim;
        for (int r = 0; r < n_hosts; r++)
            if (!gone[r]) after[n_after++] = hosts[r];
            else if (L->n_dropped < MAX_HOSTS) L->dropped_at[L->n_dropped] = hf_now, L->dropped[L->n_dropped++] = hosts[r];
        /* hosts taken out of the hostfile go too */
        Host listed[MAX_HOSTS];
        int n_listed = read_hostfile(L->hostfile, listed, MAX_HOSTS);
        if (n_listed >= 0) {
            int m = 0;
            for (int i = 0; i < n_after; i++) {
                int in = 0;
                for (int j = 0; j < n_listed; j++) in |= !strcmp(after[i].name, listed[j].name);
                if (in) after[m++] = after[i];
            }
            n_after = m;
        }
        Plan *next = NULL;
        if (n_after != n_hosts && n_after >= L->min_hosts && !(next = plan_for(L, prof, after, n_after, &err))) {
            rc = cli_fail(&err);
            break;
        }
        char why[700];
        snprintf(why, sizeof why, "%s%s%.600s", st, A.first_error[0] ? ": " : "", A.first_error);
        fprintf(stderr, "pipedream: launch: attempt %d failed (%s)\n", attempt, why);
        e = event_begin(L, n_after != n_hosts ? "membership" : "failure");
        if (e) {
            fprintf(e, ",\"attempt\":%d,\"reason\":", attempt);
            json_str(e, why);
            fputs(",\"exit_status\":", e);
            fprintf(e, "%d", WIFEXITED(A.status) ? WEXITSTATUS(A.status) : 128 + WTERMSIG(A.status));
            fputs(",\"lost_ranks\":[", e);
            for (int r = 0, c = 0; r < n_hosts; r++)
                if (gone[r]) fprintf(e, "%s%d", c++ ? "," : "", r);
            fputs("],\"removed\":[", e);
            for (int r = 0, c = 0; r < n_hosts; r++)
                if (gone[r]) fprintf(e, "%s", c++ ? "," : ""), json_str(e, hosts[r].name);
            fputc(']', e);
            json_change(e, hosts, n_hosts, after, n_after, plan, next ? next : n_after == n_hosts ? plan : NULL, ck);
            fprintf(e, ",\"minibatches_lost\":%ld,\"detected_t\":%.3f", lost_mb, A.t_fail - L->t0);
        }
        event_end(e);
        if (n_after != n_hosts) {
            changes++;
            fprintf(stderr, "pipedream: launch: removed");
            for (int r = 0; r < n_hosts; r++)
                if (gone[r]) fprintf(stderr, " %s (rank %d)", hosts[r].name, r);
            fprintf(stderr, "; %d host%s left; resuming from minibatch %ld (about %ld minibatches lost)\n", n_after,
                    n_after == 1 ? "" : "s", ck > 0 ? ck : 0, lost_mb);
            memcpy(hosts, after, sizeof(Host) * (size_t)n_after);
            n_hosts = n_after;
            plan_free(plan);
            plan = next;
        }
        if (n_after == n_hosts && ck == ck_last_failure) {   /* no host to blame, no progress since */
            fprintf(stderr, "pipedream: error: launch: failed twice on the same hosts without a new checkpoint (%s); "
                    "last checkpoint: %s\n", why, ckpt_name(L->ckpt_dir, ck, ckn, sizeof ckn));
            e = event_begin(L, "gave_up");
            if (e) fprintf(e, ",\"reason\":\"failed twice without a lost host or a new checkpoint\"");
            event_end(e);
            break;
        }
        ck_last_failure = n_after == n_hosts ? ck : -2;
        if (++restarts > L->max_restarts) {
            fprintf(stderr, "pipedream: error: launch: %d relaunches, more than --max-restarts %d; last checkpoint: %s\n",
                    restarts - 1, L->max_restarts, ckpt_name(L->ckpt_dir, ck, ckn, sizeof ckn));
            e = event_begin(L, "gave_up");
            if (e) fprintf(e, ",\"reason\":\"more than %d relaunches\"", L->max_restarts);
            event_end(e);
            break;
        }
    }
    plan_free(plan);
    return rc;
}

/* Can path (a file name: looked for on PATH) be run? errno says why not for a path with '/'. */
static int mpirun_found(const char *path) {
    if (strchr(path, '/')) return !access(path, X_OK);
    const char *env = getenv("PATH");
    char dirs[8192];
    snprintf(dirs, sizeof dirs, "%s", env ? env : "/usr/bin:/bin");
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        char f[PATH_MAX + 256];
        snprintf(f, sizeof f, "%s/%s", *d ? d : ".", path);
        if (!access(f, X_OK)) return 1;
    }
    return 0;
}

int cmd_launch(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        help(stdout);
        return CLI_OK;
    }
    if (argc == 3 && !strcmp(argv[1], "--link-probe")) return link_probe_main(argv[2]);   /* launch's own probe */
    Launch L;
    memset(&L, 0, sizeof L);
    L.ckpt_every = 50;
    L.min_hosts = 1;
    L.max_restarts = 16;
    L.bandwidth = 1.25e8;
    L.probe_timeout = 20;
    L.grace = 10;
    L.straggler_factor = 2;
    L.replan = 1;
    L.restart_s = 10;
    L.job_timeout = 300;
    L.probe_bytes = 1e6;
    L.kind = SCHED_1F1B;
    L.opt_state_factor = 1;
    L.mpirun = "mpirun";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--")) {
            L.train_args = argv + i + 1;
            L.n_train_args = argc - i - 1;
            break;
        }
#define VAL() if (!(v = cli_value("launch", argc, argv, &i))) return CLI_USAGE
        if (!strcmp(a, "--hosts")) { VAL(); L.hostfile = v; }
        else if (!strcmp(a, "--profile")) { VAL(); L.profile = v; }
        else if (!strcmp(a, "--run-dir")) { VAL(); L.run_dir = v; }
        else if (!strcmp(a, "--events")) { VAL(); L.events_path = v; }
        else if (!strcmp(a, "--mpirun")) { VAL(); L.mpirun = v; }
        else if (!strcmp(a, "--mpirun-args")) { VAL(); L.mpirun_args = v; }
        else if (!strcmp(a, "--straight")) L.straight = 1;
        else if (!strcmp(a, "--checkpoint-every")) { VAL(); if (cli_parse_int("launch", a, v, 1, 1000000000, &L.ckpt_every)) return CLI_USAGE; }
        else if (!strcmp(a, "--min-hosts")) { VAL(); if (cli_parse_int("launch", a, v, 1, MAX_HOSTS, &L.min_hosts)) return CLI_USAGE; }
        else if (!strcmp(a, "--max-restarts")) { VAL(); if (cli_parse_int("launch", a, v, 0, 1000000, &L.max_restarts)) return CLI_USAGE; }
        else if (!strcmp(a, "--bandwidth")) { VAL(); if (cli_parse_double("launch", a, v, 1, 1e15, &L.bandwidth)) return CLI_USAGE; }
        else if (!strcmp(a, "--probe-timeout")) { VAL(); if (cli_parse_double("launch", a, v, 0.1, 1e5, &L.probe_timeout)) return CLI_USAGE; }
        else if (!strcmp(a, "--straggler-factor")) { VAL(); if (cli_parse_double("launch", a, v, 1, 1e6, &L.straggler_factor)) return CLI_USAGE; }
        else if (!strcmp(a, "--no-stragglers")) L.straggler_factor = 0;
        else if (!strcmp(a, "--no-replan")) L.replan = 0;
        else if (!strcmp(a, "--link-probe-bytes")) { VAL(); if (cli_parse_double("launch", a, v, 1024, 1e9, &L.probe_bytes)) return CLI_USAGE; }
        else if (!strcmp(a, "--grace")) { VAL(); if (cli_parse_double("launch", a, v, 0, 1e5, &L.grace)) return CLI_USAGE; }
        else if (a[0] == '-') return cli_usage_error("launch", "unknown option %s (train flags go after --)", a);
        else if (!L.model) L.model = a;
        else return cli_usage_error("launch", "one MODEL.json expected, got \"%s\" too", a);
#undef VAL
    }
    if (!L.hostfile || !L.profile || !L.run_dir || !L.model)
        return cli_usage_error("launch", "needs --hosts, --profile, --run-dir and MODEL.json");
    static const char *const OWN[] = {"--plan", "--workers", "--checkpoint-every", "--checkpoint-dir", "--resume",
                                      "--progress-file"};
    for (int i = 0; i < L.n_train_args; i++)
        for (size_t j = 0; j < sizeof OWN / sizeof *OWN; j++)
            if (!strcmp(L.train_args[i], OWN[j]))
                return cli_usage_error("launch", "%s: launch sets it for every relaunch; give launch's own flags", OWN[j]);
    /* what the job runs, for planning and scoring plans: its schedule, micro-batches, chunks,
     * wire format, recomputation and optimizer (train checks them again) */
    for (int i = 0; i < L.n_train_args; i++) {
        const char *a = L.train_args[i], *v = i + 1 < L.n_train_args ? L.train_args[i + 1] : NULL;
        if (!strcmp(a, "--recompute")) L.recompute = 1;
        if (!v) continue;
        if (!strcmp(a, "--schedule") && sched_kind_parse(v, &L.kind))
            return cli_usage_error("launch", "--schedule %s: not a schedule", v);
        if (!strcmp(a, "--timeout")) L.job_timeout = atof(v);
        if (!strcmp(a, "--optimizer")) L.opt_state_factor = strncmp(v, "adam", 4) ? 1 : 2;
        if (!strcmp(a, "--wire")) L.wire_bf16 = !strcmp(v, "bf16");
        if (!strcmp(a, "--microbatches") && cli_parse_int("launch", "--microbatches (a train flag)", v, 1, 65536, &L.micro))
            return CLI_USAGE;
        if (!strcmp(a, "--chunks")) {
            if (cli_parse_int("launch", "--chunks (a train flag)", v, 2, SCHED_MAX_CHUNKS, &L.chunks)) return CLI_USAGE;
            L.kind = SCHED_INTERLEAVED;
        }
    }
    if (L.kind == SCHED_INTERLEAVED && !L.chunks)
        return cli_usage_error("launch", "--schedule interleaved: give the chunks too (a train flag, --chunks V), so "
                               "that launch plans interleaved stages");
    if (!mpirun_found(L.mpirun)) {
        fprintf(stderr, "pipedream: error: launch: cannot run the mpirun %s: %s\n", L.mpirun,
                strchr(L.mpirun, '/') ? strerror(errno) : "not found on PATH");
        return CLI_FAIL;
    }
    ssize_t n = readlink("/proc/self/exe", L.exe, sizeof L.exe - 1);
    if (n <= 0) {
        fprintf(stderr, "pipedream: error: cannot find this executable (/proc/self/exe): %s\n", strerror(errno));
        return CLI_FAIL;
    }
    L.exe[n] = 0;
    if (mkdir(L.run_dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "pipedream: error: cannot create the run directory %s: %s\n", L.run_dir, strerror(errno));
        return CLI_FAIL;
    }
    char rd[PATH_MAX];
    if (!realpath(L.run_dir, rd)) {
        fprintf(stderr, "pipedream: error: %s: %s\n", L.run_dir, strerror(errno));
        return CLI_FAIL;
    }
    snprintf(L.ckpt_dir, sizeof L.ckpt_dir, "%.*s/ckpt", PATH_MAX - 8, rd);
    L.run_dir = rd;
    Profile prof;
    Err err = {0};
    if (profile_load(L.profile, &prof, &err)) return cli_fail(&err);
    if (L.events_path && !(L.events = fopen(L.events_path, "ae"))) {
        fprintf(stderr, "pipedream: error: cannot open the event log %s: %s\n", L.events_path, strerror(errno));
        profile_release(&prof);
        return CLI_FAIL;
    }
    L.t0 = now_s();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);   /* the terminal or ssh session gone: end the job, not leave it running */
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, NULL);   /* our stderr may be gone with it: keep going to end the job */
    int rc = supervise(&L, &prof);
    profile_release(&prof);
    if (L.events) fclose(L.events);
    return rc;
}
