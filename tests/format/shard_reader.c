/*
 * shard_reader.c - format/shard_reader.c: every validation rule of the
 * reader (a valid file with the bytes of one field changed; the meta CRC
 * fixed up where the rule under test lies behind it), page CRCs (alone
 * and in a run), the SIGBUS guard (a file truncated after open reads as a
 * CRC failure, not a crash; a foreign SIGBUS is not swallowed), reference
 * counting and threads, open errors and read faults, and the fuzz corpus.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/sigbus.h"
#include "format/format.h"
#include "format/shard_format.h"
#include "kvx.h"
#include "lib/shard.h"

static void test_refcount(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
    const char *path = path_of("r.kvx");
    assert_int_equal(write_fixture(&f, path), 0);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, 0), 0);
    assert_ptr_equal(kvx_shard_ref(s), s);
    kvx_shard_close(s);
    /* still held once: everything works (ASan would flag a use after free) */
    check_fixture(&f, s);
    kvx_shard_close(s);
    kvx_shard_close(NULL);
    assert_null(kvx_shard_ref(NULL));
}

/* Concurrent readers on one handle, with references taken and dropped. */
static void *reader_thread(void *arg)
{
    kvx_shard *s = arg; /* a reference taken for this thread */
    int bad = 0;
    for (int round = 0; round < 50; round++)
        for (uint32_t i = 0; i < NENT; i++) {
            const void *p;
            kvx_entry e;
            uint32_t idx;
            bad |= kvx_shard_page(&p, s, i, 1) != 0;
            bad |= kvx_shard_entry(&e, s, i) != 0;
            bad |= kvx_shard_find(&idx, s, e.coordinate) != 0 || idx != i;
        }
    kvx_shard_close(s);
    return (void *)(intptr_t)bad;
}

static void test_threads(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
    const char *path = path_of("t.kvx");
    assert_int_equal(write_fixture(&f, path), 0);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, 0), 0);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&th[i], NULL, reader_thread, kvx_shard_ref(s)), 0);
    kvx_shard_close(s); /* the threads keep it alive */
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        assert_null(r);
    }
}

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

typedef struct layout_info {
    kvx_shard_header h;
    kvx_shard_layout lay;
} layout_info;

static layout_info layout_of(const uint8_t *b)
{
    layout_info li;
    kvx_header_decode(&li.h, b);
    kvx_shard_layout_for(&li.lay, li.h.num_blocks, li.h.flags, li.h.block_tokens, li.h.num_layers,
                         li.h.kv_heads);
    return li;
}

static uint8_t *entry_at(uint8_t *b, int i) { return b + 64 + (size_t)i * 24; }

typedef void (*mutator)(uint8_t *b, size_t *len);

static void m_magic(uint8_t *b, size_t *len) { (void)len; b[3] = 'Y'; }

static void m_version(uint8_t *b, size_t *len) { (void)len; kvx_store16(b + 8, 0x0200); }

static void m_quant(uint8_t *b, size_t *len) { (void)len; kvx_store32(b + 32, 4); }

/* quant_format set with the meta CRC made right, so only the value decides */
static void m_quant_bf16(uint8_t *b, size_t *len) { kvx_store32(b + 32, KVX_QUANT_BF16); fix_meta_crc(b, *len); }

static void m_quant_5(uint8_t *b, size_t *len) { kvx_store32(b + 32, 5); fix_meta_crc(b, *len); }

static void m_quant_255(uint8_t *b, size_t *len) { kvx_store32(b + 32, 255); fix_meta_crc(b, *len); }

static void m_zero_layers(uint8_t *b, size_t *len) { (void)len; kvx_store16(b + 10, 0); }

static void m_zero_dim(uint8_t *b, size_t *len) { (void)len; kvx_store16(b + 14, 0); }

static void m_unknown_flag(uint8_t *b, size_t *len) { (void)len; kvx_store32(b + 56, kvx_load32(b + 56) | 0x100); }

static void m_lineage_no_hash(uint8_t *b, size_t *len) { (void)len; kvx_store32(b + 56, kvx_load32(b + 56) & ~KVX_FLAG_HASHES); }

static void m_hash_no_b(uint8_t *b, size_t *len) { (void)len; kvx_store32(b + 20, 0); }

static void m_too_many(uint8_t *b, size_t *len) { (void)len; kvx_store32(b + 16, KVX_MAX_ENTRIES + 1); }

static void m_kv_align(uint8_t *b, size_t *len) { (void)len; kvx_store64(b + 48, kvx_load64(b + 48) + 64); }

static void m_spec_align(uint8_t *b, size_t *len) { (void)len; kvx_store64(b + 40, kvx_load64(b + 40) + 4); }

static void m_spec_dim_only(uint8_t *b, size_t *len) { (void)len; kvx_store64(b + 40, 0); }

static void m_page_align(uint8_t *b, size_t *len) { (void)len; uint8_t *e = entry_at(b, 1); kvx_store64(e + 8, kvx_load64(e + 8) + 64); fix_meta_crc(b, *len); }

static void m_spec_in_tables(uint8_t *b, size_t *len) { (void)len; kvx_store64(b + 40, 64); }

static void m_kv_in_tables(uint8_t *b, size_t *len) { (void)len; kvx_store64(b + 48, 0); }

static void m_pages_overlap(uint8_t *b, size_t *len)
{
    /* entries 0 and 1 are both full blocks: point 1 at 0's page */
    memcpy(entry_at(b, 1) + 8, entry_at(b, 0) + 8, 8);
    fix_meta_crc(b, *len);
}

static void m_trunc_tables(uint8_t *b, size_t *len) { (void)b; *len = 64 + 24 * 2; }

static void m_trunc_header(uint8_t *b, size_t *len) { (void)b; *len = 40; }

static void m_trunc_magic(uint8_t *b, size_t *len) { (void)b; *len = 5; }

static void m_trunc_kv(uint8_t *b, size_t *len) { *len = (size_t)kvx_load64(b + 48) - 4096; }

static void m_trunc_page(uint8_t *b, size_t *len) { (void)b; *len -= 4096; }

 /* last page gone */
static void m_overflow(uint8_t *b, size_t *len)
{
    /* only a coordinate table here (no flags but META_CRC): huge dims and
     * token count make 2*L*Hkv*N*D*elem overflow 64 bits */
    kvx_store16(b + 10, 65535);
    kvx_store16(b + 12, 65535);
    kvx_store16(b + 14, 65535);
    kvx_store32(entry_at(b, 0) + 4, 0xFFFFFFFFu);
    fix_meta_crc(b, *len);
}

static void m_page_size(uint8_t *b, size_t *len) { uint8_t *e = entry_at(b, 2); kvx_store32(e + 16, kvx_load32(e + 16) + 1); fix_meta_crc(b, *len); }

static void m_page_outside(uint8_t *b, size_t *len) { uint8_t *e = entry_at(b, 2); kvx_store64(e + 8, 1u << 30); fix_meta_crc(b, *len); }

static void m_tokens_zero(uint8_t *b, size_t *len) { kvx_store32(entry_at(b, 3) + 4, 0); fix_meta_crc(b, *len); }

static void m_tokens_over_b(uint8_t *b, size_t *len) { kvx_store32(entry_at(b, 3) + 4, BT + 1); fix_meta_crc(b, *len); }

/* A scale that is not finite and > 0 in the scale table (meta CRC valid):
 * found by the shard fuzzer (an FP8 shard with a NaN scale exported a v2
 * envelope every reader refuses). */
static void m_scale_nan(uint8_t *b, size_t *len)
{
    layout_info li = layout_of(b);
    uint32_t nan_bits = 0xFFC00000u;
    kvx_store32(b + li.lay.scale_off + 4 * 3, nan_bits);
    fix_meta_crc(b, *len);
}

static void m_scale_zero(uint8_t *b, size_t *len)
{
    layout_info li = layout_of(b);
    kvx_store32(b + li.lay.scale_off, 0);
    fix_meta_crc(b, *len);
}

static void m_hash_partial(uint8_t *b, size_t *len)
{
    layout_info li = layout_of(b);
    kvx_store64(b + li.lay.hash_off + 3 * 8, 0x1234); /* entry 3 is partial */
    fix_meta_crc(b, *len);
}

static void m_lineage_token(uint8_t *b, size_t *len)
{
    layout_info li = layout_of(b);
    uint8_t *rec = b + li.lay.lineage_off + 1 * li.lay.lineage_rec;
    kvx_store32(rec + 8, kvx_load32(rec + 8) + 1);
    fix_meta_crc(b, *len);
}

static void m_lineage_parent(uint8_t *b, size_t *len)
{
    layout_info li = layout_of(b);
    kvx_store64(b + li.lay.lineage_off + 0 * li.lay.lineage_rec, 42);
    fix_meta_crc(b, *len);
}

static void m_lineage_tail(uint8_t *b, size_t *len)
{
    layout_info li = layout_of(b);
    uint8_t *rec = b + li.lay.lineage_off + 3 * li.lay.lineage_rec; /* 2 of 4 tokens */
    kvx_store32(rec + 8 + 3 * 4, 9);
    fix_meta_crc(b, *len);
}

static void m_duplicate(uint8_t *b, size_t *len) { memcpy(entry_at(b, 2), entry_at(b, 0), 4); fix_meta_crc(b, *len); }

static void m_shard_id(uint8_t *b, size_t *len) { entry_at(b, 2)[3] ^= 1; fix_meta_crc(b, *len); }

static void m_meta(uint8_t *b, size_t *len) { (void)len; b[24] ^= 1; }

 /* model signature */
static void m_meta_table(uint8_t *b, size_t *len)
{
    (void)len;
    layout_info li = layout_of(b);
    b[li.lay.scale_off + 5] ^= 0x40; /* a scale: only the meta CRC covers it */
}

static void m_spec_crc(uint8_t *b, size_t *len) { (void)len; b[kvx_load64(b + 40) + 32 + 8] ^= 1; }

static void m_spec_dim(uint8_t *b, size_t *len) { kvx_store32(b + 36, D + 1); fix_meta_crc(b, *len); }

static void m_spec_count(uint8_t *b, size_t *len) { (void)len; kvx_store32(b + kvx_load64(b + 40), 0); }

static void m_spec_layers(uint8_t *b, size_t *len) { (void)len; kvx_store32(b + kvx_load64(b + 40) + 4, 1); }

 /* 1 + 2 > L */
static void m_spec_reserved(uint8_t *b, size_t *len) { (void)len; b[kvx_load64(b + 40) + 30] = 1; }

/* Fields at their extremes. */
static void m_max_blocks_tiny(uint8_t *b, size_t *len)
{
    /* the tables of 65536 entries end at 1.5 MiB; the file is 4096 bytes */
    kvx_store32(b + 16, KVX_MAX_ENTRIES);
    kvx_store64(b + 48, (64 + 24ull * KVX_MAX_ENTRIES + 4095) / 4096 * 4096);
    *len = 4096;
}

static void m_page_offset_top(uint8_t *b, size_t *len)
{
    kvx_store64(entry_at(b, 2) + 8, 0xFFFFFFFFFFFFF000ull); /* + kv_data_offset wraps */
    fix_meta_crc(b, *len);
}

static void m_kv_offset_top(uint8_t *b, size_t *len) { kvx_store64(b + 48, 0xFFFFFFFFFFFFF000ull); fix_meta_crc(b, *len); }

static void m_spec_offset_top(uint8_t *b, size_t *len) { kvx_store64(b + 40, 0xFFFFFFFFFFFFFFC0ull); fix_meta_crc(b, *len); }

static void m_spec_size_overflows(uint8_t *b, size_t *len)
{
    /* dim = rank = 2^32-1: n_layers*dim*rank*4 does not fit 64 bits */
    uint8_t *sh = b + kvx_load64(b + 40);
    kvx_store32(b + 36, 0xFFFFFFFFu);
    kvx_store32(sh + 12, 0xFFFFFFFFu);
    kvx_store32(sh + 16, 0xFFFFFFFFu);
    fix_meta_crc(b, *len);
}

static void m_spec_size_huge(uint8_t *b, size_t *len)
{
    /* fits 64 bits but runs far past the KV section and the file */
    uint8_t *sh = b + kvx_load64(b + 40);
    kvx_store32(b + 36, 1u << 20);
    kvx_store32(sh + 12, 1u << 20);
    kvx_store32(sh + 16, 1u << 20);
    fix_meta_crc(b, *len);
}

static void m_spec_into_kv(uint8_t *b, size_t *len)
{
    /* move the bundle so that it runs into the KV section */
    uint64_t so = kvx_load64(b + 40), kv = kvx_load64(b + 48);
    layout_info li = layout_of(b);
    uint64_t blen = 32 + 2 * (8 + 4ull * L * D * 2);
    uint64_t to = kv - 64;
    assert_true(to > li.lay.tables_end && to + blen > kv);
    uint8_t tmp[1024];
    assert_true(blen <= sizeof tmp);
    memcpy(tmp, b + so, blen);
    memset(b + so, 0, blen);
    memcpy(b + to, tmp, 64); /* only the sub-header matters before the overlap check */
    kvx_store64(b + 40, to);
    fix_meta_crc(b, *len);
}

static void m_no_meta_flag(uint8_t *b, size_t *len)
{
    /* a spec-only writer: flags 0, reserved zero: still a valid file */
    (void)len;
    kvx_store32(b + 56, 0);
    kvx_store32(b + 60, 0);
}

/* PROMISE: TRUST-7, FORMAT-9 */
static void test_validation_rules(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int all_tables; /* 1: E4M3, hashes+lineage+scales+spectral; 0: E4M3, no tables;
                           2: FP16, hashes+lineage+spectral (2-byte elements, no scale table) */
        mutator m;
        int code;
    } cases[] = {
        {"magic", 1, m_magic, KVX_EMAGIC},
        {"version", 1, m_version, KVX_EVERSION},
        {"quant 4", 1, m_quant, KVX_EQUANT},
        {"quant 5", 1, m_quant_5, KVX_EQUANT},
        {"quant 255", 1, m_quant_255, KVX_EQUANT},
        {"quant 5, no tables", 0, m_quant_5, KVX_EQUANT},
        /* 3 is BF16 (the kvx extension): an FP16 file's pages are BF16's size */
        {"quant 3 (BF16) opens", 2, m_quant_bf16, KVX_OK},
        {"zero layers", 1, m_zero_layers, KVX_EFORMAT},
        {"zero head_dim", 1, m_zero_dim, KVX_EFORMAT},
        {"unknown flag", 1, m_unknown_flag, KVX_EFORMAT},
        {"lineage without hashes", 1, m_lineage_no_hash, KVX_EFORMAT},
        {"hashes without block_tokens", 1, m_hash_no_b, KVX_EFORMAT},
        {"num_blocks > 65536", 1, m_too_many, KVX_EFORMAT},
        {"kv_data_offset alignment", 1, m_kv_align, KVX_EALIGN},
        {"spectral_offset alignment", 1, m_spec_align, KVX_EALIGN},
        {"page offset alignment", 1, m_page_align, KVX_EALIGN},
        {"spectral dim without offset", 1, m_spec_dim_only, KVX_ESPECTRAL},
        {"spectral inside tables", 1, m_spec_in_tables, KVX_EOVERLAP},
        {"kv inside tables", 1, m_kv_in_tables, KVX_EOVERLAP},
        {"spectral runs into kv", 1, m_spec_into_kv, KVX_EOVERLAP},
        {"pages overlap", 1, m_pages_overlap, KVX_EOVERLAP},
        {"truncated: magic", 1, m_trunc_magic, KVX_ETRUNC},
        {"truncated: header", 1, m_trunc_header, KVX_ETRUNC},
        {"truncated: tables", 1, m_trunc_tables, KVX_ETRUNC},
        {"truncated: kv section", 1, m_trunc_kv, KVX_ETRUNC},
        /* a page past the end of the file is missing, not a refusal of the
         * file (DESIGN.md Validation; tests/engine/lookup.c test_missing_page) */
        {"truncated: last page", 1, m_trunc_page, KVX_OK},
        {"overflow", 0, m_overflow, KVX_EOVERFLOW},
        {"page size", 1, m_page_size, KVX_EPAGE},
        {"page outside kv", 1, m_page_outside, KVX_OK}, /* past the end: missing too */
        {"token_count 0", 1, m_tokens_zero, KVX_ETOKENS},
        {"token_count > B", 1, m_tokens_over_b, KVX_ETOKENS},
        {"hash on a partial block", 1, m_hash_partial, KVX_EHASH},
        {"scale NaN", 1, m_scale_nan, KVX_EFORMAT},
        {"scale 0", 1, m_scale_zero, KVX_EFORMAT},
        {"lineage token", 1, m_lineage_token, KVX_ELINEAGE},
        {"lineage parent", 1, m_lineage_parent, KVX_ELINEAGE},
        {"lineage token past count", 1, m_lineage_tail, KVX_ELINEAGE},
        {"duplicate coordinate", 1, m_duplicate, KVX_EDUPLICATE},
        {"shard byte", 1, m_shard_id, KVX_ESHARDID},
        {"meta crc: header", 1, m_meta, KVX_EMETACRC},
        {"meta crc: scale table", 1, m_meta_table, KVX_EMETACRC},
        {"spectral crc", 1, m_spec_crc, KVX_ESPECTRAL},
        {"spectral dim", 1, m_spec_dim, KVX_ESPECTRAL},
        {"spectral count", 1, m_spec_count, KVX_ESPECTRAL},
        {"spectral layers", 1, m_spec_layers, KVX_ESPECTRAL},
        {"spectral reserved", 1, m_spec_reserved, KVX_ESPECTRAL},
        {"num_blocks 65536, 4096-byte file", 0, m_max_blocks_tiny, KVX_ETRUNC},
        {"page offset near 2^64", 1, m_page_offset_top, KVX_EPAGE},
        {"kv_data_offset near 2^64", 1, m_kv_offset_top, KVX_ETRUNC},
        {"spectral_offset near 2^64", 1, m_spec_offset_top, KVX_EOVERLAP},
        {"spectral size overflows", 1, m_spec_size_overflows, KVX_EOVERFLOW},
        {"spectral size past the file", 1, m_spec_size_huge, KVX_EOVERLAP},
        {"no meta flag", 1, m_no_meta_flag, 0},
    };
    uint8_t *base[3];
    size_t base_len[3];
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, 0, 0);
    assert_int_equal(write_fixture(&f, path_of("base0.kvx")), 0);
    base[0] = read_file(path_of("base0.kvx"), &base_len[0]);
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
    assert_int_equal(write_fixture(&f, path_of("base1.kvx")), 0);
    base[1] = read_file(path_of("base1.kvx"), &base_len[1]);
    fixture_init(&f, KVX_QUANT_FP16, KVX_FLAG_HASHES | KVX_FLAG_LINEAGE, 1);
    assert_int_equal(write_fixture(&f, path_of("base2.kvx")), 0);
    base[2] = read_file(path_of("base2.kvx"), &base_len[2]);
    assert_int_equal(open_bytes(base[0], base_len[0]), 0);
    assert_int_equal(open_bytes(base[1], base_len[1]), 0);
    assert_int_equal(open_bytes(base[2], base_len[2]), 0);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int which = cases[k].all_tables;
        size_t len = base_len[which];
        uint8_t *b = malloc(len);
        memcpy(b, base[which], len);
        cases[k].m(b, &len);
        int rc = open_bytes(b, len);
        if (rc != cases[k].code)
            fail_msg("case \"%s\": got %s (%s), expected %s", cases[k].name, kvx_err_name(rc),
                     kvx_last_error(), kvx_err_name(cases[k].code));
        if (rc) assert_true(kvx_last_error()[0] != '\0');
        free(b);
    }
    free(base[0]);
    free(base[1]);
    free(base[2]);
}

/* A page altered on disk: open succeeds (structure is fine), the page read
 * with verify and kvx_shard_verify report it, the other pages stay usable. */
static void report_cb(void *ctx, uint32_t index, int code)
{
    int *seen = ctx;
    seen[index] = code;
    char want[32];
    snprintf(want, sizeof want, "entry %u", index);
    assert_non_null(strstr(kvx_last_error(), want)); /* the page's own message */
}

/* PROMISE: FORMAT-10 */
static void test_page_crc(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
    const char *path = path_of("p.kvx");
    assert_int_equal(write_fixture(&f, path), 0);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, 0), 0);
    kvx_entry e;
    assert_int_equal(kvx_shard_entry(&e, s, 2), 0);
    kvx_shard_close(s);
    int fd = open(path, O_WRONLY);
    uint8_t x = (uint8_t)(f.page[2][7] ^ 0x10);
    assert_int_equal(pwrite(fd, &x, 1, (off_t)e.offset + 7), 1);
    close(fd);
    assert_int_equal(kvx_shard_open(&s, path, KVX_OPEN_VERIFY_PAGES), KVX_EPAGECRC);
    assert_null(s);
    assert_int_equal(kvx_shard_open(&s, path, 0), 0);
    const void *p;
    assert_int_equal(kvx_shard_page(&p, s, 2, 1), KVX_EPAGECRC);
    assert_non_null(p);
    assert_int_equal(kvx_shard_page(&p, s, 2, 0), 0);
    assert_int_equal(kvx_shard_page(&p, s, 1, 1), 0);
    int seen[NENT] = {0};
    uint32_t bad = 0;
    assert_int_equal(kvx_shard_verify(s, &bad, report_cb, seen), KVX_EPAGECRC);
    assert_int_equal(bad, 1);
    assert_int_equal(seen[2], KVX_EPAGECRC);
    assert_int_equal(seen[0] | seen[1] | seen[3], 0);
    kvx_shard_close(s);
}

/* Pages checked in file order (a prefix's run: the reader then reads the
 * file ahead of the CRC pass): a page altered on disk after open, in the
 * middle of the run, is still refused, every time it is asked for, and
 * the pages around it pass. */
/* PROMISE: FORMAT-10 */
static void test_page_crc_in_a_run(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
    const char *path = path_of("run.kvx");
    assert_int_equal(write_fixture(&f, path), 0);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, 0), 0);
    kvx_entry e;
    assert_int_equal(kvx_shard_entry(&e, s, 2), 0);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    uint8_t x = (uint8_t)(f.page[2][0] ^ 0x01);
    assert_int_equal(pwrite(fd, &x, 1, (off_t)e.offset), 1); /* the shared mapping sees it */
    close(fd);
    const void *p;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < NENT; i++) {
            kvx_entry ei;
            assert_int_equal(kvx_shard_entry(&ei, s, i), 0);
            assert_int_equal(kvx_shard_page(&p, s, i, 1), i == 2 ? KVX_EPAGECRC : 0);
            if (i != 2) assert_memory_equal(p, f.page[i], ei.bytes);
        }
    }
    kvx_shard_close(s);
}

/* kvx_shard_willneed (a prefix lookup's whole run asked for at once)
 * checks nothing and hands nothing out: after it, a page altered on disk
 * is still refused and the others still pass their check and read back as
 * written; indices past the end, a NULL handle and pages already checked
 * are skipped. */
/* PROMISE: FORMAT-10 */
static void test_willneed_checks_nothing(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
    const char *path = path_of("hint.kvx");
    assert_int_equal(write_fixture(&f, path), 0);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, 0), 0);
    kvx_entry e;
    assert_int_equal(kvx_shard_entry(&e, s, 1), 0);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    uint8_t x = (uint8_t)(f.page[1][0] ^ 0x80);
    assert_int_equal(pwrite(fd, &x, 1, (off_t)e.offset), 1); /* the shared mapping sees it */
    close(fd);
    uint32_t idx[NENT + 2];
    for (uint32_t i = 0; i < NENT; i++) idx[i] = NENT - 1 - i; /* any order */
    idx[NENT] = NENT;                                          /* past the end */
    idx[NENT + 1] = UINT32_MAX;
    kvx_shard_willneed(NULL, idx, NENT + 2, 0);
    kvx_shard_willneed(s, NULL, 3, 0);
    for (int pass = 0; pass < 2; pass++) {
        kvx_shard_willneed(s, idx, NENT + 2, pass);
        const void *p;
        for (uint32_t i = 0; i < NENT; i++) {
            kvx_entry ei;
            assert_int_equal(kvx_shard_entry(&ei, s, i), 0);
            assert_int_equal(kvx_shard_page_checked(&p, s, i), i == 1 ? KVX_EPAGECRC : 0);
            if (i != 1) assert_memory_equal(p, f.page[i], ei.bytes);
        }
    }
    kvx_shard_close(s);
}

/* PROMISE: FORMAT-13 */
static void test_truncated_after_open(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
    const char *path = path_of("g.kvx");
    assert_int_equal(write_fixture(&f, path), 0);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, 0), 0);
    /* alter a page after open: the shared mapping sees it */
    kvx_entry e0;
    assert_int_equal(kvx_shard_entry(&e0, s, 0), 0);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    uint8_t x = (uint8_t)~f.page[0][0];
    assert_int_equal(pwrite(fd, &x, 1, (off_t)e0.offset), 1);
    const void *p;
    assert_int_equal(kvx_shard_page(&p, s, 0, 1), KVX_EPAGECRC);

    /* truncate to the start of the KV section: every page now lies past EOF */
    uint64_t faults = kvx_sigbus_faults();
    assert_int_equal(ftruncate(fd, (off_t)kvx_shard_get_info(s)->kv_data_offset), 0);
    close(fd);
    for (uint32_t i = 1; i < NENT; i++) {
        assert_int_equal(kvx_shard_page(&p, s, i, 1), KVX_EPAGECRC);
        assert_int_equal(((const uint8_t *)p)[0], 0); /* reads as zeros */
    }
    assert_true(kvx_sigbus_faults() > faults);
    uint32_t bad = 0;
    assert_int_equal(kvx_shard_verify(s, &bad, NULL, NULL), KVX_ETRUNC);
    assert_int_equal(bad, NENT);
    kvx_shard_close(s);
}

/* A SIGBUS outside kvx's mappings is not swallowed: a child that reads a
 * truncated mapping of its own dies of SIGBUS as it would without kvx. */
/* PROMISE: FORMAT-13 */
static void test_foreign_sigbus_not_swallowed(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
    const char *path = path_of("h.kvx");
    assert_int_equal(write_fixture(&f, path), 0);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, 0), 0); /* installs the guard */
    kvx_shard_close(s);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* cmocka catches SIGBUS during a test; start from the default
         * action and let a shard open put kvx's guard in front of it */
        signal(SIGBUS, SIG_DFL);
        kvx_shard *cs;
        if (kvx_shard_open(&cs, path, 0) != 0) _exit(5);
        int fd = open(path, O_RDWR);
        volatile const uint8_t *m = mmap(NULL, 3 * 4096, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED || ftruncate(fd, 0) != 0) _exit(3);
        int fd2 = open("/dev/null", O_WRONLY); /* keep ASan's report out of the log */
        dup2(fd2, 2);
        uint8_t v = m[2 * 4096];
        _exit(v == 0 ? 0 : 4); /* surviving the read is the failure */
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFSIGNALED(st)) fail_msg("child exited with %d instead of dying", WEXITSTATUS(st));
    assert_int_equal(WTERMSIG(st), SIGBUS);
}

/* PROMISE: DUR-17 */
static void test_open_errors(void **state)
{
    (void)state;
    kvx_shard *s = (kvx_shard *)state;
    assert_int_equal(kvx_shard_open(&s, path_of("missing.kvx"), 0), -ENOENT);
    assert_null(s);
    assert_int_equal(kvx_shard_open(&s, tmpdir, 0), KVX_EINVALID);
    assert_int_equal(kvx_shard_open(NULL, tmpdir, 0), KVX_EINVALID);
    assert_int_equal(kvx_shard_open(&s, NULL, 0), KVX_EINVALID);
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
    assert_int_equal(write_fixture(&f, path_of("x.kvx")), 0);
    assert_int_equal(kvx_shard_open(&s, path_of("x.kvx"), 0x80), KVX_EINVALID);
}

static void write_seeds(const char *dir)
{
    static const struct { const char *name; uint32_t quant, flags; int spectral; } seeds[] = {
        {"valid_plain_e4m3", KVX_QUANT_E4M3, 0, 0},
        {"valid_fp16_hashes", KVX_QUANT_FP16, KVX_FLAG_HASHES, 0},
        {"valid_fp16_lineage_spectral", KVX_QUANT_FP16, KVX_FLAG_HASHES | KVX_FLAG_LINEAGE, 1},
        {"valid_e4m3_all", KVX_QUANT_E4M3, ALL_FLAGS, 1},
        {"valid_e5m2_scales", KVX_QUANT_E5M2, KVX_FLAG_SCALES, 0},
    };
    char p[600];
    for (size_t k = 0; k < sizeof seeds / sizeof seeds[0]; k++) {
        fixture f;
        fixture_init(&f, seeds[k].quant, seeds[k].flags, seeds[k].spectral);
        snprintf(p, sizeof p, "%s/%s", dir, seeds[k].name);
        assert_int_equal(write_fixture(&f, p), 0);
    }
    fixture f;
    fixture_init(&f, KVX_QUANT_FP16, KVX_FLAG_HASHES, 0);
    kvx_shard_writer *w;
    kvx_shard_writer_options o = options(&f);
    snprintf(p, sizeof p, "%s/valid_empty", dir);
    assert_int_equal(kvx_shard_writer_create(&w, p, &o), 0);
    assert_int_equal(kvx_shard_writer_seal(w), 0);

    snprintf(p, sizeof p, "%s/valid_e4m3_all", dir);
    size_t len;
    uint8_t *b = read_file(p, &len);
    b[24] ^= 1; /* meta CRC no longer matches */
    snprintf(p, sizeof p, "%s/bad_meta_crc", dir);
    write_bytes(p, b, len);
    b[24] ^= 1;
    snprintf(p, sizeof p, "%s/bad_truncated_tables", dir);
    write_bytes(p, b, 200);
    /* cut inside the last page: the file opens, that page is missing */
    uint64_t last = 0;
    for (int i = 0; i < NENT; i++)
        if (kvx_load64(entry_at(b, i) + 8) > last) last = kvx_load64(entry_at(b, i) + 8);
    snprintf(p, sizeof p, "%s/missing_last_page", dir);
    write_bytes(p, b, (size_t)(kvx_load64(b + 48) + last + 1));
    free(b);

    /* psi of any finite size is valid, and steering with it overflows to
     * inf: the harness must consume such results without UB */
    fixture_init(&f, KVX_QUANT_FP16, KVX_FLAG_HASHES, 1);
    for (size_t k = 0; k < sizeof f.psi / sizeof f.psi[0]; k++) f.psi[k] = k % 3 ? FLT_MAX : -1e30f;
    snprintf(p, sizeof p, "%s/valid_spectral_huge_psi", dir);
    assert_int_equal(write_fixture(&f, p), 0);
}

/* PROMISE: FORMAT-9 */
static void test_corpus(void **state)
{
    (void)state;
    const char *out = getenv("KVX_SHARD_CORPUS_OUT");
    write_seeds(out && *out ? out : tmpdir);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/fuzz/corpus/shard", KVX_SOURCE_DIR);
    DIR *d = opendir(dir);
    if (!d) return; /* no committed corpus yet */
    struct dirent *e;
    int seen = 0;
    while ((e = readdir(d))) {
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        kvx_shard *s = NULL;
        if (!strncmp(e->d_name, "valid_", 6)) {
            if (kvx_shard_open(&s, p, KVX_OPEN_VERIFY_PAGES) != 0)
                fail_msg("seed %s: %s", e->d_name, kvx_last_error());
            kvx_shard_close(s);
            seen++;
        } else if (!strncmp(e->d_name, "bad_", 4)) {
            assert_true(kvx_shard_open(&s, p, 0) < 0);
            seen++;
        } else if (!strncmp(e->d_name, "missing_", 8)) {
            /* opens; verify names the one missing page */
            if (kvx_shard_open(&s, p, 0) != 0) fail_msg("seed %s: %s", e->d_name, kvx_last_error());
            uint32_t bad = 0;
            assert_int_equal(kvx_shard_verify(s, &bad, NULL, NULL), KVX_ETRUNC);
            assert_int_equal(bad, 1);
            kvx_shard_close(s);
            seen++;
        }
    }
    closedir(d);
    assert_true(seen > 0);
}

/* Read errors at open come back as they are (or as ETRUNC for a file that
 * shrank between fstat and read), with nothing leaked (ASan checks). */
static int pread_calls, pread_fail_at, pread_short;

static ssize_t f_pread(int fd, void *buf, size_t len, off_t off)
{
    pread_calls++;
    if (pread_fail_at && pread_calls == pread_fail_at) {
        errno = EIO;
        return -1;
    }
    if (pread_short && pread_calls == pread_short) return 0; /* end of file */
    return pread(fd, buf, len, off);
}

/* PROMISE: FORMAT-9 */
static void test_open_read_faults(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
    const char *path = path_of("rf.kvx");
    assert_int_equal(write_fixture(&f, path), 0);
    kvx_os.pread = f_pread;
    kvx_shard *s;
    /* count the reads of a clean open, then fail each one in turn */
    pread_calls = pread_fail_at = pread_short = 0;
    assert_int_equal(kvx_shard_open(&s, path, 0), 0);
    kvx_shard_close(s);
    int reads = pread_calls;
    assert_true(reads >= 3); /* header, tables, spectral sub-header and bundle */
    for (int k = 1; k <= reads; k++) {
        pread_calls = 0;
        pread_fail_at = k;
        pread_short = 0;
        assert_int_equal(kvx_shard_open(&s, path, 0), -EIO);
        assert_null(s);
        pread_calls = 0;
        pread_fail_at = 0;
        pread_short = k;
        assert_int_equal(kvx_shard_open(&s, path, 0), KVX_ETRUNC);
        assert_null(s);
    }
    kvx_os_reset();
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_refcount, fx_clean),
        cmocka_unit_test_setup(test_threads, fx_clean),
        cmocka_unit_test_setup(test_validation_rules, fx_clean),
        cmocka_unit_test_setup(test_page_crc, fx_clean),
        cmocka_unit_test_setup(test_page_crc_in_a_run, fx_clean),
        cmocka_unit_test_setup(test_willneed_checks_nothing, fx_clean),
        cmocka_unit_test_setup(test_truncated_after_open, fx_clean),
        cmocka_unit_test_setup(test_foreign_sigbus_not_swallowed, fx_clean),
        cmocka_unit_test_setup(test_open_errors, fx_clean),
        cmocka_unit_test_setup(test_open_read_faults, fx_clean),
        cmocka_unit_test_setup(test_corpus, fx_clean),
    };
    return cmocka_run_group_tests_name("format/shard_reader", tests, fx_setup, fx_teardown);
}
