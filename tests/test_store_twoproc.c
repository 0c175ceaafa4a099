/*
 * test_store_twoproc.c - a writer process (this test) and a reader process
 * (prog_store_reader): the reader opens the store read-only, then the
 * writer publishes new blocks, and the reader must see them through the
 * handle it already had; meanwhile the reader cannot open a second writer
 * (KVX_EBUSY). Then the roles of "second writer" are checked across
 * processes in the other direction: a blocking open waits until the first
 * writer closes.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/store.h"


static void put_flush(kvx_store *s, uint64_t seq, size_t nb)
{
    uint32_t t[64 * SU_B];
    uint64_t h[64];
    su_tokens(t, seq, nb, 0);
    uint8_t *p = su_pages(t, nb, h, 64);
    assert_int_equal(kvx_store_put(s, t, nb * SU_B, p, nb, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    free(p);
}

static void test_writer_and_reader(void **state)
{
    (void)state;
    char dir[300], prog[512];
    snprintf(dir, sizeof dir, "%s/s", su_root);
    snprintf(prog, sizeof prog, "%s/prog_store_reader", KVX_TEST_BINARY_DIR);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 64 << 20;
    kvx_store *s;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    put_flush(s, 1, 12);
    int to_child[2], from_child[2];
    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(from_child), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(to_child[0], 0);
        dup2(from_child[1], 1);
        close(to_child[1]);
        close(from_child[0]);
        execl(prog, prog, dir, "1", "2", "12", (char *)NULL);
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    char c;
    assert_int_equal(read(from_child[0], &c, 1), 1); /* reader is open and saw seq 1 */
    put_flush(s, 2, 12);
    assert_int_equal(write(to_child[1], "g", 1), 1);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(to_child[1]);
    close(from_child[0]);

    /* a second writer process that waits: it gets the store once we close */
    pid = fork();
    if (pid == 0) {
        /* exec: a forked child would share our LOCK descriptor (and flock) */
        execl(prog, prog, dir, (char *)NULL);
        _exit(127);
    }
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
    assert_int_equal(waitpid(pid, &status, WNOHANG), 0); /* still waiting */
    kvx_store_close(s);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_writer_and_reader)};
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
