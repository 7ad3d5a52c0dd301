/*
 * routing-sim: runs the policies over random fleets in virtual time and
 * prints, per policy, how its TTFT and e2e percentiles compare with the
 * best baseline's in each cell (one fleet at one load), and the issue's
 * targets for the latency policy. Same arguments, same output.
 *
 * usage: routing-sim [--fleets N] [--seed S] [--loads 0.5,0.7,0.9]
 *                    [--requests N] [--policies a,b,...] [--set opt=value]...
 *                    [--jobs N] [--json FILE] [--describe SEED] [--cells]
 *                    [--reuse FILE]
 *        routing-sim --shape NAME:SLOTS:MEAN_MS:RTT_MS[:LATER_MS],... [--loads ...]
 *                    [--requests N]
 *        routing-sim --peers SEED [--loads L] [--rate RPS] [--span WARMUP,DURATION]
 *                    [--draws N]
 *        routing-sim --testupstream SEED
 *
 * --reuse keeps the peers' and the oracle's results (they do not depend on
 * the router's options) in FILE and reads them back when the same fleets,
 * loads, requests and seed are asked for again: for design runs that vary
 * --set alone. --rerun a,b,... names the policies a reuse runs again (the
 * infergate ones unless given): `--rerun latency` for a change to the
 * latency pick alone.
 */
#include "sim.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_LOADS 8
#define NMETRIC 4

static const char *metric_names[NMETRIC] = {"ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99"};

static double metric_of(const sim_result_t *r, int m)
{
    switch (m) {
    case 0:
        return r->ttft_p50;
    case 1:
        return r->ttft_p99;
    case 2:
        return r->e2e_p50;
    default:
        return r->e2e_p99;
    }
}

static int is_baseline(sim_policy_t p)
{
    return p != SIM_LATENCY && p != SIM_ORACLE;
}

/* A router option by name, for design runs (--set tail_weight=0). */
static int set_opt(ig_router_opts_t *o, const char *kv)
{
    const char *eq = strchr(kv, '=');
    if (eq == NULL)
        return -1;
    double v = atof(eq + 1);
    size_t n = (size_t)(eq - kv);
#define OPT(name)                                                                                  \
    if (n == strlen(#name) && strncmp(kv, #name, n) == 0) {                                        \
        o->name = v;                                                                               \
        return 0;                                                                                  \
    }
    OPT(ewma_tau_s)
    OPT(hot_quantile)
    OPT(tail_weight)
    OPT(explore_ratio)
    OPT(rtt_probe_s)
    OPT(limit_initial)
    OPT(limit_max)
    OPT(limit_min)
    OPT(prior_prefill_tps)
#undef OPT
    return -1;
}

/* The oracle's rules, in sim.c's order (oracle_cost()). */
static const char *oracle_rule_names[SIM_ORACLE_RULES] = {"expected TTFT", "the wait weighed 4x",
                                                          "shortest expected delay"};

/* The result of the best baseline of cell c at TTFT p50 (m 0) or p99 (m 1). */
static const sim_result_t *best_of(const sim_result_t *res, const int *use, int c, int m)
{
    const sim_result_t *b = NULL;
    for (int p = 0; p < SIM_NPOLICIES; p++) {
        const sim_result_t *r = &res[(size_t)c * SIM_NPOLICIES + p];
        if (use[p] && is_baseline((sim_policy_t)p) &&
            (b == NULL || metric_of(r, m) < metric_of(b, m)))
            b = r;
    }
    return b;
}

/* Whether x's TTFT quantile (m 0: p50, 1: p99) is above k times b's by
 * more than two standard errors of the difference (batch means): a loss
 * that is not the run's chance. None without a baseline (b NULL: the run
 * asked for no baseline policy). */
static int beyond_noise(const sim_result_t *x, const sim_result_t *b, int m, double k)
{
    if (b == NULL)
        return 0;
    double xv = metric_of(x, m), bv = metric_of(b, m);
    double xs = m == 0 ? x->ttft_p50_se : x->ttft_p99_se;
    double bs = m == 0 ? b->ttft_p50_se : b->ttft_p99_se;
    return xv - k * bv > 2.0 * sqrt(xs * xs + k * k * bs * bs);
}

static double pct(double *v, int n, double q)
{
    if (n == 0)
        return NAN;
    int k = (int)ceil(q * n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* bench/routing-foreign.sh's fleet shapes, for comparing the simulation
 * with its socket runs: exponential service of MEAN_MS (LATER_MS from half
 * 7/11 of the way: its 3 s warm-up and half its 8 s), SLOTS places, RTT_MS,
 * no /load, no batch slowdown, streamed with
 * the first token at the end of the service (testupstream's --delay-ms).
 * Prints p50/p99 TTFT per policy and load. */
static int run_shape(const char *spec, const double *loads, int nloads, const sim_config_t *cfg)
{
    sim_fleet_t f;
    memset(&f, 0, sizeof(f));
    f.stream = 1;
    f.prompt_mean = f.output_mean = 1;
    char *dup = strdup(spec), *save = NULL;
    for (char *t = strtok_r(dup, ",", &save); t && f.n < SIM_MAX_UP;
         t = strtok_r(NULL, ",", &save)) {
        char name[64];
        int slots;
        double mean, rtt, later = 0;
        if (sscanf(t, "%63[^:]:%d:%lf:%lf:%lf", name, &slots, &mean, &rtt, &later) < 4 ||
            slots < 1 || slots > 64 || !(mean > 0)) {
            fprintf(stderr, "routing-sim: bad shape entry %s\n", t);
            free(dup);
            return 2;
        }
        sim_upstream_t *u = &f.up[f.n++];
        u->slots = slots;
        u->ttft0_s = mean / 1e3;
        u->rtt_s = rtt > 0 ? rtt / 1e3 : 0.0002;
        u->dist = SIM_DIST_EXP;
        if (later > 0) {
            u->shift_at = 7.0 / 11; /* routing-foreign: 3 s warm-up, then 8 s */
            u->shift_factor = later / mean;
        }
    }
    free(dup);
    printf("%-15s %5s %9s %9s\n", "policy", "load", "p50 ms", "p99 ms");
    for (int l = 0; l < nloads; l++)
        for (int p = 0; p < SIM_NPOLICIES; p++) {
            sim_config_t c = *cfg;
            c.load = loads[l];
            c.warmup = 3.0 / 11; /* its warm-up is not measured either */
            sim_result_t r;
            if (sim_run(&f, (sim_policy_t)p, &c, &r) != 0)
                return 1;
            printf("%-15s %5.2f %9.2f %9.2f\n", sim_policy_name((sim_policy_t)p), loads[l],
                   r.ttft_p50 * 1e3, r.ttft_p99 * 1e3);
        }
    return 0;
}

/* The fleet of SEED as testupstream can run it: each upstream's delay is
 * the TTFT of the mean prompt, spread by the fleet's distribution (a
 * lognormal one becomes exponential), its tokens come at a fixed gap and a
 * shift slows the delay alone; no batch slowdown, no failure windows. */
static void testupstream_fleet(uint64_t seed, sim_fleet_t *f)
{
    sim_fleet_generate(seed, f);
    for (int i = 0; i < f->n; i++) {
        sim_upstream_t *u = &f->up[i];
        u->ttft0_s += f->prompt_mean * u->prefill_s_tok;
        u->prefill_s_tok = 0;
        u->batch_slow = 0;
        u->fixed_decode = 1;
        u->fail_at = u->fail_s = 0;
        if (u->dist == SIM_DIST_LOGNORMAL)
            u->dist = SIM_DIST_EXP;
    }
    f->output_mean = fmax(1, round(f->output_mean));
    f->token_sigma = 0;
}

/* Requests a second a testupstream fleet completes with every slot busy
 * (the slower speed of a shift). */
static double testupstream_capacity(const sim_fleet_t *f)
{
    double cap = 0;
    for (int i = 0; i < f->n; i++) {
        const sim_upstream_t *u = &f->up[i];
        cap += u->slots /
               (u->ttft0_s * fmax(1.0, u->shift_factor) + (f->output_mean - 1) * u->decode_s_tok);
    }
    return cap;
}

/* One fleet as bench/routing-peers.sh starts it with testupstream, one
 * upstream a line: NAME SLOTS RTT_MS DELAY_SPEC ITL_MS TOKENS REPORT_LOAD
 * LATER_DELAY_SPEC|- CHANGE_SHARE STALL_SHARE STALL_MS; then "stream S"
 * and "capacity RPS". */
static void print_testupstream(uint64_t seed)
{
    sim_fleet_t f;
    testupstream_fleet(seed, &f);
    for (int i = 0; i < f.n; i++) {
        const sim_upstream_t *u = &f.up[i];
        double mean = u->ttft0_s * 1e3;
        char spec[96], later[96] = "-";
        if (u->dist == SIM_DIST_BIMODAL)
            snprintf(spec, sizeof(spec), "choice:%.2f@0.9,%.2f@0.1", 0.5 * mean, 5.5 * mean);
        else
            snprintf(spec, sizeof(spec), "exp:%.2f", mean);
        if (u->shift_factor > 0)
            snprintf(later, sizeof(later), "exp:%.2f", mean * u->shift_factor);
        printf("u%d %d %.2f %s %.3f %d %d %s %.3f %.3f %.0f\n", i, u->slots, u->rtt_s * 1e3, spec,
               u->decode_s_tok * 1e3, (int)f.output_mean, u->reports_load, later, u->shift_at,
               u->stall_at, u->stall_s * 1e3);
    }
    printf("stream %d\ncapacity %.1f\n", f.stream, testupstream_capacity(&f));
}

/* The runs of bench/routing-peers.sh (fleet SEED at LOAD of its capacity,
 * its times divided so that it needs RATE requests a second, answers cut to
 * 16 tokens at a stretched gap, WARMUP + DURATION seconds of Poisson
 * arrivals, the gateway queue of its config), simulated DRAWS times with
 * other arrivals and draws, for each mode and policy: the median TTFT p50
 * and p99 over the draws and their 10th and 90th percentiles, in ms,
 * each upstream's share of the attempts over all draws, and each one's
 * mean time from an answering attempt's send to its first token, warm-up
 * included (as the gateway's per-upstream histogram). What a socket run of
 * that cell lands in, when the simulator is right. */
static int run_peers(uint64_t seed, double load, double rate, double warmup, double duration,
                     int draws)
{
    sim_fleet_t f;
    testupstream_fleet(seed, &f);
    double scale = rate / (testupstream_capacity(&f) * load);
    int cut = (int)fmin(f.output_mean, 16);
    double stretch = cut > 1 ? (f.output_mean - 1) / (cut - 1) : 1;
    for (int i = 0; i < f.n; i++) {
        sim_upstream_t *u = &f.up[i];
        u->ttft0_s /= scale;
        u->decode_s_tok = u->decode_s_tok / scale * stretch;
        u->rtt_s = u->rtt_s / scale >= 0.0005 ? u->rtt_s / scale : 0.0001; /* no faultproxy */
        u->stall_s /= scale;
    }
    f.output_mean = cut;
    sim_config_t c;
    sim_config_default(&c);
    c.requests = (int)round(rate * (warmup + duration));
    c.warmup = warmup / (warmup + duration);
    c.queue_size = 4096;
    c.load = rate / sim_fleet_capacity(&f);
    if (c.requests < 10)
        return 2;
    double *v = malloc(sizeof(double) * 2 * (size_t)draws);
    if (v == NULL)
        return 1;
    printf("%-9s %-15s %8s %8s %8s %8s %8s %8s %s %s\n", "mode", "policy", "p50", "p50_lo",
           "p50_hi", "p99", "p99_lo", "p99_hi", "sent", "upstream_ttft_mean");
    for (int stream = 1; stream >= 0; stream--) {
        f.stream = stream;
        for (int p = 0; p < SIM_NPOLICIES; p++) {
            if (p == SIM_ORACLE)
                continue;
            double sent[SIM_MAX_UP] = {0}, all = 0, own[SIM_MAX_UP] = {0},
                   answers[SIM_MAX_UP] = {0};
            for (int k = 0; k < draws; k++) {
                sim_result_t r;
                c.seed = 1 + (uint64_t)k;
                if (sim_run(&f, (sim_policy_t)p, &c, &r) != 0) {
                    free(v);
                    return 1;
                }
                v[k] = r.ttft_p50 * 1e3;
                v[draws + k] = r.ttft_p99 * 1e3;
                for (int u = 0; u < f.n; u++) {
                    sent[u] += r.sent[u];
                    all += r.sent[u];
                    own[u] += r.up_ttft_sum[u];
                    answers[u] += r.up_answers[u];
                }
            }
            qsort(v, (size_t)draws, sizeof(double), cmpd);
            qsort(v + draws, (size_t)draws, sizeof(double), cmpd);
            printf("%-9s %-15s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f ",
                   stream ? "stream" : "nonstream", sim_policy_name((sim_policy_t)p),
                   pct(v, draws, 0.5), pct(v, draws, 0.1), pct(v, draws, 0.9),
                   pct(v + draws, draws, 0.5), pct(v + draws, draws, 0.1),
                   pct(v + draws, draws, 0.9));
            for (int u = 0; u < f.n; u++)
                printf("%s%.3f", u ? "," : "", all > 0 ? sent[u] / all : 0);
            printf(" ");
            for (int u = 0; u < f.n; u++)
                printf("%s%.2f", u ? "," : "", answers[u] > 0 ? own[u] / answers[u] * 1e3 : 0);
            printf("\n");
        }
    }
    free(v);
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: routing-sim [--fleets N] [--seed S] [--loads 0.5,0.7,0.9] "
                    "[--requests N]\n"
                    "                   [--policies a,b,...] [--set opt=value]... [--jobs N]\n"
                    "                   [--json FILE] [--describe SEED] [--cells]\n"
                    "       routing-sim --shape NAME:SLOTS:MEAN_MS:RTT_MS[:LATER_MS],...\n"
                    "       routing-sim --peers SEED [--loads L] [--rate RPS] "
                    "[--span WARMUP,DURATION] [--draws N]\n"
                    "       routing-sim --testupstream SEED\n");
}

int main(int argc, char **argv)
{
    int nfleets = 200, jobs = 1, show_cells = 0, first = 0, rep = 0;
    uint64_t seed = 1;
    double loads[MAX_LOADS] = {0.5, 0.7, 0.9};
    int nloads = 3;
    const char *json_path = NULL, *reuse_path = NULL, *shape = NULL, *rerun = NULL;
    /* --peers: bench/routing-peers.sh's defaults */
    const char *peers = NULL;
    double peers_rate = 150, peers_warmup = 3, peers_duration = 10;
    int peers_draws = 20;
    sim_config_t cfg;
    sim_config_default(&cfg);
    cfg.requests = 10000;
    int use[SIM_NPOLICIES];
    for (int p = 0; p < SIM_NPOLICIES; p++)
        use[p] = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--fleets") == 0 && v) {
            nfleets = atoi(v);
            i++;
        } else if (strcmp(a, "--seed") == 0 && v) {
            seed = strtoull(v, NULL, 10);
            i++;
        } else if (strcmp(a, "--requests") == 0 && v) {
            cfg.requests = atoi(v);
            i++;
        } else if (strcmp(a, "--jobs") == 0 && v) {
            jobs = atoi(v);
            i++;
        } else if (strcmp(a, "--json") == 0 && v) {
            json_path = v;
            i++;
        } else if (strcmp(a, "--shape") == 0 && v) {
            shape = v;
            i++;
        } else if (strcmp(a, "--first") == 0 && v) {
            first = atoi(v); /* the fleets first, first + 1, ... */
            i++;
        } else if (strcmp(a, "--reuse") == 0 && v) {
            reuse_path = v;
            i++;
        } else if (strcmp(a, "--rep") == 0 && v) {
            rep = atoi(v); /* other arrivals and draws on the same fleets */
            i++;
        } else if (strcmp(a, "--rerun") == 0 && v) {
            rerun = v;
            i++;
        } else if (strcmp(a, "--cells") == 0) {
            show_cells = 1;
        } else if (strcmp(a, "--sent") == 0) {
            show_cells = 2;
        } else if (strcmp(a, "--loads") == 0 && v) {
            nloads = 0;
            char *dup = strdup(v), *save = NULL;
            for (char *t = strtok_r(dup, ",", &save); t && nloads < MAX_LOADS;
                 t = strtok_r(NULL, ",", &save))
                loads[nloads++] = atof(t);
            free(dup);
            i++;
        } else if (strcmp(a, "--policies") == 0 && v) {
            for (int p = 0; p < SIM_NPOLICIES; p++)
                use[p] = 0;
            char *dup = strdup(v), *save = NULL;
            for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                sim_policy_t p;
                if (sim_policy_parse(t, &p) != 0) {
                    fprintf(stderr, "unknown policy %s\n", t);
                    return 2;
                }
                use[p] = 1;
            }
            free(dup);
            i++;
        } else if (strcmp(a, "--set") == 0 && v) {
            if (set_opt(&cfg.router, v) != 0) {
                fprintf(stderr, "unknown option %s\n", v);
                return 2;
            }
            i++;
        } else if (strcmp(a, "--peers") == 0 && v) {
            peers = v;
            i++;
        } else if (strcmp(a, "--rate") == 0 && v) {
            peers_rate = atof(v);
            i++;
        } else if (strcmp(a, "--span") == 0 && v) {
            if (sscanf(v, "%lf,%lf", &peers_warmup, &peers_duration) != 2)
                peers_duration = 0;
            i++;
        } else if (strcmp(a, "--draws") == 0 && v) {
            peers_draws = atoi(v);
            i++;
        } else if (strcmp(a, "--testupstream") == 0 && v) {
            print_testupstream(strtoull(v, NULL, 10));
            return 0;
        } else if (strcmp(a, "--describe") == 0 && v) {
            sim_fleet_t f;
            char buf[8192];
            sim_fleet_generate(strtoull(v, NULL, 10), &f);
            sim_fleet_describe(&f, buf, sizeof(buf));
            printf("%scapacity %.1f requests/s\n", buf, sim_fleet_capacity(&f));
            return 0;
        } else {
            usage();
            return 2;
        }
    }
    if (shape != NULL)
        return run_shape(shape, loads, nloads, &cfg);
    if (peers != NULL) {
        if (!(peers_rate > 0) || !(peers_duration > 0) || !(peers_warmup >= 0) || peers_draws < 1 ||
            !(loads[0] > 0)) {
            usage();
            return 2;
        }
        return run_peers(strtoull(peers, NULL, 10), loads[0], peers_rate, peers_warmup,
                         peers_duration, peers_draws);
    }
    if (nfleets < 1 || cfg.requests < 100 || jobs < 1) {
        usage();
        return 2;
    }
    int ncells = nfleets * nloads;
    sim_result_t *res = calloc((size_t)ncells * SIM_NPOLICIES, sizeof(sim_result_t));
    if (res == NULL)
        return 1;

    /* Results kept from an earlier run of the same cells. */
    int reused = 0;
    double key[MAX_LOADS + 4] = {nfleets + 1e6 * first, nloads + 100.0 * sizeof(sim_result_t),
                                 cfg.requests, (double)seed + 1e9 * rep};
    for (int l = 0; l < nloads; l++)
        key[4 + l] = loads[l];
    if (reuse_path != NULL) {
        FILE *rf = fopen(reuse_path, "rb");
        double k2[MAX_LOADS + 4];
        if (rf != NULL && fread(k2, sizeof(k2), 1, rf) == 1 && memcmp(k2, key, sizeof(key)) == 0 &&
            fread(res, sizeof(sim_result_t), (size_t)ncells * SIM_NPOLICIES, rf) ==
                (size_t)ncells * SIM_NPOLICIES)
            reused = 1;
        if (rf != NULL)
            fclose(rf);
    }
    int run[SIM_NPOLICIES];
    for (int p = 0; p < SIM_NPOLICIES; p++)
        run[p] = use[p] && (!reused || (rerun == NULL && sim_policy_is_infergate((sim_policy_t)p)));
    if (reused && rerun != NULL) {
        char *dup = strdup(rerun), *save = NULL;
        for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            sim_policy_t p;
            if (sim_policy_parse(t, &p) != 0) {
                fprintf(stderr, "unknown policy %s\n", t);
                return 2;
            }
            run[p] = use[p];
        }
        free(dup);
    }

    /* Cells are split over jobs worker processes, each writing its results
     * to a pipe in cell order: the output does not depend on jobs. */
    int(*pipes)[2] = calloc(jobs, sizeof(int[2]));
    pid_t *pids = calloc(jobs, sizeof(pid_t));
    for (int j = 0; j < jobs; j++) {
        if (pipe(pipes[j]) != 0 || (pids[j] = fork()) < 0) {
            perror("routing-sim");
            return 1;
        }
        if (pids[j] == 0) {
            close(pipes[j][0]);
            for (int c = j; c < ncells; c += jobs) {
                sim_fleet_t f;
                sim_fleet_generate(seed * 100003ULL + (uint64_t)(first + c / nloads), &f);
                sim_config_t cc = cfg;
                cc.load = loads[c % nloads];
                cc.seed =
                    seed * 7919ULL + (uint64_t)(first * nloads + c) + 1000003ULL * (uint64_t)rep;
                for (int p = 0; p < SIM_NPOLICIES; p++) {
                    sim_result_t r;
                    memset(&r, 0, sizeof(r));
                    if (!run[p])
                        continue;
                    if (sim_run(&f, (sim_policy_t)p, &cc, &r) != 0)
                        _exit(1);
                    if (write(pipes[j][1], &r, sizeof(r)) != (ssize_t)sizeof(r))
                        _exit(1);
                }
            }
            _exit(0);
        }
        close(pipes[j][1]);
    }
    for (int j = 0; j < jobs; j++) {
        for (int c = j; c < ncells; c += jobs)
            for (int p = 0; p < SIM_NPOLICIES; p++) {
                if (!run[p])
                    continue;
                char *dst = (char *)&res[(size_t)c * SIM_NPOLICIES + p];
                size_t got = 0;
                while (got < sizeof(sim_result_t)) {
                    ssize_t k = read(pipes[j][0], dst + got, sizeof(sim_result_t) - got);
                    if (k <= 0) {
                        fprintf(stderr, "routing-sim: a worker failed\n");
                        return 1;
                    }
                    got += (size_t)k;
                }
            }
        close(pipes[j][0]);
        int st;
        waitpid(pids[j], &st, 0);
    }

    if (reuse_path != NULL && !reused) {
        FILE *rf = fopen(reuse_path, "wb");
        double k2[MAX_LOADS + 4] = {0};
        memcpy(k2, key, sizeof(key));
        if (rf == NULL || fwrite(k2, sizeof(k2), 1, rf) != 1 ||
            fwrite(res, sizeof(sim_result_t), (size_t)ncells * SIM_NPOLICIES, rf) !=
                (size_t)ncells * SIM_NPOLICIES)
            fprintf(stderr, "routing-sim: cannot write %s\n", reuse_path);
        if (rf != NULL)
            fclose(rf);
    }

    /* Ratios to the best baseline of each cell, per metric. */
    double *ratio = calloc((size_t)ncells * SIM_NPOLICIES * NMETRIC, sizeof(double));
    double *best = calloc((size_t)ncells * NMETRIC, sizeof(double));
    for (int c = 0; c < ncells; c++)
        for (int m = 0; m < NMETRIC; m++) {
            double b = INFINITY;
            for (int p = 0; p < SIM_NPOLICIES; p++)
                if (use[p] && is_baseline((sim_policy_t)p))
                    b = fmin(b, metric_of(&res[(size_t)c * SIM_NPOLICIES + p], m));
            best[c * NMETRIC + m] = b;
            for (int p = 0; p < SIM_NPOLICIES; p++)
                ratio[((size_t)c * SIM_NPOLICIES + p) * NMETRIC + m] =
                    metric_of(&res[(size_t)c * SIM_NPOLICIES + p], m) / b;
        }
    if (show_cells) {
        printf("%-6s %-5s %-5s", "fleet", "load", "n");
        for (int p = 0; p < SIM_NPOLICIES; p++)
            if (use[p])
                printf(" %14s", sim_policy_name((sim_policy_t)p));
        printf("   (TTFT p99 ms, TTFT p50 ms / ratio to best baseline)\n");
        for (int c = 0; c < ncells; c++) {
            sim_fleet_t f;
            sim_fleet_generate(seed * 100003ULL + (uint64_t)(first + c / nloads), &f);
            printf("%-6d %-5.2f %-5d", first + c / nloads, loads[c % nloads], f.n);
            for (int p = 0; p < SIM_NPOLICIES; p++)
                if (use[p])
                    printf(" %6.0f %4.2fx   ", res[(size_t)c * SIM_NPOLICIES + p].ttft_p99 * 1e3,
                           ratio[((size_t)c * SIM_NPOLICIES + p) * NMETRIC + 1]);
            printf("\n%-17s", "");
            for (int p = 0; p < SIM_NPOLICIES; p++)
                if (use[p])
                    printf(" %6.0f %4.2fx   ", res[(size_t)c * SIM_NPOLICIES + p].ttft_p50 * 1e3,
                           ratio[((size_t)c * SIM_NPOLICIES + p) * NMETRIC + 0]);
            printf("\n");
            if (show_cells > 1)
                for (int p = 0; p < SIM_NPOLICIES; p++) {
                    if (!use[p])
                        continue;
                    const sim_result_t *r = &res[(size_t)c * SIM_NPOLICIES + p];
                    printf("  %-15s sent", sim_policy_name((sim_policy_t)p));
                    for (int u = 0; u < f.n; u++)
                        printf(" %d", r->sent[u]);
                    printf("  failed %d rejected %d\n", r->failed, r->rejected);
                    printf("  %-15s tail", "");
                    for (int u = 0; u < f.n; u++)
                        printf(" %d", r->tail[u]);
                    printf("  refused %d; by tenth", r->tail_refused);
                    for (int k = 0; k < 10; k++)
                        printf(" %d", r->tail_tenth[k]);
                    printf("\n");
                    if (sim_policy_is_infergate((sim_policy_t)p)) {
                        printf("  %-15s C at the end", "");
                        for (int u = 0; u < f.n; u++)
                            printf(" %.2f", r->c_final[u]);
                        printf("\n");
                    }
                }
        }
    }

    printf("routing-sim: %d fleets x %d loads (", nfleets, nloads);
    for (int l = 0; l < nloads; l++)
        printf("%s%.2f", l ? "," : "", loads[l]);
    printf("), %d requests each, seed %llu\n", cfg.requests, (unsigned long long)seed);
    printf("ratio to the best baseline of each cell (the fewest of round_robin, least_inflight,\n"
           "p2c, nginx_lc, haproxy_lc); won = below 1.0; quantiles over the %d cells\n\n",
           ncells);
    printf("%-15s %-9s %6s %6s %6s %6s %6s %6s\n", "policy", "metric", "p10", "p50", "p90", "max",
           "won", "<=1.1");
    double *v = calloc(ncells, sizeof(double));
    for (int p = 0; p < SIM_NPOLICIES; p++) {
        if (!use[p])
            continue;
        for (int m = 0; m < NMETRIC; m++) {
            int won = 0, ok = 0;
            for (int c = 0; c < ncells; c++) {
                v[c] = ratio[((size_t)c * SIM_NPOLICIES + p) * NMETRIC + m];
                won += v[c] < 1.0 - 1e-12;
                ok += v[c] <= 1.1;
            }
            qsort(v, ncells, sizeof(double), cmpd);
            printf("%-15s %-9s %6.2f %6.2f %6.2f %6.2f %5.0f%% %5.0f%%\n",
                   sim_policy_name((sim_policy_t)p), metric_names[m], pct(v, ncells, 0.1),
                   pct(v, ncells, 0.5), pct(v, ncells, 0.9), v[ncells - 1], 100.0 * won / ncells,
                   100.0 * ok / ncells);
        }
    }

    /* The targets for the latency policy. */
    int room = 0, room_ok = 0, p50_ok = 0, p99_bad = 0, oracle_p99_bad = 0, oracle_p50_ok = 0;
    int p99_bad_sig = 0, oracle_bad_sig = 0, p50_lost_sig = 0, room50 = 0, room50_ok = 0;
    int rule_p50_ok[SIM_ORACLE_RULES] = {0}, rule_p99_bad[SIM_ORACLE_RULES] = {0};
    int rule_p99_sig[SIM_ORACLE_RULES] = {0}, rule_p50_sig[SIM_ORACLE_RULES] = {0};
    double worst = 0;
    for (int c = 0; c < ncells; c++) {
        const sim_result_t *lat = &res[(size_t)c * SIM_NPOLICIES + SIM_LATENCY];
        const sim_result_t *orc = &res[(size_t)c * SIM_NPOLICIES + SIM_ORACLE];
        const sim_result_t *b50 = best_of(res, use, c, 0), *b99 = best_of(res, use, c, 1);
        p99_bad_sig += beyond_noise(lat, b99, 1, 1.1);
        oracle_bad_sig += beyond_noise(orc, b99, 1, 1.1);
        p50_lost_sig += beyond_noise(lat, b50, 0, 1.0);
        double lat99 = ratio[((size_t)c * SIM_NPOLICIES + SIM_LATENCY) * NMETRIC + 1];
        double lat50 = ratio[((size_t)c * SIM_NPOLICIES + SIM_LATENCY) * NMETRIC + 0];
        double or99 = ratio[((size_t)c * SIM_NPOLICIES + SIM_ORACLE) * NMETRIC + 1];
        if (use[SIM_ORACLE] && or99 <= 0.8) {
            room++;
            room_ok += lat99 <= 0.9;
        }
        p50_ok += lat50 <= 1.0;
        double or50 = ratio[((size_t)c * SIM_NPOLICIES + SIM_ORACLE) * NMETRIC + 0];
        oracle_p50_ok += or50 <= 1.0;
        if (use[SIM_ORACLE] && or50 <= 0.8) {
            room50++;
            room50_ok += lat50 <= 1.0;
        }
        for (int v = 0; v < SIM_ORACLE_RULES && use[SIM_ORACLE] && b50 != NULL; v++) {
            sim_result_t rule = {0};
            rule.ttft_p50 = orc->rule_ttft[v][0];
            rule.ttft_p99 = orc->rule_ttft[v][1];
            rule.ttft_p50_se = orc->rule_ttft_se[v][0];
            rule.ttft_p99_se = orc->rule_ttft_se[v][1];
            rule_p50_ok[v] += rule.ttft_p50 <= b50->ttft_p50;
            rule_p99_bad[v] += rule.ttft_p99 > 1.1 * b99->ttft_p99;
            rule_p99_sig[v] += beyond_noise(&rule, b99, 1, 1.1);
            rule_p50_sig[v] += beyond_noise(&rule, b50, 0, 1.0);
        }
        p99_bad += lat99 > 1.1;
        oracle_p99_bad += or99 > 1.1;
        worst = fmax(worst, lat99);
    }
    if (use[SIM_LATENCY] && use[SIM_ORACLE]) {
        printf("\ntargets (latency):\n");
        printf("  TTFT p99 <= 0.9x where the oracle reaches <= 0.8x: %d of %d cells (%.0f%%; "
               "target 80%%)\n",
               room_ok, room, room ? 100.0 * room_ok / room : 0.0);
        printf("  cells where the oracle cannot reach 0.8x (every policy ties): %d\n",
               ncells - room);
        printf("  TTFT p99 > 1.1x: %d cells (target 0), worst %.2fx; the oracle's own > 1.1x: %d\n",
               p99_bad, worst, oracle_p99_bad);
        printf("    of those, beyond two standard errors (batch means): %d; the oracle's: %d\n",
               p99_bad_sig, oracle_bad_sig);
        printf("  TTFT p50 <= 1.0x: %d of %d cells (%.0f%%; target 80%%); the oracle's own: %d "
               "(%.0f%%)\n",
               p50_ok, ncells, 100.0 * p50_ok / ncells, oracle_p50_ok,
               100.0 * oracle_p50_ok / ncells);
        printf("    above the best baseline's by more than two standard errors: %d cells\n",
               p50_lost_sig);
        printf("    where the oracle reaches <= 0.8x at p50: %d of %d cells (%.0f%%)\n", room50_ok,
               room50, room50 ? 100.0 * room50_ok / room50 : 0.0);
        printf("  the oracle's rules alone (it takes each metric from the best of them): TTFT "
               "p50 <= 1.0x (beyond the noise above it) / p99 > 1.1x (beyond the noise)\n");
        for (int v = 0; v < SIM_ORACLE_RULES; v++)
            printf("    %-28s %3d (%.0f%%; %d) / %d (%d)\n", oracle_rule_names[v], rule_p50_ok[v],
                   100.0 * rule_p50_ok[v] / ncells, rule_p50_sig[v], rule_p99_bad[v],
                   rule_p99_sig[v]);
        /* Which cells, as fleet@load (the fleet's index as --first takes
         * it): `--fleets 1 --first F --loads L --cells` runs one again. */
        for (int m = 1; m >= 0; m--) {
            printf("  %s beyond the noise:", m ? "TTFT p99 > 1.1x" : "TTFT p50 > 1.0x");
            for (int c = 0; c < ncells; c++) {
                const sim_result_t *lat = &res[(size_t)c * SIM_NPOLICIES + SIM_LATENCY];
                if (beyond_noise(lat, best_of(res, use, c, m), m, m ? 1.1 : 1.0))
                    printf(" %d@%.2f", first + c / nloads, loads[c % nloads]);
            }
            printf("\n");
        }
    }

    /* The cold start: the TTFT p99 of the warm-up's requests (the first
     * share of the run, when every estimate starts from nothing), over
     * the best baseline's. */
    printf("\ncold start (the first %.0f%% of each run's requests, not measured above): TTFT p99 "
           "over the best baseline's, p50 / p90 / max over the cells\n",
           cfg.warmup * 100);
    for (int p = 0; p < SIM_NPOLICIES; p++) {
        if (!use[p] || is_baseline((sim_policy_t)p) || cfg.warmup <= 0)
            continue;
        for (int c = 0; c < ncells; c++) {
            double b = INFINITY;
            for (int q = 0; q < SIM_NPOLICIES; q++)
                if (use[q] && is_baseline((sim_policy_t)q))
                    b = fmin(b, res[(size_t)c * SIM_NPOLICIES + q].cold_ttft_p99);
            v[c] = res[(size_t)c * SIM_NPOLICIES + p].cold_ttft_p99 / b;
        }
        qsort(v, ncells, sizeof(double), cmpd);
        printf("  %-15s %.2f / %.2f / %.2f\n", sim_policy_name((sim_policy_t)p),
               pct(v, ncells, 0.5), pct(v, ncells, 0.9), v[ncells - 1]);
    }

    /* The noise floor: the same targets for least_inflight, a baseline,
     * against the best of the other baselines. A policy no better than the
     * baselines scores about this; the distance from it is the design's. */
    if (use[SIM_LEAST_INFLIGHT] && use[SIM_ORACLE]) {
        int r_room = 0, r_ok = 0, r_bad = 0, r_p50 = 0, r_bad_sig = 0, r_p50_sig = 0;
        for (int c = 0; c < ncells; c++) {
            double b50 = INFINITY, b99 = INFINITY;
            const sim_result_t *b99r = NULL, *b50r = NULL;
            for (int p = 0; p < SIM_NPOLICIES; p++)
                if (use[p] && is_baseline((sim_policy_t)p) && p != SIM_LEAST_INFLIGHT) {
                    const sim_result_t *r = &res[(size_t)c * SIM_NPOLICIES + p];
                    if (r->ttft_p50 < b50)
                        b50r = r;
                    b50 = fmin(b50, r->ttft_p50);
                    if (r->ttft_p99 < b99)
                        b99r = r;
                    b99 = fmin(b99, r->ttft_p99);
                }
            const sim_result_t *li = &res[(size_t)c * SIM_NPOLICIES + SIM_LEAST_INFLIGHT];
            double or99 = res[(size_t)c * SIM_NPOLICIES + SIM_ORACLE].ttft_p99 / b99;
            if (or99 <= 0.8) {
                r_room++;
                r_ok += li->ttft_p99 / b99 <= 0.9;
            }
            r_bad += li->ttft_p99 / b99 > 1.1;
            r_bad_sig += b99r != NULL && beyond_noise(li, b99r, 1, 1.1);
            r_p50 += li->ttft_p50 / b50 <= 1.0;
            r_p50_sig += b50r != NULL && beyond_noise(li, b50r, 0, 1.0);
        }
        printf("the same for least_inflight against the best of the other baselines (the noise "
               "floor):\n  %d of %d (%.0f%%); > 1.1x: %d cells (beyond two standard errors: "
               "%d); p50 <= 1.0x: %d of %d (%.0f%%), above by more than two standard errors: "
               "%d\n",
               r_ok, r_room, r_room ? 100.0 * r_ok / r_room : 0.0, r_bad, r_bad_sig, r_p50, ncells,
               100.0 * r_p50 / ncells, r_p50_sig);
    }

    if (json_path != NULL) {
        FILE *jf = fopen(json_path, "w");
        if (jf == NULL) {
            fprintf(stderr, "routing-sim: %s: %s\n", json_path, strerror(errno));
            return 1;
        }
        fprintf(jf,
                "{\"bench\":\"routing-sim\",\"fleets\":%d,\"requests\":%d,\"seed\":%llu,"
                "\"targets\":{\"room_cells\":%d,\"room_ok\":%d,\"p99_over_1_1\":%d,"
                "\"worst_p99\":%.4f,\"p99_over_1_1_beyond_noise\":%d,\"p50_ok\":%d,"
                "\"p50_lost_beyond_noise\":%d,\"p50_room_cells\":%d,\"p50_room_ok\":%d,"
                "\"cells\":%d,\"oracle_rules\":[",
                nfleets, cfg.requests, (unsigned long long)seed, room, room_ok, p99_bad, worst,
                p99_bad_sig, p50_ok, p50_lost_sig, room50, room50_ok, ncells);
        for (int v = 0; v < SIM_ORACLE_RULES; v++)
            fprintf(jf,
                    "%s{\"rule\":\"%s\",\"p50_ok\":%d,\"p50_lost_beyond_noise\":%d,"
                    "\"p99_over_1_1\":%d,\"p99_over_1_1_beyond_noise\":%d}",
                    v ? "," : "", oracle_rule_names[v], rule_p50_ok[v], rule_p50_sig[v],
                    rule_p99_bad[v], rule_p99_sig[v]);
        fprintf(jf, "]},\"cells\":[");
        for (int c = 0; c < ncells; c++) {
            fprintf(jf, "%s{\"fleet\":%d,\"load\":%.2f", c ? "," : "", c / nloads,
                    loads[c % nloads]);
            for (int p = 0; p < SIM_NPOLICIES; p++) {
                if (!use[p])
                    continue;
                const sim_result_t *r = &res[(size_t)c * SIM_NPOLICIES + p];
                fprintf(jf,
                        ",\"%s\":{\"ttft_p50\":%.6f,\"ttft_p99\":%.6f,\"e2e_p50\":%.6f,"
                        "\"e2e_p99\":%.6f,\"ttft_p50_se\":%.6f,\"ttft_p99_se\":%.6f,"
                        "\"failed\":%d,\"rejected\":%d",
                        sim_policy_name((sim_policy_t)p), r->ttft_p50, r->ttft_p99, r->e2e_p50,
                        r->e2e_p99, r->ttft_p50_se, r->ttft_p99_se, r->failed, r->rejected);
                if (p == SIM_ORACLE) /* each rule's TTFT p50 and p99 */
                    for (int v = 0; v < SIM_ORACLE_RULES; v++)
                        fprintf(jf, "%s[%.6f,%.6f]%s", v ? "," : ",\"rules\":[", r->rule_ttft[v][0],
                                r->rule_ttft[v][1], v == SIM_ORACLE_RULES - 1 ? "]" : "");
                fprintf(jf, "}");
            }
            fprintf(jf, "}");
        }
        fprintf(jf, "]}\n");
        fclose(jf);
    }
    free(v);
    free(ratio);
    free(best);
    free(res);
    free(pipes);
    free(pids);
    return 0;
}
