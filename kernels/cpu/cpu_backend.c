/*
 * The CPU backend: host memory, 2-D weights packed at upload for the own
 * GEMM (F32 ones in gemm.c's panels, BF16 and F16 ones kept in 16 bits for
 * gemm16.c; BF16 ones in k-pairs for vdpbf16ps where the CPU has it),
 * vectors converted to F32, every operation split over a small
 * persistent thread pool (threadpool.c). This file holds memory, weights
 * and the backend's lifecycle; the operations are cpu_ops.c (element-wise,
 * RoPE, KV append), cpu_matmul.c (the GEMM dispatch) and cpu_attention.c,
 * as kernels/cuda/ splits its backend.
 */
#include "cpu_internal.h"
#include "simd.h"

#include "infergate/dtype.h"
#include "infergate/error.h"
#include "infergate/page_release.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef IG_HAVE_OPENBLAS
#include <cblas.h>
#endif

/* ========================================================================= */
/* Memory                                                                    */
/* ========================================================================= */

static void *cpu_alloc(ig_backend_t *be, size_t bytes)
{
    /* 64-byte alignment keeps SIMD loads within cache lines. */
    size_t rounded = (bytes + 63) & ~(size_t)63;
    return aligned_alloc(64, rounded ? rounded : 64);
}

static void cpu_free(ig_backend_t *be, void *ptr)
{
    free(ptr);
}

static int cpu_copy(ig_backend_t *be, void *dst, const void *src, size_t bytes)
{
    if (bytes > 0)
        memcpy(dst, src, bytes);
    return 0;
}

/* Whether 16-bit 2-D weights stay 16-bit (the default) or are widened to
 * F32 at upload as before (IG_CPU_WEIGHTS=f32: the baseline of
 * bench/vs-llamacpp.sh, and the BLAS paths, which need F32). */
static int keep_16bit(const ig__cpu_t *c)
{
    const char *env = getenv("IG_CPU_WEIGHTS");
    if (env != NULL && strcmp(env, "f32") == 0)
        return 0;
    return c->gemm == IG_CPU_GEMM_OWN || c->gemm == IG_CPU_GEMM_AUTO;
}

/* Packing reads each source page once: once a piece is packed, its pages of
 * the mapped file are handed back to the kernel, so the worker never holds
 * the file and the packed copy at once (docs/engine.md, "Weights").
 * MADV_PAGEOUT only drops clean page-cache pages and swaps anonymous ones
 * (contents kept), so it is safe on any memory a caller passes; small
 * tensors are left alone. */
#define RELEASE_MIN_BYTES (1u << 20)

static void release_pages(const void *p, size_t bytes)
{
    if (bytes >= RELEASE_MIN_BYTES)
        ig_pages_release(p, bytes);
}

/* The bytes of n rows of k of a quantized dtype packed in panels. */
static size_t panel_bytes(ig_dtype_t dt, int n, int k)
{
    if (dt == IG_DTYPE_Q4_K || dt == IG_DTYPE_Q6_K)
        return ig__kqp_packed_bytes(dt, n, k);
    return ig__qp_packed_bytes(dt, n, k);
}

/* A 2-D weight is stored packed for the own GEMM: BF16 and F16 ones in
 * their own 16 bits (ig__gemm16_pack), F32 ones, or all with
 * IG_CPU_WEIGHTS=f32, as F32 panels (ig__gemm_pack) converted one panel of
 * rows at a time; a vector as F32. */
static int cpu_upload_weight(ig_backend_t *be, const ig_tensor_t *src, ig_weight_t *dst)
{
    if (src == NULL || src->data == NULL || src->ndim < 1 || src->ndim > 2)
        return IG_EINVAL;
    int64_t rows = src->shape[0], cols = src->ndim == 2 ? src->shape[1] : 1;
    if (rows <= 0 || cols <= 0)
        return IG_EINVAL;
    int kq = src->dtype == IG_DTYPE_Q4_K || src->dtype == IG_DTYPE_Q6_K;
    if (src->dtype == IG_DTYPE_Q8_0 || src->dtype == IG_DTYPE_Q4_0 || kq) {
        /* Packed in panels of 16 rows (gemmq.c: the file's bytes;
         * gemmkq.c: rewritten without loss), 64 panels at a time, then
         * their source pages go back. */
        if (src->ndim != 2 || cols % (int64_t)ig_dtype_block(src->dtype) != 0 || rows > INT_MAX ||
            cols > INT_MAX)
            return IG_EINVAL;
        int k = (int)cols, step = 64 * 16;
        size_t row = ig_dtype_bytes(src->dtype, (size_t)k);
        uint8_t *q = cpu_alloc(be, panel_bytes(src->dtype, (int)rows, k));
        if (q == NULL)
            return IG_ENOMEM;
        for (int64_t r = 0; r < rows; r += step) {
            int m = rows - r < step ? (int)(rows - r) : step;
            const uint8_t *from = (const uint8_t *)src->data + (size_t)r * row;
            uint8_t *to = q + panel_bytes(src->dtype, (int)r, k);
            if (kq)
                ig__kqp_pack(to, from, src->dtype, m, k);
            else
                ig__qp_pack(to, from, src->dtype, m, k);
            release_pages(from, (size_t)m * row);
        }
        *dst = (ig_weight_t){.dtype = src->dtype, .data = q, .rows = rows, .cols = cols};
        return 0;
    }
    if (src->dtype != IG_DTYPE_F32 && src->dtype != IG_DTYPE_F16 && src->dtype != IG_DTYPE_BF16)
        return IG_ENOTSUP;
    size_t n = (size_t)rows * (size_t)cols;
    int pack = src->ndim == 2;
    if (pack && (rows > INT_MAX || cols > INT_MAX))
        return IG_ERANGE;
    void *data = NULL;
    float *tmp = NULL;
    ig_dtype_t dtype = IG_DTYPE_F32;
    int rc = IG_ENOMEM;
    if (!pack) {
        if ((data = cpu_alloc(be, n * sizeof(float))) == NULL)
            goto fail;
        ig_dtype_to_f32(data, src->data, src->dtype, n);
    } else if (src->dtype == IG_DTYPE_BF16 && keep_16bit(ig__cpu_of(be)) && ig__cpu_bf16_dot()) {
        /* For vdpbf16ps: k-pairs, 64 panels at a time, then their source
         * pages go back. */
        int k = (int)cols, kp = ig__gemm16p_kpad(k), nr = IG_GEMM16_NR;
        dtype = src->dtype;
        if ((data = cpu_alloc(be, ig__gemm16p_packed_elems((int)rows, k) * 2)) == NULL)
            goto fail;
        for (int64_t r = 0; r < rows; r += 64 * nr) {
            int m = rows - r < 64 * nr ? (int)(rows - r) : 64 * nr;
            const uint16_t *from = (const uint16_t *)src->data + (size_t)r * k;
            ig__gemm16p_pack((uint16_t *)data + (size_t)r * kp, from, m, k);
            release_pages(from, (size_t)m * k * 2);
        }
        if ((rc = ig__cpu_packed_add(ig__cpu_of(be), data)) != 0)
            goto fail;
        if ((rc = ig__cpu_pairs_add(ig__cpu_of(be), data)) != 0) {
            ig__cpu_packed_remove(ig__cpu_of(be), data);
            goto fail;
        }
    } else if (src->dtype != IG_DTYPE_F32 && keep_16bit(ig__cpu_of(be))) {
        int k = (int)cols, nr = IG_GEMM16_NR;
        dtype = src->dtype;
        if ((data = cpu_alloc(be, ig__gemm16_packed_elems((int)rows, k) * 2)) == NULL)
            goto fail;
        /* 64 panels at a time, then their source pages go back. */
        for (int64_t r = 0; r < rows; r += 64 * nr) {
            int m = rows - r < 64 * nr ? (int)(rows - r) : 64 * nr;
            const uint16_t *from = (const uint16_t *)src->data + (size_t)r * k;
            ig__gemm16_pack((uint16_t *)data + (size_t)r * k, from, m, k);
            release_pages(from, (size_t)m * k * 2);
        }
        if ((rc = ig__cpu_packed_add(ig__cpu_of(be), data)) != 0)
            goto fail;
    } else {
        int nr = ig__gemm_panel_width(), k = (int)cols;
        int64_t done = 0; /* rows whose source pages went back */
        data = cpu_alloc(be, ig__gemm_packed_floats((int)rows, k) * sizeof(float));
        tmp = malloc((size_t)nr * k * sizeof(float));
        if (data == NULL || tmp == NULL)
            goto fail;
        size_t rowb = ig_dtype_bytes(src->dtype, (size_t)k);
        for (int64_t r = 0; r < rows; r += nr) {
            int m = rows - r < nr ? (int)(rows - r) : nr;
            const char *from = (const char *)src->data + (size_t)r * rowb;
            ig_dtype_to_f32(tmp, from, src->dtype, (size_t)m * k);
            ig__gemm_pack((float *)data + (size_t)r * k, tmp, m, k);
            if ((r + m - done) * rowb >= RELEASE_MIN_BYTES || r + m == rows) {
                release_pages((const char *)src->data + (size_t)done * rowb,
                              (size_t)(r + m - done) * rowb);
                done = r + m;
            }
        }
        free(tmp);
        tmp = NULL;
        if ((rc = ig__cpu_packed_add(ig__cpu_of(be), data)) != 0)
            goto fail;
    }
    *dst = (ig_weight_t){.dtype = dtype, .data = data, .rows = rows, .cols = cols};
    return 0;

fail:
    free(data);
    free(tmp);
    return rc;
}

static void cpu_free_weight(ig_backend_t *be, ig_weight_t *w)
{
    if (w == NULL)
        return;
    ig__cpu_packed_remove(ig__cpu_of(be), w->data);
    ig__cpu_pairs_remove(ig__cpu_of(be), w->data);
    free(w->data);
    w->data = NULL;
}

/* ========================================================================= */
/* Lifecycle                                                                 */
/* ========================================================================= */

static int cpu_sync(ig_backend_t *be)
{
    return 0;
}

static void cpu_destroy(ig_backend_t *be)
{
    if (be == NULL)
        return;
    ig__cpu_t *c = be->impl;
    if (c != NULL) {
        ig__pool_free(c->pool);
        if (c->scratch != NULL)
            for (int t = 0; t < c->nthreads; t++)
                free(c->scratch[t]);
        free(c->scratch);
        free(c->items);
        free(c->xq);
        free(c->xd);
        free(c->xs);
        free(c->packed);
        free(c->pairs);
        free(c->xb);
        pthread_mutex_destroy(&c->packed_lock);
        free(c);
    }
    free(be);
}

int ig__cpu_set_gemm(ig_backend_t *be, ig_cpu_gemm_t mode)
{
    if (be == NULL || be->destroy != cpu_destroy)
        return IG_EINVAL;
    ig__cpu_t *c = be->impl;
    switch (mode) {
    case IG_CPU_GEMM_OWN:
        break;
    case IG_CPU_GEMM_AUTO:
#ifdef IG_HAVE_OPENBLAS
        openblas_set_num_threads(1);
#endif
        break;
    case IG_CPU_GEMM_BLAS_POOL:
    case IG_CPU_GEMM_BLAS_OWN:
#ifdef IG_HAVE_OPENBLAS
        /* The setting is process-wide in OpenBLAS: inside the pool each
         * thread calls it single-threaded, else it gets the pool's count. */
        openblas_set_num_threads(mode == IG_CPU_GEMM_BLAS_OWN ? c->nthreads : 1);
        break;
#else
        return IG_ENOTSUP;
#endif
    default:
        return IG_EINVAL;
    }
    c->gemm = mode;
    return 0;
}

ig_cpu_gemm_t ig__cpu_gemm(const ig_backend_t *be)
{
    return ((const ig__cpu_t *)be->impl)->gemm;
}

static ig_cpu_gemm_t default_gemm(void)
{
    const char *env = getenv("IG_CPU_GEMM");
    if (env != NULL) {
        if (strcmp(env, "auto") == 0)
            return IG_CPU_GEMM_AUTO;
        if (strcmp(env, "own") == 0)
            return IG_CPU_GEMM_OWN;
        if (strcmp(env, "blas-pool") == 0)
            return IG_CPU_GEMM_BLAS_POOL;
        if (strcmp(env, "blas") == 0)
            return IG_CPU_GEMM_BLAS_OWN;
    }
    return IG_CPU_GEMM_AUTO;
}

int ig__cpu_blas_usable(const char **core)
{
#ifdef IG_HAVE_OPENBLAS
    static const char *wide[] = {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"};
    const char *name = openblas_get_corename();
    if (core != NULL)
        *core = name ? name : "unknown";
    if (IG_VL == 1)
        return 1; /* the own loop is scalar: any OpenBLAS kernel is as wide */
    for (size_t i = 0; name != NULL && i < sizeof(wide) / sizeof(wide[0]); i++)
        if (strcasecmp(name, wide[i]) == 0)
            return 1;
    return 0;
#else
    if (core != NULL)
        *core = "none";
    return 0;
#endif
}

int ig_backend_cpu_create(ig_backend_t **out, int threads)
{
    int rc = IG_ENOMEM;
    ig_backend_t *be = calloc(1, sizeof(*be));
    ig__cpu_t *c = calloc(1, sizeof(*c));
    if (be == NULL || c == NULL) {
        free(be);
        free(c);
        return IG_ENOMEM;
    }
    pthread_mutex_init(&c->packed_lock, NULL);
    be->impl = c;
    be->destroy = cpu_destroy;
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    if (threads > 256) {
        rc = IG_EINVAL;
        goto fail;
    }
    c->nthreads = threads;
    c->scratch = calloc((size_t)threads, sizeof(float *));
    if (c->scratch == NULL)
        goto fail;
    if ((rc = ig__pool_create(&c->pool, threads)) != 0)
        goto fail;
    if ((rc = ig__cpu_set_gemm(be, default_gemm())) != 0 &&
        (rc = ig__cpu_set_gemm(be, IG_CPU_GEMM_OWN)) != 0)
        goto fail;
    snprintf(c->name, sizeof(c->name), "cpu");
    be->name = c->name;
    be->kv_dtypes = (1u << IG_DTYPE_F32) | (1u << IG_DTYPE_F16) | (1u << IG_DTYPE_BF16);
    be->host_memory = 1;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->upload = cpu_copy;
    be->download = cpu_copy;
    be->upload_weight = cpu_upload_weight;
    be->free_weight = cpu_free_weight;
    be->embed = ig__cpu_embed;
    be->rmsnorm = ig__cpu_rmsnorm;
    be->matmul = ig__cpu_matmul;
    be->rope = ig__cpu_rope;
    be->swiglu = ig__cpu_swiglu;
    be->add = ig__cpu_add;
    be->kv_append = ig__cpu_kv_append;
    be->attention = ig__cpu_attention;
    be->gather = ig__cpu_gather;
    be->mem_info = NULL;
    be->sync = cpu_sync;
    *out = be;
    return 0;

fail:
    cpu_destroy(be);
    return rc;
}
