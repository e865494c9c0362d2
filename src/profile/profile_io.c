/* profile_io.c: reading and writing profiles. Our JSON format (docs/reference/formats.md) is read
 * strictly (unknown keys are errors) and written with every double round-tripping
 * exactly; the authors' graph.txt (docs/explanation/authors-planner.md §2) is read line by line, its nodes put in
 * a topological order (Kahn, ties by file line) and its milliseconds turned into seconds.
 * It does not measure anything (that is the profiler) and does not write graph.txt. */
#include "profile.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PROFILE_MAX_BYTES ((size_t)256 << 20)

void profile_release(Profile *p) {
    if (!p) return;
    free(p->layers);
    free(p->edges);
    memset(p, 0, sizeof *p);
}

int profile_is_chain(const Profile *p) {
    if (p->n_edges == 0) return 1;
    if (p->n_edges != p->n_layers - 1) return 0;
    /* exactly the edges i -> i+1, in any order */
    char *seen = calloc((size_t)p->n_layers, 1);
    PD_ASSERT(seen);
    int chain = 1;
    for (int e = 0; e < p->n_edges && chain; e++) {
        int a = p->edges[e][0];
        chain = a >= 0 && a + 1 < p->n_layers && p->edges[e][1] == a + 1 && !seen[a];
        if (chain) seen[a] = 1;
    }
    free(seen);
    return chain;
}

static int cmp_edge(const void *a, const void *b) {
    const int *x = a, *y = b;
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

int profile_validate(const Profile *p, Err *err) {
    if (p->n_layers <= 0) return err_set(err, PD_EINVAL, "profile has no layers");
    for (int i = 0; i < p->n_layers; i++) {
        const ProfileLayer *l = &p->layers[i];
        const double v[12] = {l->fwd_s, l->bwd_s, l->act_bytes, l->param_bytes, l->bwd_in_s, l->bwd_w_s,
                              l->saved_bytes, l->step_s, l->small_fwd_s, l->small_bwd_s, l->small_bwd_in_s,
                              l->small_bwd_w_s};
        static const char *what[12] = {"forward time", "backward time", "activation bytes", "parameter bytes",
                                       "backward input time", "backward weight time", "saved bytes", "step time",
                                       "small-batch forward time", "small-batch backward time",
                                       "small-batch backward input time", "small-batch backward weight time"};
        for (int k = 0; k < 12; k++)
            if (!isfinite(v[k]) || v[k] < 0)
                return err_set(err, PD_EINVAL, "layer %d (\"%s\"): %s %g is negative or not finite", i,
                               l->name, what[k], v[k]);
        for (int k = 0; k < PROFILE_SCRATCH_SLOTS; k++)
            for (int b = 0; b < 2; b++)
                if (!isfinite(l->scratch[k][b]) || l->scratch[k][b] < 0)
                    return err_set(err, PD_EINVAL, "layer %d (\"%s\"): scratch bytes %g of slot %d are negative or not finite",
                                   i, l->name, l->scratch[k][b], k);
        if (l->step_s > l->bwd_s)   /* a part of backward: the simulator subtracts it */
            return err_set(err, PD_EINVAL, "layer %d (\"%s\"): step_s %g exceeds backward_s %g (it is a part of it)", i,
                           l->name, l->step_s, l->bwd_s);
        if (p->small_batch == 0 && l->small_fwd_s + l->small_bwd_s + l->small_bwd_in_s + l->small_bwd_w_s > 0)
            return err_set(err, PD_EINVAL, "layer %d (\"%s\"): small-batch times without the profile's small_batch", i,
                           l->name);
    }
    if (p->small_batch != 0 && (p->small_batch < 1 || p->small_batch >= p->minibatch))
        return err_set(err, PD_EINVAL, "small_batch %d is not between 1 and minibatch - 1 (minibatch %d)", p->small_batch,
                       p->minibatch);
    if (!(p->input_bytes >= 0) || !isfinite(p->input_bytes))
        return err_set(err, PD_EINVAL, "input_bytes %g is negative or not finite", p->input_bytes);
    for (int e = 0; e < p->n_edges; e++) {
        int a = p->edges[e][0], b = p->edges[e][1];
        if (a < 0 || a >= p->n_layers || b < 0 || b >= p->n_layers)
            return err_set(err, PD_EINVAL, "edge %d (%d -> %d) names an unknown layer (there are %d)", e, a, b,
                           p->n_layers);
        if (a == b) return err_set(err, PD_EINVAL, "edge %d: layer %d feeds itself (a cycle)", e, a);
        if (a > b)
            return err_set(err, PD_EINVAL, "edge %d (%d -> %d) goes backwards: layers must be in a topological order",
                           e, a, b);
    }
    if (p->n_edges > 1) {
        int (*s)[2] = malloc(sizeof(int[2]) * (size_t)p->n_edges);
        PD_ASSERT(s);
        memcpy(s, p->edges, sizeof(int[2]) * (size_t)p->n_edges);
        qsort(s, (size_t)p->n_edges, sizeof s[0], cmp_edge);
        for (int e = 1; e < p->n_edges; e++)
            if (s[e][0] == s[e - 1][0] && s[e][1] == s[e - 1][1]) {
                int a = s[e][0], b = s[e][1];
                free(s);
                return err_set(err, PD_EINVAL, "duplicate edge %d -> %d", a, b);
            }
        free(s);
    }
    return PD_OK;
}

/* ---- our JSON -------------------------------------------------------------------- */

static int copy_str(char *dst, size_t n, const char *src, const char *ctx, const char *key, Err *err) {
    if (strlen(src) >= n)
        return err_set(err, PD_EINVAL, "%s: key \"%s\": \"%s\" is longer than %zu characters", ctx, key, src, n - 1);
    strcpy(dst, src);
    return PD_OK;
}

static int parse_json(const char *text, const char *path, Profile *p, Err *err) {
    cJSON *root = pd_json_parse(text, path, err);
    if (!root) return PD_EINVAL;
    int rc;
    JObj j;
    const char *s;
    if ((rc = jobj_init(&j, root, err, "%s", path))) goto done;
    if ((rc = jobj_str(&j, "format", 1, &s, err))) goto done;
    if (strcmp(s, "pipedream-profile") != 0) {
        rc = err_set(err, PD_EINVAL, "%s: key \"format\": expected \"pipedream-profile\", got \"%s\"", path, s);
        goto done;
    }
    int version = 0;
    if ((rc = jobj_int(&j, "version", 1, 1, 1, &version, err))) goto done;
    if ((rc = jobj_str(&j, "model", 1, &s, err)) || (rc = copy_str(p->model, sizeof p->model, s, path, "model", err)))
        goto done;
    strcpy(p->source, "pipedream-profile");
    if ((rc = jobj_int(&j, "minibatch", 1, 0, 1 << 30, &p->minibatch, err))) goto done;
    s = "";
    if ((rc = jobj_str(&j, "measured_on", 0, &s, err)) ||
        (rc = copy_str(p->measured_on, sizeof p->measured_on, s, path, "measured_on", err)))
        goto done;
    if ((rc = jobj_int(&j, "threads", 0, 0, 1 << 20, &p->threads, err))) goto done;
    if ((rc = jobj_int(&j, "iterations", 0, 0, 1 << 30, &p->iterations, err))) goto done;
    if ((rc = jobj_int(&j, "rounds", 0, 0, 1 << 20, &p->rounds, err))) goto done;
    s = "";
    if ((rc = jobj_str(&j, "round_kept", 0, &s, err))) goto done;
    if (*s && strcmp(s, "median") && strcmp(s, "fastest")) {
        rc = err_set(err, PD_EINVAL, "%s: \"round_kept\" is \"%s\", expected \"median\" or \"fastest\"", path, s);
        goto done;
    }
    snprintf(p->round_kept, sizeof p->round_kept, "%s", s);
    if ((rc = jobj_num(&j, "input_bytes", 0, 0, 1e300, &p->input_bytes, err))) goto done;
    /* below minibatch: profile_validate, once the whole file is read */
    if ((rc = jobj_int(&j, "small_batch", 0, 1, 1 << 30, &p->small_batch, err))) goto done;
    const cJSON *layers = jobj_get(&j, "layers");
    if (!layers || !cJSON_IsArray(layers)) {
        rc = err_set(err, PD_EINVAL, "%s: key \"layers\": expected an array of layer objects", path);
        goto done;
    }
    p->n_layers = cJSON_GetArraySize(layers);
    if (p->n_layers == 0) {
        rc = err_set(err, PD_EINVAL, "%s: key \"layers\": the profile has no layers", path);
        goto done;
    }
    p->layers = calloc((size_t)p->n_layers, sizeof *p->layers);
    PD_ASSERT(p->layers);
    int i = 0;
    for (const cJSON *c = layers->child; c; c = c->next, i++) {
        ProfileLayer *l = &p->layers[i];
        JObj lj;
        char ctx[128];
        snprintf(ctx, sizeof ctx, "%s: layer %d", path, i);
        if ((rc = jobj_init(&lj, c, err, "%s", ctx))) goto done;
        if ((rc = jobj_str(&lj, "name", 1, &s, err)) || (rc = copy_str(l->name, sizeof l->name, s, ctx, "name", err)))
            goto done;
        if ((rc = jobj_str(&lj, "type", 1, &s, err)) || (rc = copy_str(l->type, sizeof l->type, s, ctx, "type", err)))
            goto done;
        if ((rc = jobj_num(&lj, "forward_s", 1, 0, 1e30, &l->fwd_s, err))) goto done;
        if ((rc = jobj_num(&lj, "backward_s", 1, 0, 1e30, &l->bwd_s, err))) goto done;
        if ((rc = jobj_num(&lj, "activation_bytes", 1, 0, 1e300, &l->act_bytes, err))) goto done;
        if ((rc = jobj_num(&lj, "parameter_bytes", 1, 0, 1e300, &l->param_bytes, err))) goto done;
        if (jobj_has(&lj, "saved_bytes")) {
            if (i > 0 && !p->saved_measured) {
                rc = err_set(err, PD_EINVAL, "%s: saved_bytes given for some layers but not for all", ctx);
                goto done;
            }
            if ((rc = jobj_num(&lj, "saved_bytes", 1, 0, 1e300, &l->saved_bytes, err))) goto done;
            p->saved_measured = 1;
        } else if (p->saved_measured) {
            rc = err_set(err, PD_EINVAL, "%s: saved_bytes missing (the layers before have it)", ctx);
            goto done;
        }
        int has_bi = jobj_has(&lj, "backward_input_s"), has_bw = jobj_has(&lj, "backward_weight_s");
        if (has_bi != has_bw) {
            rc = err_set(err, PD_EINVAL, "%s: give both backward_input_s and backward_weight_s, or neither", ctx);
            goto done;
        }
        if ((rc = jobj_num(&lj, "backward_input_s", 0, 0, 1e30, &l->bwd_in_s, err)) ||
            (rc = jobj_num(&lj, "backward_weight_s", 0, 0, 1e30, &l->bwd_w_s, err)))
            goto done;
        if ((rc = jobj_num(&lj, "step_s", 0, 0, 1e30, &l->step_s, err))) goto done;
        if ((rc = jobj_num(&lj, "cut_output_forward_s", 0, 0, 1e30, &l->cut_out_fwd_s, err)) ||
            (rc = jobj_num(&lj, "cut_output_backward_s", 0, 0, 1e30, &l->cut_out_bwd_s, err)) ||
            (rc = jobj_num(&lj, "cut_input_forward_s", 0, 0, 1e30, &l->cut_in_fwd_s, err)) ||
            (rc = jobj_num(&lj, "cut_input_backward_s", 0, 0, 1e30, &l->cut_in_bwd_s, err)))
            goto done;
        if ((i == 0 && l->cut_in_fwd_s + l->cut_in_bwd_s > 0) ||
            (i == p->n_layers - 1 && l->cut_out_fwd_s + l->cut_out_bwd_s > 0)) {
            rc = err_set(err, PD_EINVAL, "%s: no stage boundary can be %s it: cut_%s_* must be 0", ctx,
                         i == 0 ? "before" : "after", i == 0 ? "input" : "output");
            goto done;
        }
        /* the small-batch times: forward and backward for every layer when the profile has a
         * small_batch (none otherwise), and the split passes where the full split is given */
        int has_sf = jobj_has(&lj, "small_forward_s"), has_sb = jobj_has(&lj, "small_backward_s");
        int has_sbi = jobj_has(&lj, "small_backward_input_s"), has_sbw = jobj_has(&lj, "small_backward_weight_s");
        if (p->small_batch ? !(has_sf && has_sb) : (has_sf || has_sb || has_sbi || has_sbw)) {
            rc = err_set(err, PD_EINVAL,
                         p->small_batch ? "%s: small_forward_s and small_backward_s missing (the profile has small_batch)"
                                        : "%s: small-batch times given but the profile has no small_batch",
                         ctx);
            goto done;
        }
        if (has_sbi != has_sbw || (p->small_batch && has_sbi != has_bi)) {
            rc = err_set(err, PD_EINVAL,
                         "%s: give small_backward_input_s and small_backward_weight_s with backward_input_s and "
                         "backward_weight_s, or none of them",
                         ctx);
            goto done;
        }
        if ((rc = jobj_num(&lj, "small_forward_s", 0, 0, 1e30, &l->small_fwd_s, err)) ||
            (rc = jobj_num(&lj, "small_backward_s", 0, 0, 1e30, &l->small_bwd_s, err)) ||
            (rc = jobj_num(&lj, "small_backward_input_s", 0, 0, 1e30, &l->small_bwd_in_s, err)) ||
            (rc = jobj_num(&lj, "small_backward_weight_s", 0, 0, 1e30, &l->small_bwd_w_s, err)))
            goto done;
        const cJSON *sc = jobj_get(&lj, "scratch");   /* [[slot, bytes, bytes at one sample], ...] */
        if (sc) {
            if (!cJSON_IsArray(sc)) {
                rc = err_set(err, PD_EINVAL, "%s: key \"scratch\": expected an array of [slot, bytes, bytes_at_1]", ctx);
                goto done;
            }
            for (const cJSON *e = sc->child; e; e = e->next) {
                const cJSON *a = cJSON_IsArray(e) && cJSON_GetArraySize(e) == 3 ? e->child : NULL;
                if (!a || !cJSON_IsNumber(a) || !cJSON_IsNumber(a->next) || !cJSON_IsNumber(a->next->next) ||
                    a->valuedouble != (int)a->valuedouble || a->valuedouble < 0 || a->valuedouble >= PROFILE_SCRATCH_SLOTS) {
                    rc = err_set(err, PD_EINVAL, "%s: key \"scratch\": expected [slot (0..%d), bytes, bytes_at_1]", ctx,
                                 PROFILE_SCRATCH_SLOTS - 1);
                    goto done;
                }
                l->scratch[(int)a->valuedouble][0] = a->next->valuedouble;
                l->scratch[(int)a->valuedouble][1] = a->next->next->valuedouble;
            }
        }
        if ((rc = jobj_done(&lj, err))) goto done;
    }
    const cJSON *edges = jobj_get(&j, "edges");
    if (edges && (rc = profile_read_edges(edges, path, &p->edges, &p->n_edges, err))) goto done;
    if ((rc = jobj_done(&j, err))) goto done;
    if ((rc = profile_validate(p, err))) err_prefix(err, "%s", path);
done:
    cJSON_Delete(root);
    return rc;
}

int profile_save(const Profile *p, const char *path, Err *err) {
    int rc = profile_validate(p, err);
    if (rc) return err_prefix(err, "%s: refusing to write an invalid profile", path);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "pipedream-profile");
    cJSON_AddItemToObject(root, "version", pd_json_num(1));
    cJSON_AddStringToObject(root, "model", p->model);
    cJSON_AddItemToObject(root, "minibatch", pd_json_num(p->minibatch));
    cJSON_AddStringToObject(root, "measured_on", p->measured_on);
    cJSON_AddItemToObject(root, "threads", pd_json_num(p->threads));
    cJSON_AddItemToObject(root, "iterations", pd_json_num(p->iterations));
    if (p->rounds > 1) cJSON_AddItemToObject(root, "rounds", pd_json_num(p->rounds));
    if (p->rounds > 1 && p->round_kept[0]) cJSON_AddStringToObject(root, "round_kept", p->round_kept);
    cJSON_AddItemToObject(root, "input_bytes", pd_json_num(p->input_bytes));
    if (p->small_batch > 0) cJSON_AddItemToObject(root, "small_batch", pd_json_num(p->small_batch));
    cJSON *layers = cJSON_AddArrayToObject(root, "layers");
    for (int i = 0; i < p->n_layers; i++) {
        const ProfileLayer *l = &p->layers[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", l->name);
        cJSON_AddStringToObject(o, "type", l->type);
        cJSON_AddItemToObject(o, "forward_s", pd_json_num(l->fwd_s));
        cJSON_AddItemToObject(o, "backward_s", pd_json_num(l->bwd_s));
        cJSON_AddItemToObject(o, "activation_bytes", pd_json_num(l->act_bytes));
        cJSON_AddItemToObject(o, "parameter_bytes", pd_json_num(l->param_bytes));
        if (p->saved_measured) cJSON_AddItemToObject(o, "saved_bytes", pd_json_num(l->saved_bytes));
        if (l->bwd_in_s + l->bwd_w_s > 0) {   /* the split backward, when measured */
            cJSON_AddItemToObject(o, "backward_input_s", pd_json_num(l->bwd_in_s));
            cJSON_AddItemToObject(o, "backward_weight_s", pd_json_num(l->bwd_w_s));
        }
        if (l->step_s > 0) cJSON_AddItemToObject(o, "step_s", pd_json_num(l->step_s));
        if (l->cut_out_fwd_s + l->cut_out_bwd_s > 0) {
            cJSON_AddItemToObject(o, "cut_output_forward_s", pd_json_num(l->cut_out_fwd_s));
            cJSON_AddItemToObject(o, "cut_output_backward_s", pd_json_num(l->cut_out_bwd_s));
        }
        if (l->cut_in_fwd_s + l->cut_in_bwd_s > 0) {
            cJSON_AddItemToObject(o, "cut_input_forward_s", pd_json_num(l->cut_in_fwd_s));
            cJSON_AddItemToObject(o, "cut_input_backward_s", pd_json_num(l->cut_in_bwd_s));
        }
        if (p->small_batch > 0) {
            cJSON_AddItemToObject(o, "small_forward_s", pd_json_num(l->small_fwd_s));
            cJSON_AddItemToObject(o, "small_backward_s", pd_json_num(l->small_bwd_s));
            if (l->bwd_in_s + l->bwd_w_s > 0) {
                cJSON_AddItemToObject(o, "small_backward_input_s", pd_json_num(l->small_bwd_in_s));
                cJSON_AddItemToObject(o, "small_backward_weight_s", pd_json_num(l->small_bwd_w_s));
            }
        }
        cJSON *sc = NULL;
        for (int k = 0; k < PROFILE_SCRATCH_SLOTS; k++)
            if (l->scratch[k][0] > 0 || l->scratch[k][1] > 0) {
                if (!sc) sc = cJSON_AddArrayToObject(o, "scratch");
                cJSON *e = cJSON_CreateArray();
                cJSON_AddItemToArray(e, pd_json_num(k));
                cJSON_AddItemToArray(e, pd_json_num(l->scratch[k][0]));
                cJSON_AddItemToArray(e, pd_json_num(l->scratch[k][1]));
                cJSON_AddItemToArray(sc, e);
            }
        cJSON_AddItemToArray(layers, o);
    }
    if (p->n_edges > 0 && !profile_is_chain(p)) {
        cJSON *edges = cJSON_AddArrayToObject(root, "edges");
        for (int e = 0; e < p->n_edges; e++) cJSON_AddItemToArray(edges, cJSON_CreateIntArray(p->edges[e], 2));
    }
    rc = pd_json_save(root, path, err);
    cJSON_Delete(root);
    return rc;
}

/* ---- graph.txt ------------------------------------------------------------------- */

typedef struct GNode {
    char id[64];
    ProfileLayer l;
} GNode;

/* Parses "key=<number>" at s (exactly key), the value ending at the end of s. */
static int g_number(const char *s, const char *key, double *out) {
    size_t k = strlen(key);
    if (strncmp(s, key, k) != 0 || s[k] != '=') return -1;
    char *end;
    *out = strtod(s + k + 1, &end);
    return (end == s + k + 1 || *end) ? -1 : 0;
}

/* activation_size=<f> or activation_size=[a; b; c] (summed). */
static int g_activation(char *s, double *out) {
    const char *key = "activation_size=";
    if (strncmp(s, key, strlen(key)) != 0) return -1;
    s += strlen(key);
    if (*s != '[') {
        char *end;
        *out = strtod(s, &end);
        return (end == s || *end) ? -1 : 0;
    }
    size_t n = strlen(s);
    if (n < 2 || s[n - 1] != ']') return -1;
    s[n - 1] = 0;
    s++;
    double sum = 0;
    for (char *tok = s;;) {
        char *end;
        double v = strtod(tok, &end);
        if (end == tok) return -1;
        sum += v;
        if (!*end) break;
        if (strncmp(end, "; ", 2) != 0) return -1;
        tok = end + 2;
    }
    *out = sum;
    return 0;
}

/* Splits s at every " -- " (in place); returns the number of fields (at most max). */
static int split_dashes(char *s, char **f, int max) {
    int n = 0;
    f[n++] = s;
    for (char *c = strstr(s, " -- "); c; c = strstr(c, " -- ")) {
        if (n == max) return max + 1;
        *c = 0;
        c += 4;
        f[n++] = c;
    }
    return n;
}

static int find_node(const GNode *nodes, int n, const char *id) {
    for (int i = 0; i < n; i++)
        if (strcmp(nodes[i].id, id) == 0) return i;
    return -1;
}

static int parse_graph_txt(char *text, const char *path, Profile *p, Err *err) {
    int cap = 64, n = 0, ecap = 64, ne = 0, rc = PD_OK;
    GNode *nodes = malloc(sizeof *nodes * (size_t)cap);
    int (*edges)[2] = malloc(sizeof(int[2]) * (size_t)ecap);
    int *order = NULL, *indeg = NULL, *pos = NULL;
    PD_ASSERT(nodes && edges);
    int lineno = 0;
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        lineno++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r') line[--len] = 0;
        char *f[8];
        if (len == 0 || strspn(line, " \t") == len) {
            /* blank lines are tolerated (the authors strip the text) */
        } else if (line[0] == '\t') {
            int nf = split_dashes(line + 1, f, 2);
            if (nf != 2) {
                rc = err_set(err, PD_EINVAL, "%s:%d: malformed edge line (expected \"\\t<src> -- <dst>\")", path, lineno);
                goto done;
            }
            int a = find_node(nodes, n, f[0]), b = find_node(nodes, n, f[1]);
            if (a < 0 || b < 0) {
                rc = err_set(err, PD_EINVAL, "%s:%d: edge names unknown node \"%s\"", path, lineno, a < 0 ? f[0] : f[1]);
                goto done;
            }
            if (ne == ecap) {
                ecap *= 2;
                edges = realloc(edges, sizeof(int[2]) * (size_t)ecap);
                PD_ASSERT(edges);
            }
            edges[ne][0] = a;
            edges[ne][1] = b;
            ne++;
        } else {
            if (ne > 0) {
                rc = err_set(err, PD_EINVAL, "%s:%d: node line after the first edge line", path, lineno);
                goto done;
            }
            int nf = split_dashes(line, f, 4);
            if (nf < 3 || nf > 4) {
                rc = err_set(err, PD_EINVAL,
                             "%s:%d: malformed node line (expected \"<id> -- <desc> -- forward_compute_time=..., "
                             "backward_compute_time=..., activation_size=..., parameter_size=...\")",
                             path, lineno);
                goto done;
            }
            if (n == cap) {
                cap *= 2;
                nodes = realloc(nodes, sizeof *nodes * (size_t)cap);
                PD_ASSERT(nodes);
            }
            GNode *g = &nodes[n];
            memset(g, 0, sizeof *g);
            if (strlen(f[0]) == 0 || strlen(f[0]) >= sizeof g->id || strchr(f[0], ' ')) {
                rc = err_set(err, PD_EINVAL, "%s:%d: bad node id \"%.80s\"", path, lineno, f[0]);
                goto done;
            }
            if (find_node(nodes, n, f[0]) >= 0) {
                rc = err_set(err, PD_EINVAL, "%s:%d: duplicate node id \"%s\"", path, lineno, f[0]);
                goto done;
            }
            strcpy(g->id, f[0]);
            snprintf(g->l.name, sizeof g->l.name, "%s", f[0]);
            snprintf(g->l.type, sizeof g->l.type, "%s", f[1]);
            g->l.line = lineno;
            char *m[5];
            int nm = 0;
            m[nm++] = f[2];
            for (char *c = strstr(f[2], ", "); c && nm < 5; c = strstr(c, ", ")) {
                *c = 0;
                c += 2;
                m[nm++] = c;
            }
            double fw, bw;
            if (nm != 4 || g_number(m[0], "forward_compute_time", &fw) ||
                g_number(m[1], "backward_compute_time", &bw) || g_activation(m[2], &g->l.act_bytes) ||
                g_number(m[3], "parameter_size", &g->l.param_bytes)) {
                rc = err_set(err, PD_EINVAL,
                             "%s:%d: malformed node metadata (expected \"forward_compute_time=<f>, "
                             "backward_compute_time=<f>, activation_size=<f or [a; b]>, parameter_size=<f>\")",
                             path, lineno);
                goto done;
            }
            if (nf == 4) {
                char *end;
                if (strncmp(f[3], "stage_id=", 9) != 0 || (strtol(f[3] + 9, &end, 10), end == f[3] + 9 || *end)) {
                    rc = err_set(err, PD_EINVAL, "%s:%d: malformed stage_id field \"%.40s\"", path, lineno, f[3]);
                    goto done;
                }
            }
            const double v[4] = {fw, bw, g->l.act_bytes, g->l.param_bytes};
            static const char *what[4] = {"forward_compute_time", "backward_compute_time", "activation_size",
                                          "parameter_size"};
            for (int k = 0; k < 4; k++)
                if (!isfinite(v[k]) || v[k] < 0) {
                    rc = err_set(err, PD_EINVAL, "%s:%d: node %s: %s %g is negative or not finite", path, lineno,
                                 g->id, what[k], v[k]);
                    goto done;
                }
            g->l.fwd_s = fw / 1000.0; /* milliseconds -> seconds */
            g->l.bwd_s = bw / 1000.0;
            n++;
        }
        line = nl ? nl + 1 : NULL;
    }
    if (n == 0) {
        rc = err_set(err, PD_EINVAL, "%s: empty graph (no node lines)", path);
        goto done;
    }
    /* Kahn's algorithm, ties broken by file line, so the order is deterministic. */
    order = malloc(sizeof(int) * (size_t)n);
    indeg = calloc((size_t)n, sizeof(int));
    pos = malloc(sizeof(int) * (size_t)n);
    PD_ASSERT(order && indeg && pos);
    for (int e = 0; e < ne; e++) {
        if (edges[e][0] == edges[e][1]) {
            rc = err_set(err, PD_EINVAL, "%s: edge %s -> %s is a self-loop (a cycle)", path, nodes[edges[e][0]].id,
                         nodes[edges[e][0]].id);
            goto done;
        }
        indeg[edges[e][1]]++;
    }
    int done_n = 0;
    char *taken = calloc((size_t)n, 1);
    PD_ASSERT(taken);
    for (; done_n < n; done_n++) {
        int pick = -1;
        for (int i = 0; i < n; i++)
            if (!taken[i] && indeg[i] == 0) {
                pick = i;
                break;
            }
        if (pick < 0) break;
        taken[pick] = 1;
        pos[pick] = done_n;
        order[done_n] = pick;
        for (int e = 0; e < ne; e++)
            if (edges[e][0] == pick) indeg[edges[e][1]]--;
    }
    if (done_n < n) {
        int bad = -1;
        for (int i = 0; i < n && bad < 0; i++)
            if (!taken[i]) bad = i;
        free(taken);
        rc = err_set(err, PD_EINVAL, "%s: the graph has a cycle (through node %s)", path, nodes[bad].id);
        goto done;
    }
    free(taken);
    p->n_layers = n;
    p->layers = calloc((size_t)n, sizeof *p->layers);
    PD_ASSERT(p->layers);
    for (int i = 0; i < n; i++) p->layers[i] = nodes[order[i]].l;
    p->n_edges = ne;
    p->edges = calloc((size_t)ne + 1, sizeof *p->edges);
    PD_ASSERT(p->edges);
    for (int e = 0; e < ne; e++) {
        p->edges[e][0] = pos[edges[e][0]];
        p->edges[e][1] = pos[edges[e][1]];
    }
    strcpy(p->source, "graph.txt");
    /* Model name: the folder the file is in (profiles/<model>/graph.txt), else the file name. */
    const char *slash = strrchr(path, '/');
    if (slash && slash > path) {
        const char *b = slash - 1;
        while (b > path && b[-1] != '/') b--;
        snprintf(p->model, sizeof p->model, "%.*s", (int)(slash - b) < 63 ? (int)(slash - b) : 63, b);
    } else {
        snprintf(p->model, sizeof p->model, "%s", path);
    }
    if ((rc = profile_validate(p, err))) err_prefix(err, "%s", path);
done:
    free(nodes);
    free(edges);
    free(order);
    free(indeg);
    free(pos);
    return rc;
}

int profile_parse(const char *text, const char *path, Profile *out, Err *err) {
    memset(out, 0, sizeof *out);
    const char *c = text;
    while (*c == ' ' || *c == '\t' || *c == '\n' || *c == '\r') c++;
    int rc;
    if (*c == '{') {
        rc = parse_json(text, path, out, err);
    } else {
        size_t n = strlen(text);
        char *copy = malloc(n + 1);
        PD_ASSERT(copy);
        memcpy(copy, text, n + 1);
        rc = parse_graph_txt(copy, path, out, err);
        free(copy);
    }
    if (rc) {
        profile_release(out);
        return rc;
    }
    out->checksum = pd_crc32(text, strlen(text));
    return PD_OK;
}

int profile_load(const char *path, Profile *out, Err *err) {
    memset(out, 0, sizeof *out);
    char *text;
    size_t len;
    int rc = pd_read_file(path, PROFILE_MAX_BYTES, &text, &len, err);
    if (rc) return rc;
    if (strlen(text) != len) {
        pd_free(text);
        return err_set(err, PD_EINVAL, "%s: contains a NUL byte (not a profile)", path);
    }
    rc = profile_parse(text, path, out, err);
    pd_free(text);
    return rc;
}

int profile_read_edges(const cJSON *edges, const char *path, int (**out)[2], int *n, Err *err) {
    *out = NULL;
    *n = 0;
    if (!cJSON_IsArray(edges))
        return err_set(err, PD_EINVAL, "%s: key \"edges\": expected an array of [src, dst] pairs", path);
    int m = cJSON_GetArraySize(edges);
    int (*ed)[2] = calloc((size_t)m + 1, sizeof *ed);
    PD_ASSERT(ed);
    int e = 0;
    for (const cJSON *c = edges->child; c; c = c->next, e++) {
        if (!cJSON_IsArray(c) || cJSON_GetArraySize(c) != 2 || pd_json_int(cJSON_GetArrayItem(c, 0), &ed[e][0]) ||
            pd_json_int(cJSON_GetArrayItem(c, 1), &ed[e][1])) {
            free(ed);
            return err_set(err, PD_EINVAL, "%s: edge %d: expected a pair of layer indices [src, dst]", path, e);
        }
    }
    *out = ed;
    *n = m;
    return PD_OK;
}

static double less(double a, double b) { return a > b ? a - b : 0; }

void profile_layer_less_step(const ProfileLayer *l, double cut, double *bwd, double *bwd_in, double *bwd_w) {
    *bwd = less(l->bwd_s, cut);
    *bwd_in = l->bwd_w_s > 0 ? l->bwd_in_s : less(l->bwd_in_s, cut);
    *bwd_w = l->bwd_w_s > 0 ? less(l->bwd_w_s, cut) : 0;
}

ProfileLayer profile_layer_small(const ProfileLayer *l) {
    ProfileLayer s = *l;
    s.fwd_s = l->small_fwd_s, s.bwd_s = l->small_bwd_s, s.bwd_in_s = l->small_bwd_in_s, s.bwd_w_s = l->small_bwd_w_s;
    return s;
}

void profile_scale_layer(Profile *p, int l, double f) {
    PD_ASSERT(l >= 0 && l < p->n_layers && f > 0);
    ProfileLayer *x = &p->layers[l];
    x->fwd_s *= f, x->bwd_s *= f, x->bwd_in_s *= f, x->bwd_w_s *= f, x->step_s *= f;
    x->small_fwd_s *= f, x->small_bwd_s *= f, x->small_bwd_in_s *= f, x->small_bwd_w_s *= f;
    x->cut_out_fwd_s *= f, x->cut_out_bwd_s *= f, x->cut_in_fwd_s *= f, x->cut_in_bwd_s *= f;
}

void profile_spread_step(Profile *p, int m) {
    if (m <= 1) return;
    for (int i = 0; i < p->n_layers; i++) {
        ProfileLayer *l = &p->layers[i];
        double cut = l->step_s * (1.0 - 1.0 / m);
        if (!(cut > 0)) continue;
        if (p->small_batch > 0) {   /* the small-batch backward holds the same step */
            ProfileLayer s = profile_layer_small(l);
            profile_layer_less_step(&s, cut, &l->small_bwd_s, &l->small_bwd_in_s, &l->small_bwd_w_s);
        }
        profile_layer_less_step(l, cut, &l->bwd_s, &l->bwd_in_s, &l->bwd_w_s);
        l->step_s -= cut;
    }
}
