/* conv_prec.c: what oneDNN's convolution primitives give in bf16 against fp32 on their own, the
 * ceiling of `pipedream bench --precision bf16` (docs/explanation/performance.md, "Mixed
 * precision"). For vgg16's 3x3 shapes at minibatch 64, each precision (bf16: src, weights and
 * diff_dst in bf16, dst, diff_src and diff_weights fp32, as pipedream runs them) and each
 * activation layout (nChw16c, as pipedream uses, and nhwc), creates forward-training,
 * backward-data and backward-weights primitives (weights "any") and times them on the same
 * buffers: the best of 5 rounds of 5 calls after 3 untimed ones. Prints one line per primitive
 * (the implementation oneDNN picked, ms per call) and the bf16 speed-up per pass. Data stays in
 * the caches between calls, so these are the primitives' best; inside a training step they
 * run slower. Build and run:
 *   cc -O2 bench/conv_prec.c -o out/conv_prec -ldnnl && OMP_NUM_THREADS=1 out/conv_prec */
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(x)                                                                  \
    do {                                                                       \
        dnnl_status_t s_ = (x);                                                \
        if (s_ != dnnl_success) {                                              \
            fprintf(stderr, "conv_prec: oneDNN status %d at line %d\n", s_, __LINE__); \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

static dnnl_engine_t eng;
static dnnl_stream_t stream;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One argument: its oneDNN id, the query for its descriptor and the query's index. */
typedef struct Arg {
    int id;
    dnnl_query_t q;
    int idx;
} Arg;

static double time_prim(const_dnnl_primitive_desc_t pd, const Arg *args, int n, const char *name) {
    dnnl_primitive_t p;
    CK(dnnl_primitive_create(&p, pd));
    dnnl_exec_arg_t a[8];
    for (int i = 0; i < n; i++) {
        const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, args[i].q, args[i].idx);
        CK(dnnl_memory_create(&a[i].memory, md, eng, DNNL_MEMORY_ALLOCATE));
        void *h;
        CK(dnnl_memory_get_data_handle(a[i].memory, &h));
        memset(h, 0, dnnl_memory_desc_get_size(md));
        a[i].arg = args[i].id;
    }
    for (int i = 0; i < 3; i++) CK(dnnl_primitive_execute(p, stream, n, a));
    CK(dnnl_stream_wait(stream));
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        for (int i = 0; i < 5; i++) CK(dnnl_primitive_execute(p, stream, n, a));
        CK(dnnl_stream_wait(stream));
        double t = (now() - t0) / 5;
        if (t < best) best = t;
    }
    const char *impl;
    CK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    printf("    %-6s %-28s %7.3f ms\n", name, impl, best * 1e3);
    for (int i = 0; i < n; i++) dnnl_memory_destroy(a[i].memory);
    dnnl_primitive_destroy(p);
    return best;
}

int main(void) {
    CK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    CK(dnnl_stream_create(&stream, eng, dnnl_stream_default_flags));
    static const int shapes[][3] = {{16, 16, 32}, {32, 32, 16}, {64, 64, 8}, {128, 128, 4}, {128, 128, 2}};
    const int N = 64, nshapes = (int)(sizeof shapes / sizeof *shapes);
    double total[2][2][3] = {{{0}}};   /* [layout][precision][pass] */
    for (int lay = 0; lay < 2; lay++) {
        const dnnl_format_tag_t tag = lay == 0 ? dnnl_nChw16c : dnnl_nhwc;
        for (int s = 0; s < nshapes; s++) {
            const int ic = shapes[s][0], oc = shapes[s][1], h = shapes[s][2];
            for (int prec = 0; prec < 2; prec++) {
                const dnnl_data_type_t mt = prec ? dnnl_bf16 : dnnl_f32;
                dnnl_dims_t sd = {N, ic, h, h}, wd = {oc, ic, 3, 3}, bd = {oc}, dd = {N, oc, h, h};
                dnnl_dims_t strides = {1, 1}, pad = {1, 1};
                dnnl_memory_desc_t src, wei, bias, dst, ddst, dsrc, dwei;
                CK(dnnl_memory_desc_init_by_tag(&src, 4, sd, mt, tag));
                CK(dnnl_memory_desc_init_by_tag(&wei, 4, wd, mt, dnnl_format_tag_any));
                CK(dnnl_memory_desc_init_by_tag(&bias, 1, bd, dnnl_f32, dnnl_a));
                CK(dnnl_memory_desc_init_by_tag(&dst, 4, dd, dnnl_f32, tag));
                CK(dnnl_memory_desc_init_by_tag(&ddst, 4, dd, mt, tag));
                CK(dnnl_memory_desc_init_by_tag(&dsrc, 4, sd, dnnl_f32, tag));
                CK(dnnl_memory_desc_init_by_tag(&dwei, 4, wd, dnnl_f32, dnnl_format_tag_any));
                dnnl_convolution_desc_t fd, bdd, bwd;
                dnnl_primitive_desc_t fpd, dpd, wpd;
                CK(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, &src, &wei,
                                                      &bias, &dst, strides, pad, pad));
                CK(dnnl_primitive_desc_create(&fpd, &fd, NULL, eng, NULL));
                CK(dnnl_convolution_backward_data_desc_init(&bdd, dnnl_convolution_direct, &dsrc, &wei, &ddst, strides,
                                                            pad, pad));
                CK(dnnl_primitive_desc_create(&dpd, &bdd, NULL, eng, fpd));
                CK(dnnl_convolution_backward_weights_desc_init(&bwd, dnnl_convolution_direct, &src, &dwei, &bias, &ddst,
                                                               strides, pad, pad));
                CK(dnnl_primitive_desc_create(&wpd, &bwd, NULL, eng, fpd));
                printf("%-8s %-5s ic%d oc%d %dx%d\n", lay == 0 ? "nChw16c" : "nhwc", prec ? "bf16" : "fp32", ic, oc, h, h);
                const Arg fa[] = {{DNNL_ARG_SRC, dnnl_query_src_md, 0}, {DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0},
                                  {DNNL_ARG_BIAS, dnnl_query_weights_md, 1}, {DNNL_ARG_DST, dnnl_query_dst_md, 0}};
                const Arg da[] = {{DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0},
                                  {DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0},
                                  {DNNL_ARG_DIFF_SRC, dnnl_query_diff_src_md, 0}};
                const Arg wa[] = {{DNNL_ARG_SRC, dnnl_query_src_md, 0}, {DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0},
                                  {DNNL_ARG_DIFF_WEIGHTS, dnnl_query_diff_weights_md, 0},
                                  {DNNL_ARG_DIFF_BIAS, dnnl_query_diff_weights_md, 1}};
                total[lay][prec][0] += time_prim(fpd, fa, 4, "fwd");
                total[lay][prec][1] += time_prim(dpd, da, 3, "bwd_d");
                total[lay][prec][2] += time_prim(wpd, wa, 4, "bwd_w");
                dnnl_primitive_desc_destroy(fpd);
                dnnl_primitive_desc_destroy(dpd);
                dnnl_primitive_desc_destroy(wpd);
            }
        }
    }
    static const char *const pass[3] = {"forward", "backward data", "backward weights"};
    for (int lay = 0; lay < 2; lay++) {
        double f = 0, b = 0;
        for (int k = 0; k < 3; k++) {
            printf("%-8s %-16s fp32 %7.3f ms  bf16 %7.3f ms  bf16 speed-up %.2fx\n", lay == 0 ? "nChw16c" : "nhwc",
                   pass[k], total[lay][0][k] * 1e3, total[lay][1][k] * 1e3, total[lay][0][k] / total[lay][1][k]);
            f += total[lay][0][k];
            b += total[lay][1][k];
        }
        printf("%-8s %-16s fp32 %7.3f ms  bf16 %7.3f ms  bf16 speed-up %.2fx\n", lay == 0 ? "nChw16c" : "nhwc", "all three",
               f * 1e3, b * 1e3, f / b);
    }
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(eng);
    return 0;
}
