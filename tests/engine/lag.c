/*
 * lag.c - engine/store_lag.c: the writer's catalog commits skip LMDB's
 * syncs only under a durable mark DIR/UNSYNCED naming the boot; close
 * syncs and removes it; a mark of an earlier boot (a power cut) makes the
 * writer's open rebuild index/ from the files without reading it and a
 * reader refuse; a mark of this boot (kill -9) keeps the catalog.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/os.h"
#include "lib/store.h"

static char fake_boot[64];
static int fake_boot_id(char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", fake_boot);
    return 0;
}
static int no_boot_id(char *buf, size_t cap)
{
    (void)buf;
    (void)cap;
    errno = ENOENT;
    return -1;
}
static int boot_off(void **state)
{
    (void)state;
    kvx_os_reset();
    return 0;
}

static int mark_text(const char *dir, char *buf, size_t cap)
{
    char p[400];
    snprintf(p, sizeof p, "%s/UNSYNCED", dir);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
    return 0;
}

/* A writer process that puts and flushes seqs [first, first + n) and dies
 * without closing (kill -9 as far as the store can tell). */
static void killed_writer(const char *dir, uint64_t first, uint64_t n)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kvx_store *s = NULL;
        if (kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT) != 0) _exit(2);
        for (uint64_t q = first; q < first + n; q++)
            if (su_put_seq(s, q, SU_NB) != 0) _exit(3);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* The mark is made at the first flush (not at open), names this boot, and
 * close removes it after syncing the catalog. */
/* PROMISE: DUR-19 */
static void test_lag_mark_lifecycle(void **state)
{
    (void)state;
    char dir[300], text[256], id[128];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    assert_int_equal(mark_text(dir, text, sizeof text), -1); /* open alone makes none */
    su_put_flush(s, 1, SU_NB);
    assert_int_equal(mark_text(dir, text, sizeof text), 0);
    assert_int_equal(kvx_os.boot_id(id, sizeof id), 0);
    assert_non_null(strstr(text, id));
    su_put_flush(s, 2, SU_NB);
    kvx_store_close(s);
    assert_int_equal(mark_text(dir, text, sizeof text), -1);
    s = su_reopen(dir, 0);
    kvx_recovery_report r;
    assert_int_equal(kvx_store_recovery(s, &r), 0);
    assert_int_equal(r.rebuilt, 0);
    assert_int_equal(su_prefix_nb(s, 1), SU_NB);
    assert_int_equal(su_prefix_nb(s, 2), SU_NB);
    kvx_store_close(s);
}

/* kill -9 in this boot: the catalog is whole in the page cache; a reader
 * serves from it, the next writer keeps it (no rebuild), syncs it and
 * removes the mark. */
/* PROMISE: DUR-20 */
static void test_lag_same_boot_keeps(void **state)
{
    (void)state;
    char dir[300], text[256];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    kvx_store_close(s);
    killed_writer(dir, 10, 3);
    assert_int_equal(mark_text(dir, text, sizeof text), 0);
    kvx_store *r = su_reopen(dir, KVX_STORE_READONLY);
    for (uint64_t q = 10; q < 13; q++) assert_int_equal(su_prefix_nb(r, q), SU_NB);
    kvx_store_close(r);
    s = su_reopen(dir, 0);
    kvx_recovery_report rep;
    assert_int_equal(kvx_store_recovery(s, &rep), 0);
    assert_int_equal(rep.rebuilt, 0);
    assert_int_equal(mark_text(dir, text, sizeof text), -1);
    for (uint64_t q = 10; q < 13; q++) assert_int_equal(su_prefix_nb(s, q), SU_NB);
    kvx_store_close(s);
}

/* A power cut (the mark names another boot) with data.mdb torn: a reader
 * is refused, naming reindex; the writer's open sets index/ aside unread
 * (a damaged data.mdb would otherwise fail the open), rebuilds it from the
 * files and serves every acknowledged block; the mark goes. */
/* PROMISE: DUR-20 */
static void test_lag_earlier_boot_rebuilds(void **state)
{
    (void)state;
    char dir[300], text[256], p[400];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 20, SU_NB);
    kvx_store_close(s);
    killed_writer(dir, 21, 3);
    assert_int_equal(mark_text(dir, text, sizeof text), 0);
    /* torn: both meta pages and a page beyond them overwritten */
    snprintf(p, sizeof p, "%s/index/data.mdb", dir);
    FILE *f = fopen(p, "r+");
    assert_non_null(f);
    static uint8_t junk[3 * 4096];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 131 + 7);
    assert_int_equal(fwrite(junk, 1, sizeof junk, f), sizeof junk);
    fclose(f);
    snprintf(fake_boot, sizeof fake_boot, "another-boot-%ld", (long)getpid());
    kvx_os.boot_id = fake_boot_id;
    kvx_store *r = NULL;
    int rc = kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY);
    assert_int_equal(rc, KVX_ESTALE);
    assert_non_null(strstr(kvx_last_error(), "reindex"));
    s = su_reopen(dir, 0);
    kvx_recovery_report rep;
    assert_int_equal(kvx_store_recovery(s, &rep), 0);
    assert_int_equal(rep.rebuilt, 1);
    assert_int_equal(mark_text(dir, text, sizeof text), -1);
    for (uint64_t q = 20; q < 24; q++) assert_int_equal(su_prefix_nb(s, q), SU_NB);
    su_put_flush(s, 30, SU_NB); /* a new mark, of this (fake) boot */
    kvx_store_close(s);
    r = su_reopen(dir, KVX_STORE_READONLY);
    for (uint64_t q = 20; q < 24; q++) assert_int_equal(su_prefix_nb(r, q), SU_NB);
    assert_int_equal(su_prefix_nb(r, 30), SU_NB);
    kvx_store_close(r);
}

/* A mark that is not this boot's text (torn, foreign) counts as an
 * earlier boot's; no boot id at all: flushes stay synced, no mark. */
/* PROMISE: DUR-19, DUR-20 */
static void test_lag_torn_mark_and_no_boot_id(void **state)
{
    (void)state;
    char dir[300], text[256], p[400];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 40, SU_NB);
    kvx_store_close(s);
    snprintf(p, sizeof p, "%s/UNSYNCED", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("kvx unsync", f); /* torn */
    fclose(f);
    kvx_store *r = NULL;
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), KVX_ESTALE);
    s = su_reopen(dir, 0);
    kvx_recovery_report rep;
    assert_int_equal(kvx_store_recovery(s, &rep), 0);
    assert_int_equal(rep.rebuilt, 1);
    assert_int_equal(su_prefix_nb(s, 40), SU_NB);
    kvx_store_close(s);
    kvx_os.boot_id = no_boot_id;
    s = su_reopen(dir, 0);
    su_put_flush(s, 41, SU_NB);
    assert_int_equal(mark_text(dir, text, sizeof text), -1);
    kvx_store_close(s);
    kvx_os_reset();
    s = su_reopen(dir, 0);
    assert_int_equal(su_prefix_nb(s, 41), SU_NB);
    kvx_store_close(s);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lag_mark_lifecycle),
        cmocka_unit_test(test_lag_same_boot_keeps),
        cmocka_unit_test_teardown(test_lag_earlier_boot_rebuilds, boot_off),
        cmocka_unit_test_teardown(test_lag_torn_mark_and_no_boot_id, boot_off),
    };
    return cmocka_run_group_tests_name("engine/lag", tests, su_setup, su_teardown);
}
