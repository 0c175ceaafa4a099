/*
 * store.h - the store fixture: the one way a test makes, reopens and
 * checks a store. Every store a test creates lives under su_root, the
 * test program's scratch directory (su_setup / su_teardown, its cmocka
 * group setup and teardown); its pages are tests/lib/pages.h's, a pure
 * function of the block hash, so any read is checked byte for byte.
 *
 * A store is described by an su_spec, zero meaning "as the library
 * decides" (capacity and shard size) or "as su_geometry" (the rest):
 *
 *   char dir[512];
 *   kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .flags = KVX_STORE_NOWAIT});
 *   ...
 *   kvx_store_close(s);
 *   s = su_reopen(dir, KVX_STORE_NOWAIT);
 *   su_verify_clean(s);
 *
 * A spec with page_bytes makes a keyed store (no geometry). Each call
 * that cannot do its job fails the test, naming the store's error.
 */
#ifndef KVX_TEST_STORE_H
#define KVX_TEST_STORE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <fcntl.h>
#include <time.h>

#include "pages.h"

/* What su_store and su_create make. */
typedef struct su_spec {
    uint64_t capacity;              /* capacity_bytes; 0: the default */
    uint64_t shard_bytes;           /* 0: the default */
    uint32_t flags;                 /* KVX_STORE_* of the writer */
    uint64_t page_bytes;            /* != 0: a keyed store of pages this size */
    const kvx_geometry *geometry;   /* NULL: su_geometry() */
    uint32_t block_tokens;          /* != 0: instead of the geometry's */
    uint32_t quant;                 /* != 0: instead of the geometry's (FP16 is 0) */
    uint64_t signature;             /* != 0: the model signature */
    const char *tier_url, *tier_tenant;
} su_spec;

/* The test's scratch directory: made by su_setup (cmocka group setup) and
 * removed with everything in it by su_teardown. */
static char su_root[256] __attribute__((unused));
static int su_dir_counter __attribute__((unused));

static inline int su_setup(void **state)
{
    (void)state;
    if (su_root[0]) return 0; /* made already (one directory per program) */
    snprintf(su_root, sizeof su_root, "/tmp/kvx-test-store-XXXXXX");
    return mkdtemp(su_root) ? 0 : -1;
}

static inline int su_teardown(void **state)
{
    (void)state;
    su_rm_rf(su_root);
    return 0;
}

/* A fresh path under su_root (nothing is made there): su_root/s<n>. */
static inline void su_new_dir(char *dir, size_t cap) { snprintf(dir, cap, "%.200s/s%d", su_root, su_dir_counter++); }

/* su_root/name in dir; returns dir. */
static inline char *su_path(char *dir, size_t cap, const char *name)
{
    snprintf(dir, cap, "%.200s/%s", su_root, name);
    return dir;
}

/* The options spec describes, in *o. Every byte is set (padding too):
 * kvx_store_create compares a keyed store's geometry with zero bytes. */
static inline void su_options(kvx_store_options *o, su_spec spec)
{
    memset(o, 0, sizeof *o);
    kvx_store_options_init(o);
    if (spec.page_bytes) {
        o->page_bytes = spec.page_bytes;
    } else {
        o->geometry = spec.geometry ? *spec.geometry : su_geometry();
        if (spec.block_tokens) o->geometry.block_tokens = spec.block_tokens;
        if (spec.quant) o->geometry.quant = spec.quant;
        if (spec.signature) o->geometry.model_signature = spec.signature;
    }
    o->capacity_bytes = spec.capacity;
    o->shard_bytes = spec.shard_bytes;
    o->flags = spec.flags;
    o->tier_url = spec.tier_url;
    o->tier_tenant = spec.tier_tenant;
}

/* A new store at dir (which must not hold one). */
static inline kvx_store *su_create(const char *dir, su_spec spec)
{
    kvx_store_options o;
    su_options(&o, spec);
    kvx_store *s = NULL;
    int rc = kvx_store_create(&s, dir, &o);
    if (rc) fail_msg("create %s: %s (%s)", dir, kvx_err_name(rc), kvx_last_error());
    return s;
}

/* A new store at a fresh path under su_root, written into dir. */
static inline kvx_store *su_store(char *dir, size_t cap, su_spec spec)
{
    su_new_dir(dir, cap);
    return su_create(dir, spec);
}

/* The store at dir opened again, with these KVX_STORE_* flags. */
static inline kvx_store *su_reopen(const char *dir, uint32_t flags)
{
    kvx_store *s = NULL;
    int rc = kvx_store_open(&s, dir, NULL, flags);
    if (rc) fail_msg("open %s: %s (%s)", dir, kvx_err_name(rc), kvx_last_error());
    return s;
}

/* DIR/STORE's 64 bytes (docs/FORMAT.md "STORE file") into b. */
static inline void su_store_bytes(const char *dir, uint8_t b[64])
{
    char p[600];
    snprintf(p, sizeof p, "%s/STORE", dir);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    assert_int_equal(fread(b, 1, 64, f), 64);
    fclose(f);
}

/* The format version and kind DIR/STORE holds: u16 at 8 and at 10. */
static inline void su_store_version(const char *dir, unsigned *version, unsigned *kind)
{
    uint8_t b[64];
    su_store_bytes(dir, b);
    *version = (unsigned)b[8] | (unsigned)b[9] << 8;
    *kind = (unsigned)b[10] | (unsigned)b[11] << 8;
}

/* kvx_store_verify finds no problem. */
static inline void su_verify_clean(kvx_store *s)
{
    uint64_t bad = 99;
    int rc = kvx_store_verify(s, &bad, NULL, NULL);
    if (rc) fail_msg("verify: %s (%s)", kvx_err_name(rc), kvx_last_error());
    assert_int_equal(bad, 0);
}

/* kvx_store_stat's answer. */
static inline kvx_store_stats su_stat(kvx_store *s)
{
    kvx_store_stats st;
    int rc = kvx_store_stat(&st, s);
    if (rc) fail_msg("stat: %s (%s)", kvx_err_name(rc), kvx_last_error());
    return st;
}

/* Sequences of SU_NB blocks: put (not flushed; the put must succeed), and
 * how many leading blocks of one the store serves, each checked byte for
 * byte (su_served_prefix). */
#define SU_NB 6

static inline void su_put_nb(kvx_store *s, uint64_t seq)
{
    uint32_t t[SU_NB * SU_B];
    uint64_t h[SU_NB];
    su_tokens(t, seq, SU_NB, 0);
    uint8_t *p = su_pages(t, SU_NB, h, 64);
    int rc = kvx_store_put(s, t, SU_NB * SU_B, p, SU_NB, NULL, NULL);
    free(p);
    if (rc) fail_msg("put: %s (%s)", kvx_err_name(rc), kvx_last_error());
}

static inline size_t su_prefix_nb(kvx_store *s, uint64_t seq) { return su_served_prefix(s, seq, SU_NB); }

/* Puts the first nb blocks of sequence seq (no shared prefix, pages from
 * su_pages) and flushes; both must succeed. nb is at most 64. */
static inline void su_put_flush(kvx_store *s, uint64_t seq, size_t nb)
{
    int rc = su_put_seq(s, seq, nb);
    if (rc) fail_msg("put + flush of seq %llu: %s (%s)", (unsigned long long)seq, kvx_err_name(rc), kvx_last_error());
}

/* Puts the SU_NB blocks of sequence seq into batch b (NULL: the built-in
 * batch): the put's code; *added as kvx_store_put says (nullable). */
static inline int su_put_batch(kvx_store *s, kvx_store_batch *b, uint64_t seq, size_t *added)
{
    uint32_t t[SU_NB * SU_B];
    uint64_t h[SU_NB];
    su_tokens(t, seq, SU_NB, 0);
    uint8_t *p = su_pages(t, SU_NB, h, 64);
    int rc = b ? kvx_store_batch_put(b, t, SU_NB * SU_B, p, SU_NB, NULL, added)
               : kvx_store_put(s, t, SU_NB * SU_B, p, SU_NB, NULL, added);
    free(p);
    return rc;
}

/* A handle's first flush also makes its UNSYNCED mark durable (the
 * lagging catalog, engine/store_lag.c): one put + flush of a sequence of
 * its own (seq 999983), so a test that counts a later flush's calls counts
 * only that flush's. */
static inline void su_lagging(kvx_store *s) { su_put_flush(s, 999983, 1); }

/* Sequences with a shared prefix (su_tokens' shared): put n_blocks of seq
 * (with a partial tail token; the hashes in h) and the blocks it added;
 * the put must succeed. */
static inline size_t su_put_shared(kvx_store *s, uint64_t seq, size_t n_blocks, size_t shared, uint64_t *h)
{
    uint32_t t[64 * SU_B];
    assert_true(n_blocks <= 64);
    su_tokens(t, seq, n_blocks, shared);
    uint8_t *p = su_pages(t, n_blocks, h, 64);
    size_t added = 99;
    int rc = kvx_store_put(s, t, n_blocks * SU_B + 1, p, n_blocks, NULL, &added);
    if (rc) fprintf(stderr, "put: %s\n", kvx_last_error());
    assert_int_equal(rc, 0);
    free(p);
    return added;
}

/* A served view is the block of this hash, byte for byte. */
static inline void su_check_view(const kvx_view *v, uint64_t hash)
{
    uint8_t want[64];
    su_page(want, 64, hash);
    assert_true(v->hash == hash);
    assert_int_equal(v->page_bytes, 64);
    assert_int_equal(v->token_count, SU_B);
    assert_memory_equal(v->page, want, 64);
}

/* The leading blocks of seq (n_blocks, shared as su_put_shared) the store
 * serves by prefix, each checked with su_check_view when check. */
static inline size_t su_prefix_shared(kvx_store *s, uint64_t seq, size_t n_blocks, size_t shared, int check)
{
    uint32_t t[64 * SU_B];
    uint64_t h[64];
    su_tokens(t, seq, n_blocks, shared);
    kvx_block_hashes(h, t, n_blocks * SU_B, SU_B);
    kvx_view v[64];
    size_t n = 99;
    assert_int_equal(kvx_store_prefix(v, &n, s, t, n_blocks * SU_B + 3, 64), 0);
    if (check)
        for (size_t i = 0; i < n; i++) su_check_view(&v[i], h[i]);
    kvx_views_release(v, n);
    return n;
}

/* ---- names in the store's directories ---- */

/* How many entries dir/sub holds ("." and ".." left out). */
static inline size_t su_n_files(const char *dir, const char *sub)
{
    static char names[1024][64];
    return su_list_names(dir, sub, names, 1024);
}

/* The sorted names of dir/sub in out, each followed by a space. */
static inline void su_names_of(const char *dir, const char *sub, char *out, size_t cap)
{
    static char names[1024][64];
    size_t n = su_list_names(dir, sub, names, 1024);
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        strncat(out, names[i], cap - strlen(out) - 1);
        strncat(out, " ", cap - strlen(out) - 1);
    }
}

/* Like su_list_names, but a name starting with '.' only when it names a
 * shard file (".<generation>.kvx...", as staging/ holds them). */
static inline size_t su_list_files(const char *dir, const char *sub, char (*out)[64], size_t max)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    DIR *d = opendir(path);
    if (!d) return 0;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max)
        if (e->d_name[0] != '.' || strstr(e->d_name, ".kvx")) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(out[n++], 64, "%.63s", e->d_name);
        }
    closedir(d);
    qsort(out, n, 64, su_cmp_name);
    return n;
}

/* The generations of the shard files in dir/staging (".<16 hex>..."), at
 * most max of them, and the largest in *maxgen (0: none). */
static inline size_t su_staged_gens(const char *dir, uint64_t *gens, size_t max, uint64_t *maxgen)
{
    static char names[1024][64];
    size_t n = su_list_names(dir, "staging", names, 1024), k = 0;
    *maxgen = 0;
    for (size_t i = 0; i < n && k < max; i++) {
        if (names[i][0] != '.' || strlen(names[i]) < 17) continue;
        char hex[17];
        memcpy(hex, names[i] + 1, 16);
        hex[16] = '\0';
        char *end = NULL;
        uint64_t g = strtoull(hex, &end, 16);
        if (!end || *end) continue;
        gens[k++] = g;
        if (g > *maxgen) *maxgen = g;
    }
    return k;
}

/* ---- keyed pages ---- */

/* The page a key has under "version" ver: a function of both. */
static inline void su_key_fill(uint8_t *p, size_t n, const void *key, size_t klen, uint64_t ver)
{
    su_page(p, n, kvx_key_hash(key, klen) ^ (ver * 0x9E3779B97F4A7C15ull));
}

/* Puts key's page of len bytes under version ver into batch b (NULL: the
 * built-in one): the put's code; *out_new as kvx_store_keyed_put says. */
static inline int su_key_put(kvx_store *s, kvx_store_batch *b, const void *key, size_t klen, size_t len, uint64_t ver,
                             size_t *out_new)
{
    uint8_t *p = malloc(len);
    su_key_fill(p, len, key, klen, ver);
    kvx_key k = {key, klen};
    const void *pages[1] = {p};
    size_t lens[1] = {len};
    int rc = kvx_store_keyed_put(s, b, &k, pages, lens, 1, out_new);
    free(p);
    return rc;
}

/* 0 when the store serves key's page of len bytes under version ver byte
 * for byte; the get's code or its status otherwise; 1 for other bytes. */
static inline int su_key_check(kvx_store *s, const void *key, size_t klen, size_t len, uint64_t ver)
{
    kvx_key k = {key, klen};
    kvx_view v;
    int st = 0;
    int rc = kvx_store_keyed_get(&v, &st, s, &k, 1);
    if (rc) return rc;
    if (st) return st;
    uint8_t *want = malloc(len);
    su_key_fill(want, len, key, klen, ver);
    int same = v.page_bytes == len && memcmp(v.page, want, len) == 0;
    free(want);
    kvx_view_release(&v);
    return same ? 0 : 1;
}

/* Rewrites the last 4 bytes of p (n >= 4) so that kvx_crc32(0, p, n) is
 * want (a page of equal length and equal CRC-32, other bytes): CRC-32 is
 * affine in the message bits over GF(2), so the 32 bits of the tail are
 * solved for by Gaussian elimination. */
static inline void su_forge_crc(uint8_t *p, size_t n, uint32_t want)
{
    uint32_t col[32], base = kvx_crc32(0, p, n);
    for (int i = 0; i < 32; i++) { /* the CRC change of flipping tail bit i */
        p[n - 4 + i / 8] ^= (uint8_t)(1u << (i % 8));
        col[i] = kvx_crc32(0, p, n) ^ base;
        p[n - 4 + i / 8] ^= (uint8_t)(1u << (i % 8));
    }
    /* solve sum x_i col_i = base ^ want: rows are CRC bits, columns tail bits */
    uint64_t rows[32]; /* bit i: col_i's row bit; bit 32: the target */
    uint32_t target = base ^ want;
    for (int r = 0; r < 32; r++) {
        rows[r] = (uint64_t)((target >> r) & 1) << 32;
        for (int i = 0; i < 32; i++) rows[r] |= (uint64_t)((col[i] >> r) & 1) << i;
    }
    int pivot_of[32];
    int r = 0;
    for (int c = 0; c < 32 && r < 32; c++) {
        int k = r;
        while (k < 32 && !((rows[k] >> c) & 1)) k++;
        if (k == 32) continue;
        uint64_t t = rows[k];
        rows[k] = rows[r];
        rows[r] = t;
        for (int j = 0; j < 32; j++)
            if (j != r && ((rows[j] >> c) & 1)) rows[j] ^= rows[r];
        pivot_of[r++] = c;
    }
    assert_int_equal(r, 32); /* the tail's 32 bits span every CRC */
    for (int j = 0; j < 32; j++)
        if ((rows[j] >> 32) & 1) p[n - 4 + pivot_of[j] / 8] ^= (uint8_t)(1u << (pivot_of[j] % 8));
    assert_int_equal(kvx_crc32(0, p, n), want);
}

/* A chained FNV collision at block 0 for B = 4 (found once with
 * tests/lib/collide.h, seed 12345): kvx_block_hash(0, COLL_A) ==
 * kvx_block_hash(0, COLL_B) == 0xef3b2c7560273eaa, so any identical tail
 * appended to both collides block for block. */
static const uint32_t COLL_A[4] __attribute__((unused)) = {2849051040u, 4145281261u, 3375848879u, 1394986490u};
static const uint32_t COLL_B[4] __attribute__((unused)) = {2849051040u, 4145281261u, 3465670547u, 1026208435u};

/* Writes dir/sub/name (sub made if missing) with n bytes, not sparse, and,
 * when note_at is not 0, its quarantine note name.why dated note_at. */
static inline void su_plant(const char *dir, const char *sub, const char *name, size_t n, time_t note_at)
{
    char p[800];
    snprintf(p, sizeof p, "%.300s/%.20s", dir, sub);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%.300s/%.20s/%.200s", dir, sub, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    char *buf = malloc(n ? n : 1);
    memset(buf, 0x5a, n);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    free(buf);
    assert_int_equal(fclose(f), 0);
    if (!note_at) return;
    snprintf(p, sizeof p, "%.300s/%.20s/%.200s.why", dir, sub, name);
    f = fopen(p, "w");
    assert_non_null(f);
    fputs("planted by the test\n", f);
    fclose(f);
    struct timespec ts[2] = {{note_at, 0}, {note_at, 0}};
    assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);
}

/* Does dir/sub/name exist (any type, never followed)? */
static inline int su_exists(const char *dir, const char *sub, const char *name)
{
    char p[800];
    struct stat st;
    snprintf(p, sizeof p, "%.300s/%.20s/%.200s", dir, sub, name);
    return lstat(p, &st) == 0;
}

#endif
