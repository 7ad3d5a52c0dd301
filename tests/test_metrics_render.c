/*
 * The metrics registry's text exposition: HELP/TYPE lines, labels and their
 * escaping, cumulative histogram buckets, stable order, registration rules
 * and dropped misuse.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int reset(void **state)
{
    ig_metrics_reset();
    return 0;
}

/* Renders and compares with the whole expected text. */
static void expect_render(const char *want)
{
    size_t len = 12345;
    char *got = ig_metrics_render(&len);
    assert_non_null(got);
    assert_string_equal(got, want);
    assert_int_equal(len, strlen(want));
    free(got);
}

static void test_empty(void **state)
{
    expect_render("");
}

static void test_counter_labels(void **state)
{
    ig_metric_t *c =
        ig_metrics_counter("infergate_requests_total", "Requests handled.", "route,status");
    assert_non_null(c);
    ig_metric_add(c, 1, "/v1/completions", "200");
    ig_metric_add(c, 2, "/health", "200");
    ig_metric_add(c, 1, "/v1/completions", "200");
    ig_metric_add(c, 1, "/v1/completions", "400");
    ig_metric_add(c, -5, "/health", "200");  /* counters only go up: dropped */
    ig_metric_set(c, 100, "/health", "200"); /* not a gauge: dropped */
    expect_render("# HELP infergate_requests_total Requests handled.\n"
                  "# TYPE infergate_requests_total counter\n"
                  "infergate_requests_total{route=\"/health\",status=\"200\"} 2\n"
                  "infergate_requests_total{route=\"/v1/completions\",status=\"200\"} 2\n"
                  "infergate_requests_total{route=\"/v1/completions\",status=\"400\"} 1\n");
}

static void test_gauge_and_order(void **state)
{
    /* Families come out sorted by name, whatever the registration order. */
    ig_metric_t *z = ig_metrics_gauge("infergate_z", "Last.", NULL);
    ig_metric_t *a = ig_metrics_gauge("infergate_a", "First.", NULL);
    ig_metric_t *labeled = ig_metrics_gauge("infergate_m", "Labeled, unused.", "pool");
    assert_non_null(z);
    assert_non_null(a);
    assert_non_null(labeled);
    ig_metric_set(a, 0.25);
    ig_metric_add(a, 1);
    ig_metric_add(z, -3);
    expect_render("# HELP infergate_a First.\n# TYPE infergate_a gauge\ninfergate_a 1.25\n"
                  "# HELP infergate_m Labeled, unused.\n# TYPE infergate_m gauge\n"
                  "# HELP infergate_z Last.\n# TYPE infergate_z gauge\ninfergate_z -3\n");
}

static void test_escaping(void **state)
{
    ig_metric_t *c =
        ig_metrics_counter("infergate_x_total", "Help with \\ and\nnewline \"q\".", "v");
    ig_metric_add(c, 1, "a\"b\\c\nd");
    ig_metric_add(c, 1, (const char *)NULL);
    expect_render("# HELP infergate_x_total Help with \\\\ and\\nnewline \"q\".\n"
                  "# TYPE infergate_x_total counter\n"
                  "infergate_x_total{v=\"\"} 1\n"
                  "infergate_x_total{v=\"a\\\"b\\\\c\\nd\"} 1\n");
}

static void test_histogram(void **state)
{
    const double b[] = {0.1, 0.5, 1};
    ig_metric_t *h = ig_metrics_histogram("infergate_latency_seconds", "Latency.", "route", b, 3);
    assert_non_null(h);
    ig_metric_observe(h, 0.05, "/a");
    ig_metric_observe(h, 0.1, "/a"); /* le is inclusive */
    ig_metric_observe(h, 0.7, "/a");
    ig_metric_observe(h, 3, "/a");
    ig_metric_observe(h, NAN, "/a"); /* dropped */
    ig_metric_add(h, 1, "/a");       /* not a counter: dropped */
    expect_render("# HELP infergate_latency_seconds Latency.\n"
                  "# TYPE infergate_latency_seconds histogram\n"
                  "infergate_latency_seconds_bucket{route=\"/a\",le=\"0.1\"} 2\n"
                  "infergate_latency_seconds_bucket{route=\"/a\",le=\"0.5\"} 2\n"
                  "infergate_latency_seconds_bucket{route=\"/a\",le=\"1\"} 3\n"
                  "infergate_latency_seconds_bucket{route=\"/a\",le=\"+Inf\"} 4\n"
                  "infergate_latency_seconds_sum{route=\"/a\"} 3.85\n"
                  "infergate_latency_seconds_count{route=\"/a\"} 4\n");
}

static void test_histogram_default_buckets(void **state)
{
    ig_metric_t *h = ig_metrics_histogram("infergate_t_seconds", "T.", NULL, NULL, 0);
    assert_non_null(h);
    char *text = ig_metrics_render(NULL);
    assert_non_null(text);
    /* An unused label-less histogram shows its zeros, 1 ms to 60 s. */
    assert_non_null(strstr(text, "infergate_t_seconds_bucket{le=\"0.001\"} 0\n"));
    assert_non_null(strstr(text, "infergate_t_seconds_bucket{le=\"60\"} 0\n"));
    assert_non_null(strstr(text, "infergate_t_seconds_bucket{le=\"+Inf\"} 0\n"));
    assert_non_null(strstr(text, "infergate_t_seconds_count 0\n"));
    free(text);
}

static double read_value(void *data)
{
    return *(double *)data;
}

static void test_gauge_fn(void **state)
{
    double v = 7, w = 9;
    ig_metrics_gauge_fn("infergate_ready", "Ready.", read_value, &v);
    expect_render("# HELP infergate_ready Ready.\n# TYPE infergate_ready gauge\n"
                  "infergate_ready 7\n");
    v = 0.5;
    expect_render("# HELP infergate_ready Ready.\n# TYPE infergate_ready gauge\n"
                  "infergate_ready 0.5\n");
    /* Registering again moves it to the new source. */
    ig_metrics_gauge_fn("infergate_ready", "Ready.", read_value, &w);
    expect_render("# HELP infergate_ready Ready.\n# TYPE infergate_ready gauge\n"
                  "infergate_ready 9\n");
}

/* A collected family's source: two upstreams, an escaped name among them. */
typedef struct {
    double a, b;
} two_t;

static void collect_two(void *data, ig_metrics_emit_fn *emit, void *ctx)
{
    const two_t *t = data;
    const char *first = "a", *second = "b\"c";
    emit(ctx, &first, t->a);
    emit(ctx, &second, t->b);
}

static void test_gauge_collect(void **state)
{
    two_t v = {1, 2.5};
    ig_metrics_gauge_collect("infergate_up", "Up.", "upstream", collect_two, &v);
    expect_render("# HELP infergate_up Up.\n# TYPE infergate_up gauge\n"
                  "infergate_up{upstream=\"a\"} 1\n"
                  "infergate_up{upstream=\"b\\\"c\"} 2.5\n");
    v.a = 3; /* read at render time */
    expect_render("# HELP infergate_up Up.\n# TYPE infergate_up gauge\n"
                  "infergate_up{upstream=\"a\"} 3\n"
                  "infergate_up{upstream=\"b\\\"c\"} 2.5\n");
    /* A plain gauge of the same name is refused. */
    ig_metric_t *m = ig_metrics_gauge("infergate_up", "Up.", "upstream");
    assert_null(m);
    /* Detached, it renders no samples; registered again, the new source. */
    ig_metrics_detach(&v);
    expect_render("# HELP infergate_up Up.\n# TYPE infergate_up gauge\n");
    two_t w = {4, 5};
    ig_metrics_gauge_collect("infergate_up", "Up.", "upstream", collect_two, &w);
    expect_render("# HELP infergate_up Up.\n# TYPE infergate_up gauge\n"
                  "infergate_up{upstream=\"a\"} 4\n"
                  "infergate_up{upstream=\"b\\\"c\"} 5\n");
}

static void test_registration_rules(void **state)
{
    ig_metric_t *c = ig_metrics_counter("infergate_c_total", "C.", "a, b");
    assert_non_null(c);
    assert_ptr_equal(ig_metrics_counter("infergate_c_total", "C.", "a,b"), c);
    assert_null(ig_metrics_gauge("infergate_c_total", "C.", "a,b"));   /* type differs */
    assert_null(ig_metrics_counter("infergate_c_total", "C.", "a"));   /* labels differ */
    assert_null(ig_metrics_counter("infergate_c_total", "C.", "b,a")); /* order differs */
    assert_null(ig_metrics_counter("9bad", "", NULL));
    assert_null(ig_metrics_counter("bad-name", "", NULL));
    assert_null(ig_metrics_counter("", "", NULL));
    assert_null(ig_metrics_counter("ok_total", "", "a,b,c,d,e")); /* more than 4 */
    assert_null(ig_metrics_counter("ok_total", "", "a,a"));
    assert_null(ig_metrics_counter("ok_total", "", "__x"));
    assert_null(ig_metrics_counter("ok_total", "", "a,"));
    assert_null(ig_metrics_histogram("ok_h", "", "le", NULL, 0));
    const double unsorted[] = {1, 0.5};
    assert_null(ig_metrics_histogram("ok_h", "", NULL, unsorted, 2));
    assert_non_null(ig_metrics_counter("ok_total", "", "a,b,c,d"));
    /* NULL handles are ignored, so a failed registration cannot crash a caller. */
    ig_metric_add(NULL, 1);
    ig_metric_observe(NULL, 1);
}

static void test_values(void **state)
{
    ig_metric_t *g = ig_metrics_gauge("infergate_v", "V.", "k");
    ig_metric_set(g, 0.1, "a");
    ig_metric_set(g, 1e20, "b");
    ig_metric_set(g, INFINITY, "c");
    ig_metric_set(g, 123456789, "d");
    ig_metric_set(g, 1.0 / 3.0, "e");
    expect_render("# HELP infergate_v V.\n# TYPE infergate_v gauge\n"
                  "infergate_v{k=\"a\"} 0.1\n"
                  "infergate_v{k=\"b\"} 1e+20\n"
                  "infergate_v{k=\"c\"} +Inf\n"
                  "infergate_v{k=\"d\"} 123456789\n"
                  "infergate_v{k=\"e\"} 0.33333333333333331\n");
}

static void test_many_series(void **state)
{
    /* Enough series to grow the hash table several times; each keeps its own count. */
    ig_metric_t *c = ig_metrics_counter("infergate_n_total", "N.", "i");
    char name[16];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 500; i++) {
            snprintf(name, sizeof(name), "%03d", i);
            ig_metric_add(c, i, name);
        }
    }
    char *text = ig_metrics_render(NULL);
    assert_non_null(text);
    assert_non_null(
        strstr(text, "infergate_n_total{i=\"000\"} 0\ninfergate_n_total{i=\"001\"} 2\n"));
    assert_non_null(strstr(text, "infergate_n_total{i=\"499\"} 998\n"));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_empty, reset),
        cmocka_unit_test_setup(test_counter_labels, reset),
        cmocka_unit_test_setup(test_gauge_and_order, reset),
        cmocka_unit_test_setup(test_escaping, reset),
        cmocka_unit_test_setup(test_histogram, reset),
        cmocka_unit_test_setup(test_histogram_default_buckets, reset),
        cmocka_unit_test_setup(test_gauge_fn, reset),
        cmocka_unit_test_setup(test_gauge_collect, reset),
        cmocka_unit_test_setup(test_registration_rules, reset),
        cmocka_unit_test_setup(test_values, reset),
        cmocka_unit_test_setup(test_many_series, reset),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ig_metrics_reset();
    return rc;
}
