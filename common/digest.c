/*
 * digest.c - the prefix digest of DESIGN.md (digest table, flags bit4): a
 * SHA-256 chain over the token ids of every block up to and including a
 * block, d_0 = SHA-256(le_u32 tokens of block 0), d_i = SHA-256(d_{i-1} ||
 * le_u32 tokens of block i). The FNV hash names a block; this proves it
 * belongs to a prompt, because FNV-1a 64 collides on purpose in seconds.
 *
 * OpenSSL's SHA-256 (SHA-NI where the CPU has it): the SHA256_* calls while
 * OpenSSL still ships them, else EVP with the implementation fetched once
 * per process (EVP_MD_fetch) and one context reused for a whole chain.
 * Hosts are little-endian (internal.h), so token arrays are hashed in
 * place.
 */
#include "digest.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

/* OpenSSL 3 deprecates the one-shot SHA256_* functions in favour of EVP,
 * but they cost ~35 % less per block here (no provider dispatch: 107 vs
 * 170 ns a 16-token block, bench/RESULTS.md): use them while the library
 * still ships them, else EVP. */
#if !defined(KVX_DIGEST_EVP_ONLY)
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/opensslconf.h>
#if !defined(OPENSSL_NO_DEPRECATED_3_0)
#define KVX_DIGEST_LOWLEVEL 1
#include <openssl/sha.h>
#endif
#endif
#include <openssl/evp.h>

#ifndef KVX_DIGEST_LOWLEVEL
static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void sha256_fetch(void) { sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL); }

static const EVP_MD *sha256(void)
{
    pthread_once(&sha256_once, sha256_fetch);
    return sha256_md ? sha256_md : EVP_sha256();
}
#endif

int kvx_digest_ctx_init(kvx_digest_ctx *c)
{
#ifdef KVX_DIGEST_LOWLEVEL
    c->md = NULL; /* the one-shot calls keep their state on the stack */
    return 0;
#else
    c->md = EVP_MD_CTX_new();
    return c->md ? 0 : kvx_fail(-ENOMEM, "digest: out of memory (EVP_MD_CTX_new)");
#endif
}

void kvx_digest_ctx_free(kvx_digest_ctx *c)
{
    if (c && c->md) EVP_MD_CTX_free(c->md);
    if (c) c->md = NULL;
}

/* One link of the chain. OpenSSL's SHA-256 cannot fail on valid arguments
 * (a context from EVP_MD_CTX_new and a fetched digest), so a failure is a
 * broken library: the digest is then all ones, which matches no stored
 * digest (never a wrong hit, at worst a miss). */
void kvx_digest_step(kvx_digest_ctx *c, uint8_t out[KVX_DIGEST_BYTES], const uint8_t *prev,
                     const uint32_t *tokens, uint32_t B)
{
#ifdef KVX_DIGEST_LOWLEVEL
    (void)c;
    SHA256_CTX sc;
    if (SHA256_Init(&sc) != 1 || (prev && SHA256_Update(&sc, prev, KVX_DIGEST_BYTES) != 1) ||
        SHA256_Update(&sc, tokens, (size_t)B * 4u) != 1 || SHA256_Final(out, &sc) != 1)
        memset(out, 0xFF, KVX_DIGEST_BYTES);
#else
    unsigned int len = 0;
    EVP_MD_CTX *m = c->md;
    if (EVP_DigestInit_ex2(m, sha256(), NULL) != 1 || (prev && EVP_DigestUpdate(m, prev, KVX_DIGEST_BYTES) != 1) ||
        EVP_DigestUpdate(m, tokens, (size_t)B * 4u) != 1 || EVP_DigestFinal_ex(m, out, &len) != 1 ||
        len != KVX_DIGEST_BYTES)
        memset(out, 0xFF, KVX_DIGEST_BYTES);
#endif
}

void kvx_sha256(uint8_t out[KVX_DIGEST_BYTES], const void *data, size_t len)
{
#ifdef KVX_DIGEST_LOWLEVEL
    if (!SHA256(data, len, out)) memset(out, 0xFF, KVX_DIGEST_BYTES);
#else
    unsigned int n = 0;
    if (EVP_Digest(data, len, out, &n, sha256(), NULL) != 1 || n != KVX_DIGEST_BYTES)
        memset(out, 0xFF, KVX_DIGEST_BYTES);
#endif
}

uint64_t (*kvx_key_name_hook)(const void *key, size_t len, uint64_t name);

uint64_t kvx_key_name(const uint8_t digest[KVX_DIGEST_BYTES], const void *key, size_t len)
{
    uint64_t name = kvx_load64(digest);
    return kvx_key_name_hook ? kvx_key_name_hook(key, len, name) : name;
}

KVX_API uint64_t kvx_key_hash(const void *key, size_t len)
{
    uint8_t d[KVX_DIGEST_BYTES];
    kvx_sha256(d, key, len);
    return kvx_key_name(d, key, len);
}

int kvx_digest_is_zero(const uint8_t *d)
{
    static const uint8_t zero[KVX_DIGEST_BYTES];
    return memcmp(d, zero, KVX_DIGEST_BYTES) == 0;
}

KVX_API void kvx_prefix_digest_next(uint8_t out[KVX_DIGEST_BYTES], const uint8_t *prev, const uint32_t *tokens,
                                    uint32_t block_tokens)
{
    kvx_digest_ctx c;
    if (kvx_digest_ctx_init(&c) != 0) {
        memset(out, 0xFF, KVX_DIGEST_BYTES);
        return;
    }
    kvx_digest_step(&c, out, prev, tokens, block_tokens);
    kvx_digest_ctx_free(&c);
}

KVX_API size_t kvx_prefix_digests(uint8_t (*out)[KVX_DIGEST_BYTES], const uint32_t *tokens, size_t n_tokens,
                                  uint32_t block_tokens)
{
    if (block_tokens == 0) return 0;
    size_t n = n_tokens / block_tokens;
    kvx_digest_ctx c;
    if (n && kvx_digest_ctx_init(&c) != 0) {
        for (size_t i = 0; i < n; i++) memset(out[i], 0xFF, KVX_DIGEST_BYTES);
        return n;
    }
    for (size_t i = 0; i < n; i++)
        kvx_digest_step(&c, out[i], i ? out[i - 1] : NULL, tokens + i * block_tokens, block_tokens);
    if (n) kvx_digest_ctx_free(&c);
    return n;
}
