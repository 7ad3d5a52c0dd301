/*
 * The CPU backend: host memory, 2-D weights packed at upload for the own
 * GEMM (F32 ones in gemm.c's panels, BF16 and F16 ones kept in 16 bits for
 * gemm16.c; BF16 ones in k-pairs for vdpbf16ps where the CPU has it),
 * vectors converted to F32, every operation split over a small
 * persistent thread pool (threadpool.c). GEMM runs the own SIMD loop; with
 * IG_CPU_GEMM=blas-pool|blas (builds with OpenBLAS) it goes to OpenBLAS.
 */
#include "cpu_internal.h"
#include "simd.h"

#include "infergate/dtype.h"
#include "infergate/error.h"
#include "infergate/pages.h"

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

/* Below this many multiply-adds a GEMM runs on the calling thread alone:
 * waking the pool costs more than it saves (at batch 1 the attention
 * projections of small models stay on one thread, the MLP and lm_head
 * are split). */
#define PARALLEL_MIN_FLOPS (128 * 1024)
#define PARALLEL_MIN_ELEMS (32 * 1024)

typedef struct {
    ig__pool_t *pool;
    int nthreads;
    ig_cpu_gemm_t gemm;
    float **scratch; /* (nthreads) attention scores, scratch_cap floats each */
    size_t scratch_cap;
    int *items;  /* attention work items, items_cap of them */
    int8_t *xq;  /* matmul input quantized for Q8_0 weights, xq_cap bytes */
    float *xd;   /* its block scales, xq_cap / 32 */
    int32_t *xs; /* its block sums, xq_cap / 32 */
    size_t xq_cap;
    int items_cap;
    /* The data pointers of the weights upload_weight() packed for the own
     * GEMM (gemm.c), sorted; a weight made by hand is row-major. */
    pthread_mutex_t packed_lock;
    const void **packed;
    int npacked, packed_cap;
    /* Those of them in gemm16.c's k-pair layout for vdpbf16ps (BF16), sorted;
     * under packed_lock too. */
    const void **pairs;
    int npairs, pairs_cap;
    uint16_t *xb; /* matmul input rounded to BF16 for them, xb_cap elements */
    size_t xb_cap;
    char name[32];
} cpu_t;

static cpu_t *cpu_of(ig_backend_t *be)
{
    return be->impl;
}

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

/* Index of the first entry >= p in a sorted list of n. */
static int ptr_find(const void *const *list, int n, const void *p)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if ((uintptr_t)list[mid] < (uintptr_t)p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int packed_find(const cpu_t *c, const void *p)
{
    return ptr_find(c->packed, c->npacked, p);
}

/* Whether w's data is in the k-pair layout (locks packed_lock). */
static int is_pairs(cpu_t *c, const ig_weight_t *w)
{
    pthread_mutex_lock(&c->packed_lock);
    int i = ptr_find(c->pairs, c->npairs, w->data);
    int found = i < c->npairs && c->pairs[i] == w->data;
    pthread_mutex_unlock(&c->packed_lock);
    return found;
}

static int pairs_add(cpu_t *c, const void *p)
{
    int rc = 0;
    pthread_mutex_lock(&c->packed_lock);
    if (c->npairs == c->pairs_cap) {
        int cap = c->pairs_cap ? 2 * c->pairs_cap : 64;
        const void **np = realloc(c->pairs, (size_t)cap * sizeof(*np));
        if (np == NULL) {
            rc = IG_ENOMEM;
            goto out;
        }
        c->pairs = np;
        c->pairs_cap = cap;
    }
    int i = ptr_find(c->pairs, c->npairs, p);
    memmove(c->pairs + i + 1, c->pairs + i, (size_t)(c->npairs - i) * sizeof(*c->pairs));
    c->pairs[i] = p;
    c->npairs++;
out:
    pthread_mutex_unlock(&c->packed_lock);
    return rc;
}

static void pairs_remove(cpu_t *c, const void *p)
{
    pthread_mutex_lock(&c->packed_lock);
    int i = ptr_find(c->pairs, c->npairs, p);
    if (i < c->npairs && c->pairs[i] == p) {
        memmove(c->pairs + i, c->pairs + i + 1, (size_t)(c->npairs - i - 1) * sizeof(*c->pairs));
        c->npairs--;
    }
    pthread_mutex_unlock(&c->packed_lock);
}

/* Whether w's data is in the own GEMM's packed layout. */
static int is_packed(cpu_t *c, const ig_weight_t *w)
{
    pthread_mutex_lock(&c->packed_lock);
    int i = packed_find(c, w->data);
    int found = i < c->npacked && c->packed[i] == w->data;
    pthread_mutex_unlock(&c->packed_lock);
    return found;
}

static int packed_add(cpu_t *c, const void *p)
{
    int rc = 0;
    pthread_mutex_lock(&c->packed_lock);
    if (c->npacked == c->packed_cap) {
        int cap = c->packed_cap ? 2 * c->packed_cap : 64;
        const void **np = realloc(c->packed, (size_t)cap * sizeof(*np));
        if (np == NULL) {
            rc = IG_ENOMEM;
            goto out;
        }
        c->packed = np;
        c->packed_cap = cap;
    }
    int i = packed_find(c, p);
    memmove(c->packed + i + 1, c->packed + i, (size_t)(c->npacked - i) * sizeof(*c->packed));
    c->packed[i] = p;
    c->npacked++;
out:
    pthread_mutex_unlock(&c->packed_lock);
    return rc;
}

static void packed_remove(cpu_t *c, const void *p)
{
    pthread_mutex_lock(&c->packed_lock);
    int i = packed_find(c, p);
    if (i < c->npacked && c->packed[i] == p) {
        memmove(c->packed + i, c->packed + i + 1,
                (size_t)(c->npacked - i - 1) * sizeof(*c->packed));
        c->npacked--;
    }
    pthread_mutex_unlock(&c->packed_lock);
}

/* Whether 16-bit 2-D weights stay 16-bit (the default) or are widened to
 * F32 at upload as before (IG_CPU_WEIGHTS=f32: the baseline of
 * bench/vs-llamacpp.sh, and the BLAS paths, which need F32). */
static int keep_16bit(const cpu_t *c)
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
    if (src->dtype == IG_DTYPE_Q8_0) {
        /* Packed in panels of 16 rows (gemmq8.c), 64 panels at a time, then
         * their source pages go back: the same bytes as the file's. */
        if (src->ndim != 2 || cols % IG_Q8_0_BLOCK != 0 || rows > INT_MAX || cols > INT_MAX)
            return IG_EINVAL;
        int k = (int)cols, step = 64 * IG_Q8P_NR;
        size_t row = ig_dtype_bytes(IG_DTYPE_Q8_0, (size_t)k);
        uint8_t *q = cpu_alloc(be, ig__q8p_packed_bytes((int)rows, k));
        if (q == NULL)
            return IG_ENOMEM;
        for (int64_t r = 0; r < rows; r += step) {
            int m = rows - r < step ? (int)(rows - r) : step;
            const uint8_t *from = (const uint8_t *)src->data + (size_t)r * row;
            ig__q8p_pack(q + ig__q8p_packed_bytes((int)r, k), from, m, k);
            release_pages(from, (size_t)m * row);
        }
        *dst = (ig_weight_t){.dtype = IG_DTYPE_Q8_0, .data = q, .rows = rows, .cols = cols};
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
    size_t esz = ig_dtype_size(src->dtype);
    if (!pack) {
        if ((data = cpu_alloc(be, n * sizeof(float))) == NULL)
            goto fail;
        ig_dtype_to_f32(data, src->data, src->dtype, n);
    } else if (src->dtype == IG_DTYPE_BF16 && keep_16bit(cpu_of(be)) && ig__cpu_bf16_dot()) {
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
        if ((rc = packed_add(cpu_of(be), data)) != 0)
            goto fail;
        if ((rc = pairs_add(cpu_of(be), data)) != 0) {
            packed_remove(cpu_of(be), data);
            goto fail;
        }
    } else if (src->dtype != IG_DTYPE_F32 && keep_16bit(cpu_of(be))) {
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
        if ((rc = packed_add(cpu_of(be), data)) != 0)
            goto fail;
    } else {
        int nr = ig__gemm_panel_width(), k = (int)cols;
        int64_t done = 0; /* rows whose source pages went back */
        data = cpu_alloc(be, ig__gemm_packed_floats((int)rows, k) * sizeof(float));
        tmp = malloc((size_t)nr * k * sizeof(float));
        if (data == NULL || tmp == NULL)
            goto fail;
        for (int64_t r = 0; r < rows; r += nr) {
            int m = rows - r < nr ? (int)(rows - r) : nr;
            const char *from = (const char *)src->data + (size_t)r * k * esz;
            ig_dtype_to_f32(tmp, from, src->dtype, (size_t)m * k);
            ig__gemm_pack((float *)data + (size_t)r * k, tmp, m, k);
            if ((r + m - done) * k * esz >= RELEASE_MIN_BYTES || r + m == rows) {
                release_pages((const char *)src->data + (size_t)done * k * esz,
                              (size_t)(r + m - done) * k * esz);
                done = r + m;
            }
        }
        free(tmp);
        tmp = NULL;
        if ((rc = packed_add(cpu_of(be), data)) != 0)
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
    packed_remove(cpu_of(be), w->data);
    pairs_remove(cpu_of(be), w->data);
    free(w->data);
    w->data = NULL;
}

/* ========================================================================= */
/* Element-wise operations                                                   */
/* ========================================================================= */

static int cpu_embed(ig_backend_t *be, float *out, const ig_weight_t *table, const int *tokens,
                     int ntok)
{
    const float *t = table->data;
    int packed = is_packed(cpu_of(be), table), pairs = packed && is_pairs(cpu_of(be), table);
    for (int i = 0; i < ntok; i++)
        if (tokens[i] < 0 || tokens[i] >= table->rows)
            return IG_ERANGE;
    for (int i = 0; i < ntok; i++) {
        float *o = out + (size_t)i * table->cols;
        if (table->dtype == IG_DTYPE_Q8_0)
            ig__q8p_unpack_row(o, table->data, (int)table->cols, tokens[i]);
        else if (pairs)
            ig__gemm16p_unpack_row(o, table->data, (int)table->cols, tokens[i]);
        else if (packed && table->dtype != IG_DTYPE_F32)
            ig__gemm16_unpack_row(o, table->data, table->dtype == IG_DTYPE_BF16, (int)table->cols,
                                  tokens[i]);
        else if (packed)
            ig__gemm_unpack_row(o, t, (int)table->cols, tokens[i]);
        else
            memcpy(o, t + (size_t)tokens[i] * table->cols, (size_t)table->cols * sizeof(float));
    }
    return 0;
}

typedef struct {
    float *out;
    const float *x;
    const float *w;
    int m, n;
    float eps;
    int chunk; /* rows per work item */
    atomic_int next;
} rmsnorm_job_t;

static void rmsnorm_rows(const rmsnorm_job_t *j, int r0, int r1)
{
    for (int r = r0; r < r1; r++) {
        const float *x = j->x + (size_t)r * j->n;
        float *o = j->out + (size_t)r * j->n;
        float ss = ig__dot(x, x, j->n);
        float inv = 1.0f / sqrtf(ss / (float)j->n + j->eps);
        for (int i = 0; i < j->n; i++)
            o[i] = x[i] * inv * j->w[i];
    }
}

static void rmsnorm_task(void *arg, int tid, int nt)
{
    rmsnorm_job_t *j = arg;
    int r0, r1;
    while (ig__pool_take(&j->next, j->m, j->chunk, &r0, &r1))
        rmsnorm_rows(j, r0, r1);
}

static int cpu_rmsnorm(ig_backend_t *be, float *out, const float *x, const ig_weight_t *w, int m,
                       float eps)
{
    rmsnorm_job_t j = {.out = out, .x = x, .w = w->data, .m = m, .n = (int)w->rows, .eps = eps};
    cpu_t *c = cpu_of(be);
    if ((size_t)m * j.n >= PARALLEL_MIN_ELEMS && m > 1 && c->nthreads > 1) {
        j.chunk = m / (c->nthreads * 4) > 1 ? m / (c->nthreads * 4) : 1;
        atomic_init(&j.next, 0);
        ig__pool_run(c->pool, rmsnorm_task, &j);
    } else {
        rmsnorm_rows(&j, 0, m);
    }
    return 0;
}

typedef struct {
    float *y;
    const float *x;
    const float *gate, *up;
    size_t n;
    int op;          /* 0 add, 1 swiglu */
    atomic_int next; /* the next EW_CHUNK elements to take */
} ew_job_t;

#define EW_CHUNK 16384

static void ew_range(const ew_job_t *j, size_t b, size_t e)
{
    if (j->op == 0) {
        for (size_t i = b; i < e; i++)
            j->y[i] += j->x[i];
    } else {
        ig__swiglu(j->y + b, j->gate + b, j->up + b, e - b);
    }
}

static void ew_task(void *arg, int tid, int nt)
{
    ew_job_t *j = arg;
    for (;;) {
        size_t b = (size_t)atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed) * EW_CHUNK;
        if (b >= j->n)
            break;
        ew_range(j, b, b + EW_CHUNK < j->n ? b + EW_CHUNK : j->n);
    }
}

static void ew_run(ig_backend_t *be, ew_job_t *j)
{
    atomic_init(&j->next, 0);
    if (j->n >= PARALLEL_MIN_ELEMS && j->n / EW_CHUNK < INT_MAX && cpu_of(be)->nthreads > 1)
        ig__pool_run(cpu_of(be)->pool, ew_task, j);
    else
        ew_range(j, 0, j->n);
}

static int cpu_swiglu(ig_backend_t *be, float *out, const float *gate, const float *up, size_t n)
{
    ew_job_t j = {.y = out, .gate = gate, .up = up, .n = n, .op = 1};
    ew_run(be, &j);
    return 0;
}

static int cpu_add(ig_backend_t *be, float *y, const float *x, size_t n)
{
    ew_job_t j = {.y = y, .x = x, .n = n, .op = 0};
    ew_run(be, &j);
    return 0;
}

static int cpu_gather(ig_backend_t *be, float *out, const float *x, const int *rows, int n,
                      int cols)
{
    for (int i = 0; i < n; i++)
        memmove(out + (size_t)i * cols, x + (size_t)rows[i] * cols, (size_t)cols * sizeof(float));
    return 0;
}

/* ========================================================================= */
/* GEMM                                                                      */
/* ========================================================================= */

typedef struct {
    float *y;
    const float *x;
    const void *w; /* float, or uint16_t for 16-bit weights */
    const float *bias;
    ig_dtype_t dtype; /* of w: F32 packed or not, BF16/F16 and Q8_0 always packed */
    const int8_t *xq; /* Q8_0: x quantized (m, k), its scales and sums (m, k / 32) */
    const float *xd;
    const int32_t *xs;
    const uint16_t *xb; /* BF16 in k-pairs: x rounded to BF16 (m, kpad) */
    int m, n, k;
    int packed; /* w in the own GEMM's panel layout */
    int pairs;  /* BF16 w in gemm16.c's k-pair layout */
    ig_cpu_gemm_t mode;
    int chunk;       /* output columns per work item */
    atomic_int next; /* the next work item to take */
} matmul_job_t;

static void matmul_cols(const matmul_job_t *j, int n0, int n1)
{
    if (n1 <= n0)
        return;
    if (j->dtype == IG_DTYPE_Q8_0)
        ig__gemm_q8(j->y, j->n, j->xq, j->xd, j->xs, j->w, j->m, j->k, n0, n1);
    else if (j->pairs)
        ig__gemm16p(j->y, j->n, j->xb, j->w, j->m, j->k, j->n, n0, n1);
    else if (j->dtype != IG_DTYPE_F32)
        ig__gemm16(j->y, j->n, j->x, j->w, j->dtype == IG_DTYPE_BF16, j->m, j->k, j->n, n0, n1);
    else if (j->mode == IG_CPU_GEMM_OWN || j->mode == IG_CPU_GEMM_AUTO)
        ig__gemm_own(j->y, j->n, j->x, j->w, j->m, j->k, j->n, n0, n1);
    else if (j->packed)
        ig__gemm_blas_packed(j->y, j->n, j->x, j->w, j->m, j->k, j->n, n0, n1);
    else
        ig__gemm_blas(j->y, j->n, j->x, j->w, j->m, j->k, n0, n1);
    if (j->bias != NULL) {
        for (int r = 0; r < j->m; r++) {
            float *y = j->y + (size_t)r * j->n;
            for (int c = n0; c < n1; c++)
                y[c] += j->bias[c];
        }
    }
}

/* Threads take slices of output columns from a shared counter rather than
 * one fixed share each: on a loaded machine a thread that is descheduled
 * for a while leaves its slices to the others instead of stalling the
 * section. Every column is computed the same way whoever computes it. */
static void matmul_task(void *arg, int tid, int nt)
{
    matmul_job_t *j = arg;
    int n0, n1;
    while (ig__pool_take(&j->next, j->n, j->chunk, &n0, &n1))
        matmul_cols(j, n0, n1);
}

static int cpu_matmul(ig_backend_t *be, float *y, const float *x, const ig_weight_t *w,
                      const ig_weight_t *bias, int m)
{
    cpu_t *c = cpu_of(be);
    matmul_job_t j = {.y = y,
                      .x = x,
                      .w = w->data,
                      .bias = bias ? bias->data : NULL,
                      .m = m,
                      .n = (int)w->rows,
                      .k = (int)w->cols,
                      .dtype = w->dtype,
                      .packed = is_packed(c, w),
                      .mode = c->gemm};
    float *tmp = NULL;
    if (m <= 0)
        return 0;
    double flops = (double)m * j.n * j.k;
    if (j.mode == IG_CPU_GEMM_AUTO)
        j.mode = IG_CPU_GEMM_OWN; /* faster than OpenBLAS at every m here (docs/engine.md) */
    if (j.dtype == IG_DTYPE_Q8_0) {
        /* x quantized once here, for every thread's columns. */
        size_t need = (size_t)m * j.k;
        if (need > c->xq_cap) {
            int8_t *q = realloc(c->xq, need);
            if (q != NULL)
                c->xq = q;
            float *d = q ? realloc(c->xd, need / IG_Q8_0_BLOCK * sizeof(float)) : NULL;
            if (d != NULL)
                c->xd = d;
            int32_t *s = d ? realloc(c->xs, need / IG_Q8_0_BLOCK * sizeof(int32_t)) : NULL;
            if (s == NULL)
                return IG_ENOMEM;
            c->xs = s;
            c->xq_cap = need;
        }
        ig__q8_quantize_rows_sums(c->xq, c->xd, c->xs, x, m, j.k);
        j.xq = c->xq;
        j.xd = c->xd;
        j.xs = c->xs;
    } else if (j.dtype == IG_DTYPE_BF16 && j.packed && is_pairs(c, w)) {
        /* x rounded to BF16 once here, for every thread's columns. */
        size_t need = (size_t)m * ig__gemm16p_kpad(j.k);
        if (need > c->xb_cap) {
            uint16_t *b = realloc(c->xb, need * sizeof(uint16_t));
            if (b == NULL)
                return IG_ENOMEM;
            c->xb = b;
            c->xb_cap = need;
        }
        ig__bf16_round_rows(c->xb, x, m, j.k);
        j.xb = c->xb;
        j.pairs = 1;
    } else if (j.dtype != IG_DTYPE_F32 && !j.packed) {
        return IG_EINVAL; /* 16-bit weights come only from upload_weight */
    }
    if (j.dtype == IG_DTYPE_F32 && j.mode == IG_CPU_GEMM_OWN && !j.packed) {
        /* A weight made by hand (tests): packed here, for this call. */
        tmp = malloc(ig__gemm_packed_floats(j.n, j.k) * sizeof(float));
        if (tmp == NULL)
            return IG_ENOMEM;
        ig__gemm_pack(tmp, j.w, j.n, j.k);
        j.w = tmp;
        j.packed = 1;
    }
    int nr = ig__gemm_panel_width();
    if (j.dtype == IG_DTYPE_Q8_0)
        nr = IG_Q8P_NR; /* whole panels */
    else if (j.dtype != IG_DTYPE_F32)
        nr = IG_GEMM16_NR;
    if (j.mode == IG_CPU_GEMM_BLAS_OWN && j.dtype == IG_DTYPE_F32) {
        /* OpenBLAS splits the work over its own threads. */
        j.mode = IG_CPU_GEMM_BLAS_POOL;
        matmul_cols(&j, 0, j.n);
    } else if (flops >= PARALLEL_MIN_FLOPS && c->nthreads > 1) {
        /* About eight slices per thread, whole panels. */
        int chunk = j.n / (c->nthreads * 8);
        j.chunk = chunk < nr ? nr : chunk - chunk % nr;
        atomic_init(&j.next, 0);
        ig__pool_run(c->pool, matmul_task, &j);
    } else {
        matmul_cols(&j, 0, j.n);
    }
    free(tmp);
    return 0;
}

/* ========================================================================= */
/* RoPE                                                                      */
/* ========================================================================= */

typedef struct {
    float *q, *k;
    const int *pos;
    int ntok, n_heads, n_kv_heads, head_dim;
    const float *inv_freq;
    atomic_int next; /* the next 4 tokens to take */
} rope_job_t;

static void rope_rows(const rope_job_t *j, int t0, int t1)
{
    int half = j->head_dim / 2;
    float cs[512], sn[512];
    for (int t = t0; t < t1; t++) {
        /* The angle in double, as tests/reference/llama_ref.py takes it:
         * near position 10^5 a float32 product is off by up to 4e-3 rad. */
        for (int i = 0; i < half; i++) {
            double a = (double)j->pos[t] * (double)j->inv_freq[i];
            cs[i] = (float)cos(a);
            sn[i] = (float)sin(a);
        }
        for (int pass = 0; pass < 2; pass++) {
            int nh = pass == 0 ? j->n_heads : j->n_kv_heads;
            float *base = pass == 0 ? j->q : j->k;
            for (int h = 0; h < nh; h++) {
                float *v = base + ((size_t)t * nh + h) * j->head_dim;
                for (int i = 0; i < half; i++) {
                    float x1 = v[i], x2 = v[i + half];
                    v[i] = x1 * cs[i] - x2 * sn[i];
                    v[i + half] = x2 * cs[i] + x1 * sn[i];
                }
            }
        }
    }
}

static void rope_task(void *arg, int tid, int nt)
{
    rope_job_t *j = arg;
    int t0, t1;
    while (ig__pool_take(&j->next, j->ntok, 4, &t0, &t1))
        rope_rows(j, t0, t1);
}

static int cpu_rope(ig_backend_t *be, float *q, float *k, const int *pos, int ntok, int n_heads,
                    int n_kv_heads, int head_dim, const float *inv_freq)
{
    if (head_dim % 2 != 0 || head_dim > 1024)
        return IG_EINVAL;
    rope_job_t j = {.q = q,
                    .k = k,
                    .pos = pos,
                    .ntok = ntok,
                    .n_heads = n_heads,
                    .n_kv_heads = n_kv_heads,
                    .head_dim = head_dim,
                    .inv_freq = inv_freq};
    atomic_init(&j.next, 0);
    if (ntok >= 8 && cpu_of(be)->nthreads > 1)
        ig__pool_run(cpu_of(be)->pool, rope_task, &j);
    else
        rope_rows(&j, 0, ntok);
    return 0;
}

/* ========================================================================= */
/* Paged KV cache and attention                                              */
/* ========================================================================= */

static inline size_t kv_offset(const ig_kv_layout_t *kv, int layer, int block, int head, int off)
{
    return ((((size_t)layer * kv->num_blocks + block) * kv->n_kv_heads + head) * kv->block_size +
            off) *
           kv->head_dim;
}

static int kv_dtype_ok(const ig_kv_layout_t *kv)
{
    return kv->dtype == IG_DTYPE_F32 || kv->dtype == IG_DTYPE_F16 || kv->dtype == IG_DTYPE_BF16;
}

/* n consecutive rows of one (block, head) of the cache `base` (kv->k or
 * kv->v) from row `off`, as F32: where they lie in an F32 cache, widened
 * into wide (n * head_dim floats) from a 16-bit one. Widening is exact, so
 * attention over a 16-bit cache computes exactly what it computes over an
 * F32 cache holding the rounded values. */
static inline const float *kv_rows_f32(const ig_kv_layout_t *kv, const void *base, int layer,
                                       int block, int head, int off, int n, float *wide)
{
    size_t at = kv_offset(kv, layer, block, head, off);
    if (kv->dtype == IG_DTYPE_F32)
        return (const float *)base + at;
    ig__kv16_load(wide, (const uint16_t *)base + at, (size_t)n * kv->head_dim,
                  kv->dtype == IG_DTYPE_BF16);
    return wide;
}

typedef struct {
    const ig_kv_layout_t *kv;
    int layer;
    const float *k, *v;
    const int *slots;
    int ntok;
    atomic_int next; /* the next KV_CHUNK tokens to take */
} kv_job_t;

#define KV_CHUNK 8

static void kv_rows(const kv_job_t *j, int t0, int t1)
{
    const ig_kv_layout_t *kv = j->kv;
    size_t row = (size_t)kv->n_kv_heads * kv->head_dim, hd = (size_t)kv->head_dim;
    int bf16 = kv->dtype == IG_DTYPE_BF16;
    for (int t = t0; t < t1; t++) {
        int block = j->slots[t] / kv->block_size, off = j->slots[t] % kv->block_size;
        for (int h = 0; h < kv->n_kv_heads; h++) {
            size_t o = kv_offset(kv, j->layer, block, h, off);
            const float *ks = j->k + t * row + (size_t)h * hd,
                        *vs = j->v + t * row + (size_t)h * hd;
            if (kv->dtype == IG_DTYPE_F32) {
                memcpy((float *)kv->k + o, ks, hd * sizeof(float));
                memcpy((float *)kv->v + o, vs, hd * sizeof(float));
            } else {
                ig__kv16_store((uint16_t *)kv->k + o, ks, hd, bf16);
                ig__kv16_store((uint16_t *)kv->v + o, vs, hd, bf16);
            }
        }
    }
}

static void kv_task(void *arg, int tid, int nt)
{
    kv_job_t *j = arg;
    int t0, t1;
    while (ig__pool_take(&j->next, j->ntok, KV_CHUNK, &t0, &t1))
        kv_rows(j, t0, t1);
}

/* At batch 64 the writes land in 64 sequences' blocks, cache misses each:
 * split over the pool like the other operations. Every slot is checked
 * before anything is written. */
static int cpu_kv_append(ig_backend_t *be, const ig_kv_layout_t *kv, int layer, const float *k,
                         const float *v, const int *slots, int ntok)
{
    if (!kv_dtype_ok(kv))
        return IG_EINVAL;
    for (int t = 0; t < ntok; t++)
        if (slots[t] < 0 || slots[t] / kv->block_size >= kv->num_blocks)
            return IG_ERANGE;
    kv_job_t j = {.kv = kv, .layer = layer, .k = k, .v = v, .slots = slots, .ntok = ntok};
    atomic_init(&j.next, 0);
    if (ntok >= 2 * KV_CHUNK && cpu_of(be)->nthreads > 1)
        ig__pool_run(cpu_of(be)->pool, kv_task, &j);
    else
        kv_rows(&j, 0, ntok);
    return 0;
}

/* Query rows of one sequence per attention work item: a long prefill is
 * split so that all threads share it, a decode row is one item per head. */
#define ATTN_ROWS 16

typedef struct {
    float *out;
    const float *q;
    const ig_kv_layout_t *kv;
    int layer;
    const ig_attn_batch_t *b;
    int n_heads;
    float scale;
    float **scratch;  /* per thread: scores, then at wide_off 16 + block_size widened rows */
    size_t wide_off;  /* floats of scores before the widened K rows (16 of them), then V's */
    const int *items; /* (nitems) sequence << 16 | first row / ATTN_ROWS */
    int nitems;
    atomic_int next; /* the next (item, head) to take */
} attn_job_t;

/* The element kinds of the cache as the attention loops take them: a
 * constant at every call of the inlined loops, so each kind gets its own
 * loop. KV_F16 / KV_BF16 are read in their 16 bits only on the AVX-512
 * path (vcvtph2ps and a shift are AVX-512F instructions, so the build that
 * runs this path has them); elsewhere rows are widened first (kv_rows_f32,
 * kv16.c's run-time dispatch) and read as KV_F32. */
enum { KV_F32 = 0, KV_F16, KV_BF16 };

static int kv_kind(const ig_kv_layout_t *kv)
{
    return kv->dtype == IG_DTYPE_F16 ? KV_F16 : kv->dtype == IG_DTYPE_BF16 ? KV_BF16 : KV_F32;
}

/* The blocks of a sequence lie anywhere in the cache, so the hardware
 * prefetcher loses the stream at each block boundary: the loops request the
 * rows of the block KV_AHEAD blocks on (of one head, bs * head_dim
 * elements) while they work on the current one. */
#define KV_AHEAD 2

static inline void kv_prefetch_block(const ig_kv_layout_t *kv, const void *base, int layer,
                                     int block, int head)
{
    size_t esz = ig_dtype_size(kv->dtype);
    const char *p = (const char *)base + kv_offset(kv, layer, block, head, 0) * esz;
    size_t bytes = (size_t)kv->block_size * kv->head_dim * esz;
    for (size_t c = 0; c < bytes; c += 64)
        __builtin_prefetch(p + c, 0, 3);
}

/* Whether the AVX-512 loops read this cache in its own elements. */
static int kv_fused(const ig_kv_layout_t *kv)
{
#if defined(__AVX512F__)
    return kv->head_dim % 16 == 0;
#else
    return kv->dtype == IG_DTYPE_F32;
#endif
}

#if defined(__AVX512F__)
/* 16 elements of a cache row at element `at` of p, widened to F32 (exact). */
static inline __attribute__((always_inline)) __m512 kv_vload(const void *p, size_t at, int kind)
{
    if (kind == KV_F32)
        return _mm512_loadu_ps((const float *)p + at);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + at));
    if (kind == KV_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

/* scores[t] = q . K[t] * scale for the n (<= 16) keys at kp[0..n), rows of
 * `kind` (KV_F32 only off the AVX-512 path). */
static inline __attribute__((always_inline)) void scores16_of(const float *q, const void *const *kp,
                                                              int n, int hd, float scale,
                                                              float *scores, int kind)
{
#if defined(__AVX512F__)
    if (hd % 16 == 0) {
        /* Sixteen dot products at once and one transpose-tree sum: a head
         * of 64 would otherwise spend as long on each horizontal sum as on
         * its four multiply-adds. Slots past n read the first key again (in
         * bounds) and are dropped; a lane's sum never mixes other lanes. */
        const void *p[16];
        for (int t = 0; t < 16; t++)
            p[t] = t < n ? kp[t] : kp[0];
        __m512 acc[16];
#pragma GCC unroll 16
        for (int t = 0; t < 16; t++)
            acc[t] = _mm512_setzero_ps();
        for (int d = 0; d < hd; d += 16) {
            __m512 qv = _mm512_loadu_ps(q + d);
#pragma GCC unroll 16
            for (int t = 0; t < 16; t++)
                acc[t] = _mm512_fmadd_ps(qv, kv_vload(p[t], (size_t)d, kind), acc[t]);
        }
        __m512 sc = _mm512_mul_ps(ig__vsum_16(acc), _mm512_set1_ps(scale));
        _mm512_mask_storeu_ps(scores, (__mmask16)((1u << n) - 1), sc);
        return;
    }
#endif
    for (int t = 0; t < n; t++)
        scores[t] = ig__dot(q, kp[t], hd) * scale;
}

static void attn_scores16(const float *q, const void *const *kp, int n, int hd, float scale,
                          float *scores, int kind)
{
    if (kind == KV_F16)
        scores16_of(q, kp, n, hd, scale, scores, KV_F16);
    else if (kind == KV_BF16)
        scores16_of(q, kp, n, hd, scale, scores, KV_BF16);
    else
        scores16_of(q, kp, n, hd, scale, scores, KV_F32);
}

/* o(hd) = inv * sum over t < n of p[t] * V[t], V read through the block
 * table in its own elements (kind); the running sum stays in NV registers
 * of 16 lanes. */
static inline __attribute__((always_inline)) void wsum_regs(const ig_kv_layout_t *kv, int layer,
                                                            const int *table, int kvh,
                                                            const float *p, int n, float inv,
                                                            float *o, int NV, int kind)
{
#if defined(__AVX512F__)
    __m512 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < NV; i++)
        acc[i] = _mm512_setzero_ps();
    int bs = kv->block_size, hd = kv->head_dim;
    for (int t0 = 0; t0 < n; t0 += bs) {
        int m = n - t0 < bs ? n - t0 : bs;
        size_t at = kv_offset(kv, layer, table[t0 / bs], kvh, 0);
        if (t0 + KV_AHEAD * bs < n)
            kv_prefetch_block(kv, kv->v, layer, table[t0 / bs + KV_AHEAD], kvh);
        for (int t = 0; t < m; t++) {
            __m512 pv = _mm512_set1_ps(p[t0 + t]);
#pragma GCC unroll 8
            for (int i = 0; i < NV; i++)
                acc[i] = _mm512_fmadd_ps(pv, kv_vload(kv->v, at + (size_t)t * hd + 16 * i, kind),
                                         acc[i]);
        }
    }
    __m512 s = _mm512_set1_ps(inv);
#pragma GCC unroll 8
    for (int i = 0; i < NV; i++)
        _mm512_storeu_ps(o + 16 * i, _mm512_mul_ps(acc[i], s));
#endif
}

static void attn_weighted_sum(const ig_kv_layout_t *kv, int layer, const int *table, int kvh,
                              const float *p, int n, float inv, float *o, float *wide)
{
    int hd = kv->head_dim, bs = kv->block_size;
#if defined(__AVX512F__)
    int kind = kv_kind(kv);
    switch (hd % 16 == 0 && hd <= 128 ? hd / 16 * 3 + kind : 0) {
#define NV_CASE(k)                                                                                 \
    case 3 * k + KV_F32:                                                                           \
        wsum_regs(kv, layer, table, kvh, p, n, inv, o, k, KV_F32);                                 \
        return;                                                                                    \
    case 3 * k + KV_F16:                                                                           \
        wsum_regs(kv, layer, table, kvh, p, n, inv, o, k, KV_F16);                                 \
        return;                                                                                    \
    case 3 * k + KV_BF16:                                                                          \
        wsum_regs(kv, layer, table, kvh, p, n, inv, o, k, KV_BF16);                                \
        return;
        NV_CASE(1)
        NV_CASE(2)
        NV_CASE(3)
        NV_CASE(4)
        NV_CASE(5)
        NV_CASE(6)
        NV_CASE(7)
        NV_CASE(8)
#undef NV_CASE
    default:
        break;
    }
#endif
    memset(o, 0, (size_t)hd * sizeof(float));
    for (int t0 = 0; t0 < n; t0 += bs) {
        int m = n - t0 < bs ? n - t0 : bs;
        const float *vr = kv_rows_f32(kv, kv->v, layer, table[t0 / bs], kvh, 0, m, wide);
        for (int t = 0; t < m; t++)
            ig__axpy(o, p[t0 + t], vr + (size_t)t * hd, hd);
    }
    for (int i = 0; i < hd; i++)
        o[i] *= inv;
}

/* Up to ATTN_PREFETCH bytes each of the cached K and V that rows [.., r1)
 * of sequence s, head h will read, requested ahead: at decode a (sequence,
 * head) reads a few KiB from a cache far larger than L2, and one request
 * after another would leave the core waiting on each. */
#define ATTN_PREFETCH (16 * 1024)

static void attn_prefetch(const attn_job_t *j, int s, int h, int r1)
{
    const ig_kv_layout_t *kv = j->kv;
    const ig_attn_batch_t *b = j->b;
    int bs = kv->block_size, kvh = h / (j->n_heads / kv->n_kv_heads);
    const int *table = b->block_tables + (size_t)s * b->max_blocks;
    int n = b->ctx_len[s] - (b->q_start[s + 1] - b->q_start[s]) + r1; /* positions read */
    size_t esz = ig_dtype_size(kv->dtype), row = (size_t)kv->head_dim * esz, done = 0;
    for (int t0 = 0; t0 < n && done < ATTN_PREFETCH; t0 += bs) {
        size_t off = kv_offset(kv, j->layer, table[t0 / bs], kvh, 0) * esz;
        size_t bytes = (size_t)(n - t0 < bs ? n - t0 : bs) * row;
        const char *k = (const char *)kv->k + off, *v = (const char *)kv->v + off;
        for (size_t c = 0; c < bytes; c += 64) {
            __builtin_prefetch(k + c, 0, 3);
            __builtin_prefetch(v + c, 0, 3);
        }
        done += bytes;
    }
}

/* Rows [r0, r1) of sequence s, head h: each against its cached positions up
 * to its own, softmax with the maximum subtracted. Every row is computed the
 * same way whatever else is in the batch. */
static void attn_rows(attn_job_t *j, int s, int h, int r0, int r1, float *scores)
{
    const ig_kv_layout_t *kv = j->kv;
    const ig_attn_batch_t *b = j->b;
    int hd = kv->head_dim, bs = kv->block_size;
    int kvh = h / (j->n_heads / kv->n_kv_heads);
    int q0 = b->q_start[s], qn = b->q_start[s + 1] - q0;
    const int *table = b->block_tables + (size_t)s * b->max_blocks;
    float *kwide = scores + j->wide_off, *vwide = kwide + (size_t)16 * hd;
    int fused = kv_fused(kv), kind = fused ? kv_kind(kv) : KV_F32;
    size_t esz = ig_dtype_size(kv->dtype);
    for (int r = r0; r < r1; r++) {
        int pos = b->ctx_len[s] - qn + r;
        const float *q = j->q + ((size_t)(q0 + r) * j->n_heads + h) * hd;
        float *o = j->out + ((size_t)(q0 + r) * j->n_heads + h) * hd;
        /* K rows found block by block (no division per position), a run
         * of consecutive rows of one block at a time. */
        const void *kp[16];
        int blk = 0, off = 0;
        for (int t0 = 0; t0 <= pos; t0 += 16) {
            int n = pos + 1 - t0 < 16 ? pos + 1 - t0 : 16;
            for (int t = 0; t < n;) {
                if (off == bs) {
                    off = 0;
                    blk++;
                    if ((blk + KV_AHEAD) * bs <= pos)
                        kv_prefetch_block(kv, kv->k, j->layer, table[blk + KV_AHEAD], kvh);
                }
                int run = n - t < bs - off ? n - t : bs - off;
                if (fused) { /* rows in the cache's own elements */
                    size_t at = kv_offset(kv, j->layer, table[blk], kvh, off);
                    for (int i = 0; i < run; i++)
                        kp[t + i] = (const char *)kv->k + (at + (size_t)i * hd) * esz;
                } else {
                    const float *kr = kv_rows_f32(kv, kv->k, j->layer, table[blk], kvh, off, run,
                                                  kwide + (size_t)t * hd);
                    for (int i = 0; i < run; i++)
                        kp[t + i] = kr + (size_t)i * hd;
                }
                t += run;
                off += run;
            }
            attn_scores16(q, kp, n, hd, j->scale, scores + t0, kind);
        }
        float mx = -INFINITY;
        for (int t = 0; t <= pos; t++)
            mx = scores[t] > mx ? scores[t] : mx;
        float sum = ig__exp_shift_sum(scores, pos + 1, mx);
        attn_weighted_sum(kv, j->layer, table, kvh, scores, pos + 1, 1.0f / sum, o, vwide);
    }
}

/* Work item it: sequence, head and rows. */
static void attn_item(const attn_job_t *j, int it, int *s, int *h, int *r0, int *r1)
{
    int item = j->items[it / j->n_heads];
    *h = it % j->n_heads;
    *s = item >> 16;
    *r0 = (item & 0xffff) * ATTN_ROWS;
    int qn = j->b->q_start[*s + 1] - j->b->q_start[*s];
    *r1 = *r0 + ATTN_ROWS < qn ? *r0 + ATTN_ROWS : qn;
}

/* Each thread takes its next item before working on the current one, so
 * that the next item's K and V are on their way meanwhile. */
static void attn_task(void *arg, int tid, int nt)
{
    attn_job_t *j = arg;
    int total = j->nitems * j->n_heads, s, h, r0, r1;
    int it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
    if (it < total) {
        attn_item(j, it, &s, &h, &r0, &r1);
        attn_prefetch(j, s, h, r1);
    }
    while (it < total) {
        int nx = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed), s2, h2, a2, b2;
        if (nx < total) {
            attn_item(j, nx, &s2, &h2, &a2, &b2);
            attn_prefetch(j, s2, h2, b2);
        }
        attn_rows(j, s, h, r0, r1, j->scratch[tid]);
        it = nx, s = s2, h = h2, r0 = a2, r1 = b2;
    }
}

static int cpu_attention(ig_backend_t *be, float *out, const float *q, const ig_kv_layout_t *kv,
                         int layer, const ig_attn_batch_t *batch, int n_heads, float scale)
{
    cpu_t *c = cpu_of(be);
    if (kv->n_kv_heads <= 0 || n_heads % kv->n_kv_heads != 0 || batch->nseq > 0xffff ||
        !kv_dtype_ok(kv))
        return IG_EINVAL;
    size_t need = (size_t)(batch->max_ctx > 0 ? batch->max_ctx : 1);
    int nitems = 0;
    double work = 0; /* multiply-adds of the scores and the weighted sum */
    for (int s = 0; s < batch->nseq; s++) {
        int qn = batch->q_start[s + 1] - batch->q_start[s];
        if (qn < 0 || batch->ctx_len[s] < qn ||
            batch->ctx_len[s] > batch->max_blocks * kv->block_size)
            return IG_ERANGE;
        if ((size_t)batch->ctx_len[s] > need)
            need = (size_t)batch->ctx_len[s];
        nitems += (qn + ATTN_ROWS - 1) / ATTN_ROWS;
        work += 2.0 * qn * batch->ctx_len[s] * n_heads * kv->head_dim;
    }
    /* After the scores, room for the rows a 16-bit cache is widened into. */
    size_t wide_off = (need + 15) & ~(size_t)15;
    need = wide_off + (size_t)(16 + kv->block_size) * kv->head_dim;
    if (need > c->scratch_cap) {
        for (int t = 0; t < c->nthreads; t++) {
            float *p = realloc(c->scratch[t], need * sizeof(float));
            if (p == NULL)
                return IG_ENOMEM;
            c->scratch[t] = p;
        }
        c->scratch_cap = need;
    }
    if (nitems > c->items_cap) {
        int *p = realloc(c->items, (size_t)nitems * sizeof(int));
        if (p == NULL)
            return IG_ENOMEM;
        c->items = p;
        c->items_cap = nitems;
    }
    nitems = 0;
    for (int s = 0; s < batch->nseq; s++) {
        int qn = batch->q_start[s + 1] - batch->q_start[s];
        for (int r = 0; r * ATTN_ROWS < qn; r++)
            c->items[nitems++] = s << 16 | r;
    }
    attn_job_t j = {.out = out,
                    .q = q,
                    .kv = kv,
                    .layer = layer,
                    .b = batch,
                    .n_heads = n_heads,
                    .scale = scale,
                    .scratch = c->scratch,
                    .wide_off = wide_off,
                    .items = c->items,
                    .nitems = nitems};
    atomic_init(&j.next, 0);
    if (nitems * n_heads > 1 && c->nthreads > 1 && work >= PARALLEL_MIN_FLOPS)
        ig__pool_run(c->pool, attn_task, &j);
    else
        attn_task(&j, 0, 1);
    return 0;
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
    cpu_t *c = be->impl;
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
    cpu_t *c = be->impl;
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
    return ((const cpu_t *)be->impl)->gemm;
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
    cpu_t *c = calloc(1, sizeof(*c));
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
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->upload = cpu_copy;
    be->download = cpu_copy;
    be->upload_weight = cpu_upload_weight;
    be->free_weight = cpu_free_weight;
    be->embed = cpu_embed;
    be->rmsnorm = cpu_rmsnorm;
    be->matmul = cpu_matmul;
    be->rope = cpu_rope;
    be->swiglu = cpu_swiglu;
    be->add = cpu_add;
    be->kv_append = cpu_kv_append;
    be->attention = cpu_attention;
    be->gather = cpu_gather;
    be->mem_info = NULL;
    be->sync = cpu_sync;
    *out = be;
    return 0;

fail:
    cpu_destroy(be);
    return rc;
}
