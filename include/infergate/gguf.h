#ifndef INFERGATE_GGUF_H
#define INFERGATE_GGUF_H

/*
 * The GGUF file format (ggml's, versions 2 and 3), little-endian:
 *   "GGUF", u32 version, u64 tensor count, u64 metadata count,
 *   metadata: { string key, u32 type, value } (a string is u64 length + bytes,
 *   an array u32 element type + u64 count + elements),
 *   tensor infos: { string name, u32 ndim, u64 ne[ndim], u32 ggml type, u64 offset },
 *   padding to general.alignment (32 by default), then the tensor data, each
 *   tensor at its offset from there.
 * ne[0] is the innermost dimension: a matrix of ne = [in, out] is the
 * row-major (out, in) of nn.Linear. Tensor types read: F32, F16, BF16, Q8_0, Q4_0, Q4_K,
 * Q6_K.
 *
 * The reader maps the file and validates all of the header (every length
 * against the file's size, every multiplication for overflow, offsets
 * aligned and inside the data section); it touches no tensor data.
 */

#include "infergate/dtype.h"

#include <stddef.h>
#include <stdint.h>

/* Metadata value types, as numbered in the file. */
typedef enum {
    IG_GGUF_U8 = 0,
    IG_GGUF_I8 = 1,
    IG_GGUF_U16 = 2,
    IG_GGUF_I16 = 3,
    IG_GGUF_U32 = 4,
    IG_GGUF_I32 = 5,
    IG_GGUF_F32 = 6,
    IG_GGUF_BOOL = 7,
    IG_GGUF_STRING = 8,
    IG_GGUF_ARRAY = 9,
    IG_GGUF_U64 = 10,
    IG_GGUF_I64 = 11,
    IG_GGUF_F64 = 12,
} ig_gguf_type_t;

/* ggml tensor type numbers of the types read and written. */
#define IG_GGML_F32 0
#define IG_GGML_F16 1
#define IG_GGML_Q4_0 2
#define IG_GGML_Q8_0 8
#define IG_GGML_Q4_K 12
#define IG_GGML_Q6_K 14
#define IG_GGML_BF16 30

#define IG_GGUF_MAX_DIMS 4

typedef struct {
    const char *key;            /* NUL-terminated copy, owned by the file handle */
    ig_gguf_type_t type;        /* of the value; for an array, IG_GGUF_ARRAY */
    ig_gguf_type_t elem;        /* arrays: the element type */
    uint64_t n;                 /* arrays: the element count */
    const unsigned char *value; /* inside the mapping: the value (arrays: the first element) */
} ig_gguf_kv_t;

typedef struct {
    const char *name; /* owned by the file handle */
    ig_dtype_t dtype;
    int ndim;
    int64_t ne[IG_GGUF_MAX_DIMS]; /* ne[0] innermost */
    uint64_t offset;              /* from the start of the data section */
    size_t nbytes;
    const void *data; /* inside the mapping */
} ig_gguf_tensor_t;

typedef struct ig_gguf_s ig_gguf_t;

/* Maps and validates path. IG_ENOENT (no such file), IG_EIO, IG_ENOMEM or
 * IG_EMODEL (malformed or unsupported: "<file>: <key or tensor>: <what>"). */
int ig_gguf_open(ig_gguf_t **out, const char *path, char *err, size_t errlen);
void ig_gguf_close(ig_gguf_t *g);

/* Whether the file at path starts with the GGUF magic. */
int ig_gguf_is_gguf(const char *path);

const char *ig_gguf_file_name(const ig_gguf_t *g);
size_t ig_gguf_file_size(const ig_gguf_t *g);
size_t ig_gguf_kv_count(const ig_gguf_t *g);
const ig_gguf_kv_t *ig_gguf_kv_at(const ig_gguf_t *g, size_t i);
const ig_gguf_kv_t *ig_gguf_find(const ig_gguf_t *g, const char *key);
size_t ig_gguf_tensor_count(const ig_gguf_t *g);
const ig_gguf_tensor_t *ig_gguf_tensor_at(const ig_gguf_t *g, size_t i);
const ig_gguf_tensor_t *ig_gguf_find_tensor(const ig_gguf_t *g, const char *name);

/*
 * Typed getters: 0 and *out set; IG_ENOENT when the key is absent (no
 * message: the caller knows whether it was required); IG_EMODEL when it has
 * another type or is out of range, with "<file>: <key>: ..." in err. Integers
 * accept any integer type whose value fits.
 */
int ig_gguf_get_int(const ig_gguf_t *g, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    char *err, size_t errlen);
int ig_gguf_get_float(const ig_gguf_t *g, const char *key, double *out, char *err, size_t errlen);
int ig_gguf_get_bool(const ig_gguf_t *g, const char *key, int *out, char *err, size_t errlen);
/* A string value: pointer into the mapping (not NUL-terminated) and length. */
int ig_gguf_get_str(const ig_gguf_t *g, const char *key, const char **s, size_t *len, char *err,
                    size_t errlen);
/* An array of `elem` (IG_GGUF_STRING arrays: use ig_gguf_str_at). */
int ig_gguf_get_array(const ig_gguf_t *g, const char *key, ig_gguf_type_t elem,
                      const ig_gguf_kv_t **kv, char *err, size_t errlen);
/* Element i of a string array (validated at open, indexed on first use). */
int ig_gguf_str_at(const ig_gguf_t *g, const ig_gguf_kv_t *kv, uint64_t i, const char **s,
                   size_t *len);
/* Element i of a numeric array as a double / int64. */
double ig_gguf_num_at(const ig_gguf_kv_t *kv, uint64_t i);

/* ---- writer ------------------------------------------------------------- */

typedef struct ig_gguf_writer_s ig_gguf_writer_t;

int ig_gguf_writer_init(ig_gguf_writer_t **out);
/* Metadata, in the order they are added; the writer copies everything. */
int ig_gguf_put_u32(ig_gguf_writer_t *w, const char *key, uint32_t v);
int ig_gguf_put_i32(ig_gguf_writer_t *w, const char *key, int32_t v);
int ig_gguf_put_f32(ig_gguf_writer_t *w, const char *key, float v);
int ig_gguf_put_bool(ig_gguf_writer_t *w, const char *key, int v);
int ig_gguf_put_str(ig_gguf_writer_t *w, const char *key, const char *s, size_t len);
/* An array of n strings / f32 / i32. */
int ig_gguf_put_str_array(ig_gguf_writer_t *w, const char *key, const char *const *s,
                          const size_t *lens, uint64_t n);
int ig_gguf_put_f32_array(ig_gguf_writer_t *w, const char *key, const float *v, uint64_t n);
int ig_gguf_put_i32_array(ig_gguf_writer_t *w, const char *key, const int32_t *v, uint64_t n);
/* Declares a tensor of dtype with ne (ne[0] innermost); data written later
 * in declaration order. */
int ig_gguf_add_tensor(ig_gguf_writer_t *w, const char *name, ig_dtype_t dtype, int ndim,
                       const int64_t *ne);
/* Writes the header to path (created, truncated) and leaves the file open
 * for the tensors' bytes. IG_EIO with a message. */
int ig_gguf_writer_begin(ig_gguf_writer_t *w, const char *path, char *err, size_t errlen);
/* Appends the bytes of the tensors in order (padded between them). */
int ig_gguf_writer_write(ig_gguf_writer_t *w, const void *data, size_t n, char *err, size_t errlen);
/* Closes the file (IG_EINVAL when bytes are missing; the file removed on any
 * failure) and frees w. */
int ig_gguf_writer_close(ig_gguf_writer_t *w, char *err, size_t errlen);
void ig_gguf_writer_abort(ig_gguf_writer_t *w);

#endif
