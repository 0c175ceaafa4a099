/*
 * bench_digest.c - the prefix digest (SHA-256 chain, DESIGN.md digest
 * table) per 16-token block, as kvx computes it, against two references
 * measured in the same run: OpenSSL's EVP interface done the fast way (the
 * md fetched once, one context reused, EVP_DigestInit_ex2 per link) and
 * the FNV chained hash of the same blocks (what a lookup paid before the
 * digest). The three loops alternate, best of K rounds.
 *
 *   bench_digest [--prompts N] [--reps K]
 */
#include "bench_common.h"
#include "kvx.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define B 16u
#define NB 64u

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    size_t prompts = 4000;
    int reps = 7;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--prompts") && i + 1 < argc) prompts = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--prompts N] [--reps K]\n", argv[0]);
            return 2;
        }
    }
    uint32_t *t = malloc(prompts * NB * B * sizeof *t);
    uint8_t(*d)[KVX_DIGEST_BYTES] = malloc(NB * KVX_DIGEST_BYTES);
    uint64_t *h = malloc(NB * sizeof *h);
    if (!t || !d || !h) return 1;
    for (size_t i = 0; i < prompts * NB * B; i++) t[i] = (uint32_t)(i * 2654435761u);
    EVP_MD *md = EVP_MD_fetch(NULL, "SHA256", NULL);
    EVP_MD_CTX *m = EVP_MD_CTX_new();
    if (!md || !m) return 1;
    double best[3] = {1e9, 1e9, 1e9};
    uint64_t sink = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (size_t p = 0; p < prompts; p++) sink += kvx_prefix_digests(d, t + p * NB * B, NB * B, B), sink += d[NB - 1][0];
        double t1 = now();
        for (size_t p = 0; p < prompts; p++) {
            const uint32_t *q = t + p * NB * B;
            unsigned len;
            for (unsigned i = 0; i < NB; i++) {
                EVP_DigestInit_ex2(m, md, NULL);
                if (i) EVP_DigestUpdate(m, d[i - 1], KVX_DIGEST_BYTES);
                EVP_DigestUpdate(m, q + i * B, B * 4);
                EVP_DigestFinal_ex(m, d[i], &len);
            }
            sink += d[NB - 1][0];
        }
        double t2 = now();
        for (size_t p = 0; p < prompts; p++) sink += kvx_block_hashes(h, t + p * NB * B, NB * B, B) + h[NB - 1];
        double t3 = now();
        double per = 1e9 / (double)(prompts * NB);
        if ((t1 - t0) * per < best[0]) best[0] = (t1 - t0) * per;
        if ((t2 - t1) * per < best[1]) best[1] = (t2 - t1) * per;
        if ((t3 - t2) * per < best[2]) best[2] = (t3 - t2) * per;
    }
    kvx_bench_keep(&sink);
    printf("bench_digest: %zu prompts x %u blocks of %u tokens, best of %d\n", prompts, NB, B, reps);
    printf("  kvx_prefix_digests        %7.1f ns/block\n", best[0]);
    printf("  EVP (fetched md, reused)  %7.1f ns/block   kvx / EVP  %.2fx\n", best[1], best[0] / best[1]);
    printf("  FNV chained hash          %7.1f ns/block   kvx / FNV  %.2fx\n", best[2], best[0] / best[2]);
    EVP_MD_CTX_free(m);
    EVP_MD_free(md);
    free(t);
    free(d);
    free(h);
    return 0;
}
