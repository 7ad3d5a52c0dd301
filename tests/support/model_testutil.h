/*
 * Helpers shared by the model, safetensors and mkmodel tests: scratch
 * directories, whole-file I/O, and surgery on safetensors headers and JSON
 * files so that each malformed case is made from a good model in the test.
 * Header-only (static): tu_with_tokenizer is each test program's own.
 */
#ifndef IG_TESTS_MODEL_TESTUTIL_H
#define IG_TESTS_MODEL_TESTUTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <math.h>
#include <unistd.h>

#include "files.h"
#include "infergate/error.h"
#include "infergate/mkmodel.h"
#include "infergate/model.h"

static inline char *tu_mkdtemp(void)
{
    char dir[256];
    assert_int_equal(ig_tf_mkdtemp(dir, sizeof(dir)), 0);
    return strdup(dir);
}

/* Removes dir and everything in it, then frees the string. */
static inline void tu_rmtree(char *dir)
{
    ig_tf_rmtree(dir);
    free(dir);
}

/* The scratch directory of the running test: tu_dir_setup makes it and
 * tu_dir_teardown removes it, as a cmocka per-test setup and teardown. */
static char *tu_dir;

__attribute__((unused)) static int tu_dir_setup(void **state)
{
    (void)state;
    tu_dir = tu_mkdtemp();
    return 0;
}

__attribute__((unused)) static int tu_dir_teardown(void **state)
{
    (void)state;
    tu_rmtree(tu_dir);
    tu_dir = NULL;
    return 0;
}

static inline char *tu_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    assert_non_null(p);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Reads a whole file; *len gets its size. The caller frees. */
static inline unsigned char *tu_read(const char *path, size_t *len)
{
    unsigned char *buf = (unsigned char *)ig_tf_read(path, len);
    if (buf == NULL)
        fail_msg("cannot read %s", path);
    return buf;
}

static inline void tu_write(const char *path, const void *data, size_t len)
{
    if (ig_tf_write(path, data, len) != 0)
        fail_msg("cannot write %s", path);
}

/* Writes a tiny (or other preset) model into dir; without the tokenizer
 * unless tu_with_tokenizer is set, since most tests need only the weights. */
static int tu_with_tokenizer;

static inline void tu_mkmodel(const char *dir, const char *preset, uint64_t seed, int shards,
                              int has_dtype, ig_dtype_t dtype)
{
    ig_mkmodel_opts_t o;
    char err[256];
    ig_mkmodel_opts_default(&o);
    o.preset = preset;
    o.seed = seed;
    o.shards = shards;
    o.has_dtype = has_dtype;
    o.dtype = dtype;
    o.no_tokenizer = !tu_with_tokenizer;
    int rc = ig_mkmodel_write(dir, &o, err, sizeof(err));
    if (rc != 0)
        fail_msg("mkmodel: %s", err);
}

/* The architecture and sizes a test expects of a model's config. */
typedef struct {
    const char *architecture; /* NULL: not checked */
    int hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
        head_dim, vocab_size, max_position_embeddings;
} tu_shape_t;

/* Asserts each field of want on c. */
static inline void tu_assert_shape(const ig_model_config_t *c, const tu_shape_t *want)
{
    if (want->architecture != NULL)
        assert_string_equal(c->architecture, want->architecture);
    assert_int_equal(c->hidden_size, want->hidden_size);
    assert_int_equal(c->intermediate_size, want->intermediate_size);
    assert_int_equal(c->num_hidden_layers, want->num_hidden_layers);
    assert_int_equal(c->num_attention_heads, want->num_attention_heads);
    assert_int_equal(c->num_key_value_heads, want->num_key_value_heads);
    assert_int_equal(c->head_dim, want->head_dim);
    assert_int_equal(c->vocab_size, want->vocab_size);
    assert_int_equal(c->max_position_embeddings, want->max_position_embeddings);
}

/* Rewrites the JSON file dir/name: value NULL deletes key, else sets it
 * (the reference is stolen). key may be "a.b" for one level of nesting. */
static inline void tu_json_set(const char *dir, const char *name, const char *key, json_t *value)
{
    char *path = tu_path(dir, name);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    assert_non_null(root);
    json_t *obj = root;
    char k[128];
    snprintf(k, sizeof(k), "%s", key);
    char *dot = strchr(k, '.');
    if (dot) {
        *dot = '\0';
        obj = json_object_get(root, k);
        assert_non_null(obj);
        memmove(k, dot + 1, strlen(dot + 1) + 1);
    }
    if (value)
        assert_int_equal(json_object_set_new(obj, k, value), 0);
    else
        assert_int_equal(json_object_del(obj, k), 0);
    assert_int_equal(json_dump_file(root, path, JSON_INDENT(1)), 0);
    json_decref(root);
    free(path);
}

/* Replaces the header of a safetensors file: fn edits the parsed header,
 * then the file is rewritten with the new header and the old data bytes. */
typedef void (*tu_header_fn)(json_t *header, void *arg);

static inline void tu_st_edit(const char *path, tu_header_fn fn, void *arg)
{
    size_t len;
    unsigned char *buf = tu_read(path, &len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | buf[i];
    assert_true(hlen + 8 <= len);
    json_error_t jerr;
    json_t *hdr = json_loadb((const char *)buf + 8, hlen, 0, &jerr);
    assert_non_null(hdr);
    fn(hdr, arg);
    char *text = json_dumps(hdr, JSON_COMPACT);
    assert_non_null(text);
    size_t tlen = strlen(text), padded = (tlen + 7) & ~(size_t)7;
    size_t dlen = len - 8 - hlen;
    unsigned char *out = malloc(8 + padded + dlen);
    assert_non_null(out);
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(out + 8, text, tlen);
    memset(out + 8 + tlen, ' ', padded - tlen);
    memcpy(out + 8 + padded, buf + 8 + hlen, dlen);
    tu_write(path, out, 8 + padded + dlen);
    free(out);
    free(text);
    json_decref(hdr);
    free(buf);
}

/* Replaces the first 8 bytes (the header length) of a file. */
static inline void tu_st_set_hlen(const char *path, uint64_t hlen)
{
    size_t len;
    unsigned char *buf = tu_read(path, &len);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(hlen >> (8 * i));
    tu_write(path, buf, len);
    free(buf);
}

/* Asserts that loading dir fails with code and a message containing every
 * given substring (NULL-terminated list). */
static inline void tu_expect_load_error(const char *dir, int code, ...)
{
    ig_model_t *m = NULL;
    char err[512] = "";
    int rc = ig_model_load(&m, dir, err, sizeof(err));
    if (rc != code)
        fail_msg("load: got %s (%s), expected %s", ig_err_name(rc), err, ig_err_name(code));
    assert_null(m);
    va_list ap;
    va_start(ap, code);
    const char *want;
    while ((want = va_arg(ap, const char *)) != NULL) {
        if (strstr(err, want) == NULL)
            fail_msg("message \"%s\" lacks \"%s\"", err, want);
    }
    va_end(ap);
}

#endif
