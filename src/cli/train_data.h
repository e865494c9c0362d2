/* train_data.h: the data of one-worker `pipedream train` and `pipedream eval`: an IDX image
 * dataset (Fashion-MNIST by default), standardised with Fashion-MNIST's mean and std exactly as
 * training does, or a plain-text file (--text) read as byte tokens in sequences of the model's
 * context length with a held-out tail (data.h "text"). One interface for both: training
 * minibatch g, and the eval-mode loss and accuracy over the test split (text: the tail; the
 * loss is then in nats per byte, the accuracy that of next-byte prediction). */
#ifndef PD_TRAIN_DATA_H
#define PD_TRAIN_DATA_H

#include "data.h"
#include "nn.h"

typedef struct TrainData {
    int text;
    Dataset tr, te;         /* images (tr empty unless training) */
    TextData txt;
    DataSampler s;
    TextSampler ts;
    size_t in_numel;        /* floats per input sample */
    int targets;            /* targets per sample: 1, or T for text */
    size_t n_train, n_test; /* samples (text: sequences) */
    uint64_t n_batches;     /* training minibatches per epoch (0 without training data) */
} TrainData;

/* Loads the data for model m: text != NULL reads that file (the model's input must be (T), its
 * output (T, >= 256)), else the IDX dataset in dir (NULL = the default), its "train" split only
 * if want_train; checks the model's input and output against the data. batch and seed set up
 * the training sampler (shuffled, last partial batch kept). */
int  train_data_open(TrainData *d, const Model *m, const char *dir, const char *text, int want_train, int batch,
                     uint64_t seed, Err *err);
void train_data_close(TrainData *d);
/* Training minibatch g into x (batch, input) and y (batch, targets); returns its sample count. */
int  train_data_get(TrainData *d, uint64_t g, float *x, int32_t *y);
/* Eval-mode mean loss per target and accuracy over the whole test split, in minibatches of
 * t->n_max (x, y sized for them). */
void train_data_evaluate(TrainData *d, Trainer *t, float *x, int32_t *y, double *loss, double *acc);

#endif
