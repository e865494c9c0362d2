/* search.c: the schedule search (search.h, docs/explanation/planner.md "Choosing the schedule"): candidate
 * partitions from plan_enumerate or the partitioner, every applicable kind, micro-batch count
 * and recomputation setting on each, scored by the simulator; the fastest that fits wins. */
#include "search.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_KINDS                                                                                                  \
    (1u << SCHED_1F1B | 1u << SCHED_GPIPE | 1u << SCHED_1F1B_FLUSH | 1u << SCHED_2BW | 1u << SCHED_DP |                \
     1u << SCHED_ZB_H1 | 1u << SCHED_ZB_H2 | 1u << SCHED_INTERLEAVED | 1u << SCHED_ZB_V | 1u << SCHED_V_HALF |     \
     1u << SCHED_V_MIN | 1u << SCHED_DUALPIPE_V)
#define V_KINDS (1u << SCHED_ZB_V | 1u << SCHED_V_HALF | 1u << SCHED_V_MIN | 1u << SCHED_DUALPIPE_V)

/* The plans a kind runs: the V kinds V-placed ones, interleaved round-robin ones with chunks, the
 * others one stage per worker. */
static int kind_runs_plan(SchedKind k, const Plan *p) {
    if (sched_kind_v(k)) return p->v_shape;
    if (k == SCHED_INTERLEAVED) return p->chunks > 1 && !p->v_shape;
    return p->chunks <= 1;
}

static long lcm_replicas(const Plan *p) {
    long period = 1;
    for (int i = 0; i < p->n_stages && period <= 64; i++) {
        long a = period, b = p->stages[i].replicas;
        while (b) {
            long t = a % b;
            a = b, b = t;
        }
        period = period / a * p->stages[i].replicas;
    }
    return period;
}

/* Runs p under (kind, n_micro, recompute) as the search does; fills out and, given why, the
 * per-unit breakdown of the run (search.h). */
static int score(const Plan *p, const Profile *prof, const Cluster *cl, SchedKind kind, int n_micro, int recompute,
                 int inflight, double opt_state_factor, SearchCand *out, SearchWhy *why, Err *err) {
    memset(out, 0, sizeof *out);
    if (why) memset(why, 0, sizeof *why);
    long period = lcm_replicas(p);
    int W = p->n_workers, n_mb;
    if (kind == SCHED_1F1B || kind == SCHED_DP || kind == SCHED_MP) n_mb = (int)(4 * W + 8 > 4 * period ? 4 * W + 8 : 4 * period);
    else if (kind == SCHED_2BW) n_mb = 4;
    else n_mb = (int)(2 * period > 4 ? 2 * period : 4);   /* flush kinds: a whole number of round-robin periods */
    if (n_mb > 256) n_mb = 256;
    if (inflight > 0 && n_mb < (8 * inflight + 16) / n_micro + 8) n_mb = (8 * inflight + 16) / n_micro + 8;   /* past the fill */
    SchedOpts so = {.kind = kind, .n_minibatches = n_mb, .n_micro = n_micro, .recompute = recompute, .inflight = inflight};
    Schedule s;
    SimCosts c = {0, NULL};
    SimResult r;
    memset(&r, 0, sizeof r);
    int rc = sched_build(p, &so, &s, err);
    if (rc) return rc;
    if (!(rc = sim_costs_from_profile(&s, prof, &c, err))) {
        /* the plan's activation compression (plan --wire bf16: 2) shrinks what crosses its links */
        double ac = p->opts.activation_compression;
        SimOpts o = {.cluster = cl, .opt_state_factor = opt_state_factor > 0 ? opt_state_factor : 1,
                     .samples_per_unit = prof->minibatch, .wire_factor = ac > 0 ? 1.0 / ac : 1.0};
        rc = sim_run(&s, &c, &o, &r, err);
    }
    if (!rc) {
        out->plan = p;
        out->kind = kind;
        out->n_micro = n_micro;
        out->recompute = recompute;
        out->inflight = inflight;
        out->minibatch_s = r.time_per_minibatch_s;
        out->unit_s = r.time_per_unit_s;
        out->bubble = r.bubble_fraction;
        for (int w = 0; w < r.n_ranks; w++) {
            if (r.mem[w].peak > out->peak_bytes) out->peak_bytes = r.mem[w].peak;
            if (r.mem[w].allocated > out->alloc_bytes) out->alloc_bytes = r.mem[w].allocated;
        }
        out->fits = 1;
    }
    if (!rc && why) {   /* each worker's compute, all-reduce and sends, summed over the run, per unit */
        int n_ev = 0, R = r.n_ranks;
        TraceEvent *ev = sim_events(&s, &r, &n_ev);
        double *sum = calloc((size_t)R * 3, sizeof(double));
        PD_ASSERT(sum);
        for (int i = 0; i < n_ev; i++) {
            int k = ev[i].kind, w = ev[i].worker, col = k == TRACE_ALLREDUCE ? 1 : k == TRACE_SEND ? 2 : 0;
            if (w < 0 || w >= R || k == TRACE_RECV_WAIT) continue;
            sum[3 * w + col] += ev[i].end - ev[i].start;
        }
        double units = s.n_units > 0 ? s.n_units : 1, busy = -1;
        why->unit_s = r.time_per_unit_s;
        why->link_worker = why->ar_worker = -1;
        for (int w = 0; w < R; w++) {
            double cw = sum[3 * w] / units, aw = sum[3 * w + 1] / units, lw = sum[3 * w + 2] / units;
            if (cw + aw > busy) busy = cw + aw, why->worker = w, why->compute_s = cw, why->allreduce_s = aw;
            if (lw > why->link_s) why->link_s = lw, why->link_worker = w;
            if (aw > why->ar_s) why->ar_s = aw, why->ar_worker = w;
        }
        why->stage = plan_stage_of_rank(p, why->worker, NULL);
        why->link_stage = why->link_worker >= 0 ? plan_stage_of_rank(p, why->link_worker, NULL) : -1;
        why->ar_stage = why->ar_worker >= 0 ? plan_stage_of_rank(p, why->ar_worker, NULL) : -1;
        why->slowdown = r.slowdown ? r.slowdown[why->worker] : 1;
        double held = busy > why->link_s ? busy : why->link_s;
        why->idle_s = why->unit_s > held ? why->unit_s - held : 0;
        /* the largest part of the time per unit */
        double part[4] = {why->compute_s, why->allreduce_s, why->link_s, why->idle_s};
        int b = 0;
        for (int i = 1; i < 4; i++)
            if (part[i] > part[b]) b = i;
        why->bottleneck = (SearchBottleneck)b;
        free(sum);
        free(ev);
    }
    sim_result_release(&r);
    sim_costs_release(&c);
    sched_release(&s);
    return rc;
}

int plan_search_score(const Plan *p, const Profile *prof, const Cluster *cl, SchedKind kind, int n_micro, int recompute,
                      double opt_state_factor, SearchCand *out, Err *err) {
    return score(p, prof, cl, kind, n_micro, recompute, 0, opt_state_factor, out, NULL, err);
}

int plan_search_why(const Plan *p, const Profile *prof, const Cluster *cl, SchedKind kind, int n_micro, int recompute,
                    double opt_state_factor, SearchWhy *out, Err *err) {
    SearchCand c;
    return score(p, prof, cl, kind, n_micro, recompute, 0, opt_state_factor, &c, out, err);
}

int plan_search_depth(const Plan *p, const Profile *prof, const Cluster *cl, int n_micro, double opt_state_factor,
                      double memory_limit, double tol, SearchCand *out, Err *err) {
    /* NOAM, then depths by growing steps, each scored; the smallest near the best that fits wins */
    int noam = p->noam > 0 ? p->noam : 1;
    static const int more[] = {0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64};
    enum { N = sizeof more / sizeof more[0] };
    SearchCand c[N];
    int n = 0, best = -1, rc;
    for (int k = 0; k < N; k++) {
        if ((rc = score(p, prof, cl, SCHED_1F1B, n_micro, 0, k ? noam + more[k] : 0, opt_state_factor, &c[n], NULL, err)))
            return rc;
        c[n].fits = !(memory_limit > 0) || c[n].peak_bytes <= memory_limit;
        if (!c[n].fits && k) break;   /* deeper only holds more */
        if (c[n].fits && (best < 0 || c[n].unit_s < c[best].unit_s)) best = n;
        n++;
    }
    if (best < 0) best = 0;
    int pick = best;
    for (int k = 0; k < n; k++)
        if (c[k].fits && c[k].unit_s <= c[best].unit_s * (1 + tol)) {
            pick = k;
            break;
        }
    *out = c[pick];
    return PD_OK;
}

/* Same stages, layers and replicas (and chunks and their placement): the same partition. */
int plan_same_partition(const Plan *a, const Plan *b) {
    if (a->n_stages != b->n_stages || a->chunks != b->chunks || a->v_shape != b->v_shape) return 0;
    for (int i = 0; i < a->n_stages; i++) {
        const PlanStage *x = &a->stages[i], *y = &b->stages[i];
        if (x->n_layers != y->n_layers || x->replicas != y->replicas ||
            memcmp(x->layers, y->layers, (size_t)x->n_layers * sizeof(int)))
            return 0;
    }
    return 1;
}

/* FNV-1a over the stage count, chunks, and each stage's replicas and layers. */
uint64_t plan_partition_hash(const Plan *p) {
    uint64_t h = 1469598103934665603ull;
#define MIX(v) (h = (h ^ (uint64_t)(uint32_t)(v)) * 1099511628211ull)
    MIX(p->n_stages);
    MIX(p->chunks);
    if (p->v_shape) MIX(-1);   /* plans without the V hash as before */
    for (int i = 0; i < p->n_stages; i++) {
        const PlanStage *x = &p->stages[i];
        MIX(x->n_layers);
        MIX(x->replicas);
        for (int l = 0; l < x->n_layers; l++) MIX(x->layers[l]);
    }
#undef MIX
    return h;
}

typedef struct Parts {
    Plan **p;
    uint64_t *key;   /* plan_partition_hash of each */
    int n, cap;
} Parts;

static void parts_add(Parts *ps, Plan *p) {
    if (!p) return;
    uint64_t k = plan_partition_hash(p);
    for (int i = 0; i < ps->n; i++)
        if (ps->key[i] == k && plan_same_partition(ps->p[i], p)) {
            plan_free(p);
            return;
        }
    if (ps->n == ps->cap) {
        ps->cap = ps->cap ? 2 * ps->cap : 16;
        ps->p = realloc(ps->p, (size_t)ps->cap * sizeof *ps->p);
        ps->key = realloc(ps->key, (size_t)ps->cap * sizeof *ps->key);
        PD_ASSERT(ps->p && ps->key);
    }
    ps->key[ps->n] = k;
    ps->p[ps->n++] = p;
}

/* A schedule's bytes per worker of a stage, as the partitioner sees it (PlanOpts.stage_memory):
 * w = ceil(workers from the stage on / r) is its 1F1B warm-up, m = ceil(M / r) its
 * micro-batches per minibatch, d = W - w the weight passes zb defers (exact on straight
 * pipelines). Units in flight: 1f1b, 2bw w; 1f1b-flush min(w, m); gpipe m; zb-h1
 * min(w + d, m); zb-h2 min(2w - 1 + d, m). Weight versions: 1f1b w, 2bw 2, else 1. Units with
 * full activations: all in flight, or recomputing 1 (zb: d + 1). Bytes: parameters x (2 +
 * optimizer state + versions - 1) + in flight x the stage input + full x its outputs, as the
 * simulator counts them (SimMem.peak); the simulator has the last word. */
typedef struct MemModel {
    SchedKind kind;
    int M, rc, W;
    double opt;
} MemModel;

static double model_memory(const void *ctx, int from, int r, double act, double par, double in) {
    const MemModel *m = ctx;
    int w = (from + r - 1) / r, per = (m->M + r - 1) / r, d = m->W - w > 0 ? m->W - w : 0;
    int fly = w, versions = 1, zb = m->kind == SCHED_ZB_H1 || m->kind == SCHED_ZB_H2;
    switch (m->kind) {
    case SCHED_1F1B: versions = w; break;
    case SCHED_2BW: versions = 2; break;
    case SCHED_GPIPE: fly = per; break;
    case SCHED_1F1B_FLUSH: fly = w < per ? w : per; break;
    case SCHED_ZB_H1: fly = w + d < per ? w + d : per; break;
    case SCHED_ZB_H2: fly = 2 * w - 1 + d < per ? 2 * w - 1 + d : per; break;
    default: break;
    }
    int full = !m->rc ? fly : zb ? (d + 1 < fly ? d + 1 : fly) : 1;
    return par * (2 + m->opt + versions - 1) + fly * in + full * act;
}

/* The partitioner's plan for opts (NULL when it finds none: not an error here); mm: the
 * memory rule under the limit (NULL: the partitioner's 1F1B stash rule). */
static Plan *dp_plan(const Profile *prof, const Cluster *cl, const PlanOpts *base, int straight, double limit, int chunks,
                     const MemModel *mm) {
    PlanOpts o = *base;
    o.cost_model = COST_OURS;
    o.straight = straight;
    o.allow_idle = 0;
    o.memory_limit = limit;
    o.chunks = chunks < 0 ? 2 : chunks;   /* -1: the V placement */
    o.v_shape = chunks < 0;
    if (mm) o.stage_memory = model_memory, o.stage_memory_ctx = mm;
    Err e = {0};
    return plan_new(prof, cl, &o, &e);
}

/* Candidate a is better than b: faster, then less memory (strict, so the first found wins ties). */
static int better(const SearchCand *a, const SearchCand *b) {
    if (!b->plan) return 1;
    if (a->unit_s < b->unit_s * (1 - 1e-12)) return 1;
    if (a->unit_s > b->unit_s * (1 + 1e-12)) return 0;
    return a->peak_bytes < b->peak_bytes;
}

int plan_search(const Profile *prof, const Cluster *cl, const SearchOpts *o, SearchResult *out, Err *err) {
    memset(out, 0, sizeof *out);
    if (cluster_check(cl, err)) return PD_EINVAL;
    if (!(o->memory_limit >= 0)) return err_set(err, PD_EINVAL, "memory limit must be >= 0 bytes");
    unsigned kinds = o->kinds ? o->kinds : DEFAULT_KINDS;
    int W = cluster_total_workers(cl), maxV = o->max_chunks ? o->max_chunks : 4;
    int limit = o->exhaustive ? o->exhaustive : 2000;
    int micro[8] = {1, 2, 4}, nm = 3;
    if (o->n_micro > 0) {
        nm = o->n_micro < 8 ? o->n_micro : 8;
        memcpy(micro, o->micro, (size_t)nm * sizeof(int));
    }
    Parts ps = {0};
    /* 1. partitions: the partitioner's plan first (the baseline) */
    Plan *base = dp_plan(prof, cl, &o->plan, 0, 0, 0, NULL);
    if (!base) {
        Err e = {0};
        PlanOpts po = o->plan;
        po.cost_model = COST_OURS;
        po.allow_idle = po.straight = po.chunks = 0;
        po.memory_limit = 0;
        plan_free(plan_new(prof, cl, &po, &e));   /* for its message */
        return err_set(err, PD_EINVAL, "%s", e.msg[0] ? e.msg : "the partitioner found no plan");
    }
    parts_add(&ps, base);
    int exhaustive = limit > 0;
    if (exhaustive) {
        for (int V = 1; V <= maxV && exhaustive; V++) {
            if (V > 1 && (!(kinds >> SCHED_INTERLEAVED & 1) || W < 2)) break;
            PlanOpts po = o->plan;
            po.cost_model = COST_OURS;
            po.straight = 0;
            po.chunks = V > 1 ? V : 0;
            Plan **all = NULL;
            int n = 0;
            Err e = {0};
            int rc = plan_enumerate(prof, cl, &po, limit, &all, &n, &e);
            if (rc) {
                if (V == 1) exhaustive = 0;   /* too many plain plans: the partitioner's */
                if (V > 1) break;             /* too many interleaved ones: stop at fewer chunks */
                continue;
            }
            for (int i = 0; i < n; i++) parts_add(&ps, all[i]);
            free(all);
        }
        if (exhaustive && (kinds & V_KINDS) && W >= 2) {   /* the V placement of 2 W stages */
            PlanOpts po = o->plan;
            po.cost_model = COST_OURS;
            po.straight = 0;
            po.chunks = 2, po.v_shape = 1;
            Plan **all = NULL;
            int n = 0;
            Err e = {0};
            if (!plan_enumerate(prof, cl, &po, limit, &all, &n, &e)) {
                for (int i = 0; i < n; i++) parts_add(&ps, all[i]);
                free(all);
            } else {
                parts_add(&ps, dp_plan(prof, cl, &o->plan, 0, 0, -1, NULL));
            }
        }
    }
    if (!exhaustive) {
        parts_add(&ps, dp_plan(prof, cl, &o->plan, 1, 0, 0, NULL));
        if (o->memory_limit > 0) {
            /* the partitioner under each schedule's own memory rule, replicated and straight */
            for (int k = 0; k < SCHED_COUNT; k++) {
                if (!(kinds >> k & 1) || k == SCHED_DP || k == SCHED_INTERLEAVED || sched_kind_v((SchedKind)k)) continue;
                int nmk = sched_kind_microbatched((SchedKind)k) ? nm : 1;
                for (int mi = 0; mi < nmk; mi++)
                    for (int rc = 0; rc < 2; rc++) {
                        if ((o->recompute == 1 && rc) || (o->recompute == 2 && !rc)) continue;
                        MemModel mm = {(SchedKind)k, sched_kind_microbatched((SchedKind)k) ? micro[mi] * W : 1, rc, W,
                                       o->opt_state_factor > 0 ? o->opt_state_factor : 1};
                        parts_add(&ps, dp_plan(prof, cl, &o->plan, 0, o->memory_limit, 0, &mm));
                        parts_add(&ps, dp_plan(prof, cl, &o->plan, 1, o->memory_limit, 0, &mm));
                    }
            }
        }
        if (kinds >> SCHED_INTERLEAVED & 1)
            for (int V = 2; V <= maxV; V++) parts_add(&ps, dp_plan(prof, cl, &o->plan, 0, 0, V, NULL));
        if ((kinds & V_KINDS) && W >= 2) parts_add(&ps, dp_plan(prof, cl, &o->plan, 0, 0, -1, NULL));
    }
    out->parts = ps.p;
    out->n_parts = ps.n;
    free(ps.key);
    out->exhaustive = exhaustive;
    out->memory_limit = o->memory_limit;
    /* 2. every applicable (kind, micro-batches, recompute) on every partition */
    int cap_all = 0;
    for (int pi = 0; pi < ps.n; pi++) {
        const Plan *p = ps.p[pi];
        for (int k = 0; k < SCHED_COUNT; k++) {
            if (!(kinds >> k & 1)) continue;
            SchedKind kind = (SchedKind)k;
            if (!kind_runs_plan(kind, p)) continue;
            if (kind == SCHED_DP && pi > 0) continue;   /* dp ignores the partition */
            int nmk = sched_kind_microbatched(kind) ? nm : 1;
            for (int mi = 0; mi < nmk; mi++) {
                int M = sched_kind_microbatched(kind) ? micro[mi] * p->n_workers : 1;
                for (int rc = 0; rc < 2; rc++) {
                    if ((o->recompute == 1 && rc) || (o->recompute == 2 && !rc)) continue;
                    SearchCand c;
                    Err e = {0};
                    if (plan_search_score(p, prof, cl, kind, M, rc, o->opt_state_factor, &c, &e)) continue;
                    c.part = pi;
                    c.fits = !(o->memory_limit > 0) || c.peak_bytes <= o->memory_limit;
                    out->n_candidates++;
                    out->n_fit += c.fits;
                    if (out->n_candidates > cap_all) {
                        cap_all = cap_all ? 2 * cap_all : 64;
                        out->all = realloc(out->all, (size_t)cap_all * sizeof *out->all);
                        PD_ASSERT(out->all);
                    }
                    out->all[out->n_candidates - 1] = c;
                    if (better(&c, &out->fastest)) out->fastest = c;
                    if (pi == 0 && kind == SCHED_1F1B && !rc) out->baseline = c;
                    if (c.fits && better(&c, &out->best)) out->best = c;
                }
            }
        }
    }
    out->found = out->best.plan != NULL;
    /* 3. the runner-up: the fastest fitting candidate of another kind or recomputation setting */
    for (int i = 0; out->found && i < out->n_candidates; i++) {
        const SearchCand *c = &out->all[i];
        if (c->fits && (c->kind != out->best.kind || c->recompute != out->best.recompute) && better(c, &out->runner_up))
            out->runner_up = *c;
    }
    return PD_OK;
}

void plan_search_release(SearchResult *r) {
    if (!r) return;
    for (int i = 0; i < r->n_parts; i++) plan_free(r->parts[i]);
    free(r->parts);
    free(r->all);
    memset(r, 0, sizeof *r);
}

void plan_search_shape(const Plan *p, char *buf, size_t n) {
    if (p->chunks > 1) {
        int d = p->stages[0].replicas;
        const char *v = p->v_shape ? " in a V" : "";
        if (d > 1) snprintf(buf, n, "%d stages, %d per worker%s, %d pipelines", p->n_stages, p->chunks, v, d);
        else snprintf(buf, n, "%d stages, %d per worker%s", p->n_stages, p->chunks, v);
        return;
    }
    int k = snprintf(buf, n, "%d stage%s", p->n_stages, p->n_stages == 1 ? "" : "s");
    int repl = 0;
    for (int i = 0; i < p->n_stages; i++) repl |= p->stages[i].replicas > 1;
    if (!repl) return;
    k += snprintf(buf + k, n - (size_t)k, " (replicas");
    for (int i = 0; i < p->n_stages && k < (int)n - 8; i++) k += snprintf(buf + k, n - (size_t)k, "%s%d", i ? "+" : " ", p->stages[i].replicas);
    snprintf(buf + k, n - (size_t)k, ")");
}

/* "zb-h1 + recompute, 8 micro-batches (synchronous) on 4 stages: 12.3456 ms per unit, bubble
 * 0.111, peak 3.2 GB per worker" */
static void describe(const SearchCand *c, char *buf, size_t n) {
    char sh[96], mi[32] = "";
    plan_search_shape(c->plan, sh, sizeof sh);
    if (c->kind != SCHED_1F1B && c->kind != SCHED_DP && c->kind != SCHED_MP) snprintf(mi, sizeof mi, ", %d micro-batches", c->n_micro);
    int async = c->kind == SCHED_1F1B || c->kind == SCHED_2BW;
    snprintf(buf, n, "%s%s%s (%s) on %s: %.4f ms per unit, bubble %.3f, peak %.4g GB per worker", sched_kind_name(c->kind),
             c->recompute ? " + recompute" : "", mi, async ? "asynchronous, stashed weights" : "synchronous",
             c->kind == SCHED_DP ? "every worker" : sh, c->unit_s * 1e3, c->bubble, c->peak_bytes / 1e9);
}

/* " (4.5% slower)" or " (as fast, more memory)". */
static void slower(const SearchCand *a, const SearchCand *best, char *buf, size_t n) {
    double d = 100 * (a->unit_s / best->unit_s - 1);
    if (d < 0.05) snprintf(buf, n, " (as fast; %s memory)", a->peak_bytes > best->peak_bytes ? "more" : "no less");
    else snprintf(buf, n, " (%.1f%% slower)", d);
}

void plan_search_print(const SearchResult *r, FILE *f) {
    char a[384], d[64];
    fprintf(f, "schedule search: %d partition%s (%s), %d candidates, %d fit", r->n_parts, r->n_parts == 1 ? "" : "s",
            r->exhaustive ? "every plan" : "the partitioner's, also under each schedule's memory rule", r->n_candidates,
            r->n_fit);
    if (r->memory_limit > 0) fprintf(f, " in %.4g GB per worker (simulated peak)", r->memory_limit / 1e9);
    fputc('\n', f);
    if (!r->found) {
        if (r->fastest.plan) {
            describe(&r->fastest, a, sizeof a);
            fprintf(f, "nothing fits; the fastest candidate: %s\n", a);
        }
        return;
    }
    describe(&r->best, a, sizeof a);
    fprintf(f, "choice: %s\n", a);
    if (r->runner_up.plan) {
        describe(&r->runner_up, a, sizeof a);
        slower(&r->runner_up, &r->best, d, sizeof d);
        fprintf(f, "runner-up: %s%s\n", a, d);
    } else {
        fprintf(f, "runner-up: nothing of another kind or recomputation setting fits\n");
    }
    if (r->fastest.plan && !r->fastest.fits) {
        describe(&r->fastest, a, sizeof a);
        fprintf(f, "gave up: %s - over the limit of %.4g GB; the choice takes %.1f%% longer per unit\n", a,
                r->memory_limit / 1e9, 100 * (r->best.unit_s / r->fastest.unit_s - 1));
    }
    int same_as_fastest = r->baseline.plan == r->fastest.plan && r->baseline.kind == r->fastest.kind &&
                          r->baseline.recompute == r->fastest.recompute && !r->fastest.fits;
    if (same_as_fastest) fprintf(f, "(that is 1f1b on the partitioner's plan)\n");
    else if (r->baseline.plan && (r->baseline.plan != r->best.plan || r->best.kind != SCHED_1F1B || r->best.recompute)) {
        describe(&r->baseline, a, sizeof a);
        fprintf(f, "baseline, 1f1b on the partitioner's plan: %s%s\n", a, r->baseline.fits ? "" : " - does not fit");
    }
}

void plan_search_print_all(const SearchResult *r, FILE *f) {
    fprintf(f, "%-5s %-28s %-12s %6s %9s %12s %10s %6s %s\n", "part", "shape", "kind", "micro", "recompute", "ms/unit",
            "peak GB", "fits", "stage layers");
    for (int i = 0; i < r->n_candidates; i++) {
        const SearchCand *c = &r->all[i];
        char sh[96], ly[160];
        plan_search_shape(c->plan, sh, sizeof sh);
        int k = 0;
        ly[0] = 0;
        for (int s = 0; s < c->plan->n_stages && k < (int)sizeof ly - 16; s++)
            k += snprintf(ly + k, sizeof ly - (size_t)k, "%s%d", s ? "|" : "", c->plan->stages[s].n_layers);
        fprintf(f, "%-5d %-28s %-12s %6d %9s %12.4f %10.4g %6s %s\n", c->part, sh, sched_kind_name(c->kind), c->n_micro,
                c->recompute ? "yes" : "no", c->unit_s * 1e3, c->peak_bytes / 1e9, c->fits ? "yes" : "no", ly);
    }
}
