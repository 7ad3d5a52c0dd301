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
    float *kept_p;  /* (vocab) unnormalised probabilities of kept ids */
    uint32_t *seen; /* (vocab) stamp per token for the penalty's dedupe */
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

void ig_sampling_params_default(ig_sampling_params_t *p)
{
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
}

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
    s->seen = calloc((size_t)vocab, sizeof(uint32_t));
    if (!s->work || !s->idx || !s->kept_p || !s->seen)
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
    free(s->seen);
    free(s);
}

/* ---- helpers -------------------------------------------------------------- */

/* log(sum(exp(x))) computed around the max so that it never overflows. */
static double logsumexp(const float *x, int n)
{
    float m = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > m)
            m = x[i];
    if (m == -INFINITY)
        return -INFINITY;
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += exp((double)(x[i] - m));
    return (double)m + log(sum);
}

/* Ordering used by every selection: larger logit first, then the lower id, so
 * that ties resolve the same way on every run. */
static inline int better(const float *v, int a, int b)
{
    return v[a] > v[b] || (v[a] == v[b] && a < b);
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
            int p = 0;
            for (;;) {
                int l = 2 * p + 1, r = l + 1, w = p;
                if (l < h && better(v, top[w], top[l]))
                    w = l;
                if (r < h && better(v, top[w], top[r]))
                    w = r;
                if (w == p)
                    break;
                int t = top[p];
                top[p] = top[w];
                top[w] = t;
                p = w;
            }
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

/* Max-heap over ids keyed by v. */
static void heap_down(const float *v, int *heap, int n, int p)
{
    for (;;) {
        int l = 2 * p + 1, r = l + 1, w = p;
        if (l < n && better(v, heap[l], heap[w]))
            w = l;
        if (r < n && better(v, heap[r], heap[w]))
            w = r;
        if (w == p)
            return;
        int t = heap[p];
        heap[p] = heap[w];
        heap[w] = t;
        p = w;
    }
}

static int heap_pop(const float *v, int *heap, int *n)
{
    int top = heap[0];
    heap[0] = heap[--*n];
    heap_down(v, heap, *n, 0);
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

static const float *apply_penalty(ig_sampler_t *s, const float *logits, float penalty,
                                  const int *history, int nhistory)
{
    if (penalty == 1.0f || penalty <= 0.0f || nhistory <= 0)
        return logits;
    memcpy(s->work, logits, sizeof(float) * (size_t)s->vocab);
    if (++s->stamp == 0) {
        memset(s->seen, 0, sizeof(uint32_t) * (size_t)s->vocab);
        s->stamp = 1;
    }
    for (int i = 0; i < nhistory; i++) {
        int t = history[i];
        if (t < 0 || t >= s->vocab || s->seen[t] == s->stamp)
            continue;
        s->seen[t] = s->stamp;
        float l = s->work[t];
        s->work[t] = l > 0 ? l / penalty : l * penalty;
    }
    return s->work;
}

static int argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

int ig_sampler_sample(ig_sampler_t *s, const float *logits, const ig_sampling_params_t *p,
                      ig_rng_t *rng, const int *history, int nhistory, int ntop, ig_sample_t *out)
{
    const int V = s->vocab;
    const float *w = apply_penalty(s, logits, p->repetition_penalty, history, nhistory);
    int token;

    if (p->temperature < 1e-5f) {
        token = argmax(w, V);
        goto done;
    }

    const double invt = 1.0 / (double)p->temperature;
    float m = w[argmax(w, V)];
    if (m == -INFINITY) {
        token = 0;
        goto done;
    }
    int filtered = p->top_k > 0 || (p->top_p > 0.0f && p->top_p < 1.0f) || p->min_p > 0.0f;
    if (!filtered) {
        /* Plain temperature: one pass for the sum, one walk for the draw. */
        double z = 0.0;
        for (int i = 0; i < V; i++)
            z += exp(((double)w[i] - m) * invt);
        double u = ig_rng_uniform(rng) * z, acc = 0.0;
        token = -1;
        for (int i = 0; i < V; i++) {
            double e = exp(((double)w[i] - m) * invt);
            if (e <= 0.0)
                continue;
            acc += e;
            token = i;
            if (acc > u)
                break;
        }
        if (token < 0)
            token = argmax(w, V);
        goto done;
    }

    /* Filters: heapify all ids (O(V)), pop in descending order only as many
     * as the filters keep. Probabilities are relative to the max (p_max = 1). */
    int n = V;
    for (int i = 0; i < V; i++)
        s->idx[i] = i;
    for (int i = V / 2 - 1; i >= 0; i--)
        heap_down(w, s->idx, n, i);

    int kmax = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    float top_p = p->top_p > 0.0f && p->top_p < 1.0f ? p->top_p : 1.0f;
    double min_rel = p->min_p > 0.0f ? (double)p->min_p : 0.0;

    /* With top-k the k best are popped first and top-p refers to their mass
     * (vLLM applies top-k, then top-p on what is left); without it top-p
     * refers to the whole vocab and popping stops as soon as a filter says so. */
    int nkeep = 0;
    double cum = 0.0;
    if (kmax < V) {
        int kept = 0;
        double mass = 0.0;
        while (kept < kmax && n > 0) {
            int id = heap_pop(w, s->idx, &n);
            double e = exp(((double)w[id] - m) * invt);
            s->idx[V - 1 - kept] = id; /* popped ids live at the tail */
            s->kept_p[kept++] = (float)e;
            mass += e;
        }
        for (int i = 0; i < kept; i++) {
            double e = s->kept_p[i];
            if (i > 0 && e < min_rel)
                break;
            nkeep++;
            cum += e;
            if (cum >= top_p * mass)
                break;
        }
    } else {
        double mass = 0.0;
        if (top_p < 1.0f)
            for (int i = 0; i < V; i++)
                mass += exp(((double)w[i] - m) * invt);
        while (n > 0) {
            int id = heap_pop(w, s->idx, &n);
            double e = exp(((double)w[id] - m) * invt);
            if (nkeep > 0 && e < min_rel)
                break;
            s->idx[V - 1 - nkeep] = id;
            s->kept_p[nkeep++] = (float)e;
            cum += e;
            if (top_p < 1.0f && cum >= top_p * mass)
                break;
        }
    }
    double z = 0.0;
    for (int i = 0; i < nkeep; i++)
        z += s->kept_p[i];
    double u = ig_rng_uniform(rng) * z, acc = 0.0;
    token = s->idx[V - 1];
    for (int i = 0; i < nkeep; i++) {
        acc += s->kept_p[i];
        token = s->idx[V - 1 - i];
        if (acc > u)
            break;
    }

done:
    out->token = token;
    /* The heap scratch is free again; top_n needs only 20 slots. */
    {
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
