/*
 * redis.c - the shared tier (docs/TIER.md) against real redis-server
 * processes this test starts on loopback ports (tests/lib/redis.h): one
 * server, then a Redis Cluster of 3 masters with a replica each. Each test
 * names the promise of docs/TIER.md it proves: semantics across stores
 * and processes, tenants, trust, TTL, the failure model (servers killed,
 * stalled, a master lost) and routing. Exits 77 without redis-server.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <stdlib.h>

#include <cmocka.h>

#include "tier/tier.h"
#include "lib/redis.h"
#include "lib/store.h"

static int g_single = -1;

 /* fixture index of the single server */
static int g_cl = -1;

     /* first node of the cluster */
static int g_seq_base = 100;

static int g_migrated_from = -1;

static void url_of(char *out, size_t cap, int node)
{
    snprintf(out, cap, "redis://127.0.0.1:%d", rf_nodes[node].port);
}

static kvx_store *tier_store_of(const char *name, const char *url, const char *tenant)
{
    char dir[512];
    su_path(dir, sizeof dir, name);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 64ull << 20;
    o.tier_url = url;
    o.tier_tenant = tenant;
    kvx_store *s = NULL;
    int rc = kvx_store_create(&s, dir, &o);
    if (rc) fprintf(stderr, "create %s: %s\n", dir, kvx_last_error());
    assert_int_equal(rc, 0);
    return s;
}

static kvx_store *tier_reopen(const char *name, uint32_t flags)
{
    char dir[512];
    su_path(dir, sizeof dir, name);
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_open(&s, dir, NULL, flags), 0);
    return s;
}

static size_t count_files(const char *name, const char *sub)
{
    char dir[512], names[256][64];
    su_path(dir, sizeof dir, name);
    return su_list_names(dir, sub, names, 256);
}

/* The key of block i of sequence seq (no tenant). */
static void key_of(char *key, uint64_t seq, size_t nb, size_t i, const char *tenant)
{
    uint32_t t[64 * SU_B];
    uint64_t h[64];
    uint8_t d[64][KVX_DIGEST_BYTES];
    su_tokens(t, seq, nb, 0);
    kvx_block_hashes(h, t, nb * SU_B, SU_B);
    kvx_prefix_digests(d, t, nb * SU_B, SU_B);
    kvx_geometry g = su_geometry();
    kvx_tier_key(key, kvx_tier_ns(&g, tenant), h[i], d[i]);
}

/* A valid value of block i of sequence seq. */
static uint8_t *value_of(size_t *len, uint64_t seq, size_t nb, size_t i, const char *tenant)
{
    uint32_t t[64 * SU_B];
    uint64_t h[64];
    su_tokens(t, seq, nb, 0);
    uint8_t *p = su_pages(t, nb, h, 64);
    kvx_geometry g = su_geometry();
    uint8_t *v = NULL;
    assert_int_equal(kvx_tier_value_encode(&v, len, kvx_tier_ns(&g, tenant), &g, h[i], t + i * SU_B, p + i * 64, NULL),
                     0);
    free(p);
    return v;
}

/* Calls of one command since the server started, from INFO commandstats
 * ("cmdstat_set:calls=3,usec=..."); 0 when it was never called. */
static long long cmd_calls(const char *info, const char *cmd)
{
    char tag[64];
    snprintf(tag, sizeof tag, "cmdstat_%s:calls=", cmd);
    for (const char *p = strstr(info, tag); p; p = strstr(p + 1, tag))
        if (p == info || p[-1] == '\n') return atoll(p + strlen(tag));
    return 0;
}

/* Calls the server counted of every command that may write a key: all
 * but the ones kvx and this test read or connect with (GET, MGET, PING,
 * AUTH, ASKING, INFO, DBSIZE, PTTL, CLUSTER ..., CLIENT ..., COMMAND ...,
 * ACL ..., CONFIG ...). A command this list does not know counts as a
 * write, so the check fails rather than miss one. */
static long long write_calls(const char *info)
{
    static const char *reads[] = {"get", "mget", "ping", "auth", "asking", "info", "dbsize", "pttl",
                                  "cluster", "client", "command", "acl", "config", "hello", "readonly"};
    long long n = 0;
    for (const char *p = strstr(info, "cmdstat_"); p; p = strstr(p + 1, "cmdstat_")) {
        if (p != info && p[-1] != '\n') continue;
        const char *name = p + 8, *calls = strstr(name, "calls=");
        if (!calls) continue;
        size_t len = strcspn(name, ":|"); /* "cluster|slots": its command */
        int is_read = 0;
        for (size_t k = 0; k < sizeof reads / sizeof reads[0] && !is_read; k++)
            is_read = strlen(reads[k]) == len && !strncmp(name, reads[k], len);
        if (!is_read) n += atoll(calls + 6);
    }
    return n;
}

/* TIER.md "Semantics": store A's blocks are a hit in store B, whose
 * directory is empty: a reader serves them verified and byte-exact without
 * writing anything locally; a writer copies them in as an ordinary put,
 * and never writes them back: the server counts no write command (SET,
 * EVAL, EVALSHA or any other) from the moment A has closed until the
 * reader and the writer have closed. */
/* PROMISE: TIER-1, TIER-2, TIER-3 */
static void test_cross_store_hit(void **state)
{
    (void)state;
    char url[64];
    url_of(url, sizeof url, g_single);
    uint64_t seq = (uint64_t)g_seq_base++;
    kvx_store *a = tier_store_of("x_a", url, NULL);
    assert_int_equal(su_put_seq(a, seq, 16), 0);
    kvx_store_close(a); /* drains the write-behind */
    int port = rf_nodes[g_single].port;
    static char before[32768], after[32768];
    assert_int_equal(rf_cmd(port, before, sizeof before, "INFO commandstats"), 0);
    assert_true(cmd_calls(before, "set") >= 16); /* A's write-behind: the counts are read right */
    kvx_store *b = tier_store_of("x_b", url, NULL);
    kvx_store_close(b);
    b = tier_reopen("x_b", KVX_STORE_READONLY);
    assert_int_equal(su_served_prefix(b, seq, 16), 16);
    kvx_store_stats st = su_stat(b);
    assert_int_equal(st.tier_hits, 16);
    kvx_geometry g = su_geometry();
    assert_int_equal(st.tier_bytes_down, 16 * kvx_tier_value_bytes(&g));
    assert_int_equal(st.tier_up, 1);
    assert_int_equal(st.blocks, 0); /* a reader never copies */
    kvx_store_close(b);
    assert_int_equal(count_files("x_b", "shards"), 0);
    /* a writer copies them in: the second lookup is local */
    kvx_store *c = tier_store_of("x_c", url, NULL);
    assert_int_equal(su_served_prefix(c, seq, 16), 16);
    st = su_stat(c);
    assert_int_equal(st.tier_hits, 16);
    assert_int_equal(st.blocks, 16);
    assert_int_equal(su_served_prefix(c, seq, 16), 16);
    st = su_stat(c);
    assert_int_equal(st.tier_hits, 16);
    kvx_store_close(c); /* drains its write-behind, were anything queued */
    /* the copies were not written back: no write command since A closed */
    assert_int_equal(rf_cmd(port, after, sizeof after, "INFO commandstats"), 0);
    static const char *writes[] = {"set", "eval", "evalsha", "setnx", "mset", "psetex", "setex"};
    for (size_t k = 0; k < sizeof writes / sizeof writes[0]; k++)
        if (cmd_calls(after, writes[k]) != cmd_calls(before, writes[k]))
            fail_msg("%s: %lld calls before the copying stores opened, %lld after they closed", writes[k],
                     cmd_calls(before, writes[k]), cmd_calls(after, writes[k]));
    assert_true(write_calls(after) == write_calls(before));
}

/* TIER.md "Failure model": a value overwritten with garbage is a miss,
 * counted; a writer that saw it and then holds the verified block
 * replaces it (compare-and-set), counted. */
/* PROMISE: TIER-4, TIER-6 */
static void test_garbage_value_replaced(void **state)
{
    (void)state;
    char url[64], key[KVX_TIER_KEY_BYTES], out[64];
    url_of(url, sizeof url, g_single);
    uint64_t seq = (uint64_t)g_seq_base++;
    kvx_store *a = tier_store_of("g_a", url, NULL);
    assert_int_equal(su_put_seq(a, seq, 8), 0);
    kvx_store_close(a);
    key_of(key, seq, 8, 3, NULL);
    assert_int_equal(rf_cmd(rf_nodes[g_single].port, out, sizeof out, "SET %s %s", key, "garbage!"), 0);
    kvx_store *r = tier_store_of("g_r", url, NULL);
    kvx_store_close(r);
    r = tier_reopen("g_r", KVX_STORE_READONLY);
    assert_int_equal(su_served_prefix(r, seq, 8), 3);
    kvx_store_stats st = su_stat(r);
    assert_int_equal(st.tier_hits, 3);
    assert_int_equal(st.tier_bad, 1);
    assert_int_equal(st.tier_misses, 5);
    kvx_store_close(r);
    /* a writer: sees the bad value, recomputes (puts) the prompt, and its
     * write-behind replaces it */
    kvx_store *w = tier_store_of("g_w", url, NULL);
    assert_int_equal(su_served_prefix(w, seq, 8), 3);
    assert_int_equal(su_put_seq(w, seq, 8), 0);
    double end = rf_now() + 5;
    while (su_stat(w).tier_replaced == 0 && rf_now() < end) rf_sleep_ms(20);
    assert_int_equal(su_stat(w).tier_replaced, 1);
    kvx_store_close(w);
    r = tier_reopen("g_r", KVX_STORE_READONLY);
    assert_int_equal(su_served_prefix(r, seq, 8), 8);
    kvx_store_close(r);
}

/* TIER.md "Trust": a crafted value under the right key (another block's
 * valid value: other tokens, or another tenant's) is never served. */
/* PROMISE: TIER-5, TIER-19 */
static void test_collision_value_never_served(void **state)
{
    (void)state;
    char url[64], key[KVX_TIER_KEY_BYTES];
    url_of(url, sizeof url, g_single);
    uint64_t seq = (uint64_t)g_seq_base++, other = (uint64_t)g_seq_base++;
    size_t len;
    key_of(key, seq, 4, 0, NULL);
    uint8_t *v = value_of(&len, other, 4, 0, NULL); /* valid, other tokens' KV */
    redisContext *c = rf_connect(rf_nodes[g_single].port);
    assert_non_null(c);
    redisReply *rep = redisCommand(c, "SET %s %b", key, v, len);
    assert_non_null(rep);
    freeReplyObject(rep);
    free(v);
    kvx_store *r = tier_store_of("c_r", url, NULL);
    assert_int_equal(su_served_prefix(r, seq, 4), 0);
    assert_int_equal(su_stat(r).tier_bad, 1);
    /* another tenant's valid value for the very block */
    v = value_of(&len, seq, 4, 0, "mallory");
    rep = redisCommand(c, "SET %s %b", key, v, len);
    freeReplyObject(rep);
    free(v);
    assert_int_equal(su_served_prefix(r, seq, 4), 0);
    assert_int_equal(su_stat(r).tier_bad, 2);
    kvx_store_close(r);
    redisFree(c);
}

/* TIER.md "Tenants": a tenant never sees another tenant's blocks. */
/* PROMISE: TIER-19 */
static void test_tenant_isolation(void **state)
{
    (void)state;
    char url[64];
    url_of(url, sizeof url, g_single);
    uint64_t seq = (uint64_t)g_seq_base++;
    kvx_store *a = tier_store_of("t_a", url, "alpha");
    assert_int_equal(su_put_seq(a, seq, 6), 0);
    kvx_store_close(a);
    kvx_store *b = tier_store_of("t_b", url, "beta");
    assert_int_equal(su_served_prefix(b, seq, 6), 0);
    kvx_store_close(b);
    kvx_store *c = tier_store_of("t_c", url, "alpha");
    assert_int_equal(su_served_prefix(c, seq, 6), 6);
    kvx_store_close(c);
}

/* TIER.md "Failure model": the tier down at create, open and put: every
 * call succeeds, bounded in time: a lookup that asks the tier costs at
 * most a connect (250 ms), a close waits at most 2 s for the write-behind
 * (each call timed alone; the bounds add a margin for a loaded 2-core
 * machine: 1.5 s and 3.5 s). */
/* PROMISE: TIER-7 */
static void test_tier_down_create_open_put(void **state)
{
    (void)state;
    int port = rf_free_port(0);
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    uint64_t seq = (uint64_t)g_seq_base++;
    kvx_store *a = tier_store_of("d_a", url, NULL);
    assert_int_equal(su_put_seq(a, seq, 8), 0); /* queues the write-behind */
    assert_int_equal(su_served_prefix(a, seq, 8), 8);
    double t0 = rf_now();
    kvx_store_close(a);
    double close1 = rf_now() - t0;
    a = tier_reopen("d_a", 0);
    assert_int_equal(su_served_prefix(a, seq, 8), 8);
    uint32_t t[12 * SU_B];
    su_tokens(t, seq, 12, 0);
    kvx_view v[12];
    size_t n = 99;
    t0 = rf_now();
    assert_int_equal(kvx_store_prefix(v, &n, a, t, 12 * SU_B, 12), 0); /* 4 blocks beyond: the tier is asked */
    double lookup = rf_now() - t0;
    assert_int_equal(n, 8);
    kvx_views_release(v, n);
    kvx_store_stats st = su_stat(a);
    assert_int_equal(st.tier_up, 0);
    assert_true(st.tier_misses >= 4);
    assert_int_equal(su_put_seq(a, seq + 1000, 8), 0); /* more write-behind for the next close */
    t0 = rf_now();
    kvx_store_close(a);
    double close2 = rf_now() - t0;
    if (close1 >= 3.5 || lookup >= 1.5 || close2 >= 3.5)
        fprintf(stderr, "tier down: close %.3f s, lookup %.3f s, close %.3f s\n", close1, lookup, close2);
    assert_true(close1 < 3.5);
    assert_true(lookup < 1.5);
    assert_true(close2 < 3.5);
    /* a reader too */
    a = tier_reopen("d_a", KVX_STORE_READONLY);
    assert_int_equal(su_served_prefix(a, seq, 8), 8);
    kvx_store_close(a);
}

/* TIER.md "Failure model": SIGKILL of the server, then a lookup is a miss
 * at once; the breaker skips the tier (no wait) and, once it is back,
 * probes it and serves again. */
/* PROMISE: TIER-9 */
static void test_breaker_skip_and_probe(void **state)
{
    (void)state;
    int k = rf_start(0);
    assert_true(k >= 0);
    char url[64];
    url_of(url, sizeof url, k);
    uint64_t seq = (uint64_t)g_seq_base++;
    kvx_store *a = tier_store_of("b_a", url, NULL);
    assert_int_equal(su_put_seq(a, seq, 8), 0);
    kvx_store_close(a);
    kvx_store *r = tier_store_of("b_r", url, NULL);
    kvx_store_close(r);
    r = tier_reopen("b_r", KVX_STORE_READONLY);
    assert_int_equal(su_served_prefix(r, seq, 8), 8);
    rf_kill(k, SIGKILL);
    double t0 = rf_now();
    assert_int_equal(su_served_prefix(r, seq, 8), 0);
    assert_true(rf_now() - t0 < 1.5);
    t0 = rf_now();
    for (int i = 0; i < 20; i++) assert_int_equal(su_served_prefix(r, seq, 8), 0);
    assert_true(rf_now() - t0 < 0.5); /* skipped: no connect attempted */
    kvx_store_stats st = su_stat(r);
    assert_true(st.tier_errors >= 1);
    assert_int_equal(st.tier_up, 0);
    /* back (empty: the values are written again by a writer) */
    assert_int_equal(rf_launch(&rf_nodes[k]), 0);
    double end = rf_now() + 8;
    while (rf_now() < end) {
        su_served_prefix(r, seq, 8); /* probes once the breaker's time is up */
        if (su_stat(r).tier_up) break;
        rf_sleep_ms(100);
    }
    assert_int_equal(su_stat(r).tier_up, 1);
    kvx_store *w = tier_store_of("b_w", url, NULL);
    assert_int_equal(su_put_seq(w, seq, 8), 0);
    kvx_store_close(w);
    assert_int_equal(su_served_prefix(r, seq, 8), 8);
    assert_int_equal(su_stat(r).tier_up, 1);
    kvx_store_close(r);
}

/* TIER.md "Failure model": the server killed while the write-behind
 * sends large values (a write to a reset connection: SIGPIPE, which the
 * library blocks and consumes): the process lives, close is bounded. */
/* PROMISE: TIER-1 */
static void test_killed_during_write_behind(void **state)
{
    (void)state;
    int k = rf_start(0);
    assert_true(k >= 0);
    char url[64], dir[512];
    url_of(url, sizeof url, k);
    su_path(dir, sizeof dir, "wk");
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = (kvx_geometry){4, 8, 128, 16, KVX_QUANT_FP16, 7};
    o.capacity_bytes = 1ull << 30;
    o.tier_url = url;
    kvx_store *s;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    size_t pb = (size_t)kvx_page_bytes(&o.geometry, 16), nb = 32;
    uint8_t *pages = calloc(nb, pb);
    uint32_t *t = malloc(nb * 16 * 4);
    assert_non_null(pages);
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < nb * 16; i++) t[i] = (uint32_t)(i * 31 + (size_t)round * 100003u);
        assert_int_equal(kvx_store_put(s, t, nb * 16, pages, nb, NULL, NULL), 0);
        assert_int_equal(kvx_store_flush(s), 0);
        if (round == 0) {
            rf_sleep_ms(5);
            rf_kill(k, SIGKILL);
        }
    }
    double t0 = rf_now();
    kvx_store_close(s);
    /* at most 2 s, and a reply being read may add one command timeout
     * (TIER.md "Write-behind"): 3 s, plus a margin for a loaded machine */
    assert_true(rf_now() - t0 < 3.5);
    free(pages);
    free(t);
}

/* TIER.md "Failure model": a stalled server (SIGSTOP) costs one command
 * timeout (1 s), then the breaker skips it; a writer whose write-behind
 * is stuck on a stalled server closes within 2 s, plus one command
 * timeout for a reply being read (TIER.md "Write-behind"). Each call is
 * timed alone; the bounds add a margin for a loaded 2-core machine. */
/* PROMISE: TIER-9 */
static void test_stalled_server(void **state)
{
    (void)state;
    int k = rf_start(0);
    assert_true(k >= 0);
    char url[64];
    url_of(url, sizeof url, k);
    uint64_t seq = (uint64_t)g_seq_base++;
    kvx_store *a = tier_store_of("s_a", url, NULL);
    assert_int_equal(su_put_seq(a, seq, 4), 0);
    kvx_store_close(a);
    kvx_store *q = tier_store_of("s_q", url, NULL);
    kvx_store_close(q);
    q = tier_reopen("s_q", KVX_STORE_READONLY);
    rf_kill(k, SIGSTOP);
    double t0 = rf_now();
    assert_int_equal(su_served_prefix(q, seq, 4), 0);
    double first = rf_now() - t0;
    t0 = rf_now();
    assert_int_equal(su_served_prefix(q, seq, 4), 0);
    double second = rf_now() - t0;
    if (first >= 1.5 || second >= 0.3)
        fprintf(stderr, "stalled server: first lookup %.3f s, second %.3f s\n", first, second);
    /* one command timeout (1 s), plus a margin for a loaded 2-core machine */
    assert_true(first < 1.5);
    assert_true(second < 0.3);
    kvx_store_close(q);
    rf_kill(k, SIGCONT);
    rf_kill(k, SIGKILL);
    /* a server of its own, so no breaker is open yet: the write-behind
     * waits on it */
    int k2 = rf_start(0);
    assert_true(k2 >= 0);
    url_of(url, sizeof url, k2);
    kvx_store *w = tier_store_of("s_w", url, NULL); /* create never contacts the tier */
    rf_kill(k2, SIGSTOP);
    assert_int_equal(su_put_seq(w, seq + 1000, 8), 0); /* flushed: its write-behind is queued */
    t0 = rf_now();
    kvx_store_close(w);
    double wclose = rf_now() - t0;
    rf_kill(k2, SIGCONT);
    rf_kill(k2, SIGKILL);
    if (wclose >= 3.5) fprintf(stderr, "stalled server: a writer's close took %.3f s\n", wclose);
    assert_true(wclose < 3.5);
}

/* TIER.md "Configuration": TTL on the values written. */
/* PROMISE: TIER-22 */
static void test_ttl(void **state)
{
    (void)state;
    char dir[512], url[64], key[KVX_TIER_KEY_BYTES], out[64];
    url_of(url, sizeof url, g_single);
    su_path(dir, sizeof dir, "ttl");
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 64ull << 20;
    o.tier_url = url;
    o.tier_ttl_ms = 600000;
    kvx_store *s;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    uint64_t seq = (uint64_t)g_seq_base++;
    assert_int_equal(su_put_seq(s, seq, 2), 0);
    kvx_store_close(s);
    key_of(key, seq, 2, 1, NULL);
    assert_int_equal(rf_cmd(rf_nodes[g_single].port, out, sizeof out, "PTTL %s", key), 0);
    long long ttl = atoll(out);
    assert_true(ttl > 500000 && ttl <= 600000);
}

/* TIER.md "Configuration": the options override DIR/TIER for one handle;
 * "off" turns it off; reindex keeps DIR/TIER. */
/* PROMISE: TIER-20 */
static void test_options_override_and_reindex(void **state)
{
    (void)state;
    char url[64], dir[512];
    url_of(url, sizeof url, g_single);
    uint64_t seq = (uint64_t)g_seq_base++;
    kvx_store *a = tier_store_of("o_a", url, NULL);
    assert_int_equal(su_put_seq(a, seq, 4), 0);
    kvx_store_close(a);
    kvx_store *b = tier_store_of("o_b", NULL, NULL); /* no tier */
    assert_int_equal(su_served_prefix(b, seq, 4), 0);
    kvx_store_tier ti;
    assert_int_equal(kvx_store_tier_get(&ti, b), 0);
    assert_string_equal(ti.url, "");
    kvx_store_close(b);
    su_path(dir, sizeof dir, "o_b");
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.flags = KVX_STORE_READONLY;
    o.tier_url = url;
    assert_int_equal(kvx_store_open_options(&b, dir, &o), 0);
    assert_int_equal(su_served_prefix(b, seq, 4), 4);
    assert_int_equal(kvx_store_tier_get(&ti, b), 0);
    assert_int_equal(ti.from_file, 0);
    kvx_store_close(b);
    su_path(dir, sizeof dir, "o_a");
    o.tier_url = "off";
    assert_int_equal(kvx_store_open_options(&a, dir, &o), 0);
    assert_int_equal(kvx_store_tier_get(&ti, a), 0);
    assert_string_equal(ti.url, "");
    kvx_store_close(a);
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    a = tier_reopen("o_a", KVX_STORE_READONLY);
    assert_int_equal(kvx_store_tier_get(&ti, a), 0);
    assert_string_equal(ti.url, url);
    assert_int_equal(ti.from_file, 1);
    kvx_store_close(a);
}

static int run(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* TIER.md "Configuration": `kvx store create --tier`, `kvx store tier set
 * | off | show`, `stat --json`'s counters, and `kvx store put` returning
 * with its write-behind sent. */
/* PROMISE: TIER-1 */
static void test_cli(void **state)
{
    (void)state;
    char url[64], cmd[2048], out[8192], dir[512], dir2[512], env[512], tok[512];
    url_of(url, sizeof url, g_single);
    su_path(dir, sizeof dir, "cli_a");
    su_path(dir2, sizeof dir2, "cli_b");
    snprintf(cmd, sizeof cmd,
             "%s store create %s --layers 1 --kv-heads 1 --head-dim 4 --block-tokens 4 --quant fp16 "
             "--model-signature 1122334455667788 --capacity 64MiB --tier %s --tenant cli --tier-ttl 1h",
             KVX_CLI, dir, url);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "%s store tier %s show --json", KVX_CLI, dir);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "\"tenant\":\"cli\""));
    assert_non_null(strstr(out, "\"ttl_ms\":3600000"));
    assert_non_null(strstr(out, "\"up\":1"));
    /* an envelope and its tokens: store put through the CLI */
    uint64_t seq = (uint64_t)g_seq_base++;
    uint32_t t[6 * SU_B];
    uint64_t h[6];
    su_tokens(t, seq, 6, 0);
    uint8_t *p = su_pages(t, 6, h, 64);
    kvx_store *tmp = tier_store_of("cli_tmp", NULL, NULL);
    assert_int_equal(kvx_store_put(tmp, t, 6 * SU_B, p, 6, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(tmp), 0);
    kvx_view v[6];
    size_t n;
    assert_int_equal(kvx_store_prefix(v, &n, tmp, t, 6 * SU_B, 6), 0);
    assert_int_equal(n, 6);
    void *buf;
    size_t len;
    assert_int_equal(kvx_views_export(&buf, &len, tmp, v, n, 1), 0);
    kvx_views_release(v, n);
    kvx_store_close(tmp);
    free(p);
    su_path(env, sizeof env, "cli.tlkv");
    su_path(tok, sizeof tok, "cli.tok");
    FILE *f = fopen(env, "wb");
    assert_int_equal(fwrite(buf, 1, len, f), len);
    fclose(f);
    kvx_free(buf);
    f = fopen(tok, "w");
    for (size_t i = 0; i < 6 * SU_B; i++) fprintf(f, "%u ", t[i]);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s store put %s %s --tokens %s", KVX_CLI, dir, env, tok);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    /* written behind before put returned: another store gets them */
    snprintf(cmd, sizeof cmd,
             "%s store create %s --layers 1 --kv-heads 1 --head-dim 4 --block-tokens 4 --quant fp16 "
             "--model-signature 1122334455667788 --capacity 64MiB",
             KVX_CLI, dir2);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "%s store tier %s set %s --tenant cli --no-wait", KVX_CLI, dir2, url);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "%s store prefix %s $(cat %s)", KVX_CLI, dir2, tok);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    assert_int_equal(atoi(out), 6);
    snprintf(cmd, sizeof cmd, "%s store stat %s --json", KVX_CLI, dir2);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "\"tier_up\":1"));
    assert_non_null(strstr(out, "\"tier_hits\":0")); /* a fresh handle's counts */
    assert_non_null(strstr(out, "\"blocks\":0"));   /* the CLI prefix is a reader */
    snprintf(cmd, sizeof cmd, "%s store tier %s off", KVX_CLI, dir2);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "%s store tier %s show", KVX_CLI, dir2);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "none"));
    snprintf(cmd, sizeof cmd, "%s store prefix %s $(cat %s)", KVX_CLI, dir2, tok);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    assert_int_equal(atoi(out), 0);
    snprintf(cmd, sizeof cmd, "%s store tier %s set redis://h:0 2>/dev/null", KVX_CLI, dir2);
    assert_int_equal(run(cmd, out, sizeof out), 2);
}

/* TIER.md "Tenants": ACL credentials in the URL (AUTH user pass); a user
 * limited to its namespace's keys works, a wrong password is a miss. */
/* PROMISE: TIER-11 */
static void test_acl_auth(void **state)
{
    (void)state;
    char url[128], out[256];
    kvx_geometry g = su_geometry();
    uint64_t ns = kvx_tier_ns(&g, "acl");
    int port = rf_nodes[g_single].port;
    assert_int_equal(rf_cmd(port, out, sizeof out, "ACL SETUSER alice on >s3cret ~kvx:1:%016llx:* +@all",
                            (unsigned long long)ns),
                     0);
    snprintf(url, sizeof url, "redis://alice:s3cret@127.0.0.1:%d", port);
    uint64_t seq = (uint64_t)g_seq_base++;
    kvx_store *a = tier_store_of("acl_a", url, "acl");
    assert_int_equal(su_put_seq(a, seq, 4), 0);
    kvx_store_close(a);
    kvx_store *b = tier_store_of("acl_b", url, "acl");
    assert_int_equal(su_served_prefix(b, seq, 4), 4);
    kvx_store_tier ti;
    assert_int_equal(kvx_store_tier_get(&ti, b), 0);
    assert_null(strstr(ti.url, "s3cret")); /* shown as *** */
    kvx_store_close(b);
    /* the same user cannot reach another tenant's keys */
    kvx_store *c = tier_store_of("acl_c", url, "other");
    assert_int_equal(su_put_seq(c, seq, 4), 0);
    assert_int_equal(su_stat(c).tier_writes, 0);
    kvx_store_close(c);
    snprintf(url, sizeof url, "redis://alice:wrong@127.0.0.1:%d", port);
    kvx_store *d = tier_store_of("acl_d", url, "acl");
    assert_int_equal(su_served_prefix(d, seq, 4), 0);
    assert_int_equal(su_stat(d).tier_up, 0);
    kvx_store_close(d);
}

/* TIER.md "Semantics": 16 stores in 16 processes share the tier: each
 * puts its own prompt, then each serves every other's, verified. */
/* PROMISE: TIER-18 */
static void test_sixteen_processes(void **state)
{
    (void)state;
    char url[64];
    url_of(url, sizeof url, g_single);
    uint64_t base = 9000;
    pid_t pids[16];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 16; i++) {
            pids[i] = fork();
            assert_true(pids[i] >= 0);
            if (pids[i] == 0) {
                char name[32], dir[512];
                snprintf(name, sizeof name, "p16_%d", i);
                su_path(dir, sizeof dir, name);
                kvx_store *s = NULL;
                int ok = 1;
                if (round == 0) {
                    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
                    o.geometry = su_geometry();
                    o.capacity_bytes = 64ull << 20;
                    o.tier_url = url;
                    ok = kvx_store_create(&s, dir, &o) == 0 && su_put_seq(s, base + (uint64_t)i, 8) == 0;
                } else {
                    ok = kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY) == 0;
                    for (int j = 0; ok && j < 16; j++) ok = su_served_prefix(s, base + (uint64_t)j, 8) == 8;
                }
                kvx_store_close(s);
                _exit(ok ? 0 : 1);
            }
        }
        for (int i = 0; i < 16; i++) {
            int st;
            assert_int_equal(waitpid(pids[i], &st, 0), pids[i]);
            assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        }
    }
}

/* TIER.md "Routing": keys spread over the masters; a 64-block prefix is
 * fetched (one round trip per node) and served byte-exact. */
/* PROMISE: TIER-3 */
static void test_cluster_cross_store(void **state)
{
    (void)state;
    char url[128];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d,127.0.0.1:%d", rf_nodes[g_cl].port, rf_nodes[g_cl + 1].port);
    kvx_store *a = tier_store_of("cl_a", url, NULL);
    assert_int_equal(su_put_seq(a, 5000, 64), 0);
    kvx_store_close(a);
    kvx_store *b = tier_store_of("cl_b", url, NULL);
    kvx_store_close(b);
    b = tier_reopen("cl_b", KVX_STORE_READONLY);
    assert_int_equal(su_served_prefix(b, 5000, 64), 64);
    assert_int_equal(su_stat(b).tier_hits, 64);
    kvx_store_tier ti;
    assert_int_equal(kvx_store_tier_get(&ti, b), 0);
    assert_int_equal(ti.cluster, 1);
    kvx_store_close(b);
    int nonempty = 0;
    for (int i = g_cl; i < g_cl + 6; i++) {
        char n[32];
        if (rf_cmd(rf_nodes[i].port, n, sizeof n, "DBSIZE") == 0 && atoi(n) > 0) nonempty++;
    }
    assert_true(nonempty >= 3);
}

static int node_id(int i, char *id, size_t cap) { return rf_cmd(rf_nodes[i].port, id, cap, "CLUSTER MYID"); }

/* TIER.md "Routing": ASK during a slot migration and MOVED after it are
 * followed; a reader with the old slot map still gets every block. */
/* PROMISE: TIER-10 */
static void test_cluster_ask_and_moved(void **state)
{
    (void)state;
    char url[64], key[KVX_TIER_KEY_BYTES], src_id[64], dst_id[64], out[256];
    url_of(url, sizeof url, g_cl);
    kvx_store *b = tier_reopen("cl_b", KVX_STORE_READONLY);
    assert_int_equal(su_served_prefix(b, 5000, 64), 64); /* the slot map is loaded */
    key_of(key, 5000, 64, 0, NULL);
    int slot = kvx_tier_slot(key, strlen(key));
    int src = rf_slot_owner(g_cl, 6, slot), dst = -1;
    assert_true(src >= 0);
    for (int k = 1; k < 4 && dst < 0; k++) {
        int o = rf_slot_owner(g_cl, 6, (slot + k * 5461) % 16384);
        if (o >= 0 && o != src) dst = o;
    }
    assert_true(dst >= 0);
    g_migrated_from = src;
    assert_int_equal(node_id(src, src_id, sizeof src_id), 0);
    assert_int_equal(node_id(dst, dst_id, sizeof dst_id), 0);
    assert_int_equal(rf_cmd(rf_nodes[dst].port, out, sizeof out, "CLUSTER SETSLOT %d IMPORTING %s", slot, src_id), 0);
    assert_int_equal(rf_cmd(rf_nodes[src].port, out, sizeof out, "CLUSTER SETSLOT %d MIGRATING %s", slot, dst_id), 0);
    assert_int_equal(rf_cmd(rf_nodes[src].port, out, sizeof out, "MIGRATE 127.0.0.1 %d %s 0 5000", rf_nodes[dst].port,
                            key),
                     0);
    assert_string_equal(out, "OK");
    /* src now answers ASK for the key */
    assert_int_equal(rf_cmd(rf_nodes[src].port, out, sizeof out, "GET %s", key), -2);
    assert_int_equal(strncmp(out, "ASK", 3), 0);
    assert_int_equal(su_served_prefix(b, 5000, 64), 64);
    /* the migration ends: MOVED */
    rf_cmd(rf_nodes[dst].port, out, sizeof out, "CLUSTER SETSLOT %d NODE %s", slot, dst_id);
    rf_cmd(rf_nodes[src].port, out, sizeof out, "CLUSTER SETSLOT %d NODE %s", slot, dst_id);
    for (int i = g_cl; i < g_cl + 6; i++)
        if (i != src && i != dst) rf_cmd(rf_nodes[i].port, out, sizeof out, "CLUSTER SETSLOT %d NODE %s", slot, dst_id);
    assert_int_equal(rf_cmd(rf_nodes[src].port, out, sizeof out, "GET %s", key), -2);
    assert_int_equal(strncmp(out, "MOVED", 5), 0);
    assert_int_equal(su_served_prefix(b, 5000, 64), 64);
    assert_int_equal(su_stat(b).tier_errors, 0);
    kvx_store_close(b);
    rf_cluster_ok(g_cl, 6);
}

/* TIER.md "Failure model": a master SIGKILLed mid-run: lookups are misses
 * at once (never a failure, never a stall); its replica is promoted and
 * the slot map refresh finds it: every block is served again. */
/* PROMISE: TIER-10 */
static void test_cluster_master_killed(void **state)
{
    (void)state;
    char key[KVX_TIER_KEY_BYTES], out[64];
    kvx_store *b = tier_reopen("cl_b", KVX_STORE_READONLY);
    assert_int_equal(su_served_prefix(b, 5000, 64), 64);
    /* a master that holds some block but did not take part in the
     * migration above (its config epoch was bumped by hand there) */
    key_of(key, 5000, 64, 0, NULL);
    int moved = rf_slot_owner(g_cl, 6, kvx_tier_slot(key, strlen(key))), victim = -1;
    for (size_t i = 1; i < 64 && victim < 0; i++) {
        key_of(key, 5000, 64, i, NULL);
        int o = rf_slot_owner(g_cl, 6, kvx_tier_slot(key, strlen(key)));
        if (o >= 0 && o != moved && o != g_migrated_from) victim = o;
    }
    assert_true(victim >= 0);
    /* its replica has every write (else the promoted replica misses
     * blocks, rightly, and the test could not tell) */
    double sync_end = rf_now() + 10;
    for (;;) {
        char info[4096];
        assert_int_equal(rf_cmd(rf_nodes[victim].port, info, sizeof info, "INFO replication"), 0);
        const char *mo = strstr(info, "master_repl_offset:"), *so = strstr(info, "slave0:");
        const char *off = so ? strstr(so, "offset=") : NULL;
        if (mo && off && atoll(mo + 19) == atoll(off + 7)) break;
        assert_true(rf_now() < sync_end);
        rf_sleep_ms(50);
    }
    (void)out;
    rf_kill(victim, SIGKILL);
    double t0 = rf_now();
    size_t got = su_served_prefix(b, 5000, 64);
    assert_true(got < 64 && got != SIZE_MAX);
    assert_true(rf_now() - t0 < 2.0);
    double end = rf_now() + 15;
    while (su_served_prefix(b, 5000, 64) != 64 && rf_now() < end) rf_sleep_ms(200);
    if (su_served_prefix(b, 5000, 64) != 64) {
        kvx_store_stats st = su_stat(b);
        fprintf(stderr, "victim %d (port %d); hits %llu misses %llu errors %llu bad %llu\n", victim, rf_nodes[victim].port,
                (unsigned long long)st.tier_hits, (unsigned long long)st.tier_misses, (unsigned long long)st.tier_errors,
                (unsigned long long)st.tier_bad);
        for (int i = g_cl; i < g_cl + 6; i++) {
            char nodes[8192];
            if (rf_nodes[i].pid > 0 && rf_cmd(rf_nodes[i].port, nodes, sizeof nodes, "CLUSTER NODES") == 0) {
                fprintf(stderr, "%s\n", nodes);
                break;
            }
        }
    }
    assert_int_equal(su_served_prefix(b, 5000, 64), 64);
    kvx_store_close(b);
}

/* The servers stopped, then su_teardown. */
static int redis_teardown(void **state)
{
    rf_stop_all();
    return su_teardown(state);
}

int main(int argc, char **argv)
{
    /* these tests count or damage the files one flush writes as its own
     * shard file: the active shard has its own, tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    rf_require();
    if (su_setup(NULL)) return 1;
    g_single = rf_start(0);
    if (g_single < 0) {
        fprintf(stderr, "could not start redis-server\n");
        redis_teardown(NULL);
        return 1;
    }
    const struct CMUnitTest single[] = {
        cmocka_unit_test(test_cross_store_hit),
        cmocka_unit_test(test_garbage_value_replaced),
        cmocka_unit_test(test_collision_value_never_served),
        cmocka_unit_test(test_tenant_isolation),
        cmocka_unit_test(test_tier_down_create_open_put),
        cmocka_unit_test(test_ttl),
        cmocka_unit_test(test_options_override_and_reindex),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_acl_auth),
        cmocka_unit_test(test_sixteen_processes),
        cmocka_unit_test(test_breaker_skip_and_probe),
        cmocka_unit_test(test_stalled_server),
        cmocka_unit_test(test_killed_during_write_behind),
    };
    int rc = cmocka_run_group_tests_name("tier/redis: one server", single, NULL, NULL);
    if (!rc) {
        g_cl = rf_cluster(3, 1);
        if (g_cl < 0) {
            fprintf(stderr, "could not make a Redis Cluster\n");
            rc = 1;
        } else {
            const struct CMUnitTest cluster[] = {
                cmocka_unit_test(test_cluster_cross_store),
                cmocka_unit_test(test_cluster_ask_and_moved),
                cmocka_unit_test(test_cluster_master_killed),
            };
            rc = cmocka_run_group_tests_name("tier/redis: cluster", cluster, NULL, NULL);
        }
    }
    redis_teardown(NULL);
    return rc;
}
