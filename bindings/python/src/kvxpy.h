/*
 * kvxpy.h - what the files of the CPython extension kvx._kvx share: the
 * object layouts of Store, Batch and View, and the error and buffer
 * helpers. The extension sees include/kvx.h only (docs/ARCHITECTURE.md).
 *
 * Locking: a Store holds a pthread rwlock. Every call into the store
 * (lookups, puts, flushes, batch calls) releases the GIL and then takes the
 * lock shared; close takes it exclusive, so a close waits for calls in
 * flight and a call after it sees the handle gone. A Batch also holds a
 * mutex (a kvx_store_batch belongs to one thread at a time).
 *
 * ABI: CMake defines Py_LIMITED_API 0x030B0000 for Python 3.11 and later
 * (one _kvx.abi3.so serves 3.11, 3.12, 3.13...), so only the stable ABI is
 * used: the types are heap types made from PyType_Spec (the buffer slots
 * are limited API from 3.11), no macro reaches into a list, tuple or bytes
 * object, no PyTypeObject field is read. Python 3.10 builds the same code
 * against the full API (its own cp310 extension).
 */
#ifndef KVXPY_H
#define KVXPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdint.h>

/* The headers of Python 3.12 and 3.13.0 define these as a plain return of
 * the singleton (immortal there), whatever Py_LIMITED_API says: an abi3
 * extension built with them took a reference from None at every return on
 * 3.11, which died at exit (none_dealloc). Here they take the reference on
 * every version (tests/test_refcounts.py). */
#undef Py_RETURN_NONE
#undef Py_RETURN_TRUE
#undef Py_RETURN_FALSE
#define Py_RETURN_NONE return Py_NewRef(Py_None)
#define Py_RETURN_TRUE return Py_NewRef(Py_True)
#define Py_RETURN_FALSE return Py_NewRef(Py_False)

#include "kvx.h"

typedef struct {
    PyObject_HEAD
    kvx_store *s; /* NULL once closed */
    unsigned long fork_gen; /* kvxpy_fork_gen when opened: another value = a forked child */
    pthread_rwlock_t lock;
    kvx_geometry geom;
    uint64_t page_bytes; /* one full block; a keyed store's page size */
    int readonly;
    int keyed; /* a keyed store (kvx_store_stats.page_bytes != 0) */
} kvxpy_store;

typedef struct {
    PyObject_HEAD
    kvxpy_store *store; /* strong reference */
    kvx_store_batch *b; /* NULL once closed */
    pthread_mutex_t mu;
} kvxpy_batch;

/* A served block. The kvx_view holds its shard, so the page stays mapped
 * until the view is released, whatever happens to the store. Buffers
 * exported from the view (memoryviews, numpy arrays) are counted: release()
 * refuses new access at once but keeps the kvx_view until the last export
 * is gone, so no exported buffer ever points at unmapped memory. */
typedef struct {
    PyObject_HEAD
    kvx_view v;
    Py_ssize_t exports;
    int released; /* release() called: no new access */
    int freed;    /* kvx_view_release done */
} kvxpy_view;

/* Bumped in every child of a fork (pthread_atfork). A Store records it
 * at open: in a child (kvx.h: "do not use a handle in a child process")
 * its calls raise ValueError and its close, its batches' close and their
 * deallocation forget the C handles instead of closing them, which would
 * unlink the parent's unflushed staging files and write to its index. */
extern volatile unsigned long kvxpy_fork_gen;
#define KVXPY_FORKED(st) ((st)->fork_gen != kvxpy_fork_gen)

/* The heap types, made once at import (PyInit__kvx) and kept for the
 * process (the module is single-phase: one instance). */
extern PyTypeObject *kvxpy_store_type;
extern PyTypeObject *kvxpy_batch_type;
extern PyTypeObject *kvxpy_view_type;
/* Makes kvxpy_store_type and kvxpy_batch_type (store.c). 0, or -1 with
 * an exception set. */
int kvxpy_store_types_init(void);

/* obj as a tuple of its own (a list another thread changes while the GIL
 * is released cannot drop an item read in C): a new reference, or NULL
 * with an exception set (a TypeError saying msg when obj is not iterable;
 * what the iterable raised otherwise). */
PyObject *kvxpy_tuple(PyObject *obj, const char *msg);
/* The name of o's type (type(o).__name__) for a message: a new reference,
 * or NULL with an exception set. */
PyObject *kvxpy_type_name(PyObject *o);
/* Frees a Store, Batch or View: a heap type's instance also holds its type. */
void kvxpy_free(PyObject *self);

/* Raises the kvx.Error subclass for code with kvx_last_error()'s message
 * (or msg when not NULL); returns NULL. */
PyObject *kvxpy_raise(int code, const char *msg);
/* Fills *out with a C-contiguous uint32 view of obj: a buffer of 4-byte
 * integers is used in place; any other sequence of ints is converted into
 * a temporary array. 0 on success; -1 with an exception set. Release with
 * kvxpy_tokens_release. */
typedef struct {
    Py_buffer buf;
    int have_buf;
    uint32_t *tmp;
    const uint32_t *p;
    size_t n;
} kvxpy_tokens;
int kvxpy_tokens_get(kvxpy_tokens *out, PyObject *obj);
void kvxpy_tokens_release(kvxpy_tokens *t);
/* PyArg "O&" converters of an int to uint32_t / uint64_t that reject
 * negative and too large values (OverflowError) instead of wrapping them
 * as "I" and "K" do. */
int kvxpy_u32_conv(PyObject *obj, void *out);
int kvxpy_u64_conv(PyObject *obj, void *out);
/* Drops a pin taken as o->exports++ (a buffer export, or Store.export's
 * hold during its call): the last one frees a released view. GIL held. */
void kvxpy_view_unpin(kvxpy_view *o);
/* A new View owning *v (on failure *v is released). */
PyObject *kvxpy_view_new(const kvx_view *v);

/* The geometry as a dict (quant by name when kvx knows it). */
PyObject *kvxpy_geometry_dict(const kvx_geometry *g);
/* A quant given as a name ("fp16", "bf16", ...) or a number. */
int kvxpy_quant_from(uint32_t *out, PyObject *obj);

#endif
