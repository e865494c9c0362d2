/* profile.h: per-layer costs of a model (the paper's profiler output), as plain data.
 * Read from our profile JSON or from the authors' graph.txt (detected by content), and
 * written as JSON. Units in memory: seconds and bytes, per minibatch of `minibatch`
 * samples. The profiler itself (timing a model) is profile_measure in profiler.c. */
#ifndef PD_PROFILE_H
#define PD_PROFILE_H

#include <stdint.h>

#include "core.h"

/* Scratch slots a profile can name (kernels.h's KSCR_COUNT is at most this). */
#define PROFILE_SCRATCH_SLOTS 16

typedef struct ProfileLayer {
    char name[64];       /* e.g. "layers.3" or graph.txt's "node12" */
    char type[64];       /* "conv2d", "relu", ... or graph.txt's node_desc (truncated) */
    double fwd_s;        /* forward time per minibatch, seconds */
    double bwd_s;        /* backward time per minibatch, seconds */
    double act_bytes;    /* bytes of this layer's output for one minibatch */
    double param_bytes;  /* bytes of this layer's parameters */
    int line;            /* 1-based line in the graph.txt it came from; 0 otherwise. The planner
                          * uses it to pick the authors' first source (file order). */
    /* Optional: the backward split into its input-gradient and weight-gradient passes (the
     * zero-bubble schedules run them separately). Both 0: not measured, and the simulator
     * counts half of bwd_s for each (graph.txt never has them). */
    double bwd_in_s, bwd_w_s;
    /* Optional: bytes the layer keeps for its backward besides its output, per minibatch
     * (batch-norm statistics, pooling indices, dropout masks, a residual or block's inner
     * activations): what the runtime's context holds for it. 0 when not measured. */
    double saved_bytes;
    /* Optional: the layer's optimizer step (SGD with momentum), which bwd_s and bwd_w_s
     * include: a schedule that steps once per minibatch of M units pays it once, not M times,
     * and it does not grow with the batch. 0 when not measured (the authors' profiles). */
    double step_s;
    /* Optional: the kernels' per-thread scratch (kern_scratch) the layer asks for when built
     * alone on a fresh thread, by scratch slot: [slot][0] at the profile's minibatch, [slot][1]
     * at one sample (the simulator interpolates other batch sizes between them). A stage's
     * layers share one arena per thread, so a stage needs, per slot, its layers' largest.
     * All 0 when not measured. */
    double scratch[PROFILE_SCRATCH_SLOTS][2];
    /* Optional: the same times measured at the profile's small_batch samples instead of
     * minibatch: forward, backward (with the optimizer step, as bwd_s has it) and, when the
     * backward's split is measured, its two passes. A layer's time is not proportional to its
     * batch (a dense layer, a small late convolution has a large part that does not shrink with
     * it): the simulator draws a straight line through the two measurements to cost units of
     * other sizes (sim_costs_scale). All 0 when the profile has no small_batch. */
    double small_fwd_s, small_bwd_s, small_bwd_in_s, small_bwd_w_s;
    /* Optional: what a stage boundary costs on each side of this layer, beyond the times above
     * (which are the layer's inside a stage): the forward and backward extra when the layer is
     * the last of a stage (its output leaves in the plain layout, not the channel-blocked one
     * the next layer takes inside a stage) and when it is the first (its input arrives plain).
     * Proportional to the batch. All 0 when not measured, or where the layouts do not change
     * at the boundary (the authors' profiles, a model without blocked layouts). */
    double cut_out_fwd_s, cut_out_bwd_s, cut_in_fwd_s, cut_in_bwd_s;
} ProfileLayer;

typedef struct Profile {
    char model[64];
    int minibatch;            /* samples per minibatch the times were measured at (0: unknown) */
    char source[64];          /* "pipedream-profile" or "graph.txt" */
    char measured_on[128];    /* free text: host/CPU, when known */
    int threads, iterations;  /* how it was measured (0: unknown) */
    int rounds;               /* rounds of `iterations` the profiler took, keeping one (0: unknown) */
    char round_kept[8];       /* which, with rounds > 1: "median" or "fastest" ("": not recorded) */
    double input_bytes;       /* bytes of the model input per minibatch (what stage 0 reads) */
    int saved_measured;       /* layers carry saved_bytes (our profiler): the simulator then also
                               * counts a unit's gradient buffers, as the runtime allocates them */
    int small_batch;          /* optional: the smaller batch, 1 .. minibatch - 1, the layers' small_*
                               * times were measured at (0: none, as in the authors' profiles) */
    int n_layers;
    ProfileLayer *layers;     /* in a topological order */
    int n_edges;              /* 0 means a chain: layer i feeds layer i+1 */
    int (*edges)[2];          /* (src, dst) layer indices */
    uint32_t checksum;        /* CRC-32 of the file it was read from (0 if built in memory) */
} Profile;

/* Reads path, our JSON or the authors' graph.txt (by content). Fills *out, which the
 * caller releases with profile_release. On error returns non-zero, err names the file
 * and line/layer, and *out is zeroed. */
int  profile_load(const char *path, Profile *out, Err *err);
int  profile_save(const Profile *p, const char *path, Err *err);
void profile_release(Profile *p);   /* zeroed or NULL is fine */
int  profile_is_chain(const Profile *p);
/* Parses text (the contents of a file called path, for messages): JSON if its first
 * non-blank character is '{', otherwise graph.txt. Same contract as profile_load. */
int  profile_parse(const char *text, const char *path, Profile *out, Err *err);
/* Checks what the planner relies on: at least one layer, finite non-negative times and
 * sizes, edges naming existing layers, no self-loops or duplicates, layers in a
 * topological order. Fails naming the first problem. */
int  profile_validate(const Profile *p, Err *err);
/* For a schedule that steps the optimizer once per m units (m micro-batches per minibatch):
 * each layer's backward keeps 1/m of its step_s (bwd_s and whichever split pass holds it;
 * step_s itself becomes step_s / m), so per-unit costs (the planner's) charge the step once
 * per minibatch; the small-batch backward times lose the same seconds as the full ones (they
 * hold the same step). m <= 1 or a profile without step_s: unchanged. */
void profile_spread_step(Profile *p, int m);
/* Calibration: multiplies layer l's compute times (forward, backward and its split passes, the
 * optimizer step, and the same at the small batch) by f > 0; sizes stay. */
void profile_scale_layer(Profile *p, int l, double f);
/* Layer l's backward times with `cut` seconds of its optimizer step taken out: from backward_s
 * and from the split pass that holds the step (the weight pass; the input pass of a layer whose
 * whole backward is its input pass); none below 0. */
void profile_layer_less_step(const ProfileLayer *l, double cut, double *bwd, double *bwd_in, double *bwd_w);
/* A copy of layer l with its small-batch times in place of fwd_s, bwd_s, bwd_in_s and bwd_w_s
 * (step_s stays: the step does not grow with the batch), so that the functions above treat the
 * small batch as they treat the full one. Meaningful only when the profile has a small_batch. */
ProfileLayer profile_layer_small(const ProfileLayer *l);
/* Reads a JSON array of [src, dst] integer pairs (the "edges" of profile and plan files)
 * into a malloc'd array the caller frees; *n receives the count. Fails naming path and the
 * bad edge. Ranges are checked later by the validators. */
struct cJSON;
int  profile_read_edges(const struct cJSON *edges, const char *path, int (**out)[2], int *n, Err *err);

#endif
