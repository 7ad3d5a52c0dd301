/*
 * Token sampling. See include/infergate/sampler.h for the contract; the notes
 * here say why the loops look the way they do.
 */
#include "infergate/sampler.h"
#include "infergate/error.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ig_sampler_s {
    int vocab;
    float *work;    /* (vocab) penalised logits */
    int *idx;       /* (vocab) heap of candidate ids */
    float *kept_p;  /* (vocab) unnormalised probabilities, by id or kept order */
    float *kept_w;  /* (vocab) weights of the ids a nucleus keeps, in order */
    uint32_t *seen; /* (vocab) stamp per token for the penalty's dedupe */
    int *count;     /* (vocab) output occurrences (valid where seen is current) */
    uint32_t stamp;
};

/* ---- PRNG ---------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void ig_rng_seed(ig_rng_t *rng, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

double ig_rng_uniform(ig_rng_t *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return (double)(result >> 11) * 0x1.0p-53;
}

/* ---- lifecycle ------------------------------------------------------------ */

int ig_sampler_create(ig_sampler_t **out, int vocab)
{
    if (vocab <= 0)
        return IG_EINVAL;
    ig_sampler_t *s = calloc(1, sizeof(*s));
    if (!s)
        return IG_ENOMEM;
    s->vocab = vocab;
    s->work = malloc(sizeof(float) * (size_t)vocab);
    s->idx = malloc(sizeof(int) * (size_t)vocab);
    s->kept_p = malloc(sizeof(float) * (size_t)vocab);
    s->kept_w = malloc(sizeof(float) * (size_t)vocab);
    s->seen = calloc((size_t)vocab, sizeof(uint32_t));
    s->count = calloc((size_t)vocab, sizeof(int));
    if (!s->work || !s->idx || !s->kept_p || !s->kept_w || !s->seen || !s->count)
        goto fail;
    *out = s;
    return 0;
fail:
    ig_sampler_free(s);
    return IG_ENOMEM;
}

void ig_sampler_free(ig_sampler_t *s)
{
    if (!s)
        return;
    free(s->work);
    free(s->idx);
    free(s->kept_p);
    free(s->kept_w);
    free(s->seen);
    free(s->count);
    free(s);
}

/* ---- helpers -------------------------------------------------------------- */

/* exp(x) in float, written so that loops over it vectorise (glibc's expf
 * does not without -ffast-math): 2^(x log2 e) split into a rounded exponent
 * k and f in [-0.5, 0.5], 2^f by a degree-6 polynomial (relative error about
 * 1e-7, fitted for this file). Clamped to [-87, 88]: below, ~1e-38, not 0. */
static inline float fast_expf(float x)
{
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float t = x * 1.44269504f;
    float r = (t + 12582912.0f) - 12582912.0f; /* round to nearest (1.5 * 2^23) */
    float f = t - r;
    float p = 1.53375775e-04f;
    p = p * f + 1.33998599e-03f;
    p = p * f + 9.61851981e-03f;
    p = p * f + 5.55032901e-02f;
    p = p * f + 2.40226462e-01f;
    p = p * f + 6.93147182e-01f;
    p = p * f + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)r + 127) << 23;
    float two_k;
    memcpy(&two_k, &bits, sizeof(two_k)); /* 2^k, a register move */
    return p * two_k;
}

#define LANES 16

/* max of x(n) in LANES independent lanes (a plain reduction would not be
 * vectorised without -ffast-math). */
static float max_of(const float *x, int n)
{
    float lane[LANES];
    int i = 0;
    for (int j = 0; j < LANES; j++)
        lane[j] = -INFINITY;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++)
            lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
    float m = -INFINITY;
    for (int j = 0; j < LANES; j++)
        m = lane[j] > m ? lane[j] : m;
    for (; i < n; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}

/* out(n) = exp((x - m) * scale). The hot loop of the sampler: at -O2 GCC's
 * "very cheap" vectoriser leaves it scalar, so this one function asks for
 * the normal cost model (about 8x faster on a 128k vocab with AVX-512). */
#if defined(__GNUC__) && !defined(__clang__)
#define IG_VECTORISE                                                                               \
    __attribute__((noinline, optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define IG_VECTORISE /* clang vectorises this loop at -O2 already */
#endif
IG_VECTORISE static void exp_map(const float *restrict x, int n, float m, float scale,
                                 float *restrict out)
{
    for (int i = 0; i < n; i++)
        out[i] = fast_expf((x[i] - m) * scale);
}

/* sum of x(n) in LANES independent lanes. */
static double sum_lanes(const float *x, int n)
{
    float lane[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++)
            lane[j] += x[i + j];
    double z = 0.0;
    for (int j = 0; j < LANES; j++)
        z += lane[j];
    for (; i < n; i++)
        z += x[i];
    return z;
}

/* sum of exp((x - m) * scale), storing each term in out when not NULL. */
static double sum_exp(const float *x, int n, float m, float scale, float *out)
{
    if (out) {
        exp_map(x, n, m, scale, out);
        return sum_lanes(out, n);
    }
    float buf[1024];
    double z = 0.0;
    for (int i = 0; i < n; i += 1024) {
        int k = n - i < 1024 ? n - i : 1024;
        exp_map(x + i, k, m, scale, buf);
        z += sum_lanes(buf, k);
    }
    return z;
}

/* log(sum(exp(x))) computed around the max so that it never overflows. */
static double logsumexp(const float *x, int n)
{
    float m = max_of(x, n);
    if (m == -INFINITY)
        return -INFINITY;
    return (double)m + log(sum_exp(x, n, m, 1.0f, NULL));
}

/* Ordering used by every selection: larger logit first, then the lower id, so
 * that ties resolve the same way on every run. */
static inline int better(const float *v, int a, int b)
{
    return v[a] > v[b] || (v[a] == v[b] && a < b);
}

/* Heaps of ids keyed by v: a max-heap holds the best id at its root, a
 * min-heap (min set) the worst. Whether id a belongs above id b: */
static inline int above(const float *v, int a, int b, int min)
{
    return min ? better(v, b, a) : better(v, a, b);
}

static void heap_down(const float *v, int *heap, int n, int p, int min)
{
    for (;;) {
        int l = 2 * p + 1, r = l + 1, w = p;
        if (l < n && above(v, heap[l], heap[w], min))
            w = l;
        if (r < n && above(v, heap[r], heap[w], min))
            w = r;
        if (w == p)
            return;
        int t = heap[p];
        heap[p] = heap[w];
        heap[w] = t;
        p = w;
    }
}

/* Top `n` ids of v(len) into top(n), best first, with a min-heap of n. */
static int top_n(const float *v, int len, int n, int *top)
{
    if (n > len)
        n = len;
    int h = 0;
    for (int i = 0; i < len; i++) {
        if (h < n) {
            /* sift up: the heap root is the worst kept id */
            int c = h++;
            top[c] = i;
            while (c > 0) {
                int p = (c - 1) / 2;
                if (!better(v, top[p], top[c]))
                    break;
                int t = top[p];
                top[p] = top[c];
                top[c] = t;
                c = p;
            }
        } else if (better(v, i, top[0])) {
            top[0] = i;
            heap_down(v, top, h, 0, 1);
        }
    }
    /* Heap order to best-first: a small insertion sort (n <= 20). */
    for (int i = 1; i < h; i++) {
        int x = top[i], j = i - 1;
        while (j >= 0 && better(v, x, top[j])) {
            top[j + 1] = top[j];
            j--;
        }
        top[j + 1] = x;
    }
    return h;
}

static int heap_pop(const float *v, int *heap, int *n)
{
    int top = heap[0];
    heap[0] = heap[--*n];
    heap_down(v, heap, *n, 0, 0);
    return top;
}

static void fill_logprobs(const float *raw, int vocab, double lse, int token, int ntop,
                          int *scratch, ig_sample_t *out)
{
    out->logprob = (float)((double)raw[token] - lse);
    if (ntop < 0)
        ntop = 0;
    if (ntop > IG_SAMPLER_MAX_TOP)
        ntop = IG_SAMPLER_MAX_TOP;
    out->ntop = ntop ? top_n(raw, vocab, ntop, scratch) : 0;
    for (int i = 0; i < out->ntop; i++) {
        out->top_tokens[i] = scratch[i];
        out->top_logprobs[i] = (float)((double)raw[scratch[i]] - lse);
    }
}

/* ---- sampling ------------------------------------------------------------- */

int ig_sampler_logprobs(ig_sampler_t *s, const float *logits, int token, int ntop, ig_sample_t *out)
{
    if (token < 0 || token >= s->vocab)
        return IG_EINVAL;
    out->token = token;
    int top[IG_SAMPLER_MAX_TOP];
    fill_logprobs(logits, s->vocab, logsumexp(logits, s->vocab), token, ntop, top, out);
    return 0;
}

/* A fresh stamp: marks in seen[] from earlier passes stop counting. */
static uint32_t next_stamp(ig_sampler_t *s)
{
    if (++s->stamp == 0) {
        memset(s->seen, 0, sizeof(uint32_t) * (size_t)s->vocab);
        s->stamp = 1;
    }
    return s->stamp;
}

/* The logit bias and the penalties on a copy of the logits: the bias first
 * (OpenAI's logit_bias, added), then repetition (HF/vLLM) over prompt and
 * output, presence and frequency (OpenAI) over the output only. */
static const float *apply_penalty(ig_sampler_t *s, const float *logits,
                                  const ig_sampling_params_t *p, const int *history, int nhistory,
                                  int nprompt)
{
    float rep = p->repetition_penalty;
    int do_rep = rep != 1.0f && rep > 0.0f && nhistory > 0;
    int do_pf = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    int nbias = p->nlogit_bias < IG_SAMPLER_MAX_BIAS ? p->nlogit_bias : IG_SAMPLER_MAX_BIAS;
    if (nprompt < 0 || nprompt > nhistory)
        nprompt = nhistory;
    if (nhistory < 0)
        nhistory = 0;
    do_pf = do_pf && nhistory > nprompt;
    if (!do_rep && !do_pf && nbias <= 0)
        return logits;
    memcpy(s->work, logits, sizeof(float) * (size_t)s->vocab);
    for (int i = 0; i < nbias; i++) {
        int t = p->logit_bias[i].token;
        if (t >= 0 && t < s->vocab)
            s->work[t] += p->logit_bias[i].bias;
    }
    if (do_rep) {
        uint32_t st = next_stamp(s);
        for (int i = 0; i < nhistory; i++) {
            int t = history[i];
            if (t < 0 || t >= s->vocab || s->seen[t] == st)
                continue;
            s->seen[t] = st;
            float l = s->work[t];
            s->work[t] = l > 0 ? l / rep : l * rep;
        }
    }
    if (do_pf) {
        uint32_t counted = next_stamp(s);
        for (int i = nprompt; i < nhistory; i++) {
            int t = history[i];
            if (t < 0 || t >= s->vocab)
                continue;
            if (s->seen[t] != counted) {
                s->seen[t] = counted;
                s->count[t] = 0;
            }
            s->count[t]++;
        }
        uint32_t applied = next_stamp(s);
        for (int i = nprompt; i < nhistory; i++) {
            int t = history[i];
            if (t < 0 || t >= s->vocab || s->seen[t] == applied)
                continue;
            s->seen[t] = applied;
            s->work[t] -= p->frequency_penalty * (float)s->count[t] + p->presence_penalty;
        }
    }
    return s->work;
}

/* The max and the index of the max of v(n). */
static int argmax_of(const float *v, int n, float *max)
{
    float m = max_of(v, n);
    *max = m;
    for (int i = 0; i < n; i++)
        if (v[i] == m)
            return i; /* the first of equals, as everywhere here */
    return 0;
}

/* Draws from kept ids idx[0..n) with unnormalised weights p[0..n). */
static int draw(const int *idx, const float *p, int n, double z, ig_rng_t *rng)
{
    double u = ig_rng_uniform(rng) * z, acc = 0.0;
    int last = idx[0];
    for (int i = 0; i < n; i++) {
        if (p[i] <= 0.0f)
            continue;
        acc += p[i];
        last = idx[i];
        if (acc > u)
            break;
    }
    return last;
}

/* The same over every id, e(V) the weights: ids under min_w (and zero
 * weights) are left out, total is the weight of the others; dflt when
 * none is left. */
static int draw_all(const float *e, int V, float min_w, double total, ig_rng_t *rng, int dflt)
{
    double u = ig_rng_uniform(rng) * total, acc = 0.0;
    int last = dflt;
    for (int i = 0; i < V; i++) {
        if (e[i] < min_w || e[i] <= 0.0f)
            continue;
        acc += e[i];
        last = i;
        if (acc > u)
            break;
    }
    return last;
}

int ig_sampler_sample(ig_sampler_t *s, const float *logits, const ig_sampling_params_t *p,
                      ig_rng_t *rng, const int *history, int nhistory, int nprompt, int ntop,
                      ig_sample_t *out)
{
    const int V = s->vocab;
    const float *w = apply_penalty(s, logits, p, history, nhistory, nprompt);
    float m;
    int token = argmax_of(w, V, &m);

    if (p->temperature < 1e-5f || m == -INFINITY)
        goto done; /* greedy (or nothing is possible) */

    const float invt = 1.0f / p->temperature;
    int kmax = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    float top_p = p->top_p > 0.0f && p->top_p < 1.0f ? p->top_p : 1.0f;
    float min_p = p->min_p > 0.0f ? p->min_p : 0.0f;
    int *idx = s->idx;
    float *e = s->kept_p;

    if (kmax < V) {
        /* top-k first (vLLM's order): the k best by a min-heap of k, O(V)
         * compares for small k; top-p then refers to their mass. */
        int n = top_n(w, V, kmax, idx); /* best first */
        double mass = 0.0;
        for (int i = 0; i < n; i++)
            mass += e[i] = fast_expf((w[idx[i]] - m) * invt);
        int nkeep = 0;
        double cum = 0.0;
        for (int i = 0; i < n; i++) {
            if (i > 0 && e[i] < min_p)
                break;
            nkeep++;
            cum += e[i];
            if (cum >= (double)top_p * mass)
                break;
        }
        token = draw(idx, e, nkeep, cum, rng);
        goto done;
    }

    if (top_p >= 1.0f && min_p <= 0.0f) {
        /* Plain temperature: one pass of expf into scratch, one draw. */
        double z = sum_exp(w, V, m, invt, e);
        token = draw_all(e, V, 0.0f, z, rng, token);
        goto done;
    }

    /* min-p alone filters without any order: one pass of weights, one draw
     * over the ids that pass (the most likely one always does). */
    double z = sum_exp(w, V, m, invt, e);
    if (top_p >= 1.0f) {
        double kept = 0.0;
        for (int i = 0; i < V; i++)
            kept += e[i] >= min_p ? e[i] : 0.0f;
        token = draw_all(e, V, min_p, kept, rng, token);
        goto done;
    }

    /* top-p (with min-p): only ids of weight >= tau = (1 - top_p) z / V can
     * be in the nucleus, because all the lighter ones together weigh less
     * than (1 - top_p) z, so the nucleus is complete before reaching any of
     * them. Those few candidates are heapified and popped in order; the rest
     * is never sorted. */
    double tau = (1.0 - (double)top_p) * z / V;
    if (min_p > tau)
        tau = min_p;
    int n = 0;
    for (int i = 0; i < V; i++)
        if (e[i] >= tau)
            idx[n++] = i;
    for (int i = n / 2 - 1; i >= 0; i--)
        heap_down(w, idx, n, i, 0);
    int nkeep = 0;
    double cum = 0.0;
    float *kw = s->kept_w;
    /* Pop into the tail of idx (slots freed by the pops), weights into kw. */
    while (n > 0) {
        int id = heap_pop(w, idx, &n);
        float ei = e[id];
        if (nkeep > 0 && ei < min_p)
            break;
        idx[V - 1 - nkeep] = id;
        kw[nkeep++] = ei;
        cum += ei;
        if (cum >= (double)top_p * z)
            break;
    }
    {
        double u = ig_rng_uniform(rng) * cum, acc = 0.0;
        token = idx[V - 1];
        for (int i = 0; i < nkeep; i++) {
            acc += kw[i];
            token = idx[V - 1 - i];
            if (acc > u)
                break;
        }
    }

done:
    out->token = token;
    out->ntop = 0;
    out->logprob = 0.0f;
    if (ntop >= 0) {
        int top[IG_SAMPLER_MAX_TOP];
        fill_logprobs(logits, V, logsumexp(logits, V), token, ntop, top, out);
    }
    return 0;
}

/* ---- stop rule ------------------------------------------------------------ */

const char *ig_finish_reason(ig_finish_t f)
{
    switch (f) {
    case IG_FINISH_STOP:
        return "stop";
    case IG_FINISH_LENGTH:
        return "length";
    case IG_FINISH_CANCELLED:
        return "cancelled";
    case IG_FINISH_TIMEOUT:
        return "timeout";
    case IG_FINISH_ERROR:
        return "error";
    default:
        return NULL;
    }
}

int ig_stop_is_stop_token(const ig_stop_rule_t *r, int token)
{
    if (!r->ignore_eos)
        for (int i = 0; i < r->neos; i++)
            if (r->eos[i] == token)
                return 1;
    for (int i = 0; i < r->nstop_ids; i++)
        if (r->stop_ids[i] == token)
            return 1;
    return 0;
}

ig_finish_t ig_stop_check(const ig_stop_rule_t *r, int token, int ngenerated)
{
    if (ig_stop_is_stop_token(r, token))
        return IG_FINISH_STOP;
    if (r->max_tokens > 0 && ngenerated >= r->max_tokens)
        return IG_FINISH_LENGTH;
    return IG_FINISH_NONE;
}
