#ifndef INFERGATE_SERVE_H
#define INFERGATE_SERVE_H

/*
 * The gateway of one region (`infergate serve`): config, logging, the HTTP
 * server, the route table and graceful shutdown. Later modules plug in
 * here: the gateway (include/infergate/gateway.h) fills the readiness hook
 * and answers the /v1 routes; new endpoints add rows to the route table in
 * gateway/serve/serve.c (include/infergate/http_route.h).
 *
 * Everything runs on the loop thread; none of these functions may be called
 * from another thread.
 *
 * Routes: GET /health, /ready, /metrics, /load, /status; POST
 * /v1/completions, /v1/chat/completions; GET /v1/models (the last three
 * need an API key when the config lists any).
 */

#include <stddef.h>
#include <uv.h>

#include "infergate/config.h"
#include "infergate/http.h"

typedef struct ig_serve_s ig_serve_t;

/*
 * Readiness (GET /ready, infergate_ready): returns 1 when the gateway can
 * serve traffic now; otherwise 0 with a short reason written into reason
 * ("no instance of pool 'gpu' is ready"). Called on the loop thread, also
 * while /metrics renders: it must not call ig_metric*.
 */
typedef int (*ig_serve_ready_cb)(void *data, char *reason, size_t reason_len);

/* Installs the hook (NULL removes it). Until one is installed, and at once
 * when shutdown starts, the gateway reports not ready. */
void ig_serve_set_readiness(ig_serve_t *s, ig_serve_ready_cb cb, void *data);

/* 1 when ready; otherwise 0 and the reason. */
int ig_serve_ready(ig_serve_t *s, char *reason, size_t reason_len);

/* The loaded config (owned by s) and the loop. */
const ig_config_t *ig_serve_config(const ig_serve_t *s);
uv_loop_t *ig_serve_loop(const ig_serve_t *s);

#endif
