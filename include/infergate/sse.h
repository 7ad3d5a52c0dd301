#ifndef INFERGATE_SSE_H
#define INFERGATE_SSE_H

/*
 * What the events of an OpenAI-style server-sent-event stream say, for the
 * proxy (the first token: TTFT, commit, hedging) and the usage meter (token
 * counts, inter-token latency). Framing into events stays with the caller,
 * which sees the stream in pieces.
 */

#include <stddef.h>

/*
 * The data of one event ev[0..n) (its lines, without the blank line that
 * ends it): the values of its data lines joined with "\n", one leading
 * space dropped from each, as the WHATWG EventSource parser does; comments
 * and other fields say nothing. 0 with *out NUL-terminated (*len bytes), or
 * NULL when the event has no data line; IG_ENOMEM. *out is buf when n + 1
 * bytes fit in cap (a token event does: no allocation on the stream's
 * path), else malloc'd: the caller frees it when it is not buf.
 */
int ig_sse_event_data(const char *ev, size_t n, char *buf, size_t cap, char **out, size_t *len);

/*
 * 1 when one data payload starts the answer: [DONE], an error, usage, or a
 * choice with non-empty text or delta.content (or refusal), tool calls, a
 * function call or a finish_reason; of the Responses API's events, a
 * non-empty delta, the response's end or an error. A payload that is not
 * a JSON object counts too, so that a format we do not know is never held
 * back. Choices of any index count alike (n > 1).
 */
int ig_sse_payload_is_token(const char *p, size_t n);

#endif
