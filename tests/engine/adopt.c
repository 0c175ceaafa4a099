/*
 * adopt.c - engine/store_plan.c and store_apply.c, adoption: a valid shard the catalog
 * does not name (a stale index put back, a backup restored, a drop a crash
 * undid) is adopted, or moved to quarantine/, never served wrong and never
 * brings back what a delete or a rewrite replaced; dropped files carry a
 * durable drop mark; a foreign kind of shard is not adopted.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/fault.h"
#include "lib/io.h"
#include "lib/store.h"
#include "lib/oplog.h"

/* A cheap fingerprint of every file in shards/ (names, sizes, bytes). */
static uint64_t shards_fingerprint(const char *dir)
{
    char names[64][64];
    size_t n = su_list_files(dir, "shards", names, 64);
    uint64_t fp = n;
    for (size_t i = 0; i < n; i++) {
        char path[700];
        snprintf(path, sizeof path, "%s/shards/%s", dir, names[i]);
        fp = su_mix(fp ^ kvx_fnv1a64(names[i], strlen(names[i])));
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        uint8_t buf[4096];
        size_t got;
        while ((got = fread(buf, 1, sizeof buf, f)) > 0) fp = su_mix(fp ^ kvx_fnv1a64(buf, got));
        fclose(f);
    }
    return fp;
}

static void shard_path(const char *dir, size_t k, char *out, size_t cap)
{
    char names[64][64];
    size_t n = su_list_files(dir, "shards", names, 64);
    assert_true(k < n);
    snprintf(out, cap, "%s/shards/%s", dir, names[k]);
}

static int cp(const char *from, const char *to)
{
    char cmd[2100];
    snprintf(cmd, sizeof cmd, "cp -a '%.1000s' '%.1000s'", from, to);
    return system(cmd);
}

/* test_stale_index_adopts: an older data.mdb put back: shards it does not
 * name are adopted, not deleted; a shard restored from a backup is indexed; a
 * new shard never takes an existing file's name. */
/* PROMISE: RECOVER-4 */
static void test_stale_index_adopts(void **state)
{
    (void)state;
    char dir[300], old_index[400], idx[400], backup[400];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 1, 4);
    kvx_store_close(s);
    snprintf(idx, sizeof idx, "%s/index/data.mdb", dir);
    snprintf(old_index, sizeof old_index, "%s/old.mdb", su_root);
    assert_int_equal(cp(idx, old_index), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    su_put_flush(s, 2, 4);
    su_put_flush(s, 3, 4);
    kvx_store_close(s);
    char names[64][64];
    size_t nshards = su_list_files(dir, "shards", names, 64);
    assert_true(nshards >= 3);
    /* a backup of the newest shard, then the old index put back */
    char newest[700];
    shard_path(dir, nshards - 1, newest, sizeof newest);
    snprintf(backup, sizeof backup, "%s/backup.kvx", su_root);
    assert_int_equal(cp(newest, backup), 0);
    assert_int_equal(cp(old_index, idx), 0);
    uint64_t fp = shards_fingerprint(dir);
    /* a reader with the stale index: misses, deletes nothing */
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(su_served_prefix(s, 1, 4), 4);
    assert_int_equal(su_served_prefix(s, 2, 4), 0);
    kvx_store_close(s);
    assert_true(shards_fingerprint(dir) == fp);
    /* a writer adopts the shards the index does not name */
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    for (uint64_t q = 1; q <= 3; q++) assert_int_equal(su_served_prefix(s, q, 4), 4);
    /* a new shard never takes an existing name: every name still there */
    su_put_flush(s, 4, 4);
    kvx_store_close(s);
    char after[64][64];
    size_t nafter = su_list_files(dir, "shards", after, 64);
    assert_int_equal(nafter, nshards + 1);
    for (size_t i = 0; i < nshards; i++) assert_string_equal(after[i], names[i]);
    /* the backup of a shard the store no longer has (evicted or lost) is
     * put back: a writer indexes it */
    assert_int_equal(unlink(newest), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(su_served_prefix(s, 3, 4), 0);
    kvx_store_close(s);
    assert_int_equal(cp(backup, newest), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(su_served_prefix(s, 3, 4), 4);
    kvx_store_close(s);
}

static int copy_preserving(const char *from, const char *to)
{
    char cmd[2100];
    snprintf(cmd, sizeof cmd, "cp -p '%s' '%s'", from, to);
    return system(cmd);
}

/* Two valid files claiming one shard byte are judged by their records,
 * never by their names. A shard copied in under another name (higher, or
 * lower, than its own) is the same file twice: a writer's recovery keeps
 * one (which one is immaterial: neither holds anything the other lacks),
 * moves the other to quarantine/, and every block is served. (The old
 * rule let the higher generation win: a copy under a higher name, or two
 * names swapped, moved an intact acknowledged shard aside.) */
/* PROMISE: RECOVER-4 */
static void test_regress_stale_index_newer_claimant(void **state)
{
    (void)state;
    const char *copy_names[] = {"00000000000000f0.kvx", "0000000000000000.kvx"};
    for (int run = 0; run < 2; run++) {
        char p[300];
        kvx_store *sp = su_store(p, sizeof p, (su_spec){.capacity = 16 << 20});
        su_put_flush(sp, 1, 3);
        su_put_flush(sp, 2, 3);
        kvx_store_close(sp);
        char pn[8][64];
        assert_int_equal(su_list_names(p, "shards", pn, 8), 2);
        char from[800], to[800];
        snprintf(from, sizeof from, "%s/shards/%s", p, pn[0]);
        snprintf(to, sizeof to, "%s/shards/%s", p, copy_names[run]);
        assert_int_equal(copy_preserving(from, to), 0);
        kvx_store *s;
        assert_int_equal(kvx_store_open(&s, p, NULL, 0), 0);
        assert_int_equal(su_served_prefix(s, 1, 3), 3);
        assert_int_equal(su_served_prefix(s, 2, 3), 3);
        kvx_store_close(s);
        char names[8][64];
        assert_int_equal(su_list_names(p, "shards", names, 8), 2);
        assert_int_equal(su_n_files(p, "quarantine") >= 1, 1);
        assert_int_equal(kvx_store_open(&s, p, NULL, 0), 0);
        assert_int_equal(su_served_prefix(s, 1, 3), 3);
        su_verify_clean(s);
        kvx_store_close(s);
    }
}

static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    assert_non_null(a);
    assert_non_null(b);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) assert_int_equal(fwrite(buf, 1, n, b), n);
    fclose(a);
    assert_int_equal(fclose(b), 0);
}

/* A block store's shard dropped into a keyed store's shards/ (and the
 * other way round): the writer that opens next moves it to quarantine/
 * or leaves it unserved; what the store held is served as before. */
/* PROMISE: KEYED-1 */
static void test_foreign_kind_in_shards(void **state)
{
    (void)state;
    char kd[256], bd[256];
    kvx_store *k = su_store(kd, sizeof kd, (su_spec){.page_bytes = 64}); /* 64 bytes: the block store's page size */
    assert_int_equal(su_key_put(k, NULL, "key", 3, 64, 1, NULL), 0);
    assert_int_equal(kvx_store_flush(k), 0);
    snprintf(bd, sizeof bd, "%.200s/a7-blocks-%d", su_root, su_dir_counter++);
    kvx_store_options o;
    kvx_store_options_init(&o);
    o.geometry = su_geometry();
    o.geometry.model_signature = 0;
    kvx_store *b = NULL;
    assert_int_equal(kvx_store_create(&b, bd, &o), 0);
    assert_int_equal(su_put_seq(b, 1, 4), 0);
    assert_int_equal(kvx_store_flush(b), 0);
    char kn[4][64], bn[4][64];
    assert_int_equal(su_list_names(kd, "shards", kn, 4), 1);
    assert_int_equal(su_list_names(bd, "shards", bn, 4), 1);
    kvx_store_close(k);
    kvx_store_close(b);
    /* swap copies under names past every generation of the target */
    char from[600], to[600];
    snprintf(from, sizeof from, "%s/shards/%s", bd, bn[0]);
    snprintf(to, sizeof to, "%s/shards/%016llx.kvx", kd, 0x7000ull);
    copy_file(from, to);
    snprintf(from, sizeof from, "%s/shards/%s", kd, kn[0]);
    snprintf(to, sizeof to, "%s/shards/%016llx.kvx", bd, 0x7000ull);
    copy_file(from, to);
    for (int ro = 1; ro >= 0; ro--) {
        assert_int_equal(kvx_store_open(&k, kd, NULL, ro ? KVX_STORE_READONLY : 0), 0);
        assert_int_equal(kvx_store_open(&b, bd, NULL, ro ? KVX_STORE_READONLY : 0), 0);
        assert_int_equal(su_key_check(k, "key", 3, 64, 1), 0);
        assert_int_equal(su_served_prefix(b, 1, 4), 4);
        kvx_store_stats sk, sb;
        assert_int_equal(kvx_store_stat(&sk, k), 0);
        assert_int_equal(kvx_store_stat(&sb, b), 0);
        assert_int_equal(sk.blocks, 1);
        assert_int_equal(sb.blocks, 4);
        if (!ro) {
            if (sk.quarantined != 1 || sb.quarantined != 1)
                fail_msg("a shard of the other kind in shards/: quarantined %llu (keyed store), %llu (block store)",
                         (unsigned long long)sk.quarantined, (unsigned long long)sb.quarantined);
            su_verify_clean(k);
            su_verify_clean(b);
            assert_int_equal(kvx_store_reindex(k), 0);
            assert_int_equal(kvx_store_reindex(b), 0);
            assert_int_equal(su_key_check(k, "key", 3, 64, 1), 0);
            assert_int_equal(su_served_prefix(b, 1, 4), 4);
            assert_int_equal(kvx_store_stat(&sk, k), 0);
            assert_int_equal(kvx_store_stat(&sb, b), 0);
            assert_int_equal(sk.blocks, 1);
            assert_int_equal(sb.blocks, 4);
        }
        kvx_store_close(k);
        kvx_store_close(b);
    }
}

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

/* test_gc_crash_drop_not_adopted (H1): a keyed store; gc rewrites a shard
 * half of whose pages were deleted and is killed (kill -9, at the unlink of
 * the dropped shard, after its commit). The next writer's recovery adopted
 * the dropped file with every entry: a key deleted with an acknowledged
 * delete came back, and a key deleted and put again answered its old bytes.
 * Now every drop (eviction, compaction, gc) first gives each victim a durable
 * second name in staging/ (its drop mark); recovery finishes the drop of a
 * file beside its mark that the catalog no longer names: deleted when
 * sound, as the drop would have (it went to quarantine/ before, which
 * then grew by a file per crash), quarantined when damaged. */
/* PROMISE: DUR-14 */
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
    /* the dropped file, sound: deleted, as the committed drop would have */
    assert_false(in_dir(dir, "shards", oname, NULL));
    assert_false(in_dir(dir, "quarantine", oname, NULL));
    kvx_recovery_report r;
    assert_int_equal(kvx_store_recovery(s, &r), 0);
    assert_int_equal(r.deleted_dropped, 1);
    assert_int_equal(r.quarantined, 0);
    char names[8][64];
    assert_int_equal(su_list_names(dir, "staging", names, 8), 0);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT); /* and for good */
    assert_int_equal(check1(s, "J", PB, 1), KVX_ENOTFOUND);
    assert_int_equal(check1(s, "K", 300, 2), 0);
    kvx_store_close(s);
}

/* test_drop_unlink_durable (H1, power cut): the order of a drop, seen through
 * the OS seam: mark, fsync of staging/, (commit), unlink, fsync of shards/,
 * and only then the mark goes. Before, nothing made the unlink durable, so a
 * power cut brought the victim back unmarked. */
/* PROMISE: DUR-14 */
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

static int cp_plain(const char *from, const char *to)
{
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    return system(cmd);
}

/* test_stale_index_twin_quarantined (M1): an older index put back and a
 * second name of an acknowledged shard G in staging/ (what a crash left
 * beside a published shard under the previous release's protocol, whose
 * recovery then moved G aside, or once unlinked it). A name in staging/
 * says nothing now (only a commit's mark does): G is the files' truth,
 * served after the writer's recovery, never unlinked or quarantined, and
 * the stray name goes. */
/* PROMISE: RECOVER-11 */
static void test_stale_index_twin_quarantined(void **state)
{
    (void)state;
    char dir[300], idx[400], old[400], p[700], q[700];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.flags = KVX_STORE_NOWAIT});
    assert_int_equal(su_put_seq(s, 1, 4), 0);
    kvx_store_close(s);
    snprintf(idx, sizeof idx, "%s/index/data.mdb", dir);
    snprintf(old, sizeof old, "%s.old.mdb", dir);
    assert_int_equal(cp_plain(idx, old), 0);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(su_put_seq(s, 2, 4), 0); /* acknowledged: shard G */
    kvx_store_close(s);
    char names[8][64];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 2);
    char g[64];
    memcpy(g, names[1], 64); /* the newer generation */
    snprintf(p, sizeof p, "%s/shards/%s", dir, g);
    snprintf(q, sizeof q, "%s/staging/.%s.tmp.1.0000000000000000", dir, g);
    assert_int_equal(link(p, q), 0);
    struct stat before;
    assert_int_equal(stat(p, &before), 0);
    assert_int_equal(cp_plain(old, idx), 0);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(su_served_prefix(s, 1, 4), 4);
    assert_int_equal(su_served_prefix(s, 2, 4), 4);
    kvx_store_close(s);
    struct stat now;
    assert_int_equal(stat(p, &now), 0);
    assert_true(now.st_ino == before.st_ino && now.st_size == before.st_size);
    assert_int_equal(su_list_names(dir, "staging", names, 8), 0);
    assert_int_equal(su_n_files(dir, "quarantine"), 0);
}

enum { PB64 = 64 };

/* The page of key k at version ver: a function of both. */
static void key_page(uint8_t *p, size_t n, const char *k, uint64_t ver)
{
    su_page(p, n, kvx_key_hash(k, strlen(k)) ^ (ver * 0x9E3779B97F4A7C15ull));
}

static void keyed_put_into(kvx_store *s, kvx_store_batch *b, const char *k, uint64_t ver)
{
    uint8_t p[PB64];
    key_page(p, PB64, k, ver);
    kvx_key key = {k, strlen(k)};
    const void *pages[1] = {p};
    size_t lens[1] = {PB64};
    assert_int_equal(kvx_store_keyed_put(s, b, &key, pages, lens, 1, NULL), 0);
}

static void keyed_put(kvx_store *s, const char *k, uint64_t ver) { keyed_put_into(s, NULL, k, ver); }

/* The version of k's page served (0: another page; -1: not served). */
static int keyed_version(kvx_store *s, const char *k, uint64_t max_ver)
{
    kvx_key key = {k, strlen(k)};
    kvx_view v;
    int st = 0;
    if (kvx_store_keyed_get(&v, &st, s, &key, 1) || st) return -1;
    int ver = 0;
    for (uint64_t i = 1; i <= max_ver && !ver; i++) {
        uint8_t want[PB64];
        key_page(want, PB64, k, i);
        if (v.page_bytes == PB64 && memcmp(v.page, want, PB64) == 0) ver = (int)i;
    }
    kvx_view_release(&v);
    return ver;
}

/* The store's one shard: its path in old (600 bytes), and a second name
 * for it, su_root/name, in aside (600 bytes): a backup of it. */
static void link_only_shard(const char *dir, char *old, char *aside, const char *name)
{
    char names[8][64];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    snprintf(old, 600, "%s/shards/%s", dir, names[0]);
    snprintf(aside, 600, "%s/%s", su_root, name);
    assert_int_equal(link(old, aside), 0);
}

/* H1 (d). A keyed store's shard O holds K = v1; K is deleted and put
 * again as v2 (shard P); gc drops O (no key of it is live). O comes back
 * (a backup restored, or a drop whose unlink a crash undid before it was
 * durable) and the next writer adopts it: K has two copies. The get
 * served the first in coordinate byte order, O's (shard byte 0): the
 * deleted v1. The adopted shard no longer indexes K: the catalog holds a
 * sound copy. */
/* PROMISE: RECOVER-12 */
static void test_keyed_newest_copy_served(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB64});
    keyed_put(s, "K", 1);
    assert_int_equal(kvx_store_flush(s), 0);
    char names[8][64], old[600], aside[600];
    link_only_shard(dir, old, aside, "aside.kvx");
    kvx_key k = {"K", 1};
    size_t n = 0;
    assert_int_equal(kvx_store_keyed_delete(s, &k, 1, &n), 0);
    assert_int_equal(n, 1);
    keyed_put(s, "K", 2);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_gc(s), 0);
    assert_int_equal(keyed_version(s, "K", 2), 2);
    kvx_store_close(s);
    assert_true(access(old, F_OK) != 0); /* gc dropped O */
    assert_int_equal(rename(aside, old), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.shards, 2); /* O adopted beside P */
    int ver = keyed_version(s, "K", 2);
    if (ver == 1) fail_msg("DEFECT rule 1: a key with two copies was served its deleted, older page");
    assert_int_equal(ver, 2);
    kvx_store_close(s);
    /* a reader agrees */
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(keyed_version(s, "K", 2), 2);
    kvx_store_close(s);
    /* the newest copy's page damaged: an error naming it, not v1 */
    assert_int_equal(su_list_names(dir, "shards", names, 8), 2);
    char newer[600];
    snprintf(newer, sizeof newer, "%s/shards/%s", dir, strcmp(names[0], strrchr(old, '/') + 1) ? names[0] : names[1]);
    assert_int_equal(su_flip_page_byte(newer, 0), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    kvx_view v;
    int status = 0;
    assert_int_equal(kvx_store_keyed_get(&v, &status, s, &k, 1), 0);
    assert_int_equal(status, KVX_EPAGECRC); /* the batch call keeps no message of a key's status */
    kvx_store_close(s);
}

static void keyed_del(kvx_store *s, const char *k)
{
    kvx_key key = {k, strlen(k)};
    size_t n = 0;
    assert_int_equal(kvx_store_keyed_delete(s, &key, 1, &n), 0);
    assert_int_equal(n, 1);
}

/* An old shard put back cannot bring back what was replaced after it: O
 * holds K = v1 and J; K is deleted and put again as v2, J deleted, gc
 * drops O. O comes back (a backup restored) and is adopted: K answers v2
 * (its sequence number is newer than O's copy), through gc, a reopen and
 * a reindex. J's tombstone went once O was gone (no older copy was left
 * for it to hide), so the restored O brings J back as any restored backup
 * would (docs/STORE.md, "Reindex": the limit); it answers O's bytes,
 * never anything else. (A gc rewriting O once carried K = v1 into the
 * newest shard.) */
/* PROMISE: RECOVER-12 */
static void test_keyed_rewrite_skips_replaced_copy(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB64});
    keyed_put(s, "K", 1);
    keyed_put(s, "J", 1);
    assert_int_equal(kvx_store_flush(s), 0);
    char old[600], aside[600];
    link_only_shard(dir, old, aside, "aside16.kvx");
    keyed_del(s, "K");
    keyed_put(s, "K", 2);
    assert_int_equal(kvx_store_flush(s), 0);
    keyed_del(s, "J");
    assert_int_equal(kvx_store_gc(s), 0);
    kvx_store_close(s);
    assert_true(access(old, F_OK) != 0); /* gc dropped O */
    assert_int_equal(rename(aside, old), 0);
    for (int step = 0; step < 3; step++) {
        if (step == 0) assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
        if (step == 1) assert_int_equal(kvx_store_gc(s), 0);
        if (step == 2) assert_int_equal(kvx_store_reindex(s), 0);
        int ver = keyed_version(s, "K", 2);
        if (ver == 1) fail_msg("DEFECT rule 1: a replaced copy of a key was served (step %d)", step);
        assert_int_equal(ver, 2);
        int j = keyed_version(s, "J", 1);
        assert_true(j == 1 || j == -1);
    }
    kvx_store_close(s);
}

/* Generations are taken when a batch starts writing, not at its flush, so
 * a later put can hold the lower generation: batch A starts (its shard
 * takes generation g), K = v1 is put and flushed at g + 1, v1's page
 * rots, and A puts K = v2 (a damaged copy is not "held") and flushes. v2
 * is acknowledged: it is served, and gc, a reopen and a reindex keep it
 * (a newest-generation rule would answer v1's damage and let a rewrite
 * drop v2 as superseded). */
/* PROMISE: KEYED-7 */
static void test_keyed_put_after_damage_lower_gen(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB64});
    kvx_store_batch *a = NULL;
    assert_int_equal(kvx_store_batch_create(&a, s), 0);
    keyed_put_into(s, a, "X", 1);
    keyed_put(s, "K", 1);
    assert_int_equal(kvx_store_flush(s), 0);
    char names[8][64];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    char p1[600];
    snprintf(p1, sizeof p1, "%s/shards/%s", dir, names[0]);
    assert_int_equal(su_flip_page_byte(p1, 0), 0);
    keyed_put_into(s, a, "K", 2);
    assert_int_equal(kvx_store_batch_flush(a), 0);
    kvx_store_batch_destroy(a);
    assert_int_equal(su_list_names(dir, "shards", names, 8), 2);
    assert_true(strcmp(names[0], names[1]) != 0);
    assert_int_equal(keyed_version(s, "K", 2), 2);
    /* a reindex from the shards alone: the newest copy (v1, gen g + 1) is
     * damaged, so the newest sound one is indexed too */
    assert_int_equal(kvx_store_reindex(s), 0);
    if (keyed_version(s, "K", 2) != 2) fail_msg("DEFECT rule 2: reindex dropped the acknowledged v2 of K");
    assert_int_equal(kvx_store_gc(s), 0);
    if (keyed_version(s, "K", 2) != 2) fail_msg("DEFECT rule 2: gc lost the acknowledged v2 of K");
    assert_int_equal(keyed_version(s, "X", 1), 1);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(keyed_version(s, "K", 2), 2);
    kvx_store_close(s);
}

/* A closed keyed store (dir, 300 bytes) whose shard O held K = v1: O is
 * linked aside (its path in old, the backup's in aside, su_root/name),
 * then K deleted and put again as version ver (shard P) and gc dropped O. */
static void replaced_with_backup(char *dir, char *old, char *aside, const char *name, uint64_t ver)
{
    kvx_store *s = su_store(dir, 300, (su_spec){.page_bytes = PB64});
    keyed_put(s, "K", 1);
    assert_int_equal(kvx_store_flush(s), 0);
    link_only_shard(dir, old, aside, name);
    keyed_del(s, "K");
    keyed_put(s, "K", ver);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_gc(s), 0);
    kvx_store_close(s);
    assert_true(access(old, F_OK) != 0); /* gc dropped O */
}

/* A damaged newest copy is a miss, never a reason to serve an older one:
 * K's newest copy (shard P, put again after a delete) has a rotten page
 * when an older shard O holding K comes back (a backup). The writer's
 * recovery rebuilds the catalog from the files: K's newest record is P's
 * page, damaged, so K answers KVX_EPAGECRC (verify names it), not O's
 * copy. (The old rule indexed O's copy beside the damaged one, which
 * serves a replaced page whenever the two differ.) */
static void test_keyed_adoptee_beside_damaged_copy(void **state)
{
    (void)state;
    char dir[300], names[8][64], old[600], aside[600];
    replaced_with_backup(dir, old, aside, "aside16b.kvx", 2); /* another page, in P */
    kvx_store *s = NULL;
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    char p[600];
    snprintf(p, sizeof p, "%s/shards/%s", dir, names[0]);
    assert_int_equal(su_flip_page_byte(p, 0), 0);
    assert_int_equal(rename(aside, old), 0);
    for (int step = 0; step < 2; step++) {
        if (step == 0) assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
        else assert_int_equal(kvx_store_reindex(s), 0);
        kvx_key key = {"K", 1};
        kvx_view v;
        int st = 0;
        assert_int_equal(kvx_store_keyed_get(&v, &st, s, &key, 1), 0);
        if (st == 0) {
            int ver = keyed_version(s, "K", 2);
            kvx_view_release(&v);
            fail_msg("DEFECT rule 1: K served version %d though its newest copy is damaged (step %d)", ver, step);
        }
        assert_int_equal(st, KVX_EPAGECRC);
        uint64_t bad = 0;
        assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), KVX_ECORRUPT);
        assert_true(bad >= 1);
    }
    kvx_store_close(s);
}

/* Recovery cannot judge an adoptee when the shard holding the catalog's
 * copy of one of its keys does not open now (EMFILE): the adoptee waits
 * for the next writer's recovery, unregistered, and no new shard takes its
 * byte meanwhile (a flush that did would get the newer generation, and
 * the next recovery would quarantine the adoptee as held by it). */
static char emfile_name[64];

static int emfile_openat(int dfd, const char *name, int fl, mode_t m)
{
    if (emfile_name[0] && strcmp(name, emfile_name) == 0) {
        errno = EMFILE;
        return -1;
    }
    return real_os.openat(dfd, name, fl, m);
}

/* A writer's recovery that must rebuild the catalog (an old shard O is
 * back) but cannot open a file now (EMFILE on P, a passing failure, no
 * verdict): the open fails naming it, and changes nothing (nothing
 * quarantined, the catalog as it was); the next open, the failure gone,
 * rebuilds it: K answers its newest version. (A stale catalog is never
 * served instead: it could name a page deleted since.) */
/* PROMISE: RECOVER-12 */
static void test_keyed_adoptee_waits_when_unjudged(void **state)
{
    (void)state;
    char dir[300], names[8][64], old[600], aside[600];
    replaced_with_backup(dir, old, aside, "aside16c.kvx", 2);
    kvx_store *s = NULL;
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    assert_int_equal(rename(aside, old), 0);
    /* P (the catalog's copy of K) cannot be opened during the recovery */
    real_os = kvx_os;
    kvx_os.openat = emfile_openat;
    snprintf(emfile_name, sizeof emfile_name, "%s", names[0]);
    int rc = kvx_store_open(&s, dir, NULL, 0);
    emfile_name[0] = 0;
    kvx_os = real_os;
    assert_int_equal(rc, -EMFILE);
    assert_non_null(strstr(kvx_last_error(), names[0]));
    assert_int_equal(su_n_files(dir, "quarantine"), 0);
    assert_int_equal(su_list_names(dir, "shards", names, 8), 2);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(keyed_version(s, "K", 2), 2);
    keyed_put(s, "L", 1);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(keyed_version(s, "K", 2), 2);
    assert_int_equal(keyed_version(s, "L", 1), 1);
    kvx_store_close(s);
}

/* The group's setup and teardown: each fixture's, in order. */
static int setup_all(void **state)
{
    if (su_setup(state)) return -1;
    if (io_setup(state)) return -1;
    return 0;
}

static int teardown_all(void **state)
{
    su_teardown(state);
    io_teardown(state);
    return 0;
}

int main(int argc, char **argv)
{
    /* these tests read the files one flush writes as its own shard
     * file (the path keyed stores, whole batches and a second batch
     * still take): the active shard has its own, tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stale_index_adopts),
        cmocka_unit_test(test_regress_stale_index_newer_claimant),
        cmocka_unit_test(test_foreign_kind_in_shards),
        cmocka_unit_test_teardown(test_gc_crash_drop_not_adopted, hooks_off),
        cmocka_unit_test_teardown(test_drop_unlink_durable, hooks_off),
        cmocka_unit_test(test_stale_index_twin_quarantined),
        cmocka_unit_test(test_keyed_newest_copy_served),
        cmocka_unit_test(test_keyed_rewrite_skips_replaced_copy),
        cmocka_unit_test(test_keyed_put_after_damage_lower_gen),
        cmocka_unit_test(test_keyed_adoptee_beside_damaged_copy),
        cmocka_unit_test(test_keyed_adoptee_waits_when_unjudged),
    };
    return cmocka_run_group_tests_name("engine/adopt", tests, setup_all, teardown_all);
}
