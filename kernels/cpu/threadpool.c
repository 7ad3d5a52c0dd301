/*
 * A persistent pthread pool for the CPU backend. Each forward pass dispatches
 * a few dozen parallel sections, so the workers stay alive and wait on a
 * condition variable between sections instead of being created per call.
 *
 * Sections hand out their work from a shared counter, so the caller never
 * waits for a worker that has not started yet: when the caller has run out
 * of work it closes the section, waits only for the workers inside it, and a
 * worker that wakes up later skips the closed section. On a machine whose
 * cores are shared, a descheduled worker then costs nothing.
 */
#include "cpu_internal.h"

#include "infergate/error.h"

#include <pthread.h>
#include <stdlib.h>

struct ig__pool_s {
    int n; /* threads including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work; /* a new section (generation changed) or stop */
    pthread_cond_t done; /* pending reached 0 */
    unsigned long generation;
    int active; /* workers inside the current section */
    int closed; /* the current section takes no more workers */
    int stop;
    ig__pool_fn fn;
    void *arg;
};

typedef struct {
    ig__pool_t *pool;
    int tid;
} pool_worker_arg_t;

static void *pool_worker(void *p)
{
    pool_worker_arg_t *wa = p;
    ig__pool_t *pool = wa->pool;
    int tid = wa->tid;
    unsigned long seen = 0;
    free(wa);

    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (!pool->stop && pool->generation == seen)
            pthread_cond_wait(&pool->work, &pool->mu);
        if (pool->stop)
            break;
        seen = pool->generation;
        if (pool->closed)
            continue; /* arrived after the caller finished the section */
        pool->active++;
        ig__pool_fn fn = pool->fn;
        void *arg = pool->arg;
        pthread_mutex_unlock(&pool->mu);
        fn(arg, tid, pool->n);
        pthread_mutex_lock(&pool->mu);
        if (--pool->active == 0 && pool->closed)
            pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

int ig__pool_create(ig__pool_t **out, int nthreads)
{
    ig__pool_t *pool = calloc(1, sizeof(*pool));
    if (pool == NULL)
        return IG_ENOMEM;
    if (nthreads < 1)
        nthreads = 1;
    pool->n = 1;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->work, NULL);
    pthread_cond_init(&pool->done, NULL);
    pool->threads = calloc((size_t)nthreads, sizeof(pthread_t));
    if (pool->threads == NULL)
        goto fail;
    for (int t = 1; t < nthreads; t++) {
        pool_worker_arg_t *wa = malloc(sizeof(*wa));
        if (wa == NULL)
            goto fail;
        wa->pool = pool;
        wa->tid = t;
        if (pthread_create(&pool->threads[t], NULL, pool_worker, wa) != 0) {
            free(wa);
            goto fail;
        }
        pool->n = t + 1;
    }
    *out = pool;
    return 0;

fail:
    ig__pool_free(pool);
    return IG_ENOMEM;
}

void ig__pool_run(ig__pool_t *pool, ig__pool_fn fn, void *arg)
{
    if (pool->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool->mu);
    pool->fn = fn;
    pool->arg = arg;
    pool->active = 0;
    pool->closed = 0;
    pool->generation++;
    pthread_cond_broadcast(&pool->work);
    pthread_mutex_unlock(&pool->mu);

    fn(arg, 0, pool->n); /* returns when no work is left to take */

    pthread_mutex_lock(&pool->mu);
    pool->closed = 1;
    while (pool->active > 0)
        pthread_cond_wait(&pool->done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}

int ig__pool_size(const ig__pool_t *pool)
{
    return pool->n;
}

void ig__pool_free(ig__pool_t *pool)
{
    if (pool == NULL)
        return;
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->work);
    pthread_mutex_unlock(&pool->mu);
    for (int t = 1; t < pool->n; t++)
        pthread_join(pool->threads[t], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->work);
    pthread_cond_destroy(&pool->done);
    free(pool->threads);
    free(pool);
}
