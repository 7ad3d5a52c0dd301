/*
 * GPU telemetry on the gateway's /metrics. Without NVML (no driver, or
 * IG_NVML_LIBRARY naming nothing) the infergate_gpu_* series are absent and
 * /metrics answers as ever. With a fake libnvidia-ml (tests/support/nvml/,
 * built here with cc and loaded through IG_NVML_LIBRARY) every GPU and MIG
 * slice has its series with the values NVML gave, and promtool finds the
 * text clean.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "files.h"
#include "gwfixture.h"

#ifndef IG_SOURCE_DIR
#error "IG_SOURCE_DIR must name the source tree"
#endif

static char dir[64];
static char lib[128];

static int group_setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/ignvml-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return -1;
    snprintf(lib, sizeof(lib), "%s/libnvidia-ml-fake.so", dir);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "cc -shared -fPIC -O0 -o %s %s/tests/support/nvml/fake_nvml.c", lib,
             IG_SOURCE_DIR);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot build the fake NVML: %s\n", cmd);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    ig_tf_rmtree(dir);
    unsetenv("IG_NVML_LIBRARY");
    return 0;
}

/* /metrics of a gateway with nothing to serve, NVML from library. */
static char *scrape_with(const char *library)
{
    setenv("IG_NVML_LIBRARY", library, 1); /* inherited by serve */
    ig_proc_t g;
    assert_int_equal(ig_gwf_serve_empty(&g, "warn"), 0);
    char *m = ig_gwf_get_text(g.port, "/metrics");
    char *again = ig_gwf_get_text(g.port, "/metrics"); /* NVML stays open */
    assert_non_null(again);
    free(again);
    ig_proc_stop(&g, SIGTERM, 10000);
    ig_proc_dispose(&g);
    return m;
}

/* The value of the series name{labels} (labels with its trailing space) at
 * the start of a line of text, or -1 when there is none. */
static double value_of(const char *text, const char *name, const char *labels)
{
    char series[256];
    snprintf(series, sizeof(series), "%s%s", name, labels);
    const char *p = strstr(text, series);
    return p != NULL && (p == text || p[-1] == '\n') ? strtod(p + strlen(series), NULL) : -1;
}

static void test_absent_without_nvml(void **state)
{
    (void)state;
    char missing[160];
    snprintf(missing, sizeof(missing), "%s/no-such-libnvidia-ml.so", dir);
    char *m = scrape_with(missing);
    assert_non_null(m);
    assert_null(strstr(m, "infergate_gpu_"));
    assert_non_null(strstr(m, "infergate_build_info"));
    free(m);
}

static void test_fake_nvml_series(void **state)
{
    (void)state;
    char *m = scrape_with(lib);
    assert_non_null(m);
    const char *g0 =
        "{gpu=\"0\",gpu_uuid=\"GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee\",device=\"cuda:0\"} ";
    const char *g1 =
        "{gpu=\"1\",gpu_uuid=\"GPU-ffffffff-0000-1111-2222-333333333333\",device=\"cuda:1\"} ";
    const char *mig = "{gpu=\"1\",gpu_uuid=\"GPU-ffffffff-0000-1111-2222-333333333333\","
                      "device=\"MIG-66666666-7777-8888-9999-000000000000\"} ";
    assert_true(value_of(m, "infergate_gpu_utilization", g0) == 0.37);
    assert_true(value_of(m, "infergate_gpu_memory_used_bytes", g0) == 1073741824.0);
    assert_true(value_of(m, "infergate_gpu_memory_total_bytes", g1) == 80.0 * 1073741824.0);
    assert_true(value_of(m, "infergate_gpu_temperature_celsius", g0) == 61);
    assert_true(value_of(m, "infergate_gpu_power_usage_watts", g0) == 123.456);
    /* A MIG slice: its own memory, no utilisation of its own. */
    assert_true(value_of(m, "infergate_gpu_memory_used_bytes", mig) == 3.0 * 1073741824.0);
    assert_true(value_of(m, "infergate_gpu_memory_total_bytes", mig) == 40.0 * 1073741824.0);
    assert_true(value_of(m, "infergate_gpu_utilization", mig) == -1);
    assert_non_null(strstr(m, "device=\"MIG-11111111-2222-3333-4444-555555555555\""));
    /* promtool: clean. */
    const char *path = ig_proc_temp_file(m, ".prom");
    assert_non_null(path);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "promtool check metrics < %s", path);
    if (system(cmd) != 0)
        fail_msg("promtool check metrics failed on %s", path);
    unlink(path);
    free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_absent_without_nvml),
        cmocka_unit_test(test_fake_nvml_series),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
