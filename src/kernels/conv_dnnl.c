/* conv_dnnl.c: the oneDNN 2.6 candidate for conv2d (C API): forward (bias and the relu
 * post-op fused), backward-data and backward-weights primitives, created once per batch
 * size. Two batch sizes are cached: n_max (created in init) and the last other n seen
 * (created lazily on first use: the one place this candidate allocates after init, once
 * per change of n, e.g. for the last, smaller batch of an epoch).
 *
 * Layouts: the caller's buffers are plain NCHW / OIHW. With use_any the primitives choose
 * their layouts (format_tag_any, typically channel-blocked nChw16c / OIhw16i16o, nChw8c /
 * OIhw8i8o on AVX2) and every argument whose layout differs goes through a reorder, unless the
 * caller passes that activation already blocked (lay, KCONV_*_BLK: layers that keep
 * nChw{B}c, B = kern_blk_width(), between them). Nothing here assumes which layout oneDNN
 * chose: every port compares the primitive's memory desc with the caller's (bf16 on AMX chooses
 * NHWC, acdb, and then no blocked layout is offered), and kern_conv2d_init_fmt forces one, so
 * that each layout's path runs on any CPU in the tests.
 * Outputs that accumulate (dx, dW) are always produced in a separate buffer and brought back
 * by a reorder with a sum post-op (dst = dst + reordered), which is oneDNN's way of writing
 * +=, or by kern_accumulate when dx is blocked; db is added by a loop. With fuse_relu, dy is
 * first masked by y > 0 (element-wise, in either layout); at bf16 with dy blocked the mask
 * writes the bf16 operand directly (kern_relu_mask_bf16: no float32 masked copy).
 *
 * Memory: the activation-sized temporaries (reordered src/dst/diff buffers, the masked dy,
 * the primitives' user-managed scratchpad) live only during one call, so they are not owned
 * by the descriptor but laid out in the calling thread's KSCR_CONV scratch (kern_scratch):
 * every convolution of a model shares one arena per thread, sized by the largest (asked for
 * in init). Owning them per layer cost resnet20 ~250 MB at N = 64, twice PyTorch's whole
 * training step. Within a backward, diff_dst is reordered once for both passes (when both are
 * wanted) and the blocked src of backward-weights reuses diff_src's storage (already added
 * into dx by then): vgg16's step 8 MB smaller, one activation reorder fewer per convolution. The weight-sized ones (reordered weights, dW before its += reorder) are
 * rebuilt every call too and live there as well (vgg16: 14 MB).
 *
 * Precision (KPREC_BF16): the primitives take src, weights and diff_dst in bf16 and write dst,
 * diff_src, diff_weights and diff_bias in float32; the input ports' reorders convert. A
 * caller's blocked (nChw16c) activations stay float32: where the primitive's bf16 operand is
 * blocked the same way too, x or dy is converted element-wise (kern_f32_to_bf16) in place of the reorder.
 *
 * Threads: oneDNN here is the OpenMP build; see kern_set_threads in kern_basic.c. */
#include <string.h>

#include "conv_impl.h"
#include "kernels_impl.h"

typedef struct Port {
    dnnl_memory_t user;         /* caller's plain layout; data handle set per call */
    dnnl_memory_t prim;         /* the primitive's layout; == user when no reorder is needed */
    dnnl_primitive_t reorder;   /* user -> prim (inputs) or prim -> user (outputs) */
    dnnl_primitive_t reorder_set;   /* an accumulated output's reorder writing (=, no sum) */
    size_t bytes;               /* size of prim when it differs from user */
    int cvt;                    /* prim is bf16: a caller's blocked float32 buffer is converted
                                 * element-wise (kern_f32_to_bf16) rather than used in place */
} Port;

typedef struct Prims {
    int n;   /* batch size these are for; 0 = empty slot */
    dnnl_primitive_t fwd, bwd_data, bwd_w;
    dnnl_memory_t sp_fwd, sp_data, sp_w;   /* scratchpads, in the call's scratch at sp_off */
    size_t sp_f, sp_b;                     /* scratchpad bytes: forward, backward (larger of two) */
    int share_ddst;                        /* w_ddst's layout is d_ddst's */
    int blk;                               /* KCONV_X_BLK | KCONV_Y_BLK: layouts callers may use */
    int keep;                              /* bf16: backward-weights reads x in f_src's layout, so a
                                            * forward's converted x may be kept for it */
    size_t arena;                          /* bytes of KSCR_CONV scratch a call may need */
    Port f_src, f_wei, f_dst;              /* forward */
    Port d_ddst, d_wei, d_dsrc;            /* backward data (d_dsrc accumulates) */
    Port w_src, w_ddst, w_dwei;            /* backward weights (w_dwei accumulates) */
    dnnl_memory_t f_bias, w_dbias;         /* (K), plain */
} Prims;

struct ConvDnnl {
    int use_any;
    dnnl_format_tag_t fmt;   /* the activations' layout when forced (conv_dnnl_new's opts), else 0 */
    int keep_any;            /* keep x at every precision where the primitives reorder it */
    size_t keep_per_sample;   /* bytes of kept bf16 x per sample (n_max's); 0: none kept */
    Prims slot[2];   /* [0]: n_max, [1]: the last other n */
    float *dbias;    /* (K) */
};

static void port_free(Port *p) {
    if (p->prim && p->prim != p->user) dnnl_memory_destroy(p->prim);
    if (p->user) dnnl_memory_destroy(p->user);
    if (p->reorder) dnnl_primitive_destroy(p->reorder);
    if (p->reorder_set) dnnl_primitive_destroy(p->reorder_set);
    memset(p, 0, sizeof *p);
}

/* dir: 0 input, 1 output (=), 2 output accumulated (+=, always via reorder with sum; and
 * reorder_set without it, for a call that writes the output: KSET_*). prim's storage is placed
 * in the call's scratch by the call (fwd_plan, bwd_plan) and bound then. */
static int port_init(Port *p, dnnl_engine_t eng, const dnnl_memory_desc_t *user_md, const dnnl_memory_desc_t *want,
                     int dir, Err *err) {
    int rc = PD_OK;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t rpd = NULL;
    KDNNL_CK("conv2d", dnnl_memory_create(&p->user, user_md, eng, DNNL_MEMORY_NONE));
    if (dir != 2 && dnnl_memory_desc_equal(user_md, want)) {
        p->prim = p->user;
        return PD_OK;
    }
    p->bytes = dnnl_memory_desc_get_size(want);
    p->cvt = want->data_type == dnnl_bf16;
    KDNNL_CK("conv2d", dnnl_memory_create(&p->prim, want, eng, DNNL_MEMORY_NONE));
    KDNNL_CK("conv2d", dnnl_primitive_attr_create(&attr));
    if (dir == 2) {
        KDNNL_CK("conv2d", dnnl_post_ops_create(&po));
        KDNNL_CK("conv2d", dnnl_post_ops_append_sum(po, 1.0f));
        KDNNL_CK("conv2d", dnnl_primitive_attr_set_post_ops(attr, po));
    }
    if (dir == 0) KDNNL_CK("conv2d", dnnl_reorder_primitive_desc_create(&rpd, user_md, eng, want, eng, attr));
    else KDNNL_CK("conv2d", dnnl_reorder_primitive_desc_create(&rpd, want, eng, user_md, eng, attr));
    KDNNL_CK("conv2d", dnnl_primitive_create(&p->reorder, rpd));
    if (dir == 2) {
        dnnl_primitive_desc_destroy(rpd);
        rpd = NULL;
        KDNNL_CK("conv2d", dnnl_reorder_primitive_desc_create(&rpd, want, eng, user_md, eng, NULL));
        KDNNL_CK("conv2d", dnnl_primitive_create(&p->reorder_set, rpd));
    }
done:
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return rc;
}

static void prims_free(Prims *p) {
    dnnl_primitive_t pr[] = {p->fwd, p->bwd_data, p->bwd_w};
    for (int i = 0; i < 3; i++)
        if (pr[i]) dnnl_primitive_destroy(pr[i]);
    dnnl_memory_t m[] = {p->sp_fwd, p->sp_data, p->sp_w, p->f_bias, p->w_dbias};
    for (int i = 0; i < 5; i++)
        if (m[i]) dnnl_memory_destroy(m[i]);
    Port *ports[] = {&p->f_src, &p->f_wei, &p->f_dst, &p->d_ddst, &p->d_wei, &p->d_dsrc, &p->w_src, &p->w_ddst, &p->w_dwei};
    for (int i = 0; i < 9; i++) port_free(ports[i]);
    memset(p, 0, sizeof *p);
}

static const dnnl_memory_desc_t *qmd(const_dnnl_primitive_desc_t pd, dnnl_query_t what) {
    return dnnl_primitive_desc_query_md(pd, what, 0);
}

/* Where a call's temporaries lie in its KSCR_CONV scratch (byte offsets), laid out per call
 * from the layouts in use: a port whose reorder is skipped takes no room. */
typedef struct FwdPlan {
    size_t src, wei, dst, sp, total;
} FwdPlan;
typedef struct BwdPlan {
    size_t dym;    /* the masked dy, in dy's layout (fuse_relu) */
    size_t ddst;   /* d_ddst (and w_ddst when shared) */
    size_t wei, dsrc, wsrc, wddst, dwei, sp, total;
} BwdPlan;

static size_t bump(size_t *at, size_t bytes) {
    size_t o = *at;
    *at += (bytes + 63) / 64 * 64;
    return o;
}

/* An input port takes room in the call's scratch unless the caller's buffer is used in place
 * (blocked, float32). */
static int room(const Port *p, int blk) { return p->reorder && (!blk || p->cvt); }

static FwdPlan fwd_plan(const Prims *p, int lay) {
    FwdPlan f = {0};
    size_t at = 0;
    if (room(&p->f_src, lay & KCONV_X_BLK)) f.src = bump(&at, p->f_src.bytes);
    if (p->f_wei.reorder) f.wei = bump(&at, p->f_wei.bytes);
    if (p->f_dst.reorder && !(lay & KCONV_Y_BLK)) f.dst = bump(&at, p->f_dst.bytes);
    f.sp = bump(&at, p->sp_f);
    f.total = at;
    return f;
}

/* dx: the call wants dx (backward-data); dw: it wants dW or db (backward-weights). The blocked
 * src of backward-weights is filled after diff_src has been added into dx, so it lives in
 * diff_src's storage. */
static BwdPlan bwd_plan(const Prims *p, const KConv *cv, int lay, int dx, int dw) {
    BwdPlan b = {0};
    size_t at = 0;
    const int xb = lay & KCONV_X_BLK, yb = lay & KCONV_Y_BLK;
    if (cv->fuse_relu) b.dym = bump(&at, (size_t)p->n * cv->k * cv->oh * cv->ow * sizeof(float));
    if (dx) {
        if (room(&p->d_ddst, yb)) b.ddst = bump(&at, p->d_ddst.bytes);
        if (p->d_wei.reorder) b.wei = bump(&at, p->d_wei.bytes);
        b.dsrc = bump(&at, p->d_dsrc.bytes);   // blocked or not, produced apart and then added
    }
    if (dw) {
        if (room(&p->w_src, xb))
            b.wsrc = dx && p->w_src.bytes <= p->d_dsrc.bytes ? b.dsrc : bump(&at, p->w_src.bytes);
        if (room(&p->w_ddst, yb)) b.wddst = dx && p->share_ddst ? b.ddst : bump(&at, p->w_ddst.bytes);
        b.dwei = bump(&at, p->w_dwei.bytes);
    }
    b.sp = bump(&at, p->sp_b);
    b.total = at;
    return b;
}

/* Creates the three primitives and their ports for batch size n. force: blocked layouts
 * (KCONV_*_BLK) the primitives must use rather than choose (those n_max's chose: callers
 * rely on them for every n). */
static int prims_init(ConvDnnl *d, const KConv *cv, int n, int force, Prims *p, Err *err) {
    int rc = PD_OK;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t fpd = NULL, dpd = NULL, wpd = NULL;
    memset(p, 0, sizeof *p);
    p->n = n;
    dnnl_dims_t sd = {n, cv->c, cv->h, cv->w}, wd = {cv->k, cv->c, cv->r, cv->s}, bd = {cv->k},
                dd = {n, cv->k, cv->oh, cv->ow};
    dnnl_dims_t strides = {cv->stride, cv->stride}, pad = {cv->pad, cv->pad};
    dnnl_memory_desc_t src_u, wei_u, bias_u, dst_u, src_a, wei_a, dst_a;
    const dnnl_format_tag_t any = dnnl_format_tag_any;
    KDNNL_CK("conv2d", dnnl_memory_desc_init_by_tag(&src_u, 4, sd, dnnl_f32, dnnl_nchw));
    KDNNL_CK("conv2d", dnnl_memory_desc_init_by_tag(&wei_u, 4, wd, dnnl_f32, dnnl_oihw));
    KDNNL_CK("conv2d", dnnl_memory_desc_init_by_tag(&bias_u, 1, bd, dnnl_f32, dnnl_a));
    KDNNL_CK("conv2d", dnnl_memory_desc_init_by_tag(&dst_u, 4, dd, dnnl_f32, dnnl_nchw));
    const dnnl_format_tag_t act = d->fmt ? d->fmt : d->use_any ? any : dnnl_nchw;
    /* bf16: the multiplied operands (src, weights, diff_dst) in bf16, reordered (converted) from
     * the caller's float32 by their ports; dst, diff_src, diff_weights and bias stay float32 */
    const dnnl_data_type_t mt = cv->prec == KPREC_BF16 ? dnnl_bf16 : dnnl_f32;
    const int B = kern_blk_width();
    const dnnl_format_tag_t blk_tag = B == 16 ? dnnl_nChw16c : dnnl_nChw8c;
    dnnl_memory_desc_t ddst_a;
    KDNNL_CK("conv2d", dnnl_memory_desc_init_by_tag(&src_a, 4, sd, mt, force & KCONV_X_BLK ? blk_tag : act));
    KDNNL_CK("conv2d", dnnl_memory_desc_init_by_tag(&wei_a, 4, wd, mt, d->use_any ? any : dnnl_oihw));
    KDNNL_CK("conv2d", dnnl_memory_desc_init_by_tag(&dst_a, 4, dd, dnnl_f32, force & KCONV_Y_BLK ? blk_tag : act));
    KDNNL_CK("conv2d", dnnl_memory_desc_init_by_tag(&ddst_a, 4, dd, mt, force & KCONV_Y_BLK ? blk_tag : act));
    dnnl_memory_desc_t dsrc_a = src_a, dwei_a = wei_a;   // the gradients' outputs: float32
    dsrc_a.data_type = dnnl_f32;
    dwei_a.data_type = dnnl_f32;
    const dnnl_memory_desc_t *bias = cv->has_bias ? &bias_u : NULL;

    KDNNL_CK("conv2d", dnnl_primitive_attr_create(&attr));
    KDNNL_CK("conv2d", dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    dnnl_convolution_desc_t fd, dd_, wd_;
    KDNNL_CK("conv2d", dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, &src_a, &wei_a, bias,
                                          &dst_a, strides, pad, pad));
    if (cv->fuse_relu) {
        KDNNL_CK("conv2d", dnnl_post_ops_create(&po));
        KDNNL_CK("conv2d", dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f));
        KDNNL_CK("conv2d", dnnl_primitive_attr_set_post_ops(attr, po));
    }
    KDNNL_CK("conv2d", dnnl_primitive_desc_create(&fpd, &fd, attr, kern_dnnl_engine(), NULL));
    if (po) {   // the backward primitives take no post-ops
        dnnl_post_ops_destroy(po);
        po = NULL;
        dnnl_primitive_attr_destroy(attr);
        KDNNL_CK("conv2d", dnnl_primitive_attr_create(&attr));
        KDNNL_CK("conv2d", dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    }
    KDNNL_CK("conv2d", dnnl_convolution_backward_data_desc_init(&dd_, dnnl_convolution_direct, &dsrc_a, &wei_a, &ddst_a, strides,
                                                pad, pad));
    KDNNL_CK("conv2d", dnnl_primitive_desc_create(&dpd, &dd_, attr, kern_dnnl_engine(), fpd));
    KDNNL_CK("conv2d", dnnl_convolution_backward_weights_desc_init(&wd_, dnnl_convolution_direct, &src_a, &dwei_a, bias, &ddst_a,
                                                   strides, pad, pad));
    KDNNL_CK("conv2d", dnnl_primitive_desc_create(&wpd, &wd_, attr, kern_dnnl_engine(), fpd));

    KDNNL_CK("conv2d", dnnl_primitive_create(&p->fwd, fpd));
    KDNNL_CK("conv2d", dnnl_primitive_create(&p->bwd_data, dpd));
    KDNNL_CK("conv2d", dnnl_primitive_create(&p->bwd_w, wpd));
    if ((rc = port_init(&p->f_src, kern_dnnl_engine(), &src_u, qmd(fpd, dnnl_query_src_md), 0, err))) goto done;
    if ((rc = port_init(&p->f_wei, kern_dnnl_engine(), &wei_u, qmd(fpd, dnnl_query_weights_md), 0, err))) goto done;
    if ((rc = port_init(&p->f_dst, kern_dnnl_engine(), &dst_u, qmd(fpd, dnnl_query_dst_md), 1, err))) goto done;
    if ((rc = port_init(&p->d_ddst, kern_dnnl_engine(), &dst_u, qmd(dpd, dnnl_query_diff_dst_md), 0, err))) goto done;
    if ((rc = port_init(&p->d_wei, kern_dnnl_engine(), &wei_u, qmd(dpd, dnnl_query_weights_md), 0, err))) goto done;
    if ((rc = port_init(&p->d_dsrc, kern_dnnl_engine(), &src_u, qmd(dpd, dnnl_query_diff_src_md), 2, err))) goto done;
    if ((rc = port_init(&p->w_src, kern_dnnl_engine(), &src_u, qmd(wpd, dnnl_query_src_md), 0, err))) goto done;
    if ((rc = port_init(&p->w_ddst, kern_dnnl_engine(), &dst_u, qmd(wpd, dnnl_query_diff_dst_md), 0, err))) goto done;
    if ((rc = port_init(&p->w_dwei, kern_dnnl_engine(), &wei_u, qmd(wpd, dnnl_query_diff_weights_md), 2, err))) goto done;
    /* backward-weights reads diff_dst in the same layout as backward-data (checked): one
     * reorder feeds both when a call wants dx and dW */
    p->share_ddst = p->d_ddst.reorder && dnnl_memory_desc_equal(qmd(dpd, dnnl_query_diff_dst_md),
                                                                qmd(wpd, dnnl_query_diff_dst_md));
    /* the blocked activation layout (nChw{B}c, no padding: channels a multiple of B) is what
     * every src-side (dst-side) port of the three primitives uses: callers may then pass
     * x, dx (y, dy) in it and those reorders vanish */
    /* (bf16: the bf16 operands in nChw{B}c too; callers pass float32 nChw{B}c, converted
     * element-wise into the call's scratch) */
    dnnl_memory_desc_t src_b, dst_b, srcm_b, dstm_b;
    KDNNL_CK("conv2d", dnnl_memory_desc_init_by_tag(&src_b, 4, sd, dnnl_f32, blk_tag));
    KDNNL_CK("conv2d", dnnl_memory_desc_init_by_tag(&dst_b, 4, dd, dnnl_f32, blk_tag));
    KDNNL_CK("conv2d", dnnl_memory_desc_init_by_tag(&srcm_b, 4, sd, mt, blk_tag));
    KDNNL_CK("conv2d", dnnl_memory_desc_init_by_tag(&dstm_b, 4, dd, mt, blk_tag));
    if (cv->c % B == 0 && dnnl_memory_desc_equal(qmd(fpd, dnnl_query_src_md), &srcm_b) &&
        dnnl_memory_desc_equal(qmd(dpd, dnnl_query_diff_src_md), &src_b) &&
        dnnl_memory_desc_equal(qmd(wpd, dnnl_query_src_md), &srcm_b))
        p->blk |= KCONV_X_BLK;
    if (cv->k % B == 0 && dnnl_memory_desc_equal(qmd(fpd, dnnl_query_dst_md), &dst_b) &&
        dnnl_memory_desc_equal(qmd(dpd, dnnl_query_diff_dst_md), &dstm_b) &&
        dnnl_memory_desc_equal(qmd(wpd, dnnl_query_diff_dst_md), &dstm_b))
        p->blk |= KCONV_Y_BLK;
    /* the forward's converted x can serve backward-weights: bf16, the same layout, and (for a
     * batch size other than n_max) the size n_max's per sample promised the caller */
    p->keep = (cv->prec == KPREC_BF16 || d->keep_any) && p->f_src.reorder && p->w_src.reorder &&
              dnnl_memory_desc_equal(qmd(fpd, dnnl_query_src_md), qmd(wpd, dnnl_query_src_md)) &&
              p->f_src.bytes % (size_t)n == 0 && (n == cv->n_max || p->f_src.bytes == d->keep_per_sample * (size_t)n);
    if (cv->has_bias) {
        KDNNL_CK("conv2d", dnnl_memory_create(&p->f_bias, &bias_u, kern_dnnl_engine(), DNNL_MEMORY_NONE));
        KDNNL_CK("conv2d", dnnl_memory_create(&p->w_dbias, &bias_u, kern_dnnl_engine(), d->dbias));
    }
    p->sp_f = dnnl_memory_desc_get_size(qmd(fpd, dnnl_query_scratchpad_md));
    size_t spd = dnnl_memory_desc_get_size(qmd(dpd, dnnl_query_scratchpad_md));
    size_t spw = dnnl_memory_desc_get_size(qmd(wpd, dnnl_query_scratchpad_md));
    p->sp_b = spd > spw ? spd : spw;
    /* the most a call can need: plain layouts, both passes. Grown now rather than in the
     * first step; a call with blocked layouts touches only the front of it. */
    FwdPlan fp = fwd_plan(p, 0);
    BwdPlan bp = bwd_plan(p, cv, 0, 1, 1);
    p->arena = (fp.total > bp.total ? fp.total : bp.total) + 64;
    kern_scratch(KSCR_CONV, p->arena);
    KDNNL_CK("conv2d", dnnl_memory_create(&p->sp_fwd, qmd(fpd, dnnl_query_scratchpad_md), kern_dnnl_engine(), DNNL_MEMORY_NONE));
    KDNNL_CK("conv2d", dnnl_memory_create(&p->sp_data, qmd(dpd, dnnl_query_scratchpad_md), kern_dnnl_engine(), DNNL_MEMORY_NONE));
    KDNNL_CK("conv2d", dnnl_memory_create(&p->sp_w, qmd(wpd, dnnl_query_scratchpad_md), kern_dnnl_engine(), DNNL_MEMORY_NONE));
done:
    if (fpd) dnnl_primitive_desc_destroy(fpd);
    if (dpd) dnnl_primitive_desc_destroy(dpd);
    if (wpd) dnnl_primitive_desc_destroy(wpd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (rc) prims_free(p);
    return rc;
}

void conv_dnnl_free(ConvDnnl *d) {
    if (!d) return;
    prims_free(&d->slot[0]);
    prims_free(&d->slot[1]);
    pd_free(d->dbias);
    pd_free(d);
}

int conv_dnnl_new(const KConv *cv, int use_any, const ConvDnnlForce *force, ConvDnnl **out, Err *err) {
    static const dnnl_format_tag_t tags[KCONV_FMT_COUNT] = {
        [KCONV_FMT_ANY] = 0, [KCONV_FMT_NCHW] = dnnl_nchw, [KCONV_FMT_NHWC] = dnnl_nhwc,
        [KCONV_FMT_NCHW8C] = dnnl_nChw8c, [KCONV_FMT_NCHW16C] = dnnl_nChw16c};
    int rc = PD_OK;
    ConvDnnl *d = pd_calloc(sizeof *d);
    *out = NULL;
    d->use_any = use_any;
    if (force) {
        PD_ASSERTF(force->fmt >= 0 && force->fmt < KCONV_FMT_COUNT, "layout %d", force->fmt);
        d->fmt = tags[force->fmt];
        d->keep_any = force->keep_any;
    }
    d->dbias = pd_alloc_f32((size_t)cv->k);
    rc = prims_init(d, cv, cv->n_max, 0, &d->slot[0], err);
    if (!rc && d->slot[0].keep) d->keep_per_sample = d->slot[0].f_src.bytes / (size_t)cv->n_max;
    if (rc) conv_dnnl_free(d);
    else *out = d;
    return rc;
}

static Prims *prims_for(ConvDnnl *d, const KConv *cv, int n) {
    if (d->slot[0].n == n) return &d->slot[0];
    if (d->slot[1].n != n) {
        prims_free(&d->slot[1]);
        Err err = {0};
        int rc = prims_init(d, cv, n, d->slot[0].blk, &d->slot[1], &err);
        PD_ASSERTF(rc == PD_OK, "oneDNN accepted n_max=%d but not n=%d: %s", cv->n_max, n, err.msg);
    }
    return &d->slot[1];
}

static void set(dnnl_memory_t m, const void *ptr) { KDNNL_RUN(dnnl_memory_set_data_handle(m, (void *)ptr)); }

/* Runs reorder r from `from` to `to`. */
static void run_reorder(dnnl_stream_t st, dnnl_primitive_t r, dnnl_memory_t from, dnnl_memory_t to) {
    dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    KDNNL_RUN(dnnl_primitive_execute(r, st, 2, a));
}

/* Input port: the primitive's memory holding ptr's data. blk: ptr is already in the
 * primitive's layout (no reorder: prim points at ptr); else it is reordered into `at`. */
static dnnl_memory_t port_in(dnnl_stream_t st, Port *p, const void *ptr, int blk, char *at) {
    if (blk && p->cvt) {   // float32 nChw{B}c -> bf16 nChw{B}c: the same order, element-wise
        kern_f32_to_bf16(ptr, (uint16_t *)at, p->bytes / 2);
        set(p->prim, at);
        return p->prim;
    }
    if (!p->reorder || blk) {
        set(p->prim, ptr);   // == user when no reorder exists
        return p->prim;
    }
    set(p->user, ptr);
    set(p->prim, at);
    run_reorder(st, p->reorder, p->user, p->prim);
    return p->prim;
}

/* Whether a forward with x in this layout (xb: blocked) leaves x in keep: where its src port
 * converts or reorders x (a float32 x already in the primitive's layout is used in place). */
static int kept(const Prims *p, int xb) { return p->keep && (!xb || p->f_src.cvt); }

int conv_dnnl_layouts(const ConvDnnl *d) { return d->slot[0].blk; }

size_t conv_dnnl_keep_bytes(const ConvDnnl *d, int n) { return d->keep_per_sample * (size_t)n; }

void conv_dnnl_fwd(ConvDnnl *d, const KConv *cv, int n, int lay, const float *x, const float *w, const float *b,
                   float *y, void *keep) {
    if (n == 0) return;
    Prims *p = prims_for(d, cv, n);
    dnnl_stream_t st = kern_dnnl_stream();
    PD_ASSERTF((lay & ~p->blk) == 0, "conv2d: layout %d not supported (%d)", lay, p->blk);
    const FwdPlan f = fwd_plan(p, lay);
    char *base = kern_scratch(KSCR_CONV, p->arena);
    set(p->sp_fwd, base + f.sp);
    const int yb = lay & KCONV_Y_BLK, out_reorder = p->f_dst.reorder && !yb;
    set(p->f_dst.prim, out_reorder ? base + f.dst : (void *)y);
    char *src_at = keep && kept(p, lay & KCONV_X_BLK) ? keep : base + f.src;   /* converted where the backward finds it */
    dnnl_exec_arg_t a[5] = {{DNNL_ARG_SRC, port_in(st, &p->f_src, x, lay & KCONV_X_BLK, src_at)},
                            {DNNL_ARG_WEIGHTS, port_in(st, &p->f_wei, w, 0, base + f.wei)},
                            {DNNL_ARG_DST, p->f_dst.prim},
                            {DNNL_ARG_SCRATCHPAD, p->sp_fwd},
                            {DNNL_ARG_BIAS, p->f_bias}};
    if (cv->has_bias) set(p->f_bias, b);
    KDNNL_RUN(dnnl_primitive_execute(p->fwd, st, cv->has_bias ? 5 : 4, a));
    if (out_reorder) {
        set(p->f_dst.user, y);
        run_reorder(st, p->f_dst.reorder, p->f_dst.prim, p->f_dst.user);
    }
    KDNNL_RUN(dnnl_stream_wait(st));
}

void conv_dnnl_bwd(ConvDnnl *d, const KConv *cv, int n, int lay, int wr, const float *x, const void *keep,
                   const float *w, const float *y, const float *dy, float *dx, float *dw, float *db) {
    const size_t nx = (size_t)n * cv->c * cv->h * cv->w;
    if (n == 0) {   /* nothing to add; what is to be written is zero */
        if (dw && (wr & KSET_DW)) memset(dw, 0, (size_t)cv->k * cv->c * cv->r * cv->s * sizeof(float));
        if (db && cv->has_bias && (wr & KSET_DW)) memset(db, 0, (size_t)cv->k * sizeof(float));
        return;
    }
    Prims *p = prims_for(d, cv, n);
    dnnl_stream_t st = kern_dnnl_stream();
    PD_ASSERTF((lay & ~p->blk) == 0, "conv2d: layout %d not supported (%d)", lay, p->blk);
    if (!cv->has_bias) db = NULL;
    const int xb = lay & KCONV_X_BLK, yb = lay & KCONV_Y_BLK;
    const BwdPlan bp = bwd_plan(p, cv, lay, dx != NULL, dw || db);
    char *base = kern_scratch(KSCR_CONV, p->arena);
    const float *g = dy;
    const size_t ny = (size_t)n * cv->k * cv->oh * cv->ow;
    /* bf16 with dy blocked: every pass takes the masked dy only as its bf16 conversion, so
     * mask and convert in one pass straight into the bf16 ports' storage (no float32 copy) */
    const int mask16 = cv->fuse_relu && yb && (!dx || p->d_ddst.cvt) && (!(dw || db) || p->w_ddst.cvt);
    if (cv->fuse_relu && !mask16) {   // element-wise: the same in either layout
        float *dym = (float *)(base + bp.dym);
        kern_relu_mask(y, dy, dym, ny);
        g = dym;
    }
    set(p->sp_data, base + bp.sp);
    set(p->sp_w, base + bp.sp);
    const int dx_direct = dx && xb && (wr & KSET_DX);   /* diff_src written in place: dx's layout */
    if (dx) {
        set(p->d_dsrc.prim, dx_direct ? (void *)dx : base + bp.dsrc);
        dnnl_memory_t ddst = p->d_ddst.prim;
        if (mask16) {
            kern_relu_mask_bf16(y, dy, (uint16_t *)(base + bp.ddst), ny);
            set(ddst, base + bp.ddst);
        } else {
            ddst = port_in(st, &p->d_ddst, g, yb, base + bp.ddst);
        }
        dnnl_exec_arg_t a[4] = {{DNNL_ARG_DIFF_DST, ddst},
                                {DNNL_ARG_WEIGHTS, port_in(st, &p->d_wei, w, 0, base + bp.wei)},
                                {DNNL_ARG_DIFF_SRC, p->d_dsrc.prim},
                                {DNNL_ARG_SCRATCHPAD, p->sp_data}};
        KDNNL_RUN(dnnl_primitive_execute(p->bwd_data, st, 4, a));
        if (dx_direct) {   // written
        } else if (xb) {   // dx is in diff_src's layout: += element-wise
            KDNNL_RUN(dnnl_stream_wait(st));
            kern_accumulate(dx, (const float *)(base + bp.dsrc), nx);
        } else {
            set(p->d_dsrc.user, dx);
            run_reorder(st, wr & KSET_DX ? p->d_dsrc.reorder_set : p->d_dsrc.reorder, p->d_dsrc.prim,
                        p->d_dsrc.user);   // dx = or += (sum post-op)
        }
    }
    if (dw || db) {
        dnnl_memory_t ddst;
        if (dx && p->share_ddst && room(&p->d_ddst, yb)) {   // backward-data's reorder of g is still at bp.ddst
            set(p->w_ddst.prim, base + bp.ddst);
            ddst = p->w_ddst.prim;
        } else if (mask16) {
            kern_relu_mask_bf16(y, dy, (uint16_t *)(base + bp.wddst), ny);
            set(p->w_ddst.prim, base + bp.wddst);
            ddst = p->w_ddst.prim;
        } else {
            ddst = port_in(st, &p->w_ddst, g, yb, base + bp.wddst);
        }
        dnnl_memory_t src;
        if (keep && kept(p, xb)) {   // the forward's conversion, in this pass's layout
            set(p->w_src.prim, keep);
            src = p->w_src.prim;
        } else {
            src = port_in(st, &p->w_src, x, xb, base + bp.wsrc);
        }
        dnnl_exec_arg_t a[5] = {{DNNL_ARG_SRC, src},
                                {DNNL_ARG_DIFF_DST, ddst},
                                {DNNL_ARG_DIFF_WEIGHTS, p->w_dwei.prim},
                                {DNNL_ARG_SCRATCHPAD, p->sp_w},
                                {DNNL_ARG_DIFF_BIAS, p->w_dbias}};
        set(p->w_dwei.prim, base + bp.dwei);
        KDNNL_RUN(dnnl_primitive_execute(p->bwd_w, st, cv->has_bias ? 5 : 4, a));
        if (dw) {
            set(p->w_dwei.user, dw);
            run_reorder(st, wr & KSET_DW ? p->w_dwei.reorder_set : p->w_dwei.reorder, p->w_dwei.prim,
                        p->w_dwei.user);   // dw = or +=
        }
    }
    KDNNL_RUN(dnnl_stream_wait(st));
    if (db && (wr & KSET_DW))
        for (int k = 0; k < cv->k; k++) db[k] = 0.0f + d->dbias[k];   // as onto zeros
    else if (db)
        for (int k = 0; k < cv->k; k++) db[k] += d->dbias[k];
}

void conv_dnnl_keep_read(ConvDnnl *d, const KConv *cv, int n, const void *keep, float *x) {
    Prims *p = prims_for(d, cv, n);
    PD_ASSERTF(p->keep, "conv2d: nothing kept at n=%d", n);
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_primitive_t r = NULL;
    const dnnl_memory_desc_t *from = NULL, *to = NULL;
    KDNNL_RUN(dnnl_memory_get_memory_desc(p->f_src.prim, &from));
    KDNNL_RUN(dnnl_memory_get_memory_desc(p->f_src.user, &to));
    KDNNL_RUN(dnnl_reorder_primitive_desc_create(&rpd, from, kern_dnnl_engine(), to, kern_dnnl_engine(), NULL));
    KDNNL_RUN(dnnl_primitive_create(&r, rpd));
    set(p->f_src.prim, keep);
    set(p->f_src.user, x);
    run_reorder(kern_dnnl_stream(), r, p->f_src.prim, p->f_src.user);
    KDNNL_RUN(dnnl_stream_wait(kern_dnnl_stream()));
    dnnl_primitive_destroy(r);
    dnnl_primitive_desc_destroy(rpd);
}
