/*
 * Discovered site models: a site configured without "models" (and a config
 * without top-level models[]) serves what its /v1/models lists, a python3
 * http.server site; when the site's list changes, the gateway follows
 * within a few probes and logs the change. An infergate peer's models come
 * from its /load.
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
#include "peers.h"

static ig_models_site_t site;
static ig_proc_t gw;

static void write_models(const char *text)
{
    assert_int_equal(ig_tf_replace(site.models_file, text, strlen(text)), 0);
}

static int group_setup(void **state)
{
    (void)state;
    if (ig_models_site_start(&site, "alpha\n", NULL) != 0)
        return -1;
    int port = ig_proc_free_port();
    return ig_gwf_serve_config(&gw, port, "info", IG_PROC_PIPE_ERR, 10000, 15000,
                               "{\"region\":\"disc\",\"listen\":\"127.0.0.1:%d\","
                               "\"sites\":[{\"name\":\"s\",\"url\":\"http://127.0.0.1:%d\"}]}",
                               port, site.proc.port);
}

static int group_teardown(void **state)
{
    (void)state;
    ig_proc_stop(&gw, SIGTERM, 10000);
    ig_proc_dispose(&gw);
    ig_models_site_stop(&site);
    return 0;
}

/* 1 when GET /v1/models of the gateway lists id. */
static int lists(const char *id)
{
    json_t *doc = ig_gwf_get_json(gw.port, "/v1/models");
    int found = 0;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(doc, "data"), i, m)
    {
        if (strcmp(json_string_value(json_object_get(m, "id")), id) == 0)
            found = 1;
    }
    json_decref(doc);
    return found;
}

/* POST /v1/completions for model: the status; the upstream header checked. */
static int complete(const char *model)
{
    char body[256];
    snprintf(body, sizeof(body), "{\"model\":\"%s\",\"prompt\":\"hi\",\"max_tokens\":2}", model);
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(gw.port, "/v1/completions", body, &r, 10000), 0);
    int status = r.status;
    if (status == 200) {
        const char *u = ig_tc_header(&r, "x-infergate-upstream");
        assert_non_null(u);
        assert_string_equal(u, "s");
        char want[128];
        snprintf(want, sizeof(want), "from the site, %s", model);
        assert_non_null(strstr(r.body, want));
    }
    ig_tc_response_free(&r);
    return status;
}

static void test_site_without_models_serves(void **state)
{
    (void)state;
    assert_true(lists("alpha"));
    assert_int_equal(complete("alpha"), 200);
    assert_int_equal(complete("gamma"), 404);
    json_t *st = ig_gwf_get_json(gw.port, "/status");
    json_t *models = json_object_get(json_array_get(json_object_get(st, "sites"), 0), "models");
    assert_int_equal(json_array_size(models), 1);
    assert_string_equal(json_string_value(json_array_get(models, 0)), "alpha");
    json_decref(st);
    assert_int_equal(ig_proc_wait_log(&gw, "site s: models now [alpha] (were [])", 5000), 0);
}

static void test_changed_site_followed_and_logged(void **state)
{
    (void)state;
    write_models("beta\ngamma\n");
    int followed = 0;
    for (int i = 0; i < 100 && !followed; i++) {
        followed = lists("beta") && lists("gamma") && !lists("alpha");
        if (!followed)
            usleep(100 * 1000);
    }
    assert_true(followed);
    assert_int_equal(ig_proc_wait_log(&gw, "site s: models now [beta, gamma] (were [alpha])", 5000),
                     0);
    assert_int_equal(complete("beta"), 200);
    assert_int_equal(complete("gamma"), 200);
    assert_int_equal(complete("alpha"), 404);
}

/* An infergate peer without "models" in the site entry: its models come
 * from its /load (the models its ready pools serve). */
static void test_infergate_peer_discovered(void **state)
{
    (void)state;
    ig_proc_t peer, front;
    assert_int_equal(ig_gwf_solo_start(&peer, "west", NULL), 0);
    int port = ig_proc_free_port();
    assert_int_equal(
        ig_gwf_serve_config(&front, port, "info", IG_PROC_PIPE_ERR, 10000, 15000,
                            "{\"region\":\"east\",\"listen\":\"127.0.0.1:%d\","
                            "\"sites\":[{\"name\":\"west\",\"url\":\"http://127.0.0.1:%d\"}]}",
                            port, peer.port),
        0);
    assert_int_equal(ig_proc_wait_log(&front, "site west: models now [tiny] (were [])", 5000), 0);
    json_t *st = ig_gwf_get_json(port, "/status");
    json_t *site0 = json_array_get(json_object_get(st, "sites"), 0);
    assert_true(json_is_true(json_object_get(site0, "peer")));
    assert_string_equal(json_string_value(json_array_get(json_object_get(site0, "models"), 0)),
                        "tiny");
    json_decref(st);
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_complete(port, 2, &r), 0);
    assert_int_equal(r.status, 200);
    const char *u = ig_tc_header(&r, "x-infergate-upstream");
    assert_non_null(u);
    assert_string_equal(u, "west");
    ig_tc_response_free(&r);
    ig_proc_stop(&front, SIGTERM, 10000);
    ig_proc_dispose(&front);
    assert_int_equal(ig_gwf_solo_stop(&peer), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_site_without_models_serves),
        cmocka_unit_test(test_changed_site_followed_and_logged),
        cmocka_unit_test(test_infergate_peer_discovered),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
