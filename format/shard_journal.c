/*
 * shard_journal.c - an active shard's journal: where it lies, its header,
 * and reading its records back into the tables a sealed file would hold.
 *
 * Rule kept: a record counts only when it reads whole, in its place and
 * chained to the one before (its CRC-32C covers its header, its rows and
 * the previous record's CRC, the first the journal header's, which names
 * the file's parameters and identity). A commit returns only after its
 * record is durable, so bytes after the last such record were never
 * acknowledged: they are the unsealed tail, never damage. What is damage:
 * a record magic where a record after a failing one would begin, or past
 * the furthest the failing record could reach (the journal only grows, so
 * a failing record with records after it was whole once); never a magic
 * inside the rows a torn record may hold (a key may hold any bytes).
 */
#include "shard_journal.h"
#include "common/os.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int kvx_journal_geom_for(kvx_journal_geom *out, const kvx_active_params *p)
{
    if (!out || !p) return kvx_fail(KVX_EINVALID, "active shard: NULL parameters");
    if (p->max_entries < 1 || p->max_entries > KVX_MAX_ENTRIES)
        return kvx_fail(KVX_EINVALID, "active shard: max_entries %u is not in 1..%u", p->max_entries,
                        KVX_MAX_ENTRIES);
    if (!(p->flags & KVX_FLAG_SEQ))
        return kvx_fail(KVX_EINVALID, "active shard: flags 0x%x lack KVX_FLAG_SEQ (a record carries its commit's number)",
                        p->flags);
    if (p->flags & KVX_FLAG_META_CRC)
        return kvx_fail(KVX_EINVALID, "active shard: flags 0x%x carry KVX_FLAG_META_CRC (the seal sets it)", p->flags);
    const kvx_geometry *g = &p->geometry;
    /* the geometry as the writer checks it: parameters no writer accepts
     * name no file (and would not read as another file's journal) */
    if (!kvx_quant_elem_size(g->quant)) return kvx_fail(KVX_EQUANT, "active shard: quant %u is unknown", g->quant);
    if (g->num_layers < 1 || g->num_layers > 65535 || g->kv_heads < 1 || g->kv_heads > 65535 || g->head_dim < 1 ||
        g->head_dim > 65535)
        return kvx_fail(KVX_EINVALID, "active shard: num_layers %u, kv_heads %u, head_dim %u must be in 1..65535",
                        g->num_layers, g->kv_heads, g->head_dim);
    if (g->block_tokens > KVX_MAX_BLOCK_TOKENS)
        return kvx_fail(KVX_EINVALID, "active shard: geometry.block_tokens %u exceeds %u", g->block_tokens,
                        KVX_MAX_BLOCK_TOKENS);
    kvx_journal_geom jg;
    memset(&jg, 0, sizeof jg);
    if (kvx_shard_layout_for(&jg.max, p->max_entries, p->flags, g->block_tokens, g->num_layers, g->kv_heads) ||
        kvx_shard_layout_for(&jg.one, 1, p->flags, g->block_tokens, g->num_layers, g->kv_heads))
        return kvx_fail(KVX_EOVERFLOW, "active shard: table sizes for %u entries overflow", p->max_entries);
    jg.row_bytes = jg.one.tables_end - KVX_HEADER_BYTES;
    /* room for max_entries rows, each in its own record at worst (a
     * commit of one block), every record 8-aligned */
    uint64_t per = kvx_align_up(KVX_RECORD_HEADER_BYTES + jg.row_bytes, 8), rows;
    if (!kvx_mul64(&rows, per, p->max_entries) || !kvx_add64(&jg.journal_bytes, rows, KVX_JOURNAL_HEADER_BYTES))
        return kvx_fail(KVX_EOVERFLOW, "active shard: journal size overflows");
    jg.journal_off = kvx_align_up(jg.max.tables_end, KVX_SECTION_ALIGN);
    uint64_t end;
    if (!kvx_add64(&end, jg.journal_off, jg.journal_bytes) || end > UINT64_MAX / 2)
        return kvx_fail(KVX_EOVERFLOW, "active shard: journal end overflows");
    uint64_t full_page = kvx_page_bytes(g, g->block_tokens ? g->block_tokens : 1);
    jg.kv_data_offset = kvx_align_up(end, full_page >= KVX_LARGE_PAGE ? KVX_LARGE_ALIGN : KVX_PAGE_ALIGN);
    *out = jg;
    return 0;
}

void kvx_journal_header_encode(uint8_t *out, const kvx_active_params *p, const kvx_journal_geom *jg,
                               uint32_t *out_crc)
{
    kvx_shard_header h = {
        .format_version = KVX_FORMAT_VERSION,
        .num_layers = (uint16_t)p->geometry.num_layers,
        .kv_heads = (uint16_t)p->geometry.kv_heads,
        .head_dim = (uint16_t)p->geometry.head_dim,
        .num_blocks = p->max_entries,
        .block_tokens = p->geometry.block_tokens,
        .model_signature = p->geometry.model_signature,
        .quant = p->geometry.quant,
        .kv_data_offset = jg->kv_data_offset,
        .flags = p->flags,
    };
    memset(out, 0, KVX_JOURNAL_HEADER_BYTES);
    kvx_header_encode(out, &h);
    memcpy(out, KVX_JOURNAL_MAGIC, 8);
    out[64] = p->shard_id;
    kvx_store64(out + 72, jg->journal_off);
    kvx_store64(out + 80, jg->journal_bytes);
    memcpy(out + 88, p->ident, sizeof p->ident);
    uint32_t crc = kvx_crc32c(0, out, KVX_JOURNAL_HEADER_BYTES - 4);
    kvx_store32(out + KVX_JOURNAL_HEADER_BYTES - 4, crc);
    if (out_crc) *out_crc = crc;
}

/* The CRC of a record: its header's first 28 bytes, its rows, then the
 * previous record's CRC (little-endian). */
static uint32_t record_crc(const uint8_t *hdr, const uint8_t *rows, uint64_t row_total, uint32_t prev)
{
    uint8_t p4[4];
    kvx_store32(p4, prev);
    uint32_t crc = kvx_crc32c(0, hdr, KVX_R_CRC);
    crc = kvx_crc32c(crc, rows, (size_t)row_total);
    return kvx_crc32c(crc, p4, 4);
}

/* Scatters one row (an entry's slice of every table, in table order) into
 * tables laid out for n entries (lay), at entry index i. */
static void row_scatter(uint8_t *tables, const kvx_shard_layout *lay, const kvx_journal_geom *jg, uint32_t i,
                        const uint8_t *row)
{
    const struct {
        uint64_t off, width;
    } t[] = {
        {lay->coord_off, jg->one.coord_bytes},     {lay->hash_off, jg->one.hash_bytes},
        {lay->lineage_off, jg->one.lineage_bytes}, {lay->digest_off, jg->one.digest_bytes},
        {lay->scale_off, jg->one.scale_bytes},     {lay->key_off, jg->one.key_bytes},
        {lay->seq_off, jg->one.seq_bytes},         {lay->tomb_off, jg->one.tomb_bytes},
    };
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
        if (!t[k].width) continue;
        memcpy(tables + (t[k].off - KVX_HEADER_BYTES) + (size_t)i * t[k].width, row, (size_t)t[k].width);
        row += t[k].width;
    }
}

#define JOURNAL_WINDOW ((uint64_t)1 << 20) /* bytes a reader holds of the journal beyond its rows */

/* Reads len bytes of the journal at rel (relative to its start): 0, or
 * the error. The caller keeps rel + len within what the file holds. */
static int jpread(int fd, const kvx_journal_geom *jg, void *buf, uint64_t len, uint64_t rel)
{
    size_t got = 0;
    int rc = kvx_os_pread_all(fd, buf, (size_t)len, jg->journal_off + rel, &got);
    if (!rc && got != len) rc = KVX_ETRUNC; /* the file shrank under us */
    if (rc)
        return kvx_fail(rc, "active shard: reading the journal at %llu: %s",
                        (unsigned long long)(jg->journal_off + rel), kvx_strerror(rc));
    return 0;
}

/* A window of the journal read ahead, so that records are parsed from
 * memory, not with a read each. */
typedef struct jwin {
    int fd;
    const kvx_journal_geom *jg;
    uint64_t len;  /* the journal as far as the file holds it */
    uint8_t *b;    /* JOURNAL_WINDOW bytes */
    uint64_t at, n; /* b holds [at, at + n) */
} jwin;

/* Copies [rel, rel + len) of the journal (within w->len) into dst. */
static int jget(jwin *w, void *dst, uint64_t len, uint64_t rel)
{
    if (rel >= w->at && rel + len <= w->at + w->n) {
        memcpy(dst, w->b + (rel - w->at), (size_t)len);
        return 0;
    }
    if (len > JOURNAL_WINDOW) return jpread(w->fd, w->jg, dst, len, rel);
    uint64_t n = w->len - rel < JOURNAL_WINDOW ? w->len - rel : JOURNAL_WINDOW;
    w->n = 0;
    int rc = jpread(w->fd, w->jg, w->b, n, rel);
    if (rc) return rc;
    w->at = rel;
    w->n = n;
    memcpy(dst, w->b, (size_t)len);
    return 0;
}

/* After the record at pos that fails its checks: is there a record after
 * it (*later), and where does the journal's last non-zero byte end
 * (*tail)? The record the writer put at pos held c rows for some c in
 * 1..room (room: the entries left in the reserve), so the record after it
 * began at one of the places align8(pos + header + c * row_bytes), and
 * nothing it wrote reaches past the last of them. A record magic at one
 * of those places, or at any 8-aligned place past them, is a record after
 * it: the failing record was whole once (damage). Its header is not
 * believed (a flipped count would hide the records after it), and its own
 * rows are not searched but where a row begins (the coordinate entry:
 * coordinate, tokens, a 4096-aligned page offset, which no magic spells),
 * so a key that holds a magic in a torn record is not mistaken for a
 * record. Read in windows of JOURNAL_WINDOW, holes skipped. */
static int judge_rest(int fd, const kvx_journal_geom *jg, uint64_t pos, uint64_t len, uint32_t room, int *later,
                      uint64_t *tail)
{
    *later = 0;
    *tail = pos;
    const uint64_t R = jg->row_bytes;
    /* boundaries: b(c) = align8(pos + header + c * R), c = 1..room; every
     * 8-aligned place from `open` on */
    uint64_t open = room ? kvx_align_up(pos + KVX_RECORD_HEADER_BYTES + (uint64_t)room * R, 8) : pos + 8;
    uint32_t c = 1;
    uint8_t *win = malloc((size_t)JOURNAL_WINDOW);
    if (!win) return kvx_fail(-ENOMEM, "active shard: out of memory for a journal window");
    int rc = 0;
    for (uint64_t at = pos; at < len && !*later;) {
        /* skip a hole: it reads as zeros (no magic, no tail) */
        off_t data = lseek(fd, (off_t)(jg->journal_off + at), SEEK_DATA);
        if (data < 0 && errno == ENXIO) break; /* nothing but holes to the end */
        if (data > (off_t)(jg->journal_off + at)) {
            uint64_t to = ((uint64_t)data - jg->journal_off) & ~7ull;
            if (to >= len) break;
            if (to > at) at = to;
        }
        uint64_t wl = len - at < JOURNAL_WINDOW ? len - at : JOURNAL_WINDOW;
        if ((rc = jpread(fd, jg, win, wl, at))) break;
        for (uint64_t k = wl; k > 0; k--)
            if (win[k - 1]) {
                *tail = at + k;
                break;
            }
        /* the boundaries within this window */
        while (c <= room) {
            uint64_t b = kvx_align_up(pos + KVX_RECORD_HEADER_BYTES + (uint64_t)c * R, 8);
            if (b < at) {
                c++;
                continue;
            }
            if (b + 8 > at + wl) break;
            if (memcmp(win + (b - at), KVX_RECORD_MAGIC, 8) == 0) *later = 1;
            c++;
        }
        /* every 8-aligned place past the last boundary */
        for (uint64_t q = open > at ? open : at; q + 8 <= at + wl && !*later; q += 8)
            if (memcmp(win + (q - at), KVX_RECORD_MAGIC, 8) == 0) *later = 1;
        at += wl;
    }
    free(win);
    return rc;
}

/* The CRC of the record at pos (header hdr, total bytes of rows), its rows
 * read in windows of JOURNAL_WINDOW. */
static int rows_crc(int fd, const kvx_journal_geom *jg, const uint8_t *hdr, uint64_t pos, uint64_t total,
                    uint32_t prev, uint32_t *out)
{
    uint8_t *win = malloc((size_t)JOURNAL_WINDOW);
    if (!win) return kvx_fail(-ENOMEM, "active shard: out of memory for a journal window");
    uint32_t crc = kvx_crc32c(0, hdr, KVX_R_CRC);
    int rc = 0;
    for (uint64_t done = 0; done < total && !rc; done += JOURNAL_WINDOW) {
        uint64_t wl = total - done < JOURNAL_WINDOW ? total - done : JOURNAL_WINDOW;
        if (!(rc = jpread(fd, jg, win, wl, pos + KVX_RECORD_HEADER_BYTES + done))) crc = kvx_crc32c(crc, win, (size_t)wl);
    }
    free(win);
    uint8_t p4[4];
    kvx_store32(p4, prev);
    *out = kvx_crc32c(crc, p4, 4);
    return rc;
}

int kvx_journal_read(int fd, uint64_t file_size, const kvx_active_params *p, kvx_journal_state *out)
{
    return kvx_journal_read_below(fd, file_size, p, UINT64_MAX, out);
}

int kvx_journal_read_below(int fd, uint64_t file_size, const kvx_active_params *p, uint64_t below,
                           kvx_journal_state *out)
{
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_journal_read: NULL argument");
    memset(out, 0, sizeof *out);
    kvx_journal_geom jg;
    int rc = kvx_journal_geom_for(&jg, p);
    if (rc) return rc;
    if (file_size < jg.journal_off + KVX_JOURNAL_HEADER_BYTES)
        return kvx_fail(KVX_ETRUNC, "active shard: the file (%llu bytes) ends before its journal header at %llu",
                        (unsigned long long)file_size, (unsigned long long)jg.journal_off);
    /* the journal as far as the file holds it (a region never written
     * reads as zeros, which is no record); read record by record, so a
     * reader holds the rows of its records, never the whole reserve */
    uint64_t len = jg.journal_bytes;
    if (file_size - jg.journal_off < len) len = file_size - jg.journal_off;
    uint8_t jh[KVX_JOURNAL_HEADER_BYTES], want[KVX_JOURNAL_HEADER_BYTES];
    if ((rc = jpread(fd, &jg, jh, sizeof jh, 0))) return rc;
    uint32_t chain;
    kvx_journal_header_encode(want, p, &jg, &chain);
    if (memcmp(jh, KVX_JOURNAL_MAGIC, 8) != 0)
        return kvx_fail(KVX_EMAGIC, "active shard: no journal header (magic %s) at offset %llu", KVX_JOURNAL_MAGIC,
                        (unsigned long long)jg.journal_off);
    if (memcmp(jh, want, KVX_JOURNAL_HEADER_BYTES) != 0) {
        uint32_t crc = kvx_crc32c(0, jh, KVX_JOURNAL_HEADER_BYTES - 4);
        if (crc != kvx_load32(jh + KVX_JOURNAL_HEADER_BYTES - 4))
            return kvx_fail(KVX_ECORRUPT, "active shard: the journal header fails its CRC-32C");
        return kvx_fail(KVX_EFORMAT,
                        "active shard: the journal header names another file (geometry, flags, reserve, "
                        "shard or identity differ from the store's)");
    }

    /* pass 1: the whole, chained records; their rows, in order, in rows */
    const uint64_t R = jg.row_bytes;
    uint64_t pos = KVX_JOURNAL_HEADER_BYTES, seq = 0, tail = pos;
    uint32_t n = 0, records = 0;
    uint8_t *rows = NULL;
    uint64_t rows_cap = 0;
    uint8_t r[KVX_RECORD_HEADER_BYTES];
    jwin jw = {fd, &jg, len, malloc((size_t)JOURNAL_WINDOW), 0, 0};
    if (!jw.b) return kvx_fail(-ENOMEM, "active shard: out of memory for a journal window");
    for (int retries = 0;;) {
        uint32_t count = 0;
        uint64_t total = 0;
        int whole = 0;
        if (pos + KVX_RECORD_HEADER_BYTES <= len) {
            if ((rc = jget(&jw, r, sizeof r, pos))) break;
            count = kvx_load32(r + KVX_R_COUNT);
            total = (uint64_t)count * R;
            /* a record of more rows than the reserve has left is not one
             * a writer wrote: not whole, its rows never read */
            whole = memcmp(r + KVX_R_MAGIC, KVX_RECORD_MAGIC, 8) == 0 && kvx_load32(r + KVX_R_ROW_BYTES) == R &&
                    count >= 1 && count <= p->max_entries - n && total <= len - pos - KVX_RECORD_HEADER_BYTES;
        }
        if (whole && total > JOURNAL_WINDOW) {
            /* a long record: its CRC first, in windows, so a header that
             * only claims many rows is never held */
            uint32_t crc = 0;
            if ((rc = rows_crc(fd, &jg, r, pos, total, chain, &crc))) break;
            whole = crc == kvx_load32(r + KVX_R_CRC);
        }
        if (whole && (n + (uint64_t)count) * R > rows_cap) {
            /* grown by half again at least (never past the reserve) */
            uint64_t cap = (n + (uint64_t)count) * R, more = rows_cap + rows_cap / 2;
            if (more > cap) cap = more < (uint64_t)p->max_entries * R ? more : (uint64_t)p->max_entries * R;
            uint8_t *grown = realloc(rows, (size_t)cap);
            if (!grown) {
                rc = kvx_fail(-ENOMEM, "active shard: out of memory for the rows of %llu entries",
                              (unsigned long long)n + count);
                break;
            }
            rows = grown;
            rows_cap = cap;
        }
        if (whole) {
            if ((rc = jget(&jw, rows + (size_t)n * R, total, pos + KVX_RECORD_HEADER_BYTES))) break;
            whole = record_crc(r, rows + (size_t)n * R, total, chain) == kvx_load32(r + KVX_R_CRC);
        }
        if (!whole) {
            int later = 0;
            if (pos < len && (rc = judge_rest(fd, &jg, pos, len, p->max_entries - n, &later, &tail))) break;
            if (!later) break;
            /* a record after it: damage, unless the record at pos was
             * being written as we read it (a reader beside the writer):
             * read it again */
            if (retries++ < 4) {
                jw.n = 0; /* read it from the file again */
                continue;
            }
            rc = kvx_fail(KVX_ECORRUPT, "active shard: record %u at offset %llu fails its checks and records follow it",
                          records, (unsigned long long)(jg.journal_off + pos));
            break;
        }
        uint32_t first = kvx_load32(r + KVX_R_FIRST);
        uint64_t rseq = kvx_load64(r + KVX_R_SEQ);
        if (first != n) {
            rc = kvx_fail(KVX_EFORMAT, "active shard: record %u (offset %llu) names entries %u..%llu, expected from %u",
                          records, (unsigned long long)(jg.journal_off + pos), first,
                          (unsigned long long)first + count - 1, n);
            break;
        }
        if (rseq <= seq) {
            rc = kvx_fail(KVX_EFORMAT, "active shard: record %u has sequence number %llu, not above %llu", records,
                          (unsigned long long)rseq, (unsigned long long)seq);
            break;
        }
        if (rseq >= below) {
            /* a commit that never answered (the caller's mark): it and
             * what follows are the tail */
            uint64_t end = kvx_align_up(pos + KVX_RECORD_HEADER_BYTES + total, 8);
            if (end > tail) tail = end;
            break;
        }
        seq = rseq;
        chain = kvx_load32(r + KVX_R_CRC);
        n += count;
        records++;
        retries = 0;
        pos = kvx_align_up(pos + KVX_RECORD_HEADER_BYTES + total, 8);
        tail = pos;
    }
    free(jw.b);
    if (rc) {
        free(rows);
        return rc;
    }

    /* pass 2: the tables of n entries, as a sealed file lays them out */
    kvx_shard_layout lay;
    if (kvx_shard_layout_for(&lay, n, p->flags, p->geometry.block_tokens, p->geometry.num_layers,
                             p->geometry.kv_heads)) {
        free(rows);
        return kvx_fail(KVX_EOVERFLOW, "active shard: table sizes overflow"); /* cannot: n <= max_entries */
    }
    size_t tlen = (size_t)(lay.tables_end - KVX_HEADER_BYTES);
    uint8_t *tables = malloc(tlen ? tlen : 1);
    if (!tables) {
        free(rows);
        return kvx_fail(-ENOMEM, "active shard: out of memory for the tables of %u entries", n);
    }
    uint64_t kv_end = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *row = rows + (size_t)i * R;
        uint32_t coord = kvx_load32(row + KVX_E_COORD);
        if (coord >> 24 != p->shard_id) {
            /* the journal header names the file's shard: a sealed file's
             * check (every entry the shard of the first) would let a file
             * of another shard's entries through */
            free(rows);
            free(tables);
            return kvx_fail(KVX_ESHARDID, "active shard: entry %u: coordinate 0x%08x has shard %u, the file's is %u", i,
                            coord, coord >> 24, p->shard_id);
        }
        row_scatter(tables, &lay, &jg, i, row);
        uint64_t end = kvx_load64(row + KVX_E_OFFSET) + kvx_load32(row + KVX_E_BYTES);
        if (end > kv_end && end >= kvx_load64(row + KVX_E_OFFSET)) kv_end = end;
    }
    free(rows);
    kvx_shard_header h = {
        .format_version = KVX_FORMAT_VERSION,
        .num_layers = (uint16_t)p->geometry.num_layers,
        .kv_heads = (uint16_t)p->geometry.kv_heads,
        .head_dim = (uint16_t)p->geometry.head_dim,
        .num_blocks = n,
        .block_tokens = p->geometry.block_tokens,
        .model_signature = p->geometry.model_signature,
        .quant = p->geometry.quant,
        .kv_data_offset = jg.kv_data_offset,
        .flags = p->flags,
    };
    out->h = h;
    out->tables = tables;
    out->n = n;
    out->records = records;
    out->next_pos = jg.journal_off + pos;
    out->tail_end = jg.journal_off + tail;
    out->chain = chain;
    out->last_seq = seq;
    out->kv_end = kv_end;
    return 0;
}
