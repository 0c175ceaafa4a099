/*
 * holes.c - engine/store_holes.c and eviction in place (KVX_STORE_HOLES,
 * docs/STORE.md "Holes"): the coldest blocks go one at a time, each page
 * freed by a durable free log record and then punched; every other block
 * is served byte for byte; a freed page is a miss and never damage (verify,
 * gc, a reopen without the flag, reindex); a view held across an eviction
 * keeps its bytes; a read-only handle of another process puts punches off.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvx.h"
#include "engine/store.h"
#include "format/format.h"
#include "lib/commit_fault.h"
#include "lib/fault.h"
#include "lib/store.h"

#define NB 64                    /* blocks a sequence */
#define CAP ((uint64_t)16 << 20) /* 16 MiB: about 3,800 blocks (a 64-byte page takes 4 KiB), 60 sequences */
#define HOLES (KVX_STORE_NOWAIT | KVX_STORE_HOLES)

/* Every sequence 0..n-1 is served whole, or as a shorter prefix (its cold
 * blocks evicted), every served block byte for byte: the count of whole
 * ones. Sequences in hot (nullable, n of them) must be whole. */
static size_t check_all(kvx_store *s, uint64_t n, const uint8_t *hot)
{
    size_t whole = 0;
    for (uint64_t q = 0; q < n; q++) {
        size_t got = su_served_prefix(s, q, NB);
        assert_true(got != SIZE_MAX); /* never a wrong block */
        if (hot && hot[q]) assert_int_equal(got, NB);
        whole += got == NB;
    }
    return whole;
}

/* Puts sequences from..to-1, reading every hot one after each put (so an
 * LRU keeps them). */
static void fill(kvx_store *s, uint64_t from, uint64_t to, const uint8_t *hot, uint64_t nhot)
{
    for (uint64_t q = from; q < to; q++) {
        su_put_flush(s, q, NB);
        for (uint64_t h = 0; h < nhot && h <= q; h++)
            if (hot[h]) {
                size_t got = su_served_prefix(s, h, NB);
                assert_int_equal(got, NB);
            }
    }
}

typedef struct notes {
    int freed, problems;
} notes;

static void note_count(void *ctx, const char *what, int code)
{
    notes *n = ctx;
    if (code) n->problems++;
    else if (strstr(what, "freed in place")) n->freed++;
}

/* PROMISE: STORE-26 */
static void test_evicts_cold_pages_in_place(void **state)
{
    (void)state;
    char dir[512];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = CAP, .flags = HOLES});
    uint8_t hot[200] = {0};
    for (int q = 0; q < 4; q++) hot[q] = 1;
    fill(s, 0, 200, hot, 4);
    /* pages were freed in place, and punched */
    assert_true(s->nfreed > 0);
    assert_true(s->punched > 0);
    assert_int_equal(su_exists(dir, "", "FREED"), 1);
    /* the store is within its capacity */
    kvx_store_stats st = su_stat(s);
    uint64_t live = 0, freed = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++) live += kvx_st_live_bytes(s, b);
    for (uint32_t b = 0; b < ST_SLOTS; b++) freed += s->reg->live[b] ? s->freed_bytes[b] : 0;
    assert_true(live <= CAP);
    /* stat: the files' sizes count the freed pages, freed_bytes names them,
     * and what is left is what the capacity holds */
    assert_true(st.freed_bytes > 0);
    assert_int_equal(st.freed_bytes, freed);
    assert_int_equal(st.bytes - st.freed_bytes, live);
    /* no live shard is left with every page freed: it went whole */
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!s->reg->live[b]) continue;
        uint32_t left = 0;
        for (uint32_t i = 0; i < s->reg->rec[b].n_entries; i++) left += !kvx_st_freed(s, s->reg->rec[b].gen, i);
        assert_true(left > 0);
    }
    /* hot sequences whole, every block served right, some cold gone */
    size_t whole = check_all(s, 200, hot);
    assert_true(whole < 200);
    assert_true(whole >= 4);
    /* evictions reported, each block once */
    kvx_evicted ev[4096];
    size_t nev = 0;
    uint64_t dropped = 0;
    assert_int_equal(kvx_store_evicted(s, ev, 4096, &nev, &dropped), 0);
    assert_true(nev > 0);
    su_verify_clean(s);
    /* verify names the freed pages apart, as notes */
    notes n = {0, 0};
    uint64_t bad = 9;
    assert_int_equal(kvx_store_verify(s, &bad, note_count, &n), 0);
    assert_int_equal(bad, 0);
    assert_true(n.freed > 0);
    assert_int_equal(n.problems, 0);
    kvx_store_close(s);
    /* a reader's stat reads the free log: the same freed bytes */
    kvx_store *r = NULL;
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
    kvx_store_stats rst = su_stat(r);
    assert_int_equal(rst.freed_bytes, st.freed_bytes);
    assert_int_equal(rst.bytes, st.bytes);
    kvx_store_close(r);
    /* a damaged log leaves the other counters readable: freed_bytes 0 */
    char fp[600];
    snprintf(fp, sizeof fp, "%s/FREED", dir);
    struct stat fst;
    assert_int_equal(stat(fp, &fst), 0);
    uint8_t head[8];
    int fd = open(fp, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, head, sizeof head, 0), (ssize_t)sizeof head);
    assert_int_equal(pwrite(fd, "garbage!", 8, 0), 8);
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
    rst = su_stat(r);
    assert_int_equal(rst.freed_bytes, 0);
    assert_int_equal(rst.bytes, st.bytes);
    assert_int_equal(rst.blocks, st.blocks);
    kvx_store_close(r);
    assert_int_equal(pwrite(fd, head, sizeof head, 0), (ssize_t)sizeof head); /* mended for what follows */
    close(fd);
    /* reopened without the flag: the same blocks served, the freed ones
     * misses; verify clean; a reindex adopts no freed page */
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(check_all(s, 200, hot), whole);
    su_verify_clean(s);
    assert_int_equal(kvx_store_reindex(s), 0);
    assert_int_equal(check_all(s, 200, hot), whole);
    su_verify_clean(s);
    assert_int_equal(kvx_store_gc(s), 0);
    assert_int_equal(check_all(s, 200, hot), whole);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* Every freed page's extent is a hole (SEEK_DATA skips it): its blocks
 * are no longer allocated, while the file keeps its size. */
/* PROMISE: STORE-26 */
static void test_punched_extents_are_free(void **state)
{
    (void)state;
    char dir[512];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = CAP, .flags = HOLES});
    uint8_t hot[1] = {0};
    fill(s, 0, 200, hot, 0);
    assert_true(s->punched > 0);
    size_t checked = 0;
    for (size_t i = 0; i < s->nfreed; i++) {
        st_freed_row *r = &s->freed[i];
        if (!r->punched) continue;
        int b = -1;
        for (int x = 0; x < ST_SLOTS; x++)
            if (s->reg->live[x] && s->reg->rec[x].gen == r->gen) b = x;
        assert_true(b >= 0);
        kvx_shard *sh = kvx_st_shard_get(s, (uint32_t)b, r->gen);
        assert_non_null(sh);
        kvx_page_span sp;
        assert_int_equal(kvx_shard_page_span(&sp, sh, r->entry), 0);
        off_t d = lseek(sp.fd, (off_t)sp.offset, SEEK_DATA);
        struct stat st;
        assert_int_equal(fstat(sp.fd, &st), 0);
        assert_true((uint64_t)st.st_size > sp.offset); /* the size is kept */
        /* the next data lies past the page's extent, or there is none */
        assert_true(d < 0 ? errno == ENXIO : (uint64_t)d >= sp.offset + kvx_align_up(sp.bytes, 4096));
        kvx_shard_close(sh);
        checked++;
    }
    assert_true(checked > 0);
    kvx_store_close(s);
}

static unsigned store_version(const char *dir)
{
    unsigned v = 0, k = 0;
    su_store_version(dir, &v, &k);
    return v;
}

/* The STORE file's version: 5 once a writer that frees pages in place has
 * had the store (a release before holes refuses it); no open lowers it. */
/* PROMISE: STORE-26 */
static void test_store_version_marks_holes(void **state)
{
    (void)state;
    char dir[512];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = CAP, .flags = KVX_STORE_NOWAIT});
    su_put_flush(s, 1, NB);
    kvx_store_close(s);
    assert_int_equal(store_version(dir), 4);
    /* the first writer with the flag: DIR/READERS made, nothing freed in
     * place this session (a reader opened before the file holds no lock) */
    s = su_reopen(dir, HOLES);
    assert_int_equal(store_version(dir), 5);
    assert_int_equal(s->holes, 0);
    assert_int_equal(su_exists(dir, "", "READERS"), 1);
    kvx_store_close(s);
    s = su_reopen(dir, HOLES);
    assert_int_equal(s->holes, 1);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT); /* without the flag: stays 5 */
    assert_int_equal(su_served_prefix(s, 1, NB), NB);
    kvx_store_close(s);
    assert_int_equal(store_version(dir), 5);
    /* a reader changes nothing: no READERS made where there is none */
    s = su_store(dir, sizeof dir, (su_spec){.capacity = CAP, .flags = KVX_STORE_NOWAIT});
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_READONLY);
    kvx_store_close(s);
    assert_int_equal(su_exists(dir, "", "READERS"), 0);
    /* a writer's flag only */
    kvx_store *r = NULL;
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY | KVX_STORE_HOLES), KVX_EINVALID);
}

/* Puts one sequence at a time until an eviction freed pages; returns the
 * next sequence number. */
static uint64_t fill_until_freed(kvx_store *s, uint64_t from, const uint8_t *hot, uint64_t nhot)
{
    size_t before = s->nfreed;
    uint64_t q = from;
    while (s->nfreed == before) {
        fill(s, q, q + 1, hot, nhot);
        q++;
        assert_true(q < from + 400);
    }
    return q;
}

/* A store with holes made at a fresh path (into dir), filled until its
 * eviction has freed pages in place times times, then closed: the next
 * sequence to put. */
static uint64_t store_freed(char *dir, size_t cap, int times)
{
    kvx_store *s = su_store(dir, cap, (su_spec){.capacity = CAP, .flags = HOLES});
    uint8_t none[1] = {0};
    uint64_t q = 0;
    for (int k = 0; k < times; k++) q = fill_until_freed(s, q, none, 0);
    kvx_store_close(s);
    return q;
}

/* Every entry of every live shard of r is freed by the free log, or
 * served by its hash with the bytes put (what names the case). */
static void entries_freed_or_served(kvx_store *r, const char *what)
{
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!r->reg->live[b]) continue;
        kvx_shard *sh = kvx_st_shard_get(r, b, r->reg->rec[b].gen);
        assert_non_null(sh);
        for (uint32_t i = 0; i < r->reg->rec[b].n_entries; i++) {
            kvx_entry e;
            assert_int_equal(kvx_shard_entry(&e, sh, i), 0);
            if (kvx_st_freed(r, r->reg->rec[b].gen, i)) continue;
            kvx_view v;
            if (kvx_store_get_hash(&v, r, e.hash))
                fail_msg("%s: shard %u entry %u, not freed, not served: %s", what, b, i, kvx_last_error());
            uint8_t want[64];
            su_page(want, sizeof want, e.hash);
            assert_memory_equal(v.page, want, sizeof want);
            kvx_view_release(&v);
        }
        kvx_shard_close(sh);
    }
}

/* A view held across the eviction of its block keeps its bytes: the punch
 * waits for the view to go, then lands at a later eviction. */
/* PROMISE: STORE-27 */
static void test_view_held_across_eviction(void **state)
{
    (void)state;
    char dir[512];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = CAP, .flags = HOLES});
    uint8_t none[1] = {0};
    uint64_t q = fill_until_freed(s, 0, none, 0);
    /* views of the newest sequence's blocks: evicted later, once cold */
    uint64_t held = q - 1;
    uint32_t t[NB * SU_B];
    uint64_t h[NB];
    su_tokens(t, held, NB, 0);
    kvx_block_hashes(h, t, NB * SU_B, SU_B);
    kvx_view v[NB];
    size_t n = 0;
    assert_int_equal(kvx_store_prefix(v, &n, s, t, NB * SU_B, NB), 0);
    assert_true(n > 0);
    uint64_t deferred = s->punch_deferred, punched = s->punched;
    /* the held sequence's blocks are now the newest: age them behind many puts */
    for (int k = 0; k < 80; k++) q = fill_until_freed(s, q, none, 0);
    assert_int_equal(su_served_prefix(s, held, NB), 0); /* evicted: a miss for lookups */
    assert_true(s->punch_deferred > deferred);          /* its shard's punch waited */
    for (size_t i = 0; i < n; i++) {
        uint8_t want[64];
        su_page(want, sizeof want, h[i]);
        assert_memory_equal(v[i].page, want, sizeof want); /* the held views' bytes */
    }
    kvx_views_release(v, n);
    q = fill_until_freed(s, q, none, 0);
    assert_true(s->punched > punched);
    size_t left = 0;
    for (size_t i = 0; i < s->nfreed; i++) left += !s->freed[i].punched;
    assert_int_equal(left, 0); /* every freed page punched once no view held it */
    su_verify_clean(s);
    kvx_store_close(s);
}

/* A read-only handle in a child process: open (then a byte on done),
 * held until a byte on go, then 200 prefixes read and closed; the child
 * exits 0 when every block it was served was right. */
typedef struct reader_child {
    pid_t pid;
    int go, done; /* the parent's ends */
} reader_child;

static reader_child reader_spawn(const char *dir)
{
    int go[2], done[2];
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(done), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(go[1]);
        close(done[0]);
        kvx_store *r = NULL;
        if (kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY) != 0) {
            fprintf(stderr, "reader: open: %s\n", kvx_last_error());
            _exit(2);
        }
        char c = 1;
        if (write(done[1], &c, 1) != 1) _exit(3);
        if (read(go[0], &c, 1) != 1) _exit(4); /* held open until told */
        int bad = 0;
        for (uint64_t k = 0; k < 200; k++) bad |= su_served_prefix(r, k, NB) == SIZE_MAX;
        kvx_store_close(r);
        _exit(bad ? 5 : 0);
    }
    close(go[0]); /* the child's ends: a child that dies is an end of file here */
    close(done[1]);
    char c;
    assert_int_equal(read(done[0], &c, 1), 1);
    return (reader_child){pid, go[1], done[0]};
}

static void reader_finish(reader_child *rc)
{
    char c = 1;
    assert_int_equal(write(rc->go, &c, 1), 1);
    int ws = 0;
    assert_int_equal(waitpid(rc->pid, &ws, 0), rc->pid);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    close(rc->go);
    close(rc->done);
}

/* While the reader is open, s frees nothing in place (eviction by whole
 * shards, the store within its capacity); q: the next sequence to put. */
static uint64_t fill_beside_reader(kvx_store *s, uint64_t q)
{
    uint8_t none[1] = {0};
    uint64_t punched = s->punched;
    uint32_t records = s->flog.records;
    uint64_t ev0 = su_stat(s).evictions;
    fill(s, q, q + 40, none, 0);
    assert_int_equal(s->punched, punched);
    assert_int_equal(s->flog.records, records); /* nothing more freed in place */
    assert_true(su_stat(s).evictions > ev0);
    uint64_t live = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++) live += kvx_st_live_bytes(s, b);
    assert_true(live <= CAP);
    return q + 40;
}

/* While a read-only handle of another process is open, nothing is freed
 * in place (eviction takes whole shards, the store within its capacity);
 * its lookups are byte-exact throughout; once it closes, the next
 * eviction frees pages in place and punches them. */
/* PROMISE: STORE-27 */
static void test_reader_process_defers_punches(void **state)
{
    (void)state;
    char dir[512];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = CAP, .flags = HOLES});
    uint8_t none[1] = {0};
    uint64_t q = fill_until_freed(s, 0, none, 0);
    reader_child r = reader_spawn(dir);
    /* while it is open: no page freed in place (its views could be under
     * a punch), eviction by whole shards, so the disk stays bounded */
    uint64_t punched = s->punched;
    q = fill_beside_reader(s, q);
    reader_finish(&r);
    q = fill_until_freed(s, q, none, 0);
    assert_true(s->punched > punched);
    kvx_store_close(s);
}

/* DIR/READERS removed by hand while a reader holds it: the next writer
 * makes a new one the reader does not hold, yet a later writer still sees
 * the reader (its shared lock on shards/) and frees nothing in place
 * until it closes. */
/* PROMISE: STORE-27 */
static void test_readers_file_removed_by_hand(void **state)
{
    (void)state;
    char dir[512];
    uint64_t q = store_freed(dir, sizeof dir, 1);
    uint8_t none[1] = {0};
    kvx_store *s;
    reader_child r = reader_spawn(dir);
    char path[600];
    snprintf(path, sizeof path, "%s/READERS", dir);
    assert_int_equal(unlink(path), 0);
    s = su_reopen(dir, HOLES); /* makes a new READERS: frees nothing in place this session */
    assert_int_equal(access(path, F_OK), 0);
    kvx_store_close(s);
    s = su_reopen(dir, HOLES); /* holds the new READERS alone: the reader is still there */
    uint64_t punched = s->punched;
    q = fill_beside_reader(s, q);
    reader_finish(&r);
    q = fill_until_freed(s, q, none, 0);
    assert_true(s->punched > punched);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* Views of every sequence r serves now (at most max), into v (NB a
 * sequence), their hashes into h: how many views in all. */
static size_t views_of_all(kvx_store *r, uint64_t nseq, kvx_view *v, uint64_t *h, size_t max)
{
    size_t all = 0;
    for (uint64_t q = 0; q < nseq && all + NB <= max; q++) {
        uint32_t t[NB * SU_B];
        su_tokens(t, q, NB, 0);
        kvx_block_hashes(h + all, t, NB * SU_B, SU_B);
        size_t n = 0;
        assert_int_equal(kvx_store_prefix(v + all, &n, r, t, NB * SU_B, NB), 0);
        all += n;
    }
    return all;
}

static void views_intact(const kvx_view *v, const uint64_t *h, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t want[64];
        su_page(want, sizeof want, h[i]);
        if (memcmp(v[i].page, want, sizeof want) != 0)
            fail_msg("view %zu of %zu (block %016llx) reads other bytes than its block's", i, n,
                     (unsigned long long)h[i]);
    }
}

/* A view outlives its store's close (kvx.h, STORE-5), and a punch never
 * lands under it: a read-only handle's views held past kvx_store_close,
 * then a writer's, each keep the readers' locks until released. Before
 * the fix, the close let the locks go and the next writer punched under
 * the views (all-zero pages). */
/* PROMISE: STORE-27 */
static void test_views_outlive_close(void **state)
{
    (void)state;
    char dir[512];
    uint64_t q = store_freed(dir, sizeof dir, 1);
    uint8_t none[1] = {0};
    kvx_store *s;
    enum { MAXV = 64 * NB };
    kvx_view *v = calloc(MAXV, sizeof *v);
    uint64_t *h = calloc(MAXV, sizeof *h);
    assert_non_null(v);
    assert_non_null(h);
    for (int writer = 0; writer < 2; writer++) {
        kvx_store *r = writer ? su_reopen(dir, HOLES) : NULL;
        if (!writer) assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
        size_t n = views_of_all(r, q, v, h, MAXV);
        assert_true(n > NB);
        kvx_store_close(r); /* the views stay */
        s = su_reopen(dir, HOLES);
        uint64_t punched = s->punched;
        q = fill_beside_reader(s, q); /* evicts their blocks, frees nothing in place */
        views_intact(v, h, n);
        kvx_views_release(v, n); /* the last view: the locks go */
        q = fill_until_freed(s, q, none, 0);
        assert_true(s->punched > punched);
        su_verify_clean(s);
        kvx_store_close(s);
    }
    free(v);
    free(h);
}

/* A freed page is a miss, never damage; a page that rots beside it still
 * is damage; a damaged free log turns the pages it freed into damage,
 * reported, never served. */
/* PROMISE: STORE-26 */
static void test_damage_beside_holes(void **state)
{
    (void)state;
    char dir[512];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = CAP, .flags = HOLES});
    uint8_t none[1] = {0};
    uint64_t q = fill_until_freed(s, 0, none, 0);
    for (int k = 0; k < 10; k++) q = fill_until_freed(s, q, none, 0);
    /* a live page of a shard with holes rots */
    uint64_t gen = s->freed[0].gen;
    uint32_t live = UINT32_MAX;
    int b = -1;
    for (int x = 0; x < ST_SLOTS; x++)
        if (s->reg->live[x] && s->reg->rec[x].gen == gen) b = x;
    assert_true(b >= 0);
    for (uint32_t i = 0; i < s->reg->rec[b].n_entries && live == UINT32_MAX; i++)
        if (!kvx_st_freed(s, gen, i)) live = i;
    assert_true(live != UINT32_MAX);
    kvx_store_close(s);
    char path[700], name[32];
    snprintf(name, sizeof name, "%016llx.kvx", (unsigned long long)gen);
    snprintf(path, sizeof path, "%s/shards/%s", dir, name);
    assert_int_equal(su_flip_page_byte(path, live), 0);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    uint64_t bad = 0;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), KVX_ECORRUPT);
    assert_int_equal(bad, 1); /* the rotted page only, not the freed ones */
    for (uint64_t k = 0; k < q; k++) assert_true(su_served_prefix(s, k, NB) != SIZE_MAX);
    kvx_store_close(s);
    /* the free log's first record damaged: its pages read as damage */
    snprintf(path, sizeof path, "%s/FREED", dir);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t x;
    assert_int_equal(pread(fd, &x, 1, KVX_FREE_HEADER_BYTES + 30), 1);
    x ^= 0x10;
    assert_int_equal(pwrite(fd, &x, 1, KVX_FREE_HEADER_BYTES + 30), 1);
    close(fd);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), KVX_ECORRUPT);
    assert_true(bad > 1);
    for (uint64_t k = 0; k < q; k++) assert_true(su_served_prefix(s, k, NB) != SIZE_MAX);
    kvx_store_close(s);
}


/* A copy of the store at base, at a fresh path (into dir). */
static void store_copy(const char *base, char *dir, size_t cap)
{
    char cmd[1200];
    su_new_dir(dir, cap);
    snprintf(cmd, sizeof cmd, "cp -a '%s' '%s'", base, dir);
    assert_int_equal(system(cmd), 0);
}

/* A catalog commit that fails after the free record is durable, at each
 * commit of the flushes up to one whose eviction frees pages in place:
 * the writer goes on (its flushes evict whole shards from then on) and
 * serves only byte-exact blocks (a freed page the catalog still names is
 * never punched, so it is served with its bytes or not at all); the flush
 * that evicted lands (eviction is its tidy-up, after its own commit); the
 * last acknowledged flush is whole; the next writer's open takes the freed
 * pages out of the catalog (every entry of every live shard freed by the
 * log or served, verify clean, the last acknowledged flush whole), and
 * frees in place again. */
/* PROMISE: STORE-29 */
static void test_catalog_commit_fails_after_free_record(void **state)
{
    (void)state;
    char base[512];
    uint8_t none[1] = {0};
    uint64_t q = store_freed(base, sizeof base, 2);
    int after_record = 0;
    for (long k = 1; k < 60; k++) {
        char dir[512], what[64];
        store_copy(base, dir, sizeof dir);
        snprintf(what, sizeof what, "commit %ld", k);
        kvx_store *c = su_reopen(dir, HOLES);
        size_t before = c->nfreed;
        cf_arm(k);
        uint64_t x = q, acked = UINT64_MAX;
        int failed = 0;
        for (; x < q + 400 && !(c->nfreed > before && failed) && !(c->nfreed > before && cf_calls >= k); x++) {
            int rc = su_put_seq(c, x, NB);
            if (rc == 0) acked = x;
            failed |= rc != 0;
        }
        kvx_idx_commit_fault = NULL;
        int hit = cf_calls >= k;
        int record_then_fail = hit && c->nfreed > before && !c->holes; /* the free record durable, its commit not */
        after_record += record_then_fail;
        /* eviction is the flush's tidy-up, after its own commit: the flush lands */
        if (record_then_fail && (failed || acked != x - 1)) fail_msg("%s: the flush that evicted failed", what);
        /* the same writer: never a wrong block */
        for (uint64_t y = 0; y < x; y++)
            if (su_served_prefix(c, y, NB) == SIZE_MAX)
                fail_msg("%s: sequence %llu served a wrong block", what, (unsigned long long)y);
        for (size_t f = 0; f < c->nfreed; f++) {
            uint32_t b = UINT32_MAX;
            for (uint32_t bb = 0; bb < ST_SLOTS; bb++)
                if (c->reg->live[bb] && c->reg->rec[bb].gen == c->freed[f].gen) b = bb;
            if (b == UINT32_MAX) continue;
            kvx_shard *sh = kvx_st_shard_get(c, b, c->freed[f].gen);
            kvx_entry e;
            assert_int_equal(kvx_shard_entry(&e, sh, c->freed[f].entry), 0);
            kvx_shard_close(sh);
            kvx_view v;
            int g = kvx_store_get_hash(&v, c, e.hash);
            if (g != 0 && g != KVX_ENOTFOUND) /* a miss at worst, never damage */
                fail_msg("%s: freed page (shard %u entry %u): %s", what, b, c->freed[f].entry, kvx_last_error());
            if (g == 0) { /* the catalog still names it: never punched */
                uint8_t want[64];
                su_page(want, sizeof want, e.hash);
                if (memcmp(v.page, want, sizeof want))
                    fail_msg("%s: freed page (shard %u entry %u) served with other bytes", what, b, c->freed[f].entry);
                kvx_view_release(&v);
            }
        }
        if (acked != UINT64_MAX && su_served_prefix(c, acked, NB) != NB)
            fail_msg("%s: sequence %llu, acknowledged, not whole", what, (unsigned long long)acked);
        su_verify_clean(c); /* nothing the catalog names was punched */
        /* and it goes on: a flush after the failure lands */
        assert_int_equal(su_put_seq(c, q + 500, NB), 0);
        acked = q + 500;
        kvx_store_close(c);
        /* the next writer mends the catalog, then frees in place again */
        kvx_store *r = su_reopen(dir, HOLES);
        entries_freed_or_served(r, what);
        su_verify_clean(r);
        if (su_served_prefix(r, acked, NB) != NB)
            fail_msg("%s: sequence %llu, acknowledged, not whole after reopening", what, (unsigned long long)acked);
        assert_true(r->holes);
        fill_until_freed(r, q + 600, none, 0);
        su_verify_clean(r);
        kvx_store_close(r);
        su_rm_rf(dir);
        if (!hit) break;
    }
    assert_true(after_record > 0);
}

/* kill -9 at every OS call of the flushes up to one whose eviction frees
 * pages in place: after reopening (and after a reindex from the files
 * alone), every block served is byte-exact, every entry of every live
 * shard is either freed by the free log or served, every acknowledged
 * flush is whole, and verify is clean. */
/* PROMISE: STORE-28 */
static void test_kill_at_each_step_of_a_free(void **state)
{
    (void)state;
    char base[512];
    uint64_t q = store_freed(base, sizeof base, 2);
    int killed_inside = 0;
    for (long k = 1; k < 400; k++) {
        int hit = 0;
        for (int reindex = 0; reindex < 2; reindex++) {
            char dir[512];
            store_copy(base, dir, sizeof dir);
            int pfd[2];
            assert_int_equal(pipe(pfd), 0);
            fflush(NULL);
            pid_t pid = fork();
            assert_true(pid >= 0);
            if (pid == 0) {
                close(pfd[0]);
                kvx_store *c = NULL;
                if (kvx_store_open(&c, dir, NULL, HOLES) != 0) _exit(2);
                /* the next sequences until one flush frees pages in place;
                 * the kill at call k of the whole run */
                fault_install();
                fault_reset(k, 0, FAULT_KILL);
                size_t before = c->nfreed;
                uint64_t x = q;
                for (; c->nfreed == before && x < q + 400; x++) {
                    if (su_put_seq(c, x, NB) != 0) _exit(3);
                    uint64_t w = x;
                    if (write(pfd[1], &w, sizeof w) != sizeof w) _exit(4); /* acknowledged */
                }
                fault_uninstall();
                _exit(c->nfreed > before ? 0 : 5);
            }
            close(pfd[1]);
            uint64_t acked = UINT64_MAX, w;
            while (read(pfd[0], &w, sizeof w) == sizeof w) acked = w;
            close(pfd[0]);
            int ws = 0;
            assert_int_equal(waitpid(pid, &ws, 0), pid);
            int was_killed = WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL;
            if (!was_killed && !(WIFEXITED(ws) && WEXITSTATUS(ws) == 0))
                fail_msg("call %ld: child status %d", k, WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
            hit |= was_killed;
            if (reindex) assert_int_equal(kvx_store_reindex_dir(dir, KVX_STORE_NOWAIT), 0);
            kvx_store *r = su_reopen(dir, HOLES);
            uint64_t top = acked == UINT64_MAX ? q : acked + 2;
            for (uint64_t x = 0; x < top; x++) {
                size_t got = su_served_prefix(r, x, NB);
                if (got == SIZE_MAX)
                    fail_msg("call %ld%s: sequence %llu served a wrong block", k, reindex ? " (reindex)" : "",
                             (unsigned long long)x);
                if (acked != UINT64_MAX && x == acked && x >= q && got != NB)
                    fail_msg("call %ld%s: sequence %llu, flushed, not whole (%zu)", k, reindex ? " (reindex)" : "",
                             (unsigned long long)x, got);
            }
            char what[64];
            snprintf(what, sizeof what, "call %ld%s", k, reindex ? " (reindex)" : "");
            entries_freed_or_served(r, what);
            su_verify_clean(r);
            kvx_store_close(r);
            killed_inside += was_killed;
            su_rm_rf(dir);
        }
        if (!hit) break;
    }
    assert_true(killed_inside > 10);
}

/* Not a free log at DIR/FREED: a writer's open names it and refuses
 * (KVX_EPATH for a directory, FIFO or symlink, never read through or
 * blocked on; KVX_EMAGIC for another file); nothing in the store changes. */
/* PROMISE: STORE-26 */
static void test_strange_things_at_freed(void **state)
{
    (void)state;
    char dir[512], p[700];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = CAP, .flags = HOLES});
    su_put_flush(s, 1, NB);
    kvx_store_close(s);
    snprintf(p, sizeof p, "%s/FREED", dir);
    kvx_store *w = NULL;
    assert_int_equal(mkdir(p, 0700), 0);
    assert_int_equal(kvx_store_open(&w, dir, NULL, HOLES), KVX_EPATH);
    assert_non_null(strstr(kvx_last_error(), "FREED"));
    rmdir(p);
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_equal(kvx_store_open(&w, dir, NULL, HOLES), KVX_EPATH);
    unlink(p);
    assert_int_equal(symlink("/dev/zero", p), 0);
    assert_int_equal(kvx_store_open(&w, dir, NULL, HOLES), KVX_EPATH);
    unlink(p);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("not a free log, but long enough to hold its 64-byte header....................", f);
    fclose(f);
    assert_int_equal(kvx_store_open(&w, dir, NULL, HOLES), KVX_EMAGIC);
    unlink(p);
    /* every block still there once it is gone */
    s = su_reopen(dir, HOLES);
    assert_int_equal(su_served_prefix(s, 1, NB), NB);
    kvx_store_close(s);
}

/* A file system without holes (fallocate EOPNOTSUPP): the pages are freed
 * (misses), the store goes on evicting whole shards, every block served is
 * right and verify is clean. */
static int no_holes(int fd, int mode, off_t off, off_t len)
{
    (void)fd, (void)mode, (void)off, (void)len;
    errno = EOPNOTSUPP;
    return -1;
}

/* PROMISE: STORE-26 */
static void test_no_punch_on_this_file_system(void **state)
{
    (void)state;
    char dir[512];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = CAP, .flags = HOLES});
    uint8_t none[1] = {0};
    kvx_os.fallocate = no_holes;
    uint64_t q = fill_until_freed(s, 0, none, 0);
    kvx_os_reset();
    assert_int_equal(s->punched, 0);
    assert_int_equal(s->holes, 0); /* whole shards from here */
    fill(s, q, q + 40, none, 0);
    for (uint64_t k = 0; k < q + 40; k++) assert_true(su_served_prefix(s, k, NB) != SIZE_MAX);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* Warmup of a store with holes (kvx_warmup_collect's handles, the whole
 * shards): every freed page skipped, every other page read and checked,
 * no failure; a fetch's entry check (kvx_shard_absent) says the same. */
/* PROMISE: STORE-26 */
static void test_warmup_skips_freed_pages(void **state)
{
    (void)state;
    char dir[512];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = CAP, .flags = HOLES});
    uint8_t none[1] = {0};
    uint64_t q = fill_until_freed(s, 0, none, 0);
    for (int k = 0; k < 5; k++) q = fill_until_freed(s, q, none, 0);
    size_t nfreed = s->nfreed;
    assert_true(nfreed > 0);
    kvx_store_close(s);
    const char *paths[] = {dir};
    kvx_shard **sh = NULL;
    size_t n = 0;
    assert_int_equal(kvx_warmup_collect(&sh, &n, paths, 1), 0);
    uint64_t pages = 0, absent = 0;
    for (size_t i = 0; i < n; i++)
        for (uint32_t e = 0; e < kvx_shard_get_info(sh[i])->num_blocks; e++) {
            pages++;
            absent += (uint64_t)kvx_shard_absent(sh[i], e);
        }
    assert_int_equal(absent, nfreed);
    kvx_warmup_options o;
    kvx_warmup_options_init(&o);
    kvx_warmup_report rep;
    assert_int_equal(kvx_warmup_run(&rep, sh, n, &o), 0);
    assert_int_equal(rep.pages, pages - absent);
    assert_int_equal(rep.crc_failures, 0);
    assert_int_equal(rep.io_failures, 0);
    kvx_warmup_report_free(&rep);
    for (size_t i = 0; i < n; i++) kvx_shard_close(sh[i]);
    kvx_free(sh);
}

/* Does the file system under dir free a punched range? */
static int fs_punches(const char *dir)
{
    char p[600];
    snprintf(p, sizeof p, "%s/punch-probe", dir);
    int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return 0;
    static char buf[65536];
    memset(buf, 1, sizeof buf);
    int ok = write(fd, buf, sizeof buf) == (ssize_t)sizeof buf && fsync(fd) == 0 &&
             fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, sizeof buf) == 0;
    close(fd);
    unlink(p);
    return ok;
}

int main(void)
{
    if (su_setup(NULL) != 0 || !fs_punches(su_root)) {
        fprintf(stderr, "holes: %s takes no FALLOC_FL_PUNCH_HOLE: skipped\n", su_root);
        su_teardown(NULL);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_evicts_cold_pages_in_place),
        cmocka_unit_test(test_punched_extents_are_free),
        cmocka_unit_test(test_store_version_marks_holes),
        cmocka_unit_test(test_view_held_across_eviction),
        cmocka_unit_test(test_reader_process_defers_punches),
        cmocka_unit_test(test_readers_file_removed_by_hand),
        cmocka_unit_test(test_views_outlive_close),
        cmocka_unit_test(test_damage_beside_holes),
        cmocka_unit_test(test_kill_at_each_step_of_a_free),
        cmocka_unit_test(test_catalog_commit_fails_after_free_record),
        cmocka_unit_test(test_strange_things_at_freed),
        cmocka_unit_test(test_no_punch_on_this_file_system),
        cmocka_unit_test(test_warmup_skips_freed_pages),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
