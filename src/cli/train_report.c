/* train_report.c: printing a training session's summary (train_report.h). */
#include "train_report.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "curve.h"
#include "sim.h"

static void num(cJSON *o, const char *k, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, k, v);
    else cJSON_AddNullToObject(o, k);
}

static char *print_free(cJSON *o) {
    char *t = cJSON_PrintUnformatted(o);
    PD_ASSERT(t);
    cJSON_Delete(o);
    return t;
}

char *train_summary_json(const RtTrainSummary *s, double bytes_per_token) {
    cJSON *o = cJSON_CreateObject();
    PD_ASSERT(o);
    cJSON_AddStringToObject(o, "model", s->model);
    cJSON_AddStringToObject(o, "schedule", s->schedule);
    cJSON_AddStringToObject(o, "transport", s->transport);
    cJSON_AddStringToObject(o, "staleness", s->staleness);
    num(o, "workers", s->workers);
    num(o, "stages", s->stages);
    num(o, "threads", s->threads);
    cJSON_AddStringToObject(o, "precision", s->precision);
    cJSON_AddStringToObject(o, "optimizer", s->optimizer);
    num(o, "lr", s->lr);
    cJSON_AddStringToObject(o, "lr_schedule", s->lr_schedule);
    cJSON_AddStringToObject(o, "wire", s->wire);
    cJSON_AddStringToObject(o, "wire_grad", s->wire_grad);
    cJSON_AddBoolToObject(o, "error_feedback", s->error_feedback);
    num(o, "bytes_sent", s->bytes_sent);
    num(o, "wire_ratio", s->wire_ratio);
    /* boundary b (stages b, b + 1): the payload bytes each way, as sent, and fp32's over them */
    cJSON *bs = cJSON_AddArrayToObject(o, "boundaries");
    for (int b = 0; s->stage && b + 1 < s->stages; b++) {
        const RtStageSummary *lo = &s->stage[b], *hi = &s->stage[b + 1];
        cJSON *x = cJSON_CreateObject();
        PD_ASSERT(x);
        num(x, "boundary", b);
        cJSON_AddStringToObject(x, "wire", rt_wire_name(lo->wire_act));
        num(x, "act_bytes", lo->act_wire_bytes);
        num(x, "act_ratio", lo->act_wire_bytes > 0 ? lo->act_raw_bytes / lo->act_wire_bytes : NAN);
        cJSON_AddStringToObject(x, "wire_grad", rt_wire_name(hi->wire_grad));
        num(x, "grad_bytes", hi->grad_wire_bytes);
        num(x, "grad_ratio", hi->grad_wire_bytes > 0 ? hi->grad_raw_bytes / hi->grad_wire_bytes : NAN);
        cJSON_AddItemToArray(bs, x);
    }
    num(o, "grad_norm_mean", s->grad_norm_mean);
    num(o, "grad_norm_max", s->grad_norm_max);
    num(o, "clipped_steps", isnan(s->grad_norm_mean) ? NAN : s->clipped_steps);
    num(o, "minibatch", s->minibatch);
    num(o, "steps", s->steps);
    num(o, "epochs", s->epochs);
    num(o, "units", s->units);
    num(o, "unit_batch", s->unit_batch);
    num(o, "microbatches", s->unit_batch > 0 ? s->minibatch / s->unit_batch : NAN);
    num(o, "final_loss", s->final_loss);
    num(o, "mean_loss", s->mean_loss);
    num(o, "test_accuracy", s->test_accuracy);
    num(o, "test_loss", s->test_loss);
    if (bytes_per_token > 0) num(o, "test_loss_per_byte", s->test_loss / bytes_per_token);
    num(o, "samples_per_s", s->samples_per_s);
    num(o, "samples_per_cpu_s", s->samples_per_cpu_s);
    num(o, "time_per_unit_ms", s->time_per_unit_ms);
    num(o, "predicted_time_per_unit_ms", s->predicted_time_per_unit_ms);
    if (!isfinite(s->predicted_time_per_unit_ms))   /* why there is none, as the stderr line says */
        cJSON_AddStringToObject(o, "predicted_time_per_unit_note", s->predicted_note[0] ? s->predicted_note : "no profile given");
    num(o, "predicted_steady_time_per_unit_ms", s->predicted_steady_ms);
    num(o, "fitted_core_efficiency", s->fitted_core_efficiency);
    num(o, "fitted_wake_ms", 1e3 * s->fitted_wake_s);
    num(o, "fitted_link_scale", s->fitted_link_scale);
    num(o, "overhead_pct", s->overhead_pct);
    num(o, "wall_s", s->wall_s);
    num(o, "data_mean", s->data_mean);
    num(o, "data_std", s->data_std);
    num(o, "resumed_from", (double)s->resumed_from);
    if (s->target_minibatches) {
        num(o, "target_minibatches", (double)s->target_minibatches);
        num(o, "target_train_s", s->target_train_s);
    } else {
        cJSON_AddNullToObject(o, "target_minibatches");
        cJSON_AddNullToObject(o, "target_train_s");
    }
    /* asp: staleness of the applied gradients, pull round trips (docs/explanation/asp.md); null otherwise */
    num(o, "staleness_mean", s->staleness_mean);
    num(o, "staleness_max", s->asp_figures && s->staleness_max >= 0 ? s->staleness_max : NAN);
    num(o, "pull_ms_mean", s->pull_ms_mean);
    num(o, "pull_ms_max", s->pull_ms_max);
    if (s->last_checkpoint[0]) cJSON_AddStringToObject(o, "last_checkpoint", s->last_checkpoint);
    else cJSON_AddNullToObject(o, "last_checkpoint");
    cJSON *crcs = cJSON_AddArrayToObject(o, "weights_crc");
    for (int i = 0; i < s->stages; i++) {
        char h[16];
        snprintf(h, sizeof h, "%08x", s->stage[i].weights_crc);
        cJSON_AddItemToArray(crcs, cJSON_CreateString(h));
    }
    return print_free(o);
}

char *train_eval_json(const RtEvalPoint *e) {
    cJSON *o = cJSON_CreateObject();
    PD_ASSERT(o);
    num(o, "eval_minibatches", (double)e->minibatches);
    num(o, "epoch", e->epoch);
    num(o, "train_s", e->train_s);
    num(o, "test_accuracy", e->test_accuracy);
    num(o, "test_loss", e->test_loss);
    return print_free(o);
}

char *train_step_json(int step, double epoch, double loss, double accuracy) {
    cJSON *o = cJSON_CreateObject();
    PD_ASSERT(o);
    num(o, "step", step);
    num(o, "epoch", epoch);
    num(o, "loss", loss);
    num(o, "accuracy", accuracy);
    return print_free(o);
}

char *train_stage_json(const RtTrainSummary *s, int i) {
    const RtStageSummary *g = &s->stage[i];
    cJSON *o = cJSON_CreateObject();
    PD_ASSERT(o);
    num(o, "stage", i);
    num(o, "replicas", g->replicas);
    num(o, "measured_ms_per_unit", g->measured_ms);
    num(o, "predicted_ms_per_unit", g->predicted_ms);
    num(o, "busy", g->busy);
    /* of measured_ms_per_unit, the time its thread was on a CPU (null with --threads other than 1) */
    num(o, "cpu_ms_per_unit", g->cpu_ms);
    num(o, "versions", g->versions);
    /* the staleness its units crossed: updates between the version read and their own */
    num(o, "staleness_mean", g->delay_mean);
    num(o, "staleness_max", g->delay_max);
    /* the memory ledger: what replica 0 allocated, beside the simulator's prediction */
    num(o, "allocated_bytes", (double)g->mem.total);
    num(o, "params_bytes", (double)g->mem.params);
    num(o, "grads_bytes", (double)g->mem.grads);
    num(o, "opt_state_bytes", (double)g->mem.opt_state);
    num(o, "stashed_bytes", (double)g->mem.stashed);
    num(o, "activation_bytes", (double)g->mem.activations);
    num(o, "workspace_bytes", (double)g->mem.workspace);
    num(o, "scratch_bytes", (double)g->mem.scratch);
    num(o, "predicted_weights_bytes", (double)g->mem.predicted);
    num(o, "predicted_allocated_bytes", g->predicted_bytes);
    num(o, "predicted_activation_bytes", g->predicted_activation_bytes);
    num(o, "predicted_stashed_bytes", g->predicted_stashed_bytes);
    num(o, "predicted_scratch_bytes", g->predicted_scratch_bytes);
    return print_free(o);
}

/* Measured events as the simulator's timeline events. */
static int write_pictures(const RtTrainSummary *s, const TrainOutputs *o, Err *err) {
    int n = 0;
    for (int r = 0; r < s->workers; r++) n += s->res[r].n_events;
    TraceEvent *ev = malloc(((size_t)n + 1) * sizeof *ev);
    PD_ASSERT(ev);
    int k = 0;
    for (int r = 0; r < s->workers; r++)
        for (int i = 0; i < s->res[r].n_events; i++) {
            const RtEvent *e = &s->res[r].events[i];
            int kind = sim_trace_kind(e->op);
            if (kind < 0 || e->t1 <= e->t0) continue;
            ev[k++] = (TraceEvent){r, kind, e->mb, -1, e->t0, e->t1};
        }
    int rc = PD_OK;
    char title[160];
    snprintf(title, sizeof title, "%s, %d workers: measured%s", s->schedule, s->workers,
             s->n_sim_events ? " (above) and simulated from the profile (below)" : "");
    if (o->svg && s->n_sim_events) {   /* each panel: the fill and a steady-state stretch, its own time axis */
        SvgPanel p[2] = {{.ev = ev, .n = k, .n_workers = s->workers, .o = {.title = "measured", .show_comm = 1}},
                         {.ev = s->sim_events, .n = s->n_sim_events, .n_workers = s->workers,
                          .o = {.title = "simulated (same plan and profile)", .show_comm = 1}}};
        sim_svg_fill_steady(ev, k, s->workers, 30, &p[0].win);
        sim_svg_fill_steady(s->sim_events, s->n_sim_events, s->workers, 30, &p[1].win);
        rc = sim_svg_write_panels(o->svg, p, 2, title, err);
    } else if (o->svg) {
        SvgOpts so = {.title = title, .show_comm = 1};
        rc = sim_svg_write(o->svg, ev, k, s->workers, &so, err);
    }
    if (!rc && o->trace) rc = sim_trace_write(o->trace, ev, k, err);
    free(ev);
    return rc;
}

/* Loss and training accuracy per unit (global index; NAN where none) from the last stage's
 * replicas: *n entries each, owned. */
static void unit_history(const RtTrainSummary *s, float **loss_out, float **acc_out, int *n_out) {
    int n = 0;
    for (int r = 0; r < s->workers; r++)
        for (int k = 0; k < s->res[r].n_hist; k++)
            if ((int)s->res[r].hist[3 * k] + 1 > n) n = (int)s->res[r].hist[3 * k] + 1;
    float *loss = malloc(((size_t)n + 1) * sizeof(float)), *acc = malloc(((size_t)n + 1) * sizeof(float));
    PD_ASSERT(loss && acc);
    for (int i = 0; i < n; i++) loss[i] = acc[i] = NAN;
    for (int r = 0; r < s->workers; r++)
        for (int k = 0; k < s->res[r].n_hist; k++) {
            int u = (int)s->res[r].hist[3 * k];
            if (u >= 0 && u < n) loss[u] = s->res[r].hist[3 * k + 1], acc[u] = s->res[r].hist[3 * k + 2];
        }
    *loss_out = loss, *acc_out = acc, *n_out = n;
}

/* The "step" metrics lines: every log_every minibatches of this run (and its last), the mean
 * loss and training accuracy of the window's minibatches (each the mean of its units). */
static void write_steps(FILE *f, const RtTrainSummary *s, int log_every) {
    float *loss, *acc;
    int n;
    unit_history(s, &loss, &acc, &n);
    int per = s->unit_batch > 0 && s->minibatch >= s->unit_batch ? s->minibatch / s->unit_batch : 1;
    double wl = 0, wa = 0;
    int wn = 0;
    for (int g = (int)s->resumed_from; g < s->steps; g++) {
        double l = 0, a = 0;
        int k = 0;
        for (int u = g * per; u < (g + 1) * per && u < n; u++)
            if (isfinite(loss[u])) l += loss[u], a += acc[u], k++;
        if (k) wl += l / k, wa += a / k, wn++;
        if ((g + 1) % log_every == 0 || g + 1 == s->steps) {
            if (wn) {
                char *t = train_step_json(g + 1, s->steps > 0 ? s->epochs * (g + 1) / s->steps : NAN, wl / wn, wa / wn);
                fprintf(f, "%s\n", t);
                free(t);
            }
            wl = wa = 0, wn = 0;
        }
    }
    free(loss);
    free(acc);
}

/* Loss and training accuracy per unit from the last stage's replicas, and test accuracy. */
static int write_curve(const RtTrainSummary *s, const char *path, Err *err) {
    float *loss, *acc;
    int n;
    unit_history(s, &loss, &acc, &n);
    char title[160];
    snprintf(title, sizeof title, "%s, %d workers: training loss and accuracy", s->schedule, s->workers);
    int rc = curve_svg_write(path, loss, acc, n, s->test_accuracy, title, err);
    free(loss);
    free(acc);
    return rc;
}

/* Where a run more than 15% off its prediction went: the stage whose compute is furthest off in
 * the same direction, and how much of that compute its thread was on a CPU; or, no stage's
 * compute that far off, the waiting between stages (and the ranks' share of a CPU, where other
 * processes had the cores). */
static void explain_miss(const RtTrainSummary *s) {
    double m = s->time_per_unit_ms, p = s->predicted_time_per_unit_ms;
    if (!(isfinite(p) && p > 0 && m > 0) || fabs(log(m / p)) <= log(1.15)) return;
    int slower = m > p, worst = -1;
    double off = log(1.15), cpu_lo = INFINITY, cpu_hi = -INFINITY;
    for (int i = 0; i < s->stages; i++) {
        const RtStageSummary *g = &s->stage[i];
        if (!(g->measured_ms > 0)) continue;
        if (isfinite(g->cpu_ms)) {
            double on = g->cpu_ms / g->measured_ms;
            cpu_lo = on < cpu_lo ? on : cpu_lo, cpu_hi = on > cpu_hi ? on : cpu_hi;
        }
        double d = g->predicted_ms > 0 ? log(g->measured_ms / g->predicted_ms) * (slower ? 1 : -1) : 0;
        if (d > off) off = d, worst = i;
    }
    fprintf(stderr, "off the prediction by %+.0f%%: ", 100 * (m / p - 1));
    if (worst >= 0) {
        const RtStageSummary *g = &s->stage[worst];
        fprintf(stderr, "furthest, stage %d computed %.4g ms per unit against %.4g predicted (%+.0f%%)", worst,
                g->measured_ms, g->predicted_ms, 100 * (g->measured_ms / g->predicted_ms - 1));
        if (isfinite(g->cpu_ms))
            fprintf(stderr, ", on a CPU %.0f%% of that time%s", 100 * g->cpu_ms / g->measured_ms,
                    g->cpu_ms < 0.85 * g->measured_ms ? " (the rest, other processes had its core)" : "");
        fputc('\n', stderr);
        return;
    }
    fprintf(stderr, "no stage computed more than 15%% %s its prediction; the difference is in the waiting between "
                    "stages (--svg draws it)", slower ? "over" : "under");
    if (slower && isfinite(cpu_lo) && cpu_lo < 0.85)
        fprintf(stderr, ", and the ranks were on a CPU only %.0f-%.0f%% of their compute time (other processes had "
                        "the cores)", 100 * cpu_lo, 100 * cpu_hi);
    fputc('\n', stderr);
}

int train_report(const RtTrainSummary *s, const TrainOutputs *o, Err *err) {
    /* on CPU: the part of the stage's compute time its thread ran (the rest it waited for a core) */
    fprintf(stderr, "\n%-6s %-9s %22s %22s %8s %9s %8s %12s %12s %15s\n", "stage", "replicas", "measured F+B ms/unit",
            "predicted F+B ms/unit", "busy %", "on CPU %", "versions", "alloc MB", "predicted MB", "staleness avg/max");
    for (int i = 0; i < s->stages; i++) {
        const RtStageSummary *g = &s->stage[i];
        char cpu[16] = "-";
        if (isfinite(g->cpu_ms) && g->measured_ms > 0) snprintf(cpu, sizeof cpu, "%.1f", 100 * g->cpu_ms / g->measured_ms);
        fprintf(stderr, "%-6d %-9d %22.3f %22.3f %8.1f %9s %8d %12.2f %12.2f %11.2f/%-3d\n", i, g->replicas, g->measured_ms,
                g->predicted_ms, 100 * g->busy, cpu, g->versions, (double)g->mem.total / 1e6, g->predicted_bytes / 1e6,
                g->delay_mean, g->delay_max);
    }
    fprintf(stderr, "staleness compensation: %s\n", s->staleness);
    char steady[64] = "";
    if (isfinite(s->predicted_steady_ms)) snprintf(steady, sizeof steady, "; steady state %.3f ms", s->predicted_steady_ms);
    if (isfinite(s->predicted_time_per_unit_ms))
        fprintf(stderr, "time per unit: measured %.3f ms, simulator %.3f ms (%s%s)\n", s->time_per_unit_ms,
                s->predicted_time_per_unit_ms, s->predicted_note[0] ? s->predicted_note : "same plan and profile", steady);
    else   /* no profile, or the simulator's error */
        fprintf(stderr, "time per unit: measured %.3f ms; no prediction (%s)\n", s->time_per_unit_ms,
                s->predicted_note[0] ? s->predicted_note : "no profile given");
    explain_miss(s);
    char *line = train_summary_json(s, o->bytes_per_token);
    puts(line);
    fflush(stdout);
    int rc = PD_OK;
    if (o->metrics) {
        FILE *f = fopen(o->metrics, "w");
        if (!f) rc = err_set(err, PD_EIO, "%s: cannot open for writing", o->metrics);
        else {
            fprintf(f, "%s\n", line);
            for (int i = 0; i < s->stages; i++) {
                char *t = train_stage_json(s, i);
                fprintf(f, "%s\n", t);
                free(t);
            }
            for (int i = 0; i < s->n_evals; i++) {
                char *t = train_eval_json(&s->evals[i]);
                fprintf(f, "%s\n", t);
                free(t);
            }
            write_steps(f, s, o->log_every > 0 ? o->log_every : 50);
            if (fclose(f) != 0) rc = err_set(err, PD_EIO, "%s: write failed", o->metrics);
        }
    }
    free(line);
    if (!rc && (o->svg || o->trace)) rc = write_pictures(s, o, err);
    if (!rc && o->curve) rc = write_curve(s, o->curve, err);
    return rc;
}
