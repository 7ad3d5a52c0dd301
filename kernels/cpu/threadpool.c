/*
 * A persistent pthread pool for the CPU backend. Each forward pass dispatches
 * a few dozen parallel sections per layer (a decode token of a 16-layer model
 * runs about 150), so the workers stay alive between sections.
 *
 * Sections hand out their work from a shared counter, so the caller never
 * waits for a worker that has not started yet: when the caller has run out
 * of work it closes the section, waits only for the workers inside it, and a
 * worker that wakes up later skips the closed section. On a machine whose
 * cores are shared, a descheduled worker then costs nothing.
 *
 * Between sections a worker spins for a short while (POOL_SPIN_US_DEFAULT) on the
 * section word before it sleeps on a condition variable, and the caller
 * spins while the workers inside its section finish. On a virtual machine a
 * futex wake-up costs tens of microseconds before the woken thread runs, and
 * a decode token waited on two of them per section (the worker's start and
 * the caller's end): a section of 25 us of work on one thread took 24 us on
 * two with condition variables alone, 12 us with the spin. An idle pool
 * spins only for the window after its last section, then sleeps.
 *
 * The section word `state` is (generation << 1 | closed). A worker joins a
 * section by counting itself in `active`, then checking that the word still
 * names that section open; the caller closes it by setting the closed bit,
 * then waits for `active` to reach 0. Both are sequentially consistent, so
 * either the worker sees the closed bit (and leaves without running) or the
 * caller sees the worker counted (and waits for it).
 */
#include "cpu_internal.h"

#include "infergate/error.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define POOL_PAUSE() __asm__ __volatile__("yield")
#else
#define POOL_PAUSE() ((void)0)
#endif

/* How long an idle worker spins before it sleeps, and the closing caller
 * for the workers still inside its section (IG_CPU_SPIN_US overrides it, 0
 * sleeps at once): longer than the gaps between the sections of one forward
 * pass (the single-threaded operations between two matmuls take a few
 * microseconds), short enough that an idle engine costs nothing and that a
 * machine with more runnable threads than cores loses little: there a
 * spinning thread spends its share of a core on nothing, where one that
 * sleeps is woken ahead of the others. */
#define POOL_SPIN_US_DEFAULT 50

struct ig__pool_s {
    int n; /* threads including the caller */
    pthread_t *threads;
    atomic_ulong state;  /* generation << 1 | closed */
    atomic_int active;   /* workers counted into a section (some leaving) */
    atomic_int sleepers; /* workers asleep or about to sleep on `work` */
    atomic_int closing;  /* the caller asleep or about to sleep on `done` */
    atomic_int stop;
    long spin_ns;
    pthread_mutex_t mu; /* for the sleepers only */
    pthread_cond_t work;
    pthread_cond_t done;
    ig__pool_fn fn; /* of the open section; written only while no worker is in one */
    void *arg;
};

typedef struct {
    ig__pool_t *pool;
    int tid;
} pool_worker_arg_t;

static long elapsed_ns(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000000000L + (t.tv_nsec - t0->tv_nsec);
}

/* Waits until the section word differs from `seen` or the pool stops:
 * spinning first, then asleep. Returns the new word. */
static unsigned long wait_section(ig__pool_t *pool, unsigned long seen)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0;; i++) {
        unsigned long s = atomic_load(&pool->state);
        if (s != seen || atomic_load(&pool->stop))
            return s;
        if ((i & 63) == 0 && elapsed_ns(&t0) >= pool->spin_ns)
            break;
        POOL_PAUSE();
    }
    pthread_mutex_lock(&pool->mu);
    atomic_fetch_add(&pool->sleepers, 1);
    unsigned long s;
    while ((s = atomic_load(&pool->state)) == seen && !atomic_load(&pool->stop))
        pthread_cond_wait(&pool->work, &pool->mu);
    atomic_fetch_sub(&pool->sleepers, 1);
    pthread_mutex_unlock(&pool->mu);
    return s;
}

static void *pool_worker(void *p)
{
    pool_worker_arg_t *wa = p;
    ig__pool_t *pool = wa->pool;
    int tid = wa->tid;
    unsigned long seen = 0; /* the word of the last section looked at */
    free(wa);

    for (;;) {
        unsigned long s = wait_section(pool, seen);
        if (atomic_load(&pool->stop))
            break;
        seen = s;
        if (s & 1)
            continue; /* closed: arrived after the caller finished the section */
        atomic_fetch_add(&pool->active, 1);
        if (atomic_load(&pool->state) == s) {
            /* Counted in an open section: it cannot end, nor fn change,
             * before this worker leaves. */
            pool->fn(pool->arg, tid, pool->n);
        }
        if (atomic_fetch_sub(&pool->active, 1) == 1 && atomic_load(&pool->closing)) {
            pthread_mutex_lock(&pool->mu);
            pthread_cond_signal(&pool->done);
            pthread_mutex_unlock(&pool->mu);
        }
    }
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
    atomic_init(&pool->state, 1); /* generation 0, closed */
    atomic_init(&pool->active, 0);
    atomic_init(&pool->sleepers, 0);
    atomic_init(&pool->closing, 0);
    atomic_init(&pool->stop, 0);
    const char *env = getenv("IG_CPU_SPIN_US");
    long us = env != NULL && *env != '\0' ? strtol(env, NULL, 10) : POOL_SPIN_US_DEFAULT;
    pool->spin_ns = (us < 0 ? 0 : us > 1000000 ? 1000000 : us) * 1000L;
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

static void wake_sleepers(ig__pool_t *pool)
{
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->mu);
        pthread_cond_broadcast(&pool->work);
        pthread_mutex_unlock(&pool->mu);
    }
}

void ig__pool_run(ig__pool_t *pool, ig__pool_fn fn, void *arg)
{
    if (pool->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    /* The previous section is closed and every worker that joined it has
     * left (or will leave without reading fn), so fn and arg are free. */
    unsigned long s = atomic_load(&pool->state);
    pool->fn = fn;
    pool->arg = arg;
    unsigned long open = (s | 1) + 1; /* the next generation, open */
    atomic_store(&pool->state, open);
    wake_sleepers(pool);

    fn(arg, 0, pool->n); /* returns when no work is left to take */

    atomic_store(&pool->state, open | 1);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; atomic_load(&pool->active) > 0; i++) {
        if ((i & 63) == 0 && elapsed_ns(&t0) >= pool->spin_ns) {
            /* A worker still inside: asleep until the last one leaves. */
            pthread_mutex_lock(&pool->mu);
            atomic_store(&pool->closing, 1);
            while (atomic_load(&pool->active) > 0)
                pthread_cond_wait(&pool->done, &pool->mu);
            atomic_store(&pool->closing, 0);
            pthread_mutex_unlock(&pool->mu);
            return;
        }
        POOL_PAUSE();
    }
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
    atomic_store(&pool->stop, 1);
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
