/*
 * tier.c - cli/cmd_tier.c and cmd_store.c with a tier: `kvx store create
 * --tier` and `kvx store tier set` never print the password (and create
 * never contacts the tier). The tier is a fake (tests/lib/fake_redis.h).
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
/* PROMISE: TIER-8 */
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
/* PROMISE: TIER-8 */
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

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli_create_hides_password),
        cmocka_unit_test(test_cli_tier_set_hides_password),
    };
    return cmocka_run_group_tests_name("cli/tier", tests, su_setup, su_teardown);
}
