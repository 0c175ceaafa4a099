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
 *   reopen ms     the page cache dropped for the peer's files
 *                 (posix_fadvise DONTNEED), then open in this process and
 *                 serve the first prompt (not a fresh process: the
 *                 process start is the same for every peer)
 *   cold GB/s     after that, every prompt's pages read once (cold)
 *   p50/p99 us    warm prefix get of a 64-block prompt: hashes, lookups
 *                 and the pages copied into one host buffer
 *   space amp     bytes on disk (st_blocks) over bytes of KV
 *
 *   bench_peers [--size small|large] [--blocks N] [--only PEER] DIR
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
#include <unistd.h>

#include "bench_common.h"
#include "kvx.h"

#ifdef KVX_BENCH_ROCKSDB
#include <rocksdb/c.h>
#endif

#define NB 64 /* blocks per prompt */

enum { P_KVX, P_FILE, P_ROCKS, P_LMDB, P_COUNT };
static const char *const peer_name[P_COUNT] = {"kvx", "file per block", "RocksDB (BlobDB)",
                                               "LMDB values"};

static kvx_geometry g_geo;
static uint32_t g_B;
static uint64_t g_pb;      /* page bytes */
static size_t g_prompts;   /* prompts of NB blocks */
static uint32_t *g_toks;   /* g_prompts * NB * B */
static uint64_t *g_hashes; /* g_prompts * NB */
static unsigned char *g_pages; /* one prompt's pages */
static unsigned char *g_dst;   /* where a get copies one prompt's pages */

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
static void fill_pages(size_t q)
{
    uint64_t *w = (uint64_t *)g_pages;
    size_t n = (size_t)(g_pb * NB / 8);
    for (size_t i = 0; i < n; i++) w[i] = mix(q * 0x100000000ull + i) & 0x7777777777777777ull;
}

static const uint32_t *toks_of(size_t q) { return g_toks + q * NB * g_B; }

static void rm_rf(const char *p)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    if (system(cmd)) {
    }
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
    kvx_view views[NB];
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
            o.capacity_bytes = g_pb * NB * g_prompts * 2 + ((uint64_t)1 << 30);
            rc = kvx_store_create(&p->kvx, p->dir, &o);
        } else {
            rc = kvx_store_open(&p->kvx, p->dir, &g_geo, 0);
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
        p->rdb = rocksdb_open(p->ropt, p->dir, &err);
        if (err) {
            fprintf(stderr, "bench_peers: rocksdb_open: %s\n", err);
            exit(1);
        }
        p->rw = rocksdb_writeoptions_create();
        rocksdb_writeoptions_set_sync(p->rw, 1);
        p->rr = rocksdb_readoptions_create();
        break;
    }
#endif
    case P_LMDB: {
        int rc;
        if (create && mkdir(p->dir, 0700)) fail(p->dir, -errno);
        if ((rc = mdb_env_create(&p->env))) fail("mdb_env_create", rc);
        mdb_env_set_mapsize(p->env, (size_t)(g_pb * NB * g_prompts * 2 + ((uint64_t)256 << 20)));
        if ((rc = mdb_env_open(p->env, p->dir, 0, 0600))) fail("mdb_env_open", rc);
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

/* Puts prompt q (g_pages holds its pages) durably. */
static void peer_put(peer *p, size_t q)
{
    const uint64_t *h = g_hashes + q * NB;
    switch (p->kind) {
    case P_KVX: {
        int rc = kvx_store_put(p->kvx, toks_of(q), (size_t)NB * g_B, g_pages, NB, NULL, NULL);
        if (rc || (rc = kvx_store_flush(p->kvx))) fail("kvx put", rc);
        break;
    }
    case P_FILE: {
        unsigned char touched[256] = {0};
        char tmp[1100], path[1100];
        for (int i = 0; i < NB; i++) {
            unsigned fan = (unsigned)(h[i] >> 56);
            snprintf(tmp, sizeof tmp, "%s/%02x/.tmp.%016" PRIx64, p->dir, fan, h[i]);
            snprintf(path, sizeof path, "%s/%02x/%016" PRIx64, p->dir, fan, h[i]);
            int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd < 0) fail(tmp, -errno);
            const unsigned char *src = g_pages + (size_t)i * g_pb;
            for (uint64_t off = 0; off < g_pb;) {
                ssize_t w = pwrite(fd, src + off, g_pb - off, (off_t)off);
                if (w <= 0) fail("pwrite", -errno);
                off += (uint64_t)w;
            }
            if (fsync(fd)) fail("fsync", -errno);
            close(fd);
            if (rename(tmp, path)) fail("rename", -errno);
            touched[fan] = 1;
            keys_add(p, h[i]);
        }
        for (int f = 0; f < 256; f++) {
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
        for (int i = 0; i < NB; i++)
            rocksdb_writebatch_put(wb, (const char *)&h[i], 8, (const char *)g_pages + (size_t)i * g_pb,
                                   (size_t)g_pb);
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
        for (int i = 0; i < NB && !rc; i++) {
            MDB_val k = {8, (void *)&h[i]}, v = {(size_t)g_pb, NULL};
            rc = mdb_put(t, p->dbi, &k, &v, MDB_RESERVE);
            if (!rc) memcpy(v.mv_data, g_pages + (size_t)i * g_pb, (size_t)g_pb);
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

/* The longest cached prefix of prompt q, its pages copied into g_dst;
 * returns the number of blocks served. The peers hash the tokens (chained
 * FNV) and stop at the first missing block. */
static size_t peer_get(peer *p, size_t q)
{
    size_t n = 0;
    uint64_t h[NB];
    if (p->kind != P_KVX) kvx_block_hashes(h, toks_of(q), (size_t)NB * g_B, g_B);
    switch (p->kind) {
    case P_KVX: {
        int rc = kvx_store_prefix(p->views, &n, p->kvx, toks_of(q), (size_t)NB * g_B, NB);
        if (rc) fail("kvx_store_prefix", rc);
        for (size_t i = 0; i < n; i++) memcpy(g_dst + i * g_pb, p->views[i].page, (size_t)g_pb);
        kvx_views_release(p->views, n);
        break;
    }
    case P_FILE: {
        char path[1100];
        for (; n < NB; n++) {
            if (!keys_has(p, h[n])) break;
            snprintf(path, sizeof path, "%s/%02x/%016" PRIx64, p->dir, (unsigned)(h[n] >> 56), h[n]);
            int fd = open(path, O_RDONLY);
            if (fd < 0) break;
            ssize_t r = pread(fd, g_dst + n * g_pb, (size_t)g_pb, 0);
            close(fd);
            if (r != (ssize_t)g_pb) break;
        }
        break;
    }
#ifdef KVX_BENCH_ROCKSDB
    case P_ROCKS:
        for (; n < NB; n++) {
            char *err = NULL;
            rocksdb_pinnableslice_t *v = rocksdb_get_pinned(p->rdb, p->rr, (const char *)&h[n], 8, &err);
            free(err);
            if (!v) break;
            size_t len;
            const char *d = rocksdb_pinnableslice_value(v, &len);
            int ok = len == g_pb;
            if (ok) memcpy(g_dst + n * g_pb, d, len);
            rocksdb_pinnableslice_destroy(v);
            if (!ok) break;
        }
        break;
#endif
    case P_LMDB:
        if (mdb_txn_renew(p->rtxn)) fail("mdb_txn_renew", -EIO);
        for (; n < NB; n++) {
            MDB_val k = {8, &h[n]}, v;
            if (mdb_get(p->rtxn, p->dbi, &k, &v) || v.mv_size != g_pb) break;
            memcpy(g_dst + n * g_pb, v.mv_data, (size_t)g_pb);
        }
        mdb_txn_reset(p->rtxn);
        break;
    default:
        break;
    }
    kvx_bench_keep(g_dst);
    return n;
}

/* ------------------------------------------------------------ the run */

typedef struct result {
    int ran;
    double put_mbps, reopen_ms, cold_gbps, p50_us, p99_us, amp;
} result;

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

static result run_peer(int kind, const char *base)
{
    result r = {0};
    peer *p = calloc(1, sizeof *p);
    if (!p) fail("calloc", -ENOMEM);
    p->kind = kind;
    snprintf(p->dir, sizeof p->dir, "%s/peer%d", base, kind);
    rm_rf(p->dir);
    double kv = (double)g_pb * NB * (double)g_prompts;

    peer_open(p, 1);
    double t_put = 0;
    for (size_t q = 0; q < g_prompts; q++) {
        fill_pages(q); /* not timed */
        double t0 = kvx_bench_now();
        peer_put(p, q);
        t_put += kvx_bench_now() - t0;
    }
    r.put_mbps = kv / t_put / 1e6;
    peer_close(p);
    r.amp = (double)walk(p->dir, 0) / kv;

    /* restart: cached pages dropped, open, first prefix served */
    walk(p->dir, 1);
    double t0 = kvx_bench_now();
    peer_open(p, 0);
    expect_full(peer_get(p, 0), 0, "reopen", kind);
    r.reopen_ms = (kvx_bench_now() - t0) * 1e3;

    /* cold read of every other prompt (prompt 0 is warm now) */
    if (g_prompts > 1) {
        t0 = kvx_bench_now();
        for (size_t q = 1; q < g_prompts; q++) expect_full(peer_get(p, q), q, "cold", kind);
        r.cold_gbps = (double)g_pb * NB * (double)(g_prompts - 1) / (kvx_bench_now() - t0) / 1e9;
    }

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
    free(p->keys);
    rm_rf(p->dir);
    free(p);
    r.ran = 1;
    return r;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench_peers [--size small|large] [--blocks N] [--only PEER] DIR\n"
            "  kvx against the stores engine teams persist KV in, same pages, keys and\n"
            "  durability: kvx | file per block | RocksDB (BlobDB) | LMDB values\n"
            "  (PEER for --only: kvx, file, rocksdb, lmdb). Each peer's files live in\n"
            "  DIR/peerN and are removed before the next peer starts.\n"
            "sizes:\n"
            "  small  64 KiB pages: B=16, L=2, Hkv=8, D=128, e4m3 (default; --blocks 4096)\n"
            "  large  2 MiB pages: B=16, L=32, Hkv=8, D=128, bf16 (default --blocks 512)\n"
            "--blocks N: blocks stored (a multiple of %d: prompts of %d blocks).\n"
            "DIR needs free space for about 2.5x the KV bytes (pages x blocks) + 1 GiB.\n"
            "rows: put MB/s (durable, one flush/commit/fsync round per prompt), reopen ms\n"
            "(page cache dropped, open, first prompt served), cold GB/s, warm prefix get\n"
            "p50/p99 us of a %d-block prompt (pages copied to a host buffer; up to 2048\n"
            "samples or ~5 s a peer), space amp. cold is 0 with a single prompt.\n"
#ifndef KVX_BENCH_ROCKSDB
            "This build has no RocksDB row (librocksdb-dev was not found at configure).\n"
#endif
            ,
            NB, NB, NB);
}

int main(int argc, char **argv)
{
    const char *size = "small", *dir = NULL;
    long blocks = 0;
    int only = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--size") && i + 1 < argc) {
            size = argv[++i];
        } else if (!strcmp(argv[i], "--blocks") && i + 1 < argc) {
            blocks = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            const char *o = argv[++i];
            only = !strcmp(o, "kvx") ? P_KVX : !strcmp(o, "file") ? P_FILE : !strcmp(o, "rocksdb") ? P_ROCKS
                 : !strcmp(o, "lmdb") ? P_LMDB : -2;
            if (only == -2) {
                usage(stderr);
                return 2;
            }
        } else if (argv[i][0] != '-' && !dir) {
            dir = argv[i];
        } else {
            usage(stderr);
            return 2;
        }
    }
    kvx_geometry small = {2, 8, 128, 16, KVX_QUANT_E4M3, 1}, large = {32, 8, 128, 16, KVX_QUANT_BF16, 1};
    if (!dir || (strcmp(size, "small") && strcmp(size, "large"))) {
        usage(stderr);
        return 2;
    }
    g_geo = !strcmp(size, "small") ? small : large;
    if (!blocks) blocks = !strcmp(size, "small") ? 4096 : 512;
    if (blocks < NB || blocks % NB) {
        fprintf(stderr, "bench_peers: --blocks must be a positive multiple of %d\n", NB);
        return 2;
    }
    g_B = g_geo.block_tokens;
    g_pb = kvx_page_bytes(&g_geo, g_B);
    g_prompts = (size_t)blocks / NB;
    double kv = (double)g_pb * (double)blocks;

    mkdir(dir, 0700);
    struct statvfs sv;
    double need = kv * 2.5 + (double)(1u << 30);
    if (statvfs(dir, &sv)) fail(dir, -errno);
    double have = (double)sv.f_bavail * (double)sv.f_frsize;
    printf("bench_peers: %s pages (%" PRIu64 " bytes), %ld blocks, %zu prompts of %d blocks; "
           "KV %.2f GiB; DIR needs %.2f GiB free, has %.2f GiB\n",
           size, g_pb, blocks, g_prompts, NB, kv / 1073741824.0, need / 1073741824.0, have / 1073741824.0);
    if (have < need) {
        fprintf(stderr, "bench_peers: not enough free space in %s\n", dir);
        return 1;
    }
#ifndef KVX_BENCH_ROCKSDB
    printf("bench_peers: built without librocksdb-dev: no RocksDB (BlobDB) row\n");
#endif

    g_toks = malloc((size_t)blocks * g_B * sizeof *g_toks);
    g_hashes = malloc((size_t)blocks * sizeof *g_hashes);
    g_pages = malloc((size_t)(g_pb * NB));
    /* page-aligned, as a pinned host buffer is: the copy's speed depends on
     * the source's and destination's offsets within a page (rep movsb) */
    g_dst = aligned_alloc(4096, (size_t)(g_pb * NB));
    if (!g_toks || !g_hashes || !g_pages || !g_dst) fail("malloc", -ENOMEM);
    memset(g_dst, 0, (size_t)(g_pb * NB));
    for (size_t q = 0; q < g_prompts; q++) {
        uint32_t *t = g_toks + q * NB * g_B;
        for (size_t i = 0; i < (size_t)NB * g_B; i++) t[i] = (uint32_t)mix(q * 1000003u + i);
        kvx_block_hashes(g_hashes + q * NB, t, (size_t)NB * g_B, g_B);
    }

    result res[P_COUNT] = {{0}};
    for (int k = 0; k < P_COUNT; k++) {
        if (only >= 0 && k != only) continue;
#ifndef KVX_BENCH_ROCKSDB
        if (k == P_ROCKS) continue;
#endif
        res[k] = run_peer(k, dir);
        fprintf(stderr, "bench_peers: %s done\n", peer_name[k]);
    }

    /* best of each row over the peers that ran (higher is better for
     * throughput, lower for the rest) */
    double best[6] = {0, 1e300, 0, 1e300, 1e300, 1e300};
    for (int k = 0; k < P_COUNT; k++) {
        if (!res[k].ran) continue;
        const result *r = &res[k];
        if (r->put_mbps > best[0]) best[0] = r->put_mbps;
        if (r->reopen_ms < best[1]) best[1] = r->reopen_ms;
        if (r->cold_gbps > best[2]) best[2] = r->cold_gbps;
        if (r->p50_us < best[3]) best[3] = r->p50_us;
        if (r->p99_us < best[4]) best[4] = r->p99_us;
        if (r->amp < best[5]) best[5] = r->amp;
    }
    printf("\n%-18s %-26s %9s %9s %9s %9s %9s %9s\n", "peer", "blocks served", "put MB/s", "reopen ms",
           "cold GB/s", "p50 us", "p99 us", "space amp");
    for (int k = 0; k < P_COUNT; k++) {
        if (!res[k].ran) continue;
        const result *r = &res[k];
        printf("%-18s %-26s %9.1f %9.1f %9.2f %9.1f %9.1f %9.3f\n", peer_name[k],
               k == P_KVX ? "verified (SHA-256 digest)" : "UNVERIFIED (FNV hash only)", r->put_mbps,
               r->reopen_ms, r->cold_gbps, r->p50_us, r->p99_us, r->amp);
    }
    printf("\nratio to the best peer in this run (1.00 = best; put and cold: value/best, others: best/value)\n");
    for (int k = 0; k < P_COUNT; k++) {
        if (!res[k].ran) continue;
        const result *r = &res[k];
        printf("%-18s %-26s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", peer_name[k], "",
               r->put_mbps / best[0], best[1] / r->reopen_ms, best[2] > 0 ? r->cold_gbps / best[2] : 0.0,
               best[3] / r->p50_us, best[4] / r->p99_us, best[5] / r->amp);
    }
    free(g_toks);
    free(g_hashes);
    free(g_pages);
    free(g_dst);
    return 0;
}
