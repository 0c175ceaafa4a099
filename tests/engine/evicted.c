/*
 * tests/engine/evicted.c - kvx_store_evicted: the store reports what its
 * evictions removed (engine/store_maint.c: st_note_evicted), bounded, with
 * a count of what it could not keep.
 *
 * The check is a model's: after every flush (which evicts to the
 * capacity), every block or key put is either still served, or was
 * reported evicted, never both; a reported one is not held. White-box for
 * one check: the queue's bound is lowered (s->ev_max) to see the count of
 * those dropped without 65,536 evictions.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/store.h"
#include "lib/store.h"

#define NSEQ 160
#define NB 4

static kvx_store *small_block_store(const char *dir, uint64_t capacity)
{
    su_rm_rf(dir);
    return su_create(dir, (su_spec){.capacity = capacity, .shard_bytes = 16 << 10});
}

typedef struct model {
    uint64_t hash[NSEQ * NB];
    uint8_t reported[NSEQ * NB];
    size_t n;
} model;

static size_t model_find(const model *m, uint64_t h)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->hash[i] == h) return i;
    return SIZE_MAX;
}

/* Takes every report; each must name a block put and no longer held. */
static uint64_t drain(kvx_store *s, model *m, size_t *reports)
{
    kvx_evicted ev[37]; /* not a divisor of anything: several partial takes */
    uint64_t dropped_all = 0;
    for (;;) {
        size_t n = 99;
        uint64_t dropped = 99;
        assert_int_equal(kvx_store_evicted(s, ev, 37, &n, &dropped), 0);
        dropped_all += dropped;
        for (size_t i = 0; i < n; i++) {
            size_t k = model_find(m, ev[i].hash);
            assert_true(k != SIZE_MAX);   /* a block that was put */
            assert_false(m->reported[k]); /* reported once */
            assert_int_equal(ev[i].key_len, 0);
            m->reported[k] = 1;
            kvx_view v;
            assert_int_equal(kvx_store_get_hash(&v, s, ev[i].hash), KVX_ENOTFOUND); /* really gone */
        }
        *reports += n;
        if (n < 37) return dropped_all;
    }
}

/* PROMISE: STORE-18 */
static void test_block_evictions_reported(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/blocks", su_root);
    kvx_store *s = small_block_store(dir, 96 << 10);
    model *m = calloc(1, sizeof *m);
    size_t reports = 0;
    for (uint64_t q = 0; q < NSEQ; q++) {
        uint32_t t[NB * SU_B];
        su_tokens(t, q, NB, 0);
        kvx_block_hashes(&m->hash[m->n], t, NB * SU_B, SU_B);
        m->n += NB;
        assert_int_equal(su_put_seq(s, q, NB), 0);
        if (q % 16 == 15) assert_int_equal(drain(s, m, &reports), 0);
    }
    assert_int_equal(kvx_store_gc(s), 0);
    assert_int_equal(drain(s, m, &reports), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.evictions > 0);
    assert_true(reports > 0);
    /* every block: held, or reported - never both, never neither */
    size_t held = 0;
    for (size_t i = 0; i < m->n; i++) {
        kvx_view v;
        int rc = kvx_store_get_hash(&v, s, m->hash[i]);
        if (rc == 0) {
            kvx_view_release(&v);
            held++;
            assert_false(m->reported[i]);
        } else {
            assert_int_equal(rc, KVX_ENOTFOUND);
            assert_true(m->reported[i]);
        }
    }
    assert_int_equal(held + reports, m->n);
    assert_int_equal(held, st.blocks);

    /* a reader handle never evicts: nothing to report */
    kvx_store *r;
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
    size_t n = 9;
    uint64_t dropped = 9;
    assert_int_equal(kvx_store_evicted(r, NULL, 0, &n, &dropped), 0);
    assert_int_equal(n, 0);
    assert_int_equal(dropped, 0);
    kvx_store_close(r);
    kvx_store_close(s);
    free(m);
    su_rm_rf(dir);
}

/* The caller lags: past the bound the oldest go, and are counted. */
/* PROMISE: STORE-18 */
static void test_lagging_caller_gets_count(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/lag", su_root);
    kvx_store *s = small_block_store(dir, 96 << 10);
    s->ev_max = 8; /* white-box: a small bound */
    model *m = calloc(1, sizeof *m);
    for (uint64_t q = 0; q < NSEQ; q++) {
        uint32_t t[NB * SU_B];
        su_tokens(t, q, NB, 0);
        kvx_block_hashes(&m->hash[m->n], t, NB * SU_B, SU_B);
        m->n += NB;
        assert_int_equal(su_put_seq(s, q, NB), 0);
    }
    assert_int_equal(kvx_store_gc(s), 0);
    kvx_evicted ev[16];
    size_t n = 0;
    uint64_t dropped = 0;
    assert_int_equal(kvx_store_evicted(s, ev, 16, &n, &dropped), 0);
    assert_int_equal(n, 8); /* the newest 8 */
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(n + dropped + st.blocks, m->n); /* nothing unaccounted for */
    for (size_t i = 0; i < n; i++) assert_true(model_find(m, ev[i].hash) != SIZE_MAX);
    /* taken: the next call has nothing, and the count starts again */
    assert_int_equal(kvx_store_evicted(s, ev, 16, &n, &dropped), 0);
    assert_int_equal(n, 0);
    assert_int_equal(dropped, 0);
    /* misuse */
    assert_int_equal(kvx_store_evicted(s, NULL, 4, &n, NULL), KVX_EINVALID);
    assert_int_equal(kvx_store_evicted(s, ev, 4, NULL, NULL), KVX_EINVALID);
    assert_int_equal(kvx_store_evicted(NULL, ev, 4, &n, NULL), KVX_EINVALID);
    kvx_store_close(s);
    free(m);
    su_rm_rf(dir);
}

/* Keyed: the keys of evicted pages come back whole; a key deleted and put
 * again lives on in its newer copy, so evicting the older copy's shard
 * does not report it. */
/* PROMISE: STORE-18 */
static void test_keyed_evictions_report_keys(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/keyed", su_root);
    su_rm_rf(dir);
    kvx_store *s = su_create(dir, (su_spec){.page_bytes = 4096, .capacity = 512 << 10, .shard_bytes = 32 << 10});
    enum { NK = 300 };
    static char names[NK][300];
    static uint8_t reported[NK];
    uint8_t page[4096];
    memset(page, 0x5a, sizeof page);
    for (int i = 0; i < NK; i++) {
        /* long keys: the whole 255 bytes come back */
        snprintf(names[i], sizeof names[i], "model-%0240d-chunk-%d", 7, i);
        names[i][KVX_KEY_MAX] = '\0';
        snprintf(names[i] + KVX_KEY_MAX - 4, 5, "%04d", i);
        kvx_key k = {names[i], strlen(names[i])};
        const void *pp[1] = {page};
        size_t len = 100 + (size_t)i;
        assert_int_equal(kvx_store_keyed_put(s, NULL, &k, pp, &len, 1, NULL), 0);
        if (i % 4 == 3) assert_int_equal(kvx_store_flush(s), 0);
        if (i == 20) { /* key 0 deleted and put again: its newer copy lives on */
            kvx_key k0 = {names[0], strlen(names[0])};
            assert_int_equal(kvx_store_keyed_delete(s, &k0, 1, NULL), 0);
            assert_int_equal(kvx_store_keyed_put(s, NULL, &k0, pp, &len, 1, NULL), 0);
            assert_int_equal(kvx_store_flush(s), 0);
        }
    }
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_gc(s), 0);
    kvx_evicted *ev = calloc(NK * 2, sizeof *ev);
    size_t n = 0;
    uint64_t dropped = 0;
    assert_int_equal(kvx_store_evicted(s, ev, NK * 2, &n, &dropped), 0);
    assert_int_equal(dropped, 0);
    assert_true(n > 0);
    for (size_t i = 0; i < n; i++) {
        int found = -1;
        for (int j = 0; j < NK; j++)
            if (ev[i].key_len == strlen(names[j]) && memcmp(ev[i].key, names[j], ev[i].key_len) == 0) found = j;
        assert_true(found >= 0);
        assert_int_equal(ev[i].hash, kvx_key_hash(names[found], strlen(names[found])));
        assert_false(reported[found]);
        reported[found] = 1;
    }
    /* held xor reported, for every key */
    for (int j = 0; j < NK; j++) {
        kvx_key k = {names[j], strlen(names[j])};
        uint8_t held = 0;
        assert_int_equal(kvx_store_keyed_exists(&held, NULL, s, &k, 1), 0);
        assert_int_equal(held, !reported[j]);
    }
    free(ev);
    kvx_store_close(s);
    su_rm_rf(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_evictions_reported),
        cmocka_unit_test(test_lagging_caller_gets_count),
        cmocka_unit_test(test_keyed_evictions_report_keys),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
