#ifndef INFERGATE_CUDA_MODULE_H
#define INFERGATE_CUDA_MODULE_H

/*
 * The CUDA backend as a module, libinfergate_cuda.so beside the binary
 * (docs/gpu.md, "The CUDA module"): kernels/cuda_loader.c loads it on the
 * first cuda:N or MIG device a process opens, so that cuBLAS, which takes
 * about a second to load, is loaded only by the processes that use a GPU.
 * The module exports one symbol, ig__cuda_module_entry.
 */

#include "infergate/kernels.h"
#include "infergate/log.h"

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IG_CUDA_MODULE_FILE "libinfergate_cuda.so"
#define IG_CUDA_MODULE_ABI 2 /* raised when a struct below changes */

/* What the module uses of the process that loads it. */
typedef struct {
    void (*logv)(ig_log_level_t level, const char *fmt, va_list ap);
} ig__cuda_host_t;

/* What the module gives it: the backend's entry points. */
typedef struct {
    int abi;
    int (*create)(ig_backend_t **out, int ordinal, char *err, size_t errlen);
    int (*device_uuid)(ig_backend_t *be, char *out, size_t len);
} ig__cuda_module_t;

/* Keeps host, fills out; returns IG_CUDA_MODULE_ABI. */
typedef int (*ig__cuda_module_entry_fn)(const ig__cuda_host_t *host, ig__cuda_module_t *out);
int ig__cuda_module_entry(const ig__cuda_host_t *host, ig__cuda_module_t *out);

/* Inside the module: keeps host for ig_log (cuda_log.c); the entry calls it. */
void ig__cuda_log_host(const ig__cuda_host_t *h);

#ifdef __cplusplus
}
#endif

#endif
