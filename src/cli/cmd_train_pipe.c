/* cmd_train_pipe.c: pipelined training, `pipedream train MODEL.json --plan PLAN.json` under
 * mpirun (one rank per worker) or `--workers N` on one host (one thread per worker). Parses
 * the flags into an RtTrainSpec, runs the session (rt_train, runtime.h) and prints its
 * summary (train_report.c). One-worker training is cmd_train.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "runtime.h"
#include "train_report.h"

static const char *USAGE =
    "usage: pipedream train MODEL.json --workers N [--plan PLAN.json] [options]      (threads, one host)\n"
    "       mpirun -np N pipedream train MODEL.json --plan PLAN.json [options]       (MPI)\n"
    "Pipeline-parallel training: every worker runs its stage of the plan, following the\n"
    "instruction lists of the schedule. Without --plan (threads only), the model is profiled\n"
    "briefly and planned for N workers.\n"
    "  --plan PLAN.json      stages, replicas and ranks (from 'pipedream plan')\n"
    "  --workers N           run N workers as threads in this process\n"
    "  --schedule KIND       1f1b (default), gpipe, 1f1b-flush, 2bw, zb-h1, zb-h2, dp, model-parallel,\n"
    "                        asp (zb-h1, zb-h2: 1f1b-flush with the backward split into input and\n"
    "                        weight gradient, the weight passes deferred into the bubbles)\n"
    "                        (asp: every worker the whole model, gradients applied at sharded\n"
    "                        parameter owners without waiting; launched like dp), interleaved\n"
    "                        (Megatron's interleaved 1F1B: several stages per worker; the default\n"
    "                        for a plan written by 'pipedream plan --chunks V')\n"
    "  --chunks V            interleave a straight plan of S one-replica stages: stage i on worker\n"
    "                        i mod (S / V), V stages per worker (implies --schedule interleaved)\n"
    "  --vertical-sync       1f1b: every stage uses the input stage's weight version\n"
    "  --recompute           keep only each stage's input per unit in flight and recompute the\n"
    "                        forward before the backward (activation memory for time)\n"
    "  --no-stash            ablation: backward uses the newest weights instead of the version its\n"
    "                        forward used (no weight stashing)\n"
    "  --staleness METHOD    compensate stale weights (1f1b, 2bw): none (default), predict, lookahead,\n"
    "                        lr-warmup, or joined with + (docs/explanation/staleness.md)\n"
    "  --staleness-warmup K  the optimizer steps of lr-warmup (default 500)\n"
    "  --microbatches M      micro-batches per minibatch (gpipe, 1f1b-flush, 2bw, zb, interleaved:\n"
    "                        a multiple of the workers; default 4)\n"
    "  --epochs N | --steps N   training length (default 1 epoch); steps = minibatches fed\n"
    "  --minibatch B         samples per minibatch (default 64; split into M micro-batches)\n"
    "  --lr X  --momentum M  --weight-decay W  --optimizer sgd|adam  --seed S\n"
    "  --threads T           kernel threads per worker (default 1)\n"
    "  --data DIR            Fashion-MNIST IDX directory (default /usr/share/datasets/fashion-mnist)\n"
    "  --text FILE           or byte-level text for a language model (its last 5% held out;\n"
    "                        test_loss in nats per byte)\n"
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
    "  --eval-every N        evaluate on the test set every N minibatches (the pipeline drains there);\n"
    "                        each evaluation is a metrics line; default: only after training\n"
    "  --target-accuracy A   stop at the first evaluation with test accuracy >= A (time to accuracy)\n"
    "  --nan-check WHAT      stop at a NaN or Inf: loss (default: the last stage's loss), all\n"
    "                        (also every stage's gradients after each backward), off\n"
    "  --init W.safetensors  start from these weights (train --save, tools/export_torch.py, a checkpoint)\n"
    "  --resume D            continue from the newest complete checkpoint in D (same settings;\n"
    "                        another plan or schedule also works: tensors are named by layer)\n";

typedef struct PipeOpts {
    const char *model, *plan, *data, *text, *profile, *metrics, *trace, *svg, *curve, *checkpoint_dir, *resume, *init;
    int workers, micro, epochs, steps, batch, threads, seed, vsync, opt_kind, progress, checkpoint_every, nan_check,
        eval_every, no_stash, recompute, chunks, kind_given, staleness, staleness_warmup;
    double target;
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
        if (!strcmp(a, "--recompute")) {
            o->recompute = 1;
            continue;
        }
        if (!strcmp(a, "--no-stash")) {
            o->no_stash = 1;
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
                                                 "--optimizer", "--seed", "--threads", "--data", "--text", "--profile",
                                                 "--metrics", "--trace", "--svg", "--curve", "--timeout",
                                                 "--checkpoint-every", "--checkpoint-dir", "--resume", "--init", "--nan-check",
                                                 "--eval-every", "--target-accuracy", "--chunks", "--staleness",
                                                 "--staleness-warmup", NULL};
        int known = 0;
        for (int k = 0; WITH_VALUE[k]; k++) known |= !strcmp(a, WITH_VALUE[k]);
        if (!known) return cli_usage_error(C, "unknown option %s", a);
        if (!(v = cli_value(C, argc, argv, &i))) return CLI_USAGE;
        if (!strcmp(a, "--plan")) o->plan = v;
        else if (!strcmp(a, "--workers")) rc = cli_parse_int(C, a, v, 1, 4096, &o->workers);
        else if (!strcmp(a, "--schedule")) {
            if (sched_kind_parse(v, &o->kind)) return cli_usage_error(C, "unknown schedule \"%s\"", v);
            o->kind_given = 1;
        } else if (!strcmp(a, "--chunks")) rc = cli_parse_int(C, a, v, 2, RT_MAX_CHUNKS, &o->chunks);
        else if (!strcmp(a, "--microbatches")) rc = cli_parse_int(C, a, v, 1, 65536, &o->micro);
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
        else if (!strcmp(a, "--staleness")) {
            Err e = {0};
            if (rt_staleness_parse(v, &o->staleness, &e)) return cli_usage_error(C, "%s", e.msg);
        } else if (!strcmp(a, "--staleness-warmup")) rc = cli_parse_int(C, a, v, 1, 1000000000, &o->staleness_warmup);
        else if (!strcmp(a, "--text")) o->text = v;
        else if (!strcmp(a, "--profile")) o->profile = v;
        else if (!strcmp(a, "--metrics")) o->metrics = v;
        else if (!strcmp(a, "--trace")) o->trace = v;
        else if (!strcmp(a, "--svg")) o->svg = v;
        else if (!strcmp(a, "--curve")) o->curve = v;
        else if (!strcmp(a, "--checkpoint-every")) rc = cli_parse_int(C, a, v, 1, 1000000000, &o->checkpoint_every);
        else if (!strcmp(a, "--checkpoint-dir")) o->checkpoint_dir = v;
        else if (!strcmp(a, "--eval-every")) rc = cli_parse_int(C, a, v, 1, 1000000000, &o->eval_every);
        else if (!strcmp(a, "--target-accuracy")) rc = cli_parse_double(C, a, v, 0, 1, &o->target);
        else if (!strcmp(a, "--resume")) o->resume = v;
        else if (!strcmp(a, "--init")) o->init = v;
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
    if (o->chunks && o->kind_given && o->kind != SCHED_INTERLEAVED)
        return cli_usage_error(C, "--chunks applies to --schedule interleaved only");
    if (o->chunks) o->kind = SCHED_INTERLEAVED, o->kind_given = 1;
    return CLI_OK;
}

/* After the plan is known (an interleaved plan makes interleaved the default schedule): the
 * micro-batch defaults and checks. */
static int check_micro(PipeOpts *o) {
    const char *C = "train";
    int micro_kind = o->kind == SCHED_GPIPE || o->kind == SCHED_1F1B_FLUSH || o->kind == SCHED_2BW ||
                     o->kind == SCHED_ZB_H1 || o->kind == SCHED_ZB_H2 || o->kind == SCHED_INTERLEAVED;
    if (o->micro == 0) o->micro = micro_kind ? 4 : 1;
    if (o->micro > 1 && !micro_kind)
        return cli_usage_error(C, "--microbatches applies only to gpipe, 1f1b-flush, 2bw, zb-h1, zb-h2 and interleaved");
    if (o->vsync && o->kind != SCHED_1F1B) return cli_usage_error(C, "--vertical-sync applies only to 1f1b");
    if (o->init && o->resume) return cli_usage_error(C, "--init and --resume exclude each other");
    if (o->checkpoint_every && !o->checkpoint_dir) return cli_usage_error(C, "--checkpoint-every needs --checkpoint-dir");
    if (o->checkpoint_dir && !o->checkpoint_every) return cli_usage_error(C, "--checkpoint-dir needs --checkpoint-every");
    if (o->batch % o->micro)
        return cli_usage_error(C, "--minibatch %d is not a multiple of --microbatches %d", o->batch, o->micro);
    return CLI_OK;
}

int cmd_train_pipelined(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(USAGE, stdout);
        return CLI_OK;
    }
    PipeOpts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    /* the schedule an interleaved plan implies, known before MPI starts (every rank reads it) */
    Plan *plan = NULL;
    Err err = {0};
    if (o.plan) {
        if (!(plan = plan_load(o.plan, &err))) return cli_fail(&err);
        if (plan->chunks > 1 && !o.kind_given) o.kind = SCHED_INTERLEAVED;
        if (plan->chunks > 1 && o.kind != SCHED_INTERLEAVED) {
            plan_free(plan);
            return cli_usage_error("train", "%s is an interleaved plan (%d stages per worker): it runs with --schedule "
                                   "interleaved only", o.plan, plan->chunks);
        }
        if (o.chunks && plan->chunks > 1 && o.chunks != plan->chunks) {
            err_set(&err, PD_EINVAL, "%s is an interleaved plan of %d chunks, not %d", o.plan, plan->chunks, o.chunks);
            plan_free(plan);
            return cli_fail(&err);
        }
        if (o.chunks && plan->chunks <= 1 && plan_interleave(plan, o.chunks, &err)) {
            err_prefix(&err, "%s: --chunks %d", o.plan, o.chunks);
            plan_free(plan);
            return cli_fail(&err);
        }
    } else if (o.chunks || o.kind == SCHED_INTERLEAVED) {
        return cli_usage_error("train", "interleaved needs --plan (make one with 'pipedream plan --chunks V')");
    }
    if ((rc = check_micro(&o))) {
        plan_free(plan);
        return rc;
    }
    int mpi = cli_under_mpirun();
    if (mpi && !o.plan) return cli_usage_error("train", "under mpirun, give --plan (make one with 'pipedream plan')");
    if (!mpi && !o.workers) {
        plan_free(plan);
        return cli_usage_error("train", "give --workers N to run the pipeline on threads");
    }
    Comm *comm = NULL;
    if (mpi && comm_mpi_create(&argc, &argv, &comm, &err)) {
        plan_free(plan);
        return cli_fail(&err);
    }
    int rank = comm ? comm_rank(comm) : 0;
    Profile prof = {0};
    int have_prof = 0;
    RtTrainSummary sum = {0};
    int unit_batch = o.batch / o.micro;
    if (o.profile) {
        if ((rc = profile_load(o.profile, &prof, &err))) goto out;
        have_prof = 1;
    }
    if (!o.plan) {   /* profile briefly on this host and plan for N workers joined by shared memory */
        RtProfileOpts po = {.minibatch = unit_batch, .threads = o.threads, .warmup = 2, .iterations = 5,
                            .progress = pd_stderr_is_tty()};
        if (!have_prof && (rc = rt_profile(o.model, &po, &prof, &err))) goto out;
        have_prof = 1;
        Cluster cl = {.n_levels = 1};
        cl.level[0] = (ClusterLevel){.workers = o.workers, .bandwidth = 1e10, .latency = 1e-5};
        PlanOpts popt = {.cost_model = COST_OURS};
        if (!(plan = plan_new(&prof, &cl, &popt, &err))) {
            rc = err.code ? err.code : PD_EINVAL;
            goto out;
        }
        fprintf(stderr, "pipedream: planned %d stage(s) for %d workers from a %d-iteration profile\n", plan->n_stages,
                o.workers, po.iterations);
    }
    if (!mpi && plan->n_workers != o.workers) {
        rc = err_set(&err, PD_EINVAL, "the plan uses %d workers, --workers says %d", plan->n_workers, o.workers);
        goto out;
    }
    OptConfig oc = optim_defaults((OptKind)o.opt_kind, (float)o.lr);
    if (o.opt_kind == OPT_SGD) oc.momentum = (float)o.momentum;
    oc.weight_decay = (float)o.wd;
    RtTrainSpec spec = {.model_path = o.model, .plan = plan, .kind = o.kind, .n_micro = o.micro,
                        .vertical_sync = o.vsync, .epochs = o.epochs, .steps = o.steps, .minibatch = o.batch,
                        .opt = oc, .seed = (uint64_t)o.seed, .data_dir = o.data, .text = o.text, .threads = o.threads,
                        .timeout_s = o.timeout, .checkpoint_every = o.checkpoint_every,
                        .checkpoint_dir = o.checkpoint_dir, .resume = o.resume, .init_weights = o.init, .trace = o.trace || o.svg,
                        .progress = pd_stderr_is_tty() ? 1 : (o.progress || mpi) ? 2 : 0, .nan_check = o.nan_check,
                        .profile = have_prof ? &prof : NULL, .eval_every = o.eval_every,
                        .target_accuracy = o.target, .no_stash = o.no_stash, .staleness = o.staleness, .staleness_warmup = o.staleness_warmup, .recompute = o.recompute};
    if ((rc = rt_train(comm, &spec, &sum, &err))) goto out;
    if (rank == 0) {
        TrainOutputs outs = {.metrics = o.metrics, .trace = o.trace, .svg = o.svg, .curve = o.curve};
        rc = train_report(&sum, &outs, &err);
    }
out:
    rt_train_summary_release(&sum);
    if (have_prof) profile_release(&prof);
    plan_free(plan);
    if (rc) fprintf(stderr, "pipedream: error: %s\n", err.msg);
    comm_free(comm);
    return rc ? CLI_FAIL : CLI_OK;
}
