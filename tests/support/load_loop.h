#ifndef IG_TEST_LOAD_LOOP_H
#define IG_TEST_LOAD_LOOP_H

/*
 * Closed-loop load on a gateway, for the autoscaling tests: up to
 * IG_LOAD_MAX threads, each sending completions (ig_gwf_complete) one after
 * another until the group is stopped or it has sent 2000, counting what it
 * sent, what was answered 200 and what failed, and the answers by the
 * upstream that served them: by_upstream[i] counts those whose
 * x-infergate-upstream starts with prefixes[i] (the first that matches).
 * Header-only, as burst.h.
 */

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "gwfixture.h"

#define IG_LOAD_MAX 16
#define IG_LOAD_UPSTREAMS 4

typedef struct {
    int port, max_tokens;
    /* NULL-terminated, at most IG_LOAD_UPSTREAMS; NULL counts none. */
    const char *const *prefixes;
    volatile int *stop;
    int sent, ok, failed;
    int by_upstream[IG_LOAD_UPSTREAMS];
} ig_load_t;

typedef struct {
    pthread_t th[IG_LOAD_MAX];
    ig_load_t one[IG_LOAD_MAX];
    int n;
    volatile int stop;
} ig_load_group_t;

/* Counts r's answer under the first of l's prefixes its upstream starts with. */
static inline void ig_load_count(ig_load_t *l, const ig_tc_response_t *r)
{
    const char *u = ig_tc_header(r, "x-infergate-upstream");
    for (int i = 0; u != NULL && l->prefixes != NULL && i < IG_LOAD_UPSTREAMS && l->prefixes[i];
         i++)
        if (strncmp(u, l->prefixes[i], strlen(l->prefixes[i])) == 0) {
            l->by_upstream[i]++;
            return;
        }
}

static void *ig_load_thread(void *arg)
{
    ig_load_t *l = arg;
    for (int i = 0; i < 2000 && !__atomic_load_n(l->stop, __ATOMIC_SEQ_CST); i++) {
        ig_tc_response_t r;
        l->sent++;
        int rc = ig_gwf_complete(l->port, l->max_tokens, &r);
        if (rc == 0 && r.status == 200) {
            l->ok++;
            ig_load_count(l, &r);
        } else {
            l->failed++;
            fprintf(stderr, "request failed: rc %d status %d %s\n", rc, rc == 0 ? r.status : 0,
                    rc == 0 && r.body ? r.body : "");
        }
        if (rc == 0)
            ig_tc_response_free(&r);
    }
    return NULL;
}

/* Starts n threads (at most IG_LOAD_MAX), each a copy of proto. */
static inline void ig_load_start(ig_load_group_t *g, int n, ig_load_t proto)
{
    g->n = n < IG_LOAD_MAX ? n : IG_LOAD_MAX;
    g->stop = 0;
    for (int i = 0; i < g->n; i++) {
        g->one[i] = proto;
        g->one[i].stop = &g->stop;
        pthread_create(&g->th[i], NULL, ig_load_thread, &g->one[i]);
    }
}

/* The answers from prefixes[i] so far, over all the threads. */
static inline int ig_load_served(const ig_load_group_t *g, int i)
{
    int n = 0;
    for (int t = 0; t < g->n; t++)
        n += __atomic_load_n(&g->one[t].by_upstream[i], __ATOMIC_RELAXED);
    return n;
}

/* Stops the threads and joins them; their counts, summed. */
static inline ig_load_t ig_load_stop(ig_load_group_t *g)
{
    ig_load_t sum = {0};
    __atomic_store_n(&g->stop, 1, __ATOMIC_SEQ_CST);
    for (int t = 0; t < g->n; t++) {
        pthread_join(g->th[t], NULL);
        sum.sent += g->one[t].sent;
        sum.ok += g->one[t].ok;
        sum.failed += g->one[t].failed;
        for (int i = 0; i < IG_LOAD_UPSTREAMS; i++)
            sum.by_upstream[i] += g->one[t].by_upstream[i];
    }
    return sum;
}

#endif
