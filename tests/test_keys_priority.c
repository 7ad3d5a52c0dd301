/* Priorities and admission by predicted wait under real overload: an
 * open-loop client (one connection per request, constant arrivals) against
 * `infergate serve` in front of the test upstream with 4 slots and 50 ms of
 * service, about 80 requests/s of capacity.
 *
 * - 2x overload, one third critical and two thirds sheddable keys: the
 *   queue serves critical first and a full queue sheds sheddable ones;
 *   critical requests are never refused and their p99 stays under 500 ms
 *   (service 50 ms plus at most a queue of critical ones, which arrive
 *   below capacity).
 * - 2x and 6x overload of standard requests with a 300 ms budget
 *   (limits.max_queue_wait_ms), and at 6x some with a 100 ms deadline of
 *   their own (x-infergate-deadline-ms): every request is answered 200
 *   with p99 within its budget plus its service time (plus 100 ms of
 *   scheduling slack on a shared machine), or refused with 429 within
 *   50 ms; none is left hanging. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include "gwfixture.h"
#include "proc.h"
#include "testclient.h"

#define SERVICE_MS 50

/* Under ASan and UBSan the gateway and this load generator run about two
 * to three times slower (the sanitizers' documented cost): the time
 * limits below that measure the machine, not the rule, scale with it. */
#if defined(__SANITIZE_ADDRESS__)
#define SLOWDOWN 3
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLOWDOWN 3
#endif
#endif
#ifndef SLOWDOWN
#define SLOWDOWN 1
#endif
#define SLOTS 4
#define CAPACITY (SLOTS * 1000 / SERVICE_MS) /* requests/s */
#define BUDGET_MS 300
#define HANG_MS 15000 /* a request with no answer by then is hanging */

static ig_proc_t up, gw;

/* ---- the open-loop client ------------------------------------------------ */

typedef struct {
    const char *raw; /* the whole request */
    size_t len;
} lclass_t;

typedef struct {
    int fd;
    int cls;
    long long sched_ms, done_ms;
    size_t sent;
    char head[64];
    size_t hlen;
    int status; /* 0: no answer (hanging or broken) */
    int done;
} lreq_t;

static long long now_ms(void)
{
    return ig_tc_now_ms();
}

static int lconnect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Sends n requests at rate/s, request i of class pick(i), and waits for
 * every answer (up to HANG_MS after its send). */
static lreq_t *run_load(int port, double rate, int n, const lclass_t *cls, int (*pick)(int i))
{
    lreq_t *r = calloc((size_t)n, sizeof(*r));
    struct pollfd *pf = calloc((size_t)n, sizeof(*pf));
    int *idx = calloc((size_t)n, sizeof(*idx));
    assert_non_null(r);
    long long t0 = now_ms() + 20;
    int next = 0, open = 0;
    for (;;) {
        long long now = now_ms();
        while (next < n && t0 + (long long)(next * 1000.0 / rate) <= now) {
            lreq_t *q = &r[next];
            q->cls = pick(next);
            q->sched_ms = t0 + (long long)(next * 1000.0 / rate);
            q->fd = lconnect(port);
            if (q->fd < 0) {
                q->done = 1;
                q->done_ms = now;
            } else {
                open++;
            }
            next++;
        }
        if (next == n && open == 0)
            break;
        int np = 0;
        for (int i = 0; i < next; i++) {
            lreq_t *q = &r[i];
            if (q->done)
                continue;
            if (now - q->sched_ms > HANG_MS) {
                close(q->fd);
                q->done = 1;
                q->done_ms = now;
                open--;
                continue;
            }
            pf[np].fd = q->fd;
            pf[np].events = q->sent < cls[q->cls].len ? POLLOUT : POLLIN;
            pf[np].revents = 0;
            idx[np++] = i;
        }
        long long wait = next < n ? t0 + (long long)(next * 1000.0 / rate) - now_ms() : 50;
        poll(pf, (nfds_t)np, wait < 0 ? 0 : wait > 50 ? 50 : (int)wait);
        for (int k = 0; k < np; k++) {
            lreq_t *q = &r[idx[k]];
            if (pf[k].revents == 0)
                continue;
            const lclass_t *c = &cls[q->cls];
            if (q->sent < c->len) {
                ssize_t w = send(q->fd, c->raw + q->sent, c->len - q->sent, MSG_NOSIGNAL);
                if (w > 0)
                    q->sent += (size_t)w;
                else if (w < 0 && errno != EAGAIN) {
                    close(q->fd);
                    q->done = 1;
                    q->done_ms = now_ms();
                    open--;
                }
                continue;
            }
            char buf[4096];
            ssize_t got = recv(q->fd, buf, sizeof(buf), 0);
            if (got > 0) {
                size_t take = (size_t)got < sizeof(q->head) - 1 - q->hlen
                                  ? (size_t)got
                                  : sizeof(q->head) - 1 - q->hlen;
                memcpy(q->head + q->hlen, buf, take);
                q->hlen += take;
                q->head[q->hlen] = '\0';
                continue;
            }
            if (got < 0 && errno == EAGAIN)
                continue;
            /* the answer is whole at the close (Connection: close) */
            close(q->fd);
            q->done = 1;
            q->done_ms = now_ms();
            if (strncmp(q->head, "HTTP/1.1 ", 9) == 0)
                q->status = atoi(q->head + 9);
            open--;
        }
    }
    free(pf);
    free(idx);
    return r;
}

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    int n, ok, refused, other;
    long long ok_p50, ok_p99, ok_max, refused_p90, refused_max;
} lstats_t;

/* The pct-th percentile of the k sorted values lat. */
static long long pct_of(const long long *lat, int k, int pct)
{
    int i = (k * pct) / 100;
    return lat[i < k ? i : k - 1];
}

static lstats_t stats_of(const lreq_t *r, int n, int cls)
{
    lstats_t s = {0};
    long long *lat = calloc((size_t)n, sizeof(*lat));
    long long *rlat = calloc((size_t)n, sizeof(*rlat));
    for (int i = 0; i < n; i++) {
        if (r[i].cls != cls)
            continue;
        s.n++;
        long long l = r[i].done_ms - r[i].sched_ms;
        if (r[i].status == 200) {
            lat[s.ok++] = l;
        } else if (r[i].status == 429) {
            rlat[s.refused++] = l;
        } else {
            if (s.other++ < 5)
                fprintf(stderr, "  not 200/429: status %d after %lld ms: %.40s\n", r[i].status, l,
                        r[i].head);
        }
    }
    qsort(lat, (size_t)s.ok, sizeof(*lat), cmp_ll);
    qsort(rlat, (size_t)s.refused, sizeof(*rlat), cmp_ll);
    if (s.ok > 0) {
        s.ok_p50 = lat[s.ok / 2];
        s.ok_p99 = pct_of(lat, s.ok, 99);
        s.ok_max = lat[s.ok - 1];
    }
    if (s.refused > 0) {
        s.refused_p90 = pct_of(rlat, s.refused, 90);
        s.refused_max = rlat[s.refused - 1];
    }
    free(lat);
    free(rlat);
    return s;
}

static void print_stats(const char *what, const lstats_t *s)
{
    fprintf(stderr,
            "%-28s n=%d ok=%d (p50 %lld ms, p99 %lld ms, max %lld ms) 429=%d (p90 %lld ms, "
            "max %lld ms) other=%d\n",
            what, s->n, s->ok, s->ok_p50, s->ok_p99, s->ok_max, s->refused, s->refused_p90,
            s->refused_max, s->other);
}

/* ---- fixtures ------------------------------------------------------------ */

static char req_crit[512], req_shed[512], req_std[512], req_deadline[512];
static lclass_t classes[4];

static void make_req(char *buf, size_t cap, const char *key, const char *extra)
{
    const char body[] = "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":1}";
    snprintf(buf, cap,
             "POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
             "Authorization: Bearer %s\r\n%sContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n%s",
             key, extra, sizeof(body) - 1, body);
}

static int group_setup(void **state)
{
    char delay[16], slots[16];
    snprintf(delay, sizeof(delay), "%d", SERVICE_MS);
    snprintf(slots, sizeof(slots), "%d", SLOTS);
    if (ig_gwf_upstream(&up, "--delay-ms", delay, "--slots", slots, "--report-load",
                        "--instant-raw", NULL) != 0)
        return -1;
    int port = ig_proc_free_port();
    if (ig_gwf_serve_config(
            &gw, port, "error", 0, 10000, 0,
            "{\"listen\":\"127.0.0.1:%d\",\"models\":[{\"name\":\"m\"}],"
            "\"sites\":[{\"name\":\"s0\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"]}],"
            "\"routing\":{\"queue_size\":32},"
            "\"limits\":{\"drain_grace_ms\":0,\"max_queue_wait_ms\":"
            "{\"critical\":0,\"standard\":%d,\"sheddable\":0},"
            "\"max_connections\":20000},"
            "\"api_keys\":["
            "{\"key\":\"sk-crit\",\"name\":\"crit\",\"priority\":\"critical\"},"
            "{\"key\":\"sk-shed\",\"name\":\"shed\",\"priority\":\"sheddable\"},"
            "{\"key\":\"sk-std\",\"name\":\"std\"}]}",
            port, up.port, BUDGET_MS) != 0)
        return -1;
    make_req(req_crit, sizeof(req_crit), "sk-crit", "");
    make_req(req_shed, sizeof(req_shed), "sk-shed", "");
    make_req(req_std, sizeof(req_std), "sk-std", "");
    make_req(req_deadline, sizeof(req_deadline), "sk-std", "x-infergate-deadline-ms: 100\r\n");
    const char *raws[4] = {req_crit, req_shed, req_std, req_deadline};
    for (int i = 0; i < 4; i++) {
        classes[i].raw = raws[i];
        classes[i].len = strlen(raws[i]);
    }
    /* warm up: the site probed up, its slots and service time learned */
    int ok = 0;
    for (int i = 0; i < 200 && ok < 20; i++) {
        ig_tc_response_t r;
        memset(&r, 0, sizeof(r));
        if (ig_tc_request(port, req_std, &r, 5000) == 0 && r.status == 200)
            ok++;
        else
            usleep(50000);
        ig_tc_response_free(&r);
    }
    return ok == 20 ? 0 : -1;
}

static int group_teardown(void **state)
{
    int st = ig_proc_stop(&gw, SIGTERM, 10000);
    ig_proc_dispose(&gw);
    ig_proc_stop(&up, SIGTERM, 5000);
    ig_proc_dispose(&up);
    return st == 0 ? 0 : -1;
}

/* ---- tests --------------------------------------------------------------- */

/* Offers x times CAPACITY for secs seconds, each request's class chosen by
 * pick; *a gets the stats of class ka (labelled la) and, when b is not
 * NULL, *b those of kb (lb). Both are printed. */
static void run_at(double x, int secs, int (*pick)(int i), int ka, const char *la, lstats_t *a,
                   int kb, const char *lb, lstats_t *b)
{
    double rate = x * CAPACITY;
    int n = (int)(rate * secs);
    lreq_t *r = run_load(gw.port, rate, n, classes, pick);
    *a = stats_of(r, n, ka);
    if (b != NULL)
        *b = stats_of(r, n, kb);
    print_stats(la, a);
    if (b != NULL)
        print_stats(lb, b);
    free(r);
}

static int pick_priority(int i)
{
    return i % 3 == 0 ? 0 : 1; /* critical, sheddable, sheddable */
}

static void test_priority_at_2x(void **state)
{
    lstats_t crit, shed;
    run_at(2.0, 3, pick_priority, 0, "2x: critical", &crit, 1, "2x: sheddable", &shed);
    /* sheddable ones are shed, critical ones are not */
    assert_true(shed.refused > shed.n / 4);
    assert_true(crit.refused <= crit.n / 100);
    assert_int_equal(crit.other + shed.other, 0); /* none hangs or breaks */
    assert_true(crit.ok >= crit.n - crit.n / 100);
    assert_true(crit.ok_p99 <= 500);
    sleep(2); /* the queue drains */
}

static int pick_std(int i)
{
    return 2;
}

static int pick_mixed(int i)
{
    return i % 4 == 0 ? 3 : 2; /* a quarter with a 100 ms deadline */
}

static void check_deadlines(const lstats_t *s, int budget_ms)
{
    assert_int_equal(s->other, 0);
    assert_int_equal(s->ok + s->refused, s->n);
    /* A refusal comes at once, not after the wait it predicts: nine in ten
     * within 50 ms of the send, and none after the budget. The load
     * generator's own stalls count here: on a 2-core VM running other tests
     * one reached 60-70 ms, and a stall delays every send it covers;
     * under a sanitizer, SLOWDOWN times that. */
    if (s->refused > 0) {
        assert_true(s->refused_p90 <= 50 * SLOWDOWN);
        assert_true(s->refused_max < budget_ms * SLOWDOWN);
    }
    if (s->ok > 0)
        assert_true(s->ok_p99 <= budget_ms + SERVICE_MS + 100);
}

static void test_deadline_at_2x(void **state)
{
    lstats_t s;
    run_at(2.0, 3, pick_std, 2, "2x: standard, 300 ms budget", &s, 0, NULL, NULL);
    check_deadlines(&s, BUDGET_MS);
    assert_true(s.refused > 0);        /* it was overloaded */
    assert_true(s.ok >= s.n * 4 / 10); /* and still served about its capacity */
    sleep(2);
}

static void test_deadline_at_6x(void **state)
{
    lstats_t s, d;
    run_at(6.0, 2, pick_mixed, 2, "6x: standard, 300 ms budget", &s, 3, "6x: 100 ms deadline", &d);
    check_deadlines(&s, BUDGET_MS);
    check_deadlines(&d, 100);
    assert_true(s.ok >= s.n / 10);
    sleep(2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_priority_at_2x),
        cmocka_unit_test(test_deadline_at_2x),
        cmocka_unit_test(test_deadline_at_6x),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
