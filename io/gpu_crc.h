/*
 * gpu_crc.h - CRC-32 (IEEE 802.3, zlib's) of pages already in device
 * memory: the math of the CRC kernel, written once for both compilers.
 * gpu_kernels.cu compiles it for the GPU (KVX_HD = __host__ __device__);
 * gpu_crc.c compiles the same functions for the host, where the tests
 * check them against ISA-L on the same inputs and the fake device of the
 * tests runs them as its "kernel".
 *
 * How a page of n bytes is cut (so thousands of threads share one page):
 *  - the page is seen as nchunks = ceil(n / CHUNK) chunks of CHUNK bytes,
 *    aligned to the page's END: the first chunk is short, as if the page
 *    were preceded by zero bytes. A raw CRC (register 0, no pre or post
 *    inversion) does not change with leading zeros, so every chunk and
 *    every lane segment is treated as exactly its nominal length;
 *  - a warp takes one chunk, lane t its SEG bytes at t * SEG; each lane
 *    computes the raw CRC of its segment (table-driven, slicing-by-8,
 *    the tables built in shared memory by each block);
 *  - the warp folds its 32 lane values in a tree: at level k a value
 *    covering 2^k segments is shifted past the 2^k segments after it
 *    (times x^(8 * SEG * 2^k) mod P) and XORed with theirs;
 *  - lane 0 shifts the chunk's value past the chunks after it in the page
 *    (x^(8 * CHUNK * m), by squaring from a table) and XORs it into the
 *    page's accumulator (atomicXor: order does not matter, XOR is linear);
 *  - the finishing thread turns the page's raw CRC into the standard one:
 *    crc = raw ^ (0xFFFFFFFF * x^(8n)) ^ 0xFFFFFFFF, i.e. the register
 *    started at all ones and the result inverted (zlib's convention).
 * Polynomial arithmetic is in zlib's reflected form (multmodp, x2nmodp):
 * bit 31 is x^0.
 */
#ifndef KVX_GPU_CRC_H
#define KVX_GPU_CRC_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define KVX_HD __host__ __device__
#else
#define KVX_HD
#endif

#define KVX_GCRC_POLY 0xEDB88320u                      /* CRC-32, reflected */
#define KVX_GCRC_ONE 0x80000000u                       /* x^0 in the reflected form */
#define KVX_GCRC_SEG 256u                              /* bytes per lane */
#define KVX_GCRC_LANES 32u                             /* lanes per warp */
#define KVX_GCRC_CHUNK (KVX_GCRC_SEG * KVX_GCRC_LANES) /* bytes per warp: 8 KiB */
#define KVX_GCRC_TABLE_WORDS (8u * 256u)

/* Powers of x the kernel needs, computed once on the host
 * (kvx_gcrc_consts_init) and passed to the kernels by value. */
typedef struct kvx_gcrc_consts {
    uint32_t seg_pow[5];    /* x^(8 * SEG * 2^k), k = 0..4: the warp's tree */
    uint32_t chunk_pow[48]; /* x^(8 * CHUNK * 2^k): past the chunks after one */
    uint32_t byte_pow[64];  /* x^(8 * 2^k): the initial register's share */
} kvx_gcrc_consts;

/* a * b mod P (zlib's multmodp). */
KVX_HD static inline uint32_t kvx_gcrc_mul(uint32_t a, uint32_t b)
{
    uint32_t m = KVX_GCRC_ONE, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ KVX_GCRC_POLY : b >> 1;
    }
    return p;
}

/* x^(unit * n) mod P from tab[k] = x^(unit * 2^k) (ntab entries). */
KVX_HD static inline uint32_t kvx_gcrc_pow(const uint32_t *tab, unsigned ntab, uint64_t n)
{
    uint32_t p = KVX_GCRC_ONE;
    for (unsigned k = 0; n && k < ntab; k++, n >>= 1)
        if (n & 1) p = kvx_gcrc_mul(tab[k], p);
    return p;
}

/* Entry b of slicing table k (0..7): table 0 is the byte-at-a-time table,
 * table k the CRC of byte b followed by k zero bytes. */
KVX_HD static inline uint32_t kvx_gcrc_table_entry(unsigned k, unsigned b)
{
    uint32_t c = b;
    for (unsigned j = 0; j < 8; j++) c = c & 1 ? (c >> 1) ^ KVX_GCRC_POLY : c >> 1;
    for (unsigned i = 0; i < k; i++) {
        uint32_t t = c & 0xFF;
        for (unsigned j = 0; j < 8; j++) t = t & 1 ? (t >> 1) ^ KVX_GCRC_POLY : t >> 1;
        c = t ^ (c >> 8);
    }
    return c;
}

/* Raw CRC (no inversions) of n bytes at p, continuing register c:
 * byte-at-a-time up to 8-byte alignment, then 8 bytes a step through the
 * eight tables (t: KVX_GCRC_TABLE_WORDS, table k at t + 256 k). */
KVX_HD static inline uint32_t kvx_gcrc_raw(const uint32_t *t, uint32_t c, const uint8_t *p, uint64_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = t[(c ^ *p++) & 0xFF] ^ (c >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
#if defined(__CUDA_ARCH__)
        w = *(const uint64_t *)(const void *)p;
#else
        memcpy(&w, p, 8);
#endif
        uint32_t lo = c ^ (uint32_t)w, hi = (uint32_t)(w >> 32);
        c = t[7 * 256 + (lo & 0xFF)] ^ t[6 * 256 + ((lo >> 8) & 0xFF)] ^ t[5 * 256 + ((lo >> 16) & 0xFF)] ^
            t[4 * 256 + (lo >> 24)] ^ t[3 * 256 + (hi & 0xFF)] ^ t[2 * 256 + ((hi >> 8) & 0xFF)] ^
            t[1 * 256 + ((hi >> 16) & 0xFF)] ^ t[hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = t[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

/* Chunks of a page of n bytes (0 for an empty page). */
KVX_HD static inline uint64_t kvx_gcrc_nchunks(uint64_t n) { return (n + KVX_GCRC_CHUNK - 1) / KVX_GCRC_CHUNK; }

/* Raw CRC of lane `lane`'s segment of chunk j of the page (page, n):
 * the segment's nominal bytes that lie before the page are zeros and
 * are skipped (they do not change a raw CRC). */
KVX_HD static inline uint32_t kvx_gcrc_lane(const uint32_t *t, const uint8_t *page, uint64_t n, uint64_t j,
                                            unsigned lane)
{
    uint64_t pad = kvx_gcrc_nchunks(n) * KVX_GCRC_CHUNK - n;
    uint64_t v0 = j * KVX_GCRC_CHUNK + (uint64_t)lane * KVX_GCRC_SEG; /* nominal, counting the pad */
    uint64_t v1 = v0 + KVX_GCRC_SEG;
    if (v1 <= pad) return 0;
    uint64_t s = v0 > pad ? v0 - pad : 0, e = v1 - pad;
    return kvx_gcrc_raw(t, 0, page + s, e - s);
}

/* One step of the warp's tree at level k: a (2^k segments) shifted past
 * b (the 2^k segments after it), XOR b. */
KVX_HD static inline uint32_t kvx_gcrc_tree(const kvx_gcrc_consts *c, uint32_t a, uint32_t b, unsigned k)
{
    return kvx_gcrc_mul(c->seg_pow[k], a) ^ b;
}

/* A chunk's raw CRC v placed at the page's end: shifted past the chunks
 * after chunk j of a page of nchunks. */
KVX_HD static inline uint32_t kvx_gcrc_place(const kvx_gcrc_consts *c, uint32_t v, uint64_t nchunks, uint64_t j)
{
    return kvx_gcrc_mul(kvx_gcrc_pow(c->chunk_pow, 48, nchunks - 1 - j), v);
}

/* The standard CRC-32 of a page of n bytes from its raw CRC. */
KVX_HD static inline uint32_t kvx_gcrc_finish(const kvx_gcrc_consts *c, uint32_t raw, uint64_t n)
{
    return raw ^ kvx_gcrc_mul(kvx_gcrc_pow(c->byte_pow, 64, n), 0xFFFFFFFFu) ^ 0xFFFFFFFFu;
}

/* --- host side (gpu_crc.c) --- */
#if !defined(__CUDACC__)
/* The constants above, computed by squaring. */
void kvx_gcrc_consts_init(kvx_gcrc_consts *c);
/* The eight slicing tables (KVX_GCRC_TABLE_WORDS words). */
void kvx_gcrc_tables_init(uint32_t *t);
/* CRC-32 of n bytes at page computed exactly as the kernel does (every
 * chunk's lanes, the warp tree, the placement, the XOR, the finish), on
 * the host: what the tests compare with ISA-L. */
uint32_t kvx_gcrc_page_host(const uint32_t *t, const kvx_gcrc_consts *c, const uint8_t *page, uint64_t n);
/* A whole job of the three kernels (gpu_dev.h's kvx_gpu_crc_job), its
 * device addresses taken as host pointers: the tests' fake device. */
struct kvx_gpu_crc_job;
void kvx_gcrc_job_host(const struct kvx_gpu_crc_job *job);
#endif

#endif
