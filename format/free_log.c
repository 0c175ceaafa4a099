/*
 * free_log.c - the free log (free_log.h, docs/FORMAT.md "Free log").
 *
 * Rule kept: a record counts only when it reads whole and chained (its
 * CRC-32C covers its header, its rows and the previous record's CRC, the
 * first the file header's). A record is made durable before any page it
 * names is freed, so a record that does not read whole freed nothing: it
 * and what follows are a torn tail, never damage. The log is rewritten
 * whole (temporary file, fsync, rename) and otherwise only appended to.
 */
#include "free_log.h"
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A record's rows are read in windows of this many bytes (whole rows,
 * about 1 MiB). */
#define FL_WINDOW ((size_t)KVX_FREE_ROW_BYTES * 43690)

static void fl_header(uint8_t h[KVX_FREE_HEADER_BYTES])
{
    memset(h, 0, KVX_FREE_HEADER_BYTES);
    memcpy(h, KVX_FREE_LOG_MAGIC, 8);
    kvx_store32(h + 8, KVX_FREE_LOG_VERSION);
    kvx_store32(h + 60, kvx_crc32c(0, h, 60));
}

static uint32_t fl_chain(uint32_t crc, uint32_t prev)
{
    uint8_t p[4];
    kvx_store32(p, prev);
    return kvx_crc32c(crc, p, 4);
}

static void fl_row_encode(uint8_t *r, const kvx_freed *f)
{
    kvx_store64(r, f->gen);
    kvx_store64(r + 8, f->hash);
    kvx_store32(r + 16, f->entry);
    kvx_store32(r + 20, 0);
}

void kvx_free_log_free(kvx_free_log *l)
{
    if (!l) return;
    free(l->rows);
    memset(l, 0, sizeof *l);
}

/* Is the record at off whole and chained? 1 and its rows appended to l,
 * 0 (not whole: the tail begins at off), or a negative error. */
static int fl_record(int fd, uint64_t size, uint64_t off, kvx_free_log *l, uint8_t *win, const char *name)
{
    if (size - off < KVX_FREE_REC_HEADER_BYTES) return 0;
    size_t got = 0;
    int rc = kvx_os_pread_all(fd, win, KVX_FREE_REC_HEADER_BYTES, off, &got);
    if (rc) return kvx_fail(rc, "free log %s: read at %llu: %s", name, (unsigned long long)off, strerror(-rc));
    if (got < KVX_FREE_REC_HEADER_BYTES || memcmp(win, KVX_FREE_REC_MAGIC, 8)) return 0;
    uint64_t seq = kvx_load64(win + 8);
    uint32_t count = kvx_load32(win + 16), want = kvx_load32(win + 20);
    if (count < 1 || count > KVX_FREE_MAX_ROWS) return 0;
    uint64_t rows_bytes = (uint64_t)count * KVX_FREE_ROW_BYTES;
    if (size - off - KVX_FREE_REC_HEADER_BYTES < rows_bytes) return 0;
    /* the file holds every byte the header claims (checked above), so the
     * rows decoded before their CRC is known cost at most the file's size */
    kvx_freed *rows = realloc(l->rows, (l->n + count) * sizeof *rows);
    if (!rows) return kvx_fail(-ENOMEM, "free log %s: out of memory for %u rows", name, count);
    l->rows = rows;
    uint32_t crc = kvx_crc32c(0, win, 20);
    size_t n = l->n;
    for (uint64_t at = 0; at < rows_bytes;) {
        size_t step = rows_bytes - at < FL_WINDOW ? (size_t)(rows_bytes - at) : FL_WINDOW;
        rc = kvx_os_pread_all(fd, win, step, off + KVX_FREE_REC_HEADER_BYTES + at, &got);
        if (rc) return kvx_fail(rc, "free log %s: read at %llu: %s", name, (unsigned long long)off, strerror(-rc));
        if (got < step) return 0;
        crc = kvx_crc32c(crc, win, step);
        for (size_t k = 0; k + KVX_FREE_ROW_BYTES <= step; k += KVX_FREE_ROW_BYTES) {
            kvx_freed *f = &rows[n++];
            f->gen = kvx_load64(win + k);
            f->hash = kvx_load64(win + k + 8);
            f->entry = kvx_load32(win + k + 16);
            f->seq = seq;
        }
        at += step;
    }
    if (fl_chain(crc, l->last_crc) != want) return 0;
    if (seq <= l->max_seq)
        return kvx_fail(KVX_ECORRUPT,
                        "free log %s: record at offset %llu has sequence number %llu, not above the previous "
                        "record's %llu (no writer writes that)",
                        name, (unsigned long long)off, (unsigned long long)seq, (unsigned long long)l->max_seq);
    l->n = n;
    l->records++;
    l->max_seq = seq;
    l->last_crc = want;
    l->end = off + KVX_FREE_REC_HEADER_BYTES + rows_bytes;
    return 1;
}

int kvx_free_log_read(int dirfd, const char *name, kvx_free_log *out)
{
    if (!out || !name) return kvx_fail(KVX_EINVALID, "free log: NULL argument");
    memset(out, 0, sizeof *out);
    int fd = -1;
    unsigned mode = 0;
    int rc = kvx_os_openat_regular(dirfd, name, O_RDONLY, 0, &fd, &mode);
    if (rc == -ENOENT) return -ENOENT;
    if (rc == 1) return kvx_fail(KVX_EPATH, "free log %s: is a %s, not a regular file", name, kvx_file_type_name(mode));
    if (rc) return kvx_fail(rc, "free log %s: open: %s", name, strerror(-rc));
    struct stat st;
    uint8_t *win = NULL;
    if (kvx_os.fstat(fd, &st) != 0) {
        rc = kvx_fail(-errno, "free log %s: fstat: %s", name, strerror(errno));
        goto out;
    }
    uint64_t size = (uint64_t)st.st_size;
    uint8_t h[KVX_FREE_HEADER_BYTES], want[KVX_FREE_HEADER_BYTES];
    size_t got = 0;
    rc = kvx_os_pread_all(fd, h, sizeof h, 0, &got);
    if (rc) {
        rc = kvx_fail(rc, "free log %s: read: %s", name, strerror(-rc));
        goto out;
    }
    if (got < sizeof h) {
        rc = kvx_fail(KVX_ETRUNC, "free log %s: %zu bytes, shorter than its %d-byte header", name, got,
                      KVX_FREE_HEADER_BYTES);
        goto out;
    }
    if (memcmp(h, KVX_FREE_LOG_MAGIC, 8)) {
        rc = kvx_fail(KVX_EMAGIC, "free log %s: magic is not %s", name, KVX_FREE_LOG_MAGIC);
        goto out;
    }
    if (kvx_load32(h + 60) != kvx_crc32c(0, h, 60)) {
        rc = kvx_fail(KVX_ECORRUPT, "free log %s: header CRC-32C mismatch", name);
        goto out;
    }
    fl_header(want);
    if (kvx_load32(h + 8) != KVX_FREE_LOG_VERSION || memcmp(h, want, sizeof h)) {
        rc = kvx_fail(KVX_EVERSION, "free log %s: version %u (this release reads %d, reserved bytes zero)", name,
                      kvx_load32(h + 8), KVX_FREE_LOG_VERSION);
        goto out;
    }
    win = malloc(FL_WINDOW);
    if (!win) {
        rc = kvx_fail(-ENOMEM, "free log %s: out of memory", name);
        goto out;
    }
    out->last_crc = kvx_load32(h + 60);
    out->end = KVX_FREE_HEADER_BYTES;
    while ((rc = fl_record(fd, size, out->end, out, win, name)) == 1) {
    }
    if (rc == 0) out->tail = size - out->end;
out:
    free(win);
    kvx_os.close(fd);
    if (rc) kvx_free_log_free(out);
    return rc;
}

/* The record of rows at seq chained to prev, in a new buffer (*len bytes). */
static uint8_t *fl_encode(const kvx_freed *rows, size_t n, uint64_t seq, uint32_t prev, size_t *len, uint32_t *crc)
{
    size_t bytes = KVX_FREE_REC_HEADER_BYTES + n * KVX_FREE_ROW_BYTES;
    uint8_t *b = malloc(bytes);
    if (!b) return NULL;
    memcpy(b, KVX_FREE_REC_MAGIC, 8);
    kvx_store64(b + 8, seq);
    kvx_store32(b + 16, (uint32_t)n);
    for (size_t i = 0; i < n; i++) fl_row_encode(b + KVX_FREE_REC_HEADER_BYTES + i * KVX_FREE_ROW_BYTES, &rows[i]);
    uint32_t c = kvx_crc32c(0, b, 20);
    c = kvx_crc32c(c, b + KVX_FREE_REC_HEADER_BYTES, n * KVX_FREE_ROW_BYTES);
    c = fl_chain(c, prev);
    kvx_store32(b + 20, c);
    *len = bytes;
    *crc = c;
    return b;
}

static int fl_check_rows(size_t n, uint64_t seq, uint64_t above)
{
    if (n > KVX_FREE_MAX_ROWS)
        return kvx_fail(KVX_EINVALID, "free log: %zu rows in one record (at most %u)", n, KVX_FREE_MAX_ROWS);
    if (seq <= above)
        return kvx_fail(KVX_EINVALID, "free log: sequence number %llu is not above the last record's %llu",
                        (unsigned long long)seq, (unsigned long long)above);
    return 0;
}

int kvx_free_log_write(int dirfd, const char *name, const kvx_freed *rows, size_t n, uint64_t seq, kvx_free_log *out)
{
    if (!name || (n && !rows)) return kvx_fail(KVX_EINVALID, "free log: NULL argument");
    /* the records: all rows under seq, or (seq 0) one record per run of
     * rows sharing a sequence number, each run above the one before */
    uint64_t prev = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t q = seq ? seq : rows[i].seq;
        if (q == 0 || q < prev)
            return kvx_fail(KVX_EINVALID, "free log %s: row %zu has sequence number %llu (after %llu)", name, i,
                            (unsigned long long)q, (unsigned long long)prev);
        prev = q;
    }
    char tmp[96];
    snprintf(tmp, sizeof tmp, ".%s.tmp.%ld", name, (long)getpid());
    uint8_t h[KVX_FREE_HEADER_BYTES];
    fl_header(h);
    uint32_t crc = kvx_load32(h + 60);
    uint64_t end = KVX_FREE_HEADER_BYTES, max_seq = 0;
    uint32_t records = 0;
    kvx_os.unlinkat(dirfd, tmp, 0); /* a crashed writer's leftover of this pid */
    int fd = kvx_os.openat(dirfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return kvx_fail(-errno, "free log %s: create %s: %s", name, tmp, strerror(errno));
    int rc = kvx_os_pwrite_all(fd, h, sizeof h, 0);
    for (size_t i = 0; i < n && !rc;) {
        uint64_t q = seq ? seq : rows[i].seq;
        size_t j = i;
        while (j < n && (seq ? seq : rows[j].seq) == q && j - i < KVX_FREE_MAX_ROWS) j++;
        size_t len = 0;
        uint8_t *rec = fl_encode(rows + i, j - i, q, crc, &len, &crc);
        rc = rec ? kvx_os_pwrite_all(fd, rec, len, end) : -ENOMEM;
        free(rec);
        end += len;
        records++;
        max_seq = q;
        if (seq && j < n) seq++; /* one number a record */
        i = j;
    }
    if (!rc && kvx_os.fsync(fd) != 0) rc = -errno;
    kvx_os.close(fd);
    if (!rc && kvx_os.renameat(dirfd, tmp, dirfd, name) != 0) rc = -errno;
    if (rc) {
        kvx_os.unlinkat(dirfd, tmp, 0);
        return kvx_fail(rc, "free log %s: write: %s", name, strerror(-rc));
    }
    /* the rename is durable with its directory */
    int dfd = kvx_os.openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (dfd < 0 || kvx_os.fsync(dfd) != 0)
        rc = kvx_fail(-errno, "free log %s: fsync of its directory: %s", name, strerror(errno));
    if (dfd >= 0) kvx_os.close(dfd);
    if (rc) return rc;
    if (out) {
        memset(out, 0, sizeof *out);
        out->n = n;
        out->records = records;
        out->max_seq = max_seq;
        out->end = end;
        out->last_crc = crc;
    }
    return 0;
}

int kvx_free_log_append(int fd, kvx_free_log *l, const kvx_freed *rows, size_t n, uint64_t seq)
{
    if (!l || !rows || n == 0) return kvx_fail(KVX_EINVALID, "free log: an append needs rows");
    int rc = fl_check_rows(n, seq, l->max_seq);
    if (rc) return rc;
    size_t len = 0;
    uint32_t crc = 0;
    uint8_t *rec = fl_encode(rows, n, seq, l->last_crc, &len, &crc);
    if (!rec) return kvx_fail(-ENOMEM, "free log: out of memory");
    rc = kvx_os_pwrite_all(fd, rec, len, l->end);
    free(rec);
    if (!rc && kvx_os.fdatasync(fd) != 0) rc = -errno;
    if (rc) return kvx_fail(rc, "free log: append at %llu: %s", (unsigned long long)l->end, strerror(-rc));
    l->end += len;
    l->last_crc = crc;
    l->max_seq = seq;
    l->records++;
    l->tail = 0;
    return 0;
}
