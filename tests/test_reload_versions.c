/*
 * Rolling a model version: two versions of model "tiny" (two models made
 * with `infergate mkmodel --seed`) served side by side by their own pools.
 * Requests split by weight, x-infergate-model-version pins one (and the
 * answer names the version that served), GET /v1/models lists the
 * versions with their shares, and a reload that moves the weights (the
 * rollout, then the rollback) changes the split in place, with no pool
 * restarted and no request failed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "files.h"
#include "gwfixture.h"

static char model_b[128];
static char config_path[1024];
static ig_proc_t gw;
static int port;

static void write_config(double w1, double w2)
{
    char text[4096];
    snprintf(text, sizeof(text),
             "{\"region\":\"r1\",\"listen\":\"127.0.0.1:%d\",\"limits\":{\"drain_grace_ms\":0},"
             "\"models\":[{\"name\":\"tiny\",\"version\":\"v1\",\"path\":\"%s\",\"weight\":%g},"
             "{\"name\":\"tiny\",\"version\":\"v2\",\"path\":\"%s\",\"weight\":%g}],"
             "\"pools\":[{\"name\":\"p1\",\"model\":\"tiny\",\"version\":\"v1\",\"threads\":1},"
             "{\"name\":\"p2\",\"model\":\"tiny\",\"version\":\"v2\",\"threads\":1}]}",
             port, ig_gwf_model_dir, w1, model_b, w2);
    assert_int_equal(ig_tf_replace(config_path, text, strlen(text)), 0);
}

static int group_setup(void **state)
{
    if (ig_gwf_model_setup(state) != 0)
        return -1;
    snprintf(model_b, sizeof(model_b), "%s/tiny-b", ig_gwf_run_dir);
    if (ig_gwf_model_make_seed(model_b, 77) != 0)
        return -1;
    port = ig_proc_free_port();
    snprintf(config_path, sizeof(config_path), "%s/versions.json", ig_gwf_run_dir);
    return 0;
}

/* One completion, pinned to `pin` unless NULL: its status, the version
 * header and the text. */
static int complete(const char *pin, char *version, size_t vcap, char *text, size_t tcap)
{
    char raw[1024];
    static const char body[] =
        "{\"model\":\"tiny\",\"prompt\":\"once upon a time\",\"max_tokens\":6,\"temperature\":0}";
    char pinh[128] = "";
    if (pin != NULL)
        snprintf(pinh, sizeof(pinh), "x-infergate-model-version: %s\r\n", pin);
    snprintf(raw, sizeof(raw),
             "POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
             "Content-Type: application/json\r\n%sContent-Length: %zu\r\n\r\n%s",
             pinh, sizeof(body) - 1, body);
    ig_tc_response_t r;
    if (ig_tc_request(port, raw, &r, 30000) != 0)
        return -1;
    int status = r.status;
    const char *v = ig_tc_header(&r, "x-infergate-model-version");
    snprintf(version, vcap, "%s", v ? v : "");
    json_t *doc = json_loads(r.body ? r.body : "", 0, NULL);
    const char *t = json_string_value(
        json_object_get(json_array_get(json_object_get(doc, "choices"), 0), "text"));
    snprintf(text, tcap, "%s", t ? t : (r.body ? r.body : ""));
    json_decref(doc);
    ig_tc_response_free(&r);
    return status;
}

/* n unpinned requests: how many each version served; every one is 200
 * and a version's answers are its own text. */
static void split(int n, int *v1, int *v2, const char *text1, const char *text2)
{
    *v1 = *v2 = 0;
    for (int i = 0; i < n; i++) {
        char v[32], t[512];
        assert_int_equal(complete(NULL, v, sizeof(v), t, sizeof(t)), 200);
        if (strcmp(v, "v1") == 0) {
            (*v1)++;
            assert_string_equal(t, text1);
        } else {
            assert_string_equal(v, "v2");
            (*v2)++;
            assert_string_equal(t, text2);
        }
    }
}

static void reload_weights(double w1, double w2, double applied_before)
{
    write_config(w1, w2);
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(port, "/admin/reload", "{}", &r, 10000), 0);
    assert_int_equal(r.status, 200);
    /* Weights change in place: no pool is started again. */
    assert_non_null(strstr(r.body, "no pool changes"));
    ig_tc_response_free(&r);
    assert_int_equal(ig_gwf_wait_reloads(port, "applied", applied_before + 1, 10000), 0);
}

static void test_canary_pin_and_rollout(void **state)
{
    (void)state;
    write_config(3, 1);
    assert_int_equal(ig_gwf_serve(&gw, config_path, port, "warn", 0, 20000, 60000), 0);
    /* Both versions ready (readiness needs only one). */
    long long end = ig_tc_now_ms() + 60000;
    char v[32], text1[512], text2[512];
    while (ig_tc_now_ms() < end && complete("v2", v, sizeof(v), text2, sizeof(text2)) != 200)
        usleep(100 * 1000);
    assert_int_equal(complete("v1", v, sizeof(v), text1, sizeof(text1)), 200);
    assert_string_equal(v, "v1");
    assert_int_equal(complete("v2", v, sizeof(v), text2, sizeof(text2)), 200);
    assert_string_equal(v, "v2");
    assert_string_not_equal(text1, text2);

    /* Pinned: always that version. An unknown one is a 404. */
    for (int i = 0; i < 10; i++) {
        char t[512];
        assert_int_equal(complete("v2", v, sizeof(v), t, sizeof(t)), 200);
        assert_string_equal(v, "v2");
        assert_string_equal(t, text2);
    }
    char t[512];
    assert_int_equal(complete("v9", v, sizeof(v), t, sizeof(t)), 404);
    assert_non_null(strstr(t, "model_version_not_found"));

    /* /v1/models: one model, two versions, shares 0.75 and 0.25. */
    json_t *models = ig_gwf_get_json(port, "/v1/models");
    assert_non_null(models);
    json_t *data = json_object_get(models, "data");
    assert_int_equal(json_array_size(data), 1);
    json_t *versions = json_object_get(json_array_get(data, 0), "versions");
    assert_int_equal(json_array_size(versions), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(versions, 0), "version")),
                        "v1");
    assert_true(fabs(json_number_value(json_object_get(json_array_get(versions, 0), "share")) -
                     0.75) < 1e-9);
    assert_true(fabs(json_number_value(json_object_get(json_array_get(versions, 1), "share")) -
                     0.25) < 1e-9);
    json_decref(models);

    /* The split: 3:1. Of 200 requests, v2's 50 +- 18 (3 sigma). */
    int n1, n2;
    split(200, &n1, &n2, text1, text2);
    fprintf(stderr, "canary 3:1 -> v1 %d, v2 %d\n", n1, n2);
    assert_true(n2 >= 32 && n2 <= 68);

    /* Rollout: all to v2, in place. */
    reload_weights(0, 1, 0);
    split(40, &n1, &n2, text1, text2);
    assert_int_equal(n1, 0);
    assert_int_equal(n2, 40);
    /* A pin still reaches the old version while it runs. */
    assert_int_equal(complete("v1", v, sizeof(v), t, sizeof(t)), 200);
    assert_string_equal(t, text1);

    /* Rollback: all to v1. */
    reload_weights(1, 0, 1);
    split(40, &n1, &n2, text1, text2);
    assert_int_equal(n1, 40);
    assert_int_equal(n2, 0);

    assert_int_equal(ig_proc_stop(&gw, SIGTERM, 30000), 0);
    ig_proc_dispose(&gw);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_canary_pin_and_rollout),
    };
    return cmocka_run_group_tests(tests, group_setup, ig_gwf_model_teardown);
}
