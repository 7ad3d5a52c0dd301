#include "cases.h"
#include "files.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef IG_SOURCE_DIR
#error "IG_SOURCE_DIR must name the source tree"
#endif

#define MAX_CASES 1024

const char *ig_cases_dir(const char *suite)
{
    static char path[4096];
    const char *src = getenv("IG_SOURCE_DIR");
    snprintf(path, sizeof(path), "%s/tests/cases/%s", src && *src ? src : IG_SOURCE_DIR, suite);
    return path;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int ig_cases_foreach(const char *suite, ig_case_cb cb, void *data, int *ncases)
{
    char root[4096];
    snprintf(root, sizeof(root), "%s", ig_cases_dir(suite));
    if (ncases != NULL)
        *ncases = 0;
    DIR *d = opendir(root);
    if (d == NULL) {
        fprintf(stderr, "cases: cannot open %s\n", root);
        return -1;
    }
    char **names = malloc(MAX_CASES * sizeof(*names));
    size_t n = 0;
    struct dirent *e;
    while (names != NULL && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == MAX_CASES) {
            fprintf(stderr, "cases: %s has more than %d cases\n", root, MAX_CASES);
            break;
        }
        if ((names[n] = strdup(e->d_name)) != NULL)
            n++;
    }
    closedir(d);
    if (names == NULL)
        return -1;
    qsort(names, n, sizeof(names[0]), cmp_names);
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        char dir[8192];
        snprintf(dir, sizeof(dir), "%s/%s", root, names[i]);
        failed += cb(names[i], dir, data) != 0;
        free(names[i]);
    }
    free(names);
    printf("# %zu %s cases, %d failed\n", n, suite, failed);
    if (ncases != NULL)
        *ncases = (int)n;
    return failed;
}

char *ig_case_expect(const char *dir)
{
    char path[8192];
    snprintf(path, sizeof(path), "%s/expect", dir);
    char *text = ig_tf_read(path, NULL);
    if (text != NULL)
        text[strcspn(text, "\r\n")] = '\0';
    return text;
}
