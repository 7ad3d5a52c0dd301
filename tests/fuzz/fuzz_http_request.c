/*
 * libFuzzer target for the request path: the same parsing core the server
 * runs (ig__http_parser: header pre-scan, llhttp, chunked validator), fed the
 * way a connection feeds it (a growing buffer, consumed from the front,
 * arbitrary read boundaries), then the request accessors on each result.
 *
 * The first input byte picks the read size and the limits profile.
 */
#include "../../gateway/http/http_internal.h"

#include "infergate/error.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void touch(ig_http_req_t *r)
{
    volatile size_t sink = 0;
    if (r->error_status != 0) {
        sink += (size_t)r->error_status + strlen(r->error_msg);
        return;
    }
    sink +=
        strlen(ig_http_req_method(r)) + strlen(ig_http_req_path(r)) + strlen(ig_http_req_query(r));
    for (unsigned i = 0; i < r->nheaders; i++)
        sink += strlen(r->headers[i].name) + strlen(r->headers[i].value);
    const char *h = ig_http_req_header(r, "content-type");
    if (h != NULL)
        sink += strlen(h);
    size_t len;
    const char *b = ig_http_req_body(r, &len);
    if (len > 0)
        sink += (unsigned char)b[len - 1];
    sink += (unsigned char)b[len]; /* NUL terminator must be readable */
    char *d = ig_http_req_strdup(r, "x");
    sink += d != NULL;
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    ig_http_limits_t limits;
    ig_http_limits_default(&limits);
    uint8_t ctl = data[0];
    data++;
    size--;
    if (ctl & 0x80) {
        /* tiny limits to reach every limit branch with small inputs */
        limits.max_request_line = 64;
        limits.max_header_bytes = 256;
        limits.max_headers = 4;
        limits.max_body_bytes = 128;
        limits.max_chunk_ext_bytes = 8;
        limits.max_chunk_ext_total = 24;
        limits.max_buffered_bytes = 512;
    }
    size_t step = (size_t)(ctl & 0x7f) + 1;

    ig__http_parser_t p;
    ig__http_parser_init(&p, &limits, NULL);
    char *buf = malloc(size + 1);
    if (buf == NULL)
        return 0;
    size_t have = 0, pos = 0;
    int failed = 0;
    while (!failed) {
        /* deliver the next "read" */
        size_t n = size - have < step ? size - have : step;
        memcpy(buf + have, data + have, n);
        have += n;
        for (;;) {
            ig_http_req_t *r = NULL;
            int c = ig__http_parser_feed(&p, buf + pos, have - pos, &r);
            if (c == IG_EPARSE) {
                if (r != NULL) {
                    touch(r);
                    ig__http_req_free(r);
                }
                failed = 1;
                break;
            }
            if (c < 0 || (size_t)c > have - pos)
                abort(); /* contract: never consumes more than given */
            pos += (size_t)c;
            if (r != NULL) {
                touch(r);
                ig__http_req_free(r);
                continue;
            }
            if (c == 0)
                break;
        }
        if (have == size)
            break;
    }
    ig__http_parser_dispose(&p);
    free(buf);
    return 0;
}
