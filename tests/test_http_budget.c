/*
 * The process-wide budget for buffered HTTP bytes (max_buffered_bytes):
 * a request body that would not fit gets 503 + Retry-After before any body
 * byte is read (and the connection closes); while unsent output of a client
 * that does not read holds the process over the budget, new requests get
 * 503 + Retry-After on a connection that stays usable; the gauge and the
 * rejection counter show it; once that client goes, requests pass again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../gateway/http/http_internal.h"
#include "tc_expect.h"
#include "testclient.h"
#include "testserver.h"

#define TMO 5000
#define BUDGET (2u << 20)
#define BIG (16u << 20)

static ig_ts_t *server;

static void handler(ig_http_req_t *req, void *data)
{
    if (strcmp(ig_http_req_path(req), "/big") == 0) {
        char *body = malloc(BIG);
        if (body == NULL) {
            ig_http_respond_error(req, 500, NULL, NULL, NULL, "oom");
            return;
        }
        memset(body, 'x', BIG);
        ig_http_respond(req, 200, "application/octet-stream", body, BIG);
        free(body);
        return;
    }
    ig_ts_echo_handler(req, data);
}

static int setup(void **state)
{
    ig_http_limits_t l;
    ig_http_limits_default(&l);
    l.max_buffered_bytes = BUDGET;
    l.max_body_bytes = 8u << 20;
    server = ig_ts_start("127.0.0.1:0", &l, handler, NULL);
    return server != NULL ? 0 : -1;
}

static int teardown(void **state)
{
    ig_ts_stop(server);
    return 0;
}

/* A metric's value from the exposition text (no labels), or -1. */
static double metric(const char *name)
{
    char *text = ig_ts_metrics();
    double v = -1;
    char key[128];
    snprintf(key, sizeof(key), "\n%s ", name);
    const char *at = text != NULL ? strstr(text, key) : NULL;
    if (at != NULL)
        v = strtod(at + strlen(key), NULL);
    free(text);
    return v;
}

static void expect_busy(const ig_tc_response_t *r)
{
    assert_int_equal(r->status, 503);
    assert_non_null(ig_tc_header(r, "Retry-After"));
    assert_string_equal(ig_tc_header(r, "Retry-After"), "1");
    json_error_t e;
    json_t *doc = json_loads(r->body, 0, &e);
    assert_non_null(doc);
    json_t *err = json_object_get(doc, "error");
    assert_string_equal(json_string_value(json_object_get(err, "type")), "unavailable_error");
    assert_string_equal(json_string_value(json_object_get(err, "code")), "server_busy");
    assert_non_null(strstr(json_string_value(json_object_get(err, "message")), "over budget"));
    json_decref(doc);
}

static void test_body_over_budget(void **state)
{
    double rejected = metric("infergate_http_budget_rejections_total");
    ig_tc_t *tc = ig_tc_connect(ig_ts_port(server));
    assert_non_null(tc);
    /* 3 MiB announced, within max_body_bytes (8 MiB) but not the budget:
     * answered before the body is sent. */
    assert_int_equal(
        ig_tc_sends(tc, "POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 3145728\r\n\r\n"), 0);
    ig_tc_response_t r;
    assert_int_equal(ig_tc_read_response(tc, &r, TMO), 0);
    expect_busy(&r);
    assert_string_equal(ig_tc_header(&r, "Connection"), "close");
    ig_tc_response_free(&r);
    assert_int_equal(ig_tc_wait_closed(tc, TMO), 1);
    ig_tc_close(tc);
    assert_true(metric("infergate_http_budget_rejections_total") >= rejected + 1);
    /* A body that fits still passes. */
    static const char small[] = "POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
                                "Connection: close\r\n\r\nhello";
    assert_int_equal(ig_tc_request(ig_ts_port(server), small, &r, TMO), 0);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);
}

static void test_unsent_output_over_budget(void **state)
{
    int port = ig_ts_port(server);
    /* A client with a tiny window that asks for 16 MiB and never reads: the
     * kernel takes a few MiB, the rest waits in the server. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    int rcv = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    static const char get_big[] = "GET /big HTTP/1.1\r\nHost: t\r\n\r\n";
    assert_int_equal(send(fd, get_big, sizeof(get_big) - 1, 0), (ssize_t)sizeof(get_big) - 1);
    long long deadline = ig_tc_now_ms() + TMO;
    while (metric("infergate_http_buffered_bytes") <= BUDGET && ig_tc_now_ms() < deadline)
        usleep(10000);
    double held = metric("infergate_http_buffered_bytes");
    fprintf(stderr, "buffered bytes with the stuck client: %.0f\n", held);
    assert_true(held > BUDGET);
    assert_true(held <= BIG + (1u << 20));

    double rejected = metric("infergate_http_budget_rejections_total");
    ig_tc_t *tc = ig_tc_connect(port);
    assert_non_null(tc);
    ig_tc_response_t r;
    ig_tc_exchange(tc, "GET /x HTTP/1.1\r\nHost: t\r\n\r\n", &r, TMO);
    expect_busy(&r);
    assert_null(ig_tc_header(&r, "Connection")); /* kept alive */
    ig_tc_response_free(&r);
    assert_true(metric("infergate_http_budget_rejections_total") >= rejected + 1);

    /* The stuck client goes; its output is freed and requests pass on the
     * same connection. */
    close(fd);
    deadline = ig_tc_now_ms() + TMO;
    while (metric("infergate_http_buffered_bytes") > BUDGET / 4 && ig_tc_now_ms() < deadline)
        usleep(10000);
    assert_true(metric("infergate_http_buffered_bytes") <= BUDGET / 4);
    ig_tc_expect(tc, "GET /y HTTP/1.1\r\nHost: t\r\n\r\n", 200, NULL, TMO);
    ig_tc_close(tc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_body_over_budget),
        cmocka_unit_test(test_unsent_output_over_budget),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
