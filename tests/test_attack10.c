/*
 * test_attack10.c - hostile review of the shared Redis tier (tier/cluster.c,
 * tier/value.c, tier/url.c and engine/store_tier.c), against HOSTILE or
 * BROKEN RESP servers: fake Redis servers run here as threads on loopback
 * ports, answering crafted RESP2 bytes (no redis-server needed).
 *
 * Covered (each a miss at worst, never a wrong block, a crash, a read out
 * of bounds or a wait past docs/TIER.md's limits):
 *  - CLUSTER SLOTS replies: ports 0, -1, 65536, 2^32 + a live port; a > b,
 *    b = 16384, a < 0; empty, "?", 300-byte hosts, hosts with a NUL or a
 *    control byte; wrong element types, nested arrays, short entries, a
 *    valid entry followed by a bad one, an array of 2^62 elements; the
 *    "node you asked" (empty host) on other ports, 16 of them (node table
 *    growth); 8192 distinct nodes (test_slots_map_refused,
 *    test_many_nodes_and_breaker_table_full);
 *  - MOVED / ASK to slots out of range, to malformed "host:port", to a
 *    port of 2^32 + a live port, to hosts with a control byte or of 300
 *    bytes, redirect loops (MOVED and ASK), a MOVED
 *    from a server whose CLUSTER SLOTS is refused (an ACL user without
 *    cluster|slots), AUTH sent to a node only a redirect named
 *    (test_redirects_hostile, test_moved_without_cluster_slots);
 *  - GET replies of every type (integer, array, nested, status, error,
 *    nil, nil array, empty bulk, RESP3 types, a bulk of 2^62 bytes, an
 *    array of 2^62 elements), fewer replies than commands, a server that
 *    closes mid-pipeline, one that accepts and never answers
 *    (test_get_reply_types, test_fewer_replies, test_close_mid_pipeline,
 *    test_never_answers);
 *  - replies beyond the commands (extra or late), read by the next call
 *    on the reused connection (test_extra_reply_*); a store looking up
 *    through a server that follows every valid value with another
 *    block's valid value (test_desync_never_wrong);
 *  - one byte every 300 ms (under the 1 s command timeout): a GET value,
 *    a CLUSTER SLOTS reply, an AUTH reply, SET replies to the
 *    write-behind while the store closes (test_drip_*); a silent server
 *    under three queued write-behind batches at close (test_silent_close);
 *    one reading 16 KiB every 300 ms under 8 MiB of write-behind
 *    (test_slow_reader_close);
 *  - 16 nodes that accept and never answer, one lookup over all of them
 *    (test_stalled_nodes_whole_call);
 *  - values with a correct CRC-32C and crafted fields: B of 2^32-1,
 *    tokens / envelope blocks mismatch, the envelope of another geometry,
 *    version or quant, two blocks, truncations, an E4M3 value's scale
 *    NaN / inf / 0 / negative (test_values_crafted);
 *  - the password in error messages and shown URLs
 *    (test_url_error_hides_password, test_url_password_with_at).
 *
 * Defects found, fixed in tier/, tested here:
 *  - test_drip_get_lookup, test_drip_cluster_slots, test_drip_auth,
 *    test_drip_set_close: hiredis's redisGetReply waits for a whole reply
 *    with only a per-read timeout (1 s): a server sending one byte every
 *    300 ms held a lookup, a refresh, an AUTH or the write-behind (and so
 *    kvx_store_close, which joins it) for as long as it kept dripping (a
 *    1000-byte value: 300 s). Every read and write is now cut at the
 *    call's deadline.
 *  - test_stalled_nodes_whole_call: the replies of each node were read one
 *    node after the other, each up to a command timeout, with no look at
 *    the call's deadline: 16 stalled nodes made one lookup take 16 s (the
 *    promise: 5 s). Same fix; a node not waited for before the deadline is
 *    dropped (its replies would come late) without opening its breaker.
 *  - test_extra_reply_same_read, test_extra_reply_late: a reply no command
 *    asked for (sent along with, or after, the last one) was taken by the
 *    next call on that connection as the answer to its first command. A
 *    connection with bytes waiting before a call writes to it is dropped.
 *    Values are verified, so no wrong block was ever served from it
 *    (test_desync_never_wrong held before the fix too), but every later
 *    lookup on that connection missed from its first block on.
 *  - test_idle_close_not_a_miss: a connection the server closed while
 *    idle (Redis's `timeout`, a proxy's idle limit) was written to, its
 *    end read as a failure of the node: the call was a miss and the
 *    node's breaker opened (more misses for 250 ms). The same check (a
 *    connection that is readable before a call writes) finds it closed
 *    and reconnects.
 *  - test_slots_map_refused: a port of 2^32 + p in CLUSTER SLOTS was
 *    connected to as port p ((int) cast; ports were not checked at all),
 *    a host with a NUL as the bytes before the NUL; and an empty host
 *    (the node asked) on another port read freed memory when the node
 *    table grew (node_add's realloc under the pointer into it; ASan).
 *    Ports must be 1..65535, hosts under 256 bytes without NUL or control
 *    bytes (as url.c's), and the asked node's name is copied first.
 *  - test_moved_without_cluster_slots: docs/TIER.md says a server that
 *    refuses CLUSTER SLOTS is a single Redis "and a MOVED corrects that";
 *    but each MOVED marked the map stale, the refresh got the refusal
 *    again and put every slot back on the seed: the key was redirected
 *    five times and failed. Such a MOVED no longer asks for a refresh.
 *  - test_many_nodes_and_breaker_table_full: the process-wide breaker
 *    table holds 256 nodes and was never reused: after a process met 256
 *    nodes (a long life in which nodes move, or a map naming many), no
 *    other node ever had a breaker again (a stalled node cost its timeout
 *    on every lookup). A full table now reuses a closed breaker, else the
 *    one whose time ran out first.
 *  - test_url_error_hides_password: a URL of another scheme
 *    ("rediss://user:pass@h") was quoted whole in the error message (and
 *    so on stderr from a damaged DIR/TIER): only its scheme is now.
 *  - test_url_password_with_at: the URL was split at its first '@', so a
 *    password holding one ("redis://u:p@ss@h") became host "ss@h", and
 *    `store tier show` printed that part of the password; split at the
 *    last '@' (as Python's urlsplit), in the parse and the redaction.
 *
 *  - test_cas_close_bounded: a write-behind batch ran one compare-and-set
 *    per key whose SET NX found it taken after a lookup saw a bad value
 *    there (up to 64), each a whole call of its own; a server answering
 *    each EVAL in 0.8 s held kvx_store_close 16 x 0.8 s = 13 s with 16
 *    such keys, past its documented 2 s + 1 s. A batch's SET NX and
 *    compare-and-sets now share one budget (engine/store_tier.c
 *    st_tier_write).
 *  - test_cli_create_hides_password: `kvx store create --tier
 *    redis://user:pass@h` printed "shared tier redis://user:pass@h" on
 *    stdout, the password in clear, and pinged the tier (kvx_store_stat
 *    for the capacity) though create never contacts it; now redacted, and
 *    the capacity comes from a handle opened with the tier off.
 *
 * Held (no change): GET replies of a wrong type are failures, nil a miss;
 * redirect loops end at five redirects; malformed redirects fail the key;
 * a closed or silent server costs at most the call's limit; a value is
 * served only when it verifies, whatever arrives (every GET value the
 * fakes send names its key, and every test checks an OK answer is its own
 * key's); crafted values with a correct CRC are refused without a read
 * outside the buffer (ASan). AUTH user:pass goes to every node the map or
 * a redirect names (docs/TIER.md: "on every connection"): the node that
 * names it already holds the credentials (test_redirects_hostile pins it).
 *
 * The node table holds 16384 nodes with the seeds: a map naming more is
 * refused whole (every key a miss), not truncated.
 *
 *  - test_flood_reply: a reply streamed fast and huge (a bulk of 2^40
 *    bytes, an array of 10^9 integers): hiredis 0.14 buffers a reply
 *    until it is complete, so within the 5 s deadline a loopback server
 *    pushed gigabytes into the process. A reply is now cut at
 *    kvx_tier_limits.max_reply_bytes (64 MiB; a store's clients: two
 *    pages + 1 MiB, at least 16 MiB).
 *
 *  - test_reply_memory_bounded: the wire cut bounded bytes read, not
 *    what hiredis built from them: an array declaring 2^31-1 elements
 *    (a 16 GiB calloc) filled with 3-byte empty statuses took gigabytes
 *    of heap within 64 MiB of wire, and nested such headers cost seconds
 *    freeing after the deadline. Replies are built by tier/reply.c within
 *    twice the wire cap.
 *
 *  - test_slow_resolver: a node named by a host whose name server never
 *    answers: hiredis resolved it with getaddrinfo before its connect
 *    timeout started, so each connect waited on the resolver (glibc: 5 s
 *    a try, two tries) and one lookup took 10 s where 5 s is documented.
 *    A name is now resolved within the connect timeout (tier/resolve.c, a
 *    thread of its own per lookup) and hiredis gets the address.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/store.h"
#include "tier/tier.h"
#include "lib/fake_redis.h"

/* hiredis's calloc of a 2^62-element array must fail as glibc's does (NULL),
 * not stop an ASan build */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* --------------------------------------------------------------- slots map */

/* CLUSTER SLOTS from a hostile seed: a map with any bad entry is refused
 * (every key DOWN, nothing asked of the nodes it names), whatever shape. */
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

/* ---------------------------------------------------------------- redirects */

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

/* ---------------------------------------------------------------- replies */

static void test_get_reply_types(void **state)
{
    (void)state;
    struct {
        const char *raw;
        size_t len;
        uint8_t want;
    } c[] = {
        {":5\r\n", 0, KVX_TIER_FAILED},
        {"*1\r\n$1\r\na\r\n", 0, KVX_TIER_FAILED},
        {"*3\r\n*1\r\n*1\r\n:1\r\n:2\r\n$1\r\nb\r\n", 0, KVX_TIER_FAILED},
        {"+OK\r\n", 0, KVX_TIER_FAILED},
        {"-ERR nope\r\n", 0, KVX_TIER_FAILED},
        {"-\r\n", 0, KVX_TIER_FAILED},
        {"$-1\r\n", 0, KVX_TIER_NONE},
        {"*-1\r\n", 0, KVX_TIER_NONE},
        {"%1\r\n+a\r\n+b\r\n", 0, KVX_TIER_FAILED},
        {"_\r\n", 0, KVX_TIER_FAILED},
        {"$4611686018427387904\r\nabc", 0, KVX_TIER_FAILED},
        {"$9223372036854775807\r\nabc", 0, KVX_TIER_FAILED},
        {"*4611686018427387904\r\n", 0, KVX_TIER_FAILED},
        {"*9\r\n*9\r\n*9\r\n*9\r\n*9\r\n*9\r\n*9\r\n*9\r\n*9\r\n*9\r\n*9\r\n", 0, KVX_TIER_FAILED},
        {"$5\r\nab\r\n", 0, KVX_TIER_FAILED},
        {"garbage\r\n", 0, KVX_TIER_FAILED},
    };
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        fk *f = fk_start(M_RAW); /* its own: a protocol error opens the breaker */
        f->raw = c[k].raw;
        f->raw_len = c[k].len ? c[k].len : strlen(c[k].raw);
        kvx_tier *t = tier_to(f->port, NULL);
        uint8_t st[1];
        double secs;
        assert_int_equal(get_n(t, 1, "t", st, &secs), 0);
        /* KVX_TIER_FAILED here: no answer, FAILED or (the breaker opened
         * on a protocol error) DOWN */
        int good = c[k].want == KVX_TIER_FAILED ? st[0] == KVX_TIER_FAILED || st[0] == KVX_TIER_DOWN
                                                : st[0] == c[k].want;
        if (!good) fail_msg("reply %zu (%.20s): status %u, not %u", k, c[k].raw, st[0], c[k].want);
        assert_true(secs < 8.0);
        kvx_tier_close(t);
        fk_stop(f);
    }
    /* an empty bulk is a value (of 0 bytes: the value check refuses it) */
    fk *f = fk_start(M_RAW);
    f->raw = "$0\r\n\r\n";
    f->raw_len = 6;
    kvx_tier *t = tier_to(f->port, NULL);
    const char *k = "k";
    uint8_t *v = NULL, st;
    size_t len = 9;
    kvx_tier_get(t, &k, 1, &v, &len, &st, NULL);
    assert_int_equal(st, KVX_TIER_OK);
    assert_int_equal(len, 0);
    free(v);
    kvx_tier_close(t);
    fk_stop(f);
}

/* Fewer replies than commands: the answered ones are right, the others
 * fail within the limit. */
static void test_fewer_replies(void **state)
{
    (void)state;
    fk *f = fk_start(M_FEWER);
    f->limit = 2;
    kvx_tier *t = tier_to(f->port, NULL);
    uint8_t st[6];
    double secs;
    size_t ok = get_n(t, 6, "f", st, &secs);
    assert_true(ok >= 2 && ok < 6);
    assert_int_equal(st[0], KVX_TIER_OK);
    assert_true(secs < 8.0);
    kvx_tier_close(t);
    fk_stop(f);
}

/* A server that closes after one answer per connection: every answer is
 * its own key's, the process lives (SIGPIPE), bounded. */
static void test_close_mid_pipeline(void **state)
{
    (void)state;
    fk *f = fk_start(M_CLOSE);
    kvx_tier *t = tier_to(f->port, NULL);
    uint8_t st[16];
    double secs;
    for (int r = 0; r < 3; r++) {
        get_n(t, 16, "c", st, &secs); /* every OK its own key's (a close with
                                       * unread data resets: maybe none) */
        assert_true(secs < 8.0);
    }
    kvx_tier_close(t);
    fk_stop(f);
}

/* Accepts and never answers: a lookup returns within the call's limit. */
static void test_never_answers(void **state)
{
    (void)state;
    fk *f = fk_start(M_SILENT);
    kvx_tier *t = tier_to(f->port, "u:p");
    uint8_t st[8];
    double secs;
    assert_int_equal(get_n(t, 8, "q", st, &secs), 0);
    assert_true(secs < 5.0 + 3.0);
    kvx_tier_close(t);
    fk_stop(f);
}

/* A reply no command asked for, in the same send as the last answer: the
 * next call's first command must get its own answer. */
static void test_extra_reply_same_read(void **state)
{
    (void)state;
    fk *f = fk_start(M_EXTRA);
    kvx_tier *t = tier_to(f->port, NULL);
    uint8_t st[1];
    for (int r = 0; r < 3; r++) {
        char tag[16];
        snprintf(tag, sizeof tag, "x%d", r);
        assert_int_equal(get_n(t, 1, tag, st, NULL), 1); /* fails on "STALE" */
    }
    kvx_tier_close(t);
    fk_stop(f);
}

/* The same, the extra reply arriving 100 ms after the answer (in the
 * socket when the next call starts). */
static void test_extra_reply_late(void **state)
{
    (void)state;
    fk *f = fk_start(M_EXTRA_LATE);
    kvx_tier *t = tier_to(f->port, NULL);
    uint8_t st[1];
    for (int r = 0; r < 3; r++) {
        char tag[16];
        snprintf(tag, sizeof tag, "y%d", r);
        atomic_store(&f->stale_sent, 0);
        assert_int_equal(get_n(t, 1, tag, st, NULL), 1);
        for (int w = 0; w < 500 && !atomic_load(&f->stale_sent); w++) sleep_ms(10);
        sleep_ms(20);
    }
    kvx_tier_close(t);
    fk_stop(f);
}

/* docs/TIER.md "Trust", against a server answering every GET with the
 * asked block's valid value AND, unasked, another block's valid value
 * (a reply desync on purpose): a store never serves a wrong block, and
 * with the stray replies dropped between calls it serves the first block
 * of every lookup (the second reply of a pipeline is the stray one). */
static void test_desync_never_wrong(void **state)
{
    (void)state;
    fk *f = fk_start(M_KV);
    char dir[512], url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", f->port);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 64ull << 20;
    o.tier_url = url;
    kvx_store *a = NULL, *b = NULL;
    snprintf(dir, sizeof dir, "%s/desync_a", su_root);
    assert_int_equal(kvx_store_create(&a, dir, &o), 0);
    assert_int_equal(su_put_seq(a, 600, 16), 0);
    kvx_store_close(a); /* drains the write-behind */
    assert_int_equal(f->nkv, 16);
    snprintf(dir, sizeof dir, "%s/desync_b", su_root);
    assert_int_equal(kvx_store_create(&b, dir, &o), 0);
    kvx_store_close(b);
    assert_int_equal(kvx_store_open(&b, dir, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(su_served_prefix(b, 600, 16), 16); /* an honest server */
    f->mode = M_KV_EXTRA;
    for (int r = 0; r < 4; r++) {
        size_t got = su_served_prefix(b, 600, 16);
        assert_true(got != SIZE_MAX); /* never a wrong block */
        /* at most the first: every later reply is out of step. 0 when the
         * last round's stray replies arrive after the reuse check (a
         * loaded machine): the first reply read is then a stale one */
        assert_true(got <= 1);
    }
    kvx_store_close(b);
    fk_stop(f);
}

/* ------------------------------------------------------------------ drips */

/* A server streaming one endless reply as fast as the client reads: a
 * bulk declaring 2^40 bytes, or an array declaring 10^9 integers. hiredis
 * keeps every byte of an incomplete reply (and an object per array
 * element) until it is whole, so for the whole 5 s call a loopback server
 * could push gigabytes into the process. A reply is now cut at
 * max_reply_bytes (64 MiB by default; a store's own clients: 16 MiB here,
 * one value or a slot map): the client drops the connection and the key
 * is a miss. The fake counts what it managed to send (socket buffers add a
 * few MiB); without the cut it sends all it may (768 MiB, an array 96 MiB). */
static void test_flood_reply(void **state)
{
    (void)state;
    for (int array = 0; array < 2; array++) {
        fk *f = fk_start(M_FLOOD);
        f->limit = array;
        f->raw_len = array ? (size_t)96 << 20 : (size_t)768 << 20;
        if (!array) {
            kvx_tier *t = tier_to(f->port, NULL);
            uint8_t st[1];
            double secs;
            assert_int_equal(get_n(t, 1, "f", st, &secs), 0);
            assert_int_not_equal(st[0], KVX_TIER_OK);
            kvx_tier_close(t);
            unsigned long long sent = atomic_load(&f->flood_sent);
            if (sent >= (96ull << 20)) fail_msg("a bulk flood: %llu MiB taken in (cut at 64 MiB)", sent >> 20);
            atomic_store(&f->flood_sent, 0);
        }
        /* through a store's lookup: its clients cut at 16 MiB */
        char name[32];
        snprintf(name, sizeof name, "flood%d", array);
        kvx_store *s = tier_store(name, f->port);
        assert_int_equal(su_served_prefix(s, 78, 2), 0);
        kvx_store_close(s);
        unsigned long long sent = atomic_load(&f->flood_sent);
        if (sent >= (48ull << 20))
            fail_msg("a%s flood through a store: %llu MiB taken in (cut at 16 MiB)", array ? "n array" : " bulk",
                     sent >> 20);
        fk_stop(f);
    }
}

/* kB of this process's peak resident memory (VmHWM), 0 if unknown. */
static unsigned long long peak_rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

/* What a reply costs in memory and time, not only on the wire. hiredis
 * 0.14 builds what a reply declares: "*2147483647" is a 16 GiB calloc
 * before one element arrives, each element a 48-byte object and a slot
 * (about 30 times an empty status's 3 bytes), and freeing the array
 * walks every declared slot. Under the 64 MiB wire cut, 60 MiB of empty
 * statuses took a lookup to gigabytes of heap; seven nested headers and
 * silence cost seconds of CPU after the 5 s deadline (seven 2^31-slot
 * walks, the tier's lock held). Replies are now built by tier/reply.c
 * within twice the wire cap: the header alone is refused. Each case runs
 * in a child whose peak resident memory (VmHWM) is compared before and
 * after the call. */
static void test_reply_memory_bounded(void **state)
{
    (void)state;
    for (int nested = 0; nested < 2; nested++) {
        fk *f = fk_start(M_HEAP);
        f->limit = nested;
        f->raw_len = (size_t)60 << 20;
        int pfd[2];
        assert_int_equal(pipe(pfd), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(pfd[0]);
            unsigned long long before = peak_rss_kb();
            kvx_tier *t = tier_to(f->port, NULL);
            uint8_t st[1];
            double secs = 0;
            size_t ok = get_n(t, 1, "h", st, &secs);
            kvx_tier_close(t); /* the reply's objects are freed here at the latest */
            char msg[128];
            int n = snprintf(msg, sizeof msg, "%zu %d %llu %.3f", ok, st[0], peak_rss_kb() - before, secs);
            ssize_t w = write(pfd[1], msg, (size_t)n);
            _exit(w == n ? 0 : 1);
        }
        close(pfd[1]);
        double t0 = now_s();
        char msg[128] = {0};
        ssize_t got = 0, r;
        while ((r = read(pfd[0], msg + got, sizeof msg - 1 - (size_t)got)) > 0) got += r;
        close(pfd[0]);
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        double took = now_s() - t0;
        fk_stop(f);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        size_t ok = 9;
        int st = -1;
        unsigned long long grew_kb = 0;
        double secs = 0;
        assert_int_equal(sscanf(msg, "%zu %d %llu %lf", &ok, &st, &grew_kb, &secs), 4);
        assert_int_equal(ok, 0);
        assert_true(st == KVX_TIER_FAILED || st == KVX_TIER_DOWN); /* a miss; the breaker may have opened */
        if (grew_kb > (128ull << 10))
            fail_msg("%s: the lookup grew the peak resident memory by %llu MiB (wire cut 64 MiB)",
                     nested ? "nested headers" : "60 MiB of empty statuses", grew_kb >> 10);
        if (took > 6.5)
            fail_msg("%s: the lookup and its close took %.1f s (the call's limit is 5 s)",
                     nested ? "nested headers" : "60 MiB of empty statuses", took);
    }
}

static void test_drip_get_lookup(void **state)
{
    (void)state;
    fk *f = fk_start(M_DRIP_GET);
    kvx_tier *t = tier_to(f->port, NULL);
    uint8_t st[4];
    double secs;
    assert_int_equal(get_n(t, 4, "d", st, &secs), 0);
    assert_true(secs < 5.0 + 3.0);
    kvx_tier_close(t);
    /* through a store's lookup */
    kvx_store *s = tier_store("drip", f->port);
    double t0 = now_s();
    assert_int_equal(su_served_prefix(s, 77, 4), 0);
    assert_true(now_s() - t0 < 5.0 + 3.0);
    kvx_store_close(s);
    fk_stop(f);
}

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

static void test_drip_auth(void **state)
{
    (void)state;
    fk *f = fk_start(M_DRIP_AUTH);
    kvx_tier *t = tier_to(f->port, "bob:pw");
    uint8_t st[4];
    double secs;
    assert_int_equal(get_n(t, 4, "d", st, &secs), 0);
    assert_true(secs < 5.0 + 3.0);
    kvx_tier_close(t);
    fk_stop(f);
}

/* The write-behind's SET replies dripped: kvx_store_close returns within
 * its documented 2 s (+ one command timeout, 1 s) and a margin. */
static void test_drip_set_close(void **state)
{
    (void)state;
    fk *f = fk_start(M_DRIP_SET);
    kvx_store *s = tier_store("dripset", f->port);
    for (int r = 0; r < 3; r++) assert_int_equal(su_put_seq(s, 300 + (uint64_t)r, 8), 0);
    for (int w = 0; w < 300 && !atomic_load(&f->sets); w++) sleep_ms(10); /* a batch is being answered */
    assert_true(atomic_load(&f->sets) > 0);
    double t0 = now_s();
    kvx_store_close(s);
    assert_true(now_s() - t0 < 2.0 + 1.0 + 3.0);
    fk_stop(f);
}

/* A connection the server closed while idle (Redis's `timeout`, a proxy's
 * idle limit): the next call reconnects and is answered. It wrote to the
 * closed connection, read its end, counted a failure and opened the
 * node's breaker: the call was a miss, and so was every call for the
 * breaker's 250 ms. */
static void test_idle_close_not_a_miss(void **state)
{
    (void)state;
    fk *f = fk_start(M_IDLE_CLOSE);
    kvx_tier *t = tier_to(f->port, NULL);
    uint8_t st[4];
    for (int r = 0; r < 3; r++) {
        char tag[16];
        snprintf(tag, sizeof tag, "i%d", r);
        assert_int_equal(get_n(t, 4, tag, st, NULL), 4);
        sleep_ms(300); /* the server closes it */
    }
    assert_int_equal(atomic_load(&f->conns), 3);
    kvx_tier_close(t);
    fk_stop(f);
}

/* A server that reads 16 KiB every 300 ms, the write-behind sending 32
 * pages of 256 KiB: kvx_store_close within 2 s + 1 s and a margin. (Held
 * before the deadline cut too: TCP's window opens too little for a
 * write to go on under its 1 s timeout.) */
static void test_slow_reader_close(void **state)
{
    (void)state;
    fk *f = fk_start(M_SLOW_READ);
    char dir[512], url[64];
    snprintf(dir, sizeof dir, "%s/slowread", su_root);
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", f->port);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = (kvx_geometry){4, 8, 128, 16, KVX_QUANT_FP16, 7};
    o.capacity_bytes = 1ull << 30;
    o.tier_url = url;
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    size_t pb = (size_t)kvx_page_bytes(&o.geometry, 16), nb = 32;
    uint8_t *pages = calloc(nb, pb);
    uint32_t *t = malloc(nb * 16 * 4);
    for (size_t i = 0; i < nb * 16; i++) t[i] = (uint32_t)(i * 31 + 7);
    assert_int_equal(kvx_store_put(s, t, nb * 16, pages, nb, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    sleep_ms(500); /* the batch is being written */
    double t0 = now_s();
    kvx_store_close(s);
    double secs = now_s() - t0;
    fk_stop(f);
    free(pages), free(t);
    if (secs >= 2.0 + 1.0 + 3.0) fail_msg("kvx_store_close took %.1f s", secs);
}

/* A server that accepts and never answers, several write-behind batches
 * queued (3 x 64 blocks): close within 2 s + 1 s and a margin. */
static void test_silent_close(void **state)
{
    (void)state;
    fk *f = fk_start(M_SILENT);
    kvx_store *s = tier_store("silent", f->port);
    for (int r = 0; r < 3; r++) assert_int_equal(su_put_seq(s, 400 + (uint64_t)r, 64), 0);
    double t0 = now_s();
    kvx_store_close(s);
    assert_true(now_s() - t0 < 2.0 + 1.0 + 3.0);
    fk_stop(f);
}

/* 16 nodes that accept and never answer, one lookup over all of them:
 * the whole call stays within its 5 s (it took 16 x 1 s). */
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

/* A writer looked up 16 blocks the tier held garbage for (noted as bad),
 * then put them: its write-behind's SET NX finds the keys taken and runs
 * one compare-and-set per key, each answered in 0.8 s: kvx_store_close
 * waited for all of them (13 s); the batch's budget now bounds them, so
 * close stays within its 2 s + 1 s (3 s of margin). */
static void test_cas_close_bounded(void **state)
{
    (void)state;
    fk *f = fk_start(M_CAS_SLOW);
    kvx_store *s = tier_store("cas", f->port);
    for (uint64_t q = 0; q < 16; q++) assert_int_equal(su_served_prefix(s, 500 + q, 1), 0);
    for (uint64_t q = 0; q < 16; q++) assert_int_equal(su_put_seq(s, 500 + q, 1), 0);
    for (int w = 0; w < 300 && !atomic_load(&f->evals); w++) sleep_ms(10);
    double t0 = now_s();
    kvx_store_close(s);
    double secs = now_s() - t0;
    fk_stop(f);
    if (secs >= 2.0 + 1.0 + 3.0) fail_msg("kvx_store_close took %.1f s (CAS one by one)", secs);
}

/* ------------------------------------------------------------------ values */

static uint8_t *craft(size_t *len, const kvx_geometry *g, uint64_t ns, uint32_t bfield, const uint32_t *tokens,
                      size_t ntok, const void *env, size_t envlen)
{
    size_t n = 28 + ntok * 4 + envlen + 4;
    uint8_t *v = malloc(n);
    uint16_t ver = 1, zero = 0;
    memcpy(v, "KVXT", 4);
    memcpy(v + 4, &ver, 2);
    memcpy(v + 6, &zero, 2);
    memcpy(v + 8, &ns, 8);
    memcpy(v + 16, &g->model_signature, 8);
    memcpy(v + 24, &bfield, 4);
    memcpy(v + 28, tokens, ntok * 4);
    memcpy(v + 28 + ntok * 4, env, envlen);
    uint32_t crc = kvx_crc32c(0, v, n - 4);
    memcpy(v + n - 4, &crc, 4);
    *len = n;
    return v;
}

static uint8_t *envelope_of(size_t *len, uint16_t ver, const kvx_geometry *g, uint64_t hash, uint32_t ntok,
                            uint32_t nblocks)
{
    size_t pay = kvx_envelope_payload_bytes(ver, g), sz;
    assert_int_equal(kvx_envelope_size(&sz, ver, g, nblocks), 0);
    uint8_t *p = calloc(1, pay);
    for (size_t i = 0; i < pay; i++) p[i] = (uint8_t)(i * 7) & 0x3b;
    float sc[4096];
    for (size_t i = 0; i < 4096; i++) sc[i] = 1.0f;
    kvx_envelope_block_in bi[2] = {{hash, ntok, p, sc}, {hash, ntok, p, sc}};
    uint8_t *e = malloc(sz);
    int rc = kvx_envelope_export(e, sz, ver, g, bi, nblocks);
    free(p);
    if (rc) {
        free(e);
        return NULL;
    }
    *len = sz;
    return e;
}

/* Correct CRC-32C, crafted fields: each refused, no read outside the
 * value (ASan build: the value is malloc'd to its exact length). */
static void test_values_crafted(void **state)
{
    (void)state;
    kvx_geometry g = su_geometry();
    uint64_t ns = kvx_tier_ns(&g, NULL);
    uint32_t t[2 * SU_B];
    uint64_t h[2];
    su_tokens(t, 9, 2, 0);
    kvx_block_hashes(h, t, 2 * SU_B, SU_B);
    kvx_tier_expect x = {ns, &g, h[1], h[0], t + SU_B};
    uint8_t *page = malloc(64);
    size_t elen, vlen;
    /* the honest one verifies */
    uint8_t *env = envelope_of(&elen, KVX_ENVELOPE_V1, &g, h[1], SU_B, 1);
    assert_non_null(env);
    uint8_t *v = craft(&vlen, &g, ns, SU_B, t + SU_B, SU_B, env, elen);
    assert_int_equal(kvx_tier_value_check(v, vlen, &x, page, NULL), 0);
    /* truncated anywhere, CRC recomputed */
    for (size_t n = 0; n < vlen - 4; n++) {
        uint8_t *c = malloc(n + 4);
        memcpy(c, v, n);
        uint32_t crc = kvx_crc32c(0, c, n);
        memcpy(c + n, &crc, 4);
        assert_int_not_equal(kvx_tier_value_check(c, n + 4, &x, page, NULL), 0);
        free(c);
    }
    /* junk between the envelope and the CRC */
    {
        uint8_t *c = malloc(vlen + 8);
        memcpy(c, v, vlen - 4);
        memset(c + vlen - 4, 0xAB, 8);
        uint32_t crc = kvx_crc32c(0, c, vlen + 4);
        memcpy(c + vlen + 4, &crc, 4);
        assert_int_not_equal(kvx_tier_value_check(c, vlen + 8, &x, page, NULL), 0);
        free(c);
    }
    free(v);
    /* B of 2^32-1 (and of B+1, B-1) in the header */
    uint32_t bs[] = {0xFFFFFFFFu, SU_B + 1, SU_B - 1, 0};
    for (size_t k = 0; k < 4; k++) {
        v = craft(&vlen, &g, ns, bs[k], t + SU_B, SU_B, env, elen);
        assert_int_equal(kvx_tier_value_check(v, vlen, &x, page, NULL), KVX_ESHAPE);
        free(v);
    }
    /* fewer token ids than B, the envelope right after */
    v = craft(&vlen, &g, ns, SU_B, t + SU_B, SU_B - 1, env, elen);
    assert_int_not_equal(kvx_tier_value_check(v, vlen, &x, page, NULL), 0);
    free(v);
    free(env);
    /* a partial block (n_tokens B-1) */
    env = envelope_of(&elen, KVX_ENVELOPE_V1, &g, 0, SU_B - 1, 1);
    assert_non_null(env);
    v = craft(&vlen, &g, ns, SU_B, t + SU_B, SU_B, env, elen);
    assert_int_not_equal(kvx_tier_value_check(v, vlen, &x, page, NULL), 0);
    free(v), free(env);
    /* two blocks */
    env = envelope_of(&elen, KVX_ENVELOPE_V1, &g, h[1], SU_B, 2);
    if (env) {
        v = craft(&vlen, &g, ns, SU_B, t + SU_B, SU_B, env, elen);
        assert_int_not_equal(kvx_tier_value_check(v, vlen, &x, page, NULL), 0);
        free(v), free(env);
    }
    /* the envelope of another geometry (each dimension doubled, B too),
     * of another version (v2, v3) */
    kvx_geometry gs[5];
    for (int k = 0; k < 4; k++) gs[k] = g;
    gs[0].num_layers = 2, gs[1].kv_heads = 2, gs[2].head_dim = 8, gs[3].block_tokens = 2 * SU_B;
    for (int k = 0; k < 4; k++) {
        env = envelope_of(&elen, KVX_ENVELOPE_V1, &gs[k], k == 3 ? 0 : h[1], k == 3 ? SU_B : SU_B, 1);
        if (!env) continue;
        v = craft(&vlen, &g, ns, SU_B, t + SU_B, SU_B, env, elen);
        assert_int_not_equal(kvx_tier_value_check(v, vlen, &x, page, NULL), 0);
        free(v), free(env);
    }
    uint16_t vers[] = {KVX_ENVELOPE_V2, KVX_ENVELOPE_V3};
    for (int k = 0; k < 2; k++) {
        env = envelope_of(&elen, vers[k], &g, h[1], SU_B, 1);
        if (!env) continue;
        v = craft(&vlen, &g, ns, SU_B, t + SU_B, SU_B, env, elen);
        assert_int_not_equal(kvx_tier_value_check(v, vlen, &x, page, NULL), 0);
        free(v), free(env);
    }
    free(page);
    /* an E4M3 store's value (v2): a scale NaN, inf, 0 or negative, the
     * value's CRC right (the envelope's own CRC is not read: the value's
     * covers it) */
    kvx_geometry g8 = g;
    g8.quant = KVX_QUANT_E4M3;
    uint64_t ns8 = kvx_tier_ns(&g8, NULL);
    uint8_t pg[64] = {0};
    for (size_t i = 0; i < sizeof pg; i++) pg[i] = (uint8_t)(i * 3 + 1) & 0x3F;
    float sc[2] = {0.5f, 2.0f}, sc_out[2];
    uint8_t *v8;
    size_t v8len;
    assert_int_equal(kvx_tier_value_encode(&v8, &v8len, ns8, &g8, h[1], t + SU_B, pg, sc), 0);
    kvx_tier_expect x8 = {ns8, &g8, h[1], h[0], t + SU_B};
    uint8_t back[64];
    assert_int_equal(kvx_tier_value_check(v8, v8len, &x8, back, sc_out), 0);
    size_t nsc = 2; /* L * 2 * Hkv */
    size_t at = v8len - 8 - nsc * 4;
    float c0;
    memcpy(&c0, v8 + at, 4);
    assert_true(c0 == sc[0]); /* found the scales */
    float badsc[] = {NAN, INFINITY, 0.0f, -1.0f, -0.0f, 1e-45f * 0.0f};
    for (size_t k = 0; k < sizeof badsc / sizeof badsc[0]; k++) {
        uint8_t *c = malloc(v8len);
        memcpy(c, v8, v8len);
        memcpy(c + at, &badsc[k], 4);
        uint32_t crc = kvx_crc32c(0, c, v8len - 4);
        memcpy(c + v8len - 4, &crc, 4);
        if (!kvx_tier_value_check(c, v8len, &x8, back, sc_out)) fail_msg("scale %g was served", (double)badsc[k]);
        free(c);
    }
    free(v8);
}

/* ------------------------------------------------------------------ secrets */

static void test_url_error_hides_password(void **state)
{
    (void)state;
    kvx_tier_url u;
    const char *urls[] = {"rediss://alice:topsecret@h:1", "http://alice:topsecret@h:1", "topsecret@h:1",
                          "redis://alice:topsecret@h:0", "redis://alice:topsecret@h:1/2",
                          "redis://alice:topsecret@"};
    for (size_t k = 0; k < sizeof urls / sizeof urls[0]; k++) {
        assert_int_equal(kvx_tier_url_parse(&u, urls[k]), KVX_EINVALID);
        if (strstr(kvx_last_error(), "topsecret")) fail_msg("%s: \"%s\"", urls[k], kvx_last_error());
    }
    /* and through the store's options */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/secret", su_root);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 64ull << 20;
    o.tier_url = urls[0];
    kvx_store *s = NULL;
    assert_int_not_equal(kvx_store_create(&s, dir, &o), 0);
    assert_null(strstr(kvx_last_error(), "topsecret"));
}

/* A password holding '@' (Redis ACL passwords may): the user, password
 * and host as meant, and the redacted URL shows none of the password. */
static void test_url_password_with_at(void **state)
{
    (void)state;
    kvx_tier_url u;
    assert_int_equal(kvx_tier_url_parse(&u, "redis://alice:p@ss@w0rd@h1:7000,h2:7001"), 0);
    assert_string_equal(u.user, "alice");
    assert_string_equal(u.pass, "p@ss@w0rd");
    assert_int_equal(u.n, 2);
    assert_string_equal(u.host[0], "h1");
    assert_int_equal(u.port[1], 7001);
    char red[256];
    kvx_tier_url_redact(red, sizeof red, "redis://alice:p@ss@w0rd@h1:7000,h2:7001");
    assert_string_equal(red, "redis://alice:***@h1:7000,h2:7001");
    kvx_tier_url_redact(red, sizeof red, "redis://s3@cret@h:1");
    assert_string_equal(red, "redis://***@h:1");
    assert_int_equal(kvx_tier_url_parse(&u, "redis://s3@cret@h:1"), 0);
    assert_string_equal(u.pass, "s3@cret");
    assert_string_equal(u.user, "");
}

/* Runs the shell command cmd (exit 0), its output in out: the password
 * "topsecret" never in it, the URL shown redacted as `shown`. */
static void cli_shows_redacted(const char *cmd, char *out, size_t cap, const char *shown)
{
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    assert_int_equal(pclose(p), 0);
    if (strstr(out, "topsecret")) fail_msg("printed: %s", out);
    assert_non_null(strstr(out, shown));
}

/* `kvx store create --tier redis://user:pass@...` printed the URL as given,
 * password and all (cli/cmd_store.c); `store tier show` redacts it. And
 * create never contacts the tier (docs/TIER.md): it asked for the
 * capacity through kvx_store_stat, which pings a tier not asked yet (up to
 * a whole call). A fake server counts connections: none. */
static void test_cli_create_hides_password(void **state)
{
    (void)state;
    fk *f = fk_start(M_ECHO);
    char cmd[2048], out[4096];
    snprintf(cmd, sizeof cmd,
             "%s store create %s/clipw --layers 1 --kv-heads 1 --head-dim 4 --block-tokens 4 --quant fp16 "
             "--model-signature 1122334455667788 --capacity 64MiB --tier redis://alice:topsecret@127.0.0.1:%d 2>&1",
             KVX_CLI, su_root, f->port);
    cli_shows_redacted(cmd, out, sizeof out, "shared tier redis://alice:***@127.0.0.1:");
    assert_non_null(strstr(out, "capacity 64.0 MiB"));
    sleep_ms(100);
    assert_int_equal(atomic_load(&f->conns), 0);
    fk_stop(f);
}

/* `kvx store tier DIR set URL` printed the URL as given, its password in
 * clear (create was fixed, not set); it prints the redacted URL now. */
static void test_cli_tier_set_hides_password(void **state)
{
    (void)state;
    char cmd[2048], out[4096];
    snprintf(cmd, sizeof cmd,
             "%s store create %s/clipw2 --layers 1 --kv-heads 1 --head-dim 4 --block-tokens 4 --quant fp16 "
             "--model-signature 1122334455667788 --capacity 64MiB >/dev/null 2>&1 && "
             "%s store tier %s/clipw2 set redis://alice:topsecret@127.0.0.1:1 2>&1",
             KVX_CLI, su_root, KVX_CLI, su_root);
    cli_shows_redacted(cmd, out, sizeof out, "redis://alice:***@127.0.0.1:1");
}

/* --------------------------------------------------- many nodes; breakers */

/* 8192 distinct nodes in one map (every two slots their own host on
 * loopback, a closed port): loaded, asked, refused fast. (The node table
 * holds 16384 with the seeds: a map naming more is refused whole.) Then the process-wide
 * breaker table (256) is full: a stalled node met afterwards must still
 * get a breaker (its second lookup skips it: no second connection). */
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

/* Names and addresses: a numeric address is taken as it is, localhost
 * (from /etc/hosts) resolves to its IPv4 address, a tier named by
 * localhost serves, a name too long or not resolving is refused with a
 * reason. */
static void test_resolve_names(void **state)
{
    (void)state;
    char addr[64], why[160];
    assert_int_equal(kvx_tier_resolve("127.0.0.1", 100, addr, sizeof addr, why, sizeof why), 0);
    assert_string_equal(addr, "127.0.0.1");
    assert_int_equal(kvx_tier_resolve("::1", 100, addr, sizeof addr, why, sizeof why), 0);
    assert_string_equal(addr, "::1");
    char longname[300];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    why[0] = 0;
    assert_int_equal(kvx_tier_resolve(longname, 100, addr, sizeof addr, why, sizeof why), -1);
    assert_non_null(strstr(why, "too long"));
    why[0] = 0;
    assert_int_equal(kvx_tier_resolve("no-such-host.invalid", 300, addr, sizeof addr, why, sizeof why), -1);
    assert_true(why[0] != 0);
    /* localhost from /etc/hosts (Debian's names it 127.0.0.1 and ::1, and
     * glibc sorts ::1 first): IPv4 first, as hiredis tries, so a server
     * listening on 127.0.0.1 only (the fake here) is reached */
    assert_int_equal(kvx_tier_resolve("localhost", 2000, addr, sizeof addr, why, sizeof why), 0);
    assert_string_equal(addr, "127.0.0.1");
    fk *f = fk_start(M_ECHO);
    char url[64];
    snprintf(url, sizeof url, "redis://localhost:%d", f->port);
    kvx_tier *t = NULL;
    assert_int_equal(kvx_tier_open(&t, url, NULL), 0);
    uint8_t st[4];
    assert_int_equal(get_n(t, 4, "lh", st, NULL), 4);
    kvx_tier_close(t);
    fk_stop(f);
}

/* The child of test_slow_resolver, in its own mount namespace: no cmocka
 * here (a failed assert would unwind into the test runner's copy). 0
 * passed, 77 cannot run here, other codes failed. */
static int slow_resolver_child(const char *conf)
{
    /* a network namespace of its own too, so the fake name server below
     * takes 127.0.0.1:53 of this child's loopback, not the host's */
    if (unshare(CLONE_NEWNS | CLONE_NEWNET) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
        mount(conf, "/etc/resolv.conf", NULL, MS_BIND, NULL)) {
        fprintf(stderr, "test_slow_resolver: no mount and network namespace here (%s): skipped\n", strerror(errno));
        return 77;
    }
    int ls = socket(AF_INET, SOCK_DGRAM, 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    if (ls < 0 || ioctl(ls, SIOCGIFFLAGS, &ifr)) return 7;
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(ls, SIOCSIFFLAGS, &ifr)) return 7;
    close(ls);
    /* the name server: takes the queries, never answers */
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(53)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (u < 0 || bind(u, (struct sockaddr *)&a, sizeof a)) {
        fprintf(stderr, "test_slow_resolver: 127.0.0.1:53 is taken (%s): skipped\n", strerror(errno));
        return 77;
    }
    kvx_tier *t = NULL;
    if (kvx_tier_open(&t, "redis://kvx-tier-node.example.com:6379", NULL)) return 2;
    const char *keys[4] = {"a", "b", "c", "d"};
    uint8_t *vals[4] = {0};
    size_t lens[4];
    uint8_t st[4];
    for (int round = 0; round < 3; round++) {
        double t0 = now_s();
        kvx_tier_get(t, keys, 4, vals, lens, st, NULL);
        double secs = now_s() - t0;
        for (int i = 0; i < 4; i++)
            if (st[i] == KVX_TIER_OK || vals[i]) return 3;
        if (secs > 1.5) { /* connect timeout 250 ms: well under 1.5 s */
            fprintf(stderr, "test_slow_resolver: lookup %d took %.2f s\n", round, secs);
            return 4;
        }
        usleep(300 * 1000); /* past the breaker's first 250 ms: the next call resolves again */
    }
    /* the lookups did reach the name server (and were cut, not skipped) */
    char q[512];
    if (recv(u, q, sizeof q, MSG_DONTWAIT) <= 0) {
        fprintf(stderr, "test_slow_resolver: the name server was never asked\n");
        return 8;
    }
    /* many lookups while the resolver hangs: each cut at its timeout, and
     * past 64 still running, refused at once (no more threads piled on) */
    double t0 = now_s();
    char why[160] = "";
    for (int i = 0; i < 100; i++) {
        char addr[64];
        if (kvx_tier_resolve("kvx-tier-node.example.com", 5, addr, sizeof addr, why, sizeof why) != -1) return 5;
    }
    if (now_s() - t0 > 3.0) {
        fprintf(stderr, "test_slow_resolver: 100 lookups of 5 ms took %.2f s\n", now_s() - t0);
        return 6;
    }
    if (!strstr(why, "have not finished")) {
        fprintf(stderr, "test_slow_resolver: the 100th lookup: %s\n", why);
        return 9;
    }
    kvx_tier_close(t);
    return 0;
}

/* A child forked right after a lookup resolves names too (glibc's
 * getaddrinfo_a, used at first, kept its idle-thread count across fork
 * and never ran a child's lookup). */
static void test_resolve_after_fork(void **state)
{
    (void)state;
    char addr[64], why[160];
    assert_int_equal(kvx_tier_resolve("localhost", 2000, addr, sizeof addr, why, sizeof why), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(kvx_tier_resolve("localhost", 2000, addr, sizeof addr, why, sizeof why) == 0 ? 0 : 1);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* A node whose name's server never answers: every lookup is a miss within
 * the documented bounds, not after the resolver's 10 s. */
static void test_slow_resolver(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvx-resolv-XXXXXX", conf[64];
    assert_non_null(mkdtemp(dir));
    snprintf(conf, sizeof conf, "%s/resolv.conf", dir);
    FILE *fp = fopen(conf, "w");
    assert_non_null(fp);
    fputs("nameserver 127.0.0.1\n", fp); /* glibc's defaults: 5 s a try, 2 tries */
    fclose(fp);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(slow_resolver_child(conf));
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    unlink(conf);
    rmdir(dir);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) skip();
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* docs/TIER.md: a node that fails is skipped by a process-wide breaker
 * that probes it back after 250 ms, doubling to 5 s, one caller probing
 * per window. A fake closes every connection as it accepts it, so each
 * probe fails. The breaker closed on a successful connect (before any
 * reply), so such a node, or a stalled one (the kernel completes its
 * connects), was probed by every caller every 250 ms: 32 connections in
 * 8.3 s, 0 ms apart. Now, with one thread's first failure known and 3 more
 * threads looking up back to back for 8.3 s, connections come 250, 500,
 * 1000, 2000 and 4000 ms apart (each gap at least its window, at most
 * 600 ms late): 6 in all. And 4 threads failing at once at first open the
 * breaker once: the next connection comes 250 ms later, not seconds. */
typedef struct probe_ctx {
    kvx_tier *t;
    atomic_int stop;
} probe_ctx;

static void *probe_loop(void *arg)
{
    probe_ctx *p = arg;
    const char *keys[1] = {"k"};
    uint8_t *vals[1];
    size_t lens[1];
    uint8_t st[1];
    while (!atomic_load(&p->stop)) {
        vals[0] = NULL;
        kvx_tier_get(p->t, keys, 1, vals, lens, st, NULL);
        free(vals[0]);
        sleep_ms(1);
    }
    return NULL;
}

/* Runs 4 lookup threads (a client each) on f for ms; the first alone until
 * f has seen its first connection and 100 ms more when staggered. */
static void probe_run(fk *f, int staggered, int ms)
{
    probe_ctx p[4];
    pthread_t th[4];
    /* the breaker table is process-wide and keyed by (host, port): an
     * earlier test's node on a port the kernel gave out again left its
     * backoff there, so the first window here was 500 ms (CI once saw
     * gaps 500 1000 2000 4000). A success resets it. */
    kvx_tier_brk_result("127.0.0.1", f->port, 1, NULL);
    for (int i = 0; i < 4; i++) {
        p[i].t = tier_to(f->port, NULL);
        atomic_init(&p[i].stop, 0);
        assert_int_equal(pthread_create(&th[i], NULL, probe_loop, &p[i]), 0);
        if (staggered && i == 0) {
            for (int w = 0; w < 500 && !atomic_load(&f->naccept); w++) sleep_ms(10);
            sleep_ms(100);
        }
    }
    sleep_ms(ms);
    for (int i = 0; i < 4; i++) atomic_store(&p[i].stop, 1);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        kvx_tier_close(p[i].t);
    }
}

static void test_breaker_probe_windows(void **state)
{
    (void)state;
    fk *f = fk_start(M_SHUT);
    probe_run(f, 1, 8200);
    int n = atomic_load(&f->naccept);
    char seen[512] = "";
    for (int i = 1; i < n && i < 16; i++) {
        size_t at = strlen(seen);
        snprintf(seen + at, sizeof seen - at, " %llu", (unsigned long long)(f->accept_ms[i] - f->accept_ms[i - 1]));
    }
    print_message("breaker: %d connections, gaps (ms):%s\n", n, seen);
    assert_int_equal(n, 6);
    for (int i = 1; i < n; i++) {
        uint64_t gap = f->accept_ms[i] - f->accept_ms[i - 1], want = 250ull << (i - 1);
        if (gap + 10 < want || gap > want + 600)
            fail_msg("gap %d: %llu ms, want %llu (+600)", i, (unsigned long long)gap, (unsigned long long)want);
    }
    fk_stop(f);

    /* 4 callers at once at first: however many connect before the first
     * failure, the next probe comes one 250 ms window after the last */
    f = fk_start(M_SHUT);
    probe_run(f, 0, 700);
    n = atomic_load(&f->naccept);
    assert_true(n >= 2);
    int k = 1;
    while (k < n && f->accept_ms[k] - f->accept_ms[k - 1] < 100) k++; /* the first burst */
    assert_true(k < n);
    uint64_t gap = f->accept_ms[k] - f->accept_ms[k - 1];
    print_message("breaker, 4 callers at once: %d at first, then a probe %llu ms later\n", k,
                  (unsigned long long)gap);
    if (gap + 10 < 250 || gap > 250 + 600) fail_msg("the first probe after a burst of %d came %llu ms later, want 250", k,
                                                    (unsigned long long)gap);
    fk_stop(f);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_crafted),
        cmocka_unit_test(test_url_error_hides_password),
        cmocka_unit_test(test_url_password_with_at),
        cmocka_unit_test(test_slots_map_refused),
        cmocka_unit_test(test_redirects_hostile),
        cmocka_unit_test(test_moved_without_cluster_slots),
        cmocka_unit_test(test_get_reply_types),
        cmocka_unit_test(test_fewer_replies),
        cmocka_unit_test(test_close_mid_pipeline),
        cmocka_unit_test(test_never_answers),
        cmocka_unit_test(test_extra_reply_same_read),
        cmocka_unit_test(test_extra_reply_late),
        cmocka_unit_test(test_desync_never_wrong),
        cmocka_unit_test(test_drip_get_lookup),
        cmocka_unit_test(test_flood_reply),
        cmocka_unit_test(test_reply_memory_bounded),
        cmocka_unit_test(test_drip_cluster_slots),
        cmocka_unit_test(test_drip_auth),
        cmocka_unit_test(test_drip_set_close),
        cmocka_unit_test(test_silent_close),
        cmocka_unit_test(test_slow_reader_close),
        cmocka_unit_test(test_idle_close_not_a_miss),
        cmocka_unit_test(test_stalled_nodes_whole_call),
        cmocka_unit_test(test_cli_create_hides_password),
        cmocka_unit_test(test_cli_tier_set_hides_password),
        cmocka_unit_test(test_breaker_probe_windows),
        cmocka_unit_test(test_cas_close_bounded),
        /* last: it fills the process-wide breaker table */
        cmocka_unit_test(test_many_nodes_and_breaker_table_full),
        cmocka_unit_test(test_resolve_names),
        cmocka_unit_test(test_resolve_after_fork),
        cmocka_unit_test(test_slow_resolver),
    };
    return cmocka_run_group_tests_name("attack10", tests, su_setup, su_teardown);
}
