/*
 * The drain grace of `infergate serve` (limits.drain_grace_ms): after
 * SIGTERM, /ready answers 503 at once while new connections are still
 * accepted and served (a readiness probe can see the 503 before anything
 * is refused); after the grace the listener is closed, and a request in
 * flight all along still gets its whole answer before the process exits 0.
 *
 * Timing: it checks that the listener stays open for the grace (GRACE_MS)
 * and closes within a bounded time after it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gwfixture.h"
#include "testserver.h"

#include "infergate/log.h"

#include <stdatomic.h>

#define GRACE_MS 1500
#define UPSTREAM_DELAY_MS 3000

static atomic_int completions_received;
static uv_loop_t *upstream_loop;

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

/* A slow OpenAI-style site that answers the gateway's /load probe. */
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

static int get_status(int port, const char *path)
{
    ig_tc_response_t r;
    int st = ig_gwf_get(port, path, &r) == 0 ? r.status : -1;
    ig_tc_response_free(&r);
    return st;
}

static void test_grace_then_close(void **state)
{
    ig_proc_t gw;
    ig_http_limits_t limits;
    ig_http_limits_default(&limits);
    ig_ts_t *ts = ig_ts_start("127.0.0.1:0", &limits, upstream_handler, NULL);
    assert_non_null(ts);
    upstream_loop = ig_ts_loop(ts);

    char text[640];
    snprintf(text, sizeof(text),
             "{\"listen\": \"127.0.0.1:0\", \"models\": [{\"name\": \"tiny\"}],"
             " \"sites\": [{\"name\": \"up\", \"url\": \"http://127.0.0.1:%d\","
             " \"models\": [\"tiny\"]}],"
             " \"limits\": {\"drain_timeout_ms\": 20000, \"drain_grace_ms\": %d}}",
             ig_ts_port(ts), GRACE_MS);
    const char *config = ig_proc_temp_file(text, ".json");
    assert_non_null(config);
    const char *args[] = {"serve", "--config", config, NULL};
    assert_int_equal(ig_proc_start_bin(&gw, "infergate", args, IG_PROC_PIPES), 0);
    if (ig_proc_wait_announce(&gw, 1, 10000) != 0)
        fail_msg("serve did not start:\n%s", gw.err);
    assert_int_equal(ig_proc_wait_status(gw.port, "/ready", 200, 10000), 0);

    /* A request in flight across the whole shutdown. */
    ig_tc_t *tc = ig_tc_connect(gw.port);
    assert_non_null(tc);
    const char *body = "{\"model\": \"tiny\", \"prompt\": \"hi\", \"max_tokens\": 1}";
    snprintf(text, sizeof(text),
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n%s",
             strlen(body), body);
    assert_int_equal(ig_tc_sends(tc, text), 0);
    assert_true(ig_ts_wait(received, NULL, 5000));

    long long t0 = ig_tc_now_ms();
    kill(gw.pid, SIGTERM);
    assert_int_equal(ig_proc_wait_log(&gw, "SIGTERM: draining (1 requests in flight", 5000), 0);

    /* The grace: /ready says 503 on a new connection, /health is served. */
    assert_int_equal(get_status(gw.port, "/ready"), 503);
    assert_int_equal(get_status(gw.port, "/health"), 200);
    int probes = 0;
    while (ig_tc_now_ms() - t0 < GRACE_MS - 400) {
        assert_int_equal(get_status(gw.port, "/ready"), 503);
        probes++;
        poll(NULL, 0, 100);
    }
    long long during = ig_tc_now_ms() - t0;
    assert_true(probes >= 1);
    assert_true(during < GRACE_MS); /* all of the above within the grace */

    /* After the grace: refused. */
    long long refused = -1;
    while (ig_tc_now_ms() - t0 < GRACE_MS + 3000) {
        int fd = ig_proc_connect(gw.port);
        if (fd < 0) {
            refused = ig_tc_now_ms() - t0;
            break;
        }
        close(fd);
        poll(NULL, 0, 20);
    }
    if (refused < 0)
        fail_msg("still accepting %d ms after SIGTERM:\n%s", GRACE_MS + 3000, gw.err);
    assert_true(refused >= GRACE_MS - 100);
    assert_int_equal(ig_proc_wait_log(&gw, "closing the listener: 1 requests in flight", 2000), 0);

    /* The request in flight gets its whole answer, then the process exits 0. */
    ig_tc_response_t r;
    memset(&r, 0, sizeof(r));
    assert_int_equal(ig_tc_read_response(tc, &r, 10000), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"text_completion\""));
    ig_tc_response_free(&r);
    assert_int_equal(ig_proc_wait_exit(&gw, 10000), 0);
    assert_non_null(strstr(gw.err, "drained; exiting"));

    ig_tc_close(tc);
    ig_proc_dispose(&gw);
    ig_ts_stop(ts);
    unlink(config);
}

/* A second signal during the grace exits at once with status 1. */
static void test_second_signal_in_grace(void **state)
{
    ig_proc_t p;
    const char *config = ig_proc_temp_file(
        "{\"listen\": \"127.0.0.1:0\", \"limits\": {\"drain_grace_ms\": 20000}}", ".json");
    assert_non_null(config);
    const char *args[] = {"serve", "--config", config, NULL};
    assert_int_equal(ig_proc_start_bin(&p, "infergate", args, IG_PROC_PIPES), 0);
    if (ig_proc_wait_announce(&p, 1, 10000) != 0)
        fail_msg("serve did not start:\n%s", p.err);
    kill(p.pid, SIGTERM);
    assert_int_equal(ig_proc_wait_log(&p, "SIGTERM: draining", 5000), 0);
    assert_int_equal(get_status(p.port, "/health"), 200); /* in the grace */
    long long t0 = ig_tc_now_ms();
    kill(p.pid, SIGTERM);
    assert_int_equal(ig_proc_wait_exit(&p, 5000), 1);
    assert_true(ig_tc_now_ms() - t0 < 2000);
    assert_non_null(strstr(p.err, "SIGTERM again: exiting without waiting"));
    ig_proc_dispose(&p);
    unlink(config);
}

int main(void)
{
    ig_log_setup(IG_LOG_WARN, IG_LOG_TEXT); /* the in-process upstream's access lines */
    setenv("INFERGATE_CACHE_DIR", "/tmp/infergate-test-cache", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grace_then_close),
        cmocka_unit_test(test_second_signal_in_grace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
