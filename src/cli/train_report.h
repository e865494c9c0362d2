/* train_report.h: what `pipedream train` prints after a run, one worker or many (rank 0): the
 * per-stage table on stderr, the summary line on stdout, metrics lines, measured timelines and
 * the loss curve. JSON is written with cJSON from RtTrainSummary; NaN and Inf become null. The
 * schema is in docs/reference/formats.md ("Training summary"). */
#ifndef PD_TRAIN_REPORT_H
#define PD_TRAIN_REPORT_H

#include "runtime.h"

typedef struct TrainOutputs {
    const char *metrics;   /* JSON lines: the summary, one line per stage, per evaluation, and per
                            * log_every minibatches (may be NULL) */
    int log_every;         /* minibatches per "step" metrics line (0: 50) */
    const char *trace;     /* Chrome trace of every instruction */
    const char *svg;       /* measured timeline */
    const char *curve;     /* loss and accuracy curve */
    double bytes_per_token;   /* token shards: the validation targets' mean length in bytes (0: unknown) */
} TrainOutputs;

/* The summary as one JSON object (malloc'd text, no newline). bytes_per_token > 0 adds
 * "test_loss_per_byte": test_loss / bytes_per_token (nats per byte of a token model). */
char *train_summary_json(const RtTrainSummary *s, double bytes_per_token);
/* One metrics line per evaluation (malloc'd text, no newline). */
char *train_eval_json(const RtEvalPoint *e);
/* One metrics line per log window (malloc'd text, no newline): after minibatch `step` (epoch:
 * passes over the training set then), the mean training loss and accuracy of its minibatches. */
char *train_step_json(int step, double epoch, double loss, double accuracy);
/* One metrics line per stage (malloc'd text, no newline). */
char *train_stage_json(const RtTrainSummary *s, int stage);
int   train_report(const RtTrainSummary *s, const TrainOutputs *o, Err *err);

#endif
