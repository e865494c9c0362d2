/* rt_session.c: a whole training run (runtime.h, "training sessions"). session_rank runs one
 * rank's part over a Comm; rt_train calls it once (MPI: this process's rank) or on one thread
 * per worker (threads transport); one-worker training is a session of one stage on one
 * worker. Everything ranks tell each other goes over comm's typed control plane, every wait
 * bounded by the spec's timeout. A rank's run, one function each:
 *
 *   setup     model (parsed once), plan check, data, checkpoint directory, resume file:
 *             agreed; a failure anywhere is every rank's error, naming the failing rank; then
 *             the training set's size and input statistics from the first input rank
 *   workers   each rank's starting state (resume slicing: rt_stage_state_slice), the worker
 *             built once for the first segment, rebound (rt_worker_bind) for the others
 *   segments  run (rt_segment_end says where each ends); drain; checkpoint: gather replica 0
 *             of every stage on rank 0, write, agree on the result before anyone calls it the
 *             last checkpoint, prune (--keep-last); evaluation and target accuracy
 *   finish    the final weights (--save), the final evaluation
 *   results   every worker's figures gathered on rank 0 (rt_result_pack/unpack, rt_result.c);
 *             the summary (rt_summarize, rt_report.c)
 *
 * During a segment a failing rank ends the job with comm_abort (nobody waits for a rank that
 * may be dead or stuck). The parts tests call alone, and those in files of their own, are
 * declared in rt_session.h. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "kernels.h"
#include "rt_impl.h"
#include "rt_session.h"
#include "sim.h"

typedef struct Sess {
    const RtTrainSpec *spec;     /* its plan given (rt_train makes one-worker training's) */
    const char *model_text;      /* the model JSON, read once */
    int n_ranks;
    RtTrainSummary *out;         /* filled by rank 0 */
    Err *errs;                   /* threads: per rank */
} Sess;

/* One rank's state. */
typedef struct Rank {
    const Sess *S;
    const RtTrainSpec *sp;
    Comm *c;
    int rank, stage, reads_input, first_input;
    double timeout;
    Schedule probe;              /* one minibatch of the plan's schedule: stages, ranks, n_micro */
    Model *m;
    DataSplits data;             /* what this rank read (unless the spec gives the data) */
    const Dataset *train, *test; /* what the session uses: data's, the spec's, or NULL */
    double data_mean, data_std;  /* the input statistics applied (NAN: none) */
    int64_t n_train;             /* training samples (from the first input rank) */
    int unit_batch;
    long n_mb;                   /* minibatches of the whole run */
    uint64_t mb_done;            /* minibatches done before the current segment */
    uint64_t resumed;            /* ... by the checkpoint resumed from */
    RtCkpt ck;                   /* resume / init: whole-model buffers (all ranks); rank 0: checkpoint assembly */
    int have_ck;
    int ck_partner;              /* the rank that keeps a second copy of each checkpoint (-1: none) */
    char last_ckpt[4096];
    RtWorkerResult acc;          /* this worker's totals over segments */
    double t0;                   /* session start */
    double train_s, cpu_s;       /* training seconds (wall, this process's CPU) */
    /* the worker */
    Worker w;
    int built;
    RtWorkerResult segres;
    double seg_fig[RT_SEG_FIGS]; /* the last segment's: stage, compute, wait, wall s, bytes sent, units */
    RtConfig cfg;
    Schedule seg;
    RtStageState *init;          /* per rank; this rank's entry set */
    int own_init;                /* init[rank]'s buffers were made here (a rank with several chunks) */
    /* evaluations */
    RtEvalLog ev;
    int64_t eval_batches, run_units;
    uint64_t target_mb;
    double target_s;
} Rank;

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void ck_alloc(const Model *m, int adam, RtCkpt *c) {
    int nl = model_n_layers(m);
    size_t np = model_param_count(m, 0, nl), ns = model_state_count(m, 0, nl);
    c->params = pd_alloc_f32(np ? np : 1);
    c->opt_m = pd_alloc_f32(np ? np : 1);
    c->opt_v = adam ? pd_alloc_f32(np ? np : 1) : NULL;
    c->state = pd_alloc_f32(ns ? ns : 1);
    c->data_mean = c->data_std = NAN;
}

static void ck_free(RtCkpt *c) {
    pd_free(c->params), pd_free(c->opt_m), pd_free(c->opt_v), pd_free(c->state);
    memset(c, 0, sizeof *c);
}

/* Every rank learns whether any rank failed; if one did, every rank returns that rank's error
 * (the lowest failing rank's message, broadcast). */
static int agree(Rank *R, int rc, Err *err) {
    int who = -1;
    Err e2 = {0};
    int all = comm_agree_t(R->c, rc, R->timeout, &who, &e2);
    if (all == PD_OK) return PD_OK;
    if (e2.code || who < 0) {   /* the agreement itself failed (a late or lost rank, named in e2) */
        if (!rc) *err = e2;
        return rc ? rc : all;
    }
    char msg[sizeof err->msg];
    memset(msg, 0, sizeof msg);
    if (R->rank == who) memcpy(msg, err->msg, sizeof msg);
    int brc = comm_bcast(R->c, who, msg, sizeof msg, R->timeout, &e2);
    msg[sizeof msg - 1] = 0;
    if (R->rank != who) {
        if (brc) *err = e2;
        else err_set(err, all, "%s", msg);
    }
    return all;
}

static int plan_ranks(const RtTrainSpec *sp, Schedule *probe, Err *err) {
    SchedOpts so = {.kind = sp->kind, .n_minibatches = 1, .n_micro = sp->n_micro > 0 ? sp->n_micro : 1,
                    .recompute = sp->recompute, .inflight = sp->inflight};
    return sched_build(sp->plan, &so, probe, err);
}

/* mkdir -p */
static int make_dirs(const char *dir, Err *err) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return err_set(err, PD_EINVAL, "%s: path too long", dir);
    for (char *q = p + 1;; q++) {
        int end = *q == 0;
        if (*q == '/' || end) {
            *q = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return err_set(err, PD_EIO, "cannot create the checkpoint directory %s: %s", p, strerror(errno));
            if (end) break;
            *q = '/';
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return err_set(err, PD_EIO, "the checkpoint directory %s is not a directory", dir);
    return PD_OK;
}

/* The checkpoint directory exists (created) and takes a file. */
static int check_ckpt_dir(const char *dir, Err *err) {
    int rc = make_dirs(dir, err);
    if (rc) return rc;
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.pipedream-write-test.%ld", dir, (long)getpid());
    FILE *f = fopen(probe, "wb");
    if (!f) return err_set(err, PD_EIO, "the checkpoint directory %s is not writable: %s", dir, strerror(errno));
    int bad = fwrite("ok", 1, 2, f) != 2;
    bad |= fclose(f) != 0;
    unlink(probe);
    if (bad) return err_set(err, PD_EIO, "cannot write into the checkpoint directory %s", dir);
    return PD_OK;
}

/* ---- set-up ----------------------------------------------------------------------------------- */

/* Set-up of one rank before anything is agreed: model, plan, data, checkpoint directory,
 * resume file. */
static int setup_local(Rank *R, Err *err) {
    const RtTrainSpec *sp = R->sp;
    const Schedule *probe = &R->probe;
    int rc;
    if (!(R->m = model_parse(R->S->model_text, sp->model_path, err))) return err->code ? err->code : PD_EINVAL;
    int nl = model_n_layers(R->m);
    if (sp->plan->n_layers != nl)
        return err_set(err, PD_EINVAL, "the plan was made for a model of %d layers; %s has %d", sp->plan->n_layers,
                       sp->model_path, nl);
    if ((rc = plan_validate(sp->plan, nl, err))) return rc;
    if (comm_size(R->c) != probe->n_ranks)
        return err_set(err, PD_EINVAL, "the plan needs %d workers but %d were started", probe->n_ranks,
                       comm_size(R->c));
    if (sp->train) {   /* the data given: as it is */
        R->train = R->reads_input ? sp->train : NULL;
        R->test = sp->test;
    } else {
        DataFit fit = {model_name(R->m), model_input_shape(R->m), model_layer_out_shape(R->m, nl - 1)};
        if ((rc = data_splits_open(sp->data_dir, sp->text, &fit, R->reads_input, &R->data, err))) return rc;
        R->train = R->reads_input ? &R->data.train : NULL;
        R->test = &R->data.test;
    }
    if (sp->checkpoint_dir && (rc = check_ckpt_dir(sp->checkpoint_dir, err))) return rc;
    if (sp->resume) {
        char path[4096];
        if ((rc = ckpt_latest(sp->resume, path, sizeof path, err))) return rc;
        if (!path[0])
            return err_set(err, PD_EINVAL, "%s: no complete checkpoint to resume from (see the warnings above, if any)",
                           sp->resume);
        ck_alloc(R->m, optim_is_adam(sp->opt.kind), &R->ck);
        R->ck.opt.kind = sp->opt.kind;   /* tells rt_ckpt_load adam from adamw */
        R->have_ck = 1;
        if ((rc = rt_ckpt_load(path, R->m, &R->ck, err))) return rc;
        if (R->ck.seed != sp->seed)
            return err_set(err, PD_EINVAL, "%s: taken with --seed %llu, this run has --seed %llu", path,
                           (unsigned long long)R->ck.seed, (unsigned long long)sp->seed);
        int per = probe->n_micro;
        if (R->ck.units_done % (uint64_t)per)
            return err_set(err, PD_EINVAL, "%s: %llu units done is not a whole number of %d-unit minibatches", path,
                           (unsigned long long)R->ck.units_done, per);
        R->mb_done = R->ck.units_done / (uint64_t)per;
        snprintf(R->last_ckpt, sizeof R->last_ckpt, "%s", path);
    } else if (sp->init_weights) {   /* given weights, a fresh optimizer (zero moments, step 0) */
        ck_alloc(R->m, optim_is_adam(sp->opt.kind), &R->ck);
        R->have_ck = 1;
        if ((rc = rt_weights_load(sp->init_weights, R->m, &R->ck, err))) return rc;
    }
    return PD_OK;
}

/* Every rank's set-up, agreed; then the training set's size and the input statistics from the
 * first input rank (its training split's, or those of the checkpoint resumed from), the data
 * standardised with them, and the run's length. */
static int session_setup(Rank *R, Err *err) {
    const RtTrainSpec *sp = R->sp;
    int rank = R->rank, rc = plan_ranks(sp, &R->probe, err);   /* the same on every rank: no agreement needed */
    if (rc) return rc;
    const Schedule *probe = &R->probe;
    if (sp->opt.clip_norm > 0.0f) {   /* clipping needs undelayed units: seen in a list long enough to show delays */
        Schedule chk;
        SchedOpts so = {.kind = sp->kind, .n_minibatches = 4 * probe->n_ranks + 4, .n_micro = probe->n_micro,
                        .vertical_sync = sp->vertical_sync, .recompute = sp->recompute, .inflight = sp->inflight};
        if ((rc = sched_build(sp->plan, &so, &chk, err))) return rc;
        rc = rt_clip_allowed(&chk, err);
        sched_release(&chk);
        if (rc) return rc;
    }
    comm_set_coll_timeout(R->c, sp->timeout_s);
    R->stage = rank < probe->n_ranks ? probe->workers[rank].stage : -1;
    R->reads_input = R->stage == 0;
    R->first_input = probe->stages[0].ranks[0];
    for (int j = 1; j < probe->stages[0].replicas; j++)
        if (probe->stages[0].ranks[j] < R->first_input) R->first_input = probe->stages[0].ranks[j];
    if (sp->resume && (rc = rt_ckpt_fetch_newest(R->c, sp->resume, R->timeout, err))) return rc;
    rc = setup_local(R, err);
    if (rc) err_prefix(err, "rank %d (stage %d)", rank, R->stage);
    if ((rc = agree(R, rc, err))) return rc;
    R->ck_partner = -1;
    if (sp->checkpoint_dir && (rc = agree(R, rt_ckpt_partner(R->c, sp->checkpoint_dir, R->timeout, &R->ck_partner, err), err)))
        return rc;
    union {
        int64_t i;
        double d;
    } v[3] = {{.i = R->train ? (int64_t)R->train->n : 0}, {.d = R->data.mean}, {.d = R->data.std}};
    if (R->have_ck && sp->resume && isfinite(R->ck.data_mean)) v[1].d = R->ck.data_mean, v[2].d = R->ck.data_std;
    if ((rc = comm_bcast(R->c, R->first_input, v, sizeof v, R->timeout, err))) return rc;
    R->n_train = v[0].i;
    R->data_mean = R->data_std = NAN;
    if (!sp->train && !R->data.text) {
        rc = data_splits_standardise(&R->data, v[1].d, v[2].d, err);
        if (rc) err_prefix(err, "rank %d (stage %d)", rank, R->stage);
        if ((rc = agree(R, rc, err))) return rc;
        R->data_mean = v[1].d, R->data_std = v[2].d;
    }
    R->unit_batch = sp->minibatch / probe->n_micro;
    long n_mb = sp->steps ? sp->steps : (long)sp->epochs * (long)(R->n_train / R->unit_batch) / probe->n_micro;
    if (n_mb < 1) n_mb = 1;
    if (n_mb > 1000000000L) n_mb = 1000000000L;
    R->n_mb = n_mb;
    if (R->mb_done > (uint64_t)n_mb)
        return err_set(err, PD_EINVAL, "rank %d: %s is %llu minibatches in, beyond this run's %ld", rank, R->last_ckpt,
                       (unsigned long long)R->mb_done, n_mb);
    R->resumed = R->mb_done;
    if (R->mb_done && rank == 0) {
        fprintf(stderr, "pipedream: resuming from %s (%llu of %ld minibatches done)\n", R->last_ckpt,
                (unsigned long long)R->mb_done, n_mb);
        char was[256], now[256];
        if (rt_ckpt_opt_changes(&R->ck.opt, &sp->opt, was, now, sizeof was))
            pd_log(LOG_WARN, "%s was taken with %s; this run has %s", R->last_ckpt, was, now);
    }
    if (rank == 0)
        fprintf(stderr, "pipedream: training %s with %s on %d workers (%s), %ld minibatches of %d samples\n",
                sp->model_path, sched_kind_name(sp->kind), probe->n_ranks, comm_name(R->c), n_mb, sp->minibatch);
    return PD_OK;
}

/* ---- workers ---------------------------------------------------------------------------------- */

int rt_stage_state_slice(const Model *m, const Schedule *s, int rank, const RtCkpt *c, RtStageState *out) {
    memset(out, 0, sizeof *out);
    const SchedWorker *pw = rank < s->n_ranks ? &s->workers[rank] : NULL;
    if (!pw || pw->stage < 0) return 0;
    if (pw->n_chunks <= 1) {
        int first = s->stages[pw->stage].layers[0];
        size_t po = model_param_offset(m, first), so = model_state_offset(m, first);
        *out = (RtStageState){c->params + po, c->state + so, c->opt_m + po, c->opt_v ? c->opt_v + po : NULL, c->opt_step};
        return 0;
    }
    size_t np = 0, ns = 0;   /* its chunks' ranges, concatenated */
    for (int k = 0; k < pw->n_chunks; k++) {
        const SchedStage *st = &s->stages[pw->stages[k]];
        int first = st->layers[0], last = st->layers[st->n_layers - 1] + 1;
        np += model_param_count(m, first, last), ns += model_state_count(m, first, last);
    }
    out->params = pd_alloc_f32(np ? np : 1), out->opt_m = pd_alloc_f32(np ? np : 1);
    out->state = pd_alloc_f32(ns ? ns : 1);
    out->opt_v = c->opt_v ? pd_alloc_f32(np ? np : 1) : NULL;
    out->opt_step = c->opt_step;
    size_t po = 0, so = 0;
    for (int k = 0; k < pw->n_chunks; k++) {
        const SchedStage *st = &s->stages[pw->stages[k]];
        int first = st->layers[0], last = st->layers[st->n_layers - 1] + 1;
        size_t n = model_param_count(m, first, last), q = model_state_count(m, first, last);
        size_t o = model_param_offset(m, first), r = model_state_offset(m, first);
        memcpy(out->params + po, c->params + o, n * sizeof(float));
        memcpy(out->opt_m + po, c->opt_m + o, n * sizeof(float));
        if (out->opt_v) memcpy(out->opt_v + po, c->opt_v + o, n * sizeof(float));
        memcpy(out->state + so, c->state + r, q * sizeof(float));
        po += n, so += q;
    }
    return 1;
}

void rt_stage_state_free(RtStageState *st) {
    pd_free(st->params), pd_free(st->opt_m), pd_free(st->opt_v), pd_free(st->state);
    memset(st, 0, sizeof *st);
}

/* Each rank's starting state, the workers' configuration, the failure handler. */
static int session_workers(Rank *R, Err *err) {
    const RtTrainSpec *sp = R->sp;
    const Schedule *probe = &R->probe;
    R->init = calloc((size_t)probe->n_ranks, sizeof *R->init);
    PD_ASSERT(R->init);
    if (R->have_ck) R->own_init = rt_stage_state_slice(R->m, probe, R->rank, &R->ck, &R->init[R->rank]);
    R->cfg = (RtConfig){.model_path = sp->model_path, .model = R->m, .unit_batch = R->unit_batch, .opt = sp->opt,
                        .seed = sp->seed, .train = R->train, .test = NULL, .recv_timeout_s = sp->timeout_s,
                        .trace = sp->trace, .threads = sp->threads, .progress = sp->progress,
                        .units_total = (int)(R->n_mb * probe->n_micro), .progress_t0 = pd_now(),
                        .progress_u0 = R->mb_done * (uint64_t)probe->n_micro, .init = R->init,
                        .nan_check = sp->nan_check, .no_stash = sp->no_stash, .staleness = sp->staleness,
                        .staleness_warmup = sp->staleness_warmup, .run_minibatches = R->n_mb, .wire = sp->wire,
                        .wire_grad = sp->wire_grad, .error_feedback = sp->error_feedback, .train_n = R->n_train,
                        .wire_at = sp->wire_at,
                        .precision = sp->precision};
    if (sp->threads > 0) kern_set_threads(sp->threads);
    R->eval_batches = R->test ? (int64_t)((R->test->n + (size_t)R->unit_batch - 1) / (size_t)R->unit_batch) : 0;
    R->run_units = (int64_t)R->n_mb * probe->n_micro;   /* evaluation ids start after them */
    int rc = rt_fail_setup(R->c, probe, R->timeout, err);
    if (rc) return rc;
    rt_fail_set_checkpoint(R->last_ckpt[0] ? R->last_ckpt : "none");
    return PD_OK;
}

/* ---- checkpoints ------------------------------------------------------------------------------ */

/* Replica 0 of every stage sends [opt_step (int64) | params | opt_m | opt_v (Adam) | state] of
 * its newest weights to rank 0 (others send nothing); rank 0 places them by layer into R->ck.
 * Collective over every rank. */
static int gather_state(Rank *R, Worker *w, const Schedule *s, Err *err) {
    int adam = optim_is_adam(R->sp->opt.kind), rc = PD_OK;
    size_t nbytes = 0;
    char *mine = NULL;
    if (w->stage >= 0 && w->sw->replica == 0) {   /* one record per stage (chunk), in chunk order */
        for (int c = 0; c < w->n_chunk; c++) {
            const Worker *x = rt_chunk(w, c);
            nbytes += sizeof(int64_t) + (x->np * (adam ? 3 : 2) + x->nst) * sizeof(float);
        }
        mine = malloc(nbytes);
        PD_ASSERT(mine);
        char *p = mine;
        for (int c = 0; c < w->n_chunk; c++) {
            const Worker *x = rt_chunk(w, c);
            size_t np = x->np, ns = x->nst;
            int64_t step = x->opt.step;
            memcpy(p, &step, sizeof step), p += sizeof step;
            for (int k = 0; k < x->n_vslots; k++)
                if (x->vver[k] == x->newest) memcpy(p, x->vbuf[k], np * sizeof(float));
            p += np * sizeof(float);
            if (np) memcpy(p, x->opt.m, np * sizeof(float));
            p += np * sizeof(float);
            if (adam) {
                if (np) memcpy(p, x->opt.v, np * sizeof(float));
                p += np * sizeof(float);
            }
            if (ns) memcpy(p, x->state, ns * sizeof(float));
            p += ns * sizeof(float);
        }
    }
    void **parts = NULL;
    size_t *sizes = NULL;
    rc = comm_gather(R->c, 0, mine, nbytes, &parts, &sizes, R->timeout, err);
    free(mine);
    if (rc || R->rank != 0) return rc;   /* rc: the control plane failed (a peer gone or stuck, named in err) */
    if (!R->have_ck) {
        ck_alloc(R->m, adam, &R->ck);
        R->have_ck = 1;
    }
    RtCkpt *c = &R->ck;
    /* a rank's records are its stages in ascending order (its chunks): read them in stage order */
    size_t *at = calloc((size_t)comm_size(R->c), sizeof(size_t));
    PD_ASSERT(at);
    c->opt_step = 0;
    for (int i = 0; i < s->n_stages && !rc; i++) {
        int r0 = s->stages[i].ranks[0];
        int first = s->stages[i].layers[0], last = s->stages[i].layers[s->stages[i].n_layers - 1] + 1;
        size_t po = model_param_offset(R->m, first), so = model_state_offset(R->m, first);
        size_t np = model_param_count(R->m, first, last), ns = model_state_count(R->m, first, last);
        size_t want = sizeof(int64_t) + (np * (adam ? 3 : 2) + ns) * sizeof(float);
        if (sizes[r0] < at[r0] + want) {
            rc = err_set(err, PD_ECOMM, "checkpoint: rank %d sent %zu bytes, too few for stage %d (%zu more)", r0,
                         sizes[r0], i, want);
            break;
        }
        const char *p = (const char *)parts[r0] + at[r0];
        at[r0] += want;
        int64_t step;
        memcpy(&step, p, sizeof step), p += sizeof step;
        if ((long)step > c->opt_step) c->opt_step = (long)step;   /* a stage without parameters never steps */
        memcpy(c->params + po, p, np * sizeof(float)), p += np * sizeof(float);
        memcpy(c->opt_m + po, p, np * sizeof(float)), p += np * sizeof(float);
        if (adam) memcpy(c->opt_v + po, p, np * sizeof(float)), p += np * sizeof(float);
        memcpy(c->state + so, p, ns * sizeof(float));
    }
    for (int r = 0; r < comm_size(R->c) && !rc; r++)
        if (at[r] != sizes[r])
            rc = err_set(err, PD_ECOMM, "checkpoint: rank %d sent %zu bytes, its stages make %zu", r, sizes[r], at[r]);
    free(at);
    comm_parts_free(parts, sizes, comm_size(R->c));
    return rc;
}

/* The checkpoint after R->mb_done minibatches: rank 0 gathers and writes it, the other ranks
 * name it; every rank agrees on the outcome before anyone calls it the last checkpoint; then
 * rank 0 prunes the older ones (--keep-last). */
static int checkpoint(Rank *R, Worker *w, const Schedule *s, Err *err) {
    const RtTrainSpec *sp = R->sp;
    char path[4096];
    int rc = gather_state(R, w, s, err);
    if (rc) return rc;   /* the control plane failed: a peer is gone or stuck (named in err) */
    if (R->rank == 0) {
        RtCkpt *c = &R->ck;
        c->minibatches_done = R->mb_done;
        c->units_done = R->mb_done * (uint64_t)s->n_micro;
        c->seed = sp->seed;
        c->opt = sp->opt;
        c->data_mean = R->data_mean, c->data_std = R->data_std;
        snprintf(c->schedule, sizeof c->schedule, "%s", sched_kind_name(s->kind));
        rc = rt_ckpt_save(sp->checkpoint_dir, R->m, c, path, sizeof path, err);
    } else {
        rc = rt_ckpt_path(sp->checkpoint_dir, R->mb_done, path, sizeof path, err);
    }
    if (rc) err_prefix(err, "rank %d (stage %d): checkpoint after minibatch %llu", R->rank, R->stage,
                       (unsigned long long)R->mb_done);
    /* nobody calls it the last checkpoint before everyone knows it was written, twice */
    if ((rc = agree(R, rc, err))) return rc;
    if ((rc = agree(R, rt_ckpt_replicate(R->c, R->ck_partner, path, R->timeout, err), err))) return rc;
    snprintf(R->last_ckpt, sizeof R->last_ckpt, "%s", path);
    rt_fail_set_checkpoint(R->last_ckpt);
    if (R->rank == 0) fprintf(stderr, "pipedream: checkpoint %s\n", R->last_ckpt);
    if (R->rank == 0 || R->rank == R->ck_partner) {
        Err e2 = {0};
        if (sp->keep_last > 0 && ckpt_prune(sp->checkpoint_dir, sp->keep_last, R->mb_done, &e2) < 0)
            pd_log(LOG_WARN, "--keep-last: %s", e2.msg);
    }
    return PD_OK;
}

/* ---- evaluation ------------------------------------------------------------------------------- */

const RtEvalPoint *rt_eval_log_add(RtEvalLog *log, uint64_t minibatches, int minibatch, int64_t n_train,
                                   double train_s, const int64_t ct[2], double loss_sum) {
    int64_t n = ct[1];
    log->ct[0] = ct[0], log->ct[1] = ct[1], log->loss_sum = loss_sum;
    RtEvalPoint pt = {minibatches, (double)minibatches * minibatch / (double)(n_train ? n_train : 1), train_s,
                      n ? (double)ct[0] / (double)n : NAN, n ? loss_sum / (double)n : NAN};
    log->pts = realloc(log->pts, (size_t)(log->n + 1) * sizeof *log->pts);
    PD_ASSERT(log->pts);
    log->pts[log->n] = pt;
    return &log->pts[log->n++];
}

int rt_target_reached(double target, const RtEvalPoint *pt) { return target > 0 && pt->test_accuracy >= target; }

void rt_eval_log_release(RtEvalLog *log) {
    free(log->pts);
    memset(log, 0, sizeof *log);
}

/* Evaluates the newest weights (replica 0 of every stage) after R->mb_done minibatches, every
 * rank learning the result from the last stage's first replica, and logs the point; every
 * evaluation gets its own message ids after the run's units (eval_batches each). A rank that
 * finished its part (or has none: a replica) waits for the result while the stages after it
 * finish theirs: that wait is allowed, on top of the deadline, twice the longer of the rank's
 * own part and the test set at training's pace (on a loaded machine the last stage may take
 * several seconds more, which a short --timeout alone would call a lost peer). */
static int evaluate(Rank *R, Worker *w, const Schedule *s, const RtEvalPoint **pt, Err *err) {
    RtWorkerResult tmp = {0};
    RtWorkerResult *keep = w->res;
    RtConfig *cfg = &R->cfg;
    w->res = &tmp;
    cfg->test = R->test;
    cfg->eval_base = R->run_units + (int64_t)R->ev.n * R->eval_batches;
    w->cfg = cfg;
    double t_eval = pd_now();
    int rc = rt_eval(w, err);
    t_eval = pd_now() - t_eval;
    cfg->test = NULL;
    cfg->eval_base = 0;
    w->res = keep;
    if (rc) return rc;
    int last = s->stages[s->n_stages - 1].ranks[0];
    union {
        int64_t i[2];
        double d[2];
    } v[2];
    v[0].i[0] = tmp.test_correct, v[0].i[1] = tmp.test_total;
    v[1].d[0] = tmp.test_loss_sum, v[1].d[1] = 0;
    /* what the evaluation may take: this rank's own part, or the test set at the pace training
     * has had so far (a replica that evaluates nothing waits out the whole evaluation) */
    double trained = (double)(R->mb_done - R->resumed) * R->sp->minibatch;
    double pace = trained > 0 && R->train_s > 0 ? R->train_s / trained * (double)R->test->n : 0;
    if ((rc = comm_bcast(R->c, last, v, sizeof v, R->timeout + 2 * (t_eval > pace ? t_eval : pace), err))) return rc;
    *pt = rt_eval_log_add(&R->ev, R->mb_done, R->sp->minibatch, R->n_train, R->train_s, v[0].i, v[1].d[0]);
    return PD_OK;
}

/* ---- segments --------------------------------------------------------------------------------- */

uint64_t rt_segment_end(uint64_t done, uint64_t total, int checkpoint_every, int eval_every) {
    uint64_t end = total;
    int every[2] = {checkpoint_every, eval_every};
    for (int i = 0; i < 2; i++)
        if (every[i] > 0) {
            uint64_t k = (uint64_t)every[i], e = (done / k + 1) * k;
            if (e < end) end = e;
        }
    return end;
}

/* Ends err's message with the checkpoint to resume from (once). */
static void name_last_ckpt(const Rank *R, int rc, Err *err) {
    if (strstr(err->msg, "last checkpoint to resume from")) return;
    char msg[1100];
    snprintf(msg, sizeof msg, "%.400s; last checkpoint to resume from: %.600s", err->msg,
             R->last_ckpt[0] ? R->last_ckpt : "none");
    err_set(err, rc, "%s", msg);
}

/* A failure during a segment, or a peer lost or stuck anywhere (PD_ECOMM: a wait passed its
 * deadline, in a segment or in the control plane between them): the rank ends the job, naming
 * itself and the last checkpoint. Returning instead would leave MPI_Finalize waiting for that
 * peer forever. */
static int fail_segment(Rank *R, int rc, Err *err) {
    if (!strstr(err->msg, "(stage ")) err_prefix(err, "rank %d (stage %d)", R->rank, R->stage);
    name_last_ckpt(R, rc, err);
    comm_abort(R->c, rc, err->msg);   /* MPI: does not return */
    return rc;
}

/* The worker, on the schedule in R->seg, built once: its stage's state (the checkpoint's, the
 * --init weights' or fresh), its replicas' group. */
static int build_worker(Rank *R, Err *err) {
    Worker *w = &R->w;
    int rc = rt_worker_init(w, R->c, &R->cfg, R->rank, &R->segres, err);
    if (rc) err_prefix(err, "rank %d (stage %d)", R->rank, R->stage);
    if ((rc = agree(R, rc, err))) return rc;
    if ((rc = rt_worker_replica_groups(w, err))) return rc;
    if ((rc = rt_worker_clip_group(w, err))) return rc;
    R->built = 1;
    w->t_start = pd_now();
    return PD_OK;
}

/* The schedule of the next LEN minibatches from R->mb_done, in R->seg and the worker's config. */
static int segment_schedule(Rank *R, int len, Err *err) {
    const RtTrainSpec *sp = R->sp;
    SchedOpts so = {.kind = sp->kind, .n_minibatches = len, .n_micro = R->probe.n_micro,
                    .vertical_sync = sp->vertical_sync, .recompute = sp->recompute, .inflight = sp->inflight};
    sched_release(&R->seg);
    int rc = sched_build(sp->plan, &so, &R->seg, err);
    if (rc) return rc;
    R->cfg.sched = &R->seg;
    R->cfg.unit_base = R->mb_done * (uint64_t)R->seg.n_micro;
    return PD_OK;
}

/* One segment, minibatches [R->mb_done, end): built (the first) or rebound, run, drained, its
 * figures added to the worker's totals. */
static int run_segment(Rank *R, uint64_t end, Err *err) {
    Worker *w = &R->w;
    int rc;
    if ((rc = segment_schedule(R, (int)(end - R->mb_done), err))) return rc;
    if (!R->built) {
        if ((rc = build_worker(R, err))) return rc;
    } else if ((rc = rt_worker_bind(w, &R->cfg, &R->segres, err))) {
        return fail_segment(R, rc, err);
    }
    double seg_t0 = w->t_start - R->t0, c0 = cpu_now();
    uint64_t sent0 = comm_bytes_sent(R->c);
    if (w->stage >= 0 && (R->seg.kind == SCHED_ASP ? rt_asp_exec(w, NULL, err) : rt_exec(w, 1, err)) == RT_ERR)
        return fail_segment(R, err->code ? err->code : PD_ECOMM, err);
    if ((rc = rt_worker_drain(w, err))) {
        err_prefix(err, "rank %d (stage %d), completing the segment's sends", R->rank, R->stage);
        return fail_segment(R, rc, err);
    }
    R->cpu_s += cpu_now() - c0;
    R->segres.bytes_sent = (double)(comm_bytes_sent(R->c) - sent0);
    R->segres.wall_s = pd_now() - w->t_start;
    R->train_s += R->segres.wall_s;
    const RtWorkerResult *g = &R->segres;
    double fig[RT_SEG_FIGS] = {R->stage, g->compute_s, g->wait_s, g->wall_s, g->bytes_sent,
                     w->n_chunk > 1 ? g->n_fwd / w->n_chunk : g->n_fwd};
    memcpy(R->seg_fig, fig, sizeof fig);
    rt_result_add(&R->acc, &R->segres, R->cfg.unit_base, seg_t0);
    R->mb_done = end;
    return PD_OK;
}

/* The segment loop: segments end at checkpoints and evaluations; the run stops at the end or
 * at the first evaluation reaching the target accuracy. */
static int session_segments(Rank *R, Err *err) {
    const RtTrainSpec *sp = R->sp;
    uint64_t n_mb = (uint64_t)R->n_mb;
    int rc;
    while (R->mb_done < n_mb) {
        uint64_t end = rt_segment_end(R->mb_done, n_mb, sp->checkpoint_every, sp->eval_every);
        if ((rc = run_segment(R, end, err))) return rc;
        int ck_due = sp->checkpoint_every && (R->mb_done % (uint64_t)sp->checkpoint_every == 0 || R->mb_done == n_mb);
        if (ck_due && sp->checkpoint_dir && (rc = checkpoint(R, &R->w, &R->seg, err))) return rc;
        if (ck_due && sp->progress_file && (rc = rt_progress_file_line(R->c, sp, &R->seg, R->unit_batch, R->mb_done, R->seg_fig,
                                                                        R->timeout, err))) return fail_segment(R, rc, err);
        if (sp->eval_every && R->test && R->mb_done % (uint64_t)sp->eval_every == 0 && R->mb_done < n_mb) {
            const RtEvalPoint *pt;
            if ((rc = evaluate(R, &R->w, &R->seg, &pt, err))) return fail_segment(R, rc, err);
            if (R->rank == 0)
                fprintf(stderr, "pipedream: evaluation after %llu minibatches (%.0f s of training): test accuracy %.4f\n",
                        (unsigned long long)R->mb_done, R->train_s, pt->test_accuracy);
            if (rt_target_reached(sp->target_accuracy, pt) && !R->target_mb) {
                R->target_mb = R->mb_done, R->target_s = R->train_s;
                if (R->rank == 0)
                    fprintf(stderr, "pipedream: target accuracy %.4f reached: stopping\n", sp->target_accuracy);
                break;
            }
        }
    }
    if (!R->built) {
        /* resumed from a checkpoint at the end (a run stopped after its last checkpoint, in its
         * final evaluation, say): nothing to train; the worker is built on the checkpoint's
         * weights (on a schedule it does not run) for the evaluation and the summary */
        if (R->rank == 0)
            fprintf(stderr, "pipedream: %s is already %llu minibatches in: nothing to train, evaluating it\n",
                    R->last_ckpt, (unsigned long long)R->mb_done);
        if ((rc = segment_schedule(R, 1, err)) || (rc = build_worker(R, err))) return rc;
    }
    return PD_OK;
}

/* ---- finish ------------------------------------------------------------------------------------ */

/* --save: the final weights gathered on rank 0 and written; every rank agrees on the outcome. */
static int save_weights(Rank *R, Err *err) {
    int rc = gather_state(R, &R->w, &R->seg, err);
    if (rc) return rc;
    if (R->rank == 0) {
        rc = rt_weights_save(R->sp->save, R->m, R->ck.params, R->ck.state, R->data_mean, R->data_std, err);
        if (rc) err_prefix(err, "rank 0 (stage %d): --save", R->stage);
    }
    return agree(R, rc, err);
}

/* The final weights (their checksums), --save, then the evaluation on them. */
static int session_finish(Rank *R, Err *err) {
    const RtTrainSpec *sp = R->sp;
    int rc;
    if (sp->save && (rc = save_weights(R, err))) return rc;
    RtWorkerResult fin = {0};
    R->w.res = &fin;
    rt_worker_finish(&R->w);
    R->acc.params_crc = fin.params_crc;
    memcpy(R->acc.chunk_crc, fin.chunk_crc, sizeof fin.chunk_crc);
    R->acc.n_chunks = fin.n_chunks;
    R->acc.n_params = fin.n_params;
    R->acc.n_state = fin.n_state;
    R->w.res = NULL;
    rt_result_release(&fin);
    if (R->test && !(R->ev.n && R->ev.pts[R->ev.n - 1].minibatches == R->mb_done)) {   /* unless just evaluated */
        const RtEvalPoint *pt;
        if ((rc = evaluate(R, &R->w, &R->seg, &pt, err))) return fail_segment(R, rc, err);
        if (rt_target_reached(sp->target_accuracy, pt) && !R->target_mb) R->target_mb = R->mb_done, R->target_s = R->train_s;
    }
    if (R->test && R->rank == 0)   /* totals over targets (a language model: positions) */
        R->acc.test_correct = R->ev.ct[0], R->acc.test_total = R->ev.ct[1], R->acc.test_loss_sum = R->ev.loss_sum;
    return PD_OK;
}

/* ---- results ---------------------------------------------------------------------------------- */

/* Every worker's figures to rank 0 (all: comm_size entries there). */
static int gather_results(Rank *R, const RtWorkerResult *a, RtWorkerResult *all, Err *err) {
    size_t n;
    char *buf = rt_result_pack(a, &n);
    void **parts = NULL;
    size_t *sizes = NULL;
    int rc = comm_gather(R->c, 0, buf, n, &parts, &sizes, R->timeout, err);
    free(buf);
    if (rc || R->rank != 0) return rc;
    for (int r = 0; r < comm_size(R->c) && !rc; r++) rc = rt_result_unpack(parts[r], sizes[r], r, &all[r], err);
    comm_parts_free(parts, sizes, comm_size(R->c));
    return rc;
}

/* Every worker's figures gathered on rank 0, which makes the summary. */
static int session_results(Rank *R, Err *err) {
    const RtTrainSpec *sp = R->sp;
    int rank = R->rank, n = comm_size(R->c), rc;
    R->acc.rank = rank, R->acc.stage = R->stage, R->acc.replica = R->stage >= 0 ? R->probe.workers[rank].replica : 0;
    R->acc.cpu_s = R->cpu_s, R->acc.pid = (int64_t)getpid();
    RtWorkerResult *all = rank == 0 ? calloc((size_t)n, sizeof *all) : NULL;
    PD_ASSERT(rank != 0 || all);
    Schedule whole = {0};
    if ((rc = gather_results(R, &R->acc, all, err)) || rank != 0) goto out;
    SchedOpts so = {.kind = sp->kind, .n_minibatches = (int)R->mb_done, .n_micro = R->probe.n_micro,
                    .vertical_sync = sp->vertical_sync, .recompute = sp->recompute, .inflight = sp->inflight};
    if ((rc = sched_build(sp->plan, &so, &whole, err))) goto out;
    RtTrainSummary *out = R->S->out;
    out->res = all;
    all = NULL;
    rt_summarize(sp, &whole, R->unit_batch, comm_name(R->c), R->n_train, R->data_mean, R->data_std, out);
    out->evals = R->ev.pts, out->n_evals = R->ev.n;
    R->ev.pts = NULL, R->ev.n = 0;
    out->target_minibatches = R->target_mb, out->target_train_s = R->target_s;
    out->resumed_from = R->resumed;
    snprintf(out->last_checkpoint, sizeof out->last_checkpoint, "%s", R->last_ckpt);
out:
    if (all)
        for (int r = 0; r < n; r++) rt_result_release(&all[r]);
    free(all);
    sched_release(&whole);
    return rc;
}

/* ---- one rank --------------------------------------------------------------------------------- */

static int session_rank(Comm *c, int rank, const Sess *S, Err *err) {
    RtTrainSpec own = *S->spec;   /* this rank's checkpoint directories: %r made its number */
    char own_dirs[2][4096];
    Rank R = {.S = S, .sp = &own, .c = c, .rank = rank, .timeout = S->spec->timeout_s, .t0 = pd_now()};
    memset(&R.w, 0, sizeof R.w);
    R.data.mean = R.data.std = NAN;
    R.data_mean = R.data_std = NAN;
    int rc = rt_ckpt_spec_dirs(&own.checkpoint_dir, &own.resume, rank, own_dirs, err);
    if (!rc) rc = session_setup(&R, err);
    if (!rc) rc = session_workers(&R, err);
    if (!rc) rc = session_segments(&R, err);
    if (!rc) rc = session_finish(&R, err);
    if (!rc) rc = session_results(&R, err);
    if (rc == PD_ECOMM) fail_segment(&R, rc, err);
    else if (rc) name_last_ckpt(&R, rc, err);
    if (R.w.cfg) {
        R.w.res = &R.segres;
        rt_worker_release(&R.w);
    }
    rt_result_release(&R.segres);
    rt_result_release(&R.acc);
    rt_eval_log_release(&R.ev);
    if (R.own_init) rt_stage_state_free(&R.init[rank]);
    free(R.init);
    sched_release(&R.seg);
    sched_release(&R.probe);
    if (R.have_ck) ck_free(&R.ck);
    data_splits_release(&R.data);
    model_free(R.m);
    return rc;
}

static int session_thread(Comm *c, int rank, void *arg) {
    const Sess *S = arg;
    return session_rank(c, rank, S, &S->errs[rank]);
}

int rt_train(Comm *c, const RtTrainSpec *given, RtTrainSummary *out, Err *err) {
    memset(out, 0, sizeof *out);
    RtTrainSpec resolved = *given, *spec = &resolved;
    if (spec->staleness == RT_STALE_DEFAULT) spec->staleness = rt_staleness_default(spec->kind);
    if (spec->kind == SCHED_ASP && (spec->staleness & ~RT_STALE_LOOKAHEAD))
        return err_set(err, PD_EINVAL, "asp takes --staleness lookahead or none: its delays depend on timing, which "
                       "predict (how many updates lie ahead) and lr-warmup (a stage's most delay) need in advance");
    rt_staleness_name(spec->staleness, out->staleness, sizeof out->staleness);
    if (spec->wire < 0 || spec->wire >= RT_WIRE_COUNT)
        return err_set(err, PD_EINVAL, "wire codec %d: not one of fp32, bf16, int8, int4, delta", spec->wire);
    if (spec->wire_grad < 0) spec->wire_grad = spec->wire == RT_WIRE_DELTA ? RT_WIRE_FP32 : spec->wire;
    if (spec->wire_grad >= RT_WIRE_COUNT || spec->wire_grad == RT_WIRE_DELTA)
        return err_set(err, PD_EINVAL, "gradient wire codec %s: not one of fp32, bf16, int8, int4",
                       rt_wire_name(spec->wire_grad));
    if (spec->wire_at && spec->plan && spec->plan->chunks > 1)
        return err_set(err, PD_EINVAL, "codecs per boundary are for a plan of one stage per worker");
    for (int b = 0; spec->wire_at && spec->plan && b + 1 < spec->plan->n_stages; b++)
        if (spec->wire_at[2 * b] < 0 || spec->wire_at[2 * b] >= RT_WIRE_COUNT || spec->wire_at[2 * b + 1] < 0 ||
            spec->wire_at[2 * b + 1] >= RT_WIRE_DELTA)
            return err_set(err, PD_EINVAL, "boundary %d: codecs %d / %d", b, spec->wire_at[2 * b], spec->wire_at[2 * b + 1]);
    if (spec->error_feedback && spec->wire_grad == RT_WIRE_FP32 && !spec->wire_at)
        return err_set(err, PD_EINVAL, "--error-feedback needs gradients that lose something on the wire "
                       "(--wire-grad bf16, int8 or int4; they travel as fp32)");
    if (spec->minibatch < 1 || (spec->n_micro > 1 && spec->minibatch % spec->n_micro))
        return err_set(err, PD_EINVAL, "minibatch %d is not a positive multiple of %d micro-batches", spec->minibatch,
                       spec->n_micro);
    if ((spec->checkpoint_every > 0) != (spec->checkpoint_dir != NULL))
        return err_set(err, PD_EINVAL, "checkpoints need both an interval and a directory");
    if (spec->progress_file && spec->checkpoint_every <= 0)
        return err_set(err, PD_EINVAL, "--progress-file needs checkpoints (--checkpoint-every): a line per checkpoint");
    if (spec->keep_last < 0 || (spec->keep_last > 0 && !spec->checkpoint_dir))
        return err_set(err, PD_EINVAL, "keeping the last %d checkpoints needs checkpoints", spec->keep_last);
    char *text = NULL;
    int rc = pd_read_file(spec->model_path, 1 << 24, &text, NULL, err);
    if (rc) return rc;
    RtTrainSpec sp = *spec;
    Plan *single = NULL;
    if (!sp.plan) {   /* one worker: one stage of the whole model */
        Model *m = model_parse(text, spec->model_path, err);
        if (!m) {
            free(text);
            return err->code ? err->code : PD_EINVAL;
        }
        sp.plan = single = plan_single(model_name(m), model_n_layers(m));
        model_free(m);
    }
    Sess S = {.spec = &sp, .model_text = text, .out = out};
    if (c) {
        S.n_ranks = comm_size(c);
        rc = session_rank(c, comm_rank(c), &S, err);
    } else {
        Schedule probe;
        if ((rc = plan_ranks(&sp, &probe, err))) goto done;
        int n = S.n_ranks = probe.n_ranks;
        sched_release(&probe);
        S.errs = calloc((size_t)n, sizeof(Err));
        int *rcs = calloc((size_t)n, sizeof(int));
        PD_ASSERT(S.errs && rcs);
        rc = comm_threads_run(n, session_thread, &S, rcs, err);
        if (rc) rt_first_failure(rc, rcs, S.errs, n, err);
        free(S.errs);
        free(rcs);
    }
done:
    free(text);
    plan_free(single);
    if (rc && out->res) rt_train_summary_release(out);
    return rc;
}
