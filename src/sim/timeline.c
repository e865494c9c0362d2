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
    case OP_BACKWARD: return TRACE_BWD;
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
            if (kind != TRACE_FWD && kind != TRACE_BWD && !(b > a)) continue;
            ev[k++] = (TraceEvent){w, kind, in->mb, in->op == OP_SEND_ACT || in->op == OP_SEND_GRAD ? in->peer : -1, a, b};
        }
    }
    *n = k;
    return ev;
}

/* A step of 1, 2 or 5 x 10^k giving about `want` ticks over span. */
static double nice_step(double span, int want) {
    double raw = span / want, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void fmt_time(double t, double step, char *buf, size_t n) {
    if (step >= 1) snprintf(buf, n, "%gs", t);
    else if (step >= 1e-3) snprintf(buf, n, "%gms", round(t * 1e6) / 1e3);
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

int sim_svg_write(const char *path, const TraceEvent *ev, int n, int n_workers, const SvgOpts *o, Err *err) {
    SvgOpts def = {0};
    if (!o) o = &def;
    FILE *f = fopen(path, "w");
    if (!f) return err_set(err, PD_EIO, "%s: cannot write", path);
    double t0 = INFINITY, t1 = -INFINITY;
    int *per_row = calloc((size_t)n_workers + 1, sizeof(int));
    PD_ASSERT(per_row);
    for (int i = 0; i < n; i++) {
        if (ev[i].start < t0) t0 = ev[i].start;
        if (ev[i].end > t1) t1 = ev[i].end;
        if ((ev[i].kind == TRACE_FWD || ev[i].kind == TRACE_BWD) && ev[i].worker >= 0 && ev[i].worker < n_workers)
            per_row[ev[i].worker]++;
    }
    if (n == 0) t0 = 0, t1 = 1;
    /* the axis starts at the earliest event (0 for simulated runs; measured traces may
     * carry clock readings) and is labelled relative to it */
    if (!(t1 > t0)) t1 = t0 + 1;
    int max_row = 0;
    for (int w = 0; w < n_workers; w++)
        if (per_row[w] > max_row) max_row = per_row[w];
    free(per_row);
    const int left = 70, right = 20, top = o->title ? 40 : 16, row_h = o->show_comm ? 30 : 24, box_h = 18;
    int width = o->width;
    if (width <= 0) {
        width = left + right + max_row * 18;   /* ~18 px per box so two-digit labels fit */
        if (width < 900) width = 900;
        if (width > 3000) width = 3000;
    }
    double plot_w = width - left - right, sx = plot_w / (t1 - t0);
    int height = top + n_workers * row_h + 50;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\">\n", width, height, width, height);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n", width, height);
    if (o->title) {
        fputs("<text x=\"10\" y=\"24\" font-size=\"15\" font-weight=\"bold\">", f);
        xml_text(f, o->title);
        fputs("</text>\n", f);
    }
    /* rows: a light band per worker so idle time shows as empty band */
    for (int w = 0; w < n_workers; w++) {
        int y = top + w * row_h;
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"/>\n", left, y, plot_w, box_h,
                w % 2 ? "#f4f4f4" : "#ebebeb");
        if (o->row_labels) {
            fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"end\">", left - 6, y + 13);
            xml_text(f, o->row_labels[w]);
            fputs("</text>\n", f);
        } else {
            fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"end\">worker %d</text>\n", left - 6, y + 13, w);
        }
    }
    /* time axis */
    int ay = top + n_workers * row_h + 4;
    double step = nice_step(t1 - t0, 10);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"black\"/>\n", left, ay, left + plot_w, ay);
    for (double t = 0; t <= t1 - t0 + step * 1e-9; t += step) {
        double x = left + t * sx;
        char lab[32];
        fmt_time(t, step, lab, sizeof lab);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"black\"/>", x, ay, x, ay + 5);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n", x, ay + 17, lab);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"11\">light: forward, dark: backward, colour and number: "
               "minibatch/micro-batch%s</text>\n", left, ay + 34, o->show_comm ? "; thin bars: sends (blue), all-reduce (red)" : "");
    /* boxes */
    for (int i = 0; i < n; i++) {
        const TraceEvent *e = &ev[i];
        if (e->worker < 0 || e->worker >= n_workers) continue;
        int y = top + e->worker * row_h;
        double x = left + (e->start - t0) * sx, w = (e->end - e->start) * sx;
        if (e->kind == TRACE_FWD || e->kind == TRACE_BWD) {
            char col[48];
            mb_colour(e->mb, e->kind == TRACE_BWD, col, sizeof col);
            fprintf(f, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\" stroke=\"white\" stroke-width=\"0.5\">"
                       "<title>%s %d: %.6g-%.6g s</title></rect>\n",
                    x, y, w > 0.5 ? w : 0.5, box_h, col, e->kind == TRACE_FWD ? "forward" : "backward", e->mb, e->start, e->end);
            int digits = e->mb >= 1000 ? 4 : e->mb >= 100 ? 3 : e->mb >= 10 ? 2 : 1;
            int fs = w >= digits * 7 + 3 ? 11 : w >= digits * 5.5 + 2 ? 9 : 0;
            if (fs && e->mb >= 0)
                fprintf(f, "<text x=\"%.2f\" y=\"%d\" font-size=\"%d\" text-anchor=\"middle\" fill=\"%s\">%d</text>\n",
                        x + w / 2, y + 13, fs, e->kind == TRACE_BWD ? "white" : "black", e->mb);
        } else if (o->show_comm && (e->kind == TRACE_SEND || e->kind == TRACE_ALLREDUCE)) {
            fprintf(f, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"4\" fill=\"%s\" opacity=\"0.7\">"
                       "<title>%s %d%s: %.6g-%.6g s</title></rect>\n",
                    x, y + box_h + 2 + (e->kind == TRACE_ALLREDUCE ? 4 : 0), w > 0.5 ? w : 0.5,
                    e->kind == TRACE_SEND ? "#2060c0" : "#c02020", e->kind == TRACE_SEND ? "send of" : "all-reduce",
                    e->mb, e->kind == TRACE_SEND ? "" : "", e->start, e->end);
        }
    }
    fputs("</svg>\n", f);
    if (fclose(f) != 0) return err_set(err, PD_EIO, "%s: write failed", path);
    return PD_OK;
}

int sim_trace_write(const char *path, const TraceEvent *ev, int n, Err *err) {
    static const char *const names[] = {"F", "B", "send", "recv wait", "all-reduce", "step"};
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
        if (e->kind <= TRACE_BWD) snprintf(name, sizeof name, "%s%d", names[e->kind], e->mb);
        else snprintf(name, sizeof name, "%s", names[e->kind]);
        fprintf(f, "%s{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, "
                   "\"args\": {\"mb\": %d, \"peer\": %d}}",
                first ? "" : ",\n", name, e->kind <= TRACE_BWD ? "compute" : "comm", e->worker, e->start * 1e6,
                (e->end - e->start) * 1e6, e->mb, e->peer);
        first = 0;
    }
    fputs("\n]}\n", f);
    if (fclose(f) != 0) return err_set(err, PD_EIO, "%s: write failed", path);
    return PD_OK;
}
