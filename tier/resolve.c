/*
 * resolve.c - a tier node's host name to an address, within a deadline.
 *
 * hiredis resolves with getaddrinfo, which blocks for as long as the
 * resolver takes (glibc: 5 s per try, two tries per name server), before
 * its connect timeout even starts; so one node named by a host whose name
 * server does not answer held every tier call far past its deadline. Here
 * a name is resolved with glibc's getaddrinfo_a and waited for with
 * gai_suspend up to the connect timeout; hiredis then gets the numeric
 * address, which it does not look up.
 *
 * A request still running when the wait ends is cancelled; one glibc
 * cannot cancel (its resolver thread is inside the lookup) must stay
 * allocated until it finishes, so it is parked on a list reaped at every
 * later call. At most MAX_PARKED are parked: past that, a name is not
 * resolved at all (its node counts as down) rather than queueing more
 * lookups on a resolver that is not answering.
 */
#include "tier.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_PARKED 64

typedef struct lookup {
    struct gaicb cb;
    struct addrinfo hints;
    struct lookup *next; /* on the parked list */
    char name[256];      /* cb.ar_name points here: it must outlive the request */
} lookup;

static pthread_mutex_t g_parked_mu = PTHREAD_MUTEX_INITIALIZER;
static lookup *g_parked;
static int g_nparked;

static void lookup_free(lookup *l)
{
    if (l->cb.ar_result) freeaddrinfo(l->cb.ar_result);
    free(l);
}

/* Frees the parked requests that have finished. Under g_parked_mu. */
static void reap_parked(void)
{
    for (lookup **p = &g_parked; *p;) {
        lookup *l = *p;
        if (gai_error(&l->cb) == EAI_INPROGRESS) {
            p = &l->next;
            continue;
        }
        *p = l->next;
        g_nparked--;
        lookup_free(l);
    }
}

/* The first IPv4 or IPv6 address of res as text. */
static int first_address(const struct addrinfo *res, char *out, size_t cap)
{
    for (const struct addrinfo *a = res; a; a = a->ai_next) {
        const void *src = NULL;
        if (a->ai_family == AF_INET)
            src = &((const struct sockaddr_in *)(const void *)a->ai_addr)->sin_addr;
        else if (a->ai_family == AF_INET6)
            src = &((const struct sockaddr_in6 *)(const void *)a->ai_addr)->sin6_addr;
        if (src && inet_ntop(a->ai_family, src, out, (socklen_t)cap)) return 0;
    }
    return -1;
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
    pthread_mutex_lock(&g_parked_mu);
    reap_parked();
    int full = g_nparked >= MAX_PARKED;
    pthread_mutex_unlock(&g_parked_mu);
    if (full) {
        snprintf(why, why_cap, "%d lookups of host names have not finished: %.64s not resolved", MAX_PARKED, host);
        return -1;
    }
    lookup *l = calloc(1, sizeof *l);
    if (!l) {
        snprintf(why, why_cap, "out of memory");
        return -1;
    }
    memcpy(l->name, host, strlen(host) + 1);
    l->hints.ai_socktype = SOCK_STREAM;
    l->hints.ai_family = AF_UNSPEC;
    l->cb.ar_name = l->name;
    l->cb.ar_request = &l->hints;
    struct gaicb *list[1] = {&l->cb};
    int rc = getaddrinfo_a(GAI_NOWAIT, list, 1, NULL);
    if (rc != 0) {
        snprintf(why, why_cap, "resolving %.64s: %s", host, gai_strerror(rc));
        free(l);
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
    for (;;) {
        rc = gai_error(&l->cb);
        if (rc != EAI_INPROGRESS) break;
        struct timespec now, left;
        clock_gettime(CLOCK_MONOTONIC, &now);
        left.tv_sec = end.tv_sec - now.tv_sec;
        left.tv_nsec = end.tv_nsec - now.tv_nsec;
        if (left.tv_nsec < 0) {
            left.tv_sec--;
            left.tv_nsec += 1000000000L;
        }
        if (left.tv_sec < 0) break;
        const struct gaicb *wait[1] = {&l->cb};
        gai_suspend(wait, 1, &left); /* EAI_AGAIN (time up), EAI_INTR, EAI_ALLDONE: looked at above */
    }
    if (rc == EAI_INPROGRESS) {
        if (gai_cancel(&l->cb) == EAI_CANCELED) {
            free(l);
        } else { /* running (or finished just now): it is freed once done */
            pthread_mutex_lock(&g_parked_mu);
            l->next = g_parked;
            g_parked = l;
            g_nparked++;
            pthread_mutex_unlock(&g_parked_mu);
        }
        snprintf(why, why_cap, "resolving %.64s took more than %u ms", host, (unsigned)timeout_ms);
        return -1;
    }
    if (rc != 0) {
        snprintf(why, why_cap, "resolving %.64s: %s", host, gai_strerror(rc));
        lookup_free(l);
        return -1;
    }
    rc = first_address(l->cb.ar_result, out, cap);
    lookup_free(l);
    if (rc) snprintf(why, why_cap, "%.64s has no IPv4 or IPv6 address", host);
    return rc;
}
