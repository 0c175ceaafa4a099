/*
 * digest.c - stores written before the prefix digest existed: their
 * blocks are unverified until reindex derives digests by walking lineage,
 * a block with two candidate parents stays unverified, and a rewrite (gc's
 * salvage, an eviction's carry, a compaction) never makes a legacy block
 * look verified beside a collided parent.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/io.h"
#include "lib/store.h"

enum { NB = 4 };

/* Pages that are a function of (prompt, block), not of the hash: two
 * prompts whose hashes collide still have different KV. 64 bytes each. */
static uint8_t *prompt_pages(uint64_t prompt, size_t nb)
{
    uint8_t *p = malloc(nb * 64 + 1);
    for (size_t i = 0; i < nb; i++) su_page(p + i * 64, 64, su_mix(prompt * 977 + i));
    return p;
}

/* Leading blocks served by prefix for tokens t (nb blocks), each compared
 * with pages; SIZE_MAX when one has wrong bytes or the call fails. */
static size_t served_exact_or_max(kvx_store *s, const uint32_t *t, size_t nb, const uint8_t *pages)
{
    kvx_view v[64];
    size_t n = 0;
    if (nb > 64) return SIZE_MAX;
    if (kvx_store_prefix(v, &n, s, t, nb * SU_B, nb) != 0) return SIZE_MAX;
    size_t r = n;
    for (size_t i = 0; i < n; i++)
        if (v[i].page_bytes != 64 || memcmp(v[i].page, pages + i * 64, 64) != 0) r = SIZE_MAX;
    kvx_views_release(v, n);
    return r;
}

static void flip_page_byte(const char *path, uint32_t entry) { assert_int_equal(su_flip_page_byte(path, entry), 0); }

typedef struct old_ent {
    const uint32_t *toks;
    const uint8_t *page;
    uint64_t parent;
} old_ent;

/* shards/<gen>.kvx for shard byte `byte`: hashes and lineage, no digest
 * table (what a store wrote before the digest existed). */
static void write_old_entries(const char *dir, uint64_t gen, uint8_t byte, const old_ent *ents, size_t n)
{
    char path[600];
    snprintf(path, sizeof path, "%s/shards/%016" PRIx64 ".kvx", dir, gen);
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.shard_id = byte;
    o.max_entries = 64;
    o.flags = KVX_FLAG_HASHES | KVX_FLAG_LINEAGE;
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    for (size_t i = 0; i < n; i++) {
        kvx_entry_in e;
        memset(&e, 0, sizeof e);
        e.radix_block = (uint16_t)i;
        e.token_count = SU_B;
        e.page = ents[i].page;
        e.tokens = ents[i].toks;
        e.parent = ents[i].parent;
        e.hash = kvx_block_hash(e.parent, e.tokens, SU_B);
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    }
    assert_int_equal(kvx_shard_writer_seal(w), 0);
}

/* Entries for nb blocks of tokens t (a chain from parent 0). */
static size_t old_chain(old_ent *out, const uint32_t *t, const uint8_t *pages, size_t nb)
{
    uint64_t h[64];
    kvx_block_hashes(h, t, nb * SU_B, SU_B);
    for (size_t i = 0; i < nb; i++) out[i] = (old_ent){t + i * SU_B, pages + i * 64, i ? h[i - 1] : 0};
    return nb;
}

static void predigest_case(int headless, size_t *served_after, uint64_t *stat_unverified)
{
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    kvx_store_close(s);
    enum { NB = 4 };
    uint32_t t[NB * SU_B], u[NB * SU_B];
    su_tokens(t, 300 + headless, NB, 0);
    su_tokens(u, 400 + headless, NB, 0);
    uint8_t *pt = prompt_pages(300 + headless, NB), *pu = prompt_pages(400 + headless, NB);
    old_ent e[8];
    size_t n = old_chain(e, t, pt, NB);
    uint32_t stray[SU_B] = {1, 2, 3, 4};
    if (headless) e[n++] = (old_ent){stray, pu, 0x5eed5eed5eed5eedull}; /* its parent is held nowhere */
    write_old_entries(dir, 7, 3, e, n);
    old_chain(e, u, pu, NB);
    write_old_entries(dir, 8, 4, e, NB);
    char p7[600];
    snprintf(p7, sizeof p7, "%s/shards/%016" PRIx64 ".kvx", dir, (uint64_t)7);
    if (!headless) flip_page_byte(p7, 3); /* t's block 3: damaged */

    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    /* damaged: the documented order, reindex derives what it can (the
     * damaged shard stays as it is), gc salvages, reindex again. headless:
     * an old store opened and gc'd (its maintenance pass), then reindexed */
    if (!headless) {
        assert_int_equal(kvx_store_reindex(s), 0);
        size_t su1 = served_exact_or_max(s, u, NB, pu), st1 = served_exact_or_max(s, t, NB, pt);
        print_message("damaged: after the first reindex: t %zu, u %zu served\n", st1, su1);
        assert_int_equal(su1, NB);
    }
    assert_int_equal(kvx_store_gc(s), 0);
    assert_int_equal(kvx_store_reindex(s), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    *served_after = served_exact_or_max(s, t, NB, pt);
    *stat_unverified = st.unverified;
    kvx_view v;
    uint64_t h[NB];
    kvx_block_hashes(h, t, NB * SU_B, SU_B);
    int gh = kvx_store_get_hash(&v, s, h[0]);
    if (gh == 0) kvx_view_release(&v);
    print_message("%s: after gc + reindex: t %zu of %d served, get_hash(block 0) %d, stat unverified %" PRIu64
                  ", quarantined %" PRIu64 "\n",
                  headless ? "headless" : "damaged", *served_after, headless ? NB : NB - 1, gh, st.unverified,
                  st.quarantined);
    assert_int_equal(served_exact_or_max(s, u, NB, pu), NB);
    kvx_store_close(s);
    free(pt);
    free(pu);
}

/*
 * DEFECT (rule 4 "Stores written before the digest existed open fine:
 * their blocks are unverified until reindex derives digests by walking
 * lineage"; STORE.md "Reindex").
 *
 * Reproducer: a store whose shards have no digest table (written before
 * the digest). Shard 7 holds a prompt's blocks 0-3; either block 3's page
 * is damaged, or the shard also holds one block whose parent is held
 * nowhere. kvx_store_reindex derives what it can (the damaged shard is
 * left as it is, as documented); kvx_store_gc then rewrites shard 7: the
 * salvage (st_salvage_damaged) or the headless pass (st_drop_headless)
 * calls st_rewrite_shard (engine/store_write.c), which turns the flags
 * into KVX_FLAG_LINEAGE|KVX_FLAG_DIGEST ("if (flags & KVX_FLAG_LINEAGE)
 * flags |= KVX_FLAG_DIGEST;") while every move's digest is zero (the
 * source entry had none): the good blocks land in a digest shard with
 * all-zero digests. From then on st_derive_digests never looks at them
 * ("need" and the rewrite loop only take shards WITHOUT the digest flag),
 * so no reindex ever makes them verified: a sound prompt whose lineage
 * chains from block 0 is never served by prefix again. kvx_store_stat
 * meanwhile reports 0 unverified (it counts only shards without the
 * digest flag), so the operator is told all is well. Eviction's carry
 * (st_evict -> st_rewrite with st_kind_flags(LINEAGE)) does the same to
 * hot blocks of an old shard.
 *
 * Fix: in st_derive_digests, collect and rewrite every lineage shard that
 * holds an entry with tokens and no digest (not only shards without the
 * flag), or derive the digest while rewriting (st_rewrite_shard /
 * st_evict: keep the source's flags, or compute the digest from a parent
 * that has one); and make stat count unverified entries, not shards
 * without the flag.
 */
/* PROMISE: TRUST-10 */
static void test_regress_predigest_rewrite_never_verified(void **state)
{
    (void)state;
    size_t served[2];
    uint64_t unv[2];
    predigest_case(0, &served[0], &unv[0]);
    predigest_case(1, &served[1], &unv[1]);
    if (served[0] != 3 || served[1] != 4)
        fail_msg("DEFECT rule 4: after gc rewrote a pre-digest shard, reindex no longer derives its blocks' digests: "
                 "%zu of 3 sound blocks served after a damaged-page salvage, %zu of 4 after a headless trim "
                 "(stat says %" PRIu64 " / %" PRIu64 " unverified)",
                 served[0], served[1], unv[0], unv[1]);
}

enum { PB64 = 64 };

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


/* M4 again, through a rewrite: an eviction carry or a compaction puts the
 * hot blocks of several shards side by side in one digest shard, so the
 * colliding block b can land right before the legacy child C, carried
 * without a digest. "A parent in its own shard before it" then held, and
 * reindex verified C under b. A child in a digest shard is never derived
 * now (only in a shard pre-digest kvx wrote). */
/* PROMISE: TRUST-9 */
static void test_carried_child_of_collided_parent(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    uint32_t b[SU_B], c[SU_B], bc[2 * SU_B];
    uint64_t hb[1], hbc[2];
    su_tokens(b, 601, 1, 0);
    su_tokens(c, 602, 1, 0);
    uint8_t *pb = su_pages(b, 1, hb, PB64);
    assert_int_equal(kvx_store_put(s, b, SU_B, pb, 1, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    uint8_t pc[PB64];
    su_page(pc, PB64, 0xbad5eed);
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
    assert_memory_equal(v[0].page, pb, PB64);
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
/* PROMISE: TRUST-10 */
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
    uint8_t px[PB64], pa[PB64], pc[PB64];
    su_page(px, PB64, 0x701);
    su_page(pa, PB64, 0x702);
    su_page(pc, PB64, 0x703);
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
    assert_memory_equal(v[0].page, px, PB64);
    kvx_views_release(v, n);
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
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regress_predigest_rewrite_never_verified),
        cmocka_unit_test(test_carried_child_of_collided_parent),
        cmocka_unit_test(test_salvage_keeps_no_collided_parent),
    };
    return cmocka_run_group_tests_name("engine/digest", tests, setup_all, teardown_all);
}
