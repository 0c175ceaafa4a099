/*
 * test_attack15.c - tl.kv.v1 leases that begin at once share one pinning
 * budget (docs/TRANSFER.md "The lease").
 *
 * Found by a hostile review: each lease took the union of the other
 * leases' pins once, when it began (kvx_st_lease_begin), and admitted
 * shards against that snapshot. Eight HasBlocks running at once each saw
 * the budget empty and together pinned up to eight times it (half the
 * capacity each: the whole store); a renewing HasBlocks re-pinned that
 * overshoot for free (a shard some lease pinned "costs nothing more")
 * before the old leases lapsed, so a client renewing its leases froze the
 * cache on its prompts for good. The union is now taken at each admission
 * (engine/store_batch.c st_lease_room).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>

#include "lib/store.h"
#include "lib/xfer.h"
#include "engine/store.h"

/* Bytes of the live shard files some lease of s pins. */
static uint64_t lease_pinned_bytes(kvx_store *s)
{
    uint64_t n = 0;
    pthread_mutex_lock(&s->wmu);
    for (uint32_t c = 0; c < ST_SLOTS; c++) {
        int any = 0;
        for (const kvx_store_batch *y = s->batches; y && !any; y = y->next) any = y->lease && y->pinned[c];
        if (any && s->reg->live[c]) n += s->reg->rec[c].file_bytes;
    }
    pthread_mutex_unlock(&s->wmu);
    return n;
}

/* Lease x pins every live shard of s, in slot order or backwards. */
static void pin_all(kvx_store *s, kvx_store_batch *x, int backwards)
{
    pthread_mutex_lock(&s->wmu);
    for (uint32_t i = 0; i < ST_SLOTS; i++) {
        uint32_t c = backwards ? ST_SLOTS - 1 - i : i;
        if (s->reg->live[c]) kvx_st_pin(x, c, s->reg->rec[c].gen);
    }
    pthread_mutex_unlock(&s->wmu);
}

static kvx_store_batch *lease(kvx_store *s)
{
    kvx_store_batch *x = NULL;
    assert_int_equal(kvx_store_batch_create(&x, s), 0);
    pthread_mutex_lock(&s->wmu);
    kvx_st_lease_begin(x);
    pthread_mutex_unlock(&s->wmu);
    return x;
}

static void test_concurrent_leases_share_budget(void **state)
{
    (void)state;
    char d[256];
    const uint64_t cap = 160 << 10;
    kvx_store *s = su_store(d, sizeof d, (su_spec){.capacity = cap, .shard_bytes = 8 << 10});
    for (uint64_t p = 0; p < 12; p++) free(prompt(s, 300 + p, 4, 4));
    uint64_t live = 0;
    for (uint32_t c = 0; c < ST_SLOTS; c++)
        if (s->reg->live[c]) live += s->reg->rec[c].file_bytes;
    const uint64_t budget = kvx_st_lease_budget(s);
    if (live < budget + budget / 2)
        fail_msg("the store holds %llu bytes of shards, the leases' budget is %llu: too little to show an overshoot",
                 (unsigned long long)live, (unsigned long long)budget);

    /* two HasBlocks that began before either pinned: one takes the shards
     * from the first slot up, the other from the last down */
    kvx_store_batch *a = lease(s), *b = lease(s);
    pin_all(s, a, 0);
    pin_all(s, b, 1);
    uint64_t pinned = lease_pinned_bytes(s);
    if (pinned > budget)
        fail_msg("two leases begun at once pin %llu bytes, the budget is %llu", (unsigned long long)pinned,
                 (unsigned long long)budget);
    assert_true(pinned > 0);

    /* a renewal: a third lease re-pins everything, then the first two
     * lapse; what stays pinned is still within the budget */
    kvx_store_batch *r = lease(s);
    pin_all(s, r, 0);
    kvx_store_batch_destroy(a);
    kvx_store_batch_destroy(b);
    pinned = lease_pinned_bytes(s);
    if (pinned > budget)
        fail_msg("after a renewal the leases pin %llu bytes, the budget is %llu", (unsigned long long)pinned,
                 (unsigned long long)budget);
    assert_true(pinned > 0);
    kvx_store_batch_destroy(r);
    assert_int_equal(lease_pinned_bytes(s), 0);
    kvx_store_close(s);
}

/* kvx_views_export checked the CRC of each view's (shard, entry) and then
 * exported the caller's view.page, hash and token count: a view whose
 * page pointed at another block exported that block's bytes under the
 * first one's hash (found by a hostile review). Now refused, naming the
 * field. */
static void test_export_view_must_match_entry(void **state)
{
    (void)state;
    char d[256];
    kvx_store *s = su_store(d, sizeof d, (su_spec){0});
    uint32_t *t = prompt(s, 700, 4, 4);
    kvx_view v[4];
    size_t n = 0;
    assert_int_equal(kvx_store_prefix(v, &n, s, t, 4 * SU_B, 4), 0);
    assert_int_equal(n, 4);
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(kvx_views_export(&buf, &len, s, v, 4, KVX_ENVELOPE_V1), 0); /* as they are: exported */
    kvx_free(buf);
    const char *field[3] = {"page", "hash", "token_count"};
    for (int k = 0; k < 3; k++) {
        kvx_view bad[4];
        memcpy(bad, v, sizeof bad);
        if (k == 0) bad[1].page = v[2].page;
        if (k == 1) bad[1].hash = v[2].hash;
        if (k == 2) {
            kvx_geometry g;
            kvx_store_get_geometry(&g, s);
            bad[1].token_count = SU_B - 1;
            bad[1].page_bytes = kvx_page_bytes(&g, SU_B - 1); /* past the shape check */
        }
        buf = NULL;
        assert_int_equal(kvx_views_export(&buf, &len, s, bad, 4, KVX_ENVELOPE_V1), KVX_EINVALID);
        assert_null(buf);
        char want[64];
        snprintf(want, sizeof want, "views[1].%s", field[k]);
        if (!strstr(kvx_last_error(), want)) fail_msg("k=%d: \"%s\" does not name %s", k, kvx_last_error(), want);
    }
    kvx_views_release(v, n);
    free(t);
    kvx_store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_leases_share_budget),
        cmocka_unit_test(test_export_view_must_match_entry),
    };
    return cmocka_run_group_tests_name("attack15", tests, su_setup, su_teardown);
}
