/* cmd_train.c: `pipedream train MODEL.json`: one-worker training (no pipeline) on
 * Fashion-MNIST (or any IDX dataset) or, with --text, a plain-text file read as byte tokens
 * (language models: the loss over every position, test_loss in nats per byte on the held-out
 * tail): minibatch SGD/Adam, test-set evaluation after each epoch, metrics as JSON lines, a
 * one-line JSON summary on stdout; --init starts from a weights file, --save writes one.
 * Pipelined training is the runtime's; this is its single-worker reference and the quickest
 * way to train a model. Data: train_data.c; weights files: weights.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "data.h"
#include "kernels.h"
#include "nn.h"
#include "train_data.h"
#include "weights.h"

/* CPU seconds of this process (all threads): throughput on a shared machine. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void help(void) {
    printf("usage: pipedream train MODEL.json [options]\n\n"
           "Trains MODEL.json on one worker and prints a JSON summary line on stdout: steps, epochs,\n"
           "final_loss (mean training loss of the last --log-every steps), test_loss and\n"
           "test_accuracy (eval mode, after the last step; text: nats per byte), samples_per_s\n"
           "(training steps only; samples_per_cpu_s: per CPU second of this process).\n"
           "A progress line goes to stderr when it is a terminal.\n\n"
           "options:\n"
           "  --data DIR            IDX dataset directory (default %s)\n"
           "  --text FILE           train a language model on FILE's bytes (the last 5%% held out)\n"
           "  --init W.safetensors  start from these weights (tools/export_torch.py, --save, a checkpoint)\n"
           "  --save W.safetensors  write the final weights (and batch-norm state)\n"
           "  --epochs N            passes over the training set (default 1)\n"
           "  --steps N             train exactly N minibatches instead of whole epochs\n"
           "  --minibatch B         samples per minibatch (default 64)\n"
           "  --lr X                learning rate (default 0.01)\n"
           "  --momentum M          SGD momentum (default 0.9)\n"
           "  --weight-decay W      L2 weight decay (default 0)\n"
           "  --optimizer sgd|adam  (default sgd)\n"
           "  --threads T           compute threads (default 1)\n"
           "  --seed S              weight init, data order and dropout seed (default 1)\n"
           "  --metrics FILE.jsonl  write one JSON object per logged step and per epoch\n"
           "  --log-every N         steps between metrics lines (default 50)\n",
           DATA_DEFAULT_IDX_DIR);
}

typedef struct TrainOpts {
    const char *model, *data, *metrics, *text, *init, *save;
    int epochs, steps, batch, threads, seed, log_every;
    double lr, momentum, wd;
    int opt;
} TrainOpts;

static int parse(int argc, char **argv, TrainOpts *o) {
    const char *c = "train";
    *o = (TrainOpts){.epochs = 1, .batch = 64, .threads = 1, .seed = 1, .log_every = 50, .lr = 0.01, .momentum = 0.9,
                     .opt = OPT_SGD};
    int have_epochs = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int rc = CLI_OK;
        if (a[0] != '-') {
            if (o->model) return cli_usage_error(c, "unexpected argument \"%s\"", a);
            o->model = a;
            continue;
        }
        if (!strcmp(a, "--data") || !strcmp(a, "--metrics") || !strcmp(a, "--optimizer") || !strcmp(a, "--epochs") ||
            !strcmp(a, "--steps") || !strcmp(a, "--minibatch") || !strcmp(a, "--lr") || !strcmp(a, "--momentum") ||
            !strcmp(a, "--weight-decay") || !strcmp(a, "--threads") || !strcmp(a, "--seed") ||
            !strcmp(a, "--log-every") || !strcmp(a, "--text") || !strcmp(a, "--init") || !strcmp(a, "--save")) {
            if (!(v = cli_value(c, argc, argv, &i))) return CLI_USAGE;
        } else {
            return cli_usage_error(c, "unknown option \"%s\"", a);
        }
        if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--text")) o->text = v;
        else if (!strcmp(a, "--init")) o->init = v;
        else if (!strcmp(a, "--save")) o->save = v;
        else if (!strcmp(a, "--metrics")) o->metrics = v;
        else if (!strcmp(a, "--optimizer")) {
            o->opt = optim_kind_parse(v);
            if (o->opt < 0) return cli_usage_error(c, "--optimizer expects sgd or adam, got \"%s\"", v);
        } else if (!strcmp(a, "--epochs")) {
            rc = cli_parse_int(c, a, v, 1, 100000, &o->epochs);
            have_epochs = 1;
        } else if (!strcmp(a, "--steps")) rc = cli_parse_int(c, a, v, 1, 1000000000, &o->steps);
        else if (!strcmp(a, "--minibatch")) rc = cli_parse_int(c, a, v, 1, 65536, &o->batch);
        else if (!strcmp(a, "--threads")) rc = cli_parse_int(c, a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "--seed")) rc = cli_parse_int(c, a, v, 0, 2147483647, &o->seed);
        else if (!strcmp(a, "--log-every")) rc = cli_parse_int(c, a, v, 1, 1000000000, &o->log_every);
        else if (!strcmp(a, "--lr")) rc = cli_parse_double(c, a, v, 0, 100, &o->lr);
        else if (!strcmp(a, "--momentum")) rc = cli_parse_double(c, a, v, 0, 0.999999, &o->momentum);
        else if (!strcmp(a, "--weight-decay")) rc = cli_parse_double(c, a, v, 0, 10, &o->wd);
        if (rc) return rc;
    }
    if (!o->model) return cli_usage_error(c, "missing MODEL.json");
    if (have_epochs && o->steps) return cli_usage_error(c, "--epochs and --steps exclude each other");
    return CLI_OK;
}

int cmd_train(int argc, char **argv) {
    /* Pipelined training (cmd_train_pipe.c): a plan, several workers, or under mpirun. */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--plan") || !strcmp(argv[i], "--workers") || !strcmp(argv[i], "--schedule"))
            return cmd_train_pipelined(argc, argv);
    if (cli_under_mpirun()) return cmd_train_pipelined(argc, argv);
    if (cli_wants_help(argc, argv)) {
        help();
        return CLI_OK;
    }
    TrainOpts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    Err err = {0};
    TrainData d = {0};
    Model *m = NULL;
    Trainer t = {0};
    FILE *mf = NULL;
    float *x = NULL;
    int32_t *y = NULL;
    int ret = CLI_FAIL;
    kern_set_threads(o.threads);
    if (!(m = model_load(o.model, &err))) goto fail;
    if (train_data_open(&d, m, o.data, o.text, 1, o.batch, (uint64_t)o.seed, &err)) goto fail;
    OptConfig oc = optim_defaults((OptKind)o.opt, (float)o.lr);
    oc.momentum = (float)o.momentum;
    oc.weight_decay = (float)o.wd;
    if (trainer_init(&t, m, o.batch, &oc, (uint64_t)o.seed, &err)) goto fail;
    if (o.init && weights_load(o.init, m, t.w, t.state, &err)) goto fail;
    if (o.metrics && !(mf = fopen(o.metrics, "w"))) {
        err_set(&err, PD_EIO, "%s: cannot open for writing", o.metrics);
        goto fail;
    }
    x = pd_alloc_f32((size_t)o.batch * d.in_numel);
    y = pd_alloc((size_t)o.batch * d.targets * sizeof(int32_t));
    uint64_t nb = d.n_batches, total = o.steps ? (uint64_t)o.steps : (uint64_t)o.epochs * nb;
    int tty = pd_stderr_is_tty();
    double t_train = 0, t_cpu = 0, win_loss = 0, last_loss = NAN, test_loss = NAN, test_acc = NAN;
    long win_n = 0, samples = 0, win_hits = 0, win_samples = 0;
    int epochs_done = 0;
    for (uint64_t g = 0; g < total; g++) {
        int cnt = train_data_get(&d, g, x, y), correct = 0;
        double t0 = pd_now(), c0 = cpu_now();
        float loss = trainer_step(&t, x, y, cnt, g, &correct);
        t_train += pd_now() - t0;
        t_cpu += cpu_now() - c0;
        if (!isfinite(loss)) {
            err_set(&err, PD_EINVAL, "loss is %g at step %llu (learning rate too high?)", (double)loss,
                    (unsigned long long)g + 1);
            goto fail;
        }
        samples += cnt;
        win_loss += loss;
        win_n++;
        win_hits += correct;
        win_samples += cnt * d.targets;
        uint64_t epoch = g / nb;
        int end_epoch = (g + 1) % nb == 0 || g + 1 == total;
        if ((g + 1) % (uint64_t)o.log_every == 0 || g + 1 == total) {
            last_loss = win_loss / win_n;
            double sps = samples / t_train;
            if (mf)
                fprintf(mf, "{\"type\": \"step\", \"step\": %llu, \"epoch\": %llu, \"loss\": %.6g, \"accuracy\": %.4f, "
                            "\"samples_per_s\": %.1f, \"time_s\": %.3f}\n",
                        (unsigned long long)g + 1, (unsigned long long)epoch, last_loss,
                        (double)win_hits / win_samples, sps, t_train);
            if (tty) {
                double eta = (double)(total - g - 1) * o.batch / sps;
                fprintf(stderr, "\repoch %llu step %llu/%llu loss %.4f %.0f samples/s ETA %.0fs   ",
                        (unsigned long long)epoch + 1, (unsigned long long)g + 1, (unsigned long long)total,
                        last_loss, sps, eta);
                fflush(stderr);
            }
            win_loss = 0;
            win_n = 0;
            win_hits = win_samples = 0;
        }
        if (end_epoch) {
            train_data_evaluate(&d, &t, x, y, &test_loss, &test_acc);
            epochs_done += (g + 1) % nb == 0;
            if (mf)
                fprintf(mf, "{\"type\": \"epoch\", \"epoch\": %llu, \"step\": %llu, \"test_loss\": %.6g, "
                            "\"test_accuracy\": %.4f, \"time_s\": %.3f}\n",
                        (unsigned long long)epoch, (unsigned long long)g + 1, test_loss, test_acc, t_train);
            if (tty) fprintf(stderr, "\repoch %llu: test accuracy %.4f, test loss %.4f%30s\n", (unsigned long long)epoch + 1,
                             test_acc, test_loss, "");
        }
    }
    printf("{\"model\": \"%s\", \"steps\": %llu, \"epochs\": %d, \"minibatch\": %d, \"threads\": %d, "
           "\"optimizer\": \"%s\", \"lr\": %g, \"final_loss\": %.6g, \"test_loss\": %.6g, \"test_accuracy\": %.4f, "
           "\"samples_per_s\": %.1f, \"train_time_s\": %.3f, \"samples_per_cpu_s\": %.1f}\n",
           model_name(m), (unsigned long long)total, epochs_done, o.batch, o.threads, o.opt == OPT_SGD ? "sgd" : "adam",
           o.lr, last_loss, test_loss, test_acc, samples / t_train, t_train, samples / t_cpu);
    if (o.save && weights_save(o.save, m, t.w, t.state, &err)) goto fail;
    ret = CLI_OK;
    goto done;
fail:
    ret = cli_fail(&err);
done:
    if (mf && fclose(mf) != 0 && ret == CLI_OK) {
        err_set(&err, PD_EIO, "%s: write failed", o.metrics);
        ret = cli_fail(&err);
    }
    pd_free(x);
    pd_free(y);
    train_data_close(&d);
    trainer_release(&t);
    model_free(m);
    return ret;
}
