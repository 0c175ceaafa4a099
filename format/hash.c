/*
 * hash.c - the chained block hash of spec/kv-block-hash-and-envelope.txt.
 *
 * H(parent, toks) = fnv1a64(le_u64(parent) || le_u32(toks[0]) || ...),
 * a computed 0 replaced by 1 (0 means "no hash": the partial tail block).
 * The bytes are fed straight into the FNV loop rather than staged in a
 * buffer, so hashing a 16-token block touches no memory but the tokens.
 */
#include "common/internal.h"

#define FNV_OFFSET 0xCBF29CE484222325ULL
#define FNV_PRIME 0x100000001B3ULL

static inline uint64_t fnv_bytes(uint64_t h, const uint8_t *p, size_t len)
{
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * FNV_PRIME;
    return h;
}

/* Four bytes of v in little-endian order, whatever the host order. */
static inline uint64_t fnv_u32(uint64_t h, uint32_t v)
{
    h = (h ^ (v & 0xFF)) * FNV_PRIME;
    h = (h ^ ((v >> 8) & 0xFF)) * FNV_PRIME;
    h = (h ^ ((v >> 16) & 0xFF)) * FNV_PRIME;
    h = (h ^ (v >> 24)) * FNV_PRIME;
    return h;
}

uint64_t kvx_fnv1a64(const void *data, size_t len)
{
    return fnv_bytes(FNV_OFFSET, (const uint8_t *)data, len);
}

uint64_t kvx_block_hash(uint64_t parent, const uint32_t *tokens, uint32_t block_tokens)
{
    uint64_t h = FNV_OFFSET;
    h = fnv_u32(h, (uint32_t)parent);
    h = fnv_u32(h, (uint32_t)(parent >> 32));
    for (uint32_t i = 0; i < block_tokens; i++) h = fnv_u32(h, tokens[i]);
    return h ? h : 1;
}

size_t kvx_block_hashes(uint64_t *out_hashes, const uint32_t *tokens, size_t n_tokens,
                        uint32_t block_tokens)
{
    if (block_tokens == 0) return 0;
    size_t n = n_tokens / block_tokens;
    uint64_t parent = 0;
    for (size_t i = 0; i < n; i++) {
        parent = kvx_block_hash(parent, tokens + i * block_tokens, block_tokens);
        out_hashes[i] = parent;
    }
    return n;
}
