/*
 * tests/cli/reindex.c - `kvx store reindex` repairs a store whose index/ is
 * missing, empty, cut short or damaged in any way, never opening the old
 * index (cli/cmd_store.c: run_reindex -> kvx_store_reindex_dir), and no
 * failure of it tells the user to run the command that just failed.
 *
 * Before: reindex opened the store as a writer first, so a data.mdb cut
 * short or with a damaged meta page failed with "run 'kvx store reindex
 * DIR'" and a hint saying the same; a file, FIFO or symlink where index/
 * belongs failed with KVX_EPATH.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "lib/cli.h"
#include "lib/store.h"

#define NSEQ 4
#define NB 3

/* A store at dir (made anew) with NSEQ flushed sequences of NB blocks. */
static void filled_store(const char *dir)
{
    su_rm_rf(dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 16ull << 20});
    for (uint64_t q = 0; q < NSEQ; q++) {
        assert_int_equal(su_put_seq(s, q, NB), 0);
        assert_int_equal(kvx_store_flush(s), 0);
    }
    kvx_store_close(s);
}

static size_t served_all(const char *dir)
{
    kvx_store *s;
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    size_t n = 0;
    for (uint64_t q = 0; q < NSEQ; q++) n += su_served_prefix(s, q, NB);
    kvx_store_close(s);
    return n;
}

static void run_shell(const char *fmt, const char *dir)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, fmt, dir, dir, dir);
    assert_int_equal(system(cmd), 0);
}

/* Every way index/ can be lost or damaged: reindex exits 0, says so, and
 * every acknowledged block is served again. */
/* PROMISE: RECOVER-19 */
static void test_reindex_repairs_any_index_damage(void **state)
{
    (void)state;
    static const char *const damage[] = {
        "truncate -s 8192 %s/index/data.mdb",                         /* cut short */
        ": > %s/index/data.mdb",                                      /* empty */
        "rm %s/index/data.mdb",                                       /* data file gone */
        "rm -r %s/index",                                             /* index/ gone */
        "dd if=/dev/urandom of=%s/index/data.mdb bs=64 count=1 conv=notrunc status=none", /* meta 0 */
        "dd if=/dev/urandom of=%s/index/data.mdb bs=4096 count=8 seek=0 conv=notrunc status=none",
        "printf 'x' >> %s/index/data.mdb",                            /* one byte appended */
        "rm -r %s/index && : > %s/index",                             /* a file where it belongs */
        "rm -r %s/index && mkfifo %s/index",                          /* a FIFO */
        "rm -r %s/index && ln -s /nonexistent %s/index",              /* a dangling symlink */
        "ln -sf /etc/passwd %s/index/data.mdb",                       /* data.mdb a symlink */
        "mkdir %s/.index.aside && : > %s/.index.aside/not-ours",      /* a stuck .index.aside */
    };
    char dir[300];
    snprintf(dir, sizeof dir, "%s/reindex", su_root);
    for (size_t i = 0; i < sizeof damage / sizeof damage[0]; i++) {
        filled_store(dir);
        run_shell(damage[i], dir);
        cli_run r = CLI(NULL, "store", "reindex", dir);
        if (r.rc != 0) fprintf(stderr, "damage: %s\n", damage[i]);
        EXPECT_RC(r, 0);
        assert_non_null(strstr(r.out, "reindexed "));
        assert_non_null(strstr(r.out, ": 12 block(s) in"));
        assert_null(strstr(r.err, "kvx store reindex "));
        cli_run_free(&r);
        assert_int_equal(served_all(dir), NSEQ * NB);
        /* the symlinked data.mdb's target is untouched */
        struct stat st;
        assert_int_equal(stat("/etc/passwd", &st), 0);
        assert_true(st.st_size > 0);
    }
    su_rm_rf(dir);
}

/* A reindex that fails says why, and never tells the user to run a
 * reindex; the old index is put back as it was. */
/* PROMISE: RECOVER-19 */
static void test_reindex_failure_does_not_point_at_itself(void **state)
{
    (void)state;
    char dir[300], p[400];
    snprintf(dir, sizeof dir, "%s/reindex-fail", su_root);
    filled_store(dir);
    snprintf(p, sizeof p, "%s/shards", dir);
    run_shell("mv %s/shards %s/shards.real && ln -s shards.real %s/shards", dir);
    cli_run r = CLI(NULL, "store", "reindex", dir);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "shards"));
    assert_null(strstr(r.err, "reindex '"));
    assert_null(strstr(r.err, "kvx store reindex "));
    cli_run_free(&r);
    run_shell("rm %s/shards && mv %s/shards.real %s/shards", dir);
    assert_int_equal(served_all(dir), NSEQ * NB); /* nothing lost, index put back */

    /* another writer holds it: --no-wait fails at once, naming the holder */
    kvx_store *w;
    assert_int_equal(kvx_store_open(&w, dir, NULL, 0), 0);
    r = CLI(NULL, "store", "reindex", "--no-wait", dir);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "another writer (--no-wait)"));
    cli_run_free(&r);
    kvx_store_close(w);
    su_rm_rf(dir);
}

/* On a read-only mount reindex fails at once, naming the read-only file
 * system, changes nothing, and does not point at itself. Needs root to
 * mount a tmpfs (skipped otherwise). */
/* PROMISE: RECOVER-19 */
static void test_reindex_on_read_only_mount(void **state)
{
    (void)state;
    char mnt[300], dir[400], cmd[1200];
    snprintf(mnt, sizeof mnt, "%s/ro", su_root);
    snprintf(dir, sizeof dir, "%s/s", mnt);
    assert_int_equal(mkdir(mnt, 0700), 0);
    snprintf(cmd, sizeof cmd, "mount -t tmpfs -o size=16m tmpfs '%s' 2>/dev/null", mnt);
    if (system(cmd) != 0) {
        rmdir(mnt);
        skip(); /* not root, or no mount here */
    }
    filled_store(dir);
    run_shell("truncate -s 8192 %s/index/data.mdb", dir);
    snprintf(cmd, sizeof cmd, "mount -o remount,ro '%s'", mnt);
    assert_int_equal(system(cmd), 0);
    cli_run r = CLI(NULL, "store", "reindex", "--no-wait", dir);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "EROFS"));
    assert_null(strstr(r.err, "kvx store reindex "));
    cli_run_free(&r);
    struct stat st;
    snprintf(cmd, sizeof cmd, "%s/index/data.mdb", dir);
    assert_int_equal(stat(cmd, &st), 0);
    assert_int_equal(st.st_size, 8192); /* nothing changed */
    snprintf(cmd, sizeof cmd, "umount '%s'", mnt);
    assert_int_equal(system(cmd), 0);
    rmdir(mnt);
}

/* Flips one byte of the first shard file's tables (its meta CRC then
 * fails): a shard reindex must set aside. Returns its name in name. */
static void damage_first_shard(const char *dir, char name[64])
{
    char names[16][64], p[700];
    assert_true(su_list_names(dir, "shards", names, 16) >= 2);
    memcpy(name, names[0], 64);
    snprintf(p, sizeof p, "%s/shards/%s", dir, name);
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0x41, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, 0x41, SEEK_SET), 0);
    fputc(c ^ 0x5a, f);
    assert_int_equal(fclose(f), 0);
}

/* `kvx store reindex --dry-run` prints the plan (human and --json) and
 * changes nothing: on a read-only mount, and while a writer holds the
 * store; the reindex then does what it said, exits 1 because it set a
 * shard aside and says so on its result line. Before, reindex moved the
 * damaged shard to quarantine/ and said only "N blocks", exit 0. */
/* PROMISE: RECOVER-36, RECOVER-37 */
static void test_reindex_dry_run_then_reindex(void **state)
{
    (void)state;
    char mnt[300], dir[400], cmd[1200], name[64];
    snprintf(mnt, sizeof mnt, "%s/dry", su_root);
    snprintf(dir, sizeof dir, "%s/s", mnt);
    assert_int_equal(mkdir(mnt, 0700), 0);
    snprintf(cmd, sizeof cmd, "mount -t tmpfs -o size=16m tmpfs '%s' 2>/dev/null", mnt);
    int mounted = system(cmd) == 0;
    filled_store(dir);
    damage_first_shard(dir, name);
    run_shell(": > %s/shards/notes.txt", dir);
    if (mounted) {
        snprintf(cmd, sizeof cmd, "mount -o remount,ro '%s'", mnt);
        assert_int_equal(system(cmd), 0);
    }
    cli_run r = CLI(NULL, "store", "reindex", "--dry-run", dir);
    EXPECT_RC(r, 0);
    char want[200];
    snprintf(want, sizeof want, "quarantine shards/%s", name);
    assert_non_null(strstr(r.out, want));
    assert_non_null(strstr(r.out, "leave      shards/notes.txt"));
    assert_non_null(strstr(r.out, "would keep"));
    assert_non_null(strstr(r.out, "quarantine 1,"));
    cli_run_free(&r);
    r = CLI(NULL, "store", "reindex", "--dry-run", "--json", dir);
    jval *j = run_json(&r, 0);
    jval *sum = jget(j, "summary");
    assert_non_null(sum);
    assert_int_equal((int)jget(sum, "quarantined")->num, 1);
    assert_int_equal((int)jget(sum, "left_alone")->num, 1);
    assert_true(jget(j, "steps")->n >= 3);
    jfree(j);
    cli_run_free(&r);
    if (mounted) {
        snprintf(cmd, sizeof cmd, "mount -o remount,rw '%s'", mnt);
        assert_int_equal(system(cmd), 0);
    }
    /* nothing moved by the plan */
    snprintf(cmd, sizeof cmd, "%s/shards/%s", dir, name);
    struct stat st;
    assert_int_equal(stat(cmd, &st), 0);
    /* while a writer holds the store */
    kvx_store *w = su_reopen(dir, KVX_STORE_NOWAIT);
    r = CLI(NULL, "store", "reindex", "--dry-run", dir);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, want));
    cli_run_free(&r);
    kvx_store_close(w);
    /* the reindex does what the plan said, and says so */
    r = CLI(NULL, "store", "reindex", dir);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.out, "1 shard file(s) set aside in quarantine/"));
    assert_non_null(strstr(r.err, "quarantine/"));
    cli_run_free(&r);
    snprintf(cmd, sizeof cmd, "%s/quarantine/%s", dir, name);
    assert_int_equal(stat(cmd, &st), 0);
    r = CLI(NULL, "store", "reindex", dir); /* nothing left to set aside */
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    if (mounted) {
        snprintf(cmd, sizeof cmd, "umount '%s'", mnt);
        assert_int_equal(system(cmd), 0);
    }
    su_rm_rf(mnt);
}

/* An empty store is not an error: stat, verify, gc, reindex and its dry
 * run succeed and say 0. */
/* PROMISE: RECOVER-39 */
static void test_empty_store_commands(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/empty", su_root);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 16ull << 20});
    kvx_store_close(s);
    static const char *const cmds[][4] = {
        {"store", "stat", NULL}, {"store", "verify", NULL}, {"store", "gc", NULL},
        {"store", "reindex", NULL}, {"store", "reindex", "--dry-run", NULL},
    };
    /* what each says: 0, in its own words */
    static const char *const says[] = {"blocks       0\n", ": OK (0 blocks in 0 shard(s))", ": 0 -> 0 shard(s), 0 B -> 0 B",
                                       ": 0 block(s) in 0 shard(s); 0 shard file(s) set aside",
                                       "would keep 0 shard(s) (0 block(s) indexed), quarantine 0,"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        const char *argv[6] = {0};
        size_t n = 0;
        for (; cmds[i][n]; n++) argv[n] = cmds[i][n];
        argv[n] = dir;
        cli_run r = cli_runv(NULL, argv);
        if (r.rc != 0) fail_msg("kvx %s %s on an empty store: exit %d: %s", cmds[i][0], cmds[i][1], r.rc, r.err);
        if (!strstr(r.out, says[i])) fail_msg("kvx %s %s on an empty store said:\n%s", cmds[i][0], cmds[i][1], r.out);
        cli_run_free(&r);
    }
    su_rm_rf(dir);
}

int main(void)
{
    /* these tests count or damage the files one flush writes as its own
     * shard file: the active shard has its own, tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reindex_repairs_any_index_damage),
        cmocka_unit_test(test_reindex_failure_does_not_point_at_itself),
        cmocka_unit_test(test_reindex_on_read_only_mount),
        cmocka_unit_test(test_reindex_dry_run_then_reindex),
        cmocka_unit_test(test_empty_store_commands),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
