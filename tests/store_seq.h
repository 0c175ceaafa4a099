/*
 * store_seq.h - cmocka helpers shared by test_store_verdict.c and
 * test_store_capacity.c: put sequence seq (NB blocks, pages from
 * store_util.h) asserting the put succeeded, and count the leading blocks
 * of it the store serves, each checked byte for byte.
 */
#ifndef KVX_TEST_STORE_SEQ_H
#define KVX_TEST_STORE_SEQ_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "store_util.h"

#define NB 6 /* blocks per sequence */

/* Puts the NB blocks of sequence seq (not flushed); the put must succeed. */
static inline void put_seq(kvx_store *s, uint64_t seq)
{
    uint32_t t[NB * SU_B];
    uint64_t h[NB];
    su_tokens(t, seq, NB, 0);
    uint8_t *p = su_pages(t, NB, h, 64);
    int rc = kvx_store_put(s, t, NB * SU_B, p, NB, NULL, NULL);
    if (rc) fprintf(stderr, "put: %s\n", kvx_last_error());
    assert_int_equal(rc, 0);
    free(p);
}

/* Leading blocks of seq served by prefix, each checked byte for byte. */
static inline size_t prefix_of(kvx_store *s, uint64_t seq) { return su_served_prefix(s, seq, NB); }

#endif
