#ifndef IG_TEST_PEERS_H
#define IG_TEST_PEERS_H

/*
 * Peers written in python3 (tests/peers/), started like the build's tools:
 * the script prints "listening on HOST:PORT" on stdout and the fixture waits
 * for that line. Header-only because the scripts are found through
 * IG_SOURCE_DIR, which CMake defines for test programs only.
 */

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "files.h"
#include "proc.h"

#ifndef IG_SOURCE_DIR
#error "IG_SOURCE_DIR must name the source tree"
#endif

/* Starts `python3 tests/peers/<script> --port 0 --max-s 300` and then args
 * (NULL-terminated, may be NULL; at most 24), its stdout captured, and
 * waits up to timeout_ms for its port. 0 with p->port set, or -1; either
 * way p is the caller's to stop and dispose. */
static inline int ig_peer_start(ig_proc_t *p, const char *script, const char *const *args,
                                int timeout_ms)
{
    static char path[1024];
    snprintf(path, sizeof(path), "%s/tests/peers/%s", IG_SOURCE_DIR, script);
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)"/usr/bin/env";
    argv[n++] = (char *)"python3";
    argv[n++] = path;
    argv[n++] = (char *)"--port";
    argv[n++] = (char *)"0";
    argv[n++] = (char *)"--max-s";
    argv[n++] = (char *)"300";
    for (int i = 0; args != NULL && args[i] != NULL && n < 31; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    if (ig_proc_start(p, argv, IG_PROC_PIPE_OUT) != 0)
        return -1;
    return ig_proc_wait_announce(p, 0, timeout_ms);
}

/* models_site.py: a python3 site that lists, and answers only, the models
 * named one a line in its models file, which lives in the site's own
 * scratch directory. */
typedef struct {
    ig_proc_t proc;
    char dir[256];
    char models_file[300]; /* dir/models: rewrite it with ig_tf_replace */
} ig_models_site_t;

/* Makes the scratch directory, writes models (e.g. "alpha\nbeta\n") to its
 * models file and starts the site with --models-file and then args
 * (NULL-terminated, may be NULL; at most 20). 0 or -1; either way s is the
 * caller's to stop with ig_models_site_stop. */
static inline int ig_models_site_start(ig_models_site_t *s, const char *models,
                                       const char *const *args)
{
    memset(s, 0, sizeof(*s));
    s->proc.out_fd = s->proc.err_fd = -1; /* nothing to close yet */
    if (ig_tf_mkdtemp(s->dir, sizeof(s->dir)) != 0)
        return -1;
    snprintf(s->models_file, sizeof(s->models_file), "%s/models", s->dir);
    if (ig_tf_write(s->models_file, models, strlen(models)) != 0)
        return -1;
    const char *argv[24] = {"--models-file", s->models_file};
    int n = 2;
    for (int i = 0; args != NULL && args[i] != NULL && n < 22; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    return ig_peer_start(&s->proc, "models_site.py", argv, 10000);
}

/* Stops the site (SIGTERM, 5 s) and removes its scratch directory. */
static inline void ig_models_site_stop(ig_models_site_t *s)
{
    ig_proc_stop(&s->proc, SIGTERM, 5000);
    ig_proc_dispose(&s->proc);
    if (s->dir[0] != '\0')
        ig_tf_rmtree(s->dir);
}

/* dnsmasq (Debian's): a DNS server a test controls, answering from the
 * hosts file alone, without a cache, on 127.0.0.1:port. */
#define IG_DNSMASQ "/usr/sbin/dnsmasq"

/* Starts it on hosts (a file of "IP NAME" lines; rewrite it and send the
 * process SIGHUP to change the answers) and conf (a dnsmasq config file,
 * read once: srv-host= lines; NULL: none): 0 once started, or -1; dns is
 * the caller's to stop either way. */
static inline int ig_dnsmasq_start_conf(ig_proc_t *dns, int port, const char *hosts,
                                        const char *conf)
{
    char portf[32], hostsf[300], conff[300];
    snprintf(portf, sizeof(portf), "--port=%d", port);
    snprintf(hostsf, sizeof(hostsf), "--addn-hosts=%s", hosts);
    snprintf(conff, sizeof(conff), "--conf-file=%s", conf ? conf : "/dev/null");
    char *argv[] = {(char *)IG_DNSMASQ,
                    (char *)"--keep-in-foreground",
                    conff,
                    portf,
                    (char *)"--listen-address=127.0.0.1",
                    (char *)"--bind-interfaces",
                    (char *)"--no-resolv",
                    (char *)"--no-hosts",
                    hostsf,
                    (char *)"--cache-size=0",
                    (char *)"--local-ttl=0",
                    (char *)"--pid-file=",
                    (char *)"--user=root",
                    NULL};
    return ig_proc_start(dns, argv, IG_PROC_QUIET);
}

static inline int ig_dnsmasq_start(ig_proc_t *dns, int port, const char *hosts)
{
    return ig_dnsmasq_start_conf(dns, port, hosts, NULL);
}

#endif
