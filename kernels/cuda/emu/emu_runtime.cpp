/*
 * The CUDA emulation's runtime: devices, device memory, streams, copies and
 * errors, on the host.
 *
 * Device memory is its own mapping per allocation, the buffer placed against
 * a guard page (an overrun faults) and kept PROT_NONE whenever no kernel,
 * copy or cuBLAS call runs: host code that dereferences a device pointer
 * faults, and the SIGSEGV handler names the allocation. Copies check their
 * direction against where each pointer lives. Work runs when it is queued
 * (streams are in order anyway); an injected fault (ig_cuda_emu_fault) is
 * reported by the next synchronizing call on its device, as a real
 * asynchronous fault is. IG_CUDA_EMU_DEVICES sets the number of devices (2).
 */
#include "cuda_runtime.h"
#include "emu_internal.h"

#include <map>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace ig_emu {

std::recursive_mutex lock;
ig_cuda_emu_counters_t counters;

namespace {

const size_t PAGE = 4096;
const size_t TOTAL_MEM = (size_t)16 << 30;
const size_t SMEM_DEFAULT = 48 * 1024, SMEM_OPTIN = 227 * 1024;

struct alloc_s {
    char *map;      /* the mapping: data pages, then the guard page */
    size_t map_len; /* data pages only */
    size_t bytes;
    int device;
    bool open; /* readable now: device work touched it since open_device() */
};

std::map<uintptr_t, alloc_s> allocs; /* by start of the buffer */
std::map<uintptr_t, size_t> pinned;  /* cudaHostAlloc'd host memory */
std::map<const void *, size_t> smem_limits;
std::vector<std::string> faults;
std::vector<cudaError_t> async_err;
size_t live_bytes;
int open_depth;
std::vector<alloc_s *> opened;
struct sigaction displaced; /* the SIGSEGV handler before ours, between opens */
int ndevices = -1;
thread_local int cur_device;
thread_local cudaError_t last_error;

int devices()
{
    if (ndevices < 0) {
        const char *e = getenv("IG_CUDA_EMU_DEVICES");
        ndevices = e ? atoi(e) : 2;
        if (ndevices < 0 || ndevices > 8)
            ndevices = 2;
        async_err.assign((size_t)ndevices, cudaSuccess);
    }
    return ndevices;
}

const alloc_s *find(const void *p, uintptr_t *start)
{
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin())
        return NULL;
    --it;
    if (a >= it->first + it->second.bytes && !(it->second.bytes == 0 && a == it->first))
        return NULL;
    if (start)
        *start = it->first;
    return &it->second;
}

/* Device memory is PROT_NONE until device work touches it: the fault lands
 * here, and inside open_device() .. close_device() the allocation is opened
 * (and closed again by close_device); outside, it is a host dereference. */
void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (auto &kv : allocs) {
        alloc_s &al = kv.second;
        uintptr_t lo = (uintptr_t)al.map, hi = lo + al.map_len + PAGE;
        if (a < lo || a >= hi)
            continue;
        char msg[256];
        int n;
        if (a >= kv.first + al.bytes || a < kv.first) {
            n = snprintf(msg, sizeof(msg),
                         "cuda-emu: access %s a device allocation of %zu bytes (device %d), "
                         "offset %lld\n",
                         a < kv.first ? "before" : "past the end of", al.bytes, al.device,
                         (long long)(a - kv.first));
        } else if (open_depth > 0 && !al.open) {
            if (mprotect(al.map, al.map_len, PROT_READ | PROT_WRITE) == 0) {
                al.open = true;
                opened.push_back(&al);
                return; /* the access runs again, now allowed */
            }
            n = snprintf(msg, sizeof(msg), "cuda-emu: mprotect failed\n");
        } else {
            n = snprintf(msg, sizeof(msg),
                         "cuda-emu: host code dereferenced device memory: offset %zu of an "
                         "allocation of %zu bytes (device %d)\n",
                         (size_t)(a - kv.first), al.bytes, al.device);
        }
        if (n > 0)
            (void)!write(2, msg, (size_t)n);
        break;
    }
    /* Not ours to allow: the access runs again under the handler we
     * displaced (a test harness's, a sanitizer's) or the default one. */
    sigaction(sig, &displaced, NULL);
}


/* A host wait on device dev: reports (and clears) its asynchronous error.
 * counted: whether the caller asked for the wait (cudaFree's is implied). */
cudaError_t sync_device(int dev, bool counted = true)
{
    if (counted)
        counters.syncs++;
    devices();
    if (take_fault("cudaStreamSynchronize"))
        post_async_error(dev, cudaErrorLaunchFailure);
    cudaError_t e = async_err[(size_t)dev];
    async_err[(size_t)dev] = cudaSuccess; /* reported once (docs/gpu.md) */
    return set_error(e);
}

bool is_pinned(const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    auto it = pinned.upper_bound(a);
    if (it == pinned.begin())
        return false;
    --it;
    return a + bytes <= it->first + it->second;
}

} // namespace

void open_device()
{
    if (open_depth++ > 0)
        return;
    /* Installed for each piece of device work: a harness (cmocka) may have
     * put its own in place since. Outside device work, a fault on device
     * memory is then that handler's to report. */
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, &displaced);
}

void close_device()
{
    if (--open_depth > 0)
        return;
    for (alloc_s *al : opened) {
        mprotect(al->map, al->map_len, PROT_NONE);
        al->open = false;
    }
    opened.clear();
    struct sigaction cur;
    if (sigaction(SIGSEGV, NULL, &cur) == 0 && cur.sa_sigaction == on_segv)
        sigaction(SIGSEGV, &displaced, NULL);
}

int device_of_range(const void *p, size_t bytes)
{
    uintptr_t start;
    const alloc_s *a = find(p, &start);
    if (!a || (uintptr_t)p + bytes > start + a->bytes)
        return -1;
    return a->device;
}

bool is_device_ptr(const void *p)
{
    return find(p, NULL) != NULL;
}

int current_device()
{
    return cur_device;
}

cudaError_t set_error(cudaError_t err)
{
    if (err != cudaSuccess)
        last_error = err;
    return err;
}

void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda-emu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

bool take_fault(const char *what)
{
    for (size_t i = 0; i < faults.size(); i++)
        if (faults[i] == what) {
            faults.erase(faults.begin() + (long)i);
            return true;
        }
    return false;
}

void post_async_error(int device, cudaError_t err)
{
    devices();
    if (async_err[(size_t)device] == cudaSuccess)
        async_err[(size_t)device] = err;
}

int stream_device(cudaStream_t s)
{
    int dev = s ? s->device : cur_device;
    if (dev != cur_device) {
        fprintf(stderr, "cuda-emu: work queued on a stream of device %d while device %d is "
                        "current\n", dev, cur_device);
        return -1;
    }
    return dev;
}

size_t func_smem_limit(const void *fn)
{
    auto it = smem_limits.find(fn);
    return it == smem_limits.end() ? SMEM_DEFAULT : it->second;
}

} // namespace ig_emu

using namespace ig_emu;

#define API_FAULT(name)                                                                            \
    do {                                                                                           \
        if (take_fault(name))                                                                      \
            return set_error(cudaErrorDevicesUnavailable);                                         \
    } while (0)

extern "C" {

const char *cudaGetErrorString(cudaError_t err)
{
    switch (err) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
        return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
        return "invalid copy direction for memcpy";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    case cudaErrorDevicesUnavailable:
        return "CUDA-capable device(s) is/are busy or unavailable";
    case cudaErrorInvalidResourceHandle:
        return "invalid resource handle";
    case cudaErrorIllegalAddress:
        return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
        return "unspecified launch failure";
    }
    return "unknown error";
}

const char *cudaGetErrorName(cudaError_t err)
{
    switch (err) {
    case cudaSuccess:
        return "cudaSuccess";
    case cudaErrorInvalidValue:
        return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
        return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
        return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
        return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
        return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice:
        return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
        return "cudaErrorInvalidDevice";
    case cudaErrorDevicesUnavailable:
        return "cudaErrorDevicesUnavailable";
    case cudaErrorInvalidResourceHandle:
        return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress:
        return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure:
        return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    return last_error;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    *count = devices();
    return *count ? cudaSuccess : set_error(cudaErrorNoDevice);
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    if (device < 0 || device >= devices())
        return set_error(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "infergate CUDA emulation %d", device);
    /* A fixed UUID per device: ee000000-0000-4000-8000-00000000000N. */
    unsigned char u[16] = {0xee, 0, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 0};
    u[15] = (unsigned char)device;
    memcpy(prop->uuid.bytes, u, 16);
    prop->totalGlobalMem = TOTAL_MEM;
    prop->sharedMemPerBlock = SMEM_DEFAULT;
    prop->sharedMemPerBlockOptin = SMEM_OPTIN;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->multiProcessorCount = 132;
    prop->major = 9;
    prop->minor = 0;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device)
{
    (void)attr;
    if (device < 0 || device >= devices())
        return set_error(cudaErrorInvalidDevice);
    *value = 0;
    /* The emulation has no memory clock or bus: a bandwidth from them would
     * be invented. */
    return set_error(cudaErrorInvalidValue);
}

cudaError_t cudaSetDevice(int device)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    API_FAULT("cudaSetDevice");
    if (device < 0 || device >= devices())
        return set_error(cudaErrorInvalidDevice);
    cur_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    *device = cur_device;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    return sync_device(cur_device);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    *total_bytes = TOTAL_MEM;
    *free_bytes = TOTAL_MEM - live_bytes;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    API_FAULT("cudaMalloc");
    *ptr = NULL;
    devices();
    size_t rounded = (bytes + 255) & ~(size_t)255; /* cudaMalloc aligns to 256 */
    if (rounded == 0)
        rounded = 256;
    if (live_bytes + rounded > TOTAL_MEM)
        return set_error(cudaErrorMemoryAllocation);
    size_t len = (rounded + PAGE - 1) / PAGE * PAGE;
    char *m = (char *)mmap(NULL, len + PAGE, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return set_error(cudaErrorMemoryAllocation);
    char *p = m + len - rounded; /* the buffer ends where the guard page starts */
    memset(p, 0xff, rounded);     /* uninitialised device memory reads as NaN */
    mprotect(m + len, PAGE, PROT_NONE);
#if defined(__SANITIZE_ADDRESS__)
    ASAN_POISON_MEMORY_REGION(p + bytes, rounded - bytes);
#endif
    mprotect(m, len, PROT_NONE); /* opened by the first device access (on_segv) */
    allocs[(uintptr_t)p] = alloc_s{m, len, bytes, cur_device, false};
    live_bytes += rounded;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    if (!ptr)
        return cudaSuccess;
    auto it = allocs.find((uintptr_t)ptr);
    if (it == allocs.end()) {
        fprintf(stderr, "cuda-emu: cudaFree(%p): not the start of a device allocation\n", ptr);
        return set_error(cudaErrorInvalidDevicePointer);
    }
    /* cudaFree waits for the device's queued work. */
    sync_device(it->second.device, false);
#if defined(__SANITIZE_ADDRESS__)
    ASAN_UNPOISON_MEMORY_REGION(ptr, (it->second.bytes + 255) & ~(size_t)255);
#endif
    for (size_t i = 0; i < opened.size(); i++)
        if (opened[i] == &it->second)
            opened.erase(opened.begin() + (long)i);
    munmap(it->second.map, it->second.map_len + PAGE);
    size_t rounded = (it->second.bytes + 255) & ~(size_t)255;
    live_bytes -= rounded ? rounded : 256;
    allocs.erase(it);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **ptr, size_t bytes, unsigned flags)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    (void)flags;
    *ptr = malloc(bytes ? bytes : 1);
    if (!*ptr)
        return set_error(cudaErrorMemoryAllocation);
    pinned[(uintptr_t)*ptr] = bytes;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t bytes)
{
    return cudaHostAlloc(ptr, bytes, 0);
}

cudaError_t cudaFreeHost(void *ptr)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    if (!ptr)
        return cudaSuccess;
    if (pinned.erase((uintptr_t)ptr) == 0)
        return set_error(cudaErrorInvalidValue);
    free(ptr);
    return cudaSuccess;
}

static cudaError_t copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                        cudaStream_t stream, bool async)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    int dev = stream_device(stream);
    if (dev < 0)
        return set_error(cudaErrorInvalidResourceHandle);
    if (bytes == 0)
        return cudaSuccess;
    bool dst_dev = is_device_ptr(dst), src_dev = is_device_ptr(src);
    bool want_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool want_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault) {
        want_dst = dst_dev;
        want_src = src_dev;
    }
    static const char *kinds[] = {"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice",
                                  "Default"};
    if (kind > cudaMemcpyDefault || dst_dev != want_dst || src_dev != want_src) {
        fprintf(stderr,
                "cuda-emu: cudaMemcpy%s %s: dst %p is %s memory, src %p is %s memory\n",
                async ? "Async" : "", kinds[kind <= cudaMemcpyDefault ? kind : 4], dst,
                dst_dev ? "device" : "host", src, src_dev ? "device" : "host");
        return set_error(cudaErrorInvalidMemcpyDirection);
    }
    if ((dst_dev && device_of_range(dst, bytes) < 0) || (src_dev && device_of_range(src, bytes) < 0)) {
        fprintf(stderr, "cuda-emu: cudaMemcpy%s of %zu bytes runs past a device allocation\n",
                async ? "Async" : "", bytes);
        return set_error(cudaErrorInvalidValue);
    }
    if (dst_dev && !src_dev) {
        counters.uploads++;
        if (!is_pinned(src, bytes))
            counters.pageable_uploads++;
    } else if (src_dev && !dst_dev) {
        counters.downloads++;
    }
    open_device();
    memmove(dst, src, bytes);
    close_device();
    if (!async)
        return sync_device(dev);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    return copy(dst, src, bytes, kind, NULL, false);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    return copy(dst, src, bytes, kind, stream, true);
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    if (stream_device(stream) < 0)
        return set_error(cudaErrorInvalidResourceHandle);
    if (bytes && device_of_range(ptr, bytes) < 0)
        return set_error(cudaErrorInvalidValue);
    counters.launches++;
    open_device();
    memset(ptr, value, bytes);
    close_device();
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    (void)flags;
    API_FAULT("cudaStreamCreateWithFlags");
    *stream = new ig_emu_stream_s{cur_device};
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    int dev = stream ? stream->device : cur_device;
    return sync_device(dev);
}

cudaError_t ig_emu_func_set_attribute(const void *func, cudaFuncAttribute attr, int value)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        (size_t)value > SMEM_OPTIN)
        return set_error(cudaErrorInvalidValue);
    smem_limits[func] = (size_t)value;
    return cudaSuccess;
}

/* ---- the emulation's own interface (ig_cuda_emu.h) ------------------------- */

void ig_cuda_emu_counters(ig_cuda_emu_counters_t *out)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    *out = counters;
}

void ig_cuda_emu_fault(const char *what)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    faults.push_back(what);
}

size_t ig_cuda_emu_live_allocations(void)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    return allocs.size();
}

size_t ig_cuda_emu_live_bytes(void)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    return live_bytes;
}

} /* extern "C" */
