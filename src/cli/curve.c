/* curve.c: a training curve as SVG: loss and training accuracy per unit (moving averages,
 * raw loss faint behind), the final test accuracy as a dashed line. Pictures of a run for
 * people; the numbers themselves are in the metrics file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "curve.h"

static double clampd(double v, double lo, double hi) { return v < lo ? lo : v > hi ? hi : v; }

int curve_svg_write(const char *path, const float *loss, const float *acc, int n, double test_acc,
                    const char *title, Err *err) {
    FILE *f = fopen(path, "w");
    if (!f) return err_set(err, PD_EIO, "%s: cannot open for writing", path);
    const int W = 900, H = 420, L = 70, R = 70, T = 40, B = 50;
    const int pw = W - L - R, ph = H - T - B;
    double lmax = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(loss[i]) && loss[i] > lmax) lmax = loss[i];
    if (lmax <= 0) lmax = 1;
    lmax = ceil(lmax * 2) / 2;
    int win = n / 50 > 1 ? n / 50 : 1;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%d\" y=\"22\" font-size=\"15\">%s</text>\n", L, title ? title : "training curve");
    /* axes and grid */
    for (int k = 0; k <= 5; k++) {
        double y = T + ph - ph * k / 5.0;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, y, L + pw, y);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" fill=\"#1f77b4\">%.2f</text>\n", L - 6, y + 4,
                lmax * k / 5.0);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" fill=\"#d62728\">%d%%</text>\n", L + pw + 6, y + 4, 20 * k);
    }
    for (int k = 0; k <= 5; k++) {
        double x = L + pw * k / 5.0;
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", x, T + ph + 18,
                (int)lround((n > 1 ? n - 1 : 1) * k / 5.0));
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">minibatch (unit)</text>\n", L + pw / 2, H - 10);
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
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" fill=\"#2ca02c\" text-anchor=\"end\">test accuracy %.2f%%</text>\n",
                L + pw - 4, y - 6, 100 * test_acc);
    }
    /* legend above the plot, right-aligned, clear of the curves */
    fprintf(f, "<text x=\"%d\" y=\"22\" fill=\"#1f77b4\" text-anchor=\"end\">loss (moving average of %d)"
               "<tspan fill=\"#d62728\">   training accuracy</tspan></text>\n", L + pw, win);
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0) return err_set(err, PD_EIO, "%s: write failed", path);
    return PD_OK;
}
