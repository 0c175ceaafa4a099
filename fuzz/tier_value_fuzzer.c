/*
 * tier_value_fuzzer.c - libFuzzer harness for the shared tier's value
 * check (tier/value.c: kvx_tier_value_check), the one parser of bytes
 * that come from Redis, where anyone with write access may put anything.
 *
 * Any input, checked as a value of three small stores (fp16, e4m3, bf16;
 * tokens not given, so every field but the prompt's tokens is reached):
 * the check returns 0 or one of its documented codes, never reads outside
 * the buffer (ASan watches); a value it accepts decodes to a page, is
 * encoded again from that page, its tokens and hash, and the new value
 * passes the check and decodes to the same page bytes.
 *
 * Each input is tried as is and with its inner envelope CRC and outer
 * CRC-32C repaired, so mutations get past the checksums.
 *
 * Replayed over fuzz/corpus/tier_value/ as the ctest
 * fuzz_replay_tier_value; built as a real fuzzer with
 * -DKVX_BUILD_FUZZERS=ON and clang.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvx.h"
#include "tier/tier.h"

#define CHECK(c) do { if (!(c)) __builtin_trap(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint32_t quants[3] = {KVX_QUANT_FP16, KVX_QUANT_E4M3, KVX_QUANT_BF16};

static void check_one(const uint8_t *data, size_t size)
{
    for (int q = 0; q < 3; q++) {
        kvx_geometry g = {1, 1, 4, 4, quants[q], 0x1122334455667788ull};
        uint64_t ns = kvx_tier_ns(&g, NULL);
        kvx_tier_expect x = {ns, &g, 0, 0, NULL};
        uint8_t page[64], page2[64];
        float sc[2] = {1, 1}, sc2[2] = {1, 1};
        int rc = kvx_tier_value_check(data, size, &x, page, sc);
        CHECK(rc == 0 || rc == KVX_EFORMAT || rc == KVX_ECORRUPT || rc == KVX_EMODEL || rc == KVX_ESHAPE ||
              rc == KVX_ETOKENS || rc == KVX_EHASH || rc == KVX_EVERSION || rc == KVX_EINVALID);
        CHECK(kvx_last_error() != NULL);
        if (rc) continue;
        /* accepted: the header is whole, so these reads are inside */
        uint32_t toks[4];
        memcpy(toks, data + 28, sizeof toks);
        uint64_t hash = kvx_block_hash(0, toks, 4);
        uint8_t *v;
        size_t len;
        CHECK(kvx_tier_value_encode(&v, &len, ns, &g, hash, toks, page, q == 1 ? sc : NULL) == 0);
        CHECK(len == size);
        kvx_tier_expect x2 = {ns, &g, hash, 0, toks};
        CHECK(kvx_tier_value_check(v, len, &x2, page2, sc2) == 0);
        CHECK(memcmp(page, page2, (size_t)kvx_page_bytes(&g, 4)) == 0);
        free(v);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_one(data, size);
    if (size >= 40) {
        uint8_t *fixed = malloc(size);
        CHECK(fixed);
        memcpy(fixed, data, size);
        uint32_t B;
        memcpy(&B, fixed + 24, 4);
        size_t env = 28 + (size_t)(B > 1024 ? 1024 : B) * 4;
        if (env + 32 + 4 <= size) {
            uint32_t crc = kvx_crc32c(0, fixed + env, size - 4 - env - 4);
            memcpy(fixed + size - 8, &crc, 4);
        }
        uint32_t crc = kvx_crc32c(0, fixed, size - 4);
        memcpy(fixed + size - 4, &crc, 4);
        check_one(fixed, size);
        free(fixed);
    }
    return 0;
}
