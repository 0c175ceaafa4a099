/*
 * test_attack7.c - a hostile review of keyed pages (engine/store_keyed.c,
 * the key table in format/, STORE version 2): keys an engine should not
 * send but may, deletes racing batches, reindex and gc after deletes,
 * files of the other kind dropped into shards/, STORE tampering, odd page
 * sizes, capacity with short pages, read-only readers and kill -9 of a
 * writer in the middle of puts and deletes.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lib/store.h"

#define PB 8192u

static size_t del1(kvx_store *s, const void *key, size_t klen)
{
    kvx_key k = {key, klen};
    size_t n = 99;
    assert_int_equal(kvx_store_keyed_delete(s, &k, 1, &n), 0);
    return n;
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

/* ------------------------------------------------------------------ */

/* Keys with NUL bytes, a key that is a prefix of another, 255 bytes,
 * 256 bytes (refused), all through reopen and reindex. */
static void test_awkward_keys(void **state)
{
    (void)state;
    char dir[256];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB});
    static const char k0[] = "a\0b", k1[] = "a\0c", k2[] = "a", k3[] = "\0", k4[] = "\0\0";
    uint8_t k255[255], k256[256];
    for (int i = 0; i < 256; i++) k256[i] = (uint8_t)(i * 7 + 1);
    memcpy(k255, k256, 255);
    const void *keys[] = {k0, k1, k2, k3, k4, k255};
    const size_t klen[] = {3, 3, 1, 1, 2, 255};
    const size_t plen[] = {1, PB, 2, PB - 1, 4096, 7};
    for (int i = 0; i < 6; i++) assert_int_equal(su_key_put(s, NULL, keys[i], klen[i], plen[i], 1, NULL), 0);
    assert_int_equal(su_key_put(s, NULL, k256, 256, 10, 1, NULL), KVX_EINVALID);
    assert_int_equal(kvx_store_flush(s), 0);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 6; i++)
            if (su_key_check(s, keys[i], klen[i], plen[i], 1)) fail_msg("round %d key %d not served exactly", round, i);
        assert_int_equal(su_key_check(s, k256, 255 + 1, 10, 1), KVX_EINVALID);
        assert_int_equal(su_key_check(s, "a\0", 2, 1, 1), KVX_ENOTFOUND);
        if (round == 0) {
            kvx_store_close(s);
            assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
        } else if (round == 1) {
            assert_int_equal(kvx_store_reindex(s), 0);
        }
    }
    su_verify_clean(s);
    kvx_store_close(s);
}

/* The same key twice in one put, with different bytes: one page stored
 * (the first), out_new 1. */
static void test_same_key_twice_in_one_put(void **state)
{
    (void)state;
    char dir[256];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB});
    uint8_t *p1 = malloc(PB), *p2 = malloc(PB);
    su_key_fill(p1, PB, "dup", 3, 1);
    su_key_fill(p2, PB, "dup", 3, 2);
    kvx_key k[2] = {{"dup", 3}, {"dup", 3}};
    const void *pages[2] = {p1, p2};
    size_t lens[2] = {PB, 100};
    size_t added = 0;
    assert_int_equal(kvx_store_keyed_put(s, NULL, k, pages, lens, 2, &added), 0);
    assert_int_equal(added, 1);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(su_key_check(s, "dup", 3, PB, 1), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, 1);
    /* and across two puts into one unflushed batch */
    kvx_store_batch *b = NULL;
    assert_int_equal(kvx_store_batch_create(&b, s), 0);
    assert_int_equal(su_key_put(s, b, "twice", 5, 10, 1, &added), 0);
    assert_int_equal(added, 1);
    assert_int_equal(su_key_put(s, b, "twice", 5, 20, 2, &added), 0);
    assert_int_equal(added, 0);
    assert_int_equal(kvx_store_batch_flush(b), 0);
    kvx_store_batch_destroy(b);
    assert_int_equal(su_key_check(s, "twice", 5, 10, 1), 0);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, 2);
    free(p1);
    free(p2);
    kvx_store_close(s);
}

/* The owner rewrites a key: put v1, delete, put v2. Whatever maintenance
 * follows (gc, compaction, reopen, reindex), a get answers v2's bytes,
 * never the deleted v1's. */
static void rewrite_after_delete(int op)
{
    {
        char dir[256];
        kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB});
        /* many keys so the rewritten one shares its shard with live ones */
        char name[32];
        for (int i = 0; i < 16; i++) {
            snprintf(name, sizeof name, "other-%d", i);
            assert_int_equal(su_key_put(s, NULL, name, strlen(name), PB, 1, NULL), 0);
        }
        assert_int_equal(su_key_put(s, NULL, "K", 1, PB, 1, NULL), 0);
        assert_int_equal(kvx_store_flush(s), 0);
        assert_int_equal(del1(s, "K", 1), 1);
        assert_int_equal(su_key_check(s, "K", 1, PB, 1), KVX_ENOTFOUND);
        assert_int_equal(su_key_put(s, NULL, "K", 1, 300, 2, NULL), 0);
        assert_int_equal(kvx_store_flush(s), 0);
        assert_int_equal(su_key_check(s, "K", 1, 300, 2), 0);
        if (op == 0) assert_int_equal(kvx_store_gc(s), 0);
        if (op == 1) {
            kvx_store_close(s);
            assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
        }
        if (op == 2) assert_int_equal(kvx_store_reindex(s), 0);
        if (op == 3) {
            kvx_store_close(s);
            assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
            assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
        }
        int rc = su_key_check(s, "K", 1, 300, 2);
        if (rc) fail_msg("op %d: after delete and a re-put, the get answers %d (1: the deleted page's bytes)", op,
                         rc);
        for (int i = 0; i < 16; i++) {
            snprintf(name, sizeof name, "other-%d", i);
            assert_int_equal(su_key_check(s, name, strlen(name), PB, 1), 0);
        }
        kvx_store_close(s);
    }
}

/* The same rewrite, with gc reclaiming the deleted page, and the old
 * shard file left in shards/ as a crash between gc's catalog edit and its
 * unlink leaves it (put back by hand here): the writer that opens next
 * adopts it (rule 2). The get must still answer the owner's newer page. */
static void rewrite_gc_crash(void)
{
    char dir[256];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB});
    assert_int_equal(su_key_put(s, NULL, "K", 1, PB, 1, NULL), 0);
    assert_int_equal(su_key_put(s, NULL, "L", 1, PB, 1, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    char names[8][64];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    char path[600], keep[600];
    snprintf(path, sizeof path, "%s/shards/%s", dir, names[0]);
    snprintf(keep, sizeof keep, "%s/old.kvx", dir);
    copy_file(path, keep);
    assert_int_equal(del1(s, "K", 1), 1);
    assert_int_equal(su_key_put(s, NULL, "K", 1, 300, 2, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_gc(s), 0); /* half deleted: rewritten */
    assert_int_equal(su_key_check(s, "K", 1, 300, 2), 0);
    kvx_store_close(s);
    assert_true(access(path, F_OK) != 0); /* gc removed the old file */
    copy_file(keep, path);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    int rc = su_key_check(s, "K", 1, 300, 2);
    if (rc) fail_msg("old shard adopted after a crash in gc: the get answers %d (1: the deleted page's bytes)", rc);
    assert_int_equal(su_key_check(s, "L", 1, PB, 1), 0);
    kvx_store_close(s);
}

static void test_rewrite_after_delete(void **state)
{
    (void)state;
    rewrite_after_delete(0); /* gc */
    rewrite_after_delete(1); /* reopen */
    rewrite_gc_crash();
}

/* After delete + re-put, a reindex (of the open handle, or reindex_dir of
 * the closed store) brings the deleted page back (docs/STORE.md) but the
 * get answers the owner's newer page. (Found by this review: the stale
 * page was served; fixed by cf92409, reindex keeps the newest copy of a
 * key.) */
static void test_rewrite_after_delete_reindex(void **state)
{
    (void)state;
    rewrite_after_delete(2); /* kvx_store_reindex */
    rewrite_after_delete(3); /* kvx_store_reindex_dir of the closed store */
}

/* Two acknowledged copies of one key with the same bytes (two batches),
 * the newer one's page damaged: before and after a reindex (which keeps
 * one copy per key) and a gc, the key is still served from the sound
 * copy: an acknowledged page is never lost while a good copy exists. */
static void test_newest_copy_damaged(void **state)
{
    (void)state;
    char dir[256];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB});
    kvx_store_batch *b1 = NULL, *b2 = NULL;
    assert_int_equal(kvx_store_batch_create(&b1, s), 0);
    assert_int_equal(kvx_store_batch_create(&b2, s), 0);
    assert_int_equal(su_key_put(s, b1, "D", 1, PB, 1, NULL), 0);
    assert_int_equal(su_key_put(s, b2, "D", 1, PB, 1, NULL), 0);
    assert_int_equal(su_key_put(s, b2, "E", 1, PB, 1, NULL), 0);
    assert_int_equal(kvx_store_batch_flush(b1), 0);
    assert_int_equal(kvx_store_batch_flush(b2), 0);
    kvx_store_batch_destroy(b1);
    kvx_store_batch_destroy(b2);
    char names[8][64];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 2);
    char path[600];
    snprintf(path, sizeof path, "%s/shards/%s", dir, names[1]); /* the newer generation: b2's */
    assert_int_equal(su_flip_page_byte(path, 0), 0);
    assert_int_equal(su_key_check(s, "D", 1, PB, 1), 0);
    const char *what[] = {"reindex", "gc", "reopen"};
    for (int step = 0; step < 3; step++) {
        if (step == 0) assert_int_equal(kvx_store_reindex(s), 0);
        if (step == 1) assert_int_equal(kvx_store_gc(s), 0);
        if (step == 2) {
            kvx_store_close(s);
            assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
        }
        int rc = su_key_check(s, "D", 1, PB, 1);
        if (rc)
            fail_msg("after %s: key D answers %d though an acknowledged sound copy was in the shards", what[step],
                     rc);
        assert_int_equal(su_key_check(s, "E", 1, PB, 1), 0);
    }
    kvx_store_close(s);
}

/* delete, put again, gc, reindex: no resurrection of the deleted bytes,
 * no loss of the new ones. */
static void test_delete_put_gc_reindex(void **state)
{
    (void)state;
    char dir[256];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB});
    char name[32];
    for (int i = 0; i < 8; i++) {
        snprintf(name, sizeof name, "k%d", i);
        assert_int_equal(su_key_put(s, NULL, name, strlen(name), PB, 1, NULL), 0);
    }
    assert_int_equal(kvx_store_flush(s), 0);
    for (int i = 0; i < 8; i++) {
        snprintf(name, sizeof name, "k%d", i);
        assert_int_equal(del1(s, name, strlen(name)), 1);
        assert_int_equal(su_key_put(s, NULL, name, strlen(name), 1000 + (size_t)i, 2, NULL), 0);
    }
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_gc(s), 0); /* every old page deleted: its shard goes */
    assert_int_equal(kvx_store_reindex(s), 0);
    for (int i = 0; i < 8; i++) {
        snprintf(name, sizeof name, "k%d", i);
        assert_int_equal(su_key_check(s, name, strlen(name), 1000 + (size_t)i, 2), 0);
    }
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, 8);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* A delete while a batch holds the key pending: the batch's flush
 * publishes it (documented); two batches' copies of one key: one delete
 * removes both. */
static void test_delete_and_batches(void **state)
{
    (void)state;
    char dir[256];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB});
    kvx_store_batch *b1 = NULL, *b2 = NULL;
    assert_int_equal(kvx_store_batch_create(&b1, s), 0);
    assert_int_equal(kvx_store_batch_create(&b2, s), 0);
    assert_int_equal(su_key_put(s, b1, "P", 1, 10, 1, NULL), 0);
    assert_int_equal(del1(s, "P", 1), 0);
    assert_int_equal(kvx_store_batch_flush(b1), 0);
    assert_int_equal(su_key_check(s, "P", 1, 10, 1), 0);
    size_t a1 = 0, a2 = 0;
    assert_int_equal(su_key_put(s, b1, "Q", 1, 10, 1, &a1), 0);
    assert_int_equal(su_key_put(s, b2, "Q", 1, 10, 1, &a2), 0);
    assert_int_equal(a1 + a2, 2);
    assert_int_equal(kvx_store_batch_flush(b1), 0);
    assert_int_equal(kvx_store_batch_flush(b2), 0);
    assert_int_equal(del1(s, "Q", 1), 2);
    assert_int_equal(su_key_check(s, "Q", 1, 10, 1), KVX_ENOTFOUND);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(su_key_check(s, "Q", 1, 10, 1), KVX_ENOTFOUND);
    assert_int_equal(su_key_check(s, "P", 1, 10, 1), 0);
    kvx_store_batch_destroy(b1);
    kvx_store_batch_destroy(b2);
    kvx_store_close(s);
}

/* One delete naming many keys, each several times in scattered places,
 * some not held, some prefixes of others: every held key deleted once,
 * the rest untouched. */
static void test_delete_many_with_repeats(void **state)
{
    (void)state;
    char dir[256];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = 4096});
    enum { N = 3000 };
    static char names[N][24];
    static kvx_key keys[N];
    static const void *pages[N];
    static size_t lens[N];
    static uint8_t page[1];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "m%d", i); /* "m1" is a prefix of "m10".. */
        keys[i] = (kvx_key){names[i], strlen(names[i])};
        pages[i] = page;
        lens[i] = 1;
    }
    assert_int_equal(kvx_store_keyed_put(s, NULL, keys, pages, lens, N, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    /* delete every even key three times (scattered), plus keys never put */
    static kvx_key del[3 * N / 2 + 2];
    size_t nd = 0;
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < N; i += 2) del[nd++] = keys[(i + r * 7 * 2) % N];
    del[nd++] = (kvx_key){"never", 5};
    del[nd++] = (kvx_key){"m", 1};
    size_t deleted = 0;
    assert_int_equal(kvx_store_keyed_delete(s, del, nd, &deleted), 0);
    assert_int_equal(deleted, N / 2);
    uint8_t *held = malloc(N);
    size_t lead = 9;
    assert_int_equal(kvx_store_keyed_exists(held, &lead, s, keys, N), 0);
    for (int i = 0; i < N; i++) assert_int_equal(held[i], i % 2);
    assert_int_equal(lead, 0);
    free(held);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, N / 2);
    kvx_store_close(s);
}

/* A damaged page: get EPAGECRC; the owner's delete still removes it; gc
 * then leaves the store clean (the damaged file quarantined, never
 * unlinked); the good keys beside it survive. */
static void test_delete_damaged(void **state)
{
    (void)state;
    char dir[256];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB});
    assert_int_equal(su_key_put(s, NULL, "good", 4, PB, 1, NULL), 0);
    assert_int_equal(su_key_put(s, NULL, "bad", 3, PB, 1, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    char names[8][64];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    char path[600];
    snprintf(path, sizeof path, "%s/shards/%s", dir, names[0]);
    assert_int_equal(su_flip_page_byte(path, 1), 0);
    assert_int_equal(su_key_check(s, "bad", 3, PB, 1), KVX_EPAGECRC);
    assert_int_equal(su_key_check(s, "good", 4, PB, 1), 0);
    uint64_t bad = 0;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), KVX_ECORRUPT);
    assert_int_equal(bad, 1);
    assert_int_equal(del1(s, "bad", 3), 1);
    assert_int_equal(su_key_check(s, "bad", 3, PB, 1), KVX_ENOTFOUND);
    assert_int_equal(kvx_store_gc(s), 0);
    assert_int_equal(su_key_check(s, "good", 4, PB, 1), 0);
    assert_int_equal(su_key_check(s, "bad", 3, PB, 1), KVX_ENOTFOUND);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(su_key_check(s, "good", 4, PB, 1), 0);
    assert_int_equal(su_key_check(s, "bad", 3, PB, 1), KVX_ENOTFOUND);
    kvx_store_close(s);
}

/* A block store's shard dropped into a keyed store's shards/ (and the
 * other way round): the writer that opens next moves it to quarantine/
 * or leaves it unserved; what the store held is served as before. */
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

static void store_file_patch(const char *dir, size_t off, uint32_t value)
{
    char path[600];
    snprintf(path, sizeof path, "%s/STORE", dir);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    uint8_t b[64];
    assert_int_equal(fread(b, 1, 64, f), 64);
    memcpy(b + off, &value, 4);
    uint32_t c = kvx_crc32c(0, b, 60);
    memcpy(b + 60, &c, 4);
    assert_int_equal(fseek(f, 0, SEEK_SET), 0);
    assert_int_equal(fwrite(b, 1, 64, f), 64);
    assert_int_equal(fclose(f), 0);
}

/* STORE version 2 tampered with (CRC made to match): page_bytes against
 * the geometry, block_tokens != 0, version 1 with block_tokens 0, a
 * signature: each refused at open, writer and reader alike, and the
 * store opens again once the file is put back. */
static void test_store_file_tampering(void **state)
{
    (void)state;
    char dir[256];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB});
    assert_int_equal(su_key_put(s, NULL, "x", 1, PB, 1, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    char path[600];
    snprintf(path, sizeof path, "%s/STORE", dir);
    uint8_t orig[64];
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(orig, 1, 64, f), 64);
    fclose(f);
    struct {
        size_t off;
        uint32_t v;
    } cases[] = {{56, PB * 2}, {56, PB - 2}, {56, 0}, {56, 7}, {28, 4}, {8, 1}, {32, 5}, {16, 2}, {12, KVX_QUANT_FP16}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        store_file_patch(dir, cases[i].off, cases[i].v);
        for (int ro = 0; ro < 2; ro++) {
            int rc = kvx_store_open(&s, dir, NULL, ro ? KVX_STORE_READONLY : 0);
            if (rc == 0) {
                kvx_store_close(s);
                fail_msg("STORE byte %zu = %u: opened (%s)", cases[i].off, cases[i].v, ro ? "reader" : "writer");
            }
        }
        f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(orig, 1, 64, f), 64);
        assert_int_equal(fclose(f), 0);
    }
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(su_key_check(s, "x", 1, PB, 1), 0);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* Odd page sizes: 4098 (not a multiple of 4096), 2 (the smallest); pages
 * of every length 1..page_bytes served byte for byte; page_bytes + 1
 * refused. */
static void test_odd_page_sizes(void **state)
{
    (void)state;
    const uint64_t sizes[] = {2, 4098, 12290};
    for (size_t z = 0; z < 3; z++) {
        char dir[256];
        uint64_t pb = sizes[z];
        kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = pb});
        size_t lens[] = {1, 2, pb / 2, pb - 1, pb};
        char name[32];
        for (size_t i = 0; i < 5; i++) {
            snprintf(name, sizeof name, "p%zu", i);
            assert_int_equal(su_key_put(s, NULL, name, strlen(name), lens[i], 1, NULL), 0);
        }
        assert_int_equal(su_key_put(s, NULL, "over", 4, pb + 1, 1, NULL), KVX_EINVALID);
        assert_int_equal(su_key_put(s, NULL, "zero", 4, 0, 1, NULL), KVX_EINVALID);
        assert_int_equal(kvx_store_flush(s), 0);
        for (int round = 0; round < 2; round++) {
            for (size_t i = 0; i < 5; i++) {
                snprintf(name, sizeof name, "p%zu", i);
                if (su_key_check(s, name, strlen(name), lens[i], 1))
                    fail_msg("page size %llu: a page of %zu bytes not served exactly", (unsigned long long)pb,
                             lens[i]);
            }
            assert_int_equal(kvx_store_reindex(s), 0);
        }
        su_verify_clean(s);
        kvx_store_close(s);
    }
    /* sizes a keyed store cannot take: refused at create */
    const uint64_t no[] = {1, 3, 4097, 1ull << 33};
    for (size_t z = 0; z < 4; z++) {
        char dir[256];
        su_new_dir(dir, sizeof dir);
        kvx_store_options o;
        kvx_store_options_init(&o);
        o.page_bytes = no[z];
        kvx_store *s = NULL;
        assert_int_not_equal(kvx_store_create(&s, dir, &o), 0);
        assert_null(s);
    }
}

/* A small capacity filled with pages of many lengths: the store stays
 * within it, the newest pages are served exactly, verify is clean. */
static void test_capacity_short_pages(void **state)
{
    (void)state;
    char dir[256];
    const uint64_t cap = 2 << 20;
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = 65536, .capacity = cap, .shard_bytes = 256 << 10});
    char name[32];
    const int n = 400;
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "c%d", i);
        size_t len = 1 + (size_t)(i * 7919) % 65536;
        assert_int_equal(su_key_put(s, NULL, name, strlen(name), len, 1, NULL), 0);
        if (i % 10 == 9) assert_int_equal(kvx_store_flush(s), 0);
        kvx_store_stats st;
        assert_int_equal(kvx_store_stat(&st, s), 0);
        if (st.bytes > cap)
            fail_msg("after %d pages: %llu bytes in a %llu-byte store", i + 1, (unsigned long long)st.bytes,
                     (unsigned long long)cap);
    }
    assert_int_equal(kvx_store_flush(s), 0);
    snprintf(name, sizeof name, "c%d", n - 1);
    assert_int_equal(su_key_check(s, name, strlen(name), 1 + (size_t)((n - 1) * 7919) % 65536, 1), 0);
    int held = 0;
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "c%d", i);
        int rc = su_key_check(s, name, strlen(name), 1 + (size_t)(i * 7919) % 65536, 1);
        assert_true(rc == 0 || rc == KVX_ENOTFOUND);
        held += rc == 0;
    }
    assert_true(held > 0);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* A read-only reader: gets work, puts and deletes are refused, nothing
 * under the store changes. */
static void test_readonly_reader(void **state)
{
    (void)state;
    char dir[256];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB});
    assert_int_equal(su_key_put(s, NULL, "r", 1, 77, 1, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    char shards[600];
    snprintf(shards, sizeof shards, "%s/shards", dir);
    assert_int_equal(chmod(shards, 0555), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(su_key_check(s, "r", 1, 77, 1), 0);
    kvx_key k = {"r", 1};
    size_t nd = 5;
    assert_int_not_equal(kvx_store_keyed_delete(s, &k, 1, &nd), 0);
    assert_int_not_equal(su_key_put(s, NULL, "w", 1, 10, 1, NULL), 0);
    uint8_t held = 0;
    size_t lead = 0;
    assert_int_equal(kvx_store_keyed_exists(&held, &lead, s, &k, 1), 0);
    assert_int_equal(held, 1);
    assert_int_equal(lead, 1);
    su_verify_clean(s);
    kvx_store_close(s);
    assert_int_equal(chmod(shards, 0755), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(su_key_check(s, "r", 1, 77, 1), 0);
    kvx_store_close(s);
}

/* kill -9 of a writer in the middle of keyed puts, flushes and deletes.
 * The child reports through a pipe each round it finished: "P i" once the
 * flush acknowledging keys of round i returned, "D i" once the delete of
 * round i's first key returned. After the kill: every acknowledged key
 * not deleted is served exactly, every deleted key is a miss, verify is
 * clean; nothing else is served with other bytes. */
static void test_kill9_keyed(void **state)
{
    (void)state;
    for (int kill_after = 1; kill_after < 40; kill_after += 6) {
        char dir[256];
        kvx_store *s =
            su_store(dir, sizeof dir, (su_spec){.page_bytes = 4096, .capacity = 8 << 20, .shard_bytes = 64 << 10});
        kvx_store_close(s);
        int fd[2];
        assert_int_equal(pipe(fd), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(fd[0]);
            kvx_store *c = NULL;
            if (kvx_store_open(&c, dir, NULL, 0)) _exit(3);
            char name[32];
            for (int r = 0; r < 64; r++) {
                for (int j = 0; j < 4; j++) {
                    snprintf(name, sizeof name, "r%d-%d", r, j);
                    if (su_key_put(c, NULL, name, strlen(name), 1 + (size_t)(r * 131 + j) % 4096, 1, NULL)) _exit(4);
                    if (r * 4 + j == kill_after * 3) raise(SIGKILL); /* mid-batch */
                }
                if (kvx_store_flush(c)) _exit(5);
                uint8_t m[2] = {'P', (uint8_t)r};
                if (write(fd[1], m, 2) != 2) _exit(6);
                if (r == kill_after) raise(SIGKILL); /* after a flush */
                snprintf(name, sizeof name, "r%d-0", r);
                kvx_key k = {name, strlen(name)};
                if (kvx_store_keyed_delete(c, &k, 1, NULL)) _exit(7);
                uint8_t d[2] = {'D', (uint8_t)r};
                if (write(fd[1], d, 2) != 2) _exit(8);
            }
            _exit(0);
        }
        close(fd[1]);
        int acked[64] = {0}, deleted[64] = {0};
        uint8_t m[2];
        while (read(fd[0], m, 2) == 2) {
            if (m[0] == 'P') acked[m[1]] = 1;
            else deleted[m[1]] = 1;
        }
        close(fd[0]);
        int ws = 0;
        assert_int_equal(waitpid(pid, &ws, 0), pid);
        assert_true(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);
        assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
        char name[32];
        for (int r = 0; r < 64; r++)
            for (int j = 0; j < 4; j++) {
                snprintf(name, sizeof name, "r%d-%d", r, j);
                int rc = su_key_check(s, name, strlen(name), 1 + (size_t)(r * 131 + j) % 4096, 1);
                if (rc == 1) fail_msg("kill %d: key %s served with other bytes", kill_after, name);
                if (j == 0 && deleted[r] && rc != KVX_ENOTFOUND)
                    fail_msg("kill %d: key %s deleted (acknowledged) but answers %d", kill_after, name, rc);
                /* the capacity (8 MiB) holds every key here: acknowledged = held */
                if (acked[r] && !(j == 0 && deleted[r]) && rc != 0)
                    fail_msg("kill %d: key %s acknowledged but answers %d", kill_after, name, rc);
            }
        su_verify_clean(s);
        kvx_store_close(s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_awkward_keys),
        cmocka_unit_test(test_same_key_twice_in_one_put),
        cmocka_unit_test(test_rewrite_after_delete),
        cmocka_unit_test(test_rewrite_after_delete_reindex),
        cmocka_unit_test(test_newest_copy_damaged),
        cmocka_unit_test(test_delete_put_gc_reindex),
        cmocka_unit_test(test_delete_and_batches),
        cmocka_unit_test(test_delete_many_with_repeats),
        cmocka_unit_test(test_delete_damaged),
        cmocka_unit_test(test_foreign_kind_in_shards),
        cmocka_unit_test(test_store_file_tampering),
        cmocka_unit_test(test_odd_page_sizes),
        cmocka_unit_test(test_capacity_short_pages),
        cmocka_unit_test(test_readonly_reader),
        cmocka_unit_test(test_kill9_keyed),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
