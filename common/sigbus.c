/*
 * sigbus.c - the mapping guard (see sigbus.h).
 *
 * The registry is a fixed array of atomic (start, end, kind) triples, so
 * the signal handlers can read it without locks or allocation
 * (async-signal-safe). The handlers are installed when the first range is
 * registered, and again at a later registration if another handler has
 * replaced them (SIGSEGV only once a catalog range exists). A slot is
 * claimed with a compare-and-swap on its own flag, then end, kind and start
 * are published with release stores; the handler loads start with acquire
 * and checks end. The handlers are installed with SA_ONSTACK (Go and other
 * runtimes run signal handlers on an alternate stack) and SA_SIGINFO (they
 * need the faulting address).
 *
 * A guarded body (kvx_sigbus_run) publishes its sigjmp_buf in a
 * thread-local pointer; the handler reads that pointer only after the
 * fault address matched a catalog range, so shard faults never touch TLS.
 */
#include "sigbus.h"

#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define KVX_SIGBUS_SLOTS 4096

static atomic_uint slot_claimed[KVX_SIGBUS_SLOTS];
static atomic_uintptr_t slot_start[KVX_SIGBUS_SLOTS];
static atomic_uintptr_t slot_end[KVX_SIGBUS_SLOTS];
static atomic_uint slot_kind[KVX_SIGBUS_SLOTS];     /* SLOT_SHARD or SLOT_CATALOG */
static atomic_uint slot_poisoned[KVX_SIGBUS_SLOTS]; /* catalog: zero page mapped */
static atomic_int any_catalog;                      /* a catalog range was ever registered */
static atomic_int slot_high; /* slots at or above this were never used */
static atomic_uint_fast64_t faults;

enum { SLOT_SHARD = 0, SLOT_CATALOG = 1 };

static struct sigaction prev_bus, prev_segv;
static uintptr_t page_mask;

/* The guarded body running in this thread, or NULL. */
static _Thread_local sigjmp_buf *volatile guard_jb;

static void pass_on(int sig, siginfo_t *si, void *uctx)
{
    const struct sigaction *prev = sig == SIGSEGV ? &prev_segv : &prev_bus;
    if ((prev->sa_flags & SA_SIGINFO) && prev->sa_sigaction) {
        prev->sa_sigaction(sig, si, uctx);
        return;
    }
    if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
        prev->sa_handler(sig);
        return;
    }
    /* Default action: restore it. A fault re-executes the instruction on
     * return and dies of the signal as it would have without kvx; a signal
     * sent by kill() is re-raised. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    if (si->si_code <= 0) raise(sig);
}

/* A catalog fault inside a guarded body: back to kvx_sigbus_run. */
static void catalog_escape(void)
{
    sigjmp_buf *jb = guard_jb;
    if (!jb) return;
    atomic_fetch_add_explicit(&faults, 1, memory_order_relaxed);
    siglongjmp(*jb, 1);
}

static void on_sigsegv(int sig, siginfo_t *si, void *uctx)
{
    int saved_errno = errno;
    uintptr_t addr = (uintptr_t)si->si_addr;
    int high = atomic_load_explicit(&slot_high, memory_order_acquire);
    if (si->si_code > 0) {
        for (int i = 0; i < high; i++) {
            uintptr_t start = atomic_load_explicit(&slot_start[i], memory_order_acquire);
            if (!start || addr < start) continue;
            if (atomic_load_explicit(&slot_kind[i], memory_order_relaxed) != SLOT_CATALOG) continue;
            uintptr_t end = atomic_load_explicit(&slot_end[i], memory_order_relaxed);
            if (addr - end < KVX_SIGBUS_CATALOG_SLACK || addr < end) {
                catalog_escape(); /* returns only outside a guarded body */
                break;
            }
        }
    }
    errno = saved_errno;
    pass_on(sig, si, uctx);
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
            int catalog = atomic_load_explicit(&slot_kind[i], memory_order_relaxed) == SLOT_CATALOG;
            if (catalog) catalog_escape(); /* returns only outside a guarded body */
            void *page = (void *)(addr & page_mask);
            /* libc, not kvx_os: a signal handler, and no file (os.h) */
            void *r = mmap(page, ~page_mask + 1, PROT_READ, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS,
                           -1, 0);
            if (r != MAP_FAILED) {
                /* the owner stops trusting the range (a shard checks its
                 * pages again, the catalog is reopened) */
                atomic_store_explicit(&slot_poisoned[i], 1u, memory_order_release);
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

/* (Re)installs a handler when someone else replaced it since (a test
 * framework that swaps signal handlers around each test, a runtime that
 * initialises after kvx): the handler in place becomes the one kvx passes
 * foreign faults on to. Called on every registration, under a mutex. */
static pthread_mutex_t install_lock = PTHREAD_MUTEX_INITIALIZER;

static int install_one(int sig, void (*fn)(int, siginfo_t *, void *), struct sigaction *prev)
{
    struct sigaction cur;
    if (sigaction(sig, NULL, &cur) != 0) return -errno;
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == fn) return 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = fn;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    struct sigaction old;
    if (sigaction(sig, &sa, &old) != 0) return -errno;
    *prev = old;
    return 0;
}

static int ensure_installed(int catalog)
{
    int rc = 0;
    pthread_mutex_lock(&install_lock);
    if (!page_mask) {
        long ps = sysconf(_SC_PAGESIZE);
        page_mask = ~((uintptr_t)(ps > 0 ? ps : 4096) - 1);
    }
    if (catalog) atomic_store(&any_catalog, 1);
    rc = install_one(SIGBUS, on_sigbus, &prev_bus);
    if (!rc && atomic_load(&any_catalog)) rc = install_one(SIGSEGV, on_sigsegv, &prev_segv);
    pthread_mutex_unlock(&install_lock);
    return rc;
}

static int register_kind(int *out_slot, const void *base, size_t len, unsigned kind)
{
    *out_slot = -1;
    int rc = ensure_installed(kind == SLOT_CATALOG);
    if (rc) return kvx_fail(rc, "cannot install the SIGBUS guard");
    for (int i = 0; i < KVX_SIGBUS_SLOTS; i++) {
        unsigned expect = 0;
        if (!atomic_compare_exchange_strong(&slot_claimed[i], &expect, 1u)) continue;
        atomic_store_explicit(&slot_end[i], (uintptr_t)base + len, memory_order_relaxed);
        atomic_store_explicit(&slot_kind[i], kind, memory_order_relaxed);
        atomic_store_explicit(&slot_poisoned[i], 0u, memory_order_relaxed);
        atomic_store_explicit(&slot_start[i], (uintptr_t)base, memory_order_release);
        int high = atomic_load(&slot_high);
        while (high < i + 1 && !atomic_compare_exchange_weak(&slot_high, &high, i + 1)) {
        }
        *out_slot = i;
        return 0;
    }
    return kvx_fail(KVX_ECAPACITY, "more than %d mappings are open at once", KVX_SIGBUS_SLOTS);
}

int kvx_sigbus_register(int *out_slot, const void *base, size_t len)
{
    return register_kind(out_slot, base, len, SLOT_SHARD);
}

int kvx_sigbus_register_catalog(int *out_slot, const void *base, size_t len)
{
    return register_kind(out_slot, base, len, SLOT_CATALOG);
}

void kvx_sigbus_move(int slot, const void *base, size_t len)
{
    if (slot < 0 || slot >= KVX_SIGBUS_SLOTS) return;
    atomic_store_explicit(&slot_start[slot], 0, memory_order_release); /* off while it changes */
    atomic_store_explicit(&slot_end[slot], (uintptr_t)base + len, memory_order_relaxed);
    atomic_store_explicit(&slot_poisoned[slot], 0u, memory_order_relaxed);
    atomic_store_explicit(&slot_start[slot], (uintptr_t)base, memory_order_release);
}

void kvx_sigbus_unregister(int slot)
{
    if (slot < 0 || slot >= KVX_SIGBUS_SLOTS) return;
    atomic_store_explicit(&slot_start[slot], 0, memory_order_release);
    atomic_store_explicit(&slot_end[slot], 0, memory_order_relaxed);
    atomic_store_explicit(&slot_kind[slot], SLOT_SHARD, memory_order_relaxed);
    atomic_store_explicit(&slot_poisoned[slot], 0u, memory_order_relaxed);
    atomic_store_explicit(&slot_claimed[slot], 0u, memory_order_release);
}

int kvx_sigbus_poisoned(int slot)
{
    if (slot < 0 || slot >= KVX_SIGBUS_SLOTS) return 0;
    return atomic_load_explicit(&slot_poisoned[slot], memory_order_acquire) != 0;
}

void kvx_sigbus_bail(void) { catalog_escape(); }

int kvx_sigbus_run(kvx_sigbus_body body, void *ctx, int *out_faulted)
{
    sigjmp_buf jb;
    sigjmp_buf *volatile outer = guard_jb;
    if (out_faulted) *out_faulted = 0;
    /* savemask 1: the handler runs with the signal blocked; the jump back
     * restores the mask saved here */
    if (sigsetjmp(jb, 1)) {
        guard_jb = outer;
        if (out_faulted) *out_faulted = 1;
        return KVX_ECORRUPT;
    }
    guard_jb = &jb;
    int rc = body(ctx);
    guard_jb = outer;
    return rc;
}

uint64_t kvx_sigbus_faults(void) { return atomic_load(&faults); }
