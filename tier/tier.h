/*
 * tier/tier.h - the shared tier's client: Redis (Cluster or a single
 * server) reached with hiredis, and the tier's key and value bytes
 * (DESIGN.md, "Shared tier (binding parts)"; docs/TIER.md). Not API: the
 * store (engine/store_tier*.c) is the only user.
 *
 *   value.c    namespace, key and value bytes; the value check (pure
 *              functions: fuzzed by fuzz/tier_value_fuzzer.c)
 *   url.c      redis:// URLs and the DIR/TIER text
 *   cluster.c  connections, the slot map (CLUSTER SLOTS), CRC16 key slots,
 *              MOVED / ASK, pipelined batches per node, timeouts and the
 *              process-wide circuit breaker
 *
 * The tier may lose anything at any moment: every function here turns a
 * network failure into a per-key miss with a status, never a crash or a
 * wait longer than its deadline.
 */
#ifndef KVX_TIER_H
#define KVX_TIER_H

#include "common/internal.h"

#include <errno.h>

#include <stddef.h>
#include <stdint.h>

/* ---- value.c ---------------------------------------------------------- */

#define KVX_TIER_MAGIC "KVXT"
#define KVX_TIER_VALUE_VERSION 1
/* "kvx:1:" + 16 + ":" + 16 + ":" + 64, and a NUL */
#define KVX_TIER_KEY_BYTES (6 + 16 + 1 + 16 + 1 + 64 + 1)

/* ns = le_u64 of the first 8 bytes of SHA-256("kvx-tier-1" || le_u64
 * model_signature || le_u32 L, Hkv, D, B, quant || tenant bytes). */
uint64_t kvx_tier_ns(const kvx_geometry *g, const char *tenant);
/* "kvx:1:<ns %016x>:<fnv %016x>:<digest 64 hex>" into out. */
void kvx_tier_key(char out[KVX_TIER_KEY_BYTES], uint64_t ns, uint64_t hash, const uint8_t *digest);
/* The envelope version a store of g's quant writes (lossless): FP16 and
 * E5M2 v1, E4M3 v2, BF16 v3. */
uint16_t kvx_tier_env_version(const kvx_geometry *g);
/* Bytes of a value for g (0 on overflow). */
size_t kvx_tier_value_bytes(const kvx_geometry *g);
/* Builds block (hash, tokens[B], page in g's quant, scales or NULL) as a
 * value in a malloc'd buffer: magic, u16 version 1, u16 0, u64 ns, u64
 * model_signature, u32 B, B x u32 tokens, the one-block envelope, u32
 * CRC-32C of every byte before it. */
int kvx_tier_value_encode(uint8_t **out, size_t *out_len, uint64_t ns, const kvx_geometry *g, uint64_t hash,
                          const uint32_t *tokens, const void *page, const float *scales);
/* What a value must be to be used for one block of a prompt. */
typedef struct kvx_tier_expect {
    uint64_t ns;
    const kvx_geometry *g;
    uint64_t hash, parent;
    const uint32_t *tokens; /* the prompt's B ids of this block */
} kvx_tier_expect;
/* Checks a value (CRC-32C, magic, version, ns, model, B, the tokens, the
 * envelope's every reader rule against g, its hash equal to H(parent,
 * tokens) and to the expected hash, a full block) and decodes its page into
 * out_page (kvx_page_bytes(g, B) bytes) and out_scales (L*2*Hkv, for FP8
 * stores; nullable). 0, or KVX_ECORRUPT / KVX_EFORMAT / KVX_EMODEL /
 * KVX_ESHAPE / KVX_ETOKENS / KVX_EHASH / KVX_EVERSION naming what failed.
 * Never reads outside v[0..len). expect->tokens NULL: any tokens (the
 * fuzzer); out_page NULL: check only. */
int kvx_tier_value_check(const uint8_t *v, size_t len, const kvx_tier_expect *expect, void *out_page,
                         float *out_scales);

/* ---- url.c -------------------------------------------------------------- */

#define KVX_TIER_MAX_SEEDS 16
typedef struct kvx_tier_url {
    int n;
    char host[KVX_TIER_MAX_SEEDS][256];
    int port[KVX_TIER_MAX_SEEDS];
    char user[128], pass[256]; /* empty when not given */
} kvx_tier_url;
/* redis://[user[:pass]@]host[:port][,host[:port]...] (port 6379 by
 * default). KVX_EINVALID naming the problem. */
int kvx_tier_url_parse(kvx_tier_url *out, const char *url);
/* url with the password replaced by "***" (for messages and show). */
void kvx_tier_url_redact(char *out, size_t cap, const char *url);

/* The DIR/TIER file: "kvx-tier 1\nurl <url>\ntenant <name>\nttl_ms <n>\n". */
#define KVX_TIER_URL_MAX 1024
#define KVX_TIER_TENANT_MAX 128
typedef struct kvx_tier_conf {
    char url[KVX_TIER_URL_MAX];
    char tenant[KVX_TIER_TENANT_MAX];
    uint64_t ttl_ms; /* 0: no TTL */
} kvx_tier_conf;
/* Text of c into buf (NUL-terminated); returns its length, 0 when it does
 * not fit. */
size_t kvx_tier_conf_format(char *buf, size_t cap, const kvx_tier_conf *c);
/* KVX_EFORMAT naming the line on a malformed file. */
int kvx_tier_conf_parse(kvx_tier_conf *out, const char *text);
/* KVX_EINVALID unless name is 1..127 bytes of [A-Za-z0-9._-]. */
int kvx_tier_tenant_check(const char *name);

/* ---- breaker.c ---------------------------------------------------------- */

/* CLOCK_MONOTONIC in ms. */
uint64_t kvx_tier_now_ms(void);
/* May node (host, port) be asked now? 0 while its breaker is open; past
 * the window, the first caller is let through to probe it. */
int kvx_tier_brk_allow(const char *host, int port);
/* The verdict on a node: ok 1 on its first reply over a new connection,
 * ok 0 on a failure (why: for the one stderr line of the process). */
void kvx_tier_brk_result(const char *host, int port, int ok, const char *why);
/* 1 when the node's breaker is closed (or it has none). */
int kvx_tier_brk_closed(const char *host, int port);
/* 1 for the first caller of the process (the one stderr line), then 0. */
int kvx_tier_say_once(void);

/* ---- resolve.c ---------------------------------------------------------- */

/* host (a name or a numeric address) as a numeric address in out, within
 * timeout_ms; -1 with why set when it is not resolved in time, has no
 * address, or too many earlier lookups are still running. */
int kvx_tier_resolve(const char *host, uint32_t timeout_ms, char *out, size_t cap, char *why, size_t why_cap);

/* ---- cluster.c ---------------------------------------------------------- */

typedef struct kvx_tier kvx_tier;

typedef struct kvx_tier_limits {
    uint32_t connect_ms; /* 250 */
    uint32_t command_ms; /* 1000 */
    uint32_t total_ms;   /* 5000: one call's whole budget */
    uint64_t max_reply_bytes; /* 0: 64 MiB. One reply's bytes at most: a
                                 server streaming a huge bulk or array is
                                 dropped there, not buffered for the
                                 whole call */
} kvx_tier_limits;

/* ---- reply.c ------------------------------------------------------------ */

/* What one reply's objects may take in memory (its cap: the limits'
 * max_reply_bytes): reset before each reply is read; over is set when an
 * object was refused. */
typedef struct kvx_tier_reply_budget {
    uint64_t cap, used;
    int over;
} kvx_tier_reply_budget;

struct redisContext;
/* c's replies are built by reply.c's builders, charged against b. */
void kvx_tier_reply_budget_attach(struct redisContext *c, kvx_tier_reply_budget *b);

/* Redis Cluster key slot (CRC16-XMODEM mod 16384, hash tags honoured). */
uint16_t kvx_tier_slot(const char *key, size_t len);

/* A client; connects lazily (nothing is reached here). limits nullable. */
int kvx_tier_open(kvx_tier **out, const char *url, const kvx_tier_limits *limits);
void kvx_tier_close(kvx_tier *t);

/* Per-key results of a batch. */
#define KVX_TIER_OK 0      /* a value (GET) / written (SET) */
#define KVX_TIER_NONE 1    /* no value (GET) / not written: the key exists (SET NX) */
#define KVX_TIER_DOWN 2    /* not asked: its node is down (breaker open, connect failed) */
#define KVX_TIER_FAILED 3  /* asked, no usable answer (timeout, error reply, lost connection) */

typedef struct kvx_tier_io {
    uint64_t redirects; /* MOVED and ASK answers followed */
    uint64_t refreshes; /* slot map refreshes */
    uint64_t bytes_up, bytes_down;
} kvx_tier_io;

/* GET of n keys, pipelined per node (one round trip per node; redirects
 * and a failover add rounds within the deadline). vals[i] malloc'd (the
 * caller frees) with lens[i] on KVX_TIER_OK; st[i] per key. io nullable.
 * Returns 0 when the tier answered at all, else KVX_EUNAVAILABLE. */
int kvx_tier_get(kvx_tier *t, const char *const *keys, size_t n, uint8_t **vals, size_t *lens, uint8_t *st,
                 kvx_tier_io *io);
/* kvx_tier_get telling fn of each key's final answer as it is read (so
 * the caller checks one value while the next ones arrive): fn(ctx, i, st,
 * val, len) once per key, in arrival order; fn owns val (free()). Called
 * with the client's lock held: fn must not call the client. */
typedef void (*kvx_tier_value_fn)(void *ctx, size_t i, uint8_t st, uint8_t *val, size_t len);
int kvx_tier_get_each(kvx_tier *t, const char *const *keys, size_t n, kvx_tier_value_fn fn, void *ctx,
                      kvx_tier_io *io);
/* SET key val NX [PX ttl_ms] for n keys, pipelined per node. */
int kvx_tier_set_nx(kvx_tier *t, const char *const *keys, const uint8_t *const *vals, const size_t *lens, size_t n,
                    uint64_t ttl_ms, uint8_t *st, kvx_tier_io *io);
/* Compare-and-set (a Lua script): replaces key's value with val only when
 * its SHA-1 is still old_sha1hex (the bad value seen) or it is gone.
 * 0 replaced, KVX_ENOTFOUND the value changed meanwhile, else an error. */
int kvx_tier_cas(kvx_tier *t, const char *key, const char *old_sha1hex, const uint8_t *val, size_t len,
                 uint64_t ttl_ms, kvx_tier_io *io);
/* Sets the whole-call budget of the calls that start from now on (the
 * write-behind: what is left of its batch's budget, or of a closing
 * store's wait). */
void kvx_tier_set_total_ms(kvx_tier *t, uint32_t total_ms);
/* PING the first reachable node: 0, or KVX_EUNAVAILABLE with the reason. */
int kvx_tier_ping(kvx_tier *t);
/* Is the tier up as far as this process knows (the breaker is closed for
 * at least one of its nodes)? */
int kvx_tier_up(kvx_tier *t);
/* Is this a cluster (1), a single server (0), or not known yet (-1)? */
int kvx_tier_is_cluster(kvx_tier *t);
/* SHA-1 of data as 40 hex digits and a NUL. */
void kvx_tier_sha1hex(char out[41], const void *data, size_t len);

#endif
