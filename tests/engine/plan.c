/*
 * plan.c - engine/store_plan.c and engine/store_apply.c: recovery as a plan
 * computed from the files, then an apply (docs/STORE.md "Recovery at
 * open", "Quarantine"); the plan changes nothing and takes no lock; the
 * apply is idempotent; quarantine/ is bounded and counted in the capacity.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/os.h"
#include "lib/store.h"

/* Bytes of the regular files in dir/sub (0 when it does not exist). */
static uint64_t bytes_in(const char *dir, const char *sub)
{
    char p[700];
    snprintf(p, sizeof p, "%.300s/%.20s", dir, sub);
    DIR *d = opendir(p);
    if (!d) return 0;
    uint64_t tot = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        struct stat st;
        char f[1100];
        snprintf(f, sizeof f, "%s/%.300s", p, e->d_name);
        /* kvx's names only (<16 hex>.kvx[.k]): stat's measure, notes and others' files aside */
        int kvx_name = strlen(e->d_name) >= 20 && !strncmp(e->d_name + 16, ".kvx", 4) && !strstr(e->d_name, ".why");
        if (kvx_name && lstat(f, &st) == 0 && S_ISREG(st.st_mode)) {
            uint64_t alloc = (uint64_t)st.st_blocks * 512; /* stat's measure: bytes held on disk */
            tot += alloc < (uint64_t)st.st_size ? alloc : (uint64_t)st.st_size;
        }
    }
    closedir(d);
    return tot;
}

/* The kill points: the unlink of a shard file after a committed drop
 * (eviction, compaction), or the removal of a multi-file commit's mark. */
static kvx_os_ops real_os;
static int kill_mode; /* 1: a drop's unlink in shards/; 2: a commit mark's removal */

static int kill_unlinkat(int fd, const char *name, int flags)
{
    uint64_t gen;
    size_t len = strlen(name);
    if (kill_mode == 1 && len == 20 && strcmp(name + 16, ".kvx") == 0 && sscanf(name, "%16" SCNx64, &gen) == 1)
        raise(SIGKILL);
    if (kill_mode == 2 && strstr(name, ".pending")) {
        static int seen;
        if (++seen == 2) raise(SIGKILL); /* the first removes a stale one before the mark is made */
    }
    return real_os.unlinkat(fd, name, flags);
}

/* A writer that puts and flushes until one of its flushes reaches the
 * kill point (it must, within 200 flushes). */
static void killed_writer(const char *dir, uint64_t first, int mode)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kvx_store *s = NULL;
        if (kvx_store_open(&s, dir, NULL, 0)) _exit(3);
        kvx_os_reset();
        real_os = kvx_os;
        kvx_os.unlinkat = kill_unlinkat;
        kill_mode = mode;
        kvx_store_batch *b = NULL;
        if (kvx_store_batch_create(&b, s)) _exit(4);
        for (uint64_t q = first; q < first + 200; q++) {
            for (uint64_t k = 0; k < 4; k++) /* several files a flush: a commit mark */
                if (su_put_batch(s, b, q * 8 + k, NULL)) _exit(5);
            if (kvx_store_batch_flush(b)) _exit(6);
        }
        _exit(7);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFSIGNALED(st)) fail_msg("the writer exited %d before its kill point (mode %d)", WEXITSTATUS(st), mode);
}

/* Writers killed (SIGKILL) again and again at the two points that left a
 * file behind: after a committed eviction before it unlinked its victim,
 * and before a multi-file commit removed its mark. quarantine/ grew by a
 * file per kill (16 kills on a 1 MiB store left 16 files, about 4 MiB),
 * never removed and counted nowhere. Now the victim of a committed drop is
 * deleted when sound (what the drop would have done), the files of a
 * commit that never answered are deleted (never acknowledged), and
 * quarantine/ stays within its retention rule; stat counts its bytes. */
/* PROMISE: RECOVER-34 */
static void test_quarantine_bounded_after_kills(void **state)
{
    (void)state;
    char dir[300];
    const uint64_t cap = 1 << 20;
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = cap, .shard_bytes = 16 << 10});
    kvx_store_close(s);
    for (int k = 0; k < 16; k++) killed_writer(dir, 1000 * (uint64_t)(k + 1), 1 + k % 2);
    s = su_reopen(dir, 0);
    kvx_store_stats st = su_stat(s);
    kvx_store_close(s);
    s = su_reopen(dir, 0); /* and stable: a second open finds nothing to do */
    kvx_recovery_report r;
    assert_int_equal(kvx_store_recovery(s, &r), 0);
    assert_int_equal(r.quarantined + r.deleted_unacked + r.deleted_dropped + r.temporaries + r.expired, 0);
    kvx_store_close(s);
    uint64_t q = bytes_in(dir, "quarantine");
    if (st.quarantined || q)
        fail_msg("after 16 killed writers quarantine/ holds %" PRIu64 " files, %" PRIu64
                 " bytes: every file they left was never acknowledged or a sound dropped victim",
                 st.quarantined, q);
    assert_int_equal(st.quarantine_bytes, q);
}
/* quarantine/'s retention: at most a quarter of the capacity in bytes and
 * 64 files; past either, a writer's open removes the oldest (by the time
 * of its .why note) first, with its note, and keeps the newest; stat
 * counts the bytes, and the live shards make room for them (the capacity
 * counts both). */
/* PROMISE: RECOVER-35 */
static void test_quarantine_retention(void **state)
{
    (void)state;
    char dir[300];
    const uint64_t cap = 4 << 20;
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = cap, .shard_bytes = 64 << 10});
    kvx_store_close(s);
    time_t t0 = time(NULL) - 100000;
    for (int i = 0; i < 70; i++) { /* 70 x 4 KiB, the oldest first (names kvx gives: <16 hex>.kvx) */
        char name[32];
        snprintf(name, sizeof name, "%016x.kvx", 0x100 + i);
        su_plant(dir, "quarantine", name, 4096, t0 + i);
    }
    su_plant(dir, "quarantine", "00000000000001ff.kvx.1", 768 << 10, t0 + 1000); /* the newest, a clash's suffix */
    su_plant(dir, "quarantine", "notes.txt", 8192, t0 - 10); /* not kvx's: never counted, never removed */
    /* 71 files, 1,048 KiB: over 64 files and over 1 MiB (a quarter) */
    s = su_reopen(dir, 0);
    kvx_recovery_report r;
    assert_int_equal(kvx_store_recovery(s, &r), 0);
    kvx_store_stats st = su_stat(s);
    for (int i = 0; i < 70; i++) {
        char name[32], why[40];
        snprintf(name, sizeof name, "%016x.kvx", 0x100 + i);
        snprintf(why, sizeof why, "%s.why", name);
        if (su_exists(dir, "quarantine", name) != (i >= 7))
            fail_msg("quarantine/%s (the %d-th oldest) %s", name, i + 1, i >= 7 ? "was removed" : "was kept");
        assert_int_equal(su_exists(dir, "quarantine", why), i >= 7);
    }
    assert_true(su_exists(dir, "quarantine", "00000000000001ff.kvx.1"));
    assert_true(su_exists(dir, "quarantine", "notes.txt"));
    assert_int_equal(r.expired, 7);
    assert_int_equal(st.quarantined, 64);
    assert_int_equal(st.quarantine_bytes, bytes_in(dir, "quarantine"));
    assert_true(st.quarantine_bytes <= cap / 4);
    /* the capacity counts quarantine/: puts past it evict live shards */
    for (uint64_t q = 1; q <= 400; q++) su_put_flush(s, q, 8);
    st = su_stat(s);
    if (st.bytes + st.quarantine_bytes > cap + (64 << 10))
        fail_msg("shards %" PRIu64 " + quarantine/ %" PRIu64 " bytes, over the capacity %" PRIu64, st.bytes,
                 st.quarantine_bytes, cap);
    kvx_store_close(s);
}

/* Every kvx_os call that could change a file, counted (the plan's). */
static long mutations;
static int (*real_openat)(int, const char *, int, mode_t);
static int count_openat(int fd, const char *p, int flags, mode_t mode)
{
    if (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC)) mutations++;
    return real_openat(fd, p, flags, mode);
}
static int count_unlinkat(int fd, const char *p, int flags)
{
    mutations++;
    return real_os.unlinkat(fd, p, flags);
}
static int count_renameat(int a, const char *p, int b, const char *q)
{
    mutations++;
    return real_os.renameat(a, p, b, q);
}
static int count_rename_noreplace(const char *p, const char *q)
{
    mutations++;
    return real_os.rename_noreplace(p, q);
}
static int count_flock(int fd, int op)
{
    mutations++;
    return real_os.flock(fd, op);
}
static int count_mkdir(const char *p, mode_t m)
{
    mutations++;
    return real_os.mkdir(p, m);
}

/* Names, sizes, inodes and mtimes of every file under dir: a fingerprint. */
static void tree(const char *dir, char *out, size_t cap)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cd '%s' && find . -printf '%%p %%s %%i %%T@ %%m\\n' | sort", dir);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    pclose(f);
}

/* The plan reads the store's files and changes nothing (no lock, no
 * write, no rename, no unlink: it works while a writer holds the store);
 * the apply then does exactly what it planned, and a second plan finds
 * nothing left to set aside or delete. The store has every kind of file
 * recovery meets: kept shards, a damaged one, a commit that never answered
 * (its mark and files), a writer's temporary, a FIFO at a shard name, a
 * name kvx did not write. */
/* PROMISE: RECOVER-36 */
static void test_plan_changes_nothing_and_apply_follows_it(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10});
    for (uint64_t q = 1; q <= 4; q++) su_put_flush(s, q, 8);
    kvx_store_close(s);
    killed_writer(dir, 5000, 2); /* a commit's files in shards/, its mark in staging/ */
    char names[64][64], p[800];
    size_t n = su_list_names(dir, "shards", names, 64);
    assert_true(n >= 3);
    snprintf(p, sizeof p, "%s/shards/%s", dir, names[0]);
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    fseek(f, 0x41, SEEK_SET);
    fputc(0xee, f);
    fclose(f);
    su_plant(dir, "staging", ".00000000000000aa.kvx.tmp.1234", 100, 0);
    su_plant(dir, "shards", "notes.txt", 10, 0);
    snprintf(p, sizeof p, "%s/shards/00000000000000ff.kvx", dir);
    assert_int_equal(mkfifo(p, 0600), 0);
    static char before[65536], after[65536];
    tree(dir, before, sizeof before);
    /* a writer holds the store meanwhile: its lock, taken by hand */
    snprintf(p, sizeof p, "%s/LOCK", dir);
    int lk = open(p, O_RDWR | O_CREAT, 0600);
    assert_true(lk >= 0);
    assert_int_equal(flock(lk, LOCK_EX), 0);
    tree(dir, before, sizeof before);
    kvx_os_reset();
    real_os = kvx_os;
    real_openat = kvx_os.openat;
    kvx_os.openat = count_openat;
    kvx_os.unlinkat = count_unlinkat;
    kvx_os.renameat = count_renameat;
    kvx_os.rename_noreplace = count_rename_noreplace;
    kvx_os.mkdir = count_mkdir;
    kvx_os.flock = count_flock;
    mutations = 0;
    kvx_store_plan *plan = NULL;
    int rc = kvx_store_plan_reindex(&plan, dir);
    kvx_os_reset();
    if (rc) fail_msg("plan: %s (%s)", kvx_err_name(rc), kvx_last_error());
    assert_int_equal(mutations, 0);
    tree(dir, after, sizeof after);
    assert_string_equal(before, after);
    kvx_recovery_report want, got;
    kvx_store_plan_summary(plan, &want);
    int saw_damaged = 0, saw_fifo = 0, saw_notes = 0, saw_tmp = 0, saw_mark = 0;
    for (size_t i = 0; i < kvx_store_plan_steps(plan); i++) {
        kvx_plan_step x;
        assert_int_equal(kvx_store_plan_step(plan, i, &x), 0);
        assert_true(x.reason && x.reason[0]);
        if (!strcmp(x.name, names[0])) saw_damaged = !strcmp(x.action, "quarantine");
        if (!strcmp(x.name, "00000000000000ff.kvx")) saw_fifo = !strcmp(x.action, "leave");
        if (!strcmp(x.name, "notes.txt")) saw_notes = !strcmp(x.action, "leave");
        if (strstr(x.name, ".kvx.tmp.1234")) saw_tmp = !strcmp(x.action, "delete");
        if (strstr(x.name, ".pending")) saw_mark = !strcmp(x.action, "delete");
    }
    assert_true(saw_damaged && saw_fifo && saw_notes && saw_tmp && saw_mark);
    assert_int_equal(want.quarantined, 1);
    assert_true(want.deleted_unacked >= 2); /* a commit of several files */
    assert_int_equal(want.left_alone, 2);
    kvx_plan_step x;
    assert_int_equal(kvx_store_plan_step(plan, kvx_store_plan_steps(plan), &x), KVX_EINVALID);
    kvx_store_plan_free(plan);
    close(lk); /* the writer goes */
    rc = kvx_store_reindex_dir_report(dir, KVX_STORE_NOWAIT, &got);
    if (rc) fail_msg("reindex: %s (%s)", kvx_err_name(rc), kvx_last_error());
    assert_int_equal(got.quarantined, want.quarantined);
    assert_int_equal(got.deleted_unacked, want.deleted_unacked);
    assert_int_equal(got.temporaries, want.temporaries);
    assert_int_equal(got.left_alone, want.left_alone);
    assert_int_equal(got.shards_kept, want.shards_kept);
    assert_int_equal(got.blocks_indexed, want.blocks_indexed);
    assert_int_equal(got.failed, 0);
    assert_true(su_exists(dir, "quarantine", names[0]));
    /* applied: nothing left to do but keep and leave alone */
    assert_int_equal(kvx_store_plan_reindex(&plan, dir), 0);
    kvx_store_plan_summary(plan, &want);
    kvx_store_plan_free(plan);
    assert_int_equal(want.quarantined + want.deleted_unacked + want.deleted_dropped + want.temporaries, 0);
    assert_int_equal(want.left_alone, 2);
    s = su_reopen(dir, 0);
    for (uint64_t q = 1; q <= 4; q++) assert_true(su_prefix_nb(s, q) <= 8);
    kvx_store_close(s);
}

/* Kill points of a recovery's apply: the k-th call that changes a name
 * (a move to quarantine/, an unlink in shards/, staging/ or quarantine/),
 * or the k-th fsync. */
static long apply_calls, apply_kill_at;
static int apply_kill_fsync;
static void apply_tick(void)
{
    if (++apply_calls == apply_kill_at) raise(SIGKILL);
}
static int apply_unlinkat(int fd, const char *p, int flags)
{
    if (!apply_kill_fsync) apply_tick();
    return real_os.unlinkat(fd, p, flags);
}
static int apply_rename_noreplace(const char *a, const char *b)
{
    if (!apply_kill_fsync) apply_tick();
    return real_os.rename_noreplace(a, b);
}
static int apply_fsync(int fd)
{
    if (apply_kill_fsync) apply_tick();
    return real_os.fsync(fd);
}

/* A store with every kind of work for recovery: a commit that never
 * answered (its mark and files), a damaged shard the catalog does not
 * know, a writer's temporary, quarantine/ over its retention. */
static void messy_store(char *dir, size_t cap)
{
    kvx_store *s = su_store(dir, cap, (su_spec){.capacity = 1 << 20, .shard_bytes = 16 << 10});
    for (uint64_t q = 1; q <= 4; q++) su_put_flush(s, q, 8);
    kvx_store_close(s);
    killed_writer(dir, 7000, 2);
    char names[64][64], p[800];
    assert_true(su_list_names(dir, "shards", names, 64) >= 3);
    snprintf(p, sizeof p, "%s/shards/%s", dir, names[0]);
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    fseek(f, 0x41, SEEK_SET);
    fputc(0xee, f);
    fclose(f);
    su_plant(dir, "staging", ".00000000000000aa.kvx.tmp.99", 100, 0);
    time_t t0 = time(NULL) - 5000;
    for (int i = 0; i < 66; i++) {
        char name[32];
        snprintf(name, sizeof name, "%016x.kvx", 0x200 + i);
        su_plant(dir, "quarantine", name, 4096, t0 + i);
    }
}

/* What a store holds, as text: its files by directory (shards/ and
 * quarantine/ names, staging/ entries) and every block it serves. */
static void outcome(const char *dir, char *out, size_t cap)
{
    char a[8192], b[8192], c[4096];
    su_names_of(dir, "shards", a, sizeof a);
    su_names_of(dir, "quarantine", b, sizeof b);
    su_names_of(dir, "staging", c, sizeof c);
    kvx_store *s = su_reopen(dir, KVX_STORE_READONLY);
    size_t served[6] = {0};
    for (uint64_t q = 1; q <= 4; q++) served[q] = su_served_prefix(s, q, 8);
    kvx_store_close(s);
    snprintf(out, cap, "shards: %s\nquarantine: %s\nstaging: %s\nserved: %zu %zu %zu %zu\n", a, b, c, served[1],
             served[2], served[3], served[4]);
}

/* The apply is idempotent: a writer's recovery killed (SIGKILL) at every
 * step it takes (each move, unlink and fsync), then another recovery,
 * leaves the store exactly as one uninterrupted recovery does: the same
 * files in shards/, quarantine/ and staging/, the same blocks served. */
/* PROMISE: RECOVER-40 */
static void test_apply_killed_at_every_step(void **state)
{
    (void)state;
    char dir[300];
    static char want[32768], got[32768];
    messy_store(dir, sizeof dir);
    kvx_store *s = su_reopen(dir, 0);
    kvx_store_close(s);
    outcome(dir, want, sizeof want);
    int points = 0;
    for (int fs = 0; fs < 2; fs++) {
        for (long k = 1;; k++) {
            messy_store(dir, sizeof dir);
            fflush(NULL);
            pid_t pid = fork();
            assert_true(pid >= 0);
            if (pid == 0) {
                kvx_os_reset();
                real_os = kvx_os;
                kvx_os.unlinkat = apply_unlinkat;
                kvx_os.rename_noreplace = apply_rename_noreplace;
                kvx_os.fsync = apply_fsync;
                apply_calls = 0;
                apply_kill_at = k;
                apply_kill_fsync = fs;
                kvx_store *w = NULL;
                _exit(kvx_store_open(&w, dir, NULL, 0) ? 3 : 0); /* past the last step: exits */
            }
            int st = 0;
            assert_int_equal(waitpid(pid, &st, 0), pid);
            s = su_reopen(dir, 0);
            kvx_store_close(s);
            outcome(dir, got, sizeof got);
            if (strcmp(want, got) != 0)
                fail_msg("recovery killed at its %s %ld, then recovered:\n%s\nan uninterrupted recovery:\n%s",
                         fs ? "fsync" : "name change", k, got, want);
            if (!WIFSIGNALED(st)) break; /* the whole recovery ran: every step was cut once */
            points++;
        }
    }
    printf("recovery killed at %d points, each then recovered as an uninterrupted one\n", points);
    assert_true(points >= 10);
}

/* The page of keyed key k, version ver: a pure function of both. */
static void keyed_page(uint8_t *p, size_t n, const char *k, int ver)
{
    su_page(p, n, kvx_key_hash(k, strlen(k)) * 31 + (uint64_t)ver);
}

static int keyed_served(kvx_store *s, const char *k, int ver)
{
    kvx_key key = {k, strlen(k)};
    kvx_view v;
    int st = -1;
    assert_int_equal(kvx_store_keyed_get(&v, &st, s, &key, 1), 0);
    if (st) return 0;
    uint8_t want[512];
    keyed_page(want, sizeof want, k, ver);
    int same = v.page_bytes == sizeof want && memcmp(v.page, want, sizeof want) == 0;
    kvx_view_release(&v);
    return same ? 1 : -1;
}

/* A keyed delete survives damage to its tombstone file's tables (its meta
 * CRC fails, the file cannot be validated): gc sets the file aside, but
 * first writes the delete again (its key read from the damaged tables as
 * they are, named nowhere else by the sound catalog), so a later reindex
 * from the files never serves the deleted key's older page. Before, the
 * tombstone went to quarantine/ with the file and the old page came back. */
/* PROMISE: KEYED-13 */
static void test_damaged_tombstone_file_gc_then_reindex(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = 512, .capacity = 64 << 20});
    /* three live keys beside it: gc's compaction of mostly deleted shards
     * leaves the page file (and the deleted key's page in it) alone */
    const char *names[4] = {"dead", "alive", "alive2", "alive3"};
    for (int i = 0; i < 4; i++) {
        uint8_t page[512];
        keyed_page(page, sizeof page, names[i], 1);
        kvx_key key = {names[i], strlen(names[i])};
        const void *pages[1] = {page};
        size_t lens[1] = {sizeof page};
        assert_int_equal(kvx_store_keyed_put(s, NULL, &key, pages, lens, 1, NULL), 0);
    }
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_key dead = {"dead", 4};
    size_t deleted = 0;
    assert_int_equal(kvx_store_keyed_delete(s, &dead, 1, &deleted), 0);
    assert_int_equal(deleted, 1);
    kvx_store_close(s);
    char names_on_disk[8][64], p[800];
    size_t n = su_list_names(dir, "shards", names_on_disk, 8);
    assert_int_equal(n, 2);
    snprintf(p, sizeof p, "%s/shards/%s", dir, names_on_disk[1]); /* the delete's file, the newer */
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    fseek(f, 0x48, SEEK_SET); /* its coordinate table: the meta CRC fails */
    fputc(0x55, f);
    fclose(f);
    s = su_reopen(dir, 0); /* the catalog stands (size and inode unchanged) */
    assert_int_equal(kvx_store_gc(s), 0);
    assert_true(su_exists(dir, "quarantine", names_on_disk[1]));
    assert_int_equal(keyed_served(s, "dead", 1), 0);
    assert_int_equal(keyed_served(s, "alive", 1), 1);
    kvx_store_close(s);
    assert_int_equal(kvx_store_reindex_dir(dir, KVX_STORE_NOWAIT), 0);
    s = su_reopen(dir, 0);
    if (keyed_served(s, "dead", 1) != 0) fail_msg("a deleted key is served again after its damaged tombstone file went");
    assert_int_equal(keyed_served(s, "alive", 1), 1);
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
        cmocka_unit_test(test_quarantine_bounded_after_kills),
        cmocka_unit_test(test_quarantine_retention),
        cmocka_unit_test(test_plan_changes_nothing_and_apply_follows_it),
        cmocka_unit_test(test_apply_killed_at_every_step),
        cmocka_unit_test(test_damaged_tombstone_file_gc_then_reindex),
    };
    return cmocka_run_group_tests_name("engine/plan", tests, su_setup, su_teardown);
}
