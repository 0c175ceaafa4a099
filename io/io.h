/*
 * io.h - internals of the data path (io/), not API.
 *
 * Three layers, bottom up:
 *  - pool.c: the pinned, NUMA-placed pool and its slot allocator;
 *  - ioq.c: an executor of "runs" (one contiguous read of a file into a
 *    slot, covering one or more pages) over io_uring or a pread thread
 *    pool, with a cache of opened files (O_DIRECT where the file system
 *    allows, registered with the ring). It handles short reads, -EAGAIN,
 *    -EINTR and out-of-order completions, and checks each page's CRC as
 *    its run lands (on the worker thread in pread mode, so CRCs run in
 *    parallel there);
 *  - fetch.c (random pages, poll/wait) and warmup.c (whole shards in
 *    sequential runs, double-buffered into a sink) plan runs and consume
 *    them (warmup_gpu.c: the GPU sink's pipelines). gpu.c is the CPU side
 *    of the GPU path, on the device seam of gpu_dev.h: gpu_cuda.c (the
 *    CUDA runtime and gpu_kernels.cu) or gpu_nocuda.c fill it.
 * Keeping one executor means both public paths share every fault-handling
 * rule and every test of it.
 */
#ifndef KVX_IO_H
#define KVX_IO_H

#include "common/internal.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#define KVX_IO_SLOT_ALIGN 4096u
#define KVX_IO_REG_CHUNK ((uint64_t)1 << 30) /* io_uring caps one fixed buffer at 1 GiB */

/* --- pool.c --- */
struct kvx_pool {
    uint8_t *base;
    uint64_t bytes;
    int node;
    int locked;
    int cuda_registered;
    int no_register;
    pthread_mutex_t mu;
    /* free extents, sorted by offset, never crossing a 1 GiB chunk */
    struct kvx_extent { uint64_t off, len; } *ext;
    size_t n_ext, cap_ext;
    uint64_t free_bytes;
    /* slot_units[off / KVX_IO_SLOT_ALIGN]: the length, in those units, of
     * the live slot that starts at off, 0 where none does, so
     * kvx_pool_free refuses a range that is not one slot (a free naming a
     * slot and its neighbour handed the live neighbour out again) */
    uint32_t *slot_units;
};
/* Index of the registered buffer holding [ptr, ptr+len), or -1. */
int kvx_pool_buf_index(const kvx_pool *p, const void *ptr, uint64_t len);
unsigned kvx_pool_nbufs(const kvx_pool *p);

/* --- ioq.c --- */
typedef struct kvx_io_file {
    dev_t dev;
    ino_t ino;
    int fd;          /* ours: O_DIRECT when direct */
    int bfd;         /* buffered descriptor (== fd when not direct) */
    int direct;
    uint32_t align;  /* O_DIRECT offset/length alignment */
    int reg;         /* registered file slot, or -1 */
    uint64_t last_use;
    unsigned users;  /* runs of the current batch using it */
} kvx_io_file;

typedef struct kvx_io_page {
    uint64_t rel;      /* page start within the run */
    uint64_t bytes;
    uint32_t crc_want;
    uint32_t crc_got;
    int status;
    uint32_t tag;      /* owner's index (request or page number) */
} kvx_io_page;

enum { RUN_QUEUED = 0, RUN_INFLIGHT, RUN_DONE };

typedef struct kvx_io_run {
    kvx_io_file *file;
    uint64_t off;     /* file offset of the run (aligned for O_DIRECT) */
    uint64_t len;     /* bytes to read (rounded up for O_DIRECT) */
    uint64_t want;    /* bytes the pages need (<= len) */
    uint8_t *buf;     /* slot of at least len bytes */
    uint64_t got;     /* bytes read so far */
    int status;       /* 0 or the read's -errno / KVX_ECANCELED */
    int state;
    int verify;
    unsigned retries;
    kvx_io_page *pages;
    uint32_t n_pages;
    uint64_t hwm;     /* most bytes ever seen read (O_DIRECT re-reads) */
    void *owner;      /* fetch batch or warmup buffer */
    /* Called once the pages are verified, on the thread that verified them
     * (a worker when there are any): warmup copies good pages into a host
     * sink here, so that copy runs in parallel too. Nullable. */
    void (*on_done)(struct kvx_io_run *r, void *ctx);
    void *on_done_ctx;
    struct kvx_io_run *next; /* executor queues */
    /* pread workers: read the run in pieces and advance each page's CRC
     * right after its piece landed, from the core's cache (warmup sets
     * it; the CRC is "fused" into the copy the kernel makes) */
    int fuse;
    int crc_fused;    /* the pages' crc_got are the fused ones */
    /* stage timers, set as the run finishes: time its reads took (pread
     * calls, or io_uring submission to completion) and its CRCs */
    double t_start, read_s, crc_s;
} kvx_io_run;

typedef struct kvx_ioq kvx_ioq;

typedef struct kvx_ioq_options {
    int mode;             /* kvx_io_mode */
    unsigned queue_depth;
    unsigned threads;
    int buffered;         /* never O_DIRECT */
    kvx_pool *pool;       /* registered as fixed buffers (nullable) */
    unsigned verify_threads; /* io_uring: threads that check CRCs (and run
                                on_done) as completions land, so the thread
                                driving the ring only submits; 0 = inline */
} kvx_ioq_options;

int kvx_ioq_create(kvx_ioq **out, const kvx_ioq_options *o);
void kvx_ioq_destroy(kvx_ioq *q);
int kvx_ioq_mode(const kvx_ioq *q);
/* Our own descriptor for the file behind fd (cached by device and inode). */
int kvx_ioq_file(kvx_io_file **out, kvx_ioq *q, int fd);
/* Done with a batch: files with no users may be closed (LRU beyond a cap;
 * files deleted since, every FILE_CACHE_KEEP lookups). */
void kvx_ioq_files_trim(kvx_ioq *q);
/* Queues a run (state RUN_QUEUED); it is started as the depth allows. */
void kvx_ioq_push(kvx_ioq *q, kvx_io_run *r);
/* Collects finished runs (pages verified) into done[0..max); waits up to
 * timeout_ms (< 0 forever, 0 not at all) for at least one when none is
 * ready. Returns the number collected, or -errno of the ring. */
int kvx_ioq_reap(kvx_ioq *q, kvx_io_run **done, size_t max, int timeout_ms);
/* Runs queued or in flight. */
size_t kvx_ioq_pending(kvx_ioq *q);
/* Queued runs not yet started finish with KVX_ECANCELED. */
void kvx_ioq_cancel(kvx_ioq *q);
/* The same for the runs of one owner (fetch handles sharing a queue). */
void kvx_ioq_cancel_owner(kvx_ioq *q, const void *owner);
/* 1 if any file so far used O_DIRECT. */
int kvx_ioq_used_direct(const kvx_ioq *q);

/* Verifies the pages of a finished run (sets page status). */
void kvx_io_run_finish(kvx_io_run *r);

/* KVX_EMEMLOCK with the limit, its value and the bytes needed. */
int kvx_io_memlock_error(const char *what, int err, uint64_t bytes);
/* Starts queued runs up to the queue depth (io_uring); no-op for pread. */
void kvx_ioq_kick(kvx_ioq *q);

/* --- gpu.c: the CPU side of the GPU path, on the seam of gpu_dev.h --- */
#define KVX_GPU_MAX_LANES 64
struct kvx_gpu_crc_job;
/* The calling thread's device switched to device until leave. */
typedef struct kvx_gpu_dev_scope {
    int prev;
    int switched;
} kvx_gpu_dev_scope;
int kvx_gpu_dev_enter(kvx_gpu_dev_scope *sc, int device);
void kvx_gpu_dev_leave(const kvx_gpu_dev_scope *sc);
/* 0 when device exists; KVX_ENOCUDA, or KVX_ENOGPU with the reason. */
int kvx_gpu_need_device(int device);
/* Pins pool memory for the device (portable registration); the file
 * mapping of a shard read-only (_ro). KVX_ENOCUDA without CUDA. */
int kvx_gpu_host_register(void *p, uint64_t bytes, int device);
int kvx_gpu_host_register_ro(void *p, uint64_t bytes, int device);
void kvx_gpu_host_unregister(void *p);
/* Lanes: lane i works on stream i % streams. copy_lane queues a
 * host-to-device copy into the arena (copy_lane_any: anywhere on the
 * device, for buffers the caller allocated with kvx_gpu_alloc); mark
 * records the lane's event 0 (start), 1 (copies queued) or 2 (end, what
 * lane_wait waits for; lane_record). wait_timed adds the GPU time from
 * start to mid (or end) to *copy_s and from mid to end to *kernel_s. */
int kvx_gpu_copy_lane(kvx_gpu *g, unsigned lane, uint64_t dev, const void *src, uint64_t bytes);
int kvx_gpu_copy_lane_any(kvx_gpu *g, unsigned lane, uint64_t dev, const void *src, uint64_t bytes);
int kvx_gpu_lane_mark(kvx_gpu *g, unsigned lane, unsigned which);
int kvx_gpu_lane_record(kvx_gpu *g, unsigned lane);
int kvx_gpu_lane_wait(kvx_gpu *g, unsigned lane);
int kvx_gpu_lane_wait_timed(kvx_gpu *g, unsigned lane, double *copy_s, double *kernel_s);
int kvx_gpu_lane_crc(kvx_gpu *g, unsigned lane, const struct kvx_gpu_crc_job *job);
int kvx_gpu_lane_memset(kvx_gpu *g, unsigned lane, uint64_t dev, int byte, uint64_t bytes);
void *kvx_gpu_lane_stream(kvx_gpu *g, unsigned lane);
/* Device memory outside the arena, on g's device; synchronous copies. */
int kvx_gpu_alloc(uint64_t *out, kvx_gpu *g, uint64_t bytes);
void kvx_gpu_free(kvx_gpu *g, uint64_t dev);
int kvx_gpu_h2d(kvx_gpu *g, uint64_t dev, const void *src, uint64_t bytes);
int kvx_gpu_d2h(void *dst, kvx_gpu *g, uint64_t dev, uint64_t bytes);
/* The CUDA device of g (-1 for NULL). */
int kvx_gpu_device(const kvx_gpu *g);

/* Monotonic seconds. */
double kvx_io_now(void);

#endif
