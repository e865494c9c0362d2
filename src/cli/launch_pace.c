/* launch_pace.c: the checks on a running attempt's pace: stragglers in the progress lines
 * (train --progress-file: each rank's compute per unit beside the profile's prediction), a
 * pipeline slower than predicted or slower than before (then the links are probed). */
#define _DEFAULT_SOURCE   /* getline */
#include "launch_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The lower median of x[0..n) (the (n - 1) / 2-th smallest: of 2 hosts, the faster one, so
 * that a straggler is never its own measure), 0 when n is 0. */
double launch_median(const double *x, int n) {
    double s[MAX_HOSTS];
    if (n <= 0) return 0;
    if (n > MAX_HOSTS) n = MAX_HOSTS;
    memcpy(s, x, sizeof *s * (size_t)n);
    for (int i = 1; i < n; i++)   /* insertion sort: a handful of hosts */
        for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
            double t = s[j];
            s[j] = s[j - 1], s[j - 1] = t;
        }
    return s[(n - 1) / 2];
}

/* A straggler report: counted, and the host listed once (for the done line and event). */
void launch_note_straggler(Launch *L, const char *name) {
    L->learned.n_stragglers++;
    size_t n = strlen(name), k = strlen(L->learned.stragglers);
    for (const char *p = L->learned.stragglers; (p = strstr(p, name)); p += n)
        if ((p == L->learned.stragglers || p[-1] == ' ') && (p[n] == 0 || p[n] == ' ')) return;
    if (k + n + 2 < sizeof L->learned.stragglers) {
        snprintf(L->learned.stragglers + k, sizeof L->learned.stragglers - k, "%s%s", k ? " " : "", name);
        L->learned.n_listed++;
    }
}

/* The number after "key": in [s, end), or NAN. */
static double num_in(const char *s, const char *end, const char *key) {
    const char *p = strstr(s, key);
    return p && p < end ? strtod(p + strlen(key), NULL) : NAN;
}

/* Reads the progress lines the job appended since the last look (one per checkpoint: every
 * rank's compute per unit beside the prediction, train --progress-file). A rank over
 * --straggler-factor times its prediction scaled by the median rank's measured/predicted
 * (when over 1; and by 10% of the largest stage's) at 2 checkpoints in a row is reported once
 * per attempt: on stderr, a straggler event, the summary. A rank's figures cover all its stages
 * (chunks of an interleaved plan) and the prediction one of them: it counts chunks times
 * (the stages of a worker are the model's layers cut evenly enough for that). */
void launch_straggler_check(Launch *L, const LaunchHost *hosts, int n_hosts, int chunks) {
    FILE *f = fopen(L->watch.progress, "r");
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    fseek(f, L->watch.progress_at, SEEK_SET);
    while ((got = getline(&line, &cap, f)) > 0) {
        size_t n = (size_t)got;
        if (line[n - 1] != '\n') break;   /* not complete yet: read it next time */
        L->watch.progress_at += (long)n;
        long mb = (long)num_in(line, line + n, "\"minibatches\":");
        /* a stage too small to hold the pipeline back is no straggler: the excess must be at
         * least 10% of the largest stage's prediction */
        const double V = chunks > 1 ? chunks : 1;
        double most = 0, most_busy = 0, wall = NAN;
        for (const char *p = strstr(line, "\"predicted_ms_per_unit\":"); p; p = strstr(p + 1, "\"predicted_ms_per_unit\":")) {
            double x = strtod(p + 24, NULL);
            const char *b = strstr(p, "\"predicted_busy_ms_per_unit\":");
            double busy = b ? strtod(b + 29, NULL) + (V - 1) * x : NAN;   /* sends: all chunks' already */
            if (V * x > most) most = V * x;
            if (busy > most_busy) most_busy = busy;
        }
        /* the pipeline's pace: rank 0's wall time per unit (waits and the rest), against the
         * slowest stage's predicted compute and sends; over the factor twice in a row, with no
         * host computing slowly enough to explain it, launch probes the links (launch_replan_check) */
        const char *r0 = strstr(line, "{\"rank\":0,");
        if (r0) wall = num_in(r0, line + n, "\"wait_ms_per_unit\":") + num_in(r0, line + n, "\"busy_ms_per_unit\":");
        L->watch.slow_rows = most_busy > 0 && wall > L->cfg.straggler_factor * most_busy ? L->watch.slow_rows + 1 : 0;
        int reported_before = L->learned.n_stragglers;
        /* every rank's figures, then the (lower) median rank's compute over its prediction: a
         * machine slower than its profile throughout (ranks sharing cores, another CPU) slows
         * every rank alike, and a straggler is slow against the others, not the profile */
        int rk[MAX_HOSTS], stg[MAX_HOSTS], k = 0;
        double msr[MAX_HOSTS], prd[MAX_HOSTS], ratio[MAX_HOSTS];
        for (const char *p = strstr(line, "{\"rank\":"); p && k < MAX_HOSTS;) {
            const char *next = strstr(p + 1, "{\"rank\":"), *end = next ? next : line + n;
            int r = atoi(p + 8), st = (int)num_in(p, end, "\"stage\":");
            double ms = num_in(p, end, "\"compute_ms_per_unit\":"), pred = V * num_in(p, end, "\"predicted_ms_per_unit\":");
            p = next;
            if (r < 0 || r >= n_hosts || r >= MAX_HOSTS || !(pred > 0) || !(ms >= 0)) continue;
            rk[k] = r, stg[k] = st, msr[k] = ms, prd[k] = pred, ratio[k] = ms / pred, k++;
        }
        double med = launch_median(ratio, k), typical = med > 1 ? med : 1;
        for (int i = 0; i < k; i++) {
            int r = rk[i], st = stg[i];
            double ms = msr[i], pred = prd[i];
            L->watch.ratio[r] = ms / pred;
            L->watch.over[r] = ms > L->cfg.straggler_factor * typical * pred && ms - typical * pred >= 0.1 * typical * most
                             ? L->watch.over[r] + 1 : 0;
            if (L->watch.over[r] < 2 || L->watch.reported[r]) continue;
            L->watch.reported[r] = 1;
            fprintf(stderr, "pipedream: launch: straggler: %s (rank %d, stage %d) computes %.3f ms per unit, "
                    "%.1fx the predicted %.3f (the median host %.1fx), at 2 checkpoints in a row (minibatch %ld)\n",
                    hosts[r].name, r, st, ms, ms / pred, pred, med, mb);
            FILE *e = launch_event_begin(L, "straggler");
            if (e) {
                fputs(",\"host\":", e);
                launch_json_str(e, hosts[r].name);
                fprintf(e, ",\"rank\":%d,\"stage\":%d,\"measured_ms_per_unit\":%.4f,\"predicted_ms_per_unit\":%.4f,"
                        "\"factor\":%.3f,\"checkpoint_minibatches\":%ld", r, st, ms, pred, ms / pred, mb);
            }
            launch_event_end(e);
            launch_note_straggler(L, hosts[r].name);
        }
        if (L->learned.n_stragglers > reported_before) L->watch.replan_wanted = 1;
        else if (L->watch.slow_rows >= 2 && !L->watch.probe_wanted && (!(L->watch.probe_wall > 0) || wall > L->cfg.straggler_factor * L->watch.probe_wall)) {
            /* once, and again only when the pace has since slowed by the factor again */
            fprintf(stderr, "pipedream: launch: %.3f ms per unit, over %g times the slowest stage's predicted %.3f, "
                    "at 2 checkpoints in a row (minibatch %ld), and no host computes slowly enough to explain it: "
                    "probing the links\n", wall, L->cfg.straggler_factor, most_busy, mb);
            L->watch.replan_wanted = L->watch.probe_wanted = 1;
            L->watch.probe_wall = wall;
        }
    }
    free(line);
    fclose(f);
}

/* At each checkpoint: the time per minibatch between the last two (training and checkpoints
 * alike, from the lines' arrival). Over --straggler-factor times the attempt's best so far, and
 * that much over the pace of the last probe, the pace has dropped mid-run: probe the links. */
void launch_pace_check(Launch *L, const LaunchAttempt *A) {
    if (!(A->t_ck[0] > 0) || A->ck_mb[1] <= A->ck_mb[0] || !(L->cfg.straggler_factor > 0)) return;
    double pace = (A->t_ck[1] - A->t_ck[0]) / (double)(A->ck_mb[1] - A->ck_mb[0]);
    if (!(L->watch.best_pace > 0) || pace < L->watch.best_pace) L->watch.best_pace = pace;
    if (pace > L->cfg.straggler_factor * L->watch.best_pace && !(pace <= L->cfg.straggler_factor * L->watch.probe_pace)) {
        fprintf(stderr, "pipedream: launch: %.4g s per minibatch between the checkpoints at %ld and %ld, %.1f times this "
                "attempt's best: probing the links\n", pace, A->ck_mb[0], A->ck_mb[1], pace / L->watch.best_pace);
        L->watch.replan_wanted = L->watch.probe_wanted = 1;
        L->watch.probe_pace = pace;
    }
}

void launch_watch_reset(Launch *L, int attempt) {
    LaunchWatch *w = &L->watch;
    memset(w, 0, sizeof *w);
    snprintf(w->progress, sizeof w->progress, "%s/progress-%d.jsonl", L->cfg.run_dir, attempt);
    unlink(w->progress);
    w->stall_ck = -1;
}
