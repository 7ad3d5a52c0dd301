/*
 * The CUDA emulation's cuBLAS: the one call the backend makes, cublasGemmEx,
 * as a plain column-major reference (double accumulation) after the checks
 * cuBLAS documents: a live handle on the current device, valid operations,
 * m, n, k >= 0, leading dimensions at least the stored rows, A and B of one
 * 16-bit type with C in F32 and CUBLAS_COMPUTE_32F, and every matrix inside
 * one device allocation.
 */
#include "cublas_v2.h"
#include "cuda_runtime.h"
#include "emu_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include <vector>

extern "C" {
#include "infergate/dtype.h"
}

struct ig_emu_cublas_s {
    int device;
    cudaStream_t stream;
};

using namespace ig_emu;

static cublasStatus_t refuse(const char *why)
{
    fprintf(stderr, "cuda-emu: cublasGemmEx: %s\n", why);
    return CUBLAS_STATUS_INVALID_VALUE;
}

static float elem(const void *p, cudaDataType_t t, size_t i)
{
    uint16_t h = ((const uint16_t *)p)[i];
    return t == CUDA_R_16BF ? ig_bf16_to_f32(h) : ig_f16_to_f32(h);
}

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    *handle = new ig_emu_cublas_s{current_device(), NULL};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (stream && stream->device != handle->device)
        return refuse("cublasSetStream: the stream belongs to another device");
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *ws, size_t bytes)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && device_of_range(ws, bytes) != handle->device)
        return refuse("cublasSetWorkspace: the workspace is not device memory of the handle's "
                      "device");
    if ((uintptr_t)ws % 256)
        return refuse("cublasSetWorkspace: the workspace is not 256-byte aligned");
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t st)
{
    switch (st) {
    case CUBLAS_STATUS_SUCCESS:
        return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "the GPU program failed to execute";
    default:
        return "unknown cuBLAS status";
    }
}

const char *cublasGetStatusName(cublasStatus_t st)
{
    switch (st) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    default:
        return "CUBLAS_STATUS_UNKNOWN";
    }
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType_t Atype, int lda, const void *B,
                            cudaDataType_t Btype, int ldb, const void *beta, void *C,
                            cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    (void)algo;
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (handle->device != current_device())
        return refuse("the handle was created on another device than the current one");
    if (stream_device(handle->stream) < 0)
        return CUBLAS_STATUS_EXECUTION_FAILED;
    if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) ||
        (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T))
        return refuse("transa/transb must be CUBLAS_OP_N or CUBLAS_OP_T");
    if (m < 0 || n < 0 || k < 0)
        return refuse("m, n and k must not be negative");
    int a_rows = transa == CUBLAS_OP_N ? m : k, a_cols = transa == CUBLAS_OP_N ? k : m;
    int b_rows = transb == CUBLAS_OP_N ? k : n, b_cols = transb == CUBLAS_OP_N ? n : k;
    if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) ||
        ldc < (m > 1 ? m : 1))
        return refuse("a leading dimension is smaller than the rows it strides over");
    if (Atype != Btype || (Atype != CUDA_R_16BF && Atype != CUDA_R_16F) || Ctype != CUDA_R_32F ||
        computeType != CUBLAS_COMPUTE_32F)
        return refuse("only A, B in one of BF16/F16 with C in F32 and CUBLAS_COMPUTE_32F are "
                      "emulated");
    if (!alpha || !beta || is_device_ptr(alpha) || is_device_ptr(beta))
        return refuse("alpha and beta must be host pointers (CUBLAS_POINTER_MODE_HOST)");
    counters.launches++;
    if (m == 0 || n == 0)
        return CUBLAS_STATUS_SUCCESS;
    size_t a_n = k ? (size_t)(a_cols - 1) * lda + a_rows : 0;
    size_t b_n = k ? (size_t)(b_cols - 1) * ldb + b_rows : 0;
    size_t c_n = (size_t)(n - 1) * ldc + m;
    if ((a_n && device_of_range(A, a_n * 2) < 0) || (b_n && device_of_range(B, b_n * 2) < 0) ||
        device_of_range(C, c_n * 4) < 0)
        return refuse("a matrix is not inside one device allocation");
    float al = *(const float *)alpha, be = *(const float *)beta;
    open_device();
    /* op(A) as (m, k) and op(B) as (n, k) rows of floats, then dot products. */
    std::vector<float> a((size_t)m * k), b((size_t)n * k);
    for (int i = 0; i < m; i++)
        for (int p = 0; p < k; p++)
            a[(size_t)i * k + p] =
                elem(A, Atype, transa == CUBLAS_OP_N ? (size_t)p * lda + i : (size_t)i * lda + p);
    for (int j = 0; j < n; j++)
        for (int p = 0; p < k; p++)
            b[(size_t)j * k + p] =
                elem(B, Btype, transb == CUBLAS_OP_N ? (size_t)j * ldb + p : (size_t)p * ldb + j);
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < m; i++) {
            const float *ar = a.data() + (size_t)i * k, *br = b.data() + (size_t)j * k;
            double s = 0;
            for (int p = 0; p < k; p++)
                s += (double)ar[p] * br[p];
            float *c = (float *)C + (size_t)j * ldc + i;
            *c = (float)(al * s + (be != 0.0f ? (double)be * *c : 0.0));
        }
    }
    close_device();
    return CUBLAS_STATUS_SUCCESS;
}

} /* extern "C" */
