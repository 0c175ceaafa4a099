/*
 * os.c - common/os.c, the OS seam: its directory walk, each step failed in
 * turn through the seam (tests/lib/fault.h): the walk says so, the names
 * before it were seen, and the directory is closed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/fault.h"
#include "lib/store.h"

/* Descriptors open in this process. */
static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

static int count_name(void *ctx, const char *name)
{
    (void)name;
    ++*(int *)ctx;
    return 0;
}

static int stop_at_two(void *ctx, const char *name)
{
    (void)name;
    return ++*(int *)ctx == 2 ? KVX_ECANCELED : 0;
}

/* The walk's open (call 1) or any step (calls 2..) fails: the walk says
 * so (-errno, *walk_failed), the names before it were seen, and the
 * directory is closed. A callback's own result is told apart. */
static void test_walk_faults(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/d", su_root);
    assert_int_equal(mkdir(dir, 0700), 0);
    for (int i = 0; i < 5; i++) {
        char p[340];
        snprintf(p, sizeof p, "%s/f%d", dir, i);
        FILE *f = fopen(p, "w");
        assert_non_null(f);
        fclose(f);
    }
    int fds = open_fds(), n = 0, walk_failed = -1;
    fault_install();
    fault_only = FAULT_DIR;
    assert_int_equal(kvx_os_each_name(AT_FDCWD, dir, 0, count_name, &n, &walk_failed), 0);
    assert_int_equal(n, 5);
    assert_int_equal(walk_failed, 0);
    assert_int_equal(fault_calls, 7); /* open, 5 names, the end */
    for (long k = 1; k <= 7; k++) {
        n = 0;
        fault_reset(k, k == 1 ? EMFILE : EIO, FAULT_ERRNO);
        int rc = kvx_os_each_name(AT_FDCWD, dir, 0, count_name, &n, &walk_failed);
        assert_string_equal(fault_hit_op, k == 1 ? "dir_open" : "dir_next");
        assert_int_equal(rc, k == 1 ? -EMFILE : -EIO);
        assert_int_equal(walk_failed, 1);
        assert_int_equal(n, k == 1 ? 0 : (int)k - 2);
        assert_int_equal(open_fds(), fds);
    }
    fault_reset(0, EIO, FAULT_ERRNO);
    n = 0;
    assert_int_equal(kvx_os_each_name(AT_FDCWD, dir, 0, stop_at_two, &n, &walk_failed), KVX_ECANCELED);
    assert_int_equal(walk_failed, 0);
    assert_int_equal(n, 2);
    /* a walk of "." under a directory descriptor leaves its offset alone */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(dfd >= 0);
    for (int round = 0; round < 2; round++) {
        n = 0;
        assert_int_equal(kvx_os_each_name(dfd, ".", O_NOFOLLOW, count_name, &n, NULL), 0);
        assert_int_equal(n, 5);
    }
    close(dfd);
    assert_int_equal(kvx_os_each_name(AT_FDCWD, "/nonexistent-kvx-dir", 0, count_name, &n, &walk_failed), -ENOENT);
    assert_int_equal(walk_failed, 1);
    fault_only = 0;
    fault_uninstall();
    assert_int_equal(open_fds(), fds);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_walk_faults),
    };
    return cmocka_run_group_tests_name("common/os", tests, su_setup, su_teardown);
}
