/*
 * lease.c - transfer/xfer.c, HasBlocks and its leases: arguments, a lease
 * pins what it reported held through eviction (within its budget, shared
 * between leases), a lease gone while a stream holds its blocks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdlib.h>

#include <cmocka.h>

#include "engine/store.h"
#include "lib/xfer.h"

/* PROMISE: XFER-12 */
static void test_has_blocks_args(void **state)
{
    (void)state;
    char da[256];
    kvx_store *a = su_store(da, sizeof da, (su_spec){0});
    uint32_t *t = prompt(a, 4, 3, 2);
    uint64_t h[3];
    kvx_block_hashes(h, t, 3 * SU_B, SU_B);
    uint8_t held[3] = {9, 9, 9};
    kvx_xfer_lease *l = (kvx_xfer_lease *)1;
    assert_int_equal(kvx_xfer_has_blocks(held, &l, a, h, 3, t, 3 * SU_B, SU_B, 0), 0);
    assert_int_equal(held[0], 1);
    assert_int_equal(held[1], 1);
    assert_int_equal(held[2], 0);
    kvx_xfer_lease_destroy(l);
    /* hashes not the chain of the tokens */
    h[1] ^= 1;
    l = (kvx_xfer_lease *)1;
    assert_int_equal(kvx_xfer_has_blocks(held, &l, a, h, 3, t, 3 * SU_B, SU_B, 0), KVX_EINVALID);
    assert_null(l);
    assert_non_null(strstr(kvx_last_error(), "block_hashes[1]"));
    h[1] ^= 1;
    assert_int_equal(kvx_xfer_has_blocks(held, NULL, a, h, 3, t, 3 * SU_B - 1, SU_B, 0), KVX_EINVALID);
    assert_int_equal(kvx_xfer_has_blocks(held, NULL, a, h, 3, t, 3 * SU_B, 8, 0), KVX_EINVALID);
    assert_int_equal(kvx_xfer_has_blocks(held, NULL, a, h, 3, t, 3 * SU_B, SU_B, 77), KVX_EMODEL);
    assert_int_equal(kvx_xfer_grpc_code(KVX_EMODEL), KVX_GRPC_FAILED_PRECONDITION);
    /* without tokens: held by hash, for verified blocks only */
    assert_int_equal(kvx_xfer_has_blocks(held, NULL, a, h, 3, NULL, 0, 0, 0), 0);
    assert_int_equal(held[0] + held[1] + held[2], 2);
    /* unverified (put without tokens) is never "held" */
    char dc[256];
    kvx_store *c = su_store(dc, sizeof dc, (su_spec){0});
    chunk_buf cb;
    xf_chunk(&cb, a, t, 2, 0, 0, 1, 0);
    assert_int_equal(kvx_store_put_envelope(c, cb.env, cb.c.payload_len, NULL, 0, NULL), 0);
    assert_int_equal(kvx_store_flush(c), 0);
    kvx_free(cb.env);
    assert_int_equal(kvx_xfer_has_blocks(held, NULL, c, h, 1, NULL, 0, 0, 0), 0);
    assert_int_equal(held[0], 0);
    /* a reader handle answers HasBlocks but takes no lease */
    kvx_store_close(a);
    assert_int_equal(kvx_store_open(&a, da, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(kvx_xfer_has_blocks(held, NULL, a, h, 3, t, 3 * SU_B, 0, 0), 0);
    assert_int_equal(held[0] + held[1] + held[2], 2);
    assert_int_equal(kvx_xfer_has_blocks(held, &l, a, h, 3, t, 3 * SU_B, 0, 0), KVX_EINVALID);
    free(t);
    kvx_store_close(a);
    kvx_store_close(c);
}

/* A lease keeps what HasBlocks reported held through eviction; without it
 * eviction may take it, and the push then gets ABORTED, never a wrong or
 * missing block silently. */
/* PROMISE: XFER-18 */
static void test_lease_pins_through_eviction(void **state)
{
    (void)state;
    for (int with_lease = 1; with_lease >= 0; with_lease--) {
        char da[256], db[256];
        kvx_store *a = su_store(da, sizeof da, (su_spec){0});
        /* small capacity and shards: a few prompts later the first one's
         * shard is the LRU victim */
        kvx_store *b = su_store(db, sizeof db, (su_spec){.capacity = 1 << 20});
        kvx_store_stats st0;
        assert_int_equal(kvx_store_stat(&st0, b), 0);
        const size_t nb = 8;
        uint32_t *t = prompt(a, 5, nb, nb);
        kvx_xfer_result r;
        assert_int_equal(xf_push(b, a, t, nb, 0, NULL, &r), 0);
        uint64_t h[8];
        kvx_block_hashes(h, t, nb * SU_B, SU_B);
        uint8_t held[8];
        kvx_xfer_lease *l = NULL;
        assert_int_equal(kvx_xfer_has_blocks(held, with_lease ? &l : NULL, b, h, nb, t, nb * SU_B, 0, 0), 0);
        for (size_t i = 0; i < nb; i++) assert_int_equal(held[i], 1);
        /* other prompts fill the store several times over */
        for (uint64_t seq = 100; seq < 100 + 64; seq++) {
            uint32_t *o = prompt(b, seq, 8, 8);
            free(o);
        }
        assert_int_equal(kvx_store_gc(b), 0);
        kvx_store_stats st1;
        assert_int_equal(kvx_store_stat(&st1, b), 0);
        assert_true(st1.evictions > 0);
        uint8_t empty[8];
        memset(empty, 1, sizeof empty);
        int rc = xf_push(b, a, t, nb, 0, empty, &r);
        if (with_lease) {
            assert_int_equal(rc, 0);
            assert_int_equal(r.blocks_referenced, nb);
            assert_int_equal(served(b, t, nb), nb);
        } else {
            assert_int_equal(rc, KVX_ENOTHELD);
        }
        kvx_xfer_lease_destroy(l);
        free(t);
        kvx_store_close(a);
        kvx_store_close(b);
    }
}

/* Leases on every prompt of a small store, then more pushes: each push is
 * acknowledged whole or refused cleanly; the leases pin within their
 * budget (engine/store_batch.c kvx_st_lease_begin), so the store stays
 * within its capacity while they live; once they go, gc leaves it within
 * its capacity and verify clean. */
/* PROMISE: XFER-20 */
static void test_leases_pin_everything(void **state)
{
    (void)state;
    char da[256], db[256];
    kvx_store *a = su_store(da, sizeof da, (su_spec){0});
    const uint64_t cap = 160 << 10;
    kvx_store *b = su_store(db, sizeof db, (su_spec){.capacity = cap, .shard_bytes = 8 << 10});
    enum { NP = 12, NB = 4 };
    uint32_t *t[NP];
    kvx_xfer_lease *l[NP] = {0};
    int acked[NP] = {0};
    for (int p = 0; p < NP; p++) {
        t[p] = prompt(a, 100 + (uint64_t)p, NB, NB);
        kvx_xfer_stream *st = NULL;
        assert_int_equal(kvx_xfer_stream_create(&st, b), 0);
        int rc = 0;
        for (size_t i = 0; i < NB && !rc; i++) rc = xf_send_chunk(st, a, t[p], i, 0);
        if (!rc) rc = kvx_xfer_stream_finish(st, NULL);
        kvx_xfer_stream_destroy(st);
        if (rc) {
            assert_int_equal(kvx_xfer_grpc_code(rc), KVX_GRPC_RESOURCE_EXHAUSTED);
            assert_int_equal(served(b, t[p], NB), 0);
            continue;
        }
        acked[p] = 1;
        uint64_t h[NB];
        uint8_t held[NB];
        kvx_block_hashes(h, t[p], NB * SU_B, SU_B);
        assert_int_equal(kvx_xfer_has_blocks(held, &l[p], b, h, NB, t[p], NB * SU_B, 0, 0), 0);
        for (int i = 0; i < NB; i++) assert_int_equal(held[i], 1);
    }
    /* The leases' pins share a budget (half the capacity here): the first
     * leased prompts stay whole, later ones may lose blocks to the pushes
     * (a lease never guarantees a push), and the store never goes over its
     * capacity while they live. Before the budget, leases renewed for ever
     * kept it over its capacity (and pushes refused) for as long as they
     * were renewed. */
    kvx_store_stats live;
    assert_int_equal(kvx_store_stat(&live, b), 0);
    if (live.bytes > cap) fail_msg("leases kept %llu bytes in a %llu-byte store", (unsigned long long)live.bytes,
                                   (unsigned long long)cap);
    assert_int_equal(acked[0], 1);
    assert_int_equal(served(b, t[0], NB), NB); /* the first lease is within the budget */
    for (int p = 0; p < NP; p++) kvx_xfer_lease_destroy(l[p]);
    assert_int_equal(kvx_store_gc(b), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, b), 0);
    if (st.bytes > cap) fail_msg("after the leases went and gc ran: %llu bytes in a %llu-byte store",
                                 (unsigned long long)st.bytes, (unsigned long long)cap);
    su_verify_clean(b);
    for (int p = 0; p < NP; p++) free(t[p]);
    kvx_store_close(a);
    kvx_store_close(b);
}

/* A lease destroyed while a stream references its blocks: the stream's
 * own pins hold them through eviction until its finish. */
/* PROMISE: XFER-18 */
static void test_lease_gone_stream_holds(void **state)
{
    (void)state;
    char da[256], db[256];
    kvx_store *a = su_store(da, sizeof da, (su_spec){0});
    kvx_store *b = su_store(db, sizeof db, (su_spec){.capacity = 1 << 20});
    const size_t nb = 8;
    uint32_t *t = prompt(a, 6, nb, nb);
    uint32_t *tb = prompt(b, 6, nb, nb);
    uint64_t h[8];
    uint8_t held[8];
    kvx_block_hashes(h, t, nb * SU_B, SU_B);
    kvx_xfer_lease *l = NULL;
    assert_int_equal(kvx_xfer_has_blocks(held, &l, b, h, nb, t, nb * SU_B, 0, 0), 0);
    kvx_xfer_stream *st = NULL;
    assert_int_equal(kvx_xfer_stream_create(&st, b), 0);
    for (size_t i = 0; i < nb; i++) assert_int_equal(xf_send_chunk(st, a, t, i, 1), 0);
    kvx_xfer_lease_destroy(l);
    for (uint64_t seq = 200; seq < 200 + 64; seq++) free(prompt(b, seq, 8, 8));
    assert_int_equal(kvx_store_gc(b), 0);
    kvx_xfer_result r;
    assert_int_equal(kvx_xfer_stream_finish(st, &r), 0);
    kvx_xfer_stream_destroy(st);
    assert_int_equal(r.blocks_referenced, nb);
    assert_int_equal(served(b, t, nb), nb);
    free(t);
    free(tb);
    kvx_store_close(a);
    kvx_store_close(b);
}

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

/* PROMISE: XFER-20 */
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

int main(int argc, char **argv)
{
    /* these tests count or damage the files one flush writes as its own
     * shard file: the active shard has its own, tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_has_blocks_args),
        cmocka_unit_test(test_lease_pins_through_eviction),
        cmocka_unit_test(test_leases_pin_everything),
        cmocka_unit_test(test_lease_gone_stream_holds),
        cmocka_unit_test(test_concurrent_leases_share_budget),
    };
    return cmocka_run_group_tests_name("transfer/lease", tests, su_setup, su_teardown);
}
