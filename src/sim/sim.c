/* sim.c: the discrete-event simulator (see sim.h for the model), its metrics (time per
 * minibatch, busy/bubble fractions, memory, weight versions) and deadlock reports, and
 * per-stage costs from a profile. Events run in time order: the worker with the earliest clock
 * runs its next instruction, unless a transfer finishes first. A worker blocked on a receive or
 * an all-reduce is woken by the message's arrival or the last arrival it waits for. Transfers
 * share the links fairly, so a transfer's end is known only when the transfers that share its
 * links are; ties go to the transfer, then to the lower rank, so the result is exact and
 * deterministic. Drawing is in timeline.c. */
#include "sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- costs ------------------------------------------------------------------------ */

/* The part of a time that does not shrink with the batch: the line through (b, tb) and
 * (B, tB) at batch 0, clamped to [0, tB]. */
static double fixed_part(double tb, double tB, int b, int B) {
    double f = tb - (tB - tb) * b / (B - b);
    return f < 0 ? 0 : f > tB ? tB : f;
}

/* A layer's forward, backward and split passes as the stage costs count them: the optimizer
 * step taken out of the backward, half of it for each pass when the split is not measured. */
static void layer_times(const ProfileLayer *L, double t[4]) {
    double bwd, bi, bw;
    profile_layer_less_step(L, L->step_s, &bwd, &bi, &bw);
    int split = L->bwd_in_s + L->bwd_w_s > 0;
    t[0] = L->fwd_s, t[1] = bwd, t[2] = split ? bi : bwd / 2, t[3] = split ? bw : bwd / 2;
}

int sim_costs_from_profile(const Schedule *s, const Profile *prof, SimCosts *out, Err *err) {
    memset(out, 0, sizeof *out);
    int nl = prof->n_layers;
    int *stage_of = malloc(((size_t)nl + 1) * sizeof(int));
    int *mark = malloc(((size_t)nl + 1) * sizeof(int));
    SimStageCost *c = calloc((size_t)s->n_stages, sizeof *c);
    PD_ASSERT(stage_of && mark && c);
    for (int i = 0; i < nl; i++) stage_of[i] = -1, mark[i] = -1;
    int rc = PD_OK;
    for (int i = 0; i < s->n_stages && !rc; i++) {
        const SchedStage *st = &s->stages[i];
        for (int k = 0; k < st->n_layers; k++) {
            int l = st->layers[k];
            if (l < 0 || l >= nl) {
                rc = err_set(err, PD_EINVAL, "stage %d names layer %d but the profile has %d layers", i, l, nl);
                break;
            }
            stage_of[l] = i;
            const ProfileLayer *L = &prof->layers[l];
            /* the optimizer step (our profiles measure it; 0 otherwise) is a part of backward_s and
             * of whichever split pass holds it: charged at the step instruction instead, once
             * per step however many units the step follows */
            double tB[4];
            layer_times(L, tB);
            c[i].fwd_s += tB[0];
            c[i].bwd_s += tB[1];
            c[i].step_s += L->step_s;
            c[i].bwd_in_s += tB[2];
            c[i].bwd_w_s += tB[3];
            /* the parts that do not shrink with the batch, from the small-batch times */
            if (prof->small_batch > 0 && prof->small_batch < prof->minibatch) {
                ProfileLayer Ls = profile_layer_small(L);
                double tb[4];
                layer_times(&Ls, tb);
                int b = prof->small_batch, B = prof->minibatch;
                c[i].fwd_fixed_s += fixed_part(tb[0], tB[0], b, B);
                c[i].bwd_fixed_s += fixed_part(tb[1], tB[1], b, B);
                c[i].bwd_in_fixed_s += fixed_part(tb[2], tB[2], b, B);
                c[i].bwd_w_fixed_s += fixed_part(tb[3], tB[3], b, B);
            }
            c[i].param_bytes += prof->layers[l].param_bytes;
            /* graph.txt's Input node "outputs" the model input: counted as in_bytes */
            if (strncmp(prof->layers[l].type, "Input", 5)) c[i].stash_bytes += prof->layers[l].act_bytes;
            c[i].stash_bytes += L->saved_bytes;   /* what the layer keeps besides its output (0 unmeasured) */
            /* the zb kinds' BI keeps, until BW, the gradient w.r.t. the output of every layer with a
             * weight pass but the stage's last (whose is the received gradient, in the slot) */
            if (sched_splits_backward(s) && k < st->n_layers - 1 && sim_layer_keeps_grad(L)) {
                c[i].stash_bytes += L->act_bytes;
                c[i].grad_bytes += L->act_bytes;   /* held in the unit's slot, as the runtime does */
            }
        }
    }
    /* the gradient buckets, as the runtime forms them (rt_buckets): from the last layer down */
    for (int i = 0; i < s->n_stages && !rc; i++) {
        const SchedStage *st = &s->stages[i];
        double total = 0, done = 0, acc = 0;
        for (int k = 0; k < st->n_layers; k++) {
            double tB[4];
            layer_times(&prof->layers[st->layers[k]], tB);
            total += tB[1];
        }
        for (int k = st->n_layers - 1; k >= 0; k--) {
            const ProfileLayer *L = &prof->layers[st->layers[k]];
            double tB[4];
            layer_times(L, tB);
            done += tB[1];
            acc += L->param_bytes;
            if ((acc >= SIM_BUCKET_BYTES || k == 0) && acc > 0) {
                int b = c[i].n_buckets < SIM_MAX_BUCKETS ? c[i].n_buckets++ : SIM_MAX_BUCKETS - 1;
                c[i].bucket_bytes[b] += acc;
                c[i].bucket_ready[b] = total > 0 ? done / total : 1.0;
                acc = 0;
            }
        }
    }
    /* the kernels' scratch: one arena per thread, each slot as large as the stage's largest
     * request; between the profile's batch B and one sample, affine in the batch */
    for (int i = 0; i < s->n_stages && !rc; i++) {
        const SchedStage *st = &s->stages[i];
        int B = prof->minibatch;
        for (int k = 0; k < PROFILE_SCRATCH_SLOTS; k++) {
            double sb = 0, s1 = 0;
            for (int j = 0; j < st->n_layers; j++) {
                const ProfileLayer *L = &prof->layers[st->layers[j]];
                if (L->scratch[k][0] > sb) sb = L->scratch[k][0];
                if (L->scratch[k][1] > s1) s1 = L->scratch[k][1];
            }
            double fixed = B > 1 ? s1 - (sb - s1) / (B - 1) : sb;
            c[i].scratch_bytes += sb;
            c[i].scratch_fixed_bytes += fixed < 0 ? 0 : fixed > sb ? sb : fixed;
        }
    }
    if (!rc) {
        c[0].in_bytes = prof->input_bytes;
        /* bytes crossing boundary i (into stage i from stages before it) */
        int ne = prof->n_edges ? prof->n_edges : (nl > 0 ? nl - 1 : 0);
        for (int i = 1; i < s->n_stages; i++) {
            for (int e = 0; e < ne; e++) {
                int a = prof->n_edges ? prof->edges[e][0] : e, b = prof->n_edges ? prof->edges[e][1] : e + 1;
                if (a < 0 || a >= nl || b < 0 || b >= nl) continue;
                int sa = stage_of[a], sb = stage_of[b];
                if (sa < 0 || sb < 0 || !(sa < i && i <= sb) || mark[a] == i) continue;
                mark[a] = i;
                c[i].in_bytes += prof->layers[a].act_bytes;
            }
        }
        /* a stage's ends: what its first layer pays for a plain input and its last for a plain
         * output, where the model keeps the activation blocked inside a stage (our profiles'
         * cut prices; 0 otherwise). Proportional to the batch; the backward's price divided
         * between its two passes as the layer's backward is */
        for (int l = 0; l < nl && !prof->n_edges; l++) {
            const ProfileLayer *L = &prof->layers[l];
            int i = stage_of[l];
            double f = 0, b = 0;
            if (l > 0 && stage_of[l - 1] != i) f += L->cut_in_fwd_s, b += L->cut_in_bwd_s;
            if (l + 1 < nl && stage_of[l + 1] != i) f += L->cut_out_fwd_s, b += L->cut_out_bwd_s;
            if (i < 0 || f + b <= 0) continue;
            double tB[4];
            layer_times(L, tB);
            double bi = tB[2] + tB[3] > 0 ? b * tB[2] / (tB[2] + tB[3]) : b / 2;
            c[i].fwd_s += f, c[i].bwd_s += b, c[i].bwd_in_s += bi, c[i].bwd_w_s += b - bi;
        }
        for (int i = 0; i < s->n_stages; i++) {
            c[i].stash_bytes += c[i].in_bytes;
            /* our profiles: a unit also holds the gradient w.r.t. the stage's output (received)
             * and, past stage 0, w.r.t. its input (sent), as the runtime allocates them */
            if (prof->saved_measured && s->stages[i].n_layers > 0) {
                c[i].out_bytes = prof->layers[s->stages[i].layers[s->stages[i].n_layers - 1]].act_bytes;
                double g = c[i].out_bytes + (i > 0 ? c[i].in_bytes : 0);
                c[i].grad_bytes += g;
                c[i].stash_bytes += g;
            }
        }
    }
    free(stage_of);
    free(mark);
    if (rc) {
        free(c);
        return rc;
    }
    out->n_stages = s->n_stages;
    out->stage = c;
    return PD_OK;
}

/* t at f times the batch, its fixed part staying; without one (or at f = 1) exactly t f. */
static double scale_time(double t, double fixed, double f) {
    return fixed > 0 && f != 1 ? fixed + (t - fixed) * f : t * f;
}

void sim_costs_scale(SimCosts *c, double f) {
    for (int i = 0; i < c->n_stages; i++) {
        SimStageCost *s = &c->stage[i];
        /* not step_s: per parameter */
        s->fwd_s = scale_time(s->fwd_s, s->fwd_fixed_s, f), s->bwd_s = scale_time(s->bwd_s, s->bwd_fixed_s, f);
        s->bwd_in_s = scale_time(s->bwd_in_s, s->bwd_in_fixed_s, f);
        s->bwd_w_s = scale_time(s->bwd_w_s, s->bwd_w_fixed_s, f);
        s->in_bytes *= f, s->stash_bytes *= f, s->grad_bytes *= f, s->out_bytes *= f;
        s->scratch_bytes = s->scratch_fixed_bytes + (s->scratch_bytes - s->scratch_fixed_bytes) * f;
    }
}

void sim_costs_release(SimCosts *c) {
    if (!c) return;
    free(c->stage);
    memset(c, 0, sizeof *c);
}

/* ---- engine ----------------------------------------------------------------------- */

/* WAITED: a receiver waits, nothing sent; IN_FLIGHT: sent, its transfer under way (waiter: the
 * blocked receiver or -1); POSTED: arrived at `arrive`. */
enum { MSG_EMPTY = 0, MSG_POSTED, MSG_WAITED, MSG_IN_FLIGHT };

typedef struct Msg {
    uint64_t key;     /* kind << 40 | src << 20 | dst */
    int32_t mb;
    int32_t bnd;      /* the boundary crossed: the stage the activation feeds / the gradient leaves */
    int32_t state;
    int32_t waiter;   /* MSG_WAITED, MSG_IN_FLIGHT: the blocked rank (-1: none yet) */
    int32_t sender_ins;
    double arrive;
} Msg;

typedef struct WState {
    int pc;
    int blocked;        /* 0 running/done, 1 on recv, 2 on all-reduce, 3 computing on shared cores */
    double clock;
    double busy;
    double slow;        /* compute slowdown: workers sharing the machine's cores (Cluster) */
    /* shared cores (Engine.shared): of the compute instruction under way, `rem` seconds of work
     * (at full speed) left at job_t, progressing at job_rate (1: a core of its own) */
    double rem, job_t, job_rate;
    double job_work_total;   /* the work of all its compute instructions */
    int job_version;
} WState;

typedef struct Group {   /* all-reduce state of one stage */
    int arrived;
    int version;
    double tmax;
    double cost;      /* the ring alone on its links (0: none, or no cluster) */
    double bytes;     /* what each replica sends around the ring, 2 (r - 1) / r x the stage's
                       * parameter bytes (0: no transfers, the cost is latency alone) */
    double lat;       /* the ring's latencies, 2 (r - 1) x its slowest level's */
    double bw;        /* the ring's rate: its slowest hop's bandwidth */
    int pending;      /* its ring's transfers still on the links */
    double bucket_at[SIM_MAX_BUCKETS];   /* when the last replica to arrive so far had bucket b */
} Group;

/* A transfer of a ring all-reduce (FlowMsg.kind; bnd is the stage): not a Msg. */
enum { FLOW_ALLREDUCE = 2 };

/* ---- links: transfers share them fairly ------------------------------------------ */

/* The transfers between one ordered pair of workers: one connection (as MPI's over TCP), which
 * sends its messages one after the other. Each worker has one outgoing and one incoming link
 * (resources w and W + w). A connection from a to b occupies a's outgoing link for c_out
 * seconds and b's incoming link for c_in seconds per byte (1 / the rate each end could give it
 * alone), and the rates of the connections with messages in flight are max-min fair (as TCP
 * flows share a bottleneck): every connection gets the same rate, except where a link it does
 * not fill leaves it more. Rates change only when a connection starts or runs out of
 * messages, and only for the connections joined to it through shared links (its component). */
typedef struct FlowMsg {
    double bytes;
    int kind, mb, bnd, ins;   /* the message, and its send instruction */
} FlowMsg;

typedef struct Flow {
    double rem;            /* bytes of the head message left at t_last */
    double rate;           /* bytes / s since t_last */
    double t_last;
    double c_out, c_in;    /* seconds of each end's link per byte */
    double latency;        /* added after a message's last byte leaves: its arrival */
    double x;              /* scratch: the rate being filled */
    int src, dst;
    FlowMsg *q;            /* the messages queued, q[q_head] in flight */
    int q_head, q_n, q_cap;
    int version;           /* heap entries of an older version are stale */
    int live, frozen, seen;
} Flow;

typedef struct FlowEv {
    double t;
    int id, version;
} FlowEv;

typedef struct LinkSet {   /* the transfers in flight on one link */
    int *ids, n, cap;
    int seen;
    double used, growc;   /* flow_reshare's scratch: the link's share taken, its unfrozen transfers' cost */
} LinkSet;

typedef struct Engine {
    const Schedule *s;
    const SimCosts *c;
    const SimOpts *o;
    SimResult *r;
    WState *ws;
    Group *groups;
    Msg *tab;
    size_t tab_mask, n_live;
    int *heap, n_heap;  /* the workers ready to run, a min-heap by (clock, rank) */
    Err *err;
    /* transfers in flight */
    Flow *fl;
    int n_fl, cap_fl, *free_fl, n_free, cap_free;
    FlowEv *fh;         /* their finish times, a min-heap (stale entries skipped) */
    int n_fh, cap_fh;
    LinkSet *links;     /* 2 W: outgoing links, then incoming */
    int epoch;          /* marks a component's links and transfers as seen */
    int *comp, cap_comp, *lq, cap_lq;
    /* Shared cores: the workers of a machine (a level-0 group of `per`) computing at once share
     * its `cores` equally, each at most one (processor sharing, as the kernel's scheduler
     * shares them); 0: every worker computes at its own speed (ws.slow). */
    int shared, per;
    double cores;
    FlowEv *jh;         /* the computing workers' finish times (id: the worker), a min-heap */
    int n_jh, cap_jh;
} Engine;

/* The ready workers run in the order of their clocks, so that events happen in time order: a
 * transfer or a computation is shared with those under way when it starts. */
static int ready_before(const Engine *e, int a, int b) {
    double ca = e->ws[a].clock, cb = e->ws[b].clock;
    return ca < cb || (ca == cb && a < b);
}

static void ready_push(Engine *e, int w) {
    int i = e->n_heap++;
    while (i > 0 && ready_before(e, w, e->heap[(i - 1) / 2])) {
        e->heap[i] = e->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->heap[i] = w;
}

static int ready_pop(Engine *e) {
    int top = e->heap[0], last = e->heap[--e->n_heap], i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= e->n_heap) break;
        if (c + 1 < e->n_heap && ready_before(e, e->heap[c + 1], e->heap[c])) c++;
        if (!ready_before(e, e->heap[c], last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (e->n_heap) e->heap[i] = last;
    return top;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static size_t msg_home(const Engine *e, uint64_t key, int mb, int bnd) {
    return mix64(key * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)(uint32_t)mb | (uint64_t)(uint32_t)bnd << 32)) & e->tab_mask;
}

static void msg_grow(Engine *e) {
    size_t old_cap = e->tab_mask + 1, cap = 2 * old_cap;
    Msg *old = e->tab;
    e->tab = calloc(cap, sizeof(Msg));
    PD_ASSERT(e->tab);
    e->tab_mask = cap - 1;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].state == MSG_EMPTY) continue;
        size_t h = msg_home(e, old[i].key, old[i].mb, old[i].bnd);
        while (e->tab[h].state != MSG_EMPTY) h = (h + 1) & e->tab_mask;
        e->tab[h] = old[i];
    }
    free(old);
}

/* The live message (posted or waited for) with this identity, created empty if asked. A
 * message is (kind, sender, receiver, unit, boundary): with several chunks per worker two
 * messages of one unit can join the same pair of ranks (docs/explanation/schedules.md). The table holds
 * only live messages (received ones are removed), so it stays small. */
static Msg *msg_find(Engine *e, int kind, int src, int dst, int mb, int bnd, int create) {
    uint64_t key = (uint64_t)kind << 40 | (uint64_t)src << 20 | (uint64_t)dst;
    for (;;) {
        size_t h = msg_home(e, key, mb, bnd);
        for (;;) {
            Msg *m = &e->tab[h];
            if (m->state == MSG_EMPTY) break;
            if (m->key == key && m->mb == mb && m->bnd == bnd) return m;
            h = (h + 1) & e->tab_mask;
        }
        if (!create) return NULL;
        if (2 * (e->n_live + 1) <= e->tab_mask + 1) {
            Msg *m = &e->tab[h];
            m->key = key;
            m->mb = mb;
            m->bnd = bnd;
            e->n_live++;
            return m;
        }
        msg_grow(e);
    }
}

/* Linear-probing deletion by backward shift (no tombstones). */
static void msg_remove(Engine *e, Msg *m) {
    size_t i = (size_t)(m - e->tab), j = i;
    for (;;) {
        j = (j + 1) & e->tab_mask;
        if (e->tab[j].state == MSG_EMPTY) break;
        size_t k = msg_home(e, e->tab[j].key, e->tab[j].mb, e->tab[j].bnd);
        /* move j into the hole at i unless its home lies cyclically in (i, j] */
        int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            e->tab[i] = e->tab[j];
            i = j;
        }
    }
    memset(&e->tab[i], 0, sizeof e->tab[i]);
    e->n_live--;
}

static void *grow(void *p, int *cap, int need, size_t size) {
    if (need <= *cap) return p;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    p = realloc(p, (size_t)c * size);
    PD_ASSERT(p);
    *cap = c;
    return p;
}

static int fh_before(const FlowEv *a, const FlowEv *b) { return a->t < b->t || (a->t == b->t && a->id < b->id); }

static void ev_push(FlowEv **h, int *n, int *cap, FlowEv v) {
    *h = grow(*h, cap, *n + 1, sizeof(FlowEv));
    FlowEv *a = *h;
    int i = (*n)++;
    while (i > 0 && fh_before(&v, &a[(i - 1) / 2])) {
        a[i] = a[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    a[i] = v;
}

static void ev_pop(FlowEv *a, int *n) {
    FlowEv last = a[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && fh_before(&a[c + 1], &a[c])) c++;
        if (!fh_before(&a[c], &last)) break;
        a[i] = a[c];
        i = c;
    }
    if (*n) a[i] = last;
}

static void fh_push(Engine *e, FlowEv v) { ev_push(&e->fh, &e->n_fh, &e->cap_fh, v); }
static void fh_pop(Engine *e) { ev_pop(e->fh, &e->n_fh); }

/* ---- shared cores ----------------------------------------------------------------- */

/* The next computing worker to finish (*t its time), or -1 (*t infinite). */
static int job_next(Engine *e, double *t) {
    while (e->n_jh) {
        const FlowEv *v = &e->jh[0];
        const WState *w = &e->ws[v->id];
        if (w->blocked == 3 && w->job_version == v->version) {
            *t = v->t;
            return v->id;
        }
        ev_pop(e->jh, &e->n_jh);
    }
    *t = INFINITY;
    return -1;
}

/* Re-shares machine m's cores at time now among its computing workers. */
static void job_reshare(Engine *e, double now, int m) {
    int W = e->s->n_ranks, n = 0;
    for (int q = m * e->per; q < (m + 1) * e->per && q < W; q++) {
        WState *w = &e->ws[q];
        if (w->blocked != 3) continue;
        w->rem -= w->job_rate * (now - w->job_t);
        if (w->rem < 0) w->rem = 0;
        w->job_t = now;
        n++;
    }
    double rate = (n > e->cores ? e->cores / n : 1.0) * cluster_core_efficiency(e->o->cluster, n);
    for (int q = m * e->per; q < (m + 1) * e->per && q < W; q++) {
        WState *w = &e->ws[q];
        if (w->blocked != 3) continue;
        w->job_rate = rate;
        w->job_version++;
        ev_push(&e->jh, &e->n_jh, &e->cap_jh, (FlowEv){now + w->rem / rate, q, w->job_version});
    }
}

/* Worker q's compute instruction of `work` seconds at full speed starts at its clock. */
static void job_start(Engine *e, int q, double work) {
    WState *w = &e->ws[q];
    w->blocked = 3;
    w->rem = work;
    w->job_t = w->clock;
    w->job_rate = 0;
    job_reshare(e, w->clock, q / e->per);
}

/* Worker q's compute ends at t: its instruction is done (a step adds SimOpts.step_s), it runs
 * on, and its machine's cores are re-shared. */
static void job_finish(Engine *e, int q, double t) {
    WState *w = &e->ws[q];
    ev_pop(e->jh, &e->n_jh);
    int i = w->pc;
    w->blocked = 0;
    w->clock = t;
    w->busy += t - e->r->start[q][i];
    if (e->s->workers[q].ins[i].op == OP_STEP) w->clock += e->o->step_s;
    e->r->end[q][i] = w->clock;
    w->pc++;
    job_reshare(e, t, q / e->per);
    ready_push(e, q);
}

/* The next transfer to finish (its id, its time in *t), or -1 (*t infinite) when none is in flight. */
static int flow_next(Engine *e, double *t) {
    while (e->n_fh) {
        const FlowEv *v = &e->fh[0];
        const Flow *f = &e->fl[v->id];
        if (f->live && f->version == v->version) {
            *t = v->t;
            return v->id;
        }
        fh_pop(e);
    }
    *t = INFINITY;
    return -1;
}

static void link_add(LinkSet *l, int id) {
    l->ids = grow(l->ids, &l->cap, l->n + 1, sizeof(int));
    l->ids[l->n++] = id;
}

static void link_del(LinkSet *l, int id) {
    for (int k = 0; k < l->n; k++)
        if (l->ids[k] == id) {
            memmove(l->ids + k, l->ids + k + 1, (size_t)(l->n - k - 1) * sizeof(int));
            l->n--;
            return;
        }
    PD_ASSERT(0);
}

/* Re-shares the links of the component joined (through shared links) to links l0 and l1 at
 * time now: every transfer in it is brought to now at its old rate, then given its max-min
 * fair rate by progressive filling (raise every unfrozen rate together until some link is
 * full; freeze the transfers on it; repeat), and a new finish. */
static void flow_reshare(Engine *e, double now, int l0, int l1) {
    int ep = ++e->epoch, nf = 0, nl = 0;
    e->lq = grow(e->lq, &e->cap_lq, 2, sizeof(int));
    e->links[l0].seen = ep;
    e->lq[nl++] = l0;
    if (e->links[l1].seen != ep) e->links[l1].seen = ep, e->lq[nl++] = l1;
    for (int q = 0; q < nl; q++) {
        const LinkSet *L = &e->links[e->lq[q]];
        for (int k = 0; k < L->n; k++) {
            Flow *f = &e->fl[L->ids[k]];
            if (f->seen == ep) continue;
            f->seen = ep;
            e->comp = grow(e->comp, &e->cap_comp, nf + 1, sizeof(int));
            e->comp[nf++] = L->ids[k];
            int ends[2] = {f->src, e->s->n_ranks + f->dst};
            for (int j = 0; j < 2; j++)
                if (e->links[ends[j]].seen != ep) {
                    e->lq = grow(e->lq, &e->cap_lq, nl + 1, sizeof(int));
                    e->links[ends[j]].seen = ep;
                    e->lq[nl++] = ends[j];
                }
        }
    }
    for (int k = 0; k < nf; k++) {
        Flow *f = &e->fl[e->comp[k]];
        f->rem -= f->rate * (now - f->t_last);
        if (f->rem < 0) f->rem = 0;
        f->t_last = now;
        f->x = 0;
        f->frozen = 0;
    }
    int left = nf;
    while (left > 0) {
        /* the smallest raise that fills a link: (1 - used) / (cost of its unfrozen transfers) */
        double step = INFINITY;
        for (int q = 0; q < nl; q++) {
            int l = e->lq[q], out = l < e->s->n_ranks;
            LinkSet *L = &e->links[l];
            L->used = L->growc = 0;
            for (int k = 0; k < L->n; k++) {
                const Flow *f = &e->fl[L->ids[k]];
                double c = out ? f->c_out : f->c_in;
                L->used += f->x * c;
                if (!f->frozen) L->growc += c;
            }
            if (L->growc > 0 && (1 - L->used) / L->growc < step) step = (1 - L->used) / L->growc;
        }
        PD_ASSERT(isfinite(step));
        if (step < 0) step = 0;
        for (int k = 0; k < nf; k++)
            if (!e->fl[e->comp[k]].frozen) e->fl[e->comp[k]].x += step;
        /* freeze the transfers on every link now full */
        for (int q = 0; q < nl; q++) {
            const LinkSet *L = &e->links[e->lq[q]];
            if (L->growc <= 0 || L->used + step * L->growc < 1 - 1e-12) continue;
            for (int k = 0; k < L->n; k++) {
                Flow *f = &e->fl[L->ids[k]];
                if (!f->frozen) f->frozen = 1, left--;
            }
        }
    }
    for (int k = 0; k < nf; k++) {
        Flow *f = &e->fl[e->comp[k]];
        f->rate = f->x;
        f->version++;
        fh_push(e, (FlowEv){now + f->rem / f->rate, e->comp[k], f->version});
    }
}

/* A message of `bytes` from a to b sent at now by instruction ins of a: queued on the pair's
 * connection, which starts (and the links are re-shared) unless it is already sending. */
static void flow_start(Engine *e, double now, int a, int b, double bytes, int kind, int mb, int bnd, int ins) {
    const Cluster *cl = e->o->cluster;
    FlowMsg msg = {bytes, kind, mb, bnd, ins};
    const LinkSet *out = &e->links[a];
    for (int k = 0; k < out->n; k++) {
        Flow *f = &e->fl[out->ids[k]];
        if (f->dst != b) continue;
        f->q = grow(f->q, &f->q_cap, f->q_n + 1, sizeof(FlowMsg));
        f->q[f->q_n++] = msg;
        return;
    }
    int id;
    if (e->n_free) id = e->free_fl[--e->n_free];
    else {
        e->fl = grow(e->fl, &e->cap_fl, e->n_fl + 1, sizeof(Flow));
        id = e->n_fl++;
        e->fl[id] = (Flow){0};
    }
    Flow *f = &e->fl[id];
    int lv = cluster_link_level(cl, a, b);
    double bw = cl->level[lv].bandwidth;
    *f = (Flow){.rem = bytes, .t_last = now, .latency = cluster_link_latency(cl, a, b), .c_out = 1 / fmin(bw, cluster_own_bandwidth(cl, a)),
                .c_in = 1 / fmin(bw, cluster_own_bandwidth(cl, b)), .src = a, .dst = b, .q = f->q, .q_cap = f->q_cap, .version = f->version,
                .live = 1};
    f->q = grow(f->q, &f->q_cap, 1, sizeof(FlowMsg));
    f->q[f->q_n++] = msg;
    link_add(&e->links[a], id);
    link_add(&e->links[e->s->n_ranks + b], id);
    flow_reshare(e, now, a, e->s->n_ranks + b);
}

/* Stage st's all-reduce is over at t1: every replica leaves its all-reduce instruction then.
 * self: the replica that runs on from it (run_worker's caller), or -1 (all were waiting). */
/* What worker q pays to resume from a wait (Cluster.wake_s): only where its machine's cores are
 * shared and, as it wakes, every one of them is computing for another worker (it then waits
 * for one); a free core takes it at once. */
static double wake_s(const Engine *e, int q) {
    const Cluster *cl = e->o->cluster;
    if (!cl || !(cl->wake_s > 0) || !e->shared) return 0;
    int n = 0, m = q / e->per;
    for (int k = m * e->per; k < (m + 1) * e->per && k < e->s->n_ranks; k++) n += k != q && e->ws[k].blocked == 3;
    return n >= e->cores ? cl->wake_s : 0;
}

static void group_release(Engine *e, int st, double t1, int self) {
    Group *gr = &e->groups[st];
    for (int k = 0; k < e->s->stages[st].replicas; k++) {
        int peer = e->s->stages[st].ranks[k];
        WState *pw = &e->ws[peer];
        e->r->start[peer][pw->pc] = gr->tmax;   /* the collective itself; waiting shows as idle */
        /* every replica waited, but the one arriving last where the ring had nothing left */
        pw->clock = t1 + (peer != self ? wake_s(e, peer) : 0);
        e->r->end[peer][pw->pc] = pw->clock;
        if (peer != self) {
            PD_ASSERT(pw->blocked == 2);
            pw->blocked = 0;
            pw->pc++;
            ready_push(e, peer);
        }
    }
    gr->arrived = 0;
    gr->tmax = 0;
    for (int b = 0; b < SIM_MAX_BUCKETS; b++) gr->bucket_at[b] = 0;
}

/* One transfer of stage st's ring all-reduce ended at t. After the last, the ring's latencies
 * later, every replica has the sum. */
static void allreduce_done(Engine *e, int st, double t) {
    Group *gr = &e->groups[st];
    if (--gr->pending == 0) group_release(e, st, t + gr->lat, -1);
}

/* The head message of connection id finishes at t: it arrives latency later (the receiver
 * waiting for it is woken) and its send instruction's end is set. The connection goes on with
 * its next message at the same rate, or ends, and its links are re-shared. */
static void flow_finish(Engine *e, int id, double t) {
    Flow *f = &e->fl[id];
    fh_pop(e);
    const FlowMsg *g = &f->q[f->q_head++];
    if (g->kind == FLOW_ALLREDUCE) {
        allreduce_done(e, g->bnd, t);
    } else {
        double arrive = t + f->latency;
        e->r->end[f->src][g->ins] = arrive;
        Msg *m = msg_find(e, g->kind, f->src, f->dst, g->mb, g->bnd, 0);
        PD_ASSERT(m && m->state == MSG_IN_FLIGHT);
        m->state = MSG_POSTED;
        m->arrive = arrive;
        if (m->waiter >= 0) ready_push(e, m->waiter);
    }
    if (f->q_head < f->q_n) {
        f->rem = f->q[f->q_head].bytes;
        f->t_last = t;
        f->version++;
        fh_push(e, (FlowEv){t + f->rem / f->rate, id, f->version});
        return;
    }
    f->live = 0;
    f->q_head = f->q_n = 0;
    link_del(&e->links[f->src], id);
    link_del(&e->links[e->s->n_ranks + f->dst], id);
    e->free_fl = grow(e->free_fl, &e->cap_free, e->n_free + 1, sizeof(int));
    e->free_fl[e->n_free++] = id;
    flow_reshare(e, t, f->src, e->s->n_ranks + f->dst);
}

/* Stage st's ring: its time alone on its links, its latencies and each replica's bytes. */
static void group_init(Engine *e, int st) {
    const SchedStage *g = &e->s->stages[st];
    const Cluster *cl = e->o->cluster;
    Group *gr = &e->groups[st];
    int r = g->replicas;
    if (r < 2 || !cl || cl->n_levels == 0) return;
    int lv = 0, own = 0;
    double bw = INFINITY, hop_lat = 0;   /* the ring moves at its slowest hop, waits on its longest */
    for (int i = 0; i < r; i++) {
        int a = g->ranks[i], b = g->ranks[(i + 1) % r], l = cluster_link_level(cl, a, b);
        if (l > lv) lv = l;
        double x = cluster_link_bandwidth(cl, a, b);
        if (x < bw) bw = x;
        own |= b < cl->n_hosts && cl->host[b].has_latency;
        hop_lat = fmax(hop_lat, cluster_link_latency(cl, a, b));
    }
    gr->bytes = 2.0 * (r - 1) / r * e->c->stage[st].param_bytes;
    gr->bw = bw;
    gr->lat = 2.0 * (r - 1) * (own ? hop_lat : cl->level[lv].latency);   /* hosts' own: the longest hop's */
    gr->cost = gr->bytes / bw + gr->lat;
}

/* Compute time of instruction i of worker sw at full speed (0 for other instructions). A BI
 * with its BW next is one whole backward, as the runtime runs it (runtime.c, exec_backward).
 * A step updates every stage the worker holds (its chunks). */
static double compute_s(const Engine *e, const SchedWorker *sw, int i) {
    const Instr *in = &sw->ins[i];
    if (in->op == OP_STEP) {
        double t = 0;
        int nc = sw->n_chunks > 0 ? sw->n_chunks : 1;
        for (int k = 0; k < nc; k++) t += e->c->stage[sw->stages && k < sw->n_chunks ? sw->stages[k] : sw->stage].step_s;
        return t;
    }
    if (!sched_op_computes(in->op)) return 0;
    const SimStageCost *sc = &e->c->stage[sched_instr_stage(sw, in)];
    int fused = sched_bw_follows(sw, i), fused_w = i > 0 && sched_bw_follows(sw, i - 1);
    return in->op == OP_FORWARD || in->op == OP_RECOMPUTE ? sc->fwd_s
           : in->op == OP_BACKWARD                        ? sc->bwd_s
           : in->op == OP_BACKWARD_B                      ? (fused ? sc->bwd_s : sim_bwd_in(sc))
                                                          : (fused_w ? 0 : sim_bwd_w(sc));
}

/* Worker rank reaches its all-reduce, instruction i: when it had each gradient bucket of the
 * stage, from the chunk's last backward before the all-reduce (after the previous step; the
 * chunk's forwards, sends and receives and other chunks' instructions between are skipped); a
 * bucket is ready once its share of that backward (SimStageCost.bucket_ready) is done. Without
 * such a backward, at the all-reduce. The group keeps, per bucket, the latest over its
 * replicas. */
static void bucket_times(Engine *e, int rank, int i, Group *gr, const SimStageCost *sc) {
    const SchedWorker *sw = &e->s->workers[rank];
    double b0 = e->ws[rank].clock, b1 = b0;
    for (int j = i - 1; j >= 0; j--) {
        int op = sw->ins[j].op;
        if (op == OP_STEP) break;
        /* the chunk's last backward before its all-reduce, past other chunks' instructions
         * (rt_bucket.c, rt_last_backward_before_ar) */
        if (sw->ins[j].chunk != sw->ins[i].chunk) continue;
        if (op == OP_SEND_ACT || op == OP_SEND_GRAD || op == OP_RECV_ACT || op == OP_RECV_GRAD || op == OP_FORWARD ||
            op == OP_RECOMPUTE)
            continue;
        if (op == OP_BACKWARD || op == OP_BACKWARD_B || op == OP_BACKWARD_W) {
            b1 = e->r->end[rank][j];
            b0 = e->r->start[rank][j];
            /* a split backward run as one (BI then its BW): the whole of it */
            if (op == OP_BACKWARD_W && j > 0 && sw->ins[j - 1].op == OP_BACKWARD_B) b0 = e->r->start[rank][j - 1];
        }
        break;
    }
    for (int b = 0; b < sc->n_buckets; b++) {
        double t = b0 + sc->bucket_ready[b] * (b1 - b0);
        if (t > gr->bucket_at[b]) gr->bucket_at[b] = t;
    }
}

/* The bytes of the ring each replica has sent by the time the last replica arrives (gr->tmax):
 * the buckets one after the other at the ring's rate, each from when every replica had it. */
static double ring_moved(const Group *gr, const SimStageCost *sc, int r) {
    double moved = 0, t = 0;
    for (int b = 0; b < sc->n_buckets; b++) {
        double start = gr->bucket_at[b] > t ? gr->bucket_at[b] : t;
        if (start >= gr->tmax) break;
        double bytes = 2.0 * (r - 1) / r * sc->bucket_bytes[b], dur = bytes / gr->bw;
        if (start + dur > gr->tmax) return moved + (gr->tmax - start) * gr->bw;
        moved += bytes;
        t = start + dur;
    }
    return moved;
}

/* Advances worker w until it finishes or blocks. Returns PD_OK or an error (mismatch). */
/* Bytes on the wire of a message across boundary bnd (the stage an activation feeds, the stage a
 * gradient leaves): the boundary's activation bytes, times the wire format's factor. */
static double send_bytes(const Engine *e, int bnd) {
    double bytes = bnd >= 0 && bnd < e->s->n_stages ? e->c->stage[bnd].in_bytes : 0;
    return e->o->wire_factor > 0 ? bytes * e->o->wire_factor : bytes;
}

/* With per-boundary codecs (SimOpts.wire_at): the codec of the activation (act) or gradient
 * message across boundary bnd (as send_bytes numbers it), -1 without. */
static int wire_of(const Engine *e, int act, int bnd) {
    if (!e->o->wire_at || bnd < 1 || bnd >= e->s->n_stages) return -1;
    return e->o->wire_at[2 * (bnd - 1) + !act];
}

/* The message's bytes on the wire, counted per boundary into the result; and its encoding
 * (enc) or decoding seconds. */
static double message_bytes(Engine *e, int act, int bnd) {
    double raw = bnd >= 0 && bnd < e->s->n_stages ? e->c->stage[bnd].in_bytes : 0;
    int wire = wire_of(e, act, bnd);
    double bytes = wire >= 0 ? sim_wire_bytes(wire, raw) : send_bytes(e, bnd);
    if (bnd >= 1 && bnd < e->s->n_stages) {
        e->r->wire_bytes[2 * (bnd - 1) + !act] += bytes;
        e->r->raw_bytes[2 * (bnd - 1) + !act] += raw;
    }
    return bytes;
}

static double codec_s(const Engine *e, int act, int bnd, int enc) {
    int wire = wire_of(e, act, bnd);
    if (wire < 0) return 0;
    return sim_wire_codec_s(wire, !act, e->o->error_feedback, enc, e->c->stage[bnd].in_bytes);
}

static int run_worker(Engine *e, int rank) {
    const Schedule *s = e->s;
    const SchedWorker *sw = &s->workers[rank];
    WState *w = &e->ws[rank];
    double *st = e->r->start[rank], *en = e->r->end[rank];
    while (w->pc < sw->n) {
        double tf, tj;
        if ((e->n_heap && ready_before(e, e->heap[0], rank)) ||   /* another worker is earlier, */
            (flow_next(e, &tf) >= 0 && tf <= w->clock) ||        /* or a transfer ends first, */
            (job_next(e, &tj) >= 0 && tj <= w->clock)) {         /* or another's compute */
            ready_push(e, rank);
            return PD_OK;
        }
        const Instr *in = &sw->ins[w->pc];
        int i = w->pc;
        if (in->chunk < 0 || in->chunk >= (sw->n_chunks > 0 ? sw->n_chunks : 1))
            return err_set(e->err, PD_EINVAL, "worker %d instruction %d: chunk %d but the worker has %d", rank, i, in->chunk,
                           sw->n_chunks);
        int stage = sched_instr_stage(sw, in);
        switch (in->op) {
        case OP_FORWARD:
        case OP_RECOMPUTE:
        case OP_BACKWARD:
        case OP_BACKWARD_B:
        case OP_BACKWARD_W: {
            double d = compute_s(e, sw, i) * w->slow;
            st[i] = w->clock;
            if (e->shared && d > 0) {   /* ends when its share of the cores has done it (job_finish) */
                w->job_work_total += d;
                job_start(e, rank, d);
                return PD_OK;
            }
            w->clock += d;
            w->busy += d;
            en[i] = w->clock;
            break;
        }
        case OP_SEND_ACT:
        case OP_SEND_GRAD: {
            int act = in->op == OP_SEND_ACT;
            int peer = in->peer;
            if (peer < 0 || peer >= s->n_ranks)
                return err_set(e->err, PD_EINVAL, "worker %d instruction %d: send to bad peer %d", rank, i, peer);
            /* the activation feeds stage + 1; the gradient is of this stage's input */
            int bnd = act ? stage + 1 : stage;
            double bytes = message_bytes(e, act, bnd);
            double enc = codec_s(e, act, bnd, 1) * w->slow;   /* the sender encodes first */
            w->clock += enc, w->busy += enc;
            /* the transfer starts now and shares the sender's outgoing and the receiver's
             * incoming link with the others in flight (flow_start); without a cluster or
             * bytes it arrives at once, as does a message to itself (the V's turn: one worker's two
             * chunks) */
            Msg *m = msg_find(e, act, rank, peer, in->mb, bnd, 1);
            if (m->state == MSG_POSTED || m->state == MSG_IN_FLIGHT)
                return err_set(e->err, PD_EINVAL, "worker %d instruction %d: %s of unit %d to %d sent twice", rank, i,
                               act ? "activation" : "gradient", in->mb, peer);
            int waiter = m->state == MSG_WAITED ? m->waiter : -1;
            m->sender_ins = i;
            e->r->n_messages++;
            st[i] = w->clock;
            const Cluster *cl = e->o->cluster;
            if (cl && cl->n_levels > 0 && bytes > 0 && peer != rank) {
                m->state = MSG_IN_FLIGHT;
                m->waiter = waiter;
                en[i] = INFINITY;   /* set when it arrives (flow_finish) */
                flow_start(e, w->clock, rank, peer, bytes, act, in->mb, bnd, i);
                break;
            }
            m->state = MSG_POSTED;
            m->arrive = en[i] = w->clock;
            if (waiter >= 0) ready_push(e, waiter);
            break;
        }
        case OP_RECV_ACT:
        case OP_RECV_GRAD: {
            int act = in->op == OP_RECV_ACT;
            if (in->peer < 0 || in->peer >= s->n_ranks)
                return err_set(e->err, PD_EINVAL, "worker %d instruction %d: receive from bad peer %d", rank, i, in->peer);
            Msg *m = msg_find(e, act, in->peer, rank, in->mb, act ? stage : stage + 1, 1);
            if (m->state != MSG_POSTED) {   /* not arrived yet (a second receive of one message waits forever) */
                if (!w->blocked) st[i] = w->clock;
                if (m->state != MSG_IN_FLIGHT) m->state = MSG_WAITED;
                m->waiter = rank;
                w->blocked = 1;
                return PD_OK;
            }
            if (!w->blocked) st[i] = w->clock;
            if (m->arrive > w->clock) w->clock = m->arrive + wake_s(e, rank);   /* it waited: it wakes */
            w->blocked = 0;
            double dec = codec_s(e, act, act ? stage : stage + 1, 0) * w->slow;   /* then decodes */
            w->clock += dec, w->busy += dec;
            en[i] = w->clock;
            msg_remove(e, m);
            break;
        }
        case OP_ALLREDUCE: {
            int g = in->peer;
            if (g != stage)
                return err_set(e->err, PD_EINVAL, "worker %d instruction %d: all-reduce of stage %d from stage %d", rank, i, g,
                               stage);
            if (w->blocked == 2) return PD_OK;   /* still waiting; woken by the last arrival */
            Group *gr = &e->groups[g];
            st[i] = w->clock;
            if (gr->arrived == 0) gr->version = in->version;
            else if (gr->version != in->version)
                return err_set(e->err, PD_EINVAL, "worker %d instruction %d: all-reduce for version %d meets version %d", rank,
                               i, in->version, gr->version);
            if (w->clock > gr->tmax) gr->tmax = w->clock;
            bucket_times(e, rank, i, gr, &e->c->stage[g]);
            gr->arrived++;
            if (gr->arrived < s->stages[g].replicas) {
                w->blocked = 2;
                return PD_OK;
            }
            if (gr->bytes > 0) {
                /* the ring on the links: replica k sends gr->bytes to replica k + 1, sharing its
                 * outgoing and the next one's incoming link with the activations and gradients
                 * in flight there (flow_start); every replica waits until the last of them
                 * arrives (allreduce_done) */
                const int r = s->stages[g].replicas;
                const double rest = gr->bytes - ring_moved(gr, &e->c->stage[g], r);
                if (rest > 1e-9 * gr->bytes) {
                    w->blocked = 2;
                    gr->pending = r;
                    for (int k = 0; k < r; k++)
                        flow_start(e, gr->tmax, s->stages[g].ranks[k], s->stages[g].ranks[(k + 1) % r], rest,
                                   FLOW_ALLREDUCE, -1, g, -1);
                    return PD_OK;
                }
                group_release(e, g, gr->tmax + gr->lat, rank);   /* all of it went during the backward */
                break;
            }
            group_release(e, g, gr->tmax + gr->cost, rank);   /* latency alone, or no cluster */
            break;
        }
        case OP_STEP: {
            double d = compute_s(e, sw, i) * w->slow;
            st[i] = w->clock;
            if (e->shared && d > 0) {
                w->job_work_total += d;
                job_start(e, rank, d);
                return PD_OK;
            }
            w->clock += d + e->o->step_s;
            w->busy += d;
            en[i] = w->clock;
            break;
        }
        case OP_FLUSH: st[i] = en[i] = w->clock; break;
        default: return err_set(e->err, PD_EINVAL, "worker %d instruction %d: unknown op %d", rank, i, in->op);
        }
        w->pc++;
    }
    return PD_OK;
}

/* Names the blocked workers, their instructions and what they wait for. */
static int report_deadlock(Engine *e) {
    const Schedule *s = e->s;
    char buf[sizeof e->err->msg];
    int n_blocked = 0, k = 0;
    for (int r = 0; r < s->n_ranks; r++) n_blocked += e->ws[r].pc < s->workers[r].n;
    k += snprintf(buf + k, sizeof buf - (size_t)k, "deadlock: %d worker%s blocked:", n_blocked, n_blocked == 1 ? "" : "s");
    int shown = 0;
    for (int r = 0; r < s->n_ranks && k < (int)sizeof buf - 80; r++) {
        const WState *w = &e->ws[r];
        if (w->pc >= s->workers[r].n) continue;
        if (shown == 6) {
            k += snprintf(buf + k, sizeof buf - (size_t)k, "; and %d more", n_blocked - shown);
            break;
        }
        const Instr *in = &s->workers[r].ins[w->pc];
        char t[48];
        sched_instr_str(in, 0, t, sizeof t);
        if (in->op == OP_ALLREDUCE)
            k += snprintf(buf + k, sizeof buf - (size_t)k, "%s worker %d at instruction %d (%s) waits for %d of %d replicas",
                          shown ? ";" : "", r, w->pc, t, e->groups[in->peer].arrived, s->stages[in->peer].replicas);
        else {
            const WState *p = in->peer >= 0 && in->peer < s->n_ranks ? &e->ws[in->peer] : NULL;
            const char *why = !p ? "" : p->pc >= s->workers[in->peer].n ? ", which has finished without sending it"
                                                                         : ", which is itself blocked";
            char stg[32] = "";   /* which stage's, when a worker runs several */
            if (s->workers[r].n_chunks > 1) snprintf(stg, sizeof stg, " (stage %d)", sched_instr_stage(&s->workers[r], in));
            k += snprintf(buf + k, sizeof buf - (size_t)k, "%s worker %d at instruction %d (%s) waits for the %s of unit %d%s from worker %d%s",
                          shown ? ";" : "", r, w->pc, t, in->op == OP_RECV_ACT ? "activation" : "gradient", in->mb, stg,
                          in->peer, why);
        }
        if (k >= (int)sizeof buf) k = (int)sizeof buf - 1;
        shown++;
    }
    return err_set(e->err, PD_EINVAL, "%s", buf);
}

/* ---- metrics ---------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Memory from each worker's own order (memory is local to a worker), by the schedule
 * analysis (versions alive, units in flight and with full activations, per chunk, and slots:
 * schedule.h). A unit in flight holds its stage input (in_bytes); one with full activations
 * also the rest of stash_bytes; without recomputation every unit in flight is full. */
static void worker_memory(Engine *e, int rank, const SchedWorkerInfo *wi) {
    const Schedule *s = e->s;
    const SchedWorker *w = &s->workers[rank];
    SimMem *m = &e->r->mem[rank];
    memset(m, 0, sizeof *m);
    if (w->stage < 0) return;
    int nc = wi->n_chunks > 0 ? wi->n_chunks : 1, n = w->n;
    double params = 0;
    for (int k = 0; k < nc; k++) params += e->c->stage[w->stages ? w->stages[k] : w->stage].param_bytes;
    int *alive = malloc(((size_t)n + 1) * sizeof(int));
    int *fly = malloc(((size_t)n * nc + 1) * sizeof(int)), *full = malloc(((size_t)n * nc + 1) * sizeof(int));
    PD_ASSERT(alive && fly && full);
    sched_worker_counts_chunks(s, rank, wi, alive, fly, full);
    /* What the runtime allocates: each chunk (the worker's stage, or each of its interleaved
     * chunks) its own slots, its most units in flight + SCHED_SLOTS_AHEAD, each of that chunk's
     * size; recomputing, a slot keeps the input, the output until it is sent and the gradient
     * buffers, and the chunk's contexts (its most units with full activations, >= 1) the rest
     * with their own input (rt_worker.c, chunk_slots) */
    double alloc_act = 0, scratch = 0;
    for (int k = 0; k < nc; k++) {
        const SimStageCost *c = &e->c->stage[w->stages ? w->stages[k] : w->stage];
        if (c->scratch_bytes > scratch) scratch = c->scratch_bytes;
        int mi = 0, mf = 0;
        for (int i = 0; i < n; i++) {
            if (fly[(size_t)i * nc + k] > mi) mi = fly[(size_t)i * nc + k];
            if (full[(size_t)i * nc + k] > mf) mf = full[(size_t)i * nc + k];
        }
        int slots = mi + SCHED_SLOTS_AHEAD;
        alloc_act += s->recompute ? slots * (c->in_bytes + c->out_bytes + c->grad_bytes) + (mf > 0 ? mf : 1) * (c->stash_bytes - c->grad_bytes)
                                    : slots * c->stash_bytes;
    }
    double best = -1;
    for (int i = 0; i < n; i++) {
        double act = 0;
        for (int k = 0; k < nc; k++) {
            const SimStageCost *c = &e->c->stage[w->stages ? w->stages[k] : w->stage];
            int f = fly[(size_t)i * nc + k], g = full[(size_t)i * nc + k];
            act += s->recompute ? f * c->in_bytes + g * (c->stash_bytes - c->in_bytes) : f * c->stash_bytes;
        }
        double tot = alive[i] * params + act;
        if (tot > best) {
            best = tot;
            m->stashed = (alive[i] - 1) * params;
            m->activations = act;
        }
    }
    free(alive), free(fly), free(full);
    m->params = params;
    m->grads = params;
    m->opt_state = params * e->o->opt_state_factor;
    m->peak = m->params + m->grads + m->opt_state + m->stashed + m->activations;
    m->alloc_stashed = (wi->max_versions_alive - 1) * params;
    m->alloc_activations = alloc_act;
    m->alloc_predicted = e->o->predicts_weights ? wi->max_predicted * params : 0;
    m->scratch = scratch;
    m->allocated = m->params + m->grads + m->opt_state + m->alloc_stashed + m->alloc_activations + m->alloc_predicted +
                   m->scratch;
    e->r->max_inflight[rank] = wi->max_inflight;
    e->r->max_full[rank] = wi->max_full;
    e->r->worker_versions[rank] = wi->max_versions_alive;
    e->r->slots[rank] = wi->n_slots;
}

/* The smallest multiple p of period, at most half of the avail gaps between completions
 * done[lo..lo + avail], over which those gaps repeat (each within 1% of the mean gap of the one
 * p later); 0 when there is none. */
static long repeat_period(const double *done, int lo, long avail, long period) {
    if (avail < 2 || period < 1) return 0;
    double tol = 0.01 * (done[lo + avail] - done[lo]) / (double)avail;
    for (long p = period; 2 * p <= avail; p += period) {
        int ok = 1;
        for (long k = lo; ok && k + p + 1 <= lo + avail; k++)
            ok = fabs((done[k + 1] - done[k]) - (done[k + p + 1] - done[k + p])) <= tol;
        if (ok) return p;
    }
    return 0;
}

static void metrics(Engine *e) {
    const Schedule *s = e->s;
    SimResult *r = e->r;
    double mk = 0;
    for (int w = 0; w < s->n_ranks; w++)
        for (int i = 0; i < s->workers[w].n; i++)
            if (r->end[w][i] > mk) mk = r->end[w][i];
    r->makespan_s = mk;
    double sum = 0;
    int active = 0;
    for (int w = 0; w < s->n_ranks; w++) {
        r->busy_fraction[w] = mk > 0 ? e->ws[w].busy / mk : 0;
        if (s->workers[w].n) sum += r->busy_fraction[w], active++;
    }
    r->bubble_fraction = active ? 1 - sum / active : 0;
    /* completion of each minibatch: its last backward anywhere */
    int nm = s->n_minibatches;
    double *done = calloc((size_t)nm, sizeof(double));
    PD_ASSERT(done);
    for (int w = 0; w < s->n_ranks; w++)
        for (int i = 0; i < s->workers[w].n; i++) {
            const Instr *in = &s->workers[w].ins[i];
            if ((in->op != OP_BACKWARD && in->op != OP_BACKWARD_B && in->op != OP_BACKWARD_W) || in->mb < 0 ||
                in->mb >= s->n_units)
                continue;
            int k = in->mb / s->n_micro;
            if (r->end[w][i] > done[k]) done[k] = r->end[w][i];
        }
    qsort(done, (size_t)nm, sizeof(double), cmp_double);
    /* Steady state: the middle half of the completions, over a whole number of periods of
     * the pattern they repeat (repeat_period): the round-robin's (lcm of the replica counts;
     * replicas finish in bunches) at least, and the pipeline's own where it has one (4
     * workers sharing 2 cores finish vgg16's minibatches 20.7 and 66.8 ms apart in turn: a
     * window of 11 gaps read 41.6 ms for a pace of 43.75). Where the gaps do not repeat yet
     * within the window, the least-squares slope over it. */
    long period = 1;
    for (int i = 0; i < s->n_stages && period <= nm; i++) {
        long a = period, b = s->stages[i].replicas;
        while (b) {
            long t_ = a % b;
            a = b, b = t_;
        }
        period = period / a * s->stages[i].replicas;
    }
    int lo = nm / 4;
    long avail = nm - 1 - nm / 4 - lo;
    long rep = repeat_period(done, lo, avail, period);
    long span = rep ? avail / rep * rep : period <= nm && avail > 0 ? avail / period * period : 0;
    if (span <= 0 && period <= nm) lo = 0, span = (nm - 1) / period * period;
    double t = span > 0 ? (done[lo + span] - done[lo]) / (double)span : mk / nm;
    if (span > 1 && !rep) {   /* no pattern found (it is still settling): the least-squares slope,
                               * which an oscillation of the gaps moves far less than the ends do */
        double mx = lo + span / 2.0, my = 0, sxy = 0, sxx = 0;
        for (long k = lo; k <= lo + span; k++) my += done[k];
        my /= (double)(span + 1);
        for (long k = lo; k <= lo + span; k++) sxy += (k - mx) * (done[k] - my), sxx += (k - mx) * (k - mx);
        if (sxx > 0) t = sxy / sxx;
    }
    free(done);
    r->time_per_minibatch_s = t;
    r->time_per_unit_s = t / s->n_micro;
    r->minibatches_per_s = t > 0 ? 1 / t : 0;
    r->samples_per_s = t > 0 && e->o->samples_per_unit > 0 ? (double)e->o->samples_per_unit * s->n_micro / t : 0;
}

void sim_result_release(SimResult *r) {
    if (!r) return;
    free(r->times_);
    free(r->start);
    free(r->end);
    free(r->busy_fraction);
    free(r->slowdown);
    free(r->mem);
    free(r->max_inflight);
    free(r->max_full);
    free(r->wire_bytes);
    free(r->raw_bytes);
    free(r->worker_versions);
    free(r->slots);
    free(r->versions_alive);
    memset(r, 0, sizeof *r);
}

/* The CPU the network stack spends on worker w's messages between stages
 * (Cluster.net_cpu_per_byte x bytes), added to net[]: half of every send on w, half on its
 * receiver. All-reduces are left out: they block their workers and their link bounds them, so
 * their network CPU falls while their machine's compute waits (counted, it predicted `dp` at
 * 300 Mbit/s on the emulated cluster 1.8 times too slow). */
static void net_cpu(const Engine *e, int w, double *net) {
    const Schedule *s = e->s;
    const SchedWorker *sw = &s->workers[w];
    const double k = e->o->cluster->net_cpu_per_byte;
    for (int i = 0; i < sw->n; i++) {
        const Instr *in = &sw->ins[i];
        if ((in->op != OP_SEND_ACT && in->op != OP_SEND_GRAD) || in->peer < 0 || in->peer >= s->n_ranks) continue;
        if (in->peer == w) continue;   /* the V's turn stays in the worker */
        double bytes = send_bytes(e, sched_instr_stage(sw, in) + (in->op == OP_SEND_ACT));
        net[w] += 0.5 * k * bytes;
        net[in->peer] += 0.5 * k * bytes;
    }
}

int sim_run(const Schedule *s, const SimCosts *c, const SimOpts *o, SimResult *out, Err *err) {
    memset(out, 0, sizeof *out);
    if (c->n_stages != s->n_stages)
        return err_set(err, PD_EINVAL, "simulate: costs for %d stages, schedule has %d", c->n_stages, s->n_stages);
    if (s->n_ranks >= (1 << 20)) return err_set(err, PD_EINVAL, "simulate: %d ranks is too many", s->n_ranks);
    if (o->cluster)
        for (int l = 0; l < o->cluster->n_levels; l++)
            if (!(o->cluster->level[l].bandwidth > 0))
                return err_set(err, PD_EINVAL, "simulate: cluster level %d has bandwidth %g", l, o->cluster->level[l].bandwidth);
    SimResult *r = out;
    int W = s->n_ranks;
    r->n_ranks = W;
    r->start = calloc((size_t)W, sizeof(double *));
    r->end = calloc((size_t)W, sizeof(double *));
    r->busy_fraction = calloc((size_t)W, sizeof(double));
    r->slowdown = calloc((size_t)W + 1, sizeof(double));
    r->mem = calloc((size_t)W, sizeof(SimMem));
    r->max_inflight = calloc((size_t)W, sizeof(int));
    r->max_full = calloc((size_t)W, sizeof(int));
    r->worker_versions = calloc((size_t)W, sizeof(int));
    r->slots = calloc((size_t)W, sizeof(int));
    r->versions_alive = calloc((size_t)s->n_stages, sizeof(int));
    r->wire_bytes = calloc(2 * (size_t)s->n_stages, sizeof(double));
    r->raw_bytes = calloc(2 * (size_t)s->n_stages, sizeof(double));
    PD_ASSERT(r->wire_bytes && r->raw_bytes);
    PD_ASSERT(r->start && r->end && r->busy_fraction && r->slowdown && r->mem && r->max_inflight && r->max_full && r->worker_versions && r->slots &&
              r->versions_alive);
    size_t n_ins = 0;
    for (int w = 0; w < W; w++) n_ins += (size_t)s->workers[w].n;
    r->times_ = malloc((2 * n_ins + 1) * sizeof(double));   /* every slot is written */
    PD_ASSERT(r->times_);
    size_t off = 0;
    for (int w = 0; w < W; off += (size_t)s->workers[w].n, w++) {
        r->start[w] = r->times_ + off;
        r->end[w] = r->times_ + n_ins + off;
    }
    Engine e = {.s = s, .c = c, .o = o, .r = r, .ws = calloc((size_t)W, sizeof(WState)),
                .groups = calloc((size_t)s->n_stages, sizeof(Group)), .heap = malloc((size_t)W * sizeof(int) + sizeof(int)),
                .err = err};
    size_t cap = 1024;
    e.tab = calloc(cap, sizeof(Msg));
    e.tab_mask = cap - 1;
    e.links = calloc(2 * (size_t)W + 1, sizeof(LinkSet));
    PD_ASSERT(e.ws && e.groups && e.tab && e.heap && e.links);
    for (int g = 0; g < s->n_stages; g++) group_init(&e, g);
    if (o->cluster && o->cluster->cores_per_machine > 0 && o->cluster->n_levels > 0) {
        /* Workers that compute share their machine's cores as they compute (job_reshare): when
         * more compute at once than it has cores, each runs at cores / n of its speed
         * (docs/explanation/simulator.md, "Cores"). The network stack's CPU
         * (Cluster.net_cpu_per_byte, half of a transfer's on each end) rides on the compute of
         * the worker it serves: its compute instructions take (1 + its network CPU / its compute)
         * times as long on a core. */
        double *load = calloc((size_t)W + 1, sizeof(double)), *net = calloc((size_t)W + 1, sizeof(double));
        PD_ASSERT(load && net);
        for (int w = 0; w < W; w++)
            for (int i = 0; i < s->workers[w].n; i++) load[w] += compute_s(&e, &s->workers[w], i);
        if (o->cluster->net_cpu_per_byte > 0)
            for (int w = 0; w < W; w++) net_cpu(&e, w, net);
        e.shared = 1, e.per = o->cluster->level[0].workers, e.cores = o->cluster->cores_per_machine;
        for (int w = 0; w < W; w++) {
            e.ws[w].slow = (load[w] > 0 ? 1 + net[w] / load[w] : 1) / cluster_worker_speed(o->cluster, w);
        }
        free(load);
        free(net);
    } else {
        for (int w = 0; w < W; w++) e.ws[w].slow = r->slowdown[w] = 1.0 / cluster_worker_speed(o->cluster, w);
    }
    for (int w = 0; w < W; w++) ready_push(&e, w);
    int rc = PD_OK;
    for (;;) {   /* the earliest event next: a worker's next instruction, a transfer's or a compute's end */
        double tf, tj;
        int f = flow_next(&e, &tf), j = job_next(&e, &tj);
        if (e.n_heap && (f < 0 || e.ws[e.heap[0]].clock < tf) && (j < 0 || e.ws[e.heap[0]].clock < tj)) {
            if ((rc = run_worker(&e, ready_pop(&e)))) break;
        } else if (j >= 0 && (f < 0 || tj < tf || (tj == tf))) job_finish(&e, j, tj);
        else if (f >= 0) flow_finish(&e, f, tf);
        else break;
    }
    if (!rc)
        for (int w = 0; w < W; w++)
            if (e.ws[w].pc < s->workers[w].n) {
                rc = report_deadlock(&e);
                break;
            }
    if (!rc) {
        for (size_t i = 0; i <= e.tab_mask && !rc; i++)
            if (e.tab[i].state == MSG_POSTED) {
                const Msg *m = &e.tab[i];
                int kind = (int)(m->key >> 40), src = (int)(m->key >> 20 & 0xfffff), dst = (int)(m->key & 0xfffff);
                rc = err_set(err, PD_EINVAL, "worker %d instruction %d sends the %s of unit %d to worker %d, which never receives it",
                             src, m->sender_ins, kind ? "activation" : "gradient", m->mb, dst);
            }
    }
    if (!rc) {
        SchedAnalysis an;
        rc = sched_analyze(s, &an, err);
        if (!rc) {
            for (int w = 0; w < W; w++) worker_memory(&e, w, &an.workers[w]);
            memcpy(r->versions_alive, an.stage_versions, (size_t)s->n_stages * sizeof(int));
            sched_analysis_release(&an);
        }
    }
    if (!rc && e.shared)   /* the slowdown each worker's compute met: its wall time over its work */
        for (int w = 0; w < W; w++)
            r->slowdown[w] = e.ws[w].job_work_total > 0 ? e.ws[w].busy * e.ws[w].slow / e.ws[w].job_work_total : e.ws[w].slow;
    if (!rc) metrics(&e);
    free(e.ws);
    free(e.groups);
    free(e.tab);
    free(e.heap);
    for (int l = 0; l < 2 * W; l++) free(e.links[l].ids);
    free(e.links);
    for (int k = 0; k < e.n_fl; k++) free(e.fl[k].q);
    free(e.fl), free(e.free_fl), free(e.fh), free(e.comp), free(e.lq), free(e.jh);
    if (rc) sim_result_release(r);
    return rc;
}

/* ---- reports ---------------------------------------------------------------------- */

void sim_print_json(const Schedule *s, const SimResult *r, FILE *f) {
    fprintf(f, "{\n  \"schedule\": \"%s\",\n  \"minibatches\": %d,\n  \"microbatches\": %d,\n  \"vertical_sync\": %s,\n",
            sched_kind_name(s->kind), s->n_minibatches, s->n_micro, s->vertical_sync ? "true" : "false");
    fprintf(f, "  \"workers\": %d,\n  \"stages\": %d,\n", s->n_ranks, s->n_stages);
    fprintf(f, "  \"chunks\": %d,\n  \"recompute\": %s,\n", s->n_chunks > 0 ? s->n_chunks : 1, s->recompute ? "true" : "false");
    fprintf(f, "  \"makespan_s\": %.9g,\n  \"time_per_minibatch_s\": %.9g,\n  \"time_per_unit_s\": %.9g,\n", r->makespan_s,
            r->time_per_minibatch_s, r->time_per_unit_s);
    fprintf(f, "  \"minibatches_per_s\": %.9g,\n  \"samples_per_s\": %.9g,\n  \"bubble_fraction\": %.6f,\n",
            r->minibatches_per_s, r->samples_per_s, r->bubble_fraction);
    fprintf(f, "  \"messages\": %d,\n", r->n_messages);
    double raw = 0, sent = 0;
    fprintf(f, "  \"boundaries\": [");   /* the bytes across each boundary, each way */
    for (int b = 0; b + 1 < s->n_stages; b++) {
        const double *x = &r->wire_bytes[2 * b], *y = &r->raw_bytes[2 * b];
        fprintf(f, "%s{\"boundary\": %d, \"act_bytes\": %.0f, \"act_ratio\": %.6g, \"grad_bytes\": %.0f, \"grad_ratio\": %.6g}",
                b ? ", " : "", b, x[0], x[0] > 0 ? y[0] / x[0] : 1.0, x[1], x[1] > 0 ? y[1] / x[1] : 1.0);
        raw += y[0] + y[1], sent += x[0] + x[1];
    }
    fprintf(f, "],\n  \"wire_ratio\": %.6g,\n", sent > 0 ? raw / sent : 1.0);
    fprintf(f, "  \"stage_warmup\": [");
    for (int i = 0; i < s->n_stages; i++) fprintf(f, "%s%d", i ? ", " : "", s->stages[i].warmup);
    fprintf(f, "],\n  \"stage_versions_alive\": [");
    for (int i = 0; i < s->n_stages; i++) fprintf(f, "%s%d", i ? ", " : "", r->versions_alive[i]);
    fprintf(f, "],\n  \"per_worker\": [\n");
    for (int w = 0; w < s->n_ranks; w++) {
        const SimMem *m = &r->mem[w];
        fprintf(f,
                "    {\"rank\": %d, \"stage\": %d, \"busy_fraction\": %.6f, \"max_inflight\": %d, \"peak_memory_bytes\": %.0f, "
                "\"params_bytes\": %.0f, \"grads_bytes\": %.0f, \"optimizer_bytes\": %.0f, \"stashed_weights_bytes\": %.0f, "
                "\"activations_bytes\": %.0f, \"versions\": %d, \"slots\": %d, \"scratch_bytes\": %.0f, \"allocated_bytes\": %.0f, "
                "\"max_full\": %d}%s\n",
                w, s->workers[w].stage, r->busy_fraction[w], r->max_inflight[w], m->peak, m->params, m->grads, m->opt_state,
                m->stashed, m->activations, r->worker_versions[w], r->slots[w], m->scratch, m->allocated, r->max_full[w],
                w + 1 < s->n_ranks ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
}

void sim_print_summary(const Schedule *s, const SimResult *r, FILE *f) {
    char ch[48] = "";
    if (s->n_chunks > 1) snprintf(ch, sizeof ch, " (%d per worker)", s->n_chunks);
    fprintf(f, "schedule %s: %d minibatches x %d micro-batches, %d workers, %d stages%s%s%s\n", sched_kind_name(s->kind),
            s->n_minibatches, s->n_micro, s->n_ranks, s->n_stages, ch, s->vertical_sync ? ", vertical sync" : "",
            s->recompute ? ", recomputation" : "");
    fprintf(f, "time per minibatch %.6g s (steady state), %.6g minibatches/s", r->time_per_minibatch_s, r->minibatches_per_s);
    if (r->samples_per_s > 0) fprintf(f, ", %.6g samples/s", r->samples_per_s);
    fprintf(f, "\nmakespan %.6g s, bubble fraction %.3f\n", r->makespan_s, r->bubble_fraction);
    double raw = 0, sent = 0;
    for (int b = 0; b + 1 < s->n_stages; b++)
        raw += r->raw_bytes[2 * b] + r->raw_bytes[2 * b + 1], sent += r->wire_bytes[2 * b] + r->wire_bytes[2 * b + 1];
    if (sent > 0 && raw != sent) {   /* a codec on the wire: the bytes across each boundary */
        fprintf(f, "wire: %.3g of fp32's bytes (%.3gx less)", sent / raw, raw / sent);
        for (int b = 0; b + 1 < s->n_stages; b++)
            fprintf(f, "; boundary %d %.1f MiB activations, %.1f MiB gradients", b, r->wire_bytes[2 * b] / 1048576.0,
                    r->wire_bytes[2 * b + 1] / 1048576.0);
        fprintf(f, "\n");
    }
    int worst = 0;
    for (int w = 1; w < s->n_ranks; w++)
        if (r->mem[w].peak > r->mem[worst].peak) worst = w;
    if (s->n_ranks > 0)
        fprintf(f, "peak memory %.1f MiB (worker %d: activations %.1f MiB, weights, gradients, optimizer state and "
                   "stashes %.1f MiB; allocated up front %.1f MiB)\n",
                r->mem[worst].peak / 1048576.0, worst, r->mem[worst].activations / 1048576.0,
                (r->mem[worst].peak - r->mem[worst].activations) / 1048576.0, r->mem[worst].allocated / 1048576.0);
    fprintf(f, "%6s %5s %6s %9s %9s %12s %12s\n", "worker", "stage", "busy", "inflight", "versions", "activ_MiB", "peak_MiB");
    int shown = 0;
    for (int w = 0; w < s->n_ranks; w++) {
        if (shown == 32) {
            fprintf(f, "... %d more workers (see --json)\n", s->n_ranks - shown);
            break;
        }
        int st = s->workers[w].stage;
        fprintf(f, "%6d %5d %6.3f %9d %9d %12.1f %12.1f\n", w, st, r->busy_fraction[w], r->max_inflight[w],
                st >= 0 ? r->versions_alive[st] : 0, r->mem[w].activations / 1048576.0, r->mem[w].peak / 1048576.0);
        shown++;
    }
}
