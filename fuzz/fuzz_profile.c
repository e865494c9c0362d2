/* fuzz_profile.c: the profile reader (src/profile, profile_parse): our profile JSON when
 * the text starts with '{', else the authors' graph.txt; on success, profile_validate. */
#include "fuzz_util.h"

#include "profile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
    char *text = fuzz_text(data, len);
    Profile p;
    Err err = {0};
    if (profile_parse(text, "fuzz.profile", &p, &err) == PD_OK) {
        profile_validate(&p, &err);
        (void)profile_is_chain(&p);
        profile_release(&p);
    }
    free(text);
    return 0;
}
