/*
 * The growable text buffer of include/infergate/strbuf.h: doubling from
 * 4 KiB, and no append after the first failure.
 */
#include "infergate/strbuf.h"

#include <stdlib.h>
#include <string.h>

void ig_strbuf_put(ig_strbuf_t *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *nb = realloc(b->buf, cap);
        if (nb == NULL) {
            b->oom = 1;
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

void ig_strbuf_puts(ig_strbuf_t *b, const char *s)
{
    ig_strbuf_put(b, s, strlen(s));
}

void ig_strbuf_free(ig_strbuf_t *b)
{
    free(b->buf);
    b->buf = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
}

size_t ig_str_copy(char *out, size_t cap, const char *s)
{
    size_t n = strnlen(s, cap - 1);
    memcpy(out, s, n);
    out[n] = '\0';
    return n;
}
