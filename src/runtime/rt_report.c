/* rt_report.c: what a training run reports from its workers' figures, measured against the
 * simulator's prediction for the same plan and profile: the --progress-file line after each
 * checkpoint (per rank, for straggler detection), and rank 0's summary of the run (per stage,
 * with the prediction and, on request, the cluster figure fitted to the run). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "rt_impl.h"
#include "rt_session.h"
#include "sim.h"

/* Stage i's compute per unit on its first replica (ms) as the simulator's run sr of costs
 * charges it: slowed where workers share a machine's cores, and with the optimizer step spread
 * over the units it follows (as the measured figures have it). */
static double stage_predicted_ms(const Schedule *s, const SimCosts *costs, const SimResult *sr, int i) {
    const SchedWorker *sw = &s->workers[s->stages[i].ranks[0]];
    int nfw = 0, nst = 0;
    for (int k = 0; k < sw->n; k++) nfw += sw->ins[k].op == OP_FORWARD, nst += sw->ins[k].op == OP_STEP;
    double step = nfw ? costs->stage[i].step_s * nst / nfw : 0;
    return 1e3 * (costs->stage[i].fwd_s + costs->stage[i].bwd_s + step) * sr->slowdown[s->stages[i].ranks[0]];
}

/* The codecs of the run per boundary for the simulator (SimOpts.wire_at; RT_WIRE_* numbers
 * them as it does), n stages; NULL where fp32 or bf16 go both ways (its wire_factor), else the
 * caller frees it. */
static int *sim_wire_at(const RtTrainSpec *sp, int n) {
    if (!sp->wire_at && sp->wire <= RT_WIRE_BF16 && sp->wire_grad == sp->wire && !sp->error_feedback) return NULL;
    int *w = calloc(2 * (size_t)n, sizeof(int));
    PD_ASSERT(w);
    for (int b = 0; b + 1 < n; b++)
        w[2 * b] = sp->wire_at ? sp->wire_at[2 * b] : sp->wire, w[2 * b + 1] = sp->wire_at ? sp->wire_at[2 * b + 1] : sp->wire_grad;
    return w;
}

/* Per stage, the simulator's compute per unit on its first replica (ms, as rt_summarize's
 * predicted_ms has it); NAN without a profile or when the simulator fails. */
static void predict_stage_ms(const RtTrainSpec *sp, const Schedule *s, int unit_batch, double *ms) {
    for (int i = 0; i < s->n_stages; i++) ms[i] = NAN;
    if (!sp->profile) return;
    SimCosts costs;
    SimResult sr;
    int *wire_at = sim_wire_at(sp, s->n_stages);
    SimOpts so = {.cluster = &sp->plan->cluster, .opt_state_factor = optim_is_adam(sp->opt.kind) ? 2 : 1,
                  .samples_per_unit = unit_batch, .wire_factor = sp->wire == RT_WIRE_BF16 ? 0.5 : 1.0,
                  .wire_at = wire_at, .error_feedback = sp->error_feedback};
    Err e2 = {0};
    if (sim_costs_from_profile(s, sp->profile, &costs, &e2) != PD_OK) {
        free(wire_at);
        return;
    }
    sim_costs_scale(&costs, sp->profile->minibatch > 0 ? (double)unit_batch / sp->profile->minibatch : 1.0);
    if (sim_run(s, &costs, &so, &sr, &e2) == PD_OK) {
        for (int i = 0; i < costs.n_stages; i++) ms[i] = stage_predicted_ms(s, &costs, &sr, i);
        sim_result_release(&sr);
    }
    sim_costs_release(&costs);
    free(wire_at);
}

int rt_progress_file_line(Comm *c, const RtTrainSpec *sp, const Schedule *seg, int unit_batch, uint64_t minibatches,
                          const double fig[RT_SEG_FIGS], double timeout_s, Err *err) {
    void **parts = NULL;
    size_t *sizes = NULL;
    int rc = comm_gather(c, 0, fig, RT_SEG_FIGS * sizeof(double), &parts, &sizes, timeout_s, err);
    if (rc || comm_rank(c) != 0) return rc;
    int n = comm_size(c);
    double *pred = malloc((size_t)seg->n_stages * sizeof *pred);
    PD_ASSERT(pred);
    predict_stage_ms(sp, seg, unit_batch, pred);
    double bw = sp->plan->cluster.level[0].bandwidth;
    FILE *f = fopen(sp->progress_file, "a");
    if (!f) {
        pd_log(LOG_WARN, "--progress-file %s: %s", sp->progress_file, strerror(errno));
    } else {
        fprintf(f, "{\"minibatches\":%llu,\"ranks\":[", (unsigned long long)minibatches);
        for (int r = 0; r < n; r++) {
            double x[RT_SEG_FIGS] = {0};
            if (sizes[r] == sizeof x) memcpy(x, parts[r], sizeof x);
            int st = (int)x[0];
            double u = x[5] > 0 ? x[5] : NAN, pc = st >= 0 && st < seg->n_stages ? pred[st] : NAN;
            double bytes = x[4] / u, pb = pc + (bw > 0 ? 1e3 * bytes / bw : 0);
            fprintf(f, "%s{\"rank\":%d,\"stage\":%d,\"units\":%.0f,\"compute_ms_per_unit\":%.4f,"
                       "\"wait_ms_per_unit\":%.4f,\"busy_ms_per_unit\":%.4f,\"bytes_per_unit\":%.0f",
                    r ? "," : "", r, st, x[5], 1e3 * x[1] / u, 1e3 * x[2] / u, 1e3 * (x[3] - x[2]) / u, bytes);
            if (isfinite(pc)) fprintf(f, ",\"predicted_ms_per_unit\":%.4f,\"predicted_busy_ms_per_unit\":%.4f", pc, pb);
            fputc('}', f);
        }
        fputs("]}\n", f);
        fclose(f);
    }
    free(pred);
    comm_parts_free(parts, sizes, n);
    return PD_OK;
}

/* The simulator's time per unit for the run's schedule with one figure of the plan's cluster set
 * to e (RT_FIT_*: the core efficiency, the wake cost, or a factor on every link's bandwidth);
 * NAN on error. */
static double sim_at_what(const Schedule *s, const SimCosts *costs, const SimOpts *so, double e, int what) {
    Cluster cl = *so->cluster;
    if (what == RT_FIT_WAKE) cl.wake_s = e;
    else if (what == RT_FIT_LINK_RATE) cluster_scale_bandwidth(&cl, e);
    else cl.core_efficiency = e;
    SimOpts o = *so;
    o.cluster = &cl;
    SimResult r;
    Err err = {0};
    if (sim_run(s, costs, &o, &r, &err) != PD_OK) return NAN;
    double t = s->n_units > 0 ? 1e3 * r.makespan_s / s->n_units : NAN;
    sim_result_release(&r);
    return t;
}

/* RtTrainSpec.fit: the value of one of the plan's cluster's figures at which the simulator's run
 * of these units takes the measured time per unit:
 *   - the core efficiency E in [0.05, 1] (the prediction falls as E rises:
 *     cluster_core_efficiency scales every share of a busy machine's cores by E);
 *   - the wake cost w in [0, 50 ms], the core efficiency staying the plan's (the prediction
 *     rises with w: a waking worker is charged w where its machine's cores are all busy);
 *   - the link rate: a factor f in [0.05, 4] on every bandwidth of the cluster, its levels' and
 *     its hosts' own (the prediction falls as f rises): the share of the nominal rates the run's
 *     transfers and all-reduces achieved, where they set its pace.
 * A bisection, 30 halvings. Where even the bound that predicts fastest is slower than the run
 * (or the other faster), that bound; where the figure does not enter the prediction (the
 * workers do not share cores; no more computing workers than cores; no wait ends on busy
 * cores; no transfer is on the run's critical path), NAN. fitted_note says which;
 * fitted_time_per_unit_ms is the prediction at the value. */
enum { FIT_WAKE_MAX_MS = 50 };
static void fit_cluster(const Schedule *s, const SimCosts *costs, const SimOpts *so, int what, RtTrainSummary *out) {
    const double want = out->time_per_unit_ms;
    const int wake = what == RT_FIT_WAKE, link = what == RT_FIT_LINK_RATE;
    const char *name = wake ? "wake cost" : link ? "link rate" : "core efficiency";
    double *got = wake ? &out->fitted_wake_s : link ? &out->fitted_link_scale : &out->fitted_core_efficiency;
    *got = out->fitted_time_per_unit_ms = NAN;
    if (!link && (!so->cluster || so->cluster->cores_per_machine <= 0)) {
        snprintf(out->fitted_note, sizeof out->fitted_note, "the plan's cluster gives no cores per machine: its "
                 "workers do not share cores, and the %s does not enter the prediction", name);
        return;
    }
    if (!(want > 0)) {
        snprintf(out->fitted_note, sizeof out->fitted_note, "no time per unit was measured");
        return;
    }
    /* fast: the bound that predicts the shorter time; slow: the other */
    double fast = wake ? 0 : link ? 4.0 : 1.0, slow = wake ? FIT_WAKE_MAX_MS * 1e-3 : 0.05;
    const double t_fast = sim_at_what(s, costs, so, fast, what), t_slow = sim_at_what(s, costs, so, slow, what);
    if (!(t_fast > 0) || !(t_slow > 0)) {
        snprintf(out->fitted_note, sizeof out->fitted_note, "the simulator failed on the run's schedule");
        return;
    }
    if (t_slow - t_fast < 1e-6 * t_fast) {
        snprintf(out->fitted_note, sizeof out->fitted_note, "the prediction does not depend on the %s here (%s)", name,
                 wake ? "no wait ends while the cores are busy"
                 : link ? "nothing crosses a link" : "no more computing workers than cores");
        return;
    }
    const double unit = wake ? 1e3 : 1;   /* reported in ms, or as is */
    const char *suffix = wake ? " ms" : "";
    if (want <= t_fast || want >= t_slow) {   /* the nearest the model comes: a bound */
        const int faster = want <= t_fast;
        *got = faster ? fast : slow;
        out->fitted_time_per_unit_ms = faster ? t_fast : t_slow;
        snprintf(out->fitted_note, sizeof out->fitted_note, "the run (%.3f ms per unit) was %s than the simulator "
                 "predicts at %s %g%s (%.3f): %g%s is the nearest", want, faster ? "faster" : "slower", name,
                 unit * *got, suffix, out->fitted_time_per_unit_ms, unit * *got, suffix);
        return;
    }
    for (int i = 0; i < 30; i++) {
        double mid = 0.5 * (fast + slow), t = sim_at_what(s, costs, so, mid, what);
        if (!(t > 0)) break;
        if (t > want) slow = mid;
        else fast = mid;
    }
    *got = 0.5 * (fast + slow);
    out->fitted_time_per_unit_ms = sim_at_what(s, costs, so, *got, what);
    snprintf(out->fitted_note, sizeof out->fitted_note, "fitted");
}

void rt_summarize(const RtTrainSpec *sp, const Schedule *s, int unit_batch, const char *transport, int64_t n_train,
                  double mean, double std, RtTrainSummary *out) {
    RtWorkerResult *res = out->res;
    double wall = 0, loss_sum = 0, last_loss = 0, overhead = 0, test_loss = 0, cpu = 0;
    long correct = 0, total = 0;
    int units = 0, n_last = 0;
    const SchedStage *lst = &s->stages[s->n_stages - 1];
    /* the final loss: the run's last minibatch, whose units the last stage's replicas share */
    int64_t last_mb = -1;
    for (int j = 0; j < lst->replicas; j++) {
        const RtWorkerResult *q = &res[lst->ranks[j]];
        if (q->last_n > 0 && q->last_mb > last_mb) last_mb = q->last_mb;
    }
    for (int r = 0; r < s->n_ranks; r++) {
        if (res[r].wall_s > wall) wall = res[r].wall_s;
        int runs_last = 0;   /* a replica of the last stage (interleaved: its last chunk) */
        for (int j = 0; j < lst->replicas; j++) runs_last |= lst->ranks[j] == r;
        if (runs_last) {
            loss_sum += res[r].loss_sum;
            units += res[r].units_done;
            if (res[r].last_n > 0 && res[r].last_mb == last_mb) last_loss += res[r].last_loss, n_last += res[r].last_n;
        }
        correct += res[r].test_correct;
        total += res[r].test_total;
        test_loss += res[r].test_loss_sum;
        /* runtime overhead: time neither in kernels nor blocked on messages; the largest share */
        if (res[r].stage >= 0 && res[r].wall_s > 0) {
            double ov = (res[r].wall_s - res[r].compute_s - res[r].wait_s) / res[r].wall_s;
            if (ov > overhead) overhead = ov;
        }
        /* CPU: the processes' clocks, each once (workers on threads of one process share it) */
        int first = 1;
        double most = res[r].cpu_s;
        for (int q = 0; q < s->n_ranks; q++)
            if (res[q].pid == res[r].pid) {
                if (q < r) first = 0;
                if (res[q].cpu_s > most) most = res[q].cpu_s;
            }
        if (first) cpu += most;
    }
    snprintf(out->model, sizeof out->model, "%s", sp->plan->model);
    snprintf(out->schedule, sizeof out->schedule, "%s", sched_kind_name(s->kind));
    snprintf(out->transport, sizeof out->transport, "%s", transport);
    snprintf(out->optimizer, sizeof out->optimizer, "%s", optim_kind_name(sp->opt.kind));
    char lr[32];
    snprintf(lr, sizeof lr, "%.7g", (double)sp->opt.lr);   /* the float's decimal, not its binary expansion */
    out->lr = strtod(lr, NULL);
    out->minibatch = sp->minibatch, out->threads = sp->threads > 0 ? sp->threads : 1;
    snprintf(out->precision, sizeof out->precision, "%s", kern_precision_name(sp->precision));
    out->workers = s->n_ranks, out->stages = s->n_stages, out->steps = s->n_minibatches;
    out->epochs = n_train > 0 ? (double)s->n_minibatches * sp->minibatch / (double)n_train : NAN;
    out->units = units, out->unit_batch = unit_batch;
    out->final_loss = units && n_last ? last_loss / n_last : NAN;   /* none trained (resumed at the end) */
    out->mean_loss = units ? loss_sum / units : NAN;
    out->test_accuracy = total ? (double)correct / (double)total : NAN;
    out->test_loss = total ? test_loss / (double)total : NAN;
    out->wall_s = wall;
    out->samples_per_s = wall > 0 ? (double)units * unit_batch / wall : units ? 0 : NAN;
    out->samples_per_cpu_s = cpu > 0 ? (double)units * unit_batch / cpu : NAN;
    out->time_per_unit_ms = units ? 1e3 * wall / (double)units : NAN;
    out->overhead_pct = 100 * overhead;
    out->data_mean = mean, out->data_std = std;
    out->predicted_time_per_unit_ms = out->predicted_steady_ms = NAN;
    out->fitted_core_efficiency = out->fitted_time_per_unit_ms = out->fitted_wake_s = out->fitted_link_scale = NAN;
    snprintf(out->fitted_note, sizeof out->fitted_note, "%s", sp->fit != RT_FIT_NONE ? "no profile given" : "not asked");
    out->staleness_mean = out->pull_ms_mean = out->pull_ms_max = NAN;
    out->staleness_max = -1;
    snprintf(out->lr_schedule, sizeof out->lr_schedule, "%s", optim_lr_sched_name(sp->opt.lr_sched));
    snprintf(out->wire, sizeof out->wire, "%s", sp->wire_at ? "plan" : rt_wire_name(sp->wire));
    snprintf(out->wire_grad, sizeof out->wire_grad, "%s", sp->wire_at ? "plan" : rt_wire_name(sp->wire_grad));
    out->error_feedback = sp->error_feedback;
    out->bytes_sent = 0;
    for (int r = 0; r < s->n_ranks; r++) out->bytes_sent += out->res[r].bytes_sent;
    out->grad_norm_mean = out->grad_norm_max = NAN;   /* every rank saw the same norms: the first one's */
    for (int r = 0; r < s->n_ranks; r++)
        if (out->res[r].n_norms) {
            out->grad_norm_mean = out->res[r].grad_norm_sum / out->res[r].n_norms;
            out->grad_norm_max = out->res[r].grad_norm_max;
            out->clipped_steps = out->res[r].n_clipped, out->clip_steps = out->res[r].n_norms;
            break;
        }
    out->stage = calloc((size_t)s->n_stages, sizeof *out->stage);
    PD_ASSERT(out->stage);
    double raw_all = 0, wire_all = 0;
    for (int i = 0; i < s->n_stages; i++) {
        RtStageSummary *g = &out->stage[i];
        const SchedStage *st = &s->stages[i];
        double comp = 0, cpu = 0;
        int nf = 0;
        g->replicas = st->replicas;
        g->predicted_ms = NAN;
        /* several stages per rank: this stage's chunk's figures (its position in the rank's list) */
        const SchedWorker *sw0 = &s->workers[st->ranks[0]];
        int ci = 0;
        for (int c = 0; c < sw0->n_chunks; c++)
            if (sw0->stages && sw0->stages[c] == i) ci = c;
        for (int j = 0; j < st->replicas; j++) {
            const RtWorkerResult *r = &res[st->ranks[j]];
            double cs = r->n_chunks > 1 ? r->chunk_compute_s[ci] : r->compute_s;
            comp += cs;
            cpu += r->n_chunks > 1 ? r->chunk_cpu_s[ci] : r->compute_cpu_s;
            nf += r->n_chunks > 1 ? r->chunk_fwd[ci] : r->n_fwd;
            if (r->max_versions > g->versions) g->versions = r->max_versions;
            if (r->delay_max > g->delay_max) g->delay_max = r->delay_max;
            g->delay_mean += r->n_delayed ? (double)r->delay_sum / r->n_delayed / st->replicas : 0;
            g->busy += wall > 0 ? cs / wall / st->replicas : 0;
        }
        g->measured_ms = nf ? 1e3 * comp / nf : 0;
        /* the bytes it sent each way, over its replicas */
        g->wire_act = i + 1 < s->n_stages ? sp->wire_at ? sp->wire_at[2 * i] : sp->wire : -1;
        g->wire_grad = i > 0 ? sp->wire_at ? sp->wire_at[2 * (i - 1) + 1] : sp->wire_grad : -1;
        for (int j = 0; j < st->replicas; j++) {
            const RtWorkerResult *r = &res[st->ranks[j]];
            g->act_wire_bytes += r->chunk_act_wire[ci], g->act_raw_bytes += r->chunk_act_raw[ci];
            g->grad_wire_bytes += r->chunk_grad_wire[ci], g->grad_raw_bytes += r->chunk_grad_raw[ci];
        }
        raw_all += g->act_raw_bytes + g->grad_raw_bytes, wire_all += g->act_wire_bytes + g->grad_wire_bytes;
        /* the thread's CPU clock sees only its own thread: with kernel threads it says nothing */
        g->cpu_ms = nf && cpu > 0 && sp->threads == 1 && s->kind != SCHED_ASP ? 1e3 * cpu / nf : NAN;
        g->weights_crc = res[st->ranks[0]].n_chunks > 1 ? res[st->ranks[0]].chunk_crc[ci] : res[st->ranks[0]].params_crc;
        g->mem = res[st->ranks[0]].mem;
        g->predicted_bytes = g->predicted_activation_bytes = g->predicted_stashed_bytes = g->predicted_scratch_bytes = NAN;
    }
    out->wire_ratio = wire_all > 0 ? raw_all / wire_all : NAN;
    if (s->kind == SCHED_ASP) rt_asp_summarize(res, s->n_ranks, out);
    if (!sp->profile) {
        snprintf(out->predicted_note, sizeof out->predicted_note, "no profile given");
        return;
    }
    SimCosts costs;
    SimResult sr;
    SimOpts so = {.cluster = &sp->plan->cluster, .opt_state_factor = optim_is_adam(sp->opt.kind) ? 2 : 1,
                  .samples_per_unit = unit_batch,
                  .predicts_weights = (sp->staleness & (RT_STALE_PREDICT | RT_STALE_LOOKAHEAD)) != 0,
                  .wire_factor = sp->wire == RT_WIRE_BF16 ? 0.5 : 1.0, .error_feedback = sp->error_feedback};
    int *wire_at = sim_wire_at(sp, s->n_stages);   /* freed below, at the summary's end */
    so.wire_at = wire_at;
    Err e2 = {0};
    if (sim_costs_from_profile(s, sp->profile, &costs, &e2) != PD_OK) {
        snprintf(out->predicted_note, sizeof out->predicted_note, "simulator: %.230s", e2.msg);
        free(wire_at);
        return;
    }
    sim_costs_scale(&costs, sp->profile->minibatch > 0 ? (double)unit_batch / sp->profile->minibatch : 1.0);
    if (sim_run(s, &costs, &so, &sr, &e2) == PD_OK) {
        for (int i = 0; i < costs.n_stages; i++) out->stage[i].predicted_ms = stage_predicted_ms(s, &costs, &sr, i);
        /* measured is wall / units, so the prediction is the simulated run's length over its
         * units: a short pipelined run spends a visible part of its time filling and draining */
        out->predicted_time_per_unit_ms = s->n_units > 0 ? 1e3 * sr.makespan_s / s->n_units : NAN;
        out->predicted_steady_ms = 1e3 * sr.time_per_unit_s;
        if (sp->trace) out->sim_events = sim_events(s, &sr, &out->n_sim_events);
        for (int i = 0; i < s->n_stages; i++) {
            const SimMem *pm = &sr.mem[s->stages[i].ranks[0]];
            out->stage[i].predicted_bytes = pm->allocated;
            out->stage[i].predicted_activation_bytes = pm->alloc_activations;
            out->stage[i].predicted_stashed_bytes = pm->alloc_stashed;
            out->stage[i].predicted_scratch_bytes = pm->scratch;
        }
        sim_result_release(&sr);
        snprintf(out->predicted_note, sizeof out->predicted_note, "same plan and profile");
        if (sp->fit != RT_FIT_NONE) fit_cluster(s, &costs, &so, sp->fit, out);
    } else {
        snprintf(out->predicted_note, sizeof out->predicted_note, "simulator: %.230s", e2.msg);
    }
    free(wire_at);
    sim_costs_release(&costs);
}

void rt_train_summary_release(RtTrainSummary *s) {
    if (!s) return;
    if (s->res)
        for (int r = 0; r < s->workers; r++) rt_result_release(&s->res[r]);
    free(s->res);
    free(s->stage);
    free(s->evals);
    free(s->sim_events);
    memset(s, 0, sizeof *s);
}

