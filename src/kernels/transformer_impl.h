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

#endif
