/*
 * pages.h - the data of the store tests and of their child programs
 * (tests/lib/prog_*.c): a tiny geometry, deterministic token sequences,
 * and pages that are a pure function of (block hash, byte index), so a
 * process that did not write a block can still check it byte for byte.
 * No cmocka here (the child programs have none): results are codes, and
 * the store fixture that asserts is tests/lib/store.h.
 */
#ifndef KVX_TEST_PAGES_H
#define KVX_TEST_PAGES_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvx.h"

#define SU_B 4u

static inline kvx_geometry su_geometry(void)
{
    kvx_geometry g = {1, 1, 4, SU_B, KVX_QUANT_FP16, 0x1122334455667788ull};
    return g; /* page: 2*1*1*4*4*2 = 64 bytes */
}

static inline uint64_t su_mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Page bytes of the block with this hash. */
static inline void su_page(uint8_t *out, size_t n, uint64_t hash)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = su_mix(hash ^ (i * 0x100000001B3ull));
        memcpy(out + i, &v, n - i < 8 ? n - i : 8);
    }
}

/* Tokens of sequence seq: n_blocks*B ids; blocks before `shared` are the
 * same for every seq with the same (seq % 4), giving shared prefixes. */
static inline void su_tokens(uint32_t *t, uint64_t seq, size_t n_blocks, size_t shared)
{
    for (size_t b = 0; b < n_blocks; b++)
        for (size_t j = 0; j < SU_B; j++) {
            uint64_t base = b < shared ? (seq % 4) : seq + 1000;
            t[b * SU_B + j] = (uint32_t)su_mix(base * 131 + b * 7 + j);
        }
}

/* Pages for tokens: one per full block, each su_page of its chained hash. */
static inline uint8_t *su_pages(const uint32_t *t, size_t n_blocks, uint64_t *hashes, size_t page_bytes)
{
    uint8_t *p = malloc(n_blocks * page_bytes + 1);
    kvx_block_hashes(hashes, t, n_blocks * SU_B, SU_B);
    for (size_t b = 0; b < n_blocks; b++) su_page(p + b * page_bytes, page_bytes, hashes[b]);
    return p;
}

static inline int su_rm_rf(const char *path)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    return system(cmd);
}


/* The leading blocks of sequence seq (nb full blocks, no shared prefix)
 * that the store serves by prefix, each checked against its deterministic
 * page (64 bytes: su_geometry). Returns their number, or SIZE_MAX when a
 * served block has the wrong hash or bytes (so an assert on the count
 * fails). nb is at most 64. */
static inline size_t su_served_prefix(kvx_store *s, uint64_t seq, size_t nb)
{
    uint32_t t[64 * SU_B];
    uint64_t h[64];
    kvx_view v[64];
    if (nb > 64) return SIZE_MAX;
    su_tokens(t, seq, nb, 0);
    kvx_block_hashes(h, t, nb * SU_B, SU_B);
    size_t n = 0;
    if (kvx_store_prefix(v, &n, s, t, nb * SU_B, nb) != 0) return SIZE_MAX;
    size_t good = n;
    for (size_t i = 0; i < n; i++) {
        uint8_t want[64];
        su_page(want, sizeof want, h[i]);
        if (v[i].hash != h[i] || v[i].page_bytes != sizeof want || memcmp(v[i].page, want, sizeof want))
            good = SIZE_MAX;
    }
    kvx_views_release(v, n);
    return good;
}

/* Puts the first nb blocks of sequence seq (no shared prefix, pages from
 * su_pages) and flushes: 0, or the code of the call that failed. */
static inline int su_put_seq(kvx_store *s, uint64_t seq, size_t nb)
{
    uint32_t t[64 * SU_B];
    uint64_t h[64];
    if (nb > 64) return KVX_EINVALID;
    su_tokens(t, seq, nb, 0);
    uint8_t *p = su_pages(t, nb, h, 64);
    int rc = p ? kvx_store_put(s, t, nb * SU_B, p, nb, NULL, NULL) : -12;
    if (rc == 0) rc = kvx_store_flush(s);
    free(p);
    return rc;
}

/* Flips one bit of the page of entry `entry` of the shard file at path
 * (byte 5 of the page): a page that fails its CRC-32. 0 or -1. */
static inline int su_flip_page_byte(const char *path, uint32_t entry)
{
    kvx_shard *sh;
    if (kvx_shard_open(&sh, path, 0) != 0) return -1;
    kvx_entry e;
    int rc = kvx_shard_entry(&e, sh, entry);
    kvx_shard_close(sh);
    if (rc) return -1;
    uint64_t off = e.offset + 5;
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    int c = fseek(f, (long)off, SEEK_SET) == 0 ? fgetc(f) : EOF;
    rc = c == EOF || fseek(f, (long)off, SEEK_SET) != 0 || fputc(c ^ 0x40, f) == EOF ? -1 : 0;
    return fclose(f) == 0 ? rc : -1;
}

/* A file's signature: FNV-1a 64 of its bytes (0 when it cannot be read);
 * *blank (nullable): every byte is zero, or there is none. */
static inline uint64_t su_file_sig(const char *path, int *blank)
{
    if (blank) *blank = 1;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint64_t h = 0xcbf29ce484222325ull;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        for (size_t i = 0; i < n; i++) {
            h = (h ^ (uint8_t)buf[i]) * 0x100000001b3ull;
            if (buf[i] && blank) *blank = 0;
        }
    fclose(f);
    return h;
}

static inline int su_cmp_name(const void *a, const void *b) { return strcmp((const char *)a, (const char *)b); }

/* Sorted names of the entries of dir/sub ("." and ".." left out), at most
 * max of them, each cut to 63 bytes. */
static inline size_t su_list_names(const char *dir, const char *sub, char (*out)[64], size_t max)
{
    char path[4200];
    snprintf(path, sizeof path, "%.3000s/%.1000s", dir, sub);
    DIR *d = opendir(path);
    if (!d) return 0;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(out[n++], 64, "%.63s", e->d_name);
    }
    closedir(d);
    qsort(out, n, 64, su_cmp_name);
    return n;
}

#endif
