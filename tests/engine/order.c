/*
 * tests/engine/order.c - which copy of a keyed page is the newest, and
 * what a delete leaves behind (engine/store_recover.c, engine/store_keyed.c,
 * engine/store_batch.c; DESIGN.md "The files are the whole truth").
 *
 * Each test reproduces one class of wrong answer the code before sequence
 * numbers and tombstones gave, through the public API and ordinary file
 * operations (cp, rename, a flipped byte, index/ removed or put back): a
 * keyed page's newest acknowledged version is decided by the commit that
 * wrote it, never by a file's name, the age of the batch that put it, the
 * index at hand or a damaged newer copy; a delete is a record in the files
 * that outlives every older copy of its key.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lib/store.h"

#define PB 4096u  /* the keyed stores' page_bytes */
#define LEN 1000u /* every page's length (but the forged ones) */
#define MAXV 64   /* versions answer() recognises: 1..MAXV */
#define A_OTHER 1 /* answer(): bytes of no version (kvx codes are negative) */

/* ---- keys, versions and answers ---- */

static void kput(kvx_store *s, kvx_store_batch *b, const char *key, uint64_t ver)
{
    int rc = su_key_put(s, b, key, strlen(key), LEN, ver, NULL);
    if (rc) fail_msg("put %s v%" PRIu64 ": %s (%s)", key, ver, kvx_err_name(rc), kvx_last_error());
}

static void kflush(kvx_store *s, kvx_store_batch *b)
{
    int rc = b ? kvx_store_batch_flush(b) : kvx_store_flush(s);
    if (rc) fail_msg("flush: %s (%s)", kvx_err_name(rc), kvx_last_error());
}

static size_t kdel(kvx_store *s, const char *key)
{
    kvx_key k = {key, strlen(key)};
    size_t n = 99;
    int rc = kvx_store_keyed_delete(s, &k, 1, &n);
    if (rc) fail_msg("delete %s: %s (%s)", key, kvx_err_name(rc), kvx_last_error());
    return n;
}

/* What the store answers for key: the version 1..MAXV whose bytes it
 * served (LEN bytes, su_key_fill), 0 for KVX_ENOTFOUND, A_OTHER for bytes
 * of no version, or the status (a negative kvx code: KVX_EPAGECRC...). */
static int answer(kvx_store *s, const char *key)
{
    kvx_key k = {key, strlen(key)};
    kvx_view v;
    int st = 0;
    int rc = kvx_store_keyed_get(&v, &st, s, &k, 1);
    if (rc) fail_msg("get %s: %s (%s)", key, kvx_err_name(rc), kvx_last_error());
    if (st == KVX_ENOTFOUND) return 0;
    if (st) return st;
    int ver = A_OTHER;
    static uint8_t want[PB];
    for (int x = 1; x <= MAXV && ver == A_OTHER && v.page_bytes == LEN; x++) {
        su_key_fill(want, LEN, key, strlen(key), (uint64_t)x);
        if (memcmp(v.page, want, LEN) == 0) ver = x;
    }
    kvx_view_release(&v);
    return ver;
}

static const char *ans_name(int a, char *buf, size_t cap)
{
    if (a == 0) snprintf(buf, cap, "not found");
    else if (a == A_OTHER) snprintf(buf, cap, "bytes of no version");
    else if (a > 0) snprintf(buf, cap, "v%d", a);
    else snprintf(buf, cap, "%s", kvx_err_name(a));
    return buf;
}

/* key answers version want (0: deleted, not found). */
#define EXPECT(s, key, want, when) expect_(s, key, want, when, __LINE__)
static void expect_(kvx_store *s, const char *key, int want, const char *when, int line)
{
    int a = answer(s, key);
    if (a == want) return;
    char x[64], y[64];
    fail_msg("line %d, %s: %s answered %s, want %s", line, when, key, ans_name(a, x, sizeof x),
             ans_name(want, y, sizeof y));
}

/* key's newest copy is damaged: a miss (KVX_EPAGECRC or not found). */
#define EXPECT_MISS(s, key, when) expect_miss_(s, key, when, __LINE__)
static void expect_miss_(kvx_store *s, const char *key, const char *when, int line)
{
    int a = answer(s, key);
    if (a == 0 || a == KVX_EPAGECRC) return;
    char x[64];
    fail_msg("line %d, %s: %s answered %s, want a miss (KVX_EPAGECRC or not found)", line, when, key,
             ans_name(a, x, sizeof x));
}

/* ---- files ---- */

static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wbx");
    if (!a || !b) fail_msg("copy %s to %s: %s", from, to, strerror(errno));
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) assert_int_equal(fwrite(buf, 1, n, b), n);
    fclose(a);
    assert_int_equal(fclose(b), 0);
}

static void rm_index(const char *dir)
{
    char p[600];
    snprintf(p, sizeof p, "%s/index", dir);
    assert_int_equal(su_rm_rf(p), 0);
}

/* index/data.mdb copied to (saved) / from (restore: index/ holds only it) name. */
static void save_index(const char *dir, const char *name)
{
    char from[600], to[600];
    snprintf(from, sizeof from, "%s/index/data.mdb", dir);
    su_path(to, sizeof to, name);
    unlink(to);
    copy_file(from, to);
}

static void restore_index(const char *dir, const char *name)
{
    char from[600], to[600];
    rm_index(dir);
    snprintf(to, sizeof to, "%s/index", dir);
    assert_int_equal(mkdir(to, 0700), 0);
    snprintf(to, sizeof to, "%s/index/data.mdb", dir);
    copy_file(su_path(from, sizeof from, name), to);
}

/* The closed store's index/ rebuilt by kvx_store_reindex_dir, then open. */
static kvx_store *reindex_dir_reopen(kvx_store *s, const char *dir)
{
    kvx_store_close(s);
    int rc = kvx_store_reindex_dir(dir, 0);
    if (rc) fail_msg("reindex_dir: %s (%s)", kvx_err_name(rc), kvx_last_error());
    return su_reopen(dir, 0);
}

/* The closed store's index/ deleted, then a writer's open. */
static kvx_store *index_lost_reopen(kvx_store *s, const char *dir)
{
    kvx_store_close(s);
    rm_index(dir);
    return su_reopen(dir, 0);
}

static void reindex(kvx_store *s)
{
    int rc = kvx_store_reindex(s);
    if (rc) fail_msg("reindex: %s (%s)", kvx_err_name(rc), kvx_last_error());
}

static void gc(kvx_store *s)
{
    int rc = kvx_store_gc(s);
    if (rc) fail_msg("gc: %s (%s)", kvx_err_name(rc), kvx_last_error());
}

/* The shard files of dir/shards ("<16 hex>.kvx"), sorted (by generation). */
static size_t shard_files(const char *dir, char (*out)[64], size_t max)
{
    static char names[1024][64];
    size_t n = su_list_names(dir, "shards", names, 1024), k = 0;
    for (size_t i = 0; i < n && k < max; i++)
        if (strlen(names[i]) == 20 && !strcmp(names[i] + 16, ".kvx")) memcpy(out[k++], names[i], 64);
    return k;
}

/* The shard file and entry holding key's page of version ver (LEN bytes),
 * found by its key and CRC-32 in the files themselves: 1 found, 0 not. */
static int find_page(const char *dir, const char *key, uint64_t ver, char *path, size_t cap, uint32_t *entry)
{
    static char names[256][64];
    static uint8_t want[PB];
    su_key_fill(want, LEN, key, strlen(key), ver);
    uint32_t crc = kvx_crc32(0, want, LEN);
    size_t n = shard_files(dir, names, 256);
    for (size_t i = 0; i < n; i++) {
        snprintf(path, cap, "%s/shards/%.63s", dir, names[i]);
        kvx_shard *sh;
        if (kvx_shard_open(&sh, path, 0)) continue;
        uint32_t nb = kvx_shard_get_info(sh)->num_blocks;
        int found = 0;
        for (uint32_t e = 0; e < nb && !found; e++) {
            kvx_entry x;
            if (kvx_shard_entry(&x, sh, e) || !x.key || x.key_len != strlen(key) || memcmp(x.key, key, x.key_len))
                continue;
            if (x.bytes == LEN && x.crc32 == crc) {
                *entry = e;
                found = 1;
            }
        }
        kvx_shard_close(sh);
        if (found) return 1;
    }
    return 0;
}

/* Flips a byte of key's page of version ver in its shard file. */
static void rot(const char *dir, const char *key, uint64_t ver)
{
    char path[600];
    uint32_t e = 0;
    if (!find_page(dir, key, ver, path, sizeof path, &e)) fail_msg("no file holds %s v%" PRIu64, key, ver);
    assert_int_equal(su_flip_page_byte(path, e), 0);
}

/* The signatures (FNV-1a of the bytes) of dir/sub's files, ".why" notes
 * left out. */
static size_t sigs_of(const char *dir, const char *sub, uint64_t *out, size_t max)
{
    static char names[1024][64];
    size_t n = su_list_names(dir, sub, names, 1024), k = 0;
    for (size_t i = 0; i < n && k < max; i++) {
        if (strstr(names[i], ".why")) continue;
        char p[700];
        snprintf(p, sizeof p, "%s/%s/%s", dir, sub, names[i]);
        out[k++] = su_file_sig(p, NULL);
    }
    return k;
}

static int has_sig(const uint64_t *s, size_t n, uint64_t x)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] == x) return 1;
    return 0;
}

/* ---- 1. a batch older than the delete ---- */

/* A key deleted and then put again from a batch made before the delete
 * answers the put's bytes: its flush is the later commit, whatever the
 * batch's age. Before: the page the batch wrote lay in a shard of a lower
 * generation than the delete's record (the batch had taken its name
 * first), so a reindex, a reindex_dir, gc or a lost index/ replayed the
 * delete last and the key answered "not found"; one variant put the key
 * into the old batch before it was ever flushed elsewhere. */
/* PROMISE: RECOVER-20 */
static void test_reput_from_batch_older_than_delete(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    kvx_store_batch *b;
    assert_int_equal(kvx_store_batch_create(&b, s), 0);
    kput(s, b, "early", 1); /* b has begun a shard before anything below */
    kput(s, b, "K3", 2);    /* pending in b before K3 is flushed elsewhere */
    kput(s, NULL, "K", 1);
    kput(s, NULL, "K3", 1);
    kflush(s, NULL);
    EXPECT(s, "K", 1, "v1 flushed");
    EXPECT(s, "K3", 1, "v1 flushed");
    assert_int_equal(kdel(s, "K"), 1);
    assert_int_equal(kdel(s, "K3"), 1);
    EXPECT(s, "K", 0, "deleted");
    EXPECT(s, "K3", 0, "deleted (v2 still pending in b)");
    kput(s, b, "K", 2);
    kflush(s, b);
    kvx_store_batch_destroy(b);
    const char *when[] = {"b flushed", "reindex", "reindex_dir", "gc", "index/ deleted, reopen", "reopen"};
    for (int step = 0; step < 6; step++) {
        if (step == 1) reindex(s);
        if (step == 2) s = reindex_dir_reopen(s, dir);
        if (step == 3) gc(s);
        if (step == 4) s = index_lost_reopen(s, dir);
        if (step == 5) {
            kvx_store_close(s);
            s = su_reopen(dir, 0);
        }
        EXPECT(s, "K", 2, when[step]);
        EXPECT(s, "K3", 2, when[step]);
        EXPECT(s, "early", 1, when[step]);
    }
    su_verify_clean(s);
    kvx_store_close(s);
}

/* ---- 2. an old index/ put back ---- */

/* The read-only open of a store whose index/ is the old copy: refused. */
static void expect_reader_stale(const char *dir)
{
    kvx_store *r = NULL;
    int rc = kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY);
    if (rc == 0) kvx_store_close(r);
    if (rc != KVX_ESTALE)
        fail_msg("read-only open with an old index/: %s (%s), want KVX_ESTALE", kvx_err_name(rc), kvx_last_error());
    if (!strstr(kvx_last_error(), "kvx store reindex"))
        fail_msg("KVX_ESTALE does not name 'kvx store reindex': %s", kvx_last_error());
}

/* An index/ copied before a delete and put back: a writer's open rebuilds
 * from the files (the delete's record is a file the old index does not
 * name), so the deleted key stays deleted; a reader, which never repairs,
 * refuses the old index with KVX_ESTALE naming `kvx store reindex` until
 * a writer has opened once, then works. Before: the writer used the old
 * catalog as it was (every file it named was still there) and the deleted
 * key answered its old bytes, to the writer and to every reader. */
/* PROMISE: RECOVER-21 */
static void test_old_index_after_delete(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    kput(s, NULL, "K", 1);
    kput(s, NULL, "O", 1);
    kflush(s, NULL);
    save_index(dir, "old-index-del");
    assert_int_equal(kdel(s, "K"), 1);
    kvx_store_close(s);
    restore_index(dir, "old-index-del");
    expect_reader_stale(dir);
    s = su_reopen(dir, 0);
    EXPECT(s, "K", 0, "writer's open with the old index/");
    EXPECT(s, "O", 1, "writer's open with the old index/");
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_READONLY);
    EXPECT(s, "K", 0, "reader after the writer's open");
    EXPECT(s, "O", 1, "reader after the writer's open");
    kvx_store_close(s);
    /* the old copy again, now put back after the writer rebuilt */
    restore_index(dir, "old-index-del");
    expect_reader_stale(dir);
    s = su_reopen(dir, 0);
    EXPECT(s, "K", 0, "second writer's open with the old index/");
    kvx_store_close(s);
}

/* The same with the key put again after the delete: the writer's open
 * answers the new bytes (never the old, never "not found"). */
/* PROMISE: RECOVER-21 */
static void test_old_index_after_reput(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    kput(s, NULL, "K", 1);
    kput(s, NULL, "O", 1);
    kflush(s, NULL);
    save_index(dir, "old-index-reput");
    assert_int_equal(kdel(s, "K"), 1);
    kput(s, NULL, "K", 2);
    kflush(s, NULL);
    EXPECT(s, "K", 2, "re-put");
    kvx_store_close(s);
    restore_index(dir, "old-index-reput");
    expect_reader_stale(dir);
    s = su_reopen(dir, 0);
    EXPECT(s, "K", 2, "writer's open with the old index/");
    EXPECT(s, "O", 1, "writer's open with the old index/");
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_READONLY);
    EXPECT(s, "K", 2, "reader after the writer's open");
    EXPECT(s, "O", 1, "reader after the writer's open");
    kvx_store_close(s);
}

/* ---- 3. the newest copy rots ---- */

static void count_bad(void *ctx, const char *what, int code)
{
    (void)what;
    if (code) ++*(int *)ctx;
}

/* A key deleted and put again whose new page rots is a miss (KVX_EPAGECRC
 * or not found), never the deleted bytes: the delete's record outranks
 * the old copy whatever happens to the newer one. Before: a damaged newest
 * copy made a lookup (and a reindex) fall back to the older sound copy,
 * the very page the owner had deleted. */
/* PROMISE: RECOVER-22 */
static void test_newest_copy_rots_after_reput(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    kput(s, NULL, "K", 1);
    kput(s, NULL, "O", 1);
    kflush(s, NULL);
    assert_int_equal(kdel(s, "K"), 1);
    kput(s, NULL, "K", 2);
    kput(s, NULL, "P", 1); /* beside K's new page: gc has a good block to carry */
    kflush(s, NULL);
    kvx_store_close(s);
    rot(dir, "K", 2);
    s = su_reopen(dir, 0);
    EXPECT_MISS(s, "K", "reopen");
    uint64_t bad = 0;
    int reported = 0;
    assert_int_equal(kvx_store_verify(s, &bad, count_bad, &reported), KVX_ECORRUPT);
    print_message("verify: %" PRIu64 " problems, %d reported\n", bad, reported);
    assert_true(bad >= 1);
    assert_true(reported >= 1);
    const char *when[] = {"reindex", "reindex_dir", "reopen", "index/ deleted, reopen", "gc",
                          "gc, then index/ deleted"};
    for (int step = 0; step < 6; step++) {
        if (step == 0) reindex(s);
        if (step == 1) s = reindex_dir_reopen(s, dir);
        if (step == 2) {
            kvx_store_close(s);
            s = su_reopen(dir, 0);
        }
        if (step == 3) s = index_lost_reopen(s, dir);
        if (step == 4) gc(s);
        if (step == 5) s = index_lost_reopen(s, dir);
        EXPECT_MISS(s, "K", when[step]);
        EXPECT(s, "O", 1, when[step]);
        EXPECT(s, "P", 1, when[step]);
        if (step < 4) { /* the damage is still there to report (gc sets it aside) */
            bad = 0;
            assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), KVX_ECORRUPT);
            assert_true(bad >= 1);
        }
    }
    kvx_store_close(s);
}

/* ---- 4. a plain delete ---- */

/* A delete is a record in the files: with the index rebuilt from them
 * (reindex, reindex_dir, index/ deleted) a deleted key stays deleted.
 * Before: a delete only removed the catalog's records, and the next
 * reindex found the page in its shard and served it again. */
/* PROMISE: KEYED-10 */
static void test_delete_survives_rebuilt_index(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    const char *keys[] = {"d0", "d1", "d2", "d3", "live0", "live1"};
    for (int i = 0; i < 6; i++) kput(s, NULL, keys[i], 1);
    kflush(s, NULL);
    assert_int_equal(kdel(s, "d0"), 1);
    kvx_key two[3] = {{"d1", 2}, {"d2", 2}, {"never", 5}};
    size_t n = 0;
    assert_int_equal(kvx_store_keyed_delete(s, two, 3, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(kdel(s, "d3"), 1);
    assert_int_equal(kdel(s, "d3"), 0); /* twice: nothing more */
    const char *when[] = {"deleted", "reindex", "reindex_dir", "index/ deleted, reopen", "reopen", "reader"};
    for (int step = 0; step < 6; step++) {
        if (step == 1) reindex(s);
        if (step == 2) s = reindex_dir_reopen(s, dir);
        if (step == 3) s = index_lost_reopen(s, dir);
        if (step == 4 || step == 5) {
            kvx_store_close(s);
            s = su_reopen(dir, step == 5 ? KVX_STORE_READONLY : 0);
        }
        for (int i = 0; i < 4; i++) EXPECT(s, keys[i], 0, when[step]);
        EXPECT(s, "live0", 1, when[step]);
        EXPECT(s, "live1", 1, when[step]);
    }
    kvx_store_close(s);
}

/* ---- 5. a replacement of equal length and CRC-32 ---- */

static int get_raw(kvx_store *s, const char *key, uint8_t *out, size_t n)
{
    kvx_key k = {key, strlen(key)};
    kvx_view v;
    int st = -1;
    assert_int_equal(kvx_store_keyed_get(&v, &st, s, &k, 1), 0);
    if (st == 0) {
        if (v.page_bytes != n) st = A_OTHER;
        else memcpy(out, v.page, n);
    }
    kvx_views_release(&v, 1);
    return st;
}

/* A key deleted and put again with a page of equal length and equal
 * CRC-32 (four bytes forged) answers the new page after every rebuild of
 * the index (reindex, reindex_dir, index/ deleted) and gc; also when the
 * new page comes from a batch made before the delete. Before: the two
 * copies passed for one page (same length, same CRC), the old one was
 * kept as a "second copy" and a lookup served it. */
/* PROMISE: KEYED-9 */
static void test_forged_crc_replacement(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    enum { N = 3000 };
    static uint8_t old_a[N], new_a[N], old_b[N], new_b[N], got[N];
    su_page(old_a, N, 11);
    su_page(new_a, N, 12);
    su_page(old_b, N, 13);
    su_page(new_b, N, 14);
    su_forge_crc(new_a, N, kvx_crc32(0, old_a, N));
    su_forge_crc(new_b, N, kvx_crc32(0, old_b, N));
    assert_true(memcmp(old_a, new_a, N) != 0);
    assert_true(memcmp(old_b, new_b, N) != 0);
    kvx_key ka = {"forged-a", 8}, kb = {"forged-b", 8};
    size_t len = N;
    kvx_store_batch *b;
    assert_int_equal(kvx_store_batch_create(&b, s), 0);
    kput(s, b, "early", 1); /* b begins before the delete */
    const void *pp[1] = {old_a};
    assert_int_equal(kvx_store_keyed_put(s, NULL, &ka, pp, &len, 1, NULL), 0);
    pp[0] = old_b;
    assert_int_equal(kvx_store_keyed_put(s, NULL, &kb, pp, &len, 1, NULL), 0);
    kflush(s, NULL);
    size_t n = 0;
    kvx_key both[2] = {ka, kb};
    assert_int_equal(kvx_store_keyed_delete(s, both, 2, &n), 0);
    assert_int_equal(n, 2);
    pp[0] = new_a;
    assert_int_equal(kvx_store_keyed_put(s, NULL, &ka, pp, &len, 1, NULL), 0);
    kflush(s, NULL);
    pp[0] = new_b;
    assert_int_equal(kvx_store_keyed_put(s, b, &kb, pp, &len, 1, NULL), 0);
    kflush(s, b);
    kvx_store_batch_destroy(b);
    const char *when[] = {"re-put", "reindex", "reindex again", "reindex_dir", "index/ deleted, reopen", "gc"};
    for (int step = 0; step < 6; step++) {
        if (step == 1 || step == 2) reindex(s);
        if (step == 3) s = reindex_dir_reopen(s, dir);
        if (step == 4) s = index_lost_reopen(s, dir);
        if (step == 5) gc(s);
        int st = get_raw(s, "forged-a", got, N);
        if (st) fail_msg("%s: forged-a answered %s", when[step], kvx_err_name(st));
        if (memcmp(got, new_a, N)) fail_msg("%s: forged-a answered %s", when[step],
                                            memcmp(got, old_a, N) ? "bytes of neither page" : "its deleted page");
        st = get_raw(s, "forged-b", got, N);
        if (st) fail_msg("%s: forged-b answered %s", when[step], kvx_err_name(st));
        if (memcmp(got, new_b, N)) fail_msg("%s: forged-b answered %s", when[step],
                                            memcmp(got, old_b, N) ? "bytes of neither page" : "its deleted page");
    }
    kvx_store_close(s);
}

/* ---- 6. two batches, one key ---- */

/* Two batches hold one key with other bytes: the later flush wins,
 * whichever batch put first or was made first, now and after reindex;
 * and when the winner's page rots, the key is a miss, never the loser's
 * bytes. Before: both copies stayed indexed, a lookup served the first
 * sound one in catalog order (the older shard, often) and a reindex judged
 * by generation, i.e. by which batch began its shard first. */
/* PROMISE: RECOVER-23 */
static void test_later_flush_wins(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    kvx_store_batch *b1, *b2;
    assert_int_equal(kvx_store_batch_create(&b1, s), 0);
    assert_int_equal(kvx_store_batch_create(&b2, s), 0);
    /* A: b1 puts first and flushes first: b2's flush wins (v2) */
    kput(s, b1, "A", 1);
    kput(s, b2, "A", 2);
    kflush(s, b1);
    EXPECT(s, "A", 1, "b1 flushed");
    kflush(s, b2);
    EXPECT(s, "A", 2, "b2 flushed after b1");
    /* C: b1 puts first but flushes last: b1's flush wins (v3) */
    kput(s, b1, "C", 3);
    kput(s, b2, "C", 4);
    kflush(s, b2);
    EXPECT(s, "C", 4, "b2 flushed");
    kflush(s, b1);
    EXPECT(s, "C", 3, "b1 flushed after b2");
    kvx_store_batch_destroy(b1);
    kvx_store_batch_destroy(b2);
    reindex(s);
    EXPECT(s, "A", 2, "reindex");
    EXPECT(s, "C", 3, "reindex");
    s = index_lost_reopen(s, dir);
    EXPECT(s, "A", 2, "index/ deleted, reopen");
    EXPECT(s, "C", 3, "index/ deleted, reopen");
    kvx_store_close(s);
    /* the winners rot: a miss, never the earlier flush's bytes */
    rot(dir, "A", 2);
    rot(dir, "C", 3);
    s = su_reopen(dir, 0);
    EXPECT_MISS(s, "A", "winner rotted, reopen");
    EXPECT_MISS(s, "C", "winner rotted, reopen");
    reindex(s);
    EXPECT_MISS(s, "A", "winner rotted, reindex");
    EXPECT_MISS(s, "C", "winner rotted, reindex");
    s = index_lost_reopen(s, dir);
    EXPECT_MISS(s, "A", "winner rotted, index/ deleted");
    EXPECT_MISS(s, "C", "winner rotted, index/ deleted");
    gc(s);
    EXPECT_MISS(s, "A", "winner rotted, gc");
    EXPECT_MISS(s, "C", "winner rotted, gc");
    s = index_lost_reopen(s, dir);
    EXPECT_MISS(s, "A", "winner rotted, gc, index/ deleted");
    EXPECT_MISS(s, "C", "winner rotted, gc, index/ deleted");
    kvx_store_close(s);
}

/* ---- 7. names copied and swapped ---- */

enum { NK7 = 8 };
static const int want7[NK7] = {0, 0, 2, 2, 3, 1, 1, 1}; /* k0..k7's newest versions */

/* A history whose every key's answer depends on order: k0..k7 v1 in the
 * first flush, k0 and k1 deleted, k2 and k3 v2 from a batch made before
 * that flush (flushed after it), k4 deleted and put again (v3). */
static kvx_store *history7(char *dir, size_t cap)
{
    kvx_store *s = su_store(dir, cap, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    kvx_store_batch *b;
    assert_int_equal(kvx_store_batch_create(&b, s), 0);
    kput(s, b, "k2", 2);
    kput(s, b, "k3", 2);
    char k[8];
    for (int i = 0; i < NK7; i++) {
        snprintf(k, sizeof k, "k%d", i);
        kput(s, NULL, k, 1);
    }
    kflush(s, NULL);
    kvx_key del[2] = {{"k0", 2}, {"k1", 2}};
    assert_int_equal(kvx_store_keyed_delete(s, del, 2, NULL), 0);
    kflush(s, b);
    kvx_store_batch_destroy(b);
    assert_int_equal(kdel(s, "k4"), 1);
    kput(s, NULL, "k4", 3);
    kflush(s, NULL);
    return s;
}

static void check7(kvx_store *s, const char *when)
{
    char k[8];
    for (int i = 0; i < NK7; i++) {
        snprintf(k, sizeof k, "k%d", i);
        EXPECT(s, k, want7[i], when);
    }
}

/* Every file whose bytes were in shards/ before (sigs) still is: nothing
 * that holds a live page went to quarantine/; what did is a copy of one. */
static void check_kept(const char *dir, const uint64_t *sigs, size_t n, const char *when)
{
    static uint64_t now[1024], q[1024];
    size_t nn = sigs_of(dir, "shards", now, 1024), nq = sigs_of(dir, "quarantine", q, 1024);
    for (size_t i = 0; i < n; i++)
        if (!has_sig(now, nn, sigs[i])) fail_msg("%s: a file of shards/ (signature %016" PRIx64 ") is gone", when, sigs[i]);
    for (size_t i = 0; i < nq; i++)
        if (!has_sig(sigs, n, q[i])) fail_msg("%s: quarantine/ holds a file that was not in shards/", when);
    print_message("%s: %zu files in shards/, %zu in quarantine/\n", when, nn, nq);
}

/* An intact shard copied in under a higher name (the oldest file: every
 * key's first version) or a lower one (the newest file), and two names
 * swapped (the oldest and the newest, then the oldest and the delete's
 * record): a writer's open quarantines nothing that holds a live page
 * and every key answers its newest version, also after reindex and with
 * index/ deleted. Before: a name (its generation) said which copy was
 * newer, so the oldest file under the highest name brought the deleted
 * keys and the replaced versions back, and the second of two files
 * claiming one shard byte went to quarantine by its name. */
/* PROMISE: RECOVER-24 */
static void test_copied_and_swapped_names(void **state)
{
    (void)state;
    const char *mode_name[] = {"copy of the oldest under a higher name", "copy of the newest under a lower name",
                               "oldest and newest swapped", "oldest and the delete's record swapped"};
    for (int mode = 0; mode < 4; mode++) {
        char dir[300], names[64][64], a[700], b[700], t[700];
        kvx_store *s = history7(dir, sizeof dir);
        check7(s, "history");
        kvx_store_close(s);
        size_t n = shard_files(dir, names, 64);
        assert_true(n >= 4);
        static uint64_t sigs[1024];
        size_t ns = sigs_of(dir, "shards", sigs, 1024);
        uint64_t lo = strtoull(names[0], NULL, 16), hi = strtoull(names[n - 1], NULL, 16);
        print_message("%s: %zu shard files, %s .. %s\n", mode_name[mode], n, names[0], names[n - 1]);
        if (mode == 0) {
            snprintf(a, sizeof a, "%s/shards/%.63s", dir, names[0]);
            snprintf(b, sizeof b, "%s/shards/%016" PRIx64 ".kvx", dir, hi + 7);
            copy_file(a, b);
        } else if (mode == 1) {
            /* a free name below the newest file's (below every one when there is room) */
            uint64_t g = lo >= 2 ? lo - 1 : 0;
            for (uint64_t x = hi - 1; lo < 2 && x > 0; x--) {
                char nm[32];
                snprintf(nm, sizeof nm, "%016" PRIx64 ".kvx", x);
                int used = 0;
                for (size_t i = 0; i < n; i++) used |= !strcmp(names[i], nm);
                if (!used) {
                    g = x;
                    break;
                }
            }
            snprintf(a, sizeof a, "%s/shards/%.63s", dir, names[n - 1]);
            snprintf(b, sizeof b, "%s/shards/%016" PRIx64 ".kvx", dir, g);
            print_message("  the copy: %016" PRIx64 ".kvx\n", g);
            copy_file(a, b);
        } else {
            /* the delete's record: the file of one entry that is a tombstone for k0 */
            size_t other = n - 1;
            if (mode == 3) {
                other = 0;
                for (size_t i = 1; i < n && !other; i++) {
                    snprintf(a, sizeof a, "%s/shards/%.63s", dir, names[i]);
                    kvx_shard *sh;
                    if (kvx_shard_open(&sh, a, 0)) continue;
                    uint64_t seq;
                    int tomb = 0;
                    if (kvx_shard_get_info(sh)->num_blocks && kvx_shard_entry_commit(sh, 0, &seq, &tomb) == 0 && tomb)
                        other = i;
                    kvx_shard_close(sh);
                }
                assert_true(other > 0);
            }
            snprintf(a, sizeof a, "%s/shards/%.63s", dir, names[0]);
            snprintf(b, sizeof b, "%s/shards/%.63s", dir, names[other]);
            snprintf(t, sizeof t, "%s/swap.tmp", dir);
            assert_int_equal(rename(a, t), 0);
            assert_int_equal(rename(b, a), 0);
            assert_int_equal(rename(t, b), 0);
        }
        char when[200];
        snprintf(when, sizeof when, "%s, writer's open", mode_name[mode]);
        s = su_reopen(dir, 0);
        check7(s, when);
        check_kept(dir, sigs, ns, when);
        snprintf(when, sizeof when, "%s, reindex", mode_name[mode]);
        reindex(s);
        check7(s, when);
        check_kept(dir, sigs, ns, when);
        snprintf(when, sizeof when, "%s, index/ deleted", mode_name[mode]);
        s = index_lost_reopen(s, dir);
        check7(s, when);
        check_kept(dir, sigs, ns, when);
        kvx_store_close(s);
        s = su_reopen(dir, KVX_STORE_READONLY);
        snprintf(when, sizeof when, "%s, reader", mode_name[mode]);
        check7(s, when);
        kvx_store_close(s);
    }
}

/* ---- 8. tombstones and maintenance ---- */

enum { ND = 120 };

/* How many of the deleted keys (d000, d002, ...) still have their page in
 * a file of shards/, and how many tombstone entries the files hold. */
static void on_disk(const char *dir, int *pages, int *tombs)
{
    static char names[1024][64];
    size_t n = shard_files(dir, names, 1024);
    *pages = *tombs = 0;
    for (size_t i = 0; i < n; i++) {
        char path[700];
        snprintf(path, sizeof path, "%.600s/shards/%.63s", dir, names[i]);
        kvx_shard *sh;
        if (kvx_shard_open(&sh, path, 0)) continue;
        uint32_t nb = kvx_shard_get_info(sh)->num_blocks;
        for (uint32_t e = 0; e < nb; e++) {
            kvx_entry x;
            uint64_t seq = 0;
            int tomb = 0;
            if (kvx_shard_entry(&x, sh, e) || kvx_shard_entry_commit(sh, e, &seq, &tomb)) continue;
            if (tomb) ++*tombs;
            else if (x.key && x.key_len == 4 && x.key[0] == 'd' && (x.key[3] - '0') % 2 == 0) ++*pages;
        }
        kvx_shard_close(sh);
    }
}

/* Tombstones outlive every older copy through compaction, gc and
 * eviction: in a small store (flushes evict), keys deleted while their
 * pages still sit in live shards (kept hot by reads of their neighbours)
 * stay deleted while many other keys are put, flushed, evicted and
 * gc'd, and when index/ is then deleted. Before: compaction and gc
 * dropped a tombstone (or never wrote one) while a shard still held the
 * older page, so the next rebuild of the index served it again. */
/* PROMISE: KEYED-11 */
static void test_tombstones_outlive_older_copies(void **state)
{
    (void)state;
    char dir[300], k[32];
    kvx_store *s = su_store(dir, sizeof dir,
                            (su_spec){.page_bytes = PB, .capacity = 2ull << 20, .shard_bytes = 64 << 10});
    for (int i = 0; i < ND; i++) {
        snprintf(k, sizeof k, "d%03d", i);
        kput(s, NULL, k, 1);
        if (i % 8 == 7) kflush(s, NULL);
    }
    kflush(s, NULL);
    /* delete the even ones: each shard keeps its odd neighbours live */
    for (int i = 0; i < ND; i += 2) {
        snprintf(k, sizeof k, "d%03d", i);
        assert_int_equal(kdel(s, k), 1);
    }
    kvx_store_stats st = su_stat(s);
    int pages0, tombs0;
    on_disk(dir, &pages0, &tombs0);
    print_message("after the deletes: %" PRIu64 " shards, %" PRIu64 " bytes, %" PRIu64 " blocks; %d deleted pages in "
                  "shards/, %d tombstones\n",
                  st.shards, st.bytes, st.blocks, pages0, tombs0);
    int rounds = 0;
    uint64_t evictions = 0;
    for (int f = 0; f < 1200; f++) {
        snprintf(k, sizeof k, "filler-%04d", f);
        kput(s, NULL, k, 1);
        if (f % 8 == 7) {
            kflush(s, NULL);
            /* reads keep the deleted keys' shards the hottest */
            for (int i = 1; i < ND; i += 2) {
                snprintf(k, sizeof k, "d%03d", i);
                int a = answer(s, k);
                if (a != 1 && a != 0) fail_msg("filler %d: d%03d answered %d", f, i, a);
            }
        }
        if (f % 100 == 99) {
            gc(s);
            rounds++;
            for (int i = 0; i < ND; i += 2) {
                snprintf(k, sizeof k, "d%03d", i);
                EXPECT(s, k, 0, "maintenance");
            }
        }
        if (f % 400 == 399) {
            int pages, tombs;
            on_disk(dir, &pages, &tombs);
            print_message("filler %d: %d deleted pages still in shards/, %d tombstones\n", f + 1, pages, tombs);
            evictions += su_stat(s).evictions; /* a handle's count */
            s = index_lost_reopen(s, dir);
            for (int i = 0; i < ND; i += 2) {
                snprintf(k, sizeof k, "d%03d", i);
                EXPECT(s, k, 0, "maintenance, index/ deleted");
            }
        }
    }
    kflush(s, NULL);
    gc(s);
    st = su_stat(s);
    evictions += st.evictions;
    print_message("after %d gc rounds: %" PRIu64 " shards, %" PRIu64 " bytes, %" PRIu64 " blocks, %" PRIu64
                  " shards evicted in all, %" PRIu64 " compactions since the last open\n",
                  rounds, st.shards, st.bytes, st.blocks, evictions, st.compactions);
    assert_true(evictions > 0);
    int live_odd = 0;
    for (int i = 1; i < ND; i += 2) {
        snprintf(k, sizeof k, "d%03d", i);
        live_odd += answer(s, k) == 1;
    }
    int pages, tombs;
    on_disk(dir, &pages, &tombs);
    print_message("odd neighbours still held: %d of %d; %d deleted pages still in shards/, %d tombstones\n", live_odd,
                  ND / 2, pages, tombs);
    const char *when[] = {"end", "index/ deleted", "reindex", "reindex_dir"};
    for (int step = 0; step < 4; step++) {
        if (step == 1) s = index_lost_reopen(s, dir);
        if (step == 2) reindex(s);
        if (step == 3) s = reindex_dir_reopen(s, dir);
        for (int i = 0; i < ND; i++) {
            snprintf(k, sizeof k, "d%03d", i);
            int a = answer(s, k);
            if (i % 2 == 0 && a != 0) fail_msg("%s: deleted %s answered %d", when[step], k, a);
            if (i % 2 == 1 && a != 0 && a != 1) fail_msg("%s: %s answered %d", when[step], k, a);
        }
    }
    kvx_store_close(s);
}

/* Deletes do not make the store grow without bound: many keys put and
 * deleted one by one (a page, then a tombstone file each), then gc: once
 * no older copy remains, the tombstones go, and the shards and bytes come
 * back near what the live keys alone take. Before: each tombstone was
 * carried by every compaction for good. */
/* PROMISE: KEYED-11 */
static void test_tombstones_do_not_accumulate(void **state)
{
    (void)state;
    char dir[300], k[32];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 16ull << 20});
    for (int i = 0; i < 16; i++) {
        snprintf(k, sizeof k, "keep-%02d", i);
        kput(s, NULL, k, 1);
    }
    kflush(s, NULL);
    gc(s);
    kvx_store_stats base = su_stat(s);
    kvx_store_stats peak = base;
    for (int i = 0; i < 300; i++) {
        snprintf(k, sizeof k, "gone-%03d", i);
        kput(s, NULL, k, 1);
        kflush(s, NULL);
        assert_int_equal(kdel(s, k), 1);
        if (i % 50 == 49) {
            kvx_store_stats x = su_stat(s);
            if (x.shards > peak.shards) peak.shards = x.shards;
            if (x.bytes > peak.bytes) peak.bytes = x.bytes;
        }
    }
    kvx_store_stats before = su_stat(s);
    for (int i = 0; i < 3; i++) gc(s);
    kvx_store_stats after = su_stat(s);
    print_message("baseline: %" PRIu64 " shards, %" PRIu64 " bytes; after 300 put+delete: %" PRIu64 " shards, %" PRIu64
                  " bytes (peak seen %" PRIu64 " shards, %" PRIu64 " bytes); after gc: %" PRIu64 " shards, %" PRIu64
                  " bytes, %" PRIu64 " blocks\n",
                  base.shards, base.bytes, before.shards, before.bytes, peak.shards, peak.bytes, after.shards,
                  after.bytes, after.blocks);
    assert_true(after.shards <= base.shards + 4);
    assert_true(after.bytes <= base.bytes + 4 * (uint64_t)base.shard_bytes);
    assert_true(after.bytes <= base.bytes * 2 + (256u << 10));
    for (int i = 0; i < 300; i += 7) {
        snprintf(k, sizeof k, "gone-%03d", i);
        EXPECT(s, k, 0, "after gc");
    }
    s = index_lost_reopen(s, dir);
    for (int i = 0; i < 300; i++) {
        snprintf(k, sizeof k, "gone-%03d", i);
        EXPECT(s, k, 0, "after gc, index/ deleted");
    }
    for (int i = 0; i < 16; i++) {
        snprintf(k, sizeof k, "keep-%02d", i);
        EXPECT(s, k, 1, "after gc, index/ deleted");
    }
    kvx_store_close(s);
}

/* The tombstone entries in the files of dir/shards, and the pages whose
 * key starts with prefix. */
static void count_entries(const char *dir, const char *prefix, int *tombs, int *pages)
{
    static char names[1024][64];
    size_t n = shard_files(dir, names, 1024), pl = strlen(prefix);
    *tombs = *pages = 0;
    for (size_t i = 0; i < n; i++) {
        char path[700];
        snprintf(path, sizeof path, "%.600s/shards/%.63s", dir, names[i]);
        kvx_shard *sh;
        if (kvx_shard_open(&sh, path, 0)) continue;
        for (uint32_t e = 0; e < kvx_shard_get_info(sh)->num_blocks; e++) {
            kvx_entry x;
            uint64_t seq = 0;
            int tomb = 0;
            if (kvx_shard_entry(&x, sh, e) || kvx_shard_entry_commit(sh, e, &seq, &tomb)) continue;
            if (tomb) ++*tombs;
            else if (x.key && x.key_len >= pl && !memcmp(x.key, prefix, pl)) ++*pages;
        }
        kvx_shard_close(sh);
    }
}

/* The same beside older live data in shards of their own (full-size, so
 * gc leaves them be, as a cache's long-lived hot pages): rounds of keys
 * put, deleted and gc'd. Once no file holds a page of a deleted key, its
 * tombstone hides nothing and gc lets it go; the tombstones, shards and
 * bytes do not grow with the number of deletes. */
/* PROMISE: KEYED-11 */
static void test_tombstones_go_beside_older_live_shards(void **state)
{
    (void)state;
    char dir[300], k[32];
    kvx_store *s = su_store(dir, sizeof dir,
                            (su_spec){.page_bytes = PB, .capacity = 64ull << 20, .shard_bytes = 64 << 10});
    for (int i = 0; i < 32; i++) {
        snprintf(k, sizeof k, "keep-%02d", i);
        kput(s, NULL, k, 1);
        if (i % 16 == 15) kflush(s, NULL);
    }
    gc(s);
    kvx_store_stats base = su_stat(s);
    int tombs, pages;
    count_entries(dir, "gone-", &tombs, &pages);
    print_message("baseline: %" PRIu64 " shards, %" PRIu64 " bytes, %d tombstones\n", base.shards, base.bytes, tombs);
    enum { R = 4, NG = 40 };
    int tomb_at[R];
    kvx_store_stats at[R];
    for (int round = 0; round < R; round++) {
        kvx_key del[NG];
        char names[NG][16];
        for (int i = 0; i < NG; i++) {
            snprintf(names[i], sizeof names[i], "gone-%d-%02d", round, i);
            kput(s, NULL, names[i], 1);
            del[i] = (kvx_key){names[i], strlen(names[i])};
        }
        kflush(s, NULL);
        for (int i = 0; i < NG; i += 10) { /* a call's tombstones fit one (small) shard */
            size_t n = 0;
            int rc = kvx_store_keyed_delete(s, del + i, 10, &n);
            if (rc) fail_msg("delete of 10 keys: %s (%s)", kvx_err_name(rc), kvx_last_error());
            assert_int_equal(n, 10);
        }
        for (int i = 0; i < 3; i++) gc(s);
        at[round] = su_stat(s);
        count_entries(dir, "gone-", &tomb_at[round], &pages);
        print_message("round %d (%d keys put and deleted): %" PRIu64 " shards, %" PRIu64 " bytes, %d tombstones, %d "
                      "deleted pages left in shards/\n",
                      round + 1, (round + 1) * NG, at[round].shards, at[round].bytes, tomb_at[round], pages);
        assert_int_equal(pages, 0); /* gc reclaimed every deleted page */
    }
    s = index_lost_reopen(s, dir);
    for (int round = 0; round < R; round++)
        for (int i = 0; i < NG; i++) {
            snprintf(k, sizeof k, "gone-%d-%02d", round, i);
            EXPECT(s, k, 0, "after the rounds, index/ deleted");
        }
    for (int i = 0; i < 32; i++) {
        snprintf(k, sizeof k, "keep-%02d", i);
        EXPECT(s, k, 1, "after the rounds, index/ deleted");
    }
    kvx_store_close(s);
    /* no deleted page is left anywhere: a tombstone hides nothing */
    if (tomb_at[R - 1] > NG)
        fail_msg("%d tombstones carried after %d deletes whose pages are all gone (%d after the first round of %d): "
                 "they grow with the number of deletes (kvx_st_tomb_needed keeps a tombstone while any other live "
                 "shard holds an older entry of any key)",
                 tomb_at[R - 1], R * NG, tomb_at[0], NG);
    assert_true(at[R - 1].shards <= base.shards + 4);
    assert_true(at[R - 1].bytes <= base.bytes + 4 * (uint64_t)base.shard_bytes);
}

/* ---- 9. names that claim the last generation ---- */

/* A keyed store with stray files claiming the last generation
 * (shards/ffffffffffffffff.kvx, empty, and the same name in staging/ and
 * quarantine/) keeps working: puts, flushes, deletes (each a new file),
 * reopen, reindex and reindex_dir. Before: the counter was raised above
 * every name, and the next file a writer began had no name left
 * (KVX_EFULL "run gc", and gc failed too). tests/engine/names.c
 * test_generation_never_reused is the block store's. */
/* PROMISE: RECOVER-5 */
static void test_keyed_generation_never_reused(void **state)
{
    (void)state;
    char dir[300], p[600], k[32];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 16ull << 20});
    kput(s, NULL, "first", 1);
    kflush(s, NULL);
    kvx_store_close(s);
    snprintf(p, sizeof p, "%s/quarantine", dir);
    mkdir(p, 0700); /* may exist */
    const char *stray[] = {"quarantine/ffffffffffffffff.kvx", "staging/.ffffffffffffffff.kvx.tmp.1.2",
                           "shards/ffffffffffffffff.kvx"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, stray[i]);
        FILE *f = fopen(p, "w");
        assert_non_null(f);
        fclose(f);
    }
    s = su_reopen(dir, 0);
    EXPECT(s, "first", 1, "reopen beside the strays");
    for (int i = 0; i < 6; i++) {
        snprintf(k, sizeof k, "n%d", i);
        kput(s, NULL, k, 1);
        kflush(s, NULL);
    }
    assert_int_equal(kdel(s, "n0"), 1);
    assert_int_equal(kdel(s, "first"), 1);
    kput(s, NULL, "first", 2);
    kflush(s, NULL);
    const char *when[] = {"writes", "reopen", "reindex", "reindex_dir"};
    for (int step = 0; step < 4; step++) {
        if (step == 1) {
            kvx_store_close(s);
            s = su_reopen(dir, 0);
        }
        if (step == 2) reindex(s);
        if (step == 3) s = reindex_dir_reopen(s, dir);
        EXPECT(s, "first", 2, when[step]);
        EXPECT(s, "n0", 0, when[step]);
        for (int i = 1; i < 6; i++) {
            snprintf(k, sizeof k, "n%d", i);
            EXPECT(s, k, 1, when[step]);
        }
        /* and it still writes */
        snprintf(k, sizeof k, "after-%d", step);
        kput(s, NULL, k, 1);
        kflush(s, NULL);
        EXPECT(s, k, 1, when[step]);
        assert_int_equal(kdel(s, k), 1);
        EXPECT(s, k, 0, when[step]);
    }
    kvx_store_stats st = su_stat(s);
    print_message("stray names: %" PRIu64 " shards, %" PRIu64 " quarantined\n", st.shards, st.quarantined);
    kvx_store_close(s);
    snprintf(p, sizeof p, "%s/quarantine/ffffffffffffffff.kvx", dir);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0); /* never replaced */
    assert_int_equal(sb.st_size, 0);
}

/* ---- 10. kill -9 in the middle of a delete ---- */

enum { NK10 = 40, ROUNDS10 = 20 };

/* A child's message: a delete call of keys [first, first + n) of a round
 * begins (done 0) or answered 0 (done 1); first -1: the store is open. */
typedef struct msg10 {
    int first, n, done;
} msg10;

static void key10(char *out, size_t cap, int round, int i) { snprintf(out, cap, "r%02d-%02d", round, i); }

static void child10(const char *dir, int round, int fd, uint64_t seed)
{
    kvx_store *s = NULL;
    if (kvx_store_open(&s, dir, NULL, 0)) _exit(2);
    msg10 m = {-1, 0, 0};
    if (write(fd, &m, sizeof m) != sizeof m) _exit(3);
    char names[NK10][16];
    kvx_key keys[NK10];
    for (int i = 0; i < NK10; i++) {
        key10(names[i], sizeof names[i], round, i);
        keys[i] = (kvx_key){names[i], strlen(names[i])};
    }
    uint64_t x = seed | 1;
    for (int i = 0; i < NK10;) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int n = 1 + (int)(x % 3);
        if (i + n > NK10) n = NK10 - i;
        m = (msg10){i, n, 0};
        if (write(fd, &m, sizeof m) != sizeof m) _exit(3);
        size_t del = 0;
        if (kvx_store_keyed_delete(s, keys + i, (size_t)n, &del) || del != (size_t)n) _exit(4);
        m.done = 1;
        if (write(fd, &m, sizeof m) != sizeof m) _exit(3);
        i += n;
    }
    kvx_store_close(s);
    _exit(0);
}

/* kill -9 of a writer in the middle of keyed deletes (20 rounds, a child
 * each, killed at a random time): after the next writer's open each key
 * is either deleted or holds its old bytes, never anything else; the keys
 * of one delete call all went or all stayed; a delete the child reported
 * done stays done, through later rounds' opens and a rebuilt index. Before:
 * a delete was a catalog edit alone, so a later reindex (or index/ lost)
 * brought back pages whose delete had answered. */
/* PROMISE: KEYED-12 */
static void test_kill_during_delete(void **state)
{
    (void)state;
    char dir[300], k[32];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    kvx_store_close(s);
    static int gone[ROUNDS10][NK10]; /* 1: deleted (as found after the round) */
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    print_message("seed %" PRIu64 "\n", seed);
    int killed = 0, done_total = 0, cut_calls = 0;
    for (int round = 0; round < ROUNDS10; round++) {
        s = su_reopen(dir, 0);
        for (int i = 0; i < NK10; i++) {
            key10(k, sizeof k, round, i);
            kput(s, NULL, k, (uint64_t)round + 1);
        }
        kflush(s, NULL);
        kvx_store_close(s);
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        seed = su_mix(seed);
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            child10(dir, round, fds[1], seed);
        }
        close(fds[1]);
        int reported[NK10] = {0};
        int open_seen = 0, sent = 0, fin = 0, cut_first = -1, cut_n = 0;
        uint32_t delay_us = (uint32_t)(su_mix(seed) % 40000); /* after the child's open */
        struct timespec t0 = {0, 0};
        for (;;) {
            int wait_ms = 1000;
            if (open_seen && !sent) {
                struct timespec now;
                clock_gettime(CLOCK_MONOTONIC, &now);
                long el = (now.tv_sec - t0.tv_sec) * 1000000L + (now.tv_nsec - t0.tv_nsec) / 1000;
                if (el >= (long)delay_us) {
                    kill(pid, SIGKILL);
                    sent = 1;
                } else {
                    wait_ms = (int)((delay_us - el) / 1000) + 1;
                }
            }
            struct pollfd pf = {fds[0], POLLIN, 0};
            if (poll(&pf, 1, wait_ms) <= 0) continue;
            msg10 m;
            ssize_t r = read(fds[0], &m, sizeof m);
            if (r <= 0) break;
            assert_int_equal(r, sizeof m);
            if (m.first < 0) {
                open_seen = 1;
                clock_gettime(CLOCK_MONOTONIC, &t0);
                continue;
            }
            if (!m.done) {
                cut_first = m.first;
                cut_n = m.n;
            } else {
                for (int i = 0; i < m.n; i++) reported[m.first + i] = 1;
                cut_first = -1;
                fin = m.first + m.n;
            }
        }
        close(fds[0]);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (WIFSIGNALED(status)) killed++;
        else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail_msg("round %d: the child exited %d (a store call failed there)", round, WEXITSTATUS(status));
        /* after the kill: each key deleted or its old bytes */
        s = su_reopen(dir, 0);
        int n_gone = 0;
        for (int i = 0; i < NK10; i++) {
            key10(k, sizeof k, round, i);
            int a = answer(s, k);
            if (a != 0 && a != round + 1) fail_msg("round %d: %s answered %d, want deleted or v%d", round, k, a, round + 1);
            if (reported[i] && a != 0) fail_msg("round %d: %s's delete answered 0, yet it answers v%d", round, k, a);
            gone[round][i] = a == 0;
            n_gone += a == 0;
            done_total += reported[i];
        }
        if (cut_first >= 0) { /* the call in flight: all of its keys or none */
            cut_calls++;
            for (int i = 1; i < cut_n; i++)
                if (gone[round][cut_first + i] != gone[round][cut_first])
                    fail_msg("round %d: the delete of keys %d..%d was cut in half", round, cut_first,
                             cut_first + cut_n - 1);
        }
        /* nothing past the call in flight went */
        int end = cut_first >= 0 ? cut_first + cut_n : fin;
        for (int i = end; i < NK10; i++)
            if (gone[round][i]) fail_msg("round %d: r%02d-%02d, never deleted, is gone", round, round, i);
        (void)n_gone;
        /* every earlier round as it was found */
        for (int r = 0; r <= round; r++)
            for (int i = 0; i < NK10; i++) {
                key10(k, sizeof k, r, i);
                EXPECT(s, k, gone[r][i] ? 0 : r + 1, "an earlier round");
            }
        kvx_store_close(s);
        if (round % 5 == 4) { /* the files alone say the same */
            s = su_reopen(dir, 0);
            s = index_lost_reopen(s, dir);
            for (int r = 0; r <= round; r++)
                for (int i = 0; i < NK10; i++) {
                    key10(k, sizeof k, r, i);
                    EXPECT(s, k, gone[r][i] ? 0 : r + 1, "index/ deleted");
                }
            kvx_store_close(s);
        }
    }
    print_message("%d of %d children killed, %d deletes reported done, %d calls cut\n", killed, ROUNDS10, done_total,
                  cut_calls);
    assert_true(killed > 0);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reput_from_batch_older_than_delete),
        cmocka_unit_test(test_old_index_after_delete),
        cmocka_unit_test(test_old_index_after_reput),
        cmocka_unit_test(test_newest_copy_rots_after_reput),
        cmocka_unit_test(test_delete_survives_rebuilt_index),
        cmocka_unit_test(test_forged_crc_replacement),
        cmocka_unit_test(test_later_flush_wins),
        cmocka_unit_test(test_copied_and_swapped_names),
        cmocka_unit_test(test_tombstones_outlive_older_copies),
        cmocka_unit_test(test_tombstones_do_not_accumulate),
        cmocka_unit_test(test_tombstones_go_beside_older_live_shards),
        cmocka_unit_test(test_keyed_generation_never_reused),
        cmocka_unit_test(test_kill_during_delete),
    };
    return cmocka_run_group_tests_name("engine/order", tests, su_setup, su_teardown);
}
