/* rt_ckpt.c: what goes into a training checkpoint and how it comes back. Tensors are named by
 * GLOBAL layer (model_param_tensors: "layers.7.weight"), so a checkpoint taken under one plan
 * loads under any other plan, schedule or one worker: the whole model's buffers are rebuilt
 * and every stage takes its range. Contents: parameters, optimizer state ("optim.m.<name>",
 * "optim.v.<name>" for Adam), batch-norm running statistics ("state.layers.<i>" per layer
 * with state), and metadata: model, minibatches and units done, optimizer step count, seed,
 * schedule. Checkpoints are taken where no minibatch is in flight (the end of a segment of
 * a segmented run, see cmd_train_pipe.c), so no stashed versions or activations need saving.
 * The file layout itself (safetensors, atomic write, checksum) is ckpt.h's. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "runtime.h"

int rt_ckpt_save(const char *dir, const Model *m, const RtCkpt *c, char *path_out, size_t n, Err *err) {
    char name[64], path[4096];
    int rc = ckpt_name(c->minibatches_done, name, sizeof name, err);
    if (rc) return rc;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return err_set(err, PD_EINVAL, "%s: checkpoint directory path too long", dir);
    CkptWriter *w = ckpt_writer_new();
    int nt;
    const ParamInfo *pt = model_param_tensors(m, &nt);
    char key[160];
    for (int i = 0; i < nt && !rc; i++) {
        rc = ckpt_writer_add_f32(w, pt[i].name, pt[i].shape, c->params + pt[i].offset, err);
        snprintf(key, sizeof key, "optim.m.%s", pt[i].name);
        if (!rc) rc = ckpt_writer_add_f32(w, key, pt[i].shape, c->opt_m + pt[i].offset, err);
        if (!rc && c->opt_v) {
            snprintf(key, sizeof key, "optim.v.%s", pt[i].name);
            rc = ckpt_writer_add_f32(w, key, pt[i].shape, c->opt_v + pt[i].offset, err);
        }
    }
    int nl = model_n_layers(m);
    for (int l = 0; l < nl && !rc; l++) {
        size_t a = model_state_offset(m, l), b = model_state_offset(m, l + 1);
        if (b == a) continue;
        snprintf(key, sizeof key, "state.layers.%d", l);
        rc = ckpt_writer_add_f32(w, key, shape1((int)(b - a)), c->state + a, err);
    }
    struct { const char *k; char v[64]; } meta[8];
    int nm = 0;
    meta[nm].k = "pipedream.model", snprintf(meta[nm++].v, 64, "%s", model_name(m));
    meta[nm].k = "pipedream.params", snprintf(meta[nm++].v, 64, "%zu", model_param_count(m, 0, nl));
    meta[nm].k = "pipedream.minibatches_done", snprintf(meta[nm++].v, 64, "%" PRIu64, c->minibatches_done);
    meta[nm].k = "pipedream.units_done", snprintf(meta[nm++].v, 64, "%" PRIu64, c->units_done);
    meta[nm].k = "pipedream.optimizer_step", snprintf(meta[nm++].v, 64, "%ld", c->opt_step);
    meta[nm].k = "pipedream.seed", snprintf(meta[nm++].v, 64, "%" PRIu64, c->seed);
    meta[nm].k = "pipedream.schedule", snprintf(meta[nm++].v, 64, "%s", c->schedule);
    meta[nm].k = "pipedream.optimizer", snprintf(meta[nm++].v, 64, "%s", c->opt_v ? "adam" : "sgd");
    for (int i = 0; i < nm && !rc; i++) rc = ckpt_writer_meta(w, meta[i].k, meta[i].v, err);
    if (!rc) rc = ckpt_write(w, path, err);
    ckpt_writer_free(w);
    if (!rc && path_out) snprintf(path_out, n, "%s", path);
    return rc;
}

static int meta_u64(const Ckpt *ck, const char *key, uint64_t *out, Err *err) {
    const char *v = ckpt_meta(ck, key);
    char *end;
    if (!v || !*v) return err_set(err, PD_EINVAL, "%s: metadata \"%s\" missing", ckpt_path(ck), key);
    unsigned long long x = strtoull(v, &end, 10);
    if (*end) return err_set(err, PD_EINVAL, "%s: metadata \"%s\" is not a number: \"%s\"", ckpt_path(ck), key, v);
    *out = x;
    return PD_OK;
}

int rt_ckpt_load(const char *path, const Model *m, RtCkpt *c, Err *err) {
    Ckpt *ck;
    int rc = ckpt_open(path, &ck, err);
    if (rc) return rc;
    int nl = model_n_layers(m);
    const char *mn = ckpt_meta(ck, "pipedream.model");
    if (!mn || strcmp(mn, model_name(m)) != 0) {
        rc = err_set(err, PD_EINVAL, "%s: a checkpoint of model \"%s\", not of \"%s\"", path, mn ? mn : "?",
                     model_name(m));
        goto out;
    }
    uint64_t np, step;
    if ((rc = meta_u64(ck, "pipedream.params", &np, err))) goto out;
    if (np != model_param_count(m, 0, nl)) {
        rc = err_set(err, PD_EINVAL, "%s: holds %" PRIu64 " parameters, the model %s has %zu", path, np, model_name(m),
                     model_param_count(m, 0, nl));
        goto out;
    }
    if ((rc = meta_u64(ck, "pipedream.minibatches_done", &c->minibatches_done, err))) goto out;
    if ((rc = meta_u64(ck, "pipedream.units_done", &c->units_done, err))) goto out;
    if ((rc = meta_u64(ck, "pipedream.optimizer_step", &step, err))) goto out;
    if ((rc = meta_u64(ck, "pipedream.seed", &c->seed, err))) goto out;
    c->opt_step = (long)step;
    const char *sk = ckpt_meta(ck, "pipedream.schedule");
    snprintf(c->schedule, sizeof c->schedule, "%s", sk ? sk : "");
    int nt;
    const ParamInfo *pt = model_param_tensors(m, &nt);
    char key[160];
    for (int i = 0; i < nt && !rc; i++) {
        rc = ckpt_copy_f32(ck, pt[i].name, pt[i].shape, c->params + pt[i].offset, err);
        snprintf(key, sizeof key, "optim.m.%s", pt[i].name);
        if (!rc) rc = ckpt_copy_f32(ck, key, pt[i].shape, c->opt_m + pt[i].offset, err);
        if (!rc && c->opt_v) {
            snprintf(key, sizeof key, "optim.v.%s", pt[i].name);
            rc = ckpt_copy_f32(ck, key, pt[i].shape, c->opt_v + pt[i].offset, err);
        }
    }
    for (int l = 0; l < nl && !rc; l++) {
        size_t a = model_state_offset(m, l), b = model_state_offset(m, l + 1);
        if (b == a) continue;
        snprintf(key, sizeof key, "state.layers.%d", l);
        rc = ckpt_copy_f32(ck, key, shape1((int)(b - a)), c->state + a, err);
    }
out:
    ckpt_close(ck);
    return rc;
}

int rt_weights_load(const char *path, const Model *m, RtCkpt *c, Err *err) {
    Ckpt *ck;
    int rc = ckpt_open(path, &ck, err);
    if (rc) return rc;
    int nt, nl = model_n_layers(m);
    const ParamInfo *pt = model_param_tensors(m, &nt);
    for (int i = 0; i < nt && !rc; i++) rc = ckpt_copy_f32(ck, pt[i].name, pt[i].shape, c->params + pt[i].offset, err);
    char key[160];
    for (int l = 0; l < nl && !rc; l++) {
        size_t a = model_state_offset(m, l), b = model_state_offset(m, l + 1);
        if (b == a) continue;
        snprintf(key, sizeof key, "state.layers.%d", l);
        rc = ckpt_copy_f32(ck, key, shape1((int)(b - a)), c->state + a, err);
    }
    ckpt_close(ck);
    return rc;
}
