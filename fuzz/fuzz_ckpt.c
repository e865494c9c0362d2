/* fuzz_ckpt.c: the checkpoint reader (src/ckpt) on arbitrary files. Checks, besides the
 * sanitizers: ckpt_open and ckpt_verify agree; on success the tensors tile the data
 * section, every lookup finds its tensor and every byte of every tensor can be read. */
#include "fuzz_util.h"

#include "ckpt.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    pd_log_set_level(LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
    const char *path = fuzz_write(fuzz_dir("ckpt"), "in.safetensors", data, len);
    Ckpt *ck = NULL;
    Err err = {0}, err2 = {0};
    int rc = ckpt_open(path, &ck, &err);
    int rc2 = ckpt_verify(path, &err2);
    if (rc != rc2 || strcmp(err.msg, err2.msg) != 0) abort();
    if (rc != PD_OK) {
        if (ck || !strstr(err.msg, path)) abort();   /* every message names the file */
        return 0;
    }
    uint64_t pos = 0;
    volatile unsigned char sink = 0;
    for (int i = 0; i < ckpt_count(ck); i++) {
        const CkptTensor *t = ckpt_tensor(ck, i);
        if (t->begin != pos || t->end - t->begin != t->nbytes) abort();
        if (t->nbytes != t->numel * ckpt_dtype_size(t->dtype)) abort();
        pos = t->end;
        if (ckpt_find(ck, t->name) != t) abort();
        for (size_t b = 0; b < t->nbytes; b++) sink ^= ((const unsigned char *)t->data)[b];
    }
    if (8 + pos > len) abort();
    for (int i = 0; i < ckpt_meta_count(ck); i++) {
        const char *k, *v;
        ckpt_meta_at(ck, i, &k, &v);
        if (ckpt_meta(ck, k) != v) abort();
    }
    (void)sink;
    ckpt_close(ck);
    return 0;
}
