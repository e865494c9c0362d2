/* launch_scan.c: what a job leaves for launch to read: the lines of its stderr (training,
 * checkpoints, and failures, which are typed lines only), the summary on its stdout, the
 * checkpoints it announced (or, in launch's own RUN_DIR/ckpt, left); and the work a failure lost. */
#define _DEFAULT_SOURCE
#include "launch_impl.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* "DIR/ckpt-<minibatches>.safetensors", or "none" when there is no checkpoint (mb < 0). */
const char *launch_ckpt_name(const char *dir, long mb, char *b, size_t n) {
    if (mb < 0) snprintf(b, n, "none");
    else snprintf(b, n, "%s/ckpt-%010ld.safetensors", dir, mb);
    return b;
}

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

/* A line a rank prints about checkpoints while the run is healthy (not its own stopping or
 * error line): the partner's "pipedream: rank R: checkpoint's second copy PATH" (*mb: its
 * minibatches) or a resume's "pipedream: rank R: PATH received from rank K (the newest complete
 * checkpoint; ...)" (*mb: -1). */
static int ckpt_info_line(const char *s, long *mb) {
    int r, n = 0;
    const char *p;
    *mb = -1;
    if (sscanf(s, "pipedream: rank %d: %n", &r, &n) != 1 || !n) return 0;
    if (!strncmp(s + n, "checkpoint's second copy ", 25)) {
        if ((p = last_of(s, "/ckpt-"))) *mb = atol(p + 6);
        return 1;
    }
    return (p = strstr(s + n, " received from rank ")) && strstr(p, " (the newest complete checkpoint; ");
}

/* Reads what one stderr line says about the run. */
void launch_scan_line(LaunchAttempt *A, const char *raw, double t) {
    int r;
    long mb;
    const char *p, *line = untagged(raw);
    if (!strncmp(line, "pipedream: checkpoint ", 22) && (p = last_of(line, "/ckpt-"))) {
        A->t_ck[0] = A->t_ck[1], A->ck_mb[0] = A->ck_mb[1];
        A->t_ck[1] = t, A->ck_mb[1] = atol(p + 6);
        A->ck_seen = 1;
        if (A->ck_mb[1] > A->ck_newest) A->ck_newest = A->ck_mb[1];
    }
    if (ckpt_info_line(line, &mb)) {   /* the partner's copy is a checkpoint on its host's disk */
        if (mb > A->ck_newest) A->ck_newest = mb;
        return;
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

/* Minibatches the failed attempt A trained since its newest checkpoint, which the relaunch
 * does again: the time from that checkpoint (or the training line) to the failure, at the pace
 * between its last two checkpoints (or from the training line to its one checkpoint, or, with
 * none, the plan's predicted seconds per minibatch). 0 to ckpt_every. */
long launch_lost_estimate(const LaunchAttempt *A, int ckpt_every, double predicted_s) {
    double from = A->t_ck[1] > 0 ? A->t_ck[1] : A->t_training;
    double pace = A->t_ck[0] > 0 && A->ck_mb[1] > A->ck_mb[0] ? (A->t_ck[1] - A->t_ck[0]) / (double)(A->ck_mb[1] - A->ck_mb[0])
                  : A->t_ck[1] > 0 && A->t_training > 0 ? (A->t_ck[1] - A->t_training) / (double)ckpt_every
                  : predicted_s;
    if (!(from > 0) || !(pace > 0) || !(A->t_fail > from)) return 0;
    double n = (A->t_fail - from) / pace + 0.5;
    return n > ckpt_every ? ckpt_every : (long)n;
}

/* The newest ckpt-<minibatches>.safetensors in dir: its minibatches, or -1. */
long launch_newest_ckpt(const char *dir) {
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

long launch_ckpt_newest(const Launch *L) {
    long disk = L->cfg.ckpt_dir_given ? -1 : launch_newest_ckpt(L->cfg.ckpt_dir);
    return disk > L->learned.ck_announced ? disk : L->learned.ck_announced;
}

/* Does the attempt's stdout hold the training summary (printed once training completed)? */
int launch_has_summary(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char l[65536];
    int yes = 0;
    while (!yes && fgets(l, sizeof l, f)) yes = strstr(l, "\"steps\":") != NULL;
    fclose(f);
    return yes;
}

int launch_status_text(int st, char *b, size_t n) {
    if (WIFEXITED(st)) return snprintf(b, n, "mpirun exited %d", WEXITSTATUS(st));
    if (WIFSIGNALED(st)) return snprintf(b, n, "mpirun killed by signal %d", WTERMSIG(st));
    return snprintf(b, n, "mpirun status %d", st);
}
