/*
 * store_config_fuzzer.c - libFuzzer harness for the STORE file parser
 * (engine/store_config.c): the 64 bytes a store's open reads first
 * (magic, version, geometry, capacity, shard size, CRC-32C).
 *
 * The first 64 bytes of the input go through what st_read_config does
 * (store_open.c): kvx_st_config_decode, kvx_st_check_geometry, the zero
 * capacity rule, kvx_st_sizes; a shorter input is a short read, which the
 * open refuses before decoding. Each step must return 0 or its documented
 * codes; the derived sizes must be sane (an entry holds its page, 1 to
 * 65536 entries a shard). Round trip: a decoded file of this release's
 * version (3) whose reserved bytes (56..59) are 0 is what
 * kvx_st_config_encode writes from the decoded fields, byte for byte (a
 * version 1 or 2 file decodes, for its migration, and is never written). Each input is tried as is and with its CRC
 * repaired, so mutations reach the fields behind the checksum.
 *
 * Replayed over fuzz/corpus/store_config/ as fuzz_replay_store_config.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/store.h"

#define CHECK(c) do { if (!(c)) __builtin_trap(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_one(const uint8_t *b)
{
    kvx_geometry g;
    uint64_t cap = 7, target = 7;
    memset(&g, 0xa5, sizeof g);
    uint32_t version = 0;
    int rc = kvx_st_config_decode(b, &g, &cap, &target, &version);
    CHECK(rc == 0 || rc == KVX_EMAGIC || rc == KVX_ECORRUPT || rc == KVX_EVERSION);
    CHECK(kvx_last_error() != NULL);
    if (rc) return;
    CHECK(version >= 1 && version <= ST_STORE_HOLES_VERSION);
    if (version >= ST_STORE_VERSION && memcmp(b + 56, "\0\0\0\0", 4) == 0) {
        uint8_t out[ST_CONFIG_BYTES];
        kvx_st_config_encode(out, &g, cap, target, version);
        CHECK(memcmp(out, b, ST_CONFIG_BYTES) == 0);
    }
    rc = kvx_st_check_geometry(&g);
    CHECK(rc == 0 || rc == KVX_EINVALID || rc == KVX_EQUANT || rc == KVX_EOVERFLOW);
    if (rc || cap == 0 || target == 0) return;
    kvx_store *s = calloc(1, sizeof *s);
    CHECK(s);
    s->g = g;
    s->capacity = cap;
    s->target = target;
    kvx_st_sizes(s);
    CHECK(s->page_bytes == kvx_page_bytes(&g, g.block_tokens) && s->page_bytes > 0);
    CHECK(s->page_bytes <= UINT32_MAX && s->entry_bytes > s->page_bytes);
    CHECK(s->max_entries >= 1 && s->max_entries <= KVX_MAX_ENTRIES);
    CHECK(s->nscales == kvx_scale_count(&g));
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < ST_CONFIG_BYTES) return 0; /* a short STORE: KVX_ETRUNC at the read */
    uint8_t b[ST_CONFIG_BYTES];
    memcpy(b, data, sizeof b);
    check_one(b);
    uint32_t crc = kvx_crc32c(0, b, 60);
    if (kvx_load32(b + 60) != crc) {
        kvx_store32(b + 60, crc);
        check_one(b);
    }
    return 0;
}
