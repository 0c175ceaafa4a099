/*
 * records.c - the bytes of the catalog's records (index.h lists them).
 * The rule it keeps: no record byte is used before its size and its
 * CRC-32C are checked, and every record written carries its CRC-32C
 * (DESIGN.md rule 4). A record is read only in this release's size with
 * its crc, or (shard records) the previous release's size with its crc;
 * anything else, a record written before the checksums (crc 0, or a
 * shorter size) included, is damaged: MDB_CORRUPTED, which names
 * reindex. The getters and decoders copy records out: no pointer into the map leaves.
 * Helpers here return LMDB codes (MDB_CORRUPTED for a damaged record);
 * their callers in index/ turn them into kvx codes.
 */
#include "index.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------ record checksums */

/* CRC-32C of key then record (the record's crc field already 0); 0 -> 1,
 * since a crc of 0 is never valid (records before the checksums had it). */
static uint32_t idx_crc(const void *key, size_t klen, const void *rec, size_t rlen)
{
    uint32_t c = kvx_crc32c(kvx_crc32c(0, key, klen), rec, rlen);
    return c ? c : 1;
}

static uint32_t idx_loc_crc(uint64_t hash, uint32_t coord, uint64_t gen)
{
    kvx_idx_loc l = {coord, 0, gen};
    return idx_crc(&hash, 8, &l, sizeof l);
}

static kvx_idx_loc idx_loc(uint64_t hash, uint32_t coord, uint64_t gen)
{
    kvx_idx_loc l = {coord, idx_loc_crc(hash, coord, gen), gen};
    return l;
}

/* meta u64 values: 16 bytes {value, crc, 0}. */
int kvx_idx_get_u64(MDB_txn *txn, MDB_dbi dbi, const char *key, uint64_t *out)
{
    MDB_val k = {strlen(key), (void *)key}, v;
    int rc = mdb_get(txn, dbi, &k, &v);
    *out = 0;
    if (rc == MDB_NOTFOUND) return 0;
    if (rc) return rc;
    if (v.mv_size != 16) return MDB_CORRUPTED;
    uint8_t rec[16];
    memcpy(rec, v.mv_data, 16);
    uint32_t crc = kvx_load32(rec + 8);
    memset(rec + 8, 0, 4);
    if (crc != idx_crc(key, k.mv_size, rec, 16)) return MDB_CORRUPTED;
    memcpy(out, rec, 8);
    return 0;
}

int kvx_idx_put_u64(MDB_txn *txn, MDB_dbi dbi, const char *key, uint64_t v)
{
    uint8_t rec[16] = {0};
    memcpy(rec, &v, 8);
    kvx_store32(rec + 8, idx_crc(key, strlen(key), rec, 16));
    MDB_val k = {strlen(key), (void *)key}, d = {16, rec};
    return mdb_put(txn, dbi, &k, &d, 0);
}

int kvx_idx_get_stats(MDB_txn *txn, kvx_index *ix, kvx_idx_stats *out)
{
    MDB_val k = {5, "stats"}, v;
    memset(out, 0, sizeof *out);
    int rc = mdb_get(txn, ix->meta, &k, &v);
    if (rc == MDB_NOTFOUND) return 0;
    if (rc) return rc;
    /* the u64 counters, then a u64 whose low half is the CRC of what
     * precedes it */
    if (v.mv_size != sizeof *out + 8) return MDB_CORRUPTED;
    uint64_t tail;
    memcpy(&tail, (const uint8_t *)v.mv_data + sizeof *out, 8);
    if ((uint32_t)tail != idx_crc("stats", 5, v.mv_data, sizeof *out)) return MDB_CORRUPTED;
    memcpy(out, v.mv_data, sizeof *out);
    return 0;
}

int kvx_idx_put_stats(MDB_txn *txn, kvx_index *ix, const kvx_idx_stats *st)
{
    uint8_t rec[sizeof *st + 8];
    memcpy(rec, st, sizeof *st);
    uint64_t tail = idx_crc("stats", 5, st, sizeof *st);
    memcpy(rec + sizeof *st, &tail, 8);
    MDB_val k = {5, "stats"}, v = {sizeof rec, rec};
    return mdb_put(txn, ix->meta, &k, &v, 0);
}

int kvx_idx_add_block(MDB_txn *txn, kvx_index *ix, uint32_t coord, uint64_t hash, uint64_t gen)
{
    kvx_idx_coord cv = {hash, gen, 0, 0};
    cv.crc = idx_crc(&coord, 4, &cv, sizeof cv);
    MDB_val k = {4, &coord}, v = {sizeof cv, &cv};
    int rc = mdb_put(txn, ix->coord, &k, &v, 0);
    if (rc) return rc;
    kvx_idx_loc loc = idx_loc(hash, coord, gen);
    MDB_val hk = {8, &hash}, hv = {sizeof loc, &loc};
    rc = mdb_put(txn, ix->hash, &hk, &hv, MDB_NODUPDATA);
    return rc == MDB_KEYEXIST ? 0 : rc;
}

/* Deletes (hash -> coord, gen). */
static int idx_del_loc(MDB_txn *txn, kvx_index *ix, uint64_t hash, uint32_t coord, uint64_t gen)
{
    kvx_idx_loc loc = idx_loc(hash, coord, gen);
    MDB_val hk = {8, &hash}, hv = {sizeof loc, &loc};
    int rc = mdb_del(txn, ix->hash, &hk, &hv);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

int kvx_idx_has_loc_cur(MDB_cursor *cur, uint64_t hash, uint32_t coord, uint64_t gen)
{
    kvx_idx_loc loc = idx_loc(hash, coord, gen);
    MDB_val hk = {8, &hash}, hv = {sizeof loc, &loc};
    int rc = mdb_cursor_get(cur, &hk, &hv, MDB_GET_BOTH);
    return rc == 0 ? 1 : rc == MDB_NOTFOUND ? 0 : rc;
}

int kvx_idx_has_loc(MDB_txn *txn, kvx_index *ix, uint64_t hash, uint32_t coord, uint64_t gen)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, ix->hash, &cur);
    if (rc) return rc;
    rc = kvx_idx_has_loc_cur(cur, hash, coord, gen);
    mdb_cursor_close(cur);
    return rc;
}

int kvx_idx_del_block(MDB_txn *txn, kvx_index *ix, uint32_t coord, uint64_t hash, uint64_t gen)
{
    MDB_val k = {4, &coord}, v;
    int rc = mdb_get(txn, ix->coord, &k, &v);
    if (rc == 0) {
        uint32_t c;
        kvx_idx_coord cv;
        if ((rc = kvx_idx_dec_coord(&k, &v, &c, &cv))) return rc;
        if (cv.gen == gen) {
            rc = mdb_del(txn, ix->coord, &k, NULL);
            if (rc) return rc;
        }
    } else if (rc != MDB_NOTFOUND) {
        return rc;
    }
    return idx_del_loc(txn, ix, hash, coord, gen);
}

int kvx_idx_del_shard_blocks(MDB_txn *txn, kvx_index *ix, uint32_t b, uint64_t *out_removed)
{
    MDB_cursor *cur;
    uint64_t n = 0;
    int rc = mdb_cursor_open(txn, ix->coord, &cur);
    if (rc) return rc;
    uint32_t first = b << 24;
    MDB_val k = {4, &first}, v;
    rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
    while (rc == 0) {
        uint32_t c;
        kvx_idx_coord cv;
        if ((rc = kvx_idx_dec_coord(&k, &v, &c, &cv))) break;
        if ((c >> 24) != b) break;
        int r = idx_del_loc(txn, ix, cv.hash, c, cv.gen);
        if (r) {
            rc = r;
            break;
        }
        if ((r = mdb_cursor_del(cur, 0))) {
            rc = r;
            break;
        }
        n++;
        k.mv_size = 4; /* re-seek: simplest correct walk over a shrinking range */
        k.mv_data = &first;
        rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
    }
    mdb_cursor_close(cur);
    if (out_removed) *out_removed = n;
    return rc == MDB_NOTFOUND ? 0 : rc;
}

/* ------------------------------------------------------- typed records */

/* Decoders accept the record of this release with its crc, and (shard
 * records) the previous release's, 40 bytes without ino, with its crc:
 * what a migration reads (DESIGN.md rule 4). Nothing else. */
int kvx_idx_dec_shard(const MDB_val *k, const MDB_val *v, uint32_t *out_byte, kvx_idx_shard *out)
{
    const size_t prev = offsetof(kvx_idx_shard, ino);
    if (k->mv_size != 4 || (v->mv_size != sizeof *out && v->mv_size != prev)) return MDB_CORRUPTED;
    memcpy(out_byte, k->mv_data, 4);
    memset(out, 0, sizeof *out);
    memcpy(out, v->mv_data, v->mv_size);
    /* the crc covers the record's own size (the previous release's had no ino) */
    kvx_idx_shard r = *out;
    r.crc = 0;
    if (out->crc != idx_crc(k->mv_data, 4, &r, v->mv_size)) return MDB_CORRUPTED;
    return 0;
}

int kvx_idx_dec_coord(const MDB_val *k, const MDB_val *v, uint32_t *out_coord, kvx_idx_coord *out)
{
    if (k->mv_size != 4 || v->mv_size != sizeof *out) return MDB_CORRUPTED;
    memcpy(out_coord, k->mv_data, 4);
    memcpy(out, v->mv_data, sizeof *out);
    kvx_idx_coord r = *out;
    r.crc = 0;
    if (out->crc != idx_crc(k->mv_data, 4, &r, sizeof r)) return MDB_CORRUPTED;
    return 0;
}

int kvx_idx_dec_loc(const MDB_val *k, const MDB_val *v, uint64_t *out_hash, kvx_idx_loc *out)
{
    if (k->mv_size != 8 || v->mv_size != sizeof *out) return MDB_CORRUPTED;
    memcpy(out_hash, k->mv_data, 8);
    memcpy(out, v->mv_data, sizeof *out);
    if (out->crc != idx_loc_crc(*out_hash, out->coord, out->gen)) return MDB_CORRUPTED;
    return 0;
}

int kvx_idx_put_shard(MDB_txn *txn, kvx_index *ix, uint32_t byte, const kvx_idx_shard *rec)
{
    kvx_idx_shard r = *rec;
    r.crc = 0;
    r.crc = idx_crc(&byte, 4, &r, sizeof r);
    MDB_val k = {4, &byte}, v = {sizeof r, &r};
    return mdb_put(txn, ix->shards, &k, &v, 0);
}

static uint32_t idx_usage_crc(uint32_t byte, const kvx_idx_usage *hdr, const uint8_t *bits, size_t nbytes)
{
    kvx_idx_usage h = *hdr;
    h.crc = 0;
    uint32_t c = kvx_crc32c(kvx_crc32c(0, &byte, 4), &h, sizeof h);
    if (bits) {
        c = kvx_crc32c(c, bits, nbytes);
    } else {
        static const uint8_t zero[256];
        for (size_t off = 0; off < nbytes; off += sizeof zero)
            c = kvx_crc32c(c, zero, nbytes - off < sizeof zero ? nbytes - off : sizeof zero);
    }
    return c ? c : 1;
}

int kvx_idx_put_usage(MDB_txn *txn, kvx_index *ix, uint32_t byte, const kvx_idx_usage *hdr, const uint8_t *bits,
                      size_t nbytes)
{
    kvx_idx_usage h = *hdr;
    h.crc = idx_usage_crc(byte, hdr, bits, nbytes);
    /* written in place: LMDB hands out room for the record */
    MDB_val k = {4, &byte}, v = {sizeof h + nbytes, NULL};
    int rc = mdb_put(txn, ix->usage, &k, &v, MDB_RESERVE);
    if (rc) return rc;
    memcpy(v.mv_data, &h, sizeof h);
    if (bits && nbytes) memcpy((uint8_t *)v.mv_data + sizeof h, bits, nbytes);
    else if (nbytes) memset((uint8_t *)v.mv_data + sizeof h, 0, nbytes);
    return 0;
}

/* A usage record: the header, then exactly (n_bits + 7) / 8 bitmap bytes;
 * a shard has at most 65536 entries. */
static int idx_usage_size_ok(const MDB_val *v, kvx_idx_usage *hdr)
{
    if (v->mv_size < sizeof *hdr || v->mv_size > sizeof *hdr + 65536 / 8) return 0;
    memcpy(hdr, v->mv_data, sizeof *hdr);
    return hdr->n_bits <= 65536 && v->mv_size == sizeof *hdr + ((size_t)hdr->n_bits + 7) / 8;
}

int kvx_idx_dec_usage(const MDB_val *k, const MDB_val *v, uint32_t *out_byte, kvx_idx_usage *out)
{
    kvx_idx_usage hdr;
    if (k->mv_size != 4 || !idx_usage_size_ok(v, &hdr)) return MDB_CORRUPTED;
    uint32_t byte;
    memcpy(&byte, k->mv_data, 4);
    if (hdr.crc != idx_usage_crc(byte, &hdr, (const uint8_t *)v->mv_data + sizeof hdr, v->mv_size - sizeof hdr))
        return MDB_CORRUPTED;
    memcpy(out_byte, k->mv_data, 4);
    *out = hdr;
    return 0;
}

int kvx_idx_get_shard(MDB_txn *txn, const kvx_index *ix, uint32_t byte, kvx_idx_shard *out)
{
    MDB_val k = {4, &byte}, v;
    int rc = mdb_get(txn, ix->shards, &k, &v);
    if (rc) return rc;
    uint32_t b;
    return kvx_idx_dec_shard(&k, &v, &b, out);
}

int kvx_idx_get_coord(MDB_txn *txn, const kvx_index *ix, uint32_t coord, kvx_idx_coord *out)
{
    MDB_val k = {4, &coord}, v;
    int rc = mdb_get(txn, ix->coord, &k, &v);
    if (rc) return rc;
    uint32_t c;
    return kvx_idx_dec_coord(&k, &v, &c, out);
}

int kvx_idx_get_usage(MDB_txn *txn, const kvx_index *ix, uint32_t byte, kvx_idx_usage *out, uint8_t *bits,
                      size_t bits_cap, size_t *out_bits_len)
{
    MDB_val k = {4, &byte}, v;
    int rc = mdb_get(txn, ix->usage, &k, &v);
    if (rc) return rc;
    kvx_idx_usage hdr;
    if (!idx_usage_size_ok(&v, &hdr)) return MDB_CORRUPTED;
    size_t n = v.mv_size - sizeof hdr;
    if (hdr.crc != idx_usage_crc(byte, &hdr, (const uint8_t *)v.mv_data + sizeof hdr, n))
        return MDB_CORRUPTED;
    *out = hdr;
    if (out_bits_len) *out_bits_len = n;
    if (bits && n <= bits_cap) memcpy(bits, (const uint8_t *)v.mv_data + sizeof hdr, n);
    return 0;
}
