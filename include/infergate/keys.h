#ifndef INFERGATE_KEYS_H
#define INFERGATE_KEYS_H

/*
 * API keys and their policy (docs/security.md): who a request is, what it
 * may do, and how much of it. Built once from the config's api_keys; loop
 * thread only.
 *
 * Limits are token buckets that refill continuously: requests_per_s with
 * room for burst requests, and tokens_per_min with room for one minute's
 * tokens. A request takes one request token at admission and reserves its
 * prompt (an estimate) plus its max_tokens, which the gateway clamps to
 * what the bucket holds, so that a stream never runs past the limit: it
 * ends after its last allowed token, with finish_reason "length". When the
 * request ends, the tokens it did not use go back.
 *
 * Metrics carry the key's name, never the key.
 */

#include "infergate/config.h"
#include "infergate/http.h"

#include <stdint.h>
#include <time.h>

typedef struct ig_keys_s ig_keys_t;
typedef struct ig_key_s ig_key_t;

/* 0 or IG_ENOMEM. The config must outlive the table. */
int ig_keys_new(ig_keys_t **out, const ig_config_t *cfg);
void ig_keys_free(ig_keys_t *keys);

/* Number of keys configured (0: no authentication). */
size_t ig_keys_count(const ig_keys_t *keys);

/*
 * The key of an Authorization header value ("Bearer KEY"), or NULL. Every
 * configured key is compared, each in time independent of where it
 * differs, so the answer's timing says nothing about which key is close.
 */
ig_key_t *ig_keys_find(ig_keys_t *keys, const char *authorization);

/* The key's policy (borrowed from the config). */
const ig_config_key_t *ig_key_policy(const ig_key_t *key);

/* 1 when the key may use model. */
int ig_key_allows_model(const ig_key_t *key, const char *model);

/* What a limit says, for the 429 and the x-ratelimit-* headers. */
typedef struct {
    const char *which;  /* "requests" or "tokens" */
    double limit;       /* bucket size */
    double remaining;   /* after this request */
    double reset_s;     /* until the bucket is full again */
    double retry_after; /* seconds until the request could pass (refused only) */
} ig_key_limit_t;

/*
 * Admission of one request at now_ns: refused while the key's budget
 * period is spent (which "budget", retry at the period's end), else takes a
 * request token. 0, or IG_EFULL (nothing taken) with *why saying which
 * limit and when to retry.
 * *req (and *tok, when the key has a token limit) describe the buckets for
 * the response headers either way.
 */
int ig_key_admit(ig_key_t *key, uint64_t now_ns, ig_key_limit_t *req, ig_key_limit_t *why);

/*
 * Reserves the tokens of one request: its prompt estimate plus up to
 * max_tokens (0 for a request that generates nothing, as embeddings).
 * Returns the generated tokens allowed (>= 1 when max_tokens >= 1, <= the
 * asked), or IG_EFULL with the limit in *why when not even the prompt and
 * one token fit (nothing reserved). Keys without a token limit allow
 * everything and reserve nothing (returns the asked).
 */
int ig_key_reserve(ig_key_t *key, uint64_t now_ns, int prompt_tokens, int max_tokens,
                   ig_key_limit_t *tok, ig_key_limit_t *why);

/* The request ended having used `used` tokens of `reserved`: the rest goes
 * back (or the excess is charged). Counted in the key's token metric. */
void ig_key_settle(ig_key_t *key, uint64_t now_ns, double reserved, double used);

/* Charges usd (an answer's estimated cost) to the key's budget period at
 * unix second now; a new period starts from 0. */
void ig_key_charge(ig_key_t *key, double usd, time_t now);
/* The key's spend so far in the period holding now (USD). */
double ig_key_spent(ig_key_t *key, time_t now);
/* A reload's new key table takes the spend of the keys of the same name
 * (budgets survive a reload; a restart starts them from 0). */
void ig_keys_carry_spend(ig_keys_t *to, const ig_keys_t *from);

/* Counts a finished request of the key under its status. */
void ig_key_count(ig_key_t *key, int status);

/* ---- one request's use of its key --------------------------------------- */

typedef struct ig_key_use_s ig_key_use_t;

/*
 * Starts accounting req to key: when req finishes it is counted under its
 * status, and the tokens reserved with ig_key_use_reserve are settled
 * against what the response said it used (its usage object, else one token
 * per streamed event; an error answer with neither used none). The record
 * lives in req's arena and is req's user data (ig_http_req_get_data). NULL
 * when out of memory.
 */
ig_key_use_t *ig_key_track(ig_key_t *key, ig_http_req_t *req);
ig_key_t *ig_key_use_key(const ig_key_use_t *use);

/* ig_key_reserve for the request of use; the reservation is settled when
 * the request ends. */
int ig_key_use_reserve(ig_key_use_t *use, uint64_t now_ns, int prompt_tokens, int max_tokens,
                       ig_key_limit_t *tok, ig_key_limit_t *why);

/* Adds the x-ratelimit-* headers of lim to req (nothing for a limit of 0). */
void ig_key_limit_headers(ig_http_req_t *req, const ig_key_limit_t *lim);

#endif
