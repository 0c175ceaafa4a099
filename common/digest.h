/*
 * digest.h - the SHA-256 prefix digest chain (digest.c), private helpers
 * for the writer, reader and store (not API; the public entry points are
 * kvx_prefix_digests and kvx_prefix_digest_next in kvx.h).
 */
#ifndef KVX_DIGEST_H
#define KVX_DIGEST_H

#include "internal.h"

typedef struct kvx_digest_ctx {
    struct evp_md_ctx_st *md; /* EVP_MD_CTX, reused for every link */
} kvx_digest_ctx;

/* 0, or -ENOMEM with a message. */
int kvx_digest_ctx_init(kvx_digest_ctx *c);
void kvx_digest_ctx_free(kvx_digest_ctx *c);
/* out = SHA-256(prev || le_u32 tokens[0..B)); prev NULL for block 0. */
void kvx_digest_step(kvx_digest_ctx *c, uint8_t out[KVX_DIGEST_BYTES], const uint8_t *prev, const uint32_t *tokens,
                     uint32_t B);
/* out = SHA-256(data) (all ones if OpenSSL failed: matches nothing). */
void kvx_sha256(uint8_t out[KVX_DIGEST_BYTES], const void *data, size_t len);
/* 1 when the 32 bytes are all zero (an unverified or partial entry). */
int kvx_digest_is_zero(const uint8_t *d);

#endif
