/*
 * A growable text buffer that remembers running out of memory: callers
 * append freely and check oom once at the end. buf is always
 * NUL-terminated once anything was appended.
 */
#ifndef INFERGATE_STRBUF_H
#define INFERGATE_STRBUF_H

#include <stddef.h>

typedef struct {
    char *buf;  /* malloc'ed; NULL while empty */
    size_t len; /* bytes before the NUL */
    size_t cap;
    int oom; /* an append failed: the content is incomplete */
} ig_strbuf_t;

void ig_strbuf_put(ig_strbuf_t *b, const char *s, size_t n);
void ig_strbuf_puts(ig_strbuf_t *b, const char *s);
void ig_strbuf_free(ig_strbuf_t *b);

/* Copies s into out[cap] (cap >= 1), cut to fit and NUL-terminated:
 * snprintf(out, cap, "%s", s) without the format. Returns the length
 * copied. */
size_t ig_str_copy(char *out, size_t cap, const char *s);

#endif
