/*
 * breaker.c - tier/breaker.c: a node that keeps failing is probed in
 * windows that double (250 ms up to 4 s), by one caller, not by every
 * thread at once.
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

/* PROMISE: TIER-9 */
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
        cmocka_unit_test(test_breaker_probe_windows),
    };
    return cmocka_run_group_tests_name("tier/breaker", tests, su_setup, su_teardown);
}
