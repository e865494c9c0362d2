/* fuzz_cifar.c: the CIFAR-10 binary reader (src/data, data_load_cifar10, split "test" =
 * test_batch.bin) on arbitrary files. */
#include "fuzz_util.h"

#include "data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
    const char *dir = fuzz_dir("cifar");
    fuzz_write(dir, "test_batch.bin", data, len);
    Dataset d;
    Err err = {0};
    if (data_load_cifar10(dir, "test", &d, &err) == PD_OK) {
        if (d.n * 3073 != len) abort();
        for (size_t i = 0; i < d.n; i++)
            if (d.y[i] < 0 || d.y[i] > 9) abort();
        data_release(&d);
    }
    return 0;
}
