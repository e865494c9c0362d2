/* rt_impl.h: the Worker and Slot structs shared by runtime.c (instruction execution) and
 * rt_eval.c (the forward-only evaluation pass). Not a public header. */
#ifndef PD_RT_IMPL_H
#define PD_RT_IMPL_H

#include "runtime.h"

enum { RT_DONE = 0, RT_BLOCKED = 1, RT_AT_AR = 2, RT_ERR = 3 };

/* One unit in flight at a worker: its activations context and message buffers. */
typedef struct Slot {
    int unit;                 /* -1: free (its sends may still be completing) */
    NnCtx *ctx;               /* input copy, activations, saved state */
    float *dy;                /* (B, out): gradient from the next stage, or dlogits */
    float *dx;                /* (B, in): gradient for the previous stage (NULL at stage 0) */
    float *labels_f;          /* (B): labels as a control message payload */
    int32_t *labels;          /* (B) */
    CommReq *r_act, *r_grad, *r_lab;   /* posted receives */
    CommReq *s_act, *s_grad, *s_lab;   /* sends not yet completed */
    int act_ready, grad_ready, lab_ready;
    int version;              /* weight version its forward used */
} Slot;

typedef struct Worker {
    const RtConfig *cfg;
    const Schedule *s;
    const SchedWorker *sw;
    Comm *c;
    CommGroup *group;         /* replicas of this stage (NULL: one replica, or emulation) */
    RtWorkerResult *res;
    int rank, stage, first, last;
    int is_input, is_last, classes;
    Shape in_shape, out_shape;   /* with the batch dimension */
    Model *m;
    size_t np, nst;
    float *state, *dw;
    Optim opt;
    /* weight versions: n_vslots buffers; vver[k] = version held by slot k, -1 = free */
    int n_vslots, n_versions, newest;
    float **vbuf;
    int *vver;
    int *last_read;           /* per version: index of its last reading instruction */
    Slot *slots;
    int n_slots;
    DataSampler sampler;
    int has_sampler;
    int pc;
    double t_start;
    double mb_loss_sum;
    int mb_loss_n, events_cap;
    double last_progress;
} Worker;

int  rt_worker_init(Worker *w, Comm *c, const RtConfig *cfg, int rank, RtWorkerResult *res, Err *err);
void rt_worker_release(Worker *w);
void rt_worker_finish(Worker *w);
int  rt_exec(Worker *w, int blocking, Err *err);
/* Forward-only pass of cfg->test through replica 0 of every stage; the last stage counts
 * correct answers into w->res. Collective over the workers of replica 0. */
int  rt_eval(Worker *w, Err *err);

#endif
