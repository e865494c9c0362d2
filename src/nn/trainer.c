/* trainer.c: the whole model on one worker: buffers allocated once, then one training step
 * = forward, softmax cross-entropy, backward, optimizer update. Used by `pipedream train`
 * and `pipedream bench`; pipelined training lives in the runtime module. */
#include "nn.h"

#include <string.h>

#include "kernels.h"

int model_loss_positions(const Model *m, int *classes) {
    Shape out = model_layer_out_shape(m, model_n_layers(m) - 1);
    *classes = out.d[out.ndim - 1];
    return (int)(shape_numel(out) / (size_t)*classes);
}

int model_input_vocab(const Model *m) {
    if (strcmp(model_layer_type(m, 0), "embed") != 0) return 0;
    int n;
    const ParamInfo *pt = model_param_tensors(m, &n);
    return pt[0].shape.d[0];   // the embedding's weight (vocab, dim)
}

int trainer_init(Trainer *t, Model *m, int n_max, const OptConfig *oc, uint64_t seed, Err *err) {
    memset(t, 0, sizeof *t);
    int nl = model_n_layers(m);
    Shape out = model_layer_out_shape(m, nl - 1);
    if (out.ndim > 2)
        return err_set(err, PD_EINVAL, "%s: the last layer's output %s is neither class logits (K) nor per-position "
                       "logits (T, K)", model_name(m), shape_str(out, (char[64]){0}, 64));
    int rc = model_build(m, 0, nl, n_max, err);
    if (rc) return rc;
    t->m = m;
    t->n_max = n_max;
    t->positions = model_loss_positions(m, &t->classes);
    t->seed = seed;
    t->n_params = model_param_count(m, 0, nl);
    t->n_state = model_state_count(m, 0, nl);
    t->w = pd_alloc_f32(t->n_params);
    t->dw = pd_alloc_f32(t->n_params);
    t->state = pd_alloc_f32(t->n_state ? t->n_state : 1);
    t->dlogits = pd_alloc_f32((size_t)n_max * t->positions * t->classes);
    model_init_params(m, 0, nl, seed, t->w);
    model_init_state(m, 0, nl, t->state);
    t->ctx = nnctx_new(m, 0, nl, n_max);
    optim_init(&t->opt, oc, t->n_params);
    return PD_OK;
}

void trainer_release(Trainer *t) {
    if (!t) return;
    pd_free(t->w);
    pd_free(t->dw);
    pd_free(t->state);
    pd_free(t->dlogits);
    nnctx_free(t->ctx);
    optim_release(&t->opt);
    memset(t, 0, sizeof *t);
}

float trainer_step(Trainer *t, const float *x, const int32_t *labels, int n, uint64_t minibatch, int *correct) {
    PD_ASSERT(n >= 1 && n <= t->n_max);
    NnRun run = {.n = n, .train = 1, .seed = t->seed, .minibatch = minibatch};
    const float *logits = model_forward(t->m, t->ctx, t->w, t->state, x, &run);
    int rows = n * t->positions;
    memset(t->dlogits, 0, (size_t)rows * t->classes * sizeof(float));
    float loss = kern_xent_fwd_bwd(logits, labels, t->dlogits, rows, t->classes, 1.0f, correct);
    model_grads_discard(t->m, 0, model_n_layers(t->m));   /* the backward writes dw */
    model_backward(t->m, t->ctx, t->w, t->dlogits, NULL, t->dw);
    model_tie_fold(t->m, 0, model_n_layers(t->m), t->dw);   /* tied weights: one summed gradient */
    if (t->opt.c.clip_norm > 0.0f) {   /* one worker: the whole model's gradient, a tied tensor once */
        double ss = optim_sumsq(t->dw, t->n_params) - model_tie_mirror_sumsq(t->m, 0, model_n_layers(t->m), t->dw);
        optim_scale(t->dw, t->n_params, optim_clip_coef(ss > 0.0 ? ss : 0.0, t->opt.c.clip_norm));
    }
    optim_step(&t->opt, t->w, t->dw);
    return loss;
}

float trainer_eval(Trainer *t, const float *x, const int32_t *labels, int n, int *correct) {
    PD_ASSERT(n >= 1 && n <= t->n_max);
    NnRun run = {.n = n, .train = 0, .seed = t->seed, .minibatch = 0};
    const float *logits = model_forward(t->m, t->ctx, t->w, t->state, x, &run);
    return kern_xent_fwd_bwd(logits, labels, NULL, n * t->positions, t->classes, 1.0f, correct);
}
