/*
 * hash.c - cli/cmd_hash.c: `kvx hash` against the spec's worked example,
 * decimal token ids with leading zeros, a NUL in the input refused, usage
 * errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../cli/util.c"
#include "lib/cli.h"

/* PROMISE: FORMAT-1 */
static void test_hash_spec_example(void **state)
{
    (void)state;
    /* spec/kv-block-hash-and-envelope.txt, worked example: B = 2,
     * tokens 1 2 3 4 5: two full blocks, the tail is not hashed. */
    cli_run r = CLI(NULL, "hash", "--block-tokens", "2", "1", "2", "3", "4", "5");
    EXPECT_RC(r, 0);
    assert_string_equal(r.out, "0xa91ab0c1027b9366\n0x03df829571605c60\n");
    assert_string_equal(r.err, "");
    cli_run_free(&r);

    /* Tokens from standard input, options after the short form. */
    r = CLI("1 2\n3\t4 5\n", "hash", "-b", "2");
    EXPECT_RC(r, 0);
    assert_string_equal(r.out, "0xa91ab0c1027b9366\n0x03df829571605c60\n");
    cli_run_free(&r);

    /* Fewer tokens than a block: no full block, nothing printed. */
    r = CLI(NULL, "hash", "-b", "16", "1", "2", "3");
    EXPECT_RC(r, 0);
    assert_string_equal(r.out, "");
    cli_run_free(&r);
}

/* Numbers are decimal or 0x hex, never octal: token ids with leading
 * zeros (zero-padded dumps) are the same ids, so "010" is ten and "08" is
 * eight, on the command line and on standard input. */
/* PROMISE: CLI-3 */
static void test_decimal_leading_zeros(void **state)
{
    (void)state;
    cli_run r = CLI(NULL, "hash", "--block-tokens", "02", "01", "02", "03", "04", "05");
    EXPECT_RC(r, 0);
    assert_string_equal(r.out, "0xa91ab0c1027b9366\n0x03df829571605c60\n"); /* the spec's */
    cli_run_free(&r);
    cli_run a = CLI(NULL, "hash", "-b", "2", "010", "08", "09", "0");
    cli_run b = CLI(NULL, "hash", "-b", "2", "10", "8", "9", "0");
    EXPECT_RC(a, 0);
    EXPECT_RC(b, 0);
    assert_string_equal(a.out, b.out);
    cli_run_free(&a);
    cli_run_free(&b);
    a = CLI("010 08\n09 0\n", "hash", "-b", "2");
    b = CLI("10 8 9 0", "hash", "-b", "2");
    EXPECT_RC(a, 0);
    EXPECT_RC(b, 0);
    assert_string_equal(a.out, b.out);
    cli_run_free(&a);
    cli_run_free(&b);
    uint64_t v;
    assert_int_equal(cli_parse_u64("010", 100, &v), 0);
    assert_true(v == 10);
    assert_int_equal(cli_parse_u64("0009", 100, &v), 0);
    assert_true(v == 9);
    assert_int_equal(cli_parse_u64("0X1f", 100, &v), 0);
    assert_true(v == 31);
    assert_int_equal(cli_parse_u64("0x", 100, &v), -1);
    assert_int_equal(cli_parse_u64("0x-1", 100, &v), -1);
    assert_int_equal(cli_parse_u64("\t5", 100, &v), -1);
}

/* Token text with a NUL byte in it (a binary file piped in by mistake)
 * is refused, not read up to the NUL: "1 2\\0 3 4" must not hash as "1 2". */
static void test_hash_nul_in_input(void **state)
{
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "printf '1 2\\0003 4' | '%s' hash -b 2 >/dev/null 2>&1", KVX_CLI);
    int st = system(cmd);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 2);
    snprintf(cmd, sizeof cmd, "printf '1 2 3 4' | '%s' hash -b 2 >/dev/null 2>&1", KVX_CLI);
    st = system(cmd);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* PROMISE: CLI-1 */
static void test_hash_usage_errors(void **state)
{
    (void)state;
    const char *const cases[][4] = {
        {"hash", "1", "2", NULL},                  /* --block-tokens missing */
        {"hash", "-b", "0", "1"},                  /* B = 0 */
        {"hash", "-b", "x", "1"},                  /* not a number */
        {"hash", "-b", "2", "-1"},                 /* negative token: an unknown option */
        {"hash", "-b", "2", "4294967296"},         /* token > u32 */
        {"hash", "--bogus", NULL, NULL},           /* unknown option */
        {"hash", "-b", NULL, NULL},                /* missing value */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_run r = cli_runv("", cases[i]);
        EXPECT_RC(r, 2);
        assert_string_equal(r.out, "");
        assert_non_null(strstr(r.err, "kvx hash: "));
        assert_non_null(strstr(r.err, "--help")); /* says what to do */
        cli_run_free(&r);
    }
    cli_run r = CLI("1 two 3", "hash", "-b", "1");
    EXPECT_RC(r, 2);
    assert_non_null(strstr(r.err, "two"));
    cli_run_free(&r);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash_spec_example),
        cmocka_unit_test(test_decimal_leading_zeros),
        cmocka_unit_test(test_hash_nul_in_input),
        cmocka_unit_test(test_hash_usage_errors),
    };
    return cmocka_run_group_tests_name("cli/hash", tests, NULL, NULL);
}
