#ifndef IG_TEST_TC_EXPECT_H
#define IG_TEST_TC_EXPECT_H
/*
 * One request and the check of its answer on a test-client connection, for
 * cmocka tests (include cmocka.h first): what most HTTP tests do between
 * connecting and closing.
 */
#include <stddef.h>

#include "testclient.h"

/* Sends raw on tc and reads one answer into r (the caller frees it). */
__attribute__((unused)) static void ig_tc_exchange(ig_tc_t *tc, const char *raw,
                                                   ig_tc_response_t *r, int timeout_ms)
{
    assert_int_equal(ig_tc_sends(tc, raw), 0);
    assert_int_equal(ig_tc_read_response(tc, r, timeout_ms), 0);
}

/* Sends raw on tc, reads one answer and checks its status (unless 0) and
 * its whole body (unless NULL). */
__attribute__((unused)) static void ig_tc_expect(ig_tc_t *tc, const char *raw, int status,
                                                 const char *body, int timeout_ms)
{
    ig_tc_response_t r;
    ig_tc_exchange(tc, raw, &r, timeout_ms);
    if (status != 0)
        assert_int_equal(r.status, status);
    if (body != NULL)
        assert_string_equal(r.body, body);
    ig_tc_response_free(&r);
}

/* Checks r, the last answer on tc: its status, its whole body (unless
 * NULL) and "Connection: close"; frees it; then checks that the server
 * closes tc, which is closed here too. */
__attribute__((unused)) static void
ig_tc_expect_closed(ig_tc_t *tc, ig_tc_response_t *r, int status, const char *body, int timeout_ms)
{
    assert_int_equal(r->status, status);
    if (body != NULL)
        assert_string_equal(r->body, body);
    assert_string_equal(ig_tc_header(r, "connection"), "close");
    ig_tc_response_free(r);
    assert_int_equal(ig_tc_wait_closed(tc, timeout_ms), 1);
    ig_tc_close(tc);
}

#endif
