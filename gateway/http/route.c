/*
 * The route table (include/infergate/http_route.h): method + path -> handler,
 * with 404 and 405 + Allow computed from the rows, so that the gateway and
 * the worker answer unknown paths and wrong methods the same way.
 */
#include "infergate/http_route.h"

#include <stdio.h>
#include <string.h>

static int path_matches(const char *pattern, const char *path)
{
    size_t n = strlen(pattern);
    if (n > 0 && pattern[n - 1] == '*')
        return strncmp(pattern, path, n - 1) == 0;
    return strcmp(pattern, path) == 0;
}

static int method_matches(const char *row, const char *method)
{
    return strcmp(row, method) == 0 || (strcmp(method, "HEAD") == 0 && strcmp(row, "GET") == 0);
}

/* Appends m to the comma-separated list in allow unless it is there. */
static void allow_add(char *allow, size_t cap, const char *m)
{
    size_t len = strlen(allow), mlen = strlen(m);
    for (const char *p = allow; (p = strstr(p, m)) != NULL; p += mlen)
        if ((p == allow || p[-1] == ' ') && (p[mlen] == ',' || p[mlen] == '\0'))
            return;
    snprintf(allow + len, cap - len, "%s%s", len ? ", " : "", m);
}

const ig_http_route_t *ig_http_route_match(const ig_http_route_t *table, size_t n,
                                           ig_http_req_t *req)
{
    const char *method = ig_http_req_method(req);
    const char *path = ig_http_req_path(req);
    const char *route = NULL;
    char allow[128] = "";
    for (size_t i = 0; i < n; i++) {
        if (!path_matches(table[i].path, path))
            continue;
        if (method_matches(table[i].method, method)) {
            ig_http_req_set_route(req, table[i].path);
            return &table[i];
        }
        if (route == NULL)
            route = table[i].path;
        /* The methods this path takes, once each, in table order. */
        allow_add(allow, sizeof(allow), table[i].method);
        if (strcmp(table[i].method, "GET") == 0)
            allow_add(allow, sizeof(allow), "HEAD");
    }
    if (route == NULL) {
        ig_http_respond_error(req, 404, "not_found_error", NULL, NULL, "no route for %s %s", method,
                              path);
        return NULL;
    }
    ig_http_req_set_route(req, route);
    ig_http_add_header(req, "Allow", allow);
    ig_http_respond_error(req, 405, "invalid_request_error", NULL, NULL,
                          "method %s is not allowed on %s (allowed: %s)", method, path, allow);
    return NULL;
}

void ig_http_route_dispatch(const ig_http_route_t *table, size_t n, ig_http_req_t *req, void *data)
{
    const ig_http_route_t *row = ig_http_route_match(table, n, req);
    if (row != NULL)
        row->handler(req, data);
}
