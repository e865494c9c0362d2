/* train_data.c: images or text for one-worker training and evaluation (train_data.h). */
#include "train_data.h"

#include <string.h>

int train_data_open(TrainData *d, const Model *m, const char *dir, const char *text, int want_train, int batch,
                    uint64_t seed, Err *err) {
    memset(d, 0, sizeof *d);
    Shape in = model_input_shape(m);
    int classes, pos = model_loss_positions(m, &classes), rc;
    char a[64], b[64];
    if (text) {
        d->text = 1;
        if (in.ndim != 1 || pos != in.d[0] || classes < 256)
            return err_set(err, PD_EINVAL, "%s: a text model takes (T) byte tokens and gives (T, 256) logits; this "
                           "one maps %s to %s", model_name(m), shape_str(in, a, sizeof a),
                           shape_str(model_layer_out_shape(m, model_n_layers(m) - 1), b, sizeof b));
        if ((rc = data_text_load(text, in.d[0], DATA_TEXT_TEST_FRACTION, &d->txt, err))) return rc;
        d->in_numel = (size_t)in.d[0];
        d->targets = in.d[0];
        d->n_train = d->txt.n_train;
        d->n_test = d->txt.n_test;
        if (want_train) {
            if ((rc = data_text_sampler_init(&d->ts, &d->txt, batch, seed, err))) goto fail;
            d->n_batches = d->ts.n_batches;
        }
        return PD_OK;
    }
    if (want_train && (rc = data_load_idx(dir, "train", &d->tr, err))) goto fail;
    if ((rc = data_load_idx(dir, "test", &d->te, err))) goto fail;
    data_normalize(&d->tr, DATA_FMNIST_MEAN, DATA_FMNIST_STD);
    data_normalize(&d->te, DATA_FMNIST_MEAN, DATA_FMNIST_STD);
    Shape ds = shape3(d->te.c, d->te.h, d->te.w);
    if (!shape_eq(in, ds)) {
        rc = err_set(err, PD_EINVAL, "%s: input %s does not match the data's samples %s", model_name(m),
                     shape_str(in, a, sizeof a), shape_str(ds, b, sizeof b));
        goto fail;
    }
    if (pos != 1 || classes < d->te.n_classes) {
        rc = err_set(err, PD_EINVAL, "%s: output %s for %d classes", model_name(m),
                     shape_str(model_layer_out_shape(m, model_n_layers(m) - 1), a, sizeof a), d->te.n_classes);
        goto fail;
    }
    d->in_numel = data_sample_numel(&d->te);
    d->targets = 1;
    d->n_train = d->tr.n;
    d->n_test = d->te.n;
    if (want_train) {
        if ((rc = data_sampler_init(&d->s, &d->tr, batch, seed, 1, 0, err))) goto fail;
        d->n_batches = d->s.n_batches;
    }
    return PD_OK;
fail:
    train_data_close(d);
    return rc;
}

void train_data_close(TrainData *d) {
    data_sampler_release(&d->s);
    data_text_sampler_release(&d->ts);
    data_release(&d->tr);
    data_release(&d->te);
    data_text_release(&d->txt);
    memset(d, 0, sizeof *d);
}

int train_data_get(TrainData *d, uint64_t g, float *x, int32_t *y) {
    return d->text ? data_text_sampler_get(&d->ts, g, x, y) : data_sampler_get(&d->s, g, x, y);
}

void train_data_evaluate(TrainData *d, Trainer *t, float *x, int32_t *y, double *loss, double *acc) {
    double sl = 0;
    long hits = 0;
    for (size_t i = 0; i < d->n_test; i += (size_t)t->n_max) {
        int cnt = (int)(d->n_test - i < (size_t)t->n_max ? d->n_test - i : (size_t)t->n_max);
        int correct = 0;
        if (d->text) data_text_batch(&d->txt, 1, NULL, i, cnt, x, y);
        else data_batch(&d->te, NULL, i, cnt, x, y);
        sl += (double)trainer_eval(t, x, y, cnt, &correct) * cnt;
        hits += correct;
    }
    *loss = sl / (double)d->n_test;
    *acc = (double)hits / ((double)d->n_test * d->targets);
}
