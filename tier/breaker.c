/*
 * breaker.c - the tier's process-wide circuit breaker, one per node (host,
 * port), shared by every kvx_tier of the process (tier/cluster.c asks it
 * before connecting and tells it each connection's verdict).
 *
 * A failed connect, a timeout or a connection lost without a reply opens
 * it for 250 ms, doubling to 5 s while the node keeps failing; while open,
 * the node is not asked (KVX_TIER_DOWN, no wait); once the time is up one
 * caller probes it (the others still skip), and the node's first reply
 * closes it (never a connect alone: the kernel completes connects for a
 * stalled server). Callers let through before it opened that fail as well
 * bring the same news: no further doubling.
 */
#include "tier.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

uint64_t kvx_tier_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The first failure of the process prints one line on stderr; nothing
 * else is ever printed. */
static atomic_int g_said;

int kvx_tier_say_once(void) { return !atomic_exchange(&g_said, 1); }

#define BRK_MAX 256
typedef struct tbrk {
    char host[256];
    int port;
    uint64_t open_until; /* 0: closed */
    uint64_t backoff;
    int probing; /* a caller was let through after the window: its failure doubles the backoff */
} tbrk;
static tbrk g_brk[BRK_MAX];
static int g_nbrk;
static pthread_mutex_t g_brk_mu = PTHREAD_MUTEX_INITIALIZER;

static tbrk *brk_find(const char *host, int port, int create)
{
    for (int i = 0; i < g_nbrk; i++)
        if (g_brk[i].port == port && !strcmp(g_brk[i].host, host)) return &g_brk[i];
    if (!create) return NULL;
    tbrk *b = NULL;
    if (g_nbrk < BRK_MAX) {
        b = &g_brk[g_nbrk++];
    } else {
        /* full (a long-lived process meets more nodes than that: nodes that
         * moved, a map naming many): reuse a closed breaker, else the one
         * whose time ran out first; without this, no node met later would
         * ever be skipped (tests/tier/cluster.c
         * test_many_nodes_and_breaker_table_full) */
        uint64_t t = kvx_tier_now_ms();
        for (int i = 0; i < g_nbrk; i++) {
            tbrk *c = &g_brk[i];
            if (!c->open_until) {
                b = c;
                break;
            }
            if (c->open_until <= t && (!b || c->open_until < b->open_until)) b = c;
        }
        if (!b) return NULL;
    }
    snprintf(b->host, sizeof b->host, "%s", host);
    b->port = port;
    b->open_until = 0;
    b->backoff = 0;
    b->probing = 0;
    return b;
}

/* May this node be asked now? Half-open: the first caller after the
 * timeout probes; the others wait for its verdict (skip). */
int kvx_tier_brk_allow(const char *host, int port)
{
    pthread_mutex_lock(&g_brk_mu);
    tbrk *b = brk_find(host, port, 0);
    int ok = 1;
    if (b && b->open_until) {
        uint64_t t = kvx_tier_now_ms();
        if (t < b->open_until) ok = 0;
        else {
            b->open_until = t + b->backoff; /* this caller probes */
            b->probing = 1;
        }
    }
    pthread_mutex_unlock(&g_brk_mu);
    return ok;
}

void kvx_tier_brk_result(const char *host, int port, int ok, const char *why)
{
    pthread_mutex_lock(&g_brk_mu);
    tbrk *b = brk_find(host, port, !ok);
    if (b) {
        uint64_t t = kvx_tier_now_ms();
        if (ok) {
            b->open_until = 0;
            b->backoff = 0;
        } else if (b->open_until && t < b->open_until && !b->probing) {
            /* a call let through before the breaker opened failed too: the
             * same news, not another doubling (callers at once would take
             * the first window from 250 ms to seconds) */
        } else {
            b->backoff = b->backoff ? (b->backoff * 2 > 5000 ? 5000 : b->backoff * 2) : 250;
            b->open_until = t + b->backoff;
        }
        b->probing = 0;
    }
    pthread_mutex_unlock(&g_brk_mu);
    if (!ok && kvx_tier_say_once())
        fprintf(stderr, "kvx: shared tier node %s:%d unreachable (%s): its blocks are misses until it answers again\n",
                host, port, why);
}

int kvx_tier_brk_closed(const char *host, int port)
{
    pthread_mutex_lock(&g_brk_mu);
    tbrk *b = brk_find(host, port, 0);
    int ok = !b || !b->open_until;
    pthread_mutex_unlock(&g_brk_mu);
    return ok;
}
