#ifndef INFERGATE_CUDA_DEVICE_H
#define INFERGATE_CUDA_DEVICE_H

/*
 * What kernels/backend.c asks of a CUDA backend beyond the kernel table:
 * which physical device (or MIG slice) it runs on. Only built with CUDA
 * (IG_HAVE_CUDA).
 */

#include "infergate/kernels.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes the UUID of be's device (cudaDeviceProp.uuid) as 36 lower-case
 * characters, "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", without the GPU- or
 * MIG- prefix NVML puts before it. 0, IG_EINVAL (not a CUDA backend, out too
 * short) or IG_EDEVICE. */
int ig__cuda_device_uuid(ig_backend_t *be, char *out, size_t len);

#ifdef __cplusplus
}
#endif

#endif
