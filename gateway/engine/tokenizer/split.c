/*
 * The pre-tokenizer's Split step: a tokenizer.json pattern, compiled once by
 * PCRE2 at load, cuts text into pieces the way the tokenizers library does
 * (its `Pattern::find_matches` and `NormalizedString::split`): the matches
 * and the gaps between them, each flagged as a match or not (the other way
 * round with `invert`), then joined or dropped by the behaviour.
 */
#include "internal.h"

#include "infergate/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tokenizer.json patterns are written for Oniguruma, whose \s is Unicode's
 * White_Space; PCRE2's \s (with PCRE2_UCP) also takes U+180E MONGOLIAN
 * VOWEL SEPARATOR, which the real Llama-3 / Qwen / GPT-4o patterns would then
 * split differently. Writes the pattern with \s and \S spelled as the
 * property, inside and outside classes alike (\Q...\E is left as it is).
 * Returns a new string (length in *outlen), or NULL when out of memory. */
static char *onig_spaces(const char *pat, size_t len, size_t *outlen)
{
    static const char WS[] = "\\p{White_Space}";
    char *out = malloc(len * (sizeof WS - 1) / 2 + len + 1), *o = out;
    size_t i = 0;
    int quoted = 0;
    if (!out)
        return NULL;
    while (i < len) {
        if (pat[i] != '\\' || i + 1 == len) {
            *o++ = pat[i++];
            continue;
        }
        if (quoted) {
            quoted = pat[i + 1] != 'E';
        } else if (pat[i + 1] == 'Q') {
            quoted = 1;
        } else if (pat[i + 1] == 's' || pat[i + 1] == 'S') {
            memcpy(o, WS, sizeof WS - 1);
            if (pat[i + 1] == 'S')
                o[1] = 'P';
            o += sizeof WS - 1;
            i += 2;
            continue;
        }
        *o++ = pat[i++];
        *o++ = pat[i++];
    }
    *o = 0;
    *outlen = (size_t)(o - out);
    return out;
}

int ig__split_init(ig__split_step_t *s, const char *pattern, size_t len, int literal,
                   ig__split_behavior_t behavior, int invert, char *msg, size_t msglen)
{
    int errcode;
    PCRE2_SIZE erroff;
    uint32_t opts = PCRE2_UTF;
    memset(s, 0, sizeof *s);
    /* A String pattern is matched as it is; PCRE2_UCP is not allowed with
     * PCRE2_LITERAL, and means nothing there. */
    opts |= literal ? PCRE2_LITERAL : PCRE2_UCP;
    /* The pattern as written first, so that an error's offset is in it. */
    s->re = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &errcode, &erroff, NULL);
    if (s->re && !literal) {
        size_t wl;
        char *w = onig_spaces(pattern, len, &wl);
        pcre2_code_free(s->re);
        s->re = w ? pcre2_compile((PCRE2_SPTR)w, wl, opts, &errcode, &erroff, NULL) : NULL;
        if (!w)
            errcode = PCRE2_ERROR_NOMEMORY;
        free(w);
    }
    if (!s->re) {
        PCRE2_UCHAR buf[256];
        if (pcre2_get_error_message(errcode, buf, sizeof buf) < 0)
            snprintf((char *)buf, sizeof buf, "error %d", errcode);
        snprintf(msg, msglen, "PCRE2 refuses the pattern at offset %zu: %s", (size_t)erroff,
                 (const char *)buf);
        return errcode == PCRE2_ERROR_NOMEMORY ? IG_ENOMEM : IG_ETOKENIZER;
    }
    /* Without JIT (a platform PCRE2 cannot JIT for) the interpreter runs the
     * same pattern, only slower. */
    s->jit = pcre2_jit_compile(s->re, PCRE2_JIT_COMPLETE) == 0;
    s->behavior = behavior;
    s->invert = invert;
    return 0;
}

void ig__split_dispose(ig__split_step_t *s)
{
    pcre2_code_free(s->re);
    s->re = NULL;
}

/* The behaviours, applied as the segments arrive (the library folds a
 * vector; the result is the same). `pend` is the piece being built. */
typedef struct {
    const ig__split_step_t *step;
    const unsigned char *base;
    ig__piece_cb cb;
    void *ctx;
    size_t ps, pe;  /* pending piece [ps, pe) */
    int have;       /* a piece is pending */
    int pend_match; /* it is a lone match (MergedWithNext may extend it) */
    int prev_match; /* the previous segment was a match */
} joiner_t;

static int flush(joiner_t *j)
{
    int rc = 0;
    if (j->have && j->pe > j->ps) /* empty pieces are dropped, as there */
        rc = j->cb(j->ctx, j->base + j->ps, j->pe - j->ps);
    j->have = 0;
    return rc;
}

static int start(joiner_t *j, size_t s, size_t e, int match)
{
    int rc = flush(j);
    j->ps = s;
    j->pe = e;
    j->have = 1;
    j->pend_match = match;
    return rc;
}

static int segment(joiner_t *j, size_t s, size_t e, int match)
{
    int rc = 0;
    match ^= j->step->invert;
    switch (j->step->behavior) {
    case IG__SPLIT_ISOLATED:
        rc = start(j, s, e, match);
        break;
    case IG__SPLIT_REMOVED:
        if (match)
            rc = flush(j);
        else
            rc = start(j, s, e, match);
        break;
    case IG__SPLIT_CONTIGUOUS: /* runs of equal kind become one piece */
        if (j->have && match == j->prev_match)
            j->pe = e;
        else
            rc = start(j, s, e, match);
        break;
    case IG__SPLIT_MERGED_WITH_PREVIOUS: /* a match joins the gap before it */
        if (j->have && match && !j->prev_match)
            j->pe = e;
        else
            rc = start(j, s, e, match);
        break;
    case IG__SPLIT_MERGED_WITH_NEXT: /* a match joins the gap after it */
        if (j->have && j->pend_match && !match) {
            j->pe = e;
            j->pend_match = 0;
        } else {
            rc = start(j, s, e, match);
        }
        break;
    }
    j->prev_match = match;
    return rc;
}

/* The length of the UTF-8 character that starts with byte b (valid text). */
static size_t char_len(unsigned char b)
{
    return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

int ig__split_run(const ig__split_step_t *st, pcre2_match_data *md, const unsigned char *t,
                  size_t n, ig__piece_cb cb, void *ctx)
{
    joiner_t j = {st, t, cb, ctx, 0, 0, 0, 0, 0};
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t at = 0, prev = 0, last_end = 0;
    int have_last = 0, rc;
    if (n == 0)
        return 0;
    while (at <= n) {
        size_t ms, me;
        int m = st->jit ? pcre2_jit_match(st->re, t, n, at, 0, md, NULL)
                        : pcre2_match(st->re, t, n, at, PCRE2_NO_UTF_CHECK, md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0)
            return IG_ETOKENIZER; /* a resource limit: JIT stack, match or depth limit */
        ms = ov[0];
        me = ov[1];
        if (me < ms) /* \K in a lookaround can do that; take the end */
            ms = me;
        /* As the Oniguruma iterator the library uses: an empty match right
         * where the last match ended is skipped, the search goes on one
         * character later. */
        if (ms == me && have_last && me == last_end) {
            if (at >= n)
                break;
            at += char_len(t[at]);
            continue;
        }
        at = me;
        last_end = me;
        have_last = 1;
        if (prev != ms && (rc = segment(&j, prev, ms, 0)) != 0)
            return rc;
        if ((rc = segment(&j, ms, me, 1)) != 0)
            return rc;
        prev = me;
    }
    if (prev != n && (rc = segment(&j, prev, n, 0)) != 0)
        return rc;
    return flush(&j);
}
