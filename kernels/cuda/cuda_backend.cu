/*
 * The CUDA backend: device memory, weight upload, cuBLAS GEMM and the
 * backend table. The elementwise kernels live in cuda_ops.cu, attention in
 * cuda_attention.cu, and what all three call (status checks, entering the
 * device, scratch) in cuda_context.cu.
 *
 * All work of one backend instance is queued on its one stream, so the
 * operations of a forward pass are ordered without any host wait; download()
 * and sync() are the only points where the host waits.
 *
 * Weights: 2-D tensors live on the device as BF16 (an F32 checkpoint is
 * rounded to BF16 once at upload, round-to-nearest-even) or F16 (kept as
 * stored); 1-D tensors (norm weights, biases) are widened to F32, which costs
 * nothing and keeps them exact. Every product accumulates in F32.
 */
#include "cuda_internal.h"

#include "cuda_device.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ======================================================================== */
/* Memory                                                                   */
/* ======================================================================== */

static void *cuda_alloc(ig_backend_t *be, size_t bytes)
{
    ig__cuda_t *c = ig__cuda(be);
    void *p = NULL;
    if (ig__cuda_enter(c) != 0)
        return NULL;
    if (bytes == 0)
        bytes = 1;
    cudaError_t st = cudaMalloc(&p, bytes);
    if (st == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* not sticky: clear it, the caller sees NULL */
        return NULL;
    }
    if (IG_CUDA_CHECK(st) != 0)
        return NULL;
    /* Zeroed like calloc: a KV block never written still reads as finite
     * numbers, so 0 * garbage can never turn into NaN. */
    if (IG_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, c->stream)) != 0) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_free(ig_backend_t *be, void *ptr)
{
    if (!ptr)
        return;
    /* cudaFree waits for the device, so queued work that reads ptr is done.
     * It frees memory of any device (unified addressing), so a failure to
     * enter ours is logged and the memory is still released. */
    (void)ig__cuda_enter(ig__cuda(be));
    (void)IG_CUDA_CHECK(cudaFree(ptr));
}

/* Copies bytes between host and device, ordered with the queued kernels.
 * From pageable memory an upload is staged before this returns, so the
 * caller may reuse src at once; a download waits until dst holds the bytes. */
static int cuda_copy(ig_backend_t *be, void *dst, const void *src, size_t bytes,
                     cudaMemcpyKind kind)
{
    ig__cuda_t *c;
    int rc = ig__cuda_begin(be, bytes, &c);
    if (rc <= 0)
        return rc;
    rc = IG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, c->stream));
    if (rc != 0 || kind == cudaMemcpyHostToDevice)
        return rc;
    return IG_CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static int cuda_upload(ig_backend_t *be, void *dst, const void *src, size_t bytes)
{
    return cuda_copy(be, dst, src, bytes, cudaMemcpyHostToDevice);
}

static int cuda_download(ig_backend_t *be, void *dst, const void *src, size_t bytes)
{
    return cuda_copy(be, dst, src, bytes, cudaMemcpyDeviceToHost);
}

static int cuda_sync(ig_backend_t *be)
{
    ig__cuda_t *c = ig__cuda(be);
    int rc;
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    return IG_CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static int cuda_mem_info(ig_backend_t *be, size_t *free_bytes, size_t *total_bytes)
{
    ig__cuda_t *c = ig__cuda(be);
    int rc;
    size_t f = 0, t = 0;
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    if ((rc = IG_CUDA_CHECK(cudaMemGetInfo(&f, &t))) != 0)
        return rc;
    if (free_bytes)
        *free_bytes = f;
    if (total_bytes)
        *total_bytes = t;
    return 0;
}

/* ======================================================================== */
/* Weights                                                                  */
/* ======================================================================== */

/* Bytes per element (ig_dtype_size() without a dependency on the model
 * module). */
static size_t dtype_bytes(ig_dtype_t dtype)
{
    return dtype == IG_DTYPE_F32 ? 4 : 2;
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN stays a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float f16_to_f32(uint16_t h)
{
    __half_raw raw;
    raw.x = h;
    return __half2float(__half(raw));
}

/* Converts n elements of src to dst_dtype on the host, chunk by chunk, and
 * copies them to dst: the staging buffer stays small whatever the tensor. */
static int upload_converted(ig__cuda_t *c, void *dst, ig_dtype_t dst_dtype, const void *src,
                            ig_dtype_t src_dtype, size_t n)
{
    enum { CHUNK = 1 << 20 };
    size_t esz = dtype_bytes(dst_dtype);
    unsigned char *stage = (unsigned char *)malloc((size_t)CHUNK * esz);
    int rc = 0;
    if (!stage)
        return IG_ENOMEM;
    for (size_t off = 0; off < n; off += CHUNK) {
        size_t len = n - off < (size_t)CHUNK ? n - off : (size_t)CHUNK;
        for (size_t i = 0; i < len; i++) {
            float f;
            size_t j = off + i;
            switch (src_dtype) {
            case IG_DTYPE_F32:
                memcpy(&f, (const unsigned char *)src + 4 * j, 4);
                break;
            case IG_DTYPE_F16: {
                uint16_t h;
                memcpy(&h, (const unsigned char *)src + 2 * j, 2);
                f = f16_to_f32(h);
                break;
            }
            default: {
                uint16_t h;
                memcpy(&h, (const unsigned char *)src + 2 * j, 2);
                f = bf16_to_f32(h);
                break;
            }
            }
            if (dst_dtype == IG_DTYPE_F32) {
                memcpy(stage + 4 * i, &f, 4);
            } else {
                uint16_t h = f32_to_bf16(f);
                memcpy(stage + 2 * i, &h, 2);
            }
        }
        /* On the backend's stream (a non-blocking stream does not order
         * with the legacy default one). From pageable memory the call
         * returns once the chunk is staged, so the buffer can be refilled. */
        rc = IG_CUDA_CHECK(cudaMemcpyAsync((unsigned char *)dst + off * esz, stage, len * esz,
                                           cudaMemcpyHostToDevice, c->stream));
        if (rc != 0)
            break;
    }
    free(stage);
    return rc;
}

static int cuda_upload_weight(ig_backend_t *be, const ig_tensor_t *src, ig_weight_t *dst)
{
    ig__cuda_t *c = ig__cuda(be);
    int rc;
    void *dev = NULL;
    memset(dst, 0, sizeof(*dst));
    if (!src || !src->data || src->ndim < 1 || src->ndim > 4)
        return IG_EINVAL;
    if (src->dtype != IG_DTYPE_F32 && src->dtype != IG_DTYPE_F16 && src->dtype != IG_DTYPE_BF16)
        return IG_ENOTSUP; /* the block formats run on the CPU backend only (docs/engine.md) */
    int64_t rows = src->shape[0], cols = 1;
    for (int i = 1; i < src->ndim; i++)
        cols *= src->shape[i];
    if (rows <= 0 || cols <= 0)
        return IG_EINVAL;
    size_t n = (size_t)rows * (size_t)cols;

    /* Vectors in F32 (exact, tiny); matrices in BF16, F16 kept as stored. */
    ig_dtype_t dtype = src->ndim == 1               ? IG_DTYPE_F32
                       : src->dtype == IG_DTYPE_F16 ? IG_DTYPE_F16
                                                    : IG_DTYPE_BF16;
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    if ((rc = IG_CUDA_CHECK(cudaMalloc(&dev, n * dtype_bytes(dtype)))) != 0)
        goto fail;
    if (dtype == src->dtype)
        rc = IG_CUDA_CHECK(cudaMemcpyAsync(dev, src->data, n * dtype_bytes(dtype),
                                           cudaMemcpyHostToDevice, c->stream));
    else
        rc = upload_converted(c, dev, dtype, src->data, src->dtype, n);
    if (rc != 0)
        goto fail;
    *dst = (ig_weight_t){.dtype = dtype, .data = dev, .rows = rows, .cols = cols};
    return 0;

fail:
    if (dev)
        cudaFree(dev);
    return rc;
}

static void cuda_free_weight(ig_backend_t *be, ig_weight_t *w)
{
    if (!w)
        return;
    cuda_free(be, w->data);
    memset(w, 0, sizeof(*w));
}

/* ======================================================================== */
/* GEMM                                                                     */
/* ======================================================================== */

/*
 * y(m, n) = x(m, k) W(n, k)^T with everything row-major. cuBLAS is
 * column-major, where a row-major (r, c) matrix reads as its transpose
 * (c, r): so compute y^T(n, m) = W(n, k) x^T(k, m), i.e. A = the stored W
 * (k, n) transposed (OP_T, lda k), B = the stored x (k, m) as is (OP_N,
 * ldb k), C = y (n, m) with ldc n.
 */
static int cuda_matmul(ig_backend_t *be, float *y, const float *x, const ig_weight_t *w,
                       const ig_weight_t *bias, int m)
{
    ig__cuda_t *c = ig__cuda(be);
    int rc;
    if (m <= 0)
        return m == 0 ? 0 : IG_EINVAL;
    if (w->dtype != IG_DTYPE_BF16 && w->dtype != IG_DTYPE_F16)
        return IG_EINVAL;
    if (bias && (bias->dtype != IG_DTYPE_F32 || bias->rows != w->rows))
        return IG_EINVAL;
    if (w->rows > INT32_MAX || w->cols > INT32_MAX)
        return IG_ERANGE;
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    int n = (int)w->rows, k = (int)w->cols;
    const float *b = bias ? (const float *)bias->data : NULL;

    /* Decode rows: one pass over the weights, the bandwidth-bound case. */
    ig__gemv_t g = {IG__GEMV_STORE, x, k, NULL, 0.0f, 1, {w}, {b}, {y}};
    rc = ig__cuda_gemv(c, &g, m);
    if (rc != IG_ENOTSUP)
        return rc;

    /* x in the weights' dtype, then (F16) one scale per row after it. */
    size_t xbytes = ((size_t)m * k * 2 + 15) & ~(size_t)15;
    if ((rc = ig__cuda_scratch(c, &c->act, &c->act_bytes, xbytes + (size_t)m * 4)) != 0)
        return rc;
    float *scale = (float *)((unsigned char *)c->act + xbytes);
    if (w->dtype == IG_DTYPE_F16)
        rc = ig__cuda_convert_f16_rows(c, c->act, scale, x, m, k);
    else
        rc = ig__cuda_convert(c, c->act, w->dtype, x, (size_t)m * k);
    if (rc != 0)
        return rc;
    cudaDataType_t t = w->dtype == IG_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const float alpha = 1.0f, beta = 0.0f;
    rc = IG_CUDA_CHECK(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w->data,
                                    t, k, c->act, t, k, &beta, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
    if (rc == 0)
        rc = ig__cuda_launched(c, "matmul (cublasGemmEx)");
    if (rc != 0)
        return rc;
    if (w->dtype == IG_DTYPE_F16)
        return ig__cuda_unscale_bias(c, y, scale, b, m, n);
    if (b)
        rc = ig__cuda_add_bias(c, y, b, m, n);
    return rc;
}

/* ======================================================================== */
/* The fused decode step                                                    */
/* ======================================================================== */

/* The shapes a fused operation takes: k columns in every weight, a norm of
 * k F32 elements, biases of their weight's rows. */
static int check_fused(const ig_weight_t *norm, const ig_weight_t *const *w,
                       const ig_weight_t *const *bias, int nw, int m)
{
    if (m < 0 || nw < 1 || nw > 3 || !w[0])
        return IG_EINVAL;
    int64_t k = w[0]->cols;
    if (k <= 0 || k > INT32_MAX)
        return IG_EINVAL;
    if (norm && (norm->dtype != IG_DTYPE_F32 || norm->rows != k || norm->cols != 1))
        return IG_EINVAL;
    for (int i = 0; i < nw; i++) {
        if (!w[i] || w[i]->cols != k)
            return IG_EINVAL;
        const ig_weight_t *b = bias ? bias[i] : NULL;
        if (b && (b->dtype != IG_DTYPE_F32 || b->rows != w[i]->rows))
            return IG_EINVAL;
    }
    return 0;
}

/* x normalised into the fused scratch (the plain path's first step), with
 * room for `extra` more floats after it; *xn is x itself without a norm. */
static int fused_prologue(ig_backend_t *be, const float **xn, float **extra_at, const float *x,
                          const ig_weight_t *norm, float eps, int m, int64_t k, size_t extra)
{
    ig__cuda_t *c = ig__cuda(be);
    size_t nx = norm ? (size_t)m * (size_t)k : 0;
    int rc =
        ig__cuda_scratch(c, (void **)&c->fused, &c->fused_bytes, (nx + extra) * sizeof(float) + 16);
    if (rc != 0)
        return rc;
    *xn = x;
    if (extra_at)
        *extra_at = c->fused + ((nx + 3) & ~(size_t)3); /* 16-byte aligned for the GEMV */
    if (norm) {
        if ((rc = ig__cuda_rmsnorm(be, c->fused, x, norm, m, eps)) != 0)
            return rc;
        *xn = c->fused;
    }
    return 0;
}

/* The GEMV of one fused operation on x, its first weight w0 and norm. */
static ig__gemv_t gemv_of(ig__gemv_op_t op, const float *x, const ig_weight_t *w0,
                          const ig_weight_t *norm, float eps)
{
    ig__gemv_t g;
    memset(&g, 0, sizeof(g));
    g.op = op;
    g.x = x;
    g.k = (int)w0->cols;
    g.norm = norm ? (const float *)norm->data : NULL;
    g.eps = eps;
    g.nw = 1;
    g.w[0] = w0;
    return g;
}

static int cuda_norm_matmul(ig_backend_t *be, float *const *y, const float *x,
                            const ig_weight_t *norm, float eps, const ig_weight_t *const *w,
                            const ig_weight_t *const *bias, int nw, int m)
{
    ig__cuda_t *c = ig__cuda(be);
    int rc = check_fused(norm, w, bias, nw, m);
    if (rc != 0 || m == 0)
        return rc;
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    ig__gemv_t g = gemv_of(IG__GEMV_STORE, x, w[0], norm, eps);
    g.nw = nw;
    for (int i = 0; i < nw; i++) {
        g.w[i] = w[i];
        g.bias[i] = bias && bias[i] ? (const float *)bias[i]->data : NULL;
        g.y[i] = y[i];
    }
    if ((rc = ig__cuda_gemv(c, &g, m)) != IG_ENOTSUP)
        return rc;
    /* More rows than the GEMV takes: the plain operations. */
    const float *xn;
    if ((rc = fused_prologue(be, &xn, NULL, x, norm, eps, m, w[0]->cols, 0)) != 0)
        return rc;
    for (int i = 0; i < nw && rc == 0; i++)
        rc = cuda_matmul(be, y[i], xn, w[i], bias ? bias[i] : NULL, m);
    return rc;
}

static int cuda_norm_swiglu(ig_backend_t *be, float *out, const float *x, const ig_weight_t *norm,
                            float eps, const ig_weight_t *w_gate, const ig_weight_t *w_up, int m)
{
    ig__cuda_t *c = ig__cuda(be);
    const ig_weight_t *w[2] = {w_gate, w_up};
    int rc = check_fused(norm, w, NULL, 2, m);
    if (rc == 0 && w_gate->rows != w_up->rows)
        rc = IG_EINVAL;
    if (rc != 0 || m == 0)
        return rc;
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    ig__gemv_t g = gemv_of(IG__GEMV_SWIGLU, x, w_gate, norm, eps);
    g.nw = 2;
    g.w[1] = w_up;
    g.y[0] = out;
    if ((rc = ig__cuda_gemv(c, &g, m)) != IG_ENOTSUP)
        return rc;
    const float *xn;
    float *up;
    size_t n = (size_t)m * (size_t)w_up->rows;
    if ((rc = fused_prologue(be, &xn, &up, x, norm, eps, m, w_gate->cols, n)) != 0 ||
        (rc = cuda_matmul(be, out, xn, w_gate, NULL, m)) != 0 ||
        (rc = cuda_matmul(be, up, xn, w_up, NULL, m)) != 0)
        return rc;
    return ig__cuda_swiglu(be, out, out, up, n);
}

static int cuda_matmul_add(ig_backend_t *be, float *y, const float *x, const ig_weight_t *w, int m)
{
    ig__cuda_t *c = ig__cuda(be);
    int rc = check_fused(NULL, &w, NULL, 1, m);
    if (rc != 0 || m == 0)
        return rc;
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    ig__gemv_t g = gemv_of(IG__GEMV_ADD, x, w, NULL, 0.0f);
    g.y[0] = y;
    if ((rc = ig__cuda_gemv(c, &g, m)) != IG_ENOTSUP)
        return rc;
    const float *xn;
    float *tmp;
    size_t n = (size_t)m * (size_t)w->rows;
    if ((rc = fused_prologue(be, &xn, &tmp, x, NULL, 0.0f, m, w->cols, n)) != 0 ||
        (rc = cuda_matmul(be, tmp, x, w, NULL, m)) != 0)
        return rc;
    return ig__cuda_add(be, y, tmp, n);
}

static void *cuda_host_alloc(ig_backend_t *be, size_t bytes)
{
    void *p = NULL;
    if (ig__cuda_enter(ig__cuda(be)) != 0)
        return NULL;
    cudaError_t st = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
    if (st != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: the caller sees NULL */
        return NULL;
    }
    return p;
}

static void cuda_host_free(ig_backend_t *be, void *ptr)
{
    (void)be;
    if (ptr)
        (void)IG_CUDA_CHECK(cudaFreeHost(ptr));
}

/* ======================================================================== */
/* Life cycle                                                               */
/* ======================================================================== */

static void cuda_destroy(ig_backend_t *be)
{
    if (!be)
        return;
    ig__cuda_t *c = ig__cuda(be);
    if (c) {
        /* As in cuda_free: released even when entering the device fails. */
        (void)ig__cuda_enter(c);
        if (c->stream)
            cudaStreamSynchronize(c->stream);
        if (c->cublas)
            cublasDestroy(c->cublas);
        cudaFree(c->cublas_ws);
        cudaFree(c->act);
        cudaFree(c->attn_part);
        cudaFree(c->fused);
        if (c->stream)
            cudaStreamDestroy(c->stream);
        free(c);
    }
    free(be);
}

extern "C" int ig_backend_cuda_create(ig_backend_t **out, int ordinal, char *err, size_t errlen)
{
    ig_backend_t *be = NULL;
    ig__cuda_t *c = NULL;
    cudaDeviceProp prop;
    int count = 0, rc;
    cudaError_t st;

    if (!out)
        return IG_EINVAL;
    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    st = cudaGetDeviceCount(&count);
    if (st != cudaSuccess || count == 0) {
        if (err)
            snprintf(err, errlen, "no usable GPU: %s",
                     st != cudaSuccess ? cudaGetErrorString(st) : "no CUDA device found");
        (void)cudaGetLastError();
        return IG_EDEVICE;
    }
    if (ordinal < 0 || ordinal >= count) {
        if (err)
            snprintf(err, errlen, "no usable GPU: cuda:%d requested, %d device%s visible", ordinal,
                     count, count == 1 ? "" : "s");
        return IG_EDEVICE;
    }
    st = cudaGetDeviceProperties(&prop, ordinal);
    if (st != cudaSuccess) {
        if (err)
            snprintf(err, errlen, "no usable GPU: cuda:%d: %s", ordinal, cudaGetErrorString(st));
        return IG_EDEVICE;
    }
    if (prop.major < 8) {
        /* BF16 tensor-core GEMM and the kernels' intrinsics need sm_80+. */
        if (err)
            snprintf(err, errlen,
                     "no usable GPU: cuda:%d %s has compute capability %d.%d, "
                     "8.0 or newer is needed",
                     ordinal, prop.name, prop.major, prop.minor);
        return IG_EDEVICE;
    }

    be = (ig_backend_t *)calloc(1, sizeof(*be));
    c = (ig__cuda_t *)calloc(1, sizeof(*c));
    if (!be || !c) {
        rc = IG_ENOMEM;
        goto fail;
    }
    be->impl = c;
    c->ordinal = ordinal;
    c->num_sms = prop.multiProcessorCount;
    c->max_smem_optin = prop.sharedMemPerBlockOptin;
    snprintf(c->name, sizeof(c->name), "cuda:%d", ordinal);
    {
        const char *sync = getenv("IG_CUDA_SYNC");
        c->sync_each = sync && strcmp(sync, "1") == 0;
        if (c->sync_each)
            ig_log(IG_LOG_WARN, "cuda:%d: IG_CUDA_SYNC=1: the stream is synchronized after every "
                   "operation", ordinal);
    }
    if ((rc = ig__cuda_enter(c)) != 0)
        goto fail;
    if ((rc = IG_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking))) != 0)
        goto fail;
    if ((rc = IG_CUDA_CHECK(cublasCreate(&c->cublas))) != 0)
        goto fail;
    if ((rc = IG_CUDA_CHECK(cublasSetStream(c->cublas, c->stream))) != 0)
        goto fail;
    c->cublas_ws_bytes = 32u << 20;
    if ((rc = IG_CUDA_CHECK(cudaMalloc(&c->cublas_ws, c->cublas_ws_bytes))) != 0)
        goto fail;
    if ((rc = IG_CUDA_CHECK(cublasSetWorkspace(c->cublas, c->cublas_ws, c->cublas_ws_bytes))) != 0)
        goto fail;
    if ((rc = ig__cuda_attention_setup(c)) != 0)
        goto fail;

    be->name = c->name;
    /* The kernels read and write an F32 cache only: the engine refuses a
     * 16-bit kv_dtype here with a message naming the option. */
    be->kv_dtypes = 1u << IG_DTYPE_F32;
    be->host_memory = 0; /* device memory: reached through upload and download */
    be->alloc = cuda_alloc;
    be->free = cuda_free;
    be->upload = cuda_upload;
    be->download = cuda_download;
    be->upload_weight = cuda_upload_weight;
    be->free_weight = cuda_free_weight;
    be->embed = ig__cuda_embed;
    be->rmsnorm = ig__cuda_rmsnorm;
    be->matmul = cuda_matmul;
    be->rope = ig__cuda_rope;
    be->swiglu = ig__cuda_swiglu;
    be->add = ig__cuda_add;
    be->kv_append = ig__cuda_kv_append;
    be->attention = ig__cuda_attention;
    be->gather = ig__cuda_gather;
    be->sync = cuda_sync;
    be->destroy = cuda_destroy;
    be->mem_info = cuda_mem_info;
    be->norm_matmul = cuda_norm_matmul;
    be->norm_swiglu = cuda_norm_swiglu;
    be->matmul_add = cuda_matmul_add;
    be->rope_kv_append = ig__cuda_rope_kv_append;
    be->host_alloc = cuda_host_alloc;
    be->host_free = cuda_host_free;
    ig_log(IG_LOG_INFO, "cuda:%d: %s, %d SMs, compute capability %d.%d, %.1f GiB", ordinal,
           prop.name, prop.multiProcessorCount, prop.major, prop.minor,
           (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    *out = be;
    return 0;

fail:
    if (err && errlen && !err[0])
        snprintf(err, errlen, "cuda:%d: backend setup failed: %s", ordinal, ig_strerror(rc));
    if (be) {
        be->impl = c;
        cuda_destroy(be);
    } else {
        free(c);
    }
    return rc;
}

extern "C" int ig__cuda_device_uuid(ig_backend_t *be, char *out, size_t len)
{
    if (!be || !be->impl || !be->name || strncmp(be->name, "cuda:", 5) != 0 || len < 37)
        return IG_EINVAL;
    cudaDeviceProp prop;
    int rc = IG_CUDA_CHECK(cudaGetDeviceProperties(&prop, ig__cuda(be)->ordinal));
    if (rc != 0)
        return rc;
    const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
    snprintf(out, len, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
             u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
             u[15]);
    return 0;
}
