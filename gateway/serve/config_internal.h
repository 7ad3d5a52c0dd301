/*
 * Region config (docs/config.md), the parts of config.c's parser that its
 * other files share: the parse context, the typed getters that carry the
 * JSON path, and the sections parsed elsewhere. Private to serve/config*.c.
 *
 * The short names are the parser's vocabulary (`fail`, `get_string`, ...);
 * they stand for the ig__config_* functions, so that each section reads the
 * same in every file.
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
    ig_jsonv_t jv; /* reads with config.c's on_fault() */
} ctx_t;

enum { STR_OPTIONAL = 0, STR_REQUIRED = 1, STR_NAME = 2, STR_NONEMPTY = 4 };
enum { NUM_CLOSED = 0, NUM_LO_OPEN = IG_JSONV_LO_OPEN, NUM_HI_OPEN = IG_JSONV_HI_OPEN };

#define join ig_jsonv_join
#define join_index ig_jsonv_join_index
/* A function-like name, so that `goto fail` labels stay labels. */
#define fail(...) ig__config_fail(__VA_ARGS__)
#define check_keys ig__config_check_keys
#define get_object ig__config_get_object
#define get_array ig__config_get_array
#define check_name ig__config_check_name
#define get_string ig__config_get_string
#define get_uint ig__config_get_uint
#define get_number ig__config_get_number
#define get_bool ig__config_get_bool
#define get_enum ig__config_get_enum
#define expand_path ig__config_expand_path
#define find_name ig__config_find_name
#define parse_site ig__config_parse_site
#define parse_price ig__config_parse_price
#define parse_api_keys ig__config_parse_api_keys
#define parse_tls ig__config_parse_tls

/* "FILE: PATH: message" into the context's buffer; returns IG_ECONFIG. */
int ig__config_fail(ctx_t *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Getters (config.c): an absent key takes the default; 0 or a negative
 * code, the message already written. */
/* pools[] and sites[] "price" (docs/config.md): absent is unpriced. */
int parse_price(ctx_t *c, json_t *o, const char *p, ig_price_t *price);
int check_keys(ctx_t *c, json_t *obj, const char *path, const char *const *allowed);
int get_object(ctx_t *c, json_t *obj, const char *path, const char *key, json_t **out);
int get_array(ctx_t *c, json_t *obj, const char *path, const char *key, json_t **out);
/* A name: what API requests, metric labels and logs carry. */
int check_name(ctx_t *c, const char *path, const char *s);
/* *out becomes a copy of the value, or of def (NULL stays NULL); STR_ flags. */
int get_string(ctx_t *c, json_t *obj, const char *path, const char *key, int flags, const char *def,
               char **out);
int get_uint(ctx_t *c, json_t *obj, const char *path, const char *key, uint64_t lo, uint64_t hi,
             uint64_t def, uint64_t *out);
/* A number in [lo, hi] (or with NUM_ open ends); hi = INFINITY for none. */
int get_number(ctx_t *c, json_t *obj, const char *path, const char *key, double lo, double hi,
               int open, double def, double *out);
int get_bool(ctx_t *c, json_t *obj, const char *path, const char *key, int def, int *out);
/* An enum spelled as a string: *out is the index in names. */
int get_enum(ctx_t *c, json_t *obj, const char *path, const char *key, const char *const *names,
             int def, int *out);
/* "@cache/x" -> cache dir, "~/x" -> $HOME, relative -> next to the config. */
int expand_path(ctx_t *c, const char *path, const char *in, char **out);
/* The index of the entry named name among n entries of stride bytes whose
 * first member is the name, or -1. */
int find_name(char *const *names, size_t stride, size_t n, const char *name);

/* Sections parsed in config_access.c: sites[i], api_keys, tls. */
int parse_site(ctx_t *c, json_t *o, const char *p, ig_config_t *cfg, size_t idx);
int parse_api_keys(ctx_t *c, json_t *root, ig_config_t *cfg);
int parse_tls(ctx_t *c, json_t *root, ig_config_t *cfg);

#endif
