/*
 * A client that pipelines requests and never reads its answers must not
 * grow the server: the next pipelined request is dispatched only while the
 * connection's unsent output is within write_buffer_bytes (then reading
 * stops at max_pipeline parsed requests). Checked in-process (the queued
 * bytes and the dispatch count stay bounded, and every answer still comes,
 * in order, once the client reads) and against the real `infergate serve`
 * process with `GET /metrics` at full send rate for 15 s (RSS growth at most
 * 64 MiB; before the fix it grew by gigabytes).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../gateway/http/http_internal.h"
#include "gwfixture.h"
#include "proc.h"
#include "testclient.h"
#include "testserver.h"

#define TMO 10000
#define MARK (64 * 1024)
/* The kernel holds up to ~4 MiB of a loopback connection's output (the
 * sender's tcp_wmem maximum): the answers must add up to well past that. */
#define ANSWER (256 * 1024)
#define NREQ 40

/* ---- in-process: bounded dispatch ------------------------------------- */

static atomic_int dispatched;

static void big_handler(ig_http_req_t *req, void *data)
{
    static char body[ANSWER];
    int n = atomic_fetch_add(&dispatched, 1);
    memset(body, 'a' + n % 26, sizeof(body));
    ig_http_respond(req, 200, "text/plain", body, sizeof(body));
}

/* A loopback client whose receive window is tiny, so that the server's
 * answers pile up on the server's side. */
static int connect_small_window(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    int rcv = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void test_dispatch_waits_for_the_write_mark(void **state)
{
    ig_http_limits_t l;
    ig_http_limits_default(&l);
    l.write_buffer_bytes = MARK;
    l.max_pipeline = NREQ + 4; /* reading is not what bounds it here */
    atomic_store(&dispatched, 0);
    size_t before = ig__http_budget_used();
    ig_ts_t *ts = ig_ts_start("127.0.0.1:0", &l, big_handler, NULL);
    assert_non_null(ts);
    int fd = connect_small_window(ig_ts_port(ts));
    assert_true(fd >= 0);
    static char reqs[NREQ * 64];
    size_t len = 0;
    for (int i = 0; i < NREQ; i++)
        len += (size_t)snprintf(reqs + len, sizeof(reqs) - len,
                                "GET /%d HTTP/1.1\r\nHost: t\r\n\r\n", i);
    assert_int_equal(send(fd, reqs, len, 0), (ssize_t)len);
    /* Let the server do what it would: the kernel takes a few answers, then
     * the queue passes the mark and dispatch must stop. */
    usleep(500 * 1000);
    int n = atomic_load(&dispatched);
    size_t held = ig__http_budget_used() - before;
    fprintf(stderr, "dispatched %d of %d, %zu bytes held\n", n, NREQ, held);
    /* Without the wait all 40 (10 MiB) are queued at once; with it, what
     * the kernel took (about 4 MiB) plus one. */
    assert_true(n < NREQ * 3 / 4);
    /* unsent output: at most the mark plus one answer (and the read buffer
     * and a few socket-buffer rounding bytes) */
    assert_true(held <= MARK + ANSWER + 256 * 1024);

    /* Reading resumes everything, in order and intact. */
    size_t want = 0;
    char *all = NULL;
    size_t have = 0, cap = 0;
    /* through a 4 KiB window: slow under ASan */
    long long deadline = ig_tc_now_ms() + 6 * TMO;
    int got = 0;
    while (got < NREQ && ig_tc_now_ms() < deadline) {
        if (cap - have < 65536) {
            cap = cap ? cap * 2 : 1 << 20;
            all = realloc(all, cap);
            assert_non_null(all);
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t r = recv(fd, all + have, cap - have, 0);
        assert_true(r > 0);
        have += (size_t)r;
        /* count complete answers: each ends with its body */
        got = 0;
        want = 0;
        for (;;) {
            char *hdr_end = memmem(all + want, have - want, "\r\n\r\n", 4);
            if (hdr_end == NULL || (size_t)(hdr_end + 4 - all) + ANSWER > have)
                break;
            char expect = (char)('a' + got % 26);
            assert_int_equal(hdr_end[4], expect);
            assert_int_equal(hdr_end[4 + ANSWER - 1], expect);
            want = (size_t)(hdr_end + 4 - all) + ANSWER;
            got++;
        }
    }
    assert_int_equal(got, NREQ);
    assert_int_equal(atomic_load(&dispatched), NREQ);
    free(all);
    close(fd);
    ig_ts_stop(ts);
}

/* ---- the real process: RSS under a pipelining client that never reads -- */

static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *fp = fopen(path, "r");
    if (fp == NULL)
        return -1;
    long kib = -1;
    while (fgets(line, sizeof(line), fp) != NULL)
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(fp);
    return kib;
}

#define FLOOD_MS 15000
#define MAX_GROWTH_KIB (64 * 1024)

static void test_serve_metrics_flood_rss(void **state)
{
    /* Log level warn: no access line per request, which would otherwise
     * pace the server through the stderr pipe. */
    ig_proc_t p;
    assert_int_equal(ig_gwf_serve_empty(&p, "warn"), 0);
    /* warm-up: the metrics text and the allocator's first arenas */
    for (int i = 0; i < 20; i++) {
        ig_tc_response_t r;
        assert_int_equal(
            ig_tc_request(p.port, "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
                          &r, 5000),
            0);
        assert_int_equal(r.status, 200);
        ig_tc_response_free(&r);
    }
    long base = rss_kib(p.pid);
    assert_true(base > 0);

    int fd = connect_small_window(p.port);
    assert_true(fd >= 0);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    static char pipeline[64 * 1024];
    static const char one[] = "GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n";
    size_t plen = 0;
    while (plen + sizeof(one) <= sizeof(pipeline)) {
        memcpy(pipeline + plen, one, sizeof(one) - 1);
        plen += sizeof(one) - 1;
    }
    size_t off = 0;
    unsigned long long sent = 0;
    long peak = base;
    long long start = ig_tc_now_ms(), next_sample = start;
    while (ig_tc_now_ms() - start < FLOOD_MS) {
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        if (poll(&pf, 1, 20) > 0 && (pf.revents & POLLOUT)) {
            ssize_t n = send(fd, pipeline + off, plen - off, MSG_NOSIGNAL);
            if (n > 0) {
                sent += (unsigned long long)n;
                off = (off + (size_t)n) % plen;
            } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
                fail_msg("send: %s", strerror(errno));
            }
        }
        if (ig_tc_now_ms() >= next_sample) {
            long now = rss_kib(p.pid);
            assert_true(now > 0); /* the server is alive */
            if (now > peak)
                peak = now;
            next_sample += 250;
            ig_proc_pump(&p, 0);
        }
    }
    fprintf(stderr,
            "sent %llu bytes of pipelined GET /metrics in %d s; server RSS %ld -> peak %ld KiB\n",
            sent, FLOOD_MS / 1000, base, peak);
    /* The server must still serve others while that client sits there. */
    ig_tc_response_t r;
    assert_int_equal(ig_tc_request(p.port,
                                   "GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
                                   &r, 5000),
                     0);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);
    assert_true(sent > 0);
    if (peak - base > MAX_GROWTH_KIB)
        fail_msg("RSS grew by %ld KiB (limit %d KiB)", peak - base, MAX_GROWTH_KIB);
    close(fd);
    kill(p.pid, SIGTERM);
    int rc = ig_proc_wait_exit(&p, 10000);
    if (rc != 0)
        fprintf(stderr, "serve exited %d:\n%s\n", rc, p.err);
    assert_int_equal(rc, 0);
    ig_proc_dispose(&p);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dispatch_waits_for_the_write_mark),
        cmocka_unit_test(test_serve_metrics_flood_rss),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
