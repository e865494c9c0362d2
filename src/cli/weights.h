/* weights.h: weights files: the safetensors layout of ckpt.h holding a model's parameter
 * tensors under their global names (model_param_tensors: "layers.3.weight",
 * "layers.1.steps.0.1.qkv.weight") and each layer's non-trained state as "state.layers.<i>"
 * (batch-norm running mean then var). These are the names a checkpoint of `pipedream train`
 * uses (src/runtime/rt_ckpt.c), so every checkpoint is also a weights file (its optimizer
 * tensors and counters are ignored). Written by `pipedream train --save` and
 * tools/export_torch.py; read by `pipedream train --init` and `pipedream eval --weights`. */
#ifndef PD_WEIGHTS_H
#define PD_WEIGHTS_H

#include "nn.h"

/* Reads every parameter tensor of m into w (whole-model layout) and, for layers with state,
 * "state.layers.<i>" into state. Fails (PD_EIO / PD_EINVAL naming the file and the tensor) if
 * the file is damaged, lacks a tensor, or a tensor's dtype (F32) or shape differs. */
int weights_load(const char *path, const Model *m, float *w, float *state, Err *err);
/* Writes w and state (whole-model layouts) atomically, with metadata pipedream.model and
 * pipedream.params. */
int weights_save(const char *path, const Model *m, const float *w, const float *state, Err *err);

#endif
