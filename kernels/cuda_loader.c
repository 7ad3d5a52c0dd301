/*
 * Loads the CUDA backend module (kernels/cuda/cuda_module.h) on first use
 * and forwards the backend's entry points to it. A build without CUDA, or
 * with the CUDA emulation (linked in directly), has no module.
 */
#if defined(IG_HAVE_CUDA) && !defined(IG_CUDA_EMU)

#include "cuda/cuda_device.h"
#include "cuda/cuda_module.h"

#include "infergate/error.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static ig__cuda_module_t module; /* create is NULL when it did not load */
#define PATH_CAP (PATH_MAX + sizeof(IG_CUDA_MODULE_FILE))
static char why[PATH_CAP + 256];

/* IG_CUDA_MODULE, else the module beside this process's binary. */
static void module_path(char *out, size_t cap)
{
    const char *env = getenv("IG_CUDA_MODULE");
    if (env != NULL && *env != '\0') {
        snprintf(out, cap, "%s", env);
        return;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    char *slash = n > 0 ? (exe[n] = '\0', strrchr(exe, '/')) : NULL;
    if (slash == NULL) {
        snprintf(out, cap, "%s", IG_CUDA_MODULE_FILE); /* the loader's search path */
        return;
    }
    slash[1] = '\0';
    snprintf(out, cap, "%s%s", exe, IG_CUDA_MODULE_FILE);
}

static void load(void)
{
    char path[PATH_CAP];
    module_path(path, sizeof(path));
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(why, sizeof(why), "cannot load the CUDA backend: %s", dlerror());
        return;
    }
    ig__cuda_module_entry_fn entry = (ig__cuda_module_entry_fn)dlsym(h, "ig__cuda_module_entry");
    ig__cuda_host_t host = {.logv = ig_logv};
    ig__cuda_module_t m = {0};
    if (entry == NULL || entry(&host, &m) != IG_CUDA_MODULE_ABI || m.create == NULL) {
        snprintf(why, sizeof(why), "%s is not this build's CUDA backend", path);
        dlclose(h);
        return;
    }
    module = m; /* kept loaded for the life of the process */
}

int ig_backend_cuda_create(ig_backend_t **out, int ordinal, char *err, size_t errlen)
{
    pthread_once(&once, load);
    if (module.create == NULL) {
        ig_errf(err, errlen, "%s", why);
        return IG_ENOTSUP;
    }
    return module.create(out, ordinal, err, errlen);
}

int ig__cuda_device_uuid(ig_backend_t *be, char *out, size_t len)
{
    pthread_once(&once, load);
    return module.device_uuid != NULL ? module.device_uuid(be, out, len) : IG_EINVAL;
}

#endif
