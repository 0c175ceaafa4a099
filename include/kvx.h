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
 *  - Output parameters come first and are named out*. The handle a call
 *    works on comes right after them, then the inputs. Exceptions, kept as
 *    they are because reordering would break callers (source and ABI):
 *      kvx_shard_verify(s, out_bad, report, ctx)     handle before out_bad
 *      kvx_store_verify(s, out_bad, report, ctx)     handle before out_bad
 *      kvx_store_put(s, ..., out_new)                nullable count last
 *      kvx_store_put_envelope(s, ..., out_new)       nullable count last
 *      kvx_store_batch_put(b, ..., out_new)          as kvx_store_put
 *      kvx_store_batch_put_envelope(b, ..., out_new) as kvx_store_put_envelope
 *      kvx_fetch_poll(f, out_done)                   handle before out_done
 *      kvx_fetch_wait(f, out, n, timeout_ms)         handle before out
 *    and outputs that come first but are not named out*:
 *      kvx_envelope_export(buf, cap, ...)            the caller's buffer
 *      kvx_gpu_copy_back(dst, g, dev, bytes)         the host destination
 *      kvx_spectral_apply(h, ...)                    h is updated in place
 *    The two batch puts mirror the calls they stand for, so a caller moves
 *    to a batch by changing the handle only. Other new functions follow
 *    the rule without exception.
 *  - Ownership and lifetime of what a call returns (each function's comment
 *    says which case it is):
 *      . a pointer-to-pointer output (kvx_shard **, void **out_buf, ...) is
 *        the caller's, released with the matching *_close / *_destroy /
 *        *_release / kvx_free; those accept NULL. Not the caller's:
 *        kvx_shard_page (the shard's mapping) and kvx_warmup_device_pages
 *        (the warmup's array);
 *      . a getter's pointer (kvx_shard_get_info, kvx_shard_path, the
 *        pointers inside kvx_entry and kvx_spectral) is owned by the handle
 *        and valid while the caller holds a reference to it;
 *      . a view's pointers (kvx_view, kvx_envelope) are valid while what
 *        they view is: the view's own shard reference, the caller's buffer;
 *      . strings from kvx_version, kvx_strerror, kvx_err_name,
 *        kvx_quant_name and kvx_io_mode_name are static; kvx_last_error is
 *        this thread's and valid until its next kvx call;
 *      . a string or pointer handed to a callback is valid during that
 *        call only.
 *  - Option structs carry a version field; initialise them with the
 *    matching *_INIT macro or *_options_init() function (the same values:
 *    the version, and 0 in every field whose default the create function
 *    picks, as documented at the field) so fields can be added later.
 *  - No call on a hot path needs a callback: results are returned in flat
 *    arrays and asynchronous work is polled. Every call is safe from cgo.
 *  - C never keeps a pointer it was given beyond the call, unless the
 *    function says so. Those that do: kvx_warmup_start (opts->host_buf and
 *    opts->gpu, until kvx_warmup_destroy), kvx_gpu_upload (src, until
 *    kvx_gpu_sync), kvx_fetch_create (pool, until kvx_fetch_destroy).
 *    Handles given to a call that keeps them (shards to kvx_fetch_submit
 *    and kvx_warmup_start) are held by a reference of their own. Strings
 *    and arrays (paths, dir, opts, reqs, spectral) are copied.
 *
 * Caveats:
 *  - Threads: kvx_shard and kvx_store handles are safe to share between
 *    threads. A kvx_shard_writer, kvx_fetch, kvx_pool or kvx_store_batch
 *    belongs to one thread at a time. The index is opened with MDB_NOTLS,
 *    so runtimes that move user threads between OS threads (Go) are fine.
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

/* "0.1.0": a static string. */
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
    XX(ECANCELED, -30030, "operation canceled")                                    \
    XX(EAMBIGUOUS, -30031, "several verified blocks share the hash: give tokens to pick one") \
    XX(EUNVERIFIED, -30032, "the block is held only unverified (stored without its tokens)") \
    XX(ESTALE, -30033, "the store's index was rebuilt since this handle opened it: open the store again") \
    XX(EDROPPED, -30034, "blocks put since the last flush were dropped by a failed call: they are not stored") \
    XX(ELOSSY, -30035, "a value is not exactly representable in the target format") \
    XX(ENOTHELD, -30036, "the block is not held here (never, or no longer): send it with its payload") \
    XX(EUNAVAILABLE, -30037, "the shared tier is unreachable (a miss, never a failed lookup)")

typedef enum kvx_error {
    KVX_OK = 0,
#define KVX_ERROR_ENUM_(name, value, msg) KVX_##name = value,
    KVX_ERROR_MAP(KVX_ERROR_ENUM_)
#undef KVX_ERROR_ENUM_
} kvx_error;

/* Message for a kvx code or a negative errno; never NULL. Static text; an
 * errno's is the C library's strerror() string. */
KVX_API const char *kvx_strerror(int code);
/* "KVX_EFORMAT", "ENOSPC", ...; never NULL, static. */
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
    KVX_QUANT_E5M2 = 2, /* OCP FP8 E5M2 */
    KVX_QUANT_BF16 = 3  /* bfloat16 (kvx extension): the KV dtype of most models */
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
/* "fp16", "e4m3", "e5m2", "bf16" (static); NULL for an unknown quant. */
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
 * Prefix digest (DESIGN.md, digest table): the proof that a block belongs
 * to a prompt. FNV-1a 64 names a block but collides on purpose in seconds,
 * so every lookup and dedup also compares this SHA-256 chain:
 *   d_0 = SHA-256(le_u32 t_0 .. t_{B-1}),  d_i = SHA-256(d_{i-1} || le_u32 tokens of block i).
 * ---------------------------------------------------------------------- */

#define KVX_DIGEST_BYTES 32

/* Digests of every full block of tokens into out (room for
 * n_tokens / block_tokens records of 32 bytes); returns the number of full
 * blocks, or 0 when block_tokens is 0. */
KVX_API size_t kvx_prefix_digests(uint8_t (*out)[KVX_DIGEST_BYTES], const uint32_t *tokens, size_t n_tokens,
                                  uint32_t block_tokens);
/* One link: out = SHA-256(prev || tokens) (prev NULL for block 0). */
KVX_API void kvx_prefix_digest_next(uint8_t out[KVX_DIGEST_BYTES], const uint8_t *prev, const uint32_t *tokens,
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
 *  - bf16 (the top half of an f32): overflow (|x| beyond the midpoint
 *    above 0x7F7F, about 3.39e38) goes to inf; inf is kept. A NaN keeps its
 *    sign and top 7 payload bits and comes out quiet (bit 0x0040 set), in
 *    both directions (bf16 -> f32 sets the f32 quiet bit 0x00400000), so
 *    every non-NaN bf16 round-trips exactly through f32.
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
KVX_API uint16_t kvx_f32_to_bf16(float x);
KVX_API float kvx_bf16_to_f32(uint16_t b);
KVX_API void kvx_f32_to_bf16_n(uint16_t *out, const float *in, size_t n);
KVX_API void kvx_bf16_to_f32_n(float *out, const uint16_t *in, size_t n);

/* ------------------------------------------------------------------------
 * TLKV export envelope (v1: f16, v2: e4m3 + f32 scales, v3: bf16, a kvx
 * extension with dtype 2 and the v1 layout; spec readers refuse it as an
 * unknown version). Payload layout [L][K|V][Hkv][B][D]; positions at or
 * past n_tokens are zero bytes.
 * ---------------------------------------------------------------------- */

#define KVX_ENVELOPE_V1 1
#define KVX_ENVELOPE_V2 2
#define KVX_ENVELOPE_V3 3
#define KVX_ENVELOPE_HEADER_BYTES 28

/* A validated, zero-copy view of an envelope; valid while its buffer is. */
typedef struct kvx_envelope {
    uint16_t version;
    uint16_t dtype;
    uint32_t n_blocks;
    kvx_geometry geometry; /* block_tokens, L, Hkv, D from the header;
                              quant FP16 (v1), E4M3 (v2) or BF16 (v3) */
    const uint8_t *data;
    size_t size;
    size_t payload_bytes; /* P */
} kvx_envelope;

/* One block of a parsed envelope (kvx_envelope_block_at): payload and
 * scales point into the envelope's buffer, valid while that buffer is. */
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
 * pool's B, L, Hkv, D: a mismatch is KVX_ESHAPE (expect->block_tokens 0
 * accepts any B). Bad length, magic, CRC, dtype, a zero or overflowing
 * dimension, n_tokens or the hash rule: KVX_EFORMAT. An intact envelope of
 * another version: KVX_EVERSION. Never allocates; out is set only on 0.
 * A v2 scale that is not finite and > 0: KVX_EFORMAT (names block, scale).
 * Order: length >= 32, magic, version, dtype, dimensions and exact length,
 * CRC, expect, blocks (docs/FORMAT.md). */
KVX_API int kvx_envelope_parse(kvx_envelope *out, const void *buf, size_t len,
                               const kvx_geometry *expect);
KVX_API int kvx_envelope_block_at(kvx_envelope_block *out, const kvx_envelope *env, uint32_t index);
/* Import to f32: every rule of kvx_envelope_parse (the same codes and
 * messages), and every block's payload decoded into out in payload order,
 * n_blocks * L*2*Hkv*B*D floats (v1 f16 and v3 bf16 widened exactly; v2
 * each e4m3 element times its slab's scale, as kvx_e4m3_to_f32_n), in one
 * pass over the envelope: each stretch is CRC'd and decoded while in the
 * cache, and the CRC of the whole is compared at the end. out_elems is the
 * room in out (KVX_ECAPACITY when short; out untouched). On any error,
 * including the CRC mismatch (KVX_EFORMAT), out's contents are undefined
 * (parts may be written): use out only on 0. out_env (nullable) is set as
 * kvx_envelope_parse sets it, only on 0. Large outputs are written with
 * streaming stores; out needs no alignment (32 bytes streams fastest). */
KVX_API int kvx_envelope_decode_f32(float *out, size_t out_elems, kvx_envelope *out_env, const void *buf,
                                    size_t len, const kvx_geometry *expect);
/* Writes a whole envelope (header, blocks, CRC) into buf of cap bytes.
 * Every block is checked first (n_tokens 1..B: KVX_ETOKENS; a hash on a
 * partial block: KVX_EHASH; cap too small: KVX_ECAPACITY), so on failure
 * buf is untouched. */
KVX_API int kvx_envelope_export(void *buf, size_t cap, uint16_t version, const kvx_geometry *g,
                                const kvx_envelope_block_in *blocks, uint32_t n_blocks);
/* The v2 writer rule for one block given as f32 [L][2][Hkv][B][D]:
 * scale = amax/448 over each slab's filled positions (1.0 when amax is 0,
 * or so small that amax/448 underflows), element = RNE e4m3 of x/scale;
 * positions >= n_tokens become 0. out_e4m3 holds L*2*Hkv*B*D bytes,
 * out_scales L*2*Hkv. A NaN or inf among the filled values: KVX_EINVALID. */
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
#define KVX_FLAG_DIGEST 0x10u /* digest table: needs KVX_FLAG_LINEAGE */
#define KVX_FLAG_KEYS 0x20u   /* key table: every entry a keyed page (DESIGN.md
                                 "Keyed pages"); mixes with no other table
                                 but the sequence and tombstone tables */
#define KVX_FLAG_SEQ 0x40u    /* sequence table: n x u64, each entry's commit
                                 sequence number (never 0), assigned by the
                                 store when the entry's batch commits */
#define KVX_FLAG_TOMB 0x80u   /* tombstone table: n bytes, 1 = the entry is a
                                 keyed delete (no page; it hides every copy of
                                 its key with a lower sequence number), 0 = a
                                 page; needs KVX_FLAG_KEYS and KVX_FLAG_SEQ */
#define KVX_KEY_RECORD 256u   /* bytes per key table record: u8 len, key, zeros */
#define KVX_KEY_MAX 255u      /* longest key */

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
    const uint8_t *digest;  /* 32-byte prefix digest; NULL without a digest
                               table or when all zero (unverified entry) */
    const uint8_t *key;     /* a keyed page's key (key_len bytes); NULL
                               without a key table. Its hash above is then
                               the first 8 bytes of SHA-256(key), LE: the
                               name the index uses (the file stores none) */
    uint32_t key_len;
} kvx_entry;

/* A spectral bundle as stored. psi of cartridge k is
 * psi + k * n_layers * dim * rank floats, laid out [layer][dim][rank].
 * ids and psi are owned by the shard: valid while it is held. */
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
/* Adds a reference; returns s (the same handle). */
KVX_API kvx_shard *kvx_shard_ref(kvx_shard *s);
/* Drops one reference; the last one unmaps and closes. NULL is fine. */
KVX_API void kvx_shard_close(kvx_shard *s);
/* The shard's header facts. Owned by the shard: valid while the caller
 * holds a reference to s (until its kvx_shard_close). NULL for NULL. */
KVX_API const kvx_shard_info *kvx_shard_get_info(const kvx_shard *s);
/* The path s was opened with. Owned by the shard: valid while the caller
 * holds a reference to s. NULL for NULL. */
KVX_API const char *kvx_shard_path(const kvx_shard *s);
/* The open file descriptor (read-only; owned by the shard: valid while s is
 * held, never to be closed by the caller). -1 for NULL and for the shard of
 * a view served from the shared tier (KVX_COORD_TIER: its pages are in
 * memory, there is no file); kvx_fetch_submit and kvx_warmup_* take such a
 * shard all the same (they copy its pages). */
KVX_API int kvx_shard_fd(const kvx_shard *s);
/* O(1). An index >= num_blocks is KVX_EINVALID. A tombstone (see
 * kvx_shard_entry_commit) has bytes 0, offset 0, crc32 0 and its key. */
KVX_API int kvx_shard_entry(kvx_entry *out, const kvx_shard *s, uint32_t index);
/* The commit record of entry index: its sequence number into *out_seq (0 in
 * a file without KVX_FLAG_SEQ) and whether it is a tombstone into
 * *out_tombstone (0 without KVX_FLAG_TOMB); either pointer may be NULL.
 * O(1); KVX_EINVALID for a NULL shard or an index >= num_blocks. */
KVX_API int kvx_shard_entry_commit(const kvx_shard *s, uint32_t index, uint64_t *out_seq, int *out_tombstone);
KVX_API int kvx_shard_find(uint32_t *out_index, const kvx_shard *s, uint32_t coordinate);
/* Zero-copy pointer into the mapping, valid while s is held. With verify,
 * a CRC mismatch is KVX_EPAGECRC (the pointer is still set). A tombstone
 * has no page: KVX_ENOTFOUND, *out_page NULL. */
KVX_API int kvx_shard_page(const void **out_page, const kvx_shard *s, uint32_t index, int verify);
/* Structure was checked at open; this checks every page CRC (a page now
 * past the end of a file truncated after open: KVX_ETRUNC, not read;
 * tombstones have no page and are skipped).
 * Returns 0 or the first failure; out_bad (nullable) gets the number of bad pages. Each
 * bad page is reported through report (nullable) with its index and code;
 * inside report, kvx_last_error() describes that page. */
KVX_API int kvx_shard_verify(const kvx_shard *s, uint32_t *out_bad,
                             void (*report)(void *ctx, uint32_t index, int code), void *ctx);
/* The shard's spectral bundle into *out; its ids and psi are owned by the
 * shard, valid while the caller holds a reference to s. KVX_ENOTFOUND
 * when the shard has no bundle. */
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
    uint32_t flags;       /* KVX_FLAG_HASHES | KVX_FLAG_LINEAGE | KVX_FLAG_SCALES ...;
                             KVX_FLAG_SEQ and KVX_FLAG_TOMB are the store's: a
                             sequence number is set by its internal calls, and
                             a seal with one still 0 fails */
    const kvx_spectral_in *spectral; /* nullable; copied */
    const char *staging_dir; /* nullable: where the temporary file lives until
                                the seal renames it to path (same file
                                system); NULL = path's own directory */
                             /* with staging_dir, the seal never replaces a
                                file at path (RENAME_NOREPLACE: -EEXIST) */
} kvx_shard_writer_options;
#define KVX_SHARD_WRITER_OPTIONS_VERSION 1
#define KVX_SHARD_WRITER_OPTIONS_INIT {KVX_SHARD_WRITER_OPTIONS_VERSION, {0, 0, 0, 0, 0, 0}, 0, 0, 0, NULL, NULL}
/* Fills *opts as KVX_SHARD_WRITER_OPTIONS_INIT does: the version, every
 * other field 0 or NULL (no geometry, no tables, no spectral bundle, the
 * temporary file beside path). Set geometry and max_entries before use. */
KVX_API void kvx_shard_writer_options_init(kvx_shard_writer_options *opts);

typedef struct kvx_entry_in {
    uint16_t radix_block;
    uint8_t spectral;
    uint32_t token_count;
    const void *page; /* kvx_page_bytes(g, token_count) bytes, layout [K|V][L][Hkv][N][D] */
    uint64_t hash;    /* with KVX_FLAG_HASHES; 0 = none (partial block) */
    uint64_t parent;  /* with KVX_FLAG_LINEAGE */
    const uint32_t *tokens; /* with KVX_FLAG_LINEAGE: token_count ids */
    const float *scales;    /* with KVX_FLAG_SCALES: L*2*Hkv; NULL = all 1.0 */
    const uint8_t *digest;  /* with KVX_FLAG_DIGEST: the block's 32-byte
                               prefix digest; NULL = unverified (all zero) */
    const void *key;        /* with KVX_FLAG_KEYS: 1..KVX_KEY_MAX bytes */
    uint32_t key_len;
    uint32_t page_len;      /* with KVX_FLAG_KEYS: the page's own length,
                               1..kvx_page_bytes(g, 1); token_count is 1 */
} kvx_entry_in;

/* Starts a shard that will appear at path only when sealed; until then it
 * lives in an unnamed temporary file (O_TMPFILE) in path's directory, so a
 * killed process leaves nothing behind, or in a named temporary file in
 * opts->staging_dir (the store's, emptied by its recovery). */
KVX_API int kvx_shard_writer_create(kvx_shard_writer **out, const char *path,
                                    const kvx_shard_writer_options *opts);
/* Copies the page into the file now (pwrite); nothing is kept in memory
 * but the tables. Refusals leave w usable: KVX_EFULL (max_entries reached),
 * KVX_ETOKENS (0, or > B with hashes), KVX_EHASH (hash on a partial block),
 * KVX_ELINEAGE (hash != H(parent, tokens)), KVX_EDUPLICATE (coordinate),
 * KVX_EFORMAT (a scale not finite and > 0), KVX_EINVALID (NULL page, no
 * tokens with lineage, scales without a scale table). */
KVX_API int kvx_shard_writer_add(kvx_shard_writer *w, const kvx_entry_in *e);
KVX_API uint32_t kvx_shard_writer_count(const kvx_shard_writer *w);
/* Bytes the sealed file will occupy so far (it ends on a 4096 boundary). */
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
 * writer rule, or copied as-is when g is E4M3: lossless; v3: bf16, copied
 * when g is BF16, else rounded to nearest even). out_payload has
 * kvx_envelope_payload_bytes(version, g) bytes; the v2 scales are its tail.
 * A BF16 page goes to v1 only when every value is exact in f16, else
 * KVX_ELOSSY naming the first element (layer, K|V, head, token, dim) and
 * its value, with out_payload untouched. */
KVX_API int kvx_page_to_envelope_payload(void *out_payload, uint16_t version, const kvx_geometry *g,
                                         const void *page, uint32_t n_tokens, const float *scales);
/* One envelope block becomes a KVX page in g's quant (must match the
 * envelope's B, L, Hkv, D). out_scales (L*2*Hkv, nullable) receives the
 * scales for an FP8 target (v2 -> E4M3 copies them exactly; v1 -> E4M3 uses
 * the v2 writer rule); with out_scales NULL the page is meant to decode at
 * scale 1.0 (values are rounded, and saturate in E4M3). E5M2 and BF16
 * targets use scale 1.0 always (round to nearest even). A finite value an
 * FP16 or E5M2 target could hold only as infinity (a bf16 or scaled v2
 * value past 65504 / 57344): KVX_ELOSSY naming the element, nothing
 * written. */
KVX_API int kvx_envelope_payload_to_page(void *out_page, float *out_scales, const kvx_geometry *g,
                                         const kvx_envelope *env, const kvx_envelope_block *blk);
/* An envelope becomes a sealed shard at path: v1 -> FP16, v2 -> E4M3 with a
 * scale table, v3 -> BF16; block i gets coordinate (shard_id, i, 0) and its hash. */
KVX_API int kvx_shard_from_envelope(const char *path, const void *env, size_t len, uint8_t shard_id,
                                    uint64_t model_signature);
/* Every entry of a shard becomes one block of a version envelope, written
 * into a malloc'd buffer the caller frees with kvx_free. Needs block_tokens
 * and every token_count <= B. An envelope that would pass the input bound
 * (DESIGN.md rule 5: 64 times the shard's data bytes, holes and a sparse
 * tail not counted, plus 1 MiB): KVX_ECAPACITY; a page missing (past the
 * end of the file): KVX_ETRUNC; a BF16 shard to v1 with a value f16
 * cannot hold: KVX_ELOSSY naming it. */
KVX_API int kvx_shard_to_envelope(void **out_buf, size_t *out_len, const kvx_shard *s,
                                  uint16_t version);
KVX_API void kvx_free(void *p);

/* ------------------------------------------------------------------------
 * The store: a persistent prefix cache indexed in LMDB
 * ---------------------------------------------------------------------- */

typedef struct kvx_store kvx_store;

#define KVX_STORE_READONLY 0x1u /* open for lookups only (no writer lock); a keyed
                                   store whose index/ does not name a committed
                                   file in shards/ is KVX_ESTALE (a reader never
                                   repairs: open the writer once) */
#define KVX_STORE_NOWAIT 0x2u   /* a second writer gets KVX_EBUSY at once */
#define KVX_STORE_VERIFY 0x4u   /* open: check every shard's meta CRC now (else
                                   at first use); lookups: check each served
                                   page's CRC every time it is served
                                   (KVX_EPAGECRC), not once per shard handle:
                                   see "Trust" at kvx_store_get */
#define KVX_STORE_NOSYNC 0x8u   /* benchmarks and tests only: LMDB commits
                                   without fsync (shards are still fsynced).
                                   The process's handles of a store share
                                   one LMDB environment: it syncs again once
                                   a handle without the flag joins it */
#define KVX_STORE_HOLES \
    0x10u /* writer: eviction frees cold pages in place
                                   (a hole punched where each was, after a
                                   durable record in DIR/FREED) instead of
                                   whole shards and carries; block stores on
                                   a file system with FALLOC_FL_PUNCH_HOLE
                                   (docs/STORE.md "Holes"). Read-only
                                   handles of other processes put punches
                                   off while they are open */

typedef struct kvx_store_options {
    uint32_t version; /* KVX_STORE_OPTIONS_VERSION */
    kvx_geometry geometry;
    uint64_t capacity_bytes; /* 0 = 64 GiB */
    uint32_t flags;          /* KVX_STORE_* */
    uint64_t shard_bytes;    /* target size of a sealed shard; 0 = capacity/64
                                clamped to [512 KiB, 1 GiB] (docs/STORE.md) */
    /* version 2: */
    uint64_t page_bytes; /* non-zero: a keyed store of pages of up to this
                            many bytes (an even number, see "Keyed pages"),
                            geometry left all zero */
    /* version 3: the shared tier (docs/TIER.md). kvx_store_create writes a
     * given tier_url (with tenant and TTL) to DIR/TIER; kvx_store_open_options
     * uses them for that handle only, instead of DIR/TIER. */
    const char *tier_url;    /* redis://[user[:pass]@]host:port[,host:port...];
                                NULL: DIR/TIER's (none at create); "off": no
                                tier for this handle */
    const char *tier_tenant; /* namespace salt (1..127 of [A-Za-z0-9._-]); NULL: none */
    uint64_t tier_ttl_ms;    /* TTL of the values written; 0: none */
} kvx_store_options;
#define KVX_STORE_OPTIONS_VERSION 3
#define KVX_STORE_OPTIONS_INIT {KVX_STORE_OPTIONS_VERSION, {0, 0, 0, 0, 0, 0}, 0, 0, 0, 0, NULL, NULL, 0}
/* Fills *opts as KVX_STORE_OPTIONS_INIT does: the version, no geometry,
 * capacity_bytes 0 (64 GiB), no flags, shard_bytes 0 (capacity/64 clamped
 * to [512 KiB, 1 GiB], computed from the capacity set later). Set geometry
 * before kvx_store_create. */
KVX_API void kvx_store_options_init(kvx_store_options *opts);

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
    uint64_t pending_blocks; /* put but not yet flushed (this handle, every batch) */
    uint64_t dropped_shards; /* shards whose records recovery dropped (file gone or invalid) */
    uint64_t shard_bytes;    /* target shard size */
    uint64_t quarantined;    /* files in DIR/quarantine/ (kept under its retention rule, docs/STORE.md) */
    uint64_t unverified;     /* blocks in shards without a digest table (put
                                without tokens, or written before the digest:
                                kvx_store_reindex derives theirs) */
    uint64_t page_bytes;     /* a keyed store's page size; 0 for a block store */
    /* the shared tier, this handle's counts since it opened (docs/TIER.md) */
    uint64_t tier_hits;       /* blocks a prefix got from the tier, verified */
    uint64_t tier_misses;     /* blocks asked of the tier and not served */
    uint64_t tier_errors;     /* of those: not answered (node down, timeout, breaker open) */
    uint64_t tier_bad;        /* of those: a value that failed verification */
    uint64_t tier_replaced;   /* bad values this writer replaced (compare-and-set) */
    uint64_t tier_writes;     /* values written behind (SET NX accepted) */
    uint64_t tier_bytes_up;   /* value bytes sent */
    uint64_t tier_bytes_down; /* value bytes received */
    uint64_t tier_up;         /* 1: the tier answered (or a probe now did); 0: down or none */
    uint64_t quarantine_bytes; /* bytes of those files: they count toward capacity_bytes */
    /* pages freed in place (KVX_STORE_HOLES, docs/STORE.md "Holes") in
     * live shards, each rounded up to 4096: bytes (the files' sizes) counts
     * them, the disk and the capacity do not (bytes - freed_bytes is what
     * the capacity holds). Read from DIR/FREED, in a reader as in the writer;
     * 0 when that log cannot be read (kvx_store_verify says why). */
    uint64_t freed_bytes;
} kvx_store_stats;

/* Creates a new store directory (0700) with fixed geometry and capacity. */
KVX_API int kvx_store_create(kvx_store **out, const char *dir, const kvx_store_options *opts);
/* Opens an existing store, runs recovery. expect (nullable): a geometry
 * that must match (KVX_ESHAPE / KVX_EMODEL otherwise). */
KVX_API int kvx_store_open(kvx_store **out, const char *dir, const kvx_geometry *expect,
                           uint32_t flags);
/* kvx_store_open with options (version 1 or 2): geometry, when its
 * num_layers is set, is the expectation; flags as kvx_store_open's;
 * tier_url / tier_tenant / tier_ttl_ms (version 2) override DIR/TIER for
 * this handle ("off": none). capacity_bytes and shard_bytes are ignored. */
KVX_API int kvx_store_open_options(kvx_store **out, const char *dir, const kvx_store_options *opts);
/* Unflushed puts are dropped (never acknowledged). With a shared tier, it
 * first waits for the values written behind to be sent (at most 2 s, then
 * they are dropped: the tier is best effort). NULL is fine. Destroy
 * the store's batches (kvx_store_batch_destroy) first; a batch still alive
 * loses its unflushed blocks here and is detached: it then takes only
 * kvx_store_batch_destroy (which frees it), every other call on it is
 * KVX_EINVALID. No call on the store or its batches may run during close. */
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
 * acknowledgement. The blocks put since the previous flush must fit the
 * store's capacity together: a put that would take them over answers
 * KVX_ECAPACITY ("flush first") and writes nothing.
 * kvx_store_put, kvx_store_put_envelope and kvx_store_flush work on the
 * handle's built-in batch, shared by every thread that calls them: a
 * failed put or flush drops every unflushed block in it, other threads'
 * too. When blocks that earlier successful puts added were dropped, the
 * next kvx_store_flush answers KVX_EDROPPED (once, naming how many and
 * why; it still publishes what was put after the failure), never 0. With
 * several writing threads, give each its own kvx_store_batch. */
KVX_API int kvx_store_flush(kvx_store *s);

/* A write batch: one caller's unflushed blocks. Its flush acknowledges
 * exactly the blocks put into it since its last flush; a failed put or
 * flush drops only its own unflushed blocks, never another batch's (nor
 * the built-in one's). The semantics are kvx_store_put's and
 * kvx_store_flush's, per batch: blocks published or pending in the same
 * batch are skipped, what one flush acknowledges must fit the capacity
 * (KVX_ECAPACITY, "flush first"), and a flush answers KVX_EDROPPED when a
 * failure dropped blocks of earlier successful puts. A block pending in
 * another batch is not "held": each batch writes its own copy (a flush
 * never depends on another batch's). A batch belongs to one thread at a
 * time; batches of one store may be used from many threads at once (their
 * puts and flushes take the store's writer lock in turn). */
typedef struct kvx_store_batch kvx_store_batch;
/* A new, empty batch of writer handle s (KVX_EINVALID for a read-only
 * handle). The caller destroys it before closing s. */
KVX_API int kvx_store_batch_create(kvx_store_batch **out, kvx_store *s);
/* kvx_store_put into batch b. */
KVX_API int kvx_store_batch_put(kvx_store_batch *b, const uint32_t *tokens, size_t n_tokens,
                                const void *pages, size_t n_pages, const float *scales,
                                size_t *out_new);
/* kvx_store_put_envelope into batch b. */
KVX_API int kvx_store_batch_put_envelope(kvx_store_batch *b, const void *env, size_t len,
                                         const uint32_t *tokens, size_t n_tokens, size_t *out_new);
/* Makes the blocks put into b since its last flush durable and visible, in
 * one catalog transaction; 0 is their acknowledgement. Another batch's
 * blocks stay unpublished. */
KVX_API int kvx_store_batch_flush(kvx_store_batch *b);
/* Drops b's unflushed blocks (never acknowledged: their files are deleted)
 * and frees b. NULL is fine. */
KVX_API void kvx_store_batch_destroy(kvx_store_batch *b);

/* Lookups fill views the caller releases with kvx_view_release(s).
 * Trust (DESIGN.md rule 1): every page a view points at has passed its
 * CRC-32 at least once since its shard was opened (KVX_EPAGECRC otherwise);
 * blocks stored without tokens are "unverified" and never served by a
 * prefix or token lookup. Without KVX_STORE_VERIFY a page is checked once
 * per shard handle and handed out again unchecked while the file keeps
 * its size and st_mtime (looked at every 20 ms at most): a file cut,
 * rewritten, hole-punched or regrown since has every page checked again.
 * What that cannot catch: bytes that change with neither (a disk or a
 * network file system returning other bytes for a cached-out page, a
 * same-size rewrite that sets the old mtime back); KVX_STORE_VERIFY checks
 * each page every time it is served (docs/FORMAT.md, "Truncation after
 * open"). */
KVX_API int kvx_store_get(kvx_view *out, kvx_store *s, uint32_t coordinate);
/* By hash alone: answers only when exactly one verified block holds hash.
 * Several verified blocks (an FNV collision): KVX_EAMBIGUOUS; only
 * unverified ones: KVX_EUNVERIFIED; none: KVX_ENOTFOUND. The message
 * names the hash. Use kvx_store_get_block to pick one by digest.
 * Damage is not "not found" (here, in kvx_store_get_block and
 * kvx_store_get; a prefix lookup still treats it as a miss): a block
 * whose page fails its CRC or lies past the end of its file is
 * KVX_EPAGECRC / KVX_ETRUNC, and when no block answers while the index
 * places one in a shard file that cannot be used, the answer is
 * KVX_ECORRUPT (the file is malformed, fails its checksum, is cut short
 * or is not this store's), KVX_EPATH (not a regular file), -ENOENT (gone)
 * or -EAGAIN (it could not be opened just now); the message names the
 * file and why. Nothing is repaired: a writer (gc) salvages or
 * quarantines. */
KVX_API int kvx_store_get_hash(kvx_view *out, kvx_store *s, uint64_t hash);
/* Batch by hash: out_views[i] / out_status[i] (0 or the codes above). */
KVX_API int kvx_store_get_hashes(kvx_view *out_views, int *out_status, kvx_store *s,
                                 const uint64_t *hashes, size_t n);
/* The block that ends at the last full block of tokens (n_tokens / B
 * blocks), matched on hash, parent, tokens and prefix digest. */
KVX_API int kvx_store_get_block(kvx_view *out, kvx_store *s, const uint32_t *tokens,
                                size_t n_tokens);
/* Longest cached prefix of tokens: fills up to max_views views of leading
 * full blocks and sets *out_n. A block is served only when its hash,
 * parent, tokens and prefix digest equal the prompt's; the prefix ends
 * before the first block that is missing, unverified or fails its page
 * CRC. Returns 0 whatever *out_n is; when the prefix ended at a damaged
 * page, kvx_last_error() names it (else it is ""). One call per prompt. */
KVX_API int kvx_store_prefix(kvx_view *out_views, size_t *out_n, kvx_store *s,
                             const uint32_t *tokens, size_t n_tokens, size_t max_views);
/* The longest cached prefix of tokens, as kvx_store_prefix's store part
 * serves it (the same blocks: hash, parent, tokens and prefix digest all
 * equal the prompt's), its pages read into the caller's memory: block i's
 * page_bytes at dst + i * dst_stride (dst_stride >= the store's
 * page_bytes), its CRC-32 checked there after the read, at every call;
 * out_scales (nullable) gets block i's L*2*Hkv scales at
 * out_scales + i * L*2*Hkv (1.0 where the store keeps none). Up to
 * max_blocks leading full blocks; *out_n is how many were served. The
 * prefix ends before the first block that is not held, unverified, or
 * whose every copy fails its CRC or its read (a damaged copy is passed
 * over when a sound one follows): then kvx_last_error() names it (else
 * it is ""). Only the first *out_n blocks are promised: the rest of dst
 * (and of out_scales) up to max_blocks may have been written (part of a
 * page, a damaged page's bytes: never use them). flags 0: through the
 * page cache (pages left there for the next reader): the run's pages are
 * asked of the kernel at once, then each is copied as it arrives and
 * checked. KVX_PREFIX_READ_DIRECT: pages the cache holds are copied from
 * it, the others read with O_DIRECT straight into dst where dst and
 * dst_stride are 4096-aligned, every read of the run in flight at once
 * (io_uring), neighbouring pages of a file as one read: no copy in the
 * kernel and nothing left in the cache, for a caller that keeps its own
 * copy. The shared tier is not consulted (kvx_store_prefix's views
 * are). Returns 0 whatever *out_n is; KVX_EINVALID naming the field for a
 * NULL out_n, store, tokens (with n_tokens > 0) or dst (with max_blocks >
 * 0), a dst_stride under page_bytes, out_scales overlapping dst, unknown
 * flags; KVX_EOVERFLOW when max_blocks * dst_stride overflows; a damaged
 * catalog record or a failed catalog read is an error. A keyed store:
 * KVX_EINVALID. */
#define KVX_PREFIX_READ_DIRECT 1u
KVX_API int kvx_store_prefix_read(size_t *out_n, kvx_store *s, const uint32_t *tokens, size_t n_tokens, void *dst,
                                  size_t dst_stride, size_t max_blocks, float *out_scales, uint32_t flags);
/* Exports views (in order) as one envelope of version into a malloc'd
 * buffer (kvx_free). Every page's CRC-32 is checked again first, whatever
 * was checked before (KVX_EPAGECRC naming the block; nothing is built),
 * and a view whose page, hash or token_count is not its (shard, entry)'s
 * is KVX_EINVALID naming the field. n may be 0: a valid envelope with n_blocks = 0. version 1, 2 or 3; a
 * BF16 store's views go to v1 only when every value is exact in f16
 * (KVX_ELOSSY naming the first that is not; v2 and v3 always work). */
KVX_API int kvx_views_export(void **out_buf, size_t *out_len, kvx_store *s, const kvx_view *views,
                             size_t n, uint16_t version);
KVX_API void kvx_view_release(kvx_view *v);
KVX_API void kvx_views_release(kvx_view *views, size_t n);

KVX_API int kvx_store_stat(kvx_store_stats *out, kvx_store *s);

/* What eviction removed: a block store's block hash, or a keyed store's
 * key, that no live shard holds any more. */
typedef struct kvx_evicted {
    uint64_t hash;    /* block stores: the block's chained hash; keyed: the
                         first 8 bytes of SHA-256(key), LE */
    uint32_t key_len; /* keyed stores: 1..KVX_KEY_MAX; block stores: 0 */
    uint8_t key[255]; /* keyed stores: the key, key_len bytes */
} kvx_evicted;

/* The most a handle keeps for kvx_store_evicted between two calls. */
#define KVX_EVICTED_MAX 65536u

/* Takes, oldest first, up to max of what this handle's evictions removed
 * since the last call: the blocks (block stores) or keys (keyed stores)
 * that an eviction, or gc (a headless chain, a bad page), dropped and no
 * live shard holds afterwards (a block
 * carried forward, or a key whose newer copy lives on, is not reported).
 * *out_n: how many were written to out. out_dropped (may be NULL): how
 * many were removed but not kept, since the last call that asked: past
 * KVX_EVICTED_MAX waiting the oldest are dropped (the caller lags), and a
 * victim whose entries cannot be read back counts its entries here. Only a
 * writer evicts: a reader handle always answers 0 and 0. Call it from any
 * thread; it takes no store-wide lock. */
KVX_API int kvx_store_evicted(kvx_store *s, kvx_evicted *out, size_t max, size_t *out_n, uint64_t *out_dropped);

/* ------------------------------------------------------------------------
 * The shared tier (docs/TIER.md): Redis Cluster, or one Redis, under the
 * store. After a flush, its blocks are written behind (SET NX); a prefix
 * lookup that misses locally continues into the tier, and every value is
 * verified before use; a writer handle copies the blocks it got into the
 * store (an ordinary put), a reader handle serves them from memory (their
 * views' coordinate is KVX_COORD_TIER, their shard path "(shared tier)").
 * The tier can lose anything: a failure there is a miss, never an error.
 * ---------------------------------------------------------------------- */

#define KVX_COORD_TIER 0xFFFFFFFFu

typedef struct kvx_store_tier {
    char url[1024];   /* "" when the handle has no tier; the password as *** */
    char tenant[128]; /* "" when none */
    uint64_t ttl_ms;
    uint64_t ns;      /* the namespace of the keys, kvx:1:<ns>:... */
    int from_file;    /* the setting comes from DIR/TIER (else the options) */
    int cluster;      /* 1 Redis Cluster, 0 one Redis, -1 not contacted yet */
} kvx_store_tier;
/* What this handle uses. */
KVX_API int kvx_store_tier_get(kvx_store_tier *out, kvx_store *s);
/* Writer: writes DIR/TIER atomically (url NULL or "off": removes it) and
 * applies it to this handle (after draining its write-behind, at most
 * 2 s). tenant nullable; ttl_ms 0: no TTL. A tier down is no error here.
 * No other call on s may run during it (as for kvx_store_close). */
KVX_API int kvx_store_tier_set(kvx_store *s, const char *url, const char *tenant, uint64_t ttl_ms);
/* PING the tier now: 0, or KVX_EUNAVAILABLE (KVX_ENOTFOUND without a tier). */
KVX_API int kvx_store_tier_ping(kvx_store *s);
/* Checks every shard and page against the index; out_bad (nullable) gets
 * the number of problems found, each reported through report (nullable)
 * with its code (what is valid during that report call only). Notes that
 * are not problems (a valid shard file the index does not name yet: the
 * next writer adopts it) come with code 0 and do not count. */
KVX_API int kvx_store_verify(kvx_store *s, uint64_t *out_bad,
                             void (*report)(void *ctx, const char *what, int code), void *ctx);
/* Rebuilds the index from the shards' own tables (a fresh index: nothing
 * of the old one is read). The built-in batch's unflushed blocks are
 * flushed first (the next kvx_store_flush acknowledges them); while another
 * kvx_store_batch holds unflushed blocks, KVX_EBUSY and nothing changes
 * (flush or destroy it first). It is the plan of kvx_store_plan_reindex,
 * applied: files in shards/ that cannot be validated, that are foreign, or
 * that claim a shard byte a newer file holds move to DIR/quarantine/ (kept
 * under its retention rule, docs/STORE.md "Quarantine"); files of a commit
 * that never answered are deleted (never acknowledged); then 0, and
 * kvx_store_recovery and kvx_last_error() say what was done. Stores
 * written before the prefix digest are refused (KVX_EVERSION). */
KVX_API int kvx_store_reindex(kvx_store *s);
/* The same for a store that may not open: index/ missing or damaged. Takes
 * the writer lock (KVX_STORE_NOWAIT: KVX_EBUSY at once), moves index/
 * aside, builds a fresh one from shards/, removes the old one on success
 * (puts it back on failure). */
KVX_API int kvx_store_reindex_dir(const char *dir, uint32_t flags);

/* What a recovery or reindex did (or, for a plan, will do), by file
 * (docs/STORE.md "Recovery at open" and "Quarantine"). */
typedef struct kvx_recovery_report {
    uint64_t rebuilt;          /* 1: a fresh index from the files; 0: the catalog stood */
    uint64_t shards_kept;      /* shard files indexed */
    uint64_t blocks_indexed;   /* entries the index holds */
    uint64_t quarantined;      /* shard files moved to quarantine/ (damaged, foreign, a lost claim) */
    uint64_t deleted_unacked;  /* shard files of a commit that never answered, deleted */
    uint64_t deleted_dropped;  /* sound victims of a committed eviction or compaction, deleted */
    uint64_t temporaries;      /* staging/ files removed: temporaries and spent marks */
    uint64_t left_alone;       /* entries that are not kvx's to touch (not regular files, other names) */
    uint64_t expired;          /* quarantine/ files its retention rule removed */
    uint64_t failed;           /* steps that could not be done (they stay for the next recovery) */
} kvx_recovery_report;

/* kvx_store_reindex_dir, and what it did in *out (nullable). */
KVX_API int kvx_store_reindex_dir_report(const char *dir, uint32_t flags, kvx_recovery_report *out);
/* What this writer's open (its recovery), its last kvx_store_reindex or
 * its last kvx_store_gc (quarantined only) did; all zero for a reader. */
KVX_API int kvx_store_recovery(const kvx_store *s, kvx_recovery_report *out);

/* A reindex's plan, computed from the files and changing nothing: what
 * `kvx store reindex` (kvx_store_reindex_dir) would do with every file.
 * It takes no lock, never reads index/, and works on a read-only mount
 * and while a writer runs (staging/ then holds that writer's work in
 * progress, planned as a crash would leave it). Free with
 * kvx_store_plan_free. */
typedef struct kvx_store_plan kvx_store_plan;
typedef struct kvx_plan_step {
    const char *dir;      /* "shards", "staging" or "quarantine" */
    const char *name;     /* the file's name in dir */
    const char *action;   /* "keep", "quarantine", "delete" or "leave" */
    const char *reason;   /* why (never empty) */
    uint64_t bytes;       /* its size */
    int64_t shard_byte;   /* keep: the shard byte it holds; else -1 */
    uint64_t indexed;     /* keep: entries the index will hold from it */
} kvx_plan_step;
KVX_API int kvx_store_plan_reindex(kvx_store_plan **out, const char *dir);
KVX_API size_t kvx_store_plan_steps(const kvx_store_plan *p);
/* Step i (strings valid until kvx_store_plan_free). */
KVX_API int kvx_store_plan_step(const kvx_store_plan *p, size_t i, kvx_plan_step *out);
KVX_API void kvx_store_plan_summary(const kvx_store_plan *p, kvx_recovery_report *out);
/* The next sequence number the rebuilt index will hold. */
KVX_API uint64_t kvx_store_plan_next_seq(const kvx_store_plan *p);
KVX_API void kvx_store_plan_free(kvx_store_plan *p);
/* Evicts to capacity and compacts mostly-dead or small shards. */
KVX_API int kvx_store_gc(kvx_store *s);
/* A snapshot of the live shards, each with a reference the caller drops
 * (kvx_shard_close each, then kvx_free(array)). A registered shard that
 * cannot be opened now is left out: compare *out_n with
 * kvx_store_stats.shards (the CLI's warmup names each one). */
KVX_API int kvx_store_shards(kvx_shard ***out_shards, size_t *out_n, kvx_store *s);

/* ------------------------------------------------------------------------
 * Keyed pages (DESIGN.md "Keyed pages"; docs/STORE.md "Keyed stores")
 *
 * A keyed store (kvx_store_options.page_bytes set, no geometry) holds
 * opaque pages of 1..page_bytes bytes named by an engine's own keys of
 * 1..KVX_KEY_MAX bytes (LMCache's "model@world_size@worker@chunk_hash@dtype"
 * strings, SGLang's SHA-256 hex page keys). The index maps the first 8
 * bytes of SHA-256(key) to locations and every hit compares the whole key
 * stored in the shard's key table. Durability (put, then flush), page CRC,
 * capacity, eviction, recovery, reindex and quarantine are the blocks'.
 * Keyed pages are never served by token prefix; a block store answers the
 * keyed calls, and a keyed store the block calls, with KVX_EINVALID.
 * kvx_store_get_geometry of a keyed store gives its shards' synthetic
 * geometry (E4M3, B 0, 2*L*Hkv*D = page_bytes).
 * ---------------------------------------------------------------------- */

/* The synthetic geometry of a keyed store's shards for page_bytes (an
 * even number, half of it a product of three numbers of at most 65535):
 * E4M3, one token, B 0, 2*L*Hkv*D = page_bytes. KVX_EINVALID otherwise.
 * Pass it as kvx_store_open's expect to refuse another page size
 * (KVX_ESHAPE). */
KVX_API int kvx_keyed_geometry(kvx_geometry *out, uint64_t page_bytes);
/* The index name of a key: the first 8 bytes of SHA-256(key), LE. */
KVX_API uint64_t kvx_key_hash(const void *key, size_t len);

typedef struct kvx_key {
    const void *bytes;
    size_t len; /* 1..KVX_KEY_MAX */
} kvx_key;

/* Puts n keyed pages into batch b (NULL: the store's built-in batch, as
 * kvx_store_put): page i is pages[i], page_lens[i] bytes (1..page_bytes).
 * A key already held, or pending in the same batch, is skipped; out_new
 * (nullable) gets the number written. Nothing is visible or durable until
 * that batch's flush returns 0. Every key and length is checked before
 * anything is written: an empty key or one over KVX_KEY_MAX bytes, a page
 * of 0 or more than page_bytes bytes, a NULL page: KVX_EINVALID naming the
 * index. */
KVX_API int kvx_store_keyed_put(kvx_store *s, kvx_store_batch *b, const kvx_key *keys,
                                const void *const *pages, const size_t *page_lens, size_t n,
                                size_t *out_new);
/* Gets n keyed pages: out_views[i] with out_status[i] 0, or out_status[i]
 * KVX_ENOTFOUND (not held), KVX_EPAGECRC (only damaged copies) and a
 * zeroed view. Views are zero-copy and CRC-checked (view.page_bytes is the
 * page's own length); release them with kvx_views_release (zeroed ones
 * too). Returns 0 unless the call itself failed (bad key: KVX_EINVALID). */
KVX_API int kvx_store_keyed_get(kvx_view *out_views, int *out_status, kvx_store *s,
                                const kvx_key *keys, size_t n);
/* Reads n keyed pages into the caller's memory: page i into dst[i]
 * (dst_cap[i] bytes, at least the store's page_bytes: KVX_EINVALID naming
 * the index otherwise; the buffers' first min(dst_cap[i], page_bytes)
 * bytes must not overlap: KVX_EINVALID naming two), its CRC-32 checked
 * there after the read, every time. out_status[i] 0 and out_lens[i] (nullable) its length; or
 * KVX_ENOTFOUND (not held), KVX_EPAGECRC / KVX_ETRUNC (only damaged
 * copies), a read's -errno (-EIO): then dst[i]'s bytes are unspecified
 * (it may hold part of a page, or bad bytes: never use them) and
 * out_lens[i] is 0. Pages the page cache holds are copied from it; others
 * are read with O_DIRECT straight into dst[i] when it and the page are
 * 4096-aligned (a pinned host buffer), else through the cache. For loads
 * that copy pages out (vLLM's host slots); kvx_store_keyed_get hands
 * out zero-copy views instead. Returns 0 unless the call failed. */
KVX_API int kvx_store_keyed_read(int *out_status, size_t *out_lens, kvx_store *s, const kvx_key *keys,
                                 size_t n, void *const *dst, const size_t *dst_cap);
/* out_held[i] (nullable) = 1 when key i is held (published, its page
 * sound); *out_leading (nullable) = the number of leading keys held. */
KVX_API int kvx_store_keyed_exists(uint8_t *out_held, size_t *out_leading, kvx_store *s,
                                   const kvx_key *keys, size_t n);
/* As kvx_store_keyed_exists, without reading a page: held means indexed,
 * its shard usable and its entry naming the whole key; a damaged page is
 * found when it is read (kvx_store_keyed_read / _get answer
 * KVX_EPAGECRC), never served. Each key held counts as a hit and a use,
 * as for a get. For a tier's lookups and touches, where
 * reading every page to answer "held?" would read it twice. */
KVX_API int kvx_store_keyed_contains(uint8_t *out_held, size_t *out_leading, kvx_store *s,
                                     const kvx_key *keys, size_t n);
/* The owner deletes keyed pages it named (DESIGN.md rule 2): a commit of
 * its own, one tombstone per key held (a small shard file with the
 * commit's sequence number, docs/STORE.md), durable when 0 returns, and
 * one catalog edit; compaction reclaims the bytes. A deleted key never
 * comes back, whatever happens to index/. Keys not held are ignored;
 * out_deleted (nullable) counts the pages removed. At most 65,536 keys
 * held per call (KVX_EFULL beyond: delete in smaller calls). Writer
 * handles only. A key pending in an unflushed batch is not touched (its
 * flush, a later commit, publishes it). */
KVX_API int kvx_store_keyed_delete(kvx_store *s, const kvx_key *keys, size_t n,
                                   size_t *out_deleted);

/* ------------------------------------------------------------------------
 * tl.kv.v1 transfer core (transfer/; docs/TRANSFER.md)
 *
 * The receiving engine's rules, independent of the RPC stack: the gRPC
 * service (bindings/go/transfer, kvxd) and a C engine with its own stack
 * call these and answer each failure with kvx_xfer_grpc_code(rc). The
 * receiver never trusts a hash it was sent: it recomputes the FNV chain
 * and the prefix digest chain from the chunks' token ids.
 * ---------------------------------------------------------------------- */

#define KVX_XFER_MAX_PAYLOAD (4u << 20) /* bytes of one KvChunk.payload */

/* gRPC status codes (grpc's status.h numbering). */
#define KVX_GRPC_OK 0
#define KVX_GRPC_CANCELLED 1
#define KVX_GRPC_INVALID_ARGUMENT 3
#define KVX_GRPC_RESOURCE_EXHAUSTED 8
#define KVX_GRPC_FAILED_PRECONDITION 9
#define KVX_GRPC_ABORTED 10
#define KVX_GRPC_INTERNAL 13
#define KVX_GRPC_UNAVAILABLE 14
#define KVX_GRPC_DATA_LOSS 15

/* The status a transfer call's result answers with: 0 OK; KVX_EINVALID
 * INVALID_ARGUMENT; KVX_EVERSION, KVX_EMODEL and KVX_ELOSSY (a block
 * this store's element type holds only as infinity) FAILED_PRECONDITION;
 * KVX_ENOTHELD ABORTED; a broken envelope, CRC, hash, token or shape rule
 * DATA_LOSS; KVX_ECAPACITY, KVX_EFULL, KVX_EBUSY, ENOMEM, ENOSPC
 * RESOURCE_EXHAUSTED; KVX_ECANCELED CANCELLED; anything else INTERNAL. */
KVX_API int kvx_xfer_grpc_code(int rc);

/* A lease: the shards holding the blocks one HasBlocks reported held stay
 * pinned (no eviction, compaction or gc drops them) until
 * kvx_xfer_lease_destroy, within a budget all leases of the store share
 * (their shard files' bytes: half the capacity, at least two shards);
 * past it a block is still reported held but its shard is not pinned, so
 * leases cannot keep the store over its capacity. The caller keeps the clock: it destroys the
 * lease when the push naming it ends or its ttl passes. Destroy every
 * lease before kvx_store_close. A lease never guarantees a push: a block
 * that is gone anyway (damaged, reindexed) answers KVX_ENOTHELD there. */
typedef struct kvx_xfer_lease kvx_xfer_lease;

/* HasBlocks on writer handle s: out_held[i] (n_hashes bytes) = 1 when
 * block i is held, and *out_lease (nullable) pins those blocks.
 * block_tokens 0 means the store's B; another B: KVX_EINVALID. A non-zero
 * model_signature other than the store's: KVX_EMODEL. With tokens (the
 * prompt's ids from position 0, at least n_hashes * B of them; fewer:
 * KVX_EINVALID), hashes must be the FNV chain of those tokens (else
 * KVX_EINVALID naming the first that is not) and a block is held when a
 * verified block matches its hash, parent, tokens and prefix digest.
 * Without tokens (n_tokens 0), held means "a verified block holds this
 * hash" (one or several: the push re-verifies by digest). */
KVX_API int kvx_xfer_has_blocks(uint8_t *out_held, kvx_xfer_lease **out_lease, kvx_store *s,
                                const uint64_t *hashes, size_t n_hashes, const uint32_t *tokens,
                                size_t n_tokens, uint32_t block_tokens, uint64_t model_signature);
/* Unpins. NULL is fine. */
KVX_API void kvx_xfer_lease_destroy(kvx_xfer_lease *l);

/* One KvChunk, as received. Pointers are the caller's, read during the
 * kvx_xfer_stream_chunk call only. */
typedef struct kvx_xfer_chunk {
    uint32_t kv_format;     /* envelope version: 1, 2 or 3 */
    uint64_t block_hash;    /* 0 for the partial tail */
    const void *payload;    /* a one-block envelope; NULL/0 = "you hold it" */
    size_t payload_len;
    uint32_t crc32c;        /* of the payload bytes */
    const uint32_t *tokens; /* this block's ids: B, or 1..B-1 for the tail */
    size_t n_tokens;
    uint64_t model_signature; /* 0 = not given */
} kvx_xfer_chunk;

/* What one accepted chunk was. */
typedef struct kvx_xfer_block {
    uint32_t index;    /* position in the stream, 0 first */
    uint32_t n_tokens;
    uint64_t hash;     /* recomputed from the tokens; 0 for the tail */
    uint8_t stored;    /* newly written (durable at kvx_xfer_stream_finish) */
    uint8_t referenced;/* empty payload, found held and pinned */
    uint8_t tail;      /* the partial tail: checked, never stored */
} kvx_xfer_block;

/* PushKvResponse's fields. */
typedef struct kvx_xfer_result {
    uint32_t blocks_stored;     /* full blocks newly written */
    uint32_t blocks_referenced; /* full blocks sent empty and found held */
    uint64_t bytes_received;    /* payload (envelope) bytes, no framing */
    uint32_t tail_tokens;       /* the tail's n_tokens, 0 if none */
    uint8_t durable;            /* 1 once finish flushed */
} kvx_xfer_result;

/* One PushKv stream: its own write batch on writer handle s, so one
 * stream's failure discards only its own blocks; it ends with one catalog
 * edit (kvx_xfer_stream_finish). Chunk checks, in order: kv_format (not
 * 1, 2 or 3: KVX_EVERSION, before the payload is looked at), a non-zero
 * model_signature other than the store's (KVX_EMODEL), a chunk after the
 * tail (KVX_EINVALID), the token count (KVX_ETOKENS), the recomputed hash
 * (KVX_EHASH when block_hash is not it), then an empty payload: the block
 * must be held, matched on hash, parent, tokens and prefix digest
 * (KVX_ENOTHELD naming it otherwise; found: pinned until finish); a
 * payload: at most KVX_XFER_MAX_PAYLOAD (KVX_EFORMAT), its crc32c
 * (KVX_ECORRUPT), every envelope reader rule against the store's
 * geometry, version == kv_format, n_blocks == 1, the envelope's hash and
 * n_tokens equal to the chunk's (KVX_EFORMAT / KVX_ESHAPE / KVX_EHASH /
 * KVX_ETOKENS). The first failure fails the stream: its blocks are
 * dropped, later calls answer the same code, nothing is published. A
 * stream is never published before its finish: one that would need it
 * (its blocks reaching the store's capacity, the store's shard ids
 * running out) fails with KVX_ECAPACITY / KVX_EFULL instead. A stream
 * alive at kvx_store_close answers KVX_EINVALID (destroy it all the same).
 * A stream belongs to one thread at a time; many streams of one store may
 * run at once. Destroy every stream before kvx_store_close. */
typedef struct kvx_xfer_stream kvx_xfer_stream;
KVX_API int kvx_xfer_stream_create(kvx_xfer_stream **out, kvx_store *s);
/* Checks and applies one chunk; out_block (nullable) says what it was. */
KVX_API int kvx_xfer_stream_chunk(kvx_xfer_stream *st, const kvx_xfer_chunk *c,
                                  kvx_xfer_block *out_block);
/* The stream ended well: flushes its blocks (durable and visible; one
 * catalog edit) and fills *out. 0 is the acknowledgement. */
KVX_API int kvx_xfer_stream_finish(kvx_xfer_stream *st, kvx_xfer_result *out);
/* The counts so far (bytes_received includes a failed chunk's payload). */
KVX_API void kvx_xfer_stream_progress(kvx_xfer_result *out, const kvx_xfer_stream *st);
/* Drops what an unfinished stream wrote (never acknowledged) and frees
 * it. NULL is fine. */
KVX_API void kvx_xfer_stream_destroy(kvx_xfer_stream *st);

/* The sender's envelope version for store geometry g (tl.kv.v1 rule):
 * the lossless one: FP16 and E5M2 (a subset of f16) -> 1; E4M3 -> 2; BF16
 * -> 3 when a one-block envelope fits KVX_XFER_MAX_PAYLOAD, else 2 (lossy:
 * FP8 with scales, documented). requested 1, 2
 * or 3 is checked instead: a one-block envelope over the limit is
 * KVX_ECAPACITY; v1 from a BF16 store may still fail per block at
 * kvx_views_export with KVX_ELOSSY. requested 0 applies the rule. */
KVX_API int kvx_xfer_pick_format(uint16_t *out_version, const kvx_geometry *g, uint16_t requested);

/* ------------------------------------------------------------------------
 * Data path: pinned buffer pool, io_uring fetch, warmup, GPU upload.
 * (Section owned by io/; see docs/DATAPATH.md.)
 * ---------------------------------------------------------------------- */

typedef enum kvx_io_mode {
    KVX_IO_AUTO = 0,  /* io_uring, else the pread fallback */
    KVX_IO_URING = 1, /* io_uring only (fail if refused) */
    KVX_IO_PREAD = 2  /* buffered pread from a small thread pool */
} kvx_io_mode;

/* "auto", "uring", "pread"; "unknown" for any other value. Static. */
KVX_API const char *kvx_io_mode_name(int mode);

/* --- Pinned buffer pool ----------------------------------------------------
 * One anonymous mapping placed on a NUMA node (libnuma), locked in RAM
 * (mlock), registered with CUDA (cudaHostRegister) when kvx is built with
 * CUDA and a GPU is present, and registered as io_uring fixed buffers by
 * every kvx_fetch created on it. The pool hands out slots: 4096-aligned
 * ranges that never cross a 1 GiB registration chunk. Slots are what
 * fetches land in; callers may also take slots for their own staging.
 * The pool's memory is C-owned: hand pointers to Go, never the reverse.
 * A pool may be shared by several kvx_fetch handles (slot allocation is
 * locked); destroy it after all of them. */

typedef struct kvx_pool kvx_pool;

#define KVX_POOL_NODE_AUTO (-1) /* the GPU's node when known, else this thread's */

#define KVX_POOL_NO_MLOCK 0x1u    /* do not mlock (io_uring registration still pins) */
#define KVX_POOL_NO_CUDA 0x2u     /* do not cudaHostRegister */
#define KVX_POOL_NO_REGISTER 0x4u /* fetches on this pool use plain reads, not READ_FIXED */

typedef struct kvx_pool_options {
    uint32_t version; /* KVX_POOL_OPTIONS_VERSION */
    uint64_t bytes;   /* size; rounded up to 4096. 0 = 64 MiB */
    int numa_node;    /* KVX_POOL_NODE_AUTO or a node number */
    int gpu;          /* CUDA device whose node is the default and which
                         registration targets; -1 = none */
    uint32_t flags;   /* KVX_POOL_* */
} kvx_pool_options;
#define KVX_POOL_OPTIONS_VERSION 1
#define KVX_POOL_OPTIONS_INIT {KVX_POOL_OPTIONS_VERSION, 0, KVX_POOL_NODE_AUTO, 0, 0}
/* Fills *opts as KVX_POOL_OPTIONS_INIT does: the version, bytes 0 (64 MiB),
 * numa_node KVX_POOL_NODE_AUTO, gpu 0, no flags (locked, registered). */
KVX_API void kvx_pool_options_init(kvx_pool_options *opts);

typedef struct kvx_pool_info {
    void *base;          /* valid until kvx_pool_destroy */
    uint64_t bytes;
    uint64_t free_bytes;
    int numa_node;       /* node the memory is bound to; -1 without NUMA */
    int locked;          /* 1 when mlock'd */
    int cuda_registered; /* 1 when cudaHostRegister'ed */
} kvx_pool_info;

/* KVX_EMEMLOCK (message: the limit, its current value, the bytes needed)
 * when RLIMIT_MEMLOCK refuses the lock; KVX_EINVALID for a node that does
 * not exist; -ENOMEM when the node has no room. */
KVX_API int kvx_pool_create(kvx_pool **out, const kvx_pool_options *opts);
/* NULL is fine. Every kvx_fetch / kvx_warmup using the pool must be gone. */
KVX_API void kvx_pool_destroy(kvx_pool *p);
KVX_API int kvx_pool_get_info(kvx_pool_info *out, kvx_pool *p);
/* A 4096-aligned slot of at least bytes; KVX_ECAPACITY when no free range
 * is large enough. The slot is the caller's until kvx_pool_free. */
KVX_API int kvx_pool_alloc(void **out, kvx_pool *p, uint64_t bytes);
/* ptr and bytes as given to/returned by kvx_pool_alloc. KVX_EINVALID for a
 * range that is not an allocated slot of p. */
KVX_API int kvx_pool_free(kvx_pool *p, void *ptr, uint64_t bytes);

/* --- Fetch: shard pages into pinned memory --------------------------------
 * A batch of (shard, entry) requests becomes coalesced reads of adjacent
 * pages (sorted by file and offset, runs up to max_read_bytes), issued with
 * io_uring (O_DIRECT with statx STATX_DIOALIGN alignment, READ_FIXED into
 * the registered pool, registered files) or, when io_uring is refused or
 * not wanted, buffered preads from a small thread pool. Each page's CRC-32
 * is checked as it lands. One batch is in flight per handle; use several
 * handles on one pool to pipeline. Typical use (cgo: one crossing each):
 *
 *     kvx_fetch_submit(f, reqs, n);          // copies reqs, starts I/O
 *     while (kvx_fetch_wait(f, res, n, 10) == -ETIMEDOUT)
 *         if (canceled) kvx_fetch_cancel(f); // then wait drains
 *     ... use res[i].page (pinned) ...
 *     kvx_fetch_release(f);                  // pages go back to the pool
 */

typedef struct kvx_fetch kvx_fetch;

#define KVX_FETCH_NO_VERIFY 0x1u /* skip the per-page CRC check */
#define KVX_FETCH_BUFFERED 0x2u  /* never O_DIRECT (use the page cache) */

typedef struct kvx_fetch_options {
    uint32_t version;        /* KVX_FETCH_OPTIONS_VERSION */
    int io_mode;             /* kvx_io_mode; AUTO = io_uring, else pread */
    uint32_t queue_depth;    /* reads in flight; 0 = 64 */
    uint32_t threads;        /* pread fallback workers; 0 = 4 */
    uint32_t max_read_bytes; /* coalescing cap per read; 0 = 4 MiB */
    uint32_t flags;          /* KVX_FETCH_* */
} kvx_fetch_options;
#define KVX_FETCH_OPTIONS_VERSION 1
#define KVX_FETCH_OPTIONS_INIT {KVX_FETCH_OPTIONS_VERSION, KVX_IO_AUTO, 0, 0, 0, 0}
/* Fills *opts as KVX_FETCH_OPTIONS_INIT does: the version, KVX_IO_AUTO,
 * queue_depth 0 (64), threads 0 (4), max_read_bytes 0 (4 MiB), no flags
 * (verified, O_DIRECT where the file system allows). */
KVX_API void kvx_fetch_options_init(kvx_fetch_options *opts);

typedef struct kvx_fetch_req {
    kvx_shard *shard; /* referenced by the batch until kvx_fetch_release */
    uint32_t entry;   /* entry index within shard */
} kvx_fetch_req;

typedef struct kvx_fetch_result {
    void *page;     /* pinned pool memory (4096-aligned); valid until
                       kvx_fetch_release / the next submit / destroy */
    uint64_t bytes; /* kv_page_bytes */
    int status;     /* 0; KVX_EPAGECRC; KVX_ETRUNC (page past end of
                       file); KVX_ENOTFOUND (no such entry, or a
                       tombstone: no page); KVX_ECANCELED;
                       a -errno of the read */
    uint32_t crc32; /* CRC-32 computed (0 with KVX_FETCH_NO_VERIFY) */
} kvx_fetch_result;

/* KVX_IO_URING when io_uring is refused is the refusal's -errno
 * (-ENOSYS, -EPERM); KVX_EMEMLOCK when buffer registration is refused. The
 * environment variable KVX_IO_FORCE_NO_URING=1 makes ring setup fail with
 * -EPERM (tests and operators use it to force the fallback). */
KVX_API int kvx_fetch_create(kvx_fetch **out, kvx_pool *pool, const kvx_fetch_options *opts);
/* A second handle sharing peer's queue (ring, queue depth, open files,
 * pool, options), with its own batch. Driving either handle (poll, wait,
 * release) reaps reads of both, so while one batch's tail lands the other
 * handle's next batch keeps the queue full: alternate two peers to stream
 * pages at a steady depth. Drive handles sharing a queue from one thread
 * at a time; destroy them in any order. */
KVX_API int kvx_fetch_create_peer(kvx_fetch **out, kvx_fetch *peer);
/* Waits for reads in flight, releases the batch. NULL is fine. */
KVX_API void kvx_fetch_destroy(kvx_fetch *f);
/* KVX_IO_URING or KVX_IO_PREAD: the path in use. */
KVX_API int kvx_fetch_mode(const kvx_fetch *f);
/* 1 when O_DIRECT reads were used for at least one file of the last batch. */
KVX_API int kvx_fetch_direct(const kvx_fetch *f);
/* Starts a batch (releasing the previous one). The whole batch's slots are
 * taken from the pool at once: KVX_ECAPACITY when they do not fit. Bad
 * requests (NULL shard, entry out of range) only fail their own page. A
 * page of a view served from the shared tier (its shard has no file,
 * kvx_shard_fd -1) is copied into its slot and checked there at submit, no
 * read: done, status 0, before any wait. */
KVX_API int kvx_fetch_submit(kvx_fetch *f, const kvx_fetch_req *reqs, size_t n);
/* Makes progress without blocking; *out_done (nullable) = pages finished. */
KVX_API int kvx_fetch_poll(kvx_fetch *f, size_t *out_done);
/* Waits up to timeout_ms (< 0: forever) for the whole batch. 0: done and
 * out[0..n) filled (n must equal the batch size); -ETIMEDOUT: not yet. */
KVX_API int kvx_fetch_wait(kvx_fetch *f, kvx_fetch_result *out, size_t n, int timeout_ms);
/* No new reads start; pages not read end KVX_ECANCELED. Wait still needed. */
KVX_API int kvx_fetch_cancel(kvx_fetch *f);
/* Returns the batch's slots to the pool and drops its shard references.
 * It first waits for the batch's reads in flight; if that wait fails for
 * good, those reads may still land: their slots stay taken until the pool
 * is destroyed, and every later submit on the queue (this handle's and its
 * peers') fails with -EIO naming the failed wait. */
KVX_API void kvx_fetch_release(kvx_fetch *f);

/* --- GPU upload (CUDA) ------------------------------------------------------
 * A device arena (one cudaMalloc) filled with cudaMemcpyAsync on several
 * streams from pinned pool memory, plus a device page table: an array of
 * device pointers (one per entry, uint64_t each) uploaded to the device,
 * ready for a paged-attention kernel. Built without CUDA every call returns
 * KVX_ENOCUDA; with CUDA but no GPU at run time, KVX_ENOGPU. Device
 * addresses are uint64_t (CUdeviceptr). */

typedef struct kvx_gpu kvx_gpu;

typedef struct kvx_gpu_options {
    uint32_t version;     /* KVX_GPU_OPTIONS_VERSION */
    int device;           /* CUDA device ordinal */
    uint64_t arena_bytes; /* device arena size; 0 = 256 MiB */
    uint32_t streams;     /* copy streams; 0 = 4 */
} kvx_gpu_options;
#define KVX_GPU_OPTIONS_VERSION 1
#define KVX_GPU_OPTIONS_INIT {KVX_GPU_OPTIONS_VERSION, 0, 0, 0}
/* Fills *opts as KVX_GPU_OPTIONS_INIT does: the version, device 0,
 * arena_bytes 0 (256 MiB), streams 0 (4). */
KVX_API void kvx_gpu_options_init(kvx_gpu_options *opts);

/* Number of usable GPUs (0 with none); KVX_ENOCUDA without CUDA. */
KVX_API int kvx_gpu_count(int *out);
/* NUMA node of a device (from its PCI bus id in sysfs); -1 when unknown. */
KVX_API int kvx_gpu_numa_node(int *out_node, int device);
KVX_API int kvx_gpu_create(kvx_gpu **out, const kvx_gpu_options *opts);
/* Waits for copies in flight and frees the arena. NULL is fine. */
KVX_API void kvx_gpu_destroy(kvx_gpu *g);
/* Reserves bytes (256-aligned) of the arena; KVX_ECAPACITY when full.
 * *out_dev is valid until kvx_gpu_reset or kvx_gpu_destroy. */
KVX_API int kvx_gpu_reserve(uint64_t *out_dev, kvx_gpu *g, uint64_t bytes);
/* Frees every reservation (after kvx_gpu_sync). */
KVX_API void kvx_gpu_reset(kvx_gpu *g);
/* Queues n host->device copies (src should be pinned pool memory; it must
 * stay untouched until kvx_gpu_sync) on the streams in turn. */
KVX_API int kvx_gpu_upload(kvx_gpu *g, const uint64_t *dev, const void *const *src,
                           const uint64_t *bytes, size_t n);
/* Waits for every queued copy. */
KVX_API int kvx_gpu_sync(kvx_gpu *g);
/* Uploads n device pointers as a uint64_t array in the arena: the device
 * page table. *out_table is its device address, valid until kvx_gpu_reset
 * or kvx_gpu_destroy. */
KVX_API int kvx_gpu_page_table(uint64_t *out_table, kvx_gpu *g, const uint64_t *dev_ptrs,
                               size_t n);
/* Synchronous device->host copy, for verification. */
KVX_API int kvx_gpu_copy_back(void *dst, kvx_gpu *g, uint64_t dev, uint64_t bytes);

/* --- Spectral steering on the device (CUDA) ----------------------------------
 * kvx_spectral_apply where the hidden states live: one cartridge's psi
 * (every layer of the bundle) uploaded once to a device and kept there;
 * each apply updates n rows of hidden states already in device memory,
 * h' = h + gamma * psi_l (psi_l^T h), on the caller's stream, without a
 * host round trip. One fused kernel (docs/DATAPATH.md, "Spectral
 * steering"): each row is read once and written once; the sums run in f32
 * whatever the element type. Built without CUDA: KVX_ENOCUDA.
 *
 *     kvx_spectral b;  kvx_shard_spectral(&b, shard);
 *     kvx_gpu_spectral *sp;
 *     kvx_gpu_spectral_create(&sp, 0, &b, 3);             // cartridge id 3
 *     ... in the forward pass, on the engine's stream:
 *     kvx_gpu_spectral_apply(sp, layer, (uint64_t)h, n_tokens, d_model,
 *                            KVX_GPU_BF16, 0.5f, stream);
 *     kvx_gpu_spectral_destroy(sp);                        // after the stream */

typedef enum kvx_gpu_dtype {
    KVX_GPU_F32 = 0,  /* float */
    KVX_GPU_BF16 = 1, /* bfloat16 */
    KVX_GPU_F16 = 2   /* IEEE binary16 */
} kvx_gpu_dtype;

typedef struct kvx_gpu_spectral kvx_gpu_spectral;

/* Uploads cartridge cartridge_id of bundle (kvx_shard_spectral's, or the
 * caller's own arrays in that layout: psi [n_layers][dim][rank] per
 * cartridge) to device `device`. The bundle is copied: it need not outlive
 * the call. KVX_ENOTFOUND for an id the bundle lacks; KVX_ESPECTRAL for a
 * bundle that is not one (dims 0, rank > dim, ids not 1..32 increasing,
 * a non-finite psi value); KVX_ENOGPU, KVX_ECAPACITY (device memory). */
KVX_API int kvx_gpu_spectral_create(kvx_gpu_spectral **out, int device, const kvx_spectral *bundle,
                                    uint32_t cartridge_id);
/* Waits for nothing: destroy it after the streams that used it are done
 * (the device memory is freed at once). NULL is fine. */
KVX_API void kvx_gpu_spectral_destroy(kvx_gpu_spectral *sp);
/* Queues h' = h + gamma * psi_l (psi_l^T h) on `stream` (a cudaStream_t;
 * NULL: the legacy default stream) for rows i < n_rows of dim elements,
 * row i at element h + i * row_stride (row_stride >= dim), of type dtype
 * (kvx_gpu_dtype), where l is the model layer (first_layer <= layer <
 * first_layer + n_layers) and gamma in [0, 1]. h is a device address on
 * sp's device, aligned to its element size, and must stay allocated until
 * the stream has run the kernel (sp too). Returns after the launch; an
 * error of the kernel itself shows at the caller's next synchronisation.
 * n_rows 0: nothing queued. KVX_EINVALID names a bad argument. */
KVX_API int kvx_gpu_spectral_apply(kvx_gpu_spectral *sp, uint32_t layer, uint64_t h, uint64_t n_rows,
                                   uint64_t row_stride, int dtype, float gamma, void *stream);

/* --- Bulk warmup ------------------------------------------------------------
 * Every page of whole shards (or a whole store: kvx_store_shards, or
 * kvx_warmup_collect) is read in large sequential runs into a ring of pinned
 * staging buffers, its CRC checked, and handed to a sink while the next
 * reads are in flight (double buffering). A page failing its CRC is
 * counted, named in the report, and not delivered (its sink range is left
 * as it was; on the GPU its page table slot is 0).
 *
 * Sink layout (host buffer and GPU arena alike): pages in input order
 * (shards in the order given, entries by index; a tombstone has no page and
 * no place), each at the next multiple of 256 bytes; kvx_warmup_sink_bytes gives the size needed. An input
 * without a file (a shared-tier view's shard) has its pages copied from
 * memory into staging, checked and delivered the same way (not counted in
 * bytes_read). */

typedef enum kvx_sink_kind {
    KVX_SINK_DISCARD = 0, /* read and verify only (a checksum of the bytes is reported) */
    KVX_SINK_HOST = 1,    /* copy into host_buf */
    KVX_SINK_GPU = 2      /* upload into gpu's arena (needs CUDA) */
} kvx_sink_kind;

#define KVX_WARMUP_NO_VERIFY 0x1u /* skip page CRCs */
#define KVX_WARMUP_BUFFERED 0x2u  /* never O_DIRECT (use the page cache) */

/* How a GPU warmup moves pages to the device (docs/DATAPATH.md, "GPU").
 * Whatever the path, a page is delivered (its bytes at its place in the
 * arena, its page-table slot set) only after its CRC-32 passed; a bad page
 * is reported and its slot is 0. */
typedef enum kvx_gpu_path {
    KVX_GPU_PATH_AUTO = 0,         /* MAPPED for data in the page cache, STAGING for the disk */
    KVX_GPU_PATH_STAGING = 1,      /* read into pinned staging, CRC-32 on the CPU lanes as
                                      the bytes land, copy engine from staging */
    KVX_GPU_PATH_STAGING_GPU_CRC = 2, /* read into pinned staging, copy engine to device
                                      landing buffers, CRC-32 on the GPU */
    KVX_GPU_PATH_MAPPED = 3        /* the shard file's mapping registered read-only with the
                                      driver (cudaHostRegisterReadOnly), the copy engine
                                      reads the page cache directly, CRC-32 on the GPU: no
                                      CPU pass over the bytes. Where the driver or the
                                      device refuses, STAGING instead (see
                                      kvx_warmup_stages.fallback) */
} kvx_gpu_path;

/* "auto", "staging", "staging-gpu-crc", "mapped"; "unknown" otherwise. Static. */
KVX_API const char *kvx_gpu_path_name(int path);

typedef struct kvx_warmup_progress {
    uint64_t bytes_done;  /* page bytes delivered or failed so far */
    uint64_t bytes_total; /* page bytes of every input */
    uint64_t pages_done;
    uint64_t pages_total;
    uint64_t crc_failures;
    double seconds;
    int finished; /* 1 once every page is done, or after cancel */
} kvx_warmup_progress;

typedef struct kvx_warmup_options {
    uint32_t version;      /* KVX_WARMUP_OPTIONS_VERSION */
    int io_mode;           /* kvx_io_mode. AUTO without KVX_WARMUP_BUFFERED:
                              data found in the page cache (mincore, >= 90%)
                              is read by buffered pread workers, one per CPU;
                              cold data by io_uring with O_DIRECT. CRCs (and
                              the host-sink copy) run on worker threads. */
    uint32_t flags;        /* KVX_WARMUP_* */
    uint32_t queue_depth;  /* reads in flight; 0 = 8 */
    uint32_t chunk_bytes;  /* bytes per read; 0 = 4 MiB (grown to fit the largest page) */
    int numa_node;         /* staging node; KVX_POOL_NODE_AUTO */
    int sink;              /* kvx_sink_kind */
    void *host_buf;        /* KVX_SINK_HOST: kvx_warmup_sink_bytes bytes
                              (kept by kvx_warmup_start: see there) */
    uint64_t host_buf_bytes;
    kvx_gpu *gpu;          /* KVX_SINK_GPU: arena of kvx_warmup_sink_bytes + 8 per page
                              (kept by kvx_warmup_start: see there) */
    /* kvx_warmup_run only: called on the calling thread about every
     * 100 ms and once at the end. Nullable. */
    void (*progress)(void *ctx, const kvx_warmup_progress *p);
    void *progress_ctx;
    /* version 2: */
    uint32_t threads;      /* CPU lanes: the pread workers on cached data and
                              the threads that check CRCs (and copy to a host
                              sink); 0 = one per CPU, at most 16 (4 pread
                              workers for the disk). At most 64 */
    int gpu_path;          /* KVX_SINK_GPU: kvx_gpu_path, how pages reach the
                              device and where their CRCs are checked */
} kvx_warmup_options;
#define KVX_WARMUP_OPTIONS_VERSION 2
#define KVX_WARMUP_OPTIONS_INIT                                                            \
    {KVX_WARMUP_OPTIONS_VERSION, KVX_IO_AUTO, 0, 0, 0, KVX_POOL_NODE_AUTO, KVX_SINK_DISCARD, \
     NULL, 0, NULL, NULL, NULL, 0, 0}
/* Fills *opts as KVX_WARMUP_OPTIONS_INIT does: the version, KVX_IO_AUTO,
 * no flags, queue_depth 0 (8), chunk_bytes 0 (4 MiB; 1 MiB for data in the
 * page cache), numa_node KVX_POOL_NODE_AUTO, KVX_SINK_DISCARD, no host
 * buffer, no GPU, no progress callback, threads 0 (one per CPU, at most
 * 16), KVX_GPU_PATH_AUTO. Version 1 options (without threads and gpu_path)
 * are still accepted, with those defaults. */
KVX_API void kvx_warmup_options_init(kvx_warmup_options *opts);

typedef struct kvx_warmup_failure {
    const char *path; /* the shard's path; owned by the report: valid
                         until kvx_warmup_report_free */
    uint32_t shard;   /* index into the inputs */
    uint32_t entry;   /* entry index within the shard */
    int code;         /* KVX_EPAGECRC, KVX_ETRUNC, -EIO, ... */
} kvx_warmup_failure;

typedef struct kvx_warmup_report {
    uint64_t bytes;        /* page bytes delivered good */
    uint64_t pages;        /* pages delivered good */
    uint64_t crc_failures; /* pages failing their CRC */
    uint64_t io_failures;  /* pages lost to read errors or truncation */
    uint64_t bytes_read;   /* bytes read from the files */
    double seconds;
    double gbps;           /* bytes / seconds / 1e9 */
    int io_mode;           /* KVX_IO_URING or KVX_IO_PREAD */
    int direct;            /* 1 when O_DIRECT was used */
    int canceled;
    uint64_t checksum;     /* KVX_SINK_DISCARD: sum of the pages' CRC-32s */
    uint64_t gpu_page_table; /* KVX_SINK_GPU: device address of the table in
                                opts->gpu's arena (until kvx_gpu_reset /
                                kvx_gpu_destroy) */
    kvx_warmup_failure *failures; /* n_failures; the report owns them: valid
                                     until kvx_warmup_report_free */
    size_t n_failures;
} kvx_warmup_report;

typedef struct kvx_warmup kvx_warmup;

/* Sink bytes the inputs need (layout above). */
KVX_API int kvx_warmup_sink_bytes(uint64_t *out, kvx_shard *const *shards, size_t n);
/* Blocking warmup with the optional progress callback. The return is 0
 * when the warmup ran to the end, even with failed pages (see the report). */
KVX_API int kvx_warmup_run(kvx_warmup_report *out, kvx_shard *const *shards, size_t n,
                           const kvx_warmup_options *opts);
/* The same on a background thread (opts->progress is ignored): poll
 * kvx_warmup_get_progress, kvx_warmup_cancel, and kvx_warmup_wait. The
 * warmup holds references on the shards and copies opts and the shards
 * array, but keeps opts->host_buf and opts->gpu: its thread writes into
 * host_buf and uploads through gpu, so both must stay valid (the buffer
 * allocated, the kvx_gpu not destroyed or reset) until kvx_warmup_destroy
 * returns. */
KVX_API int kvx_warmup_start(kvx_warmup **out, kvx_shard *const *shards, size_t n,
                             const kvx_warmup_options *opts);
KVX_API int kvx_warmup_get_progress(kvx_warmup_progress *out, kvx_warmup *w);
KVX_API int kvx_warmup_cancel(kvx_warmup *w);
/* 0 and the report when finished; -ETIMEDOUT after timeout_ms (< 0:
 * forever). Other results: the warmup's own failure (setup, sink). */
KVX_API int kvx_warmup_wait(kvx_warmup_report *out, kvx_warmup *w, int timeout_ms);
/* Cancels if running, waits, frees. NULL is fine. */
KVX_API void kvx_warmup_destroy(kvx_warmup *w);
/* Per-page device pointers after a GPU warmup (input order, tombstones
 * skipped as in the sink layout; 0 for a failed page). The array is the warmup's (not to be freed): valid until
 * kvx_warmup_destroy; the addresses lie in opts->gpu's arena. */
KVX_API int kvx_warmup_device_pages(const uint64_t **out, size_t *out_n, kvx_warmup *w);
KVX_API void kvx_warmup_report_free(kvx_warmup_report *r);

/* Where a finished warmup's time went, stage by stage: what a GPU run
 * needs to see which stage bounds it. CPU stages are summed over the
 * threads that ran them; GPU stages are measured with CUDA events and
 * summed over streams (they overlap each other and the CPU's). The caller
 * sets version; fields of later versions are left alone. */
typedef struct kvx_warmup_stages {
    uint32_t version;        /* KVX_WARMUP_STAGES_VERSION, set by the caller */
    int gpu_path;            /* KVX_SINK_GPU: the kvx_gpu_path that ran (never AUTO);
                                0 for other sinks */
    int fallback;            /* 0, or why (part of) a MAPPED or GPU-CRC warmup went
                                through STAGING: the refusal's code (KVX_EMEMLOCK,
                                -EOPNOTSUPP: registration refused; KVX_ECAPACITY: no
                                device memory for landing buffers; -errno of mmap) */
    char fallback_why[160];  /* its message, "" when none */
    uint32_t lanes;          /* CPU threads that read or checked */
    uint64_t mapped_bytes;   /* page bytes the copy engine read from the mapping */
    uint64_t staged_bytes;   /* page bytes that went through pinned staging */
    double read_s;           /* reads into staging: pread calls, or io_uring
                                submission to completion, summed over reads */
    double crc_cpu_s;        /* CRC-32 on the CPU, summed over lanes */
    double register_s;       /* mapping and registering (and unregistering) file windows */
    double h2d_s;            /* GPU: host-to-device copies */
    double crc_gpu_s;        /* GPU: the CRC and gather kernels */
    double sync_s;           /* the driving thread blocked: on reads, on a staging
                                buffer's or a window's copy, on the final sync */
    double seconds;          /* the whole warmup, as the report's */
} kvx_warmup_stages;
#define KVX_WARMUP_STAGES_VERSION 1
/* Fills *out (out->version set by the caller) for a finished warmup
 * (kvx_warmup_wait returned its report). KVX_EBUSY while it runs. */
KVX_API int kvx_warmup_get_stages(kvx_warmup_stages *out, kvx_warmup *w);
/* Opens what `kvx warmup DIR|FILE.kvx...` names: a directory is a store
 * (opened read-only; its live shards), anything else a shard file. The
 * caller drops each reference (kvx_shard_close) and kvx_free(array). */
KVX_API int kvx_warmup_collect(kvx_shard ***out_shards, size_t *out_n, const char *const *paths,
                               size_t n_paths);

#ifdef __cplusplus
}
#endif
#endif /* KVX_H */
