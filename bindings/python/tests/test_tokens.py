"""Token arguments: buffers of 1, 2, 4 or 8-byte integers (4: read in place)
or sequences of ints, every other kind refused by name; ids out of
0..2^32-1 refused, never wrapped; strided buffers refused, never read with
the wrong stride; an exception raised by the caller's iterable passes
through. numpy dtypes where numpy is installed, the array module, ctypes
and memoryviews everywhere."""
import array
import ctypes

import pytest

import kvx
from conftest import B, kv_pages, needs_numpy, np, np_param


@pytest.mark.parametrize("bad", [
    [-1] * 16, [2**32] * 16, [1.5] * 16, ["a"] * 16, [None] * 16, [2**70] * 16,
    np_param(lambda np: np.full(16, -1, dtype=np.int64), "np-int64"),
    np_param(lambda np: np.full(16, 2**32, dtype=np.uint64), "np-uint64"),
    np_param(lambda np: np.full(16, -1, dtype=np.int32), "np-int32"),
    np_param(lambda np: np.full(16, -7, dtype=np.int16), "np-int16"),
    # the same buffers from the array module (formats l, L, i, h: numpy's for those dtypes)
    pytest.param(array.array("l", [-1] * 16), id="array-l"), pytest.param(array.array("L", [2**32] * 16), id="array-L"),
    pytest.param(array.array("i", [-1] * 16), id="array-i"), pytest.param(array.array("h", [-7] * 16), id="array-h"),
])
# PROMISE: PY-5
def test_tokens_out_of_range_rejected(filled, bad):
    st, _, _ = filled
    with pytest.raises(ValueError, match="not a token id"):
        st.prefix(bad)
    with pytest.raises(ValueError, match="not a token id"):
        kvx.block_hashes(bad, B)


# PROMISE: PY-5
@needs_numpy
def test_int32_padding_token_is_not_2_32_minus_1(filled):
    # an int32 token array padded with -1 must not be read as id 2^32-1 (it
    # was, in place, while a list or an int64 array with -1 was refused)
    st, _, _ = filled
    t = np.full(B, 0xFFFFFFFF, dtype=np.uint32)
    st.put(t, kv_pages(st, 1, seed=9))
    st.flush()
    assert len(st.prefix(t)) == 1
    with pytest.raises(ValueError, match=r"tokens\[0\]"):
        st.prefix(t.view(np.int32))
    with pytest.raises(ValueError, match=r"tokens\[0\]"):
        st.get_block(t.view(np.int32))


@pytest.mark.parametrize("bad", [
    np_param(lambda np: np.zeros(16, dtype=np.float32), "np-float32"),
    np_param(lambda np: np.zeros(16, dtype=">u4"), "np->u4"),
    b"\x00" * 64, bytearray(64), 12345, None, object(),
    # numpy-free buffers of the same refused kinds: float32 (array 'f') and big-endian uint32 (ctypes '>I')
    pytest.param(array.array("f", [0.0] * 16), id="array-f"),
    pytest.param((ctypes.c_uint32.__ctype_be__ * 16)(), id="ctypes->I"),
])
# PROMISE: PY-5
def test_tokens_wrong_type_rejected(filled, bad):
    st, _, _ = filled
    with pytest.raises(TypeError, match="tokens"):
        st.prefix(bad)


def _lying_memoryview(data, itemsize):
    """(memoryview of bytearray data, format 'b', whose own Py_buffer says itemsize bytes an item, the address
    of that itemsize field), or None where this interpreter's layout is not found. A C exporter may report an
    integer format with itemsize 3, 5, 6 or 7; pure Python cannot make one (memoryview.cast, numpy, array and
    ctypes keep format and itemsize consistent), so the view's Py_buffer is patched through ctypes: its
    fields buf, obj, len, itemsize follow each other (Include/pybuffer.h)."""
    m = memoryview(data).cast("b")
    pin = (ctypes.c_char * len(data)).from_buffer(data)
    buf = ctypes.addressof(pin)
    del pin
    w = ctypes.sizeof(ctypes.c_size_t)
    for off in range(0, min(m.__sizeof__(), 512) - 4 * w + 1, w):
        f = (ctypes.c_size_t * 4).from_address(id(m) + off)
        if f[0] == buf and f[2] == len(data) and f[3] == 1:
            ctypes.c_ssize_t.from_address(id(m) + off + 3 * w).value = itemsize
            return m, id(m) + off + 3 * w
    m.release()
    return None


# PROMISE: PY-5
@pytest.mark.parametrize("itemsize", [3, 5, 6, 7])
def test_tokens_odd_integer_item_size_refused(filled, itemsize):
    # an integer buffer of itemsize 3/5/6/7 was read 8 bytes an item: n = len/itemsize items, 8*n bytes, past
    # the buffer's end (an ASan heap-buffer-overflow). Only sizes 1, 2, 4 and 8 are read.
    st, _, _ = filled
    got = _lying_memoryview(bytearray(24), itemsize)
    if got is None:
        pytest.skip("this interpreter's memoryview layout was not found")
    m, field = got
    try:
        assert m.itemsize == itemsize and m.format == "b"
        with pytest.raises(TypeError, match="tokens"):
            st.prefix(m)
        with pytest.raises(TypeError, match="tokens"):
            kvx.block_hashes(m, B)
    finally:
        ctypes.c_ssize_t.from_address(field).value = 1
        m.release()


@pytest.mark.parametrize("form", [np_param(lambda np, t=t: getattr(np, t), "np-" + t) for t in (
    "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")] + [
    "b", "B", "h", "H", "i", "I", "l", "L", "q", "Q"])
# PROMISE: PY-5
def test_tokens_every_integer_item_size(form):
    # item sizes 1, 2, 4 and 8 (numpy dtypes, array module codes) all read as the same token ids
    want = kvx.block_hashes(array.array("I", range(2 * B)), B)
    toks = array.array(form, range(2 * B)) if isinstance(form, str) else np.arange(2 * B, dtype=form)
    assert kvx.block_hashes(toks, B) == want
    assert kvx.block_hashes(memoryview(toks), B) == want


# PROMISE: PY-5
@needs_numpy
def test_tokens_non_contiguous_and_odd_forms(filled):
    st, toks, pages = filled
    toks = np.asarray(toks)  # the fixture's array('I') as a numpy uint32 array
    wide = np.repeat(toks, 2)
    with pytest.raises((ValueError, BufferError), match="contiguous"):
        st.prefix(wide[::2])  # refused, never read with the wrong stride
    assert len(st.prefix(np.ascontiguousarray(wide[::2]))) == 4
    assert len(st.prefix(list(toks))) == 4  # numpy integer scalars
    assert len(st.prefix(toks.tolist())) == 4
    assert len(st.prefix(toks.astype(np.int64))) == 4
    assert len(st.prefix(tuple(int(x) for x in toks))) == 4
    assert st.prefix([]) == [] and st.prefix(np.zeros(0, np.uint32)) == []
    assert st.prefix(toks[: B - 1]) == []
    assert len(st.prefix(toks, max_views=2**62)) == 4
    assert st.prefix(toks, max_views=0) == []
    assert len(st.prefix(toks, max_views=None)) == 4  # the documented default (was a TypeError)
    with pytest.raises(ValueError, match="negative"):
        st.prefix(toks, max_views=-5)  # was: no limit
    with pytest.raises(OverflowError):
        st.prefix(toks, max_views=2**64)
    with pytest.raises(TypeError):
        st.prefix(toks, max_views=1.5)


def test_exception_inside_token_iterable_propagates(filled):
    st, _, _ = filled

    def gen():
        yield 1
        raise KeyError("from the caller's generator")

    with pytest.raises(KeyError, match="caller"):
        st.prefix(gen())
    with pytest.raises(KeyError, match="caller"):
        st.put(gen(), b"")



def test_int32_padding_token_is_not_2_32_minus_1_without_numpy(filled):
    """test_int32_padding_token_is_not_2_32_minus_1 with the array module: ids 0xFFFFFFFF in place, the same
    bytes as int32 (-1) refused, naming the index."""
    st, _, _ = filled
    t = array.array("I", [0xFFFFFFFF] * B)
    st.put(t, kv_pages(st, 1, seed=9))
    st.flush()
    assert len(st.prefix(t)) == 1
    as_int32 = array.array("i", t.tobytes())
    with pytest.raises(ValueError, match=r"tokens\[0\]"):
        st.prefix(as_int32)
    with pytest.raises(ValueError, match=r"tokens\[0\]"):
        st.get_block(memoryview(t).cast("B").cast("i"))


def test_tokens_non_contiguous_and_odd_forms_without_numpy(filled):
    """test_tokens_non_contiguous_and_odd_forms with array('I'), memoryviews and lists: a strided memoryview is
    refused, its contiguous copy read; lists, tuples, int64 (array 'q') and empty forms; max_views' range."""
    st, toks, pages = filled
    wide = array.array("I", (x for x in toks for _ in range(2)))
    with pytest.raises((ValueError, BufferError), match="contiguous"):
        st.prefix(memoryview(wide)[::2])  # refused, never read with the wrong stride
    assert len(st.prefix(array.array("I", memoryview(wide)[::2].tolist()))) == 4
    assert len(st.prefix(list(toks))) == 4
    assert len(st.prefix(toks.tolist())) == 4
    assert len(st.prefix(array.array("q", toks))) == 4
    assert len(st.prefix(tuple(int(x) for x in toks))) == 4
    assert st.prefix([]) == [] and st.prefix(array.array("I")) == []
    assert st.prefix(toks[: B - 1]) == []
    assert len(st.prefix(toks, max_views=2**62)) == 4
    assert st.prefix(toks, max_views=0) == []
    assert len(st.prefix(toks, max_views=None)) == 4
    with pytest.raises(ValueError, match="negative"):
        st.prefix(toks, max_views=-5)
    with pytest.raises(OverflowError):
        st.prefix(toks, max_views=2**64)
    with pytest.raises(TypeError):
        st.prefix(toks, max_views=1.5)
