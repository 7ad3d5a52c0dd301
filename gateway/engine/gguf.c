/*
 * GGUF reader (mmap + header validation) and streaming writer
 * (include/infergate/gguf.h).
 */
#include "infergate/gguf.h"

#include "infergate/error.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC "GGUF"
#define DEFAULT_ALIGN 32
/* Counts beyond these are refused as absurd before any allocation. */
#define MAX_KV (1u << 20)
#define MAX_TENSORS (1u << 20)

struct ig_gguf_s {
    char *path;
    const char *file; /* last component of path */
    const unsigned char *map;
    size_t size;
    uint32_t version;
    ig_gguf_kv_t *kvs;
    size_t nkv;
    ig_gguf_tensor_t *tensors;
    size_t ntensors;
    uint64_t **str_index; /* per kv: offsets of its strings (string arrays), built lazily */
};

/* ---- reading ------------------------------------------------------------ */

typedef struct {
    const ig_gguf_t *g;
    size_t pos;
    char *err;
    size_t errlen;
} cursor_t;

static int need(cursor_t *c, uint64_t n, const char *what)
{
    if (n > c->g->size || c->pos > c->g->size - n) {
        ig_errf(c->err, c->errlen, "%s: %s: runs past the end of the file (%zu bytes; truncated?)",
                c->g->file, what, c->g->size);
        return IG_EMODEL;
    }
    return 0;
}

static uint64_t rd_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static int rd_u32(cursor_t *c, uint32_t *v, const char *what)
{
    int rc = need(c, 4, what);
    if (rc == 0) {
        *v = (uint32_t)rd_le(c->g->map + c->pos, 4);
        c->pos += 4;
    }
    return rc;
}

static int rd_u64(cursor_t *c, uint64_t *v, const char *what)
{
    int rc = need(c, 8, what);
    if (rc == 0) {
        *v = rd_le(c->g->map + c->pos, 8);
        c->pos += 8;
    }
    return rc;
}

/* A string: its bytes stay in the mapping. */
static int rd_str(cursor_t *c, const unsigned char **s, uint64_t *len, const char *what)
{
    int rc = rd_u64(c, len, what);
    if (rc != 0 || (rc = need(c, *len, what)) != 0)
        return rc;
    *s = c->g->map + c->pos;
    c->pos += *len;
    return 0;
}

static size_t scalar_size(ig_gguf_type_t t)
{
    switch (t) {
    case IG_GGUF_U8:
    case IG_GGUF_I8:
    case IG_GGUF_BOOL:
        return 1;
    case IG_GGUF_U16:
    case IG_GGUF_I16:
        return 2;
    case IG_GGUF_U32:
    case IG_GGUF_I32:
    case IG_GGUF_F32:
        return 4;
    case IG_GGUF_U64:
    case IG_GGUF_I64:
    case IG_GGUF_F64:
        return 8;
    default:
        return 0;
    }
}

static char *dup_str(const unsigned char *s, uint64_t len)
{
    char *d = malloc((size_t)len + 1);
    if (d != NULL) {
        memcpy(d, s, (size_t)len);
        d[len] = '\0';
    }
    return d;
}

static int read_kv(cursor_t *c, ig_gguf_kv_t *kv, uint64_t idx)
{
    const unsigned char *ks;
    uint64_t klen;
    uint32_t type;
    char what[64];
    snprintf(what, sizeof(what), "metadata[%llu]", (unsigned long long)idx);
    int rc;
    if ((rc = rd_str(c, &ks, &klen, what)) != 0)
        return rc;
    if (klen == 0 || klen > 65535 || memchr(ks, '\0', (size_t)klen) != NULL) {
        ig_errf(c->err, c->errlen, "%s: %s: bad key (empty, too long or with a NUL byte)",
                c->g->file, what);
        return IG_EMODEL;
    }
    if ((kv->key = dup_str(ks, klen)) == NULL)
        return IG_ENOMEM;
    if ((rc = rd_u32(c, &type, kv->key)) != 0)
        return rc;
    kv->type = (ig_gguf_type_t)type;
    if (type == IG_GGUF_ARRAY) {
        uint32_t et;
        if ((rc = rd_u32(c, &et, kv->key)) != 0 || (rc = rd_u64(c, &kv->n, kv->key)) != 0)
            return rc;
        kv->elem = (ig_gguf_type_t)et;
        kv->value = c->g->map + c->pos;
        if (et == IG_GGUF_STRING) {
            for (uint64_t i = 0; i < kv->n; i++) {
                const unsigned char *s;
                uint64_t len;
                if ((rc = rd_str(c, &s, &len, kv->key)) != 0)
                    return rc;
            }
        } else if (scalar_size((ig_gguf_type_t)et) != 0) {
            uint64_t es = scalar_size((ig_gguf_type_t)et);
            if (kv->n > UINT64_MAX / es || (rc = need(c, kv->n * es, kv->key)) != 0) {
                if (rc == 0)
                    ig_errf(c->err, c->errlen, "%s: %s: array of %llu elements is absurd",
                            c->g->file, kv->key, (unsigned long long)kv->n);
                return IG_EMODEL;
            }
            c->pos += kv->n * es;
        } else {
            ig_errf(c->err, c->errlen, "%s: %s: array of type %u is not supported", c->g->file,
                    kv->key, et);
            return IG_EMODEL;
        }
        return 0;
    }
    kv->value = c->g->map + c->pos;
    if (type == IG_GGUF_STRING) {
        const unsigned char *s;
        uint64_t len;
        return rd_str(c, &s, &len, kv->key);
    }
    size_t sz = scalar_size(kv->type);
    if (sz == 0) {
        ig_errf(c->err, c->errlen, "%s: %s: unknown value type %u", c->g->file, kv->key, type);
        return IG_EMODEL;
    }
    if ((rc = need(c, sz, kv->key)) != 0)
        return rc;
    c->pos += sz;
    return 0;
}

static int ggml_to_dtype(uint32_t t, ig_dtype_t *d)
{
    switch (t) {
    case IG_GGML_F32:
        *d = IG_DTYPE_F32;
        return 0;
    case IG_GGML_F16:
        *d = IG_DTYPE_F16;
        return 0;
    case IG_GGML_BF16:
        *d = IG_DTYPE_BF16;
        return 0;
    case IG_GGML_Q8_0:
        *d = IG_DTYPE_Q8_0;
        return 0;
    case IG_GGML_Q4_0:
        *d = IG_DTYPE_Q4_0;
        return 0;
    case IG_GGML_Q4_K:
        *d = IG_DTYPE_Q4_K;
        return 0;
    case IG_GGML_Q6_K:
        *d = IG_DTYPE_Q6_K;
        return 0;
    default:
        return IG_ENOTSUP;
    }
}

static int read_tensor(cursor_t *c, ig_gguf_tensor_t *t, uint64_t idx)
{
    const unsigned char *ns;
    uint64_t nlen, ne;
    uint32_t ndim, type;
    char what[64];
    snprintf(what, sizeof(what), "tensor[%llu]", (unsigned long long)idx);
    int rc;
    if ((rc = rd_str(c, &ns, &nlen, what)) != 0)
        return rc;
    if (nlen == 0 || nlen > 65535 || memchr(ns, '\0', (size_t)nlen) != NULL) {
        ig_errf(c->err, c->errlen, "%s: %s: bad name", c->g->file, what);
        return IG_EMODEL;
    }
    if ((t->name = dup_str(ns, nlen)) == NULL)
        return IG_ENOMEM;
    if ((rc = rd_u32(c, &ndim, t->name)) != 0)
        return rc;
    if (ndim < 1 || ndim > IG_GGUF_MAX_DIMS) {
        ig_errf(c->err, c->errlen, "%s: %s: %u dimensions (1 to %d)", c->g->file, t->name, ndim,
                IG_GGUF_MAX_DIMS);
        return IG_EMODEL;
    }
    t->ndim = (int)ndim;
    uint64_t nel = 1;
    for (uint32_t i = 0; i < ndim; i++) {
        if ((rc = rd_u64(c, &ne, t->name)) != 0)
            return rc;
        if (ne == 0 || ne > INT64_MAX || nel > (uint64_t)INT64_MAX / ne) {
            ig_errf(c->err, c->errlen, "%s: %s: dimension %u is %llu: empty or overflowing",
                    c->g->file, t->name, i, (unsigned long long)ne);
            return IG_EMODEL;
        }
        t->ne[i] = (int64_t)ne;
        nel *= ne;
    }
    if ((rc = rd_u32(c, &type, t->name)) != 0 || (rc = rd_u64(c, &t->offset, t->name)) != 0)
        return rc;
    if (ggml_to_dtype(type, &t->dtype) != 0) {
        ig_errf(c->err, c->errlen,
                "%s: %s: tensor type %u is not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K)",
                c->g->file, t->name, type);
        return IG_EMODEL;
    }
    uint64_t blk = ig_dtype_block(t->dtype), blk_bytes = ig_dtype_bytes(t->dtype, blk);
    if (t->ne[0] % blk != 0) {
        ig_errf(c->err, c->errlen, "%s: %s: %s rows of %lld, not whole blocks of %d", c->g->file,
                t->name, ig_dtype_name(t->dtype), (long long)t->ne[0], (int)blk);
        return IG_EMODEL;
    }
    uint64_t nb = nel / blk * blk_bytes;
    if (nb / blk_bytes != nel / blk) {
        ig_errf(c->err, c->errlen, "%s: %s: size overflows", c->g->file, t->name);
        return IG_EMODEL;
    }
    t->nbytes = (size_t)nb;
    return 0;
}

static void gguf_free(ig_gguf_t *g)
{
    if (g == NULL)
        return;
    for (size_t i = 0; i < g->nkv; i++) {
        free((char *)g->kvs[i].key);
        if (g->str_index)
            free(g->str_index[i]);
    }
    free(g->str_index);
    for (size_t i = 0; i < g->ntensors; i++)
        free((char *)g->tensors[i].name);
    free(g->kvs);
    free(g->tensors);
    if (g->map != NULL)
        munmap((void *)g->map, g->size);
    free(g->path);
    free(g);
}

void ig_gguf_close(ig_gguf_t *g)
{
    gguf_free(g);
}

int ig_gguf_is_gguf(const char *path)
{
    char m[4];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, m, 4);
    close(fd);
    return n == 4 && memcmp(m, GGUF_MAGIC, 4) == 0;
}

int ig_gguf_open(ig_gguf_t **out, const char *path, char *err, size_t errlen)
{
    int rc, fd = -1;
    *out = NULL;
    ig_gguf_t *g = calloc(1, sizeof(*g));
    if (g == NULL || (g->path = strdup(path)) == NULL) {
        free(g);
        ig_errf(err, errlen, "%s: out of memory", path);
        return IG_ENOMEM;
    }
    const char *slash = strrchr(g->path, '/');
    g->file = slash ? slash + 1 : g->path;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = errno == ENOENT ? IG_ENOENT : IG_EIO;
        ig_errf(err, errlen, "%s: cannot open: %s", g->file, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        rc = IG_EMODEL;
        ig_errf(err, errlen, "%s: not a regular file", g->file);
        goto fail;
    }
    g->size = (size_t)sb.st_size;
    if (g->size < 24) {
        rc = IG_EMODEL;
        ig_errf(err, errlen, "%s: header: %zu bytes, too short for a GGUF header", g->file,
                g->size);
        goto fail;
    }
    g->map = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (g->map == MAP_FAILED) {
        g->map = NULL;
        rc = IG_EIO;
        ig_errf(err, errlen, "%s: mmap: %s", g->file, strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;
    if (memcmp(g->map, GGUF_MAGIC, 4) != 0) {
        rc = IG_EMODEL;
        ig_errf(err, errlen, "%s: header: no GGUF magic (not a GGUF file)", g->file);
        goto fail;
    }
    cursor_t c = {g, 4, err, errlen};
    uint64_t nt, nkv;
    if ((rc = rd_u32(&c, &g->version, "version")) != 0)
        goto fail;
    if (g->version != 2 && g->version != 3) {
        rc = IG_EMODEL;
        ig_errf(err, errlen, "%s: version: %u is not supported (2, 3)", g->file, g->version);
        goto fail;
    }
    if ((rc = rd_u64(&c, &nt, "tensor_count")) != 0 || (rc = rd_u64(&c, &nkv, "metadata_count")))
        goto fail;
    if (nt > MAX_TENSORS || nkv > MAX_KV) {
        rc = IG_EMODEL;
        ig_errf(err, errlen, "%s: header: %llu tensors and %llu metadata entries are absurd",
                g->file, (unsigned long long)nt, (unsigned long long)nkv);
        goto fail;
    }
    g->kvs = calloc(nkv ? nkv : 1, sizeof(*g->kvs));
    g->str_index = calloc(nkv ? nkv : 1, sizeof(*g->str_index));
    g->tensors = calloc(nt ? nt : 1, sizeof(*g->tensors));
    if (g->kvs == NULL || g->tensors == NULL || g->str_index == NULL) {
        rc = IG_ENOMEM;
        ig_errf(err, errlen, "%s: out of memory", g->file);
        goto fail;
    }
    for (uint64_t i = 0; i < nkv; i++) {
        g->nkv = i + 1;
        if ((rc = read_kv(&c, &g->kvs[i], i)) != 0)
            goto fail;
        for (uint64_t j = 0; j < i; j++)
            if (strcmp(g->kvs[j].key, g->kvs[i].key) == 0) {
                rc = IG_EMODEL;
                ig_errf(err, errlen, "%s: %s: duplicate key", g->file, g->kvs[i].key);
                goto fail;
            }
    }
    for (uint64_t i = 0; i < nt; i++) {
        g->ntensors = i + 1;
        if ((rc = read_tensor(&c, &g->tensors[i], i)) != 0)
            goto fail;
    }
    int64_t align = DEFAULT_ALIGN;
    rc = ig_gguf_get_int(g, "general.alignment", 1, 1 << 20, &align, err, errlen);
    if (rc != 0 && rc != IG_ENOENT)
        goto fail;
    if ((align & (align - 1)) != 0) {
        rc = IG_EMODEL;
        ig_errf(err, errlen, "%s: general.alignment: %lld is not a power of two", g->file,
                (long long)align);
        goto fail;
    }
    size_t data = (c.pos + (size_t)align - 1) / (size_t)align * (size_t)align;
    if (data > g->size) {
        rc = IG_EMODEL;
        ig_errf(err, errlen, "%s: header: no data section after the header (truncated?)", g->file);
        goto fail;
    }
    for (size_t i = 0; i < g->ntensors; i++) {
        ig_gguf_tensor_t *t = &g->tensors[i];
        if (t->offset % (uint64_t)align != 0) {
            rc = IG_EMODEL;
            ig_errf(err, errlen, "%s: %s: offset %llu is not a multiple of the alignment %lld",
                    g->file, t->name, (unsigned long long)t->offset, (long long)align);
            goto fail;
        }
        if (t->offset > g->size - data || t->nbytes > g->size - data - t->offset) {
            rc = IG_EMODEL;
            ig_errf(err, errlen,
                    "%s: %s: %zu bytes at offset %llu run past the end of the file (truncated?)",
                    g->file, t->name, t->nbytes, (unsigned long long)t->offset);
            goto fail;
        }
        t->data = g->map + data + t->offset;
        for (size_t j = 0; j < i; j++)
            if (strcmp(g->tensors[j].name, t->name) == 0) {
                rc = IG_EMODEL;
                ig_errf(err, errlen, "%s: %s: duplicate tensor name", g->file, t->name);
                goto fail;
            }
    }
    *out = g;
    return 0;

fail:
    if (fd >= 0)
        close(fd);
    gguf_free(g);
    return rc;
}

const char *ig_gguf_file_name(const ig_gguf_t *g)
{
    return g->file;
}

size_t ig_gguf_file_size(const ig_gguf_t *g)
{
    return g->size;
}

size_t ig_gguf_kv_count(const ig_gguf_t *g)
{
    return g->nkv;
}

const ig_gguf_kv_t *ig_gguf_kv_at(const ig_gguf_t *g, size_t i)
{
    return i < g->nkv ? &g->kvs[i] : NULL;
}

const ig_gguf_kv_t *ig_gguf_find(const ig_gguf_t *g, const char *key)
{
    for (size_t i = 0; i < g->nkv; i++)
        if (strcmp(g->kvs[i].key, key) == 0)
            return &g->kvs[i];
    return NULL;
}

size_t ig_gguf_tensor_count(const ig_gguf_t *g)
{
    return g->ntensors;
}

const ig_gguf_tensor_t *ig_gguf_tensor_at(const ig_gguf_t *g, size_t i)
{
    return i < g->ntensors ? &g->tensors[i] : NULL;
}

const ig_gguf_tensor_t *ig_gguf_find_tensor(const ig_gguf_t *g, const char *name)
{
    for (size_t i = 0; i < g->ntensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0)
            return &g->tensors[i];
    return NULL;
}

static const char *type_name(ig_gguf_type_t t)
{
    static const char *const names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
    return (unsigned)t < sizeof(names) / sizeof(names[0]) ? names[t] : "?";
}

static int is_int_type(ig_gguf_type_t t)
{
    return t == IG_GGUF_U8 || t == IG_GGUF_I8 || t == IG_GGUF_U16 || t == IG_GGUF_I16 ||
           t == IG_GGUF_U32 || t == IG_GGUF_I32 || t == IG_GGUF_U64 || t == IG_GGUF_I64;
}

/* A scalar of type t at p, as a double and, for integers, exactly as int64
 * (*big set for a u64 beyond INT64_MAX). */
static double scalar_at(ig_gguf_type_t t, const unsigned char *p, int64_t *iv, int *big)
{
    uint64_t u = rd_le(p, (int)scalar_size(t));
    *big = 0;
    switch (t) {
    case IG_GGUF_I8:
        *iv = (int8_t)u;
        break;
    case IG_GGUF_I16:
        *iv = (int16_t)u;
        break;
    case IG_GGUF_I32:
        *iv = (int32_t)u;
        break;
    case IG_GGUF_I64:
        *iv = (int64_t)u;
        break;
    case IG_GGUF_F32: {
        uint32_t b = (uint32_t)u;
        float f;
        memcpy(&f, &b, 4);
        *iv = 0;
        return f;
    }
    case IG_GGUF_F64: {
        double d;
        memcpy(&d, &u, 8);
        *iv = 0;
        return d;
    }
    default:
        *big = u > (uint64_t)INT64_MAX;
        *iv = (int64_t)u;
    }
    return (double)*iv;
}

int ig_gguf_get_int(const ig_gguf_t *g, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    char *err, size_t errlen)
{
    const ig_gguf_kv_t *kv = ig_gguf_find(g, key);
    if (kv == NULL)
        return IG_ENOENT;
    if (!is_int_type(kv->type)) {
        ig_errf(err, errlen, "%s: %s: expected an integer, got %s", g->file, key,
                type_name(kv->type));
        return IG_EMODEL;
    }
    int64_t v;
    int big;
    scalar_at(kv->type, kv->value, &v, &big);
    if (big || v < lo || v > hi) {
        ig_errf(err, errlen, "%s: %s: %lld is out of range [%lld, %lld]", g->file, key,
                (long long)v, (long long)lo, (long long)hi);
        return IG_EMODEL;
    }
    *out = v;
    return 0;
}

int ig_gguf_get_float(const ig_gguf_t *g, const char *key, double *out, char *err, size_t errlen)
{
    const ig_gguf_kv_t *kv = ig_gguf_find(g, key);
    if (kv == NULL)
        return IG_ENOENT;
    if (kv->type != IG_GGUF_F32 && kv->type != IG_GGUF_F64 && !is_int_type(kv->type)) {
        ig_errf(err, errlen, "%s: %s: expected a number, got %s", g->file, key,
                type_name(kv->type));
        return IG_EMODEL;
    }
    int64_t iv;
    int big;
    *out = scalar_at(kv->type, kv->value, &iv, &big);
    return 0;
}

int ig_gguf_get_bool(const ig_gguf_t *g, const char *key, int *out, char *err, size_t errlen)
{
    const ig_gguf_kv_t *kv = ig_gguf_find(g, key);
    if (kv == NULL)
        return IG_ENOENT;
    if (kv->type != IG_GGUF_BOOL) {
        ig_errf(err, errlen, "%s: %s: expected a bool, got %s", g->file, key, type_name(kv->type));
        return IG_EMODEL;
    }
    *out = kv->value[0] != 0;
    return 0;
}

int ig_gguf_get_str(const ig_gguf_t *g, const char *key, const char **s, size_t *len, char *err,
                    size_t errlen)
{
    const ig_gguf_kv_t *kv = ig_gguf_find(g, key);
    if (kv == NULL)
        return IG_ENOENT;
    if (kv->type != IG_GGUF_STRING) {
        ig_errf(err, errlen, "%s: %s: expected a string, got %s", g->file, key,
                type_name(kv->type));
        return IG_EMODEL;
    }
    *len = (size_t)rd_le(kv->value, 8);
    *s = (const char *)kv->value + 8;
    return 0;
}

int ig_gguf_get_array(const ig_gguf_t *g, const char *key, ig_gguf_type_t elem,
                      const ig_gguf_kv_t **out, char *err, size_t errlen)
{
    const ig_gguf_kv_t *kv = ig_gguf_find(g, key);
    if (kv == NULL)
        return IG_ENOENT;
    if (kv->type != IG_GGUF_ARRAY || kv->elem != elem) {
        ig_errf(err, errlen, "%s: %s: expected an array of %s, got %s%s%s", g->file, key,
                type_name(elem), kv->type == IG_GGUF_ARRAY ? "an array of " : "",
                type_name(kv->type == IG_GGUF_ARRAY ? kv->elem : kv->type), "");
        return IG_EMODEL;
    }
    *out = kv;
    return 0;
}

int ig_gguf_str_at(const ig_gguf_t *g, const ig_gguf_kv_t *kv, uint64_t i, const char **s,
                   size_t *len)
{
    size_t k = (size_t)(kv - g->kvs);
    if (kv->type != IG_GGUF_ARRAY || kv->elem != IG_GGUF_STRING || i >= kv->n)
        return IG_EINVAL;
    if (g->str_index[k] == NULL) {
        uint64_t *idx = malloc((size_t)kv->n * sizeof(*idx) + 1);
        if (idx == NULL)
            return IG_ENOMEM;
        const unsigned char *p = kv->value; /* validated at open */
        for (uint64_t j = 0; j < kv->n; j++) {
            idx[j] = (uint64_t)(p - g->map);
            p += 8 + rd_le(p, 8);
        }
        g->str_index[k] = idx;
    }
    const unsigned char *p = g->map + g->str_index[k][i];
    *len = (size_t)rd_le(p, 8);
    *s = (const char *)p + 8;
    return 0;
}

double ig_gguf_num_at(const ig_gguf_kv_t *kv, uint64_t i)
{
    int64_t iv;
    int big;
    return scalar_at(kv->elem, kv->value + i * scalar_size(kv->elem), &iv, &big);
}

/* ---- writing ------------------------------------------------------------ */

typedef struct {
    char *name;
    ig_dtype_t dtype;
    int ndim;
    int64_t ne[IG_GGUF_MAX_DIMS];
    uint64_t nbytes, offset;
} wtensor_t;

struct ig_gguf_writer_s {
    unsigned char *kv; /* the encoded metadata */
    size_t kvlen, kvcap;
    uint64_t nkv;
    wtensor_t *t;
    size_t nt, tcap;
    FILE *f;
    char *path;
    size_t cur;       /* tensor being written */
    uint64_t written; /* bytes of it written */
    int failed;
};

int ig_gguf_writer_init(ig_gguf_writer_t **out)
{
    *out = calloc(1, sizeof(**out));
    return *out ? 0 : IG_ENOMEM;
}

static int put(ig_gguf_writer_t *w, const void *p, size_t n)
{
    if (w->kvlen + n > w->kvcap) {
        size_t cap = w->kvcap ? w->kvcap : 4096;
        while (cap < w->kvlen + n)
            cap *= 2;
        unsigned char *nb = realloc(w->kv, cap);
        if (nb == NULL)
            return IG_ENOMEM;
        w->kv = nb;
        w->kvcap = cap;
    }
    memcpy(w->kv + w->kvlen, p, n);
    w->kvlen += n;
    return 0;
}

static int put_le(ig_gguf_writer_t *w, uint64_t v, int n)
{
    unsigned char b[8];
    for (int i = 0; i < n; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    return put(w, b, (size_t)n);
}

static int put_string(ig_gguf_writer_t *w, const char *s, size_t len)
{
    int rc = put_le(w, len, 8);
    return rc ? rc : put(w, s, len);
}

static int put_key(ig_gguf_writer_t *w, const char *key, ig_gguf_type_t t)
{
    int rc = put_string(w, key, strlen(key));
    if (rc == 0)
        rc = put_le(w, (uint64_t)t, 4);
    if (rc == 0)
        w->nkv++;
    return rc;
}

int ig_gguf_put_u32(ig_gguf_writer_t *w, const char *key, uint32_t v)
{
    int rc = put_key(w, key, IG_GGUF_U32);
    return rc ? rc : put_le(w, v, 4);
}

int ig_gguf_put_i32(ig_gguf_writer_t *w, const char *key, int32_t v)
{
    int rc = put_key(w, key, IG_GGUF_I32);
    return rc ? rc : put_le(w, (uint32_t)v, 4);
}

int ig_gguf_put_f32(ig_gguf_writer_t *w, const char *key, float v)
{
    uint32_t b;
    memcpy(&b, &v, 4);
    int rc = put_key(w, key, IG_GGUF_F32);
    return rc ? rc : put_le(w, b, 4);
}

int ig_gguf_put_bool(ig_gguf_writer_t *w, const char *key, int v)
{
    int rc = put_key(w, key, IG_GGUF_BOOL);
    return rc ? rc : put_le(w, v ? 1 : 0, 1);
}

int ig_gguf_put_str(ig_gguf_writer_t *w, const char *key, const char *s, size_t len)
{
    int rc = put_key(w, key, IG_GGUF_STRING);
    return rc ? rc : put_string(w, s, len);
}

static int put_array_head(ig_gguf_writer_t *w, const char *key, ig_gguf_type_t elem, uint64_t n)
{
    int rc = put_key(w, key, IG_GGUF_ARRAY);
    if (rc == 0)
        rc = put_le(w, (uint64_t)elem, 4);
    if (rc == 0)
        rc = put_le(w, n, 8);
    return rc;
}

int ig_gguf_put_str_array(ig_gguf_writer_t *w, const char *key, const char *const *s,
                          const size_t *lens, uint64_t n)
{
    int rc = put_array_head(w, key, IG_GGUF_STRING, n);
    for (uint64_t i = 0; rc == 0 && i < n; i++)
        rc = put_string(w, s[i], lens ? lens[i] : strlen(s[i]));
    return rc;
}

int ig_gguf_put_f32_array(ig_gguf_writer_t *w, const char *key, const float *v, uint64_t n)
{
    int rc = put_array_head(w, key, IG_GGUF_F32, n);
    for (uint64_t i = 0; rc == 0 && i < n; i++) {
        uint32_t b;
        memcpy(&b, &v[i], 4);
        rc = put_le(w, b, 4);
    }
    return rc;
}

int ig_gguf_put_i32_array(ig_gguf_writer_t *w, const char *key, const int32_t *v, uint64_t n)
{
    int rc = put_array_head(w, key, IG_GGUF_I32, n);
    for (uint64_t i = 0; rc == 0 && i < n; i++)
        rc = put_le(w, (uint32_t)v[i], 4);
    return rc;
}

static uint32_t dtype_to_ggml(ig_dtype_t d)
{
    switch (d) {
    case IG_DTYPE_F16:
        return IG_GGML_F16;
    case IG_DTYPE_BF16:
        return IG_GGML_BF16;
    case IG_DTYPE_Q8_0:
        return IG_GGML_Q8_0;
    case IG_DTYPE_Q4_0:
        return IG_GGML_Q4_0;
    case IG_DTYPE_Q4_K:
        return IG_GGML_Q4_K;
    case IG_DTYPE_Q6_K:
        return IG_GGML_Q6_K;
    default:
        return IG_GGML_F32;
    }
}

int ig_gguf_add_tensor(ig_gguf_writer_t *w, const char *name, ig_dtype_t dtype, int ndim,
                       const int64_t *ne)
{
    if (ndim < 1 || ndim > IG_GGUF_MAX_DIMS)
        return IG_EINVAL;
    if (w->nt == w->tcap) {
        size_t cap = w->tcap ? 2 * w->tcap : 64;
        wtensor_t *nt = realloc(w->t, cap * sizeof(*nt));
        if (nt == NULL)
            return IG_ENOMEM;
        w->t = nt;
        w->tcap = cap;
    }
    wtensor_t *t = &w->t[w->nt];
    memset(t, 0, sizeof(*t));
    uint64_t nel = 1;
    for (int i = 0; i < ndim; i++)
        t->ne[i] = ne[i], nel *= (uint64_t)ne[i];
    t->nbytes = ig_dtype_bytes(dtype, (size_t)nel);
    if (t->nbytes == 0 || (t->name = strdup(name)) == NULL)
        return t->nbytes == 0 ? IG_EINVAL : IG_ENOMEM;
    t->dtype = dtype;
    t->ndim = ndim;
    uint64_t off = 0;
    if (w->nt > 0) {
        const wtensor_t *p = &w->t[w->nt - 1];
        off = (p->offset + p->nbytes + DEFAULT_ALIGN - 1) / DEFAULT_ALIGN * DEFAULT_ALIGN;
    }
    t->offset = off;
    w->nt++;
    return 0;
}

static int wr(ig_gguf_writer_t *w, const void *p, size_t n)
{
    if (n > 0 && fwrite(p, 1, n, w->f) != n)
        w->failed = 1;
    return w->failed ? IG_EIO : 0;
}

static int wr_le(ig_gguf_writer_t *w, uint64_t v, int n)
{
    unsigned char b[8];
    for (int i = 0; i < n; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    return wr(w, b, (size_t)n);
}

int ig_gguf_writer_begin(ig_gguf_writer_t *w, const char *path, char *err, size_t errlen)
{
    if ((w->path = strdup(path)) == NULL)
        return IG_ENOMEM;
    w->f = fopen(path, "wb");
    if (w->f == NULL) {
        ig_errf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        return IG_EIO;
    }
    wr(w, GGUF_MAGIC, 4);
    wr_le(w, 3, 4);
    wr_le(w, w->nt, 8);
    wr_le(w, w->nkv, 8);
    wr(w, w->kv, w->kvlen);
    size_t pos = 24 + w->kvlen;
    for (size_t i = 0; i < w->nt; i++) {
        const wtensor_t *t = &w->t[i];
        wr_le(w, strlen(t->name), 8);
        wr(w, t->name, strlen(t->name));
        wr_le(w, (uint64_t)t->ndim, 4);
        for (int d = 0; d < t->ndim; d++)
            wr_le(w, (uint64_t)t->ne[d], 8);
        wr_le(w, dtype_to_ggml(t->dtype), 4);
        wr_le(w, t->offset, 8);
        pos += 8 + strlen(t->name) + 4 + 8 * (size_t)t->ndim + 4 + 8;
    }
    static const unsigned char zeros[DEFAULT_ALIGN];
    wr(w, zeros, (DEFAULT_ALIGN - pos % DEFAULT_ALIGN) % DEFAULT_ALIGN);
    if (w->failed) {
        ig_errf(err, errlen, "%s: write: %s", path, strerror(errno));
        return IG_EIO;
    }
    return 0;
}

int ig_gguf_writer_write(ig_gguf_writer_t *w, const void *data, size_t n, char *err, size_t errlen)
{
    static const unsigned char zeros[DEFAULT_ALIGN];
    const unsigned char *p = data;
    while (n > 0) {
        if (w->cur >= w->nt) {
            ig_errf(err, errlen, "%s: more bytes than the tensors declared", w->path);
            w->failed = 1;
            return IG_EINVAL;
        }
        wtensor_t *t = &w->t[w->cur];
        size_t take = t->nbytes - w->written < n ? (size_t)(t->nbytes - w->written) : n;
        if (wr(w, p, take) != 0) {
            ig_errf(err, errlen, "%s: write: %s", w->path, strerror(errno));
            return IG_EIO;
        }
        p += take, n -= take, w->written += take;
        if (w->written == t->nbytes) {
            if (w->cur + 1 < w->nt)
                wr(w, zeros, (size_t)(w->t[w->cur + 1].offset - t->offset - t->nbytes));
            w->cur++;
            w->written = 0;
        }
    }
    return 0;
}

static void writer_free(ig_gguf_writer_t *w)
{
    for (size_t i = 0; i < w->nt; i++)
        free(w->t[i].name);
    free(w->t);
    free(w->kv);
    free(w->path);
    free(w);
}

int ig_gguf_writer_close(ig_gguf_writer_t *w, char *err, size_t errlen)
{
    int rc = 0;
    if (w->cur < w->nt) {
        ig_errf(err, errlen, "%s: %s: fewer bytes written than declared", w->path,
                w->t[w->cur].name);
        rc = IG_EINVAL;
    }
    if (w->f != NULL && fclose(w->f) != 0 && rc == 0) {
        ig_errf(err, errlen, "%s: close: %s", w->path, strerror(errno));
        rc = IG_EIO;
    }
    if (rc == 0 && w->failed)
        rc = IG_EIO;
    if (rc != 0 && w->path != NULL)
        unlink(w->path);
    writer_free(w);
    return rc;
}

void ig_gguf_writer_abort(ig_gguf_writer_t *w)
{
    if (w == NULL)
        return;
    if (w->f != NULL) {
        fclose(w->f);
        unlink(w->path);
    }
    writer_free(w);
}
