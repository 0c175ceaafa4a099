/*
 * shard_writer.c - format/shard_writer.c: every field and page of a shard
 * written with the public writer comes back as written (all tables, the
 * variants, an empty shard), the writer's option and entry refusals, and
 * crash safety of seal: a failure injected at each OS step through kvx_os
 * leaves nothing at the final path and no temporary file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvx.h"
#include "lib/shard.h"

/* PROMISE: DUR-17 */
static void test_round_trip_all_tables(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
    const char *path = path_of("a.kvx");
    kvx_shard_writer *w;
    kvx_shard_writer_options o = options(&f);
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    /* the temporary file has no name (O_TMPFILE): a writer killed now
     * leaves nothing in the directory */
    assert_int_equal(dir_entries(), 0);
    assert_int_equal(access(path, F_OK), -1);
    for (int i = 0; i < NENT; i++) {
        kvx_entry_in e = entry_in(&f, i);
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    }
    assert_int_equal(kvx_shard_writer_count(w), NENT);
    uint64_t bytes = kvx_shard_writer_bytes(w);
    assert_int_equal(kvx_shard_writer_seal(w), 0);
    assert_int_equal(dir_entries(), 1); /* the shard only: no temporary left */
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal((uint64_t)st.st_size, bytes);
    assert_int_equal(st.st_mode & 0777, 0600);

    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, KVX_OPEN_VERIFY_PAGES), 0);
    check_fixture(&f, s);
    assert_string_equal(kvx_shard_path(s), path);
    assert_true(kvx_shard_fd(s) >= 0);
    assert_int_equal(kvx_shard_get_info(s)->file_size, bytes);
    kvx_shard_close(s);
}

static void test_round_trip_variants(void **state)
{
    (void)state;
    static const struct { uint32_t quant, flags; int spectral; } v[] = {
        {KVX_QUANT_FP16, 0, 0},
        {KVX_QUANT_FP16, KVX_FLAG_HASHES, 0},
        {KVX_QUANT_FP16, KVX_FLAG_HASHES | KVX_FLAG_LINEAGE, 1},
        {KVX_QUANT_E5M2, KVX_FLAG_SCALES, 1},
        {KVX_QUANT_E4M3, 0, 1},
        {KVX_QUANT_BF16, 0, 0},
        {KVX_QUANT_BF16, KVX_FLAG_HASHES | KVX_FLAG_LINEAGE, 1},
    };
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        fixture f;
        fixture_init(&f, v[k].quant, v[k].flags, v[k].spectral);
        const char *path = path_of("v.kvx");
        assert_int_equal(write_fixture(&f, path), 0);
        kvx_shard *s;
        assert_int_equal(kvx_shard_open(&s, path, 0), 0);
        check_fixture(&f, s);
        kvx_shard_close(s);
    }
}

static void test_empty_shard(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 0);
    kvx_shard_writer *w;
    kvx_shard_writer_options o = options(&f);
    const char *path = path_of("empty.kvx");
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    assert_int_equal(kvx_shard_writer_seal(w), 0);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, 0), 0);
    assert_int_equal(kvx_shard_get_info(s)->num_blocks, 0);
    assert_int_equal(kvx_shard_get_info(s)->shard_id, 0);
    uint32_t idx;
    assert_int_equal(kvx_shard_find(&idx, s, 0), KVX_ENOTFOUND);
    assert_int_equal(kvx_shard_verify(s, NULL, NULL, NULL), 0);
    kvx_shard_close(s);
}

static void test_writer_options(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
    const char *path = path_of("o.kvx");
    kvx_shard_writer *w = (kvx_shard_writer *)&f; /* must be reset to NULL on failure */
    kvx_shard_writer_options o;
#define EXPECT_OPT(code, mutate)                                   \
    do {                                                           \
        o = options(&f);                                           \
        mutate;                                                    \
        assert_int_equal(kvx_shard_writer_create(&w, path, &o), code); \
        assert_null(w);                                            \
        assert_true(kvx_last_error()[0] != '\0');                  \
    } while (0)
    EXPECT_OPT(KVX_EVERSION, o.version = 99);
    EXPECT_OPT(KVX_EQUANT, o.geometry.quant = 4);
    EXPECT_OPT(KVX_EINVALID, o.geometry.num_layers = 0);
    EXPECT_OPT(KVX_EINVALID, o.geometry.head_dim = 70000);
    EXPECT_OPT(KVX_EINVALID, o.max_entries = 0);
    EXPECT_OPT(KVX_EINVALID, o.max_entries = KVX_MAX_ENTRIES + 1);
    EXPECT_OPT(KVX_EINVALID, o.flags = 0x10);
    EXPECT_OPT(KVX_EINVALID, o.flags = KVX_FLAG_LINEAGE);
    EXPECT_OPT(KVX_EINVALID, o.geometry.block_tokens = 0);
    EXPECT_OPT(KVX_EINVALID, (o.geometry.quant = KVX_QUANT_FP16, o.flags = KVX_FLAG_SCALES));
    EXPECT_OPT(KVX_EINVALID, (o.geometry.quant = KVX_QUANT_BF16, o.flags = KVX_FLAG_SCALES));
    f.sp.rank = D + 1;
    EXPECT_OPT(KVX_ESPECTRAL, (void)0);
    f.sp.rank = 2;
    f.sp.n_layers = L + 1;
    EXPECT_OPT(KVX_ESPECTRAL, (void)0);
    f.sp.n_layers = L;
    f.ids[1] = 1; /* not increasing */
    EXPECT_OPT(KVX_ESPECTRAL, (void)0);
    f.ids[1] = 33;
    EXPECT_OPT(KVX_ESPECTRAL, (void)0);
    f.ids[1] = 7;
    f.sp.n_cartridges = 0;
    EXPECT_OPT(KVX_ESPECTRAL, (void)0);
    f.sp.n_cartridges = 2;
    EXPECT_OPT(-ENOENT, (void)(path = "/nonexistent-dir/x.kvx"));
#undef EXPECT_OPT
    assert_int_equal(dir_entries(), 0);
}

static void test_writer_entries(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 0);
    const char *path = path_of("e.kvx");
    kvx_shard_writer *w;
    kvx_shard_writer_options o = options(&f);
    o.max_entries = NENT;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    kvx_entry_in e;
#define EXPECT_ADD(code, i, mutate)                     \
    do {                                                \
        e = entry_in(&f, i);                            \
        mutate;                                         \
        assert_int_equal(kvx_shard_writer_add(w, &e), code); \
    } while (0)
    EXPECT_ADD(KVX_ETOKENS, 0, e.token_count = 0);
    EXPECT_ADD(KVX_ETOKENS, 0, e.token_count = BT + 1);
    EXPECT_ADD(KVX_EHASH, 3, e.hash = 5);                   /* partial block with a hash */
    EXPECT_ADD(KVX_ELINEAGE, 0, e.hash ^= 1);                /* not H(parent, tokens) */
    EXPECT_ADD(KVX_ELINEAGE, 1, e.parent = 0);
    EXPECT_ADD(KVX_EINVALID, 0, e.page = NULL);
    EXPECT_ADD(KVX_EINVALID, 0, e.tokens = NULL);
    float bad_scales[NSCALES];
    memcpy(bad_scales, f.scales[0], sizeof bad_scales);
    bad_scales[3] = 0.0f;
    EXPECT_ADD(KVX_EFORMAT, 0, e.scales = bad_scales);
    assert_int_equal(kvx_shard_writer_count(w), 0);
    EXPECT_ADD(0, 0, (void)0);
    EXPECT_ADD(KVX_EDUPLICATE, 1, (e.radix_block = f.radix[0], e.spectral = f.spec[0]));
    EXPECT_ADD(0, 1, (void)0);
    EXPECT_ADD(0, 2, (void)0);
    EXPECT_ADD(0, 3, e.scales = NULL); /* NULL scales: all 1.0 */
    EXPECT_ADD(KVX_EFULL, 3, e.radix_block = 999);
    assert_int_equal(kvx_shard_writer_count(w), NENT);
    assert_int_equal(kvx_shard_writer_seal(w), 0);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, KVX_OPEN_VERIFY_PAGES), 0);
    kvx_entry ent;
    assert_int_equal(kvx_shard_entry(&ent, s, 3), 0);
    for (int k = 0; k < NSCALES; k++) assert_true(ent.scales[k] == 1.0f);
    kvx_shard_close(s);

    /* scales without a scale table are refused (they would be lost) */
    fixture_init(&f, KVX_QUANT_E4M3, KVX_FLAG_HASHES, 0);
    o = options(&f);
    assert_int_equal(kvx_shard_writer_create(&w, path_of("e2.kvx"), &o), 0);
    EXPECT_ADD(KVX_EINVALID, 0, e.scales = f.scales[0]);
    kvx_shard_writer_abort(w);
    kvx_shard_writer_abort(NULL);
    assert_int_equal(access(path_of("e2.kvx"), F_OK), -1);
    assert_int_equal(dir_entries(), 1); /* e.kvx only */
#undef EXPECT_ADD
}

static int fault_pwrite_at, fault_fsync_at, fault_rename, fault_ftruncate, fault_close;

static int short_writes;

static ssize_t f_pwrite(int fd, const void *buf, size_t len, off_t off)
{
    if (fault_pwrite_at && --fault_pwrite_at == 0) {
        errno = ENOSPC;
        return -1;
    }
    if (short_writes && len > 1) len = len / 2; /* a short write: the loop must go on */
    return pwrite(fd, buf, len, off);
}

static int f_fsync(int fd)
{
    if (fault_fsync_at && --fault_fsync_at == 0) {
        errno = EIO;
        return -1;
    }
    return fsync(fd);
}

static int f_rename(const char *a, const char *b)
{
    if (fault_rename) {
        errno = EXDEV;
        return -1;
    }
    return rename(a, b);
}

static int f_ftruncate(int fd, off_t len)
{
    if (fault_ftruncate) {
        errno = EFBIG;
        return -1;
    }
    return ftruncate(fd, len);
}

static int f_close(int fd)
{
    close(fd);
    if (fault_close) {
        errno = EIO;
        return -1;
    }
    return 0;
}

static void install_faults(void)
{
    fault_pwrite_at = fault_fsync_at = fault_rename = fault_ftruncate = fault_close = 0;
    short_writes = 0;
    kvx_os.pwrite = f_pwrite;
    kvx_os.fsync = f_fsync;
    kvx_os.rename = f_rename;
    kvx_os.ftruncate = f_ftruncate;
    kvx_os.close = f_close;
}

static kvx_shard_writer *started_writer(fixture *f, const char *path)
{
    kvx_shard_writer *w;
    kvx_shard_writer_options o = options(f);
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    for (int i = 0; i < NENT; i++) {
        kvx_entry_in e = entry_in(f, i);
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    }
    return w;
}

/* PROMISE: DUR-17 */
static void test_seal_faults(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
    const char *path = path_of("c.kvx");
    static const struct { const char *step; int *knob; int value; int code; } steps[] = {
        {"header pwrite", &fault_pwrite_at, 1, -ENOSPC},
        {"spectral pwrite", &fault_pwrite_at, 2, -ENOSPC},
        {"ftruncate", &fault_ftruncate, 1, -EFBIG},
        {"file fsync", &fault_fsync_at, 1, -EIO},
        {"close", &fault_close, 1, -EIO},
        {"rename", &fault_rename, 1, -EXDEV},
        {"directory fsync", &fault_fsync_at, 2, -EIO},
    };
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        install_faults();
        kvx_shard_writer *w = started_writer(&f, path);
        *steps[k].knob = steps[k].value;
        int rc = kvx_shard_writer_seal(w);
        kvx_os_reset();
        if (rc != steps[k].code)
            fail_msg("step %s: got %s, expected %s", steps[k].step, kvx_err_name(rc),
                     kvx_err_name(steps[k].code));
        if (dir_entries() != 0) fail_msg("step %s: files left behind", steps[k].step);
    }

    /* a page write that fails is refused and leaves the writer usable */
    install_faults();
    kvx_shard_writer *w;
    kvx_shard_writer_options o = options(&f);
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    kvx_entry_in e = entry_in(&f, 0);
    fault_pwrite_at = 1;
    assert_int_equal(kvx_shard_writer_add(w, &e), -ENOSPC);
    assert_int_equal(kvx_shard_writer_count(w), 0);
    for (int i = 0; i < NENT; i++) {
        e = entry_in(&f, i);
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    }
    /* short writes all the way through seal still give a valid file */
    short_writes = 1;
    assert_int_equal(kvx_shard_writer_seal(w), 0);
    kvx_os_reset();
    assert_int_equal(dir_entries(), 1);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, KVX_OPEN_VERIFY_PAGES), 0);
    check_fixture(&f, s);
    kvx_shard_close(s);

    /* abort after adds leaves nothing */
    unlink(path);
    w = started_writer(&f, path);
    kvx_shard_writer_abort(w);
    assert_int_equal(dir_entries(), 0);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_round_trip_all_tables, fx_clean),
        cmocka_unit_test_setup(test_round_trip_variants, fx_clean),
        cmocka_unit_test_setup(test_empty_shard, fx_clean),
        cmocka_unit_test_setup(test_writer_options, fx_clean),
        cmocka_unit_test_setup(test_writer_entries, fx_clean),
        cmocka_unit_test_setup(test_seal_faults, fx_clean),
    };
    return cmocka_run_group_tests_name("format/shard_writer", tests, fx_setup, fx_teardown);
}
