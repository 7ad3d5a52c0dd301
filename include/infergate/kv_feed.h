#ifndef INFERGATE_KV_FEED_H
#define INFERGATE_KV_FEED_H

/*
 * A gateway's subscription to one infergate worker's GET /kv/events
 * (docs/routing.md, "The exact index"). It keeps an exact index of the
 * worker's blocks (infergate/kv_index.h) and points the worker's router
 * state at it (u->kv_exact) exactly while the stream is live: from a
 * snapshot on, through every event in sequence. A stream that ends, stalls
 * (no heartbeat within its idle deadline), skips a number or overfills the
 * index sets u->kv_exact to NULL and empties the index at once (the router
 * then falls back to the approximate index, infergate/prefix_route.h), and
 * the feed reconnects with a backoff for a fresh snapshot. A snapshot from
 * a new worker process (another epoch) also bumps u->kv_epoch, so that the
 * approximate index forgets what it believed of the old one.
 *
 * The stream's "load" events (the worker's /load report, sent when it
 * moves) go into u as ig_kv_feed_take_load() puts a polled one: a gateway
 * replica then sees the other replicas' prompts within milliseconds, not
 * at its next poll.
 *
 * Loop thread only. A handle: ig_kv_feed_close() is its pair.
 */

#include "infergate/load.h"
#include "infergate/router.h"

#include <stdint.h>
#include <uv.h>

typedef struct ig_kv_feed_s ig_kv_feed_t;

/* Subscribes to the worker at address (as ig_upstream_start takes it);
 * name labels the logs and metrics; u must outlive the feed. 0, or
 * IG_EINVAL / IG_ENOMEM (then nothing was started). */
int ig_kv_feed_start(ig_kv_feed_t **out, uv_loop_t *loop, const char *name, const char *address,
                     ig_router_upstream_t *u);

/* Stops the subscription: u->kv_exact is NULL when it returns; the memory
 * goes once the connection is closed. */
void ig_kv_feed_close(ig_kv_feed_t *f);

/* A worker's /load report l, received at now_ns, into the router's view
 * of it (u): its queue, predicted wait, prefill rate, KV blocks and slots.
 * The fields l does not have stay as they were. The wait is the worker's
 * own queue, which drains as time passes: the router takes it less the
 * report's age (u->reported_wait_drains). */
void ig_kv_feed_take_load(ig_router_upstream_t *u, const ig_load_t *l, uint64_t now_ns);

typedef struct {
    int live;               /* the exact index is in use */
    int blocks;             /* blocks it holds now */
    int capacity;           /* the worker's KV blocks (0 before the first snapshot) */
    int block_size;         /* the worker's (0 before the first snapshot) */
    uint64_t seq;           /* the last event applied */
    uint64_t snapshots;     /* snapshots received */
    uint64_t losses;        /* times the stream was lost after a snapshot */
    uint64_t loads;         /* "load" events taken */
    const char *epoch;      /* the worker process's cache id ("" before) */
    const char *last_error; /* why it was last lost ("" never) */
} ig_kv_feed_info_t;

void ig_kv_feed_info(const ig_kv_feed_t *f, ig_kv_feed_info_t *out);

#endif
