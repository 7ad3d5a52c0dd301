/* safetensors.h: the streaming writer, reading back exact values, and every
 * way a header can lie, each rejected with IG_EMODEL and a message naming the
 * file and the tensor or field. */
#include "model_testutil.h"

#include "infergate/safetensors.h"

/* Writes "x.safetensors" with the given header text and data_len data bytes. */
static char *raw_file(const char *header, size_t data_len)
{
    char *path = tu_path(tu_dir, "x.safetensors");
    size_t hl = strlen(header);
    unsigned char *buf = calloc(1, 8 + hl + data_len + 1);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + hl + i] = (unsigned char)i;
    tu_write(path, buf, 8 + hl + data_len);
    free(buf);
    return path;
}

/* Opens path, expecting failure with code and a message holding want. */
static void expect_open_error(const char *path, int code, const char *want)
{
    ig_safetensors_t *st = NULL;
    char err[512] = "";
    int rc = ig_safetensors_open(&st, path, err, sizeof(err));
    if (rc != code)
        fail_msg("open: got %s (%s), expected %s", ig_err_name(rc), err, ig_err_name(code));
    assert_null(st);
    if (strstr(err, want) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", err, want);
    assert_non_null(strstr(err, "x.safetensors: "));
}

static void expect_raw_error(const char *header, size_t data_len, const char *want)
{
    char *path = raw_file(header, data_len);
    expect_open_error(path, IG_EMODEL, want);
    free(path);
}

static void test_roundtrip(void **state)
{
    (void)state;
    char *path = tu_path(tu_dir, "rt.safetensors");
    char err[256];
    ig_safetensors_spec_t specs[] = {
        {"b.f32", IG_DTYPE_F32, 2, {3, 5}},      {"a.f16", IG_DTYPE_F16, 1, {7}},
        {"c.bf16", IG_DTYPE_BF16, 3, {2, 2, 2}}, {"d.empty", IG_DTYPE_F32, 2, {0, 4}},
        {"e.scalar", IG_DTYPE_F32, 0, {0}},
    };
    float f32[15], scalar = -2.5f;
    uint16_t f16[7], bf16[8];
    for (int i = 0; i < 15; i++)
        f32[i] = (float)i * 0.1f - 0.7f;
    for (int i = 0; i < 7; i++)
        f16[i] = ig_f32_to_f16((float)i / 3.0f);
    for (int i = 0; i < 8; i++)
        bf16[i] = ig_f32_to_bf16((float)i * -1.25f);
    ig_safetensors_writer_t *w = NULL;
    assert_int_equal(ig_safetensors_writer_open(&w, path, specs, 5, err, sizeof(err)), 0);
    /* writes may split a tensor anywhere */
    assert_int_equal(ig_safetensors_writer_write(w, f32, 7, err, sizeof(err)), 0);
    assert_int_equal(ig_safetensors_writer_write(w, (char *)f32 + 7, 53, err, sizeof(err)), 0);
    assert_int_equal(ig_safetensors_writer_write(w, f16, sizeof(f16), err, sizeof(err)), 0);
    assert_int_equal(ig_safetensors_writer_write(w, bf16, sizeof(bf16), err, sizeof(err)), 0);
    assert_int_equal(ig_safetensors_writer_write(w, &scalar, 4, err, sizeof(err)), 0);
    assert_int_equal(ig_safetensors_writer_close(w, err, sizeof(err)), 0);

    ig_safetensors_t *st = NULL;
    assert_int_equal(ig_safetensors_open(&st, path, err, sizeof(err)), 0);
    assert_int_equal(ig_safetensors_count(st), 5);
    assert_string_equal(ig_safetensors_at(st, 0)->name, "a.f16"); /* sorted by name */
    assert_string_equal(ig_safetensors_file_name(st), "rt.safetensors");

    const ig_safetensors_entry_t *e = ig_safetensors_find(st, "b.f32");
    assert_non_null(e);
    assert_int_equal(e->dtype, IG_DTYPE_F32);
    assert_int_equal(e->ndim, 2);
    assert_int_equal(e->shape[0], 3);
    assert_int_equal(e->shape[1], 5);
    assert_int_equal(e->nbytes, 60);
    assert_memory_equal(e->data, f32, sizeof(f32)); /* f32 exactly */
    /* the header is padded so the data section starts 8-aligned */
    size_t flen;
    unsigned char *raw = tu_read(path, &flen);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | raw[i];
    assert_int_equal(hl % 8, 0);
    assert_int_equal(flen, 8 + hl + 60 + 14 + 16 + 4);
    free(raw);
    e = ig_safetensors_find(st, "a.f16");
    assert_int_equal(e->dtype, IG_DTYPE_F16);
    float back[8];
    ig_dtype_to_f32(back, e->data, e->dtype, 7);
    for (int i = 0; i < 7; i++)
        assert_true(fabsf(back[i] - (float)i / 3.0f) <= (float)i / 3.0f / 1024);
    e = ig_safetensors_find(st, "c.bf16");
    assert_int_equal(e->ndim, 3);
    ig_dtype_to_f32(back, e->data, e->dtype, 8);
    for (int i = 0; i < 8; i++)
        assert_true(back[i] == (float)i * -1.25f); /* representable: exact */
    e = ig_safetensors_find(st, "d.empty");
    assert_int_equal(e->nbytes, 0);
    e = ig_safetensors_find(st, "e.scalar");
    assert_int_equal(e->ndim, 0);
    assert_int_equal(e->nbytes, 4);
    assert_memory_equal(e->data, &scalar, 4);
    assert_null(ig_safetensors_find(st, "nope"));
    ig_safetensors_close(st);
    free(path);
}

static void test_writer_misuse(void **state)
{
    (void)state;
    char *path = tu_path(tu_dir, "w.safetensors");
    char err[256];
    ig_safetensors_spec_t specs[] = {{"t", IG_DTYPE_F32, 1, {4}}, {"t", IG_DTYPE_F32, 1, {4}}};
    ig_safetensors_writer_t *w = NULL;
    assert_int_equal(ig_safetensors_writer_open(&w, path, specs, 2, err, sizeof(err)), IG_EINVAL);
    assert_null(w);
    ig_safetensors_spec_t neg = {"n", IG_DTYPE_F32, 1, {-1}};
    assert_int_equal(ig_safetensors_writer_open(&w, path, &neg, 1, err, sizeof(err)), IG_EINVAL);

    /* too many bytes */
    float v[5] = {0};
    assert_int_equal(ig_safetensors_writer_open(&w, path, specs, 1, err, sizeof(err)), 0);
    assert_int_equal(ig_safetensors_writer_write(w, v, 20, err, sizeof(err)), IG_EINVAL);
    assert_int_equal(ig_safetensors_writer_close(w, err, sizeof(err)), IG_EIO);
    assert_int_not_equal(access(path, F_OK), 0); /* partial file removed */

    /* too few bytes */
    assert_int_equal(ig_safetensors_writer_open(&w, path, specs, 1, err, sizeof(err)), 0);
    assert_int_equal(ig_safetensors_writer_write(w, v, 12, err, sizeof(err)), 0);
    assert_int_equal(ig_safetensors_writer_close(w, err, sizeof(err)), IG_EINVAL);
    assert_non_null(strstr(err, "12 of 16"));
    assert_int_not_equal(access(path, F_OK), 0);
    free(path);
}

static void test_short_files(void **state)
{
    (void)state;
    char *path = tu_path(tu_dir, "x.safetensors");
    tu_write(path, "", 0);
    expect_open_error(path, IG_EMODEL, "header: file is 0 bytes");
    tu_write(path, "\x02\0\0\0\0\0\0", 7);
    expect_open_error(path, IG_EMODEL, "too short");
    unlink(path);
    expect_open_error(path, IG_ENOENT, "cannot open");
    free(path);
}

static void test_header_length(void **state)
{
    (void)state;
    char *path = raw_file("{}", 0);
    tu_st_set_hlen(path, UINT64_MAX);
    expect_open_error(path, IG_EMODEL, "header: length 18446744073709551615 is absurd");
    tu_st_set_hlen(path, 200u * 1024 * 1024);
    expect_open_error(path, IG_EMODEL, "is absurd");
    tu_st_set_hlen(path, 3);
    expect_open_error(path, IG_EMODEL, "header: length 3 exceeds the 2 bytes after it");
    free(path);
}

static void test_bad_json(void **state)
{
    (void)state;
    expect_raw_error("{\"a\": {", 0, "header: bad JSON");
    expect_raw_error("[1, 2]", 0, "header: not a JSON object");
    expect_raw_error("{\"a\": 1}", 0, "a: header entry is not a JSON object");
    expect_raw_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                     8, "header: bad JSON");
    expect_raw_error("{\"__metadata__\": 5}", 0, "__metadata__: not a JSON object");
    expect_raw_error("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                     "empty name");
}

static void test_bad_fields(void **state)
{
    (void)state;
    expect_raw_error("{\"w\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
                     "w: unsupported dtype I8");
    expect_raw_error("{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
                     "w: unsupported dtype F64");
    expect_raw_error("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                     "w: dtype: missing or not a string");
    expect_raw_error("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
                     "w: shape: missing or not an array");
    expect_raw_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
                     "w: shape has 5 dimensions");
    expect_raw_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                     "w: shape[0] is not a non-negative integer");
    expect_raw_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
                     "w: shape[0] is not a non-negative integer");
    expect_raw_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
                     "w: data_offsets: missing or not a [begin, end] pair");
    expect_raw_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4,
                     "w: data_offsets: not two integers");
    expect_raw_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4,
                     "w: data_offsets: not two integers");
    /* size disagrees with dtype x shape */
    expect_raw_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
                     "w: data_offsets [0, 4] hold 4 bytes, F32 [2] needs a different size");
    /* products that overflow 64 bits are caught, not wrapped */
    expect_raw_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                     "\"data_offsets\":[0,0]}}",
                     0, "needs more than 2^64");
    expect_raw_error("{\"w\":{\"dtype\":\"BF16\",\"shape\":[9223372036854775807,4],"
                     "\"data_offsets\":[0,2]}}",
                     2, "needs more than 2^64");
}

static void test_offsets_that_lie(void **state)
{
    (void)state;
    /* beyond the end of the file (a truncated file looks like this) */
    expect_raw_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
                     "w: data_offsets [0, 8] end beyond the 4 bytes of data (file truncated?)");
    /* overlapping */
    expect_raw_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                     12, "b: data_offsets [4, 12] overlap tensor a");
    /* the same bytes twice */
    expect_raw_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                     8, "overlap tensor a");
    /* a gap between tensors */
    expect_raw_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                     12, "b: data_offsets begin at 8, leaving 4 unused bytes after tensor a");
    /* a gap at the start */
    expect_raw_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                     "leaving 4 unused bytes at the start");
    /* bytes after the last tensor */
    expect_raw_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 9,
                     "a: 5 unused bytes after this last tensor");
    expect_raw_error("{}", 3, "header: 3 bytes of data but no tensors");
    /* out of key order but tiling exactly is fine */
    char *path = raw_file("{\"z\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                          "\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,8]}}",
                          8);
    ig_safetensors_t *st = NULL;
    char err[256];
    assert_int_equal(ig_safetensors_open(&st, path, err, sizeof(err)), 0);
    const ig_safetensors_entry_t *a = ig_safetensors_find(st, "a");
    assert_int_equal(((const unsigned char *)a->data)[0], 4); /* raw_file's byte pattern */
    ig_safetensors_close(st);
    free(path);
}

/* Random corruption of a good file never crashes the reader: it either
 * opens (and then every entry lies inside the file) or fails with a message. */
static void test_fuzz_bytes(void **state)
{
    (void)state;
    tu_mkmodel(tu_dir, "tiny", 3, 1, 0, IG_DTYPE_F32);
    char *path = tu_path(tu_dir, "model.safetensors");
    size_t len;
    unsigned char *good = tu_read(path, &len);
    size_t hlen = good[0] | (size_t)good[1] << 8 | (size_t)good[2] << 16;
    char *x = tu_path(tu_dir, "x.safetensors");
    uint64_t s = 99;
    for (int iter = 0; iter < 300; iter++) {
        unsigned char *buf = malloc(8 + hlen);
        memcpy(buf, good, 8 + hlen);
        for (int k = 0; k < 1 + iter % 4; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(s >> 33) % (8 + hlen);
            buf[at] = (unsigned char)(s >> 20);
        }
        /* header only: the data section is left out, as if truncated */
        tu_write(x, buf, 8 + hlen);
        free(buf);
        ig_safetensors_t *st = NULL;
        char err[512] = "";
        int rc = ig_safetensors_open(&st, x, err, sizeof(err));
        if (rc == 0) {
            for (size_t i = 0; i < ig_safetensors_count(st); i++) {
                const ig_safetensors_entry_t *e = ig_safetensors_at(st, i);
                assert_true(e->offset + e->nbytes <= ig_safetensors_file_size(st));
            }
            ig_safetensors_close(st);
        } else {
            assert_int_equal(rc, IG_EMODEL);
            assert_non_null(strstr(err, "x.safetensors: "));
        }
    }
    free(x);
    free(good);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip, tu_dir_setup, tu_dir_teardown),
        cmocka_unit_test_setup_teardown(test_writer_misuse, tu_dir_setup, tu_dir_teardown),
        cmocka_unit_test_setup_teardown(test_short_files, tu_dir_setup, tu_dir_teardown),
        cmocka_unit_test_setup_teardown(test_header_length, tu_dir_setup, tu_dir_teardown),
        cmocka_unit_test_setup_teardown(test_bad_json, tu_dir_setup, tu_dir_teardown),
        cmocka_unit_test_setup_teardown(test_bad_fields, tu_dir_setup, tu_dir_teardown),
        cmocka_unit_test_setup_teardown(test_offsets_that_lie, tu_dir_setup, tu_dir_teardown),
        cmocka_unit_test_setup_teardown(test_fuzz_bytes, tu_dir_setup, tu_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
