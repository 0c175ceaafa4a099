/*
 * test_keyed.c - keyed pages (DESIGN.md "Keyed pages", kvx.h "Keyed
 * pages"): the key table of a shard (writer and reader rules, damage), a
 * keyed store's put / get / exists / delete, its durability, capacity,
 * eviction, reindex and refusals. White-box for one check: a lookup whose
 * key hash matches but whose key differs is a miss (kvx_st_lookup).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "engine/store.h"
#include "lib/store.h"

#define PB 8192u /* the test store's page size */

static kvx_key key_of(const char *str) { return (kvx_key){str, strlen(str)}; }

/* Page bytes of key k: a function of the key, so any process can check. */
static void fill_page(uint8_t *p, size_t n, const char *k) { su_page(p, n, kvx_key_hash(k, strlen(k))); }

/* ------------------------------------------------------------------ */
/* Format */

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

/* ------------------------------------------------------------------ */
/* Store */

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

/* A damaged page is reported, not served; verify names it. */
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

static void count_notes(void *ctx, const char *what, int code)
{
    (void)what;
    if (code == 0) ++*(int *)ctx;
}

/* Deleted pages stay deleted through compaction, verify calls them a
 * note (not a problem), and gc reclaims their bytes. */
static void test_delete_then_gc_reclaims(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    char names[32][16];
    const char *k[32];
    size_t lens[32];
    for (int i = 0; i < 32; i++) {
        snprintf(names[i], sizeof names[i], "del-%d", i);
        k[i] = names[i];
        lens[i] = PB;
    }
    put_keys(s, NULL, k, lens, 16);
    put_keys(s, NULL, k + 16, lens, 16);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_stats before;
    assert_int_equal(kvx_store_stat(&before, s), 0);
    kvx_key del[24];
    for (int i = 0; i < 24; i++) del[i] = key_of(k[i]);
    size_t deleted = 0;
    assert_int_equal(kvx_store_keyed_delete(s, del, 24, &deleted), 0);
    assert_int_equal(deleted, 24);
    uint64_t bad = 9;
    int notes = 0;
    assert_int_equal(kvx_store_verify(s, &bad, count_notes, &notes), 0);
    assert_int_equal(bad, 0);
    assert_int_equal(notes, 24);
    assert_int_equal(kvx_store_gc(s), 0);
    kvx_store_stats after;
    assert_int_equal(kvx_store_stat(&after, s), 0);
    assert_int_equal(after.blocks, 8);
    assert_true(after.bytes < before.bytes / 2);
    for (int i = 0; i < 32; i++) assert_int_equal(served_ok(s, k[i], PB), i >= 24);
    notes = 0;
    assert_int_equal(kvx_store_verify(s, &bad, count_notes, &notes), 0);
    assert_int_equal(notes, 0);
    /* a reindex now cannot bring them back: their bytes are gone */
    assert_int_equal(kvx_store_reindex(s), 0);
    for (int i = 0; i < 32; i++) assert_int_equal(served_ok(s, k[i], PB), i >= 24);
    kvx_store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keyed_geometry),
        cmocka_unit_test(test_key_table_round_trip),
        cmocka_unit_test(test_key_table_damage),
        cmocka_unit_test(test_key_writer_refusals),
        cmocka_unit_test(test_put_get_exists_delete),
        cmocka_unit_test(test_bad_input_writes_nothing),
        cmocka_unit_test(test_kinds_do_not_mix),
        cmocka_unit_test(test_whole_key_compared),
        cmocka_unit_test(test_batches_and_unflushed),
        cmocka_unit_test(test_capacity_eviction_reindex),
        cmocka_unit_test(test_damaged_page),
        cmocka_unit_test(test_delete_then_gc_reclaims),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
