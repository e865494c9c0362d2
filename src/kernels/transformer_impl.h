/* transformer_impl.h: what transformer.c shares with its oneDNN candidate
 * (transformer_dnnl.c). Not a public header. */
#ifndef PD_TRANSFORMER_IMPL_H
#define PD_TRANSFORMER_IMPL_H

#include "kernels.h"

typedef struct TfDnnl TfDnnl;

/* Layer norm of (rows, d) and softmax over the last axis of (rows, cols), primitives for up to
 * rows_max rows (other row counts: created on first use, one cached). Outputs are written (=),
 * not accumulated. */
int  tf_dnnl_layernorm_new(TfDnnl **out, int rows_max, int d, float eps, Err *err);
int  tf_dnnl_softmax_new(TfDnnl **out, int rows_max, int cols, Err *err);
void tf_dnnl_free(TfDnnl *t);   /* NULL is fine */
void tf_dnnl_layernorm_fwd(TfDnnl *t, int rows, const float *x, const float *g, const float *b, float *y, float *mean,
                           float *var);
void tf_dnnl_layernorm_bwd(TfDnnl *t, int rows, const float *x, const float *g, const float *mean, const float *var,
                           const float *dy, float *dx, float *dg, float *db);
void tf_dnnl_softmax_fwd(TfDnnl *t, int rows, const float *x, float *y);
void tf_dnnl_softmax_bwd(TfDnnl *t, int rows, const float *y, const float *dy, float *dx);

/* Attention's batched matrix products over all (sample, head) pairs (transformer_dnnl.c):
 * which = MM_SCORES P = scale Q K^T (src qkv, wei qkv + D, dst p); MM_VALUES Y = P V (p,
 * qkv + 2D, y); MM_DP dP = dY V^T (dy, qkv + 2D, dp); MM_DV dV += P^T dY (p, dy, dqkv + 2D);
 * MM_DQ dQ += scale dS K (ds, qkv + D, dqkv); MM_DK dK += scale dS^T Q (ds, qkv, dqkv + D). */
typedef struct TfAttn TfAttn;
enum { TF_MM_SCORES, TF_MM_VALUES, TF_MM_DP, TF_MM_DV, TF_MM_DQ, TF_MM_DK, TF_MM_VALUES_B };
/* bf16: src and wei are bf16 (uint16_t) buffers laid out as the float32 ones would be; dst is
 * float32, but for TF_MM_VALUES_B: MM_VALUES writing y in the operands' type. */
int  tf_dnnl_attn_new(TfAttn **out, int n_max, int t, int heads, int hd, int bf16, Err *err);
void tf_dnnl_attn_free(TfAttn *a);   /* NULL is fine */
void tf_dnnl_attn_mm(TfAttn *a, int which, int n, const void *src, const void *wei, void *dst);

#endif
