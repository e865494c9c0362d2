/* fuzz_idx.c: the IDX reader (src/data, data_load_idx) on arbitrary files. Input: byte 0
 * chooses which file is fuzzed and whether it is gzip-named (bit 0: images, else labels;
 * bit 1: written as *.gz, so zlib decodes it); the rest is that file. The other file of the
 * pair is a small valid one (3 samples of 2x2), so the fuzzed file is read to the end. */
#include "fuzz_util.h"

#include "data.h"

static const uint8_t IMAGES[] = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 2, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
static const uint8_t LABELS[] = {0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 9};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    pd_log_set_level(LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
    if (len < 1) return 0;
    const char *dir = fuzz_dir("idx");
    int images = data[0] & 1, gz = (data[0] >> 1) & 1;
    static const char *names[4] = {"train-images-idx3-ubyte", "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte",
                                   "train-labels-idx1-ubyte.gz"};
    for (int i = 0; i < 4; i++) fuzz_unlink(dir, names[i]);
    if (images) {
        fuzz_write(dir, names[gz], data + 1, len - 1);
        fuzz_write(dir, names[2], LABELS, sizeof LABELS);
    } else {
        fuzz_write(dir, names[0], IMAGES, sizeof IMAGES);
        fuzz_write(dir, names[2 + gz], data + 1, len - 1);
    }
    Dataset d;
    Err err = {0};
    if (data_load_idx(dir, "train", &d, &err) == PD_OK) {
        /* what the contract promises: labels in range, pixels in [0, 1] */
        for (size_t i = 0; i < d.n; i++)
            if (d.y[i] < 0 || d.y[i] >= d.n_classes) abort();
        for (size_t i = 0; i < d.n * data_sample_numel(&d); i++)
            if (!(data_value(&d, i) >= 0.0f && data_value(&d, i) <= 1.0f)) abort();
        data_release(&d);
    }
    return 0;
}
