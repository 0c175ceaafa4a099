/*
 * commit.h - the commit fixture: a keyed shard with sequence numbers and
 * tombstones (docs/FORMAT.md "Sequence numbers and tombstones"), written
 * with the store's internal writer calls (format/format.h), for the tests
 * of the format (tests/format/commit.c) and of the paths that read shards
 * (io/ warmup and fetch, the kvx command). Entry i is a keyed page of
 * cm_lens[i] bytes (bytes cm_byte(i, k)), or a tombstone where cm_lens[i]
 * is 0, at coordinate (3, 20 + i, 0), with sequence number cm_seqs[i].
 * Include after cmocka.h; white-box.
 */
#ifndef KVX_COMMIT_FIXTURE_H
#define KVX_COMMIT_FIXTURE_H

#include <stdint.h>
#include <string.h>

#include "format/format.h"
#include "kvx.h"

#define CM_PB 4096u /* the keyed geometry's page size */
#define CM_FLAGS (KVX_FLAG_KEYS | KVX_FLAG_SEQ | KVX_FLAG_TOMB)
#define CM_SHARD 3
#define CM_N 5
#define CM_PAGES 3 /* entries that are pages */

static const char *const cm_keys[CM_N] = {"a", "gone", "model@1@0@deadbeef@bfloat16", "b", "x"};
static const uint32_t cm_lens[CM_N] = {100, 0, CM_PB, 7, 0};
static const uint64_t cm_seqs[CM_N] = {10, 11, 12, 12, 12};

static inline uint8_t cm_byte(uint32_t i, uint32_t k) { return (uint8_t)(k * 7u + i * 31u + 1u); }

static inline void cm_page(uint8_t *p, uint32_t n, uint32_t i)
{
    for (uint32_t b = 0; b < n; b++) p[b] = cm_byte(i, b);
}

/* Writer options: the keyed geometry of CM_PB, shard CM_SHARD, 8 entries. */
static inline kvx_shard_writer_options cm_options(uint32_t flags)
{
    kvx_shard_writer_options o;
    kvx_shard_writer_options_init(&o);
    assert_int_equal(kvx_keyed_geometry(&o.geometry, CM_PB), 0);
    o.shard_id = CM_SHARD;
    o.max_entries = 8;
    o.flags = flags;
    return o;
}

/* Adds the CM_N entries to w (sequence numbers unset). */
static inline void cm_add_entries(kvx_shard_writer *w)
{
    static uint8_t page[CM_PB];
    for (uint32_t i = 0; i < CM_N; i++) {
        uint32_t klen = (uint32_t)strlen(cm_keys[i]);
        if (!cm_lens[i]) {
            assert_int_equal(kvx_shard_writer_add_tombstone(w, (uint16_t)(20 + i), cm_keys[i], klen), 0);
            continue;
        }
        cm_page(page, cm_lens[i], i);
        kvx_entry_in e;
        memset(&e, 0, sizeof e);
        e.radix_block = (uint16_t)(20 + i);
        e.token_count = 1;
        e.page = page;
        e.key = cm_keys[i];
        e.key_len = klen;
        e.page_len = cm_lens[i];
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    }
}

/* Writes the fixture to path: entries 0 and 1 get their own sequence
 * numbers, the rest the batch's (kvx_shard_writer_seq_unset). */
static inline void cm_write(const char *path)
{
    kvx_shard_writer_options o = cm_options(CM_FLAGS);
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    cm_add_entries(w);
    assert_int_equal(kvx_shard_writer_set_seq(w, 0, cm_seqs[0]), 0);
    assert_int_equal(kvx_shard_writer_set_seq(w, 1, cm_seqs[1]), 0);
    kvx_shard_writer_seq_unset(w, cm_seqs[2]);
    kvx_shard_writer_seq_unset(w, 99); /* every entry has one now: no change */
    assert_int_equal(kvx_shard_writer_seal(w), 0);
}

#endif
