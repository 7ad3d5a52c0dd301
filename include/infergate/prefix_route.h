#ifndef INFERGATE_PREFIX_ROUTE_H
#define INFERGATE_PREFIX_ROUTE_H

/*
 * The gateway's approximate index of which upstream holds which prompt
 * blocks (docs/routing.md, "Prefix-aware routing"): where earlier prompts
 * went, as llm-d's and SGLang's routers keep it. Each local upstream that a
 * prompt is sent to is believed to hold that prompt's full blocks (their
 * hashes, infergate/prefix_hash.h); an upstream's entries are bounded by its KV
 * cache (the least recently sent go first, as its own LRU would evict
 * them). A session id (x-session-id) remembers the upstream that served its
 * last turn and that turn's prompt length.
 *
 * Pure bookkeeping on the loop thread: no sockets, no clock. Upstreams are
 * named by an opaque pointer (the router state the caller keeps), which
 * must stay valid while the index knows it.
 */

#include "infergate/router.h"

#include <stdint.h>

typedef struct ig_prefix_index_s ig_prefix_index_t;

/* An index of at most max_entries block entries (all upstreams together)
 * and max_sessions sessions. 0 or IG_ENOMEM / IG_EINVAL. */
int ig_prefix_index_create(ig_prefix_index_t **out, int max_entries, int max_sessions);
void ig_prefix_index_free(ig_prefix_index_t *idx);

/* How many leading blocks of hashes[0 .. n) upstream is believed to hold. */
int ig_prefix_index_match(const ig_prefix_index_t *idx, const void *upstream,
                          const uint64_t *hashes, int n);

/* upstream was sent a prompt of these block hashes: it now holds them (the
 * most recent), and at most cap_blocks of its entries are kept (0: no cap
 * of its own). */
void ig_prefix_index_record(ig_prefix_index_t *idx, const void *upstream, const uint64_t *hashes,
                            int n, int cap_blocks);

/* Forgets everything of upstream (it restarted: its cache is empty). */
void ig_prefix_index_forget(ig_prefix_index_t *idx, const void *upstream);

/* Blocks believed held by upstream. */
int ig_prefix_index_blocks(const ig_prefix_index_t *idx, const void *upstream);

/* The upstream that served session `session` last and that turn's prompt
 * tokens, or NULL. */
const void *ig_prefix_index_session(const ig_prefix_index_t *idx, uint64_t session, int *tokens);
void ig_prefix_index_session_record(ig_prefix_index_t *idx, uint64_t session,
                                    const void *upstream, int tokens);

/* ---- the router's hook ----------------------------------------------------
 * What the proxy knows of the request being routed. */
typedef struct {
    const uint64_t *hashes; /* its prompt's full blocks (NULL: no tokenizer) */
    int nhashes;
    int block_size;
    int has_session; /* an x-session-id header came: session is its hash */
    uint64_t session;
    int prompt_tokens;
} ig_prefix_query_t;

/* Sets cached_tokens of each of ups[0 .. n) for q: the blocks the index
 * believes it holds, or, for the upstream that served q's session last, at
 * least that turn's prompt (soft affinity); never the whole prompt (its
 * last token is always computed), and 0 for plain sites (one that is not
 * an infergate peer holds nothing as far as we know; a peer's region routes
 * by prefix too, so what was sent there counts, and its RTT and wait
 * weigh against it in the cost). An upstream whose KV events are live
 * (u->kv_exact, infergate/kv_feed.h) is scored on its exact index alone:
 * the leading blocks it holds now (none when its block size is not q's).
 * ig_router_pick then counts only the rest as
 * prefill. An upstream whose kv_epoch changed since the index last saw it
 * restarted: what the index knew of it is forgotten first. */
void ig_prefix_route_score(ig_prefix_index_t *idx, ig_router_upstream_t *const *ups, int n,
                           const ig_prefix_query_t *q);

/* q was sent to u: u now holds q's blocks (local upstreams and infergate
 * peers only), and serves q's session. */
void ig_prefix_route_record(ig_prefix_index_t *idx, ig_router_upstream_t *u,
                            const ig_prefix_query_t *q);

#endif
