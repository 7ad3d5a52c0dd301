/*
 * `infergate devices --config FILE`: how a config's pools map onto the
 * devices found. CPU entries get their share of the cores; a GPU or MIG
 * slice is reported found or missing (this host may have none).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proc.h"

/* Runs `infergate devices --json --config path`; the parsed JSON, or NULL. */
static json_t *devices_json(const char *path, int *status)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s devices --json --config %s 2>/dev/null",
             ig_proc_bin("infergate"), path);
    FILE *f = popen(cmd, "r");
    if (f == NULL)
        return NULL;
    json_error_t err;
    json_t *doc = json_loadf(f, 0, &err);
    *status = pclose(f);
    return doc;
}

static void test_pools_map_onto_devices(void **state)
{
    const char *cfg = ig_proc_temp_file(
        "{\"models\":[{\"name\":\"m\",\"path\":\"/tmp/ig-no-model\"}],"
        "\"pools\":[{\"name\":\"a\",\"model\":\"m\",\"devices\":[\"cpu\",\"cpu\",\"cpu:3\"],"
        "\"min_instances\":0,\"max_instances\":3},"
        "{\"name\":\"g\",\"model\":\"m\",\"devices\":[\"cuda:7\","
        "\"MIG-11111111-2222-3333-4444-555555555555\"],\"min_instances\":0}]}",
        ".json");
    int status = -1;
    json_t *doc = devices_json(cfg, &status);
    assert_non_null(doc);
    assert_int_equal(status, 0);
    long cores = (long)json_integer_value(json_object_get(json_object_get(doc, "cpu"), "cores"));
    assert_true(cores >= 1);
    json_t *pools = json_object_get(doc, "pools");
    assert_int_equal(json_array_size(pools), 2);
    json_t *a = json_object_get(json_array_get(pools, 0), "devices");
    assert_int_equal(json_array_size(a), 3);
    /* Two plain "cpu" entries split the cores; "cpu:3" says its own. */
    long share = cores > 2 ? cores / 2 : 1;
    for (int i = 0; i < 2; i++) {
        json_t *d = json_array_get(a, i);
        assert_int_equal(json_integer_value(json_object_get(d, "threads")), share);
        assert_true(json_is_true(json_object_get(d, "found")));
    }
    assert_int_equal(json_integer_value(json_object_get(json_array_get(a, 2), "threads")), 3);
    /* A made-up MIG uuid is never there; cuda:7 is reported either way. */
    json_t *g = json_object_get(json_array_get(pools, 1), "devices");
    assert_false(json_is_true(json_object_get(json_array_get(g, 1), "found")));
    assert_true(json_is_boolean(json_object_get(json_array_get(g, 0), "found")));
    json_decref(doc);
}

static void test_bad_config_exits_2(void **state)
{
    const char *cfg = ig_proc_temp_file("{\"pools\":[{\"name\":\"a\"}]}", ".json");
    int status = -1;
    json_t *doc = devices_json(cfg, &status);
    json_decref(doc);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pools_map_onto_devices),
        cmocka_unit_test(test_bad_config_exits_2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
