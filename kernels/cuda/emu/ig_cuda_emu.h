/*
 * The CUDA emulation's own interface (builds with -DIG_CUDA_EMU=ON only):
 * what tests and gpubench ask of the emulated device beyond the CUDA API.
 * docs/gpu.md, "The CUDA emulation", says what is emulated and how.
 */
#ifndef INFERGATE_CUDA_EMU_H
#define INFERGATE_CUDA_EMU_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Work the emulated device has seen since the process started. A decode
 * step's share is the difference of two readings. */
typedef struct {
    unsigned long long launches;         /* kernels and cuBLAS calls queued */
    unsigned long long syncs;            /* host waits: stream/device synchronize, cudaMemcpy */
    unsigned long long uploads;          /* host-to-device copies */
    unsigned long long pageable_uploads; /* of those, from memory not from cudaHostAlloc */
    unsigned long long downloads;        /* device-to-host copies */
} ig_cuda_emu_counters_t;

void ig_cuda_emu_counters(ig_cuda_emu_counters_t *out);

/* Makes the next use of `what` fail once: a kernel name ("rmsnorm_kernel")
 * faults asynchronously (the kernel does not run; the next synchronizing
 * call on its device returns cudaErrorLaunchFailure), an API name
 * ("cudaSetDevice") returns cudaErrorDevicesUnavailable. */
void ig_cuda_emu_fault(const char *what);

/* Device allocations alive now, and their bytes. */
size_t ig_cuda_emu_live_allocations(void);
size_t ig_cuda_emu_live_bytes(void);

/* The thread order in use: "forward", "reverse", "random:SEED" or
 * "ahead:WARP" (IG_CUDA_EMU_ORDER). */
const char *ig_cuda_emu_order(void);

#ifdef __cplusplus
}
#endif

#endif
