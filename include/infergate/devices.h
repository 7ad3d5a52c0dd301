#ifndef INFERGATE_DEVICES_H
#define INFERGATE_DEVICES_H

/*
 * The devices of this host as the fleet shares them out, and the command
 * `infergate devices` (ig_cmd_devices(), include/infergate/cli.h, gives it
 * the config reader). Fleet reads no config file: whoever read one passes
 * its pools in as ig_devices_pool_t.
 */

#include <stddef.h>

/* One pool as the devices see it: a config's pools[] entry, borrowed. */
typedef struct {
    const char *name;
    const char *model;
    const char *const *devices; /* "cpu", "cpu:N", "cuda:N", "MIG-<uuid>", as validated by the
                                   config parser */
    int ndevices;
    unsigned threads; /* CPU threads per CPU instance; 0 = a share of the cores */
    unsigned min_instances;
    unsigned max_instances;
} ig_devices_pool_t;

/*
 * CPU instances split the cores: every plain "cpu" device entry that may run
 * at once (up to max_instances per pool), over all pools whose `threads` is
 * 0, gets cores / that count threads, at least 1. A pool's `threads` and a
 * "cpu:N" entry say their own.
 */
int ig_devices_cpu_threads(const ig_devices_pool_t *pools, size_t npools, long cores);

/* Reads config file `path` and calls use(pools, npools, data) once with its
 * pools, which live only during that call. 0, or non-zero with err filled
 * (the file cannot be read or is invalid). */
typedef int (*ig_devices_pools_fn)(const char *path,
                                   void (*use)(const ig_devices_pool_t *pools, size_t npools,
                                               void *data),
                                   void *data, char *err, size_t errlen);

/* `infergate devices [--json] [--config FILE]`: argv as ig_cmd_devices gets
 * it; config_pools reads FILE. Returns the exit status (include/infergate/cli.h). */
int ig_devices_command(int argc, char **argv, ig_devices_pools_fn config_pools);

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
