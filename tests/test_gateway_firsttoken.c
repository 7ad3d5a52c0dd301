/*
 * The proxy's first-token deadline (ig_proxy_opts_t.first_token_timeout_ms)
 * counts to the first content token of a stream, not to the headers or a
 * chat stream's role delta. In-process proxy and HTTP server on a loop
 * thread, a real test upstream process (build/testupstream
 * --chat-role-first) behind it, the blocking test client in front.
 *
 * Timing: a 300 ms deadline against a 3 s first token.
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

#include "gwfixture.h"
#include "infergate/proxy.h"
#include "infergate/upstream.h"
#include "testserver.h"

typedef struct {
    int upstream_port;
    uint64_t first_token_timeout_ms;
    ig_upstream_t *client;
    ig_router_upstream_t route;
    ig_proxy_t *px;
    int closed;
} fixture_t;

static int resolve(void *data, const char *model, ig_proxy_target_t *out, int max, int *starting)
{
    fixture_t *f = data;
    (void)model;
    (void)max;
    *starting = 0;
    out[0].client = f->client;
    out[0].route = &f->route;
    out[0].is_site = 0;
    return 1;
}

static void handler(ig_http_req_t *req, void *data)
{
    fixture_t *f = data;
    size_t len;
    const char *body = ig_http_req_body(req, &len);
    ig_proxy_call_t call = {
        .model = "m",
        .path = ig_http_req_path(req),
        .stream = strstr(body, "\"stream\":true") != NULL,
        .prompt_tokens = 4,
        .body = body,
        .len = len,
    };
    ig_proxy_handle(f->px, req, &call);
}

static void setup_on_loop(ig_ts_t *ts, void *arg)
{
    fixture_t *f = arg;
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", f->upstream_port);
    assert_int_equal(ig_upstream_start(&f->client, ig_ts_loop(ts), "u0", addr, NULL), 0);
    ig_router_upstream_init(&f->route, "u0", IG_ROUTER_LOCAL);
    f->route.ready = 1;
    ig_proxy_opts_t o;
    ig_proxy_opts_default(&o);
    o.first_token_timeout_ms = f->first_token_timeout_ms;
    o.router.max_retries = 0;
    assert_int_equal(ig_proxy_start(&f->px, ig_ts_loop(ts), &o, resolve, f), 0);
}

static void on_closed(void *data)
{
    (*(int *)data)++;
}

static void close_on_loop(ig_ts_t *ts, void *arg)
{
    fixture_t *f = arg;
    (void)ts;
    ig_proxy_close(f->px, on_closed, &f->closed);
    ig_upstream_close(f->client, on_closed, &f->closed);
}

static int both_closed(void *arg)
{
    return ((fixture_t *)arg)->closed == 2;
}

static const char *chat_stream =
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
    "\"max_tokens\":2,\"stream\":true}";

static void run(uint64_t timeout_ms, int *status, long long *took, char **body)
{
    ig_proc_t up;
    const char *args[] = {"--quiet", "--chat-role-first", "--delay-ms", "3000", NULL};
    assert_int_equal(ig_gwf_tool(&up, "testupstream", ig_proc_free_port(), args, 10000), 0);
    fixture_t f = {.upstream_port = up.port, .first_token_timeout_ms = timeout_ms};
    ig_ts_t *ts = ig_ts_start("127.0.0.1:0", NULL, handler, &f);
    assert_non_null(ts);
    ig_ts_call(ts, setup_on_loop, &f);
    ig_tc_response_t r;
    long long t0 = ig_tc_now_ms();
    assert_int_equal(ig_gwf_post(ig_ts_port(ts), "/v1/chat/completions", chat_stream, &r, 10000),
                     0);
    *took = ig_tc_now_ms() - t0;
    *status = r.status;
    *body = strdup(r.body);
    ig_tc_response_free(&r);
    ig_ts_call(ts, close_on_loop, &f);
    assert_true(ig_ts_wait(both_closed, &f, 5000));
    ig_ts_stop(ts);
    ig_proc_stop(&up, SIGKILL, 5000);
}

/* The role delta came at once, the content would come after 3 s: the
 * deadline of 300 ms fires, and as nothing reached the client it gets a
 * 504, not a stream that hangs. */
static void test_role_delta_does_not_meet_the_deadline(void **state)
{
    (void)state;
    int status;
    long long took;
    char *body;
    run(300, &status, &took, &body);
    print_message("%d after %lld ms: %s\n", status, took, body);
    assert_int_equal(status, 504);
    assert_non_null(strstr(body, "upstream_timeout"));
    assert_true(took >= 250 && took < 2500);
    free(body);
}

/* Without a deadline the same stream is served whole, role delta first. */
static void test_no_deadline_waits_for_the_token(void **state)
{
    (void)state;
    int status;
    long long took;
    char *body;
    run(0, &status, &took, &body);
    assert_int_equal(status, 200);
    const char *role = strstr(body, "\"role\":\"assistant\"");
    const char *done = strstr(body, "[DONE]");
    assert_non_null(role);
    assert_non_null(done);
    assert_true(role < done);
    assert_true(took >= 2900);
    free(body);
}

int main(void)
{
    /* The libuv clients in this process write to peers that may have
     * closed: that must cost an EPIPE, not the test (as serve.c does). */
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_role_delta_does_not_meet_the_deadline),
        cmocka_unit_test(test_no_deadline_waits_for_the_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
