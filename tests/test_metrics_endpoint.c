/*
 * One scrape target per region: the gateway's /metrics carries the
 * infergate_worker_* metrics of every local instance, labelled pool and
 * instance, pulled from real worker processes at scrape time; the region's
 * token counters and ITL histogram count what the answers carried; a
 * stopped worker is left out within the federation timeout; promtool
 * (Debian's prometheus package) finds the whole text clean.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "files.h"
#include "gwfixture.h"

static ig_proc_t gw;

static int group_setup(void **state)
{
    if (ig_gwf_model_setup(state) != 0)
        return -1;
    int port = ig_proc_free_port();
    const char *path = ig_gwf_pool_config("fed", port, ig_gwf_model_dir, 2, 2, 2, 8, NULL, NULL);
    if (path == NULL || ig_gwf_serve(&gw, path, port, "warn", 0, 20000, 60000) != 0)
        return -1;
    /* /ready is 200 with one instance ready; these tests want both. */
    for (int i = 0; i < 600; i++) {
        json_t *st = ig_gwf_get_json(port, "/status");
        json_t *counts =
            json_object_get(json_array_get(json_object_get(st, "pools"), 0), "instance_counts");
        int ready = (int)json_integer_value(json_object_get(counts, "ready"));
        json_decref(st);
        if (ready == 2)
            return 0;
        usleep(100 * 1000);
    }
    fprintf(stderr, "the second instance was not ready within 60 s\n");
    return -1;
}

static int group_teardown(void **state)
{
    ig_proc_stop(&gw, SIGTERM, 20000);
    ig_proc_dispose(&gw);
    return ig_gwf_model_teardown(state);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Lines of text that start with prefix. */
static int count_lines(const char *text, const char *prefix)
{
    int n = 0;
    size_t pl = strlen(prefix);
    for (const char *p = text; p != NULL && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, prefix, pl) == 0)
            n++;
    }
    return n;
}

/* The value of the first line starting with series, or -1. */
static double value_of(const char *text, const char *series)
{
    size_t sl = strlen(series);
    for (const char *p = text; p != NULL && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, series, sl) == 0)
            return strtod(p + sl, NULL);
    }
    return -1;
}

/* Worker pids of the pool, by instance number, from /status. */
static int pid_of(int port, int n)
{
    json_t *st = ig_gwf_get_json(port, "/status");
    json_t *in = json_array_get(
        json_object_get(json_array_get(json_object_get(st, "pools"), 0), "instances"), (size_t)n);
    int pid = (int)json_integer_value(json_object_get(in, "pid"));
    json_decref(st);
    return pid;
}

typedef struct {
    int port;
    int upstream; /* 0 or 1: which instance answered; -1 on failure */
    long long gen;
} call_t;

static void *one_call(void *arg)
{
    call_t *c = arg;
    ig_tc_response_t r;
    c->upstream = -1;
    if (ig_gwf_complete(c->port, 24, &r) != 0)
        return NULL;
    const char *u = ig_tc_header(&r, "x-infergate-upstream");
    json_t *o = r.status == 200 ? json_loads(r.body, 0, NULL) : NULL;
    if (o != NULL && u != NULL) {
        c->upstream = strcmp(u, "cpu/1") == 0;
        c->gen =
            json_integer_value(json_object_get(json_object_get(o, "usage"), "completion_tokens"));
    }
    json_decref(o);
    ig_tc_response_free(&r);
    return NULL;
}

/* Rounds of 4 concurrent completions until both instances have served one;
 * the completion tokens the answers reported, summed. */
static long long serve_both(int port)
{
    long long gen = 0;
    int seen[2] = {0, 0};
    for (int round = 0; round < 5 && !(seen[0] && seen[1]); round++) {
        pthread_t th[4];
        call_t c[4];
        for (int i = 0; i < 4; i++) {
            c[i].port = port;
            c[i].gen = 0;
            assert_int_equal(pthread_create(&th[i], NULL, one_call, &c[i]), 0);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            assert_true(c[i].upstream >= 0);
            seen[c[i].upstream]++;
            gen += c[i].gen;
        }
    }
    assert_true(seen[0] > 0 && seen[1] > 0);
    return gen;
}

static void test_instances_labelled(void **state)
{
    (void)state;
    long long gen = serve_both(gw.port);
    char *m = ig_gwf_get_text(gw.port, "/metrics");
    assert_non_null(m);
    /* Each instance's worker series, under its pool and instance labels. */
    for (int i = 0; i < 2; i++) {
        char series[160];
        snprintf(series, sizeof(series),
                 "infergate_worker_prompt_tokens_total{pool=\"cpu\",instance=\"cpu/%d\"} ", i);
        assert_true(value_of(m, series) > 0);
        snprintf(
            series, sizeof(series),
            "infergate_worker_batch_size_bucket{pool=\"cpu\",instance=\"cpu/%d\",le=\"+Inf\"} ", i);
        assert_true(value_of(m, series) >= 1);
        snprintf(series, sizeof(series),
                 "infergate_worker_requests_running{pool=\"cpu\",instance=\"cpu/%d\"} ", i);
        assert_true(value_of(m, series) >= 0);
        snprintf(series, sizeof(series),
                 "infergate_instance_scrape_up{pool=\"cpu\",instance=\"cpu/%d\"} ", i);
        assert_true(value_of(m, series) == 1);
    }
    /* One HELP and TYPE per family, whatever the number of instances. */
    assert_int_equal(count_lines(m, "# TYPE infergate_worker_batch_size "), 1);
    assert_int_equal(count_lines(m, "# HELP infergate_worker_prompt_tokens_total "), 1);
    /* Nothing of a worker outside its own families (its HTTP counters). */
    assert_int_equal(count_lines(m, "# TYPE infergate_http_requests_total "), 1);
    /* Region counters: what the answers reported. */
    double g = value_of(m, "infergate_generation_tokens_total{model=\"tiny\"} ");
    assert_true(g >= (double)gen && gen > 0);
    assert_true(value_of(m, "infergate_prompt_tokens_total{model=\"tiny\"} ") > 0);
    free(m);
}

static void test_itl_of_a_stream(void **state)
{
    (void)state;
    char *before = ig_gwf_get_text(gw.port, "/metrics");
    assert_non_null(before);
    double c0 = value_of(before, "infergate_inter_token_latency_seconds_count{model=\"tiny\"} ");
    double g0 = value_of(before, "infergate_generation_tokens_total{model=\"tiny\"} ");
    free(before);
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(gw.port, "/v1/completions",
                                 "{\"model\":\"tiny\",\"prompt\":\"once upon a time\","
                                 "\"max_tokens\":6,\"temperature\":0,\"stream\":true,"
                                 "\"ignore_eos\":true}",
                                 &r, 60000),
                     0);
    assert_int_equal(r.status, 200);
    int events = 0;
    for (const char *p = r.body; (p = strstr(p, "\"text\":\"")) != NULL; p += 8) {
        if (p[8] != '"')
            events++;
    }
    ig_tc_response_free(&r);
    assert_true(events >= 2);
    char *after = ig_gwf_get_text(gw.port, "/metrics");
    assert_non_null(after);
    double c1 = value_of(after, "infergate_inter_token_latency_seconds_count{model=\"tiny\"} ");
    double g1 = value_of(after, "infergate_generation_tokens_total{model=\"tiny\"} ");
    free(after);
    /* n content events are n - 1 gaps; a stream without usage counts events. */
    assert_true(c1 - (c0 < 0 ? 0 : c0) == events - 1);
    assert_true(g1 - g0 == events);
}

static void test_promtool_clean(void **state)
{
    (void)state;
    if (system("command -v promtool >/dev/null 2>&1") != 0)
        fail_msg("promtool not found (apt-get install prometheus; scripts/deps.sh test)");
    char *m = ig_gwf_get_text(gw.port, "/metrics");
    assert_non_null(m);
    assert_non_null(strstr(m, "instance=\"cpu/1\""));
    /* The answers of the tests before put each upstream's TTFT histogram
     * in what promtool reads. */
    assert_non_null(strstr(m, "infergate_upstream_time_to_first_token_seconds_bucket{upstream=\""));
    const char *path = ig_proc_temp_file(m, ".prom");
    assert_non_null(path);
    free(m);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "promtool check metrics < %s 2>&1", path);
    char out[4096];
    int rc = ig_proc_capture(cmd, out, sizeof(out));
    if (rc != 0 || out[0] != '\0')
        fail_msg("promtool check metrics (rc %d) on %s:\n%s", rc, path, out);
    unlink(path);
}

/* A worker that cannot answer (SIGSTOP) costs the scrape the federation
 * timeout, not more, and is marked down; the other still reports. */
static void test_stopped_worker_left_out(void **state)
{
    (void)state;
    int pid = pid_of(gw.port, 1);
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGSTOP), 0);
    double t0 = now_s();
    char *m = ig_gwf_get_text(gw.port, "/metrics");
    double took = now_s() - t0;
    kill(pid, SIGCONT);
    assert_non_null(m);
    assert_true(took >= 0.4 && took < 3.0);
    assert_true(value_of(m, "infergate_instance_scrape_up{pool=\"cpu\",instance=\"cpu/1\"} ") == 0);
    assert_true(value_of(m, "infergate_instance_scrape_up{pool=\"cpu\",instance=\"cpu/0\"} ") == 1);
    assert_int_equal(
        count_lines(m, "infergate_worker_prompt_tokens_total{pool=\"cpu\",instance=\"cpu/1\"}"), 0);
    assert_int_equal(
        count_lines(m, "infergate_worker_prompt_tokens_total{pool=\"cpu\",instance=\"cpu/0\"}"), 1);
    free(m);
    /* Back: the next scrape has it again. */
    m = ig_gwf_get_text(gw.port, "/metrics");
    assert_non_null(m);
    assert_true(value_of(m, "infergate_instance_scrape_up{pool=\"cpu\",instance=\"cpu/1\"} ") == 1);
    free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_instances_labelled),
        cmocka_unit_test(test_itl_of_a_stream),
        cmocka_unit_test(test_promtool_clean),
        cmocka_unit_test(test_stopped_worker_left_out),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
