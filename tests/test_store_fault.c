/*
 * test_store_fault.c - fault injection through the OS seam (tests/fault.h)
 * at every step of a put + flush, and of a gc that evicts and compacts:
 * the operation's OS calls are counted once, then the operation is re-run
 * failing call k, for every k, with ENOSPC, EIO, a failed fsync and a
 * short write. After each run: the error (if any) surfaced, every block
 * acknowledged so far still reads back byte-exact, a failed operation
 * leaves nothing half-visible, and the store takes the next put + flush.
 * Finally the store is reopened (recovery) and everything is checked again.
 * (LMDB's own I/O does not go through the seam; its commit is atomic.)
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fault.h"
#include "store_util.h"

#define NB 3 /* blocks per sequence */
#define MAXSEQ 4096

static uint64_t acked[MAXSEQ];
static int nacked;

static int put_flush(kvx_store *s, uint64_t seq)
{
    uint32_t t[NB * SU_B];
    uint64_t h[NB];
    su_tokens(t, seq, NB, 0);
    uint8_t *p = su_pages(t, NB, h, 64);
    int rc = kvx_store_put(s, t, NB * SU_B, p, NB, NULL, NULL);
    free(p);
    if (rc) return rc;
    return kvx_store_flush(s);
}

/* Leading blocks of seq served by prefix, each checked byte for byte. */
static size_t served(kvx_store *s, uint64_t seq) { return su_served_prefix(s, seq, NB); }

static void check_all(kvx_store *s)
{
    for (int i = 0; i < nacked; i++) assert_int_equal(served(s, acked[i]), NB);
}

static void run_modes(kvx_store *s, uint64_t *seq, long ncalls, int fsync_only)
{
    static const struct { int err, mode; } modes[] = {
        {ENOSPC, FAULT_ERRNO}, {EIO, FAULT_ERRNO}, {EIO, FAULT_SHORT}};
    for (size_t m = 0; m < (fsync_only ? 1 : 3); m++) {
        for (long k = 1; k <= ncalls; k++) {
            fault_fsync_only = fsync_only;
            fault_reset(k, fsync_only ? EIO : modes[m].err, modes[m].mode);
            uint64_t q = (*seq)++;
            int rc = put_flush(s, q);
            long hits = fault_hits;
            fault_reset(0, EIO, FAULT_ERRNO);
            fault_fsync_only = 0;
            if (rc == 0) {
                /* acknowledged: must be whole (a short write is retried,
                 * a failed unlink of a leftover is harmless) */
                assert_int_equal(served(s, q), NB);
                acked[nacked++] = q;
            } else {
                assert_true(hits > 0);
                assert_true(kvx_last_error()[0] != '\0');
                assert_int_equal(served(s, q), 0); /* nothing half-visible */
            }
            check_all(s);
            /* usable afterwards */
            uint64_t q2 = (*seq)++;
            assert_int_equal(put_flush(s, q2), 0);
            acked[nacked++] = q2;
            assert_true(nacked < MAXSEQ - 8);
        }
    }
}

static void test_flush_faults(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/f", su_root);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 64 << 20;
    kvx_store *s;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    uint64_t seq = 0;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(put_flush(s, seq), 0);
        acked[nacked++] = seq++;
    }
    fault_install();
    fault_reset(0, EIO, FAULT_ERRNO);
    assert_int_equal(put_flush(s, seq), 0);
    acked[nacked++] = seq++;
    long ncalls = fault_calls;
    assert_true(ncalls >= 5); /* create, writes, fsyncs, renames */
    run_modes(s, &seq, ncalls, 0);
    /* the fsyncs alone, one at a time */
    fault_fsync_only = 1;
    fault_reset(0, EIO, FAULT_ERRNO);
    assert_int_equal(put_flush(s, seq), 0);
    acked[nacked++] = seq++;
    long nsync = fault_calls;
    fault_fsync_only = 0;
    assert_true(nsync >= 2);
    run_modes(s, &seq, nsync, 1);
    fault_uninstall();
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    check_all(s);
    uint64_t bad = 1;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    assert_int_equal(bad, 0);
    kvx_store_close(s);
}

/* gc that compacts many small shards (and evicts), failing each call. */
static void test_gc_faults(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/g", su_root);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 64 << 20;
    kvx_store *s;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    nacked = 0;
    uint64_t seq = 10000;
    fault_install();
    for (long k = 1;; k++) {
        for (int i = 0; i < 4; i++) { /* four small shards to merge */
            assert_int_equal(put_flush(s, seq), 0);
            acked[nacked++] = seq++;
        }
        fault_reset(k, k % 2 ? EIO : ENOSPC, FAULT_ERRNO);
        int rc = kvx_store_gc(s);
        long hits = fault_hits;
        fault_reset(0, EIO, FAULT_ERRNO);
        if (rc != 0) assert_true(hits > 0);
        if (getenv("FAULT_DEBUG")) fprintf(stderr, "k=%ld rc=%d hits=%ld %s\n", k, rc, hits, kvx_last_error());
        check_all(s); /* compaction never loses a block, failed or not */
        if (hits == 0) {
            assert_int_equal(rc, 0);
            break; /* k passed the last call of gc */
        }
        assert_true(k < 200);
    }
    fault_uninstall();
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.compactions > 0);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    check_all(s);
    kvx_store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flush_faults),
        cmocka_unit_test(test_gc_faults),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
