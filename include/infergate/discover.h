#ifndef INFERGATE_DISCOVER_H
#define INFERGATE_DISCOVER_H

/*
 * DNS discovery: a name's records, resolved again and again on the loop,
 * never blocking it. This is how a Kubernetes headless Service presents
 * the pods of a worker Deployment: one A/AAAA record per ready pod, and one
 * SRV record per pod and named port. A pool with pools[].discover uses it
 * to follow its instances (gateway/fleet/pool.c); the resolution itself is
 * here (gateway/fleet/discover.c), by c-ares on the loop.
 *
 * With a port, the name's A and AAAA records are the addresses, each at
 * that port. Without one (port 0), the name's SRV records are read (for a
 * Service's named port: _http._tcp.workers.ns.svc.cluster.local) and each
 * target's A and AAAA records are addresses at the target's port.
 *
 * Without a resolver, the system's configuration (/etc/resolv.conf with
 * its search list, and /etc/hosts) as c-ares reads it. With one
 * ("IP:PORT"), that DNS server alone, DNS only: for a server on another
 * port than 53, which resolv.conf cannot name (the tests' dnsmasq), or to
 * bypass the node's resolver cache. 2 s per try, 2 tries.
 *
 * An answer is authoritative when the server answered: its records are the
 * whole set, and a name that does not exist (NXDOMAIN) or has no record of
 * the type is the empty set. A failure (timeout, SERVFAIL, a malformed
 * answer, of the name or of one SRV target) keeps the last set: a DNS
 * hiccup must not drain a healthy pool.
 */

#include <stdint.h>
#include <uv.h>

typedef struct ig_discover_s ig_discover_t;

#define IG_DISCOVER_MAX_ADDRS 256

/* One instance found: an IP literal ("10.0.0.7", "fd00::7") and a port. */
typedef struct {
    char addr[46];
    int port;
} ig_discover_addr_t;

/* One authoritative answer: sorted by address then port, without
 * duplicates, at most IG_DISCOVER_MAX_ADDRS; borrowed for the call. */
typedef void (*ig_discover_cb)(void *data, const ig_discover_addr_t *addrs, int n);

typedef struct {
    const char *name;     /* the DNS name */
    int port;             /* the instances' port; 0: from the name's SRV records */
    uint64_t interval_ms; /* between the end of one resolution and the next */
    const char *resolver; /* "IP:PORT" or "[IPv6]:PORT"; NULL: the system's */
} ig_discover_spec_t;

/* Copies the spec and resolves at once, then every interval_ms. 0,
 * IG_EINVAL (a malformed resolver address or port) or IG_ENOMEM. */
int ig_discover_start(ig_discover_t **out, uv_loop_t *loop, const ig_discover_spec_t *spec,
                      ig_discover_cb cb, void *data);

/* No callback from now on; the memory goes once the handles are closed. */
void ig_discover_close(ig_discover_t *d);

/* Answers and failures so far (for logs and tests). */
unsigned ig_discover_answers(const ig_discover_t *d);
unsigned ig_discover_failures(const ig_discover_t *d);

#endif
