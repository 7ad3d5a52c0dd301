/*
 * testupstream --slots: at most N requests are served at once, the others
 * wait in arrival order, and a request's delay starts when it gets a slot.
 * A real testupstream process on loopback; requests over raw sockets so that
 * the send times are known exactly.
 */
#include "benchtools.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

/* The shared machine now and then stops a process for a few milliseconds,
 * which only ever adds latency: a lower bound must hold on every attempt,
 * an upper bound on one of ATTEMPTS. */
#define ATTEMPTS 3

/* The last statement of an attempt loop: leaves it when ok, else fails the
 * test on the last attempt. */
#define RETRY_UNLESS(attempt, ok)                                                                  \
    if (ok)                                                                                        \
        break;                                                                                     \
    else {                                                                                         \
        print_message("disturbed (attempt %d of %d)\n", (attempt) + 1, ATTEMPTS);                  \
        assert_true((attempt) + 1 < ATTEMPTS);                                                     \
    }

#define BODY "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":1}"

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static void send_completion(int fd)
{
    char req[512];
    int n = snprintf(req, sizeof(req),
                     "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: "
                     "application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(BODY), BODY);
    assert_int_equal(write(fd, req, (size_t)n), n);
}

/* Waits (at most 5 s) for the first byte of an answer on each of the n
 * sockets; ms[i] = its time since t0 in ms, or -1 when none came. */
static void await_answers(const int *fds, int n, double t0, double *ms)
{
    int left = n;
    for (int i = 0; i < n; i++)
        ms[i] = -1;
    double deadline = tu_now() + 5;
    while (left > 0 && tu_now() < deadline) {
        struct pollfd p[8];
        for (int i = 0; i < n; i++)
            p[i] = (struct pollfd){ms[i] < 0 ? fds[i] : -1, POLLIN, 0};
        if (poll(p, (nfds_t)n, 100) <= 0)
            continue;
        double now = tu_now();
        for (int i = 0; i < n; i++) {
            if (ms[i] >= 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char buf[4096];
            ssize_t r = read(fds[i], buf, sizeof(buf) - 1);
            assert_true(r > 0);
            buf[r] = 0;
            assert_true(strncmp(buf, "HTTP/1.1 200", 12) == 0);
            ms[i] = (now - t0) * 1000;
            left--;
        }
    }
}

/* GET path on a fresh connection; returns the JSON answer (new ref). */
static json_t *get_json(int port, const char *path)
{
    int fd = connect_to(port);
    char req[256];
    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", path);
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    char buf[4096];
    size_t len = 0;
    double deadline = tu_now() + 5;
    while (tu_now() < deadline && len + 1 < sizeof(buf)) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t r = read(fd, buf + len, sizeof(buf) - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = 0;
    char *body = strstr(buf, "\r\n\r\n");
    assert_non_null(body);
    json_error_t err;
    json_t *j = json_loads(body + 4, 0, &err);
    assert_non_null(j);
    return j;
}

/* Two concurrent requests, one slot, 50 ms each: the second waits for the
 * first, so they answer at ~50 and ~100 ms. */
static void test_one_slot_serialises(void **state)
{
    for (int i = 0; i < ATTEMPTS; i++) {
        ig_proc_t up;
        assert_int_equal(tu_start(&up, "testupstream", "--quiet --slots 1 --delay-ms 50"), 0);
        int fds[2] = {connect_to(up.port), connect_to(up.port)};
        double t0 = tu_now(), ms[2];
        send_completion(fds[0]);
        send_completion(fds[1]);
        await_answers(fds, 2, t0, ms);
        json_t *st = get_json(up.port, "/_control/stats");
        tu_stop(&up);
        close(fds[0]);
        close(fds[1]);
        print_message("--slots 1: answers at %.1f and %.1f ms\n", ms[0], ms[1]);
        /* Arrival order is send order on loopback, and the FIFO keeps it:
         * the second cannot start before the first is done. */
        assert_true(ms[0] >= 49);
        assert_true(ms[1] >= 99);
        assert_int_equal((int)TU_NUM(st, "queued"), 1);
        assert_int_equal((int)TU_NUM(st, "busy"), 0);
        assert_int_equal((int)TU_NUM(st, "waiting"), 0);
        /* The slot was held twice, 50 ms each at least (the wait for it
         * not counted), and no longer than the answers took. */
        double slot_s = TU_NUM(st, "slot_s");
        assert_int_equal((int)TU_NUM(st, "slot_holds"), 2);
        assert_true(slot_s >= 0.099 && slot_s <= ms[1] / 1e3 + 0.001);
        json_decref(st);
        /* A stalled reader sees both at once: the gap is no lower bound. */
        RETRY_UNLESS(i, ms[0] < 75 && ms[1] < 125 && ms[1] - ms[0] >= 45);
    }
}

/* The same two requests with two slots run side by side: both ~50 ms. */
static void test_two_slots_in_parallel(void **state)
{
    for (int i = 0; i < ATTEMPTS; i++) {
        ig_proc_t up;
        assert_int_equal(tu_start(&up, "testupstream", "--quiet --slots 2 --delay-ms 50"), 0);
        int fds[2] = {connect_to(up.port), connect_to(up.port)};
        double t0 = tu_now(), ms[2];
        send_completion(fds[0]);
        send_completion(fds[1]);
        await_answers(fds, 2, t0, ms);
        tu_stop(&up);
        close(fds[0]);
        close(fds[1]);
        print_message("--slots 2: answers at %.1f and %.1f ms\n", ms[0], ms[1]);
        assert_true(ms[0] >= 49 && ms[1] >= 49);
        /* Side by side: ~100 ms for the second would mean it queued. */
        RETRY_UNLESS(i, ms[0] < 75 && ms[1] < 75);
    }
}

/* A waiting request whose client went away gives up its place: the request
 * behind it is served right after the first (~100 ms), not after a ghost
 * (~150 ms). */
static void test_gone_waiter_leaves_queue(void **state)
{
    for (int i = 0; i < ATTEMPTS; i++) {
        ig_proc_t up;
        assert_int_equal(tu_start(&up, "testupstream", "--quiet --slots 1 --delay-ms 50"), 0);
        int a = connect_to(up.port), b = connect_to(up.port), c = connect_to(up.port);
        double t0 = tu_now();
        send_completion(a);
        send_completion(b);
        usleep(10000);
        close(b);
        usleep(10000);
        send_completion(c);
        int fds[2] = {a, c};
        double ms[2];
        await_answers(fds, 2, t0, ms);
        tu_stop(&up);
        close(a);
        close(c);
        print_message("gone waiter: answers at %.1f and %.1f ms\n", ms[0], ms[1]);
        assert_true(ms[0] >= 49 && ms[1] >= 99);
        /* ~150 ms would mean the gone request was served in between. */
        RETRY_UNLESS(i, ms[0] < 75 && ms[1] < 125);
    }
}

/* Probes do not queue behind the model's work: with the only slot held, a
 * GET /health is answered after its own delay (~50 ms, not ~100), and at
 * once with --instant-raw. */
static int check_probe(const char *flags, double lo, double hi)
{
    ig_proc_t up;
    assert_int_equal(tu_start(&up, "testupstream", "--quiet --slots 1 --delay-ms 50 %s", flags), 0);
    int fds[2] = {connect_to(up.port), connect_to(up.port)};
    double t0 = tu_now(), ms[2];
    send_completion(fds[0]);
    const char *probe = "GET /health HTTP/1.1\r\nHost: t\r\n\r\n";
    assert_int_equal(write(fds[1], probe, strlen(probe)), (ssize_t)strlen(probe));
    await_answers(fds, 2, t0, ms);
    tu_stop(&up);
    close(fds[0]);
    close(fds[1]);
    print_message("probe with '%s': completion %.1f ms, probe %.1f ms\n", flags, ms[0], ms[1]);
    assert_true(ms[0] >= 49 && ms[1] >= lo);
    return ms[1] < hi;
}

static void test_probe_takes_no_slot(void **state)
{
    for (int i = 0; i < ATTEMPTS; i++)
        RETRY_UNLESS(i, check_probe("", 49, 75));
    for (int i = 0; i < ATTEMPTS; i++)
        RETRY_UNLESS(i, check_probe("--instant-raw", 0, 20));
}

/* --report-load: GET /load says what runs and waits, at once, while the
 * only slot is held and one request waits. */
static void test_report_load(void **state)
{
    ig_proc_t up;
    assert_int_equal(
        tu_start(&up, "testupstream", "--quiet --slots 1 --delay-ms 200 --report-load"), 0);
    int fds[2] = {connect_to(up.port), connect_to(up.port)};
    send_completion(fds[0]);
    send_completion(fds[1]);
    usleep(50000);
    double t0 = tu_now();
    json_t *load = get_json(up.port, "/load");
    double ms = (tu_now() - t0) * 1000;
    tu_stop(&up);
    close(fds[0]);
    close(fds[1]);
    print_message("/load in %.1f ms\n", ms);
    assert_true(ms < 100); /* not behind the 200 ms requests */
    assert_int_equal((int)TU_NUM(load, "max_num_seqs"), 1);
    assert_int_equal((int)TU_NUM(load, "running"), 1);
    assert_int_equal((int)TU_NUM(load, "waiting"), 1);
    assert_int_equal((int)TU_NUM(load, "ready_instances"), 1);
    json_decref(load);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_slot_serialises),
        cmocka_unit_test(test_two_slots_in_parallel),
        cmocka_unit_test(test_gone_waiter_leaves_queue),
        cmocka_unit_test(test_probe_takes_no_slot),
        cmocka_unit_test(test_report_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
