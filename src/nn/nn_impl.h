/* nn_impl.h: what the layer files and model.c share: the Layer struct and the LayerOps
 * vtable (one const table per kind, in layer_<kind>.c). Not a public header. */
#ifndef PD_NN_IMPL_H
#define PD_NN_IMPL_H

#include <cjson/cJSON.h>

#include "kernels.h"
#include "nn.h"

typedef struct Layer Layer;

/* ---- initialisation schemes (init.c; the model JSON's "init") ---- */
typedef enum NnInitKind {
    NN_INIT_UNSET,            /* not given: the model's scheme for the type, else default */
    NN_INIT_DEFAULT,          /* PyTorch's default for the layer */
    NN_INIT_CONSTANT,         /* a (zeros, ones, constant) */
    NN_INIT_UNIFORM,          /* [a, b) */
    NN_INIT_NORMAL,           /* mean a, std b */
    NN_INIT_KAIMING_UNIFORM,  /* gain b, fan_out: mode */
    NN_INIT_KAIMING_NORMAL,
    NN_INIT_XAVIER_UNIFORM,   /* gain b */
    NN_INIT_XAVIER_NORMAL,
    NN_INIT_KIND_COUNT
} NnInitKind;
typedef struct NnInit {
    int kind;      /* NnInitKind */
    int fan_out;   /* kaiming: mode fan_out (else fan_in) */
    double a, b;
} NnInit;
enum { NN_INIT_ROLES = 2 };   /* 0: "weight" (weights, gamma), 1: "bias" (biases, beta) */
/* One scheme: a name ("zeros") or an object {"scheme": ..., parameters}. */
int  nn_init_parse(const cJSON *o, NnInit *out, const char *ctx, Err *err);
/* {"weight": scheme, "bias": scheme}, either optional; out is left as is for absent roles. */
int  nn_init_parse_roles(const cJSON *o, NnInit out[NN_INIT_ROLES], const char *ctx, Err *err);
int  nn_init_role(ParamKind kind);
int  nn_init_needs_fans(const NnInit *s);   /* kaiming, xavier: tensors of >= 2 dimensions */
const char *nn_init_name(const NnInit *s);
/* PyTorch's fans: fan_in = size(1) * receptive field, fan_out = size(0) * receptive field. */
void nn_init_fans(Shape s, double *fan_in, double *fan_out);
/* Fills d (the tensor p) by scheme s, drawing from r (the layer's init stream). */
void nn_init_fill(const NnInit *s, const ParamInfo *p, Rng *r, float *d);

#define NN_MAX_PT 4   /* parameter tensors per (non-residual) layer */
/* Largest per-sample activation / per-layer parameter count a model may have (int-indexed
 * kernels). */
#define NN_MAX_NUMEL (1L << 30)

/* Rounds a byte count up to 64 (every sub-buffer of a ctx is cache-line aligned). */
static inline size_t nn_align(size_t b) { return (b + 63) & ~(size_t)63; }

typedef struct LayerOps {
    const char *name;   /* as spelled in model.json */
    /* Reads the layer's keys from j (l->in, l->path, l->uid are set); sets l->out, the
     * parameter tensors (l->pt, l->n_pt, l->n_params with offsets relative to the layer),
     * l->n_state and l->flops. Shape errors name ctx. Required. */
    int (*parse)(Layer *l, JObj *j, const char *ctx, Err *err);
    /* Creates descriptors and layer-owned scratch for up to n_max samples. May be NULL. */
    int (*build)(Layer *l, int n_max, Err *err);
    void (*release)(Layer *l);   /* frees what build made; NULL if nothing */
    /* Bytes of per-minibatch saved state for n_max samples. NULL: none. */
    size_t (*saved_bytes)(const Layer *l, int n_max);
    void (*init_state)(const Layer *l, float *state);   /* NULL: no state */
    /* y (n, out) from x (n, in). w: the layer's parameters; state: its running stats. */
    void (*forward)(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y, void *saved);
    /* dx (may be NULL) += dL/dx, dw += dL/dw, from dy; x, y, saved as forward left them. */
    void (*backward)(Layer *l, const NnRun *r, const float *w, const float *x, const float *y, const void *saved,
                     const float *dy, float *dx, float *dw);
    /* The split backward of the zero-bubble kinds (BI and BW), optional, both or neither:
     * backward_data does backward's dx part alone (dx may be NULL: nothing to do), and
     * backward_weights its dw part alone, later, from the same w, x, y, saved and dy. Together
     * they must leave dx and dw bitwise as backward does (the same kernel calls, split), which
     * tests/test_nn_split.c checks per kind. A layer with parameters but without them (its
     * weight gradient needs intermediates of the data pass: lstm, attention, block, residual,
     * batchnorm) runs backward whole in BI; a layer without parameters only has a data pass. */
    void (*backward_data)(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                          const void *saved, const float *dy, float *dx);
    void (*backward_weights)(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                             const void *saved, const float *dy, float *dw);
    /* The activation layouts the built layer takes besides plain NCHW (NN_BLK_*), NULL: none.
     * model.c keeps an activation blocked (kernels.h, KCONV_X_BLK) between two layers when
     * the producer can write it so and the consumer read it so, and tells each call in
     * l->lay; the range's input and output stay plain. */
    int (*layouts)(const Layer *l);
    /* KSET_* (kernels.h): what its backward can write rather than add to, told per call in
     * l->set. For the others model.c zeroes the buffer first. */
    int sets;
} LayerOps;
/* The layouts l takes (its ops' layouts once built, else 0). */
int nn_layer_layouts(const Layer *l);
/* Plans the layouts of the chain ls[0 .. n) (a range's layers, a residual's body): its input
 * arrives blocked if xb, its output must leave blocked if yb. An activation stays blocked
 * where its producer can write it so and its consumer (through layout-preserving layers)
 * read it so. lay[i] gets layer i's KCONV_X_BLK | KCONV_Y_BLK (for Layer.lay). Returns 0
 * when the ends cannot be met (lay is then undefined). */
int nn_plan_layouts(const Layer *ls, int n, int xb, int yb, unsigned char *lay);
/* Before a container's sub-layer c's backward into dk (NULL: none): fresh, dk's old contents
 * are not wanted (a buffer of the container's, or the caller's dx told to be written:
 * Layer.set); then c writes dk if it can (KSET_DX), else dk is zeroed for it to add to. Its
 * weight gradient always adds (model.c zeroes the whole layer's part where it is to be
 * written). */
void nn_sub_set(Layer *c, float *dk, int fresh, int n);
enum {
    NN_BLK_IN = 1,    /* x (and dx) may be blocked */
    NN_BLK_OUT = 2,   /* y (and dy) may be blocked */
    NN_BLK_SAME = 4   /* element- or channel-wise: y is in x's layout, whichever */
};

struct Layer {
    const LayerOps *ops;
    char path[48];          /* "layers.3", "layers.3.body.1": names of parameter tensors */
    uint64_t uid;           /* init substream and dropout stream: top-level index, or
                               (index+1) << 16 | 1 + sub index for sub-layers */
    int top;                /* top-level index */
    Shape in, out;          /* per sample */
    size_t n_params, n_state;
    ParamInfo pt[NN_MAX_PT];   /* offsets relative to the layer's first parameter */
    int n_pt;
    size_t param_off, state_off;   /* from the model start (top-level) or the parent's start */
    double flops;           /* forward FLOPs per sample */
    NnInit init[NN_INIT_ROLES];   /* "init" of this layer (weight, bias roles) */
    char tie[64];           /* "tie": the earlier parameter its weight mirrors ("" = none) */
    int built_n;            /* n_max it was built for; 0 = not built */
    int lay;                /* this call's layouts (KCONV_X_BLK: x, dx; KCONV_Y_BLK: y, dy),
                               set by model.c before each forward/backward; 0: plain */
    int set;                /* this backward call's KSET_*: dx and/or dw (with the bias) are
                               to be written, not added to (only bits of ops->sets), set by
                               model.c before each backward */
    int dw_discarded;       /* its part of the gradient buffer holds nothing wanted
                               (model_grads_discard): the next backward writes it */
    int prec;               /* compute precision of its matrix products (KPREC_*), set by
                               model_set_precision before build; build passes it on */

    /* kind-specific configuration */
    int cin, cout, k, stride, pad, bias, relu;
    float p, eps, momentum;
    KConv conv;
    KLinear lin[2];         /* linear, dense: [0]; attention: [0] qkv, [1] proj */
    KLstm lstm;
    KLayerNorm ln;          /* layernorm */
    KAttn attn;             /* attention */
    float *scratch;         /* layer-owned backward scratch (built) */

    /* residual: sub[0 .. n_body) is the body, sub[n_body .. n_body + n_short) the shortcut */
    Layer *sub;
    int n_body, n_short;
    int sub_caps;             /* residual: its NN_BLK_* (from the built sub-layers) */
    unsigned char *sub_lay;   /* residual: this call's sub-layer layouts (built) */
};

/* Parses one layer object (any kind, residual included) with input shape in. path names it
 * ("layers.3"), ctx prefixes messages ("models/x.json: layer 3"). */
int  nn_layer_parse(Layer *l, const cJSON *o, Shape in, const char *path, const char *ctx, uint64_t uid, int top,
                    Err *err);
int  nn_layer_build(Layer *l, int n_max, Err *err);
void nn_layer_release(Layer *l);
size_t nn_layer_saved_bytes(const Layer *l, int n_max);
/* Appends l's parameter tensors (recursing into residuals) with offsets shifted by base. */
void nn_layer_collect_params(const Layer *l, size_t base, ParamInfo *out, int *n);
int  nn_layer_count_pt(const Layer *l);
void nn_layer_init_state(const Layer *l, float *state);

/* Fills a ParamInfo of l with the given name suffix and shape; updates l->n_params. */
void nn_add_param(Layer *l, const char *suffix, Shape s, ParamKind kind, int fan_in);

/* a * b * ... checked for int overflow is overkill here: shapes come from small JSON. */
static inline size_t nn_numel(Shape s) { return shape_numel(s); }

extern const LayerOps LAYER_LINEAR, LAYER_CONV2D, LAYER_MAXPOOL, LAYER_GAP, LAYER_RELU, LAYER_DROPOUT,
    LAYER_BATCHNORM, LAYER_LSTM, LAYER_FLATTEN, LAYER_RESHAPE, LAYER_PAD, LAYER_RESIDUAL, LAYER_LAST_STEP;
/* transformer and language-model kinds (layer_embed.c, layer_layernorm.c, layer_attention.c,
 * layer_gelu.c, layer_dense.c, layer_block.c) */
extern const LayerOps LAYER_EMBED, LAYER_LAYERNORM, LAYER_ATTENTION, LAYER_GELU, LAYER_DENSE, LAYER_BLOCK;

/* Frees a layer's built resources and its sub-layer arrays (recursively). */
void nn_layer_destroy(Layer *l);

/* Shape helper for messages: "(3, 8, 8)" in one of 4 buffers of the calling thread, used in
 * turn (so up to 4 may appear in one message; threads never share them). */
const char *nn_shape_str(Shape s);

#endif
