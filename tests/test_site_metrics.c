/*
 * A plain site's own load, from its /metrics: two python3 http.server
 * sites (tests/peers/models_site.py) serve model m and publish vLLM's
 * queue gauges. The one whose gauge says 40 requests wait there (other
 * gateway replicas' traffic, as this gateway cannot see it) gets next to
 * none of this gateway's requests; when the gauges swap, so does the
 * traffic. /status shows what each site's /metrics said.
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
#include <unistd.h>

#include "files.h"
#include "gwfixture.h"
#include "peers.h"

static ig_models_site_t site[2];
static char metrics_file[2][300];
static ig_proc_t gw;

static void write_gauges(int i, int running, int waiting)
{
    char text[512];
    int n = snprintf(text, sizeof(text),
                     "# TYPE vllm:num_requests_running gauge\n"
                     "vllm:num_requests_running{model_name=\"m\"} %d.0\n"
                     "# TYPE vllm:num_requests_waiting gauge\n"
                     "vllm:num_requests_waiting{model_name=\"m\"} %d.0\n",
                     running, waiting);
    assert_int_equal(ig_tf_replace(metrics_file[i], text, (size_t)n), 0);
}

static int group_setup(void **state)
{
    (void)state;
    char dir[200];
    if (ig_tf_mkdtemp(dir, sizeof(dir)) != 0)
        return -1;
    for (int i = 0; i < 2; i++) {
        snprintf(metrics_file[i], sizeof(metrics_file[i]), "%s/metrics%d", dir, i);
        write_gauges(i, 4, i == 0 ? 40 : 0);
        const char *args[] = {"--metrics-file", metrics_file[i], NULL};
        if (ig_models_site_start(&site[i], "m\n", args) != 0)
            return -1;
    }
    int port = ig_proc_free_port();
    return ig_gwf_serve_config(
        &gw, port, "warn", 0, 10000, 15000,
        "{\"region\":\"r\",\"listen\":\"127.0.0.1:%d\",\"models\":[{\"name\":\"m\"}],"
        "\"routing\":{\"policy\":\"latency\",\"explore_ratio\":0},"
        "\"sites\":[{\"name\":\"a\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"]},"
        "{\"name\":\"b\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"]}]}",
        port, site[0].proc.port, site[1].proc.port);
}

static int group_teardown(void **state)
{
    (void)state;
    ig_proc_stop(&gw, SIGTERM, 10000);
    ig_proc_dispose(&gw);
    for (int i = 0; i < 2; i++)
        ig_models_site_stop(&site[i]);
    return 0;
}

/* The waiting gauge /status shows for site name, or -1 when none. */
static double waiting_of(const char *name)
{
    json_t *s = ig_gwf_site_status(gw.port, name);
    json_t *m = json_object_get(s, "metrics");
    double w = -1;
    if (m != NULL) {
        assert_string_equal(json_string_value(json_object_get(m, "server")), "vllm");
        w = json_number_value(json_object_get(m, "waiting"));
    }
    json_decref(s);
    return w;
}

static int wait_waiting(const char *name, double want)
{
    for (long long end = ig_tc_now_ms() + 10000; ig_tc_now_ms() < end; usleep(50000))
        if (waiting_of(name) == want)
            return 0;
    return -1;
}

/* Sends n completions one after another; how many site name answered. */
static int served_by(const char *name, int n)
{
    int count = 0;
    for (int k = 0; k < n; k++) {
        ig_tc_response_t r;
        assert_int_equal(ig_gwf_post(gw.port, "/v1/completions",
                                     "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":2}", &r,
                                     10000),
                         0);
        assert_int_equal(r.status, 200);
        const char *up = ig_tc_header(&r, "x-infergate-upstream");
        count += up != NULL && strcmp(up, name) == 0;
        ig_tc_response_free(&r);
    }
    return count;
}

static void test_queue_gauges_steer(void **state)
{
    (void)state;
    assert_int_equal(wait_waiting("a", 40), 0);
    assert_int_equal(wait_waiting("b", 0), 0);
    /* The first answers teach the router each site's service time (until
     * then the pick runs on priors and may go either way: up to 6 of the
     * first 20 went to a); from then on a's 40 waiting requests outweigh
     * it. */
    served_by("b", 10);
    assert_true(served_by("b", 20) >= 17);
    write_gauges(0, 4, 0);
    write_gauges(1, 4, 40);
    assert_int_equal(wait_waiting("a", 0), 0);
    assert_int_equal(wait_waiting("b", 40), 0);
    served_by("a", 10);
    assert_true(served_by("a", 20) >= 17);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queue_gauges_steer),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
