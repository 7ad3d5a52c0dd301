#ifndef IG_TEST_LLAMACPP_H
#define IG_TEST_LLAMACPP_H

/*
 * llama.cpp's llama-server as a peer of the tests, built outside the tree:
 * $LLAMACPP_BIN, default /work/peers/llama.cpp/build/bin; the tests that
 * need it return 77 (skipped) without it. Header-only; include cmocka.h
 * first (the helpers assert).
 */

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testclient.h"

/* The path of llama.cpp's tool (llama-server, llama-quantize, ...) in buf,
 * or NULL when it is not there. */
static inline const char *ig_llamacpp_tool(const char *tool, char *buf, size_t len)
{
    const char *d = getenv("LLAMACPP_BIN");
    snprintf(buf, len, "%s/%s", d && *d ? d : "/work/peers/llama.cpp/build/bin", tool);
    return access(buf, X_OK) == 0 ? buf : NULL;
}

/* llama-server's path (a static buffer), or NULL when it is not there. */
static inline const char *ig_llamacpp_server(void)
{
    static char bin[1024];
    return ig_llamacpp_tool("llama-server", bin, sizeof(bin));
}

/* POSTs the JSON body to 127.0.0.1:port path: the parsed 200 answer (new),
 * or NULL, with the status and body printed. */
static inline json_t *ig_llamacpp_post(int port, const char *path, const char *body)
{
    char *raw = malloc(strlen(body) + 512);
    sprintf(raw,
            "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
            path, strlen(body), body);
    ig_tc_response_t r;
    int rc = ig_tc_request(port, raw, &r, 60000);
    free(raw);
    if (rc != 0)
        return NULL;
    json_t *j = r.status == 200 ? json_loadb(r.body, r.body_len, 0, NULL) : NULL;
    if (j == NULL)
        print_message("# %d %s: status %d: %.300s\n", port, path, r.status, r.body ? r.body : "");
    ig_tc_response_free(&r);
    return j;
}

/* The greedy text of n tokens for the token-id prompt ids (a JSON array)
 * from llama-server at lport (/completion, top_k 1, no prompt cache, and
 * the members in lextra, "" or starting with a comma) and from our worker
 * at wport (/v1/completions), in *lt and *wt (the caller frees them). */
static inline void ig_llamacpp_greedy(int lport, int wport, const char *ids, int n,
                                      const char *lextra, char **lt, char **wt)
{
    char body[1024];
    snprintf(body, sizeof(body),
             "{\"prompt\": %s, \"n_predict\": %d, \"temperature\": 0, \"top_k\": 1, "
             "\"cache_prompt\": false%s}",
             ids, n, lextra);
    json_t *lj = ig_llamacpp_post(lport, "/completion", body);
    snprintf(body, sizeof(body), "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0}", ids,
             n);
    json_t *wj = ig_llamacpp_post(wport, "/v1/completions", body);
    assert_non_null(lj);
    assert_non_null(wj);
    const char *l = json_string_value(json_object_get(lj, "content"));
    const char *w = json_string_value(
        json_object_get(json_array_get(json_object_get(wj, "choices"), 0), "text"));
    assert_non_null(l);
    assert_non_null(w);
    *lt = strdup(l);
    *wt = strdup(w);
    json_decref(lj);
    json_decref(wj);
}

#endif
