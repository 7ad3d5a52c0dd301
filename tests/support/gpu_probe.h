/*
 * Whether a GPU test may skip. A test that needs the CUDA backend exits 77
 * (ctest's SKIP_RETURN_CODE, so ctest prints "Skipped", not "Passed") when
 * the build has no CUDA or the machine has no GPU. When the machine has
 * one, a backend that fails to start is a failure: a broken driver, a
 * wrong architecture list or a regression in the backend must not pass as
 * "no GPU here".
 */
#ifndef IG_TESTS_GPU_PROBE_H
#define IG_TESTS_GPU_PROBE_H

#include "skip.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 1 when an NVIDIA GPU is meant to be used here: `nvidia-smi -L` lists one,
 * or the driver shows one under /proc/driver/nvidia/gpus. CUDA_VISIBLE_DEVICES
 * set to "" or "-1" hides every GPU on purpose, and then counts as none. */
static inline int ig_test_gpu_present(void)
{
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (vis && (vis[0] == '\0' || strcmp(vis, "-1") == 0))
        return 0;
    int found = 0;
    FILE *p = popen("nvidia-smi -L 2>/dev/null", "r");
    if (p) {
        char line[512];
        while (fgets(line, sizeof(line), p))
            found |= strncmp(line, "GPU ", 4) == 0;
        pclose(p);
    }
    DIR *d = found ? NULL : opendir("/proc/driver/nvidia/gpus");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            found |= e->d_name[0] != '.';
        closedir(d);
    }
    return found;
}

/* The exit status of a GPU test whose backend did not start, saying why:
 * IG_TEST_SKIP without CUDA in the build or without a GPU, else 1. */
static inline int ig_test_no_backend(const char *test, int built_with_cuda, const char *why)
{
    if (built_with_cuda && ig_test_gpu_present()) {
        fprintf(stderr, "%s: FAIL: a GPU is present but the CUDA backend did not start: %s\n",
                test, why);
        return 1;
    }
    printf("# SKIP %s: %s\n", test, why);
    return IG_TEST_SKIP;
}

#endif
