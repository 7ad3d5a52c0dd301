/*
 * A site that refuses the gateway's credentials: a python3 http.server site
 * that wants "Authorization: Bearer site-key" on completions (as OpenAI's
 * API does). The client was admitted at the gateway's own door, so the
 * site's 401 is the gateway's problem, not the client's:
 *  - with no sites[].api_key, the client gets 502 upstream_auth naming the
 *    site, never the site's 401 (which would tell it its own key is bad);
 *  - with a wrong key, the same; the site is ejected after 5 such failures
 *    in a row (eject.consecutive_failures), like any site that fails;
 *  - with the right sites[].api_key, the answer comes through;
 *  - a reload that corrects the key takes effect (the site is started
 *    again with its new credentials).
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
#include "peers.h"
#include "testclient.h"

static ig_models_site_t site;

static int group_setup(void **state)
{
    (void)state;
    const char *args[] = {"--require-key", "site-key", NULL};
    return ig_models_site_start(&site, "alpha\n", args);
}

static int group_teardown(void **state)
{
    (void)state;
    ig_models_site_stop(&site);
    return 0;
}

/* The config of a gateway on port whose one site is the python site;
 * key_json is "" or ",\"api_key\":\"...\"". Its own door wants
 * client-key. */
static void config_text(char *cfg, size_t cap, int port, const char *key_json)
{
    snprintf(
        cfg, cap,
        "{\"region\":\"auth\",\"listen\":\"127.0.0.1:%d\",\"api_keys\":[\"client-key\"],"
        "\"limits\":{\"drain_grace_ms\":0},"
        "\"sites\":[{\"name\":\"s\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"alpha\"]%s}]}",
        port, site.proc.port, key_json);
}

/* Starts that gateway; returns its config file's path. */
static const char *gateway_start(ig_proc_t *gw, const char *key_json)
{
    int port = ig_proc_free_port();
    char cfg[768];
    config_text(cfg, sizeof(cfg), port, key_json);
    const char *path = ig_proc_temp_file(cfg, ".json");
    assert_non_null(path);
    assert_int_equal(ig_gwf_serve(gw, path, port, "info", IG_PROC_PIPE_ERR, 10000, 15000), 0);
    return path;
}

static void gateway_stop(ig_proc_t *gw)
{
    assert_int_equal(ig_proc_stop(gw, SIGTERM, 10000), 0);
    ig_proc_dispose(gw);
}

/* One completion with the client's key; returns the status, the body in
 * *body (caller frees). */
static int complete(ig_proc_t *gw, char **body)
{
    char req[512];
    snprintf(req, sizeof(req),
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer client-key\r\n"
             "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
             strlen("{\"model\":\"alpha\",\"prompt\":\"hi\",\"max_tokens\":2}"),
             "{\"model\":\"alpha\",\"prompt\":\"hi\",\"max_tokens\":2}");
    ig_tc_response_t r;
    assert_int_equal(ig_tc_request(gw->port, req, &r, 10000), 0);
    int status = r.status;
    *body = strdup(r.body ? r.body : "");
    ig_tc_response_free(&r);
    return status;
}

static void test_no_site_key_is_502(void **state)
{
    (void)state;
    ig_proc_t gw;
    gateway_start(&gw, "");
    char *body;
    int status = complete(&gw, &body);
    print_message("no key: %d %s\n", status, body);
    assert_int_equal(status, 502);
    assert_non_null(strstr(body, "\"upstream_auth\""));
    assert_non_null(strstr(body, "site s refused"));
    assert_null(strstr(body, "Incorrect API key")); /* the site's own words stay out */
    free(body);
    gateway_stop(&gw);
}

static void test_wrong_site_key_is_502_and_ejects(void **state)
{
    (void)state;
    ig_proc_t gw;
    gateway_start(&gw, ",\"api_key\":\"not-it\"");
    for (int i = 0; i < 8; i++) {
        char *body;
        int status = complete(&gw, &body);
        /* 502 while the site is tried; 503 once it is ejected */
        assert_true(status == 502 || status == 503);
        assert_true(status != 401 && status != 403);
        free(body);
    }
    assert_int_equal(ig_proc_wait_log(&gw, "upstream s: ejected for failing", 5000), 0);
    gateway_stop(&gw);
}

static void test_site_key_passes(void **state)
{
    (void)state;
    ig_proc_t gw;
    gateway_start(&gw, ",\"api_key\":\"site-key\"");
    char *body;
    int status = complete(&gw, &body);
    assert_int_equal(status, 200);
    assert_non_null(strstr(body, "from the site, alpha"));
    free(body);
    gateway_stop(&gw);
}

static void test_reload_corrects_key(void **state)
{
    (void)state;
    ig_proc_t gw;
    const char *path = gateway_start(&gw, ",\"api_key\":\"not-it\"");
    char *body;
    assert_int_equal(complete(&gw, &body), 502);
    free(body);
    char cfg[768];
    config_text(cfg, sizeof(cfg), gw.port, ",\"api_key\":\"site-key\"");
    assert_int_equal(ig_tf_write(path, cfg, strlen(cfg)), 0);
    kill(gw.pid, SIGHUP);
    assert_int_equal(ig_proc_wait_log(&gw, "replacing site s", 5000), 0);
    int status = 0;
    for (int i = 0; i < 50 && status != 200; i++) {
        status = complete(&gw, &body);
        free(body);
        if (status != 200)
            usleep(100 * 1000);
    }
    assert_int_equal(status, 200);
    gateway_stop(&gw);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_site_key_is_502),
        cmocka_unit_test(test_wrong_site_key_is_502_and_ejects),
        cmocka_unit_test(test_site_key_passes),
        cmocka_unit_test(test_reload_corrects_key),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
