/*
 * cluster.c - tier/cluster.c, routing (docs/TIER.md "Routing"): key slots
 * and hash tags; a hostile CLUSTER SLOTS map refused whole; MOVED and ASK
 * redirects checked; a server without CLUSTER SLOTS taken as a single
 * Redis; stalled nodes cost one call's limit; the node and breaker tables
 * full.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/fake_redis.h"

/* TIER.md "Routing": CRC16-XMODEM key slots and hash tags as Redis. */
/* PROMISE: TIER-18 */
static void test_slots(void **state)
{
    (void)state;
    assert_int_equal(kvx_tier_slot("123456789", 9), 0x31C3 & 16383);
    assert_int_equal(kvx_tier_slot("foo", 3), 12182);
    assert_int_equal(kvx_tier_slot("{user1000}.following", 20), kvx_tier_slot("user1000", 8));
    assert_int_equal(kvx_tier_slot("foo{}{bar}", 10), kvx_tier_slot("foo{}{bar}", 10));
    assert_int_equal(kvx_tier_slot("foo{{bar}}zap", 13), kvx_tier_slot("{bar", 4));
    assert_int_equal(kvx_tier_slot("foo{bar}{zap}", 13), kvx_tier_slot("bar", 3));
}

/* hiredis's calloc of a 2^62-element array must fail as glibc's does (NULL),
 * not stop an ASan build */
const char *__asan_default_options(void);

const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* CLUSTER SLOTS from a hostile seed: a map with any bad entry is refused
 * (every key DOWN, nothing asked of the nodes it names), whatever shape. */
/* PROMISE: TIER-14 */
static void test_slots_map_refused(void **state)
{
    (void)state;
    fk *seed = fk_start(M_ECHO), *f2 = fk_start(M_ECHO);
    const long long P2 = f2->port;
    char host300[301];
    memset(host300, 'a', 300);
    host300[300] = '\0';
    /* reach: the entry names f2 rightly, only its slots are bad: f2 may
     * be asked for its own map (and, a single server, answer) */
    struct {
        long long a, b, port;
        const char *host;
        int reach;
    } bad[] = {
        {0, 16383, (1ll << 32) + P2, "127.0.0.1", 0}, /* was connected to as P2 */
        {0, 16383, 0, "127.0.0.1", 0},
        {0, 16383, -1, "127.0.0.1", 0},
        {0, 16383, 65536 + P2, "127.0.0.1", 0},
        {0, 16383, -(1ll << 32) + P2, "127.0.0.1", 0},
        {0, 16383, P2, host300, 0},
        {10, 5, P2, "127.0.0.1", 1},
        {0, 16384, P2, "127.0.0.1", 1},
        {-1, 100, P2, "127.0.0.1", 1},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        size_t len;
        char *sr = slots_reply(&len, 1, &bad[k].a, &bad[k].b, &bad[k].host, &bad[k].port);
        fk_slots(seed, sr, len);
        free(sr);
        kvx_tier *t = tier_to(seed->port, NULL);
        uint8_t st[4];
        double secs;
        size_t ok = get_n(t, 4, "s", st, &secs);
        assert_true(secs < 8.0);
        kvx_tier_close(t);
        if (!bad[k].reach && (ok || atomic_load(&f2->gets))) fail_msg("map %zu: the node of a bad entry was asked", k);
    }
    /* raw shapes: a NUL or a control byte in a host, wrong types, nested,
     * short entries, a valid entry then a bad one, 2^62 elements */
    char raw[16][512];
    int nr = 0;
    snprintf(raw[nr++], 512, "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$11\r\n127.0.0.1#x\r\n:%lld\r\n", P2); /* # -> NUL */
    snprintf(raw[nr++], 512, "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$10\r\n127.0.0.1\n\r\n:%lld\r\n", P2);
    snprintf(raw[nr++], 512, "*1\r\n*3\r\n$1\r\n0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%lld\r\n", P2);
    snprintf(raw[nr++], 512, "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n:1\r\n:%lld\r\n", P2);
    snprintf(raw[nr++], 512, "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n$5\r\n%05lld\r\n", P2);
    snprintf(raw[nr++], 512, "*1\r\n*2\r\n:0\r\n:16383\r\n");
    snprintf(raw[nr++], 512, "*1\r\n*3\r\n:0\r\n:16383\r\n*1\r\n$9\r\n127.0.0.1\r\n");
    snprintf(raw[nr++], 512, "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n*1\r\n*1\r\n:1\r\n:%lld\r\n", P2);
    snprintf(raw[nr++], 512, "*1\r\n:5\r\n");
    snprintf(raw[nr++], 512,
             "*2\r\n*3\r\n:0\r\n:8000\r\n*2\r\n$9\r\n127.0.0.1\r\n:%lld\r\n*3\r\n:8001\r\n:16383\r\n*2\r\n$9\r\n"
             "127.0.0.1\r\n:0\r\n",
             P2);
    snprintf(raw[nr++], 512, "*4611686018427387904\r\n");
    snprintf(raw[nr++], 512, "*0\r\n");
    snprintf(raw[nr++], 512, "+OK\r\n");
    size_t rawlen[16];
    for (int k = 0; k < nr; k++) rawlen[k] = strlen(raw[k]);
    *strchr(raw[0], '#') = '\0';
    atomic_store(&f2->gets, 0); /* the reach cases above asked it */
    for (int k = 0; k < nr; k++) {
        atomic_store(&f2->gets, 0);
        fk_slots(seed, raw[k], rawlen[k]);
        kvx_tier *t = tier_to(seed->port, NULL);
        uint8_t st[4];
        double secs;
        size_t ok = get_n(t, 4, "r", st, &secs); /* an OK could only be the seed's own echo */
        assert_true(secs < 8.0);
        kvx_tier_close(t);
        /* map 9's first entry names f2 rightly: f2 may be asked for its map */
        if (k != 9 && atomic_load(&f2->gets)) fail_msg("raw map %d: the node of a bad entry was asked (%zu OK)", k, ok);
    }
    fk_stop(seed); /* its breaker is open (the protocol errors above): a new one */
    seed = fk_start(M_ECHO);
    /* the node asked (empty host) on 16 other ports: node_add grows the
     * table under the pointer to the asked node's name (ASan: freed) */
    {
        long long a[16], b[16], port[16];
        const char *host[16];
        for (int i = 0; i < 16; i++) {
            a[i] = i * 1024, b[i] = i * 1024 + 1023, port[i] = closed_port(), host[i] = i % 2 ? "" : "?";
        }
        size_t len;
        char *sr = slots_reply(&len, 16, a, b, host, port);
        fk_slots(seed, sr, len);
        free(sr);
        kvx_tier *t = tier_to(seed->port, NULL);
        uint8_t st[64];
        double secs;
        assert_int_equal(get_n(t, 64, "e", st, &secs), 0); /* closed ports */
        assert_true(secs < 8.0);
        assert_int_equal(kvx_tier_is_cluster(t), 1);
        kvx_tier_close(t);
    }
    /* a valid map still works: every slot on f2 */
    {
        long long a = 0, b = 16383;
        const char *h = "127.0.0.1";
        size_t len;
        char *sr = slots_reply(&len, 1, &a, &b, &h, &P2);
        fk_slots(seed, sr, len);
        free(sr);
        kvx_tier *t = tier_to(seed->port, NULL);
        uint8_t st[8];
        assert_int_equal(get_n(t, 8, "v", st, NULL), 8);
        assert_int_equal(atomic_load(&f2->gets), 8);
        kvx_tier_close(t);
    }
    fk_stop(seed);
    fk_stop(f2);
}

/* MOVED / ASK to slots out of range, to malformed "host:port", to a port of
 * 2^32 + a live port, to hosts with a control byte or of 300 bytes, redirect
 * loops (MOVED and ASK), a MOVED from a server whose CLUSTER SLOTS is refused
 * (an ACL user without cluster|slots), AUTH sent to a node only a redirect
 * named (test_redirects_hostile, test_moved_without_cluster_slots). */
/* PROMISE: TIER-14 */
static void test_redirects_hostile(void **state)
{
    (void)state;
    fk *f1 = fk_start(M_REDIRECT), *f2 = fk_start(M_ECHO);
    char red[16][600];
    int nr = 0;
    snprintf(red[nr++], 600, "MOVED 16384 127.0.0.1:%d", f2->port);
    snprintf(red[nr++], 600, "MOVED -1 127.0.0.1:%d", f2->port);
    snprintf(red[nr++], 600, "MOVED 99999999999999999999 127.0.0.1:%d", f2->port);
    snprintf(red[nr++], 600, "MOVED 5 127.0.0.1");
    snprintf(red[nr++], 600, "MOVED 5 :%d", f2->port);
    snprintf(red[nr++], 600, "MOVED 5 127.0.0.1:0");
    snprintf(red[nr++], 600, "MOVED 5 127.0.0.1:%lld", (1ll << 32) + f2->port);
    snprintf(red[nr++], 600, "MOVED 5 127.0.0.1:-%d", f2->port);
    snprintf(red[nr++], 600, "MOVED 5 127.0.0.1\tx:%d", f2->port); /* getaddrinfo refuses it */
    snprintf(red[nr++], 600, "MOVED 5 \033[2J127.0.0.1:%d", f2->port);
    snprintf(red[nr++], 600, "MOVED 5 127.0.0.1:%dx", f2->port); /* strtol's prefix was taken: followed */
    snprintf(red[nr++], 600, "MOVED 5 127.0.0.1:+%d", f2->port);
    snprintf(red[nr++], 600, "MOVED");
    snprintf(red[nr++], 600, "ASK ");
    snprintf(red[nr++], 600, "ASK 5 %0300d:%d", 1, f2->port);
    for (int k = 0; k < nr; k++) {
        f1->raw = red[k];
        f1->raw_len = strlen(red[k]);
        kvx_tier *t = tier_to(f1->port, NULL);
        uint8_t st[2];
        double secs;
        assert_int_equal(get_n(t, 2, "m", st, &secs), 0);
        assert_int_equal(st[0], KVX_TIER_FAILED);
        assert_true(secs < 8.0);
        kvx_tier_close(t);
        if (atomic_load(&f2->gets)) fail_msg("redirect \"%s\" was followed", red[k]);
    }
    /* loops: f1 -> f3 -> f1 ...; ASK as well: five redirects, then failed */
    fk *f3 = fk_start(M_REDIRECT);
    char to1[64], to3[64];
    for (int ask = 0; ask < 2; ask++) {
        snprintf(to3, sizeof to3, "%s 5 127.0.0.1:%d", ask ? "ASK" : "MOVED", f3->port);
        snprintf(to1, sizeof to1, "%s 5 127.0.0.1:%d", ask ? "ASK" : "MOVED", f1->port);
        f1->raw = to3, f1->raw_len = strlen(to3);
        f3->raw = to1, f3->raw_len = strlen(to1);
        kvx_tier *t = tier_to(f1->port, NULL);
        uint8_t st[8];
        double secs;
        assert_int_equal(get_n(t, 8, "l", st, &secs), 0);
        for (int i = 0; i < 8; i++) assert_int_equal(st[i], KVX_TIER_FAILED);
        assert_true(secs < 8.0);
        kvx_tier_close(t);
    }
    /* AUTH goes to a node only an ASK named (docs/TIER.md: AUTH on every
     * connection; the node that named it holds the credentials already) */
    fk *f4 = fk_start(M_ECHO);
    snprintf(to3, sizeof to3, "ASK 5 127.0.0.1:%d", f4->port);
    f1->raw = to3, f1->raw_len = strlen(to3);
    kvx_tier *t = tier_to(f1->port, "alice:pw");
    uint8_t st[2];
    assert_int_equal(get_n(t, 2, "a", st, NULL), 2); /* the ASK's node answered */
    assert_string_equal(f1->auth, "alice pw");
    assert_string_equal(f4->auth, "alice pw");
    kvx_tier_close(t);
    fk_stop(f1), fk_stop(f2), fk_stop(f3), fk_stop(f4);
}

/* docs/TIER.md "Routing": a server that refuses CLUSTER SLOTS (an ACL user
 * without cluster|slots) is taken as a single Redis, "and a MOVED corrects
 * that if wrong". */
/* PROMISE: TIER-10 */
static void test_moved_without_cluster_slots(void **state)
{
    (void)state;
    fk *f1 = fk_start(M_REDIRECT), *f4 = fk_start(M_ECHO);
    const char *noperm = "-NOPERM this user has no permissions to run the 'cluster|slots' command\r\n";
    fk_slots(f1, noperm, strlen(noperm));
    char key[64], to[96];
    snprintf(key, sizeof key, "k0n");
    snprintf(to, sizeof to, "MOVED %u 127.0.0.1:%d", kvx_tier_slot(key, strlen(key)), f4->port);
    f1->raw = to, f1->raw_len = strlen(to);
    kvx_tier *t = tier_to(f1->port, "alice:pw");
    uint8_t st[1];
    assert_int_equal(get_n(t, 1, "n", st, NULL), 1);
    assert_int_equal(kvx_tier_is_cluster(t), 0);
    /* and the next call goes to the owner at once */
    int before = atomic_load(&f1->gets);
    assert_int_equal(get_n(t, 1, "n", st, NULL), 1);
    assert_int_equal(atomic_load(&f1->gets), before);
    kvx_tier_close(t);
    assert_string_equal(f4->auth, "alice pw");
    fk_stop(f1), fk_stop(f4);
}

/* test_drip_get_lookup, test_drip_cluster_slots, test_drip_auth,
 * test_drip_set_close: hiredis's redisGetReply waits for a whole reply with
 * only a per-read timeout (1 s): a server sending one byte every 300 ms held
 * a lookup, a refresh, an AUTH or the write-behind (and so kvx_store_close,
 * which joins it) for as long as it kept dripping (a 1000-byte value: 300 s).
 * Every read and write is now cut at the call's deadline. */
/* PROMISE: TIER-15 */
static void test_drip_cluster_slots(void **state)
{
    (void)state;
    fk *f = fk_start(M_DRIP_SLOTS);
    kvx_tier *t = tier_to(f->port, NULL);
    uint8_t st[4];
    double secs;
    assert_int_equal(get_n(t, 4, "d", st, &secs), 0);
    assert_true(secs < 5.0 + 3.0);
    double t0 = now_s();
    kvx_tier_ping(t); /* the breaker may skip it; bounded either way */
    assert_true(now_s() - t0 < 5.0 + 3.0);
    kvx_tier_close(t);
    fk_stop(f);
}

/* 16 nodes that accept and never answer, one lookup over all of them:
 * the whole call stays within its 5 s (it took 16 x 1 s). */
/* PROMISE: TIER-15 */
static void test_stalled_nodes_whole_call(void **state)
{
    (void)state;
    int fds[16];
    long long a[16], b[16], port[16];
    const char *host[16];
    for (int i = 0; i < 16; i++) {
        int p;
        fds[i] = listen_port(&p, 0); /* the kernel completes the handshakes; nobody reads */
        a[i] = i * 1024, b[i] = i * 1024 + 1023, port[i] = p, host[i] = "127.0.0.1";
    }
    fk *seed = fk_start(M_ECHO);
    size_t len;
    char *sr = slots_reply(&len, 16, a, b, host, port);
    fk_slots(seed, sr, len);
    free(sr);
    kvx_tier *t = tier_to(seed->port, NULL);
    uint8_t st[64];
    double secs;
    assert_int_equal(get_n(t, 64, "w", st, &secs), 0);
    assert_true(secs < 5.0 + 3.0);
    kvx_tier_close(t);
    fk_stop(seed);
    for (int i = 0; i < 16; i++) close(fds[i]);
}

/* 8192 distinct nodes in one map (every two slots their own host on
 * loopback, a closed port): loaded, asked, refused fast. (The node table
 * holds 16384 with the seeds: a map naming more is refused whole.) Then the process-wide
 * breaker table (256) is full: a stalled node met afterwards must still
 * get a breaker (its second lookup skips it: no second connection). */
/* PROMISE: TIER-17 */
static void test_many_nodes_and_breaker_table_full(void **state)
{
    (void)state;
    int cp = closed_port();
    size_t cap = 8192 * 80 + 64, o = 0;
    char *r = malloc(cap);
    o += (size_t)snprintf(r + o, cap - o, "*8192\r\n");
    for (int s = 0; s < 8192; s++) {
        char host[32];
        int hl = snprintf(host, sizeof host, "127.1.%d.%d", s >> 8, s & 255);
        o += (size_t)snprintf(r + o, cap - o, "*3\r\n:%d\r\n:%d\r\n*2\r\n$%d\r\n%s\r\n:%d\r\n", 2 * s, 2 * s + 1,
                              hl, host, cp);
    }
    fk *seed = fk_start(M_ECHO);
    fk_slots(seed, r, o);
    kvx_tier *t = tier_to(seed->port, NULL);
    uint8_t *st = malloc(1024);
    double secs;
    assert_int_equal(get_n(t, 1024, "b", st, &secs), 0);
    assert_true(secs < 5.0 + 3.0);
    for (int i = 0; i < 1024; i++) assert_true(st[i] == KVX_TIER_DOWN || st[i] == KVX_TIER_FAILED);
    assert_int_equal(kvx_tier_is_cluster(t), 1);
    kvx_tier_close(t);
    free(st);
    /* a node that accepts and never answers */
    fk *sil = fk_start(M_SILENT);
    t = tier_to(sil->port, NULL);
    uint8_t st1[1];
    assert_int_equal(get_n(t, 1, "z", st1, &secs), 0);
    assert_true(secs < 5.0 + 3.0);
    assert_int_equal(atomic_load(&sil->conns), 1);
    assert_int_equal(get_n(t, 1, "z", st1, NULL), 0);
    assert_int_equal(st1[0], KVX_TIER_DOWN);
    assert_int_equal(atomic_load(&sil->conns), 1); /* skipped by its breaker */
    kvx_tier_close(t);
    fk_stop(sil);
    fk_stop(seed);
    free(r);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slots),
        cmocka_unit_test(test_slots_map_refused),
        cmocka_unit_test(test_redirects_hostile),
        cmocka_unit_test(test_moved_without_cluster_slots),
        cmocka_unit_test(test_drip_cluster_slots),
        cmocka_unit_test(test_stalled_nodes_whole_call),
        cmocka_unit_test(test_many_nodes_and_breaker_table_full),
    };
    return cmocka_run_group_tests_name("tier/cluster", tests, su_setup, su_teardown);
}
