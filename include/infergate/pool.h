#ifndef INFERGATE_POOL_H
#define INFERGATE_POOL_H

/*
 * Instance pools: each pool runs `infergate worker` child processes for one
 * model, one per device entry, and supervises them. An instance takes
 * traffic only after its /ready answers 200; a crashed one is restarted with
 * exponential backoff; every child dies with the gateway, even when the
 * gateway is killed with SIGKILL (the child asks the kernel for
 * PR_SET_PDEATHSIG as its first act, see ig_process_die_with_parent).
 *
 * Each instance is an upstream of the router: it owns an upstream client
 * (over its Unix socket) and the router state fed by /load polls.
 */

#include "infergate/load.h"
#include "infergate/router.h"
#include "infergate/upstream.h"

#include <uv.h>

typedef struct ig_pool_s ig_pool_t;
typedef struct ig_instance_s ig_instance_t;

typedef enum {
    IG_INSTANCE_STOPPED = 0, /* not running (yet, or after a stop) */
    IG_INSTANCE_STARTING,    /* spawned, /ready not yet 200 */
    IG_INSTANCE_READY,       /* takes traffic */
    IG_INSTANCE_DRAINING,    /* finishing in-flight work before a stop */
    IG_INSTANCE_BACKOFF,     /* crashed; waiting to restart */
} ig_instance_state_t;

const char *ig_instance_state_name(ig_instance_state_t s);

/* What one pool runs. Strings are copied. */
typedef struct {
    const char *name;           /* pool name */
    const char *model;          /* model name clients ask for */
    const char *model_dir;      /* the model's directory */
    const char *exe;            /* the infergate binary to run as worker */
    const char *run_dir;        /* where the workers' Unix sockets go */
    const char *const *devices; /* "cpu", "cpu:N", "cuda:N", "MIG-<uuid>" */
    int ndevices;
    int threads;       /* CPU threads per cpu instance (0 = cores / instances) */
    int min_instances; /* started at once */
    int max_instances;
    /* worker batching flags, 0 = the worker's default */
    int kv_blocks;
    int block_size;
    int max_batched_tokens;
    int itl_target_ms; /* worker --itl-target-ms when > 0; < 0: 0 (off); 0 = the worker's default */
    int max_num_seqs;
    int max_waiting;
    int max_prompt_tokens;     /* worker --max-prompt-tokens; 0 = the model's context */
    const char *log_level;     /* passed to workers; NULL = info */
    const char *quantize;      /* worker --quantize (models[].quantize); NULL = none */
    const char *kv_dtype;      /* worker --kv-dtype (batching.kv_dtype); NULL = f32 */
    uint64_t ready_timeout_ms; /* a starting instance that is not ready by then is killed
                                  and restarted (default 120000) */
    uint64_t load_poll_ms;     /* GET /load period while ready (default 500) */
    uint64_t backoff_base_ms;  /* first restart delay (200), doubling to backoff_max_ms */
    uint64_t backoff_max_ms;   /* (30000) */
    const ig_router_t *router; /* whose EWMA settings the RTT samples use; borrowed */
    /* Deadlines of every request to the instances (proxied ones and the
     * /ready and /load polls), as for sites: routing.*_timeout_ms. Copied at
     * start; NULL = ig_upstream_opts_default. */
    const ig_upstream_opts_t *upstream;
    /* > 0 for a pool a config reload starts while the pool it replaces,
     * of the same name, still runs: it keeps their sockets apart. */
    unsigned generation;
    /* pools[].discover: no workers are started; the instances are the
     * A/AAAA records of discover_dns (include/infergate/discover.h), at
     * discover_port (0: the name's SRV records give the ports), up to
     * max_instances (64 when 0); devices, min_instances and threads are
     * unused. NULL: a pool of local workers. */
    const char *discover_dns;
    int discover_port;
    uint64_t discover_interval_ms;
    const char *discover_resolver; /* "IP:PORT"; NULL = the system's */
} ig_pool_spec_t;

/* Called whenever an instance changes state (for readiness and metrics),
 * and when a stopped instance's device becomes free. */
typedef void (*ig_pool_event_cb)(ig_pool_t *pool, ig_instance_t *inst, void *data);

int ig_pool_start(ig_pool_t **out, uv_loop_t *loop, const ig_pool_spec_t *spec, ig_pool_event_cb cb,
                  void *data);

/* Stops every instance (SIGTERM, then SIGKILL after grace_ms), then calls cb
 * and frees the pool. */
void ig_pool_close(ig_pool_t *pool, uint64_t grace_ms, void (*cb)(void *data), void *data);

const char *ig_pool_name(const ig_pool_t *pool);
const char *ig_pool_model(const ig_pool_t *pool);
int ig_pool_size(const ig_pool_t *pool); /* instances, any state */
ig_instance_t *ig_pool_instance(ig_pool_t *pool, int i);
int ig_pool_count(const ig_pool_t *pool, ig_instance_state_t state);
/* Instances that hold a device (starting, ready, draining or in backoff),
 * and devices free for another instance within max_instances. A device is
 * free only once its previous process has exited and been reaped. */
int ig_pool_in_use(const ig_pool_t *pool);
int ig_pool_free_devices(const ig_pool_t *pool);
/* Free devices plus draining instances that can still be taken back (not
 * yet sent SIGTERM): what a scale-up can use now. */
int ig_pool_available(const ig_pool_t *pool);
/* Instances on their way out (draining, or exited and not yet reaped):
 * each frees a device soon, with an event for its slot. */
int ig_pool_stopping(const ig_pool_t *pool);
/* Instances that serve or will: starting, ready, or in backoff. */
int ig_pool_live(const ig_pool_t *pool);
int ig_pool_min_instances(const ig_pool_t *pool);
int ig_pool_max_instances(const ig_pool_t *pool); /* clamped to the devices */

/*
 * Scale operations (the autoscaler's). Scale-up first takes back a draining
 * instance that has not been sent SIGTERM (it serves again at once), else
 * starts a worker on a free device; the new instance takes traffic only once
 * its /ready answers 200. IG_EBUSY when neither is possible.
 *
 * Drain of instance i: the router stops sending it requests at once; when
 * the gateway's requests on it have ended (or after 120 s) it gets SIGTERM
 * and drains what remains itself; SIGKILL 90 s later if still alive. A
 * starting instance is stopped the same way; one in backoff at once. The
 * device is free when the process has been reaped (an event reports it).
 * IG_ESTATE when i is not starting, ready or in backoff.
 */
int ig_pool_scale_up(ig_pool_t *pool);
int ig_pool_drain(ig_pool_t *pool, int i);

/* A discovered pool (pools[].discover): 1, and its instances' device is
 * their address. Such a pool has no free devices and never scales up: the
 * orchestrator behind its DNS name does. */
int ig_pool_discovered(const ig_pool_t *pool);
/* Stops following the DNS name (a reload retires the pool): the instances
 * it has stay until drained. */
void ig_pool_discover_stop(ig_pool_t *pool);

/* ig_pool_start for a spec with discover_dns (gateway/fleet/pool.c). */
int ig__pool_start_discovered(ig_pool_t **out, uv_loop_t *loop, const ig_pool_spec_t *spec,
                              ig_pool_event_cb cb, void *data);

/* ---- one instance -------------------------------------------------------- */

ig_instance_state_t ig_instance_state(const ig_instance_t *inst);
const char *ig_instance_name(const ig_instance_t *inst); /* "pool/N" */
const char *ig_instance_device(const ig_instance_t *inst);
int ig_instance_pid(const ig_instance_t *inst);
/* Its GET /kv/events subscription (infergate/kv_feed.h) while it is ready
 * or draining, else NULL. */
const struct ig_kv_feed_s *ig_instance_kv_feed(const ig_instance_t *in);
int ig_instance_restarts(const ig_instance_t *inst);
/* --threads given to a plain "cpu" worker (0 for other devices). */
int ig_instance_threads(const ig_instance_t *inst);
/* 1 while this slot's device is held by a process (any state but stopped). */
int ig_instance_holds_device(const ig_instance_t *inst);
ig_upstream_t *ig_instance_upstream(ig_instance_t *inst);
ig_router_upstream_t *ig_instance_route(ig_instance_t *inst);

/* The last /load report of the instance (borrowed; has = 0 before the
 * first). */
const ig_load_t *ig_instance_load(const ig_instance_t *inst);

/* ---- process helpers ----------------------------------------------------- */

/*
 * Makes this process die with SIGKILL when its parent dies. `parent` is the
 * pid the parent had; if it is already gone (we were reparented before the
 * call), returns IG_ESTATE and the caller should exit. Linux only.
 */
int ig_process_die_with_parent(int parent);

#endif
