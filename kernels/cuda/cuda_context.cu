/*
 * What every file of the CUDA backend calls while running an operation: the
 * mapping of CUDA and cuBLAS statuses to IG_E* codes (IG_CUDA_CHECK), the
 * check after a launch, making the backend's device current, and growing a
 * scratch buffer. Below cuda_backend.cu, cuda_ops.cu and cuda_attention.cu,
 * so the operations call down into it and never back into the backend that
 * names them in its table.
 */
#include "cuda_internal.h"

#include <stddef.h>

/* ======================================================================== */
/* Error mapping                                                            */
/* ======================================================================== */

int ig__cuda_status(cudaError_t st, const char *expr, const char *file, int line)
{
    if (st == cudaSuccess)
        return 0;
    ig_log(IG_LOG_ERROR, "cuda: %s failed at %s:%d: %s (%s)", expr, file, line,
           cudaGetErrorString(st), cudaGetErrorName(st));
    /* Reported here: clear it, or the next launch's cudaGetLastError would
     * report it again against that launch. */
    (void)cudaGetLastError();
    return IG_EDEVICE;
}

int ig__cuda_status(cublasStatus_t st, const char *expr, const char *file, int line)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return 0;
    ig_log(IG_LOG_ERROR, "cublas: %s failed at %s:%d: %s (%s)", expr, file, line,
           cublasGetStatusString(st), cublasGetStatusName(st));
    return IG_EDEVICE;
}

int ig__cuda_launched(ig__cuda_t *c, const char *op)
{
    cudaError_t st = cudaGetLastError();
    if (st == cudaSuccess && c->sync_each)
        st = cudaStreamSynchronize(c->stream);
    if (st == cudaSuccess)
        return 0;
    ig_log(IG_LOG_ERROR, "cuda: %s failed on %s: %s (%s)", op, c->name, cudaGetErrorString(st),
           cudaGetErrorName(st));
    (void)cudaGetLastError(); /* reported: not again at the next launch */
    return IG_EDEVICE;
}

int ig__cuda_enter(ig__cuda_t *c)
{
    /* The current device is per host thread and anyone may change it (another
     * backend, a library): ask the runtime, which keeps it in host memory,
     * rather than remember what this thread was last given. */
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == c->ordinal)
        return 0;
    return IG_CUDA_CHECK(cudaSetDevice(c->ordinal));
}

int ig__cuda_scratch(ig__cuda_t *c, void **buf, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return 0;
    int rc;
    size_t want = bytes + bytes / 4; /* some headroom so that growth is rare */
    if (*buf) {
        /* Queued kernels may still read the old buffer. */
        if ((rc = IG_CUDA_CHECK(cudaStreamSynchronize(c->stream))) != 0)
            return rc;
        if ((rc = IG_CUDA_CHECK(cudaFree(*buf))) != 0)
            return rc;
        *buf = NULL;
        *cap = 0;
    }
    if ((rc = IG_CUDA_CHECK(cudaMalloc(buf, want))) != 0) {
        *buf = NULL;
        return rc;
    }
    *cap = want;
    return 0;
}
