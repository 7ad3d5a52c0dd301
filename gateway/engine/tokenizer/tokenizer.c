/*
 * Tokenizer loading: tokenizer.json (BPE model, added tokens, normalizer,
 * pre-tokenizer, decoder, post-processor), tokenizer_config.json and
 * generation_config.json. Every rejected input names the file and the field.
 * Encoding and decoding live in encode.c; ig_tokenizer_load(), which picks
 * this loader or gguf_vocab.c's, in load.c.
 *
 * The file is long (about 1,300 lines) but linear, in banner sections:
 * errors and hash tables, accessors, tokenizer.json's model, then its
 * normalizer, pre-tokenizer, decoder and post-processor, the tables derived
 * from them, and last the loading of the files in order. Each part validates
 * what the next relies on, which reads best as one pass.
 */
#include "internal.h"

#include "infergate/error.h"
#include "infergate/jsonv.h"
#include "infergate/utf8.h"

#include <jansson.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Ids above this are refused: they would only serve to make us allocate. */
#define IG__MAX_IDS (1 << 24)

static const char META[] = "\xE2\x96\x81"; /* U+2581, sentencepiece's space */

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

static int fail(char *err, size_t errlen, const char *file, const char *fmt, ...)
{
    if (err && errlen) {
        int n = snprintf(err, errlen, "%s: ", file);
        if (n >= 0 && (size_t)n < errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return IG_ETOKENIZER;
}

static int oom(char *err, size_t errlen, const char *file)
{
    if (err && errlen)
        snprintf(err, errlen, "%s: out of memory", file);
    return IG_ENOMEM;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Loads a JSON file; IG_ENOENT when it does not exist. Duplicate keys are an
 * error, as for every reader (base/jsonv). The config files also get every
 * number as a real: transformers writes model_max_length as 1e30, an integer
 * too big for jansson, and int_value() below reads ids back; jsonv's loader
 * takes no decoding flags, so they are read with its rule plus that one. */
static int load_json(const char *path, json_t **out, int reals, char *err, size_t errlen)
{
    json_error_t jerr;
    struct stat st;
    const char *file = base_name(path);
    *out = NULL;
    if (stat(path, &st) != 0) {
        if (err && errlen)
            snprintf(err, errlen, "%s: cannot open: %s", file, strerror(errno));
        return errno == ENOENT ? IG_ENOENT : IG_EIO;
    }
    *out = reals ? json_load_file(path, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &jerr)
                 : ig_jsonv_load_file(path, &jerr);
    if (!*out)
        return fail(err, errlen, file, "line %d column %d: %s", jerr.line, jerr.column, jerr.text);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return fail(err, errlen, file, "expected a JSON object at the top level");
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Hash tables                                                              */
/* ------------------------------------------------------------------------ */

uint64_t ig__hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

int32_t ig_tokenizer_token_id(const ig_tokenizer_t *tok, const char *s, size_t len)
{
    size_t i = (size_t)ig__hash_bytes(s, len) & tok->vh_mask;
    for (;;) {
        int32_t id = tok->vh[i];
        if (id < 0)
            return -1;
        if (tok->str_len[id] == len && memcmp(tok->str[id], s, len) == 0)
            return id;
        i = (i + 1) & tok->vh_mask;
    }
}

/* Inserts id; returns the id already holding the same string, or -1. */
static int32_t vocab_insert(ig_tokenizer_t *tok, int32_t id)
{
    size_t i = (size_t)ig__hash_bytes(tok->str[id], tok->str_len[id]) & tok->vh_mask;
    for (;;) {
        int32_t o = tok->vh[i];
        if (o < 0) {
            tok->vh[i] = id;
            return -1;
        }
        if (tok->str_len[o] == tok->str_len[id] &&
            memcmp(tok->str[o], tok->str[id], tok->str_len[id]) == 0)
            return o;
        i = (i + 1) & tok->vh_mask;
    }
}

static size_t merge_slot(uint64_t key, size_t mask)
{
    return (size_t)ig__hash_pair(key) & mask;
}

/* Inserts a merge unless the pair is already there (the first one wins). */
static void merge_insert(ig_tokenizer_t *tok, int32_t a, int32_t b, int32_t rank, int32_t out)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = merge_slot(key, tok->mh_mask);
    while (tok->mh_key[i] != UINT64_MAX) {
        if (tok->mh_key[i] == key)
            return;
        i = (i + 1) & tok->mh_mask;
    }
    tok->mh_key[i] = key;
    tok->mh_rank[i] = rank;
    tok->mh_out[i] = out;
    tok->n_merges++;
}

/* ------------------------------------------------------------------------ */
/* Accessors                                                                */
/* ------------------------------------------------------------------------ */

ig_tokenizer_style_t ig_tokenizer_style(const ig_tokenizer_t *tok)
{
    return tok->style;
}

size_t ig_tokenizer_vocab_size(const ig_tokenizer_t *tok)
{
    return tok->n_ids;
}

const char *ig_tokenizer_token_str(const ig_tokenizer_t *tok, int32_t id)
{
    if (id < 0 || (size_t)id >= tok->n_ids)
        return NULL;
    return tok->str[id];
}

int ig_tokenizer_token_bytes(const ig_tokenizer_t *tok, int32_t id, const char **bytes, size_t *len)
{
    if (id < 0 || (size_t)id >= tok->n_ids || !tok->str[id])
        return IG_EINVAL;
    *bytes = tok->bytes[id];
    *len = tok->bytes_len[id];
    return 0;
}

int32_t ig_tokenizer_bos_id(const ig_tokenizer_t *tok)
{
    return tok->bos_id;
}

int32_t ig_tokenizer_eos_id(const ig_tokenizer_t *tok)
{
    return tok->eos_id;
}

size_t ig_tokenizer_eos_ids(const ig_tokenizer_t *tok, const int32_t **ids)
{
    *ids = tok->eos_ids;
    return tok->n_eos;
}

int ig_tokenizer_adds_bos(const ig_tokenizer_t *tok)
{
    return tok->add_bos;
}

int ig_tokenizer_is_special(const ig_tokenizer_t *tok, int32_t id)
{
    return id >= 0 && (size_t)id < tok->n_ids && tok->special[id] == 1;
}

const char *ig_tokenizer_chat_template(const ig_tokenizer_t *tok)
{
    return tok->chat_template;
}

const ig_gen_defaults_t *ig_tokenizer_gen_defaults(const ig_tokenizer_t *tok)
{
    return &tok->gen;
}

void ig_tokvec_init(ig_tokvec_t *v)
{
    v->ids = NULL;
    v->len = 0;
    v->cap = 0;
}

void ig_tokvec_dispose(ig_tokvec_t *v)
{
    free(v->ids);
    ig_tokvec_init(v);
}

void ig_tokenizer_free(ig_tokenizer_t *tok)
{
    if (!tok)
        return;
    for (size_t i = 0; i < tok->n_ids; i++) {
        free(tok->str ? tok->str[i] : NULL);
        free(tok->bytes ? tok->bytes[i] : NULL);
    }
    free(tok->str);
    free(tok->str_len);
    free(tok->bytes);
    free(tok->bytes_len);
    free(tok->special);
    free(tok->vh);
    free(tok->mh_key);
    free(tok->mh_rank);
    free(tok->mh_out);
    free(tok->added);
    for (size_t i = 0; i < tok->n_norms; i++) {
        free(tok->norms[i].a);
        free(tok->norms[i].b);
    }
    free(tok->norms);
    for (size_t i = 0; i < tok->n_splits; i++)
        ig__split_dispose(&tok->splits[i]);
    free(tok->splits);
    free(tok->eos_ids);
    free(tok->chat_template);
    free(tok);
}

/* ------------------------------------------------------------------------ */
/* tokenizer.json: model                                                    */
/* ------------------------------------------------------------------------ */

typedef struct {
    const char *file;
    char *err;
    size_t errlen;
    int32_t pp_bos; /* BOS the post-processor template prepends, or -1 */
    int saw_bytelevel;
    int saw_meta;
    char *meta; /* the metaspace replacement string */
} load_ctx_t;

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static int alloc_ids(ig_tokenizer_t *tok, size_t n)
{
    tok->n_ids = n;
    tok->str = calloc(n, sizeof *tok->str);
    tok->str_len = calloc(n, sizeof *tok->str_len);
    tok->bytes = calloc(n, sizeof *tok->bytes);
    tok->bytes_len = calloc(n, sizeof *tok->bytes_len);
    tok->special = calloc(n, 1);
    tok->vh_mask = pow2_at_least(n * 2) - 1;
    tok->vh = malloc((tok->vh_mask + 1) * sizeof *tok->vh);
    if (!tok->str || !tok->str_len || !tok->bytes || !tok->bytes_len || !tok->special || !tok->vh)
        return IG_ENOMEM;
    memset(tok->vh, 0xff, (tok->vh_mask + 1) * sizeof *tok->vh);
    return 0;
}

/* Typed fields read through base/jsonv: absent or null gives the default; a
 * fault becomes "FILE: PATH: WANT" with the reader's own words for WANT. */
typedef struct {
    load_ctx_t *c;
    const char *want; /* "expected a boolean" */
} reader_t;

static int on_fault(ig_jsonv_t *v, const ig_jsonv_fault_t *f)
{
    const reader_t *r = v->data;
    return fail(r->c->err, r->c->errlen, r->c->file, "%s: %s", f->path, r->want);
}

#define READER(name, ctx, want, flags)                                                             \
    reader_t name##_r = {ctx, want};                                                               \
    ig_jsonv_t name = {IG_JSONV_NULL_ABSENT | (flags), on_fault, &name##_r}

/* obj[key] as a boolean; path is obj's own ("model", "added_tokens[3]"). */
static int get_bool(json_t *o, const char *key, int dflt, int *out, load_ctx_t *c,
                    const char *path)
{
    READER(v, c, "expected a boolean", 0);
    int rc = ig_jsonv_bool(&v, o, path, key, 0, dflt, out);
    return rc < 0 ? rc : 0;
}

static int parse_vocab_and_added(ig_tokenizer_t *tok, json_t *root, json_t *model, load_ctx_t *c)
{
    json_t *vocab = json_object_get(model, "vocab");
    json_t *added = json_object_get(root, "added_tokens");
    const char *key;
    json_t *val;
    size_t i, n = 0;
    int rc;

    if (!json_is_object(vocab))
        return fail(c->err, c->errlen, c->file, "model.vocab: expected an object");
    if (added && !json_is_null(added) && !json_is_array(added))
        return fail(c->err, c->errlen, c->file, "added_tokens: expected an array");
    json_object_foreach(vocab, key, val)
    {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) >= IG__MAX_IDS)
            return fail(c->err, c->errlen, c->file,
                        "model.vocab[\"%s\"]: expected an id between 0 and %d", key,
                        IG__MAX_IDS - 1);
        if ((size_t)json_integer_value(val) + 1 > n)
            n = (size_t)json_integer_value(val) + 1;
    }
    json_array_foreach(added, i, val)
    {
        json_t *id = json_object_get(val, "id");
        if (!json_is_object(val))
            return fail(c->err, c->errlen, c->file, "added_tokens[%zu]: expected an object", i);
        if (!json_is_string(json_object_get(val, "content")) ||
            json_string_length(json_object_get(val, "content")) == 0)
            return fail(c->err, c->errlen, c->file,
                        "added_tokens[%zu].content: expected a non-empty string", i);
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= IG__MAX_IDS)
            return fail(c->err, c->errlen, c->file,
                        "added_tokens[%zu].id: expected an id between 0 and %d", i,
                        IG__MAX_IDS - 1);
        if ((size_t)json_integer_value(id) + 1 > n)
            n = (size_t)json_integer_value(id) + 1;
    }
    if (n == 0)
        return fail(c->err, c->errlen, c->file, "model.vocab: empty vocabulary");
    /* Ids are dense in practice; a few holes are fine, but a lone huge id
     * would only make us allocate tables for nothing. */
    {
        size_t defined = json_object_size(vocab) + json_array_size(added);
        if (n > defined + defined / 4 + 4096)
            return fail(c->err, c->errlen, c->file,
                        "model.vocab: ids reach %zu but only %zu tokens are defined", n - 1,
                        defined);
    }
    if ((rc = alloc_ids(tok, n)) != 0)
        return oom(c->err, c->errlen, c->file);

    json_object_foreach(vocab, key, val)
    {
        int32_t id = (int32_t)json_integer_value(val);
        size_t len = strlen(key); /* jansson keys cannot hold NUL */
        if (tok->str[id])
            return fail(c->err, c->errlen, c->file,
                        "model.vocab[\"%s\"]: id %d is already used by \"%s\"", key, (int)id,
                        tok->str[id]);
        if (len == 0)
            return fail(c->err, c->errlen, c->file, "model.vocab: empty token string (id %d)",
                        (int)id);
        if (!(tok->str[id] = dup_n(key, len)))
            return oom(c->err, c->errlen, c->file);
        tok->str_len[id] = (uint32_t)len;
        vocab_insert(tok, id);
    }

    tok->n_added = json_array_size(added);
    tok->added = calloc(tok->n_added ? tok->n_added : 1, sizeof *tok->added);
    if (!tok->added)
        return oom(c->err, c->errlen, c->file);
    json_array_foreach(added, i, val)
    {
        json_t *jc = json_object_get(val, "content");
        json_t *sp = json_object_get(val, "special");
        const char *content = json_string_value(jc);
        size_t len = json_string_length(jc);
        int32_t id = (int32_t)json_integer_value(json_object_get(val, "id"));
        int32_t have = ig_tokenizer_token_id(tok, content, len);
        if (memchr(content, 0, len))
            return fail(c->err, c->errlen, c->file, "added_tokens[%zu].content: contains NUL", i);
        if (sp && !json_is_boolean(sp))
            return fail(c->err, c->errlen, c->file, "added_tokens[%zu].special: expected a boolean",
                        i);
        {
            char path[64];
            snprintf(path, sizeof path, "added_tokens[%zu]", i);
            if ((rc = get_bool(val, "lstrip", 0, &tok->added[i].lstrip, c, path)) != 0 ||
                (rc = get_bool(val, "rstrip", 0, &tok->added[i].rstrip, c, path)) != 0 ||
                (rc = get_bool(val, "single_word", 0, &tok->added[i].single_word, c, path)) != 0)
                return rc;
        }
        if (have >= 0 && have != id)
            return fail(c->err, c->errlen, c->file,
                        "added_tokens[%zu]: \"%s\" has id %d but model.vocab gives it %d", i,
                        content, (int)id, (int)have);
        if (have < 0) {
            if (tok->str[id])
                return fail(c->err, c->errlen, c->file,
                            "added_tokens[%zu]: id %d of \"%s\" is already used by \"%s\"", i,
                            (int)id, content, tok->str[id]);
            if (!(tok->str[id] = dup_n(content, len)))
                return oom(c->err, c->errlen, c->file);
            tok->str_len[id] = (uint32_t)len;
            vocab_insert(tok, id);
        }
        tok->special[id] = json_is_true(sp) ? 1 : 2;
        tok->added[i].id = id;
        tok->added[i].content = tok->str[id];
        tok->added[i].len = (uint32_t)len;
        tok->added[i].special = json_is_true(sp);
        tok->added_first[(unsigned char)content[0]] = 1;
    }
    return 0;
}

static int cmp_added(const void *a, const void *b)
{
    const ig__added_t *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int parse_merges(ig_tokenizer_t *tok, json_t *model, load_ctx_t *c)
{
    json_t *merges = json_object_get(model, "merges");
    json_t *m;
    size_t i, n;
    char *buf = NULL;
    size_t bufcap = 0;
    int rc = 0;

    if (merges == NULL || json_is_null(merges))
        merges = NULL;
    else if (!json_is_array(merges))
        return fail(c->err, c->errlen, c->file, "model.merges: expected an array");
    n = json_array_size(merges);
    tok->mh_mask = pow2_at_least(n * 2 + 2) - 1;
    tok->mh_key = malloc((tok->mh_mask + 1) * sizeof *tok->mh_key);
    tok->mh_rank = malloc((tok->mh_mask + 1) * sizeof *tok->mh_rank);
    tok->mh_out = malloc((tok->mh_mask + 1) * sizeof *tok->mh_out);
    if (!tok->mh_key || !tok->mh_rank || !tok->mh_out)
        return oom(c->err, c->errlen, c->file);
    memset(tok->mh_key, 0xff, (tok->mh_mask + 1) * sizeof *tok->mh_key);

    json_array_foreach(merges, i, m)
    {
        const char *a, *b;
        size_t alen, blen;
        int32_t ia, ib, io;
        if (json_is_string(m)) {
            const char *s = json_string_value(m);
            const char *sp = strchr(s, ' ');
            if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' ')) {
                rc = fail(c->err, c->errlen, c->file,
                          "model.merges[%zu]: expected \"left right\" with one space, got \"%s\"",
                          i, s);
                goto fail;
            }
            a = s;
            alen = (size_t)(sp - s);
            b = sp + 1;
            blen = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            alen = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            blen = json_string_length(json_array_get(m, 1));
        } else {
            rc = fail(c->err, c->errlen, c->file,
                      "model.merges[%zu]: expected \"left right\" or [left, right]", i);
            goto fail;
        }
        if ((ia = ig_tokenizer_token_id(tok, a, alen)) < 0) {
            rc = fail(c->err, c->errlen, c->file, "model.merges[%zu]: unknown token \"%.*s\"", i,
                      (int)alen, a);
            goto fail;
        }
        if ((ib = ig_tokenizer_token_id(tok, b, blen)) < 0) {
            rc = fail(c->err, c->errlen, c->file, "model.merges[%zu]: unknown token \"%.*s\"", i,
                      (int)blen, b);
            goto fail;
        }
        if (alen + blen > bufcap) {
            char *nb = realloc(buf, (alen + blen) * 2);
            if (!nb) {
                rc = oom(c->err, c->errlen, c->file);
                goto fail;
            }
            buf = nb;
            bufcap = (alen + blen) * 2;
        }
        memcpy(buf, a, alen);
        memcpy(buf + alen, b, blen);
        if ((io = ig_tokenizer_token_id(tok, buf, alen + blen)) < 0) {
            rc = fail(c->err, c->errlen, c->file,
                      "model.merges[%zu]: merged token \"%.*s\" is not in model.vocab", i,
                      (int)(alen + blen), buf);
            goto fail;
        }
        merge_insert(tok, ia, ib, (int32_t)i, io);
    }
fail:
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* tokenizer.json: normalizer, pre-tokenizer, decoder, post-processor        */
/* ------------------------------------------------------------------------ */

static const char *type_of(json_t *o)
{
    const char *t = json_string_value(json_object_get(o, "type"));
    return t ? t : "";
}

static int add_norm(ig_tokenizer_t *tok, ig__norm_kind_t kind, const char *a, size_t alen,
                    const char *b, size_t blen, load_ctx_t *c)
{
    ig__norm_t *n = realloc(tok->norms, (tok->n_norms + 1) * sizeof *n);
    if (!n)
        return oom(c->err, c->errlen, c->file);
    tok->norms = n;
    n += tok->n_norms++;
    n->kind = kind;
    n->a = dup_n(a, alen);
    n->alen = alen;
    n->b = b ? dup_n(b, blen) : NULL;
    n->blen = blen;
    if (!n->a || (b && !n->b))
        return oom(c->err, c->errlen, c->file);
    return 0;
}

static int parse_normalizer(ig_tokenizer_t *tok, json_t *n, const char *path, load_ctx_t *c)
{
    const char *t;
    char sub[256];
    if (!n || json_is_null(n))
        return 0;
    if (!json_is_object(n))
        return fail(c->err, c->errlen, c->file, "%s: expected an object", path);
    t = type_of(n);
    if (strcmp(t, "Sequence") == 0) {
        json_t *arr = json_object_get(n, "normalizers"), *x;
        size_t i;
        if (!json_is_array(arr))
            return fail(c->err, c->errlen, c->file, "%s.normalizers: expected an array", path);
        json_array_foreach(arr, i, x)
        {
            int rc;
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", path, i);
            if ((rc = parse_normalizer(tok, x, sub, c)) != 0)
                return rc;
        }
        return 0;
    }
    if (strcmp(t, "Prepend") == 0) {
        json_t *p = json_object_get(n, "prepend");
        if (!json_is_string(p) || json_string_length(p) == 0)
            return fail(c->err, c->errlen, c->file, "%s.prepend: expected a non-empty string",
                        path);
        return add_norm(tok, IG__NORM_PREPEND, json_string_value(p), json_string_length(p), NULL, 0,
                        c);
    }
    if (strcmp(t, "Replace") == 0) {
        json_t *pat = json_object_get(json_object_get(n, "pattern"), "String");
        json_t *content = json_object_get(n, "content");
        if (!json_is_string(pat) || json_string_length(pat) == 0)
            return fail(c->err, c->errlen, c->file,
                        "%s.pattern: only a non-empty {\"String\": ...} pattern is supported",
                        path);
        if (!json_is_string(content))
            return fail(c->err, c->errlen, c->file, "%s.content: expected a string", path);
        if (strcmp(json_string_value(pat), " ") == 0)
            c->saw_meta = 1;
        return add_norm(tok, IG__NORM_REPLACE, json_string_value(pat), json_string_length(pat),
                        json_string_value(content), json_string_length(content), c);
    }
    if (strcmp(t, "NFC") == 0)
        return add_norm(tok, IG__NORM_NFC, "", 0, NULL, 0, c);
    return fail(c->err, c->errlen, c->file, "%s.type: unsupported normalizer \"%s\"", path, t);
}

/* ByteLevel's own split (`use_regex: true`), GPT-2's pattern. */
static const char PAT_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Appends a Split step; path names the pattern in errors. */
static int add_split(ig_tokenizer_t *tok, const char *pat, size_t len, int literal,
                     ig__split_behavior_t beh, int invert, const char *path, load_ctx_t *c)
{
    ig__split_step_t *ns;
    char msg[300];
    int rc;
    if (tok->cut == IG__CUT_METASPACE)
        return fail(c->err, c->errlen, c->file,
                    "%s: a Split after a splitting Metaspace is not supported", path);
    if (!(ns = realloc(tok->splits, (tok->n_splits + 1) * sizeof *ns)))
        return oom(c->err, c->errlen, c->file);
    tok->splits = ns;
    if ((rc = ig__split_init(&ns[tok->n_splits], pat, len, literal, beh, invert, msg,
                             sizeof msg)) != 0) {
        if (rc == IG_ENOMEM)
            return oom(c->err, c->errlen, c->file);
        return fail(c->err, c->errlen, c->file, "%s: %s", path, msg);
    }
    tok->n_splits++;
    return 0;
}

static int parse_split(ig_tokenizer_t *tok, json_t *p, const char *path, load_ctx_t *c)
{
    static const struct {
        const char *name;
        ig__split_behavior_t beh;
    } BEH[] = {{"Isolated", IG__SPLIT_ISOLATED},
               {"Removed", IG__SPLIT_REMOVED},
               {"MergedWithPrevious", IG__SPLIT_MERGED_WITH_PREVIOUS},
               {"MergedWithNext", IG__SPLIT_MERGED_WITH_NEXT},
               {"Contiguous", IG__SPLIT_CONTIGUOUS}};
    json_t *pat = json_object_get(p, "pattern");
    json_t *re = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
    const char *beh = json_string_value(json_object_get(p, "behavior"));
    char sub[300];
    int invert, rc;
    size_t k;
    if ((rc = get_bool(p, "invert", 0, &invert, c, path)) != 0)
        return rc;
    if (!json_is_object(pat) || json_object_size(pat) != 1 ||
        !(json_is_string(re) || json_is_string(str)))
        return fail(c->err, c->errlen, c->file,
                    "%s.pattern: expected {\"Regex\": \"...\"} or {\"String\": \"...\"}", path);
    for (k = 0; beh && k < sizeof BEH / sizeof BEH[0]; k++)
        if (strcmp(beh, BEH[k].name) == 0)
            break;
    if (!beh || k == sizeof BEH / sizeof BEH[0])
        return fail(c->err, c->errlen, c->file,
                    "%s.behavior: expected \"Isolated\", \"Removed\", \"MergedWithPrevious\", "
                    "\"MergedWithNext\" or \"Contiguous\"",
                    path);
    snprintf(sub, sizeof sub, "%s.pattern.%s", path, re ? "Regex" : "String");
    if (re)
        return add_split(tok, json_string_value(re), json_string_length(re), 0, BEH[k].beh, invert,
                         sub, c);
    return add_split(tok, json_string_value(str), json_string_length(str), 1, BEH[k].beh, invert,
                     sub, c);
}

static int parse_meta_fields(json_t *o, const char *path, load_ctx_t *c, int *prepend)
{
    json_t *ps = json_object_get(o, "prepend_scheme");
    json_t *rep = json_object_get(o, "replacement");
    int aps, rc;
    if (rep && !json_is_null(rep)) {
        if (!json_is_string(rep) || json_string_length(rep) == 0)
            return fail(c->err, c->errlen, c->file, "%s.replacement: expected a string", path);
        if (strcmp(json_string_value(rep), META) != 0)
            return fail(c->err, c->errlen, c->file,
                        "%s.replacement: only \"\xE2\x96\x81\" (U+2581) is supported", path);
    }
    if (ps && !json_is_null(ps)) {
        const char *s = json_string_value(ps);
        if (s && strcmp(s, "always") == 0)
            *prepend = 1;
        else if (s && strcmp(s, "first") == 0)
            *prepend = 2;
        else if (s && strcmp(s, "never") == 0)
            *prepend = 0;
        else
            return fail(c->err, c->errlen, c->file,
                        "%s.prepend_scheme: expected \"always\", \"first\" or \"never\"", path);
        return 0;
    }
    if ((rc = get_bool(o, "add_prefix_space", 1, &aps, c, path)) != 0)
        return rc;
    *prepend = aps;
    return 0;
}

static int parse_pretok(ig_tokenizer_t *tok, json_t *p, const char *path, load_ctx_t *c)
{
    const char *t;
    char sub[256];
    int rc;
    if (!p || json_is_null(p))
        return 0;
    if (!json_is_object(p))
        return fail(c->err, c->errlen, c->file, "%s: expected an object", path);
    t = type_of(p);
    if (strcmp(t, "Sequence") == 0) {
        json_t *arr = json_object_get(p, "pretokenizers"), *x;
        size_t i;
        if (!json_is_array(arr))
            return fail(c->err, c->errlen, c->file, "%s.pretokenizers: expected an array", path);
        json_array_foreach(arr, i, x)
        {
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", path, i);
            if ((rc = parse_pretok(tok, x, sub, c)) != 0)
                return rc;
        }
        return 0;
    }
    if (strcmp(t, "ByteLevel") == 0) {
        int use_regex;
        if ((rc = get_bool(p, "add_prefix_space", 0, &tok->add_prefix_space, c, path)) != 0)
            return rc;
        if ((rc = get_bool(p, "use_regex", 1, &use_regex, c, path)) != 0)
            return rc;
        /* The prefix space is added to the text before any split; after a
         * Split the library adds it to every piece, which is not done. */
        if (tok->add_prefix_space && tok->n_splits)
            return fail(c->err, c->errlen, c->file,
                        "%s.add_prefix_space: true after a Split is not supported", path);
        c->saw_bytelevel = 1;
        if (use_regex)
            return add_split(tok, PAT_GPT2, strlen(PAT_GPT2), 0, IG__SPLIT_ISOLATED, 0, path, c);
        return 0;
    }
    if (strcmp(t, "Split") == 0)
        return parse_split(tok, p, path, c);
    if (strcmp(t, "Metaspace") == 0) {
        int split;
        if ((rc = parse_meta_fields(p, path, c, &tok->meta_prepend)) != 0)
            return rc;
        if ((rc = get_bool(p, "split", 1, &split, c, path)) != 0)
            return rc;
        c->saw_meta = 1;
        tok->metaspace = 1;
        if (split && (tok->n_splits || tok->cut != IG__CUT_NONE))
            return fail(c->err, c->errlen, c->file,
                        "%s: a second splitting pre-tokenizer is not supported", path);
        if (split)
            tok->cut = IG__CUT_METASPACE;
        return 0;
    }
    return fail(c->err, c->errlen, c->file, "%s.type: unsupported pre-tokenizer \"%s\"", path, t);
}

static int parse_decoder(ig_tokenizer_t *tok, json_t *d, const char *path, load_ctx_t *c)
{
    const char *t;
    char sub[256];
    int rc;
    if (!d || json_is_null(d))
        return 0;
    if (!json_is_object(d))
        return fail(c->err, c->errlen, c->file, "%s: expected an object", path);
    t = type_of(d);
    if (strcmp(t, "Sequence") == 0) {
        json_t *arr = json_object_get(d, "decoders"), *x;
        size_t i;
        if (!json_is_array(arr))
            return fail(c->err, c->errlen, c->file, "%s.decoders: expected an array", path);
        json_array_foreach(arr, i, x)
        {
            snprintf(sub, sizeof sub, "%s.decoders[%zu]", path, i);
            if ((rc = parse_decoder(tok, x, sub, c)) != 0)
                return rc;
        }
        return 0;
    }
    if (strcmp(t, "ByteLevel") == 0) {
        c->saw_bytelevel = 1;
        return 0;
    }
    if (strcmp(t, "ByteFallback") == 0 || strcmp(t, "Fuse") == 0)
        return 0;
    if (strcmp(t, "Replace") == 0) {
        const char *pat =
            json_string_value(json_object_get(json_object_get(d, "pattern"), "String"));
        const char *content = json_string_value(json_object_get(d, "content"));
        if (!pat || !content || strcmp(pat, META) != 0 || strcmp(content, " ") != 0)
            return fail(c->err, c->errlen, c->file,
                        "%s: only Replace of \"\xE2\x96\x81\" by \" \" is supported", path);
        return 0;
    }
    if (strcmp(t, "Strip") == 0) {
        json_t *content = json_object_get(d, "content");
        json_t *start = json_object_get(d, "start"), *stop = json_object_get(d, "stop");
        if (!json_is_string(content) || strcmp(json_string_value(content), " ") != 0 ||
            !json_is_integer(start) || !json_is_integer(stop) || json_integer_value(stop) != 0 ||
            json_integer_value(start) < 0 || json_integer_value(start) > 1)
            return fail(c->err, c->errlen, c->file,
                        "%s: only Strip of at most one leading \" \" is supported", path);
        if (json_integer_value(start) == 1)
            tok->strip_leading_space = 1;
        return 0;
    }
    if (strcmp(t, "Metaspace") == 0) {
        int prepend;
        if ((rc = parse_meta_fields(d, path, c, &prepend)) != 0)
            return rc;
        if (prepend)
            tok->strip_leading_space = 1;
        c->saw_meta = 1;
        return 0;
    }
    return fail(c->err, c->errlen, c->file, "%s.type: unsupported decoder \"%s\"", path, t);
}

/* Finds the special token a TemplateProcessing puts first, as BOS. */
static int parse_post(ig_tokenizer_t *tok, json_t *p, const char *path, load_ctx_t *c)
{
    const char *t;
    char sub[256];
    int rc;
    if (!p || json_is_null(p) || !json_is_object(p))
        return 0;
    t = type_of(p);
    if (strcmp(t, "Sequence") == 0) {
        json_t *arr = json_object_get(p, "processors"), *x;
        size_t i;
        json_array_foreach(arr, i, x)
        {
            snprintf(sub, sizeof sub, "%s.processors[%zu]", path, i);
            if ((rc = parse_post(tok, x, sub, c)) != 0)
                return rc;
        }
        return 0;
    }
    if (strcmp(t, "TemplateProcessing") == 0) {
        json_t *single = json_object_get(p, "single");
        json_t *first = json_array_get(single, 0);
        json_t *sp = json_object_get(first, "SpecialToken");
        const char *name = json_string_value(json_object_get(sp, "id"));
        if (!json_is_array(single))
            return fail(c->err, c->errlen, c->file, "%s.single: expected an array", path);
        if (name) {
            int32_t id = ig_tokenizer_token_id(tok, name, strlen(name));
            if (id < 0)
                return fail(c->err, c->errlen, c->file,
                            "%s.single[0].SpecialToken.id: unknown token \"%s\"", path, name);
            c->pp_bos = id;
        }
    }
    /* Other post-processors (ByteLevel offsets, BERT/RoBERTa pairs) add no BOS. */
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Derived tables                                                           */
/* ------------------------------------------------------------------------ */

static int hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

/* Returns the byte of a "<0xHH>" token, or -1. */
static int fallback_byte(const char *s, size_t n)
{
    int h, l;
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    h = hexval((unsigned char)s[3]);
    l = hexval((unsigned char)s[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
}

static int build_token_bytes(ig_tokenizer_t *tok, load_ctx_t *c)
{
    for (size_t id = 0; id < tok->n_ids; id++) {
        const char *s = tok->str[id];
        size_t n = tok->str_len[id], o = 0, i = 0;
        char *out;
        if (!s)
            continue;
        if (!(out = malloc(n + 1)))
            return oom(c->err, c->errlen, c->file);
        tok->bytes[id] = out;
        if (tok->special[id]) {
            memcpy(out, s, n);
            o = n;
        } else if (tok->style == IG_TOKENIZER_BYTE_LEVEL) {
            while (i < n) {
                uint32_t cp;
                size_t l = ig_utf8_decode(s + i, n - i, &cp);
                int b = l ? ig__cp_to_byte(cp) : -1;
                if (!l)
                    l = 1;
                if (b >= 0) {
                    out[o++] = (char)b;
                } else {
                    memcpy(out + o, s + i, l);
                    o += l;
                }
                i += l;
            }
        } else {
            int b = tok->byte_fallback ? fallback_byte(s, n) : -1;
            if (b >= 0) {
                out[o++] = (char)b;
            } else {
                while (i < n) {
                    if (n - i >= 3 && memcmp(s + i, META, 3) == 0) {
                        out[o++] = ' ';
                        i += 3;
                    } else {
                        out[o++] = s[i++];
                    }
                }
            }
        }
        out[o] = 0;
        tok->bytes_len[id] = (uint32_t)o;
    }
    return 0;
}

/* Whether some token has "▁" right after another character (see
 * IG__CUT_SPM_RUNS). */
static int meta_inside_token(const ig_tokenizer_t *tok)
{
    for (size_t id = 0; id < tok->n_ids; id++) {
        const char *s = tok->str[id];
        size_t n = tok->str_len[id];
        if (!s || tok->special[id])
            continue;
        for (size_t i = 1; i + 3 <= n; i++)
            if (memcmp(s + i, META, 3) == 0 && !(i >= 3 && memcmp(s + i - 3, META, 3) == 0))
                return 1;
    }
    return 0;
}

static int build_tables(ig_tokenizer_t *tok, json_t *model, load_ctx_t *c)
{
    json_t *unk = json_object_get(model, "unk_token");
    int rc;
    char name[8];

    tok->unk_id = -1;
    if (unk && !json_is_null(unk)) {
        if (!json_is_string(unk))
            return fail(c->err, c->errlen, c->file, "model.unk_token: expected a string");
        tok->unk_id = ig_tokenizer_token_id(tok, json_string_value(unk), json_string_length(unk));
        if (tok->unk_id < 0)
            return fail(c->err, c->errlen, c->file, "model.unk_token: unknown token \"%s\"",
                        json_string_value(unk));
    }
    if ((rc = get_bool(model, "byte_fallback", 0, &tok->byte_fallback, c, "model")) != 0)
        return rc;
    if ((rc = get_bool(model, "ignore_merges", 0, &tok->ignore_merges, c, "model")) != 0)
        return rc;
    if ((rc = get_bool(model, "fuse_unk", 0, &tok->fuse_unk, c, "model")) != 0)
        return rc;
    {
        json_t *csp = json_object_get(model, "continuing_subword_prefix");
        json_t *eow = json_object_get(model, "end_of_word_suffix");
        if ((csp && !json_is_null(csp) && json_string_length(csp)) ||
            (eow && !json_is_null(eow) && json_string_length(eow)))
            return fail(c->err, c->errlen, c->file,
                        "model.continuing_subword_prefix: subword prefixes and suffixes are not "
                        "supported");
    }
    for (int b = 0; b < 256; b++) {
        tok->byte_id[b] = -1;
        tok->fb_id[b] = -1;
    }
    if (tok->style == IG_TOKENIZER_BYTE_LEVEL) {
        for (int b = 0; b < 256; b++) {
            char s[4];
            size_t l = ig_utf8_encode(ig__byte_to_cp((unsigned char)b), s);
            tok->byte_id[b] = ig_tokenizer_token_id(tok, s, l);
            if (tok->byte_id[b] < 0 && tok->unk_id < 0)
                return fail(c->err, c->errlen, c->file,
                            "model.vocab: byte-level vocabulary lacks \"%.*s\" (byte 0x%02X) and "
                            "has no unk_token",
                            (int)l, s, b);
        }
    } else {
        for (int b = 0; b < 128; b++) {
            char s = (char)b;
            tok->ascii_id[b] = b ? ig_tokenizer_token_id(tok, &s, 1) : -1;
        }
        if (tok->cut == IG__CUT_NONE && !tok->n_splits && !meta_inside_token(tok))
            tok->cut = IG__CUT_SPM_RUNS;
        if (tok->byte_fallback) {
            for (int b = 0; b < 256; b++) {
                snprintf(name, sizeof name, "<0x%02X>", b);
                tok->fb_id[b] = ig_tokenizer_token_id(tok, name, 6);
                if (tok->fb_id[b] < 0)
                    return fail(c->err, c->errlen, c->file,
                                "model.byte_fallback: the vocabulary lacks \"%s\"", name);
            }
        }
    }
    return build_token_bytes(tok, c);
}

/* ------------------------------------------------------------------------ */
/* tokenizer_config.json and generation_config.json                         */
/* ------------------------------------------------------------------------ */

/* A token in tokenizer_config: a string, {"content": ...}, or null. */
static int config_token(ig_tokenizer_t *tok, json_t *cfg, const char *key, int32_t *id,
                        load_ctx_t *c)
{
    json_t *v = json_object_get(cfg, key);
    const char *s;
    *id = -1;
    if (!v || json_is_null(v))
        return 0;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!json_is_string(v))
        return fail(c->err, c->errlen, c->file, "%s: expected a string or {\"content\": ...}", key);
    s = json_string_value(v);
    if (json_string_length(v) == 0)
        return 0;
    if ((*id = ig_tokenizer_token_id(tok, s, json_string_length(v))) < 0)
        return fail(c->err, c->errlen, c->file, "%s: \"%s\" is not a token of tokenizer.json", key,
                    s);
    return 0;
}

static int add_eos(ig_tokenizer_t *tok, int32_t id, load_ctx_t *c)
{
    int32_t *n;
    for (size_t i = 0; i < tok->n_eos; i++)
        if (tok->eos_ids[i] == id)
            return 0;
    if (!(n = realloc(tok->eos_ids, (tok->n_eos + 1) * sizeof *n)))
        return oom(c->err, c->errlen, c->file);
    tok->eos_ids = n;
    n[tok->n_eos++] = id;
    return 0;
}

static int parse_config(ig_tokenizer_t *tok, json_t *cfg, load_ctx_t *c, int32_t *bos, int *add_bos)
{
    json_t *ab = json_object_get(cfg, "add_bos_token");
    json_t *ct = json_object_get(cfg, "chat_template");
    int32_t eos;
    int rc;

    if ((rc = config_token(tok, cfg, "bos_token", bos, c)) != 0)
        return rc;
    if ((rc = config_token(tok, cfg, "eos_token", &eos, c)) != 0)
        return rc;
    if (eos >= 0 && (rc = add_eos(tok, eos, c)) != 0)
        return rc;
    if (ab && !json_is_null(ab)) {
        if (!json_is_boolean(ab))
            return fail(c->err, c->errlen, c->file, "add_bos_token: expected a boolean");
        *add_bos = json_is_true(ab);
    }
    if (ct && !json_is_null(ct)) {
        const char *s = NULL;
        if (json_is_string(ct)) {
            s = json_string_value(ct);
        } else if (json_is_array(ct)) {
            size_t i;
            json_t *x;
            json_array_foreach(ct, i, x)
            {
                const char *name = json_string_value(json_object_get(x, "name"));
                const char *tpl = json_string_value(json_object_get(x, "template"));
                if (!name || !tpl)
                    return fail(c->err, c->errlen, c->file,
                                "chat_template[%zu]: expected {\"name\", \"template\"}", i);
                if (strcmp(name, "default") == 0 || !s)
                    s = tpl;
            }
        } else {
            return fail(c->err, c->errlen, c->file,
                        "chat_template: expected a string or a list of named templates");
        }
        if (s && !(tok->chat_template = strdup(s)))
            return oom(c->err, c->errlen, c->file);
    }
    return 0;
}

/* A number with an integral value in [0, max]: *out gets it. */
static int int_value(json_t *v, double max, int64_t *out)
{
    double d;
    if (!json_is_number(v))
        return 0;
    d = json_number_value(v);
    if (!(d >= 0 && d <= max) || d != (double)(int64_t)d)
        return 0;
    *out = (int64_t)d;
    return 1;
}

static int gen_id(ig_tokenizer_t *tok, json_t *v, const char *path, int32_t *id, load_ctx_t *c)
{
    int64_t x;
    if (!int_value(v, (double)tok->n_ids - 1, &x))
        return fail(c->err, c->errlen, c->file, "%s: expected a token id below %zu", path,
                    tok->n_ids);
    *id = (int32_t)x;
    return 0;
}

static int gen_num(json_t *g, const char *key, int *has, double *out, load_ctx_t *c)
{
    READER(v, c, "expected a number", 0);
    int rc = ig_jsonv_number(&v, g, "", key, 0, -INFINITY, INFINITY, *out, out);
    if (rc < 0)
        return rc;
    *has |= rc;
    return 0;
}

/* A non-negative int (an integral number: the file is read INT_AS_REAL). */
static int gen_count(json_t *g, const char *key, int *has, int *out, load_ctx_t *c)
{
    READER(v, c, "expected a non-negative integer", IG_JSONV_INTEGRAL_REAL);
    long long x;
    int rc = ig_jsonv_int(&v, g, "", key, 0, 0, INT32_MAX, *out, &x);
    if (rc < 0)
        return rc;
    *has |= rc;
    *out = (int)x;
    return 0;
}

static int parse_gen(ig_tokenizer_t *tok, json_t *g, load_ctx_t *c, int32_t *bos)
{
    json_t *e = json_object_get(g, "eos_token_id");
    json_t *b = json_object_get(g, "bos_token_id");
    json_t *v;
    int32_t id = -1;
    int rc;
    ig_gen_defaults_t *gd = &tok->gen;

    if (b && !json_is_null(b)) {
        if ((rc = gen_id(tok, b, "bos_token_id", &id, c)) != 0)
            return rc;
        *bos = id;
    }
    if (json_is_array(e)) {
        size_t i;
        char path[64];
        json_array_foreach(e, i, v)
        {
            snprintf(path, sizeof path, "eos_token_id[%zu]", i);
            if ((rc = gen_id(tok, v, path, &id, c)) != 0 || (rc = add_eos(tok, id, c)) != 0)
                return rc;
        }
    } else if (e && !json_is_null(e)) {
        if ((rc = gen_id(tok, e, "eos_token_id", &id, c)) != 0 || (rc = add_eos(tok, id, c)) != 0)
            return rc;
    }
    if ((rc = gen_num(g, "temperature", &gd->has_temperature, &gd->temperature, c)) != 0 ||
        (rc = gen_num(g, "top_p", &gd->has_top_p, &gd->top_p, c)) != 0 ||
        (rc = gen_num(g, "repetition_penalty", &gd->has_repetition_penalty, &gd->repetition_penalty,
                      c)) != 0)
        return rc;
    if ((rc = gen_count(g, "top_k", &gd->has_top_k, &gd->top_k, c)) != 0 ||
        (rc = gen_count(g, "max_new_tokens", &gd->has_max_new_tokens, &gd->max_new_tokens, c)) !=
            0)
        return rc;
    {
        READER(r, c, "expected a boolean", 0);
        if ((rc = ig_jsonv_bool(&r, g, "", "do_sample", 0, gd->do_sample, &gd->do_sample)) < 0)
            return rc;
        gd->has_do_sample = rc;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Loading                                                                  */
/* ------------------------------------------------------------------------ */

int ig_tokenizer_load_files(const char *tokenizer_json, const char *config, const char *gen_config,
                            ig_tokenizer_t **out, char *err, size_t errlen)
{
    ig_tokenizer_t *tok = NULL;
    json_t *root = NULL, *cfg = NULL, *gen = NULL, *model;
    load_ctx_t c = {base_name(tokenizer_json), err, errlen, -1, 0, 0, NULL};
    int32_t cfg_bos = -1, gen_bos = -1;
    int add_bos = -1;
    int rc;
    const char *mtype;

    *out = NULL;
    if (err && errlen)
        err[0] = 0;
    if ((rc = load_json(tokenizer_json, &root, 0, err, errlen)) != 0)
        goto fail;
    if (!(tok = calloc(1, sizeof *tok))) {
        rc = oom(err, errlen, c.file);
        goto fail;
    }
    tok->bos_id = tok->eos_id = tok->unk_id = -1;
    model = json_object_get(root, "model");
    if (!json_is_object(model)) {
        rc = fail(err, errlen, c.file, "model: expected an object");
        goto fail;
    }
    mtype = json_string_value(json_object_get(model, "type"));
    if (mtype && strcmp(mtype, "BPE") != 0) {
        rc = fail(err, errlen, c.file, "model.type: unsupported model \"%s\" (only BPE)", mtype);
        goto fail;
    }
    if ((rc = parse_vocab_and_added(tok, root, model, &c)) != 0 ||
        (rc = parse_merges(tok, model, &c)) != 0 ||
        (rc = parse_normalizer(tok, json_object_get(root, "normalizer"), "normalizer", &c)) != 0 ||
        (rc = parse_pretok(tok, json_object_get(root, "pre_tokenizer"), "pre_tokenizer", &c)) !=
            0 ||
        (rc = parse_decoder(tok, json_object_get(root, "decoder"), "decoder", &c)) != 0 ||
        (rc = parse_post(tok, json_object_get(root, "post_processor"), "post_processor", &c)) != 0)
        goto fail;
    qsort(tok->added, tok->n_added, sizeof *tok->added, cmp_added);
    if (c.saw_bytelevel && (c.saw_meta || tok->cut == IG__CUT_METASPACE)) {
        rc = fail(err, errlen, c.file, "pre_tokenizer: mixes ByteLevel and Metaspace");
        goto fail;
    }
    tok->style = c.saw_bytelevel ? IG_TOKENIZER_BYTE_LEVEL : IG_TOKENIZER_SENTENCEPIECE;
    if ((rc = build_tables(tok, model, &c)) != 0)
        goto fail;

    if (config) {
        c.file = base_name(config);
        rc = load_json(config, &cfg, 1, err, errlen);
        if (rc == IG_ENOENT) {
            rc = 0;
        } else if (rc != 0 || (rc = parse_config(tok, cfg, &c, &cfg_bos, &add_bos)) != 0) {
            goto fail;
        }
    }
    if (gen_config) {
        c.file = base_name(gen_config);
        rc = load_json(gen_config, &gen, 1, err, errlen);
        if (rc == IG_ENOENT) {
            rc = 0;
        } else if (rc != 0 || (rc = parse_gen(tok, gen, &c, &gen_bos)) != 0) {
            goto fail;
        }
    }
    tok->bos_id = cfg_bos >= 0 ? cfg_bos : c.pp_bos >= 0 ? c.pp_bos : gen_bos;
    tok->add_bos = add_bos >= 0 ? add_bos : c.pp_bos >= 0;
    if (tok->add_bos && tok->bos_id < 0) {
        c.file = config ? base_name(config) : "tokenizer_config.json";
        rc = fail(err, errlen, c.file, "add_bos_token: true but no bos_token is defined");
        goto fail;
    }
    tok->eos_id = tok->n_eos ? tok->eos_ids[0] : -1;
    json_decref(root);
    json_decref(cfg);
    json_decref(gen);
    *out = tok;
    return 0;

fail:
    if (rc == IG_ENOMEM && err && errlen && !err[0])
        snprintf(err, errlen, "%s: out of memory", c.file);
    json_decref(root);
    json_decref(cfg);
    json_decref(gen);
    ig_tokenizer_free(tok);
    return rc;
}
