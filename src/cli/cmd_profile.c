/* cmd_profile.c: `pipedream profile MODEL.json`: times training steps on one worker and
 * writes the per-layer profile the planner reads (docs/reference/formats.md). */
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "cli.h"
#include "kernels.h"
#include "runtime.h"

static const char *USAGE =
    "usage: pipedream profile MODEL.json [--minibatch B] [--threads T] [--iterations N] [--warmup W]\n"
    "                         [--rounds R] [--keep median|fastest] [--small-batch b]\n"
    "                         [--precision fp32|bf16] [-o PROFILE.json]\n"
    "Times N training steps (after W untimed ones) of the model on one worker with synthetic\n"
    "data, and writes per top-level layer the median forward and backward time, the output\n"
    "activation bytes and the parameter bytes, for a minibatch of B samples.\n"
    "  --minibatch B     samples per minibatch (default 64)\n"
    "  --threads T       kernel threads (default 1)\n"
    "  --iterations N    timed steps (default 20)\n"
    "  --warmup W        untimed steps first (default 3)\n"
    "  --rounds R        take the W + N steps R times and keep one round whole (default 1):\n"
    "                    a machine shared with others changes speed, and a prediction\n"
    "                    inherits the speed its profile saw\n"
    "  --keep K          which round: median (default; the machine's typical speed, what a\n"
    "                    run meets) or fastest (its speed when nothing slows it)\n"
    "  --small-batch b   also time every layer at b samples, b < B (default B/4, at least 1;\n"
    "                    0: not): the simulator costs micro-batches from the two batches, as\n"
    "                    a layer's time has a part that does not shrink with the batch. The\n"
    "                    profile takes about 1 + b/B times as long, more where layers have\n"
    "                    a large fixed part\n"
    "  --precision P     fp32 (default) or bf16: the compute precision of convolutions,\n"
    "                    linear layers and attention, as `pipedream train --precision`\n"
    "                    will run them (measured_on then ends in \" bf16\")\n"
    "  -o PROFILE.json   output (default: <model name>.profile.json)\n";

int cmd_profile(int argc, char **argv) {
    const char *C = "profile";
    if (cli_wants_help(argc, argv)) {
        fputs(USAGE, stdout);
        return CLI_OK;
    }
    const char *model = NULL, *outp = NULL, *v;
    RtProfileOpts o = {.minibatch = 64, .threads = 1, .warmup = 3, .iterations = 20, .rounds = 1};
    int small = -1;   /* -1: the default, B/4 */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int rc = CLI_OK;
        if (!strcmp(a, "--minibatch")) {
            if (!(v = cli_value(C, argc, argv, &i))) return CLI_USAGE;
            rc = cli_parse_int(C, a, v, 1, 65536, &o.minibatch);
        } else if (!strcmp(a, "--threads")) {
            if (!(v = cli_value(C, argc, argv, &i))) return CLI_USAGE;
            rc = cli_parse_int(C, a, v, 1, 1024, &o.threads);
        } else if (!strcmp(a, "--iterations")) {
            if (!(v = cli_value(C, argc, argv, &i))) return CLI_USAGE;
            rc = cli_parse_int(C, a, v, 1, 1000000, &o.iterations);
        } else if (!strcmp(a, "--warmup")) {
            if (!(v = cli_value(C, argc, argv, &i))) return CLI_USAGE;
            rc = cli_parse_int(C, a, v, 0, 1000000, &o.warmup);
        } else if (!strcmp(a, "--rounds")) {
            if (!(v = cli_value(C, argc, argv, &i))) return CLI_USAGE;
            rc = cli_parse_int(C, a, v, 1, 1000, &o.rounds);
        } else if (!strcmp(a, "--keep")) {
            if (!(v = cli_value(C, argc, argv, &i))) return CLI_USAGE;
            if (!strcmp(v, "fastest")) o.keep_fastest = 1;
            else if (!strcmp(v, "median")) o.keep_fastest = 0;
            else return cli_usage_error(C, "--keep expects median or fastest, got \"%s\"", v);
        } else if (!strcmp(a, "--small-batch")) {
            if (!(v = cli_value(C, argc, argv, &i))) return CLI_USAGE;
            rc = cli_parse_int(C, a, v, 0, 65535, &small);
        } else if (!strcmp(a, "--precision")) {
            if (!(v = cli_value(C, argc, argv, &i))) return CLI_USAGE;
            rc = cli_parse_precision(C, v, &o.precision);
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!(outp = cli_value(C, argc, argv, &i))) return CLI_USAGE;
        } else if (a[0] == '-') {
            return cli_usage_error(C, "unknown option %s", a);
        } else if (!model) {
            model = a;
        } else {
            return cli_usage_error(C, "unexpected argument \"%s\"", a);
        }
        if (rc) return rc;
    }
    if (!model) return cli_usage_error(C, "no MODEL.json given");
    if (small >= o.minibatch)
        return cli_usage_error(C, "--small-batch %d must be below --minibatch %d (0: no small batch)", small, o.minibatch);
    /* the default: a quarter of the minibatch, none for a minibatch of one sample */
    o.small_batch = small >= 0 ? small : o.minibatch / 4 > 1 ? o.minibatch / 4 : o.minibatch > 1 ? 1 : 0;
    struct utsname un;
    char host[128] = "";
    if (uname(&un) == 0)
        snprintf(host, sizeof host, "%.60s %.40s%s", un.nodename, un.machine, o.precision == KPREC_BF16 ? " bf16" : "");
    o.measured_on = host;
    o.progress = pd_stderr_is_tty();
    Profile p;
    Err err = {0};
    if (rt_profile(model, &o, &p, &err)) return cli_fail(&err);
    char defp[128];
    if (!outp) {
        snprintf(defp, sizeof defp, "%.100s.profile.json", p.model);
        outp = defp;
    }
    /* "cut after ms": what a stage boundary after the layer adds to the two stages' compute
     * (both passes, both sides), where the model keeps the activation channel-blocked */
    double tf = 0, tb = 0, pb = 0;
    printf("%-4s %-12s %12s %12s %14s %12s %14s\n", "#", "type", "forward ms", "backward ms", "activation B", "params B",
           "cut after ms");
    for (int i = 0; i < p.n_layers; i++) {
        const ProfileLayer *L = &p.layers[i], *R = i + 1 < p.n_layers ? &p.layers[i + 1] : NULL;
        double cut = L->cut_out_fwd_s + L->cut_out_bwd_s + (R ? R->cut_in_fwd_s + R->cut_in_bwd_s : 0);
        printf("%-4d %-12s %12.3f %12.3f %14.0f %12.0f %14.3f\n", i, L->type, 1e3 * L->fwd_s, 1e3 * L->bwd_s,
               L->act_bytes, L->param_bytes, 1e3 * cut);
        tf += L->fwd_s;
        tb += L->bwd_s;
        pb += L->param_bytes;
    }
    printf("%-17s %12.3f %12.3f %14s %12.0f\n", "total", 1e3 * tf, 1e3 * tb, "", pb);
    int rc = profile_save(&p, outp, &err);
    profile_release(&p);
    if (rc) return cli_fail(&err);
    printf("wrote %s\n", outp);
    return CLI_OK;
}
