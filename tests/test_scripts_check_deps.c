/*
 * scripts/check-deps.sh: it passes on the real tree, and on a small tree
 * whose docs/DESIGN.md is the real one it passes while every include is
 * allowed, then fails, naming the edge, on a planted forbidden include (the
 * engine reaching up into api/) and on a public header no row owns.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "files.h"
#include "proc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char out[16384];

static int run(const char *root)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "sh %s/scripts/check-deps.sh %s 2>&1", IG_SOURCE_DIR, root);
    return ig_proc_capture(cmd, out, sizeof(out));
}

static void put(const char *root, const char *rel, const char *text)
{
    char path[1024], dir[1200];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    snprintf(dir, sizeof(dir), "mkdir -p \"$(dirname %s)\"", path);
    char ignore[64];
    assert_int_equal(ig_proc_capture(dir, ignore, sizeof(ignore)), 0);
    assert_int_equal(ig_tf_write(path, text, strlen(text)), 0);
}

static void test_real_tree_passes(void **state)
{
    (void)state;
    int rc = run(IG_SOURCE_DIR);
    if (rc != 0)
        print_message("%s", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "all allowed"));
}

/* A tree with the real table and an engine file that includes only base. */
static void small_tree(char *root, size_t cap)
{
    assert_int_equal(ig_tf_mkdtemp(root, cap), 0);
    size_t len;
    char *design = ig_tf_read(IG_SOURCE_DIR "/docs/DESIGN.md", &len);
    assert_non_null(design);
    put(root, "docs/DESIGN.md", design);
    free(design);
    put(root, "include/infergate/error.h", "/* base */\n");
    put(root, "include/infergate/api.h", "#include \"infergate/error.h\"\n");
    put(root, "gateway/engine/own.h", "/* engine's own */\n");
    put(root, "gateway/engine/x.c",
        "#include \"infergate/error.h\"\n#include \"own.h\"\n#include <stdio.h>\n");
}

static void test_forbidden_include_fails(void **state)
{
    (void)state;
    char root[256];
    small_tree(root, sizeof(root));
    assert_int_equal(run(root), 0);
    put(root, "gateway/engine/x.c", "#include \"infergate/error.h\"\n#include \"infergate/api.h\"\n");
    assert_int_equal(run(root), 1);
    assert_non_null(strstr(out, "gateway/engine/x.c:2: engine -> api (infergate/api.h)"));
    ig_tf_rmtree(root);
}

static void test_relative_path_up_fails(void **state)
{
    (void)state;
    char root[256];
    small_tree(root, sizeof(root));
    put(root, "gateway/api/request_internal.h", "/* api's own */\n");
    put(root, "kernels/cpu/k.c", "#include \"../../gateway/api/request_internal.h\"\n");
    assert_int_equal(run(root), 1);
    assert_non_null(strstr(out, "kernels/cpu/k.c:1: kernels -> api"));
    ig_tf_rmtree(root);
}

static void test_unowned_header_fails(void **state)
{
    (void)state;
    char root[256];
    small_tree(root, sizeof(root));
    put(root, "include/infergate/orphan.h", "/* nobody's */\n");
    assert_int_equal(run(root), 1);
    assert_non_null(strstr(out, "include/infergate/orphan.h: public header owned by no row"));
    ig_tf_rmtree(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_tree_passes),
        cmocka_unit_test(test_forbidden_include_fails),
        cmocka_unit_test(test_relative_path_up_fails),
        cmocka_unit_test(test_unowned_header_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
