/* The scheduler's KV event log (ig_sched_kv_events, ig_sched_kv_snapshot)
 * with the fake engine: every block committed is one STORED event with the
 * hash ig_prefix_hashes gives and its parent, every eviction one REMOVED
 * event; the snapshot plus the events after it is the cache; a reader that
 * falls more than the ring behind gets IG_ERANGE (and a snapshot puts it
 * right), so the log never grows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/error.h"
#include "infergate/prefix.h"
#include "scheduler_fake.h"

#define BS 4
#define BLOCKS 16

static ig_sched_t *sched_new(fake_engine_t *fe)
{
    fake_init(fe, BLOCKS, BS);
    ig_sched_engine_t e = fake_iface(fe);
    ig_sched_detok_t d = {NULL, fake_piece};
    ig_sched_opts_t o;
    fake_sched_opts(&o, 64, 4, 64);
    o.prefix_cache = 1;
    o.prefix_seed = ig_prefix_seed("fake");
    ig_sched_t *s;
    assert_int_equal(ig_sched_create(&s, &e, &d, &o), 0);
    return s;
}

/* Runs prompt `salt` (n tokens, 1 generated) to its end. */
static void run_prompt(ig_sched_t *s, int salt, int n, int *p)
{
    for (int i = 0; i < n; i++)
        p[i] = (i * 7 + salt * 11 + i / 5) % 26;
    ig_sched_req_t r = fake_req(p, n, 1, 0);
    r.sampling.temperature = 0;
    uint64_t id;
    assert_int_equal(ig_sched_submit(s, &r, &id), 0);
    collector_t *col = calloc(1, sizeof(*col));
    assert_non_null(col);
    for (int steps = 0; steps < 1000; steps++) {
        ig_sched_step(s);
        ig_sched_drain(s, collect_cb, col);
        if (col->n && col->c[0].finish != IG_FINISH_NONE)
            break;
    }
    assert_int_equal(col->n, 1);
    assert_int_not_equal(col->c[0].finish, IG_FINISH_NONE);
    free(col);
}

typedef struct {
    uint64_t h[BLOCKS * 4];
    int n;
} set_t;

static int find(const set_t *x, uint64_t h)
{
    for (int i = 0; i < x->n; i++)
        if (x->h[i] == h)
            return i;
    return -1;
}

/* Applies the events after *seq to x; the number applied. */
static int follow(ig_sched_t *s, uint64_t *seq, set_t *x)
{
    ig_kv_event_t ev[256];
    int n = ig_sched_kv_events(s, *seq, ev, 256);
    assert_true(n >= 0);
    for (int i = 0; i < n; i++) {
        assert_int_equal(ev[i].seq, *seq + 1 + (uint64_t)i);
        int at = find(x, ev[i].hash);
        if (ev[i].kind == IG_KV_STORED) {
            assert_int_equal(at, -1);
            x->h[x->n++] = ev[i].hash;
        } else {
            assert_int_equal(ev[i].kind, IG_KV_REMOVED);
            assert_true(at >= 0);
            x->h[at] = x->h[--x->n];
        }
    }
    if (n > 0)
        *seq = ev[n - 1].seq;
    return n;
}

static void snapshot(ig_sched_t *s, uint64_t *seq, set_t *x)
{
    uint64_t p[BLOCKS];
    x->n = ig_sched_kv_snapshot(s, x->h, p, BLOCKS, seq);
    assert_true(x->n >= 0 && x->n <= BLOCKS);
}

static void test_events_follow_the_cache(void **state)
{
    (void)state;
    fake_engine_t fe;
    ig_sched_t *s = sched_new(&fe);
    set_t x = {0};
    uint64_t seq = 0;
    snapshot(s, &seq, &x);
    assert_int_equal(x.n, 0);
    assert_int_equal(seq, 0);

    int p[64];
    run_prompt(s, 1, 18, p); /* 4 full blocks (18 + 1 generated < 20) */
    uint64_t h[8];
    int nh = ig_prefix_hashes(ig_prefix_seed("fake"), p, 18, BS, h, 8);
    ig_kv_event_t ev[16];
    int n = ig_sched_kv_events(s, 0, ev, 16);
    assert_int_equal(n, nh);
    for (int i = 0; i < n; i++) {
        assert_int_equal(ev[i].kind, IG_KV_STORED);
        assert_int_equal(ev[i].seq, (uint64_t)i + 1);
        assert_true(ev[i].hash == h[i]);
        assert_true(ev[i].parent == (i ? h[i - 1] : ig_prefix_seed("fake")));
    }
    assert_int_equal(follow(s, &seq, &x), nh);

    /* Other prompts push it out: removals, and the follower stays equal
     * to a fresh snapshot. */
    int removed = 0;
    for (int salt = 2; salt < 8; salt++) {
        run_prompt(s, salt, 40, p);
        ig_kv_event_t e2[256];
        int m = ig_sched_kv_events(s, seq, e2, 256);
        for (int i = 0; i < m; i++)
            removed += e2[i].kind == IG_KV_REMOVED;
        follow(s, &seq, &x);
    }
    assert_true(removed > 0);
    set_t fresh = {0};
    uint64_t fseq;
    snapshot(s, &fseq, &fresh);
    assert_int_equal(fseq, seq);
    assert_int_equal(fresh.n, x.n);
    for (int i = 0; i < fresh.n; i++)
        assert_true(find(&x, fresh.h[i]) >= 0);
    assert_int_equal(ig_sched_kv_events(s, seq, ev, 16), 0);
    assert_int_equal(ig_sched_kv_events(s, seq + 1, ev, 16), IG_ERANGE); /* ahead */

    /* A reader left far behind: its events are gone, the ring is bounded. */
    for (int salt = 8; salt < 26; salt++)
        run_prompt(s, salt, 40, p);
    assert_int_equal(ig_sched_kv_events(s, seq, ev, 16), IG_ERANGE);
    snapshot(s, &seq, &x);
    assert_int_equal(follow(s, &seq, &x), 0);

    ig_sched_free(s);
    fake_dispose(&fe);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events_follow_the_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
