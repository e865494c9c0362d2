/* ckpt_impl.h: what ckpt.c (dtypes, writer) and ckpt_read.c (reader, directories) share. */
#ifndef PD_CKPT_IMPL_H
#define PD_CKPT_IMPL_H

#include <stddef.h>

#include "ckpt.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ckpt writes tensors as they lie in memory; the safetensors layout is little-endian"
#endif

/* True if s[0..n) is well-formed UTF-8 (no overlong forms, surrogates or code points above
 * U+10FFFF), as JSON requires. */
int ckpt_utf8_valid(const char *s, size_t n);

#endif
