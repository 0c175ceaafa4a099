/*
 * gc.c - engine/store_gc.c: gc drops lineage without a head only when it
 * can see every shard (a transient failure is no verdict), keeps sparse
 * coordinates and salvaged shards' pins right.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/os.h"
#include "lib/store.h"

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
/* PROMISE: RECOVER-10 */
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

/* test_headless_chain_gc: gc drops blocks with no path to block 0. */
/* PROMISE: STORE-12 */
static void test_headless_chain_gc(void **state)
{
    (void)state;
    char dir[300];
    /* one sequence in its own shard per flush: block 0 alone, then the
     * rest of the chain in another shard */
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    uint32_t t[8 * SU_B];
    uint64_t h[8];
    su_tokens(t, 5, 8, 0);
    uint8_t *p = su_pages(t, 8, h, 64);
    assert_int_equal(kvx_store_put(s, t, SU_B, p, 1, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_put(s, t, 8 * SU_B, p, 8, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    su_put_flush(s, 6, 3); /* an unrelated whole chain */
    kvx_store_close(s);
    /* the shard holding block 0 is lost (removed by hand): blocks 1..7 have
     * no path to a block-0 ancestor */
    kvx_shard *sh;
    char names[64][64], path[800];
    size_t n = su_list_files(dir, "shards", names, 64);
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/shards/%s", dir, names[i]);
        assert_int_equal(kvx_shard_open(&sh, path, 0), 0);
        kvx_entry e;
        int holds_root = kvx_shard_get_info(sh)->num_blocks == 1 && kvx_shard_entry(&e, sh, 0) == 0 && e.hash == h[0];
        kvx_shard_close(sh);
        if (holds_root) assert_int_equal(unlink(path), 0);
    }
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, 10); /* 7 headless + 3 */
    assert_int_equal(kvx_store_gc(s), 0);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, 3);
    assert_int_equal(su_served_prefix(s, 6, 3), 3);
    kvx_store_close(s);
    free(p);
}

#define NB 3

/* A valid shard made with the public shard writer (this store's geometry
 * and model) whose one entry has coordinate block 1000 (radix_block is the
 * caller's), and a parent the store does not hold. Recovery used to adopt
 * it, and gc's headless pass then indexed keep[] (store_gc.c
 * st_rewrite_shard) by the coordinate's block, 1000, in an array of
 * num_blocks + 1 = 2 bytes: a heap read out of bounds (ASan). A file in
 * shards/ is input (DESIGN.md rule 5): now it is quarantined, and gc runs. */
/* PROMISE: RECOVER-6 */
static void test_gc_sparse_coordinates(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    assert_int_equal(su_put_seq(s, 1, NB), 0);
    kvx_store_close(s);
    char path[700], staging[700];
    snprintf(path, sizeof path, "%s/shards/00000000000000f0.kvx", dir);
    snprintf(staging, sizeof staging, "%s/staging", dir);
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.shard_id = 7;
    o.max_entries = 8;
    o.flags = KVX_FLAG_HASHES | KVX_FLAG_LINEAGE;
    o.staging_dir = staging;
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    uint32_t t[SU_B] = {11, 22, 33, 44};
    uint64_t parent = 0x1234567890ABCDEFull;
    uint8_t page[64];
    kvx_entry_in e;
    memset(&e, 0, sizeof e);
    e.radix_block = 1000;
    e.token_count = SU_B;
    e.hash = kvx_block_hash(parent, t, SU_B);
    su_page(page, 64, e.hash);
    e.page = page;
    e.parent = parent;
    e.tokens = t;
    assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    assert_int_equal(kvx_shard_writer_seal(w), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    /* not adopted: it goes to quarantine/ with the reason, never deleted */
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.shards, 1);
    assert_int_equal(st.quarantined, 1);
    char why[800], text[600] = {0};
    snprintf(why, sizeof why, "%s/quarantine/00000000000000f0.kvx.why", dir);
    FILE *f = fopen(why, "r");
    assert_non_null(f);
    size_t got = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    assert_true(got > 0);
    assert_non_null(strstr(text, "coordinate"));
    int rc = kvx_store_gc(s); /* was: ASan heap-buffer-overflow in st_rewrite_shard */
    if (rc) fail_msg("gc: %s (%s)", kvx_err_name(rc), kvx_last_error());
    assert_int_equal(su_served_prefix(s, 1, NB), NB);
    kvx_store_close(s);
}

/* Batch A puts a prompt the store already holds: its shard is pinned until
 * A's flush, which will acknowledge those blocks. gc then salvages that
 * shard (another block's page is damaged), copying the held blocks into a
 * new shard; then other puts turn the store over. A's pin must follow its
 * blocks into the new shard, or eviction takes them and A's flush
 * acknowledges blocks that are gone. */
/* PROMISE: DUR-11, STORE-11 */
static void test_pin_follows_salvage(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 2u << 20, .shard_bytes = 512u << 10});
    /* sequence 1, 12 blocks, in one shard */
    uint32_t t[12 * SU_B];
    uint64_t h[12];
    su_tokens(t, 1, 12, 0);
    uint8_t *p = su_pages(t, 12, h, 64);
    assert_int_equal(kvx_store_put(s, t, 12 * SU_B, p, 12, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    char names[4][64];
    assert_int_equal(su_list_names(dir, "shards", names, 4), 1);
    kvx_store_batch *a;
    assert_int_equal(kvx_store_batch_create(&a, s), 0);
    size_t added = 9;
    assert_int_equal(kvx_store_batch_put(a, t, 6 * SU_B, p, 6, NULL, &added), 0);
    assert_int_equal(added, 0); /* all held: the shard is pinned */
    /* damage block 9: gc salvages the shard, copying the good blocks */
    char path[800];
    snprintf(path, sizeof path, "%s/shards/%s", dir, names[0]);
    assert_int_equal(su_flip_page_byte(path, 9), 0);
    assert_int_equal(kvx_store_gc(s), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.quarantined, 1);
    /* turn the store over many times with other prompts */
    for (uint64_t q = 100; q < 100 + 200; q++) assert_int_equal(su_put_seq(s, q, 6), 0);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.evictions > 0);
    assert_int_equal(kvx_store_batch_flush(a), 0); /* acknowledges sequence 1's first 6 blocks */
    assert_int_equal(su_served_prefix(s, 1, 6), 6);
    kvx_store_batch_destroy(a);
    kvx_store_close(s);
    free(p);
}

/* Flips the byte at off of dir/shards/name. */
static void flip_at(const char *dir, const char *name, long off)
{
    char p[700];
    snprintf(p, sizeof p, "%.300s/shards/%.64s", dir, name);
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, off, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, off, SEEK_SET), 0);
    fputc(c ^ 0x40, f);
    assert_int_equal(fclose(f), 0);
}

/* One flipped byte in a shard's coordinate table made every gc fail with
 * a false EIO ("shard N cannot be opened to copy its blocks") and salvage
 * nothing, not even the other shards' good blocks. Now gc judges every
 * shard first: that one goes to quarantine/ whole (its tables, which
 * locate and name its blocks, cannot be trusted), a shard with one damaged
 * page has its good blocks salvaged, the run succeeds, and its note and
 * kvx_store_recovery name what was set aside. */
/* PROMISE: RECOVER-38 */
static void test_gc_damaged_table_does_not_stop_gc(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10});
    for (uint64_t q = 1; q <= 6; q++) su_put_flush(s, q, 4);
    kvx_store_close(s);
    char names[64][64];
    size_t n = su_list_names(dir, "shards", names, 64);
    assert_true(n >= 3);
    flip_at(dir, names[0], 0x41); /* the coordinate table: the meta CRC fails */
    s = su_reopen(dir, 0); /* sizes and inodes unchanged: the catalog stands */
    /* a page of the last shard: its CRC fails, the other pages are good */
    kvx_shard **all = NULL;
    size_t ns = 0;
    assert_int_equal(kvx_store_shards(&all, &ns, s), 0);
    uint64_t page_off = 0;
    char page_name[64] = "";
    for (size_t i = 0; i < ns; i++) {
        kvx_entry e;
        if (!page_name[0] && kvx_shard_get_info(all[i])->num_blocks >= 2 && kvx_shard_entry(&e, all[i], 1) == 0 &&
            strcmp(kvx_shard_path(all[i]) + strlen(kvx_shard_path(all[i])) - 20, names[0]) != 0) {
            page_off = e.offset;
            snprintf(page_name, sizeof page_name, "%s", kvx_shard_path(all[i]) + strlen(kvx_shard_path(all[i])) - 20);
        }
        kvx_shard_close(all[i]);
    }
    kvx_free(all);
    assert_true(page_name[0]);
    flip_at(dir, page_name, (long)page_off + 3);
    int rc = kvx_store_gc(s);
    if (rc) fail_msg("gc with one damaged table: %s (%s)", kvx_err_name(rc), kvx_last_error());
    assert_non_null(strstr(kvx_last_error(), names[0]));
    kvx_recovery_report r;
    assert_int_equal(kvx_store_recovery(s, &r), 0);
    assert_int_equal(r.quarantined, 2);
    /* every block of the other shards, and the damaged page's neighbours,
     * still served */
    size_t served = 0;
    for (uint64_t q = 1; q <= 6; q++) served += su_served_prefix(s, q, 4);
    kvx_store_close(s);
    char qp[700];
    struct stat st;
    snprintf(qp, sizeof qp, "%s/quarantine/%s", dir, names[0]);
    assert_int_equal(stat(qp, &st), 0);
    snprintf(qp, sizeof qp, "%s/quarantine/%s", dir, page_name);
    assert_int_equal(stat(qp, &st), 0);
    if (served < 24 - 4 - 4) fail_msg("%zu of 24 blocks served after gc: good blocks were lost", served);
}

int main(int argc, char **argv)
{
    /* these tests read the files one flush writes as its own shard
     * file (the path keyed stores, whole batches and a second batch
     * still take): the active shard has its own, tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regress_gc_headless_transient_parent),
        cmocka_unit_test(test_headless_chain_gc),
        cmocka_unit_test(test_gc_sparse_coordinates),
        cmocka_unit_test(test_pin_follows_salvage),
        cmocka_unit_test(test_gc_damaged_table_does_not_stop_gc),
    };
    return cmocka_run_group_tests_name("engine/gc", tests, su_setup, su_teardown);
}
