/* data_folder.c: image folders in torchvision's ImageFolder layout (data.h, data_load_folder):
 * the listing of a split (classes, then images, sorted by name), the checks that name a bad
 * file, and the decode cache beside the folder, keyed by the listing (paths, sizes,
 * modification times) and the target shape. Decoding one image is data_image.c's.
 * Also data_dir_kind, which tells an image folder from a CIFAR-10 or IDX directory.
 * Not here: nested class folders, a class list given apart from the folders. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "data.h"

#define FOLDER_MAX_CLASSES 100000
#define CACHE_MAGIC "PDIMGC01"

/* A folder entry: its name and what stat said of it (ok 0: stat failed, errno in err). */
typedef struct Entry {
    char *name;
    struct stat st;
    int ok, err;
} Entry;

typedef struct Names {
    Entry *v;
    size_t n, cap;
} Names;

static void names_add(Names *s, const char *name, const struct stat *st, int err) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        PD_ASSERT(s->v);
    }
    Entry *e = &s->v[s->n++];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    PD_ASSERT(e->name);
    if (st) e->st = *st, e->ok = 1;
    e->err = err;
}

static void names_free(Names *s) {
    for (size_t i = 0; i < s->n; i++) free(s->v[i].name);
    free(s->v);
    memset(s, 0, sizeof *s);
}

static int cmp_entry(const void *a, const void *b) { return strcmp(((const Entry *)a)->name, ((const Entry *)b)->name); }

/* buf = a/b; 0 when it does not fit. */
static int join(char *buf, size_t n, const char *a, const char *b) {
    int k = snprintf(buf, n, "%s/%s", a, b);
    return k >= 0 && (size_t)k < n;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The entries of dir that do not start with '.', with their stat (relative to the open folder:
 * no path walk per file), sorted; dirs_only keeps subfolders only. */
static int list_dir(const char *dir, int dirs_only, Names *out, Err *err) {
    DIR *d = opendir(dir);
    if (!d) return err_set(err, PD_EIO, "%s: cannot open the folder: %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        struct stat st;
        int ok = fstatat(dirfd(d), e->d_name, &st, 0) == 0, en = ok ? 0 : errno;
        if (dirs_only && (!ok || !S_ISDIR(st.st_mode))) continue;
        names_add(out, e->d_name, ok ? &st : NULL, en);
    }
    closedir(d);
    if (out->n) qsort(out->v, out->n, sizeof *out->v, cmp_entry);
    return PD_OK;
}

static int has_image_ext(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && (!strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"));
}

const char *data_dir_kind(const char *dir) {
    if (!dir) return "idx";
    char p[4096];
    snprintf(p, sizeof p, "%s/train", dir);
    if (is_dir(p)) return "folder";
    snprintf(p, sizeof p, "%s/test", dir);
    if (is_dir(p)) return "folder";
    snprintf(p, sizeof p, "%s/data_batch_1.bin", dir);
    if (is_file(p)) return "cifar10";
    snprintf(p, sizeof p, "%s/test_batch.bin", dir);
    if (is_file(p)) return "cifar10";
    return "idx";
}

/* FNV-1a, 64 bits: the cache key. */
static void fnv(uint64_t *h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) *h = (*h ^ p[i]) * 1099511628211ull;
}

/* One split's listing: image paths and labels, and the key of its contents. */
typedef struct Listing {
    Names paths;        /* full paths */
    int32_t *labels;    /* (paths.n) */
    uint64_t key;
} Listing;

static int list_split(const char *dir, const char *split, const Names *classes, int c, int h, int w, Listing *L,
                      Err *err) {
    memset(L, 0, sizeof *L);
    char sdir[4096], cdir[4096], p[4096];
    snprintf(sdir, sizeof sdir, "%s/%s", dir, split);
    if (!is_dir(sdir))
        return err_set(err, PD_EIO, "%s: missing (an image folder holds train/ and test/, one subfolder per class)",
                       sdir);
    Names here = {0};
    int rc = list_dir(sdir, 1, &here, err);
    if (rc) return rc;
    for (size_t i = 0; i < here.n && !rc; i++)
        if (!bsearch(&here.v[i], classes->v, classes->n, sizeof *classes->v, cmp_entry))
            rc = err_set(err, PD_EINVAL, "%s/%s: a class that %s/train does not have", sdir, here.v[i].name, dir);
    names_free(&here);
    if (rc) return rc;
    uint64_t key = 14695981039346656037ull;
    int shape[3] = {c, h, w};
    fnv(&key, CACHE_MAGIC, 8);
    fnv(&key, shape, sizeof shape);
    size_t cap = 0;
    for (size_t k = 0; k < classes->n && !rc; k++) {
        const char *cname = classes->v[k].name;
        if (!join(cdir, sizeof cdir, sdir, cname)) {
            rc = err_set(err, PD_EINVAL, "%s/%s: path too long", sdir, cname);
            break;
        }
        if (!is_dir(cdir)) {
            rc = err_set(err, PD_EINVAL, "%s: missing (class %s of %s/train)", cdir, cname, dir);
            break;
        }
        fnv(&key, cname, strlen(cname) + 1);
        Names files = {0};
        if ((rc = list_dir(cdir, 0, &files, err))) break;
        if (files.n == 0) rc = err_set(err, PD_EINVAL, "%s: an empty class folder (no .png, .jpg or .jpeg image)", cdir);
        for (size_t i = 0; i < files.n && !rc; i++) {
            const struct stat st = files.v[i].st;
            if (!join(p, sizeof p, cdir, files.v[i].name)) {
                rc = err_set(err, PD_EINVAL, "%s/%s: path too long", cdir, files.v[i].name);
            } else if (!files.v[i].ok) {
                rc = err_set(err, PD_EIO, "%s: cannot read: %s", p, strerror(files.v[i].err));
            } else if (!S_ISREG(st.st_mode) || !has_image_ext(files.v[i].name)) {
                rc = err_set(err, PD_EINVAL, "%s: not an image file (a class folder holds .png, .jpg or .jpeg files)",
                             p);
            } else if (L->paths.n >= DATA_MAX_SAMPLES) {
                rc = err_set(err, PD_EINVAL, "%s: more than %u images", sdir, DATA_MAX_SAMPLES);
            } else {
                if (L->paths.n == cap) {
                    cap = cap ? 2 * cap : 1024;
                    L->labels = realloc(L->labels, cap * sizeof *L->labels);
                    PD_ASSERT(L->labels);
                }
                L->labels[L->paths.n] = (int32_t)k;
                names_add(&L->paths, p, NULL, 0);
                int64_t meta[4] = {(int64_t)k, (int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec,
                                   (int64_t)st.st_mtim.tv_nsec};
                fnv(&key, files.v[i].name, strlen(files.v[i].name) + 1);
                fnv(&key, meta, sizeof meta);
            }
        }
        names_free(&files);
    }
    L->key = key;
    return rc;
}

static void listing_free(Listing *L) {
    names_free(&L->paths);
    free(L->labels);
    memset(L, 0, sizeof *L);
}

/* ---- the cache ------------------------------------------------------------------------
 * CACHE_MAGIC (8 bytes), then little-endian uint64 key, n, and int32 c, h, w, classes; labels
 * (n int32); pixels (n, c, h, w) bytes; a CRC-32 of the pixels and labels (uint32). */
typedef struct CacheHead {
    char magic[8];
    uint64_t key, n;
    int32_t c, h, w, classes;
} CacheHead;

static void cache_path(char *buf, size_t n, const char *dir, const char *split, int c, int h, int w) {
    snprintf(buf, n, "%s/.pipedream-cache-%s-%dx%dx%d.bin", dir, split, c, h, w);
}

/* Reads the cache into d when it matches the listing exactly; 0 when it does not (or is damaged). */
static int cache_read(const char *path, const Listing *L, int c, int h, int w, int classes, Dataset *d) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    CacheHead hd;
    size_t n = L->paths.n, numel = (size_t)c * h * w;
    int ok = fread(&hd, sizeof hd, 1, f) == 1 && !memcmp(hd.magic, CACHE_MAGIC, 8) && hd.key == L->key &&
             hd.n == n && hd.c == c && hd.h == h && hd.w == w && hd.classes == classes;
    uint8_t *pix = NULL;
    int32_t *y = NULL;
    if (ok) {
        pix = malloc(n * numel > 0 ? n * numel : 1);
        y = pd_alloc(n * sizeof(int32_t));
        uint32_t crc_file = 0;
        ok = pix && fread(y, sizeof(int32_t), n, f) == n && fread(pix, 1, n * numel, f) == n * numel &&
             fread(&crc_file, 4, 1, f) == 1 && fgetc(f) == EOF;
        if (ok) {
            uint32_t crc = pd_crc32(y, n * sizeof(int32_t)) ^ pd_crc32(pix, n * numel);
            ok = crc == crc_file && !memcmp(y, L->labels, n * sizeof(int32_t));
        }
    }
    fclose(f);
    if (!ok) {
        free(pix);
        pd_free(y);
        return 0;
    }
    d->pix = pix;
    d->y = y;
    return 1;
}

static int cache_write(const char *path, const Dataset *d, uint64_t key, Err *err) {
    size_t n = d->n, numel = data_sample_numel(d);
    CacheHead hd;
    memset(&hd, 0, sizeof hd);
    memcpy(hd.magic, CACHE_MAGIC, 8);
    hd.key = key, hd.n = n, hd.c = d->c, hd.h = d->h, hd.w = d->w, hd.classes = d->n_classes;
    uint32_t crc = pd_crc32(d->y, n * sizeof(int32_t)) ^ pd_crc32(d->pix, n * numel);
    PdAtomicFile f;
    int rc = pd_atomic_open(&f, path, err);
    if (!rc) rc = pd_atomic_write(&f, &hd, sizeof hd, err);
    if (!rc) rc = pd_atomic_write(&f, d->y, n * sizeof(int32_t), err);
    if (!rc) rc = pd_atomic_write(&f, d->pix, n * numel, err);
    if (!rc) rc = pd_atomic_write(&f, &crc, 4, err);
    if (!rc) rc = pd_atomic_commit(&f, err);
    return rc;
}

int data_load_folder(const char *dir, const char *split, int c, int h, int w, Dataset *out, int *cached,
                     Err *err) {
    memset(out, 0, sizeof *out);
    if (cached) *cached = 0;
    if (!dir) return err_set(err, PD_EINVAL, "image folder: no directory given");
    if (!split || (strcmp(split, "train") && strcmp(split, "test")))
        return err_set(err, PD_EINVAL, "unknown split \"%s\" (expected train or test)", split ? split : "(null)");
    if ((c != 1 && c != 3) || h < 1 || w < 1 || h > 4096 || w > 4096)
        return err_set(err, PD_EINVAL, "%s: images for an input of (%d, %d, %d): expected 1 or 3 channels and sides "
                       "in 1..4096", dir, c, h, w);
    char tdir[4096];
    snprintf(tdir, sizeof tdir, "%s/train", dir);
    if (!is_dir(tdir))
        return err_set(err, PD_EIO, "%s: missing (an image folder holds train/ and test/, one subfolder per class)",
                       tdir);
    Names classes = {0};
    Listing L = {0};
    int rc = list_dir(tdir, 1, &classes, err);
    if (!rc && classes.n == 0) rc = err_set(err, PD_EINVAL, "%s: no class folder", tdir);
    if (!rc && classes.n > FOLDER_MAX_CLASSES) rc = err_set(err, PD_EINVAL, "%s: more than %d classes", tdir, FOLDER_MAX_CLASSES);
    if (!rc) rc = list_split(dir, split, &classes, c, h, w, &L, err);
    if (rc) goto done;
    Dataset d = {.n = L.paths.n, .c = c, .h = h, .w = w, .n_classes = (int)classes.n};
    for (int b = 0; b < 256; b++) d.lut[b] = (float)b / 255.0f;   /* as data_load_idx */
    char cpath[4096];
    cache_path(cpath, sizeof cpath, dir, split, c, h, w);
    if (cache_read(cpath, &L, c, h, w, d.n_classes, &d)) {
        if (cached) *cached = 1;
        *out = d;
        goto done;
    }
    size_t numel = (size_t)c * h * w;
    d.pix = malloc(d.n * numel > 0 ? d.n * numel : 1);
    if (!d.pix) {
        rc = err_set(err, PD_ENOMEM, "%s/%s: out of memory for %zu images", dir, split, d.n);
        goto done;
    }
    d.y = pd_alloc(d.n * sizeof(int32_t));
    memcpy(d.y, L.labels, d.n * sizeof(int32_t));
    for (size_t i = 0; i < d.n && !rc; i++) rc = data_image_read(L.paths.v[i].name, c, h, w, d.pix + i * numel, err);
    if (rc) {
        data_release(&d);
        goto done;
    }
    Err werr = {0};
    if (cache_write(cpath, &d, L.key, &werr))
        pd_log(LOG_WARN, "image folder not cached: %s", werr.msg);
    *out = d;
done:
    names_free(&classes);
    listing_free(&L);
    return rc;
}
