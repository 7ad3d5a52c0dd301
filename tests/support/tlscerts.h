#ifndef IG_TEST_TLSCERTS_H
#define IG_TEST_TLSCERTS_H

/*
 * Certificates for the TLS tests, made by the `openssl` command line in the
 * test itself, and a shell runner for the clients (curl, openssl s_client)
 * that act on them.
 */

/*
 * In dir: a CA <name>-ca.pem (its key <name>-ca.key) and a leaf <name>.pem
 * with key <name>.key signed by it, P-256, subjectAltName san
 * ("DNS:localhost,IP:127.0.0.1"), valid for days (negative: expired that
 * many days ago). 0, or -1 with openssl's output on stderr.
 */
int ig_tlsc_make(const char *dir, const char *name, const char *san, int days);

/*
 * Runs `sh -c cmd` (bounded by timeout_s through timeout(1)), its stdout
 * and stderr together into *out (malloc'ed, NUL-terminated; NULL allowed to
 * discard). Returns the exit status (124 on timeout), or -1.
 */
int ig_tlsc_sh(const char *cmd, char **out, int timeout_s);

#endif
