/* Test support: running the NumPy reference forward pass (numpy_ref.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "numpy_ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#define PY "/usr/bin/python3"

static int exited_ok(int st)
{
    return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int ig_ref_have_numpy(void)
{
    return exited_ok(system(PY " -c 'import numpy' >/dev/null 2>&1"));
}

float *ig_ref_logits(const char *dir, const int *prompts, int stride, const int *lens, int nprompts,
                     int vocab)
{
    char pj[4200], out[4200], cmd[16384];
    size_t total = 0;
    snprintf(pj, sizeof(pj), "%s/prompts.json", dir);
    snprintf(out, sizeof(out), "%s/ref.bin", dir);
    FILE *f = fopen(pj, "w");
    assert_non_null(f);
    fputc('[', f);
    for (int p = 0; p < nprompts; p++) {
        fprintf(f, "%s[", p ? "," : "");
        for (int i = 0; i < lens[p]; i++)
            fprintf(f, "%s%d", i ? "," : "", prompts[(size_t)p * stride + i]);
        fputc(']', f);
        total += (size_t)lens[p];
    }
    fputs("]\n", f);
    fclose(f);
    snprintf(cmd, sizeof(cmd),
             PY " '%s/tests/reference/llama_ref.py' --model '%s' --prompts '%s' --out '%s'",
             IG_SOURCE_DIR, dir, pj, out);
    assert_true(exited_ok(system(cmd)));
    size_t n = total * (size_t)vocab;
    float *ref = malloc(n * sizeof(float));
    assert_non_null(ref);
    f = fopen(out, "rb");
    assert_non_null(f);
    assert_int_equal(fread(ref, sizeof(float), n, f), n);
    fclose(f);
    return ref;
}
