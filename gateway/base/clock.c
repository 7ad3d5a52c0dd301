/* The monotonic clock (include/infergate/clock.h). */
#include "infergate/clock.h"

#include <time.h>

uint64_t ig_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}
