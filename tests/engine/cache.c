/*
 * cache.c - engine/store_cache.c, the shard cache: a passing failure (no
 * mapping-guard slot, EMFILE, EIO) is never a verdict on a shard file; a
 * shard name that became a symlink is neither followed nor served; every
 * served page is checked again under KVX_STORE_VERIFY, and once per
 * handle otherwise, even when a file is rewritten to its old size.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/sigbus.h"
#include "format/format.h"
#include "lib/fault.h"
#include "lib/io.h"
#include "lib/store.h"

#define NSEQ 6 /* sequences put (one flush each) */

/* A store with NSEQ flushed sequences (several shards), closed. */
static void filled_store(char *dir, size_t n)
{
    kvx_store *s = su_store(dir, n, (su_spec){.capacity = 8 << 20, .shard_bytes = 40 << 10, .flags = KVX_STORE_NOWAIT});
    for (uint64_t q = 0; q < NSEQ; q++) {
        su_put_nb(s, q);
        assert_int_equal(kvx_store_flush(s), 0);
    }
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.shards >= 2);
    kvx_store_close(s);
}

/* Reopens dir and checks every sequence whole and nothing dropped. */
static void check_all(const char *dir)
{
    kvx_store *s = NULL;
    int rc = kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT);
    if (rc) fprintf(stderr, "open: %s\n", kvx_last_error());
    assert_int_equal(rc, 0);
    for (uint64_t q = 0; q < NSEQ; q++) assert_int_equal(su_prefix_nb(s, q), SU_NB);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.dropped_shards, 0);
    uint64_t bad = 9;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    assert_int_equal(bad, 0);
    kvx_store_close(s);
}

static int (*real_open)(const char *, int, mode_t);

static int open_errno;

static long open_failed;

/* Fails opens of sealed shard files (shards/<gen>.kvx) with open_errno. */
static int failing_open(const char *path, int flags, mode_t mode)
{
    const char *sl = strrchr(path, '/');
    size_t len = strlen(path);
    if (sl && sl - path >= 7 && !strncmp(sl - 7, "/shards", 7) && sl[1] != '.' && len > 4 &&
        !strcmp(path + len - 4, ".kvx")) {
        open_failed++;
        errno = open_errno;
        return -1;
    }
    return real_open(path, flags, mode);
}

/* The same for openat: the store opens its shards by name under its
 * shards/ descriptor. */
static int (*real_openat)(int, const char *, int, mode_t);

static int failing_openat(int dfd, const char *name, int flags, mode_t mode)
{
    char fdp[64], dir[4096];
    snprintf(fdp, sizeof fdp, "/proc/self/fd/%d", dfd);
    ssize_t n = dfd == AT_FDCWD ? -1 : readlink(fdp, dir, sizeof dir - 1);
    size_t len = strlen(name);
    if (n >= 7 && !strncmp(dir + n - 7, "/shards", 7) && name[0] != '.' && !strchr(name, '/') && len > 4 &&
        !strcmp(name + len - 4, ".kvx")) {
        open_failed++;
        errno = open_errno;
        return -1;
    }
    return real_openat(dfd, name, flags, mode);
}

static void fail_shard_opens(int err)
{
    kvx_os_reset();
    real_open = kvx_os.open;
    real_openat = kvx_os.openat;
    open_errno = err;
    open_failed = 0;
    kvx_os.open = failing_open;
    kvx_os.openat = failing_openat;
}

/* Every mapping-guard slot taken (a process with many shards mapped): a
 * lookup cannot map a shard. Before the fix the shard was marked bad, and
 * the next flush dropped it from the index and deleted its file. */
/* PROMISE: RECOVER-10 */
static void test_no_mapping_slot_is_not_damage(void **state)
{
    (void)state;
    char dir[300];
    filled_store(dir, sizeof dir);
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT), 0);
    static int slots[8192];
    int nslots = 0;
    static const char dummy[1];
    while (nslots < (int)(sizeof slots / sizeof slots[0]) &&
           kvx_sigbus_register(&slots[nslots], dummy, sizeof dummy) == 0)
        nslots++;
    assert_true(nslots > 0);
    /* lookups miss (nothing can be mapped), a put + flush goes through */
    assert_int_equal(su_prefix_nb(s, 0), 0);
    su_put_nb(s, 100);
    assert_int_equal(kvx_store_flush(s), 0);
    for (int i = 0; i < nslots; i++) kvx_sigbus_unregister(slots[i]);
    for (uint64_t q = 0; q < NSEQ; q++) assert_int_equal(su_prefix_nb(s, q), SU_NB);
    kvx_store_close(s);
    check_all(dir);
}

/* KVX_STORE_VERIFY opens every registered shard at open: an EMFILE there
 * is not damage. Before the fix every shard was dropped and deleted. */
/* PROMISE: RECOVER-10 */
static void test_verify_open_transient(void **state)
{
    (void)state;
    char dir[300];
    filled_store(dir, sizeof dir);
    fail_shard_opens(EMFILE);
    kvx_store *s = NULL;
    int rc = kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT | KVX_STORE_VERIFY);
    kvx_os_reset();
    assert_true(open_failed > 0);
    if (rc == 0) kvx_store_close(s);
    check_all(dir);
}

/* A reindex that cannot open a shard (EIO) must fail, not rebuild an index
 * without it: the next open deletes every file the index does not name.
 * Before the fix the reindex returned 0 and the reopen deleted the shards. */
/* PROMISE: RECOVER-10 */
static void test_reindex_transient(void **state)
{
    (void)state;
    char dir[300];
    filled_store(dir, sizeof dir);
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT), 0);
    fail_shard_opens(EIO);
    int rc = kvx_store_reindex(s);
    kvx_os_reset();
    assert_true(open_failed > 0);
    assert_int_equal(rc, -EIO);
    assert_non_null(strstr(kvx_last_error(), "reindex"));
    kvx_store_close(s);
    check_all(dir);
    /* the same through open on a lost index */
    char p[400];
    snprintf(p, sizeof p, "%s/index", dir);
    su_rm_rf(p);
    assert_int_equal(mkdir(p, 0700), 0);
    fail_shard_opens(EIO);
    rc = kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT);
    kvx_os_reset();
    assert_int_equal(rc, -EIO);
    assert_null(s);
    check_all(dir);
}

/* A shard name replaced by a symlink to a file outside the store: lookups
 * refuse it (fstatat without following); verify must not read through it
 * and call the store sound. */
/* PROMISE: STORE-1 */
static void test_verify_symlinked_shard(void **state)
{
    (void)state;
    char dir[300], outside[400];
    filled_store(dir, sizeof dir);
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT), 0);
    kvx_shard **sh;
    size_t n;
    assert_int_equal(kvx_store_shards(&sh, &n, s), 0);
    assert_true(n >= 1);
    char path[400];
    snprintf(path, sizeof path, "%s", kvx_shard_path(sh[0]));
    for (size_t i = 0; i < n; i++) kvx_shard_close(sh[i]);
    kvx_free(sh);
    /* swapped while the store is open (recovery at open drops a shard
     * that is not a regular file, so this is the window verify has) */
    snprintf(outside, sizeof outside, "%s/outside-%d.kvx", su_root, su_dir_counter);
    assert_int_equal(rename(path, outside), 0);
    assert_int_equal(symlink(outside, path), 0);
    uint64_t bad = 0;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), KVX_ECORRUPT);
    assert_true(bad >= 1);
    kvx_store_close(s);
}

/* The group's teardown: the OS seam as it was, then su_teardown. */
static int os_reset_teardown(void **state)
{
    kvx_os_reset();
    return su_teardown(state);
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
/* PROMISE: STORE-1 */
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

int kvx_shard_mem(kvx_shard **out, const kvx_geometry *g, uint32_t n, void **pages, const uint64_t *hashes,
                  const uint64_t *parents, const uint32_t *tokens, const uint8_t *digests, const float *scales);

enum { NB = 8 };

static int dir_n;

/* A store of su_geometry (pages of 64 bytes) holding one prompt of NB
 * blocks (sequence seq), closed; its only shard's path goes to shard.
 * Returns the prompt's pages. */
static uint8_t *one_prompt(char *dir, size_t dcap, char *shard, size_t scap, uint64_t seq, uint32_t *t, uint64_t *h)
{
    snprintf(dir, dcap, "%s/s%d", io_tmpdir, dir_n++);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 16 << 20;
    o.shard_bytes = 256 << 10;
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    su_tokens(t, seq, NB, 0);
    uint8_t *pages = su_pages(t, NB, h, 64);
    assert_int_equal(kvx_store_put(s, t, NB * SU_B, pages, NB, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    char names[8][64];
    size_t n = su_list_names(dir, "shards", names, 8), found = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        if (len > 4 && !strcmp(names[i] + len - 4, ".kvx")) {
            snprintf(shard, scap, "%s/shards/%s", dir, names[i]);
            found++;
        }
    }
    assert_int_equal(found, 1);
    return pages;
}

/* The number of leading blocks served for t, each equal to its page. */
static size_t served_exact(kvx_store *s, const uint32_t *t, const uint8_t *pages)
{
    kvx_view v[NB];
    size_t n = 0;
    assert_int_equal(kvx_store_prefix(v, &n, s, t, NB * SU_B, NB), 0);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(v[i].page_bytes, 64);
        assert_memory_equal(v[i].page, pages + i * 64, 64);
    }
    kvx_views_release(v, n);
    return n;
}

/* The file offset of the page of the block with this hash. */
static uint64_t page_offset(const char *shard, uint64_t hash)
{
    kvx_shard *sh;
    assert_int_equal(kvx_shard_open(&sh, shard, 0), 0);
    uint64_t off = 0;
    for (uint32_t i = 0; i < kvx_shard_get_info(sh)->num_blocks; i++) {
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, sh, i), 0);
        if (e.hash == hash) off = e.offset;
    }
    kvx_shard_close(sh);
    assert_true(off > 0);
    return off;
}

/* Flips a bit of the byte at off in place and sets the file's times back:
 * the size and mtime are as before, as when a disk returns other bytes. */
static void flip_keep_mtime(const char *path, uint64_t off)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    uint8_t x;
    assert_int_equal(pread(fd, &x, 1, (off_t)off), 1);
    x ^= 0x40;
    assert_int_equal(pwrite(fd, &x, 1, (off_t)off), 1);
    const struct timespec times[2] = {st.st_atim, st.st_mtim};
    assert_int_equal(futimens(fd, times), 0);
    close(fd);
}

/* Finding 1 (a): KVX_STORE_VERIFY, "lookups: check each served page's
 * CRC", was read at open only: a page already served was handed out
 * again unchecked, so an in-place flip that keeps the size and mtime was
 * served as KV. */
/* PROMISE: TRUST-8 */
static void test_verify_every_served_page(void **state)
{
    (void)state;
    char dir[300], shard[600];
    uint32_t t[NB * SU_B];
    uint64_t h[NB];
    uint8_t *pages = one_prompt(dir, sizeof dir, shard, sizeof shard, 3, t, h);
    kvx_store *s;
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY | KVX_STORE_VERIFY), 0);
    assert_int_equal(served_exact(s, t, pages), NB); /* every page checked once */
    uint64_t off = page_offset(shard, h[2]) + 5;
    struct stat before, after;
    assert_int_equal(stat(shard, &before), 0);
    flip_keep_mtime(shard, off);
    assert_int_equal(stat(shard, &after), 0);
    assert_int_equal(after.st_size, before.st_size);
    assert_int_equal(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
    assert_int_equal(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
    assert_int_equal(served_exact(s, t, pages), 2);
    assert_non_null(strstr(kvx_last_error(), "page CRC mismatch"));
    kvx_view one;
    assert_int_equal(kvx_store_get_hash(&one, s, h[2]), KVX_EPAGECRC);
    assert_null(one.shard);
    /* the byte put back: served again, checked again */
    flip_keep_mtime(shard, off);
    assert_int_equal(served_exact(s, t, pages), NB);
    kvx_store_close(s);
    free(pages);
}

/* Finding 1 (b): without the flag a page is checked once per handle, and
 * was handed out again while the file kept its size. A file truncated and
 * written again to its old size with no lookup in between (cp over it,
 * rsync --inplace) served its new bytes unchecked; now its mtime, not the
 * one seen at open, has every page checked again once seen (20 ms). */
/* PROMISE: TRUST-8 */
static void test_rewrite_same_size_mtime(void **state)
{
    (void)state;
    char dir[300], shard[600];
    uint32_t t[NB * SU_B];
    uint64_t h[NB];
    uint8_t *pages = one_prompt(dir, sizeof dir, shard, sizeof shard, 4, t, h);
    kvx_store *s;
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(served_exact(s, t, pages), NB); /* every page checked once */
    struct stat before, after;
    assert_int_equal(stat(shard, &before), 0);
    size_t size = (size_t)before.st_size;
    uint8_t *bytes = malloc(size);
    assert_non_null(bytes);
    int fd = open(shard, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, bytes, size, 0), (ssize_t)size);
    close(fd);
    bytes[page_offset(shard, h[2]) + 5] ^= 0x40;
    usleep(20 * 1000); /* a tick of the file system's clock: a new mtime */
    assert_int_equal(truncate(shard, 0), 0);
    fd = open(shard, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, bytes, size, 0), (ssize_t)size);
    close(fd);
    free(bytes);
    assert_int_equal(stat(shard, &after), 0);
    assert_int_equal(after.st_size, before.st_size);
    usleep(60 * 1000);
    assert_int_equal(served_exact(s, t, pages), 2);
    assert_non_null(strstr(kvx_last_error(), "page CRC mismatch"));
    /* the other pages are checked again, and served: they are intact */
    kvx_view one;
    assert_int_equal(kvx_store_get_hash(&one, s, h[5]), 0);
    assert_memory_equal(one.page, pages + 5 * 64, 64);
    kvx_view_release(&one);
    kvx_store_close(s);
    free(pages);
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
    io_teardown(state);
    su_teardown(state);
    os_reset_teardown(state);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_mapping_slot_is_not_damage),
        cmocka_unit_test(test_verify_open_transient),
        cmocka_unit_test(test_reindex_transient),
        cmocka_unit_test(test_verify_symlinked_shard),
        cmocka_unit_test(test_shard_swapped_for_symlink),
        cmocka_unit_test_setup(test_verify_every_served_page, os_reset),
        cmocka_unit_test_setup(test_rewrite_same_size_mtime, os_reset),
    };
    return cmocka_run_group_tests_name("engine/cache", tests, setup_all, teardown_all);
}
