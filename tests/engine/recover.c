/*
 * recover.c - engine/store_apply.c (with store_plan.c), what a writer does when it opens a
 * store (DESIGN.md trust rules 2 to 4): nothing acknowledged is deleted on
 * the word of the index or of a check; shards cut, extended, replaced by a
 * FIFO or a directory; staging/ emptied and the generation floor kept
 * across kills and opens; a flush killed mid-publication publishes
 * nothing; the index lost or damaged.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/fault.h"
#include "lib/store.h"

/* PROMISE: RECOVER-17 */
static void test_recovery(void **state)
{
    (void)state;
    char dir[300], p[400];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 8 << 20, .shard_bytes = 40 << 10, .flags = KVX_STORE_NOWAIT});
    uint64_t h[16];
    for (uint64_t q = 0; q < 4; q++) {
        su_put_shared(s, q, 8, 0, h);
        assert_int_equal(kvx_store_flush(s), 0);
    }
    kvx_shard **sh;
    size_t n;
    assert_int_equal(kvx_store_shards(&sh, &n, s), 0);
    assert_true(n >= 2);
    char victim[300], damaged[300];
    snprintf(victim, sizeof victim, "%s", kvx_shard_path(sh[0]));
    snprintf(damaged, sizeof damaged, "%s", kvx_shard_path(sh[1]));
    uint32_t victim_blocks = kvx_shard_get_info(sh[0])->num_blocks;
    for (size_t i = 0; i < n; i++) kvx_shard_close(sh[i]);
    kvx_free(sh);
    kvx_store_stats st0;
    assert_int_equal(kvx_store_stat(&st0, s), 0);
    kvx_store_close(s);
    /* leftovers: a staging file, an unpublished sealed shard */
    snprintf(p, sizeof p, "%s/staging/0000000000000099.kvx", dir);
    FILE *f = fopen(p, "w");
    fputs("junk", f);
    fclose(f);
    char orphan[400];
    snprintf(orphan, sizeof orphan, "%s/shards/00000000000000ff.kvx", dir);
    f = fopen(orphan, "w");
    fputs("sealed but never published", f);
    fclose(f);
    /* a registered shard goes missing, another is damaged in its tables */
    assert_int_equal(unlink(victim), 0);
    int fd = open(damaged, O_RDWR);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, 64 + 4), 1); /* coordinate table: token_count */
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, 64 + 4), 1);
    close(fd);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_VERIFY), 0);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(access(orphan, F_OK), -1);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.dropped_shards, 2);
    assert_int_equal(st.shards, st0.shards - 2);
    assert_true(st.blocks < st0.blocks - victim_blocks + 1);
    uint64_t bad = 9;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    assert_int_equal(bad, 0);
    kvx_store_close(s);
}

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

/* test_size_differs_kept: a shard whose last 4 KiB were lost, or with one
 * byte appended, is kept byte for byte and served by every command. */
/* PROMISE: RECOVER-3 */
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
/* PROMISE: RECOVER-1, RECOVER-9 */
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

/* Records of an index rewritten in the form of the release before record
 * checksums (shard 32 bytes, coordinate 16, hash and usage crc 0,
 * next_gen 8, stats 48). */
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

/* test_legacy_records_refused: an index written before the record
 * checksums is damaged: readers and writers refuse the store naming
 * reindex (its records are never read unchecked), nothing changes in
 * shards/, and reindex_dir makes it serve again. */
/* PROMISE: RECOVER-9 */
static void test_legacy_records_refused(void **state)
{
    (void)state;
    char dir[300], idx[400];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 1, 4);
    su_put_flush(s, 2, 3);
    kvx_store_close(s);
    snprintf(idx, sizeof idx, "%s/index", dir);
    for (int form = 0; form < 2; form++) {
        MDB_env *env;
        MDB_txn *txn;
        assert_int_equal(mdb_env_create(&env), 0);
        assert_int_equal(mdb_env_set_maxdbs(env, 16), 0);
        assert_int_equal(mdb_env_open(env, idx, 0, 0600), 0);
        assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
        if (form == 0) {
            legacy_rewrite(txn, "shards", MDB_INTEGERKEY, 32, SIZE_MAX); /* 32 bytes, no crc */
        } else {
            legacy_rewrite(txn, "shards", MDB_INTEGERKEY, 0, 32); /* this size, crc 0 */
            legacy_rewrite(txn, "coord", MDB_INTEGERKEY, 16, SIZE_MAX);
            legacy_rewrite(txn, "hash", MDB_INTEGERKEY | MDB_DUPSORT | MDB_DUPFIXED, 0, 4);
            legacy_rewrite(txn, "usage", MDB_INTEGERKEY, 0, 28);
        }
        assert_int_equal(mdb_txn_commit(txn), 0);
        mdb_env_close(env);
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
        assert_int_equal(su_served_prefix(s, 2, 3), 3);
        uint64_t bad = 9;
        assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
        kvx_store_close(s);
    }
}

/* test_index_lost: index/ deleted or replaced by garbage: a reader names
 * reindex, kvx_store_reindex_dir rebuilds it, every block served. */
/* PROMISE: RECOVER-7 */
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
        snprintf(cmd, sizeof cmd, "%s/.index.aside", dir);
        assert_int_equal(access(cmd, F_OK), -1); /* removed on success */
    }
}

/* test_directories_where_files_belong: a directory in staging/ or shards/
 * blocks nothing and is left alone. */
/* PROMISE: RECOVER-16 */
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

/* A shard cut or extended at many points: every reader and writer command
 * keeps the file byte for byte, serves only byte-exact blocks, never more
 * than the pages that are whole, and nothing is quarantined while the
 * header and tables are intact. */
/* PROMISE: RECOVER-3 */
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
/* PROMISE: RECOVER-16, FORMAT-11 */
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

/* PROMISE: RECOVER-16 */
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

/* An 8 KiB shard whose header declares the largest block_tokens a shard
 * may (2^20; more is refused at open, BOUND-7): every reader stays bounded
 * by the file (DESIGN.md rule 5), no gigabytes (the envelope would be
 * 16 MiB). */
/* PROMISE: BOUND-6 */
static void test_sparse_giant_bounded(void **state)
{
    (void)state;
    uint8_t b[8192];
    memset(b, 0, sizeof b);
    memcpy(b, "RADX-KVX", 8);
    uint16_t v16[4] = {0x100, 1, 1, 4}; /* version, L, Hkv, D */
    memcpy(b + 8, v16, sizeof v16);
    uint32_t n = 1, B = 1u << 20, flags = KVX_FLAG_HASHES;
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
    assert_non_null(strstr(kvx_last_error(), "block_tokens 1048576"));
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

#define NB 6 /* blocks per sequence */

/* Smallest generation named in dir/shards ("<16 hex>.kvx"), UINT64_MAX if none
 * beyond those listed in `before` (names joined with spaces). */
static uint64_t min_new_gen(const char *dir, const char *before)
{
    static char names[1024][64];
    size_t n = su_list_names(dir, "shards", names, 1024);
    uint64_t m = UINT64_MAX;
    for (size_t i = 0; i < n; i++) {
        char key[70];
        snprintf(key, sizeof key, "%s ", names[i]);
        if (strstr(before, key)) continue;
        char *end = NULL;
        uint64_t g = strtoull(names[i], &end, 16);
        if (end && !strcmp(end, ".kvx") && g < m) m = g;
    }
    return m;
}

static int read_file(const char *path, char *buf, size_t cap, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    *len = fread(buf, 1, cap, f);
    fclose(f);
    return 0;
}

/* kill -9 with sealed files in staging/: after reopen, nothing of the
 * killed batch is served, staging/ is empty, and a new batch is served
 * beside what was acknowledged; its files take names no file has (a name
 * is an identifier only: it may be one a removed staged file had). */
/* PROMISE: RECOVER-5 */
static void test_gen_floor_after_kill(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT});
    assert_int_equal(su_put_batch(s, NULL, 400, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kvx_store *c = NULL;
        kvx_store_batch *b = NULL;
        if (kvx_store_open(&c, dir, NULL, KVX_STORE_NOWAIT)) _exit(3);
        if (kvx_store_batch_create(&b, c)) _exit(4);
        for (uint64_t q = 401; q < 406; q++)
            if (su_put_batch(c, b, q, NULL)) _exit(5);
        raise(SIGKILL);
        _exit(7);
    }
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFSIGNALED(ws));
    uint64_t gens[64], maxg = 0;
    assert_true(su_staged_gens(dir, gens, 64, &maxg) >= 5);
    static char before[16384];
    su_names_of(dir, "shards", before, sizeof before);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(su_n_files(dir, "staging"), 0);
    for (uint64_t q = 401; q < 406; q++) assert_int_equal(su_prefix_nb(s, q), 0);
    assert_int_equal(su_put_batch(s, NULL, 410, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_true(min_new_gen(dir, before) != UINT64_MAX);
    (void)maxg;
    assert_int_equal(su_prefix_nb(s, 400), NB);
    assert_int_equal(su_prefix_nb(s, 410), NB);
    kvx_store_close(s);
}

/* Two opens after a kill -9 with a batch's sealed files in staging/: the
 * first recovery empties staging/ and changes nothing else; after the
 * second, a new batch is served and nothing of the killed one. */
/* PROMISE: RECOVER-5 */
static void test_gen_floor_second_open(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT});
    assert_int_equal(su_put_batch(s, NULL, 400, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    int ws = 0;
    uint64_t gens[64], maxg = 0, g;
    static char before[16384];
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kvx_store *c = NULL;
        kvx_store_batch *b = NULL;
        if (kvx_store_open(&c, dir, NULL, KVX_STORE_NOWAIT)) _exit(3);
        if (kvx_store_batch_create(&b, c)) _exit(4);
        for (uint64_t q = 420; q < 425; q++)
            if (su_put_batch(c, b, q, NULL)) _exit(5);
        raise(SIGKILL);
        _exit(7);
    }
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFSIGNALED(ws));
    assert_true(su_staged_gens(dir, gens, 64, &maxg) >= 5);
    su_names_of(dir, "shards", before, sizeof before);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(su_put_batch(s, NULL, 430, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    g = min_new_gen(dir, before);
    assert_true(g != UINT64_MAX);
    for (uint64_t q = 420; q < 425; q++) assert_int_equal(su_prefix_nb(s, q), 0);
    assert_int_equal(su_prefix_nb(s, 430), NB);
    kvx_store_close(s);
}

/* Odd entries in staging/: a FIFO and a directory (left alone, never
 * read: open does not hang), a symlink to a file outside the store (the
 * link goes, the target keeps its bytes). Puts that seal, a flush, all
 * served (names are identifiers only: a FIFO's or directory's name in
 * staging/ means nothing to a new shard's).
 * staging/ itself a symlink: open refuses (KVX_EPATH), nothing is written
 * where it points. */
/* PROMISE: RECOVER-16 */
static void test_staging_oddities(void **state)
{
    (void)state;
    char dir[300], p[700], outside[400];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT});
    assert_int_equal(su_put_batch(s, NULL, 500, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    snprintf(p, sizeof p, "%s/staging/.0000000000000100.kvx.tmp.1.fifo", dir);
    assert_int_equal(mkfifo(p, 0600), 0);
    snprintf(p, sizeof p, "%s/staging/.0000000000000200.kvx.tmp.1.dir", dir);
    assert_int_equal(mkdir(p, 0700), 0);
    snprintf(outside, sizeof outside, "%s/a8_outside_%d", su_root, su_dir_counter++);
    FILE *f = fopen(outside, "wb");
    assert_non_null(f);
    fputs("outside", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/staging/.0000000000000300.kvx.tmp.1.lnk", dir);
    assert_int_equal(symlink(outside, p), 0);
    static char before[16384];
    su_names_of(dir, "shards", before, sizeof before);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    char got[64];
    size_t len = 0;
    assert_int_equal(read_file(outside, got, sizeof got, &len), 0);
    assert_int_equal(len, 7);
    assert_memory_equal(got, "outside", 7);
    assert_int_equal(su_n_files(dir, "staging"), 2); /* the FIFO and the directory */
    kvx_store_batch *a;
    assert_int_equal(kvx_store_batch_create(&a, s), 0);
    for (uint64_t q = 501; q < 504; q++) assert_int_equal(su_put_batch(s, a, q, NULL), 0);
    assert_int_equal(kvx_store_batch_flush(a), 0);
    kvx_store_batch_destroy(a);
    for (uint64_t q = 500; q < 504; q++) assert_int_equal(su_prefix_nb(s, q), NB);
    assert_true(min_new_gen(dir, before) != UINT64_MAX);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    for (uint64_t q = 500; q < 504; q++) assert_int_equal(su_prefix_nb(s, q), NB);
    assert_int_equal(su_n_files(dir, "staging"), 2);
    kvx_store_close(s);
    /* staging/ a symlink to a directory outside */
    char real[700], other[400];
    snprintf(real, sizeof real, "%s/staging", dir);
    snprintf(other, sizeof other, "%s/a8_elsewhere_%d", su_root, su_dir_counter++);
    assert_int_equal(mkdir(other, 0700), 0);
    char moved[720];
    snprintf(moved, sizeof moved, "%s/staging.real", dir);
    assert_int_equal(rename(real, moved), 0);
    assert_int_equal(symlink(other, real), 0);
    s = NULL;
    int rc = kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT);
    if (rc == 0) {
        /* if it opens at all, a put and flush must not write through it */
        (void)su_put_batch(s, NULL, 505, NULL);
        (void)kvx_store_flush(s);
        kvx_store_close(s);
        s = NULL;
    }
    assert_int_equal(su_n_files(other, "."), 0);
    assert_int_equal(rc, KVX_EPATH);
    assert_int_equal(unlink(real), 0);
    assert_int_equal(rename(moved, real), 0);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    for (uint64_t q = 500; q < 504; q++) assert_int_equal(su_prefix_nb(s, q), NB);
    kvx_store_close(s);
}

static kvx_os_ops a8_real;

static long a8_calls, a8_kill_at;

static int a8_kill_unlink;

static int a8_rename(const char *from, const char *to)
{
    if (!a8_kill_unlink && ++a8_calls == a8_kill_at) raise(SIGKILL);
    return a8_real.rename_noreplace(from, to);
}

/* the commit's mark: the second unlinkat of a flush (the first removes a
 * stale one before the mark is made) */
static int a8_unlinkat(int fd, const char *a, int flags)
{
    if (a8_kill_unlink && strstr(a, ".pending")) {
        if (++a8_calls == 2 && a8_kill_unlink == 1) raise(SIGKILL);
    }
    return a8_real.unlinkat(fd, a, flags);
}

/* mode 2: the first fsync after the mark went (the files say the batch
 * committed; the catalog edit has not run) */
static int a8_fsync(int fd)
{
    if (a8_kill_unlink == 2 && a8_calls >= 2) raise(SIGKILL);
    return a8_real.fsync(fd);
}

/* Runs a child that puts 4 sequences into one batch (several sealed
 * files) and flushes it, killed just before its kill_at-th move into
 * shards/ (after_commit 1: before its commit's mark goes; 2: at the fsync
 * after the mark went, before the catalog edit). Returns the number of the 4 sequences' blocks served
 * after reopen, and how many files the batch had staged. */
static size_t kill_at_publish(const char *dir, long kill_at, int after_commit, uint64_t first, size_t *nstaged)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        kvx_store *c = NULL;
        kvx_store_batch *b = NULL;
        if (kvx_store_open(&c, dir, NULL, KVX_STORE_NOWAIT)) _exit(3);
        if (kvx_store_batch_create(&b, c)) _exit(4);
        for (uint64_t q = first; q < first + 4; q++)
            if (su_put_batch(c, b, q, NULL)) _exit(5);
        size_t n = su_n_files(dir, "staging");
        if (write(fds[1], &n, sizeof n) != (ssize_t)sizeof n) _exit(6);
        kvx_os_reset();
        a8_real = kvx_os;
        kvx_os.rename_noreplace = a8_rename;
        kvx_os.unlinkat = a8_unlinkat;
        kvx_os.fsync = a8_fsync;
        a8_calls = 0;
        a8_kill_at = kill_at;
        a8_kill_unlink = after_commit;
        kvx_store_batch_flush(b);
        _exit(7);
    }
    close(fds[1]);
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    if (!WIFSIGNALED(ws)) fail_msg("child exited with %d before the kill", WEXITSTATUS(ws));
    *nstaged = 0;
    assert_int_equal(read(fds[0], nstaged, sizeof *nstaged), (ssize_t)sizeof *nstaged);
    close(fds[0]);
    /* a reader first (rule 3): it serves what the writer will, and
     * removes nothing, not even a cut flush's file in shards/ */
    static char shards_before[16384], shards_after[16384];
    size_t staged_before = su_n_files(dir, "staging");
    su_names_of(dir, "shards", shards_before, sizeof shards_before);
    kvx_store *r = NULL;
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
    size_t rtot = 0;
    for (uint64_t q = first; q < first + 4; q++) {
        size_t n = su_prefix_nb(r, q);
        assert_true(n != SIZE_MAX);
        rtot += n;
    }
    kvx_store_close(r);
    su_names_of(dir, "shards", shards_after, sizeof shards_after);
    assert_string_equal(shards_after, shards_before);
    assert_int_equal(su_n_files(dir, "staging"), staged_before);
    kvx_store *s = su_reopen(dir, KVX_STORE_NOWAIT);
    size_t tot = 0;
    for (uint64_t q = first; q < first + 4; q++) {
        size_t n = su_prefix_nb(s, q);
        assert_true(n != SIZE_MAX); /* never wrong KV */
        tot += n;
    }
    /* killed before the catalog edit of a batch the files committed, a
     * reader (which never rebuilds the index) misses what the writer's
     * recovery then serves; otherwise both answer alike */
    if (after_commit == 2) assert_true(rtot == 0 || rtot == tot);
    else assert_int_equal(rtot, tot);
    su_verify_clean(s);
    kvx_store_close(s);
    return tot;
}

/* Killed before the first publication rename: nothing of the batch is
 * served (it never reached shards/). Holds. */
/* PROMISE: DUR-4 */
static void test_kill_before_publish(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT});
    kvx_store_close(s);
    size_t nst = 0;
    assert_int_equal(kill_at_publish(dir, 1, 0, 800, &nst), 0);
    assert_true(nst >= 4);
    assert_int_equal(su_n_files(dir, "shards"), 0);
}

/* A flush publishes a batch whole or not at all. It once renamed the
 * batch's sealed files into shards/ one by one before its edit, so a
 * process killed between two renames left the first file in shards/,
 * unnamed by the catalog, and recovery adopted it: a batch partly
 * published. Now the commit's mark (staging/.<seq>.pending) is made
 * durable before the first file moves and removed, durably, after the
 * last: recovery sets aside every file of a commit whose mark is still
 * there (its entries all carry the mark's sequence number). Killed
 * before every move of the batch (the 2nd, 3rd, ... and after the last),
 * and before the mark goes: none of the batch is served after the
 * restart. Killed after the mark went, before the catalog edit: all of
 * it (the files say it committed; the catalog is rebuilt from them). */
/* PROMISE: DUR-4 */
static void test_kill_mid_publish_partial(void **state)
{
    (void)state;
    size_t nst = 0;
    for (long at = 2; at <= 7; at++) {
        char dir[300];
        su_new_dir(dir, sizeof dir);
        kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT});
        kvx_store_close(s);
        int mode = at == 7; /* 7: the mark's removal */
        size_t tot = kill_at_publish(dir, at, mode, 900 + 10 * (uint64_t)at, &nst);
        assert_true(nst >= 4);
        if (tot != 0)
            fail_msg("killed before %s %ld of a batch of %zu staged files: %zu of its %d blocks served after "
                     "reopen (never acknowledged: expected none)",
                     mode ? "the mark's removal, after move" : "move", at, nst, tot, 4 * NB);
        assert_int_equal(su_n_files(dir, "staging"), 0);
    }
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT});
    kvx_store_close(s);
    size_t tot = kill_at_publish(dir, 1, 2, 1990, &nst);
    if (tot != 4 * NB)
        fail_msg("killed after the commit's mark went, before the catalog edit: %zu of the batch's %d blocks served "
                 "(committed by the files: expected all)",
                 tot, 4 * NB);
    assert_int_equal(su_n_files(dir, "staging"), 0);
}

static int in_dir(const char *dir, const char *sub, const char *name, mode_t *mode)
{
    char p[700];
    struct stat st;
    snprintf(p, sizeof p, "%.300s/%.20s/%.300s", dir, sub, name);
    if (lstat(p, &st) != 0) return 0;
    if (mode) *mode = st.st_mode;
    return 1;
}

/* test_fifo_victim_left_alone (L3): a FIFO planted at a live shard's name
 * while the writer runs is dropped from the index and left where it is, never
 * moved into quarantine/. */
/* PROMISE: RECOVER-16, STORE-10 */
static void test_fifo_victim_left_alone(void **state)
{
    (void)state;
    char dir[300], p[700];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.flags = KVX_STORE_NOWAIT});
    assert_int_equal(su_put_seq(s, 1, 4), 0);
    kvx_store_close(s);
    char names[8][64];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    s = su_reopen(dir, KVX_STORE_NOWAIT); /* the shard is not opened yet (first use) */
    snprintf(p, sizeof p, "%s/shards/%s", dir, names[0]);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_equal(su_served_prefix(s, 1, 4), 0); /* a miss */
    assert_int_equal(su_put_seq(s, 2, 4), 0);       /* the flush drops the bad shard */
    assert_int_equal(su_served_prefix(s, 2, 4), 4);
    kvx_store_close(s);
    mode_t m = 0;
    assert_true(in_dir(dir, "shards", names[0], &m));
    if (!S_ISFIFO(m)) fail_msg("the FIFO planted at shards/%s was moved", names[0]);
    assert_false(in_dir(dir, "quarantine", names[0], NULL));
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(su_served_prefix(s, 2, 4), 4);
    kvx_store_close(s);
    assert_true(in_dir(dir, "shards", names[0], &m) && S_ISFIFO(m));
}

int main(int argc, char **argv)
{
    /* these tests read the files one flush writes as its own shard
     * file (the path keyed stores, whole batches and a second batch
     * still take): the active shard has its own, tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recovery),
        cmocka_unit_test(test_size_differs_kept),
        cmocka_unit_test(test_legacy_records_refused),
        cmocka_unit_test(test_damaged_record_readonly),
        cmocka_unit_test(test_index_lost),
        cmocka_unit_test(test_directories_where_files_belong),
        cmocka_unit_test(test_sparse_giant_bounded),
        cmocka_unit_test(test_shard_replaced_by_fifo),
        cmocka_unit_test(test_fifo_where_store_files_belong),
        cmocka_unit_test(test_truncate_extend_many_points),
        cmocka_unit_test(test_gen_floor_after_kill),
        cmocka_unit_test(test_staging_oddities),
        cmocka_unit_test(test_kill_before_publish),
        cmocka_unit_test(test_gen_floor_second_open),
        cmocka_unit_test(test_kill_mid_publish_partial),
        cmocka_unit_test(test_fifo_victim_left_alone),
    };
    return cmocka_run_group_tests_name("engine/recover", tests, su_setup, su_teardown);
}
