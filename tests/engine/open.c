/*
 * open.c - engine/store_open.c and store_config.c: create, open and close.
 * One writer per store (the LOCK file, removed or replaced under a
 * writer), create syncs the directory holding DIR, the STORE file refused
 * when tampered with, a NOSYNC reader does not unsync the writer, and
 * readers change nothing under DIR (DESIGN.md rule 3).
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
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "index/index.h"
#include "lib/fault.h"
#include "lib/io.h"
#include "lib/store.h"
#include "lib/oplog.h"

/* PROMISE: STORE-14 */
static void test_writer_exclusive(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .flags = KVX_STORE_NOWAIT});
    kvx_store *w2 = NULL, *r = NULL;
    assert_int_equal(kvx_store_open(&w2, dir, NULL, KVX_STORE_NOWAIT), KVX_EBUSY);
    assert_null(w2);
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
    kvx_store_close(r);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&w2, dir, NULL, KVX_STORE_NOWAIT), 0);
    kvx_store_close(w2);
}


/* test_create_syncs_parent (M2): kvx_store_create fsyncs the directory
 * holding DIR (before, a power cut could lose DIR and every block). */
/* PROMISE: DUR-15 */
static void test_create_syncs_parent(void **state)
{
    (void)state;
    char dir[300], want[600];
    su_new_dir(dir, sizeof dir);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.flags = KVX_STORE_NOWAIT;
    kvx_store *s = NULL;
    hooks_on();
    int rc = kvx_store_create(&s, dir, &o);
    kvx_os_reset();
    assert_int_equal(rc, 0);
    kvx_store_close(s);
    snprintf(want, sizeof want, "mkdir:%s", dir);
    int i_mkdir = find_ev(want, 0);
    assert_true(i_mkdir >= 0);
    snprintf(want, sizeof want, "fsync:%s", su_root);
    if (find_ev(want, i_mkdir) < 0) fail_msg("kvx_store_create never fsynced %s, which holds the new store", su_root);
}

/* test_lock_removed_busy, test_lock_replaced_relocks (M3): with DIR/LOCK
 * removed under a writer, a second writer opened too; a LOCK replaced while a
 * writer took it left that writer holding a lock on a file no longer named
 * LOCK. */
/* PROMISE: STORE-14 */
static void test_lock_removed_busy(void **state)
{
    (void)state;
    char dir[300], lock[400];
    kvx_store *a = su_store(dir, sizeof dir, (su_spec){.flags = KVX_STORE_NOWAIT});
    snprintf(lock, sizeof lock, "%s/LOCK", dir);
    assert_int_equal(unlink(lock), 0); /* a "stale lock file" cleanup */
    kvx_store *b = NULL;
    int rc = kvx_store_open(&b, dir, NULL, KVX_STORE_NOWAIT);
    if (rc == 0) {
        kvx_store_close(b);
        fail_msg("a second writer opened while the first holds the store (DIR/LOCK removed)");
    }
    assert_int_equal(rc, KVX_EBUSY);
    assert_int_equal(su_put_seq(a, 1, 2), 0);
    kvx_store_close(a);
    b = su_reopen(dir, KVX_STORE_NOWAIT); /* free again */
    assert_int_equal(su_served_prefix(b, 1, 2), 2);
    kvx_store_close(b);
}

static char swap_lock[400];

static int hk_flock_swap(int fd, int op)
{
    struct stat st;
    if (swap_lock[0] && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) { /* LOCK replaced between its open and flock */
        char tmp[420];
        snprintf(tmp, sizeof tmp, "%s.new", swap_lock);
        int nfd = open(tmp, O_RDWR | O_CREAT, 0600);
        if (nfd >= 0) close(nfd);
        rename(tmp, swap_lock);
        swap_lock[0] = 0;
    }
    return real_os.flock(fd, op);
}

/* test_lock_removed_busy, test_lock_replaced_relocks (M3): with DIR/LOCK
 * removed under a writer, a second writer opened too; a LOCK replaced while a
 * writer took it left that writer holding a lock on a file no longer named
 * LOCK. */
/* PROMISE: STORE-14 */
static void test_lock_replaced_relocks(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.flags = KVX_STORE_NOWAIT});
    kvx_store_close(s);
    snprintf(swap_lock, sizeof swap_lock, "%s/LOCK", dir);
    real_os = kvx_os;
    kvx_os.flock = hk_flock_swap;
    int rc = kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT);
    kvx_os_reset();
    assert_int_equal(rc, 0);
    /* the writer holds the file that is DIR/LOCK now */
    char lock[400];
    snprintf(lock, sizeof lock, "%s/LOCK", dir);
    int fd = open(lock, O_RDWR);
    assert_true(fd >= 0);
    int got = flock(fd, LOCK_EX | LOCK_NB);
    close(fd);
    if (got == 0) fail_msg("the writer's lock is on a file no longer named LOCK: DIR/LOCK is free");
    kvx_store_close(s);
}

static int env_nosync(kvx_index *ix)
{
    unsigned fl = 0;
    assert_int_equal(mdb_env_get_flags(ix->env, &fl), 0);
    return (fl & MDB_NOSYNC) != 0;
}

/* L1. The environment is the process's, keyed by the index directory: a
 * READONLY|NOSYNC handle opened first made the writer opened after it
 * commit without syncing, and acknowledge those commits. */
/* PROMISE: DUR-16 */
static void test_nosync_handle_does_not_unsync_writer(void **state)
{
    (void)state;
    char dir[300], index[400];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    kvx_store_close(s);
    snprintf(index, sizeof index, "%s/index", dir);

    /* the environment, as the store's handles share it */
    kvx_index *fast = NULL, *durable = NULL;
    assert_int_equal(kvx_idx_open(&fast, index, 0, 1), 0);
    assert_true(env_nosync(fast));
    assert_int_equal(kvx_idx_open(&durable, index, 0, 0), 0);
    assert_ptr_equal(fast, durable); /* one environment */
    if (env_nosync(durable)) fail_msg("DEFECT: a handle without NOSYNC joined a NOSYNC environment and stays unsynced");
    kvx_index *fast2 = NULL;
    assert_int_equal(kvx_idx_open(&fast2, index, 0, 1), 0);
    assert_false(env_nosync(fast2)); /* a later NOSYNC handle does not undo it */
    kvx_idx_close(fast2);
    kvx_idx_close(durable);
    kvx_idx_close(fast);

    /* through the API: a READONLY|NOSYNC reader, then the writer, which
     * flushes and reopens what it acknowledged */
    kvx_store *reader = NULL, *writer = NULL;
    assert_int_equal(kvx_store_open(&reader, dir, NULL, KVX_STORE_READONLY | KVX_STORE_NOSYNC), 0);
    assert_int_equal(kvx_store_open(&writer, dir, NULL, 0), 0);
    assert_int_equal(kvx_idx_open(&durable, index, 0, 0), 0);
    assert_false(env_nosync(durable));
    kvx_idx_close(durable);
    assert_int_equal(su_put_seq(writer, 77, 3), 0);
    assert_int_equal(kvx_store_flush(writer), 0);
    assert_int_equal(su_served_prefix(reader, 77, 3), 3);
    kvx_store_close(writer);
    kvx_store_close(reader);
}

#define PB 8192u

static void store_file_patch(const char *dir, size_t off, uint32_t value)
{
    char path[600];
    snprintf(path, sizeof path, "%s/STORE", dir);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    uint8_t b[64];
    assert_int_equal(fread(b, 1, 64, f), 64);
    memcpy(b + off, &value, 4);
    uint32_t c = kvx_crc32c(0, b, 60);
    memcpy(b + 60, &c, 4);
    assert_int_equal(fseek(f, 0, SEEK_SET), 0);
    assert_int_equal(fwrite(b, 1, 64, f), 64);
    assert_int_equal(fclose(f), 0);
}

/* STORE version 2 tampered with (CRC made to match): page_bytes against
 * the geometry, block_tokens != 0, version 1 with block_tokens 0, a
 * signature: each refused at open, writer and reader alike, and the
 * store opens again once the file is put back. */
static void test_store_file_tampering(void **state)
{
    (void)state;
    char dir[256];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB});
    assert_int_equal(su_key_put(s, NULL, "x", 1, PB, 1, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    char path[600];
    snprintf(path, sizeof path, "%s/STORE", dir);
    uint8_t orig[64];
    su_store_bytes(dir, orig);
    struct {
        size_t off;
        uint32_t v;
    } cases[] = {{56, PB * 2}, {56, PB - 2}, {56, 0}, {56, 7}, {28, 4}, {8, 1}, {32, 5}, {16, 2}, {12, KVX_QUANT_FP16}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        store_file_patch(dir, cases[i].off, cases[i].v);
        for (int ro = 0; ro < 2; ro++) {
            int rc = kvx_store_open(&s, dir, NULL, ro ? KVX_STORE_READONLY : 0);
            if (rc == 0) {
                kvx_store_close(s);
                fail_msg("STORE byte %zu = %u: opened (%s)", cases[i].off, cases[i].v, ro ? "reader" : "writer");
            }
        }
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(orig, 1, 64, f), 64);
        assert_int_equal(fclose(f), 0);
    }
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(su_key_check(s, "x", 1, PB, 1), 0);
    su_verify_clean(s);
    kvx_store_close(s);
}

static int copy_preserving(const char *from, const char *to)
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

/* test_reader_changes_nothing (rule 3): a read-only handle and the CLI's read
 * commands on a store with a damaged page, a resized shard, an unregistered
 * shard, a garbage shard name and a staging leftover leave every name and
 * every byte of DIR as they were (LOCK included; only the contents of index/
 * data.mdb and lock.mdb may change). */
/* PROMISE: RECOVER-1 */
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
    assert_int_equal(copy_preserving(p, q), 0); /* byte 3: free in dir */
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

/* The group's setup and teardown: each fixture's, in order. */
static int setup_all(void **state)
{
    if (su_setup(state)) return -1;
    if (io_setup(state)) return -1;
    return 0;
}

static int teardown_all(void **state)
{
    su_teardown(state);
    io_teardown(state);
    return 0;
}

int main(int argc, char **argv)
{
    /* these tests read the files one flush writes as its own shard
     * file (the path keyed stores, whole batches and a second batch
     * still take): the active shard has its own, tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writer_exclusive),
        cmocka_unit_test_teardown(test_create_syncs_parent, hooks_off),
        cmocka_unit_test(test_lock_removed_busy),
        cmocka_unit_test_teardown(test_lock_replaced_relocks, hooks_off),
        cmocka_unit_test(test_nosync_handle_does_not_unsync_writer),
        cmocka_unit_test(test_store_file_tampering),
        cmocka_unit_test(test_reader_changes_nothing),
    };
    return cmocka_run_group_tests_name("engine/open", tests, setup_all, teardown_all);
}
