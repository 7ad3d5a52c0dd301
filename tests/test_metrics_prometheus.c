/*
 * A real Prometheus (Debian's prometheus package) scrapes a gateway with
 * one worker, with the scrape config docs/operations.md gives
 * (honor_labels): the worker's series arrive with instance="cpu/0" and
 * pool="cpu", the gateway's own with the target's instance, and the target
 * is up.
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

static ig_proc_t gw, prom;
static char dir[64];

static int group_setup(void **state)
{
    snprintf(dir, sizeof(dir), "/tmp/igprom-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return -1;
    return ig_gwf_solo_start(&gw, "prom", NULL);
}

static int group_teardown(void **state)
{
    (void)state;
    ig_proc_stop(&prom, SIGTERM, 10000);
    ig_proc_dispose(&prom);
    ig_tf_rmtree(dir);
    return ig_gwf_solo_stop(&gw);
}

/* The result vector of an instant query (new reference), or NULL. */
static json_t *query(int port, const char *q)
{
    char path[256];
    snprintf(path, sizeof(path), "/api/v1/query?query=%s", q);
    json_t *doc = ig_gwf_get_json(port, path);
    json_t *res = json_incref(json_object_get(json_object_get(doc, "data"), "result"));
    json_decref(doc);
    return res;
}

static const char *label(json_t *sample, const char *name)
{
    return json_string_value(json_object_get(json_object_get(sample, "metric"), name));
}

static void test_prometheus_scrapes_the_region(void **state)
{
    (void)state;
    if (system("command -v prometheus >/dev/null 2>&1") != 0)
        fail_msg("prometheus not found (apt-get install prometheus; scripts/deps.sh test)");
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_complete(gw.port, 3, &r), 0);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);

    char cfg[512], cfg_path[128], data[128], listen[64], arg_cfg[160], arg_data[160];
    snprintf(cfg, sizeof(cfg),
             "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
             "scrape_configs:\n  - job_name: infergate\n    honor_labels: true\n"
             "    static_configs:\n      - targets: ['127.0.0.1:%d']\n",
             gw.port);
    snprintf(cfg_path, sizeof(cfg_path), "%s/prometheus.yml", dir);
    assert_int_equal(ig_tf_write(cfg_path, cfg, strlen(cfg)), 0);
    snprintf(data, sizeof(data), "%s/data", dir);
    int port = ig_proc_free_port();
    snprintf(listen, sizeof(listen), "--web.listen-address=127.0.0.1:%d", port);
    snprintf(arg_cfg, sizeof(arg_cfg), "--config.file=%s", cfg_path);
    snprintf(arg_data, sizeof(arg_data), "--storage.tsdb.path=%s", data);
    char *argv[] = {"/usr/bin/env", "prometheus", arg_cfg, arg_data, listen, NULL};
    assert_int_equal(ig_proc_start(&prom, argv, IG_PROC_QUIET), 0);
    assert_int_equal(ig_proc_wait_listening(&prom, port, 20000), 0);

    /* Up to 30 s for the first scrapes to land. */
    json_t *worker = NULL;
    for (int i = 0; i < 60; i++) {
        worker = query(port, "infergate_worker_prompt_tokens_total");
        if (json_array_size(worker) > 0)
            break;
        json_decref(worker);
        worker = NULL;
        usleep(500 * 1000);
    }
    if (worker == NULL)
        fail_msg("Prometheus has no infergate_worker_prompt_tokens_total after 30 s");
    assert_int_equal(json_array_size(worker), 1);
    json_t *w = json_array_get(worker, 0);
    assert_string_equal(label(w, "instance"), "cpu/0");
    assert_string_equal(label(w, "pool"), "cpu");
    assert_string_equal(label(w, "job"), "infergate");
    assert_true(atof(json_string_value(json_array_get(json_object_get(w, "value"), 1))) > 0);
    json_decref(worker);

    char target[32];
    snprintf(target, sizeof(target), "127.0.0.1:%d", gw.port);
    json_t *up = query(port, "up");
    assert_int_equal(json_array_size(up), 1);
    assert_string_equal(
        json_string_value(json_array_get(json_object_get(json_array_get(up, 0), "value"), 1)), "1");
    json_decref(up);
    json_t *gen = query(port, "infergate_generation_tokens_total");
    assert_int_equal(json_array_size(gen), 1);
    assert_string_equal(label(json_array_get(gen, 0), "instance"), target);
    assert_string_equal(label(json_array_get(gen, 0), "model"), "tiny");
    json_decref(gen);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prometheus_scrapes_the_region),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
