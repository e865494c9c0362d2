/* ckpt.c: safetensors dtypes and the checkpoint writer: collects (name, dtype, shape,
 * borrowed pointer) and metadata, then streams header and tensors into a temporary file
 * and renames it into place (pd_atomic_* of core.h: file and directory fsynced). It never
 * copies tensor data. Reading is in ckpt_read.c. */
#include "ckpt_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* ---- dtypes ---------------------------------------------------------------------- */
static const struct {
    const char *name;
    size_t size;
} DTYPES[] = {
    [CKPT_BOOL] = {"BOOL", 1}, [CKPT_U8] = {"U8", 1},     [CKPT_I8] = {"I8", 1},
    [CKPT_F8_E5M2] = {"F8_E5M2", 1}, [CKPT_F8_E4M3] = {"F8_E4M3", 1},
    [CKPT_I16] = {"I16", 2},   [CKPT_U16] = {"U16", 2},   [CKPT_F16] = {"F16", 2},
    [CKPT_BF16] = {"BF16", 2}, [CKPT_I32] = {"I32", 4},   [CKPT_U32] = {"U32", 4},
    [CKPT_F32] = {"F32", 4},   [CKPT_F64] = {"F64", 8},   [CKPT_I64] = {"I64", 8},
    [CKPT_U64] = {"U64", 8},
};
_Static_assert(sizeof DTYPES / sizeof DTYPES[0] == CKPT_DTYPE_COUNT, "one DTYPES row per CkptDtype");

const char *ckpt_dtype_name(CkptDtype dt) {
    PD_ASSERTF((unsigned)dt < CKPT_DTYPE_COUNT, "dtype %d", (int)dt);
    return DTYPES[dt].name;
}

size_t ckpt_dtype_size(CkptDtype dt) {
    PD_ASSERTF((unsigned)dt < CKPT_DTYPE_COUNT, "dtype %d", (int)dt);
    return DTYPES[dt].size;
}

int ckpt_dtype_parse(const char *name) {
    for (int i = 0; i < CKPT_DTYPE_COUNT; i++)
        if (strcmp(name, DTYPES[i].name) == 0) return i;
    return -1;
}

int ckpt_utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        unsigned cp, min;
        if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
        else return 0;
        if (n - i < (size_t)len) return 0;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += (size_t)len;
    }
    return 1;
}

/* ---- writer ---------------------------------------------------------------------- */
typedef struct WEntry {
    char *name;
    CkptDtype dtype;
    int ndim;
    int64_t shape[CKPT_MAX_DIMS];
    size_t nbytes;
    const void *data;   /* borrowed */
} WEntry;

typedef struct WMeta {
    char *key, *value;
} WMeta;

struct CkptWriter {
    WEntry *t;
    int nt, capt;
    WMeta *m;
    int nm, capm;
};

CkptWriter *ckpt_writer_new(void) {
    CkptWriter *w = calloc(1, sizeof *w);
    PD_ASSERT(w);
    return w;
}

void ckpt_writer_free(CkptWriter *w) {
    if (!w) return;
    for (int i = 0; i < w->nt; i++) free(w->t[i].name);
    for (int i = 0; i < w->nm; i++) {
        free(w->m[i].key);
        free(w->m[i].value);
    }
    free(w->t);
    free(w->m);
    free(w);
}

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    PD_ASSERT(d);
    memcpy(d, s, n);
    return d;
}

/* Checks a name/key/value the writer will put into the JSON header. */
static int check_string(const char *what, const char *s, int allow_empty, Err *err) {
    size_t n = strlen(s);
    if (n == 0 && !allow_empty) return err_set(err, PD_EINVAL, "checkpoint: empty %s", what);
    if (n > CKPT_MAX_NAME)
        return err_set(err, PD_EINVAL, "checkpoint: %s \"%.40s...\" is longer than %d bytes", what, s,
                       CKPT_MAX_NAME);
    if (!ckpt_utf8_valid(s, n)) return err_set(err, PD_EINVAL, "checkpoint: %s \"%s\" is not valid UTF-8", what, s);
    return PD_OK;
}

int ckpt_writer_add(CkptWriter *w, const char *name, CkptDtype dt, int ndim, const int64_t *shape,
                    const void *data, Err *err) {
    PD_ASSERT(w && name);
    if (check_string("tensor name", name, 0, err)) return err->code;
    if (strcmp(name, "__metadata__") == 0)
        return err_set(err, PD_EINVAL, "checkpoint: \"__metadata__\" cannot be a tensor name");
    if ((unsigned)dt >= CKPT_DTYPE_COUNT) return err_set(err, PD_EINVAL, "checkpoint: tensor \"%s\": bad dtype %d", name, (int)dt);
    if (ndim < 0 || ndim > CKPT_MAX_DIMS)
        return err_set(err, PD_EINVAL, "checkpoint: tensor \"%s\": %d dimensions, at most %d", name, ndim, CKPT_MAX_DIMS);
    for (int i = 0; i < w->nt; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return err_set(err, PD_EINVAL, "checkpoint: tensor \"%s\" added twice", name);
    size_t bytes = ckpt_dtype_size(dt);
    int zero = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return err_set(err, PD_EINVAL, "checkpoint: tensor \"%s\": dimension %d is negative (%lld)", name, i,
                           (long long)shape[i]);
        if (shape[i] == 0) zero = 1;
    }
    if (zero) bytes = 0;
    else
        for (int i = 0; i < ndim; i++) {
            if ((uint64_t)shape[i] > (SIZE_MAX / 2) / bytes)
                return err_set(err, PD_EINVAL, "checkpoint: tensor \"%s\": size overflows", name);
            bytes *= (size_t)shape[i];
        }
    if (bytes > 0 && !data) return err_set(err, PD_EINVAL, "checkpoint: tensor \"%s\": no data", name);
    if (w->nt == w->capt) {
        w->capt = w->capt ? 2 * w->capt : 16;
        w->t = realloc(w->t, (size_t)w->capt * sizeof *w->t);
        PD_ASSERT(w->t);
    }
    WEntry *e = &w->t[w->nt++];
    memset(e, 0, sizeof *e);
    e->name = xstrdup(name);
    e->dtype = dt;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = bytes;
    e->data = data;
    return PD_OK;
}

int ckpt_writer_add_f32(CkptWriter *w, const char *name, Shape s, const float *data, Err *err) {
    int64_t d[PD_MAX_DIMS];
    PD_ASSERT(s.ndim >= 0 && s.ndim <= PD_MAX_DIMS);
    for (int i = 0; i < s.ndim; i++) d[i] = s.d[i];
    return ckpt_writer_add(w, name, CKPT_F32, s.ndim, d, data, err);
}

int ckpt_writer_meta(CkptWriter *w, const char *key, const char *value, Err *err) {
    PD_ASSERT(w && key && value);
    if (check_string("metadata key", key, 0, err) || check_string("metadata value", value, 1, err))
        return err->code;
    if (strcmp(key, "pipedream.crc32") == 0 || strcmp(key, "pipedream.format") == 0)
        return err_set(err, PD_EINVAL, "checkpoint: metadata key \"%s\" is set by the writer", key);
    for (int i = 0; i < w->nm; i++)
        if (strcmp(w->m[i].key, key) == 0)
            return err_set(err, PD_EINVAL, "checkpoint: metadata key \"%s\" set twice", key);
    if (w->nm == w->capm) {
        w->capm = w->capm ? 2 * w->capm : 8;
        w->m = realloc(w->m, (size_t)w->capm * sizeof *w->m);
        PD_ASSERT(w->m);
    }
    w->m[w->nm].key = xstrdup(key);
    w->m[w->nm].value = xstrdup(value);
    w->nm++;
    return PD_OK;
}

/* A growing string for the header. */
typedef struct Buf {
    char *s;
    size_t n, cap;
} Buf;

static void buf_put(Buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        while (b->n + n + 1 > b->cap) b->cap = b->cap ? 2 * b->cap : 4096;
        b->s = realloc(b->s, b->cap);
        PD_ASSERT(b->s);
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void buf_str(Buf *b, const char *s) { buf_put(b, s, strlen(s)); }

/* Appends s as a JSON string literal (quotes, backslashes and control characters escaped;
 * s is valid UTF-8, checked when it was added). */
static void buf_json(Buf *b, const char *s) {
    buf_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\', esc[1] = (char)*p;
            buf_put(b, esc, 2);
        } else if (*p < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *p);
            buf_put(b, esc, 6);
        } else {
            buf_put(b, (const char *)p, 1);
        }
    }
    buf_put(b, "\"", 1);
}

/* Order in the file: element size descending, then order added, so every tensor starts at
 * a multiple of its element size (the data section starts at a multiple of 8). */
static void layout_order(const CkptWriter *w, int *order) {
    int k = 0;
    for (size_t sz = 8; sz >= 1; sz /= 2)
        for (int i = 0; i < w->nt; i++)
            if (ckpt_dtype_size(w->t[i].dtype) == sz) order[k++] = i;
    PD_ASSERT(k == w->nt);
}

int ckpt_write(CkptWriter *w, const char *path, Err *err) {
    PD_ASSERT(w && path);
    int *order = malloc(((size_t)w->nt + 1) * sizeof *order);
    PD_ASSERT(order);
    layout_order(w, order);

    /* CRC of the data section, tensor by tensor (crc32_combine joins the pieces). */
    uLong crc = crc32(0L, Z_NULL, 0);
    for (int k = 0; k < w->nt; k++) {
        const WEntry *e = &w->t[order[k]];
        if (e->nbytes) crc = crc32_combine(crc, pd_crc32(e->data, e->nbytes), (z_off_t)e->nbytes);
    }
    char crcstr[16];
    snprintf(crcstr, sizeof crcstr, "%08x", (unsigned)crc);

    Buf h = {0};
    char num[64];
    buf_str(&h, "{\"__metadata__\":{");
    for (int i = 0; i < w->nm; i++) {
        buf_json(&h, w->m[i].key);
        buf_str(&h, ":");
        buf_json(&h, w->m[i].value);
        buf_str(&h, ",");
    }
    buf_str(&h, "\"pipedream.crc32\":\"");
    buf_str(&h, crcstr);
    buf_str(&h, "\",\"pipedream.format\":\"" CKPT_FORMAT "\"}");
    uint64_t off = 0;
    for (int k = 0; k < w->nt; k++) {
        const WEntry *e = &w->t[order[k]];
        buf_str(&h, ",");
        buf_json(&h, e->name);
        buf_str(&h, ":{\"dtype\":\"");
        buf_str(&h, ckpt_dtype_name(e->dtype));
        buf_str(&h, "\",\"shape\":[");
        for (int i = 0; i < e->ndim; i++) {
            snprintf(num, sizeof num, "%s%lld", i ? "," : "", (long long)e->shape[i]);
            buf_str(&h, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + e->nbytes));
        buf_str(&h, num);
        off += e->nbytes;
    }
    buf_str(&h, "}");
    while (h.n % 8) buf_str(&h, " ");   /* pad with spaces, like the reference implementation */
    PD_ASSERT(h.n <= CKPT_MAX_HEADER);

    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h.n >> (8 * i));
    PdAtomicFile f;
    int rc = pd_atomic_open(&f, path, err);
    if (!rc) rc = pd_atomic_write(&f, len8, 8, err);
    if (!rc) rc = pd_atomic_write(&f, h.s, h.n, err);
    for (int k = 0; k < w->nt && !rc; k++) {
        const WEntry *e = &w->t[order[k]];
        if (e->nbytes) rc = pd_atomic_write(&f, e->data, e->nbytes, err);
    }
    if (!rc) rc = pd_atomic_commit(&f, err);
    free(h.s);
    free(order);
    return rc;
}
