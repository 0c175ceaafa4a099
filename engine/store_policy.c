/*
 * store_policy.c - the pure parts of eviction and compaction: the LRU
 * cut, the victims' order, when to stop, how much to carry, which shards
 * to merge. No files, no catalog, no locks: unit-tested on plain arrays
 * (tests/engine/policy.c).
 *
 * Rule: eviction always frees room (it carries at most half of what it
 * frees) and keeps what an exact LRU of the goal's size would keep, as far
 * as whole shards allow, except the oldest fifth of that: a block that
 * close to the cut would be carried again at the next eviction, and the
 * next (measured: 0.74 bytes carried per byte put on the conversation
 * trace at 4,096 blocks, for no gain in hits).
 */
#include "store.h"

#include <stdlib.h>
#include <string.h>

int kvx_st_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int kvx_st_cmp_move_age(const void *a, const void *b)
{
    const st_move *x = a, *y = b;
    if (x->last_use != y->last_use) return x->last_use < y->last_use ? -1 : 1;
    return x->src_coord < y->src_coord ? -1 : x->src_coord > y->src_coord;
}

/* Newest first; equal recency in coordinate order (a parent before its
 * child), so truncating keeps whole prefixes. */
int kvx_st_cmp_move_hot(const void *a, const void *b)
{
    const st_move *x = a, *y = b;
    if (x->last_use != y->last_use) return x->last_use > y->last_use ? -1 : 1;
    return x->src_coord < y->src_coord ? -1 : x->src_coord > y->src_coord;
}

/* A live shard's eviction order key. */
typedef struct st_victim {
    uint32_t b;
    double cold; /* fraction of entries an exact LRU would evict now */
    double mean; /* mean recency */
} st_victim;

static int st_cmp_victim(const void *a, const void *b)
{
    const st_victim *x = a, *y = b;
    if (x->cold != y->cold) return x->cold > y->cold ? -1 : 1;
    if (x->mean != y->mean) return x->mean < y->mean ? -1 : 1;
    return x->b < y->b ? -1 : x->b > y->b;
}

uint64_t kvx_st_evict_goal(uint64_t capacity) { return capacity - capacity / 64; }

uint64_t kvx_st_evict_keep(uint64_t goal, uint64_t pending, uint64_t live_bytes, uint64_t nblocks)
{
    if (goal <= pending || nblocks == 0 || live_bytes == 0) return 0;
    return (uint64_t)((double)(goal - pending) / ((double)live_bytes / (double)nblocks));
}

uint64_t kvx_st_evict_cut(uint64_t *all, size_t n, uint64_t keep)
{
    if (keep >= n) return 0;
    qsort(all, n, sizeof *all, kvx_st_cmp_u64);
    return all[n - keep - 1];
}

uint64_t kvx_st_carry_cut(const uint64_t *sorted, size_t n, uint64_t keep)
{
    uint64_t hot = keep / 100 * ST_CARRY_HOT_PCT + keep % 100 * ST_CARRY_HOT_PCT / 100;
    if (hot >= n) return 0;
    return sorted[n - hot - 1];
}

int kvx_st_evict_order(uint32_t *order, const st_pshard *sh, uint64_t cut)
{
    st_victim v[ST_SLOTS];
    int no = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!sh[b].live) continue;
        uint32_t n = sh[b].n, cold = 0;
        double sum = 0;
        for (uint32_t i = 0; i < n; i++) {
            cold += sh[b].recency[i] <= cut;
            sum += (double)sh[b].recency[i];
        }
        v[no].b = b;
        v[no].cold = n ? (double)cold / n : 1.0;
        v[no].mean = n ? sum / n : 0;
        no++;
    }
    qsort(v, (size_t)no, sizeof *v, st_cmp_victim);
    for (int i = 0; i < no; i++) order[i] = v[i].b;
    return no;
}

uint64_t kvx_st_carry_room(uint64_t freed, uint64_t entry_bytes) { return freed / 2 / entry_bytes; }

int kvx_st_evict_enough(uint64_t total, uint64_t freed, size_t collected, uint64_t room, uint64_t entry_bytes,
                        uint64_t goal)
{
    size_t carried = collected < room ? collected : (size_t)room;
    uint64_t carry = carried ? 4096 + (uint64_t)carried * entry_bytes : 0;
    return total - freed + carry <= goal;
}

int kvx_st_compact_small(uint8_t *victims, const st_pshard *sh, uint32_t flags, uint64_t target)
{
    int n = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!sh[b].live || sh[b].flags != flags || sh[b].pinned) continue;
        if (sh[b].file_bytes < target / 2) {
            victims[b] = 1;
            n++;
        }
    }
    return n;
}

int kvx_st_compact_due(const st_pshard *sh, uint64_t capacity, uint64_t target)
{
    int live = 0, small = 0;
    for (int b = 0; b < ST_SLOTS; b++) {
        live += sh[b].live != 0;
        small += sh[b].live && sh[b].file_bytes < target / 2;
    }
    uint64_t small_max = capacity / 100 / ST_SHARD_OVERHEAD;
    if (small_max < 4) small_max = 4;
    if (small_max > ST_COMPACT_SMALL) small_max = ST_COMPACT_SMALL;
    return live > ST_COMPACT_AT || (uint64_t)small >= small_max;
}
