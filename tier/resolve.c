/*
 * resolve.c - a tier node's host name to an address, within a deadline.
 *
 * hiredis resolves with getaddrinfo, which blocks for as long as the
 * resolver takes (glibc: 5 s per try, two tries per name server), before
 * its connect timeout even starts; so one node named by a host whose name
 * server does not answer held every tier call far past its deadline. Here
 * a name is resolved by getaddrinfo on a detached thread of our own and
 * waited for up to the connect timeout; hiredis then gets the numeric
 * address, which it does not look up.
 *
 * Why not glibc's getaddrinfo_a: its gai_suspend can leave the caller's
 * stack-allocated waiter hooked when a lookup ends just as the wait times
 * out, its thread pool is not reset in a forked child (whose lookups then
 * never run), and a failed call can leave a request queued. The thread
 * here shares one reference-counted record with the caller: whoever of
 * the two lets go last frees it, so a caller that stopped waiting never
 * owns memory the thread still writes.
 *
 * At most MAX_RUNNING lookups run at once in a process: past that a name
 * is not looked up (its node counts as down) rather than piling threads
 * on a resolver that is not answering. A forked child starts with none
 * (pthread_atfork): the threads of the parent do not exist there.
 */
#include "tier.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_RUNNING 64

typedef struct lookup {
    pthread_mutex_t mu;
    pthread_cond_t done_cv;
    int refs;   /* the caller and the thread; under mu */
    int done;   /* under mu */
    int rc;     /* 0, or -1 with why set */
    char name[256];
    char addr[INET6_ADDRSTRLEN];
    char why[160];
} lookup;

static atomic_int g_running;
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

static void reset_in_child(void) { atomic_store(&g_running, 0); }
static void install_atfork(void) { pthread_atfork(NULL, NULL, reset_in_child); }

/* The first IPv4 address of res as text, else the first IPv6 one: the
 * order hiredis itself tries (AF_INET, then AF_INET6), so a name such as
 * localhost that has both still reaches a server listening on IPv4 only. */
static int first_address(const struct addrinfo *res, char *out, size_t cap)
{
    for (int family = AF_INET;; family = AF_INET6) {
        for (const struct addrinfo *a = res; a; a = a->ai_next) {
            if (a->ai_family != family) continue;
            const void *src = family == AF_INET
                                  ? (const void *)&((const struct sockaddr_in *)(const void *)a->ai_addr)->sin_addr
                                  : (const void *)&((const struct sockaddr_in6 *)(const void *)a->ai_addr)->sin6_addr;
            if (inet_ntop(family, src, out, (socklen_t)cap)) return 0;
        }
        if (family == AF_INET6) return -1;
    }
}

/* Drops one reference; the last frees the record. */
static void lookup_unref(lookup *l)
{
    pthread_mutex_lock(&l->mu);
    int left = --l->refs;
    pthread_mutex_unlock(&l->mu);
    if (left == 0) {
        pthread_cond_destroy(&l->done_cv);
        pthread_mutex_destroy(&l->mu);
        free(l);
    }
}

static void *lookup_thread(void *arg)
{
    lookup *l = arg;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    char addr[INET6_ADDRSTRLEN], why[160] = "";
    int rc = getaddrinfo(l->name, NULL, &hints, &res);
    if (rc != 0) {
        snprintf(why, sizeof why, "resolving %.64s: %s", l->name, gai_strerror(rc));
        rc = -1;
    } else if ((rc = first_address(res, addr, sizeof addr)) != 0) {
        snprintf(why, sizeof why, "%.64s has no IPv4 or IPv6 address", l->name);
    }
    if (res) freeaddrinfo(res);
    pthread_mutex_lock(&l->mu);
    l->rc = rc;
    if (rc == 0) memcpy(l->addr, addr, sizeof addr);
    memcpy(l->why, why, sizeof why);
    l->done = 1;
    pthread_cond_signal(&l->done_cv);
    pthread_mutex_unlock(&l->mu);
    atomic_fetch_sub(&g_running, 1);
    lookup_unref(l);
    return NULL;
}

int kvx_tier_resolve(const char *host, uint32_t timeout_ms, char *out, size_t cap, char *why, size_t why_cap)
{
    unsigned char probe[sizeof(struct in6_addr)];
    if (inet_pton(AF_INET, host, probe) == 1 || inet_pton(AF_INET6, host, probe) == 1) {
        if (strlen(host) >= cap) {
            snprintf(why, why_cap, "address %.64s is too long", host);
            return -1;
        }
        memcpy(out, host, strlen(host) + 1);
        return 0;
    }
    if (strlen(host) >= sizeof ((lookup *)0)->name) {
        snprintf(why, why_cap, "host name is too long");
        return -1;
    }
    pthread_once(&g_atfork_once, install_atfork);
    if (atomic_fetch_add(&g_running, 1) >= MAX_RUNNING) {
        atomic_fetch_sub(&g_running, 1);
        snprintf(why, why_cap, "%d lookups of host names have not finished: %.64s not resolved", MAX_RUNNING, host);
        return -1;
    }
    lookup *l = calloc(1, sizeof *l);
    pthread_condattr_t ca;
    int ok = l && !pthread_condattr_init(&ca);
    if (ok) {
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        ok = !pthread_cond_init(&l->done_cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (!ok) {
        free(l);
        atomic_fetch_sub(&g_running, 1);
        snprintf(why, why_cap, "out of memory");
        return -1;
    }
    pthread_mutex_init(&l->mu, NULL);
    memcpy(l->name, host, strlen(host) + 1);
    l->refs = 2;
    pthread_attr_t ta;
    pthread_t th;
    int started = !pthread_attr_init(&ta);
    if (started) {
        pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
        started = !pthread_create(&th, &ta, lookup_thread, l);
        pthread_attr_destroy(&ta);
    }
    if (!started) {
        l->refs = 1;
        lookup_unref(l);
        atomic_fetch_sub(&g_running, 1);
        snprintf(why, why_cap, "resolving %.64s: no thread", host);
        return -1;
    }
    struct timespec end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += timeout_ms / 1000;
    end.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (end.tv_nsec >= 1000000000L) {
        end.tv_sec++;
        end.tv_nsec -= 1000000000L;
    }
    int rc = -1;
    pthread_mutex_lock(&l->mu);
    while (!l->done && pthread_cond_timedwait(&l->done_cv, &l->mu, &end) == 0) {
    }
    if (!l->done) {
        snprintf(why, why_cap, "resolving %.64s took more than %u ms", host, (unsigned)timeout_ms);
    } else if (l->rc) {
        snprintf(why, why_cap, "%s", l->why);
    } else if (strlen(l->addr) >= cap) {
        snprintf(why, why_cap, "address of %.64s is too long", host);
    } else {
        memcpy(out, l->addr, strlen(l->addr) + 1);
        rc = 0;
    }
    pthread_mutex_unlock(&l->mu);
    lookup_unref(l);
    return rc;
}
