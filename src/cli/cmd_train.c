/* cmd_train.c: `pipedream train MODEL.json`: training on one worker or many, one program. The
 * flags (one table, FLAGS below: adding a flag is adding a row and a field) become an
 * RtTrainSpec; the session (rt_train, runtime.h) runs it: one worker is one stage of the whole
 * model on one thread, --workers N threads of this process, or the ranks of an MPI job
 * (mpirun ... --plan PLAN.json); the summary and its files are train_report.c's. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "kernels.h"
#include "runtime.h"
#include "train_report.h"

_Static_assert(SCHED_MAX_CHUNKS <= RT_MAX_CHUNKS, "train holds every chunk a plan may have");

typedef struct TrainOpts {
    const char *model, *plan, *data, *text, *tokens, *augment, *profile, *metrics, *trace, *svg, *curve, *checkpoint_dir, *resume, *init,
        *save, *calibrated, *calibrated_cluster, *progress_file;
    int workers, micro, epochs, steps, batch, threads, seed, vsync, opt_kind, progress, checkpoint_every, keep_last,
        nan_check, eval_every, no_stash, recompute, chunks, log_every, kind_given, staleness, staleness_warmup,
        lr_sched, warmup, decay_steps, wire, wire_grad, error_feedback, precision, fit;
    SchedKind kind;
    double lr, momentum, wd, timeout, target, beta1, beta2, min_lr, clip;
} TrainOpts;

static int set_schedule(TrainOpts *o, const char *v) {
    if (sched_kind_parse(v, &o->kind)) return cli_usage_error("train", "unknown schedule \"%s\"", v);
    o->kind_given = 1;
    return CLI_OK;
}

static int set_optimizer(TrainOpts *o, const char *v) {
    if ((o->opt_kind = optim_kind_parse(v)) < 0)
        return cli_usage_error("train", "--optimizer expects sgd, adam or adamw, got \"%s\"", v);
    return CLI_OK;
}

static int set_wire(TrainOpts *o, const char *v) {
    if ((o->wire = rt_wire_parse(v)) < 0)
        return cli_usage_error("train", "--wire expects fp32, bf16, int8, int4 or delta, got \"%s\"", v);
    return CLI_OK;
}

static int set_wire_grad(TrainOpts *o, const char *v) {
    if ((o->wire_grad = rt_wire_parse(v)) < 0 || o->wire_grad == RT_WIRE_DELTA)
        return cli_usage_error("train", "--wire-grad expects fp32, bf16, int8 or int4, got \"%s\"", v);
    return CLI_OK;
}

static int set_fit(TrainOpts *o, const char *v) {
    if (!strcmp(v, "core-efficiency")) o->fit = RT_FIT_CORE_EFFICIENCY;
    else if (!strcmp(v, "wake")) o->fit = RT_FIT_WAKE;
    else if (!strcmp(v, "link-rate")) o->fit = RT_FIT_LINK_RATE;
    else return cli_usage_error("train", "--fit expects core-efficiency, wake or link-rate, got \"%s\"", v);
    return CLI_OK;
}

static int set_lr_schedule(TrainOpts *o, const char *v) {
    if ((o->lr_sched = optim_lr_sched_parse(v)) < 0)
        return cli_usage_error("train", "--lr-schedule expects constant, cosine or linear, got \"%s\"", v);
    return CLI_OK;
}

static int set_staleness(TrainOpts *o, const char *v) {
    Err e = {0};
    if (rt_staleness_parse(v, &o->staleness, &e)) return cli_usage_error("train", "%s", e.msg);
    return CLI_OK;
}

static int set_precision(TrainOpts *o, const char *v) { return cli_parse_precision("train", v, &o->precision); }

static int set_nan_check(TrainOpts *o, const char *v) {
    if (!strcmp(v, "loss")) o->nan_check = RT_NAN_LOSS;
    else if (!strcmp(v, "all")) o->nan_check = RT_NAN_ALL;
    else if (!strcmp(v, "off")) o->nan_check = RT_NAN_OFF;
    else return cli_usage_error("train", "--nan-check expects loss, all or off, got \"%s\"", v);
    return CLI_OK;
}

/* One flag: a switch (arg NULL), an integer or number in [lo, hi], a string, or a choice
 * parsed by its own function; off locates its field in TrainOpts. A row with name NULL is a
 * heading of the help text. */
typedef enum { F_SWITCH, F_INT, F_NUM, F_STR, F_CHOICE } FlagKind;
typedef struct Flag {
    const char *name, *arg;
    FlagKind kind;
    size_t off;
    double lo, hi;
    int (*choice)(TrainOpts *o, const char *v);
    const char *help;
} Flag;

#define SECTION(t) {NULL, NULL, F_SWITCH, 0, 0, 0, NULL, t}
#define SWITCH(n, f, h) {n, NULL, F_SWITCH, offsetof(TrainOpts, f), 0, 0, NULL, h}
#define INT(n, a, f, lo, hi, h) {n, a, F_INT, offsetof(TrainOpts, f), lo, hi, NULL, h}
#define NUM(n, a, f, lo, hi, h) {n, a, F_NUM, offsetof(TrainOpts, f), lo, hi, NULL, h}
#define STR(n, a, f, h) {n, a, F_STR, offsetof(TrainOpts, f), 0, 0, NULL, h}
#define CHOICE(n, a, fn, h) {n, a, F_CHOICE, 0, 0, 0, fn, h}

static const Flag FLAGS[] = {
    SECTION("workers and schedule"),
    INT("--workers", "N", workers, 1, 4096,
        "run N workers as threads of this process (default: the plan's workers; 1 without --plan). "
        "Without --plan, N > 1 workers are planned here from a brief profile (10 GB/s links, this "
        "machine's cores shared by the workers)"),
    STR("--plan", "PLAN.json", plan, "stages, replicas and ranks (from 'pipedream plan'); needed under mpirun, where "
        "rank 0 alone reads it and sends it to the others; - reads standard input (mpirun forwards it to rank 0)"),
    CHOICE("--schedule", "KIND", set_schedule,
           "1f1b (default), gpipe, 1f1b-flush, 2bw, zb-h1, zb-h2 (1f1b-flush with the backward "
           "split into input and weight gradient, the weight passes deferred into the bubbles), "
           "dp, model-parallel, asp (every worker the whole model, gradients applied at sharded "
           "parameter owners without waiting), interleaved (several stages per worker; the "
           "default for a plan written by 'pipedream plan --chunks V'), zb-v, v-half, v-min, dualpipe-v "
           "(two stages per worker in a V: a plan from 'pipedream plan --v-shape', zb-v its default, or a "
           "plain plan of 2 P stages placed here; backward split, a flush per minibatch)"),
    INT("--chunks", "V", chunks, 2, SCHED_MAX_CHUNKS,
        "interleave a plan of S stages with the same d replicas each: replica j of stage i on worker "
        "(i mod (S / V)) d + j, V stages per worker, d whole pipelines (implies --schedule interleaved; "
        "needs 2 or more workers a pipeline)"),
    INT("--microbatches", "M", micro, 1, 65536,
        "micro-batches per minibatch for gpipe, 1f1b-flush, 2bw, zb-h1, zb-h2, interleaved, the V kinds "
        "(interleaved: a multiple of the workers; zb-v: at least one per worker, dualpipe-v two; default: one "
        "per worker of the plan, two for dualpipe-v), and "
        "1f1b, which then steps once per minibatch (default on 2 or more workers: 4, or the largest count "
        "below 4 that divides the minibatch; 1: a step per unit, PipeDream's original)"),
    SWITCH("--vertical-sync", vsync, "1f1b: every stage uses the input stage's weight version"),
    CHOICE("--wire", "CODEC", set_wire,
           "how activations travel between stages: fp32 (default), bf16 (half the bytes), int8 (a scale per "
           "row), int4 (a scale per 64 values), delta (per training sample, the int4 difference from its "
           "previous activation; int8 in the first epoch); gradients travel the same way unless --wire-grad"),
    CHOICE("--wire-grad", "CODEC", set_wire_grad,
           "how activation gradients travel back: fp32, bf16, int8, int4 (stochastic rounding, seeded); "
           "default: as --wire (fp32 with --wire delta)"),
    SWITCH("--error-feedback", error_feedback,
           "gradients: add each message's quantization error to the next one of the same boundary and "
           "micro-batch position"),
    SWITCH("--recompute", recompute,
           "keep only each stage's input per unit in flight and recompute the forward before "
           "the backward (activation memory for time)"),
    SWITCH("--no-stash", no_stash,
           "ablation: the backward uses the newest weights, not the version its forward used"),
    CHOICE("--staleness", "METHOD", set_staleness,
           "compensation for the delayed gradients of the asynchronous schedules: none, predict "
           "(default for 2bw), lookahead (default for 1f1b and asp), lr-warmup, or several joined with + "
           "(docs/explanation/staleness.md)"),
    INT("--staleness-warmup", "K", staleness_warmup, 1, 1000000000,
        "lr-warmup: the optimizer steps of the warm-up (default 500)"),
    SECTION("training"),
    INT("--epochs", "N", epochs, 1, 100000, "passes over the training set (default 1; whole minibatches)"),
    INT("--steps", "N", steps, 1, 1000000000, "train exactly N minibatches instead"),
    INT("--minibatch", "B", batch, 1, 65536, "samples per minibatch (default 64; split into the micro-batches)"),
    NUM("--lr", "X", lr, 0, 100, "learning rate (default 0.01)"),
    NUM("--momentum", "M", momentum, 0, 0.999999, "SGD momentum (default 0.9)"),
    NUM("--weight-decay", "W", wd, 0, 10, "weight decay (default 0): L2 in the gradient for sgd and adam, decoupled for adamw"),
    CHOICE("--optimizer", "NAME", set_optimizer,
           "sgd (default), adam or adamw (Adam with decoupled weight decay)"),
    NUM("--beta1", "B", beta1, 0, 0.999999, "adam, adamw: the first moment's decay (default 0.9)"),
    NUM("--beta2", "B", beta2, 0, 0.999999, "adam, adamw: the second moment's decay (default 0.999)"),
    CHOICE("--lr-schedule", "KIND", set_lr_schedule,
           "constant (default), cosine or linear: after the warm-up, decay from --lr to --min-lr at --decay-steps"),
    INT("--warmup-steps", "N", warmup, 0, 1000000000, "linear learning-rate warm-up over the first N optimizer steps"),
    INT("--decay-steps", "N", decay_steps, 1, 1000000000,
        "the optimizer step at which the decay reaches --min-lr (default: the run's last)"),
    NUM("--min-lr", "X", min_lr, 0, 100, "the decay's floor (default 0)"),
    NUM("--clip-grad-norm", "X", clip, 0, 1e30,
        "scale the gradient down to global norm X (over all stages; synchronous schedules; default off)"),
    INT("--seed", "S", seed, 0, 2147483647, "weight init, data order and dropout seed (default 1)"),
    INT("--threads", "T", threads, 1, 1024, "kernel threads per worker (default 1)"),
    CHOICE("--precision", "fp32|bf16", set_precision,
           "compute precision of convolutions, linear layers and attention: fp32 (default) or bf16 "
           "(bf16 inputs, float32 accumulation; weights, gradients and optimizer stay float32)"),
    SECTION("data and weights"),
    STR("--data", "DIR", data,
        "images: IDX files (default " DATA_DEFAULT_IDX_DIR "), CIFAR-10 binary batches, or an image folder "
        "(DIR/train/CLASS/*.png|jpg, DIR/test/CLASS/...), told apart by what DIR holds; standardised "
        "with the training split's mean and std"),
    STR("--augment", "SPEC", augment,
        "augment the training images: crop=P (random crop of the image padded by P pixels), flip "
        "(random left-right mirror), or both as crop=P,flip; seeded by --seed (default: none)"),
    STR("--text", "FILE", text, "or byte-level text for a language model (its last 5% held out; test_loss in nats per byte)"),
    STR("--tokens", "DIR", tokens,
        "or token shards in llm.c's format: DIR/*train*.bin to train on, DIR/*val*.bin to evaluate "
        "(test_loss per token; per byte too with DIR/tokenizer.json)"),
    STR("--init", "W.safetensors", init,
        "start from these weights (--save, tools/export_torch.py, a checkpoint); optimizer fresh"),
    STR("--save", "W.safetensors", save, "write the final weights (and batch-norm state, input statistics)"),
    SECTION("checkpoints and evaluation"),
    INT("--checkpoint-every", "N", checkpoint_every, 1, 1000000000,
        "checkpoint every N minibatches into --checkpoint-dir (the pipeline drains there, so "
        "the checkpoint is exact)"),
    STR("--checkpoint-dir", "D", checkpoint_dir,
        "where checkpoints go (ckpt-<minibatches>.safetensors; created if missing), each rank's own: "
        "where it is not rank 0's, a second rank keeps a copy; %r: the rank's number"),
    INT("--keep-last", "N", keep_last, 1, 1000000000,
        "keep only the newest N checkpoints of the run (default: all); never the one a resume needs"),
    STR("--resume", "D", resume,
        "continue from the newest complete checkpoint in D (same seed and optimizer; any plan, "
        "schedule or worker count: tensors are named by layer); the newest in any rank's D, sent "
        "to the ranks whose D lacks it; %r: the rank's number"),
    INT("--eval-every", "N", eval_every, 1, 1000000000,
        "evaluate on the test set every N minibatches (the pipeline drains there); default: "
        "only after training"),
    NUM("--target-accuracy", "A", target, 0, 1, "stop at the first evaluation with test accuracy >= A (time to accuracy)"),
    CHOICE("--nan-check", "WHAT", set_nan_check,
           "stop at a NaN or Inf: loss (default: the last stage's loss), all (also every stage's "
           "gradients after each backward), off"),
    NUM("--timeout", "S", timeout, 0, 1e6, "deadline of every wait in seconds (default 300)"),
    SECTION("outputs"),
    STR("--metrics", "FILE.jsonl", metrics,
        "JSON lines: the summary, one per stage, one per evaluation, one per --log-every minibatches"),
    INT("--log-every", "N", log_every, 1, 1000000000, "minibatches per metrics \"step\" line (default 50)"),
    STR("--profile", "FILE", profile, "profile for the simulator's predicted times (default: the one made without --plan)"),
    STR("--calibrated-profile", "FILE", calibrated,
        "with --profile: write it again with each stage's layers scaled to the compute this run measured, to re-plan from"),
    STR("--calibrated-cluster", "FILE", calibrated_cluster,
        "with --profile and a plan: write the plan's cluster with the figure --fit names (by default the core "
        "efficiency, for a plan whose workers share cores) at which the simulator predicts this run's time per "
        "unit, to re-plan from (plan --cluster)"),
    CHOICE("--fit", "WHAT", set_fit,
           "what --calibrated-cluster fits: core-efficiency (default: every core's speed while all compute) or "
           "wake (the seconds a worker loses waking from a wait while the cores are busy; the core efficiency "
           "stays the plan's) or link-rate (one factor on every link's bandwidth: the share of the cluster "
           "file's rates the run achieved)"),
    STR("--progress-file", "FILE.jsonl", progress_file,
        "at every checkpoint, append a JSON line: each rank's compute, wait and busy ms per unit "
        "of the segment beside the prediction (with --profile; pipedream launch reads it)"),
    STR("--trace", "FILE.json", trace, "Chrome trace of every worker's instructions"),
    STR("--svg", "FILE", svg, "timeline of the measured run (beside the simulated one, with a profile)"),
    STR("--curve", "FILE", curve, "loss and accuracy curve (SVG)"),
    SWITCH("--progress", progress, "a progress line every 10 s even when stderr is not a terminal"),
};
enum { N_FLAGS = sizeof FLAGS / sizeof FLAGS[0] };

static void help(void) {
    printf("usage: pipedream train MODEL.json [options]                        one worker, or --workers N\n"
           "       mpirun -np N pipedream train MODEL.json --plan PLAN.json [options]    MPI, N workers\n\n"
           "Trains MODEL.json: one worker runs the whole model; several run the plan's stages\n"
           "following the schedule's instruction lists. The same flags, checks, checkpoints and\n"
           "summary in every mode: one JSON line on stdout (docs/reference/formats.md, \"Training summary\"),\n"
           "a per-stage table on stderr, a progress line on stderr when it is a terminal.\n");
    for (int i = 0; i < N_FLAGS; i++) {
        const Flag *f = &FLAGS[i];
        if (!f->name) {
            printf("\n%s:\n", f->help);
            continue;
        }
        char head[64];
        snprintf(head, sizeof head, "%s%s%s", f->name, f->arg ? " " : "", f->arg ? f->arg : "");
        if (strlen(head) > 23) printf("  %s\n%26s", head, ""); /* a long flag: its text on the next line */
        else printf("  %-24s", head);
        int col = 26;
        for (const char *p = f->help; *p;) {   /* words, wrapped at 100 columns under the first */
            size_t n = strcspn(p, " ");
            if (col > 26 && col + 1 + (int)n > 100) printf("\n%26s", ""), col = 26;
            else if (col > 26) putchar(' '), col++;
            printf("%.*s", (int)n, p);
            col += (int)n;
            p += n;
            while (*p == ' ') p++;
        }
        putchar('\n');
    }
}

static int parse(int argc, char **argv, TrainOpts *o) {
    const char *C = "train";
    *o = (TrainOpts){.epochs = 1, .batch = CLI_TRAIN_MINIBATCH, .threads = 1, .seed = 1, .kind = SCHED_1F1B, .lr = 0.01,
                     .momentum = 0.9, .timeout = 300, .opt_kind = OPT_SGD, .log_every = 50,
                     .staleness = RT_STALE_DEFAULT, .beta1 = 0.9, .beta2 = 0.999,
                     .wire = -1, .wire_grad = -1};
    int have_epochs = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (a[0] != '-') {
            if (o->model) return cli_usage_error(C, "unexpected argument \"%s\"", a);
            o->model = a;
            continue;
        }
        const Flag *f = NULL;
        for (int k = 0; k < N_FLAGS && !f; k++)
            if (FLAGS[k].name && !strcmp(a, FLAGS[k].name)) f = &FLAGS[k];
        if (!f) return cli_usage_error(C, "unknown option \"%s\"", a);
        have_epochs |= !strcmp(a, "--epochs");
        char *field = (char *)o + f->off;
        if (f->kind == F_SWITCH) {
            *(int *)field = 1;
            continue;
        }
        if (!(v = cli_value(C, argc, argv, &i))) return CLI_USAGE;
        int rc = CLI_OK;
        switch (f->kind) {
        case F_INT: rc = cli_parse_int(C, a, v, (long)f->lo, (long)f->hi, (int *)field); break;
        case F_NUM: rc = cli_parse_double(C, a, v, f->lo, f->hi, (double *)field); break;
        case F_STR: *(const char **)field = v; break;
        case F_CHOICE: rc = f->choice(o, v); break;
        case F_SWITCH: break;
        }
        if (rc) return rc;
    }
    if (!o->model) return cli_usage_error(C, "missing MODEL.json");
    if (have_epochs && o->steps) return cli_usage_error(C, "--epochs and --steps exclude each other");
    if (!!o->data + !!o->text + !!o->tokens > 1) return cli_usage_error(C, "--data, --text and --tokens exclude each other");
    if (o->augment && (o->text || o->tokens)) return cli_usage_error(C, "--augment applies to images (--data) only");
    struct stat st;
    if (o->tokens && (stat(o->tokens, &st) != 0 || !S_ISDIR(st.st_mode)))
        return cli_usage_error(C, "--tokens %s: not a directory (of token shards)", o->tokens);
    if (o->augment) {
        DataAugment aug;
        Err e = {0};
        if (data_augment_parse(o->augment, &aug, &e)) return cli_usage_error(C, "--augment: %s", e.msg);
        data_splits_set_augment(&aug);
    }
    if (o->init && o->resume) return cli_usage_error(C, "--init and --resume exclude each other");
    if (o->checkpoint_every && !o->checkpoint_dir) return cli_usage_error(C, "--checkpoint-every needs --checkpoint-dir");
    if (o->checkpoint_dir && !o->checkpoint_every) return cli_usage_error(C, "--checkpoint-dir needs --checkpoint-every");
    if (o->keep_last && !o->checkpoint_every)
        return cli_usage_error(C, "--keep-last needs --checkpoint-every and --checkpoint-dir");
    if (o->chunks && o->kind_given && o->kind != SCHED_INTERLEAVED)
        return cli_usage_error(C, "--chunks applies to --schedule interleaved only");
    if (o->chunks) o->kind = SCHED_INTERLEAVED, o->kind_given = 1;
    if (o->opt_kind == OPT_SGD && (o->beta1 != 0.9 || o->beta2 != 0.999))
        return cli_usage_error(C, "--beta1 and --beta2 apply to --optimizer adam and adamw");
    if (o->lr_sched == LR_CONSTANT && (o->decay_steps || o->min_lr > 0))
        return cli_usage_error(C, "--decay-steps and --min-lr apply to --lr-schedule cosine or linear");
    if (o->min_lr > o->lr) return cli_usage_error(C, "--min-lr %g is above --lr %g", o->min_lr, o->lr);
    if (o->decay_steps && o->decay_steps <= o->warmup)
        return cli_usage_error(C, "--decay-steps %d ends before the warm-up does (--warmup-steps %d)", o->decay_steps,
                               o->warmup);
    return CLI_OK;
}

/* The whole of standard input (--plan -), NUL-terminated (pd_free), at most PLAN_MAX_BYTES. */
static int read_stdin(char **out, size_t *len, Err *err) {
    size_t n = 0, cap = 1 << 16;
    char *b = malloc(cap);
    PD_ASSERT(b);
    for (size_t got; n <= PLAN_MAX_BYTES && (got = fread(b + n, 1, cap - n, stdin)) > 0;) {
        if ((n += got) < cap) continue;
        b = realloc(b, cap *= 2);
        PD_ASSERT(b);
    }
    int bad = ferror(stdin) || n > PLAN_MAX_BYTES;
    if (!bad) {
        *out = pd_alloc(n + 1), *len = n;
        memcpy(*out, b, n), (*out)[n] = 0;
    }
    free(b);
    if (bad) return err_set(err, PD_EIO, "--plan -: standard input: %s", n > PLAN_MAX_BYTES ? "more than a plan's 64 MiB" : "read error");
    return PD_OK;
}

/* --plan FILE ("-": standard input, which mpirun forwards to rank 0 alone). Under mpirun only
 * rank 0 reads it: the length (-1: it could not) and the bytes go to every rank over the control
 * plane before any rank parses them, so every rank runs the same plan and no other host needs
 * the file (launch's run directory, a head node's disk). */
static Plan *plan_read(Comm *c, const char *path, double timeout_s, Err *err) {
    int stdin_plan = !strcmp(path, "-");
    if (!c && !stdin_plan) return plan_load(path, err);
    int rank = c ? comm_rank(c) : 0;
    char *text = NULL;
    size_t len = 0;
    int64_t n = -1;
    if (rank == 0 && !(stdin_plan ? read_stdin(&text, &len, err) : pd_read_file(path, PLAN_MAX_BYTES, &text, &len, err)))
        n = (int64_t)len;
    if (c && comm_bcast_i64(c, 0, &n, 1, timeout_s, err)) {
        pd_free(text);
        return NULL;
    }
    if (n < 0) {
        if (rank) err_set(err, PD_EIO, "--plan %s: rank 0 could not read it (its message says why)", path);
        return NULL;
    }
    if (rank) text = pd_alloc((size_t)n + 1), text[n] = 0;
    if (c && n > 0 && comm_bcast(c, 0, text, (size_t)n, timeout_s, err)) {
        pd_free(text);
        return NULL;
    }
    Plan *p = plan_parse(text, stdin_plan ? "--plan - (standard input)" : path, err);
    pd_free(text);
    return p;
}

/* The plan (NULL: one worker's, made by the session), its interleaving, and the checks that
 * need it: the schedule, the micro-batches, the workers. */
static int resolve_plan(TrainOpts *o, Comm *comm, Plan **out, Err *err) {
    const char *C = "train";
    int mpi = comm != NULL;
    Plan *plan = NULL;
    *out = NULL;
    if (o->plan) {
        if (!(plan = plan_read(comm, o->plan, o->timeout, err))) return CLI_FAIL;
        if (plan->chunks > 1 && !o->kind_given) o->kind = plan->v_shape ? SCHED_ZB_V : SCHED_INTERLEAVED;
        int chunks = plan->chunks;
        /* the V kinds: a V-placed plan, or a plain one of 2 P stages placed in a V here */
        if (sched_kind_v(o->kind) && chunks > 1 && !plan->v_shape) {
            plan_free(plan);
            return cli_usage_error(C, "%s places its stages round-robin (interleaved); --schedule %s runs a V-placed "
                                   "plan (pipedream plan --v-shape) or a plain one", o->plan, sched_kind_name(o->kind));
        }
        if (plan->v_shape && !sched_kind_v(o->kind)) {
            plan_free(plan);
            return cli_usage_error(C, "%s is a V-placed plan: it runs with --schedule zb-v, v-half, v-min or dualpipe-v",
                                   o->plan);
        }
        if (sched_kind_v(o->kind) && chunks <= 1 && plan_place_v(plan, err)) {
            err_prefix(err, "%s: --schedule %s", o->plan, sched_kind_name(o->kind));
            plan_free(plan);
            return CLI_FAIL;
        }
        chunks = plan->v_shape ? 1 : chunks;
        if (chunks > 1 && o->kind != SCHED_INTERLEAVED) {
            plan_free(plan);
            return cli_usage_error(C, "%s is an interleaved plan (%d stages per worker): it runs with --schedule "
                                   "interleaved only", o->plan, chunks);
        }
        if (o->chunks && chunks > 1 && o->chunks != chunks) {
            err_set(err, PD_EINVAL, "%s is an interleaved plan of %d chunks, not %d", o->plan, chunks, o->chunks);
            plan_free(plan);
            return CLI_FAIL;
        }
        if (o->chunks && chunks <= 1 && plan_interleave(plan, o->chunks, err)) {
            err_prefix(err, "%s: --chunks %d", o->plan, o->chunks);
            plan_free(plan);
            return CLI_FAIL;
        }
        if (!mpi && o->workers && plan->n_workers != o->workers) {
            err_set(err, PD_EINVAL, "the plan uses %d workers, --workers says %d", plan->n_workers, o->workers);
            plan_free(plan);
            return CLI_FAIL;
        }
        o->workers = plan->n_workers;
    } else {
        if (!o->workers) o->workers = 1;
        if (o->chunks || o->kind == SCHED_INTERLEAVED)
            return cli_usage_error(C, "interleaved needs --plan (make one with 'pipedream plan --chunks V') and 2 or "
                                   "more workers");
        if (sched_kind_v(o->kind))
            return cli_usage_error(C, "%s needs --plan (make one with 'pipedream plan --v-shape') and 2 or more workers",
                                   sched_kind_name(o->kind));
    }
    if (o->micro == 0) {
        o->micro = o->vsync ? 1 : sched_default_micro_for(o->kind, o->workers, o->batch);
        if (o->kind == SCHED_1F1B && o->workers > 1)
            fprintf(stderr, "train: 1f1b with %d micro-batches per minibatch, one step each (the default; "
                    "--microbatches 1 steps after every unit, PipeDream's original)\n", o->micro);
    }
    int rc = CLI_OK;
    if (o->micro > 1 && !sched_kind_takes_micro(o->kind))
        rc = cli_usage_error(C, "--microbatches applies only to 1f1b, gpipe, 1f1b-flush, 2bw, zb-h1, zb-h2 and "
                             "interleaved");
    else if (o->vsync && o->kind != SCHED_1F1B)
        rc = cli_usage_error(C, "--vertical-sync applies only to 1f1b");
    else if (o->vsync && o->micro > 1)
        rc = cli_usage_error(C, "--vertical-sync runs one unit per minibatch: drop --microbatches");
    else if (o->batch % o->micro)
        rc = cli_usage_error(C, "--minibatch %d is not a multiple of %d micro-batches (--microbatches; default for "
                             "%s: %d)", o->batch, o->micro, sched_kind_name(o->kind),
                             sched_default_micro(o->kind, o->workers));
    if (rc) {
        plan_free(plan);
        return rc;
    }
    *out = plan;
    return CLI_OK;
}

/* --calibrated-profile: the profile with every layer of stage i scaled by what stage i measured
 * over what the simulator predicted for it (both per unit, the prediction with the run's
 * contention for cores), so the simulator run on it predicts the compute this run had. The
 * stage furthest off is named on stderr. Rank 0, after the run. */
static int write_calibrated(const char *path, Profile *prof, const Plan *plan, const RtTrainSummary *sum, Err *err) {
    int worst = -1;
    double worst_off = 0;
    for (int i = 0; i < sum->stages; i++) {
        const RtStageSummary *g = &sum->stage[i];
        if (!(g->measured_ms > 0) || !(g->predicted_ms > 0))
            return err_set(err, PD_EINVAL, "--calibrated-profile: stage %d has no %s time to calibrate from (%s)", i,
                           g->measured_ms > 0 ? "predicted" : "measured", sum->predicted_note);
        double f = g->measured_ms / g->predicted_ms;
        if (fabs(log(f)) > worst_off) worst_off = fabs(log(f)), worst = i;
        int n = plan ? plan->stages[i].n_layers : prof->n_layers;
        for (int k = 0; k < n; k++) profile_scale_layer(prof, plan ? plan->stages[i].layers[k] : k, f);
    }
    int rc = profile_save(prof, path, err);
    if (rc) return rc;
    if (worst >= 0)
        fprintf(stderr, "calibrated profile: %s (furthest off: stage %d, measured %.3f ms per unit, predicted %.3f, "
                "%+.0f%%)\n", path, worst, sum->stage[worst].measured_ms, sum->stage[worst].predicted_ms,
                100 * (sum->stage[worst].measured_ms / sum->stage[worst].predicted_ms - 1));
    return PD_OK;
}

/* --calibrated-cluster: the plan's cluster with the figure --fit names fitted to this run
 * (rt_summarize). Rank 0, after the run. */
static int write_calibrated_cluster(const char *path, const Plan *plan, const RtTrainSummary *sum, Err *err) {
    const int wake = isfinite(sum->fitted_wake_s), link = isfinite(sum->fitted_link_scale);
    if (!wake && !link && !isfinite(sum->fitted_core_efficiency))
        return err_set(err, PD_EINVAL, "--calibrated-cluster: nothing fitted to write: %s", sum->fitted_note);
    Cluster cl = plan->cluster;
    if (wake) cl.wake_s = sum->fitted_wake_s;
    else if (link) cluster_scale_bandwidth(&cl, sum->fitted_link_scale);
    else cl.core_efficiency = sum->fitted_core_efficiency;
    cJSON *o = cJSON_CreateObject();
    PD_ASSERT(o);
    cluster_to_json(&cl, o);
    int rc = pd_json_save(o, path, err);
    cJSON_Delete(o);
    if (rc) return rc;
    char what[96];
    if (wake)
        snprintf(what, sizeof what, "wake %.3f ms, was %.3f", 1e3 * sum->fitted_wake_s, 1e3 * plan->cluster.wake_s);
    else if (link)
        snprintf(what, sizeof what, "link rate %.3f of the plan's on every link", sum->fitted_link_scale);
    else
        snprintf(what, sizeof what, "core efficiency %.3f, was %.3f", sum->fitted_core_efficiency,
                 plan->cluster.core_efficiency > 0 ? plan->cluster.core_efficiency : 1.0);
    fprintf(stderr, "calibrated cluster: %s (%s: the simulator then predicts %.3f ms per unit, the run measured "
            "%.3f; %s)\n", path, what, sum->fitted_time_per_unit_ms, sum->time_per_unit_ms, sum->fitted_note);
    return PD_OK;
}

static int train_main(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        help();
        return CLI_OK;
    }
    TrainOpts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    int mpi = cli_under_mpirun(), given_workers = o.workers;
    Plan *plan = NULL;
    Err err = {0};
    Comm *comm = NULL;
    if (mpi && comm_mpi_create(&argc, &argv, &comm, &err)) return cli_fail(&err);
    if ((rc = resolve_plan(&o, comm, &plan, &err))) {
        comm_free(comm);
        return rc == CLI_USAGE ? rc : cli_fail(&err);
    }
    int rank = comm ? comm_rank(comm) : 0;
    Profile prof = {0};
    int have_prof = 0;
    RtTrainSummary sum = {0};
    if (mpi && !plan && comm_size(comm) > 1) {
        rc = err_set(&err, PD_EINVAL, "under mpirun, give --plan (make one with 'pipedream plan'); without one the run "
                     "is one worker");
        goto out;
    }
    if (mpi && given_workers && given_workers != comm_size(comm)) {
        rc = err_set(&err, PD_EINVAL, "--workers %d, but mpirun started %d ranks", given_workers, comm_size(comm));
        goto out;
    }
    if (o.profile) {
        if ((rc = profile_load(o.profile, &prof, &err))) goto out;
        have_prof = 1;
    }
    if (!plan && o.workers > 1) {   /* profile briefly on this host and plan for N workers joined by shared memory */
        RtProfileOpts po = {.minibatch = o.batch / o.micro, .threads = o.threads, .warmup = 2, .iterations = 5,
                            .progress = pd_stderr_is_tty(), .precision = o.precision};
        if (!have_prof && (rc = rt_profile(o.model, &po, &prof, &err))) goto out;
        have_prof = 1;
        Cluster cl = {.n_levels = 1};
        cl.level[0] = (ClusterLevel){.workers = o.workers, .bandwidth = 1e10, .latency = 1e-5};
        /* the workers are threads of this process: they share this machine's cores, each
         * worker taking --threads of them */
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        cl.cores_per_machine = ncpu >= o.threads ? (int)(ncpu / o.threads) : 1;
        PlanOpts popt = {.cost_model = COST_OURS};
        if (!(plan = plan_new(&prof, &cl, &popt, &err))) {
            rc = err.code ? err.code : PD_EINVAL;
            goto out;
        }
        fprintf(stderr, "pipedream: planned %d stage(s) for %d workers from a %d-iteration profile\n", plan->n_stages,
                o.workers, po.iterations);
    }
    OptConfig oc = optim_defaults((OptKind)o.opt_kind, (float)o.lr);
    if (o.opt_kind == OPT_SGD) oc.momentum = (float)o.momentum;
    oc.weight_decay = (float)o.wd;
    oc.beta1 = (float)o.beta1, oc.beta2 = (float)o.beta2;
    oc.lr_sched = (LrSchedKind)o.lr_sched, oc.warmup = o.warmup, oc.decay_steps = o.decay_steps;
    oc.min_lr = (float)o.min_lr, oc.clip_norm = (float)o.clip;
    RtTrainSpec spec = {.model_path = o.model, .plan = plan, .kind = o.kind, .n_micro = o.micro,
                        .vertical_sync = o.vsync, .wire = o.wire < 0 ? RT_WIRE_FP32 : o.wire, .wire_grad = o.wire_grad,
                        /* the plan's in-flight depth (plan on links with latency), for 1f1b */
                        .inflight = plan && o.kind == SCHED_1F1B && !o.vsync ? plan->schedule_inflight : 0,
                        /* no codec given: the plan's per boundary, if it has them */
                        .wire_at = o.wire < 0 && o.wire_grad < 0 && plan ? plan->wire : NULL,
                        .error_feedback = o.error_feedback, .epochs = o.epochs, .steps = o.steps, .minibatch = o.batch,
                        .opt = oc, .seed = (uint64_t)o.seed, .data_dir = o.data, .text = o.text ? o.text : o.tokens, .threads = o.threads,
                        .timeout_s = o.timeout, .checkpoint_every = o.checkpoint_every,
                        .checkpoint_dir = o.checkpoint_dir, .keep_last = o.keep_last, .resume = o.resume,
                        .init_weights = o.init, .trace = o.trace || o.svg,
                        .progress = pd_stderr_is_tty() ? 1 : (o.progress || mpi) ? 2 : 0, .nan_check = o.nan_check,
                        .profile = have_prof ? &prof : NULL, .progress_file = o.progress_file, .eval_every = o.eval_every, .target_accuracy = o.target,
                        .no_stash = o.no_stash, .staleness = o.staleness, .staleness_warmup = o.staleness_warmup,
                        .recompute = o.recompute, .save = o.save, .precision = o.precision,
                        .fit = !o.calibrated_cluster ? RT_FIT_NONE : o.fit ? o.fit : RT_FIT_CORE_EFFICIENCY};
    if (o.calibrated && !have_prof) {
        rc = err_set(&err, PD_EINVAL, "--calibrated-profile needs --profile (the profile to calibrate)");
        goto out;
    }
    if (o.calibrated_cluster && (!have_prof || !plan)) {
        rc = err_set(&err, PD_EINVAL, "--calibrated-cluster needs --profile and a --plan (the cluster to calibrate)");
        goto out;
    }
    if (o.calibrated_cluster && o.fit != RT_FIT_LINK_RATE && plan->cluster.cores_per_machine <= 0) {
        rc = err_set(&err, PD_EINVAL, "--calibrated-cluster needs a --plan made with --cores (workers sharing a "
                     "machine's cores: the core efficiency and the wake cost are about them); --fit link-rate does not");
        goto out;
    }
    double bytes_per_token = 0;   /* token shards: a test loss per byte beside the one per token */
    if (o.tokens && rank == 0) {
        Model *lm = model_load(o.model, &err);
        if (!lm) {
            rc = err.code ? err.code : PD_EINVAL;
            goto out;
        }
        Shape in = model_input_shape(lm);
        model_free(lm);
        if (in.ndim == 1 && (rc = data_tokens_bytes_per_token(o.tokens, in.d[0], &bytes_per_token, &err))) goto out;
    }
    if ((rc = rt_train(comm, &spec, &sum, &err))) goto out;
    if (rank == 0) {   /* the run trained: its summary and outputs first, whatever the calibration does */
        TrainOutputs outs = {.metrics = o.metrics, .log_every = o.log_every, .trace = o.trace, .svg = o.svg,
                             .curve = o.curve, .bytes_per_token = bytes_per_token};
        rc = train_report(&sum, &outs, &err);
        if (!rc && o.calibrated) rc = write_calibrated(o.calibrated, &prof, plan, &sum, &err);
        if (!rc && o.calibrated_cluster) rc = write_calibrated_cluster(o.calibrated_cluster, plan, &sum, &err);
    }
out:
    rt_train_summary_release(&sum);
    if (have_prof) profile_release(&prof);
    plan_free(plan);
    if (rc) fprintf(stderr, "pipedream: error: %s\n", err.msg);
    comm_free(comm);
    return rc ? CLI_FAIL : CLI_OK;
}

/* Under mpirun a failed train ends with CLI_FAILED_LINE (launch's sign of a failure; the
 * error line before it is for people). */
int cmd_train(int argc, char **argv) {
    int rc = train_main(argc, argv);
    if (rc != CLI_OK && cli_under_mpirun()) {
        const char *r = getenv("OMPI_COMM_WORLD_RANK");
        if (!r) r = getenv("PMIX_RANK");
        if (!r) r = getenv("PMI_RANK");
        fprintf(stderr, CLI_FAILED_LINE "train rank %d exit %d\n", r ? atoi(r) : -1, rc);
    }
    return rc;
}
