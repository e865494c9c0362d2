/* cmd_simulate.c: `pipedream simulate`: builds a schedule of a plan (src/schedule) and
 * runs it in the discrete-event simulator (src/sim) against a profile and a cluster;
 * prints a summary table or JSON, optionally the instruction lists, an SVG timeline and a
 * Chrome trace. Parses flags only; the work is in src/schedule and src/sim. */
#include "cli.h"
#include "plan.h"
#include "profile.h"
#include "schedule.h"
#include "sim.h"

#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f,
            "usage: pipedream simulate PLAN.json --profile PROFILE [--cluster CLUSTER.json]\n"
            "                          [--schedule KIND] [--minibatches N] [--microbatches M]\n"
            "                          [--vertical-sync] [--recompute] [--chunks V] [--optimizer sgd|adam|adamw] [--wire CODEC] [--wire-grad CODEC]\n"
            "                          [--unit-batch N]\n"
            "                          [--svg FILE] [--comm]\n"
            "                          [--trace FILE.json] [--dump] [--json]\n\n"
            "Executes the schedule of PLAN (written by `pipedream plan`) in a discrete-event\n"
            "simulator: stage times from PROFILE (our profile JSON or the authors' graph.txt),\n"
            "transfers and all-reduces over the plan's cluster (or CLUSTER). Reports time per\n"
            "minibatch, throughput, busy and bubble fractions, peak memory and weight versions;\n"
            "a schedule that deadlocks is an error naming the blocked workers. See docs/explanation/schedules.md.\n\n"
            "  --schedule KIND      1f1b (default), gpipe, 1f1b-flush, 2bw, dp, model-parallel,\n"
            "                       zb-h1, zb-h2 (Zero Bubble, backward split), interleaved\n"
            "                       (Megatron's interleaved 1F1B; a plan with several stages per worker)\n"
            "                       zb-v, v-half, v-min, dualpipe-v (two stages per worker in a V; a\n"
            "                       plan --v-shape, or a plain plan of 2 P stages placed in a V)\n"
            "  --minibatches N      optimizer-step minibatches to run (default 64; 8 for kinds\n"
            "                       with micro-batches)\n"
            "  --microbatches M     micro-batches per minibatch for gpipe, 1f1b-flush, 2bw, zb-h1,\n"
            "                       zb-h2, interleaved (default: the plan's number of workers; a\n"
            "                       multiple of them for interleaved), and 1f1b (a step per\n"
            "                       minibatch; default 4 on 2 or more workers, as train; 1 with\n"
            "                       --vertical-sync); one micro-batch is one profile minibatch\n"
            "  --vertical-sync      1f1b: every stage reads the weight version the input stage read\n"
            "  --recompute          keep only each stage's input between forward and backward and\n"
            "                       recompute the forward before the backward (any kind)\n"
            "  --chunks V           interleave a plan of S stages, d replicas each: replica j of\n"
            "                       stage i on worker (i mod (S / V)) d + j (a plan written with\n"
            "                       plan --chunks V has them)\n"
            "  --optimizer KIND     state size for memory: sgd (momentum, default), adam or adamw\n"
            "  --wire CODEC         activations between stages as train --wire sends them: fp32 (default,\n"
            "                       or the plan's codecs), bf16, int8, int4, delta: their bytes, and\n"
            "                       the time to encode and decode them\n"
            "  --wire-grad CODEC    the gradients' (default: as --wire; fp32 after delta)\n"
            "  --error-feedback     gradients carry their quantization error (its time)\n"
            "  --unit-batch N       samples per unit (train --minibatch N / micro-batches): the profile's\n"
            "                       times and bytes scaled to it, as train predicts (default: the\n"
            "                       profile's minibatch)\n"
            "  --svg FILE           timeline picture; --comm also draws sends and all-reduces\n"
            "  --trace FILE.json    Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev)\n"
            "  --dump               print each worker's forward/backward order (F0 F1 B0 ...)\n"
            "  --json               print the figures as JSON instead of the table\n");
}

int cmd_simulate(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        help(stdout);
        return CLI_OK;
    }
    const char *plan_path = NULL, *profile_path = NULL, *cluster_path = NULL, *svg_path = NULL, *trace_path = NULL;
    SchedOpts so = {SCHED_1F1B, 0, 0, 0, 0, 0};
    int json = 0, comm = 0, dump = 0, chunks = 0, kind_given = 0;
    double opt_factor = 1;
    int wire = -1, wire_grad = -1, error_feedback = 0, unit_batch = 0;   /* -1: the plan's, else fp32 */
    int *wire_at = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--profile")) {
            if (!(profile_path = cli_value("simulate", argc, argv, &i))) return CLI_USAGE;
        } else if (!strcmp(a, "--cluster")) {
            if (!(cluster_path = cli_value("simulate", argc, argv, &i))) return CLI_USAGE;
        } else if (!strcmp(a, "--schedule")) {
            if (!(v = cli_value("simulate", argc, argv, &i))) return CLI_USAGE;
            kind_given = 1;
            if (sched_kind_parse(v, &so.kind))
                return cli_usage_error("simulate", "--schedule: unknown kind \"%s\" (1f1b, gpipe, 1f1b-flush, 2bw, dp, "
                                                   "model-parallel, zb-h1, zb-h2, interleaved, zb-v, v-half, v-min, "
                                                   "dualpipe-v)", v);
        } else if (!strcmp(a, "--minibatches")) {
            if (!(v = cli_value("simulate", argc, argv, &i)) ||
                cli_parse_int("simulate", a, v, 1, 1 << 24, &so.n_minibatches))
                return CLI_USAGE;
        } else if (!strcmp(a, "--microbatches")) {
            if (!(v = cli_value("simulate", argc, argv, &i)) || cli_parse_int("simulate", a, v, 1, 1 << 16, &so.n_micro))
                return CLI_USAGE;
        } else if (!strcmp(a, "--vertical-sync")) {
            so.vertical_sync = 1;
        } else if (!strcmp(a, "--recompute")) {
            so.recompute = 1;
        } else if (!strcmp(a, "--chunks")) {
            if (!(v = cli_value("simulate", argc, argv, &i)) || cli_parse_int("simulate", a, v, 2, SCHED_MAX_CHUNKS, &chunks))
                return CLI_USAGE;
        } else if (!strcmp(a, "--optimizer")) {
            if (!(v = cli_value("simulate", argc, argv, &i))) return CLI_USAGE;
            if (!strcmp(v, "sgd")) opt_factor = 1;
            else if (!strcmp(v, "adam") || !strcmp(v, "adamw")) opt_factor = 2;
            else return cli_usage_error("simulate", "--optimizer: unknown \"%s\" (sgd, adam, adamw)", v);
        } else if (!strcmp(a, "--wire")) {
            if (!(v = cli_value("simulate", argc, argv, &i))) return CLI_USAGE;
            if ((wire = plan_wire_parse(v)) < 0)
                return cli_usage_error("simulate", "--wire: unknown \"%s\" (fp32, bf16, int8, int4, delta)", v);
        } else if (!strcmp(a, "--wire-grad")) {
            if (!(v = cli_value("simulate", argc, argv, &i))) return CLI_USAGE;
            if ((wire_grad = plan_wire_parse(v)) < 0 || wire_grad == SIM_WIRE_DELTA)
                return cli_usage_error("simulate", "--wire-grad: unknown \"%s\" (fp32, bf16, int8, int4)", v);
        } else if (!strcmp(a, "--error-feedback")) {
            error_feedback = 1;
        } else if (!strcmp(a, "--unit-batch")) {
            if (!(v = cli_value("simulate", argc, argv, &i)) || cli_parse_int("simulate", a, v, 1, 1 << 24, &unit_batch))
                return CLI_USAGE;
        } else if (!strcmp(a, "--svg")) {
            if (!(svg_path = cli_value("simulate", argc, argv, &i))) return CLI_USAGE;
        } else if (!strcmp(a, "--trace")) {
            if (!(trace_path = cli_value("simulate", argc, argv, &i))) return CLI_USAGE;
        } else if (!strcmp(a, "--comm")) {
            comm = 1;
        } else if (!strcmp(a, "--dump")) {
            dump = 1;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (a[0] == '-' && a[1]) {
            return cli_usage_error("simulate", "unknown option \"%s\"", a);
        } else if (!plan_path) {
            plan_path = a;
        } else {
            return cli_usage_error("simulate", "unexpected argument \"%s\"", a);
        }
    }
    if (!plan_path) return cli_usage_error("simulate", "missing PLAN.json");
    if (!profile_path) return cli_usage_error("simulate", "missing --profile PROFILE");
    if (so.n_micro > 1 && !sched_kind_takes_micro(so.kind) && kind_given)   /* else the plan's schedule may have them */
        return cli_usage_error("simulate", "--microbatches applies to 1f1b, gpipe, 1f1b-flush, 2bw, zb-h1, zb-h2 and interleaved, "
                               "not %s", sched_kind_name(so.kind));
    if (chunks && kind_given && so.kind != SCHED_INTERLEAVED)
        return cli_usage_error("simulate", "--chunks applies to interleaved only");
    if (chunks) so.kind = SCHED_INTERLEAVED;
    if (so.vertical_sync && so.kind != SCHED_1F1B)
        return cli_usage_error("simulate", "--vertical-sync applies to 1f1b only");

    Err err = {0};
    Profile prof;
    memset(&prof, 0, sizeof prof);
    Plan *p = NULL;
    Schedule s;
    memset(&s, 0, sizeof s);
    SimCosts costs = {0, NULL};
    SimResult r;
    memset(&r, 0, sizeof r);
    TraceEvent *ev = NULL;
    Cluster cl;
    int rc = CLI_FAIL;
    if (profile_load(profile_path, &prof, &err)) goto fail;
    if (!(p = plan_load(plan_path, &err))) goto fail;
    if (plan_validate(p, prof.n_layers, &err)) {
        err_prefix(&err, "%s does not fit %s", plan_path, profile_path);
        goto fail;
    }
    if (p->profile_checksum && prof.checksum && p->profile_checksum != prof.checksum)
        fprintf(stderr, "pipedream: warning: %s was planned from a different profile than %s\n", plan_path, profile_path);
    if (!kind_given && !chunks && p->schedule[0]) {   /* the schedule plan --choose-schedule chose */
        if (sched_kind_parse(p->schedule, &so.kind)) {
            err_set(&err, PD_EINVAL, "%s: unknown schedule \"%s\"", plan_path, p->schedule);
            goto fail;
        }
        if (!so.n_micro) so.n_micro = p->schedule_micro;
        so.recompute |= p->schedule_recompute;
        if (so.kind == SCHED_1F1B && !so.vertical_sync) so.inflight = p->schedule_inflight;
        char depth[48] = "";
        if (so.inflight) snprintf(depth, sizeof depth, ", %d units in flight", so.inflight);
        if (!json) printf("schedule from %s: %s, %d micro-batches%s%s\n", plan_path, p->schedule, so.n_micro,
                          so.recompute ? ", recomputation" : "", depth);
    }
    if (!kind_given && !chunks && p->chunks > 1) so.kind = p->v_shape ? SCHED_ZB_V : SCHED_INTERLEAVED;
    if (p->v_shape && !sched_kind_v(so.kind)) {
        err_set(&err, PD_EINVAL, "%s is a V-placed plan: it runs with zb-v, v-half, v-min or dualpipe-v, not %s",
                plan_path, sched_kind_name(so.kind));
        goto fail;
    }
    if (sched_kind_v(so.kind) && p->chunks > 1 && !p->v_shape) {
        err_set(&err, PD_EINVAL, "%s places its stages round-robin (interleaved); %s runs a V-placed plan (plan "
                "--v-shape) or a plain one", plan_path, sched_kind_name(so.kind));
        goto fail;
    }
    if (sched_kind_v(so.kind) && p->chunks <= 1 && plan_place_v(p, &err)) {   /* the kind places a plain plan */
        err_prefix(&err, "%s: %s", plan_path, sched_kind_name(so.kind));
        goto fail;
    }
    if (so.n_micro > 1 && !sched_kind_takes_micro(so.kind)) {
        rc = cli_usage_error("simulate", "--microbatches applies to 1f1b, gpipe, 1f1b-flush, 2bw, zb-h1, zb-h2 and interleaved, "
                             "not %s", sched_kind_name(so.kind));
        goto cleanup;
    }
    if (chunks && p->chunks > 1 && chunks != p->chunks) {
        err_set(&err, PD_EINVAL, "%s is an interleaved plan of %d chunks, not %d", plan_path, p->chunks, chunks);
        goto fail;
    }
    if (chunks && p->chunks <= 1 && plan_interleave(p, chunks, &err)) {
        err_prefix(&err, "%s: --chunks %d", plan_path, chunks);
        goto fail;
    }
    cl = p->cluster;
    if (cluster_path && cluster_load(cluster_path, &cl, &err)) goto fail;
    if (!so.n_micro) so.n_micro = so.vertical_sync ? 1 : sched_default_micro(so.kind, p->n_workers);
    if (!so.n_minibatches) so.n_minibatches = sched_splits_minibatch(so.kind, so.n_micro) ? 8 : 64;
    if (sched_build(p, &so, &s, &err)) goto fail;
    if (sim_costs_from_profile(&s, &prof, &costs, &err)) goto fail;
    if (unit_batch && unit_batch != prof.minibatch) {
        if (prof.minibatch <= 0) {
            err_set(&err, PD_EINVAL, "%s: --unit-batch needs a profile that says its minibatch", profile_path);
            goto fail;
        }
        sim_costs_scale(&costs, (double)unit_batch / prof.minibatch);
    }
    /* the codecs: given, else the plan's per boundary; fp32 and bf16 both ways as a factor */
    int wg = wire_grad >= 0 ? wire_grad : wire == SIM_WIRE_DELTA ? 0 : wire;
    if (wire >= 0 && !(wire <= 1 && wg == wire && !error_feedback)) {
        wire_at = calloc(2 * (size_t)s.n_stages, sizeof(int));
        PD_ASSERT(wire_at);
        for (int b = 0; b + 1 < s.n_stages; b++) wire_at[2 * b] = wire, wire_at[2 * b + 1] = wg;
    }
    SimOpts o = {.cluster = &cl, .opt_state_factor = opt_factor, .samples_per_unit = unit_batch ? unit_batch : prof.minibatch,
                 .wire_factor = wire == 1 ? 0.5 : 1.0, .wire_at = wire_at ? wire_at : wire < 0 ? p->wire : NULL,
                 .error_feedback = error_feedback};
    if (sim_run(&s, &costs, &o, &r, &err)) {
        err_prefix(&err, "%s (%s)", plan_path, sched_kind_name(so.kind));
        goto fail;
    }
    if (dump) sched_dump(&s, stdout, 1, 0);
    if (json) sim_print_json(&s, &r, stdout);
    else sim_print_summary(&s, &r, stdout);
    int n_ev = 0;
    if (svg_path || trace_path) ev = sim_events(&s, &r, &n_ev);
    if (svg_path) {
        char title[256];
        char units[64];
        if (s.n_micro > 1) snprintf(units, sizeof units, "%d x %d micro-batches", s.n_minibatches, s.n_micro);
        else snprintf(units, sizeof units, "%d minibatches", s.n_minibatches);
        snprintf(title, sizeof title, "%s: %s%s, %d workers, %s, %.4g s per minibatch, bubble %.3f",
                 p->model[0] ? p->model : prof.model, sched_kind_name(so.kind), so.recompute ? " + recompute" : "", s.n_ranks,
                 units, r.time_per_minibatch_s, r.bubble_fraction);
        char (*lab)[32] = malloc((size_t)s.n_ranks * sizeof *lab);
        const char **labp = malloc((size_t)s.n_ranks * sizeof *labp);
        PD_ASSERT(lab && labp);
        for (int w = 0; w < s.n_ranks; w++) {
            if (s.workers[w].n_chunks > 1) {
                int k = snprintf(lab[w], sizeof lab[w], "w%d s%d", w, s.workers[w].stages[0]);
                for (int c = 1; c < s.workers[w].n_chunks && k < (int)sizeof lab[w] - 4; c++)
                    k += snprintf(lab[w] + k, sizeof lab[w] - (size_t)k, ",%d", s.workers[w].stages[c]);
            } else if (s.workers[w].stage >= 0) snprintf(lab[w], sizeof lab[w], "w%d s%d", w, s.workers[w].stage);
            else snprintf(lab[w], sizeof lab[w], "w%d idle", w);
            labp[w] = lab[w];
        }
        SvgOpts sv = {title, comm, 0, labp};
        int src = sim_svg_write(svg_path, ev, n_ev, s.n_ranks, &sv, &err);
        free(lab);
        free(labp);
        if (src) goto fail;
        if (!json) printf("wrote %s\n", svg_path);
    }
    if (trace_path) {
        if (sim_trace_write(trace_path, ev, n_ev, &err)) goto fail;
        if (!json) printf("wrote %s\n", trace_path);
    }
    rc = CLI_OK;
fail:
    if (rc != CLI_OK) rc = cli_fail(&err);
cleanup:
    free(ev);
    free(wire_at);
    sim_result_release(&r);
    sim_costs_release(&costs);
    sched_release(&s);
    plan_free(p);
    profile_release(&prof);
    return rc;
}
