/*
 * sigbus.h - the mapping guard: keeps a shard file that is truncated by
 * someone else after it was opened from killing the process.
 *
 * Reading a page of a MAP_SHARED mapping that now lies past the end of the
 * file raises SIGBUS. kvx registers the address range of every shard
 * mapping here; a process-wide SIGBUS handler (installed the first time a
 * range is registered, and put back in front at a later registration if
 * someone replaced it) maps an anonymous zero page over a faulting
 * page inside a registered range and returns, so the read sees zeros and
 * fails its page CRC. A fault anywhere else goes to the handler that was
 * installed before kvx's (or the default action), as if kvx were not there.
 */
#ifndef KVX_SIGBUS_H
#define KVX_SIGBUS_H

#include <stddef.h>
#include <stdint.h>

/* Registers [base, base+len) and returns its slot in *out_slot; installs
 * the handler when it is not in place. 0, KVX_ECAPACITY when every slot is taken, or
 * -errno when the handler cannot be installed. */
int kvx_sigbus_register(int *out_slot, const void *base, size_t len);
/* Forgets a slot (call before munmap). A negative slot is ignored. */
void kvx_sigbus_unregister(int slot);
/* How many faults the guard has absorbed in this process (for tests and
 * diagnostics). */
uint64_t kvx_sigbus_faults(void);

#endif
