/*
 * ig_model_quantize's refusals: a dtype other than Q8_0, and a matrix whose
 * rows are not whole blocks of 32 (the tensor named); quantizing twice is a
 * no-op. (test_model_quant_reference checks the quantized model's logits.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "files.h"
#include "model_fixture.h"

#include "infergate/error.h"
#include "infergate/model.h"

#include <string.h>

static void test_quantize_errors(void **state)
{
    char dir[4096], err[256] = "";
    int real = 0;
    assert_int_equal(ig_fixture_model_dir("tiny", IG_DTYPE_BF16, dir, sizeof(dir), &real), 0);
    ig_model_t *m;
    assert_int_equal(ig_model_load(&m, dir, err, sizeof(err)), 0);
    assert_int_equal(ig_model_quantize(m, IG_DTYPE_F16, err, sizeof(err)), IG_EINVAL);
    assert_non_null(strstr(err, "q8_0"));
    assert_int_equal(ig_model_quantize(m, IG_DTYPE_Q8_0, err, sizeof(err)), 0);
    assert_int_equal(ig_model_quantize(m, IG_DTYPE_Q8_0, err, sizeof(err)), 0); /* twice: no-op */
    ig_model_free(m);
    ig_tf_rmtree(dir);
    /* a matrix whose rows are not whole blocks: refused, the tensor named */
    ig_fixture_spec_t spec;
    assert_int_equal(ig_fixture_preset("tiny", &spec), 0);
    spec.hidden = 172;
    assert_int_equal(ig_tf_mkdtemp(dir, sizeof(dir)), 0);
    assert_int_equal(ig_fixture_write(&spec, dir), 0);
    assert_int_equal(ig_model_load(&m, dir, err, sizeof(err)), 0);
    assert_int_equal(ig_model_quantize(m, IG_DTYPE_Q8_0, err, sizeof(err)), IG_EMODEL);
    assert_string_equal(err, "model.layers.0.mlp.down_proj.weight: 172 columns, not a multiple "
                             "of 32: cannot be Q8_0");
    ig_model_free(m);
    ig_tf_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
