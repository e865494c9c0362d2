/* main.c: `pipedream <command> ...`: dispatches to the subcommands in cmd_*.c. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define PD_VERSION "0.1.0"

static int cmd_version(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("pipedream %s\n", PD_VERSION);
    /* what this CPU can compute in (tests and scripts read this line) */
    printf("precision: fp32%s (oneDNN on %s)\n", kern_bf16_available() ? ", bf16" : "", kern_cpu_isa());
    return CLI_OK;
}

static const CliCommand COMMANDS[] = {
    /* one line per subcommand; keep this order (the user's path) */
    {"version", "print the version", cmd_version},
    {"profile", "time a model's layers on one worker and write a profile", cmd_profile},
    {"train", "train a model on one worker, on threads, or over MPI (a pipeline)", cmd_train},
    {"eval", "test loss and accuracy of a model's weights", cmd_eval},
    {"bench", "time training steps of a model on synthetic data", cmd_bench},
    {"plan", "partition a profile into pipeline stages over a cluster", cmd_plan},
    {"simulate", "run a plan's schedule in the simulator: throughput, memory, timeline", cmd_simulate},
    {"launch", "train over a hostfile's hosts under mpirun; on a lost host re-plan and resume", cmd_launch},
};
enum { N_COMMANDS = sizeof COMMANDS / sizeof COMMANDS[0] };

int cli_fail(const Err *err) {
    fprintf(stderr, "pipedream: error: %s\n", err->msg);
    return err->code == PD_EUSAGE ? CLI_USAGE : CLI_FAIL;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("pipedream: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see 'pipedream %s --help')\n", cmd);
    return CLI_USAGE;
}

int cli_under_mpirun(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

int cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

int cli_parse_precision(const char *cmd, const char *s, int *out) {
    int p = kern_precision_parse(s);
    if (p < 0) return cli_usage_error(cmd, "--precision expects fp32 or bf16, got \"%s\"", s);
    Err e = {0};
    if (kern_precision_check(p, &e)) return cli_fail(&e);
    *out = p;
    return CLI_OK;
}

int cli_parse_int(const char *cmd, const char *opt, const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return cli_usage_error(cmd, "%s expects an integer in [%ld, %ld], got \"%s\"", opt, lo, hi, s);
    *out = (int)v;
    return CLI_OK;
}

int cli_parse_double(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
        return cli_usage_error(cmd, "%s expects a number in [%g, %g], got \"%s\"", opt, lo, hi, s);
    *out = v;
    return CLI_OK;
}

const char *cli_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        cli_usage_error(cmd, "%s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

static void usage(FILE *f) {
    fprintf(f, "usage: pipedream <command> [options]   (pipedream <command> --help)\n\ncommands:\n");
    for (int i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-10s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return CLI_OK;
    }
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[1], COMMANDS[i].name)) return COMMANDS[i].run(argc - 1, argv + 1);
    fprintf(stderr, "pipedream: error: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return CLI_USAGE;
}
