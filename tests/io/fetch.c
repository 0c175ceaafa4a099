/*
 * fetch.c - io/fetch.c on every path: io_uring (O_DIRECT on this file
 * system), io_uring buffered, the pread thread pool, and the fallback
 * forced with KVX_IO_FORCE_NO_URING. Each fetch is checked byte for byte
 * against the pattern the shard was written with, in the order requested.
 * Also: coalescing, injected -EAGAIN / -EINTR / short reads, CRC failures,
 * truncation, tmpfs, bad requests, peers, cancel, wait(0), unpadded pages,
 * shared-tier views, a failed wait, deleted shards let go.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvx.h"
#include "lib/commit.h"
#include "lib/fault.h"
#include "lib/io.h"
#include "lib/store.h"

#define N1 40

#define N2 23

static char path1[512], path2[512];

static kvx_shard *s1, *s2;

static int group_setup(void **state)
{
    (void)state;
    unsetenv("KVX_IO_FORCE_NO_URING");
    if (io_mkdtemp("test_fetch")) return -1;
    if (io_make_shard(path1, sizeof path1, io_tmpdir, "a.kvx", 1, N1, 0)) return -1;
    if (io_make_shard(path2, sizeof path2, io_tmpdir, "b.kvx", 2, N2, 0)) return -1;
    if (kvx_shard_open(&s1, path1, 0) || kvx_shard_open(&s2, path2, 0)) return -1;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    kvx_shard_close(s1);
    kvx_shard_close(s2);
    io_rm_rf(io_tmpdir);
    return 0;
}

static kvx_pool *pool_of(uint64_t bytes)
{
    kvx_pool_options o = KVX_POOL_OPTIONS_INIT;
    o.bytes = bytes;
    kvx_pool *p = NULL;
    assert_int_equal(kvx_pool_create(&p, &o), 0);
    return p;
}

static kvx_fetch *fetch_of(kvx_pool *p, int mode, uint32_t qd, uint32_t flags, uint32_t max_read)
{
    kvx_fetch_options o = KVX_FETCH_OPTIONS_INIT;
    o.io_mode = mode;
    o.queue_depth = qd;
    o.flags = flags;
    o.max_read_bytes = max_read;
    o.threads = 3;
    kvx_fetch *f = NULL;
    int rc = kvx_fetch_create(&f, p, &o);
    if (rc == -EPERM || rc == -ENOSYS) {
        kvx_pool_destroy(p);
        skip(); /* io_uring refused on this machine */
    }
    assert_int_equal(rc, 0);
    return f;
}

/* Every entry of both shards, interleaved and shuffled (deterministically). */
static size_t all_reqs(kvx_fetch_req *r)
{
    size_t n = 0;
    for (uint32_t i = 0; i < N1; i++) r[n++] = (kvx_fetch_req){s1, i};
    for (uint32_t i = 0; i < N2; i++) r[n++] = (kvx_fetch_req){s2, i};
    uint64_t x = 12345;
    for (size_t i = n - 1; i > 0; i--) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        size_t j = (size_t)(x >> 33) % (i + 1);
        kvx_fetch_req t = r[i];
        r[i] = r[j];
        r[j] = t;
    }
    return n;
}

static void check_all(const kvx_fetch_req *r, const kvx_fetch_result *res, size_t n, int verify)
{
    for (size_t i = 0; i < n; i++) {
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, r[i].shard, r[i].entry), 0);
        assert_int_equal(res[i].status, 0);
        assert_int_equal(res[i].bytes, e.bytes);
        assert_non_null(res[i].page);
        assert_int_equal((uintptr_t)res[i].page % 4096, 0);
        assert_true(io_page_ok(res[i].page, r[i].shard == s1 ? 1 : 2, r[i].entry, e.bytes));
        if (verify) assert_int_equal(res[i].crc32, e.crc32);
    }
}

static void run_path(int mode, uint32_t flags, int want_mode)
{
    kvx_pool *p = pool_of(4 << 20);
    kvx_fetch *f = fetch_of(p, mode, 8, flags, 0);
    assert_int_equal(kvx_fetch_mode(f), want_mode);
    kvx_fetch_req r[N1 + N2];
    kvx_fetch_result res[N1 + N2];
    size_t n = all_reqs(r);
    for (int round = 0; round < 2; round++) { /* the second reuses cached files and slots */
        assert_int_equal(kvx_fetch_submit(f, r, n), 0);
        size_t done = 0;
        assert_int_equal(kvx_fetch_poll(f, &done), 0);
        assert_true(done <= n);
        assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
        assert_int_equal(kvx_fetch_poll(f, &done), 0);
        assert_int_equal(done, n);
        check_all(r, res, n, !(flags & KVX_FETCH_NO_VERIFY));
    }
    if (want_mode == KVX_IO_URING && !(flags & KVX_FETCH_BUFFERED)) assert_int_equal(kvx_fetch_direct(f), 1);
    if (flags & KVX_FETCH_BUFFERED || want_mode == KVX_IO_PREAD) assert_int_equal(kvx_fetch_direct(f), 0);
    kvx_fetch_release(f);
    kvx_pool_info info;
    assert_int_equal(kvx_pool_get_info(&info, p), 0);
    assert_int_equal(info.free_bytes, info.bytes); /* every slot back */
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);
}

static void test_uring_direct(void **state) { (void)state; run_path(KVX_IO_URING, 0, KVX_IO_URING); }

static void test_uring_buffered(void **state) { (void)state; run_path(KVX_IO_URING, KVX_FETCH_BUFFERED, KVX_IO_URING); }

static void test_pread(void **state) { (void)state; run_path(KVX_IO_PREAD, 0, KVX_IO_PREAD); }

static void test_no_verify(void **state) { (void)state; run_path(KVX_IO_AUTO, KVX_FETCH_NO_VERIFY, KVX_IO_URING); }

/* PROMISE: IO-10 */
static void test_forced_fallback(void **state)
{
    (void)state;
    setenv("KVX_IO_FORCE_NO_URING", "1", 1);
    kvx_pool *p = pool_of(4 << 20);
    kvx_fetch_options o = KVX_FETCH_OPTIONS_INIT;
    o.io_mode = KVX_IO_URING;
    kvx_fetch *f = NULL;
    assert_int_equal(kvx_fetch_create(&f, p, &o), -EPERM);
    assert_null(f);
    assert_non_null(strstr(kvx_last_error(), "io_uring refused"));
    kvx_pool_destroy(p);
    /* AUTO falls back to pread and says so */
    run_path(KVX_IO_AUTO, 0, KVX_IO_PREAD);
}

/* atomic: the fetch's threads read and reap concurrently (a plain int lost
 * an increment now and then under ASan: 39 counted for 40 reads) */
static atomic_int n_completions;

static int count_result(int res, size_t requested)
{
    (void)requested;
    atomic_fetch_add(&n_completions, 1);
    return res;
}

static atomic_int n_preads;

static ssize_t count_pread(int fd, void *buf, size_t len, off_t off)
{
    atomic_fetch_add(&n_preads, 1);
    return pread(fd, buf, len, off);
}

/* Entries lo..hi of s1 are back to back when each starts at the 4096
 * boundary after the previous one ends (the writer's layout). */
static size_t expected_runs(uint32_t lo, uint32_t hi, uint64_t max_read)
{
    size_t runs = 0;
    uint64_t start = 0, end = 0;
    for (uint32_t i = lo; i <= hi; i++) {
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, s1, i), 0);
        if (i == lo || e.offset != (end + 4095) / 4096 * 4096 || e.offset + e.bytes - start > max_read) {
            runs++;
            start = e.offset;
        }
        end = e.offset + e.bytes;
    }
    return runs;
}

static void coalesce_case(int mode, uint32_t max_read)
{
    kvx_pool *p = pool_of(4 << 20);
    kvx_fetch *f = fetch_of(p, mode, 4, KVX_FETCH_BUFFERED, max_read);
    kvx_fetch_req r[N1];
    kvx_fetch_result res[N1];
    /* requested backwards: the engine sorts */
    for (uint32_t i = 0; i < N1; i++) r[i] = (kvx_fetch_req){s1, N1 - 1 - i};
    atomic_store(&n_completions, 0);
    atomic_store(&n_preads, 0);
    kvx_os.uring_result = count_result;
    kvx_os.pread = count_pread;
    assert_int_equal(kvx_fetch_submit(f, r, N1), 0);
    assert_int_equal(kvx_fetch_wait(f, res, N1, -1), 0);
    kvx_os_reset();
    check_all(r, res, N1, 1);
    size_t want = expected_runs(0, N1 - 1, max_read ? max_read : 4u << 20);
    assert_true(want < N1 || max_read == 4096);
    assert_int_equal(mode == KVX_IO_URING ? atomic_load(&n_completions) : atomic_load(&n_preads), (int)want);
    /* pages of one run are consecutive in the slot, as in the file */
    kvx_entry e0, e1;
    assert_int_equal(kvx_shard_entry(&e0, s1, 0), 0);
    assert_int_equal(kvx_shard_entry(&e1, s1, 1), 0);
    if (max_read >= e1.offset + e1.bytes - e0.offset || max_read == 0)
        assert_ptr_equal((uint8_t *)res[N1 - 1].page + (e1.offset - e0.offset), res[N1 - 2].page);
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);
}

static void test_coalesce(void **state)
{
    (void)state;
    coalesce_case(KVX_IO_URING, 0);
    coalesce_case(KVX_IO_URING, 32768);
    coalesce_case(KVX_IO_PREAD, 0);
    coalesce_case(KVX_IO_PREAD, 4096); /* every page its own read */
}

static int fault_step;

/* Cycles: -EAGAIN, -EINTR, a short read (1/3 of what was asked, odd so
 * O_DIRECT has to realign), then the real result. */
static int faulty_result(int res, size_t requested)
{
    int step = fault_step++ % 4;
    if (step == 0) return -EAGAIN;
    if (step == 1) return -EINTR;
    if (step == 2 && res > 3 && requested > 3) return res / 3 | 1;
    return res;
}

static int pread_step;

static ssize_t faulty_pread(int fd, void *buf, size_t len, off_t off)
{
    int step = __atomic_fetch_add(&pread_step, 1, __ATOMIC_RELAXED) % 3;
    if (step == 0) {
        errno = EINTR;
        return -1;
    }
    if (step == 1 && len > 3) len = len / 3 | 1;
    return pread(fd, buf, len, off);
}

static void fault_case(int mode, uint32_t flags)
{
    kvx_pool *p = pool_of(4 << 20);
    kvx_fetch *f = fetch_of(p, mode, 5, flags, 16384);
    kvx_fetch_req r[N1 + N2];
    kvx_fetch_result res[N1 + N2];
    size_t n = all_reqs(r);
    fault_step = pread_step = 0;
    kvx_os.uring_result = faulty_result;
    kvx_os.pread = faulty_pread;
    assert_int_equal(kvx_fetch_submit(f, r, n), 0);
    assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
    kvx_os_reset();
    check_all(r, res, n, 1);
    assert_true(mode == KVX_IO_URING ? fault_step > (int)n / 4 : pread_step > 0);
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);
}

/* PROMISE: IO-13 */
static void test_faults_uring_direct(void **state) { (void)state; fault_case(KVX_IO_URING, 0); }

/* PROMISE: IO-13 */
static void test_faults_uring_buffered(void **state) { (void)state; fault_case(KVX_IO_URING, KVX_FETCH_BUFFERED); }

/* PROMISE: IO-13 */
static void test_faults_pread(void **state) { (void)state; fault_case(KVX_IO_PREAD, 0); }

static int eio_result(int res, size_t requested)
{
    (void)res, (void)requested;
    return -EIO;
}

/* PROMISE: IO-13 */
static void test_read_error(void **state)
{
    (void)state;
    kvx_pool *p = pool_of(4 << 20);
    kvx_fetch *f = fetch_of(p, KVX_IO_URING, 4, 0, 0);
    kvx_fetch_req r[3] = {{s1, 0}, {s1, 5}, {s2, 2}};
    kvx_fetch_result res[3];
    kvx_os.uring_result = eio_result;
    assert_int_equal(kvx_fetch_submit(f, r, 3), 0);
    assert_int_equal(kvx_fetch_wait(f, res, 3, -1), 0);
    kvx_os_reset();
    for (int i = 0; i < 3; i++) assert_int_equal(res[i].status, -EIO);
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);
}

/* Fetches entries 0..N1-1 of s, in order, and waits for all of them. */
static void fetch_every(kvx_fetch *f, kvx_shard *s, kvx_fetch_req *r, kvx_fetch_result *res)
{
    for (uint32_t i = 0; i < N1; i++) r[i] = (kvx_fetch_req){s, i};
    assert_int_equal(kvx_fetch_submit(f, r, N1), 0);
    assert_int_equal(kvx_fetch_wait(f, res, N1, -1), 0);
}

static void crc_case(int mode)
{
    char path[600];
    kvx_shard *s = NULL;
    assert_int_equal(io_open_copy(&s, path, sizeof path, path1, "bad.kvx"), 0);
    kvx_entry e;
    assert_int_equal(kvx_shard_entry(&e, s, 7), 0);
    assert_int_equal(io_flip_byte(path, e.offset + 5, 0xFF), 0); /* every bit of byte 5 */
    kvx_pool *p = pool_of(4 << 20);
    kvx_fetch *f = fetch_of(p, mode, 4, 0, 0);
    kvx_fetch_req r[N1];
    kvx_fetch_result res[N1];
    fetch_every(f, s, r, res);
    for (uint32_t i = 0; i < N1; i++) {
        if (i == 7) {
            assert_int_equal(res[i].status, KVX_EPAGECRC);
            assert_int_not_equal(res[i].crc32, e.crc32);
            assert_int_equal(res[i].crc32, kvx_crc32(0, res[i].page, res[i].bytes));
        } else {
            assert_int_equal(res[i].status, 0);
            assert_true(io_page_ok(res[i].page, 1, i, res[i].bytes));
        }
    }
    kvx_fetch_destroy(f);
    /* without verification the page is delivered as read */
    kvx_fetch_options o = KVX_FETCH_OPTIONS_INIT;
    o.io_mode = mode;
    o.flags = KVX_FETCH_NO_VERIFY;
    assert_int_equal(kvx_fetch_create(&f, p, &o), 0);
    assert_int_equal(kvx_fetch_submit(f, r + 7, 1), 0);
    assert_int_equal(kvx_fetch_wait(f, res, 1, -1), 0);
    assert_int_equal(res[0].status, 0);
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);
    kvx_shard_close(s);
    unlink(path);
}

/* PROMISE: IO-3 */
static void test_crc_uring(void **state) { (void)state; crc_case(KVX_IO_URING); }

/* PROMISE: IO-3 */
static void test_crc_pread(void **state) { (void)state; crc_case(KVX_IO_PREAD); }

static void trunc_case(int mode)
{
    char path[600];
    kvx_shard *s = NULL;
    assert_int_equal(io_open_copy(&s, path, sizeof path, path1, "trunc.kvx"), 0);
    kvx_entry last, cut;
    assert_int_equal(kvx_shard_entry(&last, s, N1 - 1), 0);
    assert_int_equal(kvx_shard_entry(&cut, s, N1 - 3), 0);
    /* cut in the middle of entry N1-3: it and the two after it are gone */
    assert_int_equal(truncate(path, (off_t)(cut.offset + cut.bytes / 2 + 1)), 0);
    kvx_pool *p = pool_of(4 << 20);
    kvx_fetch *f = fetch_of(p, mode, 4, 0, 0);
    kvx_fetch_req r[N1];
    kvx_fetch_result res[N1];
    fetch_every(f, s, r, res);
    for (uint32_t i = 0; i < N1; i++) {
        if (i >= N1 - 3)
            assert_int_equal(res[i].status, KVX_ETRUNC);
        else {
            assert_int_equal(res[i].status, 0);
            assert_true(io_page_ok(res[i].page, 1, i, res[i].bytes));
        }
    }
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);
    kvx_shard_close(s);
    unlink(path);
}

/* PROMISE: IO-3 */
static void test_trunc_uring(void **state) { (void)state; trunc_case(KVX_IO_URING); }

/* PROMISE: IO-3 */
static void test_trunc_pread(void **state) { (void)state; trunc_case(KVX_IO_PREAD); }

static void test_tmpfs(void **state)
{
    (void)state;
    char dir[] = "/dev/shm/kvx_test_fetch.XXXXXX";
    if (!mkdtemp(dir)) skip();
    char path[600];
    assert_int_equal(io_make_shard(path, sizeof path, dir, "t.kvx", 3, 9, 0), 0);
    kvx_shard *s = NULL;
    assert_int_equal(kvx_shard_open(&s, path, 0), 0);
    kvx_pool *p = pool_of(1 << 20);
    kvx_fetch *f = fetch_of(p, KVX_IO_URING, 4, 0, 0);
    kvx_fetch_req r[9];
    kvx_fetch_result res[9];
    for (uint32_t i = 0; i < 9; i++) r[i] = (kvx_fetch_req){s, 8 - i};
    assert_int_equal(kvx_fetch_submit(f, r, 9), 0);
    assert_int_equal(kvx_fetch_wait(f, res, 9, -1), 0);
    for (uint32_t i = 0; i < 9; i++) {
        assert_int_equal(res[i].status, 0);
        assert_true(io_page_ok(res[i].page, 3, 8 - i, res[i].bytes));
    }
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);
    kvx_shard_close(s);
    io_rm_rf(dir);
}

/* PROMISE: IO-3 */
static void test_bad_requests(void **state)
{
    (void)state;
    kvx_pool *p = pool_of(1 << 20);
    kvx_fetch *f = fetch_of(p, KVX_IO_AUTO, 0, 0, 0);
    kvx_fetch_req r[4] = {{s1, 1}, {NULL, 0}, {s2, N2 + 5}, {s2, 0}};
    kvx_fetch_result res[4];
    assert_int_equal(kvx_fetch_submit(f, r, 4), 0);
    assert_int_equal(kvx_fetch_wait(f, res, 3, -1), KVX_EINVALID); /* wrong n */
    assert_int_equal(kvx_fetch_wait(f, res, 4, -1), 0);
    assert_int_equal(res[0].status, 0);
    assert_int_equal(res[1].status, KVX_EINVALID);
    assert_null(res[1].page);
    assert_int_not_equal(res[2].status, 0);
    assert_null(res[2].page);
    assert_int_equal(res[3].status, 0);
    assert_true(io_page_ok(res[3].page, 2, 0, res[3].bytes));
    /* an empty batch completes at once */
    assert_int_equal(kvx_fetch_submit(f, r, 0), 0);
    assert_int_equal(kvx_fetch_wait(f, res, 0, 0), 0);
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);

    /* a batch that does not fit the pool */
    p = pool_of(16384);
    f = fetch_of(p, KVX_IO_AUTO, 0, 0, 0);
    kvx_fetch_req all[N1 + N2];
    size_t n = all_reqs(all);
    assert_int_equal(kvx_fetch_submit(f, all, n), KVX_ECAPACITY);
    kvx_pool_info info;
    assert_int_equal(kvx_pool_get_info(&info, p), 0);
    assert_int_equal(info.free_bytes, info.bytes); /* nothing leaked */
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);

    kvx_fetch_options o = KVX_FETCH_OPTIONS_INIT;
    o.version = 7;
    assert_int_equal(kvx_fetch_create(&f, NULL, &o), KVX_EINVALID);
    p = pool_of(1 << 20);
    assert_int_equal(kvx_fetch_create(&f, p, &o), KVX_EVERSION);
    o = (kvx_fetch_options)KVX_FETCH_OPTIONS_INIT;
    o.io_mode = 9;
    assert_int_equal(kvx_fetch_create(&f, p, &o), KVX_EINVALID);
    kvx_pool_destroy(p);
    kvx_fetch_destroy(NULL);
}

/* The pread workers would otherwise race the cancel (on a loaded machine
 * they can finish the whole batch first): each read waits at this gate,
 * through the OS seam, until the test has canceled. */
static _Atomic int cancel_gate_open;

static ssize_t gated_pread(int fd, void *buf, size_t len, off_t off)
{
    while (!cancel_gate_open) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return pread(fd, buf, len, off);
}

static void cancel_case(int mode)
{
    kvx_pool *p = pool_of(4 << 20);
    kvx_fetch *f = fetch_of(p, mode, 1, 0, 4096);
    kvx_fetch_req r[N1 + N2];
    kvx_fetch_result res[N1 + N2];
    size_t n = all_reqs(r);
    cancel_gate_open = 0;
    kvx_os.pread = gated_pread;
    assert_int_equal(kvx_fetch_submit(f, r, n), 0);
    assert_int_equal(kvx_fetch_cancel(f), 0);
    cancel_gate_open = 1;
    kvx_os_reset();
    assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
    size_t canceled = 0;
    for (size_t i = 0; i < n; i++) {
        if (res[i].status == KVX_ECANCELED)
            canceled++;
        else {
            assert_int_equal(res[i].status, 0);
            assert_true(io_page_ok(res[i].page, r[i].shard == s1 ? 1 : 2, r[i].entry, res[i].bytes));
        }
    }
    assert_true(canceled > 0); /* depth 1, one page per read: most never started */
    /* the handle is reusable after a canceled batch */
    assert_int_equal(kvx_fetch_submit(f, r, 3), 0);
    assert_int_equal(kvx_fetch_wait(f, res, 3, -1), 0);
    check_all(r, res, 3, 1);
    /* destroy with a batch in flight drains it */
    assert_int_equal(kvx_fetch_submit(f, r, n), 0);
    kvx_fetch_destroy(f);
    kvx_pool_info info;
    assert_int_equal(kvx_pool_get_info(&info, p), 0);
    assert_int_equal(info.free_bytes, info.bytes);
    kvx_pool_destroy(p);
}

/* Two handles on one queue: batches overlap, each reaps the other's reads
 * for it, and cancel / release / destroy touch only their own batch. */
static void peer_case(int mode)
{
    kvx_pool *p = pool_of(8 << 20);
    kvx_fetch *f = fetch_of(p, mode, 2, 0, 4096), *g = NULL;
    assert_int_equal(kvx_fetch_create_peer(NULL, f), KVX_EINVALID);
    assert_int_equal(kvx_fetch_create_peer(&g, NULL), KVX_EINVALID);
    assert_null(g);
    assert_int_equal(kvx_fetch_create_peer(&g, f), 0);
    assert_int_equal(kvx_fetch_mode(g), kvx_fetch_mode(f));
    kvx_fetch_req r[N1 + N2];
    kvx_fetch_result res[N1 + N2], res2[N1 + N2];
    size_t n = all_reqs(r);
    /* both batches queued; waiting on f alone finishes f, g may progress */
    assert_int_equal(kvx_fetch_submit(f, r, n), 0);
    assert_int_equal(kvx_fetch_submit(g, r + 1, n - 1), 0);
    assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
    check_all(r, res, n, 1);
    assert_int_equal(kvx_fetch_wait(g, res2, n - 1, -1), 0);
    check_all(r + 1, res2, n - 1, 1);
    /* cancel of f leaves g's batch whole (f's reads queue behind g's) */
    assert_int_equal(kvx_fetch_submit(g, r, n), 0);
    assert_int_equal(kvx_fetch_submit(f, r, n), 0);
    assert_int_equal(kvx_fetch_cancel(f), 0);
    assert_int_equal(kvx_fetch_wait(g, res2, n, -1), 0);
    check_all(r, res2, n, 1);
    assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
    size_t canceled = 0;
    for (size_t i = 0; i < n; i++) {
        if (res[i].status == KVX_ECANCELED)
            canceled++;
        else
            assert_int_equal(res[i].status, 0);
    }
    if (mode == KVX_IO_URING) assert_true(canceled > 0); /* depth 2: f's reads had not started */
    /* releasing f while g's batch is in flight, then destroying f first */
    assert_int_equal(kvx_fetch_submit(g, r, n), 0);
    assert_int_equal(kvx_fetch_submit(f, r, 2), 0);
    kvx_fetch_destroy(f);
    assert_int_equal(kvx_fetch_wait(g, res2, n, -1), 0);
    check_all(r, res2, n, 1);
    kvx_fetch_release(g);
    kvx_pool_info info;
    assert_int_equal(kvx_pool_get_info(&info, p), 0);
    assert_int_equal(info.free_bytes, info.bytes);
    kvx_fetch_destroy(g);
    kvx_pool_destroy(p);
}

/* PROMISE: IO-14 */
static void test_peer_uring(void **state) { (void)state; peer_case(KVX_IO_URING); }

/* PROMISE: IO-14 */
static void test_peer_pread(void **state) { (void)state; peer_case(KVX_IO_PREAD); }

/* A caller that polls with wait(..., 0) between other work (the cgo
 * pattern) must see the batch finish: a zero timeout still collects the
 * reads that have landed. */
static void wait0_case(int mode)
{
    kvx_pool *p = pool_of(4 << 20);
    kvx_fetch *f = fetch_of(p, mode, 4, 0, 0);
    kvx_fetch_req r[N1 + N2];
    kvx_fetch_result res[N1 + N2];
    size_t n = all_reqs(r);
    assert_int_equal(kvx_fetch_submit(f, r, n), 0);
    int rc;
    unsigned tries = 0;
    while ((rc = kvx_fetch_wait(f, res, n, 0)) == -ETIMEDOUT && tries++ < 5000) usleep(1000);
    assert_int_equal(rc, 0);
    check_all(r, res, n, 1);
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);
}

static void test_wait0_uring(void **state) { (void)state; wait0_case(KVX_IO_URING); }

static void test_wait0_pread(void **state) { (void)state; wait0_case(KVX_IO_PREAD); }

/* A valid shard whose file ends exactly where its last page ends (another
 * writer need not pad to 4096), with pages of 12*N bytes: under O_DIRECT
 * the last read is rounded up past the end of the file and comes back
 * short; every page must still arrive whole, on every path. */
static void unpadded_case(int mode, uint32_t flags)
{
    char path[600];
    snprintf(path, sizeof path, "%s/unpadded.kvx", io_tmpdir);
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = (kvx_geometry){1, 1, 3, 5, KVX_QUANT_FP16, 0};
    o.max_entries = 3;
    kvx_shard_writer *w = NULL;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    uint8_t page[2 * 5 * 3 * 2];
    for (uint32_t i = 0; i < 3; i++) {
        for (size_t k = 0; k < sizeof page; k++) page[k] = (uint8_t)(i * 31 + k * 7 + 1);
        kvx_entry_in e = {0};
        e.radix_block = (uint16_t)i;
        e.token_count = 5 - i;
        e.page = page;
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    }
    assert_int_equal(kvx_shard_writer_seal(w), 0);
    kvx_shard *s = NULL;
    assert_int_equal(kvx_shard_open(&s, path, 0), 0);
    kvx_entry last;
    assert_int_equal(kvx_shard_entry(&last, s, 2), 0);
    kvx_shard_close(s);
    assert_int_equal(truncate(path, (off_t)(last.offset + last.bytes)), 0);
    assert_int_equal(kvx_shard_open(&s, path, KVX_OPEN_VERIFY_PAGES), 0);
    kvx_pool *p = pool_of(1 << 20);
    kvx_fetch *f = fetch_of(p, mode, 4, flags, 0);
    kvx_fetch_req r[3] = {{s, 2}, {s, 0}, {s, 1}};
    kvx_fetch_result res[3];
    assert_int_equal(kvx_fetch_submit(f, r, 3), 0);
    assert_int_equal(kvx_fetch_wait(f, res, 3, -1), 0);
    for (int i = 0; i < 3; i++) {
        kvx_entry e;
        const void *want;
        assert_int_equal(kvx_shard_entry(&e, s, r[i].entry), 0);
        assert_int_equal(kvx_shard_page(&want, s, r[i].entry, 1), 0);
        assert_int_equal(res[i].status, 0);
        assert_int_equal(res[i].bytes, e.bytes);
        assert_memory_equal(res[i].page, want, e.bytes);
    }
    if (mode == KVX_IO_URING) assert_int_equal(kvx_fetch_direct(f), 1); /* as test_uring_direct */
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);
    kvx_shard_close(s);
    unlink(path);
}

/* PROMISE: IO-4 */
static void test_unpadded_uring(void **state) { (void)state; unpadded_case(KVX_IO_URING, 0); }

/* PROMISE: IO-4 */
static void test_unpadded_pread(void **state) { (void)state; unpadded_case(KVX_IO_PREAD, 0); }

/* PROMISE: IO-3 */
static void test_cancel_uring(void **state) { (void)state; cancel_case(KVX_IO_URING); }

/* PROMISE: IO-3 */
static void test_cancel_pread(void **state) { (void)state; cancel_case(KVX_IO_PREAD); }

static kvx_pool *pool_or_unlocked(uint64_t bytes)
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
/* PROMISE: IO-7 */
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
            kvx_pool *p = pool_or_unlocked(8u << 20);
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
/* PROMISE: IO-8 */
static void test_failed_wait_parks_runs(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *sh;
    assert_int_equal(io_make_shard(path, sizeof path, io_tmpdir, "wait.kvx", 3, 24, 0), 0);
    assert_int_equal(kvx_shard_open(&sh, path, 0), 0);
    kvx_pool *p = pool_or_unlocked(16u << 20);
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

/* Open descriptors of this process naming a deleted file under dir. */
static int deleted_fds_under(const char *dir)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char p[300], link[1024];
        snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(p, link, sizeof link - 1);
        if (len <= 0) continue;
        link[len] = 0;
        n += strncmp(link, dir, strlen(dir)) == 0 && strstr(link, " (deleted)") != NULL;
    }
    closedir(d);
    return n;
}

/* One request of shard sh (entry 0) through f, checked, released. */
static void fetch_one(kvx_fetch *f, kvx_shard *sh)
{
    const kvx_fetch_req r = {sh, 0};
    kvx_fetch_result res;
    assert_int_equal(kvx_fetch_submit(f, &r, 1), 0);
    assert_int_equal(kvx_fetch_wait(f, &res, 1, 10000), 0);
    assert_int_equal(res.status, 0);
    assert_true(io_page_ok(res.page, kvx_shard_get_info(sh)->shard_id, 0, res.bytes));
    kvx_fetch_release(f);
}

/* #5. Eviction and gc delete shard files; a reader's kvx_fetch kept its
 * own descriptors of them (one, two with O_DIRECT) in its file cache,
 * which is trimmed only beyond 64 files: the disk space of up to 64
 * deleted shards stayed held for the life of the handle. */
/* PROMISE: IO-9 */
static void test_fetch_lets_go_of_deleted_shards(void **state)
{
    (void)state;
    enum { GONE = 4 };
    char paths[GONE + 1][512];
    kvx_shard *sh[GONE + 1];
    for (int i = 0; i <= GONE; i++) {
        char name[32];
        snprintf(name, sizeof name, "del%d.kvx", i);
        assert_int_equal(io_make_shard(paths[i], sizeof paths[i], io_tmpdir, name, (uint8_t)(i + 1), 3, 0), 0);
        assert_int_equal(kvx_shard_open(&sh[i], paths[i], 0), 0);
    }
    kvx_pool_options po = KVX_POOL_OPTIONS_INIT;
    po.bytes = 4u << 20;
    kvx_pool *p = NULL;
    int rc = kvx_pool_create(&p, &po);
    if (rc == KVX_EMEMLOCK) {
        po.flags = KVX_POOL_NO_MLOCK | KVX_POOL_NO_REGISTER;
        rc = kvx_pool_create(&p, &po);
    }
    assert_int_equal(rc, 0);
    const int modes[] = {KVX_IO_AUTO, KVX_IO_PREAD};
    for (size_t m = 0; m < 2; m++) {
        kvx_fetch_options o = KVX_FETCH_OPTIONS_INIT;
        o.io_mode = modes[m];
        kvx_fetch *f = NULL;
        assert_int_equal(kvx_fetch_create(&f, p, &o), 0);
        for (int i = 0; i <= GONE; i++) fetch_one(f, sh[i]);
        assert_int_equal(deleted_fds_under(io_tmpdir), 0);
        /* deleted as eviction does: the name goes, the reader's shard closes */
        for (int i = 0; i < GONE; i++) {
            kvx_shard_close(sh[i]);
            sh[i] = NULL;
            assert_int_equal(unlink(paths[i]), 0);
        }
        /* the reader goes on with the live shard */
        for (int k = 0; k < 80; k++) fetch_one(f, sh[GONE]);
        int held = deleted_fds_under(io_tmpdir);
        if (held) fail_msg("DEFECT: a live kvx_fetch still holds %d descriptors of deleted shards", held);
        kvx_fetch_destroy(f);
        for (int i = 0; i < GONE; i++) { /* their successors, for the next mode */
            char name[32];
            snprintf(name, sizeof name, "del%d.kvx", i);
            assert_int_equal(io_make_shard(paths[i], sizeof paths[i], io_tmpdir, name, (uint8_t)(i + 1), 3, 0), 0);
            assert_int_equal(kvx_shard_open(&sh[i], paths[i], 0), 0);
        }
    }
    for (int i = 0; i <= GONE; i++) kvx_shard_close(sh[i]);
    kvx_pool_destroy(p);
}

/* A tombstone (a keyed delete) has no page: its request is KVX_ENOTFOUND
 * and never read, the pages beside it in the same batch arrive intact. */
/* PROMISE: IO-3 */
static void test_tombstone_not_fetched(void **state)
{
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/commit.kvx", io_tmpdir);
    cm_write(path);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, 0), 0);
    kvx_pool *p = pool_of(4 << 20);
    kvx_fetch *f = fetch_of(p, KVX_IO_PREAD, 4, 0, 0);
    kvx_fetch_req r[CM_N];
    kvx_fetch_result res[CM_N];
    for (uint32_t i = 0; i < CM_N; i++) r[i] = (kvx_fetch_req){s, i};
    assert_int_equal(kvx_fetch_submit(f, r, CM_N), 0);
    assert_int_equal(kvx_fetch_wait(f, res, CM_N, -1), 0);
    static uint8_t want[CM_PB];
    for (uint32_t i = 0; i < CM_N; i++) {
        if (!cm_lens[i]) {
            assert_int_equal(res[i].status, KVX_ENOTFOUND);
            continue;
        }
        assert_int_equal(res[i].status, 0);
        assert_int_equal(res[i].bytes, cm_lens[i]);
        cm_page(want, cm_lens[i], i);
        assert_memory_equal(res[i].page, want, cm_lens[i]);
    }
    kvx_fetch_release(f);
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);
    kvx_shard_close(s);
    unlink(path);
}

/* The group's setup and teardown: each fixture's, in order. */
static int setup_all(void **state)
{
    if (group_setup(state)) return -1;
    if (io_setup(state)) return -1;
    if (su_setup(state)) return -1;
    return 0;
}

static int teardown_all(void **state)
{
    su_teardown(state);
    io_teardown(state);
    group_teardown(state);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_uring_direct, os_reset),
        cmocka_unit_test_setup(test_uring_buffered, os_reset),
        cmocka_unit_test_setup(test_pread, os_reset),
        cmocka_unit_test_setup(test_no_verify, os_reset),
        cmocka_unit_test_setup_teardown(test_forced_fallback, os_reset, os_reset),
        cmocka_unit_test_setup(test_coalesce, os_reset),
        cmocka_unit_test_setup(test_tombstone_not_fetched, os_reset),
        cmocka_unit_test_setup(test_faults_uring_direct, os_reset),
        cmocka_unit_test_setup(test_faults_uring_buffered, os_reset),
        cmocka_unit_test_setup(test_faults_pread, os_reset),
        cmocka_unit_test_setup(test_read_error, os_reset),
        cmocka_unit_test_setup(test_crc_uring, os_reset),
        cmocka_unit_test_setup(test_crc_pread, os_reset),
        cmocka_unit_test_setup(test_trunc_uring, os_reset),
        cmocka_unit_test_setup(test_trunc_pread, os_reset),
        cmocka_unit_test_setup(test_tmpfs, os_reset),
        cmocka_unit_test_setup(test_bad_requests, os_reset),
        cmocka_unit_test_setup(test_peer_uring, os_reset),
        cmocka_unit_test_setup(test_peer_pread, os_reset),
        cmocka_unit_test_setup(test_cancel_uring, os_reset),
        cmocka_unit_test_setup(test_cancel_pread, os_reset),
        cmocka_unit_test_setup(test_wait0_uring, os_reset),
        cmocka_unit_test_setup(test_wait0_pread, os_reset),
        cmocka_unit_test_setup(test_unpadded_uring, os_reset),
        cmocka_unit_test_setup(test_unpadded_pread, os_reset),
        cmocka_unit_test_setup(test_fetch_tier_view, os_reset),
        cmocka_unit_test_setup(test_failed_wait_parks_runs, os_reset),
        cmocka_unit_test(test_fetch_lets_go_of_deleted_shards),
    };
    return cmocka_run_group_tests_name("io/fetch", tests, setup_all, teardown_all);
}
