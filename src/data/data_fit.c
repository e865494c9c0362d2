/* data_fit.c: a model's data (data.h, "a model's data"): the IDX images or the text `train`,
 * `eval` and a training session read, checked against the model, and the training split's
 * statistics the images are standardised with. */
#include <math.h>
#include <string.h>

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

int data_splits_open(const char *dir, const char *text, const DataFit *fit, int want_train, DataSplits *out,
                     Err *err) {
    memset(out, 0, sizeof *out);
    out->mean = out->std = NAN;
    int rc;
    if (text) {
        out->text = 1;
        if ((rc = data_fit_check(fit, 1, NULL, err))) return rc;
        TextData txt;
        if ((rc = data_text_load(text, fit->input.d[0], DATA_TEXT_TEST_FRACTION, &txt, err))) return rc;
        if (want_train) rc = data_text_dataset(&txt, 0, &out->train, err);
        if (!rc) rc = data_text_dataset(&txt, 1, &out->test, err);
        data_text_release(&txt);
    } else {
        if (want_train) rc = data_load_idx(dir, "train", &out->train, err);
        else rc = PD_OK;
        if (!rc) rc = data_load_idx(dir, "test", &out->test, err);
        if (!rc) rc = data_fit_check(fit, 0, &out->test, err);
        if (!rc && want_train) data_stats(&out->train, &out->mean, &out->std);
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
