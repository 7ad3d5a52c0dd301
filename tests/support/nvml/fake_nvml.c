/*
 * A fake libnvidia-ml for the GPU telemetry test: the NVML entry points
 * infergate dlopens, answering for two made-up GPUs. GPU 0 is whole; GPU 1
 * is in MIG mode with two slices (slots 0 and 2 of 7). The test builds it
 * with `cc -shared -fPIC` and points IG_NVML_LIBRARY at it. Not linked into
 * anything else (tests/support/*.c does not reach this folder).
 */
#include <stdio.h>
#include <string.h>

typedef struct {
    unsigned long long total, free, used;
} mem_t;

typedef struct dev_s {
    const char *name, *uuid;
    unsigned util, temp, power_mw;
    mem_t mem;
    int mig; /* MIG mode on */
    struct dev_s *slices[7];
} dev_t_;

#define GIB (1024ULL * 1024 * 1024)

static dev_t_ slice_a = {"NVIDIA H100 80GB HBM3 MIG 1g.10gb",
                         "MIG-11111111-2222-3333-4444-555555555555",
                         0,
                         0,
                         0,
                         {10 * GIB, 8 * GIB, 2 * GIB},
                         0,
                         {0}};
static dev_t_ slice_b = {"NVIDIA H100 80GB HBM3 MIG 3g.40gb",
                         "MIG-66666666-7777-8888-9999-000000000000",
                         0,
                         0,
                         0,
                         {40 * GIB, 37 * GIB, 3 * GIB},
                         0,
                         {0}};
static dev_t_ gpus[2] = {
    {"NVIDIA H100 80GB HBM3",
     "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
     37,
     61,
     123456,
     {80 * GIB, 79 * GIB, 1 * GIB},
     0,
     {0}},
    {"NVIDIA H100 80GB HBM3",
     "GPU-ffffffff-0000-1111-2222-333333333333",
     5,
     40,
     60000,
     {80 * GIB, 75 * GIB, 5 * GIB},
     1,
     {&slice_a, 0, &slice_b, 0, 0, 0, 0}},
};

int nvmlInit_v2(void)
{
    return 0;
}

int nvmlShutdown(void)
{
    return 0;
}

const char *nvmlErrorString(int r)
{
    return r == 0 ? "Success" : "Not Supported";
}

int nvmlSystemGetDriverVersion(char *out, unsigned len)
{
    snprintf(out, len, "999.99-fake");
    return 0;
}

int nvmlDeviceGetCount_v2(unsigned *n)
{
    *n = 2;
    return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **out)
{
    if (i >= 2)
        return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *out = &gpus[i];
    return 0;
}

int nvmlDeviceGetName(void *d, char *out, unsigned len)
{
    snprintf(out, len, "%s", ((dev_t_ *)d)->name);
    return 0;
}

int nvmlDeviceGetUUID(void *d, char *out, unsigned len)
{
    snprintf(out, len, "%s", ((dev_t_ *)d)->uuid);
    return 0;
}

int nvmlDeviceGetMemoryInfo(void *d, mem_t *m)
{
    *m = ((dev_t_ *)d)->mem;
    return 0;
}

int nvmlDeviceGetCudaComputeCapability(void *d, int *major, int *minor)
{
    (void)d;
    *major = 9;
    *minor = 0;
    return 0;
}

int nvmlDeviceGetMigMode(void *d, unsigned *cur, unsigned *pending)
{
    *cur = *pending = (unsigned)((dev_t_ *)d)->mig;
    return 0;
}

int nvmlDeviceGetMaxMigDeviceCount(void *d, unsigned *n)
{
    *n = ((dev_t_ *)d)->mig ? 7 : 0;
    return 0;
}

int nvmlDeviceGetMigDeviceHandleByIndex(void *d, unsigned i, void **out)
{
    dev_t_ *g = d;
    if (i >= 7 || g->slices[i] == NULL)
        return 6; /* NVML_ERROR_NOT_FOUND */
    *out = g->slices[i];
    return 0;
}

int nvmlDeviceGetGpuInstanceId(void *d, unsigned *id)
{
    *id = d == &slice_a ? 7 : 2;
    return 0;
}

int nvmlDeviceGetComputeInstanceId(void *d, unsigned *id)
{
    (void)d;
    *id = 0;
    return 0;
}

int nvmlDeviceGetUtilizationRates(void *d, unsigned *u)
{
    dev_t_ *g = d;
    if (g == &slice_a || g == &slice_b)
        return 3; /* NVML_ERROR_NOT_SUPPORTED */
    u[0] = g->util;
    u[1] = g->util / 2;
    return 0;
}

int nvmlDeviceGetTemperature(void *d, int sensor, unsigned *t)
{
    if (sensor != 0)
        return 2;
    *t = ((dev_t_ *)d)->temp;
    return 0;
}

int nvmlDeviceGetPowerUsage(void *d, unsigned *mw)
{
    *mw = ((dev_t_ *)d)->power_mw;
    return 0;
}
