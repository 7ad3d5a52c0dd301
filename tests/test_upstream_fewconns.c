/*
 * The upstream client's connections against a server that serves only N
 * connections at a time (tests/peers/fewconns_upstream.py: N threads, a
 * connection holds one until the client closes it, idle or not; the rest
 * wait unread in the accept backlog, as with llama.cpp's llama-server).
 * Through a real `infergate serve` with the peer as a site:
 *   - bursts of more concurrent requests than the server has threads are
 *     all answered, without the stall of requests sent on connections the
 *     server never accepts;
 *   - once the bursts are over, the idle connections are closed (the
 *     peer sees them go), beyond the one the prober keeps using.
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

#include "burst.h"
#include "gwfixture.h"
#include "peers.h"

static const char *body = "{\"model\":\"m\",\"prompt\":\"hello\",\"max_tokens\":1}";

/* The peer's stats port, from its "stats on HOST:PORT" line. */
static int stats_port(const ig_proc_t *p)
{
    const char *at = p->out ? strstr(p->out, "stats on ") : NULL;
    const char *colon = at ? strchr(at + 9, ':') : NULL;
    return colon ? atoi(colon + 1) : -1;
}

static int peer_stat(int port, const char *key)
{
    json_t *doc = ig_gwf_get_json(port, "/");
    int v = doc ? (int)json_integer_value(json_object_get(doc, key)) : -1;
    json_decref(doc);
    return v;
}

static void test_few_connections(void **state)
{
    (void)state;
    ig_proc_t peer;
    const char *args[] = {"--threads", "3", "--delay-ms", "50", NULL};
    assert_int_equal(ig_peer_start(&peer, "fewconns_upstream.py", args, 10000), 0);
    int sp = stats_port(&peer);
    assert_true(sp > 0);
    ig_proc_t g;
    assert_int_equal(ig_gwf_sites_serve(&g, &peer, 1, 1, NULL, NULL), 0);

    /* Three rounds of 12 at once on 3 threads: about 4 x 50 ms each when
     * the server's threads always have our next request; a request on a
     * connection left in the backlog behind our idle keep-alive ones would
     * wait until the keep-alive timeout (30 s) closed one of them. */
    ig_burst_one_t out[12];
    long long t0 = ig_tc_now_ms();
    for (int round = 0; round < 3; round++) {
        long long r0 = ig_tc_now_ms();
        int ok = ig_burst(g.port, "/v1/completions", body, 12, 20000, out);
        long long worst = 0;
        for (int i = 0; i < 12; i++)
            worst = out[i].ms > worst ? out[i].ms : worst;
        print_message("round %d: %d ok in %lld ms (slowest %lld ms)\n", round, ok,
                      ig_tc_now_ms() - r0, worst);
        assert_int_equal(ok, 12);
        assert_true(worst < 3000);
    }
    long long total = ig_tc_now_ms() - t0;
    print_message("3 rounds in %lld ms; peer accepted %d connections, served %d\n", total,
                  peer_stat(sp, "accepted"), peer_stat(sp, "served"));
    assert_true(total < 6000);
    assert_int_equal(peer_stat(sp, "served"), 36);

    /* Idle now: within a few trim windows only what the prober uses stays
     * open (the prober sends one request at a time). */
    int open = peer_stat(sp, "open");
    long long end = ig_tc_now_ms() + 6000;
    while (open > 1 && ig_tc_now_ms() < end) {
        usleep(200 * 1000);
        open = peer_stat(sp, "open");
    }
    print_message("open connections after idling: %d\n", open);
    assert_true(open >= 0 && open <= 1);

    /* The gateway still serves after the trim. */
    assert_int_equal(ig_burst(g.port, "/v1/completions", body, 4, 10000, out), 4);

    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_stop(&peer, SIGKILL, 5000);
    ig_proc_dispose(&peer);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_few_connections),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
