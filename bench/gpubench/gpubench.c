/*
 * gpubench: decode and prefill throughput of one model on one backend,
 * through ig_engine_forward (the path a worker runs), with the memory
 * bandwidth each decode step implies.
 *
 *   gpubench --model DIR [--device cuda:0|cpu|cpu:N] [--batches 1,8,64,256]
 *            [--steps N] [--ctx N] [--prefill-seqs N] [--prefill-len N]
 *            [--peak-gbs X] [--op-times B1,B2,...] [--greedy-check N] [--json FILE]
 *
 * For each batch size B it prefills B sequences of --ctx tokens, runs two
 * warm-up decode steps, then times --steps decode steps (one token per
 * sequence, logits of every row downloaded, as a worker samples them).
 * Bytes per step = the matrix weights as the backend holds them + the KV
 * cache each sequence reads. Utilisation = bytes / step time / the device's
 * peak bandwidth (the datasheet figure for H100/H200, else memory clock x bus
 * width, or --peak-gbs). The batching gain of B is its tokens/s over batch
 * 1's, measured in the same run.
 *
 * --greedy-check N decodes N greedy tokens after a fixed prompt on the device
 * and on the CPU backend (same weights, same engine) and reports whether the
 * texts are the same, or the first token where they part.
 *
 * --op-times lists batch sizes whose decode steps are timed once more per
 * operation: each backend operation is followed by a sync, so the time of
 * each is its own (the step is then slower than unwrapped: the sum is not
 * the step time above). Printed and written as op_ms_per_step.
 *
 * Built over the CUDA emulation (-DIG_CUDA_EMU=ON), the figures are the
 * host's, not a GPU's; what it adds is the count of kernel launches, host
 * synchronizations and uploads per decode step (the emulation counts them),
 * judged against issue 34's target of at most 8 launches per layer + 8 and
 * one host sync per step.
 */
#include "infergate/engine.h"
#include "infergate/error.h"
#include "infergate/kernels.h"
#include "infergate/model.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef IG_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef IG_CUDA_EMU
#include "ig_cuda_emu.h"
#endif

#define MAX_BATCHES 16

typedef struct {
    const char *model_dir, *device, *json_path;
    int batches[MAX_BATCHES], nbatches;
    int op_batches[MAX_BATCHES], nop_batches;
    int steps, ctx, prefill_seqs, prefill_len, threads, greedy_check;
    double peak_gbs;
} opts_t;

typedef struct {
    int *blocks;
    int nblocks, pos;
} seq_t;

typedef struct {
    ig_engine_t *e;
    int vocab, bs, max_blocks_per_seq;
    float *logits; /* (max rows, vocab), host; pinned for CUDA when possible */
    int pinned;
} bench_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: gpubench --model DIR [--device cuda:0|cpu|cpu:N] [--batches 1,8,64,256]\n"
                 "                [--steps N] [--ctx N] [--prefill-seqs N] [--prefill-len N]\n"
                 "                [--threads N] [--peak-gbs X] [--op-times B1,B2,...] [--greedy-check N]\n"
                 "                [--json FILE]\n");
}

static int parse_list(const char *s, int *list, int *n)
{
    *n = 0;
    while (*s && *n < MAX_BATCHES) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 4096)
            return -1;
        list[(*n)++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return *n > 0 ? 0 : -1;
}

static int parse_batches(const char *s, opts_t *o)
{
    return parse_list(s, o->batches, &o->nbatches);
}

static int parse_args(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->device = "cuda:0";
    o->steps = 32;
    o->ctx = 128;
    o->prefill_seqs = 4;
    o->prefill_len = 512;
    parse_batches("1,8,64,256", o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        }
        if (!v)
            return -1;
        i++;
        if (strcmp(a, "--model") == 0)
            o->model_dir = v;
        else if (strcmp(a, "--device") == 0)
            o->device = v;
        else if (strcmp(a, "--json") == 0)
            o->json_path = v;
        else if (strcmp(a, "--batches") == 0) {
            if (parse_batches(v, o) != 0)
                return -1;
        } else if (strcmp(a, "--steps") == 0)
            o->steps = atoi(v);
        else if (strcmp(a, "--ctx") == 0)
            o->ctx = atoi(v);
        else if (strcmp(a, "--prefill-seqs") == 0)
            o->prefill_seqs = atoi(v);
        else if (strcmp(a, "--prefill-len") == 0)
            o->prefill_len = atoi(v);
        else if (strcmp(a, "--threads") == 0)
            o->threads = atoi(v);
        else if (strcmp(a, "--peak-gbs") == 0)
            o->peak_gbs = atof(v);
        else if (strcmp(a, "--greedy-check") == 0)
            o->greedy_check = atoi(v);
        else if (strcmp(a, "--op-times") == 0) {
            if (parse_list(v, o->op_batches, &o->nop_batches) != 0)
                return -1;
        }
        else
            return -1;
    }
    if (o->greedy_check < 0 || o->greedy_check > 4096)
        return -1;
    if (!o->model_dir || o->steps < 1 || o->ctx < 1 || o->prefill_seqs < 0 || o->prefill_len < 1)
        return -1;
    return 0;
}

/* ---- device facts ---------------------------------------------------------- */

/* Peak memory bandwidth in GB/s (1e9 bytes) and the device name; 0 when
 * unknown (the CPU). */
static double peak_bandwidth(const char *device, char *name, size_t len)
{
    snprintf(name, len, "%s", device);
#ifdef IG_HAVE_CUDA
    if (strncmp(device, "cuda:", 5) == 0 || strncmp(device, "MIG-", 4) == 0) {
        int ord = strncmp(device, "cuda:", 5) == 0 ? atoi(device + 5) : 0;
        struct cudaDeviceProp p;
        int clock_khz = 0, bus_bits = 0;
        if (cudaGetDeviceProperties(&p, ord) != cudaSuccess)
            return 0;
        snprintf(name, len, "%s", p.name);
        /* The datasheet figures the targets are stated against. */
        if (strstr(p.name, "H200"))
            return 4800;
        if (strstr(p.name, "H100") && (strstr(p.name, "HBM3") || strstr(p.name, "SXM")))
            return 3350;
        if (strstr(p.name, "H100"))
            return 2000; /* PCIe, HBM2e */
        if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, ord) == cudaSuccess &&
            cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, ord) == cudaSuccess)
            return 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9; /* double data rate */
        /* A failed query is this thread's last error until read: clear it, or
         * the backend's next launch check reports it as its own. */
        (void)cudaGetLastError();
    }
#endif
    return 0;
}

/* Bytes of matrix weights one forward pass reads, as the backend holds them:
 * BF16/F16 on CUDA, F32 on the CPU (which converts at upload). The
 * embedding is a gather, not a read of the table, unless tied to lm_head,
 * which reads it whole either way. */
static double weight_bytes(const ig_model_config_t *c, const char *device)
{
    double per = strncmp(device, "cpu", 3) == 0 ? 4.0 : 2.0;
    double q = (double)c->num_attention_heads * c->head_dim;
    double kv = (double)c->num_key_value_heads * c->head_dim;
    double layer = c->hidden_size * (q + 2 * kv) + q * c->hidden_size +
                   3.0 * c->hidden_size * c->intermediate_size;
    double lm = (double)c->vocab_size * c->hidden_size;
    return per * (layer * c->num_hidden_layers + lm);
}

/* KV bytes one decode step reads for B sequences at context ctx. */
static double kv_bytes(const ig_model_config_t *c, int B, int ctx)
{
    return (double)B * ctx * 2.0 * c->num_hidden_layers * c->num_key_value_heads * c->head_dim *
           sizeof(float);
}

/* ---- sequences --------------------------------------------------------------- */

static int seq_grow(bench_t *b, seq_t *s, int new_pos)
{
    int need = (new_pos + b->bs - 1) / b->bs;
    if (need > b->max_blocks_per_seq)
        return IG_ETOOLONG;
    while (s->nblocks < need) {
        int blk = ig_engine_block_alloc(b->e);
        if (blk < 0)
            return blk;
        s->blocks[s->nblocks++] = blk;
    }
    return 0;
}

static void seq_release(bench_t *b, seq_t *s)
{
    for (int i = 0; i < s->nblocks; i++)
        ig_engine_block_release(b->e, s->blocks[i]);
    s->nblocks = 0;
    s->pos = 0;
}

/*
 * One forward pass: sequence i of seqs[0..n) contributes len tokens (all
 * equal to tok + i, inside the vocabulary) at its next positions; logits of
 * its last row only, or none when no_logits.
 */
static int step_tokens(bench_t *b, seq_t *seqs, int n, int len, int no_logits, const int *given)
{
    size_t ntok = (size_t)n * len;
    int *tokens = malloc(ntok * sizeof(int));
    int *seq_start = malloc((n + 1) * sizeof(int)), *pos_start = malloc(n * sizeof(int));
    int *from = malloc(n * sizeof(int));
    const int **tables = malloc(n * sizeof(int *));
    int rc = 0;
    if (!tokens || !seq_start || !pos_start || !from || !tables) {
        rc = IG_ENOMEM;
        goto out;
    }
    seq_start[0] = 0;
    for (int i = 0; i < n; i++) {
        if ((rc = seq_grow(b, &seqs[i], seqs[i].pos + len)) != 0)
            goto out;
        for (int j = 0; j < len; j++)
            tokens[(size_t)i * len + j] =
                given ? given[(size_t)i * len + j]
                      : (int)((7u * (unsigned)(i + j) + 3u) % (unsigned)b->vocab);
        seq_start[i + 1] = seq_start[i] + len;
        pos_start[i] = seqs[i].pos;
        from[i] = no_logits ? len : len - 1;
        tables[i] = seqs[i].blocks;
    }
    ig_batch_t batch = {n, tokens, seq_start, pos_start, tables, from, b->logits};
    rc = ig_engine_forward(b->e, &batch);
    if (rc == 0)
        for (int i = 0; i < n; i++)
            seqs[i].pos += len;
out:
    free(tokens);
    free(seq_start);
    free(pos_start);
    free(from);
    free(tables);
    return rc;
}

static int step(bench_t *b, seq_t *seqs, int n, int len, int no_logits)
{
    return step_tokens(b, seqs, n, len, no_logits, NULL);
}

/* ---- greedy text against the CPU backend ------------------------------------- */

static int argmax_row(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* ntok greedy tokens after a fixed prompt of 16, one sequence. */
static int greedy_tokens(bench_t *b, int ntok, int *out)
{
    int prompt[16];
    seq_t s = {calloc((size_t)b->max_blocks_per_seq, sizeof(int)), 0, 0};
    int rc = s.blocks ? 0 : IG_ENOMEM;
    for (int j = 0; j < 16; j++)
        prompt[j] = (int)((31u * (unsigned)j + 5u) % (unsigned)b->vocab);
    if (rc == 0)
        rc = step_tokens(b, &s, 1, 16, 0, prompt);
    for (int i = 0; i < ntok && rc == 0; i++) {
        out[i] = argmax_row(b->logits, b->vocab);
        if (i + 1 < ntok)
            rc = step_tokens(b, &s, 1, 1, 0, &out[i]);
    }
    seq_release(b, &s);
    free(s.blocks);
    return rc;
}

/* Prefills n sequences to ctx tokens, at most max_tokens per forward pass. */
static int prefill_all(bench_t *b, seq_t *seqs, int n, int ctx, int max_tokens)
{
    int per = max_tokens / ctx;
    int rc = 0;
    if (per >= 1) {
        for (int i = 0; i < n && rc == 0; i += per)
            rc = step(b, seqs + i, n - i < per ? n - i : per, ctx, 0);
        return rc;
    }
    for (int i = 0; i < n && rc == 0; i++)
        for (int done = 0; done < ctx && rc == 0; done += max_tokens) {
            int len = ctx - done < max_tokens ? ctx - done : max_tokens;
            rc = step(b, seqs + i, 1, len, done + len < ctx);
        }
    return rc;
}

/* ---- time per operation ------------------------------------------------------ */

/* The backend's table is wrapped in place while a batch is timed per
 * operation: each wrapper runs the operation, then the backend's sync, and
 * adds the time to its operation. */
enum {
    OP_EMBED,
    OP_RMSNORM,
    OP_MATMUL,
    OP_ROPE,
    OP_SWIGLU,
    OP_ADD,
    OP_KV_APPEND,
    OP_ATTENTION,
    OP_GATHER,
    OP_UPLOAD,
    OP_DOWNLOAD,
    OP_NORM_MATMUL,
    OP_NORM_SWIGLU,
    OP_MATMUL_ADD,
    OP_ROPE_KV,
    OP_N
};
static const char *op_names[OP_N] = {"embed",       "rmsnorm",    "matmul",        "rope",
                                     "swiglu",      "add",        "kv_append",     "attention",
                                     "gather",      "upload",     "download",      "norm_matmul",
                                     "norm_swiglu", "matmul_add", "rope_kv_append"};
static ig_backend_t op_orig; /* the table as the backend made it */
static double op_s[OP_N];
static long op_calls[OP_N];

static int op_done(ig_backend_t *be, int op, double t0, int rc)
{
    if (rc == 0)
        rc = op_orig.sync(be);
    op_s[op] += now_s() - t0;
    op_calls[op]++;
    return rc;
}

static int t_embed(ig_backend_t *be, float *out, const ig_weight_t *t, const int *tok, int n)
{
    double t0 = now_s();
    return op_done(be, OP_EMBED, t0, op_orig.embed(be, out, t, tok, n));
}
static int t_rmsnorm(ig_backend_t *be, float *out, const float *x, const ig_weight_t *w, int m,
                     float eps)
{
    double t0 = now_s();
    return op_done(be, OP_RMSNORM, t0, op_orig.rmsnorm(be, out, x, w, m, eps));
}
static int t_matmul(ig_backend_t *be, float *y, const float *x, const ig_weight_t *w,
                    const ig_weight_t *bias, int m)
{
    double t0 = now_s();
    return op_done(be, OP_MATMUL, t0, op_orig.matmul(be, y, x, w, bias, m));
}
static int t_rope(ig_backend_t *be, float *q, float *k, const int *pos, int ntok, int nh, int nkv,
                  int hd, const float *f)
{
    double t0 = now_s();
    return op_done(be, OP_ROPE, t0, op_orig.rope(be, q, k, pos, ntok, nh, nkv, hd, f));
}
static int t_swiglu(ig_backend_t *be, float *out, const float *g, const float *u, size_t n)
{
    double t0 = now_s();
    return op_done(be, OP_SWIGLU, t0, op_orig.swiglu(be, out, g, u, n));
}
static int t_add(ig_backend_t *be, float *y, const float *x, size_t n)
{
    double t0 = now_s();
    return op_done(be, OP_ADD, t0, op_orig.add(be, y, x, n));
}
static int t_kv_append(ig_backend_t *be, const ig_kv_layout_t *kv, int layer, const float *k,
                       const float *v, const int *slots, int ntok)
{
    double t0 = now_s();
    return op_done(be, OP_KV_APPEND, t0, op_orig.kv_append(be, kv, layer, k, v, slots, ntok));
}
static int t_attention(ig_backend_t *be, float *out, const float *q, const ig_kv_layout_t *kv,
                       int layer, const ig_attn_batch_t *b, int nh, float scale)
{
    double t0 = now_s();
    return op_done(be, OP_ATTENTION, t0, op_orig.attention(be, out, q, kv, layer, b, nh, scale));
}
static int t_gather(ig_backend_t *be, float *out, const float *x, const int *rows, int n, int cols)
{
    double t0 = now_s();
    return op_done(be, OP_GATHER, t0, op_orig.gather(be, out, x, rows, n, cols));
}
static int t_upload(ig_backend_t *be, void *dst, const void *src, size_t bytes)
{
    double t0 = now_s();
    return op_done(be, OP_UPLOAD, t0, op_orig.upload(be, dst, src, bytes));
}
static int t_download(ig_backend_t *be, void *dst, const void *src, size_t bytes)
{
    double t0 = now_s();
    return op_done(be, OP_DOWNLOAD, t0, op_orig.download(be, dst, src, bytes));
}

/* The fused decode operations (docs/gpu.md), where the backend has them. */
static int t_norm_matmul(ig_backend_t *be, float *const *y, const float *x, const ig_weight_t *norm,
                         float eps, const ig_weight_t *const *w, const ig_weight_t *const *bias,
                         int nw, int m)
{
    double t0 = now_s();
    return op_done(be, OP_NORM_MATMUL, t0,
                   op_orig.norm_matmul(be, y, x, norm, eps, w, bias, nw, m));
}
static int t_norm_swiglu(ig_backend_t *be, float *out, const float *x, const ig_weight_t *norm,
                         float eps, const ig_weight_t *wg, const ig_weight_t *wu, int m)
{
    double t0 = now_s();
    return op_done(be, OP_NORM_SWIGLU, t0, op_orig.norm_swiglu(be, out, x, norm, eps, wg, wu, m));
}
static int t_matmul_add(ig_backend_t *be, float *y, const float *x, const ig_weight_t *w, int m)
{
    double t0 = now_s();
    return op_done(be, OP_MATMUL_ADD, t0, op_orig.matmul_add(be, y, x, w, m));
}
static int t_rope_kv(ig_backend_t *be, float *q, const float *k, const float *v,
                     const ig_kv_layout_t *kv, int layer, const int *pos, const int *slots,
                     int ntok, int nh, const float *f)
{
    double t0 = now_s();
    return op_done(be, OP_ROPE_KV, t0,
                   op_orig.rope_kv_append(be, q, k, v, kv, layer, pos, slots, ntok, nh, f));
}

static void ops_wrap(ig_backend_t *be)
{
    op_orig = *be;
    memset(op_s, 0, sizeof(op_s));
    memset(op_calls, 0, sizeof(op_calls));
    be->embed = t_embed;
    be->rmsnorm = t_rmsnorm;
    be->matmul = t_matmul;
    be->rope = t_rope;
    be->swiglu = t_swiglu;
    be->add = t_add;
    be->kv_append = t_kv_append;
    be->attention = t_attention;
    if (be->gather)
        be->gather = t_gather;
    be->upload = t_upload;
    be->download = t_download;
    if (be->norm_matmul)
        be->norm_matmul = t_norm_matmul;
    if (be->norm_swiglu)
        be->norm_swiglu = t_norm_swiglu;
    if (be->matmul_add)
        be->matmul_add = t_matmul_add;
    if (be->rope_kv_append)
        be->rope_kv_append = t_rope_kv;
}

static void ops_unwrap(ig_backend_t *be)
{
    *be = op_orig;
}

/* ---- main ---------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    opts_t o;
    char err[512] = "", name[256];
    ig_model_t *model = NULL;
    ig_backend_t *be = NULL;
    bench_t b;
    seq_t *seqs = NULL;
    json_t *root = json_object(), *decode = json_array();
    int rc = 1, maxb = 1;
    memset(&b, 0, sizeof(b));

    if (parse_args(argc, argv, &o) != 0) {
        usage(stderr);
        return 2;
    }
    for (int i = 0; i < o.nbatches; i++)
        maxb = o.batches[i] > maxb ? o.batches[i] : maxb;
    if (o.prefill_seqs > maxb)
        maxb = o.prefill_seqs;

    if (ig_model_load(&model, o.model_dir, err, sizeof(err)) != 0) {
        fprintf(stderr, "gpubench: %s\n", err);
        goto done;
    }
    if (ig_backend_open(&be, o.device, o.threads, err, sizeof(err)) != 0) {
        fprintf(stderr, "gpubench: %s\n", err);
        goto done;
    }
    const ig_model_config_t *c = ig_model_config(model);
    double peak = o.peak_gbs > 0 ? o.peak_gbs : peak_bandwidth(o.device, name, sizeof(name));
    if (o.peak_gbs > 0)
        peak_bandwidth(o.device, name, sizeof(name));

    ig_engine_opts_t eo;
    ig_engine_opts_default(&eo);
    int decoded = o.steps + 2 + (o.nop_batches > 0 ? o.steps : 0); /* warm-up, timed, per op */
    int longest = o.ctx + decoded > o.prefill_len ? o.ctx + decoded : o.prefill_len;
    if (16 + o.greedy_check > longest)
        longest = 16 + o.greedy_check;
    eo.max_num_seqs = maxb;
    eo.max_batched_tokens = eo.max_batched_tokens > maxb ? eo.max_batched_tokens : maxb;
    b.bs = eo.block_size;
    b.max_blocks_per_seq = (longest + b.bs - 1) / b.bs;
    eo.kv_blocks = maxb * b.max_blocks_per_seq;
    if (ig_engine_create(&b.e, model, be, &eo, err, sizeof(err)) != 0) {
        fprintf(stderr, "gpubench: engine: %s\n", err);
        goto done;
    }
    b.vocab = c->vocab_size;
    size_t lbytes = (size_t)maxb * b.vocab * sizeof(float);
#ifdef IG_HAVE_CUDA
    /* Pinned memory for the logits the engine downloads each step, as a
     * worker on a GPU would use. */
    if (strncmp(o.device, "cpu", 3) != 0 &&
        cudaHostAlloc((void **)&b.logits, lbytes, cudaHostAllocDefault) == cudaSuccess)
        b.pinned = 1;
#endif
    if (!b.logits && !(b.logits = malloc(lbytes))) {
        fprintf(stderr, "gpubench: out of memory for logits\n");
        goto done;
    }
    seqs = calloc(maxb, sizeof(*seqs));
    for (int i = 0; seqs && i < maxb; i++)
        seqs[i].blocks = calloc(b.max_blocks_per_seq, sizeof(int));

    double wbytes = weight_bytes(c, o.device);
    printf("gpubench: %s on %s (%s), %.3f GB of matrix weights per step, ", o.model_dir, o.device,
           name, wbytes / 1e9);
    if (peak > 0)
        printf("peak %.0f GB/s\n", peak);
    else
        printf("peak bandwidth unknown (--peak-gbs sets it)\n");
    json_object_set_new(root, "model", json_string(o.model_dir));
    json_object_set_new(root, "device", json_string(o.device));
    json_object_set_new(root, "device_name", json_string(name));
    json_object_set_new(root, "peak_bandwidth_gbs", json_real(peak));
    json_object_set_new(root, "weight_bytes_per_step", json_real(wbytes));
    json_object_set_new(root, "ctx", json_integer(o.ctx));
    json_object_set_new(root, "steps", json_integer(o.steps));

    /* ---- prefill ---- */
    if (o.prefill_seqs > 0) {
        int n = o.prefill_seqs, len = o.prefill_len;
        if (n * len > eo.max_batched_tokens)
            n = eo.max_batched_tokens / len > 0 ? eo.max_batched_tokens / len : 1;
        if (len > eo.max_batched_tokens)
            len = eo.max_batched_tokens;
        double best = 0;
        for (int rep = 0; rep < 3; rep++) { /* rep 0 warms up */
            double t0 = now_s();
            if ((rc = step(&b, seqs, n, len, 0)) != 0) {
                fprintf(stderr, "gpubench: prefill: %s\n", ig_strerror(rc));
                rc = 1;
                goto done;
            }
            double dt = now_s() - t0;
            for (int i = 0; i < n; i++)
                seq_release(&b, &seqs[i]);
            if (rep > 0 && (best == 0 || dt < best))
                best = dt;
        }
        double tps = (double)n * len / best;
        printf("prefill: %d x %d tokens in %.2f ms: %.0f tokens/s\n", n, len, best * 1e3, tps);
        json_object_set_new(root, "prefill",
                            json_pack("{s:i, s:i, s:f, s:f}", "seqs", n, "len", len, "seconds",
                                      best, "tokens_per_s", tps));
    }

    /* ---- decode ---- */
    double base_tps = 0;
    printf("%7s %10s %12s %10s %12s %8s %8s\n", "batch", "step ms", "tokens/s", "GB/step", "GB/s",
           "bw util", "gain");
    for (int k = 0; k < o.nbatches; k++) {
        int B = o.batches[k];
        json_t *counts = json_object(); /* the emulation's counts, when built over it */
        if ((rc = prefill_all(&b, seqs, B, o.ctx, eo.max_batched_tokens)) != 0 ||
            (rc = step(&b, seqs, B, 1, 0)) != 0 || (rc = step(&b, seqs, B, 1, 0)) != 0) {
            fprintf(stderr, "gpubench: batch %d setup: %s\n", B, ig_strerror(rc));
            json_decref(counts);
            rc = 1;
            goto done;
        }
        int ctx0 = seqs[0].pos;
#ifdef IG_CUDA_EMU
        ig_cuda_emu_counters_t c0, c1;
        ig_cuda_emu_counters(&c0);
#endif
        double t0 = now_s();
        for (int s = 0; s < o.steps; s++)
            if ((rc = step(&b, seqs, B, 1, 0)) != 0) {
                fprintf(stderr, "gpubench: batch %d step %d: %s\n", B, s, ig_strerror(rc));
                json_decref(counts);
                rc = 1;
                goto done;
            }
        double dt = (now_s() - t0) / o.steps;
#ifdef IG_CUDA_EMU
        ig_cuda_emu_counters(&c1); /* before any wrapped steps, which sync more */
#endif
        json_t *op_ms = NULL;
        for (int j = 0; j < o.nop_batches && !op_ms; j++) {
            if (o.op_batches[j] != B)
                continue;
            ops_wrap(be);
            for (int st = 0; st < o.steps && rc == 0; st++)
                rc = step(&b, seqs, B, 1, 0);
            ops_unwrap(be);
            if (rc != 0) {
                fprintf(stderr, "gpubench: batch %d timed per op: %s\n", B, ig_strerror(rc));
                json_decref(counts);
                rc = 1;
                goto done;
            }
            op_ms = json_object();
            double total = 0;
            for (int op = 0; op < OP_N; op++)
                total += op_s[op];
            printf("batch %d, time per operation (each followed by a sync), per decode step:\n", B);
            for (int op = 0; op < OP_N; op++) {
                if (op_calls[op] == 0)
                    continue;
                double ms = op_s[op] * 1e3 / o.steps;
                printf("  %-14s %6.1f calls %9.3f ms %5.1f%%\n", op_names[op],
                       (double)op_calls[op] / o.steps, ms, total > 0 ? 100 * op_s[op] / total : 0);
                json_object_set_new(op_ms, op_names[op], json_real(ms));
            }
        }
#ifdef IG_CUDA_EMU
        double per_launch = (double)(c1.launches - c0.launches) / o.steps;
        double per_sync = (double)(c1.syncs - c0.syncs) / o.steps;
        double per_up = (double)(c1.uploads - c0.uploads) / o.steps;
        double per_pageable = (double)(c1.pageable_uploads - c0.pageable_uploads) / o.steps;
        int launch_cap = 8 * c->num_hidden_layers + 8;
        printf("batch %d per decode step: %.1f launches (target <= %d: %s), %.1f host syncs "
               "(target 1: %s), %.1f uploads (%.1f pageable)\n",
               B, per_launch, launch_cap, per_launch <= launch_cap ? "MET" : "MISSED", per_sync,
               per_sync <= 1.0 ? "MET" : "MISSED", per_up, per_pageable);
        json_object_set_new(counts, "launches_per_step", json_real(per_launch));
        json_object_set_new(counts, "host_syncs_per_step", json_real(per_sync));
        json_object_set_new(counts, "uploads_per_step", json_real(per_up));
        json_object_set_new(counts, "pageable_uploads_per_step", json_real(per_pageable));
        json_object_set_new(counts, "launch_target", json_integer(launch_cap));
#endif
        for (int i = 0; i < B; i++)
            seq_release(&b, &seqs[i]);
        double tps = B / dt;
        double bytes = wbytes + kv_bytes(c, B, ctx0 + o.steps / 2);
        double gbs = bytes / dt / 1e9;
        double util = peak > 0 ? gbs / peak : 0;
        if (B == 1)
            base_tps = tps; /* the baseline of the gains (list 1 first) */
        double gain = base_tps > 0 ? tps / base_tps : 0;
        printf("%7d %10.3f %12.1f %10.3f %12.1f %7.1f%% %7.1fx\n", B, dt * 1e3, tps, bytes / 1e9,
               gbs, util * 100, gain);
        json_t *row = json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f}", "batch", B, "step_ms",
                                dt * 1e3, "tokens_per_s", tps, "bytes_per_step", bytes,
                                "achieved_gbs", gbs, "bandwidth_util", util, "gain_vs_batch1", gain);
        if (json_object_size(counts) > 0)
            json_object_set(row, "emulated_counts", counts);
        json_decref(counts);
        if (op_ms)
            json_object_set_new(row, "op_ms_per_step", op_ms);
        json_array_append_new(decode, row);
    }
    json_object_set(root, "decode", decode);

    /* ---- greedy text against the CPU backend ---- */
    if (o.greedy_check > 0) {
        int n = o.greedy_check, *dev = calloc((size_t)n, sizeof(int)), *cpu = calloc((size_t)n, sizeof(int));
        ig_backend_t *cbe = NULL;
        bench_t cb = b;
        cb.e = NULL;
        cb.logits = malloc(lbytes);
        int grc = dev && cpu && cb.logits ? 0 : IG_ENOMEM;
        if (grc == 0 && (grc = greedy_tokens(&b, n, dev)) != 0)
            fprintf(stderr, "gpubench: greedy on %s: %s\n", o.device, ig_strerror(grc));
        if (grc == 0 && (grc = ig_backend_open(&cbe, "cpu", o.threads, err, sizeof(err))) != 0)
            fprintf(stderr, "gpubench: cpu backend: %s\n", err);
        if (grc == 0 && (grc = ig_engine_create(&cb.e, model, cbe, &eo, err, sizeof(err))) != 0)
            fprintf(stderr, "gpubench: cpu engine: %s\n", err);
        if (grc == 0 && (grc = greedy_tokens(&cb, n, cpu)) != 0)
            fprintf(stderr, "gpubench: greedy on cpu: %s\n", ig_strerror(grc));
        if (cb.e)
            ig_engine_free(cb.e);
        if (cbe)
            cbe->destroy(cbe);
        free(cb.logits);
        if (grc != 0) {
            free(dev);
            free(cpu);
            rc = 1;
            goto done;
        }
        int first = -1;
        for (int i = 0; i < n && first < 0; i++)
            if (dev[i] != cpu[i])
                first = i;
        if (first < 0)
            printf("greedy: the same %d tokens as the CPU backend: MET\n", n);
        else
            printf("greedy: token %d of %d differs from the CPU backend (%d vs %d): MISSED\n",
                   first, n, dev[first], cpu[first]);
        json_object_set_new(root, "greedy_check",
                            json_pack("{s:i, s:b, s:i}", "tokens", n, "same", first < 0,
                                      "first_difference", first));
        free(dev);
        free(cpu);
    }

    /* Targets of issue 7, judged only where their batch sizes ran. */
    json_t *t = json_object(), *d;
    size_t i;
    double u1 = -1, g64 = -1;
    json_array_foreach(decode, i, d)
    {
        int B = (int)json_integer_value(json_object_get(d, "batch"));
        if (B == 1)
            u1 = json_real_value(json_object_get(d, "bandwidth_util"));
        if (B == 64)
            g64 = json_real_value(json_object_get(d, "gain_vs_batch1"));
    }
    if (u1 >= 0 && peak > 0) {
        json_object_set_new(t, "batch1_bandwidth_util_ge_70pct", json_boolean(u1 >= 0.70));
        printf("target batch-1 bandwidth >= 70%% of peak: %.1f%% %s\n", u1 * 100,
               u1 >= 0.70 ? "MET" : "MISSED");
    }
    if (g64 >= 0) {
        json_object_set_new(t, "batch64_gain_ge_20x", json_boolean(g64 >= 20.0));
        printf("target batch-64 aggregate >= 20x batch 1: %.1fx %s\n", g64,
               g64 >= 20.0 ? "MET" : "MISSED");
    }
    json_object_set_new(root, "targets", t);

    if (o.json_path) {
        if (json_dump_file(root, o.json_path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0) {
            fprintf(stderr, "gpubench: cannot write %s\n", o.json_path);
            goto done;
        }
        printf("wrote %s\n", o.json_path);
    }
    rc = 0;

done:
    if (seqs) {
        for (int k = 0; k < maxb; k++)
            free(seqs[k].blocks);
        free(seqs);
    }
#ifdef IG_HAVE_CUDA
    if (b.pinned)
        cudaFreeHost(b.logits);
    else
#endif
        free(b.logits);
    if (b.e)
        ig_engine_free(b.e);
    if (be)
        be->destroy(be);
    if (model)
        ig_model_free(model);
    json_decref(decode);
    json_decref(root);
    return rc;
}
