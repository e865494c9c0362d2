/* curve.c: a training curve as SVG: loss and training accuracy per unit (moving averages,
 * raw loss faint behind), the final test accuracy as a dashed line; the legend has its own
 * row under the title. Pictures of a run for
 * people; the numbers themselves are in the metrics file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "curve.h"

static double clampd(double v, double lo, double hi) { return v < lo ? lo : v > hi ? hi : v; }

int curve_svg_write(const char *path, const float *loss, const float *acc, int n, double test_acc,
                    const char *title, Err *err) {
    FILE *f = fopen(path, "w");
    if (!f) return err_set(err, PD_EIO, "%s: cannot open for writing", path);
    const int W = 900, H = 440, L = 70, R = 70, T = 62, B = 50;
    const int pw = W - L - R, ph = H - T - B;
    double lmax = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(loss[i]) && loss[i] > lmax) lmax = loss[i];
    if (lmax <= 0) lmax = 1;
    lmax = ceil(lmax * 2) / 2;
    int win = n / 50 > 1 ? n / 50 : 1;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%d\" y=\"22\" font-size=\"15\" font-weight=\"bold\">", L);
    for (const char *c = title ? title : "training curve"; *c; c++) {
        if (*c == '<') fputs("&lt;", f);
        else if (*c == '>') fputs("&gt;", f);
        else if (*c == '&') fputs("&amp;", f);
        else fputc(*c, f);
    }
    fputs("</text>\n", f);
    /* the legend: its own row between the title and the plot, a swatch before each entry */
    struct { const char *col, *dash, *text; double op; } leg[4] = {
        {"#1f77b4", "", "training loss", 1},
        {"#1f77b4", "", "per unit", 0.25},
        {"#d62728", "", "training accuracy", 1},
        {"#2ca02c", "6 4", "test accuracy", 1},
    };
    char test_text[64];
    snprintf(test_text, sizeof test_text, "test accuracy after training: %.2f%%", 100 * test_acc);
    leg[3].text = test_text;
    double lx = L;
    for (int k = 0; k < 4; k++) {
        if (k == 3 && !isfinite(test_acc)) break;
        fprintf(f, "<line x1=\"%.0f\" y1=\"41\" x2=\"%.0f\" y2=\"41\" stroke=\"%s\" stroke-width=\"2\" "
                   "stroke-opacity=\"%.2f\"%s%s%s/>\n", lx, lx + 22, leg[k].col, leg[k].op, leg[k].dash[0] ? " stroke-dasharray=\"" : "",
                leg[k].dash, leg[k].dash[0] ? "\"" : "");
        fprintf(f, "<text x=\"%.0f\" y=\"45\">%s</text>\n", lx + 28, leg[k].text);
        lx += 28 + 6.5 * strlen(leg[k].text) + 24;
    }
    /* axes and grid */
    for (int k = 0; k <= 5; k++) {
        double y = T + ph - ph * k / 5.0;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, y, L + pw, y);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" fill=\"#1f77b4\">%.2f</text>\n", L - 6, y + 4,
                lmax * k / 5.0);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" fill=\"#d62728\">%d%%</text>\n", L + pw + 6, y + 4, 20 * k);
    }
    /* x ticks every 1, 2 or 5 x 10^k units, about 6 of them */
    int span = n > 1 ? n - 1 : 1;
    double raw = span / 6.0, p10 = pow(10, floor(log10(raw))), mm = raw / p10;
    int step = (int)((mm < 1.5 ? 1 : mm < 3.5 ? 2 : mm < 7.5 ? 5 : 10) * p10);
    if (step < 1) step = 1;
    for (int u = 0; u <= span; u += step)
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", L + (double)pw * u / span,
                T + ph + 18, u);
    if (win > 1)
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">unit (minibatch, or micro-batch when minibatches "
                   "are split); the lines are moving averages over %d units</text>\n", L + pw / 2, H - 10, win);
    else
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">unit (minibatch, or micro-batch when minibatches "
                   "are split)</text>\n", L + pw / 2, H - 10);
    fprintf(f, "<text x=\"16\" y=\"%d\" fill=\"#1f77b4\" transform=\"rotate(-90 16 %d)\" text-anchor=\"middle\">"
               "training loss</text>\n", T + ph / 2, T + ph / 2);
    fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#d62728\" transform=\"rotate(90 %d %d)\" text-anchor=\"middle\">"
               "accuracy</text>\n", W - 14, T + ph / 2, W - 14, T + ph / 2);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n", L, T, pw, ph);
    double xs = n > 1 ? (double)pw / (n - 1) : 0;
    /* raw loss, faint */
    fprintf(f, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-opacity=\"0.25\" points=\"");
    for (int i = 0; i < n; i++)
        if (isfinite(loss[i])) fprintf(f, "%.1f,%.1f ", L + xs * i, T + ph - ph * clampd(loss[i] / lmax, 0, 1));
    fprintf(f, "\"/>\n");
    /* moving averages */
    const float *ser[2] = {loss, acc};
    const char *col[2] = {"#1f77b4", "#d62728"};
    for (int s = 0; s < 2; s++) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col[s]);
        double sum = 0;
        int cnt = 0;
        for (int i = 0; i < n; i++) {
            if (isfinite(ser[s][i])) sum += ser[s][i], cnt++;
            if (i >= win && isfinite(ser[s][i - win])) sum -= ser[s][i - win], cnt--;
            if (cnt == 0) continue;
            double v = sum / cnt / (s == 0 ? lmax : 1.0);
            fprintf(f, "%.1f,%.1f ", L + xs * i, T + ph - ph * clampd(v, 0, 1));
        }
        fprintf(f, "\"/>\n");
    }
    if (isfinite(test_acc)) {
        double y = T + ph - ph * clampd(test_acc, 0, 1);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#2ca02c\" stroke-dasharray=\"6 4\" "
                   "stroke-width=\"2\"/>\n", L, y, L + pw, y);
    }
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0) return err_set(err, PD_EIO, "%s: write failed", path);
    return PD_OK;
}
