/* test_kernels_lstm.c: kern_lstm_* (fast) against kern_lstm_*_ref, and the _ref backward
 * (BPTT) against central finite differences of the _ref forward through L = sum(r * y)
 * over all time steps, for every input and parameter; n smaller than n_max; backward onto
 * prefilled buffers (+=); the saved gates satisfy PyTorch's equations at t = 0. */
#include <math.h>

#include "test_kernels_util.h"

typedef struct LstmCtx {
    KLstm *l;
    int n;
    float *x, *wih, *whh, *bih, *bhh, *y, *saved, *r;
} LstmCtx;

static double lstm_loss(void *p) {
    LstmCtx *c = p;
    kern_lstm_fwd_ref(c->l, c->n, c->x, c->wih, c->whh, c->bih, c->bhh, c->y, c->saved);
    return tk_dot(c->r, c->y, (size_t)c->l->t * c->n * c->l->hid);
}

static void check_lstm(int t, int n_max, int n, int in, int hid, int fd, uint64_t tag) {
    KLstm l;
    Err err = {0};
    assert_int_equal(kern_lstm_init(&l, t, n_max, in, hid, &err), PD_OK);
    print_message("  lstm T=%d n=%d/%d I=%d H=%d\n", t, n, n_max, in, hid);
    const int G = 4 * hid;
    size_t nx = (size_t)t * n * in, ny = (size_t)t * n * hid, nwi = (size_t)G * in, nwh = (size_t)G * hid;
    size_t ns = kern_lstm_saved_floats(t, n, hid);
    const float a = 1.0f / sqrtf((float)hid);   // PyTorch's init range
    LstmCtx c = {&l, n, tk_rand(nx, tag + 1, -1, 1), tk_rand(nwi, tag + 2, -a, a), tk_rand(nwh, tag + 3, -a, a),
                 tk_rand(G, tag + 4, -a, a), tk_rand(G, tag + 5, -a, a), pd_alloc_f32(ny), pd_alloc_f32(ns),
                 tk_rand(ny, tag + 6, -1, 1)};
    float *y = pd_alloc_f32(ny), *saved = pd_alloc_f32(ns);
    kern_lstm_fwd(&l, n, c.x, c.wih, c.whh, c.bih, c.bhh, y, saved);
    kern_lstm_fwd_ref(&l, n, c.x, c.wih, c.whh, c.bih, c.bhh, c.y, c.saved);
    assert_int_equal(tu_compare("lstm y", y, c.y, ny, 1e-4, 1e-5), 0);
    assert_int_equal(tu_compare("lstm saved", saved, c.saved, ns, 1e-4, 1e-5), 0);
    /* t = 0, sample 0, unit 0 by hand: c = i*g, h = o*tanh(c) */
    {
        double pre[4];
        for (int q = 0; q < 4; q++) {
            int j = q * hid;
            pre[q] = (double)c.bih[j] + c.bhh[j];
            for (int k = 0; k < in; k++) pre[q] += (double)c.wih[(size_t)j * in + k] * c.x[k];
        }
        double i = 1 / (1 + exp(-pre[0])), g = tanh(pre[2]), o = 1 / (1 + exp(-pre[3]));
        assert_true(fabs(c.y[0] - o * tanh(i * g)) < 1e-5);
    }
    float *px = tk_rand(nx, tag + 7, -1, 1), *pwi = tk_rand(nwi, tag + 8, -1, 1), *pwh = tk_rand(nwh, tag + 9, -1, 1);
    float *pbi = tk_rand(G, tag + 10, -1, 1), *pbh = tk_rand(G, tag + 11, -1, 1);
    float *dx = tk_copy(px, nx), *dwi = tk_copy(pwi, nwi), *dwh = tk_copy(pwh, nwh), *dbi = tk_copy(pbi, G),
          *dbh = tk_copy(pbh, G);
    float *rdx = tk_copy(px, nx), *rdwi = tk_copy(pwi, nwi), *rdwh = tk_copy(pwh, nwh), *rdbi = tk_copy(pbi, G),
          *rdbh = tk_copy(pbh, G);
    kern_lstm_bwd(&l, n, c.x, c.wih, c.whh, y, saved, c.r, dx, dwi, dwh, dbi, dbh);
    kern_lstm_bwd_ref(&l, n, c.x, c.wih, c.whh, c.y, c.saved, c.r, rdx, rdwi, rdwh, rdbi, rdbh);
    assert_int_equal(tu_compare("lstm dx", dx, rdx, nx, 1e-3, 1e-4), 0);
    assert_int_equal(tu_compare("lstm dw_ih", dwi, rdwi, nwi, 1e-3, 1e-4), 0);
    assert_int_equal(tu_compare("lstm dw_hh", dwh, rdwh, nwh, 1e-3, 1e-4), 0);
    assert_int_equal(tu_compare("lstm db_ih", dbi, rdbi, G, 1e-3, 1e-4), 0);
    assert_int_equal(tu_compare("lstm db_hh", dbh, rdbh, G, 1e-3, 1e-4), 0);
    /* dx alone (the first layer of a model wants no dx; the second wants only some) */
    float *dx2 = tk_copy(px, nx);
    kern_lstm_bwd(&l, n, c.x, c.wih, c.whh, y, saved, c.r, dx2, NULL, NULL, NULL, NULL);
    assert_int_equal(tu_compare("lstm dx only", dx2, rdx, nx, 1e-3, 1e-4), 0);
    float *dwh2 = tk_copy(pwh, nwh);
    kern_lstm_bwd(&l, n, c.x, c.wih, c.whh, y, saved, c.r, NULL, NULL, dwh2, NULL, NULL);
    assert_int_equal(tu_compare("lstm dw_hh only", dwh2, rdwh, nwh, 1e-3, 1e-4), 0);
    if (fd) {
        tk_sub(rdx, px, nx);
        tk_sub(rdwi, pwi, nwi);
        tk_sub(rdwh, pwh, nwh);
        tk_sub(rdbi, pbi, G);
        tk_sub(rdbh, pbh, G);
        float *g = pd_alloc_f32(nx + nwi + nwh);
        tk_fd(lstm_loss, &c, c.x, nx, 1e-2f, g);
        tk_check_grad("lstm dx", rdx, g, nx, 1e-3);
        tk_fd(lstm_loss, &c, c.wih, nwi, 1e-2f, g);
        tk_check_grad("lstm dw_ih", rdwi, g, nwi, 1e-3);
        tk_fd(lstm_loss, &c, c.whh, nwh, 1e-2f, g);
        tk_check_grad("lstm dw_hh", rdwh, g, nwh, 1e-3);
        tk_fd(lstm_loss, &c, c.bih, G, 1e-2f, g);
        tk_check_grad("lstm db_ih", rdbi, g, G, 1e-3);
        tk_fd(lstm_loss, &c, c.bhh, G, 1e-2f, g);
        tk_check_grad("lstm db_hh", rdbh, g, G, 1e-3);
        pd_free(g);
    }
    float *all[] = {c.x, c.wih, c.whh, c.bih, c.bhh, c.y, c.saved, c.r, y, saved, px, pwi, pwh, pbi, pbh,
                    dx, dwi, dwh, dbi, dbh, rdx, rdwi, rdwh, rdbi, rdbh, dx2, dwh2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pd_free(all[i]);
    kern_lstm_release(&l);
    kern_lstm_release(&l);
}

static void test_lstm(void **state) {
    (void)state;
    check_lstm(3, 2, 2, 4, 5, 1, 100);
    check_lstm(4, 5, 3, 3, 2, 1, 200);     // n < n_max
    check_lstm(1, 1, 1, 2, 3, 1, 300);     // one step
    check_lstm(28, 8, 7, 28, 32, 0, 400);  // the model's T and I, smaller H and N
}

static void test_lstm_bad_shape(void **state) {
    (void)state;
    KLstm l;
    Err err = {0};
    assert_int_equal(kern_lstm_init(&l, 0, 4, 3, 2, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "lstm"));
    kern_lstm_release(&l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lstm),
        cmocka_unit_test(test_lstm_bad_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
