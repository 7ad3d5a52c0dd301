/* The half-open trial of an ejected upstream: only real evidence ends it.
 * A canceled attempt (a lost hedge, a client that went away) neither
 * un-ejects the upstream nor keeps the trial slot. Synthetic clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "infergate/router.h"

#define S(x) ((uint64_t)((x)*1e9))

/* An upstream ejected once at t = 1 s (2 s base): half-open from 3 s. */
static void ejected(ig_router_t *r, ig_router_upstream_t *u)
{
    ig_router_opts_t o;
    ig_router_opts_default(&o);
    ig_router_init(r, &o);
    ig_router_upstream_init(u, "u", IG_ROUTER_SITE);
    u->ready = 1;
    for (int i = 0; i < o.eject_consecutive; i++) {
        assert_int_equal(ig_router_attempt_begin(r, u, S(1)), 0);
        ig_router_attempt_end(r, u, IG_OUTCOME_FAILURE, 0, S(1));
    }
    assert_int_equal(u->ejections, 1);
    assert_false(ig_router_eligible(u, S(2.9)));
    assert_true(ig_router_eligible(u, S(3.1)));
}

/* A trial that is abandoned leaves the upstream ejected (its backoff
 * intact) and frees the slot for the next trial. */
static void test_abandoned_trial_stays_ejected(void **state)
{
    ig_router_t r;
    ig_router_upstream_t u;
    ejected(&r, &u);
    assert_int_equal(ig_router_attempt_begin(&r, &u, S(3.1)), 1);
    assert_false(ig_router_eligible(&u, S(3.1))); /* one trial at a time */
    ig_router_attempt_end(&r, &u, IG_OUTCOME_ABANDONED, 1, S(3.2));
    assert_int_equal(u.inflight, 0);
    assert_true(u.ejected_until_ns != 0);
    assert_int_equal(u.ejections, 1);
    /* Another trial may run, and it is a trial again. */
    assert_true(ig_router_eligible(&u, S(3.3)));
    assert_int_equal(ig_router_attempt_begin(&r, &u, S(3.3)), 1);
    /* That one fails: ejected for twice the base, as a failed trial is. */
    ig_router_attempt_end(&r, &u, IG_OUTCOME_FAILURE, 1, S(3.4));
    assert_int_equal(u.ejections, 2);
    assert_false(ig_router_eligible(&u, S(7.3)));
    assert_true(ig_router_eligible(&u, S(7.5)));
}

/* A stream's first content token proves the upstream: the ejection is
 * over even if the client then goes away. */
static void test_first_token_clears_trial(void **state)
{
    ig_router_t r;
    ig_router_upstream_t u;
    ejected(&r, &u);
    int trial = ig_router_attempt_begin(&r, &u, S(3.1));
    assert_int_equal(trial, 1);
    ig_router_attempt_proven(&r, &u, trial, S(3.2));
    assert_int_equal(u.ejected_until_ns, 0);
    assert_int_equal(u.ejections, 0);
    assert_true(ig_router_eligible(&u, S(3.2)));
    assert_int_equal(u.inflight, 1); /* still streaming */
    ig_router_attempt_end(&r, &u, IG_OUTCOME_ABANDONED, 0, S(3.5));
    assert_int_equal(u.inflight, 0);
    assert_int_equal(u.ejected_until_ns, 0);
    /* Not a trial any more: a new attempt is an ordinary one. */
    assert_int_equal(ig_router_attempt_begin(&r, &u, S(4)), 0);
}

/* An abandoned attempt that was not the trial (begun before the ejection)
 * leaves the trial that is in flight alone. */
static void test_other_abandoned_attempt_keeps_trial(void **state)
{
    ig_router_t r;
    ig_router_upstream_t u;
    ejected(&r, &u);
    assert_int_equal(ig_router_attempt_begin(&r, &u, S(3.1)), 1);
    ig_router_attempt_end(&r, &u, IG_OUTCOME_ABANDONED, 0, S(3.2));
    assert_false(ig_router_eligible(&u, S(3.2))); /* the trial still runs */
    ig_router_attempt_end(&r, &u, IG_OUTCOME_SUCCESS, 1, S(3.3));
    assert_int_equal(u.ejected_until_ns, 0);
    assert_true(ig_router_eligible(&u, S(3.3)));
}

/* Backpressure ends the trial without un-ejecting: busy is not proof. */
static void test_backpressure_trial_stays_ejected(void **state)
{
    ig_router_t r;
    ig_router_upstream_t u;
    ejected(&r, &u);
    assert_int_equal(ig_router_attempt_begin(&r, &u, S(3.1)), 1);
    ig_router_attempt_end(&r, &u, IG_OUTCOME_BACKPRESSURE, 1, S(3.2));
    assert_true(u.ejected_until_ns != 0);
    assert_int_equal(u.ejections, 1);
    assert_true(ig_router_eligible(&u, S(3.3)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_abandoned_trial_stays_ejected),
        cmocka_unit_test(test_first_token_clears_trial),
        cmocka_unit_test(test_other_abandoned_attempt_keeps_trial),
        cmocka_unit_test(test_backpressure_trial_stays_ejected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
