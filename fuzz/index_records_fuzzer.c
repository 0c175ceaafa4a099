/*
 * index_records_fuzzer.c - libFuzzer harness for the catalog's index
 * records (index/records.c, index.h "Records"): the decoders and getters
 * of the shards, coord, hash (location), usage, stats and u64 meta records.
 *
 * Input: byte 0 picks the record kind (mod 6), byte 1 is the key length,
 * then the key bytes, then the record value (the rest). Every decoder
 * must return 0 or MDB_CORRUPTED and never read past the value (ASan).
 * Where the key has its database's size, the record is also put raw into
 * a scratch LMDB environment (kvx_idx_open in a temporary directory, one
 * write transaction per input, aborted) and read back through the getter,
 * which must agree with the decoder. Round trip: a record accepted with
 * its CRC (crc != 0, the current size, reserved fields 0) is written again
 * by the encoder from the decoded fields, and the encoder's bytes must be
 * the input's bytes.
 *
 * Replayed over fuzz/corpus/index_records/ as fuzz_replay_index_records.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "index/index.h"

#define CHECK(c) do { if (!(c)) __builtin_trap(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvx_index *ix;
static char dir[64];

static void cleanup(void)
{
    char p[128];
    if (ix) kvx_idx_close(ix);
    ix = NULL;
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/lock.mdb", dir);
    unlink(p);
    rmdir(dir);
}

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/kvx_idx_fuzz.XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    CHECK(kvx_idx_open(&ix, dir, 1, 1) == 0);
    atexit(cleanup);
}

/* The bytes a database holds under key k, compared with want. */
static int stored_equals(MDB_txn *txn, MDB_dbi dbi, MDB_val k, const void *want, size_t len)
{
    MDB_val v;
    if (mdb_get(txn, dbi, &k, &v) != 0) return 0;
    return v.mv_size == len && memcmp(v.mv_data, want, len) == 0;
}

static void one(MDB_txn *txn, int kind, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
    MDB_val k = {klen, (void *)key}, v = {vlen, (void *)val};
    int rc;
    switch (kind) {
    case 0: { /* shards: u32 byte -> kvx_idx_shard */
        uint32_t b;
        kvx_idx_shard r;
        rc = kvx_idx_dec_shard(&k, &v, &b, &r);
        CHECK(rc == 0 || rc == MDB_CORRUPTED);
        if (klen != 4 || vlen == 0) return;
        memcpy(&b, key, 4);
        CHECK(mdb_put(txn, ix->shards, &k, &v, 0) == 0);
        kvx_idx_shard g;
        int rg = kvx_idx_get_shard(txn, ix, b, &g);
        CHECK(rg == rc && (rc || memcmp(&g, &r, sizeof r) == 0));
        if (rc == 0 && r.crc && vlen == sizeof r) {
            CHECK(kvx_idx_put_shard(txn, ix, b, &r) == 0);
            CHECK(stored_equals(txn, ix->shards, k, val, vlen));
        }
        return;
    }
    case 1: { /* coord: u32 coordinate -> kvx_idx_coord */
        uint32_t c;
        kvx_idx_coord r;
        rc = kvx_idx_dec_coord(&k, &v, &c, &r);
        CHECK(rc == 0 || rc == MDB_CORRUPTED);
        if (klen != 4 || vlen == 0) return;
        memcpy(&c, key, 4);
        CHECK(mdb_put(txn, ix->coord, &k, &v, 0) == 0);
        kvx_idx_coord g;
        int rg = kvx_idx_get_coord(txn, ix, c, &g);
        CHECK(rg == rc && (rc || memcmp(&g, &r, sizeof r) == 0));
        if (rc == 0 && r.crc && r.zero == 0 && vlen == sizeof r) {
            CHECK(kvx_idx_add_block(txn, ix, c, r.hash, r.gen) == 0);
            CHECK(stored_equals(txn, ix->coord, k, val, vlen));
        }
        return;
    }
    case 2: { /* hash: u64 hash -> kvx_idx_loc (dups) */
        uint64_t h;
        kvx_idx_loc r;
        rc = kvx_idx_dec_loc(&k, &v, &h, &r);
        CHECK(rc == 0 || rc == MDB_CORRUPTED);
        if (rc == 0) {
            /* the location a block add writes is found, with its crc */
            CHECK(r.crc != 0);
            CHECK(kvx_idx_add_block(txn, ix, r.coord, h, r.gen) == 0);
            CHECK(kvx_idx_has_loc(txn, ix, h, r.coord, r.gen) == 1);
            CHECK(stored_equals(txn, ix->hash, k, val, vlen));
        }
        return;
    }
    case 3: { /* usage: u32 byte -> kvx_idx_usage + bitmap */
        uint32_t b;
        kvx_idx_usage r;
        rc = kvx_idx_dec_usage(&k, &v, &b, &r);
        CHECK(rc == 0 || rc == MDB_CORRUPTED);
        if (rc == 0) CHECK(r.n_bits <= 65536 && vlen == sizeof r + (r.n_bits + 7) / 8);
        if (klen != 4 || vlen == 0) return;
        memcpy(&b, key, 4);
        CHECK(mdb_put(txn, ix->usage, &k, &v, 0) == 0);
        kvx_idx_usage g;
        static uint8_t bits[65536 / 8];
        size_t blen = 0;
        int rg = kvx_idx_get_usage(txn, ix, b, &g, bits, sizeof bits, &blen);
        CHECK(rg == rc);
        if (rc) return;
        CHECK(memcmp(&g, &r, sizeof r) == 0 && blen == vlen - sizeof r);
        CHECK(memcmp(bits, val + sizeof r, blen) == 0);
        if (r.crc) {
            CHECK(kvx_idx_put_usage(txn, ix, b, &r, bits, blen) == 0);
            CHECK(stored_equals(txn, ix->usage, k, val, vlen));
        }
        return;
    }
    case 4: { /* meta "stats" -> u64 counters [+ crc] */
        MDB_val sk = {5, "stats"};
        if (vlen == 0) return;
        CHECK(mdb_put(txn, ix->meta, &sk, &v, 0) == 0);
        kvx_idx_stats st;
        rc = kvx_idx_get_stats(txn, ix, &st);
        CHECK(rc == 0 || rc == MDB_CORRUPTED);
        if (rc == 0 && vlen == sizeof st + 8 && memcmp(val + sizeof st + 4, "\0\0\0\0", 4) == 0) {
            CHECK(kvx_idx_put_stats(txn, ix, &st) == 0);
            CHECK(stored_equals(txn, ix->meta, sk, val, vlen));
        }
        return;
    }
    default: { /* meta "<name>" -> u64 {value, crc, 0} (8 bytes, before the checksums: damaged) */
        char name[64];
        if (klen == 0 || klen >= sizeof name || memchr(key, 0, klen) || vlen == 0) return;
        memcpy(name, key, klen);
        name[klen] = '\0';
        CHECK(mdb_put(txn, ix->meta, &k, &v, 0) == 0);
        uint64_t x = 1;
        rc = kvx_idx_get_u64(txn, ix->meta, name, &x);
        CHECK(rc == 0 || rc == MDB_CORRUPTED);
        CHECK(rc != 0 || vlen == 16);
        if (rc == 0 && vlen == 16 && memcmp(val + 12, "\0\0\0\0", 4) == 0) {
            CHECK(kvx_idx_put_u64(txn, ix->meta, name, x) == 0);
            CHECK(stored_equals(txn, ix->meta, k, val, vlen));
        }
        return;
    }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ix) setup();
    if (size < 2 || size > 65536) return 0;
    int kind = data[0] % 6;
    size_t klen = data[1];
    if (klen > size - 2) klen = size - 2;
    const uint8_t *key = data + 2, *val = data + 2 + klen;
    size_t vlen = size - 2 - klen;
    /* aligned private copies: LMDB and the decoders see only these */
    uint8_t *kc = malloc(klen ? klen : 1), *vc = malloc(vlen ? vlen : 1);
    CHECK(kc && vc);
    memcpy(kc, key, klen);
    memcpy(vc, val, vlen);
    MDB_txn *txn;
    CHECK(mdb_txn_begin(ix->env, NULL, 0, &txn) == 0);
    one(txn, kind, kc, klen, vc, vlen);
    mdb_txn_abort(txn);
    free(kc);
    free(vc);
    return 0;
}
