/*
 * test_store.c - the store's unit tests, one per point of issue 3: layout
 * and permissions, geometry and model checks, name resolution inside the
 * directory, put/flush visibility and dedupe, lookups by coordinate, hash
 * and prefix with lineage checks (a crafted index collision is refused),
 * views that outlive eviction, capacity, compaction, restart, recovery,
 * reindex to the same key set, map growth, writer exclusivity and reader
 * threads. Pages are a pure function of the block hash (store_util.h), so
 * every read is checked byte for byte.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/os.h"
#include "engine/store.h"
#include "index/index.h"
#include "lib/store.h"

/* ------------------------------------------------------------------ tests */

static void test_layout_and_permissions(void **state)
{
    (void)state;
    char dir[300], p[400];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .flags = KVX_STORE_NOWAIT});
    uint64_t h[8];
    su_put_shared(s, 1, 3, 0, h);
    assert_int_equal(kvx_store_flush(s), 0);
    struct stat st;
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    const char *subs[] = {"index", "shards", "staging"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, subs[i]);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0700);
    }
    const char *files[] = {"STORE", "LOCK", "index/data.mdb", "index/lock.mdb"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
    }
    kvx_shard **sh;
    size_t n;
    assert_int_equal(kvx_store_shards(&sh, &n, s), 0);
    assert_int_equal(n, 1);
    assert_int_equal(stat(kvx_shard_path(sh[0]), &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_true(strstr(kvx_shard_path(sh[0]), "/shards/") != NULL);
    kvx_shard_close(sh[0]);
    kvx_free(sh);
    kvx_store_close(s);
    /* creating over an existing directory is refused */
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    assert_int_equal(kvx_store_create(&s, dir, &o), -EEXIST);
    assert_null(s);
}

static void test_geometry_checks(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .flags = KVX_STORE_NOWAIT});
    kvx_store_close(s);
    kvx_geometry g = su_geometry();
    assert_int_equal(kvx_store_open(&s, dir, &g, 0), 0);
    kvx_geometry got;
    assert_int_equal(kvx_store_get_geometry(&got, s), 0);
    assert_memory_equal(&got, &g, sizeof g);
    kvx_store_close(s);
    g.head_dim = 8;
    assert_int_equal(kvx_store_open(&s, dir, &g, 0), KVX_ESHAPE);
    assert_non_null(strstr(kvx_last_error(), "head_dim"));
    g = su_geometry();
    g.quant = KVX_QUANT_E4M3;
    assert_int_equal(kvx_store_open(&s, dir, &g, 0), KVX_ESHAPE);
    assert_non_null(strstr(kvx_last_error(), "quant"));
    g = su_geometry();
    g.model_signature = 42;
    assert_int_equal(kvx_store_open(&s, dir, &g, 0), KVX_EMODEL);
    /* not a store */
    assert_int_equal(kvx_store_open(&s, su_root, NULL, 0), KVX_ENOTFOUND);
    /* bad creation options */
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    char d2[300];
    su_new_dir(d2, sizeof d2);
    o.geometry = su_geometry();
    o.geometry.block_tokens = 0;
    assert_int_equal(kvx_store_create(&s, d2, &o), KVX_EINVALID);
    o.geometry = su_geometry();
    o.geometry.quant = 9;
    assert_int_equal(kvx_store_create(&s, d2, &o), KVX_EQUANT);
    o.geometry = su_geometry();
    o.capacity_bytes = 100;
    assert_int_equal(kvx_store_create(&s, d2, &o), KVX_EINVALID);
    o.capacity_bytes = 0;
    o.version = 77;
    assert_int_equal(kvx_store_create(&s, d2, &o), KVX_EVERSION);
    assert_int_equal(access(d2, F_OK), -1);
}

/* A BF16 store (quant_format 3): pages are stored and served byte for byte
 * (no scale table), the quant is part of the geometry a reopen checks, and
 * a v1 envelope put into it is rounded to bf16 (round to nearest even). */
static void test_bf16_store(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.geometry.quant = KVX_QUANT_BF16;
    o.capacity_bytes = 1 << 20;
    o.flags = KVX_STORE_NOWAIT;
    kvx_store *s;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    uint64_t h[8];
    assert_int_equal(su_put_shared(s, 1, 3, 0, h), 3);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(su_prefix_shared(s, 1, 3, 0, 1), 3); /* the same 64 bytes back */
    kvx_store_close(s);

    kvx_geometry g = o.geometry, got;
    assert_int_equal(kvx_store_open(&s, dir, &g, 0), 0);
    assert_int_equal(kvx_store_get_geometry(&got, s), 0);
    assert_int_equal(got.quant, KVX_QUANT_BF16);
    assert_int_equal(su_prefix_shared(s, 1, 3, 0, 1), 3);

    /* exported as v3 the pages come back bit for bit (L = Hkv = 1, N = B:
     * one layout); as v1 the random bf16 bits do not fit f16: KVX_ELOSSY */
    {
        uint32_t tk[3 * SU_B];
        su_tokens(tk, 1, 3, 0);
        kvx_view pv[3];
        size_t n = 0;
        assert_int_equal(kvx_store_prefix(pv, &n, s, tk, 3 * SU_B, 3), 0);
        assert_int_equal(n, 3);
        void *buf = NULL;
        size_t blen = 0;
        assert_int_equal(kvx_views_export(&buf, &blen, s, pv, n, KVX_ENVELOPE_V3), 0);
        kvx_envelope e3;
        assert_int_equal(kvx_envelope_parse(&e3, buf, blen, &o.geometry), 0);
        assert_int_equal(e3.version, KVX_ENVELOPE_V3);
        for (uint32_t i = 0; i < 3; i++) {
            kvx_envelope_block eb;
            assert_int_equal(kvx_envelope_block_at(&eb, &e3, i), 0);
            assert_memory_equal(eb.payload, pv[i].page, 64);
        }
        kvx_free(buf);
        buf = NULL;
        assert_int_equal(kvx_views_export(&buf, &blen, s, pv, n, KVX_ENVELOPE_V1), KVX_ELOSSY);
        assert_null(buf);
        assert_non_null(strstr(kvx_last_error(), "not exactly representable in f16"));
        kvx_views_release(pv, n);
    }

    /* a v1 block: f16 1.0, 1+2^-10 (rounds to 1.0 in bf16), -2.5, 65504 */
    uint32_t t[SU_B];
    su_tokens(t, 9, 1, 0);
    uint64_t hash = kvx_block_hash(0, t, SU_B);
    uint16_t f16[2 * SU_B * 4] = {0};
    const uint16_t in[4] = {0x3C00, 0x3C01, 0xC100, 0x7BFF};
    const uint16_t want[4] = {0x3F80, 0x3F80, 0xC020, 0x4780}; /* 65504 = 0x477FE000 -> 0x4780 */
    memcpy(f16, in, sizeof in);
    kvx_envelope_block_in bi = {hash, SU_B, f16, NULL};
    size_t len;
    assert_int_equal(kvx_envelope_size(&len, KVX_ENVELOPE_V1, &g, 1), 0);
    uint8_t *env = malloc(len);
    assert_int_equal(kvx_envelope_export(env, len, KVX_ENVELOPE_V1, &g, &bi, 1), 0);
    size_t added = 0;
    assert_int_equal(kvx_store_put_envelope(s, env, len, t, SU_B, &added), 0);
    assert_int_equal(added, 1);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_view v;
    assert_int_equal(kvx_store_get_block(&v, s, t, SU_B), 0);
    uint16_t page[2 * SU_B * 4];
    assert_int_equal(v.page_bytes, sizeof page);
    memcpy(page, v.page, sizeof page);
    kvx_views_release(&v, 1);
    assert_memory_equal(page, want, sizeof want);
    free(env);
    kvx_store_close(s);

    g.quant = KVX_QUANT_FP16;
    assert_int_equal(kvx_store_open(&s, dir, &g, 0), KVX_ESHAPE);
    assert_non_null(strstr(kvx_last_error(), "bf16"));
}

static void test_no_escape(void **state)
{
    (void)state;
    char dir[300], p[400], q[400];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .flags = KVX_STORE_NOWAIT});
    kvx_store_close(s);
    /* shards/ replaced by a symlink to a directory outside */
    snprintf(p, sizeof p, "%s/shards", dir);
    snprintf(q, sizeof q, "%s/elsewhere", su_root);
    assert_int_equal(rename(p, q), 0);
    assert_int_equal(symlink(q, p), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), KVX_EPATH);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), KVX_EPATH);
    unlink(p);
    assert_int_equal(rename(q, p), 0);
    /* STORE as a symlink */
    snprintf(p, sizeof p, "%s/STORE", dir);
    snprintf(q, sizeof q, "%s/STORE.real", dir);
    assert_int_equal(rename(p, q), 0);
    assert_int_equal(symlink("STORE.real", p), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), KVX_EPATH);
    unlink(p);
    assert_int_equal(rename(q, p), 0);
    /* LOCK as a symlink */
    snprintf(p, sizeof p, "%s/LOCK", dir);
    unlink(p);
    assert_int_equal(symlink("/tmp/kvx-lock-escape", p), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), KVX_EPATH);
    unlink(p);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_store_close(s);
}

/* Regular files in dir/sub (hidden ones too). */
static int files_in(const char *dir, const char *sub)
{
    char p[400];
    snprintf(p, sizeof p, "%s/%s", dir, sub);
    DIR *d = opendir(p);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void test_put_flush_visibility(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .flags = KVX_STORE_NOWAIT});
    uint64_t h[8];
    assert_int_equal(su_put_shared(s, 7, 5, 0, h), 5);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.pending_blocks, 5);
    assert_int_equal(st.blocks, 0);
    kvx_view v;
    assert_int_equal(kvx_store_get_hash(&v, s, h[0]), KVX_ENOTFOUND); /* nothing visible before flush */
    /* the pending shard is a temporary file in staging/, not in shards/ */
    assert_int_equal(files_in(dir, "staging"), 1);
    assert_int_equal(files_in(dir, "shards"), 0);
    assert_int_equal(su_prefix_shared(s, 7, 5, 0, 1), 0);
    /* a reader handle in the same process sees nothing either */
    kvx_store *r;
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(su_prefix_shared(r, 7, 5, 0, 1), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(files_in(dir, "staging"), 0); /* sealed and renamed into shards/ */
    assert_int_equal(files_in(dir, "shards"), 1);
    assert_int_equal(su_prefix_shared(s, 7, 5, 0, 1), 5);
    assert_int_equal(su_prefix_shared(r, 7, 5, 0, 1), 5); /* published after r opened */
    /* dedupe: the same blocks are not written again */
    assert_int_equal(su_put_shared(s, 7, 5, 0, h), 0);
    /* a longer sequence with the same prefix writes only its new blocks */
    assert_int_equal(su_put_shared(s, 7, 8, 0, h), 3);
    assert_int_equal(su_put_shared(s, 7, 8, 0, h), 0); /* already pending */
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, 8);
    assert_int_equal(st.pending_blocks, 0);
    assert_int_equal(su_prefix_shared(r, 7, 8, 0, 1), 8);
    /* by hash, batch and coordinate */
    assert_int_equal(kvx_store_get_hash(&v, s, h[6]), 0);
    su_check_view(&v, h[6]);
    kvx_view v2;
    assert_int_equal(kvx_store_get(&v2, s, v.coordinate), 0);
    su_check_view(&v2, h[6]);
    assert_int_equal(KVX_COORD_SPECTRAL(v2.coordinate), 0);
    kvx_view_release(&v2);
    kvx_view_release(&v);
    assert_null(v.shard);
    assert_int_equal(kvx_store_get(&v, s, 0xFFFFFF00u), KVX_ENOTFOUND);
    uint64_t q[3] = {h[1], 12345, h[7]};
    kvx_view vs[3];
    int stt[3];
    assert_int_equal(kvx_store_get_hashes(vs, stt, s, q, 3), 0);
    assert_int_equal(stt[0], 0);
    assert_int_equal(stt[1], KVX_ENOTFOUND);
    assert_int_equal(stt[2], 0);
    su_check_view(&vs[0], h[1]);
    su_check_view(&vs[2], h[7]);
    kvx_views_release(vs, 3);
    /* a prompt diverging after 3 blocks hits 3 */
    uint32_t t[9 * SU_B];
    su_tokens(t, 7, 8, 0);
    t[3 * SU_B + 1] ^= 1;
    kvx_view pv[9];
    size_t n;
    assert_int_equal(kvx_store_prefix(pv, &n, s, t, 8 * SU_B, 9), 0);
    assert_int_equal(n, 3);
    kvx_views_release(pv, n);
    assert_int_equal(kvx_store_prefix(pv, &n, s, t, 8 * SU_B, 2), 0); /* max_views */
    assert_int_equal(n, 2);
    kvx_views_release(pv, n);
    /* hits and misses are counted */
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.hits >= 8 && st.misses >= 5);
    /* readers cannot write */
    assert_int_equal(kvx_store_flush(r), KVX_EINVALID);
    kvx_store_close(r);
    /* unflushed puts are dropped at close */
    su_put_shared(s, 99, 2, 0, h);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(su_prefix_shared(s, 99, 2, 0, 0), 0);
    assert_int_equal(su_prefix_shared(s, 7, 8, 0, 1), 8); /* restart keeps the rest */
    kvx_store_close(s);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .flags = KVX_STORE_NOWAIT});
    uint32_t t[8] = {0};
    uint8_t p[128] = {0};
    assert_int_equal(kvx_store_put(s, t, 7, p, 2, NULL, NULL), KVX_ETOKENS);
    assert_int_equal(kvx_store_put(s, NULL, 8, p, 2, NULL, NULL), KVX_EINVALID);
    assert_int_equal(kvx_store_put(NULL, t, 8, p, 2, NULL, NULL), KVX_EINVALID);
    size_t n;
    assert_int_equal(kvx_store_prefix(NULL, &n, s, t, 8, 1), KVX_EINVALID);
    kvx_store *o = NULL;
    assert_int_equal(kvx_store_open(&o, "", NULL, 0), KVX_EINVALID);
    assert_int_equal(kvx_store_open(NULL, "x", NULL, 0), KVX_EINVALID);
    kvx_store_close(s);
    kvx_store_close(NULL);
    kvx_view_release(NULL);
}

/* An index record that names a block under a hash its lineage does not
 * produce (a crafted collision) is never served by prefix. */
static int craft_record(kvx_store *s, uint64_t hash, uint32_t coord, uint64_t gen)
{
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    kvx_cat_edit_add_block(&e, coord, hash, gen);
    int rc = kvx_cat_apply(s->cat, &e);
    kvx_cat_edit_free(&e);
    return rc;
}

static void test_lineage_collision(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .flags = KVX_STORE_NOWAIT});
    uint64_t ha[8], hq[8];
    su_put_shared(s, 1, 2, 0, ha);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_view v;
    assert_int_equal(kvx_store_get_hash(&v, s, ha[0]), 0);
    /* the query: another sequence; make the index claim its first block
     * hash lives at A's block 0 */
    uint32_t tq[2 * SU_B];
    su_tokens(tq, 2, 2, 0);
    kvx_block_hashes(hq, tq, 2 * SU_B, SU_B);
    uint64_t gen = s->cache[KVX_COORD_SHARD(v.coordinate)].gen;
    uint32_t coord = v.coordinate;
    kvx_view_release(&v);
    /* the entry itself records hash ha[0] != hq[0]: refused by the hash check */
    assert_int_equal(craft_record(s, hq[0], coord, gen), 0);
    kvx_view pv[2];
    size_t n;
    assert_int_equal(kvx_store_prefix(pv, &n, s, tq, 2 * SU_B, 2), 0);
    assert_int_equal(n, 0);
    assert_int_equal(kvx_store_get_hash(&v, s, hq[0]), KVX_ENOTFOUND);
    /* same hash, different lineage: query A's block 1 hash with other tokens */
    uint32_t ta[2 * SU_B];
    su_tokens(ta, 1, 2, 0);
    uint32_t tx[2 * SU_B];
    memcpy(tx, ta, sizeof tx);
    kvx_view one;
    kvx_cat_snap *snap;
    assert_int_equal(kvx_cat_snap_begin(s->cat, &snap), 0);
    tx[SU_B] ^= 0x55; /* block 1 tokens differ, hash claimed equal */
    uint8_t da[2][KVX_DIGEST_BYTES], dx[2][KVX_DIGEST_BYTES];
    kvx_prefix_digests(da, ta, 2 * SU_B, SU_B);
    kvx_prefix_digests(dx, tx, 2 * SU_B, SU_B);
    st_query q_tok = {.hash = ha[1], .parent = ha[0], .toks = tx + SU_B, .digest = dx[1]};
    st_query q_par = {.hash = ha[1], .parent = 777, .toks = ta + SU_B, .digest = da[1]};
    st_query q_dig = {.hash = ha[1], .parent = ha[0], .toks = ta + SU_B, .digest = dx[1]};
    st_query q_ok = {.hash = ha[1], .parent = ha[0], .toks = ta + SU_B, .digest = da[1]};
    assert_int_equal(kvx_st_lookup(s, snap, &q_tok, &one), KVX_ENOTFOUND);
    assert_int_equal(kvx_st_lookup(s, snap, &q_par, &one), KVX_ENOTFOUND); /* wrong parent */
    assert_int_equal(kvx_st_lookup(s, snap, &q_dig, &one), KVX_ENOTFOUND); /* wrong digest */
    assert_int_equal(kvx_st_lookup(s, snap, &q_ok, &one), 0);
    kvx_cat_snap_end(snap);
    su_check_view(&one, ha[1]);
    kvx_view_release(&one);
    kvx_store_close(s);
}

static void test_capacity_eviction_and_views(void **state)
{
    (void)state;
    char dir[300];
    /* shards of ~16 blocks, room for ~6 of them */
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 450 << 10, .shard_bytes = 70 << 10, .flags = KVX_STORE_NOWAIT});
    kvx_store_stats st;
    uint64_t h[16];
    su_put_shared(s, 0, 16, 0, h);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_view held;
    assert_int_equal(kvx_store_get_hash(&held, s, h[3]), 0);
    for (uint64_t q = 1; q < 40; q++) {
        su_put_shared(s, q, 16, 0, h);
        assert_int_equal(kvx_store_flush(s), 0);
        assert_int_equal(kvx_store_stat(&st, s), 0);
        assert_true(st.bytes <= st.capacity_bytes);
    }
    assert_true(st.evictions > 0);
    assert_true(st.evicted_blocks > 0);
    /* the oldest sequence is gone, the newest is whole */
    assert_int_equal(su_prefix_shared(s, 0, 16, 0, 1), 0);
    assert_int_equal(su_prefix_shared(s, 39, 16, 0, 1), 16);
    /* the view taken before eviction still reads the right bytes */
    uint32_t t[16 * SU_B];
    uint64_t h0[16];
    su_tokens(t, 0, 16, 0);
    kvx_block_hashes(h0, t, 16 * SU_B, SU_B);
    su_check_view(&held, h0[3]);
    kvx_view_release(&held);
    /* every prefix served is whole: no block without its predecessors */
    for (uint64_t q = 0; q < 40; q++) {
        size_t n = su_prefix_shared(s, q, 16, 0, 1);
        assert_true(n == 0 || n <= 16);
    }
    kvx_store_close(s);
}

static void test_hot_blocks_carried(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 450 << 10, .shard_bytes = 70 << 10, .flags = KVX_STORE_NOWAIT});
    uint64_t h[16];
    su_put_shared(s, 0, 16, 0, h);
    assert_int_equal(kvx_store_flush(s), 0);
    for (uint64_t q = 1; q < 60; q++) {
        assert_int_equal(su_prefix_shared(s, 0, 16, 0, 1), 16); /* seq 0 stays hot */
        su_put_shared(s, q, 16, 0, h);
        assert_int_equal(kvx_store_flush(s), 0);
    }
    assert_int_equal(su_prefix_shared(s, 0, 16, 0, 1), 16);
    assert_int_equal(su_prefix_shared(s, 1, 16, 0, 1), 0); /* cold: gone */
    kvx_store_close(s);
}

/* Recency is per block: a shard's cold blocks go while its hot ones are
 * carried, and putting a held block again counts as a use of it. */
static void test_recency_per_block(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 450 << 10, .shard_bytes = 70 << 10, .flags = KVX_STORE_NOWAIT});
    uint64_t h[16];
    su_put_shared(s, 0, 8, 0, h); /* A: looked up from now on */
    su_put_shared(s, 1, 8, 0, h); /* B: in the same shard, never used again */
    su_put_shared(s, 2, 8, 0, h); /* C: only ever put again */
    assert_int_equal(kvx_store_flush(s), 0);
    for (uint64_t q = 3; q < 60; q++) {
        assert_int_equal(su_prefix_shared(s, 0, 8, 0, 1), 8);
        assert_int_equal(su_put_shared(s, 2, 8, 0, h), 0); /* held: nothing new */
        su_put_shared(s, q, 16, 0, h);
        assert_int_equal(kvx_store_flush(s), 0);
    }
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.evictions > 0);
    assert_int_equal(su_prefix_shared(s, 0, 8, 0, 1), 8);
    assert_int_equal(su_prefix_shared(s, 2, 8, 0, 1), 8);
    assert_int_equal(su_prefix_shared(s, 1, 8, 0, 1), 0);
    kvx_store_close(s);
}

static void test_small_flushes_compacted(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20, .flags = KVX_STORE_NOWAIT});
    uint64_t h[4];
    /* 300 one-block flushes: would need 300 shard ids without compaction */
    for (uint64_t q = 0; q < 300; q++) {
        su_put_shared(s, q, 1, 0, h);
        int rc = kvx_store_flush(s);
        if (rc) fprintf(stderr, "flush %llu: %s\n", (unsigned long long)q, kvx_last_error());
        assert_int_equal(rc, 0);
    }
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.shards <= ST_COMPACT_AT + 1);
    assert_true(st.compactions > 0);
    assert_int_equal(st.blocks, 300);
    assert_int_equal(kvx_store_gc(s), 0);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    /* after gc at most one shard is below half the target size */
    assert_true(st.shards >= 1);
    assert_true(st.shards <= st.bytes / (st.shard_bytes / 2) + 1);
    assert_int_equal(st.blocks, 300);
    for (uint64_t q = 0; q < 300; q++) assert_int_equal(su_prefix_shared(s, q, 1, 0, 1), 1);
    uint64_t bad = 9;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    assert_int_equal(bad, 0);
    kvx_store_close(s);
}

/* Key sets of the coord and hash databases, as sorted text, for comparing. */
static char *index_keys(kvx_store *s)
{
    size_t cap = 1 << 20, len = 0;
    char *out = malloc(cap);
    /* the records themselves, through LMDB (tests may) */
    kvx_index *ix = kvx_cat_index(s->cat);
    MDB_txn *txn;
    assert_int_equal(kvx_idx_read_begin(ix, &txn), 0);
    MDB_dbi dbs[2] = {ix->coord, ix->hash};
    for (int d = 0; d < 2; d++) {
        MDB_cursor *c;
        assert_int_equal(mdb_cursor_open(txn, dbs[d], &c), 0);
        MDB_val k, v;
        int rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
        while (rc == 0) {
            uint64_t key = 0;
            memcpy(&key, k.mv_data, k.mv_size);
            uint32_t c32;
            memcpy(&c32, v.mv_data, 4);
            if (len + 64 > cap) out = realloc(out, cap *= 2);
            len += (size_t)snprintf(out + len, cap - len, "%d:%016llx:%08x\n", d, (unsigned long long)key,
                                    d ? c32 : (uint32_t)0);
            rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
        }
        mdb_cursor_close(c);
    }
    kvx_idx_read_end(ix, txn);
    return out;
}

static void test_reindex(void **state)
{
    (void)state;
    char dir[300], p[400];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 8 << 20, .shard_bytes = 40 << 10, .flags = KVX_STORE_NOWAIT});
    uint64_t h[16];
    for (uint64_t q = 0; q < 12; q++) {
        su_put_shared(s, q, 9, 3, h);
        assert_int_equal(kvx_store_flush(s), 0);
    }
    kvx_store_stats before, after;
    assert_int_equal(kvx_store_stat(&before, s), 0);
    char *k1 = index_keys(s);
    assert_int_equal(kvx_store_reindex(s), 0);
    char *k2 = index_keys(s);
    assert_string_equal(k1, k2);
    assert_int_equal(kvx_store_stat(&after, s), 0);
    assert_int_equal(after.blocks, before.blocks);
    assert_int_equal(after.shards, before.shards);
    kvx_store_close(s);
    /* a lost index: delete it, open rebuilds it from the shards */
    snprintf(p, sizeof p, "%s/index", dir);
    su_rm_rf(p);
    assert_int_equal(mkdir(p, 0700), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    char *k3 = index_keys(s);
    assert_string_equal(k1, k3);
    for (uint64_t q = 0; q < 12; q++) assert_int_equal(su_prefix_shared(s, q, 9, 3, 1), 9);
    kvx_store_close(s);
    free(k1);
    free(k2);
    free(k3);
}

static void test_recovery(void **state)
{
    (void)state;
    char dir[300], p[400];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 8 << 20, .shard_bytes = 40 << 10, .flags = KVX_STORE_NOWAIT});
    uint64_t h[16];
    for (uint64_t q = 0; q < 4; q++) {
        su_put_shared(s, q, 8, 0, h);
        assert_int_equal(kvx_store_flush(s), 0);
    }
    kvx_shard **sh;
    size_t n;
    assert_int_equal(kvx_store_shards(&sh, &n, s), 0);
    assert_true(n >= 2);
    char victim[300], damaged[300];
    snprintf(victim, sizeof victim, "%s", kvx_shard_path(sh[0]));
    snprintf(damaged, sizeof damaged, "%s", kvx_shard_path(sh[1]));
    uint32_t victim_blocks = kvx_shard_get_info(sh[0])->num_blocks;
    for (size_t i = 0; i < n; i++) kvx_shard_close(sh[i]);
    kvx_free(sh);
    kvx_store_stats st0;
    assert_int_equal(kvx_store_stat(&st0, s), 0);
    kvx_store_close(s);
    /* leftovers: a staging file, an unpublished sealed shard */
    snprintf(p, sizeof p, "%s/staging/0000000000000099.kvx", dir);
    FILE *f = fopen(p, "w");
    fputs("junk", f);
    fclose(f);
    char orphan[400];
    snprintf(orphan, sizeof orphan, "%s/shards/00000000000000ff.kvx", dir);
    f = fopen(orphan, "w");
    fputs("sealed but never published", f);
    fclose(f);
    /* a registered shard goes missing, another is damaged in its tables */
    assert_int_equal(unlink(victim), 0);
    int fd = open(damaged, O_RDWR);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, 64 + 4), 1); /* coordinate table: token_count */
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, 64 + 4), 1);
    close(fd);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_VERIFY), 0);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(access(orphan, F_OK), -1);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.dropped_shards, 2);
    assert_int_equal(st.shards, st0.shards - 2);
    assert_true(st.blocks < st0.blocks - victim_blocks + 1);
    uint64_t bad = 9;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    assert_int_equal(bad, 0);
    kvx_store_close(s);
}

static void test_writer_exclusive(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .flags = KVX_STORE_NOWAIT});
    kvx_store *w2 = NULL, *r = NULL;
    assert_int_equal(kvx_store_open(&w2, dir, NULL, KVX_STORE_NOWAIT), KVX_EBUSY);
    assert_null(w2);
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
    kvx_store_close(r);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&w2, dir, NULL, KVX_STORE_NOWAIT), 0);
    kvx_store_close(w2);
}

static void test_envelope_put(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .flags = KVX_STORE_NOWAIT});
    kvx_geometry g = su_geometry();
    uint32_t t[3 * SU_B + 2];
    su_tokens(t, 5, 3, 0);
    t[3 * SU_B] = 1;
    t[3 * SU_B + 1] = 2;
    uint64_t h[3];
    kvx_block_hashes(h, t, 3 * SU_B, SU_B);
    size_t P = kvx_envelope_payload_bytes(1, &g);
    uint8_t *pay = calloc(4, P);
    kvx_envelope_block_in in[4];
    for (int i = 0; i < 4; i++) {
        for (size_t j = 0; j < P / 2; j++) ((uint16_t *)(pay + i * P))[j] = kvx_f32_to_f16((float)(i * 100 + (int)j % 50));
        in[i].hash = i < 3 ? h[i] : 0;
        in[i].n_tokens = i < 3 ? SU_B : 2;
        in[i].payload = pay + i * P;
        in[i].scales = NULL;
    }
    size_t len;
    assert_int_equal(kvx_envelope_size(&len, 1, &g, 4), 0);
    uint8_t *env = malloc(len);
    assert_int_equal(kvx_envelope_export(env, len, 1, &g, in, 4), 0);
    size_t added;
    /* tokens whose hashes differ from the envelope's are refused */
    uint32_t bad[3 * SU_B];
    memcpy(bad, t, sizeof bad);
    bad[0] ^= 1;
    assert_int_equal(kvx_store_put_envelope(s, env, len, bad, 3 * SU_B, &added), KVX_EHASH);
    assert_int_equal(kvx_store_put_envelope(s, env, len, t, 3 * SU_B + 2, &added), 0);
    assert_int_equal(added, 3);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_view v[4];
    size_t n;
    assert_int_equal(kvx_store_prefix(v, &n, s, t, 3 * SU_B + 2, 4), 0);
    assert_int_equal(n, 3);
    kvx_envelope e;
    assert_int_equal(kvx_envelope_parse(&e, env, len, NULL), 0);
    for (uint32_t i = 0; i < 3; i++) {
        kvx_envelope_block blk;
        assert_int_equal(kvx_envelope_block_at(&blk, &e, i), 0);
        uint8_t page[64];
        assert_int_equal(kvx_envelope_payload_to_page(page, NULL, &g, &e, &blk), 0);
        assert_memory_equal(v[i].page, page, 64);
    }
    kvx_views_release(v, n);
    /* without tokens: put by hash only, unverified: never served by hash
     * alone (KVX_EUNVERIFIED) nor by prefix, reachable by coordinate */
    for (int i = 0; i < 3; i++) in[i].hash = h[i] ^ 0xABCDEF;
    assert_int_equal(kvx_envelope_export(env, len, 1, &g, in, 4), 0);
    assert_int_equal(kvx_store_put_envelope(s, env, len, NULL, 0, &added), 0);
    assert_int_equal(added, 3);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_view one;
    assert_int_equal(kvx_store_get_hash(&one, s, h[2] ^ 0xABCDEF), KVX_EUNVERIFIED);
    assert_non_null(strstr(kvx_last_error(), "unverified"));
    assert_int_equal(kvx_store_put_envelope(s, env, 10, NULL, 0, &added), KVX_EFORMAT);
    free(env);
    free(pay);
    kvx_store_close(s);
}

static void test_map_growth(void **state)
{
    (void)state;
    char dir[300];
    setenv("KVX_INDEX_MAP_BYTES", "131072", 1);
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 512 << 20, .shard_bytes = 4 << 20, .flags = KVX_STORE_NOWAIT});
    unsetenv("KVX_INDEX_MAP_BYTES");
    uint64_t h[64];
    for (uint64_t q = 0; q < 60; q++) su_put_shared(s, q, 64, 0, h);
    int rc = kvx_store_flush(s);
    if (rc) fprintf(stderr, "%s\n", kvx_last_error());
    assert_int_equal(rc, 0);
    MDB_envinfo info;
    mdb_env_info(kvx_cat_index(s->cat)->env, &info);
    assert_true(info.me_mapsize > 131072);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, 60 * 64);
    assert_int_equal(su_prefix_shared(s, 59, 64, 0, 1), 64);
    kvx_store_close(s);
}

typedef struct reader_arg {
    kvx_store *s;
    int stop;
    int bad;
    long lookups;
} reader_arg;

static void *reader_thread(void *p)
{
    reader_arg *a = p;
    while (!__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE)) {
        for (uint64_t q = 0; q < 20; q++) {
            uint32_t t[8 * SU_B];
            uint64_t h[8];
            su_tokens(t, q, 8, 2);
            kvx_block_hashes(h, t, 8 * SU_B, SU_B);
            kvx_view v[8];
            size_t n;
            if (kvx_store_prefix(v, &n, a->s, t, 8 * SU_B, 8) != 0) a->bad++;
            for (size_t i = 0; i < n; i++) {
                uint8_t want[64];
                su_page(want, 64, h[i]);
                if (v[i].hash != h[i] || memcmp(v[i].page, want, 64)) a->bad++;
            }
            kvx_views_release(v, n);
            a->lookups++;
        }
    }
    return NULL;
}

static void test_reader_threads(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 300 << 10, .shard_bytes = 40 << 10, .flags = KVX_STORE_NOWAIT});
    kvx_store *r;
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
    reader_arg a[3] = {{s, 0, 0, 0}, {r, 0, 0, 0}, {r, 0, 0, 0}};
    pthread_t th[3];
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, reader_thread, &a[i]);
    uint64_t h[8];
    for (int round = 0; round < 6; round++)
        for (uint64_t q = 0; q < 20; q++) {
            su_put_shared(s, q + (uint64_t)round * 4, 8, 2, h);
            assert_int_equal(kvx_store_flush(s), 0);
        }
    for (int i = 0; i < 3; i++) {
        __atomic_store_n(&a[i].stop, 1, __ATOMIC_RELEASE);
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].bad, 0);
        assert_true(a[i].lookups > 0);
    }
    kvx_store_close(r);
    kvx_store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_and_permissions),
        cmocka_unit_test(test_geometry_checks),
        cmocka_unit_test(test_bf16_store),
        cmocka_unit_test(test_no_escape),
        cmocka_unit_test(test_put_flush_visibility),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_lineage_collision),
        cmocka_unit_test(test_capacity_eviction_and_views),
        cmocka_unit_test(test_hot_blocks_carried),
        cmocka_unit_test(test_recency_per_block),
        cmocka_unit_test(test_small_flushes_compacted),
        cmocka_unit_test(test_reindex),
        cmocka_unit_test(test_recovery),
        cmocka_unit_test(test_writer_exclusive),
        cmocka_unit_test(test_envelope_put),
        cmocka_unit_test(test_map_growth),
        cmocka_unit_test(test_reader_threads),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
