/*
 * tests/lib/commit_fault.h - a catalog commit failed at a chosen step
 * through the index's commit seam (index/index.h kvx_idx_commit_fault):
 * LMDB's own I/O is outside the OS seam (tests/lib/fault.h), so this is
 * how a test makes a catalog commit fail, as LMDB's failing write or
 * sync would. White-box tests only (they link the library's private
 * folders).
 *
 *   cf_arm(k);               the k-th commit from now fails with EIO
 *   ... calls ...
 *   kvx_idx_commit_fault = NULL;
 *   if (cf_calls >= k) ...   the fault was reached
 */
#ifndef KVX_TEST_COMMIT_FAULT_H
#define KVX_TEST_COMMIT_FAULT_H

#include "index/index.h"
#include "lib/store.h"

#include <errno.h>

static long cf_fail_at, cf_calls;

static inline int cf_fault(void) { return ++cf_calls == cf_fail_at ? EIO : 0; }

/* Counts commits from 0 and fails the k-th. */
static inline void cf_arm(long k)
{
    cf_calls = 0;
    cf_fail_at = k;
    kvx_idx_commit_fault = cf_fault;
}

/* A put + flush of the 3 blocks of sequence seq (su_tokens, su_pages of
 * 64 bytes): its code. */
static inline int cf_put_flush(kvx_store *s, uint64_t seq) { return su_put_seq(s, seq, 3); }

/* A store at dir (made here, 2 MiB: full, so each flush evicts), and each
 * catalog commit of four flushes failed in turn: a flush is acknowledged
 * whole or reports the error (naming the index) with nothing of it
 * served; every acknowledged block the store still holds is served byte
 * for byte (eviction may take the oldest) and the store takes the next
 * flush; reopened, and rebuilt from its files alone, every acknowledged
 * block is whole or evicted, never in part, each failed batch whole or
 * absent, the last acknowledged whole, and verify is clean. DUR-21. */
static inline void cf_flush_commit_faults(const char *dir)
{
    enum { NBLK = 3, MAXQ = 4096 };
    static uint64_t acked[MAXQ];
    uint64_t failed[64], seq = 10000;
    int nacked = 0, nfailed = 0;
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 2 << 20;
    kvx_store *s;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    while (su_stat(s).evictions < 2) assert_int_equal(cf_put_flush(s, seq++), 0); /* full */
    long k = 1;
    for (; k <= 200; k++) {
        cf_arm(k);
        int hit = 0;
        for (int f = 0; f < 4; f++) {
            uint64_t q = seq++;
            long before = cf_calls;
            int rc = cf_put_flush(s, q);
            int here = before < k && cf_calls >= k;
            hit |= here;
            if (rc == 0) {
                assert_int_equal(su_served_prefix(s, q, NBLK), NBLK);
                acked[nacked++] = q;
            } else {
                assert_true(here);
                assert_non_null(strstr(kvx_last_error(), "index/data.mdb: commit: Input/output error"));
                assert_int_equal(su_served_prefix(s, q, NBLK), 0); /* nothing half-visible */
                if (nfailed < 64) failed[nfailed++] = q;
            }
        }
        kvx_idx_commit_fault = NULL;
        int kept = 0; /* eviction takes the oldest by design */
        for (int i = 0; i < nacked; i++) {
            size_t n = su_served_prefix(s, acked[i], NBLK);
            assert_true(n != SIZE_MAX);
            if (n == NBLK) acked[kept++] = acked[i];
        }
        nacked = kept;
        assert_int_equal(cf_put_flush(s, seq), 0); /* usable afterwards */
        acked[nacked++] = seq++;
        assert_true(nacked < MAXQ - 8);
        if (!hit) break;
    }
    assert_true(k > 4 && nfailed > 0 && su_stat(s).evictions > 2);
    kvx_store_close(s);
    for (int reindex = 0; reindex < 2; reindex++) {
        if (reindex) assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
        assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
        for (int i = 0; i < nacked; i++) {
            size_t n = su_served_prefix(s, acked[i], NBLK);
            assert_true(n == NBLK || n == 0);
        }
        assert_int_equal(su_served_prefix(s, acked[nacked - 1], NBLK), NBLK);
        for (int i = 0; i < nfailed; i++) {
            size_t n = su_served_prefix(s, failed[i], NBLK);
            assert_true(n == NBLK || n == 0);
        }
        su_verify_clean(s);
        kvx_store_close(s);
    }
}

#endif
