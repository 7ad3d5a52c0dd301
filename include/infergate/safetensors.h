#ifndef INFERGATE_SAFETENSORS_H
#define INFERGATE_SAFETENSORS_H

/*
 * The safetensors file format: an 8-byte little-endian header length N, N
 * bytes of JSON ({"name": {"dtype", "shape", "data_offsets": [begin, end]},
 * "__metadata__": {...}}), then the tensor data, offsets relative to its start.
 *
 * The reader memory-maps the file and validates the header only: it never
 * touches the tensor data, so opening a 2.5 GB file costs microseconds. It
 * checks every field, every size multiplication for overflow, and that the
 * tensors tile the data exactly (in offset order, no overlap, no gap, nothing
 * after the last one), so a file it accepts can be read anywhere inside
 * data[0..nbytes) of each tensor. The host must be little-endian.
 *
 * The writer streams: the caller declares every tensor first, then writes
 * their bytes in declaration order, so a multi-gigabyte file never has to be
 * held in memory.
 */

#include "infergate/dtype.h"

#include <stddef.h>
#include <stdint.h>

#define IG_SAFETENSORS_MAX_DIMS 4
/* A header longer than this is refused as absurd (real ones are < 1 MiB). */
#define IG_SAFETENSORS_MAX_HEADER (100u * 1024u * 1024u)

typedef struct {
    const char *name; /* owned by the file handle */
    ig_dtype_t dtype;
    int ndim; /* 0 .. IG_SAFETENSORS_MAX_DIMS */
    int64_t shape[IG_SAFETENSORS_MAX_DIMS];
    uint64_t offset;  /* from the start of the data section */
    size_t nbytes;    /* elements * dtype size */
    const void *data; /* inside the mapping */
} ig_safetensors_entry_t;

typedef struct ig_safetensors_s ig_safetensors_t;

/*
 * Maps and validates the file at path. On failure returns IG_ENOENT (no such
 * file), IG_EIO, IG_ENOMEM or IG_EMODEL (malformed or unsupported content:
 * bad header length or JSON, dtype other than F32/F16/BF16, offsets that
 * lie), and writes "<file name>: <tensor or field>: <what>" into err.
 * The caller owns *out and releases it with ig_safetensors_close().
 */
int ig_safetensors_open(ig_safetensors_t **out, const char *path, char *err, size_t errlen);

/* Unmaps the file; every entry and data pointer becomes invalid. NULL is allowed. */
void ig_safetensors_close(ig_safetensors_t *st);

/* The tensors, sorted by name; the pointer is borrowed. */
size_t ig_safetensors_count(const ig_safetensors_t *st);
const ig_safetensors_entry_t *ig_safetensors_at(const ig_safetensors_t *st, size_t i);

/* The tensor called name, or NULL. */
const ig_safetensors_entry_t *ig_safetensors_find(const ig_safetensors_t *st, const char *name);

/* The path given to open, and its last component (used in messages). */
const char *ig_safetensors_path(const ig_safetensors_t *st);
const char *ig_safetensors_file_name(const ig_safetensors_t *st);

/* Size of the whole file in bytes. */
size_t ig_safetensors_file_size(const ig_safetensors_t *st);

/* ---- writer ----------------------------------------------------------- */

/* One tensor to write; the writer copies name. */
typedef struct {
    const char *name;
    ig_dtype_t dtype;
    int ndim;
    int64_t shape[IG_SAFETENSORS_MAX_DIMS];
} ig_safetensors_spec_t;

typedef struct ig_safetensors_writer_s ig_safetensors_writer_t;

/*
 * Creates (truncates) path and writes the header for the n tensors of specs,
 * laid out back to back in the given order, with {"format": "pt"} metadata.
 * The header is padded with spaces so the data starts at a multiple of 8.
 * Returns 0, IG_EINVAL (bad spec: duplicate or empty name, bad shape), IG_EIO,
 * or IG_ENOMEM, with a message in err.
 */
int ig_safetensors_writer_open(ig_safetensors_writer_t **out, const char *path,
                               const ig_safetensors_spec_t *specs, size_t n, char *err,
                               size_t errlen);

/* Appends nbytes of tensor data; the calls may split tensors anywhere.
 * IG_EINVAL when it would write past the last tensor, IG_EIO on write errors. */
int ig_safetensors_writer_write(ig_safetensors_writer_t *w, const void *data, size_t nbytes,
                                char *err, size_t errlen);

/* Flushes and closes the file and frees w. Fails with IG_EINVAL when fewer
 * bytes were written than declared (and IG_EIO on write errors); on any
 * failure, including an earlier one, it removes the partial file. */
int ig_safetensors_writer_close(ig_safetensors_writer_t *w, char *err, size_t errlen);

/* Abandons a file being written: closes and removes it, frees w. NULL is allowed. */
void ig_safetensors_writer_abort(ig_safetensors_writer_t *w);

#endif
