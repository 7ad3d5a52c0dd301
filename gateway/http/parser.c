/*
 * The parsing core: a strict pre-scan of the header block, then llhttp 8.1
 * (no lenient flags) on an arena copy of that block, then llhttp plus our own
 * chunked-framing validator on the body. The pre-scan exists because llhttp
 * 8.1 accepts obs-fold, a header line starting with whitespace after another
 * header (CVE-2024-27982), NUL in values, and does not check the CRLF after
 * chunk data; see docs/http.md.
 */
#include "http_internal.h"

#include "infergate/error.h"
#include "infergate/swar.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum {
    CS_SIZE0 = 0, /* first hex digit of a chunk size */
    CS_SIZE,      /* more hex digits, ';' or CR */
    CS_EXT,       /* chunk extension up to CR */
    CS_SIZE_LF,
    CS_DATA,
    CS_DATA_CR,
    CS_DATA_LF,
    CS_TRAILER0, /* start of a trailer line or the final CRLF */
    CS_TRAILER,
    CS_TRAILER_LF,
    CS_END_LF,
    CS_DONE,
};

/* RFC 9110 tchar, as a table: the pre-scan looks at every header byte. */
static const unsigned char tchar[256] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0,
    0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 1, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
};

static int is_tchar(unsigned char c)
{
    return tchar[c];
}

static int is_hex(unsigned char c, unsigned *v)
{
    if (c >= '0' && c <= '9')
        *v = c - '0';
    else if (c >= 'a' && c <= 'f')
        *v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
        *v = c - 'A' + 10;
    else
        return 0;
    return 1;
}

/* ---- Host: an RFC 3986 authority without userinfo -------------------- */

/* unreserved / sub-delims (RFC 3986 2.2, 2.3): the bytes of a reg-name
 * besides pct-encoded ones. */
static int is_regname_char(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return 1;
    switch (c) {
    case '-':
    case '.':
    case '_':
    case '~':
    case '!':
    case '$':
    case '&':
    case '\'':
    case '(':
    case ')':
    case '*':
    case '+':
    case ',':
    case ';':
    case '=':
        return 1;
    }
    return 0;
}

/* IP-literal = "[" ( IPv6address / IPvFuture ) "]", without the brackets. */
static int valid_ip_literal(const char *s, size_t n)
{
    if (n >= 2 && (s[0] == 'v' || s[0] == 'V')) {
        /* IPvFuture = "v" 1*HEXDIG "." 1*( unreserved / sub-delims / ":" ) */
        size_t i = 1;
        unsigned v;
        while (i < n && is_hex((unsigned char)s[i], &v))
            i++;
        if (i == 1 || i >= n || s[i] != '.' || i + 1 == n)
            return 0;
        for (i++; i < n; i++)
            if (!is_regname_char((unsigned char)s[i]) && s[i] != ':')
                return 0;
        return 1;
    }
    char buf[INET6_ADDRSTRLEN];
    struct in6_addr a;
    if (n == 0 || n >= sizeof(buf) || memchr(s, '%', n) != NULL)
        return 0; /* zone identifiers are not part of RFC 3986 */
    memcpy(buf, s, n);
    buf[n] = '\0';
    return inet_pton(AF_INET6, buf, &a) == 1;
}

/*
 * uri-host [ ":" port ] (RFC 9110 7.2, RFC 3986 3.2.2-3.2.3). host is an
 * IP-literal or a reg-name (an IPv4address is also a reg-name, so dotted
 * digits need no check of their own); port is *DIGIT. The host must not be
 * empty: every target URI this server serves is an http(s) URI, and those
 * need a non-empty host (RFC 9110 4.2.1), so RFC 9112 3.2's empty Host
 * (for a target URI without an authority) never applies.
 */
static int valid_authority(const char *s, size_t n)
{
    size_t i = 0;
    if (n > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (close == NULL || !valid_ip_literal(s + 1, (size_t)(close - s) - 1))
            return 0;
        i = (size_t)(close - s) + 1;
    } else {
        unsigned v;
        while (i < n && s[i] != ':') {
            unsigned char c = (unsigned char)s[i];
            if (c == '%') {
                if (i + 2 >= n || !is_hex((unsigned char)s[i + 1], &v) ||
                    !is_hex((unsigned char)s[i + 2], &v))
                    return 0;
                i += 3;
                continue;
            }
            if (!is_regname_char(c))
                return 0;
            i++;
        }
        if (i == 0)
            return 0;
    }
    if (i == n)
        return 1;
    if (s[i] != ':')
        return 0;
    for (i++; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

static int fail(ig__http_parser_t *p, int status, const char *msg)
{
    if (p->err_status == 0) {
        p->err_status = status;
        p->err_msg = msg;
    }
    return -1;
}

/* ---- llhttp callbacks ------------------------------------------------- */

static int on_url(llhttp_t *ll, const char *at, size_t len)
{
    ig__http_parser_t *p = ll->data;
    if (p->url == NULL)
        p->url = at;
    p->url_len = (size_t)(at + len - p->url);
    return 0;
}

static int on_header_field(llhttp_t *ll, const char *at, size_t len)
{
    ig__http_parser_t *p = ll->data;
    if (p->in_trailers)
        return 0;
    ig_http_req_t *r = p->req;
    if (r->nheaders >= p->hcap)
        return fail(p, 431, "too many header fields");
    ig__http_header_t *h = &r->headers[r->nheaders];
    if (h->name == NULL)
        h->name = at;
    h->nlen = (size_t)(at + len - h->name);
    return 0;
}

static int on_header_value(llhttp_t *ll, const char *at, size_t len)
{
    ig__http_parser_t *p = ll->data;
    if (p->in_trailers)
        return 0;
    ig__http_header_t *h = &p->req->headers[p->req->nheaders];
    if (h->value == NULL)
        h->value = at;
    h->vlen = (size_t)(at + len - h->value);
    return 0;
}

static int on_header_value_complete(llhttp_t *ll)
{
    ig__http_parser_t *p = ll->data;
    if (p->in_trailers)
        return 0;
    ig__http_header_t *h = &p->req->headers[p->req->nheaders];
    while (h->vlen > 0 && (h->value[h->vlen - 1] == ' ' || h->value[h->vlen - 1] == '\t'))
        h->vlen--;
    p->req->nheaders++;
    return 0;
}

static int span_ieq(const char *s, size_t n, const char *lit)
{
    size_t m = strlen(lit);
    return n == m && strncasecmp(s, lit, n) == 0;
}

/* Semantic checks llhttp leaves to us or that we want regardless of its
 * version: exactly one Host on 1.1, one decimal Content-Length, a
 * Transfer-Encoding of exactly "chunked", never both. */
static int on_headers_complete(llhttp_t *ll)
{
    ig__http_parser_t *p = ll->data;
    ig_http_req_t *r = p->req;
    unsigned hosts = 0, cls = 0, tes = 0;
    if (ll->http_major != 1 || ll->http_minor > 1)
        return fail(p, 505, "HTTP version not supported");
    for (unsigned i = 0; i < r->nheaders; i++) {
        ig__http_header_t *h = &r->headers[i];
        if (span_ieq(h->name, h->nlen, "host")) {
            hosts++;
            if (!valid_authority(h->value, h->vlen))
                return fail(p, 400, h->vlen == 0 ? "empty Host header" : "invalid Host header");
        } else if (span_ieq(h->name, h->nlen, "content-length")) {
            cls++;
            if (h->vlen == 0 || h->vlen > 18)
                return fail(p, 400, "invalid Content-Length");
            for (size_t k = 0; k < h->vlen; k++)
                if (h->value[k] < '0' || h->value[k] > '9')
                    return fail(p, 400, "invalid Content-Length");
        } else if (span_ieq(h->name, h->nlen, "transfer-encoding")) {
            tes++;
            if (!span_ieq(h->value, h->vlen, "chunked"))
                return fail(p, 400, "unsupported Transfer-Encoding");
        } else if (span_ieq(h->name, h->nlen, "expect")) {
            if (span_ieq(h->value, h->vlen, "100-continue"))
                p->want_continue = 1;
            else
                return fail(p, 417, "unsupported Expect");
        }
    }
    if (ll->http_minor == 1 && hosts != 1)
        return fail(p, 400, hosts == 0 ? "missing Host header" : "more than one Host header");
    if (hosts > 1)
        return fail(p, 400, "more than one Host header");
    if (cls > 1)
        return fail(p, 400, "more than one Content-Length");
    if (tes > 1)
        return fail(p, 400, "more than one Transfer-Encoding");
    if (cls && tes)
        return fail(p, 400, "Content-Length with Transfer-Encoding");
    if (tes && ll->http_minor == 0)
        return fail(p, 400, "Transfer-Encoding on HTTP/1.0");
    if (ll->method == HTTP_CONNECT)
        return fail(p, 405, "CONNECT not supported");
    r->http_minor = ll->http_minor;
    r->keep_alive = llhttp_should_keep_alive(ll);
    r->method = llhttp_method_name((llhttp_method_t)ll->method);
    r->head_only = ll->method == HTTP_HEAD;
    if (cls) {
        if (ll->content_length > p->limits->max_body_bytes)
            return fail(p, 413, "request body too large");
        r->body_cap = (size_t)ll->content_length + 1;
        /* The whole body is held before the handler runs: it must fit the
         * process's budget now. */
        if (ig__http_budget_take(r->body_cap, p->limits->max_buffered_bytes) < 0)
            return fail(p, 503, "server busy: buffered request data over budget");
        r->budget += r->body_cap;
        r->body = ig__arena_alloc(&r->arena, r->body_cap);
        if (r->body == NULL)
            return fail(p, 500, "out of memory");
    }
    if ((!cls && !tes) || ll->http_minor == 0)
        p->want_continue = 0; /* no 1xx to HTTP/1.0 clients (RFC 9110 15.2) */
    p->in_trailers = 1;
    return 0;
}

static int on_body(llhttp_t *ll, const char *at, size_t len)
{
    ig__http_parser_t *p = ll->data;
    ig_http_req_t *r = p->req;
    if (r->body_len + len > p->limits->max_body_bytes)
        return fail(p, 413, "request body too large");
    if (r->body_len + len + 1 > r->body_cap) {
        /* Chunked: grow geometrically on the heap, never quadratic. */
        size_t cap = r->body_cap ? r->body_cap : 1024;
        while (cap < r->body_len + len + 1)
            cap *= 2;
        size_t more = cap - (r->body_heap ? r->body_cap : 0);
        if (ig__http_budget_take(more, p->limits->max_buffered_bytes) < 0)
            return fail(p, 503, "server busy: buffered request data over budget");
        char *nb = r->body_heap ? realloc(r->body, cap) : malloc(cap);
        if (nb == NULL) {
            ig__http_budget_release(more);
            return fail(p, 500, "out of memory");
        }
        r->budget += more;
        if (!r->body_heap && r->body_len)
            memcpy(nb, r->body, r->body_len);
        r->body = nb;
        r->body_cap = cap;
        r->body_heap = 1;
    }
    memcpy(r->body + r->body_len, at, len);
    r->body_len += len;
    return 0;
}

static int on_message_complete(llhttp_t *ll)
{
    ig__http_parser_t *p = ll->data;
    p->complete = 1;
    return HPE_PAUSED;
}

/* ---- lifecycle -------------------------------------------------------- */

void ig__http_parser_init(ig__http_parser_t *p, const ig_http_limits_t *limits,
                          ig__http_reqpool_t *pool)
{
    memset(p, 0, sizeof(*p));
    p->limits = limits;
    p->pool = pool;
    llhttp_settings_init(&p->settings);
    p->settings.on_url = on_url;
    p->settings.on_header_field = on_header_field;
    p->settings.on_header_value = on_header_value;
    p->settings.on_header_value_complete = on_header_value_complete;
    p->settings.on_headers_complete = on_headers_complete;
    p->settings.on_body = on_body;
    p->settings.on_message_complete = on_message_complete;
    llhttp_init(&p->ll, HTTP_REQUEST, &p->settings);
    p->ll.data = p;
}

void ig__http_parser_dispose(ig__http_parser_t *p)
{
    if (p->req != NULL) {
        ig__http_req_free(p->req);
        p->req = NULL;
    }
}

int ig__http_parser_idle(const ig__http_parser_t *p)
{
    return p->phase == IG__PARSE_HEAD && p->scan == 0;
}

static void reset_message(ig__http_parser_t *p)
{
    p->phase = IG__PARSE_HEAD;
    p->scan = p->line_start = p->head_start = p->hdr_start = 0;
    p->lines = p->nheaders = 0;
    p->copy = p->url = NULL;
    p->url_len = 0;
    p->in_trailers = p->complete = p->want_continue = 0;
    p->cstate = CS_SIZE0;
    p->csize = 0;
    p->ctrailer_bytes = 0;
    p->cext_bytes = p->cext_total = 0;
    llhttp_reset(&p->ll);
}

ig_http_req_t *ig__http_error_req(ig__http_reqpool_t *pool, int status, const char *msg)
{
    ig_http_req_t *r = ig__http_req_new(pool);
    if (r == NULL)
        return NULL;
    r->error_status = status;
    r->error_msg = msg;
    r->method = "-";
    r->path = "-";
    r->query = "";
    return r;
}

static int parse_error(ig__http_parser_t *p, ig_http_req_t **out)
{
    ig_http_req_t *r = p->req;
    p->req = NULL;
    if (r == NULL) {
        r = ig__http_error_req(p->pool, p->err_status, p->err_msg);
    } else {
        r->error_status = p->err_status;
        r->error_msg = p->err_msg;
        if (r->method == NULL)
            r->method = p->url != NULL ? llhttp_method_name((llhttp_method_t)p->ll.method) : "-";
        if (r->path == NULL && p->url != NULL && p->url_len > 0) {
            /* for the access log only */
            size_t n = p->url_len < 256 ? p->url_len : 256;
            r->path = ig__arena_alloc(&r->arena, n + 1);
            if (r->path != NULL) {
                memcpy(r->path, p->url, n);
                r->path[n] = '\0';
            }
        }
        if (r->path == NULL)
            r->path = "-";
        r->query = "";
    }
    *out = r;
    return IG_EPARSE;
}

/* ---- header pre-scan -------------------------------------------------- */

/* The bytes of w that end a header line or break it: CR, LF or NUL
 * (prescan's stops; a swar.h test's result). */
static uint64_t line_stops(uint64_t w)
{
    return ig_swar_eq(w, '\r') | ig_swar_eq(w, '\n') | ig_swar_eq(w, 0);
}

/* Whether all eight bytes may stand in a field value: no control
 * character but tab, no DEL. */
static int field8(uint64_t w)
{
    return !(ig_swar_below(w, 0x20) | ig_swar_eq(w, 0x7f));
}

/* Checks one complete header line [s, e) (without its CRLF). */
static int check_header_line(ig__http_parser_t *p, const char *s, const char *e)
{
    if (s[0] == ' ' || s[0] == '\t')
        return fail(p, 400, "header line starts with whitespace (obs-fold)");
    const char *c = s;
    while (c < e && is_tchar((unsigned char)*c))
        c++;
    if (c == e || c == s)
        return fail(p, 400, "invalid header field name");
    if (*c == ' ' || *c == '\t')
        return fail(p, 400, "whitespace between header name and colon");
    if (*c != ':')
        return fail(p, 400, "invalid character in header field name");
    for (c++; c < e; c++) {
        while (e - c >= 8 && field8(ig_swar_load(c)))
            c += 8;
        if (c == e)
            break;
        unsigned char ch = (unsigned char)*c;
        if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
            return fail(p, 400, "invalid character in header value");
    }
    if (++p->nheaders > p->limits->max_headers)
        return fail(p, 431, "too many header fields");
    return 0;
}

/* Fails when an ordinary byte at i makes the request line or the header
 * block longer than its limit. */
static int head_too_long(ig__http_parser_t *p, size_t i)
{
    if (p->lines == 0) {
        if (i - p->head_start >= p->limits->max_request_line)
            return fail(p, 414, "request line too long");
    } else if (i - p->hdr_start >= p->limits->max_header_bytes) {
        return fail(p, 431, "header block too large");
    }
    return 0;
}

/* Returns 1 when the header block is complete (p->scan is its end), 0 when
 * more bytes are needed, -1 on error. */
static int prescan(ig__http_parser_t *p, const char *d, size_t len)
{
    const ig_http_limits_t *lim = p->limits;
    size_t i = p->scan;
    for (; i < len; i++) {
        /* A run of ordinary bytes, eight at a time where it can. A line only
         * grows along the run, so the length limits, due at each of its
         * bytes, are checked at its last. */
        size_t from = i;
        while (i < len) {
            if (len - i >= 8) {
                uint64_t stops = line_stops(ig_swar_load(d + i));
                if (stops == 0) {
                    i += 8;
                    continue;
                }
                i += ig_swar_first(stops);
                break;
            }
            if (d[i] == '\r' || d[i] == '\n' || d[i] == '\0')
                break;
            i++;
        }
        if (i > from && head_too_long(p, i - 1) < 0)
            return -1;
        if (i >= len)
            break;
        unsigned char c = (unsigned char)d[i];
        if (c == '\r') {
            if (i + 1 >= len)
                break;
            if (d[i + 1] != '\n')
                return fail(p, 400, "bare CR in header");
            size_t ls = p->line_start;
            i++;
            p->line_start = i + 1;
            if (p->lines == 0) {
                if (i - 1 == ls) {
                    /* Empty lines before the request line are ignored
                     * (RFC 9112 2.2), within the header byte limit. */
                    if (i + 1 > lim->max_header_bytes)
                        return fail(p, 431, "header block too large");
                    p->head_start = i + 1;
                    continue;
                }
                p->lines = 1;
                p->hdr_start = i + 1;
                continue;
            }
            if (i - 1 == ls) {
                p->scan = i + 1;
                return 1;
            }
            if (check_header_line(p, d + ls, d + i - 1) < 0)
                return -1;
            p->lines++;
            continue;
        }
        if (c == '\n')
            return fail(p, 400, "bare LF in header");
        return fail(p, 400, "NUL in header");
    }
    p->scan = i;
    return 0;
}

static int finish_head(ig__http_parser_t *p)
{
    ig_http_req_t *r = p->req;
    /* Spans point into the arena copy; NUL-terminate them now that llhttp is
     * done with the bytes after them. */
    for (unsigned i = 0; i < r->nheaders; i++) {
        ig__http_header_t *h = &r->headers[i];
        if (h->value == NULL)
            h->value = h->name + h->nlen; /* overwritten with NUL below */
        ((char *)h->name)[h->nlen] = '\0';
        ((char *)h->value)[h->vlen] = '\0';
        if (h->vlen == 0)
            h->value = "";
    }
    if (p->url == NULL || p->url_len == 0)
        return fail(p, 400, "missing request target");
    char *url = (char *)p->url;
    url[p->url_len] = '\0';
    if (url[0] != '/' &&
        (strncasecmp(url, "http://", 7) == 0 || strncasecmp(url, "https://", 8) == 0)) {
        /* absolute-form (RFC 9112 3.2.2): keep the path; Host still rules.
         * Its authority must be valid too, without userinfo: an http(s) URI
         * with an empty or malformed host is invalid (RFC 9110 4.2.1). */
        char *auth = strchr(url, ':') + 3;
        size_t alen = strcspn(auth, "/?#");
        if (!valid_authority(auth, alen))
            return fail(p, 400, "invalid authority in the request target");
        char *slash = strchr(auth, '/');
        if (slash == NULL) {
            url = (char *)"/";
            p->url_len = 1;
        } else {
            p->url_len -= (size_t)(slash - url);
            url = slash;
        }
    } else if (url[0] != '/' && strcmp(url, "*") != 0) {
        return fail(p, 400, "invalid request target");
    }
    char *q = memchr(url, '?', p->url_len);
    r->path = url;
    if (q != NULL) {
        *q = '\0';
        r->query = q + 1;
    } else {
        r->query = url + p->url_len;
    }
    return 0;
}

/* ---- chunked framing validator --------------------------------------- */

/* Counts one byte of chunk extensions (from the first ';' after the size
 * up to the CR). Extensions are parsed by llhttp and dropped: they only
 * cost, so their length is bounded per chunk and per body. */
static int chunk_ext_byte(ig__http_parser_t *p)
{
    if (++p->cext_bytes > p->limits->max_chunk_ext_bytes)
        return fail(p, 400, "chunk extension too long");
    if (++p->cext_total > p->limits->max_chunk_ext_total)
        return fail(p, 400, "too many chunk extension bytes in the body");
    return 0;
}

/* One byte of a chunk-size line: the hex size, its extensions and the CRLF
 * that ends it (CS_SIZE0 to CS_SIZE_LF). Returns 0, or -1 on a framing
 * error. */
static int chunk_size_byte(ig__http_parser_t *p, unsigned char c)
{
    unsigned v;
    switch (p->cstate) {
    case CS_SIZE0:
        if (!is_hex(c, &v))
            return fail(p, 400, "invalid chunk size");
        p->csize = v;
        p->cstate = CS_SIZE;
        return 0;
    case CS_SIZE:
        if (is_hex(c, &v)) {
            if (p->csize > (UINT64_MAX >> 4))
                return fail(p, 400, "chunk size overflow");
            p->csize = p->csize * 16 + v;
        } else if (c == ';') {
            p->cstate = CS_EXT;
            p->cext_bytes = 0;
            return chunk_ext_byte(p);
        } else if (c == '\r') {
            p->cstate = CS_SIZE_LF;
        } else {
            return fail(p, 400, "invalid chunk size");
        }
        return 0;
    case CS_EXT:
        if (c == '\r')
            p->cstate = CS_SIZE_LF;
        else if ((c < 0x20 && c != '\t') || c == 0x7f)
            return fail(p, 400, "invalid chunk extension");
        else
            return chunk_ext_byte(p);
        return 0;
    default: /* CS_SIZE_LF */
        if (c != '\n')
            return fail(p, 400, "bare CR in chunk size line");
        /* An announced chunk that cannot fit is refused before its
         * bytes arrive. */
        if (p->csize > p->limits->max_body_bytes - p->req->body_len)
            return fail(p, 413, "request body too large");
        p->cstate = p->csize == 0 ? CS_TRAILER0 : CS_DATA;
        return 0;
    }
}

/* One byte of the CRLF after a chunk's data (CS_DATA_CR, CS_DATA_LF).
 * Returns 0, or -1 on a framing error. */
static int chunk_data_end_byte(ig__http_parser_t *p, unsigned char c)
{
    if (c != (p->cstate == CS_DATA_CR ? '\r' : '\n'))
        return fail(p, 400, "missing CRLF after chunk data");
    p->cstate = p->cstate == CS_DATA_CR ? CS_DATA_LF : CS_SIZE0;
    return 0;
}

/* One byte of the trailer section and the final CRLF (CS_TRAILER0 to
 * CS_END_LF). Returns 0, or -1 on a framing error. */
static int chunk_trailer_byte(ig__http_parser_t *p, unsigned char c)
{
    switch (p->cstate) {
    case CS_TRAILER0:
        if (c == '\r')
            p->cstate = CS_END_LF;
        else if (c == ' ' || c == '\t')
            return fail(p, 400, "trailer line starts with whitespace");
        else if (c == '\n')
            return fail(p, 400, "bare LF in trailer");
        else
            p->cstate = CS_TRAILER;
        break;
    case CS_TRAILER:
        if (c == '\r')
            p->cstate = CS_TRAILER_LF;
        else if (c == '\n' || c == 0)
            return fail(p, 400, "invalid character in trailer");
        break;
    case CS_TRAILER_LF:
        if (c != '\n')
            return fail(p, 400, "bare CR in trailer");
        p->cstate = CS_TRAILER0;
        break;
    default: /* CS_END_LF */
        if (c != '\n')
            return fail(p, 400, "bare CR after last chunk");
        p->cstate = CS_DONE;
        break;
    }
    return 0;
}

/* Returns bytes validated up to and including the end of the message (or
 * len), -1 on a framing error. A chunk's data is skipped whole; every other
 * byte goes to the function for its part of the framing. */
static long chunk_validate(ig__http_parser_t *p, const char *d, size_t len)
{
    size_t i = 0;
    while (i < len && p->cstate != CS_DONE) {
        unsigned char c = (unsigned char)d[i];
        int rc;
        if (p->cstate == CS_DATA) {
            size_t n = len - i;
            if (n > p->csize)
                n = (size_t)p->csize;
            p->csize -= n;
            i += n;
            if (p->csize == 0)
                p->cstate = CS_DATA_CR;
            continue;
        }
        if (p->cstate < CS_DATA)
            rc = chunk_size_byte(p, c);
        else if (p->cstate < CS_TRAILER0)
            rc = chunk_data_end_byte(p, c);
        else
            rc = chunk_trailer_byte(p, c);
        if (rc < 0)
            return -1;
        /* The trailer block, from the LF that ends the last chunk's size
         * line, is bounded as a header block is. */
        if (p->cstate >= CS_TRAILER0 && ++p->ctrailer_bytes > p->limits->max_header_bytes)
            return fail(p, 431, "trailer block too large");
        i++;
    }
    return (long)i;
}

/* ---- feeding ---------------------------------------------------------- */

static int llhttp_fail(ig__http_parser_t *p, llhttp_errno_t err)
{
    if (p->err_status != 0)
        return -1;
    switch (err) {
    case HPE_INVALID_VERSION:
        return fail(p, 505, "invalid HTTP version");
    case HPE_INVALID_METHOD:
        return fail(p, 400, "invalid method");
    case HPE_INVALID_URL:
        return fail(p, 400, "invalid request target");
    case HPE_INVALID_CHUNK_SIZE:
        return fail(p, 400, "invalid chunk size");
    case HPE_UNEXPECTED_CONTENT_LENGTH:
    case HPE_INVALID_CONTENT_LENGTH:
        return fail(p, 400, "invalid Content-Length");
    case HPE_INVALID_TRANSFER_ENCODING:
        return fail(p, 400, "invalid Transfer-Encoding");
    default:
        return fail(p, 400, "malformed request");
    }
}

/* The header block: pre-scanned, copied and parsed once complete. */
static int feed_head(ig__http_parser_t *p, const char *data, size_t len, ig_http_req_t **out)
{
    int rc = prescan(p, data, len);
    if (rc < 0)
        return parse_error(p, out);
    if (rc == 0)
        return 0;
    size_t start = p->head_start, end = p->scan;
    if (p->req == NULL) {
        p->req = ig__http_req_new(p->pool);
        if (p->req == NULL) {
            fail(p, 500, "out of memory");
            return parse_error(p, out);
        }
    }
    ig_http_req_t *r = p->req;
    p->hcap = p->nheaders;
    r->headers = ig__arena_alloc(&r->arena, (p->hcap + 1) * sizeof(ig__http_header_t));
    char *copy = ig__arena_alloc(&r->arena, end - start + 1);
    if (r->headers == NULL || copy == NULL) {
        fail(p, 500, "out of memory");
        return parse_error(p, out);
    }
    memset(r->headers, 0, (p->hcap + 1) * sizeof(ig__http_header_t));
    memcpy(copy, data + start, end - start);
    copy[end - start] = '\0';
    r->bytes_in = end;
    llhttp_errno_t err = llhttp_execute(&p->ll, copy, end - start);
    if (err == HPE_PAUSED && p->complete) {
        /* no body */
    } else if (err != HPE_OK) {
        llhttp_fail(p, err);
        return parse_error(p, out);
    }
    if (finish_head(p) < 0)
        return parse_error(p, out);
    if (r->body == NULL && !(p->ll.flags & F_CHUNKED)) {
        r->body = ig__arena_alloc(&r->arena, 1);
        if (r->body == NULL) {
            fail(p, 500, "out of memory");
            return parse_error(p, out);
        }
        r->body[0] = '\0';
    }
    if (p->complete) {
        *out = r;
        p->req = NULL;
        reset_message(p);
        return (int)end;
    }
    p->phase = IG__PARSE_BODY;
    return (int)end;
}

int ig__http_parser_feed(ig__http_parser_t *p, const char *data, size_t len, ig_http_req_t **out)
{
    *out = NULL;
    if (p->err_status != 0)
        return parse_error(p, out);
    if (p->phase == IG__PARSE_HEAD)
        return feed_head(p, data, len, out);
    /* body */
    size_t n = len;
    if (p->ll.flags & F_CHUNKED) {
        long v = chunk_validate(p, data, len);
        if (v < 0)
            return parse_error(p, out);
        n = (size_t)v;
    }
    llhttp_errno_t err = llhttp_execute(&p->ll, data, n);
    size_t used = n;
    if (err == HPE_PAUSED && p->complete) {
        used = (size_t)(llhttp_get_error_pos(&p->ll) - data);
    } else if (err != HPE_OK) {
        llhttp_fail(p, err);
        return parse_error(p, out);
    }
    p->req->bytes_in += used;
    if (!p->complete && p->cstate == CS_DONE) {
        fail(p, 400, "malformed chunked body");
        return parse_error(p, out);
    }
    if (p->complete) {
        if ((p->ll.flags & F_CHUNKED) && p->cstate != CS_DONE) {
            fail(p, 400, "malformed chunked body");
            return parse_error(p, out);
        }
        ig_http_req_t *r = p->req;
        if (r->body == NULL) {
            r->body = ig__arena_alloc(&r->arena, 1);
            if (r->body == NULL) {
                fail(p, 500, "out of memory");
                return parse_error(p, out);
            }
        }
        r->body[r->body_len] = '\0';
        *out = r;
        p->req = NULL;
        reset_message(p);
    }
    return (int)used;
}
