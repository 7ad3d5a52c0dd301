/*
 * The upstream client's response parser (upstream_internal.h): llhttp
 * callbacks that gather the headers into the request's buffer, hand
 * headers and body to the user's callbacks, and only record the message's
 * end, which upstream.c's on_read acts on once llhttp has returned.
 * Settings are made once, on the loop's thread.
 */
#include "upstream_internal.h"

#include <stdlib.h>
#include <string.h>

static llhttp_settings_t parser_settings;
static int parser_settings_ready;

static ig_upstream_req_t *parser_req(llhttp_t *p)
{
    conn_t *c = p->data;
    return c->req;
}

static int hbuf_append(ig_upstream_req_t *r, const char *at, size_t len)
{
    if (r->hlen + len + 1 > r->up->opts.max_response_header_bytes)
        return -1;
    if (r->hlen + len + 1 > r->hcap) {
        size_t cap = r->hcap ? r->hcap * 2 : 1024;
        while (cap < r->hlen + len + 1)
            cap *= 2;
        char *n = realloc(r->hbuf, cap);
        if (n == NULL)
            return -1;
        r->hbuf = n;
        r->hcap = cap;
    }
    memcpy(r->hbuf + r->hlen, at, len);
    r->hlen += len;
    return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
    ig_upstream_req_t *r = parser_req(p);
    if (r == NULL)
        return HPE_USER;
    if (r->in_value || r->nheaders == 0) {
        if (r->nheaders >= MAX_RESP_HEADERS)
            return HPE_USER;
        if (r->nheaders > 0 && hbuf_append(r, "", 1) != 0) /* end the last value */
            return HPE_USER;
        r->name_off[r->nheaders++] = r->hlen;
        r->in_value = 0;
    }
    return hbuf_append(r, at, len) == 0 ? 0 : HPE_USER;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
    ig_upstream_req_t *r = parser_req(p);
    if (r == NULL || r->nheaders == 0)
        return HPE_USER;
    if (!r->in_value) {
        if (hbuf_append(r, "", 1) != 0) /* end the name */
            return HPE_USER;
        r->value_off[r->nheaders - 1] = r->hlen;
        r->in_value = 1;
    }
    return hbuf_append(r, at, len) == 0 ? 0 : HPE_USER;
}

static int on_headers_complete(llhttp_t *p)
{
    ig_upstream_req_t *r = parser_req(p);
    if (r == NULL)
        return HPE_USER;
    if (r->nheaders > 0 && !r->in_value) {
        /* A name without a value: give it an empty one. */
        if (hbuf_append(r, "", 1) != 0)
            return HPE_USER;
        r->value_off[r->nheaders - 1] = r->hlen;
    }
    if (r->nheaders > 0 && hbuf_append(r, "", 1) != 0)
        return HPE_USER;
    const char *names[MAX_RESP_HEADERS], *values[MAX_RESP_HEADERS];
    for (int i = 0; i < r->nheaders; i++) {
        names[i] = r->hbuf + r->name_off[i];
        values[i] = r->hbuf + r->value_off[i];
    }
    r->headers_done = 1;
    if (r->cbs.on_headers != NULL) {
        r->in_cb++;
        r->cbs.on_headers(r, p->status_code, r->nheaders, names, values, r->data);
        r->in_cb--;
    }
    return r->end_pending ? HPE_USER : 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
    ig_upstream_req_t *r = parser_req(p);
    if (r == NULL)
        return HPE_USER;
    if (r->cbs.on_body != NULL) {
        r->in_cb++;
        r->cbs.on_body(r, at, len, r->data);
        r->in_cb--;
    }
    return r->end_pending ? HPE_USER : 0;
}

/* Only records: on_read ends the request once the parser has returned
 * (from llhttp_execute, or from llhttp_finish for a body the close ends). */
static int on_message_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    if (c->req == NULL)
        return HPE_USER;
    c->msg_done = 1;
    c->msg_keep_alive = llhttp_should_keep_alive(p);
    return HPE_PAUSED; /* nothing more is parsed from this read */
}

const llhttp_settings_t *ig__upstream_parser_settings(void)
{
    if (parser_settings_ready)
        return &parser_settings;
    llhttp_settings_init(&parser_settings);
    parser_settings.on_header_field = on_header_field;
    parser_settings.on_header_value = on_header_value;
    parser_settings.on_headers_complete = on_headers_complete;
    parser_settings.on_body = on_body;
    parser_settings.on_message_complete = on_message_complete;
    parser_settings_ready = 1;
    return &parser_settings;
}
