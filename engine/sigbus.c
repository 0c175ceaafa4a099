/*
 * sigbus.c - the mapping guard (see sigbus.h).
 *
 * The registry is a fixed array of atomic (start, end) pairs, so the signal
 * handler can read it without locks or allocation (async-signal-safe).
 * The handler is installed when the first range is registered, and again
 * at a later registration if another handler has replaced it. A
 * slot is claimed with a compare-and-swap on its own flag, then end and
 * start are published with release stores; the handler loads start with
 * acquire and checks end. The handler is installed with SA_ONSTACK (Go and
 * other runtimes run signal handlers on an alternate stack) and SA_SIGINFO
 * (it needs the faulting address).
 */
#include "sigbus.h"

#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define KVX_SIGBUS_SLOTS 4096

static atomic_uint slot_claimed[KVX_SIGBUS_SLOTS];
static atomic_uintptr_t slot_start[KVX_SIGBUS_SLOTS];
static atomic_uintptr_t slot_end[KVX_SIGBUS_SLOTS];
static atomic_int slot_high; /* slots at or above this were never used */
static atomic_uint_fast64_t faults;

static struct sigaction prev_action;
static uintptr_t page_mask;

static void pass_on(int sig, siginfo_t *si, void *uctx)
{
    if ((prev_action.sa_flags & SA_SIGINFO) && prev_action.sa_sigaction) {
        prev_action.sa_sigaction(sig, si, uctx);
        return;
    }
    if (prev_action.sa_handler != SIG_DFL && prev_action.sa_handler != SIG_IGN) {
        prev_action.sa_handler(sig);
        return;
    }
    /* Default action: restore it. A fault re-executes the instruction on
     * return and dies of SIGBUS as it would have without kvx; a SIGBUS sent
     * by kill() is re-raised. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, NULL);
    if (si->si_code <= 0) raise(SIGBUS);
}

static void on_sigbus(int sig, siginfo_t *si, void *uctx)
{
    int saved_errno = errno;
    uintptr_t addr = (uintptr_t)si->si_addr;
    int high = atomic_load_explicit(&slot_high, memory_order_acquire);
    if (si->si_code > 0) { /* raised by a fault, not by kill() */
        for (int i = 0; i < high; i++) {
            uintptr_t start = atomic_load_explicit(&slot_start[i], memory_order_acquire);
            if (!start || addr < start) continue;
            if (addr >= atomic_load_explicit(&slot_end[i], memory_order_relaxed)) continue;
            void *page = (void *)(addr & page_mask);
            void *r = mmap(page, ~page_mask + 1, PROT_READ, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS,
                           -1, 0);
            if (r != MAP_FAILED) {
                atomic_fetch_add_explicit(&faults, 1, memory_order_relaxed);
                errno = saved_errno;
                return; /* the read is retried and sees zeros */
            }
            break;
        }
    }
    errno = saved_errno;
    pass_on(sig, si, uctx);
}

/* (Re)installs the handler when someone else replaced it since (a test
 * framework that swaps SIGBUS handlers around each test, a runtime that
 * initialises after kvx): the handler in place becomes the one kvx passes
 * foreign faults on to. Called on every registration, under a mutex. */
static pthread_mutex_t install_lock = PTHREAD_MUTEX_INITIALIZER;

static int ensure_installed(void)
{
    int rc = 0;
    pthread_mutex_lock(&install_lock);
    if (!page_mask) {
        long ps = sysconf(_SC_PAGESIZE);
        page_mask = ~((uintptr_t)(ps > 0 ? ps : 4096) - 1);
    }
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) != 0) rc = -errno;
    else if (!(cur.sa_flags & SA_SIGINFO) || cur.sa_sigaction != on_sigbus) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
        struct sigaction old;
        if (sigaction(SIGBUS, &sa, &old) != 0) rc = -errno;
        else prev_action = old;
    }
    pthread_mutex_unlock(&install_lock);
    return rc;
}

int kvx_sigbus_register(int *out_slot, const void *base, size_t len)
{
    *out_slot = -1;
    int rc = ensure_installed();
    if (rc) return kvx_fail(rc, "cannot install the SIGBUS guard");
    for (int i = 0; i < KVX_SIGBUS_SLOTS; i++) {
        unsigned expect = 0;
        if (!atomic_compare_exchange_strong(&slot_claimed[i], &expect, 1u)) continue;
        atomic_store_explicit(&slot_end[i], (uintptr_t)base + len, memory_order_relaxed);
        atomic_store_explicit(&slot_start[i], (uintptr_t)base, memory_order_release);
        int high = atomic_load(&slot_high);
        while (high < i + 1 && !atomic_compare_exchange_weak(&slot_high, &high, i + 1)) {
        }
        *out_slot = i;
        return 0;
    }
    return kvx_fail(KVX_ECAPACITY, "more than %d shard mappings are open at once", KVX_SIGBUS_SLOTS);
}

void kvx_sigbus_unregister(int slot)
{
    if (slot < 0 || slot >= KVX_SIGBUS_SLOTS) return;
    atomic_store_explicit(&slot_start[slot], 0, memory_order_release);
    atomic_store_explicit(&slot_end[slot], 0, memory_order_relaxed);
    atomic_store_explicit(&slot_claimed[slot], 0u, memory_order_release);
}

uint64_t kvx_sigbus_faults(void) { return atomic_load(&faults); }
