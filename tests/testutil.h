/* testutil.h: helpers shared by the cmocka tests: skips that ctest sees, paths into the
 * source tree, array comparison that reports the first mismatches, reference tensors made
 * by PyTorch. */
#ifndef PD_TESTUTIL_H
#define PD_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core.h"

/* Skips: cmocka's skip() leaves the exit status at 0, which ctest counts as a pass. tu_skip
 * says why on stderr, counts the skip and skips the current test; a test program that may
 * skip ends main with `return tu_run_group(tests, setup, teardown);`, which runs the group
 * like cmocka_run_group_tests and returns 1 if a test failed, else TU_SKIP_CODE if one was
 * skipped (ctest's SKIP_RETURN_CODE, set for every test in CMakeLists.txt), else 0. */
#define TU_SKIP_CODE 77
#define tu_skip(...) tu_skip_at(__FILE__, __LINE__, __VA_ARGS__)
void tu_skip_at(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define tu_run_group(tests, setup, teardown) tu_exit_status(cmocka_run_group_tests(tests, setup, teardown))
int tu_exit_status(int failed);

/* Path of rel inside the source tree ($PD_SOURCE_DIR, set by ctest). Static buffer. */
const char *tu_src(const char *rel);
/* Path of the pipedream executable ($PD_PIPEDREAM). */
const char *tu_pipedream(void);

/* Compares got with want elementwise: |got - want| <= atol + rtol * |want|. Prints up to
 * 5 mismatches (index, got, want, tolerance) prefixed with what, and returns the number
 * of mismatches (0 = equal). */
size_t tu_compare(const char *what, const float *got, const float *want, size_t n, double rtol, double atol);
/* Normalised error ||a - b|| / max(||a|| + ||b||, tiny), for finite-difference checks. */
double tu_rel_err(const float *a, const float *b, size_t n);

/* Reference files (tests/ref/NAME.bin, written by tools/gen_ref.py):
 *   magic "PDREF1\0\0" (8 bytes), uint32 count, then count records of
 *   uint32 name_len, name bytes (no NUL), uint32 ndim, ndim x uint32 dims, float32 data.
 * All little-endian. */
typedef struct RefTensor {
    char name[128];
    Shape shape;
    float *data;
} RefTensor;
typedef struct RefFile {
    int count;
    RefTensor *t;
} RefFile;
/* Loads tests/ref/<name>; fails the test (cmocka) on any error. */
void tu_ref_load(RefFile *rf, const char *name);
/* Returns the tensor called name; fails the test if absent. */
const RefTensor *tu_ref_get(const RefFile *rf, const char *name);
void tu_ref_free(RefFile *rf);

#endif
