#ifndef IG_TEST_PROC_H
#define IG_TEST_PROC_H

/*
 * Real processes for integration tests: start a binary of the build with
 * arguments, find the port it listens on, stop it, and clean up whatever a
 * failed test leaves running (every child is killed at exit).
 */

#include <sys/types.h>

typedef struct {
    pid_t pid;
    int port;
} ig_proc_t;

/* Path of a binary of the build ("infergate", "testupstream"). Static buffer. */
const char *ig_proc_bin(const char *name);

/* A free loopback TCP port (bound and released; a small race is accepted). */
int ig_proc_free_port(void);

/* Starts argv[0] (a path) with its arguments, stderr to the test's stderr
 * unless quiet. Returns 0 or -1. */
int ig_proc_start(ig_proc_t *p, char *const argv[], int quiet);

/* Polls until something accepts TCP connections on 127.0.0.1:port, or the
 * process exits, or timeout_ms passes. 0 when it listens. */
int ig_proc_wait_listening(ig_proc_t *p, int port, int timeout_ms);

/* Polls GET path on the port until it answers `status`. 0 on success. */
int ig_proc_wait_status(int port, const char *path, int status, int timeout_ms);

/* Sends sig; waits up to timeout_ms for the exit. Returns the exit status
 * (0..255), 128 + signal when killed by one, or -1 on timeout (the process
 * is then SIGKILLed). */
int ig_proc_stop(ig_proc_t *p, int sig, int timeout_ms);

/* Writes text to a fresh temporary file and returns its path (static
 * buffer per call slot: up to 8 live at once). */
const char *ig_proc_temp_file(const char *text, const char *suffix);

#endif
