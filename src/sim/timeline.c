/* timeline.c: pictures of a run. Turns a simulated run into a generic event list
 * (worker, kind, mb, start, end) and draws any such list as an SVG timeline or writes
 * it as Chrome trace-event JSON. Measured runtime traces use the same two writers. It
 * computes no times itself. */
#include "sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int sim_trace_kind(int op) {
    switch (op) {
    case OP_FORWARD: return TRACE_FWD;
    case OP_RECOMPUTE: return TRACE_RECOMPUTE;
    case OP_BACKWARD:
    case OP_BACKWARD_B: return TRACE_BWD;
    case OP_BACKWARD_W: return TRACE_WGRAD;
    case OP_SEND_ACT:
    case OP_SEND_GRAD: return TRACE_SEND;
    case OP_RECV_ACT:
    case OP_RECV_GRAD: return TRACE_RECV_WAIT;
    case OP_ALLREDUCE: return TRACE_ALLREDUCE;
    case OP_STEP: return TRACE_STEP;
    default: return -1;
    }
}

TraceEvent *sim_events(const Schedule *s, const SimResult *r, int *n) {
    size_t cap = 0;
    for (int w = 0; w < s->n_ranks; w++) cap += (size_t)s->workers[w].n;
    TraceEvent *ev = malloc((cap + 1) * sizeof *ev);
    PD_ASSERT(ev);
    int k = 0;
    for (int w = 0; w < s->n_ranks; w++) {
        const SchedWorker *sw = &s->workers[w];
        for (int i = 0; i < sw->n; i++) {
            const Instr *in = &sw->ins[i];
            double a = r->start[w][i], b = r->end[w][i];
            int kind = sim_trace_kind(in->op);
            if (kind < 0) continue;
            if (kind != TRACE_FWD && kind != TRACE_BWD && kind != TRACE_WGRAD && kind != TRACE_RECOMPUTE && !(b > a)) continue;
            ev[k++] = (TraceEvent){w, kind, in->mb, in->op == OP_SEND_ACT || in->op == OP_SEND_GRAD ? in->peer : -1, a, b};
        }
    }
    *n = k;
    return ev;
}

/* A step of 1, 2 or 5 x 10^k of at least `raw` seconds. */
static double nice_step_up(double raw) {
    double p = pow(10, floor(log10(raw))), m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

/* A tick label: t seconds from the run's start, ticks `step` apart; tmax is the largest
 * label of the picture (seconds once it reaches a second, else ms or us). */
static void fmt_time(double t, double step, double tmax, char *buf, size_t n) {
    if (step >= 1) snprintf(buf, n, "%gs", t);
    else if (tmax >= 1) {
        int dec = (int)ceil(-log10(step) - 1e-9);
        snprintf(buf, n, "%.*fs", dec < 0 ? 0 : dec, t);
    } else if (step >= 1e-3) snprintf(buf, n, "%gms", round(t * 1e6) / 1e3);
    else snprintf(buf, n, "%gus", round(t * 1e9) / 1e3);
}

static void mb_colour(int mb, int bwd, char *buf, size_t n) {
    double h = fmod((mb < 0 ? 0 : mb) * 0.6180339887, 1.0) * 360.0;
    snprintf(buf, n, "hsl(%.0f,%d%%,%d%%)", h, bwd ? 55 : 75, bwd ? 38 : 70);
}

static void xml_text(FILE *f, const char *s) {
    for (const char *c = s; *c; c++) {
        if (*c == '<') fputs("&lt;", f);
        else if (*c == '>') fputs("&gt;", f);
        else if (*c == '&') fputs("&amp;", f);
        else fputc(*c, f);
    }
}

static int is_compute(const TraceEvent *e) {
    return e->kind == TRACE_FWD || e->kind == TRACE_BWD || e->kind == TRACE_WGRAD || e->kind == TRACE_RECOMPUTE;
}

/* [first start, last end] of the compute boxes of units lo..hi (below n_units); 0 if none. */
static int unit_span(const TraceEvent *ev, int n, int lo, int hi, double *a, double *b) {
    *a = INFINITY, *b = -INFINITY;
    for (int i = 0; i < n; i++)
        if (is_compute(&ev[i]) && ev[i].mb >= lo && ev[i].mb <= hi) {
            if (ev[i].start < *a) *a = ev[i].start;
            if (ev[i].end > *b) *b = ev[i].end;
        }
    return *b >= *a;
}

int sim_svg_fill_steady(const TraceEvent *ev, int n, int n_workers, int stretch, SvgWindows *o) {
    memset(o, 0, sizeof *o);
    int units = 0, any_bwd = 0;
    for (int i = 0; i < n; i++)
        if (ev[i].kind == TRACE_BWD) any_bwd = 1;
    for (int i = 0; i < n; i++)
        if ((any_bwd ? ev[i].kind == TRACE_BWD : is_compute(&ev[i])) && ev[i].mb + 1 > units) units = ev[i].mb + 1;
    if (stretch < 1) stretch = 30;
    int fill = 3 * n_workers > 8 ? 3 * n_workers : 8;
    if (units < 2 * fill + stretch) return 0;   /* short: the whole run reads well */
    int mid = units / 2 - stretch / 2;
    double a0, a1, b0, b1;
    if (!unit_span(ev, n, 0, fill - 1, &a0, &a1) || !unit_span(ev, n, mid, mid + stretch - 1, &b0, &b1)) return 0;
    if (b0 <= a1) return 0;
    o->n = 2;
    o->t[0][0] = a0, o->t[0][1] = a1;
    o->t[1][0] = b0, o->t[1][1] = b1;
    snprintf(o->label[0], sizeof o->label[0], "start: the fill, then steady state (units 0-%d)", fill - 1);
    snprintf(o->label[1], sizeof o->label[1], "mid-run (units %d-%d)", mid, mid + stretch - 1);
    return 2;
}

/* The layout of one panel. */
typedef struct PanelGeo {
    int nw;                               /* windows */
    double w[SVG_MAX_WINDOWS][2];         /* [t0, t1] each */
    double x[SVG_MAX_WINDOWS];            /* left pixel of each window */
    double origin;                        /* earliest event: tick labels are relative to it */
    double span;                          /* sum of the windows' durations */
    int max_row;                          /* compute boxes in the windows, busiest row */
    double sx, step;                      /* pixels per second, seconds between ticks */
    int y, height;                        /* top pixel, pixels */
} PanelGeo;

enum { SVG_GAP = 30, SVG_RIGHT = 20, SVG_BOX_H = 18, SVG_AUTO_WINDOW_BOXES = 160 };

static void panel_geo(const SvgPanel *p, PanelGeo *g) {
    memset(g, 0, sizeof *g);
    const SvgWindows *o = &p->win;
    double t0 = INFINITY, t1 = -INFINITY;
    for (int i = 0; i < p->n; i++) {
        if (p->ev[i].start < t0) t0 = p->ev[i].start;
        if (p->ev[i].end > t1) t1 = p->ev[i].end;
    }
    if (p->n == 0) t0 = 0, t1 = 1;
    if (!(t1 > t0)) t1 = t0 + 1;
    g->origin = t0;
    g->nw = o->n > 0 ? (o->n < SVG_MAX_WINDOWS ? o->n : SVG_MAX_WINDOWS) : 1;
    for (int k = 0; k < g->nw; k++) {
        g->w[k][0] = o->n > 0 ? o->t[k][0] : t0;
        g->w[k][1] = o->n > 0 ? o->t[k][1] : t1;
        if (!(g->w[k][1] > g->w[k][0])) g->w[k][1] = g->w[k][0] + 1e-9;
        g->span += g->w[k][1] - g->w[k][0];
    }
    int *per_row = calloc((size_t)p->n_workers + 1, sizeof(int));
    PD_ASSERT(per_row);
    for (int i = 0; i < p->n; i++) {
        const TraceEvent *e = &p->ev[i];
        if (!is_compute(e) || e->worker < 0 || e->worker >= p->n_workers) continue;
        for (int k = 0; k < g->nw; k++)
            if (e->end > g->w[k][0] && e->start < g->w[k][1]) {
                per_row[e->worker]++;
                break;
            }
    }
    for (int w = 0; w < p->n_workers; w++)
        if (per_row[w] > g->max_row) g->max_row = per_row[w];
    free(per_row);
}

static int has_window_labels(const SvgWindows *o) {
    for (int k = 0; k < o->n && k < SVG_MAX_WINDOWS; k++)
        if (o->label[k][0]) return 1;
    return 0;
}

/* Draws the clipped part of e inside window k of g. */
static void draw_event(FILE *f, const TraceEvent *e, const PanelGeo *g, int k, double sx, int y, const SvgOpts *o) {
    double a = e->start > g->w[k][0] ? e->start : g->w[k][0], b = e->end < g->w[k][1] ? e->end : g->w[k][1];
    if (b < a || (b == a && !(e->start >= g->w[k][0] && e->start <= g->w[k][1]))) return;
    double x = g->x[k] + (a - g->w[k][0]) * sx, w = (b - a) * sx;
    if (is_compute(e)) {
        char col[48];
        mb_colour(e->mb, e->kind == TRACE_BWD, col, sizeof col);
        if (e->kind == TRACE_WGRAD || e->kind == TRACE_RECOMPUTE)   /* zb's weight gradient: mid; recompute: pale */
            snprintf(col, sizeof col, "hsl(%.0f,%d%%,%d%%)", fmod((e->mb < 0 ? 0 : e->mb) * 0.6180339887, 1.0) * 360.0,
                     e->kind == TRACE_WGRAD ? 45 : 60, e->kind == TRACE_WGRAD ? 52 : 88);
        fprintf(f, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\" stroke=\"white\" stroke-width=\"0.5\">"
                   "<title>%s %d: %.6g-%.6g s</title></rect>\n",
                x, y, w > 0.5 ? w : 0.5, SVG_BOX_H, col,
                e->kind == TRACE_FWD     ? "forward"
                : e->kind == TRACE_BWD   ? "backward"
                : e->kind == TRACE_WGRAD ? "weight gradient"
                                         : "recompute",
                e->mb, e->start,
                e->end);
        int digits = e->mb >= 1000 ? 4 : e->mb >= 100 ? 3 : e->mb >= 10 ? 2 : 1;
        int fs = w >= digits * 7 + 3 ? 11 : w >= digits * 5.5 + 2 ? 9 : 0;
        if (fs && e->mb >= 0)
            fprintf(f, "<text x=\"%.2f\" y=\"%d\" font-size=\"%d\" text-anchor=\"middle\" fill=\"%s\">%d</text>\n",
                    x + w / 2, y + 13, fs, e->kind == TRACE_BWD ? "white" : "black", e->mb);
    } else if (o->show_comm && (e->kind == TRACE_SEND || e->kind == TRACE_ALLREDUCE)) {
        fprintf(f, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"4\" fill=\"%s\" opacity=\"0.7\">"
                   "<title>%s %d: %.6g-%.6g s</title></rect>\n",
                x, y + SVG_BOX_H + 2 + (e->kind == TRACE_ALLREDUCE ? 4 : 0), w > 0.5 ? w : 0.5,
                e->kind == TRACE_SEND ? "#2060c0" : "#c02020", e->kind == TRACE_SEND ? "send of" : "all-reduce", e->mb,
                e->start, e->end);
    }
}

int sim_svg_write_panels(const char *path, const SvgPanel *p, int np, const char *title, Err *err) {
    PD_ASSERT(np >= 1);
    PanelGeo *g = calloc((size_t)np, sizeof *g);
    PD_ASSERT(g);
    /* the left margin fits the longest row label */
    int left = 70, any_comm = 0;
    for (int q = 0; q < np; q++) {
        any_comm |= p[q].o.show_comm;
        for (int w = 0; p[q].o.row_labels && w < p[q].n_workers; w++) {
            int need = 14 + 7 * (int)strlen(p[q].o.row_labels[w]);
            if (need > left) left = need < 240 ? need : 240;
        }
    }
    /* width: given, or ~18 px per box of the busiest row so two-digit labels fit (900-3000) */
    int width = p[0].o.width, max_nw = 1;
    for (int q = 0; q < np; q++) {
        panel_geo(&p[q], &g[q]);
        if (g[q].nw > max_nw) max_nw = g[q].nw;
    }
    if (width <= 0) {
        width = 900;
        for (int q = 0; q < np; q++) {
            int w = left + SVG_RIGHT + (g[q].nw - 1) * SVG_GAP + g[q].max_row * 18;
            if (w > width) width = w;
        }
        if (width > 3000) width = 3000;
    }
    /* each panel's windows fill the width (measured and simulated runs may differ severalfold
     * in speed: one scale would squeeze the faster one unreadably); ticks about 90 px apart,
     * in whole steps from the panel's first event */
    double tmax = 0;
    for (int q = 0; q < np; q++) {
        g[q].sx = (width - left - SVG_RIGHT - (g[q].nw - 1) * SVG_GAP) / g[q].span;
        g[q].step = nice_step_up(90.0 / g[q].sx);
        for (int k = 0; k < g[q].nw; k++)
            if (g[q].w[k][1] - g[q].origin > tmax) tmax = g[q].w[k][1] - g[q].origin;
    }
    /* vertical layout */
    int y = title ? 36 : 10;
    for (int q = 0; q < np; q++) {
        const SvgOpts *o = &p[q].o;
        int row_h = o->show_comm ? 30 : 24;
        g[q].y = y;
        g[q].height = (o->title ? 24 : 0) + (has_window_labels(&p[q].win) ? 16 : 0) + p[q].n_workers * row_h + 34;
        y += g[q].height + (q + 1 < np ? 10 : 0);
        double x = left;
        for (int k = 0; k < g[q].nw; k++) {
            g[q].x[k] = x;
            x += (g[q].w[k][1] - g[q].w[k][0]) * g[q].sx + SVG_GAP;
        }
    }
    int height = y + 24;
    FILE *f = fopen(path, "w");
    if (!f) {
        free(g);
        return err_set(err, PD_EIO, "%s: cannot write", path);
    }
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\">\n", width, height, width, height);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n", width, height);
    if (title) {
        fputs("<text x=\"10\" y=\"24\" font-size=\"16\" font-weight=\"bold\">", f);
        xml_text(f, title);
        fputs("</text>\n", f);
    }
    for (int q = 0; q < np; q++) {
        const SvgOpts *o = &p[q].o;
        const PanelGeo *G = &g[q];
        double sx = G->sx, step = G->step;
        int row_h = o->show_comm ? 30 : 24, top = G->y;
        if (o->title) {
            fprintf(f, "<text x=\"10\" y=\"%d\" font-size=\"%d\" font-weight=\"bold\">", top + 17, title ? 14 : 15);
            xml_text(f, o->title);
            fputs("</text>\n", f);
            top += 24;
        }
        if (has_window_labels(&p[q].win)) {
            for (int k = 0; k < G->nw; k++) {
                /* cut to the window's width (~6.5 px per character) */
                char lab[sizeof p[q].win.label[k]];
                snprintf(lab, sizeof lab, "%s", p[q].win.label[k]);
                int fit = (int)(((G->w[k][1] - G->w[k][0]) * sx + SVG_GAP - 10) / 6.5);
                if (fit < 4) continue;
                if ((int)strlen(lab) > fit) snprintf(lab + fit - 3, 4, "...");
                fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"12\" fill=\"#444\">", G->x[k], top + 11);
                xml_text(f, lab);
                fputs("</text>\n", f);
            }
            top += 16;
        }
        /* rows: a light band per worker and window, so idle time shows as empty band */
        for (int w = 0; w < p[q].n_workers; w++) {
            int ry = top + w * row_h;
            for (int k = 0; k < G->nw; k++)
                fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"/>\n", G->x[k], ry,
                        (G->w[k][1] - G->w[k][0]) * sx, SVG_BOX_H, w % 2 ? "#f4f4f4" : "#ebebeb");
            fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"end\">", left - 6, ry + 13);
            if (o->row_labels) xml_text(f, o->row_labels[w]);
            else fprintf(f, "worker %d", w);
            fputs("</text>\n", f);
        }
        /* time axis per window, labelled from the panel's first event; a break mark between */
        int ay = top + p[q].n_workers * row_h + 4;
        for (int k = 0; k < G->nw; k++) {
            double a = G->w[k][0] - G->origin, b = G->w[k][1] - G->origin;
            fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"black\"/>\n", G->x[k], ay,
                    G->x[k] + (b - a) * sx, ay);
            for (double t = ceil(a / step - 1e-9) * step; t <= b + step * 1e-9; t += step) {
                double x = G->x[k] + (t - a) * sx;
                char lab[32];
                fmt_time(fabs(t) < step * 1e-9 ? 0 : t, step, tmax, lab, sizeof lab);
                fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"black\"/>", x, ay, x, ay + 5);
                fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n", x, ay + 17, lab);
            }
            if (k + 1 < G->nw) {
                double xb = G->x[k] + (b - a) * sx + SVG_GAP / 2.0;
                for (int d = -3; d <= 3; d += 6)
                    fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#666\"/>\n", xb + d - 3,
                            ay + 5, xb + d + 3, ay - 5);
                fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"14\" fill=\"#666\" text-anchor=\"middle\">&#8943;</text>\n",
                        xb, top + p[q].n_workers * row_h / 2 + 2);
            }
        }
        /* boxes */
        for (int i = 0; i < p[q].n; i++) {
            const TraceEvent *e = &p[q].ev[i];
            if (e->worker < 0 || e->worker >= p[q].n_workers) continue;
            for (int k = 0; k < G->nw; k++) draw_event(f, e, G, k, sx, top + e->worker * row_h, o);
        }
    }
    int any_w = 0, any_r = 0;
    for (int q = 0; q < np; q++)
        for (int i = 0; i < p[q].n; i++) any_w |= p[q].ev[i].kind == TRACE_WGRAD, any_r |= p[q].ev[i].kind == TRACE_RECOMPUTE;
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"11\">light: forward, dark: backward%s%s, colour and number: "
               "unit (minibatch, or micro-batch when minibatches are split)%s%s</text>\n", left, height - 10,
            any_w ? ", mid: weight grad." : "", any_r ? ", pale: recompute" : "",
            any_comm ? "; thin bars: sends (blue), all-reduce (red)" : "",
            max_nw > 1 ? "; time from the start of the run" : "");
    fputs("</svg>\n", f);
    free(g);
    if (fclose(f) != 0) return err_set(err, PD_EIO, "%s: write failed", path);
    return PD_OK;
}

int sim_svg_write(const char *path, const TraceEvent *ev, int n, int n_workers, const SvgOpts *o, Err *err) {
    SvgPanel p = {.ev = ev, .n = n, .n_workers = n_workers};
    if (o) p.o = *o;
    p.o.title = NULL;   /* the picture's title, bigger */
    /* a run whose busiest row has more boxes than 3000 px show at ~18 px each: the start and
     * 30 units from mid-run (the Chrome trace keeps everything) */
    int *per_row = calloc((size_t)n_workers + 1, sizeof(int)), max_row = 0;
    PD_ASSERT(per_row);
    for (int i = 0; i < n; i++)
        if (is_compute(&ev[i]) && ev[i].worker >= 0 && ev[i].worker < n_workers && ++per_row[ev[i].worker] > max_row)
            max_row = per_row[ev[i].worker];
    free(per_row);
    if (max_row > SVG_AUTO_WINDOW_BOXES) sim_svg_fill_steady(ev, n, n_workers, 30, &p.win);
    return sim_svg_write_panels(path, &p, 1, o ? o->title : NULL, err);
}

int sim_trace_write(const char *path, const TraceEvent *ev, int n, Err *err) {
    static const char *const names[] = {"F", "B", "send", "recv wait", "all-reduce", "step", "W", "R"};
    _Static_assert(sizeof names / sizeof names[0] == TRACE_COUNT, "trace names");
    FILE *f = fopen(path, "w");
    if (!f) return err_set(err, PD_EIO, "%s: cannot write", path);
    int max_w = -1;
    for (int i = 0; i < n; i++)
        if (ev[i].worker > max_w) max_w = ev[i].worker;
    fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n", f);
    int first = 1;
    for (int w = 0; w <= max_w; w++) {
        fprintf(f, "%s{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": \"worker %d\"}}",
                first ? "" : ",\n", w, w);
        first = 0;
    }
    for (int i = 0; i < n; i++) {
        const TraceEvent *e = &ev[i];
        if (e->kind < 0 || e->kind >= TRACE_COUNT) continue;
        char name[48];
        int comp = e->kind <= TRACE_BWD || e->kind >= TRACE_WGRAD;
        if (comp) snprintf(name, sizeof name, "%s%d", names[e->kind], e->mb);
        else snprintf(name, sizeof name, "%s", names[e->kind]);
        fprintf(f, "%s{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, "
                   "\"args\": {\"mb\": %d, \"peer\": %d}}",
                first ? "" : ",\n", name, comp ? "compute" : "comm", e->worker, e->start * 1e6,
                (e->end - e->start) * 1e6, e->mb, e->peer);
        first = 0;
    }
    fputs("\n]}\n", f);
    if (fclose(f) != 0) return err_set(err, PD_EIO, "%s: write failed", path);
    return PD_OK;
}
