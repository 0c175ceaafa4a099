/*
 * test_warmup.c - bulk warmup into the host sink on each I/O path: the
 * bytes delivered equal the file's pages (read back with plain pread at
 * the entries' offsets), the report's counts and io mode are right, a
 * page failing its CRC is counted, named (path, entry, code) and not
 * delivered (its sink range is untouched), truncated pages are reported,
 * the progress callback ends at the totals, the poll form (start /
 * progress / cancel / wait) works, a store directory is collected and
 * warmed, the GPU sink answers clearly without CUDA, and KVX_IO_AUTO picks
 * buffered pread workers for cached data and O_DIRECT io_uring for cold.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/io.h"
#include "kvx.h"

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

static void test_crc_uring(void **state) { (void)state; crc_case(KVX_IO_URING); }
static void test_crc_pread(void **state) { (void)state; crc_case(KVX_IO_PREAD); }

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
static void make_store(char *dir, size_t cap, const char *name, uint32_t tok_base, uint32_t fill_base)
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
    make_store(dir, sizeof dir, "store", 1, 50);

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
    make_store(dir, sizeof dir, name, 7, 60);

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

int main(void)
{
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
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
