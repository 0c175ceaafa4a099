"""Store round trips: put, flush and the lookups, byte-exact; the handles
refuse pickling, copying and construction."""
import array
import copy
import ctypes
import importlib
import pickle

import pytest

import kvx
from conftest import B, GEOM, as_array, kv_pages, needs_numpy, np, rand_bytes, seq_tokens


def test_import():
    assert kvx.__version__ == kvx.version()
    assert kvx.quant_names()["fp16"] == 0
    assert kvx.ENOTFOUND == -30005 and kvx.err_name(kvx.ENOTFOUND) == "KVX_ENOTFOUND"
    assert "ENGINES.md" in importlib.import_module("kvx.integrations").__doc__
    assert importlib.import_module("kvx.integrations.lmcache").KvxConnector
    assert importlib.import_module("kvx.integrations.sglang").KvxHiCacheStorage


# PROMISE: DUR-1
def test_round_trip_prefix(filled):
    st, toks, pages = filled
    views = st.prefix(toks)
    assert len(views) == 4
    for i, v in enumerate(views):
        assert v.token_count == B and v.page_bytes == st.page_bytes and len(v) == st.page_bytes
        assert bytes(v) == pages[i].tobytes() and bytes(v.page) == pages[i].tobytes()  # byte-exact
        assert memoryview(v).cast("H").tolist() == array.array("H", pages[i]).tolist()  # fp16 bits
    assert [v.hash for v in views] == kvx.block_hashes(toks, B)


# PROMISE: PY-23
def test_prefix_read_into(filled):
    """prefix_read_into: the blocks prefix() serves, each page read into the buffer at its stride (an mmap:
    4096-aligned, as a pinned host slot is) and checked there, through the page cache or O_DIRECT; a buffer
    shorter than the prefix bounds it; a read-only buffer or a stride under page_bytes is refused."""
    import mmap
    st, toks, pages = filled
    PB = st.page_bytes
    slab = mmap.mmap(-1, 8 * PB)
    for direct in (False, True):
        slab[:] = b"\xee" * (8 * PB)
        assert st.prefix_read_into(toks, slab, direct=direct) == 4
        for i in range(4):
            assert slab[i * PB:(i + 1) * PB] == pages[i].tobytes()
        assert st.prefix_read_into(toks, memoryview(slab)[:2 * PB + 1], direct=direct) == 2
        assert st.prefix_read_into(toks, slab, stride=2 * PB, direct=direct) == 4
        for i in range(4):
            assert slab[2 * i * PB:(2 * i + 1) * PB] == pages[i].tobytes()
    other = seq_tokens(9, 4)
    assert st.prefix_read_into(other, slab) == 0
    assert st.prefix_read_into(list(toks[:B * 2]) + list(other[B * 2:]), slab) == 2
    with pytest.raises(BufferError):
        st.prefix_read_into(toks, bytes(4 * PB))  # read-only
    with pytest.raises(kvx.InvalidError, match="dst_stride"):
        st.prefix_read_into(toks, slab, stride=PB - 1)
    slab.close()


@needs_numpy
def test_round_trip_prefix_as_numpy(filled):
    """np.frombuffer(view, float16) reshaped to the page's [K|V][L][Hkv][B][D] is the page put."""
    st, toks, pages = filled
    pages = as_array(pages, st)
    for i, v in enumerate(st.prefix(toks)):
        got = np.frombuffer(v, dtype=np.float16).reshape(pages.shape[1:])
        assert np.array_equal(got.view(np.uint16), pages[i].view(np.uint16))


# PROMISE: PY-2
@needs_numpy
def test_zero_copy(filled):
    st, toks, _ = filled
    v = st.prefix(toks)[0]
    a = np.frombuffer(v, dtype=np.uint8)
    b = np.frombuffer(v, dtype=np.uint8)
    assert not a.flags.owndata and not a.flags.writeable
    assert a.__array_interface__["data"][0] == b.__array_interface__["data"][0]  # the same mapped bytes
    m = v.page
    assert m.readonly and m.nbytes == st.page_bytes
    with pytest.raises(TypeError):
        m[0] = 1


class _PyBuffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


def buffer_address(obj):
    """The address of obj's buffer, read through PyObject_GetBuffer (the C API's Py_buffer, Include/pybuffer.h)."""
    view = _PyBuffer()
    ctypes.pythonapi.PyObject_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
    ctypes.pythonapi.PyBuffer_Release.argtypes = [ctypes.POINTER(_PyBuffer)]
    assert ctypes.pythonapi.PyObject_GetBuffer(obj, ctypes.byref(view), 0) == 0
    try:
        return view.buf, view.readonly
    finally:
        ctypes.pythonapi.PyBuffer_Release(ctypes.byref(view))


def test_zero_copy_without_numpy(filled):
    """test_zero_copy through the C API (ctypes): every buffer of a view is the same read-only bytes, the
    page's; the memoryviews read them in place."""
    st, toks, _ = filled
    v = st.prefix(toks)[0]
    a, b = memoryview(v), memoryview(v)
    assert buffer_address(v) == buffer_address(a) == buffer_address(b) == (buffer_address(v)[0], 1)
    assert a.readonly and a.nbytes == st.page_bytes and a.obj is v
    m = v.page
    assert m.readonly and m.nbytes == st.page_bytes and buffer_address(m) == buffer_address(v)
    with pytest.raises(TypeError):
        m[0] = 1


def test_partial_prefix_and_max_views(filled):
    st, toks, _ = filled
    other = array.array("I", toks)
    other[2 * B + 3] ^= 0x5A5A  # the third block differs
    assert len(st.prefix(other)) == 2
    assert len(st.prefix(toks, max_views=3)) == 3
    assert st.prefix(seq_tokens(9, 4)) == []


# PROMISE: PY-5
def test_token_kinds(store):
    toks = seq_tokens(1, 2)
    pages = kv_pages(store, 2, seed=1)
    # a list of ints, int64 (array 'q'), array('I'), a memoryview and bytes pages all work
    assert store.put(toks.tolist(), pages.tobytes()) == 2
    store.flush()
    for t in (toks, array.array("q", toks), toks.tolist(), memoryview(toks)):
        assert len(store.prefix(t)) == 2
    with pytest.raises(TypeError):
        store.prefix(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError):
        store.prefix([-1] * 32)


def test_get_block_hash_coordinate(filled):
    st, toks, pages = filled
    v = st.get_block(toks[: 3 * B])
    assert bytes(v) == pages[2].tobytes()
    h = st.get_hash(v.hash)
    assert h.coordinate == v.coordinate and bytes(h) == bytes(v)
    c = st.get(v.coordinate)
    assert c.hash == v.hash
    with pytest.raises(kvx.NotFoundError):
        st.get_hash(12345)


def test_put_skips_held_blocks(filled):
    st, toks, pages = filled
    assert st.put(toks, pages) == 0
    with pytest.raises(ValueError):
        st.put(toks, pages.tobytes()[:-1])  # not a whole number of pages


def test_quant_by_name_and_number(tmp_path):
    names = kvx.quant_names()
    for name, number in names.items():
        for q in (name, number):
            d = tmp_path / f"{name}-{q}"
            with kvx.Store.create(str(d), **GEOM, quant=q) as st:
                assert st.geometry["quant"] == name
                assert st.page_bytes == 2 * 1 * 2 * B * 8 * (1 if name.startswith("e") else 2)
                toks = seq_tokens(3, 1)
                pages = rand_bytes(3, st.page_bytes)
                if name.startswith("e"):
                    pages = pages.translate(bytes(x & 0x77 for x in range(256)))  # finite FP8 bytes
                st.put(toks, pages)
                st.flush()
                assert bytes(st.prefix(toks)[0]) == pages
    with pytest.raises(kvx.QuantError) as e:
        kvx.Store.create(str(tmp_path / "bad"), **GEOM, quant="fp7")
    assert e.value.code == kvx.EQUANT


def test_reopen_readonly(filled, tmp_path):
    st, toks, pages = filled
    st.close()
    assert st.closed
    with kvx.Store.open(str(tmp_path / "store"), readonly=True) as ro:
        assert ro.readonly
        assert b"".join(bytes(v) for v in ro.prefix(toks)) == pages.tobytes()


def test_get_hashes(filled):
    st, toks, pages = filled
    hashes = kvx.block_hashes(toks, B)
    got = st.get_hashes(hashes + [777])
    assert got[-1] is None
    assert [bytes(v) for v in got[:-1]] == [p.tobytes() for p in pages]


def test_export_and_put_envelope(filled, tmp_path):
    st, toks, pages = filled
    env = st.export(st.prefix(toks), version=1)  # v1: f16, lossless from an fp16 store
    assert env[:4] and isinstance(env, bytes)
    with kvx.Store.create(str(tmp_path / "other"), **GEOM) as other:
        assert other.put_envelope(env, toks) == 4
        other.flush()
        assert b"".join(bytes(v) for v in other.prefix(toks)) == pages.tobytes()
        with pytest.raises(kvx.Error):
            other.put_envelope(env[:-1])
    released = st.prefix(toks)[0]
    released.release()
    with pytest.raises(ValueError):
        st.export([released])


def test_handles_refuse_pickle_copy_and_construction(filled):
    st, toks, _ = filled
    v = st.prefix(toks)[0]
    b = st.batch()
    for obj in (st, v, b):
        with pytest.raises(TypeError):
            pickle.dumps(obj)
        with pytest.raises(TypeError):
            copy.copy(obj)
        with pytest.raises(TypeError):
            copy.deepcopy(obj)
    for cls in (kvx.Store, kvx.View, kvx.Batch):
        with pytest.raises(TypeError):
            cls()
    b.close()
    v.release()
