/*
 * fake_redis.h - hostile or broken RESP servers for the shared tier's
 * tests (tests/tier/, tests/engine/tier.c, tests/cli/tier.c): fake Redis
 * servers run as threads on loopback ports, answering crafted RESP2 bytes
 * (no redis-server needed). fk_start(mode) starts one (enum below: echo,
 * silent, raw bytes, drips, extra or late replies, redirects, a tiny
 * key-value store, floods...), fk_stop joins it; tier_to and tier_store
 * make a client and a store whose tier is a fake; get_n asks for n keys
 * and checks every answered one is its own key's. Real redis-server
 * processes are tests/lib/redis.h.
 */
#ifndef KVX_TEST_FAKE_REDIS_H
#define KVX_TEST_FAKE_REDIS_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "store.h"
#include "tier/tier.h"

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* ---------------------------------------------------------------- fakes */

enum {
    M_ECHO,       /* GET k: "V:k"; SET: +OK */
    M_SILENT,     /* accepts, reads, never answers */
    M_RAW,        /* GET: raw bytes */
    M_DRIP_GET,   /* GET: "$1000\r\n" then a byte every drip_ms */
    M_DRIP_SLOTS, /* CLUSTER: the same drip */
    M_DRIP_AUTH,  /* AUTH: the same drip */
    M_DRIP_SET,   /* GET: nil; SET: the same drip */
    M_EXTRA,      /* GET k: "V:k" and an extra "STALE" in the same send */
    M_EXTRA_LATE, /* GET k: "V:k"; 100 ms later "STALE" */
    M_FEWER,      /* GET: only the first `limit` of a connection answered */
    M_CLOSE,      /* GET: the first of a connection answered, then closed */
    M_REDIRECT,   /* GET: -<redirect> */
    M_CAS_SLOW,   /* GET: garbage; SET: nil (taken); EVAL: 800 ms, :1 */
    M_IDLE_CLOSE, /* M_ECHO, and a connection idle 100 ms is closed (Redis's `timeout`, a proxy) */
    M_SLOW_READ,  /* M_ECHO, reading 16 KiB every 300 ms */
    M_KV,         /* a tiny Redis: SET [NX] [PX], GET */
    M_KV_EXTRA,   /* M_KV, each GET's value followed by another key's value */
    M_FLOOD,      /* GET: a bulk of 2^40 bytes (limit 0) or an array of 10^9 integers (limit 1), streamed as fast
                     as the client reads, raw_len bytes at most */
    M_SHUT,       /* every connection closed as it is accepted, the time of each noted (accept_ms) */
    M_HEAP,       /* GET: an array declaring 2^31-1 elements, then empty statuses ("+\r\n") up to raw_len bytes
                     (limit 0), or seven such headers nested and then silence (limit 1) */
};

typedef struct fk {
    int lfd, port, mode;
    pthread_t th;
    atomic_int stop;
    const char *slots; /* CLUSTER SLOTS reply (raw), NULL: cluster support disabled */
    size_t slots_len;
    const char *raw; /* M_RAW / M_REDIRECT bytes */
    size_t raw_len;
    int limit;
    int drip_ms;
    atomic_int conns, cmds, gets, sets, evals, stale_sent;
    atomic_ullong flood_sent;
    char auth[256];
    pthread_mutex_t mu;
    pthread_t cth[256];
    int ncth;
    struct {
        char key[128];
        char *v;
        size_t len;
    } kv[256];
    int nkv;
    uint64_t accept_ms[64]; /* M_SHUT */
    atomic_int naccept;
} fk;

typedef struct fk_conn {
    fk *s;
    int fd;
} fk_conn;

static inline int fk_send(int fd, const void *p, size_t n)
{
    const char *b = p;
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        b += w, n -= (size_t)w;
    }
    return 0;
}

static inline int fk_sendf(int fd, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return fk_send(fd, buf, (size_t)n);
}

/* A bulk reply of 1000 bytes, one byte every drip_ms, until the client
 * leaves or the fake stops: -1 then. */
static inline int fk_drip(fk *s, int fd)
{
    if (fk_sendf(fd, "$1000\r\n")) return -1;
    for (int i = 0; i < 1002; i++) {
        for (int t = 0; t < s->drip_ms; t += 10) {
            if (atomic_load(&s->stop)) return -1;
            sleep_ms(10);
        }
        if (fk_send(fd, i < 1000 ? "x" : i == 1000 ? "\r" : "\n", 1)) return -1;
    }
    return 0;
}

static inline int is(const char *a, const char *b) { return !strcasecmp(a, b); }

static inline int fk_bulk(int fd, const char *v, size_t len)
{
    return fk_sendf(fd, "$%zu\r\n", len) || fk_send(fd, v, len) || fk_send(fd, "\r\n", 2) ? -1 : 0;
}

/* M_KV / M_KV_EXTRA: GET and SET on the fake's own table. */
static inline int fk_kv(fk *s, int fd, int argc, char **argv, const size_t *lens)
{
    int rc;
    pthread_mutex_lock(&s->mu);
    int at = -1;
    for (int i = 0; argc >= 2 && i < s->nkv; i++)
        if (!strcmp(s->kv[i].key, argv[1])) at = i;
    if (is(argv[0], "GET") && argc == 2) {
        atomic_fetch_add(&s->gets, 1);
        if (at < 0) {
            rc = fk_sendf(fd, "$-1\r\n");
        } else {
            rc = fk_bulk(fd, s->kv[at].v, s->kv[at].len);
            if (!rc && s->mode == M_KV_EXTRA && s->nkv > 1) {
                int o = (at + 5) % s->nkv; /* another block's valid value, unasked */
                rc = fk_bulk(fd, s->kv[o].v, s->kv[o].len);
            }
        }
    } else if (is(argv[0], "SET") && argc >= 3) {
        atomic_fetch_add(&s->sets, 1);
        int nx = argc >= 4 && is(argv[3], "NX");
        if (at >= 0 && nx) {
            rc = fk_sendf(fd, "$-1\r\n");
        } else if (at < 0 && (s->nkv == 256 || strlen(argv[1]) >= sizeof s->kv[0].key)) {
            rc = fk_sendf(fd, "-OOM full\r\n");
        } else {
            if (at < 0) {
                at = s->nkv++;
                snprintf(s->kv[at].key, sizeof s->kv[at].key, "%s", argv[1]);
            } else {
                free(s->kv[at].v);
            }
            s->kv[at].v = malloc(lens[2] ? lens[2] : 1);
            memcpy(s->kv[at].v, argv[2], lens[2]);
            s->kv[at].len = lens[2];
            rc = fk_sendf(fd, "+OK\r\n");
        }
    } else {
        rc = fk_sendf(fd, "-ERR unknown command\r\n");
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* One command: 0 go on, -1 close the connection. */
static inline int fk_kv(fk *s, int fd, int argc, char **argv, const size_t *lens);

static inline int fk_handle(fk *s, int fd, int argc, char **argv, const size_t *lens, int *nget)
{
    atomic_fetch_add(&s->cmds, 1);
    if (s->mode == M_SILENT) return 0;
    if (is(argv[0], "AUTH")) {
        pthread_mutex_lock(&s->mu);
        snprintf(s->auth, sizeof s->auth, "%s%s%s", argv[1], argc > 2 ? " " : "", argc > 2 ? argv[2] : "");
        pthread_mutex_unlock(&s->mu);
        if (s->mode == M_DRIP_AUTH) return fk_drip(s, fd);
        return fk_sendf(fd, "+OK\r\n");
    }
    if (is(argv[0], "PING")) return fk_sendf(fd, "+PONG\r\n");
    if (is(argv[0], "ASKING")) return fk_sendf(fd, "+OK\r\n");
    if (is(argv[0], "CLUSTER")) {
        if (s->mode == M_DRIP_SLOTS) return fk_drip(s, fd);
        pthread_mutex_lock(&s->mu); /* the test may change it meanwhile */
        int rc = s->slots ? fk_send(fd, s->slots, s->slots_len)
                          : fk_sendf(fd, "-ERR This instance has cluster support disabled\r\n");
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    if (is(argv[0], "EVAL")) {
        atomic_fetch_add(&s->evals, 1);
        for (int t = 0; t < 800 && !atomic_load(&s->stop); t += 10) sleep_ms(10);
        return fk_sendf(fd, ":1\r\n");
    }
    if (s->mode == M_KV || s->mode == M_KV_EXTRA) return fk_kv(s, fd, argc, argv, lens);
    if (is(argv[0], "SET")) {
        atomic_fetch_add(&s->sets, 1);
        if (s->mode == M_DRIP_SET) return fk_drip(s, fd);
        if (s->mode == M_CAS_SLOW) return fk_sendf(fd, "$-1\r\n");
        return fk_sendf(fd, "+OK\r\n");
    }
    if (!is(argv[0], "GET") || argc != 2) return fk_sendf(fd, "-ERR unknown command\r\n");
    atomic_fetch_add(&s->gets, 1);
    (*nget)++;
    const char *k = argv[1];
    switch (s->mode) {
    case M_RAW: return fk_send(fd, s->raw, s->raw_len);
    case M_REDIRECT: return fk_sendf(fd, "-%.*s\r\n", (int)s->raw_len, s->raw);
    case M_DRIP_GET: return fk_drip(s, fd);
    case M_FLOOD: {
        static char chunk[65536];
        if (!chunk[0])
            for (size_t i = 0; i < sizeof chunk; i += 4) memcpy(chunk + i, s->limit ? ":1\r\n" : "xxxx", 4);
        if (fk_sendf(fd, s->limit ? "*1000000000\r\n" : "$1099511627776\r\n")) return -1;
        while (atomic_load(&s->flood_sent) < s->raw_len && !atomic_load(&s->stop)) {
            if (fk_send(fd, chunk, sizeof chunk)) return -1;
            atomic_fetch_add(&s->flood_sent, sizeof chunk);
        }
        return -1;
    }
    case M_HEAP: {
        static char plus[65535]; /* 21845 empty statuses */
        if (!plus[0])
            for (size_t i = 0; i < sizeof plus; i += 3) memcpy(plus + i, "+\r\n", 3);
        for (int d = 0; d < (s->limit ? 7 : 1); d++)
            if (fk_sendf(fd, "*2147483647\r\n")) return -1;
        while (!s->limit && atomic_load(&s->flood_sent) < s->raw_len && !atomic_load(&s->stop)) {
            if (fk_send(fd, plus, sizeof plus)) return -1;
            atomic_fetch_add(&s->flood_sent, sizeof plus);
        }
        while (s->limit && !atomic_load(&s->stop)) sleep_ms(20);
        return -1;
    }
    case M_DRIP_SET: return fk_sendf(fd, "$-1\r\n");
    case M_CAS_SLOW: return fk_sendf(fd, "$8\r\ngarbage!\r\n");
    case M_EXTRA: return fk_sendf(fd, "$%zu\r\nV:%s\r\n$5\r\nSTALE\r\n", strlen(k) + 2, k);
    case M_EXTRA_LATE:
        if (fk_sendf(fd, "$%zu\r\nV:%s\r\n", strlen(k) + 2, k)) return -1;
        sleep_ms(100);
        if (fk_sendf(fd, "$5\r\nSTALE\r\n")) return -1;
        atomic_store(&s->stale_sent, 1);
        return 0;
    case M_FEWER:
        if (*nget > s->limit) return 0;
        break;
    case M_CLOSE:
        if (*nget > 1) return -1;
        break;
    default: break;
    }
    return fk_sendf(fd, "$%zu\r\nV:%s\r\n", strlen(k) + 2, k);
}

/* Parses one RESP multibulk command at buf[0..n): bytes used, 0 when
 * incomplete, -1 malformed. */
static inline long fk_parse(const char *buf, size_t n, int *argc, char **argv, size_t *lens, int maxargs)
{
    size_t p = 0;
    if (n < 1) return 0;
    if (buf[0] != '*') return -1;
    const char *e = memchr(buf, '\n', n);
    if (!e) return 0;
    long cnt = strtol(buf + 1, NULL, 10);
    if (cnt < 1 || cnt > maxargs) return -1;
    p = (size_t)(e - buf) + 1;
    for (long i = 0; i < cnt; i++) {
        if (p >= n) return 0;
        if (buf[p] != '$') return -1;
        e = memchr(buf + p, '\n', n - p);
        if (!e) return 0;
        long len = strtol(buf + p + 1, NULL, 10);
        if (len < 0) return -1;
        p = (size_t)(e - buf) + 1;
        if (p + (size_t)len + 2 > n) return 0;
        argv[i] = malloc((size_t)len + 1);
        lens[i] = (size_t)len;
        memcpy(argv[i], buf + p, (size_t)len);
        argv[i][len] = '\0';
        p += (size_t)len + 2;
        *argc = (int)i + 1;
    }
    return (long)p;
}

static inline void *fk_conn_main(void *arg)
{
    fk_conn *c = arg;
    fk *s = c->s;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    int nget = 0, open = 1, idle = 0;
    while (open && !atomic_load(&s->stop)) {
        struct pollfd pf = {c->fd, POLLIN, 0};
        if (poll(&pf, 1, 20) <= 0) {
            if (s->mode == M_IDLE_CLOSE && atomic_load(&s->cmds) && (idle += 20) >= 100) break;
            continue;
        }
        idle = 0;
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
        size_t want = s->mode == M_SLOW_READ && cap - n > 16384 ? 16384 : cap - n;
        ssize_t r = recv(c->fd, buf + n, want, 0);
        if (r <= 0) break;
        for (int t = 0; s->mode == M_SLOW_READ && t < 300 && !atomic_load(&s->stop); t += 10) sleep_ms(10);
        n += (size_t)r;
        for (;;) {
            int argc = 0;
            char *argv[8] = {0};
            size_t lens[8] = {0};
            long used = fk_parse(buf, n, &argc, argv, lens, 8);
            if (used > 0 && fk_handle(s, c->fd, argc, argv, lens, &nget)) open = 0;
            for (int i = 0; i < 8; i++) free(argv[i]);
            if (used < 0) open = 0;
            if (used <= 0 || !open) break;
            memmove(buf, buf + used, n - (size_t)used);
            n -= (size_t)used;
        }
    }
    free(buf);
    close(c->fd);
    free(c);
    return NULL;
}

static inline void *fk_main(void *arg)
{
    fk *s = arg;
    while (!atomic_load(&s->stop)) {
        struct pollfd pf = {s->lfd, POLLIN, 0};
        if (poll(&pf, 1, 20) <= 0) continue;
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0) continue;
        atomic_fetch_add(&s->conns, 1);
        if (s->mode == M_SHUT) {
            int k = atomic_load(&s->naccept);
            if (k < 64) {
                s->accept_ms[k] = (uint64_t)(now_s() * 1000.0);
                atomic_store(&s->naccept, k + 1);
            }
            close(fd);
            continue;
        }
        fk_conn *c = malloc(sizeof *c);
        c->s = s, c->fd = fd;
        pthread_mutex_lock(&s->mu);
        if (s->ncth < 256 && pthread_create(&s->cth[s->ncth], NULL, fk_conn_main, c) == 0) {
            s->ncth++;
        } else {
            close(fd);
            free(c);
        }
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

static inline int listen_port(int *port, int accept_it)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, accept_it ? 64 : 128), 0);
    socklen_t l = sizeof a;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static inline fk *fk_start(int mode)
{
    fk *s = calloc(1, sizeof *s);
    s->mode = mode;
    s->drip_ms = 300;
    s->lfd = listen_port(&s->port, 1);
    pthread_mutex_init(&s->mu, NULL);
    assert_int_equal(pthread_create(&s->th, NULL, fk_main, s), 0);
    return s;
}

static inline void fk_stop(fk *s)
{
    if (!s) return;
    atomic_store(&s->stop, 1);
    pthread_join(s->th, NULL);
    for (int i = 0; i < s->ncth; i++) pthread_join(s->cth[i], NULL);
    close(s->lfd);
    pthread_mutex_destroy(&s->mu);
    free((char *)s->slots);
    for (int i = 0; i < s->nkv; i++) free(s->kv[i].v);
    free(s);
}

/* The fake's CLUSTER SLOTS reply from now on: a copy of r (NULL: cluster
 * support disabled). */
static inline void fk_slots(fk *s, const char *r, size_t len)
{
    pthread_mutex_lock(&s->mu);
    free((char *)s->slots);
    s->slots = NULL;
    if (r) {
        char *c = malloc(len);
        memcpy(c, r, len);
        s->slots = c;
        s->slots_len = len;
    }
    pthread_mutex_unlock(&s->mu);
}

/* A port nothing listens on (bound, then closed). */
static inline int closed_port(void)
{
    int p, fd = listen_port(&p, 1);
    close(fd);
    return p;
}

/* ---------------------------------------------------------------- helpers */

static inline kvx_tier *tier_to(int port, const char *cred)
{
    char url[256];
    snprintf(url, sizeof url, "redis://%s%s127.0.0.1:%d", cred ? cred : "", cred ? "@" : "", port);
    kvx_tier *t = NULL;
    assert_int_equal(kvx_tier_open(&t, url, NULL), 0);
    return t;
}

/* A writer store su_root/<name> (su_geometry, 64 MiB) whose tier is the
 * fake on port. */
static inline kvx_store *tier_store(const char *name, int port)
{
    char dir[512], url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    return su_create(su_path(dir, sizeof dir, name), (su_spec){.capacity = 64ull << 20, .tier_url = url});
}

/* GETs keys k0..k{n-1} ("kNNN<tag>"); every OK answer must be "V:" and
 * its own key (the fakes' echo). Returns how many were OK; st filled. */
static inline size_t get_n(kvx_tier *t, size_t n, const char *tag, uint8_t *st, double *secs)
{
    char(*keys)[64] = calloc(n, 64);
    const char **kp = calloc(n, sizeof *kp);
    uint8_t **vals = calloc(n, sizeof *vals);
    size_t *lens = calloc(n, sizeof *lens), ok = 0;
    for (size_t i = 0; i < n; i++) {
        snprintf(keys[i], 64, "k%zu%s", i, tag);
        kp[i] = keys[i];
    }
    double t0 = now_s();
    kvx_tier_get(t, kp, n, vals, lens, st, NULL);
    if (secs) *secs = now_s() - t0;
    for (size_t i = 0; i < n; i++) {
        if (st[i] == KVX_TIER_OK) {
            char want[80];
            snprintf(want, sizeof want, "V:%s", keys[i]);
            if (lens[i] != strlen(want) || memcmp(vals[i], want, lens[i]))
                fail_msg("key %s answered \"%.*s\"", keys[i], (int)(lens[i] > 40 ? 40 : lens[i]),
                         vals[i] ? (char *)vals[i] : "");
            ok++;
        } else {
            assert_null(vals[i]);
        }
        free(vals[i]);
    }
    free(keys), free(kp), free(vals), free(lens);
    return ok;
}

/* A CLUSTER SLOTS reply: n entries (a, b, host, port) formatted raw. */
static inline char *slots_reply(size_t *len, int n, const long long *a, const long long *b, const char *const *host,
                         const long long *port)
{
    size_t cap = 64 + (size_t)n * 400, o = 0;
    char *r = malloc(cap);
    o += (size_t)snprintf(r + o, cap - o, "*%d\r\n", n);
    for (int i = 0; i < n; i++) {
        size_t hl = strlen(host[i]);
        o += (size_t)snprintf(r + o, cap - o, "*3\r\n:%lld\r\n:%lld\r\n*2\r\n$%zu\r\n%s\r\n:%lld\r\n", a[i], b[i], hl,
                              host[i], port[i]);
    }
    *len = o;
    return r;
}

#endif
