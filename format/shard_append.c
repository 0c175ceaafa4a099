/*
 * shard_append.c - the writer of an active shard: a shard file that grows
 * by appends and is sealed in place (docs/FORMAT.md "Active shards and
 * their journal").
 *
 * Rule kept: a record is written only after the pages it names are
 * durable, and an append returns only after its record is durable; so a
 * record that reads whole names pages that were whole when it was written,
 * and anything after the last whole record was never acknowledged. The
 * writer never removes or shortens an active file: its records were
 * acknowledged. The seal writes the standard header and tables where the
 * reserve left room for them (the pages do not move), makes them durable,
 * and only then renames the file to its sealed name. One writer at a time:
 * each holds an exclusive flock on the file until it closes it.
 */
#include "shard_writer_impl.h"
#include "shard_journal.h"
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static void options_of(kvx_shard_writer_options *o, const kvx_active_params *p)
{
    kvx_shard_writer_options_init(o);
    o->geometry = p->geometry;
    o->shard_id = p->shard_id;
    o->max_entries = p->max_entries;
    o->flags = p->flags;
}

/* A writer for the active file at path (not opened), its journal laid
 * out for p. */
static int active_new(kvx_shard_writer **out, const char *path, const kvx_active_params *p, kvx_journal_geom *jg)
{
    if (!out || !path || !p) return kvx_fail(KVX_EINVALID, "active shard writer: NULL argument");
    *out = NULL;
    int rc = kvx_journal_geom_for(jg, p);
    if (rc) return rc;
    kvx_shard_writer_options o;
    options_of(&o, p);
    kvx_shard_writer *w;
    if ((rc = kvx_sw_new(&w, path, &o))) return rc;
    w->active = 1;
    w->ap = *p;
    w->kv_data_offset = w->wb_from = jg->kv_data_offset;
    w->jpos = jg->journal_off + KVX_JOURNAL_HEADER_BYTES;
    w->jend = jg->journal_off + jg->journal_bytes;
    if (!(w->tmp_path = strdup(path))) { /* for messages only: never removed */
        kvx_sw_free(w);
        return kvx_fail(-ENOMEM, "out of memory");
    }
    *out = w;
    return 0;
}

/* One writer at a time: an exclusive lock on the file, held until its fd
 * is closed (abort, seal). A second writer would write its record where
 * the first one's next goes, over a record the first acknowledged. */
static int lock_writer(int fd, const char *path)
{
    if (kvx_os.flock(fd, LOCK_EX | LOCK_NB) == 0) return 0;
    int e = errno;
    if (e == EWOULDBLOCK || e == EAGAIN)
        return kvx_fail(KVX_EBUSY, "%s: another writer holds the active file", path);
    return kvx_fail(-e, "%s: locking the active file: %s", path, strerror(e));
}

int kvx_shard_writer_create_active(kvx_shard_writer **out, const char *path, const kvx_active_params *p)
{
    if (out) *out = NULL;
    kvx_journal_geom jg;
    kvx_shard_writer *w;
    int rc = active_new(&w, path, p, &jg);
    if (rc) return rc;
    w->fd = kvx_os.open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (w->fd < 0) {
        int e = -errno;
        kvx_sw_free(w);
        return kvx_fail(e, "%s: cannot create the active file: %s", path, strerror(-e));
    }
    uint8_t hdr[KVX_JOURNAL_HEADER_BYTES];
    kvx_journal_header_encode(hdr, p, &jg, &w->chain);
    const char *step = "locking it";
    rc = lock_writer(w->fd, path);
    if (!rc) {
        step = "writing the journal header";
        rc = kvx_os_pwrite_all(w->fd, hdr, sizeof hdr, jg.journal_off);
    }
    if (!rc) {
        step = "fsync of the file";
        rc = kvx_os.fsync(w->fd) ? -errno : 0;
    }
    if (!rc) {
        step = "fsync of its directory";
        rc = kvx_os_fsync_parent(path);
    }
    if (rc) {
        if (rc > 0) rc = -EIO;
        /* nothing was acknowledged in it: it goes */
        kvx_os.close(w->fd);
        w->fd = -1;
        kvx_os.unlink(path);
        kvx_fail(rc, "%s: creating the active file failed while %s: %s", path, step, kvx_strerror(rc));
        kvx_sw_free(w);
        return rc;
    }
    *out = w;
    return 0;
}

/* The writer's tables' entry i from a sealed file's layout (tables from
 * the end of the header, laid out for lay). */
static void entry_from_tables(kvx_shard_writer *w, const uint8_t *tables, const kvx_shard_layout *lay, uint32_t i)
{
    const uint8_t *t = tables - KVX_HEADER_BYTES;
    memcpy(w->coords + (size_t)i * KVX_ENTRY_BYTES, t + lay->coord_off + (size_t)i * KVX_ENTRY_BYTES, KVX_ENTRY_BYTES);
    if (w->flags & KVX_FLAG_HASHES) w->hashes[i] = kvx_load64(t + lay->hash_off + (size_t)i * 8);
    if (w->flags & KVX_FLAG_LINEAGE)
        memcpy(w->lineage + (size_t)i * w->lineage_rec, t + lay->lineage_off + (size_t)i * w->lineage_rec,
               (size_t)w->lineage_rec);
    if (w->flags & KVX_FLAG_DIGEST)
        memcpy(w->digests + (size_t)i * KVX_DIGEST_BYTES, t + lay->digest_off + (size_t)i * KVX_DIGEST_BYTES,
               KVX_DIGEST_BYTES);
    if (w->flags & KVX_FLAG_SCALES)
        memcpy(w->scales + (size_t)i * w->scale_count, t + lay->scale_off + (size_t)i * w->scale_count * 4,
               (size_t)w->scale_count * 4);
    if (w->flags & KVX_FLAG_KEYS)
        memcpy(w->keys + (size_t)i * KVX_KEY_RECORD, t + lay->key_off + (size_t)i * KVX_KEY_RECORD, KVX_KEY_RECORD);
    if (w->flags & KVX_FLAG_SEQ) w->seqs[i] = kvx_load64(t + lay->seq_off + (size_t)i * 8);
    if (w->flags & KVX_FLAG_TOMB) w->tombs[i] = t[lay->tomb_off + i];
    uint32_t key = kvx_load32(w->coords + (size_t)i * KVX_ENTRY_BYTES + KVX_E_COORD) & 0xFFFFFFu;
    w->seen[key >> 3] |= (uint8_t)(1u << (key & 7));
}

int kvx_shard_writer_resume(kvx_shard_writer **out, const char *path, const kvx_active_params *p)
{
    return kvx_shard_writer_resume_below(out, path, p, UINT64_MAX);
}

int kvx_shard_writer_resume_below(kvx_shard_writer **out, const char *path, const kvx_active_params *p, uint64_t below)
{
    if (out) *out = NULL;
    kvx_journal_geom jg;
    kvx_shard_writer *w;
    int rc = active_new(&w, path, p, &jg);
    if (rc) return rc;
    w->fd = kvx_os.open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0);
    struct stat st;
    if (w->fd < 0 || kvx_os.fstat(w->fd, &st) != 0) {
        int e = -errno;
        kvx_sw_discard(w);
        if (e == -EISDIR) return kvx_fail(KVX_EINVALID, "%s: not a regular file but a directory", path);
        return kvx_fail(e, "%s: cannot open the active file: %s", path, strerror(-e));
    }
    if (!S_ISREG(st.st_mode)) {
        kvx_sw_discard(w);
        return kvx_fail(KVX_EINVALID, "%s: not a regular file but a %s", path, kvx_file_type_name(st.st_mode));
    }
    if ((rc = lock_writer(w->fd, path))) {
        kvx_sw_discard(w);
        return rc;
    }
    /* the file's records (no writer adds any now), checked as any reader
     * checks them */
    kvx_shard *check;
    if ((rc = kvx_shard_open_active(&check, AT_FDCWD, path, path, p))) {
        kvx_sw_discard(w);
        return rc;
    }
    kvx_shard_close(check);
    if (kvx_os.fstat(w->fd, &st) != 0) {
        int e = -errno;
        kvx_sw_discard(w);
        return kvx_fail(e, "%s: fstat of the active file: %s", path, strerror(-e));
    }
    kvx_journal_state js;
    if ((rc = kvx_journal_read_below(w->fd, (uint64_t)st.st_size, p, below, &js))) {
        kvx_sw_discard(w);
        return rc;
    }
    kvx_shard_layout lay = {0};
    if (kvx_shard_layout_for(&lay, js.n, p->flags, p->geometry.block_tokens, p->geometry.num_layers,
                             p->geometry.kv_heads))
        rc = kvx_fail(KVX_EOVERFLOW, "%s: table sizes overflow", path); /* cannot: n <= max_entries */
    if (rc || (js.n && (rc = kvx_sw_grow(w, js.n)))) {
        free(js.tables);
        kvx_sw_discard(w);
        return rc;
    }
    for (uint32_t i = 0; i < js.n; i++) entry_from_tables(w, js.tables, &lay, i);
    free(js.tables);
    w->n = w->appended = w->seq_from = js.n;
    w->kv_end = js.kv_end;
    w->wb_from = w->kv_data_offset + kvx_align_up(js.kv_end, KVX_PAGE_ALIGN);
    w->jpos = js.next_pos;
    w->chain = js.chain;
    w->last_seq = js.last_seq;
    if (js.tail_end > js.next_pos) {
        /* a torn record's bytes: zeros, durably, before the next record
         * goes there (a shorter record must not leave them behind it) */
        const uint64_t win = (uint64_t)1 << 20; /* a hostile tail may be the whole reserve */
        uint8_t *zero = calloc(1, (size_t)win);
        rc = zero ? 0 : -ENOMEM;
        for (uint64_t at = js.next_pos; !rc && at < js.tail_end; at += win) {
            uint64_t len = js.tail_end - at < win ? js.tail_end - at : win;
            rc = kvx_os_pwrite_all(w->fd, zero, (size_t)len, at);
        }
        free(zero);
        if (!rc) rc = kvx_os.fdatasync(w->fd) ? -errno : 0;
        if (rc) {
            if (rc > 0) rc = -EIO;
            kvx_fail(rc, "%s: clearing the journal's unsealed tail: %s", path, kvx_strerror(rc));
            kvx_sw_discard(w);
            return rc;
        }
    }
    *out = w;
    return 0;
}

/* Entry i's row: its slice of every table, in table order. */
static uint8_t *row_of(const kvx_shard_writer *w, uint32_t i, uint8_t *o)
{
    memcpy(o, w->coords + (size_t)i * KVX_ENTRY_BYTES, KVX_ENTRY_BYTES);
    o += KVX_ENTRY_BYTES;
    if (w->flags & KVX_FLAG_HASHES) {
        kvx_store64(o, w->hashes[i]);
        o += 8;
    }
    if (w->flags & KVX_FLAG_LINEAGE) {
        memcpy(o, w->lineage + (size_t)i * w->lineage_rec, (size_t)w->lineage_rec);
        o += w->lineage_rec;
    }
    if (w->flags & KVX_FLAG_DIGEST) {
        memcpy(o, w->digests + (size_t)i * KVX_DIGEST_BYTES, KVX_DIGEST_BYTES);
        o += KVX_DIGEST_BYTES;
    }
    if (w->flags & KVX_FLAG_SCALES) {
        memcpy(o, w->scales + (size_t)i * w->scale_count, (size_t)w->scale_count * 4); /* LE host */
        o += w->scale_count * 4;
    }
    if (w->flags & KVX_FLAG_KEYS) {
        memcpy(o, w->keys + (size_t)i * KVX_KEY_RECORD, KVX_KEY_RECORD);
        o += KVX_KEY_RECORD;
    }
    if (w->flags & KVX_FLAG_SEQ) {
        kvx_store64(o, w->seqs[i]);
        o += 8;
    }
    if (w->flags & KVX_FLAG_TOMB) *o++ = w->tombs[i];
    return o;
}

int kvx_shard_writer_append(kvx_shard_writer *w, uint64_t seq)
{
    if (!w || !w->active) return kvx_fail(KVX_EINVALID, "kvx_shard_writer_append: not an active shard writer");
    if (w->broken) return kvx_fail(KVX_EINVALID, "kvx_shard_writer_append: %s: an append failed: the writer is broken", w->path);
    if (seq <= w->last_seq)
        return kvx_fail(KVX_EINVALID, "kvx_shard_writer_append: sequence number %llu is not above the last record's %llu",
                        (unsigned long long)seq, (unsigned long long)w->last_seq);
    if (w->appended == w->n) return 0;
    uint32_t count = w->n - w->appended;
    kvx_journal_geom jg;
    int rc = kvx_journal_geom_for(&jg, &w->ap);
    if (rc) return rc;
    uint64_t rows = (uint64_t)count * jg.row_bytes, len = KVX_RECORD_HEADER_BYTES + rows;
    if (len > w->jend - w->jpos) /* cannot happen: the reserve fits max_entries one-row records */
        return kvx_fail(KVX_EFULL, "%s: the journal has %llu bytes left, the record needs %llu", w->path,
                        (unsigned long long)(w->jend - w->jpos), (unsigned long long)len);
    uint8_t *rec = malloc((size_t)len);
    if (!rec) return kvx_fail(-ENOMEM, "out of memory for a journal record of %llu bytes", (unsigned long long)len);
    kvx_shard_writer_seq_unset(w, seq);
    uint8_t *o = rec + KVX_RECORD_HEADER_BYTES;
    for (uint32_t i = w->appended; i < w->n; i++) o = row_of(w, i, o);
    memset(rec, 0, KVX_RECORD_HEADER_BYTES);
    memcpy(rec + KVX_R_MAGIC, KVX_RECORD_MAGIC, 8);
    kvx_store64(rec + KVX_R_SEQ, seq);
    kvx_store32(rec + KVX_R_FIRST, w->appended);
    kvx_store32(rec + KVX_R_COUNT, count);
    kvx_store32(rec + KVX_R_ROW_BYTES, (uint32_t)jg.row_bytes);
    uint8_t p4[4];
    kvx_store32(p4, w->chain);
    uint32_t crc = kvx_crc32c(kvx_crc32c(kvx_crc32c(0, rec, KVX_R_CRC), rec + KVX_RECORD_HEADER_BYTES, (size_t)rows), p4, 4);
    kvx_store32(rec + KVX_R_CRC, crc);
    /* the pages first, then the record that names them */
    const char *step = "fdatasync of the pages";
    rc = kvx_os.fdatasync(w->fd) ? -errno : 0;
    if (!rc) {
        step = "writing the record";
        rc = kvx_os_pwrite_all(w->fd, rec, (size_t)len, w->jpos);
    }
    if (!rc) {
        step = "fdatasync of the record";
        rc = kvx_os.fdatasync(w->fd) ? -errno : 0;
    }
    if (rc && strcmp(step, "fdatasync of the pages") != 0) {
        /* a record its append did not see durable: taken back as far as
         * this process can (it may still have reached the disk, as any
         * failed write may; it is whole or it is nothing) */
        memset(rec, 0, (size_t)len);
        (void)kvx_os_pwrite_all(w->fd, rec, (size_t)len, w->jpos);
    }
    free(rec);
    if (rc) {
        if (rc > 0) rc = -EIO;
        w->broken = 1;
        return kvx_fail(rc, "%s: append of %u entries failed while %s: %s", w->path, count, step, kvx_strerror(rc));
    }
    w->appended = w->n;
    w->jpos = kvx_align_up(w->jpos + len, 8);
    w->chain = crc;
    w->last_seq = seq;
    return 0;
}

void kvx_shard_writer_rollback(kvx_shard_writer *w)
{
    if (!w || !w->active) return;
    for (uint32_t i = w->appended; i < w->n; i++) {
        uint32_t key = kvx_load32(w->coords + (size_t)i * KVX_ENTRY_BYTES + KVX_E_COORD) & 0xFFFFFFu;
        w->seen[key >> 3] &= (uint8_t)~(1u << (key & 7));
    }
    w->n = w->appended;
    if (w->seq_from > w->n) w->seq_from = w->n;
    /* the next page goes right after the last appended one; the seal's
     * size ends there too */
    w->kv_end = 0;
    for (uint32_t i = 0; i < w->n; i++) {
        const uint8_t *c = w->coords + (size_t)i * KVX_ENTRY_BYTES;
        uint64_t end = kvx_load64(c + KVX_E_OFFSET) + kvx_load32(c + KVX_E_BYTES);
        if (end > w->kv_end) w->kv_end = end;
    }
}

uint32_t kvx_shard_writer_appended(const kvx_shard_writer *w) { return w && w->active ? w->appended : 0; }

uint64_t kvx_active_kv_offset(const kvx_active_params *p)
{
    kvx_journal_geom jg;
    return kvx_journal_geom_for(&jg, p) ? 0 : jg.kv_data_offset;
}

uint64_t kvx_shard_writer_journal_used(const kvx_shard_writer *w)
{
    if (!w || !w->active) return 0;
    kvx_journal_geom jg;
    return kvx_journal_geom_for(&jg, &w->ap) ? 0 : w->jpos - jg.journal_off;
}

int kvx_shard_writer_seal_active(kvx_shard_writer *w, const char *sealed_path)
{
    if (!w) return kvx_fail(KVX_EINVALID, "kvx_shard_writer_seal_active: NULL writer");
    char path[4096];
    snprintf(path, sizeof path, "%s", w->path);
    const char *why = !w->active ? "not an active shard writer"
                      : w->broken ? "an append failed: the writer is broken"
                      : w->n != w->appended ? "entries were added since the last append (append or roll back first)"
                      : !sealed_path ? "no sealed path" : NULL;
    if (why) {
        kvx_sw_discard(w);
        return kvx_fail(KVX_EINVALID, "kvx_shard_writer_seal_active: %s: %s", path, why);
    }
    uint8_t *head = NULL;
    size_t head_len = 0;
    const char *step = "building the header";
    int rc = kvx_sw_build_head(w, &head, &head_len);
    if (!rc) {
        step = "writing the header and tables";
        rc = kvx_os_pwrite_all(w->fd, head, head_len, 0);
    }
    free(head);
    struct stat st;
    if (!rc) {
        step = "setting the file size";
        uint64_t bytes = kvx_shard_writer_bytes(w);
        rc = kvx_os.fstat(w->fd, &st) ? -errno : 0;
        /* to the end of the last appended page, rounded to 4096: what the
         * store registered; pages of entries rolled back past it go */
        if (!rc && (uint64_t)st.st_size != bytes) rc = kvx_os.ftruncate(w->fd, (off_t)bytes) ? -errno : 0;
    }
    if (!rc) {
        step = "fsync of the file";
        rc = kvx_os.fsync(w->fd) ? -errno : 0;
    }
    if (!rc) {
        step = "renaming it to its sealed name";
        rc = kvx_os.rename_noreplace(path, sealed_path) ? -errno : 0;
    }
    if (!rc) {
        /* the file is whole under either name; only the new name's
         * durability is in doubt on a failure here */
        step = "fsync of the directory";
        rc = kvx_os_fsync_parent(sealed_path);
    }
    kvx_sw_discard(w); /* an active writer's file is never removed */
    if (rc) {
        if (rc > 0) rc = -EIO;
        return kvx_fail(rc, "%s: seal failed while %s: %s", path, step, kvx_strerror(rc));
    }
    return 0;
}
