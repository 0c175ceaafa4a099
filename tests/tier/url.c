/*
 * url.c - tier/url.c: tier URLs and the TIER text (docs/TIER.md
 * "Configuration"); a password never shown, in errors or redacted URLs,
 * whatever it holds.
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

/* TIER.md "Configuration": URLs and the TIER text. */
/* PROMISE: TIER-21 */
static void test_urls_and_conf(void **state)
{
    (void)state;
    kvx_tier_url u;
    assert_int_equal(kvx_tier_url_parse(&u, "redis://127.0.0.1:7000,10.0.0.2:7001,h"), 0);
    assert_int_equal(u.n, 3);
    assert_int_equal(u.port[1], 7001);
    assert_int_equal(u.port[2], 6379);
    assert_int_equal(kvx_tier_url_parse(&u, "redis://alice:s3cret@h:1"), 0);
    assert_string_equal(u.user, "alice");
    assert_string_equal(u.pass, "s3cret");
    assert_int_equal(kvx_tier_url_parse(&u, "redis://onlypass@h:1"), 0);
    assert_string_equal(u.user, "");
    assert_string_equal(u.pass, "onlypass");
    assert_int_equal(kvx_tier_url_parse(&u, "rediss://h:1"), KVX_EINVALID);
    assert_int_equal(kvx_tier_url_parse(&u, "redis://h:0"), KVX_EINVALID);
    assert_int_equal(kvx_tier_url_parse(&u, "redis://h:99999"), KVX_EINVALID);
    assert_int_equal(kvx_tier_url_parse(&u, "redis://"), KVX_EINVALID);
    assert_int_equal(kvx_tier_url_parse(&u, "redis://h:1/3"), KVX_EINVALID);
    /* digits only (strtol took " +7"), no control bytes in a host (a
     * CRLF TIER file left "h\r"); found by fuzz/tier_conf_fuzzer.c */
    assert_int_equal(kvx_tier_url_parse(&u, "redis://h: +7"), KVX_EINVALID);
    assert_int_equal(kvx_tier_url_parse(&u, "redis://h:+7"), KVX_EINVALID);
    assert_int_equal(kvx_tier_url_parse(&u, "redis://h:-1"), KVX_EINVALID);
    assert_int_equal(kvx_tier_url_parse(&u, "redis://h\r"), KVX_EINVALID);
    assert_int_equal(kvx_tier_url_parse(&u, "redis://h:7\r"), KVX_EINVALID);
    assert_int_equal(kvx_tier_url_parse(&u, "redis://h:65535"), 0);
    char red[256];
    kvx_tier_url_redact(red, sizeof red, "redis://alice:s3cret@h:1");
    assert_string_equal(red, "redis://alice:***@h:1");
    kvx_tier_conf c, back;
    memset(&c, 0, sizeof c);
    snprintf(c.url, sizeof c.url, "redis://h:1,h:2");
    snprintf(c.tenant, sizeof c.tenant, "team-a");
    c.ttl_ms = 3600000;
    char text[2048];
    assert_true(kvx_tier_conf_format(text, sizeof text, &c) > 0);
    assert_int_equal(kvx_tier_conf_parse(&back, text), 0);
    assert_string_equal(back.url, c.url);
    assert_string_equal(back.tenant, c.tenant);
    assert_int_equal(back.ttl_ms, c.ttl_ms);
    assert_int_equal(kvx_tier_conf_parse(&back, "kvx-tier 2\nurl redis://h\n"), KVX_EFORMAT);
    assert_int_equal(kvx_tier_conf_parse(&back, "kvx-tier 1\ntenant a b\n"), KVX_EFORMAT);
    /* ttl_ms: digits only, no wrap (strtoull read "-1" as 2^64-1) */
    assert_int_equal(kvx_tier_conf_parse(&back, "kvx-tier 1\nurl redis://h\nttl_ms -1\n"), KVX_EFORMAT);
    assert_int_equal(kvx_tier_conf_parse(&back, "kvx-tier 1\nurl redis://h\nttl_ms  5\n"), KVX_EFORMAT);
    assert_int_equal(kvx_tier_conf_parse(&back, "kvx-tier 1\nurl redis://h\nttl_ms 18446744073709551616\n"),
                     KVX_EFORMAT);
    assert_int_equal(kvx_tier_conf_parse(&back, "kvx-tier 1\nurl redis://h\r\nttl_ms 5\n"), KVX_EFORMAT);
    assert_int_equal(kvx_tier_conf_parse(&back, "kvx-tier 1\nurl redis://h\nttl_ms 18446744073709551615\n"), 0);
    assert_true(back.ttl_ms == UINT64_MAX);
    assert_int_equal(kvx_tier_tenant_check("a/b"), KVX_EINVALID);
}

/* hiredis's calloc of a 2^62-element array must fail as glibc's does (NULL),
 * not stop an ASan build */
const char *__asan_default_options(void);

const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* the password in error messages and shown URLs
 * (test_url_error_hides_password, test_url_password_with_at). */
/* PROMISE: TIER-8 */
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
/* PROMISE: TIER-21 */
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

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_urls_and_conf),
        cmocka_unit_test(test_url_error_hides_password),
        cmocka_unit_test(test_url_password_with_at),
    };
    return cmocka_run_group_tests_name("tier/url", tests, su_setup, su_teardown);
}
