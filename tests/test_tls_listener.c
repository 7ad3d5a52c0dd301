/* The listener's TLS, with curl and openssl s_client as clients and
 * certificates made by openssl in the test: keep-alive and SSE over TLS,
 * TLS 1.2 as the floor and no weak TLS 1.2 cipher, a big body both ways,
 * the handshake deadline, plaintext on the TLS port, and `infergate serve`
 * reloading its certificate on SIGHUP without dropping a connection. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>

#include "files.h"
#include "gwfixture.h"
#include "infergate/tls.h"
#include "proc.h"
#include "testclient.h"
#include "testserver.h"
#include "tlscerts.h"

#define SAN "DNS:localhost,IP:127.0.0.1"

static char dir[256];
static ig_ts_t *server;
static char cmd[4096];

/* ---- the in-process server --------------------------------------------- */

typedef struct {
    ig_http_req_t *req;
    int sent;
} sse_t;

static void on_sse_tick(uv_timer_t *t)
{
    sse_t *s = t->data;
    char ev[64];
    int n = snprintf(ev, sizeof(ev), "data: %d\n\n", s->sent++);
    ig_http_stream_write(s->req, ev, (size_t)n);
    if (s->sent == 3) {
        ig_http_stream_end(s->req);
        ig_ts_timer_close(t);
        free(s);
    }
}

static void handler(ig_http_req_t *req, void *data)
{
    if (strcmp(ig_http_req_path(req), "/sse") == 0) {
        sse_t *s = calloc(1, sizeof(*s));
        s->req = req;
        ig_http_stream_start(req, 200, "text/event-stream");
        ig_ts_timer_start(on_sse_tick, s, 30, 30);
        return;
    }
    ig_ts_echo_handler(req, data);
}

static uint64_t handshake_ms;

static void set_tls(ig_ts_t *ts, void *arg)
{
    ig_http_server_set_tls(ig_ts_server(ts), arg, handshake_ms);
}

static int group_setup(void **state)
{
    if (ig_tf_mkdtemp(dir, sizeof(dir)) != 0 || ig_tlsc_make(dir, "a", SAN, 2) != 0 ||
        ig_tlsc_make(dir, "b", SAN, 2) != 0)
        return -1;
    char cert[512], key[512], err[512];
    snprintf(cert, sizeof(cert), "%s/a.pem", dir);
    snprintf(key, sizeof(key), "%s/a.key", dir);
    ig_tls_ctx_t *ctx;
    if (ig_tls_server_ctx_new(&ctx, cert, key, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    server = ig_ts_start("127.0.0.1:0", NULL, handler, NULL);
    if (server == NULL)
        return -1;
    handshake_ms = 400;
    ig_ts_call(server, set_tls, ctx);
    ig_tls_ctx_unref(ctx);
    return 0;
}

static int group_teardown(void **state)
{
    if (server != NULL)
        ig_ts_stop(server);
    ig_tf_rmtree(dir);
    return 0;
}

/* ---- curl and s_client ------------------------------------------------- */

static void test_curl_keepalive(void **state)
{
    char *out = NULL;
    snprintf(cmd, sizeof(cmd),
             "curl -sS -v --cacert %s/a-ca.pem https://localhost:%d/one https://localhost:%d/two",
             dir, ig_ts_port(server), ig_ts_port(server));
    int rc = ig_tlsc_sh(cmd, &out, 20);
    if (rc != 0 || strstr(out, "Re-using existing connection") == NULL)
        fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "GET /one 0"));
    assert_non_null(strstr(out, "GET /two 0"));
    /* one connection, one handshake, two requests */
    assert_non_null(strstr(out, "Re-using existing connection"));
    free(out);
}

static void test_curl_wrong_ca(void **state)
{
    char *out = NULL;
    snprintf(cmd, sizeof(cmd), "curl -sS --cacert %s/b-ca.pem https://localhost:%d/x", dir,
             ig_ts_port(server));
    assert_int_equal(ig_tlsc_sh(cmd, &out, 20), 60); /* peer certificate cannot be authenticated */
    free(out);
}

static void test_sse(void **state)
{
    char *out = NULL;
    snprintf(cmd, sizeof(cmd), "curl -sS -N --cacert %s/a-ca.pem https://localhost:%d/sse", dir,
             ig_ts_port(server));
    assert_int_equal(ig_tlsc_sh(cmd, &out, 20), 0);
    assert_non_null(strstr(out, "data: 0\n\ndata: 1\n\ndata: 2\n\n"));
    free(out);
}

static int s_client(const char *flags, char **out)
{
    snprintf(cmd, sizeof(cmd),
             "printf 'GET /s HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n' | "
             "openssl s_client -connect 127.0.0.1:%d -servername localhost -CAfile %s/a-ca.pem "
             "-verify_return_error -quiet %s",
             ig_ts_port(server), dir, flags);
    return ig_tlsc_sh(cmd, out, 20);
}

static void test_s_client_versions(void **state)
{
    char *out = NULL;
    assert_int_equal(s_client("-tls1_3", &out), 0);
    assert_non_null(strstr(out, "HTTP/1.1 200 OK"));
    free(out);
    assert_int_equal(s_client("-tls1_2", &out), 0);
    assert_non_null(strstr(out, "HTTP/1.1 200 OK"));
    free(out);
    /* TLS 1.1 and 1.0 are refused */
    assert_int_not_equal(s_client("-tls1_1 -cipher DEFAULT@SECLEVEL=0", &out), 0);
    assert_null(strstr(out, "HTTP/1.1"));
    free(out);
    assert_int_not_equal(s_client("-tls1 -cipher DEFAULT@SECLEVEL=0", &out), 0);
    assert_null(strstr(out, "HTTP/1.1"));
    free(out);
    /* TLS 1.2 without forward secrecy or AEAD is refused */
    assert_int_not_equal(s_client("-tls1_2 -cipher AES128-SHA", &out), 0);
    assert_null(strstr(out, "HTTP/1.1"));
    free(out);
    assert_int_not_equal(
        s_client("-tls1_2 -cipher ECDHE-RSA-AES128-SHA:ECDHE-ECDSA-AES128-SHA", &out), 0);
    assert_null(strstr(out, "HTTP/1.1"));
    free(out);
}

static void test_big_body(void **state)
{
    /* 3 MiB up and back: more than one read buffer and many records */
    char path[512], *out = NULL;
    snprintf(path, sizeof(path), "%s/body.bin", dir);
    size_t n = 3u << 20;
    char *body = malloc(n);
    for (size_t i = 0; i < n; i++)
        body[i] = (char)('a' + i % 26);
    assert_int_equal(ig_tf_write(path, body, n), 0);
    snprintf(cmd, sizeof(cmd),
             "curl -sS --cacert %s/a-ca.pem --data-binary @%s https://localhost:%d/big | "
             "tail -c %zu | cmp - %s && echo SAME",
             dir, path, ig_ts_port(server), n, path);
    int rc = ig_tlsc_sh(cmd, &out, 30);
    if (rc != 0)
        fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "SAME"));
    free(out);
    free(body);
}

/* 1 when the server closed fd within ms; what it sent goes to buf. */
static int closed_within(int fd, int ms, char *buf, size_t cap, size_t *got)
{
    long long end = ig_tc_now_ms() + ms;
    *got = 0;
    while (ig_tc_now_ms() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0)
            continue;
        ssize_t r = recv(fd, buf + *got, cap - *got - 1, 0);
        if (r <= 0)
            return 1;
        *got += (size_t)r;
        if (*got + 1 >= cap)
            *got = 0;
    }
    return 0;
}

static void test_handshake_timeout(void **state)
{
    char buf[4096];
    size_t got;
    int fd = ig_proc_connect(ig_ts_port(server));
    assert_true(fd >= 0);
    long long t0 = ig_tc_now_ms();
    /* nothing sent: closed after the 400 ms handshake deadline */
    assert_true(closed_within(fd, 5000, buf, sizeof(buf), &got));
    long long took = ig_tc_now_ms() - t0;
    assert_true(took >= 300);
    assert_true(took < 4000);
    close(fd);
}

static void test_plaintext_refused(void **state)
{
    char buf[4096];
    size_t got;
    int fd = ig_proc_connect(ig_ts_port(server));
    assert_true(fd >= 0);
    const char req[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(send(fd, req, sizeof(req) - 1, 0), (ssize_t)sizeof(req) - 1);
    assert_true(closed_within(fd, 5000, buf, sizeof(buf), &got));
    buf[got] = '\0';
    /* no plaintext HTTP answer, at most a TLS alert */
    assert_true(got == 0 || (unsigned char)buf[0] == 0x15);
    assert_null(strstr(buf, "HTTP/1."));
    close(fd);
}

/* ---- infergate serve: SIGHUP reload ------------------------------------ */

/* A blocking TLS client connection of the test's own, kept across the
 * reload. */
typedef struct {
    SSL_CTX *ctx;
    SSL *ssl;
    int fd;
} client_t;

static int client_open(client_t *c, int port, const char *ca)
{
    c->ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_load_verify_locations(c->ctx, ca, NULL);
    SSL_CTX_set_verify(c->ctx, SSL_VERIFY_PEER, NULL);
    c->fd = ig_proc_connect(port);
    c->ssl = SSL_new(c->ctx);
    SSL_set_fd(c->ssl, c->fd);
    SSL_set_tlsext_host_name(c->ssl, "localhost");
    SSL_set1_host(c->ssl, "localhost");
    return c->fd >= 0 && SSL_connect(c->ssl) == 1 ? 0 : -1;
}

static void client_close(client_t *c)
{
    SSL_free(c->ssl);
    SSL_CTX_free(c->ctx);
    close(c->fd);
}

/* GET /health on the open connection: 1 when {"status":"ok"} came back. */
static int client_health(client_t *c)
{
    const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    if (SSL_write(c->ssl, req, sizeof(req) - 1) != (int)sizeof(req) - 1)
        return 0;
    char buf[4096];
    size_t len = 0;
    while (len + 1 < sizeof(buf)) {
        int r = SSL_read(c->ssl, buf + len, (int)(sizeof(buf) - 1 - len));
        if (r <= 0)
            return 0;
        len += (size_t)r;
        buf[len] = '\0';
        if (strstr(buf, "{\"status\":\"ok\"}") != NULL)
            return strncmp(buf, "HTTP/1.1 200", 12) == 0;
    }
    return 0;
}

static int curl_health(int port, const char *ca)
{
    snprintf(cmd, sizeof(cmd), "curl -sS --cacert %s/%s https://localhost:%d/health", dir, ca,
             port);
    return ig_tlsc_sh(cmd, NULL, 20);
}

static void copy(const char *from, const char *to)
{
    char a[512], b[512];
    snprintf(a, sizeof(a), "%s/%s", dir, from);
    snprintf(b, sizeof(b), "%s/%s", dir, to);
    size_t n;
    char *data = ig_tf_read(a, &n);
    assert_non_null(data);
    assert_int_equal(ig_tf_write(b, data, n), 0);
    free(data);
}

static void test_serve_sighup_reload(void **state)
{
    ig_ts_site_t site;
    ig_ts_t *up = ig_ts_site_start(&site, 0);
    assert_non_null(up);
    copy("a.pem", "live.pem");
    copy("a.key", "live.key");
    int port = ig_proc_free_port();
    char extra[1024];
    snprintf(extra, sizeof(extra),
             "{\"listen\":\"127.0.0.1:%d\",\"models\":[{\"name\":\"tiny\"}],"
             "\"sites\":[{\"name\":\"up\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"tiny\"]}],"
             "\"limits\":{\"drain_grace_ms\":0},"
             "\"tls\":{\"cert_file\":\"%s/live.pem\",\"key_file\":\"%s/live.key\"}}",
             port, ig_ts_port(up), dir, dir);
    const char *conf = ig_proc_temp_file(extra, ".json");
    ig_proc_t gw;
    assert_int_equal(ig_gwf_serve(&gw, conf, port, "info", IG_PROC_PIPE_ERR, 10000, 0), 0);
    assert_int_equal(ig_proc_wait_log(&gw, "listening on https://", 5000), 0);

    client_t c;
    char ca[512];
    snprintf(ca, sizeof(ca), "%s/a-ca.pem", dir);
    assert_int_equal(client_open(&c, port, ca), 0);
    assert_true(client_health(&c));
    assert_int_equal(curl_health(port, "a-ca.pem"), 0);

    /* a broken file: the reload fails, the old certificate stays */
    char broken[512];
    snprintf(broken, sizeof(broken), "%s/live.pem", dir);
    assert_int_equal(ig_tf_write(broken, "not a certificate\n", 18), 0);
    kill(gw.pid, SIGHUP);
    assert_int_equal(ig_proc_wait_log(&gw, "certificate not reloaded", 5000), 0);
    assert_int_equal(curl_health(port, "a-ca.pem"), 0);

    /* certificate b: new connections get it, the open one goes on */
    copy("b.pem", "live.pem");
    copy("b.key", "live.key");
    kill(gw.pid, SIGHUP);
    assert_int_equal(ig_proc_wait_log(&gw, "reload (SIGHUP): reloaded", 5000), 0);
    assert_int_equal(curl_health(port, "b-ca.pem"), 0);
    assert_int_equal(curl_health(port, "a-ca.pem"), 60);
    assert_true(client_health(&c));
    client_close(&c);

    assert_int_equal(ig_proc_stop(&gw, SIGTERM, 10000), 0);
    ig_proc_dispose(&gw);
    ig_ts_stop(up);
}

/* A certificate that does not load is a config error: exit 2, no port. */
static void test_serve_bad_cert(void **state)
{
    char extra[1024];
    snprintf(extra, sizeof(extra),
             "{\"listen\":\"127.0.0.1:0\",\"tls\":{\"cert_file\":\"%s/a.pem\","
             "\"key_file\":\"%s/b.key\"}}",
             dir, dir);
    const char *conf = ig_proc_temp_file(extra, ".json");
    const char *args[] = {"serve", "--config", conf, NULL};
    ig_proc_t p;
    assert_int_equal(ig_proc_start_bin(&p, "infergate", args, IG_PROC_PIPE_ERR), 0);
    assert_int_equal(ig_proc_wait_exit(&p, 10000), 2);
    if (strstr(p.err, "tls.key_file") == NULL)
        fprintf(stderr, "%s\n", p.err);
    assert_non_null(strstr(p.err, "tls.key_file"));
    ig_proc_dispose(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_curl_keepalive),
        cmocka_unit_test(test_curl_wrong_ca),
        cmocka_unit_test(test_sse),
        cmocka_unit_test(test_s_client_versions),
        cmocka_unit_test(test_big_body),
        cmocka_unit_test(test_handshake_timeout),
        cmocka_unit_test(test_plaintext_refused),
        cmocka_unit_test(test_serve_sighup_reload),
        cmocka_unit_test(test_serve_bad_cert),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
