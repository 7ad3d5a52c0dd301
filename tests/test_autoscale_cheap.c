/* Cheap capacity first (ig_autoscale_prefer_cheap): the pools of one model
 * after their own decisions; growth goes to the cheapest pool that can
 * absorb it, shrink is taken from the dearest pool first. Hand-built
 * members, the figures worked out in the comments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "infergate/autoscale.h"
#include "autoscale_fixture.h"

#define S(x) ((uint64_t)((x)*1e9))

static ig_autoscale_member_t member(double rank, int current, int desired, double load, int hi)
{
    ig_autoscale_member_t m;
    memset(&m, 0, sizeof(m));
    m.rank = rank;
    m.target = 8;
    m.load = load;
    m.current = current;
    m.desired = desired;
    m.lo = 0;
    m.hi = hi;
    return m;
}

static void assert_str(const char *got, const char *want)
{
    if (want == NULL)
        assert_null(got);
    else {
        assert_non_null(got);
        assert_string_equal(got, want);
    }
}

/* The dear pool wants one more; the cheap one has room: the cheap grows. */
static void test_growth_goes_to_cheap(void **state)
{
    (void)state;
    ig_autoscale_member_t m[2] = {member(4.0, 1, 2, 12, 4), member(1.0, 1, 1, 8, 4)};
    ig_autoscale_prefer_cheap(m, 2);
    assert_int_equal(m[0].desired, 1);
    assert_str(m[0].limit, "cheaper_pool");
    assert_int_equal(m[1].desired, 2);
    assert_str(m[1].reason, "absorb");
}

/* The cheap pool is at its most: the dear one keeps its growth. */
static void test_cheap_full_dear_grows(void **state)
{
    (void)state;
    ig_autoscale_member_t m[2] = {member(1.0, 2, 2, 16, 2), member(4.0, 1, 2, 12, 4)};
    ig_autoscale_prefer_cheap(m, 2);
    assert_int_equal(m[0].desired, 2);
    assert_null(m[0].reason);
    assert_int_equal(m[1].desired, 2);
    assert_null(m[1].limit);
}

/* Room for one of three: the cheap takes one, the dear two. */
static void test_partial_absorb(void **state)
{
    (void)state;
    ig_autoscale_member_t m[2] = {member(1.0, 1, 1, 8, 2), member(4.0, 1, 4, 30, 4)};
    ig_autoscale_prefer_cheap(m, 2);
    assert_int_equal(m[0].desired, 2);
    assert_int_equal(m[1].desired, 3);
    assert_str(m[1].limit, "cheaper_pool");
}

/* What the cheap pool has beyond its load counts first: 2 x 8 - 10 = 6 of
 * the 8 needed, so one new instance for the other 2; a starting instance
 * that absorbed a need already is not asked again. */
static void test_spare_counts(void **state)
{
    (void)state;
    ig_autoscale_member_t m[2] = {member(1.0, 2, 2, 10, 4), member(4.0, 1, 2, 12, 4)};
    ig_autoscale_prefer_cheap(m, 2);
    assert_int_equal(m[0].desired, 3);
    assert_int_equal(m[1].desired, 1);
    /* The next tick: the cheap pool's third instance is starting (current
     * 3, its own want held at 3), the dear one still wants 2: the spare
     * of 3 x 8 - 10 = 14 takes the 8, nothing new starts. */
    ig_autoscale_member_t n[2] = {member(1.0, 3, 3, 10, 4), member(4.0, 1, 2, 12, 4)};
    ig_autoscale_prefer_cheap(n, 2);
    assert_int_equal(n[0].desired, 3);
    assert_int_equal(n[1].desired, 1);
    assert_str(n[1].limit, "cheaper_pool");
}

/* A cheap pool that sheds on its own absorbs nothing: its spare is not
 * what the router uses. */
static void test_shrinking_pool_absorbs_nothing(void **state)
{
    (void)state;
    ig_autoscale_member_t m[2] = {member(1.0, 2, 1, 2, 4), member(4.0, 1, 2, 12, 4)};
    m[1].lo = 1;
    ig_autoscale_prefer_cheap(m, 2);
    assert_int_equal(m[1].desired, 2);
    assert_null(m[1].limit);
}

/* The cheap pool wants to shed one; the dear one can shed one whose load
 * (6 - 8 < 0: none) fits: the dear sheds, the cheap keeps both. */
static void test_shrink_dearest_first(void **state)
{
    (void)state;
    ig_autoscale_member_t m[2] = {member(1.0, 2, 1, 4, 2), member(4.0, 2, 2, 6, 2)};
    m[1].lo = 1;
    ig_autoscale_prefer_cheap(m, 2);
    assert_int_equal(m[0].desired, 2);
    assert_str(m[0].limit, "dearer_pool");
    assert_int_equal(m[1].desired, 1);
    assert_str(m[1].reason, "dearest_first");
}

/* The dear pool's last instance carries 8: the cheap keeps 2 for 7 + 8. */
static void test_shrink_moves_load(void **state)
{
    (void)state;
    ig_autoscale_member_t m[2] = {member(1.0, 2, 1, 7, 2), member(4.0, 1, 1, 8, 1)};
    ig_autoscale_prefer_cheap(m, 2);
    assert_int_equal(m[0].desired, 2);
    assert_int_equal(m[1].desired, 0);
}

/* 8 + 9 needs 3 instances; the cheap pool has 2: no trade, it sheds its own. */
static void test_shrink_no_room(void **state)
{
    (void)state;
    ig_autoscale_member_t m[2] = {member(1.0, 2, 1, 8, 2), member(4.0, 1, 1, 9, 1)};
    ig_autoscale_prefer_cheap(m, 2);
    assert_int_equal(m[0].desired, 1);
    assert_null(m[0].limit);
    assert_int_equal(m[1].desired, 1);
    assert_null(m[1].reason);
}

/* A pool in panic (lo = current) never sheds for another. */
static void test_panic_keeps(void **state)
{
    (void)state;
    ig_autoscale_member_t m[2] = {member(1.0, 2, 1, 4, 2), member(4.0, 2, 2, 6, 2)};
    m[1].lo = 2;
    ig_autoscale_prefer_cheap(m, 2);
    assert_int_equal(m[0].desired, 1);
    assert_int_equal(m[1].desired, 2);
}

/* An unpriced pool (NAN) ranks after every priced one; two unpriced, or
 * two of one rank, never trade. */
static void test_unknown_and_equal(void **state)
{
    (void)state;
    ig_autoscale_member_t m[2] = {member(NAN, 1, 2, 12, 4), member(9.0, 1, 1, 8, 4)};
    ig_autoscale_prefer_cheap(m, 2);
    assert_int_equal(m[0].desired, 1);
    assert_int_equal(m[1].desired, 2);

    ig_autoscale_member_t u[2] = {member(NAN, 1, 2, 12, 4), member(NAN, 1, 1, 8, 4)};
    ig_autoscale_prefer_cheap(u, 2);
    assert_int_equal(u[0].desired, 2);
    assert_int_equal(u[1].desired, 1);

    ig_autoscale_member_t e[2] = {member(2.0, 1, 2, 12, 4), member(2.0, 1, 1, 8, 4)};
    ig_autoscale_prefer_cheap(e, 2);
    assert_int_equal(e[0].desired, 2);
    assert_int_equal(e[1].desired, 1);

    assert_true(ig_autoscale_cheaper(1, NAN));
    assert_false(ig_autoscale_cheaper(NAN, 1));
    assert_false(ig_autoscale_cheaper(NAN, NAN));
    assert_false(ig_autoscale_cheaper(2, 2));
}

/* A < B < C; B and C want one more each, A has room for one: B's growth
 * fills A, C's goes to B (cheaper than C), C grows by nothing. */
static void test_three_tiers(void **state)
{
    (void)state;
    ig_autoscale_member_t m[3] = {member(9.0, 1, 2, 12, 4), member(1.0, 1, 1, 8, 2),
                                  member(3.0, 1, 2, 12, 4)};
    ig_autoscale_prefer_cheap(m, 3);
    assert_int_equal(m[1].desired, 2); /* A */
    assert_int_equal(m[2].desired, 2); /* B: its own growth went to A, C's came to it */
    assert_str(m[2].reason, "absorb");
    assert_str(m[2].limit, "cheaper_pool");
    assert_int_equal(m[0].desired, 1); /* C */
}

/* ig_autoscaler_hold: a count given for another pool's load is held by
 * the scale-down delay as the pool's own want would be. */
static void test_hold_delays_shrink(void **state)
{
    (void)state;
    ig_autoscaler_t as = ig_tas_make((ig_tas_t){.target_queue_depth = 8,
                                                .stable_window_s = 5,
                                                .panic_window_s = 2,
                                                .scale_down_delay_s = 10,
                                                .min_instances = 1,
                                                .max_instances = 4});
    for (int t = 1; t <= 6; t++)
        ig_autoscaler_sample(&as, S(t), 8);
    ig_scale_decision_t d = ig_autoscaler_decide(&as, S(6), 1, 1, 3);
    assert_int_equal(d.desired, 1);
    ig_autoscaler_hold(&as, S(6), 2); /* it grew for a dearer pool */
    ig_autoscaler_sample(&as, S(7), 8);
    d = ig_autoscaler_decide(&as, S(7), 2, 1, 2);
    assert_int_equal(d.desired, 2);
    assert_string_equal(d.limit, "scale_down_delay");
    /* Past the delay it may shed again. */
    for (int t = 8; t <= 18; t++)
        ig_autoscaler_sample(&as, S(t), 8);
    d = ig_autoscaler_decide(&as, S(18), 2, 2, 2);
    assert_int_equal(d.desired, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_growth_goes_to_cheap),
        cmocka_unit_test(test_cheap_full_dear_grows),
        cmocka_unit_test(test_partial_absorb),
        cmocka_unit_test(test_spare_counts),
        cmocka_unit_test(test_shrinking_pool_absorbs_nothing),
        cmocka_unit_test(test_shrink_dearest_first),
        cmocka_unit_test(test_shrink_moves_load),
        cmocka_unit_test(test_shrink_no_room),
        cmocka_unit_test(test_panic_keeps),
        cmocka_unit_test(test_unknown_and_equal),
        cmocka_unit_test(test_three_tiers),
        cmocka_unit_test(test_hold_delays_shrink),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
