/*
 * main.c - cli/main.c, the `kvx` command framework driven as a user
 * drives it (the built binary, KVX_CLI): help and version, every
 * subcommand's help, usage errors (exit 2), option values named as given,
 * --tier-ttl digits, and docs/kvx.md generated from the help text.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../cli/util.c"
#include "lib/cli.h"

/* PROMISE: CLI-1 */
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

/* PROMISE: CLI-1 */
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

/* PROMISE: CLI-1 */
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
/* PROMISE: CLI-3 */
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
/* PROMISE: CLI-3 */
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

/* docs/kvx.md is generated from the help text: it must be up to date. */
/* PROMISE: CLI-2 */
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

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_main_help_and_version),
        cmocka_unit_test(test_every_subcommand_has_help),
        cmocka_unit_test(test_main_usage_errors),
        cmocka_unit_test(test_option_value_messages),
        cmocka_unit_test(test_tier_ttl_digits_only),
        cmocka_unit_test(test_docs_match_help),
    };
    return cmocka_run_group_tests_name("cli/main", tests, NULL, NULL);
}
