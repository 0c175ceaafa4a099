/*
 * resolve.c - tier/resolve.c: node names resolved within the connect
 * timeout (numeric, /etc/hosts, refused with a reason), also in a child
 * forked after a lookup and against a name server that never answers.
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

/* Names and addresses: a numeric address is taken as it is, localhost
 * (from /etc/hosts) resolves to its IPv4 address, a tier named by
 * localhost serves, a name too long or not resolving is refused with a
 * reason. */
/* PROMISE: TIER-12 */
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
/* PROMISE: TIER-12 */
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
/* PROMISE: TIER-12 */
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

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resolve_names),
        cmocka_unit_test(test_resolve_after_fork),
        cmocka_unit_test(test_slow_resolver),
    };
    return cmocka_run_group_tests_name("tier/resolve", tests, su_setup, su_teardown);
}
