/*
 * test_attack13.c - durability defects of the hostile engine review
 * (recovery, drops, create, the writer lock), each reproduced here first:
 *
 *  - test_gc_crash_drop_not_adopted (H1): a keyed store; gc rewrites a
 *    shard half of whose pages were deleted and is killed (kill -9, at
 *    the unlink of the dropped shard, after its commit). The next
 *    writer's recovery adopted the dropped file with every entry: a key
 *    deleted with an acknowledged delete came back, and a key deleted and
 *    put again answered its old bytes. Now every drop (eviction,
 *    compaction, gc) first gives each victim a durable second name in
 *    staging/ (its drop mark); recovery moves a file beside its mark that
 *    the catalog no longer names to quarantine/.
 *  - test_drop_unlink_durable (H1, power cut): the order of a drop, seen
 *    through the OS seam: mark, fsync of staging/, (commit), unlink,
 *    fsync of shards/, and only then the mark goes. Before, nothing made
 *    the unlink durable, so a power cut brought the victim back unmarked.
 *  - test_stale_index_twin_quarantined (M1): with an older index put back
 *    and a flush's staging/ twin surviving, recovery unlinked an
 *    acknowledged shard (the catalog did not name it). Now it moves to
 *    quarantine/ (not served, bytes kept); put back in shards/ without
 *    the twin, the next writer adopts it.
 *  - test_create_syncs_parent (M2): kvx_store_create fsyncs the directory
 *    holding DIR (before, a power cut could lose DIR and every block).
 *  - test_lock_removed_busy, test_lock_replaced_relocks (M3): with
 *    DIR/LOCK removed under a writer, a second writer opened too; a LOCK
 *    replaced while a writer took it left that writer holding a lock on a
 *    file no longer named LOCK.
 *  - test_fifo_victim_left_alone (L3): a FIFO planted at a live shard's
 *    name while the writer runs is dropped from the index and left where
 *    it is, never moved into quarantine/.
 *
 * White-box through the OS seam (common/os.h) only.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/os.h"
#include "lib/store.h"

#define PB 8192u

/* The page a key has under "version" ver. */
static void fill(uint8_t *p, size_t n, const char *key, uint64_t ver)
{
    su_page(p, n, kvx_key_hash(key, strlen(key)) ^ (ver * 0x9E3779B97F4A7C15ull));
}

static void put1(kvx_store *s, const char *key, size_t len, uint64_t ver)
{
    uint8_t *p = malloc(len);
    fill(p, len, key, ver);
    kvx_key k = {key, strlen(key)};
    const void *pages[1] = {p};
    size_t lens[1] = {len};
    int rc = kvx_store_keyed_put(s, NULL, &k, pages, lens, 1, NULL);
    free(p);
    if (rc) fail_msg("put %s: %s (%s)", key, kvx_err_name(rc), kvx_last_error());
}

/* 0 when key is served with exactly (len, ver)'s bytes; the get's status
 * otherwise (1 when served with other bytes). */
static int check1(kvx_store *s, const char *key, size_t len, uint64_t ver)
{
    kvx_key k = {key, strlen(key)};
    kvx_view v;
    int st = 0;
    int rc = kvx_store_keyed_get(&v, &st, s, &k, 1);
    if (rc) return rc;
    if (st) return st;
    uint8_t *want = malloc(len);
    fill(want, len, key, ver);
    int same = v.page_bytes == len && memcmp(v.page, want, len) == 0;
    free(want);
    kvx_view_release(&v);
    return same ? 0 : 1;
}

static void del1(kvx_store *s, const char *key)
{
    kvx_key k = {key, strlen(key)};
    size_t n = 99;
    assert_int_equal(kvx_store_keyed_delete(s, &k, 1, &n), 0);
    assert_int_equal(n, 1);
}

static int in_dir(const char *dir, const char *sub, const char *name, mode_t *mode)
{
    char p[700];
    struct stat st;
    snprintf(p, sizeof p, "%.300s/%.20s/%.300s", dir, sub, name);
    if (lstat(p, &st) != 0) return 0;
    if (mode) *mode = st.st_mode;
    return 1;
}

/* ------------------------------------------------------------------ */
/* The OS seam: a log of the calls that order a drop, and a kill. */

static kvx_os_ops real_os;
static char kill_at[64];        /* unlinkat of this name: _exit(42), a kill -9 there */
static char dirpath[1024][128]; /* the path each open directory descriptor was opened with */
static char ev[1024][160];
static int nev;

static void log_ev(const char *what, const char *arg)
{
    if (nev < 1024) snprintf(ev[nev++], sizeof ev[0], "%s:%.140s", what, arg);
}

static int hk_open(const char *path, int flags, mode_t mode)
{
    int fd = real_os.open(path, flags, mode);
    if (fd >= 0 && fd < 1024) snprintf(dirpath[fd], sizeof dirpath[0], "%.127s", (flags & O_DIRECTORY) ? path : "");
    return fd;
}

static int hk_close(int fd)
{
    if (fd >= 0 && fd < 1024) dirpath[fd][0] = 0;
    return real_os.close(fd);
}

static int hk_fsync(int fd)
{
    if (fd >= 0 && fd < 1024 && dirpath[fd][0]) log_ev("fsync", dirpath[fd]);
    return real_os.fsync(fd);
}

static int hk_unlinkat(int dirfd, const char *path, int flags)
{
    if (kill_at[0] && strcmp(path, kill_at) == 0) _exit(42);
    log_ev("unlink", path);
    return real_os.unlinkat(dirfd, path, flags);
}

static int hk_linkat(int a, const char *from, int b, const char *to, int flags)
{
    log_ev("link", to);
    return real_os.linkat(a, from, b, to, flags);
}

static int hk_mkdir(const char *path, mode_t mode)
{
    log_ev("mkdir", path);
    return real_os.mkdir(path, mode);
}

static void hooks_on(void)
{
    real_os = kvx_os;
    nev = 0;
    memset(dirpath, 0, sizeof dirpath);
    kvx_os.open = hk_open;
    kvx_os.close = hk_close;
    kvx_os.fsync = hk_fsync;
    kvx_os.unlinkat = hk_unlinkat;
    kvx_os.linkat = hk_linkat;
    kvx_os.mkdir = hk_mkdir;
}

static int hooks_off(void **state)
{
    (void)state;
    kvx_os_reset();
    kill_at[0] = 0;
    return 0;
}

/* The first logged event equal to want at or after index from, or -1. */
static int find_ev(const char *want, int from)
{
    for (int i = from < 0 ? 0 : from; i < nev; i++)
        if (strcmp(ev[i], want) == 0) return i;
    return -1;
}

/* ------------------------------------------------------------------ */
/* H1 */

/* O holds K, J, L (K and J then deleted, K put again in P): gc rewrites
 * O (2 of 3 pages deleted) into a shard of L alone and drops O. Returns
 * O's file name in name. */
static kvx_store *deleted_setup(char *dir, size_t cap, char name[64])
{
    kvx_store *s = su_store(dir, cap, (su_spec){.page_bytes = PB, .flags = KVX_STORE_NOWAIT});
    put1(s, "K", PB, 1);
    put1(s, "J", PB, 1);
    put1(s, "L", PB, 1);
    assert_int_equal(kvx_store_flush(s), 0);
    char names[8][64];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    memcpy(name, names[0], 64);
    del1(s, "K");
    del1(s, "J");
    put1(s, "K", 300, 2);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(check1(s, "K", 300, 2), 0);
    assert_int_equal(check1(s, "J", PB, 1), KVX_ENOTFOUND);
    return s;
}

static void test_gc_crash_drop_not_adopted(void **state)
{
    (void)state;
    char dir[300], oname[64];
    kvx_store *s = deleted_setup(dir, sizeof dir, oname);
    kvx_store_close(s);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* the writer that dies at O's unlink, after gc's commit */
        kvx_store *w = NULL;
        if (kvx_store_open(&w, dir, NULL, KVX_STORE_NOWAIT) != 0) _exit(2);
        hooks_on();
        snprintf(kill_at, sizeof kill_at, "%s", oname);
        kvx_store_gc(w);
        _exit(3); /* gc never unlinked O */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) != 42) fail_msg("the child exited %d, not at O's unlink (42)", WEXITSTATUS(status));
    assert_true(in_dir(dir, "shards", oname, NULL)); /* the crash left it */
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    int j = check1(s, "J", PB, 1), k = check1(s, "K", 300, 2);
    if (j != KVX_ENOTFOUND)
        fail_msg("a key deleted (acknowledged) before gc's crash answers %d (0: its deleted bytes came back)", j);
    if (k) fail_msg("a key deleted and put again answers %d after gc's crash (1: the deleted page's bytes)", k);
    assert_int_equal(check1(s, "L", PB, 1), 0);
    /* the dropped file: not in shards/, its bytes in quarantine/ */
    assert_false(in_dir(dir, "shards", oname, NULL));
    assert_true(in_dir(dir, "quarantine", oname, NULL));
    char names[8][64];
    assert_int_equal(su_list_names(dir, "staging", names, 8), 0);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT); /* and for good */
    assert_int_equal(check1(s, "J", PB, 1), KVX_ENOTFOUND);
    assert_int_equal(check1(s, "K", 300, 2), 0);
    kvx_store_close(s);
}

static void test_drop_unlink_durable(void **state)
{
    (void)state;
    char dir[300], oname[64];
    kvx_store *s = deleted_setup(dir, sizeof dir, oname);
    char mark[128], shards[400], staging[400];
    snprintf(mark, sizeof mark, ".%s.tmp.drop", oname);
    snprintf(shards, sizeof shards, "%s/shards", dir);
    snprintf(staging, sizeof staging, "%s/staging", dir);
    char want[600];
    hooks_on();
    int rc = kvx_store_gc(s);
    kvx_os_reset();
    assert_int_equal(rc, 0);
    snprintf(want, sizeof want, "link:%s", mark);
    int i_link = find_ev(want, 0);
    if (i_link < 0) fail_msg("gc dropped shards/%s without a mark in staging/ first", oname);
    snprintf(want, sizeof want, "fsync:%s", staging);
    int i_sync_st = find_ev(want, i_link);
    snprintf(want, sizeof want, "unlink:%s", oname);
    int i_unlink = find_ev(want, i_link);
    assert_true(i_sync_st > i_link);
    assert_true(i_unlink > i_sync_st); /* the commit lies between */
    snprintf(want, sizeof want, "fsync:%s", shards);
    int i_sync_sh = find_ev(want, i_unlink);
    if (i_sync_sh < 0) fail_msg("the unlink of the dropped shards/%s was never made durable", oname);
    snprintf(want, sizeof want, "unlink:%s", mark);
    int i_unmark = find_ev(want, i_unlink);
    assert_true(i_unmark > i_sync_sh);
    char names[8][64];
    assert_int_equal(su_list_names(dir, "staging", names, 8), 0);
    assert_false(in_dir(dir, "shards", oname, NULL));
    assert_int_equal(check1(s, "K", 300, 2), 0);
    assert_int_equal(check1(s, "L", PB, 1), 0);
    kvx_store_close(s);
}

/* ------------------------------------------------------------------ */
/* M1 */

static int cp(const char *from, const char *to)
{
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    return system(cmd);
}

static void test_stale_index_twin_quarantined(void **state)
{
    (void)state;
    char dir[300], idx[400], old[400], p[700], q[700];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.flags = KVX_STORE_NOWAIT});
    assert_int_equal(su_put_seq(s, 1, 4), 0);
    kvx_store_close(s);
    snprintf(idx, sizeof idx, "%s/index/data.mdb", dir);
    snprintf(old, sizeof old, "%s.old.mdb", dir);
    assert_int_equal(cp(idx, old), 0);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(su_put_seq(s, 2, 4), 0); /* acknowledged: shard G */
    kvx_store_close(s);
    char names[8][64];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 2);
    char g[64];
    memcpy(g, names[1], 64); /* the newer generation */
    /* the staging/ twin a crash (or a power cut before the next flush)
     * leaves beside a published shard, and the older index put back */
    snprintf(p, sizeof p, "%s/shards/%s", dir, g);
    snprintf(q, sizeof q, "%s/staging/.%s.tmp.1.0000000000000000", dir, g);
    assert_int_equal(link(p, q), 0);
    struct stat before;
    assert_int_equal(stat(p, &before), 0);
    assert_int_equal(cp(old, idx), 0);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(su_served_prefix(s, 1, 4), 4);
    assert_int_equal(su_served_prefix(s, 2, 4), 0); /* whole or nothing: not served */
    kvx_store_close(s);
    /* never unlinked: the same file in quarantine/ */
    assert_false(in_dir(dir, "shards", g, NULL));
    snprintf(q, sizeof q, "%s/quarantine/%s", dir, g);
    struct stat now;
    if (stat(q, &now) != 0) fail_msg("the acknowledged shards/%s was deleted, not moved to quarantine/", g);
    assert_true(now.st_ino == before.st_ino && now.st_size == before.st_size);
    assert_int_equal(su_list_names(dir, "staging", names, 8), 0);
    /* put back by the operator: the next writer adopts it */
    assert_int_equal(rename(q, p), 0);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(su_served_prefix(s, 2, 4), 4);
    assert_int_equal(su_served_prefix(s, 1, 4), 4);
    kvx_store_close(s);
}

/* ------------------------------------------------------------------ */
/* M2 */

static void test_create_syncs_parent(void **state)
{
    (void)state;
    char dir[300], want[600];
    su_new_dir(dir, sizeof dir);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.flags = KVX_STORE_NOWAIT;
    kvx_store *s = NULL;
    hooks_on();
    int rc = kvx_store_create(&s, dir, &o);
    kvx_os_reset();
    assert_int_equal(rc, 0);
    kvx_store_close(s);
    snprintf(want, sizeof want, "mkdir:%s", dir);
    int i_mkdir = find_ev(want, 0);
    assert_true(i_mkdir >= 0);
    snprintf(want, sizeof want, "fsync:%s", su_root);
    if (find_ev(want, i_mkdir) < 0) fail_msg("kvx_store_create never fsynced %s, which holds the new store", su_root);
}

/* ------------------------------------------------------------------ */
/* M3 */

static void test_lock_removed_busy(void **state)
{
    (void)state;
    char dir[300], lock[400];
    kvx_store *a = su_store(dir, sizeof dir, (su_spec){.flags = KVX_STORE_NOWAIT});
    snprintf(lock, sizeof lock, "%s/LOCK", dir);
    assert_int_equal(unlink(lock), 0); /* a "stale lock file" cleanup */
    kvx_store *b = NULL;
    int rc = kvx_store_open(&b, dir, NULL, KVX_STORE_NOWAIT);
    if (rc == 0) {
        kvx_store_close(b);
        fail_msg("a second writer opened while the first holds the store (DIR/LOCK removed)");
    }
    assert_int_equal(rc, KVX_EBUSY);
    assert_int_equal(su_put_seq(a, 1, 2), 0);
    kvx_store_close(a);
    b = su_reopen(dir, KVX_STORE_NOWAIT); /* free again */
    assert_int_equal(su_served_prefix(b, 1, 2), 2);
    kvx_store_close(b);
}

static char swap_lock[400];

static int hk_flock_swap(int fd, int op)
{
    struct stat st;
    if (swap_lock[0] && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) { /* LOCK replaced between its open and flock */
        char tmp[420];
        snprintf(tmp, sizeof tmp, "%s.new", swap_lock);
        int nfd = open(tmp, O_RDWR | O_CREAT, 0600);
        if (nfd >= 0) close(nfd);
        rename(tmp, swap_lock);
        swap_lock[0] = 0;
    }
    return real_os.flock(fd, op);
}

static void test_lock_replaced_relocks(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.flags = KVX_STORE_NOWAIT});
    kvx_store_close(s);
    snprintf(swap_lock, sizeof swap_lock, "%s/LOCK", dir);
    real_os = kvx_os;
    kvx_os.flock = hk_flock_swap;
    int rc = kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT);
    kvx_os_reset();
    assert_int_equal(rc, 0);
    /* the writer holds the file that is DIR/LOCK now */
    char lock[400];
    snprintf(lock, sizeof lock, "%s/LOCK", dir);
    int fd = open(lock, O_RDWR);
    assert_true(fd >= 0);
    int got = flock(fd, LOCK_EX | LOCK_NB);
    close(fd);
    if (got == 0) fail_msg("the writer's lock is on a file no longer named LOCK: DIR/LOCK is free");
    kvx_store_close(s);
}

/* ------------------------------------------------------------------ */
/* L3 */

static void test_fifo_victim_left_alone(void **state)
{
    (void)state;
    char dir[300], p[700];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.flags = KVX_STORE_NOWAIT});
    assert_int_equal(su_put_seq(s, 1, 4), 0);
    kvx_store_close(s);
    char names[8][64];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    s = su_reopen(dir, KVX_STORE_NOWAIT); /* the shard is not opened yet (first use) */
    snprintf(p, sizeof p, "%s/shards/%s", dir, names[0]);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_equal(su_served_prefix(s, 1, 4), 0); /* a miss */
    assert_int_equal(su_put_seq(s, 2, 4), 0);       /* the flush drops the bad shard */
    assert_int_equal(su_served_prefix(s, 2, 4), 4);
    kvx_store_close(s);
    mode_t m = 0;
    assert_true(in_dir(dir, "shards", names[0], &m));
    if (!S_ISFIFO(m)) fail_msg("the FIFO planted at shards/%s was moved", names[0]);
    assert_false(in_dir(dir, "quarantine", names[0], NULL));
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(su_served_prefix(s, 2, 4), 4);
    kvx_store_close(s);
    assert_true(in_dir(dir, "shards", names[0], &m) && S_ISFIFO(m));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_gc_crash_drop_not_adopted, hooks_off),
        cmocka_unit_test_teardown(test_drop_unlink_durable, hooks_off),
        cmocka_unit_test(test_stale_index_twin_quarantined),
        cmocka_unit_test_teardown(test_create_syncs_parent, hooks_off),
        cmocka_unit_test(test_lock_removed_busy),
        cmocka_unit_test_teardown(test_lock_replaced_relocks, hooks_off),
        cmocka_unit_test(test_fifo_victim_left_alone),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
