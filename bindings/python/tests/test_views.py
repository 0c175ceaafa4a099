"""View lifetimes: released views raise; exported buffers (memoryviews,
numpy arrays) and views outlive what they came from without reading freed
memory; a view reads the mapped shard itself (zero-copy)."""
import gc

import pytest

import kvx
from conftest import GEOM, as_array, kv_pages, needs_numpy, np, run_child, seq_tokens


# PROMISE: PY-2
def test_released_view_raises(filled):
    st, toks, _ = filled
    v = st.prefix(toks)[0]
    v.release()
    assert v.released
    with pytest.raises(ValueError):
        memoryview(v)
    with pytest.raises(ValueError):
        bytes(v)
    with pytest.raises(ValueError):
        v.page
    with pytest.raises(ValueError):
        v.hash
    v.release()  # idempotent
    assert "released" in repr(v)


# PROMISE: PY-2
def test_context_manager_releases(filled):
    st, toks, pages = filled
    with st.prefix(toks)[1] as v:
        assert bytes(v) == pages[1].tobytes()
    assert v.released
    with pytest.raises(ValueError):
        bytes(v)


# PROMISE: PY-2
def test_release_waits_for_exports(filled):
    st, toks, pages = filled
    v = st.prefix(toks)[0]
    a = memoryview(v).cast("H")  # fp16 bits
    m = v.page
    v.release()  # new access refused at once ...
    with pytest.raises(ValueError):
        memoryview(v)
    st.close()  # ... while the exported buffers stay mapped
    gc.collect()
    assert a.tobytes() == pages[0].tobytes() and m.tobytes() == pages[0].tobytes()
    m.release()
    assert a.tobytes() == pages[0].tobytes()
    a.release()  # the last export: the kvx_view goes now
    with pytest.raises(ValueError):
        memoryview(v)


@needs_numpy
def test_numpy_arrays_keep_a_released_view_mapped(filled):
    """np.frombuffer over a View: zero-copy, read-only, refused once the view is released, and a live array
    keeps the page mapped after release() and the store's close."""
    st, toks, pages = filled
    v = st.prefix(toks)[0]
    a = np.frombuffer(v, dtype=np.float16)
    assert not a.flags.writeable and not a.flags.owndata
    v.release()
    with pytest.raises(ValueError):
        np.frombuffer(v, dtype=np.uint8)
    st.close()
    gc.collect()
    assert np.array_equal(a.view(np.uint16), as_array(pages, st)[0].reshape(-1).view(np.uint16))
    del a


# PROMISE: STORE-5, PY-2
def test_view_outlives_store_close(filled):
    st, toks, pages = filled
    views = st.prefix(toks)
    st.close()
    with pytest.raises(ValueError):
        st.prefix(toks)
    for i, v in enumerate(views):  # each view holds its shard, as in C
        assert bytes(v) == pages[i].tobytes()
    for v in views:
        v.release()


# PROMISE: PY-2
def test_view_outlives_store_object(tmp_path):
    st = kvx.Store.create(str(tmp_path / "s"), **GEOM)
    toks = seq_tokens(0, 2)
    pages = kv_pages(st, 2)
    st.put(toks, pages)
    st.flush()
    views = st.prefix(toks)
    del st  # garbage collection closes the store
    gc.collect()
    assert bytes(views[1]) == pages[1].tobytes()


# PROMISE: PY-2
def test_dropped_views_are_released(filled):
    st, toks, _ = filled
    for _ in range(200):
        st.prefix(toks)  # views collected at once (refcount)
    arrs = [memoryview(v) for v in st.prefix(toks)]  # views live on in the memoryviews
    gc.collect()
    assert all(a.nbytes == st.page_bytes for a in arrs)


# PROMISE: PY-2
@needs_numpy
def test_view_buffers_outlive_store_and_release(tmp_path):
    d = str(tmp_path / "s")
    st = kvx.Store.create(d, **GEOM, nosync=True)
    toks, pages = seq_tokens(0, 4), None
    pages = as_array(kv_pages(st, 4), st)
    st.put(toks, pages)
    st.flush()
    vs = st.prefix(toks)
    assert len(vs) == 4
    mv = vs[0].page
    arr = np.frombuffer(vs[1], dtype=np.float16)
    st.close()
    st.close()  # idempotent
    for v in vs:
        v.release()
        v.release()  # idempotent
        assert v.released
        with pytest.raises(ValueError, match="released"):
            memoryview(v)
        with pytest.raises(ValueError, match="released"):
            v.coordinate
        with pytest.raises(ValueError, match="released"):
            len(v)
        with pytest.raises(ValueError, match="released"):
            v.__enter__()
    del vs
    gc.collect()
    # the buffers taken before the release still hold the shard mapping
    assert bytes(mv) == pages[0].tobytes()
    assert np.array_equal(arr.view(np.uint16), pages[1].reshape(-1).view(np.uint16))
    with pytest.raises(TypeError):
        mv[0] = 1  # read-only
    assert not arr.flags.writeable
    with pytest.raises(ValueError):
        arr.setflags(write=True)


# PROMISE: PY-2
def test_view_buffers_survive_truncated_shard(tmp_path):
    # someone truncates the shard file under a live buffer: kvx's SIGBUS
    # guard must turn the lost pages into zeros, never kill the process
    rc, out = run_child(f"""
        import glob, os, kvx
        from conftest import GEOM, seq_tokens, kv_pages
        d = {str(tmp_path / "s")!r}
        st = kvx.Store.create(d, **GEOM, nosync=True)
        toks = seq_tokens(0, 4); st.put(toks, kv_pages(st, 4)); st.flush()
        vs = st.prefix(toks); mv = memoryview(vs[3]); st.close()
        for f in glob.glob(d + "/shards/*"):
            os.truncate(f, 0)
        assert bytes(mv) == bytes(len(mv)), "expected zero pages"
        print("OK")
    """)
    assert rc == 0 and "OK" in out, out



def test_view_buffers_outlive_store_and_release_without_numpy(tmp_path):
    """test_view_buffers_outlive_store_and_release with a memoryview cast to fp16 bits where it takes a numpy
    array."""
    st = kvx.Store.create(str(tmp_path / "s"), **GEOM, nosync=True)
    toks, pages = seq_tokens(0, 4), kv_pages(st, 4)
    st.put(toks, pages)
    st.flush()
    vs = st.prefix(toks)
    assert len(vs) == 4
    mv = vs[0].page
    arr = memoryview(vs[1]).cast("H")
    st.close()
    st.close()
    for v in vs:
        v.release()
        v.release()
        assert v.released
        with pytest.raises(ValueError, match="released"):
            memoryview(v)
        with pytest.raises(ValueError, match="released"):
            v.coordinate
        with pytest.raises(ValueError, match="released"):
            len(v)
        with pytest.raises(ValueError, match="released"):
            v.__enter__()
    del vs
    gc.collect()
    assert bytes(mv) == pages[0].tobytes()
    assert arr.tobytes() == pages[1].tobytes() and arr.format == "H" and len(arr) == st.page_bytes // 2
    with pytest.raises(TypeError):
        mv[0] = 1  # read-only
    with pytest.raises(TypeError):
        arr[0] = 1
    assert mv.readonly and arr.readonly
