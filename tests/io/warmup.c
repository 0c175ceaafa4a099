/*
 * warmup.c - io/warmup.c: bulk warmup into the host sink on each I/O
 * path: the bytes delivered equal the file's pages, the report's counts
 * and io mode are right, a page failing its CRC is counted, named and not
 * delivered, truncated pages are reported, the progress callback ends at
 * the totals, the poll form, cancel, odd inputs (FIFOs, directories,
 * sparse files, planted store files), files changed under it, concurrent
 * warmups beside a fetch, shared-tier views.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/capability.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvx.h"
#include "lib/commit.h"
#include "lib/fault.h"
#include "lib/io.h"
#include "lib/store.h"

#define N1 37

#define N2 21

static char path1[512], path2[512];

static kvx_shard *sh[2];

static int group_setup(void **state)
{
    (void)state;
    unsetenv("KVX_IO_FORCE_NO_URING");
    if (io_mkdtemp("test_warmup")) return -1;
    if (io_make_shard(path1, sizeof path1, io_tmpdir, "a.kvx", 1, N1, 0)) return -1;
    if (io_make_shard(path2, sizeof path2, io_tmpdir, "b.kvx", 2, N2, 0)) return -1;
    if (kvx_shard_open(&sh[0], path1, 0) || kvx_shard_open(&sh[1], path2, 0)) return -1;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    kvx_shard_close(sh[0]);
    kvx_shard_close(sh[1]);
    io_rm_rf(io_tmpdir);
    return 0;
}

/* Checks the sink against the files themselves: page k of the layout
 * (inputs in order, entries by index, 256-aligned) equals the file's
 * bytes at the entry's offset, except pages listed as bad, which must
 * still hold the fill byte. Returns pages and bytes seen. */
static void check_sink(const uint8_t *sink, kvx_shard *const *s, size_t n, uint8_t fill,
                       const kvx_warmup_report *rep, uint64_t *out_pages, uint64_t *out_bytes)
{
    uint64_t off = 0, pages = 0, bytes = 0;
    for (size_t k = 0; k < n; k++) {
        int fd = open(kvx_shard_path(s[k]), O_RDONLY);
        assert_true(fd >= 0);
        uint32_t nb = kvx_shard_get_info(s[k])->num_blocks;
        for (uint32_t i = 0; i < nb; i++) {
            kvx_entry e;
            assert_int_equal(kvx_shard_entry(&e, s[k], i), 0);
            off = (off + 255) / 256 * 256;
            int bad = 0;
            for (size_t f = 0; rep && f < rep->n_failures; f++)
                if (rep->failures[f].shard == k && rep->failures[f].entry == i) bad = 1;
            if (bad) {
                for (uint64_t b = 0; b < e.bytes; b++) assert_int_equal(sink[off + b], fill);
            } else {
                uint8_t *want = malloc(e.bytes);
                assert_int_equal(pread(fd, want, e.bytes, (off_t)e.offset), (ssize_t)e.bytes);
                assert_memory_equal(sink + off, want, e.bytes);
                free(want);
                pages++;
                bytes += e.bytes;
            }
            off += e.bytes;
        }
        close(fd);
    }
    *out_pages = pages;
    *out_bytes = bytes;
}

typedef struct prog {
    int calls;
    kvx_warmup_progress last;
} prog;

static void on_progress(void *ctx, const kvx_warmup_progress *p)
{
    prog *pr = ctx;
    assert_true(p->bytes_done <= p->bytes_total);
    assert_true(p->pages_done <= p->pages_total);
    if (pr->calls) assert_true(p->bytes_done >= pr->last.bytes_done);
    pr->calls++;
    pr->last = *p;
}

/* Options for the host sink, and the sink: sized for s[0..n-1], every
 * byte fill so check_sink can tell what was never delivered. The caller
 * frees the sink. */
static uint8_t *host_sink(kvx_warmup_options *o, kvx_shard *const *s, size_t n, uint8_t fill)
{
    uint64_t need = 0;
    assert_int_equal(kvx_warmup_sink_bytes(&need, s, n), 0);
    uint8_t *sink = malloc(need);
    assert_non_null(sink);
    memset(sink, fill, need);
    *o = (kvx_warmup_options)KVX_WARMUP_OPTIONS_INIT;
    o->sink = KVX_SINK_HOST;
    o->host_buf = sink;
    o->host_buf_bytes = need;
    return sink;
}

static void host_case(int mode, uint32_t flags, int want_mode, uint32_t qd, uint32_t chunk)
{
    kvx_warmup_options o;
    uint8_t *sink = host_sink(&o, sh, 2, 0xAA);
    o.io_mode = mode;
    o.flags = flags;
    o.queue_depth = qd;
    o.chunk_bytes = chunk;
    prog pr = {0};
    o.progress = on_progress;
    o.progress_ctx = &pr;
    kvx_warmup_report rep;
    int rc = kvx_warmup_run(&rep, sh, 2, &o);
    if (rc == -EPERM || rc == -ENOSYS) {
        free(sink);
        skip();
    }
    assert_int_equal(rc, 0);
    uint64_t pages, bytes;
    check_sink(sink, sh, 2, 0xAA, &rep, &pages, &bytes);
    assert_int_equal(rep.pages, N1 + N2);
    assert_int_equal(pages, N1 + N2);
    assert_int_equal(rep.bytes, bytes);
    assert_int_equal(rep.crc_failures, 0);
    assert_int_equal(rep.io_failures, 0);
    assert_int_equal(rep.n_failures, 0);
    assert_true(rep.bytes_read >= rep.bytes);
    assert_true(rep.seconds > 0);
    assert_true(rep.gbps > 0);
    assert_int_equal(rep.io_mode, want_mode);
    if (want_mode == KVX_IO_URING && !(flags & KVX_WARMUP_BUFFERED)) assert_int_equal(rep.direct, 1);
    if (want_mode == KVX_IO_PREAD) assert_int_equal(rep.direct, 0);
    /* the callback's last call is the end, at the totals */
    assert_true(pr.calls >= 1);
    assert_int_equal(pr.last.finished, 1);
    assert_int_equal(pr.last.pages_done, N1 + N2);
    assert_int_equal(pr.last.bytes_done, bytes);
    assert_int_equal(pr.last.bytes_total, bytes);
    kvx_warmup_report_free(&rep);
    free(sink);
}

static void test_host_uring(void **state) { (void)state; host_case(KVX_IO_URING, 0, KVX_IO_URING, 0, 0); }

static void test_host_uring_small_chunks(void **state)
{
    (void)state;
    host_case(KVX_IO_URING, 0, KVX_IO_URING, 2, 20000); /* many runs, few buffers: reuse */
}

static void test_host_uring_buffered(void **state)
{
    (void)state;
    host_case(KVX_IO_AUTO, KVX_WARMUP_BUFFERED, KVX_IO_URING, 3, 8192);
}

static void test_host_pread(void **state) { (void)state; host_case(KVX_IO_PREAD, 0, KVX_IO_PREAD, 2, 16384); }

/* PROMISE: IO-10 */
static void test_host_forced_fallback(void **state)
{
    (void)state;
    setenv("KVX_IO_FORCE_NO_URING", "1", 1);
    host_case(KVX_IO_AUTO, 0, KVX_IO_PREAD, 0, 0);
    unsetenv("KVX_IO_FORCE_NO_URING");
}

static void test_no_verify(void **state) { (void)state; host_case(KVX_IO_URING, KVX_WARMUP_NO_VERIFY, KVX_IO_URING, 0, 0); }

/* Share (0..1) of a file's 4 KiB pages in the page cache. */
static double resident(const char *path)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    size_t len = (size_t)st.st_size, np = (len + 4095) / 4096;
    void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(m != MAP_FAILED);
    unsigned char *vec = malloc(np);
    assert_int_equal(mincore(m, len, vec), 0);
    size_t in = 0;
    for (size_t i = 0; i < np; i++) in += vec[i] & 1;
    free(vec);
    munmap(m, len);
    close(fd);
    return (double)in / (double)np;
}

/* KVX_IO_AUTO without KVX_WARMUP_BUFFERED: data found in the page cache is
 * read by the buffered pread workers (CRCs and the host copy in parallel);
 * data not cached goes through io_uring with O_DIRECT. */
/* PROMISE: IO-12 */
static void test_auto_policy(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) { /* warm: read every byte once */
        int fd = open(kvx_shard_path(sh[k]), O_RDONLY);
        char buf[65536];
        while (read(fd, buf, sizeof buf) > 0) {
        }
        close(fd);
    }
    host_case(KVX_IO_AUTO, 0, KVX_IO_PREAD, 0, 0);
    /* cold: drop the files' cached pages (not possible on tmpfs: then skip) */
    for (int k = 0; k < 2; k++) {
        int fd = open(kvx_shard_path(sh[k]), O_RDONLY);
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    if (resident(kvx_shard_path(sh[0])) > 0.5 || resident(kvx_shard_path(sh[1])) > 0.5) skip();
    kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
    o.io_mode = KVX_IO_URING;
    kvx_warmup_report rep;
    int rc = kvx_warmup_run(&rep, sh, 2, &o); /* O_DIRECT: leaves the cache cold */
    if (rc == -EPERM || rc == -ENOSYS) skip();
    assert_int_equal(rc, 0);
    int direct = rep.direct;
    kvx_warmup_report_free(&rep);
    o.io_mode = KVX_IO_AUTO;
    assert_int_equal(kvx_warmup_run(&rep, sh, 2, &o), 0);
    assert_int_equal(rep.io_mode, KVX_IO_URING);
    assert_int_equal(rep.direct, direct);
    assert_int_equal(rep.crc_failures + rep.io_failures, 0);
    kvx_warmup_report_free(&rep);
}

static void test_discard_checksum(void **state)
{
    (void)state;
    uint64_t want = 0;
    for (int k = 0; k < 2; k++)
        for (uint32_t i = 0; i < kvx_shard_get_info(sh[k])->num_blocks; i++) {
            kvx_entry e;
            assert_int_equal(kvx_shard_entry(&e, sh[k], i), 0);
            want += e.crc32;
        }
    kvx_warmup_report rep;
    assert_int_equal(kvx_warmup_run(&rep, sh, 2, NULL), 0);
    assert_int_equal(rep.checksum, want);
    assert_int_equal(rep.pages, N1 + N2);
    kvx_warmup_report_free(&rep);
}

static void flip(const char *path, kvx_shard *s, uint32_t entry, uint64_t at)
{
    kvx_entry e;
    assert_int_equal(kvx_shard_entry(&e, s, entry), 0);
    assert_int_equal(io_flip_byte(path, e.offset + at, 0x40), 0);
}

static void crc_case(int mode)
{
    char bad[600];
    kvx_shard *in[2] = {sh[0], NULL};
    assert_int_equal(io_open_copy(&in[1], bad, sizeof bad, path2, "bad.kvx"), 0);
    flip(bad, in[1], 3, 0);
    flip(bad, in[1], 17, 1000);
    kvx_warmup_options o;
    uint8_t *sink = host_sink(&o, in, 2, 0x5C);
    o.io_mode = mode;
    kvx_warmup_report rep;
    assert_int_equal(kvx_warmup_run(&rep, in, 2, &o), 0);
    assert_int_equal(rep.crc_failures, 2);
    assert_int_equal(rep.io_failures, 0);
    assert_int_equal(rep.pages, N1 + N2 - 2);
    assert_int_equal(rep.n_failures, 2);
    int seen3 = 0, seen17 = 0;
    for (size_t f = 0; f < rep.n_failures; f++) {
        assert_string_equal(rep.failures[f].path, kvx_shard_path(in[1]));
        assert_int_equal(rep.failures[f].shard, 1);
        assert_int_equal(rep.failures[f].code, KVX_EPAGECRC);
        seen3 |= rep.failures[f].entry == 3;
        seen17 |= rep.failures[f].entry == 17;
    }
    assert_true(seen3 && seen17);
    uint64_t pages, bytes;
    check_sink(sink, in, 2, 0x5C, &rep, &pages, &bytes); /* bad pages never delivered */
    assert_int_equal(pages, rep.pages);
    assert_int_equal(bytes, rep.bytes);
    kvx_warmup_report_free(&rep);
    assert_null(rep.failures);
    free(sink);
    kvx_shard_close(in[1]);
    unlink(bad);
}

/* PROMISE: IO-11 */
static void test_crc_uring(void **state) { (void)state; crc_case(KVX_IO_URING); }

/* PROMISE: IO-11 */
static void test_crc_pread(void **state) { (void)state; crc_case(KVX_IO_PREAD); }

/* PROMISE: IO-11 */
static void test_truncated(void **state)
{
    (void)state;
    char tr[600];
    kvx_shard *s = NULL;
    assert_int_equal(io_open_copy(&s, tr, sizeof tr, path1, "trunc.kvx"), 0);
    kvx_entry e;
    assert_int_equal(kvx_shard_entry(&e, s, N1 - 2), 0);
    assert_int_equal(truncate(tr, (off_t)e.offset + 100), 0);
    for (int mode = KVX_IO_URING; mode <= KVX_IO_PREAD; mode++) {
        kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
        o.io_mode = mode;
        kvx_warmup_report rep;
        assert_int_equal(kvx_warmup_run(&rep, &s, 1, &o), 0);
        assert_int_equal(rep.pages, N1 - 2);
        assert_int_equal(rep.io_failures, 2);
        assert_int_equal(rep.crc_failures, 0);
        assert_int_equal(rep.n_failures, 2);
        for (size_t f = 0; f < 2; f++) {
            assert_int_equal(rep.failures[f].code, KVX_ETRUNC);
            assert_true(rep.failures[f].entry >= N1 - 2);
        }
        kvx_warmup_report_free(&rep);
    }
    kvx_shard_close(s);
    unlink(tr);
}

static void test_async(void **state)
{
    (void)state;
    kvx_warmup_options o;
    uint8_t *sink = host_sink(&o, sh, 2, 0);
    kvx_warmup *w = NULL;
    assert_int_equal(kvx_warmup_start(&w, sh, 2, &o), 0);
    kvx_warmup_progress p;
    assert_int_equal(kvx_warmup_get_progress(&p, w), 0);
    assert_true(p.pages_total == N1 + N2);
    kvx_warmup_report rep;
    int rc;
    while ((rc = kvx_warmup_wait(&rep, w, 5)) == -ETIMEDOUT) {
        assert_int_equal(kvx_warmup_get_progress(&p, w), 0);
        assert_true(p.pages_done <= p.pages_total);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(kvx_warmup_get_progress(&p, w), 0);
    assert_int_equal(p.finished, 1);
    assert_int_equal(p.pages_done, N1 + N2);
    assert_int_equal(rep.pages, N1 + N2);
    assert_int_equal(rep.canceled, 0);
    uint64_t pages, bytes;
    check_sink(sink, sh, 2, 0, &rep, &pages, &bytes);
    assert_int_equal(rep.bytes, bytes);
    kvx_warmup_report_free(&rep);
    const uint64_t *dp;
    size_t dn;
    assert_int_equal(kvx_warmup_device_pages(&dp, &dn, w), KVX_EINVALID); /* host sink */
    kvx_warmup_destroy(w);

    /* cancel: one small read at a time, canceled at once */
    o.queue_depth = 1;
    o.chunk_bytes = 4096;
    for (int mode = KVX_IO_URING; mode <= KVX_IO_PREAD; mode++) {
        o.io_mode = mode;
        assert_int_equal(kvx_warmup_start(&w, sh, 2, &o), 0);
        assert_int_equal(kvx_warmup_cancel(w), 0);
        assert_int_equal(kvx_warmup_wait(&rep, w, -1), 0);
        assert_int_equal(kvx_warmup_get_progress(&p, w), 0);
        assert_int_equal(p.finished, 1);
        if (rep.canceled) assert_true(rep.pages < N1 + N2);
        else assert_int_equal(rep.pages, N1 + N2);
        kvx_warmup_report_free(&rep);
        kvx_warmup_destroy(w);
    }
    /* destroy while running cancels and joins */
    assert_int_equal(kvx_warmup_start(&w, sh, 2, &o), 0);
    kvx_warmup_destroy(w);
    free(sink);
}

static void test_errors(void **state)
{
    (void)state;
    kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
    kvx_warmup_report rep;
    o.sink = KVX_SINK_HOST;
    uint8_t small[64];
    o.host_buf = small;
    o.host_buf_bytes = sizeof small;
    assert_int_equal(kvx_warmup_run(&rep, sh, 2, &o), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "host_buf"));
    o = (kvx_warmup_options)KVX_WARMUP_OPTIONS_INIT;
    o.version = 0;
    assert_int_equal(kvx_warmup_run(&rep, sh, 2, &o), KVX_EVERSION);
    o = (kvx_warmup_options)KVX_WARMUP_OPTIONS_INIT;
    o.sink = 7;
    assert_int_equal(kvx_warmup_run(&rep, sh, 2, &o), KVX_EINVALID);
    /* a staging slot is at most 1 GiB (one io_uring fixed buffer): a
     * larger chunk_bytes is refused before any staging memory is made
     * (queue_depth 1: three buffers, so the check costs no 20 GiB) */
    o = (kvx_warmup_options)KVX_WARMUP_OPTIONS_INIT;
    o.chunk_bytes = (1u << 30) + 4096;
    o.queue_depth = 1;
    assert_int_equal(kvx_warmup_run(&rep, sh, 2, &o), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "chunk_bytes"));
    kvx_shard *none[1] = {NULL};
    assert_int_equal(kvx_warmup_run(&rep, none, 1, NULL), KVX_EINVALID);
    /* nothing to do is fine */
    assert_int_equal(kvx_warmup_run(&rep, NULL, 0, NULL), 0);
    assert_int_equal(rep.pages, 0);
    /* GPU sink: a clear answer without CUDA or a GPU; never a crash */
    int ngpu = 0;
    int rc = kvx_gpu_count(&ngpu);
    o = (kvx_warmup_options)KVX_WARMUP_OPTIONS_INIT;
    o.sink = KVX_SINK_GPU;
    if (rc == KVX_ENOCUDA) {
        assert_int_equal(kvx_warmup_run(&rep, sh, 2, &o), KVX_ENOCUDA);
        assert_non_null(strstr(kvx_last_error(), "CUDA"));
        kvx_gpu *g = NULL;
        assert_int_equal(kvx_gpu_create(&g, NULL), KVX_ENOCUDA);
    } else if (ngpu == 0) {
        kvx_gpu *g = NULL;
        assert_int_equal(kvx_gpu_create(&g, NULL), KVX_ENOGPU);
        assert_non_null(strstr(kvx_last_error(), "GPU"));
    }
}

/* A store at io_tmpdir/name holding STORE_SEQS sequences of STORE_BLOCKS
 * full blocks (token ids from tok_base, pages io_fill(fill_base + seq)),
 * flushed and closed; its path goes to dir. */
enum { STORE_SEQS = 3, STORE_BLOCKS = 6 };

static void filled_io_store(char *dir, size_t cap, const char *name, uint32_t tok_base, uint32_t fill_base)
{
    snprintf(dir, cap, "%s/%s", io_tmpdir, name);
    kvx_store_options so = KVX_STORE_OPTIONS_INIT;
    so.geometry = io_geometry();
    kvx_store *st = NULL;
    assert_int_equal(kvx_store_create(&st, dir, &so), 0);
    const uint32_t B = so.geometry.block_tokens;
    uint64_t pb = kvx_page_bytes(&so.geometry, B);
    uint32_t *tok = malloc(sizeof *tok * B * STORE_BLOCKS);
    uint8_t *pages = malloc(pb * STORE_BLOCKS);
    assert_non_null(tok);
    assert_non_null(pages);
    for (uint32_t s = 0; s < STORE_SEQS; s++) {
        for (uint32_t t = 0; t < B * STORE_BLOCKS; t++) tok[t] = s * 100000 + t + tok_base;
        for (uint32_t b = 0; b < STORE_BLOCKS; b++) io_fill(pages + b * pb, fill_base + s, b, pb);
        size_t added = 0;
        assert_int_equal(kvx_store_put(st, tok, B * STORE_BLOCKS, pages, STORE_BLOCKS, NULL, &added), 0);
        assert_int_equal(added, STORE_BLOCKS);
    }
    assert_int_equal(kvx_store_flush(st), 0);
    kvx_store_close(st);
    free(tok);
    free(pages);
}

static void test_store_collect(void **state)
{
    (void)state;
    char dir[600];
    filled_io_store(dir, sizeof dir, "store", 1, 50);

    /* a directory and a file in one call */
    const char *paths[2] = {dir, path2};
    kvx_shard **got = NULL;
    size_t n = 0;
    assert_int_equal(kvx_warmup_collect(&got, &n, paths, 2), 0);
    assert_true(n >= 2);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += kvx_shard_get_info(got[i])->num_blocks;
    assert_int_equal(total, STORE_SEQS * STORE_BLOCKS + N2);
    kvx_warmup_options o;
    uint8_t *sink = host_sink(&o, got, n, 0x11);
    kvx_warmup_report rep;
    assert_int_equal(kvx_warmup_run(&rep, got, n, &o), 0);
    assert_int_equal(rep.pages, total);
    uint64_t pgs, bytes;
    check_sink(sink, got, n, 0x11, &rep, &pgs, &bytes);
    assert_int_equal(pgs, total);
    assert_int_equal(rep.bytes, bytes);
    kvx_warmup_report_free(&rep);
    free(sink);
    for (size_t i = 0; i < n; i++) kvx_shard_close(got[i]);
    kvx_free(got);

    const char *missing[1] = {"/nonexistent/kvx/x.kvx"};
    assert_int_equal(kvx_warmup_collect(&got, &n, missing, 1), -ENOENT);
    assert_null(got);
}

/* A store evicts a shard by unlinking it. Shards collected for a warmup
 * hold their own descriptors, so a warmup of shards evicted after they
 * were collected (before or while it runs) still reads every page right:
 * the io_uring path reopens the inode through /proc/self/fd for O_DIRECT,
 * the pread path reads the descriptor. The sink is checked against the
 * shards' own (still mapped) pages, since the paths are gone. */
static void evicted_case(int mode, const char *name)
{
    char dir[600];
    filled_io_store(dir, sizeof dir, name, 7, 60);

    const char *paths[1] = {dir};
    kvx_shard **got = NULL;
    size_t n = 0;
    assert_int_equal(kvx_warmup_collect(&got, &n, paths, 1), 0);
    assert_true(n >= 1);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += kvx_shard_get_info(got[i])->num_blocks;
    assert_int_equal(total, STORE_SEQS * STORE_BLOCKS);
    kvx_warmup_options o;
    uint8_t *sink = host_sink(&o, got, n, 0x5C);
    o.io_mode = mode;
    for (size_t i = 0; i < n; i++) assert_int_equal(unlink(kvx_shard_path(got[i])), 0);
    kvx_warmup *w = NULL;
    int rc = kvx_warmup_start(&w, got, n, &o);
    if (rc == -EPERM || rc == -ENOSYS) {
        free(sink);
        for (size_t i = 0; i < n; i++) kvx_shard_close(got[i]);
        kvx_free(got);
        skip();
    }
    assert_int_equal(rc, 0);
    kvx_warmup_report rep;
    assert_int_equal(kvx_warmup_wait(&rep, w, -1), 0);
    assert_int_equal(rep.n_failures, 0);
    assert_int_equal(rep.pages, total);
    uint64_t off = 0;
    for (size_t k = 0; k < n; k++) {
        uint32_t nb = kvx_shard_get_info(got[k])->num_blocks;
        for (uint32_t i = 0; i < nb; i++) {
            kvx_entry e;
            const void *pg;
            assert_int_equal(kvx_shard_entry(&e, got[k], i), 0);
            assert_int_equal(kvx_shard_page(&pg, got[k], i, 1), 0);
            off = (off + 255) / 256 * 256;
            assert_memory_equal(sink + off, pg, e.bytes);
            off += e.bytes;
        }
    }
    kvx_warmup_report_free(&rep);
    kvx_warmup_destroy(w);
    free(sink);
    for (size_t i = 0; i < n; i++) kvx_shard_close(got[i]);
    kvx_free(got);
}

static void test_evicted_uring(void **state) { (void)state; evicted_case(KVX_IO_URING, "evict_uring"); }

static void test_evicted_pread(void **state) { (void)state; evicted_case(KVX_IO_PREAD, "evict_pread"); }

/* The io_fill tag of a shard of this test: its shard byte for a file
 * (io_make_shard), 9 or 10 for the two in-memory shards. */
static uint32_t tag_of(kvx_shard *s, kvx_shard *m9)
{
    return kvx_shard_fd(s) >= 0 ? kvx_shard_get_info(s)->shard_id : s == m9 ? 9u : 10u;
}

/* Finding 2, warmup: a shared-tier view's shard failed the whole warmup
 * the same way (kvx_ioq_file of -1). Now its pages are copied into staging
 * and delivered as landed runs: every sink, every executor, and
 * kvx_warmup_start's thread. */
/* PROMISE: IO-7 */
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

#define IO_BASE_N 40

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

typedef struct wthr {
    kvx_shard *s[2];
    int mode, fails;
} wthr;

static void *warm_main(void *arg)
{
    wthr *t = arg;
    uint64_t need;
    if (kvx_warmup_sink_bytes(&need, t->s, 2)) {
        t->fails = -1;
        return NULL;
    }
    uint8_t *buf = malloc(need);
    for (int k = 0; k < 8 && buf; k++) {
        kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
        o.io_mode = (t->mode + k) % 3;
        o.chunk_bytes = k % 2 ? 8192 : 0;
        o.sink = KVX_SINK_HOST;
        o.host_buf = buf;
        o.host_buf_bytes = need;
        kvx_warmup_report rep;
        if (kvx_warmup_run(&rep, t->s, 2, &o) || rep.pages != 2 * IO_BASE_N) {
            t->fails++;
            continue;
        }
        uint64_t off = 0;
        for (int q = 0; q < 2; q++)
            for (uint32_t i = 0; i < IO_BASE_N; i++) {
                kvx_entry e;
                kvx_shard_entry(&e, t->s[q], i);
                off = (off + 255) & ~(uint64_t)255;
                if (!io_page_ok(buf + off, 7, i, e.bytes)) t->fails++;
                off += e.bytes;
            }
        kvx_warmup_report_free(&rep);
    }
    free(buf);
    return NULL;
}

static void test_concurrent_warmups_and_fetch(void **state)
{
    (void)state;
    char pa[512], pb[512];
    kvx_shard *a = io_fresh(pa, sizeof pa), *b = io_fresh(pb, sizeof pb);
    wthr t[2] = {{{a, b}, 0, 0}, {{b, a}, 1, 0}};
    pthread_t tid[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&tid[i], NULL, warm_main, &t[i]), 0);
    kvx_pool *p = io_pool(4 << 20);
    thr ft = {p, a, KVX_IO_URING, 0};
    thr_main(&ft);
    for (int i = 0; i < 2; i++) pthread_join(tid[i], NULL);
    assert_int_equal(ft.fails, 0);
    assert_int_equal(t[0].fails, 0);
    assert_int_equal(t[1].fails, 0);
    assert_int_equal(io_pool_free(p), 4 << 20);
    kvx_pool_destroy(p);
    kvx_shard_close(a);
    kvx_shard_close(b);
}

/* PROMISE: IO-11 */
static void test_warmup_flip_host_sink(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    uint64_t need;
    assert_int_equal(kvx_warmup_sink_bytes(&need, &s, 1), 0);
    uint8_t *buf = malloc(need);
    assert_non_null(buf);
    kvx_entry bad;
    assert_int_equal(kvx_shard_entry(&bad, s, 11), 0);
    assert_int_equal(io_flip_byte(path, bad.offset + 5, 0x01), 0);
    for (int v = 0; v < 6; v++) {
        kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
        o.io_mode = v % 3; /* auto, uring, pread */
        o.flags = v >= 3 ? KVX_WARMUP_BUFFERED : 0;
        o.chunk_bytes = v % 2 ? 8192 : 0;
        o.sink = KVX_SINK_HOST;
        o.host_buf = buf;
        o.host_buf_bytes = need;
        memset(buf, 0xA5, need);
        kvx_warmup_report rep;
        assert_int_equal(kvx_warmup_run(&rep, &s, 1, &o), 0);
        assert_int_equal(rep.crc_failures, 1);
        assert_int_equal(rep.pages, IO_BASE_N - 1);
        assert_int_equal(rep.n_failures, 1);
        assert_int_equal(rep.failures[0].entry, 11);
        assert_int_equal(rep.failures[0].code, KVX_EPAGECRC);
        uint64_t off = 0;
        for (uint32_t i = 0; i < IO_BASE_N; i++) {
            kvx_entry e;
            assert_int_equal(kvx_shard_entry(&e, s, i), 0);
            off = (off + 255) & ~(uint64_t)255;
            if (i == 11) {
                for (uint64_t k = 0; k < e.bytes; k++)
                    if (buf[off + k] != 0xA5) fail_msg("variant %d: the bad page reached the sink", v);
            } else {
                assert_true(io_page_ok(buf + off, 7, i, e.bytes));
            }
            off += e.bytes;
        }
        kvx_warmup_report_free(&rep);
    }
    /* a host buffer one byte short */
    kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
    o.sink = KVX_SINK_HOST;
    o.host_buf = buf;
    o.host_buf_bytes = need - 1;
    kvx_warmup_report rep;
    assert_int_equal(kvx_warmup_run(&rep, &s, 1, &o), KVX_EINVALID);
    o.host_buf = NULL;
    o.host_buf_bytes = need;
    assert_int_equal(kvx_warmup_run(&rep, &s, 1, &o), KVX_EINVALID);
    free(buf);
    kvx_shard_close(s);
}

/* test_filter_random, test_filter_every_position (0 once),
 * test_warmup_truncated_and_faults: under O_DIRECT a short read restarts at
 * the aligned point below, and a re-read that brought nothing new (or a
 * single 0 result) was taken for the end of the file, so two short reads in a
 * row mid-file ended an intact file's pages KVX_ETRUNC ("truncated after
 * open") in fetch and warmup. Fixed in io/ioq.c: the end of file is checked
 * with fstat; where the file has bytes past what the run got, the read is
 * tried again (bounded). */
/* PROMISE: IO-11 */
static void test_warmup_truncated_and_faults(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    kvx_entry mid;
    assert_int_equal(kvx_shard_entry(&mid, s, IO_BASE_N / 2), 0);
    assert_int_equal(truncate(path, (off_t)mid.offset + 100), 0);
    for (int v = 0; v < 3; v++) {
        kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
        o.io_mode = v;
        o.chunk_bytes = 16384;
        kvx_warmup_report rep;
        assert_int_equal(kvx_warmup_run(&rep, &s, 1, &o), 0);
        assert_int_equal(rep.pages + rep.io_failures, IO_BASE_N);
        assert_int_equal(rep.pages, IO_BASE_N / 2);
        assert_int_equal(rep.crc_failures, 0);
        for (size_t i = 0; i < rep.n_failures; i++) assert_int_equal(rep.failures[i].code, KVX_ETRUNC);
        kvx_warmup_report_free(&rep);
    }
    kvx_shard_close(s);
    /* the completion filter at every position, warmup over io_uring */
    s = io_fresh(path, sizeof path);
    for (int kind = 0; kind <= 6; kind++)
        for (int at = 0; at < 24; at++) {
            kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
            o.io_mode = KVX_IO_URING;
            o.chunk_bytes = 16384;
            o.queue_depth = 3;
            filt_at = at;
            filt_calls = 0;
            filt_kind = kind;
            kvx_os.uring_result = filter;
            kvx_warmup_report rep;
            int rc = kvx_warmup_run(&rep, &s, 1, &o);
            kvx_os_reset();
            assert_int_equal(rc, 0);
            assert_int_equal(rep.pages + rep.io_failures + rep.crc_failures, IO_BASE_N);
            if (kind <= 3) assert_int_equal(rep.pages, IO_BASE_N); /* a lone 0 mid-file is not the end */
            for (size_t i = 0; i < rep.n_failures; i++) {
                int c = rep.failures[i].code;
                assert_true(c == KVX_ETRUNC || c == -EIO || c == KVX_EPAGECRC || c == -EINVAL);
            }
            kvx_warmup_report_free(&rep);
        }
    kvx_shard_close(s);
}

typedef struct prog_log {
    int calls, finished_calls, backwards;
    kvx_warmup_progress last;
} prog_log;

static void prog_cb(void *ctx, const kvx_warmup_progress *p)
{
    prog_log *l = ctx;
    if (l->calls && (p->bytes_done < l->last.bytes_done || p->pages_done < l->last.pages_done)) l->backwards++;
    l->calls++;
    l->finished_calls += p->finished;
    l->last = *p;
}

/* PROMISE: IO-11 */
static void test_warmup_report_consistent(void **state)
{
    (void)state;
    char pa[512], pb[512];
    kvx_shard *in[3];
    in[0] = io_fresh(pa, sizeof pa);
    in[1] = io_fresh(pb, sizeof pb);
    in[2] = in[0]; /* the same shard twice */
    uint64_t want_sum = 0, want_bytes = 0;
    for (int k = 0; k < 3; k++)
        for (uint32_t i = 0; i < IO_BASE_N; i++) {
            kvx_entry e;
            assert_int_equal(kvx_shard_entry(&e, in[k], i), 0);
            want_sum += e.crc32;
            want_bytes += e.bytes;
        }
    for (int v = 0; v < 6; v++) {
        kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
        o.io_mode = v % 3;
        o.flags = v >= 3 ? KVX_WARMUP_BUFFERED : 0;
        o.chunk_bytes = v % 2 ? 12288 : 0;
        prog_log l;
        memset(&l, 0, sizeof l);
        o.progress = prog_cb;
        o.progress_ctx = &l;
        kvx_warmup_report rep;
        assert_int_equal(kvx_warmup_run(&rep, in, 3, &o), 0);
        assert_int_equal(rep.pages, 3 * IO_BASE_N);
        assert_int_equal(rep.bytes, want_bytes);
        assert_int_equal(rep.checksum, want_sum);
        assert_int_equal(rep.crc_failures + rep.io_failures + rep.n_failures, 0);
        assert_true(rep.bytes_read >= want_bytes);
        assert_int_equal(rep.canceled, 0);
        assert_true(l.calls >= 1);
        assert_int_equal(l.backwards, 0);
        assert_int_equal(l.finished_calls, 1);
        assert_int_equal(l.last.finished, 1);
        assert_int_equal(l.last.pages_done, l.last.pages_total);
        assert_int_equal(l.last.bytes_done, l.last.bytes_total);
        assert_int_equal(l.last.bytes_total, want_bytes);
        kvx_warmup_report_free(&rep);
        kvx_warmup_report_free(&rep); /* twice is fine */
    }
    kvx_warmup_report_free(NULL);
    /* the deepest queue (62 reads, 64 staging buffers) with the smallest runs */
    for (int m = 0; m < 3; m++) {
        kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
        o.io_mode = m;
        o.queue_depth = 62;
        o.chunk_bytes = 4096;
        kvx_warmup_report rep;
        assert_int_equal(kvx_warmup_run(&rep, in, 3, &o), 0);
        assert_int_equal(rep.pages, 3 * IO_BASE_N);
        assert_int_equal(rep.checksum, want_sum);
        kvx_warmup_report_free(&rep);
    }
    /* option and argument errors, each its own code */
    kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
    kvx_warmup_report rep;
    o.version = 99;
    assert_int_equal(kvx_warmup_run(&rep, in, 3, &o), KVX_EVERSION);
    o.version = KVX_WARMUP_OPTIONS_VERSION;
    o.flags = 0x80;
    assert_int_equal(kvx_warmup_run(&rep, in, 3, &o), KVX_EINVALID);
    o.flags = 0;
    o.io_mode = 9;
    assert_int_equal(kvx_warmup_run(&rep, in, 3, &o), KVX_EINVALID);
    assert_int_equal(kvx_warmup_run(NULL, in, 3, NULL), KVX_EINVALID);
    assert_int_equal(kvx_warmup_run(&rep, NULL, 3, NULL), KVX_EINVALID);
    kvx_warmup *w = (kvx_warmup *)0x1;
    assert_int_equal(kvx_warmup_start(NULL, in, 3, NULL), KVX_EINVALID);
    assert_int_equal(kvx_warmup_cancel(NULL), KVX_EINVALID);
    assert_int_equal(kvx_warmup_wait(&rep, NULL, 0), KVX_EINVALID);
    kvx_warmup_progress pr;
    assert_int_equal(kvx_warmup_get_progress(&pr, NULL), KVX_EINVALID);
    kvx_warmup_destroy(NULL);
    (void)w;
    uint64_t need;
    assert_int_equal(kvx_warmup_sink_bytes(NULL, in, 3), KVX_EINVALID);
    assert_int_equal(kvx_warmup_sink_bytes(&need, NULL, 3), KVX_EINVALID);
    assert_int_equal(kvx_warmup_sink_bytes(&need, NULL, 0), 0);
    assert_int_equal(need, 0);
    /* pool and fetch options */
    kvx_pool_options po = KVX_POOL_OPTIONS_INIT;
    kvx_pool *p = NULL;
    po.numa_node = 4000;
    assert_int_equal(kvx_pool_create(&p, &po), KVX_EINVALID);
    po.numa_node = -7;
    assert_int_equal(kvx_pool_create(&p, &po), KVX_EINVALID);
    po.numa_node = KVX_POOL_NODE_AUTO;
    po.version = 3;
    assert_int_equal(kvx_pool_create(&p, &po), KVX_EVERSION);
    po.version = KVX_POOL_OPTIONS_VERSION;
    po.flags = 0x100;
    assert_int_equal(kvx_pool_create(&p, &po), KVX_EINVALID);
    po.flags = 0;
    po.bytes = ((uint64_t)1 << 46) + 1;
    assert_int_equal(kvx_pool_create(&p, &po), KVX_EINVALID);
    assert_int_equal(kvx_pool_create(NULL, NULL), KVX_EINVALID);
    kvx_pool_info info;
    assert_int_equal(kvx_pool_get_info(&info, NULL), KVX_EINVALID);
    p = io_pool(1 << 20);
    kvx_fetch_options fo = KVX_FETCH_OPTIONS_INIT;
    kvx_fetch *f = (kvx_fetch *)0x1;
    fo.io_mode = 5;
    assert_int_equal(kvx_fetch_create(&f, p, &fo), KVX_EINVALID);
    assert_null(f);
    fo.io_mode = KVX_IO_AUTO;
    fo.max_read_bytes = 4095;
    assert_int_equal(kvx_fetch_create(&f, p, &fo), KVX_EINVALID);
    fo.max_read_bytes = 0;
    fo.version = 0;
    assert_int_equal(kvx_fetch_create(&f, p, &fo), KVX_EVERSION);
    fo.version = KVX_FETCH_OPTIONS_VERSION;
    fo.flags = 0x40;
    assert_int_equal(kvx_fetch_create(&f, p, &fo), KVX_EINVALID);
    fo.flags = 0;
    setenv("KVX_IO_FORCE_NO_URING", "1", 1);
    fo.io_mode = KVX_IO_URING;
    assert_int_equal(kvx_fetch_create(&f, p, &fo), -EPERM);
    fo.io_mode = KVX_IO_AUTO;
    fo.queue_depth = UINT32_MAX;
    fo.threads = UINT32_MAX;
    assert_int_equal(kvx_fetch_create(&f, p, &fo), 0);
    assert_int_equal(kvx_fetch_mode(f), KVX_IO_PREAD);
    kvx_fetch_req r[IO_BASE_N];
    kvx_fetch_result res[IO_BASE_N];
    size_t n = io_every_page(r, in[1]);
    assert_int_equal(kvx_fetch_submit(f, r, n), 0);
    assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
    io_check_trust(r, res, n, NULL);
    assert_int_equal(kvx_fetch_direct(f), 0);
    kvx_fetch_destroy(f);
    unsetenv("KVX_IO_FORCE_NO_URING");
    fo.io_mode = KVX_IO_URING;
    assert_int_equal(kvx_fetch_create(&f, p, &fo), 0); /* depth clamped */
    assert_int_equal(kvx_fetch_submit(f, r, n), 0);
    assert_int_equal(kvx_fetch_wait(f, res, n, -1), 0);
    io_check_trust(r, res, n, NULL);
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);
    assert_int_equal(kvx_fetch_mode(NULL), KVX_IO_AUTO);
    assert_int_equal(kvx_fetch_direct(NULL), 0);
    assert_string_equal(kvx_io_mode_name(77), "unknown");
    kvx_shard_close(in[0]);
    kvx_shard_close(in[1]);
}

static void test_warmup_odd_inputs(void **state)
{
    (void)state;
    alarm(60); /* a FIFO must not block */
    char p_fifo[512], p_dir[512], p_empty[512], p_sparse[512];
    snprintf(p_fifo, sizeof p_fifo, "%s/fifo.kvx", io_tmpdir);
    snprintf(p_dir, sizeof p_dir, "%s/dir.kvx", io_tmpdir);
    snprintf(p_empty, sizeof p_empty, "%s/empty.kvx", io_tmpdir);
    assert_int_equal(mkfifo(p_fifo, 0600), 0);
    assert_int_equal(mkdir(p_dir, 0700), 0);
    int fd = open(p_empty, O_CREAT | O_WRONLY, 0600);
    assert_true(fd >= 0);
    close(fd);
    const char *bad[3] = {p_fifo, p_dir, p_empty};
    for (int i = 0; i < 3; i++) {
        kvx_shard **sh = NULL;
        size_t n = 0;
        int rc = kvx_warmup_collect(&sh, &n, &bad[i], 1);
        if (rc == 0) fail_msg("%s: collected %zu shards", bad[i], n);
        assert_true(rc < 0);
        kvx_shard *s = NULL;
        assert_true(kvx_shard_open(&s, bad[i], 0) < 0);
    }
    /* a shard with a huge sparse tail (1 TiB) */
    kvx_shard *s = io_fresh(p_sparse, sizeof p_sparse);
    kvx_shard_close(s);
    assert_int_equal(truncate(p_sparse, (off_t)1 << 40), 0);
    s = NULL;
    int rc = kvx_shard_open(&s, p_sparse, 0);
    if (rc == 0) {
        kvx_warmup_report rep;
        assert_int_equal(kvx_warmup_run(&rep, &s, 1, NULL), 0);
        assert_int_equal(rep.pages, IO_BASE_N);
        kvx_warmup_report_free(&rep);
        kvx_shard_close(s);
    } else {
        assert_true(rc < 0);
    }
    /* no inputs */
    kvx_warmup_report rep;
    assert_int_equal(kvx_warmup_run(&rep, NULL, 0, NULL), 0);
    assert_int_equal(rep.pages, 0);
    kvx_warmup_report_free(&rep);
    kvx_shard *nul = NULL;
    assert_int_equal(kvx_warmup_run(&rep, &nul, 1, NULL), KVX_EINVALID);
    /* option limits */
    char path[512];
    s = io_fresh(path, sizeof path);
    kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
    o.queue_depth = 63;
    assert_int_equal(kvx_warmup_run(&rep, &s, 1, &o), KVX_EINVALID);
    o.queue_depth = 0;
    o.chunk_bytes = (1u << 30) + 1;
    assert_int_equal(kvx_warmup_run(&rep, &s, 1, &o), KVX_EINVALID);
    o.chunk_bytes = 1;
    assert_int_equal(kvx_warmup_run(&rep, &s, 1, &o), 0);
    assert_int_equal(rep.pages, IO_BASE_N);
    kvx_warmup_report_free(&rep);
    o.chunk_bytes = 0;
    o.sink = 7;
    assert_int_equal(kvx_warmup_run(&rep, &s, 1, &o), KVX_EINVALID);
    o.sink = KVX_SINK_GPU; /* and no kvx_gpu given */
    int ngpu = 0;
    assert_int_equal(kvx_warmup_run(&rep, &s, 1, &o), kvx_gpu_count(&ngpu) == KVX_ENOCUDA ? KVX_ENOCUDA : KVX_EINVALID);
    kvx_shard_close(s);
    alarm(0);
}

/* A store of three flushed shards whose second shard file is replaced by
 * a FIFO, a directory, a 0-byte file, a 1 TiB sparse file (the shard,
 * extended) or the shard cut in half; kvx_warmup_collect of the store and
 * a warmup of what it returns run in a child with a deadline: a distinct
 * error or a consistent report, never a hang or a crash. */
static int planted_child(const char *dir)
{
    kvx_shard **sh = NULL;
    size_t n = 0;
    const char *paths[1] = {dir};
    int rc = kvx_warmup_collect(&sh, &n, paths, 1);
    if (rc > 0) return 1;
    if (rc) return 0; /* refused with an error */
    uint64_t need;
    if (kvx_warmup_sink_bytes(&need, sh, n)) return 2;
    uint8_t *buf = malloc(need ? need : 1);
    for (int m = 0; m < 3; m++) {
        kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
        o.io_mode = m;
        o.sink = KVX_SINK_HOST;
        o.host_buf = buf;
        o.host_buf_bytes = need;
        kvx_warmup_report rep;
        rc = kvx_warmup_run(&rep, sh, n, &o);
        if (rc > 0) return 3;
        if (rc == 0) {
            uint64_t total = 0;
            for (size_t i = 0; i < n; i++) total += kvx_shard_get_info(sh[i])->num_blocks;
            if (rep.pages + rep.io_failures + rep.crc_failures != total) return 4;
            kvx_warmup_report_free(&rep);
        }
    }
    free(buf);
    for (size_t i = 0; i < n; i++) kvx_shard_close(sh[i]);
    free(sh);
    return 0;
}

static void test_warmup_store_planted(void **state)
{
    (void)state;
    for (int kind = 0; kind < 5; kind++) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/store%d", io_tmpdir, kind);
        kvx_store_options so = KVX_STORE_OPTIONS_INIT;
        so.geometry = su_geometry();
        so.capacity_bytes = 1 << 30;
        so.flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC;
        kvx_store *st = NULL;
        assert_int_equal(kvx_store_create(&st, dir, &so), 0);
        for (uint64_t q = 1; q <= 3; q++) assert_int_equal(su_put_seq(st, q, 8), 0);
        kvx_store_close(st);
        char names[8][64];
        size_t nn = su_list_names(dir, "shards", names, 8);
        assert_true(nn >= 2);
        char victim[800];
        snprintf(victim, sizeof victim, "%s/shards/%s", dir, names[1]);
        if (kind == 0) {
            assert_int_equal(unlink(victim), 0);
            assert_int_equal(mkfifo(victim, 0600), 0);
        } else if (kind == 1) {
            assert_int_equal(unlink(victim), 0);
            assert_int_equal(mkdir(victim, 0700), 0);
        } else if (kind == 2) {
            assert_int_equal(truncate(victim, 0), 0);
        } else if (kind == 3) {
            assert_int_equal(truncate(victim, (off_t)1 << 40), 0);
        } else {
            struct stat sb;
            assert_int_equal(stat(victim, &sb), 0);
            assert_int_equal(truncate(victim, sb.st_size / 2), 0);
        }
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            alarm(60);
            _exit(planted_child(dir));
        }
        int ws = 0;
        assert_int_equal(waitpid(pid, &ws, 0), pid);
        if (!WIFEXITED(ws)) fail_msg("planted kind %d: the child died of signal %d", kind, WTERMSIG(ws));
        if (WEXITSTATUS(ws)) fail_msg("planted kind %d: step %d failed", kind, WEXITSTATUS(ws));
    }
}

/* PROMISE: IO-11 */
static void test_warmup_cancel(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    kvx_shard *many[64];
    for (int i = 0; i < 64; i++) many[i] = s;
    uint64_t need;
    assert_int_equal(kvx_warmup_sink_bytes(&need, many, 64), 0);
    uint8_t *buf = malloc(need);
    assert_non_null(buf);
    int fd0 = io_count_fds();
    for (int v = 0; v < 12; v++) {
        kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
        o.io_mode = v % 3;
        o.chunk_bytes = 8192;
        o.queue_depth = 2;
        o.sink = v % 2 ? KVX_SINK_HOST : KVX_SINK_DISCARD;
        o.host_buf = buf;
        o.host_buf_bytes = need;
        kvx_warmup *w = NULL;
        assert_int_equal(kvx_warmup_start(&w, many, 64, &o), 0);
        kvx_warmup_report rep;
        if (v % 4 == 0) assert_int_equal(kvx_warmup_wait(&rep, w, 0) == -ETIMEDOUT || 1, 1);
        assert_int_equal(kvx_warmup_cancel(w), 0);
        assert_int_equal(kvx_warmup_cancel(w), 0);
        int rc = kvx_warmup_wait(&rep, w, 60000);
        assert_int_equal(rc, 0);
        kvx_warmup_progress pr;
        assert_int_equal(kvx_warmup_get_progress(&pr, w), 0);
        assert_int_equal(pr.finished, 1);
        assert_true(rep.pages <= 64 * IO_BASE_N);
        assert_int_equal(rep.crc_failures, 0);
        assert_int_equal(rep.io_failures, 0);
        kvx_warmup_report_free(&rep);
        /* wait again after the end: same answer, no crash */
        assert_int_equal(kvx_warmup_wait(&rep, w, 0), 0);
        kvx_warmup_report_free(&rep);
        const uint64_t *dp;
        size_t dn;
        assert_int_equal(kvx_warmup_device_pages(&dp, &dn, w), KVX_EINVALID);
        kvx_warmup_destroy(w);
        /* destroy while running */
        assert_int_equal(kvx_warmup_start(&w, many, 64, &o), 0);
        kvx_warmup_destroy(w);
    }
    assert_int_equal(io_count_fds(), fd0);
    free(buf);
    kvx_shard_close(s);
}

/* The group's setup and teardown: each fixture's, in order. */
static int setup_all(void **state)
{
    if (group_setup(state)) return -1;
    if (io_setup(state)) return -1;
    if (io_base_setup(state)) return -1;
    return 0;
}

static int teardown_all(void **state)
{
    io_base_teardown(state);
    io_teardown(state);
    group_teardown(state);
    return 0;
}

/* A shard holding tombstones (keyed deletes: no page) warms cleanly on
 * each path: the tombstones have no place in the sink and are never read,
 * every page arrives at its place, none is counted failed; the sink is
 * the pages alone. */
/* PROMISE: IO-11 */
static void test_warmup_skips_tombstones(void **state)
{
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/commit.kvx", io_tmpdir);
    cm_write(path);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, 0), 0);
    /* pages 0, 2 and 3 at 0, 256 and 256 + 4096, each at the next multiple of 256 */
    const uint64_t at[CM_N] = {0, 0, 256, 256 + CM_PB, 0};
    uint64_t need = 0;
    assert_int_equal(kvx_warmup_sink_bytes(&need, &s, 1), 0);
    assert_int_equal(need, 256 + CM_PB + 7);
    static const int modes[] = {KVX_IO_PREAD, KVX_IO_URING, KVX_IO_AUTO};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        uint8_t *sink = malloc(need);
        assert_non_null(sink);
        memset(sink, 0xAA, need);
        kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
        o.sink = KVX_SINK_HOST;
        o.host_buf = sink;
        o.host_buf_bytes = need;
        o.io_mode = modes[m];
        kvx_warmup_report rep;
        int rc = kvx_warmup_run(&rep, &s, 1, &o);
        if (rc == -EPERM || rc == -ENOSYS) { /* io_uring refused here */
            free(sink);
            continue;
        }
        assert_int_equal(rc, 0);
        assert_int_equal(rep.pages, CM_PAGES);
        assert_int_equal(rep.bytes, 100 + CM_PB + 7);
        assert_int_equal(rep.crc_failures, 0);
        assert_int_equal(rep.io_failures, 0);
        assert_int_equal(rep.n_failures, 0);
        for (uint32_t i = 0; i < CM_N; i++)
            for (uint32_t k = 0; k < cm_lens[i]; k++)
                if (sink[at[i] + k] != cm_byte(i, k)) fail_msg("mode %d: entry %u byte %u", modes[m], i, k);
        kvx_warmup_report_free(&rep);
        free(sink);
    }
    kvx_warmup_report rep;
    assert_int_equal(kvx_warmup_run(&rep, &s, 1, NULL), 0); /* discard sink: checked only */
    assert_int_equal(rep.pages, CM_PAGES);
    assert_int_equal(rep.n_failures, 0);
    kvx_warmup_report_free(&rep);
    kvx_shard_close(s);
    unlink(path);
}

int main(int argc, char **argv)
{
    /* these tests count or damage the files one flush writes as its own
     * shard file: the active shard has its own, tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_uring),
        cmocka_unit_test(test_host_uring_small_chunks),
        cmocka_unit_test(test_host_uring_buffered),
        cmocka_unit_test(test_host_pread),
        cmocka_unit_test(test_host_forced_fallback),
        cmocka_unit_test(test_no_verify),
        cmocka_unit_test(test_auto_policy),
        cmocka_unit_test(test_discard_checksum),
        cmocka_unit_test(test_crc_uring),
        cmocka_unit_test(test_crc_pread),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_async),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_store_collect),
        cmocka_unit_test(test_evicted_uring),
        cmocka_unit_test(test_evicted_pread),
        cmocka_unit_test_setup(test_warmup_tier_view, os_reset),
        cmocka_unit_test_setup(test_concurrent_warmups_and_fetch, os_reset),
        cmocka_unit_test_setup(test_warmup_flip_host_sink, os_reset),
        cmocka_unit_test_setup(test_warmup_truncated_and_faults, os_reset),
        cmocka_unit_test_setup(test_warmup_report_consistent, os_reset),
        cmocka_unit_test_setup(test_warmup_odd_inputs, os_reset),
        cmocka_unit_test_setup(test_warmup_store_planted, os_reset),
        cmocka_unit_test_setup(test_warmup_cancel, os_reset),
        cmocka_unit_test_setup(test_warmup_skips_tombstones, os_reset),
    };
    return cmocka_run_group_tests_name("io/warmup", tests, setup_all, teardown_all);
}
