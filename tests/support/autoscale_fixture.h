#ifndef IG_TEST_AUTOSCALE_FIXTURE_H
#define IG_TEST_AUTOSCALE_FIXTURE_H

/* An autoscaler with the defaults but for the windows, the target and the
 * bounds a test names (scale to zero after 60 s). */

#include "infergate/autoscale.h"

typedef struct {
    double target_queue_depth;
    double stable_window_s, panic_window_s, scale_down_delay_s;
    int min_instances, max_instances;
} ig_tas_t;

static inline ig_autoscaler_t ig_tas_make(ig_tas_t t)
{
    ig_autoscale_params_t p;
    ig_autoscale_params_default(&p);
    p.target_queue_depth = t.target_queue_depth;
    p.stable_window_s = t.stable_window_s;
    p.panic_window_s = t.panic_window_s;
    p.scale_down_delay_s = t.scale_down_delay_s;
    p.scale_to_zero_after_s = 60;
    p.min_instances = t.min_instances;
    p.max_instances = t.max_instances;
    ig_autoscaler_t as;
    ig_autoscaler_init(&as, &p);
    return as;
}

#endif
