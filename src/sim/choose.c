/* choose.c: `pipedream plan`'s final choice (choose.h): the partitioner's candidates, each
 * scored by the simulator under the schedule the plan will run; the fastest that fits wins. */
#include "choose.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct Cands {
    ChooseCand *c;
    uint64_t *key;   /* plan_partition_hash of each, for add (valid until the candidates are sorted) */
    int n, cap;
} Cands;

/* Appends p (taking it) as a candidate. */
static void push(Cands *cs, Plan *p, const char *source, int enumerated) {
    if (cs->n == cs->cap) {
        cs->cap = cs->cap ? 2 * cs->cap : 16;
        cs->c = realloc(cs->c, (size_t)cs->cap * sizeof *cs->c);
        cs->key = realloc(cs->key, (size_t)cs->cap * sizeof *cs->key);
        PD_ASSERT(cs->c && cs->key);
    }
    cs->key[cs->n] = plan_partition_hash(p);
    ChooseCand *c = &cs->c[cs->n++];
    memset(c, 0, sizeof *c);
    c->plan = p;
    c->enumerated = enumerated;
    snprintf(c->source, sizeof c->source, "%s", source);
}

/* Adds p (taking it) unless it is NULL or a partition already proposed. */
static void add(Cands *cs, Plan *p, const char *source) {
    if (!p) return;
    uint64_t k = plan_partition_hash(p);
    for (int i = 0; i < cs->n; i++)
        if (cs->key[i] == k && plan_same_partition(cs->c[i].plan, p)) {
            plan_free(p);
            return;
        }
    push(cs, p, source, 0);
}

/* Data parallelism as a plan: one stage of every layer, a replica on each worker; our cost
 * model's figures from the partitioner's plan. */
static Plan *data_parallel(const Plan *base, const Profile *prof) {
    int W = cluster_total_workers(&base->cluster);
    Plan *p = calloc(1, sizeof *p);
    PD_ASSERT(p);
    *p = *base;
    p->n_stages = 1;
    p->stages = calloc(1, sizeof *p->stages);
    PD_ASSERT(p->stages);
    PlanStage *st = &p->stages[0];
    st->n_layers = p->n_layers, st->replicas = W;
    st->layers = malloc((size_t)p->n_layers * sizeof(int));
    st->ranks = malloc((size_t)W * sizeof(int));
    PD_ASSERT(st->layers && st->ranks);
    for (int l = 0; l < p->n_layers; l++) st->layers[l] = l, st->compute_s += prof->layers[l].fwd_s + prof->layers[l].bwd_s;
    for (int r = 0; r < W; r++) st->ranks[r] = r;
    st->time_s = p->pipeline_s = base->dp_s;
    p->n_workers = W, p->noam = 1;
    p->opts.straight = 0;
    if (base->n_edges > 0) {
        p->edges = malloc(sizeof(int[2]) * (size_t)base->n_edges);
        PD_ASSERT(p->edges);
        memcpy(p->edges, base->edges, sizeof(int[2]) * (size_t)base->n_edges);
    }
    Err e = {0};
    PD_ASSERTF(plan_validate(p, p->n_layers, &e) == PD_OK, "%s", e.msg);
    return p;
}

static Plan *partition(const Profile *prof, const Cluster *cl, const PlanOpts *base, int straight, int overlap,
                       double limit) {
    PlanOpts o = *base;
    o.straight = straight, o.overlap_allreduce = overlap, o.memory_limit = limit;
    Err e = {0};
    return plan_new(prof, cl, &o, &e);
}

/* A copy of p whose rank r is perm[r] (the same partition on other workers). */
static Plan *placed(const Plan *p, const int *perm) {
    Plan *q = calloc(1, sizeof *q);
    PD_ASSERT(q);
    *q = *p;
    q->stages = calloc((size_t)p->n_stages, sizeof *q->stages);
    PD_ASSERT(q->stages);
    for (int i = 0; i < p->n_stages; i++) {
        PlanStage *d = &q->stages[i];
        const PlanStage *o = &p->stages[i];
        *d = *o;
        d->layers = malloc((size_t)o->n_layers * sizeof(int));
        d->ranks = malloc((size_t)o->replicas * sizeof(int));
        PD_ASSERT(d->layers && d->ranks);
        memcpy(d->layers, o->layers, (size_t)o->n_layers * sizeof(int));
        for (int k = 0; k < o->replicas; k++) d->ranks[k] = perm[o->ranks[k]];
    }
    if (p->n_edges > 0) {
        q->edges = malloc(sizeof(int[2]) * (size_t)p->n_edges);
        PD_ASSERT(q->edges);
        memcpy(q->edges, p->edges, sizeof(int[2]) * (size_t)p->n_edges);
    }
    return q;
}

/* Next permutation of a (n) in lexicographic order; 0 after the last. */
static int next_perm(int *a, int n) {
    int i = n - 2;
    while (i >= 0 && a[i] >= a[i + 1]) i--;
    if (i < 0) return 0;
    int j = n - 1;
    while (a[j] <= a[i]) j--;
    int t = a[i];
    a[i] = a[j], a[j] = t;
    for (int l = i + 1, r = n - 1; l < r; l++, r--) t = a[l], a[l] = a[r], a[r] = t;
    return 1;
}

/* Fitting first, then faster (1e-12 relative); among equals the partitioner's proposals in
 * their order (the planner's own first), then the enumerated by less memory. */
static int cmp(const void *a, const void *b) {
    const ChooseCand *x = a, *y = b;
    if (x->score.fits != y->score.fits) return y->score.fits - x->score.fits;
    double tx = x->score.unit_s, ty = y->score.unit_s;
    if (tx < ty * (1 - 1e-12)) return -1;
    if (tx > ty * (1 + 1e-12)) return 1;
    if (x->enumerated != y->enumerated) return x->enumerated - y->enumerated;
    if (x->enumerated && x->score.peak_bytes != y->score.peak_bytes) return x->score.peak_bytes < y->score.peak_bytes ? -1 : 1;
    return x->score.part - y->score.part;
}

/* The first and last layer of a stage whose layers are one index range; 0 if they are not. */
static int span(const PlanStage *st, int *first, int *last) {
    for (int k = 1; k < st->n_layers; k++)
        if (st->layers[k] != st->layers[0] + k) return 0;
    *first = st->layers[0], *last = st->layers[st->n_layers - 1];
    return st->n_layers > 0;
}

int choose_alike(const ChooseCand *a, const ChooseCand *b, const Profile *prof) {
    const Plan *p = a->plan, *q = b->plan;
    if (a->score.fits != b->score.fits || !(a->score.unit_s < 1e300) || !(b->score.unit_s < 1e300)) return 0;
    double lo = a->score.unit_s < b->score.unit_s ? a->score.unit_s : b->score.unit_s;
    if (fabs(a->score.unit_s - b->score.unit_s) > CHOOSE_ALIKE * lo) return 0;
    if (p->n_stages != q->n_stages || p->n_workers != q->n_workers || p->chunks != q->chunks ||
        p->n_layers != q->n_layers || p->n_layers != prof->n_layers)
        return 0;
    for (int s = 0; s < p->n_stages; s++) {
        const PlanStage *x = &p->stages[s], *y = &q->stages[s];
        int xf, xl, yf, yl;
        if (x->replicas != y->replicas || !span(x, &xf, &xl) || !span(y, &yf, &yl)) return 0;
        for (int k = 0; k < x->replicas; k++)
            if (x->ranks[k] != y->ranks[k]) return 0;
        /* the layers that change sides at the cut after this stage */
        int from = xl < yl ? xl : yl, to = xl < yl ? yl : xl;
        for (int l = from + 1; l <= to; l++)
            if (prof->layers[l].param_bytes != 0 || prof->layers[l].act_bytes != prof->layers[from].act_bytes) return 0;
    }
    return 1;
}

/* Folds each candidate alike to an earlier one into it (the list is sorted, so the kept one is
 * as fast or faster); the planner's own plan stays listed, marked. Only the kept candidates
 * within CHOOSE_ALIKE of its time are compared (sorted: the last few kept), so a list of
 * 100,000 placements folds in linear time. */
static void fold_alike(Cands *cs, const Profile *prof, int *n_folded) {
    int n = 0;
    for (int i = 0; i < cs->n; i++) {
        ChooseCand *c = &cs->c[i];
        c->alike_of = -1;
        int j = n;   /* the earliest kept one alike to c; n: none */
        if (c->score.unit_s < 1e300)
            for (int k = n - 1; k >= 0; k--) {
                const ChooseCand *q = &cs->c[k];
                if (q->score.fits != c->score.fits || q->score.unit_s * (1 + CHOOSE_ALIKE) < c->score.unit_s) break;
                if (q->alike_of < 0 && choose_alike(q, c, prof)) j = k;
            }
        if (j < n && c->score.part != 0) {
            cs->c[j].n_alike++;
            plan_free(c->plan);
            (*n_folded)++;
            continue;
        }
        if (j < n) c->alike_of = j;
        cs->c[n++] = *c;
    }
    cs->n = n;
}

/* Scores candidates from..n-1 (part = their index when scored: 0 is the planner's own). */
static void score_from(Cands *cs, int from, const Profile *sim_prof, const Cluster *cl, SchedKind kind, int M,
                       double opt_state_factor, double limit) {
    for (int i = from; i < cs->n; i++) {
        ChooseCand *c = &cs->c[i];
        Err e = {0};
        if (plan_search_score(c->plan, sim_prof, cl, kind, M, 0, opt_state_factor, &c->score, &e)) {
            memset(&c->score, 0, sizeof c->score);   /* unschedulable here: never chosen */
            c->score.unit_s = 1e300;
        }
        c->score.part = i;
        if (c->score.fits && limit > 0) c->score.fits = c->score.peak_bytes <= limit;
    }
}

int plan_choose(const Profile *prof, const Profile *sim_prof, const Cluster *cl, const ChooseOpts *o, ChooseResult *out,
                Err *err) {
    memset(out, 0, sizeof *out);
    if (!sim_prof) sim_prof = prof;
    SchedKind kind = o->kind ? o->kind : SCHED_1F1B;
    int M = o->n_micro > 0 ? o->n_micro : 1;
    double limit = o->plan.memory_limit;
    Plan *mine = plan_new(prof, cl, &o->plan, err);
    if (!mine) return err && err->code ? err->code : PD_EINVAL;
    Cands cs = {0};
    add(&cs, mine, "planner");
    const PlanOpts *po = &o->plan;
    if (!po->straight) add(&cs, partition(prof, cl, po, 1, po->overlap_allreduce, limit), "straight");
    add(&cs, partition(prof, cl, po, po->straight, !po->overlap_allreduce, limit),
        po->overlap_allreduce ? "planner, all-reduce after" : "planner, all-reduce overlapped");
    if (limit > 0) {   /* its memory rule is not the simulator's: also without it */
        add(&cs, partition(prof, cl, po, po->straight, po->overlap_allreduce, 0), "planner, no memory limit");
        if (!po->straight) add(&cs, partition(prof, cl, po, 1, po->overlap_allreduce, 0), "straight, no memory limit");
    }
    if (!po->straight && mine->n_workers > 1) add(&cs, data_parallel(mine, prof), "data parallel");
    int lim = o->exhaustive ? o->exhaustive : 10000;
    for (int straight = po->straight; lim > 0 && straight <= 1 && !out->n_enumerated; straight++) {
        PlanOpts eo = *po;   /* every plan; too many: every straight plan */
        eo.straight = straight;
        Plan **all = NULL;
        int n = 0;
        Err e = {0};
        if (!plan_enumerate(prof, cl, &eo, lim, &all, &n, &e)) {
            out->n_enumerated = n;
            out->enumerated_straight = straight;
            for (int i = 0; i < n; i++) {
                int before = cs.n;
                add(&cs, all[i], straight ? "enumerated, straight" : "enumerated");
                if (cs.n > before) cs.c[cs.n - 1].enumerated = 1;
            }
            free(all);
        }
    }
    score_from(&cs, 0, sim_prof, cl, kind, M, o->opt_state_factor, limit);
    qsort(cs.c, (size_t)cs.n, sizeof *cs.c, cmp);
    /* A heterogeneous cluster: which worker runs which stage matters too. The best partitions
     * (all of them when CHOOSE_PLACE_BUDGET simulations allow) are tried on every placement of
     * their ranks on the workers (up to CHOOSE_PLACE_WORKERS workers: W! placements each). */
    int W = mine->n_workers;
    if (cluster_heterogeneous(cl) && W > 1 && W <= CHOOSE_PLACE_WORKERS) {
        long perms = 1;
        for (int k = 2; k <= W; k++) perms *= k;
        long fit = CHOOSE_PLACE_BUDGET / (perms - 1);
        int top = cs.n < fit ? cs.n : (int)fit, first = cs.n;
        for (int i = 0; i < top; i++) {
            if (!cs.c[i].score.fits || cs.c[i].plan->chunks > 1 || cs.c[i].plan->n_workers != W) continue;
            int perm[CHOOSE_PLACE_WORKERS];
            for (int r = 0; r < W; r++) perm[r] = r;
            char src[40];
            snprintf(src, sizeof src, "%.30s, placed", cs.c[i].source);
            /* a placement of a partition is a candidate of its own (push: no dedup by partition) */
            while (next_perm(perm, W)) push(&cs, placed(cs.c[i].plan, perm), src, cs.c[i].enumerated);
        }
        score_from(&cs, first, sim_prof, cl, kind, M, o->opt_state_factor, limit);
        qsort(cs.c, (size_t)cs.n, sizeof *cs.c, cmp);
    }
    fold_alike(&cs, sim_prof, &out->n_folded);
    for (int i = 0; i < cs.n; i++)
        if (cs.c[i].score.part == 0) out->planner = i;
    out->none_fit = !cs.c[0].score.fits;
    out->chosen = out->none_fit ? out->planner : 0;
    out->picked = -1;
    free(cs.key);
    out->n = cs.n;
    out->c = cs.c;
    out->kind = kind;
    out->n_micro = M;
    out->samples_per_unit = sim_prof->minibatch;
    out->memory_limit = limit;
    return PD_OK;
}

void plan_choose_release(ChooseResult *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) plan_free(r->c[i].plan);
    free(r->c);
    memset(r, 0, sizeof *r);
}

/* "10|3|6|6" */
static void layers_per_stage(const Plan *p, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (int s = 0; s < p->n_stages && k + 16 < n; s++)
        k += (size_t)snprintf(buf + k, n - k, "%s%d", s ? "|" : "", p->stages[s].n_layers);
}

/* Prints what c's time per minibatch goes to; with base (the choice's), what makes it slower. */
static int print_why(const ChooseResult *r, const ChooseCand *c, const char *who, const Profile *prof, const Cluster *cl,
                     double opt, const SearchWhy *base, SearchWhy *w, FILE *f) {
    Err e = {0};
    if (plan_search_why(c->plan, prof, cl, r->kind, r->n_micro, 0, opt, w, &e)) {
        fprintf(f, "  %s: cannot simulate it: %s\n", who, e.msg);
        return PD_EINVAL;
    }
    static const char *what[] = {"the compute of stage %d", "the all-reduce of stage %d", "the transfers of stage %d",
                                 "the pipeline bubble (waiting for other stages)"};
    char b[80];
    int st = w->bottleneck == WHY_LINK ? w->link_stage : w->stage;
    snprintf(b, sizeof b, what[w->bottleneck], st);
    char rep[48] = "";
    if (w->bottleneck == WHY_ALLREDUCE && st >= 0)
        snprintf(rep, sizeof rep, " (%d replicas)", c->plan->stages[st].replicas);
    fprintf(f, "  %s: %.3f ms per minibatch, most of it %s%s\n", who, w->unit_s * 1e3, b, rep);
    char slow[48] = "";
    if (w->slowdown > 1 + 1e-9) snprintf(slow, sizeof slow, " (slowed %.2fx by shared cores)", w->slowdown);
    fprintf(f, "    busiest worker %d (stage %d): compute %.3f ms%s, all-reduce %.3f ms; ", w->worker, w->stage,
            w->compute_s * 1e3, slow, w->allreduce_s * 1e3);
    if (w->link_worker >= 0) fprintf(f, "busiest link: stage %d's sends, %.3f ms; ", w->link_stage, w->link_s * 1e3);
    else fprintf(f, "no transfers; ");
    fprintf(f, "bubble (waiting) %.3f ms\n", w->idle_s * 1e3);
    if (w->ar_worker >= 0 && w->ar_worker != w->worker && w->ar_stage >= 0)
        fprintf(f, "    all-reduce of stage %d (%d replicas): %.3f ms per minibatch on worker %d\n", w->ar_stage,
                c->plan->stages[w->ar_stage].replicas, w->ar_s * 1e3, w->ar_worker);
    if (base && w->unit_s <= base->unit_s * (1 + 1e-9)) {
        fprintf(f, "    against the choice: as fast; the choice %s\n",
                c->score.peak_bytes > r->c[r->chosen].score.peak_bytes ? "needs less memory" : "was proposed first");
    } else if (base) {
        static const char *name[] = {"compute", "all-reduce", "transfers", "bubble"};
        double d[4] = {w->compute_s - base->compute_s, w->allreduce_s - base->allreduce_s, w->link_s - base->link_s,
                       w->idle_s - base->idle_s};
        int k = 0;
        for (int i = 1; i < 4; i++)
            if (d[i] > d[k]) k = i;
        fprintf(f, "    against the choice: %+.3f ms (compute %+.3f, all-reduce %+.3f, transfers %+.3f, bubble %+.3f): "
                "mostly its %s\n", (w->unit_s - base->unit_s) * 1e3, d[0] * 1e3, d[1] * 1e3, d[2] * 1e3, d[3] * 1e3, name[k]);
    }
    return PD_OK;
}

void plan_choose_print(const ChooseResult *r, int top, int explain, const Profile *sim_prof, const Cluster *cl,
                       double opt, FILE *f) {
    char mi[48] = "";
    if (r->n_micro > 1) snprintf(mi, sizeof mi, ", %d micro-batches per step", r->n_micro);
    fprintf(f, "candidates simulated (%s%s): %d", sched_kind_name(r->kind), mi, r->n + r->n_folded);
    if (r->n_enumerated)
        fprintf(f, ", every %splan (%d) among them", r->enumerated_straight ? "straight " : "", r->n_enumerated);
    if (r->n_folded)
        fprintf(f, "; %d folded into a listed plan they are alike to (only parameter-free layers moved across a cut, "
                "simulated within %.1f%%)", r->n_folded, 100 * CHOOSE_ALIKE);
    if (r->memory_limit > 0) fprintf(f, "; memory limit %.4g GB per worker (simulated peak)", r->memory_limit / 1e9);
    fprintf(f, "\n  %-5s %-30s %12s %10s %9s  %-24s %s\n", "", "source", "ms/minibatch", "samples/s", "peak GB", "shape",
            "layers per stage");
    for (int i = 0; i < r->n; i++) {
        if (i >= top && i != r->planner && i != r->chosen && i != r->picked) continue;
        const ChooseCand *c = &r->c[i];
        char sh[96], ly[160], mark[16], src[64];
        if (c->n_alike) snprintf(src, sizeof src, "%s (+%d alike)", c->source, c->n_alike);
        else if (c->alike_of >= 0) snprintf(src, sizeof src, "%s, alike to %d", c->source, c->alike_of + 1);
        else snprintf(src, sizeof src, "%s", c->source);
        plan_search_shape(c->plan, sh, sizeof sh);
        layers_per_stage(c->plan, ly, sizeof ly);
        snprintf(mark, sizeof mark, "%s%d", i == r->chosen ? "*" : i == r->picked ? ">" : " ", i + 1);
        if (c->score.unit_s >= 1e300) {
            fprintf(f, "  %-5s %-30s %12s %10s %9s  %-24s %s\n", mark, src, "-", "-", "-", sh, ly);
            continue;
        }
        char sps[24] = "-";   /* the authors' profiles do not say their minibatch */
        if (r->samples_per_unit > 0) snprintf(sps, sizeof sps, "%.1f", r->samples_per_unit / c->score.unit_s);
        fprintf(f, "  %-5s %-30s %12.3f %10s %9.4g  %-24s %s%s\n", mark, src, c->score.unit_s * 1e3, sps,
                c->score.peak_bytes / 1e9, sh, ly, c->score.fits ? "" : "  over the limit");
    }
    if (r->n > top)
        fprintf(f, "  (%d more)\n", r->n - top - (r->planner >= top) - (r->picked >= top && r->picked != r->planner));
    const ChooseCand *w = &r->c[r->chosen], *mine = &r->c[r->planner];
    if (r->none_fit) {
        fprintf(f, "choice: the planner's own plan: no candidate's simulated peak fits %.4g GB\n", r->memory_limit / 1e9);
    } else if (r->chosen == r->planner) {
        fprintf(f, "choice: %s (the planner's own plan)\n", w->source);
    } else if (!mine->score.fits) {
        fprintf(f, "choice: %s; the planner's own plan does not fit (simulated peak %.4g GB)\n", w->source,
                mine->score.peak_bytes / 1e9);
    } else {
        fprintf(f, "choice: %s, %.1f%% faster than the planner's own plan (simulated %.3f against %.3f ms)\n", w->source,
                100 * (mine->score.unit_s / w->score.unit_s - 1), w->score.unit_s * 1e3, mine->score.unit_s * 1e3);
    }
    if (!explain) return;
    fprintf(f, "why (per minibatch, averaged over the simulated run):\n");
    SearchWhy wc, wo;
    const SearchWhy *base = print_why(r, w, "choice", sim_prof, cl, opt, NULL, &wc, f) ? NULL : &wc;
    int ru = -1;
    for (int i = 0; i < r->n && ru < 0; i++)
        if (i != r->chosen && r->c[i].score.fits && r->c[i].alike_of < 0) ru = i;
    if (ru >= 0) {
        char who[96];
        double d = 100 * (r->c[ru].score.unit_s / w->score.unit_s - 1);
        if (d < 0.05) snprintf(who, sizeof who, "runner-up (%s, as fast)", r->c[ru].source);
        else snprintf(who, sizeof who, "runner-up (%s, %.1f%% slower)", r->c[ru].source, d);
        print_why(r, &r->c[ru], who, sim_prof, cl, opt, base, &wo, f);
    }
    if (r->planner != r->chosen && r->planner != ru && mine->score.unit_s < 1e300) {
        char who[96];
        snprintf(who, sizeof who, "the planner's own plan (%.1f%% slower)", 100 * (mine->score.unit_s / w->score.unit_s - 1));
        print_why(r, mine, who, sim_prof, cl, opt, base, &wo, f);
    }
    if (r->memory_limit > 0) {
        int over = 0, fastest = -1;
        for (int i = 0; i < r->n; i++)
            if (!r->c[i].score.fits && r->c[i].score.unit_s < 1e300) {
                over++;
                if (fastest < 0 || r->c[i].score.unit_s < r->c[fastest].score.unit_s) fastest = i;
            }
        fprintf(f, "  memory: the choice peaks at %.4g of %.4g GB per worker", w->score.peak_bytes / 1e9,
                r->memory_limit / 1e9);
        if (over && fastest >= 0 && r->c[fastest].score.unit_s < w->score.unit_s)
            fprintf(f, "; %d candidate%s over the limit, the fastest of them (%s) %.3f ms", over, over == 1 ? "" : "s",
                    r->c[fastest].source, r->c[fastest].score.unit_s * 1e3);
        else if (over) fprintf(f, "; %d slower candidate%s over the limit", over, over == 1 ? "" : "s");
        fputc('\n', f);
    }
}
