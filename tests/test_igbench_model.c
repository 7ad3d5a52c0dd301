/*
 * igbench's --model defaults to the first id of the target's GET
 * /v1/models: against a python3 http.server site that answers only the
 * models it lists (404 for others), every request of a run without --model
 * succeeds and the report names the first model; a target without a model
 * list falls back to "test".
 */
#include "benchtools.h"
#include "files.h"
#include "peers.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

static ig_models_site_t site;

static int group_setup(void **state)
{
    (void)state;
    return ig_models_site_start(&site, "alpha\nbeta\n", NULL);
}

static int group_teardown(void **state)
{
    (void)state;
    ig_models_site_stop(&site);
    return 0;
}

static const char *model_of(json_t *r)
{
    return json_string_value(json_object_get(json_object_get(r, "params"), "model"));
}

static void test_default_is_first_listed(void **state)
{
    (void)state;
    json_t *r = tu_igbench("--target 127.0.0.1:%d --concurrency 2 --requests 6", site.proc.port);
    assert_non_null(r);
    assert_string_equal(model_of(r), "alpha");
    assert_true(TU_NUM(r, "requests", "ok") == 6);
    assert_true(TU_NUM(r, "requests", "errors") == 0);
    json_decref(r);
}

static void test_explicit_model_wins(void **state)
{
    (void)state;
    json_t *r = tu_igbench("--target 127.0.0.1:%d --concurrency 2 --requests 4 --model beta",
                           site.proc.port);
    assert_non_null(r);
    assert_string_equal(model_of(r), "beta");
    assert_true(TU_NUM(r, "requests", "ok") == 4);
    json_decref(r);
    /* The site refuses what it does not list: the default above was no luck. */
    r = tu_igbench("--target 127.0.0.1:%d --concurrency 2 --requests 4 --model gamma",
                   site.proc.port);
    assert_non_null(r);
    assert_true(TU_NUM(r, "requests", "ok") == 0);
    assert_true(TU_NUM(r, "errors", "http_404") == 4);
    json_decref(r);
}

static void test_no_list_falls_back(void **state)
{
    (void)state;
    ig_proc_t up;
    assert_int_equal(tu_start(&up, "testupstream", "--quiet"), 0);
    json_t *r = tu_igbench("--target 127.0.0.1:%d --concurrency 1 --requests 2", up.port);
    tu_stop(&up);
    assert_non_null(r);
    assert_string_equal(model_of(r), "test");
    assert_true(TU_NUM(r, "requests", "ok") == 2);
    json_decref(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_is_first_listed),
        cmocka_unit_test(test_explicit_model_wins),
        cmocka_unit_test(test_no_list_falls_back),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
