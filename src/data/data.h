/* data.h: training data in memory, and the order in which it is consumed.
 *
 * A Dataset holds n samples of shape (C, H, W) as float32 in [0, 1] (the raw byte divided
 * by 255, exactly like torchvision's ToTensor; NO mean/std normalisation) and int32
 * labels in [0, n_classes). Readers: MNIST / Fashion-MNIST IDX files (gzip or raw),
 * CIFAR-10 binary batches, and deterministic synthetic data.
 *
 * Order contract (everything is a pure function of (seed, epoch, index), never of which
 * worker asks or in what order):
 *   - the sample order of epoch e is rng_permutation(seed, RNG_STREAM_SHUFFLE, e) over
 *     0..n-1 (or the identity when shuffling is off);
 *   - minibatch b of an epoch is the samples order[b*B .. b*B+B); the last, partial batch
 *     (n % B samples) is kept unless drop_last is set;
 *   - global minibatch g (counting from 0 across epochs) is batch g % nb of epoch g / nb,
 *     nb = data_batches_per_epoch(n, B, drop_last);
 *   - a replicated stage with `size` replicas (1F1B round-robin or data parallel over
 *     whole minibatches) gives global minibatches r, r+size, r+2*size, ... to replica r.
 *
 * Augmentation (random crop with padding, horizontal flip) is applied by data_sampler_get
 * only, as a pure function of (seed, global minibatch, position): evaluation never sees it.
 * Not here: prefetching threads. */
#ifndef PD_DATA_H
#define PD_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

#define DATA_DEFAULT_IDX_DIR "/usr/share/datasets/fashion-mnist"
#define DATA_MAX_SAMPLES 10000000u   /* a larger count in a header is rejected */

/* Augmentation of image training samples (data_augment.c); zero = none. */
typedef struct DataAugment {
    int pad;     /* random crop: the sample padded by `pad` black pixels on every side, then a window
                  * of its own size at an offset uniform in [0, 2 pad] x [0, 2 pad] */
    int flip;    /* mirrored left-right with probability 1/2 */
} DataAugment;

typedef struct Dataset {
    size_t n;            /* samples */
    int c, h, w;         /* sample shape (C, H, W) */
    int n_classes;
    float *x;            /* (n, c, h, w) in [0, 1], owned (pd_alloc); NULL where pix holds the samples */
    /* Images read from bytes (IDX): the bytes themselves and each byte's
     * value (b / 255 as read, data_normalize's afterwards). A sample's element is
     * lut[pix[i]], the same float the array x would hold, at a quarter of the memory; only
     * data_batch, data_value, data_stats and data_normalize read it. */
    uint8_t *pix;        /* owned (freed by data_release), or NULL */
    float lut[256];
    int32_t *y;          /* (n, y_len), each in [0, n_classes), owned (pd_alloc) */
    int y_len;           /* targets per sample: 0 or 1 = one class label; T = a sequence's
                          * next-token targets (data_text_dataset) */
    float black;         /* the value of a black pixel (0, then as data_normalize maps it): the padding
                          * of a random crop */
    DataAugment aug;     /* what data_sampler_get does to each sample (zero: nothing) */
} Dataset;

/* Targets per sample (y_len, at least 1). */
static inline int data_targets(const Dataset *d) { return d->y_len > 1 ? d->y_len : 1; }

/* Number of floats in one sample: c*h*w. */
size_t data_sample_numel(const Dataset *d);
/* Element i of the samples (sample i / numel), whichever storage holds them. */
static inline float data_value(const Dataset *d, size_t i) { return d->pix ? d->lut[d->pix[i]] : d->x[i]; }
/* Frees x (or pix) and y and zeroes *d. A zeroed or NULL d is fine. */
void data_release(Dataset *d);

/* Reads MNIST-format IDX files from dir (NULL = DATA_DEFAULT_IDX_DIR): split "train" reads
 * train-images-idx3-ubyte[.gz] and train-labels-idx1-ubyte[.gz], "test" the t10k-* pair.
 * The .gz name is tried first, then the uncompressed name. Result: (n, 1, rows, cols),
 * n_classes 10. Validates magic numbers (0x00000803 images, 0x00000801 labels),
 * dimensions, equal counts, labels < 10, truncated or trailing data; memory grows only as
 * data actually arrives, so a lying header cannot cause a huge allocation.
 * Returns PD_OK, or PD_EIO (file missing/unreadable) / PD_EINVAL (bad contents) with a
 * message naming the file and expected vs found; *out is then zeroed. Caller owns *out
 * (data_release). */
int data_load_idx(const char *dir, const char *split, Dataset *out, Err *err);

/* Reads CIFAR-10 binary batches from dir: "train" = data_batch_1.bin .. data_batch_5.bin,
 * "test" = test_batch.bin; each file is records of 1 label byte + 3072 image bytes
 * (3 x 32 x 32, channel-major: already (C, H, W)). Result: (n, 3, 32, 32), n_classes 10.
 * Fails (PD_EIO / PD_EINVAL, naming file and record) on a missing file, a size that is
 * not a non-zero multiple of 3073, or a label > 9; *out is then zeroed. */
int data_load_cifar10(const char *dir, const char *split, Dataset *out, Err *err);

/* Reads an image folder split in torchvision's ImageFolder layout (data_folder.c):
 * dir/<split>/<class>/<name>.png|.jpg|.jpeg (extension in any case). The classes are the
 * subfolders of dir/train sorted by name (byte order); class k is label k, and dir/test must
 * have the same class folders. Files whose names start with '.' are ignored. Each image is
 * decoded (libpng, libjpeg-turbo) to RGB, converted to c channels (c = 1: luma
 * (299 R + 587 G + 114 B) / 1000 rounded; a grey image gives its own values), and brought to
 * (h, w): scaled with bilinear interpolation so that it covers (h, w) with its aspect ratio
 * kept, then cropped at the centre (an image of size (h, w) is copied as it is). Samples are in
 * class order, then name order; stored as bytes with lut b / 255, as data_load_idx.
 * The decoded bytes are cached in dir/.pipedream-cache-<split>-<c>x<h>x<w>.bin, keyed by every
 * file's path, size and modification time and by the shape; a valid cache is read instead of
 * decoding, a stale or damaged one is rebuilt (written to a temporary file and renamed, so an
 * interrupted write never leaves a partial cache). A directory that cannot be written is only
 * not cached. *cached (if non-NULL) is set to 1 when the cache was read.
 * Fails with PD_EIO / PD_EINVAL naming the file or folder: a missing split folder, a class
 * folder with no image, a file without an image extension, an image that does not decode, a
 * test class that training lacks. Caller owns *out (data_release). */
int data_load_folder(const char *dir, const char *split, int c, int h, int w, Dataset *out, int *cached,
                     Err *err);

/* Decodes one PNG or JPEG file (chosen by its extension) into out (c, h, w) bytes, as
 * data_load_folder does to each image (data_image.c). c is 1 or 3. PD_EINVAL naming path for
 * a file that does not decode, PD_EIO when it cannot be read. */
int data_image_read(const char *path, int c, int h, int w, uint8_t *out, Err *err);

/* What kind of image set dir holds (NULL: the default IDX directory): "folder" (a train/ or
 * test/ subfolder), "cifar10" (data_batch_1.bin or test_batch.bin) or "idx". */
const char *data_dir_kind(const char *dir);

/* Deterministic synthetic classification data: n samples (c, h, w), labels in
 * [0, n_classes). Each class has a prototype image p_k (uniform in [0,1]); sample i has
 * label y_i uniform and x_i = 0.5 * p_{y_i} + 0.5 * u with u uniform noise, so the data
 * is learnable. Sample i depends only on (seed, i, shape, n_classes), not on n (the first
 * m samples of a larger set equal a set of m). Uses RNG_STREAM_SYNTH.
 * Fails with PD_EINVAL if a size is out of range (n in [1, DATA_MAX_SAMPLES], c,h,w >= 1,
 * n_classes >= 1, c*h*w <= 2^24). Caller owns *out. */
int data_synthetic(size_t n, int c, int h, int w, int n_classes, uint64_t seed, Dataset *out, Err *err);

/* Loads by kind: "fashion-mnist" | "mnist" | "idx" (data_load_idx) or "cifar10"
 * (data_load_cifar10); dir NULL = that reader's default (cifar10 has none: an error). */
int data_load(const char *kind, const char *dir, const char *split, Dataset *out, Err *err);

/* Applies d->aug to count samples x (count, c, h, w) of global minibatch g, in place: sample i
 * draws from the stream (seed, RNG_STREAM_AUGMENT, g) after samples 0..i-1, first the crop's
 * x then y offset (pad > 0), then the flip (flip set). A pure function of (seed, g, i, x). */
void data_augment_batch(const Dataset *d, uint64_t seed, uint64_t g, float *x, int count);
/* Parses an augmentation flag's value: "crop=P" (P in 1..64), "flip", or both joined by ','
 * (or "none"). PD_EINVAL naming the bad part. */
int  data_augment_parse(const char *spec, DataAugment *out, Err *err);

/* Keeps the first n samples (n <= d->n); for quick runs. */
void data_truncate(Dataset *d, size_t n);

/* ---- order ----------------------------------------------------------------------- */

/* Standardises every value in place: x = (x - mean) * (1 / std) (torchvision's Normalize for
 * one channel), and d->black with them. Training uses the training split's own statistics
 * (data_stats). */
void data_normalize(Dataset *d, float mean, float std);

/* Minibatches per epoch: ceil(n / batch), or floor(n / batch) with drop_last. batch >= 1. */
size_t data_batches_per_epoch(size_t n, int batch, int drop_last);

/* Writes the sample order of epoch `epoch` into order[0..n): the permutation
 * rng_permutation(seed, RNG_STREAM_SHUFFLE, epoch), or 0..n-1 if !shuffle. */
void data_epoch_order(size_t n, uint64_t seed, uint64_t epoch, int shuffle, uint32_t *order);

/* Copies samples order[first .. first+count) into caller buffers (no allocation):
 * x (count, c, h, w), y (count, data_targets(d)) (y may be NULL). order NULL = identity. Asserts
 * first + count <= n and every index < n. */
void data_batch(const Dataset *d, const uint32_t *order, size_t first, int count, float *x, int32_t *y);

/* Where global minibatch g lies: epoch, batch within the epoch, first position in the
 * epoch's order, and its sample count (B, or n % B for a kept last batch). */
typedef struct DataBatchPos {
    uint64_t epoch;
    size_t batch;
    size_t first;
    int count;
} DataBatchPos;
DataBatchPos data_batch_pos(size_t n, int batch, int drop_last, uint64_t g);

/* Sharding over `size` replicas (rank in [0, size)): replica `rank` takes global minibatches
 * rank, rank+size, ... of 0..n_batches-1. Writes them to out (if non-NULL; room for
 * data_shard_count) and returns how many. Over all ranks every minibatch appears exactly
 * once. */
size_t data_shard_count(uint64_t n_batches, int rank, int size);
size_t data_shard_minibatches(uint64_t n_batches, int rank, int size, uint64_t *out);
/* Splits count samples of one minibatch into `size` contiguous slices (sizes differ by at
 * most one, larger first): slice `rank` is [*first, *first + *len). For data-parallel
 * replicas that share one minibatch. */
void data_shard_range(int count, int rank, int size, int *first, int *len);

/* A cursor that fetches global minibatch g, caching the current epoch's order. The result
 * depends only on (dataset, seed, batch, shuffle, drop_last, g). Not thread-safe: one per
 * thread. */
typedef struct DataSampler {
    const Dataset *d;    /* borrowed */
    uint64_t seed;
    int batch;
    int shuffle;
    int drop_last;
    size_t n_batches;    /* per epoch */
    uint64_t epoch;      /* of order; UINT64_MAX = none yet */
    uint32_t *order;     /* (n), owned */
} DataSampler;

/* Fails with PD_EINVAL if batch < 1, or if drop_last leaves no batch (batch > n). */
int  data_sampler_init(DataSampler *s, const Dataset *d, int batch, uint64_t seed, int shuffle, int drop_last,
                       Err *err);
void data_sampler_release(DataSampler *s);
/* Copies global minibatch g into x (batch, c, h, w) and y (batch), augmented as d->aug says
 * (data_augment_batch with the sampler's seed); returns its sample count (< batch only for a
 * kept last partial batch). */
int  data_sampler_get(DataSampler *s, uint64_t g, float *x, int32_t *y);

/* ==== text: byte-level language-model data (data_text.c) ===================================
 * A plain-text file read as bytes; every byte is a token in [0, 256). The last
 * `test_fraction` of the bytes (at least one sequence) is the held-out tail for evaluation,
 * the rest the training text. A split of B bytes holds floor((B - 1) / T) sequences of context
 * length T: sequence i is the inputs bytes[i*T .. i*T + T) and the targets shifted by one,
 * bytes[i*T + 1 .. i*T + T + 1) (consecutive sequences share one byte). Inputs are written as
 * floats (the model's input buffer: token ids for an "embed" layer), targets as int32 (T per
 * sample: the loss is over every position, in nats per byte).
 * Order: exactly the Dataset contract above (epoch permutations of the training sequences,
 * global minibatch g, partial last batch kept), so the runtime can shard it the same way. */
#define DATA_TEXT_TEST_FRACTION 0.05   /* the CLI's held-out tail */
#define DATA_TEXT_MAX_BYTES (1u << 30)

typedef struct TextData {
    uint8_t *bytes;        /* the whole text, owned */
    size_t n_bytes;
    size_t split;          /* [0, split) training text, [split, n_bytes) held-out tail */
    int ctx;               /* T: tokens per sequence */
    size_t n_train, n_test;   /* sequences in each part */
} TextData;

/* Reads path (at most DATA_TEXT_MAX_BYTES) and splits it. Fails with PD_EIO naming the file,
 * or PD_EINVAL if ctx < 1, test_fraction is outside (0, 1), or either part has no sequence.
 * Caller owns *out (data_text_release). */
int  data_text_load(const char *path, int ctx, double test_fraction, TextData *out, Err *err);
/* The same from bytes in memory (copied); name is used in messages. */
int  data_text_from_bytes(const void *bytes, size_t n, const char *name, int ctx, double test_fraction,
                          TextData *out, Err *err);
void data_text_release(TextData *d);   /* zeroed or NULL is fine */
/* Copies sequences order[first .. first + count) of the training part (test = 0) or of the
 * tail (test = 1) into x (count, T) floats and y (count, T) int32 (y may be NULL). order
 * NULL = identity. */
void data_text_batch(const TextData *d, int test, const uint32_t *order, size_t first, int count, float *x,
                     int32_t *y);

/* A cursor over the training sequences, as DataSampler (shuffled, last batch kept). */
typedef struct TextSampler {
    const TextData *d;     /* borrowed */
    uint64_t seed;
    int batch;
    size_t n_batches;      /* per epoch */
    uint64_t epoch;        /* of order; UINT64_MAX = none yet */
    uint32_t *order;       /* (n_train), owned */
} TextSampler;
int  data_text_sampler_init(TextSampler *s, const TextData *d, int batch, uint64_t seed, Err *err);
void data_text_sampler_release(TextSampler *s);
/* Global minibatch g into x (batch, T), y (batch, T); returns its sequence count. */
int  data_text_sampler_get(TextSampler *s, uint64_t g, float *x, int32_t *y);
/* The training part (test = 0) or the held-out tail (test = 1) as a Dataset (data_text_set.c):
 * sample i = sequence i, x (1, 1, T) token ids as floats, y (T) targets (y_len = T),
 * n_classes 256. Caller owns *out (data_release). */
int  data_text_dataset(const TextData *t, int test, Dataset *out, Err *err);
/* ==== end of text ============================================================================ */

/* ==== token shards (data_tokens.c) ===========================================================
 * llm.c's format: a header of 256 little-endian int32 (magic DATA_TOKENS_MAGIC, version 1, the
 * token count N), then N little-endian uint16 tokens. A shard directory holds a training split,
 * the files whose names contain "train" and end in ".bin", and a validation split, those whose
 * names contain "val" and end in ".bin" (each split's files concatenated in name order). A split of N tokens holds
 * floor((N - 1) / T) sequences of context T laid out as the text's (data_text_dataset): x (1, 1, T)
 * token ids, y (T) the next tokens. DIR/tokenizer.json (tools/bpe.py), when present, gives each
 * token's length in bytes ("token_bytes"), so that a loss per token becomes one per byte. */
#define DATA_TOKENS_MAGIC 20240520
#define DATA_TOKENS_MAX (1u << 31)   /* tokens per split */

/* Reads split "train" or "val" of dir as a Dataset (n_classes = the largest token + 1).
 * Fails naming the file: no shard of that split, a bad magic, version or count, a size that is
 * not the header's, or a split too short for one sequence of ctx tokens. Caller owns *out. */
int data_tokens_dataset(const char *dir, const char *split, int ctx, Dataset *out, Err *err);
/* The mean length in bytes of the validation split's targets (those of its sequences, as laid
 * out for ctx), from dir/tokenizer.json: *bytes_per_token = 0 when there is no tokenizer.json.
 * A test loss in nats per token divided by it is in nats per byte. */
int data_tokens_bytes_per_token(const char *dir, int ctx, double *bytes_per_token, Err *err);
/* ==== end of token shards ===================================================================== */

/* ==== a model's data (data_fit.c) ===========================================================
 * What `pipedream train`, `pipedream eval` and a training session read, in one place: an IDX
 * image directory (Fashion-MNIST by default) or a plain-text file (byte-level language
 * modelling, the last DATA_TEXT_TEST_FRACTION held out), checked against the model that reads
 * it, and for images the training split's mean and std to standardise with. */
typedef struct DataFit {
    const char *model;     /* the model's name, for messages */
    Shape input;           /* one sample of the model's input: (C, H, W), or (T) token ids */
    Shape output;          /* one sample of its output: logits (K), or (T, K) per position */
} DataFit;

typedef struct DataSplits {
    int text;              /* byte-level text (data_text_dataset's layout) */
    Dataset train, test;   /* train empty unless asked for */
    double mean, std;      /* images: the training split's statistics (data_stats) when it was read,
                            * after data_splits_standardise the ones applied; NAN otherwise */
} DataSplits;

/* The mean and the population standard deviation of every value of d, each rounded to 4
 * decimals, as the published constants are: Fashion-MNIST's training split gives exactly
 * 0.2860 and 0.3530 (the values PyTorch recipes use), MNIST's 0.1307 and 0.3081. */
void data_stats(const Dataset *d, double *mean, double *std);
/* Checks that fit's model reads the data: text: input (T) and output (T, >= 256), or with d
 * (token shards) (T, >= d->n_classes); images (d):
 * input equal to a sample's (C, H, W), output (K) with K >= the data's classes. PD_EINVAL with
 * "<model>: input ... does not match the data's samples ..." or "<model>: output ... for N
 * classes" otherwise. */
int  data_fit_check(const DataFit *fit, int text, const Dataset *d, Err *err);
/* Reads the data for fit's model: text != NULL: that file, or when text is a directory its
 * token shards (train and val splits); else the image set in dir (NULL = DATA_DEFAULT_IDX_DIR):
 * IDX files, CIFAR-10 batches or an image folder, as data_dir_kind tells, an image folder
 * decoded to the model's input (data_load_folder). The training split of images gets the
 * augmentation set by data_splits_set_augment. The training split only when want_train (its statistics then in
 * out->mean, out->std); the test split always. Checks the model against the data
 * (data_fit_check) before returning. Images are NOT standardised yet (a session agrees on the
 * statistics first): data_splits_standardise. Caller releases *out (data_splits_release). */
int  data_splits_open(const char *dir, const char *text, const DataFit *fit, int want_train, DataSplits *out,
                      Err *err);
/* Standardises both splits of an image set with (mean, std) and records them (text: nothing
 * to do). PD_EINVAL if std is not positive. */
int  data_splits_standardise(DataSplits *d, double mean, double std, Err *err);
void data_splits_release(DataSplits *d);   /* zeroed is fine */
/* The augmentation data_splits_open gives every image training split from now on, in this
 * process (the CLI's --augment; none by default). Set it before any reader starts. */
void data_splits_set_augment(const DataAugment *a);

#endif
