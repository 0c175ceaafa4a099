/*
 * test_attack12.c - three promises of docs/STORE.md that no test named:
 *
 *  - "Only eviction, compaction and gc delete a shard file ... and only
 *    when it is sound; a damaged one moves to quarantine/ instead": gc's
 *    salvage had tests (test_trust.c test_rotten_page, test_attack7.c
 *    test_delete_damaged), eviction and compaction none.
 *    test_evict_damaged_quarantined: the oldest shard, one cold page
 *    rotten from the start and one hot page rotten after a lookup checked
 *    it, is evicted: the file moves to quarantine/ byte for byte with its
 *    .why, stat counts it, its hot good blocks were carried and serve
 *    their own bytes, the page that rotted after its check is not
 *    laundered into the carried shard. test_compact_damaged_quarantined:
 *    four small shards merged by a flush, one with a rotten page: the
 *    same, every good block of it copied.
 *  - Keyed stores: "a 64-bit collision is a miss, never another key's
 *    page" (test_keyed.c test_whole_key_compared checks one lookup
 *    against a crafted query only). test_keyed_name_collision: keys that
 *    share their 8-byte name (the test seam kvx_key_name_hook,
 *    common/digest.h) are put in two flushes and in one, each served its
 *    own page, the second put not taken as "already held"; also after
 *    kvx_store_reindex, a reopen (writer and reader), a delete of one of
 *    them and gc; a key never put that shares the name is a miss.
 *  - "Usage from read-only handles reaches the writer's LRU decisions ...
 *    every 65,536 lookups or at close": a reader process (this program
 *    run again with --reader) reads the oldest shard A; the writer's next
 *    eviction takes the newer, unread B and keeps A
 *    (test_reader_use_reaches_writer_at_close,
 *    test_reader_use_after_65536_lookups). Controls: no reader, and a
 *    reader still open after 65,535 lookups: A, the oldest, goes
 *    (test_reader_use_controls), so the two tests above prove the usage
 *    arrived, and when.
 *
 * Break found, fixed, tested here:
 *  - test_reader_use_after_writer_use: the writer read A once before B
 *    was made, a reader read A after every other shard was made and
 *    closed; the eviction took A. kvx_st_recency_build
 *    (engine/store_usage.c) let the writer's own per-block time of a block
 *    override the usage record's newer last use, so a reader's lookups
 *    never reached a block the writer had ever used itself. Now a
 *    shard's last use newer than every per-block time the writer holds
 *    for it (another process's) counts for the blocks whose bit is set.
 *
 * White-box: the key name seam (common/digest.h) and the catalog's
 * locations of a name (index/catalog.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/digest.h"
#include "engine/store.h"
#include "lib/store.h"

static void put_flush(kvx_store *s, uint64_t seq, size_t nb)
{
    int rc = su_put_seq(s, seq, nb);
    if (rc) fail_msg("put+flush of seq %llu: %s (%s)", (unsigned long long)seq, kvx_err_name(rc), kvx_last_error());
}

/* The whole file (its size in *n), or NULL when it cannot be read. */
static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint8_t *b = NULL;
    size_t cap = 0, len = 0, got = 0;
    do {
        if (len == cap) {
            uint8_t *nb = realloc(b, cap = cap ? cap * 2 : 1 << 16);
            if (!nb) break;
            b = nb;
        }
        got = fread(b + len, 1, cap - len, f);
        len += got;
    } while (got);
    fclose(f);
    *n = len;
    return b;
}

/* The one name in shards/ (the store holds exactly one shard). */
static void only_shard(const char *dir, char name[64])
{
    char names[8][64];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    memcpy(name, names[0], 64);
}

static int in_dir(const char *dir, const char *sub, const char *name)
{
    char p[600];
    struct stat st;
    snprintf(p, sizeof p, "%.300s/%.20s/%.63s", dir, sub, name);
    return lstat(p, &st) == 0;
}

/* The damaged shard `name` sits in quarantine/ with the bytes it had
 * (held: len bytes) and a note naming its damage; no longer in shards/. */
static void check_quarantined(const char *dir, const char *name, const uint8_t *held, size_t len)
{
    char p[600];
    assert_false(in_dir(dir, "shards", name));
    snprintf(p, sizeof p, "%.300s/quarantine/%.63s", dir, name);
    size_t n = 0;
    uint8_t *now = slurp(p, &n);
    if (!now) fail_msg("shards/%s was deleted, not moved to quarantine/", name);
    assert_int_equal(n, len);
    assert_memory_equal(now, held, len);
    free(now);
    snprintf(p, sizeof p, "%.300s/quarantine/%.63s.why", dir, name);
    char *why = (char *)slurp(p, &n);
    if (!why) fail_msg("quarantine/%s has no .why note", name);
    why = realloc(why, n + 1);
    why[n] = 0;
    assert_non_null(strstr(why, name));
    assert_non_null(strstr(why, "damaged"));
    free(why);
}

/* ------------------------------------------------------------------ */
/* 1. A damaged shard taken by eviction or compaction: quarantined,
 *    never deleted, its good blocks served or copied. */

/* Shards of 16 blocks (68 KiB: a 4 KiB head, each page in its own 4
 * KiB), six of them in the store. */
#define EV_CAP (450u << 10)
#define EV_SHARD (70u << 10)

static void test_evict_damaged_quarantined(void **state)
{
    (void)state;
    char dir[300], name[64], path[600];
    kvx_store *s =
        su_store(dir, sizeof dir,
                 (su_spec){.capacity = EV_CAP, .shard_bytes = EV_SHARD, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    const uint64_t A = 100;
    put_flush(s, A, 16);
    only_shard(dir, name);
    snprintf(path, sizeof path, "%s/shards/%s", dir, name);
    assert_int_equal(su_flip_page_byte(path, 12), 0); /* a cold page, rotten from the start */
    /* newer shards of 16 blocks while one more fits */
    uint64_t seq = 200;
    for (kvx_store_stats st = su_stat(s); st.bytes + st.bytes / st.shards <= EV_CAP; st = su_stat(s))
        put_flush(s, seq++, 16);
    assert_int_equal(su_stat(s).evictions, 0);
    /* A's first 8 blocks read now: hot, so eviction carries them; then
     * the page of block 6, checked by this lookup, rots */
    assert_int_equal(su_served_prefix(s, A, 8), 8);
    assert_int_equal(su_flip_page_byte(path, 6), 0);
    size_t len = 0;
    uint8_t *held = slurp(path, &len);
    assert_non_null(held);
    kvx_store_stats before = su_stat(s);
    assert_int_equal(before.quarantined, 0);
    /* small puts until the capacity is passed: a small overflow, so the
     * LRU cut falls among A's cold blocks (the oldest) and A, half cold,
     * is the victim */
    while (su_stat(s).evictions == 0 && seq < 260) put_flush(s, seq++, 4);
    kvx_store_stats after = su_stat(s);
    assert_true(after.evictions > 0);
    assert_true(after.bytes <= after.capacity_bytes);
    check_quarantined(dir, name, held, len);
    assert_int_equal(after.quarantined, before.quarantined + 1);
    /* blocks 0-5 were carried and serve their own bytes; the rotten 6
     * was not copied (its bytes would have got a fresh CRC) */
    assert_int_equal(su_served_prefix(s, A, 16), 6);
    su_verify_clean(s);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(su_served_prefix(s, A, 16), 6);
    assert_int_equal(su_stat(s).quarantined, 1);
    check_quarantined(dir, name, held, len);
    su_verify_clean(s);
    kvx_store_close(s);
    free(held);
}

static void test_compact_damaged_quarantined(void **state)
{
    (void)state;
    char dir[300], name[64], path[600];
    /* 2 MiB: target shards of 512 KiB, and 4 small shards (< 256 KiB)
     * are due for a merge (their overhead passes 1 % of the capacity) */
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 2u << 20, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    const uint64_t D = 400;
    put_flush(s, D, 4);
    only_shard(dir, name);
    snprintf(path, sizeof path, "%s/shards/%s", dir, name);
    assert_int_equal(su_flip_page_byte(path, 2), 0);
    put_flush(s, D + 1, 4);
    put_flush(s, D + 2, 4);
    kvx_store_stats before = su_stat(s);
    assert_int_equal(before.compactions, 0);
    assert_int_equal(before.shards, 3);
    assert_true(in_dir(dir, "shards", name));
    size_t len = 0;
    uint8_t *held = slurp(path, &len);
    assert_non_null(held);
    put_flush(s, D + 3, 4); /* the fourth small shard: the flush merges */
    kvx_store_stats after = su_stat(s);
    assert_true(after.compactions > before.compactions);
    assert_int_equal(after.evictions, 0);
    assert_true(after.shards < 4);
    check_quarantined(dir, name, held, len);
    assert_int_equal(after.quarantined, before.quarantined + 1);
    /* D's good blocks were copied: 0 and 1 serve (the prefix ends at the
     * damaged 2, not laundered); 3 was copied too (an orphan, reached by
     * hash) */
    assert_int_equal(su_served_prefix(s, D, 4), 2);
    uint32_t t[4 * SU_B];
    uint64_t h[4];
    su_tokens(t, D, 4, 0);
    kvx_block_hashes(h, t, 4 * SU_B, SU_B);
    kvx_view v;
    assert_int_equal(kvx_store_get_hash(&v, s, h[3]), 0);
    uint8_t want[64];
    su_page(want, sizeof want, h[3]);
    assert_memory_equal(v.page, want, sizeof want);
    kvx_view_release(&v);
    assert_int_equal(kvx_store_get_hash(&v, s, h[2]), KVX_ENOTFOUND);
    for (uint64_t q = D + 1; q <= D + 3; q++) assert_int_equal(su_served_prefix(s, q, 4), 4);
    su_verify_clean(s);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(su_served_prefix(s, D, 4), 2);
    for (uint64_t q = D + 1; q <= D + 3; q++) assert_int_equal(su_served_prefix(s, q, 4), 4);
    check_quarantined(dir, name, held, len);
    su_verify_clean(s);
    kvx_store_close(s);
    free(held);
}

/* ------------------------------------------------------------------ */
/* 2. Keyed stores: two keys, one 64-bit name. */

#define KPB 4096u
#define SHARED_NAME 0x5eed5eed0c011de5ull

/* Every key starting "collide-" is named SHARED_NAME. */
static uint64_t collide_names(const void *key, size_t len, uint64_t name)
{
    return len > 8 && memcmp(key, "collide-", 8) == 0 ? SHARED_NAME : name;
}

static int hook_reset(void **state)
{
    (void)state;
    kvx_key_name_hook = NULL;
    return 0;
}

/* Page bytes of key k: from its own bytes (FNV-1a), not from its name,
 * which colliding keys share. */
static void key_page(uint8_t *p, size_t n, const char *k)
{
    uint64_t f = 0xcbf29ce484222325ull;
    for (const char *c = k; *c; c++) f = (f ^ (uint8_t)*c) * 0x100000001b3ull;
    su_page(p, n, f);
}

/* 100..990 bytes, from the key's last byte (a partial page). */
static size_t key_len_of(const char *k) { return 100 + (size_t)(uint8_t)k[strlen(k) - 1] * 37 % 891; }

/* Puts keys (n), answers how many the store took as new. */
static size_t put_keys(kvx_store *s, const char *const *k, size_t n)
{
    kvx_key keys[4];
    const void *pages[4];
    size_t lens[4];
    uint8_t buf[4][KPB];
    assert_true(n <= 4);
    for (size_t i = 0; i < n; i++) {
        keys[i] = (kvx_key){k[i], strlen(k[i])};
        lens[i] = key_len_of(k[i]);
        key_page(buf[i], lens[i], k[i]);
        pages[i] = buf[i];
    }
    size_t added = 99;
    int rc = kvx_store_keyed_put(s, NULL, keys, pages, lens, n, &added);
    if (rc) fail_msg("keyed put: %s (%s)", kvx_err_name(rc), kvx_last_error());
    return added;
}

/* 1: k is served its own page; 0: a miss. Another key's page fails. */
static int served_own(kvx_store *s, const char *k)
{
    kvx_key key = {k, strlen(k)};
    kvx_view v;
    int st = 9;
    assert_int_equal(kvx_store_keyed_get(&v, &st, s, &key, 1), 0);
    if (st == KVX_ENOTFOUND) return 0;
    if (st) fail_msg("keyed get %s: %s", k, kvx_err_name(st));
    uint8_t want[KPB];
    size_t len = key_len_of(k);
    key_page(want, len, k);
    if (v.page_bytes != len || memcmp(v.page, want, len) != 0)
        fail_msg("key %s was served %zu bytes that are not its page (another key's?)", k, (size_t)v.page_bytes);
    kvx_view_release(&v);
    return 1;
}

/* How many locations the catalog holds under the shared name. */
static size_t locations_of_name(kvx_store *s)
{
    kvx_cat_snap *snap;
    assert_int_equal(kvx_cat_snap_begin(s->cat, &snap), 0);
    size_t n = 0;
    kvx_cat_loc loc;
    int rc;
    while ((rc = kvx_cat_loc_at(snap, SHARED_NAME, n, &loc)) == 0) n++;
    kvx_cat_snap_end(snap);
    assert_int_equal(rc, KVX_ENOTFOUND);
    return n;
}

static void check_all(kvx_store *s, const char *const *held, size_t nheld, const char *const *absent, size_t nabs)
{
    for (size_t i = 0; i < nheld; i++)
        if (!served_own(s, held[i])) fail_msg("key %s, acknowledged, is not served", held[i]);
    for (size_t i = 0; i < nabs; i++)
        if (served_own(s, absent[i])) fail_msg("key %s is served, but it is not held", absent[i]);
}

static void test_keyed_name_collision(void **state)
{
    (void)state;
    char dir[300];
    kvx_key_name_hook = collide_names;
    const char *a = "collide-A", *b = "collide-B", *c = "collide-C", *d = "collide-D", *e = "collide-E";
    /* the seam names them alike, and so does the public kvx_key_hash */
    assert_true(kvx_key_hash(a, strlen(a)) == SHARED_NAME);
    assert_true(kvx_key_hash(b, strlen(b)) == SHARED_NAME);
    assert_true(kvx_key_hash("plain", 5) != SHARED_NAME);
    su_new_dir(dir, sizeof dir);
    kvx_store_options o;
    kvx_store_options_init(&o);
    o.page_bytes = KPB;
    o.capacity_bytes = 64ull << 20;
    o.flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC;
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    /* A, then B in a later flush: B is new, not "already held" */
    assert_int_equal(put_keys(s, &a, 1), 1);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(put_keys(s, &b, 1), 1);
    assert_int_equal(kvx_store_flush(s), 0);
    /* C and D in one put (both pending in one batch at once) */
    const char *cd[2] = {c, d};
    assert_int_equal(put_keys(s, cd, 2), 2);
    assert_int_equal(kvx_store_flush(s), 0);
    /* a put of A again is held: nothing new */
    assert_int_equal(put_keys(s, &a, 1), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(locations_of_name(s), 4); /* the collision is real: one name, four pages */
    const char *all[4] = {a, b, c, d};
    check_all(s, all, 4, &e, 1);
    uint8_t held[2] = {9, 9};
    size_t lead = 9;
    kvx_key ex[2] = {{e, strlen(e)}, {b, strlen(b)}};
    assert_int_equal(kvx_store_keyed_exists(held, &lead, s, ex, 2), 0);
    assert_int_equal(held[0], 0);
    assert_int_equal(held[1], 1);
    assert_int_equal(lead, 0);
    su_verify_clean(s);
    /* rebuilt from the shards alone */
    assert_int_equal(kvx_store_reindex(s), 0);
    assert_int_equal(locations_of_name(s), 4);
    check_all(s, all, 4, &e, 1);
    su_verify_clean(s);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_READONLY | KVX_STORE_NOWAIT);
    check_all(s, all, 4, &e, 1);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    check_all(s, all, 4, &e, 1);
    /* the owner's delete of A removes A's page only */
    size_t deleted = 9;
    kvx_key ka = {a, strlen(a)};
    assert_int_equal(kvx_store_keyed_delete(s, &ka, 1, &deleted), 0);
    assert_int_equal(deleted, 1);
    const char *left[3] = {b, c, d}, *gone[2] = {a, e};
    check_all(s, left, 3, gone, 2);
    assert_int_equal(kvx_store_gc(s), 0);
    check_all(s, left, 3, gone, 2);
    su_verify_clean(s);
    kvx_store_close(s);
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    check_all(s, left, 3, &e, 1);
    kvx_store_close(s);
    kvx_key_name_hook = NULL;
}

/* ------------------------------------------------------------------ */
/* 3. A reader's lookups reach the writer's LRU. */

/* The reader process (this program with --reader DIR SEQ NB LOOKUPS
 * CLOSE): opens DIR read-only, serves SEQ's NB blocks by prefix (one
 * lookup), then LOOKUPS - 1 lookups by hash of them; closes the store when
 * CLOSE is 1. Then it writes "r" on stdout and waits for end of file on
 * stdin before it exits, without closing a store it left open. Exit 0, or
 * 10+ naming the check that failed. */
static int reader_main(char **argv)
{
    const char *dir = argv[2];
    uint64_t seq = strtoull(argv[3], NULL, 10);
    size_t nb = strtoul(argv[4], NULL, 10);
    unsigned long lookups = strtoul(argv[5], NULL, 10);
    int close_it = atoi(argv[6]);
    kvx_store *s;
    if (nb == 0 || nb > 64 || lookups == 0) return 9;
    if (kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY) != 0) return 10;
    if (su_served_prefix(s, seq, nb) != nb) return 11;
    uint32_t t[64 * SU_B];
    uint64_t h[64];
    su_tokens(t, seq, nb, 0);
    kvx_block_hashes(h, t, nb * SU_B, SU_B);
    for (unsigned long i = 1; i < lookups; i++) {
        kvx_view v;
        if (kvx_store_get_hash(&v, s, h[i % nb]) != 0) return 12;
        kvx_view_release(&v);
    }
    if (close_it) kvx_store_close(s);
    if (write(1, "r", 1) != 1) return 13;
    char c;
    while (read(0, &c, 1) > 0) {
    }
    _exit(0);
}

typedef struct reader_proc {
    pid_t pid;
    int to; /* the child's stdin: closing it lets the child exit */
} reader_proc;

static reader_proc reader_start(const char *dir, uint64_t seq, size_t nb, unsigned long lookups, int close_it)
{
    int in[2], out[2];
    assert_int_equal(pipe(in), 0);
    assert_int_equal(pipe(out), 0);
    char a_seq[32], a_nb[32], a_n[32], a_close[8];
    snprintf(a_seq, sizeof a_seq, "%llu", (unsigned long long)seq);
    snprintf(a_nb, sizeof a_nb, "%zu", nb);
    snprintf(a_n, sizeof a_n, "%lu", lookups);
    snprintf(a_close, sizeof a_close, "%d", close_it);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* a fresh process (exec): nothing of the writer's LMDB environment
         * or threads carried over */
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        execl("/proc/self/exe", "test_attack12", "--reader", dir, a_seq, a_nb, a_n, a_close, (char *)NULL);
        _exit(8);
    }
    close(in[0]);
    close(out[1]);
    char c = 0;
    ssize_t r = read(out[0], &c, 1);
    close(out[0]);
    if (r != 1 || c != 'r') {
        close(in[1]);
        int st = 0;
        waitpid(pid, &st, 0);
        fail_msg("reader process failed: %s %d", WIFEXITED(st) ? "exit" : "signal",
                 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
    return (reader_proc){pid, in[1]};
}

static void reader_end(reader_proc *r)
{
    close(r->to);
    int st = 0;
    assert_int_equal(waitpid(r->pid, &st, 0), r->pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* Shards A (oldest) and B (next), then newer shards until one more would
 * reach the capacity; then a reader process reads A (lookups lookups;
 * none: 0) and closes its handle or not; then the writer puts until it
 * evicts. With writer_first the writer itself read A before B was made
 * (its own, older, per-block times). Answers 1 when A is whole and B
 * gone, 0 when B is whole and A gone; anything else fails. */
static int evict_after_reader(unsigned long lookups, int close_it, int writer_first)
{
    char dir[300];
    kvx_store *s =
        su_store(dir, sizeof dir,
                 (su_spec){.capacity = EV_CAP, .shard_bytes = EV_SHARD, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    const uint64_t A = 500, B = 501;
    put_flush(s, A, 16);
    if (writer_first) assert_int_equal(su_served_prefix(s, A, 16), 16);
    put_flush(s, B, 16);
    uint64_t seq = 600;
    for (kvx_store_stats st = su_stat(s); st.bytes + 2 * (st.bytes / st.shards) <= EV_CAP; st = su_stat(s))
        put_flush(s, seq++, 16);
    assert_int_equal(su_stat(s).evictions, 0);
    reader_proc r = {-1, -1};
    if (lookups) r = reader_start(dir, A, 16, lookups, close_it);
    while (su_stat(s).evictions == 0 && seq < 640) put_flush(s, seq++, 16);
    assert_true(su_stat(s).evictions > 0);
    size_t a = su_served_prefix(s, A, 16), b = su_served_prefix(s, B, 16);
    if (lookups) reader_end(&r);
    kvx_store_close(s);
    if (a == 16 && b == 0) return 1;
    if (a == 0 && b == 16) return 0;
    fail_msg("after the eviction A serves %zu of 16 blocks, B %zu", a, b);
    return -1;
}

static void test_reader_use_reaches_writer_at_close(void **state)
{
    (void)state;
    /* 17 lookups, then close: A was used after B was made */
    assert_int_equal(evict_after_reader(17, 1, 0), 1);
}

static void test_reader_use_after_65536_lookups(void **state)
{
    (void)state;
    /* the reader's 65,536th lookup writes its usage; it never closes
     * before the eviction */
    assert_int_equal(evict_after_reader(65536, 0, 0), 1);
}

static void test_reader_use_controls(void **state)
{
    (void)state;
    /* no reader: the oldest, A, goes first */
    assert_int_equal(evict_after_reader(0, 0, 0), 0);
    /* a reader still open after 65,535 lookups has written nothing yet */
    assert_int_equal(evict_after_reader(65535, 0, 0), 0);
    /* the writer's own lookup of A, before B was made, is older than B */
    assert_int_equal(evict_after_reader(0, 0, 1), 0);
}

/* The writer read A before B was made (so it holds its own per-block
 * times for A, older than B); a reader reads A later and closes: the
 * reader's use is the newer one and must count. */
static void test_reader_use_after_writer_use(void **state)
{
    (void)state;
    assert_int_equal(evict_after_reader(17, 1, 1), 1);
}

int main(int argc, char **argv)
{
    if (argc == 7 && strcmp(argv[1], "--reader") == 0) return reader_main(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_evict_damaged_quarantined),
        cmocka_unit_test(test_compact_damaged_quarantined),
        cmocka_unit_test_teardown(test_keyed_name_collision, hook_reset),
        cmocka_unit_test(test_reader_use_reaches_writer_at_close),
        cmocka_unit_test(test_reader_use_after_65536_lookups),
        cmocka_unit_test(test_reader_use_controls),
        cmocka_unit_test(test_reader_use_after_writer_use),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
