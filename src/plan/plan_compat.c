/* plan_compat.c: the authors' optimizer (optimizer_graph_hierarchical.py), reproduced
 * value for value as docs/explanation/authors-planner.md §3 describes it, quirks included: the all-reduce added
 * to compute and divided by r, /nw only in the initialisation, the stash factor counting
 * only later workers, transfers ignored without a compression ratio, lower levels
 * filling every row (index-based segments, even between unrelated states), and the
 * hierarchical replacement of segment times by the level below's optimum. Where their
 * program crashes we fail with a message saying why.
 *
 * Speed: states are bitsets, earlier cuts are subset tests, and the final level of a
 * one-level run scans only the cuts that could beat the best value so far: a stage of
 * r replicas after cut k costs at least (C(j)-C(k))/r, and a prefix on m' workers at
 * least C(k)/m', so only k with C(j) - r*best < C(k) < (m-r+1)*best can win. Values
 * equal the plain loops' (PlanOpts.no_pruning), which the tests check.
 *
 * Ties (several splits with the same value; the authors' pick depends on Python set order):
 * the plain loops keep the first minimum in the order (cut k ascending, then replicas r of
 * the new stage ascending); the pruned final level in the order (r ascending, then C(k)
 * ascending, then k). For chains both orders agree unless layers have zero time. */
#include "plan_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct AEnt {
    double t;   /* NaN = None */
    int k;      /* previous cut (state index), -1 = none (one stage) */
    int r;      /* replicas of the last stage */
    int mp;     /* index m of the prefix entry A[i][k][mp] */
} AEnt;

typedef struct Ctx {
    const PStates *s;
    const PlanOpts *o;
    int n;
    double *T;         /* (n+1, n) segment times once a level has replaced them; NULL before */
    int *sorted;       /* (n) states by C ascending, ties by index */
    int *anc_off, *anc;/* earlier cuts of each state, sorted like `sorted`; NULL if not built */
} Ctx;

static const double NONE = NAN;
#define IS_NONE(x) isnan(x)

static double seg(const double *v, int i, int j) { /* row i, column j of a prefix-difference table */
    if (i == 0) return v[j];
    if (j < i) return NONE;
    return v[j] - v[i - 1];
}
static double Tget(const Ctx *c, int i, int j) {
    return c->T ? c->T[(size_t)i * c->n + j] : seg(c->s->C, i, j);
}

static const double *g_sortC;
static int cmp_by_C(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    if (g_sortC[x] != g_sortC[y]) return g_sortC[x] < g_sortC[y] ? -1 : 1;
    return (x > y) - (x < y);
}

static int build_anc(Ctx *c, Err *err) {
    const PStates *s = c->s;
    size_t cap = 1024, cnt = 0;
    c->anc_off = malloc(sizeof(int) * (size_t)(c->n + 1));
    c->anc = malloc(sizeof(int) * cap);
    PD_ASSERT(c->anc_off && c->anc);
    for (int j = 0; j < c->n; j++) {
        c->anc_off[j] = (int)cnt;
        for (int k = 0; k < j; k++) {
            if (!pstates_before(s, k, j)) continue;
            if (cnt == cap) {
                if (cap > ((size_t)1 << 29))
                    return err_set(err, PD_EINVAL, "too many (state, earlier cut) pairs for a hierarchical run of "
                                   "the authors' model (%d states); use one level or compress the graph", c->n);
                cap *= 2;
                c->anc = realloc(c->anc, sizeof(int) * cap);
                PD_ASSERT(c->anc);
            }
            c->anc[cnt++] = k;
        }
    }
    c->anc_off[c->n] = (int)cnt;
    return PD_OK;
}

/* One candidate (docs/explanation/authors-planner.md §3.3, the k/r loop body). Updates *e if strictly better. */
static void candidate(const Ctx *c, const AEnt *A, int N, double B, int i, int j, int m, int k, int r, AEnt *e) {
    const PStates *s = c->s;
    const PlanOpts *o = c->o;
    double Tl = Tget(c, k + 1, j);
    if (IS_NONE(Tl)) return;
    double par = seg(s->PAR, k + 1, j);
    double stash = (seg(s->ACT, k + 1, j) + par) * ceil((double)(N - (m + 1)) / (double)r);
    if (o->memory_limit > 0 && stash > o->memory_limit) return;
    Tl = (Tl + ((double)(4 * (r - 1)) * par) / (B * (double)r)) / (double)r;
    const AEnt *pre = &A[((size_t)i * c->n + k) * N + (m - r)];
    if (IS_NONE(pre->t)) return;
    double t = pre->t > Tl ? pre->t : Tl;
    if (o->activation_compression > 0) {
        double in_t = ((2.0 * s->OA[k]) / (B * (double)r)) / o->activation_compression;
        if (in_t > t) t = in_t;
        if (j < c->n - 1) {
            double out_t = ((2.0 * s->OA[j]) / (B * (double)r)) / o->activation_compression;
            if (out_t > t) t = out_t;
        }
    }
    if (IS_NONE(e->t) || e->t > t) *e = (AEnt){t, k, r, m - r};
}

/* compute_partitioning for one level. A: (rows, n, N). */
static int level_dp(Ctx *c, AEnt *A, int rows, int N, double B, double nw, int final, Err *err) {
    const PStates *s = c->s;
    const PlanOpts *o = c->o;
    const int n = c->n;
    for (size_t x = 0; x < (size_t)rows * n * N; x++) A[x] = (AEnt){NONE, -1, 0, 0};
    int mmax = o->straight ? 1 : N;
    for (int i = 0; i < rows; i++)
        for (int j = i; j < n; j++) {
            double T = Tget(c, i, j), act = seg(s->ACT, i, j), par = seg(s->PAR, i, j);
            for (int m = 0; m < mmax; m++) {
                double stash = ceil((double)(N - (m + 1)) / (double)(m + 1)) * (act + par);
                if (o->memory_limit > 0 && stash > o->memory_limit) continue;
                double dp = ((double)(4 * m) * par) / (B * (double)(m + 1));
                dp /= nw;
                if (IS_NONE(T)) continue;
                A[((size_t)i * n + j) * N + m] = (AEnt){(T + dp) / (double)(m + 1), -1, m + 1, 0};
            }
        }
    const int prune = final && rows == 1 && !c->T && !o->no_pruning;
    const double delta = 1e-9 * s->C[n - 1] + 1e-300;
    for (int i = 0; i < rows; i++)
        for (int m = 1; m < N; m++)
            for (int j = i + 1; j < n; j++) {
                AEnt e = A[((size_t)i * n + j) * N + m];
                if (o->allow_idle) {
                    const AEnt *prev = &A[((size_t)i * n + j) * N + m - 1];
                    if (IS_NONE(e.t)) {
                        e = *prev;
                    } else if (IS_NONE(prev->t)) {
                        return err_set(err, PD_EINVAL,
                                       "the authors' optimizer crashes here (TypeError: None < float, "
                                       "docs/explanation/authors-planner.md §3.4): with --allow-idle and the memory limit, state "
                                       "range %d..%d fits on %d workers but not on %d; use --cost-model ours",
                                       i, j, m + 1, m);
                    } else if (prev->t < e.t) {
                        e = *prev;
                    }
                }
                int rmax = o->straight ? 1 : m;
                for (int r = 1; prune && r <= rmax; r++) {
                    if (o->activation_compression > 0 && j < n - 1 && !IS_NONE(e.t) &&
                        ((2.0 * s->OA[j]) / (B * (double)r)) / o->activation_compression >= e.t)
                        continue; /* every candidate pays this output transfer: none can win */
                    {
                        int p = 0;
                        if (!IS_NONE(e.t)) { /* first position with C > C(j) - r*(best+delta) */
                            double lo = s->C[j] - (double)r * (e.t + delta);
                            int a = 0, b = n;
                            while (a < b) {
                                int mid = (a + b) / 2;
                                if (s->C[c->sorted[mid]] <= lo) a = mid + 1;
                                else b = mid;
                            }
                            p = a;
                        }
                        for (; p < n; p++) {
                            int k = c->sorted[p];
                            double Ck = s->C[k];
                            if (Ck > s->C[j] + delta) break;
                            if (!IS_NONE(e.t) && Ck >= (double)(m - r + 1) * (e.t + delta)) break;
                            if (o->activation_compression > 0 && !IS_NONE(e.t) &&
                                ((2.0 * s->OA[k]) / (B * (double)r)) / o->activation_compression >= e.t)
                                continue; /* its input transfer alone loses */
                            if (!pstates_before(s, k, j)) continue;
                            candidate(c, A, N, B, i, j, m, k, r, &e);
                        }
                    }
                }
                if (!prune) {
                    /* Earlier cuts k >= i only (A[i][k] is None for k < i), ascending; for each,
                     * replicas ascending. anc lists are in index order. */
                    int a = c->anc_off[j], b = c->anc_off[j + 1];
                    while (a < b) {
                        int mid = (a + b) / 2;
                        if (c->anc[mid] < i) a = mid + 1;
                        else b = mid;
                    }
                    const int mem = o->memory_limit > 0, ratio = o->activation_compression > 0;
                    for (int q = a; q < c->anc_off[j + 1]; q++) {
                        const int k = c->anc[q];
                        const double T0 = Tget(c, k + 1, j);
                        if (IS_NONE(T0)) continue;
                        const double par = seg(s->PAR, k + 1, j), actpar = seg(s->ACT, k + 1, j) + par;
                        const AEnt *pre = &A[((size_t)i * n + k) * N];
                        for (int r = 1; r <= rmax; r++) {
                            double pt = pre[m - r].t;
                            /* t >= pt: a prefix no better than the best cannot win (strict <) */
                            if (IS_NONE(pt) || (!IS_NONE(e.t) && pt >= e.t)) continue;
                            if (mem && actpar * ceil((double)(N - (m + 1)) / (double)r) > o->memory_limit) continue;
                            double Tl = (T0 + ((double)(4 * (r - 1)) * par) / (B * (double)r)) / (double)r;
                            double t = pt > Tl ? pt : Tl;
                            if (ratio) {
                                double in_t = ((2.0 * s->OA[k]) / (B * (double)r)) / o->activation_compression;
                                if (in_t > t) t = in_t;
                                if (j < n - 1) {
                                    double out_t = ((2.0 * s->OA[j]) / (B * (double)r)) / o->activation_compression;
                                    if (out_t > t) t = out_t;
                                }
                            }
                            if (IS_NONE(e.t) || e.t > t) e = (AEnt){t, k, r, m - r};
                        }
                    }
                }
                A[((size_t)i * n + j) * N + m] = e;
            }
    return PD_OK;
}

typedef struct Level {
    int N, rows;
    double B;
    AEnt *A;
} Level;

/* analyze_partitioning: the ranges [a, b) of states and replicas chosen for A[start][end-1]. */
static int analyze(const Ctx *c, const Level *lv, int start, int end, int *cuts, int *reps, int *count, Err *err) {
    const AEnt *A = lv->A;
    int n = c->n, N = lv->N;
    const AEnt *e = &A[((size_t)start * n + end - 1) * N + N - 1];
    if (IS_NONE(e->t))
        return err_set(err, PD_EINVAL, "no feasible partition of state range %d..%d on %d workers (the authors' "
                       "optimizer crashes here: memory limit too small, or --straight with more workers than "
                       "cut states)", start, end - 1, N);
    int cnt = 0;
    int *tmp_cut = malloc(sizeof(int) * (size_t)(n + 2)), *tmp_rep = malloc(sizeof(int) * (size_t)(n + 2));
    PD_ASSERT(tmp_cut && tmp_rep);
    while (e->k >= 0) {
        PD_ASSERT(cnt < n);
        tmp_rep[cnt] = e->r;
        tmp_cut[cnt] = e->k + 1; /* the stage [k+1, prev) */
        cnt++;
        e = &A[((size_t)start * n + e->k) * N + e->mp];
        PD_ASSERT(!IS_NONE(e->t));
    }
    tmp_rep[cnt] = e->r;
    tmp_cut[cnt] = start;
    cnt++;
    for (int q = 0; q < cnt; q++) { /* reverse into pipeline order: cuts[q] = start of stage q */
        cuts[q] = tmp_cut[cnt - 1 - q];
        reps[q] = tmp_rep[cnt - 1 - q];
    }
    cuts[cnt] = end;
    *count = cnt;
    free(tmp_cut);
    free(tmp_rep);
    return PD_OK;
}

/* The time the top level's DP charged for stage [a, b) with r replicas (first stage: the
 * initialisation formula). */
static double top_stage_time(const Ctx *c, const Level *lv, double nw, int a, int b, int r, int first) {
    const PStates *s = c->s;
    double B = lv->B, par = seg(s->PAR, a, b - 1), T = Tget(c, a, b - 1);
    if (first) return (T + ((double)(4 * (r - 1)) * par) / (B * (double)r) / nw) / (double)r;
    double t = (T + ((double)(4 * (r - 1)) * par) / (B * (double)r)) / (double)r;
    if (c->o->activation_compression > 0) {
        double in_t = ((2.0 * s->OA[a - 1]) / (B * (double)r)) / c->o->activation_compression;
        if (in_t > t) t = in_t;
        if (b - 1 < c->n - 1) {
            double out_t = ((2.0 * s->OA[b - 1]) / (B * (double)r)) / c->o->activation_compression;
            if (out_t > t) t = out_t;
        }
    }
    return t;
}

int plan_dp_compat(const PStates *s, const Cluster *cl, const PlanOpts *o, PSolution *out, Err *err) {
    memset(out, 0, sizeof *out);
    Ctx c = {.s = s, .o = o, .n = s->n};
    const int n = s->n, L = cl->n_levels;
    Level lv[PD_MAX_LEVELS];
    memset(lv, 0, sizeof lv);
    int rc = PD_OK;
    c.sorted = malloc(sizeof(int) * (size_t)n);
    PD_ASSERT(c.sorted);
    for (int i = 0; i < n; i++) c.sorted[i] = i;
    g_sortC = s->C;
    qsort(c.sorted, (size_t)n, sizeof(int), cmp_by_C);
    if (L > 1) {
        double workers = 0;
        for (int l = 0; l + 1 < L; l++) workers += cl->level[l].workers;
        double bytes = (double)(n + 1) * n * (double)sizeof(AEnt) * workers;
        if (bytes > 8e9) {
            rc = err_set(err, PD_EINVAL, "a hierarchical run of the authors' model on %d cut states needs %.1f GB of "
                         "tables; use one level or compress the graph", n, bytes / 1e9);
            goto done;
        }
    }
    int need_anc = L > 1 || o->no_pruning;
    if (need_anc && (rc = build_anc(&c, err))) goto done;
    double nw = 1;
    for (int l = 0; l < L; l++) {
        int final = l == L - 1;
        lv[l].N = cl->level[l].workers;
        lv[l].B = cl->level[l].bandwidth;
        lv[l].rows = final ? 1 : n + 1;
        lv[l].A = malloc(sizeof(AEnt) * (size_t)lv[l].rows * n * lv[l].N);
        PD_ASSERT(lv[l].A);
        if ((rc = level_dp(&c, lv[l].A, lv[l].rows, lv[l].N, lv[l].B, nw, final, err))) goto done;
        if (!final) { /* T[i][j] := A[i][j][N-1].t */
            if (!c.T) c.T = malloc(sizeof(double) * (size_t)(n + 1) * n);
            PD_ASSERT(c.T);
            for (size_t x = 0; x < (size_t)(n + 1) * n; x++) c.T[x] = lv[l].A[x * lv[l].N + lv[l].N - 1].t;
        }
        nw = lv[l].N;
    }
    /* Reconstruction, top-down (docs/explanation/authors-planner.md §3.5): ranges of states with replicas. */
    {
        int cap = n + 2;
        int *a = malloc(sizeof(int) * cap), *b = malloc(sizeof(int) * cap), *rep = malloc(sizeof(int) * cap);
        double *tt = malloc(sizeof(double) * cap);
        int *cuts = malloc(sizeof(int) * (n + 2)), *reps = malloc(sizeof(int) * (n + 2));
        PD_ASSERT(a && b && rep && tt && cuts && reps);
        int cnt = 0;
        const Level *T0 = &lv[L - 1];
        const AEnt *best = &T0->A[((size_t)0 * n + n - 1) * T0->N + T0->N - 1];
        if (IS_NONE(best->t)) {
            rc = err_set(err, PD_EINVAL, "no feasible plan: no partition fits %s%s (the authors' optimizer crashes "
                         "here)", o->memory_limit > 0 ? "the memory limit" : "the cluster",
                         o->straight ? " as a straight pipeline (more workers than cut states?)" : "");
        }
        int k = 0;
        if (!rc) rc = analyze(&c, T0, 0, n, cuts, reps, &k, err);
        double top_nw = L > 1 ? cl->level[L - 2].workers : 1;
        for (int q = 0; !rc && q < k; q++) {
            a[cnt] = cuts[q];
            b[cnt] = cuts[q + 1];
            rep[cnt] = reps[q];
            tt[cnt] = top_stage_time(&c, T0, top_nw, cuts[q], cuts[q + 1], reps[q], q == 0);
            cnt++;
        }
        for (int l = L - 2; !rc && l >= 0; l--) { /* split each range at the level below */
            int ncnt = 0;
            int *na = malloc(sizeof(int) * cap), *nb = malloc(sizeof(int) * cap), *nr = malloc(sizeof(int) * cap);
            double *nt = malloc(sizeof(double) * cap);
            PD_ASSERT(na && nb && nr && nt);
            for (int q = 0; !rc && q < cnt; q++) {
                rc = analyze(&c, &lv[l], a[q], b[q], cuts, reps, &k, err);
                for (int x = 0; !rc && x < k; x++) {
                    na[ncnt] = cuts[x];
                    nb[ncnt] = cuts[x + 1];
                    nr[ncnt] = rep[q] * reps[x];
                    nt[ncnt] = tt[q];
                    ncnt++;
                }
            }
            free(a);
            free(b);
            free(rep);
            free(tt);
            a = na;
            b = nb;
            rep = nr;
            tt = nt;
            cnt = ncnt;
        }
        if (!rc) {
            out->n_stages = cnt;
            out->st = calloc((size_t)cnt, sizeof *out->st);
            PD_ASSERT(out->st);
            for (int q = 0; q < cnt; q++)
                out->st[q] = (PStageRange){a[q] - 1, b[q] - 1, rep[q], tt[q]};
            out->pipeline_s = best->t;
            out->single_s = s->C[n - 1];
            double t = s->C[n - 1], P = s->PAR[n - 1], w_in = 1;
            for (int l = 0; l < L; l++) {
                int N = cl->level[l].workers;
                double dp = ((double)(4 * (N - 1)) * P) / (cl->level[l].bandwidth * (double)N) / w_in;
                t = (t + dp) / (double)N;
                w_in = N;
            }
            out->dp_s = t;
        }
        free(a);
        free(b);
        free(rep);
        free(tt);
        free(cuts);
        free(reps);
    }
done:
    for (int l = 0; l < L; l++) free(lv[l].A);
    free(c.T);
    free(c.sorted);
    free(c.anc_off);
    free(c.anc);
    if (rc) psolution_release(out);
    return rc;
}

void psolution_release(PSolution *s) {
    if (!s) return;
    free(s->st);
    memset(s, 0, sizeof *s);
}
