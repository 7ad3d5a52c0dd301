/* Certificates and shell clients of the TLS tests (tlscerts.h). */
#include "tlscerts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

int ig_tlsc_sh(const char *cmd, char **out, int timeout_s)
{
    size_t n = strlen(cmd) * 2 + 64;
    char *full = malloc(n);
    if (full == NULL)
        return -1;
    /* The command goes in single quotes: each ' becomes '\'' */
    size_t k = (size_t)snprintf(full, n, "timeout %d sh -c '", timeout_s);
    for (const char *p = cmd; *p && k + 6 < n; p++) {
        if (*p == '\'') {
            memcpy(full + k, "'\\''", 4);
            k += 4;
        } else {
            full[k++] = *p;
        }
    }
    snprintf(full + k, n - k, "' 2>&1");
    FILE *f = popen(full, "r");
    free(full);
    if (f == NULL)
        return -1;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (buf != NULL && len + 1024 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                free(buf);
                buf = NULL;
            } else {
                buf = nb;
                cap *= 2;
            }
        }
        char tmp[1024];
        size_t r = fread(buf != NULL ? buf + len : tmp, 1, 1023, f);
        if (r == 0)
            break;
        if (buf != NULL)
            len += r;
    }
    if (buf != NULL)
        buf[len] = '\0';
    int st = pclose(f);
    if (out != NULL)
        *out = buf;
    else
        free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int ig_tlsc_make(const char *dir, const char *name, const char *san, int days)
{
    char cmd[4096];
    const char *ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    snprintf(cmd, sizeof(cmd),
             "set -e; cd %s; "
             "openssl req -x509 %s -keyout %s-ca.key -out %s-ca.pem -days 3 -subj /CN=%s-ca; "
             "openssl req %s -keyout %s.key -out %s.csr -subj /CN=%s; "
             "printf 'subjectAltName=%s\\n' > %s.ext; "
             "openssl x509 -req -in %s.csr -CA %s-ca.pem -CAkey %s-ca.key -set_serial %d "
             "-out %s.pem -days %d -extfile %s.ext",
             dir, ec, name, name, name, ec, name, name, name, san, name, name, name, name,
             (int)(random() % 1000000) + 1, name, days, name);
    char *out = NULL;
    int rc = ig_tlsc_sh(cmd, &out, 60);
    if (rc != 0)
        fprintf(stderr, "tlscerts: %s failed (%d):\n%s\n", cmd, rc, out ? out : "");
    free(out);
    return rc == 0 ? 0 : -1;
}
