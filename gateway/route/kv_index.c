/*
 * One worker's blocks as a hash set (include/infergate/kv_index.h):
 * entries in one array sized once, chained through next, free ones on a
 * list of their own; it never allocates after creation.
 */
#include "infergate/kv_index.h"

#include "infergate/bits.h"
#include "infergate/error.h"

#include <stdlib.h>

struct ig_kv_index_s {
    uint64_t *hash; /* (cap) */
    int *next;      /* (cap) chain of a bucket, or of the free list */
    int *buckets;   /* (mask + 1) first entry, -1 none */
    unsigned mask;
    int cap, n, free_head, block_size;
};

static unsigned bucket_of(const ig_kv_index_t *x, uint64_t h)
{
    /* The hashes are mixed already (splitmix64's finaliser). */
    return (unsigned)(h ^ (h >> 32)) & x->mask;
}

int ig_kv_index_create(ig_kv_index_t **out, int max_blocks, int block_size)
{
    if (max_blocks <= 0 || block_size <= 0)
        return IG_EINVAL;
    ig_kv_index_t *x = calloc(1, sizeof(*x));
    if (x == NULL)
        return IG_ENOMEM;
    unsigned nb = ig_pow2_at_least((unsigned)max_blocks, 16);
    x->mask = nb - 1;
    x->cap = max_blocks;
    x->block_size = block_size;
    x->hash = malloc(sizeof(uint64_t) * (size_t)max_blocks);
    x->next = malloc(sizeof(int) * (size_t)max_blocks);
    x->buckets = malloc(sizeof(int) * nb);
    if (x->hash == NULL || x->next == NULL || x->buckets == NULL) {
        ig_kv_index_free(x);
        return IG_ENOMEM;
    }
    ig_kv_index_clear(x);
    *out = x;
    return 0;
}

void ig_kv_index_free(ig_kv_index_t *x)
{
    if (x == NULL)
        return;
    free(x->hash);
    free(x->next);
    free(x->buckets);
    free(x);
}

void ig_kv_index_clear(ig_kv_index_t *x)
{
    for (unsigned i = 0; i <= x->mask; i++)
        x->buckets[i] = -1;
    for (int i = 0; i < x->cap; i++)
        x->next[i] = i + 1 < x->cap ? i + 1 : -1;
    x->free_head = 0;
    x->n = 0;
}

static int find(const ig_kv_index_t *x, uint64_t h)
{
    for (int i = x->buckets[bucket_of(x, h)]; i >= 0; i = x->next[i])
        if (x->hash[i] == h)
            return i;
    return -1;
}

int ig_kv_index_add(ig_kv_index_t *x, uint64_t h)
{
    if (find(x, h) >= 0)
        return 0;
    if (x->free_head < 0)
        return IG_EFULL;
    int i = x->free_head;
    x->free_head = x->next[i];
    unsigned b = bucket_of(x, h);
    x->hash[i] = h;
    x->next[i] = x->buckets[b];
    x->buckets[b] = i;
    x->n++;
    return 0;
}

int ig_kv_index_remove(ig_kv_index_t *x, uint64_t h)
{
    int *at = &x->buckets[bucket_of(x, h)];
    while (*at >= 0 && x->hash[*at] != h)
        at = &x->next[*at];
    if (*at < 0)
        return IG_ENOENT;
    int i = *at;
    *at = x->next[i];
    x->next[i] = x->free_head;
    x->free_head = i;
    x->n--;
    return 0;
}

int ig_kv_index_match(const ig_kv_index_t *x, const uint64_t *h, int n)
{
    int k = 0;
    while (k < n && find(x, h[k]) >= 0)
        k++;
    return k;
}

int ig_kv_index_count(const ig_kv_index_t *x)
{
    return x->n;
}

int ig_kv_index_capacity(const ig_kv_index_t *x)
{
    return x->cap;
}

int ig_kv_index_block_size(const ig_kv_index_t *x)
{
    return x->block_size;
}
