/*
 * libFuzzer target for the OpenAI request parser (gateway/api/): whatever a
 * client sends as a body must give a parsed request or a 400 naming the
 * problem, never a crash; a parsed request must survive the round trip
 * through its canonical JSON (what the gateway sends upstream).
 *
 * The first input byte picks completions or chat.
 */
#include "infergate/api.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    ig_api_kind_t kind = data[0] & 1 ? IG_API_CHAT : IG_API_COMPLETION;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    ig_api_request_t req;
    ig_api_error_t err;
    if (ig_api_parse(kind, body, len, &req, &err) != 0) {
        /* A refusal is a client error with a message. */
        if (err.status < 400 || err.status > 499 || err.message[0] == '\0')
            abort();
        return 0;
    }
    json_t *canon = ig_api_request_to_json(&req);
    if (canon == NULL)
        abort();
    size_t clen = 0;
    char *text = ig_api_dumps(canon, &clen);
    json_decref(canon);
    ig_api_request_t again;
    if (text == NULL || ig_api_parse(kind, text, clen, &again, &err) != 0)
        abort(); /* the canonical form of a valid request is valid */
    if (again.stream != req.stream || again.max_tokens != req.max_tokens ||
        again.nprompts != req.nprompts || again.nmessages != req.nmessages)
        abort();
    ig_api_request_dispose(&again);
    free(text);
    ig_api_request_dispose(&req);
    return 0;
}
