/* Scheduler on its engine thread: submit and cancel from another thread,
 * events announced through notify, stop cancels what is left. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "scheduler_fake.h"

#include <pthread.h>
#include <time.h>

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int notified;
} notifier_t;

static void on_notify(void *data)
{
    notifier_t *n = data;
    pthread_mutex_lock(&n->mu);
    n->notified++;
    pthread_cond_signal(&n->cv);
    pthread_mutex_unlock(&n->mu);
}

/* Waits for a notification (bounded: 5 s). */
static int wait_notify(notifier_t *n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 5;
    pthread_mutex_lock(&n->mu);
    int rc = 0;
    while (!n->notified && rc == 0)
        rc = pthread_cond_timedwait(&n->cv, &n->mu, &ts);
    n->notified = 0;
    pthread_mutex_unlock(&n->mu);
    return rc == 0;
}

static void *stop_thread(void *arg)
{
    ig_sched_stop(arg);
    return NULL;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int count_done(collector_t *col)
{
    int d = 0;
    for (int i = 0; i < col->n; i++)
        d += col->c[i].finish != IG_FINISH_NONE;
    return d;
}

static void test_thread_roundtrip(void **state)
{
    fake_engine_t fe;
    fake_init(&fe, 64, 4);
    ig_sched_engine_t e = fake_iface(&fe);
    ig_sched_detok_t d = {NULL, fake_piece};
    notifier_t n = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    ig_sched_opts_t o;
    ig_sched_opts_default(&o);
    o.max_batched_tokens = 64;
    o.max_num_seqs = 8;
    o.notify = on_notify;
    o.notify_data = &n;
    ig_sched_t *s;
    assert_int_equal(ig_sched_create(&s, &e, &d, &o), 0);
    assert_int_equal(ig_sched_start(s), 0);

    collector_t *col = calloc(1, sizeof(*col));
    int prompt[6] = {1, 2, 3, 4, 5, 6};
    ig_sched_req_t r = fake_req(prompt, 6, 20, 0);
    uint64_t ids[4];
    for (int i = 0; i < 4; i++) {
        r.seed = (uint64_t)i;
        assert_int_equal(ig_sched_submit(s, &r, &ids[i]), 0);
    }
    for (int k = 0; k < 1000 && count_done(col) < 4; k++) {
        wait_notify(&n);
        ig_sched_drain(s, collect_cb, col);
    }
    assert_int_equal(count_done(col), 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(collector_get(col, ids[i])->ntokens, 20);

    /* A long one, cancelled from this thread while it runs. */
    r.max_tokens = 200;
    uint64_t long_id;
    fake_gate(&fe, 1, 3);
    assert_int_equal(ig_sched_submit(s, &r, &long_id), 0);
    while (collector_get(col, long_id)->ntokens < 3) {
        assert_true(wait_notify(&n));
        ig_sched_drain(s, collect_cb, col);
    }
    ig_sched_cancel(s, long_id);
    fake_gate(&fe, 0, 0);
    for (int k = 0; k < 1000 && collector_get(col, long_id)->finish == IG_FINISH_NONE; k++) {
        wait_notify(&n);
        ig_sched_drain(s, collect_cb, col);
    }
    assert_int_equal(collector_get(col, long_id)->finish, IG_FINISH_CANCELLED);
    ig_sched_stats_t st;
    ig_sched_stats(s, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_true(st.decode_tokens_per_s > 0);

    /* Stop with one in flight: it ends CANCELLED. The gate holds the engine
     * inside a forward pass until stop() has been requested (seen through
     * submit refusing with IG_ESTATE), so the sequence cannot finish first. */
    uint64_t last, extra;
    fake_gate(&fe, 1, 1);
    assert_int_equal(ig_sched_submit(s, &r, &last), 0);
    while (collector_get(col, last)->ntokens < 1) {
        assert_true(wait_notify(&n));
        ig_sched_drain(s, collect_cb, col);
    }
    pthread_t stopper;
    assert_int_equal(pthread_create(&stopper, NULL, stop_thread, s), 0);
    long long t0 = now_ms();
    int rc;
    r.max_tokens = 1;
    while ((rc = ig_sched_submit(s, &r, &extra)) != IG_ESTATE && now_ms() - t0 < 5000)
        ig_sched_cancel(s, extra);
    assert_int_equal(rc, IG_ESTATE);
    fake_gate(&fe, 0, 0);
    pthread_join(stopper, NULL);
    ig_sched_drain(s, collect_cb, col);
    assert_int_equal(collector_get(col, last)->finish, IG_FINISH_CANCELLED);
    ig_sched_free(s); /* gives the cached blocks back */
    assert_int_equal(fe.nfree, 64);
    fake_dispose(&fe);
    free(col);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thread_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
