#ifndef IG_TEST_PROC_H
#define IG_TEST_PROC_H

/*
 * Real processes for integration tests: start a binary of the build with
 * arguments, optionally with its stdout and stderr captured through pipes,
 * find the port it listens on (by connecting, or from its "listening on"
 * line), wait for log lines and for its exit, stop it. Every wait is
 * bounded. Whatever a failed test leaves running (cmocka jumps past the
 * cleanup) is killed when the test binary exits.
 */

#include <stddef.h>
#include <sys/types.h>

/* Flags of ig_proc_start (0: both streams inherited from the test). */
enum {
    IG_PROC_QUIET = 1,    /* stderr to /dev/null */
    IG_PROC_PIPE_OUT = 2, /* stdout captured in out (read with ig_proc_pump) */
    IG_PROC_PIPE_ERR = 4, /* stderr captured in err */
    IG_PROC_PIPES = IG_PROC_PIPE_OUT | IG_PROC_PIPE_ERR,
    /* A process under measurement: SCHED_FIFO 10 where allowed, else nice
     * -10 (both fail quietly), and SIGKILL when the test process dies. */
    IG_PROC_BOOST = 8,
};

typedef struct ig_proc_s {
    pid_t pid;  /* 0 once reaped */
    int port;   /* from ig_proc_wait_listening / ig_proc_wait_announce */
    int status; /* exit status once reaped (128 + signal), -1 before */
    int out_fd; /* read ends of the pipes, -1 when not captured or closed */
    int err_fd;
    char *out; /* captured text, NUL-terminated, owned; NULL when not piped */
    size_t outlen;
    size_t outpos; /* what ig_proc_read_line / ig_proc_wait_announce consumed */
    char *err;
    size_t errlen;
} ig_proc_t;

/* Path of a binary of the build ("infergate", "testupstream"): in IG_BIN_DIR
 * of the environment (set by ctest), else beside the test binary. Static
 * buffer. */
const char *ig_proc_bin(const char *name);

/* A free loopback TCP port (bound and released; a small race is accepted). */
int ig_proc_free_port(void);

/* Starts argv[0] (a path) with its arguments (NULL-terminated) as flags
 * say; the child is killed at exit if still running. ig_proc_dispose frees
 * what p holds (needed with pipes; without, a stopped p holds nothing).
 * Returns 0 or -1 (nothing started, nothing to dispose). */
int ig_proc_start(ig_proc_t *p, char *const argv[], int flags);

/* As ig_proc_start, for the binary `name` of the build (ig_proc_bin) with
 * args (NULL-terminated, after argv[0]; at most 62). */
int ig_proc_start_bin(ig_proc_t *p, const char *name, const char *const *args, int flags);

/* Reads what is there on the captured pipes, waiting up to ms for
 * something. Returns how many pipes are still open (0: both at EOF). */
int ig_proc_pump(ig_proc_t *p, int ms);

/* Waits until needle appears in the captured stderr. 0 when seen, -1 on
 * timeout or when stderr reached EOF without it. */
int ig_proc_wait_log(ig_proc_t *p, const char *needle, int timeout_ms);

/* Waits for a full "listening on [http://]HOST:PORT" line on the captured
 * stderr (from_stderr) or stdout and sets p->port. On stdout the line is
 * consumed (ig_proc_read_line continues after it). 0, or -1 on timeout. */
int ig_proc_wait_announce(ig_proc_t *p, int from_stderr, int timeout_ms);

/* The next unread stdout line into buf (with its '\n'), waiting up to
 * timeout_ms. 0, or -1 when none came. */
int ig_proc_read_line(ig_proc_t *p, char *buf, size_t cap, int timeout_ms);

/* Polls until something accepts TCP connections on 127.0.0.1:port, or the
 * process exits, or timeout_ms passes. 0 when it listens (p->port is set). */
int ig_proc_wait_listening(ig_proc_t *p, int port, int timeout_ms);

/* Polls GET path on the port until it answers `status`. 0 on success. */
int ig_proc_wait_status(int port, const char *path, int status, int timeout_ms);

/* Waits up to timeout_ms for the exit, draining the pipes meanwhile.
 * Returns the exit status (0..255), 128 + signal when killed by one, or -1
 * on timeout (the process keeps running). */
int ig_proc_wait_exit(ig_proc_t *p, int timeout_ms);

/* Sends sig (0: none, just wait) and waits up to timeout_ms for the exit.
 * Returns as ig_proc_wait_exit; on timeout the process is SIGKILLed and -1
 * returned; -1 too when it had already been reaped. Closes the pipes
 * either way; what was captured stays readable until ig_proc_dispose. */
int ig_proc_stop(ig_proc_t *p, int sig, int timeout_ms);

/* Kills the process if still running, closes the pipes and frees the
 * captured text. p may be disposed twice. */
void ig_proc_dispose(ig_proc_t *p);

/* A raw TCP socket connected to 127.0.0.1:port (for partial writes, or to
 * see that nothing listens any more), or -1. The caller closes it. */
int ig_proc_connect(int port);

/* Writes text to a fresh temporary file and returns its path (static
 * buffer per call slot: up to 8 live at once). NULL on failure. The file is
 * removed when the test program exits. */
const char *ig_proc_temp_file(const char *text, const char *suffix);

/* Runs cmd through the shell (popen) and captures its stdout: up to cap - 1
 * bytes into out, NUL-terminated (a command that writes more may die of
 * SIGPIPE). Returns the exit status (0..255), or -1 when it could not run or
 * was killed. */
int ig_proc_capture(const char *cmd, char *out, size_t cap);

#endif
