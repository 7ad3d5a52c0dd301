#include "infergate/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <uv.h>

const char *ig_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
#define XX(name, n, msg)                                                                           \
    case IG_##name:                                                                                \
        return msg;
        IG_ERRNO_MAP(XX)
#undef XX
    default:
        return uv_strerror(err);
    }
}

const char *ig_err_name(int err)
{
    switch (err) {
    case 0:
        return "IG_OK";
#define XX(name, n, msg)                                                                           \
    case IG_##name:                                                                                \
        return "IG_" #name;
        IG_ERRNO_MAP(XX)
#undef XX
    default:
        return uv_err_name(err);
    }
}

void ig_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}
