/*
 * shard.h - the shard fixture: a small valid shard, as data (fixture:
 * fixture_init fills one, write_fixture writes it with the public shard
 * writer into tmpdir.h's directory, check_fixture checks an open shard
 * against it field by field and page by page), and the raw file steps the
 * reader's tests use (read_file, write_bytes, open_bytes). Include after
 * cmocka.h; white-box (fx_clean, a per-test setup, resets the OS seam).
 */
#ifndef KVX_SHARD_FIXTURE_H
#define KVX_SHARD_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/os.h"
#include "kvx.h"
#include "tmpdir.h"

/* A per-test setup: the OS seam as it was, and an empty directory. */
static inline int fx_clean(void **state)
{
    (void)state;
    kvx_os_reset();
    return fx_empty_dir();
}

/* ---- a small valid shard ------------------------------------------------ */

enum { L = 2, HKV = 2, D = 4, BT = 4, NENT = 4, SHARD = 7 };

#define NSCALES (L * 2 * HKV)

typedef struct fixture {
    kvx_geometry g;
    uint32_t flags;
    int spectral;
    uint16_t radix[NENT];
    uint8_t spec[NENT];
    uint32_t ntok[NENT];
    uint32_t tokens[NENT][BT];
    uint64_t hash[NENT], parent[NENT];
    float scales[NENT][NSCALES];
    uint8_t page[NENT][2 * L * HKV * BT * D * 2];
    uint32_t ids[2];
    float psi[2 * L * D * 2];
    kvx_spectral_in sp;
} fixture;

static uint32_t rng_state = 12345;

static inline uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static inline void fixture_init(fixture *f, uint32_t quant, uint32_t flags, int spectral)
{
    memset(f, 0, sizeof *f);
    f->g = (kvx_geometry){L, HKV, D, BT, quant, 0x1122334455667788ull};
    f->flags = flags;
    f->spectral = spectral;
    uint32_t ntok[NENT] = {BT, BT, BT, 2};
    uint64_t prev = 0;
    for (int i = 0; i < NENT; i++) {
        f->radix[i] = (uint16_t)(10 + i);
        f->spec[i] = (uint8_t)(i == 1 ? 3 : 0);
        f->ntok[i] = ntok[i];
        for (uint32_t t = 0; t < ntok[i]; t++) f->tokens[i][t] = 100u + (uint32_t)i * BT + t;
        f->parent[i] = prev;
        /* entries 0, 1: full blocks with their chained hash; 2: a full block
         * whose hash is unknown (0); 3: a partial tail (no hash). */
        uint64_t h = ntok[i] == BT ? kvx_block_hash(prev, f->tokens[i], BT) : 0;
        f->hash[i] = i < 2 ? h : 0;
        prev = h;
        for (int k = 0; k < NSCALES; k++) f->scales[i][k] = 0.25f + (float)i + 0.125f * (float)k;
        for (size_t b = 0; b < sizeof f->page[i]; b++) f->page[i][b] = (uint8_t)rnd();
    }
    f->ids[0] = 1;
    f->ids[1] = 7;
    for (size_t k = 0; k < sizeof f->psi / sizeof f->psi[0]; k++) f->psi[k] = (float)k * 0.5f - 3.0f;
    f->sp = (kvx_spectral_in){2, 0, L, D, 2, f->ids, f->psi};
}

static inline kvx_entry_in entry_in(const fixture *f, int i)
{
    kvx_entry_in e = {0};
    e.radix_block = f->radix[i];
    e.spectral = f->spec[i];
    e.token_count = f->ntok[i];
    e.page = f->page[i];
    e.hash = f->hash[i];
    e.parent = f->parent[i];
    e.tokens = f->tokens[i];
    e.scales = (f->flags & KVX_FLAG_SCALES) ? f->scales[i] : NULL;
    return e;
}

static inline kvx_shard_writer_options options(const fixture *f)
{
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = f->g;
    o.shard_id = SHARD;
    o.max_entries = 8;
    o.flags = f->flags;
    o.spectral = f->spectral ? &f->sp : NULL;
    return o;
}

static inline int write_fixture(const fixture *f, const char *path)
{
    kvx_shard_writer *w;
    kvx_shard_writer_options o = options(f);
    int rc = kvx_shard_writer_create(&w, path, &o);
    if (rc) return rc;
    for (int i = 0; i < NENT; i++) {
        kvx_entry_in e = entry_in(f, i);
        if ((rc = kvx_shard_writer_add(w, &e))) {
            kvx_shard_writer_abort(w);
            return rc;
        }
    }
    return kvx_shard_writer_seal(w);
}

#define ALL_FLAGS (KVX_FLAG_HASHES | KVX_FLAG_LINEAGE | KVX_FLAG_SCALES)

static inline void check_fixture(const fixture *f, kvx_shard *s)
{
    const kvx_shard_info *info = kvx_shard_get_info(s);
    assert_int_equal(info->num_blocks, NENT);
    assert_int_equal(info->shard_id, SHARD);
    assert_int_equal(info->geometry.num_layers, L);
    assert_int_equal(info->geometry.kv_heads, HKV);
    assert_int_equal(info->geometry.head_dim, D);
    assert_int_equal(info->geometry.block_tokens, BT);
    assert_int_equal(info->geometry.quant, f->g.quant);
    assert_true(info->geometry.model_signature == f->g.model_signature);
    assert_int_equal(info->format_version, KVX_FORMAT_VERSION);
    assert_int_equal(info->flags, f->flags | KVX_FLAG_META_CRC);
    assert_int_equal(info->kv_data_offset % 4096, 0);
    for (uint32_t i = 0; i < NENT; i++) {
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, s, i), 0);
        assert_int_equal(e.coordinate, KVX_COORD(SHARD, f->radix[i], f->spec[i]));
        assert_int_equal(e.token_count, f->ntok[i]);
        assert_int_equal(e.bytes, kvx_page_bytes(&f->g, f->ntok[i]));
        assert_int_equal(e.offset % 4096, 0);
        assert_true(e.offset >= info->kv_data_offset);
        assert_int_equal(e.crc32, kvx_crc32(0, f->page[i], e.bytes));
        if (f->flags & KVX_FLAG_HASHES) assert_true(e.hash == f->hash[i]);
        else assert_true(e.hash == 0);
        if (f->flags & KVX_FLAG_LINEAGE) {
            assert_true(e.parent == f->parent[i]);
            assert_non_null(e.tokens);
            for (uint32_t t = 0; t < BT; t++)
                assert_int_equal(e.tokens[t], t < f->ntok[i] ? f->tokens[i][t] : 0);
        } else {
            assert_null(e.tokens);
        }
        if (f->flags & KVX_FLAG_SCALES) {
            assert_non_null(e.scales);
            assert_memory_equal(e.scales, f->scales[i], sizeof f->scales[i]);
        } else {
            assert_null(e.scales);
        }
        const void *p;
        assert_int_equal(kvx_shard_page(&p, s, i, 1), 0);
        assert_memory_equal(p, f->page[i], e.bytes);
        uint32_t idx = 99;
        assert_int_equal(kvx_shard_find(&idx, s, e.coordinate), 0);
        assert_int_equal(idx, i);
    }
    uint32_t idx;
    assert_int_equal(kvx_shard_find(&idx, s, KVX_COORD(SHARD, 10, 1)), KVX_ENOTFOUND);
    assert_int_equal(kvx_shard_find(&idx, s, KVX_COORD(SHARD + 1, 10, 0)), KVX_ENOTFOUND);
    kvx_entry e;
    assert_int_equal(kvx_shard_entry(&e, s, NENT), KVX_EINVALID);
    uint32_t bad = 77;
    assert_int_equal(kvx_shard_verify(s, &bad, NULL, NULL), 0);
    assert_int_equal(bad, 0);
    kvx_spectral sp;
    if (f->spectral) {
        assert_int_equal(kvx_shard_spectral(&sp, s), 0);
        assert_int_equal(sp.n_cartridges, 2);
        assert_int_equal(sp.first_layer, 0);
        assert_int_equal(sp.n_layers, L);
        assert_int_equal(sp.dim, D);
        assert_int_equal(sp.rank, 2);
        assert_int_equal(sp.ids[0], 1);
        assert_int_equal(sp.ids[1], 7);
        assert_memory_equal(sp.psi, f->psi, sizeof f->psi);
        assert_int_equal(info->spectral_dim, D);
        assert_int_equal(info->spectral_offset % 64, 0);
    } else {
        assert_int_equal(kvx_shard_spectral(&sp, s), KVX_ENOTFOUND);
        assert_int_equal(info->spectral_offset, 0);
    }
}

/* ---- reader validation: one rule at a time -------------------------------- */

static inline uint8_t *read_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    *len = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *b = malloc(*len);
    assert_int_equal(fread(b, 1, *len, fp), *len);
    fclose(fp);
    return b;
}

static inline void write_bytes(const char *path, const uint8_t *b, size_t len)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(b, 1, len, fp), len);
    fclose(fp);
}

static inline int open_bytes(const uint8_t *b, size_t len)
{
    const char *path = path_of("m.kvx");
    write_bytes(path, b, len);
    kvx_shard *s = NULL;
    int rc = kvx_shard_open(&s, path, 0);
    if (rc == 0) kvx_shard_close(s);
    else assert_null(s);
    return rc;
}

#endif
