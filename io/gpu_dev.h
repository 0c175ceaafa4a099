/*
 * gpu_dev.h - the one seam between io/'s GPU logic and the CUDA runtime.
 *
 * io/gpu.c (arena, page table, copy lanes), io/warmup_gpu.c (registered
 * mapping, device landing buffers, the CRC on the GPU) and
 * io/gpu_spectral.c (steering on the device) make every device call
 * through kvx_gpu_dev, a table of function pointers, as the file calls go
 * through kvx_os (common/os.h). The table is:
 *  - gpu_cuda.c's, on the CUDA runtime and the kernels of gpu_kernels.cu,
 *    in a build with the toolkit;
 *  - gpu_nocuda.c's otherwise, whose every entry answers KVX_ENOCUDA;
 *  - a test's own (tests/lib/gpu_fake.h): a "device" in host memory whose
 *    kernels are the host builds of the same math (gpu_crc.h), and whose
 *    calls fail on demand (registration refused, no device memory, a
 *    copy or a launch failing), so every path the CPU takes around the GPU
 *    (planning, page table, fallback to staging, error paths) runs in CI
 *    without a GPU, in builds with and without CUDA.
 *
 * Conventions: entries return 0 or a kvx code with the message set
 * (kvx_fail); device addresses are uint64_t; streams and events are
 * opaque pointers (cudaStream_t, cudaEvent_t underneath). Asynchronous
 * entries only queue work on the stream; the fake runs it at once.
 */
#ifndef KVX_GPU_DEV_H
#define KVX_GPU_DEV_H

#include <stdint.h>

#include "gpu_crc.h"

#define KVX_GDEV_REG_PORTABLE 0x1u /* cudaHostRegisterPortable */
#define KVX_GDEV_REG_READONLY 0x2u /* cudaHostRegisterReadOnly: the device only reads it */

/* One page of a warmup on the device side (run order). */
typedef struct kvx_gpu_page {
    uint64_t off; /* file offset of the page */
    uint64_t bytes;
    uint64_t dst;    /* its place in the sink (device address) */
    uint64_t chunk0; /* its first CRC chunk, counted over the run order */
    uint32_t crc;    /* the CRC-32 it must have */
    uint32_t tag;    /* its input index */
} kvx_gpu_page;

/* The page of run-order index in [p0, p1) holding chunk c (binary search
 * on chunk0, which grows with the index; an empty page has no chunk, so
 * the last page starting at or before c owns it). Kernel and host alike. */
KVX_HD static inline uint32_t kvx_gcrc_page_of_chunk(const kvx_gpu_page *pages, uint32_t p0, uint32_t p1, uint64_t c)
{
    uint32_t lo = p0, hi = p1 - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (pages[mid].chunk0 <= c)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* The bytes [*s, *e) of a page of n bytes that its chunk j covers (the
 * first chunk is the short one: chunks are aligned to the page's end). */
KVX_HD static inline void kvx_gcrc_chunk_span(uint64_t n, uint64_t j, uint64_t *s, uint64_t *e)
{
    uint64_t pad = kvx_gcrc_nchunks(n) * KVX_GCRC_CHUNK - n;
    *s = j * KVX_GCRC_CHUNK > pad ? j * KVX_GCRC_CHUNK - pad : 0;
    *e = (j + 1) * KVX_GCRC_CHUNK - pad;
}

/* Page verdicts the finishing kernel writes (uint32 each). */
#define KVX_GPU_PAGE_PENDING 0u
#define KVX_GPU_PAGE_GOOD 1u
#define KVX_GPU_PAGE_BAD 2u

/* Pages [p0, p1) of one window landed at landing, the window starting at
 * file offset win_off (a page's bytes are at landing + off - win_off).
 * The kernels: CRC of every chunk into acc[] (zeroed beforehand), then per
 * page the verdict into status[] (GOOD without verify), then the GOOD
 * pages' bytes copied to their dst. A page's bytes reach dst only after
 * its CRC passed. */
typedef struct kvx_gpu_crc_job {
    uint64_t pages;   /* const kvx_gpu_page[] (device) */
    uint64_t acc;     /* uint32_t[] per page (device) */
    uint64_t status;  /* uint32_t[] per page (device) */
    uint64_t landing; /* device address of the window's bytes */
    uint64_t win_off;
    uint32_t p0, p1;
    uint64_t c0; /* pages[p0].chunk0 */
    uint64_t nc; /* chunks of pages [p0, p1) */
    int verify;
    kvx_gcrc_consts consts;
} kvx_gpu_crc_job;

/* Element types of hidden states on the device (kvx_gpu_dtype). */
typedef struct kvx_gpu_spectral_job {
    uint64_t h; /* n rows of dim elements, row i at h + i * stride elements */
    uint64_t n, stride;
    uint32_t dim, rank;
    int dtype; /* KVX_GPU_F32, KVX_GPU_BF16, KVX_GPU_F16 */
    float gamma;
    uint64_t psi;   /* float [dim][rank] (device) */
    uint64_t psi_t; /* float [rank][dim] (device): the same, transposed */
} kvx_gpu_spectral_job;

typedef struct kvx_gpu_dev_ops {
    /* 0, or KVX_ENOCUDA (with the message) in a build without CUDA: every
     * public GPU call asks first, so it answers KVX_ENOCUDA whatever its
     * arguments */
    int (*present)(void);
    /* devices: count is 0 and the number, KVX_ENOCUDA, or KVX_ENOGPU
     * with the runtime's reason */
    int (*count)(int *out);
    int (*get_device)(int *out);
    int (*set_device)(int device);
    int (*pci_bus_id)(char *buf, int len, int device);
    /* memory: malloc's failure is KVX_ECAPACITY; host_register's
     * refusal KVX_EMEMLOCK (or -EOPNOTSUPP where the device cannot
     * register read-only memory) */
    int (*malloc)(uint64_t *out, uint64_t bytes);
    void (*free)(uint64_t dev);
    int (*host_register)(void *p, uint64_t bytes, unsigned flags);
    void (*host_unregister)(void *p);
    int (*memset_async)(uint64_t dev, int byte, uint64_t bytes, void *stream);
    int (*h2d_async)(uint64_t dev, const void *src, uint64_t bytes, void *stream);
    int (*h2d)(uint64_t dev, const void *src, uint64_t bytes);
    int (*d2h)(void *dst, uint64_t dev, uint64_t bytes);
    /* streams and events (timing: an event cudaEventElapsedTime can read) */
    int (*stream_create)(void **out);
    void (*stream_destroy)(void *s);
    int (*stream_sync)(void *s);
    int (*event_create)(void **out, int timing);
    void (*event_destroy)(void *e);
    int (*event_record)(void *e, void *stream);
    int (*event_sync)(void *e);
    int (*event_elapsed)(float *out_ms, void *from, void *to);
    /* kernels, queued on the stream */
    int (*crc_pages)(const kvx_gpu_crc_job *job, void *stream);
    int (*spectral)(const kvx_gpu_spectral_job *job, void *stream);
} kvx_gpu_dev_ops;

/* The table in use: gpu_cuda.c's or gpu_nocuda.c's. Tests may replace
 * it whole or entry by entry; kvx_gpu_dev_reset puts the build's back. */
extern kvx_gpu_dev_ops kvx_gpu_dev;
void kvx_gpu_dev_reset(void);

/* The kernels' results computed on the host, device addresses taken as
 * host pointers: what the tests' fake device runs (gpu_crc.c,
 * gpu_spectral.c). */
void kvx_gcrc_job_host(const struct kvx_gpu_crc_job *job);
int kvx_gpu_spectral_job_host(const kvx_gpu_spectral_job *job);

#endif
