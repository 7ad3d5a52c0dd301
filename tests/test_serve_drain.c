/*
 * A real drain: a completion in flight through the gateway (to a slow
 * upstream site, served in-process by the test server of tests/support) when
 * SIGTERM arrives finishes with its answer, and only then does
 * `infergate serve` exit 0.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>

#include "gwfixture.h"
#include "testserver.h"

#include "infergate/log.h"

#include <stdatomic.h>

#define UPSTREAM_DELAY_MS 1500

static atomic_int completions_received;

static void on_timer_closed(uv_handle_t *h)
{
    free(h);
}

static void answer_later(uv_timer_t *t)
{
    static const char body[] =
        "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":0,\"model\":\"tiny\","
        "\"choices\":[{\"index\":0,\"text\":\" ok\",\"finish_reason\":\"length\"}],"
        "\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}";
    ig_http_respond(t->data, 200, "application/json", body, sizeof(body) - 1);
    uv_close((uv_handle_t *)t, on_timer_closed);
}

/* The test server's loop, where the delay timers run (set once it started). */
static uv_loop_t *upstream_loop;

/* A slow OpenAI-style site that also answers the gateway's /load probe. */
static void upstream_handler(ig_http_req_t *req, void *data)
{
    const char *path = ig_http_req_path(req);
    if (strcmp(path, "/load") == 0) {
        static const char load[] = "{\"models\":[{\"id\":\"tiny\"}],\"ready_instances\":1,"
                                   "\"waiting\":0,\"est_wait_s\":0}";
        ig_http_respond(req, 200, "application/json", load, sizeof(load) - 1);
    } else if (strcmp(path, "/v1/completions") == 0) {
        uv_timer_t *t = malloc(sizeof(*t));
        uv_timer_init(upstream_loop, t);
        t->data = req;
        uv_timer_start(t, answer_later, UPSTREAM_DELAY_MS, 0);
        atomic_fetch_add(&completions_received, 1);
    } else {
        ig_http_respond_error(req, 404, NULL, NULL, NULL, "no %s here", path);
    }
}

static int received(void *arg)
{
    return atomic_load(&completions_received) > 0;
}

/* Polls GET path on port until its body contains needle (bounded). */
static int wait_for_body(int port, const char *path, const char *needle, int timeout_ms)
{
    long long end = ig_tc_now_ms() + timeout_ms;
    while (ig_tc_now_ms() < end) {
        ig_tc_response_t r;
        int found =
            ig_gwf_get(port, path, &r) == 0 && r.body != NULL && strstr(r.body, needle) != NULL;
        ig_tc_response_free(&r);
        if (found)
            return 0;
        poll(NULL, 0, 20);
    }
    return -1;
}

static void test_inflight_request_finishes(void **state)
{
    ig_proc_t gw;
    ig_http_limits_t limits;
    ig_http_limits_default(&limits);
    ig_ts_t *ts = ig_ts_start("127.0.0.1:0", &limits, upstream_handler, NULL);
    assert_non_null(ts);
    upstream_loop = ig_ts_loop(ts);

    char text[512];
    snprintf(text, sizeof(text),
             "{\"listen\": \"127.0.0.1:0\", \"models\": [{\"name\": \"tiny\"}],"
             " \"sites\": [{\"name\": \"up\", \"url\": \"http://127.0.0.1:%d\","
             " \"models\": [\"tiny\"]}], \"limits\": {\"drain_timeout_ms\": 20000,"
             " \"drain_grace_ms\": 0}}",
             ig_ts_port(ts));
    const char *config = ig_proc_temp_file(text, ".json");
    assert_non_null(config);
    const char *args[] = {"serve", "--config", config, NULL};
    assert_int_equal(ig_proc_start_bin(&gw, "infergate", args, IG_PROC_PIPES), 0);
    if (ig_proc_wait_announce(&gw, 1, 10000) != 0)
        fail_msg("serve did not start:\n%s", gw.err);
    /* Ready once the site's probe succeeded. */
    if (wait_for_body(gw.port, "/ready", "\"ready\"", 10000) != 0)
        fail_msg("never ready:\n%s", gw.err);

    ig_tc_t *tc = ig_tc_connect(gw.port);
    assert_non_null(tc);
    const char *body = "{\"model\": \"tiny\", \"prompt\": \"hi\", \"max_tokens\": 1}";
    snprintf(text, sizeof(text),
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n%s",
             strlen(body), body);
    assert_int_equal(ig_tc_sends(tc, text), 0);
    /* In flight: the upstream holds it for UPSTREAM_DELAY_MS. */
    assert_true(ig_ts_wait(received, NULL, 5000));

    long long t0 = ig_tc_now_ms();
    kill(gw.pid, SIGTERM);
    /* The answer still comes, whole. */
    ig_tc_response_t r;
    memset(&r, 0, sizeof(r));
    assert_int_equal(ig_tc_read_response(tc, &r, 10000), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"text_completion\""));
    long long answered = ig_tc_now_ms() - t0;
    ig_tc_response_free(&r);
    /* After the answer the drained connection closes and the process exits 0. */
    assert_int_equal(ig_tc_wait_closed(tc, 5000), 1);
    assert_int_equal(ig_proc_wait_exit(&gw, 10000), 0);
    if (strstr(gw.err, "SIGTERM: draining (1 requests in flight") == NULL)
        fail_msg("no drain line:\n%s", gw.err);
    assert_non_null(strstr(gw.err, "drained; exiting"));
    /* It waited for the upstream rather than cutting the request short. */
    assert_true(answered >= UPSTREAM_DELAY_MS / 3);

    ig_tc_close(tc);
    ig_proc_dispose(&gw);
    ig_ts_stop(ts);
    unlink(config);
}

int main(void)
{
    ig_log_setup(IG_LOG_WARN, IG_LOG_TEXT); /* the in-process upstream's access lines */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inflight_request_finishes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
