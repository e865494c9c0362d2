/* schedule.c: the schedule generators (plan + kind + counts -> per-worker instruction
 * lists) and the text dump. Every generator is built from two orders: 1F1B over a
 * worker's own units (warm-up forwards, then backward/forward alternation, then the
 * remaining backwards) and GPipe's all-forwards-then-all-backwards; kinds differ in which
 * units a worker owns, where the all-reduce + step go and which weight version each
 * forward reads. It does not check for deadlock (the simulator does) and times nothing. */
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

static const char *const KIND_NAMES[] = {"1f1b", "gpipe", "1f1b-flush", "2bw", "dp", "model-parallel"};
_Static_assert(sizeof KIND_NAMES / sizeof KIND_NAMES[0] == SCHED_COUNT, "kind names");
static const char *const OP_NAMES[] = {"F", "B", "SA", "RA", "SG", "RG", "AR", "STEP", "FLUSH"};
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

/* ---- building --------------------------------------------------------------------- */

static void push(SchedWorker *w, int op, int mb, int peer, int version) {
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        Instr *ni = pd_alloc((size_t)w->cap * sizeof *ni);
        if (w->n) memcpy(ni, w->ins, (size_t)w->n * sizeof *ni);
        pd_free(w->ins);
        w->ins = ni;
    }
    w->ins[w->n++] = (Instr){op, mb, peer, version};
}

static int rank_of(const Schedule *s, int st, int u) { return s->stages[st].ranks[sched_replica_of(s, st, u)]; }

static void emit_forward(const Schedule *s, SchedWorker *w, int u, int version) {
    int st = w->stage;
    if (st > 0) push(w, OP_RECV_ACT, u, rank_of(s, st - 1, u), -1);
    push(w, OP_FORWARD, u, -1, version);
    if (st < s->n_stages - 1) push(w, OP_SEND_ACT, u, rank_of(s, st + 1, u), -1);
}

static void emit_backward(const Schedule *s, SchedWorker *w, int u, int version) {
    int st = w->stage;
    if (st < s->n_stages - 1) push(w, OP_RECV_GRAD, u, rank_of(s, st + 1, u), -1);
    push(w, OP_BACKWARD, u, -1, version);
    if (st > 0) push(w, OP_SEND_GRAD, u, rank_of(s, st - 1, u), -1);
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
        if (rank_of(g->s, w->stage, u) == rank) g->units[n++] = u;
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
             * in, mapped to this stage's rounds (docs/schedules.md). */
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

/* Emits the forward of own unit i under 2bw's rule, failing if its version does not
 * exist yet (too few micro-batches per minibatch for the pipeline depth). */
static int fwd_2bw(Gen *g, int rank, int i, int steps) {
    Schedule *s = g->s;
    SchedWorker *w = &s->workers[rank];
    int u = g->units[i], k = u / s->n_micro, v = k > 0 ? k - 1 : 0;
    if (steps < v)
        return err_set(g->err, PD_EINVAL,
                       "2bw: stage %d rank %d needs version %d for micro-batch %d but has only %d; "
                       "use at least %d micro-batches per minibatch",
                       w->stage, rank, v, u, steps, s->stages[w->stage].warmup);
    g->version[i] = v;
    emit_forward(s, w, u, v);
    return PD_OK;
}

/* 2bw: 1F1B over all the worker's micro-batches without flushes; after its last
 * backward of minibatch k the stage all-reduces and steps to version k + 1. Every
 * micro-batch of minibatch k reads version max(k - 1, 0) (one step of delay, so at most
 * two versions are alive: W(k+1) = W(k) - lr * grad(W(k-1))). */
static int gen_2bw(Gen *g, int rank) {
    Schedule *s = g->s;
    SchedWorker *w = &s->workers[rank];
    const SchedStage *st = &s->stages[w->stage];
    int n = own_units(g, w, rank, 0, s->n_units);
    int k = st->warmup < n ? st->warmup : n;
    int steps = 0;   /* steps emitted so far = newest version */
    int nf = 0, nb = 0, rc;
    while (nf < k)
        if ((rc = fwd_2bw(g, rank, nf++, steps))) return rc;
    while (nb < n) {
        int u = g->units[nb], mbk = u / s->n_micro;
        while (steps < mbk) emit_sync(s, w, ++steps);   /* minibatches with none of ours */
        emit_backward(s, w, u, g->version[nb]);
        nb++;
        int next = nb < n ? g->units[nb] / s->n_micro : s->n_minibatches;
        while (steps < next) emit_sync(s, w, ++steps);
        if (nf < n && (rc = fwd_2bw(g, rank, nf++, steps))) return rc;
    }
    while (steps < s->n_minibatches) emit_sync(s, w, ++steps);
    return PD_OK;
}

void sched_release(Schedule *s) {
    if (!s) return;
    for (int i = 0; i < s->n_stages && s->stages; i++) {
        free(s->stages[i].layers);
        free(s->stages[i].ranks);
    }
    free(s->stages);
    for (int r = 0; r < s->n_ranks && s->workers; r++) pd_free(s->workers[r].ins);
    free(s->workers);
    memset(s, 0, sizeof *s);
}

static int check_opts(const Plan *p, const SchedOpts *o, Err *err) {
    if (o->kind < 0 || o->kind >= SCHED_COUNT) return err_set(err, PD_EINVAL, "schedule: unknown kind %d", (int)o->kind);
    const char *kn = KIND_NAMES[o->kind];
    if (o->n_minibatches < 1) return err_set(err, PD_EINVAL, "schedule %s: need at least 1 minibatch", kn);
    if (o->n_micro < 1) return err_set(err, PD_EINVAL, "schedule %s: need at least 1 micro-batch", kn);
    if (o->n_micro > 1 && (o->kind == SCHED_1F1B || o->kind == SCHED_DP || o->kind == SCHED_MP))
        return err_set(err, PD_EINVAL, "schedule %s: micro-batches apply only to gpipe, 1f1b-flush and 2bw", kn);
    if (o->vertical_sync && o->kind != SCHED_1F1B)
        return err_set(err, PD_EINVAL, "schedule %s: vertical sync applies only to 1f1b", kn);
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

    /* Stage table: the plan's, or for dp one stage with every layer and every rank. */
    int max_rank = -1, n_ranks_total = 0;
    for (int i = 0; i < p->n_stages; i++)
        for (int j = 0; j < p->stages[i].replicas; j++) {
            int r = p->stages[i].ranks[j];
            if (r < 0 || r >= (1 << 20)) return err_set(err, PD_EINVAL, "schedule: plan stage %d has rank %d out of range", i, r);
            if (r > max_rank) max_rank = r;
            n_ranks_total++;
        }
    s->n_ranks = max_rank + 1;
    s->n_stages = o->kind == SCHED_DP ? 1 : p->n_stages;
    s->stages = calloc((size_t)s->n_stages, sizeof *s->stages);
    s->workers = calloc((size_t)s->n_ranks, sizeof *s->workers);
    PD_ASSERT(s->stages && s->workers);
    for (int r = 0; r < s->n_ranks; r++) s->workers[r].stage = -1;
    if (o->kind == SCHED_DP) {
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
    for (int i = 0; i < s->n_stages; i++)
        for (int j = 0; j < s->stages[i].replicas; j++) {
            SchedWorker *w = &s->workers[s->stages[i].ranks[j]];
            if (w->stage >= 0) {
                int r = s->stages[i].ranks[j];
                sched_release(s);
                return err_set(err, PD_EINVAL, "schedule: rank %d appears in more than one stage or twice", r);
            }
            w->stage = i;
            w->replica = j;
        }
    /* Model parallel uses replica 0 of each stage only: the others stay idle. */
    if (o->kind == SCHED_MP)
        for (int i = 0; i < s->n_stages; i++) {
            for (int j = 1; j < s->stages[i].replicas; j++) s->workers[s->stages[i].ranks[j]].stage = -1;
            s->stages[i].replicas = 1;
        }
    /* Warm-up: ceil(workers from this stage on / replicas of this stage); NOAM at stage 0. */
    int later = 0;
    for (int i = s->n_stages - 1; i >= 0; i--) {
        int r = s->stages[i].replicas;
        later += r;
        s->stages[i].warmup = o->kind == SCHED_MP || o->kind == SCHED_DP ? 1 : (later + r - 1) / r;
    }

    Gen g = {s, malloc((size_t)s->n_units * sizeof(int)), malloc((size_t)s->n_units * sizeof(int)), err};
    PD_ASSERT(g.units && g.version);
    rc = PD_OK;
    for (int r = 0; r < s->n_ranks && !rc; r++) {
        if (s->workers[r].stage < 0) continue;
        switch (s->kind) {
        case SCHED_1F1B:
        case SCHED_DP:
        case SCHED_MP: rc = gen_rounds(&g, r); break;
        case SCHED_GPIPE:
        case SCHED_1F1B_FLUSH: rc = gen_flush(&g, r); break;
        case SCHED_2BW: rc = gen_2bw(&g, r); break;
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
    switch (in->op) {
    case OP_FORWARD:
    case OP_BACKWARD:
        if (with_version) snprintf(buf, n, "%s%d@%d", OP_NAMES[in->op], in->mb, in->version);
        else snprintf(buf, n, "%s%d", OP_NAMES[in->op], in->mb);
        break;
    case OP_SEND_ACT:
    case OP_SEND_GRAD: snprintf(buf, n, "%s%d>%d", OP_NAMES[in->op], in->mb, in->peer); break;
    case OP_RECV_ACT:
    case OP_RECV_GRAD: snprintf(buf, n, "%s%d<%d", OP_NAMES[in->op], in->mb, in->peer); break;
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
        if (compute_only && in->op != OP_FORWARD && in->op != OP_BACKWARD) continue;
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
        fprintf(f, "w%d s%d:", r, w->stage);
        for (int i = 0; i < w->n; i++) {
            const Instr *in = &w->ins[i];
            if (compute_only && in->op != OP_FORWARD && in->op != OP_BACKWARD) continue;
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
    memset(wi, 0, sizeof *wi);
}

/* One pass over the list under the rule of SchedWorkerInfo: `stashed` counts the versions
 * older than the newest that a later instruction still reads; a version leaves that count
 * after its last reader. Fills the per-instruction counts if asked and the maxima. */
static void walk(const SchedWorker *w, SchedWorkerInfo *wi, int *alive, int *inflight) {
    int newest = 0, stashed = 0, fly = 0;
    wi->max_versions_alive = 1;
    wi->peak_at = -1;
    wi->max_inflight = 0;
    for (int i = 0; i < w->n; i++) {
        const Instr *in = &w->ins[i];
        if (in->op == OP_STEP) {
            if (wi->last_read[newest] > i) stashed++;
            newest++;
        } else if (in->op == OP_FORWARD)
            fly++;
        int a = 1 + stashed;
        if (alive) alive[i] = a;
        if (inflight) inflight[i] = fly;
        if (a > wi->max_versions_alive || wi->peak_at < 0) wi->max_versions_alive = a, wi->peak_at = i;
        if (fly > wi->max_inflight) wi->max_inflight = fly;
        if (in->op == OP_FORWARD || in->op == OP_BACKWARD) {
            if (in->op == OP_BACKWARD) fly--;
            if (wi->last_read[in->version] == i && in->version < newest) stashed--;
        }
    }
}

int sched_analyze_worker(const Schedule *s, int rank, SchedWorkerInfo *out, Err *err) {
    PD_ASSERT(rank >= 0 && rank < s->n_ranks);
    memset(out, 0, sizeof *out);
    const SchedWorker *w = &s->workers[rank];
    out->stage = w->stage;
    if (w->stage < 0) return PD_OK;
    out->reads_input = w->stage == 0;
    int steps = 0;
    for (int i = 0; i < w->n; i++) steps += w->ins[i].op == OP_STEP;
    out->n_versions = steps + 1;
    out->last_read = malloc((size_t)out->n_versions * sizeof(int));
    PD_ASSERT(out->last_read);
    for (int v = 0; v < out->n_versions; v++) out->last_read[v] = -1;
    for (int i = 0, newest = 0; i < w->n; i++) {
        const Instr *in = &w->ins[i];
        char t[48];
        if (in->op == OP_STEP) {
            if (in->version != newest + 1) {
                sched_worker_info_release(out);
                return err_set(err, PD_EINVAL, "worker %d instruction %d (%s): step writes version %d after version %d",
                               rank, i, sched_instr_str(in, 1, t, sizeof t), in->version, newest);
            }
            newest++;
        } else if (in->op == OP_FORWARD || in->op == OP_BACKWARD) {
            if (in->version < 0 || in->version > newest) {
                sched_worker_info_release(out);
                return err_set(err, PD_EINVAL, "worker %d instruction %d (%s): reads weight version %d but has %d",
                               rank, i, sched_instr_str(in, 1, t, sizeof t), in->version, newest);
            }
            out->last_read[in->version] = i;
        }
    }
    walk(w, out, NULL, NULL);
    out->n_slots = out->max_inflight + SCHED_SLOTS_AHEAD;
    return PD_OK;
}

void sched_worker_counts(const Schedule *s, int rank, const SchedWorkerInfo *wi, int *alive, int *inflight) {
    PD_ASSERT(rank >= 0 && rank < s->n_ranks);
    const SchedWorker *w = &s->workers[rank];
    if (w->stage < 0) return;
    PD_ASSERT(wi->stage == w->stage && wi->last_read);
    SchedWorkerInfo tmp = *wi;   /* walk() rewrites the maxima: the same values */
    walk(w, &tmp, alive, inflight);
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
        int st = out->workers[r].stage;
        if (st >= 0 && st < s->n_stages && out->workers[r].max_versions_alive > out->stage_versions[st])
            out->stage_versions[st] = out->workers[r].max_versions_alive;
    }
    return PD_OK;
}
