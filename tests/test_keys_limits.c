/* API keys as objects, against a real `infergate serve` in front of the
 * test upstream: a key at 2 requests/s gets 429s (Retry-After,
 * x-ratelimit-*) while another key is unaffected; a token limit holds across
 * streams and a stream at the limit ends cleanly; the model allow-list
 * (403); the admin surface; metrics by key name, never the key; a plain
 * string key still works; and a client's x-infergate-forwarded is ignored
 * unless a peer key sent it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>

#include <cmocka.h>

#include "gwfixture.h"
#include "proc.h"
#include "testclient.h"

#define TOKENS_PER_MIN 300

static ig_proc_t up, gw;

static int group_setup(void **state)
{
    if (ig_gwf_upstream(&up, "--itl-ms", "1", NULL) != 0)
        return -1;
    int port = ig_proc_free_port();
    return ig_gwf_serve_config(
        &gw, port, "warn", 0, 10000, 0,
        "{\"listen\":\"127.0.0.1:%d\",\"models\":[{\"name\":\"m\"},{\"name\":\"other\"}],"
        "\"sites\":[{\"name\":\"s0\",\"url\":\"http://127.0.0.1:%d\","
        "\"models\":[\"m\",\"other\"]}],"
        "\"limits\":{\"drain_grace_ms\":0},"
        "\"api_keys\":["
        "{\"key\":\"sk-slow-0001\",\"name\":\"slow\",\"requests_per_s\":2},"
        "{\"key\":\"sk-fast-0002\",\"name\":\"fast\"},"
        "{\"key\":\"sk-tok-0003\",\"name\":\"tok\",\"tokens_per_min\":%d},"
        "{\"key\":\"sk-narrow-0004\",\"name\":\"narrow\",\"models\":[\"other\"]},"
        "{\"key\":\"sk-peer-0005\",\"name\":\"peer\",\"peer\":true},"
        "{\"key\":\"sk-ops-0006\",\"name\":\"ops\",\"admin\":true},"
        "\"sk-plain-0007\"]}",
        port, up.port, TOKENS_PER_MIN);
}

static int group_teardown(void **state)
{
    /* a clean exit: under ASan a leak or an error would show here */
    int st = ig_proc_stop(&gw, SIGTERM, 10000);
    ig_proc_dispose(&gw);
    ig_proc_stop(&up, SIGTERM, 5000);
    ig_proc_dispose(&up);
    if (st != 0)
        fprintf(stderr, "serve exited with %d\n", st);
    return st == 0 ? 0 : -1;
}

/* One request with an optional key and extra header lines. */
static int call(const char *method, const char *path, const char *key, const char *extra,
                const char *body, ig_tc_response_t *r)
{
    char raw[8192], auth[256] = "";
    if (key != NULL)
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", key);
    snprintf(raw, sizeof(raw),
             "%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n%s%s"
             "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
             method, path, auth, extra ? extra : "", body ? strlen(body) : 0, body ? body : "");
    memset(r, 0, sizeof(*r));
    return ig_tc_request(gw.port, raw, r, 30000);
}

static int complete(const char *key, const char *model, const char *extra)
{
    char body[256];
    snprintf(body, sizeof(body), "{\"model\":\"%s\",\"prompt\":\"hi\",\"max_tokens\":2}", model);
    ig_tc_response_t r;
    if (call("POST", "/v1/completions", key, extra, body, &r) != 0)
        return -1;
    int st = r.status;
    ig_tc_response_free(&r);
    return st;
}

static void test_ready(void **state)
{
    /* the site is probed up */
    int st = 0;
    for (int i = 0; i < 100 && st != 200; i++) {
        st = complete("sk-fast-0002", "m", NULL);
        if (st != 200)
            usleep(100000);
    }
    assert_int_equal(st, 200);
}

static void test_unauthenticated(void **state)
{
    assert_int_equal(complete(NULL, "m", NULL), 401);
    assert_int_equal(complete("sk-fast-0002x", "m", NULL), 401);
    assert_int_equal(complete("sk-fast-000", "m", NULL), 401);
    assert_int_equal(complete("sk-plain-0007", "m", NULL), 200); /* a plain string entry */
}

static void test_rate_limit_per_key(void **state)
{
    ig_tc_response_t r;
    usleep(1100000); /* the slow key's bucket is full (2) */
    int ok = 0, limited = 0, fast_ok = 0;
    long long t0 = ig_tc_now_ms();
    const char body[] = "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":2}";
    for (int i = 0; i < 10; i++) {
        assert_int_equal(call("POST", "/v1/completions", "sk-slow-0001", NULL, body, &r), 0);
        if (r.status == 200) {
            ok++;
            assert_string_equal(ig_tc_header(&r, "x-ratelimit-limit-requests"), "2");
        } else {
            assert_int_equal(r.status, 429);
            limited++;
            const char *ra = ig_tc_header(&r, "Retry-After");
            assert_non_null(ra);
            assert_true(atoi(ra) >= 1);
            assert_string_equal(ig_tc_header(&r, "x-ratelimit-limit-requests"), "2");
            assert_string_equal(ig_tc_header(&r, "x-ratelimit-remaining-requests"), "0");
            assert_non_null(ig_tc_header(&r, "x-ratelimit-reset-requests"));
            assert_non_null(strstr(r.body, "rate_limit_exceeded"));
        }
        ig_tc_response_free(&r);
        /* the other key, at the same time, is unaffected */
        fast_ok += complete("sk-fast-0002", "m", NULL) == 200;
    }
    long long took = ig_tc_now_ms() - t0;
    fprintf(stderr, "2 req/s key: %d ok, %d limited in %lld ms; other key %d/10 ok\n", ok, limited,
            took, fast_ok);
    /* 2 from the bucket plus 2 a second for the time it took */
    int most = 2 + (int)(took * 2 / 1000) + 1;
    assert_true(ok >= 2);
    assert_true(ok <= most);
    assert_true(limited >= 10 - most);
    assert_int_equal(fast_ok, 10);
    /* a second later the slow key passes again */
    usleep(1100000);
    assert_int_equal(complete("sk-slow-0001", "m", NULL), 200);
}

/* Streams max_tokens 100 with the token key until one is refused: what was
 * generated in all of them stays within the minute's tokens. */
static void test_token_limit_across_streams(void **state)
{
    const char body[] = "{\"model\":\"m\",\"prompt\":\"once upon a time\",\"max_tokens\":100,"
                        "\"stream\":true}";
    int generated = 0, admitted = 0, refused = 0, clamped = 0;
    long long t0 = ig_tc_now_ms();
    for (int i = 0; i < 8 && refused == 0; i++) {
        ig_tc_response_t r;
        assert_int_equal(call("POST", "/v1/completions", "sk-tok-0003", NULL, body, &r), 0);
        if (r.status == 429) {
            refused++;
            assert_non_null(ig_tc_header(&r, "Retry-After"));
            assert_non_null(ig_tc_header(&r, "x-ratelimit-limit-tokens"));
            ig_tc_response_free(&r);
            continue;
        }
        assert_int_equal(r.status, 200);
        admitted++;
        int n = 0;
        for (const char *p = r.body; (p = strstr(p, "\"text\":\"")) != NULL; p += 8)
            n += p[8] != '"'; /* a non-empty text: one token */
        /* every admitted stream ends cleanly */
        assert_non_null(strstr(r.body, "\"finish_reason\":\"length\""));
        assert_non_null(strstr(r.body, "data: [DONE]"));
        clamped += n < 100;
        generated += n;
        ig_tc_response_free(&r);
    }
    double elapsed_s = (double)(ig_tc_now_ms() - t0) / 1000.0;
    double refill = elapsed_s * TOKENS_PER_MIN / 60.0;
    fprintf(stderr,
            "token limit %d/min: %d streams admitted, %d tokens generated, %d refused, "
            "%.1f s\n",
            TOKENS_PER_MIN, admitted, generated, refused, elapsed_s);
    /* the prompt counts too (at least 4 tokens per request) */
    assert_true(generated + 4 * admitted <= TOKENS_PER_MIN + refill + 2);
    assert_true(admitted >= 2);
    assert_int_equal(refused, 1);
    assert_true(clamped >= 1); /* the last admitted one was cut to what was left */
}

static void test_model_allow_list(void **state)
{
    ig_tc_response_t r;
    const char body[] = "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":2}";
    assert_int_equal(call("POST", "/v1/completions", "sk-narrow-0004", NULL, body, &r), 0);
    assert_int_equal(r.status, 403);
    assert_non_null(strstr(r.body, "model_not_allowed"));
    ig_tc_response_free(&r);
    assert_int_equal(complete("sk-narrow-0004", "other", NULL), 200);
}

static int get_status(const char *path, const char *key)
{
    ig_tc_response_t r;
    if (call("GET", path, key, NULL, NULL, &r) != 0)
        return -1;
    int st = r.status;
    ig_tc_response_free(&r);
    return st;
}

static void test_admin_surface(void **state)
{
    static const char *const admin_paths[] = {"/status", "/metrics"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(get_status(admin_paths[i], NULL), 401);
        assert_int_equal(get_status(admin_paths[i], "sk-fast-0002"), 403);
        assert_int_equal(get_status(admin_paths[i], "sk-peer-0005"), 403);
        assert_int_equal(get_status(admin_paths[i], "sk-ops-0006"), 200);
    }
    assert_int_equal(get_status("/load", NULL), 401);
    assert_int_equal(get_status("/load", "sk-fast-0002"), 403);
    assert_int_equal(get_status("/load", "sk-peer-0005"), 200);
    assert_int_equal(get_status("/load", "sk-ops-0006"), 200);
    /* the probes stay open */
    assert_int_equal(get_status("/health", NULL), 200);
    assert_int_equal(get_status("/ready", NULL), 200);
}

static void test_metrics_by_name(void **state)
{
    ig_tc_response_t r;
    assert_int_equal(call("GET", "/metrics", "sk-ops-0006", NULL, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "infergate_key_requests_total{key=\"slow\",status=\"429\"}"));
    assert_non_null(strstr(r.body, "infergate_key_requests_total{key=\"fast\",status=\"200\"}"));
    assert_non_null(strstr(r.body, "infergate_key_requests_total{key=\"key-6\",status=\"200\"}"));
    assert_non_null(strstr(r.body, "infergate_key_limited_total{key=\"tok\",limit=\"tokens\"}"));
    assert_non_null(strstr(r.body, "infergate_key_tokens_total{key=\"tok\"}"));
    /* no key ever shows */
    assert_null(strstr(r.body, "sk-"));
    ig_tc_response_free(&r);
}

/* The gateway has no pools: a request it may forward goes to the site; a
 * forwarded one (local only) has nowhere to go. */
static void test_forwarded_spoofing(void **state)
{
    const char *mark = "x-infergate-forwarded: elsewhere\r\n";
    assert_int_equal(complete("sk-fast-0002", "m", mark), 200); /* ignored */
    assert_int_equal(complete("sk-plain-0007", "m", mark), 200);
    int st = complete("sk-peer-0005", "m", mark); /* believed: local only */
    assert_true(st >= 400);
    assert_int_equal(complete("sk-peer-0005", "m", NULL), 200);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ready),
        cmocka_unit_test(test_unauthenticated),
        cmocka_unit_test(test_rate_limit_per_key),
        cmocka_unit_test(test_token_limit_across_streams),
        cmocka_unit_test(test_model_allow_list),
        cmocka_unit_test(test_admin_surface),
        cmocka_unit_test(test_metrics_by_name),
        cmocka_unit_test(test_forwarded_spoofing),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
