#ifndef INFERGATE_KV_INDEX_H
#define INFERGATE_KV_INDEX_H

/*
 * The exact index of one worker's prefix cache (docs/routing.md, "The
 * exact index"): the set of block hashes (infergate/prefix_hash.h) that its
 * GET /kv/events stream says it holds now, filled by the gateway's
 * subscription (infergate/kv_feed.h). Its size is fixed at creation to the
 * worker's KV blocks, so it never holds more than the worker can: a stream
 * that would overfill it is out of step, and the caller starts over from a
 * snapshot.
 *
 * Pure bookkeeping on the loop thread: no sockets, no clock.
 */

#include <stdint.h>

typedef struct ig_kv_index_s ig_kv_index_t;

/* A set of at most max_blocks hashes for a worker whose blocks hold
 * block_size tokens. 0, IG_EINVAL or IG_ENOMEM. */
int ig_kv_index_create(ig_kv_index_t **out, int max_blocks, int block_size);
void ig_kv_index_free(ig_kv_index_t *x);

/* Empties it. */
void ig_kv_index_clear(ig_kv_index_t *x);

/* Adds h: 0 (also when it was there), or IG_EFULL when max_blocks are
 * held already. */
int ig_kv_index_add(ig_kv_index_t *x, uint64_t h);

/* Removes h: 0, or IG_ENOENT when it was not there. */
int ig_kv_index_remove(ig_kv_index_t *x, uint64_t h);

/* How many leading hashes of h[0 .. n) it holds. */
int ig_kv_index_match(const ig_kv_index_t *x, const uint64_t *h, int n);

int ig_kv_index_count(const ig_kv_index_t *x);
int ig_kv_index_capacity(const ig_kv_index_t *x);
int ig_kv_index_block_size(const ig_kv_index_t *x);

#endif
