/* ckpt_read.c: reading and validating safetensors checkpoints, and finding the newest
 * complete one in a directory. The header is parsed by a small strict JSON parser written
 * for this one schema rather than by cJSON: it reads integers exactly as 64-bit values,
 * rejects duplicate keys, and its memory is bounded by the header itself (strings are
 * unescaped in place; one record per tensor), so no file can make the reader allocate more
 * than its own size plus a small overhead. Nothing here trusts a size before checking it
 * against the file's actual size. */
#define _DEFAULT_SOURCE   /* madvise(MADV_HUGEPAGE), on top of -D_POSIX_C_SOURCE */
#include "ckpt_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

typedef struct NameIdx {
    const char *name;
    int i;
} NameIdx;

typedef struct MetaKV {
    const char *key, *value;   /* into the header buffer */
} MetaKV;

struct Ckpt {
    char *path;
    char *header;              /* N + 1 bytes; names and metadata strings point into it */
    unsigned char *data;       /* the data section (64-byte aligned), or NULL if not kept */
    uint64_t datalen;
    CkptTensor *t;             /* sorted by data offset */
    int nt, capt;
    NameIdx *by_name;          /* tensors sorted by name */
    MetaKV *m;
    int nm, capm;
};

/* ---- the header parser ----------------------------------------------------------- */
typedef struct P {
    char *s;          /* header bytes (mutable: strings are unescaped in place) */
    size_t n, i;
    const char *path;
    Err *err;
    Ckpt *ck;
    const char *ctx;   /* ctxbuf while inside a tensor entry, else NULL */
    char ctxbuf[160];
} P;

/* Fails naming the file, the byte offset in the header and (inside an entry) the tensor;
 * fmt has one %s, filled with a. */
static int perr(P *p, const char *fmt, const char *a) {
    char msg[300];
    snprintf(msg, sizeof msg, fmt, a);
    return err_set(p->err, PD_EINVAL, "%s: header byte %zu: %s%s%s", p->path, p->i, p->ctx ? p->ctx : "",
                   p->ctx ? ": " : "", msg);
}

static void ws(P *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

/* Skips whitespace, then consumes c or fails saying what was expected. */
static int expect(P *p, char c, const char *what) {
    ws(p);
    if (p->i >= p->n || p->s[p->i] != c) return perr(p, "expected %s", what);
    p->i++;
    return PD_OK;
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* Parses a JSON string at p->i (after whitespace), unescaping it in place (the result
 * starts at the opening quote and is NUL-terminated; it is never longer than the literal).
 * NUL characters are rejected (names are C strings), as is malformed UTF-8. */
static int pstring(P *p, const char **out, const char *what) {
    ws(p);
    if (p->i >= p->n || p->s[p->i] != '"') return perr(p, "expected %s (a string)", what);
    char *dst = p->s + p->i, *start = dst;
    p->i++;
    for (;;) {
        if (p->i >= p->n) return perr(p, "unterminated string%s", "");
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') break;
        if (c < 0x20) return perr(p, "control character in string%s", "");
        if (c != '\\') {
            *dst++ = (char)c;
            p->i++;
            continue;
        }
        if (p->n - p->i < 2) return perr(p, "unterminated string%s", "");
        char e = p->s[p->i + 1];
        p->i += 2;
        switch (e) {
        case '"': *dst++ = '"'; continue;
        case '\\': *dst++ = '\\'; continue;
        case '/': *dst++ = '/'; continue;
        case 'b': *dst++ = '\b'; continue;
        case 'f': *dst++ = '\f'; continue;
        case 'n': *dst++ = '\n'; continue;
        case 'r': *dst++ = '\r'; continue;
        case 't': *dst++ = '\t'; continue;
        case 'u': break;
        default: p->i -= 2; return perr(p, "bad escape in string%s", "");
        }
        unsigned cp;
        if (p->n - p->i < 4 || hex4(p->s + p->i, &cp)) return perr(p, "bad \\u escape%s", "");
        p->i += 4;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return perr(p, "lone low surrogate in \\u escape%s", "");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            unsigned lo;
            if (p->n - p->i < 6 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u' || hex4(p->s + p->i + 2, &lo) ||
                lo < 0xDC00 || lo > 0xDFFF)
                return perr(p, "lone high surrogate in \\u escape%s", "");
            p->i += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp == 0) return perr(p, "NUL character in string%s", "");
        /* UTF-8: at most 4 bytes for 6 (or 12) consumed, so dst stays behind p->i */
        if (cp < 0x80) *dst++ = (char)cp;
        else if (cp < 0x800) {
            *dst++ = (char)(0xC0 | cp >> 6);
            *dst++ = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            *dst++ = (char)(0xE0 | cp >> 12);
            *dst++ = (char)(0x80 | (cp >> 6 & 0x3F));
            *dst++ = (char)(0x80 | (cp & 0x3F));
        } else {
            *dst++ = (char)(0xF0 | cp >> 18);
            *dst++ = (char)(0x80 | (cp >> 12 & 0x3F));
            *dst++ = (char)(0x80 | (cp >> 6 & 0x3F));
            *dst++ = (char)(0x80 | (cp & 0x3F));
        }
    }
    p->i++;   /* closing quote; dst < p->i, so the NUL overwrites nothing unread */
    *dst = 0;
    if (!ckpt_utf8_valid(start, (size_t)(dst - start))) return perr(p, "string is not valid UTF-8%s", "");
    *out = start;
    return PD_OK;
}

/* Parses a non-negative JSON integer exactly (what names the value in messages). */
static int puint(P *p, uint64_t *out, const char *what) {
    ws(p);
    if (p->i < p->n && p->s[p->i] == '-') return perr(p, "%s is negative", what);
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return perr(p, "expected %s (an integer)", what);
    uint64_t v = 0;
    size_t start = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        unsigned d = (unsigned)(p->s[p->i] - '0');
        if (v > (UINT64_MAX - d) / 10) return perr(p, "%s is too large", what);
        v = v * 10 + d;
        p->i++;
    }
    if (p->s[start] == '0' && p->i - start > 1) {
        p->i = start;
        return perr(p, "%s has a leading zero", what);
    }
    if (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E'))
        return perr(p, "%s is not an integer", what);
    *out = v;
    return PD_OK;
}

/* "__metadata__": {"key": "value", ...}; values must be strings (safetensors rule). */
static int pmeta(P *p) {
    if (expect(p, '{', "'{' opening __metadata__")) return PD_EINVAL;
    ws(p);
    if (p->i < p->n && p->s[p->i] == '}') {
        p->i++;
        return PD_OK;
    }
    Ckpt *ck = p->ck;
    for (;;) {
        const char *k, *v;
        if (pstring(p, &k, "a metadata key") || expect(p, ':', "':' after a metadata key")) return PD_EINVAL;
        ws(p);
        if (p->i >= p->n || p->s[p->i] != '"') return perr(p, "metadata value of \"%s\" is not a string", k);
        if (pstring(p, &v, "a metadata value")) return PD_EINVAL;
        if (ck->nm == ck->capm) {
            ck->capm = ck->capm ? 2 * ck->capm : 8;
            ck->m = realloc(ck->m, (size_t)ck->capm * sizeof *ck->m);
            PD_ASSERT(ck->m);
        }
        ck->m[ck->nm].key = k;
        ck->m[ck->nm].value = v;
        ck->nm++;
        ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        return expect(p, '}', "',' or '}' in __metadata__");
    }
}

/* "name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, each key exactly once. */
static int ptensor(P *p, const char *name) {
    Ckpt *ck = p->ck;
    if (ck->nt == ck->capt) {
        ck->capt = ck->capt ? 2 * ck->capt : 16;
        ck->t = realloc(ck->t, (size_t)ck->capt * sizeof *ck->t);
        PD_ASSERT(ck->t);
    }
    CkptTensor *t = &ck->t[ck->nt++];
    memset(t, 0, sizeof *t);
    t->name = name;
    int have_dtype = 0, have_shape = 0, have_off = 0;
    snprintf(p->ctxbuf, sizeof p->ctxbuf, "tensor \"%.100s\"", name);
    p->ctx = p->ctxbuf;
    if (expect(p, '{', "'{' opening a tensor entry")) return PD_EINVAL;
    for (;;) {
        const char *key;
        if (pstring(p, &key, "a key of a tensor entry") || expect(p, ':', "':'")) return PD_EINVAL;
        if (strcmp(key, "dtype") == 0) {
            if (have_dtype++) return perr(p, "duplicate key \"%s\"", key);
            const char *d;
            ws(p);
            if (p->i >= p->n || p->s[p->i] != '"') return perr(p, "%s is not a string", key);
            if (pstring(p, &d, "dtype")) return PD_EINVAL;
            int dt = ckpt_dtype_parse(d);
            if (dt < 0) return perr(p, "unknown dtype \"%.40s\"", d);
            t->dtype = (CkptDtype)dt;
        } else if (strcmp(key, "shape") == 0) {
            if (have_shape++) return perr(p, "duplicate key \"%s\"", key);
            if (expect(p, '[', "'[' opening shape")) return PD_EINVAL;
            ws(p);
            if (p->i < p->n && p->s[p->i] == ']') p->i++;
            else
                for (;;) {
                    uint64_t d;
                    if (puint(p, &d, "a dimension")) return PD_EINVAL;
                    if (t->ndim == CKPT_MAX_DIMS) return perr(p, "more than %s dimensions", "8");
                    if (d > (uint64_t)INT64_MAX) return perr(p, "dimension too large%s", "");
                    t->shape[t->ndim++] = (int64_t)d;
                    ws(p);
                    if (p->i < p->n && p->s[p->i] == ',') {
                        p->i++;
                        continue;
                    }
                    if (expect(p, ']', "',' or ']' in shape")) return PD_EINVAL;
                    break;
                }
        } else if (strcmp(key, "data_offsets") == 0) {
            if (have_off++) return perr(p, "duplicate key \"%s\"", key);
            if (expect(p, '[', "'[' opening data_offsets") || puint(p, &t->begin, "data_offsets[0]") ||
                expect(p, ',', "',' in data_offsets (two integers)") || puint(p, &t->end, "data_offsets[1]") ||
                expect(p, ']', "']' closing data_offsets (two integers)"))
                return PD_EINVAL;
        } else {
            return perr(p, "unknown key \"%.40s\" (expected dtype, shape, data_offsets)", key);
        }
        ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (expect(p, '}', "',' or '}' in a tensor entry")) return PD_EINVAL;
        break;
    }
    if (!have_dtype) return perr(p, "missing key \"%s\"", "dtype");
    if (!have_shape) return perr(p, "missing key \"%s\"", "shape");
    if (!have_off) return perr(p, "missing key \"%s\"", "data_offsets");
    p->ctx = NULL;
    return PD_OK;
}

static int pheader(P *p) {
    int have_meta = 0;
    if (expect(p, '{', "'{': the header must be a JSON object")) return PD_EINVAL;
    ws(p);
    if (p->i < p->n && p->s[p->i] == '}') p->i++;
    else
        for (;;) {
            const char *name;
            if (pstring(p, &name, "a tensor name") || expect(p, ':', "':' after a tensor name")) return PD_EINVAL;
            if (strcmp(name, "__metadata__") == 0) {
                if (have_meta++) return perr(p, "duplicate \"__metadata__\"%s", "");
                if (pmeta(p)) return PD_EINVAL;
            } else if (ptensor(p, name)) {
                return PD_EINVAL;
            }
            ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (expect(p, '}', "',' or '}' in the header object")) return PD_EINVAL;
            break;
        }
    ws(p);
    if (p->i != p->n) return perr(p, "unexpected characters after the header object%s", "");
    return PD_OK;
}

/* ---- validation ------------------------------------------------------------------ */
static int cmp_offsets(const void *a, const void *b) {
    const CkptTensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}
static int cmp_names(const void *a, const void *b) {
    return strcmp(((const NameIdx *)a)->name, ((const NameIdx *)b)->name);
}
static int cmp_meta(const void *a, const void *b) {
    return strcmp(((const MetaKV *)a)->key, ((const MetaKV *)b)->key);
}

static void shape_text(const CkptTensor *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Checks every tensor against the data section length and each other; fills numel/nbytes
 * and sorts by offset, then builds the name index. */
static int validate(Ckpt *ck, uint64_t datalen, uint64_t header_len, uint64_t file_size, Err *err) {
    const char *path = ck->path;
    for (int i = 0; i < ck->nt; i++) {
        CkptTensor *t = &ck->t[i];
        uint64_t es = ckpt_dtype_size(t->dtype);
        char sh[200];
        shape_text(t, sh, sizeof sh);
        if (t->begin > t->end)
            return err_set(err, PD_EINVAL, "%s: tensor \"%s\": data_offsets [%llu, %llu] end before they begin", path,
                           t->name, (unsigned long long)t->begin, (unsigned long long)t->end);
        uint64_t span = t->end - t->begin, numel = 1;
        int zero = 0;
        for (int d = 0; d < t->ndim; d++) zero |= t->shape[d] == 0;
        if (zero) numel = 0;
        else
            for (int d = 0; d < t->ndim; d++) {
                if ((uint64_t)t->shape[d] > span / es / numel)   /* numel * es * dim > span */
                    return err_set(err, PD_EINVAL,
                                   "%s: tensor \"%s\": shape %s of %s needs more than the %llu bytes of data_offsets "
                                   "[%llu, %llu]",
                                   path, t->name, sh, ckpt_dtype_name(t->dtype), (unsigned long long)span,
                                   (unsigned long long)t->begin, (unsigned long long)t->end);
                numel *= (uint64_t)t->shape[d];
            }
        if (numel * es != span)
            return err_set(err, PD_EINVAL,
                           "%s: tensor \"%s\": shape %s of %s is %llu bytes but data_offsets [%llu, %llu] span %llu",
                           path, t->name, sh, ckpt_dtype_name(t->dtype), (unsigned long long)(numel * es),
                           (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)span);
        if (t->begin % es)
            return err_set(err, PD_EINVAL, "%s: tensor \"%s\": data offset %llu is not a multiple of the %s element size",
                           path, t->name, (unsigned long long)t->begin, ckpt_dtype_name(t->dtype));
        t->numel = (size_t)numel;
        t->nbytes = (size_t)span;
    }
    if (ck->nt > 1) qsort(ck->t, (size_t)ck->nt, sizeof *ck->t, cmp_offsets);
    uint64_t pos = 0;
    for (int i = 0; i < ck->nt; i++) {
        const CkptTensor *t = &ck->t[i];
        if (t->begin > pos)
            return err_set(err, PD_EINVAL, "%s: gap in the data section: bytes [%llu, %llu) belong to no tensor (before \"%s\")",
                           path, (unsigned long long)pos, (unsigned long long)t->begin, t->name);
        if (t->begin < pos)
            return err_set(err, PD_EINVAL, "%s: tensor \"%s\": data_offsets [%llu, %llu] overlap another tensor", path,
                           t->name, (unsigned long long)t->begin, (unsigned long long)t->end);
        pos = t->end;
    }
    uint64_t expected = pos > UINT64_MAX - 8 - header_len ? UINT64_MAX : 8 + header_len + pos;
    if (pos > datalen)
        return err_set(err, PD_EINVAL, "%s: truncated: header and tensors need %llu bytes, the file has %llu", path,
                       (unsigned long long)expected, (unsigned long long)file_size);
    if (pos < datalen)
        return err_set(err, PD_EINVAL, "%s: %llu bytes after the last tensor belong to no tensor (file %llu bytes, expected %llu)",
                       path, (unsigned long long)(datalen - pos), (unsigned long long)file_size,
                       (unsigned long long)expected);

    ck->by_name = malloc(((size_t)ck->nt + 1) * sizeof *ck->by_name);
    PD_ASSERT(ck->by_name);
    for (int i = 0; i < ck->nt; i++) ck->by_name[i] = (NameIdx){ck->t[i].name, i};
    qsort(ck->by_name, (size_t)ck->nt, sizeof *ck->by_name, cmp_names);
    for (int i = 1; i < ck->nt; i++)
        if (strcmp(ck->by_name[i].name, ck->by_name[i - 1].name) == 0)
            return err_set(err, PD_EINVAL, "%s: duplicate tensor name \"%s\"", path, ck->by_name[i].name);
    /* metadata: duplicate keys are errors; then lookups need only a linear scan order-free */
    MetaKV *sorted = malloc(((size_t)ck->nm + 1) * sizeof *sorted);
    PD_ASSERT(sorted);
    if (ck->nm) memcpy(sorted, ck->m, (size_t)ck->nm * sizeof *sorted);
    qsort(sorted, (size_t)ck->nm, sizeof *sorted, cmp_meta);
    for (int i = 1; i < ck->nm; i++)
        if (strcmp(sorted[i].key, sorted[i - 1].key) == 0) {
            err_set(err, PD_EINVAL, "%s: duplicate metadata key \"%s\"", path, sorted[i].key);
            free(sorted);
            return PD_EINVAL;
        }
    free(sorted);
    const char *fmt = ckpt_meta(ck, "pipedream.format");
    if (fmt && strcmp(fmt, CKPT_FORMAT) != 0)
        return err_set(err, PD_EINVAL, "%s: pipedream.format \"%.20s\" is not supported (this reader knows \"%s\")", path,
                       fmt, CKPT_FORMAT);
    const char *crc = ckpt_meta(ck, "pipedream.crc32");
    if (crc) {
        unsigned hi, lo;
        if (strlen(crc) != 8 || hex4(crc, &hi) || hex4(crc + 4, &lo))
            return err_set(err, PD_EINVAL, "%s: pipedream.crc32 \"%.20s\" is not 8 hex digits", path, crc);
    }
    return PD_OK;
}

/* ---- open / verify --------------------------------------------------------------- */
static int read_full(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n > 0) {
        size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t k = read(fd, p, chunk);
        if (k < 0 && errno == EINTR) continue;
        if (k == 0) errno = 0;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

void ckpt_close(Ckpt *ck) {
    if (!ck) return;
    free(ck->path);
    free(ck->header);
    free(ck->data);
    free(ck->t);
    free(ck->by_name);
    free(ck->m);
    free(ck);
}

static int check_crc(const Ckpt *ck, uint32_t got, Err *err) {
    const char *want = ckpt_meta(ck, "pipedream.crc32");
    if (!want) return PD_OK;
    unsigned hi, lo;   /* the form was checked in validate() */
    PD_ASSERT(hex4(want, &hi) == 0 && hex4(want + 4, &lo) == 0);
    if ((hi << 16 | lo) != got)
        return err_set(err, PD_EINVAL, "%s: checksum mismatch: header says crc32 %s, the data has %08x", ck->path, want,
                       (unsigned)got);
    return PD_OK;
}

/* keep_data: read the data section into memory (ckpt_open) or stream it through a CRC
 * (ckpt_verify). */
static int load(const char *path, int keep_data, Ckpt **out, Err *err) {
    *out = NULL;
    Ckpt *ck = calloc(1, sizeof *ck);
    PD_ASSERT(ck);
    size_t pl = strlen(path) + 1;
    ck->path = malloc(pl);
    PD_ASSERT(ck->path);
    memcpy(ck->path, path, pl);
    int rc = PD_OK;
    unsigned char *chunk = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = err_set(err, PD_EIO, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = err_set(err, PD_EIO, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = err_set(err, PD_EINVAL, "%s: not a regular file", path);
        goto fail;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8) {
        rc = err_set(err, PD_EINVAL, "%s: truncated or not a checkpoint: %llu bytes, fewer than the 8-byte header length",
                     path, (unsigned long long)size);
        goto fail;
    }
    unsigned char len8[8];
    if (read_full(fd, len8, 8)) goto read_failed;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    if (n > CKPT_MAX_HEADER) {
        rc = err_set(err, PD_EINVAL, "%s: header length %llu is larger than the limit %llu: not a checkpoint", path,
                     (unsigned long long)n, (unsigned long long)CKPT_MAX_HEADER);
        goto fail;
    }
    if (n > size - 8) {
        rc = err_set(err, PD_EINVAL,
                     "%s: truncated or bad header length: the header needs %llu bytes, only %llu follow (file %llu bytes)",
                     path, (unsigned long long)n, (unsigned long long)(size - 8), (unsigned long long)size);
        goto fail;
    }
    ck->header = malloc((size_t)n + 1);
    PD_ASSERT(ck->header);
    if (read_full(fd, ck->header, (size_t)n)) goto read_failed;
    ck->header[n] = 0;
    P p = {.s = ck->header, .n = (size_t)n, .i = 0, .path = path, .err = err, .ck = ck};
    if ((rc = pheader(&p))) goto fail;
    ck->datalen = size - 8 - n;
    if ((rc = validate(ck, ck->datalen, n, size, err))) goto fail;

    /* The data is read in 1 MiB pieces, each CRC'd while it is still in cache (one pass over
     * memory), into the data buffer (ckpt_open) or into one reused piece (ckpt_verify). */
    enum { CHUNK = 1 << 20 };
    if (keep_data) {
        /* Large buffers: 2 MiB aligned and backed by huge pages where the kernel allows, which
         * in a VM made reading 256 MB several times faster (fewer page faults and TLB misses). */
        size_t align = ck->datalen >= ((uint64_t)2 << 20) ? (size_t)2 << 20 : 64;
        size_t alloc = ((size_t)ck->datalen + align - 1) / align * align;
        if (posix_memalign((void **)&ck->data, align, alloc ? alloc : 64) != 0) {
            ck->data = NULL;
            rc = err_set(err, PD_ENOMEM, "%s: cannot allocate %llu bytes for the data", path,
                         (unsigned long long)ck->datalen);
            goto fail;
        }
#ifdef MADV_HUGEPAGE
        if (align > 64) madvise(ck->data, alloc, MADV_HUGEPAGE);   /* advice only: failure is fine */
#endif
    } else {
        chunk = malloc(CHUNK);
        PD_ASSERT(chunk);
    }
    uLong c = crc32(0L, Z_NULL, 0);
    for (uint64_t off = 0; off < ck->datalen;) {
        size_t k = ck->datalen - off > CHUNK ? CHUNK : (size_t)(ck->datalen - off);
        unsigned char *dst = keep_data ? ck->data + off : chunk;
        if (read_full(fd, dst, k)) goto read_failed;
        c = crc32_combine(c, pd_crc32(dst, k), (z_off_t)k);
        off += k;
    }
    uint32_t crc = (uint32_t)c;
    if (keep_data)
        for (int i = 0; i < ck->nt; i++) ck->t[i].data = ck->data + ck->t[i].begin;
    if ((rc = check_crc(ck, crc, err))) goto fail;
    close(fd);
    free(chunk);
    *out = ck;
    return PD_OK;

read_failed:
    rc = err_set(err, PD_EIO, "%s: read failed (file shorter than it was a moment ago?): %s", path,
                 errno ? strerror(errno) : "end of file");
fail:
    if (fd >= 0) close(fd);
    free(chunk);
    ckpt_close(ck);
    return rc;
}

int ckpt_open(const char *path, Ckpt **out, Err *err) { return load(path, 1, out, err); }

int ckpt_verify(const char *path, Err *err) {
    Ckpt *ck;
    int rc = load(path, 0, &ck, err);
    ckpt_close(ck);
    return rc;
}

/* ---- accessors ------------------------------------------------------------------- */
const char *ckpt_path(const Ckpt *ck) { return ck->path; }
int ckpt_count(const Ckpt *ck) { return ck->nt; }

const CkptTensor *ckpt_tensor(const Ckpt *ck, int i) {
    PD_ASSERTF(i >= 0 && i < ck->nt, "tensor %d of %d", i, ck->nt);
    return &ck->t[i];
}

const CkptTensor *ckpt_find(const Ckpt *ck, const char *name) {
    int lo = 0, hi = ck->nt - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, ck->by_name[mid].name);
        if (c == 0) return &ck->t[ck->by_name[mid].i];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

const char *ckpt_meta(const Ckpt *ck, const char *key) {
    for (int i = 0; i < ck->nm; i++)
        if (strcmp(ck->m[i].key, key) == 0) return ck->m[i].value;
    return NULL;
}

int ckpt_meta_count(const Ckpt *ck) { return ck->nm; }

const char *ckpt_optimizer(const Ckpt *ck) {
    const char *key = ckpt_meta(ck, "pipedream.optimizer");
    if (key) return key;
    int m = 0, v = 0;
    for (int i = 0; i < ck->nt; i++) {
        m |= !strncmp(ck->t[i].name, "optim.m.", 8);
        v |= !strncmp(ck->t[i].name, "optim.v.", 8);
    }
    return v ? "adam" : m ? "sgd" : NULL;
}

void ckpt_meta_at(const Ckpt *ck, int i, const char **key, const char **value) {
    PD_ASSERTF(i >= 0 && i < ck->nm, "metadata %d of %d", i, ck->nm);
    *key = ck->m[i].key;
    *value = ck->m[i].value;
}

int ckpt_copy(const Ckpt *ck, const char *name, CkptDtype dt, int ndim, const int64_t *shape, void *dst, Err *err) {
    const CkptTensor *t = ckpt_find(ck, name);
    if (!t) return err_set(err, PD_EINVAL, "%s: no tensor \"%s\"", ck->path, name);
    if (t->dtype != dt)
        return err_set(err, PD_EINVAL, "%s: tensor \"%s\" is %s, expected %s", ck->path, name, ckpt_dtype_name(t->dtype),
                       ckpt_dtype_name(dt));
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char got[200], want[200];
        CkptTensor w = {.ndim = ndim < 0 ? 0 : ndim > CKPT_MAX_DIMS ? CKPT_MAX_DIMS : ndim};
        for (int i = 0; i < w.ndim; i++) w.shape[i] = shape[i];
        shape_text(t, got, sizeof got);
        shape_text(&w, want, sizeof want);
        return err_set(err, PD_EINVAL, "%s: tensor \"%s\" has shape %s, expected %s", ck->path, name, got, want);
    }
    PD_ASSERTF(ck->data, "%s: opened without data", ck->path);
    if (t->nbytes) memcpy(dst, t->data, t->nbytes);
    return PD_OK;
}

int ckpt_copy_f32(const Ckpt *ck, const char *name, Shape s, float *dst, Err *err) {
    int64_t d[PD_MAX_DIMS];
    PD_ASSERT(s.ndim >= 0 && s.ndim <= PD_MAX_DIMS);
    for (int i = 0; i < s.ndim; i++) d[i] = s.d[i];
    return ckpt_copy(ck, name, CKPT_F32, s.ndim, d, dst, err);
}

/* ---- directories ----------------------------------------------------------------- */
static const char NAME_PREFIX[] = "ckpt-", NAME_SUFFIX[] = ".safetensors";

int ckpt_name(uint64_t step, char *buf, size_t n, Err *err) {
    if ((size_t)snprintf(buf, n, "%s%010llu%s", NAME_PREFIX, (unsigned long long)step, NAME_SUFFIX) >= n)
        return err_set(err, PD_EINVAL, "checkpoint name for step %llu does not fit into %zu bytes",
                       (unsigned long long)step, n);
    return PD_OK;
}

int ckpt_name_parse(const char *name, uint64_t *step) {
    size_t lp = sizeof NAME_PREFIX - 1, ls = sizeof NAME_SUFFIX - 1, n = strlen(name);
    if (n < lp + 10 + ls || strncmp(name, NAME_PREFIX, lp) != 0 || strcmp(name + n - ls, NAME_SUFFIX) != 0) return 0;
    uint64_t v = 0;
    for (size_t i = lp; i < n - ls; i++) {
        if (name[i] < '0' || name[i] > '9') return 0;
        unsigned d = (unsigned)(name[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    *step = v;
    return 1;
}

typedef struct Cand {
    uint64_t step;
    char *name;
} Cand;

static int cmp_cand_desc(const void *a, const void *b) {
    const Cand *x = a, *y = b;
    if (x->step != y->step) return x->step > y->step ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The checkpoint files of dir, newest first (*nc of them; caller frees names and array). */
static int list_ckpts(const char *dir, Cand **out, size_t *nout, Err *err) {
    *out = NULL, *nout = 0;
    DIR *d = opendir(dir);
    if (!d) return err_set(err, PD_EIO, "%s: cannot read checkpoint directory: %s", dir, strerror(errno));
    Cand *c = NULL;
    size_t nc = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        uint64_t step;
        if (!ckpt_name_parse(e->d_name, &step)) continue;
        if (nc == cap) {
            cap = cap ? 2 * cap : 16;
            c = realloc(c, cap * sizeof *c);
            PD_ASSERT(c);
        }
        size_t l = strlen(e->d_name) + 1;
        c[nc].name = malloc(l);
        PD_ASSERT(c[nc].name);
        memcpy(c[nc].name, e->d_name, l);
        c[nc++].step = step;
    }
    closedir(d);
    if (nc > 1) qsort(c, nc, sizeof *c, cmp_cand_desc);
    *out = c, *nout = nc;
    return PD_OK;
}

int ckpt_prune(const char *dir, int keep, uint64_t newest, Err *err) {
    PD_ASSERT(keep >= 1);
    Cand *c;
    size_t nc;
    if (list_ckpts(dir, &c, &nc, err)) return -1;
    int kept = 1, deleted = 0;   /* newest itself */
    for (size_t i = 0; i < nc; i++) {
        if (c[i].step >= newest) continue;
        if (kept < keep) {
            kept++;
            continue;
        }
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, c[i].name) >= sizeof path ||
            (unlink(path) != 0 && errno != ENOENT))
            pd_log(LOG_WARN, "cannot delete the old checkpoint %s/%s: %s", dir, c[i].name, strerror(errno));
        else deleted++;
    }
    for (size_t i = 0; i < nc; i++) free(c[i].name);
    free(c);
    return deleted;
}

int ckpt_latest(const char *dir, char *out, size_t n, Err *err) {
    PD_ASSERT(n > 0);
    out[0] = 0;
    Cand *c;
    size_t nc;
    int rc = list_ckpts(dir, &c, &nc, err);
    if (rc) return rc;
    for (size_t i = 0; i < nc; i++) {
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, c[i].name) >= sizeof path) {
            rc = err_set(err, PD_EINVAL, "%s/%s: path too long", dir, c[i].name);
            break;
        }
        Err verr = {0};
        if (ckpt_verify(path, &verr) != PD_OK) {
            pd_log(LOG_WARN, "skipping checkpoint %s: %s", path, verr.msg);
            continue;
        }
        if (strlen(path) + 1 > n) rc = err_set(err, PD_EINVAL, "%s: path does not fit into %zu bytes", path, n);
        else memcpy(out, path, strlen(path) + 1);
        break;
    }
    for (size_t i = 0; i < nc; i++) free(c[i].name);
    free(c);
    return rc;
}
