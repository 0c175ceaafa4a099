/*
 * bench_tier.c - the shared tier's prefix fetch against a bare pipelined
 * GET of the same keys, in the same run, on the same Redis (docs/TIER.md).
 *
 *   bench_tier --url redis://127.0.0.1:PORT[,...] [--blocks 64] [--iters 20]
 *              [--layers 8 --kv-heads 8 --head-dim 128 --block-tokens 16]
 *              [--cluster] [--redis-benchmark]
 *
 * A writer store (temporary directory) puts one prompt of --blocks full
 * blocks and closes (its write-behind fills the tier). Then, alternating
 * run by run (best of --iters each):
 *   kvx    a reader store with an empty directory: kvx_store_prefix of the
 *          prompt (every block from the tier: one pipelined batch per node,
 *          each value CRC-, namespace-, token- and hash-checked and
 *          decoded to a page), views released;
 *   bare   hiredis alone: the same keys, GET pipelined on one connection
 *          per node (the cluster's slot owner of each key), replies read,
 *          nothing checked.
 * Prints both and kvx / bare throughput (target >= 0.8x). With
 * --redis-benchmark it also runs `redis-benchmark [--cluster] -t set,get
 * -d <value size> -P <blocks> -c 1` against the first host and prints its
 * GET GB/s (the reference; -t get alone would read a key that was
 * never set; it reads one key over and over, so it measures Redis alone).
 */
#include "bench_common.h"
#include "kvx.h"
#include "tier/tier.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what)
{
    fprintf(stderr, "bench_tier: %s: %s\n", what, kvx_last_error());
    exit(1);
}

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

int main(int argc, char **argv)
{
    const char *url = NULL;
    int blocks = 64, iters = 20, rb = 0;
    kvx_geometry g = {8, 8, 128, 16, KVX_QUANT_FP16, 0xbe4c4b7e11e50000ull};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--url") && v) url = v, i++;
        else if (!strcmp(a, "--blocks") && v) blocks = atoi(v), i++;
        else if (!strcmp(a, "--iters") && v) iters = atoi(v), i++;
        else if (!strcmp(a, "--layers") && v) g.num_layers = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--kv-heads") && v) g.kv_heads = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--head-dim") && v) g.head_dim = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--block-tokens") && v) g.block_tokens = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--cluster")) {} /* routing is found by itself; kept for redis-benchmark */
        else if (!strcmp(a, "--redis-benchmark")) rb = 1;
        else {
            fprintf(stderr, "usage: bench_tier --url redis://HOST:PORT[,...] [--blocks N] [--iters N] [--layers L] "
                            "[--kv-heads H] [--head-dim D] [--block-tokens B] [--cluster] [--redis-benchmark]\n");
            return 2;
        }
    }
    int cluster = 0;
    for (int i = 1; i < argc; i++) cluster |= !strcmp(argv[i], "--cluster");
    if (!url || blocks < 1 || blocks > 4096 || iters < 1) {
        fprintf(stderr, "bench_tier: --url is required\n");
        return 2;
    }
    uint32_t B = g.block_tokens;
    size_t pb = (size_t)kvx_page_bytes(&g, B), nt = (size_t)blocks * B;
    uint32_t *tok = malloc(nt * 4);
    uint64_t *h = malloc((size_t)blocks * 8);
    uint8_t(*d)[KVX_DIGEST_BYTES] = malloc((size_t)blocks * KVX_DIGEST_BYTES);
    uint8_t *pages = malloc((size_t)blocks * pb);
    if (!tok || !h || !d || !pages) die("out of memory");
    uint64_t salt = (uint64_t)time(NULL);
    for (size_t i = 0; i < nt; i++) tok[i] = (uint32_t)mix(salt * 977 + i) & 0xFFFF;
    for (size_t i = 0; i < (size_t)blocks * pb; i += 2) {
        uint16_t x = kvx_f32_to_f16((float)((int)(mix(i) % 2001) - 1000) / 1000.0f);
        memcpy(pages + i, &x, 2);
    }
    kvx_block_hashes(h, tok, nt, B);
    kvx_prefix_digests(d, tok, nt, B);

    char root[] = "/tmp/kvx-bench-tier-XXXXXX", wdir[300], rdir[300];
    if (!mkdtemp(root)) die("mkdtemp");
    snprintf(wdir, sizeof wdir, "%s/w", root);
    snprintf(rdir, sizeof rdir, "%s/r", root);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = g;
    o.capacity_bytes = (uint64_t)blocks * pb * 4 + (64ull << 20);
    o.flags = KVX_STORE_NOSYNC;
    o.tier_url = url;
    kvx_store *w, *r;
    if (kvx_store_create(&w, wdir, &o)) die("create the writer store");
    if (kvx_store_put(w, tok, nt, pages, (size_t)blocks, NULL, NULL) || kvx_store_flush(w)) die("put");
    kvx_store_close(w); /* the write-behind is sent here */
    if (kvx_store_create(&r, rdir, &o)) die("create the reader store");
    kvx_store_close(r);
    o.flags = KVX_STORE_READONLY;
    if (kvx_store_open_options(&r, rdir, &o)) die("open the reader store");

    /* the same keys, the bare way */
    kvx_geometry gg = g;
    uint64_t ns = kvx_tier_ns(&gg, NULL);
    char(*keys)[KVX_TIER_KEY_BYTES] = malloc((size_t)blocks * KVX_TIER_KEY_BYTES);
    for (int i = 0; i < blocks; i++) kvx_tier_key(keys[i], ns, h[i], d[i]);
    kvx_tier_url u;
    if (kvx_tier_url_parse(&u, url)) die("url");
    /* one connection per port that owns a key (by asking each key's owner
     * through MOVED once: the bare client is told where each key lives) */
    redisContext *conn[64];
    int port_of[64], nconn = 0, *owner = malloc((size_t)blocks * sizeof(int));
    struct timeval tv = {5, 0};
    for (int i = 0; i < blocks; i++) {
        int port = u.port[0];
        for (int hop = 0; hop < 3; hop++) {
            int k;
            for (k = 0; k < nconn && port_of[k] != port; k++) {}
            if (k == nconn) {
                if (nconn == 64) die("too many nodes");
                conn[k] = redisConnectWithTimeout(u.host[0], port, tv);
                if (!conn[k] || conn[k]->err) die("connect");
                port_of[nconn++] = port;
            }
            redisReply *rep = redisCommand(conn[k], "GET %s", keys[i]);
            owner[i] = k;
            if (rep && rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "MOVED", 5)) {
                port = atoi(strrchr(rep->str, ':') + 1);
                freeReplyObject(rep);
                continue;
            }
            if (!rep || rep->type != REDIS_REPLY_STRING) die("a key is not in the tier (write-behind lost?)");
            freeReplyObject(rep);
            break;
        }
    }
    size_t vbytes = kvx_tier_value_bytes(&gg);
    double bytes = (double)blocks * (double)pb, best_kvx = 1e300, best_bare = 1e300;
    for (int it = 0; it < iters; it++) {
        kvx_view *v = malloc((size_t)blocks * sizeof *v);
        size_t n = 0;
        double t0 = kvx_bench_now();
        if (kvx_store_prefix(v, &n, r, tok, nt, (size_t)blocks)) die("prefix");
        kvx_views_release(v, n);
        double t = kvx_bench_now() - t0;
        free(v);
        if (n != (size_t)blocks) {
            fprintf(stderr, "bench_tier: the tier served %zu of %d blocks\n", n, blocks);
            return 1;
        }
        if (t < best_kvx) best_kvx = t;
        t0 = kvx_bench_now();
        for (int i = 0; i < blocks; i++) redisAppendCommand(conn[owner[i]], "GET %s", keys[i]);
        for (int k = 0; k < nconn; k++) {
            int done = 0;
            while (!done) redisBufferWrite(conn[k], &done);
        }
        for (int i = 0; i < blocks; i++) {
            void *rep;
            if (redisGetReply(conn[owner[i]], &rep) != REDIS_OK) die("bare GET");
            freeReplyObject(rep);
        }
        t = kvx_bench_now() - t0;
        if (t < best_bare) best_bare = t;
    }
    kvx_store_stats st;
    kvx_store_stat(&st, r);
    printf("geometry    L=%u Hkv=%u D=%u B=%u fp16: page %zu bytes, value %zu bytes; %d blocks, %d node(s)\n",
           g.num_layers, g.kv_heads, g.head_dim, B, pb, vbytes, blocks, nconn);
    printf("kvx prefix  %.3f ms  %.2f GB/s of pages  (tier_hits %llu, every value verified and decoded)\n",
           best_kvx * 1e3, kvx_bench_gbps(bytes, best_kvx), (unsigned long long)st.tier_hits);
    printf("bare GET    %.3f ms  %.2f GB/s of values (hiredis pipelined, one connection per node, nothing checked)\n",
           best_bare * 1e3, kvx_bench_gbps((double)blocks * (double)vbytes, best_bare));
    printf("ratio       kvx / bare = %.2fx (time: bare / kvx; target >= 0.8)\n", best_bare / best_kvx);
    kvx_store_close(r);
    for (int k = 0; k < nconn; k++) redisFree(conn[k]);
    if (rb) {
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "redis-benchmark -h %s -p %d %s -t set,get -d %zu -P %d -c 1 -n %d -q 2>/dev/null | tr '\\r' '\\n' | "
                 "grep 'GET:' | tail -1",
                 u.host[0], u.port[0], cluster ? "--cluster" : "", vbytes, blocks, blocks * iters * 4);
        FILE *p = popen(cmd, "r");
        char line[256] = "";
        if (p && fgets(line, sizeof line, p)) {
            double rps = 0;
            char *q = strstr(line, "GET:");
            if (q) rps = atof(q + 4);
            printf("redis-benchmark -t set,get -d %zu -P %d -c 1 (its GET line): %.0f requests/s = %.2f GB/s; kvx "
                   "prefix: %.2fx of it\n",
                   vbytes, blocks, rps, rps * (double)vbytes / 1e9,
                   kvx_bench_gbps(bytes, best_kvx) / (rps * (double)vbytes / 1e9));
        }
        if (p) pclose(p);
    }
    char rm[400];
    snprintf(rm, sizeof rm, "rm -rf '%s'", root);
    if (system(rm) != 0) {}
    free(tok), free(h), free(d), free(pages), free(keys), free(owner);
    return 0;
}
