/* The parsing core without sockets: read boundaries do not change results,
 * pipelined messages come out one at a time, and the cases where llhttp 8.1
 * alone is too lenient (shown here against llhttp itself) are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../gateway/http/http_internal.h"
#include "infergate/error.h"

typedef struct {
    int nreq;
    int err_status;
    char summary[4096]; /* "METHOD PATH?QUERY hdr=.. body|" per request */
} result_t;

/* Feeds raw in pieces of `step` bytes, like a connection does. */
static void drive(const char *raw, size_t len, size_t step, const ig_http_limits_t *lim,
                  result_t *res)
{
    ig__http_parser_t p;
    ig__http_parser_init(&p, lim, NULL);
    memset(res, 0, sizeof(*res));
    size_t have = 0, pos = 0;
    for (;;) {
        have += len - have < step ? len - have : step;
        for (;;) {
            ig_http_req_t *r = NULL;
            int n = ig__http_parser_feed(&p, raw + pos, have - pos, &r);
            if (n == IG_EPARSE) {
                res->err_status = r->error_status;
                ig__http_req_free(r);
                ig__http_parser_dispose(&p);
                return;
            }
            assert_true(n >= 0 && (size_t)n <= have - pos);
            pos += (size_t)n;
            if (r != NULL) {
                size_t blen;
                const char *body = ig_http_req_body(r, &blen);
                const char *x = ig_http_req_header(r, "x-a");
                size_t o = strlen(res->summary);
                snprintf(res->summary + o, sizeof(res->summary) - o, "%s %s?%s x=%s b=%zu:%s|",
                         ig_http_req_method(r), ig_http_req_path(r), ig_http_req_query(r),
                         x ? x : "-", blen, body);
                res->nreq++;
                ig__http_req_free(r);
                continue;
            }
            if (n == 0)
                break;
        }
        if (have == len)
            break;
    }
    ig__http_parser_dispose(&p);
}

static const char *valid =
    "GET /a?b=c HTTP/1.1\r\nHost: h\r\nX-A:  v1 \r\n\r\n"
    "POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
    "PUT /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nX-a: z\r\n\r\n"
    "2\r\nab\r\n3;x=y\r\ncde\r\n0\r\nTrailer: t\r\n\r\n"
    "\r\nDELETE /d HTTP/1.0\r\n\r\n";

static void test_boundaries_do_not_matter(void **state)
{
    ig_http_limits_t lim;
    ig_http_limits_default(&lim);
    result_t whole, piece;
    drive(valid, strlen(valid), strlen(valid), &lim, &whole);
    assert_int_equal(whole.err_status, 0);
    assert_int_equal(whole.nreq, 4);
    assert_string_equal(whole.summary, "GET /a?b=c x=v1 b=0:|POST /p? x=- b=5:hello|"
                                       "PUT /c? x=z b=5:abcde|DELETE /d? x=- b=0:|");
    for (size_t step = 1; step < 40; step++) {
        drive(valid, strlen(valid), step, &lim, &piece);
        assert_int_equal(piece.nreq, 4);
        assert_string_equal(piece.summary, whole.summary);
    }
}

static int pause_on_complete(llhttp_t *p)
{
    return HPE_PAUSED;
}

/* What llhttp 8.1 does with raw bytes on its own (no lenient flags): 1 when
 * it parses a first message without error. */
static int llhttp_accepts(const char *raw)
{
    llhttp_settings_t s;
    llhttp_t p;
    llhttp_settings_init(&s);
    s.on_message_complete = pause_on_complete;
    llhttp_init(&p, HTTP_REQUEST, &s);
    llhttp_errno_t e = llhttp_execute(&p, raw, strlen(raw));
    return e == HPE_OK || e == HPE_PAUSED;
}

static void test_where_llhttp_is_lenient(void **state)
{
    static const char *cases[] = {
        /* CVE-2024-27982: a space before Content-Length after another header
         * folds it into the previous value, hiding the body length. */
        "POST / HTTP/1.1\r\nHost: t\r\n Content-Length: 5\r\n\r\nhello",
        /* obs-fold */
        "GET / HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n\t2\r\n\r\n",
        /* no CRLF after chunk data */
        "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXX0\r\n\r\n",
        /* whitespace between name and colon */
        "GET / HTTP/1.1\r\nHost : t\r\n\r\n",
        /* missing Host on HTTP/1.1 */
        "GET / HTTP/1.1\r\n\r\n",
    };
    ig_http_limits_t lim;
    ig_http_limits_default(&lim);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_true(llhttp_accepts(cases[i]));
        result_t res;
        drive(cases[i], strlen(cases[i]), strlen(cases[i]), &lim, &res);
        if (res.err_status != 400)
            fail_msg("case %zu: status %d", i, res.err_status);
        assert_int_equal(res.nreq, 0);
    }
}

static void test_limits_without_sockets(void **state)
{
    ig_http_limits_t lim;
    ig_http_limits_default(&lim);
    lim.max_request_line = 16;
    lim.max_header_bytes = 48;
    lim.max_headers = 2;
    lim.max_body_bytes = 4;
    result_t res;
    const char *line = "GET /0123456789ab HTTP/1.1\r\nHost: h\r\n\r\n";
    drive(line, strlen(line), 3, &lim, &res);
    assert_int_equal(res.err_status, 414);
    const char *hdrs = "GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\n\r\n";
    drive(hdrs, strlen(hdrs), 3, &lim, &res);
    assert_int_equal(res.err_status, 431);
    const char *bytes =
        "GET / HTTP/1.1\r\nHost: h\r\nA: 0123456789012345678901234567890123456789\r\n\r\n";
    drive(bytes, strlen(bytes), 3, &lim, &res);
    assert_int_equal(res.err_status, 431);
    const char *body = "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello";
    drive(body, strlen(body), 3, &lim, &res);
    assert_int_equal(res.err_status, 413);
    const char *chunked = "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                          "2\r\nab\r\n2\r\ncd\r\n1\r\ne\r\n0\r\n\r\n";
    drive(chunked, strlen(chunked), 3, &lim, &res);
    assert_int_equal(res.err_status, 413);
}

static void test_arena(void **state)
{
    ig_http_req_t *r = ig__http_req_new(NULL);
    assert_non_null(r);
    /* many small, then one large, then small again: all usable, aligned */
    for (int i = 0; i < 1000; i++) {
        char *p = ig_http_req_alloc(r, 24);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 16, 0);
        memset(p, 1, 24);
    }
    char *big = ig_http_req_alloc(r, 1 << 20);
    assert_non_null(big);
    memset(big, 2, 1 << 20);
    assert_string_equal(ig_http_req_strdup(r, "copy"), "copy");
    ig__http_req_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_boundaries_do_not_matter),
        cmocka_unit_test(test_where_llhttp_is_lenient),
        cmocka_unit_test(test_limits_without_sockets),
        cmocka_unit_test(test_arena),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
