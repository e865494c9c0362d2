/* launch_supervise.c: launch's loop over attempts. Each attempt plans for the hosts it has,
 * starts mpirun and watches it (launch_attempt.c); what it ended in decides the next step:
 * stopped by a signal, re-planned around a straggler, grown by hosts taken in, completed, or
 * failed (the lost hosts found and dropped, or the same hosts once more). */
#define _DEFAULT_SOURCE
#include "launch_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The run between attempts: its hosts (rank r runs on hosts[r]) and plan, the recovery under
 * way, the counts for the done line, this attempt's files, what it ended in. */
typedef struct Run {
    LaunchHost hosts[MAX_HOSTS];
    int n_hosts;
    Plan *plan;
    LaunchRecovery rec;
    int attempt, restarts, changes, rc;
    long total_lost, ck_last_failure;   /* ck_last_failure: the checkpoint at a failure on the same hosts (-2: none) */
    char plan_path[PATH_MAX + 32], hf_path[PATH_MAX + 32], out_path[PATH_MAX + 32], err_path[PATH_MAX + 32];
    char status[64];   /* mpirun's end, in words */
    LaunchAttempt A;
    LaunchGrow g;
} Run;

typedef enum Outcome { OUT_STOPPED, OUT_REPLANNED, OUT_GROWN, OUT_COMPLETED, OUT_FAILED } Outcome;

static void event_stopped(Launch *L, const Run *R, int with_attempt) {
    FILE *e = launch_event_begin(L, "stopped");
    if (e) fprintf(e, ",\"signal\":%d", (int)launch_stop);
    if (e && with_attempt) fprintf(e, ",\"attempt\":%d", R->attempt);
    launch_event_end(e);
}

static void gave_up(Launch *L, const char *reason) {
    FILE *e = launch_event_begin(L, "gave_up");
    if (e) fputs(",\"reason\":", e), launch_json_str(e, reason);
    launch_event_end(e);
}

/* `mpirun ... pipedream train MODEL TRAIN_FLAGS --plan - [--progress-file ...] [--resume
 * ...]` for this attempt (the plan on mpirun's stdin, which it forwards to rank 0: rank 0 sends
 * it to the others, so no host reads launch's run directory); the caller frees the array and
 * *buf (launch_mpirun_argv). */
static char **train_argv(Launch *L, Run *R, long resume_mb, char **buf) {
    char np[16], every[16];
    char **extra = malloc((size_t)(L->cfg.n_train_args + 32) * sizeof *extra);   /* 7 + train's + at most 13 */
    PD_ASSERT(extra);
    snprintf(np, sizeof np, "%d", R->n_hosts);
    snprintf(every, sizeof every, "%d", L->cfg.ckpt_every);
    int k = 0;
    const char *fixed[] = {"--hostfile", R->hf_path, "-np", np, L->cfg.exe, "train", L->cfg.model};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) extra[k++] = (char *)fixed[i];
    for (int i = 0; i < L->cfg.n_train_args; i++) extra[k++] = L->cfg.train_args[i];
    const char *mine[] = {"--plan", "-", "--checkpoint-every", every, "--checkpoint-dir", L->cfg.ckpt_dir};
    for (size_t i = 0; i < sizeof mine / sizeof *mine; i++) extra[k++] = (char *)mine[i];
    /* stragglers: every rank's figures at each checkpoint, beside the profile's prediction */
    if (L->cfg.straggler_factor > 0) {
        int has_prof = 0;
        for (int i = 0; i < L->cfg.n_train_args; i++) has_prof |= !strcmp(L->cfg.train_args[i], "--profile");
        extra[k++] = "--progress-file", extra[k++] = L->watch.progress;
        if (!has_prof) extra[k++] = "--profile", extra[k++] = (char *)L->cfg.profile;
    }
    if (resume_mb > 0) extra[k++] = "--resume", extra[k++] = L->cfg.ckpt_dir;
    extra[k] = NULL;
    PD_ASSERT(k < L->cfg.n_train_args + 32);
    char **argv = launch_mpirun_argv(L, buf, extra);
    free(extra);
    return argv;
}

/* Starts the attempt and watches it to its end: the plan for the hosts (made if none), its
 * files, the start event. 0 when there is nothing to start (a signal, too few hosts, no plan,
 * mpirun cannot run: R->rc says how launch ends), else 1. */
static int attempt_start(Launch *L, const Profile *prof, Run *R) {
    char ckn[PATH_MAX + 64];
    Err err = {0};
    if (launch_stop) {   /* a signal while launch was between attempts (probing, planning) */
        fprintf(stderr, "pipedream: launch: stopped on signal %d\n", (int)launch_stop);
        event_stopped(L, R, 0);
        return 0;
    }
    if (R->n_hosts < L->cfg.min_hosts) {
        fprintf(stderr, "pipedream: error: launch: %d host%s left, fewer than --min-hosts %d; last checkpoint: %s\n",
                R->n_hosts, R->n_hosts == 1 ? "" : "s", L->cfg.min_hosts,
                launch_ckpt_name(L->cfg.ckpt_dir, launch_ckpt_newest(L), ckn, sizeof ckn));
        FILE *e = launch_event_begin(L, "gave_up");
        if (e) fprintf(e, ",\"reason\":\"fewer than %d hosts\",\"hosts\":", L->cfg.min_hosts), launch_json_hosts(e, R->hosts, R->n_hosts);
        launch_event_end(e);
        return 0;
    }
    if (!R->plan && !(R->plan = launch_plan_for(L, prof, R->hosts, R->n_hosts, &err))) {
        R->rc = cli_fail(&err);
        return 0;
    }
    snprintf(R->plan_path, sizeof R->plan_path, "%s/plan-%d.json", L->cfg.run_dir, R->attempt);
    snprintf(R->hf_path, sizeof R->hf_path, "%s/hosts-%d", L->cfg.run_dir, R->attempt);
    snprintf(R->out_path, sizeof R->out_path, "%s/train-%d.out", L->cfg.run_dir, R->attempt);
    snprintf(R->err_path, sizeof R->err_path, "%s/train-%d.err", L->cfg.run_dir, R->attempt);
    if (plan_save(R->plan, R->plan_path, &err)) {
        R->rc = cli_fail(&err);
        return 0;
    }
    if (launch_hosts_write(R->hf_path, R->hosts, R->n_hosts)) {
        fprintf(stderr, "pipedream: error: cannot write %s: %s\n", R->hf_path, strerror(errno));
        return 0;
    }
    long resume_mb = launch_ckpt_newest(L);
    launch_watch_reset(L, R->attempt);
    char *buf, **argv = train_argv(L, R, resume_mb, &buf);

    char brief[512];
    launch_plan_brief(R->plan, brief, sizeof brief);
    fprintf(stderr, "pipedream: launch: attempt %d on %d host%s (%s)%s\n", R->attempt, R->n_hosts,
            R->n_hosts == 1 ? "" : "s", brief, resume_mb > 0 ? ", resuming" : "");
    FILE *e = launch_event_begin(L, "start");
    if (e) {
        fprintf(e, ",\"attempt\":%d,\"hosts\":", R->attempt);
        launch_json_hosts(e, R->hosts, R->n_hosts);
        fputs(",\"plan\":", e);
        launch_json_plan(e, R->plan);
        fprintf(e, ",\"plan_file\":");
        launch_json_str(e, R->plan_path);
        fprintf(e, ",\"resume_minibatches\":%ld", resume_mb > 0 ? resume_mb : 0);
    }
    launch_event_end(e);

    R->rec.attempt = R->attempt, R->rec.hosts = R->n_hosts, R->rec.resume_mb = resume_mb;
    R->g = (LaunchGrow){.prof = prof, .hosts = R->hosts, .n_hosts = R->n_hosts, .plan = R->plan};
    int started = !launch_run_attempt(L, argv, R->plan_path, R->out_path, R->err_path, &R->A, &R->rec, &R->g);
    free(argv), free(buf);
    if (R->A.ck_newest > L->learned.ck_announced) L->learned.ck_announced = R->A.ck_newest;
    if (!started) {   /* mpirun cannot run at all: no host is to blame */
        gave_up(L, R->A.first_error);
        return 0;
    }
    if (L->learned.restart_from > 0 && R->A.t_training > 0) L->learned.restart_s = R->A.t_training - L->learned.restart_from;
    L->learned.restart_from = 0;
    launch_status_text(R->A.status, R->status, sizeof R->status);
    return 1;
}

/* What the attempt ended in. Completed: exit 0, or a summary written before the job was ended
 * anyway. Launch ended it at a checkpoint to re-plan or take hosts in. */
static Outcome attempt_outcome(Launch *L, Run *R) {
    if (launch_stop) return OUT_STOPPED;
    const LaunchAttempt *A = &R->A;
    int completed = (WIFEXITED(A->status) && WEXITSTATUS(A->status) == 0) || launch_has_summary(R->out_path);
    if (A->grow && !completed) {
        L->learned.restart_from = A->t_kill;
        return R->g.replan ? OUT_REPLANNED : OUT_GROWN;
    }
    plan_free(R->g.next);
    R->g.next = NULL;
    return completed ? OUT_COMPLETED : OUT_FAILED;
}

/* Hosts of the attempt left out of the next one stay out until the hostfile changes. */
static void drop_hosts(Launch *L, const LaunchHost *h, const int *gone, int n) {
    struct stat stf;
    struct timespec hf_now = stat(L->cfg.hostfile, &stf) ? L->learned.hf_seen : stf.st_mtim;
    for (int r = 0; r < n; r++)
        if (gone[r] && L->learned.n_dropped < MAX_HOSTS)
            L->learned.dropped_at[L->learned.n_dropped] = hf_now, L->learned.dropped[L->learned.n_dropped++] = h[r];
}

/* The next attempt runs on hosts[0..n) with plan next (taken). */
static void take_hosts(Run *R, const LaunchHost *hosts, int n, Plan *next) {
    memmove(R->hosts, hosts, sizeof(LaunchHost) * (size_t)n);
    R->n_hosts = n;
    plan_free(R->plan);
    R->plan = next;
}

/* Re-planned around a straggler (launch_replan_check): the replan event, the hosts left out
 * dropped, the next attempt on the new plan. */
static void replanned(Launch *L, Run *R) {
    LaunchGrow *g = &R->g;
    long ck = launch_ckpt_newest(L);
    int gone[MAX_HOSTS], n_gone = 0;
    for (int r = 0; r < R->n_hosts; r++) n_gone += gone[r] = !launch_host_in(R->hosts[r].name, g->next_hosts, g->n_next);
    FILE *e = launch_event_begin(L, "replan");
    if (e) {
        fprintf(e, ",\"attempt\":%d,\"reason\":", R->attempt);
        launch_json_str(e, g->why);
        fprintf(e, ",\"predicted_s_per_minibatch_before\":%.6g,\"predicted_s_per_minibatch_after\":%.6g,\"removed\":[",
                g->t_now, g->t_next);
        for (int r = 0, c = 0; r < R->n_hosts; r++)
            if (gone[r]) fprintf(e, "%s", c++ ? "," : ""), launch_json_str(e, R->hosts[r].name);
        fputc(']', e);
        launch_json_change(e, R->hosts, R->n_hosts, g->next_hosts, g->n_next, R->plan, g->next, ck);
    }
    launch_event_end(e);
    fprintf(stderr, "pipedream: launch: re-planned %s; %d host%s; resuming from minibatch %ld\n", g->why, g->n_next,
            g->n_next == 1 ? "" : "s", ck > 0 ? ck : 0);
    int dropped = g->n_next != R->n_hosts;
    if (dropped) drop_hosts(L, R->hosts, gone, R->n_hosts);
    take_hosts(R, g->next_hosts, g->n_next, g->next);
    g->next = NULL;
    R->changes += dropped;
    L->learned.n_replans++;
}

/* Hosts taken in (launch_grow_check): the membership event, the next attempt on more hosts. */
static void grown(Launch *L, Run *R) {
    LaunchGrow *g = &R->g;
    long ck = launch_ckpt_newest(L);
    LaunchHost after[MAX_HOSTS];
    memcpy(after, R->hosts, sizeof(LaunchHost) * (size_t)R->n_hosts);
    memcpy(after + R->n_hosts, g->add, sizeof(LaunchHost) * (size_t)g->n_add);
    FILE *e = launch_event_begin(L, "membership");
    if (e) {
        fprintf(e, ",\"attempt\":%d,\"reason\":\"hosts listed and answering; the planner predicts %.6g s per minibatch instead of %.6g\",\"added\":",
                R->attempt, g->next->pipeline_s, R->plan->pipeline_s);
        launch_json_hosts(e, g->add, g->n_add);
        fputs(",\"removed\":[]", e);
        launch_json_change(e, R->hosts, R->n_hosts, after, R->n_hosts + g->n_add, R->plan, g->next, ck);
    }
    launch_event_end(e);
    fprintf(stderr, "pipedream: launch: took in");
    for (int i = 0; i < g->n_add; i++) fprintf(stderr, " %s", g->add[i].name);
    fprintf(stderr, "; %d hosts; resuming from minibatch %ld\n", R->n_hosts + g->n_add, ck > 0 ? ck : 0);
    take_hosts(R, after, R->n_hosts + g->n_add, g->next);
    g->next = NULL;
    R->changes++;
}

/* Completed: the train summary (stdout of the last attempt) is launch's stdout; the done line
 * and event. */
static void completed(Launch *L, Run *R) {
    FILE *o = fopen(R->out_path, "r");
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
            steps, R->n_hosts, R->n_hosts == 1 ? "" : "s", R->changes, R->changes == 1 ? "" : "s", R->total_lost,
            R->rec.total_s);
    if (L->learned.n_listed) fprintf(stderr, ", straggler%s: %s", L->learned.n_listed == 1 ? "" : "s", L->learned.stragglers);
    if (L->learned.n_replans) fprintf(stderr, ", %d re-plan%s", L->learned.n_replans, L->learned.n_replans == 1 ? "" : "s");
    fputc('\n', stderr);
    FILE *e = launch_event_begin(L, "done");
    if (e) {
        fprintf(e, ",\"steps\":%ld,\"hosts\":", steps);
        launch_json_hosts(e, R->hosts, R->n_hosts);
        fprintf(e, ",\"membership_changes\":%d,\"minibatches_lost\":%ld,\"recovery_s\":%.3f,\"replans\":%d,\"stragglers\":[",
                R->changes, R->total_lost, R->rec.total_s, L->learned.n_replans);
        char sl[sizeof L->learned.stragglers], *save = NULL;
        snprintf(sl, sizeof sl, "%s", L->learned.stragglers);
        int c = 0;
        for (char *h = strtok_r(sl, " ", &save); h; h = strtok_r(NULL, " ", &save)) {
            if (c++) fputc(',', e);
            launch_json_str(e, h);
        }
        fputc(']', e);
    }
    launch_event_end(e);
    R->rc = CLI_OK;
}

/* The hosts the failed attempt lost, in gone[] (rank r on hosts[r]); their count, or -1 when a
 * signal stopped the probes. Gone: the hosts whose daemon Open MPI lost, the ranks a survivor
 * named lost that did not speak themselves; failing those, the ranks that stayed silent while
 * others stopped, or the rank most waited for in timeouts. Then every other host whose rank
 * printed nothing (a rank that spoke was reachable) and that does not answer a probe (a probe
 * that could not say counts for nothing). */
static int lost_hosts(Launch *L, const Run *R, int *gone) {
    const LaunchAttempt *A = &R->A;
    int n = R->n_hosts, n_gone = 0;
    memset(gone, 0, sizeof *gone * (size_t)n);
    for (int i = 0; i < A->n_daemon_lost; i++)
        for (int r = 0; r < n; r++)
            if (!gone[r] && !strcmp(A->daemon_lost[i], R->hosts[r].name)) gone[r] = 1, n_gone++;
    for (int r = 0; r < n; r++)
        if (!gone[r] && A->lost[r] && !A->spoke[r]) gone[r] = 1, n_gone++;
    if (!n_gone && A->any_spoke)
        for (int r = 0; r < n; r++)
            if (!A->spoke[r]) gone[r] = 1, n_gone++;
    if (!n_gone) {
        int worst = -1;
        for (int r = 0; r < n; r++)
            if (A->late[r] && (worst < 0 || A->late[r] > A->late[worst])) worst = r;
        if (worst >= 0) gone[worst] = 1, n_gone++;
    }
    for (int r = 0; r < n && !launch_stop; r++)
        if (!gone[r] && !A->spoke[r] && !launch_probe_host(L, &R->hosts[r])) {
            fprintf(stderr, "pipedream: launch: host %s does not answer (rank %d)\n", R->hosts[r].name, r);
            gone[r] = 1, n_gone++;
        }
    return launch_stop ? -1 : n_gone;
}

/* The attempt failed: the lost hosts dropped (and any taken out of the hostfile), a plan for
 * the rest, the failure or membership event; or the end (mpirun cannot start the job, a
 * signal while probing, a second failure without progress, too many restarts). 1 to go on. */
static int failed(Launch *L, const Profile *prof, Run *R) {
    const LaunchAttempt *A = &R->A;
    char ckn[PATH_MAX + 64];
    Err err = {0};
    R->rec.t_detect = A->t_fail;
    if (WIFEXITED(A->status) && WEXITSTATUS(A->status) == 127 && !A->any_spoke && !A->t_training) {
        /* mpirun, or the program it was to run, was not found: no host is to blame */
        fprintf(stderr, "pipedream: error: launch: %s before any rank started (a program not found: %s or %s); "
                "last checkpoint: %s\n", R->status, L->cfg.mpirun, L->cfg.exe,
                launch_ckpt_name(L->cfg.ckpt_dir, launch_ckpt_newest(L), ckn, sizeof ckn));
        gave_up(L, "mpirun exited 127 before any rank started (a program not found)");
        return 0;
    }
    int gone[MAX_HOSTS];
    if (lost_hosts(L, R, gone) < 0) {   /* interrupted while probing: what the probes did not finish says nothing */
        fprintf(stderr, "pipedream: launch: stopped on signal %d while probing after the failure (%s)\n",
                (int)launch_stop, R->status);
        event_stopped(L, R, 1);
        return 0;
    }
    long ck = launch_ckpt_newest(L);
    long lost_mb = launch_lost_estimate(A, L->cfg.ckpt_every, R->plan->pipeline_s);
    R->total_lost += lost_mb;
    LaunchHost after[MAX_HOSTS];
    int n_after = 0, n_hosts = R->n_hosts;
    drop_hosts(L, R->hosts, gone, n_hosts);
    for (int r = 0; r < n_hosts; r++)
        if (!gone[r]) after[n_after++] = R->hosts[r];
    /* hosts taken out of the hostfile go too */
    LaunchHost listed[MAX_HOSTS];
    int n_listed = launch_hosts_read(L->cfg.hostfile, listed, MAX_HOSTS);
    if (n_listed >= 0) {
        int m = 0;
        for (int i = 0; i < n_after; i++)
            if (launch_host_in(after[i].name, listed, n_listed)) after[m++] = after[i];
        n_after = m;
    }
    Plan *next = NULL;
    if (n_after != n_hosts && n_after >= L->cfg.min_hosts && !(next = launch_plan_for(L, prof, after, n_after, &err))) {
        R->rc = cli_fail(&err);
        return 0;
    }
    char why[700];
    snprintf(why, sizeof why, "%s%s%.600s", R->status, A->first_error[0] ? ": " : "", A->first_error);
    fprintf(stderr, "pipedream: launch: attempt %d failed (%s)\n", R->attempt, why);
    FILE *e = launch_event_begin(L, n_after != n_hosts ? "membership" : "failure");
    if (e) {
        fprintf(e, ",\"attempt\":%d,\"reason\":", R->attempt);
        launch_json_str(e, why);
        fputs(",\"exit_status\":", e);
        fprintf(e, "%d", WIFEXITED(A->status) ? WEXITSTATUS(A->status) : 128 + WTERMSIG(A->status));
        fputs(",\"lost_ranks\":[", e);
        for (int r = 0, c = 0; r < n_hosts; r++)
            if (gone[r]) fprintf(e, "%s%d", c++ ? "," : "", r);
        fputs("],\"removed\":[", e);
        for (int r = 0, c = 0; r < n_hosts; r++)
            if (gone[r]) fprintf(e, "%s", c++ ? "," : ""), launch_json_str(e, R->hosts[r].name);
        fputc(']', e);
        launch_json_change(e, R->hosts, n_hosts, after, n_after, R->plan, next ? next : n_after == n_hosts ? R->plan : NULL,
                           ck);
        fprintf(e, ",\"minibatches_lost\":%ld,\"detected_t\":%.3f", lost_mb, A->t_fail - L->t0);
    }
    launch_event_end(e);
    if (n_after != n_hosts) {
        R->changes++;
        fprintf(stderr, "pipedream: launch: removed");
        for (int r = 0; r < n_hosts; r++)
            if (gone[r]) fprintf(stderr, " %s (rank %d)", R->hosts[r].name, r);
        fprintf(stderr, "; %d host%s left; resuming from minibatch %ld (about %ld minibatches lost)\n", n_after,
                n_after == 1 ? "" : "s", ck > 0 ? ck : 0, lost_mb);
        take_hosts(R, after, n_after, next);
    }
    if (n_after == n_hosts && ck == R->ck_last_failure) {   /* no host to blame, no progress since */
        fprintf(stderr, "pipedream: error: launch: failed twice on the same hosts without a new checkpoint (%s); "
                "last checkpoint: %s\n", why, launch_ckpt_name(L->cfg.ckpt_dir, ck, ckn, sizeof ckn));
        gave_up(L, "failed twice without a lost host or a new checkpoint");
        return 0;
    }
    R->ck_last_failure = n_after == n_hosts ? ck : -2;
    if (++R->restarts > L->cfg.max_restarts) {
        fprintf(stderr, "pipedream: error: launch: %d relaunches, more than --max-restarts %d; last checkpoint: %s\n",
                R->restarts - 1, L->cfg.max_restarts, launch_ckpt_name(L->cfg.ckpt_dir, ck, ckn, sizeof ckn));
        char reason[64];
        snprintf(reason, sizeof reason, "more than %d relaunches", L->cfg.max_restarts);
        gave_up(L, reason);
        return 0;
    }
    return 1;
}

int launch_supervise(Launch *L, const Profile *prof) {
    Run *R = calloc(1, sizeof *R);
    PD_ASSERT(R);
    R->rc = CLI_FAIL;
    R->ck_last_failure = -2;
    struct stat st0;
    if (!stat(L->cfg.hostfile, &st0)) L->learned.hf_seen = st0.st_mtim;
    if ((R->n_hosts = launch_hosts_read(L->cfg.hostfile, R->hosts, MAX_HOSTS)) < 0) {
        free(R);
        return CLI_FAIL;
    }
    for (int more = 1; more && attempt_start(L, prof, R); R->attempt++) {
        switch (attempt_outcome(L, R)) {
        case OUT_STOPPED:
            fprintf(stderr, "pipedream: launch: stopped on signal %d (%s)\n", (int)launch_stop, R->status);
            event_stopped(L, R, 0);
            more = 0;
            break;
        case OUT_REPLANNED: replanned(L, R); break;
        case OUT_GROWN: grown(L, R); break;
        case OUT_COMPLETED: completed(L, R), more = 0; break;
        case OUT_FAILED: more = failed(L, prof, R); break;
        }
    }
    plan_free(R->plan);
    plan_free(R->g.next);
    int rc = R->rc;
    free(R);
    return rc;
}
