/* Handing memory pages back (include/infergate/page_release.h). */
#include "infergate/page_release.h"

#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

void ig_pages_release(const void *p, size_t bytes)
{
#ifdef MADV_PAGEOUT
    long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0)
        return;
    uintptr_t b = ((uintptr_t)p + (uintptr_t)ps - 1) & ~((uintptr_t)ps - 1);
    uintptr_t e = ((uintptr_t)p + bytes) & ~((uintptr_t)ps - 1);
    if (e > b)
        (void)madvise((void *)b, e - b, MADV_PAGEOUT);
#else
    (void)p;
    (void)bytes;
#endif
}
