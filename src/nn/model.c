/* model.c: the model JSON builder and the range-wise forward/backward driver.
 *
 * Model JSON (models/NAME.json):
 *   { "name": "lenet5", "input": [1, 28, 28], "comment": "optional free text",
 *     "layers": [ {"type": "conv2d", "in": 1, "out": 6, "kernel": 5, "pad": 2, "relu": true}, ... ] }
 * Layer kinds and their keys are documented in each layer_<kind>.c; "init" (any layer with
 * parameters, and the model, per layer type) is init.c's. Unknown types, missing
 * keys, keys nobody read and shape mismatches are errors naming the file, the layer index
 * (with the sub-layer path inside a residual) and the key.
 *
 * This file owns: the kind table, parsing, parameter/state offsets, parameter init, the
 * per-minibatch context (NnCtx) and the forward/backward loops over a range of top-level
 * layers. It does not compute anything itself: layers call the kernels. */
#include "nn_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct Model {
    char name[64];
    char src[256];        /* path or name, for messages */
    Shape input;
    int n;                /* top-level layers */
    Layer *layers;        /* (n) */
    size_t *poff, *soff;  /* (n + 1) parameter / state offsets in floats */
    ParamInfo *pt;        /* all parameter tensors, buffer order */
    uint64_t *pt_uid;     /* init substream of each tensor's layer */
    NnInit *pt_init;      /* init scheme of each tensor (resolved: layer, model, default) */
    int n_pt;
    ParamTie *tie;        /* (n_tie) */
    int n_tie;
    float *gbuf[2];       /* backward ping-pong gradient buffers */
    size_t gbuf_floats;
    int prec;             /* KPREC_* of every layer (model_set_precision) */
};

struct NnCtx {
    const Model *m;
    int first, last, n_max;
    char *mem;            /* one block: input, then per layer output and saved state */
    size_t bytes;
    float *in;            /* (n_max, in of first) */
    float **y;            /* y[i - first]: (n_max, out of i) */
    void **saved;         /* saved[i - first] */
    NnRun run;            /* of the last forward */
    int have_fwd;
    unsigned char *lay;   /* lay[i - first]: layer i's layouts in the last forward (Layer.lay) */
    int xb, yb;           /* the range's ends blocked (nnctx_set_ends); 0: plain */
};

static const LayerOps *const KINDS[] = {
    &LAYER_LINEAR, &LAYER_CONV2D, &LAYER_MAXPOOL, &LAYER_GAP,      &LAYER_RELU,     &LAYER_DROPOUT,   &LAYER_BATCHNORM,
    &LAYER_LSTM,   &LAYER_FLATTEN, &LAYER_RESHAPE, &LAYER_PAD, &LAYER_RESIDUAL, &LAYER_LAST_STEP,
    /* transformer and language-model kinds */
    &LAYER_EMBED, &LAYER_LAYERNORM, &LAYER_ATTENTION, &LAYER_GELU, &LAYER_DENSE, &LAYER_BLOCK,
};
enum { N_KINDS = sizeof KINDS / sizeof KINDS[0] };

const char *nn_shape_str(Shape s) {
    static _Thread_local char bufs[4][64];   /* per thread: --workers builds one model per rank at once */
    static _Thread_local int k;
    k = (k + 1) & 3;
    return shape_str(s, bufs[k], sizeof bufs[k]);
}

void nn_add_param(Layer *l, const char *suffix, Shape s, ParamKind kind, int fan_in) {
    PD_ASSERT(l->n_pt < NN_MAX_PT);
    ParamInfo *p = &l->pt[l->n_pt++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s.%s", l->path, suffix);
    p->shape = s;
    p->offset = l->n_params;
    p->layer = l->top;
    p->kind = kind;
    p->fan_in = fan_in;
    l->n_params += shape_numel(s);
}

int nn_layer_parse(Layer *l, const cJSON *o, Shape in, const char *path, const char *ctx, uint64_t uid, int top,
                   Err *err) {
    memset(l, 0, sizeof *l);
    l->in = in;
    l->uid = uid;
    l->top = top;
    snprintf(l->path, sizeof l->path, "%s", path);
    JObj j;
    int rc = jobj_init(&j, o, err, "%s", ctx);
    if (rc) return rc;
    const char *type = NULL;
    if ((rc = jobj_str(&j, "type", 1, &type, err))) return rc;
    for (int k = 0; k < N_KINDS; k++)
        if (!strcmp(KINDS[k]->name, type)) l->ops = KINDS[k];
    if (!l->ops) {
        char known[256] = "";
        for (int k = 0; k < N_KINDS; k++) {
            strncat(known, KINDS[k]->name, sizeof known - strlen(known) - 1);
            if (k + 1 < N_KINDS) strncat(known, ", ", sizeof known - strlen(known) - 1);
        }
        return err_set(err, PD_EINVAL, "%s: unknown layer type \"%s\" (known: %s)", ctx, type, known);
    }
    char ctx2[256];
    snprintf(ctx2, sizeof ctx2, "%s (%s)", ctx, type);
    snprintf(j.ctx, sizeof j.ctx, "%s", ctx2);
    if ((rc = l->ops->parse(l, &j, ctx2, err))) return rc;
    const char *tie = NULL;
    if ((rc = jobj_str(&j, "tie", 0, &tie, err))) return rc;
    if (tie) {
        int has_weight = 0;
        for (int k = 0; k < l->n_pt; k++) has_weight |= l->pt[k].kind == PARAM_WEIGHT;
        if (!has_weight) return err_set(err, PD_EINVAL, "%s: key \"tie\": this layer has no weight to tie", ctx2);
        if (!*tie || strlen(tie) >= sizeof l->tie)
            return err_set(err, PD_EINVAL, "%s: key \"tie\": expected a parameter name such as \"layers.0.weight\"", ctx2);
        snprintf(l->tie, sizeof l->tie, "%s", tie);
    }
    const cJSON *ini = jobj_get(&j, "init");
    if (ini) {
        if (l->n_pt == 0)
            return err_set(err, PD_EINVAL, "%s: key \"init\": this layer has no parameters of its own%s", ctx2,
                           l->n_body ? " (give its sub-layers an init)" : "");
        char ctx3[300];
        snprintf(ctx3, sizeof ctx3, "%s: key \"init\"", ctx2);
        if ((rc = nn_init_parse_roles(ini, l->init, ctx3, err))) return rc;
        int has_bias = 0;
        for (int k = 0; k < l->n_pt; k++) has_bias |= nn_init_role(l->pt[k].kind);
        if (l->init[1].kind != NN_INIT_UNSET && !has_bias)
            return err_set(err, PD_EINVAL, "%s: key \"init\": key \"bias\": this layer has no bias", ctx2);
        if (l->init[0].kind != NN_INIT_UNSET && l->tie[0])
            return err_set(err, PD_EINVAL, "%s: key \"init\": key \"weight\": the weight is tied to %s, which "
                           "initialises it", ctx2, l->tie);
    }
    /* every later size computation (ints in kernels) relies on this */
    for (int d = 0; d < l->out.ndim; d++)
        if (l->out.d[d] < 1) return err_set(err, PD_EINVAL, "%s: empty output shape %s", ctx2, nn_shape_str(l->out));
    if (shape_numel(l->out) > NN_MAX_NUMEL || l->n_params > NN_MAX_NUMEL)
        return err_set(err, PD_EINVAL, "%s: output %s or parameter count %zu is larger than %ld per sample", ctx2,
                       nn_shape_str(l->out), l->n_params, (long)NN_MAX_NUMEL);
    return jobj_done(&j, err);
}

int nn_layer_build(Layer *l, int n_max, Err *err) {
    if (l->built_n >= n_max) return PD_OK;
    nn_layer_release(l);
    if (l->ops->build) {
        int rc = l->ops->build(l, n_max, err);
        if (rc) {
            nn_layer_release(l);
            return err_prefix(err, "%s (%s)", l->path, l->ops->name);
        }
    }
    l->built_n = n_max;
    return PD_OK;
}

void nn_layer_release(Layer *l) {
    if (l->ops && l->ops->release) l->ops->release(l);
    l->built_n = 0;
}

void nn_layer_destroy(Layer *l) {
    nn_layer_release(l);
    for (int i = 0; l->sub && i < l->n_body + l->n_short; i++) nn_layer_destroy(&l->sub[i]);
    pd_free(l->sub);
    l->sub = NULL;
}

size_t nn_layer_saved_bytes(const Layer *l, int n_max) {
    return l->ops->saved_bytes ? nn_align(l->ops->saved_bytes(l, n_max)) : 0;
}

int nn_layer_count_pt(const Layer *l) {
    int n = l->n_pt;
    for (int i = 0; i < l->n_body + l->n_short; i++) n += nn_layer_count_pt(&l->sub[i]);
    return n;
}

void nn_layer_collect_params(const Layer *l, size_t base, ParamInfo *out, int *n) {
    for (int k = 0; k < l->n_pt; k++) {
        out[*n] = l->pt[k];
        out[*n].offset += base;
        (*n)++;
    }
    for (int i = 0; i < l->n_body + l->n_short; i++) nn_layer_collect_params(&l->sub[i], base + l->sub[i].param_off, out, n);
}

void nn_layer_init_state(const Layer *l, float *state) {
    if (l->ops->init_state) l->ops->init_state(l, state);
    for (int i = 0; i < l->n_body + l->n_short; i++) nn_layer_init_state(&l->sub[i], state + l->sub[i].state_off);
}

/* Records the uid and init scheme of every tensor of l (same walk as nn_layer_collect_params). */
static void collect_uids(const Layer *l, uint64_t *out, NnInit *init, int *n) {
    for (int k = 0; k < l->n_pt; k++) {
        init[*n] = l->init[nn_init_role(l->pt[k].kind)];
        out[(*n)++] = l->uid;
    }
    for (int i = 0; i < l->n_body + l->n_short; i++) collect_uids(&l->sub[i], out, init, n);
}

/* The model's "init": {"<layer type>": {"weight": scheme, "bias": scheme}, ...}. */
static int parse_model_init(const cJSON *o, NnInit by_kind[][NN_INIT_ROLES], const char *src, Err *err) {
    if (!cJSON_IsObject(o))
        return err_set(err, PD_EINVAL, "%s: key \"init\": expected an object {\"<layer type>\": {\"weight\": ..., "
                       "\"bias\": ...}}", src);
    for (const cJSON *c = o->child; c; c = c->next) {
        int kind = -1;
        for (int k = 0; k < N_KINDS; k++)
            if (c->string && !strcmp(KINDS[k]->name, c->string)) kind = k;
        if (kind < 0)
            return err_set(err, PD_EINVAL, "%s: key \"init\": \"%s\" is not a layer type", src, c->string ? c->string : "?");
        char ctx[300];
        snprintf(ctx, sizeof ctx, "%s: key \"init\": \"%s\"", src, c->string);
        int rc = nn_init_parse_roles(c, by_kind[kind], ctx, err);
        if (rc) return rc;
    }
    return PD_OK;
}

/* Schemes the layer does not give come from the model's for its type. */
static void resolve_init(Layer *l, NnInit by_kind[][NN_INIT_ROLES]) {
    for (int k = 0; k < N_KINDS; k++)
        if (KINDS[k] == l->ops)
            for (int r = 0; r < NN_INIT_ROLES; r++)
                if (l->init[r].kind == NN_INIT_UNSET) l->init[r] = by_kind[k][r];
    for (int i = 0; i < l->n_body + l->n_short; i++) resolve_init(&l->sub[i], by_kind);
}

static void collect_tie_layers(const Layer *l, const Layer **out, int *n) {
    if (l->tie[0]) out[(*n)++] = l;
    for (int i = 0; i < l->n_body + l->n_short; i++) collect_tie_layers(&l->sub[i], out, n);
}

static int find_tensor(const Model *m, const char *name) {
    for (int k = 0; k < m->n_pt; k++)
        if (!strcmp(m->pt[k].name, name)) return k;
    return -1;
}

/* Every "tie" names an existing tensor of an EARLIER top-level layer with the shape of the
 * tying layer's weight; a tensor is the source of one tie at most and never both ends. */
static int resolve_ties(Model *m, Err *err) {
    const Layer **tl = pd_calloc(sizeof(Layer *) * (size_t)(m->n_pt + 1));
    int nt = 0;
    for (int i = 0; i < m->n; i++) collect_tie_layers(&m->layers[i], tl, &nt);
    m->tie = pd_calloc(sizeof(ParamTie) * (size_t)(nt + 1));
    int rc = PD_OK;
    for (int t = 0; t < nt && !rc; t++) {
        const Layer *l = tl[t];
        char wname[80];
        snprintf(wname, sizeof wname, "%s.weight", l->path);
        int dst = find_tensor(m, wname), src = find_tensor(m, l->tie);
        PD_ASSERT(dst >= 0);
        const ParamInfo *d = &m->pt[dst];
        if (src < 0) {
            rc = err_set(err, PD_EINVAL, "%s: layer %s (%s): key \"tie\": no parameter \"%s\" (names look like "
                         "\"layers.0.weight\", \"layers.3.body.0.weight\")",
                         m->src, l->path, l->ops->name, l->tie);
            break;
        }
        const ParamInfo *s = &m->pt[src];
        if (s->layer >= d->layer) {
            rc = err_set(err, PD_EINVAL, "%s: layer %s (%s): key \"tie\": %s belongs to %s top-level layer %d; a "
                         "layer can only tie to a parameter of an earlier top-level layer", m->src, l->path,
                         l->ops->name, l->tie, s->layer == d->layer ? "the same" : "the later", s->layer);
            break;
        }
        if (!shape_eq(s->shape, d->shape)) {
            rc = err_set(err, PD_EINVAL, "%s: layer %s (%s): key \"tie\": %s is %s, this layer's weight %s", m->src,
                         l->path, l->ops->name, l->tie, nn_shape_str(s->shape), nn_shape_str(d->shape));
            break;
        }
        for (int u = 0; u < m->n_tie && !rc; u++)
            if (m->tie[u].src == src || m->tie[u].dst == src)
                rc = err_set(err, PD_EINVAL, "%s: layer %s (%s): key \"tie\": %s is already %s (tie to the source "
                             "%s instead, once per source)", m->src, l->path, l->ops->name, l->tie,
                             m->tie[u].src == src ? "tied by another layer" : "tied itself",
                             m->pt[m->tie[u].src].name);
        if (!rc) m->tie[m->n_tie++] = (ParamTie){.src = src, .dst = dst};
    }
    for (int u = 0; u < m->n_tie && !rc; u++)   /* a mirror cannot be the source of a later tie */
        for (int v = 0; v < m->n_tie && !rc; v++)
            if (m->tie[v].src == m->tie[u].dst)
                rc = err_set(err, PD_EINVAL, "%s: %s ties to %s, which is tied itself: tie to %s", m->src,
                             m->pt[m->tie[v].dst].name, m->pt[m->tie[u].dst].name, m->pt[m->tie[u].src].name);
    pd_free(tl);
    return rc;
}

const ParamTie *model_ties(const Model *m, int *n) {
    *n = m->n_tie;
    return m->tie;
}

void model_tie_fold(const Model *m, int first, int last, float *dw) {
    size_t base = m->poff[first];
    for (int t = 0; t < m->n_tie; t++) {
        const ParamInfo *s = &m->pt[m->tie[t].src], *d = &m->pt[m->tie[t].dst];
        if (s->layer < first || d->layer >= last) continue;
        float *gs = dw + (s->offset - base), *gd = dw + (d->offset - base);
        size_t n = shape_numel(s->shape);
        for (size_t i = 0; i < n; i++) gd[i] = gs[i] = gs[i] + gd[i];
    }
}

double model_tie_mirror_sumsq(const Model *m, int first, int last, const float *dw) {
    size_t base = m->poff[first];
    double ss = 0.0;
    for (int t = 0; t < m->n_tie; t++) {
        const ParamInfo *d = &m->pt[m->tie[t].dst];
        if (d->layer < first || d->layer >= last) continue;
        const float *g = dw + (d->offset - base);
        for (size_t i = 0, n = shape_numel(d->shape); i < n; i++) ss += (double)g[i] * g[i];
    }
    return ss;
}

static int parse_shape(const cJSON *a, Shape *s, const char *src, Err *err) {
    if (!a || !cJSON_IsArray(a) || cJSON_GetArraySize(a) < 1 || cJSON_GetArraySize(a) > 3)
        return err_set(err, PD_EINVAL, "%s: key \"input\": expected an array of 1 to 3 positive integers", src);
    int d[3], k = 0;
    for (const cJSON *c = a->child; c; c = c->next) {
        if (!cJSON_IsNumber(c) || c->valuedouble != floor(c->valuedouble) || c->valuedouble < 1 ||
            c->valuedouble > 1e6)
            return err_set(err, PD_EINVAL, "%s: key \"input\": expected positive integers", src);
        d[k++] = (int)c->valuedouble;
    }
    *s = shape_make(k, d);
    return PD_OK;
}

Model *model_parse(const char *json, const char *name, Err *err) {
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        int line = 1;
        if (at)
            for (const char *p = json; p < at && *p; p++) line += *p == '\n';
        err_set(err, PD_EINVAL, "%s: line %d: invalid JSON", name, line);
        return NULL;
    }
    Model *m = pd_calloc(sizeof *m);
    snprintf(m->src, sizeof m->src, "%s", name);
    JObj j;
    const char *mname = NULL, *comment = NULL;
    NnInit by_kind[N_KINDS][NN_INIT_ROLES];
    memset(by_kind, 0, sizeof by_kind);
    int rc = jobj_init(&j, root, err, "%s", name);
    if (!rc) rc = jobj_str(&j, "name", 1, &mname, err);
    if (!rc) rc = jobj_str(&j, "comment", 0, &comment, err);
    if (!rc) {
        const cJSON *in = jobj_get(&j, "input");
        if (!in) rc = err_set(err, PD_EINVAL, "%s: missing required key \"input\"", name);
        else rc = parse_shape(in, &m->input, name, err);
    }
    const cJSON *layers = NULL;
    if (!rc) {
        layers = jobj_get(&j, "layers");
        if (!layers) rc = err_set(err, PD_EINVAL, "%s: missing required key \"layers\"", name);
        else if (!cJSON_IsArray(layers) || cJSON_GetArraySize(layers) == 0)
            rc = err_set(err, PD_EINVAL, "%s: key \"layers\": expected a non-empty array", name);
    }
    if (!rc) {
        const cJSON *ini = jobj_get(&j, "init");
        if (ini) rc = parse_model_init(ini, by_kind, name, err);
    }
    if (!rc) rc = jobj_done(&j, err);
    if (rc) goto fail;
    snprintf(m->name, sizeof m->name, "%s", mname);
    m->n = cJSON_GetArraySize(layers);
    m->layers = pd_calloc(sizeof(Layer) * (size_t)m->n);
    m->poff = pd_calloc(sizeof(size_t) * (size_t)(m->n + 1));
    m->soff = pd_calloc(sizeof(size_t) * (size_t)(m->n + 1));
    Shape cur = m->input;
    int i = 0;
    for (const cJSON *o = layers->child; o; o = o->next, i++) {
        char path[48], ctx[300];
        snprintf(path, sizeof path, "layers.%d", i);
        snprintf(ctx, sizeof ctx, "%s: layer %d", name, i);
        Layer *l = &m->layers[i];
        if ((rc = nn_layer_parse(l, o, cur, path, ctx, (uint64_t)i, i, err))) goto fail;
        l->param_off = m->poff[i];
        l->state_off = m->soff[i];
        m->poff[i + 1] = m->poff[i] + l->n_params;
        m->soff[i + 1] = m->soff[i] + l->n_state;
        cur = l->out;
    }
    for (i = 0; i < m->n; i++) m->n_pt += nn_layer_count_pt(&m->layers[i]);
    m->pt = pd_calloc(sizeof(ParamInfo) * (size_t)(m->n_pt + 1));
    m->pt_uid = pd_calloc(sizeof(uint64_t) * (size_t)(m->n_pt + 1));
    m->pt_init = pd_calloc(sizeof(NnInit) * (size_t)(m->n_pt + 1));
    int k = 0, ku = 0;
    for (i = 0; i < m->n; i++) {
        resolve_init(&m->layers[i], by_kind);
        nn_layer_collect_params(&m->layers[i], m->poff[i], m->pt, &k);
        collect_uids(&m->layers[i], m->pt_uid, m->pt_init, &ku);
    }
    PD_ASSERT(k == m->n_pt && ku == m->n_pt);
    if ((rc = resolve_ties(m, err))) goto fail;
    for (k = 0; k < m->n_pt; k++)
        if (nn_init_needs_fans(&m->pt_init[k]) && m->pt[k].shape.ndim < 2) {
            rc = err_set(err, PD_EINVAL, "%s: %s: init \"%s\" needs a tensor of 2 or more dimensions (its fans), "
                         "this one is %s", name, m->pt[k].name, nn_init_name(&m->pt_init[k]), nn_shape_str(m->pt[k].shape));
            goto fail;
        }
    cJSON_Delete(root);
    return m;
fail:
    cJSON_Delete(root);
    model_free(m);
    return NULL;
}

Model *model_load(const char *path, Err *err) {
    char *text = NULL;
    size_t len = 0;
    if (pd_read_file(path, 16u << 20, &text, &len, err)) return NULL;
    Model *m = model_parse(text, path, err);
    pd_free(text);
    return m;
}

void model_free(Model *m) {
    if (!m) return;
    for (int i = 0; m->layers && i < m->n; i++) nn_layer_destroy(&m->layers[i]);
    pd_free(m->layers);
    pd_free(m->poff);
    pd_free(m->soff);
    pd_free(m->pt);
    pd_free(m->pt_uid);
    pd_free(m->pt_init);
    pd_free(m->tie);
    pd_free(m->gbuf[0]);
    pd_free(m->gbuf[1]);
    pd_free(m);
}

const char *model_name(const Model *m) { return m->name; }
int model_n_layers(const Model *m) { return m->n; }
Shape model_input_shape(const Model *m) { return m->input; }
Shape model_layer_out_shape(const Model *m, int i) {
    PD_ASSERT(i >= 0 && i < m->n);
    return m->layers[i].out;
}
Shape model_layer_in_shape(const Model *m, int i) {
    PD_ASSERT(i >= 0 && i < m->n);
    return m->layers[i].in;
}
size_t model_layer_saved_bytes(const Model *m, int i, int n) {
    PD_ASSERT(i >= 0 && i < m->n && n >= 1);
    return nn_layer_saved_bytes(&m->layers[i], n);
}
const char *model_layer_type(const Model *m, int i) {
    PD_ASSERT(i >= 0 && i < m->n);
    return m->layers[i].ops->name;
}
double model_layer_flops(const Model *m, int i) {
    PD_ASSERT(i >= 0 && i < m->n);
    return m->layers[i].flops;
}
double model_flops(const Model *m) {
    double f = 0;
    for (int i = 0; i < m->n; i++) f += m->layers[i].flops;
    return f;
}

static void check_range(const Model *m, int first, int last) {
    PD_ASSERTF(first >= 0 && first <= last && last <= m->n, "range [%d, %d) of %d layers", first, last, m->n);
}
size_t model_param_count(const Model *m, int first, int last) {
    check_range(m, first, last);
    return m->poff[last] - m->poff[first];
}
size_t model_state_count(const Model *m, int first, int last) {
    check_range(m, first, last);
    return m->soff[last] - m->soff[first];
}
size_t model_param_offset(const Model *m, int i) {
    check_range(m, i, i);
    return m->poff[i];
}
size_t model_state_offset(const Model *m, int i) {
    check_range(m, i, i);
    return m->soff[i];
}
const ParamInfo *model_param_tensors(const Model *m, int *n) {
    *n = m->n_pt;
    return m->pt;
}

static void set_prec(Layer *l, int prec) {
    l->prec = prec;
    for (int i = 0; l->sub && i < l->n_body + l->n_short; i++) set_prec(&l->sub[i], prec);
}

void model_set_precision(Model *m, int prec) {
    PD_ASSERTF(prec >= 0 && prec < KPREC_COUNT, "precision %d", prec);
    if (prec == m->prec) return;
    for (int i = 0; i < m->n; i++) {
        nn_layer_release(&m->layers[i]);   // its descriptors were made for the old precision
        set_prec(&m->layers[i], prec);
    }
    m->prec = prec;
}

int model_precision(const Model *m) { return m->prec; }

int model_build(Model *m, int first, int last, int n_max, Err *err) {
    check_range(m, first, last);
    PD_ASSERT(n_max >= 1);
    if (kern_precision_check(m->prec, err)) return err_prefix(err, "%s", m->src);
    size_t need = 0;
    for (int i = first; i < last; i++) {
        Layer *l = &m->layers[i];
        int rc = nn_layer_build(l, n_max, err);
        if (rc) return err_prefix(err, "%s: layer %d", m->src, i);
        size_t a = (size_t)l->built_n * nn_numel(l->in);
        if (a > need) need = a;
    }
    if (need > m->gbuf_floats) {
        for (int k = 0; k < 2; k++) {
            pd_free(m->gbuf[k]);
            m->gbuf[k] = pd_alloc_f32(need);
        }
        m->gbuf_floats = need;
    }
    return PD_OK;
}

void model_init_params(const Model *m, int first, int last, uint64_t seed, float *w) {
    check_range(m, first, last);
    size_t base = m->poff[first];
    Rng r;
    uint64_t cur = UINT64_MAX;
    for (int k = 0; k < m->n_pt; k++) {
        const ParamInfo *p = &m->pt[k];
        if (p->layer < first || p->layer >= last) continue;
        if (m->pt_uid[k] != cur) {
            cur = m->pt_uid[k];
            rng_init(&r, seed, RNG_STREAM_INIT, cur);
        }
        nn_init_fill(&m->pt_init[k], p, &r, w + (p->offset - base));
    }
    /* a mirror gets its source's values: the source layer's stream drawn again up to it */
    for (int t = 0; t < m->n_tie; t++) {
        int src = m->tie[t].src;
        const ParamInfo *d = &m->pt[m->tie[t].dst];
        if (d->layer < first || d->layer >= last) continue;
        int k0 = src;
        while (k0 > 0 && m->pt_uid[k0 - 1] == m->pt_uid[src]) k0--;
        rng_init(&r, seed, RNG_STREAM_INIT, m->pt_uid[src]);
        for (int k = k0; k <= src; k++) {
            const ParamInfo *p = &m->pt[k];
            float *tmp = k == src ? w + (d->offset - base) : pd_alloc_f32(shape_numel(p->shape));
            nn_init_fill(&m->pt_init[k], p, &r, tmp);
            if (k != src) pd_free(tmp);
        }
    }
}

void model_init_state(const Model *m, int first, int last, float *state) {
    check_range(m, first, last);
    for (int i = first; i < last; i++) nn_layer_init_state(&m->layers[i], state + (m->soff[i] - m->soff[first]));
}

/* ---- per-minibatch context -------------------------------------------------------------- */
NnCtx *nnctx_new(const Model *m, int first, int last, int n_max) {
    check_range(m, first, last);
    PD_ASSERT(first < last && n_max >= 1);
    NnCtx *c = pd_calloc(sizeof *c);
    c->m = m;
    c->first = first;
    c->last = last;
    c->n_max = n_max;
    int nl = last - first;
    c->y = pd_calloc(sizeof(float *) * (size_t)nl);
    c->saved = pd_calloc(sizeof(void *) * (size_t)nl);
    c->lay = pd_calloc((size_t)nl);
    size_t bytes = nn_align((size_t)n_max * nn_numel(m->layers[first].in) * sizeof(float));
    for (int i = first; i < last; i++) {
        bytes += nn_align((size_t)n_max * nn_numel(m->layers[i].out) * sizeof(float));
        bytes += nn_layer_saved_bytes(&m->layers[i], n_max);
    }
    c->bytes = bytes;
    c->mem = pd_calloc(bytes);   /* zeroed: every page touched once, here */
    size_t at = 0;
    c->in = (float *)c->mem;
    at += nn_align((size_t)n_max * nn_numel(m->layers[first].in) * sizeof(float));
    for (int i = first; i < last; i++) {
        c->y[i - first] = (float *)(c->mem + at);
        at += nn_align((size_t)n_max * nn_numel(m->layers[i].out) * sizeof(float));
        size_t sb = nn_layer_saved_bytes(&m->layers[i], n_max);
        c->saved[i - first] = sb ? c->mem + at : NULL;
        at += sb;
    }
    PD_ASSERT(at == bytes);
    return c;
}

void nnctx_free(NnCtx *c) {
    if (!c) return;
    pd_free(c->mem);
    pd_free(c->y);
    pd_free(c->saved);
    pd_free(c->lay);
    pd_free(c);
}

size_t nnctx_bytes(const NnCtx *c) { return c->bytes; }
float *nnctx_input(NnCtx *c) { return c->in; }
const float *nnctx_output(const NnCtx *c) { return c->y[c->last - 1 - c->first]; }

void nn_sub_set(Layer *c, float *dk, int fresh, int n) {
    c->set = 0;
    if (!dk || !fresh) return;
    if (c->ops->sets & KSET_DX) c->set = KSET_DX;
    else memset(dk, 0, (size_t)n * shape_numel(c->in) * sizeof(float));
}

int nn_layer_layouts(const Layer *l) { return l->ops->layouts && l->built_n ? l->ops->layouts(l) : 0; }

/* Backwards: whether layer i's output is wanted blocked (its consumer reads it so, through a
 * chain of layout-preserving layers); then forwards: what each layer gets and gives. */
int nn_plan_layouts(const Layer *ls, int n, int xb, int yb, unsigned char *lay) {
    int want = yb;
    for (int i = n - 1; i >= 0; i--) {
        const int cap = nn_layer_layouts(&ls[i]);
        lay[i] = (unsigned char)want;   // for now: is the output wanted blocked
        want = (cap & NN_BLK_IN) && (!(cap & NN_BLK_SAME) || want);
    }
    for (int i = 0; i < n; i++) {
        const int cap = nn_layer_layouts(&ls[i]);
        if (xb && !(cap & NN_BLK_IN)) return 0;
        const int ob = cap & NN_BLK_SAME ? xb : lay[i] && (cap & NN_BLK_OUT);
        lay[i] = (unsigned char)((xb ? KCONV_X_BLK : 0) | (ob ? KCONV_Y_BLK : 0));
        xb = ob;
    }
    return xb == !!yb;
}

/* Which activations inside c's range stay in the blocked layout (nn_plan_layouts with plain
 * ends unless nnctx_set_ends says otherwise, so that stages, checkpoints and the loss see
 * plain data). Computed per forward from the built layers (cheap); the backward uses the
 * same. Without it every oneDNN convolution reorders its input, output and gradients to and
 * from NCHW: vgg16 ~9 ms of a 78 ms step. */
static void plan_layouts(const Model *m, NnCtx *c) {
    const int ok = nn_plan_layouts(m->layers + c->first, c->last - c->first, c->xb, c->yb, c->lay);
    PD_ASSERTF(ok, "layers [%d, %d) no longer meet the ends %d, %d", c->first, c->last, c->xb, c->yb);
}

void model_cut_layouts(const Model *m, int first, int last, const unsigned char *cut, unsigned char *ends) {
    check_range(m, first, last);
    for (int a = first; a < last;) {   /* each piece [a, b): plain ends are always possible */
        int b = a + 1;
        while (b < last && !(cut && cut[b - 1 - first])) b++;
        const int ok = nn_plan_layouts(m->layers + a, b - a, 0, 0, ends + (a - first));
        PD_ASSERT(ok);
        for (int i = a; i < b; i++) {
            const int l = ends[i - first];
            ends[i - first] = (unsigned char)((l & KCONV_X_BLK ? NN_END_X : 0) | (l & KCONV_Y_BLK ? NN_END_Y : 0));
        }
        a = b;
    }
}

int nnctx_set_ends(NnCtx *c, int x_blocked, int y_blocked) {   /* c->lay: planned again by each forward */
    const int ok = nn_plan_layouts(c->m->layers + c->first, c->last - c->first, !!x_blocked, !!y_blocked, c->lay);
    if (ok) c->xb = !!x_blocked, c->yb = !!y_blocked;
    return ok;
}

const float *model_forward(Model *m, NnCtx *c, const float *w, float *state, const float *x, const NnRun *run) {
    PD_ASSERT(c->m == m);
    PD_ASSERTF(run->n >= 1 && run->n <= c->n_max, "n %d, ctx n_max %d", run->n, c->n_max);
    int f = c->first;
    if (x != c->in) memcpy(c->in, x, (size_t)run->n * nn_numel(m->layers[f].in) * sizeof(float));
    c->run = *run;
    plan_layouts(m, c);
    for (int i = f; i < c->last; i++) {
        Layer *l = &m->layers[i];
        l->lay = c->lay[i - f];
        PD_ASSERTF(l->built_n >= run->n, "layer %d built for %d samples, run with %d", i, l->built_n, run->n);
        PD_ASSERT(state || l->n_state == 0);
        const float *xi = i == f ? c->in : c->y[i - 1 - f];
        l->ops->forward(l, run, w + (m->poff[i] - m->poff[f]), state ? state + (m->soff[i] - m->soff[f]) : NULL, xi,
                        c->y[i - f], c->saved[i - f]);
    }
    c->have_fwd = 1;
    return nnctx_output(c);
}

void model_backward(Model *m, NnCtx *c, const float *w, const float *dy, float *dx, float *dw) {
    model_backward_hook(m, c, w, dy, dx, dw, NULL, NULL);
}

/* Whether the gradient w.r.t. layer i's input is wanted in a backward over [f, ...): by the
 * caller (dx) or by a layer below i with parameters. As in PyTorch, where the data needs no
 * gradient, the input stage's first parameterised layer then skips its input-gradient pass
 * (mlp: one of its three big GEMMs) and the parameter-free layers before it do nothing. */
static int wants_dx(const Model *m, int f, int i, const float *dx) { return dx || m->poff[i] > m->poff[f]; }

void model_grads_discard(Model *m, int first, int last) {
    check_range(m, first, last);
    for (int i = first; i < last; i++) m->layers[i].dw_discarded = m->layers[i].n_params > 0;
}

void model_grads_settle(Model *m, int first, int last, float *dw) {
    check_range(m, first, last);
    for (int i = first; i < last; i++)
        if (m->layers[i].dw_discarded) {
            memset(dw + (m->poff[i] - m->poff[first]), 0, (m->poff[i + 1] - m->poff[i]) * sizeof(float));
            m->layers[i].dw_discarded = 0;
        }
}

/* Before layer i's backward into dx (the input gradient, NULL: none) and dw (its part of the
 * gradient buffer, NULL: not this call): tells the layer what to write rather than add to
 * (l->set), zeroing what it cannot write itself. own_dx: dx is model.c's buffer, whose old
 * contents are not wanted (the caller's dx is added to). */
static void prepare_backward(const Model *m, Layer *l, int i, float *dx, int own_dx, float *dw, int n) {
    l->set = 0;
    if (dx && own_dx) {
        if (l->ops->sets & KSET_DX) l->set |= KSET_DX;
        else memset(dx, 0, (size_t)n * nn_numel(l->in) * sizeof(float));
    }
    if (dw && l->dw_discarded) {
        if (l->ops->sets & KSET_DW) l->set |= KSET_DW;
        else memset(dw, 0, (m->poff[i + 1] - m->poff[i]) * sizeof(float));
        l->dw_discarded = 0;
    }
}

void model_backward_hook(Model *m, NnCtx *c, const float *w, const float *dy, float *dx, float *dw,
                         NnLayerDone done, void *arg) {
    PD_ASSERT(c->m == m && c->have_fwd);
    int f = c->first, n = c->run.n;
    const float *g = dy;
    for (int i = c->last - 1; i >= f; i--) {
        Layer *l = &m->layers[i];
        const float *xi = i == f ? c->in : c->y[i - 1 - f];
        int need = wants_dx(m, f, i, dx);
        if (!need && l->n_params == 0) {   /* nothing below wants anything from it */
            if (done) done(arg, i);
            continue;
        }
        float *dxi = need ? dx : NULL;
        if (i > f && need) {
            dxi = m->gbuf[i & 1];
            PD_ASSERT(dxi != g);
        }
        float *dwi = dw + (m->poff[i] - m->poff[f]);
        prepare_backward(m, l, i, dxi, i > f, dwi, n);
        l->lay = c->lay[i - f];
        l->ops->backward(l, &c->run, w + (m->poff[i] - m->poff[f]), xi, c->y[i - f], c->saved[i - f], g, dxi, dwi);
        if (done) done(arg, i);
        g = dxi;
    }
}

/* ---- the split backward (zero-bubble BI and BW) ---------------------------------------------- */

/* Layer i's weight gradient is computed in the weight pass: it has parameters and the split. */
static int splits(const Layer *l) { return l->n_params > 0 && l->ops->backward_weights; }

/* Floats of keep before the region of layer i (the gradient w.r.t. its output) in the layout
 * of model_split_floats: one region per splitting layer of [first, last - 1), in layer order,
 * each n_max x its output, 16-float aligned. The last layer's is the caller's dy. */
static size_t keep_off(const Model *m, int first, int i, int n_max) {
    size_t off = 0;
    for (int k = first; k < i; k++)
        if (splits(&m->layers[k])) off += nn_align((size_t)n_max * nn_numel(m->layers[k].out) * sizeof(float)) / sizeof(float);
    return off;
}

int model_layer_splits(const Model *m, int i) {
    check_range(m, i, i + 1);
    return splits(&m->layers[i]);
}

size_t model_split_floats(const Model *m, int first, int last, int n_max) {
    check_range(m, first, last);
    return first < last ? keep_off(m, first, last - 1, n_max) : 0;
}

void model_backward_b(Model *m, NnCtx *c, const float *w, const float *dy, float *dx, float *dw, float *keep) {
    PD_ASSERT(c->m == m && c->have_fwd);
    int f = c->first, n = c->run.n;
    const float *g = dy;
    for (int i = c->last - 1; i >= f; i--) {
        Layer *l = &m->layers[i];
        const float *xi = i == f ? c->in : c->y[i - 1 - f];
        const float *wi = w + (m->poff[i] - m->poff[f]);
        /* the input gradient goes where the layer below reads it: kept when that one splits */
        int need = wants_dx(m, f, i, dx);
        if (!need && (l->n_params == 0 || splits(l))) continue;   /* its weight pass is BW's */
        float *dxi = need ? dx : NULL;
        if (i > f && need) {
            dxi = splits(&m->layers[i - 1]) ? keep + keep_off(m, f, i - 1, c->n_max) : m->gbuf[i & 1];
            PD_ASSERT(dxi != g);
        }
        float *dwi = splits(l) ? NULL : dw + (m->poff[i] - m->poff[f]);
        prepare_backward(m, l, i, dxi, i > f, dwi, n);
        l->lay = c->lay[i - f];
        if (splits(l))
            l->ops->backward_data(l, &c->run, wi, xi, c->y[i - f], c->saved[i - f], g, dxi);
        else
            l->ops->backward(l, &c->run, wi, xi, c->y[i - f], c->saved[i - f], g, dxi, dwi);
        g = dxi;
    }
}

void model_backward_w(Model *m, NnCtx *c, const float *w, const float *dy, const float *keep, float *dw,
                      NnLayerDone done, void *arg) {
    PD_ASSERT(c->m == m && c->have_fwd);
    int f = c->first;
    for (int i = c->last - 1; i >= f; i--) {
        Layer *l = &m->layers[i];
        if (splits(l)) {
            const float *g = i == c->last - 1 ? dy : keep + keep_off(m, f, i, c->n_max);
            float *dwi = dw + (m->poff[i] - m->poff[f]);
            prepare_backward(m, l, i, NULL, 0, dwi, c->run.n);
            l->lay = c->lay[i - f];
            l->ops->backward_weights(l, &c->run, w + (m->poff[i] - m->poff[f]), i == f ? c->in : c->y[i - 1 - f],
                                     c->y[i - f], c->saved[i - f], g, dwi);
        }
        if (done) done(arg, i);
    }
}
