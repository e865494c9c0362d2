/* curve.h: training curves as SVG (curve.c). */
#ifndef PD_CURVE_H
#define PD_CURVE_H

#include "core.h"

/* Writes an SVG with loss[i] and acc[i] (training accuracy in [0, 1]) for units 0..n-1 (NaN
 * entries skipped) and test_acc (NaN: not drawn). Fails with PD_EIO naming path. */
int curve_svg_write(const char *path, const float *loss, const float *acc, int n, double test_acc,
                    const char *title, Err *err);

#endif
