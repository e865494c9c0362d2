/* conv_impl.h: internals shared by conv.c (dispatch + im2col/sgemm candidate), conv_dnnl.c
 * (oneDNN candidate) and conv_dense.c (dense-matrix candidate). Not part of the module's
 * public API. */
#ifndef PD_CONV_IMPL_H
#define PD_CONV_IMPL_H

#include "kernels.h"

/* oneDNN candidate: the state lives behind an opaque pointer owned by ConvImpl. */
typedef struct ConvDnnl ConvDnnl;
/* Creates the primitives for n_max (and reorders, scratch); use_any lets oneDNN choose
 * its layouts (reorders to and from plain NCHW), otherwise all layouts are plain. PD_OK or
 * PD_EINVAL naming the oneDNN status; *out NULL on error. */
typedef struct ConvDnnlForce {
    int fmt;        /* KCONV_FMT_*: the activations' layout (src, dst and their gradients) */
    int keep_any;   /* keep the forward's x at float32 too, where its port reorders it */
} ConvDnnlForce;
/* force: NULL, or what kern_conv2d_init_fmt imposes (kernels.h). */
int  conv_dnnl_new(const KConv *cv, int use_any, const ConvDnnlForce *force, ConvDnnl **out, Err *err);
void conv_dnnl_free(ConvDnnl *d);   /* NULL is fine */
/* The activation layouts its callers may use (KCONV_X_BLK | KCONV_Y_BLK, kernels.h). */
int  conv_dnnl_layouts(const ConvDnnl *d);
/* lay: the layouts of this call's x, dx (KCONV_X_BLK) and y, dy (KCONV_Y_BLK); 0 = plain. */
/* keep: where the forward leaves its bf16 x for the backward (kern_conv2d_keep_bytes), or NULL. */
void conv_dnnl_fwd(ConvDnnl *d, const KConv *cv, int n, int lay, const float *x, const float *w, const float *b,
                   float *y, void *keep);
/* wr: KSET_DX, dx is written (kernels.h, kern_conv2d_bwd_set). keep: the forward's, or NULL. */
void conv_dnnl_bwd(ConvDnnl *d, const KConv *cv, int n, int lay, int wr, const float *x, const void *keep,
                   const float *w, const float *y, const float *dy, float *dx, float *dw, float *db);
/* Bytes of the bf16 x a forward keeps for n samples; 0: none. */
size_t conv_dnnl_keep_bytes(const ConvDnnl *d, int n);
/* The kept x of n samples back as float32 NCHW (kern_conv2d_keep_read). */
void conv_dnnl_keep_read(ConvDnnl *d, const KConv *cv, int n, const void *keep, float *x);

/* Dense candidate (conv_dense.c): the convolution as a (K*OH*OW) x (C*H*W) matrix, plain
 * layouts, float32. conv_dense_floats: that matrix's size; conv_dense_new refuses one over
 * CONV_DENSE_MAX floats (PD_EINVAL). set: KSET_DX / KSET_DW as kern_conv2d_bwd_set. */
enum { CONV_DENSE_MAX = 1 << 24 };
typedef struct ConvDense ConvDense;
size_t conv_dense_floats(const KConv *cv);
int    conv_dense_new(const KConv *cv, ConvDense **out, Err *err);
void   conv_dense_free(ConvDense *d);   /* NULL is fine */
void   conv_dense_fwd(ConvDense *d, const KConv *cv, int n, const float *x, const float *w, const float *b, float *y);
void   conv_dense_bwd(ConvDense *d, const KConv *cv, int n, int set, const float *x, const float *w, const float *y,
                      const float *dy, float *dx, float *dw, float *db);

#endif
