/*
 * transfer_chunk_fuzzer.c - libFuzzer harness for the tl.kv.v1 receiver's
 * chunk checks (transfer/xfer.c: kvx_xfer_stream_chunk, finish).
 *
 * Once per process a small FP16 store (L 2, Hkv 1, D 4, B 4: the
 * envelope seeds' geometry) is created in a temporary directory (/dev/shm
 * when writable) and holds one flushed prompt, tokens 0..11 (three
 * blocks), so empty payloads can find held blocks. Each input is one
 * PushKv stream, decoded as
 *   u8 mode            bit 0: finish the stream at the end (else destroy)
 *   chunks, until the input ends (at most 64):
 *     u8 f             kv_format = f & 7 (1..3 valid);
 *                      0x08 raw block_hash (else the recomputed chain
 *                           hash, 0 for a partial tail);
 *                      0x10 raw crc32c (else the payload's);
 *                      0x20 model_signature = the store's (else 0);
 *                      0x40 raw model_signature (u64);
 *                      0x80 patch the payload as a one-block envelope:
 *                           its hash and n_tokens set to the chunk's and
 *                           its CRC repaired
 *     u8 n_tokens, then n_tokens u16 LE token ids
 *     u16 LE payload length (clamped to what is left), the payload
 *     u64 block_hash if 0x08, u32 crc32c if 0x10, u64 signature if 0x40
 * Checks: every refusal is a documented code that does not map to gRPC
 * INTERNAL, and sticks (later chunks and finish answer it); an accepted
 * chunk's block says its index, tail and recomputed hash; an accepted
 * finish leaves every full block of the stream gettable by hash, byte
 * counts and block counts as the chunks said.
 *
 * Replayed over fuzz/corpus/transfer_chunk/ as fuzz_replay_transfer_chunk.
 */
#include <errno.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvx.h"

#define CHECK(c) do { if (!(c)) __builtin_trap(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SIG 0x6b76782d78666572ull
static kvx_store *st;
static char dir[80];

static void cleanup(void)
{
    if (st) kvx_store_close(st);
    st = NULL;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
}

static void setup(void)
{
    const char *t = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    char root[64];
    snprintf(root, sizeof root, "%s/kvx_xfer_fuzz.XXXXXX", t);
    CHECK(mkdtemp(root) != NULL);
    snprintf(dir, sizeof dir, "%s/store", root);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = (kvx_geometry){2, 1, 4, 4, KVX_QUANT_FP16, SIG};
    o.capacity_bytes = 8u << 20;
    o.flags = KVX_STORE_NOSYNC;
    CHECK(kvx_store_create(&st, dir, &o) == 0);
    uint32_t toks[12];
    for (uint32_t i = 0; i < 12; i++) toks[i] = i;
    uint64_t pb = kvx_page_bytes(&o.geometry, 4);
    uint8_t *pages = calloc(3, pb);
    CHECK(pages);
    for (uint64_t i = 0; i < 3 * pb; i += 2) pages[i + 1] = 0x3c; /* f16 1.0 */
    CHECK(kvx_store_put(st, toks, 12, pages, 3, NULL, NULL) == 0);
    CHECK(kvx_store_flush(st) == 0);
    free(pages);
    snprintf(dir, sizeof dir, "%s", root);
    atexit(cleanup);
}

typedef struct rd {
    const uint8_t *p;
    size_t left;
} rd;

static int take(rd *r, void *out, size_t n)
{
    if (r->left < n) return -1;
    memcpy(out, r->p, n);
    r->p += n;
    r->left -= n;
    return 0;
}

static int documented(int rc)
{
    switch (rc) {
    case KVX_EVERSION: case KVX_EMODEL: case KVX_EINVALID: case KVX_ETOKENS: case KVX_EHASH:
    case KVX_ENOTHELD: case KVX_EFORMAT: case KVX_ECORRUPT: case KVX_ESHAPE: case KVX_ELOSSY:
    case KVX_ECAPACITY: case KVX_EFULL: case -ENOMEM: case -ENOSPC:
        return 1;
    default:
        return 0;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!st) setup();
    if (size < 1 || size > (1u << 20)) return 0;
    rd r = {data + 1, size - 1};
    int finish = data[0] & 1;
    kvx_xfer_stream *xs;
    CHECK(kvx_xfer_stream_create(&xs, st) == 0);
    uint64_t parent = 0, hashes[64], bytes = 0;
    uint32_t n_full = 0, stored = 0, referenced = 0, tail_tokens = 0;
    int failed = 0;
    uint8_t *pl = NULL;
    for (uint32_t idx = 0; idx < 64 && r.left > 0; idx++) {
        uint8_t f, nt;
        uint16_t plen;
        uint32_t toks[255];
        if (take(&r, &f, 1) || take(&r, &nt, 1)) break;
        int ok = 1;
        for (uint32_t i = 0; i < nt && ok; i++) {
            uint16_t t;
            ok = take(&r, &t, 2) == 0;
            toks[i] = t;
        }
        if (!ok || take(&r, &plen, 2)) break;
        if (plen > r.left) plen = (uint16_t)r.left;
        free(pl);
        pl = malloc(plen ? plen : 1);
        CHECK(pl);
        take(&r, pl, plen);
        kvx_xfer_chunk c = {0};
        c.kv_format = f & 7;
        c.tokens = nt ? toks : NULL;
        c.n_tokens = nt;
        c.block_hash = nt == 4 ? kvx_block_hash(parent, toks, 4) : 0;
        if (f & 0x08 && take(&r, &c.block_hash, 8)) break;
        if (f & 0x80 && plen >= 32 + 12) {
            memcpy(pl + 28, &c.block_hash, 8);
            uint32_t n = nt;
            memcpy(pl + 36, &n, 4);
            uint32_t crc = kvx_crc32c(0, pl, plen - 4u);
            memcpy(pl + plen - 4, &crc, 4);
        }
        c.payload = plen ? pl : NULL;
        c.payload_len = plen;
        c.crc32c = kvx_crc32c(0, pl, plen);
        if (f & 0x10 && take(&r, &c.crc32c, 4)) break;
        c.model_signature = f & 0x20 ? SIG : 0;
        if (f & 0x40 && take(&r, &c.model_signature, 8)) break;

        kvx_xfer_block b;
        int rc = kvx_xfer_stream_chunk(xs, &c, &b);
        if (getenv("KVX_FUZZ_VERBOSE"))
            fprintf(stderr, "chunk %u: %s stored %u referenced %u\n", idx, rc ? kvx_last_error() : "ok", b.stored,
                    b.referenced);
        if (!failed) bytes += plen;
        if (failed) {
            CHECK(rc == failed);
            continue;
        }
        if (rc) {
            CHECK(documented(rc) && kvx_xfer_grpc_code(rc) != KVX_GRPC_INTERNAL);
            failed = rc;
            continue;
        }
        CHECK(b.index == idx && b.n_tokens == nt && nt >= 1 && nt <= 4);
        CHECK(b.tail == (nt < 4) && !(b.stored && b.referenced));
        if (b.tail) {
            CHECK(b.hash == 0 && !b.stored && !b.referenced);
            tail_tokens = nt;
        } else {
            CHECK(b.hash == kvx_block_hash(parent, toks, 4) && b.hash == c.block_hash);
            parent = b.hash;
            hashes[n_full++] = b.hash;
            stored += b.stored;
            referenced += b.referenced;
        }
    }
    free(pl);
    kvx_xfer_result res;
    kvx_xfer_stream_progress(&res, xs);
    CHECK(res.blocks_stored == stored && res.blocks_referenced == referenced);
    if (finish) {
        int rc = kvx_xfer_stream_finish(xs, &res);
        if (failed) {
            CHECK(rc == failed);
        } else {
            CHECK(rc == 0 || documented(rc));
            if (rc == 0) {
                CHECK(res.durable == 1 && res.blocks_stored == stored && res.blocks_referenced == referenced);
                CHECK(res.tail_tokens == tail_tokens && res.bytes_received == bytes);
                /* what was stored or referenced is served (capacity is
                 * far above one stream, so nothing it wrote is evicted) */
                for (uint32_t i = 0; i < n_full; i++) {
                    kvx_view v;
                    CHECK(kvx_store_get_hash(&v, st, hashes[i]) == 0);
                    kvx_view_release(&v);
                }
            }
        }
    }
    kvx_xfer_stream_destroy(xs);
    return 0;
}
