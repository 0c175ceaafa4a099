/*
 * store_config.c - the handle's fixed facts: the STORE file (format
 * version, kind, geometry, capacity, shard size; 64 bytes with a CRC-32C;
 * docs/FORMAT.md "STORE file"), the geometry rules, the sizes derived from
 * them, and the writer check every mutating call makes.
 *
 * Rule: a store's geometry and capacity never change after create; every
 * size the store computes derives from the STORE file alone.
 */
#include "store.h"

#include <errno.h>
#include <string.h>
#include <time.h>

uint64_t kvx_st_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void kvx_st_config_encode(uint8_t *b, const kvx_geometry *g, uint64_t cap, uint64_t target, uint32_t version)
{
    memset(b, 0, ST_CONFIG_BYTES);
    memcpy(b, "KVXSTORE", 8);
    /* the format version, then the kind: a keyed store (block_tokens 0)
     * has its page size at 56 */
    kvx_store16(b + 8, (uint16_t)version);
    kvx_store16(b + 10, g->block_tokens ? ST_STORE_BLOCKS : ST_STORE_KEYED);
    kvx_store32(b + 12, g->quant);
    kvx_store32(b + 16, g->num_layers);
    kvx_store32(b + 20, g->kv_heads);
    kvx_store32(b + 24, g->head_dim);
    kvx_store32(b + 28, g->block_tokens);
    kvx_store64(b + 32, g->model_signature);
    kvx_store64(b + 40, cap);
    kvx_store64(b + 48, target);
    if (!g->block_tokens) kvx_store32(b + 56, (uint32_t)kvx_page_bytes(g, 1));
    kvx_store32(b + 60, kvx_crc32c(0, b, 60));
}

int kvx_st_config_decode(const uint8_t *b, kvx_geometry *g, uint64_t *cap, uint64_t *target, uint32_t *out_version)
{
    if (memcmp(b, "KVXSTORE", 8) != 0) return kvx_fail(KVX_EMAGIC, "store: STORE file: bad magic");
    if (kvx_load32(b + 60) != kvx_crc32c(0, b, 60))
        return kvx_fail(KVX_ECORRUPT, "store: STORE file: checksum mismatch");
    /* the previous release wrote a u32 at 8, 1 (blocks) or 2 (keyed): its
     * high half, where the kind now is, is 0 */
    uint32_t version = kvx_load16(b + 8), kind = kvx_load16(b + 10);
    if (version == 1 || version == 2) {
        if (kind != 0) return kvx_fail(KVX_ECORRUPT, "store: STORE file: version %u with kind %u", version, kind);
        kind = version == 1 ? ST_STORE_BLOCKS : ST_STORE_KEYED;
    } else if (version != ST_STORE_VERSION && version != ST_STORE_SEQ_VERSION && version != ST_STORE_HOLES_VERSION) {
        return kvx_fail(KVX_EVERSION, "store: STORE file: version %u unknown (this kvx reads 1 to %u)", version,
                        ST_STORE_HOLES_VERSION);
    } else if (kind != ST_STORE_BLOCKS && kind != ST_STORE_KEYED) {
        return kvx_fail(KVX_EVERSION, "store: STORE file: kind %u unknown (0 blocks, 1 keyed)", kind);
    }
    g->quant = kvx_load32(b + 12);
    g->num_layers = kvx_load32(b + 16);
    g->kv_heads = kvx_load32(b + 20);
    g->head_dim = kvx_load32(b + 24);
    g->block_tokens = kvx_load32(b + 28);
    g->model_signature = kvx_load64(b + 32);
    *cap = kvx_load64(b + 40);
    *target = kvx_load64(b + 48);
    if (kind == ST_STORE_BLOCKS && g->block_tokens == 0)
        return kvx_fail(KVX_ECORRUPT, "store: STORE file: a block store (version %u) with block_tokens 0", version);
    if (kind == ST_STORE_KEYED) {
        /* a keyed store: its shards' synthetic geometry, page size 2*L*Hkv*D */
        uint32_t pb = kvx_load32(b + 56);
        kvx_geometry want;
        if (g->block_tokens != 0 || kvx_keyed_geometry(&want, pb) != 0 || want.num_layers != g->num_layers ||
            want.kv_heads != g->kv_heads || want.head_dim != g->head_dim || want.quant != g->quant ||
            g->model_signature != 0)
            return kvx_fail(KVX_ECORRUPT, "store: STORE file: a keyed store (version %u) but page_bytes %u and the "
                            "geometry disagree", version, pb);
    }
    if (out_version) *out_version = version;
    return 0;
}

int kvx_st_check_geometry(const kvx_geometry *g)
{
    if (g->num_layers == 0 || g->num_layers > 65535)
        return kvx_fail(KVX_EINVALID, "store: geometry.num_layers %u not in 1..65535", g->num_layers);
    if (g->kv_heads == 0 || g->kv_heads > 65535)
        return kvx_fail(KVX_EINVALID, "store: geometry.kv_heads %u not in 1..65535", g->kv_heads);
    if (g->head_dim == 0 || g->head_dim > 65535)
        return kvx_fail(KVX_EINVALID, "store: geometry.head_dim %u not in 1..65535", g->head_dim);
    if (g->block_tokens == 0 || g->block_tokens > 65535)
        return kvx_fail(KVX_EINVALID, "store: geometry.block_tokens %u not in 1..65535 (a store names blocks by chained hash)",
                        g->block_tokens);
    if (kvx_quant_elem_size(g->quant) == 0)
        return kvx_fail(KVX_EQUANT, "store: geometry.quant %u unknown", g->quant);
    uint64_t pb = kvx_page_bytes(g, g->block_tokens);
    if (pb == 0 || pb > UINT32_MAX)
        return kvx_fail(KVX_EOVERFLOW, "store: a block's page (2*L*Hkv*B*D*elem) exceeds 4 GiB");
    return 0;
}

/* Derived sizes: page, bytes one entry occupies in a shard, entries per shard. */
void kvx_st_sizes(kvx_store *s)
{
    const kvx_geometry *g = &s->g;
    s->keyed = g->block_tokens == 0;
    s->page_bytes = kvx_page_bytes(g, s->keyed ? 1 : g->block_tokens);
    s->nscales = (uint32_t)kvx_scale_count(g);
    uint64_t tables = 24 + 8 + 8 + 4ull * g->block_tokens;
    if (kvx_quant_is_fp8(g->quant) && !s->keyed) tables += 4ull * s->nscales;
    if (s->keyed) tables = 24 + KVX_KEY_RECORD;
    s->entry_bytes = kvx_align_up(s->page_bytes, 4096) + tables;
    uint64_t n = s->target / s->entry_bytes;
    if (n < 1) n = 1;
    if (n > KVX_MAX_ENTRIES) n = KVX_MAX_ENTRIES;
    s->max_entries = (uint32_t)n;
}

int kvx_st_kind_check(const kvx_store *s, int keyed, const char *fn)
{
    if (!s) return kvx_fail(KVX_EINVALID, "%s: store is NULL", fn);
    if (s->keyed == keyed) return 0;
    return kvx_fail(KVX_EINVALID,
                    keyed ? "%s: %s is a block store (token-named blocks); keyed pages need a store created with a "
                            "page size"
                          : "%s: %s is a keyed store (pages named by keys); blocks and token prefixes need a store "
                            "created with a geometry",
                    fn, s->dir);
}

int kvx_st_writer_check(kvx_store *s, const char *fn)
{
    if (!s) return kvx_fail(KVX_EINVALID, "%s: store is NULL", fn);
    if (!s->writer) return kvx_fail(KVX_EINVALID, "%s: store was opened KVX_STORE_READONLY", fn);
    return 0;
}

uint32_t kvx_st_kind_flags(const kvx_store *s, int kind)
{
    /* every shard carries its entries' sequence numbers; a keyed store's
     * shards (its only kind) also a tombstone table: a delete is an entry */
    if (s->keyed) return KVX_FLAG_KEYS | KVX_FLAG_SEQ | KVX_FLAG_TOMB;
    uint32_t f = KVX_FLAG_HASHES | KVX_FLAG_SEQ;
    if (kind == ST_KIND_LINEAGE) f |= KVX_FLAG_LINEAGE | KVX_FLAG_DIGEST;
    if (kvx_quant_is_fp8(s->g.quant)) f |= KVX_FLAG_SCALES;
    return f;
}
