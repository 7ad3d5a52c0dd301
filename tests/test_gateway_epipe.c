/*
 * A write to the client that fails at once (EPIPE or ECONNRESET from the
 * first write attempt) detaches the connection inside the gateway's own
 * call. The request must be finished once, and nothing may touch it after:
 * run under ASan, a use after free or a double finish kills the gateway.
 *
 * How the failure is made certain: the gateway takes one pipelined request
 * at a time (limits.max_pipeline 1), so with a second one queued it stops
 * reading the socket; the client then resets the connection, which the
 * gateway cannot see until it writes the answer of the first request.
 * Real processes on loopback.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gwfixture.h"

/* Sends two pipelined POSTs of body to path, waits until the gateway has
 * parsed them (and stopped reading), then resets the connection. */
static void pipeline_then_reset(int port, const char *path, const char *body)
{
    int fd = ig_proc_connect(port);
    assert_true(fd >= 0);
    char one[2048];
    int n = snprintf(one, sizeof(one),
                     "POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     path, strlen(body), body);
    char two[4096];
    memcpy(two, one, (size_t)n);
    memcpy(two + n, one, (size_t)n);
    assert_int_equal(send(fd, two, (size_t)(2 * n), 0), 2 * n);
    usleep(100 * 1000);
    struct linger lg = {1, 0};
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    close(fd); /* RST */
}

/* The gateway is alive, has nothing in flight, and still answers. */
static void check_alive(ig_proc_t *g)
{
    long long end = ig_tc_now_ms() + 5000;
    long long inflight = -1;
    while (ig_tc_now_ms() < end) {
        json_t *doc = ig_gwf_get_json(g->port, "/status");
        assert_non_null(doc);
        inflight = json_integer_value(json_object_get(doc, "inflight"));
        json_decref(doc);
        if (inflight == 0)
            break;
        usleep(20 * 1000);
    }
    assert_int_equal(inflight, 0);
}

static void run_case(const char *path, const char *body, const char *flags_a, const char *flags_b)
{
    ig_proc_t ups[1];
    assert_int_equal(
        ig_gwf_upstream(&ups[0], "--instant-raw", "--delay-ms", "300", flags_a, flags_b, NULL), 0);
    ig_proc_t g;
    assert_int_equal(ig_gwf_sites_serve(&g, ups, 1, 1, NULL, ",\"limits\":{\"max_pipeline\":1}"),
                     0);
    for (int i = 0; i < 3; i++)
        pipeline_then_reset(g.port, path, body);
    /* The answers come 300 ms after the requests, into reset sockets. */
    usleep(500 * 1000);
    check_alive(&g);
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(g.port, path, body, &r, 20000), 0);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);
    /* A clean exit: under ASan any report makes it non-zero. */
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_stop(&ups[0], SIGKILL, 5000);
}

/* A whole answer written into a reset socket. */
static void test_epipe_whole_answer(void **state)
{
    (void)state;
    run_case("/v1/completions", "{\"model\":\"m\",\"prompt\":\"hello\",\"max_tokens\":3}", NULL,
             NULL);
}

/* A stream whose headers (at its first token) go into a reset socket. */
static void test_epipe_stream_start(void **state)
{
    (void)state;
    run_case("/v1/completions",
             "{\"model\":\"m\",\"prompt\":\"hello\",\"max_tokens\":3,\"stream\":true}", NULL, NULL);
}

/* The same for a chat stream whose role delta was held until the content. */
static void test_epipe_chat_stream(void **state)
{
    (void)state;
    run_case("/v1/chat/completions",
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
             "\"max_tokens\":3,\"stream\":true}",
             "--chat-role-first", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_epipe_whole_answer),
        cmocka_unit_test(test_epipe_stream_start),
        cmocka_unit_test(test_epipe_chat_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
