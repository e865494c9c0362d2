/* transformer_dnnl.c: the oneDNN 2.6 candidates of the transformer kernels (C API): layer
 * normalization (forward training + backward, scale and shift) and softmax (forward + backward,
 * over the last axis of a (rows, cols) matrix). Used by transformer.c when a descriptor's
 * algorithm is KTF_DNNL.
 *
 * Primitives depend on the row count, which follows the call's minibatch size: two row counts
 * are cached per descriptor, rows_max (created in init) and the last other one (created on
 * first use: the only allocation after init, once per change of size, e.g. for the last,
 * smaller batch of an epoch), as conv_dnnl.c does. Memory objects are created with the
 * primitives and get the caller's buffers per call (dnnl_memory_set_data_handle). oneDNN
 * writes its outputs (=); the accumulating (+=) gradients of our contract go through
 * descriptor-owned scratch and a loop. */
#include <math.h>
#include <string.h>

#include "kernels_impl.h"
#include "transformer_impl.h"


enum { MAX_MEM = 10 };

typedef struct Slot {
    int rows;                    /* 0 = empty */
    dnnl_primitive_t fwd, bwd;
    /* layer norm: 0 src, 1 dst, 2 scale, 3 shift, 4 mean, 5 variance, 6 diff_dst, 7 diff_src,
     * 8 diff_scale, 9 diff_shift; softmax: 0 src, 1 dst, 2 diff_dst, 3 diff_src */
    dnnl_memory_t mem[MAX_MEM];
} Slot;

struct TfDnnl {
    int kind;                    /* 0 layer norm, 1 softmax */
    int cols;
    float eps;
    Slot slot[2];                /* [0]: rows_max, [1]: the last other row count */
};

static void slot_free(Slot *s) {
    if (s->fwd) dnnl_primitive_destroy(s->fwd);
    if (s->bwd) dnnl_primitive_destroy(s->bwd);
    for (int i = 0; i < MAX_MEM; i++)
        if (s->mem[i]) dnnl_memory_destroy(s->mem[i]);
    memset(s, 0, sizeof *s);
}

static int slot_init(TfDnnl *t, Slot *s, int rows, Err *err) {
    const char *what = t->kind == 0 ? "layernorm" : "softmax";
    int rc = PD_OK;
    dnnl_primitive_desc_t fpd = NULL, bpd = NULL;
    memset(s, 0, sizeof *s);
    s->rows = rows;
    dnnl_dims_t dd = {rows, t->cols}, vd = {t->cols}, md_ = {rows};
    dnnl_memory_desc_t data, vec, stat;
    KDNNL_CK(what, dnnl_memory_desc_init_by_tag(&data, 2, dd, dnnl_f32, dnnl_ab));
    KDNNL_CK(what, dnnl_memory_desc_init_by_tag(&vec, 1, vd, dnnl_f32, dnnl_a));
    KDNNL_CK(what, dnnl_memory_desc_init_by_tag(&stat, 1, md_, dnnl_f32, dnnl_a));
    if (t->kind == 0) {
        dnnl_layer_normalization_desc_t fd, bd;
        unsigned flags = dnnl_use_scale | dnnl_use_shift;
        KDNNL_CK(what, dnnl_layer_normalization_forward_desc_init(&fd, dnnl_forward_training, &data, &stat, t->eps, flags));
        KDNNL_CK(what, dnnl_primitive_desc_create(&fpd, &fd, NULL, kern_dnnl_engine(), NULL));
        KDNNL_CK(what, dnnl_layer_normalization_backward_desc_init(&bd, dnnl_backward, &data, &data, &stat, t->eps, flags));
        KDNNL_CK(what, dnnl_primitive_desc_create(&bpd, &bd, NULL, kern_dnnl_engine(), fpd));
        const dnnl_memory_desc_t *mds[MAX_MEM] = {&data, &data, &vec, &vec, &stat, &stat, &data, &data, &vec, &vec};
        for (int i = 0; i < MAX_MEM; i++) KDNNL_CK(what, dnnl_memory_create(&s->mem[i], mds[i], kern_dnnl_engine(), DNNL_MEMORY_NONE));
    } else {
        dnnl_softmax_v2_desc_t fd, bd;
        KDNNL_CK(what, dnnl_softmax_v2_forward_desc_init(&fd, dnnl_forward_training, dnnl_softmax_accurate, &data, &data, 1));
        KDNNL_CK(what, dnnl_primitive_desc_create(&fpd, &fd, NULL, kern_dnnl_engine(), NULL));
        KDNNL_CK(what, dnnl_softmax_v2_backward_desc_init(&bd, dnnl_softmax_accurate, &data, &data, &data, 1));
        KDNNL_CK(what, dnnl_primitive_desc_create(&bpd, &bd, NULL, kern_dnnl_engine(), fpd));
        for (int i = 0; i < 4; i++) KDNNL_CK(what, dnnl_memory_create(&s->mem[i], &data, kern_dnnl_engine(), DNNL_MEMORY_NONE));
    }
    KDNNL_CK(what, dnnl_primitive_create(&s->fwd, fpd));
    KDNNL_CK(what, dnnl_primitive_create(&s->bwd, bpd));
done:
    if (fpd) dnnl_primitive_desc_destroy(fpd);
    if (bpd) dnnl_primitive_desc_destroy(bpd);
    if (rc) slot_free(s);
    return rc;
}

static Slot *slot_for(TfDnnl *t, int rows) {
    if (t->slot[0].rows == rows) return &t->slot[0];
    if (t->slot[1].rows != rows) {
        slot_free(&t->slot[1]);
        Err err = {0};
        int rc = slot_init(t, &t->slot[1], rows, &err);
        PD_ASSERTF(rc == PD_OK, "%s", err.msg);   // the shape init accepted, another row count
    }
    return &t->slot[1];
}

static int tf_new(TfDnnl **out, int kind, int rows_max, int cols, float eps, Err *err) {
    TfDnnl *t = pd_calloc(sizeof *t);
    t->kind = kind;
    t->cols = cols;
    t->eps = eps;
    int rc = slot_init(t, &t->slot[0], rows_max, err);
    if (rc) {
        tf_dnnl_free(t);
        t = NULL;
    }
    *out = t;
    return rc;
}

int tf_dnnl_layernorm_new(TfDnnl **out, int rows_max, int d, float eps, Err *err) {
    return tf_new(out, 0, rows_max, d, eps, err);
}

int tf_dnnl_softmax_new(TfDnnl **out, int rows_max, int cols, Err *err) { return tf_new(out, 1, rows_max, cols, 0, err); }

void tf_dnnl_free(TfDnnl *t) {
    if (!t) return;
    slot_free(&t->slot[0]);
    slot_free(&t->slot[1]);
    pd_free(t);
}

static void run(TfDnnl *t, dnnl_primitive_t p, int n, const dnnl_exec_arg_t *args, const void *const *ptr) {
    for (int i = 0; i < n; i++) KDNNL_RUN(dnnl_memory_set_data_handle(args[i].memory, (void *)ptr[i]));
    KDNNL_RUN(dnnl_primitive_execute(p, kern_dnnl_stream(), n, args));
    KDNNL_RUN(dnnl_stream_wait(kern_dnnl_stream()));
}

void tf_dnnl_layernorm_fwd(TfDnnl *t, int rows, const float *x, const float *g, const float *b, float *y, float *mean,
                           float *var) {
    Slot *s = slot_for(t, rows);
    dnnl_exec_arg_t a[6] = {{DNNL_ARG_SRC, s->mem[0]},   {DNNL_ARG_DST, s->mem[1]},  {DNNL_ARG_SCALE, s->mem[2]},
                            {DNNL_ARG_SHIFT, s->mem[3]}, {DNNL_ARG_MEAN, s->mem[4]}, {DNNL_ARG_VARIANCE, s->mem[5]}};
    const void *p[6] = {x, y, g, b, mean, var};
    run(t, s->fwd, 6, a, p);
}

void tf_dnnl_layernorm_bwd(TfDnnl *t, int rows, const float *x, const float *g, const float *mean, const float *var,
                           const float *dy, float *dx, float *dg, float *db) {
    Slot *s = slot_for(t, rows);
    dnnl_exec_arg_t a[9] = {{DNNL_ARG_SRC, s->mem[0]},        {DNNL_ARG_SCALE, s->mem[2]},
                            {DNNL_ARG_SHIFT, s->mem[3]},      {DNNL_ARG_MEAN, s->mem[4]},
                            {DNNL_ARG_VARIANCE, s->mem[5]},   {DNNL_ARG_DIFF_DST, s->mem[6]},
                            {DNNL_ARG_DIFF_SRC, s->mem[7]},   {DNNL_ARG_DIFF_SCALE, s->mem[8]},
                            {DNNL_ARG_DIFF_SHIFT, s->mem[9]}};
    const void *p[9] = {x, g, g, mean, var, dy, dx, dg, db};   // shift: unread, any valid buffer
    run(t, s->bwd, 9, a, p);
}

void tf_dnnl_softmax_fwd(TfDnnl *t, int rows, const float *x, float *y) {
    Slot *s = slot_for(t, rows);
    dnnl_exec_arg_t a[2] = {{DNNL_ARG_SRC, s->mem[0]}, {DNNL_ARG_DST, s->mem[1]}};
    const void *p[2] = {x, y};
    run(t, s->fwd, 2, a, p);
}

void tf_dnnl_softmax_bwd(TfDnnl *t, int rows, const float *y, const float *dy, float *dx) {
    Slot *s = slot_for(t, rows);
    dnnl_exec_arg_t a[3] = {{DNNL_ARG_DST, s->mem[1]}, {DNNL_ARG_DIFF_DST, s->mem[2]}, {DNNL_ARG_DIFF_SRC, s->mem[3]}};
    const void *p[3] = {y, dy, dx};
    run(t, s->bwd, 3, a, p);
}

/* ---- attention's batched matrix products ------------------------------------------------------ *
 * Six matmul primitives over all (sample, head) pairs at once, on strided views of the fused
 * qkv buffer (N, T, 3D) and of y / dy (N, T, D), no copies: scores P = scale Q K^T, values
 * Y = P V; backward dP = dY V^T, dV = P^T dY, dQ = scale dS K, dK = scale dS^T Q (each writes
 * its own third of dqkv's columns, so dqkv needs no zeroing first). Their scratchpads are ours
 * (one buffer for all); the gemm oneDNN runs inside still takes a packing buffer from malloc
 * per call (see transformer.c). */
enum { MM_SCORES, MM_VALUES, MM_DP, MM_DV, MM_DQ, MM_DK, MM_VALUES_B, MM_COUNT };   /* _B: y in dt */

typedef struct MmSlot {
    int n;   /* 0 = empty */
    dnnl_primitive_t p[MM_COUNT];
    dnnl_memory_t src[MM_COUNT], wei[MM_COUNT], dst[MM_COUNT], sp[MM_COUNT];
} MmSlot;

struct TfAttn {
    int t, heads, hd;
    dnnl_data_type_t dt;   /* of every src and weights (f32, or bf16); dst is always f32 */
    float scale;
    void *scratch;
    size_t scratch_bytes;
    MmSlot slot[2];
};

static void mm_free(MmSlot *s) {
    for (int i = 0; i < MM_COUNT; i++) {
        if (s->p[i]) dnnl_primitive_destroy(s->p[i]);
        dnnl_memory_t m[4] = {s->src[i], s->wei[i], s->dst[i], s->sp[i]};
        for (int k = 0; k < 4; k++)
            if (m[k]) dnnl_memory_destroy(m[k]);
    }
    memset(s, 0, sizeof *s);
}

/* A (n, H, r, c) view: strides for a buffer of rows of `ld` floats per position, T positions per
 * sample, head h at column h*hd; transposed: the last two dimensions swapped. */
static int view(dnnl_memory_desc_t *md, const TfAttn *a, int n, int ld, int trans, dnnl_data_type_t dt) {
    const int T = a->t, hd = a->hd;
    dnnl_dims_t d = {n, a->heads, trans ? hd : T, trans ? T : hd};
    dnnl_dims_t s = {(dnnl_dim_t)T * ld, hd, trans ? 1 : ld, trans ? ld : 1};
    return dnnl_memory_desc_init_by_strides(md, 4, d, dt, s) != dnnl_success;
}

static int probs(dnnl_memory_desc_t *md, const TfAttn *a, int n, int trans, dnnl_data_type_t dt) {   // (n, H, T, T)
    const int T = a->t;
    dnnl_dims_t d = {n, a->heads, T, T}, s = {(dnnl_dim_t)a->heads * T * T, (dnnl_dim_t)T * T, trans ? 1 : T,
                                                trans ? T : 1};
    return dnnl_memory_desc_init_by_strides(md, 4, d, dt, s) != dnnl_success;
}

static int mm_init(TfAttn *a, MmSlot *s, int n, Err *err) {
    const char *what = "attention matmul";
    int rc = PD_OK;
    memset(s, 0, sizeof *s);
    s->n = n;
    const int D = a->heads * a->hd, L = 3 * D;
    /* operands (src, weights) in a->dt; destinations (suffix f) always f32 */
    dnnl_memory_desc_t qkv, qkvT, o, P, PT, qkvf, Pf, of;
    const dnnl_data_type_t dt = a->dt;
    if (view(&qkv, a, n, L, 0, dt) || view(&qkvT, a, n, L, 1, dt) || view(&o, a, n, D, 0, dt) ||
        probs(&P, a, n, 0, dt) || probs(&PT, a, n, 1, dt) || view(&qkvf, a, n, L, 0, dnnl_f32) ||
        view(&of, a, n, D, 0, dnnl_f32) || probs(&Pf, a, n, 0, dnnl_f32))
        return err_set(err, PD_EINVAL, "attention (oneDNN): memory descriptors rejected");
    /* src, weights, dst, scaled */
    const struct { const dnnl_memory_desc_t *s, *w, *d; int scaled; } spec[MM_COUNT] = {
        [MM_SCORES] = {&qkv, &qkvT, &Pf, 1}, [MM_VALUES] = {&P, &qkv, &of, 0},
        [MM_DP] = {&o, &qkvT, &Pf, 0},       [MM_DV] = {&PT, &o, &qkvf, 0},
        [MM_DQ] = {&P, &qkv, &qkvf, 1},      [MM_DK] = {&PT, &qkv, &qkvf, 1},
        [MM_VALUES_B] = {&P, &qkv, &o, 0},
    };
    for (int i = 0; i < MM_COUNT && !rc; i++) {
        dnnl_primitive_attr_t attr = NULL;
        dnnl_primitive_desc_t pd = NULL;
        dnnl_matmul_desc_t md;
        KDNNL_CK(what, dnnl_primitive_attr_create(&attr));
        KDNNL_CK(what, dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
        if (spec[i].scaled) KDNNL_CK(what, dnnl_primitive_attr_set_output_scales(attr, 1, 0, &a->scale));
        KDNNL_CK(what, dnnl_matmul_desc_init(&md, spec[i].s, spec[i].w, NULL, spec[i].d));
        KDNNL_CK(what, dnnl_primitive_desc_create(&pd, &md, attr, kern_dnnl_engine(), NULL));
        KDNNL_CK(what, dnnl_primitive_create(&s->p[i], pd));
        KDNNL_CK(what, dnnl_memory_create(&s->src[i], spec[i].s, kern_dnnl_engine(), DNNL_MEMORY_NONE));
        KDNNL_CK(what, dnnl_memory_create(&s->wei[i], spec[i].w, kern_dnnl_engine(), DNNL_MEMORY_NONE));
        KDNNL_CK(what, dnnl_memory_create(&s->dst[i], spec[i].d, kern_dnnl_engine(), DNNL_MEMORY_NONE));
        const dnnl_memory_desc_t *spd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        size_t need = spd ? dnnl_memory_desc_get_size(spd) : 0;
        if (need > a->scratch_bytes) {   // grows only while slots are created (init, a new n)
            pd_free(a->scratch);
            a->scratch = pd_alloc(need);
            a->scratch_bytes = need;
        }
        if (need) KDNNL_CK(what, dnnl_memory_create(&s->sp[i], spd, kern_dnnl_engine(), DNNL_MEMORY_NONE));
    done:
        if (pd) dnnl_primitive_desc_destroy(pd);
        if (attr) dnnl_primitive_attr_destroy(attr);
    }
    if (rc) mm_free(s);
    return rc;
}

int tf_dnnl_attn_new(TfAttn **out, int n_max, int t, int heads, int hd, int bf16, Err *err) {
    TfAttn *a = pd_calloc(sizeof *a);
    a->t = t;
    a->heads = heads;
    a->hd = hd;
    a->dt = bf16 ? dnnl_bf16 : dnnl_f32;
    a->scale = 1.0f / sqrtf((float)hd);
    int rc = mm_init(a, &a->slot[0], n_max, err);
    if (rc) {
        tf_dnnl_attn_free(a);
        a = NULL;
    }
    *out = a;
    return rc;
}

void tf_dnnl_attn_free(TfAttn *a) {
    if (!a) return;
    mm_free(&a->slot[0]);
    mm_free(&a->slot[1]);
    pd_free(a->scratch);
    pd_free(a);
}

void tf_dnnl_attn_mm(TfAttn *a, int which, int n, const void *src, const void *wei, void *dst) {
    MmSlot *s = &a->slot[0];
    if (s->n != n) {
        s = &a->slot[1];
        if (s->n != n) {
            mm_free(s);
            Err err = {0};
            int rc = mm_init(a, s, n, &err);
            PD_ASSERTF(rc == PD_OK, "%s", err.msg);
        }
    }
    KDNNL_RUN(dnnl_memory_set_data_handle(s->src[which], (void *)src));
    KDNNL_RUN(dnnl_memory_set_data_handle(s->wei[which], (void *)wei));
    KDNNL_RUN(dnnl_memory_set_data_handle(s->dst[which], dst));
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, s->src[which]}, {DNNL_ARG_WEIGHTS, s->wei[which]},
                               {DNNL_ARG_DST, s->dst[which]}, {DNNL_ARG_SCRATCHPAD, s->sp[which]}};
    int na = 3;
    if (s->sp[which]) {
        KDNNL_RUN(dnnl_memory_set_data_handle(s->sp[which], a->scratch));
        na = 4;
    }
    KDNNL_RUN(dnnl_primitive_execute(s->p[which], kern_dnnl_stream(), na, args));
    KDNNL_RUN(dnnl_stream_wait(kern_dnnl_stream()));
}
