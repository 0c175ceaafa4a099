/*
 * reindex.c - kvx_store_reindex and kvx_store_reindex_dir (engine/
 * store_recover.c, store_open.c): rebuilt from the shards alone, the newest
 * file kept for a shard byte and the others quarantined; busy, crashed and
 * transient-failure cases change nothing acknowledged; pins, other
 * batches' staged files and readers of the old index kept right.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/store.h"
#include "index/index.h"
#include "lib/fault.h"
#include "lib/store.h"

/* Key sets of the coord and hash databases, as sorted text, for comparing. */
static char *index_keys(kvx_store *s)
{
    size_t cap = 1 << 20, len = 0;
    char *out = malloc(cap);
    /* the records themselves, through LMDB (tests may) */
    kvx_index *ix = kvx_cat_index(s->cat);
    MDB_txn *txn;
    assert_int_equal(kvx_idx_read_begin(ix, &txn), 0);
    MDB_dbi dbs[2] = {ix->coord, ix->hash};
    for (int d = 0; d < 2; d++) {
        MDB_cursor *c;
        assert_int_equal(mdb_cursor_open(txn, dbs[d], &c), 0);
        MDB_val k, v;
        int rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
        while (rc == 0) {
            uint64_t key = 0;
            memcpy(&key, k.mv_data, k.mv_size);
            uint32_t c32;
            memcpy(&c32, v.mv_data, 4);
            if (len + 64 > cap) out = realloc(out, cap *= 2);
            len += (size_t)snprintf(out + len, cap - len, "%d:%016llx:%08x\n", d, (unsigned long long)key,
                                    d ? c32 : (uint32_t)0);
            rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
        }
        mdb_cursor_close(c);
    }
    kvx_idx_read_end(ix, txn);
    return out;
}

/* PROMISE: RECOVER-13 */
static void test_reindex(void **state)
{
    (void)state;
    char dir[300], p[400];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 8 << 20, .shard_bytes = 40 << 10, .flags = KVX_STORE_NOWAIT});
    uint64_t h[16];
    for (uint64_t q = 0; q < 12; q++) {
        su_put_shared(s, q, 9, 3, h);
        assert_int_equal(kvx_store_flush(s), 0);
    }
    kvx_store_stats before, after;
    assert_int_equal(kvx_store_stat(&before, s), 0);
    char *k1 = index_keys(s);
    assert_int_equal(kvx_store_reindex(s), 0);
    char *k2 = index_keys(s);
    assert_string_equal(k1, k2);
    assert_int_equal(kvx_store_stat(&after, s), 0);
    assert_int_equal(after.blocks, before.blocks);
    assert_int_equal(after.shards, before.shards);
    kvx_store_close(s);
    /* a lost index: delete it, open rebuilds it from the shards */
    snprintf(p, sizeof p, "%s/index", dir);
    su_rm_rf(p);
    assert_int_equal(mkdir(p, 0700), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    char *k3 = index_keys(s);
    assert_string_equal(k1, k3);
    for (uint64_t q = 0; q < 12; q++) assert_int_equal(su_prefix_shared(s, q, 9, 3, 1), 9);
    kvx_store_close(s);
    free(k1);
    free(k2);
    free(k3);
}

static void shard_path(const char *dir, size_t k, char *out, size_t cap)
{
    char names[64][64];
    size_t n = su_list_files(dir, "shards", names, 64);
    assert_true(k < n);
    snprintf(out, cap, "%s/shards/%s", dir, names[k]);
}

static int cp(const char *from, const char *to)
{
    char cmd[2100];
    snprintf(cmd, sizeof cmd, "cp -a '%.1000s' '%.1000s'", from, to);
    return system(cmd);
}

/* test_reindex_quarantines: reindex moves a shard with damaged metadata to
 * quarantine/ (same bytes, a .why note, counted in stat), says so, and
 * deletes nothing. */
/* PROMISE: RECOVER-6, RECOVER-13 */
static void test_reindex_quarantines(void **state)
{
    (void)state;
    char dir[300], shard[700];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 1, 4);
    su_put_flush(s, 2, 4);
    kvx_store_close(s);
    shard_path(dir, 0, shard, sizeof shard);
    /* damaged metadata: one flipped header byte (meta CRC fails) */
    int fd = open(shard, O_RDWR);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, 17), 1);
    b ^= 1;
    assert_int_equal(pwrite(fd, &b, 1, 17), 1);
    close(fd);
    struct stat st0;
    assert_int_equal(stat(shard, &st0), 0);
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    assert_non_null(strstr(kvx_last_error(), "quarantine"));
    /* moved, not deleted: same name, same bytes, a note */
    char q[800], why[1700];
    snprintf(q, sizeof q, "%s/quarantine/%s", dir, strrchr(shard, '/') + 1);
    struct stat st1;
    assert_int_equal(stat(q, &st1), 0);
    assert_int_equal(st1.st_size, st0.st_size);
    snprintf(why, sizeof why, "%s.why", q);
    FILE *f = fopen(why, "r");
    assert_non_null(f);
    char text[600] = "";
    assert_non_null(fgets(text, sizeof text, f));
    fclose(f);
    assert_non_null(strstr(text, "cannot be validated"));
    assert_int_equal(access(shard, F_OK), -1);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.quarantined, 1);
    /* and `kvx store stat --json` says so */
    char cmd[600], out[4096] = "";
    snprintf(cmd, sizeof cmd, "%s store stat --json %s", KVX_CLI, dir);
    FILE *pf = popen(cmd, "r");
    assert_non_null(pf);
    size_t got = fread(out, 1, sizeof out - 1, pf);
    out[got] = 0;
    assert_int_equal(pclose(pf), 0);
    assert_non_null(strstr(out, "\"quarantined\":1"));
    size_t a = su_served_prefix(s, 1, 4), c = su_served_prefix(s, 2, 4);
    assert_true((a == 4 && c == 0) || (a == 0 && c == 4)); /* the other shard is whole */
    uint64_t bad = 9;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    kvx_store_close(s);
    /* a second clash keeps both: a numeric suffix */
    assert_int_equal(cp(q, shard), 0);
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    snprintf(q + strlen(q), sizeof q - strlen(q), ".1");
    assert_int_equal(access(q, F_OK), 0);
}

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

/* test_reindex_dir_busy_and_crash (rule 4): reindex_dir NOWAIT under a writer
 * is KVX_EBUSY and leaves index/ as it was; a reindex_dir killed right after
 * moving index/ aside, or after creating the new one, is a reindex_dir away
 * from serving every block. */
/* PROMISE: RECOVER-14 */
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
    snprintf(p2, sizeof p2, "%s/.index.aside", dir);
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
    assert_int_equal(access(p2, F_OK), 0); /* .index.aside/ left by the crash */
    assert_int_not_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0); /* a reader names reindex */
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    for (uint64_t seq = 1; seq <= 3; seq++) assert_int_equal(su_served_prefix(s, seq, 3), 3);
    kvx_store_close(s);

    /* killed while the new index is being built (index/ new and empty,
     * .index.aside/ the previous one) */
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

/*
 * DEFECT (STORE.md "Concurrency": "A read-only handle ... sees blocks
 * published after it opened (a fresh snapshot per call)").
 *
 * Reproducer: a server holds a KVX_STORE_READONLY handle; the operator
 * runs kvx_store_reindex_dir(DIR) from another process (index/ is renamed
 * to .index.aside/, a new index/ is built, .index.aside/ removed: STORE.md
 * "Reindex", for a store whose index is lost or damaged); a writer then
 * puts and flushes a new prompt. The reader's handle still holds the LMDB
 * environment of the old, now unlinked, data.mdb (kvx_idx_open in
 * index/index.c shares one environment per index/ inode and nothing ever
 * looks again): it never sees a block published after the reindex, until
 * the process restarts, and its usage records go to a deleted file.
 * Within one process it is worse: the registry keys environments by the
 * index directory's (dev, inode), and ext4 hands the freed inode of the
 * removed .index.aside/ to the next index/ made; kvx_store_reindex_dir (or
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

/* test_regress_reader_stale_after_reindex_dir (Concurrency, rule 4): a reader
 * handle open across another process's kvx_store_reindex_dir keeps the old,
 * deleted LMDB environment and never sees a block published afterwards
 * (index/index.c kvx_idx_open: one environment per index/ inode, never
 * re-checked). */
/* PROMISE: RECOVER-15 */
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

/* A put's blocks stay pinned through an in-handle kvx_store_reindex until
 * the caller's next flush, which acknowledges them: a reindex cleared the
 * pins and gave every shard a fresh creation time, so a re-put of held
 * blocks (nothing pending, not even flushed by the reindex) looked the
 * oldest in the store and that flush's eviction took it (tests/system/powercut.c
 * seed 651158135). */
/* PROMISE: DUR-12 */
static void test_reindex_keeps_pins(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 300 << 10;
    o.shard_bytes = 40 << 10;
    o.flags = KVX_STORE_NOWAIT;
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    for (uint64_t q = 0; q < 12; q++) { /* the store at its capacity */
        su_put_nb(s, q);
        assert_int_equal(kvx_store_flush(s), 0);
    }
    assert_int_equal(su_prefix_nb(s, 11), SU_NB);
    size_t added = 9;
    uint32_t t[SU_NB * SU_B];
    uint64_t h[SU_NB];
    su_tokens(t, 11, SU_NB, 0);
    uint8_t *p = su_pages(t, SU_NB, h, 64);
    assert_int_equal(kvx_store_put(s, t, SU_NB * SU_B, p, SU_NB, NULL, &added), 0); /* all held */
    free(p);
    assert_int_equal(added, 0);
    su_put_nb(s, 100); /* pending: the reindex flushes it */
    assert_int_equal(kvx_store_reindex(s), 0);
    for (uint64_t q = 101; q < 104; q++) su_put_nb(s, q);
    assert_int_equal(kvx_store_flush(s), 0); /* evicts */
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.evictions > 0);
    /* everything this flush acknowledged is served whole */
    assert_int_equal(su_prefix_nb(s, 11), SU_NB);
    for (uint64_t q = 100; q < 104; q++) assert_int_equal(su_prefix_nb(s, q), SU_NB);
    kvx_store_close(s);
}

#define NB 6 /* blocks per sequence */

/* kvx_store_reindex while another batch holds unflushed blocks (sealed
 * files already in shards/, unpublished): KVX_EBUSY naming the cause, and
 * nothing changes (its blocks are not indexed, the built-in batch's stay
 * pending). Once that batch flushed, reindex runs; a batch holding only
 * pins (held blocks) does not block it and its flush still serves them. */
/* PROMISE: DUR-12 */
static void test_reindex_with_other_batch(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT});
    assert_int_equal(su_put_batch(s, NULL, 600, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_batch *a;
    assert_int_equal(kvx_store_batch_create(&a, s), 0);
    assert_int_equal(su_put_batch(s, a, 601, NULL), 0);
    assert_int_equal(su_put_batch(s, NULL, 602, NULL), 0);
    assert_int_equal(kvx_store_reindex(s), KVX_EBUSY);
    assert_non_null(strstr(kvx_last_error(), "other batch"));
    assert_int_equal(su_prefix_nb(s, 601), 0);
    assert_int_equal(su_prefix_nb(s, 602), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.pending_blocks, 2 * NB);
    assert_int_equal(kvx_store_batch_flush(a), 0);
    /* a holds only pins now */
    size_t added = 9;
    assert_int_equal(su_put_batch(s, a, 600, &added), 0);
    assert_int_equal(added, 0);
    assert_int_equal(kvx_store_reindex(s), 0);
    assert_int_equal(kvx_store_batch_flush(a), 0);
    assert_int_equal(kvx_store_flush(s), 0); /* the reindex flushed 602; this acknowledges it */
    for (uint64_t q = 600; q < 603; q++) assert_int_equal(su_prefix_nb(s, q), NB);
    kvx_store_batch_destroy(a);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* reindex while another batch has staged files: KVX_EBUSY, staging/ and
 * shards/ untouched, and that batch's flush then acknowledges everything.
 * With only the built-in batch holding staged files: reindex flushes them
 * (served, in shards/, staging/ empty), also after reopen. */
/* PROMISE: DUR-12 */
static void test_reindex_with_staged(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT});
    assert_int_equal(su_put_batch(s, NULL, 300, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_batch *a;
    assert_int_equal(kvx_store_batch_create(&a, s), 0);
    assert_int_equal(su_put_batch(s, a, 301, NULL), 0);
    assert_int_equal(su_put_batch(s, a, 302, NULL), 0);
    assert_int_equal(su_put_batch(s, NULL, 303, NULL), 0);
    static char sb[16384], sn[16384], tb[16384], tn[16384];
    su_names_of(dir, "shards", sb, sizeof sb);
    su_names_of(dir, "staging", tb, sizeof tb);
    assert_true(su_n_files(dir, "staging") >= 3);
    assert_int_equal(kvx_store_reindex(s), KVX_EBUSY);
    su_names_of(dir, "shards", sn, sizeof sn);
    su_names_of(dir, "staging", tn, sizeof tn);
    assert_string_equal(sn, sb);
    assert_string_equal(tn, tb);
    assert_int_equal(kvx_store_batch_flush(a), 0);
    assert_int_equal(su_prefix_nb(s, 301), NB);
    assert_int_equal(su_prefix_nb(s, 302), NB);
    assert_int_equal(su_prefix_nb(s, 303), 0);
    kvx_store_batch_destroy(a);
    /* the built-in batch's staged files: reindex flushes them first */
    assert_int_equal(su_put_batch(s, NULL, 304, NULL), 0);
    assert_true(su_n_files(dir, "staging") >= 1);
    assert_int_equal(kvx_store_reindex(s), 0);
    assert_int_equal(su_n_files(dir, "staging"), 0);
    for (uint64_t q = 300; q < 305; q++) assert_int_equal(su_prefix_nb(s, q), NB);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    for (uint64_t q = 300; q < 305; q++) assert_int_equal(su_prefix_nb(s, q), NB);
    su_verify_clean(s);
    kvx_store_close(s);
}

int main(int argc, char **argv)
{
    /* these tests read the files one flush writes as its own shard
     * file (the path keyed stores, whole batches and a second batch
     * still take): the active shard has its own, tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reindex),
        cmocka_unit_test(test_reindex_quarantines),
        cmocka_unit_test(test_reindex_dir_busy_and_crash),
        cmocka_unit_test(test_regress_reader_stale_after_reindex_dir),
        cmocka_unit_test(test_reindex_keeps_pins),
        cmocka_unit_test(test_reindex_with_other_batch),
        cmocka_unit_test(test_reindex_with_staged),
    };
    return cmocka_run_group_tests_name("engine/reindex", tests, su_setup, su_teardown);
}
