/* rt_eval.c: evaluation after training: the test set goes through replica 0 of every stage,
 * forward only (eval mode: running batch-norm statistics, no dropout), one batch at a time;
 * the last stage counts correct answers. Uses the newest weights and slot 0's context. */
#include <string.h>

#include "kernels.h"
#include "rt_impl.h"

/* Evaluation batch b travels as minibatch id unit_base + n_units + b: the ids after the
 * list's last unit, which no training message of this list uses. With several stages per rank
 * (interleaved) the id also names the stage the activation feeds, as in training (rt_msg_id),
 * and a rank runs each batch through its chunks in order. */

/* Batch b (n samples, id mb) through stage w's range: receive (or read) its input, forward,
 * send the output on (or count the answers at the last stage). */
static int eval_batch(Worker *w, size_t b, int n, int64_t mb, Err *err) {
    const Schedule *s = w->s;
    const Dataset *test = w->cfg->test;
    int B = w->cfg->unit_batch, rc = PD_OK;
    int prev = w->is_input ? -1 : s->stages[w->stage - 1].ranks[0];
    int next = w->is_last ? -1 : s->stages[w->stage + 1].ranks[0];
    int first = s->stages[0].ranks[0], lastr = s->stages[s->n_stages - 1].ranks[0];
    Slot *sl = &w->slots[0];
    const float *wv = NULL;
    for (int k = 0; k < w->n_vslots; k++)
        if (w->vver[k] == w->newest) wv = w->vbuf[k];
    PD_ASSERT(wv);
    Shape in = w->in_shape, out = w->out_shape;
    in.d[0] = n;
    out.d[0] = n;
    CommReq *rq = NULL;
    if (w->is_input) {
        data_batch(test, NULL, (size_t)B * b, n, nnctx_input(sl->ctx), sl->labels);
        if (!w->is_last) {
            for (int i = 0; i < n * w->tlen; i++) sl->labels_f[i] = (float)sl->labels[i];
            if ((rc = comm_isend(w->c, lastr, COMM_CTRL, mb, 0, shape1(n * w->tlen), sl->labels_f, &sl->s_lab, err)))
                return rc;
        }
    } else {
        RtWireDir *d = &w->wire_ain;   /* the wire's codec (rt_wire.c; bf16 and fp32: as fp32) */
        Shape ws = rt_wire_shape(w, d, in, mb, 1);
        float *dst = rt_wire_plain(d, 1) ? nnctx_input(sl->ctx) : (float *)(void *)sl->w_act_in;
        if ((rc = comm_irecv(w->c, prev, COMM_ACT, rt_msg_id(s, mb, w->stage), ws, dst, &rq, err))) return rc;
        if ((rc = comm_wait(w->c, &rq, w->cfg->recv_timeout_s, NULL, err))) return rc;
        rt_wire_recv(w, d, mb, sl->w_act_in, nnctx_input(sl->ctx), shape_numel(in), 1);
        if (w->is_last) {
            if ((rc = comm_irecv(w->c, first, COMM_CTRL, mb, shape1(n * w->tlen), sl->labels_f, &rq, err))) return rc;
            if ((rc = comm_wait(w->c, &rq, w->cfg->recv_timeout_s, NULL, err))) return rc;
            for (int i = 0; i < n * w->tlen; i++) sl->labels[i] = (int32_t)sl->labels_f[i];
        }
    }
    NnRun run = {.n = n, .train = 0, .seed = w->cfg->seed, .minibatch = (uint64_t)mb};
    const float *y = model_forward(w->m, sl->ctx, wv, w->state, nnctx_input(sl->ctx), &run);
    if (w->is_last) {
        int correct = 0;
        float loss = kern_xent_fwd_bwd(y, sl->labels, NULL, n * w->tlen, w->classes, 1.0f, &correct);
        w->res->test_loss_sum += (double)loss * n * w->tlen;   /* totals over positions */
        w->res->test_correct += correct;
        w->res->test_total += n * w->tlen;
    } else {
        RtWireDir *d = &w->wire_aout;
        const float *m = rt_wire_send(w, d, mb, y, shape_numel(out), sl->w_act_out, 1);
        if ((rc = comm_isend(w->c, next, COMM_ACT, rt_msg_id(s, mb, w->stage + 1), w->newest, rt_wire_shape(w, d, out, mb, 1),
                             m, &sl->s_act, err)))
            return rc;
        /* the output buffer is rewritten by the next batch's forward: complete the send (one to
         * this rank's own next chunk, the V's turn, completes once that chunk received it: rt_eval) */
        if (next != w->rank && (rc = comm_wait(w->c, &sl->s_act, w->cfg->recv_timeout_s, NULL, err))) return rc;
    }
    if (sl->s_lab && lastr != w->rank && (rc = comm_wait(w->c, &sl->s_lab, w->cfg->recv_timeout_s, NULL, err)))
        return rc;
    return PD_OK;
}

/* The sends of a batch to the rank itself (the V placement's turn, and the labels when one rank
 * holds the first and the last stage), complete after its chunks have received them. */
static int eval_sends_done(Worker *w, Err *err) {
    int rc = PD_OK;
    for (int c = 0; c < w->n_chunk && !rc; c++) {
        Slot *sl = &rt_chunk(w, c)->slots[0];
        if (sl->s_act) rc = comm_wait(w->c, &sl->s_act, w->cfg->recv_timeout_s, NULL, err);
        if (!rc && sl->s_lab) rc = comm_wait(w->c, &sl->s_lab, w->cfg->recv_timeout_s, NULL, err);
    }
    return rc;
}

int rt_eval(Worker *w, Err *err) {
    const Dataset *test = w->cfg->test;
    if (w->stage < 0 || w->sw->replica != 0) return PD_OK;
    int B = w->cfg->unit_batch, rc = PD_OK, V = w->n_chunk;
    RtWorkerResult *had[RT_MAX_CHUNKS];   /* a caller may have lent chunk 0 another result and config */
    for (int c = 0; c < V; c++) {   /* nothing is in flight: lend context 0 */
        Worker *x = rt_chunk(w, c);
        had[c] = x->res;
        x->cfg = w->cfg, x->res = w->res;
        if (x->recompute) x->slots[0].ctx = x->pool[0];
    }
    size_t nb = (test->n + (size_t)B - 1) / (size_t)B;
    for (size_t b = 0; b < nb && !rc; b++) {
        int n = (size_t)B * (b + 1) <= test->n ? B : (int)(test->n - (size_t)B * b);
        int64_t mb = (w->cfg->eval_base ? w->cfg->eval_base : (int64_t)w->cfg->unit_base + w->s->n_units) + (int64_t)b;
        for (int c = 0; c < V && !rc; c++) {
            Worker *x = rt_chunk(w, c);
            if ((rc = eval_batch(x, b, n, mb, err))) err_prefix(err, "rank %d (stage %d): evaluation", x->rank, x->stage);
        }
        if (!rc && (rc = eval_sends_done(w, err))) err_prefix(err, "rank %d: evaluation", w->rank);
    }
    for (int c = 0; c < V; c++) {
        Worker *x = rt_chunk(w, c);
        if (x->recompute) x->slots[0].ctx = NULL;
        if (c) x->res = had[c];
    }
    return rc;
}
