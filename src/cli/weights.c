/* weights.c: reading and writing weights files (weights.h). */
#include "weights.h"

#include <stdio.h>

#include "ckpt.h"

int weights_load(const char *path, const Model *m, float *w, float *state, Err *err) {
    Ckpt *ck;
    int rc = ckpt_open(path, &ck, err);
    if (rc) return rc;
    int nt;
    const ParamInfo *pt = model_param_tensors(m, &nt);
    for (int i = 0; i < nt && !rc; i++) rc = ckpt_copy_f32(ck, pt[i].name, pt[i].shape, w + pt[i].offset, err);
    int nl = model_n_layers(m);
    for (int l = 0; l < nl && !rc; l++) {
        size_t a = model_state_offset(m, l), b = model_state_offset(m, l + 1);
        if (b == a) continue;
        char key[64];
        snprintf(key, sizeof key, "state.layers.%d", l);
        rc = ckpt_copy_f32(ck, key, shape1((int)(b - a)), state + a, err);
    }
    ckpt_close(ck);
    return rc;
}

int weights_save(const char *path, const Model *m, const float *w, const float *state, Err *err) {
    CkptWriter *wr = ckpt_writer_new();
    int nt, rc = PD_OK;
    const ParamInfo *pt = model_param_tensors(m, &nt);
    for (int i = 0; i < nt && !rc; i++) rc = ckpt_writer_add_f32(wr, pt[i].name, pt[i].shape, w + pt[i].offset, err);
    int nl = model_n_layers(m);
    char key[64], v[32];
    for (int l = 0; l < nl && !rc; l++) {
        size_t a = model_state_offset(m, l), b = model_state_offset(m, l + 1);
        if (b == a) continue;
        snprintf(key, sizeof key, "state.layers.%d", l);
        rc = ckpt_writer_add_f32(wr, key, shape1((int)(b - a)), state + a, err);
    }
    snprintf(v, sizeof v, "%zu", model_param_count(m, 0, nl));
    if (!rc) rc = ckpt_writer_meta(wr, "pipedream.model", model_name(m), err);
    if (!rc) rc = ckpt_writer_meta(wr, "pipedream.params", v, err);
    if (!rc) rc = ckpt_write(wr, path, err);
    ckpt_writer_free(wr);
    return rc;
}
