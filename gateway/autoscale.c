/*
 * The autoscaler's decision function (see include/infergate/autoscale.h).
 */
#include "infergate/autoscale.h"

#include <math.h>
#include <string.h>

#define NS 1e9

void ig_autoscale_params_default(ig_autoscale_params_t *p)
{
    p->target_queue_depth = 4;
    p->stable_window_s = 60;
    p->panic_window_s = 6;
    p->panic_threshold = 2.0;
    p->max_scale_up_rate = 2.0;
    p->scale_down_delay_s = 30;
    p->scale_to_zero_after_s = 300;
    p->min_instances = 1;
    p->max_instances = 1;
}

void ig_autoscaler_init(ig_autoscaler_t *as, const ig_autoscale_params_t *p)
{
    memset(as, 0, sizeof(*as));
    as->p = *p;
    if (as->p.target_queue_depth <= 0)
        as->p.target_queue_depth = 1;
}

static void ring_push(ig_autoscale_sample_t *ring, int *head, int *n, uint64_t t, double v)
{
    int i = (*head + *n) % IG_AUTOSCALE_SAMPLES;
    if (*n == IG_AUTOSCALE_SAMPLES)
        *head = (*head + 1) % IG_AUTOSCALE_SAMPLES; /* overwrite the oldest */
    else
        (*n)++;
    ring[i].t_ns = t;
    ring[i].load = v;
}

/* Drops entries older than the window. */
static void ring_trim(ig_autoscale_sample_t *ring, int *head, int *n, uint64_t now, double win_s)
{
    uint64_t win = (uint64_t)(win_s * NS);
    while (*n > 0 && now > ring[*head].t_ns + win) {
        *head = (*head + 1) % IG_AUTOSCALE_SAMPLES;
        (*n)--;
    }
}

void ig_autoscaler_sample(ig_autoscaler_t *as, uint64_t now_ns, double load)
{
    if (as->first_ns == 0)
        as->first_ns = now_ns;
    if (load > 0)
        as->last_load_ns = now_ns;
    ring_push(as->samples, &as->head, &as->n, now_ns, load);
    double keep = fmax(as->p.stable_window_s, as->p.panic_window_s);
    ring_trim(as->samples, &as->head, &as->n, now_ns, keep);
}

/* Mean load over the last win_s seconds; 0 with no samples. */
static double mean_over(const ig_autoscaler_t *as, uint64_t now, double win_s)
{
    uint64_t win = (uint64_t)(win_s * NS);
    double sum = 0;
    int cnt = 0;
    for (int k = 0; k < as->n; k++) {
        const ig_autoscale_sample_t *s = &as->samples[(as->head + k) % IG_AUTOSCALE_SAMPLES];
        if (s->t_ns + win >= now) {
            sum += s->load;
            cnt++;
        }
    }
    return cnt ? sum / cnt : 0;
}

const char *ig_scale_direction_name(ig_scale_direction_t d)
{
    return d == IG_SCALE_UP ? "up" : d == IG_SCALE_DOWN ? "down" : "none";
}

ig_scale_decision_t ig_autoscaler_decide(ig_autoscaler_t *as, uint64_t now, int current, int ready,
                                         int free_devices)
{
    const ig_autoscale_params_t *p = &as->p;
    ig_scale_decision_t d;
    memset(&d, 0, sizeof(d));
    d.stable_load = mean_over(as, now, p->stable_window_s);
    d.panic_load = mean_over(as, now, p->panic_window_s);
    int want_stable = (int)ceil(d.stable_load / p->target_queue_depth - 1e-9);
    int want_panic = (int)ceil(d.panic_load / p->target_queue_depth - 1e-9);
    d.reason = "stable";

    /* Panic: the short window asks for a multiple of what serves now. */
    int base = ready > 0 ? ready : (current > 0 ? current : 1);
    if (want_panic >= p->panic_threshold * base && want_panic > current) {
        if (as->panic_until_ns == 0)
            d.reason = "panic";
        as->panic_until_ns = now + (uint64_t)(p->stable_window_s * NS);
    } else if (as->panic_until_ns != 0 && now >= as->panic_until_ns) {
        as->panic_until_ns = 0;
    }
    int want;
    if (as->panic_until_ns != 0) {
        d.panic = 1;
        d.reason = "panic";
        want = want_panic > want_stable ? want_panic : want_stable;
        if (want < current)
            want = current; /* panic never scales down */
    } else {
        want = want_stable;
    }
    /* Some load always needs one instance; none at all for long enough
     * lets the pool go to zero. */
    if (want == 0 && d.panic_load > 0)
        want = 1;
    if (want == 0 && p->min_instances == 0) {
        double idle = as->last_load_ns ? (double)(now - as->last_load_ns) / NS
                                       : (double)(now - as->first_ns) / NS;
        if (idle < p->scale_to_zero_after_s)
            want = current > 0 ? 1 : 0;
        else if (current > 0)
            d.reason = "idle_to_zero";
    }
    d.raw = want;

    /* Scale-down delay: act on the highest want of the recent past. */
    ring_push(as->desired, &as->dhead, &as->dn, now, want);
    ring_trim(as->desired, &as->dhead, &as->dn, now, p->scale_down_delay_s);
    if (want < current) {
        int peak = want;
        for (int k = 0; k < as->dn; k++) {
            int v = (int)as->desired[(as->dhead + k) % IG_AUTOSCALE_SAMPLES].load;
            if (v > peak)
                peak = v;
        }
        if (peak > want) {
            want = peak < current ? peak : current;
            d.reason = "scale_down_delay";
        }
    }
    /* Rate limit of growth, then the bounds. */
    if (want > current) {
        int cap = (int)ceil((ready > 0 ? ready : 1) * p->max_scale_up_rate);
        if (cap < 1)
            cap = 1;
        if (want > cap && cap > current) {
            want = cap;
            d.reason = "rate_limit";
        }
    }
    if (want > p->max_instances) {
        want = p->max_instances;
        d.reason = "max_instances";
    }
    if (want < p->min_instances) {
        want = p->min_instances;
        d.reason = "min_instances";
    }
    if (want > current + free_devices) {
        want = current + free_devices;
        d.reason = "no_free_device";
    }
    d.desired = want;
    d.direction = want > current ? IG_SCALE_UP : want < current ? IG_SCALE_DOWN : IG_SCALE_NONE;
    if (d.direction == IG_SCALE_NONE && strcmp(d.reason, "stable") == 0)
        d.reason = "steady";
    return d;
}
