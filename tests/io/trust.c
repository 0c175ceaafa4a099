/*
 * trust.c - the data path's trust rule (io/fetch.c, ioq.c): a page is
 * reported 0 only with the bytes its shard was written with, whatever
 * happens to the file in flight (truncated, extended, renamed over,
 * unlinked and recreated, a byte flipped); every OS call failed in turn;
 * many files, request lists with duplicates and holes, the caller's shard
 * closed in flight, peer misuse, no descriptor leaked, slow reads bounded.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvx.h"
#include "lib/fault.h"
#include "lib/io.h"

#define IO_BASE_N 40

static const int modes[3] = {KVX_IO_URING, KVX_IO_URING, KVX_IO_PREAD};

static const uint32_t mode_flags[3] = {0, KVX_FETCH_BUFFERED, 0};

enum change { CH_TRUNC, CH_EXTEND, CH_RENAME, CH_UNLINK_NEW, CH_REGROW };

static void change_case(int m, enum change ch)
{
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    kvx_entry mid;
    assert_int_equal(kvx_shard_entry(&mid, s, IO_BASE_N / 2), 0);
    kvx_pool *p = io_pool(4 << 20);
    uint64_t free0 = io_pool_free(p);
    kvx_fetch *f = io_fetch(p, modes[m], 2, mode_flags[m], 8192);
    kvx_fetch_req r[IO_BASE_N];
    kvx_fetch_result res[IO_BASE_N];
    size_t n = io_every_page(r, s);
    assert_int_equal(kvx_fetch_submit(f, r, n), 0);
    char other[600];
    snprintf(other, sizeof other, "%s.other", path);
    if (ch == CH_TRUNC) {
        assert_int_equal(truncate(path, (off_t)mid.offset), 0);
    } else if (ch == CH_EXTEND) {
        assert_int_equal(truncate(path, (off_t)(1 << 24)), 0);
    } else if (ch == CH_RENAME) {
        /* another shard's bytes under the same name */
        char tmp[512];
        assert_int_equal(io_make_shard(tmp, sizeof tmp, io_tmpdir, "rn_src.kvx", 9, IO_BASE_N, 0), 0);
        assert_int_equal(rename(tmp, path), 0);
    } else if (ch == CH_REGROW) {
        /* cut, then grown back to its size: the tail is a hole of zeros */
        struct stat sb;
        assert_int_equal(stat(path, &sb), 0);
        assert_int_equal(truncate(path, (off_t)mid.offset), 0);
        assert_int_equal(truncate(path, sb.st_size), 0);
    } else {
        assert_int_equal(unlink(path), 0);
        char tmp[512];
        assert_int_equal(io_make_shard(tmp, sizeof tmp, io_tmpdir, "un_src.kvx", 9, IO_BASE_N, 0), 0);
        assert_int_equal(rename(tmp, path), 0);
    }
    assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
    size_t ok = 0;
    io_check_trust(r, res, n, &ok);
    for (size_t i = 0; i < n; i++) {
        if (res[i].status == 0) continue;
        if (ch == CH_REGROW) {
            assert_true(res[i].status == KVX_EPAGECRC || res[i].status == KVX_ETRUNC);
            continue;
        }
        if (ch != CH_TRUNC) fail_msg("change %d mode %d: page %zu status %d", ch, m, i, res[i].status);
        assert_int_equal(res[i].status, KVX_ETRUNC);
    }
    /* the first batch raced the change: reads done before it are whole
     * (all of them when the workers were quick: CI saw that once) */
    if (ch == CH_TRUNC || ch == CH_REGROW)
        assert_true(ok >= IO_BASE_N / 2 - 1 && ok <= IO_BASE_N);
    else
        assert_int_equal(ok, IO_BASE_N);
    /* a second batch on the changed file: the same rules, and now the cut
     * half is refused whatever the timing */
    assert_int_equal(kvx_fetch_submit(f, r, n), 0);
    assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
    size_t ok2 = 0;
    io_check_trust(r, res, n, &ok2);
    if (ch == CH_TRUNC || ch == CH_REGROW) assert_true(ok2 >= IO_BASE_N / 2 - 1 && ok2 < IO_BASE_N);
    kvx_fetch_destroy(f);
    assert_int_equal(io_pool_free(p), free0);
    kvx_pool_destroy(p);
    kvx_shard_close(s);
}

/* PROMISE: IO-4 */
static void test_file_changed_inflight(void **state)
{
    (void)state;
    for (int m = 0; m < 3; m++)
        for (int ch = CH_TRUNC; ch <= CH_REGROW; ch++) change_case(m, (enum change)ch);
}

/* One fetch (create, submit, wait, destroy) on a shard new to the
 * handle; returns the fetch's first error or 0, checking the trust rule. */
static int os_fetch_once(kvx_pool *p, kvx_shard *s, int m)
{
    kvx_fetch_options o = KVX_FETCH_OPTIONS_INIT;
    o.io_mode = modes[m];
    o.flags = mode_flags[m];
    o.threads = 1;
    o.queue_depth = 3;
    o.max_read_bytes = 16384;
    kvx_fetch *f = NULL;
    int rc = kvx_fetch_create(&f, p, &o);
    if (rc) return rc;
    kvx_fetch_req r[IO_BASE_N];
    kvx_fetch_result res[IO_BASE_N];
    size_t n = io_every_page(r, s);
    rc = kvx_fetch_submit(f, r, n);
    if (!rc) rc = kvx_fetch_wait(f, res, n, -1);
    if (!rc) {
        io_check_trust(r, res, n, NULL);
        for (size_t i = 0; i < n; i++)
            if (res[i].status && res[i].status != KVX_ETRUNC && res[i].status >= 0)
                fail_msg("page %zu status %d", i, res[i].status);
    }
    kvx_fetch_destroy(f);
    return rc;
}

/* PROMISE: IO-13 */
static void test_os_faults_every_call(void **state)
{
    (void)state;
    static const int errs[4] = {EIO, EINVAL, EMFILE, EAGAIN};
    kvx_pool *p = io_pool(4 << 20);
    int fd0 = io_count_fds();
    for (int m = 0; m < 3; m++)
        for (int e = 0; e < 5; e++) {
            char path[512];
            kvx_shard *s = io_fresh(path, sizeof path);
            fault_install();
            assert_int_equal(os_fetch_once(p, s, m), 0);
            long total = fault_calls;
            for (long k = 1; k <= total + 1; k++) {
                fault_reset(k, e < 4 ? errs[e] : EIO, e < 4 ? FAULT_ERRNO : FAULT_SHORT);
                int rc = os_fetch_once(p, s, m);
                if (rc > 0) fail_msg("mode %d err %d call %ld (%s): rc %d", m, e, k, fault_hit_op, rc);
                assert_int_equal(io_pool_free(p), 4 << 20);
            }
            fault_uninstall();
            kvx_shard_close(s);
        }
    assert_int_equal(io_count_fds(), fd0);
    /* warmup, host sink */
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    uint64_t need;
    assert_int_equal(kvx_warmup_sink_bytes(&need, &s, 1), 0);
    uint8_t *buf = malloc(need);
    assert_non_null(buf);
    for (int m = 0; m < 3; m++)
        for (int e = 0; e < 5; e++) {
            kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
            o.io_mode = m;
            o.chunk_bytes = 16384;
            o.sink = KVX_SINK_HOST;
            o.host_buf = buf;
            o.host_buf_bytes = need;
            fault_install();
            kvx_warmup_report rep;
            assert_int_equal(kvx_warmup_run(&rep, &s, 1, &o), 0);
            kvx_warmup_report_free(&rep);
            long total = fault_calls;
            for (long k = 1; k <= total + 1; k++) {
                fault_reset(k, e < 4 ? errs[e] : EIO, e < 4 ? FAULT_ERRNO : FAULT_SHORT);
                memset(buf, 0xA5, need);
                int rc = kvx_warmup_run(&rep, &s, 1, &o);
                if (rc > 0) fail_msg("warmup mode %d err %d call %ld: rc %d", m, e, k, rc);
                if (rc) continue;
                assert_int_equal(rep.pages + rep.io_failures + rep.crc_failures, IO_BASE_N);
                uint64_t off = 0;
                size_t fi = 0;
                for (uint32_t i = 0; i < IO_BASE_N; i++) {
                    kvx_entry en;
                    assert_int_equal(kvx_shard_entry(&en, s, i), 0);
                    off = (off + 255) & ~(uint64_t)255;
                    int failed = 0;
                    for (size_t q = 0; q < rep.n_failures; q++) failed |= rep.failures[q].entry == i;
                    if (!failed && !io_page_ok(buf + off, 7, i, en.bytes))
                        fail_msg("warmup mode %d err %d call %ld: entry %u wrong in the sink", m, e, k, i);
                    fi += failed;
                    off += en.bytes;
                }
                assert_int_equal(fi, rep.n_failures);
                kvx_warmup_report_free(&rep);
            }
            fault_uninstall();
        }
    free(buf);
    kvx_shard_close(s);
    assert_int_equal(io_count_fds(), fd0);
    kvx_pool_destroy(p);
}

/* PROMISE: IO-3 */
static void test_flip_each_page(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    kvx_pool *p = io_pool(4 << 20);
    kvx_fetch *fs[3];
    for (int m = 0; m < 3; m++) fs[m] = io_fetch(p, modes[m], 3, mode_flags[m], 0);
    kvx_fetch_req r[IO_BASE_N];
    kvx_fetch_result res[IO_BASE_N];
    size_t n = io_every_page(r, s);
    for (uint32_t k = 0; k < IO_BASE_N; k += 3) {
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, s, k), 0);
        uint64_t at = e.offset + (k * 131u) % e.bytes;
        assert_int_equal(io_flip_byte(path, at, 0x10), 0);
        for (int m = 0; m < 3; m++) {
            assert_int_equal(kvx_fetch_submit(fs[m], r, n), 0);
            assert_int_equal(kvx_fetch_wait(fs[m], res, n, -1), 0);
            io_check_trust(r, res, n, NULL);
            for (uint32_t i = 0; i < IO_BASE_N; i++)
                assert_int_equal(res[i].status, i == k ? KVX_EPAGECRC : 0);
        }
        assert_int_equal(io_flip_byte(path, at, 0x10), 0);
    }
    for (int m = 0; m < 3; m++) kvx_fetch_destroy(fs[m]);
    kvx_pool_destroy(p);
    kvx_shard_close(s);
}

typedef struct flipper {
    const char *path;
    kvx_shard *s;
    atomic_int stop;
    long flips;
} flipper;

/* Toggles one byte in each of a few pages, and back, as fast as it can:
 * a read sees the page whole or damaged, never a mix reported good. */
static void *flip_main(void *arg)
{
    flipper *fl = arg;
    int fd = open(fl->path, O_RDWR);
    if (fd < 0) return NULL;
    uint64_t offs[8];
    for (uint32_t k = 0; k < 8; k++) {
        kvx_entry e;
        kvx_shard_entry(&e, fl->s, k * 5);
        offs[k] = e.offset + (e.bytes * (k + 1)) / 9;
    }
    while (!atomic_load(&fl->stop)) {
        for (int k = 0; k < 8; k++) {
            uint8_t b;
            if (pread(fd, &b, 1, (off_t)offs[k]) != 1) continue;
            b ^= 0x80;
            if (pwrite(fd, &b, 1, (off_t)offs[k]) != 1) continue;
            b ^= 0x80;
            if (pwrite(fd, &b, 1, (off_t)offs[k]) != 1) continue;
            fl->flips++;
        }
    }
    close(fd);
    return NULL;
}

static void test_flips_while_in_flight(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    flipper fl = {path, s, 0, 0};
    pthread_t tid;
    assert_int_equal(pthread_create(&tid, NULL, flip_main, &fl), 0);
    kvx_pool *p = io_pool(8 << 20);
    kvx_fetch_req r[IO_BASE_N];
    kvx_fetch_result res[IO_BASE_N];
    size_t n = io_every_page(r, s);
    size_t bad = 0;
    for (int m = 0; m < 3; m++) {
        kvx_fetch *f = io_fetch(p, modes[m], 4, mode_flags[m], (m == 2) ? 8192 : 0);
        for (int k = 0; k < 150; k++) {
            assert_int_equal(kvx_fetch_submit(f, r, n), 0);
            assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
            io_check_trust(r, res, n, NULL);
            for (size_t i = 0; i < n; i++) {
                if (res[i].status == KVX_EPAGECRC) {
                    bad++;
                    assert_int_equal(i % 5, 0); /* only the flipped pages */
                } else {
                    assert_int_equal(res[i].status, 0);
                }
            }
        }
        kvx_fetch_destroy(f);
    }
    /* warmup, host sink: a page that failed never reaches the sink */
    uint64_t need;
    assert_int_equal(kvx_warmup_sink_bytes(&need, &s, 1), 0);
    uint8_t *buf = malloc(need);
    assert_non_null(buf);
    for (int k = 0; k < 60; k++) {
        kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
        o.io_mode = k % 3;
        o.flags = k % 2 ? KVX_WARMUP_BUFFERED : 0;
        o.chunk_bytes = k % 4 < 2 ? 16384 : 0;
        o.sink = KVX_SINK_HOST;
        o.host_buf = buf;
        o.host_buf_bytes = need;
        memset(buf, 0xA5, need);
        kvx_warmup_report rep;
        assert_int_equal(kvx_warmup_run(&rep, &s, 1, &o), 0);
        assert_int_equal(rep.pages + rep.crc_failures, IO_BASE_N);
        uint64_t off = 0;
        for (uint32_t i = 0; i < IO_BASE_N; i++) {
            kvx_entry e;
            assert_int_equal(kvx_shard_entry(&e, s, i), 0);
            off = (off + 255) & ~(uint64_t)255;
            int failed = 0;
            for (size_t q = 0; q < rep.n_failures; q++) failed |= rep.failures[q].entry == i;
            if (failed) {
                for (uint64_t b = 0; b < e.bytes; b++)
                    if (buf[off + b] != 0xA5) fail_msg("warmup %d: failed entry %u reached the sink", k, i);
            } else if (!io_page_ok(buf + off, 7, i, e.bytes)) {
                fail_msg("warmup %d: entry %u delivered with wrong bytes", k, i);
            }
            off += e.bytes;
        }
        kvx_warmup_report_free(&rep);
    }
    atomic_store(&fl.stop, 1);
    pthread_join(tid, NULL);
    print_message("flips: %ld toggles, %zu pages caught by CRC\n", fl.flips, bad);
    free(buf);
    kvx_pool_destroy(p);
    kvx_shard_close(s);
}

#define NF 100

static void test_many_files(void **state)
{
    (void)state;
    static kvx_shard *sh[NF];
    static char paths[NF][512];
    for (int i = 0; i < NF; i++) {
        char name[32];
        snprintf(name, sizeof name, "mf%d.kvx", i);
        assert_int_equal(io_make_shard(paths[i], sizeof paths[i], io_tmpdir, name, (uint8_t)(10 + i), 4, 0), 0);
        assert_int_equal(kvx_shard_open(&sh[i], paths[i], 0), 0);
    }
    int fd0 = io_count_fds();
    kvx_pool *p = io_pool(8 << 20);
    for (int m = 0; m < 3; m++) {
        kvx_fetch *f = io_fetch(p, modes[m], 16, mode_flags[m], 0);
        kvx_fetch *g = NULL;
        assert_int_equal(kvx_fetch_create_peer(&g, f), 0);
        static kvx_fetch_req r[2][NF * 2];
        static kvx_fetch_result res[NF * 2];
        uint64_t x = 99 + (uint64_t)m;
        for (int round = 0; round < 24; round++) {
            kvx_fetch *h = round % 2 ? g : f;
            kvx_fetch_req *rq = r[round % 2];
            size_t n = 0;
            for (int k = 0; k < 70; k++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                int i = (int)((x >> 33) % NF);
                rq[n++] = (kvx_fetch_req){sh[i], (uint32_t)((x >> 20) % 4)};
            }
            assert_int_equal(kvx_fetch_submit(h, rq, n), 0);
            assert_int_equal(kvx_fetch_wait(h, res, n, -1), 0);
            for (size_t k = 0; k < n; k++) {
                int i = 0;
                while (sh[i] != rq[k].shard) i++;
                if (res[k].status != 0 || !io_page_ok(res[k].page, (uint32_t)(10 + i), rq[k].entry, res[k].bytes))
                    fail_msg("mode %d round %d: shard %d entry %u status %d", m, round, i, rq[k].entry, res[k].status);
            }
        }
        kvx_fetch_destroy(g);
        kvx_fetch_destroy(f);
        assert_int_equal(io_pool_free(p), 8 << 20);
    }
    kvx_pool_destroy(p);
    assert_int_equal(io_count_fds(), fd0);
    /* one warmup of every file */
    kvx_warmup_report rep;
    for (int m = 0; m < 3; m++) {
        kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
        o.io_mode = m;
        assert_int_equal(kvx_warmup_run(&rep, sh, NF, &o), 0);
        assert_int_equal(rep.pages, NF * 4);
        kvx_warmup_report_free(&rep);
    }
    assert_int_equal(io_count_fds(), fd0);
    for (int i = 0; i < NF; i++) kvx_shard_close(sh[i]);
}

/* test_request_lists: a request for an entry the shard does not have ended
 * KVX_EINVALID, the NULL shard's code, where kvx.h (and the Go binding's Err)
 * promise KVX_ENOTFOUND. Fixed in io/fetch.c. */
/* PROMISE: IO-3 */
static void test_request_lists(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    kvx_pool *p = io_pool(8 << 20);
    uint64_t free0 = io_pool_free(p);
    for (int m = 0; m < 3; m++) {
        kvx_fetch *f = io_fetch(p, modes[m], 3, mode_flags[m], 0);
        kvx_fetch_result res[64];
        size_t done = 99;
        /* no batch yet */
        assert_int_equal(kvx_fetch_wait(f, res, 0, 0), KVX_EINVALID);
        assert_int_equal(kvx_fetch_poll(f, &done), 0);
        assert_int_equal(done, 0);
        assert_int_equal(kvx_fetch_cancel(f), 0);
        kvx_fetch_release(f);
        /* NULL list, counts past UINT32_MAX: refused before anything is read */
        assert_int_equal(kvx_fetch_submit(f, NULL, 3), KVX_EINVALID);
        kvx_fetch_req one = {s, 0};
        assert_int_equal(kvx_fetch_submit(f, &one, (size_t)UINT32_MAX + 1), KVX_EINVALID);
        assert_int_equal(kvx_fetch_submit(NULL, &one, 1), KVX_EINVALID);
        assert_int_equal(kvx_fetch_wait(NULL, res, 1, 0), KVX_EINVALID);
        assert_int_equal(kvx_fetch_poll(NULL, &done), KVX_EINVALID);
        assert_int_equal(kvx_fetch_cancel(NULL), KVX_EINVALID);
        kvx_fetch_release(NULL);
        /* 100000 copies of one page: more slots than the pool has */
        {
            size_t big = 100000;
            kvx_fetch_req *br = malloc(big * sizeof *br);
            assert_non_null(br);
            for (size_t i = 0; i < big; i++) br[i] = (kvx_fetch_req){s, (uint32_t)(i % IO_BASE_N)};
            assert_int_equal(kvx_fetch_submit(f, br, big), KVX_ECAPACITY);
            assert_int_equal(io_pool_free(p), free0);
            free(br);
        }
        /* zero count: done at once, timeout 0 is fine */
        assert_int_equal(kvx_fetch_submit(f, NULL, 0), 0);
        assert_int_equal(kvx_fetch_wait(f, NULL, 0, 0), 0);
        assert_int_equal(kvx_fetch_wait(f, res, 1, 0), KVX_EINVALID);
        /* duplicates, out of range, NULL, overlapping */
        kvx_fetch_req r[12] = {{s, 3}, {s, 3}, {s, IO_BASE_N}, {NULL, 0}, {s, UINT32_MAX}, {s, 4},
                               {s, 3}, {s, 2}, {s, 4}, {s, IO_BASE_N - 1}, {s, IO_BASE_N - 1}, {s, 0}};
        assert_int_equal(kvx_fetch_submit(f, r, 12), 0);
        assert_int_equal(kvx_fetch_wait(f, res, 11, -1), KVX_EINVALID);
        assert_int_equal(kvx_fetch_wait(f, NULL, 12, -1), KVX_EINVALID);
        assert_int_equal(kvx_fetch_wait(f, res, 12, -1), 0);
        io_check_trust(r, res, 12, NULL);
        for (int i = 0; i < 12; i++) {
            if (i == 2 || i == 4) {
                /* kvx.h: KVX_ENOTFOUND (no such entry), not the NULL shard's KVX_EINVALID */
                assert_int_equal(res[i].status, KVX_ENOTFOUND);
                assert_null(res[i].page);
            } else if (i == 3) {
                assert_int_equal(res[i].status, KVX_EINVALID);
            } else {
                assert_int_equal(res[i].status, 0);
            }
        }
        assert_ptr_not_equal(res[0].page, res[1].page); /* each request its own bytes */
        /* release before wait, many times */
        for (int k = 0; k < 10; k++) {
            kvx_fetch_req all[IO_BASE_N];
            size_t n = io_every_page(all, s);
            assert_int_equal(kvx_fetch_submit(f, all, n), 0);
            kvx_fetch_release(f);
            assert_int_equal(io_pool_free(p), free0);
        }
        /* cancel right after submit, then reuse */
        for (int k = 0; k < 10; k++) {
            kvx_fetch_req all[IO_BASE_N];
            kvx_fetch_result ar[IO_BASE_N];
            size_t n = io_every_page(all, s);
            assert_int_equal(kvx_fetch_submit(f, all, n), 0);
            assert_int_equal(kvx_fetch_cancel(f), 0);
            assert_int_equal(kvx_fetch_cancel(f), 0);
            assert_int_equal(kvx_fetch_wait(f, ar, n, -1), 0);
            io_check_trust(all, ar, n, NULL);
            for (size_t i = 0; i < n; i++) assert_true(ar[i].status == 0 || ar[i].status == KVX_ECANCELED);
            assert_int_equal(kvx_fetch_submit(f, all, n), 0);
            assert_int_equal(kvx_fetch_wait(f, ar, n, -1), 0);
            for (size_t i = 0; i < n; i++) assert_int_equal(ar[i].status, 0);
            io_check_trust(all, ar, n, NULL);
        }
        kvx_fetch_destroy(f);
        assert_int_equal(io_pool_free(p), free0);
    }
    kvx_pool_destroy(p);
    kvx_shard_close(s);
}

static void test_shard_closed_inflight(void **state)
{
    (void)state;
    kvx_pool *p = io_pool(4 << 20);
    for (int m = 0; m < 3; m++) {
        char path[512];
        kvx_shard *s = io_fresh(path, sizeof path);
        kvx_fetch *f = io_fetch(p, modes[m], 2, mode_flags[m], 4096);
        kvx_fetch_req r[IO_BASE_N];
        kvx_fetch_result res[IO_BASE_N];
        size_t n = io_every_page(r, s);
        assert_int_equal(kvx_fetch_submit(f, r, n), 0);
        kvx_shard_close(s); /* the batch holds its own references */
        assert_int_equal(unlink(path), 0);
        /* driven by poll alone, then wait(0) */
        size_t done = 0;
        double t0 = io_now();
        while (done < n) {
            assert_int_equal(kvx_fetch_poll(f, &done), 0);
            if (io_now() - t0 > 30) fail_msg("mode %d: poll made no progress (%zu of %zu)", m, done, n);
        }
        assert_int_equal(kvx_fetch_wait(f, res, n, 0), 0);
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(res[i].status, 0);
            assert_true(io_page_ok(res[i].page, 7, (uint32_t)i, res[i].bytes));
        }
        kvx_fetch_destroy(f);
    }
    kvx_pool_destroy(p);
}

static ssize_t slow_pread(int fd, void *buf, size_t len, off_t off)
{
    usleep(100 * 1000);
    return pread(fd, buf, len, off);
}

static void test_slow_reads_bounded(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    kvx_pool *p = io_pool(4 << 20);
    kvx_fetch *f = io_fetch(p, KVX_IO_PREAD, 4, 0, 4096); /* 40 reads of 100 ms on 2 workers */
    kvx_fetch_req r[IO_BASE_N];
    kvx_fetch_result res[IO_BASE_N];
    size_t n = io_every_page(r, s);
    kvx_os.pread = slow_pread;
    for (int k = 0; k < 3; k++) {
        assert_int_equal(kvx_fetch_submit(f, r, n), 0);
        double t0 = io_now();
        assert_int_equal(kvx_fetch_wait(f, res, n, 10), -ETIMEDOUT);
        assert_int_equal(kvx_fetch_wait(f, res, n, 0), -ETIMEDOUT);
        double t1 = io_now();
        if (t1 - t0 > 1.0) fail_msg("wait(10 ms) took %.2f s", t1 - t0);
        if (k == 0) {
            assert_int_equal(kvx_fetch_cancel(f), 0);
            /* the longest timeout: its milliseconds left once rounded up
             * past INT_MAX (an int overflow; UBSan) */
            assert_int_equal(kvx_fetch_wait(f, res, n, INT_MAX), 0);
            io_check_trust(r, res, n, NULL);
        } else if (k == 1) {
            kvx_fetch_release(f);
        }
        double t2 = io_now();
        /* generous: two reads in flight end within 0.2 s */
        if (t2 - t1 > 2.0) fail_msg("round %d: cancel or release took %.2f s", k, t2 - t1);
    }
    kvx_fetch_destroy(f); /* k == 2: destroy with the batch in flight */
    double t3 = io_now();
    kvx_os_reset();
    assert_int_equal(io_pool_free(p), 4 << 20);
    kvx_pool_destroy(p);
    /* warmup on the pread workers */
    kvx_os.pread = slow_pread;
    kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
    o.io_mode = KVX_IO_PREAD;
    o.chunk_bytes = 4096;
    o.queue_depth = 2;
    kvx_warmup *w = NULL;
    assert_int_equal(kvx_warmup_start(&w, &s, 1, &o), 0);
    kvx_warmup_report rep;
    double t4 = io_now();
    assert_int_equal(kvx_warmup_wait(&rep, w, 20), -ETIMEDOUT);
    assert_int_equal(kvx_warmup_wait(&rep, w, 0), -ETIMEDOUT);
    if (io_now() - t4 > 1.0) fail_msg("kvx_warmup_wait(20 ms) took %.2f s", io_now() - t4);
    assert_int_equal(kvx_warmup_cancel(w), 0);
    double t5 = io_now();
    assert_int_equal(kvx_warmup_wait(&rep, w, -1), 0);
    if (io_now() - t5 > 3.0) fail_msg("cancelled warmup took %.2f s to end", io_now() - t5);
    assert_int_equal(rep.canceled, 1);
    assert_true(rep.pages < IO_BASE_N);
    kvx_warmup_report_free(&rep);
    kvx_warmup_destroy(w);
    assert_int_equal(kvx_warmup_start(&w, &s, 1, &o), 0);
    double t6 = io_now();
    kvx_warmup_destroy(w);
    if (io_now() - t6 > 3.0) fail_msg("kvx_warmup_destroy of a running warmup took %.2f s", io_now() - t6);
    kvx_os_reset();
    (void)t3;
    kvx_shard_close(s);
}

static int no_direct_open(const char *path, int flags, mode_t mode)
{
    if (flags & O_DIRECT) {
        errno = EINVAL; /* as tmpfs and friends answer */
        return -1;
    }
    return open(path, flags, mode);
}

/* test_direct_of_last_batch: kvx_fetch_direct answered whether any file the
 * queue ever opened used O_DIRECT, not (as kvx.h says) whether the last batch
 * did: a batch of files that cannot be read O_DIRECT after one that could
 * still said 1. Fixed in io/fetch.c (the handle records it at submit). */
/* PROMISE: IO-6 */
static void test_direct_of_last_batch(void **state)
{
    (void)state;
    char pa[512], pb[512];
    kvx_shard *a = io_fresh(pa, sizeof pa), *b = io_fresh(pb, sizeof pb);
    kvx_pool *p = io_pool(4 << 20);
    kvx_fetch *f = io_fetch(p, KVX_IO_URING, 4, 0, 0);
    kvx_fetch_req r[IO_BASE_N];
    kvx_fetch_result res[IO_BASE_N];
    size_t n = io_every_page(r, a);
    assert_int_equal(kvx_fetch_submit(f, r, n), 0);
    assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
    io_check_trust(r, res, n, NULL);
    if (!kvx_fetch_direct(f)) { /* no O_DIRECT on this file system */
        kvx_fetch_destroy(f);
        kvx_pool_destroy(p);
        kvx_shard_close(a);
        kvx_shard_close(b);
        skip();
    }
    /* b cannot be opened O_DIRECT: its batch is buffered */
    kvx_os.open = no_direct_open;
    n = io_every_page(r, b);
    assert_int_equal(kvx_fetch_submit(f, r, n), 0);
    assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
    kvx_os_reset();
    io_check_trust(r, res, n, NULL);
    for (size_t i = 0; i < n; i++) assert_int_equal(res[i].status, 0);
    /* kvx.h: "1 when O_DIRECT reads were used for at least one file of the last batch" */
    assert_int_equal(kvx_fetch_direct(f), 0);
    n = io_every_page(r, a);
    assert_int_equal(kvx_fetch_submit(f, r, n), 0);
    assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
    assert_int_equal(kvx_fetch_direct(f), 1);
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);
    kvx_shard_close(a);
    kvx_shard_close(b);
}

/* PROMISE: IO-14 */
static void test_peer_misuse(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    kvx_pool *p = io_pool(4 << 20);
    kvx_fetch *peer = (kvx_fetch *)0x1;
    assert_int_equal(kvx_fetch_create_peer(NULL, NULL), KVX_EINVALID);
    assert_int_equal(kvx_fetch_create_peer(&peer, NULL), KVX_EINVALID);
    assert_null(peer);
    for (int m = 0; m < 3; m++) {
        kvx_fetch *a = io_fetch(p, modes[m], 2, mode_flags[m], 4096);
        kvx_fetch *b = NULL, *c = NULL;
        assert_int_equal(kvx_fetch_create_peer(&b, a), 0);
        assert_int_equal(kvx_fetch_create_peer(&c, b), 0); /* a peer of a peer */
        kvx_fetch_req r[IO_BASE_N];
        kvx_fetch_result ra[IO_BASE_N], rb[IO_BASE_N], rc_[IO_BASE_N];
        size_t n = io_every_page(r, s);
        assert_int_equal(kvx_fetch_submit(a, r, n), 0);
        assert_int_equal(kvx_fetch_submit(b, r, n), 0);
        assert_int_equal(kvx_fetch_submit(c, r, n), 0);
        /* the first handle goes while both peers' batches are in flight */
        kvx_fetch_destroy(a);
        assert_int_equal(kvx_fetch_cancel(c), 0);
        assert_int_equal(kvx_fetch_wait(b, rb, n, -1), 0);
        assert_int_equal(kvx_fetch_wait(c, rc_, n, -1), 0);
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(rb[i].status, 0);
            assert_true(rc_[i].status == 0 || rc_[i].status == KVX_ECANCELED);
        }
        io_check_trust(r, rb, n, NULL);
        io_check_trust(r, rc_, n, NULL);
        /* b's next batch while c's is still unreleased */
        assert_int_equal(kvx_fetch_submit(b, r, n), 0);
        kvx_fetch_destroy(c);
        assert_int_equal(kvx_fetch_wait(b, rb, n, -1), 0);
        for (size_t i = 0; i < n; i++) assert_int_equal(rb[i].status, 0);
        io_check_trust(r, rb, n, NULL);
        kvx_fetch_destroy(b);
        (void)ra;
        assert_int_equal(io_pool_free(p), 4 << 20);
    }
    kvx_pool_destroy(p);
    kvx_shard_close(s);
}

static void test_no_fd_leak(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    int fd0 = io_count_fds();
    for (int k = 0; k < 20; k++) {
        kvx_pool *p = io_pool(1 << 20);
        for (int m = 0; m < 3; m++) {
            kvx_fetch *f = io_fetch(p, modes[m], 2, mode_flags[m], 0);
            kvx_fetch *g = NULL;
            assert_int_equal(kvx_fetch_create_peer(&g, f), 0);
            kvx_fetch_req r[IO_BASE_N];
            kvx_fetch_result res[IO_BASE_N];
            size_t n = io_every_page(r, s);
            assert_int_equal(kvx_fetch_submit(f, r, n), 0);
            assert_int_equal(kvx_fetch_submit(g, r, 3), 0);
            if (k % 2) assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
            kvx_fetch_destroy(f);
            kvx_fetch_destroy(g);
        }
        kvx_warmup_report rep;
        kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
        o.io_mode = k % 2 ? KVX_IO_URING : KVX_IO_PREAD;
        o.chunk_bytes = 65536;
        assert_int_equal(kvx_warmup_run(&rep, &s, 1, &o), 0);
        assert_int_equal(rep.pages, IO_BASE_N);
        kvx_warmup_report_free(&rep);
        kvx_pool_destroy(p);
    }
    assert_int_equal(io_count_fds(), fd0);
    kvx_shard_close(s);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_file_changed_inflight, os_reset),
        cmocka_unit_test_setup(test_os_faults_every_call, os_reset),
        cmocka_unit_test_setup(test_flip_each_page, os_reset),
        cmocka_unit_test_setup(test_flips_while_in_flight, os_reset),
        cmocka_unit_test_setup(test_many_files, os_reset),
        cmocka_unit_test_setup(test_request_lists, os_reset),
        cmocka_unit_test_setup(test_shard_closed_inflight, os_reset),
        cmocka_unit_test_setup(test_peer_misuse, os_reset),
        cmocka_unit_test_setup(test_no_fd_leak, os_reset),
        cmocka_unit_test_setup(test_direct_of_last_batch, os_reset),
        cmocka_unit_test_setup(test_slow_reads_bounded, os_reset),
    };
    return cmocka_run_group_tests_name("io/trust", tests, io_base_setup, io_base_teardown);
}
