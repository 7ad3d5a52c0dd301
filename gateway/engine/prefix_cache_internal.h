/*
 * The scheduler's KV block manager with automatic prefix caching. It sits
 * between the scheduler and the engine's free list (ig_sched_engine_t):
 *
 * - every block a sequence holds has a reference count; sequences that share
 *   a prefix hold the same blocks;
 * - a full block is "committed" under its chained hash (infergate/prefix_hash.h)
 *   once its KV is written; a later sequence whose prompt starts with the
 *   same tokens finds it (lookup) and skips its prefill;
 * - a committed block that no sequence holds stays cached, in an LRU, and is
 *   evicted (its hash forgotten, its id reused) only when a block is needed
 *   and the engine's free list is empty;
 * - an uncommitted block goes back to the engine as soon as its last holder
 *   lets it go.
 *
 * Lookups compare the block's parent hash and its tokens, not the hash
 * alone. Engine thread only (the scheduler's stepping thread). Private to
 * gateway/engine/ and its tests.
 */
#ifndef IG_ENGINE_PREFIX_CACHE_INTERNAL_H
#define IG_ENGINE_PREFIX_CACHE_INTERNAL_H

#include "infergate/scheduler.h"

#include <stdint.h>

typedef struct {
    ig_sched_engine_t eng; /* the engine's free list (borrowed ctx) */
    int enabled;           /* 0: nothing is ever committed or found */
    uint64_t seed;         /* block 0's parent hash: ig_prefix_seed(model) */
    int num_blocks, block_size;
    int *ref;              /* (num_blocks) holders of each block */
    uint64_t *hash;        /* (num_blocks) valid while committed */
    uint64_t *parent;      /* (num_blocks) parent hash, while committed */
    int32_t *tokens;       /* (num_blocks, block_size) while committed */
    unsigned char *committed;
    int *lru_prev, *lru_next; /* (num_blocks) -1 ends; committed, ref 0 only */
    int lru_head, lru_tail, nlru;
    int *buckets;             /* (mask + 1) first block of each chain, -1 none */
    int *hnext;               /* (num_blocks) next block in the same chain */
    unsigned mask;
    int ncommitted;
    uint64_t evictions;
    /* KV events (ig_sched_kv_events): every commit and every uncommit, in
     * order, in a ring of ev_cap; ev_seq is the last one's number (1 is the
     * first). The ring overwrites its oldest: a reader that falls that far
     * behind resynchronises from a snapshot, so memory stays bounded. */
    ig_kv_event_t *ev; /* (ev_cap) event seq lives at ev[(seq - 1) % ev_cap] */
    int ev_cap;
    uint64_t ev_seq;
} ig__pcache_t;

/* 0 or IG_ENOMEM. eng is copied; its ctx stays borrowed. */
int ig__pcache_init(ig__pcache_t *c, const ig_sched_engine_t *eng, int enabled, uint64_t seed);

/* Gives every cached block (held by nobody) back to the engine and frees
 * the tables. Blocks still held are left to their holders. */
void ig__pcache_dispose(ig__pcache_t *c);

/* A block for the caller (reference 1, not committed): the engine's next
 * free one, else the least recently used cached one (evicted). IG_ENOKV
 * when neither exists. */
int ig__pcache_alloc(ig__pcache_t *c);

/* Drops one reference; at zero a committed block joins the LRU's recent
 * end, an uncommitted one goes back to the engine. A block nobody holds is
 * ignored. */
void ig__pcache_release(ig__pcache_t *c, int block);

/* Blocks ig__pcache_alloc() can still hand out: engine free + cached. */
int ig__pcache_available(const ig__pcache_t *c);

/* The committed block holding tokens[0 .. block_size) after a block whose
 * hash is parent, or -1; *h gets the hash either way. Takes no reference. */
int ig__pcache_lookup(const ig__pcache_t *c, uint64_t parent, const int32_t *tokens,
                      uint64_t *h);

/* The committed block whose hash is h and whose parent hash is parent, or
 * -1: a lookup by hash alone, for prompts that arrive as hashes (a
 * router's cache query). Takes no reference. */
int ig__pcache_find_hash(const ig__pcache_t *c, uint64_t parent, uint64_t h);

/* Takes one more reference to block (taking it out of the LRU if it was
 * held by nobody). */
void ig__pcache_acquire(ig__pcache_t *c, int block);

/* The caller's full block now holds tokens[0 .. block_size) after parent.
 * Commits it under its hash, unless the cache is off or another block
 * already holds the same content (then this one stays private and goes
 * back to the engine when released). Returns the block's hash. */
uint64_t ig__pcache_commit(ig__pcache_t *c, int block, uint64_t parent, const int32_t *tokens);

/* Events with seq > after, at most cap, into out (in order): how many, or
 * IG_ERANGE when some after `after` were overwritten already. */
int ig__pcache_events(const ig__pcache_t *c, uint64_t after, ig_kv_event_t *out, int cap);

/* The committed blocks' hashes and parents (at most cap; num_blocks is
 * always enough): how many. *seq gets the last event's number: the
 * snapshot is the state after it. */
int ig__pcache_snapshot(const ig__pcache_t *c, uint64_t *hashes, uint64_t *parents, int cap,
                        uint64_t *seq);

/* 1 when block is held by nobody (cached in the LRU). */
int ig__pcache_idle(const ig__pcache_t *c, int block);

#endif
