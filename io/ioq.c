/*
 * ioq.c - the read executor under fetch and warmup (see io.h).
 *
 * io_uring path: runs are queued, started up to the queue depth as
 * READ_FIXED (into the registered pool) on registered files, and finished
 * in whatever order the kernel completes them (user_data is the run).
 * Every completion result goes through kvx_os.uring_result so tests can
 * inject -EAGAIN, -EINTR and short reads. Rules:
 *   -EAGAIN / -EINTR   resubmit the same read (bounded retries);
 *   short read         resubmit the rest; under O_DIRECT the rest must
 *                      start aligned, so the read restarts at the aligned
 *                      point below and the run ends (end of file) when a
 *                      read brings nothing new;
 *   -EINVAL + O_DIRECT the file system refused this read: redo it
 *                      buffered, synchronously;
 *   0                  end of file: pages not covered end KVX_ETRUNC.
 * With verify_threads, a finished io_uring run is handed to verify
 * workers instead of being checked on the driving thread: on warm data
 * the kernel copies page-cache bytes inline in io_uring_enter, on the
 * driving thread, so a CRC there would serialize copy and checksum. A
 * worker appends the verified run to the done list and bumps an eventfd
 * that the ring is always reading (user_data EFD_TAG), so a thread
 * blocked in io_uring_wait_cqe wakes for either kind of progress.
 * pread path: worker threads take runs off the queue, read them with
 * buffered preads (through the OS seam) and verify them, so CRCs run on
 * several cores. Both paths verify a run's pages as it lands.
 */
#include "io.h"

#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FILE_REG_SLOTS 64
#define FILE_CACHE_KEEP 64
#define MAX_RETRIES 1000
#define EFD_TAG ((void *)&efd_tag_anchor)
static const char efd_tag_anchor;

struct kvx_ioq {
    int mode;
    unsigned qd;
    int buffered;
    kvx_pool *pool;
    /* file cache */
    kvx_io_file **files;
    size_t n_files, cap_files;
    uint64_t clock;
    uint64_t swept_at; /* clock at the last look for deleted files */
    int files_registered;
    unsigned char reg_used[FILE_REG_SLOTS];
    int used_direct;
    /* runs */
    kvx_io_run *qhead, *qtail; /* queued, not started */
    kvx_io_run *dhead, *dtail; /* finished, not reaped */
    size_t inflight;
    size_t outstanding; /* pushed, not reaped */
    /* io_uring */
    struct io_uring ring;
    int ring_ok;
    int bufs_registered;
    /* pread workers, or io_uring verify workers */
    pthread_t *tids;
    unsigned n_threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    int stop;
    kvx_io_run *vhead, *vtail; /* landed, waiting for a verify worker */
    size_t verifying;          /* in vq or being verified */
    int efd;                   /* verify workers -> ring waiter */
    int efd_armed;
    uint64_t efd_buf;
};

double kvx_io_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void run_hook(kvx_io_run *r)
{
    if (r->on_done) r->on_done(r, r->on_done_ctx);
}

void kvx_io_run_finish(kvx_io_run *r)
{
    double t0 = r->verify && !r->crc_fused ? kvx_io_now() : 0;
    for (uint32_t i = 0; i < r->n_pages; i++) {
        kvx_io_page *pg = &r->pages[i];
        if (r->got < pg->rel + pg->bytes) {
            pg->crc_got = 0;
            pg->status = r->status ? r->status : KVX_ETRUNC;
            continue;
        }
        if (r->verify) {
            if (!r->crc_fused) pg->crc_got = kvx_crc32(0, r->buf + pg->rel, pg->bytes);
            pg->status = pg->crc_got == pg->crc_want ? 0 : KVX_EPAGECRC;
        } else {
            pg->crc_got = 0;
            pg->status = 0;
        }
    }
    if (t0 > 0) r->crc_s += kvx_io_now() - t0;
    r->crc_fused = 0;
    r->state = RUN_DONE;
}

static void q_append(kvx_io_run **head, kvx_io_run **tail, kvx_io_run *r)
{
    r->next = NULL;
    if (*tail)
        (*tail)->next = r;
    else
        *head = r;
    *tail = r;
}

static void q_prepend(kvx_io_run **head, kvx_io_run **tail, kvx_io_run *r)
{
    r->next = *head;
    *head = r;
    if (!*tail) *tail = r;
}

static kvx_io_run *q_pop(kvx_io_run **head, kvx_io_run **tail)
{
    kvx_io_run *r = *head;
    if (r) {
        *head = r->next;
        if (!*head) *tail = NULL;
        r->next = NULL;
    }
    return r;
}

/* ---- pread workers ---- */

#define FUSE_PIECE ((uint64_t)256 << 10) /* read, then CRC, this much at a time */

/* Advances the CRC of every page that overlaps [pos, pos + n) of the run
 * by its bytes there (pages are in order: *k is the first not yet whole). */
static void crc_advance(kvx_io_run *r, uint64_t pos, uint64_t n, uint32_t *k)
{
    uint64_t end = pos + n;
    for (uint32_t i = *k; i < r->n_pages; i++) {
        kvx_io_page *pg = &r->pages[i];
        uint64_t a = pg->rel > pos ? pg->rel : pos, b = pg->rel + pg->bytes < end ? pg->rel + pg->bytes : end;
        if (pg->rel >= end) break;
        if (b > a) pg->crc_got = kvx_crc32(pg->crc_got, r->buf + a, (size_t)(b - a));
        if (pg->rel + pg->bytes <= end) *k = i + 1;
    }
}

static void pread_run(kvx_io_run *r)
{
    unsigned tries = 0;
    double t0 = kvx_io_now(), crc_s = 0;
    for (;;) {
        uint64_t pos = 0;
        int rc = 0;
        if (!(r->fuse && r->verify)) {
            size_t got = 0;
            rc = kvx_os_pread_all(r->file->bfd, r->buf, (size_t)r->want, r->off, &got);
            pos = got;
        } else {
            /* fused: each piece's bytes are checked while the core still
             * holds them, instead of in a second pass over the run */
            uint32_t k = 0;
            for (uint32_t i = 0; i < r->n_pages; i++) r->pages[i].crc_got = 0;
            while (pos < r->want) {
                size_t n = (size_t)(r->want - pos < FUSE_PIECE ? r->want - pos : FUSE_PIECE), got = 0;
                rc = kvx_os_pread_all(r->file->bfd, r->buf + pos, n, r->off + pos, &got);
                if (rc) break;
                double t = kvx_io_now();
                crc_advance(r, pos, got, &k);
                crc_s += kvx_io_now() - t;
                pos += got;
                if (got < n) break; /* end of file */
            }
        }
        if (rc == -EAGAIN && ++tries < MAX_RETRIES) continue;
        r->got = rc ? 0 : pos;
        r->status = rc;
        r->crc_fused = r->fuse && r->verify && !rc;
        break;
    }
    r->crc_s = crc_s;
    r->read_s = kvx_io_now() - t0 - crc_s;
}

static void *worker_main(void *arg)
{
    kvx_ioq *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->stop && !q->qhead) pthread_cond_wait(&q->work_cv, &q->mu);
        if (q->stop) break;
        kvx_io_run *r = q_pop(&q->qhead, &q->qtail);
        q->inflight++;
        pthread_mutex_unlock(&q->mu);
        pread_run(r);
        kvx_io_run_finish(r);
        run_hook(r);
        pthread_mutex_lock(&q->mu);
        q->inflight--;
        q_append(&q->dhead, &q->dtail, r);
        pthread_cond_broadcast(&q->done_cv);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

static void *verify_main(void *arg)
{
    kvx_ioq *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->stop && !q->vhead) pthread_cond_wait(&q->work_cv, &q->mu);
        if (!q->vhead) break; /* stop, and nothing left to check */
        kvx_io_run *r = q_pop(&q->vhead, &q->vtail);
        pthread_mutex_unlock(&q->mu);
        kvx_io_run_finish(r);
        run_hook(r);
        pthread_mutex_lock(&q->mu);
        q_append(&q->dhead, &q->dtail, r);
        q->verifying--;
        pthread_cond_broadcast(&q->done_cv);
        pthread_mutex_unlock(&q->mu);
        uint64_t one = 1;
        if (write(q->efd, &one, sizeof one) < 0) { /* counter full: the reader is already woken */
        }
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

static int start_threads(kvx_ioq *q, unsigned n, void *(*fn)(void *))
{
    q->tids = calloc(n, sizeof *q->tids);
    if (!q->tids) return kvx_fail(-ENOMEM, "io queue: out of memory");
    for (unsigned i = 0; i < n; i++) {
        int e = pthread_create(&q->tids[i], NULL, fn, q);
        if (e) return kvx_fail(-e, "io queue: pthread_create: %s", strerror(e));
        q->n_threads = i + 1;
    }
    return 0;
}

/* ---- setup ---- */

static int ring_refused(void)
{
    const char *e = getenv("KVX_IO_FORCE_NO_URING");
    return e && *e && strcmp(e, "0") != 0;
}

static int uring_setup(kvx_ioq *q, const kvx_ioq_options *o)
{
    if (ring_refused()) return -EPERM;
    unsigned entries = 8;
    while (entries < q->qd + 1) entries <<= 1; /* + the eventfd read */
    int rc = io_uring_queue_init(entries, &q->ring, 0);
    if (rc < 0) return rc;
    q->ring_ok = 1;
    if (io_uring_register_files_sparse(&q->ring, FILE_REG_SLOTS) == 0) q->files_registered = 1;
    kvx_pool *p = o->pool;
    if (p && !p->no_register) {
        unsigned n = kvx_pool_nbufs(p);
        struct iovec *iov = calloc(n, sizeof *iov);
        if (!iov) return -ENOMEM;
        for (unsigned i = 0; i < n; i++) {
            uint64_t off = (uint64_t)i * KVX_IO_REG_CHUNK;
            iov[i].iov_base = p->base + off;
            iov[i].iov_len = p->bytes - off < KVX_IO_REG_CHUNK ? p->bytes - off : KVX_IO_REG_CHUNK;
        }
        rc = io_uring_register_buffers(&q->ring, iov, n);
        free(iov);
        if (rc == -ENOMEM || rc == -EPERM)
            return kvx_io_memlock_error("io_uring_register_buffers", -rc, p->bytes);
        q->bufs_registered = rc == 0;
    }
    return 0;
}

int kvx_ioq_create(kvx_ioq **out, const kvx_ioq_options *o)
{
    *out = NULL;
    if (o->mode != KVX_IO_AUTO && o->mode != KVX_IO_URING && o->mode != KVX_IO_PREAD)
        return kvx_fail(KVX_EINVALID, "io_mode %d is not a kvx_io_mode", o->mode);
    kvx_ioq *q = calloc(1, sizeof *q);
    if (!q) return kvx_fail(-ENOMEM, "io queue: out of memory");
    q->qd = o->queue_depth ? o->queue_depth : 64;
    if (q->qd > 4096) q->qd = 4096;
    q->buffered = o->buffered;
    q->pool = o->pool;
    q->efd = -1;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->work_cv, NULL);
    pthread_cond_init(&q->done_cv, NULL);
    if (o->mode != KVX_IO_PREAD) {
        int rc = uring_setup(q, o);
        if (rc == 0) {
            q->mode = KVX_IO_URING;
            unsigned vt = o->verify_threads > 64 ? 64 : o->verify_threads;
            if (vt) {
                q->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
                if (q->efd < 0) {
                    rc = kvx_fail(-errno, "io queue: eventfd: %s", strerror(errno));
                    kvx_ioq_destroy(q);
                    return rc;
                }
                if ((rc = start_threads(q, vt, verify_main))) {
                    kvx_ioq_destroy(q);
                    return rc;
                }
            }
            *out = q;
            return 0;
        }
        if (rc <= -30000 || o->mode == KVX_IO_URING) { /* a kvx code, or uring was required */
            if (rc > -30000) {
                const char *why = rc == -EPERM || rc == -ENOSYS
                                      ? " (kernel.io_uring_disabled, a seccomp profile, or "
                                        "KVX_IO_FORCE_NO_URING)"
                                      : "";
                rc = kvx_fail(rc, "io_uring refused: io_uring_queue_init: %s%s", strerror(-rc), why);
            }
            kvx_ioq_destroy(q);
            return rc;
        }
        if (q->ring_ok) io_uring_queue_exit(&q->ring);
        q->ring_ok = 0;
        q->files_registered = 0;
        q->bufs_registered = 0;
    }
    q->mode = KVX_IO_PREAD;
    q->buffered = 1;
    unsigned nt = o->threads ? o->threads : 4;
    if (nt > 64) nt = 64;
    int rc = start_threads(q, nt, worker_main);
    if (rc) {
        kvx_ioq_destroy(q);
        return rc;
    }
    *out = q;
    return 0;
}

static void file_close(kvx_ioq *q, kvx_io_file *f)
{
    if (f->reg >= 0) {
        int minus1 = -1;
        io_uring_register_files_update(&q->ring, (unsigned)f->reg, &minus1, 1);
        q->reg_used[f->reg] = 0;
    }
    if (f->bfd != f->fd) kvx_os.close(f->bfd);
    kvx_os.close(f->fd);
    free(f);
}

void kvx_ioq_destroy(kvx_ioq *q)
{
    if (!q) return;
    /* Drain the ring: the kernel may still write into slots. */
    if (q->ring_ok) {
        while (q->inflight > 0) {
            struct io_uring_cqe *cqe;
            int rc = io_uring_wait_cqe(&q->ring, &cqe);
            if (rc == -EINTR || rc == -EAGAIN) continue; /* a signal (Go's preemption, a handler): wait on */
            if (rc < 0) break;
            if (io_uring_cqe_get_data(cqe) != EFD_TAG) q->inflight--;
            io_uring_cqe_seen(&q->ring, cqe);
        }
    }
    if (q->tids) {
        pthread_mutex_lock(&q->mu);
        q->stop = 1;
        pthread_cond_broadcast(&q->work_cv);
        pthread_mutex_unlock(&q->mu);
        for (unsigned i = 0; i < q->n_threads; i++) pthread_join(q->tids[i], NULL);
        free(q->tids);
    }
    for (size_t i = 0; i < q->n_files; i++) file_close(q, q->files[i]);
    free(q->files);
    if (q->ring_ok) io_uring_queue_exit(&q->ring);
    /* after the ring: its read of the eventfd is gone. The eventfd is a
     * wakeup, not a file: outside the seam, like the ring (os.h). */
    if (q->efd >= 0) close(q->efd);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->work_cv);
    pthread_cond_destroy(&q->done_cv);
    free(q);
}

int kvx_ioq_mode(const kvx_ioq *q) { return q->mode; }
int kvx_ioq_used_direct(const kvx_ioq *q) { return q->used_direct; }

int kvx_ioq_file(kvx_io_file **out, kvx_ioq *q, int fd)
{
    struct stat st;
    if (kvx_os.fstat(fd, &st) != 0) {
        int e = errno;
        return kvx_fail(-e, "fstat of shard descriptor %d: %s", fd, strerror(e));
    }
    q->clock++;
    for (size_t i = 0; i < q->n_files; i++) {
        kvx_io_file *f = q->files[i];
        if (f->dev == st.st_dev && f->ino == st.st_ino) {
            f->last_use = q->clock;
            f->users++;
            *out = f;
            return 0;
        }
    }
    if (q->n_files == q->cap_files) {
        size_t nc = q->cap_files ? q->cap_files * 2 : 16;
        void *nf = realloc(q->files, nc * sizeof *q->files);
        if (!nf) return kvx_fail(-ENOMEM, "io queue: out of memory");
        q->files = nf;
        q->cap_files = nc;
    }
    kvx_io_file *f = calloc(1, sizeof *f);
    if (!f) return kvx_fail(-ENOMEM, "io queue: out of memory");
    f->dev = st.st_dev;
    f->ino = st.st_ino;
    f->reg = -1;
    f->align = 1;
    f->bfd = kvx_os.dup(fd);
    if (f->bfd < 0) {
        int e = errno;
        free(f);
        return kvx_fail(-e, "dup of shard descriptor %d: %s", fd, strerror(e));
    }
    f->fd = f->bfd;
    if (q->mode == KVX_IO_URING && !q->buffered) {
        /* Reopen the same inode (even if its name is gone) with O_DIRECT. */
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        int dfd = kvx_os.open(path, O_RDONLY | O_DIRECT | O_CLOEXEC, 0);
        if (dfd >= 0) {
            struct statx sx;
            uint32_t align = 4096; /* page offsets are 4096-aligned: safe when statx is silent */
            int ok = 1;
            if (kvx_os.statx(dfd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
                if (sx.stx_dio_offset_align == 0) ok = 0; /* no direct I/O on this file */
                align = sx.stx_dio_offset_align > sx.stx_dio_mem_align ? sx.stx_dio_offset_align
                                                                         : sx.stx_dio_mem_align;
            }
            if (ok && align > 0 && align <= KVX_IO_SLOT_ALIGN) {
                f->fd = dfd;
                f->direct = 1;
                f->align = align;
                q->used_direct = 1;
            } else {
                kvx_os.close(dfd);
            }
        } /* else EINVAL (tmpfs and friends): buffered */
    }
    if (q->files_registered) {
        for (int s = 0; s < FILE_REG_SLOTS; s++) {
            if (q->reg_used[s]) continue;
            if (io_uring_register_files_update(&q->ring, (unsigned)s, &f->fd, 1) == 1) {
                f->reg = s;
                q->reg_used[s] = 1;
            }
            break;
        }
    }
    f->last_use = q->clock;
    f->users = 1;
    q->files[q->n_files++] = f;
    *out = f;
    return 0;
}

void kvx_ioq_files_trim(kvx_ioq *q)
{
    for (size_t i = 0; i < q->n_files; i++) q->files[i]->users = 0;
    /* A shard deleted since (eviction, gc) keeps its disk space while we
     * hold it open: let it go. One fstat per cached file every
     * FILE_CACHE_KEEP lookups, at most one per lookup on average. */
    if (q->clock - q->swept_at >= FILE_CACHE_KEEP) {
        q->swept_at = q->clock;
        for (size_t i = 0; i < q->n_files;) {
            struct stat st;
            if (kvx_os.fstat(q->files[i]->bfd, &st) == 0 && st.st_nlink == 0) {
                file_close(q, q->files[i]);
                q->files[i] = q->files[--q->n_files];
            } else {
                i++;
            }
        }
    }
    while (q->n_files > FILE_CACHE_KEEP) {
        size_t lru = 0;
        for (size_t i = 1; i < q->n_files; i++)
            if (q->files[i]->last_use < q->files[lru]->last_use) lru = i;
        file_close(q, q->files[lru]);
        q->files[lru] = q->files[--q->n_files];
    }
}

/* ---- io_uring ---- */

static void finish_uring(kvx_ioq *q, kvx_io_run *r)
{
    if (r->t_start > 0) r->read_s = kvx_io_now() - r->t_start;
    if (q->n_threads && (r->verify || r->on_done)) {
        pthread_mutex_lock(&q->mu);
        r->state = RUN_INFLIGHT; /* until a worker has checked it */
        q_append(&q->vhead, &q->vtail, r);
        q->verifying++;
        pthread_cond_signal(&q->work_cv);
        pthread_mutex_unlock(&q->mu);
        return;
    }
    kvx_io_run_finish(r);
    run_hook(r);
    pthread_mutex_lock(&q->mu);
    q_append(&q->dhead, &q->dtail, r);
    pthread_mutex_unlock(&q->mu);
}

/* Keeps one read of the eventfd in the ring while verify workers exist. */
static void arm_efd(kvx_ioq *q)
{
    if (q->efd < 0 || q->efd_armed) return;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);
    if (!sqe) return;
    io_uring_prep_read(sqe, q->efd, &q->efd_buf, sizeof q->efd_buf, 0);
    io_uring_sqe_set_data(sqe, EFD_TAG);
    q->efd_armed = 1;
}

static int prep_one(kvx_ioq *q, kvx_io_run *r)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);
    if (!sqe) return 0;
    uint64_t off = r->off + r->got;
    uint8_t *buf = r->buf + r->got;
    uint64_t len = r->len - r->got;
    int fd = r->file->reg >= 0 ? r->file->reg : r->file->fd;
    int bi = q->bufs_registered ? kvx_pool_buf_index(q->pool, buf, len) : -1;
    if (bi >= 0)
        io_uring_prep_read_fixed(sqe, fd, buf, (unsigned)len, off, bi);
    else
        io_uring_prep_read(sqe, fd, buf, (unsigned)len, off);
    if (r->file->reg >= 0) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, r);
    if (r->t_start == 0) r->t_start = kvx_io_now();
    r->state = RUN_INFLIGHT;
    q->inflight++;
    return 1;
}

void kvx_ioq_kick(kvx_ioq *q)
{
    if (q->mode != KVX_IO_URING) return;
    int prepped = 0;
    arm_efd(q);
    while (q->qhead && q->inflight < q->qd) {
        kvx_io_run *r = q->qhead;
        if (!prep_one(q, r)) {
            io_uring_submit(&q->ring);
            if (!prep_one(q, r)) break;
        }
        q_pop(&q->qhead, &q->qtail);
        prepped = 1;
    }
    if (prepped || io_uring_sq_ready(&q->ring)) io_uring_submit(&q->ring);
}

static void redo_buffered(kvx_io_run *r)
{
    size_t got = 0;
    int rc = kvx_os_pread_all(r->file->bfd, r->buf + r->got, (size_t)(r->want - r->got), r->off + r->got, &got);
    if (rc)
        r->status = rc;
    else
        r->got += got;
}

/* A read brought nothing new: the end of the file, unless the file has
 * bytes past what the run got (a short read mid-file), which is read
 * again, boundedly. Without this, two short O_DIRECT reads in a row ended
 * an intact file's pages KVX_ETRUNC. */
static int file_goes_on(kvx_io_run *r)
{
    struct stat st;
    uint64_t have = r->hwm > r->got ? r->hwm : r->got;
    if (have >= r->want || ++r->retries >= MAX_RETRIES) return 0;
    return kvx_os.fstat(r->file->bfd, &st) == 0 && (uint64_t)st.st_size > r->off + have;
}

static void complete(kvx_ioq *q, kvx_io_run *r, int kres)
{
    q->inflight--;
    uint64_t asked = r->len - r->got;
    int res = kvx_os.uring_result(kres, (size_t)asked);
    if (r->state != RUN_INFLIGHT) return;
    if (res == -EAGAIN || res == -EINTR) {
        if (++r->retries < MAX_RETRIES) {
            q_prepend(&q->qhead, &q->qtail, r);
            r->state = RUN_QUEUED;
            return;
        }
        r->status = res;
    } else if (res == -EINVAL && r->file->direct) {
        redo_buffered(r);
    } else if (res < 0) {
        r->status = res;
    } else if (res > 0) {
        uint64_t now = r->got + (uint64_t)(res < (int64_t)asked ? (uint64_t)res : asked);
        if (now > r->hwm || (uint64_t)res == asked) {
            if (now > r->hwm) r->hwm = now;
            r->got = now;
            if (r->got < r->len) {
                /* Short: read the rest. O_DIRECT restarts at an aligned point. */
                if (r->file->direct) r->got -= r->got % r->file->align;
                q_prepend(&q->qhead, &q->qtail, r);
                r->state = RUN_QUEUED;
                return;
            }
        } else if (file_goes_on(r)) {
            q_prepend(&q->qhead, &q->qtail, r); /* a short read again, mid-file */
            r->state = RUN_QUEUED;
            return;
        } else {
            r->got = r->hwm; /* nothing new: end of file */
        }
    } else if (file_goes_on(r)) {
        q_prepend(&q->qhead, &q->qtail, r); /* 0 where the file has bytes: read again */
        r->state = RUN_QUEUED;
        return;
    } else {
        if (r->hwm > r->got) r->got = r->hwm; /* end of file */
    }
    if (r->got > r->len) r->got = r->len;
    finish_uring(q, r);
}

static void drain_cqes(kvx_ioq *q)
{
    struct io_uring_cqe *cqe;
    unsigned head, n = 0;
    io_uring_for_each_cqe(&q->ring, head, cqe)
    {
        void *data = io_uring_cqe_get_data(cqe);
        if (data == EFD_TAG)
            q->efd_armed = 0; /* a worker finished a run: re-armed by the next kick */
        else
            complete(q, data, cqe->res);
        n++;
    }
    io_uring_cq_advance(&q->ring, n);
}

/* ---- common ---- */

void kvx_ioq_push(kvx_ioq *q, kvx_io_run *r)
{
    r->state = RUN_QUEUED;
    r->got = 0;
    r->hwm = 0;
    r->status = 0;
    r->retries = 0;
    r->crc_fused = 0;
    r->t_start = r->read_s = r->crc_s = 0;
    pthread_mutex_lock(&q->mu);
    q_append(&q->qhead, &q->qtail, r);
    q->outstanding++;
    if (q->mode == KVX_IO_PREAD) pthread_cond_signal(&q->work_cv);
    pthread_mutex_unlock(&q->mu);
}

size_t kvx_ioq_pending(kvx_ioq *q)
{
    pthread_mutex_lock(&q->mu);
    size_t n = q->outstanding;
    pthread_mutex_unlock(&q->mu);
    return n;
}

void kvx_ioq_cancel(kvx_ioq *q) { kvx_ioq_cancel_owner(q, NULL); }

void kvx_ioq_cancel_owner(kvx_ioq *q, const void *owner)
{
    pthread_mutex_lock(&q->mu);
    kvx_io_run *r, *keep_h = NULL, *keep_t = NULL;
    while ((r = q_pop(&q->qhead, &q->qtail))) {
        if (owner && r->owner != owner) {
            q_append(&keep_h, &keep_t, r);
            continue;
        }
        r->status = KVX_ECANCELED;
        r->got = 0;
        kvx_io_run_finish(r);
        q_append(&q->dhead, &q->dtail, r);
    }
    q->qhead = keep_h;
    q->qtail = keep_t;
    pthread_cond_broadcast(&q->done_cv);
    pthread_mutex_unlock(&q->mu);
}

static size_t take_done(kvx_ioq *q, kvx_io_run **done, size_t max)
{
    size_t n = 0;
    while (n < max && q->dhead) done[n++] = q_pop(&q->dhead, &q->dtail);
    q->outstanding -= n;
    return n;
}

int kvx_ioq_reap(kvx_ioq *q, kvx_io_run **done, size_t max, int timeout_ms)
{
    if (max == 0) return 0;
    double deadline = timeout_ms > 0 ? kvx_io_now() + timeout_ms / 1000.0 : 0;
    if (q->mode == KVX_IO_PREAD) {
        pthread_mutex_lock(&q->mu);
        while (!q->dhead && q->outstanding > 0 && timeout_ms != 0) {
            if (timeout_ms < 0) {
                pthread_cond_wait(&q->done_cv, &q->mu);
            } else {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                double left = deadline - kvx_io_now();
                if (left <= 0) break;
                long ns = ts.tv_nsec + (long)(left * 1e9);
                ts.tv_sec += ns / 1000000000L;
                ts.tv_nsec = ns % 1000000000L;
                pthread_cond_timedwait(&q->done_cv, &q->mu, &ts);
            }
        }
        size_t n = take_done(q, done, max);
        pthread_mutex_unlock(&q->mu);
        return (int)n;
    }
    for (;;) {
        kvx_ioq_kick(q);
        drain_cqes(q);
        kvx_ioq_kick(q);
        pthread_mutex_lock(&q->mu);
        int ready = q->dhead != NULL, verifying = q->verifying > 0;
        pthread_mutex_unlock(&q->mu);
        if (ready || (q->inflight == 0 && !verifying) || timeout_ms == 0) break;
        struct io_uring_cqe *cqe;
        int rc;
        if (timeout_ms < 0) {
            rc = io_uring_wait_cqe(&q->ring, &cqe);
        } else {
            double left = deadline - kvx_io_now();
            if (left <= 0) break;
            struct __kernel_timespec ts = {.tv_sec = (long long)left,
                                           .tv_nsec = (long long)((left - (double)(long long)left) * 1e9)};
            rc = io_uring_wait_cqe_timeout(&q->ring, &cqe, &ts);
        }
        rc = kvx_os.uring_wait(rc); /* tests fail a wait here */
        if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN)
            return kvx_fail(rc, "io_uring wait: %s", strerror(-rc));
    }
    pthread_mutex_lock(&q->mu);
    size_t n = take_done(q, done, max);
    pthread_mutex_unlock(&q->mu);
    return (int)n;
}
