/* data_fit.c: a model's data (data.h, "a model's data"): the images (IDX, CIFAR-10, an image
 * folder), the text or the token shards `train`, `eval` and a training session read, checked
 * against the model, and the training split's statistics the images are standardised with. */
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "data.h"

void data_stats(const Dataset *d, double *mean, double *std) {
    size_t n = d->n * data_sample_numel(d);
    double s = 0, q = 0;
    for (size_t i = 0; i < n; i++) s += data_value(d, i);
    double m = n ? s / (double)n : 0;
    for (size_t i = 0; i < n; i++) {
        double e = data_value(d, i) - m;
        q += e * e;
    }
    double sd = n ? sqrt(q / (double)n) : 0;
    *mean = round(m * 1e4) / 1e4;
    *std = round(sd * 1e4) / 1e4;
}

/* The positions of the loss per sample and the classes of the model's output. */
static int out_positions(Shape out, int *classes) {
    *classes = out.ndim ? out.d[out.ndim - 1] : 0;
    return *classes > 0 ? (int)(shape_numel(out) / (size_t)*classes) : 0;
}

int data_fit_check(const DataFit *fit, int text, const Dataset *d, Err *err) {
    char a[64], b[64];
    int classes, pos = out_positions(fit->output, &classes);
    if (text && d) {   /* token shards */
        if (fit->input.ndim != 1 || pos != fit->input.d[0])
            return err_set(err, PD_EINVAL, "%s: a language model takes (T) tokens and gives (T, vocab) logits; this "
                           "one maps %s to %s", fit->model, shape_str(fit->input, a, sizeof a),
                           shape_str(fit->output, b, sizeof b));
        if (classes < d->n_classes)
            return err_set(err, PD_EINVAL, "%s: output %s has a vocabulary of %d, but the token shards hold token %d: "
                           "the model's vocabulary must be at least %d (its embed's \"vocab\" and its last layer's "
                           "outputs)", fit->model, shape_str(fit->output, a, sizeof a), classes, d->n_classes - 1,
                           d->n_classes);
        return PD_OK;
    }
    if (text) {
        if (fit->input.ndim != 1 || pos != fit->input.d[0] || classes < 256)
            return err_set(err, PD_EINVAL, "%s: a text model takes (T) byte tokens and gives (T, 256) logits; this "
                           "one maps %s to %s", fit->model, shape_str(fit->input, a, sizeof a),
                           shape_str(fit->output, b, sizeof b));
        return PD_OK;
    }
    Shape ds = shape3(d->c, d->h, d->w);
    if (!shape_eq(fit->input, ds))
        return err_set(err, PD_EINVAL, "%s: input %s does not match the data's samples %s", fit->model,
                       shape_str(fit->input, a, sizeof a), shape_str(ds, b, sizeof b));
    if (pos != 1 || classes < d->n_classes)
        return err_set(err, PD_EINVAL, "%s: output %s for %d classes", fit->model, shape_str(fit->output, a, sizeof a),
                       d->n_classes);
    return PD_OK;
}

static DataAugment g_augment;   /* data_splits_set_augment's; zero: none */

void data_splits_set_augment(const DataAugment *a) { g_augment = a ? *a : (DataAugment){0}; }

/* One split of the image set in dir, of the kind data_dir_kind tells. */
static int image_split(const char *dir, const char *split, const DataFit *fit, Dataset *out, Err *err) {
    const char *kind = data_dir_kind(dir);
    if (!strcmp(kind, "cifar10")) return data_load_cifar10(dir, split, out, err);
    if (strcmp(kind, "folder")) return data_load_idx(dir, split, out, err);
    char a[64];
    if (fit->input.ndim != 3 || (fit->input.d[0] != 1 && fit->input.d[0] != 3))
        return err_set(err, PD_EINVAL, "%s: input %s: an image folder feeds (1 or 3, H, W) images", fit->model,
                       shape_str(fit->input, a, sizeof a));
    int cached = 0;
    double t0 = pd_now();
    int rc = data_load_folder(dir, split, fit->input.d[0], fit->input.d[1], fit->input.d[2], out, &cached, err);
    if (!rc)
        pd_log(LOG_INFO, "%s/%s: %zu images of %d classes %s in %.3f s", dir, split, out->n, out->n_classes,
               cached ? "read from the decode cache" : "decoded", pd_now() - t0);
    return rc;
}

/* Token shards: both splits, checked against the model with the larger vocabulary of the two. */
static int token_splits(const char *dir, const DataFit *fit, int want_train, DataSplits *out, Err *err) {
    char a[64], b[64];
    if (fit->input.ndim != 1 || fit->output.ndim < 1)
        return err_set(err, PD_EINVAL, "%s: a language model takes (T) tokens and gives (T, vocab) logits; this one "
                       "maps %s to %s", fit->model, shape_str(fit->input, a, sizeof a),
                       shape_str(fit->output, b, sizeof b));
    int T = fit->input.d[0], rc;
    if (want_train && (rc = data_tokens_dataset(dir, "train", T, &out->train, err))) return rc;
    if ((rc = data_tokens_dataset(dir, "val", T, &out->test, err))) return rc;
    Dataset v = {.n_classes = out->test.n_classes > out->train.n_classes ? out->test.n_classes : out->train.n_classes};
    if ((rc = data_fit_check(fit, 1, &v, err))) return rc;
    int classes = fit->output.d[fit->output.ndim - 1];
    out->train.n_classes = out->test.n_classes = classes;   /* the model's vocabulary */
    return PD_OK;
}

int data_splits_open(const char *dir, const char *text, const DataFit *fit, int want_train, DataSplits *out,
                     Err *err) {
    memset(out, 0, sizeof *out);
    out->mean = out->std = NAN;
    int rc;
    struct stat st;
    if (text && stat(text, &st) == 0 && S_ISDIR(st.st_mode)) {
        out->text = 1;
        rc = token_splits(text, fit, want_train, out, err);
    } else if (text) {
        out->text = 1;
        if ((rc = data_fit_check(fit, 1, NULL, err))) return rc;
        TextData txt;
        if ((rc = data_text_load(text, fit->input.d[0], DATA_TEXT_TEST_FRACTION, &txt, err))) return rc;
        if (want_train) rc = data_text_dataset(&txt, 0, &out->train, err);
        if (!rc) rc = data_text_dataset(&txt, 1, &out->test, err);
        data_text_release(&txt);
    } else {
        if (want_train) rc = image_split(dir, "train", fit, &out->train, err);
        else rc = PD_OK;
        if (!rc) rc = image_split(dir, "test", fit, &out->test, err);
        if (!rc) rc = data_fit_check(fit, 0, &out->test, err);
        if (!rc && want_train) data_stats(&out->train, &out->mean, &out->std);
        if (!rc && want_train) out->train.aug = g_augment;
    }
    if (rc) data_splits_release(out);
    return rc;
}

int data_splits_standardise(DataSplits *d, double mean, double std, Err *err) {
    if (d->text) return PD_OK;
    if (!(std > 0) || !isfinite(mean))
        return err_set(err, PD_EINVAL, "cannot standardise with mean %g and std %g (an image set of one value?)", mean,
                       std);
    data_normalize(&d->train, (float)mean, (float)std);
    data_normalize(&d->test, (float)mean, (float)std);
    d->mean = mean, d->std = std;
    return PD_OK;
}

void data_splits_release(DataSplits *d) {
    if (!d) return;
    data_release(&d->train);
    data_release(&d->test);
    memset(d, 0, sizeof *d);
}
