/* The routing simulator (bench/routing-sim/) against closed forms and
 * against itself: one upstream with c exponential servers is M/M/c, whose
 * mean wait Erlang C gives; the same seed gives the same run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "sim.h"

/* One upstream, c slots, exponential service of mean 1/mu seconds, no
 * batch slowdown, no network, fixed request sizes, not streamed: the
 * client's TTFT is the whole answer, wait plus service. */
static void mmc_fleet(sim_fleet_t *f, int c, double mean_s, int reports_load)
{
    memset(f, 0, sizeof(*f));
    f->n = 1;
    f->stream = 0;
    f->prompt_mean = 1;
    f->output_mean = 1;
    f->token_sigma = 0;
    sim_upstream_t *u = &f->up[0];
    u->slots = c;
    u->ttft0_s = mean_s / 2;
    u->decode_s_tok = mean_s / 2;
    u->dist = SIM_DIST_EXP;
    u->reports_load = reports_load;
}

/* Erlang C: the mean time in an M/M/c system (wait + service). */
static double mmc_mean(int c, double lambda, double mu)
{
    double a = lambda / mu, rho = a / c;
    double term = 1, sum = 0;
    for (int k = 0; k < c; k++) {
        sum += term;
        term *= a / (k + 1);
    }
    double pc = term / (1 - rho); /* a^c / c! / (1 - rho) */
    double p_wait = pc / (sum + pc);
    return 1 / mu + p_wait / (c * mu - lambda);
}

/* The mean TTFT over reps independent runs, and the standard error of that
 * mean from the spread of the runs' means (each run's requests are
 * correlated through the queue; the runs are not). */
static void replicate(const sim_fleet_t *f, sim_policy_t p, double load, int reps, int requests,
                      double *mean, double *se)
{
    double s = 0, s2 = 0;
    for (int k = 0; k < reps; k++) {
        sim_config_t c;
        sim_config_default(&c);
        c.requests = requests;
        c.load = load;
        c.seed = 1000 + (uint64_t)k;
        sim_result_t r;
        assert_int_equal(sim_run(f, p, &c, &r), 0);
        assert_int_equal(r.failed + r.rejected, 0);
        s += r.ttft_mean;
        s2 += r.ttft_mean * r.ttft_mean;
    }
    *mean = s / reps;
    double var = (s2 - s * s / reps) / (reps - 1);
    *se = sqrt(var / reps);
}

static void check_mmc(int c, double load, sim_policy_t p, int reports_load)
{
    sim_fleet_t f;
    double mean_s = 0.1;
    mmc_fleet(&f, c, mean_s, reports_load);
    assert_true(fabs(sim_fleet_capacity(&f) - c / mean_s) < 1e-9);
    double got, se;
    replicate(&f, p, load, 12, 8000, &got, &se);
    double want = mmc_mean(c, load * c / mean_s, 1 / mean_s);
    /* Four standard errors (a false alarm about once in 16,000 runs), and
     * no looser than 2% of the answer. */
    double tol = fmax(4 * se, 0.02 * want);
    print_message("M/M/%d at %.0f%% (%s): simulated %.4f s +- %.4f, Erlang C %.4f s\n", c,
                  load * 100, sim_policy_name(p), got, se, want);
    assert_true(se < 0.05 * want); /* the runs are long enough to say anything */
    assert_true(fabs(got - want) <= tol);
}

static void test_mm1_peer(void **state)
{
    (void)state;
    check_mmc(1, 0.7, SIM_NGINX_LC, 0);
}

static void test_mm4_peer(void **state)
{
    (void)state;
    check_mmc(4, 0.8, SIM_NGINX_LC, 0);
}

/* Through the real router, its limit and the gateway queue: with the slots
 * reported the limit is twice them, so the upstream never idles while a
 * request waits in the gateway, and the gateway queue and the upstream's
 * FIFO together are one FIFO: still M/M/c. */
static void test_mm4_latency_policy(void **state)
{
    (void)state;
    check_mmc(4, 0.8, SIM_LATENCY, 1);
}

/* A wrong answer must fail: M/M/4 is not M/M/1 at the same load. */
static void test_mmc_discriminates(void **state)
{
    (void)state;
    sim_fleet_t f;
    mmc_fleet(&f, 4, 0.1, 0);
    double got, se;
    replicate(&f, SIM_NGINX_LC, 0.8, 6, 4000, &got, &se);
    double mm1 = mmc_mean(1, 0.8 / 0.1, 1 / 0.1); /* 0.5 s */
    assert_true(fabs(got - mm1) > 10 * se);
}

static int same_result(const sim_result_t *a, const sim_result_t *b)
{
    return memcmp(a, b, sizeof(*a)) == 0;
}

/* Same fleet, same seed: the same run, to the bit, for every policy; a
 * different arrival seed gives a different run. */
static void test_deterministic(void **state)
{
    (void)state;
    sim_fleet_t f1, f2;
    sim_fleet_generate(42, &f1);
    sim_fleet_generate(42, &f2);
    assert_memory_equal(&f1, &f2, sizeof(f1));
    sim_fleet_t f3;
    sim_fleet_generate(43, &f3);
    assert_memory_not_equal(&f1, &f3, sizeof(f1));
    sim_config_t c;
    sim_config_default(&c);
    c.requests = 3000;
    for (int p = 0; p < SIM_NPOLICIES; p++) {
        sim_result_t a, b, d;
        memset(&a, 0, sizeof(a));
        memset(&b, 0, sizeof(b));
        memset(&d, 0, sizeof(d));
        assert_int_equal(sim_run(&f1, (sim_policy_t)p, &c, &a), 0);
        assert_int_equal(sim_run(&f2, (sim_policy_t)p, &c, &b), 0);
        assert_true(same_result(&a, &b));
        assert_true(a.measured > 0);
        sim_config_t c2 = c;
        c2.seed = c.seed + 1;
        assert_int_equal(sim_run(&f1, (sim_policy_t)p, &c2, &d), 0);
        assert_false(same_result(&a, &d));
    }
}

/* The oracle reports each metric from the best of its rules, and keeps
 * what each rule alone gave (routing-sim prints them): the figures are
 * the least of the rules', and the rules are not all alike. */
static void test_oracle_best_of_rules(void **state)
{
    (void)state;
    int differ = 0;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        sim_fleet_t f;
        sim_fleet_generate(seed, &f);
        sim_config_t c;
        sim_config_default(&c);
        c.requests = 3000;
        c.load = 0.7;
        sim_result_t r;
        assert_int_equal(sim_run(&f, SIM_ORACLE, &c, &r), 0);
        double p50 = INFINITY, p99 = INFINITY;
        for (int v = 0; v < SIM_ORACLE_RULES; v++) {
            assert_true(r.rule_ttft[v][0] > 0 && r.rule_ttft[v][0] <= r.rule_ttft[v][1]);
            p50 = fmin(p50, r.rule_ttft[v][0]);
            p99 = fmin(p99, r.rule_ttft[v][1]);
        }
        assert_true(r.ttft_p50 == p50);
        assert_true(r.ttft_p99 == p99);
        differ += r.rule_ttft[0][1] != r.rule_ttft[2][1];
    }
    assert_true(differ > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mm1_peer),           cmocka_unit_test(test_mm4_peer),
        cmocka_unit_test(test_mm4_latency_policy), cmocka_unit_test(test_mmc_discriminates),
        cmocka_unit_test(test_deterministic),      cmocka_unit_test(test_oracle_best_of_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
