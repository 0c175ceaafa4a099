/*
 * twoproc.c - a writer process and a reader process: the reader
 * (tests/lib/prog_store_reader.c) sees blocks published after it opened;
 * the writer lock across processes; a read-only handle looking up in a
 * loop while a writer process puts, flushes, gc's and reindexes serves
 * only right bytes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* PROMISE: STORE-14, STORE-15 */
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

/* Passing coverage: a read-only handle looks prefixes up in a loop while
 * a writer process puts, flushes, gc's (compaction, eviction in a small
 * store) and reindexes: every served block has its right bytes and every
 * call returns 0 (a miss, never an error or a crash). */
/* PROMISE: STORE-15 */
static void test_reader_during_writer(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 640 << 10, .shard_bytes = 64 << 10});
    su_put_flush(s, 2000, 8);
    kvx_store_close(s);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pfd[0]);
        kvx_store *w;
        if (kvx_store_open(&w, dir, NULL, 0)) _exit(2);
        int bad = 0;
        for (uint64_t i = 1; i <= 120 && !bad; i++) {
            uint32_t t[24 * SU_B];
            uint64_t h[24];
            su_tokens(t, 2000 + i, 24, 0);
            uint8_t *p = su_pages(t, 24, h, 64);
            bad |= kvx_store_put(w, t, 24 * SU_B, p, 24, NULL, NULL) != 0;
            bad |= kvx_store_flush(w) != 0;
            free(p);
            if (i % 10 == 0) bad |= kvx_store_gc(w) != 0;
            if (i % 25 == 0) bad |= kvx_store_reindex(w) != 0;
            char c = (char)(i & 0x7f);
            if (write(pfd[1], &c, 1) != 1) bad = 1;
        }
        kvx_store_close(w);
        _exit(bad ? 3 : 0);
    }
    close(pfd[1]);
    kvx_store *r;
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
    uint64_t latest = 0, served = 0, calls = 0, errors = 0, wrong = 0;
    int flags = fcntl(pfd[0], F_GETFL);
    fcntl(pfd[0], F_SETFL, flags | O_NONBLOCK);
    for (;;) {
        char c;
        ssize_t got = read(pfd[0], &c, 1);
        if (got == 0) break;
        if (got == 1) latest++;
        for (uint64_t i = latest > 6 ? latest - 6 : 0; i <= latest; i++) {
            uint32_t t[24 * SU_B];
            uint64_t h[24];
            kvx_view v[24];
            size_t n = 0;
            su_tokens(t, 2000 + i, 24, 0);
            kvx_block_hashes(h, t, 24 * SU_B, SU_B);
            calls++;
            int rc = kvx_store_prefix(v, &n, r, t, (i ? 24 : 8) * SU_B, i ? 24 : 8);
            if (rc) {
                if (errors++ < 3) print_message("reader: prefix %d (%s)\n", rc, kvx_last_error());
                continue;
            }
            for (size_t k = 0; k < n; k++) {
                uint8_t want[64];
                su_page(want, 64, h[k]);
                if (v[k].hash != h[k] || memcmp(v[k].page, want, 64)) wrong++;
            }
            served += n;
            kvx_views_release(v, n);
        }
    }
    kvx_store_close(r);
    close(pfd[0]);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    print_message("reader: %" PRIu64 " prefix calls, %" PRIu64 " blocks served, %" PRIu64 " errors, %" PRIu64
                  " wrong; writer exit %d\n",
                  calls, served, errors, wrong, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(wrong, 0);
    assert_int_equal(errors, 0);
    assert_true(served > 0);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writer_and_reader),
        cmocka_unit_test(test_reader_during_writer),
    };
    return cmocka_run_group_tests_name("system/twoproc", tests, su_setup, su_teardown);
}
