/* Observability: the HTTP metrics move with the traffic (requests by route
 * and status, duration histogram by route, open connections, bytes in and
 * out), protocol errors count under "unmatched", and each finished request
 * writes one access-log line with method, path, status, bytes and peer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "infergate/log.h"
#include "infergate/metrics.h"
#include "testclient.h"
#include "testserver.h"

#define TMO 5000

/* The value of the first exposition line that starts with `series`, or -1. */
static double metric(const char *series)
{
    return ig_ts_metric(series, -1);
}

static double metric0(const char *series)
{
    double v = metric(series);
    return v < 0 ? 0 : v;
}

static void expect_metric(const char *series, double want)
{
    ig_ts_expect_metric(series, want, 0, 5000);
}

static void test_metrics(void **state)
{
    ig_ts_t *ts = ig_ts_start("127.0.0.1:0", NULL, ig_ts_echo_handler, NULL);
    assert_non_null(ts);
    const char *ok = "infergate_http_requests_total{route=\"/echo\",status=\"200\"}";
    const char *bad = "infergate_http_requests_total{route=\"unmatched\",status=\"400\"}";
    const char *hist = "infergate_http_request_duration_seconds_count{route=\"/echo\"}";
    double ok0 = metric0(ok), bad0 = metric0(bad), hist0 = metric0(hist);
    double rx0 = metric0("infergate_http_received_bytes_total");
    double tx0 = metric0("infergate_http_sent_bytes_total");

    ig_tc_t *tc = ig_tc_connect(ig_ts_port(ts));
    const char *req = "GET /m HTTP/1.1\r\nHost: t\r\n\r\n";
    size_t out = 0;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ig_tc_sends(tc, req), 0);
        ig_tc_response_t r;
        assert_int_equal(ig_tc_read_response(tc, &r, TMO), 0);
        ig_tc_response_free(&r);
    }
    expect_metric("infergate_http_open_connections", 1);
    ig_tc_response_t r;
    assert_int_equal(ig_tc_request(ig_ts_port(ts), "GET / HTTP/1.1\r\n\r\n", &r, TMO), 0);
    assert_int_equal(r.status, 400);
    ig_tc_response_free(&r);
    ig_tc_close(tc);
    (void)out;

    expect_metric(ok, ok0 + 3);
    expect_metric(bad, bad0 + 1);
    expect_metric(hist, hist0 + 3);
    expect_metric("infergate_http_received_bytes_total",
                  rx0 + 3 * strlen(req) + strlen("GET / HTTP/1.1\r\n\r\n"));
    assert_true(metric("infergate_http_sent_bytes_total") - tx0 > 3 * 100);
    ig_ts_stop(ts);
    expect_metric("infergate_http_open_connections", 0);
}

static void test_access_log(void **state)
{
    /* Capture stderr (where the log goes) in a file. */
    char path[64];
    snprintf(path, sizeof(path), "/tmp/ig-http-access-%d.log", (int)getpid());
    fflush(stderr);
    int saved = dup(2);
    FILE *f = fopen(path, "w+");
    assert_non_null(f);
    dup2(fileno(f), 2);
    ig_log_setup(IG_LOG_INFO, IG_LOG_JSON);

    ig_ts_t *ts = ig_ts_start("127.0.0.1:0", NULL, ig_ts_echo_handler, NULL);
    ig_tc_response_t r;
    assert_int_equal(ig_tc_request(ig_ts_port(ts),
                                   "POST /logged?q=1 HTTP/1.1\r\nHost: t\r\n"
                                   "Content-Length: 3\r\n\r\nabc",
                                   &r, TMO),
                     0);
    ig_tc_response_free(&r);
    ig_ts_stop(ts);

    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ig_log_setup(IG_LOG_INFO, IG_LOG_TEXT);
    char buf[4096];
    rewind(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    unlink(path);
    char *line = strstr(buf, "\"path\":\"/logged\"");
    assert_non_null(line);
    assert_non_null(strstr(buf, "\"method\":\"POST\""));
    assert_non_null(strstr(buf, "\"status\":200"));
    assert_non_null(strstr(buf, "\"bytes_in\":60"));
    assert_non_null(strstr(buf, "\"duration_s\":"));
    assert_non_null(strstr(buf, "\"peer\":\"127.0.0.1:"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_access_log),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
