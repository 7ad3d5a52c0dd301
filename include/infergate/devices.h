#ifndef INFERGATE_DEVICES_H
#define INFERGATE_DEVICES_H

/*
 * The devices of this host as the fleet shares them out. The command
 * `infergate devices` itself is ig_cmd_devices() (include/infergate/cli.h).
 */

#include "infergate/config.h"

/*
 * CPU instances split the cores: every plain "cpu" device entry that may run
 * at once (up to max_instances per pool), over all pools whose `threads` is
 * 0, gets cores / that count threads, at least 1. A pool's `threads` and a
 * "cpu:N" entry say their own.
 */
int ig_devices_cpu_share(const ig_config_t *cfg, long cores);

#endif
