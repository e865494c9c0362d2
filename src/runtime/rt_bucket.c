/* rt_bucket.c: gradient buckets, the replicas' all-reduce of a stage's gradient while its
 * backward runs. The gradient is cut into buckets of whole layers from the last layer down
 * (rt_buckets); in the last backward before the all-reduce each bucket starts as soon as its
 * layers are done (rt_bucket_hook), and the all-reduce instruction completes them in order. */
#include "rt_impl.h"

/* How replicas combine gradients. 1f1b (one unit per minibatch), dp and model-parallel: each
 * replica's gradient is that of one whole minibatch, and a round of r minibatches makes one
 * step: the mean. The micro-batch kinds and 1f1b with micro-batches: replicas share one
 * minibatch's micro-batches, each already scaled by 1/n_micro: the sum is the minibatch's
 * mean gradient. */
CommOp rt_allreduce_op(const Schedule *s) {
    return sched_splits_minibatch(s->kind, s->n_micro) ? COMM_SUM : COMM_MEAN;
}

int rt_buckets(const Model *m, int first, int last, size_t bucket_bytes, int *layer, size_t *lo, size_t *n) {
    size_t cap = bucket_bytes ? bucket_bytes : RT_BUCKET_BYTES, base = model_param_offset(m, first);
    int nb = 0, end = last;
    for (int i = last - 1; i >= first; i--) {
        size_t floats = model_param_offset(m, end) - model_param_offset(m, i);
        if (floats * sizeof(float) >= cap || i == first) {
            if (floats) {
                layer[nb] = i;
                lo[nb] = model_param_offset(m, i) - base;
                n[nb] = floats;
                nb++;
            }
            end = i;
        }
    }
    return nb;
}

/* Starts the all-reduce of bucket b (idempotent). */
static int bucket_start(Worker *w, int b, Err *err) {
    if (w->bk_ar[b]) return PD_OK;
    return comm_group_iallreduce(w->group, w->dw + w->bk_lo[b], w->bk_n[b], rt_allreduce_op(w->s), &w->bk_ar[b], err);
}

/* After top-level layer i's backward: every bucket whose layers are all done starts, and the
 * all-reduces in flight advance. */
void rt_bucket_hook(void *arg, int i) {
    RtBucketHook *h = arg;
    Worker *w = h->w;
    if (h->rc) return;
    int any = -1;
    for (int b = 0; b < w->n_buckets && !h->rc; b++) {
        if (w->bk_layer[b] >= i) h->rc = bucket_start(w, b, h->err);
        if (w->bk_ar[b]) any = b;
    }
    int done;
    if (!h->rc && any >= 0) h->rc = comm_ar_test(w->bk_ar[any], &done, h->err);
}

/* The stage's all-reduce: buckets not started yet start now, then all complete in order. The
 * result is the same whether or not they overlapped the backward (same buckets, same order). */
int rt_bucket_allreduce(Worker *w, Err *err) {
    int rc = PD_OK;
    for (int b = 0; b < w->n_buckets && !rc; b++) rc = bucket_start(w, b, err);
    for (int b = 0; b < w->n_buckets && !rc; b++) rc = comm_ar_wait(&w->bk_ar[b], w->cfg->recv_timeout_s, err);
    for (int b = 0; b < w->n_buckets; b++) comm_ar_cancel(&w->bk_ar[b]);
    return rc;
}

/* True if the backward at pc is the last of its chunk before the chunk's all-reduce: the
 * chunk's all-reduce comes before the step, with no backward of the chunk between (other
 * chunks' instructions may: interleaved runs the later chunks' last backwards first, and each
 * chunk's buckets then reduce during the others' backwards). Its gradient is then final, so
 * the backward may start the buckets. */
int rt_last_backward_before_ar(const Worker *w, int pc) {
    const Instr *ins = w->sw->ins;
    const int c = ins[pc].chunk;
    for (int k = pc + 1; k < w->sw->n; k++) {
        int op = ins[k].op;
        if (op == OP_STEP) return 0;
        if (ins[k].chunk != c) continue;
        if (op == OP_ALLREDUCE) return 1;
        if (op == OP_BACKWARD || op == OP_BACKWARD_B || op == OP_BACKWARD_W) return 0;
    }
    return 0;
}
