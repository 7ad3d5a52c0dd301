/*
 * ig_prom_sum (api/prom_text.c): a metric's samples summed over their
 * labels, in exposition text as vLLM, llama.cpp's server and SGLang write
 * it; names matched whole; comments, other metrics and bad values passed
 * over.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "infergate/prom_text.h"

static const char vllm[] =
    "# HELP vllm:num_requests_running Number of requests currently running on GPU.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"a\"} 3.0\n"
    "vllm:num_requests_running{engine=\"1\",model_name=\"a\"} 2.0\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{model_name=\"a}\\\"b\"} 7.0\n"
    "vllm:num_requests_waiting_total{model_name=\"a\"} 100\n"
    "vllm:gpu_cache_usage_perc{model_name=\"a\"} 0.25\n";

static void test_sums_over_labels(void **state)
{
    (void)state;
    double v = -1;
    assert_int_equal(ig_prom_sum(vllm, strlen(vllm), "vllm:num_requests_running", &v), 2);
    assert_true(v == 5.0);
    /* A '}' and an escaped quote inside a label value; the _total metric
     * that shares the prefix is another metric. */
    assert_int_equal(ig_prom_sum(vllm, strlen(vllm), "vllm:num_requests_waiting", &v), 1);
    assert_true(v == 7.0);
    assert_int_equal(ig_prom_sum(vllm, strlen(vllm), "vllm:gpu_cache_usage_perc", &v), 1);
    assert_true(v == 0.25);
}

static void test_plain_and_unterminated(void **state)
{
    (void)state;
    /* llama.cpp's server: no labels; the last line without a newline. */
    const char *t = "llamacpp:requests_processing 2\nllamacpp:requests_deferred 4";
    double v = -1;
    assert_int_equal(ig_prom_sum(t, strlen(t), "llamacpp:requests_deferred", &v), 1);
    assert_true(v == 4.0);
    /* Only the first len bytes are read: cut before its value, the
     * sample is not one. */
    v = -1;
    assert_int_equal(ig_prom_sum(t, strlen(t) - 1, "llamacpp:requests_deferred", &v), 0);
    assert_true(v == -1);
}

static void test_absent_and_bad(void **state)
{
    (void)state;
    const char *t = "# vllm:num_requests_waiting 9\n"
                    "vllm:num_requests_waiting{model_name=\"a\"} NaN\n"
                    "vllm:num_requests_waiting{model_name=\"a\" 3\n"
                    "vllm:num_requests_waiting{model_name=\"a\"} 2x\n"
                    "vllm:num_requests_waiting\n";
    double v = -1;
    assert_int_equal(ig_prom_sum(t, strlen(t), "vllm:num_requests_waiting", &v), 0);
    assert_true(v == -1); /* untouched */
    assert_int_equal(ig_prom_sum("", 0, "x", &v), 0);
    const char *ts = "up 1 1700000000000\n"; /* a timestamp after the value */
    assert_int_equal(ig_prom_sum(ts, strlen(ts), "up", &v), 1);
    assert_true(v == 1.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sums_over_labels),
        cmocka_unit_test(test_plain_and_unterminated),
        cmocka_unit_test(test_absent_and_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
