/*
 * store.c - kvx.Store and kvx.Batch: the store's calls with the GIL
 * released, under the Store's rwlock (kvxpy.h), so lookups from several
 * Python threads run in parallel in C and a close waits for them.
 */
#include "kvxpy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KVXPY_CLOSED 1 /* never a kvx code (those are <= 0) */
#define KVXPY_FORKED_RC 2 /* the handle belongs to the parent of a fork */
#define KVXPY_STORE_GONE 3 /* a batch whose store was closed (kvx detached it) */

static PyObject *closed_error(const char *what)
{
    PyErr_Format(PyExc_ValueError, "kvx: %s is closed", what);
    return NULL;
}

static PyObject *forked_error(void)
{
    PyErr_SetString(PyExc_ValueError, "kvx: the store was opened before a fork (this process is the child): "
                                      "open it again in this process");
    return NULL;
}

/* Runs expr (which may use st->s) with the GIL released and the store
 * read-locked; rc gets its result, KVXPY_CLOSED or KVXPY_FORKED_RC (the
 * lock is not touched in a forked child: a parent thread may have held it). */
#define STORE_CALL(st, rc, expr)                         \
    do {                                                 \
        if (KVXPY_FORKED(st)) {                          \
            (rc) = (st)->s ? KVXPY_FORKED_RC : KVXPY_CLOSED; \
            break;                                       \
        }                                                \
        Py_BEGIN_ALLOW_THREADS;                          \
        pthread_rwlock_rdlock(&(st)->lock);              \
        (rc) = (st)->s ? (int)(expr) : KVXPY_CLOSED;     \
        pthread_rwlock_unlock(&(st)->lock);              \
        Py_END_ALLOW_THREADS;                            \
    } while (0)

static PyObject *store_fail(int rc)
{
    if (rc == KVXPY_FORKED_RC) return forked_error();
    return rc == KVXPY_CLOSED ? closed_error("the store") : kvxpy_raise(rc, NULL);
}

static kvxpy_store *store_alloc(kvx_store *s)
{
    kvxpy_store *o = PyObject_New(kvxpy_store, kvxpy_store_type);
    if (!o) {
        Py_BEGIN_ALLOW_THREADS;
        kvx_store_close(s);
        Py_END_ALLOW_THREADS;
        return NULL;
    }
    o->s = s;
    o->fork_gen = kvxpy_fork_gen;
    /* writer-preferring: glibc's default lets readers overlapping without
     * end (threads in lookups) starve close() forever. No call takes the
     * lock twice, so the non-recursive kind is safe. */
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
#if defined(__GLIBC__)
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
    pthread_rwlock_init(&o->lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    kvx_store_get_geometry(&o->geom, s);
    o->page_bytes = kvx_page_bytes(&o->geom, o->geom.block_tokens);
    o->readonly = 0;
    o->keyed = 0;
    kvx_store_stats stats;
    if (kvx_store_stat(&stats, s) == 0 && stats.page_bytes) { /* a keyed store */
        o->page_bytes = stats.page_bytes;
        o->keyed = 1;
    }
    return o;
}

static uint32_t flag_bits(int nowait, int verify, int nosync, int readonly, int holes)
{
    return (nowait ? KVX_STORE_NOWAIT : 0) | (verify ? KVX_STORE_VERIFY : 0) | (nosync ? KVX_STORE_NOSYNC : 0) |
           (readonly ? KVX_STORE_READONLY : 0) | (holes ? KVX_STORE_HOLES : 0);
}

static PyObject *store_create(PyObject *cls, PyObject *args, PyObject *kw)
{
    (void)cls;
    static char *kwlist[] = {"dir",         "num_layers",      "kv_heads",   "head_dim",    "block_tokens",
                             "quant",       "model_signature", "capacity",   "shard_bytes", "nowait",
                             "verify",      "nosync",          "page_bytes", "tier_url",    "tier_tenant",
                             "tier_ttl_ms", "holes",           NULL};
    PyObject *dirobj, *quant = NULL;
    unsigned int L = UINT32_MAX, H = UINT32_MAX, D = UINT32_MAX, B = UINT32_MAX;
    unsigned long long sig = 0, cap = 0, shard = 0, pb = 0, ttl = 0;
    int nowait = 0, verify = 0, nosync = 0, holes = 0;
    const char *tier = NULL, *tenant = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|$O&O&O&O&OO&O&O&pppO&zzO&p:Store.create", kwlist,
                                     PyUnicode_FSConverter, &dirobj, kvxpy_u32_conv, &L, kvxpy_u32_conv, &H,
                                     kvxpy_u32_conv, &D, kvxpy_u32_conv, &B, &quant, kvxpy_u64_conv, &sig,
                                     kvxpy_u64_conv, &cap, kvxpy_u64_conv, &shard, &nowait, &verify, &nosync,
                                     kvxpy_u64_conv, &pb, &tier, &tenant, kvxpy_u64_conv, &ttl, &holes))
        return NULL;
    int any_geom = L != UINT32_MAX || H != UINT32_MAX || D != UINT32_MAX || B != UINT32_MAX || quant || sig;
    if (pb && any_geom) { /* a keyed store has a page size instead of a geometry */
        Py_DECREF(dirobj);
        PyErr_SetString(PyExc_TypeError, "Store.create: page_bytes (a keyed store) takes no geometry, quant or "
                                         "model_signature");
        return NULL;
    }
    if (!pb && (L == UINT32_MAX || H == UINT32_MAX || D == UINT32_MAX || B == UINT32_MAX)) {
        Py_DECREF(dirobj);
        PyErr_SetString(PyExc_TypeError, "Store.create: num_layers, kv_heads, head_dim and block_tokens are required "
                                         "(or page_bytes for a keyed store)");
        return NULL;
    }
    kvx_store_options o;
    kvx_store_options_init(&o);
    if (pb) {
        o.page_bytes = pb; /* geometry stays all zero */
    } else {
        o.geometry = (kvx_geometry){L, H, D, B, KVX_QUANT_FP16, sig};
        if (quant && kvxpy_quant_from(&o.geometry.quant, quant) < 0) {
            Py_DECREF(dirobj);
            return NULL;
        }
    }
    o.capacity_bytes = cap;
    o.shard_bytes = shard;
    o.flags = flag_bits(nowait, verify, nosync, 0, holes);
    o.tier_url = tier;
    o.tier_tenant = tenant;
    o.tier_ttl_ms = ttl;
    kvx_store *s = NULL;
    int rc;
    const char *dir = PyBytes_AsString(dirobj);
    Py_BEGIN_ALLOW_THREADS;
    rc = kvx_store_create(&s, dir, &o);
    Py_END_ALLOW_THREADS;
    Py_DECREF(dirobj);
    if (rc) return kvxpy_raise(rc, NULL);
    return (PyObject *)store_alloc(s);
}

static PyObject *store_open(PyObject *cls, PyObject *args, PyObject *kw)
{
    (void)cls;
    static char *kwlist[] = {"dir",      "readonly",    "nowait",      "verify", "nosync",
                             "tier_url", "tier_tenant", "tier_ttl_ms", "holes",  NULL};
    PyObject *dirobj;
    int readonly = 0, nowait = 0, verify = 0, nosync = 0, holes = 0;
    const char *tier = NULL, *tenant = NULL;
    unsigned long long ttl = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|$ppppzzO&p:Store.open", kwlist, PyUnicode_FSConverter, &dirobj,
                                     &readonly, &nowait, &verify, &nosync, &tier, &tenant, kvxpy_u64_conv, &ttl,
                                     &holes))
        return NULL;
    kvx_store *s = NULL;
    int rc;
    const char *dir = PyBytes_AsString(dirobj);
    kvx_store_options oo;
    kvx_store_options_init(&oo);
    oo.flags = flag_bits(nowait, verify, nosync, readonly, holes);
    oo.tier_url = tier; /* None: DIR/TIER's */
    oo.tier_tenant = tenant;
    oo.tier_ttl_ms = ttl;
    Py_BEGIN_ALLOW_THREADS;
    rc = kvx_store_open_options(&s, dir, &oo);
    Py_END_ALLOW_THREADS;
    Py_DECREF(dirobj);
    if (rc) return kvxpy_raise(rc, NULL);
    kvxpy_store *o = store_alloc(s);
    if (o) o->readonly = readonly;
    return (PyObject *)o;
}

static void store_close_now(kvxpy_store *o)
{
    if (KVXPY_FORKED(o)) { /* the parent's handle: forgotten here, closed by the parent */
        o->s = NULL;
        return;
    }
    Py_BEGIN_ALLOW_THREADS;
    pthread_rwlock_wrlock(&o->lock); /* waits for calls in flight */
    kvx_store_close(o->s);
    o->s = NULL;
    pthread_rwlock_unlock(&o->lock);
    Py_END_ALLOW_THREADS;
}

static PyObject *store_close(PyObject *self, PyObject *unused)
{
    (void)unused;
    store_close_now((kvxpy_store *)self);
    Py_RETURN_NONE;
}

static void store_dealloc(PyObject *self)
{
    kvxpy_store *o = (kvxpy_store *)self;
    int forked = KVXPY_FORKED(o);
    if (o->s) store_close_now(o);
    if (!forked) pthread_rwlock_destroy(&o->lock);
    kvxpy_free(self);
}

static PyObject *store_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    if (!((kvxpy_store *)self)->s) return closed_error("the store");
    Py_INCREF(self);
    return self;
}

static PyObject *store_exit(PyObject *self, PyObject *args)
{
    (void)args;
    return store_close(self, NULL);
}

/* ---- puts (Store and Batch) --------------------------------------------- */

typedef struct {
    kvxpy_tokens tok;
    Py_buffer pages, scales;
    int have_pages, have_scales;
    size_t n_pages;
} put_args;

static void put_args_release(put_args *a)
{
    kvxpy_tokens_release(&a->tok);
    if (a->have_pages) PyBuffer_Release(&a->pages);
    if (a->have_scales) PyBuffer_Release(&a->scales);
}

/* A float format of pages must be the store's quant: float16 ('e') KV
 * given to a bf16 store has the right element size but other bits (fp16
 * 1.0, 0x3C00, reads as bf16 0.0078125), and was stored as garbage.
 * Integer formats and raw bytes still pass as the store's bits (numpy has
 * no bfloat16: bf16 KV comes as uint16 or int16, torch's .view(torch.int16)).
 * -1 with ValueError naming the field and both formats. */
static int pages_float_refused(const kvxpy_store *st, const char *format)
{
    const char *f = format;
    if (!f) return 0; /* raw bytes */
    int big = *f == '>' || *f == '!';
    if (*f == '@' || *f == '=' || *f == '<' || big) f++;
    const char *what = *f == 'e' ? "float16" : *f == 'f' ? "float32" : *f == 'd' ? "float64"
                     : *f == 'Z' ? "complex" : NULL;
    if (!what) return 0; /* an integer (or another non-float) format: bits */
    if (st->geom.quant == KVX_QUANT_FP16 && strcmp(f, "e") == 0 && !big) return 0;
    const char *q = kvx_quant_name(st->geom.quant);
    char qn[32];
    if (!q) {
        snprintf(qn, sizeof qn, "quant %u", (unsigned)st->geom.quant);
        q = qn;
    }
    PyErr_Format(PyExc_ValueError,
                 "kvx: put: pages has format '%s' (%s%s), the store's quant is %s: give the KV in %s, or its "
                 "bits as an integer array of the same item size (numpy uint16, torch .view(torch.int16)) or raw "
                 "bytes",
                 format, big ? "big-endian " : "", what, q, q);
    return -1;
}

static int put_args_get(put_args *a, kvxpy_store *st, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"tokens", "pages", "scales", NULL};
    PyObject *tok, *pages, *scales = Py_None;
    memset(a, 0, sizeof *a);
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O:put", kwlist, &tok, &pages, &scales)) return -1;
    if (kvxpy_tokens_get(&a->tok, tok) < 0) return -1;
    /* with its format: an array of another element size than the store's
     * (float32 KV for an fp16 store) would be cut into twice the pages */
    if (PyObject_GetBuffer(pages, &a->pages, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto fail;
    a->have_pages = 1;
    uint64_t elems = 2ULL * st->geom.num_layers * st->geom.kv_heads * st->geom.block_tokens * st->geom.head_dim;
    uint64_t esz = elems && !st->keyed ? st->page_bytes / elems : 0;
    if (esz && a->pages.itemsize != 1 && (uint64_t)a->pages.itemsize != esz) {
        PyErr_Format(PyExc_ValueError, "kvx: put: pages has %zd-byte elements (format '%s'), the store's are %llu "
                     "bytes (give the KV in the store's dtype, or its raw bytes)", a->pages.itemsize,
                     a->pages.format ? a->pages.format : "B", (unsigned long long)esz);
        goto fail;
    }
    if (esz && pages_float_refused(st, a->pages.format) < 0) goto fail;
    uint64_t pb = st->page_bytes;
    if (pb == 0 || (uint64_t)a->pages.len % pb) {
        PyErr_Format(PyExc_ValueError, "kvx: put: pages holds %zd bytes, not a whole number of %llu-byte pages",
                     a->pages.len, (unsigned long long)pb);
        goto fail;
    }
    a->n_pages = (size_t)((uint64_t)a->pages.len / (pb ? pb : 1));
    if (scales != Py_None) {
        if (PyObject_GetBuffer(scales, &a->scales, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto fail;
        a->have_scales = 1;
        const char *f = a->scales.format ? a->scales.format : "B";
        if (*f == '@' || *f == '=' || *f == '<') f++;
        if (a->scales.itemsize != 1 && strcmp(f, "f") != 0) { /* float64 scales are not read as float32 */
            PyErr_Format(PyExc_ValueError, "kvx: put: scales has format '%s', not float32",
                         a->scales.format ? a->scales.format : "B");
            goto fail;
        }
        uint64_t want = a->n_pages * kvx_scale_count(&st->geom) * sizeof(float);
        if ((uint64_t)a->scales.len != want) {
            PyErr_Format(PyExc_ValueError, "kvx: put: scales holds %zd bytes, %llu expected (pages x L*2*Hkv float32)",
                         a->scales.len, (unsigned long long)want);
            goto fail;
        }
    }
    return 0;
fail:
    put_args_release(a);
    return -1;
}

static PyObject *store_put(PyObject *self, PyObject *args, PyObject *kw)
{
    kvxpy_store *st = (kvxpy_store *)self;
    put_args a;
    if (put_args_get(&a, st, args, kw) < 0) return NULL;
    size_t n_new = 0;
    int rc;
    const float *sc = a.have_scales ? a.scales.buf : NULL;
    STORE_CALL(st, rc, kvx_store_put(st->s, a.tok.p, a.tok.n, a.pages.buf, a.n_pages, sc, &n_new));
    put_args_release(&a);
    if (rc) return store_fail(rc);
    return PyLong_FromSize_t(n_new);
}

static int env_args_get(PyObject *args, PyObject *kw, Py_buffer *env, kvxpy_tokens *tok)
{
    static char *kwlist[] = {"envelope", "tokens", NULL};
    PyObject *envobj, *tobj = Py_None;
    memset(tok, 0, sizeof *tok);
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:put_envelope", kwlist, &envobj, &tobj)) return -1;
    if (PyObject_GetBuffer(envobj, env, PyBUF_SIMPLE) < 0) return -1;
    if (tobj != Py_None && kvxpy_tokens_get(tok, tobj) < 0) {
        PyBuffer_Release(env);
        return -1;
    }
    return 0;
}

static PyObject *store_put_envelope(PyObject *self, PyObject *args, PyObject *kw)
{
    kvxpy_store *st = (kvxpy_store *)self;
    Py_buffer env;
    kvxpy_tokens tok;
    if (env_args_get(args, kw, &env, &tok) < 0) return NULL;
    size_t n_new = 0;
    int rc;
    STORE_CALL(st, rc, kvx_store_put_envelope(st->s, env.buf, (size_t)env.len, tok.p, tok.n, &n_new));
    PyBuffer_Release(&env);
    kvxpy_tokens_release(&tok);
    if (rc) return store_fail(rc);
    return PyLong_FromSize_t(n_new);
}

#define STORE_SIMPLE(fname, call)                              \
    static PyObject *store_##fname(PyObject *self, PyObject *u) \
    {                                                          \
        (void)u;                                               \
        kvxpy_store *st = (kvxpy_store *)self;                 \
        int rc;                                                \
        STORE_CALL(st, rc, call(st->s));                       \
        if (rc) return store_fail(rc);                         \
        Py_RETURN_NONE;                                        \
    }
STORE_SIMPLE(flush, kvx_store_flush)
STORE_SIMPLE(gc, kvx_store_gc)
STORE_SIMPLE(reindex, kvx_store_reindex)

/* ---- lookups ------------------------------------------------------------ */

static PyObject *one_view(int rc, kvx_view *v)
{
    if (rc) return store_fail(rc);
    return kvxpy_view_new(v);
}

static PyObject *store_get(PyObject *self, PyObject *args)
{
    kvxpy_store *st = (kvxpy_store *)self;
    unsigned int coord;
    if (!PyArg_ParseTuple(args, "O&:get", kvxpy_u32_conv, &coord)) return NULL;
    kvx_view v;
    int rc;
    STORE_CALL(st, rc, kvx_store_get(&v, st->s, coord));
    return one_view(rc, &v);
}

static PyObject *store_get_hash(PyObject *self, PyObject *args)
{
    kvxpy_store *st = (kvxpy_store *)self;
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "O&:get_hash", kvxpy_u64_conv, &h)) return NULL;
    kvx_view v;
    int rc;
    STORE_CALL(st, rc, kvx_store_get_hash(&v, st->s, h));
    return one_view(rc, &v);
}

static PyObject *store_get_block(PyObject *self, PyObject *arg)
{
    kvxpy_store *st = (kvxpy_store *)self;
    kvxpy_tokens t;
    if (kvxpy_tokens_get(&t, arg) < 0) return NULL;
    kvx_view v;
    int rc;
    STORE_CALL(st, rc, kvx_store_get_block(&v, st->s, t.p, t.n));
    kvxpy_tokens_release(&t);
    return one_view(rc, &v);
}

static PyObject *store_prefix(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"tokens", "max_views", NULL};
    kvxpy_store *st = (kvxpy_store *)self;
    PyObject *tobj, *maxobj = Py_None;
    Py_ssize_t maxv = -1; /* None: every full block */
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:prefix", kwlist, &tobj, &maxobj)) return NULL;
    if (maxobj != Py_None) {
        maxv = PyNumber_AsSsize_t(maxobj, PyExc_OverflowError);
        if (maxv == -1 && PyErr_Occurred()) return NULL;
        if (maxv < 0) {
            PyErr_Format(PyExc_ValueError, "kvx: prefix: max_views %zd is negative", maxv);
            return NULL;
        }
    }
    kvxpy_tokens t;
    if (kvxpy_tokens_get(&t, tobj) < 0) return NULL;
    size_t cap = st->geom.block_tokens ? t.n / st->geom.block_tokens : 0;
    if (maxv >= 0 && (size_t)maxv < cap) cap = (size_t)maxv;
    kvx_view stackv[128], *views = stackv;
    if (cap > 128 && !(views = PyMem_Malloc(cap * sizeof *views))) {
        kvxpy_tokens_release(&t);
        return PyErr_NoMemory();
    }
    size_t n = 0;
    int rc;
    STORE_CALL(st, rc, kvx_store_prefix(views, &n, st->s, t.p, t.n, cap));
    kvxpy_tokens_release(&t);
    PyObject *list = NULL;
    if (rc) {
        store_fail(rc);
    } else if ((list = PyList_New((Py_ssize_t)n))) {
        for (size_t i = 0; i < n; i++) {
            PyObject *v = kvxpy_view_new(&views[i]); /* owns views[i], even on failure */
            if (!v) {
                kvx_views_release(views + i + 1, n - i - 1);
                Py_CLEAR(list);
                break;
            }
            PyList_SetItem(list, (Py_ssize_t)i, v); /* steals v */
        }
    } else {
        kvx_views_release(views, n);
    }
    if (views != stackv) PyMem_Free(views);
    return list;
}

/* prefix_read_into(tokens, buffer, stride=None, direct=False) -> int: the
 * longest verified prefix, block i's page read into buffer[i * stride :]
 * (kvx_store_prefix_read: its CRC-32 checked there, at every call); the
 * number served. stride None: page_bytes; as many blocks as the buffer
 * holds (and the tokens). direct: KVX_PREFIX_READ_DIRECT (O_DIRECT into
 * a 4096-aligned buffer, nothing left in the page cache). Bytes past the
 * served blocks are unspecified. One call, the GIL released. */
static PyObject *store_prefix_read_into(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"tokens", "buffer", "stride", "direct", NULL};
    kvxpy_store *st = (kvxpy_store *)self;
    PyObject *tobj, *bobj, *sobj = Py_None;
    int direct = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|Op:prefix_read_into", kwlist, &tobj, &bobj, &sobj, &direct))
        return NULL;
    size_t pb = (size_t)kvx_page_bytes(&st->geom, st->geom.block_tokens), stride = pb;
    if (sobj != Py_None) {
        Py_ssize_t v = PyNumber_AsSsize_t(sobj, PyExc_OverflowError);
        if (v == -1 && PyErr_Occurred()) return NULL;
        if (v < 0) {
            PyErr_Format(PyExc_ValueError, "kvx: prefix_read_into: stride %zd is negative", v);
            return NULL;
        }
        stride = (size_t)v;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(bobj, &buf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    size_t len = (size_t)buf.len, max = stride && len >= pb ? (len - pb) / stride + 1 : 0;
    kvxpy_tokens t;
    if (kvxpy_tokens_get(&t, tobj) < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    size_t n = 0;
    int rc;
    STORE_CALL(st, rc, kvx_store_prefix_read(&n, st->s, t.p, t.n, buf.buf, stride, max, NULL,
                                             direct ? KVX_PREFIX_READ_DIRECT : 0));
    kvxpy_tokens_release(&t);
    PyBuffer_Release(&buf);
    if (rc) return store_fail(rc);
    return PyLong_FromSize_t(n);
}

/* get_hashes(hashes) -> [View or None]: one C call for many hashes; a
 * hash without exactly one verified block gives None (get_hash says why). */
static PyObject *store_get_hashes(PyObject *self, PyObject *arg)
{
    kvxpy_store *st = (kvxpy_store *)self;
    PyObject *seq = kvxpy_tuple(arg, "get_hashes: a sequence of ints");
    if (!seq) return NULL;
    size_t n = (size_t)PyTuple_Size(seq);
    uint64_t *h = PyMem_Malloc((n ? n : 1) * sizeof *h);
    kvx_view *views = PyMem_Malloc((n ? n : 1) * sizeof *views);
    int *status = PyMem_Malloc((n ? n : 1) * sizeof *status);
    PyObject *list = NULL;
    if (!h || !views || !status) {
        PyErr_NoMemory();
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        h[i] = PyLong_AsUnsignedLongLong(PyTuple_GetItem(seq, (Py_ssize_t)i));
        if (h[i] == (uint64_t)-1 && PyErr_Occurred()) goto out;
    }
    int rc;
    STORE_CALL(st, rc, kvx_store_get_hashes(views, status, st->s, h, n));
    if (rc) {
        store_fail(rc);
        goto out;
    }
    list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; i < n; i++) {
        PyObject *v = NULL;
        if (status[i] == 0) {
            v = list ? kvxpy_view_new(&views[i]) : (kvx_view_release(&views[i]), NULL);
            if (!v && list) Py_CLEAR(list);
        } else if (list) {
            v = Py_NewRef(Py_None);
        }
        if (list) PyList_SetItem(list, (Py_ssize_t)i, v); /* steals v */
    }
out:
    Py_DECREF(seq);
    PyMem_Free(h);
    PyMem_Free(views);
    PyMem_Free(status);
    return list;
}

/* export(views, version=1) -> bytes: the views (in order) as one TLKV
 * envelope (kvx_views_export: every page's CRC checked again first). */
static PyObject *store_export(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"views", "version", NULL};
    kvxpy_store *st = (kvxpy_store *)self;
    PyObject *vobj;
    unsigned int version = KVX_ENVELOPE_V1; /* "H" would wrap 65537 to 1 */
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O&:export", kwlist, &vobj, kvxpy_u32_conv, &version)) return NULL;
    if (version > UINT16_MAX) {
        PyErr_Format(PyExc_OverflowError, "kvx: export: version %u is not a u16", version);
        return NULL;
    }
    /* a tuple of its own: a list changed by another thread while the GIL is
     * released must not drop the Views read in C */
    PyObject *seq = PySequence_Tuple(vobj);
    if (!seq) return NULL;
    size_t n = (size_t)PyTuple_Size(seq);
    kvx_view *views = PyMem_Malloc((n ? n : 1) * sizeof *views);
    PyObject *out = NULL;
    size_t pinned = 0;
    if (!views) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        PyObject *o = PyTuple_GetItem(seq, (Py_ssize_t)i);
        if (!PyObject_TypeCheck(o, kvxpy_view_type)) {
            PyErr_Format(PyExc_TypeError, "export: views[%zu] is not a kvx.View", i);
            goto done;
        }
        kvxpy_view *v = (kvxpy_view *)o;
        if (v->released) {
            PyErr_Format(PyExc_ValueError, "export: views[%zu] is released", i);
            goto done;
        }
    }
    /* Each View pinned as a buffer export for the call: a release() from
     * another thread while the GIL is released waits for it to end. */
    for (size_t i = 0; i < n; i++) {
        kvxpy_view *v = (kvxpy_view *)PyTuple_GetItem(seq, (Py_ssize_t)i);
        v->exports++;
        views[i] = v->v; /* borrowed: seq holds every View */
    }
    pinned = n;
    void *buf = NULL;
    size_t len = 0;
    int rc;
    STORE_CALL(st, rc, kvx_views_export(&buf, &len, st->s, views, n, version));
    if (rc) {
        store_fail(rc);
    } else {
        out = PyBytes_FromStringAndSize(buf, (Py_ssize_t)len);
        kvx_free(buf);
    }
done:
    for (size_t i = 0; i < pinned; i++) kvxpy_view_unpin((kvxpy_view *)PyTuple_GetItem(seq, (Py_ssize_t)i));
    Py_DECREF(seq);
    PyMem_Free(views);
    return out;
}

/* _c_prefix_loop(tokens, row_len, passes) -> [seconds per pass]: the
 * benchmark's C reference (bench/bench_python.py). Each pass runs
 * kvx_store_prefix + kvx_views_release over every row of tokens in C, on
 * this handle, as bench/bench_prefix_c.c does. */
static PyObject *store_c_prefix_loop(PyObject *self, PyObject *args)
{
    kvxpy_store *st = (kvxpy_store *)self;
    PyObject *tobj;
    Py_ssize_t row, passes;
    if (!PyArg_ParseTuple(args, "Onn:_c_prefix_loop", &tobj, &row, &passes)) return NULL;
    if (row <= 0 || passes <= 0 || passes > 1000 || !st->geom.block_tokens)
        return kvxpy_raise(KVX_EINVALID, "_c_prefix_loop: bad row length or passes");
    kvxpy_tokens t;
    if (kvxpy_tokens_get(&t, tobj) < 0) return NULL;
    size_t rows = t.n / (size_t)row, cap = (size_t)row / st->geom.block_tokens;
    kvx_view *views = PyMem_Malloc((cap ? cap : 1) * sizeof *views);
    double *secs = PyMem_Malloc((size_t)passes * sizeof *secs);
    int rc = 0;
    if (KVXPY_FORKED(st)) {
        rc = st->s ? KVXPY_FORKED_RC : KVXPY_CLOSED;
    } else if (views && secs) {
        Py_BEGIN_ALLOW_THREADS;
        pthread_rwlock_rdlock(&st->lock);
        for (Py_ssize_t p = 0; p < passes && st->s && !rc; p++) {
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            for (size_t r = 0; r < rows && !rc; r++) {
                size_t n = 0;
                rc = kvx_store_prefix(views, &n, st->s, t.p + r * (size_t)row, (size_t)row, cap);
                kvx_views_release(views, n);
            }
            clock_gettime(CLOCK_MONOTONIC, &b);
            secs[p] = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
        }
        if (!st->s) rc = KVXPY_CLOSED;
        pthread_rwlock_unlock(&st->lock);
        Py_END_ALLOW_THREADS;
    }
    kvxpy_tokens_release(&t);
    PyObject *out = NULL;
    if (!views || !secs) {
        PyErr_NoMemory();
    } else if (rc) {
        store_fail(rc);
    } else if ((out = PyList_New(passes))) {
        for (Py_ssize_t p = 0; out && p < passes; p++) {
            PyObject *f = PyFloat_FromDouble(secs[p]);
            if (!f || PyList_SetItem(out, p, f) < 0) Py_CLEAR(out);
        }
    }
    PyMem_Free(views);
    PyMem_Free(secs);
    return out;
}

/* ---- keyed pages (a keyed store: Store.create(dir, page_bytes=N)) ---------
 *
 * Keys are bytes or str (UTF-8), 1..KVX_KEY_MAX bytes each: libkvx checks
 * them (KVX_EINVALID naming the index). Each call is one C call over the
 * whole list, with the GIL released; the key bytes and page buffers stay
 * pinned by the argument objects (held through the sequence) meanwhile. */

typedef struct {
    PyObject *seq; /* a tuple of the keys: holds every key object */
    kvx_key *k;
    size_t n;
} keyed_keys;

static void keyed_keys_release(keyed_keys *kk)
{
    Py_CLEAR(kk->seq);
    PyMem_Free(kk->k);
    kk->k = NULL;
}

static int keyed_keys_get(keyed_keys *kk, PyObject *obj, const char *what)
{
    memset(kk, 0, sizeof *kk);
    if (PyBytes_Check(obj) || PyUnicode_Check(obj)) { /* one key where a list belongs */
        PyErr_Format(PyExc_TypeError, "kvx: %s: keys is a list of bytes or str keys, not one key", what);
        return -1;
    }
    /* a tuple of its own: the key bytes are read in C with the GIL released,
     * when another thread may change the caller's list */
    kk->seq = PySequence_Tuple(obj);
    if (!kk->seq) return -1;
    kk->n = (size_t)PyTuple_Size(kk->seq);
    kk->k = PyMem_Malloc((kk->n ? kk->n : 1) * sizeof *kk->k);
    if (!kk->k) {
        keyed_keys_release(kk);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < kk->n; i++) {
        PyObject *o = PyTuple_GetItem(kk->seq, (Py_ssize_t)i);
        if (PyBytes_Check(o)) {
            kk->k[i].bytes = PyBytes_AsString(o);
            kk->k[i].len = (size_t)PyBytes_Size(o);
        } else if (PyUnicode_Check(o)) {
            Py_ssize_t len;
            const char *u = PyUnicode_AsUTF8AndSize(o, &len); /* cached in o: lives as long as o */
            if (!u) {
                keyed_keys_release(kk);
                return -1;
            }
            kk->k[i].bytes = u;
            kk->k[i].len = (size_t)len;
        } else {
            PyObject *tn = kvxpy_type_name(o);
            if (tn) PyErr_Format(PyExc_TypeError, "kvx: %s: keys[%zu] is %.80U, not bytes or str", what, i, tn);
            Py_XDECREF(tn);
            keyed_keys_release(kk);
            return -1;
        }
    }
    return 0;
}

/* The page (or target) buffers of a keyed call: one per key. */
typedef struct {
    PyObject *seq;
    Py_buffer *b;
    const void **p;
    size_t *len;
    size_t n, have;
} keyed_bufs;

static void keyed_bufs_release(keyed_bufs *kb)
{
    for (size_t i = 0; i < kb->have; i++) PyBuffer_Release(&kb->b[i]);
    kb->have = 0;
    PyMem_Free(kb->b);
    PyMem_Free(kb->p);
    PyMem_Free(kb->len);
    kb->b = NULL, kb->p = NULL, kb->len = NULL;
    Py_CLEAR(kb->seq);
}

static int keyed_bufs_get(keyed_bufs *kb, PyObject *obj, size_t n, int writable, const char *what)
{
    memset(kb, 0, sizeof *kb);
    kb->seq = kvxpy_tuple(obj, "kvx: a list of buffers, one per key");
    if (!kb->seq) return -1;
    kb->n = (size_t)PyTuple_Size(kb->seq);
    if (kb->n != n) {
        PyErr_Format(PyExc_ValueError, "kvx: %s: %zu keys but %zu buffers", what, n, kb->n);
        Py_CLEAR(kb->seq);
        return -1;
    }
    size_t m = n ? n : 1;
    kb->b = PyMem_Malloc(m * sizeof *kb->b);
    kb->p = PyMem_Malloc(m * sizeof *kb->p);
    kb->len = PyMem_Malloc(m * sizeof *kb->len);
    if (!kb->b || !kb->p || !kb->len) {
        keyed_bufs_release(kb);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        PyObject *o = PyTuple_GetItem(kb->seq, (Py_ssize_t)i);
        /* PyBUF_SIMPLE: C-contiguous bytes, used in place (zero-copy). */
        if (PyObject_GetBuffer(o, &kb->b[i], writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
            PyErr_Clear(); /* the exporter's own message, replaced by one naming the argument */
            PyObject *tn = kvxpy_type_name(o);
            if (tn)
                PyErr_Format(PyExc_TypeError, "kvx: %s: buffers[%zu] (%.80U) is not a contiguous%s buffer", what, i,
                             tn, writable ? " writable" : "");
            Py_XDECREF(tn);
            keyed_bufs_release(kb);
            return -1;
        }
        kb->have++;
        kb->p[i] = kb->b[i].buf;
        kb->len[i] = (size_t)kb->b[i].len;
    }
    return 0;
}

static int keyed_put_args(keyed_keys *kk, keyed_bufs *kb, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "pages", NULL};
    PyObject *keys, *pages;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:keyed_put", kwlist, &keys, &pages)) return -1;
    if (keyed_keys_get(kk, keys, "keyed_put") < 0) return -1;
    if (keyed_bufs_get(kb, pages, kk->n, 0, "keyed_put") < 0) {
        keyed_keys_release(kk);
        return -1;
    }
    return 0;
}

/* keyed_put(keys, pages) -> pages written: page i (any buffer, read in
 * place) under keys[i]; a key already held or pending is skipped. Durable
 * and visible at flush(). */
static PyObject *store_keyed_put(PyObject *self, PyObject *args, PyObject *kw)
{
    kvxpy_store *st = (kvxpy_store *)self;
    keyed_keys kk;
    keyed_bufs kb;
    if (keyed_put_args(&kk, &kb, args, kw) < 0) return NULL;
    size_t n_new = 0;
    int rc = 0;
    STORE_CALL(st, rc, kvx_store_keyed_put(st->s, NULL, kk.k, kb.p, kb.len, kk.n, &n_new));
    keyed_bufs_release(&kb);
    keyed_keys_release(&kk);
    if (rc) return store_fail(rc);
    return PyLong_FromSize_t(n_new);
}

/* keyed_get(keys) -> [View or None]: zero-copy, CRC-checked views; None
 * where the key is not held (or only damaged copies are). */
static PyObject *store_keyed_get(PyObject *self, PyObject *arg)
{
    kvxpy_store *st = (kvxpy_store *)self;
    keyed_keys kk;
    if (keyed_keys_get(&kk, arg, "keyed_get") < 0) return NULL;
    size_t m = kk.n ? kk.n : 1;
    kvx_view *views = PyMem_Calloc(m, sizeof *views);
    int *status = PyMem_Malloc(m * sizeof *status);
    PyObject *list = NULL;
    if (!views || !status) {
        PyErr_NoMemory();
        goto out;
    }
    int rc = 0;
    STORE_CALL(st, rc, kvx_store_keyed_get(views, status, st->s, kk.k, kk.n));
    if (rc) {
        store_fail(rc);
        goto out;
    }
    list = PyList_New((Py_ssize_t)kk.n);
    for (size_t i = 0; i < kk.n; i++) {
        PyObject *v = NULL;
        if (status[i] == 0) {
            /* kvxpy_view_new owns views[i] (releases it on failure) */
            v = list ? kvxpy_view_new(&views[i]) : (kvx_view_release(&views[i]), NULL);
            if (!v && list) Py_CLEAR(list);
        } else {
            kvx_view_release(&views[i]); /* zeroed: a no-op, as the API asks */
            if (list) v = Py_NewRef(Py_None);
        }
        if (list) PyList_SetItem(list, (Py_ssize_t)i, v); /* steals v */
    }
out:
    keyed_keys_release(&kk);
    PyMem_Free(views);
    PyMem_Free(status);
    return list;
}

/* One C pass: get, copy the held pages whose lengths equal their
 * buffers', release the views. Keys go in groups of `group` (n a multiple
 * of it): a group is copied whole or not at all, so a page made of several
 * keys (SGLang's K and V) whose later part is gone leaves every buffer of
 * it untouched. The views of one lookup hold their shards, so no eviction
 * can split a group between the check and the copy. ok[i] = 1 where
 * copied. */
static int keyed_get_into_c(kvx_store *s, const kvx_key *k, size_t n, size_t group, void *const *dst,
                            const size_t *dst_len, kvx_view *views, int *status, uint8_t *ok)
{
    int rc = kvx_store_keyed_get(views, status, s, k, n);
    if (rc) return rc;
    for (size_t g = 0; g < n; g += group) {
        int whole = 1;
        for (size_t i = g; i < g + group; i++) whole = whole && status[i] == 0 && views[i].page_bytes == dst_len[i];
        for (size_t i = g; i < g + group; i++) {
            ok[i] = (uint8_t)whole;
            if (whole) memcpy(dst[i], views[i].page, dst_len[i]);
        }
    }
    kvx_views_release(views, n);
    return 0;
}

/* keyed_read_into(keys, buffers) -> [bool]: reads each held page straight
 * into its writable buffer (kvx_store_keyed_read: its CRC-32 checked there,
 * O_DIRECT into 4096-aligned memory when the page is not cached). Each
 * buffer holds at least the store's page_bytes (kvx.InvalidError
 * otherwise); True when the page was read and its length is the buffer's.
 * False: a key not held leaves its buffer untouched; any other (a damaged
 * page, a read error, a shorter page) leaves it zeroed. One call, the GIL
 * released. */
static PyObject *store_keyed_read_into(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "buffers", NULL};
    kvxpy_store *st = (kvxpy_store *)self;
    PyObject *keys, *bufs;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:keyed_read_into", kwlist, &keys, &bufs)) return NULL;
    keyed_keys kk;
    keyed_bufs kb;
    if (keyed_keys_get(&kk, keys, "keyed_read_into") < 0) return NULL;
    if (keyed_bufs_get(&kb, bufs, kk.n, 1, "keyed_read_into") < 0) {
        keyed_keys_release(&kk);
        return NULL;
    }
    size_t m = kk.n ? kk.n : 1;
    int *status = PyMem_Malloc(m * sizeof *status);
    size_t *lens = PyMem_Malloc(m * sizeof *lens);
    PyObject *list = NULL;
    if (!status || !lens) {
        PyErr_NoMemory();
        goto out;
    }
    int rc = 0;
    STORE_CALL(st, rc, kvx_store_keyed_read(status, lens, st->s, kk.k, kk.n, (void *const *)kb.p, kb.len));
    if (rc) {
        store_fail(rc);
        goto out;
    }
    for (size_t i = 0; i < kk.n; i++) {
        int ok = status[i] == 0 && lens[i] == kb.len[i];
        /* a buffer the read wrote but that is not the page (damage, a read
         * error, a shorter page) is zeroed: it never keeps bad bytes */
        if (!ok && status[i] != KVX_ENOTFOUND) memset((void *)kb.p[i], 0, kb.len[i]);
        status[i] = ok;
    }
    if ((list = PyList_New((Py_ssize_t)kk.n)))
        for (size_t i = 0; i < kk.n; i++) PyList_SetItem(list, (Py_ssize_t)i, PyBool_FromLong(status[i]));
out:
    keyed_bufs_release(&kb);
    keyed_keys_release(&kk);
    PyMem_Free(status);
    PyMem_Free(lens);
    return list;
}

/* keyed_get_into(keys, buffers, group=1) -> [bool]: copies each held page
 * into its (writable) buffer, whose length must be the page's; a miss, or a
 * length that differs, gives False and leaves that buffer untouched. With
 * group > 1, each run of `group` keys is all or nothing (False for all of
 * them, every buffer untouched, when one is missing). */
static PyObject *store_keyed_get_into(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "buffers", "group", NULL};
    kvxpy_store *st = (kvxpy_store *)self;
    PyObject *keys, *bufs;
    Py_ssize_t group = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|n:keyed_get_into", kwlist, &keys, &bufs, &group)) return NULL;
    if (group < 1) {
        PyErr_Format(PyExc_ValueError, "keyed_get_into: group %zd: must be at least 1", group);
        return NULL;
    }
    keyed_keys kk;
    keyed_bufs kb;
    if (keyed_keys_get(&kk, keys, "keyed_get_into") < 0) return NULL;
    if (keyed_bufs_get(&kb, bufs, kk.n, 1, "keyed_get_into") < 0) {
        keyed_keys_release(&kk);
        return NULL;
    }
    if (kk.n % (size_t)group) {
        PyErr_Format(PyExc_ValueError, "keyed_get_into: %zu keys are not groups of %zd", kk.n, group);
        keyed_bufs_release(&kb);
        keyed_keys_release(&kk);
        return NULL;
    }
    size_t m = kk.n ? kk.n : 1;
    kvx_view *views = PyMem_Calloc(m, sizeof *views);
    int *status = PyMem_Malloc(m * sizeof *status);
    uint8_t *ok = PyMem_Calloc(m, 1);
    PyObject *list = NULL;
    if (!views || !status || !ok) {
        PyErr_NoMemory();
        goto out;
    }
    int rc = 0;
    STORE_CALL(st, rc,
               keyed_get_into_c(st->s, kk.k, kk.n, (size_t)group, (void *const *)kb.p, kb.len, views, status, ok));
    if (rc) {
        store_fail(rc);
        goto out;
    }
    if ((list = PyList_New((Py_ssize_t)kk.n)))
        for (size_t i = 0; i < kk.n; i++) PyList_SetItem(list, (Py_ssize_t)i, PyBool_FromLong(ok[i]));
out:
    keyed_bufs_release(&kb);
    keyed_keys_release(&kk);
    PyMem_Free(views);
    PyMem_Free(status);
    PyMem_Free(ok);
    return list;
}

/* keyed_exists(keys) -> ([bool], leading): which keys are held, and how
 * many leading keys of the list are. */
/* keyed_exists / keyed_contains: ([bool], leading). */
static PyObject *keyed_held(PyObject *self, PyObject *arg, int read_pages, const char *what)
{
    kvxpy_store *st = (kvxpy_store *)self;
    keyed_keys kk;
    if (keyed_keys_get(&kk, arg, what) < 0) return NULL;
    uint8_t *held = PyMem_Calloc(kk.n ? kk.n : 1, 1);
    size_t leading = 0;
    PyObject *out = NULL, *list = NULL;
    int rc = 0;
    if (!held) {
        PyErr_NoMemory();
        goto done;
    }
    if (read_pages)
        STORE_CALL(st, rc, kvx_store_keyed_exists(held, &leading, st->s, kk.k, kk.n));
    else
        STORE_CALL(st, rc, kvx_store_keyed_contains(held, &leading, st->s, kk.k, kk.n));
    if (rc) {
        store_fail(rc);
        goto done;
    }
    if (!(list = PyList_New((Py_ssize_t)kk.n))) goto done;
    for (size_t i = 0; i < kk.n; i++) PyList_SetItem(list, (Py_ssize_t)i, PyBool_FromLong(held[i]));
    out = Py_BuildValue("(Nn)", list, (Py_ssize_t)leading);
done:
    keyed_keys_release(&kk);
    PyMem_Free(held);
    return out;
}

static PyObject *store_keyed_exists(PyObject *self, PyObject *arg) { return keyed_held(self, arg, 1, "keyed_exists"); }

static PyObject *store_keyed_contains(PyObject *self, PyObject *arg)
{
    return keyed_held(self, arg, 0, "keyed_contains");
}

/* One C pass under the store's lock: which keys the index names a copy of
 * (sound, or damaged: KVX_EPAGECRC / KVX_ETRUNC, which the delete removes
 * too), then the delete. had[i] = 1 where key i had one. */
static int keyed_delete_each_c(kvx_store *s, const kvx_key *k, size_t n, kvx_view *views, int *status,
                               uint8_t *had, size_t *n_del)
{
    int rc = kvx_store_keyed_get(views, status, s, k, n);
    if (rc) return rc;
    kvx_views_release(views, n);
    for (size_t i = 0; i < n; i++)
        had[i] = (uint8_t)(status[i] == 0 || status[i] == KVX_EPAGECRC || status[i] == KVX_ETRUNC);
    return kvx_store_keyed_delete(s, k, n, n_del);
}

/* keyed_delete(keys, each=False) -> pages deleted (the owner's delete: one
 * catalog edit, durable on return; keys not held are ignored). each=True:
 * [bool] per key instead, True where a copy of it (sound or damaged) was
 * there just before the delete, which removes every such copy. kvx's C
 * delete counts pages, not keys, so this is read in the same call just
 * before: exact unless another thread puts, flushes or deletes that key
 * in between. */
static PyObject *store_keyed_delete(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "each", NULL};
    kvxpy_store *st = (kvxpy_store *)self;
    PyObject *keys;
    int each = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|p:keyed_delete", kwlist, &keys, &each)) return NULL;
    keyed_keys kk;
    if (keyed_keys_get(&kk, keys, "keyed_delete") < 0) return NULL;
    size_t n_del = 0;
    int rc = 0;
    if (!each) {
        STORE_CALL(st, rc, kvx_store_keyed_delete(st->s, kk.k, kk.n, &n_del));
        keyed_keys_release(&kk);
        if (rc) return store_fail(rc);
        return PyLong_FromSize_t(n_del);
    }
    size_t m = kk.n ? kk.n : 1;
    kvx_view *views = PyMem_Calloc(m, sizeof *views);
    int *status = PyMem_Malloc(m * sizeof *status);
    uint8_t *had = PyMem_Calloc(m, 1);
    PyObject *list = NULL;
    if (!views || !status || !had) {
        PyErr_NoMemory();
        goto out;
    }
    STORE_CALL(st, rc, keyed_delete_each_c(st->s, kk.k, kk.n, views, status, had, &n_del));
    if (rc) {
        store_fail(rc);
        goto out;
    }
    if ((list = PyList_New((Py_ssize_t)kk.n)))
        for (size_t i = 0; i < kk.n; i++) PyList_SetItem(list, (Py_ssize_t)i, PyBool_FromLong(had[i]));
out:
    keyed_keys_release(&kk);
    PyMem_Free(views);
    PyMem_Free(status);
    PyMem_Free(had);
    return list;
}

/* Every key the live shards name, as len-prefixed records appended to
 * *out (malloc'd; the caller frees it). One pass under the store's lock,
 * the GIL released: copied here, so no Python object is made while a
 * shard is mapped. */
static int keyed_keys_c(kvx_store *s, uint8_t **out, size_t *out_len)
{
    kvx_shard **sh = NULL;
    size_t n_sh = 0, len = 0, cap = 0;
    uint8_t *buf = NULL;
    int rc = kvx_store_shards(&sh, &n_sh, s);
    if (rc) return rc;
    for (size_t i = 0; i < n_sh && !rc; i++) {
        const kvx_shard_info *inf = kvx_shard_get_info(sh[i]);
        for (uint32_t j = 0; inf && j < inf->num_blocks && !rc; j++) {
            kvx_entry e;
            if (kvx_shard_entry(&e, sh[i], j) || !e.key || !e.key_len || e.key_len > KVX_KEY_MAX) continue;
            if (len + 1 + e.key_len > cap) {
                size_t ncap = cap ? 2 * cap : 4096;
                while (ncap < len + 1 + e.key_len) ncap *= 2;
                uint8_t *nb = realloc(buf, ncap);
                if (!nb) {
                    rc = -ENOMEM;
                    break;
                }
                buf = nb;
                cap = ncap;
            }
            buf[len] = (uint8_t)e.key_len;
            memcpy(buf + len + 1, e.key, e.key_len);
            len += 1 + e.key_len;
        }
    }
    for (size_t i = 0; i < n_sh; i++) kvx_shard_close(sh[i]);
    kvx_free(sh);
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    *out_len = len;
    return 0;
}

/* keyed_keys() -> set of bytes: every key the store's live shards name,
 * held, deleted or replaced alike (keyed_exists and keyed_delete judge
 * each against the index). A shard that cannot be opened now is left out,
 * as kvx_store_shards leaves it: its pages are not served either. */
static PyObject *store_keyed_keys(PyObject *self, PyObject *u)
{
    (void)u;
    kvxpy_store *st = (kvxpy_store *)self;
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc;
    STORE_CALL(st, rc, keyed_keys_c(st->s, &buf, &len));
    if (rc) return store_fail(rc);
    PyObject *set = PySet_New(NULL);
    for (size_t off = 0; set && off < len; off += 1 + buf[off]) {
        PyObject *k = PyBytes_FromStringAndSize((const char *)buf + off + 1, buf[off]);
        if (!k || PySet_Add(set, k) < 0) Py_CLEAR(set);
        Py_XDECREF(k);
    }
    free(buf);
    return set;
}

/* evicted(max=65536) -> (list, dropped): what this handle's evictions
 * removed since the last call, oldest first (kvx_store_evicted): a keyed
 * store's keys as bytes, a block store's block hashes as ints; dropped:
 * how many were removed but not kept (the caller lagged past
 * KVX_EVICTED_MAX, or a victim's entries could not be read back). A
 * reader handle answers ([], 0). The GIL is released for the C call. */
static PyObject *store_evicted(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"max", NULL};
    Py_ssize_t max = (Py_ssize_t)KVX_EVICTED_MAX;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|n:evicted", kwlist, &max)) return NULL;
    if (max < 1 || (size_t)max > KVX_EVICTED_MAX) {
        PyErr_Format(PyExc_ValueError, "kvx: evicted: max is 1..%u, not %zd", KVX_EVICTED_MAX, max);
        return NULL;
    }
    kvxpy_store *st = (kvxpy_store *)self;
    kvx_evicted *ev = PyMem_Malloc((size_t)max * sizeof *ev);
    if (!ev) return PyErr_NoMemory();
    size_t n = 0;
    uint64_t dropped = 0;
    int rc;
    STORE_CALL(st, rc, kvx_store_evicted(st->s, ev, (size_t)max, &n, &dropped));
    if (rc) {
        PyMem_Free(ev);
        return store_fail(rc);
    }
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *o = ev[i].key_len ? PyBytes_FromStringAndSize((const char *)ev[i].key, ev[i].key_len)
                                    : PyLong_FromUnsignedLongLong((unsigned long long)ev[i].hash);
        if (!o) Py_CLEAR(list);
        else if (PyList_SetItem(list, (Py_ssize_t)i, o) < 0) Py_CLEAR(list); /* steals o */
    }
    PyMem_Free(ev);
    if (!list) return NULL;
    PyObject *r = Py_BuildValue("(NK)", list, (unsigned long long)dropped);
    return r;
}

/* ---- stat, verify --------------------------------------------------------- */

static PyObject *store_stat(PyObject *self, PyObject *u)
{
    (void)u;
    kvxpy_store *st = (kvxpy_store *)self;
    kvx_store_stats s;
    int rc;
    STORE_CALL(st, rc, kvx_store_stat(&s, st->s));
    if (rc) return store_fail(rc);
    PyObject *d = Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "blocks",
                         (unsigned long long)s.blocks, "bytes", (unsigned long long)s.bytes, "shards",
                         (unsigned long long)s.shards, "capacity_bytes", (unsigned long long)s.capacity_bytes, "hits",
                         (unsigned long long)s.hits, "misses", (unsigned long long)s.misses, "evictions",
                         (unsigned long long)s.evictions, "evicted_blocks", (unsigned long long)s.evicted_blocks,
                         "compactions", (unsigned long long)s.compactions, "pending_blocks",
                         (unsigned long long)s.pending_blocks, "dropped_shards",
                         (unsigned long long)s.dropped_shards, "shard_bytes", (unsigned long long)s.shard_bytes,
                         "quarantined", (unsigned long long)s.quarantined, "unverified",
                         (unsigned long long)s.unverified, "page_bytes", (unsigned long long)s.page_bytes);
    /* the shared tier's counters (docs/TIER.md) */
    const char *tk[] = {"tier_hits",     "tier_misses",      "tier_errors",   "tier_bad",
                        "tier_replaced", "tier_writes",      "tier_bytes_up", "tier_bytes_down",
                        "tier_up",       "quarantine_bytes", "freed_bytes"};
    const uint64_t tv[] = {s.tier_hits,     s.tier_misses,      s.tier_errors,   s.tier_bad,
                           s.tier_replaced, s.tier_writes,      s.tier_bytes_up, s.tier_bytes_down,
                           s.tier_up,       s.quarantine_bytes, s.freed_bytes};
    for (int i = 0; d && i < 11; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong((unsigned long long)tv[i]);
        if (!v || PyDict_SetItemString(d, tk[i], v) < 0) Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

typedef struct {
    struct problem {
        char *what;
        int code;
    } *p;
    size_t n, cap;
    int oom;
} problems;

static void verify_report(void *ctx, const char *what, int code)
{
    problems *ps = ctx;
    if (ps->oom) return;
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? 2 * ps->cap : 16;
        struct problem *p = realloc(ps->p, cap * sizeof *p);
        if (!p) {
            ps->oom = 1;
            return;
        }
        ps->p = p;
        ps->cap = cap;
    }
    char *w = strdup(what ? what : "");
    if (!w) {
        ps->oom = 1;
        return;
    }
    ps->p[ps->n++] = (struct problem){w, code};
}

static PyObject *store_verify(PyObject *self, PyObject *u)
{
    (void)u;
    kvxpy_store *st = (kvxpy_store *)self;
    problems ps = {NULL, 0, 0, 0};
    uint64_t bad = 0;
    int rc;
    STORE_CALL(st, rc, kvx_store_verify(st->s, &bad, verify_report, &ps));
    PyObject *list = NULL;
    size_t nbad = 0;
    for (size_t i = 0; i < ps.n; i++) nbad += ps.p[i].code != 0;
    if (ps.oom) {
        PyErr_NoMemory();
    } else if (rc && nbad == 0) {
        store_fail(rc); /* the check itself failed */
    } else if ((list = PyList_New(0))) {
        for (size_t i = 0; i < ps.n; i++) {
            if (!ps.p[i].code) continue; /* a note, not a problem */
            PyObject *d = Py_BuildValue("{s:s,s:i,s:s}", "what", ps.p[i].what, "code", ps.p[i].code, "name",
                                        kvx_err_name(ps.p[i].code));
            if (!d || PyList_Append(list, d) < 0) {
                Py_XDECREF(d);
                Py_CLEAR(list);
                break;
            }
            Py_DECREF(d);
        }
    }
    for (size_t i = 0; i < ps.n; i++) free(ps.p[i].what);
    free(ps.p);
    return list;
}

static PyObject *store_geometry(PyObject *self, void *c)
{
    (void)c;
    return kvxpy_geometry_dict(&((kvxpy_store *)self)->geom);
}

static PyObject *store_page_bytes(PyObject *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLongLong(((kvxpy_store *)self)->page_bytes);
}

static PyObject *store_keyed(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(((kvxpy_store *)self)->keyed);
}

static PyObject *store_closed(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(((kvxpy_store *)self)->s == NULL);
}

static PyObject *store_readonly(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(((kvxpy_store *)self)->readonly);
}

/* ---- Batch ------------------------------------------------------------------ */

static PyObject *store_batch(PyObject *self, PyObject *u)
{
    (void)u;
    kvxpy_store *st = (kvxpy_store *)self;
    kvx_store_batch *b = NULL;
    int rc;
    STORE_CALL(st, rc, kvx_store_batch_create(&b, st->s));
    if (rc) return store_fail(rc);
    kvxpy_batch *o = PyObject_New(kvxpy_batch, kvxpy_batch_type);
    if (!o) {
        kvx_store_batch_destroy(b);
        return NULL;
    }
    Py_INCREF(self);
    o->store = st;
    o->b = b;
    pthread_mutex_init(&o->mu, NULL);
    return (PyObject *)o;
}

/* expr runs with the GIL released, the batch's mutex and the store's
 * lock held; a closed store's batch is detached (kvx would answer
 * KVX_EINVALID): misuse, a ValueError as for the store (PY-1). */
#define BATCH_CALL(o, rc, expr) BATCH_CALL_IF(o, rc, 1, expr)
/* need_store 0: also on a batch whose store was closed (its destroy) */
#define BATCH_CALL_IF(o, rc, need_store, expr)                                                           \
    do {                                                                                                 \
        if (KVXPY_FORKED((o)->store)) {                                                                  \
            (rc) = (o)->b ? KVXPY_FORKED_RC : KVXPY_CLOSED;                                              \
            break;                                                                                       \
        }                                                                                                \
        Py_BEGIN_ALLOW_THREADS;                                                                          \
        pthread_mutex_lock(&(o)->mu);                                                                    \
        pthread_rwlock_rdlock(&(o)->store->lock);                                                        \
        (rc) = !(o)->b ? KVXPY_CLOSED : (need_store) && !(o)->store->s ? KVXPY_STORE_GONE : (int)(expr); \
        pthread_rwlock_unlock(&(o)->store->lock);                                                        \
        pthread_mutex_unlock(&(o)->mu);                                                                  \
        Py_END_ALLOW_THREADS;                                                                            \
    } while (0)

static PyObject *batch_fail(int rc)
{
    if (rc == KVXPY_FORKED_RC) return forked_error();
    if (rc == KVXPY_STORE_GONE) {
        PyErr_SetString(PyExc_ValueError, "kvx: the batch's store is closed: its blocks were never acknowledged");
        return NULL;
    }
    return rc == KVXPY_CLOSED ? closed_error("the batch") : kvxpy_raise(rc, NULL);
}

static PyObject *batch_put(PyObject *self, PyObject *args, PyObject *kw)
{
    kvxpy_batch *o = (kvxpy_batch *)self;
    put_args a;
    if (put_args_get(&a, o->store, args, kw) < 0) return NULL;
    size_t n_new = 0;
    int rc;
    const float *sc = a.have_scales ? a.scales.buf : NULL;
    BATCH_CALL(o, rc, kvx_store_batch_put(o->b, a.tok.p, a.tok.n, a.pages.buf, a.n_pages, sc, &n_new));
    put_args_release(&a);
    if (rc) return batch_fail(rc);
    return PyLong_FromSize_t(n_new);
}

static PyObject *batch_put_envelope(PyObject *self, PyObject *args, PyObject *kw)
{
    kvxpy_batch *o = (kvxpy_batch *)self;
    Py_buffer env;
    kvxpy_tokens tok;
    if (env_args_get(args, kw, &env, &tok) < 0) return NULL;
    size_t n_new = 0;
    int rc;
    BATCH_CALL(o, rc, kvx_store_batch_put_envelope(o->b, env.buf, (size_t)env.len, tok.p, tok.n, &n_new));
    PyBuffer_Release(&env);
    kvxpy_tokens_release(&tok);
    if (rc) return batch_fail(rc);
    return PyLong_FromSize_t(n_new);
}

/* Batch.keyed_put(keys, pages) -> pages written, into this batch. */
static PyObject *batch_keyed_put(PyObject *self, PyObject *args, PyObject *kw)
{
    kvxpy_batch *o = (kvxpy_batch *)self;
    keyed_keys kk;
    keyed_bufs kb;
    if (keyed_put_args(&kk, &kb, args, kw) < 0) return NULL;
    size_t n_new = 0;
    int rc = 0;
    BATCH_CALL(o, rc, kvx_store_keyed_put(o->store->s, o->b, kk.k, kb.p, kb.len, kk.n, &n_new));
    keyed_bufs_release(&kb);
    keyed_keys_release(&kk);
    if (rc) return batch_fail(rc);
    return PyLong_FromSize_t(n_new);
}

static PyObject *batch_flush(PyObject *self, PyObject *u)
{
    (void)u;
    kvxpy_batch *o = (kvxpy_batch *)self;
    int rc;
    BATCH_CALL(o, rc, kvx_store_batch_flush(o->b));
    if (rc) return batch_fail(rc);
    Py_RETURN_NONE;
}

static void batch_close_now(kvxpy_batch *o)
{
    int rc;
    if (KVXPY_FORKED(o->store)) /* the parent's batch: destroying it would unlink its staging files */
        o->b = NULL;
    BATCH_CALL_IF(o, rc, 0, (kvx_store_batch_destroy(o->b), o->b = NULL, 0));
    (void)rc;
}

static PyObject *batch_close(PyObject *self, PyObject *u)
{
    (void)u;
    batch_close_now((kvxpy_batch *)self);
    Py_RETURN_NONE;
}

static void batch_dealloc(PyObject *self)
{
    kvxpy_batch *o = (kvxpy_batch *)self;
    if (o->b) batch_close_now(o);
    if (!KVXPY_FORKED(o->store)) pthread_mutex_destroy(&o->mu);
    Py_DECREF(o->store);
    kvxpy_free(self);
}

static PyObject *batch_enter(PyObject *self, PyObject *u)
{
    (void)u;
    if (!((kvxpy_batch *)self)->b) return closed_error("the batch");
    Py_INCREF(self);
    return self;
}

/* A with-block flushes on a normal exit, drops the unflushed blocks on an
 * exception; the batch is closed either way. */
static PyObject *batch_exit(PyObject *self, PyObject *args)
{
    PyObject *et = PyTuple_Size(args) > 0 ? PyTuple_GetItem(args, 0) : Py_None;
    if (et == Py_None) {
        PyObject *r = batch_flush(self, NULL);
        if (!r) {
            batch_close_now((kvxpy_batch *)self); /* no Python call: the flush's exception stays set */
            return NULL;
        }
        Py_DECREF(r);
    }
    batch_close_now((kvxpy_batch *)self);
    Py_RETURN_FALSE;
}

static PyObject *batch_closed(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(((kvxpy_batch *)self)->b == NULL);
}

static PyMethodDef batch_methods[] = {
    {"put", (PyCFunction)(void (*)(void))batch_put, METH_VARARGS | METH_KEYWORDS,
     "put(tokens, pages, scales=None) -> blocks written, into this batch (Store.put's rules)."},
    {"put_envelope", (PyCFunction)(void (*)(void))batch_put_envelope, METH_VARARGS | METH_KEYWORDS,
     "put_envelope(envelope, tokens=None) -> blocks written, into this batch."},
    {"keyed_put", (PyCFunction)(void (*)(void))batch_keyed_put, METH_VARARGS | METH_KEYWORDS,
     "keyed_put(keys, pages) -> pages written, into this batch (Store.keyed_put's rules)."},
    {"flush", batch_flush, METH_NOARGS, "Make this batch's blocks durable and visible (only this batch's)."},
    {"close", batch_close, METH_NOARGS, "Drop the unflushed blocks and free the batch. Idempotent."},
    {"__enter__", batch_enter, METH_NOARGS, NULL},
    {"__exit__", batch_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef batch_getset[] = {
    {"closed", batch_closed, NULL, "True once closed.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot batch_slots[] = {
    {Py_tp_dealloc, batch_dealloc},
    {Py_tp_doc, "A write batch (Store.batch()): one writer's unflushed blocks; its flush acknowledges exactly them. "
                "As a context manager it flushes on a normal exit and drops its blocks on an exception."},
    {Py_tp_methods, batch_methods},
    {Py_tp_getset, batch_getset},
    {0, NULL},
};

/* Made only by Store.batch() (no kvx.Batch()); its attributes are fixed. */
static PyType_Spec batch_spec = {
    "kvx.Batch", sizeof(kvxpy_batch), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION | Py_TPFLAGS_IMMUTABLETYPE, batch_slots,
};

static PyMethodDef store_methods[] = {
    {"create", (PyCFunction)(void (*)(void))store_create, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Store.create(dir, *, num_layers, kv_heads, head_dim, block_tokens, quant='fp16', model_signature=0, "
     "capacity=0, shard_bytes=0, nowait=False, verify=False, nosync=False, holes=False) -> a new store (0 sizes: "
     "the library's defaults). quant: a name from kvx.quant_names() or its number. holes=True: eviction frees "
     "pages in place (KVX_STORE_HOLES, a block store's writer). "
     "Store.create(dir, *, page_bytes=N, capacity=0, ...) -> a new keyed store (no geometry)."},
    {"open", (PyCFunction)(void (*)(void))store_open, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Store.open(dir, *, readonly=False, nowait=False, verify=False, nosync=False, holes=False) -> the store, "
     "recovered. holes=True: a writer that evicts in place (KVX_STORE_HOLES; not with readonly)."},
    {"close", store_close, METH_NOARGS,
     "Close the store (waits for calls in flight); unflushed puts are dropped. Views stay valid. Idempotent."},
    {"__enter__", store_enter, METH_NOARGS, NULL},
    {"__exit__", store_exit, METH_VARARGS, NULL},
    {"put", (PyCFunction)(void (*)(void))store_put, METH_VARARGS | METH_KEYWORDS,
     "put(tokens, pages, scales=None) -> blocks written. pages: any C-contiguous buffer of whole pages "
     "(page_bytes each, layout [K|V][L][Hkv][B][D]): raw bytes, integers of the store's element size (its "
     "bits), or floats of the store's quant only (float16 for fp16); visible and durable after flush()."},
    {"put_envelope", (PyCFunction)(void (*)(void))store_put_envelope, METH_VARARGS | METH_KEYWORDS,
     "put_envelope(envelope, tokens=None) -> blocks written: every full block of a TLKV envelope."},
    {"flush", store_flush, METH_NOARGS, "Make every block put so far durable and visible."},
    {"gc", store_gc, METH_NOARGS, "Evict to capacity and compact."},
    {"reindex", store_reindex, METH_NOARGS, "Rebuild the index from the shards."},
    {"get", store_get, METH_VARARGS, "get(coordinate) -> View."},
    {"get_hash", store_get_hash, METH_VARARGS, "get_hash(hash) -> View (the one verified block holding hash)."},
    {"get_block", store_get_block, METH_O, "get_block(tokens) -> View of the block ending at the last full block."},
    {"get_hashes", store_get_hashes, METH_O,
     "get_hashes(hashes) -> [View or None], one C call; None where get_hash would raise."},
    {"export", (PyCFunction)(void (*)(void))store_export, METH_VARARGS | METH_KEYWORDS,
     "export(views, version=1) -> bytes: the views as one TLKV envelope (pages' CRCs checked again)."},
    {"prefix_read_into", (PyCFunction)(void (*)(void))store_prefix_read_into, METH_VARARGS | METH_KEYWORDS,
     "prefix_read_into(tokens, buffer, stride=None, direct=False) -> int: the longest verified prefix, block i's page "
     "read into buffer[i*stride:] (stride None: page_bytes) and CRC-checked there; the number of blocks served. "
     "direct: O_DIRECT into a 4096-aligned buffer. Bytes past the served blocks are unspecified."},
    {"prefix", (PyCFunction)(void (*)(void))store_prefix, METH_VARARGS | METH_KEYWORDS,
     "prefix(tokens, max_views=None) -> [View]: the longest cached prefix, one C call."},
    {"_c_prefix_loop", store_c_prefix_loop, METH_VARARGS, "Benchmark reference (bench/bench_python.py)."},
    {"keyed_put", (PyCFunction)(void (*)(void))store_keyed_put, METH_VARARGS | METH_KEYWORDS,
     "keyed_put(keys, pages) -> pages written. keys: bytes or str (UTF-8), 1..255 bytes; pages: one buffer per "
     "key (1..page_bytes bytes, read in place); keys already held are skipped. Durable and visible after flush()."},
    {"keyed_get", store_keyed_get, METH_O,
     "keyed_get(keys) -> [View or None]: zero-copy CRC-checked pages, one C call; None where a key is not held."},
    {"keyed_get_into", (PyCFunction)(void (*)(void))store_keyed_get_into, METH_VARARGS | METH_KEYWORDS,
     "keyed_get_into(keys, buffers, group=1) -> [bool]: copies each held page into its writable buffer (lengths "
     "must be equal); False leaves that buffer untouched. group > 1: each run of `group` keys is copied whole or "
     "not at all."},
    {"keyed_read_into", (PyCFunction)(void (*)(void))store_keyed_read_into, METH_VARARGS | METH_KEYWORDS,
     "keyed_read_into(keys, buffers) -> list[bool]: each held page read straight into its writable buffer (at least "
     "page_bytes long) and CRC-checked there (O_DIRECT into 4096-aligned memory when not cached); True when read and "
     "its length is the buffer's. False: untouched when the key is not held, else zeroed (never bad bytes). "
     "Buffers that overlap are refused (kvx.InvalidError)."},
    {"keyed_exists", store_keyed_exists, METH_O,
     "keyed_exists(keys) -> ([bool], leading): which keys are held and how many leading keys are."},
    {"keyed_contains", store_keyed_contains, METH_O,
     "keyed_contains(keys) -> ([bool], leading): as keyed_exists without reading a page (a damaged page is found "
     "when read); each key found counts as a hit and a use."},
    {"keyed_delete", (PyCFunction)(void (*)(void))store_keyed_delete, METH_VARARGS | METH_KEYWORDS,
     "keyed_delete(keys, each=False) -> pages deleted (durable on return; keys not held are ignored). each=True: "
     "[bool] per key, True where a copy of it (sound or damaged) was there and is deleted."},
    {"keyed_keys", store_keyed_keys, METH_NOARGS,
     "keyed_keys() -> set of bytes: every key the live shards name (held, deleted or replaced copies alike)."},
    {"evicted", (PyCFunction)(void (*)(void))store_evicted, METH_VARARGS | METH_KEYWORDS,
     "evicted(max=65536) -> (list, dropped): what this handle's evictions removed since the last call, oldest "
     "first: a keyed store's keys (bytes), a block store's block hashes (int); dropped: removed but not kept."},
    {"stat", store_stat, METH_NOARGS, "stat() -> dict of the store's counters."},
    {"verify", store_verify, METH_NOARGS,
     "verify() -> [{'what', 'code', 'name'}]: every problem found ([] when intact)."},
    {"batch", store_batch, METH_NOARGS, "batch() -> a new write Batch of this (writer) store."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef store_getset[] = {
    {"geometry", store_geometry, NULL, "The store's geometry as a dict.", NULL},
    {"page_bytes", store_page_bytes, NULL, "Bytes of one full block's page (a keyed store: its page size).", NULL},
    {"keyed", store_keyed, NULL, "True for a keyed store (created with page_bytes).", NULL},
    {"closed", store_closed, NULL, "True once closed.", NULL},
    {"readonly", store_readonly, NULL, "True when opened read-only.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot store_slots[] = {
    {Py_tp_dealloc, store_dealloc},
    {Py_tp_doc, "A kvx store (Store.create / Store.open). Safe to share between threads; every call that does "
                "I/O or loops over blocks releases the GIL. A context manager: closes on exit."},
    {Py_tp_methods, store_methods},
    {Py_tp_getset, store_getset},
    {0, NULL},
};

/* Made by Store.create and Store.open only (no kvx.Store()); its attributes are fixed. */
static PyType_Spec store_spec = {
    "kvx.Store", sizeof(kvxpy_store), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION | Py_TPFLAGS_IMMUTABLETYPE, store_slots,
};

PyTypeObject *kvxpy_store_type;
PyTypeObject *kvxpy_batch_type;

int kvxpy_store_types_init(void)
{
    if (!kvxpy_store_type && !(kvxpy_store_type = (PyTypeObject *)PyType_FromSpec(&store_spec))) return -1;
    if (!kvxpy_batch_type && !(kvxpy_batch_type = (PyTypeObject *)PyType_FromSpec(&batch_spec))) return -1;
    return 0;
}
