/*
 * ioq.c - io/ioq.c, the io_uring queue: its completion filter
 * (kvx_os.uring_result) turned at every position, or at random, into
 * -EAGAIN, -EINTR, short reads, 0, -EIO, -EINVAL, too large a result;
 * always -EAGAIN (bounded retries) or always 0; cold pages read buffered;
 * nothing written past a batch's slots.
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

static int filt_at, filt_calls, filt_kind;

static int filter(int res, size_t requested)
{
    int n = filt_calls++;
    if (n != filt_at) return res;
    switch (filt_kind) {
    case 0: return -EAGAIN;
    case 1: return -EINTR;
    case 2: return res > 1 ? 1 : res;
    case 3: return 0;
    case 4: return -EIO;
    case 5: return -EINVAL;
    default: return (int)requested + 4096; /* more than asked */
    }
}

/* test_filter_random, test_filter_every_position (0 once),
 * test_warmup_truncated_and_faults: under O_DIRECT a short read restarts at
 * the aligned point below, and a re-read that brought nothing new (or a
 * single 0 result) was taken for the end of the file, so two short reads in a
 * row mid-file ended an intact file's pages KVX_ETRUNC ("truncated after
 * open") in fetch and warmup. Fixed in io/ioq.c: the end of file is checked
 * with fstat; where the file has bytes past what the run got, the read is
 * tried again (bounded). */
/* PROMISE: IO-5 */
static void test_filter_every_position(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    kvx_pool *p = io_pool(4 << 20);
    kvx_fetch_req r[IO_BASE_N];
    kvx_fetch_result res[IO_BASE_N];
    size_t n = io_every_page(r, s);
    for (int m = 0; m < 2; m++) {
        kvx_fetch *f = io_fetch(p, modes[m], 4, mode_flags[m], 16384);
        /* count the completions of a clean batch */
        filt_at = -1;
        filt_calls = 0;
        kvx_os.uring_result = filter;
        assert_int_equal(kvx_fetch_submit(f, r, n), 0);
        assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
        int total = filt_calls;
        assert_true(total > 0);
        for (int kind = 0; kind <= 6; kind++)
            for (int at = 0; at < total + 2; at++) {
                filt_at = at;
                filt_calls = 0;
                filt_kind = kind;
                assert_int_equal(kvx_fetch_submit(f, r, n), 0);
                assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
                size_t ok = 0;
                io_check_trust(r, res, n, &ok);
                for (size_t i = 0; i < n; i++) {
                    int st = res[i].status;
                    if (st == 0) continue;
                    if (kind == 3)
                        assert_int_equal(st, KVX_ETRUNC);
                    else if (kind == 4)
                        assert_int_equal(st, -EIO);
                    else if (kind == 5 && m == 1)
                        assert_int_equal(st, -EINVAL); /* buffered: -EINVAL is the read's error */
                    else if (kind == 2 || kind == 6)
                        assert_true(st == KVX_ETRUNC || st == KVX_EPAGECRC);
                    else
                        fail_msg("kind %d at %d mode %d: page %zu status %d", kind, at, m, i, st);
                }
                /* transient faults, short reads and a lone 0 mid-file lose nothing */
                if (kind <= 3 || (kind == 5 && m == 0)) assert_int_equal(ok, n);
            }
        kvx_os_reset();
        kvx_fetch_destroy(f);
    }
    assert_int_equal(io_pool_free(p), 4 << 20);
    kvx_pool_destroy(p);
    kvx_shard_close(s);
}

static uint64_t rnd_state;

static int rnd_pct;

static uint32_t rnd(void)
{
    rnd_state = rnd_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rnd_state >> 33);
}

/* Faults drawn at random on a share of completions. */
static int random_filter(int res, size_t requested)
{
    if ((int)(rnd() % 100) >= rnd_pct) return res;
    switch (rnd() % 5) {
    case 0: return -EAGAIN;
    case 1: return -EINTR;
    case 2: return res > 1 ? (int)(1 + rnd() % (uint32_t)(res - 1)) : res;
    case 3: return res > 4096 ? (int)(4096 * (1 + rnd() % (uint32_t)(res / 4096))) - 1 : res;
    default: return (int)requested; /* all of it, as asked */
    }
}

/* test_filter_random, test_filter_every_position (0 once),
 * test_warmup_truncated_and_faults: under O_DIRECT a short read restarts at
 * the aligned point below, and a re-read that brought nothing new (or a
 * single 0 result) was taken for the end of the file, so two short reads in a
 * row mid-file ended an intact file's pages KVX_ETRUNC ("truncated after
 * open") in fetch and warmup. Fixed in io/ioq.c: the end of file is checked
 * with fstat; where the file has bytes past what the run got, the read is
 * tried again (bounded). */
/* PROMISE: IO-5 */
static void test_filter_random(void **state)
{
    (void)state;
    long n_trunc = 0;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    kvx_pool *p = io_pool(4 << 20);
    kvx_fetch_req r[IO_BASE_N * 2];
    kvx_fetch_result res[IO_BASE_N * 2];
    alarm(300);
    for (int m = 0; m < 2; m++) {
        kvx_fetch *f = io_fetch(p, modes[m], 5, mode_flags[m], 0);
        kvx_fetch *g = NULL;
        assert_int_equal(kvx_fetch_create_peer(&g, f), 0);
        rnd_state = 7 + (uint64_t)m;
        kvx_os.uring_result = random_filter;
        for (int it = 0; it < 300; it++) {
            rnd_pct = 10 + it % 60;
            size_t n = 0;
            uint32_t k = rnd() % 3;
            for (uint32_t i = 0; i < IO_BASE_N; i++) {
                if (rnd() % 4 == 0) continue;
                r[n++] = (kvx_fetch_req){s, i};
                if (rnd() % 7 == 0) r[n++] = (kvx_fetch_req){s, (i + k) % IO_BASE_N};
            }
            kvx_fetch *h = it % 2 ? g : f;
            assert_int_equal(kvx_fetch_submit(h, r, n), 0);
            if (it % 11 == 0) assert_int_equal(kvx_fetch_cancel(h), 0);
            assert_int_equal(kvx_fetch_wait(h, res, n, -1), 0);
            io_check_trust(r, res, n, NULL);
            for (size_t i = 0; i < n; i++) {
                int st = res[i].status;
                if (st == 0 || st == KVX_ECANCELED) continue;
                /* the file is intact: never "truncated" (two short O_DIRECT reads in
                 * a row used to end the run as if at the end of the file) */
                if (st == KVX_ETRUNC) {
                    n_trunc++;
                    continue;
                }
                if (st == -EAGAIN || st == -EINTR) continue; /* retries ran out */
                fail_msg("mode %d it %d: page %zu status %d", m, it, i, st);
            }
        }
        kvx_os_reset();
        kvx_fetch_destroy(g);
        kvx_fetch_destroy(f);
        assert_int_equal(io_pool_free(p), 4 << 20);
    }
    alarm(0);
    if (n_trunc) fail_msg("random filter: %ld pages KVX_ETRUNC on an intact file", n_trunc);
    kvx_pool_destroy(p);
    kvx_shard_close(s);
}

static int always_eagain(int res, size_t requested)
{
    (void)res, (void)requested;
    return -EAGAIN;
}

static int always_zero(int res, size_t requested)
{
    (void)res, (void)requested;
    return 0;
}

/* PROMISE: IO-5 */
static void test_filter_always(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    kvx_pool *p = io_pool(4 << 20);
    kvx_fetch_req r[IO_BASE_N];
    kvx_fetch_result res[IO_BASE_N];
    size_t n = io_every_page(r, s);
    alarm(120); /* a hang is a failure */
    for (int m = 0; m < 2; m++) {
        kvx_fetch *f = io_fetch(p, modes[m], 4, mode_flags[m], 0);
        kvx_os.uring_result = always_eagain;
        assert_int_equal(kvx_fetch_submit(f, r, n), 0);
        assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
        for (size_t i = 0; i < n; i++) assert_int_equal(res[i].status, -EAGAIN);
        kvx_os.uring_result = always_zero;
        assert_int_equal(kvx_fetch_submit(f, r, n), 0);
        assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
        for (size_t i = 0; i < n; i++) assert_int_equal(res[i].status, KVX_ETRUNC);
        kvx_os_reset();
        kvx_fetch_destroy(f);
    }
    alarm(0);
    kvx_pool_destroy(p);
    kvx_shard_close(s);
}

static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    fdatasync(fd);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
}

static int n_eagain;

static int count_eagain(int res, size_t requested)
{
    (void)requested;
    if (res == -EAGAIN) n_eagain++;
    return res;
}

static void test_cold_buffered_uring(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    kvx_pool *p = io_pool(4 << 20);
    kvx_fetch *f = io_fetch(p, KVX_IO_URING, 8, KVX_FETCH_BUFFERED, 4096);
    kvx_fetch_req r[IO_BASE_N];
    kvx_fetch_result res[IO_BASE_N];
    size_t n = io_every_page(r, s);
    size_t bad = 0;
    for (int round = 0; round < 20; round++) {
        drop_cache(path);
        kvx_os.uring_result = count_eagain;
        assert_int_equal(kvx_fetch_submit(f, r, n), 0);
        assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
        size_t ok = 0;
        io_check_trust(r, res, n, &ok);
        bad += n - ok;
    }
    kvx_os_reset();
    print_message("cold buffered: %d -EAGAIN completions\n", n_eagain);
    if (bad) fail_msg("%zu cold pages failed (status e.g. %d) on an intact file", bad, res[0].status);
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);
    kvx_shard_close(s);
}

/* PROMISE: IO-4 */
static void test_no_write_past_slots(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    kvx_entry last;
    assert_int_equal(kvx_shard_entry(&last, s, IO_BASE_N - 1), 0);
    kvx_pool *p = io_pool(2 << 20);
    kvx_pool_info info;
    assert_int_equal(kvx_pool_get_info(&info, p), 0);
    uint8_t *base = info.base;
    for (int m = 0; m < 3; m++)
        for (int faults = 0; faults < 2; faults++) {
            kvx_fetch *f = io_fetch(p, modes[m], 4, mode_flags[m], m == 1 ? 4096 : 0);
            memset(base, 0xCD, info.bytes);
            /* the last page alone, then every page: a slot of exactly its length */
            kvx_fetch_req one = {s, IO_BASE_N - 1};
            kvx_fetch_result r1;
            rnd_state = 3;
            rnd_pct = 40;
            if (faults) kvx_os.uring_result = random_filter;
            assert_int_equal(kvx_fetch_submit(f, &one, 1), 0);
            assert_int_equal(kvx_fetch_wait(f, &r1, 1, -1), 0);
            assert_int_equal(r1.status, 0);
            assert_ptr_equal(r1.page, base);
            uint64_t end = (last.bytes + 4095) & ~(uint64_t)4095;
            for (uint64_t k = end; k < info.bytes; k++)
                if (base[k] != 0xCD) fail_msg("mode %d: byte %llu past the slot written", m, (unsigned long long)k);
            kvx_fetch_req r[IO_BASE_N];
            kvx_fetch_result res[IO_BASE_N];
            size_t n = io_every_page(r, s);
            memset(base, 0xCD, info.bytes);
            assert_int_equal(kvx_fetch_submit(f, r, n), 0);
            assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
            kvx_os_reset();
            io_check_trust(r, res, n, NULL);
            uint64_t hi = 0;
            for (size_t i = 0; i < n; i++) {
                uint64_t e = (uint64_t)((uint8_t *)res[i].page - base) + res[i].bytes;
                e = (e + 4095) & ~(uint64_t)4095;
                if (e > hi) hi = e;
            }
            for (uint64_t k = hi; k < info.bytes; k++)
                if (base[k] != 0xCD) fail_msg("mode %d: byte %llu past the slots written", m, (unsigned long long)k);
            kvx_fetch_destroy(f);
        }
    kvx_pool_destroy(p);
    kvx_shard_close(s);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_filter_every_position, os_reset),
        cmocka_unit_test_setup(test_filter_random, os_reset),
        cmocka_unit_test_setup(test_filter_always, os_reset),
        cmocka_unit_test_setup(test_cold_buffered_uring, os_reset),
        cmocka_unit_test_setup(test_no_write_past_slots, os_reset),
    };
    return cmocka_run_group_tests_name("io/ioq", tests, io_base_setup, io_base_teardown);
}
