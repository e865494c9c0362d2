/* launch_impl.h: the parts of `pipedream launch` (cmd_launch.c: flags; launch_supervise.c: the
 * loop over attempts; launch_attempt.c, launch_proc.c, launch_scan.c, launch_pace.c,
 * launch_plan.c, launch_events.c) and the state they share. */
#ifndef PD_LAUNCH_IMPL_H
#define PD_LAUNCH_IMPL_H

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <sys/types.h>
#include <time.h>

#include "cli.h"
#include "plan.h"
#include "profile.h"
#include "schedule.h"

#define MAX_HOSTS 256
#define MAX_RANKS MAX_HOSTS

typedef struct LaunchHost {
    char name[256];
} LaunchHost;

/* What launch was told: its flags, and what the train flags say about the job. */
typedef struct LaunchConfig {
    const char *hostfile, *profile, *run_dir, *model, *events_path, *mpirun, *mpirun_args;
    int ckpt_every, min_hosts, straight, max_restarts;
    double bandwidth, probe_timeout, grace;
    char **train_args;
    int n_train_args;
    char exe[PATH_MAX], ckpt_dir[PATH_MAX];
    int ckpt_dir_given;        /* --checkpoint-dir: a path on each host, which launch does not read */
    double straggler_factor;   /* 0: stragglers not watched */
    int replan;                /* re-plan around stragglers (off with --no-replan) */
    /* the job: its schedule, train's --microbatches (0: its default), --minibatch (64 unless
     * given), --vertical-sync, --chunks, --wire bf16, --recompute; the optimizer's state per
     * parameter (Adam 2, else 1); train's --timeout (its default, 300, unless the train flags
     * give one) */
    SchedKind kind;
    int micro, minibatch, vsync, chunks, wire_bf16, recompute;
    double opt_state_factor, job_timeout;
    double probe_bytes;        /* --link-probe-bytes */
} LaunchConfig;

/* What launch watches during one attempt (reset at each start): the attempt's progress file
 * (train --progress-file) and how far it is read; per rank the checkpoints in a row over
 * --straggler-factor, whether reported, its last compute over prediction; checkpoints in a
 * row whose time per unit is over --straggler-factor times the slowest stage's prediction; a
 * re-plan asked for, links to probe first, and the time per unit when this attempt last probed
 * them (0: not yet); the checkpoint after which an overdue next one had the links probed; the
 * least seconds per minibatch between checkpoints, and at the last probe. */
typedef struct LaunchWatch {
    char progress[PATH_MAX + 32];
    long progress_at;
    int over[MAX_HOSTS], reported[MAX_HOSTS];
    double ratio[MAX_HOSTS];
    int slow_rows, replan_wanted, probe_wanted;
    double probe_wall;
    long stall_ck;
    double best_pace, probe_pace;
} LaunchWatch;

/* What launch has learnt over the whole run: the hostfile's modification time at the last
 * look; dropped hosts and the modification time when they were dropped (taken back only after
 * the file changed); the stragglers reported (count; each host once); what is known about
 * hosts by name (a compute straggler's speed relative to the others, a slow link's measured
 * rate), planned with as a heterogeneous cluster from then on; what the last restart by
 * launch took (job ended to training again; 10 before one) and when launch ended the last
 * attempt to restart it (0: it did not); the re-plans; the newest checkpoint a job announced
 * (-1: none; launch_ckpt_newest). */
typedef struct LaunchKnown { char name[256]; double speed, bandwidth; } LaunchKnown;
typedef struct LaunchLearned {
    struct timespec hf_seen;
    LaunchHost dropped[MAX_HOSTS];
    struct timespec dropped_at[MAX_HOSTS];
    int n_dropped;
    char stragglers[1024];
    int n_stragglers, n_listed;
    LaunchKnown known[MAX_HOSTS];
    int n_known;
    double restart_s, restart_from;
    int n_replans;
    long ck_announced;
} LaunchLearned;

typedef struct Launch {
    LaunchConfig cfg;
    LaunchWatch watch;
    LaunchLearned learned;
    FILE *events;   /* --events (NULL: none) */
    double t0;      /* when launch started (events' "t") */
} Launch;

typedef struct LaunchAttempt {
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
    long ck_newest;              /* the newest checkpoint rank 0 or its partner announced (-1: none) */
    long n_mb;                   /* the run's minibatches (rank 0's "training" line) */
    int grow;                    /* ended by launch to take hosts in or re-plan (below) */
    double t_kill;               /* when launch ended it for that */
    char first_error[512];
} LaunchAttempt;

/* A failure being recovered from: when it was detected (0: none), what the relaunch resumes. */
typedef struct LaunchRecovery {
    double t_detect, total_s;
    int attempt, hosts;
    long resume_mb;
} LaunchRecovery;

/* Hosts to take in at a checkpoint: the candidates that answer, and the plan with them. */
typedef struct LaunchGrow {
    const Profile *prof;
    const LaunchHost *hosts;
    int n_hosts;
    const Plan *plan;
    LaunchHost add[MAX_HOSTS];
    int n_add;
    Plan *next;
    /* or a re-plan around stragglers (launch_replan_check): the hosts of the next attempt (the
     * current ones, or without a straggler), the predicted times and why */
    int replan;
    LaunchHost next_hosts[MAX_HOSTS];
    int n_next;
    double t_now, t_next;
    char why[512];
} LaunchGrow;

/* Set by SIGINT, SIGTERM or SIGHUP (the signal); the mpirun being run gets SIGTERM then. */
extern volatile sig_atomic_t launch_stop;
extern volatile pid_t launch_child;
/* Installs the handler of launch_stop, and ignores SIGPIPE. */
void launch_signals_install(void);

/* ---- launch_proc.c: child processes (mpirun and its probes) */
/* Seconds on the monotonic clock. */
double launch_now(void);
/* argv of mpirun: the binary, --mpirun-args split at spaces, then extra (NULL-terminated),
 * whatever their lengths. The caller frees *buf (the strings of --mpirun-args) and the array. */
char **launch_mpirun_argv(const Launch *L, char **buf, char *const *extra);
/* Forks argv in a process group of its own, stdin from in_path and stdout to out_path (NULL:
 * /dev/null), stderr into a pipe (*err_fd); the child inherits no other descriptor. Its pid, or
 * -1 with errno set when it could not start (exec failed included); nothing is left open then. */
pid_t launch_spawn(char **argv, const char *in_path, const char *out_path, int *err_fd);
/* Ends what is left of process group pgid (its leader has ended): SIGTERM, then SIGKILL. */
void launch_end_group(pid_t pgid);
/* Runs argv for at most `seconds`: 1 ended by itself (*status), 0 ended at the time limit, -1
 * could not start or launch is stopping (a signal). */
int launch_run_quietly(char **argv, const char *out_path, double seconds, int *status);
/* Does host h run `true` under mpirun within --probe-timeout? 1 yes, 0 no, -1 unknown. */
int launch_probe_host(const Launch *L, const LaunchHost *h);
/* Can path (a bare name: on PATH) be run? */
int launch_mpirun_found(const char *path);

/* ---- launch_scan.c: what a job leaves: its stderr lines, its summary, its checkpoints */
/* "DIR/ckpt-<minibatches>.safetensors" into b, or "none" when mb < 0; returns b. */
const char *launch_ckpt_name(const char *dir, long mb, char *b, size_t n);
/* Reads what one stderr line of the job (at time t) says into A: training, checkpoints,
 * failures (typed lines only), who spoke, who was lost or waited for. */
void launch_scan_line(LaunchAttempt *A, const char *raw, double t);
/* Minibatches the failed attempt trained since its newest checkpoint: 0 to ckpt_every. */
long launch_lost_estimate(const LaunchAttempt *A, int ckpt_every, double predicted_s);
/* The newest ckpt-<minibatches>.safetensors in dir: its minibatches, or -1. */
long launch_newest_ckpt(const char *dir);
/* The newest checkpoint to resume from: the newest any attempt's job announced (rank 0's
 * "checkpoint" line, its partner's "second copy" line: complete on a host's disk), or, in the
 * default RUN_DIR/ckpt, the newest file there (a run launched again). Its minibatches, or -1. */
long launch_ckpt_newest(const Launch *L);
/* Does the attempt's stdout hold the training summary? */
int launch_has_summary(const char *path);
/* waitpid's status of mpirun in words. */
int launch_status_text(int st, char *b, size_t n);

/* ---- launch_pace.c: the pace and straggler checks of a running attempt */
/* The lower median of x[0..n) (0 when n is 0). */
double launch_median(const double *x, int n);
/* Counts a straggler report; lists the host once. */
void launch_note_straggler(Launch *L, const char *name);
/* Reads the progress lines since the last look; reports stragglers, asks for link probes. */
void launch_straggler_check(Launch *L, const LaunchHost *hosts, int n_hosts, int chunks);
/* At a checkpoint: the pace dropped by --straggler-factor: asks for link probes. */
void launch_pace_check(Launch *L, const LaunchAttempt *A);
/* Resets what is watched for attempt `attempt` (its progress file, removed). */
void launch_watch_reset(Launch *L, int attempt);

/* ---- launch_plan.c: hosts, plans, link probes and re-planning */
/* Reads an Open MPI hostfile (first word of a line, # comments, duplicates once): the count,
 * or -1 (message printed). */
int launch_hosts_read(const char *path, LaunchHost *out, int max);
/* Writes "host slots=1" lines; 0 or -1. */
int launch_hosts_write(const char *path, const LaunchHost *h, int n);
/* Is name among hosts[0..n)? */
int launch_host_in(const char *name, const LaunchHost *hosts, int n);
/* Is a later than b? */
int launch_ts_after(struct timespec a, struct timespec b);
/* The plan for these hosts under the job's schedule, micro-batches, chunks and wire (NULL: err). */
Plan *launch_plan_for(Launch *L, const Profile *prof, const LaunchHost *hosts, int n, Err *err);
/* `pipedream launch --link-probe BYTES` under mpirun -np 2: prints the rate in bytes/s. */
int launch_link_probe_main(const char *bytes_arg);
/* Probes links if asked, learns stragglers' speeds, and with re-planning on finds a plan
 * predicted 10% faster that pays for a restart: g->next and 1. */
int launch_replan_check(Launch *L, LaunchGrow *g, long remaining);
/* The hostfile changed: hosts to take in that answer, and a faster plan with them: 1. */
int launch_grow_check(Launch *L, LaunchGrow *g);

/* ---- launch_events.c: the event log (JSON lines) and the lines that describe plans */
/* The relaunch trains again: the recovery ends (stderr line, recovered event). */
void launch_recovered(const Launch *L, LaunchRecovery *rec, double t);
/* JSON writers for events: a string, hosts, a plan, the fields of a change of hosts or plan. */
void launch_json_str(FILE *f, const char *s);
void launch_json_hosts(FILE *f, const LaunchHost *h, int n);
void launch_json_plan(FILE *f, const Plan *p);
void launch_json_change(FILE *e, const LaunchHost *before, int nb, const LaunchHost *after, int na, const Plan *pb, const Plan *pa,
                        long ck);
/* "S stages: layers a-b xR, ..." */
void launch_plan_brief(const Plan *p, char *b, size_t n);
/* Starts an event line ({"event": kind, "t", "time"}; NULL without --events); the caller adds
 * its fields and ends it with launch_event_end. */
FILE *launch_event_begin(const Launch *L, const char *kind);
void launch_event_end(FILE *f);

/* ---- launch_attempt.c: one attempt, mpirun started to its end */
/* Runs one mpirun to its end, its stdin from in_path (the plan: mpirun forwards it to rank 0),
 * relaying its stderr to ours and into err_path; ends it at a checkpoint to take hosts in or
 * re-plan (A->grow), after --grace past a failure, or on a signal. 0, or -1 when mpirun could
 * not start (A->first_error says why). */
int launch_run_attempt(Launch *L, char **argv, const char *in_path, const char *out_path, const char *err_path,
                       LaunchAttempt *A, LaunchRecovery *rec, LaunchGrow *g);

/* ---- launch_supervise.c */
/* Attempts until the run completes or cannot go on: CLI_OK or CLI_FAIL. */
int launch_supervise(Launch *L, const Profile *prof);

#endif
