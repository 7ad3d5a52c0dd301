/*
 * Upstreams whose answers are close-delimited (no Content-Length, not
 * chunked: the close ends the body, RFC 9112 section 6.3), from
 * tests/peers/closedelim_upstream.py on python3's http.server, over real
 * sockets: HTTP/1.0, HTTP/1.1 with Connection: close, and HTTP/1.1 without
 * it.
 *
 * First the upstream client in this process: every answer is delivered
 * whole, on_done fires exactly once, and the connection is not reused.
 * Then cancel and close from inside the request's own callbacks (nothing
 * may be freed under the parser). Then `infergate serve` with such a peer
 * as a site: it is probed up (/load 404, /health, /v1/models) and keeps
 * being probed, and completions through it, plain and streamed, are
 * answered. Under ASan a use-after-free in either process fails the test.
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
#include <strings.h>
#include <unistd.h>
#include <uv.h>

#include "gwfixture.h"
#include "infergate/error.h"
#include "infergate/upstream.h"
#include "peers.h"

typedef enum { PEER_10, PEER_11, PEER_11_BARE } peer_kind_t;

static void peer_start(ig_proc_t *p, peer_kind_t kind)
{
    const char *v10[] = {"--http", "1.0", NULL};
    const char *v11[] = {"--http", "1.1", NULL};
    const char *bare[] = {"--http", "1.1", "--bare", NULL};
    const char *const *args = kind == PEER_10 ? v10 : kind == PEER_11 ? v11 : bare;
    assert_int_equal(ig_peer_start(p, "closedelim_upstream.py", args, 15000), 0);
}

static void peer_stop(ig_proc_t *p)
{
    ig_proc_stop(p, SIGTERM, 5000);
    ig_proc_dispose(p);
}

/* ---- the upstream client in this process -------------------------------- */

typedef struct {
    int status;
    int ndone;
    int err;
    int nbody; /* body pieces */
    char body[8192];
    size_t len;
    int cancel_in_body;   /* ig_upstream_cancel in the first piece */
    int close_in_headers; /* ig_upstream_close from on_headers */
    ig_upstream_t *up;    /* for close_in_headers */
    int closed;           /* the upstream's close callback ran */
} result_t;

static void on_headers(ig_upstream_req_t *r, int status, int n, const char *const *names,
                       const char *const *values, void *data)
{
    result_t *res = data;
    res->status = status;
    for (int i = 0; i < n; i++) {
        /* What makes the body close-delimited: no length, no chunking. */
        assert_true(strcasecmp(names[i], "content-length") != 0);
        assert_true(strcasecmp(names[i], "transfer-encoding") != 0);
    }
    if (res->close_in_headers)
        ig_upstream_close(res->up, NULL, NULL);
}

static void on_body(ig_upstream_req_t *r, const char *buf, size_t len, void *data)
{
    result_t *res = data;
    if (res->len + len < sizeof(res->body)) {
        memcpy(res->body + res->len, buf, len);
        res->len += len;
        res->body[res->len] = '\0';
    }
    if (res->cancel_in_body && res->nbody == 0)
        ig_upstream_cancel(r);
    res->nbody++;
}

static void on_done(ig_upstream_req_t *r, int err, void *data)
{
    result_t *res = data;
    res->ndone++;
    res->err = err;
}

static const ig_upstream_cbs_t cbs = {on_headers, on_body, on_done};

/* Runs the loop until *flag is set or ms pass. */
static void run_until(uv_loop_t *loop, const int *flag, int ms)
{
    long long end = ig_tc_now_ms() + ms;
    while (!*flag && ig_tc_now_ms() < end) {
        uv_run(loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
}

/* Runs the loop a little longer: a second on_done, or a late byte on a
 * connection that should be closed, would show in this time. */
static void run_for(uv_loop_t *loop, int ms)
{
    int never = 0;
    run_until(loop, &never, ms);
}

static void on_up_closed(void *data)
{
    ((result_t *)data)->closed = 1;
}

static void close_upstream(uv_loop_t *loop, ig_upstream_t *u)
{
    result_t res = {0};
    ig_upstream_close(u, on_up_closed, &res);
    run_until(loop, &res.closed, 5000);
    assert_true(res.closed);
}

/* An upstream client on loop (initialised here) for the peer at port. */
static ig_upstream_t *client_start(uv_loop_t *loop, int port)
{
    uv_loop_init(loop);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    ig_upstream_t *u;
    assert_int_equal(ig_upstream_start(&u, loop, "cd", url, NULL), 0);
    return u;
}

/* Sends one request with res as its callbacks' data, runs the loop until
 * *until is set (10 s at most) and then settle_ms more. */
static void send_and_run(uv_loop_t *loop, ig_upstream_t *u, const char *method, const char *path,
                         const char *headers, const char *body, result_t *res, const int *until,
                         int settle_ms)
{
    assert_int_equal(ig_upstream_request(u, method, path, headers, body, body ? strlen(body) : 0,
                                         &cbs, res, NULL),
                     0);
    run_until(loop, until, 10000);
    run_for(loop, settle_ms);
}

static const char stream_body[] =
    "{\"model\":\"tiny\",\"prompt\":\"hi\",\"max_tokens\":4,\"stream\":true}";

static void client_round(peer_kind_t kind)
{
    ig_proc_t peer;
    peer_start(&peer, kind);
    uv_loop_t loop;
    ig_upstream_t *u = client_start(&loop, peer.port);

    /* The probes' requests, twice each: the second must not reuse the
     * connection the first one's close ended. */
    const char *paths[] = {"/health", "/v1/models", "/health", "/v1/models"};
    for (int i = 0; i < 4; i++) {
        result_t res = {0};
        send_and_run(&loop, u, "GET", paths[i], NULL, NULL, &res, &res.ndone, 50);
        assert_int_equal(res.ndone, 1);
        assert_int_equal(res.err, 0);
        assert_int_equal(res.status, 200);
        json_t *doc = json_loads(res.body, 0, NULL);
        assert_non_null(doc); /* the whole body, up to the close */
        if (i % 2 == 0)
            assert_string_equal(json_string_value(json_object_get(doc, "status")), "ok");
        else
            assert_string_equal(json_string_value(json_object_get(
                                    json_array_get(json_object_get(doc, "data"), 0), "id")),
                                "tiny");
        json_decref(doc);
        assert_int_equal(ig_upstream_open_connections(u), 0);
    }

    /* A close-delimited SSE stream: every event, then the end once. */
    result_t res = {0};
    send_and_run(&loop, u, "POST", "/v1/completions", "Content-Type: application/json\r\n",
                 stream_body, &res, &res.ndone, 50);
    assert_int_equal(res.ndone, 1);
    assert_int_equal(res.err, 0);
    assert_int_equal(res.status, 200);
    assert_non_null(strstr(res.body, "tok0 "));
    assert_non_null(strstr(res.body, "tok3 "));
    const char *done = strstr(res.body, "data: [DONE]\n\n");
    assert_non_null(done);
    assert_string_equal(done, "data: [DONE]\n\n"); /* nothing lost at the end */
    assert_true(res.nbody >= 2);                   /* delivered as it came */
    assert_int_equal(ig_upstream_open_connections(u), 0);

    close_upstream(&loop, u);
    assert_int_equal(uv_loop_close(&loop), 0);
    peer_stop(&peer);
}

static void test_client_http10(void **state)
{
    client_round(PEER_10);
}

static void test_client_http11_close(void **state)
{
    client_round(PEER_11);
}

static void test_client_http11_bare(void **state)
{
    client_round(PEER_11_BARE);
}

/* Ending a request from inside its own callbacks, while the parser runs. */
static void test_client_end_inside_callbacks(void **state)
{
    ig_proc_t peer;
    peer_start(&peer, PEER_11);
    uv_loop_t loop;
    ig_upstream_t *u = client_start(&loop, peer.port);

    /* Cancel in the first body piece: no callback after it, no leak. */
    result_t res = {0};
    res.cancel_in_body = 1;
    send_and_run(&loop, u, "POST", "/v1/completions", NULL, stream_body, &res, &res.nbody, 300);
    assert_int_equal(res.nbody, 1);
    assert_int_equal(res.ndone, 0);
    assert_int_equal(ig_upstream_open_connections(u), 0);

    /* The upstream closed from on_headers: on_done once, with IG_ECANCELED,
     * and the upstream is freed only after that. */
    result_t res2 = {0};
    res2.close_in_headers = 1;
    res2.up = u;
    send_and_run(&loop, u, "GET", "/health", NULL, NULL, &res2, &res2.ndone, 100);
    assert_int_equal(res2.ndone, 1);
    assert_int_equal(res2.err, IG_ECANCELED);
    assert_int_equal(res2.nbody, 0);
    assert_int_equal(uv_loop_close(&loop), 0); /* everything of u is gone */
    peer_stop(&peer);
}

/* ---- through infergate serve --------------------------------------------- */

static void serve_with_site(ig_proc_t *g, int peer_port)
{
    int port = ig_proc_free_port();
    /* Ready means the site's probes came through. */
    assert_int_equal(
        ig_gwf_serve_config(
            g, port, "warn", IG_PROC_PIPE_ERR, 15000, 15000,
            "{\"region\":\"t\",\"listen\":\"127.0.0.1:%d\",\"models\":[{\"name\":\"tiny\"}],"
            "\"sites\":[{\"name\":\"cd\",\"url\":\"http://127.0.0.1:%d\","
            "\"models\":[\"tiny\"]}]}",
            port, peer_port),
        0);
}

static void serve_round(peer_kind_t kind)
{
    ig_proc_t peer, g;
    peer_start(&peer, kind);
    serve_with_site(&g, peer.port);
    assert_int_equal(ig_gwf_sites_up(g.port, NULL, 0), 1);

    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(g.port, "/v1/completions",
                                 "{\"model\":\"tiny\",\"prompt\":\"hi\",\"max_tokens\":3}", &r,
                                 10000),
                     0);
    assert_int_equal(r.status, 200);
    json_t *doc = json_loads(r.body, 0, NULL);
    assert_non_null(doc);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(doc, "choices"), 0), "text")),
                        "tok0 tok1 tok2 ");
    json_decref(doc);
    assert_string_equal(ig_tc_header(&r, "x-infergate-upstream"), "cd");
    ig_tc_response_free(&r);

    /* Streamed, plain and chat: every token, then the end. */
    static const char *const streamed[][2] = {
        {"/v1/completions",
         "{\"model\":\"tiny\",\"prompt\":\"hi\",\"max_tokens\":3,\"stream\":true}"},
        {"/v1/chat/completions", "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\","
                                 "\"content\":\"hi\"}],\"max_tokens\":3,\"stream\":true}"},
    };
    for (size_t i = 0; i < sizeof(streamed) / sizeof(streamed[0]); i++) {
        assert_int_equal(ig_gwf_post(g.port, streamed[i][0], streamed[i][1], &r, 10000), 0);
        assert_int_equal(r.status, 200);
        assert_non_null(strstr(r.body, "tok2 "));
        assert_non_null(strstr(r.body, "data: [DONE]"));
        ig_tc_response_free(&r);
    }

    /* Probes go on every second; the site stays up and the gateway alive. */
    usleep(2500 * 1000);
    assert_int_equal(ig_gwf_sites_up(g.port, NULL, 0), 1);
    ig_proc_pump(&g, 0);
    assert_null(strstr(g.err ? g.err : "", "AddressSanitizer"));
    assert_null(strstr(g.err ? g.err : "", "down after"));
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    assert_null(strstr(g.err ? g.err : "", "runtime error"));
    ig_proc_dispose(&g);
    peer_stop(&peer);
}

static void test_serve_site_http10(void **state)
{
    serve_round(PEER_10);
}

static void test_serve_site_http11(void **state)
{
    serve_round(PEER_11);
}

int main(void)
{
    /* The libuv clients in this process write to peers that may have
     * closed: that must cost an EPIPE, not the test (as serve.c does). */
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_http10),
        cmocka_unit_test(test_client_http11_close),
        cmocka_unit_test(test_client_http11_bare),
        cmocka_unit_test(test_client_end_inside_callbacks),
        cmocka_unit_test(test_serve_site_http10),
        cmocka_unit_test(test_serve_site_http11),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
