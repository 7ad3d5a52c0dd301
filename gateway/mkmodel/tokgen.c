/*
 * BPE vocabulary generator. It writes an English-like corpus from a seeded
 * generator (a syllable lexicon with Zipf frequencies, sentences,
 * punctuation, numbers), pre-tokenizes it with the same split rules the
 * loader uses, and learns merges with incremental pair counts: a merge only
 * revisits the words that contain its pair, and a lazy max-heap holds the
 * pair counts. When the corpus has no pairs left before the vocabulary is
 * full, it joins existing tokens in a seeded order so that the size is exact
 * and every merge is valid.
 */
#include "infergate/tokgen.h"

#include "infergate/error.h"
#include "infergate/strbuf.h"
#include "infergate/utf8.h"
#include "../engine/tokenizer/internal.h"

#include <jansson.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint32_t rng_below(uint64_t *s, uint32_t n)
{
    return (uint32_t)(rng_next(s) % n);
}

/* Reallocates the array that arrp points to (a T **) to c elements of
 * elem bytes. 0, or IG_ENOMEM with the array as it was. */
static int resize(void *arrp, size_t c, size_t elem)
{
    void *a;
    memcpy(&a, arrp, sizeof a);
    void *na = realloc(a, c * elem);
    if (!na)
        return IG_ENOMEM;
    memcpy(arrp, &na, sizeof na);
    return 0;
}

/* Makes room for one more element in the array at arrp holding n of *cap:
 * doubles it when full (first: the size of a new one). 0 or IG_ENOMEM. */
static int grow(void *arrp, size_t *cap, size_t n, size_t elem, size_t first)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : first;
    if (resize(arrp, c, elem))
        return IG_ENOMEM;
    *cap = c;
    return 0;
}

/* The index tables below (strings, pairs) are open addressing over int32
 * indices: a slot of -1 is empty, collisions probe linearly, and the slot
 * count is a power of two (mask = count - 1) kept over twice the entries. */

/* A fresh slot array of mask + 1 empty slots, or NULL. */
static int32_t *slots_new(size_t mask)
{
    int32_t *s = malloc((mask + 1) * sizeof *s);
    if (s)
        memset(s, 0xff, (mask + 1) * sizeof *s);
    return s;
}

/* The first empty slot from i on. */
static size_t slot_free(const int32_t *slot, size_t mask, size_t i)
{
    while (slot[i] >= 0)
        i = (i + 1) & mask;
    return i;
}

/* Where entry k of ctx hashes to under mask. */
typedef size_t (*slot_hash_fn)(const void *ctx, size_t k, size_t mask);

/* Doubles *slot (and *mask) and inserts entries 0..n-1 again. */
static int slots_grow(int32_t **slot, size_t *mask, size_t n, slot_hash_fn hash, const void *ctx)
{
    size_t m = (*mask + 1) * 2 - 1;
    int32_t *ns = slots_new(m);
    if (!ns)
        return IG_ENOMEM;
    for (size_t k = 0; k < n; k++)
        ns[slot_free(ns, m, hash(ctx, k, m))] = (int32_t)k;
    free(*slot);
    *slot = ns;
    *mask = m;
    return 0;
}

/* A string -> index table (open addressing) over strings kept in an arena. */
typedef struct {
    int32_t *slot;
    size_t mask;
    char **str;
    uint32_t *len;
    int64_t *count;
    size_t n, cap;
} strtab_t;

static int st_init(strtab_t *t, size_t expect)
{
    size_t c = 1024;
    while (c < expect * 2)
        c <<= 1;
    memset(t, 0, sizeof *t);
    t->mask = c - 1;
    if (!(t->slot = slots_new(t->mask)))
        return IG_ENOMEM;
    return 0;
}

static void st_dispose(strtab_t *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->str[i]);
    free(t->str);
    free(t->len);
    free(t->count);
    free(t->slot);
    memset(t, 0, sizeof *t);
}

static int32_t st_find(const strtab_t *t, const char *s, size_t n)
{
    size_t i = (size_t)ig__hash_bytes(s, n) & t->mask;
    for (;;) {
        int32_t k = t->slot[i];
        if (k < 0)
            return -1;
        if (t->len[k] == n && memcmp(t->str[k], s, n) == 0)
            return k;
        i = (i + 1) & t->mask;
    }
}

static size_t st_hash_of(const void *ctx, size_t k, size_t mask)
{
    const strtab_t *t = ctx;
    return (size_t)ig__hash_bytes(t->str[k], t->len[k]) & mask;
}

static int st_rehash(strtab_t *t)
{
    return slots_grow(&t->slot, &t->mask, t->n, st_hash_of, t);
}

/* Adds count to s, inserting it when new; *idx gets its index. */
static int st_add(strtab_t *t, const char *s, size_t n, int64_t count, int32_t *idx)
{
    int32_t k = st_find(t, s, n);
    size_t i;
    if (k >= 0) {
        t->count[k] += count;
        if (idx)
            *idx = k;
        return 0;
    }
    if (t->n == t->cap) {
        size_t c = t->cap ? t->cap * 2 : 1024;
        if (resize(&t->str, c, sizeof *t->str) || resize(&t->len, c, sizeof *t->len) ||
            resize(&t->count, c, sizeof *t->count))
            return IG_ENOMEM;
        t->cap = c;
    }
    if ((t->n + 1) * 2 > t->mask + 1 && st_rehash(t))
        return IG_ENOMEM;
    if (!(t->str[t->n] = malloc(n + 1)))
        return IG_ENOMEM;
    memcpy(t->str[t->n], s, n);
    t->str[t->n][n] = 0;
    t->len[t->n] = (uint32_t)n;
    t->count[t->n] = count;
    i = slot_free(t->slot, t->mask, (size_t)ig__hash_bytes(s, n) & t->mask);
    t->slot[i] = (int32_t)t->n;
    if (idx)
        *idx = (int32_t)t->n;
    t->n++;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Corpus                                                                   */
/* ------------------------------------------------------------------------ */

static const char *const FUNCTION_WORDS[] = {
    "the",   "of",    "and",   "to",    "a",       "in",      "is",      "that",     "for",
    "it",    "as",    "was",   "with",  "be",      "by",      "on",      "not",      "he",
    "this",  "are",   "or",    "his",   "from",    "at",      "which",   "but",      "have",
    "an",    "had",   "they",  "you",   "were",    "their",   "one",     "all",      "we",
    "can",   "her",   "has",   "there", "been",    "if",      "more",    "when",     "will",
    "would", "who",   "so",    "no",    "she",     "other",   "its",     "may",      "these",
    "what",  "them",  "than",  "some",  "him",     "time",    "into",    "only",     "do",
    "could", "new",   "about", "two",   "first",   "then",    "also",    "any",      "my",
    "now",   "such",  "like",  "our",   "over",    "man",     "me",      "even",     "most",
    "made",  "after", "many",  "did",   "should",  "where",   "your",    "how",      "way",
    "world", "model", "token", "data",  "server",  "request", "answer",  "question", "people",
    "water", "house", "light", "night", "because", "through", "between", "before",   "under"};

static const char *const ONSETS[] = {"",   "",   "",    "b",  "c",  "d",  "f",  "g",  "h",  "j",
                                     "k",  "l",  "m",   "n",  "p",  "r",  "s",  "t",  "v",  "w",
                                     "y",  "z",  "bl",  "br", "ch", "cl", "cr", "dr", "fl", "fr",
                                     "gl", "gr", "pl",  "pr", "sc", "sh", "sk", "sl", "sm", "sn",
                                     "sp", "st", "str", "th", "tr", "wh", "qu", "ph", "gn", "kn"};
static const char *const NUCLEI[] = {"a",  "e",  "i",  "o",  "u",  "a",  "e", "i",  "o",
                                     "ai", "ea", "ee", "oo", "ou", "ie", "y", "oa", "au"};
static const char *const CODAS[] = {"",     "",    "",   "",   "n",  "r",    "s",   "t",
                                    "l",    "d",   "m",  "ng", "st", "nd",   "rt",  "ck",
                                    "sh",   "th",  "ll", "ss", "nt", "x",    "ght", "ble",
                                    "tion", "ing", "ed", "er", "ly", "ness", "ment"};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

typedef struct {
    char **words;
    size_t n;
    uint64_t *cdf; /* (n) cumulative Zipf weights, integers so that every
                    * platform draws the same words */
} lexicon_t;

static void lex_dispose(lexicon_t *lx)
{
    for (size_t i = 0; i < lx->n; i++)
        free(lx->words[i]);
    free(lx->words);
    free(lx->cdf);
}

static int lex_build(lexicon_t *lx, size_t n, uint64_t *rng)
{
    strtab_t seen;
    char w[128];
    uint64_t acc = 0;
    int rc = st_init(&seen, n);
    memset(lx, 0, sizeof *lx);
    if (rc || !(lx->words = calloc(n, sizeof *lx->words)) ||
        !(lx->cdf = malloc(n * sizeof *lx->cdf))) {
        st_dispose(&seen);
        return IG_ENOMEM;
    }
    while (lx->n < n) {
        size_t len = 0;
        if (lx->n < N_OF(FUNCTION_WORDS)) {
            len = strlen(FUNCTION_WORDS[lx->n]);
            memcpy(w, FUNCTION_WORDS[lx->n], len);
        } else {
            uint32_t r = rng_below(rng, 100);
            int syl = r < 25 ? 1 : r < 65 ? 2 : r < 88 ? 3 : r < 97 ? 4 : 5;
            /* Long tails get longer words, as rare words are in English. */
            if (lx->n > n / 2 && syl < 3)
                syl++;
            for (int k = 0; k < syl; k++) {
                const char *o = ONSETS[rng_below(rng, N_OF(ONSETS))];
                const char *v = NUCLEI[rng_below(rng, N_OF(NUCLEI))];
                const char *c = CODAS[rng_below(rng, N_OF(CODAS))];
                size_t lo = strlen(o), lv = strlen(v), lc = strlen(c);
                if (len + lo + lv + lc >= sizeof w - 1)
                    break;
                memcpy(w + len, o, lo);
                memcpy(w + len + lo, v, lv);
                memcpy(w + len + lo + lv, c, lc);
                len += lo + lv + lc;
            }
        }
        if (st_find(&seen, w, len) >= 0)
            continue;
        if ((rc = st_add(&seen, w, len, 1, NULL)) != 0 || !(lx->words[lx->n] = malloc(len + 1))) {
            st_dispose(&seen);
            return IG_ENOMEM;
        }
        memcpy(lx->words[lx->n], w, len);
        lx->words[lx->n][len] = 0;
        acc += (1ull << 32) / (uint64_t)(lx->n + 2);
        lx->cdf[lx->n] = acc;
        lx->n++;
    }
    st_dispose(&seen);
    return 0;
}

static size_t lex_sample(const lexicon_t *lx, uint64_t *rng)
{
    uint64_t x = rng_next(rng) % lx->cdf[lx->n - 1] + 1;
    size_t lo = 0, hi = lx->n - 1;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (lx->cdf[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void add_word(ig_strbuf_t *t, const char *w, int cap)
{
    char c0[2] = {0, 0};
    if (!cap) {
        ig_strbuf_puts(t, w);
        return;
    }
    c0[0] = (char)(w[0] >= 'a' && w[0] <= 'z' ? w[0] - 32 : w[0]);
    ig_strbuf_puts(t, c0);
    ig_strbuf_puts(t, w + 1);
}

/* English-like text: sentences over the lexicon plus a glossary line for
 * every word so that the rare tail is seen at least once. */
static int corpus_build(ig_strbuf_t *t, const lexicon_t *lx, size_t n_words, int newlines,
                        uint64_t *rng)
{
    static const char *const ENDS[] = {".", ".", ".", ".", "?", "!", "...", "."};
    size_t emitted = 0;
    char num[32];
    while (emitted < n_words && !t->oom) {
        int len = 4 + (int)rng_below(rng, 15);
        for (int k = 0; k < len && !t->oom; k++) {
            uint32_t r = rng_below(rng, 1000);
            const char *w = lx->words[lex_sample(lx, rng)];
            if (k > 0)
                ig_strbuf_puts(t, " ");
            if (r < 12) {
                snprintf(num, sizeof num, "%u", rng_below(rng, r < 4 ? 100000 : 2100));
                ig_strbuf_puts(t, num);
            } else if (r < 20) {
                ig_strbuf_puts(t, "\"");
                add_word(t, w, 0);
                ig_strbuf_puts(t, "\"");
            } else if (r < 26) {
                ig_strbuf_puts(t, "(");
                add_word(t, w, 0);
                ig_strbuf_puts(t, ")");
            } else if (r < 32) {
                add_word(t, w, 0);
                ig_strbuf_puts(t, "'s");
            } else {
                add_word(t, w, k == 0 || r < 40);
            }
            if (k + 1 < len && rng_below(rng, 12) == 0)
                ig_strbuf_puts(t, rng_below(rng, 5) ? "," : (rng_below(rng, 2) ? ";" : ":"));
            emitted++;
        }
        ig_strbuf_puts(t, ENDS[rng_below(rng, N_OF(ENDS))]);
        if (newlines && rng_below(rng, 6) == 0)
            ig_strbuf_puts(t, rng_below(rng, 3) ? "\n\n" : "\n");
        else
            ig_strbuf_puts(t, " ");
    }
    for (size_t i = 0; i < lx->n && !t->oom; i++) {
        add_word(t, lx->words[i], 0);
        ig_strbuf_puts(t, i % 8 == 7 ? (newlines ? ".\n" : ". ") : ", ");
    }
    return t->oom ? IG_ENOMEM : 0;
}

/* ------------------------------------------------------------------------ */
/* BPE training                                                             */
/* ------------------------------------------------------------------------ */

typedef struct {
    int32_t a, b;
    int64_t count;
    int32_t *occ; /* words where the pair occurs (may repeat or be stale) */
    uint32_t nocc, capocc;
    uint32_t epoch; /* last batch that queued the pair */
} pair_t;

typedef struct {
    int64_t count;
    int32_t a, b;
} hent_t;

typedef struct {
    /* words */
    int32_t *sym; /* all word symbols, word w at sym[off[w] .. off[w] + len[w]) */
    uint32_t *off, *len;
    int64_t *wcount;
    uint32_t *stamp;
    size_t nwords;
    /* pairs */
    pair_t *pairs;
    size_t npairs, cappairs;
    int32_t *pslot;
    size_t pmask;
    hent_t *heap;
    size_t nheap, capheap;
    int32_t *dirty; /* pairs whose count grew in this batch, queued once at its end */
    size_t ndirty, capdirty;
    uint32_t epoch;
    /* tokens */
    strtab_t *vocab; /* token strings; index = id */
    int32_t *merge_a, *merge_b;
    size_t nmerges, capmerges;
} trainer_t;

static size_t pair_hash(int32_t a, int32_t b, size_t mask)
{
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    return (size_t)ig__hash_pair(k) & mask;
}

static size_t pair_hash_of(const void *ctx, size_t k, size_t mask)
{
    const trainer_t *t = ctx;
    return pair_hash(t->pairs[k].a, t->pairs[k].b, mask);
}

static int pairs_rehash(trainer_t *t)
{
    return slots_grow(&t->pslot, &t->pmask, t->npairs, pair_hash_of, t);
}

static pair_t *pair_get(trainer_t *t, int32_t a, int32_t b, int create)
{
    size_t i = pair_hash(a, b, t->pmask);
    pair_t *p;
    for (;;) {
        int32_t k = t->pslot[i];
        if (k < 0)
            break;
        if (t->pairs[k].a == a && t->pairs[k].b == b)
            return &t->pairs[k];
        i = (i + 1) & t->pmask;
    }
    if (!create)
        return NULL;
    if (grow(&t->pairs, &t->cappairs, t->npairs, sizeof *t->pairs, 4096))
        return NULL;
    if ((t->npairs + 1) * 2 > t->pmask + 1) {
        if (pairs_rehash(t))
            return NULL;
        i = slot_free(t->pslot, t->pmask, pair_hash(a, b, t->pmask));
    }
    p = &t->pairs[t->npairs];
    memset(p, 0, sizeof *p);
    p->a = a;
    p->b = b;
    t->pslot[i] = (int32_t)t->npairs++;
    return p;
}

/* Heap order: higher count first, then smaller (a, b): deterministic. */
static int hent_before(const hent_t *x, const hent_t *y)
{
    if (x->count != y->count)
        return x->count > y->count;
    if (x->a != y->a)
        return x->a < y->a;
    return x->b < y->b;
}

static int heap_push_t(trainer_t *t, int64_t count, int32_t a, int32_t b)
{
    hent_t v = {count, a, b};
    size_t i;
    if (grow(&t->heap, &t->capheap, t->nheap, sizeof *t->heap, 4096))
        return IG_ENOMEM;
    i = t->nheap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!hent_before(&v, &t->heap[p]))
            break;
        t->heap[i] = t->heap[p];
        i = p;
    }
    t->heap[i] = v;
    return 0;
}

static hent_t heap_pop_t(trainer_t *t)
{
    hent_t top = t->heap[0], v = t->heap[--t->nheap];
    size_t i = 0, n = t->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && hent_before(&t->heap[c + 1], &t->heap[c]))
            c++;
        if (!hent_before(&t->heap[c], &v))
            break;
        t->heap[i] = t->heap[c];
        i = c;
    }
    if (n)
        t->heap[i] = v;
    return top;
}

/* Changes a pair's count by delta for word w; increments queue the pair. */
static int pair_delta(trainer_t *t, int32_t a, int32_t b, int64_t delta, int32_t w)
{
    pair_t *p = pair_get(t, a, b, delta > 0);
    if (!p)
        return delta > 0 ? IG_ENOMEM : 0;
    p->count += delta;
    if (delta > 0) {
        if (!p->nocc || p->occ[p->nocc - 1] != w) {
            if (p->nocc == p->capocc) {
                uint32_t c = p->capocc ? p->capocc * 2 : 4;
                int32_t *no = realloc(p->occ, c * sizeof *no);
                if (!no)
                    return IG_ENOMEM;
                p->occ = no;
                p->capocc = c;
            }
            p->occ[p->nocc++] = w;
        }
        if (p->epoch != t->epoch) {
            p->epoch = t->epoch;
            if (grow(&t->dirty, &t->capdirty, t->ndirty, sizeof *t->dirty, 1024))
                return IG_ENOMEM;
            t->dirty[t->ndirty++] = (int32_t)(p - t->pairs);
        }
    }
    return 0;
}

/* Queues every pair whose count grew since the last flush, once each. */
static int flush_dirty(trainer_t *t)
{
    for (size_t i = 0; i < t->ndirty; i++) {
        pair_t *p = &t->pairs[t->dirty[i]];
        if (p->count > 0 && heap_push_t(t, p->count, p->a, p->b))
            return IG_ENOMEM;
    }
    t->ndirty = 0;
    t->epoch++;
    return 0;
}

static int add_merge(trainer_t *t, int32_t a, int32_t b, int32_t *out)
{
    char buf[1024];
    size_t la = t->vocab->len[a], lb = t->vocab->len[b];
    char *s = la + lb <= sizeof buf ? buf : malloc(la + lb);
    int rc;
    if (!s)
        return IG_ENOMEM;
    memcpy(s, t->vocab->str[a], la);
    memcpy(s + la, t->vocab->str[b], lb);
    rc = st_add(t->vocab, s, la + lb, 0, out);
    if (s != buf)
        free(s);
    if (rc)
        return rc;
    if (t->nmerges == t->capmerges) {
        size_t c = t->capmerges ? t->capmerges * 2 : 4096;
        if (resize(&t->merge_a, c, sizeof *t->merge_a) ||
            resize(&t->merge_b, c, sizeof *t->merge_b))
            return IG_ENOMEM;
        t->capmerges = c;
    }
    t->merge_a[t->nmerges] = a;
    t->merge_b[t->nmerges] = b;
    t->nmerges++;
    return 0;
}

/* Applies merge (a, b) -> c to word w, updating the neighbouring pairs. */
static int merge_word(trainer_t *t, int32_t w, int32_t a, int32_t b, int32_t c)
{
    int32_t *s = t->sym + t->off[w];
    uint32_t n = t->len[w], r = 0, o = 0;
    int64_t cnt = t->wcount[w];
    int rc = 0;
    while (r < n) {
        if (r + 1 < n && s[r] == a && s[r + 1] == b) {
            if (o > 0) {
                rc |= pair_delta(t, s[o - 1], a, -cnt, w);
                rc |= pair_delta(t, s[o - 1], c, cnt, w);
            }
            if (r + 2 < n) {
                rc |= pair_delta(t, b, s[r + 2], -cnt, w);
                rc |= pair_delta(t, c, s[r + 2], cnt, w);
            }
            rc |= pair_delta(t, a, b, -cnt, w);
            s[o++] = c;
            r += 2;
        } else {
            s[o++] = s[r++];
        }
    }
    t->len[w] = o;
    return rc ? IG_ENOMEM : 0;
}

/* Learns merges until the vocabulary holds target strings or no pair is left. */
static int train(trainer_t *t, size_t target, uint32_t *merge_no)
{
    int rc;
    for (size_t w = 0; w < t->nwords; w++) {
        int32_t *s = t->sym + t->off[w];
        for (uint32_t i = 0; i + 1 < t->len[w]; i++)
            if ((rc = pair_delta(t, s[i], s[i + 1], t->wcount[w], (int32_t)w)) != 0)
                return rc;
    }
    if ((rc = flush_dirty(t)) != 0)
        return rc;
    while (t->vocab->n < target && t->nheap) {
        hent_t h = heap_pop_t(t);
        pair_t *p = pair_get(t, h.a, h.b, 0);
        int32_t c;
        uint32_t nocc;
        if (!p || p->count <= 0)
            continue;
        if (p->count != h.count) {
            /* Stale: the count dropped since it was queued. */
            if ((rc = heap_push_t(t, p->count, h.a, h.b)) != 0)
                return rc;
            continue;
        }
        if ((rc = add_merge(t, h.a, h.b, &c)) != 0)
            return rc;
        (*merge_no)++;
        /* merge_word may grow t->pairs: work on indices, not on p. */
        nocc = p->nocc;
        {
            size_t pi = (size_t)(p - t->pairs);
            for (uint32_t k = 0; k < nocc; k++) {
                int32_t w = t->pairs[pi].occ[k];
                if (t->stamp[w] == *merge_no)
                    continue;
                t->stamp[w] = *merge_no;
                if ((rc = merge_word(t, w, h.a, h.b, c)) != 0)
                    return rc;
            }
            free(t->pairs[pi].occ);
            t->pairs[pi].occ = NULL;
            t->pairs[pi].nocc = t->pairs[pi].capocc = 0;
        }
        if ((rc = flush_dirty(t)) != 0)
            return rc;
    }
    return 0;
}

/* Corpus exhausted: joins learned tokens with short ones, in a seeded order. */
static int fill_synthetic(trainer_t *t, size_t target, size_t first_learned, size_t n_short,
                          const int32_t *short_ids, uint64_t *rng)
{
    size_t tries = 0;
    if (n_short == 0)
        return IG_EINVAL;
    while (t->vocab->n < target) {
        size_t span = t->vocab->n - first_learned;
        int32_t a = span ? (int32_t)(first_learned + rng_below(rng, (uint32_t)span))
                         : short_ids[rng_below(rng, (uint32_t)n_short)];
        int32_t b = short_ids[rng_below(rng, (uint32_t)n_short)];
        int32_t c;
        char buf[1024];
        size_t la = t->vocab->len[a], lb = t->vocab->len[b];
        /* Bounded: most draws succeed, so this only guards against a bug. */
        if (++tries > target * 64)
            return IG_EINVAL;
        if (la + lb > 64)
            continue;
        memcpy(buf, t->vocab->str[a], la);
        memcpy(buf + la, t->vocab->str[b], lb);
        if (st_find(t->vocab, buf, la + lb) >= 0)
            continue;
        if (add_merge(t, a, b, &c) != 0)
            return IG_ENOMEM;
    }
    return 0;
}

static void trainer_dispose(trainer_t *t)
{
    for (size_t i = 0; i < t->npairs; i++)
        free(t->pairs[i].occ);
    free(t->pairs);
    free(t->pslot);
    free(t->heap);
    free(t->dirty);
    free(t->sym);
    free(t->off);
    free(t->len);
    free(t->wcount);
    free(t->stamp);
    free(t->merge_a);
    free(t->merge_b);
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                  */
/* ------------------------------------------------------------------------ */

static const char TPL_LLAMA3[] =
    "{{- bos_token }}\n"
    "{%- for message in messages %}\n"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n";

static const char TPL_LLAMA2[] =
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system = false %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.first and system %}{{ bos_token + '[INST] <<SYS>>\\n' + system + "
    "'\\n<</SYS>>\\n\\n' + message['content'] | trim + ' [/INST]' }}"
    "{%- else %}{{ bos_token + '[INST] ' + message['content'] | trim + ' [/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}{{ ' ' + message['content'] | trim + ' ' + "
    "eos_token }}"
    "{%- endif %}{%- endfor %}";

static const char TPL_CHATML[] =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

static json_t *added_token(int32_t id, const char *content)
{
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)id, "content",
                     content, "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                     "special", 1);
}

/* The Split patterns written into tokenizer.json, and used here to
 * pre-tokenize the corpus (through the loader's PCRE2 split). */
static const char PAT_LLAMA3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                 "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                                 "\\s+(?!\\S)|\\s+";
static const char PAT_QWEN2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                                "\\s+(?!\\S)|\\s+";

/* Counts one pre-token of the corpus (an ig__piece_cb). */
static int count_type(void *ctx, const unsigned char *p, size_t n)
{
    return st_add(ctx, (const char *)p, n, 1, NULL);
}

static json_t *split_pretok(const char *pattern)
{
    return json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type",
                     "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex", pattern,
                     "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space",
                     0, "trim_offsets", 1, "use_regex", 0);
}

/* TemplateProcessing that prepends bos, in the layout the tokenizers library reads. */
static json_t *bos_template(const char *bos, int32_t id)
{
    return json_pack("{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:[{s:{s:s, s:i}}, {s:{s:s, "
                     "s:i}}, {s:{s:s, s:i}}, {s:{s:s, s:i}}], s:{s:{s:s, s:[i], s:[s]}}}",
                     "type", "TemplateProcessing", "single", "SpecialToken", "id", bos, "type_id",
                     0, "Sequence", "id", "A", "type_id", 0, "pair", "SpecialToken", "id", bos,
                     "type_id", 0, "Sequence", "id", "A", "type_id", 0, "SpecialToken", "id", bos,
                     "type_id", 1, "Sequence", "id", "B", "type_id", 1, "special_tokens", bos, "id",
                     bos, "ids", (json_int_t)id, "tokens", bos);
}

static int write_json(json_t *j, const char *dir, const char *name, char *err, size_t errlen)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = malloc(n);
    int rc = 0;
    if (!path)
        return IG_ENOMEM;
    snprintf(path, n, "%s/%s", dir, name);
    if (json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0) {
        snprintf(err, errlen, "%s: cannot write", path);
        rc = IG_EIO;
    }
    free(path);
    return rc;
}

static int tg_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    va_list ap;
    if (err && errlen) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Entry point                                                              */
/* ------------------------------------------------------------------------ */

int ig_tokgen_write(const char *dir, int vocab_size, int style, uint64_t seed, char *err,
                    size_t errlen)
{
    /* About 4 running words and one lexicon entry per id: enough that the
     * corpus alone fills every size tested (docs/tokenizer.md). */
    size_t n = vocab_size > 0 ? (size_t)vocab_size : 0;
    return ig__tokgen_write_corpus(dir, vocab_size, style, seed, n, n * 4, err, errlen);
}

int ig__tokgen_write_corpus(const char *dir, int vocab_size, int style, uint64_t seed,
                            size_t lexicon_words, size_t running_words, char *err, size_t errlen)
{
    static const char *const SP_SPECIAL[] = {"<unk>", "<s>", "</s>"};
    static const char *const L3_SPECIAL[] = {"<|begin_of_text|>", "<|end_of_text|>",
                                             "<|start_header_id|>", "<|end_header_id|>",
                                             "<|eot_id|>"};
    static const char *const CM_SPECIAL[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    const char *const *specials;
    size_t n_special, target_strings, first_learned, n_short = 0;
    int bytelevel = style != IG_TOKGEN_SENTENCEPIECE;
    const char *split_pat = style == IG_TOKGEN_CHATML ? PAT_QWEN2 : PAT_LLAMA3;
    ig__split_step_t split = {0};
    pcre2_match_data *md = NULL;
    uint64_t rng = seed ^ 0x5DEECE66Dull;
    lexicon_t lx;
    ig_strbuf_t text = {0};
    strtab_t types, vocab;
    trainer_t tr;
    int32_t *short_ids = NULL;
    json_t *root = NULL, *cfg = NULL, *jv, *jm, *ja;
    uint32_t merge_no = 0;
    size_t total_syms = 0;
    int rc;

    memset(&lx, 0, sizeof lx);
    memset(&types, 0, sizeof types);
    memset(&vocab, 0, sizeof vocab);
    memset(&tr, 0, sizeof tr);
    if (style == IG_TOKGEN_SENTENCEPIECE) {
        specials = SP_SPECIAL;
        n_special = N_OF(SP_SPECIAL);
    } else if (style == IG_TOKGEN_BYTE_LEVEL) {
        specials = L3_SPECIAL;
        n_special = N_OF(L3_SPECIAL);
    } else if (style == IG_TOKGEN_CHATML) {
        specials = CM_SPECIAL;
        n_special = N_OF(CM_SPECIAL);
    } else {
        return tg_fail(err, errlen, IG_EINVAL, "tokgen: unknown style %d", style);
    }
    if (vocab_size < IG_TOKGEN_MIN_VOCAB || vocab_size > IG_TOKGEN_MAX_VOCAB)
        return tg_fail(err, errlen, IG_EINVAL, "tokgen: vocab_size %d is outside %d..%d",
                       vocab_size, IG_TOKGEN_MIN_VOCAB, IG_TOKGEN_MAX_VOCAB);

    if (lexicon_words == 0)
        lexicon_words = 1;
    if ((rc = lex_build(&lx, lexicon_words, &rng)) != 0 ||
        (rc = corpus_build(&text, &lx, running_words, bytelevel, &rng)) != 0 ||
        (rc = st_init(&types, (size_t)vocab_size * 2)) != 0 ||
        (rc = st_init(&vocab, (size_t)vocab_size)) != 0)
        goto fail;

    /* Pre-tokenize and count word types, as the loader will split text. */
    if (bytelevel) {
        char msg[300];
        if ((rc = ig__split_init(&split, split_pat, strlen(split_pat), 0, IG__SPLIT_ISOLATED, 0,
                                 msg, sizeof msg)) != 0 ||
            (rc = (md = pcre2_match_data_create(1, NULL)) ? 0 : IG_ENOMEM) != 0 ||
            (rc = ig__split_run(&split, md, (const unsigned char *)text.buf, text.len, count_type,
                                &types)) != 0)
            goto fail;
    } else {
        /* Sentencepiece style: "▁" replaces spaces and starts the text; words
         * start at each "▁". */
        size_t i = 0;
        while (i < text.len) {
            size_t j = i;
            char w[512];
            size_t wl;
            while (j < text.len && text.buf[j] != ' ')
                j++;
            wl = j - i;
            if (wl && wl + 3 < sizeof w) {
                memcpy(w, "\xE2\x96\x81", 3);
                memcpy(w + 3, text.buf + i, wl);
                if ((rc = st_add(&types, w, wl + 3, 1, NULL)) != 0)
                    goto fail;
            }
            i = j + 1;
        }
    }

    /* Base vocabulary. */
    tr.vocab = &vocab;
    tr.epoch = 1;
    if (bytelevel) {
        /* The 256 byte characters, in code point order like GPT-2. */
        uint32_t cps[256];
        for (int b = 0; b < 256; b++)
            cps[b] = ig__byte_to_cp((unsigned char)b);
        for (int i = 1; i < 256; i++)
            for (int k = i; k > 0 && cps[k - 1] > cps[k]; k--) {
                uint32_t x = cps[k];
                cps[k] = cps[k - 1];
                cps[k - 1] = x;
            }
        for (int i = 0; i < 256; i++) {
            char s[4];
            size_t l = ig_utf8_encode(cps[i], s);
            if ((rc = st_add(&vocab, s, l, 0, NULL)) != 0)
                goto fail;
        }
    } else {
        char name[8];
        for (size_t i = 0; i < n_special; i++)
            if ((rc = st_add(&vocab, specials[i], strlen(specials[i]), 0, NULL)) != 0)
                goto fail;
        for (int b = 0; b < 256; b++) {
            snprintf(name, sizeof name, "<0x%02X>", b);
            if ((rc = st_add(&vocab, name, 6, 0, NULL)) != 0)
                goto fail;
        }
        /* The characters of the corpus, in code point order. */
        {
            uint8_t seen_ascii[128] = {0};
            int has_meta = 0;
            for (size_t k = 0; k < types.n; k++)
                for (uint32_t i = 0; i < types.len[k]; i++) {
                    unsigned char ch = (unsigned char)types.str[k][i];
                    if (ch < 0x80)
                        seen_ascii[ch] = 1;
                    else
                        has_meta = 1; /* only "▁" is non-ASCII in this corpus */
                }
            for (int ch = 1; ch < 128; ch++) {
                char s = (char)ch;
                if (seen_ascii[ch] && (rc = st_add(&vocab, &s, 1, 0, NULL)) != 0)
                    goto fail;
            }
            if (has_meta && (rc = st_add(&vocab, "\xE2\x96\x81", 3, 0, NULL)) != 0)
                goto fail;
        }
    }
    first_learned = vocab.n;
    target_strings = (size_t)vocab_size - (bytelevel ? n_special : 0);
    if (first_learned >= target_strings) {
        rc = tg_fail(err, errlen, IG_EINVAL, "tokgen: vocab_size %d leaves no room for merges",
                     vocab_size);
        goto fail;
    }

    /* Training words: symbols are base token ids. */
    for (size_t k = 0; k < types.n; k++)
        total_syms += types.len[k];
    tr.nwords = types.n;
    tr.sym = malloc((total_syms + 1) * sizeof *tr.sym);
    tr.off = malloc(types.n * sizeof *tr.off);
    tr.len = malloc(types.n * sizeof *tr.len);
    tr.wcount = malloc(types.n * sizeof *tr.wcount);
    tr.stamp = calloc(types.n, sizeof *tr.stamp);
    tr.pmask = 4095;
    tr.pslot = slots_new(tr.pmask);
    if (!tr.sym || !tr.off || !tr.len || !tr.wcount || !tr.stamp || !tr.pslot) {
        rc = IG_ENOMEM;
        goto fail;
    }
    {
        size_t o = 0;
        for (size_t k = 0; k < types.n; k++) {
            const unsigned char *s = (const unsigned char *)types.str[k];
            uint32_t n = 0;
            tr.off[k] = (uint32_t)o;
            for (uint32_t i = 0; i < types.len[k];) {
                char buf[4];
                size_t l;
                int32_t id;
                if (bytelevel) {
                    l = ig_utf8_encode(ig__byte_to_cp(s[i]), buf);
                    id = st_find(&vocab, buf, l);
                    i++;
                } else {
                    l = (s[i] & 0x80) ? 3 : 1;
                    id = st_find(&vocab, (const char *)s + i, l);
                    i += (uint32_t)l;
                }
                tr.sym[o + n++] = id;
            }
            tr.len[k] = n;
            tr.wcount[k] = types.count[k];
            o += n;
        }
    }
    if ((rc = train(&tr, target_strings, &merge_no)) != 0)
        goto fail;
    if (vocab.n < target_strings) {
        /* Short tokens to append: the letters of the base alphabet. */
        if (!(short_ids = malloc(first_learned * sizeof *short_ids))) {
            rc = IG_ENOMEM;
            goto fail;
        }
        for (size_t i = 0; i < first_learned; i++)
            if (vocab.len[i] == 1 && vocab.str[i][0] >= 'a' && vocab.str[i][0] <= 'z')
                short_ids[n_short++] = (int32_t)i;
        if ((rc = fill_synthetic(&tr, target_strings, first_learned, n_short, short_ids, &rng)) !=
            0)
            goto fail;
    }

    /* tokenizer.json */
    jv = json_object();
    jm = json_array();
    ja = json_array();
    root = json_object();
    cfg = json_object();
    if (!jv || !jm || !ja || !root || !cfg) {
        json_decref(jv);
        json_decref(jm);
        json_decref(ja);
        rc = IG_ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < vocab.n; i++)
        json_object_set_new(jv, vocab.str[i], json_integer((json_int_t)i));
    for (size_t i = 0; i < tr.nmerges; i++) {
        const char *a = vocab.str[tr.merge_a[i]], *b = vocab.str[tr.merge_b[i]];
        if (bytelevel) {
            json_array_append_new(jm, json_pack("[s, s]", a, b));
        } else {
            ig_strbuf_t m = {0};
            ig_strbuf_puts(&m, a);
            ig_strbuf_puts(&m, " ");
            ig_strbuf_puts(&m, b);
            if (m.oom) {
                ig_strbuf_free(&m);
                rc = IG_ENOMEM;
                goto fail_json;
            }
            json_array_append_new(jm, json_string(m.buf));
            ig_strbuf_free(&m);
        }
    }
    if (bytelevel) {
        for (size_t i = 0; i < n_special; i++) {
            json_object_set_new(jv, specials[i], json_integer((json_int_t)(vocab.n + i)));
            json_array_append_new(ja, added_token((int32_t)(vocab.n + i), specials[i]));
        }
    } else {
        for (size_t i = 0; i < n_special; i++)
            json_array_append_new(ja, added_token((int32_t)i, specials[i]));
    }
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    json_object_set_new(root, "added_tokens", ja);
    if (style == IG_TOKGEN_BYTE_LEVEL) {
        json_object_set_new(root, "normalizer", json_null());
        json_object_set_new(root, "pre_tokenizer", split_pretok(PAT_LLAMA3));
        json_object_set_new(root, "post_processor", bos_template(specials[0], (int32_t)vocab.n));
        json_object_set_new(root, "decoder",
                            json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel",
                                      "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1));
    } else if (style == IG_TOKGEN_CHATML) {
        json_object_set_new(root, "normalizer", json_pack("{s:s}", "type", "NFC"));
        json_object_set_new(root, "pre_tokenizer", split_pretok(PAT_QWEN2));
        json_object_set_new(root, "post_processor",
                            json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel",
                                      "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0));
        json_object_set_new(root, "decoder",
                            json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel",
                                      "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0));
    } else {
        json_object_set_new(root, "normalizer",
                            json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}", "type",
                                      "Sequence", "normalizers", "type", "Prepend", "prepend",
                                      "\xE2\x96\x81", "type", "Replace", "pattern", "String", " ",
                                      "content", "\xE2\x96\x81"));
        json_object_set_new(root, "pre_tokenizer", json_null());
        json_object_set_new(root, "post_processor", bos_template("<s>", 1));
        json_object_set_new(
            root, "decoder",
            json_pack("{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}, {s:s, s:s, s:i, s:i}]}", "type",
                      "Sequence", "decoders", "type", "Replace", "pattern", "String",
                      "\xE2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse",
                      "type", "Strip", "content", " ", "start", 1, "stop", 0));
    }
    json_object_set_new(root, "model",
                        json_pack("{s:s, s:n, s:o, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type",
                                  "BPE", "dropout", "unk_token",
                                  bytelevel ? json_null() : json_string("<unk>"),
                                  "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
                                  !bytelevel, "byte_fallback", !bytelevel, "ignore_merges",
                                  style == IG_TOKGEN_BYTE_LEVEL, "vocab", jv, "merges", jm));
    jv = jm = NULL;

    /* tokenizer_config.json */
    json_object_set_new(cfg, "add_bos_token", json_boolean(style != IG_TOKGEN_CHATML));
    json_object_set_new(cfg, "add_eos_token", json_false());
    json_object_set_new(cfg, "bos_token",
                        style == IG_TOKGEN_CHATML
                            ? json_null()
                            : json_string(specials[style == IG_TOKGEN_SENTENCEPIECE ? 1 : 0]));
    json_object_set_new(cfg, "eos_token",
                        json_string(style == IG_TOKGEN_SENTENCEPIECE ? "</s>"
                                    : style == IG_TOKGEN_BYTE_LEVEL  ? "<|end_of_text|>"
                                                                     : "<|endoftext|>"));
    if (style == IG_TOKGEN_SENTENCEPIECE)
        json_object_set_new(cfg, "unk_token", json_string("<unk>"));
    json_object_set_new(cfg, "chat_template",
                        json_string(style == IG_TOKGEN_SENTENCEPIECE ? TPL_LLAMA2
                                    : style == IG_TOKGEN_BYTE_LEVEL  ? TPL_LLAMA3
                                                                     : TPL_CHATML));
    json_object_set_new(cfg, "clean_up_tokenization_spaces", json_false());
    json_object_set_new(cfg, "model_max_length", json_integer(131072));
    json_object_set_new(cfg, "tokenizer_class",
                        json_string(style == IG_TOKGEN_SENTENCEPIECE ? "LlamaTokenizerFast"
                                                                     : "PreTrainedTokenizerFast"));

    if ((rc = write_json(root, dir, "tokenizer.json", err, errlen)) != 0 ||
        (rc = write_json(cfg, dir, "tokenizer_config.json", err, errlen)) != 0)
        goto fail;
    goto done;

fail_json:
    json_decref(jv);
    json_decref(jm);
    json_decref(ja);
fail:
    if (rc == IG_ENOMEM && err && errlen)
        snprintf(err, errlen, "tokgen: out of memory");
done:
    json_decref(root);
    json_decref(cfg);
    free(short_ids);
    trainer_dispose(&tr);
    st_dispose(&types);
    st_dispose(&vocab);
    lex_dispose(&lx);
    ig_strbuf_free(&text);
    ig__split_dispose(&split);
    pcre2_match_data_free(md);
    return rc;
}
