/*
 * bench_common.h - tiny timing helpers shared by the bench/ programs.
 *
 * Every figure a benchmark prints is a ratio to a physical reference
 * measured in the same run (here: memcpy of the same number of bytes), so
 * numbers from a noisy shared VM still compare. Timing is best-of-k on the
 * monotonic clock: the minimum is the least disturbed run.
 *
 *   double t = kvx_bench_best(5, my_fn, &ctx);          // seconds
 *   double gbps = kvx_bench_gbps(bytes, t);
 *   double ref = kvx_bench_memcpy_gbps(bytes, 5);       // same bytes
 *   printf("%.2f GB/s  %.2fx memcpy\n", gbps, gbps / ref);
 *
 * or, steadier on a shared machine, kvx_bench_interleaved() (below), which
 * alternates the operation with the reference copy.
 */
#ifndef KVX_BENCH_COMMON_H
#define KVX_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static inline double kvx_bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Decimal GB/s for bytes moved in secs. */
static inline double kvx_bench_gbps(double bytes, double secs)
{
    return secs > 0 ? bytes / secs / 1e9 : 0.0;
}

typedef void (*kvx_bench_fn)(void *ctx);

/* Best (smallest) wall time of k runs of fn(ctx), in seconds. */
static inline double kvx_bench_best(int k, kvx_bench_fn fn, void *ctx)
{
    double best = 1e300;
    for (int i = 0; i < (k > 0 ? k : 1); i++) {
        double t0 = kvx_bench_now();
        fn(ctx);
        double t = kvx_bench_now() - t0;
        if (t < best) best = t;
    }
    return best;
}

/* Keeps the compiler from dropping a computation whose result is unused. */
static inline void kvx_bench_keep(const void *p)
{
    __asm__ volatile("" : : "r"(p) : "memory");
}

/* The memcpy reference: GB/s of copying n bytes between two fresh,
 * pre-faulted buffers, best of k. Returns 0 when memory is short. */
static inline double kvx_bench_memcpy_gbps(size_t n, int k)
{
    unsigned char *src = malloc(n ? n : 1), *dst = malloc(n ? n : 1);
    if (!src || !dst) { free(src); free(dst); return 0.0; }
    memset(src, 0x5A, n);
    memset(dst, 0, n); /* fault the pages in before timing */
    double best = 1e300;
    for (int i = 0; i < (k > 0 ? k : 1); i++) {
        double t0 = kvx_bench_now();
        memcpy(dst, src, n);
        kvx_bench_keep(dst);
        double t = kvx_bench_now() - t0;
        if (t < best) best = t;
    }
    free(src);
    free(dst);
    return kvx_bench_gbps((double)n, best);
}

/* A memcpy reference with buffers kept for the whole run, so a row can
 * alternate its operation with the reference copy (best of each): on a
 * shared machine both then see the same neighbours. */
typedef struct kvx_bench_ref {
    unsigned char *src, *dst;
    size_t cap;
} kvx_bench_ref;

static inline int kvx_bench_ref_init(kvx_bench_ref *r, size_t cap)
{
    r->cap = cap;
    r->src = malloc(cap ? cap : 1);
    r->dst = malloc(cap ? cap : 1);
    if (!r->src || !r->dst) { free(r->src); free(r->dst); r->src = r->dst = NULL; return -1; }
    memset(r->src, 0x5A, cap);
    memset(r->dst, 0, cap);
    return 0;
}

static inline void kvx_bench_ref_free(kvx_bench_ref *r)
{
    free(r->src);
    free(r->dst);
    r->src = r->dst = NULL;
}

/* Runs fn(ctx) and a memcpy of n bytes (n <= r->cap) alternately, k
 * times; sets the best seconds of each. */
static inline void kvx_bench_interleaved(int k, kvx_bench_fn fn, void *ctx, kvx_bench_ref *r, size_t n,
                                         double *out_fn_s, double *out_ref_s)
{
    double bf = 1e300, br = 1e300;
    if (n > r->cap) n = r->cap;
    for (int i = 0; i < (k > 0 ? k : 1); i++) {
        double t0 = kvx_bench_now();
        fn(ctx);
        double t1 = kvx_bench_now();
        memcpy(r->dst, r->src, n);
        kvx_bench_keep(r->dst);
        double t2 = kvx_bench_now();
        if (t1 - t0 < bf) bf = t1 - t0;
        if (t2 - t1 < br) br = t2 - t1;
    }
    *out_fn_s = bf;
    *out_ref_s = br;
}

#endif
