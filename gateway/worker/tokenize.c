/*
 * POST /v1/tokenize and /v1/detokenize, as vLLM serves them: what an
 * operator (or a gateway) asks to see how this worker turns a request into
 * tokens, the chat template and tools included, without generating.
 *
 *   tokenize:   {"prompt": ...} or {"messages": [...], "tools"?: [...]}, the
 *               generation request's own fields and rules (the one parser);
 *               -> {"count", "max_model_len", "tokens"}
 *   detokenize: {"tokens": [ids]} -> {"prompt": text}
 *
 * And GET /v1/tokenizer/FILE: the model directory's tokenizer.json,
 * tokenizer_config.json and generation_config.json as they are on disk,
 * for a gateway without the model files that hashes text prompts as this
 * worker caches them (docs/routing.md, "Text prompts without model files").
 */
#include "worker_internal.h"

#include "infergate/error.h"
#include "infergate/prefix.h"
#include "infergate/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DETOKENIZE_MAX 65536 /* token ids of one detokenize request */

/* 0 when the worker can answer now; else the answer went out. */
static int ready(worker_t *w, ig_http_req_t *req)
{
    ig_api_error_t e;
    if (w->state == W_LOADING) {
        ig__worker_respond_loading(req);
        return -1;
    }
    if (w->state != W_READY) {
        ig_api_error(&e, 503, NULL, "the worker is not ready");
        ig_api_respond_error(req, &e);
        return -1;
    }
    return 0;
}

void ig__worker_tokenize(worker_t *w, ig_http_req_t *req)
{
    ig_api_error_t e;
    ig_api_request_t a;
    if (ready(w, req) < 0)
        return;
    size_t len;
    const char *body = ig_http_req_body(req, &len);
    /* The kind by the body: messages make it a chat request. */
    json_t *doc = json_loadb(body, len, 0, NULL);
    ig_api_kind_t kind = json_object_get(doc, "messages") ? IG_API_CHAT : IG_API_COMPLETION;
    json_decref(doc);
    if (ig_api_parse(kind, body, len, &a, &e) < 0) {
        ig_api_respond_error(req, &e);
        return;
    }
    int *ids = NULL, n = 0, rc = 0;
    char err[256] = "";
    if (kind == IG_API_COMPLETION && a.nprompts != 1) {
        rc =
            ig_api_error(&e, 400, "prompt", "'prompt' must be one prompt here, not %d", a.nprompts);
    } else if (kind == IG_API_CHAT && a.ntools && a.tool_choice != IG_API_TOOL_CHOICE_NONE &&
               w->chat_tools == IG_CHAT_TOOLS_NONE) {
        rc =
            ig_api_error(&e, 400, "tools", "this model's chat template (%s) has no tool convention",
                         ig_chat_style_name(w->chat_style));
    } else {
        rc = ig_prefix_prompt_tokens(w->tok, w->chat_style, &a, 0, &ids, &n, err, sizeof(err));
        if (rc == IG_ENOMEM)
            ig_api_error_oom(&e);
        else if (rc < 0)
            ig_api_error(&e, 400, kind == IG_API_CHAT ? "messages" : "prompt", "%s",
                         err[0] ? err : ig_strerror(rc));
    }
    ig_api_request_dispose(&a);
    if (rc < 0) {
        free(ids);
        ig_api_respond_error(req, &e);
        return;
    }
    json_t *toks = json_array();
    for (int i = 0; toks && i < n; i++)
        json_array_append_new(toks, json_integer(ids[i]));
    free(ids);
    ig_api_respond_json(
        req, 200,
        toks ? json_pack("{s:i, s:i, s:o}", "count", n, "max_model_len", w->context, "tokens", toks)
             : NULL);
}

void ig__worker_detokenize(worker_t *w, ig_http_req_t *req)
{
    ig_api_error_t e;
    if (ready(w, req) < 0)
        return;
    size_t len;
    const char *body = ig_http_req_body(req, &len);
    json_t *doc = json_loadb(body, len, 0, NULL);
    json_t *arr = json_object_get(doc, "tokens");
    size_t n = json_array_size(arr);
    if (!json_is_object(doc) || !json_is_array(arr) || n > DETOKENIZE_MAX) {
        json_decref(doc);
        ig_api_error(&e, 400, "tokens", "expected {\"tokens\": [token ids]}, at most %d",
                     DETOKENIZE_MAX);
        ig_api_respond_error(req, &e);
        return;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    if (!ids) {
        json_decref(doc);
        ig_api_respond_oom(req);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= w->vocab) {
            free(ids);
            json_decref(doc);
            ig_api_error(&e, 400, "tokens",
                         "'tokens' entry %zu is not a token id of this vocabulary (size %d)", i,
                         w->vocab);
            ig_api_respond_error(req, &e);
            return;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    json_decref(doc);
    char *text = NULL, *fixed = NULL;
    size_t tl = 0;
    int rc = ig_tokenizer_decode(w->tok, ids, n, 0, &text, &tl);
    free(ids);
    /* Ids may end inside a character: JSON strings are UTF-8, so the
     * broken bytes are shown as U+FFFD, as the generation answers do. */
    if (rc == 0 && (fixed = malloc(tl * 3 + 1)) != NULL)
        tl = ig_utf8_replace(text, tl, fixed);
    free(text);
    if (rc < 0 || !fixed) {
        free(fixed);
        if (rc == IG_ENOMEM || rc == 0) {
            ig_api_respond_oom(req);
        } else {
            ig_api_error(&e, 400, "tokens", "the tokens cannot be decoded: %s", ig_strerror(rc));
            ig_api_respond_error(req, &e);
        }
        return;
    }
    ig_api_respond_json(req, 200, json_pack("{s:s%}", "prompt", fixed, tl));
    free(fixed);
}

/* The most a gateway reads of one tokenizer file. */
#define TOKENIZER_FILE_MAX (64u << 20)

/* name is one of the three the routes in worker.c name. */
void ig__worker_tokenizer_file(worker_t *w, ig_http_req_t *req, const char *name)
{
    if (ready(w, req) < 0)
        return;
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", w->o.model_dir, name);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        /* A GGUF model carries its vocabulary inside the weights. */
        ig_http_respond_error(req, 404, "not_found_error", NULL, NULL,
                              "the model has no %s (a GGUF file's vocabulary is not served)",
                              name);
        return;
    }
    char *buf = NULL;
    size_t len = 0;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (size >= 0 && (size_t)size <= TOKENIZER_FILE_MAX && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)size + 1)) != NULL)
        len = fread(buf, 1, (size_t)size, f);
    fclose(f);
    if (buf == NULL || len != (size_t)size)
        ig_http_respond_error(req, 500, "server_error", NULL, NULL, "cannot read %s", name);
    else
        ig_http_respond(req, 200, "application/json", buf, len);
    free(buf);
}
