/*
 * The config parser's reading tools, shared by config.c and
 * config_sites_keys_tls.c (config_internal.h): errors as "FILE: JSON.PATH:
 * problem", the typed getters (base/jsonv with the config's sentences),
 * names, and the paths of model directories.
 */
#include "infergate/config.h"
#include "infergate/error.h"
#include "infergate/jsonv.h"

#include "config_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors and paths --------------------------------------------------- */

int ig__config_fail(ctx_t *c, const char *path, const char *fmt, ...)
{
    if (c->err != NULL && c->errlen > 0) {
        int n = snprintf(c->err, c->errlen, "%s: %s: ", c->file, path[0] ? path : "(top level)");
        if (n >= 0 && (size_t)n < c->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return IG_ECONFIG;
}

/* The config's sentences for the faults the getters find. */
int ig__config_on_fault(ig_jsonv_t *v, const ig_jsonv_fault_t *f)
{
    ctx_t *c = v->data;
    static const char *const type_msg[] = {
        [IG_JSONV_OBJECT] = "must be an object", [IG_JSONV_ARRAY] = "must be an array",
        [IG_JSONV_STRING] = "must be a string",  [IG_JSONV_INTEGER] = "must be an integer",
        [IG_JSONV_NUMBER] = "must be a number",  [IG_JSONV_BOOLEAN] = "must be a boolean",
    };
    switch (f->kind) {
    case IG_JSONV_MISSING:
        return ig__config_fail(c, f->path, "is required");
    case IG_JSONV_TYPE:
        return ig__config_fail(c, f->path, "%s", type_msg[f->want]);
    case IG_JSONV_NUL:
        return ig__config_fail(c, f->path, "must not contain NUL characters");
    case IG_JSONV_EMPTY:
        return ig__config_fail(c, f->path, "must not be empty");
    case IG_JSONV_UNKNOWN:
        return ig__config_fail(c, f->path, "unknown key");
    case IG_JSONV_CHOICE: {
        char list[256] = "";
        size_t n = 0;
        for (int i = 0; f->choices[i] != NULL && n < sizeof(list); i++)
            n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", i ? ", " : "", f->choices[i]);
        return ig__config_fail(c, f->path, "must be one of %s", list);
    }
    case IG_JSONV_RANGE:
        break;
    }
    if (f->is_unsigned) {
        if (f->x < 0 || (uint64_t)f->x < f->ulo)
            return ig__config_fail(c, f->path, "must be >= %llu", (unsigned long long)f->ulo);
        return ig__config_fail(c, f->path, "must be <= %llu", (unsigned long long)f->uhi);
    }
    const char *lo_op = (f->flags & IG_JSONV_LO_OPEN) ? ">" : ">=";
    const char *hi_op = (f->flags & IG_JSONV_HI_OPEN) ? "<" : "<=";
    if (isinf(f->dhi))
        return ig__config_fail(c, f->path, "must be %s %g", lo_op, f->dlo);
    if (!(f->flags & (IG_JSONV_LO_OPEN | IG_JSONV_HI_OPEN)))
        return ig__config_fail(c, f->path, "must be between %g and %g", f->dlo, f->dhi);
    return ig__config_fail(c, f->path, "must be %s %g and %s %g", lo_op, f->dlo, hi_op, f->dhi);
}

/* ---- typed getters: absent keys take the default ------------------------ */

/* The config reads through base/jsonv: a null is a value of the wrong type,
 * and the getters here only narrow the result to 0 or a negative code. */
#define JV(rc) ((rc) < 0 ? (rc) : 0)

int ig__config_check_keys(ctx_t *c, json_t *obj, const char *path, const char *const *allowed)
{
    return ig_jsonv_keys(&c->jv, obj, path, allowed);
}

int ig__config_get_object(ctx_t *c, json_t *obj, const char *path, const char *key, json_t **out)
{
    return JV(ig_jsonv_object(&c->jv, obj, path, key, 0, out));
}

int ig__config_get_array(ctx_t *c, json_t *obj, const char *path, const char *key, json_t **out)
{
    return JV(ig_jsonv_array(&c->jv, obj, path, key, 0, out));
}

/* A name: what API requests, metric labels and logs carry. */
int ig__config_check_name(ctx_t *c, const char *path, const char *s)
{
    size_t n = strlen(s);
    if (n == 0)
        return ig__config_fail(c, path, "must not be empty");
    if (n > NAME_MAX_LEN)
        return ig__config_fail(c, path, "must be at most %d characters", NAME_MAX_LEN);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch <= ' ' || ch == 0x7f || ch == '"' || ch == '\\')
            return ig__config_fail(
                c, path, "must not contain spaces, quotes, backslashes or control characters");
    }
    return 0;
}

/* *out becomes a copy of the value, or of def (NULL stays NULL). */
int ig__config_get_string(ctx_t *c, json_t *obj, const char *path, const char *key, int flags,
                          const char *def, char **out)
{
    const char *s;
    unsigned jf = ((flags & STR_REQUIRED) ? IG_JSONV_REQUIRED : 0) |
                  ((flags & STR_NONEMPTY) && !(flags & STR_NAME) ? IG_JSONV_NONEMPTY : 0);
    *out = NULL;
    int rc = ig_jsonv_string(&c->jv, obj, path, key, jf, def, &s, NULL);
    if (rc < 0)
        return rc;
    if (rc == 1 && (flags & STR_NAME)) {
        char p[IG_JSONV_PATH_MAX];
        ig_jsonv_join(p, path, key);
        if ((rc = ig__config_check_name(c, p, s)) != 0)
            return rc;
    }
    if (s == NULL)
        return 0;
    *out = strdup(s);
    return *out == NULL ? IG_ENOMEM : 0;
}

int ig__config_get_uint(ctx_t *c, json_t *obj, const char *path, const char *key, uint64_t lo,
                        uint64_t hi, uint64_t def, uint64_t *out)
{
    return JV(ig_jsonv_uint(&c->jv, obj, path, key, 0, lo, hi, def, out));
}

/* A number in [lo, hi] (or with open ends); hi = INFINITY for none. */
int ig__config_get_number(ctx_t *c, json_t *obj, const char *path, const char *key, double lo,
                          double hi, int open, double def, double *out)
{
    return JV(ig_jsonv_number(&c->jv, obj, path, key, (unsigned)open, lo, hi, def, out));
}

int ig__config_get_bool(ctx_t *c, json_t *obj, const char *path, const char *key, int def, int *out)
{
    return JV(ig_jsonv_bool(&c->jv, obj, path, key, 0, def, out));
}

/* An enum spelled as a string: *out is the index in names. */
int ig__config_get_enum(ctx_t *c, json_t *obj, const char *path, const char *key,
                        const char *const *names, int def, int *out)
{
    return JV(ig_jsonv_enum(&c->jv, obj, path, key, 0, names, def, out));
}

/* ---- paths of model directories ----------------------------------------- */

int ig_config_cache_dir(char *buf, size_t size)
{
    const char *v;
    int n;
    if ((v = getenv("INFERGATE_CACHE_DIR")) != NULL && v[0] != '\0')
        n = snprintf(buf, size, "%s", v);
    else if ((v = getenv("XDG_CACHE_HOME")) != NULL && v[0] != '\0')
        n = snprintf(buf, size, "%s/infergate", v);
    else if ((v = getenv("HOME")) != NULL && v[0] != '\0')
        n = snprintf(buf, size, "%s/.cache/infergate", v);
    else
        return IG_ENOENT;
    return n < 0 || (size_t)n >= size ? IG_ERANGE : 0;
}

/* "@cache/x" -> cache dir, "~/x" -> $HOME, relative -> next to the config. */
int ig__config_expand_path(ctx_t *c, const char *path, const char *in, char **out)
{
    char buf[4096];
    int n;
    if (in[0] == '\0')
        return ig__config_fail(c, path, "must not be empty");
    if (strcmp(in, "@cache") == 0 || strncmp(in, "@cache/", 7) == 0) {
        char dir[2048];
        if (ig_config_cache_dir(dir, sizeof(dir)) != 0)
            return ig__config_fail(c, path,
                                   "cannot expand @cache: set INFERGATE_CACHE_DIR, "
                                   "XDG_CACHE_HOME or HOME");
        n = snprintf(buf, sizeof(buf), "%s%s", dir, in + 6);
    } else if (in[0] == '~' && (in[1] == '/' || in[1] == '\0')) {
        const char *home = getenv("HOME");
        if (home == NULL || home[0] == '\0')
            return ig__config_fail(c, path, "cannot expand ~: HOME is not set");
        n = snprintf(buf, sizeof(buf), "%s%s", home, in + 1);
    } else if (in[0] != '/' && c->basedir != NULL) {
        n = snprintf(buf, sizeof(buf), "%s/%s", c->basedir, in);
    } else {
        n = snprintf(buf, sizeof(buf), "%s", in);
    }
    if (n < 0 || (size_t)n >= sizeof(buf))
        return ig__config_fail(c, path, "is too long");
    *out = strdup(buf);
    return *out == NULL ? IG_ENOMEM : 0;
}

/* Finds an earlier entry with the same name; returns its index or -1. */
int ig__config_find_name(char *const *names, size_t stride, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++) {
        const char *s = *(char *const *)((const char *)names + i * stride);
        if (s != NULL && strcmp(s, name) == 0)
            return (int)i;
    }
    return -1;
}
