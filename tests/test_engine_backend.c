/*
 * ig_backend_open: device strings "cpu", "cpu:THREADS", "cuda:N" and
 * "MIG-<uuid>", and the errors for everything else.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "../kernels/cpu/cpu_internal.h"
#include "infergate/error.h"
#include "infergate/kernels.h"

#include <stdlib.h>
#include <string.h>

static void test_cpu(void **state)
{
    ig_backend_t *be = NULL;
    char err[256] = "";
    assert_int_equal(ig_backend_open(&be, "cpu", 2, err, sizeof(err)), 0);
    assert_string_equal(be->name, "cpu");
    assert_non_null(be->matmul);
    assert_non_null(be->attention);
    be->destroy(be);
    assert_int_equal(ig_backend_open(&be, "cpu:3", 0, err, sizeof(err)), 0);
    be->destroy(be);
    assert_int_equal(ig_backend_open(&be, "cpu", 0, err, sizeof(err)), 0); /* all cores */
    be->destroy(be);
}

static void test_rejects(void **state)
{
    static const char *bad[] = {"",        "cpu:", "cpu:0",   "cpu:x", "cpu:2x", "cpu:-1",
                                "cpu:999", "CPU",  "gpu",     "cuda",  "cuda:",  "cuda:a",
                                "cuda:-1", "MIG-", "MIG-zz!", "tpu:0"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ig_backend_t *be = NULL;
        char err[256] = "";
        int rc = ig_backend_open(&be, bad[i], 1, err, sizeof(err));
        if (rc != IG_EINVAL)
            fail_msg("'%s' gave %s, expected IG_EINVAL", bad[i], ig_err_name(rc));
        assert_null(be);
        assert_true(strlen(err) > 0);
    }
    ig_backend_t *be = NULL;
    char err[256] = "";
    assert_int_equal(ig_backend_open(&be, NULL, 1, err, sizeof(err)), IG_EINVAL);
    assert_int_equal(ig_backend_open(&be, "cpu", 257, err, sizeof(err)), IG_EINVAL);
}

static void test_cuda(void **state)
{
    ig_backend_t *be = NULL;
    char err[256] = "";
    int rc = ig_backend_open(&be, "cuda:0", 1, err, sizeof(err));
#ifdef IG_HAVE_CUDA
    /* With CUDA built in: a backend, or a device error when no GPU is here. */
    assert_true(rc == 0 || rc == IG_EDEVICE);
    if (rc == 0)
        be->destroy(be);
    else
        assert_true(strlen(err) > 0);
#else
    assert_int_equal(rc, IG_ENOTSUP);
    assert_non_null(strstr(err, "CUDA"));
#endif
}

static void test_mig(void **state)
{
    ig_backend_t *be = NULL;
    char err[256] = "";
    const char *mig = "MIG-4b4b7b6e-1c39-5d3c-9a2b-0f6e5c2d1a11";
    /* Another slice already selected: refused, it would not be device 0. */
    setenv("CUDA_VISIBLE_DEVICES", "MIG-00000000-0000-0000-0000-000000000000", 1);
    assert_int_equal(ig_backend_open(&be, mig, 1, err, sizeof(err)), IG_EINVAL);
    assert_non_null(strstr(err, "CUDA_VISIBLE_DEVICES"));
    setenv("CUDA_VISIBLE_DEVICES", mig, 1);
    int rc = ig_backend_open(&be, mig, 1, err, sizeof(err));
#ifdef IG_HAVE_CUDA
    assert_true(rc == 0 || rc == IG_EDEVICE);
    if (rc == 0)
        be->destroy(be);
#else
    assert_int_equal(rc, IG_ENOTSUP);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_cuda),
        cmocka_unit_test(test_mig),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
