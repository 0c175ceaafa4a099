/*
 * hash.c - the chained block hash of spec/kv-block-hash-and-envelope.txt.
 *
 * H(parent, toks) = fnv1a64(le_u64(parent) || le_u32(toks[0]) || ...),
 * a computed 0 replaced by 1 (0 means "no hash": the partial tail block).
 * The bytes are fed straight into the FNV loop rather than staged in a
 * buffer, so hashing a 16-token block touches no memory but the tokens.
 */
#include "common/internal.h"
#include "format/hash.h"

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

/* Four chains a step: the blocks at position i of four sequences (parents
 * p0..p3), each H(parent, tokens) computed as in kvx_block_hash with the
 * four dependent multiply chains interleaved token by token. */
static inline void block_hash4(uint64_t out[4], const uint64_t p[4], const uint32_t *const t[4], uint32_t B)
{
    uint64_t a = FNV_OFFSET, b = FNV_OFFSET, c = FNV_OFFSET, d = FNV_OFFSET;
    a = fnv_u32(a, (uint32_t)p[0]);
    b = fnv_u32(b, (uint32_t)p[1]);
    c = fnv_u32(c, (uint32_t)p[2]);
    d = fnv_u32(d, (uint32_t)p[3]);
    a = fnv_u32(a, (uint32_t)(p[0] >> 32));
    b = fnv_u32(b, (uint32_t)(p[1] >> 32));
    c = fnv_u32(c, (uint32_t)(p[2] >> 32));
    d = fnv_u32(d, (uint32_t)(p[3] >> 32));
    const uint32_t *t0 = t[0], *t1 = t[1], *t2 = t[2], *t3 = t[3];
    for (uint32_t i = 0; i < B; i++) {
        a = fnv_u32(a, t0[i]);
        b = fnv_u32(b, t1[i]);
        c = fnv_u32(c, t2[i]);
        d = fnv_u32(d, t3[i]);
    }
    out[0] = a ? a : 1;
    out[1] = b ? b : 1;
    out[2] = c ? c : 1;
    out[3] = d ? d : 1;
}

size_t kvx_block_hashes_multi(uint64_t *const *out, const uint32_t *const *tokens, const size_t *n_tokens,
                              size_t nseq, uint32_t block_tokens)
{
    if (block_tokens == 0 || nseq == 0) return 0;
    /* Four lanes, each working through one sequence; a lane whose sequence
     * ends takes the next one with blocks left. While four lanes are busy
     * they step together; the last (up to three) sequences finish alone. */
    struct lane {
        size_t seq, i, n;
        uint64_t parent;
    } L[4];
    size_t next = 0, total = 0;
    int busy = 0;
    for (;;) {
        while (busy < 4 && next < nseq) {
            size_t n = n_tokens[next] / block_tokens;
            if (n) L[busy++] = (struct lane){next, 0, n, 0};
            total += n;
            next++;
        }
        if (busy < 4) break;
        uint64_t p[4], h[4];
        const uint32_t *t[4];
        for (int k = 0; k < 4; k++) {
            p[k] = L[k].parent;
            t[k] = tokens[L[k].seq] + L[k].i * block_tokens;
        }
        block_hash4(h, p, t, block_tokens);
        for (int k = 0; k < 4; k++) {
            out[L[k].seq][L[k].i] = h[k];
            L[k].parent = h[k];
            L[k].i++;
        }
        for (int k = 0; k < busy;) { /* drop finished lanes, keeping the rest */
            if (L[k].i == L[k].n) L[k] = L[--busy];
            else k++;
        }
    }
    for (int k = 0; k < busy; k++) {
        uint64_t parent = L[k].parent;
        for (size_t i = L[k].i; i < L[k].n; i++) {
            parent = kvx_block_hash(parent, tokens[L[k].seq] + i * block_tokens, block_tokens);
            out[L[k].seq][i] = parent;
        }
    }
    return total;
}
