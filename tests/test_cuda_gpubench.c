/*
 * Smoke run of bench/gpubench on the CPU backend: the benchmark the GPU
 * check script drives must build and run everywhere, so its decode and
 * prefill loops are exercised here on a tiny model in about a second. The
 * figures themselves are not judged (that is bench/gpu-check.sh's job on a
 * GPU); the test checks the run completes and reports what it measured.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "files.h"
#include "model_fixture.h"

#include "infergate/mkmodel.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* $IG_BIN_DIR when set (ctest sets it; so does bench/gpu-check.sh --prebuilt
 * for a bundle built elsewhere), else the build tree. */
static const char *bin_dir(void)
{
    return getenv("IG_BIN_DIR") ? getenv("IG_BIN_DIR") : IG_BIN_DIR;
}

/* Writes mkmodel's tiny preset into a fresh directory (its path to dir; the
 * caller removes it), runs gpubench over it with ARGS (two decode batch
 * sizes) and returns the JSON it wrote (a new reference), checked to hold
 * one decode row a batch size. */
static json_t *run_on_tiny(const char *bin, char *dir, size_t dirlen, const char *args)
{
    char err[256] = "", json[4200], cmd[16384];
    assert_int_equal(ig_tf_mkdtemp(dir, dirlen), 0);
    ig_mkmodel_opts_t o;
    ig_mkmodel_opts_default(&o);
    o.preset = "tiny";
    if (ig_mkmodel_write(dir, &o, err, sizeof(err)) != 0)
        fail_msg("mkmodel: %s", err);
    snprintf(json, sizeof(json), "%s/result.json", dir);
    snprintf(cmd, sizeof(cmd), "'%s' --model '%s' %s --json '%s' > /dev/null", bin, dir, args,
             json);
    assert_int_equal(system(cmd), 0);
    json_error_t je;
    json_t *root = json_load_file(json, 0, &je);
    assert_non_null(root);
    assert_int_equal(json_array_size(json_object_get(root, "decode")), 2);
    return root;
}

static void test_gpubench_cpu_smoke(void **state)
{
    char dir[4096], bin[4096], cmd[16384];
    snprintf(bin, sizeof(bin), "%s/gpubench", bin_dir());
    if (access(bin, X_OK) != 0) {
        print_message("gpubench not built at %s\n", bin);
        skip();
    }
    json_t *root = run_on_tiny(bin, dir, sizeof(dir),
                               "--device cpu:1 --batches 1,4 --steps 3 --ctx 8 "
                               "--prefill-seqs 2 --prefill-len 16");
    for (size_t i = 0; i < 2; i++) {
        json_t *d = json_array_get(json_object_get(root, "decode"), i);
        assert_int_equal(json_integer_value(json_object_get(d, "batch")), i == 0 ? 1 : 4);
        assert_true(json_real_value(json_object_get(d, "tokens_per_s")) > 0);
        assert_true(json_real_value(json_object_get(d, "bytes_per_step")) > 0);
    }
    assert_true(json_real_value(json_object_get(json_object_get(root, "prefill"), "tokens_per_s")) >
                0);
    json_decref(root);

    /* A bad device is refused with a message, not a crash. */
    snprintf(cmd, sizeof(cmd), "'%s' --model '%s' --device bogus > /dev/null 2>&1", bin, dir);
    assert_int_not_equal(system(cmd), 0);
    ig_tf_rmtree(dir);
}

/*
 * Over the CUDA emulation gpubench runs the CUDA backend itself and reports
 * what the emulation counted per decode step: kernel launches, host syncs,
 * uploads, and they meet their targets (docs/gpu.md): at most 8 launches
 * a layer + 8, one host sync, one upload from page-locked memory. Its
 * greedy check decodes the same tokens as the CPU backend.
 */
static void test_gpubench_emulated_counts(void **state)
{
#ifndef IG_CUDA_EMU
    print_message("needs the CUDA emulation (-DIG_CUDA_EMU=ON)\n");
    skip();
#else
    char dir[4096], bin[4096];
    snprintf(bin, sizeof(bin), "%s/gpubench", bin_dir());
    assert_int_equal(access(bin, X_OK), 0);
    json_t *root = run_on_tiny(bin, dir, sizeof(dir),
                               "--device cuda:0 --batches 1,3 --steps 2 --ctx 8 "
                               "--prefill-seqs 1 --prefill-len 16 --greedy-check 6");
    for (size_t i = 0; i < 2; i++) {
        json_t *n =
            json_object_get(json_array_get(json_object_get(root, "decode"), i), "emulated_counts");
        assert_non_null(n);
        /* The tiny preset has 2 layers: at least q/k/v, attention, MLP per
         * layer, and at most the target of 8 a layer + 8 (the fused decode
         * step: 7 a layer + 3); the logits download is the one host wait,
         * the step's metadata one upload from page-locked memory. */
        double launches = json_real_value(json_object_get(n, "launches_per_step"));
        assert_true(launches >= 2 * 6 && launches == (int)launches);
        assert_int_equal(json_integer_value(json_object_get(n, "launch_target")), 8 * 2 + 8);
        if (!(launches <= 8 * 2 + 8))
            fail_msg("%g launches per decode step, the target is %d", launches, 8 * 2 + 8);
        assert_true(json_real_value(json_object_get(n, "host_syncs_per_step")) == 1);
        assert_true(json_real_value(json_object_get(n, "uploads_per_step")) == 1);
        assert_true(json_real_value(json_object_get(n, "pageable_uploads_per_step")) == 0);
    }
    /* The same weights on the CPU backend give the same greedy tokens. */
    json_t *g = json_object_get(root, "greedy_check");
    assert_int_equal(json_integer_value(json_object_get(g, "tokens")), 6);
    assert_true(json_is_true(json_object_get(g, "same")));
    json_decref(root);
    ig_tf_rmtree(dir);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpubench_cpu_smoke),
        cmocka_unit_test(test_gpubench_emulated_counts),
    };
    return cmocka_run_group_tests_name("cuda_gpubench", tests, NULL, NULL);
}
