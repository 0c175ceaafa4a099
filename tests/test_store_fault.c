/*
 * test_store_fault.c - fault injection through the OS seam (tests/fault.h).
 *
 * The store: at every step of a put + flush, and of a gc that evicts and
 * compacts, the operation's OS calls are counted once, then the operation
 * is re-run failing call k, for every k, with ENOSPC, EIO, a failed fsync
 * and a short write. After each run: the error (if any) surfaced, every
 * block acknowledged so far still reads back byte-exact, a failed
 * operation leaves nothing half-visible, and the store takes the next put
 * + flush. Finally the store is reopened (recovery) and everything is
 * checked again. (LMDB's own I/O does not go through the seam; its commit
 * is atomic.) A failed mmap of a shard is a miss now, never a verdict on
 * the shard. The seal's stat, the lock and the directory walks of the
 * store are swept the same way (the store makes them through the seam: a
 * sweep that sees none of them fails).
 *
 * Below the store: the shard writer (create, add, seal: each call failed,
 * named in the error, nothing left at the path or beside it), the shard
 * reader's open (open, fstat, the table reads, mmap: each failed with its
 * own errno and message, no descriptor or mapping left) and the seam's
 * directory walk (its open or any step failed).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/fault.h"
#include "lib/store.h"

#define NB 3 /* blocks per sequence */
#define MAXSEQ 4096

static uint64_t acked[MAXSEQ];
static int nacked;

static int put_flush(kvx_store *s, uint64_t seq)
{
    uint32_t t[NB * SU_B];
    uint64_t h[NB];
    su_tokens(t, seq, NB, 0);
    uint8_t *p = su_pages(t, NB, h, 64);
    int rc = kvx_store_put(s, t, NB * SU_B, p, NB, NULL, NULL);
    free(p);
    if (rc) return rc;
    return kvx_store_flush(s);
}

/* Leading blocks of seq served by prefix, each checked byte for byte. */
static size_t served(kvx_store *s, uint64_t seq) { return su_served_prefix(s, seq, NB); }

static void check_all(kvx_store *s)
{
    for (int i = 0; i < nacked; i++) assert_int_equal(served(s, acked[i]), NB);
}

/* Fails each of the ncalls calls of a put + flush in turn: every kind of
 * call with ENOSPC, EIO and a short transfer (only == 0), or only the
 * calls of the kinds in only, with EIO. A failed flush's message contains
 * says (nullable). */
static void run_modes(kvx_store *s, uint64_t *seq, long ncalls, unsigned only, const char *says)
{
    static const struct { int err, mode; } modes[] = {
        {ENOSPC, FAULT_ERRNO}, {EIO, FAULT_ERRNO}, {EIO, FAULT_SHORT}};
    for (size_t m = 0; m < (only ? 1 : 3); m++) {
        for (long k = 1; k <= ncalls; k++) {
            fault_only = only;
            fault_reset(k, only ? EIO : modes[m].err, modes[m].mode);
            uint64_t q = (*seq)++;
            int rc = put_flush(s, q);
            long hits = fault_hits;
            fault_reset(0, EIO, FAULT_ERRNO);
            fault_only = 0;
            if (rc == 0) {
                /* acknowledged: must be whole (a short write is retried,
                 * a failed unlink of a leftover is harmless) */
                assert_int_equal(served(s, q), NB);
                acked[nacked++] = q;
            } else {
                assert_true(hits > 0);
                assert_true(kvx_last_error()[0] != '\0');
                if (says && !strstr(kvx_last_error(), says))
                    fail_msg("failed %s, message: %s", fault_hit_op ? fault_hit_op : "?", kvx_last_error());
                assert_int_equal(served(s, q), 0); /* nothing half-visible */
            }
            check_all(s);
            /* usable afterwards */
            uint64_t q2 = (*seq)++;
            assert_int_equal(put_flush(s, q2), 0);
            acked[nacked++] = q2;
            assert_true(nacked < MAXSEQ - 8);
        }
    }
}

static void test_flush_faults(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/f", su_root);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 64 << 20;
    kvx_store *s;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    uint64_t seq = 0;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(put_flush(s, seq), 0);
        acked[nacked++] = seq++;
    }
    fault_install();
    fault_reset(0, EIO, FAULT_ERRNO);
    assert_int_equal(put_flush(s, seq), 0);
    acked[nacked++] = seq++;
    long ncalls = fault_calls;
    assert_true(ncalls >= 5); /* create, writes, fsyncs, renames */
    run_modes(s, &seq, ncalls, 0, NULL);
    /* the fsyncs alone, one at a time */
    fault_only = FAULT_SYNC;
    fault_reset(0, EIO, FAULT_ERRNO);
    assert_int_equal(put_flush(s, seq), 0);
    acked[nacked++] = seq++;
    long nsync = fault_calls;
    fault_only = 0;
    assert_true(nsync >= 2);
    run_modes(s, &seq, nsync, FAULT_SYNC, NULL);
    fault_uninstall();
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    check_all(s);
    uint64_t bad = 1;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    assert_int_equal(bad, 0);
    kvx_store_close(s);
}

/* gc that compacts many small shards (and evicts), failing each call. */
static void test_gc_faults(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/g", su_root);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 64 << 20;
    kvx_store *s;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    nacked = 0;
    uint64_t seq = 10000;
    fault_install();
    for (long k = 1;; k++) {
        for (int i = 0; i < 4; i++) { /* four small shards to merge */
            assert_int_equal(put_flush(s, seq), 0);
            acked[nacked++] = seq++;
        }
        fault_reset(k, k % 2 ? EIO : ENOSPC, FAULT_ERRNO);
        int rc = kvx_store_gc(s);
        long hits = fault_hits;
        fault_reset(0, EIO, FAULT_ERRNO);
        if (rc != 0) assert_true(hits > 0);
        if (getenv("FAULT_DEBUG")) fprintf(stderr, "k=%ld rc=%d hits=%ld %s\n", k, rc, hits, kvx_last_error());
        check_all(s); /* compaction never loses a block, failed or not */
        if (hits == 0) {
            assert_int_equal(rc, 0);
            break; /* k passed the last call of gc */
        }
        assert_true(k < 200);
    }
    fault_uninstall();
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.compactions > 0);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    check_all(s);
    kvx_store_close(s);
}

/* ------------------------------------------------- the shard writer */

/* Descriptors open in this process. */
static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

/* Mappings of path in this process. */
static int mappings_of(const char *path)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[4352];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, path)) n++;
    fclose(f);
    return n;
}

/* Entries of dir ("." and ".." left out). */
static int dir_count(const char *dir)
{
    char names[64][64];
    return (int)su_list_names(dir, ".", names, 64);
}

/* A three-entry shard at path: create, add, seal. The temporary file is
 * an unnamed one beside path, or a named one in staging (non-NULL). 0 or
 * the code of the first call that failed (the writer then aborted). */
static int write_shard(const char *path, const char *staging)
{
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.max_entries = 8;
    o.staging_dir = staging;
    kvx_shard_writer *w;
    int rc = kvx_shard_writer_create(&w, path, &o);
    if (rc) return rc;
    for (uint32_t i = 0; i < 3 && !rc; i++) {
        uint8_t page[64];
        su_page(page, sizeof page, i + 1);
        kvx_entry_in e = {.radix_block = (uint16_t)i, .token_count = SU_B, .page = page};
        rc = kvx_shard_writer_add(w, &e);
    }
    if (rc) {
        kvx_shard_writer_abort(w);
        return rc;
    }
    return kvx_shard_writer_seal(w);
}

/* Each call of writing a shard fails in turn: the error is the injected
 * errno, its message names the cause, and nothing is left at the path,
 * beside it or in staging/. */
static void test_seal_faults(void **state)
{
    (void)state;
    char dir[300], staging[320], path[340];
    snprintf(dir, sizeof dir, "%s/w", su_root);
    snprintf(staging, sizeof staging, "%s/staging", dir);
    snprintf(path, sizeof path, "%s/a.kvx", dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(mkdir(staging, 0700), 0);
    for (int named = 0; named < 2; named++) {
        const char *stage = named ? staging : NULL;
        fault_install();
        assert_int_equal(write_shard(path, stage), 0);
        long ncalls = fault_calls;
        assert_true(ncalls >= 7); /* open, 3 pages, header, ftruncate, fsync, (link), rename, fsync of dir */
        assert_int_equal(unlink(path), 0);
        int fds = open_fds();
        for (long k = 1; k <= ncalls; k++) {
            int err = k % 2 ? EIO : ENOSPC;
            fault_reset(k, err, FAULT_ERRNO);
            int rc = write_shard(path, stage);
            const char *op = fault_hit_op;
            fault_reset(0, EIO, FAULT_ERRNO);
            if (getenv("FAULT_DEBUG")) fprintf(stderr, "seal k=%ld %s rc=%d %s\n", k, op, rc, kvx_last_error());
            assert_non_null(op);
            assert_int_equal(rc, -err);
            assert_non_null(strstr(kvx_last_error(), strerror(err)));
            assert_int_equal(access(path, F_OK), -1); /* nothing at the path */
            assert_int_equal(dir_count(dir), 1);      /* staging/ alone beside it */
            assert_int_equal(dir_count(staging), 0);
            assert_int_equal(open_fds(), fds);
        }
        fault_uninstall();
        assert_int_equal(write_shard(path, stage), 0); /* and it works afterwards */
        kvx_shard *sh;
        assert_int_equal(kvx_shard_open(&sh, path, KVX_OPEN_VERIFY_PAGES), 0);
        assert_int_equal(kvx_shard_get_info(sh)->num_blocks, 3);
        kvx_shard_close(sh);
        assert_int_equal(unlink(path), 0);
    }
}

/* ------------------------------------------------- the shard reader */

/* Each call of a shard open fails in turn: the open returns the injected
 * errno with a message naming the call (open, fstat, the read, mmap), and
 * leaves no handle, descriptor or mapping behind. */
static void test_shard_open_faults(void **state)
{
    (void)state;
    char dir[300], path[340];
    snprintf(dir, sizeof dir, "%s/r", su_root);
    snprintf(path, sizeof path, "%s/a.kvx", dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(write_shard(path, NULL), 0);
    static const struct { const char *op, *says; } names[] = {
        {"open", "cannot open"}, {"fstat", "fstat"}, {"pread", "read at offset"}, {"mmap", "mmap"}};
    fault_install();
    kvx_shard *sh = NULL;
    assert_int_equal(kvx_shard_open(&sh, path, 0), 0);
    kvx_shard_close(sh);
    long ncalls = fault_calls;
    assert_true(ncalls >= 4);
    int fds = open_fds(), seen_map = 0, seen_fstat = 0;
    for (long k = 1; k <= ncalls; k++) {
        fault_reset(k, EIO, FAULT_ERRNO);
        sh = (kvx_shard *)1;
        int rc = kvx_shard_open(&sh, path, 0);
        const char *op = fault_hit_op;
        fault_reset(0, EIO, FAULT_ERRNO);
        assert_non_null(op);
        assert_int_equal(rc, -EIO);
        assert_null(sh);
        const char *says = NULL;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (!strcmp(names[i].op, op)) says = names[i].says;
        assert_non_null(says); /* a call the reader makes that this test does not know */
        if (!strstr(kvx_last_error(), says)) fail_msg("failed %s, message: %s", op, kvx_last_error());
        seen_map += !strcmp(op, "mmap");
        seen_fstat += !strcmp(op, "fstat");
        assert_int_equal(open_fds(), fds);
        assert_int_equal(mappings_of(path), 0);
    }
    assert_int_equal(seen_map, 1);
    assert_int_equal(seen_fstat, 1);
    /* the two named alone, with the errno each would see: each its own */
    fault_only = FAULT_MAP;
    fault_reset(1, ENOMEM, FAULT_ERRNO);
    assert_int_equal(kvx_shard_open(&sh, path, 0), -ENOMEM);
    assert_int_equal(fault_hits, 1);
    assert_non_null(strstr(kvx_last_error(), "mmap of"));
    assert_non_null(strstr(kvx_last_error(), strerror(ENOMEM)));
    fault_only = FAULT_FSTAT;
    fault_reset(1, EOVERFLOW, FAULT_ERRNO);
    assert_int_equal(kvx_shard_open(&sh, path, 0), -EOVERFLOW);
    assert_int_equal(fault_hits, 1);
    assert_non_null(strstr(kvx_last_error(), "fstat"));
    fault_only = 0;
    fault_uninstall();
    assert_int_equal(open_fds(), fds);
    assert_int_equal(kvx_shard_open(&sh, path, KVX_OPEN_VERIFY_PAGES), 0);
    kvx_shard_close(sh);
}

/* ------------------------------------------------- the directory walk */

static int count_name(void *ctx, const char *name)
{
    (void)name;
    ++*(int *)ctx;
    return 0;
}

static int stop_at_two(void *ctx, const char *name)
{
    (void)name;
    return ++*(int *)ctx == 2 ? KVX_ECANCELED : 0;
}

/* The walk's open (call 1) or any step (calls 2..) fails: the walk says
 * so (-errno, *walk_failed), the names before it were seen, and the
 * directory is closed. A callback's own result is told apart. */
static void test_walk_faults(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/d", su_root);
    assert_int_equal(mkdir(dir, 0700), 0);
    for (int i = 0; i < 5; i++) {
        char p[340];
        snprintf(p, sizeof p, "%s/f%d", dir, i);
        FILE *f = fopen(p, "w");
        assert_non_null(f);
        fclose(f);
    }
    int fds = open_fds(), n = 0, walk_failed = -1;
    fault_install();
    fault_only = FAULT_DIR;
    assert_int_equal(kvx_os_each_name(AT_FDCWD, dir, 0, count_name, &n, &walk_failed), 0);
    assert_int_equal(n, 5);
    assert_int_equal(walk_failed, 0);
    assert_int_equal(fault_calls, 7); /* open, 5 names, the end */
    for (long k = 1; k <= 7; k++) {
        n = 0;
        fault_reset(k, k == 1 ? EMFILE : EIO, FAULT_ERRNO);
        int rc = kvx_os_each_name(AT_FDCWD, dir, 0, count_name, &n, &walk_failed);
        assert_string_equal(fault_hit_op, k == 1 ? "dir_open" : "dir_next");
        assert_int_equal(rc, k == 1 ? -EMFILE : -EIO);
        assert_int_equal(walk_failed, 1);
        assert_int_equal(n, k == 1 ? 0 : (int)k - 2);
        assert_int_equal(open_fds(), fds);
    }
    fault_reset(0, EIO, FAULT_ERRNO);
    n = 0;
    assert_int_equal(kvx_os_each_name(AT_FDCWD, dir, 0, stop_at_two, &n, &walk_failed), KVX_ECANCELED);
    assert_int_equal(walk_failed, 0);
    assert_int_equal(n, 2);
    /* a walk of "." under a directory descriptor leaves its offset alone */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(dfd >= 0);
    for (int round = 0; round < 2; round++) {
        n = 0;
        assert_int_equal(kvx_os_each_name(dfd, ".", O_NOFOLLOW, count_name, &n, NULL), 0);
        assert_int_equal(n, 5);
    }
    close(dfd);
    assert_int_equal(kvx_os_each_name(AT_FDCWD, "/nonexistent-kvx-dir", 0, count_name, &n, &walk_failed), -ENOENT);
    assert_int_equal(walk_failed, 1);
    fault_only = 0;
    fault_uninstall();
    assert_int_equal(open_fds(), fds);
}

/* A failed mmap of a shard is never a verdict on the shard: a lookup
 * misses (or its second look serves) and the next one serves; a verifying writer open fails or
 * goes on, but quarantines nothing. */
static void test_store_map_faults(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_create(su_path(dir, sizeof dir, "store-map"), (su_spec){.capacity = 64 << 20});
    nacked = 0;
    for (uint64_t q = 20000; q < 20004; q++) {
        assert_int_equal(put_flush(s, q), 0);
        acked[nacked++] = q;
    }
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    fault_install();
    fault_only = FAULT_MAP;
    fault_reset(1, ENOMEM, FAULT_ERRNO);
    size_t got = served(s, acked[0]);
    long hits = fault_hits;
    fault_reset(0, EIO, FAULT_ERRNO);
    assert_int_equal(hits, 1); /* the shard's mmap was reached */
    /* never a wrong answer: a miss, or every block (a lookup that could not
     * have a shard looks again, once, in a fresh snapshot) */
    assert_true(got == 0 || got == NB);
    check_all(s); /* not remembered as bad */
    kvx_store_close(s);

    fault_reset(0, EIO, FAULT_ERRNO);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_VERIFY), 0);
    long nmaps = fault_calls;
    kvx_store_close(s);
    assert_true(nmaps >= 1);
    char qdir[340];
    snprintf(qdir, sizeof qdir, "%s/quarantine", dir);
    for (long k = 1; k <= nmaps; k++) {
        fault_reset(k, ENOMEM, FAULT_ERRNO);
        int rc = kvx_store_open(&s, dir, NULL, KVX_STORE_VERIFY);
        hits = fault_hits;
        fault_reset(0, EIO, FAULT_ERRNO);
        assert_int_equal(hits, 1);
        if (rc == 0) {
            kvx_store_close(s);
        } else {
            assert_int_equal(rc, -ENOMEM);
            assert_non_null(strstr(kvx_last_error(), "mmap"));
        }
        assert_int_equal(dir_count(qdir), 0); /* nothing quarantined */
    }
    fault_only = 0;
    fault_uninstall();
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_VERIFY), 0);
    check_all(s);
    kvx_store_close(s);
}

/* Counts the calls of kinds `only` that op makes on store directory dir
 * (op opens and closes what it needs). */
static long count_calls(unsigned only, int (*op)(const char *dir), const char *dir)
{
    fault_install();
    fault_only = only;
    fault_reset(0, EIO, FAULT_ERRNO);
    assert_int_equal(op(dir), 0);
    long n = fault_calls;
    fault_only = 0;
    fault_uninstall();
    return n;
}

/* The seal's stat (the size of the sealed shard, read back by the store)
 * and every other stat by name of a put + flush, each failed in turn: the
 * flush fails with a message naming the stat, leaves nothing half-visible
 * and the store goes on (run_modes). */
static void test_store_stat_faults(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_create(su_path(dir, sizeof dir, "store-stat"), (su_spec){.capacity = 64 << 20});
    nacked = 0;
    uint64_t seq = 30000;
    fault_install();
    fault_only = FAULT_FSTATAT;
    fault_reset(0, EIO, FAULT_ERRNO);
    assert_int_equal(put_flush(s, seq), 0);
    acked[nacked++] = seq++;
    long nstat = fault_calls;
    fault_only = 0;
    if (nstat == 0) fail_msg("the store made no fstatat through kvx_os: the seal's stat escapes the fault suite");
    run_modes(s, &seq, nstat, FAULT_FSTATAT, "stat");
    fault_uninstall();
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    check_all(s);
    kvx_store_close(s);
}

static int open_writer(const char *dir)
{
    kvx_store *s;
    int rc = kvx_store_open(&s, dir, NULL, 0);
    if (rc == 0) kvx_store_close(s);
    return rc;
}

/* A writer open whose lock, or one of whose directory walks (recovery
 * lists staging/ and shards/), fails: the open fails with the errno and a
 * message containing says (any case), changes nothing in shards/, and the
 * next open serves every block. */
static void open_faults(unsigned only, int err, const char *says)
{
    char dir[300];
    kvx_store *s = su_create(su_path(dir, sizeof dir, only == FAULT_LOCK ? "store-lock" : "store-walk"),
                             (su_spec){.capacity = 64 << 20});
    nacked = 0;
    for (uint64_t q = 40000; q < 40003; q++) {
        assert_int_equal(put_flush(s, q), 0);
        acked[nacked++] = q;
    }
    kvx_store_close(s);
    long n = count_calls(only, open_writer, dir);
    if (n == 0) fail_msg("a writer open made no %s call through kvx_os", only == FAULT_LOCK ? "flock" : "directory walk");
    char before[64][64], after[64][64];
    size_t nb = su_list_names(dir, "shards", before, 64);
    fault_install();
    fault_only = only;
    for (long k = 1; k <= n; k++) {
        fault_reset(k, err, FAULT_ERRNO);
        int rc = kvx_store_open(&s, dir, NULL, 0);
        long hits = fault_hits;
        fault_reset(0, EIO, FAULT_ERRNO);
        assert_int_equal(hits, 1);
        if (rc == 0) {
            kvx_store_close(s);
            continue;
        }
        assert_int_equal(rc, -err);
        if (!strcasestr(kvx_last_error(), says)) fail_msg("failed %s, message: %s", fault_hit_op, kvx_last_error());
        assert_int_equal(su_list_names(dir, "shards", after, 64), nb);
        for (size_t i = 0; i < nb; i++) assert_string_equal(before[i], after[i]);
    }
    fault_only = 0;
    fault_uninstall();
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    check_all(s);
    kvx_store_close(s);
}

static void test_store_lock_faults(void **state)
{
    (void)state;
    open_faults(FAULT_LOCK, ENOLCK, "lock");
}

static void test_store_walk_faults(void **state)
{
    (void)state;
    open_faults(FAULT_DIR, EIO, strerror(EIO));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flush_faults),
        cmocka_unit_test(test_gc_faults),
        cmocka_unit_test(test_seal_faults),
        cmocka_unit_test(test_shard_open_faults),
        cmocka_unit_test(test_walk_faults),
        cmocka_unit_test(test_store_map_faults),
        cmocka_unit_test(test_store_stat_faults),
        cmocka_unit_test(test_store_lock_faults),
        cmocka_unit_test(test_store_walk_faults),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
