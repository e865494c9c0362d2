/* test_nn_init.c: the model JSON's "init" schemes (src/nn/init.c, docs/reference/formats.md).
 *
 * Statistics: each scheme fills a large tensor whose sample mean and variance are compared
 * with the scheme's formula, within 6 standard errors of the estimators for that sample size
 * (mean: sigma / sqrt(n); variance: sqrt((mu4 - sigma^4) / n), mu4 = 3 sigma^4 for a normal,
 * 9/5 sigma^4 for a uniform); normal draws also match the normal's mass within 1 and 2 sigma
 * (binomial standard errors), uniform draws stay inside their bounds and reach near them;
 * zeros, ones and constants are exact. With fixed seeds the checks are deterministic; 6
 * standard errors make a false failure on a correct sampler improbable (~1e-9 per check) while a
 * wrong fan, gain or formula (off by >= 1%) fails by hundreds of standard errors.
 * Also: partition independence (the init of a range equals the slice of the whole model's),
 * the model-wide scheme per layer type with per-layer overrides, the default is unchanged
 * (PyTorch's default, as the golden tests assume), models/vgg16.json carries torchvision's
 * VGG scheme, and "init" errors name the file, layer and key. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn.h"

static Model *parse_ok(const char *json) {
    Err err = {0};
    Model *m = model_parse(json, "t.json", &err);
    if (!m) fail_msg("model_parse: %s\n%s", err.msg, json);
    return m;
}

/* A model of one big layer (linear in x out, or conv in x out x k x k) whose "init" is spec. */
static Model *one_layer(const char *kind, int in, int out, int k, const char *spec) {
    static char json[2048];
    if (!strcmp(kind, "linear"))
        snprintf(json, sizeof json,
                 "{\"name\": \"t\", \"input\": [%d], \"layers\": [{\"type\": \"linear\", \"in\": %d, \"out\": %d, "
                 "\"init\": %s}]}", in, in, out, spec);
    else
        snprintf(json, sizeof json,
                 "{\"name\": \"t\", \"input\": [%d, %d, %d], \"layers\": [{\"type\": \"conv2d\", \"in\": %d, "
                 "\"out\": %d, \"kernel\": %d, \"init\": %s}]}", in, k, k, in, out, k, spec);
    return parse_ok(json);
}

static float *init_all(const Model *m, uint64_t seed) {
    int nl = model_n_layers(m);
    float *w = pd_alloc_f32(model_param_count(m, 0, nl) + 1);
    model_init_params(m, 0, nl, seed, w);
    return w;
}

typedef struct Stats {
    double mean, var, lo, hi, in1, in2;   /* in1/in2: fraction within 1 / 2 std of mu */
} Stats;

static Stats stats(const float *d, size_t n, double mu, double sd) {
    Stats s = {0, 0, INFINITY, -INFINITY, 0, 0};
    double sum = 0, sum2 = 0;
    size_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < n; i++) {
        sum += d[i];
        if (d[i] < s.lo) s.lo = d[i];
        if (d[i] > s.hi) s.hi = d[i];
        double z = sd > 0 ? fabs(d[i] - mu) / sd : 0;
        c1 += z < 1;
        c2 += z < 2;
    }
    s.mean = sum / n;
    for (size_t i = 0; i < n; i++) sum2 += (d[i] - s.mean) * (d[i] - s.mean);
    s.var = sum2 / (n - 1);
    s.in1 = (double)c1 / n;
    s.in2 = (double)c2 / n;
    return s;
}

enum { DIST_NORMAL, DIST_UNIFORM };

/* Checks n draws against a normal(mu, sd) or a uniform with that mean and std. */
static void check_dist(const char *what, const float *d, size_t n, int dist, double mu, double sd) {
    Stats s = stats(d, n, mu, sd);
    double se_mean = sd / sqrt((double)n);
    double kurt = dist == DIST_NORMAL ? 3.0 : 1.8;   /* mu4 / sigma^4 */
    double se_var = sd * sd * sqrt((kurt - 1.0) / n);
    if (fabs(s.mean - mu) > 6 * se_mean)
        fail_msg("%s: mean %.6g, want %.6g +- %.3g (6 standard errors, n %zu)", what, s.mean, mu, 6 * se_mean, n);
    if (fabs(s.var - sd * sd) > 6 * se_var)
        fail_msg("%s: variance %.6g (std %.6g), want %.6g (std %.6g) +- %.3g (6 standard errors, n %zu)", what, s.var,
                 sqrt(s.var), sd * sd, sd, 6 * se_var, n);
    if (dist == DIST_NORMAL) {
        const double p1 = 0.682689492137, p2 = 0.954499736104;
        double se1 = sqrt(p1 * (1 - p1) / n), se2 = sqrt(p2 * (1 - p2) / n);
        if (fabs(s.in1 - p1) > 6 * se1 || fabs(s.in2 - p2) > 6 * se2)
            fail_msg("%s: %.5f within 1 std, %.5f within 2 (normal: %.5f, %.5f)", what, s.in1, s.in2, p1, p2);
    } else {
        double b = sqrt(3.0) * sd;   /* half-width */
        /* inside [mu - b, mu + b] (float rounding aside); the extremes within 20 / n of the ends
         * (a miss has probability exp(-10) per end) */
        double tol = 1e-6 * (fabs(mu) + b);
        if (s.lo < mu - b - tol || s.hi > mu + b + tol)
            fail_msg("%s: range [%.7g, %.7g] outside [%.7g, %.7g]", what, s.lo, s.hi, mu - b, mu + b);
        if (s.lo > mu - b + 2 * b * 20.0 / n || s.hi < mu + b - 2 * b * 20.0 / n)
            fail_msg("%s: range [%.7g, %.7g] does not reach [%.7g, %.7g]", what, s.lo, s.hi, mu - b, mu + b);
    }
}

static void check_const(const char *what, const float *d, size_t n, float v) {
    for (size_t i = 0; i < n; i++)
        if (d[i] != v) fail_msg("%s: element %zu is %.9g, want exactly %.9g", what, i, d[i], v);
}

/* Every scheme on a linear layer (1000 x 1000: 10^6 weights, fan_in 1000, fan_out 1000 — the
 * fans are told apart on the conv below) and its bias. */
static void test_scheme_stats(void **st) {
    (void)st;
    const double s2 = sqrt(2.0);
    struct {
        const char *spec;
        int dist;           /* DIST_*, or -1: constant */
        double mu, sd;      /* of the weight */
    } cases[] = {
        {"{\"weight\": \"default\"}", DIST_UNIFORM, 0, 1 / sqrt(3000.0)},
        {"{\"weight\": \"zeros\"}", -1, 0, 0},
        {"{\"weight\": \"ones\"}", -1, 1, 0},
        {"{\"weight\": {\"scheme\": \"constant\", \"value\": -0.375}}", -1, -0.375, 0},
        {"{\"weight\": {\"scheme\": \"uniform\", \"low\": -0.5, \"high\": 1.5}}", DIST_UNIFORM, 0.5, 2 / sqrt(12.0)},
        {"{\"weight\": \"uniform\"}", DIST_UNIFORM, 0.5, 1 / sqrt(12.0)},
        {"{\"weight\": {\"scheme\": \"normal\", \"std\": 0.01}}", DIST_NORMAL, 0, 0.01},
        {"{\"weight\": {\"scheme\": \"normal\", \"mean\": 0.25, \"std\": 2}}", DIST_NORMAL, 0.25, 2},
        {"{\"weight\": \"kaiming_normal\"}", DIST_NORMAL, 0, s2 / sqrt(1000.0)},
        {"{\"weight\": {\"scheme\": \"kaiming_normal\", \"nonlinearity\": \"tanh\"}}", DIST_NORMAL, 0,
         5.0 / 3 / sqrt(1000.0)},
        {"{\"weight\": {\"scheme\": \"kaiming_uniform\", \"nonlinearity\": \"leaky_relu\", \"a\": 2.2360679774997898}}",
         DIST_UNIFORM, 0, 1 / sqrt(3000.0)},   /* PyTorch's default, as kaiming_uniform(a = sqrt 5) */
        {"{\"weight\": {\"scheme\": \"kaiming_uniform\", \"gain\": 3}}", DIST_UNIFORM, 0, 3 / sqrt(1000.0)},
        {"{\"weight\": {\"scheme\": \"xavier_uniform\"}}", DIST_UNIFORM, 0, sqrt(2.0 / 2000)},
        {"{\"weight\": {\"scheme\": \"xavier_normal\", \"gain\": 0.5}}", DIST_NORMAL, 0, 0.5 * sqrt(2.0 / 2000)},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        Model *m = one_layer("linear", 1000, 1000, 0, cases[c].spec);
        float *w = init_all(m, 7);
        size_t n = 1000 * 1000;
        if (cases[c].dist < 0) check_const(cases[c].spec, w, n, (float)cases[c].mu);
        else check_dist(cases[c].spec, w, n, cases[c].dist, cases[c].mu, cases[c].sd);
        /* the bias keeps PyTorch's default: uniform(+-1/sqrt(fan_in)) */
        for (int i = 0; i < 1000; i++) assert_true(fabs(w[n + i]) <= 1 / sqrt(1000.0));
        pd_free(w);
        model_free(m);
    }
    /* biases: each role on its own; a normal bias, a constant bias */
    Model *m = one_layer("linear", 4, 200000, 0, "{\"bias\": {\"scheme\": \"normal\", \"mean\": -1, \"std\": 0.5}}");
    float *w = init_all(m, 3);
    check_dist("normal bias", w + 800000, 200000, DIST_NORMAL, -1, 0.5);
    check_dist("default weight beside it", w, 800000, DIST_UNIFORM, 0, 0.5 / sqrt(3.0));
    pd_free(w);
    model_free(m);
    m = one_layer("linear", 4, 1000, 0, "{\"weight\": \"zeros\", \"bias\": {\"scheme\": \"constant\", \"value\": 0.1}}");
    w = init_all(m, 3);
    check_const("zero weight", w, 4000, 0.0f);
    check_const("constant bias", w + 4000, 1000, 0.1f);
    pd_free(w);
    model_free(m);
}

/* The fans of a conv weight (K, C, R, S): fan_in = C R S, fan_out = K R S (PyTorch's). */
static void test_conv_fans(void **st) {
    (void)st;
    /* 96 x 32 x 5 x 5 = 76800 weights: fan_in 800, fan_out 2400 */
    Model *m = one_layer("conv2d", 32, 96, 5, "{\"weight\": {\"scheme\": \"kaiming_normal\", \"mode\": \"fan_out\", "
                                              "\"nonlinearity\": \"relu\"}, \"bias\": \"zeros\"}");
    float *w = init_all(m, 11);
    check_dist("kaiming_normal fan_out", w, 76800, DIST_NORMAL, 0, sqrt(2.0 / 2400));
    check_const("conv bias", w + 76800, 96, 0.0f);
    pd_free(w);
    model_free(m);
    m = one_layer("conv2d", 32, 96, 5, "{\"weight\": {\"scheme\": \"kaiming_uniform\", \"mode\": \"fan_in\", "
                                       "\"nonlinearity\": \"relu\"}}");
    w = init_all(m, 11);
    check_dist("kaiming_uniform fan_in", w, 76800, DIST_UNIFORM, 0, sqrt(2.0 / 800));
    pd_free(w);
    model_free(m);
    m = one_layer("conv2d", 32, 96, 5, "{\"weight\": \"xavier_uniform\"}");
    w = init_all(m, 11);
    check_dist("xavier_uniform conv", w, 76800, DIST_UNIFORM, 0, sqrt(2.0 / 3200));
    pd_free(w);
    model_free(m);
}

/* Without "init" the values are exactly the historical default: uniform(+-1/sqrt(fan_in))
 * from Philox(seed, RNG_STREAM_INIT, layer), the layer's tensors one after another; "default"
 * spelled out gives the same. */
static void test_default_unchanged(void **st) {
    (void)st;
    const char *plain = "{\"name\": \"t\", \"input\": [1, 8, 8], \"layers\": ["
                        "{\"type\": \"conv2d\", \"in\": 1, \"out\": 4, \"kernel\": 3, \"relu\": true},"
                        "{\"type\": \"batchnorm\", \"features\": 4}, {\"type\": \"flatten\"},"
                        "{\"type\": \"linear\", \"in\": 144, \"out\": 10}]}";
    const char *spelled = "{\"name\": \"t\", \"input\": [1, 8, 8], \"init\": {\"linear\": {\"weight\": \"default\"}}, "
                          "\"layers\": ["
                          "{\"type\": \"conv2d\", \"in\": 1, \"out\": 4, \"kernel\": 3, \"relu\": true, "
                          "\"init\": {\"weight\": \"default\", \"bias\": \"default\"}},"
                          "{\"type\": \"batchnorm\", \"features\": 4, \"init\": {\"weight\": \"default\"}},"
                          "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"in\": 144, \"out\": 10}]}";
    Model *m = parse_ok(plain), *m2 = parse_ok(spelled);
    int nl = model_n_layers(m), npt;
    size_t np = model_param_count(m, 0, nl);
    float *w = init_all(m, 42), *w2 = init_all(m2, 42), *want = pd_alloc_f32(np);
    const ParamInfo *pt = model_param_tensors(m, &npt);
    Rng r;
    int cur = -1;
    for (int k = 0; k < npt; k++) {
        if (pt[k].layer != cur) rng_init(&r, 42, RNG_STREAM_INIT, (uint64_t)(cur = pt[k].layer));
        float *d = want + pt[k].offset;
        for (size_t i = 0; i < shape_numel(pt[k].shape); i++)
            d[i] = pt[k].kind == PARAM_GAMMA   ? 1.0f
                   : pt[k].kind == PARAM_BETA ? 0.0f
                                              : (float)((2.0 * rng_uniform(&r) - 1.0) / sqrt((double)pt[k].fan_in));
    }
    assert_int_equal(tu_compare("default init", w, want, np, 0, 0), 0);
    assert_int_equal(tu_compare("\"default\" spelled out", w2, want, np, 0, 0), 0);
    pd_free(w);
    pd_free(w2);
    pd_free(want);
    model_free(m);
    model_free(m2);
}

/* A model with every kind of scheme, model-wide and per layer, residual sub-layers included. */
static const char *MIXED =
    "{\"name\": \"mixed\", \"input\": [2, 12, 12],"
    " \"init\": {\"conv2d\": {\"weight\": {\"scheme\": \"kaiming_normal\", \"mode\": \"fan_out\", \"nonlinearity\": \"relu\"},"
    "                      \"bias\": \"zeros\"},"
    "          \"linear\": {\"weight\": {\"scheme\": \"normal\", \"std\": 0.01}, \"bias\": \"zeros\"},"
    "          \"batchnorm\": {\"weight\": {\"scheme\": \"uniform\", \"low\": 0.5, \"high\": 1.5}}},"
    " \"layers\": ["
    "  {\"type\": \"conv2d\", \"in\": 2, \"out\": 8, \"kernel\": 3, \"pad\": 1, \"relu\": true},"
    "  {\"type\": \"conv2d\", \"in\": 8, \"out\": 8, \"kernel\": 3, \"pad\": 1,"
    "   \"init\": {\"weight\": \"xavier_uniform\", \"bias\": {\"scheme\": \"constant\", \"value\": 0.5}}},"
    "  {\"type\": \"batchnorm\", \"features\": 8},"
    "  {\"type\": \"residual\", \"body\": ["
    "     {\"type\": \"conv2d\", \"in\": 8, \"out\": 8, \"kernel\": 3, \"pad\": 1, \"bias\": false},"
    "     {\"type\": \"batchnorm\", \"features\": 8, \"init\": {\"weight\": \"zeros\"}}]},"
    "  {\"type\": \"maxpool\", \"kernel\": 2, \"stride\": 2},"
    "  {\"type\": \"flatten\"},"
    "  {\"type\": \"linear\", \"in\": 288, \"out\": 64, \"relu\": true, \"init\": {\"weight\": \"kaiming_uniform\"}},"
    "  {\"type\": \"linear\", \"in\": 64, \"out\": 10, \"init\": {\"weight\": \"default\", \"bias\": \"default\"}}]}";

/* Each tensor of MIXED got the scheme the layer, else the model for its type, else the
 * default gives (checked by value ranges and exact constants). */
static void test_model_and_layer_schemes(void **st) {
    (void)st;
    Model *m = parse_ok(MIXED);
    float *w = init_all(m, 5);
    int npt;
    const ParamInfo *pt = model_param_tensors(m, &npt);
    assert_int_equal(npt, 13);
    for (int k = 0; k < npt; k++) {
        const float *d = w + pt[k].offset;
        size_t n = shape_numel(pt[k].shape);
        const char *nm = pt[k].name;
        if (!strcmp(nm, "layers.0.bias") || !strcmp(nm, "layers.6.bias") || !strcmp(nm, "layers.2.bias") ||
            !strcmp(nm, "layers.3.body.1.weight") || !strcmp(nm, "layers.3.body.1.bias"))
            check_const(nm, d, n, 0.0f);
        else if (!strcmp(nm, "layers.1.bias")) check_const(nm, d, n, 0.5f);
        else if (!strcmp(nm, "layers.2.weight")) {
            for (size_t i = 0; i < n; i++) assert_true(d[i] >= 0.5f && d[i] < 1.5f);
        } else if (!strcmp(nm, "layers.0.weight") || !strcmp(nm, "layers.3.body.0.weight")) {
            /* kaiming normal, fan_out 8 * 9: not bounded, std sqrt(2/72) = 0.167 */
            double sd = sqrt(2.0 / 72), mx = 0;
            for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(d[i]));
            assert_true(mx > 1.5 * sd && mx < 7 * sd);
        } else if (!strcmp(nm, "layers.1.weight")) {
            double b = sqrt(6.0 / (72 + 72)), mx = 0;
            for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(d[i]));
            assert_true(mx <= b && mx > 0.9 * b);
        } else if (!strcmp(nm, "layers.6.weight")) {
            double b = sqrt(6.0 / 288), mx = 0;   /* kaiming_uniform defaults: leaky_relu a 0 -> gain sqrt 2 */
            for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(d[i]));
            assert_true(mx <= b && mx > 0.99 * b);
        } else if (!strcmp(nm, "layers.7.weight") || !strcmp(nm, "layers.7.bias")) {
            double b = 1 / sqrt(64.0), mx = 0;
            for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(d[i]));
            assert_true(mx <= b && mx > 0.8 * b);
        } else {
            fail_msg("unexpected tensor %s", nm);
        }
    }
    pd_free(w);
    model_free(m);
}

/* The init of any range [a, b) equals the slice of the whole model's (what a pipeline stage
 * computes); another seed changes every random tensor. */
static void test_partition_independence(void **st) {
    (void)st;
    const char *files[] = {NULL, "models/vgg16.json", "models/resnet20.json", "models/lstm.json"};
    for (int f = 0; f < 4; f++) {
        Model *m;
        if (!files[f]) m = parse_ok(MIXED);
        else {
            Err err = {0};
            m = model_load(tu_src(files[f]), &err);
            if (!m) fail_msg("%s", err.msg);
        }
        int nl = model_n_layers(m);
        size_t np = model_param_count(m, 0, nl);
        float *w = init_all(m, 9), *w3 = init_all(m, 10), *wr = pd_alloc_f32(np + 1);
        size_t same = 0;
        for (size_t i = 0; i < np; i++) same += w[i] == w3[i] && w[i] != 0 && w[i] != 1;
        if (same > np / 1000) fail_msg("%s: %zu of %zu values the same under another seed", files[f] ? files[f] : "mixed", same, np);
        /* the small model: every range; the real ones: every single layer and two 3-stage cuts */
        for (int a = 0; a < nl; a++)
            for (int b = a + 1; b <= nl; b++) {
                int c1 = nl / 3, c2 = 2 * nl / 3;
                if (f && b != a + 1 && !(a == 0 && b == c1) && !(a == c1 && b == c2) && !(a == c2 && b == nl)) continue;
                size_t off = model_param_offset(m, a), cnt = model_param_count(m, a, b);
                if (!cnt) continue;
                model_init_params(m, a, b, 9, wr);
                if (memcmp(wr, w + off, cnt * sizeof(float)))
                    fail_msg("%s: init of [%d, %d) differs from the slice", files[f] ? files[f] : "mixed", a, b);
            }
        pd_free(w);
        pd_free(w3);
        pd_free(wr);
        model_free(m);
    }
}

/* models/vgg16.json carries torchvision's VGG init: conv weights kaiming normal (fan_out, relu
 * gain), linear weights N(0, 0.01), every bias 0. */
static void test_vgg16_torchvision_scheme(void **st) {
    (void)st;
    Err err = {0};
    Model *m = model_load(tu_src("models/vgg16.json"), &err);
    if (!m) fail_msg("%s", err.msg);
    float *w = init_all(m, 1);
    int npt, conv = 0, lin = 0;
    const ParamInfo *pt = model_param_tensors(m, &npt);
    for (int k = 0; k < npt; k++) {
        const float *d = w + pt[k].offset;
        size_t n = shape_numel(pt[k].shape);
        const char *type = model_layer_type(m, pt[k].layer);
        if (pt[k].kind == PARAM_BIAS) {
            check_const(pt[k].name, d, n, 0.0f);
        } else if (!strcmp(type, "conv2d")) {
            Shape s = pt[k].shape;   /* (K, C, 3, 3): fan_out = 9 K */
            if (n >= 10000) check_dist(pt[k].name, d, n, DIST_NORMAL, 0, sqrt(2.0 / (s.d[0] * s.d[2] * s.d[3])));
            conv++;
        } else {
            assert_string_equal(type, "linear");
            check_dist(pt[k].name, d, n, DIST_NORMAL, 0, 0.01);
            lin++;
        }
    }
    assert_int_equal(conv, 13);
    assert_int_equal(lin, 3);
    pd_free(w);
    model_free(m);
}

/* Errors name the file, the layer and the key. */
static void test_errors(void **st) {
    (void)st;
    const char *head = "{\"name\": \"t\", \"input\": [4], ";
    struct {
        const char *rest, *want;
    } cases[] = {
        {"\"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2, \"init\": {\"weight\": \"he\"}}]}",
         "t.json: layer 0 (linear): key \"init\": key \"weight\": unknown init scheme \"he\""},
        {"\"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2, \"init\": {\"weights\": \"zeros\"}}]}",
         "unknown key \"weights\""},
        {"\"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2, \"init\": {\"weight\": \"normal\"}}]}",
         "needs its parameters"},
        {"\"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2, \"init\": {\"weight\": {\"scheme\": \"normal\"}}}]}",
         "missing required key \"std\""},
        {"\"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2, \"init\": {\"weight\": {\"scheme\": \"normal\", "
         "\"std\": -1}}}]}", "\"std\""},
        {"\"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2, \"init\": {\"weight\": {\"scheme\": \"zeros\", "
         "\"std\": 1}}}]}", "unknown key \"std\""},
        {"\"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2, \"init\": {\"weight\": {\"scheme\": "
         "\"kaiming_normal\", \"mode\": \"fan_avg\"}}}]}", "key \"mode\": \"fan_avg\""},
        {"\"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2, \"init\": {\"weight\": {\"scheme\": "
         "\"kaiming_normal\", \"nonlinearity\": \"gelu\"}}}]}", "key \"nonlinearity\": \"gelu\""},
        {"\"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2, \"init\": {\"weight\": {\"scheme\": "
         "\"kaiming_normal\", \"nonlinearity\": \"relu\", \"gain\": 2}}}]}", "not both"},
        {"\"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2, \"init\": {\"weight\": {\"scheme\": "
         "\"uniform\", \"low\": 1, \"high\": 1}}}]}", "is not below"},
        {"\"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2, \"init\": {\"bias\": \"kaiming_uniform\"}}]}",
         "t.json: layers.0.bias: init \"kaiming_uniform\" needs a tensor of 2 or more dimensions"},
        {"\"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2, \"bias\": false, \"init\": {\"bias\": \"zeros\"}}]}",
         "t.json: layer 0 (linear): key \"init\": key \"bias\": this layer has no bias"},
        {"\"layers\": [{\"type\": \"relu\", \"init\": {\"weight\": \"zeros\"}}]}",
         "t.json: layer 0 (relu): key \"init\": this layer has no parameters"},
        {"\"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2, \"init\": \"zeros\"}]}", "expected a JSON object"},
        {"\"init\": {\"conv\": {\"weight\": \"zeros\"}}, \"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2}]}",
         "t.json: key \"init\": \"conv\" is not a layer type"},
        {"\"init\": {\"linear\": {\"bias\": \"xavier_normal\"}}, \"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2}]}",
         "layers.0.bias: init \"xavier_normal\" needs a tensor of 2 or more dimensions"},
        {"\"init\": {\"linear\": {\"weight\": 3}}, \"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2}]}",
         "t.json: key \"init\": \"linear\": key \"weight\": expected a scheme name"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char json[1024];
        snprintf(json, sizeof json, "%s%s", head, cases[c].rest);
        Err err = {0};
        Model *m = model_parse(json, "t.json", &err);
        if (m) fail_msg("accepted: %s", json);
        if (!strstr(err.msg, cases[c].want)) fail_msg("message \"%s\" lacks \"%s\"", err.msg, cases[c].want);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scheme_stats),         cmocka_unit_test(test_conv_fans),
        cmocka_unit_test(test_default_unchanged),    cmocka_unit_test(test_model_and_layer_schemes),
        cmocka_unit_test(test_partition_independence), cmocka_unit_test(test_vgg16_torchvision_scheme),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
