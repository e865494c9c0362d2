/* cmd_launch.c: `pipedream launch`: elastic training over the hosts of a hostfile. Plans for
 * the hosts alive (one worker each), runs `mpirun ... pipedream train --plan ... --checkpoint-*`
 * and supervises it: when the job fails, it names the lost host (the runtime's "lost rank"
 * lines, rank i runs on the i-th host of the attempt's hostfile; then a probe of each host),
 * drops it, plans again for the hosts left and relaunches with --resume from the last
 * checkpoint. When the hostfile changes, hosts listed and answering are taken in at the next
 * checkpoint if the planner predicts a gain (the job restarts from there). Stragglers (a host
 * computing slower than its prediction; a slow link, found by probing the links when the
 * pipeline runs slower than predicted) are reported and planned around the same way. Every
 * membership change goes to the event log (JSON lines) and the summary. This file: the flags;
 * the loop is launch_supervise.c, its parts the other launch_*.c (launch_impl.h). */
#define _DEFAULT_SOURCE   /* realpath */
#include "launch_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void help(FILE *f) {
    fprintf(f,
            "usage: pipedream launch --hosts HOSTFILE --profile PROFILE.json --run-dir DIR\n"
            "                        [--checkpoint-every N] [--checkpoint-dir PATH] [--min-hosts K]\n"
            "                        [--bandwidth B] [--events FILE.jsonl] [--mpirun-args \"ARGS\"]\n"
            "                        [--probe-timeout S] [--grace S] [--max-restarts R] [--straight]\n"
            "                        [--mpirun PATH] [--straggler-factor F | --no-stragglers]\n"
            "                        [--no-replan] MODEL.json [-- TRAIN_FLAGS...]\n\n"
            "Trains MODEL.json over the hosts of an Open MPI hostfile (lines \"host [slots=N]\",\n"
            "# comments), one worker per host, and keeps training when hosts fail: it plans the\n"
            "stages for the hosts alive, runs mpirun ... pipedream train --plan - (DIR/plan-K.json\n"
            "on mpirun's stdin: rank 0 reads it and sends it to the others) --checkpoint-every N\n"
            "--checkpoint-dir PATH, and when the job fails it names the failed host, drops it,\n"
            "plans again for the hosts left and resumes from the newest checkpoint the job\n"
            "announced. It stops when training completes (exit 0) or fewer than --min-hosts\n"
            "hosts are left (exit 1).\n\n"
            "  --hosts HOSTFILE        the hosts; re-read at each relaunch (hosts removed from it\n"
            "                          are not used again) and whenever it changes: hosts listed that\n"
            "                          answer are taken in at the next checkpoint if the planner\n"
            "                          predicts a faster minibatch (the job restarts from there)\n"
            "  --profile FILE          the model's profile (pipedream profile), for the planner\n"
            "  --run-dir DIR           plans, hostfiles, each attempt's output (on launch's machine)\n"
            "  --checkpoint-every N    minibatches between checkpoints (default 50)\n"
            "  --checkpoint-dir PATH   the checkpoints: a path on each host, which every rank creates\n"
            "                          (%%r: the rank); rank 0 and one host more keep each one\n"
            "                          (default DIR/ckpt)\n"
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

int cmd_launch(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        help(stdout);
        return CLI_OK;
    }
    if (argc == 3 && !strcmp(argv[1], "--link-probe")) return launch_link_probe_main(argv[2]);   /* launch's own probe */
    Launch L;
    memset(&L, 0, sizeof L);
    const char *ckpt_dir = NULL;
    L.cfg.ckpt_every = 50;
    L.cfg.min_hosts = 1;
    L.cfg.max_restarts = 16;
    L.cfg.bandwidth = 1.25e8;
    L.cfg.probe_timeout = 20;
    L.cfg.grace = 10;
    L.cfg.straggler_factor = 2;
    L.cfg.replan = 1;
    L.learned.restart_s = 10;
    L.learned.ck_announced = -1;
    L.cfg.job_timeout = 300;
    L.cfg.probe_bytes = 1e6;
    L.cfg.kind = SCHED_1F1B;
    L.cfg.opt_state_factor = 1;
    L.cfg.mpirun = "mpirun";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--")) {
            L.cfg.train_args = argv + i + 1;
            L.cfg.n_train_args = argc - i - 1;
            break;
        }
#define VAL() if (!(v = cli_value("launch", argc, argv, &i))) return CLI_USAGE
        if (!strcmp(a, "--hosts")) { VAL(); L.cfg.hostfile = v; }
        else if (!strcmp(a, "--profile")) { VAL(); L.cfg.profile = v; }
        else if (!strcmp(a, "--run-dir")) { VAL(); L.cfg.run_dir = v; }
        else if (!strcmp(a, "--events")) { VAL(); L.cfg.events_path = v; }
        else if (!strcmp(a, "--mpirun")) { VAL(); L.cfg.mpirun = v; }
        else if (!strcmp(a, "--mpirun-args")) { VAL(); L.cfg.mpirun_args = v; }
        else if (!strcmp(a, "--checkpoint-dir")) { VAL(); ckpt_dir = v; }
        else if (!strcmp(a, "--straight")) L.cfg.straight = 1;
        else if (!strcmp(a, "--checkpoint-every")) { VAL(); if (cli_parse_int("launch", a, v, 1, 1000000000, &L.cfg.ckpt_every)) return CLI_USAGE; }
        else if (!strcmp(a, "--min-hosts")) { VAL(); if (cli_parse_int("launch", a, v, 1, MAX_HOSTS, &L.cfg.min_hosts)) return CLI_USAGE; }
        else if (!strcmp(a, "--max-restarts")) { VAL(); if (cli_parse_int("launch", a, v, 0, 1000000, &L.cfg.max_restarts)) return CLI_USAGE; }
        else if (!strcmp(a, "--bandwidth")) { VAL(); if (cli_parse_double("launch", a, v, 1, 1e15, &L.cfg.bandwidth)) return CLI_USAGE; }
        else if (!strcmp(a, "--probe-timeout")) { VAL(); if (cli_parse_double("launch", a, v, 0.1, 1e5, &L.cfg.probe_timeout)) return CLI_USAGE; }
        else if (!strcmp(a, "--straggler-factor")) { VAL(); if (cli_parse_double("launch", a, v, 1, 1e6, &L.cfg.straggler_factor)) return CLI_USAGE; }
        else if (!strcmp(a, "--no-stragglers")) L.cfg.straggler_factor = 0;
        else if (!strcmp(a, "--no-replan")) L.cfg.replan = 0;
        else if (!strcmp(a, "--link-probe-bytes")) { VAL(); if (cli_parse_double("launch", a, v, 1024, 1e9, &L.cfg.probe_bytes)) return CLI_USAGE; }
        else if (!strcmp(a, "--grace")) { VAL(); if (cli_parse_double("launch", a, v, 0, 1e5, &L.cfg.grace)) return CLI_USAGE; }
        else if (a[0] == '-') return cli_usage_error("launch", "unknown option %s (train flags go after --)", a);
        else if (!L.cfg.model) L.cfg.model = a;
        else return cli_usage_error("launch", "one MODEL.json expected, got \"%s\" too", a);
#undef VAL
    }
    if (!L.cfg.hostfile || !L.cfg.profile || !L.cfg.run_dir || !L.cfg.model)
        return cli_usage_error("launch", "needs --hosts, --profile, --run-dir and MODEL.json");
    if (ckpt_dir && (!*ckpt_dir || strlen(ckpt_dir) >= sizeof L.cfg.ckpt_dir))
        return cli_usage_error("launch", "--checkpoint-dir \"%.64s\": expected a path of 1 to %d bytes", ckpt_dir,
                               PATH_MAX - 1);
    static const char *const OWN[] = {"--plan", "--workers", "--checkpoint-every", "--checkpoint-dir", "--resume",
                                      "--progress-file"};
    for (int i = 0; i < L.cfg.n_train_args; i++)
        for (size_t j = 0; j < sizeof OWN / sizeof *OWN; j++)
            if (!strcmp(L.cfg.train_args[i], OWN[j]))
                return cli_usage_error("launch", "%s: launch sets it for every relaunch; give launch's own flags", OWN[j]);
    /* what the job runs, for planning and scoring plans: its schedule, micro-batches, chunks,
     * wire format, recomputation and optimizer (train checks them again) */
    for (int i = 0; i < L.cfg.n_train_args; i++) {
        const char *a = L.cfg.train_args[i], *v = i + 1 < L.cfg.n_train_args ? L.cfg.train_args[i + 1] : NULL;
        if (!strcmp(a, "--recompute")) L.cfg.recompute = 1;
        if (!strcmp(a, "--vertical-sync")) L.cfg.vsync = 1;
        if (!v) continue;
        if (!strcmp(a, "--minibatch") && cli_parse_int("launch", "--minibatch (a train flag)", v, 1, 65536, &L.cfg.minibatch))
            return CLI_USAGE;
        if (!strcmp(a, "--schedule") && sched_kind_parse(v, &L.cfg.kind))
            return cli_usage_error("launch", "--schedule %s: not a schedule", v);
        if (!strcmp(a, "--timeout")) L.cfg.job_timeout = atof(v);
        if (!strcmp(a, "--optimizer")) L.cfg.opt_state_factor = strncmp(v, "adam", 4) ? 1 : 2;
        if (!strcmp(a, "--wire")) L.cfg.wire_bf16 = !strcmp(v, "bf16");
        if (!strcmp(a, "--microbatches") && cli_parse_int("launch", "--microbatches (a train flag)", v, 1, 65536, &L.cfg.micro))
            return CLI_USAGE;
        if (!strcmp(a, "--chunks")) {
            if (cli_parse_int("launch", "--chunks (a train flag)", v, 2, SCHED_MAX_CHUNKS, &L.cfg.chunks)) return CLI_USAGE;
            L.cfg.kind = SCHED_INTERLEAVED;
        }
    }
    if (L.cfg.kind == SCHED_INTERLEAVED && !L.cfg.chunks)
        return cli_usage_error("launch", "--schedule interleaved: give the chunks too (a train flag, --chunks V), so "
                               "that launch plans interleaved stages");
    if (!launch_mpirun_found(L.cfg.mpirun)) {
        fprintf(stderr, "pipedream: error: launch: cannot run the mpirun %s: %s\n", L.cfg.mpirun,
                strchr(L.cfg.mpirun, '/') ? strerror(errno) : "not found on PATH");
        return CLI_FAIL;
    }
    ssize_t n = readlink("/proc/self/exe", L.cfg.exe, sizeof L.cfg.exe - 1);
    if (n <= 0) {
        fprintf(stderr, "pipedream: error: cannot find this executable (/proc/self/exe): %s\n", strerror(errno));
        return CLI_FAIL;
    }
    L.cfg.exe[n] = 0;
    if (mkdir(L.cfg.run_dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "pipedream: error: cannot create the run directory %s: %s\n", L.cfg.run_dir, strerror(errno));
        return CLI_FAIL;
    }
    char rd[PATH_MAX];
    if (!realpath(L.cfg.run_dir, rd)) {
        fprintf(stderr, "pipedream: error: %s: %s\n", L.cfg.run_dir, strerror(errno));
        return CLI_FAIL;
    }
    if (ckpt_dir) snprintf(L.cfg.ckpt_dir, sizeof L.cfg.ckpt_dir, "%s", ckpt_dir), L.cfg.ckpt_dir_given = 1;
    else snprintf(L.cfg.ckpt_dir, sizeof L.cfg.ckpt_dir, "%.*s/ckpt", PATH_MAX - 8, rd);
    L.cfg.run_dir = rd;
    Profile prof;
    Err err = {0};
    if (profile_load(L.cfg.profile, &prof, &err)) return cli_fail(&err);
    if (L.cfg.events_path && !(L.events = fopen(L.cfg.events_path, "ae"))) {
        fprintf(stderr, "pipedream: error: cannot open the event log %s: %s\n", L.cfg.events_path, strerror(errno));
        profile_release(&prof);
        return CLI_FAIL;
    }
    L.t0 = launch_now();
    launch_signals_install();
    int rc = launch_supervise(&L, &prof);
    profile_release(&prof);
    if (L.events) fclose(L.events);
    return rc;
}
