/* launch_events.c: the event log (JSON lines: start, failure, membership, replan, straggler,
 * recovered, stopped, gave_up, done; docs/howto/elastic.md) and the short descriptions of plans
 * on launch's stderr lines. */
#define _DEFAULT_SOURCE
#include "launch_impl.h"

#include <string.h>

/* The relaunch trains again (rank 0's "training" line): the recovery ends. */
void launch_recovered(const Launch *L, LaunchRecovery *rec, double t) {
    double dt = t - rec->t_detect;
    rec->total_s += dt;
    rec->t_detect = 0;
    fprintf(stderr, "pipedream: launch: training again on %d host%s %.1f s after the failure was detected\n",
            rec->hosts, rec->hosts == 1 ? "" : "s", dt);
    FILE *e = launch_event_begin(L, "recovered");
    if (e) fprintf(e, ",\"attempt\":%d,\"hosts\":%d,\"recovery_s\":%.3f,\"resume_minibatches\":%ld", rec->attempt,
                   rec->hosts, dt, rec->resume_mb);
    launch_event_end(e);
}

void launch_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

void launch_json_hosts(FILE *f, const LaunchHost *h, int n) {
    fputc('[', f);
    for (int i = 0; i < n; i++) {
        if (i) fputc(',', f);
        launch_json_str(f, h[i].name);
    }
    fputc(']', f);
}

/* {"stages": S, "layers": [[first, last], ...], "replicas": [...], "predicted_s": x} */
void launch_json_plan(FILE *f, const Plan *p) {
    if (!p) {
        fputs("null", f);
        return;
    }
    fprintf(f, "{\"stages\":%d,\"layers\":[", p->n_stages);
    for (int s = 0; s < p->n_stages; s++)
        fprintf(f, "%s[%d,%d]", s ? "," : "", p->stages[s].layers[0], p->stages[s].layers[p->stages[s].n_layers - 1]);
    fputs("],\"replicas\":[", f);
    for (int s = 0; s < p->n_stages; s++) fprintf(f, "%s%d", s ? "," : "", p->stages[s].replicas);
    fprintf(f, "],\"predicted_s_per_minibatch\":%.6g}", p->pipeline_s);
}

/* The fields every change of hosts or plan ends with: hosts and plans before and after, and
 * the checkpoint the next attempt resumes from. */
void launch_json_change(FILE *e, const LaunchHost *before, int nb, const LaunchHost *after, int na, const Plan *pb, const Plan *pa,
                        long ck) {
    fputs(",\"hosts_before\":", e);
    launch_json_hosts(e, before, nb);
    fputs(",\"hosts_after\":", e);
    launch_json_hosts(e, after, na);
    fputs(",\"plan_before\":", e);
    launch_json_plan(e, pb);
    fputs(",\"plan_after\":", e);
    launch_json_plan(e, pa);
    fprintf(e, ",\"checkpoint_minibatches\":%ld", ck > 0 ? ck : 0);
}

void launch_plan_brief(const Plan *p, char *b, size_t n) {
    size_t k = (size_t)snprintf(b, n, "%d stage%s", p->n_stages, p->n_stages == 1 ? "" : "s");
    for (int s = 0; s < p->n_stages && k < n; s++)
        k += (size_t)snprintf(b + k, n - k, "%s layers %d-%d x%d", s ? "," : ":", p->stages[s].layers[0],
                              p->stages[s].layers[p->stages[s].n_layers - 1], p->stages[s].replicas);
}

/* Starts an event line: {"event": kind, "t": seconds since launch, "time": UTC. The caller
 * adds its fields and ends it with event_end. */
FILE *launch_event_begin(const Launch *L, const char *kind) {
    if (!L->events) return NULL;
    char ts[32];
    struct timespec w;
    clock_gettime(CLOCK_REALTIME, &w);
    size_t k = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", gmtime(&w.tv_sec));
    snprintf(ts + k, sizeof ts - k, ".%03dZ", (int)(w.tv_nsec / 1000000));
    fprintf(L->events, "{\"event\":\"%s\",\"t\":%.3f,\"time\":\"%s\"", kind, launch_now() - L->t0, ts);
    return L->events;
}

void launch_event_end(FILE *f) {
    if (!f) return;
    fputs("}\n", f);
    fflush(f);
}
