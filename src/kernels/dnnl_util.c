/* dnnl_util.c: the one oneDNN CPU engine of the process and a stream per thread, shared by the
 * kernels' oneDNN candidates (kernels_impl.h). One engine rather than one per layer: an engine
 * holds no per-call state, and oneDNN's primitive cache is per engine kind anyway. Streams are
 * per thread, since threads running different stages may execute primitives at once. */
#include <pthread.h>

#include "kernels_impl.h"

static dnnl_engine_t g_eng;
static pthread_once_t g_eng_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_st_key;
static _Thread_local dnnl_stream_t t_st;

static void stream_end(void *st) { dnnl_stream_destroy(st); }

static void engine_make(void) {
    dnnl_status_t s = dnnl_engine_create(&g_eng, dnnl_cpu, 0);
    PD_ASSERTF(s == dnnl_success, "oneDNN: no CPU engine: %s", dnnl_status2str(s));
    PD_ASSERT(pthread_key_create(&g_st_key, stream_end) == 0);
}

dnnl_engine_t kern_dnnl_engine(void) {
    pthread_once(&g_eng_once, engine_make);
    return g_eng;
}

dnnl_stream_t kern_dnnl_stream(void) {
    if (t_st) return t_st;
    dnnl_status_t s = dnnl_stream_create(&t_st, kern_dnnl_engine(), dnnl_stream_default_flags);
    PD_ASSERTF(s == dnnl_success, "oneDNN: no stream: %s", dnnl_status2str(s));
    PD_ASSERT(pthread_setspecific(g_st_key, t_st) == 0);
    return t_st;
}
