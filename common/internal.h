/*
 * common/internal.h - helpers shared by every module of the library, not API.
 *
 * Error reporting: a failing function calls kvx_fail(code, fmt, ...), which
 * records a thread-local message naming the field and the problem and
 * returns code, so the usual form is `return kvx_fail(KVX_EFORMAT, "...")`.
 */
#ifndef KVX_INTERNAL_H
#define KVX_INTERNAL_H

#include "kvx.h"

#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define KVX_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KVX_PRINTF(a, b)
#endif

/* Records the message for this thread and returns code. */
int kvx_fail(int code, const char *fmt, ...) KVX_PRINTF(2, 3);
/* Puts "<fmt...>: " before this thread's message (the reason a callee
 * recorded) and returns code: the one way a reason gets a prefix. */
int kvx_fail_prefix(int code, const char *fmt, ...) KVX_PRINTF(2, 3);
/* Clears this thread's message. */
void kvx_clear_error(void);

/* Little-endian loads and stores on unaligned bytes. */
static inline uint16_t kvx_load16(const void *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t kvx_load32(const void *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t kvx_load64(const void *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void kvx_store16(void *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void kvx_store32(void *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void kvx_store64(void *p, uint64_t v) { memcpy(p, &v, 8); }

/* Overflow-checked arithmetic: return 0 on overflow, 1 otherwise. */
static inline int kvx_mul64(uint64_t *out, uint64_t a, uint64_t b) { return !__builtin_mul_overflow(a, b, out); }
static inline int kvx_add64(uint64_t *out, uint64_t a, uint64_t b) { return !__builtin_add_overflow(a, b, out); }

/* FP8 quants carry a scale table (DESIGN.md); FP16 and BF16 never do. */
static inline int kvx_quant_is_fp8(uint32_t q) { return q == KVX_QUANT_E4M3 || q == KVX_QUANT_E5M2; }

static inline uint64_t kvx_align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* "FIFO", "character device", "directory", ... for a stat st_mode (os.c). */
const char *kvx_file_type_name(unsigned int mode);

#endif
