/* rt_ckpt.c: what goes into a training checkpoint and a weights file, and how it comes back.
 * Tensors are named by GLOBAL layer (model_param_tensors: "layers.7.weight"), so a checkpoint
 * taken under one plan loads under any other plan, schedule or one worker: the whole model's
 * buffers are rebuilt and every stage takes its range. Contents: parameters, optimizer state
 * ("optim.m.<name>", "optim.v.<name>" for Adam), batch-norm running statistics
 * ("state.layers.<i>" per layer with state), and metadata: model, minibatches and units done,
 * optimizer step count, seed, schedule, the optimizer and its hyper-parameters, and the mean
 * and std the inputs were standardised with. Checkpoints are taken where no minibatch is in
 * flight (the end of a segment of a session, rt_session.c), so no stashed versions or
 * activations need saving. A weights file holds the parameters, the state and the input
 * statistics only. The file layout itself (safetensors, atomic write, checksum) is ckpt.h's.
 * Where the ranks' directories are not one (no shared filesystem), the file's copies: a second
 * one on another rank's host after each write, and before a resume the newest complete
 * checkpoint brought to every rank that lacks it, over the control plane. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "runtime.h"

static const char *opt_name(int kind) { return optim_kind_name((OptKind)kind); }

int rt_ckpt_path(const char *dir, uint64_t minibatches, char *path, size_t n, Err *err) {
    char name[64];
    int rc = ckpt_name(minibatches, name, sizeof name, err);
    if (rc) return rc;
    if ((size_t)snprintf(path, n, "%s/%s", dir, name) >= n)
        return err_set(err, PD_EINVAL, "checkpoint path too long (%zu bytes): %.200s...", strlen(dir) + 1 + strlen(name),
                       dir);
    return PD_OK;
}

/* The tensors every weights file and checkpoint has: parameters, then each layer's state. */
static int add_weights(CkptWriter *w, const Model *m, const float *params, const float *state, Err *err) {
    int nt, rc = PD_OK;
    const ParamInfo *pt = model_param_tensors(m, &nt);
    for (int i = 0; i < nt && !rc; i++) rc = ckpt_writer_add_f32(w, pt[i].name, pt[i].shape, params + pt[i].offset, err);
    int nl = model_n_layers(m);
    char key[64];
    for (int l = 0; l < nl && !rc; l++) {
        size_t a = model_state_offset(m, l), b = model_state_offset(m, l + 1);
        if (b == a) continue;
        snprintf(key, sizeof key, "state.layers.%d", l);
        rc = ckpt_writer_add_f32(w, key, shape1((int)(b - a)), state + a, err);
    }
    return rc;
}

/* The shortest of %.15g and %.17g that reads back as x. */
static void num_text(char *buf, size_t n, double x) {
    snprintf(buf, n, "%.15g", x);
    if (strtod(buf, NULL) != x) snprintf(buf, n, "%.17g", x);
}

typedef struct Meta {
    const char *k;
    char v[64];
} Meta;

/* model, params and (when finite) the input statistics */
static int common_meta(const Model *m, double mean, double std, Meta *meta) {
    int nm = 0;
    meta[nm].k = "pipedream.model", snprintf(meta[nm++].v, 64, "%s", model_name(m));
    meta[nm].k = "pipedream.params", snprintf(meta[nm++].v, 64, "%zu", model_param_count(m, 0, model_n_layers(m)));
    if (isfinite(mean) && isfinite(std)) {
        meta[nm].k = "pipedream.data_mean", num_text(meta[nm++].v, 64, mean);
        meta[nm].k = "pipedream.data_std", num_text(meta[nm++].v, 64, std);
    }
    return nm;
}

static int write_meta(CkptWriter *w, const Meta *meta, int nm, Err *err) {
    int rc = PD_OK;
    for (int i = 0; i < nm && !rc; i++) rc = ckpt_writer_meta(w, meta[i].k, meta[i].v, err);
    return rc;
}

int rt_ckpt_save(const char *dir, const Model *m, const RtCkpt *c, char *path_out, size_t n, Err *err) {
    char path[4096];
    int rc = rt_ckpt_path(dir, c->minibatches_done, path, sizeof path, err);
    if (rc) return rc;
    CkptWriter *w = ckpt_writer_new();
    int nt;
    const ParamInfo *pt = model_param_tensors(m, &nt);
    char key[160];
    rc = add_weights(w, m, c->params, c->state, err);
    for (int i = 0; i < nt && !rc; i++) {
        snprintf(key, sizeof key, "optim.m.%s", pt[i].name);
        rc = ckpt_writer_add_f32(w, key, pt[i].shape, c->opt_m + pt[i].offset, err);
        if (!rc && c->opt_v) {
            snprintf(key, sizeof key, "optim.v.%s", pt[i].name);
            rc = ckpt_writer_add_f32(w, key, pt[i].shape, c->opt_v + pt[i].offset, err);
        }
    }
    Meta meta[26];
    int nm = common_meta(m, c->data_mean, c->data_std, meta);
    meta[nm].k = "pipedream.minibatches_done", snprintf(meta[nm++].v, 64, "%" PRIu64, c->minibatches_done);
    meta[nm].k = "pipedream.units_done", snprintf(meta[nm++].v, 64, "%" PRIu64, c->units_done);
    meta[nm].k = "pipedream.optimizer_step", snprintf(meta[nm++].v, 64, "%ld", c->opt_step);
    meta[nm].k = "pipedream.seed", snprintf(meta[nm++].v, 64, "%" PRIu64, c->seed);
    meta[nm].k = "pipedream.schedule", snprintf(meta[nm++].v, 64, "%s", c->schedule);
    const OptConfig *o = &c->opt;
    meta[nm].k = "pipedream.optimizer", snprintf(meta[nm++].v, 64, "%s", opt_name(o->kind));
    meta[nm].k = "pipedream.lr", snprintf(meta[nm++].v, 64, "%.9g", (double)o->lr);
    meta[nm].k = "pipedream.weight_decay", snprintf(meta[nm++].v, 64, "%.9g", (double)o->weight_decay);
    meta[nm].k = "pipedream.lr_schedule", snprintf(meta[nm++].v, 64, "%s", optim_lr_sched_name(o->lr_sched));
    meta[nm].k = "pipedream.warmup_steps", snprintf(meta[nm++].v, 64, "%ld", o->warmup);
    meta[nm].k = "pipedream.decay_steps", snprintf(meta[nm++].v, 64, "%ld", o->decay_steps);
    meta[nm].k = "pipedream.min_lr", snprintf(meta[nm++].v, 64, "%.9g", (double)o->min_lr);
    meta[nm].k = "pipedream.clip_grad_norm", snprintf(meta[nm++].v, 64, "%.9g", (double)o->clip_norm);
    if (optim_is_adam(o->kind)) {
        meta[nm].k = "pipedream.adam_beta1", snprintf(meta[nm++].v, 64, "%.9g", (double)o->beta1);
        meta[nm].k = "pipedream.adam_beta2", snprintf(meta[nm++].v, 64, "%.9g", (double)o->beta2);
        meta[nm].k = "pipedream.adam_eps", snprintf(meta[nm++].v, 64, "%.9g", (double)o->eps);
    } else {
        meta[nm].k = "pipedream.momentum", snprintf(meta[nm++].v, 64, "%.9g", (double)o->momentum);
    }
    if (!rc) rc = write_meta(w, meta, nm, err);
    if (!rc) rc = ckpt_write(w, path, err);
    ckpt_writer_free(w);
    if (!rc && path_out) snprintf(path_out, n, "%s", path);
    return rc;
}

int rt_weights_save(const char *path, const Model *m, const float *params, const float *state, double data_mean,
                    double data_std, Err *err) {
    CkptWriter *w = ckpt_writer_new();
    int rc = add_weights(w, m, params, state, err);
    Meta meta[4];
    int nm = common_meta(m, data_mean, data_std, meta);
    if (!rc) rc = write_meta(w, meta, nm, err);
    if (!rc) rc = ckpt_write(w, path, err);
    ckpt_writer_free(w);
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

/* An optional number: NAN when absent, an error when not a number. */
static int meta_num(const Ckpt *ck, const char *key, double *out, Err *err) {
    const char *v = ckpt_meta(ck, key);
    *out = NAN;
    if (!v) return PD_OK;
    char *end;
    double x = strtod(v, &end);
    if (!*v || *end) return err_set(err, PD_EINVAL, "%s: metadata \"%s\" is not a number: \"%s\"", ckpt_path(ck), key, v);
    *out = x;
    return PD_OK;
}

/* The input statistics (both or neither). */
static int read_stats(const Ckpt *ck, RtCkpt *c, Err *err) {
    int rc = meta_num(ck, "pipedream.data_mean", &c->data_mean, err);
    if (!rc) rc = meta_num(ck, "pipedream.data_std", &c->data_std, err);
    if (!rc && isfinite(c->data_mean) != isfinite(c->data_std))
        rc = err_set(err, PD_EINVAL, "%s: records one of pipedream.data_mean and pipedream.data_std", ckpt_path(ck));
    return rc;
}

static int read_weights(const Ckpt *ck, const Model *m, RtCkpt *c, Err *err) {
    int nt, nl = model_n_layers(m), rc = PD_OK;
    const ParamInfo *pt = model_param_tensors(m, &nt);
    for (int i = 0; i < nt && !rc; i++) rc = ckpt_copy_f32(ck, pt[i].name, pt[i].shape, c->params + pt[i].offset, err);
    int nties;
    const ParamTie *ties = model_ties(m, &nties);
    for (int t = 0; t < nties && !rc; t++) {   /* a tie's two copies must start equal to stay equal */
        const ParamInfo *s = &pt[ties[t].src], *d = &pt[ties[t].dst];
        if (memcmp(c->params + s->offset, c->params + d->offset, shape_numel(s->shape) * sizeof(float)))
            rc = err_set(err, PD_EINVAL, "%s: %s differs from %s, which the model ties it to (write the same values "
                         "under both names)", ckpt_path(ck), d->name, s->name);
    }
    char key[160];
    for (int l = 0; l < nl && !rc; l++) {
        size_t a = model_state_offset(m, l), b = model_state_offset(m, l + 1);
        if (b == a) continue;
        snprintf(key, sizeof key, "state.layers.%d", l);
        rc = ckpt_copy_f32(ck, key, shape1((int)(b - a)), c->state + a, err);
    }
    return rc;
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
    /* the optimizer: the buffers given say this run's (opt_v: Adam's second moment; c->opt.kind
     * tells Adam from AdamW) */
    int run = !c->opt_v ? OPT_SGD : c->opt.kind == OPT_ADAMW ? OPT_ADAMW : OPT_ADAM;
    const char *on = ckpt_optimizer(ck);   /* without the key: what its state tensors say */
    if (!on) {
        rc = err_set(err, PD_EINVAL, "%s: holds no optimizer state (no \"pipedream.optimizer\" key, no optim.m.* tensors)",
                     path);
        goto out;
    }
    int taken = optim_kind_parse(on);
    if (taken == OPT_ADAM && run == OPT_ADAMW && !ckpt_meta(ck, "pipedream.optimizer")) taken = run;   /* cannot tell */
    if (taken < 0) {
        rc = err_set(err, PD_EINVAL, "%s: unknown optimizer \"%s\"", path, on);
        goto out;
    }
    if (taken != run) {
        rc = err_set(err, PD_EINVAL, "%s: taken with --optimizer %s, this run has --optimizer %s (its state does not "
                     "carry over)", path, opt_name(taken), opt_name(run));
        goto out;
    }
    double v[6];
    static const char *const keys[6] = {"pipedream.lr", "pipedream.momentum", "pipedream.weight_decay",
                                        "pipedream.adam_beta1", "pipedream.adam_beta2", "pipedream.adam_eps"};
    for (int i = 0; i < 6 && !rc; i++) rc = meta_num(ck, keys[i], &v[i], err);
    if (!rc) rc = read_stats(ck, c, err);
    if (rc) goto out;
    c->opt = (OptConfig){.kind = (OptKind)taken, .lr = (float)v[0], .momentum = (float)v[1],
                         .weight_decay = (float)v[2], .beta1 = (float)v[3], .beta2 = (float)v[4], .eps = (float)v[5]};
    /* the schedule and clipping (checkpoints written before they existed: constant, no clipping) */
    const char *sn = ckpt_meta(ck, "pipedream.lr_schedule");
    int sched = sn ? optim_lr_sched_parse(sn) : LR_CONSTANT;
    if (sched < 0) {
        rc = err_set(err, PD_EINVAL, "%s: unknown learning-rate schedule \"%s\"", path, sn);
        goto out;
    }
    c->opt.lr_sched = (LrSchedKind)sched;
    double sv[4] = {0, 0, 0, 0};
    static const char *const skeys[4] = {"pipedream.warmup_steps", "pipedream.decay_steps", "pipedream.min_lr",
                                         "pipedream.clip_grad_norm"};
    for (int i = 0; i < 4 && !rc; i++)
        if (ckpt_meta(ck, skeys[i])) rc = meta_num(ck, skeys[i], &sv[i], err);
    if (rc) goto out;
    c->opt.warmup = (long)sv[0], c->opt.decay_steps = (long)sv[1], c->opt.min_lr = (float)sv[2],
    c->opt.clip_norm = (float)sv[3];
    if ((rc = read_weights(ck, m, c, err))) goto out;
    int nt;
    const ParamInfo *pt = model_param_tensors(m, &nt);
    char key[160];
    for (int i = 0; i < nt && !rc; i++) {
        snprintf(key, sizeof key, "optim.m.%s", pt[i].name);
        rc = ckpt_copy_f32(ck, key, pt[i].shape, c->opt_m + pt[i].offset, err);
        if (!rc && c->opt_v) {
            snprintf(key, sizeof key, "optim.v.%s", pt[i].name);
            rc = ckpt_copy_f32(ck, key, pt[i].shape, c->opt_v + pt[i].offset, err);
        }
    }
out:
    ckpt_close(ck);
    return rc;
}

int rt_weights_load(const char *path, const Model *m, RtCkpt *c, Err *err) {
    Ckpt *ck;
    int rc = ckpt_open(path, &ck, err);
    if (rc) return rc;
    rc = read_stats(ck, c, err);
    if (!rc) rc = read_weights(ck, m, c, err);
    ckpt_close(ck);
    return rc;
}

int rt_ckpt_opt_changes(const OptConfig *taken, const OptConfig *run, char *was, char *now, size_t n) {
    struct {
        const char *flag;
        float a, b;
    } h[11] = {{"--lr", taken->lr, run->lr},
               {"--momentum", taken->momentum, run->momentum},
               {"--weight-decay", taken->weight_decay, run->weight_decay},
               {"--beta1", taken->beta1, run->beta1},
               {"--beta2", taken->beta2, run->beta2},
               {"adam eps", taken->eps, run->eps},
               {"--lr-schedule", (float)taken->lr_sched, (float)run->lr_sched},
               {"--warmup-steps", (float)taken->warmup, (float)run->warmup},
               {"--decay-steps", (float)taken->decay_steps, (float)run->decay_steps},
               {"--min-lr", taken->min_lr, run->min_lr},
               {"--clip-grad-norm", taken->clip_norm, run->clip_norm}};
    int k = 0;
    size_t la = 0, lb = 0;
    was[0] = now[0] = 0;
    for (int i = 0; i < 11; i++) {
        int applies = i >= 6 || (optim_is_adam(run->kind) ? i != 1 : i < 3);
        if (!applies || isnan(h[i].a) || h[i].a == h[i].b) continue;
        char va[32], vb[32];
        if (i == 6) {   /* the schedule by name */
            snprintf(va, sizeof va, "%s", optim_lr_sched_name(taken->lr_sched));
            snprintf(vb, sizeof vb, "%s", optim_lr_sched_name(run->lr_sched));
        } else {
            snprintf(va, sizeof va, "%g", (double)h[i].a);
            snprintf(vb, sizeof vb, "%g", (double)h[i].b);
        }
        la += (size_t)snprintf(was + la, la < n ? n - la : 0, "%s%s %s", k ? " " : "", h[i].flag, va);
        lb += (size_t)snprintf(now + lb, lb < n ? n - lb : 0, "%s%s %s", k ? " " : "", h[i].flag, vb);
        if (la >= n) la = n - 1;
        if (lb >= n) lb = n - 1;
        k++;
    }
    return k;
}

/* ---- copies on other hosts ------------------------------------------------------------------- */

enum { CKPT_CHANNEL = 61 };           /* the control channel checkpoint files travel on (no other user) */
#define CKPT_CHUNK ((size_t)32 << 20) /* bytes per control message: the memory a copy takes */

int rt_ckpt_dir_of_rank(const char *dir, int rank, char *out, size_t n, Err *err) {
    size_t k = 0;
    for (const char *p = dir; *p; p++) {
        char piece[16] = {*p, 0};
        if (*p == '%') {
            if (p[1] == 'r') snprintf(piece, sizeof piece, "%d", rank);
            else if (p[1] != '%')
                return err_set(err, PD_EINVAL, "checkpoint directory %.300s: '%%' starts %%r (the rank) or %%%% (a '%%'), "
                               "not '%%%c'", dir, p[1] ? p[1] : ' ');
            p++;
        }
        size_t len = strlen(piece);
        if (k + len >= n) return err_set(err, PD_EINVAL, "checkpoint directory too long: %.200s...", dir);
        memcpy(out + k, piece, len);
        k += len;
    }
    out[k] = 0;
    return PD_OK;
}

int rt_ckpt_spec_dirs(const char **checkpoint_dir, const char **resume, int rank, char dirs[2][4096], Err *err) {
    const char **d[2] = {checkpoint_dir, resume};
    for (int i = 0; i < 2; i++) {
        if (!*d[i]) continue;
        int rc = rt_ckpt_dir_of_rank(*d[i], rank, dirs[i], sizeof dirs[i], err);
        if (rc) return rc;
        *d[i] = dirs[i];
    }
    return PD_OK;
}

/* mkdir -p */
static int make_dir(const char *dir, Err *err) {
    char p[4096];
    if ((size_t)snprintf(p, sizeof p, "%s", dir) >= sizeof p)
        return err_set(err, PD_EINVAL, "checkpoint directory too long: %.200s...", dir);
    for (char *q = p + 1;; q++) {
        if (*q && *q != '/') continue;
        char was = *q;
        *q = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return err_set(err, PD_EIO, "cannot create the checkpoint directory %s: %s", p, strerror(errno));
        if (!was) break;
        *q = was;
    }
    return PD_OK;
}

static const char *base_name(const char *path) {
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

/* The file at path to rank `to`: its size (-1: unreadable), then chunks of CKPT_CHUNK bytes; a
 * chunk that cannot be read goes as an empty message, which ends the copy on both sides. */
static int send_file(Comm *c, int to, const char *path, double timeout_s, Err *err) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    int64_t size = f && fstat(fileno(f), &st) == 0 ? (int64_t)st.st_size : -1;
    int e = errno;
    int rc = comm_ctrl_send(c, to, CKPT_CHANNEL, &size, sizeof size, timeout_s, err);
    if (size < 0) {
        if (f) fclose(f);
        return rc ? rc : err_set(err, PD_EIO, "cannot read %s to send it to rank %d: %s", path, to, strerror(e));
    }
    char *buf = malloc(CKPT_CHUNK);
    PD_ASSERT(buf);
    int bad = 0;
    for (int64_t done = 0; !rc && !bad && done < size;) {
        size_t k = (size_t)(size - done) < CKPT_CHUNK ? (size_t)(size - done) : CKPT_CHUNK;
        bad = fread(buf, 1, k, f) != k;
        rc = comm_ctrl_send(c, to, CKPT_CHANNEL, buf, bad ? 0 : k, timeout_s, err);
        done += (int64_t)k;
    }
    free(buf);
    fclose(f);
    if (!rc && bad) rc = err_set(err, PD_EIO, "cannot read %s to send it to rank %d (changed while sent?)", path, to);
    return rc;
}

/* The file rank `from` sends (send_file), written atomically to path and verified (ckpt_verify:
 * the sizes and the checksum). A local write error still takes in the whole message. */
static int recv_file(Comm *c, int from, const char *path, double timeout_s, Err *err) {
    int64_t size = -1;
    size_t got = 0;
    int rc = comm_ctrl_recv(c, from, CKPT_CHANNEL, &size, sizeof size, &got, timeout_s, err);
    if (rc) return rc;
    if (got != sizeof size || size < 0)
        return err_set(err, PD_EIO, "rank %d could not read its %s to send it", from, base_name(path));
    Err werr = {0};
    PdAtomicFile af;
    int wrc = pd_atomic_open(&af, path, &werr);
    char *buf = malloc(CKPT_CHUNK);
    PD_ASSERT(buf);
    for (int64_t done = 0; done < size;) {
        size_t k = (size_t)(size - done) < CKPT_CHUNK ? (size_t)(size - done) : CKPT_CHUNK;
        if ((rc = comm_ctrl_recv(c, from, CKPT_CHANNEL, buf, k, &got, timeout_s, err))) break;
        if (got != k) {
            rc = err_set(err, PD_EIO, "rank %d stopped sending %s after %" PRId64 " of %" PRId64 " bytes", from,
                         base_name(path), done, size);
            break;
        }
        if (!wrc) wrc = pd_atomic_write(&af, buf, k, &werr);
        done += (int64_t)k;
    }
    free(buf);
    if (rc) {
        if (!wrc) close(af.fd), unlink(af.tmp);   /* the part received goes */
        return rc;
    }
    if (!wrc) wrc = pd_atomic_commit(&af, &werr);
    if (wrc) {
        *err = werr;
        return wrc;
    }
    return ckpt_verify(path, err);
}

int rt_ckpt_partner(Comm *c, const char *dir, double timeout_s, int *partner, Err *err) {
    int rank = comm_rank(c), n = comm_size(c), rc = PD_OK, crc;
    *partner = -1;
    if (n < 2) return PD_OK;
    int64_t tok[2] = {0, 0};
    char marker[4200];
    if (rank == 0) {
        tok[0] = (int64_t)getpid(), tok[1] = (int64_t)(pd_now() * 1e9);
        snprintf(marker, sizeof marker, "%s/.pipedream-dir-%" PRIx64 "-%" PRIx64, dir, (uint64_t)tok[0], (uint64_t)tok[1]);
        FILE *f = fopen(marker, "wb");
        if (!f || fclose(f) != 0)
            rc = err_set(err, PD_EIO, "cannot write into the checkpoint directory %s: %s", dir, strerror(errno));
    }
    if ((crc = comm_bcast_i64(c, 0, tok, 2, timeout_s, err))) return crc;
    snprintf(marker, sizeof marker, "%s/.pipedream-dir-%" PRIx64 "-%" PRIx64, dir, (uint64_t)tok[0], (uint64_t)tok[1]);
    int64_t sees = rank == 0 || access(marker, F_OK) == 0, p = -1;
    int64_t *all = rank == 0 ? calloc((size_t)n, sizeof *all) : NULL;
    PD_ASSERT(rank != 0 || all);
    crc = comm_gather_i64(c, 0, &sees, 1, all, timeout_s, err);
    if (rank == 0) {
        for (int r = 1; r < n && !crc; r++)
            if (!all[r]) p = r;
        unlink(marker);
    }
    free(all);
    if (crc || (crc = comm_bcast_i64(c, 0, &p, 1, timeout_s, err))) return crc;
    *partner = (int)p;
    return rc;
}

int rt_ckpt_replicate(Comm *c, int partner, const char *path, double timeout_s, Err *err) {
    int rank = comm_rank(c);
    if (partner < 1) return PD_OK;
    if (rank == 0) return send_file(c, partner, path, timeout_s, err);
    if (rank != partner) return PD_OK;
    int rc = recv_file(c, 0, path, timeout_s, err);
    if (!rc) fprintf(stderr, "pipedream: rank %d: checkpoint's second copy %s\n", rank, path);
    return rc;
}

int rt_ckpt_fetch_newest(Comm *c, const char *dir, double timeout_s, Err *err) {
    int rank = comm_rank(c), n = comm_size(c), who = -1;
    char have[4096] = "", want[4096];
    uint64_t step;
    int64_t mine = -1;
    int rc = make_dir(dir, err);
    if (!rc) rc = ckpt_latest(dir, have, sizeof have, err);
    if (!rc && have[0] && ckpt_name_parse(base_name(have), &step)) mine = (int64_t)step;
    int64_t *all = calloc((size_t)n, sizeof *all);
    PD_ASSERT(all);
    int crc = comm_gather_i64(c, 0, &mine, 1, all, timeout_s, err);
    if (!crc) crc = comm_bcast_i64(c, 0, all, n, timeout_s, err);
    if (crc) {
        free(all);
        return crc;   /* the control plane failed: every rank learns it so */
    }
    int64_t newest = -1;
    int owner = -1;
    for (int r = 0; r < n; r++)
        if (all[r] > newest) newest = all[r], owner = r;
    if (newest >= 0 && rank == owner) {
        for (int r = 0; r < n; r++) {
            if (all[r] == newest) continue;
            int src = send_file(c, r, have, timeout_s, err);
            if (!rc) rc = src;
        }
    } else if (newest >= 0 && all[rank] != newest) {
        int prc = rt_ckpt_path(dir, (uint64_t)newest, want, sizeof want, err);
        int frc = recv_file(c, owner, prc ? "/" : want, timeout_s, prc ? &(Err){0} : err);
        if (!rc) rc = prc ? prc : frc;
        if (!rc)
            fprintf(stderr, "pipedream: rank %d: %s received from rank %d (the newest complete checkpoint; %s had %s)\n",
                    rank, want, owner, dir, mine >= 0 ? base_name(have) : "none");
    }
    free(all);
    Err e2 = {0};
    int agreed = comm_agree_t(c, rc, timeout_s, &who, &e2);
    if (agreed && !rc) {
        if (e2.code) *err = e2;
        else err_set(err, agreed, "rank %d could not take the newest checkpoint (its message says why)", who);
    }
    return agreed;
}
