/*
 * envelope_fuzzer.c - libFuzzer harness for the TLKV envelope reader.
 *
 * Any input: kvx_envelope_parse must return 0 or one of the documented
 * codes, never read outside the buffer (ASan watches), and agree with
 * itself when given its own geometry as expect; every scale of a v2
 * envelope it accepts is finite and > 0. A valid input is walked
 * block by block (every payload byte decoded) and re-exported: the writer
 * must reproduce the input byte for byte, except that positions at or past
 * n_tokens become zero (a writer rule the reader does not enforce) and the
 * CRC is recomputed over that. The one-pass import, kvx_envelope_decode_f32,
 * must refuse what the parse refuses with the same code, and decode what it
 * accepts to the same floats, bit for bit, as the block-by-block walk (one
 * float short of room: KVX_ECAPACITY; another geometry: KVX_ESHAPE).
 *
 * Each input is tried as is and with its CRC repaired (see below).
 *
 * Replayed over fuzz/corpus/envelope/ as the ctest fuzz_replay_envelope;
 * built as a real fuzzer with -DKVX_BUILD_FUZZERS=ON and clang.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvx.h"

#define CHECK(c) do { if (!(c)) __builtin_trap(); } while (0)

static volatile float sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int check_one(const uint8_t *data, size_t size)
{
    kvx_envelope env;
    int rc = kvx_envelope_parse(&env, data, size, NULL);
    CHECK(rc == 0 || rc == KVX_EFORMAT || rc == KVX_EVERSION);
    CHECK(kvx_last_error() != NULL);
    if (rc != 0) {
        /* the one-pass import to f32 applies the same rules, same codes,
         * given room (an envelope holds at least a byte an element, so
         * size floats are enough; its CRC is compared after the pass) */
        float *room = malloc((size ? size : 1) * sizeof *room);
        CHECK(room);
        CHECK(kvx_envelope_decode_f32(room, size, NULL, data, size, NULL) == rc);
        free(room);
        return 0;
    }

    const kvx_geometry *g = &env.geometry;
    CHECK(env.size == size && env.data == data);
    size_t want;
    CHECK(kvx_envelope_size(&want, env.version, g, env.n_blocks) == 0 && want == size);

    /* Its own geometry is accepted; a different one is a shape error. */
    kvx_envelope env2;
    CHECK(kvx_envelope_parse(&env2, data, size, g) == 0);
    kvx_geometry other = *g;
    other.head_dim ^= 1;
    if (other.head_dim == 0) other.head_dim = 2;
    CHECK(kvx_envelope_parse(&env2, data, size, &other) == KVX_ESHAPE);

    const size_t slabs = (size_t)g->num_layers * 2 * g->kv_heads;
    const size_t slab = (size_t)g->block_tokens * g->head_dim;
    const size_t esize = env.version == KVX_ENVELOPE_V2 ? 1 : 2;
    kvx_envelope_block_in *in = calloc(env.n_blocks ? env.n_blocks : 1, sizeof *in);
    float *scales = calloc(env.n_blocks * slabs + 1, sizeof *scales);
    /* With n_blocks 0 the dimensions are unbounded by the length: size
     * the scratch only from blocks that exist (then slab <= P < size). */
    float *tmp = malloc((env.n_blocks ? slab : 1) * sizeof *tmp);
    /* every block's slabs decoded one by one: what kvx_envelope_decode_f32
     * must give (the envelope holds at least esize bytes an element, so
     * this is at most 4x its size) */
    size_t nref = (size_t)env.n_blocks * slabs * slab;
    float *ref = malloc((nref ? nref : 1) * sizeof *ref), *dec = malloc((nref ? nref : 1) * sizeof *dec);
    CHECK(ref && dec);
    uint8_t *expect = malloc(size), *out = malloc(size);
    CHECK(in && scales && tmp && expect && out);
    memcpy(expect, data, size);

    for (uint32_t i = 0; i < env.n_blocks; i++) {
        kvx_envelope_block blk;
        CHECK(kvx_envelope_block_at(&blk, &env, i) == 0);
        CHECK(blk.n_tokens >= 1 && blk.n_tokens <= g->block_tokens);
        CHECK(blk.hash == 0 || blk.n_tokens == g->block_tokens);
        CHECK(blk.payload >= data && blk.payload + env.payload_bytes <= data + size);
        for (size_t s = 0; s < slabs; s++) {
            const uint8_t *p = blk.payload + s * slab * esize;
            float scale = 1.0f;
            if (env.version == KVX_ENVELOPE_V2) {
                memcpy(&scales[i * slabs + s], blk.scales + 4 * s, 4);
                scale = scales[i * slabs + s];
                /* the reader's promise: every v2 scale is finite and > 0 */
                CHECK(isfinite(scale) && scale > 0.0f);
                kvx_e4m3_to_f32_n(tmp, p, slab, scale);
            } else if (env.version == KVX_ENVELOPE_V3) {
                for (size_t k = 0; k < slab; k++)
                    tmp[k] = kvx_bf16_to_f32((uint16_t)(p[2 * k] | p[2 * k + 1] << 8));
            } else {
                for (size_t k = 0; k < slab; k++)
                    tmp[k] = kvx_f16_to_f32((uint16_t)(p[2 * k] | p[2 * k + 1] << 8));
            }
            sink = tmp[slab - 1];
            memcpy(ref + ((size_t)i * slabs + s) * slab, tmp, slab * sizeof *tmp);
            /* The writer zeroes positions past n_tokens. */
            size_t fill = (size_t)blk.n_tokens * g->head_dim * esize;
            memset(expect + (p - data) + fill, 0, slab * esize - fill);
        }
        in[i].hash = blk.hash;
        in[i].n_tokens = blk.n_tokens;
        in[i].payload = blk.payload;
        in[i].scales = env.version == KVX_ENVELOPE_V2 ? scales + i * slabs : NULL;
    }
    kvx_envelope_block blk;
    CHECK(kvx_envelope_block_at(&blk, &env, env.n_blocks) == KVX_EINVALID);

    uint32_t crc = kvx_crc32c(0, expect, size - 4);
    memcpy(expect + size - 4, &crc, 4);
    CHECK(kvx_envelope_export(out, size, env.version, g, in, env.n_blocks) == 0);
    CHECK(memcmp(out, expect, size) == 0);
    CHECK(kvx_envelope_parse(&env2, out, size, g) == 0);
    CHECK(kvx_envelope_export(out, size - 1, env.version, g, in, env.n_blocks) == KVX_ECAPACITY);

    kvx_envelope env3;
    CHECK(kvx_envelope_decode_f32(dec, nref, &env3, data, size, g) == 0);
    CHECK(env3.n_blocks == env.n_blocks && env3.version == env.version && env3.data == data);
    CHECK(memcmp(dec, ref, nref * sizeof *ref) == 0); /* bit for bit, NaNs too */
    if (nref) CHECK(kvx_envelope_decode_f32(dec, nref - 1, NULL, data, size, g) == KVX_ECAPACITY);
    CHECK(kvx_envelope_decode_f32(dec, nref, NULL, data, size, &other) == KVX_ESHAPE);

    free(in); free(scales); free(tmp); free(expect); free(out); free(ref); free(dec);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_one(data, size);
    /* Random mutations almost never keep the CRC right, which would stop
     * the fuzzer at rule 6; so also try the input with its CRC repaired,
     * letting it reach the dimension, block and re-export checks. */
    if (size >= 32) {
        uint8_t *fixed = malloc(size);
        CHECK(fixed);
        memcpy(fixed, data, size);
        uint32_t crc = kvx_crc32c(0, fixed, size - 4);
        memcpy(fixed + size - 4, &crc, 4);
        check_one(fixed, size);
        free(fixed);
    }
    return 0;
}
