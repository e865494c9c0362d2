/* schedule.c: the schedule generators (plan + kind + counts -> per-worker instruction
 * lists) and the text dump. Every generator is built from two orders: 1F1B over a
 * worker's own units (warm-up forwards, then backward/forward alternation, then the
 * remaining backwards) and GPipe's all-forwards-then-all-backwards; kinds differ in which
 * units a worker owns, where the all-reduce + step go and which weight version each
 * forward reads. It does not check for deadlock (the simulator does) and times nothing. */
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

static const char *const KIND_NAMES[] = {"1f1b", "gpipe", "1f1b-flush", "2bw", "dp", "model-parallel", "asp",
                                         "zb-h1", "zb-h2", "interleaved", "zb-v", "v-half", "v-min", "dualpipe-v"};
_Static_assert(sizeof KIND_NAMES / sizeof KIND_NAMES[0] == SCHED_COUNT, "kind names");
static const char *const OP_NAMES[] = {"F", "B", "SA", "RA", "SG", "RG", "AR", "STEP", "FLUSH", "BI", "BW", "R"};
_Static_assert(sizeof OP_NAMES / sizeof OP_NAMES[0] == OP_COUNT, "op names");

const char *sched_kind_name(SchedKind k) {
    PD_ASSERT(k >= 0 && k < SCHED_COUNT);
    return KIND_NAMES[k];
}

int sched_kind_parse(const char *name, SchedKind *out) {
    for (int k = 0; k < SCHED_COUNT; k++)
        if (!strcmp(name, KIND_NAMES[k])) {
            *out = (SchedKind)k;
            return PD_OK;
        }
    if (!strcmp(name, "mp")) {
        *out = SCHED_MP;
        return PD_OK;
    }
    return PD_EINVAL;
}

const char *sched_op_name(InstrOp op) {
    PD_ASSERT(op >= 0 && op < OP_COUNT);
    return OP_NAMES[op];
}

int sched_replica_of(const Schedule *s, int st, int u) {
    PD_ASSERT(st >= 0 && st < s->n_stages && u >= 0 && u < s->n_units);
    int r = s->stages[st].replicas;
    /* Round-robin over the global unit index, also for micro-batch kinds: a replica's
     * units must be every r-th unit for the warm-up counts to hold (assigning by the
     * index within a minibatch skews replicas when r does not divide n_micro, and the
     * 1F1B orders then deadlock). */
    return s->kind == SCHED_MP ? 0 : u % r;
}

int sched_rank_of(const Schedule *s, int st, int u) { return s->stages[st].ranks[sched_replica_of(s, st, u)]; }

/* ---- building --------------------------------------------------------------------- */

static void push_c(SchedWorker *w, int op, int mb, int peer, int version, int chunk) {
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        Instr *ni = pd_alloc((size_t)w->cap * sizeof *ni);
        if (w->n) memcpy(ni, w->ins, (size_t)w->n * sizeof *ni);
        pd_free(w->ins);
        w->ins = ni;
    }
    w->ins[w->n++] = (Instr){op, mb, peer, version, chunk};
}

static void push(SchedWorker *w, int op, int mb, int peer, int version) { push_c(w, op, mb, peer, version, 0); }

/* Forward of unit u at the worker's chunk c: receive (not at stage 0), F, send (not at the
 * last stage). */
static void emit_forward_c(const Schedule *s, SchedWorker *w, int u, int version, int c) {
    int st = w->stages ? w->stages[c] : w->stage;
    if (st > 0) push_c(w, OP_RECV_ACT, u, sched_rank_of(s, st - 1, u), -1, c);
    push_c(w, OP_FORWARD, u, -1, version, c);
    if (st < s->n_stages - 1) push_c(w, OP_SEND_ACT, u, sched_rank_of(s, st + 1, u), -1, c);
}

/* The last compute instruction of w's list is the forward of (u, c): its activations are
 * still there, so a recomputing schedule needs no OP_RECOMPUTE before its backward. */
static int just_forwarded(const SchedWorker *w, int u, int c) {
    for (int i = w->n - 1; i >= 0; i--) {
        const Instr *in = &w->ins[i];
        if (sched_op_computes(in->op)) return in->op == OP_FORWARD && in->mb == u && in->chunk == c;
    }
    return 0;
}

/* Backward of unit u at chunk c: with recompute, R (unless the unit's forward came just
 * before), then receive (not at the last stage), B or, split, BI, then send (not at stage 0).
 * A split backward's BW is emitted separately (emit_weight). */
static void emit_backward_c(const Schedule *s, SchedWorker *w, int u, int version, int c, int split) {
    int st = w->stages ? w->stages[c] : w->stage;
    if (s->recompute && !just_forwarded(w, u, c)) push_c(w, OP_RECOMPUTE, u, -1, version, c);
    if (st < s->n_stages - 1) push_c(w, OP_RECV_GRAD, u, sched_rank_of(s, st + 1, u), -1, c);
    push_c(w, split ? OP_BACKWARD_B : OP_BACKWARD, u, -1, version, c);
    if (st > 0) push_c(w, OP_SEND_GRAD, u, sched_rank_of(s, st - 1, u), -1, c);
}

static void emit_forward(const Schedule *s, SchedWorker *w, int u, int version) { emit_forward_c(s, w, u, version, 0); }
static void emit_backward(const Schedule *s, SchedWorker *w, int u, int version) {
    emit_backward_c(s, w, u, version, 0, 0);
}

/* All-reduce among the stage's replicas (if more than one), then the step writing
 * version `to`. */
static void emit_sync(const Schedule *s, SchedWorker *w, int to) {
    if (s->stages[w->stage].replicas > 1) push(w, OP_ALLREDUCE, -1, w->stage, to);
    push(w, OP_STEP, -1, -1, to);
}

typedef struct Gen {
    Schedule *s;
    int *units;     /* scratch: a worker's own units */
    int *version;   /* scratch: version of each own unit's forward */
    Err *err;
} Gen;

/* Collects the units worker w owns among [lo, hi), ascending. */
static int own_units(Gen *g, const SchedWorker *w, int rank, int lo, int hi) {
    int n = 0;
    for (int u = lo; u < hi; u++)
        if (sched_rank_of(g->s, w->stage, u) == rank) g->units[n++] = u;
    return n;
}

/* Steps done before the forward of own unit i in a 1F1B order with `warmup` warm-up
 * forwards and one step after every backward: forward i (i >= warmup) follows
 * backward i - warmup. */
static int steps_before_forward(int i, int warmup) { return i < warmup ? 0 : i - warmup + 1; }

/* 1f1b, dp, model-parallel: one step (after an all-reduce among replicas) after every
 * backward; the r replicas' i-th backwards form round i and all write version i + 1. */
static int gen_rounds(Gen *g, int rank) {
    Schedule *s = g->s;
    SchedWorker *w = &s->workers[rank];
    const SchedStage *st = &s->stages[w->stage];
    int n = own_units(g, w, rank, 0, s->n_units);
    int k = st->warmup < n ? st->warmup : n;
    for (int i = 0; i < n; i++) {
        int v = steps_before_forward(i, st->warmup);
        if (s->vertical_sync && w->stage > 0) {
            /* The input stage's version for this unit, as a count of minibatches folded
             * in, mapped to this stage's rounds (docs/explanation/schedules.md). */
            const SchedStage *s0 = &s->stages[0];
            int u = g->units[i];
            int v0 = steps_before_forward(u / s0->replicas, s0->warmup);
            int want = (int)((long)v0 * s0->replicas / st->replicas);
            if (want > v)
                return err_set(g->err, PD_EINVAL,
                               "vertical sync: stage %d needs version %d for minibatch %d before it exists "
                               "(has %d); this plan's replication does not allow vertical sync",
                               w->stage, want, u, v);
            v = want;
        }
        g->version[i] = v;
    }
    int nf = 0, nb = 0;
    while (nf < k) emit_forward(s, w, g->units[nf], g->version[nf]), nf++;
    while (nb < n) {
        emit_backward(s, w, g->units[nb], g->version[nb]);
        nb++;
        emit_sync(s, w, nb);
        if (nf < n) emit_forward(s, w, g->units[nf], g->version[nf]), nf++;
    }
    /* A replica with fewer units than rounds joins the last all-reduce with nothing. */
    int rounds = (s->n_units + st->replicas - 1) / st->replicas;
    for (int r = n; r < rounds; r++) emit_sync(s, w, r + 1);
    return PD_OK;
}

/* asp: per own unit i (round-robin), F u@i, B u@i and U i+1, where version i is the weights
 * the worker pulled for its i-th unit and U pushes the gradient and pulls the next ones. No
 * all-reduce: the runtime (rt_asp.c) applies every gradient at the parameters' owners as it
 * comes (docs/explanation/asp.md); a simulation of these lists is compute only. */
static void gen_asp(Gen *g, int rank) {
    Schedule *s = g->s;
    SchedWorker *w = &s->workers[rank];
    int n = own_units(g, w, rank, 0, s->n_units);
    for (int i = 0; i < n; i++) {
        emit_forward(s, w, g->units[i], i);
        emit_backward(s, w, g->units[i], i);
        push(w, OP_STEP, -1, -1, i + 1);
    }
}

/* gpipe and 1f1b-flush: per minibatch, the worker's own micro-batches in GPipe order or
 * in 1F1B order, then all-reduce, step (version k + 1) and flush. All read version k. */
static int gen_flush(Gen *g, int rank) {
    Schedule *s = g->s;
    SchedWorker *w = &s->workers[rank];
    const SchedStage *st = &s->stages[w->stage];
    for (int k = 0; k < s->n_minibatches; k++) {
        int n = own_units(g, w, rank, k * s->n_micro, (k + 1) * s->n_micro);
        int warm = s->kind == SCHED_GPIPE ? n : (st->warmup < n ? st->warmup : n);
        int nf = 0, nb = 0;
        while (nf < warm) emit_forward(s, w, g->units[nf++], k);
        while (nb < n) {
            emit_backward(s, w, g->units[nb++], k);
            if (nf < n) emit_forward(s, w, g->units[nf++], k);
        }
        emit_sync(s, w, k + 1);
        push(w, OP_FLUSH, -1, -1, -1);
    }
    return PD_OK;
}

/* Emits the forward of own unit i when `steps` steps are done: under 2bw's rule (micro-batch
 * of minibatch k reads version max(k - 1, 0)), failing if that version does not exist yet (too
 * few micro-batches per minibatch for the pipeline depth); under 1f1b's, the newest version. */
static int fwd_minibatch_steps(Gen *g, int rank, int i, int steps) {
    Schedule *s = g->s;
    SchedWorker *w = &s->workers[rank];
    int u = g->units[i], k = u / s->n_micro, v = s->kind == SCHED_1F1B ? steps : k > 0 ? k - 1 : 0;
    if (steps < v)
        return err_set(g->err, PD_EINVAL,
                       "2bw: stage %d rank %d needs version %d for micro-batch %d but has only %d; "
                       "use at least %d micro-batches per minibatch",
                       w->stage, rank, v, u, steps, s->stages[w->stage].warmup);
    g->version[i] = v;
    emit_forward(s, w, u, v);
    return PD_OK;
}

/* 2bw, and 1f1b with micro-batches: 1F1B over all the worker's micro-batches without
 * flushes; after its last backward of minibatch k the stage all-reduces and steps to version
 * k + 1. 2bw: every micro-batch of minibatch k reads version max(k - 1, 0) (one step of delay,
 * so at most two versions are alive: W(k+1) = W(k) - lr * grad(W(k-1))). 1f1b: a micro-batch
 * reads the newest version when its forward runs, so a unit crosses at most
 * ceil(warm-up / n_micro) steps (local accumulation, after PACI) instead of warm-up - 1. */
static int gen_minibatch_steps(Gen *g, int rank) {
    Schedule *s = g->s;
    SchedWorker *w = &s->workers[rank];
    const SchedStage *st = &s->stages[w->stage];
    int n = own_units(g, w, rank, 0, s->n_units);
    int k = st->warmup < n ? st->warmup : n;
    int steps = 0;   /* steps emitted so far = newest version */
    int nf = 0, nb = 0, rc;
    while (nf < k)
        if ((rc = fwd_minibatch_steps(g, rank, nf++, steps))) return rc;
    while (nb < n) {
        int u = g->units[nb], mbk = u / s->n_micro;
        while (steps < mbk) emit_sync(s, w, ++steps);   /* minibatches with none of ours */
        emit_backward(s, w, u, g->version[nb]);
        nb++;
        int next = nb < n ? g->units[nb] / s->n_micro : s->n_minibatches;
        while (steps < next) emit_sync(s, w, ++steps);
        if (nf < n && (rc = fwd_minibatch_steps(g, rank, nf++, steps))) return rc;
    }
    while (steps < s->n_minibatches) emit_sync(s, w, ++steps);
    return PD_OK;
}

/* zb-h1 and zb-h2 (Zero Bubble, Qi et al. 2023, with a flush per minibatch): per minibatch
 * k, 1F1B over the worker's own micro-batches with the backward split into BI (input
 * gradient, sent back at once) and BW (weight gradient). A replica of stage s warms up with
 * w = min(warmup_s, n) forwards (zb-h2: min(2 warmup_s - 1, n)) and defers up to
 * d_s = warmup_0 - warmup_s weight passes (s on a straight pipeline): after each BI it runs
 * the oldest pending BW only if more than d_s are pending, then the next forward; the
 * pending BWs fill the drain. Units in flight (forward to BW) stay <= w + d_s = warmup_0 in
 * zb-h1: the input stage's, as in 1f1b-flush. Every compute reads version k; then
 * all-reduce, step to k + 1, flush. */
static int gen_zb(Gen *g, int rank) {
    Schedule *s = g->s;
    SchedWorker *w = &s->workers[rank];
    const SchedStage *st = &s->stages[w->stage];
    int d = s->stages[0].warmup - st->warmup;
    if (d < 0) d = 0;
    for (int k = 0; k < s->n_minibatches; k++) {
        int n = own_units(g, w, rank, k * s->n_micro, (k + 1) * s->n_micro);
        int warm = s->kind == SCHED_ZB_H2 ? 2 * st->warmup - 1 : st->warmup;
        if (warm > n) warm = n;
        int nf = 0, nb = 0, nw = 0;
        while (nf < warm) emit_forward(s, w, g->units[nf++], k);
        while (nb < n) {
            emit_backward_c(s, w, g->units[nb++], k, 0, 1);
            if (nb - nw > d) push(w, OP_BACKWARD_W, g->units[nw++], -1, k);
            if (nf < n) emit_forward(s, w, g->units[nf++], k);
        }
        while (nw < n) push(w, OP_BACKWARD_W, g->units[nw++], -1, k);
        emit_sync(s, w, k + 1);
        push(w, OP_FLUSH, -1, -1, -1);
    }
    return PD_OK;
}

/* interleaved (Megatron-LM's interleaved 1F1B, Narayanan et al. 2021): p pipeline positions,
 * V chunks per worker; the worker at position r holds stages r, r + p, ..., r + (V-1) p (chunk
 * c = stage r + c p). With d replicas of every stage, replica j of each is pipeline j, and it
 * owns the units u of the minibatch with u mod d = j: m = M / d of them (a multiple of p), the
 * l-th being k M + l d + j. Per minibatch k it runs m V forwards and m V backwards; the i-th
 * forward is for chunk (i mod pV) / p and own micro-batch l = (i / pV) p + i mod p, the i-th
 * backward for chunk V - 1 - (i mod pV) / p and the same l. Warm-up: all m V forwards if m = p,
 * else min(2 (p - r - 1) + (V - 1) p, m V); then forward i + warm-up, backward i alternate; then
 * the remaining backwards. All read version k; then one all-reduce per chunk over the chunk's d
 * replicas (none when d = 1), one step of every chunk to k + 1, flush. */
/* The i-th forward (forward = 1) or backward of minibatch k at interleaved worker w: own
 * micro-batch l is unit k M + l d + replica. */
static void emit_interleaved(Schedule *s, SchedWorker *w, int k, int i, int forward) {
    int V = w->n_chunks, P = s->n_stages / V, d = s->stages[w->stage].replicas;
    int u = k * s->n_micro + sched_interleaved_micro(i, P, V) * d + w->replica, c = sched_interleaved_chunk(i, P, V, forward);
    if (forward) emit_forward_c(s, w, u, k, c);
    else emit_backward_c(s, w, u, k, c, 0);
}

static int gen_interleaved(Gen *g, int rank) {
    Schedule *s = g->s;
    SchedWorker *w = &s->workers[rank];
    int V = w->n_chunks, P = s->n_stages / V, r = w->stage, m = s->n_micro / s->stages[r].replicas, total = m * V,
        warm = sched_interleaved_warmup(P, V, r, m);
    for (int k = 0; k < s->n_minibatches; k++) {
        int nf = 0;
        while (nf < warm) emit_interleaved(s, w, k, nf++, 1);
        for (int nb = 0; nb < total; nb++) {
            if (nf < total) emit_interleaved(s, w, k, nf++, 1);
            emit_interleaved(s, w, k, nb, 0);
        }
        for (int c = 0; c < V; c++)
            if (s->stages[w->stages[c]].replicas > 1) push_c(w, OP_ALLREDUCE, -1, w->stages[c], k + 1, c);
        push(w, OP_STEP, -1, -1, k + 1);
        push(w, OP_FLUSH, -1, -1, -1);
    }
    return PD_OK;
}

/* ---- the V-shaped kinds ---------------------------------------------------------------------- */
/* zb-v, v-half, v-min and dualpipe-v (docs/explanation/schedules.md, "V-shaped schedules"): P pipeline
 * positions, the one at i holding stage i (chunk 0, on the way down) and stage 2 P - 1 - i (chunk 1,
 * on the way back up). With d replicas of every stage, replica j of each is pipeline j and owns the
 * units u of the minibatch with u mod d = j: m = M / d of them, the l-th being k M + l d + j. Each kind
 * is an order of the 6 m computes of a position per minibatch: F, BI and BW of each own micro-batch at
 * each chunk; every compute reads version k, then one all-reduce per chunk (d > 1), the step, flush. */

enum { VF, VB, VW };   /* forward, input-gradient half (BI), weight-gradient half (BW) */
typedef struct VOp {
    int op, c, l;      /* VF/VB/VW, chunk, own micro-batch */
} VOp;

typedef struct VOrder {
    VOp *ops;
    int n;
    int f[2], b[2], w[2];   /* next own micro-batch of F, BI and BW per chunk */
} VOrder;

static void v_put(VOrder *o, int op, int c) {
    int *next = op == VF ? o->f : op == VB ? o->b : o->w;
    o->ops[o->n++] = (VOp){op, c, next[c]++};
}

/* zb-v (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024): the position at r of P warms up with
 * 2 (P - r) - 1 forwards of chunk 0, then r pairs (F chunk 1, F chunk 0), then P - r triples (F, BI, BW)
 * of chunk 1; the steady state repeats F0 BI0 BW0 F1 BI1 BW1 (the turn at chunk 1 is where a unit's
 * forward ends and its backward begins); the drain runs the remaining BIs, chunk 0 first, and then the
 * deferred BWs, chunk 1 first. Needs m >= P. With F = B = W per chunk every position is busy from its
 * first forward to its last BW, and at most 2 P (unit, chunk) pairs are in flight: P units of whole
 * stages, 1F1B's peak. */
static void v_order_zbv(VOrder *o, int r, int P, int m) {
    int n1 = 2 * (P - r) - 1 < m ? 2 * (P - r) - 1 : m;
    for (int i = 0; i < n1; i++) v_put(o, VF, 0);
    for (int i = 0; i < r; i++) {
        if (o->f[1] < m) v_put(o, VF, 1);
        if (o->f[0] < m) v_put(o, VF, 0);
    }
    for (int i = 0; i < P - r && o->f[1] < m; i++) v_put(o, VF, 1), v_put(o, VB, 1), v_put(o, VW, 1);
    while (o->f[0] < m || o->f[1] < m) {
        if (o->f[0] < m) v_put(o, VF, 0);
        if (o->b[0] < o->f[0] && o->b[0] < m) v_put(o, VB, 0), v_put(o, VW, 0);
        if (o->f[1] < m) v_put(o, VF, 1), v_put(o, VB, 1), v_put(o, VW, 1);
    }
    while (o->b[0] < m || o->b[1] < m) {
        if (o->b[0] < m) v_put(o, VB, 0);
        if (o->b[1] < m) v_put(o, VB, 1);
    }
    while (o->w[1] < m) v_put(o, VW, 1);
    while (o->w[0] < m) v_put(o, VW, 0);
}

/* v-half and v-min (Qi et al., Pipeline Parallelism with Controllable Memory, NeurIPS 2024): the
 * building block of one micro-batch, in slots of one chunk's F (= BI = BW), repeated every 6 slots.
 * Position i of P runs F0 (chunk 0's forward), F1, BI1, BI0 of micro-batch 0 at the slots
 *   v-min:  i,  2P - 1 - i,  2P + e + i,      4P + e - 1 - i   (e = 2 if 3 divides P, else 0)
 *   v-half: 2i, 3P - 2 - i,  3P + e + 2i - 1, 6P + e - i - 2   (e = 3 if P is even, else 0)
 * (one slot per hop, except v-half's chunk 0 forward and chunk 1 backward, which take two, so a unit
 * lives longer at the later positions and less at the first); e makes the four slots differ modulo 6.
 * Each BW takes the first slot after its BI whose residue modulo 6 the four leave free, BW1 first.
 * Micro-batch l runs 6 l slots later; the order of a position is its computes sorted by slot. A
 * unit's life at a position (F0 to BW0, F1 to BW1) over the period of 6 bounds the units in flight:
 * v-min peaks at 2 floor((P + 4) / 3) (unit, chunk) pairs, v-half at 2 floor((P + 2) / 2). */
static void v_block(SchedKind kind, int i, int P, int slot[6]) {   /* slot[op * 2 + c] */
    if (kind == SCHED_V_MIN) {
        int e = P % 3 == 0 ? 2 : 0;
        slot[VF * 2] = i, slot[VF * 2 + 1] = 2 * P - 1 - i, slot[VB * 2 + 1] = 2 * P + e + i;
        slot[VB * 2] = 4 * P + e - 1 - i;
    } else {
        int e = P % 2 == 0 ? 3 : 0;
        slot[VF * 2] = 2 * i, slot[VF * 2 + 1] = 3 * P - 2 - i, slot[VB * 2 + 1] = 3 * P + e + 2 * i - 1;
        slot[VB * 2] = 6 * P + e - i - 2;
    }
    int used = 0;
    for (int c = 0; c < 2; c++) used |= 1 << (slot[VF * 2 + c] % 6) | 1 << (slot[VB * 2 + c] % 6);
    PD_ASSERTF(__builtin_popcount(used) == 4, "V block of %d positions: slots collide modulo 6", P);
    for (int c = 1; c >= 0; c--) {
        int t = slot[VB * 2 + c] + 1;
        while (used >> (t % 6) & 1) t++;
        slot[VW * 2 + c] = t;
        used |= 1 << (t % 6);
    }
}

static void v_order_block(VOrder *o, SchedKind kind, int r, int P, int m) {
    int slot[6];
    v_block(kind, r, P, slot);
    /* the 6 computes of micro-batch l take slots slot[.] + 6 l, all distinct: walk the slots in order */
    int lo = slot[0], hi = slot[0];
    for (int k = 1; k < 6; k++) lo = slot[k] < lo ? slot[k] : lo, hi = slot[k] > hi ? slot[k] : hi;
    for (int t = lo; t <= hi + 6 * (m - 1); t++)
        for (int k = 0; k < 6; k++)
            if (t >= slot[k] && (t - slot[k]) % 6 == 0 && (t - slot[k]) / 6 < m) v_put(o, k / 2, k % 2);
}

/* dualpipe-v (DeepSeek-V3's DualPipe folded into a V): the position at r of P runs 2 (P - r - 1)
 * forwards of chunk 0; r + 1 pairs F0 F1; P - r - 1 rounds of BI1 (its BW deferred), the oldest
 * deferred BW, F1; then m - 2 P + r + 1 rounds of the overlapped pairs (F0 with B1, F1 with B0); P - r - 1
 * rounds of B1 and the pair (F1, B0); r + 1 rounds B1 B0, whose second half defers its BWs (from round
 * floor((r + 1) / 2) on: from B1 when r is odd, from B0 when even); P - r - 1 rounds of the oldest
 * deferred BW and B0 (deferring its BW); then the r + 1 deferred BWs left. A B that defers nothing is
 * BI with its BW at once (the whole backward). In a pair, the forward's send proceeds while the
 * backward computes (sends are asynchronous), which is the overlap a CPU has. Needs m >= 2 P. */
typedef struct VQueue {
    int *c, *l;         /* deferred BWs in the order deferred (2 m entries at most) */
    int head, n;        /* the oldest still pending, entries so far */
} VQueue;

static void dpv_b(VOrder *o, VQueue *q, int c, int defer) {
    int l = o->b[c];
    v_put(o, VB, c);
    if (!defer) {
        v_put(o, VW, c);
        return;
    }
    q->c[q->n] = c, q->l[q->n++] = l;
}

static void dpv_w(VOrder *o, VQueue *q) {
    PD_ASSERT(q->head < q->n);
    int c = q->c[q->head];
    PD_ASSERT(q->l[q->head] == o->w[c]);   /* each chunk's BWs stay in unit order */
    q->head++;
    v_put(o, VW, c);
}

static void v_order_dualpipe(VOrder *o, int r, int P, int m) {
    VQueue q = {malloc((size_t)2 * m * sizeof(int)), malloc((size_t)2 * m * sizeof(int)), 0, 0};
    PD_ASSERT(q.c && q.l);
    for (int i = 0; i < 2 * (P - r - 1); i++) v_put(o, VF, 0);
    for (int i = 0; i < r + 1; i++) v_put(o, VF, 0), v_put(o, VF, 1);
    for (int i = 0; i < P - r - 1; i++) dpv_b(o, &q, 1, 1), dpv_w(o, &q), v_put(o, VF, 1);
    for (int i = 0; i < m - 2 * P + r + 1; i++) {
        v_put(o, VF, 0), dpv_b(o, &q, 1, 0);
        v_put(o, VF, 1), dpv_b(o, &q, 0, 0);
    }
    for (int i = 0; i < P - r - 1; i++) dpv_b(o, &q, 1, 0), v_put(o, VF, 1), dpv_b(o, &q, 0, 0);
    int zb = 0;
    for (int i = 0; i < r + 1; i++) {
        if (i == (r + 1) / 2 && r % 2 == 1) zb = 1;
        dpv_b(o, &q, 1, zb);
        if (i == (r + 1) / 2 && r % 2 == 0) zb = 1;
        dpv_b(o, &q, 0, zb);
    }
    for (int i = 0; i < P - r - 1; i++) dpv_w(o, &q), dpv_b(o, &q, 0, 1);
    while (q.head < q.n) dpv_w(o, &q);
    free(q.c), free(q.l);
}

static int gen_v(Gen *g, int rank) {
    Schedule *s = g->s;
    SchedWorker *w = &s->workers[rank];
    int P = s->n_stages / 2, r = w->stage, d = s->stages[r].replicas, m = s->n_micro / d;
    VOrder o = {pd_alloc((size_t)6 * m * sizeof(VOp)), 0, {0, 0}, {0, 0}, {0, 0}};
    switch (s->kind) {
    case SCHED_ZB_V: v_order_zbv(&o, r, P, m); break;
    case SCHED_V_HALF:
    case SCHED_V_MIN: v_order_block(&o, s->kind, r, P, m); break;
    case SCHED_DUALPIPE_V: v_order_dualpipe(&o, r, P, m); break;
    default: PD_ASSERT(0);
    }
    PD_ASSERTF(o.n == 6 * m, "%s: position %d orders %d computes, not %d", KIND_NAMES[s->kind], r, o.n, 6 * m);
    for (int c = 0; c < 2; c++) PD_ASSERT(o.f[c] == m && o.b[c] == m && o.w[c] == m);
    for (int k = 0; k < s->n_minibatches; k++) {
        for (int i = 0; i < o.n; i++) {
            const VOp *x = &o.ops[i];
            int u = k * s->n_micro + x->l * d + w->replica;
            if (x->op == VF) emit_forward_c(s, w, u, k, x->c);
            else if (x->op == VB) emit_backward_c(s, w, u, k, x->c, 1);
            else push_c(w, OP_BACKWARD_W, u, -1, k, x->c);
        }
        for (int c = 0; c < 2; c++)
            if (s->stages[w->stages[c]].replicas > 1) push_c(w, OP_ALLREDUCE, -1, w->stages[c], k + 1, c);
        push(w, OP_STEP, -1, -1, k + 1);
        push(w, OP_FLUSH, -1, -1, -1);
    }
    pd_free(o.ops);
    return PD_OK;
}

void sched_release(Schedule *s) {
    if (!s) return;
    for (int i = 0; i < s->n_stages && s->stages; i++) {
        free(s->stages[i].layers);
        free(s->stages[i].ranks);
    }
    free(s->stages);
    for (int r = 0; r < s->n_ranks && s->workers; r++) pd_free(s->workers[r].ins), free(s->workers[r].stages);
    free(s->workers);
    memset(s, 0, sizeof *s);
}

/* interleaved: the plan's stages must form V >= 2 rounds over p pipeline positions, stage i
 * on the ranks of stage i mod p (what `pipedream plan --chunks V` writes). Every stage has the
 * same d >= 1 replicas: replica j of every stage is pipeline j, a whole interleaved pipeline that
 * runs the units u with u mod d = j. Each worker gets its stages in ascending order as chunks
 * 0..V-1, and M must be a multiple of the p d workers (each pipeline a multiple of p). */
static int interleave_workers(Schedule *s, Err *err) {
    int S = s->n_stages, P = 0, d = s->stages[0].replicas;
    for (int i = 0; i < S; i++)
        if (s->stages[i].replicas != d)
            return err_set(err, PD_EINVAL, "schedule interleaved: stage %d has %d replicas but stage 0 has %d; "
                           "interleaved replicates whole pipelines, every stage alike", i, s->stages[i].replicas, d);
    for (int i = 0; i < S; i++) {
        if (s->workers[s->stages[i].ranks[0]].stage >= 0) break;
        for (int j = 0; j < d; j++) {
            SchedWorker *w = &s->workers[s->stages[i].ranks[j]];
            if (w->stage >= 0)
                return err_set(err, PD_EINVAL, "schedule interleaved: rank %d is replica %d of stage %d and holds "
                               "stage %d already", s->stages[i].ranks[j], j, i, w->stage);
            w->stage = i;   /* the first round: stage i is position i */
            w->replica = j;
        }
        P++;
    }
    if (P < 2)
        return err_set(err, PD_EINVAL, "schedule interleaved: every stage is on rank %d; it needs at least 2 workers",
                       s->stages[0].ranks[0]);
    int V = S / P;
    if (V < 2 || V * P != S)
        return err_set(err, PD_EINVAL, "schedule interleaved: the plan has %d stages on %d workers; it needs V >= 2 "
                       "stages per worker, placed round-robin (pipedream plan --chunks V, or simulate --chunks V)", S, P);
    for (int i = P; i < S; i++)
        for (int j = 0; j < d; j++)
            if (s->stages[i].ranks[j] != s->stages[i % P].ranks[j])
                return err_set(err, PD_EINVAL, "schedule interleaved: replica %d of stage %d is on rank %d, but "
                               "round-robin placement puts it on rank %d (replica %d of stage %d)", j, i,
                               s->stages[i].ranks[j], s->stages[i % P].ranks[j], j, i % P);
    if (s->n_micro % (P * d))
        return err_set(err, PD_EINVAL, "schedule interleaved: %d micro-batches per minibatch is not a multiple of the "
                       "%d workers", s->n_micro, P * d);
    s->n_chunks = V;
    for (int i = 0; i < P; i++)
        for (int j = 0; j < d; j++) {
            SchedWorker *w = &s->workers[s->stages[i].ranks[j]];
            w->n_chunks = V;
            w->stages = malloc((size_t)V * sizeof(int));
            PD_ASSERT(w->stages);
            for (int c = 0; c < V; c++) w->stages[c] = i + c * P;
        }
    return PD_OK;
}

/* The V kinds: the plan's 2 P stages in the V placement (what `pipedream plan --v-shape` writes):
 * replica j of stage i and of stage 2 P - 1 - i on one rank, every stage with the same d >= 1
 * replicas (replica j of every stage is pipeline j). Each worker gets stages i and 2 P - 1 - i as
 * chunks 0 and 1; M must be a multiple of d, and each pipeline's m = M / d at least P for zb-v and
 * 2 P for dualpipe-v. */
static int v_workers(Schedule *s, Err *err) {
    const char *kn = KIND_NAMES[s->kind];
    int S = s->n_stages, P = S / 2, d = s->stages[0].replicas;
    if (S % 2 || P < 2)
        return err_set(err, PD_EINVAL, "schedule %s: the plan has %d stages; it needs 2 P stages on P >= 2 workers in "
                       "the V placement (pipedream plan --v-shape)", kn, S);
    for (int i = 0; i < S; i++)
        if (s->stages[i].replicas != d)
            return err_set(err, PD_EINVAL, "schedule %s: stage %d has %d replicas but stage 0 has %d; the V replicates "
                           "whole pipelines, every stage alike", kn, i, s->stages[i].replicas, d);
    for (int i = 0; i < P; i++)
        for (int j = 0; j < d; j++) {
            int a = s->stages[i].ranks[j], b = s->stages[2 * P - 1 - i].ranks[j];
            if (a != b)
                return err_set(err, PD_EINVAL, "schedule %s: replica %d of stage %d is on rank %d but of stage %d on "
                               "rank %d; the V placement puts both on one rank (pipedream plan --v-shape)", kn, j, i, a,
                               2 * P - 1 - i, b);
            SchedWorker *w = &s->workers[a];
            if (w->stage >= 0)
                return err_set(err, PD_EINVAL, "schedule %s: rank %d holds stages %d and %d", kn, a, w->stage, i);
            w->stage = i;
            w->replica = j;
            w->n_chunks = 2;
            w->stages = malloc(2 * sizeof(int));
            PD_ASSERT(w->stages);
            w->stages[0] = sched_v_stage(i, 0, P), w->stages[1] = sched_v_stage(i, 1, P);
        }
    int m = s->n_micro / d, need = s->kind == SCHED_ZB_V ? P : s->kind == SCHED_DUALPIPE_V ? 2 * P : 1;
    if (s->n_micro % d)
        return err_set(err, PD_EINVAL, "schedule %s: %d micro-batches per minibatch do not split over %d pipelines", kn,
                       s->n_micro, d);
    if (m < need)
        return err_set(err, PD_EINVAL, "schedule %s: %d micro-batches per minibatch%s; it needs at least %d (%s the %d "
                       "workers of a pipeline)", kn, s->n_micro, d > 1 ? " over the pipelines" : "", need * d,
                       need == P ? "one per each of" : "two per each of", P);
    s->n_chunks = 2;
    return PD_OK;
}

static int check_opts(const Plan *p, const SchedOpts *o, Err *err) {
    if (o->kind < 0 || o->kind >= SCHED_COUNT) return err_set(err, PD_EINVAL, "schedule: unknown kind %d", (int)o->kind);
    const char *kn = KIND_NAMES[o->kind];
    if (o->n_minibatches < 1) return err_set(err, PD_EINVAL, "schedule %s: need at least 1 minibatch", kn);
    if (o->n_micro < 1) return err_set(err, PD_EINVAL, "schedule %s: need at least 1 micro-batch", kn);
    if (o->n_micro > 1 && !sched_kind_takes_micro(o->kind))
        return err_set(err, PD_EINVAL, "schedule %s: micro-batches apply only to 1f1b, gpipe, 1f1b-flush, 2bw, zb-h1, "
                       "zb-h2, interleaved and the V kinds", kn);
    if (o->vertical_sync && o->kind != SCHED_1F1B)
        return err_set(err, PD_EINVAL, "schedule %s: vertical sync applies only to 1f1b", kn);
    if (o->vertical_sync && o->n_micro > 1)
        return err_set(err, PD_EINVAL, "schedule 1f1b: vertical sync runs one unit per minibatch, not %d micro-batches",
                       o->n_micro);
    if (o->recompute && o->kind == SCHED_ASP) return err_set(err, PD_EINVAL, "schedule asp: no recomputation");
    if (o->inflight < 0 || o->inflight > (1 << 20))
        return err_set(err, PD_EINVAL, "schedule %s: in-flight depth %d out of range", kn, o->inflight);
    if (o->inflight && o->kind != SCHED_1F1B)
        return err_set(err, PD_EINVAL, "schedule %s: an in-flight depth applies only to 1f1b", kn);
    if (o->inflight && o->vertical_sync)
        return err_set(err, PD_EINVAL, "schedule 1f1b: vertical sync keeps NOAM units in flight, not a depth of %d",
                       o->inflight);
    if ((long)o->n_minibatches * o->n_micro > (1L << 30))
        return err_set(err, PD_EINVAL, "schedule %s: %d x %d units is too many", kn, o->n_minibatches, o->n_micro);
    if (p->n_stages < 1) return err_set(err, PD_EINVAL, "schedule: plan has no stages");
    for (int i = 0; i < p->n_stages; i++)
        if (p->stages[i].replicas < 1 || !p->stages[i].ranks)
            return err_set(err, PD_EINVAL, "schedule: plan stage %d has no replicas", i);
    return PD_OK;
}

int sched_build(const Plan *p, const SchedOpts *o, Schedule *out, Err *err) {
    memset(out, 0, sizeof *out);
    int rc = check_opts(p, o, err);
    if (rc) return rc;
    Schedule *s = out;
    s->kind = o->kind;
    s->n_minibatches = o->n_minibatches;
    s->n_micro = o->n_micro;
    s->n_units = o->n_minibatches * o->n_micro;
    s->vertical_sync = o->vertical_sync;

    /* Stage table: the plan's, or for dp (and asp) one stage with every layer and every rank. */
    int max_rank = -1, n_ranks_total = 0;
    for (int i = 0; i < p->n_stages; i++)
        for (int j = 0; j < p->stages[i].replicas; j++) {
            int r = p->stages[i].ranks[j];
            if (r < 0 || r >= (1 << 20)) return err_set(err, PD_EINVAL, "schedule: plan stage %d has rank %d out of range", i, r);
            if (r > max_rank) max_rank = r;
            n_ranks_total++;
        }
    s->n_ranks = max_rank + 1;
    int whole = o->kind == SCHED_DP || o->kind == SCHED_ASP;   /* every rank a full replica */
    s->n_stages = whole ? 1 : p->n_stages;
    s->stages = calloc((size_t)s->n_stages, sizeof *s->stages);
    s->workers = calloc((size_t)s->n_ranks, sizeof *s->workers);
    PD_ASSERT(s->stages && s->workers);
    for (int r = 0; r < s->n_ranks; r++) s->workers[r].stage = -1;
    if (whole) {
        SchedStage *st = &s->stages[0];
        int nl = 0;
        for (int i = 0; i < p->n_stages; i++) nl += p->stages[i].n_layers;
        st->n_layers = nl;
        st->layers = malloc(((size_t)nl + 1) * sizeof(int));
        st->ranks = malloc((size_t)n_ranks_total * sizeof(int));
        PD_ASSERT(st->layers && st->ranks);
        nl = 0;
        for (int i = 0; i < p->n_stages; i++)
            for (int l = 0; l < p->stages[i].n_layers; l++) st->layers[nl++] = p->stages[i].layers[l];
        /* every rank of the plan, ascending */
        char *seen = calloc((size_t)s->n_ranks, 1);
        PD_ASSERT(seen);
        for (int i = 0; i < p->n_stages; i++)
            for (int j = 0; j < p->stages[i].replicas; j++) seen[p->stages[i].ranks[j]]++;
        for (int r = 0; r < s->n_ranks; r++)
            if (seen[r]) st->ranks[st->replicas++] = r;
        int dup = st->replicas != n_ranks_total;
        free(seen);
        if (dup) {
            sched_release(s);
            return err_set(err, PD_EINVAL, "schedule: plan lists a rank in more than one place");
        }
    } else {
        for (int i = 0; i < p->n_stages; i++) {
            SchedStage *st = &s->stages[i];
            const PlanStage *ps = &p->stages[i];
            st->n_layers = ps->n_layers;
            st->layers = malloc(((size_t)ps->n_layers + 1) * sizeof(int));
            st->ranks = malloc((size_t)ps->replicas * sizeof(int));
            PD_ASSERT(st->layers && st->ranks);
            if (ps->n_layers) memcpy(st->layers, ps->layers, (size_t)ps->n_layers * sizeof(int));
            memcpy(st->ranks, ps->ranks, (size_t)ps->replicas * sizeof(int));
            st->replicas = ps->replicas;
        }
    }
    s->n_chunks = 1;
    s->recompute = o->recompute;
    if (o->kind == SCHED_INTERLEAVED || sched_kind_v(o->kind)) {
        if ((rc = o->kind == SCHED_INTERLEAVED ? interleave_workers(s, err) : v_workers(s, err))) {
            sched_release(s);
            return rc;
        }
    } else
        for (int i = 0; i < s->n_stages; i++)
            for (int j = 0; j < s->stages[i].replicas; j++) {
                SchedWorker *w = &s->workers[s->stages[i].ranks[j]];
                if (w->stage >= 0) {
                    int r = s->stages[i].ranks[j], was = w->stage;
                    sched_release(s);
                    if (was != i)
                        return err_set(err, PD_EINVAL, "schedule %s: rank %d runs stages %d and %d; a plan with several "
                                       "stages per worker runs only under interleaved or a V kind", KIND_NAMES[o->kind],
                                       r, was, i);
                    return err_set(err, PD_EINVAL, "schedule: rank %d appears in more than one stage or twice", r);
                }
                w->stage = i;
                w->replica = j;
                w->n_chunks = 1;
                w->stages = malloc(sizeof(int));
                PD_ASSERT(w->stages);
                w->stages[0] = i;
            }
    /* Model parallel uses replica 0 of each stage only: the others stay idle. */
    if (o->kind == SCHED_MP)
        for (int i = 0; i < s->n_stages; i++) {
            for (int j = 1; j < s->stages[i].replicas; j++) {
                SchedWorker *w = &s->workers[s->stages[i].ranks[j]];
                w->stage = -1;
                w->n_chunks = 0;
                free(w->stages);
                w->stages = NULL;
            }
            s->stages[i].replicas = 1;
        }
    /* Warm-up: ceil(workers from this stage on / replicas of this stage); NOAM at stage 0. */
    int later = 0;
    for (int i = s->n_stages - 1; i >= 0; i--) {
        int r = s->stages[i].replicas;
        later += r;
        s->stages[i].warmup = o->kind == SCHED_MP || whole ? 1 : (later + r - 1) / r;
    }
    /* A deeper 1f1b (SchedOpts.inflight): the same number more per boundary after a stage. */
    if (o->kind == SCHED_1F1B && o->inflight > 1 && s->n_stages > 1) {
        long S1 = s->n_stages - 1;
        for (int i = 0; i < s->n_stages; i++) {
            int w = 1 + (int)(((long)(o->inflight - 1) * (S1 - i) + S1 - 1) / S1);
            if (w > s->stages[i].warmup) s->stages[i].warmup = w;
        }
    }
    if (o->kind == SCHED_INTERLEAVED) {   /* the forwards before the first backward (gen_interleaved) */
        int P = s->n_stages / s->n_chunks, m = s->n_micro / s->stages[0].replicas;
        for (int i = 0; i < s->n_stages; i++) s->stages[i].warmup = sched_interleaved_warmup(P, s->n_chunks, i % P, m);
    }

    Gen g = {s, malloc((size_t)s->n_units * sizeof(int)), malloc((size_t)s->n_units * sizeof(int)), err};
    PD_ASSERT(g.units && g.version);
    rc = PD_OK;
    for (int r = 0; r < s->n_ranks && !rc; r++) {
        if (s->workers[r].stage < 0) continue;
        switch (s->kind) {
        case SCHED_1F1B: rc = s->n_micro > 1 ? gen_minibatch_steps(&g, r) : gen_rounds(&g, r); break;
        case SCHED_DP:
        case SCHED_MP: rc = gen_rounds(&g, r); break;
        case SCHED_GPIPE:
        case SCHED_1F1B_FLUSH: rc = gen_flush(&g, r); break;
        case SCHED_2BW: rc = gen_minibatch_steps(&g, r); break;
        case SCHED_ASP: gen_asp(&g, r); break;
        case SCHED_ZB_H1:
        case SCHED_ZB_H2: rc = gen_zb(&g, r); break;
        case SCHED_INTERLEAVED: rc = gen_interleaved(&g, r); break;
        case SCHED_ZB_V:
        case SCHED_V_HALF:
        case SCHED_V_MIN:
        case SCHED_DUALPIPE_V: rc = gen_v(&g, r); break;
        default: PD_ASSERT(0);
        }
    }
    free(g.units);
    free(g.version);
    if (rc) sched_release(s);
    return rc;
}

/* ---- text ------------------------------------------------------------------------- */

char *sched_instr_str(const Instr *in, int with_version, char *buf, size_t n) {
    char ch[16] = "";
    if (in->chunk) snprintf(ch, sizeof ch, ".%d", in->chunk);
    switch (in->op) {
    case OP_FORWARD:
    case OP_BACKWARD:
    case OP_BACKWARD_B:
    case OP_BACKWARD_W:
    case OP_RECOMPUTE:
        if (with_version) snprintf(buf, n, "%s%d%s@%d", OP_NAMES[in->op], in->mb, ch, in->version);
        else snprintf(buf, n, "%s%d%s", OP_NAMES[in->op], in->mb, ch);
        break;
    case OP_SEND_ACT:
    case OP_SEND_GRAD: snprintf(buf, n, "%s%d%s>%d", OP_NAMES[in->op], in->mb, ch, in->peer); break;
    case OP_RECV_ACT:
    case OP_RECV_GRAD: snprintf(buf, n, "%s%d%s<%d", OP_NAMES[in->op], in->mb, ch, in->peer); break;
    case OP_ALLREDUCE: snprintf(buf, n, "AR(s%d)", in->peer); break;
    case OP_STEP: snprintf(buf, n, "U%d", in->version); break;
    case OP_FLUSH: snprintf(buf, n, "FLUSH"); break;
    default: PD_ASSERTF(0, "op %d", in->op);
    }
    return buf;
}

static void worker_line(const Schedule *s, int rank, int compute_only, int with_versions, char *buf, size_t n) {
    const SchedWorker *w = &s->workers[rank];
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < w->n && k + 1 < n; i++) {
        const Instr *in = &w->ins[i];
        if (compute_only && !sched_op_computes(in->op)) continue;
        char t[48];
        sched_instr_str(in, with_versions, t, sizeof t);
        int m = snprintf(buf + k, n - k, "%s%s", k ? " " : "", t);
        if (m < 0) break;
        k += (size_t)m;
    }
    if (k >= n) buf[n - 1] = 0;
}

char *sched_worker_str(const Schedule *s, int rank, char *buf, size_t n) {
    PD_ASSERT(rank >= 0 && rank < s->n_ranks && n > 0);
    worker_line(s, rank, 1, 0, buf, n);
    return buf;
}

void sched_dump(const Schedule *s, FILE *f, int compute_only, int with_versions) {
    for (int r = 0; r < s->n_ranks; r++) {
        const SchedWorker *w = &s->workers[r];
        fprintf(f, "w%d s%d", r, w->stage);
        for (int c = 1; c < w->n_chunks && w->stages; c++) fprintf(f, ",%d", w->stages[c]);
        fputc(':', f);
        for (int i = 0; i < w->n; i++) {
            const Instr *in = &w->ins[i];
            if (compute_only && !sched_op_computes(in->op)) continue;
            char t[48];
            fprintf(f, " %s", sched_instr_str(in, with_versions, t, sizeof t));
        }
        fputc('\n', f);
    }
}

/* ---- analysis --------------------------------------------------------------------- */

void sched_worker_info_release(SchedWorkerInfo *wi) {
    if (!wi) return;
    free(wi->last_read);
    free(wi->delay);
    memset(wi, 0, sizeof *wi);
}

/* A recomputing schedule's forward at i whose unit's backward (B or BI, same chunk) is the
 * next compute instruction: the unit keeps its activations from the forward on (there is no
 * OP_RECOMPUTE for it; emit_backward_c). */
static int keeps_from_forward(const SchedWorker *w, int i) {
    const Instr *f = &w->ins[i];
    for (int j = i + 1; j < w->n; j++) {
        const Instr *in = &w->ins[j];
        if (sched_op_computes(in->op))
            return (in->op == OP_BACKWARD || in->op == OP_BACKWARD_B) && in->mb == f->mb && in->chunk == f->chunk;
    }
    return 0;
}

/* One pass over the list under the rule of SchedWorkerInfo: `stashed` counts the versions
 * older than the newest that a later instruction still reads; a version leaves that count
 * after its last reader. Units in flight and with full activations are counted per chunk
 * (fly[c], full[c]). Fills the per-instruction counts if asked (alive: n entries; inflight,
 * full: n x nc, per chunk) and the maxima. */
static void walk(const Schedule *s, const SchedWorker *w, SchedWorkerInfo *wi, int *alive, int *inflight, int *full) {
    int newest = 0, stashed = 0, fly_all = 0, full_all = 0, nc = w->n_chunks > 0 ? w->n_chunks : 1;
    int *fly = calloc((size_t)nc, sizeof(int)), *fl = calloc((size_t)nc, sizeof(int));
    PD_ASSERT(fly && fl);
    wi->max_versions_alive = 1;
    wi->peak_at = -1;
    wi->max_inflight = 0;
    wi->max_full = 0;
    for (int i = 0; i < w->n; i++) {
        const Instr *in = &w->ins[i];
        int c = in->chunk, transient = 0;
        if (in->op == OP_STEP) {
            if (wi->last_read[newest] > i) stashed++;
            newest++;
        } else if (in->op == OP_FORWARD) {
            fly[c]++, fly_all++;
            if (!s->recompute || keeps_from_forward(w, i)) fl[c]++, full_all++;
            else transient = 1;   /* the forward builds them, keeps only the input */
        } else if (in->op == OP_RECOMPUTE)
            fl[c]++, full_all++;
        int a = 1 + stashed;
        if (alive) alive[i] = a;
        if (inflight) memcpy(inflight + (size_t)i * nc, fly, (size_t)nc * sizeof(int));
        if (full) {
            memcpy(full + (size_t)i * nc, fl, (size_t)nc * sizeof(int));
            full[(size_t)i * nc + c] += transient;
        }
        if (a > wi->max_versions_alive || wi->peak_at < 0) wi->max_versions_alive = a, wi->peak_at = i;
        if (fly_all > wi->max_inflight) wi->max_inflight = fly_all;
        if (full_all + transient > wi->max_full) wi->max_full = full_all + transient;
        if (sched_op_computes(in->op)) {
            if (in->op == OP_BACKWARD || in->op == OP_BACKWARD_W) fly[c]--, fly_all--, fl[c]--, full_all--;
            if (wi->last_read[in->version] == i && in->version < newest) stashed--;
        }
    }
    free(fly), free(fl);
}

static int is_last_backward(int op, int split) { return op == (split ? OP_BACKWARD_W : OP_BACKWARD); }

/* The delay of every unit (SchedWorkerInfo.delay) and the predicted-weight buffers: a pass from
 * the end finds the step after each unit's last backward op; a pass from the start gives every
 * compute instruction its unit's delay and counts the keys (chunk, version, delay, steps done at
 * the forward) that units in flight hold: a runtime predicts once per key. */
static void delays(const Schedule *s, const SchedWorker *w, SchedWorkerInfo *wi) {
    int nc = wi->n_chunks, split = sched_splits_backward(s), n_units = s->n_units > 0 ? s->n_units : 1;
    for (int i = 0; i < w->n; i++)
        if (w->ins[i].mb >= n_units) n_units = w->ins[i].mb + 1;
    size_t nu = (size_t)n_units * nc;
    int *by_unit = malloc(nu * sizeof(int)), *key_at = malloc(nu * sizeof(int));
    wi->delay = malloc(((size_t)w->n + 1) * sizeof(int));
    PD_ASSERT(by_unit && key_at && wi->delay);
    for (int i = w->n - 1, next = -1; i >= 0; i--) {
        const Instr *in = &w->ins[i];
        if (in->op == OP_STEP) next = in->version;
        else if (is_last_backward(in->op, split)) by_unit[(size_t)in->mb * nc + in->chunk] = next < 0 ? 0 : next - 1 - in->version;
    }
    enum { KW = 5 };   /* a key: chunk, version, delay, steps done, units holding it */
    int cap = 16, nk = 0, newest = 0, *key = malloc((size_t)cap * KW * sizeof(int));
    PD_ASSERT(key);
    long sum = 0;
    wi->n_units = 0, wi->delay_max = 0, wi->max_predicted = 0;
    for (int i = 0; i < w->n; i++) {
        const Instr *in = &w->ins[i];
        newest += in->op == OP_STEP;
        if (!sched_op_computes(in->op)) {
            wi->delay[i] = -1;
            continue;
        }
        size_t u = (size_t)in->mb * nc + in->chunk;
        int d = wi->delay[i] = by_unit[u];
        if (in->op == OP_FORWARD) {
            wi->n_units++, sum += d;
            if (d > wi->delay_max) wi->delay_max = d;
            key_at[u] = newest;
        }
        if (d <= 0 || (in->op != OP_FORWARD && !is_last_backward(in->op, split))) continue;
        int k = 0;
        while (k < nk && !(key[KW * k] == in->chunk && key[KW * k + 1] == in->version && key[KW * k + 2] == d &&
                           key[KW * k + 3] == key_at[u]))
            k++;
        if (in->op == OP_FORWARD) {
            if (k == nk) {
                if (nk == cap) {
                    key = realloc(key, (size_t)(cap *= 2) * KW * sizeof(int));
                    PD_ASSERT(key);
                }
                int *e = key + KW * k;
                e[0] = in->chunk, e[1] = in->version, e[2] = d, e[3] = newest, e[4] = 0, nk++;
            }
            key[KW * k + 4]++;
            int here = 0;
            for (int j = 0; j < nk; j++) here += key[KW * j] == in->chunk;
            if (here > wi->max_predicted) wi->max_predicted = here;
        } else {
            PD_ASSERT(k < nk);
            if (--key[KW * k + 4] == 0) {
                memmove(key + KW * k, key + KW * (k + 1), (size_t)(nk - k - 1) * KW * sizeof(int));
                nk--;
            }
        }
    }
    wi->delay_mean = wi->n_units ? (double)sum / wi->n_units : 0.0;
    free(key);
    free(key_at);
    free(by_unit);
}

int sched_analyze_worker(const Schedule *s, int rank, SchedWorkerInfo *out, Err *err) {
    PD_ASSERT(rank >= 0 && rank < s->n_ranks);
    memset(out, 0, sizeof *out);
    const SchedWorker *w = &s->workers[rank];
    out->stage = w->stage;
    if (w->stage < 0) return PD_OK;
    out->reads_input = w->stage == 0;
    out->n_chunks = w->n_chunks > 0 ? w->n_chunks : 1;
    int steps = 0;
    for (int i = 0; i < w->n; i++) steps += w->ins[i].op == OP_STEP;
    out->n_versions = steps + 1;
    out->last_read = malloc((size_t)out->n_versions * sizeof(int));
    PD_ASSERT(out->last_read);
    for (int v = 0; v < out->n_versions; v++) out->last_read[v] = -1;
    for (int i = 0, newest = 0; i < w->n; i++) {
        const Instr *in = &w->ins[i];
        char t[48];
        if (in->chunk < 0 || in->chunk >= out->n_chunks) {
            sched_worker_info_release(out);
            return err_set(err, PD_EINVAL, "worker %d instruction %d (%s): chunk %d but the worker has %d", rank, i,
                           sched_instr_str(in, 1, t, sizeof t), in->chunk, w->n_chunks);
        }
        if (in->op == OP_STEP) {
            if (in->version != newest + 1) {
                sched_worker_info_release(out);
                return err_set(err, PD_EINVAL, "worker %d instruction %d (%s): step writes version %d after version %d",
                               rank, i, sched_instr_str(in, 1, t, sizeof t), in->version, newest);
            }
            newest++;
        } else if (sched_op_computes(in->op)) {
            if (in->version < 0 || in->version > newest) {
                sched_worker_info_release(out);
                return err_set(err, PD_EINVAL, "worker %d instruction %d (%s): reads weight version %d but has %d",
                               rank, i, sched_instr_str(in, 1, t, sizeof t), in->version, newest);
            }
            out->last_read[in->version] = i;
        }
    }
    walk(s, w, out, NULL, NULL, NULL);
    out->n_slots = out->max_inflight + SCHED_SLOTS_AHEAD;
    delays(s, w, out);
    return PD_OK;
}

void sched_worker_counts_chunks(const Schedule *s, int rank, const SchedWorkerInfo *wi, int *alive, int *inflight,
                                int *full) {
    PD_ASSERT(rank >= 0 && rank < s->n_ranks);
    const SchedWorker *w = &s->workers[rank];
    if (w->stage < 0) return;
    PD_ASSERT(wi->stage == w->stage && wi->last_read);
    SchedWorkerInfo tmp = *wi;   /* walk() rewrites the maxima: the same values */
    walk(s, w, &tmp, alive, inflight, full);
}

void sched_worker_counts(const Schedule *s, int rank, const SchedWorkerInfo *wi, int *alive, int *inflight) {
    PD_ASSERT(rank >= 0 && rank < s->n_ranks);
    const SchedWorker *w = &s->workers[rank];
    if (w->stage < 0) return;
    int nc = wi->n_chunks > 0 ? wi->n_chunks : 1;
    int *per = inflight && nc > 1 ? malloc(((size_t)w->n * nc + 1) * sizeof(int)) : NULL;
    sched_worker_counts_chunks(s, rank, wi, alive, nc > 1 ? per : inflight, NULL);
    if (per) {
        for (int i = 0; i < w->n; i++) {
            int t = 0;
            for (int c = 0; c < nc; c++) t += per[(size_t)i * nc + c];
            inflight[i] = t;
        }
        free(per);
    }
}

void sched_analysis_release(SchedAnalysis *a) {
    if (!a) return;
    for (int r = 0; r < a->n_ranks && a->workers; r++) sched_worker_info_release(&a->workers[r]);
    free(a->workers);
    free(a->stage_versions);
    memset(a, 0, sizeof *a);
}

int sched_analyze(const Schedule *s, SchedAnalysis *out, Err *err) {
    memset(out, 0, sizeof *out);
    out->n_ranks = s->n_ranks;
    out->n_stages = s->n_stages;
    out->workers = calloc((size_t)s->n_ranks + 1, sizeof *out->workers);
    out->stage_versions = calloc((size_t)s->n_stages + 1, sizeof(int));
    PD_ASSERT(out->workers && out->stage_versions);
    for (int r = 0; r < s->n_ranks; r++) {
        int rc = sched_analyze_worker(s, r, &out->workers[r], err);
        if (rc) {
            sched_analysis_release(out);
            return rc;
        }
        const SchedWorker *w = &s->workers[r];
        for (int c = 0; c < (w->n_chunks > 0 ? w->n_chunks : 1); c++) {   /* every stage the worker runs */
            int st = w->stages ? w->stages[c] : w->stage;
            if (st >= 0 && st < s->n_stages && out->workers[r].max_versions_alive > out->stage_versions[st])
                out->stage_versions[st] = out->workers[r].max_versions_alive;
        }
    }
    return PD_OK;
}
