/*
 * KV blocks with automatic prefix caching (prefix_cache_internal.h):
 * reference counts, a chained hash table of committed blocks (chains
 * threaded through hnext, so it never allocates after init) and an LRU of
 * the committed blocks nobody holds (threaded through lru_prev/lru_next).
 */
#include "prefix_cache_internal.h"

#include "infergate/error.h"
#include "infergate/prefix_hash.h"

#include <stdlib.h>
#include <string.h>

int ig__pcache_init(ig__pcache_t *c, const ig_sched_engine_t *eng, int enabled, uint64_t seed)
{
    memset(c, 0, sizeof(*c));
    c->eng = *eng;
    c->enabled = enabled;
    c->seed = seed;
    c->num_blocks = eng->num_blocks;
    c->block_size = eng->block_size;
    unsigned nb = 16;
    while (nb < (unsigned)eng->num_blocks && nb < (1u << 30))
        nb <<= 1;
    c->mask = nb - 1;
    size_t n = (size_t)eng->num_blocks;
    c->ref = calloc(n, sizeof(int));
    c->hash = calloc(n, sizeof(uint64_t));
    c->parent = calloc(n, sizeof(uint64_t));
    c->tokens = calloc(n * (size_t)eng->block_size, sizeof(int32_t));
    c->committed = calloc(n, 1);
    c->lru_prev = malloc(n * sizeof(int));
    c->lru_next = malloc(n * sizeof(int));
    c->hnext = malloc(n * sizeof(int));
    c->buckets = malloc((size_t)nb * sizeof(int));
    if (!c->ref || !c->hash || !c->parent || !c->tokens || !c->committed || !c->lru_prev ||
        !c->lru_next || !c->hnext || !c->buckets) {
        ig__pcache_dispose(c);
        return IG_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        c->lru_prev[i] = c->lru_next[i] = c->hnext[i] = -1;
    for (unsigned i = 0; i < nb; i++)
        c->buckets[i] = -1;
    c->lru_head = c->lru_tail = -1;
    /* Four events per block (stored, removed, twice over) before a reader
     * that has not read must resynchronise; 64k at most (1.5 MiB). */
    c->ev_cap = eng->num_blocks < 16384 ? 4 * eng->num_blocks + 64 : 65536;
    if ((c->ev = malloc(sizeof(ig_kv_event_t) * (size_t)c->ev_cap)) == NULL) {
        ig__pcache_dispose(c);
        return IG_ENOMEM;
    }
    return 0;
}

static void event(ig__pcache_t *c, ig_kv_event_kind_t kind, int b)
{
    if (c->ev == NULL)
        return; /* disposing after a failed init */
    uint64_t seq = ++c->ev_seq;
    c->ev[(seq - 1) % (uint64_t)c->ev_cap] =
        (ig_kv_event_t){.seq = seq, .kind = kind, .hash = c->hash[b], .parent = c->parent[b]};
}

int ig__pcache_events(const ig__pcache_t *c, uint64_t after, ig_kv_event_t *out, int cap)
{
    if (after > c->ev_seq)
        return IG_ERANGE; /* a reader from another life of this cache */
    if (c->ev_seq - after > (uint64_t)c->ev_cap)
        return IG_ERANGE;
    int n = 0;
    for (uint64_t s = after + 1; s <= c->ev_seq && n < cap; s++)
        out[n++] = c->ev[(s - 1) % (uint64_t)c->ev_cap];
    return n;
}

int ig__pcache_snapshot(const ig__pcache_t *c, uint64_t *hashes, uint64_t *parents, int cap,
                        uint64_t *seq)
{
    int n = 0;
    for (int b = 0; b < c->num_blocks && n < cap; b++) {
        if (!c->committed[b])
            continue;
        hashes[n] = c->hash[b];
        parents[n++] = c->parent[b];
    }
    *seq = c->ev_seq;
    return n;
}

static void lru_unlink(ig__pcache_t *c, int b)
{
    int p = c->lru_prev[b], n = c->lru_next[b];
    if (p >= 0)
        c->lru_next[p] = n;
    else
        c->lru_head = n;
    if (n >= 0)
        c->lru_prev[n] = p;
    else
        c->lru_tail = p;
    c->lru_prev[b] = c->lru_next[b] = -1;
    c->nlru--;
}

static void lru_push_tail(ig__pcache_t *c, int b)
{
    c->lru_prev[b] = c->lru_tail;
    c->lru_next[b] = -1;
    if (c->lru_tail >= 0)
        c->lru_next[c->lru_tail] = b;
    else
        c->lru_head = b;
    c->lru_tail = b;
    c->nlru++;
}

/* Takes b out of the hash table. */
static void uncommit(ig__pcache_t *c, int b)
{
    int *at = &c->buckets[c->hash[b] & c->mask];
    while (*at >= 0 && *at != b)
        at = &c->hnext[*at];
    if (*at == b)
        *at = c->hnext[b];
    c->hnext[b] = -1;
    c->committed[b] = 0;
    c->ncommitted--;
    event(c, IG_KV_REMOVED, b);
}

void ig__pcache_dispose(ig__pcache_t *c)
{
    if (c->lru_next && c->ref) {
        while (c->lru_head >= 0) {
            int b = c->lru_head;
            lru_unlink(c, b);
            uncommit(c, b);
            c->eng.block_release(c->eng.ctx, b);
        }
    }
    free(c->ref);
    free(c->hash);
    free(c->parent);
    free(c->tokens);
    free(c->committed);
    free(c->lru_prev);
    free(c->lru_next);
    free(c->hnext);
    free(c->buckets);
    free(c->ev);
    memset(c, 0, sizeof(*c));
}

int ig__pcache_alloc(ig__pcache_t *c)
{
    int b = c->eng.block_alloc(c->eng.ctx);
    if (b < 0) {
        if (c->lru_head < 0)
            return IG_ENOKV;
        b = c->lru_head; /* the least recently used */
        lru_unlink(c, b);
        uncommit(c, b);
        c->evictions++;
    } else if (b >= c->num_blocks) {
        return IG_ESTATE;
    }
    c->ref[b] = 1;
    return b;
}

void ig__pcache_release(ig__pcache_t *c, int b)
{
    if (b < 0 || b >= c->num_blocks || c->ref[b] <= 0)
        return;
    if (--c->ref[b] > 0)
        return;
    if (c->committed[b])
        lru_push_tail(c, b);
    else
        c->eng.block_release(c->eng.ctx, b);
}

int ig__pcache_available(const ig__pcache_t *c)
{
    return c->eng.blocks_free(c->eng.ctx) + c->nlru;
}

int ig__pcache_lookup(const ig__pcache_t *c, uint64_t parent, const int32_t *tokens, uint64_t *h)
{
    uint64_t hh = ig_prefix_block_hash(parent, tokens, c->block_size);
    *h = hh;
    if (!c->enabled)
        return -1;
    size_t bytes = sizeof(int32_t) * (size_t)c->block_size;
    for (int b = c->buckets[hh & c->mask]; b >= 0; b = c->hnext[b])
        if (c->hash[b] == hh && c->parent[b] == parent &&
            memcmp(c->tokens + (size_t)b * c->block_size, tokens, bytes) == 0)
            return b;
    return -1;
}

int ig__pcache_find_hash(const ig__pcache_t *c, uint64_t parent, uint64_t h)
{
    if (!c->enabled)
        return -1;
    for (int b = c->buckets[h & c->mask]; b >= 0; b = c->hnext[b])
        if (c->hash[b] == h && c->parent[b] == parent)
            return b;
    return -1;
}

void ig__pcache_acquire(ig__pcache_t *c, int b)
{
    if (c->ref[b] == 0)
        lru_unlink(c, b);
    c->ref[b]++;
}

uint64_t ig__pcache_commit(ig__pcache_t *c, int b, uint64_t parent, const int32_t *tokens)
{
    uint64_t h;
    if (c->committed[b])
        return c->hash[b]; /* found in the cache, or committed before */
    if (ig__pcache_lookup(c, parent, tokens, &h) >= 0 || !c->enabled)
        return h; /* a twin computed at the same time is cached already */
    c->hash[b] = h;
    c->parent[b] = parent;
    memcpy(c->tokens + (size_t)b * c->block_size, tokens, sizeof(int32_t) * (size_t)c->block_size);
    int *head = &c->buckets[h & c->mask];
    c->hnext[b] = *head;
    *head = b;
    c->committed[b] = 1;
    c->ncommitted++;
    event(c, IG_KV_STORED, b);
    return h;
}

int ig__pcache_idle(const ig__pcache_t *c, int b)
{
    return b >= 0 && b < c->num_blocks && c->ref[b] == 0 && c->committed[b];
}
