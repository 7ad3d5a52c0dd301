#ifndef INFERGATE_PREFIX_H
#define INFERGATE_PREFIX_H

/*
 * A request's prompt tokens, for the prefix cache: ig_prefix_prompt_tokens()
 * is the one place a request becomes the token ids a worker prefills, so
 * that the gateway hashes (include/infergate/prefix_hash.h) what the engine
 * caches.
 */

#include "infergate/api.h"
#include "infergate/chat.h"
#include "infergate/prefix_hash.h"

#include <stddef.h>
#include <stdint.h>

/*
 * The token ids a worker prefills for prompt `index` of request r (a chat
 * request has one, index 0): a text prompt encoded with tok (BOS where the
 * tokenizer config asks for it), chat messages rendered with the family
 * `style` (ig_chat_encode_tools: markers as special tokens, content as
 * plain text; OpenAI's "developer" role is the system prompt; the request's
 * tools, unless tool_choice is "none", and the history's tool calls in the
 * tool convention of tok's chat_template, ig_chat_detect_tools), token ids
 * as given. *ids is a new array (free() it), *n its length.
 *   0; IG_EINVAL: the messages cannot be rendered (err says why, when
 *   given); IG_ENOMEM; or the encoder's error. Text is not UTF-8-checked
 *   here (the API parser already refused bad UTF-8).
 */
int ig_prefix_prompt_tokens(const ig_tokenizer_t *tok, ig_chat_style_t style,
                            const ig_api_request_t *r, int index, int **ids, int *n, char *err,
                            size_t errlen);

#endif
