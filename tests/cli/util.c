/*
 * util.c - cli/util.c: human units and the JSON emitter (escaping), built
 * into this test from the source.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../cli/util.c"
#include "lib/cli.h"

/* PROMISE: CLI-3 */
static void test_units(void **state)
{
    (void)state;
    uint64_t v;
    assert_int_equal(cli_parse_size("4096", &v), 0);
    assert_true(v == 4096);
    assert_int_equal(cli_parse_size("4GiB", &v), 0);
    assert_true(v == 4ull << 30);
    assert_int_equal(cli_parse_size("4G", &v), 0);
    assert_true(v == 4ull << 30);
    assert_int_equal(cli_parse_size("2GB", &v), 0);
    assert_true(v == 2000000000ull);
    assert_int_equal(cli_parse_size("1.5MiB", &v), 0);
    assert_true(v == 1572864ull);
    assert_int_equal(cli_parse_size("64K", &v), 0);
    assert_true(v == 65536);
    assert_int_equal(cli_parse_size("10 MB", &v), 0);
    assert_true(v == 10000000ull);
    assert_int_equal(cli_parse_size("1TiB", &v), 0);
    assert_true(v == 1ull << 40);
    assert_int_equal(cli_parse_size("-1G", &v), -1);
    assert_int_equal(cli_parse_size("4XB", &v), -1);
    assert_int_equal(cli_parse_size("", &v), -1);
    assert_int_equal(cli_parse_size("GiB", &v), -1);
    assert_int_equal(cli_parse_size("99999999999EiB", &v), -1);
    assert_int_equal(cli_parse_size("1e30", &v), -1);

    char b[32];
    assert_string_equal(cli_fmt_size(b, sizeof b, 512), "512 B");
    assert_string_equal(cli_fmt_size(b, sizeof b, 4ull << 30), "4.00 GiB");
    assert_string_equal(cli_fmt_size(b, sizeof b, 1536), "1.50 KiB");
    assert_string_equal(cli_fmt_size(b, sizeof b, 200ull << 20), "200 MiB");
    assert_string_equal(cli_fmt_rate(b, sizeof b, 1.2e9), "1.20 GB/s");
    assert_string_equal(cli_fmt_rate(b, sizeof b, 850e6), "850 MB/s");
    assert_string_equal(cli_fmt_rate(b, sizeof b, 12.5e9), "12.5 GB/s");

    assert_int_equal(cli_parse_u64("0x10", 100, &v), 0);
    assert_true(v == 16);
    assert_int_equal(cli_parse_u64("101", 100, &v), -1);
    assert_int_equal(cli_parse_u64("-1", UINT64_MAX, &v), -1);
    assert_int_equal(cli_parse_u64("1x", 100, &v), -1);
}

static void test_json_emitter(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cli_json j;
    cli_json_init(&j, f);
    cli_json_obj_begin(&j);
    cli_json_key(&j, "s");
    cli_json_str(&j, "a\"b\\c\n\x01");
    cli_json_key(&j, "n");
    cli_json_u64(&j, UINT64_MAX);
    cli_json_key(&j, "arr");
    cli_json_arr_begin(&j);
    cli_json_hex(&j, 0xab, 8);
    cli_json_null(&j);
    cli_json_double(&j, 0.0 / 0.0);
    cli_json_obj_begin(&j);
    cli_json_obj_end(&j);
    cli_json_arr_end(&j);
    cli_json_key(&j, "t");
    cli_json_bool(&j, 1);
    cli_json_obj_end(&j);
    cli_json_finish(&j);
    fclose(f);
    assert_string_equal(buf, "{\"s\":\"a\\\"b\\\\c\\n\\u0001\",\"n\":18446744073709551615,"
                             "\"arr\":[\"0x000000ab\",null,null,{}],\"t\":true}\n");
    jval *v = jparse(buf);
    assert_non_null(v);
    assert_string_equal(jget(v, "s")->str, "a\"b\\c\n\x01");
    assert_int_equal(jget(v, "arr")->n, 4);
    jfree(v);
    free(buf);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_units),
        cmocka_unit_test(test_json_emitter),
    };
    return cmocka_run_group_tests_name("cli/util", tests, NULL, NULL);
}
