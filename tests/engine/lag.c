/*
 * lag.c - engine/store_lag.c: the writer's catalog commits skip LMDB's
 * syncs only under a durable mark DIR/UNSYNCED naming the boot; close
 * syncs and removes it; a mark of an earlier boot (a power cut) makes the
 * writer's open rebuild index/ from the files without reading it and a
 * reader refuse; a mark of this boot (kill -9) keeps the catalog.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/os.h"
#include "lib/store.h"

static char fake_boot[64];
static int fake_boot_id(char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", fake_boot);
    return 0;
}
static int no_boot_id(char *buf, size_t cap)
{
    (void)buf;
    (void)cap;
    errno = ENOENT;
    return -1;
}
static int boot_off(void **state)
{
    (void)state;
    kvx_os_reset();
    return 0;
}

static int mark_text(const char *dir, char *buf, size_t cap)
{
    char p[400];
    snprintf(p, sizeof p, "%s/UNSYNCED", dir);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
    return 0;
}

/* A writer process that puts and flushes seqs [first, first + n) and dies
 * without closing (kill -9 as far as the store can tell). */
static void killed_writer(const char *dir, uint64_t first, uint64_t n)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kvx_store *s = NULL;
        if (kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT) != 0) _exit(2);
        for (uint64_t q = first; q < first + n; q++)
            if (su_put_seq(s, q, SU_NB) != 0) _exit(3);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* The mark is made at the first flush (not at open), names this boot, and
 * close removes it after syncing the catalog. */
/* PROMISE: DUR-19 */
static void test_lag_mark_lifecycle(void **state)
{
    (void)state;
    char dir[300], text[256], id[128];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    assert_int_equal(mark_text(dir, text, sizeof text), -1); /* open alone makes none */
    su_put_flush(s, 1, SU_NB);
    assert_int_equal(mark_text(dir, text, sizeof text), 0);
    assert_int_equal(kvx_os.boot_id(id, sizeof id), 0);
    assert_non_null(strstr(text, id));
    su_put_flush(s, 2, SU_NB);
    kvx_store_close(s);
    assert_int_equal(mark_text(dir, text, sizeof text), -1);
    s = su_reopen(dir, 0);
    kvx_recovery_report r;
    assert_int_equal(kvx_store_recovery(s, &r), 0);
    assert_int_equal(r.rebuilt, 0);
    assert_int_equal(su_prefix_nb(s, 1), SU_NB);
    assert_int_equal(su_prefix_nb(s, 2), SU_NB);
    kvx_store_close(s);
}

/* kill -9 in this boot: the catalog is whole in the page cache; a reader
 * serves from it, the next writer keeps it (no rebuild), syncs it and
 * removes the mark. */
/* PROMISE: DUR-20 */
static void test_lag_same_boot_keeps(void **state)
{
    (void)state;
    char dir[300], text[256];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    kvx_store_close(s);
    killed_writer(dir, 10, 3);
    assert_int_equal(mark_text(dir, text, sizeof text), 0);
    kvx_store *r = su_reopen(dir, KVX_STORE_READONLY);
    for (uint64_t q = 10; q < 13; q++) assert_int_equal(su_prefix_nb(r, q), SU_NB);
    kvx_store_close(r);
    s = su_reopen(dir, 0);
    kvx_recovery_report rep;
    assert_int_equal(kvx_store_recovery(s, &rep), 0);
    assert_int_equal(rep.rebuilt, 0);
    assert_int_equal(mark_text(dir, text, sizeof text), -1);
    for (uint64_t q = 10; q < 13; q++) assert_int_equal(su_prefix_nb(s, q), SU_NB);
    kvx_store_close(s);
}

/* A power cut (the mark names another boot) with data.mdb torn: a reader
 * is refused, naming reindex; the writer's open sets index/ aside unread
 * (a damaged data.mdb would otherwise fail the open), rebuilds it from the
 * files and serves every acknowledged block; the mark goes. */
/* PROMISE: DUR-20 */
static void test_lag_earlier_boot_rebuilds(void **state)
{
    (void)state;
    char dir[300], text[256], p[400];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 20, SU_NB);
    kvx_store_close(s);
    killed_writer(dir, 21, 3);
    assert_int_equal(mark_text(dir, text, sizeof text), 0);
    /* torn: both meta pages and a page beyond them overwritten */
    snprintf(p, sizeof p, "%s/index/data.mdb", dir);
    FILE *f = fopen(p, "r+");
    assert_non_null(f);
    static uint8_t junk[3 * 4096];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 131 + 7);
    assert_int_equal(fwrite(junk, 1, sizeof junk, f), sizeof junk);
    fclose(f);
    snprintf(fake_boot, sizeof fake_boot, "another-boot-%ld", (long)getpid());
    kvx_os.boot_id = fake_boot_id;
    kvx_store *r = NULL;
    int rc = kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY);
    assert_int_equal(rc, KVX_ESTALE);
    assert_non_null(strstr(kvx_last_error(), "reindex"));
    s = su_reopen(dir, 0);
    kvx_recovery_report rep;
    assert_int_equal(kvx_store_recovery(s, &rep), 0);
    assert_int_equal(rep.rebuilt, 1);
    assert_int_equal(mark_text(dir, text, sizeof text), -1);
    for (uint64_t q = 20; q < 24; q++) assert_int_equal(su_prefix_nb(s, q), SU_NB);
    su_put_flush(s, 30, SU_NB); /* a new mark, of this (fake) boot */
    kvx_store_close(s);
    r = su_reopen(dir, KVX_STORE_READONLY);
    for (uint64_t q = 20; q < 24; q++) assert_int_equal(su_prefix_nb(r, q), SU_NB);
    assert_int_equal(su_prefix_nb(r, 30), SU_NB);
    kvx_store_close(r);
}

/* A mark that is not this boot's text (torn, foreign) counts as an
 * earlier boot's; no boot id at all: flushes stay synced, no mark. */
/* PROMISE: DUR-19, DUR-20 */
static void test_lag_torn_mark_and_no_boot_id(void **state)
{
    (void)state;
    char dir[300], text[256], p[400];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 40, SU_NB);
    kvx_store_close(s);
    snprintf(p, sizeof p, "%s/UNSYNCED", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("kvx unsync", f); /* torn */
    fclose(f);
    kvx_store *r = NULL;
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), KVX_ESTALE);
    s = su_reopen(dir, 0);
    kvx_recovery_report rep;
    assert_int_equal(kvx_store_recovery(s, &rep), 0);
    assert_int_equal(rep.rebuilt, 1);
    assert_int_equal(su_prefix_nb(s, 40), SU_NB);
    kvx_store_close(s);
    kvx_os.boot_id = no_boot_id;
    s = su_reopen(dir, 0);
    su_put_flush(s, 41, SU_NB);
    assert_int_equal(mark_text(dir, text, sizeof text), -1);
    kvx_store_close(s);
    kvx_os_reset();
    s = su_reopen(dir, 0);
    assert_int_equal(su_prefix_nb(s, 41), SU_NB);
    kvx_store_close(s);
}


static void put_mark(const char *dir, const void *text, size_t len)
{
    char p[400];
    snprintf(p, sizeof p, "%s/UNSYNCED", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
}

static size_t this_boot_text(char *buf, size_t cap)
{
    char id[128];
    assert_int_equal(kvx_os.boot_id(id, sizeof id), 0);
    return (size_t)snprintf(buf, cap, "kvx unsynced catalog since boot %s\n", id);
}

/* What stands at DIR/UNSYNCED is not exactly this boot's mark: a reader
 * is refused, the writer rebuilds, serves what was flushed and removes
 * it. kind: a FIFO (no open may wait on it), a symlink to this boot's
 * text, an empty file, this boot's text followed by a NUL and more (a
 * mark padded with zeros), this boot's text followed by 1 MiB. */
static void odd_mark(const char *kind)
{
    char dir[300], p[400], text[256];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 50, SU_NB);
    kvx_store_close(s);
    snprintf(p, sizeof p, "%s/UNSYNCED", dir);
    size_t n = this_boot_text(text, sizeof text);
    if (!strcmp(kind, "fifo")) {
        assert_int_equal(mkfifo(p, 0600), 0);
    } else if (!strcmp(kind, "symlink")) {
        char t[400];
        snprintf(t, sizeof t, "%s/elsewhere", dir);
        FILE *f = fopen(t, "w");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
        assert_int_equal(symlink(t, p), 0);
    } else if (!strcmp(kind, "empty")) {
        put_mark(dir, "", 0);
    } else if (!strcmp(kind, "nul")) {
        char t[300];
        memcpy(t, text, n);
        memcpy(t + n, "\0junk", 5);
        put_mark(dir, t, n + 5);
    } else {
        size_t big = (size_t)1 << 20;
        char *t = malloc(n + big);
        assert_non_null(t);
        memcpy(t, text, n);
        memset(t + n, 'x', big);
        put_mark(dir, t, n + big);
        free(t);
    }
    kvx_store *r = NULL;
    int rc = kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY);
    if (rc != KVX_ESTALE) fail_msg("%s: a reader's open answered %s, not KVX_ESTALE", kind, kvx_err_name(rc));
    s = su_reopen(dir, 0);
    kvx_recovery_report rep;
    assert_int_equal(kvx_store_recovery(s, &rep), 0);
    assert_int_equal(rep.rebuilt, 1);
    assert_int_equal(su_prefix_nb(s, 50), SU_NB);
    struct stat st;
    assert_int_equal(lstat(p, &st), -1);
    kvx_store_close(s);
}

/* PROMISE: DUR-20 */
static void test_lag_odd_marks(void **state)
{
    (void)state;
    const char *k[] = {"fifo", "symlink", "empty", "nul", "huge"};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) odd_mark(k[i]);
}

/* One process: a reader opened while the writer lags shares its
 * environment; the writer's close removes the mark, a second writer's
 * open makes none, its first flush a new one, its close removes it; the
 * reader sees every flush. */
/* PROMISE: DUR-19 */
static void test_lag_writers_in_sequence(void **state)
{
    (void)state;
    char dir[300], text[256];
    kvx_store *w = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(w, 60, SU_NB);
    kvx_store *r = su_reopen(dir, KVX_STORE_READONLY);
    assert_int_equal(mark_text(dir, text, sizeof text), 0);
    kvx_store_close(w);
    assert_int_equal(mark_text(dir, text, sizeof text), -1);
    w = su_reopen(dir, 0);
    assert_int_equal(mark_text(dir, text, sizeof text), -1);
    su_put_flush(w, 61, SU_NB);
    assert_int_equal(mark_text(dir, text, sizeof text), 0);
    assert_int_equal(su_prefix_nb(r, 60), SU_NB);
    assert_int_equal(su_prefix_nb(r, 61), SU_NB);
    kvx_store_close(r);
    kvx_store_close(w);
    assert_int_equal(mark_text(dir, text, sizeof text), -1);
}

/* After a kill -9, a reader verifies and counts the catalog of this boot;
 * after a power cut (another boot) the reindex's plan is made (index/ is
 * not read) and kvx_store_reindex_dir rebuilds and removes the mark. */
/* PROMISE: DUR-20 */
static void test_lag_reindex_with_mark(void **state)
{
    (void)state;
    char dir[300], text[256];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 70, SU_NB);
    kvx_store_close(s);
    killed_writer(dir, 71, 2);
    kvx_store *r = su_reopen(dir, KVX_STORE_READONLY);
    su_verify_clean(r);
    assert_int_equal(su_stat(r).blocks, 3 * SU_NB);
    kvx_store_close(r);
    snprintf(fake_boot, sizeof fake_boot, "another-boot-%ld", (long)getpid());
    kvx_os.boot_id = fake_boot_id;
    kvx_store_plan *p = NULL;
    assert_int_equal(kvx_store_plan_reindex(&p, dir), 0);
    kvx_store_plan_free(p);
    assert_int_equal(mark_text(dir, text, sizeof text), 0);
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    assert_int_equal(mark_text(dir, text, sizeof text), -1);
    r = su_reopen(dir, KVX_STORE_READONLY);
    for (uint64_t q = 70; q < 73; q++) assert_int_equal(su_prefix_nb(r, q), SU_NB);
    kvx_store_close(r);
}

/* While no_shards is set, a shard of shards/ opens once; opened again
 * (the judge of an eviction's victim after its commit) it fails with
 * EMFILE: a passing failure, no verdict. */
static int no_shards;
static char seen[64][24];
static int n_seen;
static int (*real_openat)(int, const char *, int, mode_t);
static int shards_emfile(int dirfd, const char *name, int flags, mode_t mode)
{
    size_t n = strlen(name);
    if (no_shards && n == 20 && strcmp(name + 16, ".kvx") == 0) {
        for (int i = 0; i < n_seen; i++)
            if (strcmp(seen[i], name) == 0) {
                errno = EMFILE;
                return -1;
            }
        if (n_seen < 64) snprintf(seen[n_seen++], sizeof seen[0], "%s", name);
    }
    return real_openat(dirfd, name, flags, mode);
}

#define LAG_PB 4096
static int lag_key_put_flush(kvx_store *s, const char *k)
{
    int rc = su_key_put(s, NULL, k, strlen(k), LAG_PB, 1, NULL);
    return rc ? rc : kvx_store_flush(s);
}

/* A keyed page evicted (not carried) whose file stays in shards/ beside
 * its drop mark (it could not be judged: EMFILE), then deleted by its
 * owner (not held: no tombstone), must not come back after a power cut:
 * the eviction's catalog commit is what said the file is gone, and with
 * the catalog lagging that commit is lost. The writer process dies
 * without close; the next open is in another boot. Used to: the rebuild
 * adopted the victims again (without a sound catalog the reindex judges
 * the file) and the deleted page was served; now a victim left beside its
 * mark syncs the catalog and stops the lag while the mark remains, so
 * recovery finishes the drop on a sound catalog's word. */
/* PROMISE: DUR-19 */
static void test_lag_evicted_then_deleted_stays_gone(void **state)
{
    (void)state;
    char dir[300], names[600][16];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = LAG_PB, .capacity = 2ull << 20});
    kvx_store_close(s);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        real_openat = kvx_os.openat;
        kvx_os.openat = shards_emfile;
        if (kvx_store_open(&s, dir, NULL, 0) != 0) _exit(2);
        int gone = -1, last = 0;
        for (int i = 0; i < 600 && gone < 0; i++) {
            last = i;
            snprintf(names[i], sizeof names[i], "page-%d", i);
            kvx_store_stats st;
            if (kvx_store_stat(&st, s) != 0) _exit(3);
            no_shards = st.bytes + 2 * LAG_PB > st.capacity_bytes; /* this flush evicts */
            n_seen = 0;
            if (lag_key_put_flush(s, names[i]) != 0) _exit(4);
            no_shards = 0;
            if (kvx_store_stat(&st, s) != 0) _exit(5);
            if (!st.evictions) continue;
            for (int j = 0; j <= i && gone < 0; j++)
                if (su_key_check(s, names[j], strlen(names[j]), LAG_PB, 1) == KVX_ENOTFOUND) gone = j;
        }
        if (gone < 0) _exit(6);
        /* the owner deletes most of what is held and gc reclaims it: the
         * store is far under its capacity */
        for (int j = gone + 1; j < last; j++) {
            kvx_key d = {names[j], strlen(names[j])};
            if (kvx_store_keyed_delete(s, &d, 1, NULL) != 0) _exit(9);
        }
        if (kvx_store_gc(s) != 0) _exit(10);
        kvx_key k = {names[gone], strlen(names[gone])};
        size_t deleted = 9;
        if (kvx_store_keyed_delete(s, &k, 1, &deleted) != 0) _exit(7);
        if (deleted != 0) _exit(11); /* not held: no tombstone */
        if (write(pfd[1], &gone, sizeof gone) != (ssize_t)sizeof gone) _exit(8);
        _exit(0); /* no close: the catalog lags */
    }
    close(pfd[1]);
    int gone = -1, st = 0;
    assert_int_equal(read(pfd[0], &gone, sizeof gone), (ssize_t)sizeof gone);
    close(pfd[0]);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char name[16];
    snprintf(name, sizeof name, "page-%d", gone);
    snprintf(fake_boot, sizeof fake_boot, "another-boot-%ld", (long)getpid());
    kvx_os.boot_id = fake_boot_id;
    s = su_reopen(dir, 0);
    kvx_recovery_report rep;
    assert_int_equal(kvx_store_recovery(s, &rep), 0);
    /* the victims left beside their marks stopped the lag: the catalog was
     * synced, no mark was left to set it aside, and it finished the drops */
    assert_int_equal(rep.rebuilt, 0);
    int got = su_key_check(s, name, strlen(name), LAG_PB, 1);
    if (got != KVX_ENOTFOUND)
        fail_msg("%s, evicted and then deleted by its owner, is served again after a power cut (%s)", name,
                 got == 0 ? "its old page" : kvx_err_name(got));
    kvx_store_close(s);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lag_mark_lifecycle),
        cmocka_unit_test(test_lag_same_boot_keeps),
        cmocka_unit_test_teardown(test_lag_earlier_boot_rebuilds, boot_off),
        cmocka_unit_test_teardown(test_lag_torn_mark_and_no_boot_id, boot_off),
        cmocka_unit_test(test_lag_odd_marks),
        cmocka_unit_test(test_lag_writers_in_sequence),
        cmocka_unit_test_teardown(test_lag_reindex_with_mark, boot_off),
        cmocka_unit_test_teardown(test_lag_evicted_then_deleted_stays_gone, boot_off),
    };
    return cmocka_run_group_tests_name("engine/lag", tests, su_setup, su_teardown);
}
