/*
 * Config loading through the API: the shipped example configs and the
 * embedded default load and mean what they say; defaults, path expansion,
 * listen checks and error reporting for files and strings.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/config.h"
#include "infergate/error.h"
#include "infergate/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CACHE "/tmp/infergate-test-cache"

static void load_ok_file(ig_config_t *cfg, const char *path)
{
    char err[512] = "";
    int rc = ig_config_load_file(cfg, path, err, sizeof(err));
    if (rc != 0)
        print_error("%s: %s\n", path, err);
    assert_int_equal(rc, 0);
}

static void test_default(void **state)
{
    ig_config_t cfg;
    char err[512] = "";
    assert_int_equal(ig_config_load_default(&cfg, err, sizeof(err)), 0);
    assert_string_equal(cfg.region, "local");
    assert_string_equal(cfg.listen, "127.0.0.1:8080");
    assert_int_equal(cfg.nmodels, 1);
    assert_string_equal(cfg.models[0].name, "tiny");
    assert_string_equal(cfg.models[0].preset, "tiny");
    assert_string_equal(cfg.models[0].path, CACHE "/models/tiny");
    assert_int_equal(cfg.npools, 1);
    assert_int_equal(cfg.pools[0].ndevices, 1);
    assert_int_equal(cfg.pools[0].devices[0].kind, IG_DEVICE_CPU);
    assert_int_equal(cfg.pools[0].min_instances, 1);
    assert_int_equal(cfg.pools[0].max_instances, 1);
    assert_int_equal(cfg.pools[0].batching.kv_dtype, IG_DTYPE_F32);
    assert_int_equal(cfg.nsites, 0);
    /* The HTTP limits default to those of include/infergate/http.h. */
    assert_int_equal(cfg.limits.http.max_request_line, 8 * 1024);
    assert_int_equal(cfg.limits.http.max_header_bytes, 64 * 1024);
    assert_int_equal(cfg.limits.http.max_headers, 100);
    assert_int_equal(cfg.limits.http.max_body_bytes, 4 * 1024 * 1024);
    assert_int_equal(cfg.limits.http.header_timeout_ms, 10000);
    assert_int_equal(cfg.limits.http.body_timeout_ms, 60000);
    assert_int_equal(cfg.limits.http.idle_timeout_ms, 75000);
    assert_int_equal(cfg.limits.http.max_connections, 10000);
    assert_int_equal(cfg.limits.http.max_pipeline, 16);
    assert_int_equal(cfg.limits.http.write_buffer_bytes, 256 * 1024);
    assert_int_equal(cfg.limits.http.max_buffered_bytes, 256u * 1024 * 1024);
    assert_int_equal(cfg.limits.http.max_chunk_ext_bytes, 256);
    assert_int_equal(cfg.limits.http.max_chunk_ext_total, 4096);
    assert_int_equal(cfg.limits.drain_timeout_ms, 30000);
    assert_int_equal(cfg.limits.drain_grace_ms, 5000);
    assert_int_equal(cfg.routing.policy, IG_ROUTE_LATENCY);
    /* The routing defaults, as numbers: config.c takes them from the
     * router, proxy and upstream opts defaults (three are its own). */
    assert_true(cfg.routing.retry_budget == 0.2);
    assert_int_equal(cfg.routing.max_retries, 2);
    assert_int_equal(cfg.routing.hedge.enabled, 0);
    assert_true(cfg.routing.hedge.budget == 0.05);
    assert_true(cfg.routing.hedge.delay_quantile == 0.95);
    assert_int_equal(cfg.routing.eject.consecutive_failures, 5);
    assert_true(cfg.routing.eject.base_ejection_s == 30);
    assert_int_equal(cfg.routing.connect_timeout_ms, 2000);
    assert_int_equal(cfg.routing.first_token_timeout_ms, 60000);
    assert_int_equal(cfg.routing.idle_timeout_ms, 60000);
    assert_int_equal(cfg.routing.total_timeout_ms, 600000);
    assert_int_equal(cfg.routing.queue_size, 1024);
    assert_int_equal(cfg.routing.queue_timeout_ms, 30000);
    /* the router's own defaults (ig_router_opts_default) */
    assert_int_equal(cfg.routing.concurrency_limit.enabled, 0); /* off (docs/routing.md) */
    assert_int_equal(cfg.routing.concurrency_limit.initial, 8);
    assert_int_equal(cfg.routing.concurrency_limit.min, 1);
    assert_int_equal(cfg.routing.concurrency_limit.max, 256); /* when enabled */
    assert_int_equal(cfg.routing.rtt_probe_ms, 500);
    assert_true(cfg.routing.explore_ratio == 0.01);
    assert_true(cfg.routing.tail_weight == 0); /* off (docs/routing.md) */
    assert_int_equal(cfg.log.level, IG_LOG_INFO);
    assert_int_equal(cfg.log.format, IG_LOG_TEXT);
    ig_config_dispose(&cfg);
    assert_null(cfg.models);
}

static void test_examples(void **state)
{
    ig_config_t local, us, eu;
    load_ok_file(&local, IG_SOURCE_DIR "/config/local.json");
    load_ok_file(&us, IG_SOURCE_DIR "/config/us-east.json");
    load_ok_file(&eu, IG_SOURCE_DIR "/config/eu-west.json");
    assert_string_equal(local.listen, "127.0.0.1:8080");
    assert_string_equal(local.models[0].path, CACHE "/models/tiny");

    /* The two regions point at each other. */
    assert_string_equal(us.region, "us-east");
    assert_string_equal(eu.region, "eu-west");
    assert_int_equal(us.nsites, 1);
    assert_int_equal(eu.nsites, 1);
    assert_string_equal(us.sites[0].region, eu.region);
    assert_string_equal(eu.sites[0].region, us.region);
    char want[64];
    snprintf(want, sizeof(want), "http://%s", eu.listen);
    assert_string_equal(us.sites[0].url, want);
    snprintf(want, sizeof(want), "http://%s", us.listen);
    assert_string_equal(eu.sites[0].url, want);
    assert_string_equal(us.sites[0].host, "127.0.0.1");
    assert_int_equal(us.sites[0].port, 8082);
    assert_string_equal(us.sites[0].base, "");
    assert_int_equal(us.npools, 1);
    assert_string_equal(us.models[us.pools[0].model_index].name, "tiny");
    assert_int_equal(us.pools[0].devices[0].kind, IG_DEVICE_CPU);
    assert_int_equal(us.pools[0].devices[0].index, 1);
    ig_config_dispose(&local);
    ig_config_dispose(&us);
    ig_config_dispose(&eu);
}

static void test_full_values(void **state)
{
    ig_config_t cfg;
    load_ok_file(&cfg, IG_SOURCE_DIR "/tests/cases/config/ok_full/input.json");
    const ig_config_pool_t *p = &cfg.pools[0];
    assert_int_equal(p->ndevices, 5);
    assert_int_equal(p->devices[0].kind, IG_DEVICE_CUDA);
    assert_int_equal(p->devices[1].index, 1);
    assert_int_equal(p->devices[2].kind, IG_DEVICE_MIG);
    assert_string_equal(p->devices[2].spec, "MIG-4f1b0c4e-3a7d-5e2a-9c1d-0123456789ab");
    assert_int_equal(p->devices[3].kind, IG_DEVICE_CPU);
    assert_int_equal(p->devices[3].index, 4);
    assert_int_equal(p->threads, 2);
    assert_int_equal(p->min_instances, 0);
    assert_int_equal(p->max_instances, 5);
    assert_int_equal(p->batching.max_batched_tokens, 4096);
    assert_int_equal(p->batching.max_num_seqs, 128);
    assert_int_equal(p->batching.kv_blocks, 1000);
    assert_int_equal(p->batching.block_size, 32);
    assert_int_equal(p->batching.max_waiting, 10);
    assert_int_equal(p->batching.kv_dtype, IG_DTYPE_BF16);
    assert_true(p->autoscale.target_queue_depth == 2.5);
    assert_true(p->autoscale.panic_threshold == 1.5);
    assert_true(p->autoscale.scale_to_zero_after_s == 120);
    /* A relative model path is relative to the config file's folder. */
    assert_string_equal(cfg.models[0].path,
                        IG_SOURCE_DIR "/tests/cases/config/ok_full/models/tiny");
    const ig_config_site_t *s = &cfg.sites[0];
    assert_string_equal(s->host, "eu.example.com");
    assert_int_equal(s->port, 8443);
    assert_string_equal(s->base, "/gw");
    assert_int_equal(cfg.routing.policy, IG_ROUTE_LEAST_INFLIGHT);
    assert_string_equal(ig_route_policy_name(cfg.routing.policy), "least_inflight");
    assert_true(cfg.routing.hedge.enabled);
    assert_true(cfg.routing.hedge.delay_quantile == 0.9);
    assert_int_equal(cfg.routing.eject.consecutive_failures, 3);
    assert_int_equal(cfg.routing.total_timeout_ms, 2000);
    assert_int_equal(cfg.routing.queue_size, 0);
    assert_int_equal(cfg.routing.concurrency_limit.initial, 4);
    assert_int_equal(cfg.routing.concurrency_limit.min, 2);
    assert_int_equal(cfg.routing.concurrency_limit.max, 64);
    assert_int_equal(cfg.routing.rtt_probe_ms, 0);
    assert_true(cfg.routing.explore_ratio == 0.05);
    assert_true(cfg.routing.tail_weight == 2);
    assert_int_equal(cfg.limits.http.max_pipeline, 4);
    assert_int_equal(cfg.limits.drain_timeout_ms, 0);
    assert_int_equal(cfg.limits.drain_grace_ms, 250);
    assert_int_equal(cfg.limits.max_prompt_tokens, 2048);
    assert_int_equal(cfg.napi_keys, 2);
    assert_string_equal(cfg.api_keys[1], "sk-two");
    assert_int_equal(cfg.log.level, IG_LOG_DEBUG);
    assert_int_equal(cfg.log.format, IG_LOG_JSON);
    ig_config_dispose(&cfg);
}

static void test_string_errors(void **state)
{
    ig_config_t cfg;
    char err[512];
    /* The example message of the docs, word for word. */
    int rc = ig_config_load_string(
        &cfg,
        "{\"models\":[{\"name\":\"tiny\",\"path\":\"/m\"}],"
        "\"pools\":[{\"name\":\"p\",\"model\":\"tiny\",\"min_instances\":1,\"max_instances\":0}]}",
        "config/us-east.json", err, sizeof(err));
    assert_int_equal(rc, IG_ECONFIG);
    assert_string_equal(err, "config/us-east.json: pools[0].max_instances: must be >= "
                             "min_instances (1)");
    assert_null(cfg.pools);

    rc = ig_config_load_string(&cfg, "{\n\"region\": nope}", "x.json", err, sizeof(err));
    assert_int_equal(rc, IG_ECONFIG);
    assert_true(strncmp(err, "x.json:2:", 9) == 0);

    /* A short buffer truncates, never overflows. */
    char tiny[8];
    memset(tiny, 'Z', sizeof(tiny));
    rc = ig_config_load_string(&cfg, "{\"regoin\":1}", "a-long-file-name.json", tiny, 6);
    assert_int_equal(rc, IG_ECONFIG);
    assert_int_equal(strlen(tiny), 5);
    assert_int_equal(tiny[7], 'Z');
}

static void test_missing_file(void **state)
{
    ig_config_t cfg;
    char err[512];
    int rc = ig_config_load_file(&cfg, "/nonexistent/infergate.json", err, sizeof(err));
    assert_int_equal(rc, IG_ENOENT);
    assert_string_equal(err, "/nonexistent/infergate.json: cannot open: No such file or directory");
}

static void test_check_listen(void **state)
{
    char err[256];
    assert_int_equal(ig_config_check_listen("127.0.0.1:0", err, sizeof(err)), 0);
    assert_int_equal(ig_config_check_listen("[::1]:8080", err, sizeof(err)), 0);
    assert_int_equal(ig_config_check_listen("unix:/tmp/x.sock", err, sizeof(err)), 0);
    assert_int_equal(ig_config_check_listen("::1:8080", err, sizeof(err)), IG_EINVAL);
    assert_int_equal(ig_config_check_listen("127.0.0.1:", err, sizeof(err)), IG_EINVAL);
    assert_int_equal(ig_config_check_listen("127.0.0.1:-1", err, sizeof(err)), IG_EINVAL);
    assert_int_equal(ig_config_check_listen("127.0.0.1:80x", err, sizeof(err)), IG_EINVAL);
    assert_int_equal(ig_config_check_listen("1.2.3:80", err, sizeof(err)), IG_EINVAL);
    assert_int_equal(ig_config_check_listen("[::1:80", err, sizeof(err)), IG_EINVAL);
}

static void test_cache_dir(void **state)
{
    char buf[256];
    assert_int_equal(ig_config_cache_dir(buf, sizeof(buf)), 0);
    assert_string_equal(buf, CACHE);
    unsetenv("INFERGATE_CACHE_DIR");
    setenv("XDG_CACHE_HOME", "/xdg", 1);
    assert_int_equal(ig_config_cache_dir(buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/xdg/infergate");
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    assert_int_equal(ig_config_cache_dir(buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/home/u/.cache/infergate");
    assert_int_equal(ig_config_cache_dir(buf, 4), IG_ERANGE);

    ig_config_t cfg;
    char err[256];
    assert_int_equal(ig_config_load_string(&cfg,
                                           "{\"models\":[{\"name\":\"a\",\"path\":\"~/m\"}],"
                                           "\"pools\":[{\"name\":\"p\",\"model\":\"a\"}]}",
                                           NULL, err, sizeof(err)),
                     0);
    assert_string_equal(cfg.models[0].path, "/home/u/m");
    ig_config_dispose(&cfg);
    unsetenv("HOME");
    assert_int_equal(ig_config_load_default(&cfg, err, sizeof(err)), IG_ECONFIG);
    assert_string_equal(err, "(embedded default): models[0].path: cannot expand @cache: set "
                             "INFERGATE_CACHE_DIR, XDG_CACHE_HOME or HOME");
    setenv("INFERGATE_CACHE_DIR", CACHE, 1);
}

int main(void)
{
    setenv("INFERGATE_CACHE_DIR", CACHE, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default),      cmocka_unit_test(test_examples),
        cmocka_unit_test(test_full_values),  cmocka_unit_test(test_string_errors),
        cmocka_unit_test(test_missing_file), cmocka_unit_test(test_check_listen),
        cmocka_unit_test(test_cache_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
