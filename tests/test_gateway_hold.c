/*
 * Rule 5 of the latency pick with real processes (docs/routing.md, "The
 * latency pick"; gateway/route/admit.c): `infergate serve` in front of two
 * 1-slot testupstreams that report their slots in /load, a fast one (50 ms
 * an answer) and a slow one (400 ms). Bursts of four: the fast one takes
 * two (its cap, twice its slots), the slow one one while it is idle, and
 * the fourth waits in the gateway for the fast one's next place (about
 * 50 ms) rather than queue behind the slow one's answer (400 ms more).
 * Without the rule the fourth joins the slow one's queue: two inside it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "burst.h"
#include "gwfixture.h"

static const char *body = "{\"model\":\"m\",\"prompt\":\"hello\",\"max_tokens\":1}";

static int served_by(const ig_burst_one_t *out, int n, const char *name)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += strcmp(out[i].upstream, name) == 0;
    return k;
}

static void test_waits_for_fast_place(void **state)
{
    (void)state;
    ig_proc_t ups[2];
    assert_int_equal(ig_gwf_upstream(&ups[0], "--instant-raw", "--report-load", "--slots", "1",
                                     "--delay-ms", "50", "--tokens", "1", NULL),
                     0);
    assert_int_equal(ig_gwf_upstream(&ups[1], "--instant-raw", "--report-load", "--slots", "1",
                                     "--delay-ms", "400", "--tokens", "1", NULL),
                     0);
    ig_proc_t g;
    assert_int_equal(ig_gwf_sites_serve(&g, ups, 2, 2, NULL, NULL), 0);

    /* Pairs teach the router both: the second of each goes to the idle
     * slow one (the hot/cold guard), so its hold is measured too. */
    ig_burst_one_t out[4];
    int slow_warm = 0;
    for (int round = 0; round < 6; round++) {
        assert_int_equal(ig_burst(g.port, "/v1/completions", body, 2, 10000, out), 2);
        slow_warm += served_by(out, 2, "s1");
    }
    print_message("warm-up: the slow one served %d of 12\n", slow_warm);
    assert_true(slow_warm >= 1);

    int fast = 0, slow = 0;
    long long worst_fast = 0;
    for (int round = 0; round < 8; round++) {
        assert_int_equal(ig_burst(g.port, "/v1/completions", body, 4, 10000, out), 4);
        fast += served_by(out, 4, "s0");
        slow += served_by(out, 4, "s1");
        for (int i = 0; i < 4; i++)
            if (strcmp(out[i].upstream, "s0") == 0 && out[i].ms > worst_fast)
                worst_fast = out[i].ms;
    }
    int inside_fast = ig_gwf_upstream_stat(ups[0].port, "max_inside");
    int inside_slow = ig_gwf_upstream_stat(ups[1].port, "max_inside");
    print_message("32 in bursts of 4: fast %d (at most %d inside, slowest answer %lld ms), "
                  "slow %d (at most %d inside)\n",
                  fast, inside_fast, worst_fast, slow, inside_slow);
    assert_int_equal(fast + slow, 32);
    /* Never a request queued behind the slow one's answer... */
    assert_int_equal(inside_slow, 1);
    /* ...yet it served while idle: no capacity idled while requests waited. */
    assert_true(slow >= 4);
    /* The fast one within its cap (twice its slots). */
    assert_int_equal(inside_fast, 2);

    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    for (int i = 0; i < 2; i++)
        ig_proc_stop(&ups[i], SIGKILL, 5000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_waits_for_fast_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
