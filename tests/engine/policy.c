/*
 * policy.c - engine/store_policy.c: the store's eviction and compaction
 * decisions on plain arrays: no files, no catalog.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "engine/store.h"

/* PROMISE: STORE-6 */
static void test_goal_and_keep(void **state)
{
    (void)state;
    assert_int_equal(kvx_st_evict_goal(6400), 6300);
    /* 100 blocks in 1000 bytes: 10 a block; a goal of 500 with 100 pending keeps 40 */
    assert_int_equal(kvx_st_evict_keep(500, 100, 1000, 100), 40);
    assert_int_equal(kvx_st_evict_keep(100, 100, 1000, 100), 0); /* pending fills the goal */
    assert_int_equal(kvx_st_evict_keep(500, 0, 0, 0), 0);
}

/* PROMISE: STORE-6 */
static void test_cut_is_exact_lru(void **state)
{
    (void)state;
    uint64_t r[] = {50, 10, 40, 20, 30};
    /* keeping 2: the 2 newest (50, 40) stay, the cut is 30 */
    assert_int_equal(kvx_st_evict_cut(r, 5, 2), 30);
    uint64_t r2[] = {5, 1};
    assert_int_equal(kvx_st_evict_cut(r2, 2, 2), 0); /* all kept */
    assert_int_equal(kvx_st_evict_cut(r2, 2, 0), 5);  /* none kept: everything at or below */
}

/* PROMISE: STORE-6 */
static void test_carry_cut_takes_the_newest_share(void **state)
{
    (void)state;
    uint64_t r[10];
    for (int i = 0; i < 10; i++) r[i] = (uint64_t)(100 - i * 10); /* 100, 90 .. 10 */
    /* an LRU keeping 5 keeps 100..60 (cut 50); the carry cut keeps the newest 80 %: 4 (100..70) */
    assert_int_equal(kvx_st_evict_cut(r, 10, 5), 50);
    assert_int_equal(kvx_st_carry_cut(r, 10, 5), 60);
    /* keeping all: nothing below either cut */
    assert_int_equal(kvx_st_carry_cut(r, 10, 10), 20); /* 8 of 10 carried at most */
    assert_int_equal(kvx_st_carry_cut(r, 10, 0), 100); /* nothing kept, nothing carried */
    /* no overflow for a huge keep */
    assert_int_equal(kvx_st_carry_cut(r, 10, UINT64_MAX), 0);
}

/* PROMISE: STORE-6 */
static void test_order_coldest_share_first(void **state)
{
    (void)state;
    st_pshard sh[ST_SLOTS];
    memset(sh, 0, sizeof sh);
    uint64_t a[] = {1, 2, 100, 100}; /* half cold */
    uint64_t b[] = {1, 2, 3, 4};     /* all cold, older mean */
    uint64_t c[] = {5, 6, 7, 8};     /* all cold, newer mean */
    uint64_t d[] = {100, 100};       /* all hot */
    sh[7] = (st_pshard){1, 0, 0, 4, 100, a};
    sh[3] = (st_pshard){1, 0, 0, 4, 100, b};
    sh[9] = (st_pshard){1, 0, 0, 4, 100, c};
    sh[1] = (st_pshard){1, 0, 0, 2, 100, d};
    sh[2] = (st_pshard){0, 0, 0, 4, 100, b}; /* not live: never ordered */
    uint32_t order[ST_SLOTS];
    assert_int_equal(kvx_st_evict_order(order, sh, 10), 4);
    assert_int_equal(order[0], 3);
    assert_int_equal(order[1], 9);
    assert_int_equal(order[2], 7);
    assert_int_equal(order[3], 1);
}

/* PROMISE: STORE-6 */
static void test_carry_never_exceeds_freed(void **state)
{
    (void)state;
    /* carry room is half of what is freed, in entries */
    assert_int_equal(kvx_st_carry_room(1000, 100), 5);
    /* freed 600 of 1600 with goal 1000: enough with nothing carried */
    assert_true(kvx_st_evict_enough(1600, 600, 0, 3, 100, 1000));
    /* carrying 3 blocks costs a shard: 4096 + 300 over the goal */
    assert_false(kvx_st_evict_enough(1600, 600, 3, 3, 100, 1000));
    /* the carry is bounded by the room, not by what was collected */
    assert_true(kvx_st_evict_enough(10000, 5000, 50, 0, 100, 5000));
}

/* PROMISE: STORE-8 */
static void test_compaction_groups(void **state)
{
    (void)state;
    st_pshard sh[ST_SLOTS];
    memset(sh, 0, sizeof sh);
    sh[0] = (st_pshard){1, 0, 3, 1, 100, NULL};  /* small, flags 3 */
    sh[1] = (st_pshard){1, 1, 3, 1, 100, NULL};  /* small but pinned */
    sh[2] = (st_pshard){1, 0, 7, 1, 100, NULL};  /* small, other kind */
    sh[3] = (st_pshard){1, 0, 3, 1, 600, NULL};  /* not small (target/2 = 500) */
    sh[4] = (st_pshard){1, 0, 3, 1, 499, NULL};  /* small */
    uint8_t v[ST_SLOTS] = {0};
    assert_int_equal(kvx_st_compact_small(v, sh, 3, 1000), 2);
    assert_true(v[0] && v[4]);
    assert_false(v[1] || v[2] || v[3]);
}

/* PROMISE: STORE-8 */
static void test_compaction_due(void **state)
{
    (void)state;
    st_pshard sh[ST_SLOTS];
    memset(sh, 0, sizeof sh);
    for (int b = 0; b < 3; b++) sh[b] = (st_pshard){1, 0, 3, 1, 10, NULL};
    assert_false(kvx_st_compact_due(sh, 1 << 20, 1000)); /* 3 small: under the minimum of 4 */
    sh[3] = (st_pshard){1, 0, 3, 1, 10, NULL};
    assert_true(kvx_st_compact_due(sh, 1 << 20, 1000));
    /* many large shards: due once ids run low */
    memset(sh, 0, sizeof sh);
    for (int b = 0; b <= ST_COMPACT_AT; b++) sh[b] = (st_pshard){1, 0, 3, 1, 5000, NULL};
    assert_true(kvx_st_compact_due(sh, (uint64_t)1 << 40, 1000));
    sh[ST_COMPACT_AT].live = 0;
    assert_false(kvx_st_compact_due(sh, (uint64_t)1 << 40, 1000));
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goal_and_keep),
        cmocka_unit_test(test_cut_is_exact_lru),
        cmocka_unit_test(test_carry_cut_takes_the_newest_share),
        cmocka_unit_test(test_order_coldest_share_first),
        cmocka_unit_test(test_carry_never_exceeds_freed),
        cmocka_unit_test(test_compaction_groups),
        cmocka_unit_test(test_compaction_due),
    };
    return cmocka_run_group_tests_name("engine/policy", tests, NULL, NULL);
}
