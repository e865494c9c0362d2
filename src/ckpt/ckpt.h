/* ckpt.h: checkpoint FILES in the safetensors layout: writing them atomically, reading
 * and validating them, finding the newest complete one in a directory. What goes into a
 * checkpoint (which tensors, which counters) is the runtime's business, not this module's.
 *
 * Layout (docs/reference/formats.md, "Weights files and checkpoints"; the safetensors format):
 *   u64 little-endian N | N bytes of JSON header, padded with spaces to a multiple of 8 |
 *   data section: raw little-endian tensors, contiguous, in header order of offsets.
 * Header: {"__metadata__": {"k": "v", ...},
 *          "<name>": {"dtype": "F32", "shape": [d0, ...], "data_offsets": [begin, end]}, ...}
 * Offsets are relative to the start of the data section. The writer adds the metadata
 * "pipedream.format": "1" and "pipedream.crc32": 8 lower-case hex digits, the CRC-32 (zlib)
 * of the whole data section; the reader checks the CRC when the key is present.
 *
 * Tensor names are GLOBAL names chosen by the caller (e.g. "layers.7.weight"), so a
 * checkpoint does not depend on how the model was split into stages. */
#ifndef PD_CKPT_H
#define PD_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

/* The safetensors dtypes (names as spelled in the header). Data is little-endian. */
typedef enum CkptDtype {
    CKPT_BOOL, CKPT_U8, CKPT_I8, CKPT_F8_E5M2, CKPT_F8_E4M3, CKPT_I16, CKPT_U16, CKPT_F16,
    CKPT_BF16, CKPT_I32, CKPT_U32, CKPT_F32, CKPT_F64, CKPT_I64, CKPT_U64,
    CKPT_DTYPE_COUNT
} CkptDtype;

const char *ckpt_dtype_name(CkptDtype dt);   /* "F32"; PD_ASSERTs dt is valid */
size_t      ckpt_dtype_size(CkptDtype dt);   /* bytes per element */
/* Returns the dtype called name, or -1 if there is none. */
int         ckpt_dtype_parse(const char *name);

enum {
    CKPT_MAX_DIMS = 8,                        /* more dimensions are rejected */
    CKPT_MAX_NAME = 1024,                     /* bytes in a tensor name or metadata key/value */
};
#define CKPT_MAX_HEADER ((uint64_t)100000000) /* header bytes, as the reference implementation */
#define CKPT_FORMAT "1"                       /* value of "pipedream.format" */

/* ---- writing --------------------------------------------------------------------- */
typedef struct CkptWriter CkptWriter;

CkptWriter *ckpt_writer_new(void);
void        ckpt_writer_free(CkptWriter *w);   /* NULL is fine */

/* Adds a tensor. name and shape are copied; data is BORROWED and must stay valid and
 * unchanged until ckpt_write returns. Fails with PD_EINVAL (naming the tensor) if the name is
 * empty, longer than CKPT_MAX_NAME, "__metadata__" or already added, if ndim is outside
 * [0, CKPT_MAX_DIMS], a dimension is negative, or the byte size overflows. data may be NULL
 * only when the tensor has no elements. */
int ckpt_writer_add(CkptWriter *w, const char *name, CkptDtype dt, int ndim, const int64_t *shape,
                    const void *data, Err *err);
/* Convenience: a float32 tensor of core's Shape. */
int ckpt_writer_add_f32(CkptWriter *w, const char *name, Shape s, const float *data, Err *err);
/* Adds a metadata entry (both strings copied). Fails with PD_EINVAL if the key is empty,
 * already set, or one of the keys the writer sets itself ("pipedream.crc32",
 * "pipedream.format"), or a string is longer than CKPT_MAX_NAME. */
int ckpt_writer_meta(CkptWriter *w, const char *key, const char *value, Err *err);

/* Writes the checkpoint to path atomically: a temporary file "<path>.tmp.<pid>.<n>" in the same
 * directory, streamed (header, then each tensor straight from its buffer; no copy of the
 * data), fsync, rename over path, fsync of the directory. Tensors are laid out by element
 * size, largest first (then in the order added), so every tensor is aligned to its element
 * size in the file. On failure returns PD_EIO naming the path and the reason; the temporary
 * file is removed and path is untouched (an old file there stays). The writer can be
 * written again (e.g. to a second path). */
int ckpt_write(CkptWriter *w, const char *path, Err *err);

/* ---- reading --------------------------------------------------------------------- */
typedef struct CkptTensor {
    const char *name;                 /* NUL-terminated, owned by the Ckpt */
    CkptDtype dtype;
    int ndim;
    int64_t shape[CKPT_MAX_DIMS];
    size_t numel;                     /* product of shape (1 for ndim 0) */
    size_t nbytes;                    /* numel * dtype size */
    uint64_t begin, end;              /* data_offsets */
    const void *data;                 /* into the Ckpt's data; aligned to the element size */
} CkptTensor;

typedef struct Ckpt Ckpt;

/* Reads and validates the whole file before trusting any size in it: file size >= 8;
 * header length <= file size - 8 and <= CKPT_MAX_HEADER; header a JSON object whose members
 * are "__metadata__" (an object of string values) or tensors with exactly the keys dtype,
 * shape, data_offsets; dtype known; shape of non-negative integers whose product times the
 * element size equals end - begin (no overflow); offsets aligned to the element size,
 * non-overlapping and covering the data section exactly; no duplicate names; the file
 * exactly as long as header and data say (a short file is reported as truncated with the
 * expected and actual sizes); "pipedream.crc32", when present, equal to the CRC-32 of the
 * data section ("checksum mismatch"). Every message names the path.
 * Memory: the data section plus the header plus a small per-tensor record; never more
 * than a size the file claims but does not have.
 * On success *out is a checkpoint the caller owns (ckpt_close). On error returns PD_EIO
 * (cannot open/read) or PD_EINVAL (bad contents), fills err, and sets *out = NULL. */
int ckpt_open(const char *path, Ckpt **out, Err *err);
void ckpt_close(Ckpt *ck);   /* NULL is fine */

/* Like ckpt_open but keeps no data: validates header, sizes and CRC while streaming the
 * data section in chunks (memory: the header plus 1 MiB). Used by ckpt_latest. */
int ckpt_verify(const char *path, Err *err);

const char *ckpt_path(const Ckpt *ck);
int ckpt_count(const Ckpt *ck);
/* Tensors in file order (ascending data offsets); i in [0, ckpt_count). */
const CkptTensor *ckpt_tensor(const Ckpt *ck, int i);
/* The tensor called name, or NULL. O(log n). */
const CkptTensor *ckpt_find(const Ckpt *ck, const char *name);
/* The metadata value of key, or NULL if absent. */
const char *ckpt_meta(const Ckpt *ck, const char *key);
int ckpt_meta_count(const Ckpt *ck);
/* The optimizer whose state a checkpoint holds: its "pipedream.optimizer" metadata, or, for a
 * checkpoint written before that key, what its tensors say: "adam" with second moments
 * ("optim.v.*": Adam or AdamW, the file cannot tell which), "sgd" with first moments alone
 * ("optim.m.*"), NULL with no optimizer state at all. */
const char *ckpt_optimizer(const Ckpt *ck);
/* The i-th metadata entry in file order; i in [0, ckpt_meta_count). */
void ckpt_meta_at(const Ckpt *ck, int i, const char **key, const char **value);

/* Copies tensor name into dst after checking that it exists, has dtype dt and exactly the
 * given shape; otherwise PD_EINVAL naming the file, the tensor, and what differs. dst must
 * hold numel * element size bytes. */
int ckpt_copy(const Ckpt *ck, const char *name, CkptDtype dt, int ndim, const int64_t *shape, void *dst,
              Err *err);
/* Convenience for float32 tensors of core's Shape. */
int ckpt_copy_f32(const Ckpt *ck, const char *name, Shape s, float *dst, Err *err);

/* ---- checkpoint directories ------------------------------------------------------ */
/* Checkpoint files in a directory are named "ckpt-<step>.safetensors", step a decimal of at
 * least 10 digits (zero-padded, so names sort by step). Anything else (temporary files
 * "<name>.tmp.<pid>", other files) is ignored. */
/* Writes "ckpt-%010llu.safetensors" into buf; returns PD_EINVAL if it does not fit. */
int ckpt_name(uint64_t step, char *buf, size_t n, Err *err);
/* Parses a file name (no directory) of the scheme above; returns 1 and sets *step, or 0. */
int ckpt_name_parse(const char *name, uint64_t *step);

/* Finds the newest COMPLETE checkpoint in dir: the largest step whose file passes
 * ckpt_verify. Newer files that fail verification are skipped with a warning (pd_log
 * LOG_WARN naming the file and the reason), so a crash while writing or a damaged newest
 * file falls back to the previous good one. Writes "<dir>/<name>" into out (the step is
 * ckpt_name_parse of its base name). If the directory holds no valid checkpoint, out is set
 * to "" and PD_OK is returned (a fresh run). Fails with PD_EIO if dir cannot be read,
 * PD_EINVAL if the path does not fit into n bytes. */
int ckpt_latest(const char *dir, char *out, size_t n, Err *err);

/* Keeps the newest `keep` (>= 1) checkpoints of a run whose newest is step `newest` (just
 * written and verified: the one a resume needs): deletes the checkpoint files of dir with a
 * step below newest, except the keep - 1 largest of those. Files of a step above newest (another
 * run's, or a damaged one a resume skips) and other files are left alone, so newest is never
 * deleted and never displaced. Returns the number deleted; a file that cannot be deleted is a
 * warning (pd_log), not an error. PD_EIO (in err, returning -1) if dir cannot be read. */
int ckpt_prune(const char *dir, int keep, uint64_t newest, Err *err);

#endif
