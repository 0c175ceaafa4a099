/*
 * test_cli.c - the `kvx` command driven as a user drives it: the built
 * binary (KVX_CLI) is run with arguments; exit codes (0 ok, 1 failure or
 * bad data, 2 usage), stdout, stderr and parsed --json output are checked.
 * This file covers the command framework, `kvx hash` (against the spec's
 * worked example) and the unit helpers (human units, JSON escaping); the
 * shard, store, warmup and demo commands are in tests/test_cli_*.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "lib/cli.h"

/* The helpers themselves are unit-tested by including them. */
#include "../cli/util.c"

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

static void test_main_help_and_version(void **state)
{
    (void)state;
    cli_run r = CLI(NULL, "--help");
    EXPECT_RC(r, 0);
    /* Every subcommand is listed with a one-line summary. */
    const char *subs[] = {"hash", "inspect", "verify", "convert", "store", "warmup", "demo"};
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        char line[64];
        snprintf(line, sizeof line, "\n  %s ", subs[i]);
        assert_non_null(strstr(r.out, line));
    }
    cli_run_free(&r);

    r = CLI(NULL, "--version");
    EXPECT_RC(r, 0);
    char want[64];
    snprintf(want, sizeof want, "kvx %s\n", KVX_VERSION_STRING);
    assert_string_equal(r.out, want);
    cli_run_free(&r);

    r = CLI(NULL, "-V");
    EXPECT_RC(r, 0);
    assert_string_equal(r.out, want);
    cli_run_free(&r);
}

static void test_every_subcommand_has_help(void **state)
{
    (void)state;
    const char *subs[][2] = {
        {"hash", NULL},       {"inspect", NULL},   {"verify", NULL},    {"convert", NULL},
        {"store", NULL},      {"store", "create"}, {"store", "put"},    {"store", "get"},
        {"store", "prefix"},  {"store", "stat"},   {"store", "verify"}, {"store", "reindex"},
        {"store", "gc"},      {"warmup", NULL},    {"demo", NULL},
    };
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        cli_run r = subs[i][1] ? CLI(NULL, subs[i][0], subs[i][1], "--help")
                               : CLI(NULL, subs[i][0], "--help");
        EXPECT_RC(r, 0);
        char want[64];
        snprintf(want, sizeof want, "Usage: kvx %s%s%s", subs[i][0], subs[i][1] ? " " : "",
                 subs[i][1] ? subs[i][1] : "");
        if (strncmp(r.out, want, strlen(want)) != 0) fprintf(stderr, "%s\n", r.out);
        assert_memory_equal(r.out, want, strlen(want));
        cli_run_free(&r);
        /* -h is the same text. */
        r = subs[i][1] ? CLI(NULL, subs[i][0], subs[i][1], "-h") : CLI(NULL, subs[i][0], "-h");
        EXPECT_RC(r, 0);
        assert_memory_equal(r.out, want, strlen(want));
        cli_run_free(&r);
    }
}

static void test_main_usage_errors(void **state)
{
    (void)state;
    cli_run r = CLI(NULL, "frobnicate");
    EXPECT_RC(r, 2);
    assert_non_null(strstr(r.err, "unknown command 'frobnicate'"));
    assert_non_null(strstr(r.err, "kvx --help"));
    cli_run_free(&r);

    r = cli_runv(NULL, (const char *const[]){NULL});
    EXPECT_RC(r, 2);
    assert_non_null(strstr(r.err, "Usage: kvx"));
    cli_run_free(&r);

    r = CLI(NULL, "--frob");
    EXPECT_RC(r, 2);
    cli_run_free(&r);
}

/* --tier-ttl takes digits and a unit only: strtoull took leading blanks
 * and a sign (" -1ms" was 2^64 - 1 ms) and any value up to 2^64 - 1 ms;
 * above 2^62 ms is its own message. Both name the option. */
static void test_tier_ttl_digits_only(void **state)
{
    (void)state;
    uint64_t v;
    assert_int_equal(cli_parse_duration_ms("90s", &v), 0);
    assert_true(v == 90000);
    assert_int_equal(cli_parse_duration_ms("3600", &v), 0);
    assert_true(v == 3600000);
    assert_int_equal(cli_parse_duration_ms("250ms", &v), 0);
    assert_true(v == 250);
    assert_int_equal(cli_parse_duration_ms("4611686018427387904ms", &v), 0); /* 2^62 */
    assert_true(v == 1ull << 62);
    const char *bad[] = {" -1ms", "-1ms", "+5s", " 5s", "\t5", "5 s", "", "s", "5x", "0x10"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(cli_parse_duration_ms(bad[i], &v), -1);
    const char *big[] = {"4611686018427387905ms", "18446744073709551615ms", "99999999999999999999",
                         "53375995584d", "9223372036854775807ms"};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
        assert_int_equal(cli_parse_duration_ms(big[i], &v), -2);

    /* On the command line: usage errors naming --tier-ttl, before any
     * store is touched. */
    const char *vals[] = {" -1ms", "18446744073709551615ms"};
    const char *words[] = {"digits and a unit", "longer than"};
    for (size_t i = 0; i < 2; i++) {
        cli_run r = CLI(NULL, "store", "create", "/nonexistent/kvx-ttl", "-L", "1", "-H", "1", "-D", "8",
                        "-B", "4", "-q", "fp16", "--tier", "redis://127.0.0.1:1", "--tier-ttl", vals[i]);
        EXPECT_RC(r, 2);
        assert_non_null(strstr(r.err, "--tier-ttl"));
        assert_non_null(strstr(r.err, words[i]));
        cli_run_free(&r);
        r = CLI(NULL, "store", "tier", "/nonexistent/kvx-ttl", "set", "redis://127.0.0.1:1", "--tier-ttl",
                vals[i]);
        EXPECT_RC(r, 2);
        assert_non_null(strstr(r.err, "--tier-ttl"));
        assert_non_null(strstr(r.err, words[i]));
        cli_run_free(&r);
    }
}

/* A value given to an option that takes none names the option as given
 * (glibc's optopt made "--json=1" an unknown '-j'); an abbreviation of
 * several options says it is ambiguous and names them. */
static void test_option_value_messages(void **state)
{
    (void)state;
    cli_run r = CLI(NULL, "store", "stat", "--json=1", "/nonexistent");
    EXPECT_RC(r, 2);
    assert_non_null(strstr(r.err, "'--json' takes no value"));
    assert_null(strstr(r.err, "'-j'"));
    cli_run_free(&r);
    r = CLI(NULL, "inspect", "--js=yes", "/nonexistent");
    EXPECT_RC(r, 2);
    assert_non_null(strstr(r.err, "'--json' takes no value"));
    cli_run_free(&r);
    r = CLI(NULL, "demo", "--t", "x");
    EXPECT_RC(r, 2);
    assert_non_null(strstr(r.err, "'--t' is ambiguous"));
    assert_non_null(strstr(r.err, "--trace"));
    assert_non_null(strstr(r.err, "--turns"));
    cli_run_free(&r);
    r = CLI(NULL, "hash", "--bogus=1");
    EXPECT_RC(r, 2);
    assert_non_null(strstr(r.err, "unknown option '--bogus'"));
    cli_run_free(&r);
    r = CLI(NULL, "hash", "-b", "2", "-q", "1");
    EXPECT_RC(r, 2);
    assert_non_null(strstr(r.err, "unknown option '-q'"));
    cli_run_free(&r);
    r = CLI(NULL, "hash", "--block-tokens");
    EXPECT_RC(r, 2);
    assert_non_null(strstr(r.err, "'--block-tokens' needs a value"));
    cli_run_free(&r);
}

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

/* docs/kvx.md is generated from the help text: it must be up to date. */
static void test_docs_match_help(void **state)
{
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "sh '%s/scripts/gen-cli-doc.sh' '%s' -", KVX_SOURCE_DIR, KVX_CLI);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 20, len = 0, r;
    char *gen = malloc(cap);
    while ((r = fread(gen + len, 1, cap - len - 1, p)) > 0) len += r;
    gen[len] = '\0';
    assert_int_equal(pclose(p), 0);
    snprintf(cmd, sizeof cmd, "%s/docs/kvx.md", KVX_SOURCE_DIR);
    FILE *f = fopen(cmd, "r");
    assert_non_null(f);
    char *doc = malloc(cap);
    size_t dl = fread(doc, 1, cap - 1, f);
    doc[dl] = '\0';
    fclose(f);
    if (strcmp(gen, doc) != 0)
        fprintf(stderr, "docs/kvx.md is out of date: run scripts/gen-cli-doc.sh BUILD/kvx\n");
    assert_string_equal(gen, doc);
    /* Every subcommand has its section. */
    assert_non_null(strstr(doc, "## kvx store prefix"));
    assert_non_null(strstr(doc, "## kvx demo"));
    free(gen);
    free(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash_spec_example),
        cmocka_unit_test(test_decimal_leading_zeros),
        cmocka_unit_test(test_hash_nul_in_input),
        cmocka_unit_test(test_hash_usage_errors),
        cmocka_unit_test(test_main_help_and_version),
        cmocka_unit_test(test_every_subcommand_has_help),
        cmocka_unit_test(test_main_usage_errors),
        cmocka_unit_test(test_units),
        cmocka_unit_test(test_tier_ttl_digits_only),
        cmocka_unit_test(test_option_value_messages),
        cmocka_unit_test(test_json_emitter),
        cmocka_unit_test(test_docs_match_help),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
