/*
 * shard_fuzzer.c - libFuzzer harness for the KVX shard reader.
 *
 * The input is written to a temporary file and opened with
 * kvx_shard_open, which must return 0 or one of the reader's documented
 * codes and never read outside the file (ASan watches the heap copies;
 * the mapping is only read at page offsets the reader validated). An
 * opened shard is walked completely: every entry, a lookup of its
 * coordinate (which must find that entry), every page with its CRC (a
 * page past the end of the file must come back as missing, KVX_ETRUNC), the
 * spectral bundle (applied to a vector), verify, and, when small enough,
 * an export to envelopes v1, v2 and v3 that must parse. A keyed shard
 * (KVX_FLAG_KEYS, key table) has pages of 1 token and 1..page bytes, each
 * with a 1..255-byte key whose kvx_key_hash is the entry's hash, and no
 * other table.
 *
 * A random mutation almost always breaks meta_crc32c first, so each input
 * is also tried with its meta CRC and spectral CRC repaired: that lets the
 * fuzzer reach the entry and bundle rules behind them. Built with
 * -fno-sanitize-recover=all, so any UB report (the harness's own too)
 * stops the run.
 *
 * Long runs (clang): cmake -DKVX_BUILD_FUZZERS=ON ... && build/fuzz/fuzz_shard
 *   -max_len=65536 fuzz/corpus/shard  (pages sit at 4096-byte offsets, so
 *   inputs need more than libFuzzer's default 4096 bytes).
 * Replayed over fuzz/corpus/shard/ as the ctest fuzz_replay_shard.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvx.h"

#define CHECK(c) do { if (!(c)) __builtin_trap(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path[64];
static int fd = -1;
static volatile uint32_t sink;

static void cleanup(void)
{
    if (fd >= 0) close(fd);
    unlink(path);
}

static int known_code(int rc)
{
    switch (rc) {
    case KVX_EMAGIC: case KVX_EVERSION: case KVX_EQUANT: case KVX_EFORMAT: case KVX_EALIGN:
    case KVX_EOVERLAP: case KVX_ETRUNC: case KVX_EOVERFLOW: case KVX_EPAGE: case KVX_ETOKENS:
    case KVX_EHASH: case KVX_ELINEAGE: case KVX_EDUPLICATE: case KVX_ESHARDID: case KVX_EMETACRC:
    case KVX_ESPECTRAL: case -ENOMEM:
        return 1;
    default:
        return 0;
    }
}

static void walk(kvx_shard *s)
{
    const kvx_shard_info *info = kvx_shard_get_info(s);
    CHECK(info->kv_data_offset % 4096 == 0 && info->kv_data_offset <= info->file_size);
    uint64_t env_bytes = 0;
    uint32_t missing = 0;
    for (uint32_t i = 0; i < info->num_blocks; i++) {
        kvx_entry e;
        CHECK(kvx_shard_entry(&e, s, i) == 0);
        uint64_t seq = 0;
        int tomb = 0;
        CHECK(kvx_shard_entry_commit(s, i, &seq, &tomb) == 0);
        CHECK((seq != 0) == ((info->flags & KVX_FLAG_SEQ) != 0));
        if (tomb) {
            /* a tombstone (a keyed delete): a key, no page, never missing */
            const void *p = (const void *)1;
            CHECK(info->flags & KVX_FLAG_TOMB);
            CHECK(e.token_count == 1 && e.bytes == 0 && e.offset == 0 && e.crc32 == 0);
            CHECK(e.key != NULL && e.key_len >= 1 && e.key_len <= KVX_KEY_MAX);
            CHECK(kvx_shard_page(&p, s, i, 1) == KVX_ENOTFOUND && p == NULL);
            continue;
        }
        CHECK(e.offset % 4096 == 0 && e.offset >= info->kv_data_offset);
        if (info->flags & KVX_FLAG_KEYS) {
            /* a keyed page: one token, 1..page bytes, its key 1..255 bytes,
             * its hash the key's (the name the index uses) */
            CHECK(e.token_count == 1);
            CHECK(e.bytes >= 1 && e.bytes <= kvx_page_bytes(&info->geometry, 1));
            CHECK(e.key != NULL && e.key_len >= 1 && e.key_len <= KVX_KEY_MAX);
            CHECK(e.hash == kvx_key_hash(e.key, e.key_len));
            CHECK(e.tokens == NULL && e.scales == NULL && e.digest == NULL);
        } else {
            CHECK(e.bytes == kvx_page_bytes(&info->geometry, e.token_count));
            CHECK(e.key == NULL && e.key_len == 0);
        }
        uint32_t idx;
        CHECK(kvx_shard_find(&idx, s, e.coordinate) == 0 && idx == i);
        const void *p;
        int rc = kvx_shard_page(&p, s, i, 1);
        /* A page (partly) past the end of the file is missing (DESIGN.md
         * Validation): never handed out, and only such a page. */
        int past_end = e.offset + e.bytes > info->file_size; /* no wrap: the reader checked */
        CHECK(past_end == (rc == KVX_ETRUNC));
        if (past_end) {
            CHECK(p == NULL);
            missing++;
            continue;
        }
        CHECK(rc == 0 || rc == KVX_EPAGECRC);
        const uint8_t *b = p;
        uint32_t acc = 0;
        for (uint32_t k = 0; k < e.bytes; k += 61) acc += b[k];
        if (e.tokens) acc += e.tokens[0];
        if (e.scales) acc += (uint32_t)(e.scales[0] != 0.0f);
        sink = acc;
        env_bytes += e.bytes;
    }
    CHECK(kvx_shard_entry(&(kvx_entry){0}, s, info->num_blocks) == KVX_EINVALID);
    uint32_t bad;
    int rc = kvx_shard_verify(s, &bad, NULL, NULL);
    CHECK(rc == 0 || rc == KVX_EPAGECRC || rc == KVX_ETRUNC);
    CHECK(bad >= missing && (rc == 0) == (bad == 0));
    kvx_spectral sp;
    rc = kvx_shard_spectral(&sp, s);
    CHECK(rc == 0 || rc == KVX_ENOTFOUND);
    if (rc == 0 && sp.dim <= 4096) {
        float *h = calloc(sp.dim, sizeof(float));
        if (h) {
            for (uint32_t k = 0; k < sp.dim; k++) h[k] = 1.0f;
            for (uint32_t c = 0; c < sp.n_cartridges; c++)
                kvx_spectral_apply(h, sp.psi + (size_t)c * sp.n_layers * sp.dim * sp.rank, sp.dim,
                                   sp.rank, 0.5f);
            /* Consume the result through its bits: psi values of any finite
             * size are valid, so h[0] may be far outside uint32's range (or
             * inf), where a float-to-integer conversion is undefined. */
            uint32_t bits;
            memcpy(&bits, &h[0], sizeof bits);
            sink = bits;
            free(h);
        }
    }
    /* Export only when the envelope stays small (B can be huge while the
     * pages are tiny). */
    size_t env_size;
    if (info->geometry.block_tokens &&
        kvx_envelope_size(&env_size, KVX_ENVELOPE_V1, &info->geometry, info->num_blocks) == 0 &&
        env_size < ((size_t)1 << 22)) {
        for (uint16_t v = 1; v <= 3; v++) {
            void *out;
            size_t len;
            rc = kvx_shard_to_envelope(&out, &len, s, v);
            /* KVX_ECAPACITY: the envelope would outgrow the file by more
             * than the input bound allows (DESIGN.md rule 5: a huge B over
             * tiny pages); KVX_ELOSSY: a BF16 value f16 cannot hold, to v1 */
            CHECK(rc == 0 || rc == KVX_EPAGECRC || rc == KVX_ETRUNC || rc == KVX_ETOKENS ||
                  rc == KVX_EINVALID || rc == KVX_ECAPACITY || rc == KVX_ELOSSY);
            if (rc == 0) {
                kvx_envelope env;
                CHECK(kvx_envelope_parse(&env, out, len, NULL) == 0);
                kvx_free(out);
            }
        }
    }
    (void)env_bytes;
}

static void try_open(const uint8_t *data, size_t size)
{
    CHECK(ftruncate(fd, 0) == 0);
    if (size) CHECK(pwrite(fd, data, size, 0) == (ssize_t)size);
    kvx_shard *s = NULL;
    int rc = kvx_shard_open(&s, path, 0);
    CHECK(rc == 0 || known_code(rc));
    CHECK(kvx_last_error() != NULL);
    if (rc) {
        CHECK(s == NULL);
        return;
    }
    walk(s);
    kvx_shard_close(s);
}

/* Little-endian helpers, local so the harness needs only kvx.h. */
static uint32_t ld32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t ld64(const uint8_t *p) { return ld32(p) | (uint64_t)ld32(p + 4) << 32; }
static void st32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }

/* Repairs meta_crc32c and the spectral bundle's crc32c (the whole bundle,
 * sub-header and records, with the CRC field as zero: DESIGN.md "Spectral
 * bundle") where the header's sizes allow; returns 1 when something
 * changed. */
static int repair(uint8_t *b, size_t size)
{
    if (size < 64) return 0;
    int changed = 0;
    uint32_t flags = ld32(b + 56), n = ld32(b + 16), B = ld32(b + 20);
    uint64_t L = (uint16_t)(b[10] | b[11] << 8), H = (uint16_t)(b[12] | b[13] << 8);
    unsigned __int128 end = 64 + (unsigned __int128)n * 24;
    if (flags & KVX_FLAG_HASHES) end += (unsigned __int128)n * 8;
    if (flags & KVX_FLAG_LINEAGE) end += (unsigned __int128)n * (8 + 4 * (uint64_t)B);
    if (flags & KVX_FLAG_DIGEST) end += (unsigned __int128)n * KVX_DIGEST_BYTES;
    if (flags & KVX_FLAG_SCALES) end += (unsigned __int128)n * L * 2 * H * 4;
    if (flags & KVX_FLAG_KEYS) end += (unsigned __int128)n * KVX_KEY_RECORD;
    if (end <= size) {
        uint32_t crc = kvx_crc32c(kvx_crc32c(0, b, 60), b + 64, (size_t)end - 64);
        if (crc != ld32(b + 60)) {
            st32(b + 60, crc);
            changed = 1;
        }
    }
    uint64_t so = ld64(b + 40);
    if (so && so < size && size - so >= 32) {
        uint8_t *sh = b + so;
        /* records: n * (8 + n_layers * dim * rank * 4), every step checked
         * (2^32 * 2^98 would wrap even 128 bits) */
        uint64_t rec, len;
        if (!__builtin_mul_overflow((uint64_t)ld32(sh + 8), (uint64_t)ld32(sh + 12), &rec) &&
            !__builtin_mul_overflow(rec, (uint64_t)ld32(sh + 16), &rec) &&
            !__builtin_mul_overflow(rec, (uint64_t)4, &rec) &&
            !__builtin_add_overflow(rec, (uint64_t)8, &rec) &&
            !__builtin_mul_overflow(rec, (uint64_t)ld32(sh), &len) && len <= size - so - 32) {
            static const uint8_t zero[4];
            uint32_t crc = kvx_crc32c(kvx_crc32c(kvx_crc32c(0, sh, 20), zero, 4), sh + 24,
                                      (size_t)len + 8);
            if (crc != ld32(sh + 20)) {
                st32(sh + 20, crc);
                changed = 1;
            }
        }
    }
    return changed;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (fd < 0) {
        /* tmpfs when there is one: each input is written to the file */
        snprintf(path, sizeof path, "%s/kvx_shard_fuzz.XXXXXX",
                 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        fd = mkstemp(path);
        CHECK(fd >= 0);
        atexit(cleanup);
    }
    if (size > ((size_t)1 << 24)) return 0;
    try_open(data, size);
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    if (repair(copy, size)) try_open(copy, size);
    free(copy);
    return 0;
}
