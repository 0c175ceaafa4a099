/*
 * bench_prefix_c.c - the C side of the Go binding's comparison: prefix
 * lookups of 64-block prompts and batched page fetches on one store, timed
 * per block, beside a bare mdb_get (the physical reference for an index
 * lookup) on an LMDB environment of the same shape.
 *
 *   bench_prefix_c DIR     creates the store at DIR when it is missing
 *                          (the same sequences as bindings/go's benchmarks),
 *                          then times it; KVX_BENCH_STORE=DIR makes
 *                          `go test -bench` time the very same store.
 *
 * Store: 256 sequences x 64 full blocks (B = 16, 1 KiB pages: lookup cost
 * does not depend on page size). Token i of sequence s is
 * ((s*1000003 + i*7919 + 1) & 0xFFFFFF) + 1, as in helpers_test.go.
 */
#include "bench_common.h"
#include "kvx.h"

#include <errno.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define NSEQ 256
#define NBLK 64
#define B 16
#define NTOK (NBLK * B + 5)

static uint32_t toks[NSEQ][NTOK];

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_prefix_c: %s: %s (%s)\n", what, kvx_err_name(rc), kvx_last_error());
    exit(1);
}

static const kvx_geometry geom = {1, 2, 8, B, KVX_QUANT_FP16, 0x1234};

static void create_store(const char *dir)
{
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = geom;
    o.flags = KVX_STORE_NOSYNC;
    kvx_store *s;
    int rc = kvx_store_create(&s, dir, &o);
    if (rc) die("create", rc);
    uint64_t pb = kvx_page_bytes(&geom, B);
    uint8_t *pages = calloc(NBLK, pb);
    for (int q = 0; q < NSEQ; q++) {
        for (size_t j = 0; j < NBLK * pb; j++) pages[j] = (uint8_t)(q * 31 + j);
        size_t n = 0;
        if ((rc = kvx_store_put(s, toks[q], NTOK, pages, NBLK, NULL, &n))) die("put", rc);
    }
    if ((rc = kvx_store_flush(s))) die("flush", rc);
    free(pages);
    kvx_store_close(s);
}

/* Bare mdb_get of NSEQ*NBLK u64 integer keys (dupsort, 16-byte values, as
 * the store's hash table), looked up in the same order, one read
 * transaction per 64 lookups (as one prefix call). ns per get. */
static double mdb_get_ns(void)
{
    char tmpl[] = "/tmp/kvx-bench-mdb-XXXXXX";
    if (!mkdtemp(tmpl)) return 0;
    MDB_env *env;
    MDB_dbi dbi;
    MDB_txn *txn;
    mdb_env_create(&env);
    mdb_env_set_mapsize(env, 256u << 20);
    mdb_env_set_maxdbs(env, 4);
    if (mdb_env_open(env, tmpl, MDB_NOTLS | MDB_NOSYNC, 0600)) return 0;
    mdb_txn_begin(env, NULL, 0, &txn);
    mdb_dbi_open(txn, "hash", MDB_CREATE | MDB_INTEGERKEY | MDB_DUPSORT | MDB_DUPFIXED, &dbi);
    static uint64_t keys[NSEQ][NBLK];
    for (int q = 0; q < NSEQ; q++) {
        kvx_block_hashes(keys[q], toks[q], NBLK * B, B);
        for (int i = 0; i < NBLK; i++) {
            uint64_t v[2] = {(uint64_t)q << 8 | (uint64_t)i, 1};
            MDB_val k = {8, &keys[q][i]}, d = {16, v};
            mdb_put(txn, dbi, &k, &d, 0);
        }
    }
    mdb_txn_commit(txn);
    MDB_txn *rt;
    mdb_txn_begin(env, NULL, MDB_RDONLY, &rt);
    mdb_txn_reset(rt);
    double best = 1e300;
    uint64_t sink = 0;
    for (int rep = 0; rep < 7; rep++) {
        double t0 = kvx_bench_now();
        for (int q = 0; q < NSEQ; q++) {
            mdb_txn_renew(rt);
            for (int i = 0; i < NBLK; i++) {
                MDB_val k = {8, &keys[q][i]}, d;
                if (mdb_get(rt, dbi, &k, &d) == 0) sink += *(const uint8_t *)d.mv_data;
            }
            mdb_txn_reset(rt);
        }
        double t = kvx_bench_now() - t0;
        if (t < best) best = t;
    }
    kvx_bench_keep(&sink);
    mdb_txn_abort(rt);
    mdb_env_close(env);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpl);
    if (system(cmd)) { /* best effort */ }
    return best / (NSEQ * NBLK) * 1e9;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: bench_prefix_c STORE_DIR (created when missing)\n");
        return 2;
    }
    const char *dir = argv[1];
    for (int q = 0; q < NSEQ; q++)
        for (int i = 0; i < NTOK; i++) toks[q][i] = (uint32_t)(((q * 1000003 + i * 7919 + 1) & 0xFFFFFF) + 1);
    struct stat st;
    if (stat(dir, &st) != 0) create_store(dir);

    kvx_store *s;
    int rc = kvx_store_open(&s, dir, &geom, KVX_STORE_READONLY);
    if (rc) die("open", rc);
    static kvx_view views[NBLK];

    /* warm: map every shard, fault the index in */
    for (int q = 0; q < NSEQ; q++) {
        size_t n = 0;
        if ((rc = kvx_store_prefix(views, &n, s, toks[q], NTOK, NBLK)) || n != NBLK) die("prefix", rc ? rc : KVX_ENOTFOUND);
        kvx_views_release(views, n);
    }
    double best = 1e300;
    for (int rep = 0; rep < 7; rep++) {
        double t0 = kvx_bench_now();
        for (int q = 0; q < NSEQ; q++) {
            size_t n = 0;
            kvx_store_prefix(views, &n, s, toks[q], NTOK, NBLK);
            kvx_views_release(views, n);
        }
        double t = kvx_bench_now() - t0;
        if (t < best) best = t;
    }
    double prefix_ns = best / (NSEQ * NBLK) * 1e9;
    double get_ns = mdb_get_ns();
    printf("prefix  64-block batches: %.1f ns/block  (bare mdb_get %.1f ns: %.2fx)\n", prefix_ns, get_ns,
           get_ns > 0 ? prefix_ns / get_ns : 0);

    /* fetch: 64 pages of one prompt per batch, page cache (buffered pread) */
    kvx_pool_options po = KVX_POOL_OPTIONS_INIT;
    po.bytes = 4u << 20;
    po.flags = KVX_POOL_NO_MLOCK | KVX_POOL_NO_CUDA;
    kvx_pool *pool;
    if ((rc = kvx_pool_create(&pool, &po))) die("pool", rc);
    for (int mode = KVX_IO_AUTO; mode <= KVX_IO_PREAD; mode += 2) {
        kvx_fetch_options fo = KVX_FETCH_OPTIONS_INIT;
        fo.io_mode = mode;
        fo.flags = KVX_FETCH_BUFFERED;
        kvx_fetch *f;
        if ((rc = kvx_fetch_create(&f, pool, &fo))) die("fetch", rc);
        static kvx_fetch_req reqs[NSEQ][NBLK];
        static kvx_view held[NSEQ][NBLK];
        for (int q = 0; q < NSEQ; q++) {
            size_t n = 0;
            kvx_store_prefix(held[q], &n, s, toks[q], NTOK, NBLK);
            for (int i = 0; i < NBLK; i++) reqs[q][i] = (kvx_fetch_req){held[q][i].shard, held[q][i].entry};
        }
        static kvx_fetch_result res[NBLK];
        double fb = 1e300;
        for (int rep = 0; rep < 5; rep++) {
            double t0 = kvx_bench_now();
            for (int q = 0; q < NSEQ; q++) {
                if ((rc = kvx_fetch_submit(f, reqs[q], NBLK))) die("submit", rc);
                while ((rc = kvx_fetch_wait(f, res, NBLK, 5)) == -ETIMEDOUT) {}
                if (rc || res[0].status) die("wait", rc ? rc : res[0].status);
                kvx_fetch_release(f);
            }
            double t = kvx_bench_now() - t0;
            if (t < fb) fb = t;
        }
        uint64_t pb = kvx_page_bytes(&geom, B);
        double ns = fb / (NSEQ * NBLK) * 1e9;
        double mem = kvx_bench_memcpy_gbps(pb * NBLK, 9);
        printf("fetch   64-page batches (%s, buffered, %llu-byte pages): %.1f ns/page  %.2f GB/s  (memcpy %.2f GB/s)\n",
               kvx_io_mode_name(kvx_fetch_mode(f)), (unsigned long long)pb, ns, kvx_bench_gbps((double)pb, ns * 1e-9),
               mem);
        kvx_fetch_destroy(f);
        for (int q = 0; q < NSEQ; q++) kvx_views_release(held[q], NBLK);
    }
    kvx_pool_destroy(pool);
    kvx_store_close(s);
    return 0;
}
