/*
 * The random fleet generator: a fleet from a seed alone, drawn from the
 * ranges an operator meets (docs/routing.md, "The simulator"). A fleet is
 * one to three kinds of upstream (replicas of one kind are identical but
 * for their network and their incidents), 2-16 upstreams in all.
 */
#include "sim.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    uint64_t s;
} rng_t;

static double uni(rng_t *r)
{
    uint64_t x = (r->s += 0x9e3779b97f4a7c15ULL);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return ((double)(x >> 11) + 0.5) / 9007199254740992.0;
}

static double loguni(rng_t *r, double lo, double hi)
{
    return lo * exp(uni(r) * log(hi / lo));
}

static int inti(rng_t *r, int lo, int hi)
{
    return lo + (int)(uni(r) * (hi - lo + 1));
}

void sim_fleet_generate(uint64_t seed, sim_fleet_t *f)
{
    rng_t r = {seed * 0x2545F4914F6CDD1DULL + 7};
    memset(f, 0, sizeof(*f));
    f->seed = seed;
    f->n = inti(&r, 2, SIM_MAX_UP);
    f->stream = uni(&r) < 0.5;
    f->prompt_mean = loguni(&r, 32, 1024);
    f->output_mean = loguni(&r, 16, 256);
    f->token_sigma = 0.5;
    sim_upstream_t kinds[3];
    int nkinds = inti(&r, 1, 3);
    for (int k = 0; k < nkinds; k++) {
        sim_upstream_t *u = &kinds[k];
        memset(u, 0, sizeof(*u));
        u->slots = 1 << inti(&r, 0, 6);
        u->decode_s_tok = loguni(&r, 0.005, 0.05);
        u->prefill_s_tok = u->decode_s_tok / loguni(&r, 10, 100);
        u->ttft0_s = loguni(&r, 0.005, 0.05);
        u->batch_slow = u->slots > 1 ? uni(&r) * 1.5 : 0;
        u->dist = (sim_dist_t)inti(&r, 0, 2);
        u->reports_load = uni(&r) < 0.5;
    }
    for (int i = 0; i < f->n; i++) {
        sim_upstream_t *u = &f->up[i];
        *u = kinds[inti(&r, 0, nkinds - 1)];
        u->rtt_s = uni(&r) < 0.5 ? 0.0002 : loguni(&r, 0.001, 0.1);
        if (uni(&r) < 0.15) {
            u->shift_at = 0.3 + 0.4 * uni(&r);
            u->shift_factor = loguni(&r, 0.4, 2.5);
        }
        if (uni(&r) < 0.1) {
            u->stall_at = 0.2 + 0.6 * uni(&r);
            u->stall_s = loguni(&r, 0.5, 3);
        }
        if (uni(&r) < 0.05) {
            u->fail_at = 0.2 + 0.6 * uni(&r);
            u->fail_s = loguni(&r, 1, 10);
        }
    }
}

double sim_fleet_capacity(const sim_fleet_t *f)
{
    double cap = 0;
    for (int i = 0; i < f->n; i++) {
        const sim_upstream_t *u = &f->up[i];
        double hold =
            (u->ttft0_s + f->prompt_mean * u->prefill_s_tok + f->output_mean * u->decode_s_tok) *
            (1.0 + (u->slots > 1 ? u->batch_slow : 0));
        if (u->shift_factor > 1)
            hold *= u->shift_factor;
        cap += u->slots / hold;
    }
    return cap;
}

static const char *dist_name(sim_dist_t d)
{
    static const char *names[] = {"exp", "lognormal", "bimodal", "fixed"};
    return names[d];
}

void sim_fleet_describe(const sim_fleet_t *f, char *buf, int len)
{
    int off = snprintf(buf, len, "fleet %llu: %d upstreams, %s, prompt %.0f, output %.0f tokens\n",
                       (unsigned long long)f->seed, f->n, f->stream ? "streamed" : "not streamed",
                       f->prompt_mean, f->output_mean);
    for (int i = 0; i < f->n && off > 0 && off < len; i++) {
        const sim_upstream_t *u = &f->up[i];
        off += snprintf(buf + off, len - off,
                        "  u%-2d slots %2d rtt %5.1f ms ttft0 %4.1f ms prefill %.2f ms/tok "
                        "decode %4.1f ms/tok batch +%.0f%% %-9s %s",
                        i, u->slots, u->rtt_s * 1e3, u->ttft0_s * 1e3, u->prefill_s_tok * 1e3,
                        u->decode_s_tok * 1e3, u->batch_slow * 100, dist_name(u->dist),
                        u->reports_load ? "/load" : "-");
        if (off > 0 && off < len && u->shift_factor > 0)
            off += snprintf(buf + off, len - off, " shift x%.2f at %.0f%%", u->shift_factor,
                            u->shift_at * 100);
        if (off > 0 && off < len && u->stall_s > 0)
            off += snprintf(buf + off, len - off, " stall %.1fs at %.0f%%", u->stall_s,
                            u->stall_at * 100);
        if (off > 0 && off < len && u->fail_s > 0)
            off += snprintf(buf + off, len - off, " fail %.1fs at %.0f%%", u->fail_s,
                            u->fail_at * 100);
        if (off > 0 && off < len)
            off += snprintf(buf + off, len - off, "\n");
    }
}
