/*
 * cluster.c - the tier's network client: Redis Cluster routing done here,
 * over hiredis (which speaks RESP; Debian ships no C cluster client).
 *
 * Shape: a kvx_tier holds the seed list, one blocking hiredis connection
 * per node it has talked to, and the slot map (16384 slots -> node) from
 * CLUSTER SLOTS; a server that answers CLUSTER SLOTS with an error is a
 * single Redis (every slot on it) until a MOVED says otherwise. A batch
 * groups its commands by the node owning each key's slot (CRC16-XMODEM mod
 * 16384 of the key, or of its {hash tag}), appends each node's commands
 * (pipelining), writes every node's buffer before reading any reply (one
 * overlapped round trip per node), then reads. MOVED updates the slot and
 * marks the map for a refresh; ASK retries that key once on the named node
 * after ASKING; a lost connection or a timeout drops the connection,
 * refreshes the map (a failover promotes a replica) and retries the key,
 * at most three attempts, all within the call's deadline.
 *
 * Limits: connect 250 ms, each command (socket send/receive) 1 s, a whole
 * call 5 s by default. A process-wide circuit breaker per node (host,
 * port; tier/breaker.c) keeps keys of a failing node from being asked
 * (KVX_TIER_DOWN, no wait) and lets one call probe it back; a node's first
 * reply on a new connection closes it.
 *
 * A kvx_tier is used by one thread at a time (its mutex); the store gives
 * its write-behind thread a client of its own.
 */
#include "tier.h"

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define NSLOTS 16384
#define MAX_ATTEMPTS 3
#define MAX_REDIRECTS 5

struct tcmd;

typedef struct tnode {
    char host[256];
    int port;
    redisContext *c;
    uint64_t tmo;    /* the socket timeout set on c (ms) */
    int unconfirmed; /* c is new and nothing was read on it yet: the breaker waits for a reply */
} tnode;

struct kvx_tier {
    pthread_mutex_t mu;
    kvx_tier_url url;
    kvx_tier_limits lim;
    tnode *nodes;
    int nnodes, capnodes;
    int16_t slots[NSLOTS]; /* node index, -1 unknown */
    int cluster;           /* 1 cluster, 0 single server, -1 not known */
    int map_ok, map_stale;
    int last_ok; /* the last call reached the tier */
    kvx_tier_reply_budget budget; /* the reply being read (one at a time: mu) */
    /* the call in progress: told of each command's final answer */
    void (*on_done)(void *ctx, size_t i, struct tcmd *c);
    void *on_ctx;
    struct tcmd *cmd_base;
};


/* ---- SIGPIPE ------------------------------------------------------------ */

/* hiredis writes with write(2): to a connection the server closed, that
 * raises SIGPIPE, whose default action ends the process. A library must
 * not change the process's handlers, so each call blocks SIGPIPE in its
 * own thread while it talks to the tier and consumes one it caused. */
typedef struct sigpipe_guard {
    sigset_t old;
    int was_pending;
} sigpipe_guard;

static void sigpipe_block(sigpipe_guard *g)
{
    sigset_t set, pend;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigpending(&pend);
    g->was_pending = sigismember(&pend, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
}

static void sigpipe_unblock(const sigpipe_guard *g)
{
    sigset_t set, pend;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigpending(&pend);
    if (!g->was_pending && sigismember(&pend, SIGPIPE) == 1) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR) {}
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* ---- CRC16 key slots ---------------------------------------------------- */

static uint16_t crc16(const char *buf, size_t len)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((uint8_t)buf[i] << 8);
        for (int k = 0; k < 8; k++) crc = crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

uint16_t kvx_tier_slot(const char *key, size_t len)
{
    size_t s, e;
    for (s = 0; s < len; s++)
        if (key[s] == '{') break;
    if (s < len) {
        for (e = s + 1; e < len; e++)
            if (key[e] == '}') break;
        if (e < len && e != s + 1) return crc16(key + s + 1, e - s - 1) & (NSLOTS - 1);
    }
    return crc16(key, len) & (NSLOTS - 1);
}


/* ---- nodes and connections ---------------------------------------------- */

static int node_add(kvx_tier *t, const char *host, int port)
{
    for (int i = 0; i < t->nnodes; i++)
        if (t->nodes[i].port == port && !strcmp(t->nodes[i].host, host)) return i;
    if (t->nnodes == t->capnodes) {
        int n = t->capnodes ? t->capnodes * 2 : 8;
        if (n > INT16_MAX) return -1;
        tnode *p = realloc(t->nodes, (size_t)n * sizeof *p);
        if (!p) return -1;
        t->nodes = p;
        t->capnodes = n;
    }
    tnode *nd = &t->nodes[t->nnodes];
    memset(nd, 0, sizeof *nd);
    snprintf(nd->host, sizeof nd->host, "%s", host);
    nd->port = port;
    return t->nnodes++;
}

static void node_drop(tnode *nd)
{
    if (nd->c) redisFree(nd->c);
    nd->c = NULL;
    nd->unconfirmed = 0;
}

static struct timeval tv_ms(uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    return tv;
}

/* ---- I/O within the call's deadline --------------------------------------
 *
 * hiredis's blocking redisGetReply waits for a whole reply with only a
 * per-read socket timeout: a server that sends one byte every 900 ms held
 * a call (and a store's close) for as long as it liked. Every write and
 * read here is cut at the call's deadline, each socket wait at
 * min(command timeout, time left) (tests/tier/reply.c test_drip_*). */

#define IO_OK 0
#define IO_FAIL -1 /* the node failed (error, timeout, lost, or out of time while it was sending) */
#define IO_LATE -2 /* out of time before this node was waited for: not its fault */

static int io_tmo(kvx_tier *t, tnode *nd, uint64_t deadline)
{
    uint64_t now = kvx_tier_now_ms();
    if (now >= deadline) {
        nd->c->err = REDIS_ERR_IO;
        snprintf(nd->c->errstr, sizeof nd->c->errstr, "the call's deadline passed");
        return -1;
    }
    uint64_t ms = deadline - now < t->lim.command_ms ? deadline - now : t->lim.command_ms;
    if (ms != nd->tmo) {
        redisSetTimeout(nd->c, tv_ms(ms));
        nd->tmo = ms;
    }
    return 0;
}

/* Writes what is appended on nd's connection. */
static int io_write(kvx_tier *t, tnode *nd, uint64_t deadline)
{
    int done = 0;
    while (!done) {
        if (nd->c->err) return IO_FAIL;
        if (io_tmo(t, nd, deadline)) return IO_LATE;
        if (redisBufferWrite(nd->c, &done) != REDIS_OK) return IO_FAIL;
    }
    return IO_OK;
}

/* A reply hiredis could not parse: one whose objects would pass the cap in
 * memory (reply.c: an array declaring 2^31 elements, a flood of small
 * ones) is named as such, not as hiredis's "out of memory"
 * (tests/tier/reply.c test_reply_memory_bounded). */
static int io_refused(kvx_tier *t, tnode *nd)
{
    if (t->budget.over)
        snprintf(nd->c->errstr, sizeof nd->c->errstr, "a reply taking over %llu bytes in memory",
                 (unsigned long long)t->budget.cap);
    return IO_FAIL;
}

/* Reads one reply from nd's connection into *out. */
static int io_read(kvx_tier *t, tnode *nd, void **out, uint64_t deadline)
{
    int waited = 0;
    *out = NULL;
    uint64_t got = 0; /* bytes read for this reply (hiredis compacts its buffer only in GetReply) */
    /* its objects: twice the wire cap (a slot map of 16384 ranges with two
     * replicas each takes about 4 MiB on the wire, 16 MiB in objects) */
    t->budget = (kvx_tier_reply_budget){2 * t->lim.max_reply_bytes, 0, 0};
    if (nd->c->err || redisGetReplyFromReader(nd->c, out) != REDIS_OK) return io_refused(t, nd);
    while (!*out) {
        if (io_tmo(t, nd, deadline)) return waited ? IO_FAIL : IO_LATE;
        waited = 1;
        size_t before = nd->c->reader->len;
        if (redisBufferRead(nd->c) != REDIS_OK) return IO_FAIL;
        got += nd->c->reader->len - before;
        if (got > t->lim.max_reply_bytes) {
            /* a bulk of 2^40 bytes or an array of 10^9 elements, streamed:
             * hiredis would hold it all (tests/tier/reply.c test_flood_reply) */
            nd->c->err = REDIS_ERR_PROTOCOL;
            snprintf(nd->c->errstr, sizeof nd->c->errstr, "a reply of over %llu bytes",
                     (unsigned long long)t->lim.max_reply_bytes);
            return IO_FAIL;
        }
        if (redisGetReplyFromReader(nd->c, out) != REDIS_OK) return io_refused(t, nd);
    }
    if (nd->unconfirmed) {
        /* the first reply on a new connection: the node answers, so its
         * breaker closes (a connect alone proves nothing: the kernel
         * completes it for a stalled server, or one that closes every
         * connection; tests/tier/breaker.c test_breaker_probe_windows) */
        nd->unconfirmed = 0;
        kvx_tier_brk_result(nd->host, nd->port, 1, NULL);
    }
    return IO_OK;
}

/* One command on nd's connection and its reply (NULL: none; *why says
 * whose fault, nullable). */
static redisReply *io_command(kvx_tier *t, tnode *nd, int argc, const char **argv, const size_t *lens,
                              uint64_t deadline, int *why)
{
    void *r = NULL;
    int rc = redisAppendCommandArgv(nd->c, argc, argv, lens) != REDIS_OK ? IO_FAIL : io_write(t, nd, deadline);
    if (rc == IO_OK) rc = io_read(t, nd, &r, deadline);
    if (why) *why = rc;
    return rc == IO_OK ? r : NULL;
}

/* Bytes that no command of ours asked for are waiting on c (a late or
 * extra reply: its next reply would be taken as the answer to another
 * command; tests/tier/reply.c test_extra_reply_*), or the server closed it
 * while idle (the call would fail and open the node's breaker;
 * tests/tier/reply.c test_idle_close_not_a_miss). */
static int conn_dirty(redisContext *c)
{
    if (c->reader && c->reader->pos < c->reader->len) return 1;
    char b;
    ssize_t n = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* A live connection to node i, or NULL (breaker open, out of time,
 * connect or AUTH failed: the breaker hears of it). */
static redisContext *node_conn(kvx_tier *t, int i, uint64_t deadline)
{
    tnode *nd = &t->nodes[i];
    if (nd->c && !nd->c->err && !conn_dirty(nd->c)) return nd->c;
    node_drop(nd);
    if (kvx_tier_now_ms() >= deadline || !kvx_tier_brk_allow(nd->host, nd->port)) return NULL;
    uint64_t left = deadline > kvx_tier_now_ms() ? deadline - kvx_tier_now_ms() : 1;
    uint64_t cms = t->lim.connect_ms < left ? t->lim.connect_ms : left;
    /* the name is resolved within the connect timeout, not before it
     * (hiredis's getaddrinfo would wait on the resolver for as long as it
     * takes); hiredis gets the address */
    char addr[INET6_ADDRSTRLEN], why[160];
    uint64_t t0 = kvx_tier_now_ms();
    if (kvx_tier_resolve(nd->host, (uint32_t)cms, addr, sizeof addr, why, sizeof why)) {
        kvx_tier_brk_result(nd->host, nd->port, 0, why);
        return NULL;
    }
    uint64_t spent = kvx_tier_now_ms() - t0;
    cms = spent < cms ? cms - spent : 1;
    redisContext *c = redisConnectWithTimeout(addr, nd->port, tv_ms(cms));
    if (!c || c->err) {
        kvx_tier_brk_result(nd->host, nd->port, 0, c ? c->errstr : "out of memory");
        if (c) redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv_ms(t->lim.command_ms));
    kvx_tier_reply_budget_attach(c, &t->budget);
    nd->c = c;
    nd->tmo = t->lim.command_ms;
    nd->unconfirmed = 1; /* the breaker's verdict waits for the first reply (io_read) */
    if (t->url.pass[0]) {
        const char *a[3] = {"AUTH", t->url.user[0] ? t->url.user : t->url.pass, t->url.pass};
        size_t l[3] = {4, strlen(a[1]), strlen(a[2])};
        int why;
        redisReply *r = io_command(t, nd, t->url.user[0] ? 3 : 2, a, l, deadline, &why);
        int bad = !r || r->type == REDIS_REPLY_ERROR;
        if (!r) {
            if (why != IO_LATE) kvx_tier_brk_result(nd->host, nd->port, 0, c->errstr);
        } else if (bad && kvx_tier_say_once()) {
            /* the node is up (no breaker): the credentials are wrong. Its
             * text is the server's: control bytes (a terminal's escape
             * sequences) are printed as '?' */
            char said[128];
            snprintf(said, sizeof said, "%s", r->str ? r->str : "?");
            for (char *p = said; *p; p++)
                if ((unsigned char)*p < ' ' || *p == 0x7f) *p = '?';
            fprintf(stderr, "kvx: shared tier node %s:%d refused AUTH (%s): its blocks are misses\n", nd->host,
                    nd->port, said);
        }
        if (r) freeReplyObject(r);
        if (bad) {
            node_drop(nd);
            return NULL;
        }
    }
    return c;
}

/* ---- the slot map ------------------------------------------------------- */

/* A host name a node may be named by: 1..255 bytes, no NUL, space,
 * control byte or DEL (they would reach the resolver and stderr). */
static int host_ok(const char *host, size_t len)
{
    if (len == 0 || len >= sizeof(((tnode *)0)->host)) return 0;
    for (size_t j = 0; j < len; j++)
        if ((unsigned char)host[j] <= ' ' || host[j] == 0x7f) return 0;
    return 1;
}

static int load_slots(kvx_tier *t, int from, const redisReply *r)
{
    int16_t m[NSLOTS];
    for (int i = 0; i < NSLOTS; i++) m[i] = -1;
    for (size_t k = 0; k < r->elements; k++) {
        const redisReply *e = r->element[k];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER || e->element[2]->type != REDIS_REPLY_ARRAY ||
            e->element[2]->elements < 2 || e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
            e->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
            return -1;
        long long a = e->element[0]->integer, b = e->element[1]->integer;
        long long port = e->element[2]->element[1]->integer;
        const redisReply *hr = e->element[2]->element[0];
        const char *host = hr->str;
        /* a port as the URL's (1..65535: (int) of 2^32 + p was p) and a
         * host name that fits, without a NUL or control byte
         * (tests/tier/cluster.c test_slots_map_refused) */
        if (port < 1 || port > 65535 || (hr->len && !host_ok(host, hr->len))) return -1;
        char asked[sizeof t->nodes[0].host];
        if (!host[0] || !strcmp(host, "?")) {
            /* "the node you asked": a copy, as node_add may move t->nodes
             * (it read freed memory: tests/tier/cluster.c test_slots_map_refused) */
            snprintf(asked, sizeof asked, "%s", t->nodes[from].host);
            host = asked;
        }
        int n = node_add(t, host, (int)port);
        if (n < 0 || a < 0 || b >= NSLOTS || a > b) return -1;
        for (long long s = a; s <= b; s++) m[s] = (int16_t)n;
    }
    memcpy(t->slots, m, sizeof m);
    return 0;
}

static int refresh(kvx_tier *t, uint64_t deadline, kvx_tier_io *io)
{
    for (int k = 0; k < t->url.n; k++) node_add(t, t->url.host[k], t->url.port[k]);
    /* seeds first, then every node known */
    for (int pass = 0; pass < 2; pass++) {
        int n = t->nnodes;
        for (int i = 0; i < n && kvx_tier_now_ms() < deadline; i++) {
            int is_seed = 0;
            for (int k = 0; k < t->url.n; k++)
                if (t->nodes[i].port == t->url.port[k] && !strcmp(t->nodes[i].host, t->url.host[k])) is_seed = 1;
            if (is_seed != !pass) continue;
            redisContext *c = node_conn(t, i, deadline);
            if (!c) continue;
            const char *a[2] = {"CLUSTER", "SLOTS"};
            size_t l[2] = {7, 5};
            int why;
            redisReply *r = io_command(t, &t->nodes[i], 2, a, l, deadline, &why);
            if (!r) {
                if (why != IO_LATE) kvx_tier_brk_result(t->nodes[i].host, t->nodes[i].port, 0, c->errstr);
                node_drop(&t->nodes[i]);
                continue;
            }
            int ok = 0;
            if (r->type == REDIS_REPLY_ERROR) {
                /* cluster support disabled (or CLUSTER not allowed to this
                 * user): a single server; MOVED corrects it if wrong */
                for (int s = 0; s < NSLOTS; s++) t->slots[s] = (int16_t)i;
                t->cluster = 0;
                ok = 1;
            } else if (r->type == REDIS_REPLY_ARRAY && r->elements && !load_slots(t, i, r)) {
                t->cluster = 1;
                ok = 1;
            }
            freeReplyObject(r);
            if (ok) {
                t->map_ok = 1;
                t->map_stale = 0;
                if (io) io->refreshes++;
                return 0;
            }
        }
    }
    return kvx_fail(KVX_EUNAVAILABLE, "tier: no node answered CLUSTER SLOTS");
}

/* ---- batches ------------------------------------------------------------ */

struct tcmd {
    const char *key;
    size_t keylen;
    int argc;
    const char **argv;
    const size_t *argvlen;
    redisReply *reply; /* the final answer (not an error reply) */
    uint8_t st;
    uint8_t done;
    uint8_t attempts, redirects;
    int ask; /* node index of an ASK, -1 none */
    int node; /* this round's node */
};
typedef struct tcmd tcmd;

static int parse_redirect(kvx_tier *t, const char *msg, int *slot)
{
    /* "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381" */
    const char *sp = strchr(msg, ' ');
    if (!sp) return -1;
    char *end;
    long s = strtol(sp + 1, &end, 10);
    if (*end != ' ' || s < 0 || s >= NSLOTS) return -1;
    const char *hp = end + 1, *colon = strrchr(hp, ':');
    if (!colon || colon == hp) return -1;
    char host[256];
    size_t hl = (size_t)(colon - hp);
    /* the host as CLUSTER SLOTS's (a redirect naming one with an escape
     * sequence or a space is refused, never added, resolved or printed:
     * tests/tier/cluster.c test_redirects_hostile), the port digits to the end */
    if (!host_ok(hp, hl)) return -1;
    memcpy(host, hp, hl);
    host[hl] = '\0';
    if (colon[1] < '0' || colon[1] > '9') return -1;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 1 || port > 65535) return -1;
    *slot = (int)s;
    return node_add(t, host, (int)port);
}

static void finish(kvx_tier *t, tcmd *c, uint8_t st, redisReply *r)
{
    c->done = 1;
    c->st = st;
    c->reply = r;
    if (t->on_done) t->on_done(t->on_ctx, (size_t)(c - t->cmd_base), c);
}

/* Runs the commands to their answers within the call's deadline. */
static void run_batch(kvx_tier *t, tcmd *cmds, size_t n, kvx_tier_io *io)
{
    uint64_t deadline = kvx_tier_now_ms() + t->lim.total_ms;
    for (size_t i = 0; i < n; i++) cmds[i].ask = -1;
    if ((!t->map_ok || t->map_stale) && refresh(t, deadline, io) && !t->map_ok) {
        for (size_t i = 0; i < n; i++) finish(t, &cmds[i], KVX_TIER_DOWN, NULL);
        return;
    }
    size_t left = n;
    while (left && kvx_tier_now_ms() < deadline) {
        /* route */
        for (size_t i = 0; i < n; i++) {
            tcmd *c = &cmds[i];
            if (c->done) continue;
            int nd = c->ask >= 0 ? c->ask : t->slots[kvx_tier_slot(c->key, c->keylen)];
            c->node = nd < 0 ? 0 : nd;
        }
        /* append and write, node by node */
        int nn = t->nnodes; /* a redirect below may add nodes */
        uint8_t *live = calloc((size_t)nn, 1);
        if (!live) break;
        for (int nd = 0; nd < nn; nd++) {
            int any = 0;
            for (size_t i = 0; i < n && !any; i++) any = !cmds[i].done && cmds[i].node == nd;
            if (!any) continue;
            redisContext *rc = node_conn(t, nd, deadline);
            if (!rc) {
                for (size_t i = 0; i < n; i++)
                    if (!cmds[i].done && cmds[i].node == nd && ++cmds[i].attempts >= MAX_ATTEMPTS)
                        finish(t, &cmds[i], KVX_TIER_DOWN, NULL), left--;
                t->map_stale = 1;
                continue;
            }
            for (size_t i = 0; i < n; i++) {
                tcmd *c = &cmds[i];
                if (c->done || c->node != nd) continue;
                if (c->ask >= 0) redisAppendCommand(rc, "ASKING");
                redisAppendCommandArgv(rc, c->argc, c->argv, c->argvlen);
            }
            live[nd] = io_write(t, &t->nodes[nd], deadline) == IO_LATE ? 2 : 1;
        }
        /* read */
        for (int nd = 0; nd < nn; nd++) {
            if (!live[nd]) continue;
            redisContext *rc = t->nodes[nd].c;
            /* broken: 1 the node failed, 2 out of time before it was waited for */
            int broken = rc == NULL ? 1 : live[nd] == 2 ? 2 : rc->err != 0;
            for (size_t i = 0; i < n; i++) {
                tcmd *c = &cmds[i];
                if (c->done || c->node != nd) continue;
                void *vr = NULL;
                int got;
                if (!broken && c->ask >= 0) {
                    if ((got = io_read(t, &t->nodes[nd], &vr, deadline)) != IO_OK) broken = got == IO_LATE ? 2 : 1;
                    else freeReplyObject(vr), vr = NULL;
                }
                if (!broken && (got = io_read(t, &t->nodes[nd], &vr, deadline)) != IO_OK)
                    broken = got == IO_LATE ? 2 : 1;
                if (broken) {
                    if (++c->attempts >= MAX_ATTEMPTS) finish(t, c, KVX_TIER_FAILED, NULL), left--;
                    c->ask = -1;
                    continue;
                }
                redisReply *r = vr;
                c->ask = -1;
                if (r->type == REDIS_REPLY_ERROR && (!strncmp(r->str, "MOVED ", 6) || !strncmp(r->str, "ASK ", 4))) {
                    int slot, to = parse_redirect(t, r->str, &slot);
                    int moved = r->str[0] == 'M';
                    freeReplyObject(r);
                    if (io) io->redirects++;
                    if (to < 0 || ++c->redirects > MAX_REDIRECTS) {
                        finish(t, c, KVX_TIER_FAILED, NULL), left--;
                        continue;
                    }
                    if (moved) {
                        t->slots[slot] = (int16_t)to;
                        /* a server that refused CLUSTER SLOTS would refuse
                         * it again and put every slot back on itself: the
                         * MOVED is all the map there is (tests/tier/cluster.c
                         * test_moved_without_cluster_slots) */
                        if (t->cluster) t->map_stale = 1;
                    } else {
                        c->ask = to;
                    }
                    continue;
                }
                if (r->type == REDIS_REPLY_ERROR) {
                    /* TRYAGAIN, CLUSTERDOWN, OOM, NOPERM, ...: no answer */
                    freeReplyObject(r);
                    finish(t, c, KVX_TIER_FAILED, NULL), left--;
                    continue;
                }
                finish(t, c, r->type == REDIS_REPLY_NIL ? KVX_TIER_NONE : KVX_TIER_OK, r);
                left--;
            }
            if (broken && rc) {
                /* replies still to come: the connection goes either way */
                if (broken == 1)
                    kvx_tier_brk_result(t->nodes[nd].host, t->nodes[nd].port, 0, rc->errstr[0] ? rc->errstr : "no answer");
                node_drop(&t->nodes[nd]);
                t->map_stale = 1;
            }
        }
        free(live);
        if (left && t->map_stale) refresh(t, deadline, io);
    }
    for (size_t i = 0; i < n; i++)
        if (!cmds[i].done) finish(t, &cmds[i], KVX_TIER_FAILED, NULL);
    t->last_ok = 0;
    for (size_t i = 0; i < n; i++)
        if (cmds[i].st == KVX_TIER_OK || cmds[i].st == KVX_TIER_NONE) t->last_ok = 1;
}

/* ---- the calls ---------------------------------------------------------- */

int kvx_tier_open(kvx_tier **out, const char *url, const kvx_tier_limits *limits)
{
    *out = NULL;
    kvx_tier *t = calloc(1, sizeof *t);
    if (!t) return kvx_fail(-ENOMEM, "tier: out of memory");
    int rc = kvx_tier_url_parse(&t->url, url);
    if (rc) {
        free(t);
        return rc;
    }
    t->lim.connect_ms = 250;
    t->lim.command_ms = 1000;
    t->lim.total_ms = 5000;
    t->lim.max_reply_bytes = (uint64_t)64 << 20;
    if (limits) {
        if (limits->connect_ms) t->lim.connect_ms = limits->connect_ms;
        if (limits->command_ms) t->lim.command_ms = limits->command_ms;
        if (limits->total_ms) t->lim.total_ms = limits->total_ms;
        if (limits->max_reply_bytes) t->lim.max_reply_bytes = limits->max_reply_bytes;
    }
    for (int i = 0; i < NSLOTS; i++) t->slots[i] = -1;
    t->cluster = -1;
    pthread_mutex_init(&t->mu, NULL);
    *out = t;
    return 0;
}

void kvx_tier_close(kvx_tier *t)
{
    if (!t) return;
    sigpipe_guard sg;
    sigpipe_block(&sg);
    for (int i = 0; i < t->nnodes; i++) node_drop(&t->nodes[i]);
    sigpipe_unblock(&sg);
    free(t->nodes);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

/* kvx_tier_get_each's adapter: the reply becomes (status, value). */
typedef struct get_ctx {
    kvx_tier_value_fn fn;
    void *ctx;
    kvx_tier_io *io;
} get_ctx;

static void get_done(void *vctx, size_t i, tcmd *c)
{
    get_ctx *g = vctx;
    redisReply *r = c->reply;
    uint8_t st = c->st, *val = NULL;
    size_t len = 0;
    if (r && r->type == REDIS_REPLY_STRING) {
        val = (uint8_t *)r->str; /* hiredis 0.14 allocates with malloc: take it */
        len = r->len;
        r->str = NULL;
        if (g->io) g->io->bytes_down += len;
    } else if (st == KVX_TIER_OK) {
        st = KVX_TIER_FAILED; /* not a string: not a value */
    }
    if (r) freeReplyObject(r);
    c->reply = NULL;
    g->fn(g->ctx, i, st, val, len);
}

int kvx_tier_get_each(kvx_tier *t, const char *const *keys, size_t n, kvx_tier_value_fn fn, void *ctx,
                      kvx_tier_io *io)
{
    tcmd *c = calloc(n ? n : 1, sizeof *c);
    size_t *al = calloc(n ? 2 * n : 1, sizeof *al);
    const char **av = calloc(n ? 2 * n : 1, sizeof *av);
    if (!c || !al || !av) {
        free(c), free(al), free(av);
        for (size_t i = 0; i < n; i++) fn(ctx, i, KVX_TIER_FAILED, NULL, 0);
        return kvx_fail(-ENOMEM, "tier: out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        av[2 * i] = "GET", al[2 * i] = 3;
        av[2 * i + 1] = keys[i], al[2 * i + 1] = strlen(keys[i]);
        c[i].key = keys[i], c[i].keylen = al[2 * i + 1];
        c[i].argc = 2, c[i].argv = av + 2 * i, c[i].argvlen = al + 2 * i;
    }
    get_ctx g = {fn, ctx, io};
    sigpipe_guard sg;
    sigpipe_block(&sg);
    pthread_mutex_lock(&t->mu);
    t->on_done = get_done;
    t->on_ctx = &g;
    t->cmd_base = c;
    run_batch(t, c, n, io);
    t->on_done = NULL;
    t->on_ctx = NULL;
    t->cmd_base = NULL;
    int up = t->last_ok;
    pthread_mutex_unlock(&t->mu);
    sigpipe_unblock(&sg);
    free(c), free(al), free(av);
    return up || !n ? 0 : kvx_fail(KVX_EUNAVAILABLE, "tier: no node answered");
}

typedef struct collect_ctx {
    uint8_t **vals;
    size_t *lens;
    uint8_t *st;
} collect_ctx;

static void collect(void *vctx, size_t i, uint8_t st, uint8_t *val, size_t len)
{
    collect_ctx *k = vctx;
    k->vals[i] = val;
    k->lens[i] = len;
    k->st[i] = st;
}

int kvx_tier_get(kvx_tier *t, const char *const *keys, size_t n, uint8_t **vals, size_t *lens, uint8_t *st,
                 kvx_tier_io *io)
{
    for (size_t i = 0; i < n; i++) vals[i] = NULL, lens[i] = 0, st[i] = KVX_TIER_FAILED;
    collect_ctx k = {vals, lens, st};
    return kvx_tier_get_each(t, keys, n, collect, &k, io);
}

int kvx_tier_set_nx(kvx_tier *t, const char *const *keys, const uint8_t *const *vals, const size_t *lens, size_t n,
                    uint64_t ttl_ms, uint8_t *st, kvx_tier_io *io)
{
    char ttl[24];
    snprintf(ttl, sizeof ttl, "%llu", (unsigned long long)ttl_ms);
    int argc = ttl_ms ? 6 : 4;
    tcmd *c = calloc(n ? n : 1, sizeof *c);
    size_t *al = calloc(n ? 6 * n : 1, sizeof *al);
    const char **av = calloc(n ? 6 * n : 1, sizeof *av);
    if (!c || !al || !av) {
        free(c), free(al), free(av);
        return kvx_fail(-ENOMEM, "tier: out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        const char **a = av + 6 * i;
        size_t *l = al + 6 * i;
        a[0] = "SET", l[0] = 3;
        a[1] = keys[i], l[1] = strlen(keys[i]);
        a[2] = (const char *)vals[i], l[2] = lens[i];
        a[3] = "NX", l[3] = 2;
        a[4] = "PX", l[4] = 2;
        a[5] = ttl, l[5] = strlen(ttl);
        c[i].key = keys[i], c[i].keylen = l[1];
        c[i].argc = argc, c[i].argv = a, c[i].argvlen = l;
        if (io) io->bytes_up += lens[i];
    }
    sigpipe_guard sg;
    sigpipe_block(&sg);
    pthread_mutex_lock(&t->mu);
    run_batch(t, c, n, io);
    int up = t->last_ok;
    pthread_mutex_unlock(&t->mu);
    sigpipe_unblock(&sg);
    for (size_t i = 0; i < n; i++) {
        st[i] = c[i].st;
        if (c[i].reply) freeReplyObject(c[i].reply);
    }
    free(c), free(al), free(av);
    return up || !n ? 0 : kvx_fail(KVX_EUNAVAILABLE, "tier: no node answered");
}

static const char cas_script[] =
    "local v = redis.call('GET', KEYS[1])\n"
    "if v and redis.sha1hex(v) ~= ARGV[1] then return 0 end\n"
    "if ARGV[3] ~= '0' then redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])\n"
    "else redis.call('SET', KEYS[1], ARGV[2]) end\n"
    "return 1\n";

int kvx_tier_cas(kvx_tier *t, const char *key, const char *old_sha1hex, const uint8_t *val, size_t len,
                 uint64_t ttl_ms, kvx_tier_io *io)
{
    char ttl[24];
    snprintf(ttl, sizeof ttl, "%llu", (unsigned long long)ttl_ms);
    const char *a[7] = {"EVAL", cas_script, "1", key, old_sha1hex, (const char *)val, ttl};
    size_t l[7] = {4, sizeof cas_script - 1, 1, strlen(key), strlen(old_sha1hex), len, strlen(ttl)};
    tcmd c;
    memset(&c, 0, sizeof c);
    c.key = key, c.keylen = l[3], c.argc = 7, c.argv = a, c.argvlen = l;
    if (io) io->bytes_up += len;
    sigpipe_guard sg;
    sigpipe_block(&sg);
    pthread_mutex_lock(&t->mu);
    run_batch(t, &c, 1, io);
    pthread_mutex_unlock(&t->mu);
    sigpipe_unblock(&sg);
    int rc;
    if (c.st == KVX_TIER_OK && c.reply && c.reply->type == REDIS_REPLY_INTEGER)
        rc = c.reply->integer == 1 ? 0 : kvx_fail(KVX_ENOTFOUND, "tier: the value changed before the replace");
    else
        rc = kvx_fail(KVX_EUNAVAILABLE, "tier: the replace got no answer");
    if (c.reply) freeReplyObject(c.reply);
    return rc;
}

int kvx_tier_ping(kvx_tier *t)
{
    const char *a[1] = {"PING"};
    size_t l[1] = {4};
    sigpipe_guard sg;
    sigpipe_block(&sg);
    pthread_mutex_lock(&t->mu);
    uint64_t deadline = kvx_tier_now_ms() + t->lim.total_ms;
    int rc = KVX_EUNAVAILABLE;
    if (!t->map_ok || t->map_stale) refresh(t, deadline, NULL);
    for (int k = 0; k < t->url.n; k++) node_add(t, t->url.host[k], t->url.port[k]);
    for (int i = 0; i < t->nnodes && rc; i++) {
        redisContext *c = node_conn(t, i, deadline);
        if (!c) continue;
        redisReply *r = io_command(t, &t->nodes[i], 1, a, l, deadline, NULL);
        if (r && r->type != REDIS_REPLY_ERROR) rc = 0;
        if (!r) node_drop(&t->nodes[i]);
        if (r) freeReplyObject(r);
    }
    t->last_ok = rc == 0;
    pthread_mutex_unlock(&t->mu);
    sigpipe_unblock(&sg);
    return rc ? kvx_fail(KVX_EUNAVAILABLE, "tier: no node answered PING") : 0;
}

void kvx_tier_set_total_ms(kvx_tier *t, uint32_t total_ms)
{
    pthread_mutex_lock(&t->mu);
    t->lim.total_ms = total_ms ? total_ms : 1; /* every read and write is cut at the call's deadline (io_tmo) */
    pthread_mutex_unlock(&t->mu);
}

int kvx_tier_up(kvx_tier *t)
{
    pthread_mutex_lock(&t->mu);
    int up = 0;
    for (int k = 0; k < t->url.n; k++) node_add(t, t->url.host[k], t->url.port[k]);
    for (int i = 0; i < t->nnodes && !up; i++) up = kvx_tier_brk_closed(t->nodes[i].host, t->nodes[i].port);
    up = up && t->last_ok;
    pthread_mutex_unlock(&t->mu);
    return up;
}

int kvx_tier_is_cluster(kvx_tier *t)
{
    pthread_mutex_lock(&t->mu);
    int c = t->cluster;
    pthread_mutex_unlock(&t->mu);
    return c;
}
