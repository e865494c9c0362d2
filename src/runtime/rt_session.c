/* rt_session.c: a whole training run (runtime.h, "training sessions"). One function,
 * session_rank, runs one rank's part over a Comm; rt_train calls it once (MPI: this process's
 * rank) or on one thread per worker (threads transport). Everything ranks tell each other
 * goes over comm's typed control plane (channels below), every wait bounded by the spec's
 * timeout. The flow:
 *
 *   set-up   model (parsed once), plan check, data, checkpoint directory, resume file:
 *            agreed; a failure anywhere is every rank's error, naming the failing rank
 *   workers  built once for the first segment, rebound (rt_worker_bind) for the others
 *   segments run; drain; checkpoint: gather replica 0 of every stage on rank 0, write,
 *            agree on the result before anyone calls it the last checkpoint
 *   end      evaluation; every worker's figures gathered on rank 0; the summary
 *
 * During a segment a failing rank ends the job with comm_abort (nobody waits for a rank that
 * may be dead or stuck). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "kernels.h"
#include "rt_impl.h"
#include "sim.h"

/* control channels of a session */
enum { CH_CKPT = 1, CH_RESULT = 2 };

typedef struct Sess {
    const RtTrainSpec *spec;
    const char *model_text;      /* the model JSON, read once */
    int n_ranks;
    RtTrainSummary *out;         /* filled by rank 0 */
    Err *errs;                   /* threads: per rank */
} Sess;

/* One rank's state. */
typedef struct Rank {
    const Sess *S;
    Comm *c;
    int rank, stage, reads_input;
    double timeout;
    Model *m;
    Dataset train, test;
    int have_train, have_test;
    uint64_t mb_done;            /* minibatches done before this segment */
    RtCkpt ck;                   /* resume: whole-model buffers (all ranks); rank 0: checkpoint assembly */
    int have_ck;
    char last_ckpt[4096];
    RtWorkerResult acc;          /* this worker's totals over segments */
    double t0;                   /* session start */
} Rank;

static void ck_alloc(const Model *m, int adam, RtCkpt *c) {
    int nl = model_n_layers(m);
    size_t np = model_param_count(m, 0, nl), ns = model_state_count(m, 0, nl);
    c->params = pd_alloc_f32(np ? np : 1);
    c->opt_m = pd_alloc_f32(np ? np : 1);
    c->opt_v = adam ? pd_alloc_f32(np ? np : 1) : NULL;
    c->state = pd_alloc_f32(ns ? ns : 1);
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
                    .recompute = sp->recompute};
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

/* Set-up of one rank before anything is agreed: model, plan, data, checkpoint directory,
 * resume file. */
static int setup_local(Rank *R, const Schedule *probe, Err *err) {
    const RtTrainSpec *sp = R->S->spec;
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
    if (sp->text) {   /* byte-level text: sequences of the model's context length, a held-out tail */
        Shape in = model_input_shape(R->m);
        if (in.ndim != 1)
            return err_set(err, PD_EINVAL, "%s: --text needs a model whose input is (T) token ids", sp->model_path);
        TextData txt;
        if ((rc = data_text_load(sp->text, in.d[0], DATA_TEXT_TEST_FRACTION, &txt, err))) return rc;
        if (R->reads_input) {
            rc = data_text_dataset(&txt, 0, &R->train, err);
            R->have_train = !rc;
        }
        if (!rc) {
            rc = data_text_dataset(&txt, 1, &R->test, err);
            R->have_test = !rc;
        }
        data_text_release(&txt);
        if (rc) return rc;
    } else {
        if (R->reads_input) {
            if ((rc = data_load_idx(sp->data_dir, "train", &R->train, err))) return rc;
            R->have_train = 1;
            data_normalize(&R->train, DATA_FMNIST_MEAN, DATA_FMNIST_STD);
        }
        if ((rc = data_load_idx(sp->data_dir, "test", &R->test, err))) return rc;
        R->have_test = 1;
        data_normalize(&R->test, DATA_FMNIST_MEAN, DATA_FMNIST_STD);
    }
    if (R->rank == 0 && sp->checkpoint_dir && (rc = check_ckpt_dir(sp->checkpoint_dir, err))) return rc;
    if (sp->resume) {
        char path[4096];
        if ((rc = ckpt_latest(sp->resume, path, sizeof path, err))) return rc;
        if (!path[0])
            return err_set(err, PD_EINVAL, "%s: no complete checkpoint to resume from (see the warnings above, if any)",
                           sp->resume);
        ck_alloc(R->m, sp->opt.kind == OPT_ADAM, &R->ck);
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
        ck_alloc(R->m, sp->opt.kind == OPT_ADAM, &R->ck);
        R->have_ck = 1;
        if ((rc = rt_weights_load(sp->init_weights, R->m, &R->ck, err))) return rc;
    }
    return PD_OK;
}

/* Adds one segment's figures to the worker's totals (loss history and events moved to the
 * run's unit numbering and clock). */
static void acc_add(RtWorkerResult *acc, RtWorkerResult *seg, uint64_t unit_base, double t_off) {
    acc->rank = seg->rank, acc->stage = seg->stage, acc->replica = seg->replica;
    acc->wall_s += seg->wall_s, acc->compute_s += seg->compute_s, acc->wait_s += seg->wait_s;
    acc->n_fwd += seg->n_fwd, acc->n_bwd += seg->n_bwd;
    acc->n_chunks = seg->n_chunks;
    for (int c = 0; c < RT_MAX_CHUNKS; c++)
        acc->chunk_compute_s[c] += seg->chunk_compute_s[c], acc->chunk_fwd[c] += seg->chunk_fwd[c];
    acc->loss_sum += seg->loss_sum, acc->units_done += seg->units_done;
    if (seg->units_done) acc->last_loss = seg->last_loss;
    if (seg->max_versions > acc->max_versions) acc->max_versions = seg->max_versions;
    acc->n_delayed += seg->n_delayed, acc->delay_sum += seg->delay_sum;
    if (seg->delay_max > acc->delay_max) acc->delay_max = seg->delay_max;
    if (seg->mem.total > acc->mem.total) acc->mem = seg->mem;
    if (seg->n_hist) {
        float *h = realloc(acc->hist, (size_t)(acc->n_hist + seg->n_hist) * 3 * sizeof(float));
        PD_ASSERT(h);
        acc->hist = h;
        for (int k = 0; k < seg->n_hist; k++) {
            float *d = &h[3 * (acc->n_hist + k)];
            memcpy(d, &seg->hist[3 * k], 3 * sizeof(float));
            d[0] += (float)unit_base;
        }
        acc->n_hist += seg->n_hist;
    }
    if (seg->n_events) {
        RtEvent *e = realloc(acc->events, (size_t)(acc->n_events + seg->n_events) * sizeof *e);
        PD_ASSERT(e);
        acc->events = e;
        for (int k = 0; k < seg->n_events; k++) {
            RtEvent x = seg->events[k];
            x.mb += (int)unit_base, x.t0 += t_off, x.t1 += t_off;
            e[acc->n_events + k] = x;
        }
        acc->n_events += seg->n_events;
    }
    rt_asp_acc_add(acc, seg);
    rt_result_release(seg);
}

/* ---- checkpoints ------------------------------------------------------------------------- */

/* Replica 0 of every stage sends [opt_step (int64) | params | opt_m | opt_v (Adam) | state] to
 * rank 0 (others send nothing); rank 0 places them by layer and writes the file. Then every
 * rank agrees on the outcome. */
static int checkpoint(Rank *R, Worker *w, const Schedule *s, Err *err) {
    const RtTrainSpec *sp = R->S->spec;
    int adam = sp->opt.kind == OPT_ADAM, rc = PD_OK;
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
    if (rc) return rc;   /* the control plane failed: a peer is gone or stuck (named in err) */
    if (R->rank == 0) {
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
        if (!rc) {
            c->minibatches_done = R->mb_done;
            c->units_done = R->mb_done * (uint64_t)s->n_micro;
            c->seed = sp->seed;
            snprintf(c->schedule, sizeof c->schedule, "%s", sched_kind_name(s->kind));
            char path[4096];
            rc = rt_ckpt_save(sp->checkpoint_dir, R->m, c, path, sizeof path, err);
            if (rc) err_prefix(err, "rank 0 (stage %d): checkpoint after minibatch %llu", R->stage,
                               (unsigned long long)R->mb_done);
            else snprintf(R->last_ckpt, sizeof R->last_ckpt, "%s", path);
        }
    }
    /* nobody calls it the last checkpoint before everyone knows it was written */
    if ((rc = agree(R, rc, err))) return rc;
    char name[64];
    Err e2;
    if (R->rank != 0 && ckpt_name(R->mb_done, name, sizeof name, &e2) == PD_OK)
        snprintf(R->last_ckpt, sizeof R->last_ckpt, "%.4000s/%.64s", sp->checkpoint_dir, name);
    if (R->rank == 0) fprintf(stderr, "pipedream: checkpoint %s\n", R->last_ckpt);
    rt_fail_set_checkpoint(R->last_ckpt);
    return PD_OK;
}

/* ---- results -------------------------------------------------------------------------------- */

/* The fixed part of a worker's figures on the wire (host byte order, as comm assumes). */
typedef struct Wire {
    int64_t rank, stage, replica, n_fwd, n_bwd, units_done, test_correct, test_total, max_versions, n_events,
        n_hist, crc, n_params, n_state;
    double wall_s, compute_s, wait_s, loss_sum, last_loss, test_loss_sum;
    RtMem mem;
    int64_t asp_applied, asp_staleness_max, asp_pulls;   /* asp (rt_asp.c) */
    double asp_staleness_mean, asp_pull_ms_mean, asp_pull_ms_max;
    int64_t n_chunks, chunk_fwd[RT_MAX_CHUNKS], chunk_crc[RT_MAX_CHUNKS];   /* several stages per rank */
    double chunk_compute_s[RT_MAX_CHUNKS];
    int64_t n_delayed, delay_sum, delay_max;   /* the staleness its units crossed */
} Wire;

static int gather_results(Rank *R, const RtWorkerResult *a, RtWorkerResult *all, Err *err) {
    Wire x = {a->rank, a->stage, a->replica, a->n_fwd, a->n_bwd, a->units_done, a->test_correct, a->test_total,
              a->max_versions, a->n_events, a->n_hist, a->params_crc, (int64_t)a->n_params, (int64_t)a->n_state,
              a->wall_s, a->compute_s, a->wait_s, a->loss_sum, a->last_loss, a->test_loss_sum, a->mem,
              a->asp_applied, a->asp_staleness_max, a->asp_pulls, a->asp_staleness_mean, a->asp_pull_ms_mean,
              a->asp_pull_ms_max, a->n_chunks, {0}, {0}, {0}, a->n_delayed, a->delay_sum, a->delay_max};
    for (int c = 0; c < RT_MAX_CHUNKS; c++)
        x.chunk_fwd[c] = a->chunk_fwd[c], x.chunk_crc[c] = a->chunk_crc[c], x.chunk_compute_s[c] = a->chunk_compute_s[c];
    size_t ne = (size_t)a->n_events, nh = (size_t)a->n_hist;
    size_t n = sizeof x + ne * sizeof(RtEvent) + nh * 3 * sizeof(float);
    char *buf = malloc(n);
    PD_ASSERT(buf);
    memcpy(buf, &x, sizeof x);
    if (ne) memcpy(buf + sizeof x, a->events, ne * sizeof(RtEvent));
    if (nh) memcpy(buf + sizeof x + ne * sizeof(RtEvent), a->hist, nh * 3 * sizeof(float));
    void **parts = NULL;
    size_t *sizes = NULL;
    int rc = comm_gather(R->c, 0, buf, n, &parts, &sizes, R->timeout, err);
    free(buf);
    if (rc || R->rank != 0) return rc;
    for (int r = 0; r < comm_size(R->c) && !rc; r++) {
        Wire y;
        if (sizes[r] < sizeof y) {
            rc = err_set(err, PD_ECOMM, "results: rank %d sent %zu bytes", r, sizes[r]);
            break;
        }
        memcpy(&y, parts[r], sizeof y);
        if (sizes[r] != sizeof y + (size_t)y.n_events * sizeof(RtEvent) + (size_t)y.n_hist * 3 * sizeof(float)) {
            rc = err_set(err, PD_ECOMM, "results: rank %d sent %zu bytes for %lld events and %lld losses", r, sizes[r],
                         (long long)y.n_events, (long long)y.n_hist);
            break;
        }
        RtWorkerResult *o = &all[r];
        *o = (RtWorkerResult){.rank = (int)y.rank, .stage = (int)y.stage, .replica = (int)y.replica,
                              .n_params = (size_t)y.n_params, .n_state = (size_t)y.n_state,
                              .params_crc = (uint32_t)y.crc, .max_versions = (int)y.max_versions,
                              .loss_sum = y.loss_sum, .last_loss = y.last_loss, .units_done = (int)y.units_done,
                              .test_correct = y.test_correct, .test_total = y.test_total, .n_hist = (int)y.n_hist,
                              .wall_s = y.wall_s, .compute_s = y.compute_s, .wait_s = y.wait_s,
                              .n_fwd = (int)y.n_fwd, .n_bwd = (int)y.n_bwd, .n_events = (int)y.n_events,
                              .test_loss_sum = y.test_loss_sum, .mem = y.mem, .asp_applied = y.asp_applied,
                              .asp_staleness_max = (int)y.asp_staleness_max, .asp_pulls = y.asp_pulls,
                              .asp_staleness_mean = y.asp_staleness_mean, .asp_pull_ms_mean = y.asp_pull_ms_mean,
                              .asp_pull_ms_max = y.asp_pull_ms_max, .n_chunks = (int)y.n_chunks,
                              .n_delayed = (int)y.n_delayed, .delay_sum = y.delay_sum, .delay_max = (int)y.delay_max};
        for (int c = 0; c < RT_MAX_CHUNKS; c++)
            o->chunk_fwd[c] = (int)y.chunk_fwd[c], o->chunk_crc[c] = (uint32_t)y.chunk_crc[c],
            o->chunk_compute_s[c] = y.chunk_compute_s[c];
        const char *p = (const char *)parts[r] + sizeof y;
        if (y.n_events) {
            o->events = malloc((size_t)y.n_events * sizeof(RtEvent));
            PD_ASSERT(o->events);
            memcpy(o->events, p, (size_t)y.n_events * sizeof(RtEvent));
            p += (size_t)y.n_events * sizeof(RtEvent);
        }
        if (y.n_hist) {
            o->hist = malloc((size_t)y.n_hist * 3 * sizeof(float));
            PD_ASSERT(o->hist);
            memcpy(o->hist, p, (size_t)y.n_hist * 3 * sizeof(float));
        }
    }
    comm_parts_free(parts, sizes, comm_size(R->c));
    return rc;
}

/* Rank 0: the summary from every worker's figures, with the simulator's prediction. */
static void summarize(const RtTrainSpec *sp, const Schedule *s, int unit_batch, const char *transport,
                      RtTrainSummary *out) {
    RtWorkerResult *res = out->res;
    double wall = 0, loss_sum = 0, last_loss = 0, overhead = 0, test_loss = 0;
    long correct = 0, total = 0;
    int units = 0, n_last = 0;
    const SchedStage *lst = &s->stages[s->n_stages - 1];
    for (int r = 0; r < s->n_ranks; r++) {
        if (res[r].wall_s > wall) wall = res[r].wall_s;
        int runs_last = 0;   /* a replica of the last stage (interleaved: its last chunk) */
        for (int j = 0; j < lst->replicas; j++) runs_last |= lst->ranks[j] == r;
        if (runs_last) {
            loss_sum += res[r].loss_sum;
            units += res[r].units_done;
            last_loss += res[r].last_loss;
            n_last++;
        }
        correct += res[r].test_correct;
        total += res[r].test_total;
        test_loss += res[r].test_loss_sum;
        /* runtime overhead: time neither in kernels nor blocked on messages; the largest share */
        if (res[r].stage >= 0 && res[r].wall_s > 0) {
            double ov = (res[r].wall_s - res[r].compute_s - res[r].wait_s) / res[r].wall_s;
            if (ov > overhead) overhead = ov;
        }
    }
    snprintf(out->model, sizeof out->model, "%s", sp->plan->model);
    snprintf(out->schedule, sizeof out->schedule, "%s", sched_kind_name(s->kind));
    snprintf(out->transport, sizeof out->transport, "%s", transport);
    out->workers = s->n_ranks, out->stages = s->n_stages, out->steps = s->n_minibatches;
    out->units = units, out->unit_batch = unit_batch;
    out->final_loss = n_last ? last_loss / n_last : NAN;
    out->mean_loss = units ? loss_sum / units : NAN;
    out->test_accuracy = total ? (double)correct / (double)total : NAN;
    out->test_loss = total ? test_loss / (double)total : NAN;
    out->wall_s = wall;
    out->samples_per_s = wall > 0 ? (double)units * unit_batch / wall : 0;
    out->time_per_unit_ms = units ? 1e3 * wall / (double)units : NAN;
    out->overhead_pct = 100 * overhead;
    out->predicted_time_per_unit_ms = NAN;
    out->stage = calloc((size_t)s->n_stages, sizeof *out->stage);
    PD_ASSERT(out->stage);
    for (int i = 0; i < s->n_stages; i++) {
        RtStageSummary *g = &out->stage[i];
        const SchedStage *st = &s->stages[i];
        double comp = 0;
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
            nf += r->n_chunks > 1 ? r->chunk_fwd[ci] : r->n_fwd;
            if (r->max_versions > g->versions) g->versions = r->max_versions;
            if (r->delay_max > g->delay_max) g->delay_max = r->delay_max;
            g->delay_mean += r->n_delayed ? (double)r->delay_sum / r->n_delayed / st->replicas : 0;
            g->busy += wall > 0 ? cs / wall / st->replicas : 0;
        }
        g->measured_ms = nf ? 1e3 * comp / nf : 0;
        g->weights_crc = res[st->ranks[0]].n_chunks > 1 ? res[st->ranks[0]].chunk_crc[ci] : res[st->ranks[0]].params_crc;
        g->mem = res[st->ranks[0]].mem;
        g->predicted_bytes = g->predicted_activation_bytes = g->predicted_stashed_bytes = NAN;
    }
    if (s->kind == SCHED_ASP) rt_asp_summarize(res, s->n_ranks, out);
    if (!sp->profile) return;
    SimCosts costs;
    SimResult sr;
    SimOpts so = {.cluster = &sp->plan->cluster, .opt_state_factor = sp->opt.kind == OPT_ADAM ? 2 : 1,
                  .samples_per_unit = unit_batch,
                  .predicts_weights = (sp->staleness & (RT_STALE_PREDICT | RT_STALE_LOOKAHEAD)) != 0};
    Err e2 = {0};
    if (sim_costs_from_profile(s, sp->profile, &costs, &e2) != PD_OK) return;
    sim_costs_scale(&costs, sp->profile->minibatch > 0 ? (double)unit_batch / sp->profile->minibatch : 1.0);
    if (sim_run(s, &costs, &so, &sr, &e2) == PD_OK) {
        /* as the simulator charges it: slowed where workers share a machine's cores, and with
         * the optimizer step spread over the units it follows (as measured_ms has it) */
        for (int i = 0; i < costs.n_stages; i++) {
            const SchedWorker *sw = &s->workers[s->stages[i].ranks[0]];
            int nfw = 0, nst = 0;
            for (int k = 0; k < sw->n; k++) nfw += sw->ins[k].op == OP_FORWARD, nst += sw->ins[k].op == OP_STEP;
            double step = nfw ? costs.stage[i].step_s * nst / nfw : 0;
            out->stage[i].predicted_ms =
                1e3 * (costs.stage[i].fwd_s + costs.stage[i].bwd_s + step) * sr.slowdown[s->stages[i].ranks[0]];
        }
        out->predicted_time_per_unit_ms = 1e3 * sr.time_per_unit_s;
        if (sp->trace) out->sim_events = sim_events(s, &sr, &out->n_sim_events);
        for (int i = 0; i < s->n_stages; i++) {
            const SimMem *pm = &sr.mem[s->stages[i].ranks[0]];
            out->stage[i].predicted_bytes = pm->allocated;
            out->stage[i].predicted_activation_bytes = pm->alloc_activations;
            out->stage[i].predicted_stashed_bytes = pm->alloc_stashed;
        }
        sim_result_release(&sr);
    }
    sim_costs_release(&costs);
}

/* ---- evaluation ------------------------------------------------------------------------------ */

/* Evaluates the newest weights (replica 0 of every stage), then every rank learns the result
 * from the last stage's first replica. *correct, *total, *loss_sum: over the test set. */
static int evaluate(Rank *R, Worker *w, RtConfig *cfg, const Schedule *s, int64_t base, int64_t out[2],
                    double *loss_sum, Err *err) {
    RtWorkerResult tmp = {0};
    RtWorkerResult *keep = w->res;
    w->res = &tmp;
    cfg->test = &R->test;
    cfg->eval_base = base;
    w->cfg = cfg;
    int rc = rt_eval(w, err);
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
    if ((rc = comm_bcast(R->c, last, v, sizeof v, R->timeout, err))) return rc;
    out[0] = v[0].i[0], out[1] = v[0].i[1];
    *loss_sum = v[1].d[0];
    return PD_OK;
}

/* The run's evaluations; ct and loss_sum are the newest one's totals over targets. */
typedef struct EvalLog {
    RtEvalPoint *pts;
    int n;
    int64_t ct[2];
    double loss_sum;
} EvalLog;

/* Evaluates after R->mb_done minibatches (train_s seconds of training) and logs the point; every
 * evaluation gets its own message ids after the run's units (eval_batches each). */
static int eval_point(Rank *R, Worker *w, RtConfig *cfg, const Schedule *seg, int64_t run_units, int64_t eval_batches,
                      int64_t n_train, double train_s, EvalLog *log, Err *err) {
    int64_t base = run_units + (int64_t)log->n * eval_batches;
    int rc = evaluate(R, w, cfg, seg, base, log->ct, &log->loss_sum, err);
    if (rc) return rc;
    int64_t n = log->ct[1];
    RtEvalPoint pt = {R->mb_done, (double)R->mb_done * R->S->spec->minibatch / (double)(n_train ? n_train : 1),
                      train_s, n ? (double)log->ct[0] / (double)n : NAN, n ? log->loss_sum / (double)n : NAN};
    log->pts = realloc(log->pts, (size_t)(log->n + 1) * sizeof *log->pts);
    PD_ASSERT(log->pts);
    log->pts[log->n++] = pt;
    return PD_OK;
}

/* ---- one rank ------------------------------------------------------------------------------ */

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

static int session_rank(Comm *c, int rank, const Sess *S, Err *err) {
    const RtTrainSpec *sp = S->spec;
    Rank R = {.S = S, .c = c, .rank = rank, .timeout = sp->timeout_s, .t0 = pd_now()};
    Schedule probe = {0}, seg = {0};
    Worker w;
    memset(&w, 0, sizeof w);
    RtWorkerResult segres = {0};
    RtStageState *init = NULL;
    EvalLog ev = {0};
    uint64_t target_mb = 0;
    double train_s = 0, target_s = 0;
    int own_init = 0;   /* init[rank]'s buffers were made here (a rank with several chunks) */
    int rc = plan_ranks(sp, &probe, err);   /* the same on every rank: no agreement needed */
    if (rc) return rc;
    comm_set_coll_timeout(c, sp->timeout_s);
    R.stage = rank < probe.n_ranks ? probe.workers[rank].stage : -1;
    R.reads_input = R.stage == 0;
    int first_input = probe.stages[0].ranks[0];
    for (int j = 1; j < probe.stages[0].replicas; j++)
        if (probe.stages[0].ranks[j] < first_input) first_input = probe.stages[0].ranks[j];
    snprintf(R.last_ckpt, sizeof R.last_ckpt, "%s", "");
    rc = setup_local(&R, &probe, err);
    if (rc) err_prefix(err, "rank %d (stage %d)", rank, R.stage);
    if ((rc = agree(&R, rc, err))) goto out;
    /* the training set's size, from the first rank that read it */
    int unit_batch = sp->minibatch / probe.n_micro;
    int64_t n_train = R.have_train ? (int64_t)R.train.n : 0;
    if ((rc = comm_bcast_i64(c, first_input, &n_train, 1, R.timeout, err))) goto out;
    long n_mb = sp->steps ? sp->steps : (long)sp->epochs * (long)(n_train / unit_batch) / probe.n_micro;
    if (n_mb < 1) n_mb = 1;
    if (n_mb > 1000000000L) n_mb = 1000000000L;
    if (R.mb_done > (uint64_t)n_mb) {
        rc = err_set(err, PD_EINVAL, "rank %d: %s is %llu minibatches in, beyond this run's %ld", rank, R.last_ckpt,
                     (unsigned long long)R.mb_done, n_mb);
        goto out;
    }
    uint64_t resumed = R.mb_done;
    if (R.mb_done && rank == 0)
        fprintf(stderr, "pipedream: resuming from %s (%llu of %ld minibatches done)\n", R.last_ckpt,
                (unsigned long long)R.mb_done, n_mb);
    if (rank == 0)
        fprintf(stderr, "pipedream: training %s with %s on %d workers (%s), %ld minibatches of %d samples\n",
                sp->model_path, sched_kind_name(sp->kind), probe.n_ranks, comm_name(c), n_mb, sp->minibatch);
    /* workers: built for the first segment, rebound for the others */
    init = calloc((size_t)probe.n_ranks, sizeof *init);
    PD_ASSERT(init);
    if (R.have_ck && R.stage >= 0 && probe.workers[rank].n_chunks > 1) {   /* its chunks' ranges, concatenated */
        const SchedWorker *pw = &probe.workers[rank];
        size_t np = 0, ns = 0;
        for (int k = 0; k < pw->n_chunks; k++) {
            const SchedStage *st = &probe.stages[pw->stages[k]];
            int first = st->layers[0], last = st->layers[st->n_layers - 1] + 1;
            np += model_param_count(R.m, first, last), ns += model_state_count(R.m, first, last);
        }
        RtStageState *x = &init[rank];
        x->params = pd_alloc_f32(np ? np : 1), x->opt_m = pd_alloc_f32(np ? np : 1), x->state = pd_alloc_f32(ns ? ns : 1);
        x->opt_v = R.ck.opt_v ? pd_alloc_f32(np ? np : 1) : NULL;
        x->opt_step = R.ck.opt_step;
        own_init = 1;
        size_t po = 0, so = 0;
        for (int k = 0; k < pw->n_chunks; k++) {
            const SchedStage *st = &probe.stages[pw->stages[k]];
            int first = st->layers[0], last = st->layers[st->n_layers - 1] + 1;
            size_t n = model_param_count(R.m, first, last), m = model_state_count(R.m, first, last);
            size_t o = model_param_offset(R.m, first), q = model_state_offset(R.m, first);
            memcpy(x->params + po, R.ck.params + o, n * sizeof(float));
            memcpy(x->opt_m + po, R.ck.opt_m + o, n * sizeof(float));
            if (x->opt_v) memcpy(x->opt_v + po, R.ck.opt_v + o, n * sizeof(float));
            memcpy(x->state + so, R.ck.state + q, m * sizeof(float));
            po += n, so += m;
        }
    } else if (R.have_ck && R.stage >= 0) {
        int first = probe.stages[R.stage].layers[0];
        size_t po = model_param_offset(R.m, first), so = model_state_offset(R.m, first);
        init[rank] = (RtStageState){R.ck.params + po, R.ck.state + so, R.ck.opt_m + po,
                                    R.ck.opt_v ? R.ck.opt_v + po : NULL, R.ck.opt_step};
    }
    RtConfig cfg = {.model_path = sp->model_path, .model = R.m, .unit_batch = unit_batch, .opt = sp->opt,
                    .seed = sp->seed, .train = R.have_train ? &R.train : NULL, .test = NULL,
                    .recv_timeout_s = sp->timeout_s, .trace = sp->trace, .threads = sp->threads,
                    .progress = sp->progress, .units_total = (int)(n_mb * probe.n_micro), .progress_t0 = pd_now(),
                    .progress_u0 = R.mb_done * (uint64_t)probe.n_micro, .init = init, .nan_check = sp->nan_check,
                    .no_stash = sp->no_stash, .staleness = sp->staleness, .staleness_warmup = sp->staleness_warmup};
    if (sp->threads > 0) kern_set_threads(sp->threads);
    int built = 0;
    int64_t eval_batches = R.have_test ? (int64_t)((R.test.n + (size_t)unit_batch - 1) / (size_t)unit_batch) : 0;
    int64_t run_units = (int64_t)n_mb * probe.n_micro;   /* evaluation ids start after them */
    if ((rc = rt_fail_setup(c, &probe, R.timeout, err))) goto out;
    rt_fail_set_checkpoint(R.last_ckpt[0] ? R.last_ckpt : "none");
    while (R.mb_done < (uint64_t)n_mb) {
        /* the segment ends at the next checkpoint or evaluation (multiples of their intervals
         * in the whole run's minibatches), or at the end */
        uint64_t end = (uint64_t)n_mb;
        if (sp->checkpoint_every) {
            uint64_t k = (uint64_t)sp->checkpoint_every, e = (R.mb_done / k + 1) * k;
            if (e < end) end = e;
        }
        if (sp->eval_every) {
            uint64_t k = (uint64_t)sp->eval_every, e = (R.mb_done / k + 1) * k;
            if (e < end) end = e;
        }
        int len = (int)(end - R.mb_done);
        SchedOpts so = {.kind = sp->kind, .n_minibatches = len, .n_micro = probe.n_micro,
                        .vertical_sync = sp->vertical_sync,
                        .recompute = sp->recompute};
        sched_release(&seg);
        if ((rc = sched_build(sp->plan, &so, &seg, err))) goto out;
        cfg.sched = &seg;
        cfg.unit_base = R.mb_done * (uint64_t)seg.n_micro;
        if (!built) {
            rc = rt_worker_init(&w, c, &cfg, rank, &segres, err);
            if (rc) err_prefix(err, "rank %d (stage %d)", rank, R.stage);
            if ((rc = agree(&R, rc, err))) goto out;
            if (w.stage >= 0 && seg.stages[w.stage].replicas > 1 &&
                (rc = comm_group_new(c, seg.stages[w.stage].ranks, seg.stages[w.stage].replicas, &w.group, err)))
                goto out;
            built = 1;
            w.t_start = pd_now();
        } else if ((rc = rt_worker_bind(&w, &cfg, &segres, err))) {
            rc = fail_segment(&R, rc, err);
            goto out;
        }
        double seg_t0 = w.t_start - R.t0;
        if (w.stage >= 0 && (seg.kind == SCHED_ASP ? rt_asp_exec(&w, NULL, err) : rt_exec(&w, 1, err)) == RT_ERR) {
            rc = fail_segment(&R, err->code ? err->code : PD_ECOMM, err);
            goto out;
        }
        if ((rc = rt_worker_drain(&w, err))) {
            err_prefix(err, "rank %d (stage %d), completing the segment's sends", rank, R.stage);
            rc = fail_segment(&R, rc, err);
            goto out;
        }
        segres.wall_s = pd_now() - w.t_start;
        double segres_wall = segres.wall_s;
        acc_add(&R.acc, &segres, cfg.unit_base, seg_t0);
        R.mb_done += (uint64_t)len;
        train_s += segres_wall;
        int ck_due = sp->checkpoint_every && (R.mb_done % (uint64_t)sp->checkpoint_every == 0 ||
                                              R.mb_done == (uint64_t)n_mb);
        if (ck_due && sp->checkpoint_dir && (rc = checkpoint(&R, &w, &seg, err))) goto out;
        if (sp->eval_every && R.have_test && R.mb_done % (uint64_t)sp->eval_every == 0 && R.mb_done < (uint64_t)n_mb) {
            if ((rc = eval_point(&R, &w, &cfg, &seg, run_units, eval_batches, n_train, train_s, &ev, err))) {
                rc = fail_segment(&R, rc, err);
                goto out;
            }
            const RtEvalPoint pt = ev.pts[ev.n - 1];
            if (rank == 0)
                fprintf(stderr, "pipedream: evaluation after %llu minibatches (%.0f s of training): test accuracy %.4f\n",
                        (unsigned long long)R.mb_done, train_s, pt.test_accuracy);
            if (sp->target_accuracy > 0 && pt.test_accuracy >= sp->target_accuracy && !target_mb) {
                target_mb = R.mb_done, target_s = train_s;
                if (rank == 0) fprintf(stderr, "pipedream: target accuracy %.4f reached: stopping\n", sp->target_accuracy);
                break;
            }
        }
    }
    if (!built) {
        rc = err_set(err, PD_EINVAL, "rank %d: nothing to train: %s is already %llu minibatches in", rank, R.last_ckpt,
                     (unsigned long long)R.mb_done);
        goto out;
    }
    /* the final weights, then evaluation on them */
    {
        RtWorkerResult fin = {0};
        w.res = &fin;
        rt_worker_finish(&w);
        R.acc.params_crc = fin.params_crc;
        memcpy(R.acc.chunk_crc, fin.chunk_crc, sizeof fin.chunk_crc);
        R.acc.n_chunks = fin.n_chunks;
        R.acc.n_params = fin.n_params;
        R.acc.n_state = fin.n_state;
        w.res = NULL;
        rt_result_release(&fin);
        if (R.have_test && !(ev.n && ev.pts[ev.n - 1].minibatches == R.mb_done)) {   /* unless just evaluated */
            rc = eval_point(&R, &w, &cfg, &seg, run_units, eval_batches, n_train, train_s, &ev, err);
            if (!rc && sp->target_accuracy > 0 && ev.pts[ev.n - 1].test_accuracy >= sp->target_accuracy && !target_mb)
                target_mb = R.mb_done, target_s = train_s;
        }
        if (!rc && R.have_test && rank == 0)   /* totals over targets (a language model: positions) */
            R.acc.test_correct = ev.ct[0], R.acc.test_total = ev.ct[1], R.acc.test_loss_sum = ev.loss_sum;
        if (rc) {
            rc = fail_segment(&R, rc, err);
            goto out;
        }
    }
    R.acc.rank = rank, R.acc.stage = R.stage, R.acc.replica = R.stage >= 0 ? probe.workers[rank].replica : 0;
    {
        RtWorkerResult *all = rank == 0 ? calloc((size_t)comm_size(c), sizeof *all) : NULL;
        PD_ASSERT(rank != 0 || all);
        if ((rc = gather_results(&R, &R.acc, all, err))) {
            if (all)
                for (int r = 0; r < comm_size(c); r++) rt_result_release(&all[r]);
            free(all);
            goto out;
        }
        if (rank == 0) {
            Schedule whole;
            SchedOpts so = {.kind = sp->kind, .n_minibatches = (int)R.mb_done, .n_micro = probe.n_micro,
                            .vertical_sync = sp->vertical_sync,
                        .recompute = sp->recompute};
            if ((rc = sched_build(sp->plan, &so, &whole, err))) {
                for (int r = 0; r < comm_size(c); r++) rt_result_release(&all[r]);
                free(all);
                goto out;
            }
            S->out->res = all;
            summarize(sp, &whole, unit_batch, comm_name(c), S->out);
            S->out->evals = ev.pts, S->out->n_evals = ev.n;
            ev.pts = NULL;
            S->out->target_minibatches = target_mb, S->out->target_train_s = target_s;
            S->out->resumed_from = resumed;
            snprintf(S->out->last_checkpoint, sizeof S->out->last_checkpoint, "%s", R.last_ckpt);
            sched_release(&whole);
        }
    }
out:
    if (rc == PD_ECOMM) fail_segment(&R, rc, err);
    else if (rc) name_last_ckpt(&R, rc, err);
    if (w.cfg) {
        w.res = &segres;
        rt_worker_release(&w);
    }
    rt_result_release(&segres);
    rt_result_release(&R.acc);
    free(ev.pts);
    if (own_init)
        pd_free(init[rank].params), pd_free(init[rank].opt_m), pd_free(init[rank].opt_v), pd_free(init[rank].state);
    free(init);
    sched_release(&seg);
    sched_release(&probe);
    if (R.have_ck) ck_free(&R.ck);
    if (R.have_train) data_release(&R.train);
    if (R.have_test) data_release(&R.test);
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
    if (spec->kind == SCHED_ASP && spec->staleness)
        return err_set(err, PD_EINVAL, "--staleness applies to the kinds whose delays the instruction list fixes (1f1b, "
                       "2bw); asp's depend on timing");
    rt_staleness_name(spec->staleness, out->staleness, sizeof out->staleness);
    if (spec->minibatch < 1 || (spec->n_micro > 1 && spec->minibatch % spec->n_micro))
        return err_set(err, PD_EINVAL, "minibatch %d is not a positive multiple of %d micro-batches", spec->minibatch,
                       spec->n_micro);
    if ((spec->checkpoint_every > 0) != (spec->checkpoint_dir != NULL))
        return err_set(err, PD_EINVAL, "checkpoints need both an interval and a directory");
    char *text = NULL;
    int rc = pd_read_file(spec->model_path, 1 << 24, &text, NULL, err);
    if (rc) return rc;
    Sess S = {.spec = spec, .model_text = text, .out = out};
    if (c) {
        S.n_ranks = comm_size(c);
        rc = session_rank(c, comm_rank(c), &S, err);
    } else {
        Schedule probe;
        if ((rc = plan_ranks(spec, &probe, err))) {
            free(text);
            return rc;
        }
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
    free(text);
    if (rc && out->res) rt_train_summary_release(out);
    return rc;
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
