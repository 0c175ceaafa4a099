"""TLKV envelopes through the binding: put_envelope refuses garbage by a kvx
error, export refuses views of another store's geometry, released views and
non-Views, checks the version's range, and reads its views safely while
other threads release them or change the caller's list."""
import threading

import pytest

import kvx
from conftest import kv_pages, rand_bytes, seq_tokens


# PROMISE: PY-9
def test_garbage_envelopes(filled):
    st, toks, _ = filled
    env = st.export(st.prefix(toks))
    bad = [b"", b"\x00", env[:-1], env[:40], env + b"\x00", bytes(len(env)),
           bytes(rand_bytes(5, len(env)))]
    hdr = bytearray(env)
    hdr[8:12] = b"\xff\xff\xff\xff"  # somewhere in the header: a huge count or dimension
    bad.append(bytes(hdr))
    for b in bad:
        with pytest.raises(kvx.Error) as e:
            st.put_envelope(b)
        assert e.value.code < 0 and e.value.message
    with pytest.raises(TypeError):
        st.put_envelope("str")
    assert st.put_envelope(env, toks) == 0  # the real one: held already


# PROMISE: PY-9
def test_export_refuses_foreign_and_released_views(tmp_path, filled):
    st, toks, _ = filled
    other = kvx.Store.create(str(tmp_path / "other"), num_layers=2, kv_heads=2, head_dim=8, block_tokens=16,
                             nosync=True)
    t2 = seq_tokens(3, 1)
    other.put(t2, kv_pages(other, 1))
    other.flush()
    ov = other.prefix(t2)
    with pytest.raises(kvx.ShapeError):
        st.export(ov)  # pages of another size: refused, never read at this store's size
    vs = st.prefix(toks)
    vs[1].release()
    with pytest.raises(ValueError, match="released"):
        st.export(vs)
    with pytest.raises(TypeError, match="not a kvx.View"):
        st.export([vs[0], b"x"])
    with pytest.raises(TypeError):
        st.export(5)
    good = st.prefix(toks)
    assert st.export(good, version=1) == st.export(good)
    for bad in (65537, -1, 2**32 + 1):  # 65537 was exported as version 1
        with pytest.raises(OverflowError):
            st.export(good, version=bad)
    with pytest.raises(kvx.Error) as e:
        st.export(good, version=9)
    assert e.value.name == "KVX_EVERSION"
    other.close()


# PROMISE: PY-9
def test_export_while_other_threads_release_and_mutate(filled):
    # export reads its views in C with the GIL released: a release() or a
    # change of the caller's list from another thread meanwhile must neither
    # free a view under it nor drop a View object it reads
    st, toks, pages = filled
    env = st.export(st.prefix(toks))
    stop = threading.Event()
    shared = st.prefix(toks)
    failures = []

    def churn():
        while not stop.is_set():
            vs = st.prefix(toks)
            shared[:] = vs
            for v in vs:
                v.release()

    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(300):
            try:
                out = st.export(shared)
            except ValueError as e:  # a view released before the call took it
                assert "released" in str(e)
                continue
            if out != env:
                failures.append(len(out))
    finally:
        stop.set()
        t.join()
    assert not failures
