#ifndef IG_TEST_PEERS_H
#define IG_TEST_PEERS_H

/*
 * Peers written in python3 (tests/peers/), started like the build's tools:
 * the script prints "listening on HOST:PORT" on stdout and the fixture waits
 * for that line. Header-only because the scripts are found through
 * IG_SOURCE_DIR, which CMake defines for test programs only.
 */

#include <stdio.h>

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

#endif
