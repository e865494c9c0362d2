/* fuzz_json.c: core's strict JSON object reader (JObj over cJSON) on arbitrary text: parse,
 * read a few keys of each kind (as a model/cluster reader would), report unused keys, and
 * walk nested objects the same way. */
#include "fuzz_util.h"

#include <cjson/cJSON.h>

static void read_obj(const cJSON *o, int depth) {
    JObj j;
    Err err = {0};
    if (jobj_init(&j, o, &err, "fuzz: depth %d", depth) != PD_OK) return;
    int i, b;
    double d;
    const char *s;
    jobj_int(&j, "n", 0, -100, 1000000, &i, &err);
    jobj_int(&j, "workers", 1, 1, 64, &i, &err);
    jobj_num(&j, "bandwidth", 0, 0, 1e30, &d, &err);
    jobj_bool(&j, "straight", 0, &b, &err);
    jobj_str(&j, "type", 0, &s, &err);
    (void)jobj_has(&j, "name");
    const cJSON *c = jobj_get(&j, "layers");
    if (c && depth < 8) {
        const cJSON *e;
        cJSON_ArrayForEach(e, c) read_obj(e, depth + 1);
    }
    jobj_done(&j, &err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
    cJSON *root = cJSON_ParseWithLength((const char *)data, len);
    if (!root) return 0;
    read_obj(root, 0);
    cJSON_Delete(root);
    return 0;
}
