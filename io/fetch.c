/*
 * fetch.c - kvx_fetch: a batch of (shard, entry) pages into pinned slots.
 *
 * The batch is planned once at submit: requests are sorted by file and
 * offset, pages that sit back to back in a file (a page starts at the
 * next 4096 boundary after the previous one ends) become one read of up to
 * max_read_bytes, and each read gets one pool slot, so a page's bytes land
 * at its offset within the read: no copy after the read, and every page is
 * 4096-aligned in pinned memory. The executor (ioq.c) does the reads and
 * the CRCs; here we only map finished reads back to request order.
 * Everything the batch owns (copies of the requests, results, slots, shard
 * references) is C memory, released by kvx_fetch_release: a cgo caller
 * passes Go arrays only for the duration of submit and wait.
 *
 * A shared-tier view's shard (kvx_shard_mem: pages on the heap, no file)
 * needs no read: its pages are copied into their slots at submit and
 * checked there like a page that landed (status 0 before any wait).
 *
 * Handles made with kvx_fetch_create_peer share one executor (ring,
 * depth, files): whichever handle is driven reaps every finished read and
 * routes it to its owner (run->owner), so the next batch's reads fill the
 * queue while the previous batch's tail lands. Each handle counts its own
 * outstanding reads; release and cancel touch only their own.
 */
#include "io.h"
#include "format/format.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>

typedef struct item {
    kvx_shard *shard;
    kvx_io_file *file;
    uint64_t off;
    uint64_t bytes;
    uint32_t crc;
    uint32_t req;
    uint32_t entry;
} item;

typedef struct fshared {
    kvx_ioq *q;
    unsigned refs;
    /* A wait failed for good while a batch had reads in flight (its
     * -errno): the kernel may still complete them, so the run and page
     * arrays they point at are parked here until the queue is destroyed,
     * and no new batch starts on the queue. */
    int broken;
    void **parked;
    size_t n_parked, cap_parked;
} fshared;

struct kvx_fetch {
    kvx_pool *pool;
    fshared *sh;
    kvx_ioq *q; /* sh->q */
    uint32_t max_read;
    int verify;
    /* the batch */
    size_t n;
    int active;
    kvx_shard **refs; /* n, NULL where the request failed early */
    kvx_fetch_result *res;
    kvx_io_page *pages;
    kvx_io_run *runs;
    size_t n_runs;
    size_t done;
    size_t outstanding; /* runs pushed, not yet absorbed (by us or a peer) */
    int direct;         /* the last batch read some file with O_DIRECT */
};

int kvx_fetch_create(kvx_fetch **out, kvx_pool *pool, const kvx_fetch_options *opts)
{
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_fetch_create: out is NULL");
    *out = NULL;
    if (!pool) return kvx_fail(KVX_EINVALID, "kvx_fetch_create: pool is NULL");
    kvx_fetch_options def = KVX_FETCH_OPTIONS_INIT;
    if (!opts) opts = &def;
    if (opts->version != KVX_FETCH_OPTIONS_VERSION)
        return kvx_fail(KVX_EVERSION, "kvx_fetch_options.version is %u, expected %u", opts->version,
                        KVX_FETCH_OPTIONS_VERSION);
    if (opts->flags & ~(uint32_t)(KVX_FETCH_NO_VERIFY | KVX_FETCH_BUFFERED))
        return kvx_fail(KVX_EINVALID, "kvx_fetch_options.flags has unknown bits 0x%x", opts->flags);
    if (opts->max_read_bytes && opts->max_read_bytes < KVX_IO_SLOT_ALIGN)
        return kvx_fail(KVX_EINVALID, "kvx_fetch_options.max_read_bytes %u is below 4096",
                        opts->max_read_bytes);
    kvx_fetch *f = calloc(1, sizeof *f);
    if (!f) return kvx_fail(-ENOMEM, "kvx_fetch_create: out of memory");
    f->pool = pool;
    f->max_read = opts->max_read_bytes ? opts->max_read_bytes : 4u << 20;
    f->verify = !(opts->flags & KVX_FETCH_NO_VERIFY);
    kvx_ioq_options qo = {opts->io_mode, opts->queue_depth, opts->threads,
                          (opts->flags & KVX_FETCH_BUFFERED) != 0, pool, 0};
    f->sh = calloc(1, sizeof *f->sh);
    if (!f->sh) {
        free(f);
        return kvx_fail(-ENOMEM, "kvx_fetch_create: out of memory");
    }
    int rc = kvx_ioq_create(&f->sh->q, &qo);
    if (rc) {
        free(f->sh);
        free(f);
        return rc;
    }
    f->sh->refs = 1;
    f->q = f->sh->q;
    *out = f;
    return 0;
}

int kvx_fetch_create_peer(kvx_fetch **out, kvx_fetch *peer)
{
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_fetch_create_peer: out is NULL");
    *out = NULL;
    if (!peer) return kvx_fail(KVX_EINVALID, "kvx_fetch_create_peer: peer is NULL");
    kvx_fetch *f = calloc(1, sizeof *f);
    if (!f) return kvx_fail(-ENOMEM, "kvx_fetch_create_peer: out of memory");
    f->pool = peer->pool;
    f->max_read = peer->max_read;
    f->verify = peer->verify;
    f->sh = peer->sh;
    f->sh->refs++;
    f->q = f->sh->q;
    *out = f;
    return 0;
}

int kvx_fetch_mode(const kvx_fetch *f) { return f ? kvx_ioq_mode(f->q) : KVX_IO_AUTO; }
int kvx_fetch_direct(const kvx_fetch *f) { return f ? f->direct : 0; }

static int absorb(kvx_fetch *f, int timeout_ms);

/* Parks f's runs and pages on its queue (see fshared), their owner
 * cleared. Without memory to note them they are leaked: never freed under
 * a read either way. */
static void park(kvx_fetch *f)
{
    fshared *sh = f->sh;
    for (size_t i = 0; i < f->n_runs; i++) f->runs[i].owner = NULL;
    if (sh->cap_parked - sh->n_parked < 2) {
        size_t nc = sh->cap_parked ? 2 * sh->cap_parked : 8;
        void **np = realloc(sh->parked, nc * sizeof *np);
        if (!np) return;
        sh->parked = np;
        sh->cap_parked = nc;
    }
    sh->parked[sh->n_parked++] = f->runs;
    sh->parked[sh->n_parked++] = f->pages;
}

void kvx_fetch_release(kvx_fetch *f)
{
    if (!f || !f->active) return;
    int drained = 1;
    if (f->outstanding > 0) {
        /* The kernel may still write into our slots: drain first. */
        kvx_ioq_cancel_owner(f->q, f);
        while (f->outstanding > 0) {
            int rc = absorb(f, -1);
            if (rc < 0) {
                drained = 0;
                if (!f->sh->broken) f->sh->broken = rc;
                break;
            }
        }
    }
    /* A wait that failed for good (not EINTR: reap retries that) leaves
     * reads the kernel may still land: their slots are never given back,
     * or a late read would overwrite pages another batch verified. They
     * are lost until the pool is destroyed. The runs and their pages stay
     * too (a completion names its run, whose pages it fills in), parked
     * without an owner, so a later reap by any handle of the queue skips
     * them; the queue takes no new batch. */
    for (size_t i = 0; drained && i < f->n_runs; i++)
        if (f->runs[i].buf) kvx_pool_free(f->pool, f->runs[i].buf, f->runs[i].len);
    for (size_t i = 0; i < f->n; i++) kvx_shard_close(f->refs[i]);
    if (kvx_ioq_pending(f->q) == 0) kvx_ioq_files_trim(f->q); /* a peer's reads may use them */
    free(f->refs);
    free(f->res);
    if (drained) {
        free(f->pages);
        free(f->runs);
    } else {
        park(f);
    }
    f->outstanding = 0;
    f->refs = NULL;
    f->res = NULL;
    f->pages = NULL;
    f->runs = NULL;
    f->n = f->n_runs = f->done = 0;
    f->active = 0;
}

void kvx_fetch_destroy(kvx_fetch *f)
{
    if (!f) return;
    kvx_fetch_release(f);
    if (--f->sh->refs == 0) {
        kvx_ioq_destroy(f->sh->q); /* after it, no completion names a parked run */
        for (size_t i = 0; i < f->sh->n_parked; i++) free(f->sh->parked[i]);
        free(f->sh->parked);
        free(f->sh);
    }
    free(f);
}

static int item_cmp(const void *a, const void *b)
{
    const item *x = a, *y = b;
    if (x->file != y->file) return (uintptr_t)x->file < (uintptr_t)y->file ? -1 : 1;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return x->req < y->req ? -1 : x->req > y->req;
}

/* A page of a shard without a file (a shared-tier view's, kvx_shard_mem:
 * its pages were checked when the tier's value was): copied into its slot
 * and checked there as a read page would be, done at once. */
static void copy_mem_page(kvx_fetch *f, kvx_io_run *run, kvx_shard *shard, uint32_t entry)
{
    kvx_io_page *pg = &run->pages[0];
    const void *src = NULL;
    if (kvx_shard_page(&src, shard, entry, 0) == 0) {
        memcpy(run->buf + pg->rel, src, pg->bytes);
        run->got = run->want;
    }
    kvx_io_run_finish(run); /* the CRC of the copy; KVX_ETRUNC had there been no page */
    f->res[pg->tag].status = pg->status;
    f->res[pg->tag].crc32 = pg->crc_got;
    f->done++;
}

int kvx_fetch_submit(kvx_fetch *f, const kvx_fetch_req *reqs, size_t n)
{
    if (!f || (n && !reqs)) return kvx_fail(KVX_EINVALID, "kvx_fetch_submit: fetch or reqs is NULL");
    if (n > UINT32_MAX) return kvx_fail(KVX_EINVALID, "kvx_fetch_submit: n %zu is too large", n);
    kvx_fetch_release(f);
    if (f->sh->broken)
        return kvx_fail(-EIO,
                        "kvx_fetch_submit: the fetch queue is unusable: an io_uring wait failed (%s) while reads "
                        "were in flight, which the kernel may still complete; destroy this handle and its peers",
                        strerror(-f->sh->broken));
    f->active = 1;
    f->direct = 0;
    f->n = n;
    f->refs = calloc(n ? n : 1, sizeof *f->refs);
    f->res = calloc(n ? n : 1, sizeof *f->res);
    f->pages = calloc(n ? n : 1, sizeof *f->pages);
    f->runs = calloc(n ? n : 1, sizeof *f->runs);
    item *items = calloc(n ? n : 1, sizeof *items);
    if (!f->refs || !f->res || !f->pages || !f->runs || !items) {
        free(items);
        kvx_fetch_release(f);
        return kvx_fail(-ENOMEM, "kvx_fetch_submit: out of memory");
    }
    size_t n_items = 0;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        kvx_fetch_result *r = &f->res[i];
        if (!reqs[i].shard) {
            r->status = KVX_EINVALID;
            f->done++;
            continue;
        }
        kvx_entry e;
        int erc = kvx_shard_entry(&e, reqs[i].shard, reqs[i].entry);
        if (erc == KVX_EINVALID && reqs[i].entry >= kvx_shard_get_info(reqs[i].shard)->num_blocks)
            erc = KVX_ENOTFOUND; /* kvx.h: no such entry; KVX_EINVALID is a NULL shard */
        /* a tombstone (a keyed delete), or a page its store freed in place:
         * no page to fetch */
        if (!erc && kvx_shard_absent(reqs[i].shard, reqs[i].entry)) erc = KVX_ENOTFOUND;
        if (erc) {
            r->status = erc;
            f->done++;
            continue;
        }
        kvx_io_file *file = NULL; /* none: a shared-tier view's shard (no file) */
        if (kvx_shard_fd(reqs[i].shard) >= 0) {
            rc = kvx_ioq_file(&file, f->q, kvx_shard_fd(reqs[i].shard));
            if (rc) goto fail;
            f->direct |= file->direct;
        }
        f->refs[i] = kvx_shard_ref(reqs[i].shard);
        r->bytes = e.bytes;
        items[n_items++] = (item){reqs[i].shard, file, e.offset, e.bytes, e.crc32, (uint32_t)i, reqs[i].entry};
    }
    qsort(items, n_items, sizeof *items, item_cmp); /* file-less pages first (NULL) */
    /* Coalesce: back-to-back pages of one file, up to max_read per read; a
     * file-less page is a run of its own (its offset is notional). */
    for (size_t i = 0; i < n_items;) {
        kvx_io_run *run = &f->runs[f->n_runs++];
        kvx_io_file *file = items[i].file;
        uint64_t start = file ? items[i].off - items[i].off % file->align : items[i].off;
        uint64_t end = items[i].off + items[i].bytes;
        size_t j = i + 1;
        while (file && j < n_items && items[j].file == file && items[j].off == kvx_align_up(end, 4096) &&
               items[j].off + items[j].bytes - start <= f->max_read) {
            end = items[j].off + items[j].bytes;
            j++;
        }
        run->file = file;
        run->off = start;
        run->want = end - start;
        run->len = kvx_align_up(run->want, file ? file->align : 1);
        run->verify = f->verify;
        run->pages = &f->pages[i];
        run->n_pages = (uint32_t)(j - i);
        run->owner = f;
        rc = kvx_pool_alloc((void **)&run->buf, f->pool, run->len);
        if (rc) goto fail;
        for (size_t k = i; k < j; k++) {
            kvx_io_page *pg = &f->pages[k];
            pg->rel = items[k].off - start;
            pg->bytes = items[k].bytes;
            pg->crc_want = items[k].crc;
            pg->tag = items[k].req;
            f->res[items[k].req].page = run->buf + pg->rel;
        }
        if (!file) copy_mem_page(f, run, items[i].shard, items[i].entry);
        i = j;
    }
    free(items);
    f->outstanding = 0;
    for (size_t i = 0; i < f->n_runs; i++)
        if (f->runs[i].file) {
            f->outstanding++;
            kvx_ioq_push(f->q, &f->runs[i]);
        }
    kvx_ioq_kick(f->q);
    return 0;
fail:
    free(items);
    kvx_fetch_release(f);
    return rc;
}

static int absorb(kvx_fetch *f, int timeout_ms)
{
    kvx_io_run *got_runs[64];
    int got = kvx_ioq_reap(f->q, got_runs, 64, timeout_ms);
    if (got < 0) return got;
    for (int i = 0; i < got; i++) {
        kvx_io_run *r = got_runs[i];
        kvx_fetch *o = r->owner; /* f, or a peer sharing the queue */
        if (!o) continue;        /* parked: its batch was released after a failed wait */
        for (uint32_t k = 0; k < r->n_pages; k++) {
            kvx_fetch_result *res = &o->res[r->pages[k].tag];
            res->status = r->pages[k].status;
            res->crc32 = r->pages[k].crc_got;
        }
        o->done += r->n_pages;
        o->outstanding--;
    }
    return 0;
}

int kvx_fetch_poll(kvx_fetch *f, size_t *out_done)
{
    if (!f) return kvx_fail(KVX_EINVALID, "kvx_fetch_poll: fetch is NULL");
    int rc = f->active && f->done < f->n ? absorb(f, 0) : 0;
    if (out_done) *out_done = f->done;
    return rc;
}

int kvx_fetch_wait(kvx_fetch *f, kvx_fetch_result *out, size_t n, int timeout_ms)
{
    if (!f) return kvx_fail(KVX_EINVALID, "kvx_fetch_wait: fetch is NULL");
    if (!f->active) return kvx_fail(KVX_EINVALID, "kvx_fetch_wait: no batch was submitted");
    if (n != f->n || (n && !out))
        return kvx_fail(KVX_EINVALID, "kvx_fetch_wait: n is %zu, the batch has %zu pages", n, f->n);
    double deadline = kvx_io_now() + (timeout_ms > 0 ? timeout_ms / 1000.0 : 0);
    while (f->done < f->n) {
        int left = -1;
        if (timeout_ms == 0) {
            left = 0; /* collect what has landed, then answer */
        } else if (timeout_ms > 0) {
            double s = deadline - kvx_io_now();
            if (s <= 0) return -ETIMEDOUT;
            double ms = s * 1000 + 1; /* rounding may put a timeout near INT_MAX just past it */
            left = ms >= (double)INT_MAX ? INT_MAX : (int)ms;
        }
        int rc = absorb(f, left);
        if (rc) return rc;
        if (timeout_ms == 0 && f->done < f->n) return -ETIMEDOUT;
    }
    if (n) memcpy(out, f->res, n * sizeof *out);
    return 0;
}

int kvx_fetch_cancel(kvx_fetch *f)
{
    if (!f) return kvx_fail(KVX_EINVALID, "kvx_fetch_cancel: fetch is NULL");
    if (f->active) kvx_ioq_cancel_owner(f->q, f);
    return 0;
}
