/*
 * commit.c - the commit records of a shard (docs/FORMAT.md "Sequence
 * numbers and tombstones"; flags bit6 KVX_FLAG_SEQ, bit7 KVX_FLAG_TOMB):
 * pages and tombstones written with their sequence numbers come back as
 * written (a tombstone has no page and is never missing or damaged), the
 * writer's refusals (a seal with a sequence number still 0 leaves no
 * file), and each reader rule on a sealed file patched with its meta CRC
 * made right again, so the rule itself must catch it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "format/format.h"
#include "format/shard_format.h"
#include "kvx.h"
#include "lib/commit.h"
#include "lib/shard.h"

/* Pages and tombstones with their sequence numbers round-trip: every
 * sequence number, tomb flag and key reads back; a tombstone has bytes,
 * offset and crc 0, occupies no KV bytes, has no page (KVX_ENOTFOUND
 * naming it) and is never missing or damaged (VERIFY_PAGES passes). A
 * block shard with a sequence table round-trips too, and a shard without
 * the tables answers 0 for both. */
/* PROMISE: FORMAT-17 */
static void test_commit_round_trip(void **state)
{
    (void)state;
    const char *path = path_of("c.kvx");
    kvx_shard_writer_options o = cm_options(CM_FLAGS);
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    assert_int_equal(kvx_shard_writer_max(w), 8);
    uint64_t empty = kvx_shard_writer_bytes(w); /* kv_data_offset: fixed at create */
    cm_add_entries(w);
    /* tombstones write no KV bytes: 100, CM_PB and 7 bytes, each from a 4096 boundary */
    assert_int_equal(kvx_shard_writer_bytes(w), empty + 3 * 4096);
    kvx_shard_writer_abort(w);
    cm_write(path);

    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, KVX_OPEN_VERIFY_PAGES), 0);
    const kvx_shard_info *info = kvx_shard_get_info(s);
    assert_int_equal(info->flags, CM_FLAGS | KVX_FLAG_META_CRC);
    assert_int_equal(info->num_blocks, CM_N);
    assert_int_equal(info->kv_data_offset, empty);
    assert_int_equal(info->file_size, empty + 3 * 4096);
    assert_int_equal(kvx_shard_min_seq(s), 10);
    assert_int_equal(kvx_shard_missing(s), 0);
    static uint8_t want[CM_PB];
    for (uint32_t i = 0; i < CM_N; i++) {
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, s, i), 0);
        assert_int_equal(e.coordinate, KVX_COORD(CM_SHARD, 20 + i, 0));
        assert_int_equal(e.token_count, 1);
        assert_int_equal(e.key_len, strlen(cm_keys[i]));
        assert_memory_equal(e.key, cm_keys[i], e.key_len);
        assert_true(e.hash == kvx_key_hash(cm_keys[i], strlen(cm_keys[i])));
        uint64_t seq = 0;
        int tomb = -1;
        assert_int_equal(kvx_shard_entry_commit(s, i, &seq, &tomb), 0);
        assert_true(seq == cm_seqs[i]);
        assert_int_equal(tomb, cm_lens[i] == 0);
        uint32_t idx = 99;
        assert_int_equal(kvx_shard_find(&idx, s, e.coordinate), 0);
        assert_int_equal(idx, i);
        const void *p = (const void *)1;
        if (cm_lens[i] == 0) {
            assert_int_equal(e.bytes, 0);
            assert_int_equal(e.offset, 0);
            assert_int_equal(e.crc32, 0);
            assert_int_equal(kvx_shard_page(&p, s, i, 1), KVX_ENOTFOUND);
            assert_null(p);
            char msg[64];
            snprintf(msg, sizeof msg, "entry %u", i);
            assert_non_null(strstr(kvx_last_error(), msg));
            assert_non_null(strstr(kvx_last_error(), "tombstone"));
            p = (const void *)1;
            assert_int_equal(kvx_shard_page(&p, s, i, 0), KVX_ENOTFOUND);
            assert_null(p);
            p = (const void *)1;
            assert_int_equal(kvx_shard_page_checked(&p, s, i), KVX_ENOTFOUND);
            assert_null(p);
        } else {
            assert_int_equal(e.bytes, cm_lens[i]);
            assert_true(e.offset >= info->kv_data_offset);
            assert_int_equal(kvx_shard_page(&p, s, i, 1), 0);
            cm_page(want, cm_lens[i], i);
            assert_memory_equal(p, want, cm_lens[i]);
            assert_int_equal(kvx_shard_page_checked(&p, s, i), 0);
        }
    }
    uint32_t bad = 77;
    assert_int_equal(kvx_shard_verify(s, &bad, NULL, NULL), 0);
    assert_int_equal(bad, 0);
    /* bad index, NULL shard; NULL outputs are fine */
    assert_int_equal(kvx_shard_entry_commit(s, CM_N, NULL, NULL), KVX_EINVALID);
    assert_int_equal(kvx_shard_entry_commit(NULL, 0, NULL, NULL), KVX_EINVALID);
    assert_int_equal(kvx_shard_entry_commit(s, 0, NULL, NULL), 0);
    kvx_shard_close(s);

    /* a block shard (every block table and the bundle) with sequence numbers */
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS | KVX_FLAG_SEQ, 1);
    kvx_shard_writer_options bo = options(&f);
    assert_int_equal(kvx_shard_writer_create(&w, path_of("b.kvx"), &bo), 0);
    for (int i = 0; i < NENT; i++) {
        kvx_entry_in e = entry_in(&f, i);
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
        kvx_shard_writer_seq_unset(w, 1000u + (uint64_t)i); /* one commit per entry */
    }
    assert_int_equal(kvx_shard_writer_set_seq(w, 3, 7), 0); /* any order: the smallest is 7 */
    assert_int_equal(kvx_shard_writer_seal(w), 0);
    assert_int_equal(kvx_shard_open(&s, path_of("b.kvx"), KVX_OPEN_VERIFY_PAGES), 0);
    check_fixture(&f, s);
    for (uint32_t i = 0; i < NENT; i++) {
        uint64_t seq;
        int tomb = -1;
        assert_int_equal(kvx_shard_entry_commit(s, i, &seq, &tomb), 0);
        assert_true(seq == (i == 3 ? 7 : 1000u + i));
        assert_int_equal(tomb, 0);
    }
    assert_int_equal(kvx_shard_min_seq(s), 7);
    kvx_shard_close(s);

    /* without the tables: 0 and 0 */
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 0);
    assert_int_equal(write_fixture(&f, path_of("n.kvx")), 0);
    assert_int_equal(kvx_shard_open(&s, path_of("n.kvx"), 0), 0);
    uint64_t seq = 5;
    int tomb = 5;
    assert_int_equal(kvx_shard_entry_commit(s, 0, &seq, &tomb), 0);
    assert_true(seq == 0);
    assert_int_equal(tomb, 0);
    assert_int_equal(kvx_shard_min_seq(s), 0);
    kvx_shard_close(s);
}

/* The writer's refusals: options mixing the tables wrongly; a tombstone
 * without a tombstone table, with a bad key, a used coordinate or no room;
 * a sequence number 0, out of range or without a table. */
/* PROMISE: FORMAT-18 */
static void test_commit_writer_refusals(void **state)
{
    (void)state;
    const char *path = path_of("w.kvx");
    kvx_shard_writer *w = NULL;
    static const uint32_t bad_flags[] = {
        KVX_FLAG_TOMB | KVX_FLAG_SEQ,                         /* without keys */
        KVX_FLAG_TOMB | KVX_FLAG_KEYS,                        /* without seq */
        KVX_FLAG_TOMB,                                        /* neither */
        KVX_FLAG_KEYS | KVX_FLAG_SEQ | KVX_FLAG_SCALES,       /* keys mix only with seq and tomb */
        0x100u,                                               /* bit 8 */
    };
    for (size_t k = 0; k < sizeof bad_flags / sizeof bad_flags[0]; k++) {
        kvx_shard_writer_options o = cm_options(bad_flags[k]);
        assert_int_equal(kvx_shard_writer_create(&w, path, &o), KVX_EINVALID);
        assert_null(w);
    }
    /* a block writer with SEQ: no tombstones */
    kvx_shard_writer_options o = cm_options(KVX_FLAG_KEYS | KVX_FLAG_SEQ);
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    assert_int_equal(kvx_shard_writer_add_tombstone(w, 1, "k", 1), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "tombstone table"));
    kvx_shard_writer_abort(w);
    /* a writer without SEQ: no sequence numbers */
    o = cm_options(KVX_FLAG_KEYS);
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    static uint8_t page[CM_PB];
    kvx_entry_in e;
    memset(&e, 0, sizeof e);
    e.token_count = 1;
    e.page = page;
    e.key = "k";
    e.key_len = 1;
    e.page_len = 1;
    assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    assert_int_equal(kvx_shard_writer_set_seq(w, 0, 1), KVX_EINVALID);
    kvx_shard_writer_seq_unset(w, 1); /* nothing to do */
    kvx_shard_writer_abort(w);

    o = cm_options(CM_FLAGS);
    o.max_entries = 3;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    char longkey[KVX_KEY_MAX + 1];
    memset(longkey, 'k', sizeof longkey);
    assert_int_equal(kvx_shard_writer_add_tombstone(w, 1, "k", 0), KVX_EINVALID);
    assert_int_equal(kvx_shard_writer_add_tombstone(w, 1, NULL, 1), KVX_EINVALID);
    assert_int_equal(kvx_shard_writer_add_tombstone(w, 1, longkey, KVX_KEY_MAX + 1), KVX_EINVALID);
    assert_int_equal(kvx_shard_writer_add_tombstone(NULL, 1, "k", 1), KVX_EINVALID);
    assert_int_equal(kvx_shard_writer_count(w), 0);
    assert_int_equal(kvx_shard_writer_add_tombstone(w, 1, longkey, KVX_KEY_MAX), 0); /* 255 bytes: fine */
    assert_int_equal(kvx_shard_writer_add_tombstone(w, 1, "k", 1), KVX_EDUPLICATE);
    e.radix_block = 1;
    assert_int_equal(kvx_shard_writer_add(w, &e), KVX_EDUPLICATE); /* a page at a tombstone's coordinate */
    e.radix_block = 2;
    assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    assert_int_equal(kvx_shard_writer_add_tombstone(w, 3, "k", 1), 0);
    assert_int_equal(kvx_shard_writer_add_tombstone(w, 4, "k", 1), KVX_EFULL);
    assert_int_equal(kvx_shard_writer_count(w), 3);
    assert_int_equal(kvx_shard_writer_set_seq(w, 0, 0), KVX_EINVALID);
    assert_int_equal(kvx_shard_writer_set_seq(w, 3, 1), KVX_EINVALID); /* index >= count */
    assert_int_equal(kvx_shard_writer_set_seq(NULL, 0, 1), KVX_EINVALID);
    assert_int_equal(kvx_shard_writer_set_seq(w, 2, 5), 0);
    kvx_shard_writer_seq_unset(w, 0); /* 0 is no sequence number: nothing set */
    kvx_shard_writer_seq_unset(NULL, 1);
    assert_int_equal(kvx_shard_writer_max(NULL), 0);
    assert_int_equal(kvx_shard_writer_max(w), 3);
    kvx_shard_writer_abort(w);
    assert_int_equal(dir_entries(), 0);
}

/* A seal (plain or staged) of a SEQ file with a sequence number still 0
 * is KVX_EINVALID naming the entry, and leaves no file; once every entry
 * has one, the same entries seal. */
/* PROMISE: FORMAT-18 */
static void test_seal_refuses_unset_seq(void **state)
{
    (void)state;
    const char *path = path_of("s.kvx");
    for (int staged = 0; staged < 2; staged++) {
        kvx_shard_writer_options o = cm_options(CM_FLAGS);
        o.staging_dir = staged ? tmpdir : NULL;
        kvx_shard_writer *w;
        assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
        cm_add_entries(w);
        kvx_shard_writer_seq_unset(w, 4);
        static uint8_t page[CM_PB];
        kvx_entry_in e;
        memset(&e, 0, sizeof e);
        e.radix_block = 50;
        e.token_count = 1;
        e.page = page;
        e.key = "late";
        e.key_len = 4;
        e.page_len = 10;
        assert_int_equal(kvx_shard_writer_add(w, &e), 0); /* after the commit: seq 0 */
        char name[256];
        int rc = staged ? kvx_shard_writer_seal_staged(w, name, sizeof name) : kvx_shard_writer_seal(w);
        assert_int_equal(rc, KVX_EINVALID);
        assert_non_null(strstr(kvx_last_error(), "entry 5"));
        assert_non_null(strstr(kvx_last_error(), "sequence number"));
        assert_int_equal(dir_entries(), 0);
        assert_int_equal(access(path, F_OK), -1);
    }
    cm_write(path); /* every entry numbered: seals */
    assert_int_equal(dir_entries(), 1);
}

/* Offsets in the file of cm_write: header, CM_N coordinate entries, the
 * key table, the sequence table, the tombstone table. */
static const size_t c_entry = 64, c_seq = 64 + CM_N * 24 + CM_N * KVX_KEY_RECORD, c_tomb = c_seq + CM_N * 8;

/* Recomputes meta_crc32c for the (possibly edited) header's layout. */
static void fix_meta_crc(uint8_t *b, size_t len)
{
    kvx_shard_header h;
    kvx_header_decode(&h, b);
    kvx_shard_layout lay = {0};
    assert_int_equal(kvx_shard_layout_for(&lay, h.num_blocks, h.flags, h.block_tokens, h.num_layers,
                                          h.kv_heads), 0);
    assert_true(lay.tables_end <= len);
    uint32_t crc = kvx_crc32c(kvx_crc32c(0, b, 60), b + 64, lay.tables_end - 64);
    kvx_store32(b + 60, crc);
}

typedef struct patch {
    const char *name;
    size_t off;   /* where the value goes */
    int width;    /* 1, 4 or 8 bytes */
    uint64_t value;
    int fix_crc;  /* the meta CRC made right again */
    size_t cut;   /* 0, or the file's new length */
    int code;
    const char *msg; /* in the message */
} patch;

/* Each reader rule of the commit records, on the sealed file of
 * commit_shard with one field changed and the meta CRC made right again
 * (so the rule, not the CRC, refuses it), each with its code and a message
 * naming the entry or the flags; a table past the end of a cut file is
 * KVX_ETRUNC; bit 8 is refused; a changed sequence number with the old CRC
 * is a meta CRC mismatch. */
/* PROMISE: FORMAT-19 */
static void test_commit_reader_refusals(void **state)
{
    (void)state;
    const char *path = path_of("r.kvx");
    cm_write(path);
    size_t len;
    uint8_t *base = read_file(path, &len);
    assert_int_equal(kvx_load64(base + c_seq + 8), 11); /* where the tables are */
    assert_int_equal(base[c_tomb + 1], 1);
    const uint32_t flags = CM_FLAGS | KVX_FLAG_META_CRC;
    const patch cases[] = {
        {"seq 0", c_seq + 2 * 8, 8, 0, 1, 0, KVX_EFORMAT, "entry 2: sequence number 0"},
        {"seq 0 of a tombstone", c_seq + 1 * 8, 8, 0, 1, 0, KVX_EFORMAT, "entry 1: sequence number 0"},
        {"tomb byte 2", c_tomb + 3, 1, 2, 1, 0, KVX_EFORMAT, "entry 3: tombstone byte 2"},
        {"tomb byte 255", c_tomb + 0, 1, 255, 1, 0, KVX_EFORMAT, "entry 0: tombstone byte 255"},
        {"tombstone with bytes", c_entry + 1 * 24 + 16, 4, 1, 1, 0, KVX_EPAGE, "entry 1: a tombstone"},
        {"tombstone with offset", c_entry + 4 * 24 + 8, 8, 4096, 1, 0, KVX_EPAGE, "entry 4: a tombstone"},
        {"tombstone with crc", c_entry + 4 * 24 + 20, 4, 0x1234, 1, 0, KVX_EPAGE, "entry 4: a tombstone"},
        {"tombstone with 2 tokens", c_entry + 1 * 24 + 4, 4, 2, 1, 0, KVX_ETOKENS, "entry 1: a keyed tombstone"},
        {"page marked a tombstone", c_tomb + 0, 1, 1, 1, 0, KVX_EPAGE, "entry 0: a tombstone"},
        {"tombstone key length 0", 64 + CM_N * 24 + 1 * KVX_KEY_RECORD, 1, 0, 1, 0, KVX_EFORMAT, "entry 1: key length 0"},
        {"tomb without keys", 56, 4, flags & ~KVX_FLAG_KEYS, 1, 0, KVX_EFORMAT, "without a key table (bit5)"},
        {"tomb without seq", 56, 4, flags & ~KVX_FLAG_SEQ, 1, 0, KVX_EFORMAT, "without a sequence table (bit6)"},
        {"keys and seq with scales", 56, 4, flags | KVX_FLAG_SCALES, 1, 0, KVX_EFORMAT, "mixes"},
        {"bit 8", 56, 4, flags | 0x100u, 1, 0, KVX_EFORMAT, "unknown flags bits 0x100"},
        {"seq changed, CRC not", c_seq + 0, 8, 3, 0, 0, KVX_EMETACRC, "meta_crc32c"},
        {"tomb changed, CRC not", c_tomb + 2, 1, 1, 0, 0, KVX_EMETACRC, "meta_crc32c"},
        {"cut inside the seq table", 0, 0, 0, 0, c_seq + 12, KVX_ETRUNC, "sequence table"},
        {"cut inside the tomb table", 0, 0, 0, 0, c_tomb + 2, KVX_ETRUNC, "tombstone table"},
        {"unchanged", 56, 4, flags, 1, 0, KVX_OK, ""},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const patch *c = &cases[k];
        uint8_t *b = malloc(len);
        memcpy(b, base, len);
        if (c->width == 1) b[c->off] = (uint8_t)c->value;
        else if (c->width == 4) kvx_store32(b + c->off, (uint32_t)c->value);
        else if (c->width == 8) kvx_store64(b + c->off, c->value);
        if (c->fix_crc) fix_meta_crc(b, len);
        int rc = open_bytes(b, c->cut ? c->cut : len);
        if (rc != c->code)
            fail_msg("case \"%s\": got %s (%s), expected %s", c->name, kvx_err_name(rc), kvx_last_error(),
                     kvx_err_name(c->code));
        if (rc && !strstr(kvx_last_error(), c->msg))
            fail_msg("case \"%s\": message \"%s\" does not name \"%s\"", c->name, kvx_last_error(), c->msg);
        free(b);
    }
    free(base);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_commit_round_trip, fx_clean),
        cmocka_unit_test_setup(test_commit_writer_refusals, fx_clean),
        cmocka_unit_test_setup(test_seal_refuses_unset_seq, fx_clean),
        cmocka_unit_test_setup(test_commit_reader_refusals, fx_clean),
    };
    return cmocka_run_group_tests_name("format/commit", tests, fx_setup, fx_teardown);
}
