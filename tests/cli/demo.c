/*
 * demo.c - cli/cmd_demo.c and cmd_warmup.c: `kvx warmup` of shard files
 * and of a store directory (--json: bytes equal the pages written, a
 * damaged page counted and named, exit 1), the progress bar only on a
 * terminal; `kvx demo`'s built-in workload, a second run on the same
 * --dir, a tiny Mooncake-format trace, and its errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <poll.h>
#include <pty.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvx.h"
#include "lib/cli.h"

static char tmpdir[256];

static const kvx_geometry G = {2, 2, 16, 8, KVX_QUANT_FP16, 0};

#define NE 5

static void path_in(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", tmpdir, name);
}

/* NE full blocks in one shard; returns the total page bytes. */
static uint64_t write_shard(const char *path)
{
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = G;
    o.shard_id = 1;
    o.max_entries = NE;
    o.flags = KVX_FLAG_HASHES;
    kvx_shard_writer *w = NULL;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    uint64_t pb = kvx_page_bytes(&G, G.block_tokens), total = 0;
    uint8_t *page = malloc(pb);
    for (uint32_t i = 0; i < NE; i++) {
        for (uint64_t k = 0; k < pb; k++) page[k] = (uint8_t)(k * 13 + i);
        kvx_entry_in e = {0};
        e.radix_block = (uint16_t)i;
        e.token_count = G.block_tokens;
        e.page = page;
        e.hash = 0x1000 + i;
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
        total += pb;
    }
    free(page);
    assert_int_equal(kvx_shard_writer_seal(w), 0);
    return total;
}

static double num(jval *o, const char *k)
{
    jval *v = jget(o, k);
    if (!v || v->t != JNUM) fprintf(stderr, "key %s missing or not a number\n", k);
    assert_non_null(v);
    assert_int_equal(v->t, JNUM);
    return v->num;
}

/* A run with a GPU sink: 1 when it ran (exit 0); without a GPU, 0 once the
 * refusal is checked: exit 1, "GPU" named on stderr, nothing on stdout. */
static int ran_on_gpu(const cli_run *r)
{
    if (r->rc == 0) return 1;
    EXPECT_RC(*r, 1);
    assert_non_null(strstr(r->err, "GPU"));
    assert_string_equal(r->out, "");
    return 0;
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvx-test-cli-demo-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    rm_rf(tmpdir);
    return 0;
}

static void test_warmup_files(void **state)
{
    (void)state;
    char a[512], b[512];
    path_in(a, sizeof a, "w1.kvx");
    path_in(b, sizeof b, "w2.kvx");
    uint64_t bytes = write_shard(a) + write_shard(b);

    cli_run r = CLI(NULL, "warmup", "--json", a, b);
    jval *v = run_json(&r, 0);
    assert_true(num(v, "bytes") == (double)bytes);
    assert_int_equal((int)num(v, "pages"), 2 * NE);
    assert_int_equal((int)num(v, "crc_failures"), 0);
    assert_true(num(v, "seconds") >= 0);
    assert_true(num(v, "gbps") >= 0);
    jval *io = jget(v, "io");
    assert_non_null(io);
    assert_true(!strcmp(io->str, "uring") || !strcmp(io->str, "pread"));
    assert_string_equal(r.err, ""); /* no progress bar off a terminal */
    jfree(v);
    cli_run_free(&r);

    r = CLI(NULL, "warmup", "--json", "--io", "pread", "--no-verify", a);
    v = run_json(&r, 0);
    assert_string_equal(jget(v, "io")->str, "pread");
    assert_int_equal((int)num(v, "pages"), NE);
    jfree(v);
    cli_run_free(&r);

    /* Human report. */
    r = CLI(NULL, "warmup", a);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "warmed up 5 page(s)"));
    assert_non_null(strstr(r.out, "B/s"));
    cli_run_free(&r);
}

static void test_warmup_damage_and_errors(void **state)
{
    (void)state;
    char a[512];
    path_in(a, sizeof a, "dmg.kvx");
    write_shard(a);
    flip_bits(a, page_offset(a, 2) + 9, 0x80);

    cli_run r = CLI(NULL, "warmup", "--json", a);
    jval *v = run_json(&r, 1);
    assert_int_equal((int)num(v, "crc_failures"), 1);
    assert_int_equal((int)num(v, "pages"), NE - 1);
    assert_non_null(strstr(r.err, "dmg.kvx: entry 2"));
    jfree(v);
    cli_run_free(&r);

    r = CLI(NULL, "warmup", "/nonexistent/x.kvx");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "kvx warmup: "));
    cli_run_free(&r);

    const char *const usage[][5] = {
        {"warmup", NULL},
        {"warmup", "--sink", "disk", a, NULL},
        {"warmup", "--io", "aio", a, NULL},
        {"warmup", "--bogus", a, NULL},
    };
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        r = cli_runv(NULL, usage[i]);
        EXPECT_RC(r, 2);
        cli_run_free(&r);
    }

    /* The GPU sink: works with a GPU, else a clear error and exit 1. */
    char good[512];
    path_in(good, sizeof good, "gpu.kvx");
    write_shard(good);
    r = CLI(NULL, "warmup", "--json", "--sink", "gpu", good);
    if (ran_on_gpu(&r)) {
        v = run_json(&r, 0);
        assert_int_equal((int)num(v, "pages"), NE);
        jfree(v);
    }
    cli_run_free(&r);
}

/* Runs kvx with stderr on a pseudo-terminal; returns what it drew there. */
static char *run_on_tty(const char *const *args, int *rc)
{
    int master, slave;
    assert_int_equal(openpty(&master, &slave, NULL, NULL, NULL), 0);
    const char *argv[16] = {KVX_CLI};
    int n = 1;
    for (; *args; args++) argv[n++] = *args;
    argv[n] = NULL;
    int devnull = open("/dev/null", O_WRONLY);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(devnull, 1);
        dup2(slave, 2);
        close(master);
        execv(KVX_CLI, (char *const *)argv);
        _exit(127);
    }
    close(slave);
    close(devnull);
    size_t cap = 1 << 16, len = 0;
    char *buf = calloc(1, cap);
    for (;;) {
        struct pollfd p = {master, POLLIN, 0};
        if (poll(&p, 1, 20000) <= 0) break;
        ssize_t k = read(master, buf + len, cap - len - 1);
        if (k <= 0) break; /* EIO once the child closed the terminal */
        len += (size_t)k;
    }
    int st;
    waitpid(pid, &st, 0);
    *rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    close(master);
    return buf;
}

/* PROMISE: CLI-6 */
static void test_progress_only_on_a_terminal(void **state)
{
    (void)state;
    char a[512];
    path_in(a, sizeof a, "tty.kvx");
    write_shard(a);
    int rc;
    char *drawn = run_on_tty((const char *const[]){"warmup", a, NULL}, &rc);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(drawn, "warmup"));
    assert_non_null(strstr(drawn, "100%"));
    assert_non_null(strchr(drawn, '\r'));
    free(drawn);
    /* --json: never a bar, even on a terminal. */
    drawn = run_on_tty((const char *const[]){"warmup", "--json", a, NULL}, &rc);
    assert_int_equal(rc, 0);
    assert_string_equal(drawn, "");
    free(drawn);
}

static void check_demo_invariants(jval *v)
{
    const char *keys[] = {"blocks_written", "bytes_written", "restart_prefix_hit_ratio",
                          "blocks_served", "warmup_gbps"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) num(v, keys[i]);
    double full = num(v, "restart_full_blocks"), served = num(v, "blocks_served");
    assert_true(full > 0);
    assert_true(served + num(v, "blocks_recomputed") == full);
    double ratio = num(v, "restart_prefix_hit_ratio");
    assert_true(ratio > served / full - 1e-5 && ratio < served / full + 1e-5);
    assert_true(num(v, "bytes_written") == num(v, "blocks_written") * num(v, "page_bytes"));
    assert_int_equal((int)num(v, "page_mismatches"), 0);
    assert_int_equal((int)num(v, "warmup_page_mismatches"), 0);
    assert_int_equal((int)num(v, "warmup_crc_failures"), 0);
    /* The warmup delivered every block of the store, each checked. */
    assert_true(num(v, "warmup_pages") == num(v, "store_blocks"));
    assert_true(num(v, "warmup_pages_verified") == num(v, "store_blocks"));
    assert_true(num(v, "warmup_gbps") > 0);
    assert_int_equal(jget(v, "ok")->t, JBOOL);
    assert_true(jget(v, "ok")->b);
}

static void test_demo_builtin(void **state)
{
    (void)state;
    /* Default: a temporary store, removed afterwards. */
    cli_run r = CLI(NULL, "demo", "--json", "--conversations", "6", "--turns", "4");
    jval *v = run_json(&r, 0);
    check_demo_invariants(v);
    assert_true(num(v, "blocks_written") > 0);
    assert_true(num(v, "blocks_served") > 0);
    assert_false(jget(v, "store_kept")->b);
    assert_false(file_exists(jget(v, "dir")->str));
    assert_string_equal(r.err, "");
    jfree(v);
    cli_run_free(&r);

    /* --dir: kept, and a second run reuses it: nothing new to write,
     * every block after the restart served. */
    char dir[512];
    path_in(dir, sizeof dir, "demo-store");
    r = CLI(NULL, "demo", "--json", "--dir", dir, "--conversations", "6", "--turns", "4");
    v = run_json(&r, 0);
    check_demo_invariants(v);
    double written = num(v, "blocks_written");
    assert_false(jget(v, "reused_store")->b);
    jfree(v);
    cli_run_free(&r);
    /* Another command agrees on what the store holds. */
    r = CLI(NULL, "store", "stat", "--json", dir);
    v = run_json(&r, 0);
    assert_true(num(v, "blocks") == written);
    jfree(v);
    cli_run_free(&r);

    r = CLI(NULL, "demo", "--json", "--dir", dir, "--conversations", "6", "--turns", "4");
    v = run_json(&r, 0);
    check_demo_invariants(v);
    assert_true(jget(v, "reused_store")->b);
    assert_int_equal((int)num(v, "blocks_written"), 0);
    assert_true(num(v, "restart_prefix_hit_ratio") == 1.0);
    jfree(v);
    cli_run_free(&r);

    r = CLI(NULL, "store", "verify", dir);
    EXPECT_RC(r, 0);
    cli_run_free(&r);

    /* Human report. */
    r = CLI(NULL, "demo", "--conversations", "3", "--turns", "2");
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "prefix hit ratio"));
    assert_non_null(strstr(r.out, "served from the store"));
    assert_non_null(strstr(r.out, "B/s"));
    cli_run_free(&r);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_demo_trace(void **state)
{
    (void)state;
    char tr[512];
    path_in(tr, sizeof tr, "trace.jsonl");
    /* Requests 1-2 come before the restart, 3-4 after. Request 3 shares
     * ids 1, 2, 3 with request 1 (three blocks served) and adds id 5;
     * request 4 shares nothing. Request 2's last block (id 4) is partial:
     * not stored. Blocks written: 3 (ids 1-3) + 1 (id 5) + 1 (id 9). */
    write_text(tr, "{\"timestamp\": 0, \"input_length\": 1536, \"output_length\": 5, \"hash_ids\": [1, 2, 3]}\n"
                   "{\"timestamp\": 1, \"input_length\": 1300, \"output_length\": 5, \"hash_ids\": [1, 2, 4]}\n"
                   "{\"timestamp\": 2, \"input_length\": 2048, \"output_length\": 5, \"hash_ids\": [1, 2, 3, 5]}\n"
                   "{\"timestamp\": 3, \"input_length\": 512, \"output_length\": 5, \"hash_ids\": [9]}\n");
    cli_run r = CLI(NULL, "demo", "--json", "--trace", tr, "--requests", "0");
    jval *v = run_json(&r, 0);
    check_demo_invariants(v);
    assert_string_equal(jget(v, "workload")->str, "trace");
    assert_int_equal((int)num(v, "block_tokens"), 512);
    /* Request 2: ids 1, 2 served, id 4's block is partial (1300 tokens). */
    assert_int_equal((int)num(v, "blocks_served_before_restart"), 2);
    assert_int_equal((int)num(v, "blocks_written"), 5);
    assert_int_equal((int)num(v, "restart_full_blocks"), 5);
    assert_int_equal((int)num(v, "blocks_served"), 3);
    jfree(v);
    cli_run_free(&r);

    /* A line that is not a trace line: exit 1, the line named. */
    write_text(tr, "{\"timestamp\": 0, \"input_length\": 512, \"hash_ids\": [1]}\nnot json\n");
    r = CLI(NULL, "demo", "--json", "--trace", tr);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "trace.jsonl:2"));
    cli_run_free(&r);
    /* JSON, not text: a hash id that is not a non-negative integer is
     * refused by line; any JSON whitespace is taken. */
    write_text(tr, "{\"input_length\": 512, \"hash_ids\": [1]}\n{\"input_length\": 512, \"hash_ids\": [-1]}\n");
    r = CLI(NULL, "demo", "--trace", tr);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "trace.jsonl:2"));
    assert_non_null(strstr(r.err, "\"hash_ids\" entry"));
    cli_run_free(&r);
    write_text(tr, "\t{ \"input_length\" :\t512 ,\"hash_ids\":[ 7 ]}\r\n \n{\"input_length\":512,\"hash_ids\":[7]}");
    r = CLI(NULL, "demo", "--json", "--trace", tr, "--requests", "0");
    v = run_json(&r, 0);
    assert_int_equal((int)num(v, "blocks_written"), 1);
    assert_int_equal((int)num(v, "blocks_served"), 1);
    jfree(v);
    cli_run_free(&r);
    r = CLI(NULL, "demo", "--trace", "/nonexistent/trace.jsonl");
    EXPECT_RC(r, 1);
    cli_run_free(&r);
}

static void test_demo_errors(void **state)
{
    (void)state;
    /* A --dir holding a store of another geometry is refused, untouched. */
    char dir[512];
    path_in(dir, sizeof dir, "other-store");
    cli_run r = CLI(NULL, "store", "create", dir, "-L", "1", "-H", "1", "-D", "4", "-B", "4",
                    "--quant", "e4m3");
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    r = CLI(NULL, "demo", "--dir", dir, "--conversations", "2", "--turns", "2");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "hint:"));
    cli_run_free(&r);
    r = CLI(NULL, "store", "stat", "--json", dir);
    jval *v = run_json(&r, 0);
    assert_int_equal((int)num(v, "blocks"), 0);
    jfree(v);
    cli_run_free(&r);

    /* --gpu: runs with a GPU; without one, says so at once. */
    r = CLI(NULL, "demo", "--json", "--gpu", "--conversations", "2", "--turns", "2");
    if (ran_on_gpu(&r)) {
        v = run_json(&r, 0);
        check_demo_invariants(v);
        assert_string_equal(jget(v, "warmup_sink")->str, "gpu");
        jfree(v);
    }
    cli_run_free(&r);

    const char *const usage[][4] = {
        {"demo", "--turns", "1", NULL},
        {"demo", "--conversations", "0", NULL},
        {"demo", "extra", NULL, NULL},
        {"demo", "--dir", NULL, NULL},
    };
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        r = cli_runv(NULL, usage[i]);
        EXPECT_RC(r, 2);
        cli_run_free(&r);
    }
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warmup_files),
        cmocka_unit_test(test_warmup_damage_and_errors),
        cmocka_unit_test(test_progress_only_on_a_terminal),
        cmocka_unit_test(test_demo_builtin),
        cmocka_unit_test(test_demo_trace),
        cmocka_unit_test(test_demo_errors),
    };
    return cmocka_run_group_tests_name("cli/demo", tests, setup, teardown);
}
