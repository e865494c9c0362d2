/* fuzz_model.c: the model JSON reader (src/nn, model_parse) on arbitrary text; on success,
 * the shape queries every later stage relies on. */
#include "fuzz_util.h"

#include "nn.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    pd_log_set_level(LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
    char *text = fuzz_text(data, len);
    Err err = {0};
    Model *m = model_parse(text, "fuzz.json", &err);
    if (m) {
        int n = model_n_layers(m);
        for (int i = 0; i < n; i++) {
            (void)model_layer_out_shape(m, i);
            (void)model_layer_in_shape(m, i);
            (void)model_layer_type(m, i);
            (void)model_layer_flops(m, i);
        }
        (void)model_param_count(m, 0, n);
        model_free(m);
    }
    free(text);
    return 0;
}
