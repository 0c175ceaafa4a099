/*
 * crc.c - CRC-32C (Castagnoli) and CRC-32 (IEEE 802.3, as zlib) on ISA-L.
 *
 * ISA-L picks an implementation at run time from what the CPU offers
 * (SSE4.2 crc32 instruction, PCLMULQDQ folding, AVX-512 VPCLMULQDQ) and
 * has a portable table-driven base path, so these run at hardware speed
 * where they can and correctly everywhere.
 *
 * Conventions, worked out from ISA-L's sources and pinned by the tests
 * against the check values and a bitwise reference:
 *  - crc32_iscsi(buf, len, init) does NO pre/post inversion: the standard
 *    CRC-32C is ~crc32_iscsi(buf, len, 0xFFFFFFFF). Our running value is
 *    the finished CRC (0 to start), so we pass ~crc in and invert out.
 *    Its length is an int: long buffers are fed in chunks.
 *  - crc32_gzip_refl(init, buf, len) inverts inside, exactly like zlib's
 *    crc32(crc, buf, len): it composes as is.
 */
#include "internal.h"

#include <isa-l/crc.h>
#include <limits.h>
#include <string.h>

#define ISCSI_CHUNK ((size_t)1 << 30) /* fits crc32_iscsi's int length */

/* ISA-L's folding paths on AVX-512 (crc32_iscsi_by16_10, crc32_gzip_refl_by16_10)
 * return with the upper halves of the vector registers dirty (no
 * vzeroupper), and every legacy-SSE instruction after them (OpenSSL's
 * SHA-NI, glibc's string functions) then pays the transition: a prefix
 * lookup, two record CRCs and one SHA-256 a block, ran 658-669 ns a block
 * against 510-514 after this change (bench_store lookup, bench/RESULTS.md,
 * issue 41). So:
 *  - short buffers (the catalog's records: a key of 4 or 8 bytes, then 16
 *    to 48 bytes, on every lookup) go to the SSE4.2 crc32 instruction
 *    itself, the same CRC (no inversion inside, as crc32_iscsi), with no
 *    call into ISA-L at all;
 *  - after any other ISA-L call, vzeroupper where the CPU has AVX. */
#define CRC_SHORT 64
#if defined(__x86_64__) && defined(__GNUC__)
#define CRC_X86 1
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t c, const unsigned char *p, size_t len)
{
    uint64_t c64 = c;
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = __builtin_ia32_crc32di(c64, v);
    }
    c = (uint32_t)c64;
    for (; len; p++, len--) c = __builtin_ia32_crc32qi(c, *p);
    return c;
}

__attribute__((target("avx"))) static void crc_vzeroupper(void) { __builtin_ia32_vzeroupper(); }
#define CRC_CLEAN() (__builtin_cpu_supports("avx") ? crc_vzeroupper() : (void)0)
#else
#define CRC_CLEAN() ((void)0)
#endif

uint32_t kvx_crc32c(uint32_t crc, const void *data, size_t len)
{
    unsigned char *p = (unsigned char *)(uintptr_t)data; /* ISA-L never writes */
    uint32_t c = ~crc;
#ifdef CRC_X86
    if (len <= CRC_SHORT && __builtin_cpu_supports("sse4.2")) return ~crc32c_hw(c, p, len);
#endif
    while (len > 0) {
        size_t n = len < ISCSI_CHUNK ? len : ISCSI_CHUNK;
        c = crc32_iscsi(p, (int)n, c);
        p += n;
        len -= n;
    }
    CRC_CLEAN();
    return ~c;
}

uint32_t kvx_crc32(uint32_t crc, const void *data, size_t len)
{
    if (len == 0) return crc;
    uint32_t c = crc32_gzip_refl(crc, (const unsigned char *)data, (uint64_t)len);
    CRC_CLEAN();
    return c;
}
