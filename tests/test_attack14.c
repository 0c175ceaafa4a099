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
 *  - test_fetch_tier_view / test_warmup_tier_view: a view served from
 *    the shared tier (its shard has no file) is fetched and warmed up, its
 *    pages copied and checked; one such request failed the whole batch
 *    (-EBADF, fstat of -1), and the whole warmup;
 *  - test_failed_wait_parks_runs: a release whose wait fails for good
 *    parks the run records completions still name (they were freed under
 *    the ring: a peer's next reap wrote into freed memory) and the queue
 *    refuses new batches with -EIO;
 *  - test_to_envelope_sparse_bound / test_to_envelope_missing_pages:
 *    kvx_shard_to_envelope is bounded by the shard's data bytes, not its
 *    file size (a sparse 1 TiB tail got a 64 TiB bound and a 4 GiB
 *    malloc), and a shard with missing pages is refused before any
 *    allocation;
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

#include "lib/fault.h"
#include "lib/io.h"
#include "lib/store.h"
#include "common/os.h"

int kvx_shard_mem(kvx_shard **out, const kvx_geometry *g, uint32_t n, void **pages, const uint64_t *hashes,
                  const uint64_t *parents, const uint32_t *tokens, const uint8_t *digests, const float *scales);

enum { NB = 8 };
static int dir_n;

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

/* ---- finding 2: a view served from the shared tier in fetch and warmup ---- */

enum { MEM_N = 5 };

/* A shard as a shared-tier lookup makes it (kvx_shard_mem: pages on the
 * heap, no file), of io_geometry, its pages io_fill(tag, entry). */
static kvx_shard *mem_shard(uint32_t tag)
{
    kvx_geometry g = io_geometry();
    uint64_t pb = kvx_page_bytes(&g, g.block_tokens);
    void **pages = calloc(MEM_N, sizeof *pages);
    uint32_t *tokens = calloc((size_t)MEM_N * g.block_tokens, sizeof *tokens);
    uint64_t hashes[MEM_N], parents[MEM_N];
    uint8_t digests[MEM_N * 32];
    assert_non_null(pages);
    assert_non_null(tokens);
    memset(digests, 0x5a, sizeof digests);
    for (uint32_t i = 0; i < MEM_N; i++) {
        pages[i] = malloc(pb);
        assert_non_null(pages[i]);
        io_fill(pages[i], tag, i, pb);
        hashes[i] = 0x1000 + tag * 16 + i;
        parents[i] = i ? hashes[i - 1] : 0;
    }
    kvx_shard *s = NULL;
    assert_int_equal(kvx_shard_mem(&s, &g, MEM_N, pages, hashes, parents, tokens, digests, NULL), 0);
    free(tokens);
    assert_int_equal(kvx_shard_fd(s), -1);
    return s;
}

static kvx_pool *pool_of(uint64_t bytes)
{
    kvx_pool_options o = KVX_POOL_OPTIONS_INIT;
    o.bytes = bytes;
    kvx_pool *p = NULL;
    int rc = kvx_pool_create(&p, &o);
    if (rc == KVX_EMEMLOCK) {
        o.flags = KVX_POOL_NO_MLOCK | KVX_POOL_NO_REGISTER;
        rc = kvx_pool_create(&p, &o);
    }
    assert_int_equal(rc, 0);
    return p;
}

/* The io_fill tag of a shard of this test: its shard byte for a file
 * (io_make_shard), 9 or 10 for the two in-memory shards. */
static uint32_t tag_of(kvx_shard *s, kvx_shard *m9)
{
    return kvx_shard_fd(s) >= 0 ? kvx_shard_get_info(s)->shard_id : s == m9 ? 9u : 10u;
}

/* Finding 2: kvx_fetch_submit took every request's file (fstat of its
 * descriptor); a shared-tier view's shard has none (-1), so one such
 * request failed the whole batch with -EBADF. Now its page is copied into
 * its slot and checked at submit: status 0, the bytes, the CRC. */
static void test_fetch_tier_view(void **state)
{
    (void)state;
    char path[512];
    assert_int_equal(io_make_shard(path, sizeof path, io_tmpdir, "fetch.kvx", 1, 6, 0), 0);
    kvx_shard *fs, *m9 = mem_shard(9), *m10 = mem_shard(10);
    assert_int_equal(kvx_shard_open(&fs, path, 0), 0);
    const kvx_fetch_req reqs[] = {{fs, 0}, {m9, 1}, {fs, 1}, {m9, 4}, {m10, 0}, {m10, 1},
                                  {m9, 0}, {NULL, 0}, {m9, 99}, {fs, 5}};
    enum { N = sizeof reqs / sizeof reqs[0] };
    const int modes[] = {KVX_IO_AUTO, KVX_IO_PREAD};
    for (size_t m = 0; m < 2; m++)
        for (uint32_t flags = 0; flags <= KVX_FETCH_NO_VERIFY; flags += KVX_FETCH_NO_VERIFY) {
            kvx_pool *p = pool_of(8u << 20);
            kvx_fetch_options o = KVX_FETCH_OPTIONS_INIT;
            o.io_mode = modes[m];
            o.flags = flags;
            kvx_fetch *f = NULL;
            assert_int_equal(kvx_fetch_create(&f, p, &o), 0);
            assert_int_equal(kvx_fetch_submit(f, reqs, N), 0);
            kvx_fetch_result res[N];
            assert_int_equal(kvx_fetch_wait(f, res, N, 10000), 0);
            for (size_t i = 0; i < N; i++) {
                if (!reqs[i].shard) {
                    assert_int_equal(res[i].status, KVX_EINVALID);
                    continue;
                }
                if (reqs[i].entry == 99) {
                    assert_int_equal(res[i].status, KVX_ENOTFOUND);
                    continue;
                }
                kvx_entry e;
                assert_int_equal(kvx_shard_entry(&e, reqs[i].shard, reqs[i].entry), 0);
                assert_int_equal(res[i].status, 0);
                assert_int_equal(res[i].bytes, e.bytes);
                assert_int_equal((uintptr_t)res[i].page % 4096, 0);
                assert_true(io_page_ok(res[i].page, tag_of(reqs[i].shard, m9), reqs[i].entry, e.bytes));
                assert_int_equal(res[i].crc32, flags ? 0 : e.crc32);
            }
            /* a batch of tier pages alone: done at submit */
            const kvx_fetch_req only[] = {{m10, 3}, {m9, 2}};
            assert_int_equal(kvx_fetch_submit(f, only, 2), 0);
            size_t done = 0;
            assert_int_equal(kvx_fetch_poll(f, &done), 0);
            assert_int_equal(done, 2);
            assert_int_equal(kvx_fetch_wait(f, res, 2, 0), 0);
            assert_true(io_page_ok(res[0].page, 10, 3, res[0].bytes));
            assert_true(io_page_ok(res[1].page, 9, 2, res[1].bytes));
            kvx_fetch_destroy(f);
            kvx_pool_destroy(p);
        }
    kvx_shard_close(fs);
    kvx_shard_close(m9);
    kvx_shard_close(m10);
}

/* Finding 2, warmup: a shared-tier view's shard failed the whole warmup
 * the same way (kvx_ioq_file of -1). Now its pages are copied into staging
 * and delivered as landed runs: every sink, every executor, and
 * kvx_warmup_start's thread. */
static void test_warmup_tier_view(void **state)
{
    (void)state;
    char path[512];
    assert_int_equal(io_make_shard(path, sizeof path, io_tmpdir, "warm.kvx", 2, 7, 0), 0);
    kvx_shard *fs, *m9 = mem_shard(9);
    assert_int_equal(kvx_shard_open(&fs, path, 0), 0);
    kvx_shard *in[3] = {m9, fs, m9};
    uint64_t need = 0;
    assert_int_equal(kvx_warmup_sink_bytes(&need, in, 3), 0);
    uint8_t *buf = malloc(need);
    assert_non_null(buf);
    uint64_t crc_sum = 0, pages = 0;
    for (size_t k = 0; k < 3; k++)
        for (uint32_t i = 0; i < kvx_shard_get_info(in[k])->num_blocks; i++) {
            kvx_entry e;
            assert_int_equal(kvx_shard_entry(&e, in[k], i), 0);
            crc_sum += e.crc32;
            pages++;
        }
    const int modes[] = {KVX_IO_AUTO, KVX_IO_PREAD, KVX_IO_URING};
    for (size_t m = 0; m < 3; m++) {
        kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
        o.io_mode = modes[m];
        o.sink = KVX_SINK_HOST;
        o.host_buf = buf;
        o.host_buf_bytes = need;
        memset(buf, 0, need);
        kvx_warmup_report r;
        int rc = kvx_warmup_run(&r, in, 3, &o);
        if (modes[m] == KVX_IO_URING && (rc == -EPERM || rc == -ENOSYS)) continue; /* io_uring refused here */
        assert_int_equal(rc, 0);
        assert_int_equal(r.pages, pages);
        assert_int_equal(r.n_failures, 0);
        kvx_warmup_report_free(&r);
        uint64_t off = 0;
        for (size_t k = 0; k < 3; k++)
            for (uint32_t i = 0; i < kvx_shard_get_info(in[k])->num_blocks; i++) {
                kvx_entry e;
                assert_int_equal(kvx_shard_entry(&e, in[k], i), 0);
                off = (off + 255) / 256 * 256;
                assert_true(io_page_ok(buf + off, tag_of(in[k], m9), i, e.bytes));
                off += e.bytes;
            }
        /* the discard sink's checksum counts the tier pages too */
        o.sink = KVX_SINK_DISCARD;
        o.host_buf = NULL;
        o.host_buf_bytes = 0;
        assert_int_equal(kvx_warmup_run(&r, in, 3, &o), 0);
        assert_int_equal(r.pages, pages);
        assert_int_equal(r.checksum, crc_sum);
        kvx_warmup_report_free(&r);
        /* and on kvx_warmup_start's thread */
        kvx_warmup *w = NULL;
        assert_int_equal(kvx_warmup_start(&w, in, 3, &o), 0);
        assert_int_equal(kvx_warmup_wait(&r, w, -1), 0);
        assert_int_equal(r.pages, pages);
        kvx_warmup_report_free(&r);
        kvx_warmup_destroy(w);
    }
    free(buf);
    kvx_shard_close(fs);
    kvx_shard_close(m9);
}

/* ---- finding 6: a release whose wait fails ---- */

static int waits_failed;
static int always_eagain(int res, size_t requested)
{
    (void)res;
    (void)requested;
    return -EAGAIN;
}
static int wait_busy(int rc)
{
    (void)rc;
    waits_failed++;
    return -EBUSY;
}

/* Finding 6: when kvx_fetch_release's wait for reads in flight failed for
 * good, it kept the slots but freed the run and page records the ring's
 * completions name; the next reap (here the peer's wait) wrote into freed
 * memory (ASan: heap-use-after-free; without it, a write through the
 * released batch's NULL results). Now they are parked on the queue, the
 * peer's batch completes, and every later submit on the queue is -EIO. */
static void test_failed_wait_parks_runs(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *sh;
    assert_int_equal(io_make_shard(path, sizeof path, io_tmpdir, "wait.kvx", 3, 24, 0), 0);
    assert_int_equal(kvx_shard_open(&sh, path, 0), 0);
    kvx_pool *p = pool_of(16u << 20);
    kvx_fetch_options o = KVX_FETCH_OPTIONS_INIT;
    o.io_mode = KVX_IO_URING;
    o.max_read_bytes = 4096; /* a read per page: many in flight */
    kvx_fetch *f1 = NULL, *f2 = NULL;
    int rc = kvx_fetch_create(&f1, p, &o);
    if (rc == -EPERM || rc == -ENOSYS || rc == KVX_EMEMLOCK) {
        kvx_pool_destroy(p);
        kvx_shard_close(sh);
        skip(); /* io_uring refused on this machine */
    }
    assert_int_equal(rc, 0);
    assert_int_equal(kvx_fetch_create_peer(&f2, f1), 0);
    kvx_fetch_req r1[12], r2[12];
    for (uint32_t i = 0; i < 12; i++) {
        r1[i] = (kvx_fetch_req){sh, i};
        r2[i] = (kvx_fetch_req){sh, 12 + i};
    }
    assert_int_equal(kvx_fetch_submit(f1, r1, 12), 0);
    assert_int_equal(kvx_fetch_submit(f2, r2, 12), 0);
    /* every read lands -EAGAIN and is read again, so reads stay in flight;
     * the release's wait for them then fails for good */
    waits_failed = 0;
    kvx_os.uring_result = always_eagain;
    kvx_os.uring_wait = wait_busy;
    kvx_fetch_release(f1);
    kvx_os_reset();
    assert_true(waits_failed > 0);
    /* the peer reaps f1's late completions with its own */
    kvx_fetch_result res[12];
    assert_int_equal(kvx_fetch_wait(f2, res, 12, 10000), 0);
    for (uint32_t i = 0; i < 12; i++) {
        assert_int_equal(res[i].status, 0);
        assert_true(io_page_ok(res[i].page, 3, 12 + i, res[i].bytes));
    }
    /* the queue takes no new batch, on either handle */
    assert_int_equal(kvx_fetch_submit(f1, r1, 12), -EIO);
    assert_non_null(strstr(kvx_last_error(), "unusable"));
    assert_non_null(strstr(kvx_last_error(), "Device or resource busy"));
    assert_int_equal(kvx_fetch_submit(f2, r2, 12), -EIO);
    kvx_fetch_destroy(f1);
    kvx_fetch_destroy(f2);
    kvx_pool_destroy(p);
    kvx_shard_close(sh);
}

/* ---- finding 4: kvx_shard_to_envelope bounded by the shard's data ---- */

/* Finding 4: the envelope's bound was 64 times the file's size, holes
 * included: a 5 MiB shard of 1024 one-token blocks with block_tokens 2^20
 * truncated up to 1 TiB (sparse) was allowed a 4 GiB envelope, malloc'd
 * and written 4 MiB a block. Now the data bytes count (tables, pages
 * padded to 4096): KVX_ECAPACITY before any allocation, here under a
 * 512 MiB address-space limit (which the 4 GiB malloc failed: -ENOMEM). */
static void test_to_envelope_sparse_bound(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/sparse.kvx", io_tmpdir);
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = (kvx_geometry){1, 1, 1, 1u << 20, KVX_QUANT_FP16, 7};
    o.shard_id = 4;
    o.max_entries = 1024;
    kvx_shard_writer *w = NULL;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    uint8_t page[4] = {1, 2, 3, 4};
    for (uint32_t i = 0; i < 1024; i++) {
        kvx_entry_in e;
        memset(&e, 0, sizeof e);
        e.radix_block = (uint16_t)i;
        e.token_count = 1;
        e.page = page;
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    }
    assert_int_equal(kvx_shard_writer_seal(w), 0);
    assert_int_equal(truncate(path, (off_t)1 << 40), 0);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, KVX_OPEN_VERIFY_PAGES), 0); /* its 1 TiB mapping: before the limit */
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
#if !defined(__SANITIZE_ADDRESS__) /* its shadow memory needs terabytes of address space */
        struct rlimit rl = {512u << 20, 512u << 20};
        if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(5);
#endif
        void *out = NULL;
        size_t len = 0;
        int rc = kvx_shard_to_envelope(&out, &len, s, KVX_ENVELOPE_V1);
        _exit(rc == KVX_ECAPACITY && !out && strstr(kvx_last_error(), "block_tokens 1048576") ? 0
              : rc == -ENOMEM                                                                ? 3
                                                                                             : 4);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    kvx_shard_close(s);
    unlink(path);
}

/* Finding 4: a shard with a missing page (cut inside its last page) is
 * refused before the envelope is allocated; it was allocated whole, and
 * the copy then stopped at the missing page. */
static void test_to_envelope_missing_pages(void **state)
{
    (void)state;
    char path[512];
    assert_int_equal(io_make_shard(path, sizeof path, io_tmpdir, "cut.kvx", 5, 9, 0), 0);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, 0), 0);
    kvx_entry e;
    assert_int_equal(kvx_shard_entry(&e, s, 8), 0);
    kvx_shard_close(s);
    assert_int_equal(truncate(path, (off_t)(e.offset + 1)), 0);
    assert_int_equal(kvx_shard_open(&s, path, 0), 0);
    void *out = NULL;
    size_t len = 0;
    assert_int_equal(kvx_shard_to_envelope(&out, &len, s, KVX_ENVELOPE_V1), KVX_ETRUNC);
    assert_null(out);
    assert_non_null(strstr(kvx_last_error(), "1 of its 9 pages lie past the end of the file (missing)"));
    kvx_shard_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_verify_every_served_page, os_reset),
        cmocka_unit_test_setup(test_rewrite_same_size_mtime, os_reset),
        cmocka_unit_test_setup(test_fetch_tier_view, os_reset),
        cmocka_unit_test_setup(test_warmup_tier_view, os_reset),
        cmocka_unit_test_setup(test_failed_wait_parks_runs, os_reset),
        cmocka_unit_test_setup(test_to_envelope_sparse_bound, os_reset),
        cmocka_unit_test_setup(test_to_envelope_missing_pages, os_reset),
    };
    return cmocka_run_group_tests(tests, io_setup, io_teardown);
}
