/*
 * migrate.c - a store written by the previous release is migrated at its
 * first writer open (engine/store_migrate.c): tests/lib/fixtures/store-v1
 * (blocks, STORE version 1; gen_store_v1.c) and store-keyed-v2 (keyed,
 * STORE version 2, a key deleted and put again, another deleted; written
 * by kvx 707e378, gen_keyed_v2.c). Its catalog's live set becomes the
 * initial state: every block or key it served is served, nothing deleted
 * comes back, also once index/ is gone (the files then carry the truth); a
 * crash anywhere in a migration leaves a store the next writer migrates
 * on; without a sound catalog it is refused, naming the version and the
 * fix; readers serve an unmigrated store as it is.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/store.h"
#include "common/os.h"

/* A private copy of fixture `name` at dir (a writer's open migrates it);
 * git keeps no empty directory, so staging/ is made here. */
static void copy_fixture(char *dir, size_t cap, const char *name)
{
    su_new_dir(dir, cap);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "cp -r '%s/tests/lib/fixtures/%s' '%s' && mkdir -p '%s/staging' && chmod -R u+rwX,go-rwx '%s'",
             KVX_SOURCE_DIR, name, dir, dir, dir);
    assert_int_equal(system(cmd), 0);
}

/* STORE's format version and kind (docs/FORMAT.md "STORE file"). */
/* Every shard of s has a sequence table. */
static void all_shards_seq(kvx_store *s)
{
    kvx_shard **sh;
    size_t n;
    assert_int_equal(kvx_store_shards(&sh, &n, s), 0);
    assert_true(n > 0);
    for (size_t i = 0; i < n; i++) {
        assert_true(kvx_shard_get_info(sh[i])->flags & KVX_FLAG_SEQ);
        kvx_shard_close(sh[i]);
    }
    kvx_free(sh);
}

/* ---------------------------------------------------------- block store */

static void check_contents(kvx_store *s, uint64_t n_seqs)
{
    for (uint64_t seq = 0; seq < n_seqs; seq++) assert_int_equal(su_served_prefix(s, seq, 6), 6);
    assert_int_equal(su_served_prefix(s, 50, 6), 0);
    /* sequence 40's blocks were put without tokens: never served */
    uint32_t t[4 * SU_B];
    uint64_t h[4];
    su_tokens(t, 40, 4, 0);
    kvx_block_hashes(h, t, 4 * SU_B, SU_B);
    kvx_view v;
    size_t n = 9;
    assert_int_equal(kvx_store_prefix(&v, &n, s, t, 4 * SU_B, 1), 0);
    assert_int_equal(n, 0);
    assert_int_equal(kvx_store_get_hash(&v, s, h[2]), KVX_EUNVERIFIED);
    /* a block of sequence 3 by hash alone: exactly one verified holder */
    su_tokens(t, 3, 4, 0);
    kvx_block_hashes(h, t, 4 * SU_B, SU_B);
    assert_int_equal(kvx_store_get_hash(&v, s, h[3]), 0);
    uint8_t want[64];
    su_page(want, sizeof want, h[3]);
    assert_memory_equal(v.page, want, sizeof want);
    kvx_view_release(&v);
}

static void check_stats(kvx_store *s, uint64_t blocks)
{
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, blocks);
    assert_int_equal(st.unverified, 4);
    assert_int_equal(st.dropped_shards, 0);
    assert_int_equal(st.quarantined, 0);
    assert_true(st.hits >= 24); /* persisted by the writer of the fixture */
    assert_true(st.misses >= 6);
}

/* A reader serves a store of the previous release as it is (readers never
 * migrate) and leaves it unmigrated. */
/* PROMISE: RECOVER-18 */
static void test_reader_serves_old_store(void **state)
{
    (void)state;
    char dir[300];
    copy_fixture(dir, sizeof dir, "store-v1");
    kvx_store *s;
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    check_stats(s, 76);
    check_contents(s, 12);
    uint64_t bad = 99;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    assert_int_equal(bad, 0);
    kvx_store_close(s);
    unsigned v, k;
    su_store_version(dir, &v, &k);
    assert_true(v == 1 && k == 0);
}

/* The first writer open migrates the block fixture: STORE version 3, kind
 * 0, every shard with sequence numbers, every block served as before,
 * nothing dropped; it then takes puts. */
/* PROMISE: RECOVER-18, RECOVER-31 */
static void test_writer_keeps_and_extends_old_store(void **state)
{
    (void)state;
    char dir[300];
    copy_fixture(dir, sizeof dir, "store-v1");
    kvx_store *s;
    kvx_geometry g = su_geometry();
    assert_int_equal(kvx_store_open(&s, dir, &g, 0), 0);
    unsigned v, k;
    su_store_version(dir, &v, &k);
    assert_true(v == 4 && k == 0);
    check_stats(s, 76);
    check_contents(s, 12);
    all_shards_seq(s);
    assert_int_equal(su_put_seq(s, 12, 6), 0);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, &g, KVX_STORE_READONLY), 0);
    check_stats(s, 82);
    check_contents(s, 13);
    uint64_t bad = 99;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    assert_int_equal(bad, 0);
    kvx_store_close(s);
}

/* Once migrated, the block fixture reindexes from its files alone. */
/* PROMISE: RECOVER-18, RECOVER-31 */
static void test_reindex_of_old_store(void **state)
{
    (void)state;
    char dir[300];
    copy_fixture(dir, sizeof dir, "store-v1");
    kvx_store *s;
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(su_put_seq(s, 12, 6), 0);
    kvx_store_close(s);
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, 82);
    assert_int_equal(st.quarantined, 0);
    check_contents(s, 13);
    kvx_store_close(s);
}

/* ---------------------------------------------------------- keyed store */

/* The fixture's keys (gen_keyed_v2.c): "key-i", page i of version v is
 * 512 + 256 i bytes of (v == 1 ? 0x40 : 0xa0) + i; key 3 was deleted and
 * put again with version 2, key 5 deleted. */
static void check_keys(kvx_store *s)
{
    for (int i = 0; i < 10; i++) {
        char name[8];
        snprintf(name, sizeof name, "key-%d", i);
        kvx_key key = {name, strlen(name)};
        kvx_view v;
        int st = -1;
        assert_int_equal(kvx_store_keyed_get(&v, &st, s, &key, 1), 0);
        if (i == 5) {
            if (st == 0) fail_msg("key-5, deleted before the migration, is served again");
            assert_int_equal(st, KVX_ENOTFOUND);
            continue;
        }
        assert_int_equal(st, 0);
        size_t len = 512 + 256 * (size_t)i;
        assert_int_equal(v.page_bytes, len);
        uint8_t want[4096];
        memset(want, (i == 3 ? 0xa0 : 0x40) + i, len);
        if (memcmp(v.page, want, len) != 0) fail_msg("key-%d: not its newest bytes", i);
        kvx_views_release(&v, 1);
    }
}

/* The keyed fixture: a reader serves it unmigrated; the first writer
 * migrates it (STORE version 3, kind 1) and serves each key's newest
 * bytes, the deleted key stays deleted; so it stays after a reindex,
 * after index/ is deleted (the files alone now say what was deleted) and
 * after reindex_dir. */
/* PROMISE: RECOVER-31 */
static void test_keyed_fixture_migrated(void **state)
{
    (void)state;
    char dir[300], cmd[700];
    copy_fixture(dir, sizeof dir, "store-keyed-v2");
    kvx_store *s;
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    check_keys(s);
    kvx_store_close(s);
    unsigned v, k;
    su_store_version(dir, &v, &k);
    assert_true(v == 2 && k == 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    su_store_version(dir, &v, &k);
    assert_true(v == 4 && k == 1);
    check_keys(s);
    all_shards_seq(s);
    assert_int_equal(kvx_store_reindex(s), 0);
    check_keys(s);
    kvx_store_close(s);
    snprintf(cmd, sizeof cmd, "rm -rf '%s/index'", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    check_keys(s);
    kvx_store_close(s);
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    check_keys(s);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.quarantined, 0);
    kvx_store_close(s);
}

/* ------------------------------------------------------------- crashes */

static kvx_os_ops real_os;
static int ops_left; /* fsyncs and renames until the kill */

static void tick(void)
{
    if (--ops_left == 0) _exit(42); /* a kill -9 at this very point */
}

static int hk_fsync(int fd)
{
    tick();
    return real_os.fsync(fd);
}

static int hk_renameat(int a, const char *x, int b, const char *y)
{
    tick();
    return real_os.renameat(a, x, b, y);
}

/* A writer's open of dir in a child killed at its n-th fsync or rename:
 * 1 when killed, 0 when the open finished first. */
static int open_killed_at(const char *dir, int n)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        real_os = kvx_os;
        kvx_os.fsync = hk_fsync;
        kvx_os.renameat = hk_renameat;
        ops_left = n;
        kvx_store *s;
        int rc = kvx_store_open(&s, dir, NULL, 0);
        _exit(rc == 0 ? 0 : 3);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_true(WEXITSTATUS(st) == 42 || WEXITSTATUS(st) == 0);
    return WEXITSTATUS(st) == 42;
}

/* A migration killed at each of its fsyncs and renames in turn (the
 * copies sealed, the catalog edits, the drops, STORE's rename), then
 * opened again by a writer: the migration finishes, every key answers
 * its newest bytes and the deleted key stays deleted; so does a second
 * kill during the resumed migration. */
/* PROMISE: RECOVER-32 */
static void test_crash_mid_migration_resumes(void **state)
{
    (void)state;
    int killed = 1, n;
    for (n = 1; killed && n < 400; n++) {
        char dir[300];
        copy_fixture(dir, sizeof dir, "store-keyed-v2");
        killed = open_killed_at(dir, n);
        if (killed && n % 3 == 0) open_killed_at(dir, n / 3 + 1); /* the resumed one, cut too */
        kvx_store *s;
        int rc = kvx_store_open(&s, dir, NULL, 0);
        if (rc) fail_msg("killed at op %d: the next writer open failed: %s", n, kvx_last_error());
        unsigned v, k;
        su_store_version(dir, &v, &k);
        assert_true(v == 4 && k == 1);
        check_keys(s);
        all_shards_seq(s);
        kvx_store_close(s);
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
    }
    assert_false(killed); /* the last open finished: every point was tried */
    assert_true(n > 5);
}

/* ------------------------------------------------------------- refusals */

/* Without its index/ a store of the previous release cannot be migrated
 * (only its catalog knows its deletes): a writer's open and reindex_dir
 * refuse it with KVX_EVERSION naming the version and the fix, and change
 * nothing; a reader says the index is missing. With index/ back, the
 * writer migrates it. */
/* PROMISE: RECOVER-33 */
static void test_unmigrated_without_index_refused(void **state)
{
    (void)state;
    const char *fx[2] = {"store-keyed-v2", "store-v1"};
    for (int f = 0; f < 2; f++) {
        char dir[300], cmd[1200];
        copy_fixture(dir, sizeof dir, fx[f]);
        snprintf(cmd, sizeof cmd, "mv '%s/index' '%s/index.keep'", dir, dir);
        assert_int_equal(system(cmd), 0);
        kvx_store *s;
        for (int i = 0; i < 2; i++) {
            int rc = i ? kvx_store_reindex_dir(dir, 0) : kvx_store_open(&s, dir, NULL, 0);
            assert_int_equal(rc, KVX_EVERSION);
            char want[32];
            snprintf(want, sizeof want, "STORE version %d", f ? 1 : 2);
            assert_non_null(strstr(kvx_last_error(), want));
            assert_non_null(strstr(kvx_last_error(), "open it once as the writer with its index/ intact"));
            assert_non_null(strstr(kvx_last_error(), "recreate it"));
        }
        unsigned v, k;
        su_store_version(dir, &v, &k);
        assert_int_equal(v, f ? 1 : 2);
        assert_int_equal(su_n_files(dir, "quarantine"), 0);
        assert_int_not_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
        snprintf(cmd, sizeof cmd, "rm -rf '%s/index' && mv '%s/index.keep' '%s/index'", dir, dir, dir);
        assert_int_equal(system(cmd), 0);
        assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
        if (!f) check_keys(s);
        else check_contents(s, 12);
        kvx_store_close(s);
    }
}

/* A store of the previous release whose last writer died in the middle
 * of a drop (its victim still in shards/, its drop mark beside it in
 * staging/, the catalog committed) and left a temporary file: the
 * writer's open finishes the drop and clears staging/ first, so the
 * catalog names exactly the files again, and migrates it. */
/* PROMISE: RECOVER-31 */
static void test_old_store_with_a_cut_drop_migrates(void **state)
{
    (void)state;
    char dir[300], cmd[2048];
    copy_fixture(dir, sizeof dir, "store-keyed-v2");
    snprintf(cmd, sizeof cmd,
             "cd '%s' && f=$(ls shards | head -1) && cp shards/$f shards/00000000000000f0.kvx && "
             "ln shards/00000000000000f0.kvx staging/.00000000000000f0.kvx.tmp.drop && "
             ": > staging/.00000000000000f1.kvx.tmp.77",
             dir);
    assert_int_equal(system(cmd), 0);
    kvx_store *s = NULL;
    int rc = kvx_store_open(&s, dir, NULL, 0);
    if (rc) fail_msg("open: %s (%s)", kvx_err_name(rc), kvx_last_error());
    unsigned v, k;
    su_store_version(dir, &v, &k);
    assert_true(v == 4 && k == 1);
    check_keys(s);
    kvx_store_close(s);
    char p[600];
    struct stat st;
    snprintf(p, sizeof p, "%s/shards/00000000000000f0.kvx", dir);
    assert_int_not_equal(stat(p, &st), 0);
    assert_int_equal(su_n_files(dir, "staging"), 0);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reader_serves_old_store),
        cmocka_unit_test(test_writer_keeps_and_extends_old_store),
        cmocka_unit_test(test_reindex_of_old_store),
        cmocka_unit_test(test_keyed_fixture_migrated),
        cmocka_unit_test(test_old_store_with_a_cut_drop_migrates),
        cmocka_unit_test(test_crash_mid_migration_resumes),
        cmocka_unit_test(test_unmigrated_without_index_refused),
    };
    return cmocka_run_group_tests_name("engine/migrate", tests, su_setup, su_teardown);
}
