#ifndef INFERGATE_JSONV_H
#define INFERGATE_JSONV_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Typed JSON getters that carry the JSON path, for every reader of a JSON
 * document (the region config, model config files, API request bodies).
 *
 * A getter reads obj[key]: absent takes the default and returns 0; a value
 * of the right type and range is stored and returns 1; anything else is a
 * fault: the getter describes it in an ig_jsonv_fault_t (path, what was
 * wanted, what was found) and returns what the reader's fail callback
 * returns, a negative IG_E* code. The checks are the same for everyone; the
 * wording of the message is the reader's (each keeps its own, which its
 * tests and users know). Values returned are borrowed from obj.
 */

/* Reader-wide rules (ig_jsonv_t.flags). */
enum {
    IG_JSONV_NULL_ABSENT = 1,   /* a null value reads as absent */
    IG_JSONV_INTEGRAL_REAL = 2, /* an integer may be spelled 16.0 (below 2^53) */
};

/* Per-call flags. */
enum {
    IG_JSONV_REQUIRED = 1, /* absent is a fault (IG_JSONV_MISSING) */
    IG_JSONV_NONEMPTY = 2, /* strings: "" is a fault (IG_JSONV_EMPTY) */
    IG_JSONV_LO_OPEN = 4,  /* numbers: the lower bound is excluded */
    IG_JSONV_HI_OPEN = 8,  /* numbers: the upper bound is excluded */
};

typedef enum {
    IG_JSONV_OBJECT,
    IG_JSONV_ARRAY,
    IG_JSONV_STRING,
    IG_JSONV_INTEGER,
    IG_JSONV_NUMBER,
    IG_JSONV_BOOLEAN,
} ig_jsonv_type_t;

typedef enum {
    IG_JSONV_MISSING, /* a required key is absent */
    IG_JSONV_TYPE,    /* the value is not of type want */
    IG_JSONV_RANGE,   /* a number outside its range */
    IG_JSONV_NUL,     /* a string holding a NUL character */
    IG_JSONV_EMPTY,   /* "" where IG_JSONV_NONEMPTY */
    IG_JSONV_CHOICE,  /* a value that is none of the choices */
    IG_JSONV_UNKNOWN, /* a key that is not in the allowed list */
} ig_jsonv_kind_t;

#define IG_JSONV_PATH_MAX 256

/* What went wrong, for the reader's message. */
typedef struct {
    ig_jsonv_kind_t kind;
    ig_jsonv_type_t want;
    const char *path;           /* "routing.hedge.budget": the prefix and the key joined */
    const char *key;            /* the key alone */
    const json_t *value;        /* what was found; NULL when missing */
    unsigned flags;             /* the call's flags (the open ends of a range) */
    int is_unsigned;            /* RANGE: ulo/uhi hold the bounds, else lo/hi or dlo/dhi */
    long long lo, hi, x;        /* RANGE of an integer: bounds and value */
    uint64_t ulo, uhi;          /* RANGE of an unsigned integer (x is the value) */
    double dlo, dhi, dx;        /* RANGE of a number */
    const char *const *choices; /* CHOICE: the names, NULL-terminated */
} ig_jsonv_fault_t;

typedef struct ig_jsonv_s ig_jsonv_t;

/* Formats the reader's message for f and returns the negative code the
 * getter then returns. */
typedef int (*ig_jsonv_fail_cb)(ig_jsonv_t *v, const ig_jsonv_fault_t *f);

struct ig_jsonv_s {
    unsigned flags; /* IG_JSONV_NULL_ABSENT, IG_JSONV_INTEGRAL_REAL */
    ig_jsonv_fail_cb fail;
    void *data; /* the reader's */
};

/* "a.b" from prefix "a" and key "b" ("b" when prefix is ""), and "a[3]";
 * truncated to IG_JSONV_PATH_MAX - 1 bytes. */
void ig_jsonv_join(char *out, const char *prefix, const char *key);
void ig_jsonv_join_index(char *out, const char *prefix, size_t i);

/* "an object", "a string", "an integer", "null", ...: for messages. */
const char *ig_jsonv_type_name(const json_t *value);

/* Faults (IG_JSONV_UNKNOWN) on the first key of obj that allowed (a
 * NULL-terminated list) does not name. 0 when all are known. */
int ig_jsonv_keys(ig_jsonv_t *v, const json_t *obj, const char *path, const char *const *allowed);

int ig_jsonv_object(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                    unsigned flags, json_t **out);
int ig_jsonv_array(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                   unsigned flags, json_t **out);
/* A string without NUL characters; *len (may be NULL) gets its length. */
int ig_jsonv_string(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                    unsigned flags, const char *def, const char **out, size_t *len);
int ig_jsonv_int(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                 unsigned flags, long long lo, long long hi, long long def, long long *out);
int ig_jsonv_uint(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                  unsigned flags, uint64_t lo, uint64_t hi, uint64_t def, uint64_t *out);
/* A finite number in [lo, hi] (ends opened by IG_JSONV_LO_OPEN/HI_OPEN;
 * hi = INFINITY for none). */
int ig_jsonv_number(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                    unsigned flags, double lo, double hi, double def, double *out);
int ig_jsonv_bool(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                  unsigned flags, int def, int *out);
/* ig_jsonv_int and ig_jsonv_bool on obj[key] already looked up (value; NULL
 * is absent): for a reader that found its members without an object, as a
 * scan does (ig_json_scan). key names the member in a fault. */
int ig_jsonv_int_at(ig_jsonv_t *v, const json_t *value, const char *path, const char *key,
                    unsigned flags, long long lo, long long hi, long long def, long long *out);
int ig_jsonv_bool_at(ig_jsonv_t *v, const json_t *value, const char *path, const char *key,
                     unsigned flags, int def, int *out);
/* A string that is one of choices (NULL-terminated): *out is its index. */
int ig_jsonv_enum(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                  unsigned flags, const char *const *choices, int def, int *out);

/* Parses a whole document the one way every reader does: duplicate keys are
 * an error (JSON_REJECT_DUPLICATES), as well as anything jansson refuses.
 * Returns a new reference, or NULL with *err filled. ig_jsonv_loadb reads
 * with ig_json_parse; the file readers with jansson's own loader. */
json_t *ig_jsonv_loadb(const char *buf, size_t len, json_error_t *err);
json_t *ig_jsonv_loadf(FILE *fp, json_error_t *err);
json_t *ig_jsonv_load_file(const char *path, json_error_t *err);

/* ---- the parser of the request path (gateway/base/json_parse.c) ---------- */

enum {
    IG_JSON_DECODE_ANY = 1,        /* any value at the top, not only an object or array */
    IG_JSON_DISABLE_EOF_CHECK = 2, /* stop after the first value; what follows is not read */
    IG_JSON_ALLOW_DUPLICATES = 4,  /* a repeated key replaces the earlier value */
};

#define IG_JSON_MAX_DEPTH 2048 /* nested objects and arrays, as jansson allows */

/*
 * Parses buf[0..len) into jansson values, accepting and refusing what
 * json_loadb(buf, len, JSON_REJECT_DUPLICATES, err) does (RFC 8259; UTF-8
 * checked; no \u0000; integers within json_int_t; reals that do not
 * overflow) at a fraction of its cost: strings and numbers are scanned in
 * place. flags: IG_JSON_* above. A new reference, or NULL with *err (may be
 * NULL) filled: text, line, column, position; the wording is this parser's.
 */
json_t *ig_json_parse(const char *buf, size_t len, int flags, json_error_t *err);

/* The bytes of one JSON value inside a buffer. */
typedef struct {
    const char *p; /* NULL: absent */
    size_t n;
} ig_json_span_t;

/*
 * Checks buf[0..len) by ig_json_parse's rules and builds nothing, except
 * that a repeated key is refused only among keys at the top. When the
 * value is an object, span[i] is the value of its member keys[i] (whose
 * names have no escapes and are shorter than 64 bytes), or {NULL, 0} when
 * it has none. Returns 1 for an object, 0 for another value, or -1 with
 * *err filled as ig_json_parse fills it.
 */
int ig_json_scan(const char *buf, size_t len, int flags, const char *const *keys, int nkeys,
                 ig_json_span_t *span, json_error_t *err);

/* A span that is an integer literal of at most 18 digits (an optional
 * minus, digits only: no fraction, no exponent): 1 with its value in *out,
 * else 0 and *out untouched. */
int ig_json_span_int(const ig_json_span_t *s, long long *out);

#endif
