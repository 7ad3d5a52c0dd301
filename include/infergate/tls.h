#ifndef INFERGATE_TLS_H
#define INFERGATE_TLS_H

/*
 * TLS on OpenSSL memory BIOs, for connections whose bytes move over libuv
 * streams: the caller reads ciphertext from its socket and feeds it in,
 * takes plaintext out, hands plaintext in and sends the ciphertext that
 * comes out. Nothing here touches a socket, so the server's and the
 * upstream client's own buffering, deadlines and limits stay the ones of
 * plain HTTP.
 *
 * Defaults (docs/security.md): TLS 1.2 and 1.3 only; for TLS 1.2 only
 * ECDHE key exchange with AEAD ciphers (AES-GCM, ChaCha20-Poly1305); no
 * compression, no renegotiation. A client context verifies the peer's chain
 * and its name unless told insecure.
 *
 * Contexts are reference counted: a session holds one, so that replacing
 * the server's context (certificates reloaded on SIGHUP) leaves the
 * connections that are open on the old one as they are.
 */

#include <stddef.h>
#include <uv.h>

typedef struct ig_tls_ctx_s ig_tls_ctx_t;
typedef struct ig_tls_s ig_tls_t;

/*
 * A server context from PEM files (the certificate file may hold the chain
 * after the leaf). 0, or IG_ECONFIG with the reason in err (a file that
 * cannot be read, a key that does not match the certificate).
 */
int ig_tls_server_ctx_new(ig_tls_ctx_t **out, const char *cert_file, const char *key_file,
                          char *err, size_t errlen);

/*
 * A client context: it verifies against ca_file (PEM, may hold several) or,
 * when ca_file is NULL, against the system's CAs. insecure turns the
 * verification off (tests, and nothing else). 0 or IG_ECONFIG.
 */
int ig_tls_client_ctx_new(ig_tls_ctx_t **out, const char *ca_file, int insecure, char *err,
                          size_t errlen);

/* Reference counting; the last unref frees. NULL is accepted. */
void ig_tls_ctx_ref(ig_tls_ctx_t *ctx);
void ig_tls_ctx_unref(ig_tls_ctx_t *ctx);

/*
 * A session on ctx. A client session sends server_name as SNI and checks
 * the certificate against it (a host name or an IP address). 0 or
 * IG_ENOMEM.
 */
int ig_tls_new(ig_tls_t **out, ig_tls_ctx_t *ctx, int is_server, const char *server_name);
void ig_tls_free(ig_tls_t *tls);

/* Ciphertext from the peer. 0 or IG_ENOMEM. */
int ig_tls_feed(ig_tls_t *tls, const char *data, size_t len);

/*
 * Plaintext out, driving the handshake as needed: bytes (> 0), 0 when more
 * ciphertext is needed, IG_ECLOSED when the peer sent close_notify, or
 * IG_EIO when the handshake or a record failed (the reason:
 * ig_tls_error()). Whatever this produced for the peer (handshake
 * messages, alerts, tickets) waits in ig_tls_take().
 */
int ig_tls_read(ig_tls_t *tls, char *buf, size_t cap);

/* Starts or continues the handshake without reading application data:
 * 1 when established, 0 when waiting for the peer, IG_EIO on failure. */
int ig_tls_handshake(ig_tls_t *tls);

/* Plaintext to the peer, all of it, once the handshake is done. 0 or
 * IG_EIO. The ciphertext waits in ig_tls_take(). */
int ig_tls_write(ig_tls_t *tls, const char *data, size_t len);

/* Queues close_notify (ig_tls_take() has it). */
void ig_tls_shutdown(ig_tls_t *tls);

/* Ciphertext for the peer: copies up to cap bytes, returns how many
 * (0: none waits). */
size_t ig_tls_take(ig_tls_t *tls, char *buf, size_t cap);

/* 1 once the handshake has completed. */
int ig_tls_established(const ig_tls_t *tls);

/* The last failure as a sentence ("certificate verify failed: ..."), or "". */
const char *ig_tls_error(const ig_tls_t *tls);

/* ---- a TLS client over a connected libuv stream ------------------------- */

/*
 * For the upstream client (gateway/route/upstream.c): TLS under a stream
 * the caller owns, with calls shaped like libuv's so that its code keeps
 * its form. Reads deliver plaintext to the caller's uv_read_cb, with the
 * caller's stream as the argument (its data pointer stays the caller's);
 * nread UV_EOF at the peer's close (or close_notify), UV_EPROTO when a
 * record fails. Every function takes ts NULL for a plain connection and
 * then does exactly what libuv would.
 */
typedef struct ig_tls_stream_s ig_tls_stream_t;
typedef void (*ig_tls_ready_cb)(ig_tls_stream_t *ts, int status, void *data);

/*
 * Starts the handshake on the connected stream s: cb fires once, from the
 * loop, with 0 when the peer's certificate verified (and names
 * server_name), or IG_EIO (the reason is logged at warn level, prefixed
 * by name). 0 with *out set, or IG_ENOMEM (nothing started, cb never
 * fires). The handshake has no deadline of its own: the caller's connect
 * deadline covers it.
 */
int ig_tls_stream_start(ig_tls_stream_t **out, uv_stream_t *s, ig_tls_ctx_t *ctx,
                        const char *server_name, const char *name, ig_tls_ready_cb cb, void *data);

/* uv_read_start / uv_read_stop / uv_try_write for the stream. A TLS write
 * takes all of it (the ciphertext is queued on the stream as needed) and
 * returns its length, or a negative libuv error. */
int ig_tls_stream_read_start(ig_tls_stream_t *ts, uv_stream_t *s, uv_alloc_cb alloc_cb,
                             uv_read_cb read_cb);
int ig_tls_stream_read_stop(ig_tls_stream_t *ts, uv_stream_t *s);
int ig_tls_stream_try_write(ig_tls_stream_t *ts, uv_stream_t *s, const uv_buf_t *buf);

/* Before the caller closes the stream: sends close_notify when it can and
 * frees ts (later, from the loop). NULL is accepted. */
void ig_tls_stream_close(ig_tls_stream_t *ts);

#endif
