"""Page and scale buffers given to put: whole pages only, C-contiguous only,
elements of the store's size (raw bytes or integer bits pass; a float
format must be the store's quant), more pages than full blocks refused,
scales float32 of the right count."""
import array

import pytest

import kvx
from conftest import B, GEOM, as_array, kv_pages, needs_numpy, np, rand_bytes, seq_tokens


# PROMISE: PY-6
@needs_numpy
def test_page_buffers_misuse(store):
    toks, pages = seq_tokens(1, 4), as_array(kv_pages(store, 4), store)
    raw = pages.tobytes()
    with pytest.raises(ValueError, match="whole number"):
        store.put(toks, raw[:-1])
    with pytest.raises(ValueError, match="whole number"):
        store.put(toks, raw + b"\x00")
    with pytest.raises((ValueError, BufferError), match="contiguous"):
        store.put(toks, np.repeat(pages, 2, axis=0)[::2])  # non-contiguous: never read with the wrong stride
    with pytest.raises(TypeError):
        store.put(toks, 1234)
    with pytest.raises(TypeError):
        store.put(toks, "a str is no buffer")
    with pytest.raises(kvx.Error) as e:
        store.put(toks[: B + 1], raw)  # more pages than full blocks of tokens
    assert e.value.name == "KVX_ETOKENS" and "n_pages" in e.value.message
    with pytest.raises(ValueError, match="scales"):
        store.put(toks, raw, scales=b"\x00" * 3)
    # fp32 KV given to an fp16 store, with tokens for twice the blocks: was
    # cut into 8 "pages" of garbage stored under blocks 0..7's hashes
    long_toks = seq_tokens(1, 8)
    with pytest.raises(ValueError, match="4-byte elements"):
        store.put(long_toks, pages.astype(np.float32))
    assert store.prefix(long_toks) == []
    assert store.put(toks, b"") == 0
    # a float format must be the store's quant ('e' for fp16, little-endian): big-endian float16 has other
    # bytes (bf16 and the reverse: test_bf16.py test_float16_kv_refused_by_a_bf16_store)
    with pytest.raises(ValueError, match=r"format '>e' \(big-endian float16\), the store's quant is fp16"):
        store.put(toks, pages.astype(">f2"))
    assert store.prefix(toks) == []
    assert store.put(toks, pages.view(np.uint16)) == 4  # the store's element size as integer bits: passes
    store.flush()
    assert store.put(toks, memoryview(raw)) == 0  # raw bytes, read-only: fine (held already)
    store.flush()
    assert [bytes(v) for v in store.prefix(toks)] == [p.tobytes() for p in pages]


# PROMISE: PY-6
@needs_numpy
def test_scales_of_the_wrong_dtype(tmp_path):
    st = kvx.Store.create(str(tmp_path / "f8"), **dict(GEOM, quant="e4m3"), nosync=True)
    toks = seq_tokens(2, 2)
    pages = np.random.default_rng(1).integers(0, 0x7E, (2, st.page_bytes), dtype=np.uint8)
    ns = 2 * GEOM["num_layers"] * GEOM["kv_heads"]
    with pytest.raises(ValueError, match="not float32"):  # the right byte count, read as float32: garbage
        st.put(toks, pages, scales=np.full(2 * ns // 2, 0.5, dtype=np.float64))
    with pytest.raises(ValueError, match="not float32"):
        st.put(toks, pages, scales=np.full(2 * ns, 0.5, dtype=np.float64))
    with pytest.raises(ValueError, match="scales holds"):
        st.put(toks, pages, scales=np.full(2 * ns - 1, 0.5, dtype=np.float32))
    assert st.put(toks, pages, scales=np.full(2 * ns, 0.5, dtype=np.float32)) == 2
    st.flush()
    vs = st.prefix(toks)
    assert [list(v.scales) for v in vs] == [[0.5] * ns] * 2
    st.close()



def test_page_buffers_misuse_without_numpy(store):
    """test_page_buffers_misuse with bytes, memoryviews and the array module. Not here: a big-endian float16
    buffer, which only numpy (or torch) makes."""
    toks, pages = seq_tokens(1, 4), kv_pages(store, 4)
    raw = pages.tobytes()
    with pytest.raises(ValueError, match="whole number"):
        store.put(toks, raw[:-1])
    with pytest.raises(ValueError, match="whole number"):
        store.put(toks, raw + b"\x00")
    with pytest.raises((ValueError, BufferError), match="contiguous"):
        store.put(toks, memoryview(bytes(x for b in raw for x in (b, 0)))[::2])  # strided: never read as is
    with pytest.raises(TypeError):
        store.put(toks, 1234)
    with pytest.raises(TypeError):
        store.put(toks, "a str is no buffer")
    with pytest.raises(kvx.Error) as e:
        store.put(toks[: B + 1], raw)
    assert e.value.name == "KVX_ETOKENS" and "n_pages" in e.value.message
    with pytest.raises(ValueError, match="scales"):
        store.put(toks, raw, scales=b"\x00" * 3)
    long_toks = seq_tokens(1, 8)
    with pytest.raises(ValueError, match="4-byte elements"):
        store.put(long_toks, array.array("f", [0.5]) * (len(raw) // 2))  # fp32 KV: twice the bytes
    assert store.prefix(long_toks) == []
    assert store.put(toks, b"") == 0
    assert store.prefix(toks) == []
    assert store.put(toks, array.array("H", raw)) == 4  # the store's element size as integer bits: passes
    store.flush()
    assert store.put(toks, memoryview(raw)) == 0  # raw bytes, read-only: fine (held already)
    store.flush()
    assert [bytes(v) for v in store.prefix(toks)] == [p.tobytes() for p in pages]


def test_scales_of_the_wrong_dtype_without_numpy(tmp_path):
    """test_scales_of_the_wrong_dtype with the array module: float64 scales refused (the right byte count
    too), a wrong count refused, float32 scales stored and served."""
    st = kvx.Store.create(str(tmp_path / "f8"), **dict(GEOM, quant="e4m3"), nosync=True)
    toks = seq_tokens(2, 2)
    pages = bytes(rand_bytes(1, 2 * st.page_bytes).translate(bytes(x % 0x7E for x in range(256))))
    ns = 2 * GEOM["num_layers"] * GEOM["kv_heads"]
    with pytest.raises(ValueError, match="not float32"):
        st.put(toks, pages, scales=array.array("d", [0.5] * (2 * ns // 2)))
    with pytest.raises(ValueError, match="not float32"):
        st.put(toks, pages, scales=array.array("d", [0.5] * (2 * ns)))
    with pytest.raises(ValueError, match="scales holds"):
        st.put(toks, pages, scales=array.array("f", [0.5] * (2 * ns - 1)))
    assert st.put(toks, pages, scales=array.array("f", [0.5] * (2 * ns))) == 2
    st.flush()
    vs = st.prefix(toks)
    assert [list(v.scales) for v in vs] == [[0.5] * ns] * 2
    assert [bytes(v) for v in vs] == [pages[:st.page_bytes], pages[st.page_bytes:]]
    st.close()
