/*
 * collide.h - test support: finds collisions of kvx's chained block hash
 * (include/kvx.h, engine/hash.c), header-only (every function is static;
 * include it from the test that needs it, no CMake change).
 *
 *   H(parent, toks) = fnv1a64(le_u64(parent) || le_u32(toks[0]) .. le_u32(toks[B-1])),
 *   a result of 0 replaced by 1.
 *
 * kvx_test_find_collision(B, seed, a, b, attempt_s, max_s) fills two
 * different B-token lists with kvx_block_hash(0, a, B) == kvx_block_hash(0,
 * b, B): a chained collision at block 0, so every later block appended
 * identically to both collides too. a[0..B-3] == b[0..B-3] are
 * pseudo-random from the seed; the last two tokens (64 bits) are searched,
 * so the pair (a[B-2], a[B-1]) != (b[B-2], b[B-1]) (in practice both differ:
 * one equal would need a 4-byte FNV collision).
 *
 * Method: the FNV state after the 8 zero parent bytes and the B-2 fixed
 * tokens is computed once (s0). The walk function on the 64-bit space is
 *
 *   g(x) = fnv_raw(s0, le bytes of x) ^ mask        (x = tok[B-2] | tok[B-1] << 32)
 *
 * (mask from the seed makes every attempt a fresh random function, even
 * for B = 2 where s0 is fixed); g(x) == g(y) with x != y is a collision of
 * H. A parallel Pollard-rho / van Oorschot-Wiener distinguished-point
 * search: each thread runs 16 independent walks in lockstep (AVX2, 4 x 4
 * lanes, where the CPU has it and KVX_COLLIDE_NO_AVX2 is not defined;
 * otherwise 16 scalar lanes), a walk ends at a
 * point whose top KVX_COLLIDE_DP_BITS bits are zero and its (start, length)
 * goes into a shared table keyed by that point; a fresh random walk starts
 * in its lane. Two walks from different starts reaching the same point are
 * re-walked in lockstep (the longer advanced first) to the pair that
 * merges. When one start lies on the other's path ("Robin Hood") there is
 * no collision: discarded. The result is checked with kvx_block_hash.
 * About sqrt(pi/2 * 2^64) ~ 5.4e9 evaluations are expected.
 *
 * The kernels are compiled with optimization and without sanitizer
 * instrumentation even in debug/sanitizer builds (GCC: optimize("O3");
 * clang has no per-function level, so a clang -O0 build runs the scalar
 * kernel unoptimized, ~5x slower).
 */
#ifndef KVX_TESTS_COLLIDE_H
#define KVX_TESTS_COLLIDE_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvx.h"

/* clang cannot raise the optimization level per function and its -O0 AVX2
 * intrinsics run ~50x slower than the scalar kernel: scalar there. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) &&                    \
    !defined(KVX_COLLIDE_NO_AVX2) && !(defined(__clang__) && !defined(__OPTIMIZE__))
#include <immintrin.h>
#define KVX_COLLIDE_HAVE_AVX2 1
#else
#define KVX_COLLIDE_HAVE_AVX2 0
#endif

#if defined(__clang__)
#define KVX_COLLIDE_HOT __attribute__((unused, no_sanitize("address", "undefined")))
#elif defined(__GNUC__)
#define KVX_COLLIDE_HOT __attribute__((unused, optimize("O3"), no_sanitize("address", "undefined")))
#else
#define KVX_COLLIDE_HOT
#endif
#if defined(__GNUC__) || defined(__clang__)
#define KVX_COLLIDE_UNUSED __attribute__((unused))
#else
#define KVX_COLLIDE_UNUSED
#endif

#define KVX_COLLIDE_FNV_OFFSET 0xCBF29CE484222325ULL
#define KVX_COLLIDE_FNV_PRIME 0x100000001B3ULL
#define KVX_COLLIDE_LANES 16
#define KVX_COLLIDE_DP_BITS 18                          /* a walk is ~2^18 steps */
#define KVX_COLLIDE_MAX_WALK (40ULL << KVX_COLLIDE_DP_BITS) /* then abandoned */
#define KVX_COLLIDE_CHUNK (1ULL << 16) /* steps per kernel call (~2 ms) */
#define KVX_COLLIDE_MAX_THREADS 8

/* What one search did (optional out-parameter of the _ex form). */
typedef struct {
    double seconds;         /* wall time, all attempts */
    uint64_t evaluations;   /* walk steps (hash evaluations), all attempts */
    uint32_t attempts;      /* attempts started (1 = no reseed) */
    uint32_t threads;       /* worker threads per attempt */
    uint32_t lanes;         /* walks per thread */
    int avx2;               /* 1 when the AVX2 kernel ran */
    uint64_t distinguished; /* distinguished points stored, last attempt */
    uint64_t robin_hoods;   /* merges discarded (a start on the other path) */
    uint64_t seed_used;     /* seed of the last attempt (prefix tokens, mask) */
    char why[192];          /* on give-up: the reason */
} kvx_test_collide_stats;

static KVX_COLLIDE_UNUSED double kvx_collide_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static KVX_COLLIDE_UNUSED uint64_t kvx_collide_splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static KVX_COLLIDE_UNUSED uint64_t kvx_collide_fnv_u32(uint64_t h, uint32_t v)
{
    for (int i = 0; i < 4; i++) h = (h ^ ((v >> (8 * i)) & 0xFF)) * KVX_COLLIDE_FNV_PRIME;
    return h;
}

/* The FNV state after the 8 bytes of x (little-endian), from state s0;
 * no 0 -> 1 replacement (equal raw states give equal hashes). */
#define KVX_COLLIDE_ROUND(h, x, i) (h) = ((h) ^ (((x) >> (8 * (i))) & 0xFF)) * KVX_COLLIDE_FNV_PRIME
static inline KVX_COLLIDE_HOT uint64_t kvx_collide_g(uint64_t s0, uint64_t mask, uint64_t x)
{
    uint64_t h = s0;
    KVX_COLLIDE_ROUND(h, x, 0);
    KVX_COLLIDE_ROUND(h, x, 1);
    KVX_COLLIDE_ROUND(h, x, 2);
    KVX_COLLIDE_ROUND(h, x, 3);
    KVX_COLLIDE_ROUND(h, x, 4);
    KVX_COLLIDE_ROUND(h, x, 5);
    KVX_COLLIDE_ROUND(h, x, 6);
    KVX_COLLIDE_ROUND(h, x, 7);
    return h ^ mask;
}

/* Kernels: advance the 16 walks in x[] in lockstep until a step leaves
 * some walk on a distinguished point (top bits zero: x >> dp_shift == 0)
 * or max_steps steps are done. Returns the steps done (>= 1). */
static KVX_COLLIDE_HOT uint64_t kvx_collide_kernel_scalar(uint64_t s0, uint64_t mask,
                                                          unsigned dp_shift, uint64_t *x,
                                                          uint64_t max_steps)
{
    uint64_t v[KVX_COLLIDE_LANES];
    memcpy(v, x, sizeof v);
    uint64_t n = 0;
    while (n < max_steps) {
        uint64_t hit = 0;
        for (int l = 0; l < KVX_COLLIDE_LANES; l++) {
            v[l] = kvx_collide_g(s0, mask, v[l]);
            hit |= (uint64_t)((v[l] >> dp_shift) == 0);
        }
        n++;
        if (hit) break;
    }
    memcpy(x, v, sizeof v);
    return n;
}

#if KVX_COLLIDE_HAVE_AVX2
#if defined(__clang__)
#define KVX_COLLIDE_AVX2 __attribute__((unused, target("avx2"), no_sanitize("address", "undefined")))
#else
#define KVX_COLLIDE_AVX2 \
    __attribute__((unused, target("avx2"), optimize("O3"), no_sanitize("address", "undefined")))
#endif
/* One FNV byte round on 4 lanes: h = (h ^ byte_i(v)) * P with
 * P = 2^40 + 0x1B3, h = H:L (32-bit halves):
 * h * P = L * 0x1B3 + ((H * 0x1B3) mod 2^32) << 32 + h << 40 (mod 2^64). */
#define KVX_COLLIDE_VROUND(h, v, sh)                                                   \
    do {                                                                               \
        (h) = _mm256_xor_si256((h), _mm256_shuffle_epi8((v), (sh)));                   \
        (h) = _mm256_add_epi64(_mm256_add_epi64(_mm256_mul_epu32((h), c_lo),           \
                                                _mm256_mullo_epi32((h), c_hi)),        \
                               _mm256_slli_epi64((h), 40));                            \
    } while (0)
#define KVX_COLLIDE_VSTEP(v)                                                           \
    do {                                                                               \
        __m256i h_ = vs0;                                                              \
        KVX_COLLIDE_VROUND(h_, (v), sh0);                                              \
        KVX_COLLIDE_VROUND(h_, (v), sh1);                                              \
        KVX_COLLIDE_VROUND(h_, (v), sh2);                                              \
        KVX_COLLIDE_VROUND(h_, (v), sh3);                                              \
        KVX_COLLIDE_VROUND(h_, (v), sh4);                                              \
        KVX_COLLIDE_VROUND(h_, (v), sh5);                                              \
        KVX_COLLIDE_VROUND(h_, (v), sh6);                                              \
        KVX_COLLIDE_VROUND(h_, (v), sh7);                                              \
        (v) = _mm256_xor_si256(h_, vmask);                                             \
    } while (0)
/* vpshufb control moving byte i of each 64-bit lane to its byte 0, zeros
 * elsewhere (indexes are within each 128-bit half). */
#define KVX_COLLIDE_SHUF(i)                                                            \
    _mm256_set_epi64x((long long)(0x8080808080808000ULL | (8 + (i))),                  \
                      (long long)(0x8080808080808000ULL | (i)),                        \
                      (long long)(0x8080808080808000ULL | (8 + (i))),                  \
                      (long long)(0x8080808080808000ULL | (i)))

static KVX_COLLIDE_AVX2 uint64_t kvx_collide_kernel_avx2(uint64_t s0, uint64_t mask,
                                                         unsigned dp_shift, uint64_t *x,
                                                         uint64_t max_steps)
{
    const __m256i c_lo = _mm256_set1_epi64x(0x1B3);
    const __m256i c_hi = _mm256_set1_epi64x((long long)(0x1B3ULL << 32));
    const __m256i vs0 = _mm256_set1_epi64x((long long)s0);
    const __m256i vmask = _mm256_set1_epi64x((long long)mask);
    const __m256i zero = _mm256_setzero_si256();
    const __m128i cnt = _mm_cvtsi32_si128((int)dp_shift);
    const __m256i sh0 = KVX_COLLIDE_SHUF(0), sh1 = KVX_COLLIDE_SHUF(1);
    const __m256i sh2 = KVX_COLLIDE_SHUF(2), sh3 = KVX_COLLIDE_SHUF(3);
    const __m256i sh4 = KVX_COLLIDE_SHUF(4), sh5 = KVX_COLLIDE_SHUF(5);
    const __m256i sh6 = KVX_COLLIDE_SHUF(6), sh7 = KVX_COLLIDE_SHUF(7);
    __m256i v0 = _mm256_loadu_si256((const __m256i *)(const void *)(x + 0));
    __m256i v1 = _mm256_loadu_si256((const __m256i *)(const void *)(x + 4));
    __m256i v2 = _mm256_loadu_si256((const __m256i *)(const void *)(x + 8));
    __m256i v3 = _mm256_loadu_si256((const __m256i *)(const void *)(x + 12));
    uint64_t n = 0;
    while (n < max_steps) {
        KVX_COLLIDE_VSTEP(v0);
        KVX_COLLIDE_VSTEP(v1);
        KVX_COLLIDE_VSTEP(v2);
        KVX_COLLIDE_VSTEP(v3);
        n++;
        __m256i d = _mm256_or_si256(
            _mm256_or_si256(_mm256_cmpeq_epi64(_mm256_srl_epi64(v0, cnt), zero),
                            _mm256_cmpeq_epi64(_mm256_srl_epi64(v1, cnt), zero)),
            _mm256_or_si256(_mm256_cmpeq_epi64(_mm256_srl_epi64(v2, cnt), zero),
                            _mm256_cmpeq_epi64(_mm256_srl_epi64(v3, cnt), zero)));
        if (!_mm256_testz_si256(d, d)) break;
    }
    _mm256_storeu_si256((__m256i *)(void *)(x + 0), v0);
    _mm256_storeu_si256((__m256i *)(void *)(x + 4), v1);
    _mm256_storeu_si256((__m256i *)(void *)(x + 8), v2);
    _mm256_storeu_si256((__m256i *)(void *)(x + 12), v3);
    return n;
}
#endif

/* Two walks (start a, length la), (start b, length lb) that end on the same
 * distinguished point: re-walk them in lockstep to the pair x != y with
 * g(x) == g(y). Returns 1 with the pair, 0 when one start lies on the
 * other's path (Robin Hood) or nothing merged. */
static KVX_COLLIDE_HOT int kvx_collide_resolve(uint64_t s0, uint64_t mask, uint64_t a,
                                               uint64_t la, uint64_t b, uint64_t lb,
                                               uint64_t *ox, uint64_t *oy)
{
    if (la < lb) {
        uint64_t t = a;
        a = b;
        b = t;
        t = la;
        la = lb;
        lb = t;
    }
    for (; la > lb; la--) a = kvx_collide_g(s0, mask, a);
    if (a == b) return 0;
    for (uint64_t i = 0; i < lb; i++) {
        uint64_t na = kvx_collide_g(s0, mask, a), nb = kvx_collide_g(s0, mask, b);
        if (na == nb) {
            *ox = a;
            *oy = b;
            return 1;
        }
        a = na;
        b = nb;
    }
    return 0;
}

typedef struct {
    uint64_t dp, start, len; /* len 0: empty slot */
} kvx_collide_slot;

typedef uint64_t (*kvx_collide_kernel_fn)(uint64_t, uint64_t, unsigned, uint64_t *, uint64_t);

typedef struct {
    uint64_t s0, mask;
    unsigned dp_shift;
    kvx_collide_kernel_fn kernel;
    double deadline;
    atomic_int stop; /* 0 run, 1 found, 2 time, 3 out of memory */
    pthread_mutex_t mu;
    kvx_collide_slot *tab; /* open addressing, power-of-two capacity */
    size_t cap, n;
    uint64_t robin_hoods;
    int found;
    uint64_t x, y;
} kvx_collide_ctx;

typedef struct {
    kvx_collide_ctx *ctx;
    uint64_t rng;
    uint64_t evals;
} kvx_collide_worker_arg;

static KVX_COLLIDE_UNUSED size_t kvx_collide_slot_of(const kvx_collide_slot *tab, size_t cap,
                                                     uint64_t dp)
{
    size_t i = (size_t)((dp * 0x9E3779B97F4A7C15ULL) >> 20) & (cap - 1);
    while (tab[i].len != 0 && tab[i].dp != dp) i = (i + 1) & (cap - 1);
    return i;
}

/* Under ctx->mu. 0 ok, -1 out of memory. */
static KVX_COLLIDE_UNUSED int kvx_collide_grow(kvx_collide_ctx *ctx)
{
    size_t cap = ctx->cap ? ctx->cap * 2 : (size_t)1 << 15;
    kvx_collide_slot *tab = (kvx_collide_slot *)calloc(cap, sizeof *tab);
    if (!tab) return -1;
    for (size_t i = 0; i < ctx->cap; i++) {
        if (ctx->tab[i].len == 0) continue;
        tab[kvx_collide_slot_of(tab, cap, ctx->tab[i].dp)] = ctx->tab[i];
    }
    free(ctx->tab);
    ctx->tab = tab;
    ctx->cap = cap;
    return 0;
}

/* A walk from start reached the distinguished point dp after len steps. */
static KVX_COLLIDE_UNUSED void kvx_collide_point(kvx_collide_ctx *ctx, uint64_t dp,
                                                 uint64_t start, uint64_t len)
{
    pthread_mutex_lock(&ctx->mu);
    if ((ctx->n + 1) * 2 > ctx->cap && kvx_collide_grow(ctx) != 0) {
        atomic_store(&ctx->stop, 3);
        pthread_mutex_unlock(&ctx->mu);
        return;
    }
    kvx_collide_slot *s = &ctx->tab[kvx_collide_slot_of(ctx->tab, ctx->cap, dp)];
    if (s->len == 0) {
        s->dp = dp;
        s->start = start;
        s->len = len;
        ctx->n++;
        pthread_mutex_unlock(&ctx->mu);
        return;
    }
    kvx_collide_slot other = *s;
    pthread_mutex_unlock(&ctx->mu);
    if (other.start == start) return; /* the same walk twice: nothing to learn */
    uint64_t x, y;
    int ok = kvx_collide_resolve(ctx->s0, ctx->mask, start, len, other.start, other.len, &x, &y);
    pthread_mutex_lock(&ctx->mu);
    if (ok && !ctx->found) {
        ctx->found = 1;
        ctx->x = x;
        ctx->y = y;
        atomic_store(&ctx->stop, 1);
    } else if (!ok) {
        ctx->robin_hoods++;
    }
    pthread_mutex_unlock(&ctx->mu);
}

static KVX_COLLIDE_UNUSED void *kvx_collide_worker(void *p)
{
    kvx_collide_worker_arg *w = (kvx_collide_worker_arg *)p;
    kvx_collide_ctx *ctx = w->ctx;
    uint64_t x[KVX_COLLIDE_LANES], start[KVX_COLLIDE_LANES], since[KVX_COLLIDE_LANES];
    uint64_t step = 0;
    for (int l = 0; l < KVX_COLLIDE_LANES; l++) {
        x[l] = start[l] = kvx_collide_splitmix(&w->rng);
        since[l] = 0;
    }
    while (atomic_load_explicit(&ctx->stop, memory_order_relaxed) == 0) {
        uint64_t n = ctx->kernel(ctx->s0, ctx->mask, ctx->dp_shift, x, KVX_COLLIDE_CHUNK);
        step += n;
        w->evals += n * KVX_COLLIDE_LANES;
        for (int l = 0; l < KVX_COLLIDE_LANES; l++) {
            int dp = (x[l] >> ctx->dp_shift) == 0;
            if (dp) kvx_collide_point(ctx, x[l], start[l], step - since[l]);
            if (dp || step - since[l] > KVX_COLLIDE_MAX_WALK) {
                x[l] = start[l] = kvx_collide_splitmix(&w->rng);
                since[l] = step;
            }
        }
        if (kvx_collide_now() >= ctx->deadline) {
            int expect = 0;
            atomic_compare_exchange_strong(&ctx->stop, &expect, 2);
        }
    }
    return NULL;
}

static KVX_COLLIDE_UNUSED unsigned kvx_collide_nthreads(void)
{
    long n = 0;
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#endif
    if (n <= 0) n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > KVX_COLLIDE_MAX_THREADS) n = KVX_COLLIDE_MAX_THREADS;
    return (unsigned)n;
}

static KVX_COLLIDE_UNUSED int kvx_collide_fail(kvx_test_collide_stats *st, double t0,
                                               const char *why)
{
    st->seconds = kvx_collide_now() - t0;
    snprintf(st->why, sizeof st->why, "%s", why);
    return -1;
}

/* kvx_test_find_collision with an optional report (st may be NULL). */
static KVX_COLLIDE_UNUSED int kvx_test_find_collision_ex(uint32_t B, uint64_t seed,
                                                         uint32_t *out_a, uint32_t *out_b,
                                                         double attempt_seconds,
                                                         double max_seconds,
                                                         kvx_test_collide_stats *st)
{
    kvx_test_collide_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    double t0 = kvx_collide_now();
    if (B < 2 || !out_a || !out_b) return kvx_collide_fail(st, t0, "bad arguments (B < 2 or NULL)");
    if (attempt_seconds <= 0 || attempt_seconds > max_seconds) attempt_seconds = max_seconds;
    uint32_t *prefix = (uint32_t *)calloc(B, sizeof *prefix);
    if (!prefix) return kvx_collide_fail(st, t0, "out of memory");

    kvx_collide_kernel_fn kernel = kvx_collide_kernel_scalar;
#if KVX_COLLIDE_HAVE_AVX2
    if (__builtin_cpu_supports("avx2")) {
        kernel = kvx_collide_kernel_avx2;
        st->avx2 = 1;
    }
#endif
    unsigned nt = kvx_collide_nthreads();
    st->threads = nt;
    st->lanes = KVX_COLLIDE_LANES;

    uint64_t aseed = seed;
    for (;;) {
        double t = kvx_collide_now();
        if (t - t0 >= max_seconds) {
            free(prefix);
            char why[192];
            snprintf(why, sizeof why,
                     "gave up after %.1f s (%u attempt(s) of <= %.1f s, %llu evaluations, %u "
                     "thread(s), %s kernel)",
                     t - t0, st->attempts, attempt_seconds, (unsigned long long)st->evaluations,
                     nt, st->avx2 ? "AVX2" : "scalar");
            return kvx_collide_fail(st, t0, why);
        }
        /* The attempt: prefix tokens, mask and walk starts from aseed. */
        st->attempts++;
        st->seed_used = aseed;
        uint64_t rs = aseed;
        for (uint32_t i = 0; i + 2 < B; i++) prefix[i] = (uint32_t)kvx_collide_splitmix(&rs);
        uint64_t s0 = KVX_COLLIDE_FNV_OFFSET;
        s0 = kvx_collide_fnv_u32(s0, 0);
        s0 = kvx_collide_fnv_u32(s0, 0);
        for (uint32_t i = 0; i + 2 < B; i++) s0 = kvx_collide_fnv_u32(s0, prefix[i]);
        uint64_t mask = kvx_collide_splitmix(&rs);

        /* Self-checks: the walk function is H, the kernel is the walk. */
        for (int k = 0; k < 4; k++) {
            uint64_t v = kvx_collide_splitmix(&rs);
            prefix[B - 2] = (uint32_t)v;
            prefix[B - 1] = (uint32_t)(v >> 32);
            uint64_t raw = kvx_collide_g(s0, 0, v);
            if ((raw ? raw : 1) != kvx_block_hash(0, prefix, B)) {
                free(prefix);
                return kvx_collide_fail(st, t0, "self-check: walk function != kvx_block_hash");
            }
        }
        uint64_t lanes[KVX_COLLIDE_LANES], ref[KVX_COLLIDE_LANES];
        for (int l = 0; l < KVX_COLLIDE_LANES; l++)
            ref[l] = kvx_collide_g(s0, mask, lanes[l] = kvx_collide_splitmix(&rs));
        if (kernel(s0, mask, 63, lanes, 1) != 1 || memcmp(lanes, ref, sizeof ref) != 0) {
            free(prefix);
            return kvx_collide_fail(st, t0, "self-check: kernel != walk function");
        }

        kvx_collide_ctx ctx;
        memset(&ctx, 0, sizeof ctx);
        ctx.s0 = s0;
        ctx.mask = mask;
        ctx.dp_shift = 64 - KVX_COLLIDE_DP_BITS;
        ctx.kernel = kernel;
        ctx.deadline = t + attempt_seconds;
        if (ctx.deadline > t0 + max_seconds) ctx.deadline = t0 + max_seconds;
        atomic_init(&ctx.stop, 0);
        pthread_mutex_init(&ctx.mu, NULL);
        if (kvx_collide_grow(&ctx) != 0) {
            pthread_mutex_destroy(&ctx.mu);
            free(prefix);
            return kvx_collide_fail(st, t0, "out of memory");
        }
        kvx_collide_worker_arg args[KVX_COLLIDE_MAX_THREADS];
        pthread_t tids[KVX_COLLIDE_MAX_THREADS];
        unsigned started = 0;
        for (unsigned i = 0; i < nt; i++) {
            args[i].ctx = &ctx;
            args[i].rng = kvx_collide_splitmix(&rs);
            args[i].evals = 0;
        }
        for (unsigned i = 1; i < nt; i++) {
            if (pthread_create(&tids[i], NULL, kvx_collide_worker, &args[i]) != 0) break;
            started = i;
        }
        kvx_collide_worker(&args[0]); /* the calling thread is worker 0 */
        for (unsigned i = 1; i <= started; i++) pthread_join(tids[i], NULL);
        for (unsigned i = 0; i <= started; i++) st->evaluations += args[i].evals;
        st->threads = started + 1;
        st->distinguished = ctx.n;
        st->robin_hoods += ctx.robin_hoods;
        int stop = atomic_load(&ctx.stop);
        free(ctx.tab);
        pthread_mutex_destroy(&ctx.mu);
        if (stop == 3) {
            free(prefix);
            return kvx_collide_fail(st, t0, "out of memory (distinguished-point table)");
        }
        if (ctx.found) {
            for (uint32_t i = 0; i + 2 < B; i++) out_a[i] = out_b[i] = prefix[i];
            out_a[B - 2] = (uint32_t)ctx.x;
            out_a[B - 1] = (uint32_t)(ctx.x >> 32);
            out_b[B - 2] = (uint32_t)ctx.y;
            out_b[B - 1] = (uint32_t)(ctx.y >> 32);
            free(prefix);
            if (ctx.x == ctx.y || kvx_block_hash(0, out_a, B) != kvx_block_hash(0, out_b, B))
                return kvx_collide_fail(st, t0, "found pair does not verify with kvx_block_hash");
            st->seconds = kvx_collide_now() - t0;
            return 0;
        }
        aseed = kvx_collide_splitmix(&aseed); /* out of time: reseed */
    }
}

/* Finds two different B-token lists a != b with
 * kvx_block_hash(0, a, B) == kvx_block_hash(0, b, B) (a chained collision
 * at block 0: every later block appended identically to both collides too).
 * B >= 2. Tokens a[0..B-3] == b[0..B-3] are pseudo-random from seed; the
 * last two tokens differ. Bounded: each attempt runs at most
 * attempt_seconds, then reseeds; gives up after max_seconds total.
 * Returns 0 on success, -1 on give-up. */
static KVX_COLLIDE_UNUSED int kvx_test_find_collision(uint32_t B, uint64_t seed, uint32_t *out_a,
                                                      uint32_t *out_b, double attempt_seconds,
                                                      double max_seconds)
{
    return kvx_test_find_collision_ex(B, seed, out_a, out_b, attempt_seconds, max_seconds, NULL);
}

#endif
