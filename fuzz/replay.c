/* replay.c: a main for a libFuzzer harness (fuzz/fuzz_<name>.c) without libFuzzer, so that
 * any C compiler builds it and ctest replays the committed inputs on every build (release and
 * sanitizers): `fuzz_replay_<name> PATH...` runs LLVMFuzzerInitialize (if the harness has
 * one), then LLVMFuzzerTestOneInput once on every file of each PATH (a file, or a directory
 * read in name order; a missing PATH is said and passed over: fuzz/crashes/<name> exists only
 * while a crash is kept). A crash, an abort (the harnesses' contract checks) or a sanitizer
 * report fails the run, after the name of the input on stdout; no input at all fails too.
 * Under AddressSanitizer one allocation may not exceed PD_FUZZ_MALLOC_MB, as fuzz/run.sh's
 * -malloc_limit_mb, so a size field that lies is caught here too. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

#ifndef PD_FUZZ_MALLOC_MB
#define PD_FUZZ_MALLOC_MB 256
#endif
#define PD_STR2(x) #x
#define PD_STR(x) PD_STR2(x)
/* Read by AddressSanitizer at start-up (ASAN_OPTIONS, when set, adds to it). */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "max_allocation_size_mb=" PD_STR(PD_FUZZ_MALLOC_MB); }

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("cannot open %s\n", path);
        return 1;
    }
    size_t cap = 4096, len = 0, got;
    uint8_t *buf = malloc(cap);
    if (!buf) abort();
    while ((got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb) abort();
            buf = nb;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        printf("cannot read %s\n", path);
        free(buf);
        return 1;
    }
    printf("%s (%zu bytes)\n", path, len);
    fflush(stdout);
    /* an exact-size copy, so that a read past the input is a sanitizer report */
    uint8_t *in = malloc(len ? len : 1);
    if (!in) abort();
    if (len) memcpy(in, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(in, len);
    free(in);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

/* Runs every regular file under path; *n counts them. Returns the number of failures. */
static int run_path(const char *path, int *n) {
    struct stat st;
    if (stat(path, &st) != 0) {
        printf("%s: none (passed over)\n", path);
        return 0;
    }
    if (!S_ISDIR(st.st_mode)) {
        ++*n;
        return run_file(path);
    }
    struct dirent **ents;
    int k = scandir(path, &ents, NULL, by_name), bad = 0;
    if (k < 0) {
        printf("cannot list %s\n", path);
        return 1;
    }
    for (int i = 0; i < k; i++) {
        if (ents[i]->d_name[0] != '.') {
            char sub[4096];
            snprintf(sub, sizeof sub, "%s/%s", path, ents[i]->d_name);
            bad += run_path(sub, n);
        }
        free(ents[i]);
    }
    free(ents);
    return bad;
}

/* Removes the harness's scratch directories (fuzz_util.h: /dev/shm/pd_fuzz_<tag>_<pid>). */
static void remove_scratch(void) {
    char suffix[32];
    snprintf(suffix, sizeof suffix, "_%ld", (long)getpid());
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t nl = strlen(e->d_name), sl = strlen(suffix);
        if (strncmp(e->d_name, "pd_fuzz_", 8) || nl < sl || strcmp(e->d_name + nl - sl, suffix)) continue;
        char dir[512];
        snprintf(dir, sizeof dir, "/dev/shm/%s", e->d_name);
        DIR *s = opendir(dir);
        struct dirent *f;
        while (s && (f = readdir(s))) {
            if (!strcmp(f->d_name, ".") || !strcmp(f->d_name, "..")) continue;
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", dir, f->d_name);
            unlink(p);
        }
        if (s) closedir(s);
        rmdir(dir);
    }
    closedir(d);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int n = 0, bad = 0;
    for (int i = 1; i < argc; i++) bad += run_path(argv[i], &n);
    remove_scratch();
    printf("%d inputs replayed, %d could not be read\n", n, bad);
    return bad || n == 0 ? 1 : 0;
}
