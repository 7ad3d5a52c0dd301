/*
 * TLS over OpenSSL memory BIOs (see include/infergate/tls.h).
 *
 * Each session has two memory BIOs: rbio holds the ciphertext the peer
 * sent, wbio the ciphertext for the peer. SSL_read and SSL_write never see
 * a socket, so a "would block" from them only ever means "feed more".
 */
#include "infergate/tls.h"
#include "infergate/error.h"

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

int ig_tls_server_ctx_new(ig_tls_ctx_t **out, const char *cert_file, const char *key_file,
                          char *err, size_t errlen)
{
    char why[256];
    *out = NULL;
    ig_tls_ctx_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return IG_ENOMEM;
    c->is_server = 1;
    atomic_init(&c->refs, 1);
    c->ssl = ctx_common(TLS_server_method());
    if (c->ssl == NULL) {
        openssl_reason(why, sizeof(why));
        ig_errf(err, errlen, "cannot set up TLS: %s", why);
        goto fail;
    }
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
    if (c->ssl != NULL)
        SSL_CTX_free(c->ssl);
    free(c);
    return IG_ECONFIG;
}

int ig_tls_client_ctx_new(ig_tls_ctx_t **out, const char *ca_file, int insecure, char *err,
                          size_t errlen)
{
    char why[256];
    *out = NULL;
    ig_tls_ctx_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return IG_ENOMEM;
    atomic_init(&c->refs, 1);
    c->insecure = insecure;
    c->ssl = ctx_common(TLS_client_method());
    if (c->ssl == NULL) {
        openssl_reason(why, sizeof(why));
        ig_errf(err, errlen, "cannot set up TLS: %s", why);
        goto fail;
    }
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
    if (c->ssl != NULL)
        SSL_CTX_free(c->ssl);
    free(c);
    return IG_ECONFIG;
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
