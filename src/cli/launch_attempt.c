/* launch_attempt.c: one attempt: mpirun run to its end, its stderr relayed to ours and into the
 * attempt's log, each line read; on the way the pace and straggler checks, hosts taken in and
 * re-plans (the job ended at a checkpoint), and the grace after a failure or a signal before
 * mpirun is ended. */
#define _DEFAULT_SOURCE
#include "launch_impl.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The job as the attempt watches it: mpirun's pid, its stderr pipe and our copy of it, the line
 * being read; whether its stderr closed, it was ended by launch (when) or a restart is pending
 * (hosts to take in or a re-plan: the job is ended at the next checkpoint), whether it was
 * reaped (when). */
typedef struct Job {
    pid_t pid;
    int fd;
    FILE *log;
    char line[4096];
    size_t ln;
    int eof, killed, pending, reaped;
    double t_kill, t_exit;
} Job;

/* Still running as launch left it: nothing to end it for yet. */
static int running(const Job *j, const LaunchAttempt *A) { return !j->eof && !j->killed && !j->reaped && !A->t_fail; }

/* Ends the job (SIGTERM to mpirun; SIGKILL to its group 10 s later, end_overdue); grow: to
 * restart it from the newest checkpoint. */
static void end_job(Job *j, LaunchAttempt *A, int grow) {
    kill(j->pid, SIGTERM);
    j->killed = 1;
    j->t_kill = launch_now();
    if (grow) A->grow = 1, A->t_kill = j->t_kill;
}

/* One whole line of the job's stderr: read; the recovery over when the job trains again; at a
 * checkpoint, a pending restart done and the pace checked. */
static void on_line(Launch *L, Job *j, LaunchAttempt *A, LaunchRecovery *rec, LaunchGrow *g) {
    launch_scan_line(A, j->line, launch_now());
    if (rec->t_detect > 0 && A->t_training > 0) launch_recovered(L, rec, A->t_training);
    if (A->ck_seen && j->pending && running(j, A) && A->ck_mb[1] < A->n_mb) {
        if (g->replan)
            fprintf(stderr, "pipedream: launch: re-planning (%s): predicted %.4g s per minibatch instead of %.4g; "
                    "restarting from the newest checkpoint\n", g->why, g->t_next, g->t_now);
        else
            fprintf(stderr, "pipedream: launch: taking in %d host%s: predicted %.4g s per minibatch instead of %.4g; "
                    "restarting from the newest checkpoint\n", g->n_add, g->n_add == 1 ? "" : "s",
                    g->next->pipeline_s, g->plan->pipeline_s);
        end_job(j, A, 1);
    }
    if (A->ck_seen) launch_pace_check(L, A);
    A->ck_seen = 0;
}

/* What the job wrote to stderr within 200 ms: relayed to ours and the log, read line by line. */
static void read_stderr(Launch *L, Job *j, LaunchAttempt *A, LaunchRecovery *rec, LaunchGrow *g) {
    char buf[8192];
    struct pollfd pf = {j->fd, POLLIN, 0};
    if (poll(&pf, 1, 200) <= 0) return;
    ssize_t n = read(j->fd, buf, sizeof buf);
    if (n <= 0) {
        j->eof = 1;
        return;
    }
    fwrite(buf, 1, (size_t)n, stderr);
    if (j->log) fwrite(buf, 1, (size_t)n, j->log);
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == '\n' || j->ln == sizeof j->line - 1) {
            j->line[j->ln] = 0;
            on_line(L, j, A, rec, g);
            j->ln = 0;
        } else {
            j->line[j->ln++] = buf[i];
        }
    }
}

/* A checkpoint overdue by 2 x --straggler-factor times the last interval, and by more than the
 * job's --timeout (a host that stopped answering has failed the job by then): the pace has
 * dropped; the links are to be probed now rather than after two slow lines. */
static void check_stall(Launch *L, const Job *j, const LaunchAttempt *A) {
    double since = launch_now() - (A->t_ck[1] > 0 ? A->t_ck[1] : A->t_training);
    double last = A->t_ck[1] > 0 ? A->t_ck[1] - (A->t_ck[0] > 0 ? A->t_ck[0] : A->t_training) : 0;
    if (running(j, A) && !j->pending && L->cfg.straggler_factor > 0 && last > 0 && A->ck_mb[1] != L->watch.stall_ck &&
        since > 2 * L->cfg.straggler_factor * last && since > L->cfg.job_timeout) {
        fprintf(stderr, "pipedream: launch: no checkpoint for %.1f s, %.1f times the last interval: probing the links\n",
                since, since / last);
        L->watch.stall_ck = A->ck_mb[1];
        L->watch.replan_wanted = L->watch.probe_wanted = 1;
    }
}

/* A straggler reported, or a pipeline slower than predicted: probe, plan around it
 * (launch_replan_check). The next checkpoint at the pace predicted now, against redoing the work
 * since the last one at the new plan's pace plus a restart: the job restarts now when that is
 * sooner, else at the next checkpoint. */
static void check_replan(Launch *L, Job *j, LaunchAttempt *A, LaunchGrow *g) {
    if (!running(j, A) || j->pending || !(A->t_training > 0) || !L->watch.replan_wanted ||
        !launch_replan_check(L, g, A->n_mb - A->ck_mb[1]))
        return;
    j->pending = 1;
    double since = launch_now() - (A->t_ck[1] > 0 ? A->t_ck[1] : A->t_training);
    double wait = L->cfg.ckpt_every * g->t_now - since, redo = since * g->t_next / g->t_now + L->learned.restart_s;
    if (wait > redo) {
        fprintf(stderr, "pipedream: launch: re-planning (%s): predicted %.4g s per minibatch instead of %.4g; "
                "restarting now from the newest checkpoint (the next is about %.0f s away at this pace)\n",
                g->why, g->t_next, g->t_now, wait);
        end_job(j, A, 1);
    }
}

/* A signal to launch ends the job; so does the grace after a failure running out (a host gone
 * silent can keep mpirun waiting); a job ended 10 s ago and still there is killed. */
static void check_end(Launch *L, Job *j, LaunchAttempt *A) {
    if (j->eof || j->reaped) return;
    if (!j->killed && launch_stop) {
        fprintf(stderr, "pipedream: launch: stopping on signal %d: ending mpirun\n", (int)launch_stop);
        end_job(j, A, 0);
    } else if (!j->killed && A->t_fail && launch_now() - A->t_fail > L->cfg.grace) {
        fprintf(stderr, "pipedream: launch: mpirun still running %.0f s after the failure: ending it\n",
                launch_now() - A->t_fail);
        end_job(j, A, 0);
    } else if (j->killed && launch_now() - j->t_kill > 10) {
        kill(-j->pid, SIGKILL);
        kill(j->pid, SIGKILL);
    }
}

/* Runs one mpirun to its end (stdin from in_path), relaying its stderr to ours and into err_path. When the hostfile
 * changes it probes and plans (launch_grow_check); with hosts to take in, it ends the job at the
 * next checkpoint (A->grow) so that the next attempt resumes from there on more hosts. It reads
 * mpirun's stderr until it closes, or until 2 s after mpirun ended (a process it left behind
 * may hold the pipe open), then ends what mpirun left in its process group. */
int launch_run_attempt(Launch *L, char **argv, const char *in_path, const char *out_path, const char *err_path,
                       LaunchAttempt *A, LaunchRecovery *rec, LaunchGrow *g) {
    memset(A, 0, sizeof *A);
    A->ck_newest = -1;
    A->t_start = launch_now();
    Job j = {.log = fopen(err_path, "we")};
    if ((j.pid = launch_spawn(argv, in_path, out_path, &j.fd)) < 0) {
        int e = errno;
        if (j.log) fclose(j.log);
        snprintf(A->first_error, sizeof A->first_error, "cannot run %.400s: %s", argv[0], strerror(e));
        fprintf(stderr, "pipedream: error: launch: %s\n", A->first_error);
        return -1;
    }
    launch_child = j.pid;
    while (!j.eof) {
        if (!j.reaped && waitpid(j.pid, &A->status, WNOHANG) == j.pid) j.reaped = 1, j.t_exit = launch_now();
        if (j.reaped && launch_now() - j.t_exit > 2) break;
        read_stderr(L, &j, A, rec, g);
        if (L->cfg.straggler_factor > 0) launch_straggler_check(L, g->hosts, g->n_hosts, g->plan->chunks);
        /* the hostfile changed: probe and plan now, end the job at the next checkpoint */
        if (running(&j, A) && !j.pending && A->t_training > 0 && launch_grow_check(L, g)) j.pending = 1;
        check_stall(L, &j, A);
        check_replan(L, &j, A, g);
        check_end(L, &j, A);
    }
    close(j.fd);
    if (!j.reaped) waitpid(j.pid, &A->status, 0);
    if (!(WIFEXITED(A->status) && WEXITSTATUS(A->status) == 0) && !A->t_fail) A->t_fail = launch_now();
    launch_end_group(j.pid);
    launch_child = 0;
    if (j.log) fclose(j.log);
    return 0;
}
