/*
 * test_attack14.c - the read path against a hostile review (findings 1,
 * 2, 4 and 6 of "read-path review 14"), each a test that failed on the
 * code before its fix:
 *  - test_verify_every_served_page: KVX_STORE_VERIFY checks a page each
 *    time it is served, so a same-size in-place flip of a page already
 *    served (its mtime set back: a disk returning other bytes looks the
 *    same) is refused; the flag used to be read at open only;
 *  - test_rewrite_same_size_mtime: without the flag, a shard truncated and
 *    written again to its old size between two lookups (one byte flipped)
 *    has its pages checked again once the new mtime is seen (20 ms); the
 *    handle used to watch the size only, and served the new bytes;
 *
 * White-box without kvx_internal: the OS seam's header by its path from
 * here, and kvx_shard_mem (format/format.h, not API: the shard of a view
 * served from the shared tier) declared below as that header declares it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "io_fixture.h"
#include "store_util.h"
#include "../common/os.h"

int kvx_shard_mem(kvx_shard **out, const kvx_geometry *g, uint32_t n, void **pages, const uint64_t *hashes,
                  const uint64_t *parents, const uint32_t *tokens, const uint8_t *digests, const float *scales);

enum { NB = 8 };
static int dir_n;

static int group_setup(void **state)
{
    (void)state;
    unsetenv("KVX_IO_FORCE_NO_URING");
    return io_mkdtemp("test_attack14");
}

static int group_teardown(void **state)
{
    (void)state;
    io_rm_rf(io_tmpdir);
    return 0;
}

static int reset(void **state)
{
    (void)state;
    kvx_os_reset();
    return 0;
}

/* ---- finding 1: served pages and the file under them ---- */

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_verify_every_served_page, reset),
        cmocka_unit_test_setup(test_rewrite_same_size_mtime, reset),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
