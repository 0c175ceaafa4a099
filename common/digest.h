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
/* A key's name in a keyed store's index, from its SHA-256 digest: the
 * first 8 bytes, LE (what kvx_key_hash answers). Every name the store gives
 * a key (put, get, exists, delete, and the shard reader's table) comes from
 * here. */
uint64_t kvx_key_name(const uint8_t digest[KVX_DIGEST_BYTES], const void *key, size_t len);
/* Test seam, like kvx_os (common/os.h): NULL except in a test, which may
 * set it to answer another name for a key (given the real one), so two keys
 * can share a 64-bit name: a collision no search for SHA-256 finds
 * (tests/engine/keyed.c test_keyed_name_collision). Internal, not in
 * kvx.h, not exported by the shared library. Set it before opening a
 * keyed store and reset it (NULL) after closing it. */
extern uint64_t (*kvx_key_name_hook)(const void *key, size_t len, uint64_t name);
/* 1 when the 32 bytes are all zero (an unverified or partial entry). */
int kvx_digest_is_zero(const uint8_t *d);

#endif
