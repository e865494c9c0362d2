/* data_cifar.c: the CIFAR-10 binary reader ("CIFAR-10 binary version" of
 * https://www.cs.toronto.edu/~kriz/cifar.html): each file is records of 1 label byte
 * (0..9) and 3072 pixel bytes, 1024 red then 1024 green then 1024 blue, each 32 x 32
 * row-major: already (C, H, W). The files' sizes are known before reading, so the one
 * allocation is bounded by what is on disk.
 * Not here: CIFAR-100 (2 label bytes), the Python pickle version. */
#include "data.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#define CIFAR_PIXELS 3072
#define CIFAR_RECORD (1 + CIFAR_PIXELS)
#define CIFAR_MAX_FILES 5

int data_load_cifar10(const char *dir, const char *split, Dataset *out, Err *err) {
    memset(out, 0, sizeof *out);
    if (!dir) return err_set(err, PD_EINVAL, "cifar10: no directory given");
    char paths[CIFAR_MAX_FILES][4096];
    int n_files;
    if (split && !strcmp(split, "train")) {
        n_files = 5;
        for (int i = 0; i < n_files; i++)
            if ((size_t)snprintf(paths[i], sizeof paths[i], "%s/data_batch_%d.bin", dir, i + 1) >= sizeof paths[i])
                return err_set(err, PD_EINVAL, "%s: path too long", dir);
    } else if (split && !strcmp(split, "test")) {
        n_files = 1;
        if ((size_t)snprintf(paths[0], sizeof paths[0], "%s/test_batch.bin", dir) >= sizeof paths[0])
            return err_set(err, PD_EINVAL, "%s: path too long", dir);
    } else {
        return err_set(err, PD_EINVAL, "unknown split \"%s\" (expected train or test)", split ? split : "(null)");
    }

    /* Sizes first: every file must be a non-zero whole number of records. */
    size_t records[CIFAR_MAX_FILES], n = 0;
    for (int i = 0; i < n_files; i++) {
        struct stat st;
        if (stat(paths[i], &st) != 0) return err_set(err, PD_EIO, "%s: cannot open: %s", paths[i], strerror(errno));
        if (!S_ISREG(st.st_mode)) return err_set(err, PD_EIO, "%s: not a regular file", paths[i]);
        size_t sz = (size_t)st.st_size;
        if (sz == 0 || sz % CIFAR_RECORD != 0)
            return err_set(err, PD_EINVAL,
                           "%s: size %zu bytes is not a non-zero multiple of the %d-byte record (1 label + %d "
                           "pixels): %zu records and %zu bytes left over",
                           paths[i], sz, CIFAR_RECORD, CIFAR_PIXELS, sz / CIFAR_RECORD, sz % CIFAR_RECORD);
        records[i] = sz / CIFAR_RECORD;
        n += records[i];
    }
    if (n > DATA_MAX_SAMPLES)
        return err_set(err, PD_EINVAL, "%s: %zu records in all, more than the %u allowed", dir, n, DATA_MAX_SAMPLES);

    Dataset d = {.n = n, .c = 3, .h = 32, .w = 32, .n_classes = 10};
    d.x = pd_alloc(n * CIFAR_PIXELS * sizeof(float));
    d.y = pd_alloc(n * sizeof(int32_t));
    unsigned char rec[CIFAR_RECORD];
    size_t k = 0;   /* samples stored */
    int rc = PD_OK;
    for (int i = 0; i < n_files && rc == PD_OK; i++) {
        FILE *f = fopen(paths[i], "rb");
        if (!f) {
            rc = err_set(err, PD_EIO, "%s: cannot open: %s", paths[i], strerror(errno));
            break;
        }
        for (size_t r = 0; r < records[i]; r++, k++) {
            if (fread(rec, 1, CIFAR_RECORD, f) != CIFAR_RECORD) {
                rc = err_set(err, PD_EIO, "%s: read failed at record %zu of %zu (file changed while reading?)",
                             paths[i], r, records[i]);
                break;
            }
            if (rec[0] > 9) {
                rc = err_set(err, PD_EINVAL, "%s: record %zu: label %u is out of range, expected 0..9", paths[i], r,
                             rec[0]);
                break;
            }
            d.y[k] = rec[0];
            float *x = d.x + k * CIFAR_PIXELS;   /* (3, 32, 32) */
            for (int j = 0; j < CIFAR_PIXELS; j++) x[j] = (float)rec[1 + j] / 255.0f;
        }
        fclose(f);
    }
    if (rc != PD_OK) {
        data_release(&d);
        return rc;
    }
    *out = d;
    return PD_OK;
}
