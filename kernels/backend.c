/*
 * Opening a backend from a device string, and the stand-in for the CUDA
 * backend in builds without CUDA (kernels/cuda/ provides the real one).
 */
#include "infergate/kernels.h"

#include "infergate/error.h"

#ifdef IG_HAVE_CUDA
#include "cuda/cuda_device.h"
#endif

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A whole non-negative decimal number below 1e6, nothing else. */
static int parse_count(const char *s, int *out)
{
    if (*s < '0' || *s > '9')
        return IG_EINVAL;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < 0 || v > 999999)
        return IG_EINVAL;
    *out = (int)v;
    return 0;
}

#ifdef IG_HAVE_CUDA
/* A MIG slice is device 0 of a process that runs with
 * CUDA_VISIBLE_DEVICES=MIG-<uuid>, but only if CUDA read that variable: set
 * after CUDA started, or naming a slice that another process's variable
 * shadows, it is not. So the opened device's UUID must be the slice's.
 * Old-style names (MIG-GPU-<gpu uuid>/<gi>/<ci>) carry no slice UUID and
 * are taken as they are. */
static int check_mig_uuid(ig_backend_t *be, const char *device, char *err, size_t errlen)
{
    const char *want = device + 4;
    char got[64];
    if (strchr(want, '/') != NULL)
        return 0;
    int rc = ig__cuda_device_uuid(be, got, sizeof(got));
    if (rc != 0) {
        ig_errf(err, errlen, "device '%s': cannot read the UUID of device 0: %s", device,
                ig_strerror(rc));
        return rc;
    }
    size_t n = strlen(got);
    int same = strlen(want) == n;
    for (size_t i = 0; same && i < n; i++)
        same = tolower((unsigned char)want[i]) == got[i];
    if (!same) {
        ig_errf(err, errlen,
                "device '%s': device 0 of this process is MIG-%s, not the requested slice "
                "(was CUDA initialised before CUDA_VISIBLE_DEVICES was set?)",
                device, got);
        return IG_EDEVICE;
    }
    return 0;
}
#else
int ig_backend_cuda_create(ig_backend_t **out, int ordinal, char *err, size_t errlen)
{
    ig_errf(err, errlen, "this build of infergate has no CUDA backend (built without nvcc)");
    return IG_ENOTSUP;
}
#endif

int ig_backend_open(ig_backend_t **out, const char *device, int threads, char *err, size_t errlen)
{
    int n, rc;
    if (device == NULL || out == NULL) {
        ig_errf(err, errlen, "no device given");
        return IG_EINVAL;
    }
    if (strcmp(device, "cpu") == 0 || strncmp(device, "cpu:", 4) == 0) {
        if (device[3] == ':') {
            if (parse_count(device + 4, &n) != 0 || n == 0 || n > 256) {
                ig_errf(err, errlen, "device '%s': expected cpu:THREADS with 1..256 threads",
                        device);
                return IG_EINVAL;
            }
            threads = n; /* the device string names the count: it wins */
        }
        if (threads < 0 || threads > 256) {
            ig_errf(err, errlen, "device '%s': %d threads is out of range 0..256", device, threads);
            return IG_EINVAL;
        }
        rc = ig_backend_cpu_create(out, threads);
        if (rc != 0)
            ig_errf(err, errlen, "device '%s': %s", device, ig_strerror(rc));
        return rc;
    }
    if (strncmp(device, "cuda:", 5) == 0) {
        if (parse_count(device + 5, &n) != 0) {
            ig_errf(err, errlen, "device '%s': expected cuda:N with N a device ordinal", device);
            return IG_EINVAL;
        }
        return ig_backend_cuda_create(out, n, err, errlen);
    }
    if (strncmp(device, "MIG-", 4) == 0) {
        /* The process runs with CUDA_VISIBLE_DEVICES=MIG-<uuid>, so the slice
         * is the only device CUDA enumerates. */
        size_t len = strlen(device + 4);
        if (len == 0 || len > 64 || strspn(device + 4, "0123456789abcdefABCDEF-/") != len) {
            ig_errf(err, errlen, "device '%s': expected MIG-<uuid> as nvidia-smi -L prints it",
                    device);
            return IG_EINVAL;
        }
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        /* Unset: select the slice here, which works while CUDA is not yet
         * initialised in this process. Set to something else: refuse, the
         * slice would not be device 0. */
        if (vis == NULL && setenv("CUDA_VISIBLE_DEVICES", device, 1) == 0)
            vis = device;
        if (vis == NULL || strcmp(vis, device) != 0) {
            ig_errf(err, errlen,
                    "device '%s': the process must run with CUDA_VISIBLE_DEVICES=%s (one MIG "
                    "slice per process)",
                    device, device);
            return IG_EINVAL;
        }
        rc = ig_backend_cuda_create(out, 0, err, errlen);
#ifdef IG_HAVE_CUDA
        if (rc == 0 && (rc = check_mig_uuid(*out, device, err, errlen)) != 0) {
            (*out)->destroy(*out);
            *out = NULL;
        }
#endif
        return rc;
    }
    ig_errf(err, errlen, "unknown device '%s': expected cpu, cpu:THREADS, cuda:N or MIG-<uuid>",
            device);
    return IG_EINVAL;
}
