/*
 * collide.c - the collision finder of tests/lib/collide.h, which the trust
 * tests use to attack format/hash.c's chained block hash: it finds a fresh
 * chained collision (seed from the clock and the pid, printed) for B = 2
 * and B = 16, two different token lists with the same block-0 hash, equal
 * in all but the last two tokens, and the same second block appended to
 * both collides again. Each search is ~5.4e9 hash evaluations (seconds on
 * two cores); a search that gives up fails.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvx.h"
#include "lib/collide.h"

/* Per search: an attempt reseeds after 240 s, a search gives up at 420 s;
 * both searches stay under the 900 s ctest TIMEOUT. */
#define ATTEMPT_SECONDS 240.0

#define MAX_SECONDS 420.0

static uint64_t fresh_seed(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t s = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
    s ^= (uint64_t)getpid() << 40;
    return kvx_collide_splitmix(&s);
}

static void check_collision(uint32_t B)
{
    uint32_t a[16], b[16];
    assert_true(B >= 2 && B <= 16);
    uint64_t seed = fresh_seed();
    kvx_test_collide_stats st;
    int rc = kvx_test_find_collision_ex(B, seed, a, b, ATTEMPT_SECONDS, MAX_SECONDS, &st);
    print_message("collide B=%u seed=0x%016llx: %s in %.2f s, %.3g evaluations (%.0f M/s), "
                  "%u attempt(s), %u thread(s) x %u lanes, %s kernel, %llu distinguished "
                  "points, %llu Robin Hood(s)\n",
                  B, (unsigned long long)seed, rc == 0 ? "found" : "GAVE UP", st.seconds,
                  (double)st.evaluations, st.seconds > 0 ? st.evaluations / st.seconds / 1e6 : 0.0,
                  st.attempts, st.threads, st.lanes, st.avx2 ? "AVX2" : "scalar",
                  (unsigned long long)st.distinguished, (unsigned long long)st.robin_hoods);
    if (rc != 0) fail_msg("B=%u seed=0x%016llx: search gave up: %s", B, (unsigned long long)seed, st.why);

    print_message("  a[B-2..B-1] = %08x %08x, b[B-2..B-1] = %08x %08x, H = 0x%016llx\n",
                  a[B - 2], a[B - 1], b[B - 2], b[B - 1],
                  (unsigned long long)kvx_block_hash(0, a, B));
    assert_memory_not_equal(a, b, B * sizeof a[0]);
    if (B > 2) assert_memory_equal(a, b, (B - 2) * sizeof a[0]);
    uint64_t ha = kvx_block_hash(0, a, B), hb = kvx_block_hash(0, b, B);
    assert_true(ha == hb);

    /* Chained: the same second block (and a partial tail) after both. */
    uint32_t ta[40], tb[40];
    uint64_t rs = seed ^ 0x5eedULL;
    memcpy(ta, a, B * sizeof a[0]);
    memcpy(tb, b, B * sizeof b[0]);
    for (uint32_t i = B; i < 2 * B + 1; i++) ta[i] = tb[i] = (uint32_t)kvx_collide_splitmix(&rs);
    assert_true(kvx_block_hash(ha, ta + B, B) == kvx_block_hash(hb, tb + B, B));
    uint64_t hsa[3] = {0, 0, 0}, hsb[3] = {0, 0, 0};
    assert_int_equal(kvx_block_hashes(hsa, ta, 2 * B + 1, B), 2);
    assert_int_equal(kvx_block_hashes(hsb, tb, 2 * B + 1, B), 2);
    assert_true(hsa[0] == ha && hsb[0] == hb);
    assert_true(hsa[1] == hsb[1]);
    assert_true(hsa[1] == kvx_block_hash(ha, ta + B, B));
}

static void test_collision_b2(void **state)
{
    (void)state;
    check_collision(2);
}

static void test_collision_b16(void **state)
{
    (void)state;
    check_collision(16);
}

/* The API's guard rails, no search: B < 2 and NULL outputs give up at once. */
static void test_bad_arguments(void **state)
{
    (void)state;
    uint32_t a[2], b[2];
    kvx_test_collide_stats st;
    assert_int_equal(kvx_test_find_collision_ex(1, 1, a, b, 1.0, 1.0, &st), -1);
    assert_true(st.why[0] != '\0');
    assert_int_equal(kvx_test_find_collision(2, 1, NULL, b, 1.0, 1.0), -1);
}

/* The lockstep re-walk: a start on the other walk's path is no collision
 * (Robin Hood), and the same walk twice neither. */
static void test_resolve_robin_hood(void **state)
{
    (void)state;
    const uint64_t s0 = 0x1234567890ABCDEFULL, mask = 0xF00DULL;
    uint64_t a = 42, b = a, x = 0, y = 0;
    for (int i = 0; i < 5; i++) b = kvx_collide_g(s0, mask, b);
    assert_int_equal(kvx_collide_resolve(s0, mask, a, 100, b, 95, &x, &y), 0);
    assert_int_equal(kvx_collide_resolve(s0, mask, b, 95, a, 100, &x, &y), 0);
    assert_int_equal(kvx_collide_resolve(s0, mask, a, 100, a, 100, &x, &y), 0);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_resolve_robin_hood),
        cmocka_unit_test(test_collision_b2),
        cmocka_unit_test(test_collision_b16),
    };
    return cmocka_run_group_tests_name("format/collide", tests, NULL, NULL);
}
