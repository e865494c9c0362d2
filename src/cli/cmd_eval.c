/* cmd_eval.c: `pipedream eval MODEL.json --weights W.safetensors`: the test loss and accuracy
 * of given weights, in eval mode, with the data read and standardised as `pipedream train`
 * does (data.h, "a model's data"): Fashion-MNIST's test split (or --data DIR: IDX, CIFAR-10 or an
 * image folder) standardised with the statistics the weights file records (train --save, a
 * checkpoint), or else with the training split's; or the held-out tail of a text file (--text:
 * loss in nats per byte); or the validation shards of --tokens DIR (loss per token, and per byte
 * with DIR/tokenizer.json).
 * Weights: tools/export_torch.py, `train --save`, or any checkpoint `train` wrote
 * (rt_weights_load). Prints one JSON line on stdout. */
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "kernels.h"
#include "nn.h"
#include "runtime.h"

static void help(void) {
    printf("usage: pipedream eval MODEL.json --weights W.safetensors [options]\n\n"
           "Evaluates the weights on the test data (eval mode: batch-norm running statistics, no\n"
           "dropout) and prints one JSON line: test_loss (mean cross-entropy per target; text: nats\n"
           "per byte), test_loss_per_byte (token shards with a tokenizer.json), test_accuracy,\n"
           "samples, time_s.\n\n"
           "options:\n"
           "  --weights FILE        weights: tools/export_torch.py, train --save, or a checkpoint\n"
           "  --data DIR            images: IDX files (default %s), CIFAR-10\n"
           "                        batches or an image folder (as train --data), standardised with the\n"
           "                        mean and std the weights file records (else its training split's)\n"
           "  --text FILE           a language model on FILE's held-out tail (as train --text)\n"
           "  --tokens DIR          a language model on DIR's validation shards (as train --tokens)\n"
           "  --minibatch B         samples per forward (default 256)\n"
           "  --threads T           compute threads (default 1)\n",
           DATA_DEFAULT_IDX_DIR);
}

int cmd_eval(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        help();
        return CLI_OK;
    }
    const char *c = "eval", *model = NULL, *weights = NULL, *data = NULL, *text = NULL, *tokens = NULL;
    int batch = 256, threads = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (a[0] != '-') {
            if (model) return cli_usage_error(c, "unexpected argument \"%s\"", a);
            model = a;
            continue;
        }
        if (strcmp(a, "--weights") && strcmp(a, "--data") && strcmp(a, "--text") && strcmp(a, "--tokens") &&
            strcmp(a, "--minibatch") && strcmp(a, "--threads"))
            return cli_usage_error(c, "unknown option \"%s\"", a);
        if (!(v = cli_value(c, argc, argv, &i))) return CLI_USAGE;
        int rc = CLI_OK;
        if (!strcmp(a, "--weights")) weights = v;
        else if (!strcmp(a, "--data")) data = v;
        else if (!strcmp(a, "--text")) text = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "--minibatch")) rc = cli_parse_int(c, a, v, 1, 65536, &batch);
        else rc = cli_parse_int(c, a, v, 1, 1024, &threads);
        if (rc) return rc;
    }
    if (!model) return cli_usage_error(c, "missing MODEL.json");
    if (!weights) return cli_usage_error(c, "missing --weights FILE");
    if (!!data + !!text + !!tokens > 1) return cli_usage_error(c, "--data, --text and --tokens exclude each other");
    struct stat st;
    if (tokens && (stat(tokens, &st) != 0 || !S_ISDIR(st.st_mode)))
        return cli_usage_error(c, "--tokens %s: not a directory (of token shards)", tokens);
    if (tokens) text = tokens;   /* a directory: data_splits_open reads its shards */
    Err err = {0};
    Model *m = NULL;
    DataSplits d = {0};
    Trainer t = {0};
    float *x = NULL;
    int32_t *y = NULL;
    int ret = CLI_FAIL;
    kern_set_threads(threads);
    if (!(m = model_load(model, &err))) goto fail;
    OptConfig oc = optim_defaults(OPT_SGD, 0.0f);
    if (trainer_init(&t, m, batch, &oc, 1, &err)) goto fail;
    RtCkpt w = {.params = t.w, .state = t.state};
    if (rt_weights_load(weights, m, &w, &err)) goto fail;
    /* the statistics the weights were trained with; without them, the training split's */
    DataFit fit = {model_name(m), model_input_shape(m), model_layer_out_shape(m, model_n_layers(m) - 1)};
    int recorded = isfinite(w.data_mean);
    if (data_splits_open(data, text, &fit, !recorded && !text, &d, &err)) goto fail;
    if (data_splits_standardise(&d, recorded ? w.data_mean : d.mean, recorded ? w.data_std : d.std, &err)) goto fail;
    size_t in_numel = data_sample_numel(&d.test);
    int targets = data_targets(&d.test);
    x = pd_alloc_f32((size_t)batch * in_numel);
    y = pd_alloc((size_t)batch * (size_t)targets * sizeof(int32_t));
    double t0 = pd_now(), sl = 0;
    long hits = 0;
    for (size_t i = 0; i < d.test.n; i += (size_t)batch) {
        int cnt = (int)(d.test.n - i < (size_t)batch ? d.test.n - i : (size_t)batch), correct = 0;
        data_batch(&d.test, NULL, i, cnt, x, y);
        sl += (double)trainer_eval(&t, x, y, cnt, &correct) * cnt;
        hits += correct;
    }
    double loss = sl / (double)d.test.n, acc = (double)hits / ((double)d.test.n * targets), bpt = 0;
    if (tokens && data_tokens_bytes_per_token(tokens, fit.input.d[0], &bpt, &err)) goto fail;
    char per_byte[64] = "";
    if (bpt > 0) snprintf(per_byte, sizeof per_byte, ", \"test_loss_per_byte\": %.8g", loss / bpt);
    printf("{\"model\": \"%s\", \"test_loss\": %.8g%s, \"test_accuracy\": %.6f, \"samples\": %zu, "
           "\"time_s\": %.3f}\n",
           model_name(m), loss, per_byte, acc, d.test.n, pd_now() - t0);
    ret = CLI_OK;
    goto done;
fail:
    ret = cli_fail(&err);
done:
    pd_free(x);
    pd_free(y);
    trainer_release(&t);
    data_splits_release(&d);
    model_free(m);
    return ret;
}
