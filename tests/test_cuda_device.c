/*
 * The CUDA backend's handling of its device, under the CUDA emulation
 * (-DIG_CUDA_EMU=ON, two emulated devices; kernels/cuda/emu/ig_cuda_emu.h
 * injects faults): the emulation's own memory checks, the current device
 * after another library changed it, a
 * free when entering the device fails, the opt-in sync-after-every-op mode
 * (IG_CUDA_SYNC=1) naming the operation whose kernel faulted, and the MIG
 * check that device 0 is the requested slice. On a real GPU these cases
 * cannot be staged (one device, no fault injection): the program then
 * exits 77 (ctest: Skipped), as it does without CUDA.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/error.h"
#include "infergate/kernels.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef IG_CUDA_EMU
#include "ig_cuda_emu.h"
#include <cuda_runtime_api.h>

/* ---- helpers --------------------------------------------------------------- */

static ig_backend_t *open_cuda(int ordinal)
{
    ig_backend_t *be = NULL;
    char err[256] = "";
    if (ig_backend_cuda_create(&be, ordinal, err, sizeof(err)) != 0)
        fail_msg("cuda:%d: %s", ordinal, err);
    return be;
}

/* stderr into a file while `captured` is open, so that a test can read what
 * was logged. */
static int saved_fd = -1;
static char captured_path[] = "/tmp/ig-cuda-device-XXXXXX";

static void capture_begin(void)
{
    fflush(stderr);
    int fd = mkstemp(captured_path);
    assert_true(fd >= 0);
    saved_fd = dup(2);
    dup2(fd, 2);
    close(fd);
}

static char *capture_end(void)
{
    static char buf[8192];
    fflush(stderr);
    dup2(saved_fd, 2);
    close(saved_fd);
    FILE *f = fopen(captured_path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    unlink(captured_path);
    strcpy(captured_path, "/tmp/ig-cuda-device-XXXXXX");
    fputs(buf, stderr); /* still visible in the test's output */
    return buf;
}

/* rmsnorm of one row of 64 ones with unit weights: every output is 1. */
static int run_rmsnorm(ig_backend_t *be, float *out_host)
{
    enum { DIM = 64 };
    float ones[DIM];
    for (int i = 0; i < DIM; i++)
        ones[i] = 1.0f;
    ig_tensor_t t = {.dtype = IG_DTYPE_F32, .data = ones, .ndim = 1, .shape = {DIM}};
    ig_weight_t w;
    int rc = be->upload_weight(be, &t, &w);
    if (rc != 0)
        return rc;
    float *d = be->alloc(be, sizeof(ones));
    assert_non_null(d);
    rc = be->upload(be, d, ones, sizeof(ones));
    if (rc == 0)
        rc = be->rmsnorm(be, d, d, &w, 1, 1e-6f);
    if (rc == 0)
        rc = be->download(be, out_host, d, sizeof(ones));
    be->free(be, d);
    be->free_weight(be, &w);
    return rc;
}

/* ---- tests ----------------------------------------------------------------- */

/* Another library (or this process's other backend) sets the current device
 * on the engine's thread: the next operation must still run on the
 * backend's own device. */
static void test_enter_after_foreign_set_device(void **state)
{
    ig_backend_t *be0 = open_cuda(0), *be1 = open_cuda(1);
    float out[64];
    assert_int_equal(run_rmsnorm(be0, out), 0);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(run_rmsnorm(be0, out), 0);
    for (int i = 0; i < 64; i++)
        assert_true(out[i] > 0.999f && out[i] < 1.001f);
    assert_int_equal(run_rmsnorm(be1, out), 0);
    be1->destroy(be1);
    be0->destroy(be0);
}

/* A free whose cudaSetDevice fails must still release the memory. */
static void test_free_when_enter_fails(void **state)
{
    ig_backend_t *be = open_cuda(0);
    void *p = be->alloc(be, 4096);
    assert_non_null(p);
    size_t before = ig_cuda_emu_live_allocations();
    assert_int_equal(cudaSetDevice(1), cudaSuccess); /* the backend must enter device 0 */
    ig_cuda_emu_fault("cudaSetDevice");
    be->free(be, p);
    assert_int_equal(ig_cuda_emu_live_allocations(), before - 1);
    be->destroy(be);
}

/* A kernel that faults is reported asynchronously, at the next host wait.
 * With IG_CUDA_SYNC=1 the backend waits after every operation, so the
 * failing operation itself returns the error and the log names it. */
static void test_sync_mode_names_the_op(void **state)
{
    float out[64];
    setenv("IG_CUDA_SYNC", "1", 1);
    ig_backend_t *be = open_cuda(0);
    unsetenv("IG_CUDA_SYNC");
    ig_cuda_emu_fault("rmsnorm_kernel");
    capture_begin();
    int rc = run_rmsnorm(be, out);
    char *log = capture_end();
    assert_int_equal(rc, IG_EDEVICE);
    assert_non_null(strstr(log, "rmsnorm"));
    assert_non_null(strstr(log, "cudaErrorLaunchFailure"));
    /* The device works again afterwards (the emulated fault is not sticky). */
    assert_int_equal(run_rmsnorm(be, out), 0);
    be->destroy(be);

    /* Without the mode the op returns 0 and the download reports it. */
    be = open_cuda(0);
    ig_cuda_emu_fault("rmsnorm_kernel");
    assert_int_equal(run_rmsnorm(be, out), IG_EDEVICE);
    be->destroy(be);
}

/* Started for MIG-<uuid>, the backend checks that device 0 is that slice. */
static void test_mig_uuid_checked(void **state)
{
    struct cudaDeviceProp p;
    assert_int_equal(cudaGetDeviceProperties(&p, 0), cudaSuccess);
    const unsigned char *u = (const unsigned char *)p.uuid.bytes;
    char right[64], err[256] = "";
    snprintf(right, sizeof(right),
             "MIG-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
             u[15]);
    const char *wrong = "MIG-4b4b7b6e-1c39-5d3c-9a2b-0f6e5c2d1a11";
    ig_backend_t *be = NULL;

    setenv("CUDA_VISIBLE_DEVICES", wrong, 1);
    assert_int_equal(ig_backend_open(&be, wrong, 1, err, sizeof(err)), IG_EDEVICE);
    assert_null(be);
    assert_non_null(strstr(err, wrong));
    assert_non_null(strstr(err, right + 4));

    setenv("CUDA_VISIBLE_DEVICES", right, 1);
    if (ig_backend_open(&be, right, 1, err, sizeof(err)) != 0)
        fail_msg("%s: %s", right, err);
    be->destroy(be);
    unsetenv("CUDA_VISIBLE_DEVICES");
}

/* The emulation itself: a copy in the wrong direction is an error, and host
 * code that reads device memory dies of SIGSEGV (in a child process). */
static void test_emulation_checks_memory(void **state)
{
    ig_backend_t *be = open_cuda(0);
    float host[16] = {0};
    float *a = be->alloc(be, sizeof(host)), *b = be->alloc(be, sizeof(host));
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(be->upload(be, a, host, sizeof(host)), 0);
    assert_int_equal(be->upload(be, a, b, sizeof(host)), IG_EDEVICE);   /* src is device memory */
    assert_int_equal(be->download(be, a, b, sizeof(host)), IG_EDEVICE); /* dst is device memory */
    assert_int_equal(be->upload(be, a, host, sizeof(host) + 4096), IG_EDEVICE); /* past the end */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        volatile float x = a[3]; /* a host read of device memory */
        (void)x;
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);
    be->free(be, a);
    be->free(be, b);
    be->destroy(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_emulation_checks_memory),
        cmocka_unit_test(test_enter_after_foreign_set_device),
        cmocka_unit_test(test_free_when_enter_fails),
        cmocka_unit_test(test_sync_mode_names_the_op),
        cmocka_unit_test(test_mig_uuid_checked),
    };
    return cmocka_run_group_tests_name("cuda_device", tests, NULL, NULL);
}

#else

int main(void)
{
    printf("# SKIP test_cuda_device: these cases need the CUDA emulation (-DIG_CUDA_EMU=ON)\n");
    return 77;
}

#endif
