/* testutil.c: see testutil.h. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_skips;

void tu_skip_at(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "SKIP (%s:%d): ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    g_skips++;
    _skip(file, line);
}

int tu_exit_status(int failed) { return failed ? 1 : g_skips ? TU_SKIP_CODE : 0; }

const char *tu_src(const char *rel) {
    static char buf[4096];
    const char *root = getenv("PD_SOURCE_DIR");
    snprintf(buf, sizeof buf, "%s/%s", root ? root : ".", rel);
    return buf;
}

const char *tu_pipedream(void) {
    const char *p = getenv("PD_PIPEDREAM");
    return p ? p : "build/pipedream";
}

size_t tu_compare(const char *what, const float *got, const float *want, size_t n, double rtol, double atol) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double tol = atol + rtol * fabs((double)want[i]);
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= tol)) {
            if (bad < 5)
                fprintf(stderr, "%s: mismatch at %zu: got %.9g want %.9g (|diff| %.3g > tol %.3g)\n", what, i,
                        (double)got[i], (double)want[i], d, tol);
            bad++;
        }
    }
    if (bad) fprintf(stderr, "%s: %zu of %zu elements differ\n", what, bad, n);
    return bad;
}

double tu_rel_err(const float *a, const float *b, size_t n) {
    double d = 0, na = 0, nb = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        na += (double)a[i] * a[i];
        nb += (double)b[i] * b[i];
    }
    double den = sqrt(na) + sqrt(nb);
    return den < 1e-30 ? sqrt(d) : sqrt(d) / den;
}

static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void tu_ref_load(RefFile *rf, const char *name) {
    char rel[512];
    snprintf(rel, sizeof rel, "tests/ref/%s", name);
    char *buf;
    size_t len;
    Err err = {0};
    if (pd_read_file(tu_src(rel), (size_t)1 << 30, &buf, &len, &err) != PD_OK) fail_msg("%s", err.msg);
    const unsigned char *p = (const unsigned char *)buf, *end = p + len;
    if (len < 12 || memcmp(p, "PDREF1\0\0", 8) != 0) fail_msg("%s: bad magic", rel);
    p += 8;
    rf->count = (int)rd32(p);
    p += 4;
    rf->t = calloc((size_t)rf->count, sizeof *rf->t);
    for (int i = 0; i < rf->count; i++) {
        RefTensor *t = &rf->t[i];
        if (end - p < 4) fail_msg("%s: truncated", rel);
        uint32_t nl = rd32(p);
        p += 4;
        if (nl >= sizeof t->name || end - p < (ptrdiff_t)nl + 4) fail_msg("%s: bad name", rel);
        memcpy(t->name, p, nl);
        t->name[nl] = 0;
        p += nl;
        t->shape.ndim = (int)rd32(p);
        p += 4;
        if (t->shape.ndim > PD_MAX_DIMS || end - p < 4 * t->shape.ndim) fail_msg("%s: bad ndim", rel);
        for (int k = 0; k < t->shape.ndim; k++, p += 4) t->shape.d[k] = (int)rd32(p);
        size_t n = shape_numel(t->shape);
        if ((size_t)(end - p) < 4 * n) fail_msg("%s: %s truncated", rel, t->name);
        t->data = malloc(4 * n + 4);
        memcpy(t->data, p, 4 * n);
        p += 4 * n;
    }
    pd_free(buf);
}

const RefTensor *tu_ref_get(const RefFile *rf, const char *name) {
    for (int i = 0; i < rf->count; i++)
        if (!strcmp(rf->t[i].name, name)) return &rf->t[i];
    fail_msg("reference tensor \"%s\" not found", name);
    return NULL;
}

void tu_ref_free(RefFile *rf) {
    for (int i = 0; i < rf->count; i++) free(rf->t[i].data);
    free(rf->t);
    rf->t = NULL;
    rf->count = 0;
}
