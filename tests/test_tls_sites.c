/* TLS to sites: a gateway serving TLS (with API keys) is another gateway's
 * https:// site, reached with its CA and a peer key; a wrong CA, an expired
 * certificate (openssl s_server), a host name mismatch and a plain HTTP
 * server behind an https:// url, all serving the same model, are each
 * refused and never used. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <signal.h>
#include <stdatomic.h>

#include "files.h"
#include "gwfixture.h"
#include "proc.h"
#include "testclient.h"
#include "testserver.h"
#include "tlscerts.h"

#define SAN "DNS:localhost,IP:127.0.0.1"

static char dir[256];
static ig_ts_site_t site;
static ig_ts_t *backend;  /* the OpenAI-style server behind gateway B */
static ig_proc_t gw_b;    /* serves TLS, needs a key */
static ig_proc_t expired; /* openssl s_server with an expired certificate */
static ig_proc_t gw_a;    /* plain, with B and the broken ones as https sites */

/* Polls GET /ready of a TLS gateway with curl until it answers 200. */
static int wait_ready_tls(int port, int timeout_ms)
{
    char cmd[1024];
    snprintf(
        cmd, sizeof(cmd),
        "curl -s -o /dev/null -w %%{http_code} --cacert %s/a-ca.pem https://localhost:%d/ready",
        dir, port);
    long long end = ig_tc_now_ms() + timeout_ms;
    while (ig_tc_now_ms() < end) {
        char *out = NULL;
        ig_tlsc_sh(cmd, &out, 10);
        int ok = out != NULL && strcmp(out, "200") == 0;
        free(out);
        if (ok)
            return 0;
        usleep(200000);
    }
    return -1;
}

static int group_setup(void **state)
{
    if (ig_tf_mkdtemp(dir, sizeof(dir)) != 0 || ig_tlsc_make(dir, "a", SAN, 2) != 0 ||
        ig_tlsc_make(dir, "b", SAN, 2) != 0 || ig_tlsc_make(dir, "exp", SAN, -1) != 0)
        return -1;
    backend = ig_ts_site_start(&site, 0); /* plain HTTP, named by an https:// url */
    if (backend == NULL || ig_gwf_model_setup(NULL) != 0)
        return -1;
    /* B: a region with one worker, behind TLS and a peer key */
    char extra[2048];
    int port_b = ig_proc_free_port();
    snprintf(extra, sizeof(extra),
             ",\"api_keys\":[{\"key\":\"sk-peer-a\",\"name\":\"a\",\"peer\":true}],"
             "\"tls\":{\"cert_file\":\"%s/a.pem\",\"key_file\":\"%s/a.key\"}",
             dir, dir);
    const char *path = ig_gwf_pool_config("b", port_b, ig_gwf_model_dir, 1, 1, 1, 8, NULL, extra);
    if (path == NULL || ig_gwf_serve(&gw_b, path, port_b, "warn", 0, 20000, 0) != 0 ||
        wait_ready_tls(port_b, 60000) != 0)
        return -1;

    int port_exp = ig_proc_free_port();
    char accept[16], cert[512], key[512];
    snprintf(accept, sizeof(accept), "%d", port_exp);
    snprintf(cert, sizeof(cert), "%s/exp.pem", dir);
    snprintf(key, sizeof(key), "%s/exp.key", dir);
    char *const argv[] = {
        "/usr/bin/openssl", "s_server", "-accept", accept, "-cert", cert, "-key", key, "-www",
        "-quiet",           NULL};
    if (ig_proc_start(&expired, argv, IG_PROC_QUIET) != 0 ||
        ig_proc_wait_listening(&expired, port_exp, 10000) != 0)
        return -1;

    /* A: every site serves "tiny"; only the ones that verify are ever used */
    int port_a = ig_proc_free_port();
    char sites[4096], conf[8192];
    snprintf(sites, sizeof(sites),
             "{\"name\":\"b_ok\",\"url\":\"https://localhost:%d\",\"models\":[\"tiny\"],"
             "\"api_key\":\"sk-peer-a\",\"tls\":{\"ca_file\":\"%s/a-ca.pem\"}},"
             "{\"name\":\"b_wrong_ca\",\"url\":\"https://localhost:%d\",\"models\":[\"tiny\"],"
             "\"api_key\":\"sk-peer-a\",\"tls\":{\"ca_file\":\"%s/b-ca.pem\"}},"
             "{\"name\":\"b_wrong_name\",\"url\":\"https://127.0.0.1:%d\",\"models\":[\"tiny\"],"
             "\"api_key\":\"sk-peer-a\",\"tls\":{\"ca_file\":\"%s/a-ca.pem\","
             "\"server_name\":\"wrong.example\"}},"
             "{\"name\":\"expired\",\"url\":\"https://localhost:%d\",\"models\":[\"tiny\"],"
             "\"tls\":{\"ca_file\":\"%s/exp-ca.pem\"}},"
             "{\"name\":\"plain\",\"url\":\"https://127.0.0.1:%d\",\"models\":[\"tiny\"]}",
             port_b, dir, port_b, dir, port_b, dir, port_exp, dir, ig_ts_port(backend));
    snprintf(conf, sizeof(conf),
             "{\"region\":\"a\",\"listen\":\"127.0.0.1:%d\",\"models\":[{\"name\":\"tiny\"}],"
             "\"routing\":{\"connect_timeout_ms\":1000},"
             "\"sites\":[%s],\"limits\":{\"drain_grace_ms\":0}}",
             port_a, sites);
    path = ig_proc_temp_file(conf, ".json");
    if (path == NULL ||
        ig_gwf_serve(&gw_a, path, port_a, "warn", IG_PROC_PIPE_ERR, 10000, 20000) != 0) {
        fprintf(stderr, "gateway a: %s\n", gw_a.err ? gw_a.err : "");
        return -1;
    }
    /* B without the key answers 401 to A's probes: A's site would be down */
    return 0;
}

static int group_teardown(void **state)
{
    int st = ig_proc_stop(&gw_a, SIGTERM, 10000);
    ig_proc_dispose(&gw_a);
    int st_b = ig_proc_stop(&gw_b, SIGTERM, 10000);
    ig_proc_dispose(&gw_b);
    ig_proc_stop(&expired, SIGTERM, 5000);
    ig_proc_dispose(&expired);
    if (backend != NULL)
        ig_ts_stop(backend);
    ig_gwf_model_teardown(NULL);
    ig_tf_rmtree(dir);
    return st == 0 && st_b == 0 ? 0 : -1;
}

static int complete(ig_tc_response_t *r)
{
    const char body[] = "{\"model\":\"tiny\",\"prompt\":\"hi\",\"max_tokens\":2}";
    memset(r, 0, sizeof(*r));
    return ig_gwf_post(gw_a.port, "/v1/completions", body, r, 30000);
}

/* The site's up flag in A's /status, by name: 1, 0, or -1 when absent. */
static int site_up(const char *name)
{
    json_t *st = ig_gwf_get_json(gw_a.port, "/status");
    json_t *sites = st ? json_object_get(st, "sites") : NULL;
    int up = -1;
    size_t i;
    json_t *s;
    json_array_foreach(sites, i, s)
    {
        if (strcmp(json_string_value(json_object_get(s, "name")), name) == 0)
            up = json_is_true(json_object_get(s, "up"));
    }
    json_decref(st);
    return up;
}

/* Every answer came from b_ok, through TLS, on pooled connections. */
static void test_gateway_behind_tls(void **state)
{
    for (int i = 0; i < 8; i++) {
        ig_tc_response_t r;
        assert_int_equal(complete(&r), 0);
        assert_int_equal(r.status, 200);
        assert_string_equal(ig_tc_header(&r, "x-infergate-upstream"), "b_ok");
        assert_non_null(strstr(r.body, "text_completion"));
        ig_tc_response_free(&r);
    }
    assert_int_equal(site_up("b_ok"), 1);
}

/* A refused site: never marked up, never chosen, and the log says why. */
static void expect_refused(const char *name, const char *why)
{
    assert_int_equal(site_up(name), 0);
    char needle[256];
    snprintf(needle, sizeof(needle), "upstream %s: TLS handshake failed: %s", name, why);
    if (ig_proc_wait_log(&gw_a, needle, 5000) != 0)
        fprintf(stderr, "log: %s\n", gw_a.err);
    assert_int_equal(ig_proc_wait_log(&gw_a, needle, 5000), 0);
}

static void test_wrong_ca(void **state)
{
    expect_refused("b_wrong_ca", "certificate verify failed");
}

static void test_hostname_mismatch(void **state)
{
    expect_refused("b_wrong_name", "certificate verify failed: hostname mismatch");
}

static void test_expired(void **state)
{
    expect_refused("expired", "certificate verify failed: certificate has expired");
}

/* A plain HTTP server behind an https:// url: the handshake fails, and no
 * request ever reaches it in plain text. */
static void test_no_plaintext_fallback(void **state)
{
    expect_refused("plain", "");
    assert_int_equal(atomic_load(&site.completions), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gateway_behind_tls),    cmocka_unit_test(test_wrong_ca),
        cmocka_unit_test(test_hostname_mismatch),     cmocka_unit_test(test_expired),
        cmocka_unit_test(test_no_plaintext_fallback),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
