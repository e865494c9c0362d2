/* optim.c: SGD with momentum and weight decay, and Adam, with PyTorch's exact update rules
 * (torch.optim.SGD with dampening 0 and nesterov off; torch.optim.Adam with amsgrad off),
 * as one loop over contiguous buffers. It does not schedule learning rates or clip. */
#include "nn.h"

#include <math.h>
#include <string.h>

OptConfig optim_defaults(OptKind kind, float lr) {
    OptConfig c = {.kind = kind, .lr = lr, .momentum = 0.0f, .weight_decay = 0.0f,
                   .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    return c;
}

int optim_kind_parse(const char *s) {
    if (!strcmp(s, "sgd")) return OPT_SGD;
    if (!strcmp(s, "adam")) return OPT_ADAM;
    return -1;
}

void optim_init(Optim *o, const OptConfig *c, size_t n) {
    PD_ASSERT(c->kind >= 0 && c->kind < OPT_KIND_COUNT);
    memset(o, 0, sizeof *o);
    o->c = *c;
    o->n = n;
    o->m = pd_alloc_f32(n ? n : 1);
    if (c->kind == OPT_ADAM) o->v = pd_alloc_f32(n ? n : 1);
}

void optim_release(Optim *o) {
    if (!o) return;
    pd_free(o->m);
    pd_free(o->v);
    memset(o, 0, sizeof *o);
}

void optim_step(Optim *o, float *restrict w, const float *restrict g) {
    const size_t n = o->n;
    const float lr = o->c.lr, wd = o->c.weight_decay;
    float *restrict m = o->m;
    o->step++;
    if (o->c.kind == OPT_SGD) {
        const float mu = o->c.momentum;
        if (mu == 0.0f) {
            for (size_t i = 0; i < n; i++) w[i] -= lr * (g[i] + wd * w[i]);
        } else if (o->step == 1) {   // buf = d_p on the first step (torch.clone)
            for (size_t i = 0; i < n; i++) {
                float d = g[i] + wd * w[i];
                m[i] = d;
                w[i] -= lr * d;
            }
        } else {
            for (size_t i = 0; i < n; i++) {
                float d = g[i] + wd * w[i];
                m[i] = mu * m[i] + d;
                w[i] -= lr * m[i];
            }
        }
        return;
    }
    /* Adam: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
     * w -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps), bc_k = 1 - b_k^t (PyTorch's order) */
    float *restrict v = o->v;
    const float b1 = o->c.beta1, b2 = o->c.beta2, eps = o->c.eps;
    const double bc1 = 1.0 - pow(b1, (double)o->step), bc2 = 1.0 - pow(b2, (double)o->step);
    const float step_size = (float)(lr / bc1), sbc2 = (float)sqrt(bc2);
    for (size_t i = 0; i < n; i++) {
        float d = g[i] + wd * w[i];
        m[i] = b1 * m[i] + (1.0f - b1) * d;
        v[i] = b2 * v[i] + (1.0f - b2) * d * d;
        w[i] -= step_size * m[i] / (sqrtf(v[i]) / sbc2 + eps);
    }
}
