#ifndef ROUTING_SIM_H
#define ROUTING_SIM_H

/*
 * A routing simulator in virtual time: a discrete-event simulation of one
 * gateway in front of a fleet of simulated upstreams. The infergate
 * policies run the real router (gateway/route/router.c) and the real
 * admission and queue decisions (gateway/route/admit.c); the baselines
 * (round robin, power of two choices, nginx's and HAProxy's least
 * connections) and an oracle that knows every queue run beside them in the
 * same simulated fleet, with the same arrivals and the same service draws.
 * Same fleet, same config, same seed: the same result, bit for bit.
 */

#include "infergate/router.h"

#include <stdint.h>

#define SIM_MAX_UP 16

/* The spread of one request's service around its upstream's mean (the
 * factor's mean is 1). */
typedef enum {
    SIM_DIST_EXP = 0,   /* exponential: sd = mean */
    SIM_DIST_LOGNORMAL, /* lognormal, sigma 1: sd = 1.31 x mean, a heavier tail */
    SIM_DIST_BIMODAL,   /* 0.5 x mean nine times in ten, 5.5 x the tenth */
    SIM_DIST_FIXED,     /* always the mean (the M/D/c case; tests) */
} sim_dist_t;

typedef struct {
    int slots;            /* requests it runs at once (1-64); more wait in its FIFO */
    double rtt_s;         /* network round trip, half each way */
    double ttft0_s;       /* time to first token of a request alone, less prefill */
    double prefill_s_tok; /* per prompt token, alone */
    double decode_s_tok;  /* per output token, alone */
    double batch_slow;    /* with every slot busy a step takes (1 + this) x as long */
    sim_dist_t dist;
    int fixed_decode; /* testupstream's answers: the first token at the end of the
                         TTFT, the other output - 1 at decode_s_tok apart; the
                         spread and a shift are in the TTFT alone */
    int reports_load; /* answers GET /load (slots, waiting) every 0.5 s */
    /* Events, as fractions of the run's arrival span (0 = none). */
    double shift_at, shift_factor; /* from then on service takes shift_factor x as long */
    double stall_at, stall_s;      /* nothing progresses for stall_s seconds */
    double fail_at, fail_s;        /* every request answered 500 at once for fail_s */
} sim_upstream_t;

typedef struct {
    uint64_t seed;
    int n;
    sim_upstream_t up[SIM_MAX_UP];
    int stream;         /* streamed answers: TTFT is the first token, else the whole answer */
    double prompt_mean; /* tokens, lognormal with token_sigma */
    double output_mean;
    double token_sigma; /* 0: every request has the means */
} sim_fleet_t;

/* A random fleet (2-16 upstreams) from the seed alone. */
void sim_fleet_generate(uint64_t seed, sim_fleet_t *f);

/* Requests per second the fleet completes with every slot busy, at the
 * slower of its speeds before and after any shift. */
double sim_fleet_capacity(const sim_fleet_t *f);

/* One line per upstream, for a reader. */
void sim_fleet_describe(const sim_fleet_t *f, char *buf, int len);

typedef enum {
    SIM_LATENCY = 0,    /* infergate's routing.policy "latency" */
    SIM_LEAST_INFLIGHT, /* infergate's "least_inflight" */
    SIM_ROUND_ROBIN,    /* infergate's "round_robin" */
    SIM_P2C,            /* power of two choices on in-flight: nginx
                           `random two least_conn`, HAProxy `random(2)` */
    SIM_NGINX_LC,       /* nginx `least_conn` */
    SIM_HAPROXY_LC,     /* HAProxy `balance leastconn` */
    SIM_ORACLE,         /* knows every queue (not the sizes): the best of three
                           informed rules, per metric (sim.c, oracle_cost()) */
    SIM_NPOLICIES
} sim_policy_t;

const char *sim_policy_name(sim_policy_t p);
/* 0 and *out, or -1 for an unknown name. */
int sim_policy_parse(const char *s, sim_policy_t *out);
/* The infergate policies run the router, its limit and the gateway queue;
 * the peers and the oracle have none (as nginx and HAProxy by default). */
int sim_policy_is_infergate(sim_policy_t p);

typedef struct {
    int requests;            /* Poisson arrivals */
    double load;             /* arrival rate over sim_fleet_capacity() */
    double warmup;           /* the first share of the requests is not measured */
    uint64_t seed;           /* arrivals and service draws (the fleet has its own) */
    ig_router_opts_t router; /* the infergate policies' (policy is set by the run) */
    int max_inflight;        /* the proxy's cap (0: 2 x reported slots, or 64) */
    int queue_size;          /* the gateway queue (64) */
    double queue_timeout_s;
} sim_config_t;

/* The proxy's and the router's defaults, 20,000 requests, 10% warm-up. */
void sim_config_default(sim_config_t *c);

/* The oracle's rules: its own expected TTFT, that with the wait weighed
 * 4x, shortest expected delay. */
#define SIM_ORACLE_RULES 3

typedef struct {
    double ttft_p50, ttft_p99; /* seconds, client's view (gateway queue included) */
    double e2e_p50, e2e_p99;
    double ttft_mean;
    double ttft_p50_se, ttft_p99_se; /* their standard errors, by batch means: the
                                        quantile of each tenth of the measured requests,
                                        in the order they ended (busy periods make
                                        neighbours alike: they are not independent) */
    double cold_ttft_p99;            /* over the warm-up's requests alone: the cold start */
    int measured;                    /* requests measured (a refused one as the queue timeout) */
    int failed;                      /* answered with an error (after any retries) */
    int rejected;                    /* the gateway queue was full or timed out */
    double span_s;                   /* virtual seconds the run took */
    int sent[SIM_MAX_UP];            /* attempts sent to each upstream */
    int late_sent[SIM_MAX_UP];       /* of those, for the second half of the requests */
    int over_limit;                  /* attempts sent to an upstream at its limit while
                                        another eligible one had room (infergate's) */
    double svc_peak[SIM_MAX_UP];     /* the highest service estimate the router held */
    double svc_final[SIM_MAX_UP];    /* and the one it held at the end */
    double c_final[SIM_MAX_UP];      /* the C it held at the end (ig_router_concurrency()) */
    int crowded;                     /* decisions with some eligible upstream at its
                                        limit and another with room */
    uint64_t events;
    /* The measured answers at or over the TTFT p99 (the tail): by the
     * upstream that answered (refused ones in tail_refused), and by the
     * tenth of the measured requests, in the order they ended, they fell
     * in: a tail bunched in one tenth is a transient, not a steady queue. */
    int tail[SIM_MAX_UP], tail_refused;
    int tail_tenth[10];
    /* Each upstream's answers, warm-up included (as the gateway's
     * infergate_upstream_time_to_first_token_seconds counts them): how
     * many, and the sum of their times from the answering attempt's send
     * to its first token (a whole answer: to its end), in seconds. */
    int up_answers[SIM_MAX_UP];
    double up_ttft_sum[SIM_MAX_UP];
    /* The oracle's: each of its rules alone (sim.c's oracle_cost(), in
     * its order), TTFT p50 and p99 and their standard errors; the figures
     * above are the best of them for each metric. */
    double rule_ttft[SIM_ORACLE_RULES][2];
    double rule_ttft_se[SIM_ORACLE_RULES][2];
} sim_result_t;

/* Runs the fleet under one policy. 0, or -1 when out of memory. */
int sim_run(const sim_fleet_t *f, sim_policy_t policy, const sim_config_t *c, sim_result_t *out);

#endif
