#ifndef INFERGATE_LOAD_H
#define INFERGATE_LOAD_H

/*
 * The GET /load wire format, written once: what a worker reports to its
 * pool and what a gateway reports to a peer gateway. One struct, one
 * encoder, one decoder; every reader and writer of /load goes through them.
 *
 * The document is a JSON object. Every field is optional: a writer sends
 * those it knows (a worker and a gateway send different sets, below), a
 * reader takes those it finds, and a field it does not know is ignored.
 * "version" (an integer, 1 today; missing means 1) names the format. A
 * version only ever adds fields: a field never changes its meaning or its
 * type under the same name, so a reader decodes a newer version's known
 * fields as they are.
 *
 *   field                 type     sent by   meaning
 *   version               integer  both      IG_LOAD_VERSION
 *   waiting               number   both      requests queued, not yet running
 *   running               number   both      requests running (sequences)
 *   inflight              integer  both      requests between intake and answer
 *   est_wait_s            number   both      predicted queueing delay of a new request
 *   prefill_tokens_per_s  number   both      prompt tokens per second (a gateway: its best
 * instance) decode_tokens_per_s   number   both      generated tokens per second (a gateway: the
 * sum) max_num_seqs          integer  both      sequences run at once (a gateway: all its slots)
 *   kv_blocks_used        integer  worker
 *   kv_blocks_total       integer  worker
 *   max_waiting           integer  worker    the scheduler's queue bound
 *   max_batched_tokens    integer  worker
 *   model                 string   worker    the model it serves
 *   state                 string   worker    "loading", "ready", "draining" or "failed"
 *   ready                 boolean  worker
 *   chat_template         string   worker    the chat style in use
 *   region                string   gateway
 *   models                array    gateway   model ids (strings; {"id": ...} objects are read too)
 *   ready_instances       integer  gateway   local instances ready
 *   ttft_s                number   gateway   its predicted TTFT of an empty prompt, best instance
 *
 * Counts that a gateway sums (waiting, running) are numbers: the encoder
 * writes a whole value as an integer, else as a real.
 */

#include <jansson.h>
#include <stddef.h>

#define IG_LOAD_VERSION 1
#define IG_LOAD_MAX_MODELS 64 /* models beyond these are not encoded, nor decoded */

/* Which fields a report holds: bits of ig_load_t.has. */
enum {
    IG_LOAD_WAITING = 1u << 0,
    IG_LOAD_RUNNING = 1u << 1,
    IG_LOAD_INFLIGHT = 1u << 2,
    IG_LOAD_EST_WAIT = 1u << 3,
    IG_LOAD_PREFILL_TPS = 1u << 4,
    IG_LOAD_DECODE_TPS = 1u << 5,
    IG_LOAD_MAX_NUM_SEQS = 1u << 6,
    IG_LOAD_KV_BLOCKS_USED = 1u << 7,
    IG_LOAD_KV_BLOCKS_TOTAL = 1u << 8,
    IG_LOAD_MAX_WAITING = 1u << 9,
    IG_LOAD_MAX_BATCHED_TOKENS = 1u << 10,
    IG_LOAD_MODEL = 1u << 11,
    IG_LOAD_STATE = 1u << 12,
    IG_LOAD_READY = 1u << 13,
    IG_LOAD_CHAT_TEMPLATE = 1u << 14,
    IG_LOAD_REGION = 1u << 15,
    IG_LOAD_MODELS = 1u << 16,
    IG_LOAD_READY_INSTANCES = 1u << 17,
    IG_LOAD_TTFT = 1u << 18,
};

/* The fields each writer sends (chat_template only when known). */
#define IG_LOAD_WORKER_FIELDS                                                                      \
    (IG_LOAD_WAITING | IG_LOAD_RUNNING | IG_LOAD_INFLIGHT | IG_LOAD_EST_WAIT |                     \
     IG_LOAD_PREFILL_TPS | IG_LOAD_DECODE_TPS | IG_LOAD_MAX_NUM_SEQS | IG_LOAD_KV_BLOCKS_USED |    \
     IG_LOAD_KV_BLOCKS_TOTAL | IG_LOAD_MAX_WAITING | IG_LOAD_MAX_BATCHED_TOKENS | IG_LOAD_MODEL |  \
     IG_LOAD_STATE | IG_LOAD_READY)
#define IG_LOAD_GATEWAY_FIELDS                                                                     \
    (IG_LOAD_WAITING | IG_LOAD_RUNNING | IG_LOAD_INFLIGHT | IG_LOAD_EST_WAIT |                     \
     IG_LOAD_PREFILL_TPS | IG_LOAD_DECODE_TPS | IG_LOAD_MAX_NUM_SEQS | IG_LOAD_REGION |            \
     IG_LOAD_MODELS | IG_LOAD_READY_INSTANCES | IG_LOAD_TTFT)

/*
 * One report. A field counts only when its bit is in `has`. Strings are
 * borrowed: from the caller when encoding; after a decode, from the
 * decoded document, which the struct holds until ig_load_dispose().
 */
typedef struct {
    unsigned has;
    int version; /* decoded; the encoder always writes IG_LOAD_VERSION */
    double waiting;
    double running;
    int inflight;
    double est_wait_s;
    double prefill_tokens_per_s;
    double decode_tokens_per_s;
    int max_num_seqs;
    int kv_blocks_used;
    int kv_blocks_total;
    int max_waiting;
    int max_batched_tokens;
    const char *model;
    const char *state;
    int ready;
    const char *chat_template;
    const char *region;
    const char *models[IG_LOAD_MAX_MODELS];
    int nmodels;
    int ready_instances;
    double ttft_s;
    json_t *doc_; /* private: the decoded document the strings point into */
} ig_load_t;

/* An empty report (has = 0, version IG_LOAD_VERSION). */
void ig_load_init(ig_load_t *l);
/* Releases what a decode holds; l is empty after. */
void ig_load_dispose(ig_load_t *l);

/* The report as a JSON object, new reference, or NULL when out of memory.
 * Only the fields in l->has are written, plus "version". */
json_t *ig_load_encode(const ig_load_t *l);

/*
 * Reads a report from text (len bytes; need not be NUL-terminated) into
 * out, which is disposed of first (init it once before the first decode).
 *   0           every field present had its type;
 *   IG_EINVAL   some field had the wrong type, or "version" was not an
 *               integer >= 1: that field is left out of `has` (the others
 *               are still read), and err names the first such one by its
 *               JSON path ("$.waiting: expected a number");
 *   IG_EPARSE   not JSON (a key twice in one object counts as not JSON,
 *               as in every document the project reads), or not an
 *               object: nothing is read (has = 0).
 * err may be NULL.
 */
int ig_load_decode(const char *text, size_t len, ig_load_t *out, char *err, size_t errlen);

#endif
