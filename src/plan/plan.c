/* plan.c: plan_new (profile + cluster -> stages, replicas, ranks), the checks a plan must
 * pass before it is written, the plan JSON (docs/reference/formats.md) and the printed table. The
 * dynamic programs live in plan_compat.c and plan_ours.c, the cut states in
 * plan_graph.c. Runs nothing; see schedule.h. */
#include "plan_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *COST_NAMES[] = {"ours", "pipedream"};
_Static_assert(sizeof COST_NAMES / sizeof COST_NAMES[0] == COST_COUNT, "one name per cost model");

const char *plan_cost_model_name(CostModel m) { return m >= 0 && m < COST_COUNT ? COST_NAMES[m] : "?"; }

CostModel plan_cost_model_parse(const char *name) {
    for (int i = 0; i < COST_COUNT; i++)
        if (!strcmp(name, COST_NAMES[i])) return (CostModel)i;
    return COST_COUNT;
}

Plan *plan_single(const char *model, int n_layers) {
    PD_ASSERT(n_layers >= 1);
    Plan *p = calloc(1, sizeof *p);
    PD_ASSERT(p);
    snprintf(p->model, sizeof p->model, "%s", model);
    p->n_layers = n_layers, p->n_stages = 1, p->n_workers = 1, p->noam = 1;
    p->stages = calloc(1, sizeof *p->stages);
    PD_ASSERT(p->stages);
    PlanStage *st = &p->stages[0];
    st->n_layers = n_layers, st->replicas = 1;
    st->layers = malloc((size_t)n_layers * sizeof(int));
    st->ranks = calloc(1, sizeof(int));
    PD_ASSERT(st->layers && st->ranks);
    for (int l = 0; l < n_layers; l++) st->layers[l] = l;
    p->cluster.n_levels = 1;
    p->cluster.level[0] = (ClusterLevel){.workers = 1, .bandwidth = 1e10, .latency = 1e-5};
    return p;
}

void plan_free(Plan *p) {
    if (!p) return;
    for (int s = 0; s < p->n_stages && p->stages; s++) {
        free(p->stages[s].layers);
        free(p->stages[s].ranks);
    }
    free(p->stages);
    free(p->edges);
    free(p->wire);
    free(p);
}

static const char *const g_wire_names[PLAN_WIRE_COUNT] = {"fp32", "bf16", "int8", "int4", "delta"};

const char *plan_wire_name(int wire) { return wire >= 0 && wire < PLAN_WIRE_COUNT ? g_wire_names[wire] : "?"; }

int plan_wire_parse(const char *name) {
    for (int i = 0; name && i < PLAN_WIRE_COUNT; i++)
        if (!strcmp(name, g_wire_names[i])) return i;
    return -1;
}

static int place_chunks(Plan *p, int V, int v_shape, Err *err) {
    int S = p->n_stages, d = p->stages[0].replicas;
    if (v_shape && (S % 2 || S < 4))
        return err_set(err, PD_EINVAL, "cannot place %d stages in a V: it needs an even number of stages, at least 4", S);
    free(p->wire);   /* its boundaries change */
    p->wire = NULL;
    if (V < 2 || S % V || S / V < 2)
        return err_set(err, PD_EINVAL, "cannot interleave %d stages in %d chunks: need V >= 2 dividing the stages and at "
                       "least 2 workers", S, V);
    for (int s = 0; s < S; s++)
        if (p->stages[s].replicas != d)
            return err_set(err, PD_EINVAL, "cannot %s: stage %d has %d replicas and stage 0 %d; it "
                           "replicates whole pipelines (plan with --straight, or every stage alike)",
                           v_shape ? "place in a V" : "interleave", s, p->stages[s].replicas, d);
    int W = S / V;
    double *per = calloc((size_t)W, sizeof(double));
    PD_ASSERT(per);
    for (int s = 0; s < S; s++) {
        for (int j = 0; j < d; j++) p->stages[s].ranks[j] = plan_chunk_rank(v_shape, s, W, d, j);
        per[plan_chunk_rank(v_shape, s, W, 1, 0)] += p->stages[s].time_s;
    }
    p->pipeline_s = 0;
    for (int w = 0; w < W; w++)
        if (per[w] > p->pipeline_s) p->pipeline_s = per[w];
    free(per);
    p->n_workers = W * d;
    p->noam = W;
    p->chunks = V;
    p->opts.chunks = V;
    p->v_shape = p->opts.v_shape = v_shape;
    return PD_OK;
}

int plan_interleave(Plan *p, int V, Err *err) { return place_chunks(p, V, 0, err); }
int plan_place_v(Plan *p, Err *err) { return place_chunks(p, 2, 1, err); }

int plan_stage_of_rank(const Plan *p, int rank, int *replica) {
    for (int s = 0; s < p->n_stages; s++)
        for (int r = 0; r < p->stages[s].replicas; r++)
            if (p->stages[s].ranks[r] == rank) {
                if (replica) *replica = r;
                return s;
            }
    return -1;
}

int plan_validate(const Plan *p, int n_layers, Err *err) {
    if (p->n_stages < 1) return err_set(err, PD_EINVAL, "plan has no stages");
    if (p->n_layers != n_layers)
        return err_set(err, PD_EINVAL, "plan is for %d layers but the profile has %d", p->n_layers, n_layers);
    int *stage_of = malloc(sizeof(int) * (size_t)(n_layers > 0 ? n_layers : 1));
    PD_ASSERT(stage_of);
    for (int i = 0; i < n_layers; i++) stage_of[i] = -1;
    int rc = PD_OK, workers = 0;
    for (int s = 0; s < p->n_stages && !rc; s++) {
        const PlanStage *st = &p->stages[s];
        if (st->n_layers < 1) rc = err_set(err, PD_EINVAL, "stage %d has no layers", s);
        for (int q = 0; q < st->n_layers && !rc; q++) {
            int l = st->layers[q];
            if (l < 0 || l >= n_layers)
                rc = err_set(err, PD_EINVAL, "stage %d names layer %d, but there are %d layers", s, l, n_layers);
            else if (stage_of[l] >= 0)
                rc = err_set(err, PD_EINVAL, "layer %d is in stage %d and in stage %d", l, stage_of[l], s);
            else if (q > 0 && l <= st->layers[q - 1])
                rc = err_set(err, PD_EINVAL, "stage %d: layers are not in ascending order", s);
            else
                stage_of[l] = s;
        }
        if (!rc && st->replicas < 1) rc = err_set(err, PD_EINVAL, "stage %d has %d replicas", s, st->replicas);
        workers += st->replicas;
    }
    for (int l = 0; l < n_layers && !rc; l++)
        if (stage_of[l] < 0) rc = err_set(err, PD_EINVAL, "layer %d is in no stage", l);
    if (!rc && p->n_edges == 0) {
        for (int l = 1; l < n_layers && !rc; l++)
            if (stage_of[l] != stage_of[l - 1] && stage_of[l] != stage_of[l - 1] + 1)
                rc = err_set(err, PD_EINVAL, "stages are not contiguous: layer %d is in stage %d, layer %d in stage %d",
                             l - 1, stage_of[l - 1], l, stage_of[l]);
    }
    for (int e = 0; e < p->n_edges && !rc; e++) {
        int a = p->edges[e][0], b = p->edges[e][1];
        if (a < 0 || a >= n_layers || b < 0 || b >= n_layers)
            rc = err_set(err, PD_EINVAL, "plan edge %d names an unknown layer", e);
        else if (stage_of[b] < stage_of[a])
            rc = err_set(err, PD_EINVAL, "stages are not contiguous: layer %d (stage %d) feeds layer %d (stage %d)", a,
                         stage_of[a], b, stage_of[b]);
    }
    if (!rc && p->v_shape && p->chunks != 2)
        rc = err_set(err, PD_EINVAL, "a V-placed plan has 2 chunks per worker, not %d", p->chunks);
    if (!rc && p->chunks > 1) {   /* interleaved: V x W stages round-robin on W pipeline positions, each with
                                   * d replicas: replica j of stage s on rank (s mod W) d + j (or in a V) */
        int d = p->stages[0].replicas, W = d > 0 ? p->n_workers / d : 0;
        if (W * d != p->n_workers || p->n_stages != p->chunks * W)
            rc = err_set(err, PD_EINVAL, "an interleaved plan of %d chunks on %d workers, %d replicas a stage, needs %d "
                         "x %d / %d stages, not %d", p->chunks, p->n_workers, d, p->chunks, p->n_workers, d, p->n_stages);
        for (int s = 0; s < p->n_stages && !rc; s++) {
            if (p->stages[s].replicas != d)
                rc = err_set(err, PD_EINVAL, "interleaved plan: stage %d has %d replicas, stage 0 has %d", s,
                             p->stages[s].replicas, d);
            for (int j = 0; j < d && !rc; j++)
                if (p->stages[s].ranks[j] != plan_chunk_rank(p->v_shape, s, W, d, j))
                    rc = err_set(err, PD_EINVAL, "%s plan: replica %d of stage %d must be on rank %d",
                                 p->v_shape ? "V-placed" : "interleaved", j, s, plan_chunk_rank(p->v_shape, s, W, d, j));
        }
        workers = p->n_workers;
    }
    if (!rc && workers != p->n_workers)
        rc = err_set(err, PD_EINVAL, "replicas sum to %d but the plan uses %d workers", workers, p->n_workers);
    if (!rc && cluster_total_workers(&p->cluster) < workers)
        rc = err_set(err, PD_EINVAL, "the plan uses %d workers but the cluster has %d", workers,
                     cluster_total_workers(&p->cluster));
    if (!rc && p->chunks <= 1) {
        char *seen = calloc((size_t)workers + 1, 1);
        PD_ASSERT(seen);
        for (int s = 0; s < p->n_stages && !rc; s++)
            for (int r = 0; r < p->stages[s].replicas && !rc; r++) {
                int k = p->stages[s].ranks[r];
                if (k < 0 || k >= workers)
                    rc = err_set(err, PD_EINVAL, "stage %d: rank %d is outside 0..%d", s, k, workers - 1);
                else if (seen[k])
                    rc = err_set(err, PD_EINVAL, "rank %d runs two stages", k);
                else
                    seen[k] = 1;
            }
        free(seen);
    }
    if (!rc) {
        int r0 = p->stages[0].replicas;
        if (p->noam != (workers + r0 - 1) / r0)
            rc = err_set(err, PD_EINVAL, "noam is %d, expected ceil(%d / %d) = %d", p->noam, workers, r0,
                         (workers + r0 - 1) / r0);
    }
    free(stage_of);
    return rc;
}

/* Layers the planner removes before costing (pgraph_build): Input sources, unused
 * __getitem__ sinks. */
static int planner_drops(const Profile *prof, int l) {
    const char *t = prof->layers[l].type;
    int in = 0, out = 0;
    if (prof->n_edges == 0) {
        in = l > 0;
        out = l + 1 < prof->n_layers;
    }
    for (int e = 0; e < prof->n_edges; e++) {
        in |= prof->edges[e][1] == l;
        out |= prof->edges[e][0] == l;
    }
    return (!in && !strncmp(t, "Input", 5)) || (!out && !strncmp(t, "__getitem__", 11));
}

double plan_stage_memory(const Plan *p, const Profile *prof, int s) {
    const PlanStage *st = &p->stages[s];
    double act = 0, par = 0;
    for (int q = 0; q < st->n_layers; q++) {
        const ProfileLayer *l = &prof->layers[st->layers[q]];
        if (planner_drops(prof, st->layers[q])) continue; /* zeroed, as in the authors' optimizer */
        act += l->act_bytes;
        par += l->param_bytes;
    }
    int through = 0;
    for (int t = 0; t <= s; t++) through += p->stages[t].replicas;
    int r = st->replicas;
    if (p->opts.cost_model == COST_PIPEDREAM) {
        int N = cluster_total_workers(&p->cluster);
        return ceil((double)(N - through) / (double)r) * (act + par);
    }
    return plan_ours_stash(p->n_workers - through + r, r, act, par);
}

int plan_check_memory(const Plan *p, const Profile *prof, Err *err) {
    if (!(p->opts.memory_limit > 0)) return PD_OK;
    /* Interleaved plans: the 1F1B rule does not apply; the schedule search (plan_choose) and
     * `pipedream simulate` check their memory. */
    if (p->chunks > 1) return PD_OK;
    /* The authors' check lives in their DP: with several levels it is per level, and with
     * --allow-idle a stage after an idle-padded prefix is checked as if the idle workers
     * were used; only the plain one-level case can be re-checked from the plan. */
    if (p->opts.cost_model == COST_PIPEDREAM && (p->cluster.n_levels > 1 || p->opts.allow_idle)) return PD_OK;
    for (int s = 0; s < p->n_stages; s++) {
        double m = plan_stage_memory(p, prof, s);
        if (m > p->opts.memory_limit)
            return err_set(err, PD_EINVAL, "stage %d needs %.4g bytes per worker, over the memory limit of %.4g", s, m,
                           p->opts.memory_limit);
    }
    return PD_OK;
}

static int opts_check(const PlanOpts *o, Err *err) {
    if (o->cost_model < 0 || o->cost_model >= COST_COUNT)
        return err_set(err, PD_EINVAL, "unknown cost model %d", (int)o->cost_model);
    if (!(o->memory_limit >= 0) || !isfinite(o->memory_limit))
        return err_set(err, PD_EINVAL, "memory limit must be >= 0 bytes, got %g", o->memory_limit);
    if (!(o->activation_compression >= 0) || !isfinite(o->activation_compression))
        return err_set(err, PD_EINVAL, "activation compression ratio must be > 0, got %g", o->activation_compression);
    if (o->chunks < 0 || o->chunks > 64) return err_set(err, PD_EINVAL, "chunks must be 1..64, got %d", o->chunks);
    if (o->pipelines < 0) return err_set(err, PD_EINVAL, "pipelines must be >= 1, got %d", o->pipelines);
    if (o->pipelines > 0 && o->chunks <= 1) return err_set(err, PD_EINVAL, "--pipelines goes with --chunks V");
    if (o->v_shape && o->chunks != 2) return err_set(err, PD_EINVAL, "the V placement has 2 chunks per worker, not %d", o->chunks);
    if (o->pipelines > 1 && o->straight)
        return err_set(err, PD_EINVAL, "--pipelines %d replicates every stage %d times; --straight allows one", o->pipelines,
                       o->pipelines);
    if (o->chunks > 1 && (o->cost_model != COST_OURS || o->allow_idle))
        return err_set(err, PD_EINVAL, "--chunks plans with our cost model and every worker (no --cost-model pipedream, "
                       "no --allow-idle)");
    return PD_OK;
}

Plan *plan_new(const Profile *prof, const Cluster *cl, const PlanOpts *o, Err *err) {
    if (cluster_check(cl, err) || opts_check(o, err)) return NULL;
    PGraph g;
    PStates s;
    PSolution sol;
    memset(&sol, 0, sizeof sol);
    memset(&s, 0, sizeof s);
    if (pgraph_build(prof, &g, err)) return NULL;
    Plan *p = NULL;
    int rc = pstates_build(&g, o->max_states > 0 ? o->max_states : 4000000, &s, err);
    if (!rc)
        rc = o->chunks > 1                     ? plan_dp_chunks(&s, cl, o, &sol, err)
             : o->cost_model == COST_PIPEDREAM ? plan_dp_compat(&s, cl, o, &sol, err)
                                               : plan_dp_ours(&s, cl, o, &sol, err);
    if (rc) goto done;
    if (sol.pipeline_s <= 0 || !isfinite(sol.pipeline_s)) {
        rc = err_set(err, PD_EINVAL, "every layer has zero compute time: nothing to balance (the authors' optimizer "
                     "divides by zero here)");
        goto done;
    }
    p = plan_from_solution(prof, &g, &s, &sol, cl, o, err);
    if (p && o->stage_memory) p->opts.stage_memory = NULL, p->opts.stage_memory_ctx = NULL;   /* checked by its rule */
    else if (p && (rc = plan_check_memory(p, prof, err))) {
        plan_free(p);
        p = NULL;
    }
done:
    psolution_release(&sol);
    pstates_release(&s);
    pgraph_release(&g);
    return p;
}

Plan *plan_from_solution(const Profile *prof, const PGraph *gp, const PStates *sp, const PSolution *solp,
                         const Cluster *cl, const PlanOpts *o, Err *err) {
    const PGraph g = *gp;
    const PStates s = *sp;
    const PSolution sol = *solp;
    Plan *p = NULL;
    int rc = PD_OK;
    const int L = prof->n_layers;
    int *stage_of = malloc(sizeof(int) * (size_t)L);
    PD_ASSERT(stage_of);
    for (int l = 0; l < L; l++) {
        int v = g.node_of_layer[l];
        stage_of[l] = -1;
        if (v < 0) continue;
        /* The first stage whose cut contains the node (the authors' assignment; the same
         * as "in D_to but not D_from" when the cuts are nested, as they are but for the
         * compat model's hierarchical quirk). */
        for (int q = 0; q < sol.n_stages; q++) {
            const PStageRange *st = &sol.st[q];
            if (s.down[(size_t)st->to * s.words + v / 64] >> (v % 64) & 1) {
                stage_of[l] = q;
                break;
            }
        }
        PD_ASSERT(stage_of[l] >= 0);
    }
    for (int q = 0; q < sol.n_stages && !rc; q++) {
        int any = 0;
        for (int l = 0; l < L && !any; l++) any = stage_of[l] == q;
        if (!any)
            rc = err_set(err, PD_EINVAL, "the authors' optimum here (%.6g s per minibatch) splits a range between two "
                         "unrelated cut states (a quirk of their lower levels, docs/explanation/planner.md), which leaves stage %d "
                         "empty: no runnable plan; use --cost-model ours", sol.pipeline_s, q);
    }
    if (rc) {
        free(stage_of);
        goto done;
    }
    /* Removed layers: Input sources go to stage 0 (as the authors do); an unused
     * __getitem__ output goes with the latest stage that feeds it. */
    for (int l = 0; l < L; l++) {
        if (g.node_of_layer[l] >= 0) continue;
        int st = 0;
        if (prof->n_edges == 0) {
            st = l > 0 ? stage_of[l - 1] : 0;
        } else {
            for (int e = 0; e < prof->n_edges; e++)
                if (prof->edges[e][1] == l && stage_of[prof->edges[e][0]] > st) st = stage_of[prof->edges[e][0]];
        }
        stage_of[l] = st < 0 ? 0 : st;
    }
    p = calloc(1, sizeof *p);
    PD_ASSERT(p);
    snprintf(p->model, sizeof p->model, "%s", prof->model);
    p->n_layers = L;
    p->n_stages = sol.n_stages;
    p->stages = calloc((size_t)sol.n_stages, sizeof *p->stages);
    PD_ASSERT(p->stages);
    int rank = 0;
    for (int q = 0; q < sol.n_stages; q++) {
        PlanStage *st = &p->stages[q];
        st->layers = malloc(sizeof(int) * (size_t)L);
        PD_ASSERT(st->layers);
        for (int l = 0; l < L; l++)
            if (stage_of[l] == q) {
                st->layers[st->n_layers++] = l;
                if (g.node_of_layer[l] >= 0) st->compute_s += prof->layers[l].fwd_s + prof->layers[l].bwd_s;
            }
        st->replicas = sol.st[q].replicas;
        st->ranks = malloc(sizeof(int) * (size_t)st->replicas);
        PD_ASSERT(st->ranks);
        for (int r = 0; r < st->replicas; r++) st->ranks[r] = rank++;
        st->time_s = sol.st[q].time_s;
    }
    free(stage_of);
    p->n_workers = rank;
    p->noam = (rank + p->stages[0].replicas - 1) / p->stages[0].replicas;
    if (o->chunks > 1) {   /* the round-robin placement on the positions (workers, chunks, noam) */
        Err e = {0};
        int rc = o->v_shape ? plan_place_v(p, &e) : plan_interleave(p, o->chunks, &e);
        PD_ASSERTF(rc == PD_OK, "interleaving the solution: %s", e.msg);
    }
    p->pipeline_s = sol.pipeline_s;
    p->single_s = sol.single_s;
    p->dp_s = sol.dp_s;
    p->opts = *o;
    p->opts.no_pruning = 0;
    p->opts.max_states = 0;
    p->cluster = *cl;
    p->profile_checksum = prof->checksum;
    if (!profile_is_chain(prof)) {
        p->n_edges = prof->n_edges;
        p->edges = malloc(sizeof(int[2]) * (size_t)prof->n_edges);
        PD_ASSERT(p->edges);
        memcpy(p->edges, prof->edges, sizeof(int[2]) * (size_t)prof->n_edges);
    }
    rc = plan_validate(p, L, err);
    if (rc) err_prefix(err, "internal error: the planner made an invalid plan");
    PD_ASSERTF(rc == PD_OK, "%s", err ? err->msg : "invalid plan");
done:
    if (rc) {
        plan_free(p);
        return NULL;
    }
    return p;
}

/* ---- JSON ------------------------------------------------------------------------ */

int plan_save(const Plan *p, const char *path, Err *err) {
    int rc = plan_validate(p, p->n_layers, err);
    if (rc) return err_prefix(err, "%s: refusing to write an invalid plan", path);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "pipedream-plan");
    cJSON_AddItemToObject(root, "version", pd_json_num(1));
    cJSON_AddStringToObject(root, "model", p->model);
    char crc[16];
    snprintf(crc, sizeof crc, "%08x", p->profile_checksum);
    cJSON_AddStringToObject(root, "profile_crc32", crc);
    cJSON_AddItemToObject(root, "n_layers", pd_json_num(p->n_layers));
    cJSON *cm = cJSON_AddObjectToObject(root, "cost_model");
    cJSON_AddStringToObject(cm, "kind", plan_cost_model_name(p->opts.cost_model));
    cJSON_AddBoolToObject(cm, "straight", p->opts.straight);
    cJSON_AddBoolToObject(cm, "allow_idle", p->opts.allow_idle);
    cJSON_AddItemToObject(cm, "memory_limit", pd_json_num(p->opts.memory_limit));
    cJSON_AddItemToObject(cm, "activation_compression", pd_json_num(p->opts.activation_compression));
    cJSON_AddBoolToObject(cm, "overlap_allreduce", p->opts.overlap_allreduce);
    cluster_to_json(&p->cluster, cJSON_AddObjectToObject(root, "cluster"));
    cJSON_AddItemToObject(root, "n_workers", pd_json_num(p->n_workers));
    if (p->chunks > 1) cJSON_AddItemToObject(root, "chunks", pd_json_num(p->chunks));
    if (p->v_shape) cJSON_AddStringToObject(root, "placement", "v");
    if (p->schedule[0]) {
        cJSON *sj = cJSON_AddObjectToObject(root, "schedule");
        cJSON_AddStringToObject(sj, "kind", p->schedule);
        cJSON_AddItemToObject(sj, "microbatches", pd_json_num(p->schedule_micro));
        cJSON_AddBoolToObject(sj, "recompute", p->schedule_recompute);
        if (p->schedule_inflight) cJSON_AddItemToObject(sj, "inflight", pd_json_num(p->schedule_inflight));
    }
    cJSON_AddItemToObject(root, "noam", pd_json_num(p->noam));
    cJSON *pr = cJSON_AddObjectToObject(root, "predicted");
    cJSON_AddItemToObject(pr, "pipeline_s", pd_json_num(p->pipeline_s));
    cJSON_AddItemToObject(pr, "single_worker_s", pd_json_num(p->single_s));
    cJSON_AddItemToObject(pr, "data_parallel_s", pd_json_num(p->dp_s));
    /* a hand-written plan may say 0 s per minibatch: no speedup to state */
    cJSON_AddItemToObject(pr, "speedup_over_single", pd_json_num(p->pipeline_s > 0 ? p->single_s / p->pipeline_s : 0));
    cJSON_AddItemToObject(pr, "speedup_over_data_parallel", pd_json_num(p->pipeline_s > 0 ? p->dp_s / p->pipeline_s : 0));
    if (p->sim_s > 0) {
        cJSON *sj = cJSON_AddObjectToObject(pr, "simulated");
        cJSON_AddStringToObject(sj, "schedule", p->sim_schedule);
        cJSON_AddItemToObject(sj, "microbatches", pd_json_num(p->sim_micro));
        cJSON_AddItemToObject(sj, "time_per_minibatch_s", pd_json_num(p->sim_s));
        cJSON_AddItemToObject(sj, "samples_per_s", pd_json_num(p->sim_samples_per_s));
    }
    cJSON *stages = cJSON_AddArrayToObject(root, "stages");
    for (int s = 0; s < p->n_stages; s++) {
        const PlanStage *st = &p->stages[s];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "layers", cJSON_CreateIntArray(st->layers, st->n_layers));
        cJSON_AddItemToObject(o, "replicas", pd_json_num(st->replicas));
        cJSON_AddItemToObject(o, "ranks", cJSON_CreateIntArray(st->ranks, st->replicas));
        cJSON_AddItemToObject(o, "compute_s", pd_json_num(st->compute_s));
        cJSON_AddItemToObject(o, "time_s", pd_json_num(st->time_s));
        cJSON_AddItemToArray(stages, o);
    }
    if (p->wire) {
        cJSON *wa = cJSON_AddArrayToObject(root, "wire");
        for (int b = 0; b + 1 < p->n_stages; b++) {
            cJSON *x = cJSON_CreateObject();
            PD_ASSERT(x);
            cJSON_AddStringToObject(x, "act", plan_wire_name(p->wire[2 * b]));
            cJSON_AddStringToObject(x, "grad", plan_wire_name(p->wire[2 * b + 1]));
            cJSON_AddItemToArray(wa, x);
        }
    }
    if (p->n_edges > 0) {
        cJSON *edges = cJSON_AddArrayToObject(root, "edges");
        for (int e = 0; e < p->n_edges; e++) cJSON_AddItemToArray(edges, cJSON_CreateIntArray(p->edges[e], 2));
    }
    rc = pd_json_save(root, path, err);
    cJSON_Delete(root);
    return rc;
}

/* Reads an array of ints into a fresh buffer of *n entries. */
static int int_array(const cJSON *a, const char *ctx, const char *key, int **out, int *n, Err *err) {
    if (!a || !cJSON_IsArray(a)) return err_set(err, PD_EINVAL, "%s: key \"%s\": expected an array of integers", ctx, key);
    *n = cJSON_GetArraySize(a);
    *out = malloc(sizeof(int) * (size_t)(*n > 0 ? *n : 1));
    PD_ASSERT(*out);
    int i = 0;
    for (const cJSON *c = a->child; c; c = c->next, i++) {
        if (pd_json_int(c, &(*out)[i]))
            return err_set(err, PD_EINVAL, "%s: key \"%s\": element %d is not an integer", ctx, key, i);
    }
    return PD_OK;
}

Plan *plan_load(const char *path, Err *err) {
    char *text;
    size_t len;
    if (pd_read_file(path, PLAN_MAX_BYTES, &text, &len, err)) return NULL;
    Plan *p = plan_parse(text, path, err);
    pd_free(text);
    return p;
}

Plan *plan_parse(const char *text, const char *path, Err *err) {
    cJSON *root = pd_json_parse(text, path, err);
    if (!root) return NULL;
    Plan *p = calloc(1, sizeof *p);
    PD_ASSERT(p);
    int rc;
    JObj j, cj, pj;
    const char *s;
    double dummy;
    if ((rc = jobj_init(&j, root, err, "%s", path))) goto done;
    if ((rc = jobj_str(&j, "format", 1, &s, err))) goto done;
    if (strcmp(s, "pipedream-plan")) {
        rc = err_set(err, PD_EINVAL, "%s: key \"format\": expected \"pipedream-plan\", got \"%s\"", path, s);
        goto done;
    }
    int version;
    if ((rc = jobj_int(&j, "version", 1, 1, 1, &version, err))) goto done;
    if ((rc = jobj_str(&j, "model", 1, &s, err))) goto done;
    snprintf(p->model, sizeof p->model, "%s", s);
    if ((rc = jobj_str(&j, "profile_crc32", 1, &s, err))) goto done;
    {
        char *end;
        unsigned long v = strtoul(s, &end, 16);
        if (end == s || *end || v > 0xffffffffUL) {
            rc = err_set(err, PD_EINVAL, "%s: key \"profile_crc32\": expected 8 hex digits", path);
            goto done;
        }
        p->profile_checksum = (uint32_t)v;
    }
    if ((rc = jobj_int(&j, "n_layers", 1, 1, 1 << 22, &p->n_layers, err))) goto done;
    if ((rc = jobj_init(&cj, jobj_get(&j, "cost_model"), err, "%s: cost_model", path))) goto done;
    if ((rc = jobj_str(&cj, "kind", 1, &s, err))) goto done;
    p->opts.cost_model = plan_cost_model_parse(s);
    if (p->opts.cost_model == COST_COUNT) {
        rc = err_set(err, PD_EINVAL, "%s: cost_model: unknown kind \"%s\" (ours, pipedream)", path, s);
        goto done;
    }
    if ((rc = jobj_bool(&cj, "straight", 1, &p->opts.straight, err)) ||
        (rc = jobj_bool(&cj, "allow_idle", 1, &p->opts.allow_idle, err)) ||
        (rc = jobj_num(&cj, "memory_limit", 1, 0, 1e300, &p->opts.memory_limit, err)) ||
        (rc = jobj_num(&cj, "activation_compression", 1, 0, 1e300, &p->opts.activation_compression, err)) ||
        (rc = jobj_bool(&cj, "overlap_allreduce", 0, &p->opts.overlap_allreduce, err)) || (rc = jobj_done(&cj, err)))
        goto done;
    {
        char ctx[300];
        snprintf(ctx, sizeof ctx, "%s: cluster", path);
        if ((rc = cluster_from_json(jobj_get(&j, "cluster"), ctx, &p->cluster, err))) goto done;
    }
    if ((rc = jobj_int(&j, "n_workers", 1, 1, 1 << 20, &p->n_workers, err))) goto done;
    if ((rc = jobj_int(&j, "chunks", 0, 2, 64, &p->chunks, err))) goto done;
    if (jobj_has(&j, "placement")) {
        if ((rc = jobj_str(&j, "placement", 1, &s, err))) goto done;
        if (strcmp(s, "v")) {
            rc = err_set(err, PD_EINVAL, "%s: key \"placement\": \"%s\" is not \"v\"", path, s);
            goto done;
        }
        p->v_shape = p->opts.v_shape = 1;
    }
    if (jobj_has(&j, "schedule")) {
        JObj sj;
        if ((rc = jobj_init(&sj, jobj_get(&j, "schedule"), err, "%s: schedule", path)) ||
            (rc = jobj_str(&sj, "kind", 1, &s, err)))
            goto done;
        if (!s[0] || strlen(s) >= sizeof p->schedule) {
            rc = err_set(err, PD_EINVAL, "%s: schedule: key \"kind\": expected a schedule name", path);
            goto done;
        }
        snprintf(p->schedule, sizeof p->schedule, "%s", s);
        if ((rc = jobj_int(&sj, "microbatches", 1, 1, 1 << 16, &p->schedule_micro, err)) ||
            (rc = jobj_bool(&sj, "recompute", 1, &p->schedule_recompute, err)) ||
            (rc = jobj_int(&sj, "inflight", 0, 0, 1 << 20, &p->schedule_inflight, err)) || (rc = jobj_done(&sj, err)))
            goto done;
    }
    if ((rc = jobj_int(&j, "noam", 1, 1, 1 << 20, &p->noam, err))) goto done;
    if ((rc = jobj_init(&pj, jobj_get(&j, "predicted"), err, "%s: predicted", path))) goto done;
    if ((rc = jobj_num(&pj, "pipeline_s", 1, 0, 1e300, &p->pipeline_s, err)) ||
        (rc = jobj_num(&pj, "single_worker_s", 1, 0, 1e300, &p->single_s, err)) ||
        (rc = jobj_num(&pj, "data_parallel_s", 1, 0, 1e300, &p->dp_s, err)) ||
        (rc = jobj_num(&pj, "speedup_over_single", 0, 0, 1e300, &dummy, err)) ||
        (rc = jobj_num(&pj, "speedup_over_data_parallel", 0, 0, 1e300, &dummy, err)))
        goto done;
    if (jobj_has(&pj, "simulated")) {
        JObj sj;
        const char *s = "";
        if ((rc = jobj_init(&sj, jobj_get(&pj, "simulated"), err, "%s: predicted: simulated", path)) ||
            (rc = jobj_str(&sj, "schedule", 1, &s, err)))
            goto done;
        if (!s[0] || strlen(s) >= sizeof p->sim_schedule) {
            rc = err_set(err, PD_EINVAL, "%s: predicted: simulated: key \"schedule\": expected a schedule name", path);
            goto done;
        }
        snprintf(p->sim_schedule, sizeof p->sim_schedule, "%s", s);
        if ((rc = jobj_int(&sj, "microbatches", 1, 1, 1 << 16, &p->sim_micro, err)) ||
            (rc = jobj_num(&sj, "time_per_minibatch_s", 1, 1e-300, 1e300, &p->sim_s, err)) ||
            (rc = jobj_num(&sj, "samples_per_s", 1, 0, 1e300, &p->sim_samples_per_s, err)) || (rc = jobj_done(&sj, err)))
            goto done;
    }
    if ((rc = jobj_done(&pj, err))) goto done;
    const cJSON *stages = jobj_get(&j, "stages");
    if (!stages || !cJSON_IsArray(stages) || cJSON_GetArraySize(stages) < 1) {
        rc = err_set(err, PD_EINVAL, "%s: key \"stages\": expected a non-empty array", path);
        goto done;
    }
    p->n_stages = cJSON_GetArraySize(stages);
    p->stages = calloc((size_t)p->n_stages, sizeof *p->stages);
    PD_ASSERT(p->stages);
    int si = 0;
    for (const cJSON *c = stages->child; c; c = c->next, si++) {
        PlanStage *st = &p->stages[si];
        JObj sj;
        char ctx[300];
        snprintf(ctx, sizeof ctx, "%s: stage %d", path, si);
        int nr = 0;
        if ((rc = jobj_init(&sj, c, err, "%s", ctx))) goto done;
        if ((rc = int_array(jobj_get(&sj, "layers"), ctx, "layers", &st->layers, &st->n_layers, err))) goto done;
        if ((rc = jobj_int(&sj, "replicas", 1, 1, 1 << 20, &st->replicas, err))) goto done;
        if ((rc = int_array(jobj_get(&sj, "ranks"), ctx, "ranks", &st->ranks, &nr, err))) goto done;
        if (nr != st->replicas) {
            rc = err_set(err, PD_EINVAL, "%s: %d ranks for %d replicas", ctx, nr, st->replicas);
            goto done;
        }
        if ((rc = jobj_num(&sj, "compute_s", 1, 0, 1e300, &st->compute_s, err)) ||
            (rc = jobj_num(&sj, "time_s", 1, 0, 1e300, &st->time_s, err)) || (rc = jobj_done(&sj, err)))
            goto done;
    }
    const cJSON *edges = jobj_get(&j, "edges");
    if (edges && (rc = profile_read_edges(edges, path, &p->edges, &p->n_edges, err))) goto done;
    const cJSON *wa = jobj_get(&j, "wire");
    if (wa) {
        if (!cJSON_IsArray(wa) || cJSON_GetArraySize(wa) != p->n_stages - 1) {
            rc = err_set(err, PD_EINVAL, "%s: key \"wire\": expected an array of %d boundaries", path, p->n_stages - 1);
            goto done;
        }
        p->wire = calloc(2 * (size_t)p->n_stages, sizeof(int));
        PD_ASSERT(p->wire);
        for (int b = 0; b + 1 < p->n_stages; b++) {
            const cJSON *x = cJSON_GetArrayItem(wa, b);
            for (int g = 0; g < 2; g++) {
                const cJSON *v = x ? cJSON_GetObjectItemCaseSensitive(x, g ? "grad" : "act") : NULL;
                int c = cJSON_IsString(v) ? plan_wire_parse(v->valuestring) : -1;
                if (c < 0 || (g && c == 4)) {
                    rc = err_set(err, PD_EINVAL, "%s: wire: boundary %d: key \"%s\": expected fp32, bf16, int8, int4%s",
                                 path, b, g ? "grad" : "act", g ? "" : " or delta");
                    goto done;
                }
                p->wire[2 * b + g] = c;
            }
        }
    }
    if ((rc = jobj_done(&j, err))) goto done;
    if ((rc = plan_validate(p, p->n_layers, err))) err_prefix(err, "%s", path);
done:
    cJSON_Delete(root);
    if (rc) {
        plan_free(p);
        return NULL;
    }
    return p;
}

/* ---- the printed table ----------------------------------------------------------- */

/* "0-25,27,30-31" into buf. */
static void ranges(const int *v, int n, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n && len + 24 < cap;) {
        int j = i;
        while (j + 1 < n && v[j + 1] == v[j] + 1) j++;
        len += (size_t)snprintf(buf + len, cap - len, j > i ? "%s%d-%d" : "%s%d", i ? "," : "", v[i], v[j]);
        i = j + 1;
        if (i < n && len + 24 >= cap) snprintf(buf + len, cap - len, ",...");
    }
}

void plan_print(const Plan *p, FILE *f) {
    char cl[256] = "";
    size_t len = 0;
    for (int l = 0; l < p->cluster.n_levels; l++)
        len += (size_t)snprintf(cl + len, sizeof cl - len, "%s%d x %.3g B/s", l ? ", " : "",
                                p->cluster.level[l].workers, p->cluster.level[l].bandwidth);
    fprintf(f, "plan for %s: %d stage%s on %d of %d workers (levels innermost first: %s)\n", p->model, p->n_stages,
            p->n_stages == 1 ? "" : "s", p->n_workers, cluster_total_workers(&p->cluster), cl);
    if (p->chunks > 1 && p->v_shape) {
        int d = p->stages[0].replicas, P = p->n_workers / d;
        fprintf(f, "V placement: %d pipeline%s of %d workers, worker i runs stages i and %d - i (--schedule zb-v, v-half, "
                "v-min or dualpipe-v)\n", d, d > 1 ? "s" : "", P, 2 * P - 1);
    } else if (p->chunks > 1) {
        int d = p->stages[0].replicas, P = p->n_workers / d;
        if (d > 1)
            fprintf(f, "interleaved: %d pipelines of %d workers, %d chunks per worker; replica j of stage i on rank "
                    "(i mod %d) x %d + j (--schedule interleaved)\n", d, P, p->chunks, P, d);
        else
            fprintf(f, "interleaved: %d chunks per worker, worker w runs stages w, w + %d, ... (--schedule interleaved)\n",
                    p->chunks, P);
    }
    fprintf(f, "cost model: %s%s%s", plan_cost_model_name(p->opts.cost_model), p->opts.straight ? ", straight" : "",
            p->opts.allow_idle ? ", idle workers allowed" : "");
    if (p->opts.memory_limit > 0) fprintf(f, ", memory limit %.4g B", p->opts.memory_limit);
    if (p->opts.activation_compression > 0) fprintf(f, ", activation compression %g", p->opts.activation_compression);
    if (p->opts.overlap_allreduce) fprintf(f, ", all-reduce overlapped");
    fprintf(f, "\n\n%-6s %-24s %8s %-12s %12s %12s\n", "stage", "layers", "replicas", "ranks", "compute ms", "time ms");
    int bott = 0;
    for (int s = 0; s < p->n_stages; s++) {
        const PlanStage *st = &p->stages[s];
        char lb[64], rb[48];
        ranges(st->layers, st->n_layers, lb, sizeof lb);
        ranges(st->ranks, st->replicas, rb, sizeof rb);
        fprintf(f, "%-6d %-24s %8d %-12s %12.3f %12.3f\n", s, lb, st->replicas, rb, st->compute_s * 1e3,
                st->time_s * 1e3);
        if (st->time_s > p->stages[bott].time_s) bott = s;
    }
    fprintf(f, "\nbottleneck: stage %d; predicted time per minibatch: %.6f ms\n", bott, p->pipeline_s * 1e3);
    if (p->sim_s > 0) {
        char mi[48] = "";
        if (p->sim_micro > 1) snprintf(mi, sizeof mi, ", %d micro-batches per step", p->sim_micro);
        fprintf(f, "simulated (%s%s): %.6f ms per minibatch", p->sim_schedule, mi, p->sim_s * 1e3);
        if (p->sim_samples_per_s > 0) fprintf(f, ", %.1f samples/s", p->sim_samples_per_s);
        fputc('\n', f);
    }
    fprintf(f, "single worker: %.6f ms; data parallel on %d workers: %.6f ms\n", p->single_s * 1e3,
            cluster_total_workers(&p->cluster), p->dp_s * 1e3);
    fprintf(f, "speedup over one worker: %.4fx; over data parallelism: %.4fx\n", p->single_s / p->pipeline_s,
            p->dp_s / p->pipeline_s);
    fprintf(f, "NOAM (minibatches admitted at start-up): %d\n", p->noam);
}
