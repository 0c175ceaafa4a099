/*
 * threads.c - a prompt's lookup racing a compaction that moves its blocks
 * and deletes the old file: the lookup looks again in a fresh snapshot
 * instead of answering a miss.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <pthread.h>

#include <stdlib.h>

#include <cmocka.h>

#include "lib/fault.h"
#include "lib/store.h"

#define NB 6

static kvx_store *store;

static pthread_t lookup_thread;

static int armed, fired;

static int gc_rc = 99;

static void *run_gc(void *p)
{
    (void)p;
    gc_rc = kvx_store_gc(store);
    return NULL;
}

/* The lookup's first stat of a shard file: gc runs (in another thread, to
 * completion) before the lookup opens the file its snapshot named. */
static int gc_inside_stat(int dirfd, const char *path, struct stat *st, int flags)
{
    if (armed && !fired && pthread_equal(pthread_self(), lookup_thread) && strstr(path, ".kvx")) {
        fired = 1;
        pthread_t t;
        if (pthread_create(&t, NULL, run_gc, NULL) == 0) pthread_join(t, NULL);
    }
    return fault_real.fstatat(dirfd, path, st, flags);
}

/* PROMISE: STORE-13 */
static void test_lookup_racing_compaction(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/race", su_root);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 64 << 20;
    o.shard_bytes = 1 << 20;
    assert_int_equal(kvx_store_create(&store, dir, &o), 0);
    for (uint64_t q = 1; q <= 3; q++) assert_int_equal(su_put_seq(store, q, NB), 0); /* three small shards */
    kvx_store_close(store);
    assert_int_equal(kvx_store_open(&store, dir, NULL, 0), 0); /* no shard opened yet */
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, store), 0);
    assert_int_equal(st.shards, 3);
    uint64_t compactions = st.compactions;
    fault_install();
    kvx_os.fstatat = gc_inside_stat;
    lookup_thread = pthread_self();
    armed = 1;
    size_t served = su_served_prefix(store, 1, NB);
    armed = 0;
    fault_uninstall();
    assert_int_equal(fired, 1);
    assert_int_equal(gc_rc, 0);
    assert_int_equal(kvx_store_stat(&st, store), 0);
    assert_true(st.compactions > compactions); /* the race happened: the shards were merged */
    assert_int_equal(served, NB);              /* and the lookup still served every block */
    for (uint64_t q = 1; q <= 3; q++) assert_int_equal(su_served_prefix(store, q, NB), NB);
    kvx_store_close(store);
}

int main(int argc, char **argv)
{
    /* these tests count or damage the files one flush writes as its own
     * shard file: the active shard has its own, tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_racing_compaction),
    };
    return cmocka_run_group_tests_name("system/threads", tests, su_setup, su_teardown);
}
