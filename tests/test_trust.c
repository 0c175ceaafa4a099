/*
 * test_trust.c - DESIGN.md trust rule 1, "never wrong KV", against the
 * library: every finding of the issue "Trust I" as a test that failed on
 * the code before the prefix digest and passes after.
 *
 *  - test_digest_golden: the SHA-256 chain against vectors computed with
 *    Python's hashlib (independent of OpenSSL and of kvx);
 *  - test_collision_b2 / test_collision_b16: fresh chained FNV collisions
 *    (tests/collide.h) for B = 2 and B = 16; both prompts are stored, in
 *    one batch and in two, and each is served its own KV byte for byte;
 *    a get by hash alone answers KVX_EAMBIGUOUS, tokens pick the block;
 *  - test_unverified_never_served: an envelope put without tokens neither
 *    serves a prefix nor blocks a later honest put, which supersedes it;
 *  - test_rotten_page: a page that fails its CRC is never handed out or
 *    exported; the prefix ends before it and names it;
 *  - test_missing_page: a shard whose last page was cut off opens, serves
 *    its other pages, and never the missing one;
 *  - test_bad_scale_refused_by_every_store: a v2 envelope whose scale is
 *    NaN, inf, 0 or negative is refused by fp16, e4m3 and e5m2 stores;
 *  - test_pre_digest_store: shards without a digest table (older stores)
 *    are unverified until reindex derives their digests by lineage; a
 *    block with two candidate parents stays unverified.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lib/collide.h"
#include "lib/store.h"

static size_t page_bytes_of(uint32_t B) { return 2u * 1 * 1 * B * 4 * 2; }

/* Pages that are a function of (prompt, block): two prompts with equal
 * hashes still have different KV. */
static uint8_t *prompt_pages(uint64_t prompt, size_t nb, uint32_t B)
{
    size_t P = page_bytes_of(B);
    uint8_t *p = malloc(nb * P);
    for (size_t i = 0; i < nb; i++) su_page(p + i * P, P, su_mix(prompt * 977 + i));
    return p;
}

/* The number of leading blocks served for tokens whose bytes equal pages. */
static size_t served_exact(kvx_store *s, const uint32_t *t, size_t nb, uint32_t B, const uint8_t *pages)
{
    kvx_view v[64];
    size_t n = 0;
    assert_true(nb <= 64);
    assert_int_equal(kvx_store_prefix(v, &n, s, t, nb * B, nb), 0);
    size_t P = page_bytes_of(B);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(v[i].page_bytes, P);
        assert_memory_equal(v[i].page, pages + i * P, P);
    }
    kvx_views_release(v, n);
    return n;
}

static void test_digest_golden(void **state)
{
    (void)state;
    /* python3: d0 = sha256(struct.pack('<2I', 1, 2)); d1 = sha256(d0 + struct.pack('<2I', 3, 4)) */
    static const char *want0 = "34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f";
    static const char *want1 = "c57b445f90651b9a650e516ab2238c965b21af35608a31c303e6d9e407f2915c";
    uint32_t t[5] = {1, 2, 3, 4, 5};
    uint8_t d[2][KVX_DIGEST_BYTES];
    assert_int_equal(kvx_prefix_digests(d, t, 5, 2), 2); /* the partial tail has none */
    char hex[65];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[k][i]);
        assert_string_equal(hex, k ? want1 : want0);
    }
    uint8_t one[KVX_DIGEST_BYTES];
    kvx_prefix_digest_next(one, d[0], t + 2, 2);
    assert_memory_equal(one, d[1], KVX_DIGEST_BYTES);
    assert_int_equal(kvx_prefix_digests(d, t, 5, 0), 0);
}

/* Two prompts whose FNV chains collide from block 0 on: A = a || tail,
 * B = b || tail, with different KV. */
static void collision_case(uint32_t B)
{
    uint32_t a0[16], b0[16];
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20) ^ B;
    double t0 = kvx_collide_now();
    int found = kvx_test_find_collision(B, seed, a0, b0, 60.0, 600.0);
    fprintf(stderr, "collision B=%u seed %" PRIu64 ": %s in %.1f s\n", B, seed, found == 0 ? "found" : "not found",
            kvx_collide_now() - t0);
    assert_int_equal(found, 0);
    enum { NB = 5 };
    uint32_t ta[NB * 16], tb[NB * 16];
    memcpy(ta, a0, B * 4);
    memcpy(tb, b0, B * 4);
    for (uint32_t i = B; i < NB * B; i++) ta[i] = tb[i] = (uint32_t)su_mix(seed + i);
    uint64_t ha[NB], hb[NB];
    kvx_block_hashes(ha, ta, NB * B, B);
    kvx_block_hashes(hb, tb, NB * B, B);
    assert_memory_not_equal(ta, tb, B * 4);
    for (int i = 0; i < NB; i++) assert_true(ha[i] == hb[i]); /* the chain collides throughout */
    uint8_t *pa = prompt_pages(1, NB, B), *pb = prompt_pages(2, NB, B);

    for (int batch = 0; batch < 2; batch++) {
        char dir[300];
        kvx_store *s =
            su_store(dir, sizeof dir, (su_spec){.block_tokens = B, .capacity = 64 << 20, .shard_bytes = 256 << 10});
        size_t added = 0;
        assert_int_equal(kvx_store_put(s, ta, NB * B, pa, NB, NULL, &added), 0);
        assert_int_equal(added, NB);
        if (batch) assert_int_equal(kvx_store_flush(s), 0);
        /* B's blocks have A's hashes (and, after block 0, A's parent hashes
         * and tokens): only the digest tells them apart. Refusing the put
         * or deduplicating it against A would be wrong. */
        assert_int_equal(kvx_store_put(s, tb, NB * B, pb, NB, NULL, &added), 0);
        assert_int_equal(added, NB);
        assert_int_equal(kvx_store_flush(s), 0);
        assert_int_equal(served_exact(s, ta, NB, B, pa), NB);
        assert_int_equal(served_exact(s, tb, NB, B, pb), NB);
        /* again, from a fresh reader process view (reopen) */
        kvx_store_close(s);
        assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
        assert_int_equal(served_exact(s, ta, NB, B, pa), NB);
        assert_int_equal(served_exact(s, tb, NB, B, pb), NB);
        /* by hash alone: ambiguous, named; by tokens: each its own */
        kvx_view v;
        assert_int_equal(kvx_store_get_hash(&v, s, ha[2]), KVX_EAMBIGUOUS);
        char want[32];
        snprintf(want, sizeof want, "%016" PRIx64, ha[2]);
        assert_non_null(strstr(kvx_last_error(), want));
        assert_int_equal(kvx_store_get_block(&v, s, tb, 3 * B), 0);
        assert_memory_equal(v.page, pb + 2 * page_bytes_of(B), page_bytes_of(B));
        kvx_view_release(&v);
        assert_int_equal(kvx_store_get_block(&v, s, ta, 3 * B), 0);
        assert_memory_equal(v.page, pa + 2 * page_bytes_of(B), page_bytes_of(B));
        kvx_view_release(&v);
        /* a third prompt sharing the colliding chain but not its tokens
         * gets nothing */
        uint32_t tc[NB * 16];
        memcpy(tc, ta, sizeof tc);
        tc[0] ^= 1;
        kvx_view cv[NB];
        size_t n = 9;
        assert_int_equal(kvx_store_prefix(cv, &n, s, tc, NB * B, NB), 0);
        assert_int_equal(n, 0);
        uint64_t bad = 9;
        assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
        assert_int_equal(bad, 0);
        kvx_store_close(s);
    }
    free(pa);
    free(pb);
}

static void test_collision_b2(void **state)
{
    (void)state;
    collision_case(2);
}

static void test_collision_b16(void **state)
{
    (void)state;
    collision_case(16);
}

static void test_unverified_never_served(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.block_tokens = SU_B, .capacity = 16 << 20, .shard_bytes = 256 << 10});
    kvx_geometry g = su_geometry();
    enum { NB = 4 };
    uint32_t t[NB * SU_B];
    su_tokens(t, 77, NB, 0);
    uint64_t h[NB];
    kvx_block_hashes(h, t, NB * SU_B, SU_B);
    /* the lying envelope: the prompt's hashes, someone else's KV (v1 f16
     * payload [L][2][Hkv][B][D]: 64 bytes here) */
    uint8_t lie[NB][64];
    kvx_envelope_block_in in[NB];
    for (int i = 0; i < NB; i++) {
        memset(lie[i], 0x11 + i, sizeof lie[i]);
        in[i] = (kvx_envelope_block_in){h[i], SU_B, lie[i], NULL};
    }
    size_t len;
    assert_int_equal(kvx_envelope_size(&len, 1, &g, NB), 0);
    void *env = malloc(len);
    assert_int_equal(kvx_envelope_export(env, len, 1, &g, in, NB), 0);
    size_t added = 0;
    assert_int_equal(kvx_store_put_envelope(s, env, len, NULL, 0, &added), 0);
    assert_int_equal(added, NB);
    assert_int_equal(kvx_store_flush(s), 0);
    /* never served: not by prefix, not by hash alone, not by tokens */
    kvx_view v[NB];
    size_t n = 9;
    assert_int_equal(kvx_store_prefix(v, &n, s, t, NB * SU_B, NB), 0);
    assert_int_equal(n, 0);
    assert_int_equal(kvx_store_get_hash(&v[0], s, h[1]), KVX_EUNVERIFIED);
    assert_int_equal(kvx_store_get_block(&v[0], s, t, 2 * SU_B), KVX_ENOTFOUND);
    /* the honest put is not "already held" */
    uint8_t *pages = su_pages(t, NB, h, 64);
    assert_int_equal(kvx_store_put(s, t, NB * SU_B, pages, NB, NULL, &added), 0);
    assert_int_equal(added, NB);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(served_exact(s, t, NB, SU_B, pages), NB);
    /* the verified block supersedes: get by hash answers it */
    assert_int_equal(kvx_store_get_hash(&v[0], s, h[3]), 0);
    assert_memory_equal(v[0].page, pages + 3 * 64, 64);
    kvx_view_release(&v[0]);
    /* and an unverified put of a held hash adds nothing */
    assert_int_equal(kvx_store_put_envelope(s, env, len, NULL, 0, &added), 0);
    assert_int_equal(added, 0);
    free(pages);
    free(env);
    kvx_store_close(s);
}

/* The path of the store's only shard. */
static void only_shard(const char *dir, char *out, size_t cap)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s/shards/*.kvx", dir);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    assert_non_null(fgets(out, (int)cap, f));
    pclose(f);
    out[strcspn(out, "\n")] = 0;
}

static void flip_page_byte(const char *path, uint32_t entry) { assert_int_equal(su_flip_page_byte(path, entry), 0); }

/* A store holding one prompt of NB blocks (sequence seq), flushed and
 * closed, and the path of its only shard; returns the prompt's pages. */
enum { NB = 4 };
static uint8_t *one_prompt_store(char *dir, size_t dcap, char *shard, size_t scap, uint64_t seq, uint32_t *t,
                                 uint64_t *h)
{
    kvx_store *s = su_store(dir, dcap, (su_spec){.block_tokens = SU_B, .capacity = 16 << 20, .shard_bytes = 256 << 10});
    su_tokens(t, seq, NB, 0);
    uint8_t *pages = su_pages(t, NB, h, 64);
    assert_int_equal(kvx_store_put(s, t, NB * SU_B, pages, NB, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    only_shard(dir, shard, scap);
    return pages;
}

static void test_rotten_page(void **state)
{
    (void)state;
    char dir[300], shard[600];
    kvx_store *s;
    uint32_t t[NB * SU_B];
    uint64_t h[NB];
    uint8_t *pages = one_prompt_store(dir, sizeof dir, shard, sizeof shard, 5, t, h);
    flip_page_byte(shard, 2);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    /* the prefix ends before the rotten block and names it; exit code 0 */
    kvx_view v[NB];
    size_t n = 0;
    assert_int_equal(kvx_store_prefix(v, &n, s, t, NB * SU_B, NB), 0);
    assert_int_equal(n, 2);
    assert_non_null(strstr(kvx_last_error(), "page CRC mismatch"));
    /* the served blocks export; a view whose page rots after the lookup
     * does not (always re-checked before an export) */
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(kvx_views_export(&buf, &len, s, v, n, KVX_ENVELOPE_V1), 0);
    kvx_envelope e;
    assert_int_equal(kvx_envelope_parse(&e, buf, len, NULL), 0);
    assert_int_equal(e.n_blocks, 2);
    kvx_free(buf);
    assert_int_equal(kvx_views_export(&buf, &len, s, v, 0, KVX_ENVELOPE_V2), 0); /* none: still an envelope */
    assert_int_equal(len, 32);
    kvx_free(buf);
    flip_page_byte(shard, 1);
    assert_int_equal(kvx_views_export(&buf, &len, s, v, n, KVX_ENVELOPE_V1), KVX_EPAGECRC);
    assert_null(buf);
    kvx_views_release(v, n);
    /* by hash and by coordinate: the damage, not "not found", not bytes */
    kvx_view one;
    assert_int_equal(kvx_store_get_hash(&one, s, h[2]), KVX_EPAGECRC);
    assert_null(one.shard);
    uint64_t bad = 0;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), KVX_ECORRUPT);
    assert_int_equal(bad, 2);
    kvx_store_close(s);
    /* a put of the same prompt stores the damaged blocks again, and the
     * good copies are served */
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    size_t added = 0;
    assert_int_equal(kvx_store_put(s, t, NB * SU_B, pages, NB, NULL, &added), 0);
    assert_int_equal(added, 2);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(served_exact(s, t, NB, SU_B, pages), NB);
    /* gc copies the damaged shard's good blocks and quarantines the file */
    assert_int_equal(kvx_store_gc(s), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.quarantined, 1);
    assert_int_equal(served_exact(s, t, NB, SU_B, pages), NB);
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    char q[700];
    snprintf(q, sizeof q, "%s/quarantine/%s", dir, strrchr(shard, '/') + 1);
    assert_int_equal(access(q, F_OK), 0);
    strcat(q, ".why");
    assert_int_equal(access(q, F_OK), 0);
    free(pages);
    kvx_store_close(s);
}

static void test_missing_page(void **state)
{
    (void)state;
    char dir[300], shard[600];
    kvx_store *s;
    uint32_t t[NB * SU_B];
    uint64_t h[NB];
    uint8_t *pages = one_prompt_store(dir, sizeof dir, shard, sizeof shard, 6, t, h);
    struct stat stt;
    assert_int_equal(stat(shard, &stt), 0);
    assert_int_equal(truncate(shard, stt.st_size - 4096), 0); /* the last page */
    kvx_shard *sh;
    assert_int_equal(kvx_shard_open(&sh, shard, 0), 0);
    const void *p;
    assert_int_equal(kvx_shard_page(&p, sh, 3, 0), KVX_ETRUNC);
    assert_int_equal(kvx_shard_page(&p, sh, 0, 1), 0);
    kvx_shard_close(sh);
    for (int writer = 0; writer < 2; writer++) {
        assert_int_equal(kvx_store_open(&s, dir, NULL, writer ? 0 : KVX_STORE_READONLY), 0);
        assert_int_equal(served_exact(s, t, NB, SU_B, pages), 3);
        kvx_store_close(s);
    }
    /* the writer kept the file (its size differed from the record) */
    assert_int_equal(access(shard, F_OK), 0);
    free(pages);
}

/* A shard file cut under an open store after its pages were checked: a
 * page is CRC-checked once per handle, and later lookups handed it out
 * unchecked, so a file cut inside its last page (read as zeros there, no
 * fault) served that block's zeros as its KV. The handle now looks at the
 * file's size again (at most every 20 ms) and, once it is short, checks
 * every page again: the cut block is refused, the others served intact. A
 * file cut to nothing faults on every page: nothing is served. A view
 * taken before the cut never exports (export re-checks). */
static void test_truncated_after_checked(void **state)
{
    (void)state;
    char dir[300], shard[600];
    kvx_store *s;
    uint32_t t[NB * SU_B];
    uint64_t h[NB];
    uint8_t *pages = one_prompt_store(dir, sizeof dir, shard, sizeof shard, 8, t, h);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(served_exact(s, t, NB, SU_B, pages), NB); /* every page checked */
    kvx_view held[NB];
    size_t n = 0;
    assert_int_equal(kvx_store_prefix(held, &n, s, t, NB * SU_B, NB), 0);
    assert_int_equal(n, NB);
    /* which block's page holds the file's last bytes */
    struct stat stt;
    assert_int_equal(stat(shard, &stt), 0);
    size_t last = 0;
    for (size_t i = 1; i < NB; i++)
        if (held[i].page > held[last].page) last = i;
    assert_int_equal(last, NB - 1);
    /* the last page starts 4096 bytes before the end (pages are 4096-aligned
     * and the file padded to 4096): cut it after its first 32 bytes, inside
     * the mapped page, so its tail reads as zeros without a fault */
    assert_int_equal(truncate(shard, stt.st_size - 4096 + 32), 0);
    usleep(60 * 1000);
    assert_int_equal(served_exact(s, t, NB, SU_B, pages), NB - 1);
    assert_non_null(strstr(kvx_last_error(), "page CRC mismatch"));
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(kvx_views_export(&buf, &len, s, held, n, KVX_ENVELOPE_V1), KVX_EPAGECRC);
    assert_null(buf);
    assert_int_equal(kvx_views_export(&buf, &len, s, held, NB - 1, KVX_ENVELOPE_V1), 0); /* the rest is intact */
    kvx_free(buf);
    assert_int_equal(truncate(shard, 0), 0); /* every page gone: each read faults */
    usleep(60 * 1000);
    assert_int_equal(served_exact(s, t, NB, SU_B, pages), 0);
    kvx_views_release(held, n);
    kvx_store_close(s);
    free(pages);
}

/* A shard as a store before the digest wrote it: hashes and lineage, no
 * digest table, named and numbered as the store does. */
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

static void test_pre_digest_store(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.block_tokens = SU_B, .capacity = 16 << 20, .shard_bytes = 256 << 10});
    kvx_store_close(s);
    uint32_t t[NB * SU_B];
    uint64_t h[NB];
    su_tokens(t, 9, NB, 0);
    uint8_t *pages = su_pages(t, NB, h, 64);
    write_old_shard(dir, 7, 3, t, NB, pages, 0);
    /* a writer adopts it as it is: unverified, never served */
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, NB);
    assert_int_equal(st.unverified, NB);
    assert_int_equal(served_exact(s, t, NB, SU_B, pages), 0);
    kvx_view v;
    assert_int_equal(kvx_store_get_hash(&v, s, h[1]), KVX_EUNVERIFIED);
    /* reindex derives the digests by walking lineage from block 0 */
    assert_int_equal(kvx_store_reindex(s), 0);
    assert_int_equal(served_exact(s, t, NB, SU_B, pages), NB);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.unverified, 0);
    assert_int_equal(kvx_store_get_hash(&v, s, h[1]), 0);
    kvx_view_release(&v);
    uint64_t bad = 9;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    kvx_store_close(s);

    /* a block whose parent hash names two different blocks (a crafted FNV
     * collision in an old store) has two candidate parents: it stays
     * unverified; the blocks before it are served */
    s = su_store(dir, sizeof dir, (su_spec){.block_tokens = SU_B, .capacity = 16 << 20, .shard_bytes = 256 << 10});
    kvx_store_close(s);
    write_old_shard(dir, 7, 3, t, NB, pages, 0);
    /* a second block with hash h[1] (same parent and tokens, another
     * digest: what a crafted FNV collision leaves behind) gives block 2 two
     * candidate parents */
    {
        char path[600];
        snprintf(path, sizeof path, "%s/shards/%016" PRIx64 ".kvx", dir, (uint64_t)9);
        kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
        o.geometry = su_geometry();
        o.shard_id = 4;
        o.max_entries = 4;
        o.flags = KVX_FLAG_HASHES | KVX_FLAG_LINEAGE | KVX_FLAG_DIGEST;
        kvx_shard_writer *w;
        assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
        uint8_t other[KVX_DIGEST_BYTES];
        memset(other, 0x5A, sizeof other);
        kvx_entry_in e;
        memset(&e, 0, sizeof e);
        e.token_count = SU_B;
        e.page = pages + 64;
        e.tokens = t + SU_B;
        e.parent = h[0];
        e.hash = h[1];
        e.digest = other; /* another block with hash h[1]: a second candidate parent */
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
        assert_int_equal(kvx_shard_writer_seal(w), 0);
    }
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(kvx_store_reindex(s), 0);
    assert_int_equal(served_exact(s, t, NB, SU_B, pages), 2); /* blocks 0 and 1; 2 has two candidate parents */
    kvx_store_close(s);
    free(pages);
}

/* A v2 envelope with a scale that is not finite and > 0 is refused by every
 * store, whatever its quant (it was stored by fp16 and e5m2 stores). */
/* `kvx inspect` names the digest table, lays the scale table after it, and
 * --json gives each entry's digest: the spec's example block [1, 2] has
 * the hashlib digest of test_digest_golden. */
static void test_inspect_shows_digests(void **state)
{
    (void)state;
    char dir[300], shard[600], cmd[1400], out[8192];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.block_tokens = 2, .capacity = 16 << 20, .shard_bytes = 256 << 10});
    uint32_t t[5] = {1, 2, 3, 4, 5};
    uint8_t *pages = prompt_pages(9, 2, 2);
    assert_int_equal(kvx_store_put(s, t, 5, pages, 2, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    free(pages);
    only_shard(dir, shard, sizeof shard);
    snprintf(cmd, sizeof cmd, "%s inspect --json %s", KVX_CLI, shard);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t got = fread(out, 1, sizeof out - 1, f);
    out[got] = 0;
    assert_int_equal(pclose(f), 0);
    assert_non_null(strstr(out, "\"hash\":\"0xa91ab0c1027b9366\""));
    assert_non_null(strstr(out, "\"digest\":\"34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f\""));
    snprintf(cmd, sizeof cmd, "%s inspect %s", KVX_CLI, shard);
    f = popen(cmd, "r");
    assert_non_null(f);
    got = fread(out, 1, sizeof out - 1, f);
    out[got] = 0;
    assert_int_equal(pclose(f), 0);
    assert_non_null(strstr(out, "digests"));
    assert_non_null(strstr(out, "digest table"));
}

static void test_bad_scale_refused_by_every_store(void **state)
{
    (void)state;
    static const uint32_t quants[4] = {KVX_QUANT_FP16, KVX_QUANT_E4M3, KVX_QUANT_E5M2, KVX_QUANT_BF16};
    const float bad[4] = {NAN, INFINITY, 0.0f, -1.0f};
    for (int qi = 0; qi < 4; qi++) {
        for (int bi = 0; bi < 4; bi++) {
            char dir[300];
            snprintf(dir, sizeof dir, "%s/scale%d%d", su_root, qi, bi);
            kvx_store_options o = KVX_STORE_OPTIONS_INIT;
            o.geometry = su_geometry();
            o.geometry.quant = quants[qi];
            o.capacity_bytes = 16 << 20;
            o.shard_bytes = 256 << 10;
            kvx_store *s;
            assert_int_equal(kvx_store_create(&s, dir, &o), 0);
            kvx_geometry g = su_geometry();
            uint32_t t[SU_B];
            su_tokens(t, 3, 1, 0);
            uint64_t h = kvx_block_hash(0, t, SU_B);
            uint8_t e4[2 * 1 * SU_B * 4];
            memset(e4, 0x38, sizeof e4);
            float sc[2] = {1.0f, 1.0f};
            kvx_envelope_block_in in = {h, SU_B, e4, sc};
            size_t len;
            assert_int_equal(kvx_envelope_size(&len, 2, &g, 1), 0);
            uint8_t *env = malloc(len);
            assert_int_equal(kvx_envelope_export(env, len, 2, &g, &in, 1), 0);
            /* the scale written in place and the CRC made valid again, as
             * a careless or hostile writer would */
            size_t P = kvx_envelope_payload_bytes(2, &g);
            memcpy(env + 28 + 12 + P - 8, &bad[bi], 4);
            uint32_t crc = kvx_crc32c(0, env, len - 4);
            memcpy(env + len - 4, &crc, 4);
            size_t added = 9;
            assert_int_equal(kvx_store_put_envelope(s, env, len, t, SU_B, &added), KVX_EFORMAT);
            assert_int_equal(added, 0);
            assert_non_null(strstr(kvx_last_error(), "scale"));
            kvx_store_stats st;
            assert_int_equal(kvx_store_stat(&st, s), 0);
            assert_int_equal(st.pending_blocks, 0);
            free(env);
            kvx_store_close(s);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_digest_golden),
        cmocka_unit_test(test_unverified_never_served),
        cmocka_unit_test(test_rotten_page),
        cmocka_unit_test(test_missing_page),
        cmocka_unit_test(test_truncated_after_checked),
        cmocka_unit_test(test_pre_digest_store),
        cmocka_unit_test(test_bad_scale_refused_by_every_store),
        cmocka_unit_test(test_inspect_shows_digests),
        cmocka_unit_test(test_collision_b2),
        cmocka_unit_test(test_collision_b16),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
