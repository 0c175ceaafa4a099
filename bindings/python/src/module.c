/*
 * module.c - the module kvx._kvx: errors as exceptions, token arguments,
 * the View type (a served page as a zero-copy buffer) and module-level
 * helpers. The store and its batches are in store.c.
 *
 * Errors: every failing kvx call raises kvx.Error (or the subclass named
 * for its code) carrying .code (KVX_E* or -errno), .name (kvx_err_name)
 * and .message (kvx_last_error, read on the thread that failed, before
 * any other kvx call).
 */
#include "kvxpy.h"

#include <stdio.h>
#include <string.h>

static PyObject *kvxpy_error; /* kvx.Error */

volatile unsigned long kvxpy_fork_gen;

static void kvxpy_atfork_child(void) { kvxpy_fork_gen++; }

int kvxpy_u32_conv(PyObject *obj, void *out)
{
    unsigned long long v;
    if (!kvxpy_u64_conv(obj, &v)) return 0;
    if (v > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "kvx: value out of range 0..2^32-1");
        return 0;
    }
    *(unsigned int *)out = (unsigned int)v;
    return 1;
}

int kvxpy_u64_conv(PyObject *obj, void *out)
{
    PyObject *i = PyNumber_Index(obj); /* an int (or __index__), not a float */
    if (!i) return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(i); /* OverflowError when < 0 or >= 2^64 */
    Py_DECREF(i);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return 0;
    *(unsigned long long *)out = v;
    return 1;
}

/* The subclasses for the codes a caller usually tells apart. */
static struct {
    int code;
    const char *name; /* class name */
    PyObject *type;
} err_classes[] = {
    {KVX_ENOTFOUND, "NotFoundError", NULL},     {KVX_ESHAPE, "ShapeError", NULL},
    {KVX_EMODEL, "ModelError", NULL},           {KVX_EBUSY, "BusyError", NULL},
    {KVX_ECAPACITY, "CapacityError", NULL},     {KVX_EFULL, "FullError", NULL},
    {KVX_EINVALID, "InvalidError", NULL},       {KVX_EQUANT, "QuantError", NULL},
    {KVX_ECORRUPT, "CorruptError", NULL},       {KVX_EPAGECRC, "CorruptError", NULL},
    {KVX_EMETACRC, "CorruptError", NULL},       {KVX_EAMBIGUOUS, "AmbiguousError", NULL},
    {KVX_EUNVERIFIED, "UnverifiedError", NULL}, {KVX_ESTALE, "StaleError", NULL},
    {KVX_EDROPPED, "DroppedError", NULL},
};
#define N_ERR_CLASSES (sizeof err_classes / sizeof err_classes[0])

PyObject *kvxpy_raise(int code, const char *msg)
{
    const char *m = msg ? msg : kvx_last_error();
    if (!m || !*m) m = kvx_strerror(code);
    const char *name = kvx_err_name(code);
    PyObject *type = kvxpy_error;
    for (size_t i = 0; i < N_ERR_CLASSES; i++)
        if (err_classes[i].code == code) type = err_classes[i].type;
    PyObject *message = PyUnicode_DecodeUTF8(m, (Py_ssize_t)strlen(m), "replace");
    PyObject *text = message ? PyUnicode_FromFormat("%s: %U", name, message) : NULL;
    PyObject *exc = text ? PyObject_CallFunctionObjArgs(type, text, NULL) : NULL;
    if (exc) {
        PyObject *c = PyLong_FromLong(code), *n = PyUnicode_FromString(name);
        if (c && n && PyObject_SetAttrString(exc, "code", c) == 0 && PyObject_SetAttrString(exc, "name", n) == 0 &&
            PyObject_SetAttrString(exc, "message", message) == 0)
            PyErr_SetObject(type, exc);
        Py_XDECREF(c);
        Py_XDECREF(n);
        Py_DECREF(exc);
    }
    Py_XDECREF(message);
    Py_XDECREF(text);
    return NULL;
}

/* ---- tokens ------------------------------------------------------------ */

static int int_format(const char *f, int *is_signed)
{
    if (!f) f = "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    if (!f[0] || f[1]) return 0;
    if (!strchr("bBhHiIlLqQnN", f[0])) return 0;
    *is_signed = strchr("bhilqn", f[0]) != NULL;
    return 1;
}

static int tokens_bad(void)
{
    PyErr_SetString(PyExc_TypeError,
                    "kvx: tokens: a buffer of integers (numpy uint32 is used without a copy) or a sequence of ints");
    return -1;
}

int kvxpy_tokens_get(kvxpy_tokens *t, PyObject *obj)
{
    memset(t, 0, sizeof *t);
    if (PyObject_CheckBuffer(obj)) {
        if (PyObject_GetBuffer(obj, &t->buf, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return -1;
        t->have_buf = 1;
        int sgn = 0;
        Py_ssize_t isz = t->buf.itemsize;
        /* 1, 2, 4 or 8 bytes an item only: a C exporter may report an
         * integer format with itemsize 3, 5, 6 or 7, whose items the loop
         * below would read 8 bytes at a time past the buffer's end */
        if (!int_format(t->buf.format, &sgn) || (isz != 1 && isz != 2 && isz != 4 && isz != 8) ||
            (PyBytes_Check(obj) || PyByteArray_Check(obj))) {
            kvxpy_tokens_release(t);
            return tokens_bad();
        }
        size_t n = (size_t)(t->buf.len / t->buf.itemsize);
        t->n = n;
        if (t->buf.itemsize == 4) { /* used in place */
            t->p = t->buf.buf;
            for (size_t i = 0; sgn && i < n; i++)
                if ((int32_t)t->p[i] < 0) { /* int32 -1 (padding) is no token id 2^32-1 */
                    PyErr_Format(PyExc_ValueError, "kvx: tokens[%zu] is not a token id (0..2^32-1)", i);
                    kvxpy_tokens_release(t);
                    return -1;
                }
            return 0;
        }
        t->tmp = PyMem_Malloc(n ? n * sizeof(uint32_t) : 1);
        if (!t->tmp) {
            kvxpy_tokens_release(t);
            PyErr_NoMemory();
            return -1;
        }
        const unsigned char *b = t->buf.buf;
        for (size_t i = 0; i < n; i++) {
            int64_t sv = 0;
            uint64_t uv = 0;
            switch (t->buf.itemsize) {
            case 1: uv = b[i]; sv = (int8_t)b[i]; break;
            case 2: { uint16_t x; memcpy(&x, b + 2 * i, 2); uv = x; sv = (int16_t)x; break; }
            case 8: { uint64_t x; memcpy(&x, b + 8 * i, 8); uv = x; sv = (int64_t)x; break; }
            default: /* refused above; never read with a size it is not */
                kvxpy_tokens_release(t);
                return tokens_bad();
            }
            if ((sgn && (sv < 0 || sv > (int64_t)UINT32_MAX)) || (!sgn && uv > UINT32_MAX)) {
                PyErr_Format(PyExc_ValueError, "kvx: tokens[%zu] is not a token id (0..2^32-1)", i);
                kvxpy_tokens_release(t);
                return -1;
            }
            t->tmp[i] = sgn ? (uint32_t)sv : (uint32_t)uv;
        }
        t->p = t->tmp;
        return 0;
    }
    PyObject *seq = PySequence_Tuple(obj);
    if (!seq) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1; /* raised by the iterable itself */
        PyErr_Clear();
        return tokens_bad();
    }
    Py_ssize_t n = PyTuple_Size(seq);
    t->tmp = PyMem_Malloc(n ? (size_t)n * sizeof(uint32_t) : 1);
    if (!t->tmp) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long v;
        PyObject *item = PyTuple_GetItem(seq, i); /* borrowed */
        if (PyLong_Check(item)) {
            v = PyLong_AsUnsignedLongLong(item);
        } else { /* numpy integer scalars (list(array)) and other __index__ types; not floats */
            PyObject *ix = PyNumber_Index(item);
            v = ix ? PyLong_AsUnsignedLongLong(ix) : (unsigned long long)-1;
            Py_XDECREF(ix);
        }
        if ((v == (unsigned long long)-1 && PyErr_Occurred()) || v > UINT32_MAX) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "kvx: tokens[%zd] is not a token id (0..2^32-1)", i);
            Py_DECREF(seq);
            kvxpy_tokens_release(t);
            return -1;
        }
        t->tmp[i] = (uint32_t)v;
    }
    Py_DECREF(seq);
    t->p = t->tmp;
    t->n = (size_t)n;
    return 0;
}

void kvxpy_tokens_release(kvxpy_tokens *t)
{
    if (t->have_buf) PyBuffer_Release(&t->buf);
    t->have_buf = 0;
    PyMem_Free(t->tmp);
    t->tmp = NULL;
}

/* ---- geometry ----------------------------------------------------------- */

PyObject *kvxpy_geometry_dict(const kvx_geometry *g)
{
    const char *q = kvx_quant_name(g->quant);
    PyObject *quant = q ? PyUnicode_FromString(q) : PyLong_FromUnsignedLong(g->quant);
    if (!quant) return NULL;
    PyObject *d = Py_BuildValue("{s:I,s:I,s:I,s:I,s:N,s:K}", "num_layers", g->num_layers, "kv_heads", g->kv_heads,
                                "head_dim", g->head_dim, "block_tokens", g->block_tokens, "quant", quant,
                                "model_signature", (unsigned long long)g->model_signature);
    return d;
}

int kvxpy_quant_from(uint32_t *out, PyObject *obj)
{
    if (PyLong_Check(obj)) {
        unsigned long v = PyLong_AsUnsignedLong(obj);
        if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
        if (v > UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "kvx: quant out of range");
            return -1;
        }
        *out = (uint32_t)v; /* an unknown number: the library answers KVX_EQUANT */
        return 0;
    }
    Py_ssize_t slen = 0;
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8AndSize(obj, &slen) : NULL;
    if (!s) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "kvx: quant: a name (\"fp16\", ...) or a number");
        return -1;
    }
    for (uint32_t q = 0; q < 256; q++) { /* every quant this libkvx names ("fp16\0x" is none of them) */
        const char *n = kvx_quant_name(q);
        if (n && strlen(n) == (size_t)slen && strcmp(n, s) == 0) {
            *out = q;
            return 0;
        }
    }
    char msg[160]; /* a clearer message than the library's, naming the input */
    snprintf(msg, sizeof msg, "quant \"%.60s\": not a quant this kvx knows (kvx.quant_names())", s);
    return kvxpy_raise(KVX_EQUANT, msg), -1;
}

/* ---- View --------------------------------------------------------------- */

PyTypeObject *kvxpy_view_type;

PyObject *kvxpy_type_name(PyObject *o)
{
    return PyObject_GetAttrString((PyObject *)Py_TYPE(o), "__name__");
}

PyObject *kvxpy_tuple(PyObject *obj, const char *msg)
{
    if (PyTuple_CheckExact(obj)) return Py_NewRef(obj); /* immutable: its own already */
    PyObject *it = PyObject_GetIter(obj);
    if (!it) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) { /* not iterable */
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, msg);
        }
        return NULL;
    }
    PyObject *t = PySequence_Tuple(it); /* what the iteration raises passes through */
    Py_DECREF(it);
    return t;
}

void kvxpy_free(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_Free(self);
    Py_DECREF(tp);
}

PyObject *kvxpy_view_new(const kvx_view *v)
{
    kvxpy_view *o = PyObject_New(kvxpy_view, kvxpy_view_type);
    if (!o) {
        kvx_view tmp = *v;
        kvx_view_release(&tmp);
        return NULL;
    }
    o->v = *v;
    o->exports = 0;
    o->released = 0;
    o->freed = 0;
    return (PyObject *)o;
}

static void view_free_now(kvxpy_view *o)
{
    if (!o->freed) {
        kvx_view_release(&o->v);
        o->freed = 1;
    }
}

static int view_live(kvxpy_view *o)
{
    if (o->released) {
        PyErr_SetString(PyExc_ValueError, "kvx: operation on a released View");
        return 0;
    }
    return 1;
}

static void view_dealloc(PyObject *self)
{
    view_free_now((kvxpy_view *)self); /* no export can be left: each holds a reference */
    kvxpy_free(self);
}

static int view_getbuffer(PyObject *self, Py_buffer *b, int flags)
{
    kvxpy_view *o = (kvxpy_view *)self;
    if (!view_live(o)) {
        b->obj = NULL;
        return -1;
    }
    if (PyBuffer_FillInfo(b, self, (void *)o->v.page, (Py_ssize_t)o->v.page_bytes, 1, flags) < 0) return -1;
    o->exports++;
    return 0;
}

void kvxpy_view_unpin(kvxpy_view *o)
{
    if (--o->exports == 0 && o->released) view_free_now(o);
}

static void view_releasebuffer(PyObject *self, Py_buffer *b)
{
    (void)b;
    kvxpy_view_unpin((kvxpy_view *)self);
}

static PyObject *view_release(PyObject *self, PyObject *unused)
{
    (void)unused;
    kvxpy_view *o = (kvxpy_view *)self;
    o->released = 1;
    if (o->exports == 0) view_free_now(o); /* else when the last export goes */
    Py_RETURN_NONE;
}

static PyObject *view_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    if (!view_live((kvxpy_view *)self)) return NULL;
    Py_INCREF(self);
    return self;
}

static PyObject *view_exit(PyObject *self, PyObject *args)
{
    (void)args;
    return view_release(self, NULL);
}

static PyObject *view_page(PyObject *self, void *c)
{
    (void)c;
    if (!view_live((kvxpy_view *)self)) return NULL;
    return PyMemoryView_FromObject(self);
}

static PyObject *view_scales(PyObject *self, void *c)
{
    (void)c;
    kvxpy_view *o = (kvxpy_view *)self;
    if (!view_live(o)) return NULL;
    if (!o->v.scales) Py_RETURN_NONE;
    const kvx_shard_info *in = kvx_shard_get_info(o->v.shard);
    uint64_t n = in ? kvx_scale_count(&in->geometry) : 0;
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)o->v.scales, (Py_ssize_t)(n * sizeof(float)));
    if (!bytes) return NULL;
    PyObject *mv = PyMemoryView_FromObject(bytes);
    Py_DECREF(bytes);
    if (!mv) return NULL;
    PyObject *f = PyObject_CallMethod(mv, "cast", "s", "f");
    Py_DECREF(mv);
    return f;
}

#define VIEW_FIELD(fname, conv, expr)                          \
    static PyObject *view_##fname(PyObject *self, void *c)    \
    {                                                         \
        (void)c;                                              \
        kvxpy_view *o = (kvxpy_view *)self;                   \
        if (!view_live(o)) return NULL;                       \
        return conv(expr);                                    \
    }
VIEW_FIELD(coordinate, PyLong_FromUnsignedLong, o->v.coordinate)
VIEW_FIELD(token_count, PyLong_FromUnsignedLong, o->v.token_count)
VIEW_FIELD(hash, PyLong_FromUnsignedLongLong, o->v.hash)
VIEW_FIELD(entry, PyLong_FromUnsignedLong, o->v.entry)
VIEW_FIELD(page_bytes, PyLong_FromUnsignedLongLong, o->v.page_bytes)

static PyObject *view_released(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(((kvxpy_view *)self)->released);
}

static Py_ssize_t view_len(PyObject *self)
{
    kvxpy_view *o = (kvxpy_view *)self;
    if (!view_live(o)) return -1;
    return (Py_ssize_t)o->v.page_bytes;
}

static PyObject *view_repr(PyObject *self)
{
    kvxpy_view *o = (kvxpy_view *)self;
    if (o->released) return PyUnicode_FromString("<kvx.View released>");
    char buf[128];
    snprintf(buf, sizeof buf, "<kvx.View coordinate=0x%08x tokens=%u hash=0x%016llx bytes=%llu>",
             (unsigned)o->v.coordinate, (unsigned)o->v.token_count, (unsigned long long)o->v.hash,
             (unsigned long long)o->v.page_bytes);
    return PyUnicode_FromString(buf);
}

static PyMethodDef view_methods[] = {
    {"release", view_release, METH_NOARGS,
     "Release the view: later access raises ValueError. Buffers exported from it (memoryviews, numpy arrays) "
     "keep the page mapped until they are released themselves. Idempotent."},
    {"__enter__", view_enter, METH_NOARGS, NULL},
    {"__exit__", view_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef view_getset[] = {
    {"page", view_page, NULL, "The page: a read-only zero-copy memoryview of the mapped shard.", NULL},
    {"scales", view_scales, NULL, "FP8 scales (L*2*Hkv floats, a copy) or None when all are 1.0.", NULL},
    {"coordinate", view_coordinate, NULL, "Coordinate: shard << 24 | block << 8 | spectral.", NULL},
    {"token_count", view_token_count, NULL, "Tokens in the block.", NULL},
    {"hash", view_hash, NULL, "The block's chained FNV-1a 64 hash.", NULL},
    {"entry", view_entry, NULL, "Entry index within its shard.", NULL},
    {"page_bytes", view_page_bytes, NULL, "Bytes of the page.", NULL},
    {"released", view_released, NULL, "True once release() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot view_slots[] = {
    {Py_tp_dealloc, view_dealloc},
    {Py_tp_repr, view_repr},
    {Py_sq_length, view_len},
    {Py_bf_getbuffer, view_getbuffer},
    {Py_bf_releasebuffer, view_releasebuffer},
    {Py_tp_doc, "A block served from the store: its page as a zero-copy read-only buffer (memoryview(v), "
                "np.frombuffer(v, dtype)), valid until release(), the with-block's end or garbage collection. "
                "The view holds its shard: it stays readable after the store is closed or the shard evicted."},
    {Py_tp_methods, view_methods},
    {Py_tp_getset, view_getset},
    {0, NULL},
};

/* Made only by the store (no kvx.View()); its attributes are fixed. */
static PyType_Spec view_spec = {
    "kvx.View", sizeof(kvxpy_view), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION | Py_TPFLAGS_IMMUTABLETYPE, view_slots,
};

/* ---- module ------------------------------------------------------------- */

static PyObject *mod_version(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    return PyUnicode_FromString(kvx_version());
}

static PyObject *mod_quant_names(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    PyObject *d = PyDict_New();
    for (uint32_t q = 0; d && q < 256; q++) {
        const char *n = kvx_quant_name(q);
        if (!n) continue;
        PyObject *v = PyLong_FromUnsignedLong(q);
        if (!v || PyDict_SetItemString(d, n, v) < 0) {
            Py_XDECREF(v);
            Py_CLEAR(d);
            break;
        }
        Py_DECREF(v);
    }
    return d;
}

static PyObject *mod_block_hashes(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *tok;
    unsigned int bt;
    if (!PyArg_ParseTuple(args, "OO&:block_hashes", &tok, kvxpy_u32_conv, &bt)) return NULL;
    if (bt == 0) return kvxpy_raise(KVX_EINVALID, "block_hashes: block_tokens is 0");
    kvxpy_tokens t;
    if (kvxpy_tokens_get(&t, tok) < 0) return NULL;
    size_t nb = t.n / bt;
    uint64_t *h = PyMem_Malloc(nb ? nb * sizeof *h : 1);
    PyObject *list = h ? PyList_New((Py_ssize_t)nb) : PyErr_NoMemory();
    if (list) {
        kvx_block_hashes(h, t.p, t.n, bt);
        for (size_t i = 0; i < nb; i++) {
            PyObject *v = PyLong_FromUnsignedLongLong(h[i]);
            if (!v) {
                Py_CLEAR(list);
                break;
            }
            PyList_SetItem(list, (Py_ssize_t)i, v); /* steals v */
        }
    }
    PyMem_Free(h);
    kvxpy_tokens_release(&t);
    return list;
}

static PyObject *mod_strerror(PyObject *m, PyObject *args)
{
    (void)m;
    int code;
    if (!PyArg_ParseTuple(args, "i:strerror", &code)) return NULL;
    return PyUnicode_FromString(kvx_strerror(code));
}

static PyObject *mod_err_name(PyObject *m, PyObject *args)
{
    (void)m;
    int code;
    if (!PyArg_ParseTuple(args, "i:err_name", &code)) return NULL;
    return PyUnicode_FromString(kvx_err_name(code));
}

static PyMethodDef mod_methods[] = {
    {"version", mod_version, METH_NOARGS, "libkvx's version string."},
    {"quant_names", mod_quant_names, METH_NOARGS, "{name: number} of every quant this libkvx knows."},
    {"block_hashes", mod_block_hashes, METH_VARARGS,
     "block_hashes(tokens, block_tokens) -> the chained hash of every full block."},
    {"strerror", mod_strerror, METH_VARARGS, "strerror(code) -> kvx_strerror's message."},
    {"err_name", mod_err_name, METH_VARARGS, "err_name(code) -> \"KVX_ENOTFOUND\", \"ENOSPC\", ..."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kvx_module = {
    PyModuleDef_HEAD_INIT, "kvx._kvx",
    "The C extension behind the kvx package (import kvx, not this).", -1, mod_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kvx(void)
{
    if (!kvxpy_view_type && !(kvxpy_view_type = (PyTypeObject *)PyType_FromSpec(&view_spec))) return NULL;
    if (kvxpy_store_types_init() < 0) return NULL;
    static int atfork_done;
    if (!atfork_done && pthread_atfork(NULL, NULL, kvxpy_atfork_child) == 0) atfork_done = 1;
    PyObject *m = PyModule_Create(&kvx_module);
    if (!m) return NULL;
    kvxpy_error = PyErr_NewExceptionWithDoc(
        "kvx.Error",
        "A kvx failure: .code (a KVX_E* value, or a negative errno passed through from the OS), .name "
        "(\"KVX_ENOTFOUND\", \"ENOSPC\", ...) and .message (the library's message: the field and the problem).",
        NULL, NULL);
    if (!kvxpy_error || PyModule_AddObjectRef(m, "Error", kvxpy_error) < 0) goto fail;
    for (size_t i = 0; i < N_ERR_CLASSES; i++) {
        PyObject *t = PyObject_GetAttrString(m, err_classes[i].name);
        if (!t) {
            PyErr_Clear();
            char qual[64];
            snprintf(qual, sizeof qual, "kvx.%s", err_classes[i].name);
            t = PyErr_NewException(qual, kvxpy_error, NULL);
            if (!t || PyModule_AddObjectRef(m, err_classes[i].name, t) < 0) goto fail;
        }
        err_classes[i].type = t; /* the module keeps it alive */
        Py_DECREF(t);
    }
#define KVXPY_ADD_CODE_(name, value, msg) \
    if (PyModule_AddIntConstant(m, #name, value) < 0) goto fail;
    KVX_ERROR_MAP(KVXPY_ADD_CODE_)
#undef KVXPY_ADD_CODE_
    if (PyModule_AddObjectRef(m, "Store", (PyObject *)kvxpy_store_type) < 0 ||
        PyModule_AddObjectRef(m, "Batch", (PyObject *)kvxpy_batch_type) < 0 ||
        PyModule_AddObjectRef(m, "View", (PyObject *)kvxpy_view_type) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
