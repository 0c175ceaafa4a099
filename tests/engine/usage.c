/*
 * usage.c - engine/store_usage.c: usage from read-only handles reaches the
 * writer's LRU decisions at close or every 65,536 lookups: a reader
 * process (this program run again with --reader) reads the oldest shard,
 * and the writer's next eviction keeps it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/store.h"

/* Shards of 16 blocks (68 KiB: a 4 KiB head, each page in its own 4
 * KiB), six of them in the store. */
#define EV_CAP (450u << 10)

#define EV_SHARD (70u << 10)

/* The reader process (this program with --reader DIR SEQ NB LOOKUPS
 * CLOSE): opens DIR read-only, serves SEQ's NB blocks by prefix (one
 * lookup), then LOOKUPS - 1 lookups by hash of them; closes the store when
 * CLOSE is 1. Then it writes "r" on stdout and waits for end of file on
 * stdin before it exits, without closing a store it left open. Exit 0, or
 * 10+ naming the check that failed. */
static int reader_main(char **argv)
{
    const char *dir = argv[2];
    uint64_t seq = strtoull(argv[3], NULL, 10);
    size_t nb = strtoul(argv[4], NULL, 10);
    unsigned long lookups = strtoul(argv[5], NULL, 10);
    int close_it = atoi(argv[6]);
    kvx_store *s;
    if (nb == 0 || nb > 64 || lookups == 0) return 9;
    if (kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY) != 0) return 10;
    if (su_served_prefix(s, seq, nb) != nb) return 11;
    uint32_t t[64 * SU_B];
    uint64_t h[64];
    su_tokens(t, seq, nb, 0);
    kvx_block_hashes(h, t, nb * SU_B, SU_B);
    for (unsigned long i = 1; i < lookups; i++) {
        kvx_view v;
        if (kvx_store_get_hash(&v, s, h[i % nb]) != 0) return 12;
        kvx_view_release(&v);
    }
    if (close_it) kvx_store_close(s);
    if (write(1, "r", 1) != 1) return 13;
    char c;
    while (read(0, &c, 1) > 0) {
    }
    _exit(0);
}

typedef struct reader_proc {
    pid_t pid;
    int to; /* the child's stdin: closing it lets the child exit */
} reader_proc;

static reader_proc reader_start(const char *dir, uint64_t seq, size_t nb, unsigned long lookups, int close_it)
{
    int in[2], out[2];
    assert_int_equal(pipe(in), 0);
    assert_int_equal(pipe(out), 0);
    char a_seq[32], a_nb[32], a_n[32], a_close[8];
    snprintf(a_seq, sizeof a_seq, "%llu", (unsigned long long)seq);
    snprintf(a_nb, sizeof a_nb, "%zu", nb);
    snprintf(a_n, sizeof a_n, "%lu", lookups);
    snprintf(a_close, sizeof a_close, "%d", close_it);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* a fresh process (exec): nothing of the writer's LMDB environment
         * or threads carried over */
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        execl("/proc/self/exe", "usage", "--reader", dir, a_seq, a_nb, a_n, a_close, (char *)NULL);
        _exit(8);
    }
    close(in[0]);
    close(out[1]);
    char c = 0;
    ssize_t r = read(out[0], &c, 1);
    close(out[0]);
    if (r != 1 || c != 'r') {
        close(in[1]);
        int st = 0;
        waitpid(pid, &st, 0);
        fail_msg("reader process failed: %s %d", WIFEXITED(st) ? "exit" : "signal",
                 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
    return (reader_proc){pid, in[1]};
}

static void reader_end(reader_proc *r)
{
    close(r->to);
    int st = 0;
    assert_int_equal(waitpid(r->pid, &st, 0), r->pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* Shards A (oldest) and B (next), then newer shards until one more would
 * reach the capacity; then a reader process reads A (lookups lookups;
 * none: 0) and closes its handle or not; then the writer puts until it
 * evicts. With writer_first the writer itself read A before B was made
 * (its own, older, per-block times). Answers 1 when A is whole and B
 * gone, 0 when B is whole and A gone; anything else fails. */
static int evict_after_reader(unsigned long lookups, int close_it, int writer_first)
{
    char dir[300];
    kvx_store *s =
        su_store(dir, sizeof dir,
                 (su_spec){.capacity = EV_CAP, .shard_bytes = EV_SHARD, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    const uint64_t A = 500, B = 501;
    su_put_flush(s, A, 16);
    if (writer_first) assert_int_equal(su_served_prefix(s, A, 16), 16);
    su_put_flush(s, B, 16);
    uint64_t seq = 600;
    for (kvx_store_stats st = su_stat(s); st.bytes + 2 * (st.bytes / st.shards) <= EV_CAP; st = su_stat(s))
        su_put_flush(s, seq++, 16);
    assert_int_equal(su_stat(s).evictions, 0);
    reader_proc r = {-1, -1};
    if (lookups) r = reader_start(dir, A, 16, lookups, close_it);
    while (su_stat(s).evictions == 0 && seq < 640) su_put_flush(s, seq++, 16);
    assert_true(su_stat(s).evictions > 0);
    size_t a = su_served_prefix(s, A, 16), b = su_served_prefix(s, B, 16);
    if (lookups) reader_end(&r);
    kvx_store_close(s);
    if (a == 16 && b == 0) return 1;
    if (a == 0 && b == 16) return 0;
    fail_msg("after the eviction A serves %zu of 16 blocks, B %zu", a, b);
    return -1;
}

/* "Usage from read-only handles reaches the writer's LRU decisions ... every
 * 65,536 lookups or at close": a reader process (this program run again with
 * --reader) reads the oldest shard A; the writer's next eviction takes the
 * newer, unread B and keeps A (test_reader_use_reaches_writer_at_close,
 * test_reader_use_after_65536_lookups). Controls: no reader, and a reader
 * still open after 65,535 lookups: A, the oldest, goes
 * (test_reader_use_controls), so the two tests above prove the usage arrived,
 * and when. */
/* PROMISE: STORE-7 */
static void test_reader_use_reaches_writer_at_close(void **state)
{
    (void)state;
    /* 17 lookups, then close: A was used after B was made */
    assert_int_equal(evict_after_reader(17, 1, 0), 1);
}

/* "Usage from read-only handles reaches the writer's LRU decisions ... every
 * 65,536 lookups or at close": a reader process (this program run again with
 * --reader) reads the oldest shard A; the writer's next eviction takes the
 * newer, unread B and keeps A (test_reader_use_reaches_writer_at_close,
 * test_reader_use_after_65536_lookups). Controls: no reader, and a reader
 * still open after 65,535 lookups: A, the oldest, goes
 * (test_reader_use_controls), so the two tests above prove the usage arrived,
 * and when. */
/* PROMISE: STORE-7 */
static void test_reader_use_after_65536_lookups(void **state)
{
    (void)state;
    /* the reader's 65,536th lookup writes its usage; it never closes
     * before the eviction */
    assert_int_equal(evict_after_reader(65536, 0, 0), 1);
}

/* "Usage from read-only handles reaches the writer's LRU decisions ... every
 * 65,536 lookups or at close": a reader process (this program run again with
 * --reader) reads the oldest shard A; the writer's next eviction takes the
 * newer, unread B and keeps A (test_reader_use_reaches_writer_at_close,
 * test_reader_use_after_65536_lookups). Controls: no reader, and a reader
 * still open after 65,535 lookups: A, the oldest, goes
 * (test_reader_use_controls), so the two tests above prove the usage arrived,
 * and when. */
/* PROMISE: STORE-7 */
static void test_reader_use_controls(void **state)
{
    (void)state;
    /* no reader: the oldest, A, goes first */
    assert_int_equal(evict_after_reader(0, 0, 0), 0);
    /* a reader still open after 65,535 lookups has written nothing yet */
    assert_int_equal(evict_after_reader(65535, 0, 0), 0);
    /* the writer's own lookup of A, before B was made, is older than B */
    assert_int_equal(evict_after_reader(0, 0, 1), 0);
}

/* The writer read A before B was made (so it holds its own per-block
 * times for A, older than B); a reader reads A later and closes: the
 * reader's use is the newer one and must count. */
/* PROMISE: STORE-7 */
static void test_reader_use_after_writer_use(void **state)
{
    (void)state;
    assert_int_equal(evict_after_reader(17, 1, 1), 1);
}

int main(int argc, char **argv)
{
    /* these tests read the files one flush writes as its own shard
     * file (the path keyed stores, whole batches and a second batch
     * still take): the active shard has its own, tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    if (argc == 7 && strcmp(argv[1], "--reader") == 0) return reader_main(argv);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reader_use_reaches_writer_at_close),
        cmocka_unit_test(test_reader_use_after_65536_lookups),
        cmocka_unit_test(test_reader_use_controls),
        cmocka_unit_test(test_reader_use_after_writer_use),
    };
    return cmocka_run_group_tests_name("engine/usage", tests, su_setup, su_teardown);
}
