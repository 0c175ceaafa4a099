/*
 * kvx.h - the one public header of kvx, a storage engine for frozen LLM
 * KV-cache shards.
 *
 * Conventions (read once, they hold everywhere below):
 *  - Every function that can fail returns int: 0 on success, a negative
 *    errno passed through from the OS (-ENOSPC, -EIO, ...), or a KVX_E*
 *    code from kvx's own range (-30000 and below), which cannot collide
 *    with errno. kvx_strerror() and kvx_err_name() cover both.
 *  - After a failure, kvx_last_error() returns a thread-local message that
 *    names the field and the problem. It is never NULL.
 *  - Output parameters come first and are named out*. What a
 *    pointer-to-pointer returns is owned by the caller and released with the
 *    matching *_close / *_destroy / *_release function; those accept NULL.
 *  - Option structs carry a version field; initialise them with the
 *    matching *_INIT macro so fields can be added later.
 *  - No call on a hot path needs a callback: results are returned in flat
 *    arrays and asynchronous work is polled. Every call is safe from cgo.
 *  - C never keeps a pointer it was given beyond the call, unless the
 *    function says so.
 *
 * Caveats:
 *  - Threads: kvx_shard and kvx_store handles are safe to share between
 *    threads. A kvx_shard_writer, kvx_fetch or kvx_pool belongs to one
 *    thread at a time. The index is opened with MDB_NOTLS, so runtimes
 *    that move user threads between OS threads (Go) are fine.
 *  - fork: do not use a handle in a child process; open it again.
 *  - Memory-mapped views: kvx installs a SIGBUS guard for its own shard
 *    mappings, so a shard file truncated by someone else after it was opened
 *    reads as zero pages (failing their CRC) instead of killing the process.
 */
#ifndef KVX_H
#define KVX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KVX_API __attribute__((visibility("default")))
#else
#define KVX_API
#endif

#define KVX_VERSION_MAJOR 0
#define KVX_VERSION_MINOR 1
#define KVX_VERSION_PATCH 0
#define KVX_VERSION_STRING "0.1.0"

KVX_API const char *kvx_version(void);

/* ------------------------------------------------------------------------
 * Errors
 * ---------------------------------------------------------------------- */

/* XX(name, value, message): one table makes the enum, kvx_err_name and
 * kvx_strerror, so the three never drift apart. */
#define KVX_ERROR_MAP(XX)                                                          \
    XX(EFORMAT, -30001, "malformed data: a field is out of range or inconsistent") \
    XX(ESHAPE, -30002, "shape mismatch: dimensions differ from what was expected") \
    XX(EVERSION, -30003, "unsupported format version")                             \
    XX(ECORRUPT, -30004, "data is damaged")                                        \
    XX(ENOTFOUND, -30005, "not found")                                             \
    XX(ECAPACITY, -30006, "capacity exceeded")                                     \
    XX(EMAGIC, -30007, "bad magic: not a file of the expected kind")               \
    XX(ETRUNC, -30008, "truncated: data ends before a section it declares")        \
    XX(EALIGN, -30009, "a section or page is misaligned")                          \
    XX(EOVERLAP, -30010, "two sections overlap")                                   \
    XX(EOVERFLOW, -30011, "a size computation overflows")                          \
    XX(EQUANT, -30012, "unknown quant format")                                     \
    XX(EDUPLICATE, -30013, "duplicate coordinate")                                 \
    XX(ESHARDID, -30014, "an entry's shard byte differs from the file's")          \
    XX(EPAGE, -30015, "a page lies outside the KV section or has the wrong size")  \
    XX(ETOKENS, -30016, "token count out of range")                                \
    XX(EHASH, -30017, "block hash rule broken")                                    \
    XX(ELINEAGE, -30018, "lineage mismatch: hash is not H(parent, tokens)")        \
    XX(EMETACRC, -30019, "header and table checksum mismatch")                     \
    XX(EPAGECRC, -30020, "page checksum mismatch")                                 \
    XX(EMODEL, -30021, "model signature differs")                                  \
    XX(EBUSY, -30022, "another writer holds the store")                            \
    XX(EFULL, -30023, "no free shard id, or the shard is full")                    \
    XX(ENOGPU, -30024, "no usable GPU")                                            \
    XX(ENOCUDA, -30025, "kvx was built without CUDA")                              \
    XX(EMEMLOCK, -30026, "cannot lock or register memory")                         \
    XX(EINVALID, -30027, "invalid argument")                                       \
    XX(ESPECTRAL, -30028, "spectral bundle malformed")                             \
    XX(EPATH, -30029, "path escapes the store directory")                          \
    XX(ECANCELED, -30030, "operation canceled")

typedef enum kvx_error {
    KVX_OK = 0,
#define KVX_ERROR_ENUM_(name, value, msg) KVX_##name = value,
    KVX_ERROR_MAP(KVX_ERROR_ENUM_)
#undef KVX_ERROR_ENUM_
} kvx_error;

/* Message for a kvx code or a negative errno; never NULL. */
KVX_API const char *kvx_strerror(int code);
/* "KVX_EFORMAT", "ENOSPC", ...; never NULL. */
KVX_API const char *kvx_err_name(int code);
/* This thread's message about its last failure; "" when none. Never NULL.
 * Valid until the next kvx call on this thread. */
KVX_API const char *kvx_last_error(void);

/* ------------------------------------------------------------------------
 * Geometry
 * ---------------------------------------------------------------------- */

typedef enum kvx_quant {
    KVX_QUANT_FP16 = 0,
    KVX_QUANT_E4M3 = 1, /* OCP FP8 E4M3FN: bias 7, max 448, no inf */
    KVX_QUANT_E5M2 = 2  /* OCP FP8 E5M2 */
} kvx_quant;

typedef struct kvx_geometry {
    uint32_t num_layers;      /* L   (1..65535) */
    uint32_t kv_heads;        /* Hkv (1..65535) */
    uint32_t head_dim;        /* D   (1..65535) */
    uint32_t block_tokens;    /* B of the chained hashes; 0 = not given */
    uint32_t quant;           /* a kvx_quant */
    uint64_t model_signature; /* first 8 bytes of the model's SHA-256, LE */
} kvx_geometry;

/* Bytes of one element of quant (2 or 1); 0 for an unknown quant. */
KVX_API size_t kvx_quant_elem_size(uint32_t quant);
/* "fp16", "e4m3", "e5m2"; NULL for an unknown quant. */
KVX_API const char *kvx_quant_name(uint32_t quant);
/* KVX page bytes for n tokens: 2*L*Hkv*n*D*elem. 0 on overflow or bad quant. */
KVX_API uint64_t kvx_page_bytes(const kvx_geometry *g, uint32_t n_tokens);
/* Scales per block: L*2*Hkv. */
KVX_API uint64_t kvx_scale_count(const kvx_geometry *g);

/* ------------------------------------------------------------------------
 * Block hash (chained FNV-1a 64)
 * ---------------------------------------------------------------------- */

KVX_API uint64_t kvx_fnv1a64(const void *data, size_t len);
/* H(parent, tokens[0..B)); a computed 0 becomes 1. */
KVX_API uint64_t kvx_block_hash(uint64_t parent, const uint32_t *tokens, uint32_t block_tokens);
/* Hashes of every full block of tokens into out_hashes (room for
 * n_tokens / block_tokens); returns the number of full blocks. */
KVX_API size_t kvx_block_hashes(uint64_t *out_hashes, const uint32_t *tokens, size_t n_tokens,
                                uint32_t block_tokens);

/* ------------------------------------------------------------------------
 * Checksums: hardware speed where the CPU allows. crc is the running value
 * (start with 0); the usual pre/post inversion is done inside.
 * ---------------------------------------------------------------------- */

KVX_API uint32_t kvx_crc32c(uint32_t crc, const void *data, size_t len); /* Castagnoli */
KVX_API uint32_t kvx_crc32(uint32_t crc, const void *data, size_t len);  /* IEEE, as zlib */

/* ------------------------------------------------------------------------
 * Numerics: round to nearest, ties to even, subnormals included.
 *  - f16: overflow (|x| >= 65520) goes to inf; inf and NaN are kept. A NaN
 *    keeps its sign and top payload bits and comes out quiet (as x86 F16C
 *    does), so every non-NaN f16 round-trips exactly through f32 and a
 *    signalling NaN comes back with its quiet bit (0x0200) set.
 *  - E4M3FN (bias 7, max 448, no inf): finite values beyond 448 and +-inf
 *    saturate to +-448 (0x7E / 0xFE); NaN becomes 0x7F, 0xFF when negative.
 *  - E5M2 (bias 15, max 57344): overflow (|x| >= 61440) goes to inf
 *    (0x7C | sign); NaN becomes the quiet 0x7E | sign.
 * Bulk _n forms: encoders multiply by inv_scale before rounding, decoders
 * multiply by scale after; equal bit for bit to the scalar forms (F16C and
 * table lookups where the CPU allows).
 * ---------------------------------------------------------------------- */

KVX_API uint16_t kvx_f32_to_f16(float x);
KVX_API float kvx_f16_to_f32(uint16_t h);
KVX_API uint8_t kvx_f32_to_e4m3(float x);
KVX_API float kvx_e4m3_to_f32(uint8_t b);
KVX_API uint8_t kvx_f32_to_e5m2(float x);
KVX_API float kvx_e5m2_to_f32(uint8_t b);
KVX_API void kvx_f32_to_f16_n(uint16_t *out, const float *in, size_t n);
KVX_API void kvx_f16_to_f32_n(float *out, const uint16_t *in, size_t n);
KVX_API void kvx_f32_to_e4m3_n(uint8_t *out, const float *in, size_t n, float inv_scale);
KVX_API void kvx_e4m3_to_f32_n(float *out, const uint8_t *in, size_t n, float scale);
KVX_API void kvx_f32_to_e5m2_n(uint8_t *out, const float *in, size_t n, float inv_scale);
KVX_API void kvx_e5m2_to_f32_n(float *out, const uint8_t *in, size_t n, float scale);

/* ------------------------------------------------------------------------
 * TLKV export envelope (v1: f16, v2: e4m3 + f32 scales). Payload layout
 * [L][K|V][Hkv][B][D]; positions at or past n_tokens are zero bytes.
 * ---------------------------------------------------------------------- */

#define KVX_ENVELOPE_V1 1
#define KVX_ENVELOPE_V2 2
#define KVX_ENVELOPE_HEADER_BYTES 28

/* A validated, zero-copy view of an envelope; valid while its buffer is. */
typedef struct kvx_envelope {
    uint16_t version;
    uint16_t dtype;
    uint32_t n_blocks;
    kvx_geometry geometry; /* block_tokens, L, Hkv, D from the header;
                              quant FP16 (v1) or E4M3 (v2) */
    const uint8_t *data;
    size_t size;
    size_t payload_bytes; /* P */
} kvx_envelope;

typedef struct kvx_envelope_block {
    uint64_t hash;
    uint32_t n_tokens;
    const uint8_t *payload; /* elements [L][2][Hkv][B][D]; unaligned */
    const uint8_t *scales;  /* v2: L*2*Hkv little-endian f32, unaligned; v1 NULL */
} kvx_envelope_block;

/* Input block for export. payload holds elements [L][2][Hkv][B][D] in the
 * version's element type; positions >= n_tokens are written as zero. */
typedef struct kvx_envelope_block_in {
    uint64_t hash;
    uint32_t n_tokens;
    const void *payload;
    const float *scales; /* v2: L*2*Hkv scales; ignored in v1 */
} kvx_envelope_block_in;

/* P for version and geometry (L, Hkv, D, B used); 0 on overflow. */
KVX_API size_t kvx_envelope_payload_bytes(uint16_t version, const kvx_geometry *g);
/* Whole envelope size: 28 + n*(12+P) + 4. */
KVX_API int kvx_envelope_size(size_t *out_bytes, uint16_t version, const kvx_geometry *g,
                              uint32_t n_blocks);
/* Every reader rule of the spec. expect (nullable) gives the receiving
 * pool's B, L, Hkv, D: a mismatch is KVX_ESHAPE. Bad length, magic, CRC,
 * dtype or n_tokens: KVX_EFORMAT. Unknown version: KVX_EVERSION. */
KVX_API int kvx_envelope_parse(kvx_envelope *out, const void *buf, size_t len,
                               const kvx_geometry *expect);
KVX_API int kvx_envelope_block_at(kvx_envelope_block *out, const kvx_envelope *env, uint32_t index);
/* Writes a whole envelope (header, blocks, CRC) into buf of cap bytes. */
KVX_API int kvx_envelope_export(void *buf, size_t cap, uint16_t version, const kvx_geometry *g,
                                const kvx_envelope_block_in *blocks, uint32_t n_blocks);
/* The v2 writer rule for one block given as f32 [L][2][Hkv][B][D]:
 * scale = amax/448 over each slab's filled positions (1.0 when amax is 0). */
KVX_API int kvx_envelope_quantize_v2(uint8_t *out_e4m3, float *out_scales, const float *kv,
                                     const kvx_geometry *g, uint32_t n_tokens);

/* ------------------------------------------------------------------------
 * Coordinates: shard = c >> 24, radix block = (c >> 8) & 0xFFFF,
 * spectral = c & 0xFF.
 * ---------------------------------------------------------------------- */

#define KVX_COORD(shard, block, spectral)                                                   \
    ((((uint32_t)(shard) & 0xFFu) << 24) | (((uint32_t)(block) & 0xFFFFu) << 8) | \
     ((uint32_t)(spectral) & 0xFFu))
#define KVX_COORD_SHARD(c) ((uint32_t)(c) >> 24)
#define KVX_COORD_BLOCK(c) (((uint32_t)(c) >> 8) & 0xFFFFu)
#define KVX_COORD_SPECTRAL(c) ((uint32_t)(c) & 0xFFu)

/* ------------------------------------------------------------------------
 * KVX shard files
 * ---------------------------------------------------------------------- */

#define KVX_FORMAT_VERSION 0x0100
#define KVX_MAX_ENTRIES 65536u

/* header flags */
#define KVX_FLAG_HASHES 0x1u
#define KVX_FLAG_LINEAGE 0x2u
#define KVX_FLAG_SCALES 0x4u
#define KVX_FLAG_META_CRC 0x8u

typedef struct kvx_shard kvx_shard;               /* a sealed, mapped shard */
typedef struct kvx_shard_writer kvx_shard_writer; /* a shard being written */

typedef struct kvx_shard_info {
    kvx_geometry geometry; /* quant, L, Hkv, D, block_tokens, model_signature */
    uint16_t format_version;
    uint8_t shard_id; /* the shard byte all coordinates share (0 if empty) */
    uint32_t num_blocks;
    uint32_t spectral_dim;
    uint64_t spectral_offset;
    uint64_t kv_data_offset;
    uint32_t flags;
    uint32_t meta_crc32c;
    uint64_t file_size;
} kvx_shard_info;

/* One entry, decoded. Pointers live as long as the shard handle. */
typedef struct kvx_entry {
    uint32_t coordinate;
    uint32_t token_count;
    uint64_t offset;  /* absolute file offset of the page (multiple of 4096) */
    uint32_t bytes;   /* kv_page_bytes */
    uint32_t crc32;   /* CRC-32 (IEEE) of the page */
    uint64_t hash;    /* 0 without a hash table */
    uint64_t parent;  /* lineage parent hash; 0 without a lineage table */
    const uint32_t *tokens; /* lineage: block_tokens ids; NULL without */
    const float *scales;    /* L*2*Hkv; NULL without a scale table */
} kvx_entry;

/* A spectral bundle as stored. psi of cartridge k is
 * psi + k * n_layers * dim * rank floats, laid out [layer][dim][rank]. */
typedef struct kvx_spectral {
    uint32_t n_cartridges; /* 1..32 */
    uint32_t first_layer;
    uint32_t n_layers;
    uint32_t dim;
    uint32_t rank;
    const uint32_t *ids; /* n_cartridges ids, 1..32, increasing */
    const float *psi;
} kvx_spectral;

#define KVX_OPEN_VERIFY_PAGES 0x1u /* check every page CRC at open */

/* Opens and validates a sealed shard (every DESIGN rule; distinct codes).
 * The returned handle holds one reference. */
KVX_API int kvx_shard_open(kvx_shard **out, const char *path, unsigned flags);
/* Adds a reference; returns s. */
KVX_API kvx_shard *kvx_shard_ref(kvx_shard *s);
/* Drops one reference; the last one unmaps and closes. NULL is fine. */
KVX_API void kvx_shard_close(kvx_shard *s);
KVX_API const kvx_shard_info *kvx_shard_get_info(const kvx_shard *s);
KVX_API const char *kvx_shard_path(const kvx_shard *s);
/* The open file descriptor (read-only; owned by the shard). */
KVX_API int kvx_shard_fd(const kvx_shard *s);
/* O(1). */
KVX_API int kvx_shard_entry(kvx_entry *out, const kvx_shard *s, uint32_t index);
KVX_API int kvx_shard_find(uint32_t *out_index, const kvx_shard *s, uint32_t coordinate);
/* Zero-copy pointer into the mapping, valid while s is held. With verify,
 * a CRC mismatch is KVX_EPAGECRC (the pointer is still set). */
KVX_API int kvx_shard_page(const void **out_page, const kvx_shard *s, uint32_t index, int verify);
/* Structure was checked at open; this checks every page CRC. Returns 0 or
 * the first failure; out_bad (nullable) gets the number of bad pages. Each
 * bad page is reported through report (nullable) with its index and code. */
KVX_API int kvx_shard_verify(const kvx_shard *s, uint32_t *out_bad,
                             void (*report)(void *ctx, uint32_t index, int code), void *ctx);
/* KVX_ENOTFOUND when the shard has no bundle. */
KVX_API int kvx_shard_spectral(kvx_spectral *out, const kvx_shard *s);
/* h' = h + gamma * psi_l (psi_l^T h) for one layer's psi ([dim][rank]). */
KVX_API void kvx_spectral_apply(float *h, const float *psi_layer, uint32_t dim, uint32_t rank,
                                float gamma);

typedef struct kvx_spectral_in {
    uint32_t n_cartridges, first_layer, n_layers, dim, rank;
    const uint32_t *ids;
    const float *psi; /* n_cartridges * n_layers * dim * rank */
} kvx_spectral_in;

typedef struct kvx_shard_writer_options {
    uint32_t version; /* KVX_SHARD_WRITER_OPTIONS_VERSION */
    kvx_geometry geometry;
    uint8_t shard_id;
    uint32_t max_entries; /* table space reserved; 1..65536 */
    uint32_t flags;       /* KVX_FLAG_HASHES | KVX_FLAG_LINEAGE | KVX_FLAG_SCALES */
    const kvx_spectral_in *spectral; /* nullable; copied */
} kvx_shard_writer_options;
#define KVX_SHARD_WRITER_OPTIONS_VERSION 1
#define KVX_SHARD_WRITER_OPTIONS_INIT {KVX_SHARD_WRITER_OPTIONS_VERSION, {0, 0, 0, 0, 0, 0}, 0, 0, 0, NULL}

typedef struct kvx_entry_in {
    uint16_t radix_block;
    uint8_t spectral;
    uint32_t token_count;
    const void *page; /* kvx_page_bytes(g, token_count) bytes, layout [K|V][L][Hkv][N][D] */
    uint64_t hash;    /* with KVX_FLAG_HASHES; 0 = none (partial block) */
    uint64_t parent;  /* with KVX_FLAG_LINEAGE */
    const uint32_t *tokens; /* with KVX_FLAG_LINEAGE: token_count ids */
    const float *scales;    /* with KVX_FLAG_SCALES: L*2*Hkv; NULL = all 1.0 */
} kvx_entry_in;

/* Starts a shard that will appear at path only when sealed; until then it
 * lives in a temporary file beside path. */
KVX_API int kvx_shard_writer_create(kvx_shard_writer **out, const char *path,
                                    const kvx_shard_writer_options *opts);
/* Copies the page into the file now (pwrite); nothing is kept in memory
 * but the tables. */
KVX_API int kvx_shard_writer_add(kvx_shard_writer *w, const kvx_entry_in *e);
KVX_API uint32_t kvx_shard_writer_count(const kvx_shard_writer *w);
/* Bytes the sealed file will occupy so far. */
KVX_API uint64_t kvx_shard_writer_bytes(const kvx_shard_writer *w);
/* Header, tables, meta CRC; fsync; rename to path; fsync the directory.
 * Frees w whatever the result; on failure nothing appears at path. */
KVX_API int kvx_shard_writer_seal(kvx_shard_writer *w);
/* Removes the temporary file and frees w. NULL is fine. */
KVX_API void kvx_shard_writer_abort(kvx_shard_writer *w);

/* ------------------------------------------------------------------------
 * Conversion between shard pages and envelope blocks
 * ---------------------------------------------------------------------- */

/* A KVX page of geometry g (any quant; scales nullable = 1.0) becomes one
 * envelope payload of version (v1: f16; v2: e4m3 + scales computed by the
 * writer rule, or copied as-is when g is E4M3: lossless). out_payload has
 * kvx_envelope_payload_bytes(version, g) bytes; the v2 scales are its tail. */
KVX_API int kvx_page_to_envelope_payload(void *out_payload, uint16_t version, const kvx_geometry *g,
                                         const void *page, uint32_t n_tokens, const float *scales);
/* One envelope block becomes a KVX page in g's quant (must match the
 * envelope's B, L, Hkv, D). out_scales (L*2*Hkv, nullable) receives the
 * scales for an FP8 target (v2 -> E4M3 copies them exactly). */
KVX_API int kvx_envelope_payload_to_page(void *out_page, float *out_scales, const kvx_geometry *g,
                                         const kvx_envelope *env, const kvx_envelope_block *blk);
/* An envelope becomes a sealed shard at path: v1 -> FP16, v2 -> E4M3 with a
 * scale table; block i gets coordinate (shard_id, i, 0) and its hash. */
KVX_API int kvx_shard_from_envelope(const char *path, const void *env, size_t len, uint8_t shard_id,
                                    uint64_t model_signature);
/* Every entry of a shard becomes one block of a version envelope, written
 * into a malloc'd buffer the caller frees with kvx_free. Needs block_tokens
 * and every token_count <= B. */
KVX_API int kvx_shard_to_envelope(void **out_buf, size_t *out_len, const kvx_shard *s,
                                  uint16_t version);
KVX_API void kvx_free(void *p);

/* ------------------------------------------------------------------------
 * The store: a persistent prefix cache indexed in LMDB
 * ---------------------------------------------------------------------- */

typedef struct kvx_store kvx_store;

#define KVX_STORE_READONLY 0x1u /* open for lookups only (no writer lock) */
#define KVX_STORE_NOWAIT 0x2u   /* a second writer gets KVX_EBUSY at once */

typedef struct kvx_store_options {
    uint32_t version; /* KVX_STORE_OPTIONS_VERSION */
    kvx_geometry geometry;
    uint64_t capacity_bytes; /* 0 = default (see README) */
    uint32_t flags;          /* KVX_STORE_* */
} kvx_store_options;
#define KVX_STORE_OPTIONS_VERSION 1
#define KVX_STORE_OPTIONS_INIT {KVX_STORE_OPTIONS_VERSION, {0, 0, 0, 0, 0, 0}, 0, 0}

/* A block served from the store: a zero-copy view of its mapped page. It
 * holds a reference on its shard, so it stays valid until
 * kvx_view_release(), even if the shard is evicted meanwhile. */
typedef struct kvx_view {
    uint32_t coordinate;
    uint32_t token_count;
    uint64_t hash;
    const void *page;
    uint64_t page_bytes;
    const float *scales; /* L*2*Hkv, or NULL when all scales are 1.0 */
    kvx_shard *shard;    /* the reference this view holds */
    uint32_t entry;      /* index within shard */
} kvx_view;

typedef struct kvx_store_stats {
    uint64_t blocks;
    uint64_t bytes; /* total bytes of live shard files */
    uint64_t shards;
    uint64_t capacity_bytes;
    uint64_t hits;
    uint64_t misses;
    uint64_t evictions; /* shards evicted */
    uint64_t evicted_blocks;
    uint64_t compactions;
    uint64_t pending_blocks; /* put but not yet flushed (this handle) */
} kvx_store_stats;

/* Creates a new store directory (0700) with fixed geometry and capacity. */
KVX_API int kvx_store_create(kvx_store **out, const char *dir, const kvx_store_options *opts);
/* Opens an existing store, runs recovery. expect (nullable): a geometry
 * that must match (KVX_ESHAPE / KVX_EMODEL otherwise). */
KVX_API int kvx_store_open(kvx_store **out, const char *dir, const kvx_geometry *expect,
                           uint32_t flags);
/* Unflushed puts are dropped (never acknowledged). NULL is fine. */
KVX_API void kvx_store_close(kvx_store *s);
KVX_API int kvx_store_get_geometry(kvx_geometry *out, const kvx_store *s);

/* Puts the full blocks of one sequence. tokens: n_tokens ids (lineage);
 * pages: n_pages contiguous KVX pages of B tokens each (n_pages <=
 * n_tokens / B); scales: n_pages * L*2*Hkv floats or NULL. Blocks already
 * held are skipped; out_new (nullable) gets the number written. Nothing is
 * visible or durable until kvx_store_flush returns 0. */
KVX_API int kvx_store_put(kvx_store *s, const uint32_t *tokens, size_t n_tokens, const void *pages,
                          size_t n_pages, const float *scales, size_t *out_new);
/* Puts every full block of an envelope under its hash. tokens (nullable)
 * fills the lineage (its block hashes must equal the envelope's). */
KVX_API int kvx_store_put_envelope(kvx_store *s, const void *env, size_t len,
                                   const uint32_t *tokens, size_t n_tokens, size_t *out_new);
/* Makes every block put so far durable and visible. 0 is the
 * acknowledgement. */
KVX_API int kvx_store_flush(kvx_store *s);

/* Lookups fill views the caller releases with kvx_view_release(s). */
KVX_API int kvx_store_get(kvx_view *out, kvx_store *s, uint32_t coordinate);
KVX_API int kvx_store_get_hash(kvx_view *out, kvx_store *s, uint64_t hash);
/* Batch by hash: out_views[i] / out_status[i] (0 or KVX_ENOTFOUND ...). */
KVX_API int kvx_store_get_hashes(kvx_view *out_views, int *out_status, kvx_store *s,
                                 const uint64_t *hashes, size_t n);
/* Longest cached prefix of tokens: fills up to max_views views of leading
 * full blocks (lineage-verified when the shard has lineage) and sets
 * *out_n. One call per prompt. */
KVX_API int kvx_store_prefix(kvx_view *out_views, size_t *out_n, kvx_store *s,
                             const uint32_t *tokens, size_t n_tokens, size_t max_views);
KVX_API void kvx_view_release(kvx_view *v);
KVX_API void kvx_views_release(kvx_view *views, size_t n);

KVX_API int kvx_store_stat(kvx_store_stats *out, kvx_store *s);
/* Checks every shard and page against the index; out_bad (nullable) gets
 * the number of problems found, each reported through report (nullable). */
KVX_API int kvx_store_verify(kvx_store *s, uint64_t *out_bad,
                             void (*report)(void *ctx, const char *what, int code), void *ctx);
/* Rebuilds the index from the shards' own tables. */
KVX_API int kvx_store_reindex(kvx_store *s);
/* Evicts to capacity and compacts mostly-dead or small shards. */
KVX_API int kvx_store_gc(kvx_store *s);
/* A snapshot of the live shards, each with a reference the caller drops
 * (kvx_shard_close each, then kvx_free(array)). */
KVX_API int kvx_store_shards(kvx_shard ***out_shards, size_t *out_n, kvx_store *s);

/* ------------------------------------------------------------------------
 * Data path: pinned buffer pool, io_uring fetch, warmup, GPU upload.
 * (Section owned by io/; see io/README in docs.)
 * ---------------------------------------------------------------------- */

typedef enum kvx_io_mode {
    KVX_IO_AUTO = 0,  /* io_uring, else the pread fallback */
    KVX_IO_URING = 1, /* io_uring only (fail if refused) */
    KVX_IO_PREAD = 2  /* buffered pread from a small thread pool */
} kvx_io_mode;

KVX_API const char *kvx_io_mode_name(int mode);

#ifdef __cplusplus
}
#endif
#endif /* KVX_H */
