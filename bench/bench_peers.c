/*
 * bench_peers.c - kvx side by side with what engine teams persist KV in
 * today (issue 16), on the same machine, pages, keys and durability, in
 * one run (bench/RESULTS.md, "## Peers (issue 16)"):
 *
 *   kvx               kvx_store_put + kvx_store_flush per prompt,
 *                     kvx_store_prefix (hash, parent, tokens and the
 *                     SHA-256 prefix digest checked: verified blocks)
 *   file per block    one file per block named by its chained FNV hash in
 *                     a 256-way directory fan-out (SGLang HiCacheFile,
 *                     LMCache local_disk, llm-d fs): temp file, fsync,
 *                     rename, each touched directory fsynced once per
 *                     prompt; found again after a restart by scanning
 *   RocksDB (BlobDB)  Debian's librocksdb-dev through rocksdb/c.h:
 *                     enable_blob_files, min_blob_size 0, no compression,
 *                     one synced write batch per prompt
 *   LMDB values       the page as the value (MDB_RESERVE), one synced
 *                     commit per prompt
 *
 * The three peers are keyed by the FNV hash alone: a colliding prompt
 * (FNV-1a collides on purpose in seconds) gets another prompt's pages.
 * They serve unverified blocks; the table says so.
 *
 * Rows, per peer (its files removed before the next peer starts):
 *   put MB/s      durable put throughput (64 blocks a prompt, one durable
 *                 flush/commit/fsync round per prompt)
 *   restart ms    the page cache dropped for the peer's files
 *                 (posix_fadvise DONTNEED), then a new process (fork +
 *                 exec of this program) opens the store and serves the
 *                 first prompt: fork to that first hit
 *   cold GB/s     the cache dropped again, the store opened in this
 *                 process (not timed), every prompt's pages read once;
 *                 for kvx, when fio is on PATH, the disk's own figure
 *                 right after: fio reading kvx's shard files (the same
 *                 bytes) sequentially, O_DIRECT, io_uring, --fio-bs and
 *                 --fio-depth (1 MiB, 32), and kvx cold / fio; and
 *                 after the warm rows (kvx's mappings gone), fio's mmap
 *                 engine reading them through the page cache, as kvx's
 *                 default read does (kvx cold / fio mmap)
 *   p50/p99 us    warm prefix get of a 64-block prompt: hashes, lookups
 *                 and the pages copied into one host buffer
 *   space amp     bytes on disk (st_blocks) over bytes of KV
 *   trace         the Mooncake conversation trace replayed at one capacity
 *                 (in blocks): the three peers behind the same exact block
 *                 LRU kept by this program (evicted blocks deleted in the
 *                 request's durable round), kvx with its own eviction and
 *                 capacity_bytes = capacity x the bytes a block takes in a
 *                 shard by the format; prefix hit ratio and bytes written
 *                 (/proc/self/io write_bytes) per peer, and kvx's bytes
 *                 split by why (first writes, carries, merges, tables and
 *                 records, catalog: the store's and the index's counters)
 *
 *   bench_peers [--mode all|rows|restart|trace] [--size small|large]
 *               [--blocks N] [--only PEER] [--trace FILE] [--trace-requests N]
 *               [--trace-capacity N] [--fio-bs BYTES] [--fio-depth N] [--no-fio]
 *               [--rounds N] [--kvx-views] [--kvx-direct] [--kvx-hold-lru] [--kvx-holes] [--tsv FILE] DIR
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"
#include "kvx.h"
#include "engine/store.h" /* the store's bytes written, by why (library internal) */
#include "format/hash.h"   /* kvx_block_hashes_multi (library internal) */
#include "index/index.h"   /* the catalog's bytes written (library internal) */

#include <json-c/json.h>

#ifdef KVX_BENCH_ROCKSDB
#include <rocksdb/c.h>
#endif

#define NB 64 /* blocks per prompt */

enum { P_KVX, P_FILE, P_ROCKS, P_LMDB, P_COUNT };
static const char *const peer_name[P_COUNT] = {"kvx", "file per block", "RocksDB (BlobDB)",
                                               "LMDB values"};

static kvx_geometry g_geo;
static const char *g_size = "small";
static uint32_t g_B;
static uint64_t g_pb;      /* page bytes */
static size_t g_prompts;   /* prompts of NB blocks */
static uint32_t *g_toks;   /* g_prompts * NB * B */
static uint64_t *g_hashes; /* g_prompts * NB */
static unsigned char *g_pages; /* one prompt's pages */
static unsigned char *g_dst;   /* where a get copies one prompt's pages */
static int g_nosync;           /* building a data set only (--mode restart): no syncs */
static int g_trace_mode;       /* the trace replay: no key set, deletes */
static long g_fio_bs = 1 << 20; /* the fio reference's block size (--fio-bs) */
static long g_fio_depth = 32;   /* and its queue depth (--fio-depth) */
static int g_kvx_views;         /* --kvx-views: kvx_store_prefix's views + memcpy (the rows before the prefix read) */
static int g_kvx_direct;        /* --kvx-direct: kvx_store_prefix_read with KVX_PREFIX_READ_DIRECT */
static int g_kvx_hold_lru;      /* --kvx-hold-lru: the trace's kvx capacity x 64/63 (its goal = the LRU's blocks) */
static int g_kvx_holes;         /* --kvx-holes: kvx's writer evicts in place (KVX_STORE_HOLES) */
static int g_fio = 1;           /* --no-fio: leave the reference out */
static long g_rounds = 1;       /* --rounds N: kvx's row and fio's references N times, alternated */

static void fail(const char *what, int rc)
{
    fprintf(stderr, "bench_peers: %s: %s (%s)\n", what, kvx_strerror(rc), kvx_last_error());
    exit(1);
}

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Prompt q's pages: pseudo-random bytes, masked so no e4m3 or bf16 value
 * is NaN or inf; the same bytes for every peer. */
static void fill_pages(unsigned char *pages, size_t npages, size_t q)
{
    uint64_t *w = (uint64_t *)(void *)pages;
    size_t n = (size_t)(g_pb * npages / 8);
    for (size_t i = 0; i < n; i++) w[i] = mix(q * 0x100000000ull + i) & 0x7777777777777777ull;
}

static const uint32_t *toks_of(size_t q) { return g_toks + q * NB * g_B; }

static void gen_tokens(size_t q, uint32_t *t)
{
    for (size_t i = 0; i < (size_t)NB * g_B; i++) t[i] = (uint32_t)mix(q * 1000003u + i);
}

static void rm_rf(const char *p)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    if (system(cmd)) {
    }
}

/* Bytes this process (all its threads) had sent to the storage layer:
 * /proc/self/io write_bytes, counted when a page is dirtied. */
static uint64_t io_write_bytes(void)
{
    FILE *f = fopen("/proc/self/io", "r");
    char line[256];
    uint64_t v = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "write_bytes:", 12)) v = strtoull(line + 12, NULL, 10);
    fclose(f);
    return v;
}

/* ------------------------------------------------------------ disk walk */

static uint64_t g_walk_bytes;
static int g_walk_drop;

static int walk_fn(const char *path, const struct stat *st, int type, struct FTW *f)
{
    (void)f;
    g_walk_bytes += (uint64_t)st->st_blocks * 512u;
    if (type == FTW_F && g_walk_drop) {
        int fd = open(path, O_RDONLY);
        if (fd >= 0) {
            (void)fdatasync(fd);
            (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
    }
    return 0;
}

/* Bytes on disk under dir; drop != 0 also evicts its files' cached pages. */
static uint64_t walk(const char *dir, int drop)
{
    g_walk_bytes = 0;
    g_walk_drop = drop;
    nftw(dir, walk_fn, 64, FTW_PHYS);
    return g_walk_bytes;
}

/* ------------------------------------------------------------ the peers */

typedef struct peer {
    int kind;
    char dir[1024];
    kvx_store *kvx;
    kvx_view *views;
    size_t nviews;
    uint64_t kvx_capacity; /* 0: large enough for every row */
    /* file per block: the in-memory key set (sorted on demand) */
    uint64_t *keys;
    size_t nkeys, capkeys;
    int sorted;
#ifdef KVX_BENCH_ROCKSDB
    rocksdb_t *rdb;
    rocksdb_options_t *ropt;
    rocksdb_writeoptions_t *rw;
    rocksdb_readoptions_t *rr;
#endif
    MDB_env *env;
    MDB_dbi dbi;
    MDB_txn *rtxn;
} peer;

static void keys_add(peer *p, uint64_t h)
{
    if (p->nkeys == p->capkeys) {
        p->capkeys = p->capkeys ? p->capkeys * 2 : 4096;
        p->keys = realloc(p->keys, p->capkeys * sizeof *p->keys);
        if (!p->keys) fail("realloc", -ENOMEM);
    }
    p->keys[p->nkeys++] = h;
    p->sorted = 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int keys_has(peer *p, uint64_t h)
{
    if (!p->sorted) {
        qsort(p->keys, p->nkeys, sizeof *p->keys, cmp_u64);
        p->sorted = 1;
    }
    return bsearch(&h, p->keys, p->nkeys, sizeof h, cmp_u64) != NULL;
}

static void fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || fsync(fd)) fail(path, -errno);
    close(fd);
}

/* Opens (create != 0: creates) the peer's store in p->dir. */
static void peer_open(peer *p, int create)
{
    char path[1100];
    switch (p->kind) {
    case P_KVX: {
        int rc;
        if (create) {
            kvx_store_options o;
            kvx_store_options_init(&o);
            o.geometry = g_geo;
            o.capacity_bytes =
                p->kvx_capacity ? p->kvx_capacity : g_pb * NB * g_prompts * 2 + ((uint64_t)1 << 30);
            if (g_nosync) o.flags |= KVX_STORE_NOSYNC;
            if (g_kvx_holes) o.flags |= KVX_STORE_HOLES;
            rc = kvx_store_create(&p->kvx, p->dir, &o);
        } else {
            rc = kvx_store_open(&p->kvx, p->dir, &g_geo, g_kvx_holes ? KVX_STORE_HOLES : 0);
        }
        if (rc) fail("kvx open", rc);
        break;
    }
    case P_FILE:
        p->nkeys = 0;
        if (create) {
            if (mkdir(p->dir, 0700)) fail(p->dir, -errno);
            for (int i = 0; i < 256; i++) {
                snprintf(path, sizeof path, "%s/%02x", p->dir, i);
                if (mkdir(path, 0700)) fail(path, -errno);
            }
            fsync_path(p->dir);
        } else { /* as those backends do: scan the directories for the keys */
            for (int i = 0; i < 256; i++) {
                snprintf(path, sizeof path, "%s/%02x", p->dir, i);
                DIR *d = opendir(path);
                if (!d) fail(path, -errno);
                struct dirent *e;
                while ((e = readdir(d))) {
                    char *end;
                    if (e->d_name[0] == '.') continue;
                    uint64_t h = strtoull(e->d_name, &end, 16);
                    if (*end == 0) keys_add(p, h);
                }
                closedir(d);
            }
        }
        break;
#ifdef KVX_BENCH_ROCKSDB
    case P_ROCKS: {
        char *err = NULL;
        p->ropt = rocksdb_options_create();
        rocksdb_options_set_create_if_missing(p->ropt, 1);
        rocksdb_options_set_enable_blob_files(p->ropt, 1);
        rocksdb_options_set_min_blob_size(p->ropt, 0);
        rocksdb_options_set_blob_compression_type(p->ropt, rocksdb_no_compression);
        rocksdb_options_set_compression(p->ropt, rocksdb_no_compression);
        /* deleted values' space comes back through blob GC at compaction */
        rocksdb_options_set_enable_blob_gc(p->ropt, 1);
        p->rdb = rocksdb_open(p->ropt, p->dir, &err);
        if (err) {
            fprintf(stderr, "bench_peers: rocksdb_open: %s\n", err);
            exit(1);
        }
        p->rw = rocksdb_writeoptions_create();
        rocksdb_writeoptions_set_sync(p->rw, !g_nosync);
        p->rr = rocksdb_readoptions_create();
        break;
    }
#endif
    case P_LMDB: {
        int rc;
        if (create && mkdir(p->dir, 0700)) fail(p->dir, -errno);
        if ((rc = mdb_env_create(&p->env))) fail("mdb_env_create", rc);
        mdb_env_set_mapsize(p->env, (size_t)(g_pb * NB * g_prompts * 2 + ((uint64_t)2 << 30)));
        if ((rc = mdb_env_open(p->env, p->dir, g_nosync ? MDB_NOSYNC : 0, 0600))) fail("mdb_env_open", rc);
        MDB_txn *t;
        if ((rc = mdb_txn_begin(p->env, NULL, 0, &t)) || (rc = mdb_dbi_open(t, NULL, 0, &p->dbi)) ||
            (rc = mdb_txn_commit(t)))
            fail("mdb open", rc);
        if ((rc = mdb_txn_begin(p->env, NULL, MDB_RDONLY, &p->rtxn))) fail("mdb rtxn", rc);
        mdb_txn_reset(p->rtxn);
        break;
    }
    default:
        break;
    }
}

static void peer_close(peer *p)
{
    switch (p->kind) {
    case P_KVX:
        kvx_store_close(p->kvx);
        p->kvx = NULL;
        break;
    case P_FILE:
        break;
#ifdef KVX_BENCH_ROCKSDB
    case P_ROCKS: {
        char *err = NULL;
        rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
        rocksdb_flushoptions_set_wait(fo, 1);
        rocksdb_flush(p->rdb, fo, &err); /* so the space row sees blob files, not the WAL */
        rocksdb_flushoptions_destroy(fo);
        free(err);
        rocksdb_close(p->rdb);
        rocksdb_readoptions_destroy(p->rr);
        rocksdb_writeoptions_destroy(p->rw);
        rocksdb_options_destroy(p->ropt);
        p->rdb = NULL;
        break;
    }
#endif
    case P_LMDB:
        mdb_txn_abort(p->rtxn);
        mdb_env_close(p->env);
        p->env = NULL;
        break;
    default:
        break;
    }
}

/* One durable round of a peer other than kvx: n pages under their hashes
 * h (pages contiguous), then ndel hashes deleted (the trace's evictions). */
static void peer_write(peer *p, const uint64_t *h, const unsigned char *pages, size_t n, const uint64_t *del,
                       size_t ndel)
{
    switch (p->kind) {
    case P_FILE: {
        unsigned char touched[256] = {0};
        char tmp[1100], path[1100];
        for (size_t i = 0; i < n; i++) {
            unsigned fan = (unsigned)(h[i] >> 56);
            snprintf(tmp, sizeof tmp, "%s/%02x/.tmp.%016" PRIx64, p->dir, fan, h[i]);
            snprintf(path, sizeof path, "%s/%02x/%016" PRIx64, p->dir, fan, h[i]);
            int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd < 0) fail(tmp, -errno);
            const unsigned char *src = pages + i * g_pb;
            for (uint64_t off = 0; off < g_pb;) {
                ssize_t w = pwrite(fd, src + off, g_pb - off, (off_t)off);
                if (w <= 0) fail("pwrite", -errno);
                off += (uint64_t)w;
            }
            if (!g_nosync && fsync(fd)) fail("fsync", -errno);
            close(fd);
            if (rename(tmp, path)) fail("rename", -errno);
            touched[fan] = 1;
            if (!g_trace_mode) keys_add(p, h[i]);
        }
        for (size_t i = 0; i < ndel; i++) { /* a cache's delete need not be durable */
            snprintf(path, sizeof path, "%s/%02x/%016" PRIx64, p->dir, (unsigned)(del[i] >> 56), del[i]);
            if (unlink(path)) fail(path, -errno);
        }
        for (int f = 0; f < 256 && !g_nosync; f++) {
            if (!touched[f]) continue;
            snprintf(path, sizeof path, "%s/%02x", p->dir, f);
            fsync_path(path);
        }
        break;
    }
#ifdef KVX_BENCH_ROCKSDB
    case P_ROCKS: {
        char *err = NULL;
        rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
        for (size_t i = 0; i < n; i++)
            rocksdb_writebatch_put(wb, (const char *)&h[i], 8, (const char *)pages + i * g_pb, (size_t)g_pb);
        for (size_t i = 0; i < ndel; i++) rocksdb_writebatch_delete(wb, (const char *)&del[i], 8);
        rocksdb_write(p->rdb, p->rw, wb, &err);
        rocksdb_writebatch_destroy(wb);
        if (err) {
            fprintf(stderr, "bench_peers: rocksdb_write: %s\n", err);
            exit(1);
        }
        break;
    }
#endif
    case P_LMDB: {
        MDB_txn *t;
        int rc = mdb_txn_begin(p->env, NULL, 0, &t);
        if (rc) fail("mdb_txn_begin", rc);
        for (size_t i = 0; i < n && !rc; i++) {
            MDB_val k = {8, (void *)&h[i]}, v = {(size_t)g_pb, NULL};
            rc = mdb_put(t, p->dbi, &k, &v, MDB_RESERVE);
            if (!rc) memcpy(v.mv_data, pages + i * g_pb, (size_t)g_pb);
        }
        for (size_t i = 0; i < ndel && !rc; i++) {
            MDB_val k = {8, (void *)&del[i]};
            rc = mdb_del(t, p->dbi, &k, NULL);
        }
        if (rc) {
            mdb_txn_abort(t);
            fail("mdb_put", rc);
        }
        if ((rc = mdb_txn_commit(t))) fail("mdb_txn_commit", rc);
        break;
    }
    default:
        break;
    }
}

/* Puts prompt q (g_pages holds its pages) durably. */
static void peer_put(peer *p, size_t q)
{
    if (p->kind == P_KVX) {
        int rc = kvx_store_put(p->kvx, toks_of(q), (size_t)NB * g_B, g_pages, NB, NULL, NULL);
        if (rc || (rc = kvx_store_flush(p->kvx))) fail("kvx put", rc);
    } else {
        peer_write(p, g_hashes + q * NB, g_pages, NB, NULL, 0);
    }
}

/* The longest cached prefix of a sequence of nb blocks (tokens toks; the
 * peers look up its chained FNV hashes h), its pages copied into dst;
 * returns the number of blocks served. */
static size_t peer_lookup(peer *p, const uint32_t *toks, const uint64_t *h, size_t nb, unsigned char *dst)
{
    size_t n = 0;
    switch (p->kind) {
    case P_KVX: {
        if (!g_kvx_views) { /* the pages read into dst and checked there */
            int rc = kvx_store_prefix_read(&n, p->kvx, toks, nb * g_B, dst, (size_t)g_pb, nb, NULL,
                                           g_kvx_direct ? KVX_PREFIX_READ_DIRECT : 0);
            if (rc) fail("kvx_store_prefix_read", rc);
            break;
        }
        if (nb > p->nviews) {
            p->views = realloc(p->views, nb * sizeof *p->views);
            if (!p->views) fail("realloc", -ENOMEM);
            p->nviews = nb;
        }
        int rc = kvx_store_prefix(p->views, &n, p->kvx, toks, nb * g_B, nb);
        if (rc) fail("kvx_store_prefix", rc);
        for (size_t i = 0; i < n; i++) memcpy(dst + i * g_pb, p->views[i].page, (size_t)g_pb);
        kvx_views_release(p->views, n);
        break;
    }
    case P_FILE: {
        char path[1100];
        for (; n < nb; n++) {
            if (!g_trace_mode && !keys_has(p, h[n])) break;
            snprintf(path, sizeof path, "%s/%02x/%016" PRIx64, p->dir, (unsigned)(h[n] >> 56), h[n]);
            int fd = open(path, O_RDONLY);
            if (fd < 0) break;
            ssize_t r = pread(fd, dst + n * g_pb, (size_t)g_pb, 0);
            close(fd);
            if (r != (ssize_t)g_pb) break;
        }
        break;
    }
#ifdef KVX_BENCH_ROCKSDB
    case P_ROCKS:
        for (; n < nb; n++) {
            char *err = NULL;
            rocksdb_pinnableslice_t *v = rocksdb_get_pinned(p->rdb, p->rr, (const char *)&h[n], 8, &err);
            free(err);
            if (!v) break;
            size_t len;
            const char *d = rocksdb_pinnableslice_value(v, &len);
            int ok = len == g_pb;
            if (ok) memcpy(dst + n * g_pb, d, len);
            rocksdb_pinnableslice_destroy(v);
            if (!ok) break;
        }
        break;
#endif
    case P_LMDB:
        if (mdb_txn_renew(p->rtxn)) fail("mdb_txn_renew", -EIO);
        for (; n < nb; n++) {
            MDB_val k = {8, (void *)&h[n]}, v;
            if (mdb_get(p->rtxn, p->dbi, &k, &v) || v.mv_size != g_pb) break;
            memcpy(dst + n * g_pb, v.mv_data, (size_t)g_pb);
        }
        mdb_txn_reset(p->rtxn);
        break;
    default:
        break;
    }
    kvx_bench_keep(dst);
    return n;
}

/* Prompt q's longest cached prefix, pages into g_dst. */
static size_t peer_get(peer *p, size_t q)
{
    uint64_t h[NB];
    kvx_block_hashes(h, toks_of(q), (size_t)NB * g_B, g_B);
    return peer_lookup(p, toks_of(q), h, NB, g_dst);
}

/* ------------------------------------------------------------ the run */

typedef struct result {
    int ran, trace_ran;
    double put_mbps, restart_ms, open_ms, cold_gbps, p50_us, p99_us, amp;
    double fio_gbps, fio_gb; /* kvx: fio reading its shard files (0: not run) */
    double fio_mmap_gbps;    /* and fio's mmap engine reading them through the page cache */
    size_t fio_files;
    /* trace */
    double hit, lru_hit, written_gb, kv_written_gb, trace_s, end_amp, peak_amp;
    /* kvx: where the bytes written went (GB): SPLIT_* */
    double split[8];
} result;

/* kvx's bytes written in the trace, by why: the pages of its shard files
 * (first writes of put pages, eviction's carries, compaction's merges, gc
 * and the rest), the files' other bytes (header, tables, records,
 * padding), the catalog's LMDB commits (the bytes those commits' thread
 * dirtied), and what is left of the device total (/proc/self/io
 * write_bytes: create, close, page granularity). */
enum { SPLIT_PUT, SPLIT_CARRY, SPLIT_MERGE, SPLIT_OTHER, SPLIT_TABLES, SPLIT_CATALOG, SPLIT_REST, SPLIT_N };
static const char *const split_name[SPLIT_N] = {"first writes of put pages", "eviction carries (pages)",
                                                "merges (pages)",            "gc, migration (pages)",
                                                "shard headers, tables, records", "catalog (LMDB commits)",
                                                "the rest (device total - the above)"};

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void expect_full(size_t got, size_t q, const char *row, int kind)
{
    if (got == NB) return;
    fprintf(stderr, "bench_peers: %s, %s: prompt %zu served %zu of %d blocks\n", peer_name[kind], row, q, got,
            NB);
    exit(1);
}

static const char *g_self = "/proc/self/exe";

/* Restart: a new process (fork + exec of this program with --child) opens
 * the peer's store and serves prompt 0; the time from fork to the line it writes at that first hit.
 * *inner gets the child's own figure (main() to the first hit). */
static double restart_child(int kind, const char *dir, double *inner)
{
    int pfd[2];
    if (pipe(pfd)) fail("pipe", -errno);
    char ks[16];
    snprintf(ks, sizeof ks, "%d", kind);
    double t0 = kvx_bench_now();
    pid_t pid = fork();
    if (pid < 0) fail("fork", -errno);
    if (pid == 0) {
        close(pfd[0]);
        dup2(pfd[1], 1);
        execl(g_self, "bench_peers", "--child", ks, "--size", g_size, dir, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    /* the child writes one line at its first hit: that is the end of the
     * row (its exit may wait on a peer's background work: RocksDB compacts
     * after an open) */
    char buf[128] = {0};
    ssize_t got = 0, r;
    double t = -1;
    while ((r = read(pfd[0], buf + got, sizeof buf - 1 - (size_t)got)) > 0) {
        got += r;
        if (t < 0 && memchr(buf, '\n', (size_t)got)) t = kvx_bench_now() - t0;
    }
    close(pfd[0]);
    int st;
    waitpid(pid, &st, 0);
    if (t < 0) t = kvx_bench_now() - t0;
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        fprintf(stderr, "bench_peers: %s: the restarted process failed (%s)\n", peer_name[kind], buf);
        exit(1);
    }
    *inner = strtod(buf, NULL);
    return t * 1e3;
}

static int child_main(int kind, const char *dir)
{
    double t0 = kvx_bench_now();
    peer *p = calloc(1, sizeof *p);
    uint32_t *t = malloc((size_t)NB * g_B * sizeof *t);
    uint64_t h[NB];
    g_dst = aligned_alloc(4096, (size_t)(g_pb * NB));
    if (!p || !t || !g_dst) return 1;
    p->kind = kind;
    snprintf(p->dir, sizeof p->dir, "%s", dir);
    gen_tokens(0, t);
    kvx_block_hashes(h, t, (size_t)NB * g_B, g_B);
    g_prompts = 1;
    peer_open(p, 0);
    size_t n = peer_lookup(p, t, h, NB, g_dst);
    double ms = (kvx_bench_now() - t0) * 1e3;
    printf("%.3f served %zu\n", ms, n);
    fflush(stdout);
    _exit(n == NB ? 0 : 1); /* no close: a restarted engine would go on serving */
}

/* Puts every prompt (durably unless g_nosync); returns the seconds spent
 * in the puts alone. */
static double put_all(peer *p)
{
    double t_put = 0;
    for (size_t q = 0; q < g_prompts; q++) {
        fill_pages(g_pages, NB, q); /* not timed */
        double t0 = kvx_bench_now();
        peer_put(p, q);
        t_put += kvx_bench_now() - t0;
    }
    return t_put;
}

static void sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)syncfs(fd);
        close(fd);
    }
}

/* ------------------------------------------------------------ fio */

/* Is fio on PATH? */
static int fio_found(void)
{
    const char *path = getenv("PATH");
    char buf[4096];
    while (path && *path) {
        const char *c = strchr(path, ':');
        size_t n = c ? (size_t)(c - path) : strlen(path);
        snprintf(buf, sizeof buf, "%.*s/fio", (int)n, path);
        if (n && access(buf, X_OK) == 0) return 1;
        path = c ? c + 1 : NULL;
    }
    return 0;
}

/* The disk's reference for the cold row: fio reading the very files kvx
 * read (DIR/shards/, the same bytes where they lie, plus their headers
 * and tables; fio's --opendir), one after another, each from its start to
 * its end: O_DIRECT, io_uring, g_fio_bs blocks, g_fio_depth deep. The
 * files' cached pages are dropped first, as for kvx. Returns GB/s (0 when
 * fio fails: the line says why); *gb and *nfiles get what it read. With
 * page_cache, fio's mmap engine reads them instead, through the page
 * cache as kvx's default prefix read does (the page cache's own limit). */
static double fio_ref(const char *store, double *gb, size_t *nfiles, int page_cache)
{
    char sdir[1100];
    snprintf(sdir, sizeof sdir, "%s/shards", store);
    DIR *d = opendir(sdir);
    if (!d) return 0;
    size_t n = 0;
    struct dirent *e;
    uint64_t bytes = 0;
    while ((e = readdir(d))) {
        struct stat st;
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", sdir, e->d_name);
        if (e->d_name[0] == '.' || lstat(path, &st) || !S_ISREG(st.st_mode)) continue;
        n++;
        bytes += (uint64_t)st.st_size;
    }
    closedir(d);
    char bs[32], depth[32], fn[1200];
    snprintf(bs, sizeof bs, "--bs=%ld", g_fio_bs);
    snprintf(depth, sizeof depth, "--iodepth=%ld", g_fio_depth);
    snprintf(fn, sizeof fn, "--opendir=%s", sdir);
    walk(sdir, 1);
    int pfd[2];
    if (pipe(pfd)) fail("pipe", -errno);
    pid_t pid = fork();
    if (pid < 0) fail("fork", -errno);
    if (pid == 0) {
        close(pfd[0]);
        dup2(pfd[1], 1);
        if (page_cache)
            execlp("fio", "fio", "--name=kvx-shards", "--readonly", "--rw=read", "--direct=0", "--ioengine=mmap", bs,
                   "--file_service_type=sequential", "--output-format=json", fn, (char *)NULL);
        else
            execlp("fio", "fio", "--name=kvx-shards", "--readonly", "--rw=read", "--direct=1", "--ioengine=io_uring",
                   bs, depth, "--file_service_type=sequential", "--output-format=json", fn, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    size_t got = 0, ocap = 1 << 16;
    char *out = malloc(ocap);
    ssize_t r;
    while (out && (r = read(pfd[0], out + got, ocap - 1 - got)) > 0)
        if ((got += (size_t)r) == ocap - 1 && !(out = realloc(out, ocap *= 2))) break;
    close(pfd[0]);
    int st;
    waitpid(pid, &st, 0);
    double gbps = 0;
    if (out) {
        out[got] = 0;
        char *j = strchr(out, '{'); /* fio may print notes before the JSON */
        json_object *o = j ? json_tokener_parse(j) : NULL, *jobs, *job, *rd, *v;
        if (o && json_object_object_get_ex(o, "jobs", &jobs) && (job = json_object_array_get_idx(jobs, 0)) &&
            json_object_object_get_ex(job, "read", &rd) && json_object_object_get_ex(rd, "io_bytes", &v)) {
            double io = (double)json_object_get_int64(v);
            json_object *rt;
            double ms = json_object_object_get_ex(rd, "runtime", &rt) ? (double)json_object_get_int64(rt) : 0;
            if (ms > 0) gbps = io / (ms / 1e3) / 1e9;
            *gb = io / 1e9;
        }
        if (o) json_object_put(o);
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) || gbps <= 0)
        fprintf(stderr, "bench_peers: the fio reference failed (exit %d): the cold row has no fio ratio\n",
                WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    *nfiles = n;
    if (gbps > 0 && *gb * 1e9 < (double)bytes * 0.99)
        fprintf(stderr, "bench_peers: fio read %.3f GB of the shard files' %.3f\n", *gb, (double)bytes / 1e9);
    free(out);
    return gbps;
}

static result run_peer(int kind, const char *base, int restart_only)
{
    result r = {0};
    peer *p = calloc(1, sizeof *p);
    if (!p) fail("calloc", -ENOMEM);
    p->kind = kind;
    snprintf(p->dir, sizeof p->dir, "%s/peer%d", base, kind);
    rm_rf(p->dir);
    double kv = (double)g_pb * NB * (double)g_prompts;

    g_nosync = restart_only; /* --mode restart builds the data set without syncs */
    peer_open(p, 1);
    double t_put = put_all(p);
    r.put_mbps = restart_only ? 0 : kv / t_put / 1e6;
    peer_close(p);
    g_nosync = 0;
    if (restart_only) sync_dir(p->dir);
    r.amp = (double)walk(p->dir, 0) / kv;

    /* restart: cached pages dropped, a new process opens the store and
     * serves the first prompt */
    walk(p->dir, 1);
    r.restart_ms = restart_child(kind, p->dir, &r.open_ms);
    if (restart_only) goto done;

    /* cold read of every prompt, in this process, cached pages dropped
     * again (the open is not timed) */
    walk(p->dir, 1);
    peer_open(p, 0);
    double t0 = kvx_bench_now();
    for (size_t q = 0; q < g_prompts; q++) expect_full(peer_get(p, q), q, "cold", kind);
    r.cold_gbps = kv / (kvx_bench_now() - t0) / 1e9;
    /* the disk's own figure for the same bytes, right after (the cache
     * dropped again; kvx's store stays open, its pages evicted) */
    if (kind == P_KVX && g_fio && fio_found()) r.fio_gbps = fio_ref(p->dir, &r.fio_gb, &r.fio_files, 0);

    /* warm latency: every prompt once more to warm, then up to 2048
     * samples in a shuffled order (fewer when a peer needs over 5 s) */
    for (size_t q = 0; q < g_prompts; q++) expect_full(peer_get(p, q), q, "warm", kind);
    size_t reps = (2048 + g_prompts - 1) / g_prompts, ns = reps * g_prompts;
    double *lat = malloc(ns * sizeof *lat);
    if (!lat) fail("malloc", -ENOMEM);
    uint64_t seed = 42;
    size_t i = 0;
    double t_lat = kvx_bench_now();
    for (; i < ns; i++) { /* at most ~5 s a peer, at least 32 samples */
        if (i >= 32 && kvx_bench_now() - t_lat > 5.0) break;
        size_t q = (size_t)(mix(seed++) % g_prompts);
        double a = kvx_bench_now();
        size_t got = peer_get(p, q);
        lat[i] = (kvx_bench_now() - a) * 1e6;
        expect_full(got, q, "warm", kind);
    }
    ns = i;
    qsort(lat, ns, sizeof *lat, cmp_d);
    r.p50_us = lat[ns / 2];
    r.p99_us = lat[(size_t)((double)ns * 0.99)];
    free(lat);
    peer_close(p);
    if (kind == P_KVX && g_fio && fio_found()) { /* the page cache's reference: with kvx's mappings gone */
        double gb;
        size_t nf;
        r.fio_mmap_gbps = fio_ref(p->dir, &gb, &nf, 1);
    }
done:
    free(p->keys);
    free(p->views);
    rm_rf(p->dir);
    free(p);
    r.ran = 1;
    return r;
}

/* ------------------------------------------- fio reference: durable put */

/* fio writing the bytes the put row writes (every prompt's NB pages, in
 * order) into one new file in dir: sequential, bs = one page, psync, one
 * fdatasync per prompt (--fdatasync=NB), no preallocation. MB/s (10^6),
 * or 0 when fio is not on PATH, fails, or --no-fio. */
static double fio_put_mbps(const char *dir)
{
    if (!g_fio || !fio_found()) return 0;
    char file[1100], cmd[2400];
    snprintf(file, sizeof file, "%s/fio-put.dat", dir);
    unlink(file);
    snprintf(cmd, sizeof cmd,
             "fio --name=put --filename='%s' --rw=write --bs=%" PRIu64 " --size=%" PRIu64
             " --fdatasync=%d --fallocate=none --ioengine=psync --output-format=terse --terse-version=3"
             " 2>/dev/null | awk -F';' '{print $48}'",
             file, g_pb, g_pb * NB * (uint64_t)g_prompts, NB);
    FILE *p = popen(cmd, "r");
    double kib = 0;
    if (!p) return 0;
    if (fscanf(p, "%lf", &kib) != 1) kib = 0;
    pclose(p);
    unlink(file);
    return kib * 1024.0 / 1e6; /* terse bandwidth is KiB/s */
}

static void fio_put_print(double fio, double kvx)
{
    if (fio <= 0) {
        printf("\nfio reference (durable put): %s, not run\n", !g_fio ? "--no-fio" : "fio not on PATH or failed");
        return;
    }
    printf("\nfio reference (durable put): the same bytes, bs %" PRIu64 " (one page), one fdatasync per prompt "
           "(%d pages), psync, a new file: %.1f MB/s; kvx put / fio = %.2f\n",
           g_pb, NB, fio, kvx > 0 ? kvx / fio : 0);
}

/* ------------------------------------------------- rounds (--rounds N) */

/* kvx's row and the two fio references again and again, alternated, so a
 * ratio is a median of pairs measured minutes apart at most, not one pair
 * (this virtual disk swings +-25 % between neighbouring fio runs). */
#define ROUNDS_MAX 99
typedef struct rounds {
    int n;
    double put[ROUNDS_MAX], fio_put[ROUNDS_MAX], cold[ROUNDS_MAX], fio_cold[ROUNDS_MAX], fio_mmap[ROUNDS_MAX];
    double p50[ROUNDS_MAX], p99[ROUNDS_MAX], restart[ROUNDS_MAX];
} rounds;

static double median_of(const double *v, int n)
{
    double t[ROUNDS_MAX];
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* Round 1 is the peers' run (kvx's row, then fio's put after the peers);
 * rounds 2..N run fio's put, then kvx's row (with fio's read of its
 * files). kvx's result and fio's figures become the rounds' medians. */
static void rounds_run(rounds *rd, const char *dir, result *kvx, double *fio_put)
{
    rd->n = 0;
    if (g_rounds < 2) return;
    for (int i = 0; i < g_rounds; i++) {
        result r = *kvx;
        double fp = *fio_put;
        if (i) { /* fio first: each then follows the other's removal of as many bytes */
            fp = fio_put_mbps(dir);
            r = run_peer(P_KVX, dir, 0);
        }
        rd->put[i] = r.put_mbps, rd->fio_put[i] = fp, rd->cold[i] = r.cold_gbps, rd->fio_cold[i] = r.fio_gbps;
        rd->fio_mmap[i] = r.fio_mmap_gbps;
        rd->p50[i] = r.p50_us, rd->p99[i] = r.p99_us, rd->restart[i] = r.restart_ms;
        rd->n = i + 1;
        fprintf(stderr, "bench_peers: round %d of %ld: kvx put %.1f MB/s (fio %.1f), cold %.2f GB/s (fio %.2f)\n",
                i + 1, g_rounds, r.put_mbps, fp, r.cold_gbps, r.fio_gbps);
    }
    kvx->put_mbps = median_of(rd->put, rd->n), kvx->cold_gbps = median_of(rd->cold, rd->n);
    kvx->p50_us = median_of(rd->p50, rd->n), kvx->p99_us = median_of(rd->p99, rd->n);
    kvx->restart_ms = median_of(rd->restart, rd->n), kvx->fio_gbps = median_of(rd->fio_cold, rd->n);
    kvx->fio_mmap_gbps = median_of(rd->fio_mmap, rd->n);
    *fio_put = median_of(rd->fio_put, rd->n);
}

/* each round's kvx / fio ("-" where fio did not run), then the median */
static void rounds_line(FILE *f, const char *sep, const double *kvx, const double *fio, int n, double *median)
{
    double r[ROUNDS_MAX];
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (fio[i] > 0) r[k++] = kvx[i] / fio[i];
        if (fio[i] > 0)
            fprintf(f, "%s%.2f", i ? sep : "", kvx[i] / fio[i]);
        else
            fprintf(f, "%s-", i ? sep : "");
    }
    *median = k ? median_of(r, k) : 0;
}

static void rounds_print(const rounds *rd)
{
    if (rd->n < 2) return;
    double m;
    printf("\n%d rounds, alternated (kvx's rows above are their medians)\n  kvx put / fio put:   ", rd->n);
    rounds_line(stdout, ", ", rd->put, rd->fio_put, rd->n, &m);
    printf("; median %.2f\n  kvx cold / fio read: ", m);
    rounds_line(stdout, ", ", rd->cold, rd->fio_cold, rd->n, &m);
    printf("; median %.2f\n  kvx cold / fio mmap: ", m);
    rounds_line(stdout, ", ", rd->cold, rd->fio_mmap, rd->n, &m);
    printf("; median %.2f\n", m);
}

static void rounds_tsv(FILE *tf, const rounds *rd)
{
    if (rd->n < 2) return;
    double m;
    FILE *null = fopen("/dev/null", "w");
    if (!null) return;
    rounds_line(null, ",", rd->put, rd->fio_put, rd->n, &m);
    fprintf(tf, "put / fio\tkvx\t%.6g\t%.4f\tmedian of %d rounds: ", median_of(rd->put, rd->n), m, rd->n);
    rounds_line(tf, ",", rd->put, rd->fio_put, rd->n, &m);
    fprintf(tf, "\n");
    rounds_line(null, ",", rd->cold, rd->fio_cold, rd->n, &m);
    fprintf(tf,
            "cold / fio\tkvx\t%.6g\t%.4f\tmedian of %d rounds (fio bs %ld iodepth %ld): ", median_of(rd->cold, rd->n),
            m, rd->n, g_fio_bs, g_fio_depth);
    rounds_line(tf, ",", rd->cold, rd->fio_cold, rd->n, &m);
    fprintf(tf, "\n");
    rounds_line(null, ",", rd->cold, rd->fio_mmap, rd->n, &m);
    fprintf(tf, "cold / fio mmap\tkvx\t%.6g\t%.4f\tmedian of %d rounds (fio --ioengine=mmap, bs %ld): ",
            median_of(rd->cold, rd->n), m, rd->n, g_fio_bs);
    rounds_line(tf, ",", rd->cold, rd->fio_mmap, rd->n, &m);
    fprintf(tf, "\n");
    fclose(null);
}

/* ------------------------------------------------------------ the trace */

typedef struct trace {
    uint32_t *ids; /* all requests' hash ids, concatenated */
    size_t *off;   /* request i: ids[off[i] .. off[i+1]) */
    size_t nreq, nids, maxb;
    uint32_t max_id;
    uint32_t *tok; /* request i's tokens: tok[off[i] * B ..], B per id */
    uint64_t *h;   /* request i's chained block hashes: h[off[i] ..] */
} trace;

/* Hashes n sequences (tokens t[k], n_tokens nt[k]) into out[k] with
 * kvx_block_hashes_multi, as a batch of prompts is hashed, and checks every
 * hash against kvx_block_hashes of the same sequence (exit 1 if one
 * differs). Prints the two times when what is non-NULL. */
static void hash_batch(uint64_t *const *out, const uint32_t *const *t, const size_t *nt, size_t n, const char *what)
{
    double t0 = kvx_bench_now();
    kvx_block_hashes_multi(out, t, nt, n, g_B);
    double t_multi = kvx_bench_now() - t0;
    size_t maxn = 0, total = 0;
    for (size_t k = 0; k < n; k++) maxn = nt[k] > maxn ? nt[k] : maxn;
    uint64_t *one = malloc((maxn / g_B + 1) * sizeof *one);
    if (!one) fail("malloc", -ENOMEM);
    double t_serial = 0;
    for (size_t k = 0; k < n; k++) {
        t0 = kvx_bench_now();
        size_t nb = kvx_block_hashes(one, t[k], nt[k], g_B);
        t_serial += kvx_bench_now() - t0;
        total += nb;
        if (memcmp(one, out[k], nb * sizeof *one) != 0) {
            fprintf(stderr, "bench_peers: %s: kvx_block_hashes_multi differs from kvx_block_hashes (sequence %zu)\n",
                    what ? what : "hashes", k);
            exit(1);
        }
    }
    free(one);
    if (what)
        printf("bench_peers: %s: %zu sequences, %zu blocks hashed at once in %.2f ms, one at a time %.2f ms "
               "(%.2fx; equal)\n", what, n, total, t_multi * 1e3, t_serial * 1e3,
               t_multi > 0 ? t_serial / t_multi : 0.0);
}

/* Every request's tokens (block id -> B token ids, so equal ids chain to
 * equal hashes) and chained hashes, all requests hashed in one batch. */
static void trace_hash(trace *tr)
{
    tr->tok = malloc((tr->nids * g_B + 1) * sizeof *tr->tok);
    tr->h = malloc((tr->nids + 1) * sizeof *tr->h);
    uint64_t **out = malloc((tr->nreq + 1) * sizeof *out);
    const uint32_t **t = malloc((tr->nreq + 1) * sizeof *t);
    size_t *nt = malloc((tr->nreq + 1) * sizeof *nt);
    if (!tr->tok || !tr->h || !out || !t || !nt) fail("malloc", -ENOMEM);
    for (size_t i = 0; i < tr->nids; i++)
        for (uint32_t j = 0; j < g_B; j++) tr->tok[i * g_B + j] = j ? (uint32_t)mix(tr->ids[i]) + j : tr->ids[i];
    for (size_t q = 0; q < tr->nreq; q++) {
        out[q] = tr->h + tr->off[q];
        t[q] = tr->tok + tr->off[q] * g_B;
        nt[q] = (tr->off[q + 1] - tr->off[q]) * g_B;
    }
    hash_batch(out, t, nt, tr->nreq, "the trace's requests");
    free(out), free(t), free(nt);
}

/* A Mooncake trace (data README): one JSON object a line, "hash_ids" one
 * id per 512-token block, chained (an equal id is an equal prefix). At
 * most max_req requests (0: all). */
static int load_trace(trace *tr, const char *path, size_t max_req)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    memset(tr, 0, sizeof *tr);
    size_t cap = 1 << 16, rcap = 1 << 12;
    tr->ids = malloc(cap * 4);
    tr->off = malloc(rcap * sizeof *tr->off);
    if (!tr->ids || !tr->off) fail("malloc", -ENOMEM);
    char *line = NULL;
    size_t ln = 0, lineno = 0;
    int rc = 0;
    while (!rc && (!max_req || tr->nreq < max_req) && getline(&line, &ln, f) > 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        json_object *o = json_tokener_parse(line), *ids;
        if (!o || !json_object_object_get_ex(o, "hash_ids", &ids) || !json_object_is_type(ids, json_type_array)) {
            fprintf(stderr, "%s:%zu: not a trace line with \"hash_ids\": [...]\n", path, lineno);
            rc = -1;
            json_object_put(o);
            break;
        }
        if (tr->nreq + 2 > rcap && !(tr->off = realloc(tr->off, (rcap *= 2) * sizeof *tr->off)))
            fail("realloc", -ENOMEM);
        tr->off[tr->nreq++] = tr->nids;
        size_t n = json_object_array_length(ids);
        if (n > tr->maxb) tr->maxb = n;
        for (size_t k = 0; k < n; k++) {
            int64_t v = json_object_get_int64(json_object_array_get_idx(ids, k));
            if (v < 0 || v >= (int64_t)UINT32_MAX) {
                fprintf(stderr, "%s:%zu: hash_ids[%zu] out of range\n", path, lineno, k);
                rc = -1;
                break;
            }
            if (tr->nids == cap && !(tr->ids = realloc(tr->ids, (cap *= 2) * 4))) fail("realloc", -ENOMEM);
            tr->ids[tr->nids++] = (uint32_t)v;
            if ((uint32_t)v > tr->max_id) tr->max_id = (uint32_t)v;
        }
        json_object_put(o);
    }
    if (tr->off) tr->off[tr->nreq] = tr->nids;
    free(line);
    fclose(f);
    return rc;
}

/* Exact LRU over block ids (arrays indexed by id, head = most recent). */
#define NIL UINT32_MAX
typedef struct lru {
    uint32_t *prev, *next, head, tail;
    uint8_t *in;
    size_t n, cap;
} lru;

static void lru_init(lru *l, uint32_t max_id, size_t cap)
{
    l->prev = malloc(((size_t)max_id + 1) * 4);
    l->next = malloc(((size_t)max_id + 1) * 4);
    l->in = calloc((size_t)max_id + 1, 1);
    if (!l->prev || !l->next || !l->in) fail("malloc", -ENOMEM);
    l->head = l->tail = NIL;
    l->n = 0;
    l->cap = cap;
}

static void lru_unlink(lru *l, uint32_t x)
{
    if (l->prev[x] != NIL) l->next[l->prev[x]] = l->next[x];
    else l->head = l->next[x];
    if (l->next[x] != NIL) l->prev[l->next[x]] = l->prev[x];
    else l->tail = l->prev[x];
}

static void lru_front(lru *l, uint32_t x)
{
    l->prev[x] = NIL;
    l->next[x] = l->head;
    if (l->head != NIL) l->prev[l->head] = x;
    l->head = x;
    if (l->tail == NIL) l->tail = x;
}

/* Marks x used; inserts it when absent, returning the evicted id (or NIL). */
static uint32_t lru_use(lru *l, uint32_t x)
{
    uint32_t ev = NIL;
    if (l->in[x]) {
        lru_unlink(l, x);
    } else {
        if (l->n == l->cap) {
            ev = l->tail;
            lru_unlink(l, ev);
            l->in[ev] = 0;
            l->n--;
        }
        l->in[x] = 1;
        l->n++;
    }
    lru_front(l, x);
    return ev;
}

static void lru_free(lru *l)
{
    free(l->prev);
    free(l->next);
    free(l->in);
}

/* The bytes a block takes in a kvx shard by the format (docs/FORMAT.md):
 * its 4 KiB-aligned page, coordinate entry (24), hash (8), lineage (8 +
 * 4B), digest (32) and, for FP8, its L*2*Hkv f32 scales. */
static uint64_t kvx_block_footprint(void)
{
    uint64_t s = (g_pb + 4095) / 4096 * 4096 + 24 + 8 + 8 + 4ull * g_B + 32;
    if (g_geo.quant == KVX_QUANT_E4M3 || g_geo.quant == KVX_QUANT_E5M2)
        s += 4ull * g_geo.num_layers * 2 * g_geo.kv_heads;
    return s;
}

/* Stamps a page with its block id, so a served page can be checked. */
static void stamp(unsigned char *page, uint32_t id)
{
    uint64_t v = mix(id) & 0x7777777777777777ull;
    memcpy(page, &v, 8);
}

static int stamped(const unsigned char *page, uint32_t id)
{
    uint64_t v = mix(id) & 0x7777777777777777ull;
    return !memcmp(page, &v, 8);
}

/* Replays tr on one peer at capacity cap blocks: per request, the longest
 * cached prefix is looked up (and its pages read), then the request's
 * other blocks are put and made durable in one round. The peers other
 * than kvx sit behind this program's exact LRU of cap blocks (a block
 * after the first miss that the LRU still holds is used, not rewritten;
 * evicted blocks are deleted in the same round); kvx evicts by itself. */
static void run_trace(int kind, const char *base, const trace *tr, size_t cap, result *r)
{
    peer *p = calloc(1, sizeof *p);
    if (!p) fail("calloc", -ENOMEM);
    p->kind = kind;
    snprintf(p->dir, sizeof p->dir, "%s/trace%d", base, kind);
    rm_rf(p->dir);
    p->kvx_capacity = (uint64_t)cap * kvx_block_footprint();
    /* --kvx-hold-lru: the capacity whose eviction goal (the store evicts
     * to 1/64 below its capacity) is the LRU's blocks: kvx then holds
     * about as many blocks as the LRU, its disk over the LRU's pages
     * (peak disk/cap, printed) within the 5 % */
    if (g_kvx_hold_lru) p->kvx_capacity = p->kvx_capacity / 63 * 64;
    uint64_t peak = 0;
    double walk_s = 0;
    g_trace_mode = 1;
    size_t mb = tr->maxb;
    uint64_t *wh = malloc(mb * 8), *del = malloc(mb * 8);
    uint64_t *idhash = calloc((size_t)tr->max_id + 1, 8);
    unsigned char *pages = malloc(mb * g_pb), *wpages = malloc(mb * g_pb), *dst = aligned_alloc(4096, mb * g_pb);
    if (!wh || !del || !idhash || !pages || !wpages || !dst) fail("malloc", -ENOMEM);
    fill_pages(pages, mb, 7);
    memcpy(wpages, pages, mb * g_pb);
    lru l;
    lru_init(&l, tr->max_id, cap);
    size_t hits = 0, written = 0;
    uint64_t wb0 = io_write_bytes();
    double t0 = kvx_bench_now();
    peer_open(p, 1);
    kvx_index *kix = kind == P_KVX ? kvx_cat_index(p->kvx->cat) : NULL;
    uint64_t cat0 = 0;
    if (kix) kix->count_io = 1, cat0 = kix->wrote;
    for (size_t q = 0; q < tr->nreq; q++) {
        const uint32_t *ids = tr->ids + tr->off[q];
        size_t nb = tr->off[q + 1] - tr->off[q];
        const uint32_t *tok = tr->tok + tr->off[q] * g_B; /* tokens and hashes: trace_hash */
        const uint64_t *h = tr->h + tr->off[q];
        for (size_t b = 0; b < nb; b++) stamp(pages + b * g_pb, ids[b]);
        if (kind == P_KVX) {
            size_t n = peer_lookup(p, tok, h, nb, dst);
            for (size_t i = 0; i < n; i++)
                if (!stamped(dst + i * g_pb, ids[i])) fail("kvx served another block's page", -EIO);
            hits += n;
            size_t nw = 0;
            int rc = kvx_store_put(p->kvx, tok, nb * g_B, pages, nb, NULL, &nw);
            /* the disk's peak: after the put wrote its pages, before the
             * flush's eviction frees others (the walk's time left out of
             * the trace's seconds) */
            double w0 = kvx_bench_now();
            uint64_t now = rc ? 0 : walk(p->dir, 0);
            walk_s += kvx_bench_now() - w0;
            if (now > peak) peak = now;
            if (rc || (rc = kvx_store_flush(p->kvx))) fail("kvx put (trace)", rc);
            written += nw;
            continue;
        }
        size_t pre = 0;
        while (pre < nb && l.in[ids[pre]]) pre++;
        for (size_t i = 0; i < pre; i++) lru_use(&l, ids[i]);
        size_t n = pre ? peer_lookup(p, tok, h, pre, dst) : 0;
        if (n != pre) {
            fprintf(stderr, "bench_peers: %s, trace request %zu: served %zu of the %zu blocks its LRU holds\n",
                    peer_name[kind], q, n, pre);
            exit(1);
        }
        for (size_t i = 0; i < n; i++)
            if (!stamped(dst + i * g_pb, ids[i])) fail("a peer served another block's page", -EIO);
        hits += n;
        size_t nw = 0, nd = 0;
        for (size_t b = pre; b < nb; b++) {
            if (l.in[ids[b]]) {
                lru_use(&l, ids[b]);
                continue;
            }
            uint32_t ev = lru_use(&l, ids[b]);
            if (ev != NIL) { /* evicted: deleted, unless written in this very round */
                size_t k = 0;
                while (k < nw && wh[k] != idhash[ev]) k++;
                if (k < nw) fail("LRU capacity below one request's blocks", -EINVAL);
                del[nd++] = idhash[ev];
            }
            idhash[ids[b]] = h[b];
            wh[nw] = h[b];
            memcpy(wpages + nw * g_pb, pages + b * g_pb, (size_t)g_pb);
            nw++;
        }
        if (nw || nd) peer_write(p, wh, wpages, nw, del, nd);
        written += nw;
    }
    if (kind == P_KVX) { /* where kvx's extra bytes go: merges and evictions */
        kvx_store_stats st;
        if (kvx_store_stat(&st, p->kvx) == 0)
            printf("bench_peers: kvx after the trace: %llu blocks in %llu shards, %llu evictions (%llu blocks), "
                   "%llu compactions\n",
                   (unsigned long long)st.blocks, (unsigned long long)st.shards, (unsigned long long)st.evictions,
                   (unsigned long long)st.evicted_blocks, (unsigned long long)st.compactions);
        const kvx_store *s = p->kvx;
        uint64_t tables = 0;
        for (int w = 0; w < ST_WROTE_N; w++) {
            r->split[SPLIT_PUT + w] = (double)s->wrote[w].pages / 1e9;
            tables += s->wrote[w].files - s->wrote[w].pages;
        }
        r->split[SPLIT_TABLES] = (double)tables / 1e9;
        r->split[SPLIT_CATALOG] = (double)(kix->wrote - cat0) / 1e9;
        kix->count_io = 0;
    }
    peer_close(p);
    r->trace_s = kvx_bench_now() - t0 - walk_s;
    r->written_gb = (double)(io_write_bytes() - wb0) / 1e9;
    if (kind == P_KVX) {
        double known = 0;
        for (int j = 0; j < SPLIT_REST; j++) known += r->split[j];
        r->split[SPLIT_REST] = r->written_gb - known;
    }
    r->kv_written_gb = (double)written * (double)g_pb / 1e9;
    r->hit = (double)hits / (double)tr->nids;
    r->end_amp = (double)walk(p->dir, 0) / ((double)cap * (double)g_pb);
    r->peak_amp = (double)peak / ((double)cap * (double)g_pb);
    r->trace_ran = 1;
    lru_free(&l);
    g_trace_mode = 0;
    rm_rf(p->dir);
    free(wh), free(del), free(idhash), free(pages), free(wpages), free(dst);
    free(p->views);
    free(p);
}

/* The exact LRU's prefix hit ratio alone (what the peers get). */
static double lru_prefix_ratio(const trace *tr, size_t cap)
{
    lru l;
    lru_init(&l, tr->max_id, cap);
    size_t hits = 0;
    for (size_t q = 0; q < tr->nreq; q++) {
        const uint32_t *ids = tr->ids + tr->off[q];
        size_t nb = tr->off[q + 1] - tr->off[q], pre = 0;
        while (pre < nb && l.in[ids[pre]]) pre++;
        hits += pre;
        for (size_t b = 0; b < nb; b++) lru_use(&l, ids[b]);
    }
    lru_free(&l);
    return (double)hits / (double)tr->nids;
}

/* ------------------------------------------------------------ main */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench_peers [--mode all|rows|restart|trace] [--size small|large] [--blocks N]\n"
            "                   [--only PEER] [--trace FILE] [--trace-requests N]\n"
            "                   [--trace-capacity N] [--fio-bs BYTES] [--fio-depth N] [--no-fio] [--rounds N]\n"
            "                   [--kvx-views] [--kvx-direct] [--kvx-hold-lru] [--kvx-holes] [--tsv FILE] DIR\n"
            "  kvx against the stores engine teams persist KV in, same pages, keys and\n"
            "  durability: kvx | file per block | RocksDB (BlobDB) | LMDB values\n"
            "  (PEER for --only: kvx, file, rocksdb, lmdb). Each peer's files live in\n"
            "  DIR/peerN (DIR/traceN) and are removed before the next peer starts.\n"
            "modes:\n"
            "  all      rows, then the trace (default)\n"
            "  rows     put MB/s (durable, one flush/commit/fsync round per prompt),\n"
            "           restart ms (page cache dropped; a new process, fork + exec of this\n"
            "           program, opens the store and serves the first prompt: fork to first hit),\n"
            "           cold GB/s (cache dropped again, every prompt read once), warm prefix\n"
            "           get p50/p99 us of a %d-block prompt (pages copied to a host buffer;\n"
            "           up to 2048 samples or ~5 s a peer), space amp (st_blocks / KV bytes)\n"
            "  restart  the restart row and space amp alone; the data set is put without\n"
            "           syncs (one syncfs at the end), for large --blocks (10^5)\n"
            "  trace    the Mooncake trace replayed at --trace-capacity blocks: the peers\n"
            "           behind one exact block LRU kept here, kvx evicting by itself with\n"
            "           capacity_bytes = capacity x a block's bytes in a shard by the format;\n"
            "           per request the cached prefix is read, the rest put durably; prefix\n"
            "           hit ratio, GB written (/proc/self/io write_bytes), bytes on disk\n"
            "sizes:\n"
            "  small  64 KiB pages: B=16, L=2, Hkv=8, D=128, e4m3 (default; --blocks 4096;\n"
            "         trace: the first 1000 requests, capacity 16384 blocks)\n"
            "  large  2 MiB pages: B=16, L=32, Hkv=8, D=128, bf16 (--blocks 4096; the trace\n"
            "         only with --trace-requests N, capacity 512 blocks)\n"
            "--blocks N: blocks stored (a multiple of %d: prompts of %d blocks).\n"
            "--trace FILE: default %s\n"
            "--trace-requests N: the trace's first N requests (0: all of them).\n"
            "--fio-bs BYTES, --fio-depth N: the cold row's disk reference (default 1048576, 32):\n"
            "  when fio is on PATH, right after kvx's cold row it reads kvx's shard files (the\n"
            "  same bytes) (fio --opendir), each start to end: --rw=read --direct=1\n"
            "  --ioengine=io_uring at that block size and depth; kvx cold / fio is printed (and\n"
            "  in the TSV); then fio's mmap engine (buffered, bs as above) reads them through\n"
            "  the page cache, as kvx's default prefix read does: the page cache's own limit\n"
            "  (kvx cold / fio mmap). --no-fio leaves both out.\n"
            "--rounds N: kvx's row and the fio references N times, alternated (kvx put, kvx\n"
            "  cold, fio read, ..., fio put; then fio put, kvx's row, ...): each round's kvx /\n"
            "  fio and their median, printed and in the TSV; the rows table holds kvx's\n"
            "  medians. A virtual disk that reads 1.3-2.4 GB/s minutes apart makes one pair\n"
            "  a coin toss (default 1).\n"
            "--kvx-views: kvx's lookups take kvx_store_prefix's zero-copy views and memcpy each\n"
            "  page into the bench's buffer (the rows before 2026-12-05's prefix read); default:\n"
            "  kvx_store_prefix_read, the pages read into the buffer and CRC-checked there.\n"
            "--kvx-direct: kvx_store_prefix_read with KVX_PREFIX_READ_DIRECT (O_DIRECT: nothing\n"
            "  left in the page cache, so the warm rows read the disk too).\n"
            "--kvx-hold-lru: the trace gives kvx capacity_bytes x 64/63, so its eviction goal\n"
            "  (1/64 below the capacity) holds the LRU's blocks; peak disk/cap (bytes on disk\n"
            "  after each put, before its flush evicts, over the LRU's pages) is printed: issue\n"
            "  41 allows kvx the capacity + 5 %%.\n"
            "--kvx-holes: kvx's writer evicts block by block in place (KVX_STORE_HOLES: a\n"
            "  free log record, then the pages' extents punched) instead of whole shards.\n"
            "--tsv FILE: each row's value and ratio to the best peer, one line a peer and row.\n"
            "DIR needs free space for 2.5x the KV bytes (pages x blocks) + 1 GiB, and for the\n"
            "trace the pages of its block references + 1 GiB; checked first.\n"
#ifndef KVX_BENCH_ROCKSDB
            "This build has no RocksDB row (librocksdb-dev was not found at configure).\n"
#endif
            ,
            NB, NB, NB, KVX_BENCH_TRACE);
}

static double ratio(double v, double best, int higher)
{
    if (v <= 0 || best <= 0) return 0;
    return higher ? v / best : best / v;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *mode = "all", *trace_path = KVX_BENCH_TRACE, *tsv = NULL;
    long blocks = 0, child = -1;
    long trace_req = -1, trace_cap = 0;
    int only = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--size") && more) {
            g_size = argv[++i];
        } else if (!strcmp(a, "--mode") && more) {
            mode = argv[++i];
        } else if (!strcmp(a, "--blocks") && more) {
            blocks = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--trace") && more) {
            trace_path = argv[++i];
        } else if (!strcmp(a, "--trace-requests") && more) {
            trace_req = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--trace-capacity") && more) {
            trace_cap = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--fio-bs") && more) {
            g_fio_bs = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--fio-depth") && more) {
            g_fio_depth = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--rounds") && more) {
            g_rounds = strtol(argv[++i], NULL, 10);
            if (g_rounds < 1 || g_rounds > 99) {
                fprintf(stderr, "bench_peers: --rounds %ld is not in 1..99\n", g_rounds);
                return 2;
            }
        } else if (!strcmp(a, "--kvx-views")) {
            g_kvx_views = 1;
        } else if (!strcmp(a, "--kvx-direct")) {
            g_kvx_direct = 1;
        } else if (!strcmp(a, "--kvx-hold-lru")) {
            g_kvx_hold_lru = 1;
        } else if (!strcmp(a, "--kvx-holes")) {
            g_kvx_holes = 1;
        } else if (!strcmp(a, "--no-fio")) {
            g_fio = 0;
        } else if (!strcmp(a, "--tsv") && more) {
            tsv = argv[++i];
        } else if (!strcmp(a, "--child") && more) {
            child = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--only") && more) {
            const char *o = argv[++i];
            only = !strcmp(o, "kvx") ? P_KVX : !strcmp(o, "file") ? P_FILE : !strcmp(o, "rocksdb") ? P_ROCKS
                 : !strcmp(o, "lmdb") ? P_LMDB : -2;
            if (only == -2) {
                usage(stderr);
                return 2;
            }
        } else if (a[0] != '-' && !dir) {
            dir = a;
        } else {
            usage(stderr);
            return 2;
        }
    }
    kvx_geometry small = {2, 8, 128, 16, KVX_QUANT_E4M3, 1}, large = {32, 8, 128, 16, KVX_QUANT_BF16, 1};
    int do_rows = !strcmp(mode, "all") || !strcmp(mode, "rows") || !strcmp(mode, "restart");
    int do_trace = !strcmp(mode, "all") || !strcmp(mode, "trace");
    int restart_only = !strcmp(mode, "restart");
    if (!dir || (strcmp(g_size, "small") && strcmp(g_size, "large")) || (!do_rows && !do_trace) ||
        trace_cap < 0 || g_fio_bs < 4096 || g_fio_bs % 4096 || g_fio_depth < 1 || g_fio_depth > 4096) {
        usage(stderr);
        return 2;
    }
    int is_small = !strcmp(g_size, "small");
    g_geo = is_small ? small : large;
    g_B = g_geo.block_tokens;
    g_pb = kvx_page_bytes(&g_geo, g_B);
    if (child >= 0) return child_main((int)child, dir);

    if (!blocks) blocks = 4096;
    if (blocks < NB || blocks % NB) {
        fprintf(stderr, "bench_peers: --blocks must be a positive multiple of %d\n", NB);
        return 2;
    }
    if (trace_req < 0) trace_req = is_small ? 1000 : (!strcmp(mode, "trace") ? 100 : -1);
    if (trace_req < 0) do_trace = 0; /* large: the trace only when asked for */
    if (!trace_cap) trace_cap = is_small ? 16384 : 512;
    g_prompts = (size_t)blocks / NB;
    double kv = (double)g_pb * (double)blocks;

    trace tr = {0};
    if (do_trace && load_trace(&tr, trace_path, (size_t)trace_req)) {
        fprintf(stderr, "bench_peers: cannot read the trace %s: the trace row is left out\n", trace_path);
        do_trace = 0;
    }
    if (do_trace && tr.maxb > (size_t)trace_cap) {
        fprintf(stderr, "bench_peers: --trace-capacity %ld is below the longest request (%zu blocks)\n",
                trace_cap, tr.maxb);
        return 2;
    }
    if (do_trace) trace_hash(&tr);

    mkdir(dir, 0700);
    struct statvfs sv;
    double need_rows = do_rows ? kv * 2.5 + (double)(1u << 30) : 0;
    double need_trace = do_trace ? (double)tr.nids * (double)g_pb + (double)(1u << 30) : 0;
    double need = need_rows > need_trace ? need_rows : need_trace;
    if (statvfs(dir, &sv)) fail(dir, -errno);
    double have = (double)sv.f_bavail * (double)sv.f_frsize;
    printf("bench_peers: mode %s, %s pages (%" PRIu64 " bytes)", mode, g_size, g_pb);
    if (do_rows) printf(", %ld blocks, %zu prompts of %d blocks, KV %.2f GiB", blocks, g_prompts, NB, kv / 1073741824.0);
    if (do_trace)
        printf(", trace %zu requests (%zu block references) at %ld blocks", tr.nreq, tr.nids, trace_cap);
    printf("; DIR needs %.2f GiB free, has %.2f GiB\n", need / 1073741824.0, have / 1073741824.0);
    if (have < need) {
        fprintf(stderr, "bench_peers: not enough free space in %s (needs %.2f GiB, has %.2f GiB)\n", dir,
                need / 1073741824.0, have / 1073741824.0);
        return 1;
    }
#ifndef KVX_BENCH_ROCKSDB
    printf("bench_peers: built without librocksdb-dev: no RocksDB (BlobDB) row\n");
#endif
    fflush(stdout);

    g_toks = malloc((size_t)blocks * g_B * sizeof *g_toks);
    g_hashes = malloc((size_t)blocks * sizeof *g_hashes);
    g_pages = malloc((size_t)(g_pb * NB));
    /* page-aligned, as a pinned host buffer is: the copy's speed depends on
     * the source's and destination's offsets within a page (rep movsb) */
    g_dst = aligned_alloc(4096, (size_t)(g_pb * NB));
    if (!g_toks || !g_hashes || !g_pages || !g_dst) fail("malloc", -ENOMEM);
    memset(g_dst, 0, (size_t)(g_pb * NB));
    {
        /* every prompt's hashes in one batch (checked against one at a time) */
        uint64_t **out = malloc(g_prompts * sizeof *out);
        const uint32_t **t = malloc(g_prompts * sizeof *t);
        size_t *nt = malloc(g_prompts * sizeof *nt);
        if (!out || !t || !nt) fail("malloc", -ENOMEM);
        for (size_t q = 0; q < g_prompts; q++) {
            gen_tokens(q, g_toks + q * NB * g_B);
            out[q] = g_hashes + q * NB, t[q] = toks_of(q), nt[q] = (size_t)NB * g_B;
        }
        hash_batch(out, t, nt, g_prompts, "the prompts");
        free(out), free(t), free(nt);
    }

    result res[P_COUNT] = {{0}};
    for (int k = 0; k < P_COUNT && do_rows; k++) {
        if (only >= 0 && k != only) continue;
#ifndef KVX_BENCH_ROCKSDB
        if (k == P_ROCKS) continue;
#endif
        res[k] = run_peer(k, dir, restart_only);
        fprintf(stderr, "bench_peers: %s done\n", peer_name[k]);
    }
    /* after the peers: a reference run just before kvx left its file's
     * removal (discards) and the host's write-back to kvx's put row */
    double fio_put = do_rows && !restart_only && (only < 0 || only == P_KVX) ? fio_put_mbps(dir) : 0;
    rounds rd = {0};
    if (do_rows && !restart_only && (only < 0 || only == P_KVX) && res[P_KVX].ran)
        rounds_run(&rd, dir, &res[P_KVX], &fio_put);
    double lru_hit = do_trace ? lru_prefix_ratio(&tr, (size_t)trace_cap) : 0;
    for (int k = 0; k < P_COUNT && do_trace; k++) {
        if (only >= 0 && k != only) continue;
#ifndef KVX_BENCH_ROCKSDB
        if (k == P_ROCKS) continue;
#endif
        run_trace(k, dir, &tr, (size_t)trace_cap, &res[k]);
        fprintf(stderr, "bench_peers: %s trace done\n", peer_name[k]);
    }

    /* each row: value per peer, best over the peers that ran; higher is
     * better for put, cold and hit ratio, lower for the rest */
    enum { R_PUT, R_RESTART, R_COLD, R_P50, R_P99, R_AMP, R_HIT, R_WRITTEN, R_COUNT };
    static const char *const rname[R_COUNT] = {"put MB/s",  "restart ms", "cold GB/s",      "p50 us",
                                               "p99 us",    "space amp",  "trace hit ratio", "trace GB written"};
    static const int higher[R_COUNT] = {1, 0, 1, 0, 0, 0, 1, 0};
    double val[P_COUNT][R_COUNT] = {{0}}, best[R_COUNT];
    for (int j = 0; j < R_COUNT; j++) best[j] = higher[j] ? 0 : 1e300;
    for (int k = 0; k < P_COUNT; k++) {
        const result *r = &res[k];
        double v[R_COUNT] = {r->put_mbps, r->restart_ms, r->cold_gbps, r->p50_us, r->p99_us, r->amp, r->hit,
                             r->written_gb};
        for (int j = 0; j < R_COUNT; j++) {
            int has = j < R_HIT ? r->ran && v[j] > 0 : r->trace_ran;
            val[k][j] = has ? v[j] : -1;
            if (has && (higher[j] ? v[j] > best[j] : v[j] < best[j])) best[j] = v[j];
        }
    }
    if (do_rows) {
        printf("\n%-18s %-26s %9s %10s %9s %9s %9s %9s\n", "peer", "blocks served", "put MB/s", "restart ms",
               "cold GB/s", "p50 us", "p99 us", "space amp");
        for (int k = 0; k < P_COUNT; k++) {
            if (!res[k].ran) continue;
            const result *r = &res[k];
            printf("%-18s %-26s %9.1f %10.1f %9.2f %9.1f %9.1f %9.3f   (open to first hit in the new process: "
                   "%.1f ms)\n",
                   peer_name[k], k == P_KVX ? "verified (SHA-256 digest)" : "UNVERIFIED (FNV hash only)",
                   r->put_mbps, r->restart_ms, r->cold_gbps, r->p50_us, r->p99_us, r->amp, r->open_ms);
        }
    }
    if (do_rows && !restart_only && (only < 0 || only == P_KVX)) fio_put_print(fio_put, res[P_KVX].put_mbps);
    rounds_print(&rd);
    const result *rk = &res[P_KVX];
    if (do_rows && rk->ran && rk->fio_gbps > 0)
        printf("\ncold read against the disk: fio read kvx's %zu shard files (%.3f GB, the same bytes plus "
               "their tables) sequentially, O_DIRECT, io_uring, bs %ld, iodepth %ld: %.2f GB/s; kvx cold "
               "%.2f GB/s = %.2fx fio\n",
               rk->fio_files, rk->fio_gb, g_fio_bs, g_fio_depth, rk->fio_gbps, rk->cold_gbps,
               rk->cold_gbps / rk->fio_gbps);
    if (do_rows && rk->ran && rk->fio_mmap_gbps > 0)
        printf("the page cache's own limit: fio's mmap engine read the same files (buffered, bs %ld): %.2f GB/s; "
               "kvx cold = %.2fx of it%s\n",
               g_fio_bs, rk->fio_mmap_gbps, rk->cold_gbps / rk->fio_mmap_gbps,
               rd.n > 1 ? " (these two lines: medians of the rounds)" : "");
    else if (do_rows && rk->ran && !restart_only)
        printf("\ncold read against the disk: no fio reference (%s)\n",
               !g_fio ? "--no-fio" : fio_found() ? "fio failed" : "fio is not on PATH");
    if (do_trace) {
        printf("\ntrace %s: %zu requests, %zu block references, capacity %ld blocks (%.2f GiB of pages); "
               "the exact LRU's prefix hit ratio %.2f %%\n",
               trace_path, tr.nreq, tr.nids, trace_cap, (double)trace_cap * (double)g_pb / 1073741824.0,
               100.0 * lru_hit);
        printf("%-18s %-26s %9s %9s %11s %10s %8s %9s %9s\n", "peer", "eviction", "hit %", "GB written", "KV put GB",
               "written/KV", "seconds", "disk/cap", "peak");
        for (int k = 0; k < P_COUNT; k++) {
            if (!res[k].trace_ran) continue;
            const result *r = &res[k];
            char peak_s[16] = "-";
            if (k == P_KVX) snprintf(peak_s, sizeof peak_s, "%.4f", r->peak_amp);
            printf("%-18s %-26s %9.2f %9.2f %11.2f %10.2f %8.1f %9.3f %9s\n", peer_name[k],
                   k == P_KVX ? (g_kvx_hold_lru ? "kvx's own (goal = LRU's)" : "kvx's own (capacity bytes)")
                              : "the bench's exact LRU",
                   100.0 * r->hit, r->written_gb, r->kv_written_gb,
                   r->kv_written_gb > 0 ? r->written_gb / r->kv_written_gb : 0, r->trace_s, r->end_amp, peak_s);
        }
        if (res[P_KVX].trace_ran && res[P_KVX].kv_written_gb > 0) {
            const result *r = &res[P_KVX];
            printf("\nkvx's bytes written in the trace, by why (x: over the %.3f GB of KV put)\n",
                   r->kv_written_gb);
            for (int j = 0; j < SPLIT_N; j++)
                printf("  %-36s %8.3f GB %6.3fx\n", split_name[j], r->split[j], r->split[j] / r->kv_written_gb);
            printf("  %-36s %8.3f GB %6.3fx\n", "device total (/proc/self/io)", r->written_gb,
                   r->written_gb / r->kv_written_gb);
        }
    }
    printf("\nratio to the best peer in this run (1.00 = best; put, cold, hit: value/best, the rest: best/value)\n");
    printf("%-18s", "peer");
    for (int j = 0; j < R_COUNT; j++) printf(" %10.10s", rname[j]);
    printf("\n");
    FILE *tf = tsv ? fopen(tsv, "w") : NULL;
    if (tsv && !tf) fail(tsv, -errno);
    if (tf) fprintf(tf, "# row\tpeer\tvalue\tratio to the best peer\tverified\n");
    for (int k = 0; k < P_COUNT; k++) {
        if (!res[k].ran && !res[k].trace_ran) continue;
        printf("%-18s", peer_name[k]);
        for (int j = 0; j < R_COUNT; j++) {
            if (val[k][j] < 0) {
                printf(" %10s", "-");
                continue;
            }
            double rt = ratio(val[k][j], best[j], higher[j]);
            printf(" %10.2f", rt);
            if (tf) fprintf(tf, "%s\t%s\t%.6g\t%.4f\t%s\n", rname[j], peer_name[k], val[k][j], rt,
                            k == P_KVX ? "verified" : "unverified");
        }
        printf("\n");
    }
    if (tf && rk->ran && rk->fio_gbps > 0 && rd.n < 2)
        fprintf(tf, "cold / fio\tkvx\t%.6g\t%.4f\tfio bs %ld iodepth %ld: %.6g GB/s\n", rk->cold_gbps,
                rk->cold_gbps / rk->fio_gbps, g_fio_bs, g_fio_depth, rk->fio_gbps);
    if (tf && rk->ran && rk->fio_mmap_gbps > 0 && rd.n < 2)
        fprintf(tf, "cold / fio mmap\tkvx\t%.6g\t%.4f\tfio --ioengine=mmap bs %ld: %.6g GB/s\n", rk->cold_gbps,
                rk->cold_gbps / rk->fio_mmap_gbps, g_fio_bs, rk->fio_mmap_gbps);
    if (tf) rounds_tsv(tf, &rd);
    if (tf) fclose(tf);
    free(tr.ids);
    free(tr.off);
    free(tr.tok);
    free(tr.h);
    free(g_toks);
    free(g_hashes);
    free(g_pages);
    free(g_dst);
    return 0;
}
