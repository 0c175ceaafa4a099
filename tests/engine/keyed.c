/*
 * keyed.c - keyed pages (engine/store_keyed.c; DESIGN.md and kvx.h "Keyed
 * pages"): the key table of a shard (writer and reader rules, damage), a
 * keyed store's put / get / exists, its durability, capacity, eviction,
 * reindex and refusals; odd keys and page sizes; a 64-bit name collision
 * is a miss, never another key's page.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include <cmocka.h>

#include "common/digest.h"
#include "engine/store.h"
#include "lib/commit_fault.h"
#include "lib/store.h"
#include "lib/fault.h"

#define PB 8192u /* the test store's page size */

static kvx_key key_of(const char *str) { return (kvx_key){str, strlen(str)}; }

/* Page bytes of key k: a function of the key, so any process can check. */
static void fill_page(uint8_t *p, size_t n, const char *k) { su_page(p, n, kvx_key_hash(k, strlen(k))); }

static void test_keyed_geometry(void **state)
{
    (void)state;
    kvx_geometry g;
    assert_int_equal(kvx_keyed_geometry(&g, 65536), 0);
    assert_int_equal(kvx_page_bytes(&g, 1), 65536);
    assert_int_equal(g.block_tokens, 0);
    assert_int_equal(g.quant, KVX_QUANT_E4M3);
    assert_int_equal(kvx_keyed_geometry(&g, 70272), 0); /* an MLA page: 61 layers x 576 x 2 bytes */
    assert_int_equal(kvx_page_bytes(&g, 1), 70272);
    assert_int_equal(kvx_keyed_geometry(&g, 2), 0);
    assert_int_equal(kvx_page_bytes(&g, 1), 2);
    assert_int_equal(kvx_keyed_geometry(&g, 7), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "even"));
    assert_int_equal(kvx_keyed_geometry(&g, 0), KVX_EINVALID);
    assert_int_equal(kvx_keyed_geometry(&g, 2ull * 4294967291ull), KVX_EINVALID); /* 2 x a prime > 65535 */
    assert_int_equal(kvx_keyed_geometry(&g, 1ull << 33), KVX_EINVALID);           /* over u32 */
    /* the name: SHA-256("abc") = ba7816bf 8f01cfea ...; first 8 bytes LE */
    assert_int_equal(kvx_key_hash("abc", 3), 0xeacf018fbf1678baull);
}

/* A keyed shard written with pages of three lengths, read back. */
static void write_keyed_shard(const char *path, kvx_geometry *g)
{
    assert_int_equal(kvx_keyed_geometry(g, PB), 0);
    kvx_shard_writer_options o;
    kvx_shard_writer_options_init(&o);
    o.geometry = *g;
    o.shard_id = 7;
    o.max_entries = 8;
    o.flags = KVX_FLAG_KEYS;
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    static uint8_t page[PB];
    const char *keys[3] = {"a", "model@1@0@deadbeef@bfloat16", "zz"};
    uint32_t lens[3] = {1, 100, PB};
    for (uint32_t i = 0; i < 3; i++) {
        fill_page(page, lens[i], keys[i]);
        kvx_entry_in e;
        memset(&e, 0, sizeof e);
        e.radix_block = (uint16_t)i;
        e.token_count = 1;
        e.page = page;
        e.key = keys[i];
        e.key_len = (uint32_t)strlen(keys[i]);
        e.page_len = lens[i];
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    }
    assert_int_equal(kvx_shard_writer_seal(w), 0);
}

/* PROMISE: FORMAT-16 */
static void test_key_table_round_trip(void **state)
{
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%.200s/keyed.kvx", su_root);
    kvx_geometry g;
    write_keyed_shard(path, &g);
    kvx_shard *sh;
    assert_int_equal(kvx_shard_open(&sh, path, KVX_OPEN_VERIFY_PAGES), 0);
    const kvx_shard_info *in = kvx_shard_get_info(sh);
    assert_int_equal(in->flags, KVX_FLAG_KEYS | KVX_FLAG_META_CRC);
    assert_int_equal(in->num_blocks, 3);
    const char *keys[3] = {"a", "model@1@0@deadbeef@bfloat16", "zz"};
    uint32_t lens[3] = {1, 100, PB};
    static uint8_t want[PB];
    for (uint32_t i = 0; i < 3; i++) {
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, sh, i), 0);
        assert_int_equal(e.key_len, strlen(keys[i]));
        assert_memory_equal(e.key, keys[i], e.key_len);
        assert_int_equal(e.bytes, lens[i]);
        assert_int_equal(e.token_count, 1);
        assert_int_equal(e.hash, kvx_key_hash(keys[i], strlen(keys[i])));
        assert_null(e.tokens);
        assert_null(e.digest);
        const void *p;
        assert_int_equal(kvx_shard_page(&p, sh, i, 1), 0);
        fill_page(want, lens[i], keys[i]);
        assert_memory_equal(p, want, lens[i]);
    }
    kvx_shard_close(sh);
}

/* Patches one byte of a keyed shard's tables and fixes the meta CRC, so
 * the structural rule (not the CRC) must catch it. */
static void patch_and_reseal(const char *path, uint64_t off, uint8_t value)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t hdr[64];
    assert_int_equal(pread(fd, hdr, 64, 0), 64);
    uint32_t n;
    memcpy(&n, hdr + 16, 4);
    size_t tlen = (size_t)n * (24 + KVX_KEY_RECORD);
    uint8_t *t = malloc(tlen);
    assert_int_equal(pread(fd, t, tlen, 64), (ssize_t)tlen);
    if (off < 64) hdr[off] = value;
    else t[off - 64] = value;
    uint32_t crc = kvx_crc32c(kvx_crc32c(0, hdr, 60), t, tlen);
    memcpy(hdr + 60, &crc, 4);
    assert_int_equal(pwrite(fd, hdr, 64, 0), 64);
    assert_int_equal(pwrite(fd, t, tlen, 64), (ssize_t)tlen);
    free(t);
    close(fd);
}

static void expect_refused(uint64_t off, uint8_t value, int want_rc, const char *want_msg)
{
    char path[300];
    snprintf(path, sizeof path, "%.200s/dmg%d.kvx", su_root, su_dir_counter++);
    kvx_geometry g;
    write_keyed_shard(path, &g);
    patch_and_reseal(path, off, value);
    kvx_shard *sh = NULL;
    assert_int_equal(kvx_shard_open(&sh, path, 0), want_rc);
    assert_null(sh);
    if (want_msg && !strstr(kvx_last_error(), want_msg)) fprintf(stderr, "message: %s\n", kvx_last_error());
    if (want_msg) assert_non_null(strstr(kvx_last_error(), want_msg));
}

/* PROMISE: FORMAT-16 */
static void test_key_table_damage(void **state)
{
    (void)state;
    const uint64_t keys_off = 64 + 3 * 24; /* key table after the coordinate table */
    expect_refused(keys_off + 0, 0, KVX_EFORMAT, "key length 0");
    expect_refused(keys_off + KVX_KEY_RECORD + 200, 1, KVX_EFORMAT, "past the key");
    expect_refused(64 + 24 + 4, 2, KVX_ETOKENS, "token_count 2");       /* entry 1's token_count */
    expect_refused(64 + 24 * 2 + 16 + 1, 0x40, KVX_EPAGE, "keyed page"); /* entry 2's bytes: PB + 0x4000 */
    expect_refused(56, KVX_FLAG_KEYS | KVX_FLAG_META_CRC | KVX_FLAG_HASHES, KVX_EFORMAT, "flags");
    expect_refused(56, KVX_FLAG_KEYS | KVX_FLAG_META_CRC | KVX_FLAG_SCALES, KVX_EFORMAT, "mixes");
    /* a keyed shard claiming B tokens a block: export once copied the
     * formula's bytes of a B=1 block out of each shorter keyed page, past
     * the mapping (fuzz: corpus/shard/regress_keyed_block_tokens) */
    expect_refused(20, 2, KVX_EFORMAT, "block_tokens 0");
}

/* PROMISE: FORMAT-16 */
static void test_key_writer_refusals(void **state)
{
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%.200s/w.kvx", su_root);
    kvx_geometry g;
    assert_int_equal(kvx_keyed_geometry(&g, PB), 0);
    kvx_shard_writer_options o;
    kvx_shard_writer_options_init(&o);
    o.geometry = g;
    o.max_entries = 4;
    o.flags = KVX_FLAG_KEYS | KVX_FLAG_SCALES;
    kvx_shard_writer *w = NULL;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), KVX_EINVALID);
    o.flags = KVX_FLAG_KEYS;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    static uint8_t page[PB + 1];
    char longkey[KVX_KEY_MAX + 2];
    memset(longkey, 'k', sizeof longkey);
    kvx_entry_in e;
    memset(&e, 0, sizeof e);
    e.token_count = 1;
    e.page = page;
    e.key = "k";
    e.key_len = 1;
    e.page_len = 0;
    assert_int_equal(kvx_shard_writer_add(w, &e), KVX_EINVALID);
    e.page_len = PB + 1;
    assert_int_equal(kvx_shard_writer_add(w, &e), KVX_EINVALID);
    e.page_len = PB;
    e.key_len = 0;
    assert_int_equal(kvx_shard_writer_add(w, &e), KVX_EINVALID);
    e.key = longkey;
    e.key_len = KVX_KEY_MAX + 1;
    assert_int_equal(kvx_shard_writer_add(w, &e), KVX_EINVALID);
    e.key_len = KVX_KEY_MAX;
    e.token_count = 2;
    assert_int_equal(kvx_shard_writer_add(w, &e), KVX_ETOKENS);
    e.token_count = 1;
    assert_int_equal(kvx_shard_writer_add(w, &e), 0); /* a 255-byte key is fine */
    kvx_shard_writer_abort(w);
    /* a key on a shard without a key table */
    kvx_geometry bg = su_geometry();
    o.geometry = bg;
    o.flags = KVX_FLAG_HASHES;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    memset(&e, 0, sizeof e);
    e.token_count = 1;
    e.page = page;
    e.key = "k";
    e.key_len = 1;
    assert_int_equal(kvx_shard_writer_add(w, &e), KVX_EINVALID);
    kvx_shard_writer_abort(w);
}

static void put_keys(kvx_store *s, kvx_store_batch *b, const char *const *k, const size_t *lens, size_t n)
{
    kvx_key keys[16];
    const void *pages[16];
    uint8_t *bufs[16];
    for (size_t i = 0; i < n; i++) {
        keys[i] = key_of(k[i]);
        bufs[i] = malloc(lens[i]);
        fill_page(bufs[i], lens[i], k[i]);
        pages[i] = bufs[i];
    }
    size_t added = 0;
    assert_int_equal(kvx_store_keyed_put(s, b, keys, pages, lens, n, &added), 0);
    for (size_t i = 0; i < n; i++) free(bufs[i]);
}

/* 1 when key k is served with the page fill_page makes for len bytes. */
static int served_ok(kvx_store *s, const char *k, size_t len)
{
    kvx_key key = key_of(k);
    kvx_view v;
    int st = -1;
    assert_int_equal(kvx_store_keyed_get(&v, &st, s, &key, 1), 0);
    if (st) return 0;
    uint8_t *want = malloc(len);
    fill_page(want, len, k);
    int ok = v.page_bytes == len && memcmp(v.page, want, len) == 0;
    free(want);
    kvx_view_release(&v);
    return ok;
}

/* PROMISE: KEYED-1 */
static void test_put_get_exists_delete(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    const char *k[3] = {"lmcache@1@0@aa@bf16", "0123456789abcdef", "x"};
    size_t lens[3] = {PB, 17, 1};
    put_keys(s, NULL, k, lens, 3);
    /* not visible before the flush */
    assert_int_equal(served_ok(s, k[0], lens[0]), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    for (int i = 0; i < 3; i++) assert_true(served_ok(s, k[i], lens[i]));
    /* putting again is a no-op (held) */
    size_t added = 9;
    kvx_key k0 = key_of(k[0]);
    uint8_t junk[PB];
    memset(junk, 0xAB, sizeof junk);
    const void *jp = junk;
    size_t jl = PB;
    assert_int_equal(kvx_store_keyed_put(s, NULL, &k0, &jp, &jl, 1, &added), 0);
    assert_int_equal(added, 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_true(served_ok(s, k[0], lens[0]));
    /* exists: per key and the leading count */
    kvx_key q[4] = {key_of(k[0]), key_of(k[1]), key_of("missing"), key_of(k[2])};
    uint8_t held[4];
    size_t lead = 0;
    assert_int_equal(kvx_store_keyed_exists(held, &lead, s, q, 4), 0);
    assert_int_equal(held[0] + held[1] + held[2] + held[3], 3);
    assert_int_equal(held[2], 0);
    assert_int_equal(lead, 2);
    /* get of a miss: zeroed view, ENOTFOUND, others served */
    kvx_view v[4];
    int st[4];
    assert_int_equal(kvx_store_keyed_get(v, st, s, q, 4), 0);
    assert_int_equal(st[2], KVX_ENOTFOUND);
    assert_null(v[2].page);
    assert_int_equal(st[3], 0);
    assert_int_equal(v[1].page_bytes, 17);
    kvx_views_release(v, 4);
    kvx_store_stats stats;
    assert_int_equal(kvx_store_stat(&stats, s), 0);
    assert_int_equal(stats.blocks, 3);
    assert_int_equal(stats.page_bytes, PB);
    assert_int_equal(stats.unverified, 0);
    /* delete: one edit, durable; a key named twice and a missing one */
    kvx_key del[3] = {key_of(k[1]), key_of(k[1]), key_of("missing")};
    size_t deleted = 0;
    assert_int_equal(kvx_store_keyed_delete(s, del, 3, &deleted), 0);
    assert_int_equal(deleted, 1);
    assert_int_equal(served_ok(s, k[1], lens[1]), 0);
    kvx_store_close(s);
    kvx_geometry expect;
    assert_int_equal(kvx_keyed_geometry(&expect, PB), 0);
    assert_int_equal(kvx_store_open(&s, dir, &expect, 0), 0);
    assert_int_equal(served_ok(s, k[1], lens[1]), 0);
    assert_true(served_ok(s, k[0], lens[0]));
    assert_true(served_ok(s, k[2], lens[2]));
    kvx_store_close(s);
    /* another page size, or a block geometry: refused */
    kvx_geometry other;
    assert_int_equal(kvx_keyed_geometry(&other, 4096), 0);
    assert_int_equal(kvx_store_open(&s, dir, &other, 0), KVX_ESHAPE);
    kvx_geometry bg = su_geometry();
    assert_int_equal(kvx_store_open(&s, dir, &bg, 0), KVX_ESHAPE);
    /* a reader serves, and may not delete or put */
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    assert_true(served_ok(s, k[0], lens[0]));
    assert_int_equal(kvx_store_keyed_delete(s, del, 1, NULL), KVX_EINVALID);
    kvx_store_close(s);
}

/* Keys of the commit-fault test: "cf-<n>", each 100 + n % 900 bytes. */
static void cf_key(char *buf, size_t cap, int n, size_t *len)
{
    snprintf(buf, cap, "cf-%d", n);
    *len = 100 + (size_t)n % 900;
}

/* Each catalog commit of keyed puts, flushes and deletes failed in turn
 * (tests/lib/commit_fault.h): a flush acknowledged serves its keys, a
 * failed one serves none of them; an acknowledged delete's key is never
 * served again, on this handle, after reopening or after a reindex from
 * the files alone; every other acknowledged key is served byte for byte
 * (a failed delete's key: served or gone, never wrong); verify is clean. */
/* PROMISE: KEYED-6 */
static void test_keyed_catalog_commit_faults(void **state)
{
    (void)state;
    enum { MAXK = 512 };
    static char state_of[MAXK]; /* 0 none, 'a' acknowledged, 'd' deleted, '?' a failed delete's, 'f' a failed put's */
    memset(state_of, 0, sizeof state_of);
    char dir[300], name[32];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    int next = 0;
    size_t len;
    for (; next < 8; next++) {
        cf_key(name, sizeof name, next, &len);
        const char *k = name;
        put_keys(s, NULL, &k, &len, 1);
        state_of[next] = 'a';
    }
    assert_int_equal(kvx_store_flush(s), 0);
    int victim = 0, failed_puts = 0, failed_deletes = 0;
    long k = 1;
    for (; k < 100 && next < MAXK - 4; k++) {
        cf_arm(k);
        int first = next;
        for (int i = 0; i < 2; i++, next++) {
            cf_key(name, sizeof name, next, &len);
            const char *kk = name;
            put_keys(s, NULL, &kk, &len, 1);
        }
        int frc = kvx_store_flush(s);
        for (int i = first; i < next; i++) state_of[i] = frc == 0 ? 'a' : 'f';
        failed_puts += frc != 0;
        while (state_of[victim] != 'a') victim++;
        cf_key(name, sizeof name, victim, &len);
        kvx_key del = key_of(name);
        int drc = kvx_store_keyed_delete(s, &del, 1, NULL);
        state_of[victim] = drc == 0 ? 'd' : '?';
        failed_deletes += drc != 0;
        kvx_idx_commit_fault = NULL;
        int hit = cf_calls >= k;
        for (int i = 0; i < next; i++) {
            cf_key(name, sizeof name, i, &len);
            int ok = served_ok(s, name, len);
            if ((state_of[i] == 'a' && !ok) || ((state_of[i] == 'd' || state_of[i] == 'f') && ok))
                fail_msg("commit %ld: key %s (%c) %s", k, name, state_of[i], ok ? "served" : "not served");
        }
        if (!hit) break;
    }
    assert_true(k > 3 && failed_puts > 0 && failed_deletes > 0);
    kvx_store_close(s);
    for (int reindex = 0; reindex < 2; reindex++) {
        if (reindex) assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
        s = su_reopen(dir, 0);
        for (int i = 0; i < next; i++) {
            cf_key(name, sizeof name, i, &len);
            int ok = served_ok(s, name, len); /* a wrong page is never "ok" */
            if ((state_of[i] == 'a' && !ok) || (state_of[i] == 'd' && ok))
                fail_msg("%s: key %s (%c) %s", reindex ? "reindexed" : "reopened", name, state_of[i],
                         ok ? "served" : "not served");
        }
        su_verify_clean(s);
        kvx_store_close(s);
    }
}

/* PROMISE: KEYED-2 */
static void test_bad_input_writes_nothing(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    uint8_t page[PB + 1] = {0};
    char longkey[KVX_KEY_MAX + 1];
    memset(longkey, 'q', sizeof longkey);
    kvx_key keys[2] = {key_of("good"), {longkey, sizeof longkey}};
    const void *pages[2] = {page, page};
    size_t lens[2] = {10, 10};
    assert_int_equal(kvx_store_keyed_put(s, NULL, keys, pages, lens, 2, NULL), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "keys[1]"));
    keys[1] = (kvx_key){"", 0};
    assert_int_equal(kvx_store_keyed_put(s, NULL, keys, pages, lens, 2, NULL), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "empty"));
    keys[1] = key_of("fine");
    lens[1] = PB + 1;
    assert_int_equal(kvx_store_keyed_put(s, NULL, keys, pages, lens, 2, NULL), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "page_lens[1]"));
    lens[1] = 0;
    assert_int_equal(kvx_store_keyed_put(s, NULL, keys, pages, lens, 2, NULL), KVX_EINVALID);
    pages[1] = NULL;
    lens[1] = 5;
    assert_int_equal(kvx_store_keyed_put(s, NULL, keys, pages, lens, 2, NULL), KVX_EINVALID);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, 0);
    assert_int_equal(st.pending_blocks, 0);
    /* an odd page size, or a geometry beside page_bytes */
    char d2[300];
    su_new_dir(d2, sizeof d2);
    kvx_store_options o;
    kvx_store_options_init(&o);
    o.page_bytes = 4095;
    kvx_store *t = NULL;
    assert_int_equal(kvx_store_create(&t, d2, &o), KVX_EINVALID);
    o.page_bytes = 4096;
    o.geometry = su_geometry();
    assert_int_equal(kvx_store_create(&t, d2, &o), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "no geometry"));
    kvx_store_close(s);
}

/* Block calls on a keyed store and keyed calls on a block store. */
/* PROMISE: KEYED-1 */
static void test_kinds_do_not_mix(void **state)
{
    (void)state;
    char dk[300], db[300];
    kvx_store *k = su_store(dk, sizeof dk, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    su_new_dir(db, sizeof db);
    kvx_store_options o;
    kvx_store_options_init(&o);
    o.geometry = su_geometry();
    kvx_store *b;
    assert_int_equal(kvx_store_create(&b, db, &o), 0);
    uint32_t t[2 * SU_B] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint8_t page[4096] = {0};
    kvx_view v[2];
    size_t n = 0;
    assert_int_equal(kvx_store_put(k, t, 2 * SU_B, page, 1, NULL, NULL), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "keyed store"));
    assert_int_equal(kvx_store_prefix(v, &n, k, t, 2 * SU_B, 2), KVX_EINVALID);
    assert_int_equal(kvx_store_get_block(v, k, t, 2 * SU_B), KVX_EINVALID);
    assert_int_equal(kvx_store_get_hash(v, k, 5), KVX_EINVALID);
    kvx_xfer_stream *st = NULL;
    assert_int_equal(kvx_xfer_stream_create(&st, k), KVX_EINVALID);
    uint8_t held;
    uint64_t h = 1;
    assert_int_equal(kvx_xfer_has_blocks(&held, NULL, k, &h, 1, NULL, 0, 0, 0), KVX_EINVALID);
    kvx_key key = key_of("k");
    const void *pp = page;
    size_t len = 1;
    int status;
    assert_int_equal(kvx_store_keyed_put(b, NULL, &key, &pp, &len, 1, NULL), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "block store"));
    assert_int_equal(kvx_store_keyed_get(v, &status, b, &key, 1), KVX_EINVALID);
    assert_int_equal(kvx_store_keyed_exists(&held, NULL, b, &key, 1), KVX_EINVALID);
    assert_int_equal(kvx_store_keyed_delete(b, &key, 1, NULL), KVX_EINVALID);
    kvx_store_close(k);
    kvx_store_close(b);
}

/* The index's name for a key is 64 bits of SHA-256: a lookup that finds
 * the hash but not the key is a miss, never the other key's page. */
/* PROMISE: KEYED-3 */
static void test_whole_key_compared(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    const char *k[1] = {"the-real-key"};
    size_t lens[1] = {64};
    put_keys(s, NULL, k, lens, 1);
    assert_int_equal(kvx_store_flush(s), 0);
    uint8_t d[KVX_DIGEST_BYTES];
    memset(d, 0, sizeof d);
    st_query q;
    memset(&q, 0, sizeof q);
    q.hash = kvx_key_hash(k[0], strlen(k[0])); /* the same index name ... */
    q.digest = d;
    q.key = (const uint8_t *)"the-fake-key"; /* ... another key of the same length */
    q.key_len = 12;
    kvx_cat_snap *snap;
    assert_int_equal(kvx_cat_snap_begin(s->cat, &snap), 0);
    kvx_view v;
    memset(&v, 0, sizeof v);
    assert_int_equal(kvx_st_lookup(s, snap, &q, &v), KVX_ENOTFOUND);
    q.key = (const uint8_t *)k[0];
    assert_int_equal(kvx_st_lookup(s, snap, &q, &v), 0);
    kvx_view_release(&v);
    kvx_cat_snap_end(snap);
    kvx_store_close(s);
}

/* Batches: each flush publishes its own pages; close drops unflushed ones. */
/* PROMISE: KEYED-4 */
static void test_batches_and_unflushed(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    kvx_store_batch *b1, *b2;
    assert_int_equal(kvx_store_batch_create(&b1, s), 0);
    assert_int_equal(kvx_store_batch_create(&b2, s), 0);
    const char *k1[1] = {"one"}, *k2[1] = {"two"}, *k3[1] = {"three"};
    size_t lens[1] = {300};
    put_keys(s, b1, k1, lens, 1);
    put_keys(s, b2, k2, lens, 1);
    put_keys(s, NULL, k3, lens, 1);
    assert_int_equal(kvx_store_batch_flush(b1), 0);
    assert_true(served_ok(s, "one", 300));
    assert_int_equal(served_ok(s, "two", 300), 0);
    kvx_store_batch_destroy(b2); /* never acknowledged */
    kvx_store_batch_destroy(b1);
    kvx_store_close(s); /* "three" was never flushed */
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_true(served_ok(s, "one", 300));
    assert_int_equal(served_ok(s, "two", 300), 0);
    assert_int_equal(served_ok(s, "three", 300), 0);
    kvx_store_close(s);
}

/* Capacity holds by eviction; the newest pages stay; reindex from the
 * shards alone serves the same pages. */
/* PROMISE: KEYED-8 */
static void test_capacity_eviction_reindex(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 2ull << 20});
    char names[400][16];
    for (int i = 0; i < 400; i++) {
        snprintf(names[i], sizeof names[i], "page-%d", i);
        const char *k[1] = {names[i]};
        size_t lens[1] = {PB - (size_t)i};
        put_keys(s, NULL, k, lens, 1);
        if (i % 8 == 7) assert_int_equal(kvx_store_flush(s), 0);
    }
    assert_int_equal(kvx_store_gc(s), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.bytes <= st.capacity_bytes);
    assert_true(st.evictions > 0);
    assert_true(st.blocks < 400);
    assert_true(served_ok(s, names[399], PB - 399));
    uint64_t blocks = st.blocks;
    assert_int_equal(kvx_store_reindex(s), 0);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, blocks);
    assert_true(served_ok(s, names[399], PB - 399));
    kvx_store_close(s);
    /* index/ gone: reindex_dir rebuilds it from the keyed shards */
    char idx[400];
    snprintf(idx, sizeof idx, "%s/index", dir);
    assert_int_equal(su_rm_rf(idx), 0);
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, blocks);
    assert_true(served_ok(s, names[398], PB - 398));
    kvx_store_close(s);
}

/* Eviction in a keyed store keeps the pages used: keys read after every
 * flush outlive keys of the same age never read, though small flushes are
 * merged many times before the first eviction and every victim holds both
 * (a victim's used pages are carried with their recency). */
/* PROMISE: STORE-6 */
static void test_used_pages_outlive_unused(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 2ull << 20});
    char names[300][16];
    kvx_key hot[8];
    for (int i = 0; i < 300; i++) {
        snprintf(names[i], sizeof names[i], "page-%d", i);
        const char *k[1] = {names[i]};
        size_t lens[1] = {PB};
        put_keys(s, NULL, k, lens, 1);
        if (i < 8) hot[i] = key_of(names[i]);
        if (i % 8 != 7) continue;
        assert_int_equal(kvx_store_flush(s), 0);
        uint8_t held[8];
        size_t lead = 0;
        assert_int_equal(kvx_store_keyed_exists(held, &lead, s, hot, 8), 0); /* a use of each */
        if (lead != 8) fail_msg("page-0..7 used after every flush, lost after put %d", i);
    }
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.compactions > 0);
    assert_true(st.evictions > 0);
    assert_true(st.bytes <= st.capacity_bytes);
    for (int i = 0; i < 8; i++) assert_true(served_ok(s, names[i], PB));
    /* put just after them, never used: the oldest unused pages are gone */
    for (int i = 8; i < 16; i++) assert_false(served_ok(s, names[i], PB));
    for (int i = 288; i < 296; i++) assert_true(served_ok(s, names[i], PB)); /* the last flush's */
    kvx_store_close(s);
}

/* A damaged page is reported, not served; verify names it. */
/* PROMISE: KEYED-5 */
static void test_damaged_page(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    const char *k[2] = {"p0", "p1"};
    size_t lens[2] = {4000, 4000};
    put_keys(s, NULL, k, lens, 2);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    char names[4][64];
    assert_int_equal(su_list_names(dir, "shards", names, 4), 1);
    char path[500];
    snprintf(path, sizeof path, "%s/shards/%s", dir, names[0]);
    assert_int_equal(su_flip_page_byte(path, 1), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_key q[2] = {key_of("p0"), key_of("p1")};
    kvx_view v[2];
    int st[2];
    assert_int_equal(kvx_store_keyed_get(v, st, s, q, 2), 0);
    assert_int_equal(st[0], 0);
    assert_int_equal(st[1], KVX_EPAGECRC);
    kvx_views_release(v, 2);
    uint64_t bad = 0;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), KVX_ECORRUPT);
    assert_int_equal(bad, 1);
    kvx_store_close(s);
}

/* The path of dir's only shard file (a store of one shard). */
static void kr_shard_of(const char *dir, char *path, size_t cap)
{
    char names[4][64];
    assert_int_equal(su_list_names(dir, "shards", names, 4), 1);
    snprintf(path, cap, "%s/shards/%s", dir, names[0]);
}

static void kr_drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
}

/* 1 when every 4 KiB page of path's [off, off + len) is in the page cache. */
static int file_resident(const char *path, uint64_t off, size_t len)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(m != MAP_FAILED);
    size_t from = (size_t)(off - off % 4096), np = (off + len - from + 4095) / 4096;
    unsigned char *vec = malloc(np);
    assert_int_equal(mincore((uint8_t *)m + from, off + len - from, vec), 0);
    int all = 1;
    for (size_t i = 0; i < np; i++) all &= vec[i] & 1;
    free(vec);
    munmap(m, (size_t)st.st_size);
    close(fd);
    return all;
}

/* kvx_store_keyed_read: pages read into the caller's buffers (aligned or
 * not), byte-identical; a miss and a short page say so; a buffer under the
 * page size is refused before anything is read; a page out of the cache
 * is read with O_DIRECT (where the file system has it: the cache is left
 * as it was); a damaged page is KVX_EPAGECRC, and so is one rewritten in
 * place with its old mtime put back after an earlier read (the bytes are
 * checked where they land, every time). */
/* PROMISE: KEYED-14 */
static void test_keyed_read_into_buffers(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    const char *k[2] = {"full", "short"};
    size_t lens[2] = {PB, 17};
    put_keys(s, NULL, k, lens, 2);
    assert_int_equal(kvx_store_flush(s), 0);
    uint8_t *aligned = aligned_alloc(4096, PB), *raw = malloc(2 * PB + 1), *odd = raw + 1, *want = malloc(PB);
    kvx_key q[3] = {key_of(k[0]), key_of("missing"), key_of(k[1])};
    void *dst[3] = {aligned, odd + PB, odd}; /* each a buffer of its own */
    size_t cap[3] = {PB, PB, PB}, got[3];
    int st[3];
    assert_int_equal(kvx_store_keyed_read(st, got, s, q, 3, dst, cap), 0);
    assert_int_equal(st[0], 0);
    assert_int_equal(st[1], KVX_ENOTFOUND);
    assert_int_equal(st[2], 0);
    assert_int_equal(got[0], PB);
    assert_int_equal(got[1], 0);
    assert_int_equal(got[2], 17);
    fill_page(want, PB, k[0]);
    assert_memory_equal(aligned, want, PB);
    fill_page(want, 17, k[1]);
    assert_memory_equal(odd, want, 17);
    /* a buffer under the page size: refused, naming it */
    cap[1] = PB - 1;
    assert_int_equal(kvx_store_keyed_read(st, got, s, q, 3, dst, cap), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "dst_cap[1]"));
    cap[1] = PB;
    kvx_store_close(s);

    /* out of the page cache: read straight into the aligned buffer */
    char path[500];
    kr_shard_of(dir, path, sizeof path);
    kvx_shard *sh;
    assert_int_equal(kvx_shard_open(&sh, path, 0), 0);
    kvx_entry e0, e1;
    uint32_t i0 = 0; /* k0's entry: the full page */
    assert_int_equal(kvx_shard_entry(&e0, sh, 0), 0);
    if (e0.bytes != PB) i0 = 1;
    assert_int_equal(kvx_shard_entry(&e0, sh, i0), 0);
    assert_int_equal(kvx_shard_entry(&e1, sh, 1 - i0), 0);
    kvx_shard_close(sh);
    assert_int_equal(e0.bytes, PB);
    int direct_fd = open(path, O_RDONLY | O_DIRECT);
    int has_direct = direct_fd >= 0;
    if (has_direct) close(direct_fd);
    s = su_reopen(dir, 0);
    /* the shard's handle opened first (reading its tables brings the small
     * file's pages in), then the cache dropped */
    assert_int_equal(kvx_store_keyed_read(st, got, s, &q[2], 1, &dst[2], &cap[2]), 0);
    assert_int_equal(st[0], 0);
    kr_drop_cache(path);
    has_direct = has_direct && !file_resident(path, e0.offset, PB);
    memset(aligned, 0, PB);
    assert_int_equal(kvx_store_keyed_read(st, got, s, q, 1, dst, cap), 0);
    assert_int_equal(st[0], 0);
    fill_page(want, PB, k[0]);
    assert_memory_equal(aligned, want, PB);
    /* O_DIRECT left the cache as it was: the page is still not in it */
    if (has_direct) assert_false(file_resident(path, e0.offset, PB));
    kvx_store_close(s);

    /* damage: k0's page flipped; k1 still served */
    assert_int_equal(su_flip_page_byte(path, i0), 0);
    s = su_reopen(dir, 0);
    assert_int_equal(kvx_store_keyed_read(st, got, s, q, 3, dst, cap), 0);
    assert_int_equal(st[0], KVX_EPAGECRC);
    assert_int_equal(got[0], 0);
    assert_int_equal(st[2], 0);
    /* k1 rewritten in place after a read, its mtime put back: still caught */
    struct stat before;
    assert_int_equal(stat(path, &before), 0);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, (off_t)e1.offset + 3), 1);
    b ^= 0x10;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)e1.offset + 3), 1);
    struct timespec ts[2] = {before.st_atim, before.st_mtim};
    assert_int_equal(futimens(fd, ts), 0);
    close(fd);
    assert_int_equal(kvx_store_keyed_read(st, got, s, &q[2], 1, &dst[2], &cap[2]), 0);
    assert_int_equal(st[0], KVX_EPAGECRC);
    kvx_store_close(s);
    free(aligned);
    free(raw);
    free(want);
}

/* kvx_store_keyed_contains: held without a page read (a damaged page is
 * held here, a miss for exists, KVX_EPAGECRC when read); each key it finds
 * counts as a hit, each it does not as a miss, as for a get. */
/* PROMISE: KEYED-15 */
static void test_keyed_contains_no_page_read(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    const char *k[1] = {"p0"};
    size_t lens[1] = {PB};
    put_keys(s, NULL, k, lens, 1);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_stats a, b;
    assert_int_equal(kvx_store_stat(&a, s), 0);
    kvx_key p0 = key_of("p0"), gone = key_of("never");
    kvx_key both[2] = {p0, gone};
    uint8_t h[2] = {9, 9};
    size_t lead = 0;
    assert_int_equal(kvx_store_keyed_contains(h, &lead, s, both, 2), 0);
    assert_int_equal(h[0], 1);
    assert_int_equal(h[1], 0);
    assert_int_equal(lead, 1);
    assert_int_equal(kvx_store_stat(&b, s), 0);
    assert_int_equal(b.hits - a.hits, 1);
    assert_int_equal(b.misses - a.misses, 1);
    kvx_store_close(s);

    /* a damaged page: contains says held (it reads no page), exists does
     * not, and a read refuses it */
    char path[500];
    kr_shard_of(dir, path, sizeof path);
    assert_int_equal(su_flip_page_byte(path, 0), 0);
    s = su_reopen(dir, 0);
    h[0] = h[1] = 9;
    assert_int_equal(kvx_store_keyed_contains(h, &lead, s, both, 2), 0);
    assert_int_equal(h[0], 1);
    assert_int_equal(h[1], 0);
    assert_int_equal(kvx_store_keyed_exists(h, &lead, s, both, 2), 0);
    assert_int_equal(h[0], 0);
    uint8_t *buf = malloc(PB);
    void *dst[1] = {buf};
    size_t cap[1] = {PB};
    int st[1];
    assert_int_equal(kvx_store_keyed_read(st, NULL, s, &p0, 1, dst, cap), 0);
    assert_int_equal(st[0], KVX_EPAGECRC);
    free(buf);
    kvx_store_close(s);
}

/* Keys with NUL bytes, a key that is a prefix of another, 255 bytes,
 * 256 bytes (refused), all through reopen and reindex. */
/* PROMISE: KEYED-2 */
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

/* Two acknowledged copies of one key with the same bytes (two batches),
 * the newer one's page damaged: before and after a reindex (which keeps
 * one copy per key) and a gc, the key is still served from the sound
 * copy: an acknowledged page is never lost while a good copy exists. */
/* PROMISE: KEYED-7 */
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

/* Odd page sizes: 4098 (not a multiple of 4096), 2 (the smallest); pages
 * of every length 1..page_bytes served byte for byte; page_bytes + 1
 * refused. */
/* PROMISE: KEYED-2 */
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
/* PROMISE: KEYED-8 */
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
/* PROMISE: RECOVER-1 */
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

#define CAP ((uint64_t)1 << 30)

/* A keyed store of 16-byte pages in 4 KiB shards, each put flushed: 400
 * keys, every put acknowledged, the newest 100 served byte for byte, at
 * most 256 shards, the oldest gone; the same after reopen. */
/* PROMISE: KEYED-8 */
static void test_keyed_tiny_pages(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store_options o;
    kvx_store_options_init(&o);
    o.page_bytes = 16;
    o.capacity_bytes = CAP;
    o.shard_bytes = 4096;
    o.flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC;
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    enum { NK = 400 };
    for (int round = 0; round < 2; round++) {
        if (round == 0) {
            for (int i = 0; i < NK; i++) {
                char k[32];
                snprintf(k, sizeof k, "key-%d", i);
                uint8_t pg[16];
                su_page(pg, sizeof pg, kvx_key_hash(k, strlen(k)));
                kvx_key key = {k, strlen(k)};
                const void *pp = pg;
                size_t len = (size_t)(1 + i % 16);
                int rc = kvx_store_keyed_put(s, NULL, &key, &pp, &len, 1, NULL);
                if (!rc) rc = kvx_store_flush(s);
                if (rc) fail_msg("keyed put %d: %s (%s)", i, kvx_err_name(rc), kvx_last_error());
            }
            kvx_store_stats st = su_stat(s);
            assert_true(st.shards <= 256);
            assert_true(st.evictions > 0);
            assert_int_equal(st.capacity_bytes, CAP);
        } else {
            kvx_store_close(s);
            s = su_reopen(dir, KVX_STORE_NOWAIT | KVX_STORE_NOSYNC);
        }
        for (int i = 0; i < NK; i++) {
            char k[32];
            snprintf(k, sizeof k, "key-%d", i);
            uint8_t pg[16];
            su_page(pg, sizeof pg, kvx_key_hash(k, strlen(k)));
            kvx_key key = {k, strlen(k)};
            kvx_view v;
            int status = 9;
            assert_int_equal(kvx_store_keyed_get(&v, &status, s, &key, 1), 0);
            if (i >= NK - 100) assert_int_equal(status, 0);
            if (i == 0) assert_int_equal(status, KVX_ENOTFOUND);
            if (status == 0) {
                assert_int_equal(v.page_bytes, (size_t)(1 + i % 16));
                assert_memory_equal(v.page, pg, v.page_bytes);
                kvx_views_release(&v, 1);
            } else {
                assert_int_equal(status, KVX_ENOTFOUND);
            }
        }
        su_verify_clean(s);
    }
    kvx_store_close(s);
}

#define KPB 4096u

#define SHARED_NAME 0x5eed5eed0c011de5ull

/* Every key starting "collide-" is named SHARED_NAME. */
static uint64_t collide_names(const void *key, size_t len, uint64_t name)
{
    return len > 8 && memcmp(key, "collide-", 8) == 0 ? SHARED_NAME : name;
}

static int hook_reset(void **state)
{
    (void)state;
    kvx_key_name_hook = NULL;
    return 0;
}

/* Page bytes of key k: from its own bytes (FNV-1a), not from its name,
 * which colliding keys share. */
static void key_page(uint8_t *p, size_t n, const char *k)
{
    uint64_t f = 0xcbf29ce484222325ull;
    for (const char *c = k; *c; c++) f = (f ^ (uint8_t)*c) * 0x100000001b3ull;
    su_page(p, n, f);
}

/* 100..990 bytes, from the key's last byte (a partial page). */
static size_t key_len_of(const char *k) { return 100 + (size_t)(uint8_t)k[strlen(k) - 1] * 37 % 891; }

/* Puts keys (n), answers how many the store took as new. */
static size_t put_keys_added(kvx_store *s, const char *const *k, size_t n)
{
    kvx_key keys[4];
    const void *pages[4];
    size_t lens[4];
    uint8_t buf[4][KPB];
    assert_true(n <= 4);
    for (size_t i = 0; i < n; i++) {
        keys[i] = (kvx_key){k[i], strlen(k[i])};
        lens[i] = key_len_of(k[i]);
        key_page(buf[i], lens[i], k[i]);
        pages[i] = buf[i];
    }
    size_t added = 99;
    int rc = kvx_store_keyed_put(s, NULL, keys, pages, lens, n, &added);
    if (rc) fail_msg("keyed put: %s (%s)", kvx_err_name(rc), kvx_last_error());
    return added;
}

/* 1: k is served its own page; 0: a miss. Another key's page fails. */
static int served_own(kvx_store *s, const char *k)
{
    kvx_key key = {k, strlen(k)};
    kvx_view v;
    int st = 9;
    assert_int_equal(kvx_store_keyed_get(&v, &st, s, &key, 1), 0);
    if (st == KVX_ENOTFOUND) return 0;
    if (st) fail_msg("keyed get %s: %s", k, kvx_err_name(st));
    uint8_t want[KPB];
    size_t len = key_len_of(k);
    key_page(want, len, k);
    if (v.page_bytes != len || memcmp(v.page, want, len) != 0)
        fail_msg("key %s was served %zu bytes that are not its page (another key's?)", k, (size_t)v.page_bytes);
    kvx_view_release(&v);
    return 1;
}

/* How many locations the catalog holds under the shared name. */
static size_t locations_of_name(kvx_store *s)
{
    kvx_cat_snap *snap;
    assert_int_equal(kvx_cat_snap_begin(s->cat, &snap), 0);
    size_t n = 0;
    kvx_cat_loc loc;
    int rc;
    while ((rc = kvx_cat_loc_at(snap, SHARED_NAME, n, &loc)) == 0) n++;
    kvx_cat_snap_end(snap);
    assert_int_equal(rc, KVX_ENOTFOUND);
    return n;
}

static void check_all(kvx_store *s, const char *const *held, size_t nheld, const char *const *absent, size_t nabs)
{
    for (size_t i = 0; i < nheld; i++)
        if (!served_own(s, held[i])) fail_msg("key %s, acknowledged, is not served", held[i]);
    for (size_t i = 0; i < nabs; i++)
        if (served_own(s, absent[i])) fail_msg("key %s is served, but it is not held", absent[i]);
}

/* Keyed stores: "a 64-bit collision is a miss, never another key's page"
 * (test_whole_key_compared above checks one lookup against a crafted
 * query only). test_keyed_name_collision: keys that share their 8-byte name
 * (the test seam kvx_key_name_hook, common/digest.h) are put in two flushes
 * and in one, each served its own page, the second put not taken as "already
 * held"; also after kvx_store_reindex, a reopen (writer and reader), a delete
 * of one of them and gc; a key never put that shares the name is a miss. */
/* PROMISE: KEYED-3 */
static void test_keyed_name_collision(void **state)
{
    (void)state;
    char dir[300];
    kvx_key_name_hook = collide_names;
    const char *a = "collide-A", *b = "collide-B", *c = "collide-C", *d = "collide-D", *e = "collide-E";
    /* the seam names them alike, and so does the public kvx_key_hash */
    assert_true(kvx_key_hash(a, strlen(a)) == SHARED_NAME);
    assert_true(kvx_key_hash(b, strlen(b)) == SHARED_NAME);
    assert_true(kvx_key_hash("plain", 5) != SHARED_NAME);
    su_new_dir(dir, sizeof dir);
    kvx_store_options o;
    kvx_store_options_init(&o);
    o.page_bytes = KPB;
    o.capacity_bytes = 64ull << 20;
    o.flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC;
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    /* A, then B in a later flush: B is new, not "already held" */
    assert_int_equal(put_keys_added(s, &a, 1), 1);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(put_keys_added(s, &b, 1), 1);
    assert_int_equal(kvx_store_flush(s), 0);
    /* C and D in one put (both pending in one batch at once) */
    const char *cd[2] = {c, d};
    assert_int_equal(put_keys_added(s, cd, 2), 2);
    assert_int_equal(kvx_store_flush(s), 0);
    /* a put of A again is held: nothing new */
    assert_int_equal(put_keys_added(s, &a, 1), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(locations_of_name(s), 4); /* the collision is real: one name, four pages */
    const char *all[4] = {a, b, c, d};
    check_all(s, all, 4, &e, 1);
    uint8_t held[2] = {9, 9};
    size_t lead = 9;
    kvx_key ex[2] = {{e, strlen(e)}, {b, strlen(b)}};
    assert_int_equal(kvx_store_keyed_exists(held, &lead, s, ex, 2), 0);
    assert_int_equal(held[0], 0);
    assert_int_equal(held[1], 1);
    assert_int_equal(lead, 0);
    su_verify_clean(s);
    /* rebuilt from the shards alone */
    assert_int_equal(kvx_store_reindex(s), 0);
    assert_int_equal(locations_of_name(s), 4);
    check_all(s, all, 4, &e, 1);
    su_verify_clean(s);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_READONLY | KVX_STORE_NOWAIT);
    check_all(s, all, 4, &e, 1);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    check_all(s, all, 4, &e, 1);
    /* the owner's delete of A removes A's page only */
    size_t deleted = 9;
    kvx_key ka = {a, strlen(a)};
    assert_int_equal(kvx_store_keyed_delete(s, &ka, 1, &deleted), 0);
    assert_int_equal(deleted, 1);
    const char *left[3] = {b, c, d}, *gone[2] = {a, e};
    check_all(s, left, 3, gone, 2);
    assert_int_equal(kvx_store_gc(s), 0);
    check_all(s, left, 3, gone, 2);
    su_verify_clean(s);
    kvx_store_close(s);
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    check_all(s, left, 3, &e, 1);
    kvx_store_close(s);
    kvx_key_name_hook = NULL;
}

/* A keyed store's options whose geometry fields are all zero but whose
 * padding bytes are not (what a struct returned by value may carry): the
 * create works. It compared the geometry's bytes with memcmp, padding
 * included, and refused it under ASan ("takes no geometry"; found by
 * tests/system/powercut test_powercut_keyed). */
/* PROMISE: KEYED-1 */
static void test_keyed_options_padding_ignored(void **state)
{
    (void)state;
    kvx_store_options o;
    memset(&o, 0xA5, sizeof o);
    o.version = KVX_STORE_OPTIONS_VERSION;
    o.geometry.num_layers = 0;
    o.geometry.kv_heads = 0;
    o.geometry.head_dim = 0;
    o.geometry.block_tokens = 0;
    o.geometry.quant = 0;
    o.geometry.model_signature = 0;
    kvx_store_options d = KVX_STORE_OPTIONS_INIT;
    o.capacity_bytes = 16u << 20;
    o.shard_bytes = d.shard_bytes;
    o.flags = d.flags;
    o.tier_url = NULL;
    o.tier_tenant = NULL;
    o.tier_ttl_ms = d.tier_ttl_ms;
    o.page_bytes = 4096;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = NULL;
    int rc = kvx_store_create(&s, dir, &o);
    if (rc) fail_msg("create: %s (%s)", kvx_err_name(rc), kvx_last_error());
    kvx_store_close(s);
}

/* ---- kvx_store_keyed_read under attack ---- */

/* One buffer given for two keys, or two that overlap: refused before
 * anything is read. Else a page read and checked into the buffer is
 * overwritten by the next key's read (a damaged one's bad bytes) and
 * still reported read (status 0). */
/* PROMISE: KEYED-14 */
static void test_keyed_read_overlapping_buffers_refused(void **state)
{
    (void)state;
    char dir[300], path[500];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    const char *k[2] = {"good", "bad"};
    size_t lens[2] = {PB, PB};
    put_keys(s, NULL, k, lens, 2);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    kr_shard_of(dir, path, sizeof path);
    kvx_shard *sh;
    assert_int_equal(kvx_shard_open(&sh, path, 0), 0);
    kvx_entry e;
    assert_int_equal(kvx_shard_entry(&e, sh, 0), 0);
    uint32_t bad = e.hash == kvx_key_hash("bad", 3) ? 0 : 1;
    kvx_shard_close(sh);
    assert_int_equal(su_flip_page_byte(path, bad), 0);
    s = su_reopen(dir, 0);
    uint8_t *buf = aligned_alloc(4096, 2 * PB), *want = malloc(PB);
    fill_page(want, PB, "good");
    kvx_key q[2] = {key_of("good"), key_of("bad")};
    size_t cap[2] = {PB, PB}, got[2];
    int st[2];
    void *same[2] = {buf, buf}, *part[2] = {buf, buf + PB - 64}, *apart[2] = {buf, buf + PB};
    for (int t = 0; t < 2; t++) {
        void **dst = t == 0 ? same : part;
        st[0] = st[1] = 99;
        int rc = kvx_store_keyed_read(st, got, s, q, 2, dst, cap);
        /* never "read" with other bytes in the buffer */
        if (rc == 0 && st[0] == 0) assert_memory_equal(buf, want, PB);
        assert_int_equal(rc, KVX_EINVALID);
        assert_non_null(strstr(kvx_last_error(), "overlap"));
    }
    /* side by side: both read, the good one whole */
    assert_int_equal(kvx_store_keyed_read(st, got, s, q, 2, apart, cap), 0);
    assert_int_equal(st[0], 0);
    assert_int_equal(st[1], KVX_EPAGECRC);
    assert_memory_equal(buf, want, PB);
    kvx_store_close(s);
    free(buf);
    free(want);
}

/* Pages whose lengths are not multiples of 4096, the last one at the very
 * end of the file, read out of the page cache into aligned and unaligned
 * buffers (O_DIRECT for the aligned head, the cache for the tail), on the
 * test's file system and on tmpfs (no O_DIRECT there on older kernels);
 * with KVX_STORE_VERIFY and read-only too. Byte for byte, every time. */
/* PROMISE: KEYED-14 */
static void test_keyed_read_odd_lengths_out_of_cache(void **state)
{
    (void)state;
    const char *roots[2] = {su_root, "/dev/shm"};
    for (int r = 0; r < 2; r++) {
        char dir[300], path[500];
        if (r == 0) {
            su_new_dir(dir, sizeof dir);
        } else {
            snprintf(dir, sizeof dir, "%s/kvx-keyed-read-%d", roots[r], (int)getpid());
            su_rm_rf(dir);
        }
        kvx_store *s = su_create(dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
        const char *k[6] = {"a4097", "b6000", "c1", "d4096", "e8191", "f8192"};
        size_t lens[6] = {4097, 6000, 2, 4096, 8190, PB};
        put_keys(s, NULL, k, lens, 6);
        assert_int_equal(kvx_store_flush(s), 0);
        kvx_store_close(s);
        kr_shard_of(dir, path, sizeof path);
        uint32_t flags[3] = {0, KVX_STORE_VERIFY, KVX_STORE_READONLY};
        uint8_t *al = aligned_alloc(4096, 8 * PB), *raw = malloc(8 * PB + 1), *want = malloc(PB);
        for (int f = 0; f < 3; f++) {
            s = su_reopen(dir, flags[f]);
            for (int pass = 0; pass < 3; pass++) {
                kr_drop_cache(path);
                kvx_key q[6];
                void *dst[6];
                size_t cap[6], got[6];
                int st[6];
                for (int i = 0; i < 6; i++) {
                    q[i] = key_of(k[i]);
                    dst[i] = pass == 1 ? raw + 1 + (size_t)i * PB : al + (size_t)i * PB;
                    cap[i] = PB;
                }
                memset(al, 0xEE, 8 * PB);
                memset(raw, 0xEE, 8 * PB + 1);
                assert_int_equal(kvx_store_keyed_read(st, got, s, q, 6, dst, cap), 0);
                for (int i = 0; i < 6; i++) {
                    assert_int_equal(st[i], 0);
                    assert_int_equal(got[i], lens[i]);
                    fill_page(want, lens[i], k[i]);
                    assert_memory_equal(dst[i], want, lens[i]);
                }
            }
            kvx_store_close(s);
        }
        free(al);
        free(raw);
        free(want);
        if (r == 1) su_rm_rf(dir);
    }
}

/* Pages read together (their O_DIRECT reads in flight at once): one
 * damaged in the middle of the batch is KVX_EPAGECRC, the pages around it
 * read byte for byte. */
/* PROMISE: KEYED-14 */
static void test_keyed_read_batch_with_damage(void **state)
{
    (void)state;
    char dir[300], path[500];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    const char *k[4] = {"w0", "w1", "w2", "w3"};
    size_t lens[4] = {PB, PB, PB, PB};
    put_keys(s, NULL, k, lens, 4);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    kr_shard_of(dir, path, sizeof path);
    kvx_shard *sh;
    assert_int_equal(kvx_shard_open(&sh, path, 0), 0);
    uint32_t bad = 0;
    for (uint32_t i = 0; i < 4; i++) {
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, sh, i), 0);
        if (e.key_len == 2 && memcmp(e.key, "w2", 2) == 0) bad = i;
    }
    kvx_shard_close(sh);
    assert_int_equal(su_flip_page_byte(path, bad), 0);
    s = su_reopen(dir, 0);
    kvx_key w0 = key_of("w0");
    uint8_t held = 0;
    assert_int_equal(kvx_store_keyed_contains(&held, NULL, s, &w0, 1), 0); /* the shard opened (its tables read) */
    assert_int_equal(held, 1);
    uint8_t *al = aligned_alloc(4096, 4 * PB), *want = malloc(PB);
    for (int pass = 0; pass < 2; pass++) { /* out of the cache (read together, O_DIRECT), then all in it */
        if (pass == 0) {
            kr_drop_cache(path);
        } else {
            int fd = open(path, O_RDONLY);
            assert_true(fd >= 0);
            static char sink[65536];
            while (read(fd, sink, sizeof sink) > 0) {
            }
            close(fd);
        }
        memset(al, 0xEE, 4 * PB);
        kvx_key q[4];
        void *dst[4];
        size_t cap[4], got[4];
        int st[4];
        for (int i = 0; i < 4; i++) {
            q[i] = key_of(k[i]);
            dst[i] = al + (size_t)i * PB;
            cap[i] = PB;
        }
        assert_int_equal(kvx_store_keyed_read(st, got, s, q, 4, dst, cap), 0);
        for (int i = 0; i < 4; i++) {
            if (i == 2) {
                assert_int_equal(st[i], KVX_EPAGECRC);
                assert_int_equal(got[i], 0);
                continue;
            }
            assert_int_equal(st[i], 0);
            fill_page(want, PB, k[i]);
            assert_memory_equal(dst[i], want, PB);
        }
    }
    free(al);
    free(want);
    kvx_store_close(s);
}

/* The shard file cut short under an open store, at a 4096 boundary inside
 * a page (O_DIRECT reads end there), at an odd byte, and before the page:
 * KVX_ETRUNC, never a signal, never status 0; pages before the cut still
 * read. */
/* PROMISE: KEYED-14 */
static void test_keyed_read_truncated_under_handle(void **state)
{
    (void)state;
    int cuts[3] = {4096, 1000, -1};
    for (int c = 0; c < 3; c++) {
        char dir[300], path[500];
        kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
        const char *k[2] = {"first", "last"};
        size_t lens[2] = {PB, PB};
        put_keys(s, NULL, k, lens, 2);
        assert_int_equal(kvx_store_flush(s), 0);
        kr_shard_of(dir, path, sizeof path);
        uint8_t *buf = aligned_alloc(4096, 2 * PB), *want = malloc(PB);
        kvx_key q[2] = {key_of("first"), key_of("last")};
        void *dst[2] = {buf, buf + PB};
        size_t cap[2] = {PB, PB}, got[2];
        int st[2];
        assert_int_equal(kvx_store_keyed_read(st, got, s, q, 2, dst, cap), 0);
        assert_int_equal(st[0] | st[1], 0);
        /* the later page's offset */
        kvx_shard *sh;
        assert_int_equal(kvx_shard_open(&sh, path, 0), 0);
        kvx_entry e0, e1;
        assert_int_equal(kvx_shard_entry(&e0, sh, 0), 0);
        assert_int_equal(kvx_shard_entry(&e1, sh, 1), 0);
        kvx_shard_close(sh);
        kvx_entry *late = e0.offset > e1.offset ? &e0 : &e1;
        int late_i = late->hash == kvx_key_hash("last", 4) ? 1 : 0;
        off_t cut = cuts[c] < 0 ? (off_t)late->offset - 1 : (off_t)late->offset + cuts[c];
        assert_int_equal(truncate(path, cut), 0);
        kr_drop_cache(path);
        memset(buf, 0, 2 * PB);
        assert_int_equal(kvx_store_keyed_read(st, got, s, q, 2, dst, cap), 0);
        assert_int_not_equal(st[late_i], 0);
        assert_int_equal(got[late_i], 0);
        if (cuts[c] >= 0) {
            assert_int_equal(st[1 - late_i], 0);
            fill_page(want, PB, k[1 - late_i]);
            assert_memory_equal(dst[1 - late_i], want, PB);
        }
        kvx_store_close(s);
        free(buf);
        free(want);
    }
}

static int kr_fd_count(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

/* Many shards read with O_DIRECT (each handle opens a second descriptor),
 * the store closed: no descriptor left open. */
/* PROMISE: KEYED-14 */
static void test_keyed_read_no_fd_leak(void **state)
{
    (void)state;
    int before = kr_fd_count();
    char dir[300], path[500];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    char names[40][16];
    for (int i = 0; i < 40; i++) {
        snprintf(names[i], sizeof names[i], "fd%d", i);
        const char *k = names[i];
        size_t len = PB;
        put_keys(s, NULL, &k, &len, 1);
        assert_int_equal(kvx_store_flush(s), 0); /* a shard each */
    }
    uint8_t *buf = aligned_alloc(4096, PB), *want = malloc(PB);
    for (int round = 0; round < 3; round++) {
        char sh[64][64];
        size_t nsh = su_list_names(dir, "shards", sh, 64);
        for (size_t j = 0; j < nsh; j++) {
            snprintf(path, sizeof path, "%s/shards/%s", dir, sh[j]);
            kr_drop_cache(path);
        }
        for (int i = 0; i < 40; i++) {
            kvx_key q = key_of(names[i]);
            void *dst = buf;
            size_t cap = PB, got;
            int st;
            assert_int_equal(kvx_store_keyed_read(&st, &got, s, &q, 1, &dst, &cap), 0);
            assert_int_equal(st, 0);
            fill_page(want, PB, names[i]);
            assert_memory_equal(buf, want, PB);
        }
    }
    kvx_store_close(s);
    assert_int_equal(kr_fd_count(), before);
    free(buf);
    free(want);
}

/* A failed read (EIO, a short read) at each of the read's calls in turn,
 * the O_DIRECT descriptor's open (what a missing /proc does) among them:
 * a key's status is 0 only with its page's bytes; the store reads it
 * again afterwards. */
/* PROMISE: KEYED-14 */
static void test_keyed_read_faults(void **state)
{
    (void)state;
    char dir[300], path[500];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    const char *k[3] = {"x1", "x2", "x3"};
    size_t lens[3] = {PB, 6000, PB};
    put_keys(s, NULL, k, lens, 3);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    kr_shard_of(dir, path, sizeof path);
    uint8_t *buf = aligned_alloc(4096, 3 * PB), *want = malloc(PB);
    kvx_key q[3] = {key_of(k[0]), key_of(k[1]), key_of(k[2])};
    void *dst[3] = {buf, buf + PB, buf + 2 * PB};
    size_t cap[3] = {PB, PB, PB}, got[3];
    int st[3];
    int modes[2] = {FAULT_ERRNO, FAULT_SHORT};
    unsigned kinds[2] = {FAULT_RW, FAULT_OPEN};
    for (int m = 0; m < 2; m++)
        for (int kd = 0; kd < 2; kd++) {
            long total = 0;
            for (long at = 1; at < 40; at++) {
                s = su_reopen(dir, 0);
                kr_drop_cache(path);
                fault_install();
                fault_only = kinds[kd];
                fault_reset(at, EIO, modes[m]);
                memset(buf, 0, 3 * PB);
                int rc = kvx_store_keyed_read(st, got, s, q, 3, dst, cap);
                long hits = fault_hits;
                fault_uninstall();
                if (rc == 0)
                    for (int i = 0; i < 3; i++) {
                        if (st[i]) continue;
                        assert_int_equal(got[i], lens[i]);
                        fill_page(want, lens[i], k[i]);
                        assert_memory_equal(dst[i], want, lens[i]);
                    }
                assert_int_equal(kvx_store_keyed_read(st, got, s, q, 3, dst, cap), 0);
                for (int i = 0; i < 3; i++) assert_int_equal(st[i], 0);
                kvx_store_close(s);
                total += hits;
                if (!hits) break;
            }
            assert_true(total > 0);
        }
    free(buf);
    free(want);
}

/* ---- readers racing a writer that puts, deletes, evicts and collects ---- */

#define KR_KEYS 48
typedef struct kr_race {
    kvx_store *s;
    const char *dir;
    atomic_int stop;
    atomic_long reads_ok, reads_miss;
    atomic_int wrong;
    unsigned seed;
} kr_race;

static void kr_name(char *out, size_t cap, int i) { snprintf(out, cap, "race-%02d", i); }

/* Version ver of key's page: su_key_fill with ver in its first 8 bytes. */
static void kr_fill(uint8_t *p, const char *key, uint64_t ver)
{
    su_key_fill(p, PB, key, strlen(key), ver);
    memcpy(p, &ver, 8);
}

static void *kr_writer(void *arg)
{
    kr_race *r = arg;
    uint8_t *p = malloc(PB);
    unsigned seed = r->seed;
    for (uint64_t ver = 1; ver < 600; ver++) {
        char name[32];
        kr_name(name, sizeof name, (int)(rand_r(&seed) % KR_KEYS));
        kvx_key k = key_of(name);
        if (rand_r(&seed) % 3 == 0) {
            assert_int_equal(kvx_store_keyed_delete(r->s, &k, 1, NULL), 0);
        } else {
            kr_fill(p, name, ver);
            const void *pages[1] = {p};
            size_t len = PB;
            assert_int_equal(kvx_store_keyed_put(r->s, NULL, &k, pages, &len, 1, NULL), 0);
            assert_int_equal(kvx_store_flush(r->s), 0);
        }
        if (ver % 25 == 0) assert_int_equal(kvx_store_gc(r->s), 0);
    }
    atomic_store(&r->stop, 1);
    free(p);
    return NULL;
}

static void *kr_reader(void *arg)
{
    kr_race *r = arg;
    unsigned seed = r->seed ^ (unsigned)(uintptr_t)pthread_self();
    uint8_t *buf = aligned_alloc(4096, 4 * (PB + 4096)), *want = malloc(PB);
    while (!atomic_load(&r->stop)) {
        char names[4][32];
        kvx_key q[4];
        void *dst[4];
        size_t cap[4], got[4];
        int st[4];
        for (int i = 0; i < 4; i++) {
            kr_name(names[i], sizeof names[i], (int)(rand_r(&seed) % KR_KEYS));
            q[i] = key_of(names[i]);
            dst[i] = buf + (size_t)i * (PB + 4096) + (rand_r(&seed) % 2 ? 0 : 8); /* aligned or not */
            cap[i] = PB;
        }
        if (kvx_store_keyed_read(st, got, r->s, q, 4, dst, cap) != 0) continue;
        for (int i = 0; i < 4; i++) {
            if (st[i]) {
                atomic_fetch_add(&r->reads_miss, 1);
                continue;
            }
            uint64_t ver;
            memcpy(&ver, dst[i], 8);
            kr_fill(want, names[i], ver);
            if (got[i] != PB || memcmp(dst[i], want, PB) != 0) atomic_fetch_add(&r->wrong, 1);
            else atomic_fetch_add(&r->reads_ok, 1);
        }
    }
    free(buf);
    free(want);
    return NULL;
}

/* Drops the shards' pages from the page cache, over and over: the
 * readers' aligned reads go to O_DIRECT. */
static void *kr_dropper(void *arg)
{
    kr_race *r = arg;
    char sub[400], path[700];
    snprintf(sub, sizeof sub, "%s/shards", r->dir);
    while (!atomic_load(&r->stop)) {
        DIR *d = opendir(sub);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            snprintf(path, sizeof path, "%s/%s", sub, de->d_name);
            int fd = open(path, O_RDONLY);
            if (fd < 0) continue;
            (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
        if (d) closedir(d);
    }
    return NULL;
}

/* Three threads read keyed pages (in and out of the page cache, aligned
 * buffers and not) while a writer puts new versions of the same keys,
 * deletes them, evicts (a small capacity) and collects: every page
 * reported read is one version of its key, whole. */
/* PROMISE: KEYED-14 */
static void test_keyed_read_races_writer(void **state)
{
    (void)state;
    char dir[300];
    kr_race r;
    memset(&r, 0, sizeof r);
    r.seed = (unsigned)time(NULL);
    int fds = kr_fd_count();
    r.s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 256u << 10, .shard_bytes = 128u << 10});
    r.dir = dir;
    pthread_t w, rd[3], dr;
    assert_int_equal(pthread_create(&dr, NULL, kr_dropper, &r), 0);
    assert_int_equal(pthread_create(&w, NULL, kr_writer, &r), 0);
    for (int i = 0; i < 3; i++) assert_int_equal(pthread_create(&rd[i], NULL, kr_reader, &r), 0);
    pthread_join(w, NULL);
    for (int i = 0; i < 3; i++) pthread_join(rd[i], NULL);
    pthread_join(dr, NULL);
    print_message("race seed %u: %ld read, %ld missed, %d wrong\n", r.seed, (long)r.reads_ok, (long)r.reads_miss,
                  (int)r.wrong);
    assert_int_equal(atomic_load(&r.wrong), 0);
    assert_true(atomic_load(&r.reads_ok) > 0);
    /* n = 0 reads nothing and needs no arrays */
    assert_int_equal(kvx_store_keyed_read(NULL, NULL, r.s, NULL, 0, NULL, NULL), 0);
    kvx_store_close(r.s);
    /* shards collected and handles dropped while their O_DIRECT
     * descriptors were opened by racing readers: none left open */
    assert_int_equal(kr_fd_count(), fds);
}

/* A page damaged on disk after its shard's handle checked it (a put of the
 * held key checks it; the bytes rewritten in place, the mtime put back as
 * a bad sector leaves it): kvx_store_keyed_read says KVX_EPAGECRC every
 * time, and a put of the key writes it again (it was skipped as held,
 * for good: a tier's lookups said held and every load failed). */
/* PROMISE: KEYED-14 */
static void test_keyed_put_rewrites_page_damaged_since_checked(void **state)
{
    (void)state;
    char dir[300], path[500];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    const char *k = "rot";
    size_t len = PB, added = 99;
    put_keys(s, NULL, &k, &len, 1);
    assert_int_equal(kvx_store_flush(s), 0);
    uint8_t *page = malloc(PB), *buf = aligned_alloc(4096, PB);
    fill_page(page, PB, k);
    kvx_key q = key_of(k);
    const void *pages[1] = {page};
    assert_int_equal(kvx_store_keyed_put(s, NULL, &q, pages, &len, 1, &added), 0);
    assert_int_equal(added, 0); /* held: the handle checked the page */
    kr_shard_of(dir, path, sizeof path);
    kvx_shard *sh;
    kvx_entry e;
    assert_int_equal(kvx_shard_open(&sh, path, 0), 0);
    assert_int_equal(kvx_shard_entry(&e, sh, 0), 0);
    kvx_shard_close(sh);
    struct stat before;
    assert_int_equal(stat(path, &before), 0);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, (off_t)e.offset + 3), 1);
    b ^= 0x10;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)e.offset + 3), 1);
    struct timespec ts[2] = {before.st_atim, before.st_mtim};
    assert_int_equal(futimens(fd, ts), 0);
    close(fd);
    void *dst = buf;
    size_t cap = PB, got;
    int st;
    assert_int_equal(kvx_store_keyed_read(&st, &got, s, &q, 1, &dst, &cap), 0);
    assert_int_equal(st, KVX_EPAGECRC);
    assert_int_equal(kvx_store_keyed_put(s, NULL, &q, pages, &len, 1, &added), 0);
    assert_int_equal(added, 1); /* written again */
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_keyed_read(&st, &got, s, &q, 1, &dst, &cap), 0);
    assert_int_equal(st, 0);
    assert_memory_equal(buf, page, PB);
    kvx_store_close(s);
    free(page);
    free(buf);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keyed_geometry),
        cmocka_unit_test(test_keyed_catalog_commit_faults),
        cmocka_unit_test(test_keyed_options_padding_ignored),
        cmocka_unit_test(test_key_table_round_trip),
        cmocka_unit_test(test_key_table_damage),
        cmocka_unit_test(test_key_writer_refusals),
        cmocka_unit_test(test_put_get_exists_delete),
        cmocka_unit_test(test_bad_input_writes_nothing),
        cmocka_unit_test(test_kinds_do_not_mix),
        cmocka_unit_test(test_whole_key_compared),
        cmocka_unit_test(test_batches_and_unflushed),
        cmocka_unit_test(test_capacity_eviction_reindex),
        cmocka_unit_test(test_used_pages_outlive_unused),
        cmocka_unit_test(test_damaged_page),
        cmocka_unit_test(test_keyed_read_into_buffers),
        cmocka_unit_test(test_keyed_read_batch_with_damage),
        cmocka_unit_test(test_keyed_read_overlapping_buffers_refused),
        cmocka_unit_test(test_keyed_read_odd_lengths_out_of_cache),
        cmocka_unit_test(test_keyed_read_truncated_under_handle),
        cmocka_unit_test(test_keyed_read_no_fd_leak),
        cmocka_unit_test(test_keyed_read_faults),
        cmocka_unit_test(test_keyed_read_races_writer),
        cmocka_unit_test(test_keyed_put_rewrites_page_damaged_since_checked),
        cmocka_unit_test(test_keyed_contains_no_page_read),
        cmocka_unit_test(test_awkward_keys),
        cmocka_unit_test(test_same_key_twice_in_one_put),
        cmocka_unit_test(test_newest_copy_damaged),
        cmocka_unit_test(test_odd_page_sizes),
        cmocka_unit_test(test_capacity_short_pages),
        cmocka_unit_test(test_readonly_reader),
        cmocka_unit_test(test_keyed_tiny_pages),
        cmocka_unit_test_teardown(test_keyed_name_collision, hook_reset),
    };
    return cmocka_run_group_tests_name("engine/keyed", tests, su_setup, su_teardown);
}
