/*
 * gpu_crc.c - the host side of the GPU CRC kernel (gpu_crc.h): its
 * constants, its tables, and the kernel's whole computation replayed on
 * the host, step for step, with the same functions the GPU runs: for one
 * page (kvx_gcrc_page_host, checked against ISA-L) and for a whole job of
 * gpu_kernels.cu (kvx_gcrc_job_host: what the tests' fake device runs on
 * host memory in place of the three kernels).
 */
#include "gpu_crc.h"

#include "gpu_dev.h"

/* x^(8 * unit * 2^k) for k = 0..n-1, starting from x^(8 * unit). */
static void pow_table(uint32_t *tab, unsigned n, uint64_t unit)
{
    /* x^8 (one byte) in the reflected form is bit 31 - 8 */
    uint32_t x8 = KVX_GCRC_ONE >> 8, p = KVX_GCRC_ONE;
    for (uint64_t u = unit; u; u >>= 1) { /* x^(8 unit) by squaring x^8 */
        if (u & 1) p = kvx_gcrc_mul(x8, p);
        x8 = kvx_gcrc_mul(x8, x8);
    }
    for (unsigned k = 0; k < n; k++) {
        tab[k] = p;
        p = kvx_gcrc_mul(p, p);
    }
}

void kvx_gcrc_consts_init(kvx_gcrc_consts *c)
{
    pow_table(c->seg_pow, 5, KVX_GCRC_SEG);
    pow_table(c->chunk_pow, 48, KVX_GCRC_CHUNK);
    pow_table(c->byte_pow, 64, 1);
}

void kvx_gcrc_tables_init(uint32_t *t)
{
    for (unsigned i = 0; i < KVX_GCRC_TABLE_WORDS; i++) t[i] = kvx_gcrc_table_entry(i >> 8, i & 0xFF);
}

uint32_t kvx_gcrc_page_host(const uint32_t *t, const kvx_gcrc_consts *c, const uint8_t *page, uint64_t n)
{
    uint64_t nch = kvx_gcrc_nchunks(n);
    uint32_t acc = 0;
    for (uint64_t j = 0; j < nch; j++) {
        uint32_t v[KVX_GCRC_LANES];
        for (unsigned lane = 0; lane < KVX_GCRC_LANES; lane++) v[lane] = kvx_gcrc_lane(t, page, n, j, lane);
        /* the warp's tree: at level k, lane l (a multiple of 2^(k+1))
         * takes lane l + 2^k's value, as __shfl_down_sync gives it */
        for (unsigned k = 0; k < 5; k++)
            for (unsigned lane = 0; lane < KVX_GCRC_LANES; lane += 2u << k)
                v[lane] = kvx_gcrc_tree(c, v[lane], v[lane + (1u << k)], k);
        acc ^= kvx_gcrc_place(c, v[0], nch, j);
    }
    return kvx_gcrc_finish(c, acc, n);
}

void kvx_gcrc_job_host(const kvx_gpu_crc_job *job)
{
    uint32_t t[KVX_GCRC_TABLE_WORDS];
    kvx_gcrc_tables_init(t);
    const kvx_gpu_page *pages = (const kvx_gpu_page *)(uintptr_t)job->pages;
    uint32_t *acc = (uint32_t *)(uintptr_t)job->acc, *status = (uint32_t *)(uintptr_t)job->status;
    const uint8_t *landing = (const uint8_t *)(uintptr_t)job->landing;
    if (job->p1 <= job->p0) return;
    /* crc_chunks: every chunk of the job (XOR commutes: order is free) */
    for (uint64_t g = 0; job->verify && g < job->nc; g++) {
        uint64_t c = job->c0 + g;
        uint32_t p = kvx_gcrc_page_of_chunk(pages, job->p0, job->p1, c);
        const uint8_t *base = landing + (pages[p].off - job->win_off);
        uint64_t j = c - pages[p].chunk0, nch = kvx_gcrc_nchunks(pages[p].bytes);
        uint32_t v[KVX_GCRC_LANES];
        for (unsigned lane = 0; lane < KVX_GCRC_LANES; lane++)
            v[lane] = kvx_gcrc_lane(t, base, pages[p].bytes, j, lane);
        for (unsigned k = 0; k < 5; k++)
            for (unsigned lane = 0; lane < KVX_GCRC_LANES; lane += 2u << k)
                v[lane] = kvx_gcrc_tree(&job->consts, v[lane], v[lane + (1u << k)], k);
        acc[p] ^= kvx_gcrc_place(&job->consts, v[0], nch, j);
    }
    /* crc_finish */
    for (uint32_t p = job->p0; p < job->p1; p++)
        status[p] = !job->verify || kvx_gcrc_finish(&job->consts, acc[p], pages[p].bytes) == pages[p].crc
                        ? KVX_GPU_PAGE_GOOD
                        : KVX_GPU_PAGE_BAD;
    /* gather_chunks: each chunk of a good page to its place */
    for (uint64_t g = 0; g < job->nc; g++) {
        uint64_t c = job->c0 + g, s, e;
        uint32_t p = kvx_gcrc_page_of_chunk(pages, job->p0, job->p1, c);
        if (status[p] != KVX_GPU_PAGE_GOOD) continue;
        kvx_gcrc_chunk_span(pages[p].bytes, c - pages[p].chunk0, &s, &e);
        memcpy((uint8_t *)(uintptr_t)pages[p].dst + s, landing + (pages[p].off - job->win_off) + s, e - s);
    }
}
