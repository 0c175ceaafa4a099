/*
 * test_attack2.c - a second hostile review of DESIGN.md "Trust rules
 * (binding)" 1-5 and docs/STORE.md, after tests/test_attack.c. Tests named
 * test_regress_* failed on the code they were written against and pass
 * since the fixes (each comment gives the reproducer and the code that was
 * wrong); the others passed from the start and cover what no other test
 * does. Fixes: digests derived for every lineage entry without one, and
 * stat counts unverified entries per shard record; a reader whose
 * data.mdb was replaced answers KVX_ESTALE (within 100 ms) instead of
 * reading the old file for good; quarantine notes are created O_EXCL |
 * O_NONBLOCK and a name whose note exists is taken; views_export checks
 * the model.
 *
 * Defects found (most serious first):
 *  - test_regress_predigest_rewrite_never_verified (rule 4): gc's salvage
 *    or headless pass rewrites a pre-digest shard into a digest shard with
 *    all-zero digests (st_rewrite_shard, engine/store_write.c); reindex
 *    (st_derive_digests) only derives shards WITHOUT the digest flag, so
 *    those sound blocks are never verified again, and stat reports 0
 *    unverified;
 *  - test_regress_reader_stale_after_reindex_dir (Concurrency, rule 4): a
 *    reader handle open across another process's kvx_store_reindex_dir
 *    keeps the old, deleted LMDB environment and never sees a block
 *    published afterwards (index/index.c kvx_idx_open: one environment
 *    per index/ inode, never re-checked);
 *  - test_regress_quarantine_note_clash (rules 2, 5): st_quarantine
 *    (engine/store_recover.c) opens "<name>.why" with O_TRUNC: a note
 *    already there is replaced, and a FIFO there hangs a writer's open;
 *  - test_regress_export_views_of_another_model (rule 1, low):
 *    kvx_views_export checks a view's geometry but not its model
 *    signature.
 *
 * Passing coverage:
 *  - test_collisions_survive_rewrites: two prompts whose FNV chains
 *    collide (a hard-coded B = 4 pair) stay served, each its own bytes,
 *    through compaction, gc salvage, eviction carry, reindex, reindex_dir;
 *  - test_unverified_beside_verified_rewrites: unverified envelope blocks
 *    beside the verified put of the same hashes through gc (both kinds
 *    compacted), reindex, reindex_dir: get by hash answers the verified;
 *  - test_quarantine_clash_chain: name, name.1 taken -> name.2 + note;
 *  - test_reader_during_writer: a reader process's prefix lookups while a
 *    writer process puts, flushes, gc's, evicts and reindexes: no error,
 *    no wrong byte.
 *  (test_regress_export_views_of_another_model also checks views of a
 *  second store of the same model export, views released twice, and
 *  max_views above the prompt.)
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

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
static size_t served_exact(kvx_store *s, const uint32_t *t, size_t nb, const uint8_t *pages)
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

static int run_cli(const char *args)
{
    char cmd[4000], err[400];
    snprintf(err, sizeof err, "%s/cli.err", su_root);
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>'%s'", KVX_CLI, args, err);
    int st = system(cmd);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    if (rc) {
        FILE *f = fopen(err, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) print_message("  kvx: %s", line);
        if (f) fclose(f);
    }
    return rc;
}

/* ------------------------------------------------------------------------
 * Shards as a store before the digest wrote them
 * ---------------------------------------------------------------------- */

typedef struct old_ent {
    const uint32_t *toks;
    const uint8_t *page;
    uint64_t parent;
} old_ent;

/* shards/<gen>.kvx for shard byte `byte`: hashes and lineage, no digest
 * table (what a store wrote before the digest existed). */
static void write_old_shard(const char *dir, uint64_t gen, uint8_t byte, const old_ent *ents, size_t n)
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

/* ------------------------------------------------------------------------
 * Rule 4: a pre-digest block rewritten by gc is never derived by reindex
 * ---------------------------------------------------------------------- */

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
    write_old_shard(dir, 7, 3, e, n);
    old_chain(e, u, pu, NB);
    write_old_shard(dir, 8, 4, e, NB);
    char p7[600];
    snprintf(p7, sizeof p7, "%s/shards/%016" PRIx64 ".kvx", dir, (uint64_t)7);
    if (!headless) flip_page_byte(p7, 3); /* t's block 3: damaged */

    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    /* damaged: the documented order, reindex derives what it can (the
     * damaged shard stays as it is), gc salvages, reindex again. headless:
     * an old store opened and gc'd (its maintenance pass), then reindexed */
    if (!headless) {
        assert_int_equal(kvx_store_reindex(s), 0);
        size_t su1 = served_exact(s, u, NB, pu), st1 = served_exact(s, t, NB, pt);
        print_message("damaged: after the first reindex: t %zu, u %zu served\n", st1, su1);
        assert_int_equal(su1, NB);
    }
    assert_int_equal(kvx_store_gc(s), 0);
    assert_int_equal(kvx_store_reindex(s), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    *served_after = served_exact(s, t, NB, pt);
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
    assert_int_equal(served_exact(s, u, NB, pu), NB);
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

/*
 * DEFECT (STORE.md "Concurrency": "A read-only handle ... sees blocks
 * published after it opened (a fresh snapshot per call)").
 *
 * Reproducer: a server holds a KVX_STORE_READONLY handle; the operator
 * runs kvx_store_reindex_dir(DIR) from another process (index/ is renamed
 * to index.old/, a new index/ is built, index.old/ removed: STORE.md
 * "Reindex", for a store whose index is lost or damaged); a writer then
 * puts and flushes a new prompt. The reader's handle still holds the LMDB
 * environment of the old, now unlinked, data.mdb (kvx_idx_open in
 * index/index.c shares one environment per index/ inode and nothing ever
 * looks again): it never sees a block published after the reindex, until
 * the process restarts, and its usage records go to a deleted file.
 * Within one process it is worse: the registry keys environments by the
 * index directory's (dev, inode), and ext4 hands the freed inode of the
 * removed index.old/ to the next index/ made; kvx_store_reindex_dir (or
 * any open) then finds the stale environment of the old directory and
 * "rebuilds" into the deleted file, leaving the real index/ empty (the
 * second half of this test probes it; whether ext4 reuses the inode in a
 * given run is chance, so it reports what happened and fails only when
 * the store was left unopenable).
 *
 * Fix: a handle must notice that index/ was replaced: compare
 * fstatat(dirfd, "index") (dev, ino) with the environment's at each
 * read-transaction renewal (or on a miss, rate-limited) and reopen the
 * environment; kvx_idx_open must not match a registry entry whose
 * data.mdb is no longer the file at path (compare the data.mdb inode, or
 * drop entries whose directory was renamed away: keep an fd on the
 * directory so its inode cannot be reused while the entry lives).
 */
/* kvx_store_reindex_dir(dir) run by another process (what `kvx store
 * reindex` does for a store whose index will not open). */
static void reindex_dir_elsewhere(const char *dir)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(kvx_store_reindex_dir(dir, 0) == 0 ? 0 : 1);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_regress_reader_stale_after_reindex_dir(void **state)
{
    (void)state;
    char dir[300], args[1000];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    su_put_flush(s, 1, 3);
    kvx_store_close(s);
    kvx_store *r;
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(su_served_prefix(r, 1, 3), 3);
    char ipath[600];
    struct stat i0, i1;
    snprintf(ipath, sizeof ipath, "%s/index", dir);
    assert_int_equal(stat(ipath, &i0), 0);
    reindex_dir_elsewhere(dir);
    assert_int_equal(stat(ipath, &i1), 0);
    print_message("reindex_dir in another process: index/ inode %lu -> %lu\n", (unsigned long)i0.st_ino,
                  (unsigned long)i1.st_ino);
    /* a writer (here in this process; another process gives the same) */
    kvx_store *w;
    assert_int_equal(kvx_store_open(&w, dir, NULL, 0), 0);
    su_put_flush(w, 2, 3);
    assert_int_equal(su_served_prefix(w, 2, 3), 3);
    kvx_store_close(w);
    /* the reader opened before sees the index was replaced (within 100 ms)
     * and says so, KVX_ESTALE naming what to do, instead of serving an old
     * snapshot for good; opened again, it serves the new blocks */
    usleep(200000);
    kvx_view sv[3];
    size_t sn = 9;
    uint32_t st2[3 * SU_B];
    su_tokens(st2, 2, 3, 0);
    int src = kvx_store_prefix(sv, &sn, r, st2, 3 * SU_B, 3);
    if (src == 0) kvx_views_release(sv, sn);
    assert_int_equal(src, KVX_ESTALE);
    assert_non_null(strstr(kvx_last_error(), "open it again"));
    kvx_store_close(r);
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
    size_t old_seen = su_served_prefix(r, 1, 3), new_seen = su_served_prefix(r, 2, 3);
    kvx_store *r2;
    assert_int_equal(kvx_store_open(&r2, dir, NULL, KVX_STORE_READONLY), 0);
    size_t fresh_seen = su_served_prefix(r2, 2, 3);
    kvx_store_close(r2);
    print_message("reader opened before the reindex_dir: old prompt %zu, new prompt %zu of 3; a reader opened "
                  "after: %zu\n",
                  old_seen, new_seen, fresh_seen);

    /* the same process now runs reindex_dir while its reader is open: is
     * the stale environment picked up for the new index/? */
    int reused = 0, empty_after = 0;
    char ip[600];
    snprintf(ip, sizeof ip, "%s/index", dir);
    for (int k = 0; k < 4 && !empty_after; k++) {
        struct stat a, b;
        assert_int_equal(stat(ip, &a), 0);
        assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
        assert_int_equal(stat(ip, &b), 0);
        /* a fresh process's reader (the CLI) on the result */
        snprintf(args, sizeof args, "store stat '%s'", dir);
        int rc = run_cli(args);
        print_message("reindex_dir #%d: index/ inode %lu -> %lu, `kvx store stat` exit %d\n", k, (unsigned long)a.st_ino,
                      (unsigned long)b.st_ino, rc);
        if (rc) empty_after = 1;
        reused |= b.st_ino == i0.st_ino;
        reindex_dir_elsewhere(dir); /* and another one from outside */
    }
    print_message("the first index/ inode (the reader's environment) %s reused\n", reused ? "was" : "was not");
    kvx_store_close(r);
    if (new_seen != 3 || empty_after)
        fail_msg("DEFECT: %s%s%s",
                 new_seen != 3 ? "a reader opened before another process's kvx_store_reindex_dir never sees blocks "
                                 "published after it (0 of 3 served; a reader opened afterwards serves them)"
                               : "",
                 new_seen != 3 && empty_after ? "; " : "",
                 empty_after ? "kvx_store_reindex_dir in a process holding a reader of the store returned 0 but left "
                               "an index/ that other processes cannot open (it rebuilt a stale, deleted environment)"
                             : "");
}

/* ------------------------------------------------------------------------
 * Rule 1: colliding prompts through every rewrite
 * ---------------------------------------------------------------------- */

/* Both colliding prompts served their own bytes, get by hash ambiguous,
 * verify clean; returns 0 or a message of what broke. */
static const char *coll_check(kvx_store *s, const uint32_t *ta, const uint32_t *tb, const uint8_t *pa,
                              const uint8_t *pb, size_t nb)
{
    if (served_exact(s, ta, nb, pa) != nb) return "prompt A not served whole with its own bytes";
    if (served_exact(s, tb, nb, pb) != nb) return "prompt B not served whole with its own bytes";
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
    assert_int_equal(served_exact(s, tc, NB, pc), 2);
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
        size_t a = served_exact(s, ta, NB, pa), b = served_exact(s, tb, NB, pb);
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

/* ------------------------------------------------------------------------
 * Rule 1: unverified beside verified through gc, compaction, reindex
 * ---------------------------------------------------------------------- */

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
            size_t n = served_exact(s, t[k], NB, pages[k]);
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

/* ------------------------------------------------------------------------
 * Rule 1: kvx_views_export and views of another store
 * ---------------------------------------------------------------------- */

/*
 * DEFECT (rule 1, low: a caller's mix-up is exported as this model's KV).
 *
 * Reproducer: two stores of the same geometry for two different models
 * (model_signature differs); views looked up in store M2 are passed to
 * kvx_views_export(..., store M1, ...). The envelope is built under M1's
 * geometry with M2's KV and nothing says so (the envelope has no model
 * field); put into M1 with the prompt's tokens, it becomes verified KV of
 * the wrong model. kvx_views_export (engine/store.c) checks each view's
 * shard geometry field by field ("comes from a shard of another geometry")
 * but leaves model_signature out, although every other place that admits
 * a shard into a store (st_shard_get, st_judge, st_scan_file) requires it.
 *
 * Fix: add vg->model_signature != g->model_signature to that check
 * (KVX_EMODEL, naming both signatures). Views of a second store of the
 * same model stay exportable (also covered here, passing).
 */
static void test_regress_export_views_of_another_model(void **state)
{
    (void)state;
    char d1[300], d2[300], d3[300];
    kvx_store *m1 = su_store(d1, sizeof d1, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    kvx_store *same = su_store(d3, sizeof d3, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    su_new_dir(d2, sizeof d2);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.geometry.model_signature ^= 0xFFFF;
    o.capacity_bytes = 16 << 20;
    o.shard_bytes = 256 << 10;
    kvx_store *m2 = NULL;
    assert_int_equal(kvx_store_create(&m2, d2, &o), 0);
    su_put_flush(m2, 7, 3);
    su_put_flush(same, 7, 3);
    uint32_t t[3 * SU_B];
    su_tokens(t, 7, 3, 0);
    kvx_view v[3], w[3];
    size_t n = 0, nw = 0;
    assert_int_equal(kvx_store_prefix(v, &n, m2, t, 3 * SU_B, 3), 0);
    assert_int_equal(n, 3);
    assert_int_equal(kvx_store_prefix(w, &nw, same, t, 3 * SU_B, 8), 0); /* max_views above the prompt */
    assert_int_equal(nw, 3);
    void *env = NULL;
    size_t len = 0;
    /* same model, another store: fine */
    assert_int_equal(kvx_views_export(&env, &len, m1, w, nw, KVX_ENVELOPE_V1), 0);
    kvx_free(env);
    env = NULL;
    int rc = kvx_views_export(&env, &len, m1, v, n, KVX_ENVELOPE_V1);
    print_message("export of another model's views through this store: %d (%s)\n", rc, rc ? kvx_last_error() : "");
    kvx_free(env);
    kvx_views_release(v, n);
    kvx_views_release(v, n); /* twice: harmless */
    kvx_views_release(w, nw);
    kvx_view_release(&w[0]);
    kvx_store_close(m1);
    kvx_store_close(m2);
    kvx_store_close(same);
    if (rc == 0)
        fail_msg("DEFECT rule 1: kvx_views_export exported views of a store of another model "
                 "(model_signature differs) as this store's KV");
}

/* ------------------------------------------------------------------------
 * Rule 2 / 5: quarantine names
 * ---------------------------------------------------------------------- */

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int file_is(const char *path, const char *text)
{
    char buf[256] = "";
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strcmp(buf, text) == 0;
}

/* Passing coverage (rule 2): a clash chain in quarantine/ (name, name.1
 * taken) puts the file at name.2 with name.2.why, the others untouched,
 * and stat counts all three. */
static void test_quarantine_clash_chain(void **state)
{
    (void)state;
    char dir[300], p[700];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    su_put_flush(s, 1, 2);
    kvx_store_close(s);
    snprintf(p, sizeof p, "%s/quarantine", dir);
    assert_int_equal(mkdir(p, 0700), 0);
    snprintf(p, sizeof p, "%s/quarantine/00000000000000d0.kvx", dir);
    write_text(p, "first");
    snprintf(p, sizeof p, "%s/quarantine/00000000000000d0.kvx.1", dir);
    write_text(p, "second");
    snprintf(p, sizeof p, "%s/shards/00000000000000d0.kvx", dir);
    write_text(p, "third, not a shard");
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(su_served_prefix(s, 1, 2), 2);
    kvx_store_close(s);
    assert_int_equal(st.quarantined, 3);
    snprintf(p, sizeof p, "%s/quarantine/00000000000000d0.kvx", dir);
    assert_true(file_is(p, "first"));
    snprintf(p, sizeof p, "%s/quarantine/00000000000000d0.kvx.1", dir);
    assert_true(file_is(p, "second"));
    snprintf(p, sizeof p, "%s/quarantine/00000000000000d0.kvx.2", dir);
    assert_true(file_is(p, "third, not a shard"));
    snprintf(p, sizeof p, "%s/quarantine/00000000000000d0.kvx.2.why", dir);
    assert_int_equal(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/shards/00000000000000d0.kvx", dir);
    assert_int_not_equal(access(p, F_OK), 0);
}

/*
 * DEFECT (rule 5 "No input (a file, a FIFO, ...) makes kvx ... hang";
 * rule 2 quarantine "never replacing a file already there").
 *
 * Reproducer: quarantine/ holds "<gen>.kvx.why" without "<gen>.kvx" (an
 * operator took the quarantined file out to inspect it and left the note;
 * or anyone who can write quarantine/ made it) and shards/ holds an
 * invalid "<gen>.kvx". A writer's open quarantines that file under the
 * free name "<gen>.kvx" and then writes the note with
 * openat(qfd, "<gen>.kvx.why", O_WRONLY|O_CREAT|O_TRUNC|O_NOFOLLOW)
 * (st_quarantine, engine/store_recover.c): a regular note already there
 * is truncated and replaced (the first reason is lost), and a FIFO there
 * blocks the writer's open forever (no reader on the FIFO).
 *
 * Fix: create the note with O_CREAT|O_EXCL (and O_NONBLOCK, then check
 * S_ISREG with fstat); when "<target>.why" exists, pick the next numeric
 * suffix for the file as well (choose the target so that neither
 * "<target>" nor "<target>.why" exists), never truncating or opening an
 * existing entry.
 */
static void test_regress_quarantine_note_clash(void **state)
{
    (void)state;
    char dir[300], p[700], note[700];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    su_put_flush(s, 1, 2);
    kvx_store_close(s);
    snprintf(p, sizeof p, "%s/quarantine", dir);
    assert_int_equal(mkdir(p, 0700), 0);
    /* 1: a regular note left behind */
    snprintf(note, sizeof note, "%s/quarantine/00000000000000d1.kvx.why", dir);
    write_text(note, "the operator's own note");
    snprintf(p, sizeof p, "%s/shards/00000000000000d1.kvx", dir);
    write_text(p, "garbage one");
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_store_close(s);
    int note_kept = file_is(note, "the operator's own note");
    /* 2: a FIFO under the note's name */
    snprintf(note, sizeof note, "%s/quarantine/00000000000000d2.kvx.why", dir);
    assert_int_equal(mkfifo(note, 0600), 0);
    snprintf(p, sizeof p, "%s/shards/00000000000000d2.kvx", dir);
    write_text(p, "garbage two");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(5);
        kvx_store *c;
        int rc = kvx_store_open(&c, dir, NULL, 0);
        if (rc == 0) kvx_store_close(c);
        _exit(rc == 0 ? 0 : 1);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    int hung = WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM;
    if (hung) { /* let a later open get past it: remove the FIFO */
        unlink(note);
    }
    print_message("a note already there: %s; a FIFO as the note: writer open %s\n",
                  note_kept ? "kept" : "REPLACED", hung ? "HUNG (killed after 5 s)" : "returned");
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(su_served_prefix(s, 1, 2), 2);
    kvx_store_close(s);
    if (!note_kept || hung)
        fail_msg("DEFECT rules 2/5: quarantining a file whose note name is taken %s%s%s",
                 note_kept ? "" : "truncated and replaced the file already there",
                 !note_kept && hung ? ", and " : "", hung ? "hangs a writer's open on a FIFO" : "");
}

/* ------------------------------------------------------------------------
 * Rule 1 / 3: a reader process while a writer puts, flushes, gc's and
 * reindexes
 * ---------------------------------------------------------------------- */

/* Passing coverage: a read-only handle looks prefixes up in a loop while
 * a writer process puts, flushes, gc's (compaction, eviction in a small
 * store) and reindexes: every served block has its right bytes and every
 * call returns 0 (a miss, never an error or a crash). */
static void test_reader_during_writer(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 640 << 10, .shard_bytes = 64 << 10});
    su_put_flush(s, 2000, 8);
    kvx_store_close(s);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pfd[0]);
        kvx_store *w;
        if (kvx_store_open(&w, dir, NULL, 0)) _exit(2);
        int bad = 0;
        for (uint64_t i = 1; i <= 120 && !bad; i++) {
            uint32_t t[24 * SU_B];
            uint64_t h[24];
            su_tokens(t, 2000 + i, 24, 0);
            uint8_t *p = su_pages(t, 24, h, 64);
            bad |= kvx_store_put(w, t, 24 * SU_B, p, 24, NULL, NULL) != 0;
            bad |= kvx_store_flush(w) != 0;
            free(p);
            if (i % 10 == 0) bad |= kvx_store_gc(w) != 0;
            if (i % 25 == 0) bad |= kvx_store_reindex(w) != 0;
            char c = (char)(i & 0x7f);
            if (write(pfd[1], &c, 1) != 1) bad = 1;
        }
        kvx_store_close(w);
        _exit(bad ? 3 : 0);
    }
    close(pfd[1]);
    kvx_store *r;
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
    uint64_t latest = 0, served = 0, calls = 0, errors = 0, wrong = 0;
    int flags = fcntl(pfd[0], F_GETFL);
    fcntl(pfd[0], F_SETFL, flags | O_NONBLOCK);
    for (;;) {
        char c;
        ssize_t got = read(pfd[0], &c, 1);
        if (got == 0) break;
        if (got == 1) latest++;
        for (uint64_t i = latest > 6 ? latest - 6 : 0; i <= latest; i++) {
            uint32_t t[24 * SU_B];
            uint64_t h[24];
            kvx_view v[24];
            size_t n = 0;
            su_tokens(t, 2000 + i, 24, 0);
            kvx_block_hashes(h, t, 24 * SU_B, SU_B);
            calls++;
            int rc = kvx_store_prefix(v, &n, r, t, (i ? 24 : 8) * SU_B, i ? 24 : 8);
            if (rc) {
                if (errors++ < 3) print_message("reader: prefix %d (%s)\n", rc, kvx_last_error());
                continue;
            }
            for (size_t k = 0; k < n; k++) {
                uint8_t want[64];
                su_page(want, 64, h[k]);
                if (v[k].hash != h[k] || memcmp(v[k].page, want, 64)) wrong++;
            }
            served += n;
            kvx_views_release(v, n);
        }
    }
    kvx_store_close(r);
    close(pfd[0]);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    print_message("reader: %" PRIu64 " prefix calls, %" PRIu64 " blocks served, %" PRIu64 " errors, %" PRIu64
                  " wrong; writer exit %d\n",
                  calls, served, errors, wrong, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(wrong, 0);
    assert_int_equal(errors, 0);
    assert_true(served > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regress_predigest_rewrite_never_verified),
        cmocka_unit_test(test_regress_reader_stale_after_reindex_dir),
        cmocka_unit_test(test_collisions_survive_rewrites),
        cmocka_unit_test(test_unverified_beside_verified_rewrites),
        cmocka_unit_test(test_regress_export_views_of_another_model),
        cmocka_unit_test(test_quarantine_clash_chain),
        cmocka_unit_test(test_regress_quarantine_note_clash),
        cmocka_unit_test(test_reader_during_writer),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
