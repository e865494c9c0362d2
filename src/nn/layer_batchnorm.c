/* layer_batchnorm.c: "batchnorm": batch normalisation per channel over (N, H, W) (input
 * (C, H, W)) or over N (input (C)), PyTorch's BatchNorm2d/1d. Keys: "features" (must equal
 * C), "eps" (default 1e-5), "momentum" (default 0.1), "relu" (default false: fused relu).
 * Parameters: weight = gamma (C), bias = beta (C). State: running_mean (C), running_var
 * (C), updated by training forwards (unbiased variance, as PyTorch). Saved per minibatch:
 * (mean, inv_std) per channel: the batch's in training, the running ones in eval. */
#include "nn_impl.h"

#include <math.h>
#include <string.h>

static int bn_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    int rc;
    double eps = 1e-5, mom = 0.1;
    if ((rc = jobj_int(j, "features", 1, 1, 1 << 20, &l->cin, err)) ||
        (rc = jobj_num(j, "eps", 0, 1e-12, 1.0, &eps, err)) || (rc = jobj_num(j, "momentum", 0, 0.0, 1.0, &mom, err)) ||
        (rc = jobj_bool(j, "relu", 0, &l->relu, err)))
        return rc;
    if (l->in.ndim != 3 && l->in.ndim != 1)
        return err_set(err, PD_EINVAL, "%s: incoming shape %s is neither (C, H, W) nor (C)", ctx, nn_shape_str(l->in));
    if (l->in.d[0] != l->cin)
        return err_set(err, PD_EINVAL, "%s: key \"features\": %d, but the incoming shape is %s", ctx, l->cin,
                       nn_shape_str(l->in));
    l->eps = (float)eps;
    l->momentum = (float)mom;
    l->out = l->in;
    nn_add_param(l, "weight", shape1(l->cin), PARAM_GAMMA, 1);
    nn_add_param(l, "bias", shape1(l->cin), PARAM_BETA, 1);
    l->n_state = 2 * (size_t)l->cin;
    return PD_OK;
}

static int bn_hw(const Layer *l) { return l->in.ndim == 3 ? l->in.d[1] * l->in.d[2] : 1; }

static size_t bn_saved(const Layer *l, int n_max) { return 2 * (size_t)l->cin * sizeof(float); }

static void bn_init_state(const Layer *l, float *state) {
    for (int c = 0; c < l->cin; c++) {
        state[c] = 0.0f;
        state[l->cin + c] = 1.0f;
    }
}

static void bn_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                       void *saved) {
    int c = l->cin, hw = bn_hw(l);
    float *sv = saved;
    const int blk = l->lay & KCONV_X_BLK;   // x and y alike (NN_BLK_SAME)
    if (r->train) {
        if (blk)
            kern_bn_fwd_train_blk(x, w, w + c, y, state, state + c, sv, r->n, c, hw, l->eps, l->momentum, l->relu,
                                  kern_blk_width());
        else
            kern_bn_fwd_train(x, w, w + c, y, state, state + c, sv, r->n, c, hw, l->eps, l->momentum, l->relu);
    } else {
        if (blk)
            kern_bn_fwd_eval_blk(x, w, w + c, y, state, state + c, r->n, c, hw, l->eps, l->relu, kern_blk_width());
        else
            kern_bn_fwd_eval(x, w, w + c, y, state, state + c, r->n, c, hw, l->eps, l->relu);
        for (int k = 0; k < c; k++) {
            sv[k] = state[k];
            sv[c + k] = 1.0f / sqrtf(state[c + k] + l->eps);
        }
    }
}

static void bn_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                        const void *saved, const float *dy, float *dx, float *dw) {
    int c = l->cin, hw = bn_hw(l);
    const float *sv = saved;
    const int blk = l->lay & KCONV_X_BLK;
    if (r->train) {   // the fused relu's mask (y > 0) is applied inside the kernel
        if (blk)
            kern_bn_bwd_blk_set(x, w, sv, y, dy, dx, dw, dw + c, r->n, c, hw, l->relu, l->set, kern_blk_width());
        else
            kern_bn_bwd_set(x, w, sv, y, dy, dx, dw, dw + c, r->n, c, hw, l->relu, l->set);
        return;
    }
    /* eval: y = gamma * (x - mean) * inv_std + beta with constant statistics (not on the
     * training path: serial); element p of channel k, sample i at o + p * ps */
    if (dx && (l->set & KSET_DX)) memset(dx, 0, (size_t)r->n * c * hw * sizeof(float));
    for (int k = 0; k < c; k++) {
        double sg = 0, sb = 0;
        float g = w[k], mean = sv[k], istd = sv[c + k];
        const int B = kern_blk_width();
        const size_t ps = blk ? (size_t)B : 1;
        for (int i = 0; i < r->n; i++) {
            size_t o = blk ? (((size_t)i * (c / B) + k / B) * hw) * B + k % B : ((size_t)i * c + k) * hw;
            for (int p = 0; p < hw; p++) {
                const size_t e = o + p * ps;
                float d = !l->relu || y[e] > 0.0f ? dy[e] : 0.0f;
                sg += (double)d * (x[e] - mean) * istd;
                sb += d;
                if (dx) dx[e] += d * g * istd;
            }
        }
        dw[k] += (float)sg;
        dw[c + k] += (float)sb;
    }
}

/* Per channel: blocked as well when the channels come in blocks (kern_bn_*_blk,
 * bitwise the plain results), so that a convolution's blocked output stays blocked through
 * it (resnet20: every convolution is followed by one). */
static int bn_layouts(const Layer *l) {
    return l->in.ndim == 3 && l->cin % kern_blk_width() == 0 ? NN_BLK_IN | NN_BLK_SAME : 0;
}

const LayerOps LAYER_BATCHNORM = {
    .name = "batchnorm",
    .parse = bn_parse,
    .saved_bytes = bn_saved,
    .init_state = bn_init_state,
    .forward = bn_forward,
    .backward = bn_backward,
    .sets = KSET_DX,
    .layouts = bn_layouts,
};
