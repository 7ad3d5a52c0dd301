#ifndef INFERGATE_DISCOVER_H
#define INFERGATE_DISCOVER_H

/*
 * DNS discovery: a name's A and AAAA records, resolved again and again on
 * the loop, never blocking it. This is how a Kubernetes headless Service
 * presents the pods of a worker Deployment: one record per ready pod. A pool
 * with pools[].discover uses it to follow its instances (gateway/fleet/
 * pool.c); the resolution itself is here (gateway/fleet/discover.c).
 *
 * Two ways to resolve. Without a resolver, libuv's uv_getaddrinfo (the
 * system's resolver on libuv's thread pool: /etc/resolv.conf, /etc/hosts,
 * nsswitch). With one ("IP:PORT"), a small DNS client of our own asks that
 * server directly over UDP (uv_udp), A and AAAA in parallel, 2 s per try:
 * for a DNS server on another port than 53, which resolv.conf cannot name
 * (the tests' dnsmasq), or to bypass the node's resolver cache.
 *
 * An answer is authoritative when the server answered: its records are the
 * whole set, and a name that does not exist (NXDOMAIN, EAI_NONAME) is the
 * empty set. A failure (timeout, SERVFAIL, a malformed answer) keeps the
 * last set: a DNS hiccup must not drain a healthy pool.
 */

#include <stdint.h>
#include <uv.h>

typedef struct ig_discover_s ig_discover_t;

#define IG_DISCOVER_MAX_ADDRS 256

/* One authoritative answer: addrs are IP literals ("10.0.0.7", "fd00::7"),
 * sorted and without duplicates; borrowed for the call. */
typedef void (*ig_discover_cb)(void *data, const char *const *addrs, int n);

typedef struct {
    const char *name;     /* the DNS name */
    uint64_t interval_ms; /* between the end of one resolution and the next */
    const char *resolver; /* "IP:PORT" or "[IPv6]:PORT"; NULL = uv_getaddrinfo */
} ig_discover_spec_t;

/* Copies the spec and resolves at once, then every interval_ms. 0,
 * IG_EINVAL (a malformed resolver address) or IG_ENOMEM. */
int ig_discover_start(ig_discover_t **out, uv_loop_t *loop, const ig_discover_spec_t *spec,
                      ig_discover_cb cb, void *data);

/* No callback from now on; the memory goes once the handles (and a lookup
 * in flight on the thread pool) are done. */
void ig_discover_close(ig_discover_t *d);

/* Answers and failures so far (for logs and tests). */
unsigned ig_discover_answers(const ig_discover_t *d);
unsigned ig_discover_failures(const ig_discover_t *d);

/* ---- the DNS wire format (RFC 1035), pure, for the client and its tests */

/* Writes a query for name (qtype 1 = A, 28 = AAAA, recursion desired)
 * into buf; returns its length, or -1 when name or buf do not fit. */
int ig_dns_query(uint8_t *buf, int cap, uint16_t id, const char *name, uint16_t qtype);

/* Reads an answer to query id: the A/AAAA records as IP literals appended
 * to addrs (up to max, *n counts them). Returns 0 (NOERROR), 1 (NXDOMAIN:
 * no such name, also authoritative), or -1 (not our answer, another error
 * code, or malformed). */
int ig_dns_parse(const uint8_t *buf, int len, uint16_t id, char (*addrs)[46], int max, int *n);

#endif
