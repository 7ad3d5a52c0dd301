/*
 * Cheap capacity first with real engines (docs/autoscale.md, "Cheap capacity
 * first"): two CPU pools of the generated tiny model, "dear" at $8/h listed
 * first and "cheap" at $1/h, one instance each and room for a second, and a
 * pay-per-token site, under routing.objective "cost". Requests go to the
 * cheap pool while it meets the SLO (the site costs tokens, and the cheap
 * pool's hourly price is the lower), a sustained load makes the autoscaler
 * add the second instance to the cheap pool, and the dear pool does not grow
 * while the cheap one has room. Bounded: under a minute on a loaded machine.
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
#include <unistd.h>

#include "gwfixture.h"
#include "load_loop.h"

/* The pool of /status named name (borrowed from *doc, a new reference). */
static json_t *pool_named(int port, const char *name, json_t **doc)
{
    *doc = ig_gwf_get_json(port, "/status");
    json_t *p;
    size_t i;
    json_array_foreach(json_object_get(*doc, "pools"), i, p)
    {
        if (strcmp(json_string_value(json_object_get(p, "name")), name) == 0)
            return p;
    }
    return NULL;
}

static int ready_instances(int port, const char *pool)
{
    json_t *doc;
    json_t *p = pool_named(port, pool, &doc);
    int n =
        p ? (int)json_integer_value(json_object_get(json_object_get(p, "instance_counts"), "ready"))
          : -1;
    json_decref(doc);
    return n;
}

static int devices_used(int port, const char *pool)
{
    json_t *doc;
    json_t *p = pool_named(port, pool, &doc);
    int n = p ? (int)json_integer_value(json_object_get(p, "devices_used")) : -1;
    json_decref(doc);
    return n;
}

/* The unix_ms of the pool's first "up" decision, 0 when none. */
static long long first_up(int port, const char *pool)
{
    json_t *doc, *d;
    json_t *p = pool_named(port, pool, &doc);
    size_t i;
    long long at = 0;
    json_array_foreach(json_object_get(p, "decisions"), i, d)
    {
        if (at == 0 && strcmp(json_string_value(json_object_get(d, "direction")), "up") == 0)
            at = json_integer_value(json_object_get(d, "unix_ms"));
    }
    json_decref(doc);
    return at;
}

/* Answers counted by pool: cheap/N, dear/N, the cloud site. */
enum { CHEAP, DEAR, CLOUD };
static const char *const upstreams[] = {"cheap/", "dear/", "cloud", NULL};

static void test_cheap_pool_first(void **state)
{
    (void)state;
    ig_proc_t cloud;
    assert_int_equal(ig_gwf_upstream(&cloud, "--delay-ms", "20", NULL), 0);
    int port = ig_proc_free_port();
    const char *pool =
        "{\"name\":\"%s\",\"model\":\"tiny\",\"devices\":[\"cpu\",\"cpu\"],\"threads\":1,"
        "\"min_instances\":1,\"max_instances\":2,\"batching\":{\"max_num_seqs\":8},"
        "\"price\":{\"per_hour\":%d},\"autoscale\":{\"target_queue_depth\":2,"
        "\"stable_window_s\":4,\"panic_window_s\":1,\"panic_threshold\":2,"
        "\"scale_down_delay_s\":60}}";
    char dear[512], cheap[512];
    snprintf(dear, sizeof(dear), pool, "dear", 8);
    snprintf(cheap, sizeof(cheap), pool, "cheap", 1);
    ig_proc_t g;
    assert_int_equal(
        ig_gwf_serve_config(&g, port, "info", IG_PROC_QUIET, 20000, 60000,
                            "{\"region\":\"cp\",\"listen\":\"127.0.0.1:%d\","
                            "\"models\":[{\"name\":\"tiny\",\"path\":\"%s\"}],"
                            "\"pools\":[%s,%s],"
                            "\"sites\":[{\"name\":\"cloud\",\"url\":\"http://127.0.0.1:%d\","
                            "\"models\":[\"tiny\"],\"price\":{\"per_1m_input_tokens\":0.5,"
                            "\"per_1m_output_tokens\":1.5}}],"
                            "\"routing\":{\"objective\":\"cost\",\"slo_ttft_ms\":5000},"
                            "\"limits\":{\"drain_grace_ms\":0}}",
                            port, ig_gwf_model_dir, dear, cheap, cloud.port),
        0);

    /* Ready means something serves; both pools' first instances should. */
    long long end = ig_tc_now_ms() + 60000;
    while ((ready_instances(port, "cheap") < 1 || ready_instances(port, "dear") < 1) &&
           ig_tc_now_ms() < end)
        usleep(100 * 1000);
    assert_int_equal(ready_instances(port, "cheap"), 1);
    assert_int_equal(ready_instances(port, "dear"), 1);

    /* One at a time: every answer from the cheap pool. */
    ig_load_t one = {.prefixes = upstreams};
    for (int i = 0; i < 6; i++) {
        ig_tc_response_t r;
        assert_int_equal(ig_gwf_complete(port, 8, &r), 0);
        if (r.status != 200)
            print_message("%d %s\n", r.status, r.body ? r.body : "");
        assert_int_equal(r.status, 200);
        ig_load_count(&one, &r);
        ig_tc_response_free(&r);
    }
    print_message("one at a time: cheap %d, dear %d, cloud %d\n", one.by_upstream[CHEAP],
                  one.by_upstream[DEAR], one.by_upstream[CLOUD]);
    assert_int_equal(one.by_upstream[CHEAP], 6);

    /* Six at once, well past the target of 2 per instance: the cheap pool
     * gets its second instance; the dear one does not grow meanwhile. */
    ig_load_group_t load;
    long long t0 = ig_tc_now_ms();
    ig_load_start(&load, 6, (ig_load_t){.port = port, .max_tokens = 32, .prefixes = upstreams});
    long long t_up = 0;
    int dear_then = -1;
    while (ig_tc_now_ms() < t0 + 30000) {
        if (devices_used(port, "cheap") >= 2) {
            t_up = ig_tc_now_ms();
            dear_then = devices_used(port, "dear");
            break;
        }
        usleep(100 * 1000);
    }
    /* A few seconds more of load with both cheap instances. */
    while (t_up > 0 && ig_tc_now_ms() < t_up + 3000)
        usleep(100 * 1000);
    ig_load_t sum = ig_load_stop(&load);
    int on_cheap = sum.by_upstream[CHEAP], on_dear = sum.by_upstream[DEAR],
        on_cloud = sum.by_upstream[CLOUD];
    long long up_cheap = first_up(port, "cheap"), up_dear = first_up(port, "dear");
    print_message("cheap grew after %lld ms (dear then at %d); answers %d ok, %d failed: cheap %d, "
                  "dear %d, cloud %d; first up: cheap %lld, dear %lld\n",
                  t_up ? t_up - t0 : -1, dear_then, sum.ok, sum.failed, on_cheap, on_dear, on_cloud,
                  up_cheap, up_dear);
    assert_true(t_up > 0);
    assert_int_equal(dear_then, 1);
    assert_true(up_cheap > 0);
    assert_true(up_dear == 0 || up_dear >= up_cheap);
    assert_int_equal(sum.failed, 0);
    assert_true(on_cheap > on_dear + on_cloud);

    /* The autoscaler ranked the pools by price over measured throughput. */
    json_t *doc, *doc2;
    json_t *pc = pool_named(port, "cheap", &doc), *pd = pool_named(port, "dear", &doc2);
    double cc = json_number_value(json_object_get(pc, "capacity_cost_per_1m_output_tokens"));
    double cd = json_number_value(json_object_get(pd, "capacity_cost_per_1m_output_tokens"));
    print_message("capacity cost per 1M output tokens: cheap %.4g, dear %.4g\n", cc, cd);
    assert_true(cc > 0 && cd > cc);
    json_decref(doc);
    json_decref(doc2);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 20000), 0);
    ig_proc_dispose(&g);
    ig_proc_stop(&cloud, SIGKILL, 5000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cheap_pool_first),
    };
    return cmocka_run_group_tests(tests, ig_gwf_model_setup, ig_gwf_model_teardown);
}
