/* rt_run.c: the three ways to run a list: over a Comm (MPI, rt_worker_run), on one thread per
 * rank (rt_run_threads), and the serial emulation (rt_emulate, non-blocking rt_exec with the
 * all-reduces performed here in group rank order); asp's segment goes to rt_asp_exec. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "rt_impl.h"

int rt_worker_segment(Worker *w, RtAspLog *log, Err *err) {
    if (w->stage < 0) return PD_OK;
    int st = w->s->kind == SCHED_ASP ? rt_asp_exec(w, log, err) : rt_exec(w, 1, err);
    if (st == RT_ERR) return err->code ? err->code : PD_ECOMM;
    return rt_worker_drain(w, err);   /* all sends complete before buffers are reused or go away */
}

/* rt_worker_run and rt_asp_worker_run (asp_only: a schedule of another kind is a set-up
 * error, like a plan for another number of ranks). */
static int worker_run(Comm *c, const RtConfig *cfg, RtWorkerResult *res, RtAspLog *log, int asp_only, Err *err) {
    Worker w;
    memset(&w, 0, sizeof w);
    int rank = comm_rank(c);
    if (cfg->threads > 0) kern_set_threads(cfg->threads);   /* per thread for OpenMP: here */
    const Schedule *s = cfg->sched;
    int rc = PD_OK;
    if (asp_only && s->kind != SCHED_ASP)
        rc = err_set(err, PD_EINVAL, "rt_asp_worker_run: the schedule is %s, not asp", sched_kind_name(s->kind));
    else if (comm_size(c) != s->n_ranks)
        rc = err_set(err, PD_EINVAL, "the plan needs %d workers but %d were started", s->n_ranks, comm_size(c));
    else
        rc = rt_worker_init(&w, c, cfg, rank, res, err);
    /* Every rank checks its set-up and all agree before the first message (PRK bail-out). */
    int all = comm_agree(c, rc);
    if (all != PD_OK) {
        if (w.cfg) rt_worker_release(&w);
        if (rc) return rc;
        return err_set(err, PD_ECOMM, "rank %d: another rank failed to set up (see its message)", rank);
    }
    rc = rt_worker_group(&w, err);
    w.t_start = pd_now();
    if (!rc) rc = rt_worker_segment(&w, log, err);
    if (!rc) rt_worker_finish(&w);
    if (!rc && cfg->test) rc = rt_eval(&w, err);
    rt_worker_release(&w);
    return rc;
}

int rt_worker_run(Comm *c, const RtConfig *cfg, RtWorkerResult *res, Err *err) {
    return worker_run(c, cfg, res, NULL, 0, err);
}

int rt_asp_worker_run(Comm *c, const RtConfig *cfg, RtWorkerResult *res, RtAspLog *log, Err *err) {
    return worker_run(c, cfg, res, log, 1, err);
}

int rt_first_failure(int rc, const int *rcs, const Err *errs, int n, Err *err) {
    int pick = -1;
    for (int r = 0; r < n && pick < 0; r++)
        if (rcs[r] && rcs[r] != PD_ECOMM) pick = r;
    for (int r = 0; r < n && pick < 0; r++)
        if (rcs[r]) pick = r;
    if (pick < 0) return rc;
    *err = errs[pick];
    return rcs[pick];
}

typedef struct ThreadArg {
    const RtConfig *cfg;
    RtWorkerResult *res;
    RtAspLog *logs;   /* NULL, or one per rank */
    int asp_only;
    Err *errs;
} ThreadArg;

static int thread_main(Comm *c, int rank, void *arg) {
    ThreadArg *a = arg;
    return worker_run(c, a->cfg, &a->res[rank], a->logs ? &a->logs[rank] : NULL, a->asp_only, &a->errs[rank]);
}

/* rt_run_threads and rt_asp_run_threads: worker_run on one thread per rank. */
static int run_threads(const RtConfig *cfg, RtWorkerResult *res, RtAspLog *logs, int asp_only, Err *err) {
    int n = cfg->sched->n_ranks;
    Err *errs = calloc((size_t)n, sizeof(Err));
    int *rcs = calloc((size_t)n, sizeof(int));
    PD_ASSERT(errs && rcs);
    ThreadArg a = {cfg, res, logs, asp_only, errs};
    int rc = comm_threads_run(n, thread_main, &a, rcs, err);
    if (rc) rc = rt_first_failure(rc, rcs, errs, n, err);
    free(errs);
    free(rcs);
    return rc;
}

int rt_run_threads(const RtConfig *cfg, RtWorkerResult *res, Err *err) { return run_threads(cfg, res, NULL, 0, err); }

int rt_asp_run_threads(const RtConfig *cfg, RtWorkerResult *res, RtAspLog *logs, Err *err) {
    return run_threads(cfg, res, logs, 1, err);
}

int rt_emulate(const RtConfig *cfg, RtWorkerResult *res, Err *err) {
    const Schedule *s = cfg->sched;
    int n = s->n_ranks, rc = PD_OK;
    if (s->kind == SCHED_ASP)   /* its owners apply pushes as they arrive: no serial order to emulate */
        return err_set(err, PD_EINVAL, "rt_emulate: asp is not emulated (rt_asp_run_threads runs it)");
    if (cfg->opt.clip_norm > 0.0f)   /* its all-reduce over every rank is not emulated */
        return err_set(err, PD_EINVAL, "rt_emulate: gradient clipping is not emulated (rt_run_threads runs it)");
    if (cfg->threads > 0) kern_set_threads(cfg->threads);
    Comm **eps = calloc((size_t)n, sizeof(Comm *));
    Worker *ws = calloc((size_t)n, sizeof(Worker));
    int *state = calloc((size_t)n, sizeof(int));
    PD_ASSERT(eps && ws && state);
    if ((rc = comm_threads_create(n, eps, err))) goto out;
    for (int r = 0; r < n && !rc; r++) rc = rt_worker_init(&ws[r], eps[r], cfg, r, &res[r], err);
    if (rc) goto out;
    for (int r = 0; r < n; r++) state[r] = ws[r].stage < 0 ? RT_DONE : RT_BLOCKED;
    const float **parts = malloc((size_t)n * sizeof(float *));
    PD_ASSERT(parts);
    for (;;) {
        int progress = 0, pending = 0;
        for (int r = 0; r < n; r++) {
            if (state[r] == RT_DONE) continue;
            int pc0 = ws[r].pc;
            state[r] = rt_exec(&ws[r], 0, err);
            if (state[r] == RT_ERR) {
                rc = err->code ? err->code : PD_ECOMM;
                goto out_parts;
            }
            if (ws[r].pc != pc0) progress = 1;
            if (state[r] != RT_DONE) pending = 1;
        }
        /* All-reduces whose whole group has arrived: sum in group rank order. A rank at an
         * all-reduce is at the one of the stage its instruction names (its chunk's, interleaved). */
        for (int st = 0; st < s->n_stages; st++) {
            const SchedStage *ss = &s->stages[st];
            int ready = ss->replicas > 1;
            for (int j = 0; j < ss->replicas && ready; j++) {
                const Worker *wj = &ws[ss->ranks[j]];
                ready = state[ss->ranks[j]] == RT_AT_AR && wj->sw->ins[wj->pc].peer == st;
            }
            if (!ready) continue;
            const int c = ws[ss->ranks[0]].sw->ins[ws[ss->ranks[0]].pc].chunk;
            Worker *x0 = rt_chunk(&ws[ss->ranks[0]], c);
            for (int b = 0; b < x0->n_buckets; b++) {   /* bucket by bucket, as the transports do */
                for (int j = 0; j < ss->replicas; j++) parts[j] = rt_chunk(&ws[ss->ranks[j]], c)->dw + x0->bk_lo[b];
                comm_sum_serial(parts, ss->replicas, x0->bk_n[b], rt_allreduce_op(s), x0->dw + x0->bk_lo[b]);
            }
            for (int j = 0; j < ss->replicas; j++) {
                Worker *wj = &ws[ss->ranks[j]], *xj = rt_chunk(wj, c);
                if (j) memcpy(xj->dw, x0->dw, xj->np * sizeof(float));
                for (int k = 0; k < wj->n_chunk; k++) rt_vstore_collect(rt_chunk(wj, k), wj->pc);
                wj->pc++;
                state[wj->rank] = RT_BLOCKED;
            }
            progress = 1;
        }
        if (!pending) break;
        if (!progress) {
            char msg[400];
            size_t k = 0;
            for (int r = 0; r < n && k < sizeof msg - 40; r++)
                if (state[r] != RT_DONE) {
                    char t[48];
                    k += (size_t)snprintf(msg + k, sizeof msg - k, " rank %d at %s;", r,
                                          sched_instr_str(&ws[r].sw->ins[ws[r].pc], 0, t, sizeof t));
                }
            rc = err_set(err, PD_EINVAL, "emulation: deadlock:%s", msg);
            goto out_parts;
        }
    }
    for (int r = 0; r < n; r++) rt_worker_finish(&ws[r]);
out_parts:
    free(parts);
out:
    for (int r = 0; r < n; r++)
        if (ws[r].cfg) rt_worker_release(&ws[r]);
    for (int r = 0; r < n; r++) comm_free(eps[r]);
    free(eps);
    free(ws);
    free(state);
    return rc;
}

