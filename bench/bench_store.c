/*
 * bench_store.c - the store's benchmarks, each figure a ratio to a physical
 * reference measured in the same run (bench/RESULTS.md, "## Store"):
 *
 *   bench_store lookup DIR   prefix lookup ns/block vs a bare mdb_get loop
 *                            over the same keys in one read txn
 *   bench_store put DIR      put+flush MB/s vs fio sequential write with
 *                            fsync on the same disk (fio must be on PATH),
 *                            and vs a bare pwrite+fsync loop timed like kvx
 *   bench_store open DIR     open time with 10^3, 10^5, 10^6 blocks indexed
 *   bench_store trace DIR FILE.jsonl...
 *                            replay Mooncake traces (B = 512, tiny pages,
 *                            token ids derived from the hash ids) at several
 *                            capacities: prefix hit ratio vs an exact LRU
 *                            cache of the same capacity and vs infinite
 *
 * DIR is a scratch directory on the disk to measure (removed afterwards).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/os.h"
#include "engine/store.h"
#include "index/index.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void rm_rf(const char *p)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    if (system(cmd)) {
    }
}

static int nofsync(int fd) { (void)fd; return 0; }

static void die(const char *what)
{
    fprintf(stderr, "%s: %s\n", what, kvx_last_error());
    exit(1);
}

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static kvx_store *make(const char *dir, kvx_geometry g, uint64_t cap, uint32_t flags)
{
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = g;
    o.capacity_bytes = cap;
    o.flags = flags;
    kvx_store *s;
    if (kvx_store_create(&s, dir, &o)) die("create");
    return s;
}

/* ---------------------------------------------------------------- lookup */

static int bench_lookup(const char *base)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/lookup", base);
    rm_rf(dir);
    kvx_geometry g = {1, 1, 4, 16, KVX_QUANT_FP16, 1};
    enum { NSEQ = 2000, NB = 64 };
    kvx_os.fsync = nofsync; /* building the data set is not what is measured */
    kvx_store *s = make(dir, g, (uint64_t)64 << 30, KVX_STORE_NOSYNC);
    uint64_t pb = kvx_page_bytes(&g, 16);
    uint8_t *pages = calloc(NB, pb);
    uint32_t *toks = malloc((size_t)NSEQ * NB * 16 * 4);
    uint64_t *hashes = malloc((size_t)NSEQ * NB * 8);
    for (size_t q = 0; q < NSEQ; q++) {
        uint32_t *t = toks + q * NB * 16;
        for (size_t i = 0; i < NB * 16; i++) t[i] = (uint32_t)mix(q * 100000 + i);
        kvx_block_hashes(hashes + q * NB, t, NB * 16, 16);
        if (kvx_store_put(s, t, NB * 16, pages, NB, NULL, NULL)) die("put");
        if (q % 200 == 199 && kvx_store_flush(s)) die("flush");
    }
    if (kvx_store_flush(s)) die("flush");
    kvx_os_reset();
    kvx_view *v = calloc(NB, sizeof *v);
    /* The reference: the same LMDB environment and database, the same keys
     * (the chained hashes, precomputed), the same number of gets, one read
     * transaction per prompt renewed from a reset one (as the store's own
     * pool does; mdb_txn_begin per prompt would inflate the reference). */
    kvx_index *ix = kvx_cat_index(s->cat);
    MDB_txn *rt;
    if (mdb_txn_begin(ix->env, NULL, MDB_RDONLY, &rt)) return 1;
    mdb_txn_reset(rt);
    uint64_t sink = 0;
    double best_store = 1e9, best_bare = 1e9, best_hash = 1e9;
    for (int rep = 0; rep < 9; rep++) { /* rep 0 warms both paths */
        double t0 = now_s();
        size_t hits = 0;
        for (size_t q = 0; q < NSEQ; q++) {
            size_t n;
            if (kvx_store_prefix(v, &n, s, toks + q * NB * 16, NB * 16, NB)) die("prefix");
            hits += n;
            kvx_views_release(v, n);
        }
        double t1 = now_s();
        if (hits != (size_t)NSEQ * NB) {
            fprintf(stderr, "prefix served %zu of %d\n", hits, NSEQ * NB);
            return 1;
        }
        size_t found = 0;
        for (size_t q = 0; q < NSEQ; q++) {
            if (mdb_txn_renew(rt)) return 1;
            for (size_t i = 0; i < NB; i++) {
                MDB_val k = {8, &hashes[q * NB + i]}, d;
                if (mdb_get(rt, ix->hash, &k, &d) == 0) {
                    found++;
                    sink += *(const uint8_t *)d.mv_data;
                }
            }
            mdb_txn_reset(rt);
        }
        double t2 = now_s();
        /* the chained hashes alone (part of kvx's cost, not of the reference) */
        for (size_t q = 0; q < NSEQ; q++) {
            uint64_t h = 0;
            for (size_t i = 0; i < NB; i++) h = kvx_block_hash(h, toks + (q * NB + i) * 16, 16);
            sink += h;
        }
        double t3 = now_s();
        if (found != (size_t)NSEQ * NB) return 1;
        if (rep == 0) continue;
        if (t1 - t0 < best_store) best_store = t1 - t0;
        if (t2 - t1 < best_bare) best_bare = t2 - t1;
        if (t3 - t2 < best_hash) best_hash = t3 - t2;
    }
    mdb_txn_abort(rt);
    double nblk = (double)NSEQ * NB;
    printf("lookup: %d prompts x %d blocks (%.0f blocks indexed), best of 8 interleaved rounds after a warm one\n", NSEQ,
           NB, nblk);
    printf("  kvx_store_prefix   %.1f ns/block (hash + digest + get + entry, lineage and digest check + view)\n", best_store / nblk * 1e9);
    printf("  bare mdb_get loop  %.1f ns/block (same env, keys and gets; renewed read txn per prompt)\n",
           best_bare / nblk * 1e9);
    printf("  chained hash alone %.1f ns/block (B=16)\n", best_hash / nblk * 1e9);
    printf("  ratio              %.2fx (target <= 2.0x with the prefix digest)%s\n", best_store / best_bare, sink == 42 ? " " : "");
    free(v);
    kvx_store_close(s);
    free(pages);
    free(toks);
    free(hashes);
    rm_rf(dir);
    return 0;
}

/* ------------------------------------------------------------------- put */

static double fio_mbps(const char *dir, uint64_t bytes, uint64_t bs, uint64_t fsync_every)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "fio --name=seqw --directory='%s' --rw=write --bs=%" PRIu64 " --size=%" PRIu64
             " --fsync=%" PRIu64 " --end_fsync=1 --ioengine=psync --output-format=terse --terse-version=3 2>/dev/null"
             " | awk -F';' '{print $48}'",
             dir, bs, bytes, fsync_every);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    double kbs = -1;
    if (fscanf(p, "%lf", &kbs) != 1) kbs = -1;
    pclose(p);
    char f[1200];
    snprintf(f, sizeof f, "%s/seqw.0.0", dir);
    unlink(f);
    return kbs / 1024.0; /* terse bandwidth is KiB/s */
}

/* Put+flush vs fio. Every page is distinct (a 32 MiB+ array, read from
 * DRAM as a real engine's pages would be), while fio writes every block
 * from one 256 KiB buffer that stays in cache (its default), so the
 * comparison leans towards fio. */
static double put_run(const char *dir, kvx_geometry g, uint64_t pb, size_t nblk, size_t per_flush, const uint8_t *src,
                      int rep, double *tput, double *tflush)
{
    rm_rf(dir);
    kvx_store *s = make(dir, g, (uint64_t)64 << 30, 0);
    uint32_t *t = malloc(per_flush * 16 * 4);
    *tput = *tflush = 0;
    double t0 = now_s();
    for (size_t f = 0; f < nblk / per_flush; f++) {
        for (size_t i = 0; i < per_flush * 16; i++) t[i] = (uint32_t)mix(rep * 1000000 + f * 10000 + i);
        double a = now_s();
        if (kvx_store_put(s, t, per_flush * 16, src, per_flush, NULL, NULL)) die("put");
        double b = now_s();
        if (kvx_store_flush(s)) die("flush");
        *tput += b - a;
        *tflush += now_s() - b;
    }
    double t1 = now_s();
    kvx_store_close(s);
    free(t);
    rm_rf(dir);
    return (double)nblk * (double)pb / (t1 - t0) / 1048576.0;
}

/* The bare write path, timed like kvx's (wall clock, file creation and
 * the last fsync included): 256 KiB pwrites from one cached buffer into a
 * new file per flush, fsync at each flush, as the store writes one shard
 * file per flush. */
static double bare_mbps(const char *dir, uint64_t pb, size_t nblk, size_t per_flush, const uint8_t *buf)
{
    rm_rf(dir);
    if (mkdir(dir, 0700)) return -1;
    char f[1200];
    double t0 = now_s();
    for (size_t k = 0; k < nblk / per_flush; k++) {
        snprintf(f, sizeof f, "%s/bare.%zu", dir, k);
        int fd = open(f, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) return -1;
        for (size_t i = 0; i < per_flush; i++)
            if (pwrite(fd, buf, pb, (off_t)(i * pb)) != (ssize_t)pb) return -1;
        if (fsync(fd)) return -1;
        close(fd);
    }
    double t1 = now_s();
    rm_rf(dir);
    return (double)nblk * (double)pb / (t1 - t0) / 1048576.0;
}

static int bench_put(const char *base)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/put", base);
    rm_rf(dir);
    /* 256 KiB blocks: L=4, Hkv=8, D=128, B=16, fp16 */
    kvx_geometry g = {4, 8, 128, 16, KVX_QUANT_FP16, 1};
    uint64_t pb = kvx_page_bytes(&g, 16);
    enum { NBLK = 1024 };
    size_t PER_FLUSH = getenv("KVX_BENCH_PER_FLUSH") ? strtoul(getenv("KVX_BENCH_PER_FLUSH"), NULL, 10) : 128;
    if (PER_FLUSH < 1 || PER_FLUSH > NBLK) PER_FLUSH = 128;
    uint8_t *dram = malloc(PER_FLUSH * pb);
    for (size_t i = 0; i < PER_FLUSH * pb / 8; i++) ((uint64_t *)dram)[i] = mix(i);
    double best_dram = 0, best_fio = 0, best_bare = 0;
    for (int rep = 0; rep < 3; rep++) {
        double tp, tf;
        double dr = put_run(dir, g, pb, NBLK, PER_FLUSH, dram, rep, &tp, &tf);
        printf("  run %d: kvx %.0f MiB/s (put %.0f ms, flush %.0f ms)\n", rep, dr, tp * 1e3, tf * 1e3);
        if (mkdir(dir, 0700)) return 1;
        double fm = fio_mbps(dir, (uint64_t)NBLK * pb, pb, PER_FLUSH);
        rm_rf(dir);
        double bm = bare_mbps(dir, pb, NBLK, PER_FLUSH, dram);
        printf("  run %d: fio %.0f MiB/s, bare pwrite+fsync loop %.0f MiB/s\n", rep, fm, bm);
        if (bm > best_bare) best_bare = bm;
        if (dr > best_dram) best_dram = dr;
        if (fm > best_fio) best_fio = fm;
    }
    printf("put+flush: %d blocks of %" PRIu64 " KiB, flush every %zu blocks (%" PRIu64 " MiB), best of 3\n", NBLK,
           pb >> 10, PER_FLUSH, (PER_FLUSH * pb) >> 20);
    printf("  kvx put+flush (distinct pages)  %.0f MiB/s\n", best_dram);
    printf("  fio seq write (one cached buf)  %.0f MiB/s (bs=%" PRIu64 "K, fsync every %zu writes, psync)\n", best_fio,
           pb >> 10, PER_FLUSH);
    printf("  bare pwrite+fsync loop          %.0f MiB/s (one cached buffer, a new file per flush, wall clock)\n",
           best_bare);
    printf("  ratio                           %.2fx of fio (target >= 0.8x), %.2fx of the bare loop\n",
           best_fio > 0 ? best_dram / best_fio : 0, best_bare > 0 ? best_dram / best_bare : 0);
    free(dram);
    rm_rf(dir);
    return 0;
}

/* ------------------------------------------------------------------ open */

static int bench_open(const char *base)
{
    kvx_geometry g = {1, 1, 1, 16, KVX_QUANT_FP16, 1}; /* 64-byte pages */
    const uint64_t sizes[3] = {1000, 100000, 1000000};
    uint32_t *t = malloc(4096 * 16 * 4);
    uint8_t *pages = calloc(4096, 64);
    printf("open: tiny geometry (B=16, 64-byte pages), best of 5 opens, of 3 reindexes\n");
    for (int k = 0; k < 3; k++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/open%d", base, k);
        rm_rf(dir);
        kvx_os.fsync = nofsync;
        kvx_store *s = make(dir, g, (uint64_t)1 << 40, KVX_STORE_NOSYNC);
        for (uint64_t done = 0, q = 0; done < sizes[k]; q++) {
            uint64_t nb = sizes[k] - done < 4096 ? sizes[k] - done : 4096;
            for (size_t i = 0; i < nb * 16; i++) t[i] = (uint32_t)mix(q * 1000000 + i);
            if (kvx_store_put(s, t, nb * 16, pages, nb, NULL, NULL)) die("put");
            if (kvx_store_flush(s)) die("flush");
            done += nb;
        }
        kvx_store_close(s);
        kvx_os_reset();
        double best_w = 1e9, best_r = 1e9, best_v = 1e9;
        kvx_store_stats st;
        for (int rep = 0; rep < 5; rep++) {
            double t0 = now_s();
            if (kvx_store_open(&s, dir, NULL, 0)) die("open");
            double t1 = now_s();
            if (kvx_store_stat(&st, s)) die("stat");
            kvx_store_close(s);
            double t2 = now_s();
            if (kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY)) die("open ro");
            double t3 = now_s();
            kvx_store_close(s);
            double t4 = now_s();
            if (kvx_store_open(&s, dir, NULL, KVX_STORE_VERIFY)) die("open verify");
            double t5 = now_s();
            kvx_store_close(s);
            if (t1 - t0 < best_w) best_w = t1 - t0;
            if (t3 - t2 < best_r) best_r = t3 - t2;
            if (t5 - t4 < best_v) best_v = t5 - t4;
        }
        /* recovery's two heavy paths: kvx_store_reindex on an open writer,
         * and a writer's open that finds index/ gone (the plan from files) */
        double best_x = 1e9, best_l = 1e9;
        for (int rep = 0; rep < 3; rep++) {
            if (kvx_store_open(&s, dir, NULL, 0)) die("open");
            double t0 = now_s();
            if (kvx_store_reindex(s)) die("reindex");
            double t1 = now_s();
            kvx_store_close(s);
            char idx[1100];
            snprintf(idx, sizeof idx, "%s/index", dir);
            rm_rf(idx);
            double t2 = now_s();
            if (kvx_store_open(&s, dir, NULL, 0)) die("open without index/");
            double t3 = now_s();
            kvx_store_close(s);
            if (t1 - t0 < best_x) best_x = t1 - t0;
            if (t3 - t2 < best_l) best_l = t3 - t2;
        }
        printf("  %8" PRIu64 " blocks in %3" PRIu64 " shards: writer open %.2f ms, read-only %.2f ms, "
               "with KVX_STORE_VERIFY %.2f ms, reindex %.2f ms, writer open without index/ %.2f ms\n",
               st.blocks, st.shards, best_w * 1e3, best_r * 1e3, best_v * 1e3, best_x * 1e3, best_l * 1e3);
        rm_rf(dir);
    }
    free(t);
    free(pages);
    return 0;
}

/* ----------------------------------------------------------------- trace */

typedef struct trace {
    uint32_t *ids; /* all requests' hash ids, concatenated */
    size_t *off;   /* request i: ids[off[i] .. off[i+1]) */
    size_t nreq, nids;
    uint32_t max_id;
} trace;

/* Reads a Mooncake trace with json-c: one JSON object per line, its
 * "hash_ids" an array of integers in [0, 2^32 - 2] (the LRU arrays are
 * indexed by id, UINT32_MAX is their end marker). Blank lines are skipped;
 * any other line that is not such an object is an error, named by line. */
static int load_trace(trace *tr, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    memset(tr, 0, sizeof *tr);
    size_t cap = 1 << 20, rcap = 1 << 14;
    tr->ids = malloc(cap * 4);
    tr->off = malloc(rcap * sizeof *tr->off);
    json_tokener *tok = json_tokener_new();
    if (!tr->ids || !tr->off || !tok) abort();
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    char *line = NULL;
    size_t ln = 0, lineno = 0;
    ssize_t len;
    int rc = 0;
    while (!rc && (len = getline(&line, &ln, f)) > 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == (size_t)len) continue;
        json_tokener_reset(tok);
        json_object *o = len < INT32_MAX && strlen(line) == (size_t)len
                             ? json_tokener_parse_ex(tok, line, (int)len + 1)
                             : NULL;
        json_object *ids;
        if (!o || json_tokener_get_error(tok) != json_tokener_success ||
            !json_object_object_get_ex(o, "hash_ids", &ids) || !json_object_is_type(ids, json_type_array)) {
            fprintf(stderr, "%s:%zu: not a trace line with \"hash_ids\": [...]\n", path, lineno);
            rc = -1;
        }
        if (tr->nreq + 2 > rcap) tr->off = realloc(tr->off, (rcap *= 2) * sizeof *tr->off);
        if (!tr->off) abort();
        if (!rc) tr->off[tr->nreq++] = tr->nids;
        size_t n = rc ? 0 : json_object_array_length(ids);
        for (size_t k = 0; k < n; k++) {
            json_object *e = json_object_array_get_idx(ids, k);
            int64_t v = json_object_is_type(e, json_type_int) ? json_object_get_int64(e) : -1;
            if (v < 0 || v >= (int64_t)UINT32_MAX) {
                fprintf(stderr, "%s:%zu: hash_ids[%zu] is not an integer in [0, 2^32 - 2]\n", path, lineno, k);
                rc = -1;
                break;
            }
            if (tr->nids == cap) tr->ids = realloc(tr->ids, (cap *= 2) * 4);
            if (!tr->ids) abort();
            tr->ids[tr->nids++] = (uint32_t)v;
            if (v > tr->max_id) tr->max_id = (uint32_t)v;
        }
        json_object_put(o);
    }
    tr->off[tr->nreq] = tr->nids;
    json_tokener_free(tok);
    free(line);
    fclose(f);
    if (rc) {
        free(tr->ids);
        free(tr->off);
        memset(tr, 0, sizeof *tr);
    }
    return rc;
}

/* Exact LRU over block ids: doubly linked list in arrays, per-block hits. */
typedef struct lru {
    uint32_t *prev, *next;
    uint8_t *in;
    uint32_t head, tail; /* head = most recent */
    size_t n, cap;
} lru;

#define NIL UINT32_MAX

static void lru_init(lru *l, uint32_t max_id, size_t cap)
{
    l->prev = malloc(((size_t)max_id + 1) * 4);
    l->next = malloc(((size_t)max_id + 1) * 4);
    l->in = calloc((size_t)max_id + 1, 1);
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

static int lru_touch(lru *l, uint32_t x)
{
    int hit = l->in[x];
    if (hit) {
        lru_unlink(l, x);
    } else {
        if (l->n == l->cap) {
            uint32_t t = l->tail;
            lru_unlink(l, t);
            l->in[t] = 0;
            l->n--;
        }
        l->in[x] = 1;
        l->n++;
    }
    l->prev[x] = NIL;
    l->next[x] = l->head;
    if (l->head != NIL) l->prev[l->head] = x;
    l->head = x;
    if (l->tail == NIL) l->tail = x;
    return hit;
}

static void lru_free(lru *l)
{
    free(l->prev);
    free(l->next);
    free(l->in);
}

static int bench_trace(const char *base, int nfiles, char **files)
{
    kvx_geometry g = {1, 1, 2, 512, KVX_QUANT_FP16, 1}; /* 4 KiB pages */
    uint64_t pb = kvx_page_bytes(&g, 512);
    size_t caps[3] = {1000, 10000, 50000};
    if (getenv("KVX_BENCH_CAP")) caps[0] = caps[1] = caps[2] = strtoul(getenv("KVX_BENCH_CAP"), NULL, 10);
    printf("trace replay: B=512, 4 KiB pages; per request: prefix lookup, then put + flush of its blocks\n");
    printf("  (LMDB NOSYNC and no-op fsync: this measures the cache policy, not the disk)\n");
    for (int fi = 0; fi < nfiles; fi++) {
        trace tr;
        if (load_trace(&tr, files[fi])) {
            fprintf(stderr, "cannot read %s\n", files[fi]);
            return 1;
        }
        /* infinite cache */
        uint8_t *seen = calloc((size_t)tr.max_id + 1, 1);
        size_t inf_hits = 0;
        for (size_t i = 0; i < tr.nids; i++) {
            inf_hits += seen[tr.ids[i]];
            seen[tr.ids[i]] = 1;
        }
        free(seen);
        const char *name = strrchr(files[fi], '/') ? strrchr(files[fi], '/') + 1 : files[fi];
        printf("  %s: %zu requests, %zu block references, infinite cache %.2f %%\n", name, tr.nreq, tr.nids,
               100.0 * (double)inf_hits / (double)tr.nids);
        for (int ci = 0; ci < 3; ci++) {
            lru l;
            lru_init(&l, tr.max_id, caps[ci]);
            /* per-block hits (the data README's figure), and the hits of
             * the same LRU counted as a prefix cache counts them (up to a
             * request's first miss): the part of the gap no prefix cache
             * can close */
            size_t lru_hits = 0, lru_prefix = 0;
            for (size_t r = 0; r < tr.nreq; r++) {
                int whole = 1;
                for (size_t i = tr.off[r]; i < tr.off[r + 1]; i++) {
                    int hit = lru_touch(&l, tr.ids[i]);
                    lru_hits += (size_t)hit;
                    whole &= hit;
                    lru_prefix += (size_t)whole;
                }
            }
            lru_free(&l);

            char dir[1024];
            snprintf(dir, sizeof dir, "%s/trace", base);
            rm_rf(dir);
            kvx_os.fsync = nofsync;
            kvx_os.fdatasync = nofsync;
            /* the same number of blocks: a block costs its page + its lineage
             * record + its share of a shard's header */
            kvx_store_options o = KVX_STORE_OPTIONS_INIT;
            o.geometry = g;
            uint64_t per_block = kvx_align_up(pb, 4096) + 24 + 8 + 8 + 4 * 512;
            o.capacity_bytes = caps[ci] * per_block;
            o.flags = KVX_STORE_NOSYNC;
            kvx_store *s;
            if (kvx_store_create(&s, dir, &o)) die("create");
            size_t maxb = 0;
            for (size_t r = 0; r < tr.nreq; r++)
                if (tr.off[r + 1] - tr.off[r] > maxb) maxb = tr.off[r + 1] - tr.off[r];
            uint32_t *tok = malloc(maxb * 512 * 4 + 4);
            uint8_t *pages = calloc(maxb, pb);
            kvx_view *v = calloc(maxb + 1, sizeof *v);
            size_t store_hits = 0;
            double t0 = now_s();
            for (size_t r = 0; r < tr.nreq; r++) {
                size_t nb = tr.off[r + 1] - tr.off[r];
                for (size_t b = 0; b < nb; b++) {
                    uint32_t id = tr.ids[tr.off[r] + b];
                    for (size_t j = 0; j < 512; j++) tok[b * 512 + j] = j ? (uint32_t)j : id;
                }
                size_t n;
                if (kvx_store_prefix(v, &n, s, tok, nb * 512, nb)) die("prefix");
                kvx_views_release(v, n);
                store_hits += n;
                if (kvx_store_put(s, tok, nb * 512, pages, nb, NULL, NULL)) die("put");
                if (kvx_store_flush(s)) die("flush");
            }
            double t1 = now_s();
            kvx_store_stats st;
            kvx_store_stat(&st, s);
            uint64_t carried = s->carried;
            kvx_store_close(s);
            kvx_os_reset();
            rm_rf(dir);
            double hs = 100.0 * (double)store_hits / (double)tr.nids, hl = 100.0 * (double)lru_hits / (double)tr.nids;
            printf("    capacity %5zu blocks: store %.2f %%, exact LRU %.2f %% (%.2f %% as prefix hits) -> %.3fx of LRU, "
                   "%.3fx of infinite; "
                   "%llu evictions, %llu compactions, %llu blocks carried (%.2f per block put), %.0f req/s; at the end %llu blocks in "
                   "%llu shards, %.0f bytes/block\n",
                   caps[ci], hs, hl, 100.0 * (double)lru_prefix / (double)tr.nids, hl > 0 ? hs / hl : 0, hs / (100.0 * (double)inf_hits / (double)tr.nids),
                   (unsigned long long)st.evictions, (unsigned long long)st.compactions, (unsigned long long)carried,
                   (double)carried / (double)(tr.nids - store_hits), (double)tr.nreq / (t1 - t0),
                   (unsigned long long)st.blocks, (unsigned long long)st.shards,
                   st.blocks ? (double)st.bytes / (double)st.blocks : 0.0);
            fflush(stdout);
            free(tok);
            free(pages);
            free(v);
        }
        free(tr.ids);
        free(tr.off);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s lookup|put|open DIR | trace DIR FILE.jsonl...\n", argv[0]);
        return 2;
    }
    mkdir(argv[2], 0700);
    if (!strcmp(argv[1], "lookup")) return bench_lookup(argv[2]);
    if (!strcmp(argv[1], "put")) return bench_put(argv[2]);
    if (!strcmp(argv[1], "open")) return bench_open(argv[2]);
    if (!strcmp(argv[1], "trace")) return bench_trace(argv[2], argc - 3, argv + 3);
    fprintf(stderr, "unknown benchmark %s\n", argv[1]);
    return 2;
}
