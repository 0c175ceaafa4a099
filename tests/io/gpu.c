/*
 * tests/io/gpu.c - the CPU side of the GPU path, without a GPU: io/'s
 * device seam (kvx_gpu_dev) replaced by tests/lib/gpu_fake.h, a device in
 * host memory whose asynchronous work runs only when something waits for
 * it, whose kernels are the host builds of the same math, and whose calls
 * fail on demand. Runs in builds with and without CUDA.
 *
 * What it proves: every GPU warmup path (STAGING, STAGING_GPU_CRC, MAPPED;
 * io_uring and pread) delivers each page's exact bytes to its place with a
 * page table of exactly those addresses; a damaged page is never
 * delivered (slot 0, its arena range untouched, named KVX_EPAGECRC) on any
 * path; a refused registration, a failed mapping or a device without room
 * for landing buffers falls back to staging and says why; a device call
 * failing mid-warmup ends it with that error, nothing left registered or
 * allocated; the options and stage timers; the device spectral API's
 * checks and its upload and launch, against kvx_spectral_apply.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/os.h"
#include "lib/gpu_fake.h"
#include "io/warmup.h"
#include "lib/io.h"
#include "kvx.h"

#define N 40
#define SHARD_ID 5

static char path[512];
static kvx_shard *sh;

static int group_setup(void **state)
{
    (void)state;
    if (io_mkdtemp("io_gpu")) return -1;
    if (io_make_shard(path, sizeof path, io_tmpdir, "g.kvx", SHARD_ID, N, 0)) return -1;
    return kvx_shard_open(&sh, path, 0);
}

static int group_teardown(void **state)
{
    (void)state;
    kvx_shard_close(sh);
    io_rm_rf(io_tmpdir);
    return 0;
}

static int setup(void **state)
{
    (void)state;
    fake_install();
    kvx_wgpu_window_bytes = 16384; /* many windows through the three slots */
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fake_uninstall();
    kvx_os_reset();
    kvx_wgpu_window_bytes = (uint64_t)64 << 20;
    return 0;
}

typedef struct run {
    kvx_gpu *g;
    uint64_t arena;
    kvx_warmup *w;
    kvx_warmup_report rep;
    kvx_warmup_stages st;
    int rc;
} run;

/* A GPU warmup of s on a fresh fake device whose arena is filled with 0xA5
 * first; the warmup is kept (w) for its device pages. */
static void gpu_warmup(run *out, kvx_shard *s, int gpu_path, int io_mode, uint32_t flags)
{
    memset(out, 0, sizeof *out);
    uint64_t need;
    assert_int_equal(kvx_warmup_sink_bytes(&need, &s, 1), 0);
    kvx_gpu_options go = KVX_GPU_OPTIONS_INIT;
    go.arena_bytes = need + 8 * N + 4096;
    go.streams = 3;
    assert_int_equal(kvx_gpu_create(&out->g, &go), 0);
    assert_int_equal(kvx_gpu_reserve(&out->arena, out->g, 1), 0);
    kvx_gpu_reset(out->g);
    memset((void *)(uintptr_t)out->arena, 0xA5, go.arena_bytes);
    kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
    o.sink = KVX_SINK_GPU;
    o.gpu = out->g;
    o.io_mode = io_mode;
    o.flags = flags;
    o.chunk_bytes = 16384;
    o.queue_depth = 3;
    o.threads = 2;
    o.gpu_path = gpu_path;
    out->rc = kvx_warmup_start(&out->w, &s, 1, &o);
    if (out->rc) return;
    out->rc = kvx_warmup_wait(&out->rep, out->w, -1);
    out->st.version = KVX_WARMUP_STAGES_VERSION;
    assert_int_equal(kvx_warmup_get_stages(&out->st, out->w), 0);
}

static void run_done(run *r)
{
    kvx_warmup_report_free(&r->rep);
    kvx_warmup_destroy(r->w);
    kvx_gpu_destroy(r->g);
    assert_int_equal(fake.live_allocs, 0);
    assert_int_equal(fake.live_regs, 0);
    assert_int_equal(fake.live_streams, 0);
    if (fake.violations) fail_msg("fake GPU: %s", fake.last_violation);
}

/* Every page but `bad` (-1: none) delivered byte for byte at its place,
 * the page table equal to the device pages; `bad` not delivered: slot 0,
 * its arena range still 0xA5, named with KVX_EPAGECRC. */
static void check_delivery(run *r, kvx_shard *s, uint32_t shard_id, int bad)
{
    assert_int_equal(r->rc, 0);
    const uint64_t *dp;
    size_t dn;
    assert_int_equal(kvx_warmup_device_pages(&dp, &dn, r->w), 0);
    assert_int_equal(dn, N);
    assert_int_equal(r->rep.pages, bad >= 0 ? N - 1 : N);
    assert_int_equal(r->rep.crc_failures, bad >= 0 ? 1 : 0);
    assert_int_equal(r->rep.io_failures, 0);
    assert_memory_equal((const void *)(uintptr_t)r->rep.gpu_page_table, dp, 8 * dn);
    uint64_t off = 0;
    for (uint32_t i = 0; i < N; i++) {
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, s, i), 0);
        off = (off + 255) & ~(uint64_t)255;
        const uint8_t *at = (const uint8_t *)(uintptr_t)(r->arena + off);
        if ((int)i == bad) {
            assert_int_equal(dp[i], 0);
            for (uint64_t k = 0; k < e.bytes; k++)
                if (at[k] != 0xA5)
                    fail_msg("entry %u: a bad page's bytes reached the arena at %llu", i, (unsigned long long)k);
            assert_int_equal(r->rep.n_failures, 1);
            assert_int_equal(r->rep.failures[0].entry, i);
            assert_int_equal(r->rep.failures[0].code, KVX_EPAGECRC);
        } else {
            assert_int_equal(dp[i], r->arena + off);
            if (!io_page_ok(at, shard_id, i, e.bytes)) fail_msg("entry %u: wrong bytes in the arena", i);
        }
        off += e.bytes;
    }
}

static const int io_modes[2] = {KVX_IO_URING, KVX_IO_PREAD};
static const int paths[3] = {KVX_GPU_PATH_STAGING, KVX_GPU_PATH_STAGING_GPU_CRC, KVX_GPU_PATH_MAPPED};

/* PROMISE: IO-17 */
static void test_every_path_delivers(void **state)
{
    (void)state;
    uint64_t total = 0;
    for (uint32_t i = 0; i < N; i++) {
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, sh, i), 0);
        total += e.bytes;
    }
    for (int p = 0; p < 3; p++)
        for (int m = 0; m < 2; m++) {
            fake_install();
            run r;
            gpu_warmup(&r, sh, paths[p], io_modes[m], 0);
            check_delivery(&r, sh, SHARD_ID, -1);
            assert_int_equal(r.st.gpu_path, paths[p]);
            assert_int_equal(r.st.fallback, 0);
            assert_string_equal(r.st.fallback_why, "");
            assert_int_equal(r.st.mapped_bytes + r.st.staged_bytes, total);
            if (paths[p] == KVX_GPU_PATH_MAPPED) {
                assert_int_equal(r.st.mapped_bytes, total); /* no CPU pass over the bytes */
                assert_true(fake.n_ro > 3);                 /* many windows, three slots */
                assert_true(r.st.register_s > 0);
                assert_true(r.st.crc_gpu_s > 0);
            } else {
                assert_int_equal(r.st.staged_bytes, total);
                assert_true(r.st.read_s > 0);
            }
            if (paths[p] == KVX_GPU_PATH_STAGING) {
                assert_int_equal(fake.n_crc, 0);
                assert_true(r.st.crc_cpu_s > 0);
            } else {
                assert_true(fake.n_crc > 0);
                assert_true(r.st.crc_cpu_s == 0);
            }
            assert_true(r.st.h2d_s > 0);
            assert_true(r.st.seconds > 0);
            assert_int_equal(r.st.lanes, 2);
            run_done(&r);
        }
}

/* A copy of the shard with one byte of entry `bad` flipped, opened whole. */
static kvx_shard *rotten_copy(char *p, size_t cap, uint32_t bad, const char *name)
{
    kvx_shard *s = NULL;
    assert_int_equal(io_open_copy(&s, p, cap, path, name), 0);
    kvx_entry e;
    assert_int_equal(kvx_shard_entry(&e, s, bad), 0);
    assert_int_equal(io_flip_byte(p, e.offset + e.bytes / 2, 0x40), 0);
    return s;
}

/* PROMISE: IO-11, IO-18 */
static void test_rotten_page_never_delivered(void **state)
{
    (void)state;
    char p2[512];
    const uint32_t bads[3] = {0, 17, N - 1};
    for (int b = 0; b < 3; b++) {
        kvx_shard *s = rotten_copy(p2, sizeof p2, bads[b], "rot.kvx");
        for (int p = 0; p < 3; p++)
            for (int m = 0; m < 2; m++) {
                fake_install();
                run r;
                gpu_warmup(&r, s, paths[p], io_modes[m], 0);
                check_delivery(&r, s, SHARD_ID, (int)bads[b]);
                run_done(&r);
            }
        kvx_shard_close(s);
        unlink(p2);
    }
}

/* PROMISE: IO-19 */
static void test_registration_refused_falls_back(void **state)
{
    (void)state;
    /* refused at the first window: all through staging, CPU CRC */
    for (int m = 0; m < 2; m++) {
        fake_install();
        fake.refuse_ro_after = 1;
        run r;
        gpu_warmup(&r, sh, KVX_GPU_PATH_MAPPED, io_modes[m], 0);
        check_delivery(&r, sh, SHARD_ID, -1);
        assert_int_equal(r.st.gpu_path, KVX_GPU_PATH_MAPPED);
        assert_int_equal(r.st.fallback, KVX_EMEMLOCK);
        assert_non_null(strstr(r.st.fallback_why, "read-only refused"));
        assert_int_equal(r.st.mapped_bytes, 0);
        assert_int_equal(fake.n_crc, 0);
        run_done(&r);
    }
    /* refused from the fourth window on: the first three mapped, the rest staged */
    char p2[512];
    kvx_shard *s = rotten_copy(p2, sizeof p2, N - 2, "rot2.kvx");
    fake_install();
    fake.refuse_ro_after = 4;
    run r;
    gpu_warmup(&r, s, KVX_GPU_PATH_MAPPED, KVX_IO_PREAD, 0);
    check_delivery(&r, s, SHARD_ID, N - 2); /* the damage is in the staged part: the CPU catches it */
    assert_int_equal(r.st.fallback, KVX_EMEMLOCK);
    assert_true(r.st.mapped_bytes > 0 && r.st.staged_bytes > 0);
    run_done(&r);
    kvx_shard_close(s);
    unlink(p2);
}

static int mmap_fails_after;
static void *mmap_file_fails(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (fd >= 0 && --mmap_fails_after < 0) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return mmap(addr, len, prot, flags, fd, off);
}

/* PROMISE: IO-19 */
static void test_mapping_or_memory_refused_falls_back(void **state)
{
    (void)state;
    /* the window's mmap fails (after two that worked) */
    fake_install();
    mmap_fails_after = 2;
    kvx_os.mmap = mmap_file_fails;
    run r;
    gpu_warmup(&r, sh, KVX_GPU_PATH_MAPPED, KVX_IO_URING, 0);
    kvx_os_reset();
    check_delivery(&r, sh, SHARD_ID, -1);
    assert_int_equal(r.st.fallback, -ENOMEM);
    assert_non_null(strstr(r.st.fallback_why, "mmap"));
    run_done(&r);
    /* a device with room for the arena only: no landing buffers, STAGING */
    for (int p = 1; p < 3; p++) {
        fake_install();
        uint64_t need;
        assert_int_equal(kvx_warmup_sink_bytes(&need, &sh, 1), 0);
        fake.mem_budget = (int64_t)(need + 8 * N + 4096 + 256);
        gpu_warmup(&r, sh, paths[p], KVX_IO_PREAD, 0);
        check_delivery(&r, sh, SHARD_ID, -1);
        assert_int_equal(r.st.gpu_path, KVX_GPU_PATH_STAGING);
        assert_int_equal(r.st.fallback, KVX_ECAPACITY);
        assert_non_null(strstr(r.st.fallback_why, "landing"));
        assert_int_equal(fake.n_crc, 0);
        run_done(&r);
    }
}

/* PROMISE: IO-20 */
static void test_device_failure_ends_warmup(void **state)
{
    (void)state;
    for (int p = 0; p < 3; p++)
        for (long k = 1; k <= 6; k++) {
            fake_install();
            fake.fail_h2d_at = k;
            run r;
            gpu_warmup(&r, sh, paths[p], KVX_IO_PREAD, 0);
            assert_int_equal(r.rc, -EIO);
            if (!strstr(kvx_last_error(), "injected")) fail_msg("path %d copy %ld: '%s'", p, k, kvx_last_error());
            run_done(&r); /* nothing registered, allocated or queued is left */
        }
    for (int p = 1; p < 3; p++) {
        fake_install();
        fake.fail_crc = 1;
        run r;
        gpu_warmup(&r, sh, paths[p], KVX_IO_URING, 0);
        assert_int_equal(r.rc, -EIO);
        run_done(&r);
    }
    /* the blocking form keeps the reason on the caller's thread too */
    fake_install();
    fake.fail_h2d_at = 1;
    uint64_t need;
    assert_int_equal(kvx_warmup_sink_bytes(&need, &sh, 1), 0);
    kvx_gpu_options go = KVX_GPU_OPTIONS_INIT;
    go.arena_bytes = need + 8 * N + 4096;
    kvx_gpu *g = NULL;
    assert_int_equal(kvx_gpu_create(&g, &go), 0);
    kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
    o.sink = KVX_SINK_GPU;
    o.gpu = g;
    o.gpu_path = KVX_GPU_PATH_MAPPED;
    kvx_warmup_report rep;
    assert_int_equal(kvx_warmup_run(&rep, &sh, 1, &o), -EIO);
    assert_non_null(strstr(kvx_last_error(), "injected"));
    kvx_gpu_destroy(g);
    assert_int_equal(fake.live_allocs, 0);
    assert_int_equal(fake.live_regs, 0);
}

/* PROMISE: IO-11 */
static void test_truncated_after_open(void **state)
{
    (void)state;
    char p2[512];
    for (int p = 0; p < 3; p++) {
        kvx_shard *s = NULL;
        assert_int_equal(io_open_copy(&s, p2, sizeof p2, path, "trunc.kvx"), 0);
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, s, N - 3), 0);
        assert_int_equal(truncate(p2, (off_t)(e.offset + 10)), 0); /* the last three pages gone */
        fake_install();
        run r;
        gpu_warmup(&r, s, paths[p], KVX_IO_PREAD, 0);
        assert_int_equal(r.rc, 0);
        assert_int_equal(r.rep.pages, N - 3);
        assert_int_equal(r.rep.io_failures, 3);
        const uint64_t *dp;
        size_t dn;
        assert_int_equal(kvx_warmup_device_pages(&dp, &dn, r.w), 0);
        for (uint32_t i = 0; i < N; i++) assert_true((dp[i] == 0) == (i >= N - 3));
        for (size_t f = 0; f < r.rep.n_failures; f++) assert_int_equal(r.rep.failures[f].code, KVX_ETRUNC);
        run_done(&r);
        kvx_shard_close(s);
        unlink(p2);
    }
}

/* The path AUTO picks, the options' checks, version 1 options, the stage
 * timers' getter. */
/* PROMISE: IO-23 */
static void test_options_and_stages(void **state)
{
    (void)state;
    run r;
    /* cached data (just written): AUTO maps it; io_uring asked: staging */
    gpu_warmup(&r, sh, KVX_GPU_PATH_AUTO, KVX_IO_AUTO, 0);
    assert_int_equal(r.rc, 0);
    assert_int_equal(r.st.gpu_path, KVX_GPU_PATH_MAPPED);
    run_done(&r);
    fake_install();
    gpu_warmup(&r, sh, KVX_GPU_PATH_AUTO, KVX_IO_URING, 0);
    assert_int_equal(r.st.gpu_path, KVX_GPU_PATH_STAGING);
    run_done(&r);
    /* NO_VERIFY on the GPU-CRC paths: delivered unchecked, as asked */
    fake_install();
    gpu_warmup(&r, sh, KVX_GPU_PATH_MAPPED, KVX_IO_PREAD, KVX_WARMUP_NO_VERIFY);
    check_delivery(&r, sh, SHARD_ID, -1);
    run_done(&r);
    assert_string_equal(kvx_gpu_path_name(KVX_GPU_PATH_MAPPED), "mapped");
    assert_string_equal(kvx_gpu_path_name(KVX_GPU_PATH_STAGING_GPU_CRC), "staging-gpu-crc");
    assert_string_equal(kvx_gpu_path_name(9), "unknown");

    kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
    kvx_warmup_report rep;
    o.threads = 65;
    assert_int_equal(kvx_warmup_run(&rep, &sh, 1, &o), KVX_EINVALID);
    o.threads = 0;
    o.gpu_path = 4;
    assert_int_equal(kvx_warmup_run(&rep, &sh, 1, &o), KVX_EINVALID);
    o.gpu_path = -1;
    assert_int_equal(kvx_warmup_run(&rep, &sh, 1, &o), KVX_EINVALID);
    o.version = 3;
    assert_int_equal(kvx_warmup_run(&rep, &sh, 1, &o), KVX_EVERSION);
    /* a version 1 caller: its struct ends before threads; what follows is
     * never read (here: junk that would be refused) */
    struct {
        kvx_warmup_options o;
        char junk[64];
    } v1;
    memset(&v1, 0xFF, sizeof v1);
    kvx_warmup_options d = KVX_WARMUP_OPTIONS_INIT;
    memcpy(&v1.o, &d, offsetof(kvx_warmup_options, threads));
    v1.o.version = 1;
    assert_int_equal(kvx_warmup_run(&rep, &sh, 1, &v1.o), 0);
    assert_int_equal(rep.pages, N);
    kvx_warmup_report_free(&rep);
    /* stages: the caller's version, and only once finished */
    kvx_warmup *w = NULL;
    kvx_warmup_options_init(&o);
    o.threads = 3;
    assert_int_equal(kvx_warmup_start(&w, &sh, 1, &o), 0);
    kvx_warmup_stages st;
    memset(&st, 0, sizeof st);
    assert_int_equal(kvx_warmup_get_stages(&st, w), KVX_EVERSION);
    st.version = KVX_WARMUP_STAGES_VERSION;
    int rc = kvx_warmup_get_stages(&st, w);
    assert_true(rc == 0 || rc == KVX_EBUSY);
    assert_int_equal(kvx_warmup_wait(&rep, w, -1), 0);
    assert_int_equal(kvx_warmup_get_stages(&st, w), 0);
    assert_int_equal(st.gpu_path, 0); /* not a GPU warmup */
    assert_int_equal(st.lanes, 3);
    assert_true(st.crc_cpu_s > 0 && st.seconds > 0);
    assert_int_equal(kvx_warmup_get_stages(NULL, w), KVX_EINVALID);
    kvx_warmup_report_free(&rep);
    kvx_warmup_destroy(w);
}

/* --- spectral steering on the (fake) device --- */

#define SD 96
#define SR 5
#define SL 3
#define SROWS 37
#define SSTRIDE 100

static float psi_all[2 * SL * SD * SR];
static const uint32_t ids2[2] = {4, 9};

static kvx_spectral bundle(void)
{
    for (size_t i = 0; i < sizeof psi_all / sizeof *psi_all; i++) psi_all[i] = (float)sin((double)i * 0.37) * 0.1f;
    kvx_spectral b = {2, 12, SL, SD, SR, ids2, psi_all};
    return b;
}

/* PROMISE: IO-21 */
static void test_spectral_checks(void **state)
{
    (void)state;
    kvx_spectral b = bundle();
    kvx_gpu_spectral *sp = (kvx_gpu_spectral *)0x1;
    assert_int_equal(kvx_gpu_spectral_create(NULL, 0, &b, 4), KVX_EINVALID);
    assert_int_equal(kvx_gpu_spectral_create(&sp, 0, NULL, 4), KVX_EINVALID);
    assert_null(sp);
    assert_int_equal(kvx_gpu_spectral_create(&sp, 0, &b, 5), KVX_ENOTFOUND);
    assert_int_equal(kvx_gpu_spectral_create(&sp, 1, &b, 4), KVX_ENOGPU);
    kvx_spectral bad = b;
    bad.rank = SD + 1;
    assert_int_equal(kvx_gpu_spectral_create(&sp, 0, &bad, 4), KVX_ESPECTRAL);
    bad = b;
    bad.n_cartridges = 33;
    assert_int_equal(kvx_gpu_spectral_create(&sp, 0, &bad, 4), KVX_ESPECTRAL);
    uint32_t ids_down[2] = {9, 4};
    bad = b;
    bad.ids = ids_down;
    assert_int_equal(kvx_gpu_spectral_create(&sp, 0, &bad, 4), KVX_ESPECTRAL);
    psi_all[SL * SD * SR + 7] = NAN; /* cartridge 9 only */
    assert_int_equal(kvx_gpu_spectral_create(&sp, 0, &b, 9), KVX_ESPECTRAL);
    assert_int_equal(kvx_gpu_spectral_create(&sp, 0, &b, 4), 0);
    assert_int_equal(fake.live_allocs, 2);
    uint64_t h;
    assert_int_equal(kvx_gpu_dev.malloc(&h, 4 * SSTRIDE * SROWS), 0);
    assert_int_equal(kvx_gpu_spectral_apply(NULL, 12, h, 1, SD, KVX_GPU_F32, 0.5f, NULL), KVX_EINVALID);
    assert_int_equal(kvx_gpu_spectral_apply(sp, 11, h, 1, SD, KVX_GPU_F32, 0.5f, NULL), KVX_EINVALID);
    assert_int_equal(kvx_gpu_spectral_apply(sp, 12 + SL, h, 1, SD, KVX_GPU_F32, 0.5f, NULL), KVX_EINVALID);
    assert_int_equal(kvx_gpu_spectral_apply(sp, 12, h, 1, SD, 3, 0.5f, NULL), KVX_EINVALID);
    assert_int_equal(kvx_gpu_spectral_apply(sp, 12, h, 1, SD, KVX_GPU_F32, -0.1f, NULL), KVX_EINVALID);
    assert_int_equal(kvx_gpu_spectral_apply(sp, 12, h, 1, SD, KVX_GPU_F32, 1.5f, NULL), KVX_EINVALID);
    assert_int_equal(kvx_gpu_spectral_apply(sp, 12, h, 1, SD, KVX_GPU_F32, NAN, NULL), KVX_EINVALID);
    assert_int_equal(kvx_gpu_spectral_apply(sp, 12, h, 1, SD - 1, KVX_GPU_F32, 0.5f, NULL), KVX_EINVALID);
    assert_int_equal(kvx_gpu_spectral_apply(sp, 12, h + 2, 1, SD, KVX_GPU_F32, 0.5f, NULL), KVX_EINVALID);
    assert_int_equal(kvx_gpu_spectral_apply(sp, 12, 0, 1, SD, KVX_GPU_F32, 0.5f, NULL), KVX_EINVALID);
    assert_int_equal(kvx_gpu_spectral_apply(sp, 12, h, (uint64_t)1 << 40, SD, KVX_GPU_F32, 0.5f, NULL), KVX_EINVALID);
    assert_int_equal(kvx_gpu_spectral_apply(sp, 12, h, 0, SD, KVX_GPU_F32, 0.5f, NULL), 0);
    assert_int_equal(fake.n_spectral, 0);
    kvx_gpu_dev.free(h);
    kvx_gpu_spectral_destroy(sp);
    kvx_gpu_spectral_destroy(NULL);
    assert_int_equal(fake.live_allocs, 0);
    /* without CUDA: KVX_ENOCUDA whatever the arguments */
    kvx_gpu_dev_reset();
    if (kvx_gpu_dev.present() == KVX_ENOCUDA) {
        assert_int_equal(kvx_gpu_spectral_create(&sp, 0, &b, 4), KVX_ENOCUDA);
        assert_int_equal(kvx_gpu_spectral_create(NULL, 0, NULL, 0), KVX_ENOCUDA);
        assert_non_null(strstr(kvx_last_error(), "built without CUDA"));
        assert_int_equal(kvx_gpu_spectral_apply(NULL, 0, 0, 0, 0, 0, 0, NULL), KVX_ENOCUDA);
        kvx_gpu_spectral_destroy((kvx_gpu_spectral *)0x1); /* never touched */
    }
    fake_install();
}

/* The upload and the launch: rows steered on the fake device equal
 * kvx_spectral_apply's, each layer's psi at its place, strides kept (the
 * bytes between rows untouched), for f32, bf16 and f16 rows. */
/* PROMISE: IO-21 */
static void test_spectral_apply_plumbing(void **state)
{
    (void)state;
    kvx_spectral b = bundle();
    kvx_gpu_spectral *sp = NULL;
    assert_int_equal(kvx_gpu_spectral_create(&sp, 0, &b, 9), 0);
    const int dtypes[3] = {KVX_GPU_F32, KVX_GPU_BF16, KVX_GPU_F16};
    const double tol[3] = {1e-5, 1e-2, 1e-2};
    for (int t = 0; t < 3; t++)
        for (uint32_t layer = 12; layer < 12 + SL; layer++) {
            size_t es = dtypes[t] == KVX_GPU_F32 ? 4 : 2;
            uint64_t dev;
            assert_int_equal(kvx_gpu_dev.malloc(&dev, es * SSTRIDE * SROWS), 0);
            uint8_t *h = (uint8_t *)(uintptr_t)dev;
            static float want[SROWS][SD], x[SD];
            for (uint32_t i = 0; i < SROWS; i++) {
                for (uint32_t j = 0; j < SSTRIDE; j++) {
                    float v = (float)cos((double)(i * 131 + j) * 0.05) * (1 + (float)i / 8);
                    if (dtypes[t] == KVX_GPU_F32)
                        ((float *)h)[i * SSTRIDE + j] = v;
                    else if (dtypes[t] == KVX_GPU_BF16)
                        ((uint16_t *)h)[i * SSTRIDE + j] = kvx_f32_to_bf16(v);
                    else
                        ((uint16_t *)h)[i * SSTRIDE + j] = kvx_f32_to_f16(v);
                }
                for (uint32_t j = 0; j < SD; j++) {
                    uint16_t u = ((uint16_t *)h)[i * SSTRIDE + j];
                    x[j] = dtypes[t] == KVX_GPU_F32    ? ((float *)h)[i * SSTRIDE + j]
                           : dtypes[t] == KVX_GPU_BF16 ? kvx_bf16_to_f32(u)
                                                       : kvx_f16_to_f32(u);
                }
                kvx_spectral_apply(x, psi_all + (size_t)SL * SD * SR + (size_t)(layer - 12) * SD * SR, SD, SR, 0.75f);
                memcpy(want[i], x, sizeof x);
            }
            uint8_t *gap = malloc(es * SSTRIDE * SROWS);
            memcpy(gap, h, es * SSTRIDE * SROWS);
            void *stream;
            assert_int_equal(kvx_gpu_dev.stream_create(&stream), 0);
            assert_int_equal(kvx_gpu_spectral_apply(sp, layer, dev, SROWS, SSTRIDE, dtypes[t], 0.75f, stream), 0);
            /* queued on the caller's stream: nothing happened yet */
            assert_memory_equal(gap, h, es * SSTRIDE * SROWS);
            assert_int_equal(kvx_gpu_dev.stream_sync(stream), 0);
            kvx_gpu_dev.stream_destroy(stream);
            double maxd = 0, maxh = 0;
            for (uint32_t i = 0; i < SROWS; i++) {
                for (uint32_t j = 0; j < SD; j++) {
                    uint16_t u = ((uint16_t *)h)[i * SSTRIDE + j];
                    float got = dtypes[t] == KVX_GPU_F32    ? ((float *)h)[i * SSTRIDE + j]
                                : dtypes[t] == KVX_GPU_BF16 ? kvx_bf16_to_f32(u)
                                                            : kvx_f16_to_f32(u);
                    maxd = fmax(maxd, fabs((double)got - want[i][j]));
                    maxh = fmax(maxh, fabs((double)want[i][j]));
                }
                assert_memory_equal(gap + es * (i * SSTRIDE + SD), h + es * (i * SSTRIDE + SD), es * (SSTRIDE - SD));
            }
            if (maxd / maxh > tol[t]) fail_msg("dtype %d layer %u: max|diff|/max|h| %g", dtypes[t], layer, maxd / maxh);
            free(gap);
            kvx_gpu_dev.free(dev);
        }
    kvx_gpu_spectral_destroy(sp);
    assert_int_equal(fake.live_allocs, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_every_path_delivers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rotten_page_never_delivered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registration_refused_falls_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mapping_or_memory_refused_falls_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_device_failure_ends_warmup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_after_open, setup, teardown),
        cmocka_unit_test_setup_teardown(test_options_and_stages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_spectral_checks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_spectral_apply_plumbing, setup, teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
