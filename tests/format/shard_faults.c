/*
 * shard_faults.c - the shard file under the OS seam (tests/lib/fault.h):
 * each call of writing a shard (create, add, seal) and of opening one
 * (open, fstat, the table reads, mmap) fails in turn; the error is the
 * injected errno, its message names the call, and nothing is left behind
 * (no file at the path or beside it, no descriptor, no mapping).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/fault.h"
#include "lib/store.h"

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
/* PROMISE: DUR-6 */
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

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seal_faults),
        cmocka_unit_test(test_shard_open_faults),
    };
    return cmocka_run_group_tests_name("format/shard_faults", tests, su_setup, su_teardown);
}
