/*
 * bench_tier_trace.c - the Mooncake conversation trace (FAST'25,
 * ../shared/data) replayed across two stores sharing the tier, against one
 * store alone (issue 15, point 5). Three fleets, each replaying the same
 * requests in order:
 *   one store     every request on one store (what a single machine that
 *                 saw all the traffic would hit: the ceiling);
 *   two, no tier  requests alternate between two stores with no tier
 *                 (two engines that share nothing);
 *   two + tier    the same two stores sharing the tier (a fresh tenant per
 *                 run, so earlier runs' values are never hits).
 * A request is one prefix lookup (its hit blocks counted) and then a put
 * and flush of its full blocks, as an engine does after prefill. Each
 * hash_id is one block of B = 16 deterministic token ids (equal ids, equal
 * prefix); pages are 4 KiB (E4M3, L 1, Hkv 2, D 64). No store evicts
 * (capacity 8 GiB). The tier's write-behind runs as in production: a
 * request that arrives on the other store before its predecessor's values
 * landed misses them.
 *   bench_tier_trace --url redis://HOST:PORT [--requests N] [--trace FILE] DIR
 */

#include <errno.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kvx.h"

#ifndef KVX_BENCH_TRACE
#define KVX_BENCH_TRACE "../shared/data/mooncake_fast25_conversation_trace.jsonl"
#endif
#define B 16u

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_tier_trace: %s: %s (%s)\n", what, kvx_last_error(), kvx_err_name(rc));
    exit(1);
}

typedef struct reqs {
    uint32_t *ids;
    size_t *off; /* request r: ids[off[r] .. off[r+1]) */
    size_t n, nids;
} reqs;

static int load(reqs *q, const char *path, size_t max)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t cap = 1 << 16, rcap = 1 << 12;
    q->ids = malloc(cap * 4);
    q->off = malloc(rcap * sizeof *q->off);
    q->n = q->nids = 0;
    char *line = NULL;
    size_t ln = 0;
    while ((!max || q->n < max) && getline(&line, &ln, f) > 0) {
        json_object *o = json_tokener_parse(line), *ids;
        if (!o || !json_object_object_get_ex(o, "hash_ids", &ids) || !json_object_is_type(ids, json_type_array)) {
            json_object_put(o);
            continue;
        }
        if (q->n + 2 > rcap) q->off = realloc(q->off, (rcap *= 2) * sizeof *q->off);
        q->off[q->n++] = q->nids;
        for (size_t k = 0; k < json_object_array_length(ids); k++) {
            if (q->nids == cap) q->ids = realloc(q->ids, (cap *= 2) * 4);
            q->ids[q->nids++] = (uint32_t)json_object_get_int64(json_object_array_get_idx(ids, k));
        }
        json_object_put(o);
    }
    q->off[q->n] = q->nids;
    free(line);
    fclose(f);
    return q->n ? 0 : -1;
}

static kvx_store *make(const char *dir, const char *name, const char *url, const char *tenant)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    kvx_geometry g = {1, 2, 64, B, KVX_QUANT_E4M3, 0x7ace};
    o.geometry = g;
    o.capacity_bytes = 8ull << 30;
    o.tier_url = url;
    o.tier_tenant = tenant;
    kvx_store *s = NULL;
    int rc = kvx_store_create(&s, path, &o);
    if (rc) die("create", rc);
    return s;
}

typedef struct fleet_result {
    uint64_t blocks, hits, tier_hits;
    double seconds;
} fleet_result;

/* Replays q on stores[r % n]. */
static fleet_result replay(const reqs *q, kvx_store **stores, int n)
{
    fleet_result res = {0, 0, 0, 0};
    size_t maxb = 0;
    for (size_t r = 0; r < q->n; r++)
        if (q->off[r + 1] - q->off[r] > maxb) maxb = q->off[r + 1] - q->off[r];
    uint32_t *tok = malloc((maxb * B + 1) * sizeof *tok);
    kvx_view *v = malloc((maxb + 1) * sizeof *v);
    kvx_geometry g;
    kvx_store_get_geometry(&g, stores[0]);
    size_t pb = kvx_page_bytes(&g, B);
    uint8_t *pages = malloc(maxb * pb + 1);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t r = 0; r < q->n; r++) {
        kvx_store *s = stores[r % (size_t)n];
        size_t nb = q->off[r + 1] - q->off[r];
        for (size_t b = 0; b < nb; b++)
            for (uint32_t j = 0; j < B; j++) tok[b * B + j] = q->ids[q->off[r] + b] * B + j + 1;
        size_t got = 0;
        int rc = kvx_store_prefix(v, &got, s, tok, nb * B, nb);
        if (rc) die("prefix", rc);
        kvx_views_release(v, got);
        res.blocks += nb;
        res.hits += got;
        /* the page of block b: bytes from its id, finite in E4M3 */
        for (size_t b = 0; b < nb; b++) memset(pages + b * pb, (int)(q->ids[q->off[r] + b] % 100) + 1, pb);
        if ((rc = kvx_store_put(s, tok, nb * B, pages, nb, NULL, NULL))) die("put", rc);
        if ((rc = kvx_store_flush(s))) die("flush", rc);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    res.seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    for (int i = 0; i < n; i++) {
        kvx_store_stats st;
        if (kvx_store_stat(&st, stores[i]) == 0) res.tier_hits += st.tier_hits;
    }
    free(tok);
    free(v);
    free(pages);
    return res;
}

static void print(const char *name, fleet_result r, double ceiling)
{
    double ratio = r.blocks ? (double)r.hits / (double)r.blocks : 0.0;
    printf("%-14s %10llu %10llu %8.4f %9.3fx %10llu %8.2f\n", name, (unsigned long long)r.blocks,
           (unsigned long long)r.hits, ratio, ceiling > 0 ? ratio / ceiling : 0.0, (unsigned long long)r.tier_hits,
           r.seconds);
}

int main(int argc, char **argv)
{
    const char *url = NULL, *trace = KVX_BENCH_TRACE, *dir = NULL;
    size_t max = 2000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--url") && i + 1 < argc) url = argv[++i];
        else if (!strcmp(argv[i], "--requests") && i + 1 < argc) max = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc) trace = argv[++i];
        else if (!strcmp(argv[i], "--help")) {
            printf("usage: bench_tier_trace --url redis://HOST:PORT [--requests N] [--trace FILE] DIR\n");
            return 0;
        } else dir = argv[i];
    }
    if (!url || !dir) {
        fprintf(stderr, "usage: bench_tier_trace --url redis://HOST:PORT [--requests N] [--trace FILE] DIR\n");
        return 2;
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "bench_tier_trace: mkdir %s: %s\n", dir, strerror(errno));
        return 1;
    }
    reqs q;
    if (load(&q, trace, max)) {
        fprintf(stderr, "bench_tier_trace: cannot read the trace %s\n", trace);
        return 1;
    }
    char tenant[64];
    snprintf(tenant, sizeof tenant, "trace-%ld-%ld", (long)getpid(), (long)time(NULL));
    kvx_store *one = make(dir, "one", NULL, NULL);
    kvx_store *a = make(dir, "a", NULL, NULL), *b = make(dir, "b", NULL, NULL);
    kvx_store *ta = make(dir, "ta", url, tenant), *tb = make(dir, "tb", url, tenant);
    printf("%zu requests of the Mooncake conversation trace, %zu blocks, B %u, 4 KiB pages\n", q.n, q.nids, B);
    printf("%-14s %10s %10s %8s %10s %10s %8s\n", "fleet", "blocks", "hits", "ratio", "vs one", "tier hits", "s");
    fleet_result r1 = replay(&q, &one, 1);
    double ceiling = r1.blocks ? (double)r1.hits / (double)r1.blocks : 0.0;
    print("one store", r1, ceiling);
    kvx_store *two[2] = {a, b}, *tiered[2] = {ta, tb};
    print("two, no tier", replay(&q, two, 2), ceiling);
    print("two + tier", replay(&q, tiered, 2), ceiling);
    kvx_store_close(one);
    kvx_store_close(a);
    kvx_store_close(b);
    kvx_store_close(ta);
    kvx_store_close(tb);
    free(q.ids);
    free(q.off);
    return 0;
}
