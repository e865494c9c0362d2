/* lstm.c: one LSTM layer (PyTorch gate order i, f, g, o), fast version. TEMPORARY: calls
 * the reference loops until the GEMM version lands. */
#include <string.h>

#include "kernels.h"

int kern_lstm_init(KLstm *l, int t, int n_max, int in, int hid, Err *err) {
    memset(l, 0, sizeof *l);
    if (t < 1 || n_max < 1 || in < 1 || hid < 1)
        return err_set(err, PD_EINVAL, "lstm: bad shape t=%d n_max=%d in=%d hid=%d", t, n_max, in, hid);
    *l = (KLstm){.t = t, .n_max = n_max, .in = in, .hid = hid};
    return PD_OK;
}

void kern_lstm_release(KLstm *l) {
    if (l) l->impl = NULL;
}

size_t kern_lstm_saved_floats(int t, int n, int hid) { return (size_t)t * n * 5 * hid; }

void kern_lstm_fwd(KLstm *l, int n, const float *x, const float *w_ih, const float *w_hh, const float *b_ih,
                   const float *b_hh, float *y, float *saved) {
    kern_lstm_fwd_ref(l, n, x, w_ih, w_hh, b_ih, b_hh, y, saved);
}

void kern_lstm_bwd(KLstm *l, int n, const float *x, const float *w_ih, const float *w_hh, const float *y,
                   const float *saved, const float *dy, float *dx, float *dw_ih, float *dw_hh, float *db_ih,
                   float *db_hh) {
    kern_lstm_bwd_ref(l, n, x, w_ih, w_hh, y, saved, dy, dx, dw_ih, dw_hh, db_ih, db_hh);
}
