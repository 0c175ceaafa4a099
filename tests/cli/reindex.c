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
        "mkdir %s/index.old && : > %s/index.old/not-ours",            /* a stuck index.old */
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
        assert_non_null(strstr(r.out, ": 12 blocks in"));
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reindex_repairs_any_index_damage),
        cmocka_unit_test(test_reindex_failure_does_not_point_at_itself),
        cmocka_unit_test(test_reindex_on_read_only_mount),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
