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

/*
 * The GPUs' telemetry in the Prometheus text format, for the gateway's
 * /metrics: infergate_gpu_utilization, _memory_used_bytes,
 * _memory_total_bytes, _temperature_celsius and _power_usage_watts, each
 * labelled gpu (NVML index), gpu_uuid and device ("cuda:N", or
 * "MIG-<uuid>" for a MIG slice, which has memory series only). NVML is
 * dlopen'ed on the first call and kept open (IG_NVML_LIBRARY overrides
 * libnvidia-ml.so.1). Without NVML or a GPU: NULL with *len 0, nothing
 * fails. Otherwise malloc'ed text (the caller frees it); NULL when out of
 * memory. Loop thread only.
 */
char *ig_devices_gpu_metrics(size_t *len);

#endif
