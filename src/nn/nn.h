/* nn.h: layers, models, optimizers and a one-worker training step.
 *
 * A model is an ordered list of TOP-LEVEL layers read from a model JSON file (models/NAME.json);
 * a residual block is one top-level layer holding its body and shortcut. Pipeline stages
 * are ranges [first, last) of top-level layers: every call below works on a range.
 *
 * Memory (llm.c style, sizes first, then one block per kind):
 *   - parameters of a range live in ONE contiguous float buffer, in PyTorch's
 *     model.parameters() order (per layer: weight then bias; lstm: w_ih, w_hh, b_ih, b_hh;
 *     batchnorm: gamma then beta; residual: body layers then shortcut layers); gradients in
 *     another buffer of the same layout. A buffer for range [first, last) starts with the
 *     parameters of layer `first`: offsets inside it are model_param_offset(m, i) -
 *     model_param_offset(m, first).
 *   - non-trained state (batch-norm running mean then running var, per batchnorm layer) lives in
 *     a third buffer with the same range convention (model_state_offset).
 *   - per-minibatch-in-flight data (the range's input copy, every top-level layer's output,
 *     saved state for backward: pool argmax, bn statistics, lstm gates, dropout masks) lives in
 *     an NnCtx. Several NnCtx can be in flight on one built model, each with its own weight
 *     version; a Model itself holds only kernel descriptors and backward scratch, so calls on
 *     one Model must not run concurrently (kernels are not thread-safe on a descriptor).
 *
 * Shapes are per sample (no batch dimension); buffers are batch-major (N, ...). Backward
 * ACCUMULATES into dw and dx (+=), as the kernels do.
 *
 * Not here: data reading (data.h), pipelining (runtime), checkpoints. */
#ifndef PD_NN_H
#define PD_NN_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

typedef struct Model Model;
typedef struct NnCtx NnCtx;

typedef enum ParamKind { PARAM_WEIGHT, PARAM_BIAS, PARAM_GAMMA, PARAM_BETA, PARAM_KIND_COUNT } ParamKind;

/* One parameter tensor, for init, checkpoints and tests. */
typedef struct ParamInfo {
    char name[64];    /* "layers.3.weight", "layers.5.body.0.weight" (PyTorch-like) */
    Shape shape;      /* as PyTorch stores it, e.g. conv (K, C, R, S) */
    size_t offset;    /* floats from the start of the WHOLE model's parameter buffer */
    int layer;        /* top-level layer index */
    ParamKind kind;
    int fan_in;       /* PyTorch's init bound is 1/sqrt(fan_in) (lstm: hidden size) */
} ParamInfo;

/* ---- model: reading and shapes --------------------------------------------------------- */
/* Reads and checks a model JSON file (see models/NAME.json and model.c for the format): every
 * layer's type, required keys, unknown keys and shapes. Returns a model the caller frees with
 * model_free, or NULL with err naming the file, the layer index (and sub-layer path) and the
 * key. The model is not yet runnable: see model_build. */
Model *model_load(const char *path, Err *err);
/* Same from a JSON text; name is used in messages in place of the path. */
Model *model_parse(const char *json, const char *name, Err *err);
void   model_free(Model *m);   /* NULL is fine */

const char *model_name(const Model *m);
int    model_n_layers(const Model *m);                  /* top-level layers */
Shape  model_input_shape(const Model *m);               /* per sample, e.g. (1, 28, 28) */
Shape  model_layer_out_shape(const Model *m, int i);    /* output of top-level layer i */
Shape  model_layer_in_shape(const Model *m, int i);
/* Bytes a context keeps for top-level layer i's backward besides its output, for n samples
 * (batch-norm statistics, pooling indices, masks, a residual's inner activations). */
size_t model_layer_saved_bytes(const Model *m, int i, int n);
const char *model_layer_type(const Model *m, int i);    /* "conv2d", "residual", ... */
/* Forward FLOPs per sample of layer i (multiply-add = 2; conv, linear, lstm only, as
 * PyTorch's counters do). */
double model_layer_flops(const Model *m, int i);

/* Floats of parameters / state of layers [first, last); 0 <= first <= last <= n_layers. */
size_t model_param_count(const Model *m, int first, int last);
size_t model_state_count(const Model *m, int first, int last);
/* Floats of parameters / state before top-level layer i (i == n_layers: the total). */
size_t model_param_offset(const Model *m, int i);
size_t model_state_offset(const Model *m, int i);
/* The parameter tensors of the whole model, in buffer order (borrowed, valid until
 * model_free); *n receives their number. */
const ParamInfo *model_param_tensors(const Model *m, int *n);

/* Tied parameters: a layer with "tie": "layers.0.weight" uses that earlier layer's tensor as its
 * own weight (same shape: an output head sharing the token embedding). The tied layer keeps a
 * slot for it in the parameter buffer, a mirror: model_init_params fills it with the source's
 * values, and model_tie_fold gives both slots the same summed gradient before every optimizer
 * step, so the two stay bitwise equal and train as one parameter (the runtime exchanges the sum
 * when the two layers are on different stages). */
typedef struct ParamTie {
    int src, dst;   /* indices into model_param_tensors: the source (earlier layer), its mirror */
} ParamTie;
/* The model's ties (borrowed; *n receives their number, 0 without). */
const ParamTie *model_ties(const Model *m, int *n);
/* For every tie whose two tensors lie in [first, last): g = dw[src] + dw[dst] (the lower layer's
 * gradient first), written into both; dw in the range layout. Ties with one end outside the range
 * are left alone (the runtime exchanges them). */
void model_tie_fold(const Model *m, int first, int last, float *dw);
/* The sum of squares (double) of the mirror slots in [first, last) of dw (range layout): a
 * gradient norm subtracts it so that a tied parameter counts once, as in PyTorch. */
double model_tie_mirror_sumsq(const Model *m, int first, int last, const float *dw);

/* ---- model: building and running ------------------------------------------------------ */
/* Creates the kernel descriptors and backward scratch of layers [first, last) for minibatches
 * of up to n_max samples. May be called again to build another (or a larger) range. Returns
 * PD_OK or an error (a shape a kernel library rejects). */
int model_build(Model *m, int first, int last, int n_max, Err *err);

/* The compute precision of the model's matrix products (convolution, linear, dense,
 * attention): 0 float32 (the default), 1 bf16 inputs with float32 accumulation and outputs
 * (kernels.h, KPREC_*; parameters, gradients, optimizer state and element-wise layers stay
 * float32). Layers already built are released: call model_build (again) after it. */
void model_set_precision(Model *m, int prec);
int  model_precision(const Model *m);

/* Initialises the parameters of [first, last) into w (range layout) by the model JSON's "init"
 * schemes (init.c, docs/reference/formats.md); without one, PyTorch's default: weights and biases
 * uniform(+-1/sqrt(fan_in)), gamma 1, beta 0. Draws come from Philox(seed, RNG_STREAM_INIT,
 * substream = layer id), so the values are a pure function of (seed, layer) whatever the range. */
void model_init_params(const Model *m, int first, int last, uint64_t seed, float *w);
/* Running mean 0, running var 1. */
void model_init_state(const Model *m, int first, int last, float *state);

/* How one forward runs: n samples (<= n_max), training (batch statistics, dropout) or eval,
 * and the dropout mask key: element masks are a pure function of (seed, layer id, minibatch). */
typedef struct NnRun {
    int n;
    int train;
    uint64_t seed;
    uint64_t minibatch;   /* global minibatch index */
} NnRun;

/* A per-minibatch context for layers [first, last) and up to n_max samples; caller owns it
 * (nnctx_free). All of its memory is allocated (and touched) here, none per step. */
NnCtx *nnctx_new(const Model *m, int first, int last, int n_max);
void   nnctx_free(NnCtx *c);   /* NULL is fine */
size_t nnctx_bytes(const NnCtx *c);
/* The input buffer (n_max, in shape of `first`): a receiver may write the input here and
 * pass it as x to model_forward (no copy then). */
float *nnctx_input(NnCtx *c);
/* The output of the range's last layer (n, out shape) after model_forward. */
const float *nnctx_output(const NnCtx *c);
/* The activation layouts of the built range [first, last), cut into pieces at the boundaries
 * in cut (cut[i - first] != 0: a stage boundary between layers i and i + 1; NULL: none), each
 * piece with plain ends, as model_forward lays them out: ends[i - first] gets NN_END_X when
 * layer i's input (and the gradient w.r.t. it) is channel-blocked (nChw16c or nChw8c, where oneDNN's
 * convolutions want it) and NN_END_Y when its output is. A stage boundary where the whole range
 * keeps the activation blocked costs layout changes and slower plain-layout kernels that a
 * layer inside a stage does not pay. */
enum { NN_END_X = 1, NN_END_Y = 2 };
void model_cut_layouts(const Model *m, int first, int last, const unsigned char *cut, unsigned char *ends);
/* Gives the ctx's range blocked ends: its input (and the input gradient) arrives blocked if
 * x_blocked, its output (and output gradient) leaves blocked if y_blocked, so that one-layer
 * contexts chained together run each layer as it runs inside a longer range (the profiler's
 * timings). Returns 0, changing nothing, when the range's layers cannot meet those ends. */
int nnctx_set_ends(NnCtx *c, int x_blocked, int y_blocked);

/* Forward of the ctx's range with parameters w and state (range layouts; state is updated in
 * training mode, may be NULL if the range has none). x (n, in shape) is copied into the ctx
 * unless it is nnctx_input(c). Returns nnctx_output(c). The range must have been built with
 * n_max >= run->n. */
const float *model_forward(Model *m, NnCtx *c, const float *w, float *state, const float *x, const NnRun *run);
/* Backward of the ctx's range after its forward, with the SAME w as that forward (a stashed
 * version): dy (n, out shape) is the gradient w.r.t. the output; dw (range layout) += dL/dw;
 * dx (n, in shape) += dL/dx unless dx is NULL (input gradient not wanted: cheaper). dy must
 * not point into c. */
void model_backward(Model *m, NnCtx *c, const float *w, const float *dy, float *dx, float *dw);
/* The same, calling done(arg, i) right after top-level layer i's backward (i descending): from
 * then on its part of dw is final for this call, so a caller may start reducing it (gradient
 * buckets all-reduced while the backward of earlier layers still runs). */
typedef void (*NnLayerDone)(void *arg, int layer);
void model_backward_hook(Model *m, NnCtx *c, const float *w, const float *dy, float *dx, float *dw,
                         NnLayerDone done, void *arg);

/* Says that the gradient buffer's part for layers [first, last) holds nothing wanted, as if
 * zeroed: the next backward of each of those layers (model_backward*, whichever buffer it is
 * given) writes its gradient there instead of adding to it, which spares zeroing it and the
 * kernels reading it (vgg16's 2048 x 2048 linear layer at bf16: its weight gradient in about
 * 40% of the time, bench/matmul_sum.c). Later backwards add, as usual. Same numbers as zeroing the buffer, up to
 * the sign of zeros. */
void model_grads_discard(Model *m, int first, int last);
/* Zeroes the parts of dw (the range's layout) of layers [first, last) still discarded, before
 * the buffer is read whole (all-reduce, optimizer step): a layer no backward has run for. */
void model_grads_settle(Model *m, int first, int last, float *dw);

/* The backward in two passes (the zero-bubble kinds' BI and BW), with the SAME w and dy as one
 * model_backward would get: model_backward_b computes dx (as model_backward; NULL: not wanted)
 * and, for layers whose weight gradient does not split (lstm, attention, block, residual,
 * batchnorm), also their part of dw; for the layers that split (linear, dense, conv2d, embed,
 * layernorm) it stores the gradient w.r.t. their output into keep, a per-unit buffer of
 * model_split_floats(m, first, last, n_max of c) floats that the caller owns, and leaves their
 * dw alone. model_backward_w, later (c, dy and keep untouched in between), adds those layers'
 * dw. The two leave dx and dw bitwise as model_backward does. done(arg, i) (may be NULL) is
 * called after top-level layer i of the weight pass, i descending, as in model_backward_hook. */
size_t model_split_floats(const Model *m, int first, int last, int n_max);
/* 1 if top-level layer i has a weight pass of its own in model_backward_w (it has parameters and
 * splits), 0 if its whole backward runs in model_backward_b. */
int    model_layer_splits(const Model *m, int i);
void model_backward_b(Model *m, NnCtx *c, const float *w, const float *dy, float *dx, float *dw, float *keep);
void model_backward_w(Model *m, NnCtx *c, const float *w, const float *dy, const float *keep, float *dw,
                      NnLayerDone done, void *arg);

/* ---- optimizers ------------------------------------------------------------------------ */
typedef enum OptKind { OPT_SGD, OPT_ADAM, OPT_ADAMW, OPT_KIND_COUNT } OptKind;

/* The learning rate over the optimizer's steps t = 0, 1, ... (optim_lr): LR_CONSTANT keeps
 * lr; the others first warm up linearly over `warmup` steps (lr (t + 1) / warmup; also with
 * LR_CONSTANT when warmup > 0), then decay from lr to min_lr at step `decay_steps`, by a half
 * cosine (LR_COSINE) or a straight line (LR_LINEAR), and stay at min_lr after it. */
typedef enum LrSchedKind { LR_CONSTANT, LR_COSINE, LR_LINEAR, LR_SCHED_COUNT } LrSchedKind;

typedef struct OptConfig {
    OptKind kind;
    float lr;
    float momentum;        /* sgd; 0 = plain SGD */
    float weight_decay;    /* sgd, adam: g += wd * w (PyTorch's coupled L2); adamw: w *= 1 - lr wd */
    float beta1, beta2, eps;   /* adam, adamw */
    LrSchedKind lr_sched;
    long warmup;           /* steps of the linear warm-up (0: none) */
    long decay_steps;      /* the step at which the decay reaches min_lr (0: the run's own length,
                            * which the caller resolves before optim_init) */
    float min_lr;          /* the decay's floor */
    float clip_norm;       /* global gradient-norm clipping threshold (0 = off); applied by the
                            * caller, who knows what "global" spans (optim_clip_coef) */
} OptConfig;

/* SGD: PyTorch's torch.optim.SGD (dampening 0, no nesterov); Adam: torch.optim.Adam
 * (amsgrad off) with bias correction; AdamW: torch.optim.AdamW (decoupled decay first, then
 * Adam's step). State in contiguous buffers of n floats. */
typedef struct Optim {
    OptConfig c;
    size_t n;
    long step;       /* steps taken */
    double lr_scale; /* a factor on the scheduled lr of the next step (1; staleness warm-up sets
                      * it), and of the last one for optim_predict */
    float *m;        /* sgd momentum buffer / adam first moment (n) */
    float *v;        /* adam second moment (n), NULL for sgd */
} Optim;

/* OptConfig with PyTorch's defaults for kind (adam: betas 0.9, 0.999, eps 1e-8), constant lr. */
OptConfig optim_defaults(OptKind kind, float lr);
/* Parses "sgd" / "adam" / "adamw"; returns -1 if unknown. */
int   optim_kind_parse(const char *s);
const char *optim_kind_name(OptKind k);
/* 1 for the kinds with Adam's two moments (adam, adamw). */
static inline int optim_is_adam(OptKind k) { return k == OPT_ADAM || k == OPT_ADAMW; }
/* Parses "constant" / "cosine" / "linear"; returns -1 if unknown. */
int   optim_lr_sched_parse(const char *s);
const char *optim_lr_sched_name(LrSchedKind k);
/* The scheduled learning rate of step t (0-based) under c, in double. */
double optim_lr(const OptConfig *c, long t);
void  optim_init(Optim *o, const OptConfig *c, size_t n);
void  optim_release(Optim *o);
/* One update of w (n) from the gradient g (n) at lr optim_lr(step) * lr_scale; g is not
 * modified. */
void  optim_step(Optim *o, float *w, const float *g);
/* Weight prediction (staleness compensation): out = w - scale * (the update the last step
 * applied, as a function of the state now; lr: optim_lr(step - 1) * lr_scale): SGD lr * m (m: the momentum buffer, or the last
 * step's gradient plus decay when momentum is 0), Adam lr / bc1 * m / (sqrt(v) / sqrt(bc2) +
 * eps) with the last step's bias corrections, AdamW that plus lr * wd * w. Before the first
 * step, or with scale 0, out = w bitwise. out may be w. */
void  optim_predict(const Optim *o, const float *w, float *out, float scale);

/* Gradient-norm clipping, in pieces a distributed caller can combine: optim_sumsq is the
 * squared norm of g (n) in double, summed in a fixed order (the same for any thread count);
 * optim_clip_coef turns the global sum of squares into PyTorch's clip_grad_norm_ factor,
 * min(1, max_norm / (sqrt(sumsq) + 1e-6)), as a float; optim_scale multiplies g by it. */
double optim_sumsq(const float *g, size_t n);
float  optim_clip_coef(double sumsq, float max_norm);
void   optim_scale(float *g, size_t n, float coef);

/* ---- the loss ------------------------------------------------------------------------------ */
/* Softmax cross-entropy over the LAST dimension of the model's output at every position of the
 * dimensions before it: output (K) = one class vector per sample, targets (n); output (T, K) = a
 * language model's logits, targets (n, T), the loss the mean over all n * T positions (nats per
 * token). Returns the positions per sample (the product of the dimensions before the last: 1 or T) and
 * sets *classes = K. Callers pass n * positions rows to kern_xent_fwd_bwd. */
int model_loss_positions(const Model *m, int *classes);
/* The vocabulary size when the model's input is token ids (its first layer is an "embed"):
 * inputs must then be integers in [0, vocab) stored as floats, so a synthetic-data generator
 * (profiler, bench) must draw them so. 0 for any other model. */
int model_input_vocab(const Model *m);

/* ---- one-worker training ---------------------------------------------------------------- */
/* The whole model on one worker: parameters, gradients, state, optimizer, one ctx, all
 * allocated once by trainer_init. */
typedef struct Trainer {
    Model *m;          /* borrowed */
    size_t n_params, n_state;
    float *w, *dw, *state;
    float *dlogits;    /* (n_max, positions, classes) */
    int n_max, classes;
    int positions;     /* targets per sample (model_loss_positions) */
    uint64_t seed;
    NnCtx *ctx;
    Optim opt;
} Trainer;

/* Builds the whole model for n_max samples and initialises parameters from seed. The last
 * layer's output is (classes) or (positions, classes), see model_loss_positions. */
int   trainer_init(Trainer *t, Model *m, int n_max, const OptConfig *oc, uint64_t seed, Err *err);
void  trainer_release(Trainer *t);
/* One SGD/Adam step on (x (n, input shape), labels (n, positions)); minibatch is the global
 * index (the dropout key). Returns the mean loss over the n * positions targets; *correct (if
 * non-NULL) gets the argmax hits among them. */
float trainer_step(Trainer *t, const float *x, const int32_t *labels, int n, uint64_t minibatch, int *correct);
/* Eval-mode forward and loss, no update. */
float trainer_eval(Trainer *t, const float *x, const int32_t *labels, int n, int *correct);
/* Forward FLOPs per sample of the whole model. */
double model_flops(const Model *m);

#endif
