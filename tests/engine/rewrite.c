/*
 * rewrite.c - engine/store_rewrite.c: blocks copied into new shards
 * (compaction, gc's salvage, eviction's carries, reindex) keep serving
 * their own bytes: prompts whose FNV chains collide block for block, and
 * unverified blocks beside verified ones.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/store.h"

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

/* The two colliding prompts: COLL_A / COLL_B then the same tail. */
static void coll_prompts(uint32_t *ta, uint32_t *tb, size_t nb)
{
    memcpy(ta, COLL_A, sizeof COLL_A);
    memcpy(tb, COLL_B, sizeof COLL_B);
    for (size_t i = SU_B; i < nb * SU_B; i++) ta[i] = tb[i] = (uint32_t)su_mix(0xC0FFEE + i);
    uint64_t ha[64], hb[64];
    kvx_block_hashes(ha, ta, nb * SU_B, SU_B);
    kvx_block_hashes(hb, tb, nb * SU_B, SU_B);
    for (size_t i = 0; i < nb; i++) assert_true(ha[i] == hb[i]);
}

static void flip_page_byte(const char *path, uint32_t entry) { assert_int_equal(su_flip_page_byte(path, entry), 0); }

/* The index of the entry with hash h whose page equals page, in shard
 * path, or UINT32_MAX. */
static uint32_t find_entry(const char *path, uint64_t h, const uint8_t *page)
{
    kvx_shard *sh;
    if (kvx_shard_open(&sh, path, 0) != 0) return UINT32_MAX;
    uint32_t r = UINT32_MAX;
    for (uint32_t i = 0; i < kvx_shard_get_info(sh)->num_blocks && r == UINT32_MAX; i++) {
        kvx_entry e;
        const void *p;
        if (kvx_shard_entry(&e, sh, i) == 0 && e.hash == h && kvx_shard_page(&p, sh, i, 0) == 0 &&
            (!page || memcmp(p, page, 64) == 0))
            r = i;
    }
    kvx_shard_close(sh);
    return r;
}

/* Both colliding prompts served their own bytes, get by hash ambiguous,
 * verify clean; returns 0 or a message of what broke. */
static const char *coll_check(kvx_store *s, const uint32_t *ta, const uint32_t *tb, const uint8_t *pa,
                              const uint8_t *pb, size_t nb)
{
    if (served_exact_or_max(s, ta, nb, pa) != nb) return "prompt A not served whole with its own bytes";
    if (served_exact_or_max(s, tb, nb, pb) != nb) return "prompt B not served whole with its own bytes";
    uint64_t h[64];
    kvx_block_hashes(h, ta, nb * SU_B, SU_B);
    kvx_view v;
    for (size_t i = 0; i < nb; i++) {
        int rc = kvx_store_get_hash(&v, s, h[i]);
        if (rc == 0) kvx_view_release(&v);
        if (rc != KVX_EAMBIGUOUS) return "get by hash of a colliding block is not KVX_EAMBIGUOUS";
    }
    uint64_t bad = 9;
    if (kvx_store_verify(s, &bad, NULL, NULL) != 0 && bad) return "verify found damage";
    return NULL;
}

/* Passing coverage (rule 1 through rewrites): two prompts whose FNV chains
 * collide block for block keep being served, each its own bytes, after a
 * compaction that merges their shards, a gc salvage of the merged shard, an
 * eviction that carries them, kvx_store_reindex and kvx_store_reindex_dir;
 * no step merges or deduplicates the two into one. */
/* PROMISE: TRUST-10 */
static void test_collisions_survive_rewrites(void **state)
{
    (void)state;
    enum { NB = 5 };
    uint32_t ta[NB * SU_B], tb[NB * SU_B], tc[NB * SU_B];
    coll_prompts(ta, tb, NB);
    su_tokens(tc, 500, NB, 0);
    uint8_t *pa = prompt_pages(1, NB), *pb = prompt_pages(2, NB), *pc = prompt_pages(3, NB);
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    assert_int_equal(kvx_store_put(s, ta, NB * SU_B, pa, NB, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_put(s, tb, NB * SU_B, pb, NB, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_put(s, tc, NB * SU_B, pc, NB, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    const char *m;
    char names[16][64];
    assert_int_equal(su_list_names(dir, "shards", names, 16), 3);
    if ((m = coll_check(s, ta, tb, pa, pb, NB))) fail_msg("before any rewrite: %s", m);
    /* gc: the three small shards are merged into one */
    assert_int_equal(kvx_store_gc(s), 0);
    size_t ns = su_list_names(dir, "shards", names, 16);
    print_message("after gc's compaction: %zu shard(s)\n", ns);
    assert_int_equal(ns, 1);
    if ((m = coll_check(s, ta, tb, pa, pb, NB))) fail_msg("after compaction: %s", m);
    kvx_store_close(s);
    /* damage C's block 2 in the merged shard: gc salvages the rest */
    char path[800];
    snprintf(path, sizeof path, "%s/shards/%s", dir, names[0]);
    uint64_t hc[NB];
    kvx_block_hashes(hc, tc, NB * SU_B, SU_B);
    uint32_t ic = find_entry(path, hc[2], pc + 2 * 64);
    assert_true(ic != UINT32_MAX);
    flip_page_byte(path, ic);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(kvx_store_gc(s), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.quarantined, 1);
    if ((m = coll_check(s, ta, tb, pa, pb, NB))) fail_msg("after gc salvage: %s", m);
    assert_int_equal(served_exact_or_max(s, tc, NB, pc), 2);
    assert_int_equal(kvx_store_reindex(s), 0);
    if ((m = coll_check(s, ta, tb, pa, pb, NB))) fail_msg("after kvx_store_reindex: %s", m);
    kvx_store_close(s);
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    if ((m = coll_check(s, ta, tb, pa, pb, NB))) fail_msg("after kvx_store_reindex_dir: %s", m);
    kvx_store_close(s);

    /* eviction: a small store, A and B looked up between fillers (hot),
     * carried rather than dropped */
    s = su_store(dir, sizeof dir, (su_spec){.capacity = 640 << 10, .shard_bytes = 64 << 10});
    assert_int_equal(kvx_store_put(s, ta, NB * SU_B, pa, NB, NULL, NULL), 0);
    assert_int_equal(kvx_store_put(s, tb, NB * SU_B, pb, NB, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    uint64_t ev0 = 0;
    for (uint64_t seq = 1000; seq < 1400; seq++) {
        uint32_t t[32 * SU_B];
        uint64_t h[32];
        su_tokens(t, seq, 32, 0);
        uint8_t *p = su_pages(t, 32, h, 64);
        assert_int_equal(kvx_store_put(s, t, 32 * SU_B, p, 32, NULL, NULL), 0);
        assert_int_equal(kvx_store_flush(s), 0);
        free(p);
        size_t a = served_exact_or_max(s, ta, NB, pa), b = served_exact_or_max(s, tb, NB, pb);
        if (a != NB || b != NB) fail_msg("eviction round %" PRIu64 ": A %zu, B %zu of %d served", seq - 1000, a, b, NB);
        assert_int_equal(kvx_store_stat(&st, s), 0);
        if (!ev0 && st.evictions) ev0 = seq;
    }
    assert_int_equal(kvx_store_stat(&st, s), 0);
    print_message("eviction: %" PRIu64 " shard(s) evicted (first at round %" PRIu64 "), A and B served throughout\n",
                  st.evictions, ev0 ? ev0 - 1000 : 0);
    assert_true(st.evictions > 0);
    if ((m = coll_check(s, ta, tb, pa, pb, NB))) fail_msg("after eviction: %s", m);
    kvx_store_close(s);
    free(pa);
    free(pb);
    free(pc);
}

static void *lie_envelope(const uint64_t *h, size_t nb, uint8_t fill, size_t *len)
{
    kvx_geometry g = su_geometry();
    uint8_t lie[16][64];
    kvx_envelope_block_in in[16];
    for (size_t i = 0; i < nb; i++) {
        memset(lie[i], fill + (int)i, sizeof lie[i]);
        lie[i][1] &= 0x3f; /* finite halves */
        in[i] = (kvx_envelope_block_in){h[i], SU_B, lie[i], NULL};
    }
    assert_int_equal(kvx_envelope_size(len, 1, &g, (uint32_t)nb), 0);
    void *env = malloc(*len);
    assert_int_equal(kvx_envelope_export(env, *len, 1, &g, in, (uint32_t)nb), 0);
    return env;
}

/* Passing coverage (rule 1): an envelope put without tokens (someone
 * else's KV under the prompt's hashes), then the honest put; gc merges the
 * small shards of each kind, then reindex and reindex_dir: the verified
 * blocks stay served with the honest bytes, get by hash answers them, and
 * the lie is never served. */
/* PROMISE: TRUST-10 */
static void test_unverified_beside_verified_rewrites(void **state)
{
    (void)state;
    enum { NB = 4 };
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    uint32_t t[2][NB * SU_B];
    uint64_t h[2][NB];
    uint8_t *pages[2];
    for (int k = 0; k < 2; k++) {
        su_tokens(t[k], 600 + k, NB, 0);
        pages[k] = su_pages(t[k], NB, h[k], 64);
        size_t len, added = 0;
        void *env = lie_envelope(h[k], NB, (uint8_t)(0x21 + k * 8), &len);
        assert_int_equal(kvx_store_put_envelope(s, env, len, NULL, 0, &added), 0);
        assert_int_equal(added, NB);
        assert_int_equal(kvx_store_flush(s), 0);
        free(env);
    }
    for (int k = 0; k < 2; k++) {
        assert_int_equal(kvx_store_put(s, t[k], NB * SU_B, pages[k], NB, NULL, NULL), 0);
        assert_int_equal(kvx_store_flush(s), 0);
    }
    char names[16][64];
    assert_int_equal(su_list_names(dir, "shards", names, 16), 4);
    for (int step = 0; step < 4; step++) {
        if (step == 1) assert_int_equal(kvx_store_gc(s), 0);
        if (step == 2) assert_int_equal(kvx_store_reindex(s), 0);
        if (step == 3) {
            kvx_store_close(s);
            assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
            assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
        }
        static const char *what[] = {"before gc", "after gc", "after reindex", "after reindex_dir"};
        for (int k = 0; k < 2; k++) {
            size_t n = served_exact_or_max(s, t[k], NB, pages[k]);
            if (n != NB) fail_msg("%s: prompt %d: %zu of %d served with the honest bytes", what[step], k, n, NB);
            for (int i = 0; i < NB; i++) {
                kvx_view v;
                int rc = kvx_store_get_hash(&v, s, h[k][i]);
                if (rc != 0) fail_msg("%s: get_hash of a verified block: %d (%s)", what[step], rc, kvx_last_error());
                int same = memcmp(v.page, pages[k] + i * 64, 64) == 0;
                kvx_view_release(&v);
                if (!same) fail_msg("%s: get_hash answered the unverified copy", what[step]);
            }
        }
        kvx_store_stats st;
        assert_int_equal(kvx_store_stat(&st, s), 0);
        print_message("%s: %" PRIu64 " shard(s), %" PRIu64 " block record(s), %" PRIu64 " unverified\n", what[step],
                      st.shards, st.blocks, st.unverified);
    }
    kvx_store_close(s);
    free(pages[0]);
    free(pages[1]);
}

int main(int argc, char **argv)
{
    /* these tests read the files one flush writes as its own shard
     * file (the path keyed stores, whole batches and a second batch
     * still take): the active shard has its own, tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collisions_survive_rewrites),
        cmocka_unit_test(test_unverified_beside_verified_rewrites),
    };
    return cmocka_run_group_tests_name("engine/rewrite", tests, su_setup, su_teardown);
}
