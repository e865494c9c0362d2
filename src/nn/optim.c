/* optim.c: SGD with momentum and weight decay, and Adam, with PyTorch's exact update rules
 * (torch.optim.SGD with dampening 0 and nesterov off; torch.optim.Adam with amsgrad off),
 * as one loop over contiguous buffers, split over the kernel threads. It does not schedule
 * learning rates or clip. */
#include "nn.h"

#include "kernels.h"

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

typedef struct OptJob {
    const Optim *o;
    float *w;
    const float *g;
    float step_size, sbc2;
} OptJob;

/* Elements [b, e) of one update; every element depends on itself alone, so the split over
 * threads changes no bit. */
static void opt_range(void *p, size_t b, size_t e) {
    const OptJob *j = p;
    const Optim *o = j->o;
    const float lr = o->c.lr, wd = o->c.weight_decay;
    float *restrict w = j->w, *restrict m = o->m;
    const float *restrict g = j->g;
    if (o->c.kind == OPT_SGD) {
        const float mu = o->c.momentum;
        if (mu == 0.0f) {   /* m keeps the step's direction for optim_predict */
            for (size_t i = b; i < e; i++) {
                float d = g[i] + wd * w[i];
                m[i] = d;
                w[i] -= lr * d;
            }
        } else if (o->step == 1) {   // buf = d_p on the first step (torch.clone)
            for (size_t i = b; i < e; i++) {
                float d = g[i] + wd * w[i];
                m[i] = d;
                w[i] -= lr * d;
            }
        } else {
            for (size_t i = b; i < e; i++) {
                float d = g[i] + wd * w[i];
                m[i] = mu * m[i] + d;
                w[i] -= lr * m[i];
            }
        }
        return;
    }
    float *restrict v = o->v;
    const float b1 = o->c.beta1, b2 = o->c.beta2, eps = o->c.eps, step_size = j->step_size, sbc2 = j->sbc2;
    for (size_t i = b; i < e; i++) {
        float d = g[i] + wd * w[i];
        m[i] = b1 * m[i] + (1.0f - b1) * d;
        v[i] = b2 * v[i] + (1.0f - b2) * d * d;
        w[i] -= step_size * m[i] / (sqrtf(v[i]) / sbc2 + eps);
    }
}

/* Runs on the calling thread's kernel threads (kern_parallel_for). */
void optim_step(Optim *o, float *restrict w, const float *restrict g) {
    o->step++;
    OptJob j = {.o = o, .w = w, .g = g};
    if (o->c.kind == OPT_ADAM) {
        /* Adam: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
         * w -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps), bc_k = 1 - b_k^t (PyTorch's order) */
        const double bc1 = 1.0 - pow(o->c.beta1, (double)o->step), bc2 = 1.0 - pow(o->c.beta2, (double)o->step);
        j.step_size = (float)(o->c.lr / bc1);
        j.sbc2 = (float)sqrt(bc2);
    }
    kern_parallel_for(o->n, 32768, 16, opt_range, &j);
}

typedef struct PredictJob {
    const Optim *o;
    const float *w;
    float *out;
    float scale, step_size, sbc2;
} PredictJob;

static void predict_range(void *p, size_t b, size_t e) {
    const PredictJob *j = p;
    const Optim *o = j->o;
    const float *restrict w = j->w, *restrict m = o->m;
    float *restrict out = j->out;
    if (o->c.kind == OPT_SGD) {
        const float a = j->scale * o->c.lr;
        for (size_t i = b; i < e; i++) out[i] = w[i] - a * m[i];
        return;
    }
    const float *restrict v = o->v;
    const float a = j->scale * j->step_size, sbc2 = j->sbc2, eps = o->c.eps;
    for (size_t i = b; i < e; i++) out[i] = w[i] - a * m[i] / (sqrtf(v[i]) / sbc2 + eps);
}

void optim_predict(const Optim *o, const float *w, float *out, float scale) {
    if (o->step == 0 || scale == 0.0f) {   /* no direction yet: the weights as they are */
        if (out != w) memcpy(out, w, o->n * sizeof(float));
        return;
    }
    PredictJob j = {.o = o, .w = w, .out = out, .scale = scale};
    if (o->c.kind == OPT_ADAM) {   /* the last step's bias corrections, as optim_step computed them */
        const double bc1 = 1.0 - pow(o->c.beta1, (double)o->step), bc2 = 1.0 - pow(o->c.beta2, (double)o->step);
        j.step_size = (float)(o->c.lr / bc1);
        j.sbc2 = (float)sqrt(bc2);
    }
    kern_parallel_for(o->n, 32768, 16, predict_range, &j);
}
