/*
 * sigbus.h - the mapping guard: keeps a mapped file that is truncated or
 * damaged from killing the process.
 *
 * Reading a page of a MAP_SHARED mapping that now lies past the end of the
 * file raises SIGBUS. kvx registers the address range of every mapping it
 * reads here; a process-wide SIGBUS handler (installed the first time a
 * range is registered, and put back in front at a later registration if
 * someone replaced it) handles a fault inside a registered range and
 * returns. A fault anywhere else goes to the handler that was installed
 * before kvx's (or the default action), as if kvx were not there.
 *
 * Two kinds of range:
 *   - shard mappings (kvx_sigbus_register): the handler maps an anonymous
 *     zero page over the faulting page, so the read sees zeros and fails
 *     its page CRC. A sealed shard never grows back, so the zeros stay
 *     right. The range is marked poisoned, so the shard stops handing out
 *     pages it checked before without checking them again.
 *   - catalog mappings (kvx_sigbus_register_catalog: the LMDB map of
 *     index/data.mdb). A read run through kvx_sigbus_run() that faults in
 *     the range is abandoned (siglongjmp back into kvx_sigbus_run, which
 *     returns KVX_ECORRUPT with *out_faulted set): nothing is mapped over
 *     the file, so a later, repaired file reads right. While such a guarded
 *     body runs, a SIGSEGV at most KVX_SIGBUS_CATALOG_SLACK bytes past the
 *     end of a catalog range is treated the same way (a damaged LMDB page
 *     whose node offsets point past the map). A fault in a catalog range
 *     outside a guarded body (a caller that reads LMDB directly) falls back
 *     to the zero page, and the range is marked poisoned: its owner must
 *     stop trusting the map (kvx_sigbus_poisoned) because the zero page
 *     would hide what a writer later appends to the file.
 */
#ifndef KVX_SIGBUS_H
#define KVX_SIGBUS_H

#include <stddef.h>
#include <stdint.h>

/* Bytes past the end of a catalog range where a SIGSEGV inside a guarded
 * body still counts as a catalog fault (LMDB reads at most a node offset
 * plus a key, both 16-bit, past a page it trusts). */
#define KVX_SIGBUS_CATALOG_SLACK ((size_t)1 << 20)

/* Registers the shard mapping [base, base+len) and returns its slot in
 * *out_slot; installs the handler when it is not in place. 0,
 * KVX_ECAPACITY when every slot is taken, or -errno when the handler cannot
 * be installed. */
int kvx_sigbus_register(int *out_slot, const void *base, size_t len);
/* The same for a catalog mapping (see above); also installs the SIGSEGV
 * handler that serves guarded bodies. */
int kvx_sigbus_register_catalog(int *out_slot, const void *base, size_t len);
/* Gives a registered slot a new range (a catalog map that was remapped to
 * grow) and clears its poisoned mark. A negative slot is ignored. */
void kvx_sigbus_move(int slot, const void *base, size_t len);
/* Forgets a slot (call before munmap). A negative slot is ignored. */
void kvx_sigbus_unregister(int slot);
/* Whether a fault in this slot was absorbed with a zero page (for a
 * catalog slot: outside a guarded body) since it was registered or last
 * moved. */
int kvx_sigbus_poisoned(int slot);
/* How many faults the guard has absorbed in this process (for tests and
 * diagnostics). */
uint64_t kvx_sigbus_faults(void);

/* Runs body(ctx) in this thread with catalog faults caught: returns
 * body's result, or KVX_ECORRUPT with *out_faulted = 1 when a read of a
 * catalog range faulted (body was abandoned at that point: it must hold no
 * lock or allocation it cannot lose, or its caller must clean up). Nests:
 * an inner run catches its own faults. out_faulted may be NULL. */
typedef int (*kvx_sigbus_body)(void *ctx);
int kvx_sigbus_run(kvx_sigbus_body body, void *ctx, int *out_faulted);
/* Abandons the guarded body running in this thread as a catalog fault
 * would (its kvx_sigbus_run returns KVX_ECORRUPT, *out_faulted = 1), for
 * code that meets damage it cannot return from (LMDB's assertion
 * callback). Returns only when no guarded body runs in this thread. */
void kvx_sigbus_bail(void);

#endif
