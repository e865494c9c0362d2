/* test_sim_svg.c: timeline pictures of long runs (src/sim/timeline.c): the fill and
 * steady-state windows (sim_svg_fill_steady), drawing only what is inside them, clipped, at
 * one scale across stacked panels (sim_svg_write_panels). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim.h"

/* A 1F1B-like pattern: n_w workers, n_units units; worker w runs unit u's forward at
 * (u + w) * 3 ms + 0..1 ms and its backward at (u + 2 n_w - w) * 3 ms + 1..3 ms, a send after
 * each forward; times shifted by t0 (measured traces carry clock readings). */
static TraceEvent *pattern(int n_w, int n_units, double t0, double scale, int *n) {
    TraceEvent *ev = malloc(sizeof(TraceEvent) * (size_t)(3 * n_w * n_units));
    int k = 0;
    for (int w = 0; w < n_w; w++)
        for (int u = 0; u < n_units; u++) {
            double f = t0 + scale * (u + w) * 3e-3, b = t0 + scale * (u + 2 * n_w - w) * 3e-3;
            ev[k++] = (TraceEvent){w, TRACE_FWD, u, -1, f, f + scale * 1e-3};
            ev[k++] = (TraceEvent){w, TRACE_BWD, u, -1, b + scale * 1e-3, b + scale * 3e-3};
            ev[k++] = (TraceEvent){w, TRACE_SEND, u, w + 1, f + scale * 1e-3, f + scale * 1.2e-3};
        }
    *n = k;
    return ev;
}

static char *write_read(const SvgPanel *p, int np, const char *title) {
    char path[] = "/tmp/pd_test_svg_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    Err err = {0};
    assert_int_equal(sim_svg_write_panels(path, p, np, title, &err), PD_OK);
    char *text;
    size_t len;
    assert_int_equal(pd_read_file(path, 1 << 26, &text, &len, &err), PD_OK);
    unlink(path);
    assert_non_null(strstr(text, "</svg>\n"));   /* complete */
    return text;
}

static int count(const char *text, const char *what) {
    int c = 0;
    for (const char *q = text; (q = strstr(q, what)); q++) c++;
    return c;
}

static int svg_width(const char *text) { return atoi(strstr(text, "width=\"") + 7); }

static void test_fill_steady_windows(void **st) {
    (void)st;
    int n;
    TraceEvent *ev = pattern(4, 937, 1000.0, 1.0, &n);
    SvgWindows w;
    assert_int_equal(sim_svg_fill_steady(ev, n, 4, 30, &w), 2);
    /* the start: from the first event, units 0..11 (3 x 4 workers) and what runs meanwhile */
    assert_true(fabs(w.t[0][0] - 1000.0) < 1e-9);
    assert_true(fabs(w.t[0][1] - (1000.0 + (11 + 8) * 3e-3 + 3e-3)) < 1e-9);   /* unit 11's last backward */
    /* steady state: units 453..482 from the middle */
    assert_true(fabs(w.t[1][0] - (1000.0 + 453 * 3e-3)) < 1e-9);
    assert_true(fabs(w.t[1][1] - (1000.0 + (482 + 8) * 3e-3 + 3e-3)) < 1e-9);
    assert_non_null(strstr(w.label[0], "0-11"));
    assert_non_null(strstr(w.label[1], "453-482"));
    /* a short run is drawn whole */
    free(ev);
    ev = pattern(4, 50, 0, 1.0, &n);
    assert_int_equal(sim_svg_fill_steady(ev, n, 4, 30, &w), 0);
    assert_int_equal(w.n, 0);
    free(ev);
}

static void test_windows_drawn_clipped(void **st) {
    (void)st;
    int n;
    TraceEvent *ev = pattern(4, 937, 1000.0, 1.0, &n);
    SvgPanel p = {.ev = ev, .n = n, .n_workers = 4, .o = {.title = "measured <1f1b>", .show_comm = 1}};
    /* the whole run: every box, squeezed to 3000 px */
    char *text = write_read(&p, 1, NULL);
    assert_int_equal(count(text, "<title>forward") + count(text, "<title>backward"), 2 * 4 * 937);
    assert_int_equal(svg_width(text), 3000);
    pd_free(text);
    /* the windows: only the boxes inside them, each labelled with its number */
    sim_svg_fill_steady(ev, n, 4, 30, &p.win);
    text = write_read(&p, 1, "vgg16");
    int boxes = count(text, "<title>forward") + count(text, "<title>backward");
    int want = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < p.win.n; k++)
            want += (ev[i].kind == TRACE_FWD || ev[i].kind == TRACE_BWD) && ev[i].end > p.win.t[k][0] &&
                    ev[i].start < p.win.t[k][1];
    assert_int_equal(boxes, want);
    assert_true(boxes > 2 * 4 * (12 + 30) && boxes < 2 * 4 * (12 + 30 + 20));
    int width = svg_width(text);
    assert_true(width >= 900 && width < 3000);
    assert_non_null(strstr(text, "measured &lt;1f1b&gt;"));
    assert_non_null(strstr(text, "steady state"));
    assert_non_null(strstr(text, ">470</text>"));   /* a minibatch number inside its box */
    /* every box inside the plot, none in the break between the windows */
    double x_end0 = -1, x_start1 = 1e9;
    for (const char *q = text; (q = strstr(q, "<rect x=\"")); q++) {
        const char *gt = strchr(q, '>');
        if (strncmp(gt, "><title>forward", 15) && strncmp(gt, "><title>backward", 16)) continue;
        double x = atof(q + 9), w = atof(strstr(q, "width=\"") + 7);
        assert_true(x >= 60 && x + w <= width - 19);
        double t = atof(strstr(gt, ": ") + 2);   /* the box's start time in its title */
        if (t < 1100 && x + w > x_end0) x_end0 = x + w;
        if (t > 1100 && x < x_start1) x_start1 = x;
    }
    assert_true(x_start1 - x_end0 >= 25);   /* the break */
    /* tick labels in seconds from the start of the run, in both windows */
    assert_non_null(strstr(text, ">0.00s</text>"));
    assert_non_null(strstr(text, ">1.40s</text>"));
    pd_free(text);
    free(ev);
}

/* Stacked panels each fill the width: a run twice as slow gets the same drawing, its axis
 * twice as long; the first panel is on top. */
static void test_panels(void **st) {
    (void)st;
    int n1, n2;
    TraceEvent *e1 = pattern(4, 300, 50.0, 2.0, &n1), *e2 = pattern(4, 300, 0, 1.0, &n2);
    SvgPanel p[2] = {{.ev = e1, .n = n1, .n_workers = 4, .o = {.title = "measured"}},
                     {.ev = e2, .n = n2, .n_workers = 4, .o = {.title = "simulated"}}};
    sim_svg_fill_steady(e1, n1, 4, 30, &p[0].win);
    sim_svg_fill_steady(e2, n2, 4, 30, &p[1].win);
    assert_int_equal(p[0].win.n, 2);
    assert_int_equal(p[1].win.n, 2);
    char *text = write_read(p, 2, "two panels");
    /* the row bands (fill #ebebeb: workers 0 and 2) of each window */
    double bw[8];
    int nb = 0;
    for (const char *q = text; (q = strstr(q, "fill=\"#ebebeb\"")) && nb < 16; q++) {
        const char *r = q;
        while (strncmp(r, "<rect", 5)) r--;
        if (nb < 8) bw[nb] = atof(strstr(r, "width=\"") + 7);
        nb++;
    }
    assert_int_equal(nb, 8);   /* 2 panels x 2 rows x 2 windows */
    assert_true(fabs(bw[0] - bw[4]) < 0.2 && fabs(bw[1] - bw[5]) < 0.2);
    assert_true(strstr(text, "measured") < strstr(text, "simulated"));
    /* the steady-state windows: from 0.81 s (slow, ticks every 0.02 s) and 0.405 s (ticks 0.01 s) */
    assert_non_null(strstr(text, ">0.82s</text>"));
    assert_non_null(strstr(text, ">1.02s</text>"));
    assert_non_null(strstr(text, ">0.41s</text>"));
    assert_non_null(strstr(text, ">0.51s</text>"));
    assert_null(strstr(text, ">0.52s</text>"));
    pd_free(text);
    free(e1);
    free(e2);
}

/* sim_svg_write draws a long run as the fill and a mid-run stretch, a short one whole. */
static void test_write_long_run(void **st) {
    (void)st;
    char path[] = "/tmp/pd_test_svg_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    Err err = {0};
    char *text;
    size_t len;
    for (int units = 50; units <= 937; units += 887) {
        int n;
        TraceEvent *ev = pattern(4, units, 0, 1.0, &n);
        SvgOpts o = {.title = "long"};
        assert_int_equal(sim_svg_write(path, ev, n, 4, &o, &err), PD_OK);
        assert_int_equal(pd_read_file(path, 1 << 26, &text, &len, &err), PD_OK);
        int boxes = count(text, "<title>forward") + count(text, "<title>backward");
        if (units == 50) {
            assert_int_equal(boxes, 2 * 4 * 50);
            assert_null(strstr(text, "mid-run"));
        } else {
            assert_true(boxes < 2 * 4 * 70);
            assert_non_null(strstr(text, "mid-run (units 453-482)"));
            assert_true(svg_width(text) < 3000);
        }
        pd_free(text);
        free(ev);
    }
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fill_steady_windows),
        cmocka_unit_test(test_windows_drawn_clipped),
        cmocka_unit_test(test_panels),
        cmocka_unit_test(test_write_long_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
