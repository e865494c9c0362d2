/* cli.h: the `pipedream` subcommands and the helpers they share. Each subcommand lives in
 * cmd_<name>.c and is listed in the table in main.c. Exit status: 0 success, 1 runtime
 * error, 2 bad usage; errors are one line "pipedream: error: ..." on stderr. */
#ifndef PD_CLI_H
#define PD_CLI_H

#include "core.h"

enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

typedef struct CliCommand {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);   /* argv[0] is the subcommand name */
} CliCommand;

/* Prints "pipedream: error: <msg>" and returns CLI_FAIL (CLI_USAGE if err->code is
 * PD_EUSAGE). */
int cli_fail(const Err *err);
/* Prints "pipedream: error: <fmt>" plus a hint to use --help; returns CLI_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* True if argv contains --help or -h. */
int cli_wants_help(int argc, char **argv);

/* Option parsing helpers: parse s fully as a number in [lo, hi]; on failure print a usage
 * error naming opt and return CLI_USAGE, else CLI_OK. */
int cli_parse_int(const char *cmd, const char *opt, const char *s, long lo, long hi, int *out);
int cli_parse_double(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out);
/* --precision's value s (fp32, bf16) into *out: CLI_USAGE (message printed) if it names none,
 * CLI_FAIL if this CPU cannot compute in it (kern_precision_check), else CLI_OK. */
int cli_parse_precision(const char *cmd, const char *s, int *out);
/* Returns argv[++*i] or NULL (after printing a usage error) if the option has no value. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);

/* True when this process was started by mpirun (Open MPI, MPICH/PMI, PMIx). */
int cli_under_mpirun(void);

/* The line `pipedream train` under mpirun ends with when it fails, after its error line:
 * "pipedream: failed: train rank R exit S" at the start of a line (launch reads it; the
 * error line before it may quote paths, this one quotes nothing given by the user). */
#define CLI_FAILED_LINE "pipedream: failed: "
/* train's samples per minibatch when --minibatch is not given (launch plans with it too). */
#define CLI_TRAIN_MINIBATCH 64

int cmd_train(int argc, char **argv);   /* one worker or many: a training session (runtime.h) */
int cmd_bench(int argc, char **argv);
int cmd_eval(int argc, char **argv);   /* cmd_eval.c: test loss of a weights file */
int cmd_profile(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_simulate(int argc, char **argv);
int cmd_launch(int argc, char **argv);   /* cmd_launch.c: elastic training under mpirun */

#endif
