/* rt_session.h: the parts of a training session (rt_session.c) that live in files of their own
 * (rt_result.c: a worker's figures; rt_report.c: the progress line and the summary) or that its
 * tests call one by one (tests/test_runtime_session.c). Not a public header: rt_train is the
 * session. */
#ifndef PD_RT_SESSION_H
#define PD_RT_SESSION_H

#include "runtime.h"

/* The segment loop: a run of `total` minibatches with `done` of them done ends its next
 * segment at the next multiple of checkpoint_every or eval_every (0: none) in the whole run's
 * minibatches, or at total, whichever comes first. */
uint64_t rt_segment_end(uint64_t done, uint64_t total, int checkpoint_every, int eval_every);

/* Resume slicing: the training state rank `rank` of schedule s starts from, taken from c (the
 * whole model's buffers for model m). A rank with one stage gets pointers into c (returns 0);
 * a rank with several (interleaved: its chunks, ascending) gets its chunks' ranges
 * concatenated in chunk order in buffers of its own (returns 1: free them with
 * rt_stage_state_free). An idle rank gets nothing (zeroed, returns 0). */
int  rt_stage_state_slice(const Model *m, const Schedule *s, int rank, const RtCkpt *c, RtStageState *out);
void rt_stage_state_free(RtStageState *st);

/* Evaluation and target accuracy: the evaluations of a run; ct and loss_sum hold the newest
 * one's totals over targets. */
typedef struct RtEvalLog {
    RtEvalPoint *pts;
    int n;
    int64_t ct[2];          /* correct, total */
    double loss_sum;
} RtEvalLog;
/* Adds the evaluation after `minibatches` of the run (of minibatch samples each, over a
 * training set of n_train samples: the epoch), `train_s` seconds of training, with totals
 * ct (correct, total targets) and loss_sum; returns the point. */
const RtEvalPoint *rt_eval_log_add(RtEvalLog *log, uint64_t minibatches, int minibatch, int64_t n_train,
                                   double train_s, const int64_t ct[2], double loss_sum);
/* 1 if a target accuracy is set (> 0) and pt reaches it. */
int  rt_target_reached(double target, const RtEvalPoint *pt);
void rt_eval_log_release(RtEvalLog *log);

/* rt_result.c. Adds one segment's figures (seg, released) to a worker's totals acc: loss
 * history and events moved to the run's unit numbering (unit_base) and clock (t_off s). */
void rt_result_add(RtWorkerResult *acc, RtWorkerResult *seg, uint64_t unit_base, double t_off);

/* The result gather: one worker's figures (events and loss history included) as the bytes it
 * sends to rank 0, and back (out owns its events and history; PD_ECOMM naming `rank` if the
 * bytes are not a whole record). */
char *rt_result_pack(const RtWorkerResult *a, size_t *n);
int  rt_result_unpack(const void *buf, size_t n, int rank, RtWorkerResult *out, Err *err);

/* rt_report.c. --progress-file (sp->progress_file): after a checkpoint, every rank's figures
 * of the segment just ended (fig: RT_SEG_FIGS doubles: its stage, compute, wait and wall
 * seconds, bytes sent, units) go to rank 0, which appends one JSON line after `minibatches`:
 * per rank its compute, wait and busy time (wall less wait: compute, sends, overhead) per
 * unit, its bytes sent per unit, and the predicted compute and busy time (the simulator's
 * compute for seg's stage from sp->profile + its bytes at the plan's bandwidth). A rank far
 * above its prediction is a straggler (pipedream launch --straggler-factor). Collective over
 * c (a gather bounded by timeout_s). */
enum { RT_SEG_FIGS = 6 };
int  rt_progress_file_line(Comm *c, const RtTrainSpec *sp, const Schedule *seg, int unit_batch, uint64_t minibatches,
                           const double fig[RT_SEG_FIGS], double timeout_s, Err *err);

/* Rank 0's summary of the run from every worker's figures (out->res, s->n_ranks entries), with
 * the simulator's prediction from sp->profile (or, in out->predicted_note, why there is none).
 * s: the whole run's schedule; n_train: training samples; mean, std: the input statistics. */
void rt_summarize(const RtTrainSpec *sp, const Schedule *s, int unit_batch, const char *transport, int64_t n_train,
                  double mean, double std, RtTrainSummary *out);

#endif
