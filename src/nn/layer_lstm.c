/* layer_lstm.c: "lstm": one LSTM layer over a sequence, PyTorch's nn.LSTM(batch_first=True)
 * with h0 = c0 = 0. Keys: "in" (features, must equal the incoming (T, I)), "hidden". Output
 * (T, hidden): every step's hidden state. Parameters as PyTorch: weight_ih_l0 (4H, I),
 * weight_hh_l0 (4H, H), bias_ih_l0 (4H), bias_hh_l0 (4H); init bound 1/sqrt(H).
 * The kernel is time-major (T, N, .): this layer transposes in and out (batch-major
 * activations everywhere else); the time-major x and y are kept in the saved state. */
#include "nn_impl.h"

#include <string.h>

static int lstm_parse(Layer *l, JObj *j, const char *ctx, Err *err) {
    int rc;
    if ((rc = jobj_int(j, "in", 1, 1, 1 << 20, &l->cin, err)) || (rc = jobj_int(j, "hidden", 1, 1, 1 << 20, &l->cout, err)))
        return rc;
    if (l->in.ndim != 2)
        return err_set(err, PD_EINVAL, "%s: incoming shape %s is not a sequence (T, features)", ctx,
                       nn_shape_str(l->in));
    if (l->in.d[1] != l->cin)
        return err_set(err, PD_EINVAL, "%s: key \"in\": %d, but the incoming shape is %s", ctx, l->cin,
                       nn_shape_str(l->in));
    int t = l->in.d[0], h = l->cout, in = l->cin;
    l->out = shape2(t, h);
    nn_add_param(l, "weight_ih_l0", shape2(4 * h, in), PARAM_WEIGHT, h);
    nn_add_param(l, "weight_hh_l0", shape2(4 * h, h), PARAM_WEIGHT, h);
    nn_add_param(l, "bias_ih_l0", shape1(4 * h), PARAM_BIAS, h);
    nn_add_param(l, "bias_hh_l0", shape1(4 * h), PARAM_BIAS, h);
    l->flops = 2.0 * t * 4.0 * h * (in + h);
    return PD_OK;
}

/* Saved layout for n samples: x_tm (T, n, I), y_tm (T, n, H), gates (kernel's). */
static size_t sz_x(const Layer *l, int n) { return nn_align((size_t)l->in.d[0] * n * l->cin * sizeof(float)); }
static size_t sz_y(const Layer *l, int n) { return nn_align((size_t)l->in.d[0] * n * l->cout * sizeof(float)); }

static size_t lstm_saved(const Layer *l, int n_max) {
    return sz_x(l, n_max) + sz_y(l, n_max) + kern_lstm_saved_floats(l->in.d[0], n_max, l->cout) * sizeof(float);
}

static int lstm_build(Layer *l, int n_max, Err *err) {
    int rc = kern_lstm_init(&l->lstm, l->in.d[0], n_max, l->cin, l->cout, err);
    if (rc) return rc;
    /* backward scratch: dy_tm (T, n, H) then dx_tm (T, n, I) */
    l->scratch = pd_alloc_f32((size_t)l->in.d[0] * n_max * (l->cout + l->cin));
    return PD_OK;
}

static void lstm_release(Layer *l) {
    kern_lstm_release(&l->lstm);
    pd_free(l->scratch);
    l->scratch = NULL;
}

/* (N, T, F) -> (T, N, F) */
static void to_time_major(const float *a, float *b, int n, int t, int f) {
    for (int i = 0; i < n; i++)
        for (int s = 0; s < t; s++) memcpy(b + ((size_t)s * n + i) * f, a + ((size_t)i * t + s) * f, (size_t)f * sizeof(float));
}

static void lstm_forward(Layer *l, const NnRun *r, const float *w, float *state, const float *x, float *y,
                         void *saved) {
    int n = r->n, t = l->in.d[0], in = l->cin, h = l->cout;
    char *s = saved;
    float *x_tm = (float *)s, *y_tm = (float *)(s + sz_x(l, n)), *gates = (float *)(s + sz_x(l, n) + sz_y(l, n));
    const float *w_ih = w, *w_hh = w_ih + (size_t)4 * h * in, *b_ih = w_hh + (size_t)4 * h * h, *b_hh = b_ih + 4 * h;
    to_time_major(x, x_tm, n, t, in);
    kern_lstm_fwd(&l->lstm, n, x_tm, w_ih, w_hh, b_ih, b_hh, y_tm, gates);
    for (int s2 = 0; s2 < t; s2++)   // (T, N, H) -> (N, T, H)
        for (int i = 0; i < n; i++)
            memcpy(y + ((size_t)i * t + s2) * h, y_tm + ((size_t)s2 * n + i) * h, (size_t)h * sizeof(float));
}

static void lstm_backward(Layer *l, const NnRun *r, const float *w, const float *x, const float *y,
                          const void *saved, const float *dy, float *dx, float *dw) {
    int n = r->n, t = l->in.d[0], in = l->cin, h = l->cout;
    const char *s = saved;
    const float *x_tm = (const float *)s, *y_tm = (const float *)(s + sz_x(l, n)),
                *gates = (const float *)(s + sz_x(l, n) + sz_y(l, n));
    const float *w_ih = w, *w_hh = w_ih + (size_t)4 * h * in;
    float *dw_ih = dw, *dw_hh = dw_ih + (size_t)4 * h * in, *db_ih = dw_hh + (size_t)4 * h * h, *db_hh = db_ih + 4 * h;
    float *dy_tm = l->scratch, *dx_tm = l->scratch + (size_t)t * n * h;
    to_time_major(dy, dy_tm, n, t, h);
    if (dx) memset(dx_tm, 0, (size_t)t * n * in * sizeof(float));
    kern_lstm_bwd(&l->lstm, n, x_tm, w_ih, w_hh, y_tm, gates, dy_tm, dx ? dx_tm : NULL, dw_ih, dw_hh, db_ih, db_hh);
    if (!dx) return;
    for (int s2 = 0; s2 < t; s2++)
        for (int i = 0; i < n; i++) {
            float *d = dx + ((size_t)i * t + s2) * in;
            const float *g = dx_tm + ((size_t)s2 * n + i) * in;
            for (int k = 0; k < in; k++) d[k] += g[k];
        }
}

const LayerOps LAYER_LSTM = {
    .name = "lstm",
    .parse = lstm_parse,
    .build = lstm_build,
    .release = lstm_release,
    .saved_bytes = lstm_saved,
    .forward = lstm_forward,
    .backward = lstm_backward,
};
