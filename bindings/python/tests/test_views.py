"""View lifetimes: released views raise; exported buffers and views outlive
what they came from without reading freed memory."""
import gc

import numpy as np
import pytest

import kvx


def test_released_view_raises(filled):
    st, toks, _ = filled
    v = st.prefix(toks)[0]
    v.release()
    assert v.released
    with pytest.raises(ValueError):
        memoryview(v)
    with pytest.raises(ValueError):
        np.frombuffer(v, dtype=np.uint8)
    with pytest.raises(ValueError):
        v.page
    with pytest.raises(ValueError):
        v.hash
    v.release()  # idempotent
    assert "released" in repr(v)


def test_context_manager_releases(filled):
    st, toks, pages = filled
    with st.prefix(toks)[1] as v:
        assert bytes(v) == pages[1].tobytes()
    assert v.released
    with pytest.raises(ValueError):
        bytes(v)


def test_release_waits_for_exports(filled):
    st, toks, pages = filled
    v = st.prefix(toks)[0]
    a = np.frombuffer(v, dtype=np.float16)
    m = v.page
    v.release()  # new access refused at once ...
    with pytest.raises(ValueError):
        memoryview(v)
    st.close()  # ... while the exported buffers stay mapped
    gc.collect()
    assert a.tobytes() == pages[0].tobytes() and m.tobytes() == pages[0].tobytes()
    m.release()
    assert a.tobytes() == pages[0].tobytes()
    del a  # the last export: the kvx_view goes now


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


def test_view_outlives_store_object(tmp_path):
    from conftest import GEOM, kv_pages, seq_tokens
    st = kvx.Store.create(str(tmp_path / "s"), **GEOM)
    toks = seq_tokens(0, 2)
    pages = kv_pages(st, 2)
    st.put(toks, pages)
    st.flush()
    views = st.prefix(toks)
    del st  # garbage collection closes the store
    gc.collect()
    assert bytes(views[1]) == pages[1].tobytes()


def test_dropped_views_are_released(filled):
    st, toks, _ = filled
    for _ in range(200):
        st.prefix(toks)  # views collected at once (refcount)
    arrs = [np.frombuffer(v, dtype=np.uint8) for v in st.prefix(toks)]  # views live on in the arrays
    gc.collect()
    assert all(a.size == st.page_bytes for a in arrs)
