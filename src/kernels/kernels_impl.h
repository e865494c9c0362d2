/* kernels_impl.h: what the kernels' oneDNN users (conv_dnnl.c, linear_bf16.c,
 * transformer_dnnl.c) share, from dnnl_util.c: the process's one CPU engine, a stream per
 * thread, and the two ways a oneDNN status is handled. Not part of the module's public API. */
#ifndef PD_KERNELS_IMPL_H
#define PD_KERNELS_IMPL_H

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "kernels.h"

/* The CPU engine every primitive of the process is created on (created on first use, never
 * destroyed; engines are safe to share between threads). */
dnnl_engine_t kern_dnnl_engine(void);
/* The calling thread's stream on that engine (created on first use, destroyed when the thread
 * ends). Primitives run in order on it and callers wait on it before reading results. */
dnnl_stream_t kern_dnnl_stream(void);

/* While building primitives: a failing call sets rc (PD_EINVAL) and err to "<what> (oneDNN):
 * <call> failed: <status>" and jumps to the function's `done:` label. The caller declares
 * `int rc` and `Err *err`. */
#define KDNNL_CK(what, call)                                                                             \
    do {                                                                                                 \
        dnnl_status_t s_ = (call);                                                                       \
        if (s_ != dnnl_success) {                                                                        \
            rc = err_set(err, PD_EINVAL, "%s (oneDNN): %s failed: %s", what, #call, dnnl_status2str(s_)); \
            goto done;                                                                                   \
        }                                                                                                \
    } while (0)
/* While running built primitives: a failure is a bug (the primitive accepted these shapes when
 * it was built), so it aborts naming the status. */
#define KDNNL_RUN(call)                                                                                  \
    do {                                                                                                 \
        dnnl_status_t s_ = (call);                                                                       \
        PD_ASSERTF(s_ == dnnl_success, "oneDNN: %s: %s", #call, dnnl_status2str(s_));                    \
    } while (0)

#endif
