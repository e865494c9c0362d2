/* rt_fixture.h: what the runtime tests (test_runtime.c, test_memory.c, test_runtime_asp.c)
 * share: model JSON written to a temporary file, and hand-made plans of layer ranges. Header
 * only (static inline), so each test links only what it already links. */
#ifndef PD_RT_FIXTURE_H
#define PD_RT_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "plan.h"

/* Writes text to a new file /tmp/pd_rt_model_XXXXXX; path (>= 32 bytes) gets its name. */
static inline void rt_write_tmp(char *path, const char *text) {
    strcpy(path, "/tmp/pd_rt_model_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

/* A plan with stages given as layer ranges [bounds[i], bounds[i+1]) and replica counts;
 * ranks assigned in stage order. */
typedef struct TPlan {
    Plan p;
    PlanStage st[8];
    int layers[8][32];
    int ranks[8][8];
} TPlan;

static inline void tplan(TPlan *t, int n_stages, const int *bounds, const int *reps) {
    memset(t, 0, sizeof *t);
    int rank = 0;
    for (int i = 0; i < n_stages; i++) {
        PlanStage *s = &t->st[i];
        s->n_layers = bounds[i + 1] - bounds[i];
        s->layers = t->layers[i];
        for (int l = 0; l < s->n_layers; l++) s->layers[l] = bounds[i] + l;
        s->replicas = reps[i];
        s->ranks = t->ranks[i];
        for (int r = 0; r < reps[i]; r++) s->ranks[r] = rank++;
    }
    t->p.n_stages = n_stages;
    t->p.stages = t->st;
    t->p.n_layers = bounds[n_stages];
    t->p.n_workers = rank;
    t->p.noam = (rank + reps[0] - 1) / reps[0];
}

#endif
