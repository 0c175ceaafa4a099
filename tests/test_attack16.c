/*
 * test_attack16.c - findings of the hostile reviews of 2026-12-01 (engine
 * M4, L1 and H1 (d), read-path #5) and of the fix of H1 (d), each a test
 * that failed on the code before its fix:
 *  - test_legacy_child_of_collided_parent: reindex derived a digest for a
 *    block written before digests from ANY held block whose hash is its
 *    parent hash. With the true parent gone and another prompt's block
 *    held under the same chained FNV hash (a crafted collision), the
 *    child was verified under that other prompt and served as its KV. A
 *    digest is derived now only from a parent in the child's own shard,
 *    before it (the same put wrote both); the rest stay unverified;
 *  - test_nosync_handle_does_not_unsync_writer: one LMDB environment is
 *    shared by the process's handles of a store; the first opener's
 *    KVX_STORE_NOSYNC applied to every later handle, so a writer opened
 *    after a READONLY|NOSYNC reader acknowledged commits never synced;
 *  - test_carried_child_of_collided_parent: the same, after a rewrite put
 *    the colliding block right before the child in one digest shard;
 *  - test_keyed_newest_copy_served: a key with two copies (a dropped
 *    shard back from a backup, or from a drop a crash cut before its
 *    unlink was durable, adopted) was served the copy first in coordinate
 *    byte order, its deleted older page as often as not; an adopted shard
 *    no longer indexes a key the catalog indexes (review H1 (d));
 *  - test_keyed_rewrite_skips_replaced_copy: a rewrite of such an adopted
 *    shard (gc, half its pages deleted) carried the replaced copy into a
 *    new shard;
 *  - test_keyed_put_after_damage_lower_gen: a first fix (the newest
 *    generation answers) refused an acknowledged copy at a lower
 *    generation and let gc drop it;
 *  - test_keyed_adoptee_beside_damaged_copy: the adoption rule skipped a
 *    sound adopted copy beside a damaged catalog copy;
 *  - test_salvage_keeps_no_collided_parent: gc kept a salvaged pre-digest
 *    shard pre-digest after leaving out a collided parent;
 *  - test_keyed_adoptee_waits_when_unjudged: an adoptee left for the next
 *    recovery had its shard byte taken by a flush meanwhile, and was then
 *    quarantined as held by that newer shard;
 *  - test_shard_swapped_for_symlink: a shard swapped for a symlink after
 *    the store checked its name was read through it (review L5);
 *  - test_fetch_lets_go_of_deleted_shards: a long-lived kvx_fetch kept up
 *    to 64 shard files open after they were deleted (their disk space
 *    held until the handle was destroyed); they are closed at a release.
 *
 * White-box: the index's environment (index/index.h) for the flag.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/fault.h"
#include "lib/io.h"
#include "lib/store.h"
#include "common/os.h"
#include "format/format.h"
#include "index/index.h"

enum { PB = 64 }; /* su_geometry's page of SU_B tokens */


static int group_setup(void **state) { return io_setup(state) || su_setup(state) ? -1 : 0; }

static int group_teardown(void **state)
{
    io_teardown(state);
    return su_teardown(state);
}

/* A shard as a store before the digest wrote it (hashes and lineage, no
 * digest table): nb blocks of tokens t chained from parent0. */
static void write_old_shard(const char *dir, uint64_t gen, uint8_t byte, const uint32_t *t, size_t nb,
                            const uint8_t *pages, uint64_t parent0)
{
    char path[600];
    snprintf(path, sizeof path, "%s/shards/%016" PRIx64 ".kvx", dir, gen);
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.shard_id = byte;
    o.max_entries = 16;
    o.flags = KVX_FLAG_HASHES | KVX_FLAG_LINEAGE;
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    uint64_t parent = parent0;
    for (size_t i = 0; i < nb; i++) {
        kvx_entry_in e;
        memset(&e, 0, sizeof e);
        e.radix_block = (uint16_t)i;
        e.token_count = SU_B;
        e.page = pages + i * 64;
        e.tokens = t + i * SU_B;
        e.parent = parent;
        e.hash = kvx_block_hash(parent, e.tokens, SU_B);
        parent = e.hash;
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    }
    assert_int_equal(kvx_shard_writer_seal(w), 0);
}

/* A digest shard as a rewrite (eviction's carry, compaction) leaves it:
 * block p (tokens pt, parent 0) with its digest, then block c (tokens ct,
 * parent hash parent_c) carried without one. */
static void write_carried_shard(const char *dir, uint64_t gen, uint8_t byte, const uint32_t *pt, const uint8_t *pp,
                                const uint32_t *ct, const uint8_t *cp, uint64_t parent_c)
{
    char path[600];
    snprintf(path, sizeof path, "%s/shards/%016" PRIx64 ".kvx", dir, gen);
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.shard_id = byte;
    o.max_entries = 4;
    o.flags = KVX_FLAG_HASHES | KVX_FLAG_LINEAGE | KVX_FLAG_DIGEST;
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    uint8_t dp[KVX_DIGEST_BYTES];
    kvx_prefix_digest_next(dp, NULL, pt, SU_B);
    kvx_entry_in e;
    memset(&e, 0, sizeof e);
    e.token_count = SU_B;
    e.page = pp;
    e.tokens = pt;
    e.hash = kvx_block_hash(0, pt, SU_B);
    e.digest = dp;
    assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    memset(&e, 0, sizeof e);
    e.radix_block = 1;
    e.token_count = SU_B;
    e.page = cp;
    e.tokens = ct;
    e.parent = parent_c;
    e.hash = kvx_block_hash(parent_c, ct, SU_B);
    assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    assert_int_equal(kvx_shard_writer_seal(w), 0);
}

/* Leading blocks served for t (nb blocks), each checked against pages. */
static size_t served_exact(kvx_store *s, const uint32_t *t, size_t nb, const uint8_t *pages)
{
    kvx_view v[8];
    size_t n = 0;
    assert_true(nb <= 8);
    assert_int_equal(kvx_store_prefix(v, &n, s, t, nb * SU_B, nb), 0);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(v[i].page_bytes, PB);
        assert_memory_equal(v[i].page, pages + i * PB, PB);
    }
    kvx_views_release(v, n);
    return n;
}

/* M4. An old store held prompt P1 = a || c: block C (tokens c) with
 * parent hash H(a). P1's first block is gone (evicted, lost); prompt
 * P2 = b is held, put with its tokens (verified), and H(b) == H(a): what
 * a crafted FNV-1a collision gives (collide.h finds one in seconds; here
 * the legacy shard simply records the parent hash H(b), which is all the
 * store can see of such a collision). Reindex had one candidate parent
 * for C, P2's block, derived C's digest from it and served C's KV
 * (computed under a) as the continuation of b. A block of the same
 * legacy shard whose parent precedes it is still derived and served. */
static void test_legacy_child_of_collided_parent(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    enum { NC = 3 };
    uint32_t b[SU_B], c[SU_B], x[NC * SU_B], bc[2 * SU_B];
    uint64_t hb[1], hx[NC], hbc[2];
    su_tokens(b, 501, 1, 0);
    su_tokens(c, 502, 1, 0);
    su_tokens(x, 503, NC, 0);
    uint8_t *pb = su_pages(b, 1, hb, PB), *px = su_pages(x, NC, hx, PB);
    assert_int_equal(kvx_store_put(s, b, SU_B, pb, 1, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    /* C's KV: bytes of another prompt (a || c), not of b || c */
    uint8_t pc[PB];
    su_page(pc, PB, 0xa11ce);
    write_old_shard(dir, 100, 200, c, 1, pc, hb[0]);
    write_old_shard(dir, 101, 201, x, NC, px, 0); /* a legacy prompt, whole in its shard */

    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.unverified, 1 + NC);
    assert_int_equal(kvx_store_reindex(s), 0);
    memcpy(bc, b, sizeof b);
    memcpy(bc + SU_B, c, sizeof c);
    kvx_block_hashes(hbc, bc, 2 * SU_B, SU_B);
    kvx_view v[2];
    size_t n = 0;
    assert_int_equal(kvx_store_prefix(v, &n, s, bc, 2 * SU_B, 2), 0);
    if (n == 2 && memcmp(v[1].page, pc, PB) == 0)
        fail_msg("DEFECT rule 1: reindex verified a legacy block under another prompt's colliding parent; "
                 "b || c was served a || c's KV");
    assert_int_equal(n, 1);
    assert_memory_equal(v[0].page, pb, PB);
    kvx_views_release(v, n);
    kvx_view one;
    assert_int_equal(kvx_store_get_hash(&one, s, hbc[1]), KVX_EUNVERIFIED);
    /* the whole legacy prompt is derived from its block 0 and served */
    assert_int_equal(served_exact(s, x, NC, px), NC);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.unverified, 1);
    kvx_store_close(s);
    /* and after a reopen, nothing changed its mind */
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(kvx_store_prefix(v, &n, s, bc, 2 * SU_B, 2), 0);
    assert_int_equal(n, 1);
    kvx_views_release(v, n);
    kvx_store_close(s);
    free(pb);
    free(px);
}

/* M4 again, through a rewrite: an eviction carry or a compaction puts the
 * hot blocks of several shards side by side in one digest shard, so the
 * colliding block b can land right before the legacy child C, carried
 * without a digest. "A parent in its own shard before it" then held, and
 * reindex verified C under b. A child in a digest shard is never derived
 * now (only in a shard pre-digest kvx wrote). */
static void test_carried_child_of_collided_parent(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    uint32_t b[SU_B], c[SU_B], bc[2 * SU_B];
    uint64_t hb[1], hbc[2];
    su_tokens(b, 601, 1, 0);
    su_tokens(c, 602, 1, 0);
    uint8_t *pb = su_pages(b, 1, hb, PB);
    assert_int_equal(kvx_store_put(s, b, SU_B, pb, 1, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    uint8_t pc[PB];
    su_page(pc, PB, 0xbad5eed);
    write_carried_shard(dir, 100, 200, b, pb, c, pc, hb[0]);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.unverified, 1);
    assert_int_equal(kvx_store_reindex(s), 0);
    memcpy(bc, b, sizeof b);
    memcpy(bc + SU_B, c, sizeof c);
    kvx_block_hashes(hbc, bc, 2 * SU_B, SU_B);
    kvx_view v[2];
    size_t n = 0;
    assert_int_equal(kvx_store_prefix(v, &n, s, bc, 2 * SU_B, 2), 0);
    if (n == 2) fail_msg("DEFECT rule 1: reindex verified a carried block under the colliding block beside it");
    assert_int_equal(n, 1);
    assert_memory_equal(v[0].page, pb, PB);
    kvx_views_release(v, n);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.unverified, 1);
    kvx_store_close(s);
    free(pb);
}

/* gc keeps a pre-digest shard pre-digest when it salvages or trims it, so
 * reindex can still derive its blocks; but not when a block it leaves out
 * is the parent of one it keeps. The legacy shard holds X (tokens
 * COLL_A), A (COLL_B: the same hash) and C (parent that hash, its KV
 * computed after A). C is unverified (two candidate parents). A's page
 * rots; gc's salvage keeps X and C, and with the shard still pre-digest
 * the next reindex derived C from X: X || c was served A || c's KV. */
static void test_salvage_keeps_no_collided_parent(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    kvx_store_close(s);
    uint32_t c[SU_B], xc[2 * SU_B];
    su_tokens(c, 703, 1, 0);
    uint64_t hx = kvx_block_hash(0, COLL_A, SU_B);
    assert_true(hx == kvx_block_hash(0, COLL_B, SU_B));
    uint8_t px[PB], pa[PB], pc[PB];
    su_page(px, PB, 0x701);
    su_page(pa, PB, 0x702);
    su_page(pc, PB, 0x703);
    char path[600];
    snprintf(path, sizeof path, "%s/shards/%016" PRIx64 ".kvx", dir, (uint64_t)100);
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.shard_id = 200;
    o.max_entries = 4;
    o.flags = KVX_FLAG_HASHES | KVX_FLAG_LINEAGE;
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    const uint32_t *toks[3] = {COLL_A, COLL_B, c};
    const uint8_t *pages[3] = {px, pa, pc};
    const uint64_t parents[3] = {0, 0, hx};
    for (int i = 0; i < 3; i++) {
        kvx_entry_in e;
        memset(&e, 0, sizeof e);
        e.radix_block = (uint16_t)i;
        e.token_count = SU_B;
        e.page = pages[i];
        e.tokens = toks[i];
        e.parent = parents[i];
        e.hash = kvx_block_hash(parents[i], toks[i], SU_B);
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    }
    assert_int_equal(kvx_shard_writer_seal(w), 0);
    assert_int_equal(su_flip_page_byte(path, 1), 0); /* A's page */
    memcpy(xc, COLL_A, sizeof COLL_A);
    memcpy(xc + SU_B, c, sizeof c);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_view v[2];
    size_t n = 0;
    assert_int_equal(kvx_store_gc(s), 0); /* salvage: A left out */
    assert_int_equal(kvx_store_reindex(s), 0);
    assert_int_equal(kvx_store_prefix(v, &n, s, xc, 2 * SU_B, 2), 0);
    if (n == 2)
        fail_msg("DEFECT rule 1: after gc left out a collided parent, reindex derived its child from the other");
    assert_int_equal(n, 1);
    assert_memory_equal(v[0].page, px, PB);
    kvx_views_release(v, n);
    kvx_store_close(s);
}

static int env_nosync(kvx_index *ix)
{
    unsigned fl = 0;
    assert_int_equal(mdb_env_get_flags(ix->env, &fl), 0);
    return (fl & MDB_NOSYNC) != 0;
}

/* L1. The environment is the process's, keyed by the index directory: a
 * READONLY|NOSYNC handle opened first made the writer opened after it
 * commit without syncing, and acknowledge those commits. */
static void test_nosync_handle_does_not_unsync_writer(void **state)
{
    (void)state;
    char dir[300], index[400];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    kvx_store_close(s);
    snprintf(index, sizeof index, "%s/index", dir);

    /* the environment, as the store's handles share it */
    kvx_index *fast = NULL, *durable = NULL;
    assert_int_equal(kvx_idx_open(&fast, index, 0, 1), 0);
    assert_true(env_nosync(fast));
    assert_int_equal(kvx_idx_open(&durable, index, 0, 0), 0);
    assert_ptr_equal(fast, durable); /* one environment */
    if (env_nosync(durable)) fail_msg("DEFECT: a handle without NOSYNC joined a NOSYNC environment and stays unsynced");
    kvx_index *fast2 = NULL;
    assert_int_equal(kvx_idx_open(&fast2, index, 0, 1), 0);
    assert_false(env_nosync(fast2)); /* a later NOSYNC handle does not undo it */
    kvx_idx_close(fast2);
    kvx_idx_close(durable);
    kvx_idx_close(fast);

    /* through the API: a READONLY|NOSYNC reader, then the writer, which
     * flushes and reopens what it acknowledged */
    kvx_store *reader = NULL, *writer = NULL;
    assert_int_equal(kvx_store_open(&reader, dir, NULL, KVX_STORE_READONLY | KVX_STORE_NOSYNC), 0);
    assert_int_equal(kvx_store_open(&writer, dir, NULL, 0), 0);
    assert_int_equal(kvx_idx_open(&durable, index, 0, 0), 0);
    assert_false(env_nosync(durable));
    kvx_idx_close(durable);
    assert_int_equal(su_put_seq(writer, 77, 3), 0);
    assert_int_equal(kvx_store_flush(writer), 0);
    assert_int_equal(su_served_prefix(reader, 77, 3), 3);
    kvx_store_close(writer);
    kvx_store_close(reader);
}

/* The page of key k at version ver: a function of both. */
static void key_page(uint8_t *p, size_t n, const char *k, uint64_t ver)
{
    su_page(p, n, kvx_key_hash(k, strlen(k)) ^ (ver * 0x9E3779B97F4A7C15ull));
}

static void keyed_put_into(kvx_store *s, kvx_store_batch *b, const char *k, uint64_t ver)
{
    uint8_t p[PB];
    key_page(p, PB, k, ver);
    kvx_key key = {k, strlen(k)};
    const void *pages[1] = {p};
    size_t lens[1] = {PB};
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
        uint8_t want[PB];
        key_page(want, PB, k, i);
        if (v.page_bytes == PB && memcmp(v.page, want, PB) == 0) ver = (int)i;
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
static void test_keyed_newest_copy_served(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB});
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

/* A rewrite of an adopted old shard must not carry a replaced copy: O
 * holds K = v1 and J; K is deleted and put again as v2 (P), J deleted, gc
 * drops O. O comes back and is adopted (K twice, J again); the owner
 * deletes J once more, so gc rewrites O (half its pages deleted) and
 * copied K = v1 into a new shard, the newest generation: v1 answered. */
static void test_keyed_rewrite_skips_replaced_copy(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB});
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
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(keyed_version(s, "K", 2), 2);
    assert_int_equal(keyed_version(s, "J", 1), 1); /* adopted again */
    keyed_del(s, "J");
    assert_int_equal(kvx_store_gc(s), 0);
    int ver = keyed_version(s, "K", 2);
    if (ver == 1) fail_msg("DEFECT rule 1: gc carried a replaced copy of a key into the newest shard and served it");
    assert_int_equal(ver, 2);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.shards, 1); /* O had nothing left to carry */
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(keyed_version(s, "K", 2), 2);
    assert_int_equal(kvx_store_reindex(s), 0); /* one copy a key, the newest generation's */
    if (keyed_version(s, "K", 2) == 1)
        fail_msg("DEFECT rule 1: the replaced copy, carried, is the newest after reindex");
    assert_int_equal(keyed_version(s, "K", 2), 2);
    assert_int_equal(keyed_version(s, "J", 1), -1);
    kvx_store_close(s);
}

/* The store's check of a shard's name, then the file swapped for a
 * symlink before the open (the race an attacker with a foothold in
 * shards/ or a careless restore script can win). */
static kvx_os_ops real_os;
static char swap_name[64], swap_path[600], swap_target[600];
static int swap_fstatat(int dirfd, const char *name, struct stat *st, int flags)
{
    int r = real_os.fstatat(dirfd, name, st, flags);
    if (swap_name[0] && strcmp(name, swap_name) == 0) {
        swap_name[0] = 0;
        char tmp[700];
        snprintf(tmp, sizeof tmp, "%s.link", swap_path);
        assert_int_equal(symlink(swap_target, tmp), 0);
        assert_int_equal(rename(tmp, swap_path), 0);
    }
    return r;
}

/* L5. Every shard is opened under the store's shards/ descriptor with
 * O_NOFOLLOW: a shard replaced by a symlink after its name was checked
 * (here to a byte-for-byte copy outside the store) was opened through it
 * by path and served. */
static void test_shard_swapped_for_symlink(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    assert_int_equal(su_put_seq(s, 91, 3), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    char names[8][64];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    snprintf(swap_path, sizeof swap_path, "%s/shards/%s", dir, names[0]);
    snprintf(swap_target, sizeof swap_target, "%s/outside16.kvx", su_root);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", swap_path, swap_target);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    real_os = kvx_os;
    kvx_os.fstatat = swap_fstatat;
    snprintf(swap_name, sizeof swap_name, "%s", names[0]);
    size_t n = su_served_prefix(s, 91, 3);
    kvx_os = real_os;
    assert_int_equal(swap_name[0], 0); /* the swap happened at the store's check */
    if (n) fail_msg("DEFECT: the store served %zu blocks through a symlink put in place of its shard", n);
    struct stat st;
    assert_int_equal(lstat(swap_path, &st), 0);
    assert_true(S_ISLNK(st.st_mode)); /* left as it is */
    kvx_store_close(s);
    /* the format call itself: a symlink under a directory is KVX_EPATH */
    int dfd = open(su_root, O_RDONLY | O_DIRECTORY);
    assert_true(dfd >= 0);
    char lnk[400];
    snprintf(lnk, sizeof lnk, "%s/lnk16.kvx", su_root);
    assert_int_equal(symlink(swap_target, lnk), 0);
    kvx_shard *sh = NULL;
    assert_int_equal(kvx_shard_open_at(&sh, dfd, "lnk16.kvx", lnk, 0), KVX_EPATH);
    assert_non_null(strstr(kvx_last_error(), "a symlink"));
    assert_int_equal(kvx_shard_open_at(&sh, dfd, "outside16.kvx", swap_target, 0), 0);
    kvx_shard_close(sh);
    close(dfd);
}

/* Generations are taken when a batch starts writing, not at its flush, so
 * a later put can hold the lower generation: batch A starts (its shard
 * takes generation g), K = v1 is put and flushed at g + 1, v1's page
 * rots, and A puts K = v2 (a damaged copy is not "held") and flushes. v2
 * is acknowledged: it is served, and gc, a reopen and a reindex keep it
 * (a newest-generation rule would answer v1's damage and let a rewrite
 * drop v2 as superseded). */
static void test_keyed_put_after_damage_lower_gen(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB});
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
    kvx_store *s = su_store(dir, 300, (su_spec){.page_bytes = PB});
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

/* The adoption rule must not hide a sound copy behind a damaged one: K's
 * only indexed copy (shard P) has a rotten page when an older shard O
 * holding K's very page comes back (a backup); O's copy is indexed and
 * served, and gc's salvage of P keeps K. Skipping it left K indexed
 * nowhere once gc dropped P's bad page, and then O went as "deleted". */
static void test_keyed_adoptee_beside_damaged_copy(void **state)
{
    (void)state;
    char dir[300], names[8][64], old[600], aside[600];
    replaced_with_backup(dir, old, aside, "aside16b.kvx", 1); /* the same page again, in P */
    kvx_store *s = NULL;
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    char p[600];
    snprintf(p, sizeof p, "%s/shards/%s", dir, names[0]);
    assert_int_equal(su_flip_page_byte(p, 0), 0);
    assert_int_equal(rename(aside, old), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    int ver = keyed_version(s, "K", 1);
    if (ver != 1)
        fail_msg("DEFECT rule 2: a sound adopted copy was not indexed beside a damaged one (K answers %d)", ver);
    assert_int_equal(kvx_store_gc(s), 0); /* P salvaged (its bad page left out), O kept */
    assert_int_equal(keyed_version(s, "K", 1), 1);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(keyed_version(s, "K", 1), 1);
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
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    emfile_name[0] = 0;
    kvx_os = real_os;
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.shards, 1); /* O waits, unregistered */
    assert_int_equal(keyed_version(s, "K", 2), 2);
    keyed_put(s, "L", 1); /* a new shard: not O's byte */
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    if (st.quarantined) fail_msg("DEFECT rule 2: the waiting adoptee was quarantined (its byte was taken)");
    assert_int_equal(st.shards, 3); /* O adopted now */
    assert_int_equal(keyed_version(s, "K", 2), 2); /* K not indexed from O: P holds it, sound */
    assert_int_equal(keyed_version(s, "L", 1), 1);
    kvx_store_close(s);
}

/* Open descriptors of this process naming a deleted file under dir. */
static int deleted_fds_under(const char *dir)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char p[300], link[1024];
        snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(p, link, sizeof link - 1);
        if (len <= 0) continue;
        link[len] = 0;
        n += strncmp(link, dir, strlen(dir)) == 0 && strstr(link, " (deleted)") != NULL;
    }
    closedir(d);
    return n;
}

/* One request of shard sh (entry 0) through f, checked, released. */
static void fetch_one(kvx_fetch *f, kvx_shard *sh)
{
    const kvx_fetch_req r = {sh, 0};
    kvx_fetch_result res;
    assert_int_equal(kvx_fetch_submit(f, &r, 1), 0);
    assert_int_equal(kvx_fetch_wait(f, &res, 1, 10000), 0);
    assert_int_equal(res.status, 0);
    assert_true(io_page_ok(res.page, kvx_shard_get_info(sh)->shard_id, 0, res.bytes));
    kvx_fetch_release(f);
}

/* #5. Eviction and gc delete shard files; a reader's kvx_fetch kept its
 * own descriptors of them (one, two with O_DIRECT) in its file cache,
 * which is trimmed only beyond 64 files: the disk space of up to 64
 * deleted shards stayed held for the life of the handle. */
static void test_fetch_lets_go_of_deleted_shards(void **state)
{
    (void)state;
    enum { GONE = 4 };
    char paths[GONE + 1][512];
    kvx_shard *sh[GONE + 1];
    for (int i = 0; i <= GONE; i++) {
        char name[32];
        snprintf(name, sizeof name, "del%d.kvx", i);
        assert_int_equal(io_make_shard(paths[i], sizeof paths[i], io_tmpdir, name, (uint8_t)(i + 1), 3, 0), 0);
        assert_int_equal(kvx_shard_open(&sh[i], paths[i], 0), 0);
    }
    kvx_pool_options po = KVX_POOL_OPTIONS_INIT;
    po.bytes = 4u << 20;
    kvx_pool *p = NULL;
    int rc = kvx_pool_create(&p, &po);
    if (rc == KVX_EMEMLOCK) {
        po.flags = KVX_POOL_NO_MLOCK | KVX_POOL_NO_REGISTER;
        rc = kvx_pool_create(&p, &po);
    }
    assert_int_equal(rc, 0);
    const int modes[] = {KVX_IO_AUTO, KVX_IO_PREAD};
    for (size_t m = 0; m < 2; m++) {
        kvx_fetch_options o = KVX_FETCH_OPTIONS_INIT;
        o.io_mode = modes[m];
        kvx_fetch *f = NULL;
        assert_int_equal(kvx_fetch_create(&f, p, &o), 0);
        for (int i = 0; i <= GONE; i++) fetch_one(f, sh[i]);
        assert_int_equal(deleted_fds_under(io_tmpdir), 0);
        /* deleted as eviction does: the name goes, the reader's shard closes */
        for (int i = 0; i < GONE; i++) {
            kvx_shard_close(sh[i]);
            sh[i] = NULL;
            assert_int_equal(unlink(paths[i]), 0);
        }
        /* the reader goes on with the live shard */
        for (int k = 0; k < 80; k++) fetch_one(f, sh[GONE]);
        int held = deleted_fds_under(io_tmpdir);
        if (held) fail_msg("DEFECT: a live kvx_fetch still holds %d descriptors of deleted shards", held);
        kvx_fetch_destroy(f);
        for (int i = 0; i < GONE; i++) { /* their successors, for the next mode */
            char name[32];
            snprintf(name, sizeof name, "del%d.kvx", i);
            assert_int_equal(io_make_shard(paths[i], sizeof paths[i], io_tmpdir, name, (uint8_t)(i + 1), 3, 0), 0);
            assert_int_equal(kvx_shard_open(&sh[i], paths[i], 0), 0);
        }
    }
    for (int i = 0; i <= GONE; i++) kvx_shard_close(sh[i]);
    kvx_pool_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_legacy_child_of_collided_parent),
        cmocka_unit_test(test_carried_child_of_collided_parent),
        cmocka_unit_test(test_salvage_keeps_no_collided_parent),
        cmocka_unit_test(test_nosync_handle_does_not_unsync_writer),
        cmocka_unit_test(test_keyed_newest_copy_served),
        cmocka_unit_test(test_keyed_rewrite_skips_replaced_copy),
        cmocka_unit_test(test_keyed_put_after_damage_lower_gen),
        cmocka_unit_test(test_keyed_adoptee_beside_damaged_copy),
        cmocka_unit_test(test_keyed_adoptee_waits_when_unjudged),
        cmocka_unit_test(test_fetch_lets_go_of_deleted_shards),
        cmocka_unit_test(test_shard_swapped_for_symlink),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
