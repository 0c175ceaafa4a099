/*
 * attack.c - a hostile review of recovery's plan and apply, quarantine/,
 * gc and reindex (engine/store_plan.c, store_apply.c, store_names.c,
 * store_maint.c, store_open.c). Each test is a break found by the review:
 * it fails until the library is fixed.
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
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/os.h"
#include "lib/store.h"

/* staging/.<seq 16 hex>.pending as an empty regular file (dir: a directory). */
static void plant_mark(const char *dir, uint64_t seq, int as_dir)
{
    char p[800];
    snprintf(p, sizeof p, "%.300s/staging/.%016" PRIx64 ".pending", dir, seq);
    if (as_dir) {
        assert_int_equal(mkdir(p, 0700), 0);
        return;
    }
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fclose(f);
}

/* A commit mark in staging/ for a number the sound catalog already
 * published (its meta/next_seq is above it, and it names the commit's
 * files): the mark cannot be of a commit that never answered, yet a
 * writer's open deletes every acknowledged file whose entries carry that
 * number. A stale or planted mark (a backup that copied staging/ mid-flush
 * and shards/ and index/ after it) wipes acknowledged data. */
/* PROMISE: RECOVER-34 */
static void test_stale_commit_mark_deletes_acknowledged_files(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){0});
    for (uint64_t q = 1; q <= 4; q++) su_put_flush(s, q, 6);
    for (uint64_t q = 1; q <= 4; q++) assert_int_equal(su_served_prefix(s, q, 6), 6);
    kvx_store_close(s);
    /* the numbers the acknowledged commits used (and a few above) */
    for (uint64_t n = 1; n <= 8; n++) plant_mark(dir, n, 0);
    s = su_reopen(dir, 0);
    for (uint64_t q = 1; q <= 4; q++)
        if (su_served_prefix(s, q, 6) != 6)
            fail_msg("sequence %" PRIu64 " (acknowledged, named by the sound catalog) is gone after a writer's open "
                     "found a commit mark of its number in staging/",
                     q);
    kvx_store_close(s);
}

/* quarantine/'s retention counts and deletes every regular file there,
 * oldest first, and a file without a .why note is "the oldest": a file
 * kvx never put there (a user's note, a copy kept for a bug report) is
 * the first one deleted. */
/* PROMISE: RECOVER-35 */
static void test_retention_deletes_a_file_kvx_never_wrote(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){0});
    su_put_flush(s, 1, 6);
    kvx_store_close(s);
    su_plant(dir, "quarantine", "my-notes.txt", 9, 0);
    for (int i = 0; i < 64; i++) {
        char name[32];
        snprintf(name, sizeof name, "%016x.kvx", 0x1000 + i);
        su_plant(dir, "quarantine", name, 64, time(NULL));
    }
    s = su_reopen(dir, 0);
    assert_int_equal(kvx_store_gc(s), 0);
    kvx_store_close(s);
    if (!su_exists(dir, "quarantine", "my-notes.txt"))
        fail_msg("quarantine/my-notes.txt, a file kvx never wrote, was deleted by retention");
}

/* A file in quarantine/ that retention has not judged yet (a user's file
 * put there after the writer opened) counts as "unpublished bytes" at the
 * next flush: when it is larger than the capacity, eviction drops every
 * live shard (the live bytes were far below the capacity, and retention
 * keeps quarantine/ within a quarter of it), and only then does
 * retention delete the file. */
/* PROMISE: RECOVER-35 */
static void test_quarantine_file_evicts_every_live_shard(void **state)
{
    (void)state;
    char dir[300];
    const uint64_t cap = 2 << 20;
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = cap, .shard_bytes = 64 << 10});
    for (uint64_t q = 1; q <= 8; q++) su_put_flush(s, q, 6);
    kvx_store_stats st = su_stat(s);
    assert_true(st.bytes < cap / 2);
    su_plant(dir, "quarantine", "00000000000000ff.kvx", (size_t)cap * 2, time(NULL));
    su_put_flush(s, 100, 6);
    size_t kept = 0;
    for (uint64_t q = 1; q <= 8; q++) kept += su_served_prefix(s, q, 6) == 6;
    st = su_stat(s);
    kvx_store_close(s);
    if (kept < 8)
        fail_msg("a %" PRIu64 "-byte file in quarantine/ made one flush evict %zu of 8 sequences (live bytes were "
                 "under half the %" PRIu64 "-byte capacity); live bytes now %" PRIu64,
                 cap * 2, 8 - kept, cap, st.bytes);
}

/* More than 256 commit marks in staging/, none with a file: every one is
 * spent (no file carries its number), yet the writer's open, gc and
 * reindex are all refused with EIO ("more than 256 commit marks"), which
 * names neither the cause's fix nor an I/O error: the store cannot be
 * opened to write until someone removes files from staging/ by hand. */
/* PROMISE: RECOVER-34 */
static void test_many_spent_marks_refuse_the_writer(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){0});
    su_put_flush(s, 1, 6);
    kvx_store_close(s);
    for (uint64_t n = 0; n < 300; n++) plant_mark(dir, 1000 + n, 0);
    kvx_store *w = NULL;
    int rc = kvx_store_open(&w, dir, NULL, 0);
    if (rc)
        fail_msg("a writer's open with 300 spent commit marks (no file carries their numbers): %s (%s)",
                 kvx_err_name(rc), kvx_last_error());
    assert_int_equal(su_served_prefix(w, 1, 6), 6);
    kvx_store_close(w);
}

/* A copy of fixture name at dir (with the staging/ git cannot keep). */
static void copy_fixture(char *dir, size_t cap, const char *name)
{
    su_new_dir(dir, cap);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "cp -r '%s/tests/lib/fixtures/%s' '%s' && mkdir -p '%s/staging' && chmod -R u+rwX,go-rwx '%s'",
             KVX_SOURCE_DIR, name, dir, dir, dir);
    assert_int_equal(system(cmd), 0);
}

/* `kvx store reindex --dry-run` (kvx_store_plan_reindex) on a store of the
 * release before sequence numbers answers a full plan (keep 13 shards,
 * 76 blocks, rc 0), but the reindex it describes is refused with
 * KVX_EVERSION: the dry run promises what the reindex will not do. */
/* PROMISE: RECOVER-36 */
static void test_dry_run_promises_a_reindex_that_is_refused(void **state)
{
    (void)state;
    char dir[300];
    copy_fixture(dir, sizeof dir, "store-v1");
    kvx_store_plan *p = NULL;
    int prc = kvx_store_plan_reindex(&p, dir);
    size_t nsteps = p ? kvx_store_plan_steps(p) : 0;
    kvx_store_plan_free(p);
    int rrc = kvx_store_reindex_dir(dir, KVX_STORE_NOWAIT);
    char msg[600];
    snprintf(msg, sizeof msg, "%s", kvx_last_error());
    if ((prc == 0) != (rrc == 0))
        fail_msg("dry run: %s (%zu steps); the reindex itself: %s (%s)", kvx_err_name(prc), nsteps,
                 kvx_err_name(rrc), msg);
}

/* ---- keyed stores ---- */

#define PB 512

static kvx_key key_of(const char *str) { return (kvx_key){str, strlen(str)}; }

static void fill(uint8_t *p, const char *k, int version)
{
    su_page(p, PB, kvx_key_hash(k, strlen(k)) + (uint64_t)version);
}

static void put_key(kvx_store *s, kvx_store_batch *b, const char *k, int version)
{
    uint8_t page[PB];
    fill(page, k, version);
    kvx_key key = key_of(k);
    const void *pages[1] = {page};
    size_t lens[1] = {PB};
    int rc = kvx_store_keyed_put(s, b, &key, pages, lens, 1, NULL);
    if (rc) fail_msg("keyed put %s: %s (%s)", k, kvx_err_name(rc), kvx_last_error());
}

/* The version of key k served (its page compared), 0 when not served. */
static int served_version(kvx_store *s, const char *k)
{
    kvx_key key = key_of(k);
    kvx_view v;
    int st = -1;
    assert_int_equal(kvx_store_keyed_get(&v, &st, s, &key, 1), 0);
    if (st) return 0;
    int got = -1;
    for (int ver = 1; ver < 8 && got < 0; ver++) {
        uint8_t want[PB];
        fill(want, k, ver);
        if (v.page_bytes == PB && memcmp(v.page, want, PB) == 0) got = ver;
    }
    kvx_view_release(&v);
    return got;
}

static void sh(const char *fmt, const char *dir)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, dir, dir, dir, dir);
    if (system(cmd) != 0) fail_msg("shell: %s", cmd);
}

/* The reader's check counts as a commit mark anything in staging/ with a
 * mark's name (kvx_st_commit_marks never looks at its type), while the
 * writer's plan leaves a directory of that name alone and keeps the
 * commit's files. With an old index/ put back, a directory named like the
 * delete's mark makes a keyed reader serve a page its owner deleted (an
 * acknowledged delete undone), where without it the reader refuses with
 * KVX_ESTALE, and the writer keeps the tombstone. */
/* PROMISE: RECOVER-1 */
static void test_reader_counts_a_directory_as_a_mark(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    put_key(s, NULL, "gone", 1);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    sh("cp -a '%s/index' '%s/index.bak'", dir);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_key key = key_of("gone");
    size_t deleted = 0;
    assert_int_equal(kvx_store_keyed_delete(s, &key, 1, &deleted), 0);
    assert_int_equal(deleted, 1);
    kvx_store_plan *p = NULL;
    kvx_store_close(s);
    assert_int_equal(kvx_store_plan_reindex(&p, dir), 0);
    uint64_t next = kvx_store_plan_next_seq(p); /* the delete's number is next - 1 */
    kvx_store_plan_free(p);
    sh("rm -rf '%s/index' && mv '%s/index.bak' '%s/index'", dir);
    plant_mark(dir, next - 1, 1);
    kvx_store *r = NULL;
    int rc = kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY);
    if (rc == 0) {
        int v = served_version(r, "gone");
        kvx_store_close(r);
        if (v) fail_msg("a reader served the deleted key's page (version %d): its delete's tombstone file was taken "
                        "for a commit that never answered because staging/ holds a DIRECTORY of that mark's name",
                        v);
    }
    /* the writer agrees that the delete stands */
    s = su_reopen(dir, 0);
    assert_int_equal(served_version(s, "gone"), 0);
    kvx_store_close(s);
}

/* A kill at the removal of a multi-file commit's mark (the mark is there,
 * so the commit never answered: DUR-4 says it lands whole or not at all). */
static kvx_os_ops real_os;
static int kill_unlinkat(int fd, const char *name, int flags)
{
    if (strstr(name, ".pending") && faccessat(fd, name, F_OK, 0) == 0) raise(SIGKILL);
    return real_os.unlinkat(fd, name, flags);
}

/* A keyed batch whose page for a key holds the very bytes another batch
 * committed since (kvx_st_supersede gives it that commit's older number)
 * writes a file whose entries do not all carry its own number. Killed
 * before its mark goes, recovery deletes the batch's other files (all of
 * the mark's number) but keeps and publishes that one, with the batch's
 * new pages in it: a commit that never answered lands in part. */
/* PROMISE: DUR-4 */
static void test_unanswered_keyed_commit_lands_in_part(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir,
                            (su_spec){.page_bytes = PB, .capacity = 64ull << 20, .shard_bytes = 16 << 10});
    kvx_store_close(s);
    static const char *const xs[] = {"x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x9"};
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (kvx_store_open(&s, dir, NULL, 0)) _exit(3);
        kvx_store_batch *b1 = NULL, *b2 = NULL;
        if (kvx_store_batch_create(&b1, s) || kvx_store_batch_create(&b2, s)) _exit(4);
        /* b1: "same" and x1 in one put (one file) */
        uint8_t p0[PB], p1[PB];
        fill(p0, "same", 1);
        fill(p1, "x1", 1);
        kvx_key k2[2] = {key_of("same"), key_of("x1")};
        const void *pg[2] = {p0, p1};
        size_t ln[2] = {PB, PB};
        if (kvx_store_keyed_put(s, b1, k2, pg, ln, 2, NULL)) _exit(5);
        /* b2 commits the very same bytes for "same" meanwhile */
        put_key(s, b2, "same", 1);
        if (kvx_store_batch_flush(b2)) _exit(6);
        for (int i = 1; i < 9; i++) put_key(s, b1, xs[i], 1);
        kvx_os_reset();
        real_os = kvx_os;
        kvx_os.unlinkat = kill_unlinkat;
        kvx_store_batch_flush(b1);
        _exit(7); /* no mark: a one-file commit */
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFSIGNALED(st)) {
        fail_msg("the writer exited %d before its kill point", WEXITSTATUS(st));
    }
    s = su_reopen(dir, 0);
    int n = 0;
    char which[64] = "";
    for (int i = 0; i < 9; i++)
        if (served_version(s, xs[i])) {
            n++;
            strncat(which, xs[i], sizeof which - strlen(which) - 2);
            strcat(which, " ");
        }
    assert_int_equal(served_version(s, "same"), 1);
    kvx_store_close(s);
    if (n != 0 && n != 9)
        fail_msg("a batch of 9 new keys killed before its commit mark went: %d of them published (%s)", n, which);
}

/* The newest generation's file name in dir/shards (the last in order). */
static void newest_shard(const char *dir, char *out, size_t cap)
{
    char names[64][64];
    size_t n = su_list_names(dir, "shards", names, 64);
    assert_true(n > 0);
    snprintf(out, cap, "%s/shards/%s", dir, names[n - 1]);
}

/* A keyed delete's tombstone file whose tables are damaged (one byte of
 * its coordinate table: the meta CRC fails) cannot be validated: a
 * reindex quarantines it whole, and the deleted key's older page comes
 * back, served. STORE.md rule 3: a delete "survives the loss of index/
 * ... damage to the newest copy". A file that may hold tombstones and
 * cannot be read proves nothing about which older copies are live. */
/* PROMISE: KEYED-13 */
static void test_damaged_tombstone_file_brings_a_deleted_key_back(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 64ull << 20});
    put_key(s, NULL, "dead", 1);
    put_key(s, NULL, "alive", 1);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_key key = key_of("dead");
    size_t deleted = 0;
    assert_int_equal(kvx_store_keyed_delete(s, &key, 1, &deleted), 0);
    assert_int_equal(deleted, 1);
    assert_int_equal(served_version(s, "dead"), 0);
    kvx_store_close(s);
    char path[600];
    newest_shard(dir, path, sizeof path); /* the delete's file */
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b = 0;
    assert_int_equal(pread(fd, &b, 1, 0x40 + 8), 1);
    b ^= 0xff;
    assert_int_equal(pwrite(fd, &b, 1, 0x40 + 8), 1);
    close(fd);
    int rc = kvx_store_reindex_dir(dir, KVX_STORE_NOWAIT);
    (void)rc; /* exit 1 with a file set aside is fine */
    s = su_reopen(dir, 0);
    int v = served_version(s, "dead");
    assert_int_equal(served_version(s, "alive"), 1);
    kvx_store_close(s);
    if (v) fail_msg("key 'dead', deleted (acknowledged), is served again (version %d) after a reindex set its damaged "
                    "tombstone file aside",
                    v);
}

/* kvx_store_reindex_dir clears "a previous attempt's" index.old/ by
 * unlinking its data.mdb and lock.mdb without asking whose they are: a
 * user's own copy of index/ kept there (cp -a index index.old, the
 * obvious name for a backup before a repair) is deleted, though kvx never
 * wrote that directory. */
/* PROMISE: RECOVER-19 */
static void test_reindex_deletes_a_users_index_old(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){0});
    su_put_flush(s, 1, 6);
    kvx_store_close(s);
    sh("cp -a '%s/index' '%s/index.old' && echo mine > '%s/index.old/README'", dir);
    assert_int_equal(kvx_store_reindex_dir(dir, KVX_STORE_NOWAIT), 0);
    assert_true(su_exists(dir, "index.old", "README"));
    if (!su_exists(dir, "index.old", "data.mdb"))
        fail_msg("reindex deleted index.old/data.mdb, a user's copy beside a README kvx never wrote");
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stale_commit_mark_deletes_acknowledged_files),
        cmocka_unit_test(test_retention_deletes_a_file_kvx_never_wrote),
        cmocka_unit_test(test_quarantine_file_evicts_every_live_shard),
        cmocka_unit_test(test_many_spent_marks_refuse_the_writer),
        cmocka_unit_test(test_dry_run_promises_a_reindex_that_is_refused),
        cmocka_unit_test(test_reader_counts_a_directory_as_a_mark),
        cmocka_unit_test(test_unanswered_keyed_commit_lands_in_part),
        cmocka_unit_test(test_damaged_tombstone_file_brings_a_deleted_key_back),
        cmocka_unit_test(test_reindex_deletes_a_users_index_old),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
