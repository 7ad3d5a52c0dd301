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

#endif
