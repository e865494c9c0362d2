/* plan_graph.c: the profile as a graph of bitsets, and the cut states the dynamic
 * programs run over. States are the authors' antichains (docs/explanation/authors-planner.md §3.2), each stored as
 * the set of nodes before the cut; a move adds one node fed from the set together with
 * all its ancestors, which is what their augment/replace/de-augment step does. Found
 * breadth-first with a hash set; sorted by size, so the order is topological. The
 * authors' state order (a DFS over a graph whose member lists come from a Python set
 * of strings) depends on the hash seed; ours is fixed. Does not plan anything. */
#include "plan_impl.h"

#include <stdlib.h>
#include <string.h>

static int starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

void pgraph_release(PGraph *g) {
    if (!g) return;
    free(g->layer);
    free(g->node_of_layer);
    free(g->ct);
    free(g->act);
    free(g->par);
    free(g->pred);
    free(g->outs);
    memset(g, 0, sizeof *g);
}

int pgraph_build(const Profile *prof, PGraph *g, Err *err) {
    memset(g, 0, sizeof *g);
    int rc = profile_validate(prof, err);
    if (rc) return rc;
    int L = prof->n_layers;
    int ne = prof->n_edges;
    int (*e)[2] = malloc(sizeof(int[2]) * (size_t)(ne > 0 ? ne : L));
    PD_ASSERT(e);
    if (ne == 0) { /* a chain: layer i feeds layer i+1 */
        for (int i = 0; i + 1 < L; i++) {
            e[i][0] = i;
            e[i][1] = i + 1;
        }
        ne = L - 1;
    } else {
        memcpy(e, prof->edges, sizeof(int[2]) * (size_t)ne);
    }
    int *indeg = calloc((size_t)L, sizeof(int)), *outdeg = calloc((size_t)L, sizeof(int));
    char *removed = calloc((size_t)L, 1);
    PD_ASSERT(indeg && outdeg && removed);
    for (int k = 0; k < ne; k++) {
        indeg[e[k][1]]++;
        outdeg[e[k][0]]++;
    }
    /* 1. Input sources go (they return to stage 0). 2. __getitem__ sinks go. */
    for (int i = 0; i < L; i++)
        if (indeg[i] == 0 && starts_with(prof->layers[i].type, "Input")) removed[i] = 1;
    for (int k = 0; k < ne; k++)
        if (removed[e[k][0]]) indeg[e[k][1]]--;
    for (int i = 0; i < L; i++)
        if (!removed[i] && outdeg[i] == 0 && starts_with(prof->layers[i].type, "__getitem__")) removed[i] = 1;
    g->node_of_layer = malloc(sizeof(int) * (size_t)L);
    g->layer = malloc(sizeof(int) * (size_t)L);
    PD_ASSERT(g->node_of_layer && g->layer);
    int n = 0;
    for (int i = 0; i < L; i++) {
        g->node_of_layer[i] = removed[i] ? -1 : n;
        if (!removed[i]) g->layer[n++] = i;
    }
    if (n == 0) {
        rc = err_set(err, PD_EINVAL, "no layers left after removing the Input nodes and unused __getitem__ outputs");
        goto done;
    }
    g->n = n;
    g->words = (n + 63) / 64;
    g->ct = malloc(sizeof(double) * (size_t)n);
    g->act = malloc(sizeof(double) * (size_t)n);
    g->par = malloc(sizeof(double) * (size_t)n);
    g->pred = calloc((size_t)n * (size_t)g->words, sizeof(uint64_t));
    g->outs = calloc((size_t)n * (size_t)g->words, sizeof(uint64_t));
    PD_ASSERT(g->ct && g->act && g->par && g->pred && g->outs);
    for (int v = 0; v < n; v++) {
        const ProfileLayer *l = &prof->layers[g->layer[v]];
        g->ct[v] = l->fwd_s + l->bwd_s;
        g->act[v] = l->act_bytes;
        g->par[v] = l->param_bytes;
    }
    for (int k = 0; k < ne; k++) {
        int a = g->node_of_layer[e[k][0]], b = g->node_of_layer[e[k][1]];
        if (a < 0 || b < 0) continue;
        g->outs[(size_t)a * g->words + b / 64] |= (uint64_t)1 << (b % 64);
    }
    /* Ancestors in topological order: pred(b) = union over in-edges a of {a} + pred(a). */
    for (int b = 0; b < n; b++) {
        uint64_t *pb = g->pred + (size_t)b * g->words;
        for (int a = 0; a < b; a++) {
            if (!(g->outs[(size_t)a * g->words + b / 64] >> (b % 64) & 1)) continue;
            const uint64_t *pa = g->pred + (size_t)a * g->words;
            for (int w = 0; w < g->words; w++) pb[w] |= pa[w];
            pb[a / 64] |= (uint64_t)1 << (a % 64);
        }
    }
    /* The authors start from sources()[0]: the first source in file order. */
    g->source0 = -1;
    int best_line = 0;
    for (int v = 0; v < n; v++) {
        int is_src = 1;
        for (int w = 0; w < g->words && is_src; w++) is_src = g->pred[(size_t)v * g->words + w] == 0;
        if (!is_src) continue;
        int line = prof->layers[g->layer[v]].line;
        if (g->source0 < 0 || (line > 0 && line < best_line)) {
            g->source0 = v;
            best_line = line;
        }
    }
    PD_ASSERT(g->source0 >= 0);
done:
    free(e);
    free(indeg);
    free(outdeg);
    free(removed);
    if (rc) pgraph_release(g);
    return rc;
}

void pstates_release(PStates *s) {
    if (!s) return;
    free(s->down);
    free(s->C);
    free(s->ACT);
    free(s->PAR);
    free(s->OA);
    free(s->OX);
    memset(s, 0, sizeof *s);
}

static uint64_t hash_bits(const uint64_t *b, int words) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int w = 0; w < words; w++) {
        h ^= b[w] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h *= 0xff51afd7ed558ccdull;
    }
    return h ^ (h >> 33);
}

static int popcount_bits(const uint64_t *b, int words) {
    int c = 0;
    for (int w = 0; w < words; w++) c += __builtin_popcountll(b[w]);
    return c;
}

typedef struct { int size, id; } SizeKey;
static int cmp_size(const void *a, const void *b) {
    const SizeKey *x = a, *y = b;
    if (x->size != y->size) return x->size < y->size ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

int pstates_build(const PGraph *g, long max_states, PStates *s, Err *err) {
    memset(s, 0, sizeof *s);
    const int W = g->words, n = g->n;
    size_t cap = 1024, cnt = 0, hcap = 4096;
    uint64_t *down = malloc(cap * W * sizeof(uint64_t));
    int *table = malloc(hcap * sizeof(int));
    uint64_t *cand = malloc(W * sizeof(uint64_t)), *next = malloc(W * sizeof(uint64_t));
    PD_ASSERT(down && table && cand && next);
    memset(table, -1, hcap * sizeof(int));
    memset(down, 0, W * sizeof(uint64_t));
    down[g->source0 / 64] |= (uint64_t)1 << (g->source0 % 64);
    table[hash_bits(down, W) & (hcap - 1)] = 0;
    cnt = 1;
    int rc = PD_OK;
    for (size_t q = 0; q < cnt; q++) { /* breadth-first: the queue is the state array */
        memset(cand, 0, W * sizeof(uint64_t));
        for (int x = 0; x < W; x++)
            for (uint64_t m = down[q * W + x]; m; m &= m - 1) {
                const uint64_t *o = g->outs + (size_t)(x * 64 + __builtin_ctzll(m)) * W;
                for (int w = 0; w < W; w++) cand[w] |= o[w];
            }
        for (int w = 0; w < W; w++) cand[w] &= ~down[q * W + w];
        for (int w = 0; w < W; w++)
            for (uint64_t m = cand[w]; m; m &= m - 1) {
                int v = w * 64 + __builtin_ctzll(m);
                for (int x = 0; x < W; x++) next[x] = down[q * W + x] | g->pred[(size_t)v * W + x];
                next[v / 64] |= (uint64_t)1 << (v % 64);
                size_t h = hash_bits(next, W) & (hcap - 1);
                int found = 0;
                for (; table[h] >= 0; h = (h + 1) & (hcap - 1))
                    if (!memcmp(down + (size_t)table[h] * W, next, W * sizeof(uint64_t))) {
                        found = 1;
                        break;
                    }
                if (found) continue;
                if ((long)cnt >= max_states) {
                    rc = err_set(err, PD_EINVAL, "the graph has more than %ld cut states (antichains); "
                                 "compress its branches or raise the limit", max_states);
                    goto fail;
                }
                if (cnt == cap) {
                    cap *= 2;
                    down = realloc(down, cap * W * sizeof(uint64_t));
                    PD_ASSERT(down);
                }
                memcpy(down + cnt * W, next, W * sizeof(uint64_t));
                table[h] = (int)cnt++;
                if (cnt * 2 > hcap) { /* grow and rehash */
                    hcap *= 2;
                    table = realloc(table, hcap * sizeof(int));
                    PD_ASSERT(table);
                    memset(table, -1, hcap * sizeof(int));
                    for (size_t i = 0; i < cnt; i++) {
                        size_t hh = hash_bits(down + i * W, W) & (hcap - 1);
                        while (table[hh] >= 0) hh = (hh + 1) & (hcap - 1);
                        table[hh] = (int)i;
                    }
                }
            }
    }
    /* Sort by size (then discovery): a topological order of the state DAG. */
    SizeKey *keys = malloc(cnt * sizeof *keys);
    PD_ASSERT(keys);
    for (size_t i = 0; i < cnt; i++) keys[i] = (SizeKey){popcount_bits(down + i * W, W), (int)i};
    qsort(keys, cnt, sizeof *keys, cmp_size);
    if (keys[cnt - 1].size != n) {
        int miss = -1;
        const uint64_t *last = down + (size_t)keys[cnt - 1].id * W;
        for (int v = 0; v < n && miss < 0; v++)
            if (!(last[v / 64] >> (v % 64) & 1)) miss = v;
        free(keys);
        rc = err_set(err, PD_EINVAL, "node %d (layer %d) cannot be reached from the first source layer %d: "
                     "the planner needs one connected graph fed from one source (besides Input nodes)",
                     miss, g->layer[miss], g->layer[g->source0]);
        goto fail;
    }
    s->n = (int)cnt;
    s->words = W;
    s->down = malloc(cnt * W * sizeof(uint64_t));
    s->C = malloc(cnt * sizeof(double));
    s->ACT = malloc(cnt * sizeof(double));
    s->PAR = malloc(cnt * sizeof(double));
    s->OA = malloc(cnt * sizeof(double));
    s->OX = malloc(cnt * sizeof(double));
    PD_ASSERT(s->down && s->C && s->ACT && s->PAR && s->OA && s->OX);
    for (size_t i = 0; i < cnt; i++) memcpy(s->down + i * W, down + (size_t)keys[i].id * W, W * sizeof(uint64_t));
    free(keys);
    /* The authors' extra nodes depend on the antichain member only: X(a) = ancestors v of
     * a with an out-edge to a node outside pred(a) + {a} (augment_antichain). The
     * augmented antichain of D is its maximal nodes plus the union of X(a) over them. */
    uint64_t *X = calloc((size_t)n * W, sizeof(uint64_t)), *cl = malloc(W * sizeof(uint64_t));
    uint64_t *aug = malloc(W * sizeof(uint64_t));
    PD_ASSERT(X && cl && aug);
    for (int a = 0; a < n; a++) {
        const uint64_t *pa = g->pred + (size_t)a * W;
        for (int w = 0; w < W; w++) cl[w] = pa[w];
        cl[a / 64] |= (uint64_t)1 << (a % 64);
        for (int w = 0; w < W; w++)
            for (uint64_t m = pa[w]; m; m &= m - 1) {
                int v = w * 64 + __builtin_ctzll(m);
                if (!bits_subset(g->outs + (size_t)v * W, cl, W)) X[(size_t)a * W + v / 64] |= (uint64_t)1 << (v % 64);
            }
    }
    for (size_t i = 0; i < cnt; i++) {
        const uint64_t *D = s->down + i * W;
        double C = 0, A = 0, P = 0, OA = 0, OX = 0;
        memset(aug, 0, W * sizeof(uint64_t));
        for (int w = 0; w < W; w++)
            for (uint64_t m = D[w]; m; m &= m - 1) {
                int v = w * 64 + __builtin_ctzll(m);
                C += g->ct[v];
                A += g->act[v];
                P += g->par[v];
                const uint64_t *o = g->outs + (size_t)v * W;
                int leaves = 0, inside = 0;
                for (int x = 0; x < W; x++) {
                    leaves |= (o[x] & ~D[x]) != 0;
                    inside |= (o[x] & D[x]) != 0;
                }
                if (leaves) OX += g->act[v];
                if (!inside) { /* a maximal node: an antichain member */
                    aug[v / 64] |= (uint64_t)1 << (v % 64);
                    for (int x = 0; x < W; x++) aug[x] |= X[(size_t)v * W + x];
                }
            }
        for (int w = 0; w < W; w++)
            for (uint64_t m = aug[w]; m; m &= m - 1) OA += g->act[w * 64 + __builtin_ctzll(m)];
        s->C[i] = C;
        s->ACT[i] = A;
        s->PAR[i] = P;
        s->OA[i] = OA;
        s->OX[i] = OX;
    }
    free(X);
    free(aug);
    free(cl);
    free(down);
    free(table);
    free(cand);
    free(next);
    return PD_OK;
fail:
    free(down);
    free(table);
    free(cand);
    free(next);
    pstates_release(s);
    return rc;
}
