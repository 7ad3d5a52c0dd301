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

typedef struct {
    double target_queue_depth;    /* load per instance (default 4) */
    double stable_window_s;       /* (60) */
    double panic_window_s;        /* (6) */
    double panic_threshold;       /* desired/ready ratio that panics (2.0) */
    double max_scale_up_rate;     /* at most ready x rate after one decision (2.0) */
    double scale_down_delay_s;    /* (30) */
    double scale_to_zero_after_s; /* idle this long and min 0: none (300) */
    int min_instances;
    int max_instances;
} ig_autoscale_params_t;

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
    uint64_t last_load_ns;   /* last sample with load > 0 */
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
    const char *reason;             /* static: "stable", "panic", "scale_down_delay",
                                       "idle_to_zero", "max_instances", "min_instances",
                                       "no_free_device", "rate_limit", "steady" */
    double stable_load;             /* the inputs, for the log line */
    double panic_load;
    int panic;
} ig_scale_decision_t;

void ig_autoscaler_init(ig_autoscaler_t *as, const ig_autoscale_params_t *p);

/* One observation: the pool's total load (waiting + running) at now. */
void ig_autoscaler_sample(ig_autoscaler_t *as, uint64_t now_ns, double load);

/*
 * Decides for `current` instances (running or starting), of which `ready`
 * serve, with `free_devices` more that could be started.
 */
ig_scale_decision_t ig_autoscaler_decide(ig_autoscaler_t *as, uint64_t now_ns, int current,
                                         int ready, int free_devices);

const char *ig_scale_direction_name(ig_scale_direction_t d);

#endif
