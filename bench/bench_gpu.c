/*
 * bench_gpu.c - where a GPU warmup's time goes, every candidate design
 * measured in one run, and the spectral kernel against its bound. What
 * bench/gpu_check.sh runs on a GPU machine.
 *
 * 1. References, same run: cudaMemcpy from pinned memory to the GPU (the
 *    copy engine's rate), a device-to-device copy (the memory's), and for
 *    cold reads an O_DIRECT sequential read of the same file at the same
 *    block size and depth: fio when it is on PATH, else the io_uring
 *    reader below (stated in the table).
 * 2. Warm candidates (the file in the page cache): STAGING (CPU CRC fused
 *    into the read) and STAGING_GPU_CRC, each with 1, 2, 4, 8, 16 CPU
 *    lanes; MAPPED (file mapping registered read-only, DMA from the page
 *    cache, CRC on the GPU). Cold candidates (cache dropped): the three
 *    paths. Each row: GB/s, its ratio to its reference, the per-stage
 *    times of kvx_warmup_get_stages, and a check of every page copied
 *    back against the file (and of the page table).
 * 3. Spectral steering: kvx_gpu_spectral_apply on n = 4096 rows, d 4096
 *    and 8192, r 16 and 64, f32 and bf16, timed with CUDA events against
 *    its bound (one read and one write of h at the device-to-device copy
 *    rate of this run) and, f32, against cuBLAS (two SGEMMs, loaded with
 *    dlopen from the machine's own CUDA: the correctness reference too).
 *
 * usage: bench_gpu [DIR=/tmp] [MiB=1024] [TSV]   (TSV: the rows, tab-separated)
 * Without CUDA in the build it says so and exits 77; without a GPU, 77 too.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <liburing.h>

#include "bench_common.h"
#include "io_bench_util.h"
#include "kvx.h"

#ifdef KVX_WITH_CUDA
#include <cuda_runtime_api.h>

#define QD 8
#define BS (4u << 20)

static FILE *tsv;
static int failures; /* a candidate that delivered a wrong page, a kernel off its tolerance */

static uint32_t tok16(uint32_t i)
{
    (void)i;
    return 16; /* 2 MiB per page at L32 Hkv8 D128 FP16 */
}

/* --- references --- */

/* Best of 3 cudaMemcpy of bytes from pinned host memory, bytes/s. */
static double memcpy_pinned_bw(uint64_t bytes)
{
    void *h = NULL, *d = NULL;
    double best = 0;
    if (cudaMallocHost(&h, bytes) == cudaSuccess && cudaMalloc(&d, bytes) == cudaSuccess) {
        memset(h, 1, bytes);
        cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice); /* warm up */
        for (int rep = 0; rep < 3; rep++) {
            double t = kvx_bench_now();
            cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
            double bw = (double)bytes / (kvx_bench_now() - t);
            if (bw > best) best = bw;
        }
    }
    cudaFree(d);
    cudaFreeHost(h);
    return best;
}

/* Best of 5 device-to-device copies of bytes, in seconds (events). */
static double d2d_copy_s(uint64_t bytes)
{
    void *a = NULL, *b = NULL;
    double best = 0;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess) {
        cudaMemset(a, 1, bytes);
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
        for (int rep = 0; rep < 5; rep++) {
            cudaEventRecord(e0, 0);
            cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
            cudaEventRecord(e1, 0);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            if (best == 0 || ms / 1e3 < best) best = ms / 1e3;
        }
    }
    cudaFree(a);
    cudaFree(b);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return best;
}

/* fio's O_DIRECT sequential read of [off, off + len), bytes/s; 0 when fio
 * is not there or fails. */
static double fio_bw(const char *path, uint64_t off, uint64_t len)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "fio --output-format=json --ioengine=io_uring --direct=1 --name=seq --filename=%s --rw=read "
             "--bs=%u --iodepth=%u --offset=%" PRIu64 " --size=%" PRIu64 " 2>/dev/null",
             path, BS, QD, off, len);
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    size_t cap = 1 << 20, n = 0, k;
    char *out = malloc(cap);
    while ((k = fread(out + n, 1, cap - 1 - n, p)) > 0) n += k;
    out[n] = 0;
    pclose(p);
    double bw = 0;
    char *r = strstr(out, "\"read\"");
    if (r && (r = strstr(r, "\"bw_bytes\""))) bw = strtod(strchr(r, ':') + 1, NULL);
    free(out);
    return bw;
}

/* The same read as fio's, when fio is missing: io_uring, O_DIRECT, QD
 * reads of BS in flight, sequential, into aligned buffers. bytes/s. */
static double uring_read_bw(const char *path, uint64_t off, uint64_t len)
{
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0) return 0;
    struct io_uring ring;
    if (io_uring_queue_init(QD, &ring, 0)) {
        close(fd);
        return 0;
    }
    void *buf[QD];
    for (int i = 0; i < QD; i++)
        if (posix_memalign(&buf[i], 4096, BS)) buf[i] = NULL;
    uint64_t next = off, end = off + len, done = 0;
    unsigned inflight = 0;
    double t = kvx_bench_now();
    int ok = 1;
    for (int i = 0; i < QD && next < end; i++, next += BS) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
        io_uring_prep_read(sqe, fd, buf[i], BS, next);
        io_uring_sqe_set_data(sqe, buf[i]);
        inflight++;
    }
    io_uring_submit(&ring);
    while (inflight && ok) {
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&ring, &cqe)) break;
        void *b = io_uring_cqe_get_data(cqe);
        if (cqe->res <= 0) ok = 0;
        done += cqe->res > 0 ? (uint64_t)cqe->res : 0;
        io_uring_cqe_seen(&ring, cqe);
        inflight--;
        if (next < end) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            io_uring_prep_read(sqe, fd, b, BS, next);
            io_uring_sqe_set_data(sqe, b);
            next += BS;
            inflight++;
            io_uring_submit(&ring);
        }
    }
    t = kvx_bench_now() - t;
    for (int i = 0; i < QD; i++) free(buf[i]);
    io_uring_queue_exit(&ring);
    close(fd);
    return ok && t > 0 ? (double)done / t : 0;
}

/* --- warmup candidates --- */

typedef struct cand {
    const char *label;
    int path, lanes, cold;
} cand;

/* Every page copied back equals the file (through a mapping of it) and
 * the page table holds the device pages: the number of pages wrong. */
static uint64_t verify(kvx_gpu *g, kvx_warmup *w, uint64_t table_dev, kvx_shard *s, const uint8_t *file)
{
    const uint64_t *dp;
    size_t dn;
    if (kvx_warmup_device_pages(&dp, &dn, w)) return 1;
    uint64_t bad = 0, *table = malloc(8 * dn);
    uint8_t *back = malloc(2 << 20);
    if (kvx_gpu_copy_back(table, g, table_dev, 8 * dn) || memcmp(table, dp, 8 * dn)) bad++;
    for (uint32_t i = 0; i < dn; i++) {
        kvx_entry e;
        kvx_shard_entry(&e, s, i);
        if (!dp[i] || e.bytes > (2u << 20) || kvx_gpu_copy_back(back, g, dp[i], e.bytes) ||
            memcmp(back, file + e.offset, e.bytes))
            bad++;
    }
    free(back);
    free(table);
    return bad;
}

static void print_head(const char *ref)
{
    printf("\n%-30s %7s %6s | %7s %7s %7s %7s %7s %7s | %s\n", "candidate", "GB/s", ref, "read", "crc", "reg", "h2d",
           "gpucrc", "sync", "verify");
}

static void run_cand(const cand *c, kvx_shard *s, const char *path, kvx_gpu *g, const uint8_t *file, double ref_bw)
{
    if (c->cold)
        kvx_bench_drop_cache(path);
    else
        kvx_bench_warm_cache(path);
    kvx_gpu_reset(g);
    kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
    o.sink = KVX_SINK_GPU;
    o.gpu = g;
    o.queue_depth = c->cold ? QD : 0;
    o.io_mode = c->cold ? KVX_IO_URING : KVX_IO_AUTO;
    o.threads = (uint32_t)c->lanes;
    o.gpu_path = c->path;
    kvx_warmup *w = NULL;
    kvx_warmup_report rep;
    memset(&rep, 0, sizeof rep);
    int rc = kvx_warmup_start(&w, &s, 1, &o);
    if (!rc) rc = kvx_warmup_wait(&rep, w, -1);
    if (rc) {
        printf("%-30s failed: %s\n", c->label, kvx_last_error());
        kvx_warmup_destroy(w);
        failures++;
        return;
    }
    kvx_warmup_stages st;
    st.version = KVX_WARMUP_STAGES_VERSION;
    kvx_warmup_get_stages(&st, w);
    uint64_t bad = verify(g, w, rep.gpu_page_table, s, file);
    double x = ref_bw > 0 ? rep.gbps * 1e9 / ref_bw : 0;
    printf("%-30s %7.2f %5.2fx | %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f | %s%s%s%s\n", c->label, rep.gbps, x, st.read_s,
           st.crc_cpu_s, st.register_s, st.h2d_s, st.crc_gpu_s, st.sync_s, bad ? "WRONG" : "ok",
           st.fallback ? " (fell back to staging: " : "", st.fallback ? st.fallback_why : "", st.fallback ? ")" : "");
    if (bad) failures++;
    if (tsv)
        fprintf(tsv, "warmup\t%s\t%s\t%d\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%" PRIu64 "\t%d\n",
                c->label, c->cold ? "cold" : "warm", c->lanes, rep.gbps, x, st.read_s, st.crc_cpu_s, st.register_s,
                st.h2d_s, st.crc_gpu_s, st.sync_s, st.seconds, bad, st.fallback);
    kvx_warmup_report_free(&rep);
    kvx_warmup_destroy(w);
}

/* --- spectral --- */

typedef int (*gemm_fn)(void *, int, int, int, int, int, const float *, const float *, int, const float *, int,
                       const float *, float *, int);
static struct {
    void *lib, *handle;
    int (*create)(void **);
    int (*destroy)(void *);
    gemm_fn sgemm;
} cublas;

/* cuBLAS from the machine's own CUDA (any of these sonames), or nothing. */
static int cublas_load(void)
{
    const char *names[] = {"libcublas.so", "libcublas.so.13", "libcublas.so.12", "libcublas.so.11"};
    for (size_t i = 0; i < sizeof names / sizeof *names && !cublas.lib; i++) cublas.lib = dlopen(names[i], RTLD_NOW);
    if (!cublas.lib) return 0;
    *(void **)&cublas.create = dlsym(cublas.lib, "cublasCreate_v2");
    *(void **)&cublas.destroy = dlsym(cublas.lib, "cublasDestroy_v2");
    *(void **)&cublas.sgemm = dlsym(cublas.lib, "cublasSgemm_v2");
    if (!cublas.create || !cublas.destroy || !cublas.sgemm || cublas.create(&cublas.handle)) return 0;
    return 1;
}

/* h (n rows of d, row-major, f32) += gamma psi (psi^T h) as two SGEMMs:
 * column-major, H is d x n, P = psi^T is r x d (psi row-major d x r). */
static int cublas_steer(float *h, const float *psi, float *t, uint32_t n, uint32_t d, uint32_t r, float gamma)
{
    const float one = 1, zero = 0;
    int rc = cublas.sgemm(cublas.handle, 0, 0, (int)r, (int)n, (int)d, &one, psi, (int)r, h, (int)d, &zero, t,
                          (int)r); /* T = P H */
    if (!rc)
        rc = cublas.sgemm(cublas.handle, 1, 0, (int)d, (int)n, (int)r, &gamma, psi, (int)r, t, (int)r, &one, h,
                          (int)d); /* H += gamma P^T T */
    return rc;
}

static float elem(const void *h, uint64_t i, int dtype)
{
    return dtype == KVX_GPU_F32 ? ((const float *)h)[i] : kvx_bf16_to_f32(((const uint16_t *)h)[i]);
}

static void bench_spectral(uint32_t n, uint32_t d, uint32_t r, int dtype, int have_cublas)
{
    uint64_t per = (uint64_t)d * r, elems = (uint64_t)n * d;
    size_t es = dtype == KVX_GPU_F32 ? 4 : 2;
    float *psi = malloc(4 * per);
    for (uint64_t i = 0; i < per; i++) psi[i] = (float)sin((double)i * 0.7071) / sqrtf((float)d);
    uint32_t id = 1;
    kvx_spectral b = {1, 0, 1, d, r, &id, psi};
    kvx_gpu_spectral *sp = NULL;
    if (kvx_gpu_spectral_create(&sp, 0, &b, 1)) {
        printf("spectral: %s\n", kvx_last_error());
        free(psi);
        return;
    }
    uint8_t *h0 = malloc(es * elems), *back = malloc(es * elems);
    for (uint64_t i = 0; i < elems; i++) {
        float v = (float)cos((double)(i % 100003) * 0.011) * 2.0f;
        if (dtype == KVX_GPU_F32)
            ((float *)h0)[i] = v;
        else
            ((uint16_t *)h0)[i] = kvx_f32_to_bf16(v);
    }
    void *dh = NULL, *dpsi = NULL, *dt = NULL;
    cudaMalloc(&dh, es * elems);
    cudaMalloc(&dpsi, 4 * per);
    cudaMalloc(&dt, 4 * (uint64_t)n * r);
    cudaMemcpy(dpsi, psi, 4 * per, cudaMemcpyHostToDevice);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    /* correctness: one application on fresh rows, against the CPU (first rows) */
    cudaMemcpy(dh, h0, es * elems, cudaMemcpyHostToDevice);
    int rc = kvx_gpu_spectral_apply(sp, 0, (uint64_t)(uintptr_t)dh, n, d, dtype, 0.5f, NULL);
    cudaDeviceSynchronize();
    cudaMemcpy(back, dh, es * elems, cudaMemcpyDeviceToHost);
    double maxd = 0, maxh = 0, maxd_cublas = -1;
    float *x = malloc(4 * (size_t)d);
    for (uint32_t i = 0; i < 32 && i < n; i++) {
        for (uint32_t j = 0; j < d; j++) x[j] = elem(h0, (uint64_t)i * d + j, dtype);
        kvx_spectral_apply(x, psi, d, r, 0.5f);
        for (uint32_t j = 0; j < d; j++) {
            maxd = fmax(maxd, fabs((double)elem(back, (uint64_t)i * d + j, dtype) - x[j]));
            maxh = fmax(maxh, fabs((double)x[j]));
        }
    }
    double cublas_s = 0;
    if (have_cublas && dtype == KVX_GPU_F32) {
        float *cb = malloc(4 * elems);
        cudaMemcpy(dh, h0, 4 * elems, cudaMemcpyHostToDevice);
        cublas_steer(dh, dpsi, dt, n, d, r, 0.5f);
        cudaDeviceSynchronize();
        cudaMemcpy(cb, dh, 4 * elems, cudaMemcpyDeviceToHost);
        double mh = 0;
        maxd_cublas = 0;
        for (uint64_t i = 0; i < elems; i++) {
            maxd_cublas = fmax(maxd_cublas, fabs((double)cb[i] - ((float *)back)[i]));
            mh = fmax(mh, fabs((double)cb[i]));
        }
        maxd_cublas /= mh;
        free(cb);
        for (int rep = 0; rep < 6; rep++) { /* best of 5 after one warm-up */
            cudaEventRecord(e0, 0);
            cublas_steer(dh, dpsi, dt, n, d, r, 0.01f);
            cudaEventRecord(e1, 0);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            if (rep && (cublas_s == 0 || ms / 1e3 < cublas_s)) cublas_s = ms / 1e3;
        }
    }
    double kvx_s = 0;
    for (int rep = 0; rep < 6; rep++) {
        cudaEventRecord(e0, 0);
        kvx_gpu_spectral_apply(sp, 0, (uint64_t)(uintptr_t)dh, n, d, dtype, 0.01f, NULL);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (rep && (kvx_s == 0 || ms / 1e3 < kvx_s)) kvx_s = ms / 1e3;
    }
    double bound = d2d_copy_s(es * elems); /* one read and one write of h */
    char label[64];
    snprintf(label, sizeof label, "n%u d%u r%u %s", n, d, r, dtype == KVX_GPU_F32 ? "f32" : "bf16");
    printf("%-26s %9.3f %9.3f %6.2fx %9.3f %6.2fx %9.2g %9.2g%s\n", label, kvx_s * 1e3, bound * 1e3,
           kvx_s > 0 ? bound / kvx_s : 0, cublas_s * 1e3, kvx_s > 0 && cublas_s > 0 ? cublas_s / kvx_s : 0,
           maxh > 0 ? maxd / maxh : 0, maxd_cublas, rc ? " FAILED" : "");
    if (rc || (maxh > 0 && maxd / maxh > (dtype == KVX_GPU_F32 ? 1e-5 : 1e-2))) failures++;
    if (tsv)
        fprintf(tsv, "spectral\t%s\t%.6f\t%.6f\t%.6f\t%.3g\t%.3g\t%d\n", label, kvx_s, bound, cublas_s,
                maxh > 0 ? maxd / maxh : 0, maxd_cublas, rc);
    free(x);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(dh);
    cudaFree(dpsi);
    cudaFree(dt);
    free(h0);
    free(back);
    free(psi);
    kvx_gpu_spectral_destroy(sp);
}
#endif

int main(int argc, char **argv)
{
    int ngpu = 0;
    int rc = kvx_gpu_count(&ngpu);
    if (rc == KVX_ENOCUDA) {
        printf("bench_gpu: %s\n", kvx_last_error());
        return 77;
    }
    if (ngpu == 0) {
        printf("bench_gpu: no GPU visible\n");
        return 77;
    }
#ifdef KVX_WITH_CUDA
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    uint64_t mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 1024;
    if (argc > 3 && !(tsv = fopen(argv[3], "w"))) perror(argv[3]);
    uint32_t n = (uint32_t)(mib / 2);
    char path[600];
    snprintf(path, sizeof path, "%s/bench_gpu.kvx", dir);
    kvx_geometry geo = {32, 8, 128, 16, KVX_QUANT_FP16, 1};
    uint64_t rng = 0x243F6A8885A308D3ull;
    if ((rc = kvx_bench_write_shard(path, geo, 7, n, tok16, &rng))) {
        fprintf(stderr, "write: %s\n", kvx_last_error());
        return 1;
    }
    kvx_shard *s;
    if ((rc = kvx_shard_open(&s, path, 0))) {
        fprintf(stderr, "open: %s\n", kvx_last_error());
        return 1;
    }
    const kvx_shard_info *info = kvx_shard_get_info(s);
    int fd = open(path, O_RDONLY);
    const uint8_t *file = mmap(NULL, info->file_size, PROT_READ, MAP_SHARED, fd, 0);
    uint64_t need;
    kvx_warmup_sink_bytes(&need, &s, 1);
    kvx_gpu_options go = KVX_GPU_OPTIONS_INIT;
    go.arena_bytes = need + 8ull * n + (1 << 20);
    go.streams = 8;
    kvx_gpu *g;
    if ((rc = kvx_gpu_create(&g, &go))) {
        fprintf(stderr, "gpu: %s\n", kvx_last_error());
        return 1;
    }
    int node = -1;
    kvx_gpu_numa_node(&node, 0);
    uint64_t bytes = (uint64_t)n * (2u << 20);
    double ref_h2d = memcpy_pinned_bw(bytes);
    double d2d = d2d_copy_s(bytes);
    printf("GPU 0 (NUMA node %d), %u pages x 2 MiB = %" PRIu64 " MiB, %ld CPUs\n", node, n, bytes >> 20,
           sysconf(_SC_NPROCESSORS_ONLN));
    printf("reference: cudaMemcpy pinned -> GPU %.2f GB/s; device-to-device copy %.1f GB/s (read + write)\n",
           ref_h2d / 1e9, d2d > 0 ? 2.0 * bytes / d2d / 1e9 : 0);
    if (tsv)
        fprintf(tsv, "# warmup: candidate, warm|cold, lanes, GB/s, x reference, read, crc_cpu, register, h2d, crc_gpu, "
                     "sync, wall (s), pages wrong, fallback\n# spectral: case, kvx s, bound s, cuBLAS s, "
                     "max|diff|/max|h| vs CPU, vs cuBLAS, rc\n");
    if (tsv)
        fprintf(tsv, "reference\tcudaMemcpy pinned\t%.4f\nreference\td2d copy\t%.4f\n", ref_h2d / 1e9,
                d2d > 0 ? 2.0 * bytes / d2d / 1e9 : 0);

    /* warm: the file in the page cache */
    printf("\nwarm (page cache -> GPU, every page checked); times: seconds per stage (CPU stages summed over "
           "lanes, GPU stages over streams)");
    print_head("x cpy");
    static const int lanes[5] = {1, 2, 4, 8, 16};
    char labels[16][48];
    int nl = 0;
    for (int p = KVX_GPU_PATH_STAGING; p <= KVX_GPU_PATH_STAGING_GPU_CRC; p++)
        for (int l = 0; l < 5; l++) {
            snprintf(labels[nl], sizeof labels[nl], "%s, %d lanes", kvx_gpu_path_name(p), lanes[l]);
            cand c = {labels[nl++], p, lanes[l], 0};
            run_cand(&c, s, path, g, file, ref_h2d);
        }
    cand mapped = {"mapped", KVX_GPU_PATH_MAPPED, 0, 0};
    run_cand(&mapped, s, path, g, file, ref_h2d);
    cand autow = {"auto (default)", KVX_GPU_PATH_AUTO, 0, 0};
    run_cand(&autow, s, path, g, file, ref_h2d);

    /* cold: from the disk, against an O_DIRECT sequential read of the same
     * bytes at the same block size and depth */
    uint64_t span = info->file_size - info->kv_data_offset;
    kvx_bench_drop_cache(path);
    double ref_cold = fio_bw(path, info->kv_data_offset, span);
    const char *ref_name = "fio io_uring O_DIRECT";
    if (ref_cold <= 0) {
        ref_name = "bench_gpu's io_uring O_DIRECT reader";
        kvx_bench_drop_cache(path);
        ref_cold = uring_read_bw(path, info->kv_data_offset, span);
    }
    printf("\ncold (page cache dropped%s); reference: %s, bs %u MiB, depth %u: %.2f GB/s",
           geteuid() ? ", this file's pages only: not root" : "", ref_name, BS >> 20, QD, ref_cold / 1e9);
    if (tsv) fprintf(tsv, "reference\t%s\t%.4f\n", ref_name, ref_cold / 1e9);
    print_head("x read");
    cand cold[3] = {{"staging, cold", KVX_GPU_PATH_STAGING, 0, 1},
                    {"staging-gpu-crc, cold", KVX_GPU_PATH_STAGING_GPU_CRC, 0, 1},
                    {"mapped, cold", KVX_GPU_PATH_MAPPED, 0, 1}};
    for (int i = 0; i < 3; i++) run_cand(&cold[i], s, path, g, file, ref_cold);

    /* spectral steering on the device */
    int have_cublas = cublas_load();
    printf("\nspectral steering, h += gamma psi (psi^T h) on the device; bound: one read + one write of h at the\n"
           "device-to-device copy rate (x bound = bound / kvx time); cuBLAS: two SGEMMs (f32)%s\n",
           have_cublas ? "" : " - not found here");
    printf("%-26s %9s %9s %7s %9s %7s %9s %9s\n", "case", "kvx ms", "bound ms", "x bound", "cuBLAS ms", "x cuBLAS",
           "vs CPU", "vs cuBLAS");
    kvx_gpu_destroy(g);
    static const uint32_t dims[2] = {4096, 8192}, ranks[2] = {16, 64};
    for (int di = 0; di < 2; di++)
        for (int ri = 0; ri < 2; ri++)
            for (int t = 0; t < 2; t++)
                bench_spectral(4096, dims[di], ranks[ri], t ? KVX_GPU_BF16 : KVX_GPU_F32, have_cublas);
    if (have_cublas) cublas.destroy(cublas.handle);

    munmap((void *)file, info->file_size);
    close(fd);
    kvx_shard_close(s);
    unlink(path);
    if (tsv) fclose(tsv);
    printf("\n%s\n", failures ? "bench_gpu: FAILED (see WRONG / FAILED above)" : "bench_gpu: every page verified");
    return failures ? 1 : 0;
#else
    (void)argc, (void)argv;
    return 77;
#endif
}
