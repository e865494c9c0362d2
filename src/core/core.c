/* core.c: errors, assertions, allocation, tensors, clock, logging, files. The RNG is in
 * rng.c and the strict JSON reader in json.c. */
#define _DEFAULT_SOURCE   /* MADV_HUGEPAGE */
#include "core.h"

#include <errno.h>
#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

int err_set(Err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

int err_prefix(Err *err, const char *fmt, ...) {
    if (!err) return PD_EINVAL;
    char pre[256], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t k = strlen(pre);
    if (k > sizeof err->msg - 3) k = sizeof err->msg - 3;
    memcpy(err->msg, pre, k);
    memcpy(err->msg + k, ": ", 2);
    size_t rest = sizeof err->msg - k - 3;
    size_t ol = strnlen(old, rest);
    memcpy(err->msg + k + 2, old, ol);
    err->msg[k + 2 + ol] = '\0';
    return err->code;
}

void pd_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    fprintf(stderr, "pipedream: internal error: %s:%d: assertion failed: %s", file, line, cond);
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        fputs(": ", stderr);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
    fputc('\n', stderr);
    fflush(stderr);
    abort();
}

/* Buffers of PD_HUGE_MIN bytes or more (a dataset, activations, weights) start on a 2 MB
 * boundary and ask for transparent huge pages: their first touch then costs one fault per 2 MB,
 * not per 4 KB. On a VM each fault is dear: loading Fashion-MNIST's 188 MB of floats spent
 * more time faulting than converting. Where the kernel gives huge pages only on request (THP
 * "madvise"), this is the request; elsewhere it changes nothing. */
#define PD_HUGE_MIN ((size_t)8 << 20)
#define PD_HUGE_ALIGN ((size_t)2 << 20)

void *pd_alloc(size_t bytes) {
    size_t n = (bytes + 63) / 64 * 64;
    if (n == 0) n = 64;
    if (n >= PD_HUGE_MIN) {
        n = (n + PD_HUGE_ALIGN - 1) / PD_HUGE_ALIGN * PD_HUGE_ALIGN;
        void *p = aligned_alloc(PD_HUGE_ALIGN, n);
        PD_ASSERTF(p != NULL, "out of memory allocating %zu bytes", bytes);
#ifdef MADV_HUGEPAGE
        (void)madvise(p, n, MADV_HUGEPAGE);   /* advice: a refusal leaves ordinary pages */
#endif
        return p;
    }
    void *p = aligned_alloc(64, n);
    PD_ASSERTF(p != NULL, "out of memory allocating %zu bytes", bytes);
    return p;
}

void *pd_calloc(size_t bytes) {
    void *p = pd_alloc(bytes);
    memset(p, 0, bytes);
    return p;
}

void pd_free(void *p) { free(p); }

float *pd_alloc_f32(size_t n) { return pd_calloc(n * sizeof(float)); }

/* One element: nearest, ties to even; NaN the quiet one, as PyTorch. */
static inline uint16_t bf16_round(uint32_t u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

void pd_bf16_pack(const float *x, uint16_t *y, size_t n) {
    size_t i = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
    /* 16 at a time, the same integer arithmetic as bf16_round (bitwise its results): the
     * scalar loop does not vectorise (its NaN branch), and the kernels convert every bf16
     * product's inputs through here. */
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff),
                  abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000),
                  qnan = _mm512_set1_epi32(0x7fc0);
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512((const void *)(x + i));
        __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, half), _mm512_and_si512(_mm512_srli_epi32(u, 16), one));
        r = _mm512_srli_epi32(r, 16);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
        r = _mm512_mask_mov_epi32(r, nan, qnan);
        _mm256_storeu_si256((__m256i *)(void *)(y + i), _mm512_cvtepi32_epi16(r));
    }
#endif
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        y[i] = bf16_round(u);
    }
}

void pd_bf16_unpack(const uint16_t *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)x[i] << 16;
        memcpy(&y[i], &u, 4);
    }
}

Shape shape_make(int ndim, const int *d) {
    PD_ASSERTF(ndim >= 0 && ndim <= PD_MAX_DIMS, "ndim %d", ndim);
    Shape s = {.ndim = ndim};
    for (int i = 0; i < ndim; i++) s.d[i] = d[i];
    return s;
}
Shape shape1(int a) { return (Shape){1, {a}}; }
Shape shape2(int a, int b) { return (Shape){2, {a, b}}; }
Shape shape3(int a, int b, int c) { return (Shape){3, {a, b, c}}; }
Shape shape4(int a, int b, int c, int d) { return (Shape){4, {a, b, c, d}}; }

size_t shape_numel(Shape s) {
    size_t n = 1;
    for (int i = 0; i < s.ndim; i++) n *= (size_t)s.d[i];
    return n;
}

int shape_eq(Shape a, Shape b) {
    if (a.ndim != b.ndim) return 0;
    for (int i = 0; i < a.ndim; i++)
        if (a.d[i] != b.d[i]) return 0;
    return 1;
}

char *shape_str(Shape s, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "(");
    for (int i = 0; i < s.ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %d" : "%d", s.d[i]);
    if (k < n) snprintf(buf + k, n - k, ")");
    return buf;
}

double pd_thread_cpu(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double pd_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static LogLevel g_log_level = LOG_INFO;
void pd_log_set_level(LogLevel l) { g_log_level = l; }

void pd_log(LogLevel l, const char *fmt, ...) {
    if (l > g_log_level) return;
    static const char *names[] = {"error", "warning", "info", "debug"};
    fprintf(stderr, "pipedream: %s: ", names[l]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int pd_stderr_is_tty(void) { return isatty(STDERR_FILENO); }

int pd_read_file(const char *path, size_t max_bytes, char **out, size_t *len, Err *err) {
    *out = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, PD_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return err_set(err, PD_EIO, "%s: not a regular file", path);
    }
    if ((size_t)st.st_size > max_bytes) {
        fclose(f);
        return err_set(err, PD_EINVAL, "%s: file is %lld bytes, more than the %zu allowed", path,
                       (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = pd_alloc(n + 1);
    size_t got = fread(buf, 1, n, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || got != n) {
        pd_free(buf);
        return err_set(err, PD_EIO, "%s: read %zu of %zu bytes", path, got, n);
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return PD_OK;
}

/* Removes the temporary file of a write that failed; f is finished. */
static void atomic_discard(PdAtomicFile *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    unlink(f->tmp);
}

int pd_atomic_open(PdAtomicFile *f, const char *path, Err *err) {
    static atomic_uint counter;   /* two threads of one process may write the same path */
    f->fd = -1;
    f->path = path;
    if ((size_t)snprintf(f->tmp, sizeof f->tmp, "%s.tmp.%ld.%u", path, (long)getpid(),
                         atomic_fetch_add(&counter, 1)) >= sizeof f->tmp)
        return err_set(err, PD_EINVAL, "%s: path too long", path);
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (f->fd < 0)
        return err_set(err, PD_EIO, "%s: cannot create temporary file %s: %s", path, f->tmp, strerror(errno));
    return PD_OK;
}

int pd_atomic_write(PdAtomicFile *f, const void *data, size_t len, Err *err) {
    PD_ASSERT(f->fd >= 0);
    const char *p = data;
    while (len > 0) {
        size_t chunk = len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len;
        ssize_t k = write(f->fd, p, chunk);
        if (k < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            atomic_discard(f);
            return err_set(err, PD_EIO, "%s: write failed: %s", f->path, strerror(e));
        }
        p += k;
        len -= (size_t)k;
    }
    return PD_OK;
}

/* fsync of the directory holding path, so that a rename into it is durable. */
static int fsync_dir_of(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) strcpy(dir, ".");
    else if (slash == path) strcpy(dir, "/");
    else {
        size_t n = (size_t)(slash - path);
        if (n >= sizeof dir) return -1;
        memcpy(dir, path, n);
        dir[n] = 0;
    }
    int fd = open(dir, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int pd_atomic_commit(PdAtomicFile *f, Err *err) {
    PD_ASSERT(f->fd >= 0);
    if (fsync(f->fd) != 0) {
        int e = errno;
        atomic_discard(f);
        return err_set(err, PD_EIO, "%s: fsync failed: %s", f->path, strerror(e));
    }
    int fd = f->fd;
    f->fd = -1;
    if (close(fd) != 0) {
        int e = errno;
        atomic_discard(f);
        return err_set(err, PD_EIO, "%s: close failed: %s", f->path, strerror(e));
    }
    if (rename(f->tmp, f->path) != 0) {
        int e = errno;
        atomic_discard(f);
        return err_set(err, PD_EIO, "%s: cannot rename %s into place: %s", f->path, f->tmp, strerror(e));
    }
    /* the file is complete and in place; only the durability of the rename is in doubt */
    if (fsync_dir_of(f->path) != 0)
        return err_set(err, PD_EIO, "%s: fsync of its directory failed: %s", f->path, strerror(errno));
    return PD_OK;
}

int pd_write_file_atomic(const char *path, const void *data, size_t len, Err *err) {
    PdAtomicFile f;
    int rc = pd_atomic_open(&f, path, err);
    if (!rc) rc = pd_atomic_write(&f, data, len, err);
    if (!rc) rc = pd_atomic_commit(&f, err);
    return rc;
}

uint32_t pd_crc32(const void *data, size_t len) {
    uLong c = crc32(0L, Z_NULL, 0);
    const unsigned char *p = data;
    while (len > 0) {
        uInt chunk = len > (1u << 30) ? (1u << 30) : (uInt)len;
        c = crc32(c, p, chunk);
        p += chunk;
        len -= chunk;
    }
    return (uint32_t)c;
}
