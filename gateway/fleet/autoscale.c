/*
 * The autoscaler's decision function (see include/infergate/autoscale.h).
 */
#include "infergate/autoscale.h"

#include <math.h>
#include <string.h>

#define NS 1e9

void ig_autoscale_params_default(ig_autoscale_params_t *p)
{
    p->target_queue_depth = IG_AUTOSCALE_DEFAULT_TARGET;
    p->stable_window_s = IG_AUTOSCALE_DEFAULT_STABLE_S;
    p->panic_window_s = IG_AUTOSCALE_DEFAULT_PANIC_S;
    p->panic_threshold = IG_AUTOSCALE_DEFAULT_PANIC_THRESHOLD;
    p->max_scale_up_rate = IG_AUTOSCALE_DEFAULT_MAX_UP_RATE;
    p->max_scale_down_rate = IG_AUTOSCALE_DEFAULT_MAX_DOWN_RATE;
    p->scale_down_delay_s = IG_AUTOSCALE_DEFAULT_DOWN_DELAY_S;
    p->scale_to_zero_after_s = IG_AUTOSCALE_DEFAULT_TO_ZERO_S;
    p->min_instances = 1;
    p->max_instances = 1;
}

void ig_autoscaler_init(ig_autoscaler_t *as, const ig_autoscale_params_t *p)
{
    memset(as, 0, sizeof(*as));
    as->p = *p;
    if (as->p.target_queue_depth <= 0)
        as->p.target_queue_depth = 1;
    if (as->p.max_scale_up_rate < 1)
        as->p.max_scale_up_rate = IG_AUTOSCALE_DEFAULT_MAX_UP_RATE;
    if (as->p.max_scale_down_rate < 1)
        as->p.max_scale_down_rate = IG_AUTOSCALE_DEFAULT_MAX_DOWN_RATE;
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
        if (s->t_ns + win > now) { /* (now - win, now]: win samples a second */
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

void ig_autoscaler_note_request(ig_autoscaler_t *as, uint64_t now_ns)
{
    if (as->first_ns == 0)
        as->first_ns = now_ns;
    as->last_load_ns = now_ns;
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
    d.limit = "none";

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
    /* Some load always needs one instance. */
    if (want == 0 && d.panic_load > 0)
        want = 1;
    /* No demand in the stable window, and min 0: the last instance stays
     * until no request has come for scale_to_zero_after_s, then goes at
     * once (that idle time is the delay; the windows saw only zeros). */
    int to_zero = 0;
    if (want == 0 && p->min_instances == 0 && current > 0) {
        uint64_t since = as->last_load_ns ? as->last_load_ns : as->first_ns;
        double idle = now > since ? (double)(now - since) / NS : 0;
        if (idle >= p->scale_to_zero_after_s) {
            to_zero = 1;
            d.reason = "idle_to_zero";
        } else {
            want = 1;
            d.reason = "idle_hold";
        }
    }
    d.raw = want;

    /* Scale-down delay: act on the highest want of the recent past. */
    ring_push(as->desired, &as->dhead, &as->dn, now, want);
    ring_trim(as->desired, &as->dhead, &as->dn, now, p->scale_down_delay_s);
    if (want < current && !to_zero) {
        int peak = want;
        for (int k = 0; k < as->dn; k++) {
            int v = (int)as->desired[(as->dhead + k) % IG_AUTOSCALE_SAMPLES].load;
            if (v > peak)
                peak = v;
        }
        if (peak > want) {
            want = peak < current ? peak : current;
            d.limit = "scale_down_delay";
        }
        /* At most current / rate gone in one decision (Knative's 2x). */
        int floor_ = (int)floor(current / p->max_scale_down_rate);
        if (want < floor_) {
            want = floor_;
            d.limit = "rate_limit";
        }
    }
    /* Growth: at most ready x rate, counting from one at zero; never a
     * scale-down because of it. */
    if (want > current) {
        double cap_d = ceil((ready > 0 ? ready : 1) * p->max_scale_up_rate);
        int cap = cap_d > 1e6 ? 1000000 : (int)cap_d;
        if (want > cap) {
            want = cap > current ? cap : current;
            d.limit = "rate_limit";
        }
    }
    if (want > p->max_instances) {
        want = p->max_instances;
        d.limit = "max_instances";
    }
    if (want < p->min_instances) {
        want = p->min_instances;
        d.limit = "min_instances";
    }
    if (want > current + free_devices) {
        want = current + free_devices > current ? current + free_devices : current;
        d.limit = "no_free_device";
    }
    d.desired = want;
    d.direction = want > current ? IG_SCALE_UP : want < current ? IG_SCALE_DOWN : IG_SCALE_NONE;
    if (d.direction == IG_SCALE_NONE && strcmp(d.reason, "stable") == 0)
        d.reason = "steady";
    return d;
}

void ig_autoscaler_hold(ig_autoscaler_t *as, uint64_t now_ns, int desired)
{
    if (as->dn > 0) {
        ig_autoscale_sample_t *last =
            &as->desired[(as->dhead + as->dn - 1) % IG_AUTOSCALE_SAMPLES];
        if (last->t_ns == now_ns) {
            if (desired > last->load)
                last->load = desired;
            return;
        }
    }
    ring_push(as->desired, &as->dhead, &as->dn, now_ns, desired);
}

/* ---- cheap capacity first ------------------------------------------------ */

/* Pools of one model beyond these are left to their own decisions. */
#define MAX_MEMBERS 64

int ig_autoscale_cheaper(double a, double b)
{
    if (isnan(a))
        return 0;
    if (isnan(b))
        return 1;
    return a < b;
}

/* Instances whose capacity (target each) holds load, rounded up; a load
 * within a millionth of a whole count is that count. */
static int instances_for(double load, double target)
{
    return load > 1e-9 ? (int)ceil(load / target - 1e-9) : 0;
}

/* The growth the dear pools want is placed in cheaper pools first. */
static void prefer_cheap_out(ig_autoscale_member_t *m, const int *idx, int n, double *absorbed,
                             int *added)
{
    /* Cheapest giver first: a pool's own growth is settled before a
     * dearer pool's load is placed in what it has beyond its own. */
    for (int r = 1; r < n; r++) {
        ig_autoscale_member_t *e = &m[idx[r]];
        int grow = e->desired - added[idx[r]] - e->current;
        if (grow <= 0)
            continue;
        double need = grow * e->target;
        for (int q = 0; q < r && need > 1e-9; q++) {
            ig_autoscale_member_t *c = &m[idx[q]];
            if (!ig_autoscale_cheaper(c->rank, e->rank) || c->desired < c->current)
                continue;
            double spare = c->desired * c->target - c->load - absorbed[idx[q]];
            if (spare > 1e-9) {
                double t = fmin(spare, need);
                absorbed[idx[q]] += t;
                need -= t;
            }
            int room = c->hi - c->desired;
            if (need <= 1e-9 || room <= 0)
                continue;
            int add = instances_for(need, c->target);
            if (add > room)
                add = room;
            c->desired += add;
            added[idx[q]] += add;
            c->reason = "absorb";
            double t = fmin(add * c->target, need);
            absorbed[idx[q]] += t;
            need -= t;
        }
        int keep = instances_for(need, e->target);
        if (keep < grow) {
            e->desired = e->current + keep + added[idx[r]];
            e->limit = "cheaper_pool";
        }
    }
}

/* The shrink a cheap pool wants is taken from dearer pools first. */
static void prefer_cheap_in(ig_autoscale_member_t *m, const int *idx, int n,
                            const double *absorbed)
{
    for (int q = 0; q < n - 1; q++) {
        ig_autoscale_member_t *c = &m[idx[q]];
        if (c->desired >= c->current)
            continue;
        double budget = (c->current - c->desired) * c->target; /* capacity it would shed */
        double carry = c->load;                                /* what it keeps carrying */
        int swapped = 0;
        for (int r = n - 1; r > q && budget > 1e-9; r--) {
            ig_autoscale_member_t *e = &m[idx[r]];
            if (!ig_autoscale_cheaper(c->rank, e->rank) || e->desired > e->current ||
                absorbed[idx[r]] > 0)
                continue;
            int best = 0;
            double best_moved = 0;
            for (int k = 1; k <= e->desired - e->lo && k * e->target <= budget + 1e-9; k++) {
                /* the load e could no longer carry goes to c */
                double moved = fmax(0.0, e->load - (e->desired - k) * e->target);
                if (instances_for(carry + moved, c->target) > c->current)
                    break;
                best = k;
                best_moved = moved;
            }
            if (best == 0)
                continue;
            e->desired -= best;
            e->reason = "dearest_first";
            budget -= best * e->target;
            carry += best_moved;
            swapped = 1;
        }
        if (!swapped)
            continue;
        int keep = c->current - (int)floor(budget / c->target + 1e-9);
        int need = instances_for(carry, c->target);
        if (need > keep)
            keep = need;
        if (keep > c->current)
            keep = c->current;
        if (keep > c->desired) {
            c->desired = keep;
            c->limit = "dearer_pool";
        }
    }
}

void ig_autoscale_prefer_cheap(ig_autoscale_member_t *m, int n)
{
    for (int i = 0; i < n; i++) {
        m[i].reason = NULL;
        m[i].limit = NULL;
    }
    if (n < 2 || n > MAX_MEMBERS)
        return;
    /* Cheapest first; equal ranks keep their order. */
    int idx[MAX_MEMBERS];
    for (int i = 0; i < n; i++) {
        int j = i;
        while (j > 0 && ig_autoscale_cheaper(m[i].rank, m[idx[j - 1]].rank)) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
    double absorbed[MAX_MEMBERS] = {0}; /* dearer pools' load placed in each */
    int added[MAX_MEMBERS] = {0};       /* instances each gained for it */
    for (int i = 0; i < n; i++) {
        if (m[i].target <= 0)
            m[i].target = 1;
    }
    prefer_cheap_out(m, idx, n, absorbed, added);
    prefer_cheap_in(m, idx, n, absorbed);
}
