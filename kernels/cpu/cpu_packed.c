/*
 * The registry of packed weights: the data pointers cpu_backend.c packed at
 * upload (for the own GEMM, and those of them in gemm16.c's k-pairs), which
 * the operations ask about. Kept apart from the backend so the operations
 * call down into it, never back up into the backend that names them.
 */
#include "cpu_internal.h"

#include "infergate/error.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Index of the first entry >= p in a sorted list of n. */
static int ptr_find(const void *const *list, int n, const void *p)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if ((uintptr_t)list[mid] < (uintptr_t)p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int packed_find(const ig__cpu_t *c, const void *p)
{
    return ptr_find(c->packed, c->npacked, p);
}

/* Whether w's data is in the k-pair layout (locks packed_lock). */
int ig__cpu_is_pairs(ig__cpu_t *c, const ig_weight_t *w)
{
    pthread_mutex_lock(&c->packed_lock);
    int i = ptr_find(c->pairs, c->npairs, w->data);
    int found = i < c->npairs && c->pairs[i] == w->data;
    pthread_mutex_unlock(&c->packed_lock);
    return found;
}

int ig__cpu_pairs_add(ig__cpu_t *c, const void *p)
{
    int rc = 0;
    pthread_mutex_lock(&c->packed_lock);
    if (c->npairs == c->pairs_cap) {
        int cap = c->pairs_cap ? 2 * c->pairs_cap : 64;
        const void **np = realloc(c->pairs, (size_t)cap * sizeof(*np));
        if (np == NULL) {
            rc = IG_ENOMEM;
            goto out;
        }
        c->pairs = np;
        c->pairs_cap = cap;
    }
    int i = ptr_find(c->pairs, c->npairs, p);
    memmove(c->pairs + i + 1, c->pairs + i, (size_t)(c->npairs - i) * sizeof(*c->pairs));
    c->pairs[i] = p;
    c->npairs++;
out:
    pthread_mutex_unlock(&c->packed_lock);
    return rc;
}

void ig__cpu_pairs_remove(ig__cpu_t *c, const void *p)
{
    pthread_mutex_lock(&c->packed_lock);
    int i = ptr_find(c->pairs, c->npairs, p);
    if (i < c->npairs && c->pairs[i] == p) {
        memmove(c->pairs + i, c->pairs + i + 1, (size_t)(c->npairs - i - 1) * sizeof(*c->pairs));
        c->npairs--;
    }
    pthread_mutex_unlock(&c->packed_lock);
}

/* Whether w's data is in the own GEMM's packed layout. */
int ig__cpu_is_packed(ig__cpu_t *c, const ig_weight_t *w)
{
    pthread_mutex_lock(&c->packed_lock);
    int i = packed_find(c, w->data);
    int found = i < c->npacked && c->packed[i] == w->data;
    pthread_mutex_unlock(&c->packed_lock);
    return found;
}

int ig__cpu_packed_add(ig__cpu_t *c, const void *p)
{
    int rc = 0;
    pthread_mutex_lock(&c->packed_lock);
    if (c->npacked == c->packed_cap) {
        int cap = c->packed_cap ? 2 * c->packed_cap : 64;
        const void **np = realloc(c->packed, (size_t)cap * sizeof(*np));
        if (np == NULL) {
            rc = IG_ENOMEM;
            goto out;
        }
        c->packed = np;
        c->packed_cap = cap;
    }
    int i = packed_find(c, p);
    memmove(c->packed + i + 1, c->packed + i, (size_t)(c->npacked - i) * sizeof(*c->packed));
    c->packed[i] = p;
    c->npacked++;
out:
    pthread_mutex_unlock(&c->packed_lock);
    return rc;
}

void ig__cpu_packed_remove(ig__cpu_t *c, const void *p)
{
    pthread_mutex_lock(&c->packed_lock);
    int i = packed_find(c, p);
    if (i < c->npacked && c->packed[i] == p) {
        memmove(c->packed + i, c->packed + i + 1,
                (size_t)(c->npacked - i - 1) * sizeof(*c->packed));
        c->npacked--;
    }
    pthread_mutex_unlock(&c->packed_lock);
}
