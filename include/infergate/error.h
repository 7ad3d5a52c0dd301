#ifndef INFERGATE_ERROR_H
#define INFERGATE_ERROR_H

#include <stddef.h>

/*
 * Error codes. Every function that can fail returns 0 or one of these negative
 * codes; ig_strerror() gives the sentence. Add new codes at the end of the
 * table so that existing numbers never move. The codes live below
 * IG__ERR_BASE so that they never collide with libuv's negated errno values,
 * which functions may pass through.
 */
#define IG__ERR_BASE (-10000)

#define IG_ERRNO_MAP(XX)                                                                           \
    XX(EINVAL, 1, "invalid argument")                                                              \
    XX(ENOMEM, 2, "out of memory")                                                                 \
    XX(EIO, 3, "input/output error")                                                               \
    XX(ENOENT, 4, "no such file or directory")                                                     \
    XX(ERANGE, 5, "value out of range")                                                            \
    XX(EPARSE, 6, "malformed input")                                                               \
    XX(ECONFIG, 7, "invalid configuration")                                                        \
    XX(EMODEL, 8, "invalid model files")                                                           \
    XX(ETOKENIZER, 9, "invalid tokenizer")                                                         \
    XX(ENOTSUP, 10, "not supported")                                                               \
    XX(EBUSY, 11, "resource busy")                                                                 \
    XX(EFULL, 12, "queue full")                                                                    \
    XX(ETIMEDOUT, 13, "timed out")                                                                 \
    XX(ECANCELED, 14, "canceled")                                                                  \
    XX(ECLOSED, 15, "connection closed")                                                           \
    XX(ECONNECT, 16, "connection failed")                                                          \
    XX(EUPSTREAM, 17, "upstream error")                                                            \
    XX(ENOUPSTREAM, 18, "no upstream available")                                                   \
    XX(EDEVICE, 19, "device error")                                                                \
    XX(ENOKV, 20, "KV cache exhausted")                                                            \
    XX(ETOOLONG, 21, "input too long")                                                             \
    XX(EEXIST, 22, "already exists")                                                               \
    XX(ESTATE, 23, "invalid state")

typedef enum {
    IG_OK = 0,
#define XX(name, n, msg) IG_##name = IG__ERR_BASE - (n),
    IG_ERRNO_MAP(XX)
#undef XX
} ig_errno_t;

/* Returns a static sentence for an IG_E* code (or a negated errno value from
 * libuv, which it passes to uv_strerror). Never NULL. */
const char *ig_strerror(int err);

/* Returns the symbolic name ("IG_EINVAL", or libuv's name) of a code. */
const char *ig_err_name(int err);

/* Formats a message into a caller's error buffer err(errlen), the way every
 * "char *err, size_t errlen" parameter is filled: truncated to fit, always
 * terminated; nothing happens when err is NULL or errlen is 0. */
void ig_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
