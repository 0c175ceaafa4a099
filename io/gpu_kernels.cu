/*
 * gpu_kernels.cu - the device code of kvx: the CRC-32 check of pages that
 * landed on the GPU (gpu_crc.h's math, shared with the host), the copy of
 * verified pages to their place in the sink, and spectral steering
 * h' = h + gamma * psi (psi^T h) on hidden states in device memory.
 *
 * Called only through the seam (gpu_cuda.c: kvx_gk_*); every kernel is
 * static, so libkvx exports no symbol of this file but the two launchers.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "kvx.h"
#include "gpu_dev.h"
int kvx_fail(int code, const char *fmt, ...);
int kvx_gk_crc_pages(const kvx_gpu_crc_job *job, cudaStream_t stream);
int kvx_gk_spectral(const kvx_gpu_spectral_job *job, cudaStream_t stream);
}

#define CRC_WARPS 8         /* warps (chunks at a time) per block */
#define CRC_MAX_BLOCKS 2048 /* enough to fill any current GPU several times */

/* The job's constants into shared memory, once per block, read from the
 * parameter with constant indexes only (taking a kernel parameter's
 * address would copy it to local memory in every thread). */
static __device__ void load_consts(kvx_gcrc_consts *cs, const kvx_gpu_crc_job job)
{
    if (threadIdx.x != 0) return;
#pragma unroll
    for (int i = 0; i < 5; i++) cs->seg_pow[i] = job.consts.seg_pow[i];
#pragma unroll
    for (int i = 0; i < 48; i++) cs->chunk_pow[i] = job.consts.chunk_pow[i];
#pragma unroll
    for (int i = 0; i < 64; i++) cs->byte_pow[i] = job.consts.byte_pow[i];
}

/* Warps take chunks in turn (grid-stride, so the tables a block builds
 * serve many chunks): each lane the raw CRC of its segment, the warp's
 * tree, then lane 0 places the chunk at its page's end and XORs it into
 * the page's accumulator. */
static __global__ void __launch_bounds__(CRC_WARPS * 32) crc_chunks(kvx_gpu_crc_job job)
{
    __shared__ uint32_t tab[KVX_GCRC_TABLE_WORDS];
    __shared__ kvx_gcrc_consts cs;
    for (unsigned i = threadIdx.x; i < KVX_GCRC_TABLE_WORDS; i += blockDim.x)
        tab[i] = kvx_gcrc_table_entry(i >> 8, i & 0xFF);
    load_consts(&cs, job);
    __syncthreads();
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const kvx_gpu_page *pages = (const kvx_gpu_page *)job.pages;
    for (uint64_t g = (uint64_t)blockIdx.x * CRC_WARPS + warp; g < job.nc; g += (uint64_t)gridDim.x * CRC_WARPS) {
        uint64_t c = job.c0 + g; /* the same for the whole warp */
        uint32_t p = kvx_gcrc_page_of_chunk(pages, job.p0, job.p1, c);
        const kvx_gpu_page pg = pages[p];
        const uint8_t *base = (const uint8_t *)job.landing + (pg.off - job.win_off);
        uint64_t j = c - pg.chunk0, nch = kvx_gcrc_nchunks(pg.bytes);
        uint32_t v = kvx_gcrc_lane(tab, base, pg.bytes, j, lane);
        for (unsigned k = 0; k < 5; k++) {
            uint32_t o = __shfl_down_sync(0xFFFFFFFFu, v, 1u << k);
            if ((lane & ((2u << k) - 1)) == 0) v = kvx_gcrc_tree(&cs, v, o, k);
        }
        if (lane == 0) atomicXor((unsigned *)job.acc + p, kvx_gcrc_place(&cs, v, nch, j));
    }
}

/* One thread per page: the verdict. */
static __global__ void crc_finish(kvx_gpu_crc_job job)
{
    __shared__ kvx_gcrc_consts cs;
    load_consts(&cs, job);
    __syncthreads();
    uint32_t p = job.p0 + blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= job.p1) return;
    const kvx_gpu_page *pages = (const kvx_gpu_page *)job.pages;
    uint32_t *status = (uint32_t *)job.status;
    if (!job.verify) {
        status[p] = KVX_GPU_PAGE_GOOD;
        return;
    }
    uint32_t raw = ((const uint32_t *)job.acc)[p];
    uint32_t crc = kvx_gcrc_finish(&cs, raw, pages[p].bytes);
    status[p] = crc == pages[p].crc ? KVX_GPU_PAGE_GOOD : KVX_GPU_PAGE_BAD;
}

/* Warps take chunks in turn again: the chunk's bytes to the page's place
 * in the sink, only for a page found GOOD (a bad page's sink range is left
 * as it was). Source and destination are 16-aligned at the page's start
 * (landing 4096, sink 256), so both are aligned at the same offsets. */
static __global__ void __launch_bounds__(CRC_WARPS * 32) gather_chunks(kvx_gpu_crc_job job)
{
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const kvx_gpu_page *pages = (const kvx_gpu_page *)job.pages;
    for (uint64_t g = (uint64_t)blockIdx.x * CRC_WARPS + warp; g < job.nc; g += (uint64_t)gridDim.x * CRC_WARPS) {
        uint64_t c = job.c0 + g;
        uint32_t p = kvx_gcrc_page_of_chunk(pages, job.p0, job.p1, c);
        if (((const uint32_t *)job.status)[p] != KVX_GPU_PAGE_GOOD) continue;
        const kvx_gpu_page pg = pages[p];
        uint64_t s, e;
        kvx_gcrc_chunk_span(pg.bytes, c - pg.chunk0, &s, &e);
        const uint8_t *src = (const uint8_t *)job.landing + (pg.off - job.win_off);
        uint8_t *dst = (uint8_t *)pg.dst;
        uint64_t a = (s + 15) & ~(uint64_t)15, b = e & ~(uint64_t)15;
        if (a > e) a = e;
        if (b < a) b = a;
        for (uint64_t k = s + lane; k < a; k += 32) dst[k] = src[k];
        for (uint64_t k = a / 16 + lane; k < b / 16; k += 32) ((uint4 *)dst)[k] = ((const uint4 *)src)[k];
        for (uint64_t k = b + lane; k < e; k += 32) dst[k] = src[k];
    }
}

/* --- spectral steering --- */

template <typename T> static __device__ float to_f(T x);
template <> __device__ float to_f<float>(float x) { return x; }
template <> __device__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ float to_f<__half>(__half x) { return __half2float(x); }
template <typename T> static __device__ T from_f(float x);
template <> __device__ float from_f<float>(float x) { return x; }
template <> __device__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __half from_f<__half>(float x) { return __float2half_rn(x); }

#define SP_THREADS 256

/* RB rows per block, fused: the rows are read from global memory once
 * into shared memory (as f32), t = psi^T h for each row (r sums over d,
 * split over thread groups and added in shared memory), then each thread
 * writes its columns h + gamma * psi t straight back, reading psi through
 * its transpose so a warp's loads are contiguous. h is read once and
 * written once; psi (d x r, in L2) is read twice per block of RB rows. */
template <typename T, int RB>
static __global__ void __launch_bounds__(SP_THREADS) spectral_rows(kvx_gpu_spectral_job job)
{
    extern __shared__ float sm[];
    const uint32_t d = job.dim, r = job.rank;
    float *hs = sm;                    /* [RB][d] */
    float *ts = sm + (size_t)RB * d;   /* [RB][r] */
    float *part = ts + (size_t)RB * r; /* [groups][RB][kc] partial sums */
    T *h = (T *)job.h;
    const float *psi = (const float *)job.psi, *psit = (const float *)job.psi_t;
    uint64_t row0 = (uint64_t)blockIdx.x * RB;
    int rows = job.n - row0 < (uint64_t)RB ? (int)(job.n - row0) : RB;
    for (int q = 0; q < RB; q++)
        for (uint32_t j = threadIdx.x; j < d; j += SP_THREADS)
            hs[q * d + j] = q < rows ? to_f<T>(h[(row0 + q) * job.stride + j]) : 0.f;
    __syncthreads();
    /* t: k in chunks of kc = min(r, SP_THREADS) columns; groups of kc
     * threads split the rows of psi (j = g, g + groups, ...) */
    const uint32_t kc = r < SP_THREADS ? r : SP_THREADS, groups = SP_THREADS / kc;
    for (uint32_t k0 = 0; k0 < r; k0 += kc) {
        uint32_t g = threadIdx.x / kc, kk = threadIdx.x % kc, k = k0 + kk;
        float acc[RB];
        for (int q = 0; q < RB; q++) acc[q] = 0.f;
        if (g < groups && k < r)
            for (uint32_t j = g; j < d; j += groups) {
                float p = psi[(size_t)j * r + k];
                for (int q = 0; q < RB; q++) acc[q] = fmaf(hs[q * d + j], p, acc[q]);
            }
        if (g < groups)
            for (int q = 0; q < RB; q++) part[((size_t)g * RB + q) * kc + kk] = acc[q];
        __syncthreads();
        for (uint32_t i = threadIdx.x; i < (uint32_t)RB * kc; i += SP_THREADS) {
            uint32_t q = i / kc, kq = i % kc;
            float s = 0.f;
            for (uint32_t gg = 0; gg < groups; gg++) s += part[((size_t)gg * RB + q) * kc + kq];
            if (k0 + kq < r) ts[q * r + k0 + kq] = s;
        }
        __syncthreads();
    }
    for (uint32_t j = threadIdx.x; j < d; j += SP_THREADS) {
        float acc[RB];
        for (int q = 0; q < RB; q++) acc[q] = 0.f;
        for (uint32_t k = 0; k < r; k++) {
            float p = psit[(size_t)k * d + j];
            for (int q = 0; q < RB; q++) acc[q] = fmaf(p, ts[q * r + k], acc[q]);
        }
        for (int q = 0; q < rows; q++)
            h[(row0 + q) * job.stride + j] = from_f<T>(fmaf(job.gamma, acc[q], hs[q * d + j]));
    }
}

template <typename T, int RB> static size_t spectral_smem(const kvx_gpu_spectral_job *job)
{
    uint32_t kc = job->rank < SP_THREADS ? job->rank : SP_THREADS;
    return sizeof(float) * ((size_t)RB * job->dim + (size_t)RB * job->rank + (size_t)(SP_THREADS / kc) * RB * kc);
}

template <typename T, int RB>
static int spectral_try(const kvx_gpu_spectral_job *job, cudaStream_t stream, int max_smem)
{
    size_t smem = spectral_smem<T, RB>(job);
    if (smem > (size_t)max_smem) return 1; /* does not fit: fewer rows per block */
    cudaError_t e = cudaSuccess;
    if (smem > 48 * 1024)
        e = cudaFuncSetAttribute(spectral_rows<T, RB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess) {
        uint64_t blocks = (job->n + RB - 1) / RB;
        spectral_rows<T, RB><<<(unsigned)blocks, SP_THREADS, smem, stream>>>(*job);
        e = cudaGetLastError();
    }
    if (e != cudaSuccess)
        return kvx_fail(-EIO, "spectral kernel launch (%d rows per block, %zu bytes of shared memory): %s (%s)", RB,
                        smem, cudaGetErrorString(e), cudaGetErrorName(e));
    return 0;
}

template <typename T> static int spectral_launch(const kvx_gpu_spectral_job *job, cudaStream_t stream)
{
    int dev = 0, max_smem = 48 * 1024;
    if (cudaGetDevice(&dev) == cudaSuccess)
        cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    (void)cudaGetLastError();
    int rc;
    if ((rc = spectral_try<T, 8>(job, stream, max_smem)) != 1) return rc;
    if ((rc = spectral_try<T, 4>(job, stream, max_smem)) != 1) return rc;
    if ((rc = spectral_try<T, 2>(job, stream, max_smem)) != 1) return rc;
    if ((rc = spectral_try<T, 1>(job, stream, max_smem)) != 1) return rc;
    return kvx_fail(KVX_EINVALID, "spectral: dim %u and rank %u need more shared memory than one block has (%d bytes)",
                    job->dim, job->rank, max_smem);
}

extern "C" int kvx_gk_crc_pages(const kvx_gpu_crc_job *job, cudaStream_t stream)
{
    if (job->p1 <= job->p0) return 0;
    cudaError_t e = cudaSuccess;
    uint64_t blocks = (job->nc + CRC_WARPS - 1) / CRC_WARPS;
    if (blocks > CRC_MAX_BLOCKS) blocks = CRC_MAX_BLOCKS; /* grid-stride past that */
    if (job->verify && job->nc) {
        crc_chunks<<<(unsigned)blocks, CRC_WARPS * 32, 0, stream>>>(*job);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) {
        crc_finish<<<(job->p1 - job->p0 + 255) / 256, 256, 0, stream>>>(*job);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess && job->nc) {
        gather_chunks<<<(unsigned)blocks, CRC_WARPS * 32, 0, stream>>>(*job);
        e = cudaGetLastError();
    }
    if (e != cudaSuccess)
        return kvx_fail(-EIO, "CRC kernel launch (%u pages, %llu chunks): %s (%s)", job->p1 - job->p0,
                        (unsigned long long)job->nc, cudaGetErrorString(e), cudaGetErrorName(e));
    return 0;
}

extern "C" int kvx_gk_spectral(const kvx_gpu_spectral_job *job, cudaStream_t stream)
{
    if (job->n == 0) return 0;
    switch (job->dtype) {
    case KVX_GPU_F32: return spectral_launch<float>(job, stream);
    case KVX_GPU_BF16: return spectral_launch<__nv_bfloat16>(job, stream);
    case KVX_GPU_F16: return spectral_launch<__half>(job, stream);
    }
    return kvx_fail(KVX_EINVALID, "spectral: dtype %d unknown", job->dtype);
}
