#include "files.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ig_tf_mkdtemp(char *buf, size_t cap)
{
    const char *base = getenv("TMPDIR");
    int n = snprintf(buf, cap, "%s/igtest-XXXXXX", base && *base ? base : "/tmp");
    if (n < 0 || (size_t)n >= cap)
        return -1;
    return mkdtemp(buf) != NULL ? 0 : -1;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0; /* go on: remove what can be removed */
}

void ig_tf_rmtree(const char *dir)
{
    if (dir == NULL || dir[0] != '/' || strcmp(dir, "/") == 0)
        return;
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

char *ig_tf_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0)
        buf = malloc((size_t)n + 1);
    if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf == NULL)
        return NULL;
    buf[n] = '\0';
    if (len != NULL)
        *len = (size_t)n;
    return buf;
}

int ig_tf_write(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    int ok = fwrite(data, 1, len, f) == len;
    ok &= fclose(f) == 0;
    return ok ? 0 : -1;
}

int ig_tf_replace(const char *path, const void *data, size_t len)
{
    char next[4096];
    if ((size_t)snprintf(next, sizeof(next), "%s.next", path) >= sizeof(next))
        return -1;
    if (ig_tf_write(next, data, len) != 0)
        return -1;
    return rename(next, path) == 0 ? 0 : -1;
}

int ig_tf_replace_from(const char *path, const char *src)
{
    size_t len;
    char *text = ig_tf_read(src, &len);
    if (text == NULL)
        return -1;
    int rc = ig_tf_replace(path, text, len);
    free(text);
    if (rc == 0)
        unlink(src);
    return rc;
}
