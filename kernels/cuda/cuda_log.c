/*
 * ig_log inside libinfergate_cuda.so: forwards to the logger of the process
 * that loaded the module (ig__cuda_host_t, kept at its entry, cuda_module.c),
 * so that its level and format apply. A file of its own, below the backend
 * that logs and the entry that names the backend.
 */
#include "cuda_module.h"

static ig__cuda_host_t host;

void ig__cuda_log_host(const ig__cuda_host_t *h)
{
    host = *h;
}

void ig_log(ig_log_level_t level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (host.logv != NULL)
        host.logv(level, fmt, ap);
    va_end(ap);
}
