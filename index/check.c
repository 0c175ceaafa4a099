/*
 * check.c - the damage checks that run before LMDB trusts data.mdb
 * (DESIGN.md rule 4). The rule it keeps: LMDB reads nothing kvx has not
 * checked first. Both meta pages are read with pread and checked against
 * the file before mdb_env_open; after it, the whole tree is walked once
 * through a private mapping under the guard. This is the one file that
 * knows LMDB's on-disk layout (LMDB 0.9, liblmdb/mdb.c); its own file
 * calls (open, pread, fstat, mmap) go through the OS seam (common/os.h).
 */
#include "index.h"

#include "common/os.h"
#include "common/sigbus.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ meta pages */

/* LMDB 0.9 (liblmdb/mdb.c, MDB_DEVEL off) data file layout, native byte
 * order, P = sizeof(size_t) (pgno_t, txnid_t and size_t are all size_t):
 *   MDB_page header: mp_pgno (P), mp_pad (u16), mp_flags (u16),
 *                    mp_lower/mp_upper (u16 each) -> PAGEHDRSZ = P + 8
 *   MDB_meta, right after it: mm_magic (u32) 0xBEEFC0DE, mm_version (u32) 1,
 *     mm_address (void *), mm_mapsize (size_t), mm_dbs[2] (FREE_DBI,
 *     MAIN_DBI), mm_last_pg (pgno_t), mm_txnid (txnid_t)
 *   MDB_db (8 + 5P bytes): md_pad (u32; in mm_dbs[FREE_DBI] it is the page
 *     size), md_flags (u16), md_depth (u16), md_branch_pages,
 *     md_leaf_pages, md_overflow_pages (pgno_t), md_entries (size_t),
 *     md_root (pgno_t; P_INVALID = all ones for an empty tree)
 * Pages 0 and 1 are the two metas (P_META = 0x08); LMDB reads meta 1 at
 * the page size meta 0 names, and uses the one with the larger txnid
 * (meta 0 on a tie), both at open and at every transaction start. */
#define LM_P (sizeof(size_t))
#define LM_PAGEHDR (LM_P + 8)
#define LM_FLAGS (LM_P + 2)
#define LM_MAGIC (LM_PAGEHDR + 0)
#define LM_VERSION (LM_PAGEHDR + 4)
#define LM_MAPSIZE (LM_PAGEHDR + 8 + LM_P)
#define LM_DBS (LM_PAGEHDR + 8 + 2 * LM_P)
#define LM_DB_SIZE (8 + 5 * LM_P)
#define LM_DB_ROOT (8 + 4 * LM_P)
#define LM_LAST_PG (LM_DBS + 2 * LM_DB_SIZE)
#define LM_TXNID (LM_LAST_PG + LM_P)
#define LM_META_END (LM_TXNID + LM_P)
#define LM_MAGIC_VALUE 0xBEEFC0DEu
#define LM_DATA_VERSION 1u
#define LM_P_META 0x08u
#define LM_MIN_PAGE 512u
#define LM_MAX_PAGE 0x8000u /* MAX_PAGESIZE without MDB_DEVEL */
#define LM_MAX_MAP ((uint64_t)1 << 46)

typedef struct lm_meta {
    uint64_t pgno, mapsize, last_pg, txnid, root[2];
    uint32_t magic, version, psize;
    uint16_t flags;
    uint16_t db_flags[2], db_depth[2]; /* FREE_DBI, MAIN_DBI */
} lm_meta;

static uint64_t lm_word(const uint8_t *b, size_t off)
{
    if (LM_P == 8) {
        uint64_t v;
        memcpy(&v, b + off, 8);
        return v;
    }
    uint32_t v;
    memcpy(&v, b + off, 4);
    return v == UINT32_MAX ? UINT64_MAX : v; /* keep P_INVALID all ones */
}

static void lm_decode(lm_meta *m, const uint8_t *b)
{
    m->pgno = lm_word(b, 0);
    memcpy(&m->flags, b + LM_FLAGS, 2);
    memcpy(&m->magic, b + LM_MAGIC, 4);
    memcpy(&m->version, b + LM_VERSION, 4);
    m->mapsize = lm_word(b, LM_MAPSIZE);
    memcpy(&m->psize, b + LM_DBS, 4); /* mm_dbs[FREE_DBI].md_pad */
    m->root[0] = lm_word(b, LM_DBS + LM_DB_ROOT);
    m->root[1] = lm_word(b, LM_DBS + LM_DB_SIZE + LM_DB_ROOT);
    for (int d = 0; d < 2; d++) {
        memcpy(&m->db_flags[d], b + LM_DBS + d * LM_DB_SIZE + 4, 2);
        memcpy(&m->db_depth[d], b + LM_DBS + d * LM_DB_SIZE + 6, 2);
    }
    m->last_pg = lm_word(b, LM_LAST_PG);
    m->txnid = lm_word(b, LM_TXNID);
}

/* LMDB's own checks (mdb_env_read_header): a page it refuses to open. */
static const char *lm_check_basic(const lm_meta *m, char *why, size_t n)
{
    if (!(m->flags & LM_P_META)) return snprintf(why, n, "page flags 0x%x lack P_META", m->flags), why;
    if (m->magic != LM_MAGIC_VALUE) return snprintf(why, n, "mm_magic is 0x%08x, not 0xbeefc0de", m->magic), why;
    if (m->version != LM_DATA_VERSION) return snprintf(why, n, "mm_version is %u, not 1", m->version), why;
    return NULL;
}

/* Everything LMDB trusts in the meta it uses. */
static const char *lm_check_full(const lm_meta *m, int i, uint32_t psize0, uint64_t file_bytes, char *why, size_t n)
{
    const char *w = lm_check_basic(m, why, n);
    if (w) return w;
    if (m->pgno != (uint64_t)i)
        return snprintf(why, n, "page number is %llu, not %d", (unsigned long long)m->pgno, i), why;
    if (m->psize != psize0) return snprintf(why, n, "page size %u differs from meta 0's %u", m->psize, psize0), why;
    /* transaction N writes meta N % 2, and LMDB finds the current meta as
     * metas[txnid & 1] through the lock file: the one in use must agree */
    if ((m->txnid & 1) != (uint64_t)i)
        return snprintf(why, n, "mm_txnid %llu cannot be in meta page %d (transaction N writes meta N %% 2)",
                        (unsigned long long)m->txnid, i),
               why;
    /* LMDB never writes a page that was allocated and freed in the same
     * transaction, so the file may end before mm_last_pg when the free
     * list names the last pages (mdb.c says so at mm_last_pg): the walk
     * checks that; here, only that the free list could name them all */
    uint64_t pages = file_bytes / m->psize, used;
    if (m->last_pg < 1 || m->last_pg == UINT64_MAX || !kvx_mul64(&used, m->last_pg + 1, m->psize) ||
        (m->last_pg >= pages && m->last_pg + 1 - pages > file_bytes / LM_P))
        return snprintf(why, n, "mm_last_pg %llu lies past the end of the file (%llu bytes, %u-byte pages)",
                        (unsigned long long)m->last_pg, (unsigned long long)file_bytes, m->psize),
               why;
    if (m->mapsize < used || m->mapsize > LM_MAX_MAP)
        return snprintf(why, n, "mm_mapsize %llu is below the data (%llu bytes) or absurd",
                        (unsigned long long)m->mapsize, (unsigned long long)used),
               why;
    static const char *const dbname[2] = {"free", "main"};
    for (int d = 0; d < 2; d++) {
        if (m->root[d] == UINT64_MAX) continue;
        if (m->root[d] < 2 || m->root[d] > m->last_pg)
            return snprintf(why, n, "the %s database's root page %llu is not within pages 2..%llu (mm_last_pg)",
                            dbname[d], (unsigned long long)m->root[d], (unsigned long long)m->last_pg),
                   why;
        if (m->root[d] >= pages)
            return snprintf(why, n, "the %s database's root page %llu lies past the end of the file (%llu whole pages)",
                            dbname[d], (unsigned long long)m->root[d], (unsigned long long)pages),
                   why;
    }
    return NULL;
}

/* ------------------------------------------------------------ tree walk */

/* LMDB trusts every page it reaches: a page-type flag, a node offset, a
 * key or data size or a child page number that is wrong makes it read past
 * a page, take a page for another kind (a P_DIRTY page on disk is written
 * in place through the read-only map), recurse without end, fail an
 * assertion (abort), or, in a write transaction, memmove past a heap copy
 * of a page. So every environment is walked once at open, inside a read
 * transaction (its snapshot cannot be recycled meanwhile), through a
 * private mapping of the file under the guard: every page reachable from
 * the free and main trees and every named database (with their sorted-
 * duplicate sub-pages and sub-trees and their overflow pages) must be a
 * page of the right type within 2..last page, reached once, with its
 * header bounds, every node, key, datum and sub-page inside it, branch
 * pages of at least two children, and every leaf at the tree's depth;
 * every free-list record a whole list of pages within 2..last page, and
 * every page between the end of the file and the last page on it.
 * What it does not check is content: keys out of order and record bytes
 * (records' own CRCs, a later step). Cost: one pass over the file. */

#define LP_BRANCH 0x01u
#define LP_LEAF 0x02u
#define LP_OVERFLOW 0x04u
#define LP_DIRTY 0x10u
#define LP_LEAF2 0x20u
#define LP_SUBP 0x40u
#define LF_BIGDATA 1u
#define LF_SUBDATA 2u
#define LF_DUPDATA 4u
#define L_MAXKEY 511u
#define L_STACK 32u
#define L_NODE 8u
#define L_DB_BYTES ((uint64_t)LM_DB_SIZE)

typedef struct lw {
    const uint8_t *map;
    uint64_t len; /* bytes mapped (the file) */
    uint32_t ps;
    uint64_t last;  /* mm_last_pg */
    uint64_t pages; /* whole pages in the file */
    uint8_t *seen;  /* pages reached, 0..last */
    uint8_t *tail;  /* pages pages..last the free list names */
    char why[320];
} lw;

typedef struct lw_tree {
    char name[40];
    unsigned flags; /* md_flags LMDB will use */
    int free;       /* the free tree: its records are page lists */
    int main;       /* the main tree: F_SUBDATA records are named trees */
    int dup;        /* the duplicates of one key (keys only) */
    unsigned ks;    /* LEAF2 key size (DUPFIXED duplicates) */
    unsigned depth;
} lw_tree;

static int lw_fail(lw *w, const lw_tree *t, uint64_t pg, const char *fmt, ...) KVX_PRINTF(4, 5);
static int lw_fail(lw *w, const lw_tree *t, uint64_t pg, const char *fmt, ...)
{
    int n = snprintf(w->why, sizeof w->why, "the %s tree%s, page %llu: ", t->name, t->dup ? " (duplicates)" : "",
                     (unsigned long long)pg);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof w->why) vsnprintf(w->why + n, sizeof w->why - (size_t)n, fmt, ap);
    va_end(ap);
    return MDB_CORRUPTED;
}

static uint16_t lw16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t lw32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

static int lw_claim(lw *w, const lw_tree *t, uint64_t pg, uint64_t from)
{
    if (pg < 2 || pg > w->last)
        return lw_fail(w, t, from, "page number %llu is not within 2..%llu", (unsigned long long)pg,
                       (unsigned long long)w->last);
    if (pg >= w->pages)
        return lw_fail(w, t, from, "page %llu lies past the end of the file (%llu whole pages)", (unsigned long long)pg,
                       (unsigned long long)w->pages);
    if (w->seen[pg >> 3] & (1u << (pg & 7)))
        return lw_fail(w, t, from, "page %llu is reached twice (a cycle or a shared page)", (unsigned long long)pg);
    w->seen[pg >> 3] |= (uint8_t)(1u << (pg & 7));
    return 0;
}

typedef struct lw_db {
    uint32_t pad;
    uint16_t flags, depth;
    uint64_t root;
} lw_db;

static void lw_decode_db(const uint8_t *p, lw_db *d)
{
    d->pad = lw32(p);
    d->flags = lw16(p + 4);
    d->depth = lw16(p + 6);
    d->root = lm_word(p, LM_DB_ROOT);
}

static int lw_tree_walk(lw *w, const lw_tree *t, uint64_t root);

/* kvx's databases and the flags mdb_dbi_open gives them */
static const struct {
    const char *name;
    unsigned flags;
    unsigned key; /* key size, 0: any */
} lw_known[] = {
    {"meta", 0, 0},
    {"shards", MDB_INTEGERKEY, 4},
    {"coord", MDB_INTEGERKEY, 4},
    {"hash", MDB_INTEGERKEY | MDB_DUPSORT | MDB_DUPFIXED, 8},
    {"usage", MDB_INTEGERKEY, 4},
};

#define LW_DB_FLAGS (MDB_REVERSEKEY | MDB_DUPSORT | MDB_INTEGERKEY | MDB_DUPFIXED | MDB_INTEGERDUP | MDB_REVERSEDUP)

/* A named database record of the main tree. */
static int lw_named(lw *w, const lw_tree *t, uint64_t pg, const uint8_t *key, unsigned ksize, const uint8_t *data)
{
    lw_db d;
    lw_decode_db(data, &d);
    char name[40];
    size_t n = ksize < sizeof name - 1 ? ksize : sizeof name - 1;
    for (size_t i = 0; i < n; i++) name[i] = key[i] >= 0x20 && key[i] < 0x7f ? (char)key[i] : '?';
    name[n] = '\0';
    if (d.flags & ~LW_DB_FLAGS) return lw_fail(w, t, pg, "database '%s' has flags 0x%x", name, d.flags);
    if ((d.flags & MDB_DUPFIXED) && !(d.flags & MDB_DUPSORT))
        return lw_fail(w, t, pg, "database '%s' is DUPFIXED without DUPSORT", name);
    for (size_t i = 0; i < sizeof lw_known / sizeof lw_known[0]; i++)
        if (strlen(lw_known[i].name) == ksize && !memcmp(lw_known[i].name, key, ksize) && d.flags != lw_known[i].flags)
            return lw_fail(w, t, pg, "database '%s' has flags 0x%x, not 0x%x", name, d.flags, lw_known[i].flags);
    lw_tree sub = {"", d.flags, 0, 0, 0, 0, d.depth};
    memcpy(sub.name, name, n + 1);
    if (d.root == UINT64_MAX)
        return d.depth ? lw_fail(w, t, pg, "database '%s' is empty with depth %u", name, d.depth) : 0;
    return lw_tree_walk(w, &sub, d.root);
}

static unsigned lw_keysize(const lw_tree *t)
{
    if (t->dup || t->main) return 0;
    for (size_t i = 0; i < sizeof lw_known / sizeof lw_known[0]; i++)
        if (!strcmp(lw_known[i].name, t->name)) return lw_known[i].key;
    return 0;
}

/* Overflow pages of one datum of dsize bytes. */
static int lw_overflow(lw *w, const lw_tree *t, uint64_t from, uint64_t ov, uint64_t dsize)
{
    int rc = lw_claim(w, t, ov, from);
    if (rc) return rc;
    const uint8_t *p = w->map + ov * w->ps;
    uint16_t flags = lw16(p + LM_FLAGS);
    uint32_t pages = lw32(p + LM_P + 4);
    if (lm_word(p, 0) != ov)
        return lw_fail(w, t, ov, "overflow page says it is page %llu", (unsigned long long)lm_word(p, 0));
    if (flags != LP_OVERFLOW) return lw_fail(w, t, ov, "overflow page has flags 0x%x", flags);
    if (pages < 1 || ov + pages - 1 > w->last || (uint64_t)pages * w->ps < LM_PAGEHDR + dsize)
        return lw_fail(w, t, ov, "%u overflow page(s) cannot hold %llu bytes within the file", pages,
                       (unsigned long long)dsize);
    for (uint64_t i = 1; i < pages; i++)
        if ((rc = lw_claim(w, t, ov + i, ov))) return rc;
    return 0;
}

static int lw_subpage(lw *w, const lw_tree *t, uint64_t pg, const uint8_t *sp, uint64_t size);

/* A record of the free tree: a page list (a count, then that many page
 * numbers, each within 2..last page), which LMDB reads in every write
 * transaction that allocates a page. Pages past the end of the file are
 * noted: each of them must be named here. */
static int lw_idl(lw *w, const lw_tree *t, uint64_t pg, const uint8_t *d, uint64_t size)
{
    if (size < LM_P || size % LM_P)
        return lw_fail(w, t, pg, "a free-page list of %llu bytes", (unsigned long long)size);
    uint64_t n = lm_word(d, 0);
    if (n != size / LM_P - 1) return lw_fail(w, t, pg, "a free-page list of %llu bytes counts %llu pages",
                                             (unsigned long long)size, (unsigned long long)n);
    for (uint64_t i = 1; i <= n; i++) {
        uint64_t f = lm_word(d, i * LM_P);
        if (f < 2 || f > w->last)
            return lw_fail(w, t, pg, "the free-page list names page %llu, not within 2..%llu", (unsigned long long)f,
                           (unsigned long long)w->last);
        if (f >= w->pages) w->tail[(f - w->pages) >> 3] |= (uint8_t)(1u << ((f - w->pages) & 7));
    }
    return 0;
}

/* Node i of a leaf page (or sub-page) p of size bytes. */
static int lw_leaf_node(lw *w, const lw_tree *t, uint64_t pg, const uint8_t *p, uint64_t size, unsigned i,
                        unsigned upper)
{
    unsigned off = lw16(p + LM_PAGEHDR + 2 * i);
    if (off < upper || off + L_NODE > size)
        return lw_fail(w, t, pg, "node %u at offset %u is outside the page", i, off);
    const uint8_t *node = p + off;
    uint64_t dsize = lw16(node) | ((uint64_t)lw16(node + 2) << 16);
    unsigned nflags = lw16(node + 4), ksize = lw16(node + 6);
    if (ksize > L_MAXKEY) return lw_fail(w, t, pg, "node %u has a %u-byte key", i, ksize);
    unsigned want = lw_keysize(t);
    if (want && ksize != want) return lw_fail(w, t, pg, "node %u has a %u-byte key, not %u", i, ksize, want);
    if ((t->flags & MDB_INTEGERKEY) && !t->dup && ksize != 4 && ksize != 8)
        return lw_fail(w, t, pg, "node %u has a %u-byte integer key", i, ksize);
    uint64_t dat = off + L_NODE + ksize; /* where the datum starts */
    if (nflags & ~(LF_BIGDATA | LF_SUBDATA | LF_DUPDATA)) return lw_fail(w, t, pg, "node %u has flags 0x%x", i, nflags);
    if (t->dup && nflags) return lw_fail(w, t, pg, "duplicate %u has flags 0x%x", i, nflags);
    if (nflags & LF_BIGDATA) {
        if (nflags != LF_BIGDATA) return lw_fail(w, t, pg, "node %u has flags 0x%x", i, nflags);
        if (dat + LM_P > size) return lw_fail(w, t, pg, "node %u lies past the end of the page", i);
        uint64_t ov = lm_word(p, dat);
        int rc = lw_overflow(w, t, pg, ov, dsize);
        if (!rc && t->free) rc = lw_idl(w, t, pg, w->map + ov * w->ps + LM_PAGEHDR, dsize);
        return rc;
    }
    if (dat + dsize > size) return lw_fail(w, t, pg, "node %u (%llu bytes of data) lies past the end of the page", i,
                                           (unsigned long long)dsize);
    if (nflags == LF_SUBDATA) {
        if (!t->main) return lw_fail(w, t, pg, "node %u is a named database outside the main tree", i);
        if (dsize != L_DB_BYTES)
            return lw_fail(w, t, pg, "named database record %u has %llu bytes", i, (unsigned long long)dsize);
        return lw_named(w, t, pg, node + L_NODE, ksize, p + dat);
    }
    if (nflags & LF_DUPDATA) {
        if (!(t->flags & MDB_DUPSORT))
            return lw_fail(w, t, pg, "node %u has duplicates in a database without DUPSORT", i);
        if (nflags & LF_SUBDATA) { /* a sub-tree of duplicates */
            if (dsize != L_DB_BYTES)
                return lw_fail(w, t, pg, "duplicate tree record %u has %llu bytes", i, (unsigned long long)dsize);
            lw_db d;
            lw_decode_db(p + dat, &d);
            int fixed = (t->flags & MDB_DUPFIXED) != 0;
            if (fixed && (d.pad < 1 || d.pad > L_MAXKEY))
                return lw_fail(w, t, pg, "duplicate tree %u has %u-byte values", i, d.pad);
            lw_tree sub = *t;
            sub.main = 0;
            sub.dup = 1;
            sub.ks = fixed ? d.pad : 0;
            sub.depth = d.depth;
            if (d.root == UINT64_MAX) return lw_fail(w, t, pg, "duplicate tree %u is empty", i);
            return lw_tree_walk(w, &sub, d.root);
        }
        return lw_subpage(w, t, pg, p + dat, dsize);
    }
    if (nflags) return lw_fail(w, t, pg, "node %u has flags 0x%x", i, nflags);
    return t->free ? lw_idl(w, t, pg, p + dat, dsize) : 0;
}

/* The duplicates of one key, stored inside its node. */
static int lw_subpage(lw *w, const lw_tree *t, uint64_t pg, const uint8_t *sp, uint64_t size)
{
    lw_tree sub = *t;
    sub.main = 0;
    sub.dup = 1;
    sub.ks = 0;
    sub.depth = 1;
    if (size < LM_PAGEHDR || size > w->ps)
        return lw_fail(w, t, pg, "a sub-page of %llu bytes", (unsigned long long)size);
    unsigned flags = lw16(sp + LM_FLAGS) & ~LP_DIRTY, lower = lw16(sp + LM_P + 4), upper = lw16(sp + LM_P + 6);
    int fixed = (t->flags & MDB_DUPFIXED) != 0;
    if (flags != (LP_LEAF | LP_SUBP | (fixed ? LP_LEAF2 : 0)))
        return lw_fail(w, t, pg, "a sub-page has flags 0x%x", lw16(sp + LM_FLAGS));
    if (lower < LM_PAGEHDR || lower > upper || upper > size || (lower & 1))
        return lw_fail(w, t, pg, "a sub-page has bounds %u..%u in %llu bytes", lower, upper, (unsigned long long)size);
    unsigned n = (lower - (unsigned)LM_PAGEHDR) / 2;
    if (n < 1) return lw_fail(w, t, pg, "an empty sub-page");
    if (fixed) {
        unsigned ks = lw16(sp + LM_P); /* mp_pad: the value size */
        if (ks < 1 || ks > L_MAXKEY || LM_PAGEHDR + (uint64_t)n * ks > size)
            return lw_fail(w, t, pg, "a sub-page of %u %u-byte values does not fit in %llu bytes", n, ks,
                           (unsigned long long)size);
        return 0;
    }
    for (unsigned i = 0; i < n; i++) {
        int rc = lw_leaf_node(w, &sub, pg, sp, size, i, upper);
        if (rc) return rc;
    }
    return 0;
}

static int lw_page(lw *w, const lw_tree *t, uint64_t pg, unsigned level)
{
    const uint8_t *p = w->map + pg * w->ps;
    if (lm_word(p, 0) != pg)
        return lw_fail(w, t, pg, "the page says it is page %llu", (unsigned long long)lm_word(p, 0));
    unsigned flags = lw16(p + LM_FLAGS), lower = lw16(p + LM_P + 4), upper = lw16(p + LM_P + 6);
    int leaf = level == t->depth;
    unsigned want = leaf ? (t->ks ? LP_LEAF | LP_LEAF2 : LP_LEAF) : LP_BRANCH;
    if (flags != want)
        return lw_fail(w, t, pg, "flags 0x%x where a %s page belongs (level %u of %u)", flags, leaf ? "leaf" : "branch",
                       level, t->depth);
    if (lower < LM_PAGEHDR || lower > upper || upper > w->ps || (lower & 1))
        return lw_fail(w, t, pg, "bounds %u..%u in a %u-byte page", lower, upper, w->ps);
    unsigned n = (lower - (unsigned)LM_PAGEHDR) / 2;
    if (t->ks) { /* LEAF2: n fixed-size keys, no nodes */
        if (n < 1 || LM_PAGEHDR + (uint64_t)n * t->ks > w->ps)
            return lw_fail(w, t, pg, "%u %u-byte values do not fit", n, t->ks);
        return 0;
    }
    if (leaf) {
        if (n < 1) return lw_fail(w, t, pg, "an empty leaf");
        for (unsigned i = 0; i < n; i++) {
            int rc = lw_leaf_node(w, t, pg, p, w->ps, i, upper);
            if (rc) return rc;
        }
        return 0;
    }
    if (n < 2) return lw_fail(w, t, pg, "a branch page with %u child(ren)", n);
    for (unsigned i = 0; i < n; i++) {
        unsigned off = lw16(p + LM_PAGEHDR + 2 * i);
        if (off < upper || off + L_NODE > w->ps)
            return lw_fail(w, t, pg, "node %u at offset %u is outside the page", i, off);
        const uint8_t *node = p + off;
        unsigned ksize = lw16(node + 6);
        if (ksize > L_MAXKEY || off + L_NODE + ksize > w->ps)
            return lw_fail(w, t, pg, "node %u's key lies past the page", i);
        uint64_t child = lw16(node) | ((uint64_t)lw16(node + 2) << 16);
        if (LM_P == 8) child |= (uint64_t)lw16(node + 4) << 32;
        int rc = lw_claim(w, t, child, pg);
        if (!rc) rc = lw_page(w, t, child, level + 1);
        if (rc) return rc;
    }
    return 0;
}

static int lw_tree_walk(lw *w, const lw_tree *t, uint64_t root)
{
    if (t->depth < 1 || t->depth > L_STACK)
        return lw_fail(w, t, root, "depth %u (root %llu)", t->depth, (unsigned long long)root);
    int rc = lw_claim(w, t, root, root);
    return rc ? rc : lw_page(w, t, root, 1);
}

typedef struct lw_run {
    lw *w;
    const lm_meta *m;
} lw_run;

static int lw_body(void *p)
{
    lw_run *r = p;
    static const char *const names[2] = {"free", "main"};
    for (int d = 0; d < 2; d++) {
        lw_tree t = {"", d ? 0u : (unsigned)MDB_INTEGERKEY, d == 0, d == 1, 0, 0, r->m->db_depth[d]};
        snprintf(t.name, sizeof t.name, "%s", names[d]);
        unsigned want = d ? 0u : (unsigned)MDB_INTEGERKEY;
        if (r->m->db_flags[d] != want)
            return lw_fail(r->w, &t, 0, "the %s database's flags are 0x%x, not 0x%x", names[d], r->m->db_flags[d],
                           want);
        if (r->m->root[d] == UINT64_MAX) {
            if (t.depth) return lw_fail(r->w, &t, 0, "an empty tree with depth %u", t.depth);
            continue;
        }
        int rc = lw_tree_walk(r->w, &t, r->m->root[d]);
        if (rc) return rc;
    }
    for (uint64_t f = r->w->pages; f <= r->w->last; f++)
        if (!(r->w->tail[(f - r->w->pages) >> 3] & (1u << ((f - r->w->pages) & 7)))) {
            snprintf(r->w->why, sizeof r->w->why,
                     "mm_last_pg %llu lies past the end of the file (%llu whole pages) and the free list does not "
                     "name page %llu",
                     (unsigned long long)r->w->last, (unsigned long long)r->w->pages, (unsigned long long)f);
            return MDB_CORRUPTED;
        }
    return 0;
}

int kvx_idx_walk(kvx_index *ix, MDB_txn *txn, int *again)
{
    int rc = 0, fd = -1;
    MDB_stat ms;
    uint8_t b[LM_META_END];
    lm_meta m;
    struct stat st;
    lw w;
    memset(&w, 0, sizeof w);
    void *map = MAP_FAILED;
    int slot = -1;
    uint64_t id = mdb_txn_id(txn);
    if ((rc = mdb_env_get_fd(ix->env, &fd)) || (rc = mdb_env_stat(ix->env, &ms))) {
        rc = kvx_idx_errp(ix, rc, "check the tree");
        goto out;
    }
    if (kvx_os.pread(fd, b, sizeof b, (off_t)((id & 1) * ms.ms_psize)) != (ssize_t)sizeof b || kvx_os.fstat(fd, &st) != 0) {
        rc = kvx_idx_damaged(ix, "cannot read the meta page of transaction %llu", (unsigned long long)id);
        goto out;
    }
    lm_decode(&m, b);
    if (m.txnid != id) { /* two commits since the txn began rewrote its meta */
        *again = 1;
        goto out;
    }
    char why[256];
    const char *bad = lm_check_full(&m, (int)(id & 1), ms.ms_psize, (uint64_t)st.st_size, why, sizeof why);
    if (bad) {
        rc = kvx_idx_damaged(ix, "meta page %d: %s", (int)(id & 1), bad);
        goto out;
    }
    w.ps = ms.ms_psize;
    w.last = m.last_pg;
    w.len = (uint64_t)st.st_size;
    w.pages = w.len / w.ps;
    w.seen = calloc(1, (size_t)(w.last / 8 + 1));
    w.tail = calloc(1, (size_t)(w.last >= w.pages ? (w.last - w.pages) / 8 + 1 : 1));
    if (!w.seen || !w.tail) {
        rc = kvx_fail(-ENOMEM, "index %s/data.mdb: out of memory to check it", ix->path);
        goto out;
    }
    map = kvx_os.mmap(NULL, (size_t)w.len, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        rc = kvx_fail(-e, "index %s/data.mdb: mmap (to check it): %s", ix->path, strerror(e));
        goto out;
    }
    w.map = map;
    if (kvx_sigbus_register_catalog(&slot, map, (size_t)w.len) != 0) { /* every slot taken: unchecked */
        kvx_clear_error();
        rc = 0;
        goto out;
    }
    lw_run r = {&w, &m};
    int faulted = 0;
    rc = kvx_sigbus_run(lw_body, &r, &faulted);
    if (faulted)
        rc = kvx_idx_damaged(ix, "the file shrank while it was checked");
    else if (rc)
        rc = kvx_idx_damaged(ix, "%s", w.why);
out:
    kvx_sigbus_unregister(slot);
    if (map != MAP_FAILED) kvx_os.munmap(map, (size_t)w.len);
    free(w.seen);
    free(w.tail);
    return rc;
}

static int idx_file_fail(const char *file, const char *store, const char *what)
{
    return kvx_fail(KVX_ECORRUPT, "index %s: %s: run 'kvx store reindex %s'", file, what, store);
}

/* One pass over the file: 0, 1 (damaged: message recorded) or -errno. */
static int idx_check_once(int fd, const char *file, const char *store, int create, uint64_t *out_size)
{
    uint8_t b[2][LM_META_END];
    lm_meta m[2];
    char why[256];
    struct stat st;
    if (kvx_os.fstat(fd, &st) != 0) return -errno;
    if (!S_ISREG(st.st_mode)) {
        idx_file_fail(file, store, "not a regular file");
        return 1;
    }
    *out_size = (uint64_t)st.st_size;
    if (st.st_size == 0) {
        if (create) return 0; /* a lost index: the writer starts a new one */
        idx_file_fail(file, store, "the file is empty");
        return 1;
    }
    ssize_t r = kvx_os.pread(fd, b[0], sizeof b[0], 0);
    if (r < 0) return -errno;
    if ((size_t)r < sizeof b[0]) {
        snprintf(why, sizeof why, "meta page 0: the file ends at %lld bytes, inside it", (long long)r);
        idx_file_fail(file, store, why);
        return 1;
    }
    lm_decode(&m[0], b[0]);
    if (m[0].psize < LM_MIN_PAGE || m[0].psize > LM_MAX_PAGE || (m[0].psize & (m[0].psize - 1))) {
        const char *w = lm_check_basic(&m[0], why, sizeof why);
        char msg[320];
        if (w)
            snprintf(msg, sizeof msg, "meta page 0: %s", w);
        else
            snprintf(msg, sizeof msg,
                     "meta page 0: page size (mm_dbs[FREE_DBI].md_pad) %u is not a power of two in %u..%u",
                     m[0].psize, LM_MIN_PAGE, LM_MAX_PAGE);
        idx_file_fail(file, store, msg);
        return 1;
    }
    r = kvx_os.pread(fd, b[1], sizeof b[1], (off_t)m[0].psize);
    if (r < 0) return -errno;
    if ((size_t)r < sizeof b[1]) {
        snprintf(why, sizeof why, "meta page 1: the file ends at %llu bytes, inside it",
                 (unsigned long long)m[0].psize + (unsigned long long)r);
        idx_file_fail(file, store, why);
        return 1;
    }
    lm_decode(&m[1], b[1]);
    /* the size after the reads: a concurrent writer only grows the file */
    if (kvx_os.fstat(fd, &st) != 0) return -errno;
    *out_size = (uint64_t)st.st_size;
    int use = m[0].txnid < m[1].txnid; /* what LMDB will pick */
    char msg[400];
    const char *w = lm_check_full(&m[use], use, m[0].psize, *out_size, why, sizeof why);
    if (w) {
        /* LMDB 0.9.24 cannot be told to use the older meta (no
         * MDB_PREVSNAPSHOT): the one it would use must pass */
        char other[256];
        const char *wo = lm_check_full(&m[!use], !use, m[0].psize, *out_size, other, sizeof other);
        snprintf(msg, sizeof msg, "meta page %d (the newer, txnid %llu): %s%s", use,
                 (unsigned long long)m[use].txnid, w, wo ? "; the other meta page is damaged too" : "");
        idx_file_fail(file, store, msg);
        return 1;
    }
    if ((w = lm_check_basic(&m[!use], why, sizeof why))) {
        snprintf(msg, sizeof msg, "meta page %d: %s", !use, w);
        idx_file_fail(file, store, msg);
        return 1;
    }
    return 0;
}

int kvx_idx_check_file(const char *path, const char *store_dir, int create)
{
    size_t n = strlen(path);
    char *file = malloc(n + sizeof "/data.mdb");
    if (!file) return kvx_fail(-ENOMEM, "index: out of memory");
    memcpy(file, path, n);
    memcpy(file + n, "/data.mdb", sizeof "/data.mdb");
    const char *store = store_dir ? store_dir : "DIR";
    int fd = kvx_os.open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0);
    int rc = 0;
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT && create) rc = 0;
        else if (e == ENOENT) rc = idx_file_fail(file, store, "the file is missing");
        else rc = kvx_fail(-e, "index %s: open: %s", file, strerror(e));
        free(file);
        return rc;
    }
    /* a writer committing while we read can tear the meta it rewrites:
     * a failure is final only when it holds three times */
    for (int attempt = 0; attempt < 3; attempt++) {
        uint64_t size = 0;
        rc = idx_check_once(fd, file, store, create, &size);
        if (rc <= 0) break;
        rc = KVX_ECORRUPT;
        struct timespec ts = {0, 2000000};
        if (attempt < 2) nanosleep(&ts, NULL);
    }
    if (rc < 0 && rc != KVX_ECORRUPT) rc = kvx_fail(rc, "index %s: read: %s", file, strerror(-rc));
    kvx_os.close(fd);
    free(file);
    return rc;
}

/* ------------------------------------------------------------- map base */

/* Where LMDB mapped data.mdb: mdb_env_info's me_mapaddr is only the
 * FIXEDMAP address of the meta (NULL here), so it is found from a key the
 * main tree hands out: the leaf page holding it starts at the key's
 * address rounded down to the page size (the map is aligned to OS pages,
 * and LMDB pages are at most one OS page here), the page's header names
 * its number, and the map starts that many pages before; both meta pages
 * must then be where that says. 0 or -1 (not found: unguarded). */
int kvx_idx_map_base(kvx_index *ix, const uint8_t **out)
{
    MDB_stat ms;
    long os = sysconf(_SC_PAGESIZE);
    if (mdb_env_stat(ix->env, &ms) != 0 || os <= 0 || ms.ms_psize > (unsigned long)os) return -1;
    MDB_txn *txn;
    if (mdb_txn_begin(ix->env, NULL, MDB_RDONLY, &txn) != 0) return -1;
    MDB_cursor *cur;
    MDB_val k, v;
    int rc = -1;
    if (mdb_cursor_open(txn, 1 /* MAIN_DBI */, &cur) == 0) {
        if (mdb_cursor_get(cur, &k, &v, MDB_FIRST) == 0) {
            uintptr_t page = (uintptr_t)k.mv_data & ~((uintptr_t)ms.ms_psize - 1);
            uint64_t pg = lm_word((const uint8_t *)page, 0);
            uintptr_t base = page - (uintptr_t)pg * ms.ms_psize;
            uint32_t m0, m1;
            if (pg >= 2 && pg < ((uint64_t)1 << 40) && base % (uintptr_t)os == 0) {
                memcpy(&m0, (const uint8_t *)base + LM_MAGIC, 4);
                memcpy(&m1, (const uint8_t *)base + ms.ms_psize + LM_MAGIC, 4);
                if (m0 == LM_MAGIC_VALUE && m1 == LM_MAGIC_VALUE) {
                    *out = (const uint8_t *)base;
                    rc = 0;
                }
            }
        }
        mdb_cursor_close(cur);
    }
    mdb_txn_abort(txn);
    return rc;
}
