/*
 * `infergate devices [--json]`: what this host offers a worker. The CPU
 * (model name, online cores), the NVIDIA GPUs and their MIG instances as the
 * driver (NVML) sees them, and the CUDA devices this process can open as
 * cuda:N (after CUDA_VISIBLE_DEVICES).
 *
 * NVML is loaded at run time with dlopen("libnvidia-ml.so.1"): the binary
 * has no build-time dependency on the driver and runs on hosts without one.
 * The few NVML entry points used are declared here from NVML's documented C
 * ABI. Without a usable GPU the command still succeeds: it prints the CPU and
 * one line "no usable GPU: <reason>".
 */
#include "infergate/cli.h"
#include "infergate/devices.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef IG_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define GIB (1024.0 * 1024.0 * 1024.0)

/* ======================================================================== */
/* CPU                                                                      */
/* ======================================================================== */

static void cpu_model(char *out, size_t len)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    snprintf(out, len, "unknown");
    if (!f)
        return;
    while (fgets(line, sizeof(line), f)) {
        /* x86 says "model name", arm64 kernels may only say "CPU part". */
        if (strncmp(line, "model name", 10) == 0 || strncmp(line, "Model", 5) == 0) {
            char *colon = strchr(line, ':');
            if (!colon)
                continue;
            colon++;
            while (*colon == ' ' || *colon == '\t')
                colon++;
            colon[strcspn(colon, "\n")] = '\0';
            snprintf(out, len, "%s", colon);
            break;
        }
    }
    fclose(f);
}

/* ======================================================================== */
/* NVML, loaded at run time                                                 */
/* ======================================================================== */

typedef int nvml_ret_t; /* nvmlReturn_t; 0 is NVML_SUCCESS */
typedef void *nvml_dev_t;
typedef struct {
    unsigned long long total, free, used; /* nvmlMemory_t (v1) */
} nvml_mem_t;

typedef struct {
    void *lib;
    nvml_ret_t (*init)(void);
    nvml_ret_t (*shutdown)(void);
    const char *(*error_string)(nvml_ret_t);
    nvml_ret_t (*driver_version)(char *, unsigned);
    nvml_ret_t (*count)(unsigned *);
    nvml_ret_t (*by_index)(unsigned, nvml_dev_t *);
    nvml_ret_t (*name)(nvml_dev_t, char *, unsigned);
    nvml_ret_t (*uuid)(nvml_dev_t, char *, unsigned);
    nvml_ret_t (*memory)(nvml_dev_t, nvml_mem_t *);
    nvml_ret_t (*cc)(nvml_dev_t, int *, int *);
    nvml_ret_t (*mig_mode)(nvml_dev_t, unsigned *, unsigned *);
    nvml_ret_t (*mig_max)(nvml_dev_t, unsigned *);
    nvml_ret_t (*mig_by_index)(nvml_dev_t, unsigned, nvml_dev_t *);
    nvml_ret_t (*gi_id)(nvml_dev_t, unsigned *);
    nvml_ret_t (*ci_id)(nvml_dev_t, unsigned *);
    /* telemetry (optional) */
    nvml_ret_t (*utilization)(nvml_dev_t, unsigned *); /* nvmlUtilization_t {gpu, memory} */
    nvml_ret_t (*temperature)(nvml_dev_t, int, unsigned *);
    nvml_ret_t (*power)(nvml_dev_t, unsigned *); /* milliwatts */
} nvml_t;

/* The library to open: IG_NVML_LIBRARY names another (a test's fake NVML,
 * or a driver outside the loader's path). */
static const char *nvml_library(void)
{
    const char *env = getenv("IG_NVML_LIBRARY");
    return env != NULL && env[0] != '\0' ? env : "libnvidia-ml.so.1";
}

/* Opens NVML; 0, or -1 with a reason in why. Optional symbols may be NULL. */
static int nvml_open(nvml_t *n, char *why, size_t len)
{
    memset(n, 0, sizeof(*n));
    n->lib = dlopen(nvml_library(), RTLD_NOW | RTLD_LOCAL);
    if (!n->lib) {
        const char *e = dlerror();
        snprintf(why, len, "NVIDIA driver library not loadable (%s)", e ? e : nvml_library());
        return -1;
    }
#define SYM(field, name) *(void **)(&n->field) = dlsym(n->lib, name)
    SYM(init, "nvmlInit_v2");
    SYM(shutdown, "nvmlShutdown");
    SYM(error_string, "nvmlErrorString");
    SYM(driver_version, "nvmlSystemGetDriverVersion");
    SYM(count, "nvmlDeviceGetCount_v2");
    SYM(by_index, "nvmlDeviceGetHandleByIndex_v2");
    SYM(name, "nvmlDeviceGetName");
    SYM(uuid, "nvmlDeviceGetUUID");
    SYM(memory, "nvmlDeviceGetMemoryInfo");
    SYM(cc, "nvmlDeviceGetCudaComputeCapability");
    SYM(mig_mode, "nvmlDeviceGetMigMode");
    SYM(mig_max, "nvmlDeviceGetMaxMigDeviceCount");
    SYM(mig_by_index, "nvmlDeviceGetMigDeviceHandleByIndex");
    SYM(gi_id, "nvmlDeviceGetGpuInstanceId");
    SYM(ci_id, "nvmlDeviceGetComputeInstanceId");
    SYM(utilization, "nvmlDeviceGetUtilizationRates");
    SYM(temperature, "nvmlDeviceGetTemperature");
    SYM(power, "nvmlDeviceGetPowerUsage");
#undef SYM
    if (!n->init || !n->shutdown || !n->count || !n->by_index) {
        snprintf(why, len, "%s lacks the NVML entry points needed", nvml_library());
        goto fail;
    }
    nvml_ret_t r = n->init();
    if (r != 0) {
        snprintf(why, len, "NVML init failed: %s",
                 n->error_string ? n->error_string(r) : "unknown error");
        goto fail;
    }
    return 0;

fail:
    dlclose(n->lib);
    n->lib = NULL;
    return -1;
}

static void nvml_close(nvml_t *n)
{
    if (!n->lib)
        return;
    n->shutdown();
    dlclose(n->lib);
    n->lib = NULL;
}

/* The MIG profile from a MIG device's name ("... MIG 1g.10gb"), or NULL. */
static const char *mig_profile(const char *name)
{
    const char *p = strstr(name, "MIG ");
    return p && p[4] ? p + 4 : NULL;
}

static void set_str(json_t *o, const char *key, const char *s)
{
    json_object_set_new(o, key, json_string(s));
}

static void set_int(json_t *o, const char *key, long long v)
{
    json_object_set_new(o, key, json_integer(v));
}

/* Adds one JSON object per MIG instance of dev to the array migs. */
static void nvml_migs(nvml_t *n, nvml_dev_t dev, json_t *migs)
{
    unsigned max = 0;
    if (!n->mig_max || !n->mig_by_index || n->mig_max(dev, &max) != 0)
        return;
    for (unsigned i = 0; i < max; i++) {
        nvml_dev_t mig;
        char name[96] = "", uuid[96] = "";
        nvml_mem_t mem = {0, 0, 0};
        unsigned gi = 0, ci = 0;
        if (n->mig_by_index(dev, i, &mig) != 0)
            continue; /* an empty slot */
        json_t *m = json_object();
        if (n->uuid && n->uuid(mig, uuid, sizeof(uuid)) == 0)
            set_str(m, "uuid", uuid);
        if (n->name && n->name(mig, name, sizeof(name)) == 0) {
            set_str(m, "name", name);
            if (mig_profile(name))
                set_str(m, "profile", mig_profile(name));
        }
        if (n->memory && n->memory(mig, &mem) == 0) {
            set_int(m, "memory_total", (long long)mem.total);
            set_int(m, "memory_free", (long long)mem.free);
        }
        if (n->gi_id && n->gi_id(mig, &gi) == 0)
            set_int(m, "gpu_instance", gi);
        if (n->ci_id && n->ci_id(mig, &ci) == 0)
            set_int(m, "compute_instance", ci);
        json_array_append_new(migs, m);
    }
}

/* The GPUs as NVML sees them, or NULL with a reason. New reference. */
static json_t *nvml_gpus(char *driver, size_t dlen, char *why, size_t len)
{
    nvml_t n;
    unsigned count = 0;
    if (nvml_open(&n, why, len) != 0)
        return NULL;
    if (n.driver_version)
        n.driver_version(driver, (unsigned)dlen);
    if (n.count(&count) != 0) {
        snprintf(why, len, "NVML could not count devices");
        nvml_close(&n);
        return NULL;
    }
    json_t *gpus = json_array();
    for (unsigned i = 0; i < count; i++) {
        nvml_dev_t dev;
        char name[96] = "", uuid[96] = "";
        nvml_mem_t mem = {0, 0, 0};
        int major = 0, minor = 0;
        unsigned cur = 0, pending = 0;
        if (n.by_index(i, &dev) != 0)
            continue; /* e.g. a GPU the process has no permission for */
        json_t *g = json_object();
        set_int(g, "index", i);
        if (n.name && n.name(dev, name, sizeof(name)) == 0)
            set_str(g, "name", name);
        if (n.uuid && n.uuid(dev, uuid, sizeof(uuid)) == 0)
            set_str(g, "uuid", uuid);
        if (n.memory && n.memory(dev, &mem) == 0) {
            set_int(g, "memory_total", (long long)mem.total);
            set_int(g, "memory_free", (long long)mem.free);
        }
        if (n.cc && n.cc(dev, &major, &minor) == 0) {
            char cc[16];
            snprintf(cc, sizeof(cc), "%d.%d", major, minor);
            set_str(g, "compute_capability", cc);
        }
        int mig_on = n.mig_mode && n.mig_mode(dev, &cur, &pending) == 0 && cur == 1;
        json_object_set_new(g, "mig_enabled", json_boolean(mig_on));
        json_t *migs = json_array();
        if (mig_on)
            nvml_migs(&n, dev, migs);
        json_object_set_new(g, "mig", migs);
        json_array_append_new(gpus, g);
    }
    nvml_close(&n);
    return gpus;
}

/* ======================================================================== */
/* GPU telemetry for /metrics                                               */
/* ======================================================================== */

#define MAX_TELEMETRY 128 /* GPUs and MIG slices */

typedef struct {
    char gpu[16];      /* NVML index of the GPU (of the parent, for a slice) */
    char gpu_uuid[96]; /* the GPU's UUID (the parent's, for a slice) */
    char device[112];  /* as a pool names it: cuda:N or MIG-<uuid> */
    int has_util, has_mem, has_temp, has_power;
    double util, mem_used, mem_total, temp, power;
} gpu_sample_t;

/* NVML stays open from the first scrape on: nvmlInit can take a while on a
 * host with GPUs, the reads after it are cheap. A failed open is not tried
 * again. Only the gateway's loop thread calls this. */
static nvml_t tele;
static int tele_state; /* 0 not tried, 1 open, -1 unavailable */

static int telemetry_read(gpu_sample_t *out, int max)
{
    if (tele_state == 0) {
        char why[256];
        tele_state = nvml_open(&tele, why, sizeof(why)) == 0 ? 1 : -1;
    }
    if (tele_state != 1)
        return 0;
    unsigned count = 0;
    if (tele.count(&count) != 0)
        return 0;
    int n = 0;
    for (unsigned i = 0; i < count && n < max; i++) {
        nvml_dev_t dev;
        if (tele.by_index(i, &dev) != 0)
            continue;
        gpu_sample_t *g = &out[n++];
        memset(g, 0, sizeof(*g));
        snprintf(g->gpu, sizeof(g->gpu), "%u", i);
        if (!tele.uuid || tele.uuid(dev, g->gpu_uuid, sizeof(g->gpu_uuid)) != 0)
            g->gpu_uuid[0] = '\0';
        snprintf(g->device, sizeof(g->device), "cuda:%u", i);
        unsigned u[2] = {0, 0}, v = 0;
        nvml_mem_t mem = {0, 0, 0};
        if (tele.utilization && tele.utilization(dev, u) == 0) {
            g->has_util = 1;
            g->util = u[0] / 100.0;
        }
        if (tele.memory && tele.memory(dev, &mem) == 0) {
            g->has_mem = 1;
            g->mem_used = (double)mem.used;
            g->mem_total = (double)mem.total;
        }
        if (tele.temperature && tele.temperature(dev, 0 /* NVML_TEMPERATURE_GPU */, &v) == 0) {
            g->has_temp = 1;
            g->temp = v;
        }
        if (tele.power && tele.power(dev, &v) == 0) {
            g->has_power = 1;
            g->power = v / 1000.0;
        }
        unsigned cur = 0, pending = 0, slots = 0;
        if (!tele.mig_mode || tele.mig_mode(dev, &cur, &pending) != 0 || cur != 1 ||
            !tele.mig_max || !tele.mig_by_index || tele.mig_max(dev, &slots) != 0)
            continue;
        /* A slice has its own memory; utilisation, temperature and power
         * are the whole GPU's (NVML answers NOT_SUPPORTED for a slice). */
        for (unsigned k = 0; k < slots && n < max; k++) {
            nvml_dev_t mig;
            char uuid[96] = "";
            if (tele.mig_by_index(dev, k, &mig) != 0 || !tele.uuid ||
                tele.uuid(mig, uuid, sizeof(uuid)) != 0)
                continue;
            gpu_sample_t *m = &out[n++];
            memset(m, 0, sizeof(*m));
            memcpy(m->gpu, g->gpu, sizeof(m->gpu));
            memcpy(m->gpu_uuid, g->gpu_uuid, sizeof(m->gpu_uuid));
            /* NVML's MIG UUIDs already read "MIG-..."; CUDA wants that form. */
            snprintf(m->device, sizeof(m->device), "%s%s", strncmp(uuid, "MIG-", 4) ? "MIG-" : "",
                     uuid);
            nvml_mem_t mm = {0, 0, 0};
            if (tele.memory && tele.memory(mig, &mm) == 0) {
                m->has_mem = 1;
                m->mem_used = (double)mm.used;
                m->mem_total = (double)mm.total;
            }
        }
    }
    return n;
}

static void tele_put(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void tele_put(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
    if (*buf == NULL && *cap != 0)
        return; /* out of memory earlier */
    va_list ap;
    va_start(ap, fmt);
    char line[512];
    int w = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (w < 0)
        return;
    size_t n = (size_t)w < sizeof(line) ? (size_t)w : sizeof(line) - 1;
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap * 2 : 4096;
        while (nc < *len + n + 1)
            nc *= 2;
        char *nb = realloc(*buf, nc);
        if (nb == NULL) {
            free(*buf);
            *buf = NULL;
            *cap = 1;
            return;
        }
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, line, n);
    *len += n;
    (*buf)[*len] = '\0';
}

char *ig_devices_gpu_metrics(size_t *len)
{
    static gpu_sample_t s[MAX_TELEMETRY];
    int n = telemetry_read(s, MAX_TELEMETRY);
    char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    static const struct {
        const char *name, *help;
        int which; /* 0 util, 1 mem used, 2 mem total, 3 temp, 4 power */
    } fam[] = {
        {"infergate_gpu_utilization", "GPU busy share over the last sample period (0 to 1)", 0},
        {"infergate_gpu_memory_used_bytes", "GPU or MIG slice memory in use", 1},
        {"infergate_gpu_memory_total_bytes", "GPU or MIG slice memory", 2},
        {"infergate_gpu_temperature_celsius", "GPU core temperature", 3},
        {"infergate_gpu_power_usage_watts", "GPU board power draw", 4},
    };
    for (size_t f = 0; f < sizeof(fam) / sizeof(fam[0]); f++) {
        int header = 0;
        for (int i = 0; i < n; i++) {
            const gpu_sample_t *g = &s[i];
            int has = fam[f].which == 0   ? g->has_util
                      : fam[f].which <= 2 ? g->has_mem
                      : fam[f].which == 3 ? g->has_temp
                                          : g->has_power;
            if (!has)
                continue;
            double v = fam[f].which == 0   ? g->util
                       : fam[f].which == 1 ? g->mem_used
                       : fam[f].which == 2 ? g->mem_total
                       : fam[f].which == 3 ? g->temp
                                           : g->power;
            if (!header) {
                tele_put(&buf, len, &cap, "# HELP %s %s.\n# TYPE %s gauge\n", fam[f].name,
                         fam[f].help, fam[f].name);
                header = 1;
            }
            /* UUIDs and indexes are [A-Za-z0-9-]: nothing to escape. */
            tele_put(&buf, len, &cap, "%s{gpu=\"%s\",gpu_uuid=\"%s\",device=\"%s\"} %.17g\n",
                     fam[f].name, g->gpu, g->gpu_uuid, g->device, v);
        }
    }
    if (buf == NULL && cap != 0) {
        *len = 0;
        return NULL;
    }
    return buf;
}

/* ======================================================================== */
/* CUDA runtime                                                             */
/* ======================================================================== */

/* The devices this process can open as cuda:N, or NULL with a reason. */
static json_t *cuda_devices(char *why, size_t len)
{
#ifdef IG_HAVE_CUDA
    int count = 0;
    cudaError_t st = cudaGetDeviceCount(&count);
    if (st != cudaSuccess) {
        snprintf(why, len, "%s", cudaGetErrorString(st));
        return NULL;
    }
    if (count == 0) {
        snprintf(why, len, "no CUDA device visible to this process");
        return NULL;
    }
    json_t *devs = json_array();
    for (int i = 0; i < count; i++) {
        struct cudaDeviceProp p;
        size_t free_b = 0, total_b = 0;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess)
            continue;
        json_t *d = json_object();
        char s[64];
        set_int(d, "ordinal", i);
        set_str(d, "name", p.name);
        /* CUDA's UUID holds the same 16 bytes NVML prints. A process pinned
         * to a MIG slice (CUDA_VISIBLE_DEVICES=MIG-...) sees the slice's
         * UUID, which NVML and nvidia-smi spell with a MIG- prefix. */
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        const char *prefix = vis && strncmp(vis, "MIG-", 4) == 0 ? "MIG" : "GPU";
        const unsigned char *u = (const unsigned char *)p.uuid.bytes;
        snprintf(s, sizeof(s),
                 "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", prefix,
                 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
                 u[13], u[14], u[15]);
        set_str(d, "uuid", s);
        snprintf(s, sizeof(s), "%d.%d", p.major, p.minor);
        set_str(d, "compute_capability", s);
        set_int(d, "multiprocessors", p.multiProcessorCount);
        set_int(d, "memory_total", (long long)p.totalGlobalMem);
        if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
            set_int(d, "memory_free", (long long)free_b);
        json_object_set_new(d, "usable", json_boolean(p.major >= 8));
        json_array_append_new(devs, d);
    }
    return devs;
#else
    snprintf(why, len, "this build has no CUDA support (rebuild with -DIG_CUDA=ON)");
    return NULL;
#endif
}

/* ======================================================================== */
/* The command                                                              */
/* ======================================================================== */

static void usage(FILE *out)
{
    fprintf(out, "usage: infergate devices [--json] [--config FILE] [--help]\n\n"
                 "Lists the CPU, the NVIDIA GPUs with their MIG instances (through NVML,\n"
                 "loaded at run time) and the CUDA devices this process can open as cuda:N.\n"
                 "Exits 0 also when no GPU is usable; it then says why.\n\n"
                 "  --json          one JSON object on stdout instead of text\n"
                 "  --config FILE   also show how FILE's pools map onto these devices\n"
                 "                  (threads of each CPU instance, GPUs and MIG slices\n"
                 "                  found or missing)\n\n"
                 "A worker is pinned to a MIG slice by starting it with\n"
                 "CUDA_VISIBLE_DEVICES=MIG-<uuid> (the uuid shown here); the slice is then\n"
                 "its device 0: `infergate worker --device MIG-<uuid> ...`.\n");
}

static double gib(json_t *o, const char *key)
{
    return (double)json_integer_value(json_object_get(o, key)) / GIB;
}

static const char *str(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "?";
}

/* ======================================================================== */
/* A config's pools on these devices                                        */
/* ======================================================================== */

/* The MIG slice with this uuid among the GPUs found, or NULL. */
static json_t *find_mig(json_t *gpus, const char *uuid)
{
    size_t i, j;
    json_t *g, *m;
    json_array_foreach(gpus, i, g)
    {
        json_array_foreach(json_object_get(g, "mig"), j, m)
        {
            const char *u = json_string_value(json_object_get(m, "uuid"));
            if (u != NULL && strcmp(u, uuid) == 0)
                return m;
        }
    }
    return NULL;
}

/* A device entry's kind; the config parser has refused any other spelling. */
static int is_cpu(const char *spec)
{
    return strcmp(spec, "cpu") == 0 || strncmp(spec, "cpu:", 4) == 0;
}

int ig_devices_cpu_threads(const ig_devices_pool_t *pools, size_t npools, long cores)
{
    int slots = 0;
    for (size_t i = 0; i < npools; i++) {
        const ig_devices_pool_t *cp = &pools[i];
        int plain = 0;
        for (int d = 0; d < cp->ndevices; d++)
            plain += strcmp(cp->devices[d], "cpu") == 0;
        if (cp->threads == 0)
            slots += plain < (int)cp->max_instances ? plain : (int)cp->max_instances;
    }
    return slots > 0 && cores > slots ? (int)(cores / slots) : 1;
}

/* One JSON object per pool: each device entry, what it maps to on this
 * host and whether it is there. New reference. */
static json_t *map_pools(const ig_devices_pool_t *cfg, size_t npools, json_t *root, long cores)
{
    json_t *pools = json_array();
    json_t *cuda = json_object_get(root, "cuda_devices");
    int share = ig_devices_cpu_threads(cfg, npools, cores);
    for (size_t p = 0; p < npools; p++) {
        const ig_devices_pool_t *cp = &cfg[p];
        json_t *devs = json_array();
        int found = 0;
        for (int d = 0; d < cp->ndevices; d++) {
            const char *spec = cp->devices[d];
            json_t *o = json_object();
            char what[256];
            int ok = 0;
            set_str(o, "device", spec);
            if (is_cpu(spec)) {
                int own = spec[3] == ':' ? atoi(spec + 4) : 0;
                int t = own > 0 ? own : cp->threads > 0 ? (int)cp->threads : share;
                snprintf(what, sizeof(what), "cpu, %d of %ld cores", t, cores);
                set_int(o, "threads", t);
                ok = 1;
            } else if (strncmp(spec, "cuda:", 5) == 0) {
                json_t *c = NULL, *x;
                size_t i;
                json_array_foreach(cuda, i, x)
                {
                    if (json_integer_value(json_object_get(x, "ordinal")) == atoi(spec + 5))
                        c = x;
                }
                ok = c != NULL && json_is_true(json_object_get(c, "usable"));
                snprintf(what, sizeof(what), "%s",
                         c == NULL ? "not found"
                         : ok      ? str(c, "name")
                                   : "below compute 8.0: unusable");
            } else {
                json_t *m = find_mig(json_object_get(root, "gpus"), spec);
                ok = m != NULL;
                snprintf(what, sizeof(what), "%s",
                         m == NULL ? "not found"
                                   : (json_object_get(m, "profile") ? str(m, "profile") : "MIG"));
            }
            set_str(o, "maps_to", what);
            json_object_set_new(o, "found", json_boolean(ok));
            found += ok;
            json_array_append_new(devs, o);
        }
        json_t *po = json_object();
        set_str(po, "name", cp->name);
        set_str(po, "model", cp->model);
        set_int(po, "min_instances", cp->min_instances);
        set_int(po, "max_instances", cp->max_instances);
        set_int(po, "devices_found", found);
        json_object_set_new(po, "devices", devs);
        json_array_append_new(pools, po);
    }
    return pools;
}

static void print_pools(json_t *pools)
{
    size_t i, j;
    json_t *p, *d;
    json_array_foreach(pools, i, p)
    {
        long long found = json_integer_value(json_object_get(p, "devices_found"));
        long long max = json_integer_value(json_object_get(p, "max_instances"));
        printf("pool %s (model %s): %lld..%lld instances on %zu devices, %lld found%s\n",
               str(p, "name"), str(p, "model"),
               (long long)json_integer_value(json_object_get(p, "min_instances")), max,
               json_array_size(json_object_get(p, "devices")), found,
               found < max ? " (fewer than max_instances: it cannot reach its max)" : "");
        json_array_foreach(json_object_get(p, "devices"), j, d)
        {
            printf("  %-44s -> %s%s\n", str(d, "device"), str(d, "maps_to"),
                   json_is_true(json_object_get(d, "found")) ? "" : " (MISSING)");
        }
    }
}

static void print_text(json_t *root)
{
    json_t *cpu = json_object_get(root, "cpu"), *g, *m, *d;
    size_t i, j;
    printf("cpu: %s, %lld cores\n", str(cpu, "model"),
           (long long)json_integer_value(json_object_get(cpu, "cores")));
    json_t *gpus = json_object_get(root, "gpus");
    if (json_array_size(gpus) > 0)
        printf("driver: %s\n", str(root, "driver_version"));
    json_array_foreach(gpus, i, g)
    {
        printf("gpu %zu: %s, %s, compute %s, %.1f GiB total, %.1f GiB free%s\n", i, str(g, "name"),
               str(g, "uuid"), str(g, "compute_capability"), gib(g, "memory_total"),
               gib(g, "memory_free"),
               json_is_true(json_object_get(g, "mig_enabled")) ? ", MIG on" : "");
        json_array_foreach(json_object_get(g, "mig"), j, m)
        {
            printf("  mig %s: %s, %.1f GiB total, %.1f GiB free\n",
                   json_object_get(m, "profile") ? str(m, "profile") : "(profile unknown)",
                   str(m, "uuid"), gib(m, "memory_total"), gib(m, "memory_free"));
        }
    }
    json_array_foreach(json_object_get(root, "cuda_devices"), i, d)
    {
        printf("cuda:%lld: %s, compute %s, %lld SMs, %.1f GiB total, %.1f GiB free%s\n",
               (long long)json_integer_value(json_object_get(d, "ordinal")), str(d, "name"),
               str(d, "compute_capability"),
               (long long)json_integer_value(json_object_get(d, "multiprocessors")),
               gib(d, "memory_total"), gib(d, "memory_free"),
               json_is_true(json_object_get(d, "usable")) ? "" : " (below compute 8.0: unusable)");
    }
    if (!json_is_true(json_object_get(root, "usable_gpu")))
        printf("no usable GPU: %s\n", str(root, "reason"));
}

/* ig_devices_pools_fn's `use`: the pools of --config mapped onto the host. */
typedef struct {
    json_t *root;
    long cores;
    json_t *pools; /* new reference */
} map_ctx_t;

static void map_use(const ig_devices_pool_t *pools, size_t npools, void *data)
{
    map_ctx_t *m = data;
    m->pools = map_pools(pools, npools, m->root, m->cores);
}

int ig_devices_command(int argc, char **argv, ig_devices_pools_fn config_pools)
{
    int as_json = 0;
    const char *config = NULL;
    char model[256], nvml_why[256] = "", cuda_why[256] = "", driver[96] = "";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            as_json = 1;
        } else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
            config = argv[++i];
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return IG_EXIT_OK;
        } else {
            fprintf(stderr, "infergate devices: unknown argument '%s'\n\n", argv[i]);
            usage(stderr);
            return IG_EXIT_USAGE;
        }
    }

    json_t *root = json_object();
    json_t *cpu = json_object();
    cpu_model(model, sizeof(model));
    set_str(cpu, "model", model);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    set_int(cpu, "cores", cores > 0 ? cores : 1);
    json_object_set_new(root, "cpu", cpu);

    json_t *gpus = nvml_gpus(driver, sizeof(driver), nvml_why, sizeof(nvml_why));
    json_object_set_new(root, "gpus", gpus ? gpus : json_array());
    if (driver[0])
        set_str(root, "driver_version", driver);
    json_t *cuda = cuda_devices(cuda_why, sizeof(cuda_why));
    json_object_set_new(root, "cuda_devices", cuda ? cuda : json_array());

    /* Usable: CUDA can open a device of compute capability 8.0 or newer. */
    int usable = 0;
    size_t i;
    json_t *d;
    json_array_foreach(json_object_get(root, "cuda_devices"), i, d)
    {
        if (json_is_true(json_object_get(d, "usable")))
            usable = 1;
    }
    json_object_set_new(root, "usable_gpu", json_boolean(usable));
    if (!usable) {
        char reason[600];
        if (cuda && json_array_size(cuda) > 0)
            snprintf(reason, sizeof(reason), "no device of compute capability 8.0 or newer");
        else if (cuda_why[0] && (!gpus || json_array_size(gpus) > 0))
            snprintf(reason, sizeof(reason), "%s%s%s", cuda_why, nvml_why[0] ? "; " : "", nvml_why);
        else if (gpus)
            snprintf(reason, sizeof(reason), "no NVIDIA GPU found by the driver");
        else
            snprintf(reason, sizeof(reason), "%s", nvml_why[0] ? nvml_why : cuda_why);
        set_str(root, "reason", reason);
    }

    json_t *pools = NULL;
    if (config != NULL) {
        map_ctx_t m = {root, cores > 0 ? cores : 1, NULL};
        char err[512];
        if (config_pools(config, map_use, &m, err, sizeof(err)) != 0) {
            fprintf(stderr, "infergate devices: %s\n", err);
            json_decref(root);
            return IG_EXIT_USAGE; /* like serve: a bad config exits 2 */
        }
        pools = m.pools;
        json_object_set(root, "pools", pools);
    }

    if (as_json) {
        char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        if (s) {
            printf("%s\n", s);
            free(s);
        }
    } else {
        print_text(root);
        if (pools != NULL)
            print_pools(pools);
    }
    json_decref(pools);
    json_decref(root);
    return IG_EXIT_OK;
}
