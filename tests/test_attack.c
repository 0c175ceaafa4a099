/*
 * test_attack.c - a hostile review of DESIGN.md "Trust rules (binding)"
 * 1-5, each finding turned into a test. Tests named test_regress_* failed
 * on the code they were written against and pass since the fixes (each
 * comment names the rule, the code and the fix); the others passed from
 * the start and cover what no other test does.
 *
 * Defects found (fixed):
 *  - test_regress_gc_headless_transient_parent (rule 2): gc drops, and
 *    deletes for good, acknowledged blocks whose parent lives in a shard
 *    that could not be opened at that moment (EMFILE, EIO, ENOMEM...):
 *    st_drop_headless (engine/store_write.c) skips an unopenable shard and
 *    then calls its children "headless";
 *  - test_regress_stale_index_newer_claimant (rule 2): when a stale index
 *    names an older file for a shard byte and a newer valid file claims
 *    the same byte, a writer's recovery (st_adopt_file,
 *    engine/store_recover.c) quarantines the NEWER file and keeps serving
 *    the stale one; the rule (and reindex) keep the newer;
 *  - test_regress_cli_output_inside_store (rules 2, 5): 'kvx store get -o'
 *    and 'kvx store prefix -o' replace a file inside the store itself
 *    (a shard, STORE): one typo destroys acknowledged blocks or the store;
 *  - test_regress_get_hash_skips_good_copy (rule 1 availability): get by
 *    hash picks the first copy of a block and answers KVX_EPAGECRC when
 *    that copy is damaged although an identical good copy is held (the
 *    prefix lookup serves the good one).
 *
 * Passing coverage:
 *  - test_reader_changes_nothing (rule 3): a read-only handle and the
 *    CLI's read commands on a store with a damaged page, a resized shard,
 *    an unregistered shard, a garbage shard name and a staging leftover
 *    leave every name and every byte of DIR as they were (LOCK included;
 *    only the contents of index/ data.mdb and lock.mdb may change);
 *  - test_reindex_dir_busy_and_crash (rule 4): reindex_dir NOWAIT under
 *    a writer is KVX_EBUSY and leaves index/ as it was; a reindex_dir
 *    killed right after moving index/ aside, or after creating the new
 *    one, is a reindex_dir away from serving every block;
 *  - test_odd_geometries_and_inputs (rule 1): B = 1, max_views 0, a
 *    partial tail, an empty prompt, a put_envelope whose tokens disagree
 *    with its hashes;
 *  - test_quarantine_not_a_directory (rule 2): quarantine/ a regular file
 *    or a symlink out of the store: a writer still opens, follows nothing,
 *    deletes nothing, serves everything.
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
#include <unistd.h>

#include "common/os.h"
#include "lib/store.h"


static int copy_file(const char *from, const char *to)
{
    char cmd[2100];
    snprintf(cmd, sizeof cmd, "cp -p '%s' '%s'", from, to);
    return system(cmd);
}

static uint64_t file_fp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint64_t fp = 1;
    uint8_t buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) fp = su_mix(fp ^ kvx_fnv1a64(buf, got));
    fclose(f);
    return fp;
}

static void flip_page_byte(const char *path, uint32_t entry) { assert_int_equal(su_flip_page_byte(path, entry), 0); }

/* ------------------------------------------------------------------------
 * Rule 2: gc and a shard that cannot be opened right now
 * ---------------------------------------------------------------------- */

/* kvx_os.open (and openat) fails with EMFILE for any path ending in fail_suffix: the
 * process is out of descriptors just when that shard is opened. */
static char fail_suffix[96];
static int (*real_open)(const char *, int, mode_t);
static long fail_count;

static int open_emfile(const char *p, int fl, mode_t m)
{
    size_t lp = strlen(p), ls = strlen(fail_suffix);
    if (ls && lp >= ls && strcmp(p + lp - ls, fail_suffix) == 0) {
        fail_count++;
        errno = EMFILE;
        return -1;
    }
    return real_open(p, fl, m);
}

/* The same for openat: the store opens its shards under shards/ by name. */
static int (*real_openat)(int, const char *, int, mode_t);
static int openat_emfile(int dfd, const char *name, int fl, mode_t m)
{
    if (fail_suffix[0] && dfd != AT_FDCWD && strcmp(name, fail_suffix + 1) == 0) {
        fail_count++;
        errno = EMFILE;
        return -1;
    }
    return real_openat(dfd, name, fl, m);
}

/*
 * DEFECT (rule 2, "Never destroy what was acknowledged"; "A passing
 * failure must never get a shard dropped or deleted", store_internal.h).
 *
 * Reproducer: put block 0 of a prompt, flush (shard A); put blocks 0-1,
 * flush (block 1 alone in shard B, its parent in A). Reopen, and run
 * kvx_store_gc while opening A fails with EMFILE (any transient error:
 * EIO, ENOMEM, no mapping-guard slot). st_drop_headless
 * (engine/store_write.c, "if (!(sh[b] = st_shard_get(...))) continue;")
 * leaves A's blocks out of the reachability walk, so block 1 has "no path
 * to a block-0 ancestor"; st_rewrite_shard(B, keep = none) drops B's
 * records and, B being sound, st_after_drop unlinks shards/B. Block 1 is
 * gone for good, acknowledged and reachable; gc returns 0.
 *
 * Fix: in st_drop_headless (and likewise st_derive_digests, which would
 * leave such blocks unverified for good), when any live lineage shard
 * cannot be opened (st_shard_get NULL while reg_live and not cache.bad)
 * skip the headless pass entirely (or count unknown parents as
 * reachable): only a shard judged bad may make a chain headless.
 */
static void test_regress_gc_headless_transient_parent(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 77, 1); /* shard A: block 0 */
    char names[8][64];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    snprintf(fail_suffix, sizeof fail_suffix, "/%s", names[0]);
    su_put_flush(s, 77, 2); /* shard B: block 1 (block 0 held in A) */
    assert_int_equal(su_list_names(dir, "shards", names, 8), 2);
    assert_int_equal(su_served_prefix(s, 77, 2), 2);
    kvx_store_close(s);

    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_os_reset();
    real_open = kvx_os.open;
    kvx_os.open = open_emfile;
    real_openat = kvx_os.openat;
    kvx_os.openat = openat_emfile;
    fail_count = 0;
    int rc = kvx_store_gc(s);
    kvx_os_reset();
    fail_suffix[0] = 0;
    print_message("gc with shard A unopenable (EMFILE, %ld open(s) refused): %d (%s)\n", fail_count, rc,
                  kvx_last_error());
    assert_true(fail_count > 0);
    size_t served = su_served_prefix(s, 77, 2);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    size_t served_reopen = su_served_prefix(s, 77, 2);
    kvx_store_close(s);
    char q[8][64];
    size_t nq = su_list_names(dir, "quarantine", q, 8);
    print_message("after gc: %zu block(s) served, %zu after reopen, %zu file(s) in shards/, %zu in quarantine/\n",
                  served, served_reopen, su_list_names(dir, "shards", names, 8), nq);
    if (served_reopen != 2)
        fail_msg("DEFECT rule 2: gc deleted an acknowledged, reachable block because its parent's shard "
                 "could not be opened at that moment (EMFILE): %zu of 2 blocks served after gc",
                 served_reopen);
    assert_int_equal(served, 2);
}

/* ------------------------------------------------------------------------
 * Rule 2: two valid files claim one shard byte, the index names the older
 * ---------------------------------------------------------------------- */

/*
 * DEFECT (rule 2: "two valid files claiming one shard byte are both kept
 * (a writer carries the older file's blocks into a free byte, or
 * quarantines it)"; kvx_store_reindex keeps the newest file).
 *
 * Reproducer: the index (a restored backup, or one a crash left behind)
 * names shards/<gA>.kvx for byte 0, and shards/ also holds a newer valid
 * file <gC> > <gA> for byte 0 with blocks acknowledged later. A writer's
 * open (st_recover -> st_adopt_file, engine/store_recover.c: "if
 * ((s->reg_live[b] && !f->drop[b]) || f->adopt[b]) ... rc = 1" then
 * st_quarantine) moves the NEWER file to quarantine/ and keeps serving
 * the stale one: those blocks stop being served, and a reindex run later
 * would have kept exactly the file recovery threw out. Two unregistered
 * files for one free byte are decided by readdir order, not generation.
 *
 * Fix: in st_adopt_file, when the byte is held (registered or adopted)
 * compare generations: if the newcomer is newer, register it in place of
 * the holder and carry (or quarantine) the older file, as st_scan_file
 * does for reindex; better, carry the older file's blocks into a free
 * byte so both are served.
 */
static void test_regress_stale_index_newer_claimant(void **state)
{
    (void)state;
    char p[300], q[300];
    kvx_store *sp = su_store(p, sizeof p, (su_spec){.capacity = 16 << 20});
    su_put_flush(sp, 1, 3);
    kvx_store_close(sp);
    kvx_store *sq = su_store(q, sizeof q, (su_spec){.capacity = 16 << 20});
    su_put_flush(sq, 2, 3);
    kvx_store_close(sq);
    char pn[8][64], qn[8][64];
    assert_int_equal(su_list_names(p, "shards", pn, 8), 1);
    assert_int_equal(su_list_names(q, "shards", qn, 8), 1);
    /* Q's shard claims the same byte (both are their store's first) */
    kvx_shard *a, *c;
    char pa[800], pc[800], newer[800];
    snprintf(pa, sizeof pa, "%s/shards/%s", p, pn[0]);
    snprintf(pc, sizeof pc, "%s/shards/%s", q, qn[0]);
    assert_int_equal(kvx_shard_open(&a, pa, 0), 0);
    assert_int_equal(kvx_shard_open(&c, pc, 0), 0);
    assert_int_equal(kvx_shard_get_info(a)->shard_id, kvx_shard_get_info(c)->shard_id);
    kvx_shard_close(a);
    kvx_shard_close(c);
    /* ...and arrives in P under a newer generation, as if a later flush had
     * written it and the index naming it had been lost or rolled back */
    snprintf(newer, sizeof newer, "%s/shards/00000000000000f0.kvx", p);
    assert_int_equal(copy_file(pc, newer), 0);

    kvx_store *s;
    assert_int_equal(kvx_store_open(&s, p, NULL, 0), 0);
    size_t old_served = su_served_prefix(s, 1, 3), new_served = su_served_prefix(s, 2, 3);
    kvx_store_close(s);
    struct stat st;
    int newer_in_shards = stat(newer, &st) == 0;
    print_message("writer open: stale file serves %zu, newer file serves %zu; newer file %s\n", old_served,
                  new_served, newer_in_shards ? "still in shards/" : "moved to quarantine/");
    if (new_served != 3)
        fail_msg("DEFECT rule 2: a writer's recovery kept the file the stale index names and quarantined the "
                 "newer valid file claiming the same shard byte (its %zu blocks are no longer served; "
                 "reindex would have kept it)",
                 (size_t)3);
}

/* ------------------------------------------------------------------------
 * Rules 2 and 5: the CLI's output inside the store
 * ---------------------------------------------------------------------- */

static int run_cli(const char *args)
{
    char cmd[4000], err[400];
    snprintf(err, sizeof err, "%s/cli.err", su_root);
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>'%s'", KVX_CLI, args, err);
    int st = system(cmd);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    if (rc) { /* what it said, for the log */
        FILE *f = fopen(err, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) print_message("  kvx: %s", line);
        if (f) fclose(f);
    }
    return rc;
}

/*
 * DEFECT (rule 2 "Never destroy what was acknowledged", rule 5 "write
 * anywhere but the named output, which is only ever replaced when it is a
 * regular file" read together: a store's own files are not outputs).
 *
 * Reproducer:
 *   kvx store get DIR -o DIR/shards/0000000000000001.kvx --format v1 HASH
 *   kvx store prefix DIR -o DIR/STORE --format v1 TOKENS...
 * both exit 0: the first replaces an acknowledged shard by a one-block
 * envelope (its other blocks are destroyed; the next writer quarantines
 * the envelope), the second replaces the store's configuration (the store
 * no longer opens: STORE is not rebuildable). cli_out_open (cli/io.c)
 * checks only the output's type.
 *
 * Fix: in the store commands (cli/cmd_store.c), before cli_out_open,
 * resolve the output's directory (realpath of its parent, or fstat of the
 * opened dirfd) and refuse (exit 1, naming the store) when it is DIR or
 * lies under DIR (compare st_dev/st_ino up the parent chain against DIR's),
 * and refuse an output that is the same inode as any file of DIR.
 */
static void test_regress_cli_output_inside_store(void **state)
{
    (void)state;
    char dir[300];
    kvx_geometry g = {2, 1, 8, 4, KVX_QUANT_FP16, 0};
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .geometry = &g});
    enum { NB = 3 };
    uint32_t t[NB * 4];
    uint64_t h[NB];
    for (size_t i = 0; i < NB * 4; i++) t[i] = (uint32_t)(1000 + i * 7);
    kvx_block_hashes(h, t, NB * 4, 4);
    size_t pb = kvx_page_bytes(&g, 4);
    uint8_t *pages = malloc(NB * pb);
    for (size_t i = 0; i < NB * pb; i++) pages[i] = (uint8_t)(i * 13 + 1);
    /* fp16 pages: keep every half finite (exponent bits not all ones) */
    for (size_t i = 1; i < NB * pb; i += 2) pages[i] &= 0x3f;
    assert_int_equal(kvx_store_put(s, t, NB * 4, pages, NB, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    free(pages);
    char names[8][64];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    char shard[800], cfg[800], args[3000];
    snprintf(shard, sizeof shard, "%s/shards/%s", dir, names[0]);
    snprintf(cfg, sizeof cfg, "%s/STORE", dir);
    uint64_t shard_fp = file_fp(shard), cfg_fp = file_fp(cfg);

    snprintf(args, sizeof args, "store get '%s' -o '%s' --format v1 %016" PRIx64, dir, shard, h[0]);
    int rc_get = run_cli(args);
    int shard_kept = file_fp(shard) == shard_fp;

    char toks[400] = "";
    for (size_t i = 0; i < NB * 4; i++) {
        char w[16];
        snprintf(w, sizeof w, " %u", t[i]);
        strcat(toks, w);
    }
    snprintf(args, sizeof args, "store prefix '%s' -o '%s' --format v1%s", dir, cfg, toks);
    int rc_prefix = run_cli(args);
    int cfg_kept = file_fp(cfg) == cfg_fp;
    print_message("store get -o <its own shard>: exit %d, shard %s; store prefix -o <its STORE>: exit %d, STORE %s\n",
                  rc_get, shard_kept ? "kept" : "REPLACED", rc_prefix, cfg_kept ? "kept" : "REPLACED");
    kvx_store *r = NULL;
    int open_rc = kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY);
    kvx_store_close(r);
    if (!shard_kept || !cfg_kept)
        fail_msg("DEFECT rules 2/5: an output path inside the store replaced %s%s%s (the store now opens with %d)",
                 shard_kept ? "" : "an acknowledged shard", !shard_kept && !cfg_kept ? " and " : "",
                 cfg_kept ? "" : "the store's STORE file", open_rc);
    assert_int_not_equal(rc_get, 0);
    assert_int_not_equal(rc_prefix, 0);

    /* Any store's files, not only the one a command reads: convert (no
     * store of its own) onto the shard, and store get from another store
     * into this one, both exited 0 and replaced the acknowledged shard
     * (the check was in the store commands, against their own store). */
    char env[800], dir2[300];
    snprintf(env, sizeof env, "%s/one.tlkv", su_root);
    snprintf(args, sizeof args, "store get '%s' -o '%s' --format v1 %016" PRIx64, dir, env, h[0]);
    assert_int_equal(run_cli(args), 0);
    snprintf(args, sizeof args, "convert '%s' -o '%s'", env, shard);
    int rc_convert = run_cli(args);
    kvx_store *s2 = su_store(dir2, sizeof dir2, (su_spec){.capacity = 16 << 20, .geometry = &g});
    kvx_store_close(s2);
    snprintf(args, sizeof args, "store get '%s' -o '%s/shards/%s' --format v1 %016" PRIx64, dir2, dir, names[0], h[0]);
    int rc_other = run_cli(args);
    snprintf(args, sizeof args, "convert '%s' -o '%s/index/x'", env, dir);
    int rc_deep = run_cli(args);
    if (file_fp(shard) != shard_fp)
        fail_msg("DEFECT rule 2: convert or another store's get replaced an acknowledged shard (exit %d, %d)",
                 rc_convert, rc_other);
    assert_int_not_equal(rc_convert, 0);
    assert_int_not_equal(rc_other, 0);
    assert_int_not_equal(rc_deep, 0);
    unlink(env);
}

/* ------------------------------------------------------------------------
 * Rule 1 (availability of a good copy): get by hash and a damaged copy
 * ---------------------------------------------------------------------- */

/* Checks a view against the deterministic page of hash. */
static int view_is(const kvx_view *v, uint64_t hash)
{
    uint8_t want[64];
    su_page(want, sizeof want, hash);
    return v->shard && v->hash == hash && v->page_bytes == 64 && memcmp(v->page, want, 64) == 0;
}

/*
 * DEFECT (low: no wrong bytes, but a held block is refused).
 *
 * Reproducer: put a prompt, flush; damage block 2's page; put the prompt
 * again (the damaged blocks are stored again: "a put stores the block
 * again when its only copy is damaged"), flush. Now the hash of block 2
 * has two copies with one digest: a damaged one and a good one.
 * kvx_store_prefix and kvx_store_get_block serve the good copy, but
 * kvx_store_get_hash / get_hashes answer KVX_EPAGECRC whenever the
 * damaged copy's record sorts first: st_get_by_hash (engine/store.c)
 * remembers only the FIRST verified location ("pick = loc") and calls
 * st_try_loc on it alone. The test makes both orders (damage the old
 * copy; then repair it and damage the new one), so one of them hits it.
 *
 * Fix: in st_get_by_hash, after the count, try every location whose
 * digest equals `first` in turn (as st_lookup_hc does) and return
 * KVX_EPAGECRC/KVX_ETRUNC only when none of them passes.
 */
static void test_regress_get_hash_skips_good_copy(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    enum { NB = 4 };
    uint32_t t[NB * SU_B];
    uint64_t h[NB];
    su_tokens(t, 9, NB, 0);
    uint8_t *pages = su_pages(t, NB, h, 64);
    assert_int_equal(kvx_store_put(s, t, NB * SU_B, pages, NB, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    char names[8][64], oldp[800], newp[800];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    snprintf(oldp, sizeof oldp, "%s/shards/%s", dir, names[0]);
    flip_page_byte(oldp, 2);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    size_t added = 0;
    assert_int_equal(kvx_store_put(s, t, NB * SU_B, pages, NB, NULL, &added), 0);
    assert_int_equal(added, 1); /* block 2 again */
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    assert_int_equal(su_list_names(dir, "shards", names, 8), 2);
    snprintf(newp, sizeof newp, "%s/shards/%s", dir, names[0]);
    if (!strcmp(newp, oldp)) snprintf(newp, sizeof newp, "%s/shards/%s", dir, names[1]);

    int failures = 0;
    for (int round = 0; round < 2; round++) {
        if (round == 1) {
            flip_page_byte(oldp, 2); /* the old copy good again */
            kvx_shard *sh;
            assert_int_equal(kvx_shard_open(&sh, newp, 0), 0);
            /* the new shard holds block 2's second copy: damage it */
            uint32_t idx = UINT32_MAX;
            for (uint32_t i = 0; i < kvx_shard_get_info(sh)->num_blocks; i++) {
                kvx_entry e;
                if (kvx_shard_entry(&e, sh, i) == 0 && e.hash == h[2]) idx = i;
            }
            kvx_shard_close(sh);
            assert_true(idx != UINT32_MAX);
            flip_page_byte(newp, idx);
        }
        assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
        assert_int_equal(su_served_prefix(s, 9, NB), NB); /* the prefix finds the good copy */
        kvx_view v;
        assert_int_equal(kvx_store_get_block(&v, s, t, 3 * SU_B), 0);
        assert_true(view_is(&v, h[2]));
        kvx_view_release(&v);
        int rc = kvx_store_get_hash(&v, s, h[2]);
        int ok = rc == 0 && view_is(&v, h[2]);
        kvx_view_release(&v);
        kvx_view vs[1];
        int st1 = -1;
        assert_int_equal(kvx_store_get_hashes(vs, &st1, s, &h[2], 1), 0);
        int ok2 = st1 == 0 && view_is(&vs[0], h[2]);
        kvx_views_release(vs, 1);
        kvx_store_close(s);
        print_message("round %d (damaged copy: %s): get_hash %d, get_hashes %d\n", round, round ? "new" : "old",
                      rc, st1);
        if (!ok || !ok2) failures++;
    }
    if (failures)
        fail_msg("DEFECT: kvx_store_get_hash answered a page error although a good copy of the block (same "
                 "digest) is held and served by prefix and get_block (%d of 2 orders)",
                 failures);
    free(pages);
}

/* ------------------------------------------------------------------------
 * Rule 3: readers change nothing
 * ---------------------------------------------------------------------- */

typedef struct snap {
    size_t n;
    char name[64][128];
    uint64_t fp[64];
} snap;

/* Every entry under dir (two levels), with its bytes' fingerprint; the
 * contents of index/data.mdb and index/lock.mdb are left out (usage may be
 * recorded there, LMDB's reader table lives there). */
static void take_snap(const char *dir, snap *sn)
{
    memset(sn, 0, sizeof *sn);
    char top[64][64];
    size_t nt = su_list_names(dir, ".", top, 64);
    for (size_t i = 0; i < nt; i++) {
        char p[800];
        snprintf(p, sizeof p, "%s/%s", dir, top[i]);
        struct stat st;
        if (lstat(p, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            snprintf(sn->name[sn->n++], 128, "%s/", top[i]);
            char sub[64][64];
            size_t ns = su_list_names(dir, top[i], sub, 64);
            for (size_t j = 0; j < ns && sn->n < 64; j++) {
                char pp[900];
                snprintf(pp, sizeof pp, "%s/%s", p, sub[j]);
                snprintf(sn->name[sn->n], 128, "%s/%s", top[i], sub[j]);
                int mdb = !strcmp(top[i], "index") && strstr(sub[j], ".mdb");
                sn->fp[sn->n++] = mdb ? 0 : file_fp(pp);
            }
        } else if (sn->n < 64) {
            snprintf(sn->name[sn->n], 128, "%s", top[i]);
            sn->fp[sn->n++] = file_fp(p);
        }
    }
}

static void snap_compare(const snap *a, const snap *b, const char *after)
{
    int same = a->n == b->n;
    for (size_t i = 0; same && i < a->n; i++) same = !strcmp(a->name[i], b->name[i]) && a->fp[i] == b->fp[i];
    if (!same) {
        for (size_t i = 0; i < a->n; i++) print_message("  before: %s %016" PRIx64 "\n", a->name[i], a->fp[i]);
        for (size_t i = 0; i < b->n; i++) print_message("  after:  %s %016" PRIx64 "\n", b->name[i], b->fp[i]);
        fail_msg("rule 3: %s changed the store directory", after);
    }
}

static void test_reader_changes_nothing(void **state)
{
    (void)state;
    char dir[300], other[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 1, 4);
    su_put_flush(s, 2, 4);
    su_put_flush(s, 3, 2);
    kvx_store_close(s);
    /* a valid shard the index does not name (from a twin store) */
    kvx_store *o = su_store(other, sizeof other, (su_spec){.capacity = 16 << 20});
    su_put_flush(o, 50, 2);
    su_put_flush(o, 51, 2);
    su_put_flush(o, 52, 2);
    su_put_flush(o, 53, 2);
    kvx_store_close(o);
    char names[8][64], p[900], q[900];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 3);
    snprintf(p, sizeof p, "%s/shards/%s", dir, names[0]);
    flip_page_byte(p, 1); /* a damaged page */
    snprintf(p, sizeof p, "%s/shards/%s", dir, names[1]);
    FILE *f = fopen(p, "ab"); /* a shard one byte longer than its record */
    assert_non_null(f);
    fputc(0x5a, f);
    fclose(f);
    char on[8][64];
    assert_int_equal(su_list_names(other, "shards", on, 8), 4);
    snprintf(p, sizeof p, "%s/shards/%s", other, on[3]);
    snprintf(q, sizeof q, "%s/shards/00000000000000e0.kvx", dir);
    assert_int_equal(copy_file(p, q), 0); /* byte 3: free in dir */
    snprintf(q, sizeof q, "%s/shards/00000000000000e1.kvx", dir);
    f = fopen(q, "wb"); /* garbage under a shard's name */
    assert_non_null(f);
    fputs("not a shard at all", f);
    fclose(f);
    snprintf(q, sizeof q, "%s/staging/.00000000000000e2.kvx.tmp.1.1", dir);
    f = fopen(q, "wb"); /* a dead writer's leftover */
    assert_non_null(f);
    fputs("partial", f);
    fclose(f);
    snprintf(q, sizeof q, "%s/shards/.00000000000000e3.kvx.tmp.9", dir);
    f = fopen(q, "wb"); /* an older release's leftover */
    assert_non_null(f);
    fputs("partial", f);
    fclose(f);

    snap before, after;
    take_snap(dir, &before);
    /* the library, read-only */
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    for (uint64_t seq = 1; seq <= 3; seq++) (void)su_served_prefix(s, seq, 4);
    (void)su_served_prefix(s, 53, 2);
    uint32_t t[4 * SU_B];
    uint64_t h[4];
    su_tokens(t, 1, 4, 0);
    kvx_block_hashes(h, t, 4 * SU_B, SU_B);
    kvx_view v;
    for (int i = 0; i < 4; i++) {
        if (kvx_store_get_hash(&v, s, h[i]) == 0) kvx_view_release(&v);
        if (kvx_store_get(&v, s, KVX_COORD(0, i, 0)) == 0) kvx_view_release(&v);
        if (kvx_store_get(&v, s, KVX_COORD(3, i, 0)) == 0) kvx_view_release(&v);
    }
    if (kvx_store_get_block(&v, s, t, 4 * SU_B) == 0) kvx_view_release(&v);
    uint64_t bad = 0;
    (void)kvx_store_verify(s, &bad, NULL, NULL);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    kvx_shard **shs = NULL;
    size_t nsh = 0;
    if (kvx_store_shards(&shs, &nsh, s) == 0) {
        for (size_t i = 0; i < nsh; i++) kvx_shard_close(shs[i]);
        kvx_free(shs);
    }
    kvx_store_close(s);
    take_snap(dir, &after);
    snap_compare(&before, &after, "a KVX_STORE_READONLY handle");
    assert_true(bad > 0);

    /* the CLI's read commands */
    char args[3000], out[600];
    snprintf(out, sizeof out, "%s/out-%d.env", su_root, su_dir_counter++);
    snprintf(args, sizeof args, "store stat '%s'", dir);
    run_cli(args);
    snprintf(args, sizeof args, "store stat '%s' --json", dir);
    run_cli(args);
    snprintf(args, sizeof args, "store verify '%s'", dir);
    assert_int_not_equal(run_cli(args), 0);
    char toks[600] = "";
    for (size_t i = 0; i < 4 * SU_B; i++) {
        char w[16];
        snprintf(w, sizeof w, " %u", t[i]);
        strcat(toks, w);
    }
    snprintf(args, sizeof args, "store prefix '%s' -o '%s' --format v1%s", dir, out, toks);
    assert_int_equal(run_cli(args), 0);
    snprintf(args, sizeof args, "store get '%s' -o '%s' --format v1 %016" PRIx64, dir, out, h[0]);
    assert_int_equal(run_cli(args), 0);
    snprintf(args, sizeof args, "warmup '%s'", dir);
    run_cli(args);
    take_snap(dir, &after);
    snap_compare(&before, &after, "kvx store stat/verify/prefix/get and warmup");
}

/* ------------------------------------------------------------------------
 * Rule 4: reindex_dir against a writer, and killed half way
 * ---------------------------------------------------------------------- */

static void wait_child(pid_t pid)
{
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
}

/* In the child: the k-th call of the hooked seam entry ends the process
 * (a crash at that step). */
static const char *crash_mkdir_suffix;
static int (*real_mkdir)(const char *, mode_t);
static int mkdir_crash(const char *p, mode_t m)
{
    size_t lp = strlen(p), ls = strlen(crash_mkdir_suffix);
    if (lp >= ls && !strcmp(p + lp - ls, crash_mkdir_suffix)) _exit(0); /* before index/ is made again */
    return real_mkdir(p, m);
}

static long crash_open_after;
static int (*real_open2)(const char *, int, mode_t);
static int open_crash(const char *p, int fl, mode_t m)
{
    if (strstr(p, "/shards/") && --crash_open_after <= 0) _exit(0); /* while scanning shards/ */
    return real_open2(p, fl, m);
}

/* The store opens shard files by name under its shards/ descriptor. */
static int (*real_openat2)(int, const char *, int, mode_t);
static int openat_crash(int dfd, const char *name, int fl, mode_t m)
{
    size_t n = strlen(name);
    if (dfd != AT_FDCWD && n > 4 && !strcmp(name + n - 4, ".kvx") && --crash_open_after <= 0) _exit(0);
    return real_openat2(dfd, name, fl, m);
}

static void test_reindex_dir_busy_and_crash(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 1, 3);
    su_put_flush(s, 2, 3);
    su_put_flush(s, 3, 3);
    kvx_store_close(s);
    char ip[600];
    snprintf(ip, sizeof ip, "%s/index", dir);
    struct stat before, now;
    assert_int_equal(stat(ip, &before), 0);

    /* a writer in another process: NOWAIT is KVX_EBUSY, index/ untouched */
    int pfd[2], qfd[2];
    assert_int_equal(pipe(pfd), 0);
    assert_int_equal(pipe(qfd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        kvx_store *w;
        char c = kvx_store_open(&w, dir, NULL, 0) == 0 ? 'y' : 'n';
        if (write(pfd[1], &c, 1) != 1) _exit(2);
        if (read(qfd[0], &c, 1) != 1) _exit(2);
        kvx_store_close(w);
        _exit(0);
    }
    char c = 0;
    assert_int_equal(read(pfd[0], &c, 1), 1);
    assert_int_equal(c, 'y');
    assert_int_equal(kvx_store_reindex_dir(dir, KVX_STORE_NOWAIT), KVX_EBUSY);
    assert_int_equal(stat(ip, &now), 0);
    assert_true(now.st_ino == before.st_ino);
    char p2[700];
    snprintf(p2, sizeof p2, "%s/index.old", dir);
    assert_int_not_equal(access(p2, F_OK), 0);
    assert_int_equal(write(qfd[1], "x", 1), 1);
    wait_child(pid);
    close(pfd[0]);
    close(pfd[1]);
    close(qfd[0]);
    close(qfd[1]);

    /* killed right after index/ moved aside */
    pid = fork();
    if (pid == 0) {
        crash_mkdir_suffix = "/index";
        real_mkdir = kvx_os.mkdir;
        kvx_os.mkdir = mkdir_crash;
        kvx_store_reindex_dir(dir, 0);
        _exit(3); /* never reached the hook */
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(access(p2, F_OK), 0); /* index.old/ left by the crash */
    assert_int_not_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0); /* a reader names reindex */
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    for (uint64_t seq = 1; seq <= 3; seq++) assert_int_equal(su_served_prefix(s, seq, 3), 3);
    kvx_store_close(s);

    /* killed while the new index is being built (index/ new and empty,
     * index.old/ the previous one) */
    for (long k = 1; k <= 3; k++) {
        pid = fork();
        if (pid == 0) {
            crash_open_after = k;
            real_open2 = kvx_os.open;
            kvx_os.open = open_crash;
            real_openat2 = kvx_os.openat;
            kvx_os.openat = openat_crash;
            kvx_store_reindex_dir(dir, 0);
            _exit(3);
        }
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0); /* killed inside the scan, not after it */
        /* a writer's open alone recovers: it rebuilds an empty index */
        assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
        for (uint64_t seq = 1; seq <= 3; seq++) assert_int_equal(su_served_prefix(s, seq, 3), 3);
        kvx_store_close(s);
        assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
        assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
        for (uint64_t seq = 1; seq <= 3; seq++) assert_int_equal(su_served_prefix(s, seq, 3), 3);
        kvx_store_stats sst;
        assert_int_equal(kvx_store_stat(&sst, s), 0);
        assert_int_equal(sst.quarantined, 0);
        kvx_store_close(s);
    }
}

/* ------------------------------------------------------------------------
 * Rule 1: odd geometries and inputs
 * ---------------------------------------------------------------------- */

static void test_odd_geometries_and_inputs(void **state)
{
    (void)state;
    /* B = 1: every token a block */
    kvx_geometry g1 = {1, 1, 4, 1, KVX_QUANT_FP16, 7};
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .geometry = &g1});
    size_t pb = kvx_page_bytes(&g1, 1);
    uint32_t t[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    uint8_t *pages = calloc(8, pb);
    for (size_t i = 0; i < 8 * pb; i++) pages[i] = (uint8_t)(i % 50);
    size_t added = 0;
    assert_int_equal(kvx_store_put(s, t, 8, pages, 8, NULL, &added), 0);
    assert_int_equal(added, 8);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_view v[8];
    size_t n = 99;
    assert_int_equal(kvx_store_prefix(v, &n, s, t, 8, 0), 0); /* max_views 0 */
    assert_int_equal(n, 0);
    assert_int_equal(kvx_store_prefix(NULL, &n, s, t, 0, 0), 0); /* empty prompt */
    assert_int_equal(n, 0);
    assert_int_equal(kvx_store_prefix(v, &n, s, t, 8, 8), 0);
    assert_int_equal(n, 8);
    for (size_t i = 0; i < n; i++) assert_memory_equal(v[i].page, pages + i * pb, pb);
    kvx_views_release(v, n);
    /* a prompt differing in its first token shares no block */
    uint32_t t2[8];
    memcpy(t2, t, sizeof t2);
    t2[0] = 4;
    assert_int_equal(kvx_store_prefix(v, &n, s, t2, 8, 8), 0);
    assert_int_equal(n, 0);
    /* get_block with fewer tokens than a block (none here: B = 1) and 0 */
    kvx_view one;
    assert_int_equal(kvx_store_get_block(&one, s, t, 0), KVX_ETOKENS);
    kvx_store_close(s);
    free(pages);

    /* B = 4 store: a put whose n_tokens is not a multiple of B serves only
     * full blocks; the partial tail is never a block */
    s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    uint32_t tt[3 * SU_B + 2];
    uint64_t h[3];
    su_tokens(tt, 40, 3, 0);
    tt[3 * SU_B] = 1;
    tt[3 * SU_B + 1] = 2;
    uint8_t *p3 = su_pages(tt, 3, h, 64);
    assert_int_equal(kvx_store_put(s, tt, 3 * SU_B + 2, p3, 4, NULL, NULL), KVX_ETOKENS); /* 4 pages, 3 blocks */
    assert_int_equal(kvx_store_put(s, tt, 3 * SU_B + 2, p3, 3, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_prefix(v, &n, s, tt, 3 * SU_B + 2, 8), 0);
    assert_int_equal(n, 3);
    kvx_views_release(v, n);
    /* put_envelope whose tokens disagree with its hashes: refused, nothing
     * written (export the three blocks, then give another prompt's tokens) */
    assert_int_equal(kvx_store_prefix(v, &n, s, tt, 3 * SU_B, 8), 0);
    void *env = NULL;
    size_t len = 0;
    assert_int_equal(kvx_views_export(&env, &len, s, v, n, KVX_ENVELOPE_V1), 0);
    kvx_views_release(v, n);
    uint32_t wrong[3 * SU_B];
    su_tokens(wrong, 41, 3, 0);
    assert_int_equal(kvx_store_put_envelope(s, env, len, wrong, 3 * SU_B, &added), KVX_EHASH);
    assert_int_equal(added, 0);
    /* too few tokens for the envelope's blocks: refused too */
    assert_int_equal(kvx_store_put_envelope(s, env, len, tt, 2 * SU_B, &added), KVX_EHASH);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.pending_blocks, 0);
    kvx_free(env);
    free(p3);
    kvx_store_close(s);
}

/* ------------------------------------------------------------------------
 * Rule 2: quarantine/ that is not a directory
 * ---------------------------------------------------------------------- */

/* quarantine/ is a regular file or a symlink to a directory outside the
 * store, and shards/ holds a garbage file under a shard's name: a writer
 * never follows the link, never deletes the garbage file, and every
 * acknowledged block stays served. */
static void test_quarantine_not_a_directory(void **state)
{
    (void)state;
    for (int mode = 0; mode < 2; mode++) {
        char dir[300], q[700], g[700], outside[700];
        kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
        su_put_flush(s, 5, 3);
        kvx_store_close(s);
        snprintf(q, sizeof q, "%s/quarantine", dir);
        snprintf(outside, sizeof outside, "%s/outside-%d", su_root, su_dir_counter++);
        assert_int_equal(mkdir(outside, 0700), 0);
        if (mode == 0) {
            FILE *f = fopen(q, "wb");
            assert_non_null(f);
            fputs("a file", f);
            fclose(f);
        } else {
            assert_int_equal(symlink(outside, q), 0);
        }
        snprintf(g, sizeof g, "%s/shards/00000000000000d0.kvx", dir);
        FILE *f = fopen(g, "wb");
        assert_non_null(f);
        fputs("garbage under a shard name", f);
        fclose(f);
        int rc = kvx_store_open(&s, dir, NULL, 0);
        print_message("quarantine/ as a %s: writer open %d (%s)\n", mode ? "symlink" : "file", rc, kvx_last_error());
        if (rc == 0) {
            assert_int_equal(su_served_prefix(s, 5, 3), 3);
            kvx_store_close(s);
        }
        struct stat st;
        assert_int_equal(lstat(g, &st), 0); /* never deleted */
        char names[8][64];
        assert_int_equal(su_list_names(outside, ".", names, 8), 0); /* nothing written through the link */
        assert_int_equal(lstat(q, &st), 0);
        assert_true(mode == 0 ? S_ISREG(st.st_mode) : S_ISLNK(st.st_mode));
        assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
        assert_int_equal(su_served_prefix(s, 5, 3), 3);
        kvx_store_close(s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regress_gc_headless_transient_parent),
        cmocka_unit_test(test_regress_stale_index_newer_claimant),
        cmocka_unit_test(test_regress_cli_output_inside_store),
        cmocka_unit_test(test_regress_get_hash_skips_good_copy),
        cmocka_unit_test(test_reader_changes_nothing),
        cmocka_unit_test(test_reindex_dir_busy_and_crash),
        cmocka_unit_test(test_odd_geometries_and_inputs),
        cmocka_unit_test(test_quarantine_not_a_directory),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
