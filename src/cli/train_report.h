/* train_report.h: what `pipedream train` prints after a pipelined run (rank 0): the per-stage
 * table on stderr, the summary line on stdout, metrics lines, measured timelines and the loss
 * curve. JSON is written with cJSON from RtTrainSummary; NaN and Inf become null. The schema
 * is in docs/reference/formats.md ("train summary"). */
#ifndef PD_TRAIN_REPORT_H
#define PD_TRAIN_REPORT_H

#include "runtime.h"

typedef struct TrainOutputs {
    const char *metrics;   /* JSON lines: the summary, then one line per stage (may be NULL) */
    const char *trace;     /* Chrome trace of every instruction */
    const char *svg;       /* measured timeline */
    const char *curve;     /* loss and accuracy curve */
} TrainOutputs;

/* The summary as one JSON object (malloc'd text, no newline). */
char *train_summary_json(const RtTrainSummary *s);
/* One metrics line per evaluation (malloc'd text, no newline). */
char *train_eval_json(const RtEvalPoint *e);
/* One metrics line per stage (malloc'd text, no newline). */
char *train_stage_json(const RtTrainSummary *s, int stage);
int   train_report(const RtTrainSummary *s, const TrainOutputs *o, Err *err);

#endif
