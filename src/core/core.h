/* core.h: what every module needs and nothing more: error status with a message,
 * always-on assertions, tensors (shape + float32 storage), aligned allocation, a
 * counter-based RNG (Philox4x32-10), a monotonic clock, logging, whole-file reading, atomic
 * file writing, strict JSON object reading (unused keys are errors) and JSON value helpers.
 *
 * Library code never calls exit(): errors caused by input return a code and fill an Err;
 * a bug in our own code (a broken invariant) aborts at once via PD_ASSERT, in every build. */
#ifndef PD_CORE_H
#define PD_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- errors ---------------------------------------------------------------------- */
enum {
    PD_OK = 0,
    PD_EINVAL = 1,  /* bad input: file contents, flags, a plan that does not fit */
    PD_EIO = 2,     /* a file could not be opened, read or written */
    PD_ENOMEM = 3,  /* an allocation the input asked for failed */
    PD_ECOMM = 4,   /* a peer failed or a message was wrong */
    PD_EUSAGE = 5,  /* bad command line (the CLI exits 2) */
};

typedef struct Err {
    int code;
    char msg[512];
} Err;

/* Sets err (if non-NULL) to code and the formatted message; returns code, so callers
 * write `return err_set(err, PD_EINVAL, "...")`. */
int err_set(Err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Prefixes the message already in err with "prefix: " (for context as errors climb). */
int err_prefix(Err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Always-on assertions for our own bugs: print file:line and the condition, abort. */
void pd_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
#define PD_ASSERT(c) \
    do { if (!(c)) pd_assert_fail(__FILE__, __LINE__, #c, NULL); } while (0)
#define PD_ASSERTF(c, ...) \
    do { if (!(c)) pd_assert_fail(__FILE__, __LINE__, #c, __VA_ARGS__); } while (0)

/* ---- memory ---------------------------------------------------------------------- */
/* 64-byte aligned allocation, size rounded up; aborts on failure (an allocation of a size
 * we computed ourselves failing is not recoverable). pd_free(NULL) is fine. */
void *pd_alloc(size_t bytes);
void *pd_calloc(size_t bytes);   /* zeroed */
void  pd_free(void *p);
float *pd_alloc_f32(size_t n);   /* zeroed */

/* ---- bfloat16 ---------------------------------------------------------------------- */
/* bf16: a float's upper 16 bits. pd_bf16_pack rounds each of x (n) to nearest, ties to even
 * (any NaN becomes the quiet NaN 0x7fc0), as PyTorch's .to(torch.bfloat16) does; pd_bf16_unpack widens exactly. */
void pd_bf16_pack(const float *x, uint16_t *y, size_t n);
void pd_bf16_unpack(const uint16_t *x, float *y, size_t n);

/* ---- tensors --------------------------------------------------------------------- */
#define PD_MAX_DIMS 5
typedef struct Shape {
    int ndim;
    int d[PD_MAX_DIMS];
} Shape;

typedef struct Tensor {
    Shape shape;
    float *data;   /* borrowed or owned, as the owner says */
} Tensor;

Shape  shape_make(int ndim, const int *d);
Shape  shape1(int a);
Shape  shape2(int a, int b);
Shape  shape3(int a, int b, int c);
Shape  shape4(int a, int b, int c, int d);
size_t shape_numel(Shape s);
int    shape_eq(Shape a, Shape b);
/* Writes "(a, b, c)" into buf; returns buf. */
char  *shape_str(Shape s, char *buf, size_t n);

/* ---- deterministic RNG ----------------------------------------------------------- */
/* Philox4x32-10 (Salmon et al., SC'11). Every random number is a pure function of
 * (seed, stream, substream, index): e.g. stream = layer id, substream = global minibatch
 * index, index = element. So a dropout mask or a shuffle does not depend on which worker
 * or in what order it is drawn; pipelined runs reproduce sequential ones exactly. */
void rng_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

typedef struct Rng {
    uint32_t key[2];
    uint32_t ctr[4];   /* ctr[0..1]: block index, ctr[2..3]: substream */
    uint32_t buf[4];
    int pos;           /* next unused word of buf; 4 = empty */
} Rng;

/* A stream positioned at its first number. */
void     rng_init(Rng *r, uint64_t seed, uint64_t stream, uint64_t substream);
uint32_t rng_u32(Rng *r);
uint64_t rng_u64(Rng *r);
float    rng_uniform(Rng *r);                 /* [0, 1), 24 random bits */
double   rng_uniform_f64(Rng *r);             /* [0, 1), 53 random bits */
float    rng_normal(Rng *r);                  /* N(0, 1), Box-Muller */
uint32_t rng_below(Rng *r, uint32_t n);       /* uniform in [0, n), unbiased; n > 0 */
/* The stream's words from block `block` on (word 4 * block of rng_u32's sequence from
 * rng_init), nblk blocks: out[4 * b + w] is word w of block block + b. The stream's position
 * (ctr, buf, pos) is neither read nor changed. With AVX-512 sixteen blocks at a time (AVX2: eight), bitwise
 * rng_philox's words. */
void     rng_blocks(const Rng *r, uint64_t block, size_t nblk, uint32_t *out);
/* Fisher-Yates permutation of 0..n-1 as a pure function of (seed, stream, substream). */
void     rng_permutation(uint64_t seed, uint64_t stream, uint64_t substream, uint32_t *perm, size_t n);

/* Well-known stream ids, so that no two uses of the RNG collide. */
enum {
    RNG_STREAM_INIT = 1,      /* weight initialisation: substream = layer index */
    RNG_STREAM_SHUFFLE = 2,   /* data order: substream = epoch */
    RNG_STREAM_DROPOUT = 3,   /* dropout: stream = RNG_STREAM_DROPOUT << 32 | layer, substream = minibatch */
    RNG_STREAM_SYNTH = 4,     /* synthetic data */
    RNG_STREAM_AUGMENT = 5,   /* data augmentation: substream = global minibatch */
};

/* ---- clock and logging ----------------------------------------------------------- */
double pd_now(void);           /* monotonic seconds */
double pd_thread_cpu(void);    /* CPU seconds the calling thread has run (0 where unknown) */
typedef enum LogLevel { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG } LogLevel;
void pd_log_set_level(LogLevel l);
void pd_log(LogLevel l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int  pd_stderr_is_tty(void);

/* ---- files ----------------------------------------------------------------------- */
/* Reads a whole file into a NUL-terminated buffer the caller frees (pd_free). Fails with
 * PD_EIO naming the path, or PD_EINVAL if it is larger than max_bytes. */
int pd_read_file(const char *path, size_t max_bytes, char **out, size_t *len, Err *err);
/* Atomic file writing, for every file we write (profiles, plans, checkpoints): the bytes go
 * to a temporary file beside path (path.tmp.<pid>.<n>), which is fsynced, closed and renamed
 * over path; then path's directory is fsynced, so that the rename survives a crash too. A
 * reader sees the old file or the new one, never a part. Use: pd_atomic_open, any number of
 * pd_atomic_write, pd_atomic_commit, each only while the previous call succeeded: on error
 * each removes the temporary file and f is finished (nothing to clean up). Messages name path. */
typedef struct PdAtomicFile {
    int fd;             /* the temporary file; -1 once closed or failed */
    const char *path;   /* borrowed: the destination */
    char tmp[4096];
} PdAtomicFile;
int pd_atomic_open(PdAtomicFile *f, const char *path, Err *err);
int pd_atomic_write(PdAtomicFile *f, const void *data, size_t len, Err *err);
int pd_atomic_commit(PdAtomicFile *f, Err *err);
/* The three steps for one buffer. */
int pd_write_file_atomic(const char *path, const void *data, size_t len, Err *err);
/* CRC-32 (zlib's polynomial) of a buffer, for checksums in written files. */
uint32_t pd_crc32(const void *data, size_t len);

/* ---- strict JSON objects --------------------------------------------------------- */
/* A reader over one JSON object that remembers which keys were read, so jobj_done can
 * report every key nobody asked for (a typo is an error, not a silent default). All
 * messages start with ctx (e.g. "models/mlp.json: layer 3"). */
struct cJSON;
typedef struct JObj {
    const struct cJSON *o;
    char ctx[256];
    uint64_t used;        /* bit i: the i-th member was read (objects up to 64 members) */
} JObj;

int jobj_init(JObj *j, const struct cJSON *o, Err *err, const char *ctxfmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Each getter: if the key is absent and required, fails naming ctx and key; if absent and
 * optional, leaves *out untouched and returns PD_OK; if of the wrong type or out of range,
 * fails naming ctx, key and what was expected. */
int jobj_int(JObj *j, const char *key, int required, long lo, long hi, int *out, Err *err);
int jobj_num(JObj *j, const char *key, int required, double lo, double hi, double *out, Err *err);
int jobj_bool(JObj *j, const char *key, int required, int *out, Err *err);
int jobj_str(JObj *j, const char *key, int required, const char **out, Err *err);
/* Returns the member (any type), marking it used, or NULL if absent (no error). */
const struct cJSON *jobj_get(JObj *j, const char *key);
int jobj_has(const JObj *j, const char *key);
/* Fails naming the first member that was never read. */
int jobj_done(JObj *j, Err *err);

/* ---- JSON values and files ------------------------------------------------------- */
/* Parses text (the contents of path); on a syntax error returns NULL and fails with PD_EINVAL
 * naming path and the line. The caller deletes the result (cJSON_Delete). */
struct cJSON *pd_json_parse(const char *text, const char *path, Err *err);
/* A number item that reads back bit-exactly (cJSON's printer may drop the last digit): the
 * shortest of %.15g, %.16g, %.17g that round-trips. */
struct cJSON *pd_json_num(double v);   /* the shortest exact decimal; null for NaN or infinity */
/* Sets *out if c is a number without a fractional part and at most 1e9 in magnitude; else
 * returns PD_EINVAL without a message (the caller names the element). */
int pd_json_int(const struct cJSON *c, int *out);
/* Writes root, indented, and a newline to path atomically (pd_write_file_atomic). */
int pd_json_save(const struct cJSON *root, const char *path, Err *err);

#endif
