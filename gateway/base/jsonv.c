/*
 * Typed JSON getters that carry the JSON path. Each getter finds the value,
 * decides absent / good / fault, and leaves the sentence to the reader's
 * fail callback (include/infergate/jsonv.h).
 */
#include "infergate/jsonv.h"

#include "infergate/error.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- paths ---------------------------------------------------------------- */

/* Appends s at out[at], truncating (a cut path is still readable). */
static void append(char *out, size_t at, const char *s)
{
    size_t n = strlen(s);
    if (at >= IG_JSONV_PATH_MAX - 1)
        return;
    if (n > IG_JSONV_PATH_MAX - 1 - at)
        n = IG_JSONV_PATH_MAX - 1 - at;
    memcpy(out + at, s, n);
    out[at + n] = '\0';
}

void ig_jsonv_join(char *out, const char *prefix, const char *key)
{
    out[0] = '\0';
    append(out, 0, prefix);
    if (prefix[0] != '\0')
        append(out, strlen(out), ".");
    append(out, strlen(out), key);
}

void ig_jsonv_join_index(char *out, const char *prefix, size_t i)
{
    char idx[32];
    snprintf(idx, sizeof(idx), "[%zu]", i);
    out[0] = '\0';
    append(out, 0, prefix);
    append(out, strlen(out), idx);
}

const char *ig_jsonv_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "?";
}

/* ---- the common part ------------------------------------------------------ */

/* A getter's look-up: the value, its path, and the fault to fill. The path
 * is joined only for a fault: most look-ups find their value, or nothing,
 * and a request body has dozens of them. */
typedef struct {
    char path[IG_JSONV_PATH_MAX];
    const char *prefix;
    ig_jsonv_fault_t f;
    const json_t *value;
} look_t;

/* Reports the fault filled in l, with its path joined now. */
static int report(ig_jsonv_t *v, look_t *l)
{
    ig_jsonv_join(l->path, l->prefix, l->f.key);
    l->f.path = l->path;
    return v->fail(v, &l->f);
}

/* 0: absent (or a required key missing: *rc is the fault's code); 1: present.
 * value is obj[key], looked up by the caller (NULL: absent). */
static int look_at(ig_jsonv_t *v, look_t *l, const json_t *value, const char *path, const char *key,
                   unsigned flags, ig_jsonv_type_t want, int *rc)
{
    memset(&l->f, 0, sizeof(l->f));
    l->prefix = path;
    l->f.key = key;
    l->f.want = want;
    l->f.flags = flags;
    l->value = value;
    if (l->value != NULL && json_is_null(l->value) && (v->flags & IG_JSONV_NULL_ABSENT))
        l->value = NULL;
    l->f.value = l->value;
    *rc = 0;
    if (l->value != NULL)
        return 1;
    if (flags & IG_JSONV_REQUIRED) {
        l->f.kind = IG_JSONV_MISSING;
        *rc = report(v, l);
    }
    return 0;
}

static int look(ig_jsonv_t *v, look_t *l, const json_t *obj, const char *path, const char *key,
                unsigned flags, ig_jsonv_type_t want, int *rc)
{
    return look_at(v, l, json_object_get(obj, key), path, key, flags, want, rc);
}

static int fault(ig_jsonv_t *v, look_t *l, ig_jsonv_kind_t kind)
{
    l->f.kind = kind;
    return report(v, l);
}

/* ---- getters -------------------------------------------------------------- */

int ig_jsonv_keys(ig_jsonv_t *v, const json_t *obj, const char *path, const char *const *allowed)
{
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)obj, key, val)
    {
        size_t i = 0;
        while (allowed[i] != NULL && strcmp(allowed[i], key) != 0)
            i++;
        if (allowed[i] == NULL) {
            look_t l;
            int rc;
            look(v, &l, obj, path, key, 0, IG_JSONV_OBJECT, &rc);
            return fault(v, &l, IG_JSONV_UNKNOWN);
        }
    }
    return 0;
}

/* Whether value has the type want names; an integral real counts as an
 * integer where the reader allows it. */
static int has_type(const ig_jsonv_t *v, const json_t *value, ig_jsonv_type_t want)
{
    switch (want) {
    case IG_JSONV_OBJECT:
        return json_is_object(value);
    case IG_JSONV_ARRAY:
        return json_is_array(value);
    case IG_JSONV_STRING:
        return json_is_string(value);
    case IG_JSONV_INTEGER:
        if (json_is_integer(value))
            return 1;
        /* 16.0 from a float-minded client */
        return (v->flags & IG_JSONV_INTEGRAL_REAL) && json_is_real(value) &&
               json_real_value(value) == floor(json_real_value(value)) &&
               fabs(json_real_value(value)) < 9e15;
    case IG_JSONV_NUMBER:
        return json_is_number(value);
    case IG_JSONV_BOOLEAN:
        return json_is_boolean(value);
    }
    return 0;
}

/* look_at() and the type check: 1 when l->value is there and of type want;
 * otherwise 0 (absent) or the fault's negative code. */
static int look_typed_at(ig_jsonv_t *v, look_t *l, const json_t *value, const char *path,
                         const char *key, unsigned flags, ig_jsonv_type_t want)
{
    int rc;
    if (!look_at(v, l, value, path, key, flags, want, &rc))
        return rc;
    return has_type(v, l->value, want) ? 1 : fault(v, l, IG_JSONV_TYPE);
}

static int look_typed(ig_jsonv_t *v, look_t *l, const json_t *obj, const char *path,
                      const char *key, unsigned flags, ig_jsonv_type_t want)
{
    return look_typed_at(v, l, json_object_get(obj, key), path, key, flags, want);
}

static int get_container(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                         unsigned flags, ig_jsonv_type_t want, json_t **out)
{
    look_t l;
    int rc = look_typed(v, &l, obj, path, key, flags, want);
    *out = rc == 1 ? (json_t *)l.value : NULL;
    return rc;
}

int ig_jsonv_object(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                    unsigned flags, json_t **out)
{
    return get_container(v, obj, path, key, flags, IG_JSONV_OBJECT, out);
}

int ig_jsonv_array(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                   unsigned flags, json_t **out)
{
    return get_container(v, obj, path, key, flags, IG_JSONV_ARRAY, out);
}

int ig_jsonv_string(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                    unsigned flags, const char *def, const char **out, size_t *len)
{
    look_t l;
    int rc = look_typed(v, &l, obj, path, key, flags, IG_JSONV_STRING);
    *out = def;
    if (len)
        *len = def ? strlen(def) : 0;
    if (rc != 1)
        return rc;
    const char *s = json_string_value(l.value);
    size_t n = json_string_length(l.value);
    if (strlen(s) != n)
        return fault(v, &l, IG_JSONV_NUL);
    if ((flags & IG_JSONV_NONEMPTY) && n == 0)
        return fault(v, &l, IG_JSONV_EMPTY);
    *out = s;
    if (len)
        *len = n;
    return 1;
}

/* An integer within range's bounds (lo/hi, or ulo/uhi where is_unsigned):
 * 1 with *x, 0 when absent, or a fault's code. */
static int get_integer(ig_jsonv_t *v, const json_t *value, const char *path, const char *key,
                       unsigned flags, const ig_jsonv_fault_t *range, long long *x)
{
    look_t l;
    int rc = look_typed_at(v, &l, value, path, key, flags, IG_JSONV_INTEGER);
    if (rc != 1)
        return rc;
    *x = json_is_integer(l.value) ? json_integer_value(l.value)
                                  : (long long)json_real_value(l.value);
    int in = range->is_unsigned
                 ? *x >= 0 && (uint64_t)*x >= range->ulo && (uint64_t)*x <= range->uhi
                 : *x >= range->lo && *x <= range->hi;
    if (in)
        return 1;
    l.f.is_unsigned = range->is_unsigned;
    l.f.lo = range->lo;
    l.f.hi = range->hi;
    l.f.ulo = range->ulo;
    l.f.uhi = range->uhi;
    l.f.x = *x;
    return fault(v, &l, IG_JSONV_RANGE);
}

int ig_jsonv_int(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                 unsigned flags, long long lo, long long hi, long long def, long long *out)
{
    return ig_jsonv_int_at(v, json_object_get(obj, key), path, key, flags, lo, hi, def, out);
}

int ig_jsonv_int_at(ig_jsonv_t *v, const json_t *value, const char *path, const char *key,
                    unsigned flags, long long lo, long long hi, long long def, long long *out)
{
    ig_jsonv_fault_t range = {.lo = lo, .hi = hi};
    long long x;
    int rc = get_integer(v, value, path, key, flags, &range, &x);
    *out = rc == 1 ? x : def;
    return rc;
}

int ig_jsonv_uint(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                  unsigned flags, uint64_t lo, uint64_t hi, uint64_t def, uint64_t *out)
{
    ig_jsonv_fault_t range = {.is_unsigned = 1, .ulo = lo, .uhi = hi};
    long long x;
    int rc = get_integer(v, json_object_get(obj, key), path, key, flags, &range, &x);
    *out = rc == 1 ? (uint64_t)x : def;
    return rc;
}

int ig_jsonv_number(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                    unsigned flags, double lo, double hi, double def, double *out)
{
    look_t l;
    int rc = look_typed(v, &l, obj, path, key, flags, IG_JSONV_NUMBER);
    *out = def;
    if (rc != 1)
        return rc;
    double x = json_number_value(l.value);
    int bad_lo = (flags & IG_JSONV_LO_OPEN) ? !(x > lo) : !(x >= lo);
    int bad_hi = (flags & IG_JSONV_HI_OPEN) ? !(x < hi) : !(x <= hi);
    if (!isfinite(x) || bad_lo || bad_hi) {
        l.f.dlo = lo;
        l.f.dhi = hi;
        l.f.dx = x;
        return fault(v, &l, IG_JSONV_RANGE);
    }
    *out = x;
    return 1;
}

int ig_jsonv_bool(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                  unsigned flags, int def, int *out)
{
    return ig_jsonv_bool_at(v, json_object_get(obj, key), path, key, flags, def, out);
}

int ig_jsonv_bool_at(ig_jsonv_t *v, const json_t *value, const char *path, const char *key,
                     unsigned flags, int def, int *out)
{
    look_t l;
    int rc = look_typed_at(v, &l, value, path, key, flags, IG_JSONV_BOOLEAN);
    *out = rc == 1 ? json_is_true(l.value) : def;
    return rc;
}

int ig_jsonv_enum(ig_jsonv_t *v, const json_t *obj, const char *path, const char *key,
                  unsigned flags, const char *const *choices, int def, int *out)
{
    look_t l;
    int rc;
    *out = def;
    if (!look(v, &l, obj, path, key, flags, IG_JSONV_STRING, &rc))
        return rc;
    for (int i = 0; json_is_string(l.value) && choices[i] != NULL; i++) {
        if (strcmp(choices[i], json_string_value(l.value)) == 0) {
            *out = i;
            return 1;
        }
    }
    l.f.choices = choices;
    return fault(v, &l, IG_JSONV_CHOICE);
}

/* ---- documents ------------------------------------------------------------ */

json_t *ig_jsonv_loadb(const char *buf, size_t len, json_error_t *err)
{
    return ig_json_parse(buf, len, 0, err);
}

json_t *ig_jsonv_loadf(FILE *fp, json_error_t *err)
{
    return json_loadf(fp, JSON_REJECT_DUPLICATES, err);
}

json_t *ig_jsonv_load_file(const char *path, json_error_t *err)
{
    return json_load_file(path, JSON_REJECT_DUPLICATES, err);
}
