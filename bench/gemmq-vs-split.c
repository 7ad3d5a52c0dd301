/*
 * The driver of bench/gemmq-vs-split.sh: the panel GEMM of gemmq.c (Q8_0 and
 * Q4_0 in one specialized kernel) against the two files it replaced,
 * gemmq8.c and gemmq4.c as the script extracts them from git, compiled into
 * the same binary (their packers and GEMMs keep their own names; their
 * activation quantizer is renamed old_q8_quantize_rows*). Not built by
 * CMake: it links only against a revision that still had the split files.
 *
 *   gemmq-vs-split N K ROUNDS OUT.json
 *
 * For Q8_0 and Q4_0, each instruction set this CPU runs above plain C, and
 * batches 1 and 64: W(N, K) random, quantized to the format and packed by
 * both sides (the bytes must match), x(m, K) quantized once; then ROUNDS
 * rounds, each timing the old and the new GEMM over all N columns on one
 * thread (alternating which goes first), by this thread's CPU time, so
 * other processes on the machine do not count; each side keeps its best.
 * The outputs must have the same bits. Prints new / old time per case and
 * writes them to OUT.json; exits 1 on a mismatch.
 */
#include "../kernels/cpu/cpu_internal.h"
#include "infergate/dtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The split files' entry points (their own cpu_internal.h declared them). */
size_t ig__q8p_packed_bytes(int n, int k);
void ig__q8p_pack(uint8_t *dst, const uint8_t *src, int n, int k);
void ig__gemm_q8(float *y, int ldy, const int8_t *xq, const float *xd, const int32_t *xs,
                 const uint8_t *w, int m, int k, int n0, int n1);
size_t ig__q4p_packed_bytes(int n, int k);
void ig__q4p_pack(uint8_t *dst, const uint8_t *src, int n, int k);
void ig__gemm_q4(float *y, int ldy, const int8_t *xq, const float *xd, const int32_t *xs,
                 const uint8_t *w, int m, int k, int n0, int n1);

typedef struct {
    ig_dtype_t dt;
    int m, n, k;
    const int8_t *xq;
    const float *xd;
    const int32_t *xs;
    const uint8_t *w;
    float *y;
} gemm_case_t;

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void run_old(const gemm_case_t *c)
{
    if (c->dt == IG_DTYPE_Q8_0)
        ig__gemm_q8(c->y, c->n, c->xq, c->xd, c->xs, c->w, c->m, c->k, 0, c->n);
    else
        ig__gemm_q4(c->y, c->n, c->xq, c->xd, c->xs, c->w, c->m, c->k, 0, c->n);
}

static void run_new(const gemm_case_t *c)
{
    ig__gemm_qp(c->dt, c->y, c->n, c->xq, c->xd, c->xs, c->w, c->m, c->k, 0, c->n);
}

/* Seconds per call of f over reps calls. */
static double time_calls(void (*f)(const gemm_case_t *), const gemm_case_t *c, int reps)
{
    double t0 = cpu_s();
    for (int i = 0; i < reps; i++)
        f(c);
    return (cpu_s() - t0) / reps;
}

static uint64_t rng = 0x853c49e6748fea9bull;

static float rand_unit(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) * 0x1p-53 * 2.0 - 1.0);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: gemmq-vs-split N K ROUNDS OUT.json\n");
        return 2;
    }
    int n = atoi(argv[1]), k = atoi(argv[2]), rounds = atoi(argv[3]);
    if (n < 16 || n % 16 != 0 || k < 32 || k % 32 != 0 || rounds < 1) {
        fprintf(stderr, "gemmq-vs-split: N a multiple of 16, K of 32, ROUNDS >= 1\n");
        return 2;
    }
    FILE *out = fopen(argv[4], "w");
    if (out == NULL) {
        perror(argv[4]);
        return 2;
    }
    static const int batches[] = {1, 64};
    static const ig_dtype_t dts[] = {IG_DTYPE_Q8_0, IG_DTYPE_Q4_0};
    int mmax = 64, nb = k / 32, bad = 0, first = 1;
    float *w = malloc((size_t)n * k * sizeof(float)), *x = malloc((size_t)mmax * k * sizeof(float));
    int8_t *xq = malloc((size_t)mmax * k);
    float *xd = malloc((size_t)mmax * nb * sizeof(float));
    int32_t *xs = malloc((size_t)mmax * nb * sizeof(int32_t));
    float *y0 = malloc((size_t)mmax * n * sizeof(float)),
          *y1 = malloc((size_t)mmax * n * sizeof(float));
    for (size_t i = 0; i < (size_t)n * k; i++)
        w[i] = rand_unit();
    for (size_t i = 0; i < (size_t)mmax * k; i++)
        x[i] = rand_unit();
    ig__q8_quantize_rows_sums(xq, xd, xs, x, mmax, k);
    fprintf(out, "{\"n\": %d, \"k\": %d, \"rounds\": %d, \"cases\": [", n, k, rounds);
    printf("%-5s %-7s %5s %12s %12s %9s\n", "dtype", "isa", "batch", "old_us", "new_us", "new/old");
    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
        ig_dtype_t dt = dts[d];
        int q4 = dt == IG_DTYPE_Q4_0;
        unsigned char *file = malloc(ig_dtype_bytes(dt, (size_t)n * k));
        size_t pb = ig__qp_packed_bytes(dt, n, k);
        uint8_t *pold = malloc(pb), *pnew = malloc(pb);
        ig_dtype_from_f32(file, dt, w, (size_t)n * k);
        if ((q4 ? ig__q4p_packed_bytes(n, k) : ig__q8p_packed_bytes(n, k)) != pb) {
            fprintf(stderr, "%s: packed sizes differ\n", ig_dtype_name(dt));
            return 1;
        }
        if (q4)
            ig__q4p_pack(pold, file, n, k);
        else
            ig__q8p_pack(pold, file, n, k);
        ig__qp_pack(pnew, file, dt, n, k);
        if (memcmp(pold, pnew, pb) != 0) {
            fprintf(stderr, "%s: packed bytes differ\n", ig_dtype_name(dt));
            bad = 1;
        }
        for (int isa = IG_CPU_ISA_SCALAR + 1; isa <= (int)ig__cpu_isa_max(); isa++) {
            ig__cpu_set_isa((ig_cpu_isa_t)isa);
            for (size_t bi = 0; bi < sizeof(batches) / sizeof(batches[0]); bi++) {
                int m = batches[bi];
                /* The packed bytes are the same: both sides read one copy
                 * and write one y while timed, so that only the code differs. */
                gemm_case_t co = {dt, m, n, k, xq, xd, xs, pnew, y0};
                gemm_case_t cn = {dt, m, n, k, xq, xd, xs, pnew, y1};
                run_old(&co);
                run_new(&cn);
                if (memcmp(y0, y1, (size_t)m * n * sizeof(float)) != 0) {
                    fprintf(stderr, "%s %s m=%d: outputs differ\n", ig_dtype_name(dt),
                            ig__cpu_isa_name((ig_cpu_isa_t)isa), m);
                    bad = 1;
                }
                /* About 20 ms of work a sample. */
                double once = time_calls(run_new, &cn, 1);
                int reps = once > 0.02 ? 1 : (int)(0.02 / (once > 1e-6 ? once : 1e-6)) + 1;
                cn.y = y0;
                double best_old = 1e30, best_new = 1e30;
                for (int r = 0; r < rounds; r++) {
                    double to, tn;
                    if (r % 2) {
                        tn = time_calls(run_new, &cn, reps);
                        to = time_calls(run_old, &co, reps);
                    } else {
                        to = time_calls(run_old, &co, reps);
                        tn = time_calls(run_new, &cn, reps);
                    }
                    best_old = to < best_old ? to : best_old;
                    best_new = tn < best_new ? tn : best_new;
                }
                const char *isaname = ig__cpu_isa_name((ig_cpu_isa_t)isa);
                printf("%-5s %-7s %5d %12.1f %12.1f %9.3f\n", ig_dtype_name(dt), isaname, m,
                       best_old * 1e6, best_new * 1e6, best_new / best_old);
                fprintf(
                    out,
                    "%s\n  {\"dtype\": \"%s\", \"isa\": \"%s\", \"batch\": %d, \"old_us\": %.2f, "
                    "\"new_us\": %.2f, \"new_over_old\": %.4f}",
                    first ? "" : ",", ig_dtype_name(dt), isaname, m, best_old * 1e6, best_new * 1e6,
                    best_new / best_old);
                first = 0;
            }
        }
        ig__cpu_set_isa(ig__cpu_isa_max());
        free(file), free(pold), free(pnew);
    }
    fprintf(out, "\n], \"bit_identical\": %s}\n", bad ? "false" : "true");
    fclose(out);
    free(w), free(x), free(xq), free(xd), free(xs), free(y0), free(y1);
    return bad;
}
