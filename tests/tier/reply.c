/*
 * reply.c - tier/reply.c and the client's reads against hostile or broken
 * RESP servers (tests/lib/fake_redis.h): replies of every type, fewer or
 * more replies than commands, late replies, closed and silent servers,
 * drips under the command timeout, floods and replies that declare
 * gigabytes: each a miss at worst, bounded in time and memory, never a
 * wrong value.
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

/* hiredis's calloc of a 2^62-element array must fail as glibc's does (NULL),
 * not stop an ASan build */
const char *__asan_default_options(void);

const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* GET replies of every type (integer, array, nested, status, error, nil, nil
 * array, empty bulk, RESP3 types, a bulk of 2^62 bytes, an array of 2^62
 * elements), fewer replies than commands, a server that closes mid-pipeline,
 * one that accepts and never answers (test_get_reply_types,
 * test_fewer_replies, test_close_mid_pipeline, test_never_answers). */
/* PROMISE: TIER-16 */
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
/* PROMISE: TIER-16 */
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
/* PROMISE: TIER-16 */
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
/* PROMISE: TIER-9 */
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
/* PROMISE: TIER-16 */
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
/* PROMISE: TIER-16 */
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

/* A server streaming one endless reply as fast as the client reads: a
 * bulk declaring 2^40 bytes, or an array declaring 10^9 integers. hiredis
 * keeps every byte of an incomplete reply (and an object per array
 * element) until it is whole, so for the whole 5 s call a loopback server
 * could push gigabytes into the process. A reply is now cut at
 * max_reply_bytes (64 MiB by default; a store's own clients: 16 MiB here,
 * one value or a slot map): the client drops the connection and the key
 * is a miss. The fake counts what it managed to send (socket buffers add a
 * few MiB); without the cut it sends all it may (768 MiB, an array 96 MiB). */
/* PROMISE: TIER-13 */
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
/* PROMISE: TIER-13 */
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

/* test_drip_get_lookup, test_drip_cluster_slots, test_drip_auth,
 * test_drip_set_close: hiredis's redisGetReply waits for a whole reply with
 * only a per-read timeout (1 s): a server sending one byte every 300 ms held
 * a lookup, a refresh, an AUTH or the write-behind (and so kvx_store_close,
 * which joins it) for as long as it kept dripping (a 1000-byte value: 300 s).
 * Every read and write is now cut at the call's deadline. */
/* PROMISE: TIER-15 */
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

/* test_drip_get_lookup, test_drip_cluster_slots, test_drip_auth,
 * test_drip_set_close: hiredis's redisGetReply waits for a whole reply with
 * only a per-read timeout (1 s): a server sending one byte every 300 ms held
 * a lookup, a refresh, an AUTH or the write-behind (and so kvx_store_close,
 * which joins it) for as long as it kept dripping (a 1000-byte value: 300 s).
 * Every read and write is now cut at the call's deadline. */
/* PROMISE: TIER-15 */
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

/* A connection the server closed while idle (Redis's `timeout`, a proxy's
 * idle limit): the next call reconnects and is answered. It wrote to the
 * closed connection, read its end, counted a failure and opened the
 * node's breaker: the call was a miss, and so was every call for the
 * breaker's 250 ms. */
/* PROMISE: TIER-16 */
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

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_reply_types),
        cmocka_unit_test(test_fewer_replies),
        cmocka_unit_test(test_close_mid_pipeline),
        cmocka_unit_test(test_never_answers),
        cmocka_unit_test(test_extra_reply_same_read),
        cmocka_unit_test(test_extra_reply_late),
        cmocka_unit_test(test_drip_get_lookup),
        cmocka_unit_test(test_flood_reply),
        cmocka_unit_test(test_reply_memory_bounded),
        cmocka_unit_test(test_drip_auth),
        cmocka_unit_test(test_idle_close_not_a_miss),
    };
    return cmocka_run_group_tests_name("tier/reply", tests, su_setup, su_teardown);
}
