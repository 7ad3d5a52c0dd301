/*
 * A request's prompt tokens (include/infergate/prefix.h): the one place a
 * request becomes the token ids a worker prefills and the gateway hashes
 * (the hashes themselves are base's, gateway/base/prefix_hash.c).
 */
#include "infergate/prefix.h"

#include "infergate/error.h"

#include <stdlib.h>
#include <string.h>

/* Copies v into a new int array. */
static int ids_of(const ig_tokvec_t *v, int **ids, int *n)
{
    *ids = malloc(sizeof(int) * (v->len ? v->len : 1));
    if (!*ids)
        return IG_ENOMEM;
    for (size_t i = 0; i < v->len; i++)
        (*ids)[i] = v->ids[i];
    *n = (int)v->len;
    return 0;
}

/* The messages (with their tool calls) and the request's tools, rendered by
 * the template's tool convention (ig_chat_detect_tools on the tokenizer's
 * chat_template). Tools are rendered unless tool_choice is "none"; a forced
 * choice ends the prompt with the start of a call. */
static int chat_tokens(const ig_tokenizer_t *tok, ig_chat_style_t style, const ig_api_request_t *r,
                       ig_tokvec_t *v, char *err, size_t errlen)
{
    int rc = IG_ENOMEM;
    size_t ncalls = 0;
    for (int i = 0; i < r->nmessages; i++)
        ncalls += (size_t)r->messages[i].ntool_calls;
    ig_chat_msg_t *m = calloc((size_t)(r->nmessages ? r->nmessages : 1), sizeof(*m));
    ig_chat_call_t *calls = calloc(ncalls ? ncalls : 1, sizeof(*calls));
    ig_chat_tool_t *tools = calloc((size_t)(r->ntools ? r->ntools : 1), sizeof(*tools));
    if (!m || !calls || !tools)
        goto done;
    ig_chat_call_t *c = calls;
    for (int i = 0; i < r->nmessages; i++) {
        const ig_api_message_t *am = &r->messages[i];
        m[i].role = strcmp(am->role, "developer") == 0 ? "system" : am->role;
        m[i].content = am->content;
        m[i].content_len = strlen(am->content);
        m[i].tool_call_id = am->tool_call_id;
        m[i].tool_calls = c;
        m[i].ntool_calls = (size_t)am->ntool_calls;
        for (int k = 0; k < am->ntool_calls; k++, c++) {
            c->id = am->tool_calls[k].id;
            c->name = am->tool_calls[k].name;
            c->arguments = am->tool_calls[k].arguments;
        }
    }
    ig_chat_tools_opts_t t = {.convention =
                                  ig_chat_detect_tools(style, ig_tokenizer_chat_template(tok))};
    if (r->tool_choice != IG_API_TOOL_CHOICE_NONE) {
        for (int i = 0; i < r->ntools; i++) {
            if (!r->tools[i].name)
                continue; /* not a function: a worker refuses it before this */
            tools[t.ntools].name = r->tools[i].name;
            tools[t.ntools].description = r->tools[i].description;
            tools[t.ntools].parameters = r->tools[i].parameters;
            t.ntools++;
        }
        t.tools = tools;
        if (r->tool_choice == IG_API_TOOL_CHOICE_REQUIRED)
            t.force = "";
        else if (r->tool_choice == IG_API_TOOL_CHOICE_FUNCTION)
            t.force = r->tool_choice_name;
    }
    rc = ig_chat_encode_tools(style, tok, m, (size_t)r->nmessages, &t, 1, v, err, errlen);
done:
    free(m);
    free(calls);
    free(tools);
    return rc;
}

int ig_prefix_prompt_tokens(const ig_tokenizer_t *tok, ig_chat_style_t style,
                            const ig_api_request_t *r, int index, int **ids, int *n, char *err,
                            size_t errlen)
{
    *ids = NULL;
    *n = 0;
    if (r->kind != IG_API_CHAT && (index < 0 || index >= r->nprompts))
        return IG_EINVAL;
    if (r->kind != IG_API_CHAT && r->prompts[index].text == NULL) {
        const ig_api_prompt_t *p = &r->prompts[index];
        *ids = malloc(sizeof(int) * (size_t)(p->nids ? p->nids : 1));
        if (!*ids)
            return IG_ENOMEM;
        memcpy(*ids, p->ids, sizeof(int) * (size_t)p->nids);
        *n = p->nids;
        return 0;
    }
    ig_tokvec_t v;
    ig_tokvec_init(&v);
    int rc;
    if (r->kind == IG_API_CHAT) {
        rc = chat_tokens(tok, style, r, &v, err, errlen);
    } else {
        const ig_api_prompt_t *p = &r->prompts[index];
        rc = ig_tokenizer_encode(tok, p->text, p->text_len, IG_TOKENIZER_ADD_BOS, &v);
    }
    if (rc == 0)
        rc = ids_of(&v, ids, n);
    ig_tokvec_dispose(&v);
    return rc;
}
