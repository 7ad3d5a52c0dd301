/*
 * `infergate devices` with a config: fleet/devices.c lists the host and maps
 * pools onto it; this file reads the config for it, so that fleet never
 * includes serve's config.h.
 */
#include "infergate/cli.h"
#include "infergate/config.h"
#include "infergate/devices.h"
#include "infergate/error.h"

#include <stdlib.h>

/* cfg's pools as fleet sees them, borrowing cfg's strings. NULL when out of
 * memory; free() the array and each pools[i].devices. */
static ig_devices_pool_t *pools_of(const ig_config_t *cfg)
{
    ig_devices_pool_t *pools = calloc(cfg->npools ? cfg->npools : 1, sizeof(*pools));
    if (pools == NULL)
        return NULL;
    for (size_t i = 0; i < cfg->npools; i++) {
        const ig_config_pool_t *cp = &cfg->pools[i];
        const char **specs = calloc(cp->ndevices ? cp->ndevices : 1, sizeof(*specs));
        if (specs == NULL) {
            for (size_t j = 0; j < i; j++)
                free((void *)pools[j].devices);
            free(pools);
            return NULL;
        }
        for (size_t d = 0; d < cp->ndevices; d++)
            specs[d] = cp->devices[d].spec;
        pools[i] = (ig_devices_pool_t){.name = cp->name,
                                       .model = cp->model,
                                       .devices = specs,
                                       .ndevices = (int)cp->ndevices,
                                       .threads = cp->threads,
                                       .min_instances = cp->min_instances,
                                       .max_instances = cp->max_instances};
    }
    return pools;
}

static void pools_free(ig_devices_pool_t *pools, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free((void *)pools[i].devices);
    free(pools);
}

int ig_devices_cpu_share(const ig_config_t *cfg, long cores)
{
    ig_devices_pool_t *pools = pools_of(cfg);
    if (pools == NULL)
        return 1;
    int t = ig_devices_cpu_threads(pools, cfg->npools, cores);
    pools_free(pools, cfg->npools);
    return t;
}

static int config_pools(const char *path,
                        void (*use)(const ig_devices_pool_t *pools, size_t npools, void *data),
                        void *data, char *err, size_t errlen)
{
    ig_config_t cfg;
    if (ig_config_load_file(&cfg, path, err, errlen) != 0)
        return -1;
    ig_devices_pool_t *pools = pools_of(&cfg);
    if (pools == NULL) {
        ig_errf(err, errlen, "%s: out of memory", path);
        ig_config_dispose(&cfg);
        return IG_ENOMEM;
    }
    use(pools, cfg.npools, data);
    pools_free(pools, cfg.npools);
    ig_config_dispose(&cfg);
    return 0;
}

int ig_cmd_devices(int argc, char **argv)
{
    return ig_devices_command(argc, argv, config_pools);
}
