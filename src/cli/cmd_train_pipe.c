/* cmd_train_pipe.c: pipelined training, `pipedream train MODEL.json --plan PLAN.json` under
 * mpirun (one rank per worker) or `--workers N` on one host (one thread per worker). Builds
 * the schedule from the plan, runs the runtime, gathers every worker's figures on rank 0 and
 * prints the summary: accuracy, throughput, and per stage the measured time next to the
 * simulator's prediction for the same plan and profile. One-worker training is cmd_train.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "cli.h"
#include "curve.h"
#include "runtime.h"
#include "sim.h"

static const char *USAGE =
    "usage: pipedream train MODEL.json --workers N [--plan PLAN.json] [options]      (threads, one host)\n"
    "       mpirun -np N pipedream train MODEL.json --plan PLAN.json [options]       (MPI)\n"
    "Pipeline-parallel training: every worker runs its stage of the plan, following the\n"
    "instruction lists of the schedule. Without --plan (threads only), the model is profiled\n"
    "briefly and planned for N workers.\n"
    "  --plan PLAN.json      stages, replicas and ranks (from 'pipedream plan')\n"
    "  --workers N           run N workers as threads in this process\n"
    "  --schedule KIND       1f1b (default), gpipe, 1f1b-flush, 2bw, dp, model-parallel\n"
    "  --vertical-sync       1f1b: every stage uses the input stage's weight version\n"
    "  --microbatches M      micro-batches per minibatch (gpipe, 1f1b-flush, 2bw; default 4)\n"
    "  --epochs N | --steps N   training length (default 1 epoch); steps = minibatches fed\n"
    "  --minibatch B         samples per minibatch (default 64; split into M micro-batches)\n"
    "  --lr X  --momentum M  --weight-decay W  --optimizer sgd|adam  --seed S\n"
    "  --threads T           kernel threads per worker (default 1)\n"
    "  --data DIR            Fashion-MNIST IDX directory (default /usr/share/datasets/fashion-mnist)\n"
    "  --profile FILE        profile for the predicted times (default: the one made without --plan)\n"
    "  --metrics FILE.jsonl  write the summary and per-stage figures as JSON lines\n"
    "  --trace FILE.json     Chrome trace of every worker's instructions\n"
    "  --svg FILE            timeline of the measured run\n"
    "  --curve FILE          loss and accuracy curve (SVG)\n"
    "  --progress            progress lines even when stderr is not a terminal (under mpirun)\n"
    "  --timeout S           deadline of every receive in seconds (default 300)\n"
    "  --checkpoint-every N  checkpoint every N minibatches into --checkpoint-dir D (the pipeline\n"
    "                        drains there, so the checkpoint is exact)\n"
    "  --checkpoint-dir D    where checkpoints go (ckpt-<minibatches>.safetensors)\n"
    "  --nan-check WHAT      stop at a NaN or Inf: loss (default: the last stage's loss), all\n"
    "                        (also every stage's gradients after each backward), off\n"
    "  --resume D            continue from the newest complete checkpoint in D (same settings;\n"
    "                        another plan or schedule also works: tensors are named by layer)\n";

typedef struct PipeOpts {
    const char *model, *plan, *data, *profile, *metrics, *trace, *svg, *curve, *checkpoint_dir, *resume;
    int workers, micro, epochs, steps, batch, threads, seed, vsync, opt_kind, progress, checkpoint_every, nan_check;
    SchedKind kind;
    double lr, momentum, wd, timeout;
} PipeOpts;

static int parse(int argc, char **argv, PipeOpts *o) {
    const char *C = "train";
    *o = (PipeOpts){.micro = 0, .epochs = 1, .batch = 64, .threads = 1, .seed = 1, .kind = SCHED_1F1B,
                    .lr = 0.01, .momentum = 0.9, .timeout = 300, .opt_kind = OPT_SGD};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int rc = CLI_OK;
        if (!strcmp(a, "--vertical-sync")) {
            o->vsync = 1;
            continue;
        }
        if (!strcmp(a, "--progress")) {
            o->progress = 1;
            continue;
        }
        if (a[0] != '-') {
            if (o->model) return cli_usage_error(C, "unexpected argument \"%s\"", a);
            o->model = a;
            continue;
        }
        static const char *const WITH_VALUE[] = {"--plan", "--workers", "--schedule", "--microbatches", "--epochs",
                                                 "--steps", "--minibatch", "--lr", "--momentum", "--weight-decay",
                                                 "--optimizer", "--seed", "--threads", "--data", "--profile",
                                                 "--metrics", "--trace", "--svg", "--curve", "--timeout",
                                                 "--checkpoint-every", "--checkpoint-dir", "--resume", "--nan-check", NULL};
        int known = 0;
        for (int k = 0; WITH_VALUE[k]; k++) known |= !strcmp(a, WITH_VALUE[k]);
        if (!known) return cli_usage_error(C, "unknown option %s", a);
        if (!(v = cli_value(C, argc, argv, &i))) return CLI_USAGE;
        if (!strcmp(a, "--plan")) o->plan = v;
        else if (!strcmp(a, "--workers")) rc = cli_parse_int(C, a, v, 1, 4096, &o->workers);
        else if (!strcmp(a, "--schedule")) {
            if (sched_kind_parse(v, &o->kind)) return cli_usage_error(C, "unknown schedule \"%s\"", v);
        } else if (!strcmp(a, "--microbatches")) rc = cli_parse_int(C, a, v, 1, 65536, &o->micro);
        else if (!strcmp(a, "--epochs")) rc = cli_parse_int(C, a, v, 1, 100000, &o->epochs), o->steps = 0;
        else if (!strcmp(a, "--steps")) rc = cli_parse_int(C, a, v, 1, 1000000000, &o->steps);
        else if (!strcmp(a, "--minibatch")) rc = cli_parse_int(C, a, v, 1, 65536, &o->batch);
        else if (!strcmp(a, "--lr")) rc = cli_parse_double(C, a, v, 0, 100, &o->lr);
        else if (!strcmp(a, "--momentum")) rc = cli_parse_double(C, a, v, 0, 0.999999, &o->momentum);
        else if (!strcmp(a, "--weight-decay")) rc = cli_parse_double(C, a, v, 0, 10, &o->wd);
        else if (!strcmp(a, "--optimizer")) {
            if ((o->opt_kind = optim_kind_parse(v)) < 0) return cli_usage_error(C, "unknown optimizer \"%s\"", v);
        } else if (!strcmp(a, "--seed")) rc = cli_parse_int(C, a, v, 0, 2147483647, &o->seed);
        else if (!strcmp(a, "--threads")) rc = cli_parse_int(C, a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--profile")) o->profile = v;
        else if (!strcmp(a, "--metrics")) o->metrics = v;
        else if (!strcmp(a, "--trace")) o->trace = v;
        else if (!strcmp(a, "--svg")) o->svg = v;
        else if (!strcmp(a, "--curve")) o->curve = v;
        else if (!strcmp(a, "--checkpoint-every")) rc = cli_parse_int(C, a, v, 1, 1000000000, &o->checkpoint_every);
        else if (!strcmp(a, "--checkpoint-dir")) o->checkpoint_dir = v;
        else if (!strcmp(a, "--resume")) o->resume = v;
        else if (!strcmp(a, "--nan-check")) {
            if (!strcmp(v, "loss")) o->nan_check = RT_NAN_LOSS;
            else if (!strcmp(v, "all")) o->nan_check = RT_NAN_ALL;
            else if (!strcmp(v, "off")) o->nan_check = RT_NAN_OFF;
            else return cli_usage_error(C, "--nan-check expects loss, all or off, got \"%s\"", v);
        }
        else if (!strcmp(a, "--timeout")) rc = cli_parse_double(C, a, v, 0, 1e6, &o->timeout);
        if (rc) return rc;
    }
    if (!o->model) return cli_usage_error(C, "no MODEL.json given");
    int micro_kind = o->kind == SCHED_GPIPE || o->kind == SCHED_1F1B_FLUSH || o->kind == SCHED_2BW;
    if (o->micro == 0) o->micro = micro_kind ? 4 : 1;
    if (o->micro > 1 && !micro_kind)
        return cli_usage_error(C, "--microbatches applies only to gpipe, 1f1b-flush and 2bw");
    if (o->vsync && o->kind != SCHED_1F1B) return cli_usage_error(C, "--vertical-sync applies only to 1f1b");
    if (o->checkpoint_every && !o->checkpoint_dir) return cli_usage_error(C, "--checkpoint-every needs --checkpoint-dir");
    if (o->checkpoint_dir && !o->checkpoint_every) return cli_usage_error(C, "--checkpoint-dir needs --checkpoint-every");
    if (o->batch % o->micro)
        return cli_usage_error(C, "--minibatch %d is not a multiple of --microbatches %d", o->batch, o->micro);
    return CLI_OK;
}

/* Figures each worker reports to rank 0 (floats, so they travel as one control message). */
enum { F_STAGE, F_REPLICA, F_WALL, F_COMPUTE, F_WAIT, F_NFWD, F_NBWD, F_LOSS_SUM, F_LAST_LOSS, F_UNITS,
       F_CORRECT, F_TOTAL, F_CRC_HI, F_CRC_LO, F_VERSIONS, F_NEVENTS, F_NHIST, F_COUNT };
#define GATHER_MB ((int64_t)1 << 50)

static void pack(const RtWorkerResult *r, float *f) {
    f[F_STAGE] = (float)r->stage;
    f[F_REPLICA] = (float)r->replica;
    f[F_WALL] = (float)r->wall_s;
    f[F_COMPUTE] = (float)r->compute_s;
    f[F_WAIT] = (float)r->wait_s;
    f[F_NFWD] = (float)r->n_fwd;
    f[F_NBWD] = (float)r->n_bwd;
    f[F_LOSS_SUM] = (float)r->loss_sum;
    f[F_LAST_LOSS] = (float)r->last_loss;
    f[F_UNITS] = (float)r->units_done;
    f[F_CORRECT] = (float)r->test_correct;
    f[F_TOTAL] = (float)r->test_total;
    f[F_CRC_HI] = (float)(r->params_crc >> 16);
    f[F_CRC_LO] = (float)(r->params_crc & 0xffff);
    f[F_VERSIONS] = (float)r->max_versions;
    f[F_NEVENTS] = (float)r->n_events;
    f[F_NHIST] = (float)r->n_hist;
}

static void unpack(const float *f, RtWorkerResult *r) {
    r->stage = (int)f[F_STAGE];
    r->replica = (int)f[F_REPLICA];
    r->wall_s = f[F_WALL];
    r->compute_s = f[F_COMPUTE];
    r->wait_s = f[F_WAIT];
    r->n_fwd = (int)f[F_NFWD];
    r->n_bwd = (int)f[F_NBWD];
    r->loss_sum = f[F_LOSS_SUM];
    r->last_loss = f[F_LAST_LOSS];
    r->units_done = (int)f[F_UNITS];
    r->test_correct = (long)f[F_CORRECT];
    r->test_total = (long)f[F_TOTAL];
    r->params_crc = (uint32_t)f[F_CRC_HI] << 16 | (uint32_t)f[F_CRC_LO];
    r->max_versions = (int)f[F_VERSIONS];
    r->n_events = (int)f[F_NEVENTS];
    r->n_hist = (int)f[F_NHIST];
}

/* Sends every rank's figures (and trace events) to rank 0, which fills res[0..size). */
static int gather(Comm *c, RtWorkerResult *res, int want_events, Err *err) {
    int rank = comm_rank(c), size = comm_size(c), rc;
    float f[F_COUNT];
    CommReq *rq = NULL;
    if (rank != 0) {
        pack(&res[rank], f);
        if ((rc = comm_isend(c, 0, COMM_CTRL, GATHER_MB, 0, shape1(F_COUNT), f, &rq, err))) return rc;
        if ((rc = comm_wait(c, &rq, 60, NULL, err))) return rc;
        int ne = res[rank].n_events;
        if (want_events && ne > 0) {
            float *ev = malloc((size_t)ne * 5 * sizeof(float));
            PD_ASSERT(ev);
            for (int i = 0; i < ne; i++) {
                const RtEvent *e = &res[rank].events[i];
                ev[5 * i] = (float)e->op, ev[5 * i + 1] = (float)e->mb, ev[5 * i + 2] = (float)e->version;
                ev[5 * i + 3] = (float)e->t0, ev[5 * i + 4] = (float)e->t1;
            }
            rc = comm_isend(c, 0, COMM_CTRL, GATHER_MB + 1, 0, shape2(ne, 5), ev, &rq, err);
            if (!rc) rc = comm_wait(c, &rq, 60, NULL, err);
            free(ev);
            if (rc) return rc;
        }
        if (res[rank].n_hist > 0) {
            rc = comm_isend(c, 0, COMM_CTRL, GATHER_MB + 2, 0, shape2(res[rank].n_hist, 3), res[rank].hist, &rq, err);
            if (!rc) rc = comm_wait(c, &rq, 60, NULL, err);
            if (rc) return rc;
        }
        return PD_OK;
    }
    for (int r = 1; r < size; r++) {
        if ((rc = comm_irecv(c, r, COMM_CTRL, GATHER_MB, shape1(F_COUNT), f, &rq, err))) return rc;
        if ((rc = comm_wait(c, &rq, 60, NULL, err))) return rc;
        unpack(f, &res[r]);
        res[r].rank = r;
        int ne = res[r].n_events;
        res[r].n_events = 0;
        if (want_events && ne > 0) {
            float *ev = malloc((size_t)ne * 5 * sizeof(float));
            PD_ASSERT(ev);
            if ((rc = comm_irecv(c, r, COMM_CTRL, GATHER_MB + 1, shape2(ne, 5), ev, &rq, err)) ||
                (rc = comm_wait(c, &rq, 60, NULL, err))) {
                free(ev);
                return rc;
            }
            res[r].events = malloc((size_t)ne * sizeof(RtEvent));
            PD_ASSERT(res[r].events);
            for (int i = 0; i < ne; i++)
                res[r].events[i] = (RtEvent){(int)ev[5 * i], (int)ev[5 * i + 1], (int)ev[5 * i + 2], ev[5 * i + 3],
                                             ev[5 * i + 4]};
            res[r].n_events = ne;
            free(ev);
        }
        if (res[r].n_hist > 0) {
            res[r].hist = malloc((size_t)res[r].n_hist * 3 * sizeof(float));
            PD_ASSERT(res[r].hist);
            if ((rc = comm_irecv(c, r, COMM_CTRL, GATHER_MB + 2, shape2(res[r].n_hist, 3), res[r].hist, &rq, err)) ||
                (rc = comm_wait(c, &rq, 60, NULL, err)))
                return rc;
        }
    }
    return PD_OK;
}

/* Measured events as the simulator's timeline events. */
static int write_pictures(const PipeOpts *o, const Schedule *s, const RtWorkerResult *res, Err *err) {
    int n = 0;
    for (int r = 0; r < s->n_ranks; r++) n += res[r].n_events;
    TraceEvent *ev = malloc(((size_t)n + 1) * sizeof *ev);
    PD_ASSERT(ev);
    int k = 0;
    for (int r = 0; r < s->n_ranks; r++)
        for (int i = 0; i < res[r].n_events; i++) {
            const RtEvent *e = &res[r].events[i];
            int kind = sim_trace_kind(e->op);
            if (kind < 0 || e->t1 <= e->t0) continue;
            ev[k++] = (TraceEvent){r, kind, e->mb, -1, e->t0, e->t1};
        }
    int rc = PD_OK;
    char title[160];
    snprintf(title, sizeof title, "measured: %s, %d workers", sched_kind_name(s->kind), s->n_ranks);
    SvgOpts so = {.title = title, .show_comm = 1};
    if (o->svg) rc = sim_svg_write(o->svg, ev, k, s->n_ranks, &so, err);
    if (!rc && o->trace) rc = sim_trace_write(o->trace, ev, k, err);
    free(ev);
    return rc;
}

/* The summary on stdout (one JSON line), the per-stage table on stderr, metrics. */
static int report(const PipeOpts *o, const Plan *plan, const Schedule *s, const RtWorkerResult *res,
                  const char *transport, const Profile *prof, int unit_batch, Err *err) {
    double wall = 0, loss_sum = 0, last_loss = 0;
    long correct = 0, total = 0;
    int units = 0, n_last = 0;
    for (int r = 0; r < s->n_ranks; r++) {
        if (res[r].wall_s > wall) wall = res[r].wall_s;
        if (res[r].stage == s->n_stages - 1) {
            loss_sum += res[r].loss_sum;
            units += res[r].units_done;
            last_loss += res[r].last_loss;
            n_last++;
        }
        correct += res[r].test_correct;
        total += res[r].test_total;
    }
    last_loss = n_last ? last_loss / n_last : NAN;
    /* runtime overhead: a worker's time neither in kernels (forward, backward, step) nor
     * blocked on messages; the largest share over the workers */
    double overhead = 0;
    for (int r = 0; r < s->n_ranks; r++)
        if (res[r].stage >= 0 && res[r].wall_s > 0) {
            double ov = (res[r].wall_s - res[r].compute_s - res[r].wait_s) / res[r].wall_s;
            if (ov > overhead) overhead = ov;
        }
    /* the simulator's prediction for this plan and schedule */
    double sim_ms = NAN;
    double *sim_stage = calloc((size_t)s->n_stages, sizeof(double));
    PD_ASSERT(sim_stage);
    if (prof) {
        SimCosts costs;
        SimResult sr;
        SimOpts so = {.cluster = &plan->cluster, .opt_state_factor = 1, .samples_per_unit = unit_batch};
        Err e2 = {0};
        if (sim_costs_from_profile(s, prof, &costs, &e2) == PD_OK) {
            double scale = prof->minibatch > 0 ? (double)unit_batch / prof->minibatch : 1.0;
            for (int i = 0; i < costs.n_stages; i++) {
                costs.stage[i].fwd_s *= scale;
                costs.stage[i].bwd_s *= scale;
                costs.stage[i].in_bytes *= scale;
                costs.stage[i].stash_bytes *= scale;
                sim_stage[i] = 1e3 * (costs.stage[i].fwd_s + costs.stage[i].bwd_s);
            }
            if (sim_run(s, &costs, &so, &sr, &e2) == PD_OK) {
                sim_ms = 1e3 * sr.time_per_unit_s;
                sim_result_release(&sr);
            }
            sim_costs_release(&costs);
        }
    }
    double samples = (double)units * unit_batch;
    double measured_ms = units ? 1e3 * wall / ((double)s->n_units) : NAN;
    fprintf(stderr, "\n%-6s %-9s %22s %22s %8s %8s\n", "stage", "replicas", "measured F+B ms/unit",
            "predicted F+B ms/unit", "busy %", "versions");
    for (int i = 0; i < s->n_stages; i++) {
        double comp = 0;
        int nb = 0, vers = 0;
        for (int j = 0; j < s->stages[i].replicas; j++) {
            const RtWorkerResult *r = &res[s->stages[i].ranks[j]];
            comp += r->compute_s;
            nb += r->n_fwd;
            if (r->max_versions > vers) vers = r->max_versions;
        }
        double busy = 0;
        for (int j = 0; j < s->stages[i].replicas; j++) busy += res[s->stages[i].ranks[j]].compute_s / wall;
        busy /= s->stages[i].replicas;
        fprintf(stderr, "%-6d %-9d %22.3f %22.3f %8.1f %8d\n", i, s->stages[i].replicas, nb ? 1e3 * comp / nb : 0,
                sim_stage[i], 100 * busy, vers);
    }
    fprintf(stderr, "time per unit: measured %.3f ms, simulator %.3f ms (%s)\n", measured_ms, sim_ms,
            prof ? "same plan and profile" : "no profile given");
    FILE *mf = NULL;
    if (o->metrics && !(mf = fopen(o->metrics, "w"))) {
        free(sim_stage);
        return err_set(err, PD_EIO, "%s: cannot open for writing", o->metrics);
    }
    char crcs[512];
    size_t k = 0;
    for (int i = 0; i < s->n_stages && k < sizeof crcs - 16; i++)
        k += (size_t)snprintf(crcs + k, sizeof crcs - k, "%s\"%08x\"", i ? "," : "", res[s->stages[i].ranks[0]].params_crc);
    char line[2048];
    snprintf(line, sizeof line,
             "{\"model\":\"%s\",\"schedule\":\"%s\",\"transport\":\"%s\",\"workers\":%d,\"stages\":%d,"
             "\"steps\":%d,\"units\":%d,\"unit_batch\":%d,\"final_loss\":%.6g,\"mean_loss\":%.6g,"
             "\"test_accuracy\":%.6g,\"samples_per_s\":%.6g,\"time_per_unit_ms\":%.6g,"
             "\"predicted_time_per_unit_ms\":%.6g,\"overhead_pct\":%.4g,\"wall_s\":%.6g,\"weights_crc\":[%s]}",
             plan->model, sched_kind_name(s->kind), transport, s->n_ranks, s->n_stages, s->n_minibatches, units,
             unit_batch, last_loss, units ? loss_sum / units : NAN, total ? (double)correct / total : NAN,
             wall > 0 ? samples / wall : 0, measured_ms, sim_ms, 100 * overhead, wall, crcs);
    /* JSON has no NaN: write null */
    for (char *p; (p = strstr(line, "nan"));) memcpy(p, "nul", 3), memmove(p + 4, p + 3, strlen(p + 3) + 1), p[3] = 'l';
    puts(line);
    fflush(stdout);
    if (mf) {
        fprintf(mf, "%s\n", line);
        for (int i = 0; i < s->n_stages; i++) {
            double comp = 0;
            int nf = 0;
            for (int j = 0; j < s->stages[i].replicas; j++) {
                comp += res[s->stages[i].ranks[j]].compute_s;
                nf += res[s->stages[i].ranks[j]].n_fwd;
            }
            fprintf(mf, "{\"stage\":%d,\"replicas\":%d,\"measured_ms_per_unit\":%.6g,\"predicted_ms_per_unit\":%.6g}\n",
                    i, s->stages[i].replicas, nf ? 1e3 * comp / nf : 0.0, sim_stage[i]);
        }
        if (fclose(mf) != 0) {
            free(sim_stage);
            return err_set(err, PD_EIO, "%s: write failed", o->metrics);
        }
    }
    free(sim_stage);
    return PD_OK;
}

/* Loss and training accuracy per unit from the last stage's replicas, and test accuracy. */
static int write_curve(const char *path, const Schedule *s, const RtWorkerResult *res, Err *err) {
    int n = s->n_units;
    float *loss = malloc((size_t)n * sizeof(float)), *acc = malloc((size_t)n * sizeof(float));
    PD_ASSERT(loss && acc);
    for (int i = 0; i < n; i++) loss[i] = acc[i] = NAN;
    long correct = 0, total = 0;
    for (int r = 0; r < s->n_ranks; r++) {
        for (int k = 0; k < res[r].n_hist; k++) {
            int u = (int)res[r].hist[3 * k];
            if (u >= 0 && u < n) loss[u] = res[r].hist[3 * k + 1], acc[u] = res[r].hist[3 * k + 2];
        }
        correct += res[r].test_correct;
        total += res[r].test_total;
    }
    char title[160];
    snprintf(title, sizeof title, "%s, %d workers: training loss and accuracy", sched_kind_name(s->kind), s->n_ranks);
    int rc = curve_svg_write(path, loss, acc, n, total ? (double)correct / total : NAN, title, err);
    free(loss);
    free(acc);
    return rc;
}


/* ---- failures under MPI -------------------------------------------------------------------
 * When a rank dies, mpirun sends SIGTERM to the others. Each rank's handler then says who it
 * is, which ranks are gone (probing the pids every rank shared at start-up: kill(pid, 0) on
 * this host) with their stages, and the newest checkpoint to resume from; then it exits 1.
 * Everything the handler prints is prepared beforehand (async-signal-safe: write, kill). */
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#define FAIL_MAX_RANKS 256
static volatile sig_atomic_t g_fail_n;
static pid_t g_fail_pid[FAIL_MAX_RANKS];
static int g_fail_stage[FAIL_MAX_RANKS];
static int g_fail_rank = -1;
static char g_fail_ckpt[4400] = "none yet";
static char g_fail_host[64];

static size_t fmt_int(char *b, long v) {
    char t[24];
    size_t n = 0, k = 0;
    if (v < 0) b[k++] = '-', v = -v;
    do t[n++] = (char)('0' + v % 10), v /= 10; while (v);
    while (n) b[k++] = t[--n];
    return k;
}

static size_t fmt_str(char *b, const char *s) {
    size_t k = 0;
    while (s[k]) b[k] = s[k], k++;
    return k;
}

static void on_term(int sig) {
    char b[2048];
    size_t k = 0;
    k += fmt_str(b + k, "pipedream: rank ");
    k += fmt_int(b + k, g_fail_rank);
    k += fmt_str(b + k, " (stage ");
    k += fmt_int(b + k, g_fail_rank >= 0 && g_fail_rank < FAIL_MAX_RANKS ? g_fail_stage[g_fail_rank] : -1);
    k += fmt_str(b + k, "): stopping on signal ");
    k += fmt_int(b + k, sig);
    int lost = 0;
    for (int r = 0; r < g_fail_n && k < sizeof b - 200; r++) {
        if (g_fail_pid[r] <= 0 || r == g_fail_rank) continue;
        if (kill(g_fail_pid[r], 0) != 0 && errno == ESRCH) {
            k += fmt_str(b + k, lost++ ? ", " : ": lost ");
            k += fmt_str(b + k, "rank ");
            k += fmt_int(b + k, r);
            k += fmt_str(b + k, " (stage ");
            k += fmt_int(b + k, g_fail_stage[r]);
            k += fmt_str(b + k, ")");
        }
    }
    if (!lost) k += fmt_str(b + k, ": the job is ending (a rank failed or mpirun was interrupted)");
    k += fmt_str(b + k, "; last checkpoint to resume from: ");
    for (size_t i = 0; g_fail_ckpt[i] && k < sizeof b - 2; i++) b[k++] = g_fail_ckpt[i];
    b[k++] = '\n';
    ssize_t w = write(2, b, k);
    (void)w;
    _exit(1);
}

/* Every rank learns every rank's pid and host (control messages), then installs the handler. */
static int failure_setup(Comm *c, const Schedule *s, Err *err) {
    int n = comm_size(c), me = comm_rank(c), rc = PD_OK;
    if (n > FAIL_MAX_RANKS) return PD_OK;
    gethostname(g_fail_host, sizeof g_fail_host - 1);
    float mine[2] = {(float)(getpid() >> 16), (float)(getpid() & 0xffff)};
    CommReq **rq = calloc((size_t)n, sizeof *rq);
    float *got = calloc((size_t)n * 2, sizeof(float));
    PD_ASSERT(rq && got);
    for (int r = 0; r < n && !rc; r++)
        if (r != me) rc = comm_irecv(c, r, COMM_CTRL, ((int64_t)1 << 52), shape1(2), &got[2 * r], &rq[r], err);
    CommReq *sq = NULL;
    for (int r = 0; r < n && !rc; r++) {
        if (r == me) continue;
        rc = comm_isend(c, r, COMM_CTRL, ((int64_t)1 << 52), 0, shape1(2), mine, &sq, err);
        if (!rc) rc = comm_wait(c, &sq, 60, NULL, err);
    }
    for (int r = 0; r < n && !rc; r++) rc = comm_wait(c, &rq[r], 60, NULL, err);
    for (int r = 0; r < n; r++) comm_cancel(c, &rq[r]);
    if (!rc) {
        for (int r = 0; r < n; r++) {
            g_fail_pid[r] = r == me ? getpid() : (pid_t)((long)got[2 * r] << 16 | (long)got[2 * r + 1]);
            g_fail_stage[r] = r < s->n_ranks ? s->workers[r].stage : -1;
        }
        g_fail_rank = me;
        g_fail_n = n;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_term;
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
    }
    free(rq);
    free(got);
    return rc;
}

/* Adds one segment's figures of a worker to its running totals (events shifted by t_off,
 * loss history by the segment's first unit), then takes over its final state. */
static void acc_add(RtWorkerResult *acc, RtWorkerResult *seg, uint64_t unit_base, double t_off) {
    acc->rank = seg->rank, acc->stage = seg->stage, acc->replica = seg->replica;
    acc->wall_s += seg->wall_s, acc->compute_s += seg->compute_s, acc->wait_s += seg->wait_s;
    acc->n_fwd += seg->n_fwd, acc->n_bwd += seg->n_bwd;
    acc->loss_sum += seg->loss_sum, acc->units_done += seg->units_done;
    if (seg->units_done) acc->last_loss = seg->last_loss;
    acc->test_correct += seg->test_correct, acc->test_total += seg->test_total;
    if (seg->max_versions > acc->max_versions) acc->max_versions = seg->max_versions;
    if (seg->n_hist) {
        float *h = realloc(acc->hist, (size_t)(acc->n_hist + seg->n_hist) * 3 * sizeof(float));
        PD_ASSERT(h);
        acc->hist = h;
        for (int k = 0; k < seg->n_hist; k++) {
            float *d = &h[3 * (acc->n_hist + k)];
            memcpy(d, &seg->hist[3 * k], 3 * sizeof(float));
            d[0] += (float)unit_base;
        }
        acc->n_hist += seg->n_hist;
    }
    if (seg->n_events) {
        RtEvent *e = realloc(acc->events, (size_t)(acc->n_events + seg->n_events) * sizeof *e);
        PD_ASSERT(e);
        acc->events = e;
        for (int k = 0; k < seg->n_events; k++) {
            RtEvent x = seg->events[k];
            x.mb += (int)unit_base, x.t0 += t_off, x.t1 += t_off;
            e[acc->n_events + k] = x;
        }
        acc->n_events += seg->n_events;
    }
    /* the final state moves over (it is the next segment's starting point) */
    pd_free(acc->params);
    pd_free(acc->final.state);
    pd_free(acc->final.opt_m);
    pd_free(acc->final.opt_v);
    acc->params = seg->params, acc->n_params = seg->n_params, acc->n_state = seg->n_state;
    acc->params_crc = seg->params_crc;
    acc->final = seg->final;
    seg->params = NULL;
    memset(&seg->final, 0, sizeof seg->final);
    rt_result_release(seg);
}

/* Whole-model buffers of the model at path, sized from it. */
static int ckpt_buffers(const char *model_path, int adam, Model **m, RtCkpt *c, Err *err) {
    if (!(*m = model_load(model_path, err))) return err->code;
    int nl = model_n_layers(*m);
    size_t np = model_param_count(*m, 0, nl), ns = model_state_count(*m, 0, nl);
    c->params = pd_alloc_f32(np);
    c->opt_m = pd_alloc_f32(np);
    c->opt_v = adam ? pd_alloc_f32(np) : NULL;
    c->state = pd_alloc_f32(ns ? ns : 1);
    return PD_OK;
}

static void ckpt_buffers_free(Model *m, RtCkpt *c) {
    pd_free(c->params), pd_free(c->opt_m), pd_free(c->opt_v), pd_free(c->state);
    model_free(m);
}

/* Rank 0 assembles the whole model's state from replica 0 of every stage (MPI: messages)
 * and writes a checkpoint. */
static int checkpoint(const PipeOpts *o, Comm *comm, const Schedule *s, const RtWorkerResult *acc,
                      uint64_t mb_done, uint64_t units_done, Err *err) {
    int rank = comm ? comm_rank(comm) : 0, rc = PD_OK;
    Model *m = NULL;
    RtCkpt c = {0};
    if (rank == 0 && (rc = ckpt_buffers(o->model, o->opt_kind == OPT_ADAM, &m, &c, err))) return rc;
    for (int i = 0; i < s->n_stages && !rc; i++) {
        int r0 = s->stages[i].ranks[0];
        const RtWorkerResult *a = &acc[r0];
        size_t np = 0, ns = 0, po = 0, so = 0;
        if (rank == 0) {
            int first = s->stages[i].layers[0], last = s->stages[i].layers[s->stages[i].n_layers - 1] + 1;
            po = model_param_offset(m, first), so = model_state_offset(m, first);
            np = model_param_count(m, first, last), ns = model_state_count(m, first, last);
        }
        if (r0 == 0 || !comm) {   /* in this process */
            if (rank != 0) continue;
            memcpy(c.params + po, a->final.params, np * sizeof(float));
            memcpy(c.opt_m + po, a->final.opt_m, np * sizeof(float));
            if (c.opt_v) memcpy(c.opt_v + po, a->final.opt_v, np * sizeof(float));
            if (ns) memcpy(c.state + so, a->final.state, ns * sizeof(float));
            c.opt_step = a->final.opt_step;
            continue;
        }
        /* MPI: r0 sends, rank 0 receives; sizes are known on both sides */
        if (rank == r0) {
            const float *bufs[4] = {a->final.params, a->final.opt_m, a->final.opt_v, a->final.state};
            size_t n[4] = {a->n_params, a->n_params, a->final.opt_v ? a->n_params : 0, a->n_state};
            float step = (float)a->final.opt_step;
            for (int k = 0; k < 5 && !rc; k++) {
                CommReq *rq = NULL;
                rc = k < 4 ? comm_isend(comm, 0, COMM_CTRL, ((int64_t)1 << 51) + 8 * i + k, 0, shape1((int)n[k]),
                                        bufs[k], &rq, err)
                           : comm_isend(comm, 0, COMM_CTRL, ((int64_t)1 << 51) + 8 * i + k, 0, shape1(1), &step, &rq,
                                        err);
                if (!rc) rc = comm_wait(comm, &rq, 60, NULL, err);
            }
        } else if (rank == 0) {
            float *bufs[4] = {c.params + po, c.opt_m + po, c.opt_v ? c.opt_v + po : NULL, c.state + so};
            size_t n[4] = {np, np, c.opt_v ? np : 0, ns};
            float step = 0, dummy;
            for (int k = 0; k < 5 && !rc; k++) {
                CommReq *rq = NULL;
                rc = comm_irecv(comm, r0, COMM_CTRL, ((int64_t)1 << 51) + 8 * i + k, shape1(k < 4 ? (int)n[k] : 1),
                                k < 4 ? (n[k] ? bufs[k] : &dummy) : &step, &rq, err);
                if (!rc) rc = comm_wait(comm, &rq, 60, NULL, err);
            }
            c.opt_step = (long)step;
        }
    }
    if (rank == 0 && !rc) {
        c.minibatches_done = mb_done;
        c.units_done = units_done;
        c.seed = (uint64_t)o->seed;
        snprintf(c.schedule, sizeof c.schedule, "%s", sched_kind_name(s->kind));
        char path[4096];
        rc = rt_ckpt_save(o->checkpoint_dir, m, &c, path, sizeof path, err);
        if (!rc) fprintf(stderr, "pipedream: checkpoint %s\n", path);
    }
    if (rank == 0) ckpt_buffers_free(m, &c);
    return rc;
}

/* Runs the training as segments of --checkpoint-every minibatches (one segment without it):
 * each segment is a complete schedule (warm-up, steady state, drain), so between segments
 * nothing is in flight and a checkpoint holds all the state there is. A run resumed from a
 * checkpoint continues with the same segments, and so ends bitwise equal to an uninterrupted
 * run with the same settings. acc[rank] (all ranks under threads) receives the totals. */
static int run_segments(const PipeOpts *o, Comm *comm, const Plan *plan, const Schedule *whole, RtConfig *cfg,
                        RtWorkerResult *acc, Err *err) {
    int n = whole->n_ranks, rank = comm ? comm_rank(comm) : 0, rc = PD_OK;
    int per_mb = whole->n_micro;   /* units per schedule minibatch */
    uint64_t mb_done = 0;
    RtStageState *init = calloc((size_t)n, sizeof *init);
    PD_ASSERT(init);
    Model *m = NULL;
    RtCkpt c = {0};
    if (o->resume) {
        char path[4096];
        if ((rc = ckpt_latest(o->resume, path, sizeof path, err))) goto out;
        if (!path[0]) {
            rc = err_set(err, PD_EINVAL, "%s: no complete checkpoint to resume from (see the warnings above, if any)",
                         o->resume);
            goto out;
        } else {
            if ((rc = ckpt_buffers(o->model, o->opt_kind == OPT_ADAM, &m, &c, err))) goto out;
            if ((rc = rt_ckpt_load(path, m, &c, err))) goto out;
            if (c.seed != (uint64_t)o->seed) {
                rc = err_set(err, PD_EINVAL, "%s: taken with --seed %llu, this run has --seed %d", path,
                             (unsigned long long)c.seed, o->seed);
                goto out;
            }
            if (c.units_done % (uint64_t)per_mb) {
                rc = err_set(err, PD_EINVAL, "%s: %llu units done is not a whole number of %d-unit minibatches", path,
                             (unsigned long long)c.units_done, per_mb);
                goto out;
            }
            mb_done = c.units_done / (uint64_t)per_mb;
            for (int r = 0; r < n; r++) {
                const SchedWorker *w = &whole->workers[r];
                if (w->stage < 0) continue;
                int first = whole->stages[w->stage].layers[0];
                size_t po = model_param_offset(m, first), so = model_state_offset(m, first);
                init[r] = (RtStageState){c.params + po, c.state + so, c.opt_m + po, c.opt_v ? c.opt_v + po : NULL,
                                         c.opt_step};
            }
            snprintf(g_fail_ckpt, sizeof g_fail_ckpt, "%.4096s (--resume %.200s)", path, o->resume);
            if (rank == 0)
                fprintf(stderr, "pipedream: resuming from %s (%llu of %d minibatches done)\n", path,
                        (unsigned long long)mb_done, whole->n_minibatches);
        }
    }
    if (comm && (rc = failure_setup(comm, whole, err))) goto out;
    if (rank == 0)
        fprintf(stderr, "pipedream: training %s with %s on %d workers (%s), %d units of %d samples\n", o->model,
                sched_kind_name(whole->kind), n, comm ? "mpi" : "threads", whole->n_units, cfg->unit_batch);
    double t_off = 0;
    cfg->progress_t0 = pd_now();
    cfg->progress_u0 = mb_done * (uint64_t)per_mb;
    while (mb_done < (uint64_t)whole->n_minibatches) {
        uint64_t left = (uint64_t)whole->n_minibatches - mb_done;
        int seg = o->checkpoint_every && (uint64_t)o->checkpoint_every < left ? o->checkpoint_every : (int)left;
        Schedule s;
        SchedOpts so = {.kind = whole->kind, .n_minibatches = seg, .n_micro = whole->n_micro,
                        .vertical_sync = whole->vertical_sync};
        if ((rc = sched_build(plan, &so, &s, err))) goto out;
        RtConfig sc = *cfg;
        sc.sched = &s;
        sc.unit_base = mb_done * (uint64_t)per_mb;
        sc.init = init;
        int last = mb_done + (uint64_t)seg == (uint64_t)whole->n_minibatches;
        if (!last) sc.test = NULL;
        RtWorkerResult *res = calloc((size_t)n, sizeof *res);
        PD_ASSERT(res);
        if (comm) {
            rc = rt_worker_run(comm, &sc, &res[rank], err);
            if (rc) {   /* a peer may be hung or dead: do not wait for anyone, end the job */
                char msg[5200];
                snprintf(msg, sizeof msg, "%s; last checkpoint to resume from: %s", err->msg, g_fail_ckpt);
                comm_abort(comm, rc, msg);
            }
        } else {
            rc = rt_run_threads(&sc, res, err);
        }
        double seg_wall = 0;
        for (int r = 0; r < n; r++)
            if (res[r].wall_s > seg_wall) seg_wall = res[r].wall_s;
        for (int r = 0; r < n && !rc; r++)
            if (!comm || r == rank) acc_add(&acc[r], &res[r], sc.unit_base, t_off);
        for (int r = 0; r < n; r++) rt_result_release(&res[r]);
        free(res);
        sched_release(&s);
        if (rc) goto out;
        t_off += seg_wall;
        mb_done += (uint64_t)seg;
        for (int r = 0; r < n; r++) init[r] = acc[r].final;
        if (o->checkpoint_every && o->checkpoint_dir) {
            if ((rc = checkpoint(o, comm, whole, acc, mb_done, mb_done * (uint64_t)per_mb, err))) goto out;
            char name[64];
            Err e2;
            if (ckpt_name(mb_done, name, sizeof name, &e2) == PD_OK)
                snprintf(g_fail_ckpt, sizeof g_fail_ckpt, "%.2000s/%.64s (--resume %.2000s)", o->checkpoint_dir, name,
                         o->checkpoint_dir);
        }
    }
out:
    if (m) ckpt_buffers_free(m, &c);
    free(init);
    return rc;
}

static int under_mpirun(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

int cmd_train_pipelined(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(USAGE, stdout);
        return CLI_OK;
    }
    PipeOpts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    int mpi = under_mpirun();
    if (mpi && !o.plan) return cli_usage_error("train", "under mpirun, give --plan (make one with 'pipedream plan')");
    if (!mpi && !o.workers) return cli_usage_error("train", "give --workers N to run the pipeline on threads");
    Err err = {0};
    Comm *comm = NULL;
    int rank = 0;
    if (mpi) {
        if (comm_mpi_create(&argc, &argv, &comm, &err)) return cli_fail(&err);
        rank = comm_rank(comm);
    }
    Plan *plan = NULL;
    Profile prof = {0};
    int have_prof = 0;
    Dataset train = {0}, test = {0};
    Schedule sched = {0};
    RtWorkerResult *res = NULL;
    int unit_batch = o.batch / o.micro;
    if (o.profile) {
        if ((rc = profile_load(o.profile, &prof, &err))) goto out;
        have_prof = 1;
    }
    if (o.plan) {
        if (!(plan = plan_load(o.plan, &err))) {
            rc = err.code ? err.code : PD_EINVAL;
            goto out;
        }
    } else {
        /* profile briefly on this host and plan for N workers joined by shared memory */
        RtProfileOpts po = {.minibatch = unit_batch, .threads = o.threads, .warmup = 2, .iterations = 5,
                            .progress = pd_stderr_is_tty()};
        if (!have_prof) {
            if ((rc = rt_profile(o.model, &po, &prof, &err))) goto out;
            have_prof = 1;
        }
        Cluster cl = {.n_levels = 1};
        cl.level[0] = (ClusterLevel){.workers = o.workers, .bandwidth = 1e10, .latency = 1e-5};
        PlanOpts popt = {.cost_model = COST_OURS};
        if (!(plan = plan_new(&prof, &cl, &popt, &err))) {
            rc = err.code ? err.code : PD_EINVAL;
            goto out;
        }
        if (rank == 0)
            fprintf(stderr, "pipedream: planned %d stage(s) for %d workers from a %d-iteration profile\n",
                    plan->n_stages, o.workers, po.iterations);
    }
    /* the plan must be made for this model */
    {
        Model *m = model_load(o.model, &err);
        if (!m) {
            rc = err.code;
            goto out;
        }
        int nl = model_n_layers(m);
        model_free(m);
        if (plan->n_layers != nl) {
            rc = err_set(&err, PD_EINVAL, "%s was made for a model of %d layers; %s has %d", o.plan ? o.plan : "the plan",
                         plan->n_layers, o.model, nl);
            goto out;
        }
        if ((rc = plan_validate(plan, nl, &err))) goto out;
    }
    if (o.workers && plan->n_workers != o.workers && !mpi) {
        rc = err_set(&err, PD_EINVAL, "the plan uses %d workers, --workers says %d", plan->n_workers, o.workers);
        goto out;
    }
    /* data: the training set where the input stage runs, the test set everywhere (its size
     * drives the evaluation loop) */
    /* Which ranks run the input stage (dp: all of them): a one-minibatch schedule says. Only
     * they read the training set; its size reaches the others from the first of them. */
    int input_here = !mpi, first_input = 0;
    {
        Schedule probe;
        SchedOpts so = {.kind = o.kind, .n_minibatches = 1, .n_micro = o.micro, .vertical_sync = 0};
        if ((rc = sched_build(plan, &so, &probe, &err))) goto out;
        if (mpi) input_here = rank < probe.n_ranks && probe.workers[rank].stage == 0;
        first_input = probe.stages[0].ranks[0];
        for (int j = 1; j < probe.stages[0].replicas; j++)
            if (probe.stages[0].ranks[j] < first_input) first_input = probe.stages[0].ranks[j];
        sched_release(&probe);
    }
    if (input_here && (rc = data_load_idx(o.data, "train", &train, &err))) goto out;
    if ((rc = data_load_idx(o.data, "test", &test, &err))) goto out;
    /* the same standardisation as one-worker training (cmd_train.c) */
    if (input_here) data_normalize(&train, DATA_FMNIST_MEAN, DATA_FMNIST_STD);
    data_normalize(&test, DATA_FMNIST_MEAN, DATA_FMNIST_STD);
    {
        size_t n_train = input_here ? train.n : 0;
        if (mpi && !o.steps && first_input < comm_size(comm)) {
            float nf[2] = {(float)(n_train >> 20), (float)(n_train & 0xfffff)};
            CommReq *rq = NULL;
            for (int r = 0; r < comm_size(comm) && !rc; r++) {
                if (rank == first_input && r != rank) {
                    rc = comm_isend(comm, r, COMM_CTRL, ((int64_t)1 << 53), 0, shape1(2), nf, &rq, &err);
                    if (!rc) rc = comm_wait(comm, &rq, o.timeout, NULL, &err);
                } else if (rank != first_input && r == rank) {
                    rc = comm_irecv(comm, first_input, COMM_CTRL, ((int64_t)1 << 53), shape1(2), nf, &rq, &err);
                    if (!rc) rc = comm_wait(comm, &rq, o.timeout, NULL, &err);
                    n_train = (size_t)nf[0] << 20 | (size_t)nf[1];
                }
            }
            if (rc) goto out;
        }
        long units_per_epoch = (long)(n_train / (size_t)unit_batch);
        long n_mb = o.steps ? o.steps : (long)o.epochs * units_per_epoch / o.micro;
        if (n_mb < 1) n_mb = 1;
        SchedOpts so = {.kind = o.kind, .n_minibatches = (int)n_mb, .n_micro = o.micro, .vertical_sync = o.vsync};
        if ((rc = sched_build(plan, &so, &sched, &err))) goto out;
    }
    if (mpi && comm_size(comm) != sched.n_ranks) {
        rc = err_set(&err, PD_EINVAL, "the plan needs %d ranks but mpirun started %d", sched.n_ranks, comm_size(comm));
        goto out;
    }
    OptConfig oc = optim_defaults((OptKind)o.opt_kind, (float)o.lr);
    if (o.opt_kind == OPT_SGD) oc.momentum = (float)o.momentum;
    oc.weight_decay = (float)o.wd;
    RtConfig cfg = {.model_path = o.model, .sched = &sched, .unit_batch = unit_batch, .opt = oc,
                    .seed = (uint64_t)o.seed, .train = input_here ? &train : NULL, .test = &test,
                    .recv_timeout_s = o.timeout, .trace = o.trace || o.svg, .threads = o.threads,
                    .progress = pd_stderr_is_tty() ? 1 : (o.progress || mpi) ? 2 : 0, .units_total = sched.n_units,
                    .nan_check = o.nan_check};
    res = calloc((size_t)sched.n_ranks, sizeof *res);
    PD_ASSERT(res);
    if ((rc = run_segments(&o, comm, plan, &sched, &cfg, res, &err))) goto out;
    if (mpi && (rc = gather(comm, res, cfg.trace, &err))) goto out;
    if (rank == 0) {
        if ((rc = report(&o, plan, &sched, res, mpi ? "mpi" : "threads", have_prof ? &prof : NULL, unit_batch, &err)))
            goto out;
        if ((o.svg || o.trace) && (rc = write_pictures(&o, &sched, res, &err))) goto out;
        if (o.curve && (rc = write_curve(o.curve, &sched, res, &err))) goto out;
    }
out:
    if (res)
        for (int r = 0; r < sched.n_ranks; r++) rt_result_release(&res[r]);
    free(res);
    sched_release(&sched);
    data_release(&train);
    data_release(&test);
    if (have_prof) profile_release(&prof);
    plan_free(plan);
    if (rc) {
        if (mpi) fprintf(stderr, "pipedream: error: rank %d: %s\n", rank, err.msg);
        else fprintf(stderr, "pipedream: error: %s\n", err.msg);
    }
    comm_free(comm);
    return rc ? CLI_FAIL : CLI_OK;
}
