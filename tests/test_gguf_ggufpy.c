/*
 * GGUF files as llama.cpp's own tools write them. tests/peers/ggufpy_model.py
 * writes, with llama.cpp's gguf-py, a random-weight Llama around the
 * byte-level vocabulary of `mkmodel --preset gqa`, once per
 * tokenizer.ggml.pre name (default, gpt-2, llama-bpe, qwen2: three
 * different split regex lists, and llama-bpe's default add_bos_token and
 * ignore_merges). For each file, our worker and llama.cpp's llama-server:
 *   - give the same greedy text for 3 token-id prompts, 40 tokens each;
 *   - tokenize every text of a corpus (contractions in both cases, digit
 *     runs, punctuation runs, spaces, tabs and newlines in runs, accents,
 *     CJK, emoji, special-token text) to the same ids, special tokens parsed
 *     and BOS added where the file says (llama.cpp's /tokenize with
 *     add_special).
 * Skipped (77) without llama-server ($LLAMACPP_BIN, default
 * /work/peers/llama.cpp/build/bin), without gguf-py ($LLAMACPP_SRC, default
 * /work/peers/llama.cpp) or without NumPy for $IG_PYTHON (default
 * /usr/bin/python3).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "files.h"
#include "llamacpp.h"
#include "proc.h"
#include "testclient.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char server[1024], src[1024], python[1024], hf[4096];

static const char *corpus[] = {
    "Hello world",
    " Hello world",
    "  two leading spaces",
    "It's, I'm, we'll, they've, she'd, you're, IT'S, I'M, WE'LL, THEY'VE, SHE'D",
    "don't stop 'til the end's near",
    "1 12 123 1234 12345 123456 1234567 3.14159 1,000,000",
    "version 2.0.1-rc3 build #42 at 10:30pm",
    "Punctuation!!! ... ??? ;-) (parens) [brackets] {braces} <angles> $100 +1 =2 ^3 ~4 |5| `tick`",
    "email@example.com https://example.com/path?q=1&r=2#frag",
    "tabs\there\tand\t\tthere",
    "new\nlines\n\nand\r\nCRLF\n\n\n  indented\n",
    "trailing spaces   ",
    "   ",
    "\n",
    "multiple     spaces    between",
    "caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9 \xc3\x9c"
    "ber stra\xc3\x9f"
    "e",
    "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e "
    "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4",
    "emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd and \xe2\x9c\x93 marks",
    "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xce\xba\xcf\x8c\xcf\x83\xce\xbc\xce\xb5",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "def f(x):\n    return x**2 + 1  # square\n",
    "int main(void) { printf(\"%d\\n\", 42); return 0; }",
    "ALL CAPS SENTENCE. MiXeD CaSe WoRdS. camelCaseIdentifier snake_case_name",
    "The quick brown fox jumps over the lazy dog; the dog sleeps. 'Quoted' and \"double\".",
    "a-b_c.d/e\\f",
    "___ --- +++ === ...",
};

/* The ids of one reply's "tokens" as a compact JSON string (new). */
static char *ids_of(json_t *reply)
{
    json_t *t = json_object_get(reply, "tokens");
    return t ? json_dumps(t, JSON_COMPACT) : strdup("(none)");
}

static void check_pre(const char *pre, int expect_bos)
{
    char dir[4096], path[4200], cmd[16384];
    assert_int_equal(ig_tf_mkdtemp(dir, sizeof(dir)), 0);
    snprintf(path, sizeof(path), "%s/%s.gguf", dir, pre);
    snprintf(cmd, sizeof(cmd),
             "'%s' '%s/tests/peers/ggufpy_model.py' --gguf-py '%s/gguf-py' --tokenizer '%s' "
             "--pre '%s' --out '%s'",
             python, IG_SOURCE_DIR, src, hf, pre, path);
    assert_int_equal(system(cmd), 0);

    int lport = ig_proc_free_port(), wport = ig_proc_free_port();
    char lp[16], wl[64];
    snprintf(lp, sizeof(lp), "%d", lport);
    snprintf(wl, sizeof(wl), "127.0.0.1:%d", wport);
    char *largv[] = {server, "-m", path, "--port", lp,    "--host", "127.0.0.1",
                     "-t",   "1",  "-c", "512",    "-np", "1",      NULL};
    ig_proc_t L, W;
    assert_int_equal(ig_proc_start(&L, largv, IG_PROC_PIPE_ERR | IG_PROC_PIPE_OUT), 0);
    const char *wargv[] = {"worker",   "--model", path,          "--device", "cpu:1",
                           "--listen", wl,        "--log-level", "warn",     NULL};
    assert_int_equal(ig_proc_start_bin(&W, "infergate", wargv, 0), 0);
    assert_int_equal(ig_proc_wait_status(wport, "/ready", 200, 30000), 0);
    assert_int_equal(ig_proc_wait_status(lport, "/health", 200, 60000), 0);

    /* Greedy text on token-id prompts. */
    static const char *prompts[] = {"[1200, 340, 2000, 77, 901, 15, 3000, 42]",
                                    "[10, 20, 30, 40, 50, 60, 70]",
                                    "[5000, 4000, 3000, 2000, 1000, 500, 250, 125, 64, 33]"};
    for (int i = 0; i < 3; i++) {
        char *lt, *wt;
        ig_llamacpp_greedy(lport, wport, prompts[i], 40, "", &lt, &wt);
        if (strcmp(lt, wt) != 0)
            fail_msg("%s: prompt %d: llama.cpp \"%s\", infergate \"%s\"", pre, i, lt, wt);
        assert_true(strlen(wt) > 0);
        free(lt);
        free(wt);
    }

    /* The corpus, text by text. */
    json_int_t first[2] = {-1, -2};
    for (size_t i = 0; i < sizeof(corpus) / sizeof(corpus[0]); i++) {
        json_t *b = json_pack("{s:s, s:b}", "content", corpus[i], "add_special", 1);
        char *lb = json_dumps(b, JSON_COMPACT);
        json_decref(b);
        b = json_pack("{s:s}", "prompt", corpus[i]);
        char *wb = json_dumps(b, JSON_COMPACT);
        json_decref(b);
        json_t *lj = ig_llamacpp_post(lport, "/tokenize", lb),
               *wj = ig_llamacpp_post(wport, "/v1/tokenize", wb);
        assert_non_null(lj);
        assert_non_null(wj);
        char *li = ids_of(lj), *wi = ids_of(wj);
        if (strcmp(li, wi) != 0)
            fail_msg("%s: corpus[%zu] \"%s\":\n  llama.cpp %s\n  infergate %s", pre, i, corpus[i],
                     li, wi);
        if (i < 2)
            first[i] = json_integer_value(json_array_get(json_object_get(wj, "tokens"), 0));
        free(li), free(wi), free(lb), free(wb);
        json_decref(lj);
        json_decref(wj);
    }
    /* "Hello world" and " Hello world" start alike only behind a BOS. */
    if (expect_bos)
        assert_int_equal(first[0], first[1]);
    else
        assert_int_not_equal(first[0], first[1]);
    print_message("# %s: 3 greedy texts and %zu corpus texts identical\n", pre,
                  sizeof(corpus) / sizeof(corpus[0]));
    ig_proc_stop(&W, 15, 5000);
    ig_proc_stop(&L, 15, 5000);
    ig_proc_dispose(&W);
    ig_proc_dispose(&L);
    ig_tf_rmtree(dir);
}

static void test_pre_default(void **state)
{
    (void)state;
    check_pre("default", 0);
}

static void test_pre_gpt2(void **state)
{
    (void)state;
    check_pre("gpt-2", 0);
}

static void test_pre_llama_bpe(void **state)
{
    (void)state;
    check_pre("llama-bpe", 1);
}

static void test_pre_qwen2(void **state)
{
    (void)state;
    check_pre("qwen2", 0);
}

static int setup(void **state)
{
    (void)state;
    char cmd[8192];
    assert_int_equal(ig_tf_mkdtemp(hf, sizeof(hf)), 0);
    snprintf(cmd, sizeof(cmd), "'%s' mkmodel --preset gqa --out '%s/m' >/dev/null",
             ig_proc_bin("infergate"), hf);
    if (system(cmd) != 0)
        return -1;
    strcat(hf, "/m");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char *slash = strrchr(hf, '/');
    *slash = '\0';
    ig_tf_rmtree(hf);
    return 0;
}

int main(void)
{
    const char *d = getenv("LLAMACPP_BIN"), *s = getenv("LLAMACPP_SRC"), *p = getenv("IG_PYTHON");
    snprintf(server, sizeof(server), "%s/llama-server",
             d && *d ? d : "/work/peers/llama.cpp/build/bin");
    snprintf(src, sizeof(src), "%s", s && *s ? s : "/work/peers/llama.cpp");
    snprintf(python, sizeof(python), "%s", p && *p ? p : "/usr/bin/python3");
    char probe[4096], gw[1100];
    snprintf(gw, sizeof(gw), "%s/gguf-py/gguf/gguf_writer.py", src);
    snprintf(probe, sizeof(probe), "'%s' -c 'import numpy' 2>/dev/null", python);
    if (access(server, X_OK) != 0 || access(gw, R_OK) != 0 || system(probe) != 0) {
        printf("# SKIP: needs llama-server in $LLAMACPP_BIN, gguf-py in $LLAMACPP_SRC and "
               "NumPy for $IG_PYTHON\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pre_default),
        cmocka_unit_test(test_pre_gpt2),
        cmocka_unit_test(test_pre_llama_bpe),
        cmocka_unit_test(test_pre_qwen2),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
