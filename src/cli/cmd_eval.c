/* cmd_eval.c: `pipedream eval MODEL.json --weights W.safetensors`: the test loss and accuracy
 * of given weights, in eval mode, with the data standardised exactly as `pipedream train` does
 * (train_data.c): Fashion-MNIST's test split (or --data DIR), or the held-out tail of a text
 * file (--text: loss in nats per byte). Weights: tools/export_torch.py, `train --save`, or any
 * checkpoint `train` wrote (weights.h). Prints one JSON line on stdout. */
#include <string.h>

#include "cli.h"
#include "kernels.h"
#include "nn.h"
#include "train_data.h"
#include "weights.h"

static void help(void) {
    printf("usage: pipedream eval MODEL.json --weights W.safetensors [options]\n\n"
           "Evaluates the weights on the test data (eval mode: batch-norm running statistics, no\n"
           "dropout) and prints one JSON line: test_loss (mean cross-entropy per target; text: nats\n"
           "per byte), test_accuracy, samples, time_s.\n\n"
           "options:\n"
           "  --weights FILE        weights: tools/export_torch.py, train --save, or a checkpoint\n"
           "  --data DIR            IDX dataset directory (default %s)\n"
           "  --text FILE           a language model on FILE's held-out tail (as train --text)\n"
           "  --minibatch B         samples per forward (default 256)\n"
           "  --threads T           compute threads (default 1)\n",
           DATA_DEFAULT_IDX_DIR);
}

int cmd_eval(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        help();
        return CLI_OK;
    }
    const char *c = "eval", *model = NULL, *weights = NULL, *data = NULL, *text = NULL;
    int batch = 256, threads = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (a[0] != '-') {
            if (model) return cli_usage_error(c, "unexpected argument \"%s\"", a);
            model = a;
            continue;
        }
        if (strcmp(a, "--weights") && strcmp(a, "--data") && strcmp(a, "--text") && strcmp(a, "--minibatch") &&
            strcmp(a, "--threads"))
            return cli_usage_error(c, "unknown option \"%s\"", a);
        if (!(v = cli_value(c, argc, argv, &i))) return CLI_USAGE;
        int rc = CLI_OK;
        if (!strcmp(a, "--weights")) weights = v;
        else if (!strcmp(a, "--data")) data = v;
        else if (!strcmp(a, "--text")) text = v;
        else if (!strcmp(a, "--minibatch")) rc = cli_parse_int(c, a, v, 1, 65536, &batch);
        else rc = cli_parse_int(c, a, v, 1, 1024, &threads);
        if (rc) return rc;
    }
    if (!model) return cli_usage_error(c, "missing MODEL.json");
    if (!weights) return cli_usage_error(c, "missing --weights FILE");
    if (data && text) return cli_usage_error(c, "--data and --text exclude each other");
    Err err = {0};
    Model *m = NULL;
    TrainData d = {0};
    Trainer t = {0};
    float *x = NULL;
    int32_t *y = NULL;
    int ret = CLI_FAIL;
    kern_set_threads(threads);
    if (!(m = model_load(model, &err))) goto fail;
    if (train_data_open(&d, m, data, text, 0, batch, 1, &err)) goto fail;
    OptConfig oc = optim_defaults(OPT_SGD, 0.0f);
    if (trainer_init(&t, m, batch, &oc, 1, &err)) goto fail;
    if (weights_load(weights, m, t.w, t.state, &err)) goto fail;
    x = pd_alloc_f32((size_t)batch * d.in_numel);
    y = pd_alloc((size_t)batch * d.targets * sizeof(int32_t));
    double t0 = pd_now(), loss, acc;
    train_data_evaluate(&d, &t, x, y, &loss, &acc);
    printf("{\"model\": \"%s\", \"test_loss\": %.8g, \"test_accuracy\": %.6f, \"samples\": %zu, "
           "\"time_s\": %.3f}\n",
           model_name(m), loss, acc, d.n_test, pd_now() - t0);
    ret = CLI_OK;
    goto done;
fail:
    ret = cli_fail(&err);
done:
    pd_free(x);
    pd_free(y);
    trainer_release(&t);
    train_data_close(&d);
    model_free(m);
    return ret;
}
