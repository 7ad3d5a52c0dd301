/*
 * A strict JSON parser (RFC 8259) that builds jansson values
 * (include/infergate/jsonv.h, ig_json_parse). Request bodies and stream
 * events are the gateway's hot path, and jansson's own loader reads them a
 * character at a time through its stream layer; this one scans strings and
 * numbers in place and hands jansson finished values. The rules are
 * json_loadb's: an object or array at the top (unless IG_JSON_DECODE_ANY),
 * UTF-8 checked, \u0000 refused, surrogate pairs joined and lone ones
 * refused, integers that do not fit json_int_t refused, reals that
 * overflow refused, nesting at most IG_JSON_MAX_DEPTH, duplicate keys
 * refused unless IG_JSON_ALLOW_DUPLICATES (then the last one wins).
 *
 * ig_json_scan reads by the same rules and builds nothing: it checks a body
 * and finds the few top-level members a caller reads, in a fraction of a
 * parse's time (no allocation), for a proxy that forwards the bytes.
 */
#include "infergate/jsonv.h"
#include "infergate/swar.h"
#include "infergate/utf8.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

typedef struct {
    const char *start, *p, *end;
    int flags;
    int depth;
    int skip; /* ig_json_scan: check the syntax, build nothing */
    /* ig_json_scan: the top-level members to find */
    const char *const *keys;
    int nkeys;
    ig_json_span_t *span;
    json_error_t *err;
} parser_t;

static json_t *parse_value(parser_t *ps);

/* Fills the error (once: the innermost failure is the one to report). */
static void fail(parser_t *ps, const char *what)
{
    json_error_t *e = ps->err;
    if (e == NULL || e->text[0] != '\0')
        return;
    int line = 1, column = 1;
    for (const char *q = ps->start; q < ps->p && q < ps->end; q++) {
        if (*q == '\n') {
            line++;
            column = 1;
        } else {
            column++;
        }
    }
    e->line = line;
    e->column = column;
    e->position = (int)(ps->p - ps->start);
    if (ps->p < ps->end)
        snprintf(e->text, sizeof(e->text), "%s near '%c'", what, *ps->p);
    else
        snprintf(e->text, sizeof(e->text), "%s near end of file", what);
}

static inline void skip_ws(parser_t *ps)
{
    while (ps->p < ps->end && (unsigned char)*ps->p <= ' ' &&
           (*ps->p == ' ' || *ps->p == '\n' || *ps->p == '\r' || *ps->p == '\t'))
        ps->p++;
}

static int hex4(const char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = (unsigned char)s[i];
        unsigned d = c >= '0' && c <= '9'   ? c - '0'
                     : c >= 'a' && c <= 'f' ? c - 'a' + 10
                     : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                            : 16;
        if (d == 16)
            return -1;
        v = v * 16 + d;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Decodes the escapes of the string body s[0..n) (between its quotes,
 * already checked to hold no raw quote or control character) into out,
 * which has room for n bytes (an escape never decodes longer than itself),
 * or only checks them when out is NULL. Returns the decoded length, or -1
 * with ps->p at the bad escape. */
static long unescape(parser_t *ps, const char *s, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\') {
            if (out != NULL)
                out[o] = s[i];
            o++;
            i++;
            continue;
        }
        char c = s[i + 1]; /* the scan ensured a character follows */
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *k = c != '\0' ? strchr(from, c) : NULL;
        if (k != NULL) {
            if (out != NULL)
                out[o] = to[k - from];
            o++;
            i += 2;
            continue;
        }
        unsigned cp, lo;
        ps->p = s + i;
        if (c != 'u' || i + 6 > n || hex4(s + i + 2, &cp) != 0) {
            fail(ps, "invalid escape");
            return -1;
        }
        i += 6;
        if (cp >= 0xd800 && cp <= 0xdbff) {
            if (i + 6 > n || s[i] != '\\' || s[i + 1] != 'u' || hex4(s + i + 2, &lo) != 0 ||
                lo < 0xdc00 || lo > 0xdfff) {
                fail(ps, "invalid Unicode escape (a lone high surrogate)");
                return -1;
            }
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            i += 6;
        } else if (cp >= 0xdc00 && cp <= 0xdfff) {
            fail(ps, "invalid Unicode escape (a lone low surrogate)");
            return -1;
        } else if (cp == 0) {
            fail(ps, "\\u0000 is not allowed");
            return -1;
        }
        if (out != NULL)
            o += put_utf8(out + o, cp);
    }
    return (long)o;
}

/* The bytes of w that end a string's run of ordinary bytes: a quote, a
 * backslash or a control character (a swar.h test's result). */
static uint64_t string_stops(uint64_t w)
{
    return ig_swar_eq(w, '"') | ig_swar_eq(w, '\\') | ig_swar_below(w, 0x20);
}

/* The first byte from q on that ends a string's run of ordinary bytes, or
 * end when none does; the bytes before it are or'ed into *high. Sixteen
 * bytes at a time where SSE2 is (every x86-64), then eight (swar.h), then
 * one. */
static const char *string_run(const char *q, const char *end, uint64_t *high)
{
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\');
    const __m128i ctl = _mm_set1_epi8(0x1f);
    while (end - q >= 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)q);
        __m128i stop =
            _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, bslash)),
                         _mm_cmpeq_epi8(_mm_min_epu8(x, ctl), x));
        unsigned m = (unsigned)_mm_movemask_epi8(stop);
        unsigned k = m != 0 ? (unsigned)__builtin_ctz(m) : 16;
        if ((unsigned)_mm_movemask_epi8(x) & ((1u << k) - 1))
            *high |= 0x80;
        q += k;
        if (m != 0)
            return q;
    }
#endif
    uint64_t w = 0, stops = 0;
    while (end - q >= 8 && (stops = string_stops(w = ig_swar_load(q))) == 0) {
        *high |= w;
        q += 8;
    }
    if (stops != 0) { /* the run ends in w: its bytes before the stop */
        unsigned k = ig_swar_first(stops);
        *high |= w & ~(~0ULL << (8 * k));
        return q + k;
    }
    while (q < end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20)
        *high |= (unsigned char)*q++;
    return q;
}

/* A string at ps->p (its opening quote). On success *s and *n are its UTF-8
 * bytes: in the input itself when it has no escape, else in *owned
 * (malloc'ed, the caller frees). In a scan, escapes are checked and not
 * decoded: *s and *n are the raw bytes between the quotes. 0, or -1 (error
 * set). */
static int parse_string(parser_t *ps, const char **s, size_t *n, char **owned)
{
    const char *q = ++ps->p;
    int escapes = 0;
    uint64_t high = 0; /* every byte passed, or'ed: no high bit, all ASCII */
    *owned = NULL;
    for (;;) {
        q = string_run(q, ps->end, &high);
        if (q >= ps->end) {
            ps->p = q;
            fail(ps, "premature end of input in a string");
            return -1;
        }
        if (*q == '"')
            break;
        if (*q == '\\') {
            escapes = 1;
            if (q + 1 >= ps->end) {
                ps->p = q + 1;
                fail(ps, "premature end of input in a string");
                return -1;
            }
            high |= (unsigned char)q[1];
            q += 2;
            continue;
        }
        ps->p = q;
        fail(ps, "control character in a string");
        return -1;
    }
    size_t len = (size_t)(q - ps->p);
    if (!escapes || ps->skip) {
        /* an escape decodes to valid UTF-8, so the raw bytes tell */
        const char *body = ps->p;
        if (escapes && unescape(ps, body, len, NULL) < 0)
            return -1;
        ps->p = body;
        if ((high & IG_SWAR_HIGH) != 0 && !ig_utf8_valid(body, len)) {
            fail(ps, "invalid UTF-8 in a string");
            return -1;
        }
        *s = ps->p;
        *n = len;
    } else {
        char *buf = malloc(len + 1);
        if (buf == NULL) {
            fail(ps, "out of memory");
            return -1;
        }
        long m = unescape(ps, ps->p, len, buf);
        if (m < 0 || !ig_utf8_valid(buf, (size_t)m)) {
            if (m >= 0)
                fail(ps, "invalid UTF-8 in a string");
            free(buf);
            return -1;
        }
        buf[m] = '\0';
        *owned = buf;
        *s = buf;
        *n = (size_t)m;
    }
    ps->p = q + 1;
    return 0;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* The end of the one or more digits at q (a fraction's or an exponent's);
 * NULL, failing at q, where there is none. */
static const char *digits(parser_t *ps, const char *q)
{
    if (q >= ps->end || !is_digit(*q)) {
        ps->p = q;
        fail(ps, "invalid number");
        return NULL;
    }
    while (q < ps->end && is_digit(*q))
        q++;
    return q;
}

static json_t *parse_number(parser_t *ps)
{
    const char *b = ps->p, *q = b;
    if (q < ps->end && *q == '-')
        q++;
    if (q >= ps->end || !is_digit(*q)) {
        fail(ps, "invalid token");
        return NULL;
    }
    if (*q == '0')
        q++;
    else
        while (q < ps->end && is_digit(*q))
            q++;
    int real = 0;
    if (q < ps->end && *q == '.') {
        real = 1;
        if ((q = digits(ps, q + 1)) == NULL)
            return NULL;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        real = 1;
        q++;
        if (q < ps->end && (*q == '+' || *q == '-'))
            q++;
        if ((q = digits(ps, q)) == NULL)
            return NULL;
    }
    size_t n = (size_t)(q - b);
    /* A scan converts only what might not fit: an integer of 19 digits or
     * more, a real with an exponent or hundreds of digits. */
    if (ps->skip &&
        (real ? n < 300 && memchr(b, 'e', n) == NULL && memchr(b, 'E', n) == NULL : n < 19)) {
        ps->p = q;
        return json_null();
    }
    char small[64], *txt = n < sizeof(small) ? small : malloc(n + 1);
    if (txt == NULL) {
        fail(ps, "out of memory");
        return NULL;
    }
    memcpy(txt, b, n);
    txt[n] = '\0';
    json_t *v = NULL;
    char *endp;
    errno = 0;
    if (!real) {
        long long i = strtoll(txt, &endp, 10);
        if (errno == ERANGE)
            fail(ps, i < 0 ? "too big negative integer" : "too big integer");
        else
            v = json_integer((json_int_t)i);
    } else {
        double d = strtod(txt, &endp);
        if (errno == ERANGE && (d == HUGE_VAL || d == -HUGE_VAL))
            fail(ps, "real number overflow");
        else
            v = json_real(d);
    }
    if (txt != small)
        free(txt);
    ps->p = q;
    if (v != NULL && ps->skip) {
        json_decref(v);
        return json_null();
    }
    return v;
}

static json_t *parse_literal(parser_t *ps)
{
    static const struct {
        const char *word;
        size_t len;
    } w[] = {{"true", 4}, {"false", 5}, {"null", 4}};
    for (int i = 0; i < 3; i++) {
        if ((size_t)(ps->end - ps->p) >= w[i].len && memcmp(ps->p, w[i].word, w[i].len) == 0) {
            ps->p += w[i].len;
            return i == 0 ? json_true() : i == 1 ? json_false() : json_null();
        }
    }
    fail(ps, "invalid token");
    return NULL;
}

/* Which of a scan's keys the raw key bytes k[0..n) name (escapes decoded),
 * or -1. */
static int key_index(parser_t *ps, const char *k, size_t n)
{
    char dec[64];
    if (n > 0 && k[0] != '\\') { /* an escape keeps the bytes before it */
        int i = 0;
        while (i < ps->nkeys && ps->keys[i][0] != k[0])
            i++;
        if (i == ps->nkeys)
            return -1; /* most keys differ from every wanted one in their first byte */
    }
    if (memchr(k, '\\', n) != NULL) {
        if (n >= sizeof(dec))
            return -1;                       /* longer than any key a caller reads */
        const char *at = ps->p;              /* unescape moves it to an escape */
        n = (size_t)unescape(ps, k, n, dec); /* checked by the string's scan */
        ps->p = at;
        k = dec;
    }
    for (int i = 0; i < ps->nkeys; i++) {
        const char *key = ps->keys[i];
        if (n > 0 && key[0] != k[0])
            continue;
        if (strncmp(key, k, n) == 0 && key[n] == '\0')
            return i;
    }
    return -1;
}

/* Steps over an object's or array's opening bracket: 1 when it is empty
 * (its closing bracket is passed too), else 0. */
static int opened_empty(parser_t *ps, char close)
{
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return 1;
    }
    return 0;
}

/* After an object's member or an array's element: 1 past a comma (another
 * follows), 0 past the closing bracket, -1 (error set) otherwise. */
static int after_item(parser_t *ps, char close)
{
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == ',') {
        ps->p++;
        return 1;
    }
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return 0;
    }
    fail(ps, close == '}' ? "'}' expected" : "']' expected");
    return -1;
}

/* An object; in a scan, the top one's members that ps->keys name are
 * found (ps->span) and only they are checked for repeats. */
static json_t *parse_object(parser_t *ps)
{
    int top = ps->span != NULL && ps->depth == 1;
    json_t *o = ps->skip ? json_null() : json_object();
    if (o == NULL) {
        fail(ps, "out of memory");
        return NULL;
    }
    if (opened_empty(ps, '}'))
        return o;
    for (;;) {
        skip_ws(ps);
        if (ps->p >= ps->end || *ps->p != '"') {
            fail(ps, "string or '}' expected");
            goto fail;
        }
        const char *key;
        size_t klen;
        char *owned;
        const char *at = ps->p;
        if (parse_string(ps, &key, &klen, &owned) != 0)
            goto fail;
        int want = top ? key_index(ps, key, klen) : -1;
        int dup = !(ps->flags & IG_JSON_ALLOW_DUPLICATES) &&
                  (want >= 0  ? ps->span[want].p != NULL
                   : ps->skip ? 0
                              : json_object_getn(o, key, klen) != NULL);
        json_t *v = NULL;
        if (dup) {
            ps->p = at;
            fail(ps, "duplicate object key");
        } else {
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':')
                fail(ps, "':' expected");
            else {
                ps->p++;
                skip_ws(ps);
                const char *vp = ps->p;
                v = parse_value(ps);
                if (v != NULL && want >= 0) {
                    ps->span[want].p = vp;
                    ps->span[want].n = (size_t)(ps->p - vp);
                }
            }
        }
        int rc = v == NULL ? -1 : ps->skip ? 0 : json_object_setn_new_nocheck(o, key, klen, v);
        free(owned);
        if (rc != 0) {
            if (v != NULL)
                fail(ps, "out of memory");
            goto fail;
        }
        int more = after_item(ps, '}');
        if (more == 0)
            return o;
        if (more < 0)
            goto fail;
    }
fail:
    json_decref(o);
    return NULL;
}

static json_t *parse_array(parser_t *ps)
{
    json_t *a = ps->skip ? json_null() : json_array();
    if (a == NULL) {
        fail(ps, "out of memory");
        return NULL;
    }
    if (opened_empty(ps, ']'))
        return a;
    for (;;) {
        json_t *v = parse_value(ps);
        if (v == NULL || (!ps->skip && json_array_append_new(a, v) != 0)) {
            if (v != NULL)
                fail(ps, "out of memory");
            json_decref(a);
            return NULL;
        }
        int more = after_item(ps, ']');
        if (more == 0)
            return a;
        if (more < 0) {
            json_decref(a);
            return NULL;
        }
    }
}

static json_t *parse_value(parser_t *ps)
{
    skip_ws(ps);
    if (ps->p >= ps->end) {
        fail(ps, "unexpected end of input");
        return NULL;
    }
    char c = *ps->p;
    if (c == '{' || c == '[') {
        if (++ps->depth > IG_JSON_MAX_DEPTH) {
            fail(ps, "maximum parsing depth reached");
            return NULL;
        }
        json_t *v = c == '{' ? parse_object(ps) : parse_array(ps);
        ps->depth--;
        return v;
    }
    if (c == '"') {
        const char *s;
        size_t n;
        char *owned;
        if (parse_string(ps, &s, &n, &owned) != 0)
            return NULL;
        json_t *v = ps->skip ? json_null() : json_stringn_nocheck(s, n);
        free(owned);
        if (v == NULL)
            fail(ps, "out of memory");
        return v;
    }
    if (c == '-' || is_digit(c))
        return parse_number(ps);
    return parse_literal(ps);
}

/* The document in ps, by its flags: its value, or NULL with the error. */
static json_t *parse_document(parser_t *ps)
{
    if (ps->err != NULL) {
        memset(ps->err, 0, sizeof(*ps->err));
        snprintf(ps->err->source, sizeof(ps->err->source), "<buffer>");
    }
    skip_ws(ps);
    if (!(ps->flags & IG_JSON_DECODE_ANY) &&
        (ps->p >= ps->end || (*ps->p != '{' && *ps->p != '['))) {
        fail(ps, "'[' or '{' expected");
        return NULL;
    }
    json_t *v = parse_value(ps);
    if (v == NULL)
        return NULL;
    if (!(ps->flags & IG_JSON_DISABLE_EOF_CHECK)) {
        skip_ws(ps);
        if (ps->p < ps->end) {
            fail(ps, "end of file expected");
            json_decref(v);
            return NULL;
        }
    }
    return v;
}

json_t *ig_json_parse(const char *buf, size_t len, int flags, json_error_t *err)
{
    parser_t ps = {.start = buf, .p = buf, .end = buf + len, .flags = flags, .err = err};
    return parse_document(&ps);
}

int ig_json_scan(const char *buf, size_t len, int flags, const char *const *keys, int nkeys,
                 ig_json_span_t *span, json_error_t *err)
{
    parser_t ps = {.start = buf,
                   .p = buf,
                   .end = buf + len,
                   .flags = flags,
                   .skip = 1,
                   .keys = keys,
                   .nkeys = nkeys,
                   .span = span,
                   .err = err};
    memset(span, 0, sizeof(*span) * (size_t)(nkeys > 0 ? nkeys : 0));
    skip_ws(&ps);
    int object = ps.p < ps.end && *ps.p == '{';
    return parse_document(&ps) == NULL ? -1 : object;
}

int ig_json_span_int(const ig_json_span_t *s, long long *out)
{
    if (s->p == NULL || s->n == 0)
        return 0;
    size_t i = s->p[0] == '-' ? 1 : 0;
    if (s->n <= i || s->n - i > 18)
        return 0;
    long long v = 0;
    for (size_t k = i; k < s->n; k++) {
        if (s->p[k] < '0' || s->p[k] > '9')
            return 0;
        v = v * 10 + (s->p[k] - '0');
    }
    *out = i ? -v : v;
    return 1;
}
