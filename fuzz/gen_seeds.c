/* gen_seeds.c: writes the seed corpora under fuzz/corpus/ (run once; the results are
 * committed). Valid files come from the modules' own writers where they have one
 * (ckpt_write, profile_save, plan_new + plan_save), so the seeds follow the formats as
 * they are; a few invalid ones are added by hand. Build and run: fuzz/run.sh --seeds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "ckpt.h"
#include "plan.h"
#include "profile.h"

static char g_root[512];

static void put(const char *corpus, const char *name, const void *data, size_t len, int prefix) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_root, corpus);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", g_root, corpus, name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (prefix >= 0) fputc(prefix, f);
    if (len) fwrite(data, 1, len, f);
    fclose(f);
}

static void put_file(const char *corpus, const char *name, const char *src, int prefix) {
    char *buf;
    size_t len;
    Err err = {0};
    if (pd_read_file(src, 1 << 24, &buf, &len, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    put(corpus, name, buf, len, prefix);
    pd_free(buf);
}

static void check(int rc, const Err *err) {
    if (rc) {
        fprintf(stderr, "gen_seeds: %s\n", err->msg);
        exit(1);
    }
}

static void seeds_ckpt(void) {
    Err err = {0};
    float w[6] = {1, -2, 3.5f, 0, 1e-3f, 7};
    int64_t rng[2] = {42, -1};
    uint8_t bytes[5] = {1, 2, 3, 4, 5};
    int64_t s2[1] = {2}, s5[1] = {5};
    CkptWriter *cw = ckpt_writer_new();
    check(ckpt_writer_add_f32(cw, "layers.0.weight", shape2(2, 3), w, &err), &err);
    check(ckpt_writer_add(cw, "rng.counters", CKPT_I64, 1, s2, rng, &err), &err);
    check(ckpt_writer_add(cw, "rng.state", CKPT_U8, 1, s5, bytes, &err), &err);
    check(ckpt_writer_meta(cw, "step", "10", &err), &err);
    check(ckpt_write(cw, "/tmp/pd_seed.safetensors", &err), &err);
    ckpt_writer_free(cw);
    put_file("ckpt", "valid_crc.safetensors", "/tmp/pd_seed.safetensors", -1);
    cw = ckpt_writer_new();
    check(ckpt_write(cw, "/tmp/pd_seed.safetensors", &err), &err);
    ckpt_writer_free(cw);
    put_file("ckpt", "empty.safetensors", "/tmp/pd_seed.safetensors", -1);
    remove("/tmp/pd_seed.safetensors");
    /* without a CRC (as other tools write them), so mutations of the data still parse */
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],"
                    "\"data_offsets\":[0,16]},\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]},"
                    "\"c\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[22,23]}}";
    size_t hl = strlen(h), padded = (hl + 7) / 8 * 8;
    unsigned char buf[512] = {0};
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, h, hl);
    memset(buf + 8 + hl, ' ', padded - hl);
    for (int i = 0; i < 23; i++) buf[8 + padded + i] = (unsigned char)(i * 13);
    put("ckpt", "foreign_nocrc.safetensors", buf, 8 + padded + 23, -1);
    put("ckpt", "truncated.safetensors", buf, 8 + padded + 10, -1);
    const char *bad = "\x10\0\0\0\0\0\0\0{\"a\":{\"dtype\":1}}";
    put("ckpt", "bad_dtype.safetensors", bad, 8 + 16, -1);
    put("ckpt", "escapes.safetensors", "\x20\0\0\0\0\0\0\0{\"\\u00e9\\ud83d\\ude00\\n\":{} }   ", 8 + 32, -1);
}

static void seeds_json(void) {
    const char *j[] = {
        "{\"n\": 3, \"workers\": 4, \"bandwidth\": 1.5e9, \"straight\": true, \"type\": \"linear\"}",
        "{\"workers\": 2, \"layers\": [{\"workers\": 1, \"n\": -3}, {\"type\": \"x\", \"extra\": null}]}",
        "{\"workers\": 1e400, \"n\": 1.5, \"type\": 3}",
        "[1, 2, {\"a\": [\"\\u0041\\ud83d\\ude00\"]}]",
        "{\"a\":1,\"a\":2,\"workers\":64,\"b\":{\"c\":{\"d\":[[[[]]]]}}}",
    };
    char name[32];
    for (size_t i = 0; i < sizeof j / sizeof j[0]; i++) {
        snprintf(name, sizeof name, "seed%zu.json", i);
        put("json", name, j[i], strlen(j[i]), -1);
    }
}

static void put_gz(const char *corpus, const char *name, const void *data, size_t len, int prefix) {
    gzFile g = gzopen("/tmp/pd_seed.gz", "wb");
    gzwrite(g, data, (unsigned)len);
    gzclose(g);
    put_file(corpus, name, "/tmp/pd_seed.gz", prefix);
    remove("/tmp/pd_seed.gz");
}

static void seeds_data(void) {
    unsigned char img[16 + 4 * 3 * 3] = {0, 0, 8, 3, 0, 0, 0, 4, 0, 0, 0, 3, 0, 0, 0, 3};
    for (int i = 16; i < (int)sizeof img; i++) img[i] = (unsigned char)(i * 9);
    unsigned char lab[8 + 3] = {0, 0, 8, 1, 0, 0, 0, 3, 0, 5, 9};
    put("idx", "images_raw", img, sizeof img, 1);
    put_gz("idx", "images_gz", img, sizeof img, 3);
    put("idx", "labels_raw", lab, sizeof lab, 0);
    put_gz("idx", "labels_gz", lab, sizeof lab, 2);
    lab[10] = 10;
    put("idx", "labels_bad", lab, sizeof lab, 0);
    put("idx", "images_short", img, 20, 1);

    unsigned char rec[2 * 3073];
    for (int i = 0; i < 2 * 3073; i++) rec[i] = (unsigned char)(i * 7);
    rec[0] = 3, rec[3073] = 9;
    put("cifar", "one", rec, 3073, -1);
    put("cifar", "two", rec, 2 * 3073, -1);
    put("cifar", "short", rec, 3000, -1);
    rec[0] = 10;
    put("cifar", "bad_label", rec, 3073, -1);
}

static void seeds_profile_plan(const char *src) {
    Err err = {0};
    ProfileLayer layers[4] = {
        {"layers.0", "conv2d", 1e-3, 2e-3, 4096, 1024, 0},
        {"layers.1", "relu", 1e-4, 1e-4, 4096, 0, 0},
        {"layers.2", "linear", 5e-4, 1e-3, 40, 4000, 0},
        {"layers.3", "linear", 5e-5, 1e-4, 40, 440, 0},
    };
    Profile p = {.model = "seed", .minibatch = 32, .source = "pipedream-profile", .measured_on = "seed",
                 .threads = 1, .iterations = 3, .input_bytes = 3136, .n_layers = 4, .layers = layers};
    check(profile_save(&p, "/tmp/pd_seed_profile.json", &err), &err);
    put_file("profile", "chain.json", "/tmp/pd_seed_profile.json", -1);
    int edges[4][2] = {{0, 1}, {1, 2}, {0, 2}, {2, 3}};
    p.n_edges = 4;
    p.edges = edges;
    check(profile_save(&p, "/tmp/pd_seed_profile_dag.json", &err), &err);
    put_file("profile", "dag.json", "/tmp/pd_seed_profile_dag.json", -1);
    const char *g = "node1 -- Input0 -- forward_compute_time=0.000, backward_compute_time=0.000, "
                    "activation_size=602112.0, parameter_size=0.000\n"
                    "node2 -- Conv2d(3, 64, kernel_size=(3, 3)) -- forward_compute_time=1.5, "
                    "backward_compute_time=3.0, activation_size=[100.0; 200.0], parameter_size=7168.0\n"
                    "node3 -- ReLU() -- forward_compute_time=0.1, backward_compute_time=0.2, "
                    "activation_size=300.0, parameter_size=0.0\n"
                    "\tnode1 -- node2\n\tnode2 -- node3\n\tnode1 -- node3\n";
    put("profile", "graph.txt", g, strlen(g), -1);
    const char *gb = "node1 -- x -- forward_compute_time=abc\n";
    put("profile", "graph_bad.txt", gb, strlen(gb), -1);

    const char *c = "{\"format\": \"pipedream-cluster\", \"version\": 1, \"levels\": [{\"workers\": 4, "
                    "\"bandwidth\": 1e10, \"latency\": 1e-6}, {\"workers\": 2, \"bandwidth\": 1.25e9}], "
                    "\"memory_per_worker\": 1.6e10}";
    put("plan", "cluster.json", c, strlen(c), 0);
    const char *cm = "{\"levels\": [{\"workers\": 1, \"bandwidth\": 1}]}";
    put("plan", "cluster_min.json", cm, strlen(cm), 0);
    Cluster cl;
    check(cluster_load(src, &cl, &err), &err);
    PlanOpts o = {0};
    Plan *pl = plan_new(&p, &cl, &o, &err);
    check(pl ? 0 : 1, &err);
    check(plan_save(pl, "/tmp/pd_seed_plan.json", &err), &err);
    put_file("plan", "plan.json", "/tmp/pd_seed_plan.json", 1);
    plan_free(pl);
    o.straight = 1;
    pl = plan_new(&p, &cl, &o, &err);
    check(pl ? 0 : 1, &err);
    check(plan_save(pl, "/tmp/pd_seed_plan.json", &err), &err);
    put_file("plan", "plan_straight.json", "/tmp/pd_seed_plan.json", 1);
    plan_free(pl);
    remove("/tmp/pd_seed_plan.json");
    remove("/tmp/pd_seed_profile.json");
    remove("/tmp/pd_seed_profile_dag.json");
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gen_seeds CORPUS_DIR SOURCE_DIR\n");
        return 2;
    }
    snprintf(g_root, sizeof g_root, "%s", argv[1]);
    mkdir(g_root, 0755);
    char path[1024];
    seeds_ckpt();
    seeds_json();
    seeds_data();
    const char *models[] = {"mlp", "lenet5", "lstm", "resnet20"};
    for (int i = 0; i < 4; i++) {
        char name[64];
        snprintf(path, sizeof path, "%s/models/%s.json", argv[2], models[i]);
        snprintf(name, sizeof name, "%s.json", models[i]);
        put_file("model", name, path, -1);
    }
    const char *cl = "{\"levels\": [{\"workers\": 2, \"bandwidth\": 1e9}, {\"workers\": 2, \"bandwidth\": 1e8}]}";
    FILE *f = fopen("/tmp/pd_seed_cluster.json", "w");
    fputs(cl, f);
    fclose(f);
    seeds_profile_plan("/tmp/pd_seed_cluster.json");
    remove("/tmp/pd_seed_cluster.json");
    return 0;
}
