#ifndef INFERGATE_AUTOSCALE_H
#define INFERGATE_AUTOSCALE_H

/*
 * The autoscaler's decision function for one pool, in the manner of
 * Knative's KPA: desired instances = ceil(mean load over the stable window /
 * target queue depth), where load is waiting + running requests summed over
 * the pool (plus requests the gateway holds for it). A short panic window
 * catches bursts: when it asks for panic_threshold times the ready
 * instances, panic mode holds for a stable window and only scales up.
 * Scale-down waits until the desired count has stayed lower for
 * scale_down_delay_s, so flapping load does not flap instances.
 *
 * Pure logic: the caller feeds samples with their time and asks for a
 * decision; nothing here reads a clock or starts a process.
 */

#include <stdint.h>

/* The defaults, one place: config.c and ig_autoscale_params_default use
 * them (docs/autoscale.md says why each). */
#define IG_AUTOSCALE_DEFAULT_TARGET 8.0
#define IG_AUTOSCALE_DEFAULT_STABLE_S 60.0
#define IG_AUTOSCALE_DEFAULT_PANIC_S 6.0
#define IG_AUTOSCALE_DEFAULT_PANIC_THRESHOLD 2.0
#define IG_AUTOSCALE_DEFAULT_MAX_UP_RATE 1000.0
#define IG_AUTOSCALE_DEFAULT_MAX_DOWN_RATE 2.0
#define IG_AUTOSCALE_DEFAULT_DOWN_DELAY_S 60.0
#define IG_AUTOSCALE_DEFAULT_TO_ZERO_S 300.0

typedef struct {
    double target_queue_depth;    /* load per instance (8) */
    double stable_window_s;       /* (60) */
    double panic_window_s;        /* (6) */
    double panic_threshold;       /* desired/ready ratio that panics (2.0) */
    double max_scale_up_rate;     /* at most ready x rate after one decision (1000:
                                     the devices are the real bound) */
    double max_scale_down_rate;   /* at least current / rate after one decision (2.0) */
    double scale_down_delay_s;    /* (60) */
    double scale_to_zero_after_s; /* no request this long and min 0: none (300) */
    int min_instances;
    int max_instances;
} ig_autoscale_params_t;

/* Fills p with the defaults above; min 1, max 1. */
void ig_autoscale_params_default(ig_autoscale_params_t *p);

#define IG_AUTOSCALE_SAMPLES 1024

typedef struct {
    uint64_t t_ns;
    double load;
} ig_autoscale_sample_t;

typedef struct {
    ig_autoscale_params_t p;
    ig_autoscale_sample_t samples[IG_AUTOSCALE_SAMPLES]; /* ring, oldest first */
    int head, n;
    uint64_t panic_until_ns; /* 0 when not in panic */
    uint64_t last_load_ns;   /* last sample with load > 0, or last request seen */
    uint64_t first_ns;       /* first sample ever */
    /* recent raw desired counts, for the scale-down delay */
    ig_autoscale_sample_t desired[IG_AUTOSCALE_SAMPLES];
    int dhead, dn;
} ig_autoscaler_t;

typedef enum {
    IG_SCALE_NONE = 0,
    IG_SCALE_UP,
    IG_SCALE_DOWN,
} ig_scale_direction_t;

typedef struct {
    int desired;                    /* clamped */
    int raw;                        /* before the clamps */
    ig_scale_direction_t direction; /* desired against current */
    const char *reason;             /* static; why the policy wants this many:
                                       "stable", "panic", "idle_to_zero", "idle_hold"
                                       (min 0, idle, not long enough yet), "steady"
                                       (no change wanted) */
    const char *limit;              /* static; the bound that cut it, else "none":
                                       "scale_down_delay", "rate_limit",
                                       "max_instances", "min_instances",
                                       "no_free_device" */
    double stable_load;             /* the inputs, for the log line */
    double panic_load;
    int panic;
} ig_scale_decision_t;

void ig_autoscaler_init(ig_autoscaler_t *as, const ig_autoscale_params_t *p);

/* One observation: the pool's total load (waiting + running) at now. */
void ig_autoscaler_sample(ig_autoscaler_t *as, uint64_t now_ns, double load);

/*
 * A request for the pool's model arrived at now. Samples see in-flight work
 * only at their instants, so short requests between two samples would look
 * like idleness; this keeps a pool that gets traffic from going to zero.
 */
void ig_autoscaler_note_request(ig_autoscaler_t *as, uint64_t now_ns);

/*
 * Decides for `current` instances (running or starting), of which `ready`
 * serve, with `free_devices` more that could be started.
 */
ig_scale_decision_t ig_autoscaler_decide(ig_autoscaler_t *as, uint64_t now_ns, int current,
                                         int ready, int free_devices);

const char *ig_scale_direction_name(ig_scale_direction_t d);

/*
 * Remembers that the pool was given `desired` instances at now although
 * its own want was lower (it grows for a dearer pool's load, or keeps
 * what it would have shed so that a dearer pool sheds instead): the
 * scale-down delay then holds those instances as if the pool had wanted
 * them itself.
 */
void ig_autoscaler_hold(ig_autoscaler_t *as, uint64_t now_ns, int desired);

/* ---- cheap capacity first (docs/autoscale.md, "Cheap capacity first") ----
 *
 * The pools of one model, after each one's own decision: the growth a
 * dear pool wants goes to cheaper pools that can absorb it, and the
 * shrink a cheap pool wants is taken from dearer pools first. */
typedef struct {
    double rank;  /* what its capacity costs, lower is cheaper (USD per 1M
                     output tokens, or per hour; docs/autoscale.md); NAN:
                     unknown, after every known one */
    double target; /* the load one instance takes (target_queue_depth) */
    double load;   /* the load its own decision wanted instances for */
    int current;   /* instances live (starting, ready, in backoff) */
    int lo;        /* the fewest it may have after this decision (its
                      min_instances, the scale-down rate; current in panic) */
    int hi;        /* the most it may have now (max_instances, and the
                      devices available) */
    int desired;   /* in: its own decision; out: the model's */
    const char *reason; /* out, static: NULL when its own decision stands;
                           "absorb" (it grows for a dearer pool's load),
                           "dearest_first" (it sheds for a cheaper pool) */
    const char *limit;  /* out, static: NULL, or "cheaper_pool" (its growth
                           went to a cheaper pool), "dearer_pool" (a dearer
                           pool shed instead of it) */
} ig_autoscale_member_t;

/* 1 when a's capacity is strictly cheaper than b's (an unknown rank is
 * dearer than every known one; two unknowns tie). */
int ig_autoscale_cheaper(double a, double b);

/*
 * Moves scale decisions between the n pools of one model:
 *  - out: a pool that wants to grow by k instances needs k x target of
 *    load placed; cheaper pools that are not shrinking take it first, in
 *    order of cost, into the capacity they have beyond their own load and
 *    then into new instances up to their hi; the pool keeps only the
 *    growth for what none of them absorbs. The dearest pool gives first.
 *  - in: when a pool wants to shed instances, dearer pools that can shed
 *    (above their lo, not growing) shed instead, the dearest first, as
 *    long as the load they would no longer carry fits in the capacity the
 *    cheap pool keeps; the cheap pool then keeps what that load needs.
 * Pools of equal rank never trade. Pure: desired, reason and limit are
 * written; the caller acts and calls ig_autoscaler_hold for a pool whose
 * desired rose above its own.
 */
void ig_autoscale_prefer_cheap(ig_autoscale_member_t *m, int n);

#endif
