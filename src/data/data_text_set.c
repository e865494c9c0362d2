/* data_text_set.c: a text split as an ordinary Dataset (data.h), so that code written for
 * datasets (samplers, sharding, the pipeline runtime's input stage and evaluation) reads
 * language-model data unchanged: sample i is sequence i, x (1, 1, T) token ids as floats,
 * y (T) next-token targets (y_len = T), n_classes 256. */
#include <string.h>

#include "data.h"

int data_text_dataset(const TextData *t, int test, Dataset *out, Err *err) {
    memset(out, 0, sizeof *out);
    size_t n = test ? t->n_test : t->n_train;
    int T = t->ctx;
    if (n == 0) return err_set(err, PD_EINVAL, "the text's %s part holds no sequence of %d bytes", test ? "held-out" : "training", T);
    out->x = pd_alloc(n * (size_t)T * sizeof(float));
    out->y = pd_alloc(n * (size_t)T * sizeof(int32_t));
    out->n = n, out->c = 1, out->h = 1, out->w = T, out->n_classes = 256, out->y_len = T;
    data_text_batch(t, test, NULL, 0, (int)n, out->x, out->y);
    return PD_OK;
}
