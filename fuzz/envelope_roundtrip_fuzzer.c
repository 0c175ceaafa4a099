/*
 * envelope_roundtrip_fuzzer.c - round trip of the envelope <-> shard
 * conversion (format/convert.c): export then import is the identity.
 *
 * The input, with its CRC repaired (else nearly nothing would parse), is
 * an envelope E. A valid E (kept small: pages of at most 16 MiB in all) is
 * imported with kvx_shard_from_envelope into a shard S1 (v1 -> FP16,
 * v2 -> E4M3 + scales, v3 -> BF16: all lossless), which must open and
 * verify clean; S1 exported with kvx_shard_to_envelope in E's version must
 * be E as the writer writes it (positions past a partial block's n_tokens
 * zeroed, CRC recomputed: the envelope writer rule) byte for byte; and
 * that envelope imported again must give S2, byte-identical to S1.
 * The conversion's refusals must be documented codes.
 *
 * Scratch files in /dev/shm (fsync is cheap there), or $TMPDIR.
 * Replayed over fuzz/corpus/envelope_roundtrip/ as
 * fuzz_replay_envelope_roundtrip.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvx.h"

#define CHECK(c) do { if (!(c)) __builtin_trap(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64], p1[96], p2[96];

static void cleanup(void)
{
    unlink(p1);
    unlink(p2);
    rmdir(dir);
}

static uint8_t *slurp(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    struct stat st;
    CHECK(fstat(fd, &st) == 0);
    uint8_t *b = malloc(st.st_size ? (size_t)st.st_size : 1);
    CHECK(b && pread(fd, b, (size_t)st.st_size, 0) == st.st_size);
    close(fd);
    *len = (size_t)st.st_size;
    return b;
}

/* E as the envelope writer writes it: positions past n_tokens zeroed. */
static void normalize(uint8_t *b, size_t size, const kvx_envelope *env)
{
    const kvx_geometry *g = &env->geometry;
    const size_t slabs = (size_t)g->num_layers * 2 * g->kv_heads;
    const size_t slab = (size_t)g->block_tokens * g->head_dim;
    const size_t esize = env->version == KVX_ENVELOPE_V2 ? 1 : 2;
    for (uint32_t i = 0; i < env->n_blocks; i++) {
        kvx_envelope_block blk;
        CHECK(kvx_envelope_block_at(&blk, env, i) == 0);
        size_t fill = (size_t)blk.n_tokens * g->head_dim * esize;
        for (size_t s = 0; s < slabs; s++) {
            size_t at = (size_t)(blk.payload - (const uint8_t *)env->data) + s * slab * esize;
            memset(b + at + fill, 0, slab * esize - fill);
        }
    }
    uint32_t crc = kvx_crc32c(0, b, size - 4);
    memcpy(b + size - 4, &crc, 4);
}

static int import_ok(int rc)
{
    return rc == 0 || rc == KVX_ECAPACITY || rc == KVX_EOVERFLOW || rc == KVX_EINVALID ||
           rc == KVX_ETOKENS || rc == -ENOMEM;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        const char *t = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(dir, sizeof dir, "%s/kvx_rt_fuzz.XXXXXX", t);
        CHECK(mkdtemp(dir) != NULL);
        snprintf(p1, sizeof p1, "%s/s1.kvx", dir);
        snprintf(p2, sizeof p2, "%s/s2.kvx", dir);
        atexit(cleanup);
    }
    if (size < 32 || size > (1u << 22)) return 0;
    uint8_t *e = malloc(size);
    CHECK(e);
    memcpy(e, data, size);
    uint32_t crc = kvx_crc32c(0, e, size - 4);
    memcpy(e + size - 4, &crc, 4);
    kvx_envelope env;
    if (kvx_envelope_parse(&env, e, size, NULL) != 0) goto out;
    uint64_t page = kvx_page_bytes(&env.geometry, env.geometry.block_tokens);
    /* shard pages are 4096-aligned: bound the files this input makes */
    if (page == 0 || page > (16u << 20) || ((page + 4095) / 4096) * 4096 * env.n_blocks > (16u << 20))
        goto out;
    unlink(p1);
    unlink(p2);
    int rc = kvx_shard_from_envelope(p1, e, size, 7, 0x6b76782d66757a7aull);
    CHECK(import_ok(rc));
    if (rc) goto out;

    kvx_shard *s;
    CHECK(kvx_shard_open(&s, p1, 0) == 0);
    uint32_t bad = 1;
    CHECK(kvx_shard_verify(s, &bad, NULL, NULL) == 0 && bad == 0);
    CHECK(kvx_shard_get_info(s)->num_blocks == env.n_blocks);
    void *out = NULL;
    size_t len = 0;
    CHECK(kvx_shard_to_envelope(&out, &len, s, env.version) == 0);
    kvx_shard_close(s);
    normalize(e, size, &env);
    CHECK(len == size && memcmp(out, e, size) == 0);

    CHECK(kvx_shard_from_envelope(p2, out, len, 7, 0x6b76782d66757a7aull) == 0);
    kvx_free(out);
    size_t l1, l2;
    uint8_t *b1 = slurp(p1, &l1), *b2 = slurp(p2, &l2);
    CHECK(l1 == l2 && memcmp(b1, b2, l1) == 0);
    free(b1);
    free(b2);
out:
    free(e);
    return 0;
}
