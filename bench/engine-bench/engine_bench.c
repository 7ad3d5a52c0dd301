/*
 * engine-bench: decode and prefill throughput of the engine on one backend.
 *
 *   build/engine-bench --model DIR [--device cpu] [--threads 2] [--steps 32]
 *                      [--batches 1,4,16,64] [--prompt 16] [--prefill 512]
 *                      [--gemm auto|own|blas-pool|blas] [--out bench/results/engine.json]
 *                      [--profile 1|2] [--kv-dtype f32|f16|bf16]
 *
 * For each batch size B it prefills B sequences of --prompt tokens, runs two
 * warm-up decode steps, then times --steps decode steps of all B sequences
 * together (greedy: each step feeds back the argmax). Aggregate tokens/s is
 * B * steps / the time spent in ig_engine_forward (sampling is the
 * scheduler's and is left out), the best of --rounds (3) rounds that visit every batch
 * size in turn; the ratio is against batch 1 measured in the same run.
 * Prefill: one sequence of --prefill tokens in chunks of max_batched_tokens.
 *
 * --profile 1 wraps the backend's operations with timers and prints, for
 * each batch size, the milliseconds per decode step spent in each kind of
 * operation (the lm_head GEMM apart from the others), from the round with the
 * best rate. They are the calling thread's CPU time, so other processes on
 * the machine do not inflate them; with --threads 1 they are the whole cost.
 * --profile 2 times them by the wall clock instead (what each operation
 * costs a step with the pool's threads, waits and neighbours included).
 * --kv-dtype stores the KV cache in F16 or BF16 (bench/kv-dtype.sh).
 * --compare-bf16-dot 1 loads the model a second time with BF16 weights
 * widened in registers (IG_CPU_BF16_DOT=0's path) and times it in every
 * round right before an engine on vdpbf16ps (BF16-rounded activations,
 * whatever this CPU's default; it needs AVX512_BF16), printing the ratio
 * per batch size and for prefill.
 */
#include "../../kernels/cpu/cpu_internal.h"
#include "infergate/engine.h"
#include "infergate/error.h"
#include "infergate/kernels.h"
#include "infergate/model.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MAX_BATCHES 16

typedef struct {
    const char *model, *device, *out, *gemm, *kv_dtype;
    int threads, steps, prompt, prefill, rounds, profile, cmp_dot;
    int batches[MAX_BATCHES], nbatches;
} opts_t;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU time of the whole process (all threads), user + system. */
static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

static long rss_bytes(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f != NULL) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return rss * sysconf(_SC_PAGESIZE);
}

static double loadavg(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f != NULL) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

/* ---- --profile: per-operation time of the timed decode steps ------------- */

enum { OP_LM_HEAD, OP_GEMM, OP_ATTN, OP_NORM, OP_ROPE, OP_SWIGLU, OP_ADD, OP_KV, OP_OTHER, OP_N };
static const char *op_names[OP_N] = {"lm_head", "gemm", "attention", "rmsnorm",     "rope",
                                     "swiglu",  "add",  "kv_append", "embed+gather"};
static ig_backend_t g_orig; /* the backend's own table */
static int g_vocab;         /* a GEMM with this many outputs is the lm_head */
static int g_timing;        /* inside a timed step */
static double g_op[OP_N];   /* seconds in each kind of operation while g_timing */

/* The calling thread's CPU time: time another process takes from this
 * thread on a shared machine does not count (exact with --threads 1, where
 * every operation runs on the calling thread). */
static int g_prof_wall; /* --profile 2: wall-clock timers instead */

static double thread_cpu(void)
{
    struct timespec ts;
    clock_gettime(g_prof_wall ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define TIMED(kind, call)                                                                          \
    do {                                                                                           \
        double t0_ = g_timing ? thread_cpu() : 0;                                                  \
        int rc_ = (call);                                                                          \
        if (g_timing)                                                                              \
            g_op[kind] += thread_cpu() - t0_;                                                      \
        return rc_;                                                                                \
    } while (0)

static int p_embed(ig_backend_t *be, float *out, const ig_weight_t *t, const int *tok, int n)
{
    TIMED(OP_OTHER, g_orig.embed(be, out, t, tok, n));
}
static int p_rmsnorm(ig_backend_t *be, float *out, const float *x, const ig_weight_t *w, int m,
                     float eps)
{
    TIMED(OP_NORM, g_orig.rmsnorm(be, out, x, w, m, eps));
}
static int p_matmul(ig_backend_t *be, float *y, const float *x, const ig_weight_t *w,
                    const ig_weight_t *b, int m)
{
    TIMED(w->rows == g_vocab ? OP_LM_HEAD : OP_GEMM, g_orig.matmul(be, y, x, w, b, m));
}
static int p_rope(ig_backend_t *be, float *q, float *k, const int *pos, int ntok, int nh, int nkv,
                  int hd, const float *f)
{
    TIMED(OP_ROPE, g_orig.rope(be, q, k, pos, ntok, nh, nkv, hd, f));
}
static int p_swiglu(ig_backend_t *be, float *out, const float *g, const float *u, size_t n)
{
    TIMED(OP_SWIGLU, g_orig.swiglu(be, out, g, u, n));
}
static int p_add(ig_backend_t *be, float *y, const float *x, size_t n)
{
    TIMED(OP_ADD, g_orig.add(be, y, x, n));
}
static int p_kv_append(ig_backend_t *be, const ig_kv_layout_t *kv, int layer, const float *k,
                       const float *v, const int *slots, int ntok)
{
    TIMED(OP_KV, g_orig.kv_append(be, kv, layer, k, v, slots, ntok));
}
static int p_attention(ig_backend_t *be, float *out, const float *q, const ig_kv_layout_t *kv,
                       int layer, const ig_attn_batch_t *b, int nh, float scale)
{
    TIMED(OP_ATTN, g_orig.attention(be, out, q, kv, layer, b, nh, scale));
}
static int p_gather(ig_backend_t *be, float *out, const float *x, const int *rows, int n, int cols)
{
    TIMED(OP_OTHER, g_orig.gather(be, out, x, rows, n, cols));
}

/* Routes the backend's operations through the timers above. */
static void profile_install(ig_backend_t *be)
{
    g_orig = *be;
    be->embed = p_embed;
    be->rmsnorm = p_rmsnorm;
    be->matmul = p_matmul;
    be->rope = p_rope;
    be->swiglu = p_swiglu;
    be->add = p_add;
    be->kv_append = p_kv_append;
    be->attention = p_attention;
    if (be->gather != NULL)
        be->gather = p_gather;
}

typedef struct {
    int *blocks;
    int nblocks, pos, next;
} seq_t;

static int g_max_blocks; /* capacity of each seq_t's blocks array */

static int take_blocks(ig_engine_t *e, seq_t *s, int upto)
{
    int bs = ig_engine_block_size(e), need = (upto + bs - 1) / bs;
    if (need > g_max_blocks)
        return IG_ETOOLONG;
    while (s->nblocks < need) {
        int b = ig_engine_block_alloc(e);
        if (b < 0)
            return b;
        s->blocks[s->nblocks++] = b;
    }
    return 0;
}

/* Aggregate decode tokens/s at batch B (and tokens per CPU-second in
 * *per_cpu); 0 on error. */
static double bench_decode(ig_engine_t *e, int B, const opts_t *o, int max_blocks, double *per_cpu,
                           double *op_ms)
{
    int V = ig_engine_config(e)->vocab_size;
    seq_t *seqs = calloc((size_t)B, sizeof(seq_t));
    int *tokens = malloc((size_t)B * o->prompt * sizeof(int));
    int *seq_start = malloc((size_t)(B + 1) * sizeof(int));
    int *pos_start = malloc((size_t)B * sizeof(int)), *from = malloc((size_t)B * sizeof(int));
    const int **tables = malloc((size_t)B * sizeof(int *));
    float *logits = malloc((size_t)B * V * sizeof(float));
    double rate = 0;
    int rc = 0;
    unsigned x = 1;
    for (int s = 0; s < B; s++) {
        seqs[s].blocks = malloc((size_t)max_blocks * sizeof(int));
        tables[s] = seqs[s].blocks;
    }
    /* prefill every sequence in one batch */
    for (int s = 0; s < B; s++) {
        seq_start[s] = s * o->prompt;
        for (int i = 0; i < o->prompt; i++) {
            x = x * 1103515245u + 12345u;
            tokens[s * o->prompt + i] = (int)((x >> 8) % (unsigned)V);
        }
        pos_start[s] = 0;
        from[s] = o->prompt - 1;
        if ((rc = take_blocks(e, &seqs[s], o->prompt)) != 0)
            goto done;
    }
    seq_start[B] = B * o->prompt;
    ig_batch_t b = {B, tokens, seq_start, pos_start, tables, from, logits};
    if ((rc = ig_engine_forward(e, &b)) != 0)
        goto done;
    for (int s = 0; s < B; s++) {
        seqs[s].pos = o->prompt;
        seqs[s].next = argmax(logits + (size_t)s * V, V);
    }
    double busy = 0, cpu = 0; /* inside ig_engine_forward, warm-up steps excluded */
    memset(g_op, 0, sizeof(g_op));
    for (int step = 0; step < o->steps + 2; step++) {
        for (int s = 0; s < B; s++) {
            tokens[s] = seqs[s].next;
            seq_start[s] = s;
            pos_start[s] = seqs[s].pos;
            from[s] = 0;
            if ((rc = take_blocks(e, &seqs[s], seqs[s].pos + 1)) != 0)
                goto done;
        }
        seq_start[B] = B;
        double t0 = now(), c0 = cpu_seconds();
        g_timing = o->profile && step >= 2;
        rc = ig_engine_forward(e, &b);
        g_timing = 0;
        if (rc != 0)
            goto done;
        if (step >= 2) { /* after two warm-up steps */
            busy += now() - t0;
            cpu += cpu_seconds() - c0;
        }
        for (int s = 0; s < B; s++) {
            seqs[s].pos++;
            seqs[s].next = argmax(logits + (size_t)s * V, V);
        }
    }
    rate = (double)B * o->steps / busy;
    *per_cpu = cpu > 0 ? (double)B * o->steps / cpu : 0;
    for (int k = 0; k < OP_N; k++)
        op_ms[k] = g_op[k] * 1e3 / o->steps;
    op_ms[OP_N] = busy * 1e3 / o->steps;
    op_ms[OP_N + 1] = cpu * 1e3 / o->steps;

done:
    if (rc != 0)
        fprintf(stderr, "engine-bench: batch %d: %s\n", B, ig_strerror(rc));
    for (int s = 0; s < B; s++) {
        for (int i = 0; i < seqs[s].nblocks; i++)
            ig_engine_block_release(e, seqs[s].blocks[i]);
        free(seqs[s].blocks);
    }
    free(seqs), free(tokens), free(seq_start), free(pos_start), free(from), free(tables);
    free(logits);
    return rate;
}

static double bench_prefill(ig_engine_t *e, int n, int chunk, int max_blocks)
{
    int V = ig_engine_config(e)->vocab_size;
    int *tokens = malloc((size_t)n * sizeof(int));
    float *logits = malloc((size_t)V * sizeof(float));
    seq_t s = {malloc((size_t)max_blocks * sizeof(int)), 0, 0, 0};
    double rate = 0;
    int rc = 0;
    for (int i = 0; i < n; i++)
        tokens[i] = (i * 7919 + 13) % V;
    double t0 = now();
    for (int done = 0; done < n;) {
        int k = n - done < chunk ? n - done : chunk;
        int seq_start[2] = {0, k}, pos_start[1] = {done}, from[1] = {done + k == n ? k - 1 : k};
        const int *tables[1] = {s.blocks};
        if ((rc = take_blocks(e, &s, done + k)) != 0)
            break;
        ig_batch_t b = {1, tokens + done, seq_start, pos_start, tables, from, logits};
        if ((rc = ig_engine_forward(e, &b)) != 0)
            break;
        done += k;
    }
    if (rc == 0)
        rate = n / (now() - t0);
    else
        fprintf(stderr, "engine-bench: prefill: %s\n", ig_strerror(rc));
    for (int i = 0; i < s.nblocks; i++)
        ig_engine_block_release(e, s.blocks[i]);
    free(s.blocks), free(tokens), free(logits);
    return rate;
}

static int parse_args(int argc, char **argv, opts_t *o)
{
    o->device = "cpu";
    o->out = "bench/results/engine.json";
    o->threads = 2, o->steps = 32, o->prompt = 16, o->prefill = 512, o->rounds = 3;
    int def[] = {1, 4, 16, 64};
    memcpy(o->batches, def, sizeof(def));
    o->nbatches = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL)
            return -1;
        if (strcmp(a, "--model") == 0)
            o->model = v;
        else if (strcmp(a, "--device") == 0)
            o->device = v;
        else if (strcmp(a, "--out") == 0)
            o->out = v;
        else if (strcmp(a, "--gemm") == 0)
            o->gemm = v;
        else if (strcmp(a, "--kv-dtype") == 0)
            o->kv_dtype = v;
        else if (strcmp(a, "--threads") == 0)
            o->threads = atoi(v);
        else if (strcmp(a, "--steps") == 0)
            o->steps = atoi(v);
        else if (strcmp(a, "--prompt") == 0)
            o->prompt = atoi(v);
        else if (strcmp(a, "--prefill") == 0)
            o->prefill = atoi(v);
        else if (strcmp(a, "--rounds") == 0)
            o->rounds = atoi(v);
        else if (strcmp(a, "--profile") == 0)
            o->profile = atoi(v);
        else if (strcmp(a, "--compare-bf16-dot") == 0)
            o->cmp_dot = atoi(v);
        else if (strcmp(a, "--batches") == 0) {
            o->nbatches = 0;
            for (char *p = (char *)v; *p && o->nbatches < MAX_BATCHES;) {
                o->batches[o->nbatches++] = (int)strtol(p, &p, 10);
                if (*p == ',')
                    p++;
                else if (*p)
                    return -1;
            }
        } else
            return -1;
        i++;
    }
    if (o->model == NULL || o->rounds < 1 || o->steps < 1 || o->prompt < 1 || o->prefill < 1 ||
        o->nbatches < 1)
        return -1;
    for (int i = 0; i < o->nbatches; i++)
        if (o->batches[i] < 1 || o->batches[i] > 256)
            return -1;
    return 0;
}

int main(int argc, char **argv)
{
    opts_t o;
    memset(&o, 0, sizeof(o));
    if (parse_args(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: engine-bench --model DIR [--device cpu] [--threads N] "
                        "[--steps N] [--batches 1,4,16,64] [--prompt N] [--prefill N] "
                        "[--rounds N] [--gemm auto|own|blas-pool|blas] [--out FILE] "
                        "[--profile 1|2] [--kv-dtype f32|f16|bf16] [--compare-bf16-dot 1]\n");
        return 2;
    }
    char err[512] = "";
    ig_model_t *model = NULL;
    ig_backend_t *be = NULL;
    ig_engine_t *e = NULL;
    int rc;
    if ((rc = ig_model_load(&model, o.model, err, sizeof(err))) != 0) {
        fprintf(stderr, "engine-bench: %s\n", err);
        return 1;
    }
    if ((rc = ig_backend_open(&be, o.device, o.threads, err, sizeof(err))) != 0) {
        fprintf(stderr, "engine-bench: %s\n", err);
        return 1;
    }
    if (o.gemm != NULL) {
        ig_cpu_gemm_t m = strcmp(o.gemm, "own") == 0         ? IG_CPU_GEMM_OWN
                          : strcmp(o.gemm, "blas-pool") == 0 ? IG_CPU_GEMM_BLAS_POOL
                          : strcmp(o.gemm, "blas") == 0      ? IG_CPU_GEMM_BLAS_OWN
                                                             : IG_CPU_GEMM_AUTO;
        if ((rc = ig__cpu_set_gemm(be, m)) != 0) {
            fprintf(stderr, "engine-bench: --gemm %s: %s\n", o.gemm, ig_strerror(rc));
            return 1;
        }
    }
    int maxb = 1;
    for (int i = 0; i < o.nbatches; i++)
        maxb = o.batches[i] > maxb ? o.batches[i] : maxb;
    ig_engine_opts_t eo;
    ig_engine_opts_default(&eo);
    int bs = eo.block_size, per_seq = (o.prompt + o.steps + 2 + bs) / bs + 1;
    int pre_blocks = (o.prefill + bs - 1) / bs;
    eo.max_num_seqs = maxb;
    eo.max_batched_tokens = maxb * o.prompt > 512 ? maxb * o.prompt : 512;
    eo.kv_blocks = maxb * per_seq > pre_blocks ? maxb * per_seq : pre_blocks;
    if (o.kv_dtype != NULL && ig_engine_kv_dtype_parse(o.kv_dtype, &eo.kv_dtype) != 0) {
        fprintf(stderr, "engine-bench: --kv-dtype %s: not f32, f16 or bf16\n", o.kv_dtype);
        return 2;
    }
    /* The baseline of --compare-bf16-dot: its own model, backend and
     * engine, uploaded with the widening path. */
    ig_model_t *bmodel = NULL;
    ig_backend_t *bbe = NULL;
    ig_engine_t *be0 = NULL;
    int dot_default = ig__cpu_bf16_dot();
    if (o.cmp_dot) {
        if (!ig__cpu_has_bf16_dot()) {
            fprintf(stderr, "engine-bench: --compare-bf16-dot: this CPU has no AVX512_BF16\n");
            return 2;
        }
        ig__cpu_set_bf16_dot(0);
        if (ig_model_load(&bmodel, o.model, err, sizeof(err)) != 0 ||
            ig_backend_open(&bbe, o.device, o.threads, err, sizeof(err)) != 0 ||
            ig_engine_create(&be0, bmodel, bbe, &eo, err, sizeof(err)) != 0) {
            fprintf(stderr, "engine-bench: baseline: %s\n", err);
            return 1;
        }
        ig__cpu_set_bf16_dot(1); /* the candidate: vdpbf16ps, whatever the default */
    }
    if ((rc = ig_engine_create(&e, model, be, &eo, err, sizeof(err))) != 0) {
        fprintf(stderr, "engine-bench: %s\n", err);
        return 1;
    }
    const ig_model_config_t *c = ig_engine_config(e);
    g_vocab = c->vocab_size;
    if (o.profile)
        profile_install(be);
    g_prof_wall = o.profile == 2;
    const char *gemm = "n/a";
    if (strncmp(be->name, "cpu", 3) == 0) {
        ig_cpu_gemm_t g = ig__cpu_gemm(be);
        gemm = g == IG_CPU_GEMM_OWN         ? "own"
               : g == IG_CPU_GEMM_BLAS_POOL ? "blas-pool"
               : g == IG_CPU_GEMM_BLAS_OWN  ? "blas"
                                            : "auto";
    }
    int max_blocks = (c->max_position_embeddings + bs - 1) / bs + 1;
    g_max_blocks = max_blocks;
    if (o.prefill > c->max_position_embeddings)
        o.prefill = c->max_position_embeddings;
    const char *core;
    int blas_ok = ig__cpu_blas_usable(&core);
    double dot_rate, fma_rate;
    ig__cpu_bf16_dot_rates(&dot_rate, &fma_rate);
    char dot_why[96] = "";
    if (dot_rate > 0)
        snprintf(dot_why, sizeof(dot_why), " (vdpbf16ps %.1f vs FMA %.1f multiply-adds/ns)",
                 dot_rate, fma_rate);
    printf("engine-bench: %s (dim %d, %d layers, vocab %d, %s) on %s, %d threads, gemm %s, "
           "simd %s, bf16 dot %s%s, openblas core %s%s\n",
           o.model, c->hidden_size, c->num_hidden_layers, c->vocab_size, ig_dtype_name(c->dtype),
           be->name, o.threads, gemm, ig__cpu_simd_name(), dot_default ? "on" : "off", dot_why,
           core, blas_ok ? "" : " (generic SSE kernel)");

    /* Rounds go over every batch size in turn and each keeps its best rate:
     * on a shared machine a slow round is other processes' noise, and
     * interleaving keeps the noise from favouring one batch size. */
    double best[MAX_BATCHES] = {0}, best_cpu[MAX_BATCHES] = {0}, pre = 0;
    double prof[MAX_BATCHES][OP_N + 2] = {{0}}; /* ms per step of the best round, then wall, CPU */
    double bbest[MAX_BATCHES] = {0}, bpre = 0;  /* --compare-bf16-dot's baseline */
    for (int r = 0; r < o.rounds; r++) {
        for (int i = 0; i < o.nbatches; i++) {
            if (be0 != NULL) {
                double bpc = 0, bms[OP_N + 2];
                double v = bench_decode(be0, o.batches[i], &o, max_blocks, &bpc, bms);
                if (v <= 0)
                    return 1;
                bbest[i] = v > bbest[i] ? v : bbest[i];
            }
            double pc = 0, ms[OP_N + 2], v = bench_decode(e, o.batches[i], &o, max_blocks, &pc, ms);
            if (v <= 0)
                return 1;
            if (v > best[i])
                memcpy(prof[i], ms, sizeof(ms));
            best[i] = v > best[i] ? v : best[i];
            best_cpu[i] = pc > best_cpu[i] ? pc : best_cpu[i];
        }
        if (be0 != NULL) {
            double p = bench_prefill(be0, o.prefill, eo.max_batched_tokens, max_blocks);
            if (p <= 0)
                return 1;
            bpre = p > bpre ? p : bpre;
        }
        double p = bench_prefill(e, o.prefill, eo.max_batched_tokens, max_blocks);
        if (p <= 0)
            return 1;
        pre = p > pre ? p : pre;
    }
    /* Wall-clock rates are what a client sees; tokens per CPU-second are
     * what the batching saves in work, and hold up better when other
     * processes share the cores. */
    printf("%8s %14s %14s %10s %14s %10s\n", "batch", "tokens/s", "per-seq tok/s", "vs batch 1",
           "tokens/cpu-s", "vs batch 1");
    json_t *res = json_object(), *arr = json_array();
    for (int i = 0; i < o.nbatches; i++) {
        int B = o.batches[i];
        double ratio = best[i] / best[0]; /* the first batch size (1 by default) is the base */
        double cratio = best_cpu[0] > 0 ? best_cpu[i] / best_cpu[0] : 0;
        printf("%8d %14.1f %14.1f %9.2fx %14.1f %9.2fx\n", B, best[i], best[i] / B, ratio,
               best_cpu[i], cratio);
        json_t *row =
            json_pack("{s:i, s:f, s:f, s:f, s:f, s:f}", "batch", B, "tokens_per_s", best[i],
                      "per_seq_tokens_per_s", best[i] / B, "ratio_vs_first", ratio,
                      "tokens_per_cpu_s", best_cpu[i], "cpu_ratio_vs_first", cratio);
        if (o.profile) { /* ms per decode step of the best round, by operation */
            json_t *ms = json_object();
            for (int k = 0; k < OP_N; k++)
                json_object_set_new(ms, op_names[k], json_real(prof[i][k]));
            json_object_set_new(ms, "step", json_real(prof[i][OP_N]));
            json_object_set_new(row, "ms_per_step", ms);
        }
        json_array_append_new(arr, row);
    }
    if (o.profile) {
        printf("ms per decode step (best round): %8s", "batch");
        for (int k = 0; k < OP_N; k++)
            printf(" %10s", op_names[k]);
        printf(" %10s %10s %10s\n", "untimed", "step", "step-cpu");
        for (int i = 0; i < o.nbatches; i++) {
            double sum = 0;
            printf("%32s %8d", "", o.batches[i]);
            for (int k = 0; k < OP_N; k++) {
                printf(" %10.3f", prof[i][k]);
                sum += prof[i][k];
            }
            printf(" %10.3f %10.3f %10.3f\n", prof[i][g_prof_wall ? OP_N : OP_N + 1] - sum,
                   prof[i][OP_N], prof[i][OP_N + 1]);
        }
    }
    printf("prefill: %d tokens at %.1f tokens/s (chunks of %d)\n", o.prefill, pre,
           eo.max_batched_tokens);
    if (be0 != NULL) {
        json_t *cmp = json_array();
        for (int i = 0; i < o.nbatches; i++) {
            printf("bf16 dot vs widened: batch %d %.1f vs %.1f tokens/s: %.2fx\n", o.batches[i],
                   best[i], bbest[i], best[i] / bbest[i]);
            json_array_append_new(cmp, json_pack("{s:i, s:f, s:f, s:f}", "batch", o.batches[i],
                                                 "tokens_per_s", best[i], "widened_tokens_per_s",
                                                 bbest[i], "ratio", best[i] / bbest[i]));
        }
        printf("bf16 dot vs widened: prefill %.1f vs %.1f tokens/s: %.2fx\n", pre, bpre,
               pre / bpre);
        json_object_set_new(res, "bf16_dot_vs_widened",
                            json_pack("{s:b, s:o, s:f, s:f, s:f}", "bf16_dot_default", dot_default,
                                      "decode", cmp, "prefill_tokens_per_s", pre,
                                      "widened_prefill_tokens_per_s", bpre, "prefill_ratio",
                                      pre / bpre));
    }
    long rss = rss_bytes();
    printf("load average (1 min) at the end: %.2f on %ld cores\n", loadavg(),
           sysconf(_SC_NPROCESSORS_ONLN));
    printf("memory: rss %.1f MiB, model %.1f MiB as stored, kv cache %.1f MiB (%d blocks, %s)\n",
           rss / 1048576.0, ig_model_weight_bytes(model) / 1048576.0,
           ig_engine_kv_bytes(e) / 1048576.0, ig_engine_num_blocks(e),
           ig_engine_kv_dtype_name(ig_engine_kv_dtype(e)));

    /* The shape bench/lib/plot.sh draws. */
    json_t *xs = json_array(), *wall = json_array(), *cpu = json_array();
    for (int i = 0; i < o.nbatches; i++) {
        json_array_append_new(xs, json_integer(o.batches[i]));
        json_array_append_new(wall, json_real(best[i]));
        json_array_append_new(cpu, json_real(best_cpu[i]));
    }
    json_object_set_new(res, "plot",
                        json_pack("{s:s, s:s, s:s, s:o, s:{s:o, s:o}}", "title",
                                  "engine: aggregate decode tokens/s by batch size", "xlabel",
                                  "concurrent sequences", "ylabel", "tokens/s", "x", xs, "series",
                                  "wall-clock tokens/s", wall, "tokens per CPU-second", cpu));
    json_object_set_new(res, "bench", json_string("engine"));
    json_object_set_new(res, "model", json_string(o.model));
    json_object_set_new(res, "device", json_string(be->name));
    json_object_set_new(res, "threads", json_integer(o.threads));
    json_object_set_new(res, "gemm", json_string(gemm));
    json_object_set_new(res, "simd", json_string(ig__cpu_simd_name()));
    json_object_set_new(res, "openblas_core", json_string(core));
    json_object_set_new(res, "load_average", json_real(loadavg()));
    json_object_set_new(res, "steps", json_integer(o.steps));
    json_object_set_new(res, "rounds", json_integer(o.rounds));
    json_object_set_new(res, "prompt_tokens", json_integer(o.prompt));
    json_object_set_new(res, "decode", arr);
    json_object_set_new(res, "prefill_tokens", json_integer(o.prefill));
    json_object_set_new(res, "prefill_tokens_per_s", json_real(pre));
    json_object_set_new(res, "rss_bytes", json_integer(rss));
    json_object_set_new(res, "model_bytes", json_integer((json_int_t)ig_model_weight_bytes(model)));
    json_object_set_new(res, "kv_bytes", json_integer((json_int_t)ig_engine_kv_bytes(e)));
    json_object_set_new(res, "kv_blocks", json_integer(ig_engine_num_blocks(e)));
    json_object_set_new(res, "kv_block_size", json_integer(ig_engine_block_size(e)));
    json_object_set_new(res, "kv_dtype",
                        json_string(ig_engine_kv_dtype_name(ig_engine_kv_dtype(e))));
    if (json_dump_file(res, o.out, JSON_INDENT(2)) != 0)
        fprintf(stderr, "engine-bench: cannot write %s\n", o.out);
    else
        printf("wrote %s\n", o.out);
    json_decref(res);
    ig_engine_free(e);
    be->destroy(be);
    ig_model_free(model);
    if (be0 != NULL) {
        ig_engine_free(be0);
        bbe->destroy(bbe);
        ig_model_free(bmodel);
    }
    return 0;
}
