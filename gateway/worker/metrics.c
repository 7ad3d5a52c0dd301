/*
 * The worker's metric families (infergate_worker_*) and their glue to the
 * scheduler: gauges read its stats, histograms are observed from the engine
 * thread, counters follow its totals on the loop thread; and the /load
 * report built from the same stats (GET /load and the KV events' "load").
 */
#include "worker_internal.h"

#include <string.h>

/* ---- metrics (thin: one place that knows the metric names) --------------- */

static const double batch_buckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};

/* The scheduler's counters now; zeros while the model loads. */
ig_sched_stats_t ig__worker_stats(void *d)
{
    worker_t *w = d;
    ig_sched_stats_t st;
    memset(&st, 0, sizeof(st));
    if (w->sched)
        ig_sched_stats(w->sched, &st);
    return st;
}

static double g_running(void *d)
{
    return ig__worker_stats(d).running;
}

static double g_waiting(void *d)
{
    return ig__worker_stats(d).waiting;
}

static double g_kv_usage(void *d)
{
    ig_sched_stats_t st = ig__worker_stats(d);
    return st.kv_blocks_total ? (double)st.kv_blocks_used / st.kv_blocks_total : 0;
}

static double g_decode_rate(void *d)
{
    return ig__worker_stats(d).decode_tokens_per_s;
}

static double g_prefix_blocks(void *d)
{
    return ig__worker_stats(d).prefix_cached_blocks;
}

static double g_kv_subscribers(void *d)
{
    return ((worker_t *)d)->nkv_subs;
}

static double g_ready(void *d)
{
    return ((worker_t *)d)->state == W_READY;
}

void ig__worker_metrics_register(worker_t *w)
{
    ig_metrics_gauge_fn("infergate_worker_requests_running", "Sequences in the running batch",
                        g_running, w);
    ig_metrics_gauge_fn("infergate_worker_requests_waiting", "Sequences waiting for admission",
                        g_waiting, w);
    ig_metrics_gauge_fn("infergate_worker_kv_cache_usage_ratio", "Share of KV blocks in use",
                        g_kv_usage, w);
    ig_metrics_gauge_fn("infergate_worker_decode_tokens_per_second",
                        "Decode throughput (EWMA over steps)", g_decode_rate, w);
    ig_metrics_gauge_fn("infergate_worker_ready", "1 when the worker takes traffic", g_ready, w);
    ig_metrics_gauge_fn("infergate_worker_prefix_cache_blocks",
                        "KV blocks kept under a prefix hash (held or cached)", g_prefix_blocks, w);
    w->m_ttft = ig_metrics_histogram("infergate_worker_time_to_first_token_seconds",
                                     "Submit to first token", NULL, NULL, 0);
    w->m_itl = ig_metrics_histogram("infergate_worker_inter_token_latency_seconds",
                                    "Time between two tokens of a sequence", NULL, NULL, 0);
    w->m_e2e = ig_metrics_histogram("infergate_worker_e2e_request_latency_seconds",
                                    "Submit to finish of a sequence", NULL, NULL, 0);
    w->m_queue = ig_metrics_histogram("infergate_worker_request_queue_time_seconds",
                                      "Submit to first admission", NULL, NULL, 0);
    w->m_batch =
        ig_metrics_histogram("infergate_worker_batch_size", "Sequences in one forward pass", NULL,
                             batch_buckets, sizeof(batch_buckets) / sizeof(batch_buckets[0]));
    w->m_prompt =
        ig_metrics_counter("infergate_worker_prompt_tokens_total", "Prompt tokens prefilled", NULL);
    w->m_gen =
        ig_metrics_counter("infergate_worker_generation_tokens_total", "Tokens generated", NULL);
    w->m_preempt = ig_metrics_counter("infergate_worker_preemptions_total",
                                      "Sequences preempted for KV blocks", NULL);
    w->m_finished = ig_metrics_counter("infergate_worker_request_success_total",
                                       "Sequences finished, by reason", "finished_reason");
    w->m_rejected = ig_metrics_counter("infergate_worker_requests_rejected_total",
                                       "Requests refused because the queue was full", NULL);
    w->m_pc_queries = ig_metrics_counter("infergate_worker_prefix_cache_queries_total",
                                         "Prompt tokens looked up in the prefix cache", NULL);
    w->m_pc_hits = ig_metrics_counter("infergate_worker_prefix_cache_hits_total",
                                      "Prompt tokens found in the prefix cache", NULL);
    w->m_pc_evictions = ig_metrics_counter("infergate_worker_prefix_cache_evictions_total",
                                           "Cached KV blocks evicted for reuse", NULL);
    ig_metrics_gauge_fn("infergate_worker_kv_event_subscribers",
                        "Subscribers of GET /kv/events now", g_kv_subscribers, w);
    w->m_kv_dropped =
        ig_metrics_counter("infergate_worker_kv_event_subscribers_dropped_total",
                           "GET /kv/events subscribers dropped for not reading", NULL);
    w->m_kv_bytes =
        ig_metrics_gauge("infergate_worker_kv_cache_bytes",
                         "Bytes of the KV cache, by element type (f32, f16, bf16)", "dtype");
}

void ig__worker_metrics_kv(worker_t *w)
{
    if (w->m_kv_bytes && w->engine)
        ig_metric_set(w->m_kv_bytes, (double)ig_engine_kv_bytes(w->engine),
                      ig_engine_kv_dtype_name(ig_engine_kv_dtype(w->engine)));
}

/* Engine thread: histogram observations. */
void ig__worker_metrics_observe(void *data, ig_sched_obs_t what, double v)
{
    worker_t *w = data;
    ig_metric_t *m = what == IG_SCHED_OBS_TTFT         ? w->m_ttft
                     : what == IG_SCHED_OBS_ITL        ? w->m_itl
                     : what == IG_SCHED_OBS_BATCH      ? w->m_batch
                     : what == IG_SCHED_OBS_QUEUE_TIME ? w->m_queue
                                                       : w->m_e2e;
    if (m)
        ig_metric_observe(m, v);
}

/* Loop thread: counters follow the scheduler's totals. */
void ig__worker_metrics_sync(worker_t *w)
{
    if (!w->sched || !w->m_prompt)
        return;
    ig_sched_stats_t st, *l = &w->last_stats;
    ig_sched_stats(w->sched, &st);
    ig_metric_add(w->m_prompt, (double)(st.prompt_tokens_total - l->prompt_tokens_total));
    ig_metric_add(w->m_gen, (double)(st.generation_tokens_total - l->generation_tokens_total));
    ig_metric_add(w->m_preempt, (double)(st.preemptions_total - l->preemptions_total));
    ig_metric_add(w->m_rejected, (double)(st.rejected_total - l->rejected_total));
    ig_metric_add(w->m_pc_queries,
                  (double)(st.prefix_queried_tokens_total - l->prefix_queried_tokens_total));
    ig_metric_add(w->m_pc_hits, (double)(st.prefix_hit_tokens_total - l->prefix_hit_tokens_total));
    ig_metric_add(w->m_pc_evictions,
                  (double)(st.prefix_evictions_total - l->prefix_evictions_total));
    for (int f = IG_FINISH_STOP; f <= IG_FINISH_ERROR; f++)
        if (st.finished_total[f] != l->finished_total[f])
            ig_metric_add(w->m_finished, (double)(st.finished_total[f] - l->finished_total[f]),
                          ig_finish_reason((ig_finish_t)f));
    *l = st;
}

/* ---- the /load report ----------------------------------------------------- */

void ig__worker_load_of(worker_t *w, ig_load_t *out)
{
    ig_sched_stats_t st = ig__worker_stats(w);
    ig_load_t l;
    ig_load_init(&l);
    l.has = IG_LOAD_WORKER_FIELDS | (w->chat_source != NULL ? IG_LOAD_CHAT_TEMPLATE : 0);
    l.waiting = st.waiting;
    l.running = st.running;
    l.kv_blocks_used = st.kv_blocks_used;
    l.kv_blocks_total = st.kv_blocks_total;
    l.decode_tokens_per_s = st.decode_tokens_per_s;
    l.prefill_tokens_per_s = st.prefill_tokens_per_s;
    l.est_wait_s = st.est_wait_s;
    l.max_waiting = w->o.max_waiting;
    l.model = w->model_name;
    l.state = w->state == W_LOADING    ? "loading"
              : w->state == W_READY    ? "ready"
              : w->state == W_DRAINING ? "draining"
                                       : "failed";
    l.ready = w->state == W_READY;
    l.inflight = w->nreqs;
    l.max_num_seqs = w->o.max_num_seqs;
    l.max_batched_tokens = w->o.max_batched_tokens;
    if (w->chat_source != NULL)
        l.chat_template = ig_chat_style_name(w->chat_style);
    *out = l;
}
