/*
 * Region config (docs/config.md), the parts of config.c's parser that its
 * other files share: the parse context, the typed getters that carry the
 * JSON path, and the sections parsed elsewhere. Private to serve/config*.c.
 */
#ifndef INFERGATE_CONFIG_INTERNAL_H
#define INFERGATE_CONFIG_INTERNAL_H

#include "infergate/config.h"
#include "infergate/jsonv.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define PATH_MAX_LEN IG_JSONV_PATH_MAX
#define NAME_MAX_LEN 128
#define DAY_MS 86400000ull

typedef struct {
    const char *file;
    const char *basedir; /* relative model paths start here; NULL: the cwd */
    char *err;
    size_t errlen;
    ig_jsonv_t jv; /* reads with ig__config_on_fault() */
} ctx_t;

enum { STR_OPTIONAL = 0, STR_REQUIRED = 1, STR_NAME = 2, STR_NONEMPTY = 4 };
enum { NUM_CLOSED = 0, NUM_LO_OPEN = IG_JSONV_LO_OPEN, NUM_HI_OPEN = IG_JSONV_HI_OPEN };

/* The config's sentences for the faults base/jsonv's getters find (ctx_t's
 * jv.fail; config_read.c). */
int ig__config_on_fault(ig_jsonv_t *v, const ig_jsonv_fault_t *f);
/* "FILE: PATH: message" into the context's buffer; returns IG_ECONFIG. */
int ig__config_fail(ctx_t *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Getters (config_read.c): an absent key takes the default; 0 or a negative
 * code, the message already written. */
/* pools[] and sites[] "price" (docs/config.md): absent is unpriced. */
int ig__config_parse_price(ctx_t *c, json_t *o, const char *p, ig_price_t *price);
int ig__config_check_keys(ctx_t *c, json_t *obj, const char *path, const char *const *allowed);
int ig__config_get_object(ctx_t *c, json_t *obj, const char *path, const char *key, json_t **out);
int ig__config_get_array(ctx_t *c, json_t *obj, const char *path, const char *key, json_t **out);
/* A name: what API requests, metric labels and logs carry. */
int ig__config_check_name(ctx_t *c, const char *path, const char *s);
/* *out becomes a copy of the value, or of def (NULL stays NULL); STR_ flags. */
int ig__config_get_string(ctx_t *c, json_t *obj, const char *path, const char *key, int flags,
                          const char *def, char **out);
int ig__config_get_uint(ctx_t *c, json_t *obj, const char *path, const char *key, uint64_t lo,
                        uint64_t hi, uint64_t def, uint64_t *out);
/* A number in [lo, hi] (or with NUM_ open ends); hi = INFINITY for none. */
int ig__config_get_number(ctx_t *c, json_t *obj, const char *path, const char *key, double lo,
                          double hi, int open, double def, double *out);
int ig__config_get_bool(ctx_t *c, json_t *obj, const char *path, const char *key, int def,
                        int *out);
/* An enum spelled as a string: *out is the index in names. */
int ig__config_get_enum(ctx_t *c, json_t *obj, const char *path, const char *key,
                        const char *const *names, int def, int *out);
/* "@cache/x" -> cache dir, "~/x" -> $HOME, relative -> next to the config. */
int ig__config_expand_path(ctx_t *c, const char *path, const char *in, char **out);
/* The index of the entry named name among n entries of stride bytes whose
 * first member is the name, or -1. */
int ig__config_find_name(char *const *names, size_t stride, size_t n, const char *name);

/* Sections parsed in config_sites_keys_tls.c: sites[i], api_keys, tls. */
int ig__config_parse_site(ctx_t *c, json_t *o, const char *p, ig_config_t *cfg, size_t idx);
int ig__config_parse_api_keys(ctx_t *c, json_t *root, ig_config_t *cfg);
int ig__config_parse_tls(ctx_t *c, json_t *root, ig_config_t *cfg);

#endif
