#ifndef INFERGATE_PREFIX_HASH_H
#define INFERGATE_PREFIX_HASH_H

/*
 * Prefix-cache block hashes, written once for the engine (which caches KV
 * blocks under them) and the gateway (which asks instances how many of a
 * prompt's blocks they hold); base, so that both include it without
 * including each other. A prompt's tokens are cut into full blocks of
 * block_size tokens; block i's hash is chained over block i-1's hash (the
 * model's seed for block 0) and block i's tokens, so two prompts share the
 * hash of block i exactly when they share tokens 0 .. (i+1) * block_size - 1
 * (up to 64-bit collisions; the engine also compares the tokens). A partial
 * last block has no hash.
 *
 * The functions are pure: no allocation, no state, safe from any thread.
 */

#include <stddef.h>
#include <stdint.h>

/* The chain's start for a model: a hash of its id (the name clients send in
 * "model"), so equal token runs of different models never share a block.
 * NULL or "" gives a fixed seed. */
uint64_t ig_prefix_seed(const char *model_id);

/* The hash of one block of n tokens whose parent block hashed to parent. */
uint64_t ig_prefix_block_hash(uint64_t parent, const int32_t *tokens, int n);

/* Writes the hashes of the full blocks of tokens[0 .. ntok) into out, at
 * most cap of them, and returns how many it wrote (ntok / block_size capped
 * at cap), or 0 when block_size <= 0 or ntok <= 0. */
int ig_prefix_hashes(uint64_t seed, const int32_t *tokens, int ntok, int block_size,
                     uint64_t *out, int cap);

/* The hash as 16 lower-case hex digits and a NUL (17 bytes): how hashes
 * travel in JSON, whose numbers cannot hold 64 bits. */
void ig_prefix_hash_hex(uint64_t h, char out[17]);

/* Parses 16 hex digits (either case) into *h: 0, or IG_EINVAL. */
int ig_prefix_hash_parse(const char *s, size_t len, uint64_t *h);

#endif
