/*
 * The CUDA backend as a module (kernels/cuda_loader.c): a process that
 * opens no GPU device never maps cuBLAS; the first cuda:N loads the module
 * beside the binary; a missing module is a clear error, not a crash. Each
 * case runs in a child, because a process loads the module once. Skipped
 * in builds without a CUDA module (no nvcc, or the CUDA emulation).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/error.h"
#include "infergate/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Whether this process maps a file whose name holds what. */
static int mapped(const char *what)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    int found = 0;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        found |= strstr(line, what) != NULL;
    if (f != NULL)
        fclose(f);
    return found;
}

/* In a child with IG_CUDA_MODULE set to module (NULL: unset): opens
 * cuda:0; reports through the pipe whether the module and cuBLAS are
 * mapped before and after, the status and the message. */
static void open_in_child(const char *module, char *report, size_t cap)
{
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        if (module != NULL)
            setenv("IG_CUDA_MODULE", module, 1);
        else
            unsetenv("IG_CUDA_MODULE");
        char err[512] = "", out[1024];
        int before = mapped("libcublas");
        ig_backend_t *be = NULL;
        int rc = ig_backend_open(&be, "cuda:0", 0, err, sizeof(err));
        int n = snprintf(out, sizeof(out), "before=%d module=%d cublas=%d rc=%d err=%s", before,
                         mapped("libinfergate_cuda.so"), mapped("libcublas"), rc, err);
        if (be != NULL)
            be->destroy(be);
        ssize_t w = write(fd[1], out, (size_t)n);
        _exit(w == n ? 0 : 1);
    }
    close(fd[1]);
    ssize_t n = read(fd[0], report, cap - 1);
    report[n > 0 ? n : 0] = '\0';
    close(fd[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    print_message("IG_CUDA_MODULE=%s: %s\n", module ? module : "(unset)", report);
}

static void test_loaded_on_first_gpu_device(void **state)
{
    (void)state;
    char r[1024];
    open_in_child(NULL, r, sizeof(r));
    assert_non_null(strstr(r, "before=0 module=1 cublas=1"));
    /* with no GPU here it fails, but as CUDA's answer, not the loader's */
    assert_null(strstr(r, "cannot load"));
}

static void test_missing_module_is_an_error(void **state)
{
    (void)state;
    char r[1024];
    open_in_child("/nonexistent/libinfergate_cuda.so", r, sizeof(r));
    assert_non_null(strstr(r, "module=0 cublas=0"));
    char want[64];
    snprintf(want, sizeof(want), "rc=%d err=cannot load the CUDA backend", IG_ENOTSUP);
    assert_non_null(strstr(r, want));
    assert_non_null(strstr(r, "/nonexistent/libinfergate_cuda.so"));
}

static void test_cpu_backend_maps_no_cublas(void **state)
{
    (void)state;
    ig_backend_t *be = NULL;
    char err[256];
    assert_int_equal(ig_backend_open(&be, "cpu:1", 0, err, sizeof(err)), 0);
    assert_false(mapped("libcublas"));
    assert_false(mapped("libinfergate_cuda.so"));
    be->destroy(be);
}

int main(void)
{
#if !defined(IG_HAVE_CUDA) || defined(IG_CUDA_EMU)
    printf("# SKIP test_cuda_module: this build has no CUDA module\n");
    return 77;
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_backend_maps_no_cublas),
        cmocka_unit_test(test_loaded_on_first_gpu_device),
        cmocka_unit_test(test_missing_module_is_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
