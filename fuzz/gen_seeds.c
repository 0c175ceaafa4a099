/*
 * gen_seeds.c - writes the generated seed inputs of every harness with the
 * library's own writers: gen_fuzz_seeds OUTDIR writes OUTDIR/<harness>/gen_*
 * (the harness's corpus is fuzz/corpus/<harness>/; scripts/fuzz-campaign.sh
 * --seeds runs it into the corpora). Deterministic: the same build writes
 * the same bytes.
 *
 *   envelope, envelope_roundtrip, cli_envelope  v1 (f16), v2 (e4m3 + scales), v3 (bf16):
 *                                 full and partial blocks, hashes
 *   shard          FP16/E4M3/E5M2/BF16 with hashes, lineage, digest,
 *                  scales and a spectral bundle (kvx_shard_writer); keyed
 *                  shards (KVX_FLAG_KEYS: key table, keyed geometry)
 *   index_records  the catalog's records through index/records.c's
 *                  encoders into a scratch LMDB, read back raw; and the
 *                  pre-checksum forms (refused)
 *   store_config   STORE files (kvx_st_config_encode), block and keyed
 *   tokens, trace  token text and Mooncake trace lines
 *   transfer_chunk PushKv streams (transfer_chunk_fuzzer.c's encoding)
 *   tier_value     shared tier values (tier/value.c) of the harness's three
 *                  stores (fp16, e4m3, bf16)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/store.h"
#include "index/index.h"
#include "kvx.h"
#include "tier/tier.h"

static const char *outdir;

static void die(const char *what, int rc)
{
    fprintf(stderr, "gen_seeds: %s: %d %s\n", what, rc, kvx_last_error());
    exit(1);
}

static void put_file(const char *harness, const char *name, const void *b, size_t n)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", outdir, harness);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/%s/gen_%s", outdir, harness, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) die(p, -errno);
}

/* element e of a page or payload: small finite values of each type */
static void fill(uint8_t *p, size_t n_elems, uint32_t quant, uint32_t salt)
{
    for (size_t i = 0; i < n_elems; i++) {
        float x = (float)((int)((i * 2654435761u + salt) % 201) - 100) / 16.0f;
        switch (quant) {
        case KVX_QUANT_FP16: { uint16_t h = kvx_f32_to_f16(x); memcpy(p + 2 * i, &h, 2); break; }
        case KVX_QUANT_BF16: { uint16_t h = kvx_f32_to_bf16(x); memcpy(p + 2 * i, &h, 2); break; }
        case KVX_QUANT_E4M3: p[i] = kvx_f32_to_e4m3(x); break;
        default: p[i] = kvx_f32_to_e5m2(x); break;
        }
    }
}

/* ------------------------------------------------------------ envelopes */

static void envelope(const char *name, uint16_t version, kvx_geometry g, uint32_t n, const uint32_t *ntok)
{
    g.quant = version == KVX_ENVELOPE_V1 ? KVX_QUANT_FP16 : version == KVX_ENVELOPE_V2 ? KVX_QUANT_E4M3
                                                                                    : KVX_QUANT_BF16;
    size_t P = kvx_envelope_payload_bytes(version, &g), slabs = (size_t)g.num_layers * 2 * g.kv_heads;
    size_t elems = slabs * g.block_tokens * g.head_dim, size;
    if (kvx_envelope_size(&size, version, &g, n)) die("envelope size", -1);
    kvx_envelope_block_in in[8];
    uint8_t *pay = calloc(n ? n : 1, P);
    float *sc = malloc((n ? n : 1) * slabs * sizeof *sc);
    uint32_t toks[1024];
    uint64_t parent = 0;
    for (uint32_t i = 0; i < n; i++) {
        fill(pay + i * P, elems, g.quant, i);
        for (size_t s = 0; s < slabs; s++) sc[i * slabs + s] = 0.25f * (float)(1 + (i + s) % 7);
        for (uint32_t t = 0; t < g.block_tokens; t++) toks[t] = 1000 * i + t;
        in[i].n_tokens = ntok[i];
        in[i].hash = ntok[i] == g.block_tokens ? (parent = kvx_block_hash(parent, toks, g.block_tokens)) : 0;
        in[i].payload = pay + i * P;
        in[i].scales = sc + i * slabs;
    }
    uint8_t *b = malloc(size);
    int rc = kvx_envelope_export(b, size, version, &g, in, n);
    if (rc) die("envelope export", rc);
    put_file("envelope", name, b, size);
    put_file("envelope_roundtrip", name, b, size);
    put_file("cli_envelope", name, b, size);
    free(b);
    free(pay);
    free(sc);
}

/* --------------------------------------------------------------- shards */

static void shard(const char *name, uint32_t quant, uint32_t flags, int spectral, uint32_t n_full, uint32_t partial)
{
    kvx_geometry g = {2, 1, 8, 4, quant, 0x6b76782d73656564ull};
    char path[4096];
    snprintf(path, sizeof path, "%s/shard", outdir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/shard/gen_%s", outdir, name);
    unlink(path);
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = g;
    o.shard_id = 9;
    o.max_entries = n_full + (partial ? 1 : 0);
    o.flags = flags;
    float psi[2 * 2 * 8 * 2];
    uint32_t ids[2] = {1, 3};
    kvx_spectral_in sp = {2, 0, 2, 8, 2, ids, psi};
    for (size_t i = 0; i < sizeof psi / sizeof *psi; i++) psi[i] = 0.125f * (float)((int)(i % 9) - 4);
    if (spectral) o.spectral = &sp;
    kvx_shard_writer *w;
    int rc = kvx_shard_writer_create(&w, path, &o);
    if (rc) die("shard writer", rc);
    uint64_t pb = kvx_page_bytes(&g, g.block_tokens);
    uint8_t *page = malloc(pb);
    float scales[2 * 2 * 1];
    uint32_t toks[4];
    uint64_t parent = 0;
    uint8_t dg[KVX_DIGEST_BYTES], prev[KVX_DIGEST_BYTES];
    for (uint32_t i = 0; i < n_full + (partial ? 1 : 0); i++) {
        uint32_t nt = i < n_full ? g.block_tokens : partial;
        for (uint32_t t = 0; t < 4; t++) toks[t] = 7 * i + t;
        fill(page, pb / kvx_quant_elem_size(quant), quant, 31 * i);
        for (int s = 0; s < 4; s++) scales[s] = 0.5f * (float)(1 + (i + s) % 3);
        kvx_entry_in e = {0};
        e.radix_block = (uint16_t)i;
        e.spectral = spectral && i % 2 ? 1 : 0;
        e.token_count = nt;
        e.page = page;
        if (nt == g.block_tokens && (flags & KVX_FLAG_HASHES)) {
            e.hash = kvx_block_hash(parent, toks, g.block_tokens);
            kvx_prefix_digest_next(dg, i ? prev : NULL, toks, g.block_tokens);
            e.digest = (flags & KVX_FLAG_DIGEST) ? dg : NULL;
        }
        if (flags & KVX_FLAG_LINEAGE) {
            e.parent = parent;
            e.tokens = toks;
        }
        e.scales = (flags & KVX_FLAG_SCALES) ? scales : NULL;
        if ((rc = kvx_shard_writer_add(w, &e))) die("shard add", rc);
        if (e.hash) {
            parent = e.hash;
            memcpy(prev, dg, sizeof dg);
        }
    }
    if ((rc = kvx_shard_writer_seal(w))) die("shard seal", rc);
    free(page);
}

/* A keyed shard (KVX_FLAG_KEYS: the key table, DESIGN.md "Keyed pages"),
 * as a keyed store's flush writes it (engine/store_keyed.c): the synthetic
 * geometry of page_bytes (kvx_keyed_geometry: E4M3, B 0), one token a
 * page, each page page_lens[i] bytes (1..page_bytes) named by keys[i]. */
static void keyed_shard(const char *name, uint64_t page_bytes, uint32_t n, const char *const *keys,
                        const uint32_t *key_lens, const uint32_t *page_lens)
{
    kvx_geometry g;
    int rc = kvx_keyed_geometry(&g, page_bytes);
    if (rc) die("keyed geometry", rc);
    char path[4096];
    snprintf(path, sizeof path, "%s/shard", outdir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/shard/gen_%s", outdir, name);
    unlink(path);
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = g;
    o.shard_id = 5;
    o.max_entries = n;
    o.flags = KVX_FLAG_KEYS;
    kvx_shard_writer *w;
    if ((rc = kvx_shard_writer_create(&w, path, &o))) die("keyed shard writer", rc);
    uint8_t *page = malloc(page_bytes);
    for (uint32_t i = 0; i < n; i++) {
        fill(page, page_bytes, KVX_QUANT_E4M3, 17 * i);
        kvx_entry_in e = {0};
        e.radix_block = (uint16_t)i;
        e.token_count = 1;
        e.page = page;
        e.key = keys[i];
        e.key_len = key_lens[i];
        e.page_len = page_lens[i];
        if ((rc = kvx_shard_writer_add(w, &e))) die("keyed shard add", rc);
    }
    if ((rc = kvx_shard_writer_seal(w))) die("keyed shard seal", rc);
    free(page);
}

/* ------------------------------------------------------- index records */

static void record(const char *name, int kind, const void *k, size_t klen, const void *v, size_t vlen)
{
    uint8_t b[16384];
    b[0] = (uint8_t)kind;
    b[1] = (uint8_t)klen;
    memcpy(b + 2, k, klen);
    memcpy(b + 2 + klen, v, vlen);
    put_file("index_records", name, b, 2 + klen + vlen);
}

static void raw(const char *name, int kind, MDB_txn *txn, MDB_dbi dbi, const void *key, size_t klen)
{
    MDB_val k = {klen, (void *)key}, v;
    int rc = mdb_get(txn, dbi, &k, &v);
    if (rc) die(name, rc);
    record(name, kind, key, klen, v.mv_data, v.mv_size);
}

static void index_records(void)
{
    char dir[] = "/tmp/kvx_gen_idx.XXXXXX";
    if (!mkdtemp(dir)) die("mkdtemp", -errno);
    kvx_index *ix;
    int rc = kvx_idx_open(&ix, dir, 1, 1);
    if (rc) die("idx open", rc);
    MDB_txn *txn;
    if ((rc = mdb_txn_begin(ix->env, NULL, 0, &txn))) die("txn", rc);
    uint32_t byte = 9, coord = 9u << 24 | 3u << 8, coord2 = 9u << 24 | 4u << 8;
    uint64_t hash = 0x1234567890abcdefull, gen = 42;
    kvx_idx_shard sh = {gen, 16384 + 4096, 1764500000000000000ull, 3, KVX_FLAG_HASHES | KVX_FLAG_LINEAGE | KVX_FLAG_DIGEST | KVX_FLAG_META_CRC, 0, 1, 0};
    if ((rc = kvx_idx_put_shard(txn, ix, byte, &sh))) die("put shard", rc);
    raw("shard", 0, txn, ix->shards, &byte, 4);
    if ((rc = kvx_idx_add_block(txn, ix, coord, hash, gen))) die("add block", rc);
    if ((rc = kvx_idx_add_block(txn, ix, coord2, 7, gen))) die("add block", rc);
    raw("coord", 1, txn, ix->coord, &coord, 4);
    raw("loc", 2, txn, ix->hash, &hash, 8);
    uint8_t bits[3] = {0x5a, 0xff, 0x01};
    kvx_idx_usage us = {gen, 1764500000000000001ull, 17, 17, 0};
    if ((rc = kvx_idx_put_usage(txn, ix, byte, &us, bits, 3))) die("put usage", rc);
    raw("usage", 3, txn, ix->usage, &byte, 4);
    kvx_idx_usage us0 = {gen, 0, 0, 0, 0};
    uint32_t byte2 = 10;
    if ((rc = kvx_idx_put_usage(txn, ix, byte2, &us0, NULL, 0))) die("put usage", rc);
    raw("usage_empty", 3, txn, ix->usage, &byte2, 4);
    kvx_idx_stats st = {100, 7, 3, 30, 2, 0};
    if ((rc = kvx_idx_put_stats(txn, ix, &st))) die("put stats", rc);
    raw("stats", 4, txn, ix->meta, "stats", 5);
    if ((rc = kvx_idx_put_u64(txn, ix->meta, "next_gen", 43))) die("put u64", rc);
    raw("u64_next_gen", 5, txn, ix->meta, "next_gen", 8);
    mdb_txn_abort(txn);
    kvx_idx_close(ix);
    char p[256];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/lock.mdb", dir);
    unlink(p);
    rmdir(dir);
    /* records written before the checksums (shorter, or crc 0): refused as
     * damaged, never read */
    record("shard_legacy", 0, &byte, 4, &sh, 32);
    kvx_idx_coord cv = {hash, gen, 0, 0};
    record("coord_legacy", 1, &coord, 4, &cv, 16);
    kvx_idx_loc lc = {coord, 0, gen};
    record("loc_legacy", 2, &hash, 8, &lc, sizeof lc);
    uint64_t ng = 43;
    record("u64_legacy", 5, "next_gen", 8, &ng, 8);
    uint64_t old[4] = {1, 2, 3, 4};
    record("stats_short", 4, "", 0, old, sizeof old);
}

/* --------------------------------------------------------- STORE files */

static void store_config(const char *name, kvx_geometry g, uint64_t cap, uint64_t target)
{
    uint8_t b[ST_CONFIG_BYTES];
    kvx_st_config_encode(b, &g, cap, target, ST_STORE_VERSION);
    put_file("store_config", name, b, sizeof b);
}

/* ------------------------------------------------- transfer chunk streams */

/* The stream encoding of transfer_chunk_fuzzer.c: chunk after chunk. */
typedef struct stream {
    uint8_t b[8192];
    size_t n;
    uint64_t parent;
} stream;

static void put_bytes(stream *s, const void *p, size_t n)
{
    memcpy(s->b + s->n, p, n);
    s->n += n;
}

/* One chunk of n tokens first..first+n-1 in version v (0: empty payload);
 * flags as the harness reads them (raw fields appended by the caller). */
static void chunk(stream *s, uint8_t f, uint16_t v, uint32_t first, uint8_t n)
{
    kvx_geometry g = {2, 1, 4, 4, 0, 0};
    uint32_t toks[4];
    for (uint32_t i = 0; i < n; i++) toks[i] = first + i;
    uint64_t h = n == 4 ? kvx_block_hash(s->parent, toks, 4) : 0;
    if (h) s->parent = h;
    uint8_t pay[512] = {0}, env[1024];
    size_t len = 0;
    if (v) {
        g.quant = v == 1 ? KVX_QUANT_FP16 : v == 2 ? KVX_QUANT_E4M3 : KVX_QUANT_BF16;
        fill(pay, kvx_envelope_payload_bytes(v, &g) / (v == 2 ? 1 : 2), g.quant, first);
        float sc[4] = {0.5f, 1, 2, 0.25f};
        kvx_envelope_block_in in = {h, n, pay, sc};
        if (kvx_envelope_size(&len, v, &g, 1) || kvx_envelope_export(env, sizeof env, v, &g, &in, 1))
            die("chunk envelope", -1);
    }
    uint8_t fmt = (uint8_t)(f | (v ? v : 1));
    put_bytes(s, &fmt, 1);
    put_bytes(s, &n, 1);
    for (uint32_t i = 0; i < n; i++) {
        uint16_t t = (uint16_t)toks[i];
        put_bytes(s, &t, 2);
    }
    uint16_t pl = (uint16_t)len;
    put_bytes(s, &pl, 2);
    put_bytes(s, env, len);
}

static void transfer_chunk(void)
{
    stream s = {{1}, 1, 0}; /* finish */
    for (uint32_t i = 0; i < 3; i++) chunk(&s, 0x20, 1, 100 + 4 * i, 4);
    chunk(&s, 0x20, 1, 112, 2);
    put_file("transfer_chunk", "v1_three_and_tail", s.b, s.n);

    stream r = {{1}, 1, 0}; /* the held prompt (tokens 0..11) referenced, one new v3 block */
    for (uint32_t i = 0; i < 3; i++) chunk(&r, 0, 0, 4 * i, 4);
    chunk(&r, 0, 3, 12, 4);
    put_file("transfer_chunk", "referenced_then_v3", r.b, r.n);

    stream u = {{0}, 1, 0}; /* not finished: dropped */
    chunk(&u, 0, 2, 200, 4);
    chunk(&u, 0, 2, 204, 4);
    put_file("transfer_chunk", "v2_two_unfinished", u.b, u.n);

    stream c = {{1}, 1, 0}; /* a wrong crc32c: ECORRUPT, the stream fails */
    chunk(&c, 0x10, 1, 300, 4);
    uint32_t bad = 0xdeadbeef;
    put_bytes(&c, &bad, 4);
    chunk(&c, 0, 1, 304, 4);
    put_file("transfer_chunk", "bad_crc", c.b, c.n);

    stream m = {{1}, 1, 0}; /* another model: EMODEL */
    chunk(&m, 0x40, 1, 400, 4);
    uint64_t sig = 0x0123456789abcdefull;
    put_bytes(&m, &sig, 8);
    put_file("transfer_chunk", "other_model", m.b, m.n);

    stream p = {{1}, 1, 0}; /* a v1 payload patched by the harness (0x80) */
    chunk(&p, 0x80, 1, 500, 4);
    chunk(&p, 0x80, 1, 504, 3);
    put_file("transfer_chunk", "patched_v1", p.b, p.n);
}

/* Values of tier_value_fuzzer.c's three stores (L1 Hkv1 D4 B4, model
 * 0x1122334455667788, no tenant). */
static void tier_values(void)
{
    static const uint32_t quants[3] = {KVX_QUANT_FP16, KVX_QUANT_E4M3, KVX_QUANT_BF16};
    static const char *names[3] = {"fp16", "e4m3", "bf16"};
    for (int q = 0; q < 3; q++) {
        kvx_geometry g = {1, 1, 4, 4, quants[q], 0x1122334455667788ull};
        uint32_t toks[4] = {7, 8, 9, 10u + (uint32_t)q};
        uint8_t page[64];
        for (int i = 0; i < 64; i++) page[i] = (uint8_t)((i * 5 + q) & 0x3f);
        float sc[2] = {0.5f, 4.0f};
        uint8_t *v;
        size_t n;
        int rc = kvx_tier_value_encode(&v, &n, kvx_tier_ns(&g, NULL), &g, kvx_block_hash(0, toks, 4), toks, page,
                                       q == 1 ? sc : NULL);
        if (rc) die("tier value", rc);
        put_file("tier_value", names[q], v, n);
        free(v);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: gen_fuzz_seeds OUTDIR\n");
        return 2;
    }
    outdir = argv[1];
    mkdir(outdir, 0755);
    kvx_geometry g = {2, 1, 4, 4, 0, 0};
    const uint32_t full3[3] = {4, 4, 4}, part[3] = {4, 4, 2}, one[1] = {1};
    envelope("v1_three", KVX_ENVELOPE_V1, g, 3, full3);
    envelope("v1_partial", KVX_ENVELOPE_V1, g, 3, part);
    envelope("v2_three", KVX_ENVELOPE_V2, g, 3, full3);
    envelope("v2_partial", KVX_ENVELOPE_V2, g, 3, part);
    envelope("v3_three", KVX_ENVELOPE_V3, g, 3, full3);
    envelope("v3_partial", KVX_ENVELOPE_V3, g, 3, part);
    envelope("v3_empty", KVX_ENVELOPE_V3, g, 0, NULL);
    kvx_geometry g2 = {1, 2, 2, 1, 0, 0};
    envelope("v1_b1", KVX_ENVELOPE_V1, g2, 1, one);
    envelope("v2_b1", KVX_ENVELOPE_V2, g2, 1, one);
    envelope("v3_b1", KVX_ENVELOPE_V3, g2, 1, one);

    const uint32_t H = KVX_FLAG_HASHES, LN = KVX_FLAG_LINEAGE, S = KVX_FLAG_SCALES, D = KVX_FLAG_DIGEST;
    shard("fp16_lineage_digest", KVX_QUANT_FP16, H | LN | D, 0, 3, 2);
    shard("e4m3_scales_lineage_digest", KVX_QUANT_E4M3, H | LN | D | S, 0, 2, 1);
    shard("e5m2_scales_spectral", KVX_QUANT_E5M2, H | S, 1, 2, 0);
    shard("bf16_hashes_spectral", KVX_QUANT_BF16, H, 1, 2, 3);
    shard("bf16_all_tables", KVX_QUANT_BF16, H | LN | D, 1, 3, 1);
    shard("e4m3_plain", KVX_QUANT_E4M3, 0, 0, 1, 0);
    {
        /* keyed shards: LMCache-style keys, a 1-byte and a 255-byte key,
         * pages shorter than, equal to and of 1 byte of the page size */
        static char k255[KVX_KEY_MAX];
        memset(k255, 'k', sizeof k255);
        const char *keys[3] = {"llama-3-8b@1@0@5e1f3a9c@bfloat16", "a", k255};
        const uint32_t klens[3] = {32, 1, KVX_KEY_MAX};
        const uint32_t plens_small[3] = {256, 100, 1};
        keyed_shard("keyed_three", 256, 3, keys, klens, plens_small);
        const uint32_t plens_big[2] = {8192, 4097};
        keyed_shard("keyed_two_pages_8k", 8192, 2, keys, klens, plens_big);
        const uint32_t plens_one[1] = {6};
        keyed_shard("keyed_one_tiny", 6, 1, keys + 2, klens + 2, plens_one);
    }

    index_records();
    transfer_chunk();
    tier_values();

    store_config("fp16", (kvx_geometry){32, 8, 128, 16, KVX_QUANT_FP16, 0x1122334455667788ull}, 64ull << 30, 256ull << 20);
    store_config("e4m3", (kvx_geometry){2, 1, 4, 4, KVX_QUANT_E4M3, 0}, 400 << 10, 48 << 10);
    store_config("bf16", (kvx_geometry){80, 8, 128, 512, KVX_QUANT_BF16, 1}, 1ull << 40, 1ull << 30);
    store_config("e5m2_tiny_target", (kvx_geometry){1, 1, 1, 1, KVX_QUANT_E5M2, 0}, 1, 1);
    {
        kvx_geometry kg;
        if (kvx_keyed_geometry(&kg, 4096) == 0) store_config("keyed_4096", kg, 1ull << 30, 64ull << 20);
        if (kvx_keyed_geometry(&kg, 2) == 0) store_config("keyed_2", kg, 1 << 20, 4096);
    }

    static const char *tok[][2] = {
        {"decimal", "1 2 3 4 5 6 7 8\n"},
        {"hex_commas", "0x0,0x1f,0xFFFFFFFF,\t42\r\n"},
        {"max", "4294967295 0 4294967295\n"},
        {"bad_word", "12 13 x14 15\n"},
        {"too_big", "4294967296\n"},
        {"blank", " \n\t\r\n"},
    };
    for (size_t i = 0; i < sizeof tok / sizeof *tok; i++) put_file("tokens", tok[i][0], tok[i][1], strlen(tok[i][1]));

    static const char *tr[][2] = {
        {"mooncake", "{\"timestamp\": 0, \"input_length\": 6755, \"output_length\": 500, \"hash_ids\": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}\n"
                     "{\"timestamp\": 27482, \"input_length\": 7319, \"output_length\": 490, \"hash_ids\": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 15, 16]}\n"
                     "\n"
                     "{\"timestamp\": 31017, \"input_length\": 0, \"output_length\": 1, \"hash_ids\": []}\n"},
        {"big_ids", "{\"input_length\": 18446744073709551615, \"hash_ids\": [9223372036854775807, 18446744073709551615]}\n"},
        {"not_json", "{\"input_length\": 5, \"hash_ids\": [1, 2]} trailing\n"},
        {"negative", "{\"input_length\": 5, \"hash_ids\": [1, -2]}\n"},
        {"utf8", "{\"input_length\": 1, \"hash_ids\": [3], \"note\": \"\xc3\xa9\\u00e9\"}\n"},
    };
    for (size_t i = 0; i < sizeof tr / sizeof *tr; i++) put_file("trace", tr[i][0], tr[i][1], strlen(tr[i][1]));
    return 0;
}
