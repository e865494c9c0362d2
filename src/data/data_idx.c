/* data_idx.c: the MNIST / Fashion-MNIST IDX reader (gzip-compressed or raw, both through
 * zlib's gzread, which passes uncompressed files through unchanged).
 *
 * IDX: a big-endian uint32 magic 0x000008DD (0x08 = unsigned bytes, DD = number of
 * dimensions), DD big-endian uint32 sizes, then the bytes. Images: 0x00000803 (n, rows,
 * cols); labels: 0x00000801 (n).
 *
 * A header is only a claim: the pixel buffer grows as bytes actually arrive (doubling,
 * never past the declared size), so a header claiming 2^31 images costs nothing until
 * the data is there. Only after all bytes are in is the float array allocated.
 * Not here: other IDX element types (int, float), more than 3 dimensions. */
#include "data.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define IDX_MAGIC_IMAGES 0x00000803u
#define IDX_MAGIC_LABELS 0x00000801u
#define IDX_MAX_SIDE 4096
#define IDX_CHUNK (1u << 20)

typedef struct IdxFile {
    gzFile f;
    char path[4096];
} IdxFile;

static void idx_close(IdxFile *f) {
    if (f->f) gzclose(f->f);
    f->f = NULL;
}

/* Opens dir/name.gz, or dir/name if the .gz does not exist. */
static int idx_open(IdxFile *f, const char *dir, const char *name, Err *err) {
    f->f = NULL;
    if ((size_t)snprintf(f->path, sizeof f->path, "%s/%s.gz", dir, name) >= sizeof f->path)
        return err_set(err, PD_EINVAL, "%s/%s.gz: path too long", dir, name);
    errno = 0;
    FILE *probe = fopen(f->path, "rb");
    if (!probe && errno == ENOENT) {
        char gz[sizeof f->path];
        memcpy(gz, f->path, sizeof gz);
        snprintf(f->path, sizeof f->path, "%s/%s", dir, name);
        probe = fopen(f->path, "rb");
        if (!probe)
            return err_set(err, PD_EIO, "%s: cannot open: %s (nor %s)", gz, strerror(ENOENT), f->path);
    } else if (!probe) {
        return err_set(err, PD_EIO, "%s: cannot open: %s", f->path, strerror(errno));
    }
    fclose(probe);
    f->f = gzopen(f->path, "rb");
    if (!f->f) return err_set(err, PD_EIO, "%s: cannot open: %s", f->path, errno ? strerror(errno) : "gzopen failed");
    gzbuffer(f->f, 1u << 17);
    return PD_OK;
}

/* gzerror's text, without the "path: " zlib puts in front of it. */
static const char *idx_gzerror(IdxFile *f, int *zerr) {
    const char *m = gzerror(f->f, zerr);
    size_t k = strlen(f->path);
    if (!strncmp(m, f->path, k) && !strncmp(m + k, ": ", 2)) m += k + 2;
    return m;
}

/* Reads up to len bytes; returns how many arrived (short only at end of data). Fails on
 * a gzip error other than a stream that simply ends early (that is reported by the
 * caller as truncation, with what was expected). */
static int idx_read(IdxFile *f, void *buf, size_t len, size_t *got, Err *err) {
    *got = 0;
    unsigned char *p = buf;
    while (*got < len) {
        size_t want = len - *got;
        if (want > IDX_CHUNK) want = IDX_CHUNK;
        int r = gzread(f->f, p + *got, (unsigned)want);
        if (r < 0) {
            int zerr;
            const char *m = idx_gzerror(f, &zerr);
            if (zerr == Z_BUF_ERROR) return PD_OK;   /* compressed stream ends early: truncated */
            return err_set(err, PD_EINVAL, "%s: gzip error: %s", f->path, m);
        }
        if (r == 0) {
            int zerr;
            const char *m = idx_gzerror(f, &zerr);
            if (zerr != Z_OK && zerr != Z_BUF_ERROR) return err_set(err, PD_EINVAL, "%s: gzip error: %s", f->path, m);
            return PD_OK;
        }
        *got += (size_t)r;
    }
    return PD_OK;
}

static uint32_t be32(const unsigned char *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

/* Reads the magic and the ndim sizes. */
static int idx_header(IdxFile *f, uint32_t magic, int ndim, uint32_t *dims, const char *what, Err *err) {
    unsigned char b[4 * 4];
    size_t want = 4 * (size_t)(1 + ndim), got;
    int rc = idx_read(f, b, want, &got, err);
    if (rc) return rc;
    if (got >= 4 && be32(b) != magic)
        return err_set(err, PD_EINVAL, "%s: bad magic number 0x%08x, expected 0x%08x (%s)", f->path, be32(b), magic,
                       what);
    if (got < want)
        return err_set(err, PD_EINVAL, "%s: truncated header: expected %zu bytes, found %zu", f->path, want, got);
    for (int i = 0; i < ndim; i++) dims[i] = be32(b + 4 * (1 + i));
    return PD_OK;
}

/* Reads exactly `total` bytes of body into a buffer grown as data arrives, then checks
 * that nothing follows. what_unit/unit_bytes only shape the truncation message. On success
 * *out is malloc'ed (caller frees). */
static int idx_body(IdxFile *f, size_t total, size_t unit_bytes, const char *unit, unsigned char **out,
                    Err *err) {
    *out = NULL;
    size_t cap = total < IDX_CHUNK ? total : IDX_CHUNK, have = 0;
    unsigned char *buf = malloc(cap ? cap : 1);
    if (!buf) return err_set(err, PD_ENOMEM, "%s: out of memory", f->path);
    int rc = PD_OK;
    while (have < total) {
        if (have == cap) {
            size_t ncap = cap * 2 < total ? cap * 2 : total;
            unsigned char *nb = realloc(buf, ncap);
            if (!nb) {
                rc = err_set(err, PD_ENOMEM, "%s: out of memory growing to %zu bytes", f->path, ncap);
                goto fail;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got;
        rc = idx_read(f, buf + have, cap - have, &got, err);
        if (rc) goto fail;
        have += got;
        if (have < cap) break;   /* end of data */
    }
    if (have < total) {
        rc = err_set(err, PD_EINVAL,
                     "%s: truncated data: expected %zu %s (%zu bytes), found %zu bytes (%zu complete %s)", f->path,
                     total / unit_bytes, unit, total, have, have / unit_bytes, unit);
        goto fail;
    }
    unsigned char extra[64];
    size_t got;
    rc = idx_read(f, extra, sizeof extra, &got, err);
    if (rc) goto fail;
    if (got > 0) {
        rc = err_set(err, PD_EINVAL, "%s: trailing data after the %zu %s the header declares", f->path,
                     total / unit_bytes, unit);
        goto fail;
    }
    *out = buf;
    return PD_OK;
fail:
    free(buf);
    return rc;
}

int data_load_idx(const char *dir, const char *split, Dataset *out, Err *err) {
    memset(out, 0, sizeof *out);
    if (!dir) dir = DATA_DEFAULT_IDX_DIR;
    const char *prefix;
    if (split && !strcmp(split, "train")) {
        prefix = "train";
    } else if (split && !strcmp(split, "test")) {
        prefix = "t10k";
    } else {
        return err_set(err, PD_EINVAL, "unknown split \"%s\" (expected train or test)", split ? split : "(null)");
    }
    char name_img[64], name_lab[64];
    snprintf(name_img, sizeof name_img, "%s-images-idx3-ubyte", prefix);
    snprintf(name_lab, sizeof name_lab, "%s-labels-idx1-ubyte", prefix);

    IdxFile fi = {0}, fl = {0};
    unsigned char *pix = NULL, *lab = NULL;
    int rc;
    uint32_t di[3], dl[1];
    if ((rc = idx_open(&fi, dir, name_img, err))) goto done;
    if ((rc = idx_open(&fl, dir, name_lab, err))) goto done;
    if ((rc = idx_header(&fi, IDX_MAGIC_IMAGES, 3, di, "unsigned-byte images, 3 dimensions", err))) goto done;
    if ((rc = idx_header(&fl, IDX_MAGIC_LABELS, 1, dl, "unsigned-byte labels, 1 dimension", err))) goto done;
    if (di[0] == 0 || di[0] > DATA_MAX_SAMPLES) {
        rc = err_set(err, PD_EINVAL, "%s: header declares %u images, expected 1..%u", fi.path, di[0],
                     DATA_MAX_SAMPLES);
        goto done;
    }
    if (di[1] == 0 || di[1] > IDX_MAX_SIDE || di[2] == 0 || di[2] > IDX_MAX_SIDE) {
        rc = err_set(err, PD_EINVAL, "%s: header declares images of %u x %u, expected each side in 1..%d", fi.path,
                     di[1], di[2], IDX_MAX_SIDE);
        goto done;
    }
    if (dl[0] != di[0]) {
        rc = err_set(err, PD_EINVAL, "%s declares %u labels but %s declares %u images: counts must be equal",
                     fl.path, dl[0], fi.path, di[0]);
        goto done;
    }
    size_t n = di[0], numel = (size_t)di[1] * di[2];
    if ((rc = idx_body(&fi, n * numel, numel, "images", &pix, err))) goto done;
    if ((rc = idx_body(&fl, n, 1, "labels", &lab, err))) goto done;
    for (size_t i = 0; i < n; i++) {
        if (lab[i] >= 10) {
            rc = err_set(err, PD_EINVAL, "%s: label %u at index %zu is out of range, expected 0..9", fl.path, lab[i],
                         i);
            goto done;
        }
    }
    out->n = n;
    out->c = 1;
    out->h = (int)di[1];
    out->w = (int)di[2];
    out->n_classes = 10;
    out->pix = pix;   /* kept as bytes: lut gives each its float */
    pix = NULL;
    for (int b = 0; b < 256; b++) out->lut[b] = (float)b / 255.0f;   /* as torchvision ToTensor */
    out->y = pd_alloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) out->y[i] = lab[i];
    rc = PD_OK;
done:
    idx_close(&fi);
    idx_close(&fl);
    free(pix);
    free(lab);
    return rc;
}
