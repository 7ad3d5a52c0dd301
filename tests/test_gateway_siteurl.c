/*
 * Site URLs: http://HOST without a port means port 80 in the config and in
 * the upstream client alike, and `infergate serve` starts with such sites;
 * host names resolve without blocking, and one that does not resolve marks
 * its site down instead of stopping serve. Real sockets and processes:
 * tests/peers/closedelim_upstream.py as the site (on 127.0.0.2:80 for the
 * port-80 cases, where this machine lets a test bind it).
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
#include <uv.h>

#include "gwfixture.h"
#include "infergate/config.h"
#include "infergate/error.h"
#include "infergate/upstream.h"
#include "peers.h"

/* ---- the config and the client agree ------------------------------------ */

static void test_config_url_without_port(void **state)
{
    const char *json =
        "{\"models\":[{\"name\":\"m\"}],\"sites\":["
        "{\"name\":\"a\",\"url\":\"http://localhost\",\"models\":[\"m\"]},"
        "{\"name\":\"b\",\"url\":\"http://[::1]/base/\",\"models\":[\"m\"]},"
        "{\"name\":\"c\",\"url\":\"http://nonexistent.invalid\",\"models\":[\"m\"]},"
        "{\"name\":\"d\",\"url\":\"http://127.0.0.2\",\"models\":[\"m\"]},"
        "{\"name\":\"e\",\"url\":\"http://example.test:8080/v\",\"models\":[\"m\"]}]}";
    ig_config_t cfg;
    char err[512];
    assert_int_equal(ig_config_load_string(&cfg, json, "t.json", err, sizeof(err)), 0);
    assert_int_equal(cfg.nsites, 5);
    const char *hosts[] = {"localhost", "::1", "nonexistent.invalid", "127.0.0.2", "example.test"};
    const int ports[] = {80, 80, 80, 80, 8080};
    for (size_t i = 0; i < cfg.nsites; i++) {
        assert_string_equal(cfg.sites[i].host, hosts[i]);
        assert_int_equal(cfg.sites[i].port, ports[i]);
    }
    /* Every URL the config accepts starts an upstream client; none blocks
     * or fails for a name that does not resolve. */
    uv_loop_t loop;
    uv_loop_init(&loop);
    for (size_t i = 0; i < cfg.nsites; i++) {
        ig_upstream_t *u = NULL;
        assert_int_equal(ig_upstream_start(&u, &loop, cfg.sites[i].name, cfg.sites[i].url, NULL),
                         0);
        ig_upstream_close(u, NULL, NULL);
    }
    uv_run(&loop, UV_RUN_DEFAULT); /* the dropped lookups finish */
    assert_int_equal(uv_loop_close(&loop), 0);
    ig_config_dispose(&cfg);

    /* What neither accepts. */
    ig_upstream_t *u = NULL;
    uv_loop_init(&loop);
    assert_int_equal(ig_upstream_start(&u, &loop, "x", "http://host:0", NULL), IG_EINVAL);
    assert_int_equal(ig_upstream_start(&u, &loop, "x", "http://host:99999", NULL), IG_EINVAL);
    assert_int_equal(ig_upstream_start(&u, &loop, "x", "http://host:http", NULL), IG_EINVAL);
    assert_int_equal(ig_upstream_start(&u, &loop, "x", "http://[::1", NULL), IG_EINVAL);
    assert_int_equal(ig_upstream_start(&u, &loop, "x", "ftp://host", NULL), IG_EINVAL);
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* ---- the client against real peers -------------------------------------- */

typedef struct {
    int status, ndone, err;
} result_t;

static void on_headers(ig_upstream_req_t *r, int status, int n, const char *const *names,
                       const char *const *values, void *data)
{
    ((result_t *)data)->status = status;
}

static void on_body(ig_upstream_req_t *r, const char *buf, size_t len, void *data) {}

static void on_done(ig_upstream_req_t *r, int err, void *data)
{
    result_t *res = data;
    res->ndone++;
    res->err = err;
}

static const ig_upstream_cbs_t cbs = {on_headers, on_body, on_done};

static result_t get(uv_loop_t *loop, ig_upstream_t *u, const char *path)
{
    result_t res = {0};
    assert_int_equal(ig_upstream_request(u, "GET", path, NULL, NULL, 0, &cbs, &res, NULL), 0);
    /* No callback inside the call, even when the failure is known at once. */
    assert_int_equal(res.ndone, 0);
    long long end = ig_tc_now_ms() + 10000;
    while (res.ndone == 0 && ig_tc_now_ms() < end) {
        uv_run(loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    assert_int_equal(res.ndone, 1);
    return res;
}

static void close_and_run(uv_loop_t *loop, ig_upstream_t *u)
{
    ig_upstream_close(u, NULL, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(loop), 0);
}

/* A peer on 127.0.0.2:80, or -1 when this machine does not allow it (not
 * root, or port 80 taken). */
static int port80_peer(ig_proc_t *p)
{
    const char *args[] = {"--host", "127.0.0.2", "--port", "80", NULL};
    if (ig_peer_start(p, "closedelim_upstream.py", args, 10000) != 0) {
        ig_proc_stop(p, SIGKILL, 2000);
        ig_proc_dispose(p);
        return -1;
    }
    return 0;
}

static void test_client_port_80(void **state)
{
    ig_proc_t peer;
    if (port80_peer(&peer) != 0) {
        print_message("cannot listen on 127.0.0.2:80 here: port-80 case skipped\n");
        skip();
    }
    uv_loop_t loop;
    uv_loop_init(&loop);
    ig_upstream_t *u;
    assert_int_equal(ig_upstream_start(&u, &loop, "p80", "http://127.0.0.2", NULL), 0);
    result_t r = get(&loop, u, "/health");
    assert_int_equal(r.err, 0);
    assert_int_equal(r.status, 200);
    close_and_run(&loop, u);
    ig_proc_stop(&peer, SIGTERM, 5000);
    ig_proc_dispose(&peer);
}

static void test_client_names(void **state)
{
    ig_proc_t peer;
    assert_int_equal(ig_peer_start(&peer, "closedelim_upstream.py", NULL, 10000), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);

    /* localhost resolves on the thread pool; the request waits for it. */
    char url[64];
    snprintf(url, sizeof(url), "http://localhost:%d", peer.port);
    ig_upstream_t *u;
    assert_int_equal(ig_upstream_start(&u, &loop, "local", url, NULL), 0);
    result_t r = get(&loop, u, "/health");
    assert_int_equal(r.err, 0);
    assert_int_equal(r.status, 200);
    assert_true(ig_upstream_resolved(u));
    close_and_run(&loop, u);

    /* A name that does not resolve: IG_ECONNECT (retry-safe), again and
     * again, never a crash or a block. */
    uv_loop_init(&loop);
    assert_int_equal(ig_upstream_start(&u, &loop, "bad", "http://nonexistent.invalid:8080", NULL),
                     0);
    for (int i = 0; i < 3; i++) {
        r = get(&loop, u, "/health");
        assert_int_equal(r.err, IG_ECONNECT);
    }
    assert_false(ig_upstream_resolved(u));
    close_and_run(&loop, u);

    /* Connect failures (the peer gone) are IG_ECONNECT; a peer back on the
     * same port is reached again by name. */
    uv_loop_init(&loop);
    assert_int_equal(ig_upstream_start(&u, &loop, "local", url, NULL), 0);
    assert_int_equal(get(&loop, u, "/health").err, 0);
    int port = peer.port;
    ig_proc_stop(&peer, SIGTERM, 5000);
    ig_proc_dispose(&peer);
    assert_int_equal(get(&loop, u, "/health").err, IG_ECONNECT);
    assert_int_equal(get(&loop, u, "/health").err, IG_ECONNECT);
    char portarg[16];
    snprintf(portarg, sizeof(portarg), "%d", port);
    const char *args[] = {"--port", portarg, NULL};
    assert_int_equal(ig_peer_start(&peer, "closedelim_upstream.py", args, 10000), 0);
    assert_int_equal(get(&loop, u, "/health").err, 0);
    close_and_run(&loop, u);
    ig_proc_stop(&peer, SIGTERM, 5000);
    ig_proc_dispose(&peer);
}

/* ---- infergate serve ------------------------------------------------------ */

static void complete_via(int port, const char *site)
{
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(port, "/v1/completions",
                                 "{\"model\":\"tiny\",\"prompt\":\"hi\",\"max_tokens\":2}", &r,
                                 10000),
                     0);
    assert_int_equal(r.status, 200);
    assert_string_equal(ig_tc_header(&r, "x-infergate-upstream"), site);
    ig_tc_response_free(&r);
}

/* serve starts with a site by name, one whose name does not resolve, and
 * one without a port; it answers through the good ones and marks the bad
 * one down. */
static void test_serve_sites_by_name(void **state)
{
    ig_proc_t peer, p80, g;
    assert_int_equal(ig_peer_start(&peer, "closedelim_upstream.py", NULL, 10000), 0);
    int have80 = port80_peer(&p80) == 0;
    if (!have80)
        print_message("cannot listen on 127.0.0.2:80 here: that site stays down\n");
    int port = ig_proc_free_port();
    assert_int_equal(
        ig_gwf_serve_config(
            &g, port, "info", IG_PROC_PIPE_ERR, 15000, 15000,
            "{\"region\":\"t\",\"listen\":\"127.0.0.1:%d\",\"models\":[{\"name\":\"tiny\"}],"
            "\"sites\":["
            "{\"name\":\"byname\",\"url\":\"http://localhost:%d\",\"models\":[\"tiny\"]},"
            "{\"name\":\"bad\",\"url\":\"http://nonexistent.invalid\",\"models\":[\"tiny\"]},"
            "{\"name\":\"noport\",\"url\":\"http://127.0.0.2\",\"models\":[\"tiny\"]}]}",
            port, peer.port),
        0);
    assert_int_equal(ig_proc_wait_log(&g, "cannot resolve nonexistent.invalid", 5000), 0);

    /* Let every site be probed a few times. */
    int up[3] = {0};
    long long end = ig_tc_now_ms() + 8000;
    while (ig_tc_now_ms() < end) {
        ig_gwf_sites_up(port, up, 3);
        if (up[0] && up[2] == have80)
            break;
        usleep(100 * 1000);
    }
    assert_true(up[0]);
    assert_false(up[1]);
    assert_int_equal(up[2], have80);

    ig_tc_response_t r;
    assert_int_equal(ig_gwf_get(port, "/health", &r), 0);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);
    /* Routing skips the down site: every request is answered. */
    for (int i = 0; i < 6; i++) {
        assert_int_equal(ig_gwf_post(port, "/v1/completions",
                                     "{\"model\":\"tiny\",\"prompt\":\"hi\",\"max_tokens\":2}", &r,
                                     10000),
                         0);
        assert_int_equal(r.status, 200);
        const char *via = ig_tc_header(&r, "x-infergate-upstream");
        assert_non_null(via);
        assert_true(strcmp(via, "byname") == 0 || (have80 && strcmp(via, "noport") == 0));
        ig_tc_response_free(&r);
    }
    usleep(1500 * 1000);
    ig_gwf_sites_up(port, up, 3);
    assert_false(up[1]); /* still down after more probes, serve still up */
    assert_true(up[0]);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_dispose(&g);
    if (have80) {
        ig_proc_stop(&p80, SIGTERM, 5000);
        ig_proc_dispose(&p80);
    }
    ig_proc_stop(&peer, SIGTERM, 5000);
    ig_proc_dispose(&peer);
}

/* A site by name that flaps (its listener closed and reopened on the same
 * port) goes down and comes back up through connect failures and fresh
 * lookups. Timing: seconds-long flaps, generous bounds. */
static void test_serve_site_flaps(void **state)
{
    ig_proc_t peer, g;
    const char *args[] = {"--flap-s", "2.5", NULL};
    assert_int_equal(ig_peer_start(&peer, "closedelim_upstream.py", args, 10000), 0);
    int port = ig_proc_free_port();
    assert_int_equal(
        ig_gwf_serve_config(
            &g, port, "warn", 0, 15000, 15000,
            "{\"region\":\"t\",\"listen\":\"127.0.0.1:%d\",\"models\":[{\"name\":\"tiny\"}],"
            "\"sites\":[{\"name\":\"flappy\",\"url\":\"http://localhost:%d\","
            "\"models\":[\"tiny\"]}]}",
            port, peer.port),
        0);
    complete_via(port, "flappy");
    int seen_down = 0, back_up = 0;
    long long end = ig_tc_now_ms() + 15000;
    while (!back_up && ig_tc_now_ms() < end) {
        int up;
        ig_gwf_sites_up(port, &up, 1);
        if (!up)
            seen_down = 1;
        else if (seen_down)
            back_up = 1;
        usleep(100 * 1000);
    }
    assert_true(seen_down);
    assert_true(back_up);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_stop(&peer, SIGTERM, 5000);
    ig_proc_dispose(&peer);
}

int main(void)
{
    /* The libuv clients in this process write to peers that may have
     * closed: that must cost an EPIPE, not the test (as serve.c does). */
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_url_without_port),
        cmocka_unit_test(test_client_port_80),
        cmocka_unit_test(test_client_names),
        cmocka_unit_test(test_serve_sites_by_name),
        cmocka_unit_test(test_serve_site_flaps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
