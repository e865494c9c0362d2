/* cmd_plan.c: `pipedream plan`: partitions a profile over a cluster (plan_new), lets the
 * simulator choose among the partitioner's candidates (plan_choose, src/sim/choose.c), prints
 * the table and writes the plan JSON; with --choose-schedule it searches schedules too
 * (plan_search, src/sim/search.c). Parses flags only; the work is in src/plan and src/sim. */
#include "choose.h"
#include "cli.h"
#include "plan.h"
#include "profile.h"
#include "search.h"

#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f,
            "usage: pipedream plan PROFILE (--cluster CLUSTER.json | --workers N1[,N2,...] --bandwidth B1[,B2,...])\n"
            "                      [--straight] [--memory-limit BYTES] [--allow-idle]\n"
            "                      [--activation-compression R] [--cost-model ours|pipedream]\n"
            "                      [--overlap-allreduce] [--max-states N] [--chunks V [--pipelines D]] [--v-shape]\n"
            "                      [--units-per-step M]\n"
            "                      [--cores N] [--net-cpu S] [--core-efficiency E] [--exhaustive N] [--explain] [--no-simulate] [--pick K]\n"
            "                      [-o PLAN.json]\n"
            "       pipedream plan PROFILE ... --choose-schedule [--memory-limit BYTES] [--kinds K1,K2,...]\n"
            "                      [--microbatches X1,X2,...] [--max-chunks V] [--recompute yes|no|both]\n"
            "                      [--optimizer sgd|adam|adamw] [--exhaustive N] [-o PLAN.json]\n\n"
            "Splits the model of PROFILE (our profile JSON or the authors' graph.txt) into pipeline\n"
            "stages with data-parallel replicas, minimising the predicted time per minibatch.\n"
            "Levels are innermost first: --workers 4,4 --bandwidth 1e10,1.25e9 is 4 workers per\n"
            "server at 10 GB/s, 4 servers at 1.25 GB/s. Bandwidths in bytes/s (one level: 1e9 if\n"
            "omitted, as in the authors' optimizer).\n\n"
            "The dynamic program proposes; the simulator disposes: its plan, the straight split, data\n"
            "parallelism, its plan under other options and, when there are few enough, every plan are each\n"
            "simulated under 1f1b on the cluster, and the fastest whose simulated peak memory fits\n"
            "--memory-limit is written (our cost model; --cost-model pipedream, --chunks, --allow-idle\n"
            "and --no-simulate write the dynamic program's plan as it is).\n\n"
            "  --straight                 no replication: one worker per stage\n"
            "  --explain                  say why the choice won: what its time per minibatch goes to\n"
            "                             (compute, all-reduce, transfers, bubble), the runner-up's and the\n"
            "                             planner's own plan's, and the memory\n"
            "  --no-simulate              write the dynamic program's plan without simulating candidates\n"
            "  --pick K                   write the K-th candidate of the printed list (1 = the\n"
            "                             choice) instead of the choice: to measure the runners-up\n"
            "  --units-per-step M         the schedule steps once per M units (M micro-batches per\n"
            "                             minibatch: gpipe, 1f1b-flush, 2bw, zb): the profile's optimizer\n"
            "                             step (step_s) counts once per M units, not in each (default 1);\n"
            "                             candidates are simulated under 1f1b with M micro-batches per step\n"
            "  --cores N                  cores per machine (a level-0 group of workers); the simulator\n"
            "                             slows compute by workers/cores when more workers share them\n"
            "                             (default: the cluster file's cores_per_machine, else one each)\n"
            "  --net-cpu S                seconds of CPU a byte moved between workers costs their shared\n"
            "                             cores (with --cores; hosts emulated on one machine: measure it\n"
            "                             with tools/cluster.sh net-cpu; default: the cluster file's\n"
            "                             net_cpu_per_byte, else 0)\n"
            "  --core-efficiency E        each core's speed while every core of a machine computes,\n"
            "                             relative to one computing alone, in (0, 1] (with --cores;\n"
            "                             measure it with bench/core_efficiency.sh; default: the\n"
            "                             cluster file's core_efficiency, else 1)\n"
            "  --memory-limit BYTES       per-worker memory constraint (default: the cluster file's\n"
            "                             memory_per_worker; 0 = none)\n"
            "  --allow-idle               allow plans that leave workers idle (--use_fewer_machines)\n"
            "  --wire CODEC               the codec of the activations between stages (train --wire):\n"
            "                             fp32, bf16 (as --activation-compression 2), int8, int4, delta;\n"
            "                             other than fp32 and bf16 the plan records it per boundary;\n"
            "                             auto: per boundary and direction the first of --wire-allow\n"
            "                             (fp32, bf16, int8, int4, delta, in that order) whose bytes cross\n"
            "                             the link in no more time than the slowest stage's compute\n"
            "  --wire-grad CODEC          the gradients' codec (default: as --wire; fp32 after delta)\n"
            "  --wire-allow LIST          the codecs --wire auto may pick (default: all)\n"
            "  --error-feedback           gradients carry their quantization error (costed as such)\n"
            "  --activation-compression R divide activation transfers by R (pipedream model: without\n"
            "                             it transfers are ignored, as in the authors' optimizer)\n"
            "  --cost-model KIND          ours (default) or pipedream (the authors' optimizer, exactly)\n"
            "  --overlap-allreduce        ours: all-reduce overlaps compute (max instead of sum)\n"
            "  --max-states N             limit on cut states of a DAG profile (default 4000000)\n"
            "  --chunks V                 an interleaved plan: V x P stages on P positions, d replicas\n"
            "                             each (P d = workers, the d predicted fastest; --straight: 1),\n"
            "                             replica j of stage i on rank (i mod P) d + j (--schedule\n"
            "                             interleaved)\n"
            "  --pipelines D              with --chunks: d = D data-parallel pipelines, not the\n"
            "                             planner's choice (D divides the workers, 2 or more each)\n"
            "  --v-shape                  a V-placed plan: 2 P stages on P positions, position i holding\n"
            "                             stages i and 2P-1-i (chunks 2; --schedule zb-v, v-half, v-min,\n"
            "                             dualpipe-v); with --pipelines D as --chunks\n"
            "  --choose-schedule          search partition x replication x schedule kind x micro-batches\n"
            "                             x chunks x recomputation for the fastest simulated plan whose\n"
            "                             worst worker's peak memory fits --memory-limit; prints the\n"
            "                             choice, the runner-up and what the limit cost; the plan\n"
            "                             written records the schedule (simulate uses it)\n"
            "  --kinds K1,K2,...          kinds to consider (default 1f1b, gpipe, 1f1b-flush, 2bw, dp,\n"
            "                             zb-h1, zb-h2, interleaved, zb-v, v-half, v-min, dualpipe-v)\n"
            "  --microbatches X1,X2,...   micro-batches per minibatch as multiples of the workers\n"
            "                             (default 1,2,4)\n"
            "  --max-chunks V             interleaved plans with 2..V chunks (default 4)\n"
            "  --recompute yes|no|both    recomputation settings to consider (default both)\n"
            "  --optimizer NAME          optimizer state in the memory (sgd with momentum, the default; adam, adamw: two)\n"
            "  --exhaustive N             score every plan when there are at most N (default 2000 with\n"
            "                             --choose-schedule, 10000 without; 0: never)\n"
            "  --candidates               also print every candidate scored\n"
            "  -o PLAN.json               write the plan (docs/reference/formats.md)\n");
}

/* Parses "a,b,c" into up to PD_MAX_LEVELS numbers; returns the count, or -1 (usage error printed). */
static int parse_list(const char *opt, const char *s, int ints, double *out) {
    int n = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == PD_MAX_LEVELS) {
            cli_usage_error("plan", "%s: at most %d levels", opt, PD_MAX_LEVELS);
            return -1;
        }
        if (ints) {
            int v;
            if (cli_parse_int("plan", opt, tok, 1, 1 << 20, &v)) return -1;
            out[n++] = v;
        } else {
            if (cli_parse_double("plan", opt, tok, 0, 1e300, &out[n])) return -1;
            if (!(out[n] > 0)) {
                cli_usage_error("plan", "%s: bandwidth must be > 0 bytes/s, got \"%s\"", opt, tok);
                return -1;
            }
            n++;
        }
    }
    if (n == 0) cli_usage_error("plan", "%s needs a comma-separated list", opt);
    return n > 0 ? n : -1;
}

/* --wire, --wire-grad, --wire-allow, --error-feedback: the codecs the plan records per
 * boundary (none recorded: fp32 and bf16 both ways, which --activation-compression covers). */
typedef struct WireChoice {
    int act, grad;     /* PLAN_WIRE_* (train's RT_WIRE_*); act -2: auto; grad -1: as act (fp32 after delta) */
    unsigned allow;    /* auto: a bit per codec */
    int error_feedback;
} WireChoice;

/* Records wc's codecs in p (auto: sim_wire_auto's choice on p's 1f1b costs from prof) and
 * prints them. */
static int wire_apply(Plan *p, const Profile *prof, const Cluster *cl, const WireChoice *wc, Err *err) {
    int grad = wc->grad >= 0 ? wc->grad : wc->act == 4 ? 0 : wc->act;
    if (wc->act != -2 && wc->act <= 1 && grad == wc->act && !wc->error_feedback) return PD_OK;
    if (p->chunks > 1) return err_set(err, PD_EINVAL, "--wire per boundary: not for an interleaved plan");
    free(p->wire);
    p->wire = calloc(2 * (size_t)p->n_stages, sizeof(int));
    PD_ASSERT(p->wire);
    int rc = PD_OK;
    if (wc->act == -2) {
        SchedOpts so = {.kind = SCHED_1F1B, .n_minibatches = 4, .n_micro = 1};
        Schedule s;
        SimCosts c = {0, NULL};
        if ((rc = sched_build(p, &so, &s, err))) return rc;
        if (!(rc = sim_costs_from_profile(&s, prof, &c, err)))
            rc = sim_wire_auto(&s, &c, cl, wc->allow, wc->error_feedback, p->wire, err);
        sim_costs_release(&c);
        sched_release(&s);
        if (rc) return rc;
        if (wc->grad >= 0)
            for (int b = 0; b + 1 < p->n_stages; b++) p->wire[2 * b + 1] = wc->grad;
    } else {
        for (int b = 0; b + 1 < p->n_stages; b++) p->wire[2 * b] = wc->act, p->wire[2 * b + 1] = grad;
    }
    printf("wire:");
    for (int b = 0; b + 1 < p->n_stages; b++)
        printf("%s boundary %d %s / %s", b ? "," : "", b, plan_wire_name(p->wire[2 * b]), plan_wire_name(p->wire[2 * b + 1]));
    printf(" (activations / gradients)\n");
    return PD_OK;
}

/* --choose-schedule: the search, its report, the chosen plan's table; -o writes it with the
 * schedule recorded. Releases prof. */
static int choose_schedule(Profile *prof, const Cluster *cl, const PlanOpts *o, SearchOpts *so, const char *out_path,
                           int show_all, const WireChoice *wc) {
    Err err = {0};
    so->memory_limit = o->memory_limit;
    so->plan = *o;
    SearchResult r;
    int rc = CLI_OK;
    if (plan_search(prof, cl, so, &r, &err)) {
        profile_release(prof);
        return cli_fail(&err);
    }
    if (show_all) plan_search_print_all(&r, stdout);
    if (!r.found) {
        plan_search_print(&r, stdout);
        err_set(&err, PD_EINVAL, "no plan fits %.4g bytes per worker (see above for the fastest candidate)", o->memory_limit);
        rc = cli_fail(&err);
    } else {
        Plan *best = (Plan *)r.best.plan;   /* owned by r: annotate, print, write */
        snprintf(best->schedule, sizeof best->schedule, "%s", sched_kind_name(r.best.kind));
        best->schedule_micro = r.best.n_micro;
        best->schedule_recompute = r.best.recompute;
        best->opts.memory_limit = o->memory_limit;
        if (wire_apply(best, prof, cl, wc, &err)) {
            plan_search_release(&r);
            profile_release(prof);
            return cli_fail(&err);
        }
        plan_print(best, stdout);
        printf("\n");
        plan_search_print(&r, stdout);
        if (out_path) {
            if (plan_save(best, out_path, &err)) rc = cli_fail(&err);
            else printf("wrote %s\n", out_path);
        }
    }
    plan_search_release(&r);
    profile_release(prof);
    return rc;
}

/* The plain plan: the partitioner's candidates scored by the simulator (plan_choose); prints the
 * chosen plan's table and the candidates, writes the choice. prof has its step spread over
 * units_per_step units (the partitioner's view); the simulator runs the profile as measured with
 * that many micro-batches per step. Releases prof. */
static int simulate_choice(const char *profile_path, Profile *prof, int units_per_step, const Cluster *cl,
                           const PlanOpts *o, int exhaustive, int explain, int pick, const char *out_path,
                           const WireChoice *wc) {
    Err err = {0};
    Profile raw, *sim_prof = prof;
    if (units_per_step > 1) {
        if (profile_load(profile_path, &raw, &err)) {
            profile_release(prof);
            return cli_fail(&err);
        }
        sim_prof = &raw;
    }
    ChooseOpts co = {.kind = SCHED_1F1B, .n_micro = units_per_step, .exhaustive = exhaustive, .plan = *o};
    ChooseResult r;
    int rc = CLI_OK;
    if (plan_choose(prof, sim_prof, cl, &co, &r, &err)) {
        err_prefix(&err, "%s", profile_path);
        rc = cli_fail(&err);
    } else if (pick > r.n) {
        rc = cli_usage_error("plan", "--pick %d: only %d candidates were simulated", pick, r.n);
        plan_choose_release(&r);
    } else {
        if (pick) r.picked = pick - 1;
        const ChooseCand *c = &r.c[pick ? pick - 1 : r.chosen];
        Plan *p = c->plan;   /* owned by r: annotate, print, write */
        p->opts.memory_limit = o->memory_limit;   /* the limit the choice was held to */
        if (c->score.unit_s < 1e300) {
            snprintf(p->sim_schedule, sizeof p->sim_schedule, "%s", sched_kind_name(r.kind));
            p->sim_micro = r.n_micro;
            p->sim_s = c->score.unit_s;
            p->sim_samples_per_s = r.samples_per_unit / c->score.unit_s;
        }
        /* a link's latency stalls 1f1b at NOAM depth: the smallest depth near the best (3 %) */
        SearchCand d;
        if (c->score.unit_s < 1e300 && r.kind == SCHED_1F1B &&
            plan_search_depth(p, sim_prof, cl, r.n_micro, co.opt_state_factor, o->memory_limit, 0.03, &d, &err) == PD_OK &&
            d.inflight > 0) {
            snprintf(p->schedule, sizeof p->schedule, "%s", sched_kind_name(r.kind));
            p->schedule_micro = r.n_micro > 0 ? r.n_micro : 1;
            p->schedule_inflight = d.inflight;
            printf("in flight: %d units at stage 0 (NOAM %d: %.3f ms per minibatch; %d: %.3f ms, simulated)\n",
                   d.inflight, p->noam, c->score.unit_s * 1e3, d.inflight, d.unit_s * 1e3);
            p->sim_s = d.unit_s;
            p->sim_samples_per_s = r.samples_per_unit / d.unit_s;
        }
        if (wire_apply(p, sim_prof, cl, wc, &err)) {
            rc = cli_fail(&err);
            plan_choose_release(&r);
            if (sim_prof != prof) profile_release(&raw);
            profile_release(prof);
            return rc;
        }
        plan_print(p, stdout);
        printf("\n");
        plan_choose_print(&r, 5, explain, sim_prof, cl, co.opt_state_factor, stdout);
        if (pick && pick - 1 != r.chosen)
            printf("picked: candidate %d (%s), %.1f%% slower than the choice (simulated)\n", pick, c->source,
                   100 * (c->score.unit_s / r.c[r.chosen].score.unit_s - 1));
        if (out_path) {
            if (plan_save(p, out_path, &err)) rc = cli_fail(&err);
            else printf("wrote %s\n", out_path);
        }
        plan_choose_release(&r);
    }
    if (sim_prof != prof) profile_release(&raw);
    profile_release(prof);
    return rc;
}

int cmd_plan(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        help(stdout);
        return CLI_OK;
    }
    const char *profile_path = NULL, *cluster_path = NULL, *out_path = NULL;
    double workers[PD_MAX_LEVELS], bw[PD_MAX_LEVELS];
    int n_workers = 0, n_bw = 0, have_mem = 0, cores = 0, units_per_step = 1;
    double net_cpu = -1, core_eff = -1;
    PlanOpts o;
    memset(&o, 0, sizeof o);
    o.cost_model = COST_OURS;
    SearchOpts so;
    memset(&so, 0, sizeof so);
    int choose = 0, search_flags = 0, show_all = 0, explain = 0, no_sim = 0, pick = 0;
    WireChoice wc = {.act = 0, .grad = -1, .allow = (1u << PLAN_WIRE_COUNT) - 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--cluster")) {
            if (!(cluster_path = cli_value("plan", argc, argv, &i))) return CLI_USAGE;
        } else if (!strcmp(a, "--workers")) {
            if (!(v = cli_value("plan", argc, argv, &i)) || (n_workers = parse_list(a, v, 1, workers)) < 0)
                return CLI_USAGE;
        } else if (!strcmp(a, "--bandwidth")) {
            if (!(v = cli_value("plan", argc, argv, &i)) || (n_bw = parse_list(a, v, 0, bw)) < 0) return CLI_USAGE;
        } else if (!strcmp(a, "--straight")) {
            o.straight = 1;
        } else if (!strcmp(a, "--explain")) {
            explain = 1;
        } else if (!strcmp(a, "--no-simulate")) {
            no_sim = 1;
        } else if (!strcmp(a, "--pick")) {
            if (!(v = cli_value("plan", argc, argv, &i)) || cli_parse_int("plan", a, v, 1, 1 << 30, &pick))
                return CLI_USAGE;
        } else if (!strcmp(a, "--allow-idle")) {
            o.allow_idle = 1;
        } else if (!strcmp(a, "--overlap-allreduce")) {
            o.overlap_allreduce = 1;
        } else if (!strcmp(a, "--units-per-step")) {
            if (!(v = cli_value("plan", argc, argv, &i)) || cli_parse_int("plan", a, v, 1, 1 << 16, &units_per_step))
                return CLI_USAGE;
        } else if (!strcmp(a, "--cores")) {
            if (!(v = cli_value("plan", argc, argv, &i)) || cli_parse_int("plan", a, v, 1, 1 << 20, &cores))
                return CLI_USAGE;
        } else if (!strcmp(a, "--core-efficiency")) {
            if (!(v = cli_value("plan", argc, argv, &i)) || cli_parse_double("plan", a, v, 1e-3, 1, &core_eff))
                return CLI_USAGE;
        } else if (!strcmp(a, "--net-cpu")) {
            if (!(v = cli_value("plan", argc, argv, &i)) || cli_parse_double("plan", a, v, 0, 1, &net_cpu))
                return CLI_USAGE;
        } else if (!strcmp(a, "--memory-limit")) {
            if (!(v = cli_value("plan", argc, argv, &i)) || cli_parse_double("plan", a, v, 0, 1e300, &o.memory_limit))
                return CLI_USAGE;
            have_mem = 1;
        } else if (!strcmp(a, "--activation-compression")) {
            if (!(v = cli_value("plan", argc, argv, &i)) ||
                cli_parse_double("plan", a, v, 1e-300, 1e300, &o.activation_compression))
                return CLI_USAGE;
        } else if (!strcmp(a, "--wire")) {   /* train --wire bf16: half the bytes on every link */
            if (!(v = cli_value("plan", argc, argv, &i))) return CLI_USAGE;
            wc.act = !strcmp(v, "auto") ? -2 : plan_wire_parse(v);
            if (wc.act == -1) return cli_usage_error("plan", "--wire: unknown \"%s\" (fp32, bf16, int8, int4, delta, auto)", v);
            /* the partitioner sees the codec's bytes as a compression of every transfer */
            static const double ratio[PLAN_WIRE_COUNT] = {0, 2, 4 / 1.0625, 4 / 0.5625, 4 / 0.5625};
            o.activation_compression = wc.act >= 0 ? ratio[wc.act] : 0;
        } else if (!strcmp(a, "--wire-grad")) {
            if (!(v = cli_value("plan", argc, argv, &i))) return CLI_USAGE;
            if ((wc.grad = plan_wire_parse(v)) < 0 || wc.grad == 4)
                return cli_usage_error("plan", "--wire-grad: unknown \"%s\" (fp32, bf16, int8, int4)", v);
        } else if (!strcmp(a, "--wire-allow")) {
            if (!(v = cli_value("plan", argc, argv, &i))) return CLI_USAGE;
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            wc.allow = 0;
            for (char *sv = NULL, *t = strtok_r(buf, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
                int k = plan_wire_parse(t);
                if (k < 0) return cli_usage_error("plan", "--wire-allow: unknown codec \"%s\" (fp32, bf16, int8, int4, delta)", t);
                wc.allow |= 1u << k;
            }
        } else if (!strcmp(a, "--error-feedback")) {
            wc.error_feedback = 1;
        } else if (!strcmp(a, "--cost-model")) {
            if (!(v = cli_value("plan", argc, argv, &i))) return CLI_USAGE;
            o.cost_model = plan_cost_model_parse(v);
            if (o.cost_model == COST_COUNT)
                return cli_usage_error("plan", "--cost-model: unknown kind \"%s\" (ours, pipedream)", v);
        } else if (!strcmp(a, "--max-states")) {
            int m;
            if (!(v = cli_value("plan", argc, argv, &i)) || cli_parse_int("plan", a, v, 1, 2000000000, &m))
                return CLI_USAGE;
            o.max_states = m;
        } else if (!strcmp(a, "--chunks")) {
            if (!(v = cli_value("plan", argc, argv, &i)) || cli_parse_int("plan", a, v, 1, SCHED_MAX_CHUNKS, &o.chunks)) return CLI_USAGE;
        } else if (!strcmp(a, "--v-shape")) {
            o.v_shape = 1;
        } else if (!strcmp(a, "--pipelines")) {
            if (!(v = cli_value("plan", argc, argv, &i)) || cli_parse_int("plan", a, v, 1, 1 << 20, &o.pipelines))
                return CLI_USAGE;
        } else if (!strcmp(a, "--choose-schedule")) {
            choose = 1;
        } else if (!strcmp(a, "--candidates")) {
            show_all = search_flags = 1;
        } else if (!strcmp(a, "--kinds")) {
            if (!(v = cli_value("plan", argc, argv, &i))) return CLI_USAGE;
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *sv = NULL, *t = strtok_r(buf, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
                SchedKind k;
                if (sched_kind_parse(t, &k) || k == SCHED_MP || !strcmp(t, "asp"))
                    return cli_usage_error("plan", "--kinds: unknown or unsearchable kind \"%s\"", t);
                so.kinds |= 1u << k;
            }
            search_flags = 1;
        } else if (!strcmp(a, "--microbatches")) {
            double x[PD_MAX_LEVELS];
            int n;
            if (!(v = cli_value("plan", argc, argv, &i)) || (n = parse_list(a, v, 1, x)) < 0) return CLI_USAGE;
            so.n_micro = n;
            for (int k = 0; k < n; k++) so.micro[k] = (int)x[k];
            search_flags = 1;
        } else if (!strcmp(a, "--max-chunks")) {
            if (!(v = cli_value("plan", argc, argv, &i)) || cli_parse_int("plan", a, v, 1, SCHED_MAX_CHUNKS, &so.max_chunks))
                return CLI_USAGE;
            search_flags = 1;
        } else if (!strcmp(a, "--recompute")) {
            if (!(v = cli_value("plan", argc, argv, &i))) return CLI_USAGE;
            if (!strcmp(v, "both")) so.recompute = 0;
            else if (!strcmp(v, "no")) so.recompute = 1;
            else if (!strcmp(v, "yes")) so.recompute = 2;
            else return cli_usage_error("plan", "--recompute: \"%s\" (yes, no, both)", v);
            search_flags = 1;
        } else if (!strcmp(a, "--optimizer")) {
            if (!(v = cli_value("plan", argc, argv, &i))) return CLI_USAGE;
            if (!strcmp(v, "sgd")) so.opt_state_factor = 1;
            else if (!strcmp(v, "adam") || !strcmp(v, "adamw")) so.opt_state_factor = 2;
            else return cli_usage_error("plan", "--optimizer: unknown \"%s\" (sgd, adam, adamw)", v);
            search_flags = 1;
        } else if (!strcmp(a, "--exhaustive")) {
            if (!(v = cli_value("plan", argc, argv, &i)) || cli_parse_int("plan", a, v, 0, 1000000, &so.exhaustive))
                return CLI_USAGE;
            if (so.exhaustive == 0) so.exhaustive = -1;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!(out_path = cli_value("plan", argc, argv, &i))) return CLI_USAGE;
        } else if (a[0] == '-' && a[1]) {
            return cli_usage_error("plan", "unknown option \"%s\"", a);
        } else if (!profile_path) {
            profile_path = a;
        } else {
            return cli_usage_error("plan", "unexpected argument \"%s\"", a);
        }
    }
    if (!profile_path) return cli_usage_error("plan", "missing PROFILE");
    if (o.v_shape && o.chunks && o.chunks != 2) return cli_usage_error("plan", "--v-shape places 2 chunks per worker");
    if (o.v_shape) o.chunks = 2;
    if (o.pipelines && o.chunks < 2) return cli_usage_error("plan", "--pipelines goes with --chunks V (V >= 2)");
    if (search_flags && !choose)
        return cli_usage_error("plan", "--kinds, --microbatches, --max-chunks, --recompute, --optimizer and "
                               "--candidates go with --choose-schedule");
    if (choose && (explain || no_sim))
        return cli_usage_error("plan", "--explain and --no-simulate go with the plain plan, not --choose-schedule "
                               "(it prints its own reasons)");
    if (explain && !choose && (no_sim || o.cost_model != COST_OURS || o.chunks || o.allow_idle))
        return cli_usage_error("plan", "--explain needs the simulator's choice (not with --no-simulate, --cost-model "
                               "pipedream, --chunks or --allow-idle)");
    if (pick && (choose || no_sim || o.cost_model != COST_OURS || o.chunks || o.allow_idle))
        return cli_usage_error("plan", "--pick takes a candidate of the simulator's list (not with --choose-schedule, "
                               "--no-simulate, --cost-model pipedream, --chunks or --allow-idle)");
    if (choose && (o.cost_model != COST_OURS || o.straight || o.allow_idle || o.chunks))
        return cli_usage_error("plan", "--choose-schedule searches our cost model's plans itself (no --cost-model "
                               "pipedream, --straight, --allow-idle or --chunks)");
    Cluster cl;
    memset(&cl, 0, sizeof cl);
    Err err = {0};
    if (cluster_path) {
        if (n_workers || n_bw) return cli_usage_error("plan", "give either --cluster or --workers/--bandwidth, not both");
        if (cluster_load(cluster_path, &cl, &err)) return cli_fail(&err);
        if (!have_mem) o.memory_limit = cl.memory_per_worker;
        if (cores) cl.cores_per_machine = cores;
        if (net_cpu >= 0) cl.net_cpu_per_byte = net_cpu;
        if (core_eff > 0) cl.core_efficiency = core_eff;
    } else {
        if (!n_workers) return cli_usage_error("plan", "give --cluster FILE or --workers N1[,N2,...]");
        if (n_bw == 0 && n_workers == 1) bw[n_bw++] = 1e9;
        if (n_bw != n_workers)
            return cli_usage_error("plan", "%d levels of --workers but %d --bandwidth values (one per level)",
                                   n_workers, n_bw);
        cl.n_levels = n_workers;
        for (int l = 0; l < n_workers; l++) cl.level[l] = (ClusterLevel){(int)workers[l], bw[l], 0};
        cl.memory_per_worker = o.memory_limit;
        cl.cores_per_machine = cores;
        cl.net_cpu_per_byte = net_cpu > 0 ? net_cpu : 0;
        cl.core_efficiency = core_eff > 0 ? core_eff : 0;
        if (cluster_check(&cl, &err)) return cli_fail(&err);
    }
    Profile prof;
    if (profile_load(profile_path, &prof, &err)) return cli_fail(&err);
    profile_spread_step(&prof, units_per_step);
    if (choose) return choose_schedule(&prof, &cl, &o, &so, out_path, show_all, &wc);
    if (!no_sim && o.cost_model == COST_OURS && !o.chunks && !o.allow_idle)
        return simulate_choice(profile_path, &prof, units_per_step, &cl, &o, so.exhaustive, explain, pick, out_path, &wc);
    Plan *p = plan_new(&prof, &cl, &o, &err);
    if (!p) {
        err_prefix(&err, "%s", profile_path);
        profile_release(&prof);
        return cli_fail(&err);
    }
    int rc = CLI_OK;
    if (wire_apply(p, &prof, &cl, &wc, &err)) {
        plan_free(p);
        profile_release(&prof);
        return cli_fail(&err);
    }
    plan_print(p, stdout);
    if (out_path) {
        if (plan_save(p, out_path, &err)) rc = cli_fail(&err);
        else printf("wrote %s\n", out_path);
    }
    plan_free(p);
    profile_release(&prof);
    return rc;
}
