/*
 * The registry under concurrent updates and scrapes: no update is lost,
 * and rendering while others write stays well-formed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 4
#define ITERS 20000

static ig_metric_t *counter, *hist;

static void *worker(void *arg)
{
    const char *label = (const char *)arg;
    for (int i = 0; i < ITERS; i++) {
        ig_metric_add(counter, 1, label, (i & 1) ? "odd" : "even");
        ig_metric_observe(hist, (i % 10) * 0.01);
    }
    return NULL;
}

static void *scraper(void *arg)
{
    volatile int *stop = arg;
    for (int i = 0; i < 200 && !*stop; i++) {
        char *text = ig_metrics_render(NULL);
        assert_non_null(text);
        assert_non_null(strstr(text, "# TYPE infergate_t_total counter\n"));
        free(text);
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    counter = ig_metrics_counter("infergate_t_total", "T.", "thread,parity");
    hist = ig_metrics_histogram("infergate_t_seconds", "T.", NULL, NULL, 0);
    assert_non_null(counter);
    assert_non_null(hist);
    static const char *labels[THREADS] = {"a", "b", "c", "d"};
    pthread_t t[THREADS], s;
    volatile int stop = 0;
    assert_int_equal(pthread_create(&s, NULL, scraper, (void *)&stop), 0);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, worker, (void *)labels[i]), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    stop = 1;
    pthread_join(s, NULL);

    char *text = ig_metrics_render(NULL);
    assert_non_null(text);
    char want[128];
    for (int i = 0; i < THREADS; i++) {
        snprintf(want, sizeof(want), "infergate_t_total{thread=\"%s\",parity=\"even\"} %d\n",
                 labels[i], ITERS / 2);
        assert_non_null(strstr(text, want));
    }
    snprintf(want, sizeof(want), "infergate_t_seconds_count %d\n", THREADS * ITERS);
    assert_non_null(strstr(text, want));
    free(text);
    ig_metrics_reset();
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_concurrent)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
