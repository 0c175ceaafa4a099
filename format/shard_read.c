/*
 * shard_read.c - a page read into the caller's memory and checked there
 * (format/format.h kvx_shard_page_read): the path of a load that copies
 * pages out anyway (vLLM's and LMCache's host slots), where a zero-copy
 * view would cost a page fault per 4 KiB, a CRC pass over the mapping and
 * then the copy.
 *
 * Rule (DESIGN.md rule 1): the bytes checked are the bytes handed over.
 * The CRC-32 runs over dst after the read, every time, so a page that
 * changed on disk since an earlier check is caught here too.
 */
#include "format/format.h"
#include "format/shard_format.h"
#include "format/shard_handle.h"
#include "common/os.h"

#include <errno.h>
#include <liburing.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SR_ALIGN 4096u

/* The O_DIRECT descriptor of s's file: /proc/self/fd/N names the very
 * file s opened, whatever has been renamed since. */
static int shard_direct_fd(kvx_shard *s)
{
    int fd = atomic_load_explicit(&s->direct_fd, memory_order_acquire);
    if (fd != -1) return fd;
    char name[40];
    snprintf(name, sizeof name, "/proc/self/fd/%d", s->fd);
    int mine = kvx_os.open(name, O_RDONLY | O_CLOEXEC | O_DIRECT | O_NOCTTY, 0), want = -1;
    if (mine < 0) mine = -2;
    if (!atomic_compare_exchange_strong(&s->direct_fd, &want, mine) && mine >= 0) kvx_os.close(mine);
    return atomic_load_explicit(&s->direct_fd, memory_order_acquire);
}

/* The page's place in s's file (out->direct_fd left -1: with direct, the
 * O_DIRECT descriptor, opened on first need). */
static int sr_span_of(kvx_page_span *out, kvx_shard *s, uint32_t index, int direct)
{
    if (s->mem || index >= s->n)
        return kvx_fail(KVX_EINVALID, "kvx_shard_page_span: index %u of a shard of %u entries%s", index, s->n,
                        s->mem ? " in memory" : "");
    const shard_rec *r = &s->recs[index];
    if (is_tomb(s, index))
        return kvx_fail(KVX_ENOTFOUND, "entry %u (coordinate 0x%08x) of %s is a tombstone (a keyed delete): it has no page",
                        index, r->coordinate, s->path);
    if (r->missing)
        return kvx_fail(KVX_ETRUNC, "entry %u (coordinate 0x%08x): page lies past the end of %s (missing)", index,
                        r->coordinate, s->path);
    out->fd = s->fd;
    out->direct_fd = direct ? shard_direct_fd(s) : -1;
    out->offset = r->offset;
    out->bytes = r->bytes;
    out->crc32 = r->crc32;
    out->map = s->map;
    out->coordinate = r->coordinate;
    return 0;
}

int kvx_shard_page_span(kvx_page_span *out, kvx_shard *s, uint32_t index) { return sr_span_of(out, s, index, 1); }

static int sr_span(kvx_page_span *out, kvx_shard *s, uint32_t index) { return sr_span_of(out, s, index, 0); }

/* Does the page cache hold every 4 KiB page of [off, off + len)? mincore
 * over the handle's mapping: no I/O, no side effect. */
static int sr_resident(const uint8_t *map, uint64_t off, uint64_t len)
{
    if (!map || !len) return 0;
    long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0) return 0;
    uint64_t from = off - off % (uint64_t)ps, to = off + len;
    unsigned char vec[256];
    while (from < to) {
        uint64_t span = to - from, most = (uint64_t)sizeof vec * (uint64_t)ps;
        if (span > most) span = most;
        if (mincore((void *)(map + from), (size_t)span, vec) != 0) return 0;
        for (uint64_t i = 0; i < (span + (uint64_t)ps - 1) / (uint64_t)ps; i++)
            if (!(vec[i] & 1)) return 0;
        from += span;
    }
    return 1;
}

/* O_DIRECT reads of the 4096-aligned head of the page into dst; *got is
 * how far they came (the rest is read through the cache). */
static int sr_direct(int dfd, uint8_t *dst, uint64_t off, uint64_t len, uint64_t *got)
{
    uint64_t want = len - len % SR_ALIGN;
    *got = 0;
    while (*got < want) {
        size_t chunk = want - *got > ((size_t)1 << 30) ? (size_t)1 << 30 : (size_t)(want - *got);
        ssize_t n = kvx_os.pread(dfd, dst + *got, chunk, (off_t)(off + *got));
        if (n < 0) {
            if (errno == EINTR) continue;
            /* EINVAL: a device whose logical block is larger than 4096,
             * or a file system without O_DIRECT reads: the cache reads it */
            return errno == EINVAL && *got == 0 ? 0 : -errno;
        }
        if (n == 0) break;
        *got += (uint64_t)n;
        if ((uint64_t)n % SR_ALIGN) break; /* the end of the file: the cache path says how short */
    }
    if (*got % SR_ALIGN) *got -= *got % SR_ALIGN;
    return 0;
}

/* The page after its O_DIRECT head (got bytes) arrived: the rest through
 * the cache, then the CRC-32 over dst. */
static int sr_finish(const kvx_page_span *sp, uint32_t index, uint8_t *d, uint64_t got, size_t *out_len)
{
    size_t tail = 0;
    if (got < sp->bytes) {
        int rc = kvx_os_pread_all(sp->fd, d + got, (size_t)(sp->bytes - got), sp->offset + got, &tail);
        if (rc) return kvx_fail(rc, "entry %u (coordinate 0x%08x): read: %s", index, sp->coordinate, strerror(-rc));
    }
    if (got + tail < sp->bytes)
        return kvx_fail(KVX_ETRUNC, "entry %u (coordinate 0x%08x): the file ends %llu bytes into the page of %u",
                        index, sp->coordinate, (unsigned long long)(got + tail), sp->bytes);
    uint32_t crc = kvx_crc32(0, d, sp->bytes);
    if (crc != sp->crc32)
        return kvx_fail(KVX_EPAGECRC, "entry %u (coordinate 0x%08x): page CRC-32 0x%08x, stored 0x%08x", index,
                        sp->coordinate, crc, sp->crc32);
    *out_len = sp->bytes;
    return 0;
}

/* A page the page cache holds, copied from the handle's mapping into d
 * and checked there: in 16 KiB steps, each checked while it is still in
 * the core's first-level cache (no system call; a page cut off since
 * reads as zeros under the SIGBUS guard, and fails its CRC). */
#define SR_STEP ((size_t)16 << 10)
static int sr_copy_checked(const kvx_page_span *sp, uint32_t index, uint8_t *d, size_t *out_len)
{
    uint32_t crc = 0;
    for (size_t o = 0; o < sp->bytes; o += SR_STEP) {
        size_t c = sp->bytes - o < SR_STEP ? sp->bytes - o : SR_STEP;
        memcpy(d + o, sp->map + sp->offset + o, c);
        crc = kvx_crc32(crc, d + o, c);
    }
    if (crc != sp->crc32)
        return kvx_fail(KVX_EPAGECRC, "entry %u (coordinate 0x%08x): page CRC-32 0x%08x, stored 0x%08x", index,
                        sp->coordinate, crc, sp->crc32);
    *out_len = sp->bytes;
    return 0;
}

/* The page's span, its buffer checked; *resident: the page cache holds it;
 * *direct: read its head with O_DIRECT. */
static int sr_plan(kvx_page_span *sp, int *direct, int *resident, kvx_shard *s, uint32_t index, const void *dst,
                   size_t cap)
{
    memset(sp, 0, sizeof *sp);
    *direct = 0;
    int rc = kvx_shard_page_span(sp, s, index);
    if (rc) return rc;
    if (cap < sp->bytes)
        return kvx_fail(KVX_ECAPACITY, "entry %u (coordinate 0x%08x): the page is %u bytes, the buffer %zu", index,
                        sp->coordinate, sp->bytes, cap);
    *resident = sr_resident(sp->map, sp->offset, sp->bytes);
    *direct = sp->direct_fd >= 0 && (uintptr_t)dst % SR_ALIGN == 0 && sp->offset % SR_ALIGN == 0 &&
              sp->bytes >= SR_ALIGN && !*resident;
    return 0;
}

int kvx_shard_page_read(kvx_shard *s, uint32_t index, void *dst, size_t cap, size_t *out_len)
{
    *out_len = 0;
    kvx_page_span sp;
    int direct, resident;
    int rc = sr_plan(&sp, &direct, &resident, s, index, dst, cap);
    if (rc) return rc;
    uint64_t got = 0;
    if (direct && (rc = sr_direct(sp.direct_fd, dst, sp.offset, sp.bytes, &got)))
        return kvx_fail(rc, "entry %u (coordinate 0x%08x): read: %s", index, sp.coordinate, strerror(-rc));
    return sr_finish(&sp, index, dst, got, out_len);
}

/* A run of pages read as one O_DIRECT read: pages w[first..first+count)
 * of the batch lie back to back in one file and back to back in the
 * caller's memory (each but the last a whole number of 4096-blocks), so
 * one read of len bytes at off into dst fills them all. */
typedef struct sr_seg {
    size_t first, count;
    uint64_t off, len;
    int fd; /* the O_DIRECT descriptor */
    void *dst;
} sr_seg;

#define SR_SEG_MAX ((uint64_t)1 << 20) /* the most one coalesced read takes (fio's bs 1 MiB) */

/* The bytes of page sp an O_DIRECT read takes: its whole 4096-blocks
 * (the rest through the cache). */
static uint64_t sr_head(const kvx_page_span *sp) { return sp->bytes - sp->bytes % SR_ALIGN; }

/* Pages w[0..nd) grouped into runs one read fills; returns the count. */
static size_t sr_segments(sr_seg *seg, const kvx_page_span *sp, void *const *dst, const size_t *w, size_t nd)
{
    size_t ns = 0;
    for (size_t k = 0; k < nd; k++) {
        size_t i = w[k];
        if (ns) {
            sr_seg *g = &seg[ns - 1];
            size_t p = w[g->first + g->count - 1];
            if (g->fd == sp[i].direct_fd && sp[p].bytes % SR_ALIGN == 0 &&
                sp[i].offset == sp[p].offset + sp[p].bytes && (uint8_t *)dst[i] == (uint8_t *)dst[p] + sp[p].bytes &&
                g->len + sr_head(&sp[i]) <= SR_SEG_MAX) {
                g->count++;
                g->len += sr_head(&sp[i]);
                continue;
            }
        }
        seg[ns++] = (sr_seg){k, 1, sp[i].offset, sr_head(&sp[i]), sp[i].direct_fd, dst[i]};
    }
    return ns;
}

/* The pages of one completed read: how far each came (got), or its
 * failure (err; EINVAL, where O_DIRECT is refused, leaves the page to the
 * cache path), then each finished and checked at once while the other
 * reads are in flight (fin marks those finished). */
static void sr_landed(const sr_seg *g, int res, const kvx_page_span *sp, void *const *dst, const size_t *w,
                      const uint32_t *index, uint64_t *got, int *err, uint8_t *done, uint8_t *fin, int *out_rc,
                      size_t *out_len)
{
    for (size_t c = 0; c < g->count; c++) {
        size_t i = w[g->first + c];
        uint64_t at = sp[i].offset - g->off, head = sr_head(&sp[i]);
        done[i] = 1;
        if (res < 0) {
            if (res != -EINVAL) err[i] = res;
            continue;
        }
        uint64_t r = (uint64_t)res - (uint64_t)res % SR_ALIGN;
        got[i] = r > at ? (r - at < head ? r - at : head) : 0;
        out_rc[i] = sr_finish(&sp[i], index[i], dst[i], got[i], &out_len[i]);
        fin[i] = 1;
    }
}

/* One wave of reads in flight together: runs seg[0..m) (each under
 * 1 GiB). Returns only once every read it submitted completed: nothing
 * lands in a buffer after the call. A read the ring never took leaves its
 * pages (done 0) to the sr_direct path. */
static void sr_wave(struct io_uring *ring, const sr_seg *seg, size_t m, const kvx_page_span *sp, void *const *dst,
                    const size_t *w, const uint32_t *index, uint64_t *got, int *err, uint8_t *done, uint8_t *fin,
                    int *out_rc, size_t *out_len)
{
    size_t queued = 0, inflight = 0;
    for (; queued < m; queued++) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
        if (!sqe) break;
        io_uring_prep_read(sqe, seg[queued].fd, seg[queued].dst, (unsigned)seg[queued].len, seg[queued].off);
        io_uring_sqe_set_data64(sqe, queued);
    }
    while (inflight < queued) { /* everything queued goes in (a partial submit leaves the rest queued) */
        int sub = io_uring_submit(ring);
        if (sub < 0 && sub != -EINTR && sub != -EAGAIN && sub != -EBUSY) break;
        if (sub > 0) inflight += (size_t)sub;
    }
    /* a submit that failed for good: what it never took stays queued and
     * is never waited for */
    for (size_t seen = 0; seen < inflight;) {
        struct io_uring_cqe *cqe;
        int e = io_uring_wait_cqe(ring, &cqe);
        if (e < 0) continue; /* EINTR, EAGAIN: the reads are still in flight */
        size_t k = (size_t)io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(ring, cqe);
        seen++;
        sr_landed(&seg[k], res, sp, dst, w, index, got, err, done, fin, out_rc, out_len);
    }
}

#define SR_RING 64 /* O_DIRECT reads in flight at once */

void kvx_shard_pages_read(kvx_shard *const *s, const uint32_t *index, size_t n, void *const *dst, const size_t *cap,
                          int *out_rc, size_t *out_len)
{
    size_t m = n ? n : 1, nd = 0;
    kvx_page_span *sp = calloc(m, sizeof *sp);
    uint64_t *got = calloc(m, sizeof *got);
    int *direct = calloc(m, sizeof *direct), *err = calloc(m, sizeof *err);
    uint8_t *done = calloc(m, 1), *fin = calloc(m, 1);
    size_t *w = calloc(m, sizeof *w);
    sr_seg *seg = calloc(m, sizeof *seg);
    if (!sp || !got || !direct || !err || !done || !fin || !w || !seg) { /* one page at a time */
        for (size_t i = 0; i < n; i++) out_rc[i] = kvx_shard_page_read(s[i], index[i], dst[i], cap[i], &out_len[i]);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        out_len[i] = 0;
        int resident = 0;
        out_rc[i] = sr_plan(&sp[i], &direct[i], &resident, s[i], index[i], dst[i], cap[i]);
        if (out_rc[i]) continue;
        if (direct[i] && sr_head(&sp[i]) < ((uint64_t)1 << 30)) {
            w[nd++] = i;
        } else if (resident && kvx_os_seam_is_default()) { /* in the cache: from the mapping, no system call */
            out_rc[i] = sr_copy_checked(&sp[i], index[i], dst[i], &out_len[i]);
            fin[i] = 1;
        }
    }
    /* the ring only where it pays (two pages or more) and where reads are
     * the OS's own (a test's fault seam sees each read through sr_direct) */
    struct io_uring ring;
    if (nd >= 2 && kvx_os_seam_is_default()) {
        size_t ns = sr_segments(seg, sp, dst, w, nd);
        if (io_uring_queue_init(ns < SR_RING ? (unsigned)ns : SR_RING, &ring, 0) == 0) {
            for (size_t k = 0; k < ns; k += SR_RING)
                sr_wave(&ring, seg + k, ns - k < SR_RING ? ns - k : SR_RING, sp, dst, w, index, got, err, done, fin,
                        out_rc, out_len);
            io_uring_queue_exit(&ring);
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (out_rc[i] || fin[i]) continue;
        int rc = err[i];
        if (!done[i] && direct[i]) rc = sr_direct(sp[i].direct_fd, dst[i], sp[i].offset, sp[i].bytes, &got[i]);
        out_rc[i] = rc ? kvx_fail(rc, "entry %u (coordinate 0x%08x): read: %s", index[i], sp[i].coordinate,
                                  strerror(-rc))
                       : sr_finish(&sp[i], index[i], dst[i], got[i], &out_len[i]);
    }
out:
    free(sp);
    free(got);
    free(direct);
    free(err);
    free(done);
    free(fin);
    free(w);
    free(seg);
}

void kvx_shard_pages_copy(kvx_shard *const *s, const uint32_t *index, size_t n, void *const *dst, const size_t *cap,
                          int *out_rc, size_t *out_len)
{
    /* a test's fault seam sees every read: the same pages through pread */
    if (!kvx_os_seam_is_default()) {
        kvx_shard_pages_read(s, index, n, dst, cap, out_rc, out_len);
        return;
    }
    /* the run's pages asked for at once, a hint per contiguous range of a
     * file (the first range, at a file's start, left to the first fault's
     * read-around: large folios) */
    for (size_t a = 0; a < n;) {
        size_t b = a;
        while (b < n && b - a < 64 && s[b] == s[a]) b++;
        kvx_shard_willneed(s[a], index + a, b - a, a == 0);
        a = b;
    }
    for (size_t i = 0; i < n; i++) {
        kvx_page_span sp;
        out_len[i] = 0;
        out_rc[i] = sr_span(&sp, s[i], index[i]);
        if (!out_rc[i] && cap[i] < sp.bytes)
            out_rc[i] = kvx_fail(KVX_ECAPACITY, "entry %u (coordinate 0x%08x): the page is %u bytes, the buffer %zu",
                                 index[i], sp.coordinate, sp.bytes, cap[i]);
        if (out_rc[i]) continue;
        kvx_shard_prefetch(s[i], &s[i]->recs[index[i]]);
        out_rc[i] = sr_copy_checked(&sp, index[i], dst[i], &out_len[i]);
        if (out_rc[i] == 0) /* the bytes in the mapping passed: as a view's first check */
            atomic_fetch_or_explicit(&s[i]->checked[index[i] / 64], 1ull << (index[i] % 64), memory_order_relaxed);
    }
}

uint32_t kvx_shard_refs(const kvx_shard *s)
{
    return s ? (uint32_t)atomic_load_explicit(&((kvx_shard *)s)->refs, memory_order_seq_cst) : 0;
}

void kvx_shard_on_free(kvx_shard *s, void (*fn)(void *ctx), void *ctx)
{
    if (!s) return;
    s->on_free = fn;
    s->on_free_ctx = ctx;
}

void kvx_shard_mark_freed(kvx_shard *s, uint32_t index)
{
    if (!s || index >= s->n) return;
    _Atomic uint64_t *f = atomic_load(&s->freed);
    if (!f) {
        _Atomic uint64_t *nf = calloc((size_t)s->n / 64 + 1, sizeof *nf), *none = NULL;
        if (!nf) return; /* unmarked: a reader of its page finds it damaged, never a wrong page */
        if (atomic_compare_exchange_strong(&s->freed, &none, nf))
            f = nf;
        else {
            free((void *)nf);
            f = none;
        }
    }
    atomic_fetch_or(&f[index / 64], 1ull << (index % 64));
}

int kvx_shard_absent(const kvx_shard *s, uint32_t index)
{
    int tomb = 0;
    if (kvx_shard_entry_commit(s, index, NULL, &tomb) == 0 && tomb) return 1;
    _Atomic uint64_t *f = s && index < s->n ? atomic_load(&((kvx_shard *)s)->freed) : NULL;
    return f && (atomic_load(&f[index / 64]) >> (index % 64) & 1);
}
