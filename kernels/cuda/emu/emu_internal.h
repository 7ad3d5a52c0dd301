/*
 * Shared by the files of the CUDA emulation: the runtime's state that the
 * launcher (emu_fiber.cpp) and the cuBLAS reference (emu_cublas.cpp) need.
 */
#ifndef INFERGATE_EMU_INTERNAL_H
#define INFERGATE_EMU_INTERNAL_H

#include "cuda_runtime_api.h"
#include "ig_cuda_emu.h"

#include <mutex>

struct ig_emu_stream_s {
    int device;
};

namespace ig_emu {

/* One lock for all device work: launches, copies and cuBLAS calls run one at
 * a time, whichever host thread queues them. Recursive: a launch inside
 * cuBLAS's reference would take it again. */
extern std::recursive_mutex lock;

/* Device memory is readable by host code only inside open_device() ..
 * close_device() (kernels, copies, the cuBLAS reference); elsewhere a host
 * dereference of a device pointer faults and is reported as such. */
void open_device();
void close_device();

/* The allocation holding [p, p + bytes), or -1 when that range is not all
 * inside one live device allocation. */
int device_of_range(const void *p, size_t bytes);
/* Whether p points into any live device allocation. */
bool is_device_ptr(const void *p);

int current_device();
cudaError_t set_error(cudaError_t err); /* records it as the thread's last error */
void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
bool take_fault(const char *what);      /* ig_cuda_emu_fault() matching */
void post_async_error(int device, cudaError_t err); /* seen at the next sync */
extern ig_cuda_emu_counters_t counters;
/* The stream argument as a device, or -1 (bad handle, wrong device). */
int stream_device(cudaStream_t s);
/* The dynamic shared memory a kernel may use: 48 KiB, or what
 * cudaFuncSetAttribute raised it to. */
size_t func_smem_limit(const void *fn);

} // namespace ig_emu

#endif
