/*
 * safetensors reader (mmap + header validation) and streaming writer.
 * See include/infergate/safetensors.h for the format and the guarantees.
 */
#include "infergate/safetensors.h"
#include "infergate/error.h"
#include "model_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct ig_safetensors_s {
    char *path;
    const char *file_name; /* inside path */
    unsigned char *map;
    size_t size;
    ig_safetensors_entry_t *entries; /* sorted by name */
    size_t n;
};

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static int cmp_entry_name(const void *a, const void *b)
{
    const ig_safetensors_entry_t *x = a, *y = b;
    return strcmp(x->name, y->name);
}

static int cmp_entry_offset(const void *a, const void *b)
{
    const ig_safetensors_entry_t *x = *(const ig_safetensors_entry_t *const *)a;
    const ig_safetensors_entry_t *y = *(const ig_safetensors_entry_t *const *)b;
    uint64_t xe = x->offset + x->nbytes, ye = y->offset + y->nbytes;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (xe != ye)
        return xe < ye ? -1 : 1;
    return strcmp(x->name, y->name);
}

const char *ig__shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t used = 0;
    used += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used +=
            (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < len)
        snprintf(buf + used, len - used, "]");
    return buf;
}

/* Reads a JSON integer that must be >= 0; 0 or -1. */
static int get_uint(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* Validates one header entry into e (name set by the caller). */
static int parse_entry(ig_safetensors_entry_t *e, const json_t *v, const char *file,
                       uint64_t data_size, char *err, size_t errlen)
{
    char sbuf[128];
    if (!json_is_object(v)) {
        ig_errf(err, errlen, "%s: %s: header entry is not a JSON object", file, e->name);
        return IG_EMODEL;
    }
    const json_t *dt = json_object_get(v, "dtype");
    const json_t *shape = json_object_get(v, "shape");
    const json_t *offs = json_object_get(v, "data_offsets");
    if (!json_is_string(dt)) {
        ig_errf(err, errlen, "%s: %s: dtype: missing or not a string", file, e->name);
        return IG_EMODEL;
    }
    if (ig_dtype_parse(json_string_value(dt), &e->dtype) != 0) {
        ig_errf(err, errlen, "%s: %s: unsupported dtype %.16s (supported: F32, F16, BF16)", file,
                e->name, json_string_value(dt));
        return IG_EMODEL;
    }
    if (!json_is_array(shape)) {
        ig_errf(err, errlen, "%s: %s: shape: missing or not an array", file, e->name);
        return IG_EMODEL;
    }
    if (json_array_size(shape) > IG_SAFETENSORS_MAX_DIMS) {
        ig_errf(err, errlen, "%s: %s: shape has %zu dimensions, at most %d are supported", file,
                e->name, json_array_size(shape), IG_SAFETENSORS_MAX_DIMS);
        return IG_EMODEL;
    }
    e->ndim = (int)json_array_size(shape);
    /* Elements times element size must fit the data section, which itself
     * fits in memory: checking against data_size before each multiplication
     * keeps every product below 2^64. */
    uint64_t nelem = 1, esize = ig_dtype_size(e->dtype);
    int too_big = 0;
    for (int i = 0; i < e->ndim; i++) {
        uint64_t d;
        if (get_uint(json_array_get(shape, (size_t)i), &d) != 0 || d > (uint64_t)INT64_MAX) {
            ig_errf(err, errlen, "%s: %s: shape[%d] is not a non-negative integer", file, e->name,
                    i);
            return IG_EMODEL;
        }
        e->shape[i] = (int64_t)d;
        if (d != 0 && nelem > UINT64_MAX / d)
            too_big = 1;
        else
            nelem *= d;
    }
    if (!too_big && nelem > UINT64_MAX / esize)
        too_big = 1;
    uint64_t nbytes = too_big ? 0 : nelem * esize;
    if (!json_is_array(offs) || json_array_size(offs) != 2) {
        ig_errf(err, errlen, "%s: %s: data_offsets: missing or not a [begin, end] pair", file,
                e->name);
        return IG_EMODEL;
    }
    uint64_t begin, end;
    if (get_uint(json_array_get(offs, 0), &begin) != 0 ||
        get_uint(json_array_get(offs, 1), &end) != 0 || end < begin) {
        ig_errf(err, errlen, "%s: %s: data_offsets: not two integers 0 <= begin <= end", file,
                e->name);
        return IG_EMODEL;
    }
    if (end > data_size) {
        ig_errf(err, errlen,
                "%s: %s: data_offsets [%llu, %llu] end beyond the %llu bytes of data (file "
                "truncated?)",
                file, e->name, (unsigned long long)begin, (unsigned long long)end,
                (unsigned long long)data_size);
        return IG_EMODEL;
    }
    if (too_big || end - begin != nbytes) {
        ig_errf(err, errlen, "%s: %s: data_offsets [%llu, %llu] hold %llu bytes, %s %s needs %s",
                file, e->name, (unsigned long long)begin, (unsigned long long)end,
                (unsigned long long)(end - begin), ig_dtype_name(e->dtype),
                ig__shape_str(sbuf, sizeof(sbuf), e->ndim, e->shape),
                too_big ? "more than 2^64" : "a different size");
        return IG_EMODEL;
    }
    e->offset = begin;
    e->nbytes = (size_t)nbytes;
    return 0;
}

/* Checks that the entries tile [0, data_size) exactly. */
static int check_tiling(ig_safetensors_entry_t *entries, size_t n, const char *file,
                        uint64_t data_size, char *err, size_t errlen)
{
    int rc = 0;
    ig_safetensors_entry_t **order = NULL;
    if (n > 0 && (order = malloc(n * sizeof(*order))) == NULL) {
        ig_errf(err, errlen, "%s: out of memory", file);
        return IG_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        order[i] = &entries[i];
    if (n > 0)
        qsort(order, n, sizeof(*order), cmp_entry_offset);
    uint64_t expect = 0;
    const char *prev = NULL;
    for (size_t i = 0; i < n; i++) {
        const ig_safetensors_entry_t *e = order[i];
        if (e->offset < expect) {
            ig_errf(err, errlen, "%s: %s: data_offsets [%llu, %llu] overlap tensor %s", file,
                    e->name, (unsigned long long)e->offset,
                    (unsigned long long)(e->offset + e->nbytes), prev);
            rc = IG_EMODEL;
            goto fail;
        }
        if (e->offset > expect) {
            ig_errf(err, errlen,
                    "%s: %s: data_offsets begin at %llu, leaving %llu unused bytes %s%s", file,
                    e->name, (unsigned long long)e->offset,
                    (unsigned long long)(e->offset - expect),
                    prev ? "after tensor " : "at the start", prev ? prev : "");
            rc = IG_EMODEL;
            goto fail;
        }
        expect = e->offset + e->nbytes;
        prev = e->name;
    }
    if (expect != data_size) {
        if (prev)
            ig_errf(err, errlen, "%s: %s: %llu unused bytes after this last tensor", file, prev,
                    (unsigned long long)(data_size - expect));
        else
            ig_errf(err, errlen, "%s: header: %llu bytes of data but no tensors", file,
                    (unsigned long long)data_size);
        rc = IG_EMODEL;
        goto fail;
    }
fail:
    free(order);
    return rc;
}

int ig_safetensors_open(ig_safetensors_t **out, const char *path, char *err, size_t errlen)
{
    int rc = 0, fd = -1;
    json_t *root = NULL;
    ig_safetensors_t *st = NULL;
    const char *file = base_name(path);
    *out = NULL;

    st = calloc(1, sizeof(*st));
    if (st == NULL || (st->path = strdup(path)) == NULL) {
        rc = IG_ENOMEM;
        ig_errf(err, errlen, "%s: out of memory", file);
        goto fail;
    }
    st->file_name = base_name(st->path);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = errno == ENOENT ? IG_ENOENT : IG_EIO;
        ig_errf(err, errlen, "%s: cannot open: %s", file, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        rc = IG_EMODEL;
        ig_errf(err, errlen, "%s: not a regular file", file);
        goto fail;
    }
    st->size = (size_t)sb.st_size;
    if (st->size < 8) {
        rc = IG_EMODEL;
        ig_errf(err, errlen,
                "%s: header: file is %zu bytes, too short for the header length (file "
                "truncated?)",
                file, st->size);
        goto fail;
    }
    st->map = mmap(NULL, st->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (st->map == MAP_FAILED) {
        st->map = NULL;
        rc = IG_EIO;
        ig_errf(err, errlen, "%s: mmap: %s", file, strerror(errno));
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | st->map[i];
    if (hlen > IG_SAFETENSORS_MAX_HEADER) {
        rc = IG_EMODEL;
        ig_errf(err, errlen, "%s: header: length %llu is absurd (the limit is %u bytes)", file,
                (unsigned long long)hlen, IG_SAFETENSORS_MAX_HEADER);
        goto fail;
    }
    if (hlen > st->size - 8) {
        rc = IG_EMODEL;
        ig_errf(err, errlen,
                "%s: header: length %llu exceeds the %zu bytes after it (file truncated?)", file,
                (unsigned long long)hlen, st->size - 8);
        goto fail;
    }
    uint64_t data_size = st->size - 8 - hlen;
    json_error_t jerr;
    root = json_loadb((const char *)st->map + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        rc = IG_EMODEL;
        ig_errf(err, errlen, "%s: header: bad JSON at byte %d: %s", file, jerr.position, jerr.text);
        goto fail;
    }
    if (!json_is_object(root)) {
        rc = IG_EMODEL;
        ig_errf(err, errlen, "%s: header: not a JSON object", file);
        goto fail;
    }
    size_t cap = json_object_size(root);
    st->entries = calloc(cap ? cap : 1, sizeof(*st->entries));
    if (st->entries == NULL) {
        rc = IG_ENOMEM;
        ig_errf(err, errlen, "%s: out of memory", file);
        goto fail;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                rc = IG_EMODEL;
                ig_errf(err, errlen, "%s: __metadata__: not a JSON object", file);
                goto fail;
            }
            continue;
        }
        ig_safetensors_entry_t *e = &st->entries[st->n];
        if (key[0] == '\0') {
            rc = IG_EMODEL;
            ig_errf(err, errlen, "%s: header: a tensor has an empty name", file);
            goto fail;
        }
        if ((e->name = strdup(key)) == NULL) {
            rc = IG_ENOMEM;
            ig_errf(err, errlen, "%s: out of memory", file);
            goto fail;
        }
        st->n++;
        if ((rc = parse_entry(e, val, file, data_size, err, errlen)) != 0)
            goto fail;
        e->data = st->map + 8 + hlen + e->offset;
    }
    if ((rc = check_tiling(st->entries, st->n, file, data_size, err, errlen)) != 0)
        goto fail;
    if (st->n > 0)
        qsort(st->entries, st->n, sizeof(*st->entries), cmp_entry_name);
    json_decref(root);
    close(fd);
    *out = st;
    return 0;

fail:
    json_decref(root);
    if (fd >= 0)
        close(fd);
    ig_safetensors_close(st);
    return rc;
}

void ig_safetensors_close(ig_safetensors_t *st)
{
    if (st == NULL)
        return;
    if (st->map)
        munmap(st->map, st->size);
    for (size_t i = 0; i < st->n; i++)
        free((char *)st->entries[i].name);
    free(st->entries);
    free(st->path);
    free(st);
}

size_t ig_safetensors_count(const ig_safetensors_t *st)
{
    return st->n;
}

const ig_safetensors_entry_t *ig_safetensors_at(const ig_safetensors_t *st, size_t i)
{
    return i < st->n ? &st->entries[i] : NULL;
}

const ig_safetensors_entry_t *ig_safetensors_find(const ig_safetensors_t *st, const char *name)
{
    ig_safetensors_entry_t key = {.name = name};
    if (st->n == 0)
        return NULL;
    return bsearch(&key, st->entries, st->n, sizeof(key), cmp_entry_name);
}

const char *ig_safetensors_path(const ig_safetensors_t *st)
{
    return st->path;
}

const char *ig_safetensors_file_name(const ig_safetensors_t *st)
{
    return st->file_name;
}

size_t ig_safetensors_file_size(const ig_safetensors_t *st)
{
    return st->size;
}

/* ---- writer ----------------------------------------------------------- */

struct ig_safetensors_writer_s {
    FILE *fp;
    char *path;
    char *buf; /* stdio buffer: large writes are what make 2.5 GB fast */
    uint64_t total;
    uint64_t written;
    int failed;
    int created; /* the file exists and must go if writing fails */
};

#define WRITER_BUF (4u << 20)

int ig_safetensors_writer_open(ig_safetensors_writer_t **out, const char *path,
                               const ig_safetensors_spec_t *specs, size_t n, char *err,
                               size_t errlen)
{
    int rc = 0;
    ig_safetensors_writer_t *w = NULL;
    json_t *root = NULL, *meta = NULL;
    char *text = NULL;
    const char *file = base_name(path);
    *out = NULL;

    root = json_object();
    meta = json_pack("{s:s}", "format", "pt");
    if (root == NULL || meta == NULL || json_object_set_new(root, "__metadata__", meta) != 0) {
        meta = NULL;
        rc = IG_ENOMEM;
        goto nomem;
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        const ig_safetensors_spec_t *s = &specs[i];
        if (s->name == NULL || s->name[0] == '\0' || strcmp(s->name, "__metadata__") == 0 ||
            json_object_get(root, s->name) != NULL) {
            rc = IG_EINVAL;
            ig_errf(err, errlen, "%s: tensor %zu: empty, reserved or duplicate name", file, i);
            goto fail;
        }
        if (s->ndim < 0 || s->ndim > IG_SAFETENSORS_MAX_DIMS || ig_dtype_size(s->dtype) == 0) {
            rc = IG_EINVAL;
            ig_errf(err, errlen, "%s: %s: bad rank or dtype", file, s->name);
            goto fail;
        }
        uint64_t nbytes = ig_dtype_size(s->dtype);
        json_t *shape = json_array();
        json_t *entry = json_object();
        int bad = shape == NULL || entry == NULL;
        for (int d = 0; d < s->ndim && !bad; d++) {
            if (s->shape[d] < 0 || (s->shape[d] > 0 && nbytes > UINT64_MAX / 2 / s->shape[d]))
                bad = 1;
            else
                nbytes *= (uint64_t)s->shape[d];
            if (!bad && json_array_append_new(shape, json_integer(s->shape[d])) != 0)
                bad = 1;
        }
        if (!bad && offset > UINT64_MAX / 2 - nbytes)
            bad = 1;
        if (bad) {
            json_decref(shape);
            json_decref(entry);
            rc = IG_EINVAL;
            ig_errf(err, errlen, "%s: %s: bad shape", file, s->name);
            goto fail;
        }
        json_t *offs = json_pack("[I,I]", (json_int_t)offset, (json_int_t)(offset + nbytes));
        if (json_object_set_new(entry, "dtype", json_string(ig_dtype_name(s->dtype))) != 0 ||
            json_object_set_new(entry, "shape", shape) != 0 ||
            json_object_set_new(entry, "data_offsets", offs) != 0 ||
            json_object_set_new(root, s->name, entry) != 0) {
            rc = IG_ENOMEM;
            goto nomem;
        }
        offset += nbytes;
    }
    text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (text == NULL) {
        rc = IG_ENOMEM;
        goto nomem;
    }
    size_t tlen = strlen(text);
    size_t padded = (tlen + 7) & ~(size_t)7;

    w = calloc(1, sizeof(*w));
    if (w == NULL || (w->path = strdup(path)) == NULL || (w->buf = malloc(WRITER_BUF)) == NULL) {
        rc = IG_ENOMEM;
        goto nomem;
    }
    w->total = offset;
    w->fp = fopen(path, "wb");
    if (w->fp == NULL) {
        rc = IG_EIO;
        ig_errf(err, errlen, "%s: cannot create: %s", file, strerror(errno));
        goto fail;
    }
    w->created = 1;
    setvbuf(w->fp, w->buf, _IOFBF, WRITER_BUF);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    if (fwrite(len8, 1, 8, w->fp) != 8 || fwrite(text, 1, tlen, w->fp) != tlen) {
        rc = IG_EIO;
        ig_errf(err, errlen, "%s: write: %s", file, strerror(errno));
        goto fail;
    }
    for (size_t i = tlen; i < padded; i++) {
        if (fputc(' ', w->fp) == EOF) {
            rc = IG_EIO;
            ig_errf(err, errlen, "%s: write: %s", file, strerror(errno));
            goto fail;
        }
    }
    free(text);
    json_decref(root);
    *out = w;
    return 0;

nomem:
    ig_errf(err, errlen, "%s: out of memory", file);
fail:
    free(text);
    json_decref(root);
    ig_safetensors_writer_abort(w);
    return rc;
}

int ig_safetensors_writer_write(ig_safetensors_writer_t *w, const void *data, size_t nbytes,
                                char *err, size_t errlen)
{
    if (w->failed)
        return IG_EIO;
    if (nbytes > w->total - w->written) {
        w->failed = 1;
        ig_errf(err, errlen, "%s: %zu bytes written past the declared %llu", base_name(w->path),
                nbytes, (unsigned long long)w->total);
        return IG_EINVAL;
    }
    if (fwrite(data, 1, nbytes, w->fp) != nbytes) {
        w->failed = 1;
        ig_errf(err, errlen, "%s: write: %s", base_name(w->path), strerror(errno));
        return IG_EIO;
    }
    w->written += nbytes;
    return 0;
}

int ig_safetensors_writer_close(ig_safetensors_writer_t *w, char *err, size_t errlen)
{
    int rc = 0;
    const char *file = base_name(w->path);
    if (w->failed) {
        rc = IG_EIO;
        ig_errf(err, errlen, "%s: an earlier write failed", file);
        goto fail;
    }
    if (w->written != w->total) {
        rc = IG_EINVAL;
        ig_errf(err, errlen, "%s: %llu of %llu data bytes written", file,
                (unsigned long long)w->written, (unsigned long long)w->total);
        goto fail;
    }
    int closed = fclose(w->fp);
    w->fp = NULL;
    if (closed != 0) {
        rc = IG_EIO;
        ig_errf(err, errlen, "%s: close: %s", file, strerror(errno));
        goto fail;
    }
    free(w->buf);
    free(w->path);
    free(w);
    return 0;

fail:
    ig_safetensors_writer_abort(w);
    return rc;
}

void ig_safetensors_writer_abort(ig_safetensors_writer_t *w)
{
    if (w == NULL)
        return;
    if (w->fp)
        fclose(w->fp);
    if (w->created)
        unlink(w->path);
    free(w->buf);
    free(w->path);
    free(w);
}
