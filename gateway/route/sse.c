/*
 * What the events of an OpenAI-style SSE stream say (include/infergate/sse.h).
 */
#include "infergate/sse.h"

#include "infergate/error.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int ig_sse_event_data(const char *ev, size_t n, char *buf, size_t cap, char **out, size_t *len)
{
    char *data = NULL;
    size_t dlen = 0;
    const char *p = ev, *end = ev + n;
    *out = NULL;
    *len = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl != NULL ? nl : end;
        size_t ll = (size_t)(le - p);
        if (ll > 0 && p[ll - 1] == '\r')
            ll--;
        if (ll >= 5 && memcmp(p, "data:", 5) == 0) {
            const char *v = p + 5;
            size_t vl = ll - 5;
            if (vl > 0 && *v == ' ') {
                v++;
                vl--;
            }
            /* Each value and a "\n" after it: at most n + 1 bytes. */
            if (data == NULL && (data = n + 1 <= cap ? buf : malloc(n + 1)) == NULL)
                return IG_ENOMEM;
            memcpy(data + dlen, v, vl);
            dlen += vl;
            data[dlen++] = '\n';
        }
        p = le + 1;
    }
    if (data == NULL)
        return 0;
    data[--dlen] = '\0'; /* the last value's "\n" */
    *out = data;
    *len = dlen;
    return 0;
}

static int nonempty_string(const json_t *v)
{
    return json_is_string(v) && json_string_length(v) > 0;
}

/* A Responses API event (a "type" of "response.*", or "error") starts the
 * answer when it carries output: a delta with text (output text, refusal,
 * function-call arguments, reasoning), or the response's end. */
static int responses_event_is_token(const json_t *o, const char *type)
{
    if (strcmp(type, "error") == 0)
        return 1;
    size_t tl = strlen(type);
    if (tl > 6 && strcmp(type + tl - 6, ".delta") == 0)
        return nonempty_string(json_object_get(o, "delta"));
    return strcmp(type, "response.completed") == 0 || strcmp(type, "response.failed") == 0 ||
           strcmp(type, "response.incomplete") == 0;
}

int ig_sse_payload_is_token(const char *p, size_t n)
{
    if (n == 6 && memcmp(p, "[DONE]", 6) == 0)
        return 1;
    json_t *o = json_loadb(p, n, 0, NULL);
    if (!json_is_object(o)) {
        json_decref(o);
        return 1;
    }
    const char *type = json_string_value(json_object_get(o, "type"));
    if (type != NULL && (strncmp(type, "response.", 9) == 0 || strcmp(type, "error") == 0)) {
        int token = responses_event_is_token(o, type);
        json_decref(o);
        return token;
    }
    int token = json_object_get(o, "error") != NULL || json_is_object(json_object_get(o, "usage"));
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(o, "choices"), i, c)
    {
        json_t *d = json_object_get(c, "delta");
        json_t *tools = json_object_get(d, "tool_calls");
        const json_t *finish = json_object_get(c, "finish_reason");
        if (nonempty_string(json_object_get(c, "text")) ||
            nonempty_string(json_object_get(d, "content")) ||
            nonempty_string(json_object_get(d, "refusal")) ||
            (json_is_array(tools) && json_array_size(tools) > 0) ||
            json_object_get(d, "function_call") != NULL ||
            (finish != NULL && !json_is_null(finish)))
            token = 1;
    }
    json_decref(o);
    return token;
}
