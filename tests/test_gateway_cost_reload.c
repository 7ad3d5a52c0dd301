/*
 * Prices are reloaded without dropping a request, and the cost metrics pass
 * promtool (docs/routing.md, "Cost per answer"):
 *  - three answers and a stream in flight on a per-token site when a reload
 *    doubles its prices all complete, each charged the price it began
 *    under; a request after the reload costs twice as much, and a whole
 *    chat answer carries its cost in x-infergate-cost too;
 *  - with a per-token site, a per-hour site and a key with a budget, every
 *    cost series (infergate_cost_usd_total, _idle_usd_total,
 *    _per_1m_output_tokens, infergate_key_spend_usd_total) is on /metrics,
 *    labelled with the key's name and never its secret, and
 *    `promtool check metrics` finds nothing to say.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "files.h"
#include "gwfixture.h"
#include "testclient.h"

static const char *plain_body = "{\"model\":\"m\",\"prompt\":\"hello there\",\"max_tokens\":4}";
static const char *stream_body =
    "{\"model\":\"m\",\"prompt\":\"hello there\",\"max_tokens\":4,\"stream\":true}";

/* The config of the reload test: site "tok" at the given prices. */
static void write_config(char *buf, size_t len, int port, int up_port, double in, double out)
{
    int n =
        snprintf(buf, len,
                 "{\"region\":\"test\",\"listen\":\"127.0.0.1:%d\",\"models\":[{\"name\":\"m\"}],"
                 "\"sites\":[{\"name\":\"tok\",\"url\":\"http://127.0.0.1:%d\","
                 "\"models\":[\"m\"],\"price\":{\"per_1m_input_tokens\":%g,"
                 "\"per_1m_output_tokens\":%g}}],\"limits\":{\"drain_grace_ms\":0}}",
                 port, up_port, in, out);
    assert_true(n > 0 && (size_t)n < len);
}

static double header_cost(const ig_tc_response_t *r)
{
    const char *c = ig_tc_header(r, "x-infergate-cost");
    assert_non_null(c);
    return atof(c);
}

/* Equal to the 6 significant digits of the header. */
static void near6(double got, double want)
{
    print_message("cost %.9g, want %.9g\n", got, want);
    assert_true(fabs(got - want) <= 1e-5 * fabs(want));
}

static void test_reload_keeps_requests(void **state)
{
    (void)state;
    ig_proc_t up;
    assert_int_equal(
        ig_gwf_upstream(&up, "--slots", "8", "--delay-ms", "3000", "--itl-ms", "1", NULL), 0);
    int port = ig_proc_free_port();
    char cfg[1024];
    write_config(cfg, sizeof(cfg), port, up.port, 1.0, 3.0);
    const char *path = ig_proc_temp_file(cfg, ".json");
    assert_non_null(path);
    ig_proc_t g;
    assert_int_equal(ig_gwf_serve(&g, path, port, "warn", 0, 10000, 15000), 0);

    /* The cost of one answer at the first prices, before any reload. */
    assert_int_equal(ig_gwf_control(up.port, "delay?ms=1"), 200);
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(g.port, "/v1/completions", plain_body, &r, 20000), 0);
    assert_int_equal(r.status, 200);
    double before = header_cost(&r);
    ig_tc_response_free(&r);
    assert_true(before > 0);
    assert_int_equal(ig_gwf_control(up.port, "delay?ms=3000"), 200);

    /* Three answers and a stream in flight at the upstream. */
    int taken = ig_gwf_upstream_stat(up.port, "completions");
    ig_tc_t *tc[4];
    for (int i = 0; i < 4; i++) {
        tc[i] = ig_tc_connect(g.port);
        assert_non_null(tc[i]);
        assert_int_equal(
            ig_tc_send_post(tc[i], "/v1/completions", i < 3 ? plain_body : stream_body), 0);
    }
    long long end = ig_tc_now_ms() + 5000;
    while (ig_gwf_upstream_stat(up.port, "completions") < taken + 4 && ig_tc_now_ms() < end)
        usleep(10000);
    assert_int_equal(ig_gwf_upstream_stat(up.port, "completions"), taken + 4);

    /* Prices doubled while they wait. */
    write_config(cfg, sizeof(cfg), port, up.port, 2.0, 6.0);
    assert_int_equal(ig_tf_replace(path, cfg, strlen(cfg)), 0);
    kill(g.pid, SIGHUP);
    assert_int_equal(ig_gwf_wait_reloads(g.port, "applied", 1, 10000), 0);
    assert_int_equal(ig_gwf_upstream_stat(up.port, "busy"), 4); /* none answered yet */

    for (int i = 0; i < 4; i++) {
        assert_int_equal(ig_tc_read_response(tc[i], &r, 20000), 0);
        assert_int_equal(r.status, 200);
        if (i < 3) {
            near6(header_cost(&r), before); /* charged as it began */
        } else {
            const char *c = strstr(r.body, ": x-infergate-cost: ");
            assert_non_null(c);
            assert_non_null(strstr(r.body, "data: [DONE]"));
            assert_true(atof(c + strlen(": x-infergate-cost: ")) > 0);
        }
        ig_tc_response_free(&r);
        ig_tc_close(tc[i]);
    }

    /* After the reload: the same answer at twice the prices. */
    assert_int_equal(ig_gwf_control(up.port, "delay?ms=1"), 200);
    assert_int_equal(ig_gwf_post(g.port, "/v1/completions", plain_body, &r, 20000), 0);
    assert_int_equal(r.status, 200);
    near6(header_cost(&r), 2 * before);
    ig_tc_response_free(&r);
    /* and a whole chat answer carries its cost too */
    assert_int_equal(ig_gwf_post(g.port, "/v1/chat/completions",
                                 "{\"model\":\"m\",\"max_tokens\":4,\"messages\":"
                                 "[{\"role\":\"user\",\"content\":\"hello there\"}]}",
                                 &r, 20000),
                     0);
    assert_int_equal(r.status, 200);
    assert_true(header_cost(&r) > 0);
    ig_tc_response_free(&r);
    assert_true(ig_gwf_reloads(g.port, "failed") == 0);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_dispose(&g);
    ig_proc_stop(&up, SIGKILL, 5000);
    ig_proc_dispose(&up);
}

static ig_tc_response_t post_key(int port, const char *key, const char *body)
{
    char auth[256];
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", key);
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post_headers(port, "/v1/completions", auth, body, &r, 20000), 0);
    return r;
}

static void test_cost_metrics_promtool(void **state)
{
    (void)state;
    if (system("command -v promtool >/dev/null 2>&1") != 0)
        fail_msg("promtool not found (apt-get install prometheus; scripts/deps.sh test)");
    ig_proc_t ups[2];
    assert_int_equal(ig_gwf_upstream(&ups[0], "--delay-ms", "5", "--itl-ms", "1", NULL), 0);
    assert_int_equal(ig_gwf_upstream(&ups[1], "--delay-ms", "5", "--itl-ms", "1", NULL), 0);
    ig_proc_t g;
    int port = ig_proc_free_port();
    assert_int_equal(
        ig_gwf_serve_config(
            &g, port, "warn", 0, 10000, 15000,
            "{\"region\":\"test\",\"listen\":\"127.0.0.1:%d\",\"models\":[{\"name\":\"m\"}],"
            "\"api_keys\":[{\"key\":\"sk-secret-4711\",\"name\":\"team-a\",\"budget_usd\":5,"
            "\"budget_period\":\"month\"}],"
            "\"sites\":[{\"name\":\"tok\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"],"
            "\"price\":{\"per_1m_input_tokens\":1,\"per_1m_output_tokens\":3}},"
            "{\"name\":\"hour\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"],"
            "\"price\":{\"per_hour\":3.6}}],"
            "\"routing\":{\"policy\":\"round_robin\"},\"limits\":{\"drain_grace_ms\":0}}",
            port, ups[0].port, ups[1].port),
        0);
    long long end = ig_tc_now_ms() + 10000;
    while (ig_gwf_sites_up(g.port, NULL, 0) < 2 && ig_tc_now_ms() < end)
        usleep(20000);
    assert_int_equal(ig_gwf_sites_up(g.port, NULL, 0), 2);
    for (int i = 0; i < 6; i++) {
        ig_tc_response_t r = post_key(g.port, "sk-secret-4711", plain_body);
        assert_int_equal(r.status, 200);
        ig_tc_response_free(&r);
    }
    /* Idle capacity is counted at the status tick (2 s). */
    const char *idle = "infergate_cost_idle_usd_total{upstream=\"hour\"} ";
    end = ig_tc_now_ms() + 6000;
    while (ig_gwf_metric(g.port, idle) <= 0 && ig_tc_now_ms() < end)
        usleep(100000);
    char *m = ig_gwf_get_text(g.port, "/metrics");
    assert_non_null(m);
    static const char *const series[] = {
        "infergate_cost_usd_total{upstream=\"tok\",model=\"m\",key=\"team-a\"} ",
        "infergate_cost_usd_total{upstream=\"hour\",model=\"m\",key=\"team-a\"} ",
        "infergate_cost_idle_usd_total{upstream=\"hour\"} ",
        "infergate_cost_per_1m_output_tokens{upstream=\"tok\"} ",
        "infergate_cost_per_1m_output_tokens{upstream=\"hour\"} ",
        "infergate_key_spend_usd_total{key=\"team-a\"} ",
    };
    for (size_t i = 0; i < sizeof(series) / sizeof(series[0]); i++) {
        if (strstr(m, series[i]) == NULL)
            fail_msg("no %s on /metrics:\n%s", series[i], m);
    }
    assert_null(strstr(m, "sk-secret-4711"));
    const char *path = ig_proc_temp_file(m, ".prom");
    assert_non_null(path);
    free(m);
    char cmd[512], out[4096];
    snprintf(cmd, sizeof(cmd), "promtool check metrics < %s 2>&1", path);
    int rc = ig_proc_capture(cmd, out, sizeof(out));
    if (rc != 0 || out[0] != '\0')
        fail_msg("promtool check metrics (rc %d) on %s:\n%s", rc, path, out);
    unlink(path);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_dispose(&g);
    for (int i = 0; i < 2; i++) {
        ig_proc_stop(&ups[i], SIGKILL, 5000);
        ig_proc_dispose(&ups[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reload_keeps_requests),
        cmocka_unit_test(test_cost_metrics_promtool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
