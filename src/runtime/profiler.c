/* profiler.c: the paper's profiler: times a model's training steps on one worker and records,
 * per top-level layer, the median forward and backward time, the backward's input-gradient and
 * weight-gradient passes as the zb kinds run them apart, and the byte counts the planner needs.
 * Each top-level layer runs as its own range [i, i+1) with its own context, so its forward and
 * backward are timed separately; the ranges are chained with the activation layouts the whole
 * model has between them (model_cut_layouts), so a layer costs what it costs inside a stage.
 * A stage boundary where the activation is channel-blocked costs more (layout changes, plain
 * kernels where blocked ones ran, on every layer whose layouts the cut changes): the profiler
 * times the cuts too, in a few more passes, each with a set of cuts that change disjoint runs
 * of layers, and records each cut's price on both of its sides.
 * rt_time_layers does the timing, for `pipedream bench --layers` too. It lives in the runtime
 * module, not in profile/, so that the profile and plan modules build without the training
 * engine. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "runtime.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double less(double a, double b) { return a > b ? a - b : 0; }

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void rt_time_layers(Model *m, float *w, float *st, const float *x, const int32_t *labels, int B, int warmup,
                    int iterations, int progress, double *fwd_s, double *bwd_s) {
    int nl = model_n_layers(m);
    unsigned char *inside = calloc((size_t)nl, 1);
    PD_ASSERT(inside);
    model_cut_layouts(m, 0, nl, NULL, inside);
    rt_time_layers_split(m, w, st, x, labels, B, warmup, iterations, progress, inside, fwd_s, bwd_s, NULL, NULL, NULL);
    free(inside);
}

void rt_time_layers_split(Model *m, float *w, float *st, const float *x, const int32_t *labels, int B, int warmup,
                          int iterations, int progress, const unsigned char *ends, double *fwd_s, double *bwd_s,
                          double *bwd_in_s, double *bwd_w_s, double *step_s) {
    int nl = model_n_layers(m), split = bwd_in_s && bwd_w_s;
    int classes = 0, rows = B * model_loss_positions(m, &classes);   /* one row of logits per target */
    PD_ASSERT(classes > 0 && B >= 1 && warmup >= 0 && iterations >= 1);
    size_t np = model_param_count(m, 0, nl);
    float *dw = pd_alloc_f32(np ? np : 1);
    /* Each layer's share of the optimizer step is timed too and counted in its backward time:
     * a stage pays for the update of its weights after every backward, so the planner and the
     * simulator must see it (SGD with momentum, the training default). */
    Optim *opts = calloc((size_t)nl, sizeof *opts);
    OptConfig oc = optim_defaults(OPT_SGD, 0.01f);
    oc.momentum = 0.9f;
    NnCtx **ctx = calloc((size_t)nl, sizeof *ctx);
    float **grad = calloc((size_t)nl + 1, sizeof *grad);   /* grad[i]: dL/d(input of layer i) */
    double *tf = calloc((size_t)nl * (size_t)iterations, sizeof(double));
    double *tb = calloc((size_t)nl * (size_t)iterations, sizeof(double));
    /* the split: BI and BW + step, on scratch gradients (sdx, sdw). Whichever of the whole and
     * the split backward runs second finds the layer's data in cache, so each is timed only in
     * the timed iterations where it runs first: the split in odd ones, the whole in even ones
     * (all of them without the split); nwh/nsp count the samples per layer. With one timed
     * iteration the split is not timed: a splitting layer gets half of backward each */
    double *tbi = calloc((size_t)nl * (size_t)iterations, sizeof(double));
    double *tbw = calloc((size_t)nl * (size_t)iterations, sizeof(double));
    double *tst = calloc((size_t)nl * (size_t)iterations, sizeof(double));   /* the optimizer step alone */
    int *nwh = calloc((size_t)nl, sizeof(int)), *nsp = calloc((size_t)nl, sizeof(int));
    size_t in_max = 1;
    for (int i = 0; i < nl; i++)
        if ((size_t)B * shape_numel(model_layer_in_shape(m, i)) > in_max) in_max = (size_t)B * shape_numel(model_layer_in_shape(m, i));
    float *sdx = split ? pd_alloc_f32(in_max) : NULL, *sdw = split ? pd_alloc_f32(np ? np : 1) : NULL;
    float keep[1];   /* a one-layer range keeps nothing: its output gradient is the caller's */
    PD_ASSERT(opts && ctx && grad && tf && tb && tbi && tbw && tst && nwh && nsp);
    for (int i = 0; i < nl; i++) {
        optim_init(&opts[i], &oc, model_param_count(m, i, i + 1));
        ctx[i] = nnctx_new(m, i, i + 1, B);
        if (ends) {
            PD_ASSERTF(i == 0 || !(ends[i] & NN_END_X) == !(ends[i - 1] & NN_END_Y), "layers %d, %d: the layouts between them differ",
                       i - 1, i);
            int ok = nnctx_set_ends(ctx[i], ends[i] & NN_END_X, ends[i] & NN_END_Y);
            PD_ASSERTF(ok, "layer %d cannot take the layouts 0x%x", i, (unsigned)ends[i]);
        }
        grad[i] = pd_alloc_f32((size_t)B * shape_numel(model_layer_in_shape(m, i)));
    }
    grad[nl] = pd_alloc_f32((size_t)rows * (size_t)classes);
    int total = warmup + iterations;
    double t_start = pd_now();
    for (int it = 0; it < total; it++) {
        NnRun run = {.n = B, .train = 1, .seed = 1, .minibatch = (uint64_t)it};
        const float *y = x;
        for (int i = 0; i < nl; i++) {
            size_t lo = (size_t)i * (size_t)iterations;
            size_t off = model_param_offset(m, i), soff = model_state_offset(m, i);
            double t0 = pd_now();
            y = model_forward(m, ctx[i], w + off, st + soff, y, &run);
            if (it >= warmup) tf[lo + (size_t)(it - warmup)] = pd_now() - t0;
        }
        memset(grad[nl], 0, (size_t)rows * (size_t)classes * sizeof(float));
        kern_xent_fwd_bwd(y, labels, grad[nl], rows, classes, 1.0f, NULL);
        for (int i = nl - 1; i >= 0; i--) {
            size_t lo = (size_t)i * (size_t)iterations;
            size_t off = model_param_offset(m, i);
            /* no input gradient below the first parameterised layer: the input stage's backward
             * skips it (model_backward without dx), so the profile does too */
            float *dx = model_param_offset(m, i) > 0 ? grad[i] : NULL;
            if (dx) memset(dx, 0, (size_t)B * shape_numel(model_layer_in_shape(m, i)) * sizeof(float));
            int timed = it >= warmup, split_first = split && timed && ((it - warmup) & 1);
            double bi = 0, bw = 0;
            if (split) {   /* with the same weights as the whole one: BI, then BW */
                PD_ASSERT(model_split_floats(m, i, i + 1, B) == 0);
                if (!split_first) {   /* the whole one first */
                    model_backward(m, ctx[i], w + off, grad[i + 1], dx, dw + off);
                    if (dx) memset(dx, 0, (size_t)B * shape_numel(model_layer_in_shape(m, i)) * sizeof(float));
                    if (opts[i].n) memset(dw + off, 0, opts[i].n * sizeof(float));
                }
                if (dx) memset(sdx, 0, (size_t)B * shape_numel(model_layer_in_shape(m, i)) * sizeof(float));
                double s0 = pd_now();
                model_backward_b(m, ctx[i], w + off, grad[i + 1], dx ? sdx : NULL, sdw + off, keep);
                double s1 = pd_now();
                model_backward_w(m, ctx[i], w + off, grad[i + 1], keep, sdw + off, NULL, NULL);
                bi = s1 - s0, bw = pd_now() - s1;
            }
            double t0 = pd_now();
            model_backward(m, ctx[i], w + off, grad[i + 1], dx, dw + off);
            double t1 = pd_now();
            if (opts[i].n) optim_step(&opts[i], w + off, dw + off);
            double t2 = pd_now();
            if (timed) tst[lo + (size_t)(it - warmup)] = t2 - t1;
            if (timed && split_first) {   /* the step's share goes with the weights */
                tbi[lo + (size_t)nsp[i]] = bi;
                tbw[lo + (size_t)nsp[i]++] = bw + (t2 - t1);
            }
            if (timed && !split_first) tb[lo + (size_t)nwh[i]++] = t2 - t0;
            if (opts[i].n) memset(dw + off, 0, opts[i].n * sizeof(float));
        }
        if (progress) {
            double el = pd_now() - t_start;
            fprintf(stderr, "\rprofiling %s: iteration %d/%d, %.1f s, ETA %.1f s   ", model_name(m), it + 1, total, el,
                    el / (it + 1) * (total - it - 1));
            if (it + 1 == total) fputc('\n', stderr);
        }
    }
    for (int i = 0; i < nl; i++) {
        fwd_s[i] = median(tf + (size_t)i * (size_t)iterations, iterations);
        bwd_s[i] = median(tb + (size_t)i * (size_t)iterations, nwh[i]);
        if (step_s) step_s[i] = opts[i].n ? median(tst + (size_t)i * (size_t)iterations, iterations) : 0;
        if (split && model_layer_splits(m, i) && nsp[i] > 0) {
            bwd_in_s[i] = median(tbi + (size_t)i * (size_t)iterations, nsp[i]);
            bwd_w_s[i] = median(tbw + (size_t)i * (size_t)iterations, nsp[i]);
        } else if (split && model_layer_splits(m, i)) {   /* split, but not timed (one timed
                                                             * iteration): half each, as the simulator
                                                             * assumes; BW > 0 says its gradient is kept */
            bwd_in_s[i] = bwd_w_s[i] = bwd_s[i] / 2;
        } else if (split) {   /* all of it in BI: nothing deferred, nothing kept */
            bwd_in_s[i] = bwd_s[i];
            bwd_w_s[i] = 0;
        }
        optim_release(&opts[i]);
        nnctx_free(ctx[i]);
    }
    for (int i = 0; i <= nl; i++) pd_free(grad[i]);
    free(opts);
    free(ctx);
    free(grad);
    free(tf);
    free(tb);
    free(tbi);
    free(tbw);
    free(tst);
    free(nwh);
    free(nsp);
    pd_free(sdx);
    pd_free(sdw);
    pd_free(dw);
}

_Static_assert(KSCR_COUNT <= PROFILE_SCRATCH_SLOTS, "a profile names every scratch slot");

/* Layer i's kernel scratch, by slot, built alone at batch n on a fresh arena of this thread
 * (what a stage's build asks for: kern_scratch's growth happens at build time). */
static int layer_scratch(const char *model_path, int prec, int i, int n, double *slots, Err *err) {
    Model *m = model_load(model_path, err);
    if (!m) return err->code;
    model_set_precision(m, prec);
    kern_scratch_release();
    int rc = model_build(m, i, i + 1, n, err);
    for (int k = 0; k < KSCR_COUNT && !rc; k++) slots[k] = (double)kern_scratch_slot_bytes(k);
    model_free(m);
    kern_scratch_release();
    return rc;
}

/* The profiler's passes that price the cuts (the layouts as model_cut_layouts gives them). */
typedef struct CutPasses {
    unsigned char *inside;   /* (nl) every layer's ends in the whole model */
    int n_pass;
    unsigned char *ends;     /* (n_pass x nl) each pass's layers' ends */
    int *pass, *lo, *hi;     /* (nl) per boundary c: its pass (-1: not a blocked one) and run */
} CutPasses;

static void cut_passes_release(CutPasses *p) {
    free(p->inside), free(p->ends), free(p->pass), free(p->lo), free(p->hi);
}

static CutPasses cut_passes(const Model *m, int nl) {
    CutPasses p = {.inside = calloc((size_t)nl, 1), .pass = malloc((size_t)nl * sizeof(int)),
                   .lo = calloc((size_t)nl, sizeof(int)), .hi = calloc((size_t)nl, sizeof(int))};
    unsigned char *one = calloc((size_t)nl * (size_t)nl, 1), *cut = calloc((size_t)nl, 1), *got = calloc((size_t)nl, 1);
    PD_ASSERT(p.inside && p.pass && p.lo && p.hi && one && cut && got);
    model_cut_layouts(m, 0, nl, NULL, p.inside);
    for (int c = 0; c < nl; c++) {   /* each blocked boundary cut alone: the run it changes */
        p.pass[c] = -1;
        if (c + 1 >= nl || !(p.inside[c] & NN_END_Y)) continue;
        unsigned char *e = one + (size_t)c * nl;
        cut[c] = 1;
        model_cut_layouts(m, 0, nl, cut, e);
        cut[c] = 0;
        p.lo[c] = c, p.hi[c] = c + 1;
        for (int i = 0; i < nl; i++)
            if (e[i] != p.inside[i]) p.lo[c] = i < p.lo[c] ? i : p.lo[c], p.hi[c] = i > p.hi[c] ? i : p.hi[c];
    }
    for (int c = 0; c + 1 < nl; c++) {   /* first fit: the first pass where it changes nothing of the others' */
        if (!(p.inside[c] & NN_END_Y)) continue;
        for (int k = 0; p.pass[c] < 0; k++) {
            if (k == p.n_pass) {   /* a new pass */
                p.ends = realloc(p.ends, (size_t)(k + 1) * nl);
                PD_ASSERT(p.ends);
                p.n_pass++;
            }
            memset(cut, 0, (size_t)nl);
            int fits = 1;
            for (int d = 0; d < c; d++) {
                if (p.pass[d] != k) continue;
                cut[d] = 1;
                fits &= p.hi[d] < p.lo[c];
            }
            if (!fits) continue;
            cut[c] = 1;
            model_cut_layouts(m, 0, nl, cut, got);
            for (int i = 0; i < nl && fits; i++) {   /* as each cut alone */
                int owner = -1;
                for (int d = 0; d <= c; d++)
                    if (cut[d] && p.lo[d] <= i && i <= p.hi[d]) owner = d;
                fits = got[i] == (owner < 0 ? p.inside[i] : one[(size_t)owner * nl + i]);
            }
            if (!fits) continue;
            p.pass[c] = k;
            memcpy(p.ends + (size_t)k * nl, got, (size_t)nl);
        }
    }
    free(one), free(cut), free(got);
    return p;
}

int rt_profile(const char *model_path, const RtProfileOpts *o, Profile *out, Err *err) {
    memset(out, 0, sizeof *out);
    if (o->minibatch < 1 || o->iterations < 1 || o->warmup < 0 || o->rounds < 0)
        return err_set(err, PD_EINVAL, "profile: minibatch, iterations and rounds must be >= 1");
    if (o->small_batch < 0 || (o->small_batch > 0 && o->small_batch >= o->minibatch))
        return err_set(err, PD_EINVAL, "profile: the small batch %d must be below the minibatch %d (0: none)",
                       o->small_batch, o->minibatch);
    Model *m = model_load(model_path, err);
    if (!m) return err->code;
    int nl = model_n_layers(m), B = o->minibatch, rc;
    if (o->threads > 0) kern_set_threads(o->threads);
    model_set_precision(m, o->precision);
    if ((rc = model_build(m, 0, nl, B, err))) {
        model_free(m);
        return rc;
    }
    Shape outs = model_layer_out_shape(m, nl - 1);
    int classes = 0, tpos = model_loss_positions(m, &classes), vocab = model_input_vocab(m);
    if (outs.ndim < 1 || outs.ndim > 2 || classes < 1) {
        model_free(m);
        return err_set(err, PD_EINVAL, "%s: the last layer's output is not logits, (classes) or (positions, classes)",
                       model_path);
    }
    size_t np = model_param_count(m, 0, nl), ns = model_state_count(m, 0, nl);
    float *w = pd_alloc_f32(np ? np : 1), *st = pd_alloc_f32(ns ? ns : 1);
    model_init_params(m, 0, nl, 1, w);
    model_init_state(m, 0, nl, st);
    Dataset syn;
    Shape in = model_input_shape(m);
    int c = in.ndim == 3 ? in.d[0] : 1, h = in.ndim >= 2 ? in.d[in.ndim - 2] : 1, wd = in.d[in.ndim - 1];
    if ((rc = data_synthetic((size_t)B, c, h, wd, classes, 5, &syn, err))) goto out;
    if (vocab > 0 || tpos > 1) {   /* token ids in [0, vocab) and a target per position: fixed patterns */
        int32_t *y = pd_alloc((size_t)B * (size_t)tpos * sizeof(int32_t));
        for (size_t i = 0; i < (size_t)B * (size_t)tpos; i++) y[i] = (int32_t)((i * 31 + 5) % (size_t)classes);
        if (vocab > 0)
            for (size_t i = 0; i < (size_t)B * shape_numel(in); i++) syn.x[i] = (float)((i * 131 + 7) % (size_t)vocab);
        pd_free(syn.y);
        syn.y = y, syn.y_len = tpos;
    }
    /* Rounds: this VM's single-core speed comes in spells (other tenants: the same build
     * measured 19 and 28 ms per step a minute apart, every layer slower alike), and a
     * prediction inherits whatever speed its profile saw. Each round times the nine per-layer
     * figures (forward, backward, its two passes, the step; the first four again at the small
     * batch, in the same round, so that both batches come from one spell); the round kept
     * whole is the median by the minibatch's total (the lower middle of an even count), or
     * the fastest. The median is what a run of a minute meets: `make demo`'s runs took
     * 1.12-1.37x their prediction from the fastest of 10 rounds, whose total was 5-14%
     * under the median round's (docs/explanation/experiments.md). */
    int rounds = o->rounds > 1 ? o->rounds : 1, b = o->small_batch;
    /* the layouts inside, and the cuts' passes: cut c (at a boundary the model keeps blocked)
     * changes the layouts of a run of layers [lo, hi]; a pass times a set of cuts whose runs
     * do not meet, laid out together as each alone (checked) */
    CutPasses cp = cut_passes(m, nl);
    const unsigned char *inside = cp.inside;
    const int PER = 9 + 2 * cp.n_pass;   /* figures per layer and round: 9, then each pass's forward and backward */
    if (cp.n_pass > 0) {
        int n_cut = 0;
        for (int c = 0; c < nl; c++) n_cut += cp.pass[c] >= 0;
        fprintf(stderr, "profile: %d cut%s priced in %d more pass%s per round\n", n_cut, n_cut == 1 ? "" : "s", cp.n_pass,
                cp.n_pass == 1 ? "" : "es");
    }
    double *buf = calloc(PER * (size_t)nl * (size_t)rounds, sizeof(double)), *totals = calloc((size_t)rounds, sizeof(double));
    int *order = calloc((size_t)rounds, sizeof(int));
    PD_ASSERT(buf && totals && order);
    for (int r = 0; r < rounds; r++) {
        double *t = buf + PER * (size_t)nl * (size_t)r;
        rt_time_layers_split(m, w, st, syn.x, syn.y, B, o->warmup, o->iterations, o->progress, inside, t, t + nl,
                             t + 2 * nl, t + 3 * nl, t + 4 * nl);
        if (b > 0)   /* the first b samples; the step's time is the minibatch's (it does not depend on the batch) */
            rt_time_layers_split(m, w, st, syn.x, syn.y, b, o->warmup, o->iterations, o->progress, inside, t + 5 * nl,
                                 t + 6 * nl, t + 7 * nl, t + 8 * nl, NULL);
        for (int k = 0; k < cp.n_pass; k++)
            rt_time_layers_split(m, w, st, syn.x, syn.y, B, o->warmup, o->iterations, o->progress,
                                 cp.ends + (size_t)k * nl, t + (9 + 2 * k) * nl, t + (10 + 2 * k) * nl, NULL, NULL, NULL);
        double total = 0, small = 0;
        for (int i = 0; i < nl; i++) total += t[i] + t[nl + i], small += t[5 * nl + i] + t[6 * nl + i];
        if (rounds > 1) {
            fprintf(stderr, "profile round %d/%d: %.6f ms per step", r + 1, rounds, 1e3 * total);
            if (b > 0) fprintf(stderr, ", %.6f ms at %d samples", 1e3 * small, b);
            fputc('\n', stderr);
        }
        totals[r] = total;
        /* insertion into order, by total (stable: an earlier round first among equals) */
        int k = r;
        while (k > 0 && totals[order[k - 1]] > total) order[k] = order[k - 1], k--;
        order[k] = r;
    }
    int kept = order[o->keep_fastest ? 0 : (rounds - 1) / 2];
    if (rounds > 1)
        fprintf(stderr, "profile: kept round %d, the %s (%.6f ms per step)\n", kept + 1,
                o->keep_fastest ? "fastest" : "median", 1e3 * totals[kept]);
    const double *best = buf + PER * (size_t)nl * (size_t)kept;
    free(totals);
    free(order);
    const double *fwd = best, *bwd = best + nl, *bwd_in = best + 2 * nl, *bwd_w = best + 3 * nl, *step = best + 4 * nl;
    const double *sfwd = best + 5 * nl, *sbwd = best + 6 * nl, *sbwd_in = best + 7 * nl, *sbwd_w = best + 8 * nl;
    /* the profile */
    snprintf(out->model, sizeof out->model, "%s", model_name(m));
    out->minibatch = B;
    snprintf(out->source, sizeof out->source, "pipedream-profile");
    snprintf(out->measured_on, sizeof out->measured_on, "%s", o->measured_on ? o->measured_on : "");
    out->threads = o->threads;
    out->iterations = o->iterations;
    out->rounds = rounds;
    if (rounds > 1) snprintf(out->round_kept, sizeof out->round_kept, "%s", o->keep_fastest ? "fastest" : "median");
    out->input_bytes = 4.0 * B * (double)shape_numel(in);
    out->n_layers = nl;
    out->layers = calloc((size_t)nl, sizeof(ProfileLayer));
    PD_ASSERT(out->layers);
    for (int i = 0; i < nl; i++) {
        ProfileLayer *L = &out->layers[i];
        snprintf(L->name, sizeof L->name, "layers.%d", i);
        snprintf(L->type, sizeof L->type, "%s", model_layer_type(m, i));
        L->fwd_s = fwd[i];
        L->bwd_s = bwd[i];
        L->bwd_in_s = bwd_in[i];
        L->bwd_w_s = bwd_w[i];
        L->step_s = step[i] < bwd[i] ? step[i] : bwd[i];   /* a part of backward_s (medians apart) */
        L->act_bytes = 4.0 * B * (double)shape_numel(model_layer_out_shape(m, i));
        L->param_bytes = 4.0 * (double)model_param_count(m, i, i + 1);
        /* what the runtime's context holds for it (nnctx_new), so the simulator's memory
         * prediction counts what the runtime allocates */
        L->saved_bytes = (double)model_layer_saved_bytes(m, i, B);
        if (b > 0) {   /* the same times at the small batch */
            L->small_fwd_s = sfwd[i], L->small_bwd_s = sbwd[i];
            L->small_bwd_in_s = sbwd_in[i], L->small_bwd_w_s = sbwd_w[i];
        }
    }
    /* the cuts' prices, from the pass that timed cut c: what the layers of its run on each side
     * took over their times inside, charged to the stage that ends or begins there; no less
     * than nothing */
    for (int c = 0; c + 1 < nl; c++) {
        if (cp.pass[c] < 0) continue;
        const double *cf = best + (9 + 2 * cp.pass[c]) * nl, *cb = best + (10 + 2 * cp.pass[c]) * nl;
        double f[2] = {0, 0}, g[2] = {0, 0};
        for (int i = cp.lo[c]; i <= cp.hi[c]; i++) f[i > c] += cf[i] - fwd[i], g[i > c] += cb[i] - bwd[i];
        ProfileLayer *L = &out->layers[c], *R = &out->layers[c + 1];
        L->cut_out_fwd_s = less(f[0], 0), L->cut_out_bwd_s = less(g[0], 0);
        R->cut_in_fwd_s = less(f[1], 0), R->cut_in_bwd_s = less(g[1], 0);
    }
    cut_passes_release(&cp);
    out->saved_measured = 1;
    out->small_batch = b;
    /* the kernels' scratch each layer asks for, at B and at one sample (the ledger counts the
     * stage's arena: RtMem.scratch); the timing's arena is let go first */
    kern_scratch_release();
    for (int i = 0; i < nl && !rc; i++) {
        double s[2][KSCR_COUNT] = {{0}};
        rc = layer_scratch(model_path, o->precision, i, B, s[0], err);
        if (!rc) rc = layer_scratch(model_path, o->precision, i, 1, s[1], err);
        for (int k = 0; k < KSCR_COUNT && !rc; k++)
            out->layers[i].scratch[k][0] = s[0][k], out->layers[i].scratch[k][1] = s[1][k];
    }
    if (rc) profile_release(out);
    free(buf);
    data_release(&syn);
out:
    pd_free(w);
    pd_free(st);
    model_free(m);
    return rc;
}
