/* matmul_sum.c: what a oneDNN bf16 matmul pays for adding into its float32 output (the sum
 * post-op, dst += product) against writing it, for vgg16's 2048 x 2048 linear layer at 64 rows
 * (docs/explanation/performance.md, "gradients written, not added"): the weight gradient
 * dW (2048 x 2048) = dy^T (2048 x 64) x (64 x 2048), with dy^T a transposed view as pipedream
 * passes it (ba) and as a plain matrix (ab), and for comparison the forward product
 * (64 x 2048) x W^T. Each primitive is timed over 15 calls after 3 untimed ones; prints the
 * median ms per call and the implementation oneDNN picked. Build and run:
 *   cc -O2 bench/matmul_sum.c -o out/matmul_sum -ldnnl && OMP_NUM_THREADS=1 out/matmul_sum */
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(x)                                                                                 \
    do {                                                                                      \
        dnnl_status_t s_ = (x);                                                               \
        if (s_ != dnnl_success) {                                                             \
            fprintf(stderr, "matmul_sum: oneDNN status %d at line %d\n", s_, __LINE__);       \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

enum { WARM = 3, CALLS = 15 };

static dnnl_engine_t eng;
static dnnl_stream_t stream;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* C (m x n, f32) [+]= A (m x k, bf16, tag at) x B (k x n, bf16, tag bt): median ms per call. */
static void run(const char *what, int m, int k, int n, dnnl_format_tag_t at, dnnl_format_tag_t bt, int sum) {
    dnnl_memory_desc_t a, b, c;
    dnnl_dims_t da = {m, k}, db = {k, n}, dc = {m, n};
    CK(dnnl_memory_desc_init_by_tag(&a, 2, da, dnnl_bf16, at));
    CK(dnnl_memory_desc_init_by_tag(&b, 2, db, dnnl_bf16, bt));
    CK(dnnl_memory_desc_init_by_tag(&c, 2, dc, dnnl_f32, dnnl_ab));
    dnnl_primitive_attr_t attr;
    dnnl_post_ops_t po = NULL;
    CK(dnnl_primitive_attr_create(&attr));
    if (sum) {
        CK(dnnl_post_ops_create(&po));
        CK(dnnl_post_ops_append_sum(po, 1.0f));
        CK(dnnl_primitive_attr_set_post_ops(attr, po));
    }
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    CK(dnnl_matmul_desc_init(&md, &a, &b, NULL, &c));
    CK(dnnl_primitive_desc_create(&pd, &md, attr, eng, NULL));
    const char *impl = "?";
    CK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    CK(dnnl_primitive_create(&p, pd));
    dnnl_memory_t ma, mb, mc;
    CK(dnnl_memory_create(&ma, &a, eng, DNNL_MEMORY_ALLOCATE));
    CK(dnnl_memory_create(&mb, &b, eng, DNNL_MEMORY_ALLOCATE));
    CK(dnnl_memory_create(&mc, &c, eng, DNNL_MEMORY_ALLOCATE));
    void *h;
    CK(dnnl_memory_get_data_handle(ma, &h));
    memset(h, 0x3f, (size_t)m * k * 2);   /* bf16 0x3f3f: about 0.75 */
    CK(dnnl_memory_get_data_handle(mb, &h));
    memset(h, 0x3f, (size_t)k * n * 2);
    CK(dnnl_memory_get_data_handle(mc, &h));
    memset(h, 0, (size_t)m * n * 4);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    double t[CALLS];
    for (int i = 0; i < WARM + CALLS; i++) {
        double t0 = now();
        CK(dnnl_primitive_execute(p, stream, 3, args));
        CK(dnnl_stream_wait(stream));
        if (i >= WARM) t[i - WARM] = now() - t0;
    }
    qsort(t, CALLS, sizeof *t, cmp);
    printf("%-34s %4d x %4d x %4d  %-6s %7.3f ms  (%s)\n", what, m, k, n, sum ? "+=" : "=", t[CALLS / 2] * 1e3, impl);
    dnnl_memory_destroy(ma), dnnl_memory_destroy(mb), dnnl_memory_destroy(mc);
    dnnl_primitive_destroy(p);
    dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
}

int main(void) {
    CK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    CK(dnnl_stream_create(&stream, eng, dnnl_stream_default_flags));
    for (int sum = 1; sum >= 0; sum--) {
        run("weight gradient, dy^T a view", 2048, 64, 2048, dnnl_ba, dnnl_ab, sum);
        run("weight gradient, dy^T plain", 2048, 64, 2048, dnnl_ab, dnnl_ab, sum);
        run("forward, W^T a view", 64, 2048, 2048, dnnl_ab, dnnl_ba, sum);
    }
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(eng);
    return 0;
}
