#ifndef INFERGATE_HTTP_ROUTE_H
#define INFERGATE_HTTP_ROUTE_H

/*
 * One route table per server (the gateway's in gateway/serve/serve.c, the
 * worker's in gateway/worker/worker.c): rows of method + path -> handler.
 * The table is the only place that knows the routes: dispatch, the 404 and
 * 405 answers, the Allow header and the metrics route label all come from it.
 *
 * Matching: a path matches a row exactly, or by prefix when the row's path
 * ends in '*'. A GET row also answers HEAD (the server leaves the body out).
 * Rows are tried in order; the first row whose path and method match wins.
 */

#include "infergate/http.h"

#include <stddef.h>

/* Finishes req (include/infergate/http.h); data is the table owner's. */
typedef void (*ig_http_route_cb)(ig_http_req_t *req, void *data);

typedef struct {
    const char *method; /* "GET", "POST", ... (static) */
    const char *path;   /* exact, or a prefix when it ends in '*' (static); also the
                           route label of metrics, so client paths never are */
    ig_http_route_cb handler;
    unsigned flags; /* the table owner's own (serve: needs an API key) */
} ig_http_route_t;

/*
 * Finds the row for req and labels req with the row's path. Returns the row;
 * or NULL after answering req itself: 404 (not_found_error, no label: the
 * server counts it as "unmatched") for a path no row has, 405 with an Allow
 * header listing the methods the path takes (GET rows as "GET, HEAD") for a
 * known path with another method (labelled with that path).
 */
const ig_http_route_t *ig_http_route_match(const ig_http_route_t *table, size_t n,
                                           ig_http_req_t *req);

/* ig_http_route_match, then the row's handler(req, data). */
void ig_http_route_dispatch(const ig_http_route_t *table, size_t n, ig_http_req_t *req, void *data);

#endif
