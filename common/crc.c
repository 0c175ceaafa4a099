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

#define ISCSI_CHUNK ((size_t)1 << 30) /* fits crc32_iscsi's int length */

uint32_t kvx_crc32c(uint32_t crc, const void *data, size_t len)
{
    unsigned char *p = (unsigned char *)(uintptr_t)data; /* ISA-L never writes */
    uint32_t c = ~crc;
    while (len > 0) {
        size_t n = len < ISCSI_CHUNK ? len : ISCSI_CHUNK;
        c = crc32_iscsi(p, (int)n, c);
        p += n;
        len -= n;
    }
    return ~c;
}

uint32_t kvx_crc32(uint32_t crc, const void *data, size_t len)
{
    if (len == 0) return crc;
    return crc32_gzip_refl(crc, (const unsigned char *)data, (uint64_t)len);
}
