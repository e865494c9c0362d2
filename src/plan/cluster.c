/* cluster.c: the cluster description (levels innermost first, memory per worker), read
 * from JSON (docs/reference/formats.md), and rank arithmetic over it. Knows nothing of plans. */
#include "plan.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

int cluster_total_workers(const Cluster *cl) {
    long t = 1;
    for (int l = 0; l < cl->n_levels; l++) t *= cl->level[l].workers;
    return (int)t;
}

int cluster_link_level(const Cluster *cl, int a, int b) {
    if (a == b) return -1;
    long span = 1;
    for (int l = 0; l < cl->n_levels; l++) {
        span *= cl->level[l].workers;
        if (a / span == b / span) return l;
    }
    return cl->n_levels - 1; /* outside the cluster: the outermost link */
}

int cluster_check(const Cluster *cl, Err *err) {
    if (cl->n_levels < 1 || cl->n_levels > PD_MAX_LEVELS)
        return err_set(err, PD_EINVAL, "a cluster needs 1 to %d levels, got %d", PD_MAX_LEVELS, cl->n_levels);
    long total = 1;
    for (int l = 0; l < cl->n_levels; l++) {
        const ClusterLevel *v = &cl->level[l];
        if (v->workers < 1) return err_set(err, PD_EINVAL, "level %d: workers must be at least 1, got %d", l, v->workers);
        if (!(v->bandwidth > 0) || !isfinite(v->bandwidth))
            return err_set(err, PD_EINVAL, "level %d: bandwidth must be a positive number of bytes/s, got %g", l,
                           v->bandwidth);
        if (!(v->latency >= 0) || !isfinite(v->latency))
            return err_set(err, PD_EINVAL, "level %d: latency must be >= 0 seconds, got %g", l, v->latency);
        total *= v->workers;
        if (total > 1 << 20) return err_set(err, PD_EINVAL, "more than %d workers in the cluster", 1 << 20);
    }
    if (!(cl->memory_per_worker >= 0) || !isfinite(cl->memory_per_worker))
        return err_set(err, PD_EINVAL, "memory_per_worker must be >= 0 bytes (0 = unlimited), got %g",
                       cl->memory_per_worker);
    if (!(cl->wake_s >= 0 && cl->wake_s <= 10))
        return err_set(err, PD_EINVAL, "wake_s must be in [0, 10] seconds, got %g", cl->wake_s);
    if (!(cl->core_efficiency >= 0 && cl->core_efficiency <= 1))
        return err_set(err, PD_EINVAL, "core_efficiency must be in (0, 1] (0: 1, as alone), got %g",
                       cl->core_efficiency);
    if (cl->n_hosts < 0 || cl->n_hosts > PD_MAX_HOSTS || cl->n_hosts > total)
        return err_set(err, PD_EINVAL, "hosts: %d given, at most %d and at most the cluster's %ld workers", cl->n_hosts,
                       PD_MAX_HOSTS, total);
    for (int h = 0; h < cl->n_hosts; h++) {
        const ClusterHost *x = &cl->host[h];
        if (!(x->speed >= 0) || !isfinite(x->speed))
            return err_set(err, PD_EINVAL, "host %d: speed must be > 0 (0: as profiled), got %g", h, x->speed);
        if (!(x->bandwidth >= 0) || !isfinite(x->bandwidth))
            return err_set(err, PD_EINVAL, "host %d: bandwidth must be > 0 bytes/s (0: the level's), got %g", h,
                           x->bandwidth);
        if (x->has_latency && (!(x->latency >= 0) || !isfinite(x->latency)))
            return err_set(err, PD_EINVAL, "host %d: latency must be >= 0 seconds, got %g", h, x->latency);
    }
    return PD_OK;
}

double cluster_own_bandwidth(const Cluster *cl, int r) {
    return r >= 0 && r < cl->n_hosts && cl->host[r].bandwidth > 0 ? cl->host[r].bandwidth : INFINITY;
}

double cluster_link_latency(const Cluster *cl, int a, int b) {
    if (b >= 0 && b < cl->n_hosts && cl->host[b].has_latency) return cl->host[b].latency;
    int lv = cluster_link_level(cl, a, b);
    return cl->level[lv < 0 ? 0 : lv].latency;
}

void cluster_scale_bandwidth(Cluster *cl, double f) {
    PD_ASSERT(f > 0);
    for (int i = 0; i < cl->n_levels; i++) cl->level[i].bandwidth *= f;
    for (int r = 0; r < cl->n_hosts; r++) cl->host[r].bandwidth *= f;   /* 0 (none) stays 0 */
}

double cluster_link_bandwidth(const Cluster *cl, int a, int b) {
    int lv = cluster_link_level(cl, a, b);
    double bw = cl->level[lv < 0 ? 0 : lv].bandwidth, x = cluster_own_bandwidth(cl, a), y = cluster_own_bandwidth(cl, b);
    if (x < bw) bw = x;
    if (y < bw) bw = y;
    return bw;
}

double cluster_core_efficiency(const Cluster *cl, double n) {
    double e = cl && cl->core_efficiency > 0 ? cl->core_efficiency : 1.0;
    if (e >= 1 || n <= 1 || !cl || cl->cores_per_machine <= 0) return 1.0;
    double c = cl->cores_per_machine, f = c > 1 ? (n - 1) / (c - 1) : 1.0;
    return 1 - (1 - e) * (f < 1 ? f : 1);
}

double cluster_worker_speed(const Cluster *cl, int r) {
    return cl && r >= 0 && r < cl->n_hosts && cl->host[r].speed > 0 ? cl->host[r].speed : 1.0;
}

int cluster_heterogeneous(const Cluster *cl) {
    for (int h = 0; h < cl->n_hosts; h++)
        if ((cl->host[h].speed > 0 && cl->host[h].speed != 1.0) || cl->host[h].bandwidth > 0 || cl->host[h].has_latency)
            return 1;
    return 0;
}

void cluster_to_json(const Cluster *cl, cJSON *clj) {
    cJSON *lv = cJSON_AddArrayToObject(clj, "levels");
    for (int l = 0; l < cl->n_levels; l++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "workers", pd_json_num(cl->level[l].workers));
        cJSON_AddItemToObject(o, "bandwidth", pd_json_num(cl->level[l].bandwidth));
        cJSON_AddItemToObject(o, "latency", pd_json_num(cl->level[l].latency));
        cJSON_AddItemToArray(lv, o);
    }
    cJSON_AddItemToObject(clj, "memory_per_worker", pd_json_num(cl->memory_per_worker));
    if (cl->cores_per_machine > 0) cJSON_AddItemToObject(clj, "cores_per_machine", pd_json_num(cl->cores_per_machine));
    if (cl->net_cpu_per_byte > 0) cJSON_AddItemToObject(clj, "net_cpu_per_byte", pd_json_num(cl->net_cpu_per_byte));
    if (cl->core_efficiency > 0 && cl->core_efficiency < 1)
        cJSON_AddItemToObject(clj, "core_efficiency", pd_json_num(cl->core_efficiency));
    if (cl->wake_s > 0) cJSON_AddItemToObject(clj, "wake_s", pd_json_num(cl->wake_s));
    if (cl->n_hosts > 0) {
        cJSON *hs = cJSON_AddArrayToObject(clj, "hosts");
        for (int h = 0; h < cl->n_hosts; h++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddItemToObject(o, "speed", pd_json_num(cl->host[h].speed > 0 ? cl->host[h].speed : 1.0));
            if (cl->host[h].bandwidth > 0) cJSON_AddItemToObject(o, "bandwidth", pd_json_num(cl->host[h].bandwidth));
            if (cl->host[h].has_latency) cJSON_AddItemToObject(o, "latency", pd_json_num(cl->host[h].latency));
            cJSON_AddItemToArray(hs, o);
        }
    }
}

int cluster_from_json(const cJSON *root, const char *path, Cluster *out, Err *err) {
    memset(out, 0, sizeof *out);
    JObj j;
    int rc;
    const char *fmt;
    if ((rc = jobj_init(&j, root, err, "%s", path))) return rc;
    if (jobj_has(&j, "format")) {
        if ((rc = jobj_str(&j, "format", 1, &fmt, err))) return rc;
        if (strcmp(fmt, "pipedream-cluster") != 0)
            return err_set(err, PD_EINVAL, "%s: key \"format\": expected \"pipedream-cluster\", got \"%s\"", path, fmt);
    }
    int version = 1;
    if ((rc = jobj_int(&j, "version", 0, 1, 1, &version, err))) return rc;
    const cJSON *levels = jobj_get(&j, "levels");
    if (!levels || !cJSON_IsArray(levels) || cJSON_GetArraySize(levels) < 1)
        return err_set(err, PD_EINVAL, "%s: key \"levels\": expected a non-empty array of levels, innermost first",
                       path);
    if (cJSON_GetArraySize(levels) > PD_MAX_LEVELS)
        return err_set(err, PD_EINVAL, "%s: key \"levels\": at most %d levels", path, PD_MAX_LEVELS);
    int l = 0;
    for (const cJSON *c = levels->child; c; c = c->next, l++) {
        JObj lj;
        ClusterLevel *v = &out->level[l];
        if ((rc = jobj_init(&lj, c, err, "%s: level %d", path, l))) return rc;
        if ((rc = jobj_int(&lj, "workers", 1, 1, 1 << 20, &v->workers, err))) return rc;
        if ((rc = jobj_num(&lj, "bandwidth", 1, 1e-300, 1e300, &v->bandwidth, err))) return rc;
        if ((rc = jobj_num(&lj, "latency", 0, 0, 1e30, &v->latency, err))) return rc;
        if ((rc = jobj_done(&lj, err))) return rc;
    }
    out->n_levels = l;
    if ((rc = jobj_num(&j, "memory_per_worker", 0, 0, 1e300, &out->memory_per_worker, err))) return rc;
    if ((rc = jobj_int(&j, "cores_per_machine", 0, 0, 1 << 20, &out->cores_per_machine, err))) return rc;
    if ((rc = jobj_num(&j, "net_cpu_per_byte", 0, 0, 1, &out->net_cpu_per_byte, err))) return rc;
    if ((rc = jobj_num(&j, "core_efficiency", 0, 0, 1, &out->core_efficiency, err))) return rc;
    if ((rc = jobj_num(&j, "wake_s", 0, 0, 10, &out->wake_s, err))) return rc;
    const cJSON *hosts = jobj_get(&j, "hosts");
    if (hosts) {
        if (!cJSON_IsArray(hosts))
            return err_set(err, PD_EINVAL, "%s: key \"hosts\": expected an array of {\"speed\", \"bandwidth\", \"latency\"}, "
                           "worker 0 first", path);
        if (cJSON_GetArraySize(hosts) > PD_MAX_HOSTS)
            return err_set(err, PD_EINVAL, "%s: key \"hosts\": at most %d hosts", path, PD_MAX_HOSTS);
        int h = 0;
        for (const cJSON *c = hosts->child; c; c = c->next, h++) {
            JObj hj;
            ClusterHost *x = &out->host[h];
            if ((rc = jobj_init(&hj, c, err, "%s: host %d", path, h))) return rc;
            x->speed = 1.0;
            if ((rc = jobj_num(&hj, "speed", 0, 1e-300, 1e300, &x->speed, err))) return rc;
            if ((rc = jobj_num(&hj, "bandwidth", 0, 1e-300, 1e300, &x->bandwidth, err))) return rc;
            x->has_latency = jobj_has(&hj, "latency");
            if ((rc = jobj_num(&hj, "latency", 0, 0, 1e30, &x->latency, err))) return rc;
            if ((rc = jobj_done(&hj, err))) return rc;
        }
        out->n_hosts = h;
    }
    if ((rc = jobj_done(&j, err))) return rc;
    if ((rc = cluster_check(out, err))) return err_prefix(err, "%s", path);
    return PD_OK;
}

int cluster_load(const char *path, Cluster *out, Err *err) {
    memset(out, 0, sizeof *out);
    char *text;
    size_t len;
    int rc = pd_read_file(path, 1 << 20, &text, &len, err);
    if (rc) return rc;
    cJSON *root = cJSON_Parse(text);
    pd_free(text);
    if (!root) return err_set(err, PD_EINVAL, "%s: not valid JSON", path);
    rc = cluster_from_json(root, path, out, err);
    cJSON_Delete(root);
    return rc;
}

double cluster_compute_slowdown(const Cluster *cl, int r, const double *load, int n_ranks) {
    if (!cl || cl->cores_per_machine <= 0 || cl->n_levels < 1) return 1.0;
    int per = cl->level[0].workers, m = r / per;
    double k = 0;
    for (int q = m * per; q < (m + 1) * per && q < n_ranks; q++) k += load ? load[q] : 1.0;
    return (k > cl->cores_per_machine ? k / cl->cores_per_machine : 1.0) / cluster_core_efficiency(cl, k);
}
