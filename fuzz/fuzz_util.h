/* fuzz_util.h: what the libFuzzer harnesses share: the readers under test take paths, so
 * each input is written to a file in /dev/shm (tmpfs: no disk traffic), one directory per
 * fuzzing process. Not a library: each harness includes it once. */
#ifndef PD_FUZZ_UTIL_H
#define PD_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"

/* A directory of this process: /dev/shm/pd_fuzz_<tag>_<pid> (created once). */
__attribute__((unused)) static const char *fuzz_dir(const char *tag) {
    static char dir[256];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/dev/shm/pd_fuzz_%s_%ld", tag, (long)getpid());
        if (mkdir(dir, 0700) != 0 && access(dir, W_OK) != 0) abort();
    }
    return dir;
}

/* Writes data to dir/name (replacing it); returns the path (static buffer). */
__attribute__((unused)) static const char *fuzz_write(const char *dir, const char *name, const uint8_t *data, size_t len) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (len && fwrite(data, 1, len, f) != len) abort();
    if (fclose(f) != 0) abort();
    return path;
}

__attribute__((unused)) static void fuzz_unlink(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
}

/* A NUL-terminated copy of the input, for parsers that take text. Caller frees. */
__attribute__((unused)) static char *fuzz_text(const uint8_t *data, size_t len) {
    char *s = malloc(len + 1);
    if (!s) abort();
    memcpy(s, data, len);
    s[len] = 0;
    return s;
}

#endif
