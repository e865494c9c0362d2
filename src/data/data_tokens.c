/* data_tokens.c: token shards in llm.c's format (data.h, "token shards"): a directory's
 * training and validation shards read, checked and laid out as next-token sequences, and the
 * bytes per token of the validation targets from the tokenizer's JSON (tools/bpe.py).
 * Not here: tokenizing (tools/bpe.py), tokens wider than 16 bits. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "data.h"

#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static uint32_t le32(const unsigned char *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* The split's shard names in dir, sorted: names containing `split` and ending in ".bin". */
static int shard_names(const char *dir, const char *split, char ***names, size_t *n, Err *err) {
    *names = NULL, *n = 0;
    DIR *d = opendir(dir);
    if (!d) return err_set(err, PD_EIO, "%s: cannot open the shard folder: %s", dir, strerror(errno));
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t k = strlen(e->d_name);
        if (e->d_name[0] == '.' || k < 4 || strcmp(e->d_name + k - 4, ".bin") || !strstr(e->d_name, split)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            *names = realloc(*names, cap * sizeof **names);
            PD_ASSERT(*names);
        }
        (*names)[(*n)++] = strdup(e->d_name);
    }
    closedir(d);
    if (*n) qsort(*names, *n, sizeof **names, cmp_str);
    return PD_OK;
}

/* Appends path's tokens to *tok (grown), checking its header against its size. */
static int shard_read(const char *path, uint16_t **tok, size_t *n, size_t *cap, Err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, PD_EIO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char hd[SHARD_HEADER_BYTES];
    int rc = PD_OK;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || fread(hd, 1, sizeof hd, f) != sizeof hd) {
        rc = err_set(err, PD_EINVAL, "%s: shorter than the %d-byte header of a token shard", path, SHARD_HEADER_BYTES);
        goto done;
    }
    uint32_t magic = le32(hd), version = le32(hd + 4), count = le32(hd + 8);
    if (magic != DATA_TOKENS_MAGIC) {
        rc = err_set(err, PD_EINVAL, "%s: magic %u, expected %d (a token shard: llm.c's format)", path, magic,
                     DATA_TOKENS_MAGIC);
        goto done;
    }
    if (version != 1) {
        rc = err_set(err, PD_EINVAL, "%s: version %u, expected 1 (uint16 tokens)", path, version);
        goto done;
    }
    if ((uint64_t)st.st_size != SHARD_HEADER_BYTES + 2 * (uint64_t)count) {
        rc = err_set(err, PD_EINVAL, "%s: the header declares %u tokens (%llu bytes in all), the file has %lld bytes",
                     path, count, (unsigned long long)(SHARD_HEADER_BYTES + 2 * (uint64_t)count), (long long)st.st_size);
        goto done;
    }
    if ((uint64_t)*n + count > DATA_TOKENS_MAX) {
        rc = err_set(err, PD_EINVAL, "%s: more than %u tokens in the split", path, DATA_TOKENS_MAX);
        goto done;
    }
    if (*n + count > *cap) {
        size_t nc = *cap ? *cap : 1 << 16;
        while (nc < *n + count) nc *= 2;
        uint16_t *t = realloc(*tok, nc * sizeof **tok);
        if (!t) {
            rc = err_set(err, PD_ENOMEM, "%s: out of memory", path);
            goto done;
        }
        *tok = t, *cap = nc;
    }
    unsigned char *raw = (unsigned char *)(*tok + *n);
    if (fread(raw, 2, count, f) != count) {
        rc = err_set(err, PD_EIO, "%s: read failed (file changed while reading?)", path);
        goto done;
    }
    for (size_t i = 0; i < count; i++) (*tok)[*n + i] = (uint16_t)(raw[2 * i] | raw[2 * i + 1] << 8);
    *n += count;
done:
    fclose(f);
    return rc;
}

/* Every token of one split, concatenated. */
static int split_tokens(const char *dir, const char *split, uint16_t **tok, size_t *n, Err *err) {
    *tok = NULL, *n = 0;
    if (strcmp(split, "train") && strcmp(split, "val"))
        return err_set(err, PD_EINVAL, "unknown split \"%s\" (expected train or val)", split);
    char **names;
    size_t k, cap = 0;
    int rc = shard_names(dir, split, &names, &k, err);
    if (rc) return rc;
    if (k == 0) rc = err_set(err, PD_EINVAL, "%s: no %s shard (a file whose name contains \"%s\" and ends in .bin)", dir,
                             split, split);
    char path[4096];
    for (size_t i = 0; i < k && !rc; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        rc = shard_read(path, tok, n, &cap, err);
    }
    for (size_t i = 0; i < k; i++) free(names[i]);
    free(names);
    if (rc) {
        free(*tok);
        *tok = NULL, *n = 0;
    }
    return rc;
}

int data_tokens_dataset(const char *dir, const char *split, int ctx, Dataset *out, Err *err) {
    memset(out, 0, sizeof *out);
    if (ctx < 1) return err_set(err, PD_EINVAL, "%s: context length %d: expected >= 1", dir, ctx);
    uint16_t *tok;
    size_t n;
    int rc = split_tokens(dir, split, &tok, &n, err);
    if (rc) return rc;
    size_t T = (size_t)ctx, seqs = n >= 1 ? (n - 1) / T : 0;
    if (seqs == 0) {
        free(tok);
        return err_set(err, PD_EINVAL, "%s: the %s split's %zu tokens hold no sequence of %d tokens and its target", dir,
                       split, n, ctx);
    }
    int maxt = 0;
    for (size_t i = 0; i < n; i++) maxt = tok[i] > maxt ? tok[i] : maxt;
    out->x = pd_alloc(seqs * T * sizeof(float));
    out->y = pd_alloc(seqs * T * sizeof(int32_t));
    out->n = seqs, out->c = 1, out->h = 1, out->w = ctx, out->n_classes = maxt + 1, out->y_len = ctx;
    for (size_t s = 0; s < seqs; s++)
        for (size_t t = 0; t < T; t++) {
            out->x[s * T + t] = (float)tok[s * T + t];
            out->y[s * T + t] = tok[s * T + t + 1];
        }
    free(tok);
    return PD_OK;
}

int data_tokens_bytes_per_token(const char *dir, int ctx, double *bytes_per_token, Err *err) {
    *bytes_per_token = 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct stat st;
    if (stat(path, &st) != 0) return PD_OK;
    char *text = NULL;
    int rc = pd_read_file(path, 1u << 28, &text, NULL, err);
    if (rc) return rc;
    cJSON *j = cJSON_Parse(text);
    pd_free(text);
    const cJSON *tb = j ? cJSON_GetObjectItemCaseSensitive(j, "token_bytes") : NULL;
    if (!cJSON_IsArray(tb)) {
        cJSON_Delete(j);
        return err_set(err, PD_EINVAL, "%s: no \"token_bytes\" array (a tokenizer written by tools/bpe.py)", path);
    }
    int V = cJSON_GetArraySize(tb);
    int *len = malloc((size_t)(V ? V : 1) * sizeof *len);
    PD_ASSERT(len);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, tb) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 1 || e->valuedouble > 1024) {
            rc = err_set(err, PD_EINVAL, "%s: token_bytes[%d] is not a length in 1..1024", path, i);
            break;
        }
        len[i++] = (int)e->valuedouble;
    }
    cJSON_Delete(j);
    uint16_t *tok = NULL;
    size_t n = 0;
    if (!rc) rc = split_tokens(dir, "val", &tok, &n, err);
    if (!rc) {
        size_t T = (size_t)(ctx > 0 ? ctx : 1), seqs = n >= 1 ? (n - 1) / T : 0;
        double bytes = 0;
        for (size_t k = 1; k <= seqs * T && !rc; k++) {
            if (tok[k] >= V) rc = err_set(err, PD_EINVAL, "%s: token %u has no length (%d tokens)", path, tok[k], V);
            else bytes += len[tok[k]];
        }
        if (!rc && seqs) *bytes_per_token = bytes / (double)(seqs * T);
    }
    free(tok);
    free(len);
    return rc;
}
