/* optim.c: SGD with momentum and weight decay, Adam and AdamW, with PyTorch's exact update
 * rules (torch.optim.SGD with dampening 0 and nesterov off; torch.optim.Adam and AdamW with
 * amsgrad off), as one loop over contiguous buffers, split over the kernel threads; the
 * learning-rate schedule (warm-up, cosine or linear decay) and the pieces of gradient-norm
 * clipping. What "global" spans for clipping is the caller's (the runtime's) business. */
/* gcc -O2's "very cheap" vectoriser cost model left the update loops scalar (a fifth of mlp's
 * step); the dynamic model vectorises them with identical results (element-wise, no
 * reassociation; -std=c11 keeps fp-contract off), as in the kernels. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif
#include "nn.h"

#include "kernels.h"

#include <math.h>
#include <string.h>

OptConfig optim_defaults(OptKind kind, float lr) {
    OptConfig c = {.kind = kind, .lr = lr, .momentum = 0.0f, .weight_decay = 0.0f,
                   .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .lr_sched = LR_CONSTANT};
    return c;
}

static const char *const kind_names[OPT_KIND_COUNT] = {"sgd", "adam", "adamw"};
static const char *const sched_names[LR_SCHED_COUNT] = {"constant", "cosine", "linear"};

int optim_kind_parse(const char *s) {
    for (int k = 0; k < OPT_KIND_COUNT; k++)
        if (!strcmp(s, kind_names[k])) return k;
    return -1;
}

const char *optim_kind_name(OptKind k) { return k >= 0 && k < OPT_KIND_COUNT ? kind_names[k] : "?"; }

int optim_lr_sched_parse(const char *s) {
    for (int k = 0; k < LR_SCHED_COUNT; k++)
        if (!strcmp(s, sched_names[k])) return k;
    return -1;
}

const char *optim_lr_sched_name(LrSchedKind k) { return k >= 0 && k < LR_SCHED_COUNT ? sched_names[k] : "?"; }

double optim_lr(const OptConfig *c, long t) {
    const double lr = c->lr;
    if (t < c->warmup) return lr * (double)(t + 1) / (double)c->warmup;
    if (c->lr_sched == LR_CONSTANT) return lr;
    long span = c->decay_steps - c->warmup;
    double p = span > 0 ? (double)(t - c->warmup) / (double)span : 1.0;
    if (p > 1.0) p = 1.0;
    const double lo = c->min_lr;
    if (c->lr_sched == LR_COSINE) return lo + (lr - lo) * 0.5 * (1.0 + cos(3.14159265358979323846 * p));
    return lo + (lr - lo) * (1.0 - p);
}

void optim_init(Optim *o, const OptConfig *c, size_t n) {
    PD_ASSERT(c->kind >= 0 && c->kind < OPT_KIND_COUNT);
    memset(o, 0, sizeof *o);
    o->c = *c;
    o->n = n;
    o->lr_scale = 1.0;
    o->m = pd_alloc_f32(n ? n : 1);
    if (optim_is_adam(c->kind)) o->v = pd_alloc_f32(n ? n : 1);
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
    float lr, step_size, sbc2, decay;   /* decay: adamw's 1 - lr wd */
} OptJob;

/* Elements [b, e) of one update; every element depends on itself alone, so the split over
 * threads changes no bit. */
static void opt_range(void *p, size_t b, size_t e) {
    const OptJob *j = p;
    const Optim *o = j->o;
    const float lr = j->lr, wd = o->c.kind == OPT_ADAMW ? 0.0f : o->c.weight_decay;
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
    if (o->c.kind == OPT_ADAMW && o->c.weight_decay != 0.0f) {   // torch: param.mul_(1 - lr * wd) first
        const float decay = j->decay;
        for (size_t i = b; i < e; i++) w[i] *= decay;
    }
    for (size_t i = b; i < e; i++) {
        float d = g[i] + wd * w[i];
        m[i] = b1 * m[i] + (1.0f - b1) * d;
        v[i] = b2 * v[i] + (1.0f - b2) * d * d;
        w[i] -= step_size * m[i] / (sqrtf(v[i]) / sbc2 + eps);
    }
}

/* Runs on the calling thread's kernel threads (kern_parallel_for). */
void optim_step(Optim *o, float *restrict w, const float *restrict g) {
    /* the scheduled lr as PyTorch holds it in param_groups (a double), rounded to float once */
    const double lr = optim_lr(&o->c, o->step) * o->lr_scale;
    o->step++;
    OptJob j = {.o = o, .w = w, .g = g, .lr = (float)lr};
    if (optim_is_adam(o->c.kind)) {
        /* Adam: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
         * w -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps), bc_k = 1 - b_k^t (PyTorch's order) */
        const double bc1 = 1.0 - pow(o->c.beta1, (double)o->step), bc2 = 1.0 - pow(o->c.beta2, (double)o->step);
        j.step_size = (float)(lr / bc1);
        j.sbc2 = (float)sqrt(bc2);
        j.decay = (float)(1.0 - lr * (double)o->c.weight_decay);
    }
    kern_parallel_for(o->n, 32768, 16, opt_range, &j);
}

typedef struct PredictJob {
    const Optim *o;
    const float *w;
    float *out;
    float scale, lr, step_size, sbc2, decay;   /* decay: adamw's lr wd */
} PredictJob;

static void predict_range(void *p, size_t b, size_t e) {
    const PredictJob *j = p;
    const Optim *o = j->o;
    const float *restrict w = j->w, *restrict m = o->m;
    float *restrict out = j->out;
    if (o->c.kind == OPT_SGD) {
        const float a = j->scale * j->lr;
        for (size_t i = b; i < e; i++) out[i] = w[i] - a * m[i];
        return;
    }
    const float *restrict v = o->v;
    const float a = j->scale * j->step_size, sbc2 = j->sbc2, eps = o->c.eps, c = j->scale * j->decay;
    if (c != 0.0f)
        for (size_t i = b; i < e; i++) out[i] = w[i] - (c * w[i] + a * m[i] / (sqrtf(v[i]) / sbc2 + eps));
    else
        for (size_t i = b; i < e; i++) out[i] = w[i] - a * m[i] / (sqrtf(v[i]) / sbc2 + eps);
}

void optim_predict(const Optim *o, const float *w, float *out, float scale) {
    if (o->step == 0 || scale == 0.0f) {   /* no direction yet: the weights as they are */
        if (out != w) memcpy(out, w, o->n * sizeof(float));
        return;
    }
    const double lr = optim_lr(&o->c, o->step - 1) * o->lr_scale;   /* the last step's */
    PredictJob j = {.o = o, .w = w, .out = out, .scale = scale, .lr = (float)lr};
    if (optim_is_adam(o->c.kind)) {   /* the last step's lr and bias corrections, as optim_step computed them */
        const double bc1 = 1.0 - pow(o->c.beta1, (double)o->step), bc2 = 1.0 - pow(o->c.beta2, (double)o->step);
        j.step_size = (float)(lr / bc1);
        j.sbc2 = (float)sqrt(bc2);
        if (o->c.kind == OPT_ADAMW) j.decay = (float)(lr * (double)o->c.weight_decay);
    }
    kern_parallel_for(o->n, 32768, 16, predict_range, &j);
}

/* Eight running sums in double, element i into lane i % 8, then the lanes in order: a fixed
 * order the compiler can vectorise, independent of threads. */
double optim_sumsq(const float *g, size_t n) {
    double acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += (double)g[i + k] * (double)g[i + k];
    for (int k = 0; i < n; i++, k++) acc[k] += (double)g[i] * (double)g[i];
    double s = 0.0;
    for (int k = 0; k < 8; k++) s += acc[k];
    return s;
}

float optim_clip_coef(double sumsq, float max_norm) {
    float norm = (float)sqrt(sumsq);
    float coef = max_norm / (norm + 1e-6f);
    return coef < 1.0f ? coef : 1.0f;
}

typedef struct ScaleJob {
    float *g;
    float coef;
} ScaleJob;

static void scale_range(void *p, size_t b, size_t e) {
    const ScaleJob *j = p;
    for (size_t i = b; i < e; i++) j->g[i] *= j->coef;
}

void optim_scale(float *g, size_t n, float coef) {
    if (coef == 1.0f) return;   /* multiplying by 1 changes no bit */
    ScaleJob j = {g, coef};
    kern_parallel_for(n, 32768, 16, scale_range, &j);
}
