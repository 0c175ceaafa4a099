"""Errors as exceptions carrying the kvx code, name and message."""
import pytest

import kvx
from conftest import GEOM, kv_pages, seq_tokens


# PROMISE: PY-1
def test_bad_geometry(tmp_path):
    with pytest.raises(kvx.InvalidError) as e:
        kvx.Store.create(str(tmp_path / "s"), **dict(GEOM, num_layers=0))
    err = e.value
    assert isinstance(err, kvx.Error)
    assert err.code == kvx.EINVALID and err.name == "KVX_EINVALID"
    assert "num_layers" in err.message and str(err).startswith("KVX_EINVALID: ")
    with pytest.raises(TypeError):
        kvx.Store.create(str(tmp_path / "s2"), num_layers=1)


# PROMISE: PY-1
def test_readonly_put(filled, tmp_path):
    st, toks, pages = filled
    st.close()
    with kvx.Store.open(str(tmp_path / "store"), readonly=True) as ro:
        with pytest.raises(kvx.InvalidError) as e:
            ro.put(toks, pages)
        assert e.value.code == kvx.EINVALID and "READONLY" in e.value.message
        with pytest.raises(kvx.InvalidError):
            ro.batch()


# PROMISE: STORE-14, PY-1
def test_busy_and_missing(store, tmp_path):
    with pytest.raises(kvx.BusyError) as e:
        kvx.Store.open(str(tmp_path / "store"), nowait=True)
    assert e.value.code == kvx.EBUSY
    with pytest.raises(kvx.Error) as e:
        kvx.Store.open(str(tmp_path / "missing"))
    assert e.value.code < 0 and e.value.name == kvx.err_name(e.value.code)


# PROMISE: PY-1
def test_closed_store(store):
    store.close()
    store.close()  # idempotent
    for call in (lambda: store.flush(), lambda: store.stat(), lambda: store.prefix([1] * 16), lambda: store.batch()):
        with pytest.raises(ValueError):
            call()


# PROMISE: PY-1
def test_stat_and_verify(filled, tmp_path):
    st, toks, _ = filled
    s = st.stat()
    assert s["blocks"] == 4 and s["shards"] == 1 and s["pending_blocks"] == 0
    st.prefix(toks)
    assert st.stat()["hits"] >= 4
    st.put(seq_tokens(5, 2), kv_pages(st, 2, seed=5))
    assert st.stat()["pending_blocks"] == 2
    st.flush()
    assert st.verify() == []
    st.close()
    # damage the last page of a shard: verify names it
    shard = sorted((tmp_path / "store" / "shards").iterdir())[0]
    data = bytearray(shard.read_bytes())
    data[len(data) - 4096] ^= 0xFF
    shard.write_bytes(bytes(data))
    with kvx.Store.open(str(tmp_path / "store")) as again:
        probs = again.verify()
        assert probs and all(p["code"] < 0 and p["name"] == kvx.err_name(p["code"]) for p in probs)
        assert any(p["code"] == kvx.EPAGECRC for p in probs), probs
