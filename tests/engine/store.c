/*
 * store.c - the store's basic life (engine/store_*.c through kvx.h):
 * layout and permissions, geometry and model checks, names kept inside
 * the directory, put/flush visibility and dedupe, a BF16 store, envelope
 * puts, map growth, reader threads, arguments refused, odd geometries and
 * inputs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/store.h"
#include "index/index.h"
#include "lib/store.h"

/* PROMISE: STORE-1 */
static void test_layout_and_permissions(void **state)
{
    (void)state;
    char dir[300], p[400];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .flags = KVX_STORE_NOWAIT});
    uint64_t h[8];
    su_put_shared(s, 1, 3, 0, h);
    assert_int_equal(kvx_store_flush(s), 0);
    struct stat st;
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    const char *subs[] = {"index", "shards", "staging"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, subs[i]);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0700);
    }
    const char *files[] = {"STORE", "LOCK", "index/data.mdb", "index/lock.mdb"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
    }
    kvx_shard **sh;
    size_t n;
    assert_int_equal(kvx_store_shards(&sh, &n, s), 0);
    assert_int_equal(n, 1);
    assert_int_equal(stat(kvx_shard_path(sh[0]), &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_true(strstr(kvx_shard_path(sh[0]), "/shards/") != NULL);
    kvx_shard_close(sh[0]);
    kvx_free(sh);
    kvx_store_close(s);
    /* creating over an existing directory is refused */
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    assert_int_equal(kvx_store_create(&s, dir, &o), -EEXIST);
    assert_null(s);
}

/* PROMISE: STORE-2 */
static void test_geometry_checks(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .flags = KVX_STORE_NOWAIT});
    kvx_store_close(s);
    kvx_geometry g = su_geometry();
    assert_int_equal(kvx_store_open(&s, dir, &g, 0), 0);
    kvx_geometry got;
    assert_int_equal(kvx_store_get_geometry(&got, s), 0);
    /* field by field: the struct's 4 padding bytes before model_signature
     * are whatever the stack held (a memcmp failed under parallel runs) */
    assert_int_equal(got.num_layers, g.num_layers);
    assert_int_equal(got.kv_heads, g.kv_heads);
    assert_int_equal(got.head_dim, g.head_dim);
    assert_int_equal(got.block_tokens, g.block_tokens);
    assert_int_equal(got.quant, g.quant);
    assert_int_equal(got.model_signature, g.model_signature);
    kvx_store_close(s);
    g.head_dim = 8;
    assert_int_equal(kvx_store_open(&s, dir, &g, 0), KVX_ESHAPE);
    assert_non_null(strstr(kvx_last_error(), "head_dim"));
    g = su_geometry();
    g.quant = KVX_QUANT_E4M3;
    assert_int_equal(kvx_store_open(&s, dir, &g, 0), KVX_ESHAPE);
    assert_non_null(strstr(kvx_last_error(), "quant"));
    g = su_geometry();
    g.model_signature = 42;
    assert_int_equal(kvx_store_open(&s, dir, &g, 0), KVX_EMODEL);
    /* not a store */
    assert_int_equal(kvx_store_open(&s, su_root, NULL, 0), KVX_ENOTFOUND);
    /* bad creation options */
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    char d2[300];
    su_new_dir(d2, sizeof d2);
    o.geometry = su_geometry();
    o.geometry.block_tokens = 0;
    assert_int_equal(kvx_store_create(&s, d2, &o), KVX_EINVALID);
    o.geometry = su_geometry();
    o.geometry.quant = 9;
    assert_int_equal(kvx_store_create(&s, d2, &o), KVX_EQUANT);
    o.geometry = su_geometry();
    o.capacity_bytes = 100;
    assert_int_equal(kvx_store_create(&s, d2, &o), KVX_EINVALID);
    o.capacity_bytes = 0;
    o.version = 77;
    assert_int_equal(kvx_store_create(&s, d2, &o), KVX_EVERSION);
    assert_int_equal(access(d2, F_OK), -1);
}

/* A BF16 store (quant_format 3): pages are stored and served byte for byte
 * (no scale table), the quant is part of the geometry a reopen checks, and
 * a v1 envelope put into it is rounded to bf16 (round to nearest even). */
static void test_bf16_store(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.geometry.quant = KVX_QUANT_BF16;
    o.capacity_bytes = 1 << 20;
    o.flags = KVX_STORE_NOWAIT;
    kvx_store *s;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    uint64_t h[8];
    assert_int_equal(su_put_shared(s, 1, 3, 0, h), 3);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(su_prefix_shared(s, 1, 3, 0, 1), 3); /* the same 64 bytes back */
    kvx_store_close(s);

    kvx_geometry g = o.geometry, got;
    assert_int_equal(kvx_store_open(&s, dir, &g, 0), 0);
    assert_int_equal(kvx_store_get_geometry(&got, s), 0);
    assert_int_equal(got.quant, KVX_QUANT_BF16);
    assert_int_equal(su_prefix_shared(s, 1, 3, 0, 1), 3);

    /* exported as v3 the pages come back bit for bit (L = Hkv = 1, N = B:
     * one layout); as v1 the random bf16 bits do not fit f16: KVX_ELOSSY */
    {
        uint32_t tk[3 * SU_B];
        su_tokens(tk, 1, 3, 0);
        kvx_view pv[3];
        size_t n = 0;
        assert_int_equal(kvx_store_prefix(pv, &n, s, tk, 3 * SU_B, 3), 0);
        assert_int_equal(n, 3);
        void *buf = NULL;
        size_t blen = 0;
        assert_int_equal(kvx_views_export(&buf, &blen, s, pv, n, KVX_ENVELOPE_V3), 0);
        kvx_envelope e3;
        assert_int_equal(kvx_envelope_parse(&e3, buf, blen, &o.geometry), 0);
        assert_int_equal(e3.version, KVX_ENVELOPE_V3);
        for (uint32_t i = 0; i < 3; i++) {
            kvx_envelope_block eb;
            assert_int_equal(kvx_envelope_block_at(&eb, &e3, i), 0);
            assert_memory_equal(eb.payload, pv[i].page, 64);
        }
        kvx_free(buf);
        buf = NULL;
        assert_int_equal(kvx_views_export(&buf, &blen, s, pv, n, KVX_ENVELOPE_V1), KVX_ELOSSY);
        assert_null(buf);
        assert_non_null(strstr(kvx_last_error(), "not exactly representable in f16"));
        kvx_views_release(pv, n);
    }

    /* a v1 block: f16 1.0, 1+2^-10 (rounds to 1.0 in bf16), -2.5, 65504 */
    uint32_t t[SU_B];
    su_tokens(t, 9, 1, 0);
    uint64_t hash = kvx_block_hash(0, t, SU_B);
    uint16_t f16[2 * SU_B * 4] = {0};
    const uint16_t in[4] = {0x3C00, 0x3C01, 0xC100, 0x7BFF};
    const uint16_t want[4] = {0x3F80, 0x3F80, 0xC020, 0x4780}; /* 65504 = 0x477FE000 -> 0x4780 */
    memcpy(f16, in, sizeof in);
    kvx_envelope_block_in bi = {hash, SU_B, f16, NULL};
    size_t len;
    assert_int_equal(kvx_envelope_size(&len, KVX_ENVELOPE_V1, &g, 1), 0);
    uint8_t *env = malloc(len);
    assert_int_equal(kvx_envelope_export(env, len, KVX_ENVELOPE_V1, &g, &bi, 1), 0);
    size_t added = 0;
    assert_int_equal(kvx_store_put_envelope(s, env, len, t, SU_B, &added), 0);
    assert_int_equal(added, 1);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_view v;
    assert_int_equal(kvx_store_get_block(&v, s, t, SU_B), 0);
    uint16_t page[2 * SU_B * 4];
    assert_int_equal(v.page_bytes, sizeof page);
    memcpy(page, v.page, sizeof page);
    kvx_views_release(&v, 1);
    assert_memory_equal(page, want, sizeof want);
    free(env);
    kvx_store_close(s);

    g.quant = KVX_QUANT_FP16;
    assert_int_equal(kvx_store_open(&s, dir, &g, 0), KVX_ESHAPE);
    assert_non_null(strstr(kvx_last_error(), "bf16"));
}

/* PROMISE: STORE-1 */
static void test_no_escape(void **state)
{
    (void)state;
    char dir[300], p[400], q[400];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .flags = KVX_STORE_NOWAIT});
    kvx_store_close(s);
    /* shards/ replaced by a symlink to a directory outside */
    snprintf(p, sizeof p, "%s/shards", dir);
    snprintf(q, sizeof q, "%s/elsewhere", su_root);
    assert_int_equal(rename(p, q), 0);
    assert_int_equal(symlink(q, p), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), KVX_EPATH);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), KVX_EPATH);
    unlink(p);
    assert_int_equal(rename(q, p), 0);
    /* STORE as a symlink */
    snprintf(p, sizeof p, "%s/STORE", dir);
    snprintf(q, sizeof q, "%s/STORE.real", dir);
    assert_int_equal(rename(p, q), 0);
    assert_int_equal(symlink("STORE.real", p), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), KVX_EPATH);
    unlink(p);
    assert_int_equal(rename(q, p), 0);
    /* LOCK as a symlink */
    snprintf(p, sizeof p, "%s/LOCK", dir);
    unlink(p);
    assert_int_equal(symlink("/tmp/kvx-lock-escape", p), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), KVX_EPATH);
    unlink(p);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_store_close(s);
}

/* Regular files in dir/sub (hidden ones too). */
static int files_in(const char *dir, const char *sub)
{
    char p[400];
    snprintf(p, sizeof p, "%s/%s", dir, sub);
    DIR *d = opendir(p);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* PROMISE: DUR-1 */
static void test_put_flush_visibility(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .flags = KVX_STORE_NOWAIT});
    uint64_t h[8];
    assert_int_equal(su_put_shared(s, 7, 5, 0, h), 5);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.pending_blocks, 5);
    assert_int_equal(st.blocks, 0);
    kvx_view v;
    assert_int_equal(kvx_store_get_hash(&v, s, h[0]), KVX_ENOTFOUND); /* nothing visible before flush */
    /* the pending shard is a temporary file in staging/, not in shards/ */
    assert_int_equal(files_in(dir, "staging"), 1);
    assert_int_equal(files_in(dir, "shards"), 0);
    assert_int_equal(su_prefix_shared(s, 7, 5, 0, 1), 0);
    /* a reader handle in the same process sees nothing either */
    kvx_store *r;
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(su_prefix_shared(r, 7, 5, 0, 1), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(files_in(dir, "staging"), 0); /* sealed and renamed into shards/ */
    assert_int_equal(files_in(dir, "shards"), 1);
    assert_int_equal(su_prefix_shared(s, 7, 5, 0, 1), 5);
    assert_int_equal(su_prefix_shared(r, 7, 5, 0, 1), 5); /* published after r opened */
    /* dedupe: the same blocks are not written again */
    assert_int_equal(su_put_shared(s, 7, 5, 0, h), 0);
    /* a longer sequence with the same prefix writes only its new blocks */
    assert_int_equal(su_put_shared(s, 7, 8, 0, h), 3);
    assert_int_equal(su_put_shared(s, 7, 8, 0, h), 0); /* already pending */
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, 8);
    assert_int_equal(st.pending_blocks, 0);
    assert_int_equal(su_prefix_shared(r, 7, 8, 0, 1), 8);
    /* by hash, batch and coordinate */
    assert_int_equal(kvx_store_get_hash(&v, s, h[6]), 0);
    su_check_view(&v, h[6]);
    kvx_view v2;
    assert_int_equal(kvx_store_get(&v2, s, v.coordinate), 0);
    su_check_view(&v2, h[6]);
    assert_int_equal(KVX_COORD_SPECTRAL(v2.coordinate), 0);
    kvx_view_release(&v2);
    kvx_view_release(&v);
    assert_null(v.shard);
    assert_int_equal(kvx_store_get(&v, s, 0xFFFFFF00u), KVX_ENOTFOUND);
    uint64_t q[3] = {h[1], 12345, h[7]};
    kvx_view vs[3];
    int stt[3];
    assert_int_equal(kvx_store_get_hashes(vs, stt, s, q, 3), 0);
    assert_int_equal(stt[0], 0);
    assert_int_equal(stt[1], KVX_ENOTFOUND);
    assert_int_equal(stt[2], 0);
    su_check_view(&vs[0], h[1]);
    su_check_view(&vs[2], h[7]);
    kvx_views_release(vs, 3);
    /* a prompt diverging after 3 blocks hits 3 */
    uint32_t t[9 * SU_B];
    su_tokens(t, 7, 8, 0);
    t[3 * SU_B + 1] ^= 1;
    kvx_view pv[9];
    size_t n;
    assert_int_equal(kvx_store_prefix(pv, &n, s, t, 8 * SU_B, 9), 0);
    assert_int_equal(n, 3);
    kvx_views_release(pv, n);
    assert_int_equal(kvx_store_prefix(pv, &n, s, t, 8 * SU_B, 2), 0); /* max_views */
    assert_int_equal(n, 2);
    kvx_views_release(pv, n);
    /* hits and misses are counted */
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.hits >= 8 && st.misses >= 5);
    /* readers cannot write */
    assert_int_equal(kvx_store_flush(r), KVX_EINVALID);
    kvx_store_close(r);
    /* unflushed puts are dropped at close */
    su_put_shared(s, 99, 2, 0, h);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(su_prefix_shared(s, 99, 2, 0, 0), 0);
    assert_int_equal(su_prefix_shared(s, 7, 8, 0, 1), 8); /* restart keeps the rest */
    kvx_store_close(s);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .flags = KVX_STORE_NOWAIT});
    uint32_t t[8] = {0};
    uint8_t p[128] = {0};
    assert_int_equal(kvx_store_put(s, t, 7, p, 2, NULL, NULL), KVX_ETOKENS);
    assert_int_equal(kvx_store_put(s, NULL, 8, p, 2, NULL, NULL), KVX_EINVALID);
    assert_int_equal(kvx_store_put(NULL, t, 8, p, 2, NULL, NULL), KVX_EINVALID);
    size_t n;
    assert_int_equal(kvx_store_prefix(NULL, &n, s, t, 8, 1), KVX_EINVALID);
    kvx_store *o = NULL;
    assert_int_equal(kvx_store_open(&o, "", NULL, 0), KVX_EINVALID);
    assert_int_equal(kvx_store_open(NULL, "x", NULL, 0), KVX_EINVALID);
    kvx_store_close(s);
    kvx_store_close(NULL);
    kvx_view_release(NULL);
}

/* PROMISE: TRUST-4 */
static void test_envelope_put(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .flags = KVX_STORE_NOWAIT});
    kvx_geometry g = su_geometry();
    uint32_t t[3 * SU_B + 2];
    su_tokens(t, 5, 3, 0);
    t[3 * SU_B] = 1;
    t[3 * SU_B + 1] = 2;
    uint64_t h[3];
    kvx_block_hashes(h, t, 3 * SU_B, SU_B);
    size_t P = kvx_envelope_payload_bytes(1, &g);
    uint8_t *pay = calloc(4, P);
    kvx_envelope_block_in in[4];
    for (int i = 0; i < 4; i++) {
        for (size_t j = 0; j < P / 2; j++) ((uint16_t *)(pay + i * P))[j] = kvx_f32_to_f16((float)(i * 100 + (int)j % 50));
        in[i].hash = i < 3 ? h[i] : 0;
        in[i].n_tokens = i < 3 ? SU_B : 2;
        in[i].payload = pay + i * P;
        in[i].scales = NULL;
    }
    size_t len;
    assert_int_equal(kvx_envelope_size(&len, 1, &g, 4), 0);
    uint8_t *env = malloc(len);
    assert_int_equal(kvx_envelope_export(env, len, 1, &g, in, 4), 0);
    size_t added;
    /* tokens whose hashes differ from the envelope's are refused */
    uint32_t bad[3 * SU_B];
    memcpy(bad, t, sizeof bad);
    bad[0] ^= 1;
    assert_int_equal(kvx_store_put_envelope(s, env, len, bad, 3 * SU_B, &added), KVX_EHASH);
    assert_int_equal(kvx_store_put_envelope(s, env, len, t, 3 * SU_B + 2, &added), 0);
    assert_int_equal(added, 3);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_view v[4];
    size_t n;
    assert_int_equal(kvx_store_prefix(v, &n, s, t, 3 * SU_B + 2, 4), 0);
    assert_int_equal(n, 3);
    kvx_envelope e;
    assert_int_equal(kvx_envelope_parse(&e, env, len, NULL), 0);
    for (uint32_t i = 0; i < 3; i++) {
        kvx_envelope_block blk;
        assert_int_equal(kvx_envelope_block_at(&blk, &e, i), 0);
        uint8_t page[64];
        assert_int_equal(kvx_envelope_payload_to_page(page, NULL, &g, &e, &blk), 0);
        assert_memory_equal(v[i].page, page, 64);
    }
    kvx_views_release(v, n);
    /* without tokens: put by hash only, unverified: never served by hash
     * alone (KVX_EUNVERIFIED) nor by prefix, reachable by coordinate */
    for (int i = 0; i < 3; i++) in[i].hash = h[i] ^ 0xABCDEF;
    assert_int_equal(kvx_envelope_export(env, len, 1, &g, in, 4), 0);
    assert_int_equal(kvx_store_put_envelope(s, env, len, NULL, 0, &added), 0);
    assert_int_equal(added, 3);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_view one;
    assert_int_equal(kvx_store_get_hash(&one, s, h[2] ^ 0xABCDEF), KVX_EUNVERIFIED);
    assert_non_null(strstr(kvx_last_error(), "unverified"));
    assert_int_equal(kvx_store_put_envelope(s, env, 10, NULL, 0, &added), KVX_EFORMAT);
    free(env);
    free(pay);
    kvx_store_close(s);
}

/* PROMISE: STORE-17 */
static void test_map_growth(void **state)
{
    (void)state;
    char dir[300];
    setenv("KVX_INDEX_MAP_BYTES", "131072", 1);
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 512 << 20, .shard_bytes = 4 << 20, .flags = KVX_STORE_NOWAIT});
    unsetenv("KVX_INDEX_MAP_BYTES");
    uint64_t h[64];
    for (uint64_t q = 0; q < 60; q++) su_put_shared(s, q, 64, 0, h);
    int rc = kvx_store_flush(s);
    if (rc) fprintf(stderr, "%s\n", kvx_last_error());
    assert_int_equal(rc, 0);
    MDB_envinfo info;
    mdb_env_info(kvx_cat_index(s->cat)->env, &info);
    assert_true(info.me_mapsize > 131072);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, 60 * 64);
    assert_int_equal(su_prefix_shared(s, 59, 64, 0, 1), 64);
    kvx_store_close(s);
}

typedef struct reader_arg {
    kvx_store *s;
    int stop;
    int bad;
    long lookups;
} reader_arg;

static void *reader_thread(void *p)
{
    reader_arg *a = p;
    while (!__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE)) {
        for (uint64_t q = 0; q < 20; q++) {
            uint32_t t[8 * SU_B];
            uint64_t h[8];
            su_tokens(t, q, 8, 2);
            kvx_block_hashes(h, t, 8 * SU_B, SU_B);
            kvx_view v[8];
            size_t n;
            if (kvx_store_prefix(v, &n, a->s, t, 8 * SU_B, 8) != 0) a->bad++;
            for (size_t i = 0; i < n; i++) {
                uint8_t want[64];
                su_page(want, 64, h[i]);
                if (v[i].hash != h[i] || memcmp(v[i].page, want, 64)) a->bad++;
            }
            kvx_views_release(v, n);
            a->lookups++;
        }
    }
    return NULL;
}

/* PROMISE: STORE-16 */
static void test_reader_threads(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 300 << 10, .shard_bytes = 40 << 10, .flags = KVX_STORE_NOWAIT});
    kvx_store *r;
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
    reader_arg a[3] = {{s, 0, 0, 0}, {r, 0, 0, 0}, {r, 0, 0, 0}};
    pthread_t th[3];
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, reader_thread, &a[i]);
    uint64_t h[8];
    for (int round = 0; round < 6; round++)
        for (uint64_t q = 0; q < 20; q++) {
            su_put_shared(s, q + (uint64_t)round * 4, 8, 2, h);
            assert_int_equal(kvx_store_flush(s), 0);
        }
    for (int i = 0; i < 3; i++) {
        __atomic_store_n(&a[i].stop, 1, __ATOMIC_RELEASE);
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].bad, 0);
        assert_true(a[i].lookups > 0);
    }
    kvx_store_close(r);
    kvx_store_close(s);
}

/* test_odd_geometries_and_inputs (rule 1): B = 1, max_views 0, a partial
 * tail, an empty prompt, a put_envelope whose tokens disagree with its
 * hashes. */
static void test_odd_geometries_and_inputs(void **state)
{
    (void)state;
    /* B = 1: every token a block */
    kvx_geometry g1 = {1, 1, 4, 1, KVX_QUANT_FP16, 7};
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .geometry = &g1});
    size_t pb = kvx_page_bytes(&g1, 1);
    uint32_t t[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    uint8_t *pages = calloc(8, pb);
    for (size_t i = 0; i < 8 * pb; i++) pages[i] = (uint8_t)(i % 50);
    size_t added = 0;
    assert_int_equal(kvx_store_put(s, t, 8, pages, 8, NULL, &added), 0);
    assert_int_equal(added, 8);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_view v[8];
    size_t n = 99;
    assert_int_equal(kvx_store_prefix(v, &n, s, t, 8, 0), 0); /* max_views 0 */
    assert_int_equal(n, 0);
    assert_int_equal(kvx_store_prefix(NULL, &n, s, t, 0, 0), 0); /* empty prompt */
    assert_int_equal(n, 0);
    assert_int_equal(kvx_store_prefix(v, &n, s, t, 8, 8), 0);
    assert_int_equal(n, 8);
    for (size_t i = 0; i < n; i++) assert_memory_equal(v[i].page, pages + i * pb, pb);
    kvx_views_release(v, n);
    /* a prompt differing in its first token shares no block */
    uint32_t t2[8];
    memcpy(t2, t, sizeof t2);
    t2[0] = 4;
    assert_int_equal(kvx_store_prefix(v, &n, s, t2, 8, 8), 0);
    assert_int_equal(n, 0);
    /* get_block with fewer tokens than a block (none here: B = 1) and 0 */
    kvx_view one;
    assert_int_equal(kvx_store_get_block(&one, s, t, 0), KVX_ETOKENS);
    kvx_store_close(s);
    free(pages);

    /* B = 4 store: a put whose n_tokens is not a multiple of B serves only
     * full blocks; the partial tail is never a block */
    s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    uint32_t tt[3 * SU_B + 2];
    uint64_t h[3];
    su_tokens(tt, 40, 3, 0);
    tt[3 * SU_B] = 1;
    tt[3 * SU_B + 1] = 2;
    uint8_t *p3 = su_pages(tt, 3, h, 64);
    assert_int_equal(kvx_store_put(s, tt, 3 * SU_B + 2, p3, 4, NULL, NULL), KVX_ETOKENS); /* 4 pages, 3 blocks */
    assert_int_equal(kvx_store_put(s, tt, 3 * SU_B + 2, p3, 3, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_prefix(v, &n, s, tt, 3 * SU_B + 2, 8), 0);
    assert_int_equal(n, 3);
    kvx_views_release(v, n);
    /* put_envelope whose tokens disagree with its hashes: refused, nothing
     * written (export the three blocks, then give another prompt's tokens) */
    assert_int_equal(kvx_store_prefix(v, &n, s, tt, 3 * SU_B, 8), 0);
    void *env = NULL;
    size_t len = 0;
    assert_int_equal(kvx_views_export(&env, &len, s, v, n, KVX_ENVELOPE_V1), 0);
    kvx_views_release(v, n);
    uint32_t wrong[3 * SU_B];
    su_tokens(wrong, 41, 3, 0);
    assert_int_equal(kvx_store_put_envelope(s, env, len, wrong, 3 * SU_B, &added), KVX_EHASH);
    assert_int_equal(added, 0);
    /* too few tokens for the envelope's blocks: refused too */
    assert_int_equal(kvx_store_put_envelope(s, env, len, tt, 2 * SU_B, &added), KVX_EHASH);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.pending_blocks, 0);
    kvx_free(env);
    free(p3);
    kvx_store_close(s);
}

int main(int argc, char **argv)
{
    /* these tests read the files one flush writes as its own shard
     * file: the active shard has its own, tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_and_permissions),
        cmocka_unit_test(test_geometry_checks),
        cmocka_unit_test(test_bf16_store),
        cmocka_unit_test(test_no_escape),
        cmocka_unit_test(test_put_flush_visibility),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_envelope_put),
        cmocka_unit_test(test_map_growth),
        cmocka_unit_test(test_reader_threads),
        cmocka_unit_test(test_odd_geometries_and_inputs),
    };
    return cmocka_run_group_tests_name("engine/store", tests, su_setup, su_teardown);
}
