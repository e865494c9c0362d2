/* test_profile.c: profile JSON round trip (bit-exact doubles, small-batch times included), the graph.txt reader
 * (units, lists of activation sizes, topological order, model name), the authors'
 * profiles (all load; counts match the files), and bad input with the messages users see. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "profile.h"

static char g_tmp[256];

static const char *tmp_path(const char *name) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/pd_test_profile_%d_%s", (int)getpid(), name);
    return g_tmp;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Loads text as a file and expects failure with msg containing want. */
static void expect_error(const char *text, const char *want) {
    const char *path = tmp_path("bad.txt");
    write_text(path, text);
    Profile p;
    Err err = {0};
    int rc = profile_load(path, &p, &err);
    unlink(path);
    if (rc == PD_OK || !strstr(err.msg, want)) {
        fprintf(stderr, "input:\n%s\nwanted error containing \"%s\", got rc %d \"%s\"\n", text, want, rc, err.msg);
        fail();
    }
    assert_int_equal(p.n_layers, 0); /* zeroed on error */
}

static void make_profile(Profile *p, int n, int dag) {
    memset(p, 0, sizeof *p);
    snprintf(p->model, sizeof p->model, "toy");
    p->minibatch = 32;
    snprintf(p->measured_on, sizeof p->measured_on, "test host");
    p->threads = 2;
    p->iterations = 10;
    p->rounds = 5;
    p->input_bytes = 12345.5;
    p->n_layers = n;
    p->layers = calloc((size_t)n, sizeof *p->layers);
    for (int i = 0; i < n; i++) {
        snprintf(p->layers[i].name, sizeof p->layers[i].name, "layers.%d", i);
        snprintf(p->layers[i].type, sizeof p->layers[i].type, i % 2 ? "relu" : "conv2d");
        p->layers[i].fwd_s = 0.1 / (i + 3);      /* not exactly representable: tests round trip */
        p->layers[i].bwd_s = 1e-7 * (i + 1) / 3;
        p->layers[i].act_bytes = 4.0 * (1000 + i);
        p->layers[i].param_bytes = i % 2 ? 0 : 4.0 * 9 * 64 * 64 / 7;
    }
    if (dag) { /* a diamond per pair plus the chain */
        p->edges = calloc((size_t)(2 * n), sizeof *p->edges);
        for (int i = 0; i + 1 < n; i++) {
            p->edges[p->n_edges][0] = i;
            p->edges[p->n_edges++][1] = i + 1;
            if (i + 2 < n) {
                p->edges[p->n_edges][0] = i;
                p->edges[p->n_edges++][1] = i + 2;
            }
        }
    }
}

static void test_json_round_trip(void **state) {
    (void)state;
    for (int dag = 0; dag < 2; dag++) {
        Profile a, b;
        make_profile(&a, 7, dag);
        if (dag) {   /* saved bytes, as our profiler writes them (one in the chain case: absent) */
            a.saved_measured = 1;
            for (int i = 0; i < a.n_layers; i++) a.layers[i].saved_bytes = i % 3 ? 64.0 * i : 0;
            /* small-batch times, the split ones on the layers with the split */
            a.small_batch = 7;
            for (int i = 0; i < a.n_layers; i++) {
                ProfileLayer *l = &a.layers[i];
                l->small_fwd_s = 0.03 / (i + 7), l->small_bwd_s = i == 2 ? 0 : 1e-8 * (i + 1) / 7;
                if (i % 2 == 0) {
                    l->bwd_in_s = l->bwd_s / 3, l->bwd_w_s = l->bwd_s - l->bwd_in_s;
                    l->small_bwd_in_s = l->small_bwd_s / 3, l->small_bwd_w_s = 1e-9 / (i + 3);
                }
                /* the cuts' prices, where a boundary is (none before the first, after the last) */
                if (i + 1 < a.n_layers) l->cut_out_fwd_s = 1e-4 / (i + 3), l->cut_out_bwd_s = i % 2 ? 0 : 3e-5 * i;
                if (i > 0) l->cut_in_fwd_s = i % 3 ? 2e-6 * i : 0, l->cut_in_bwd_s = 1.5e-4 / i;
            }
        }
        Err err = {0};
        const char *path = tmp_path("rt.json");
        assert_int_equal(profile_save(&a, path, &err), PD_OK);
        assert_int_equal(profile_load(path, &b, &err), PD_OK);
        {   /* the keys only when there are small-batch times: an old profile is written as before */
            FILE *f = fopen(path, "r");
            char buf[1 << 14];
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = 0;
            assert_int_equal(strstr(buf, "\"small_batch\"") != NULL, dag);
            assert_int_equal(strstr(buf, "small_forward_s") != NULL, dag);
            assert_int_equal(strstr(buf, "small_backward_input_s") != NULL, dag);
        }
        unlink(path);
        assert_string_equal(b.model, "toy");
        assert_string_equal(b.source, "pipedream-profile");
        assert_string_equal(b.measured_on, "test host");
        assert_int_equal(b.minibatch, 32);
        assert_int_equal(b.threads, 2);
        assert_int_equal(b.iterations, 10);
        assert_int_equal(b.rounds, 5);
        assert_true(b.input_bytes == a.input_bytes);
        assert_int_equal(b.n_layers, a.n_layers);
        for (int i = 0; i < a.n_layers; i++) {
            assert_string_equal(b.layers[i].name, a.layers[i].name);
            assert_string_equal(b.layers[i].type, a.layers[i].type);
            assert_true(b.layers[i].fwd_s == a.layers[i].fwd_s); /* bit-exact */
            assert_true(b.layers[i].bwd_s == a.layers[i].bwd_s);
            assert_true(b.layers[i].act_bytes == a.layers[i].act_bytes);
            assert_true(b.layers[i].param_bytes == a.layers[i].param_bytes);
            assert_true(b.layers[i].saved_bytes == a.layers[i].saved_bytes);
            assert_true(b.layers[i].bwd_in_s == a.layers[i].bwd_in_s && b.layers[i].bwd_w_s == a.layers[i].bwd_w_s);
            assert_true(b.layers[i].small_fwd_s == a.layers[i].small_fwd_s);
            assert_true(b.layers[i].small_bwd_s == a.layers[i].small_bwd_s);
            assert_true(b.layers[i].small_bwd_in_s == a.layers[i].small_bwd_in_s);
            assert_true(b.layers[i].small_bwd_w_s == a.layers[i].small_bwd_w_s);
            assert_true(b.layers[i].cut_out_fwd_s == a.layers[i].cut_out_fwd_s);
            assert_true(b.layers[i].cut_out_bwd_s == a.layers[i].cut_out_bwd_s);
            assert_true(b.layers[i].cut_in_fwd_s == a.layers[i].cut_in_fwd_s);
            assert_true(b.layers[i].cut_in_bwd_s == a.layers[i].cut_in_bwd_s);
        }
        assert_int_equal(b.small_batch, dag ? 7 : 0);
        assert_int_equal(b.saved_measured, dag);
        assert_int_equal(b.n_edges, dag ? a.n_edges : 0);
        for (int e = 0; e < b.n_edges; e++) {
            assert_int_equal(b.edges[e][0], a.edges[e][0]);
            assert_int_equal(b.edges[e][1], a.edges[e][1]);
        }
        assert_int_equal(profile_is_chain(&b), !dag);
        assert_true(b.checksum != 0);
        profile_release(&a);
        profile_release(&b);
    }
}

static const char *GRAPH =
    "node3 -- ReLU(inplace) -- forward_compute_time=1.500, backward_compute_time=2.000, activation_size=400.0, "
    "parameter_size=0.000\n"
    "node1 -- Input0 -- forward_compute_time=600.000, backward_compute_time=0.000, activation_size=100.0, "
    "parameter_size=0.000\n"
    "node2 -- LSTM(8, 8) -- forward_compute_time=3.250, backward_compute_time=4.000, activation_size=[10.0; 20.5; "
    "30.0], parameter_size=288.000 -- stage_id=0\n"
    "\tnode1 -- node2\n"
    "\tnode2 -- node3\n";

static void test_graph_txt(void **state) {
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/pd_test_profile_%d_mymodel", (int)getpid());
    assert_int_equal(mkdir(dir, 0700), 0);
    char path[300];
    snprintf(path, sizeof path, "%s/graph.txt", dir);
    write_text(path, GRAPH);
    Profile p;
    Err err = {0};
    int rc = profile_load(path, &p, &err);
    unlink(path);
    rmdir(dir);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, PD_OK);
    assert_string_equal(p.source, "graph.txt");
    assert_string_equal(p.model, strrchr(dir, '/') + 1); /* the folder name */
    assert_int_equal(p.n_layers, 3);
    /* Topological order: node1 (Input0), node2, node3 although node3 comes first in the file. */
    assert_string_equal(p.layers[0].name, "node1");
    assert_string_equal(p.layers[1].name, "node2");
    assert_string_equal(p.layers[2].name, "node3");
    assert_string_equal(p.layers[0].type, "Input0");
    assert_int_equal(p.layers[0].line, 2);
    assert_int_equal(p.layers[2].line, 1);
    assert_true(fabs(p.layers[1].fwd_s - 3.25e-3) < 1e-15); /* ms -> s */
    assert_true(fabs(p.layers[1].bwd_s - 4e-3) < 1e-15);
    assert_true(p.layers[1].act_bytes == 60.5); /* the list is summed */
    assert_true(p.layers[1].param_bytes == 288.0);
    assert_int_equal(p.n_edges, 2);
    assert_int_equal(p.edges[0][0], 0);
    assert_int_equal(p.edges[0][1], 1);
    assert_int_equal(p.edges[1][0], 1);
    assert_int_equal(p.edges[1][1], 2);
    assert_true(profile_is_chain(&p));
    profile_release(&p);
}

/* A valid node's metadata, and a head and a layer of a valid JSON profile. */
#define OK_META "forward_compute_time=1.0, backward_compute_time=1.0, activation_size=4.0, parameter_size=0.0"
#define JSON_HEAD "{\"format\": \"pipedream-profile\", \"version\": 1, \"model\": \"m\", \"minibatch\": 8, "
#define JSON_LAYER                                                                                                   \
    "{\"name\": \"a\", \"type\": \"linear\", \"forward_s\": 1, \"backward_s\": 2, \"activation_bytes\": 4, " \
    "\"parameter_bytes\": 8}"
#define JSON_SAVED(b)                                                                                      \
    "{\"name\": \"a\", \"type\": \"linear\", \"forward_s\": 1, \"backward_s\": 2, \"activation_bytes\": 4, " \
    "\"parameter_bytes\": 8, \"saved_bytes\": " #b "}"

static void test_bad_graph_txt(void **state) {
    (void)state;
    expect_error("", "empty graph");
    expect_error("\n\n", "empty graph");
    expect_error("node1 -- Conv\n", "malformed node line");
    expect_error("node1 -- Conv -- forward_compute_time=1.0, backward_compute_time=1.0\n", "malformed node metadata");
    expect_error("node1 -- Conv -- forward_compute_time=abc, backward_compute_time=1.0, activation_size=4.0, "
                 "parameter_size=0.0\n",
                 "malformed node metadata");
    expect_error("node1 -- Conv -- forward_compute_time=-1.0, backward_compute_time=1.0, activation_size=4.0, "
                 "parameter_size=0.0\n",
                 "negative or not finite");
    expect_error("node1 -- Conv -- forward_compute_time=nan, backward_compute_time=1.0, activation_size=4.0, "
                 "parameter_size=0.0\n",
                 "negative or not finite");
    expect_error("node1 -- Conv -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=[4.0; x], "
                 "parameter_size=0.0\n",
                 "malformed node metadata");
    expect_error("node1 -- A -- " OK_META "\n\tnode1 -- node9\n", "unknown node \"node9\"");
    expect_error("node1 -- A -- " OK_META "\nnode2 -- B -- " OK_META "\n\tnode1 -- node2\n\tnode2 -- node1\n", "cycle");
    expect_error("node1 -- A -- " OK_META "\n\tnode1 -- node1\n", "cycle");
    expect_error("node1 -- A -- " OK_META "\nnode1 -- B -- " OK_META "\n", "duplicate node id");
    expect_error("node1 -- A -- " OK_META "\nnode2 -- B -- " OK_META "\n\tnode1 -- node2\n\tnode1 -- node2\n",
                 "duplicate edge");
    expect_error("node1 -- A -- " OK_META "\n\tnode1\n", "malformed edge line");
    expect_error("node1 -- A -- " OK_META " -- stage=x\n", "malformed stage_id");
}

static void test_bad_json(void **state) {
    (void)state;
    expect_error("{\"format\": \"pipedream-profile\", ", "not valid JSON");
    expect_error(JSON_HEAD "\"layers\": []}", "no layers");
    expect_error(JSON_HEAD "\"layers\": [" JSON_LAYER "], \"colour\": 1}", "colour");
    expect_error(JSON_HEAD "\"layers\": [{\"name\": \"a\", \"type\": \"t\", \"forward_s\": -1, \"backward_s\": 2, "
                 "\"activation_bytes\": 4, \"parameter_bytes\": 8}]}",
                 "forward_s");
    expect_error(JSON_HEAD "\"layers\": [" JSON_LAYER ", " JSON_LAYER "], \"edges\": [[0, 5]]}", "unknown layer");
    /* saved_bytes: all layers or none, never negative */
    expect_error(JSON_HEAD "\"layers\": [" JSON_LAYER ", " JSON_SAVED(16) "]}", "saved_bytes given for some");
    expect_error(JSON_HEAD "\"layers\": [" JSON_SAVED(16) ", " JSON_LAYER "]}", "saved_bytes missing");
    expect_error(JSON_HEAD "\"layers\": [" JSON_SAVED(-1) "]}", "saved_bytes");
    expect_error(JSON_HEAD "\"layers\": [" JSON_LAYER ", " JSON_LAYER "], \"edges\": [[1, 0]]}", "topological order");
    expect_error(JSON_HEAD "\"layers\": [" JSON_LAYER ", " JSON_LAYER "], \"edges\": [[0, 0]]}", "cycle");
    expect_error(JSON_HEAD "\"layers\": [" JSON_LAYER ", " JSON_LAYER "], \"edges\": [[0, 1.5]]}", "edge 0");
    /* small-batch times: with small_batch (1 .. minibatch - 1), for every layer, never negative */
#define JSON_SMALL(sf, extra)                                                                              \
    "{\"name\": \"a\", \"type\": \"linear\", \"forward_s\": 1, \"backward_s\": 2, \"activation_bytes\": 4, " \
    "\"parameter_bytes\": 8, \"small_forward_s\": " #sf ", \"small_backward_s\": 1" extra "}"
    {
        Profile p;
        Err err = {0};
        const char *ok = JSON_HEAD "\"small_batch\": 2, \"layers\": [" JSON_SMALL(0.5, "") "]}";
        assert_int_equal(profile_parse(ok, "ok.json", &p, &err), PD_OK);
        assert_int_equal(p.small_batch, 2);
        assert_true(p.layers[0].small_fwd_s == 0.5 && p.layers[0].small_bwd_s == 1);
        profile_release(&p);
    }
    expect_error(JSON_HEAD "\"small_batch\": 2, \"layers\": [" JSON_SMALL(-1, "") "]}",
                 "key \"small_forward_s\": -1 is outside [0,");
    expect_error(JSON_HEAD "\"small_batch\": 8, \"layers\": [" JSON_SMALL(0.5, "") "]}",
                 "small_batch 8 is not between 1 and minibatch - 1 (minibatch 8)");
    expect_error(JSON_HEAD "\"small_batch\": 12, \"layers\": [" JSON_SMALL(0.5, "") "]}", "small_batch 12 is not between");
    expect_error(JSON_HEAD "\"small_batch\": 0, \"layers\": [" JSON_SMALL(0.5, "") "]}",
                 "key \"small_batch\": 0 is outside [1,");
    expect_error(JSON_HEAD "\"layers\": [" JSON_SMALL(0.5, "") "]}",
                 "small-batch times given but the profile has no small_batch");
    expect_error(JSON_HEAD "\"small_batch\": 2, \"layers\": [" JSON_SMALL(0.5, "") ", " JSON_LAYER "]}",
                 "layer 1: small_forward_s and small_backward_s missing");
    expect_error(JSON_HEAD "\"small_batch\": 2, \"layers\": [" JSON_SMALL(0.5, ", \"small_backward_input_s\": 0.5, "
                 "\"small_backward_weight_s\": 0.5") "]}",
                 "give small_backward_input_s and small_backward_weight_s with backward_input_s");
    expect_error(JSON_HEAD "\"small_batch\": 2, \"layers\": [" JSON_SMALL(0.5, ", \"backward_input_s\": 1, "
                 "\"backward_weight_s\": 1") "]}",
                 "give small_backward_input_s and small_backward_weight_s with backward_input_s");
    /* the cuts' prices: none before the first layer or after the last */
#define JSON_CUT(key) \
    "{\"name\": \"a\", \"type\": \"conv2d\", \"forward_s\": 1, \"backward_s\": 2, \"activation_bytes\": 4, " \
    "\"parameter_bytes\": 8, \"" key "\": 0.5}"
    expect_error(JSON_HEAD "\"layers\": [" JSON_CUT("cut_input_forward_s") ", " JSON_LAYER "]}",
                 "layer 0: no stage boundary can be before it: cut_input_* must be 0");
    expect_error(JSON_HEAD "\"layers\": [" JSON_LAYER ", " JSON_CUT("cut_output_backward_s") "]}",
                 "layer 1: no stage boundary can be after it: cut_output_* must be 0");
    expect_error(JSON_HEAD "\"layers\": [" JSON_LAYER ", {\"name\": \"a\", \"type\": \"t\", \"forward_s\": 1, "
                 "\"backward_s\": 2, \"activation_bytes\": 4, \"parameter_bytes\": 8, \"cut_input_backward_s\": -1}]}",
                 "cut_input_backward_s");
    expect_error("{\"format\": \"other\", \"version\": 1, \"model\": \"m\", \"minibatch\": 8, \"layers\": [" JSON_LAYER
                 "]}",
                 "pipedream-profile");
}

/* Every profile in tests/data/pipedream-profiles loads, with as many layers as node lines
 * and as many edges as edge lines. */
/* profile_spread_step: the step counts 1/m in each unit's backward, in the pass that holds it. */
static void test_spread_step(void **state) {
    (void)state;
    ProfileLayer L[3] = {{.fwd_s = 1, .bwd_s = 2, .bwd_in_s = 0.8, .bwd_w_s = 1.2, .step_s = 0.8},
                         {.fwd_s = 1, .bwd_s = 3, .bwd_in_s = 3, .bwd_w_s = 0, .step_s = 0.4},
                         {.fwd_s = 1, .bwd_s = 0.5}};
    Profile p = {.n_layers = 3, .layers = L};
    profile_spread_step(&p, 1);   /* a step per unit: unchanged */
    assert_true(L[0].bwd_s == 2 && L[0].step_s == 0.8);
    profile_spread_step(&p, 4);
    assert_true(fabs(L[0].bwd_s - 1.4) < 1e-12 && fabs(L[0].bwd_w_s - 0.6) < 1e-12 && L[0].bwd_in_s == 0.8);
    assert_true(fabs(L[0].step_s - 0.2) < 1e-12);
    assert_true(fabs(L[1].bwd_s - 2.7) < 1e-12 && fabs(L[1].bwd_in_s - 2.7) < 1e-12 && L[1].bwd_w_s == 0);
    assert_true(L[2].bwd_s == 0.5 && L[2].step_s == 0);   /* no step measured */
    Err err = {0};
    assert_int_equal(profile_validate(&p, &err), PD_OK);
    /* small-batch times: the same step, so the same seconds come out of their backward */
    ProfileLayer S[2] = {{.fwd_s = 1, .bwd_s = 2, .bwd_in_s = 0.8, .bwd_w_s = 1.2, .step_s = 0.8, .small_fwd_s = 0.5,
                          .small_bwd_s = 1.2, .small_bwd_in_s = 0.3, .small_bwd_w_s = 0.9},
                         {.fwd_s = 1, .bwd_s = 3, .bwd_in_s = 3, .bwd_w_s = 0, .step_s = 0.4, .small_fwd_s = 0.5,
                          .small_bwd_s = 1, .small_bwd_in_s = 1, .small_bwd_w_s = 0}};
    Profile q = {.n_layers = 2, .layers = S, .minibatch = 8, .small_batch = 2};
    profile_spread_step(&q, 4);
    assert_true(fabs(S[0].small_bwd_s - 0.6) < 1e-12 && fabs(S[0].small_bwd_w_s - 0.3) < 1e-12);
    assert_true(S[0].small_bwd_in_s == 0.3 && S[0].small_fwd_s == 0.5);
    assert_true(fabs(S[1].small_bwd_s - 0.7) < 1e-12 && fabs(S[1].small_bwd_in_s - 0.7) < 1e-12 && S[1].small_bwd_w_s == 0);
    assert_int_equal(profile_validate(&q, &err), PD_OK);
    /* calibration scales them with the rest */
    profile_scale_layer(&q, 0, 2);
    assert_true(S[0].fwd_s == 2 && S[0].small_fwd_s == 1 && fabs(S[0].small_bwd_s - 1.2) < 1e-12);
    assert_true(S[0].small_bwd_in_s == 0.6 && fabs(S[0].small_bwd_w_s - 0.6) < 1e-12);
    assert_true(S[1].small_fwd_s == 0.5);   /* other layers stay */
    /* in memory: negative, or without the profile's small_batch, refused */
    S[1].small_bwd_s = -1;
    assert_int_equal(profile_validate(&q, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "small-batch backward time -1 is negative or not finite"));
    S[1].small_bwd_s = 1;
    q.small_batch = 0;
    assert_int_equal(profile_validate(&q, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "small-batch times without the profile's small_batch"));
    q.small_batch = 8;
    assert_int_equal(profile_validate(&q, &err), PD_EINVAL);
    assert_non_null(strstr(err.msg, "small_batch 8 is not between 1 and minibatch - 1"));
}

static void test_authors_profiles(void **state) {
    (void)state;
    static const char *names[] = {"alexnet/graph.txt",       "vgg16/graph.txt",     "resnet18/graph.txt",
                                  "resnet50/graph.txt",      "resnet101/graph.txt", "squeezenet1_0/graph.txt",
                                  "densenet121/graph.txt",   "inception_v3/graph.txt",
                                  "inception_v3/graph_compressed.txt", "gnmt/graph.txt", "gnmt_large/graph.txt"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/data/pipedream-profiles/%s", names[i]);
        const char *path = tu_src(rel);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        int nodes = 0, edges = 0;
        char line[4096];
        while (fgets(line, sizeof line, f)) {
            if (line[0] == '\t') edges++;
            else if (line[0] && line[0] != '\n') nodes++;
        }
        fclose(f);
        Profile p;
        Err err = {0};
        int rc = profile_load(path, &p, &err);
        if (rc) fprintf(stderr, "%s: %s\n", names[i], err.msg);
        assert_int_equal(rc, PD_OK);
        assert_int_equal(p.n_layers, nodes);
        assert_int_equal(p.n_edges, edges);
        for (int e = 0; e < p.n_edges; e++) assert_true(p.edges[e][0] < p.edges[e][1]);
        assert_true(p.checksum != 0);
        profile_release(&p);
    }
    /* vgg16 has a Size/View diamond in their format, so it is not a chain; nor is gnmt. */
    Profile p;
    Err err = {0};
    assert_int_equal(profile_load(tu_src("tests/data/pipedream-profiles/vgg16/graph.txt"), &p, &err), PD_OK);
    assert_false(profile_is_chain(&p));
    assert_string_equal(p.model, "vgg16");
    profile_release(&p);
    assert_int_equal(profile_load(tu_src("tests/data/pipedream-profiles/gnmt/graph.txt"), &p, &err), PD_OK);
    assert_false(profile_is_chain(&p));
    profile_release(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_round_trip), cmocka_unit_test(test_graph_txt),
        cmocka_unit_test(test_bad_graph_txt),   cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_authors_profiles), cmocka_unit_test(test_spread_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
