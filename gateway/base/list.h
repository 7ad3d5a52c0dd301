/*
 * The intrusive doubly-linked list of the project (the idea of libuv's
 * queue.h and h2o's linklist.h, our own code). A list is a circular chain
 * through a sentinel head; an element embeds an ig_list_t and is found back
 * with IG_LIST_DATA. Header-only and private to gateway/ (include it as
 * "base/list.h"): no allocation, no locking, O(1) insert and remove.
 *
 * An element whose node is zeroed (calloc) or was removed is "unlinked":
 * ig_list_linked() says so, and removing it again does nothing.
 */
#ifndef IG_BASE_LIST_H
#define IG_BASE_LIST_H

#include <stddef.h>

typedef struct ig_list_s {
    struct ig_list_s *next, *prev;
} ig_list_t;

/* The element of type that holds node as its member field. */
#define IG_LIST_DATA(node, type, field) ((type *)(void *)((char *)(node)-offsetof(type, field)))

/* Walks the nodes of head in order; the loop body must not remove it. */
#define IG_LIST_FOREACH(it, head) for ((it) = (head)->next; (it) != (head); (it) = (it)->next)

/* The same, where the body may remove (or free) it: tmp holds the next one. */
#define IG_LIST_FOREACH_SAFE(it, tmp, head)                                                        \
    for ((it) = (head)->next, (tmp) = (it)->next; (it) != (head); (it) = (tmp), (tmp) = (it)->next)

static inline void ig_list_init(ig_list_t *head)
{
    head->next = head->prev = head;
}

static inline int ig_list_empty(const ig_list_t *head)
{
    return head->next == head;
}

/* 1 when node is in a list. */
static inline int ig_list_linked(const ig_list_t *node)
{
    return node->next != NULL;
}

/* The first (last) node, or NULL when the list is empty. */
static inline ig_list_t *ig_list_first(const ig_list_t *head)
{
    return head->next == head ? NULL : head->next;
}

static inline ig_list_t *ig_list_last(const ig_list_t *head)
{
    return head->prev == head ? NULL : head->prev;
}

/* Inserts node (unlinked) after at: at may be the head or an element. */
static inline void ig_list_insert_after(ig_list_t *at, ig_list_t *node)
{
    node->prev = at;
    node->next = at->next;
    at->next->prev = node;
    at->next = node;
}

static inline void ig_list_push_front(ig_list_t *head, ig_list_t *node)
{
    ig_list_insert_after(head, node);
}

static inline void ig_list_push_back(ig_list_t *head, ig_list_t *node)
{
    ig_list_insert_after(head->prev, node);
}

/* Takes node out of its list; an unlinked node is left as it is. */
static inline void ig_list_remove(ig_list_t *node)
{
    if (node->next == NULL)
        return;
    node->prev->next = node->next;
    node->next->prev = node->prev;
    node->next = node->prev = NULL;
}

/* Removes and returns the first node, or NULL when the list is empty. */
static inline ig_list_t *ig_list_pop_front(ig_list_t *head)
{
    ig_list_t *n = ig_list_first(head);
    if (n)
        ig_list_remove(n);
    return n;
}

/* Moves every node of src to dst (whatever dst held is forgotten); src is
 * left empty. */
static inline void ig_list_move(ig_list_t *dst, ig_list_t *src)
{
    if (src->next == src) {
        ig_list_init(dst);
        return;
    }
    dst->next = src->next;
    dst->prev = src->prev;
    dst->next->prev = dst;
    dst->prev->next = dst;
    ig_list_init(src);
}

/* The number of nodes: O(n), for tests and assertions. */
static inline size_t ig_list_count(const ig_list_t *head)
{
    size_t n = 0;
    for (const ig_list_t *it = head->next; it != head; it = it->next)
        n++;
    return n;
}

#endif
