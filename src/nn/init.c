/* init.c: parameter initialisation schemes, the model JSON's "init" (docs/reference/formats.md, Model).
 *
 * A scheme is given per parameter tensor role ("weight": weights, batch-norm gamma, lstm
 * weight_ih and weight_hh; "bias": biases, batch-norm beta, lstm bias_ih and bias_hh), either
 * per layer ({"type": "linear", ..., "init": {"weight": {...}, "bias": "zeros"}}) or per model
 * and layer type ("init": {"conv2d": {"weight": {...}}, "linear": {...}} next to "layers"); a
 * layer's own init wins, then the model's for its type, then PyTorch's default.
 *
 * Schemes (PyTorch's torch.nn.init names and formulas; fan_in = size(1) * receptive field,
 * fan_out = size(0) * receptive field, for tensors of 2 or more dimensions):
 *   "default"          PyTorch's default for the layer: uniform(+-1/sqrt(fan_in)) for weights
 *                      and biases (lstm: 1/sqrt(hidden)), gamma 1, beta 0
 *   "zeros", "ones", {"scheme": "constant", "value": v}
 *   {"scheme": "uniform", "low": a, "high": b}         (defaults 0, 1)
 *   {"scheme": "normal", "mean": m, "std": s}          (mean default 0; std required)
 *   {"scheme": "kaiming_uniform" | "kaiming_normal", "mode": "fan_in" | "fan_out",
 *    "nonlinearity": "relu" | "leaky_relu" | "linear" | "sigmoid" | "tanh" | "selu", "a": slope}
 *    or "gain": g in place of nonlinearity/a. Defaults as PyTorch: fan_in, leaky_relu, a = 0.
 *    std = gain / sqrt(fan); uniform bound = sqrt(3) * std.
 *   {"scheme": "xavier_uniform" | "xavier_normal", "gain": g}   (default 1)
 *    std = gain * sqrt(2 / (fan_in + fan_out)); uniform bound = sqrt(3) * std.
 *
 * Random numbers: every tensor of a layer draws from Philox(seed, RNG_STREAM_INIT, substream =
 * layer uid), the layer's tensors one after another in parameter order, so values are a pure
 * function of (seed, layer) whatever range (pipeline stage) is initialised. Uniform values use
 * one 32-bit draw each (24 bits: u in [0, 1)), value = low + (high - low) u; "default" and
 * kaiming/xavier uniform are (2u - 1) * bound, exactly the historical default. Normal values come
 * in Box-Muller pairs from two 53-bit uniforms (two 64-bit draws): u1 in (0, 1], u2 in [0, 1),
 * r = sqrt(-2 ln u1), element 2i = mean + std r cos(2 pi u2), element 2i+1 = mean + std r
 * sin(2 pi u2) (an odd count drops the last sine). Constants draw nothing. */
#include "nn_impl.h"

#include <math.h>
#include <string.h>

static const char *const KIND_NAMES[NN_INIT_KIND_COUNT] = {
    [NN_INIT_UNSET] = "unset",           [NN_INIT_DEFAULT] = "default",
    [NN_INIT_CONSTANT] = "constant",     [NN_INIT_UNIFORM] = "uniform",
    [NN_INIT_NORMAL] = "normal",         [NN_INIT_KAIMING_UNIFORM] = "kaiming_uniform",
    [NN_INIT_KAIMING_NORMAL] = "kaiming_normal", [NN_INIT_XAVIER_UNIFORM] = "xavier_uniform",
    [NN_INIT_XAVIER_NORMAL] = "xavier_normal",
};

const char *nn_init_name(const NnInit *s) {
    if (s->kind == NN_INIT_CONSTANT && s->a == 0) return "zeros";
    if (s->kind == NN_INIT_CONSTANT && s->a == 1) return "ones";
    return s->kind >= 0 && s->kind < NN_INIT_KIND_COUNT ? KIND_NAMES[s->kind] : "?";
}

int nn_init_needs_fans(const NnInit *s) {
    return s->kind == NN_INIT_KAIMING_UNIFORM || s->kind == NN_INIT_KAIMING_NORMAL || s->kind == NN_INIT_XAVIER_UNIFORM ||
           s->kind == NN_INIT_XAVIER_NORMAL;
}

/* torch.nn.init.calculate_gain */
static int gain_of(const char *nl, double a, double *g) {
    if (!strcmp(nl, "linear") || !strcmp(nl, "sigmoid")) *g = 1.0;
    else if (!strcmp(nl, "tanh")) *g = 5.0 / 3.0;
    else if (!strcmp(nl, "relu")) *g = sqrt(2.0);
    else if (!strcmp(nl, "leaky_relu")) *g = sqrt(2.0 / (1.0 + a * a));
    else if (!strcmp(nl, "selu")) *g = 0.75;
    else return -1;
    return 0;
}

int nn_init_parse(const cJSON *o, NnInit *out, const char *ctx, Err *err) {
    memset(out, 0, sizeof *out);
    const char *name = NULL;
    JObj j;
    int is_obj = cJSON_IsObject(o), rc;
    if (cJSON_IsString(o)) name = o->valuestring;
    else if (is_obj) {
        if ((rc = jobj_init(&j, o, err, "%s", ctx)) || (rc = jobj_str(&j, "scheme", 1, &name, err))) return rc;
    } else {
        return err_set(err, PD_EINVAL, "%s: expected a scheme name or an object {\"scheme\": ...}", ctx);
    }
    const char *known = "default, zeros, ones, constant, uniform, normal, kaiming_uniform, kaiming_normal, "
                        "xavier_uniform, xavier_normal";
    if (!strcmp(name, "default")) out->kind = NN_INIT_DEFAULT;
    else if (!strcmp(name, "zeros") || !strcmp(name, "ones")) out->kind = NN_INIT_CONSTANT, out->a = name[0] == 'o';
    else if (!strcmp(name, "constant")) out->kind = NN_INIT_CONSTANT;
    else if (!strcmp(name, "uniform")) out->kind = NN_INIT_UNIFORM, out->b = 1.0;
    else if (!strcmp(name, "normal")) out->kind = NN_INIT_NORMAL;
    else if (!strcmp(name, "kaiming_uniform")) out->kind = NN_INIT_KAIMING_UNIFORM;
    else if (!strcmp(name, "kaiming_normal")) out->kind = NN_INIT_KAIMING_NORMAL;
    else if (!strcmp(name, "xavier_uniform")) out->kind = NN_INIT_XAVIER_UNIFORM, out->b = 1.0;
    else if (!strcmp(name, "xavier_normal")) out->kind = NN_INIT_XAVIER_NORMAL, out->b = 1.0;
    else return err_set(err, PD_EINVAL, "%s: unknown init scheme \"%s\" (known: %s)", ctx, name, known);
    int needs_args = !strcmp(name, "constant") || out->kind == NN_INIT_NORMAL;
    if (!is_obj) {
        if (needs_args)
            return err_set(err, PD_EINVAL, "%s: init scheme \"%s\" needs its parameters: {\"scheme\": \"%s\", %s}", ctx,
                           name, name, out->kind == NN_INIT_NORMAL ? "\"std\": S" : "\"value\": V");
        if (out->kind == NN_INIT_KAIMING_UNIFORM || out->kind == NN_INIT_KAIMING_NORMAL) out->b = sqrt(2.0);
        return PD_OK;
    }
    snprintf(j.ctx, sizeof j.ctx, "%s (%s)", ctx, name);
    const double BIG = 1e30;
    switch (out->kind) {
    case NN_INIT_CONSTANT:
        if (!strcmp(name, "constant") && (rc = jobj_num(&j, "value", 1, -BIG, BIG, &out->a, err))) return rc;
        break;
    case NN_INIT_UNIFORM:
        if ((rc = jobj_num(&j, "low", 0, -BIG, BIG, &out->a, err)) || (rc = jobj_num(&j, "high", 0, -BIG, BIG, &out->b, err)))
            return rc;
        if (!(out->b > out->a)) return err_set(err, PD_EINVAL, "%s: \"low\" %g is not below \"high\" %g", j.ctx, out->a, out->b);
        break;
    case NN_INIT_NORMAL:
        if ((rc = jobj_num(&j, "mean", 0, -BIG, BIG, &out->a, err)) || (rc = jobj_num(&j, "std", 1, 0, BIG, &out->b, err)))
            return rc;
        break;
    case NN_INIT_KAIMING_UNIFORM:
    case NN_INIT_KAIMING_NORMAL: {
        const char *mode = "fan_in", *nl = NULL;
        double a = 0, gain = 0;
        if ((rc = jobj_str(&j, "mode", 0, &mode, err)) || (rc = jobj_str(&j, "nonlinearity", 0, &nl, err)) ||
            (rc = jobj_num(&j, "a", 0, -BIG, BIG, &a, err)) || (rc = jobj_num(&j, "gain", 0, 0, BIG, &gain, err)))
            return rc;
        if (!strcmp(mode, "fan_out")) out->fan_out = 1;
        else if (strcmp(mode, "fan_in"))
            return err_set(err, PD_EINVAL, "%s: key \"mode\": \"%s\" (expected fan_in or fan_out)", j.ctx, mode);
        if (jobj_has(&j, "gain")) {
            if (nl || jobj_has(&j, "a"))
                return err_set(err, PD_EINVAL, "%s: key \"gain\": give either gain or nonlinearity (and a), not both",
                               j.ctx);
            if (!(gain > 0)) return err_set(err, PD_EINVAL, "%s: key \"gain\": expected a number > 0", j.ctx);
            out->b = gain;
        } else {
            if (!nl) nl = "leaky_relu";
            if (jobj_has(&j, "a") && strcmp(nl, "leaky_relu"))
                return err_set(err, PD_EINVAL, "%s: key \"a\": the negative slope applies only to leaky_relu", j.ctx);
            if (gain_of(nl, a, &out->b))
                return err_set(err, PD_EINVAL,
                               "%s: key \"nonlinearity\": \"%s\" (known: relu, leaky_relu, linear, sigmoid, tanh, selu)",
                               j.ctx, nl);
        }
        break;
    }
    case NN_INIT_XAVIER_UNIFORM:
    case NN_INIT_XAVIER_NORMAL:
        if ((rc = jobj_num(&j, "gain", 0, 0, BIG, &out->b, err))) return rc;
        if (!(out->b > 0)) return err_set(err, PD_EINVAL, "%s: key \"gain\": expected a number > 0", j.ctx);
        break;
    default: break;
    }
    return jobj_done(&j, err);
}

int nn_init_parse_roles(const cJSON *o, NnInit out[NN_INIT_ROLES], const char *ctx, Err *err) {
    JObj j;
    int rc = jobj_init(&j, o, err, "%s", ctx);
    if (rc) return rc;
    static const char *const roles[NN_INIT_ROLES] = {"weight", "bias"};
    for (int r = 0; r < NN_INIT_ROLES; r++) {
        const cJSON *s = jobj_get(&j, roles[r]);
        if (!s) continue;
        char c2[320];
        snprintf(c2, sizeof c2, "%s: key \"%s\"", ctx, roles[r]);
        if ((rc = nn_init_parse(s, &out[r], c2, err))) return rc;
    }
    return jobj_done(&j, err);
}

int nn_init_role(ParamKind kind) { return kind == PARAM_BIAS || kind == PARAM_BETA; }

void nn_init_fans(Shape s, double *fan_in, double *fan_out) {
    double rec = 1;
    for (int d = 2; d < s.ndim; d++) rec *= s.d[d];
    *fan_in = s.ndim >= 2 ? s.d[1] * rec : 0;
    *fan_out = s.ndim >= 1 ? s.d[0] * rec : 0;
}

/* Box-Muller pairs from two 53-bit uniforms. */
static void fill_normal(Rng *r, float *d, size_t cnt, double mean, double std) {
    for (size_t i = 0; i < cnt; i += 2) {
        double u1 = 1.0 - rng_uniform_f64(r), u2 = rng_uniform_f64(r);
        double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
        d[i] = (float)(mean + std * rad * cos(th));
        if (i + 1 < cnt) d[i + 1] = (float)(mean + std * rad * sin(th));
    }
}

static void fill_sym_uniform(Rng *r, float *d, size_t cnt, double bound) {
    for (size_t i = 0; i < cnt; i++) d[i] = (float)((2.0 * rng_uniform(r) - 1.0) * bound);
}

void nn_init_fill(const NnInit *s, const ParamInfo *p, Rng *r, float *d) {
    size_t cnt = shape_numel(p->shape);
    double fi, fo, std;
    nn_init_fans(p->shape, &fi, &fo);
    switch (s->kind) {
    case NN_INIT_UNSET:
    case NN_INIT_DEFAULT:
        if (p->kind == PARAM_GAMMA || p->kind == PARAM_BETA) {
            float v = p->kind == PARAM_GAMMA ? 1.0f : 0.0f;
            for (size_t i = 0; i < cnt; i++) d[i] = v;
        } else {
            fill_sym_uniform(r, d, cnt, 1.0 / sqrt((double)p->fan_in));
        }
        return;
    case NN_INIT_CONSTANT:
        for (size_t i = 0; i < cnt; i++) d[i] = (float)s->a;
        return;
    case NN_INIT_UNIFORM:
        for (size_t i = 0; i < cnt; i++) d[i] = (float)(s->a + (s->b - s->a) * rng_uniform(r));
        return;
    case NN_INIT_NORMAL: fill_normal(r, d, cnt, s->a, s->b); return;
    case NN_INIT_KAIMING_UNIFORM:
    case NN_INIT_KAIMING_NORMAL:
        PD_ASSERT(p->shape.ndim >= 2);
        std = s->b / sqrt(s->fan_out ? fo : fi);
        if (s->kind == NN_INIT_KAIMING_NORMAL) fill_normal(r, d, cnt, 0, std);
        else fill_sym_uniform(r, d, cnt, sqrt(3.0) * std);
        return;
    case NN_INIT_XAVIER_UNIFORM:
    case NN_INIT_XAVIER_NORMAL:
        PD_ASSERT(p->shape.ndim >= 2);
        std = s->b * sqrt(2.0 / (fi + fo));
        if (s->kind == NN_INIT_XAVIER_NORMAL) fill_normal(r, d, cnt, 0, std);
        else fill_sym_uniform(r, d, cnt, sqrt(3.0) * std);
        return;
    default: PD_ASSERTF(0, "init kind %d", s->kind);
    }
}
