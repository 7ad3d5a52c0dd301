/*
 * The endpoints the gateway routes whole, which no local worker implements:
 * POST /v1/embeddings and POST /v1/responses (include/infergate/api.h,
 * "routed endpoints"). The gateway reads what it routes by -- the model,
 * whether the answer streams, an estimate of the input's tokens and the
 * output cap -- checks those fields' types, and forwards the body as the
 * client sent it.
 */
#include "infergate/api.h"
#include "infergate/error.h"
#include "infergate/jsonv.h"

#include <stdlib.h>
#include <string.h>

#define MAX_EMBED_INPUTS 2048 /* OpenAI's own bound on one embeddings list */

/* The model (required, a string); the copy goes to out->model. */
static int read_model(json_t *root, ig_api_routed_t *out, ig_api_error_t *err)
{
    json_t *m = json_object_get(root, "model");
    if (m == NULL || json_is_null(m))
        return ig_api_error(err, 400, "model", "you must provide a model parameter");
    if (!json_is_string(m) || json_string_length(m) == 0)
        return ig_api_error(err, 400, "model", "'model' must be a non-empty string");
    out->model = strdup(json_string_value(m));
    return out->model != NULL ? 0 : ig_api_error_oom(err);
}

/* Text bytes under v, every string at any depth: the token estimate's
 * input (bytes / 4, as for completions). Depth is bounded by the JSON
 * loader's own nesting limit. */
static size_t text_bytes(const json_t *v)
{
    size_t n = 0, i;
    const char *k;
    json_t *e;
    if (json_is_string(v))
        return json_string_length(v);
    if (json_is_array(v)) {
        json_array_foreach(v, i, e) n += text_bytes(e);
    } else if (json_is_object(v)) {
        json_object_foreach((json_t *)v, k, e) n += text_bytes(e);
    }
    return n;
}

static int clamp_tokens(size_t n)
{
    return n > 1 << 20 ? 1 << 20 : (int)n;
}

/* An embeddings input: a string, a list of strings, a list of token ids
 * or a list of token-id lists; counts the inputs and their tokens. */
static int read_embed_input(json_t *in, ig_api_routed_t *out, ig_api_error_t *err)
{
    static const char *const shape = "'input' must be a string, a list of strings, a list of token "
                                     "ids or a list of token-id lists";
    if (in == NULL || json_is_null(in))
        return ig_api_error(err, 400, "input", "'input' is required");
    if (json_is_string(in)) {
        out->ninputs = 1;
        out->input_tokens = clamp_tokens(json_string_length(in) / 4 + 1);
        return 0;
    }
    if (!json_is_array(in))
        return ig_api_error(err, 400, "input", "%s", shape);
    size_t n = json_array_size(in), i, tokens = 0;
    if (n == 0)
        return ig_api_error(err, 400, "input", "'input' must not be empty");
    json_t *first = json_array_get(in, 0), *e;
    if (json_is_integer(first)) { /* one token-id input */
        json_array_foreach(in, i, e)
        {
            if (!json_is_integer(e))
                return ig_api_error(err, 400, "input", "%s", shape);
        }
        out->ninputs = 1;
        out->input_tokens = clamp_tokens(n);
        return 0;
    }
    if (n > MAX_EMBED_INPUTS)
        return ig_api_error(err, 400, "input", "'input' has %zu entries; at most %d", n,
                            MAX_EMBED_INPUTS);
    json_array_foreach(in, i, e)
    {
        if (json_is_string(e) && json_is_string(first)) {
            tokens += json_string_length(e) / 4 + 1;
            continue;
        }
        if (!json_is_array(e) || !json_is_array(first))
            return ig_api_error(err, 400, "input", "%s", shape);
        size_t j;
        json_t *id;
        json_array_foreach(e, j, id)
        {
            if (!json_is_integer(id))
                return ig_api_error(err, 400, "input", "%s", shape);
        }
        tokens += json_array_size(e);
    }
    out->ninputs = (int)n;
    out->input_tokens = clamp_tokens(tokens);
    return 0;
}

static int parse_embeddings(json_t *root, ig_api_routed_t *out, ig_api_error_t *err)
{
    int rc = read_model(root, out, err);
    if (rc < 0)
        return rc;
    if ((rc = read_embed_input(json_object_get(root, "input"), out, err)) < 0)
        return rc;
    json_t *f = json_object_get(root, "encoding_format");
    if (f != NULL && !json_is_null(f) &&
        (!json_is_string(f) ||
         (strcmp(json_string_value(f), "float") != 0 && strcmp(json_string_value(f), "base64") != 0)))
        return ig_api_error(err, 400, "encoding_format",
                            "'encoding_format' must be \"float\" or \"base64\"");
    json_t *d = json_object_get(root, "dimensions");
    if (d != NULL && !json_is_null(d) && (!json_is_integer(d) || json_integer_value(d) < 1))
        return ig_api_error(err, 400, "dimensions", "'dimensions' must be an integer >= 1");
    return 0;
}

static int parse_responses(json_t *root, ig_api_routed_t *out, ig_api_error_t *err)
{
    int rc = read_model(root, out, err);
    if (rc < 0)
        return rc;
    json_t *in = json_object_get(root, "input");
    if (in != NULL && !json_is_null(in) && !json_is_string(in) && !json_is_array(in))
        return ig_api_error(err, 400, "input", "'input' must be a string or a list of items");
    json_t *ins = json_object_get(root, "instructions");
    if (ins != NULL && !json_is_null(ins) && !json_is_string(ins))
        return ig_api_error(err, 400, "instructions", "'instructions' must be a string");
    if ((in == NULL || json_is_null(in)) && json_object_get(root, "previous_response_id") == NULL)
        return ig_api_error(err, 400, "input", "'input' is required");
    out->ninputs = 1;
    out->input_tokens = clamp_tokens((text_bytes(in) + text_bytes(ins)) / 4 + 4);
    json_t *s = json_object_get(root, "stream");
    if (s != NULL && !json_is_null(s)) {
        if (!json_is_boolean(s))
            return ig_api_error(err, 400, "stream", "'stream' must be a boolean");
        out->stream = json_is_true(s);
    }
    json_t *m = json_object_get(root, "max_output_tokens");
    if (m != NULL && !json_is_null(m)) {
        if (!json_is_integer(m) || json_integer_value(m) < 1)
            return ig_api_error(err, 400, "max_output_tokens",
                                "'max_output_tokens' must be an integer >= 1");
        json_int_t v = json_integer_value(m);
        out->max_tokens = v > 0x3fffffff ? 0x3fffffff : (int)v;
    }
    return 0;
}

int ig_api_parse_routed(ig_api_routed_kind_t kind, const char *body, size_t len,
                        ig_api_routed_t *out, ig_api_error_t *err)
{
    memset(out, 0, sizeof(*out));
    out->kind = kind;
    json_t *root = ig_api_load_object(body, len, err);
    if (root == NULL)
        return IG_EINVAL;
    int rc = kind == IG_API_EMBEDDINGS ? parse_embeddings(root, out, err)
                                       : parse_responses(root, out, err);
    json_decref(root);
    if (rc < 0)
        ig_api_routed_dispose(out);
    return rc;
}

void ig_api_routed_dispose(ig_api_routed_t *r)
{
    free(r->model);
    r->model = NULL;
}

const char *ig_api_routed_path(ig_api_routed_kind_t kind)
{
    return kind == IG_API_EMBEDDINGS ? "/v1/embeddings" : "/v1/responses";
}

/* ---- the one change the gateway makes to a body it forwards -------------- */

int ig_api_body_cap(const char *body, size_t len, const char *const *fields, int nfields,
                    long long cap, char **out, size_t *out_len)
{
    *out = NULL;
    json_t *root = ig_jsonv_loadb(body, len, NULL);
    if (!json_is_object(root) || nfields < 1) {
        json_decref(root);
        return IG_EINVAL;
    }
    int rc = 0, present = 0;
    for (int i = 0; i < nfields && rc == 0; i++) {
        json_t *v = json_object_get(root, fields[i]);
        if (v == NULL || json_is_null(v))
            continue;
        present = 1;
        if (!json_is_integer(v) || json_integer_value(v) > cap)
            rc = json_object_set_new(root, fields[i], json_integer(cap)) == 0 ? 0 : IG_ENOMEM;
    }
    if (rc == 0 && !present)
        rc = json_object_set_new(root, fields[0], json_integer(cap)) == 0 ? 0 : IG_ENOMEM;
    if (rc == 0 && (*out = ig_api_dumps(root, out_len)) == NULL)
        rc = IG_ENOMEM;
    json_decref(root);
    return rc;
}
