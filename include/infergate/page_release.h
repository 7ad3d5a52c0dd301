#ifndef INFERGATE_PAGE_RELEASE_H
#define INFERGATE_PAGE_RELEASE_H

#include <stddef.h>

/*
 * Hands the memory pages inside [p, p + bytes) back to the kernel
 * (madvise MADV_PAGEOUT; a partial page at either end is kept): a mapped
 * file's pages are dropped and read again if touched, anonymous ones are
 * swapped out. Used once a packed or quantized copy of a weight exists, so
 * that the process holds one of the two. A no-op without MADV_PAGEOUT.
 */
void ig_pages_release(const void *p, size_t bytes);

#endif
