/*
 * io.h - the data-path fixture (tests/io/): a temporary directory and
 * tiny shards written with the real kvx_shard_writer, whose page bytes
 * are a function of (shard, entry, byte) so a test can check any page it
 * gets back without keeping it; and the damage steps of the tests of bad
 * files (a copy of a shard, a flipped byte). Results are 0 or -1; the
 * base-shard helpers at the end assert (cmocka).
 *
 * Geometry: FP16, L = 2, Hkv = 2, D = 64, so a page of n tokens is
 * 1024 * n bytes; token counts vary (1..16) so some pages end on a 4096
 * boundary and some leave padding, which is what coalescing must respect.
 */
#ifndef KVX_IO_FIXTURE_H
#define KVX_IO_FIXTURE_H

#include <dirent.h>
#include <errno.h>
#include <time.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvx.h"

static char io_tmpdir[256];

static inline int io_mkdtemp(const char *tag)
{
    if (io_tmpdir[0]) return 0; /* made already (one directory per program) */
    snprintf(io_tmpdir, sizeof io_tmpdir, "/tmp/kvx_%s.XXXXXX", tag);
    return mkdtemp(io_tmpdir) ? 0 : -1;
}

/* A group setup and teardown: io_tmpdir made (io_mkdtemp), then removed
 * with everything in it. */
static inline void io_rm_rf(const char *dir);

static inline int io_setup(void **state)
{
    (void)state;
    unsetenv("KVX_IO_FORCE_NO_URING");
    return io_mkdtemp("test_io");
}

static inline int io_teardown(void **state)
{
    (void)state;
    io_rm_rf(io_tmpdir);
    return 0;
}

static inline void io_rm_rf(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[1024];
        if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= sizeof p) continue;
        if (e->d_type == DT_DIR)
            io_rm_rf(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static inline kvx_geometry io_geometry(void)
{
    kvx_geometry g = {2, 2, 64, 16, KVX_QUANT_FP16, 0x1234};
    return g;
}

/* Tokens of entry i: 1..16, in a pattern with both padded and exact pages. */
static inline uint32_t io_tokens(uint32_t i) { return (i * 7 + 3) % 16 + 1; }

static inline uint8_t io_byte(uint32_t shard, uint32_t entry, uint64_t k)
{
    uint64_t x = (uint64_t)shard * 0x9E3779B97F4A7C15ull ^ (uint64_t)entry * 0xC2B2AE3D27D4EB4Full ^ k;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    return (uint8_t)(x >> 32);
}

static inline void io_fill(uint8_t *p, uint32_t shard, uint32_t entry, uint64_t n)
{
    for (uint64_t k = 0; k < n; k++) p[k] = io_byte(shard, entry, k);
}

static inline int io_page_ok(const void *page, uint32_t shard, uint32_t entry, uint64_t n)
{
    const uint8_t *p = page;
    for (uint64_t k = 0; k < n; k++)
        if (p[k] != io_byte(shard, entry, k)) return 0;
    return 1;
}

/* Copies file from to file to (created or truncated). */
static inline int io_copy_file(const char *from, const char *to)
{
    int a = open(from, O_RDONLY), b = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int rc = a >= 0 && b >= 0 ? 0 : -1;
    char buf[65536];
    ssize_t k;
    while (!rc && (k = read(a, buf, sizeof buf)) > 0)
        if (write(b, buf, (size_t)k) != k) rc = -1;
    if (a >= 0) close(a);
    if (b >= 0) close(b);
    return rc;
}

/* A copy of from at io_tmpdir/name (its path in path), opened: the shard
 * is checked while whole, so damage done afterwards shows at read time.
 * Returns 0 or the failing step's result. */
static inline int io_open_copy(kvx_shard **out, char *path, size_t cap, const char *from, const char *name)
{
    snprintf(path, cap, "%s/%s", io_tmpdir, name);
    if (io_copy_file(from, path)) return -1;
    return kvx_shard_open(out, path, 0);
}

/* XORs the byte at off of path with mask, in place. */
static inline int io_flip_byte(const char *path, uint64_t off, uint8_t mask)
{
    int fd = open(path, O_RDWR);
    if (fd < 0) return -1;
    uint8_t x;
    int rc = pread(fd, &x, 1, (off_t)off) == 1 ? 0 : -1;
    x ^= mask;
    if (!rc && pwrite(fd, &x, 1, (off_t)off) != 1) rc = -1;
    close(fd);
    return rc;
}

/* Writes dir/name with n entries of shard byte shard_id; returns the
 * writer's result. tokens (nullable) overrides io_tokens for every entry. */
static inline int io_make_shard(char *out_path, size_t cap, const char *dir, const char *name,
                                uint8_t shard_id, uint32_t n, uint32_t tokens)
{
    snprintf(out_path, cap, "%s/%s", dir, name);
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = io_geometry();
    o.shard_id = shard_id;
    o.max_entries = n;
    kvx_shard_writer *w = NULL;
    int rc = kvx_shard_writer_create(&w, out_path, &o);
    if (rc) return rc;
    uint8_t *page = malloc(kvx_page_bytes(&o.geometry, 16 > tokens ? 16 : tokens));
    if (!page) {
        kvx_shard_writer_abort(w);
        return -12;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t t = tokens ? tokens : io_tokens(i);
        kvx_entry_in e = {0};
        e.radix_block = (uint16_t)i;
        e.token_count = t;
        io_fill(page, shard_id, i, kvx_page_bytes(&o.geometry, t));
        e.page = page;
        if ((rc = kvx_shard_writer_add(w, &e))) {
            free(page);
            kvx_shard_writer_abort(w);
            return rc;
        }
    }
    free(page);
    return kvx_shard_writer_seal(w);
}


/* ---- the base shard (with cmocka) ----
 * A test program whose group setup is io_base_setup has io_tmpdir and in
 * it a base shard of IO_BASE_N pages (shard 7); each test takes fresh
 * copies of it (io_fresh), so damage never outlives a test. These helpers
 * assert: include cmocka.h first. */
#define IO_BASE_N 40

static char io_base_path[512] __attribute__((unused));
static int io_copy_counter __attribute__((unused));

/* The group setup of a test program on the base shard. */
static inline int io_base_setup(void **state)
{
    if (io_setup(state)) return -1;
    if (io_make_shard(io_base_path, sizeof io_base_path, io_tmpdir, "base.kvx", 7, IO_BASE_N, 0)) return -1;
    return 0;
}

static inline int io_base_teardown(void **state) { return io_teardown(state); }

/* A fresh copy of the base shard (its path in path), opened. */
static inline kvx_shard *io_fresh(char *path, size_t cap)
{
    char name[64];
    snprintf(name, sizeof name, "c%d.kvx", io_copy_counter++);
    kvx_shard *s = NULL;
    assert_int_equal(io_open_copy(&s, path, cap, io_base_path, name), 0);
    return s;
}

/* A pool of that many bytes. */
static inline kvx_pool *io_pool(uint64_t bytes)
{
    kvx_pool_options o = KVX_POOL_OPTIONS_INIT;
    o.bytes = bytes;
    kvx_pool *p = NULL;
    assert_int_equal(kvx_pool_create(&p, &o), 0);
    return p;
}

/* A fetch on p (2 threads); skips the test where io_uring is refused. */
static inline kvx_fetch *io_fetch(kvx_pool *p, int mode, uint32_t qd, uint32_t flags, uint32_t max_read)
{
    kvx_fetch_options o = KVX_FETCH_OPTIONS_INIT;
    o.io_mode = mode;
    o.queue_depth = qd;
    o.flags = flags;
    o.max_read_bytes = max_read;
    o.threads = 2;
    kvx_fetch *f = NULL;
    int rc = kvx_fetch_create(&f, p, &o);
    if (rc == -EPERM || rc == -ENOSYS) {
        kvx_pool_destroy(p);
        skip();
    }
    assert_int_equal(rc, 0);
    return f;
}

/* The pool's free bytes. */
static inline uint64_t io_pool_free(kvx_pool *p)
{
    kvx_pool_info i;
    assert_int_equal(kvx_pool_get_info(&i, p), 0);
    return i.free_bytes;
}

/* The trust check: a page of a base-shard copy reported 0 has
 * exactly the bytes written. */
static inline void io_check_trust(const kvx_fetch_req *r, const kvx_fetch_result *res, size_t n, size_t *n_ok)
{
    size_t ok = 0;
    for (size_t i = 0; i < n; i++) {
        if (res[i].status != 0) continue;
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, r[i].shard, r[i].entry), 0);
        assert_int_equal(res[i].bytes, e.bytes);
        if (!io_page_ok(res[i].page, 7, r[i].entry, e.bytes))
            fail_msg("request %zu (entry %u) reported 0 with wrong bytes", i, r[i].entry);
        ok++;
    }
    if (n_ok) *n_ok = ok;
}

/* A request for every page of s, a copy of the base shard. */
static inline size_t io_every_page(kvx_fetch_req *r, kvx_shard *s)
{
    for (uint32_t i = 0; i < IO_BASE_N; i++) r[i] = (kvx_fetch_req){s, i};
    return IO_BASE_N;
}

/* Monotonic seconds. */
static inline double io_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The process's open descriptors (and one for the listing itself). */
static inline int io_count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

/* ---- shared by the data path's tests ---- */

int kvx_shard_mem(kvx_shard **out, const kvx_geometry *g, uint32_t n, void **pages, const uint64_t *hashes,
                  const uint64_t *parents, const uint32_t *tokens, const uint8_t *digests, const float *scales);

enum { MEM_N = 5 };

/* A shard as a shared-tier lookup makes it (kvx_shard_mem: pages on the
 * heap, no file), of io_geometry, its pages io_fill(tag, entry). */
static inline kvx_shard *mem_shard(uint32_t tag)
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

typedef struct thr {
    kvx_pool *p;
    kvx_shard *s;
    int mode, fails;
} thr;

/* A thread that fetches every page of t->s 60 times through its own fetch
 * handle on the shared pool t->p, counting wrong pages in t->fails. */
static inline void *thr_main(void *arg)
{
    thr *t = arg;
    kvx_fetch_options o = KVX_FETCH_OPTIONS_INIT;
    o.io_mode = t->mode;
    o.queue_depth = 4;
    o.max_read_bytes = 8192;
    kvx_fetch *f = NULL;
    if (kvx_fetch_create(&f, t->p, &o)) {
        t->fails = -1;
        return NULL;
    }
    kvx_fetch_req r[IO_BASE_N];
    kvx_fetch_result res[IO_BASE_N];
    for (int k = 0; k < 60; k++) {
        size_t n = io_every_page(r, t->s);
        int rc = kvx_fetch_submit(f, r + (k % 5), n - (size_t)(k % 5));
        if (rc == KVX_ECAPACITY) continue; /* the other thread holds the pool */
        if (rc || kvx_fetch_wait(f, res, n - (size_t)(k % 5), -1)) {
            t->fails++;
            continue;
        }
        for (size_t i = 0; i < n - (size_t)(k % 5); i++)
            if (res[i].status || !io_page_ok(res[i].page, 7, r[i + (size_t)(k % 5)].entry, res[i].bytes)) t->fails++;
        if (k % 3 == 0) kvx_fetch_release(f);
    }
    kvx_fetch_destroy(f);
    return NULL;
}

#endif
