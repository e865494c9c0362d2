/* linear_bf16.c: the precision switch's small helpers (names, float32 -> bfloat16 rounding)
 * and the linear descriptor (KLinear): float32 calls the plain kernels, bf16 runs oneDNN
 * matmul primitives (C API) on bf16 copies of the operands:
 *   forward        y (M, O)   = xb (M, I) · Wb^T (I, O) + b      (W^T: a strided view of W)
 *   backward data  dx (M, I) += dyb (M, O) · Wb (O, I)           (sum post-op)
 *   backward w     dW (O, I) += dyb^T (O, M) · xb (M, I)         (dy^T: a strided view)
 * and the two backward ones again writing (=, no post-op) for KSET_*, all accumulating in
 * float32 into float32 outputs but the forward again writing bf16 (kern_linear_fwd_kb); db is summed in float32 by a loop (the
 * same pass that makes dy's bf16 copy, when one is needed).
 * The bf16 copies (x, W, dy) and the primitives' scratchpad live in the calling thread's
 * KSCR_BF16 scratch (kern_scratch), asked for at its largest in init, so a model's linear
 * layers share one arena per thread and nothing is allocated per call. Primitives depend on
 * M (the call's rows): those for n_max rows are made in init, those for the last other count
 * on first use (the one allocation after init, as conv_dnnl.c does). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif
#include <pthread.h>
#include <string.h>

#include "kernels_impl.h"

/* ---- precision names and conversion ------------------------------------------------------ */
static const char *const PREC_NAMES[KPREC_COUNT] = {"fp32", "bf16"};

int kern_precision_parse(const char *s) {
    for (int i = 0; s && i < KPREC_COUNT; i++)
        if (strcmp(s, PREC_NAMES[i]) == 0) return i;
    return -1;
}

const char *kern_precision_name(int prec) { return prec >= 0 && prec < KPREC_COUNT ? PREC_NAMES[prec] : "?"; }

/* ---- whether this CPU runs bf16 ----------------------------------------------------------- */
/* oneDNN 2.6 has bf16 convolutions and matrix products only from AVX-512 up (avx512_core; the
 * bf16 instructions of avx512_core_bf16 or AMX make them fast); on an AVX2 CPU creating one fails
 * with "unimplemented". The probe asks for the primitives the bf16 path uses, a matmul and a
 * convolution on tiny shapes, once per process. */
static pthread_once_t g_bf16_once = PTHREAD_ONCE_INIT;
static int g_bf16_ok;

static int probe_pd(dnnl_engine_t eng, int conv) {
    dnnl_memory_desc_t a, b, c;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st;
    if (conv) {
        dnnl_dims_t src = {2, 16, 8, 8}, wei = {16, 16, 3, 3}, dst = {2, 16, 8, 8}, s1 = {1, 1}, p1 = {1, 1};
        dnnl_convolution_desc_t d;
        st = dnnl_memory_desc_init_by_tag(&a, 4, src, dnnl_bf16, dnnl_format_tag_any);
        if (st == dnnl_success) st = dnnl_memory_desc_init_by_tag(&b, 4, wei, dnnl_bf16, dnnl_format_tag_any);
        if (st == dnnl_success) st = dnnl_memory_desc_init_by_tag(&c, 4, dst, dnnl_f32, dnnl_format_tag_any);
        if (st == dnnl_success)
            st = dnnl_convolution_forward_desc_init(&d, dnnl_forward_training, dnnl_convolution_direct, &a, &b, NULL,
                                                    &c, s1, p1, p1);
        if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &d, NULL, eng, NULL);
    } else {
        dnnl_dims_t x = {16, 16}, w = {16, 16}, y = {16, 16};
        dnnl_matmul_desc_t d;
        st = dnnl_memory_desc_init_by_tag(&a, 2, x, dnnl_bf16, dnnl_ab);
        if (st == dnnl_success) st = dnnl_memory_desc_init_by_tag(&b, 2, w, dnnl_bf16, dnnl_ab);
        if (st == dnnl_success) st = dnnl_memory_desc_init_by_tag(&c, 2, y, dnnl_f32, dnnl_ab);
        if (st == dnnl_success) st = dnnl_matmul_desc_init(&d, &a, &b, NULL, &c);
        if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &d, NULL, eng, NULL);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    return st == dnnl_success;
}

static void bf16_probe(void) {
    g_bf16_ok = probe_pd(kern_dnnl_engine(), 0) && probe_pd(kern_dnnl_engine(), 1);
}

int kern_bf16_available(void) {
    pthread_once(&g_bf16_once, bf16_probe);
    return g_bf16_ok;
}

const char *kern_cpu_isa(void) {
    const char *s = dnnl_cpu_isa2str(dnnl_get_effective_cpu_isa());   // "cpu_isa_avx2"
    return strncmp(s, "cpu_isa_", 8) ? s : s + 8;
}

int kern_precision_check(int prec, Err *err) {
    PD_ASSERTF(prec >= 0 && prec < KPREC_COUNT, "precision %d", prec);
    if (prec != KPREC_BF16 || kern_bf16_available()) return PD_OK;
    return err_set(err, PD_EINVAL,
                   "bf16 compute is not available on this CPU: oneDNN runs bf16 convolutions and matrix products "
                   "only on AVX-512 CPUs, and this one's widest instructions are %s; use --precision fp32 (--wire "
                   "bf16 works on any CPU)",
                   kern_cpu_isa());
}

typedef struct CvtJob {
    const float *x;
    uint16_t *y;
} CvtJob;

static void cvt_r(void *p, size_t b, size_t e) {
    const CvtJob *j = p;
    pd_bf16_pack(j->x + b, j->y + b, e - b);   /* the one rounding, core's (the wire's too) */
}

void kern_f32_to_bf16(const float *x, uint16_t *y, size_t count) {
    CvtJob j = {x, y};
    kern_parallel_for(count, 32768, 32, cvt_r, &j);
}

typedef struct MaskCvtJob {
    const float *y, *dy;
    uint16_t *g;
} MaskCvtJob;

static void mask_cvt_r(void *p, size_t b, size_t e) {   // through an L1-sized float32 block
    const MaskCvtJob *j = p;
    float t[512];
    for (size_t i = b; i < e; i += 512) {
        const size_t len = e - i < 512 ? e - i : 512;
        const float *restrict yv = j->y + i, *restrict d = j->dy + i;
        for (size_t k = 0; k < len; k++) t[k] = yv[k] > 0 ? d[k] : 0.0f;   // kern_relu_mask's rule
        pd_bf16_pack(t, j->g + i, len);
    }
}

void kern_relu_mask_bf16(const float *y, const float *dy, uint16_t *g, size_t count) {
    MaskCvtJob j = {y, dy, g};
    kern_parallel_for(count, 32768, 32, mask_cvt_r, &j);
}

/* ---- the linear descriptor ---------------------------------------------------------------- */
/* The backward products twice: adding into dx / dW (a sum post-op) and writing them (KSET_*),
 * which skips reading the float32 output: a separate primitive, as the post-op is fixed at
 * creation. */
enum { LM_FWD, LM_BWD_D, LM_BWD_W, LM_BWD_D_SET, LM_BWD_W_SET, LM_FWD_B, LM_COUNT };   /* _B: bf16 dst */

typedef struct LinSlot {
    int m;   /* rows these are for; 0 = empty */
    dnnl_primitive_t p[LM_COUNT];
    dnnl_memory_t src[LM_COUNT], wei[LM_COUNT], dst[LM_COUNT], sp[LM_COUNT], bias;
    size_t sp_bytes;   /* the largest of the scratchpads */
} LinSlot;

typedef struct LinDnnl {
    LinSlot slot[2];   /* [0]: n_max rows, [1]: the last other count */
} LinDnnl;


static void slot_free(LinSlot *s) {
    for (int i = 0; i < LM_COUNT; i++) {
        if (s->p[i]) dnnl_primitive_destroy(s->p[i]);
        dnnl_memory_t m[4] = {s->src[i], s->wei[i], s->dst[i], s->sp[i]};
        for (int k = 0; k < 4; k++)
            if (m[k]) dnnl_memory_destroy(m[k]);
    }
    if (s->bias) dnnl_memory_destroy(s->bias);
    memset(s, 0, sizeof *s);
}

/* A (rows, cols) matrix of type dt: row-major (trans 0), or the transpose of a row-major
 * (cols, rows) one (trans 1). */
static dnnl_status_t mat(dnnl_memory_desc_t *md, int rows, int cols, dnnl_data_type_t dt, int trans) {
    dnnl_dims_t d = {rows, cols};
    return dnnl_memory_desc_init_by_tag(md, 2, d, dt, trans ? dnnl_ba : dnnl_ab);
}

static int slot_init(LinDnnl *l, LinSlot *s, int m, int in, int out, int has_bias, Err *err) {
    int rc = PD_OK;
    memset(s, 0, sizeof *s);
    s->m = m;
    dnnl_memory_desc_t x, wt, y, bias, dy, w, dx, dyt, dw, yb;
    if (mat(&x, m, in, dnnl_bf16, 0) || mat(&wt, in, out, dnnl_bf16, 1) || mat(&y, m, out, dnnl_f32, 0) ||
        mat(&bias, 1, out, dnnl_f32, 0) || mat(&dy, m, out, dnnl_bf16, 0) || mat(&w, out, in, dnnl_bf16, 0) ||
        mat(&dx, m, in, dnnl_f32, 0) || mat(&dyt, out, m, dnnl_bf16, 1) || mat(&dw, out, in, dnnl_f32, 0) ||
        mat(&yb, m, out, dnnl_bf16, 0))
        return err_set(err, PD_EINVAL, "linear (oneDNN bf16): memory descriptors rejected");
    const struct { const dnnl_memory_desc_t *s, *w, *b, *d; int acc; } spec[LM_COUNT] = {
        [LM_FWD] = {&x, &wt, has_bias ? &bias : NULL, &y, 0}, [LM_BWD_D] = {&dy, &w, NULL, &dx, 1},
        [LM_BWD_W] = {&dyt, &x, NULL, &dw, 1}, [LM_BWD_D_SET] = {&dy, &w, NULL, &dx, 0},
        [LM_BWD_W_SET] = {&dyt, &x, NULL, &dw, 0}, [LM_FWD_B] = {&x, &wt, has_bias ? &bias : NULL, &yb, 0}};
    for (int i = 0; i < LM_COUNT && !rc; i++) {
        dnnl_primitive_attr_t attr = NULL;
        dnnl_post_ops_t po = NULL;
        dnnl_primitive_desc_t pd = NULL;
        dnnl_matmul_desc_t md;
        KDNNL_CK("linear bf16", dnnl_primitive_attr_create(&attr));
        KDNNL_CK("linear bf16", dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
        if (spec[i].acc) {   // dst += product
            KDNNL_CK("linear bf16", dnnl_post_ops_create(&po));
            KDNNL_CK("linear bf16", dnnl_post_ops_append_sum(po, 1.0f));
            KDNNL_CK("linear bf16", dnnl_primitive_attr_set_post_ops(attr, po));
        }
        KDNNL_CK("linear bf16", dnnl_matmul_desc_init(&md, spec[i].s, spec[i].w, spec[i].b, spec[i].d));
        KDNNL_CK("linear bf16", dnnl_primitive_desc_create(&pd, &md, attr, kern_dnnl_engine(), NULL));
        KDNNL_CK("linear bf16", dnnl_primitive_create(&s->p[i], pd));
        KDNNL_CK("linear bf16", dnnl_memory_create(&s->src[i], spec[i].s, kern_dnnl_engine(), DNNL_MEMORY_NONE));
        KDNNL_CK("linear bf16", dnnl_memory_create(&s->wei[i], spec[i].w, kern_dnnl_engine(), DNNL_MEMORY_NONE));
        KDNNL_CK("linear bf16", dnnl_memory_create(&s->dst[i], spec[i].d, kern_dnnl_engine(), DNNL_MEMORY_NONE));
        const dnnl_memory_desc_t *spd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        size_t need = spd ? dnnl_memory_desc_get_size(spd) : 0;
        if (need) KDNNL_CK("linear bf16", dnnl_memory_create(&s->sp[i], spd, kern_dnnl_engine(), DNNL_MEMORY_NONE));
        if (need > s->sp_bytes) s->sp_bytes = need;
    done:
        if (pd) dnnl_primitive_desc_destroy(pd);
        if (po) dnnl_post_ops_destroy(po);
        if (attr) dnnl_primitive_attr_destroy(attr);
    }
    if (!rc && dnnl_memory_create(&s->bias, &bias, kern_dnnl_engine(), DNNL_MEMORY_NONE) != dnnl_success)
        rc = err_set(err, PD_EINVAL, "linear (oneDNN bf16): bias memory rejected");
    if (rc) slot_free(s);
    return rc;
}

/* Bytes of KSCR_BF16 a call with m rows may use: xb, Wb, dyb, then the scratchpad. */
static size_t al64(size_t b) { return (b + 63) / 64 * 64; }
static size_t arena_bytes(const KLinear *k, int m, size_t sp) {
    return al64((size_t)m * k->in * 2) + al64((size_t)k->out * k->in * 2) + al64((size_t)m * k->out * 2) + sp + 64;
}

static void lin_free(LinDnnl *l) {
    if (!l) return;
    slot_free(&l->slot[0]);
    slot_free(&l->slot[1]);
    pd_free(l);
}

int kern_linear_init(KLinear *k, int prec, int n_max, int in, int out, int has_bias, Err *err) {
    memset(k, 0, sizeof *k);
    PD_ASSERTF(prec >= 0 && prec < KPREC_COUNT, "precision %d", prec);
    if (n_max < 1 || in < 1 || out < 1)
        return err_set(err, PD_EINVAL, "linear: bad shape n_max=%d in=%d out=%d", n_max, in, out);
    *k = (KLinear){.n_max = n_max, .in = in, .out = out, .has_bias = has_bias, .prec = prec};
    if (prec == KPREC_FP32) return PD_OK;
    int rc = kern_precision_check(prec, err);
    if (rc) return rc;
    LinDnnl *l = pd_calloc(sizeof *l);
    rc = slot_init(l, &l->slot[0], n_max, in, out, has_bias, err);
    if (!rc) kern_scratch(KSCR_BF16, arena_bytes(k, n_max, l->slot[0].sp_bytes));   // grown at build time
    if (rc) lin_free(l);
    else k->impl = l;
    return rc;
}

void kern_linear_release(KLinear *k) {
    if (!k) return;
    lin_free(k->impl);
    k->impl = NULL;
}

static LinSlot *slot_for(KLinear *k, int m) {
    LinDnnl *l = k->impl;
    if (l->slot[0].m == m) return &l->slot[0];
    if (l->slot[1].m != m) {
        slot_free(&l->slot[1]);
        Err err = {0};
        int rc = slot_init(l, &l->slot[1], m, k->in, k->out, k->has_bias, &err);
        PD_ASSERTF(rc == PD_OK, "oneDNN accepted %d rows but not %d: %s", k->n_max, m, err.msg);
    }
    return &l->slot[1];
}

/* Runs matmul i of s on (src, wei, dst); sp: the scratchpad's storage. */
static void mm(LinDnnl *l, LinSlot *s, int i, const void *src, const void *wei, const float *bias, void *dst,
               void *sp) {
    KDNNL_RUN(dnnl_memory_set_data_handle(s->src[i], (void *)src));
    KDNNL_RUN(dnnl_memory_set_data_handle(s->wei[i], (void *)wei));
    KDNNL_RUN(dnnl_memory_set_data_handle(s->dst[i], dst));
    dnnl_exec_arg_t a[5] = {{DNNL_ARG_SRC, s->src[i]}, {DNNL_ARG_WEIGHTS, s->wei[i]}, {DNNL_ARG_DST, s->dst[i]}};
    int na = 3;
    if (s->sp[i]) {
        KDNNL_RUN(dnnl_memory_set_data_handle(s->sp[i], sp));
        a[na++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, s->sp[i]};
    }
    if (bias) {
        KDNNL_RUN(dnnl_memory_set_data_handle(s->bias, (void *)bias));
        a[na++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, s->bias};
    }
    KDNNL_RUN(dnnl_primitive_execute(s->p[i], kern_dnnl_stream(), na, a));
    KDNNL_RUN(dnnl_stream_wait(kern_dnnl_stream()));
}

/* The call's arena: xb (m, in), wb (out, in), dyb (m, out), scratchpad. */
typedef struct Arena {
    uint16_t *x, *w, *dy;
    void *sp;
} Arena;

static Arena arena(const KLinear *k, int m, const LinSlot *s) {
    char *b = kern_scratch(KSCR_BF16, arena_bytes(k, m, s->sp_bytes));
    b += (64 - (uintptr_t)b % 64) % 64;
    Arena a;
    a.x = (uint16_t *)b;
    b += al64((size_t)m * k->in * 2);
    a.w = (uint16_t *)b;
    b += al64((size_t)k->out * k->in * 2);
    a.dy = (uint16_t *)b;
    b += al64((size_t)m * k->out * 2);
    a.sp = b;
    return a;
}

size_t kern_linear_keep_bytes(int prec, int n, int in) {
    return prec == KPREC_BF16 ? (size_t)n * (size_t)in * sizeof(uint16_t) : 0;
}

void kern_linear_fwd_k(KLinear *k, int n, const float *x, const float *w, const float *b, float *y) {
    kern_linear_fwd_kx(k, n, x, w, b, y, NULL);
}

void kern_linear_fwd_kx(KLinear *k, int n, const float *x, const float *w, const float *b, float *y, uint16_t *xb) {
    PD_ASSERTF(n <= k->n_max, "linear: %d rows, built for %d", n, k->n_max);
    if (k->prec == KPREC_FP32) {
        kern_linear_fwd(x, w, b, y, n, k->in, k->out);
        return;
    }
    if (n == 0) return;
    LinSlot *s = slot_for(k, n);
    Arena a = arena(k, n, s);
    if (xb) a.x = xb;   /* kept for the backward */
    kern_f32_to_bf16(x, a.x, (size_t)n * k->in);
    kern_f32_to_bf16(w, a.w, (size_t)k->out * k->in);
    PD_ASSERTF(!b == !k->has_bias, "linear: bias %s, built %s", b ? "given" : "absent", k->has_bias ? "with" : "without");
    mm(k->impl, s, LM_FWD, a.x, a.w, b, y, a.sp);
}

/* The forward with a bf16 operand outside float32 (_kb's y, _bx's x): checks, then W's copy in
 * the call's arena; *s: the slot for n rows (n > 0). */
static Arena fwd_bf16_start(KLinear *k, int n, const float *w, const float *b, LinSlot **s) {
    PD_ASSERTF(n <= k->n_max, "linear: %d rows, built for %d", n, k->n_max);
    PD_ASSERTF(k->prec == KPREC_BF16, "linear: a bf16 operand in a %s layer", kern_precision_name(k->prec));
    PD_ASSERTF(!b == !k->has_bias, "linear: bias %s, built %s", b ? "given" : "absent", k->has_bias ? "with" : "without");
    *s = slot_for(k, n);
    Arena a = arena(k, n, *s);
    kern_f32_to_bf16(w, a.w, (size_t)k->out * k->in);
    return a;
}

void kern_linear_fwd_kb(KLinear *k, int n, const float *x, const float *w, const float *b, uint16_t *yb,
                        uint16_t *xb) {
    if (n == 0) return;
    LinSlot *s;
    Arena a = fwd_bf16_start(k, n, w, b, &s);
    if (xb) a.x = xb;
    kern_f32_to_bf16(x, a.x, (size_t)n * k->in);
    mm(k->impl, s, LM_FWD_B, a.x, a.w, b, yb, a.sp);
}

void kern_linear_fwd_bx(KLinear *k, int n, const uint16_t *xb, const float *w, const float *b, float *y) {
    if (n == 0) return;
    LinSlot *s;
    Arena a = fwd_bf16_start(k, n, w, b, &s);
    mm(k->impl, s, LM_FWD, xb, a.w, b, y, a.sp);
}

/* The same sums with dy's bf16 copy made on the way (one pass over dy instead of two): row by
 * row, the columns [b, e) converted, then added (db's additions in the plain kernel's order:
 * kern_linear_bwd_set's bias sums). */
typedef struct BiasCvtJob {
    const float *dy;
    uint16_t *dyb;
    float *db;
    int n, out, set;
} BiasCvtJob;

static void bias_cvt_r(void *p, size_t b, size_t e) {
    const BiasCvtJob *j = p;
    float *restrict d = j->db;
    for (int i = 0; i < j->n; i++) {
        const float *restrict g = j->dy + (size_t)i * j->out;
        pd_bf16_pack(g + b, j->dyb + (size_t)i * j->out + b, e - b);
        if (i == 0 && j->set)
            for (size_t o = b; o < e; o++) d[o] = 0.0f + g[o];
        else
            for (size_t o = b; o < e; o++) d[o] += g[o];
    }
}

void kern_linear_bwd_k(KLinear *k, int n, const float *x, const float *w, const float *dy, float *dx, float *dw,
                       float *db, int set) {
    kern_linear_bwd_kx(k, n, x, NULL, w, dy, dx, dw, db, set);
}

void kern_linear_bwd_kx(KLinear *k, int n, const float *x, const uint16_t *xb, const float *w, const float *dy,
                        float *dx, float *dw, float *db, int set) {
    PD_ASSERTF(n <= k->n_max, "linear: %d rows, built for %d", n, k->n_max);
    if (k->prec == KPREC_FP32) {
        kern_linear_bwd_set(x, w, dy, dx, dw, db, n, k->in, k->out, set);
        return;
    }
    const int set_w = (set & KSET_DW) != 0;
    if (n == 0) {   /* nothing to add; what is to be written is zero */
        if (dw && set_w) memset(dw, 0, (size_t)k->out * k->in * sizeof(float));
        if (db && set_w) memset(db, 0, (size_t)k->out * sizeof(float));
        return;
    }
    LinSlot *s = slot_for(k, n);
    Arena a = arena(k, n, s);
    if ((dx || dw) && db) {
        BiasCvtJob j = {dy, a.dy, db, n, k->out, set_w};
        kern_parallel_for((size_t)k->out, 32768 / (size_t)n + 1, 16, bias_cvt_r, &j);
        db = NULL;   // summed
    } else if (dx || dw) {
        kern_f32_to_bf16(dy, a.dy, (size_t)n * k->out);
    }
    if (dx) {
        kern_f32_to_bf16(w, a.w, (size_t)k->out * k->in);
        mm(k->impl, s, set & KSET_DX ? LM_BWD_D_SET : LM_BWD_D, a.dy, a.w, NULL, dx, a.sp);
    }
    if (dw) {
        if (!xb) kern_f32_to_bf16(x, a.x, (size_t)n * k->in);
        mm(k->impl, s, set_w ? LM_BWD_W_SET : LM_BWD_W, a.dy, xb ? xb : a.x, NULL, dw, a.sp);
    }
    if (db) kern_linear_bwd_set(x, w, dy, NULL, NULL, db, n, k->in, k->out, set);   /* the bias sums alone */
}
