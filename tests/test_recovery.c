/*
 * test_recovery.c - DESIGN.md trust rules 2 to 4 against the library:
 * nothing acknowledged is deleted on the word of the index or of a check,
 * readers never repair, the index is rebuildable. Each test is a finding
 * of the issue "Trust II" that failed before recovery judged shards by
 * themselves:
 *  - test_size_differs_kept: a shard whose last 4 KiB were lost, or with
 *    one byte appended, is kept byte for byte and served by every command;
 *  - test_stale_index_adopts: an older data.mdb put back: shards it does
 *    not name are adopted, not deleted; a shard restored from a backup is
 *    indexed; a new shard never takes an existing file's name;
 *  - test_reindex_quarantines: reindex moves a shard with damaged metadata
 *    to quarantine/ (same bytes, a .why note, counted in stat), says so,
 *    and deletes nothing;
 *  - test_damaged_record_readonly: a damaged index record (shard, hash,
 *    coordinate) fails its own CRC-32C: a reported error naming reindex,
 *    never a delete or a wrong answer;
 *  - test_legacy_records_open: an index written before record checksums
 *    opens, serves, takes puts and verifies clean;
 *  - test_index_lost: index/ deleted or replaced by garbage: a reader
 *    names reindex, kvx_store_reindex_dir rebuilds it, every block served;
 *  - test_directories_where_files_belong: a directory in staging/ or
 *    shards/ blocks nothing and is left alone;
 *  - test_generation_never_reused: the next shard's name exceeds every
 *    name in shards/, staging/ and quarantine/;
 *  - test_headless_chain_gc: gc drops blocks with no path to block 0;
 *  - test_capacity_limits: a capacity below the shard size is refused;
 *  - test_truncate_extend_many_points: a shard cut or extended at many
 *    points keeps its bytes and serves exactly its whole pages;
 *  - test_shard_replaced_by_fifo: a FIFO where a registered shard was
 *    blocks nothing and is left alone;
 *  - test_sparse_giant_bounded: an 8 KiB file declaring a huge block_tokens
 *    costs no more than the file.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lib/store.h"

#include <lmdb.h>

/* A cheap fingerprint of every file in shards/ (names, sizes, bytes). */
static uint64_t shards_fingerprint(const char *dir)
{
    char names[64][64];
    size_t n = su_list_files(dir, "shards", names, 64);
    uint64_t fp = n;
    for (size_t i = 0; i < n; i++) {
        char path[700];
        snprintf(path, sizeof path, "%s/shards/%s", dir, names[i]);
        fp = su_mix(fp ^ kvx_fnv1a64(names[i], strlen(names[i])));
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        uint8_t buf[4096];
        size_t got;
        while ((got = fread(buf, 1, sizeof buf, f)) > 0) fp = su_mix(fp ^ kvx_fnv1a64(buf, got));
        fclose(f);
    }
    return fp;
}

static void shard_path(const char *dir, size_t k, char *out, size_t cap)
{
    char names[64][64];
    size_t n = su_list_files(dir, "shards", names, 64);
    assert_true(k < n);
    snprintf(out, cap, "%s/shards/%s", dir, names[k]);
}

static void test_size_differs_kept(void **state)
{
    (void)state;
    for (int mode = 0; mode < 2; mode++) {
        char dir[300], shard[700];
        kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
        su_put_flush(s, 1, 6);
        kvx_store_close(s);
        shard_path(dir, 0, shard, sizeof shard);
        struct stat st;
        assert_int_equal(stat(shard, &st), 0);
        if (mode == 0) {
            assert_int_equal(truncate(shard, st.st_size - 4096), 0); /* its last 4 KiB lost */
        } else {
            FILE *f = fopen(shard, "ab"); /* one byte appended */
            assert_non_null(f);
            fputc(0x55, f);
            fclose(f);
        }
        uint64_t fp = shards_fingerprint(dir);
        /* every reader: the file stays byte for byte, the good pages serve */
        assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
        kvx_store_stats stt;
        assert_int_equal(kvx_store_stat(&stt, s), 0);
        assert_int_equal(stt.blocks, 6);
        assert_int_equal(su_served_prefix(s, 1, 6), mode == 0 ? 5u : 6u);
        uint64_t bad = 0;
        int v = kvx_store_verify(s, &bad, NULL, NULL);
        if (mode == 0) {
            assert_int_equal(v, KVX_ECORRUPT); /* names the missing page, never "OK (0 blocks)" */
            assert_true(bad >= 1);
        }
        kvx_store_close(s);
        assert_true(shards_fingerprint(dir) == fp);
        /* a writer corrects the record, keeps the file */
        assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
        assert_int_equal(su_served_prefix(s, 1, 6), mode == 0 ? 5u : 6u);
        assert_int_equal(kvx_store_stat(&stt, s), 0);
        assert_int_equal(stt.dropped_shards, 0);
        assert_int_equal(stt.quarantined, 0);
        kvx_store_close(s);
        assert_true(shards_fingerprint(dir) == fp);
    }
}

static int cp(const char *from, const char *to)
{
    char cmd[2100];
    snprintf(cmd, sizeof cmd, "cp -a '%.1000s' '%.1000s'", from, to);
    return system(cmd);
}

static void test_stale_index_adopts(void **state)
{
    (void)state;
    char dir[300], old_index[400], idx[400], backup[400];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 1, 4);
    kvx_store_close(s);
    snprintf(idx, sizeof idx, "%s/index/data.mdb", dir);
    snprintf(old_index, sizeof old_index, "%s/old.mdb", su_root);
    assert_int_equal(cp(idx, old_index), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    su_put_flush(s, 2, 4);
    su_put_flush(s, 3, 4);
    kvx_store_close(s);
    char names[64][64];
    size_t nshards = su_list_files(dir, "shards", names, 64);
    assert_true(nshards >= 3);
    /* a backup of the newest shard, then the old index put back */
    char newest[700];
    shard_path(dir, nshards - 1, newest, sizeof newest);
    snprintf(backup, sizeof backup, "%s/backup.kvx", su_root);
    assert_int_equal(cp(newest, backup), 0);
    assert_int_equal(cp(old_index, idx), 0);
    uint64_t fp = shards_fingerprint(dir);
    /* a reader with the stale index: misses, deletes nothing */
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(su_served_prefix(s, 1, 4), 4);
    assert_int_equal(su_served_prefix(s, 2, 4), 0);
    kvx_store_close(s);
    assert_true(shards_fingerprint(dir) == fp);
    /* a writer adopts the shards the index does not name */
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    for (uint64_t q = 1; q <= 3; q++) assert_int_equal(su_served_prefix(s, q, 4), 4);
    /* a new shard never takes an existing name: every name still there */
    su_put_flush(s, 4, 4);
    kvx_store_close(s);
    char after[64][64];
    size_t nafter = su_list_files(dir, "shards", after, 64);
    assert_int_equal(nafter, nshards + 1);
    for (size_t i = 0; i < nshards; i++) assert_string_equal(after[i], names[i]);
    /* the backup of a shard the store no longer has (evicted or lost) is
     * put back: a writer indexes it */
    assert_int_equal(unlink(newest), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(su_served_prefix(s, 3, 4), 0);
    kvx_store_close(s);
    assert_int_equal(cp(backup, newest), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(su_served_prefix(s, 3, 4), 4);
    kvx_store_close(s);
}

static void test_reindex_quarantines(void **state)
{
    (void)state;
    char dir[300], shard[700];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 1, 4);
    su_put_flush(s, 2, 4);
    kvx_store_close(s);
    shard_path(dir, 0, shard, sizeof shard);
    /* damaged metadata: one flipped header byte (meta CRC fails) */
    int fd = open(shard, O_RDWR);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, 17), 1);
    b ^= 1;
    assert_int_equal(pwrite(fd, &b, 1, 17), 1);
    close(fd);
    struct stat st0;
    assert_int_equal(stat(shard, &st0), 0);
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    assert_non_null(strstr(kvx_last_error(), "quarantine"));
    /* moved, not deleted: same name, same bytes, a note */
    char q[800], why[1700];
    snprintf(q, sizeof q, "%s/quarantine/%s", dir, strrchr(shard, '/') + 1);
    struct stat st1;
    assert_int_equal(stat(q, &st1), 0);
    assert_int_equal(st1.st_size, st0.st_size);
    snprintf(why, sizeof why, "%s.why", q);
    FILE *f = fopen(why, "r");
    assert_non_null(f);
    char text[600] = "";
    assert_non_null(fgets(text, sizeof text, f));
    fclose(f);
    assert_non_null(strstr(text, "cannot be validated"));
    assert_int_equal(access(shard, F_OK), -1);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.quarantined, 1);
    /* and `kvx store stat --json` says so */
    char cmd[600], out[4096] = "";
    snprintf(cmd, sizeof cmd, "%s store stat --json %s", KVX_CLI, dir);
    FILE *pf = popen(cmd, "r");
    assert_non_null(pf);
    size_t got = fread(out, 1, sizeof out - 1, pf);
    out[got] = 0;
    assert_int_equal(pclose(pf), 0);
    assert_non_null(strstr(out, "\"quarantined\":1"));
    size_t a = su_served_prefix(s, 1, 4), c = su_served_prefix(s, 2, 4);
    assert_true((a == 4 && c == 0) || (a == 0 && c == 4)); /* the other shard is whole */
    uint64_t bad = 9;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    kvx_store_close(s);
    /* a second clash keeps both: a numeric suffix */
    assert_int_equal(cp(q, shard), 0);
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    snprintf(q + strlen(q), sizeof q - strlen(q), ".1");
    assert_int_equal(access(q, F_OK), 0);
}

/* The first record of database dbname, one byte of its value flipped at
 * offset off, through LMDB itself (tests may call LMDB directly): damage
 * LMDB cannot notice, which the record's own CRC-32C catches. */
static void corrupt_record(const char *dir, const char *dbname, unsigned flags, size_t off)
{
    char idx[400];
    snprintf(idx, sizeof idx, "%s/index", dir);
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    MDB_cursor *cur;
    MDB_val k, v;
    assert_int_equal(mdb_env_create(&env), 0);
    assert_int_equal(mdb_env_set_maxdbs(env, 16), 0);
    assert_int_equal(mdb_env_open(env, idx, 0, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, dbname, flags, &dbi), 0);
    assert_int_equal(mdb_cursor_open(txn, dbi, &cur), 0);
    assert_int_equal(mdb_cursor_get(cur, &k, &v, MDB_FIRST), 0);
    uint8_t rec[256];
    assert_true(v.mv_size > off && v.mv_size <= sizeof rec);
    memcpy(rec, v.mv_data, v.mv_size);
    rec[off] ^= 0x10;
    MDB_val nv = {v.mv_size, rec};
    if (flags & MDB_DUPSORT) {
        /* a dup's bytes are its identity: replace it */
        assert_int_equal(mdb_cursor_del(cur, 0), 0);
        assert_int_equal(mdb_put(txn, dbi, &k, &nv, 0), 0);
    } else {
        assert_int_equal(mdb_cursor_put(cur, &k, &nv, MDB_CURRENT), 0);
    }
    mdb_cursor_close(cur);
    assert_int_equal(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

/* A damaged index record is a reported error naming reindex: never a
 * delete, never a wrong answer (DESIGN.md rule 4). */
static void test_damaged_record_readonly(void **state)
{
    (void)state;
    /* the shard record's file_bytes (offset 8): the store will not open */
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 1, 4);
    kvx_store_close(s);
    corrupt_record(dir, "shards", MDB_INTEGERKEY, 8);
    uint64_t fp = shards_fingerprint(dir);
    for (int writer = 0; writer < 2; writer++) {
        assert_int_equal(kvx_store_open(&s, dir, NULL, writer ? 0 : KVX_STORE_READONLY), KVX_ECORRUPT);
        assert_non_null(strstr(kvx_last_error(), "reindex"));
        assert_true(shards_fingerprint(dir) == fp);
    }
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    assert_true(shards_fingerprint(dir) == fp);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(su_served_prefix(s, 1, 4), 4);
    kvx_store_close(s);

    /* a hash record's generation (offset 8 of {coord, crc, gen}): the
     * lookup reports it, the other records still answer */
    s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 1, 4);
    kvx_store_close(s);
    corrupt_record(dir, "hash", MDB_INTEGERKEY | MDB_DUPSORT | MDB_DUPFIXED, 8);
    fp = shards_fingerprint(dir);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    uint32_t t[4 * SU_B];
    uint64_t h[4];
    su_tokens(t, 1, 4, 0);
    kvx_block_hashes(h, t, 4 * SU_B, SU_B);
    int damaged = 0;
    for (int i = 0; i < 4; i++) {
        kvx_view v;
        int rc = kvx_store_get_hash(&v, s, h[i]);
        if (rc == KVX_ECORRUPT) {
            damaged++;
            assert_non_null(strstr(kvx_last_error(), "reindex"));
        } else {
            assert_int_equal(rc, 0);
            kvx_view_release(&v);
        }
    }
    assert_int_equal(damaged, 1);
    kvx_view pv[4];
    size_t n = 9;
    int prc = kvx_store_prefix(pv, &n, s, t, 4 * SU_B, 4);
    assert_true(prc == KVX_ECORRUPT || (prc == 0 && n < 4));
    if (prc == 0) kvx_views_release(pv, n);
    uint64_t bad = 0;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), KVX_ECORRUPT);
    kvx_store_close(s);
    assert_true(shards_fingerprint(dir) == fp);
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(su_served_prefix(s, 1, 4), 4);
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    kvx_store_close(s);

    /* a coordinate record (its hash, offset 0): get by coordinate reports it */
    s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 1, 4);
    kvx_store_close(s);
    corrupt_record(dir, "coord", MDB_INTEGERKEY, 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    kvx_shard **sh;
    size_t nsh;
    assert_int_equal(kvx_store_shards(&sh, &nsh, s), 0);
    assert_true(nsh >= 1);
    kvx_entry e;
    assert_int_equal(kvx_shard_entry(&e, sh[0], 0), 0);
    for (size_t i = 0; i < nsh; i++) kvx_shard_close(sh[i]);
    kvx_free(sh);
    kvx_view v;
    assert_int_equal(kvx_store_get(&v, s, e.coordinate), KVX_ECORRUPT);
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), KVX_ECORRUPT);
    kvx_store_close(s);
}

/* Every record of an index rewritten in the form of the release before
 * record checksums (shard 32 bytes, coordinate 16, hash and usage crc 0,
 * next_gen 8, stats 48): such a store still opens, serves, takes puts and
 * verifies clean. */
static void legacy_rewrite(MDB_txn *txn, const char *name, unsigned flags, size_t keep, size_t crc_off)
{
    MDB_dbi dbi;
    MDB_cursor *cur;
    MDB_val k, v;
    assert_int_equal(mdb_dbi_open(txn, name, flags, &dbi), 0);
    assert_int_equal(mdb_cursor_open(txn, dbi, &cur), 0);
    uint8_t keys[64][8], vals[64][256];
    size_t klen[64], vlen[64], n = 0;
    int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
    while (rc == 0 && n < 64) {
        memcpy(keys[n], k.mv_data, k.mv_size);
        klen[n] = k.mv_size;
        memcpy(vals[n], v.mv_data, v.mv_size);
        vlen[n] = v.mv_size;
        n++;
        rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
    }
    mdb_cursor_close(cur);
    assert_int_equal(mdb_drop(txn, dbi, 0), 0);
    for (size_t i = 0; i < n; i++) {
        if (crc_off != SIZE_MAX) memset(vals[i] + crc_off, 0, 4);
        MDB_val nk = {klen[i], keys[i]}, nv = {keep ? keep : vlen[i], vals[i]};
        assert_int_equal(mdb_put(txn, dbi, &nk, &nv, 0), 0);
    }
}

static void test_legacy_records_open(void **state)
{
    (void)state;
    char dir[300], idx[400];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 1, 4);
    su_put_flush(s, 2, 3);
    kvx_store_close(s);
    snprintf(idx, sizeof idx, "%s/index", dir);
    MDB_env *env;
    MDB_txn *txn;
    assert_int_equal(mdb_env_create(&env), 0);
    assert_int_equal(mdb_env_set_maxdbs(env, 16), 0);
    assert_int_equal(mdb_env_open(env, idx, 0, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
    legacy_rewrite(txn, "shards", MDB_INTEGERKEY, 32, SIZE_MAX);
    legacy_rewrite(txn, "coord", MDB_INTEGERKEY, 16, SIZE_MAX);
    legacy_rewrite(txn, "hash", MDB_INTEGERKEY | MDB_DUPSORT | MDB_DUPFIXED, 0, 4);
    legacy_rewrite(txn, "usage", MDB_INTEGERKEY, 0, 28);
    legacy_rewrite(txn, "meta", 0, 0, SIZE_MAX);
    MDB_dbi meta;
    assert_int_equal(mdb_dbi_open(txn, "meta", 0, &meta), 0);
    MDB_val k = {8, "next_gen"}, v;
    assert_int_equal(mdb_get(txn, meta, &k, &v), 0);
    uint64_t ng;
    memcpy(&ng, v.mv_data, 8);
    MDB_val nv = {8, &ng};
    assert_int_equal(mdb_put(txn, meta, &k, &nv, 0), 0);
    MDB_val sk = {5, "stats"};
    assert_int_equal(mdb_get(txn, meta, &sk, &v), 0);
    uint8_t st48[48];
    memcpy(st48, v.mv_data, 48);
    MDB_val sv = {48, st48};
    assert_int_equal(mdb_put(txn, meta, &sk, &sv, 0), 0);
    assert_int_equal(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
    for (int writer = 0; writer < 2; writer++) {
        assert_int_equal(kvx_store_open(&s, dir, NULL, writer ? 0 : KVX_STORE_READONLY), 0);
        assert_int_equal(su_served_prefix(s, 1, 4), 4);
        assert_int_equal(su_served_prefix(s, 2, 3), 3);
        uint64_t bad = 9;
        assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
        if (writer) {
            su_put_flush(s, 3, 2);
            assert_int_equal(su_served_prefix(s, 3, 2), 2);
            assert_int_equal(kvx_store_gc(s), 0);
            assert_int_equal(su_served_prefix(s, 1, 4), 4);
        }
        kvx_store_close(s);
    }
}

static void test_index_lost(void **state)
{
    (void)state;
    for (int mode = 0; mode < 3; mode++) {
        char dir[300], cmd[700];
        kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
        su_put_flush(s, 1, 4);
        su_put_flush(s, 2, 3);
        kvx_store_close(s);
        uint64_t fp = shards_fingerprint(dir);
        if (mode == 0) snprintf(cmd, sizeof cmd, "rm -rf %s/index", dir);
        else if (mode == 1) snprintf(cmd, sizeof cmd, "rm -f %s/index/*.mdb", dir);
        else snprintf(cmd, sizeof cmd, "head -c 65536 /dev/urandom > %s/index/data.mdb", dir);
        assert_int_equal(system(cmd), 0);
        if (mode != 2) {
            /* a reader names reindex (never a signal, never "create") */
            assert_int_not_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
            assert_non_null(strstr(kvx_last_error(), "reindex"));
        }
        assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
        assert_true(shards_fingerprint(dir) == fp);
        assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
        assert_int_equal(su_served_prefix(s, 1, 4), 4);
        assert_int_equal(su_served_prefix(s, 2, 3), 3);
        uint64_t bad = 9;
        assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
        kvx_store_close(s);
        snprintf(cmd, sizeof cmd, "%s/index.old", dir);
        assert_int_equal(access(cmd, F_OK), -1); /* removed on success */
    }
}

static void test_directories_where_files_belong(void **state)
{
    (void)state;
    char dir[300], p[500];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 1, 4);
    kvx_store_close(s);
    snprintf(p, sizeof p, "%s/staging/adir", dir);
    assert_int_equal(mkdir(p, 0700), 0);
    snprintf(p, sizeof p, "%s/shards/00000000000000ff.kvx", dir);
    assert_int_equal(mkdir(p, 0700), 0);
    for (int writer = 0; writer < 2; writer++) {
        assert_int_equal(kvx_store_open(&s, dir, NULL, writer ? 0 : KVX_STORE_READONLY), 0);
        assert_int_equal(su_served_prefix(s, 1, 4), 4);
        if (writer) {
            su_put_flush(s, 2, 2);
            assert_int_equal(kvx_store_gc(s), 0);
            assert_int_equal(kvx_store_reindex(s), 0);
        }
        kvx_store_close(s);
    }
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_true(S_ISDIR(st.st_mode)); /* left alone */
    snprintf(p, sizeof p, "%s/staging/adir", dir);
    assert_int_equal(stat(p, &st), 0);
}

static void test_generation_never_reused(void **state)
{
    (void)state;
    char dir[300], p[600];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 1, 2);
    kvx_store_close(s);
    /* a file in quarantine/ with a high generation, one in staging/ */
    snprintf(p, sizeof p, "%s/quarantine", dir);
    assert_int_equal(mkdir(p, 0700), 0);
    snprintf(p, sizeof p, "%s/quarantine/0000000000000100.kvx", dir);
    FILE *f = fopen(p, "w");
    fclose(f);
    snprintf(p, sizeof p, "%s/staging/.0000000000000200.kvx.tmp.1.2", dir);
    f = fopen(p, "w");
    fclose(f);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    su_put_flush(s, 2, 2);
    kvx_store_close(s);
    char names[64][64];
    size_t n = su_list_files(dir, "shards", names, 64);
    assert_true(n >= 2);
    uint64_t newest = strtoull(names[n - 1], NULL, 16);
    assert_true(newest > 0x200);
}

static void test_headless_chain_gc(void **state)
{
    (void)state;
    char dir[300];
    /* one sequence in its own shard per flush: block 0 alone, then the
     * rest of the chain in another shard */
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    uint32_t t[8 * SU_B];
    uint64_t h[8];
    su_tokens(t, 5, 8, 0);
    uint8_t *p = su_pages(t, 8, h, 64);
    assert_int_equal(kvx_store_put(s, t, SU_B, p, 1, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_put(s, t, 8 * SU_B, p, 8, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    su_put_flush(s, 6, 3); /* an unrelated whole chain */
    kvx_store_close(s);
    /* the shard holding block 0 is lost (removed by hand): blocks 1..7 have
     * no path to a block-0 ancestor */
    kvx_shard *sh;
    char names[64][64], path[800];
    size_t n = su_list_files(dir, "shards", names, 64);
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/shards/%s", dir, names[i]);
        assert_int_equal(kvx_shard_open(&sh, path, 0), 0);
        kvx_entry e;
        int holds_root = kvx_shard_get_info(sh)->num_blocks == 1 && kvx_shard_entry(&e, sh, 0) == 0 && e.hash == h[0];
        kvx_shard_close(sh);
        if (holds_root) assert_int_equal(unlink(path), 0);
    }
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, 10); /* 7 headless + 3 */
    assert_int_equal(kvx_store_gc(s), 0);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, 3);
    assert_int_equal(su_served_prefix(s, 6, 3), 3);
    kvx_store_close(s);
    free(p);
}

static void test_capacity_limits(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/cap", su_root);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 100 << 10; /* below the default 512 KiB shard */
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "shard size"));
    assert_int_equal(access(dir, F_OK), -1); /* nothing made */
    o.shard_bytes = 32 << 10;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    kvx_store_close(s);
}

/* A shard cut or extended at many points: every reader and writer command
 * keeps the file byte for byte, serves only byte-exact blocks, never more
 * than the pages that are whole, and nothing is quarantined while the
 * header and tables are intact. */
static void test_truncate_extend_many_points(void **state)
{
    (void)state;
    char dir[300], shard[700], keep[400];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 1, 6);
    kvx_store_close(s);
    shard_path(dir, 0, shard, sizeof shard);
    snprintf(keep, sizeof keep, "%s/keep.kvx", su_root);
    assert_int_equal(cp(shard, keep), 0);
    struct stat st;
    assert_int_equal(stat(shard, &st), 0);
    kvx_shard *sh;
    assert_int_equal(kvx_shard_open(&sh, shard, 0), 0);
    uint64_t kvoff = kvx_shard_get_info(sh)->kv_data_offset;
    kvx_shard_close(sh);
    int points = 0;
    for (off_t cut = (off_t)kvoff; cut <= st.st_size + 8192; cut += 1536, points++) {
        assert_int_equal(cp(keep, shard), 0);
        assert_int_equal(truncate(shard, cut), 0); /* shorter, or longer (a hole) */
        uint64_t fp = shards_fingerprint(dir);
        size_t whole = 0; /* pages entirely inside the cut file */
        assert_int_equal(kvx_shard_open(&sh, shard, 0), 0);
        for (uint32_t i = 0; i < 6; i++) {
            kvx_entry e;
            assert_int_equal(kvx_shard_entry(&e, sh, i), 0);
            if (e.offset + e.bytes <= (uint64_t)cut && whole == i) whole++;
        }
        kvx_shard_close(sh);
        for (int writer = 0; writer < 2; writer++) {
            assert_int_equal(kvx_store_open(&s, dir, NULL, writer ? 0 : KVX_STORE_READONLY), 0);
            size_t served = su_served_prefix(s, 1, 6);
            assert_true(served != SIZE_MAX); /* never a wrong byte */
            assert_int_equal(served, whole);
            kvx_store_stats stt;
            assert_int_equal(kvx_store_stat(&stt, s), 0);
            assert_int_equal(stt.quarantined, 0);
            kvx_store_close(s);
            assert_true(shards_fingerprint(dir) == fp);
        }
    }
    assert_true(points > 10);
    /* cut inside the tables: the file cannot be validated; a reader leaves
     * it, a writer moves it to quarantine/ (never deletes it) */
    assert_int_equal(cp(keep, shard), 0);
    assert_int_equal(truncate(shard, 100), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(su_served_prefix(s, 1, 6), 0);
    kvx_store_close(s);
    assert_int_equal(access(shard, F_OK), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_store_stats stt;
    assert_int_equal(kvx_store_stat(&stt, s), 0);
    assert_int_equal(stt.quarantined, 1);
    kvx_store_close(s);
    char q[800];
    snprintf(q, sizeof q, "%s/quarantine/%s", dir, strrchr(shard, '/') + 1);
    assert_int_equal(stat(q, &st), 0);
    assert_int_equal(st.st_size, 100);
}

/* A registered shard replaced by a FIFO (or another non-regular file): a
 * reader misses without blocking on it, a writer drops its records and
 * leaves the FIFO alone, and the other shard keeps serving. */
static void test_shard_replaced_by_fifo(void **state)
{
    (void)state;
    char dir[300], shard[700];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 1, 3);
    su_put_flush(s, 2, 3);
    kvx_store_close(s);
    shard_path(dir, 0, shard, sizeof shard);
    assert_int_equal(unlink(shard), 0);
    assert_int_equal(mkfifo(shard, 0600), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    size_t a = su_served_prefix(s, 1, 3), b = su_served_prefix(s, 2, 3);
    assert_true((a == 0 && b == 3) || (a == 3 && b == 0));
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(su_served_prefix(s, 1, 3) + su_served_prefix(s, 2, 3), 3);
    assert_int_equal(kvx_store_gc(s), 0);
    uint64_t bad = 9;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), KVX_ECORRUPT); /* the FIFO where a shard belongs */
    kvx_store_close(s);
    struct stat st;
    assert_int_equal(lstat(shard, &st), 0);
    assert_true(S_ISFIFO(st.st_mode)); /* left alone */
}

/* A FIFO (or a directory) planted where a store file belongs: STORE, LOCK,
 * TIER and the TIER.tmp that tier set writes. Each open and tier set
 * answers at once, in a child under alarm(20) (a blocking
 * open of the FIFO hung kvx_store_open for good): KVX_EPATH naming the
 * file, except TIER, whose damage is never a failed open (no tier for that
 * handle, docs/TIER.md). The FIFOs are left alone. */
static int fifo_child(const char *dir, const char *name, int what)
{
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20);
        kvx_store *s = NULL;
        int rc;
        if (what == 0) rc = kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY);
        else if (what == 1) rc = kvx_store_open(&s, dir, NULL, 0);
        else {
            rc = kvx_store_open(&s, dir, NULL, 0);
            if (!rc) rc = kvx_store_tier_set(s, "redis://127.0.0.1:1", NULL, 0);
        }
        int ok;
        if (!strcmp(name, "TIER")) ok = rc == 0 && su_served_prefix(s, 1, 2) == 2;
        else ok = rc == KVX_EPATH && strstr(kvx_last_error(), name) && strstr(kvx_last_error(), "not a regular file");
        if (!ok) fprintf(stderr, "%s (%d): rc %d: %s\n", name, what, rc, kvx_last_error());
        kvx_store_close(s);
        _exit(ok ? 0 : 1);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st)) fprintf(stderr, "%s (%d): killed by signal %d (a hang ends in SIGALRM)\n", name, what,
                                 WTERMSIG(st));
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void test_fifo_where_store_files_belong(void **state)
{
    (void)state;
    const char *names[] = {"STORE", "LOCK", "TIER", "TIER.tmp"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char dir[300], p[500], keep[520];
        kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
        su_put_flush(s, 1, 2);
        kvx_store_close(s);
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        snprintf(keep, sizeof keep, "%s.keep", p);
        if (access(p, F_OK) == 0) assert_int_equal(rename(p, keep), 0);
        assert_int_equal(mkfifo(p, 0600), 0);
        int whats = !strcmp(names[i], "TIER.tmp") ? 1 : 2; /* TIER.tmp: only tier set writes it */
        for (int w = 0; w < whats; w++) {
            int what = !strcmp(names[i], "TIER.tmp") ? 2 : w;
            if (!strcmp(names[i], "LOCK") && what == 0) continue; /* a reader takes no lock */
            assert_true(fifo_child(dir, names[i], what));
        }
        struct stat st;
        assert_int_equal(lstat(p, &st), 0);
        assert_true(S_ISFIFO(st.st_mode)); /* left alone */
    }
}

/* An 8 KiB sparse shard whose header declares block_tokens near 2^32: every
 * reader stays bounded by the file (DESIGN.md rule 5), no gigabytes. */
static void test_sparse_giant_bounded(void **state)
{
    (void)state;
    uint8_t b[8192];
    memset(b, 0, sizeof b);
    memcpy(b, "RADX-KVX", 8);
    uint16_t v16[4] = {0x100, 1, 1, 4}; /* version, L, Hkv, D */
    memcpy(b + 8, v16, sizeof v16);
    uint32_t n = 1, B = 0xFFFFFFF0u, flags = KVX_FLAG_HASHES;
    memcpy(b + 16, &n, 4);
    memcpy(b + 20, &B, 4);
    uint64_t kvoff = 4096;
    memcpy(b + 48, &kvoff, 8);
    memcpy(b + 56, &flags, 4);
    /* entry 0: one token, page of 2*1*1*1*4*2 = 16 zero bytes at offset 0 */
    uint32_t e[6] = {0, 1, 0, 0, 16, 0};
    uint8_t zero[16] = {0};
    e[5] = kvx_crc32(0, zero, 16);
    memcpy(b + 64, e, 24);
    char path[400];
    snprintf(path, sizeof path, "%s/giant.kvx", su_root);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, sizeof b, f), sizeof b);
    fclose(f);
    kvx_shard *sh;
    assert_int_equal(kvx_shard_open(&sh, path, KVX_OPEN_VERIFY_PAGES), 0);
    void *env = NULL;
    size_t len = 0;
    assert_int_equal(kvx_shard_to_envelope(&env, &len, sh, KVX_ENVELOPE_V1), KVX_ECAPACITY);
    assert_null(env);
    assert_non_null(strstr(kvx_last_error(), "block_tokens 4294967280"));
    kvx_shard_close(sh);
    /* and the command: exit 1, promptly, no gigabytes */
    char cmd[1200];
    /* an address-space limit makes the point (no gigabytes), except under
     * AddressSanitizer, whose shadow memory needs terabytes of it */
#if defined(__SANITIZE_ADDRESS__)
    const char *limit = "";
#else
    const char *limit = "ulimit -v 2000000; ";
#endif
    snprintf(cmd, sizeof cmd, "%s%s verify %s >/dev/null && %s convert %s -o %s/giant.env --format v1 2>/dev/null",
             limit, KVX_CLI, path, KVX_CLI, path, su_root);
    int st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size_differs_kept),
        cmocka_unit_test(test_stale_index_adopts),
        cmocka_unit_test(test_reindex_quarantines),
        cmocka_unit_test(test_damaged_record_readonly),
        cmocka_unit_test(test_legacy_records_open),
        cmocka_unit_test(test_index_lost),
        cmocka_unit_test(test_directories_where_files_belong),
        cmocka_unit_test(test_generation_never_reused),
        cmocka_unit_test(test_headless_chain_gc),
        cmocka_unit_test(test_capacity_limits),
        cmocka_unit_test(test_sparse_giant_bounded),
        cmocka_unit_test(test_shard_replaced_by_fifo),
        cmocka_unit_test(test_fifo_where_store_files_belong),
        cmocka_unit_test(test_truncate_extend_many_points),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
