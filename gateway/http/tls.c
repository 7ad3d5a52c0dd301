/*
 * TLS over OpenSSL memory BIOs (see include/infergate/tls.h).
 *
 * Each session has two memory BIOs: rbio holds the ciphertext the peer
 * sent, wbio the ciphertext for the peer. SSL_read and SSL_write never see
 * a socket, so a "would block" from them only ever means "feed more".
 */
#include "infergate/tls.h"
#include "infergate/error.h"
#include "infergate/log.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Mozilla's "intermediate" TLS 1.2 list: forward secrecy and AEAD only.
 * TLS 1.3's suites are OpenSSL's defaults (all AEAD). */
static const char cipher_list[] = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
                                  "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
                                  "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

struct ig_tls_ctx_s {
    SSL_CTX *ssl;
    atomic_int refs;
    int is_server;
    int insecure;
};

struct ig_tls_s {
    SSL *ssl;
    BIO *rbio; /* owned by ssl */
    BIO *wbio; /* owned by ssl */
    ig_tls_ctx_t *ctx;
    int established;
    char error[256];
};

/* The first queued OpenSSL error as text (and clears the queue). */
static void openssl_reason(char *buf, size_t len)
{
    unsigned long e = ERR_get_error();
    if (e == 0) {
        snprintf(buf, len, "unknown TLS error");
    } else {
        ERR_error_string_n(e, buf, len);
    }
    ERR_clear_error();
}

static SSL_CTX *ctx_common(const SSL_METHOD *method)
{
    SSL_CTX *s = SSL_CTX_new(method);
    if (s == NULL)
        return NULL;
    if (SSL_CTX_set_min_proto_version(s, TLS1_2_VERSION) != 1 ||
        SSL_CTX_set_cipher_list(s, cipher_list) != 1) {
        SSL_CTX_free(s);
        return NULL;
    }
    SSL_CTX_set_options(s, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                               SSL_OP_NO_SESSION_RESUMPTION_ON_RENEGOTIATION);
    /* Buffers of idle connections go back to the allocator. */
    SSL_CTX_set_mode(s, SSL_MODE_RELEASE_BUFFERS);
    return s;
}

/* A context of method with one reference, or NULL: *rc is IG_ENOMEM, or
 * IG_ECONFIG with err set. */
static ig_tls_ctx_t *ctx_alloc(const SSL_METHOD *method, int *rc, char *err, size_t errlen)
{
    ig_tls_ctx_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        *rc = IG_ENOMEM;
        return NULL;
    }
    atomic_init(&c->refs, 1);
    c->ssl = ctx_common(method);
    if (c->ssl == NULL) {
        char why[256];
        openssl_reason(why, sizeof(why));
        ig_errf(err, errlen, "cannot set up TLS: %s", why);
        free(c);
        *rc = IG_ECONFIG;
        return NULL;
    }
    return c;
}

/* Frees a context whose setup failed; returns IG_ECONFIG. */
static int ctx_fail(ig_tls_ctx_t *c)
{
    SSL_CTX_free(c->ssl);
    free(c);
    return IG_ECONFIG;
}

int ig_tls_server_ctx_new(ig_tls_ctx_t **out, const char *cert_file, const char *key_file,
                          char *err, size_t errlen)
{
    char why[256];
    int rc;
    *out = NULL;
    ig_tls_ctx_t *c = ctx_alloc(TLS_server_method(), &rc, err, errlen);
    if (c == NULL)
        return rc;
    c->is_server = 1;
    if (SSL_CTX_use_certificate_chain_file(c->ssl, cert_file) != 1) {
        openssl_reason(why, sizeof(why));
        ig_errf(err, errlen, "tls.cert_file '%s': %s", cert_file, why);
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(c->ssl, key_file, SSL_FILETYPE_PEM) != 1) {
        openssl_reason(why, sizeof(why));
        ig_errf(err, errlen, "tls.key_file '%s': %s", key_file, why);
        goto fail;
    }
    if (SSL_CTX_check_private_key(c->ssl) != 1) {
        openssl_reason(why, sizeof(why));
        ig_errf(err, errlen, "tls.key_file '%s' does not match tls.cert_file '%s': %s", key_file,
                cert_file, why);
        goto fail;
    }
    /* The server picks from its own list (all of them are strong). */
    SSL_CTX_set_options(c->ssl, SSL_OP_CIPHER_SERVER_PREFERENCE);
    *out = c;
    return 0;
fail:
    return ctx_fail(c);
}

int ig_tls_client_ctx_new(ig_tls_ctx_t **out, const char *ca_file, int insecure, char *err,
                          size_t errlen)
{
    char why[256];
    int rc;
    *out = NULL;
    ig_tls_ctx_t *c = ctx_alloc(TLS_client_method(), &rc, err, errlen);
    if (c == NULL)
        return rc;
    c->insecure = insecure;
    if (ca_file != NULL) {
        if (SSL_CTX_load_verify_locations(c->ssl, ca_file, NULL) != 1) {
            openssl_reason(why, sizeof(why));
            ig_errf(err, errlen, "tls.ca_file '%s': %s", ca_file, why);
            goto fail;
        }
    } else if (SSL_CTX_set_default_verify_paths(c->ssl) != 1) {
        openssl_reason(why, sizeof(why));
        ig_errf(err, errlen, "cannot load the system's CA certificates: %s", why);
        goto fail;
    }
    SSL_CTX_set_verify(c->ssl, insecure ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, NULL);
    *out = c;
    return 0;
fail:
    return ctx_fail(c);
}

void ig_tls_ctx_ref(ig_tls_ctx_t *ctx)
{
    if (ctx != NULL)
        atomic_fetch_add(&ctx->refs, 1);
}

void ig_tls_ctx_unref(ig_tls_ctx_t *ctx)
{
    if (ctx == NULL || atomic_fetch_sub(&ctx->refs, 1) != 1)
        return;
    SSL_CTX_free(ctx->ssl);
    free(ctx);
}

/* 1 when s is a literal IPv4 or IPv6 address. */
static int is_ip_literal(const char *s)
{
    ASN1_OCTET_STRING *ip = a2i_IPADDRESS(s);
    if (ip == NULL)
        return 0;
    ASN1_OCTET_STRING_free(ip);
    return 1;
}

int ig_tls_new(ig_tls_t **out, ig_tls_ctx_t *ctx, int is_server, const char *server_name)
{
    *out = NULL;
    ig_tls_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return IG_ENOMEM;
    t->ssl = SSL_new(ctx->ssl);
    t->rbio = BIO_new(BIO_s_mem());
    t->wbio = BIO_new(BIO_s_mem());
    if (t->ssl == NULL || t->rbio == NULL || t->wbio == NULL) {
        BIO_free(t->rbio);
        BIO_free(t->wbio);
        goto fail;
    }
    /* An empty read BIO means "want more", not end of file. */
    BIO_set_mem_eof_return(t->rbio, -1);
    BIO_set_mem_eof_return(t->wbio, -1);
    SSL_set_bio(t->ssl, t->rbio, t->wbio); /* the BIOs are the session's now */
    if (is_server) {
        SSL_set_accept_state(t->ssl);
    } else {
        SSL_set_connect_state(t->ssl);
        if (server_name != NULL && server_name[0] != '\0') {
            int ok;
            if (is_ip_literal(server_name))
                ok = ctx->insecure ||
                     X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(t->ssl), server_name) == 1;
            else
                ok = SSL_set_tlsext_host_name(t->ssl, server_name) == 1 &&
                     (ctx->insecure || SSL_set1_host(t->ssl, server_name) == 1);
            if (!ok)
                goto fail;
        }
    }
    ig_tls_ctx_ref(ctx);
    t->ctx = ctx;
    *out = t;
    return 0;
fail:
    if (t->ssl != NULL)
        SSL_free(t->ssl);
    free(t);
    ERR_clear_error();
    return IG_ENOMEM;
}

void ig_tls_free(ig_tls_t *t)
{
    if (t == NULL)
        return;
    SSL_free(t->ssl); /* and its BIOs */
    ig_tls_ctx_unref(t->ctx);
    free(t);
}

int ig_tls_feed(ig_tls_t *t, const char *data, size_t len)
{
    while (len > 0) {
        int chunk = len > (1u << 30) ? 1 << 30 : (int)len;
        int n = BIO_write(t->rbio, data, chunk);
        if (n <= 0)
            return IG_ENOMEM;
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Turns an SSL_* result into 0 (wants more), IG_ECLOSED or IG_EIO. */
static int classify(ig_tls_t *t, int r)
{
    int e = SSL_get_error(t->ssl, r);
    switch (e) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
        return 0;
    case SSL_ERROR_ZERO_RETURN:
        return IG_ECLOSED;
    default:
        break;
    }
    long v = SSL_get_verify_result(t->ssl);
    if (v != X509_V_OK) {
        snprintf(t->error, sizeof(t->error), "certificate verify failed: %s",
                 X509_verify_cert_error_string(v));
        ERR_clear_error();
    } else {
        openssl_reason(t->error, sizeof(t->error));
    }
    return IG_EIO;
}

int ig_tls_handshake(ig_tls_t *t)
{
    if (t->established)
        return 1;
    int r = SSL_do_handshake(t->ssl);
    if (r == 1) {
        t->established = 1;
        return 1;
    }
    int rc = classify(t, r);
    return rc == IG_ECLOSED ? IG_EIO : rc;
}

int ig_tls_read(ig_tls_t *t, char *buf, size_t cap)
{
    if (cap == 0)
        return 0;
    int r = SSL_read(t->ssl, buf, cap > (1u << 30) ? 1 << 30 : (int)cap);
    if (!t->established && SSL_is_init_finished(t->ssl))
        t->established = 1;
    if (r > 0)
        return r;
    return classify(t, r);
}

int ig_tls_write(ig_tls_t *t, const char *data, size_t len)
{
    while (len > 0) {
        int chunk = len > (1u << 30) ? 1 << 30 : (int)len;
        int r = SSL_write(t->ssl, data, chunk);
        if (r <= 0) {
            int rc = classify(t, r);
            return rc == 0 ? IG_EIO : rc; /* memory BIOs never block a write */
        }
        data += r;
        len -= (size_t)r;
    }
    return 0;
}

void ig_tls_shutdown(ig_tls_t *t)
{
    if (t->established)
        SSL_shutdown(t->ssl);
    ERR_clear_error();
}

size_t ig_tls_take(ig_tls_t *t, char *buf, size_t cap)
{
    int chunk = cap > (1u << 30) ? 1 << 30 : (int)cap;
    int n = BIO_read(t->wbio, buf, chunk);
    return n > 0 ? (size_t)n : 0;
}

int ig_tls_established(const ig_tls_t *t)
{
    return t->established;
}

const char *ig_tls_error(const ig_tls_t *t)
{
    return t->error;
}

/* ---- a TLS client over a connected libuv stream ------------------------- */

struct ig_tls_stream_s {
    ig_tls_t *tls;
    uv_stream_t *s;
    ig_tls_stream_t *next; /* in this thread's registry */
    uv_timer_t kick;       /* delivers what waits in the session after read_start */
    uv_alloc_cb alloc_cb;
    uv_read_cb read_cb;
    ig_tls_ready_cb ready_cb;
    void *ready_data;
    int user_reading; /* the caller wants plaintext */
    int raw_reading;  /* ciphertext is being read from s */
    int ready_fired;
    int eof;      /* the peer closed (EOF or close_notify) */
    int eof_told; /* the caller has seen it */
    int failed;   /* a record or a write failed */
    int closed;
    char name[64];
};

/* libuv hands read callbacks the stream, whose data pointer is the
 * caller's: the session is found here. One loop per thread, and a
 * handful of TLS connections per upstream, so a list does. */
static _Thread_local ig_tls_stream_t *streams;

static ig_tls_stream_t *stream_find(const uv_stream_t *s)
{
    for (ig_tls_stream_t *t = streams; t != NULL; t = t->next) {
        if (t->s == s)
            return t;
    }
    return NULL;
}

static void stream_unregister(ig_tls_stream_t *ts)
{
    for (ig_tls_stream_t **p = &streams; *p != NULL; p = &(*p)->next) {
        if (*p == ts) {
            *p = ts->next;
            return;
        }
    }
}

typedef struct {
    uv_write_t w;
    char data[];
} raw_write_t;

static void on_raw_written(uv_write_t *w, int status)
{
    free(w); /* a failure shows on the read side */
}

/* Sends the ciphertext the session has: uv_try_write, then a copy of the
 * rest by uv_write. */
static void stream_flush(ig_tls_stream_t *ts)
{
    char buf[16384 + 512];
    size_t n;
    while ((n = ig_tls_take(ts->tls, buf, sizeof(buf))) > 0) {
        if (ts->failed)
            continue;
        uv_buf_t b = uv_buf_init(buf, (unsigned)n);
        int w = uv_stream_get_write_queue_size(ts->s) == 0 ? uv_try_write(ts->s, &b, 1) : 0;
        if (w == UV_EAGAIN || w == UV_ENOSYS)
            w = 0;
        if (w < 0) {
            ts->failed = 1;
            continue;
        }
        if ((size_t)w == n)
            continue;
        raw_write_t *rw = malloc(sizeof(*rw) + n - (size_t)w);
        if (rw == NULL) {
            ts->failed = 1;
            continue;
        }
        memcpy(rw->data, buf + w, n - (size_t)w);
        b = uv_buf_init(rw->data, (unsigned)(n - (size_t)w));
        if (uv_write(&rw->w, ts->s, &b, 1, on_raw_written) != 0) {
            free(rw);
            ts->failed = 1;
        }
    }
}

static void stream_ready(ig_tls_stream_t *ts, int status)
{
    if (ts->ready_fired)
        return;
    ts->ready_fired = 1;
    if (status != 0)
        IG_WARN("upstream %s: TLS handshake failed: %s", ts->name,
                ts->tls->error[0] ? ts->tls->error : "connection closed during the handshake");
    ts->ready_cb(ts, status, ts->ready_data);
}

/* Hands the caller what plaintext the session has, while it reads. */
static void stream_deliver(ig_tls_stream_t *ts)
{
    while (ts->user_reading && !ts->closed && !ts->eof_told) {
        uv_buf_t b = uv_buf_init(NULL, 0);
        ts->alloc_cb((uv_handle_t *)ts->s, 65536, &b);
        if (b.base == NULL || b.len == 0) {
            ts->read_cb(ts->s, UV_ENOBUFS, &b);
            return;
        }
        int n = ig_tls_read(ts->tls, b.base, b.len);
        stream_flush(ts);
        if (n > 0) {
            ts->read_cb(ts->s, n, &b);
            continue;
        }
        if (n == 0 && !ts->eof)
            return;
        ts->eof_told = 1;
        if (n == IG_EIO) {
            IG_DEBUG("upstream %s: TLS: %s", ts->name, ts->tls->error);
            ts->read_cb(ts->s, UV_EPROTO, &b);
        } else {
            ts->read_cb(ts->s, UV_EOF, &b);
        }
        return;
    }
}

static void on_stream_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    static _Thread_local char slab[65536]; /* fed to the session at once */
    buf->base = slab;
    buf->len = sizeof(slab);
}

static void on_stream_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    ig_tls_stream_t *ts = stream_find(s);
    if (ts == NULL || ts->closed || nread == 0)
        return;
    if (nread < 0) {
        ts->eof = 1;
        uv_read_stop(s);
        ts->raw_reading = 0;
    } else if (ig_tls_feed(ts->tls, buf->base, (size_t)nread) != 0) {
        ts->failed = 1;
    }
    if (!ts->ready_fired) {
        int hs = ts->failed ? IG_EIO : ig_tls_handshake(ts->tls);
        stream_flush(ts);
        if (hs == 0 && !ts->eof && !ts->failed)
            return;
        stream_ready(ts, hs == 1 && !ts->failed ? 0 : IG_EIO);
        if (hs != 1 || ts->closed)
            return;
    }
    stream_deliver(ts);
}

static void on_kick(uv_timer_t *t)
{
    ig_tls_stream_t *ts = t->data;
    if (ts->closed)
        return;
    if (!ts->ready_fired) {
        stream_ready(ts, IG_EIO);
        return;
    }
    stream_deliver(ts);
}

int ig_tls_stream_start(ig_tls_stream_t **out, uv_stream_t *s, ig_tls_ctx_t *ctx,
                        const char *server_name, const char *name, ig_tls_ready_cb cb, void *data)
{
    *out = NULL;
    ig_tls_stream_t *ts = calloc(1, sizeof(*ts));
    if (ts == NULL)
        return IG_ENOMEM;
    if (ig_tls_new(&ts->tls, ctx, 0, server_name) != 0) {
        free(ts);
        return IG_ENOMEM;
    }
    ts->s = s;
    ts->ready_cb = cb;
    ts->ready_data = data;
    snprintf(ts->name, sizeof(ts->name), "%s", name != NULL ? name : "?");
    uv_timer_init(s->loop, &ts->kick);
    ts->kick.data = ts;
    ts->next = streams;
    streams = ts;
    if (uv_read_start(s, on_stream_alloc, on_stream_read) == 0)
        ts->raw_reading = 1;
    else
        ts->failed = 1;
    if (!ts->failed && ig_tls_handshake(ts->tls) < 0)
        ts->failed = 1;
    stream_flush(ts);
    if (ts->failed)
        uv_timer_start(&ts->kick, on_kick, 0, 0); /* the failure, from the loop */
    *out = ts;
    return 0;
}

int ig_tls_stream_read_start(ig_tls_stream_t *ts, uv_stream_t *s, uv_alloc_cb alloc_cb,
                             uv_read_cb read_cb)
{
    if (ts == NULL)
        return uv_read_start(s, alloc_cb, read_cb);
    ts->alloc_cb = alloc_cb;
    ts->read_cb = read_cb;
    ts->user_reading = 1;
    if (!ts->raw_reading && !ts->eof) {
        int rc = uv_read_start(s, on_stream_alloc, on_stream_read);
        if (rc != 0 && rc != UV_EALREADY)
            return rc;
        ts->raw_reading = 1;
    }
    /* Plaintext (or the end) may already wait in the session. */
    if (SSL_pending(ts->tls->ssl) > 0 || BIO_ctrl_pending(ts->tls->rbio) > 0 || ts->eof)
        uv_timer_start(&ts->kick, on_kick, 0, 0);
    return 0;
}

int ig_tls_stream_read_stop(ig_tls_stream_t *ts, uv_stream_t *s)
{
    if (ts == NULL)
        return uv_read_stop(s);
    ts->user_reading = 0;
    if (ts->raw_reading && ts->ready_fired) {
        uv_read_stop(s);
        ts->raw_reading = 0;
    }
    return 0;
}

int ig_tls_stream_try_write(ig_tls_stream_t *ts, uv_stream_t *s, const uv_buf_t *buf)
{
    if (ts == NULL)
        return uv_try_write(s, buf, 1);
    if (ts->closed || ts->failed || !ig_tls_established(ts->tls))
        return UV_EPIPE;
    if (ig_tls_write(ts->tls, buf->base, buf->len) != 0)
        return UV_EPROTO;
    stream_flush(ts);
    return ts->failed ? UV_EPIPE : (int)buf->len;
}

static void on_kick_closed(uv_handle_t *h)
{
    ig_tls_stream_t *ts = h->data;
    ig_tls_free(ts->tls);
    free(ts);
}

void ig_tls_stream_close(ig_tls_stream_t *ts)
{
    if (ts == NULL || ts->closed)
        return;
    ts->closed = 1;
    if (ig_tls_established(ts->tls) && !ts->failed && !ts->eof) {
        ig_tls_shutdown(ts->tls);
        stream_flush(ts);
    }
    stream_unregister(ts);
    uv_close((uv_handle_t *)&ts->kick, on_kick_closed);
}
