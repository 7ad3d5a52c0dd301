/*
 * The approximate prefix index (include/infergate/prefix_route.h). Entries
 * (upstream, block hash) live in one array with a chained hash table and
 * two intrusive lists each: the global LRU (for max_entries) and the
 * upstream's own LRU (for its cap). Upstreams are a small array: a gateway
 * has tens of them, not thousands.
 */
#include "infergate/prefix_route.h"

#include "infergate/bits.h"
#include "infergate/error.h"
#include "infergate/kv_index.h"

#include <stdlib.h>
#include <string.h>

#define MAX_UPSTREAMS 256

typedef struct {
    const void *up;
    int head, tail; /* its entries, least recent first */
    int n;
    unsigned epoch; /* its kv_epoch when last seen (the router's hook) */
} upstream_t;

typedef struct {
    uint64_t hash;
    int up; /* index into ups; -1 when the entry is free */
    int hnext;
    int gprev, gnext; /* global LRU */
    int uprev, unext; /* its upstream's LRU */
} entry_t;

typedef struct {
    uint64_t id;
    const void *up;
    int tokens;
    uint64_t stamp;
} session_t;

struct ig_prefix_index_s {
    entry_t *e;
    int cap, nused;
    int free_head; /* free entries, through gnext */
    int ghead, gtail;
    int *buckets;
    unsigned mask;
    upstream_t ups[MAX_UPSTREAMS];
    int nups;
    session_t *sess;
    int max_sessions, nsess;
    uint64_t clock;
};

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static unsigned bucket_of(const ig_prefix_index_t *x, int up, uint64_t h)
{
    return (unsigned)(mix64(h ^ ((uint64_t)up * 0x9e3779b97f4a7c15ULL)) & x->mask);
}

int ig_prefix_index_create(ig_prefix_index_t **out, int max_entries, int max_sessions)
{
    if (max_entries <= 0 || max_sessions < 0)
        return IG_EINVAL;
    ig_prefix_index_t *x = calloc(1, sizeof(*x));
    if (!x)
        return IG_ENOMEM;
    unsigned nb = ig_pow2_at_least((unsigned)max_entries, 16);
    x->mask = nb - 1;
    x->cap = max_entries;
    x->e = malloc(sizeof(entry_t) * (size_t)max_entries);
    x->buckets = malloc(sizeof(int) * nb);
    x->sess = calloc((size_t)(max_sessions ? max_sessions : 1), sizeof(session_t));
    if (!x->e || !x->buckets || !x->sess) {
        ig_prefix_index_free(x);
        return IG_ENOMEM;
    }
    x->max_sessions = max_sessions;
    for (unsigned i = 0; i < nb; i++)
        x->buckets[i] = -1;
    for (int i = 0; i < max_entries; i++) {
        x->e[i].up = -1;
        x->e[i].gnext = i + 1 < max_entries ? i + 1 : -1;
    }
    x->free_head = 0;
    x->ghead = x->gtail = -1;
    *out = x;
    return 0;
}

void ig_prefix_index_free(ig_prefix_index_t *x)
{
    if (!x)
        return;
    free(x->e);
    free(x->buckets);
    free(x->sess);
    free(x);
}

static int up_find(const ig_prefix_index_t *x, const void *up)
{
    for (int i = 0; i < x->nups; i++)
        if (x->ups[i].up == up)
            return i;
    return -1;
}

static int up_get(ig_prefix_index_t *x, const void *up)
{
    int i = up_find(x, up);
    if (i >= 0 || x->nups == MAX_UPSTREAMS)
        return i;
    x->ups[x->nups] = (upstream_t){.up = up, .head = -1, .tail = -1, .n = 0};
    return x->nups++;
}

static int find(const ig_prefix_index_t *x, int up, uint64_t h)
{
    for (int i = x->buckets[bucket_of(x, up, h)]; i >= 0; i = x->e[i].hnext)
        if (x->e[i].up == up && x->e[i].hash == h)
            return i;
    return -1;
}

/* Unlinks entry i from both LRUs (the hash chain is the caller's). */
static void lru_unlink(ig_prefix_index_t *x, int i)
{
    entry_t *e = &x->e[i];
    upstream_t *u = &x->ups[e->up];
    if (e->gprev >= 0)
        x->e[e->gprev].gnext = e->gnext;
    else
        x->ghead = e->gnext;
    if (e->gnext >= 0)
        x->e[e->gnext].gprev = e->gprev;
    else
        x->gtail = e->gprev;
    if (e->uprev >= 0)
        x->e[e->uprev].unext = e->unext;
    else
        u->head = e->unext;
    if (e->unext >= 0)
        x->e[e->unext].uprev = e->uprev;
    else
        u->tail = e->uprev;
    u->n--;
}

static void lru_push(ig_prefix_index_t *x, int i)
{
    entry_t *e = &x->e[i];
    upstream_t *u = &x->ups[e->up];
    e->gprev = x->gtail;
    e->gnext = -1;
    if (x->gtail >= 0)
        x->e[x->gtail].gnext = i;
    else
        x->ghead = i;
    x->gtail = i;
    e->uprev = u->tail;
    e->unext = -1;
    if (u->tail >= 0)
        x->e[u->tail].unext = i;
    else
        u->head = i;
    u->tail = i;
    u->n++;
}

static void drop(ig_prefix_index_t *x, int i)
{
    entry_t *e = &x->e[i];
    lru_unlink(x, i);
    int *at = &x->buckets[bucket_of(x, e->up, e->hash)];
    while (*at != i)
        at = &x->e[*at].hnext;
    *at = e->hnext;
    e->up = -1;
    e->gnext = x->free_head;
    x->free_head = i;
    x->nused--;
}

int ig_prefix_index_match(const ig_prefix_index_t *x, const void *upstream, const uint64_t *h,
                          int n)
{
    int up = up_find(x, upstream), k = 0;
    if (up < 0)
        return 0;
    while (k < n && find(x, up, h[k]) >= 0)
        k++;
    return k;
}

void ig_prefix_index_record(ig_prefix_index_t *x, const void *upstream, const uint64_t *h, int n,
                            int cap_blocks)
{
    int up = up_get(x, upstream);
    if (up < 0)
        return;
    /* Last block first, so that the head of the prompt ends most recent:
     * an upstream evicts a prompt's tail before its head. */
    for (int k = n - 1; k >= 0; k--) {
        int i = find(x, up, h[k]);
        if (i >= 0) {
            lru_unlink(x, i);
            lru_push(x, i);
            continue;
        }
        if (x->free_head < 0)
            drop(x, x->ghead);
        i = x->free_head;
        x->free_head = x->e[i].gnext;
        x->e[i].up = up;
        x->e[i].hash = h[k];
        unsigned b = bucket_of(x, up, h[k]);
        x->e[i].hnext = x->buckets[b];
        x->buckets[b] = i;
        lru_push(x, i);
        x->nused++;
    }
    while (cap_blocks > 0 && x->ups[up].n > cap_blocks)
        drop(x, x->ups[up].head);
}

void ig_prefix_index_forget(ig_prefix_index_t *x, const void *upstream)
{
    int up = up_find(x, upstream);
    if (up < 0)
        return;
    while (x->ups[up].head >= 0)
        drop(x, x->ups[up].head);
    for (int i = 0; i < x->nsess; i++)
        if (x->sess[i].up == upstream)
            x->sess[i].up = NULL;
}

int ig_prefix_index_blocks(const ig_prefix_index_t *x, const void *upstream)
{
    int up = up_find(x, upstream);
    return up < 0 ? 0 : x->ups[up].n;
}

const void *ig_prefix_index_session(const ig_prefix_index_t *x, uint64_t session, int *tokens)
{
    for (int i = 0; i < x->nsess; i++)
        if (x->sess[i].id == session && x->sess[i].up) {
            *tokens = x->sess[i].tokens;
            return x->sess[i].up;
        }
    *tokens = 0;
    return NULL;
}

void ig_prefix_index_session_record(ig_prefix_index_t *x, uint64_t session, const void *upstream,
                                    int tokens)
{
    if (x->max_sessions == 0)
        return;
    int at = -1, oldest = 0;
    for (int i = 0; i < x->nsess && at < 0; i++)
        if (x->sess[i].id == session)
            at = i;
    if (at < 0 && x->nsess < x->max_sessions)
        at = x->nsess++;
    if (at < 0) { /* full: the least recently seen goes */
        for (int i = 1; i < x->nsess; i++)
            if (x->sess[i].stamp < x->sess[oldest].stamp)
                oldest = i;
        at = oldest;
    }
    x->sess[at] = (session_t){.id = session, .up = upstream, .tokens = tokens, .stamp = ++x->clock};
}

/* ---- the router's hook ---------------------------------------------------- */

/* Whether the index keeps what is sent to u: local instances, and sites
 * that are infergate peers (they route by prefix in their region). */
static int holds(const ig_router_upstream_t *u)
{
    return u->kind == IG_ROUTER_LOCAL || u->prefix_peer;
}

/* Forgets u if it restarted since the index last saw it. */
static void sync_epoch(ig_prefix_index_t *x, const ig_router_upstream_t *u)
{
    int i = up_find(x, u);
    if (i < 0 || x->ups[i].epoch == u->kv_epoch)
        return;
    ig_prefix_index_forget(x, u);
    x->ups[i].epoch = u->kv_epoch;
}

void ig_prefix_route_score(ig_prefix_index_t *x, ig_router_upstream_t *const *ups, int n,
                           const ig_prefix_query_t *q)
{
    int stok = 0;
    for (int i = 0; x && i < n; i++)
        if (holds(ups[i]))
            sync_epoch(x, ups[i]);
    const void *sup = x && q->has_session ? ig_prefix_index_session(x, q->session, &stok) : NULL;
    for (int i = 0; i < n; i++) {
        ig_router_upstream_t *u = ups[i];
        u->cached_tokens = 0;
        if (u->kv_exact != NULL) {
            /* The worker's own word: no guess, and no session affinity
             * (what it served last may be evicted already). */
            int m = q->hashes && q->block_size == ig_kv_index_block_size(u->kv_exact)
                        ? ig_kv_index_match(u->kv_exact, q->hashes, q->nhashes) * q->block_size
                        : 0;
            if (m > q->prompt_tokens - 1)
                m = q->prompt_tokens > 1 ? q->prompt_tokens - 1 : 0;
            u->cached_tokens = m;
            continue;
        }
        if (!x || !holds(u))
            continue;
        int m = q->hashes ? ig_prefix_index_match(x, u, q->hashes, q->nhashes) * q->block_size : 0;
        if (sup == u && stok > m)
            m = stok;
        if (m > q->prompt_tokens - 1)
            m = q->prompt_tokens > 1 ? q->prompt_tokens - 1 : 0;
        u->cached_tokens = m;
    }
}

void ig_prefix_route_record(ig_prefix_index_t *x, ig_router_upstream_t *u,
                            const ig_prefix_query_t *q)
{
    if (!x || !holds(u))
        return;
    sync_epoch(x, u);
    int i = up_get(x, u);
    if (i >= 0)
        x->ups[i].epoch = u->kv_epoch;
    if (q->hashes && q->nhashes > 0)
        ig_prefix_index_record(x, u, q->hashes, q->nhashes, u->kv_blocks);
    if (q->has_session)
        ig_prefix_index_session_record(x, q->session, u, q->prompt_tokens);
}
