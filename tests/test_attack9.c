/*
 * test_attack9.c - hostile review of 2a5ed0a: a put that finds all 256
 * shard ids taken (after a flush and a compaction) runs the capacity LRU
 * eviction against a lowered capacity (engine/store_maint.c
 * kvx_st_evict_for_ids, called from engine/store_batch.c st_put_one) so
 * that about 176 shards remain, then retries.
 *
 *  - shards pinned by another batch's held put survive the id eviction,
 *    even when their recency alone would not save them, and that batch's
 *    flush serves them byte for byte;
 *  - a tl.kv.v1 HasBlocks lease pins its blocks through id evictions;
 *  - a tl.kv.v1 stream (a whole batch) that runs the ids out mid-stream;
 *  - batches holding sealed, unflushed files, interleaved with puts that
 *    run the ids out: every batch's flush acknowledges and serves all;
 *  - recency: a block just read survives, the coldest goes;
 *  - s->capacity restored: stat says the real capacity, and the puts
 *    after an id eviction are not evicted against the lowered capacity;
 *  - every OS call of the put that triggers the id eviction failed in
 *    turn (fault.h): no wrong bytes, verify clean, capacity restored, the
 *    store works afterwards and after reopen;
 *  - a keyed store of tiny pages and many flushes;
 *  - reopen serves everything acknowledged and not evicted.
 *
 *  - carry of hot blocks on the id path (test_carry_hot_block; control
 *    test_carry_hot_block_at_capacity: the capacity eviction carries it).
 *
 * Break found, fixed, tested here:
 *  - test_carry_hot_block: shards of six blocks, all 256 ids taken, the
 *    first block of the oldest sequence read just before the put that
 *    runs the ids out. kvx_st_evict_for_ids ran kvx_st_evict with every
 *    id taken; its victims included that block's shard, and the carry of
 *    the hot blocks into a new shard needed an id (kvx_st_rewrite ->
 *    kvx_st_writer_begin: KVX_EFULL), so the block just read was evicted.
 *    The id eviction now takes whole cold shards first, carrying nothing,
 *    and runs the carrying pass only if that freed too few.
 *
 * White-box: faults through the OS seam (fault.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/os.h"
#include "lib/fault.h"
#include "lib/store.h"

#define CAP ((uint64_t)1 << 30)
#define A9_MASK (getenv("A9_M") ? (unsigned)atoi(getenv("A9_M")) : (unsigned)(FAULT_NAME | FAULT_SYNC | FAULT_TRUNC))

/* One block of seq into batch b (NULL: built-in); out_new nullable. */
static int put1(kvx_store *s, kvx_store_batch *b, uint64_t seq, size_t *out_new)
{
    uint32_t t[SU_B];
    uint64_t h;
    su_tokens(t, seq, 1, 0);
    uint8_t *p = su_pages(t, 1, &h, 64);
    int rc = b ? kvx_store_batch_put(b, t, SU_B, p, 1, NULL, out_new) : kvx_store_put(s, t, SU_B, p, 1, NULL, out_new);
    free(p);
    return rc;
}

static int put1_flush(kvx_store *s, uint64_t seq)
{
    int rc = put1(s, NULL, seq, NULL);
    return rc ? rc : kvx_store_flush(s);
}

/* 1 served right, 0 absent, SIZE_MAX wrong bytes */
static size_t served(kvx_store *s, uint64_t seq) { return su_served_prefix(s, seq, 1); }

/* Another batch's held put pins the oldest ten shards; 300 one-block
 * flushes afterwards run the ids out again and again (more than the ~176
 * an id eviction keeps, so their recency cannot save them): the pinned
 * ones stay, the batch's flush serves them, the unpinned old ones went. */
static void test_pins_survive_id_eviction(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s =
        su_create(dir, (su_spec){.capacity = CAP, .shard_bytes = 4096, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    for (uint64_t q = 0; q < 200; q++) assert_int_equal(put1_flush(s, q), 0);
    kvx_store_batch *a;
    assert_int_equal(kvx_store_batch_create(&a, s), 0);
    for (uint64_t q = 0; q < 10; q++) {
        size_t added = 9;
        assert_int_equal(put1(s, a, q, &added), 0);
        assert_int_equal(added, 0); /* held: pinned, not written */
    }
    for (uint64_t q = 200; q < 500; q++) {
        int rc = put1_flush(s, q);
        if (rc) fail_msg("put %" PRIu64 ": %s (%s)", q, kvx_err_name(rc), kvx_last_error());
    }
    kvx_store_stats st = su_stat(s);
    assert_true(st.evictions > 0);
    assert_true(st.shards <= 256);
    assert_int_equal(st.capacity_bytes, CAP);
    for (uint64_t q = 0; q < 10; q++) assert_int_equal(served(s, q), 1);
    assert_int_equal(kvx_store_batch_flush(a), 0);
    for (uint64_t q = 0; q < 10; q++) assert_int_equal(served(s, q), 1);
    kvx_store_batch_destroy(a);
    for (uint64_t q = 10; q < 20; q++) assert_int_equal(served(s, q), 0); /* unpinned and cold: gone */
    for (uint64_t q = 400; q < 500; q++) assert_int_equal(served(s, q), 1);
    su_verify_clean(s);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT | KVX_STORE_NOSYNC);
    for (uint64_t q = 0; q < 10; q++) assert_int_equal(served(s, q), 1);
    for (uint64_t q = 400; q < 500; q++) assert_int_equal(served(s, q), 1);
    for (uint64_t q = 0; q < 500; q++) assert_int_not_equal(served(s, q), SIZE_MAX);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* A tl.kv.v1 HasBlocks lease pins the ten oldest blocks; 300 one-block
 * flushes run the ids out again and again: the leased blocks stay (their
 * recency alone would not keep them), byte for byte; once the lease is
 * gone the next id evictions may take them. */
static void test_lease_pins_survive(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s =
        su_create(dir, (su_spec){.capacity = CAP, .shard_bytes = 4096, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    for (uint64_t q = 0; q < 200; q++) assert_int_equal(put1_flush(s, q), 0);
    uint64_t h[10];
    for (uint64_t q = 0; q < 10; q++) {
        uint32_t t[SU_B];
        su_tokens(t, q, 1, 0);
        kvx_block_hashes(&h[q], t, SU_B, SU_B);
    }
    uint8_t held[10];
    kvx_xfer_lease *l = NULL;
    assert_int_equal(kvx_xfer_has_blocks(held, &l, s, h, 10, NULL, 0, 0, 0), 0);
    for (int i = 0; i < 10; i++) assert_int_equal(held[i], 1);
    for (uint64_t q = 200; q < 500; q++) {
        int rc = put1_flush(s, q);
        if (rc) fail_msg("put %" PRIu64 ": %s (%s)", q, kvx_err_name(rc), kvx_last_error());
    }
    assert_true(su_stat(s).evictions > 0);
    assert_true(su_stat(s).shards <= 256);
    for (uint64_t q = 0; q < 10; q++) assert_int_equal(served(s, q), 1);
    for (uint64_t q = 10; q < 20; q++) assert_int_equal(served(s, q), 0);
    kvx_xfer_lease_destroy(l);
    for (uint64_t q = 500; q < 800; q++) assert_int_equal(put1_flush(s, q), 0);
    for (uint64_t q = 0; q < 800; q++) assert_int_not_equal(served(s, q), SIZE_MAX);
    for (uint64_t q = 700; q < 800; q++) assert_int_equal(served(s, q), 1);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* A tl.kv.v1 stream (a whole batch: nothing published before its finish)
 * of 40 one-block shards into a store already holding 230 one-block
 * shards: the ids run out mid-stream. The id eviction frees published
 * shards (the stream's sealed files are kept), nothing of the stream is
 * served before its finish, the finish acknowledges all 40 and they are
 * served byte for byte, also after reopen. */
static void test_stream_runs_out_midstream(void **state)
{
    (void)state;
    char da[300], db[300];
    su_new_dir(da, sizeof da);
    su_new_dir(db, sizeof db);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 64 << 20;
    o.flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC;
    kvx_store *a = NULL;
    assert_int_equal(kvx_store_create(&a, da, &o), 0);
    kvx_store *b =
        su_create(db, (su_spec){.capacity = CAP, .shard_bytes = 4096, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    enum { NBS = 40 };
    const uint64_t seq = 777;
    assert_int_equal(su_put_seq(a, seq, NBS), 0);
    for (uint64_t q = 0; q < 230; q++) assert_int_equal(put1_flush(b, q), 0);
    uint32_t t[NBS * SU_B];
    uint64_t h[NBS];
    su_tokens(t, seq, NBS, 0);
    kvx_block_hashes(h, t, NBS * SU_B, SU_B);
    static kvx_view views[NBS];
    size_t nv = 0;
    assert_int_equal(kvx_store_prefix(views, &nv, a, t, NBS * SU_B, NBS), 0);
    assert_int_equal(nv, NBS);
    static kvx_xfer_chunk ch[NBS];
    void *env[NBS];
    for (size_t i = 0; i < NBS; i++) {
        size_t len = 0;
        assert_int_equal(kvx_views_export(&env[i], &len, a, &views[i], 1, KVX_ENVELOPE_V1), 0);
        memset(&ch[i], 0, sizeof ch[i]);
        ch[i].kv_format = 1;
        ch[i].block_hash = h[i];
        ch[i].tokens = t + i * SU_B;
        ch[i].n_tokens = SU_B;
        ch[i].payload = env[i];
        ch[i].payload_len = len;
        ch[i].crc32c = kvx_crc32c(0, env[i], len);
    }
    kvx_views_release(views, nv);
    kvx_xfer_stream *st = NULL;
    assert_int_equal(kvx_xfer_stream_create(&st, b), 0);
    for (size_t i = 0; i < NBS; i++) {
        int rc = kvx_xfer_stream_chunk(st, &ch[i], NULL);
        if (rc) fail_msg("chunk %zu: %s (%s)", i, kvx_err_name(rc), kvx_last_error());
    }
    assert_int_equal(su_served_prefix(b, seq, NBS), 0); /* not before its finish */
    assert_true(su_stat(b).evictions > 0);              /* the ids ran out mid-stream */
    assert_int_equal(su_stat(b).capacity_bytes, CAP);
    kvx_xfer_result res;
    assert_int_equal(kvx_xfer_stream_finish(st, &res), 0);
    assert_int_equal(res.blocks_stored, NBS);
    kvx_xfer_stream_destroy(st);
    assert_int_equal(su_served_prefix(b, seq, NBS), NBS);
    for (uint64_t q = 0; q < 230; q++) assert_int_not_equal(served(b, q), SIZE_MAX);
    for (uint64_t q = 200; q < 230; q++) assert_int_equal(served(b, q), 1);
    assert_true(su_stat(b).shards <= 256);
    su_verify_clean(b);
    kvx_store_close(b);
    b = su_reopen(db, KVX_STORE_NOWAIT | KVX_STORE_NOSYNC);
    assert_int_equal(su_served_prefix(b, seq, NBS), NBS);
    for (uint64_t q = 200; q < 230; q++) assert_int_equal(served(b, q), 1);
    su_verify_clean(b);
    kvx_store_close(b);
    for (size_t i = 0; i < NBS; i++) kvx_free(env[i]);
    kvx_store_close(a);
}

/* Two caller batches accumulate sealed, unflushed files (one per block)
 * while the built-in batch's flushes run the ids out: no put fails, and
 * each batch's flush acknowledges and serves every one of its blocks. */
static void test_batches_interleaved(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s =
        su_create(dir, (su_spec){.capacity = CAP, .shard_bytes = 4096, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    kvx_store_batch *b, *c;
    assert_int_equal(kvx_store_batch_create(&b, s), 0);
    assert_int_equal(kvx_store_batch_create(&c, s), 0);
    uint64_t nb = 0, nc = 0;
    for (uint64_t q = 0; q < 360; q++) {
        int rc = put1_flush(s, q);
        if (rc) fail_msg("put %" PRIu64 ": %s (%s)", q, kvx_err_name(rc), kvx_last_error());
        if (q % 8 == 0) {
            rc = put1(s, b, 10000 + nb++, NULL);
            if (rc) fail_msg("b put: %s (%s)", kvx_err_name(rc), kvx_last_error());
        }
        if (q % 12 == 0) {
            rc = put1(s, c, 20000 + nc++, NULL);
            if (rc) fail_msg("c put: %s (%s)", kvx_err_name(rc), kvx_last_error());
        }
    }
    assert_int_equal(su_stat(s).capacity_bytes, CAP);
    assert_true(su_stat(s).evictions > 0);
    assert_int_equal(kvx_store_batch_flush(b), 0);
    assert_int_equal(kvx_store_batch_flush(c), 0);
    for (uint64_t i = 0; i < nb; i++) assert_int_equal(served(s, 10000 + i), 1);
    for (uint64_t i = 0; i < nc; i++) assert_int_equal(served(s, 20000 + i), 1);
    for (uint64_t q = 330; q < 360; q++) assert_int_equal(served(s, q), 1);
    kvx_store_batch_destroy(b);
    kvx_store_batch_destroy(c);
    su_verify_clean(s);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT | KVX_STORE_NOSYNC);
    for (uint64_t i = 0; i < nb; i++) assert_int_equal(served(s, 10000 + i), 1);
    for (uint64_t i = 0; i < nc; i++) assert_int_equal(served(s, 20000 + i), 1);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* The oldest block, read just before the ids run out, survives the id
 * eviction; the next oldest (never read) goes. */
static void test_recency_read_survives(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s =
        su_create(dir, (su_spec){.capacity = CAP, .shard_bytes = 4096, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    for (uint64_t q = 0; q < 256; q++) assert_int_equal(put1_flush(s, q), 0);
    assert_int_equal(su_stat(s).evictions, 0);
    assert_int_equal(served(s, 0), 1); /* read: now the hottest */
    for (uint64_t q = 256; q < 266; q++) assert_int_equal(put1_flush(s, q), 0);
    kvx_store_stats st = su_stat(s);
    assert_true(st.evictions >= 60 && st.evictions <= 120);
    assert_int_equal(st.evictions, st.evicted_blocks);
    assert_int_equal(served(s, 0), 1);
    assert_int_equal(served(s, 1), 0);
    assert_int_equal(served(s, 2), 0);
    for (uint64_t q = 200; q < 266; q++) assert_int_equal(served(s, q), 1);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* Shards of six blocks (32 KiB target, each a flush's): the first block
 * of the oldest sequence is read just before the ids run out. Its shard
 * is the coldest (five of six blocks cold), so the id eviction takes it
 * and should carry the hot block into a new shard, as the capacity
 * eviction does; the carry needs a shard id, and all 256 are taken. */
static void test_carry_hot_block(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = CAP;
    o.shard_bytes = 32768; /* six ~4 KiB entries: above target/2, not merged */
    o.flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC;
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    for (uint64_t q = 0; q < 256; q++) assert_int_equal(su_put_seq(s, q, 6), 0);
    kvx_store_stats st = su_stat(s);
    assert_int_equal(st.shards, 256);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(su_served_prefix(s, 0, 1), 1); /* read: the hottest block */
    int rc = su_put_seq(s, 256, 6);
    if (rc) fail_msg("put: %s (%s)", kvx_err_name(rc), kvx_last_error());
    st = su_stat(s);
    assert_true(st.evictions > 0);
    assert_int_equal(st.capacity_bytes, CAP);
    assert_int_equal(su_served_prefix(s, 256, 6), 6);
    assert_int_equal(su_served_prefix(s, 1, 6), 0); /* cold: gone */
    for (uint64_t q = 0; q < 257; q++) assert_int_not_equal(su_served_prefix(s, q, 6), SIZE_MAX);
    su_verify_clean(s);
    size_t hot = su_served_prefix(s, 0, 1);
    if (getenv("A9_DEBUG")) fprintf(stderr, "carry: hot block served %zu, shards %llu\n", hot, (unsigned long long)st.shards);
    assert_int_not_equal(hot, SIZE_MAX);
    /* the block just read survives (it once went with its shard: the
     * carry found no free id) */
    assert_int_equal(hot, 1);
    kvx_store_close(s);
}

/* The control for test_carry_hot_block: the same store and reads, but a
 * capacity of ~200 of those shards, so the capacity eviction (ids free)
 * runs first: it carries the hot block, which is served afterwards. */
static void test_carry_hot_block_at_capacity(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.shard_bytes = 32768;
    o.flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC;
    kvx_store *s = NULL;
    o.capacity_bytes = 200ull * 28672;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    for (uint64_t q = 0; q < 195; q++) assert_int_equal(su_put_seq(s, q, 6), 0);
    assert_int_equal(su_stat(s).evictions, 0);
    assert_int_equal(su_served_prefix(s, 0, 1), 1);
    for (uint64_t q = 195; q < 215; q++) assert_int_equal(su_put_seq(s, q, 6), 0);
    kvx_store_stats st = su_stat(s);
    assert_true(st.evictions > 0);
    assert_int_equal(su_served_prefix(s, 1, 6), 0);
    if (getenv("A9_DEBUG")) fprintf(stderr, "control: hot %zu ev %llu shards %llu\n", su_served_prefix(s, 0, 1), (unsigned long long)st.evictions, (unsigned long long)st.shards);
    assert_int_equal(su_served_prefix(s, 0, 6), 1); /* its shard went, the read block was carried */
    su_verify_clean(s);
    kvx_store_close(s);
}

/* After an id eviction the capacity is the real one: stat says so, and
 * the next 60 flushes (ids free, far under 1 GiB) evict nothing, which
 * they would against a capacity left at ~176 shards' bytes. After
 * reopen too. */
static void test_capacity_restored(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s =
        su_create(dir, (su_spec){.capacity = CAP, .shard_bytes = 4096, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    for (uint64_t q = 0; q < 257; q++) assert_int_equal(put1_flush(s, q), 0);
    kvx_store_stats st = su_stat(s);
    assert_int_equal(st.capacity_bytes, CAP);
    assert_true(st.evictions > 0);
    uint64_t ev = st.evictions, shards = st.shards;
    assert_true(shards <= 190);
    for (uint64_t q = 257; q < 257 + 60; q++) assert_int_equal(put1_flush(s, q), 0);
    assert_int_equal(kvx_store_gc(s), 0);
    st = su_stat(s);
    assert_int_equal(st.evictions, ev);
    assert_int_equal(st.shards, shards + 60);
    assert_int_equal(st.capacity_bytes, CAP);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT | KVX_STORE_NOSYNC);
    assert_int_equal(su_stat(s).capacity_bytes, CAP);
    assert_int_equal(su_stat(s).shards, shards + 60);
    for (uint64_t q = 257; q < 317; q++) assert_int_equal(served(s, q), 1);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* Every OS call of the put (and flush) that runs the ids out failed in
 * turn, on a copy of a store holding 256 one-block shards: the error
 * surfaces or the put succeeds; either way no block is served wrong,
 * verify is clean, the capacity is the real one, at least the newest
 * ~150 acknowledged blocks are there, and the store takes and serves a
 * new put, also after reopen. */
static void test_fault_in_id_eviction(void **state)
{
    (void)state;
    char base[300];
    su_new_dir(base, sizeof base);
    kvx_store *s =
        su_create(base, (su_spec){.capacity = CAP, .shard_bytes = 4096, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    for (uint64_t q = 0; q < 256; q++) assert_int_equal(put1_flush(s, q), 0);
    kvx_store_close(s);
    char dir[300], cmd[800];
    su_new_dir(dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "cp -a '%s' '%s'", base, dir);
    assert_int_equal(system(cmd), 0);
    s = su_reopen(dir, KVX_STORE_NOWAIT | KVX_STORE_NOSYNC);
    fault_install();
    fault_only = A9_MASK;
    fault_reset(0, EIO, FAULT_ERRNO);
    assert_int_equal(put1_flush(s, 256), 0);
    long ncalls = fault_calls;
    fault_uninstall();
    assert_true(su_stat(s).evictions > 0); /* the counted put ran the id eviction */
    kvx_store_close(s);
    su_rm_rf(dir);
    /* a stride over the eviction's unlinks, then every call of the new
     * shard's seal and publication (the last few) */
    long step = getenv("A9_STEP") ? atol(getenv("A9_STEP")) : ncalls / 12 + 1;
    int nfail = 0;
    for (long k = 1; k <= ncalls; k = k + step < ncalls - 6 || k >= ncalls - 6 ? k + (k >= ncalls - 6 ? 1 : step) : ncalls - 6) {
        su_new_dir(dir, sizeof dir);
        snprintf(cmd, sizeof cmd, "cp -a '%s' '%s'", base, dir);
        assert_int_equal(system(cmd), 0);
        s = su_reopen(dir, KVX_STORE_NOWAIT | KVX_STORE_NOSYNC);
        fault_install();
        fault_only = A9_MASK;
        fault_reset(k, k % 2 ? EIO : ENOSPC, FAULT_ERRNO);
        int rc = put1_flush(s, 256);
        fault_uninstall();
        if (getenv("A9_DEBUG")) fprintf(stderr, "k=%ld/%ld rc=%d hits=%ld op=%s err=%s\n", k, ncalls, rc, fault_hits, fault_hit_op ? fault_hit_op : "-", rc ? kvx_last_error() : "");
        if (rc) nfail++;
        assert_int_equal(su_stat(s).capacity_bytes, CAP);
        size_t n = 0;
        for (uint64_t q = 0; q < 256; q++) {
            size_t v = served(s, q);
            assert_int_not_equal(v, SIZE_MAX);
            n += v;
        }
        assert_true(n >= 150);
        for (uint64_t q = 200; q < 256; q++) assert_int_equal(served(s, q), 1);
        if (!rc) assert_int_equal(served(s, 256), 1);
        su_verify_clean(s);
        assert_int_equal(put1_flush(s, 300), 0);
        assert_int_equal(served(s, 300), 1);
        kvx_store_close(s);
        s = su_reopen(dir, KVX_STORE_NOWAIT | KVX_STORE_NOSYNC);
        assert_int_equal(su_stat(s).capacity_bytes, CAP);
        assert_int_equal(served(s, 300), 1);
        if (!rc) assert_int_equal(served(s, 256), 1);
        for (uint64_t q = 200; q < 256; q++) assert_int_equal(served(s, q), 1);
        su_verify_clean(s);
        kvx_store_close(s);
        su_rm_rf(dir);
    }
    assert_true(nfail > 0);
    su_rm_rf(base);
}

/* A keyed store of 16-byte pages in 4 KiB shards, each put flushed: 400
 * keys, every put acknowledged, the newest 100 served byte for byte, at
 * most 256 shards, the oldest gone; the same after reopen. */
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pins_survive_id_eviction),
        cmocka_unit_test(test_lease_pins_survive),
        cmocka_unit_test(test_stream_runs_out_midstream),
        cmocka_unit_test(test_batches_interleaved),
        cmocka_unit_test(test_recency_read_survives),
        cmocka_unit_test(test_carry_hot_block),
        cmocka_unit_test(test_carry_hot_block_at_capacity),
        cmocka_unit_test(test_capacity_restored),
        cmocka_unit_test(test_fault_in_id_eviction),
        cmocka_unit_test(test_keyed_tiny_pages),
    };
    if (getenv("A9_ONLY")) cmocka_set_test_filter(getenv("A9_ONLY"));
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
