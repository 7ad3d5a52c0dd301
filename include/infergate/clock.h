#ifndef INFERGATE_CLOCK_H
#define INFERGATE_CLOCK_H

/* The one monotonic clock of the code that has no loop at hand (the engine,
 * the kernels, worker threads); libuv's uv_hrtime() reads the same clock. */

#include <stdint.h>

/* Nanoseconds of CLOCK_MONOTONIC: only differences mean anything. Any thread. */
uint64_t ig_clock_ns(void);

#endif
