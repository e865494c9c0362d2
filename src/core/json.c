/* json.c: strict reading of JSON objects on top of cJSON (remembers which members were read
 * so that unused keys are reported, naming the file/context and the key), and the JSON value
 * and file helpers our file formats share. */
#include "core.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int jobj_init(JObj *j, const cJSON *o, Err *err, const char *ctxfmt, ...) {
    va_list ap;
    va_start(ap, ctxfmt);
    vsnprintf(j->ctx, sizeof j->ctx, ctxfmt, ap);
    va_end(ap);
    j->o = o;
    j->used = 0;
    if (!o || !cJSON_IsObject(o)) return err_set(err, PD_EINVAL, "%s: expected a JSON object", j->ctx);
    int n = cJSON_GetArraySize(o);
    if (n > 64) return err_set(err, PD_EINVAL, "%s: object has %d members, at most 64 expected", j->ctx, n);
    return PD_OK;
}

/* Finds member key (case-sensitive), marking it used. Returns NULL if absent. */
static const cJSON *find(JObj *j, const char *key) {
    int i = 0;
    for (const cJSON *c = j->o->child; c; c = c->next, i++) {
        if (c->string && strcmp(c->string, key) == 0) {
            j->used |= (uint64_t)1 << i;
            return c;
        }
    }
    return NULL;
}

const cJSON *jobj_get(JObj *j, const char *key) { return find(j, key); }

int jobj_has(const JObj *j, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(j->o, key) != NULL;
}

static int absent(JObj *j, const char *key, int required, Err *err) {
    if (required) return err_set(err, PD_EINVAL, "%s: missing required key \"%s\"", j->ctx, key);
    return PD_OK;
}

int jobj_num(JObj *j, const char *key, int required, double lo, double hi, double *out, Err *err) {
    const cJSON *c = find(j, key);
    if (!c) return absent(j, key, required, err);
    if (!cJSON_IsNumber(c))
        return err_set(err, PD_EINVAL, "%s: key \"%s\": expected a number", j->ctx, key);
    double v = c->valuedouble;
    if (!isfinite(v) || v < lo || v > hi)
        return err_set(err, PD_EINVAL, "%s: key \"%s\": %g is outside [%g, %g]", j->ctx, key, v, lo, hi);
    *out = v;
    return PD_OK;
}

int jobj_int(JObj *j, const char *key, int required, long lo, long hi, int *out, Err *err) {
    const cJSON *c = find(j, key);
    if (!c) return absent(j, key, required, err);
    if (!cJSON_IsNumber(c) || c->valuedouble != floor(c->valuedouble))
        return err_set(err, PD_EINVAL, "%s: key \"%s\": expected an integer", j->ctx, key);
    double v = c->valuedouble;
    if (v < (double)lo || v > (double)hi)
        return err_set(err, PD_EINVAL, "%s: key \"%s\": %.0f is outside [%ld, %ld]", j->ctx, key, v, lo, hi);
    *out = (int)v;
    return PD_OK;
}

int jobj_bool(JObj *j, const char *key, int required, int *out, Err *err) {
    const cJSON *c = find(j, key);
    if (!c) return absent(j, key, required, err);
    if (!cJSON_IsBool(c)) return err_set(err, PD_EINVAL, "%s: key \"%s\": expected true or false", j->ctx, key);
    *out = cJSON_IsTrue(c) ? 1 : 0;
    return PD_OK;
}

int jobj_str(JObj *j, const char *key, int required, const char **out, Err *err) {
    const cJSON *c = find(j, key);
    if (!c) return absent(j, key, required, err);
    if (!cJSON_IsString(c)) return err_set(err, PD_EINVAL, "%s: key \"%s\": expected a string", j->ctx, key);
    *out = c->valuestring;
    return PD_OK;
}

int jobj_done(JObj *j, Err *err) {
    int i = 0;
    for (const cJSON *c = j->o->child; c; c = c->next, i++)
        if (!(j->used & ((uint64_t)1 << i)))
            return err_set(err, PD_EINVAL, "%s: unknown key \"%s\"", j->ctx, c->string ? c->string : "?");
    return PD_OK;
}

/* ---- JSON values and files ------------------------------------------------------- */

cJSON *pd_json_parse(const char *text, const char *path, Err *err) {
    cJSON *root = cJSON_Parse(text);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        int line = 1;
        for (const char *c = text; at && c < at && *c; c++) line += *c == '\n';
        err_set(err, PD_EINVAL, "%s:%d: not valid JSON", path, line);
    }
    return root;
}

cJSON *pd_json_num(double v) {
    char buf[40];
    if (!isfinite(v)) return cJSON_CreateNull();   /* JSON has no NaN or infinity */
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    return cJSON_CreateRaw(buf);
}

int pd_json_int(const cJSON *c, int *out) {
    if (!cJSON_IsNumber(c) || c->valuedouble != floor(c->valuedouble) || fabs(c->valuedouble) > 1e9)
        return PD_EINVAL;
    *out = (int)c->valuedouble;
    return PD_OK;
}

int pd_json_save(const cJSON *root, const char *path, Err *err) {
    char *text = cJSON_Print(root);
    PD_ASSERT(text);
    size_t n = strlen(text);
    char *buf = realloc(text, n + 2);
    PD_ASSERT(buf);
    buf[n] = '\n';
    buf[n + 1] = 0;
    int rc = pd_write_file_atomic(path, buf, n + 1, err);
    free(buf);
    return rc;
}
