"""The LMCache connector names its store by the namespace helper the SGLang adapter uses (_common.namespace):
model, revision, dtype, chunk size, layout; a changed one opens another store and never reads this one's pages
(issue 37, point 4)."""
import json
import os

import pytest

import kvx
from conftest import rand_bytes
from kvx.integrations import _common
from kvx.integrations.lmcache import KvxConnector
from lmcache_driver import load_native_plugin
from test_lmcache import PB, config, drain_until

NS = {"model": "meta-llama/Llama-3.1-8B", "revision": "0e9e39f2", "dtype": "bfloat16", "chunk_size": 256,
      "layout": "kv_first"}


def put_get(c, key, data=None):
    """Store data under key (when given), then -> the page's bytes or None."""
    if data is not None:
        f = c.submit_batch_set([key], [memoryview(data)])
        assert drain_until(c, [f])[f][1]
    out = bytearray(len(data) if data is not None else PB)
    f = c.submit_batch_get([key], [memoryview(out)])
    return bytes(out) if drain_until(c, [f])[f][3] == [True] else None


# PROMISE: ENGINE-28
def test_namespace_names_and_records_the_store(tmp_path):
    """Through LMCache's native_plugin loader: the namespace params name the directory
    (path/<model>_rank<N>_<digest16>) and are recorded in the store; the same params after a restart find the
    pages; a changed revision, dtype, chunk size or layout opens another store that does not hold them."""
    data = rand_bytes(7, PB)
    a = load_native_plugin(config(tmp_path / "l2", **NS))
    try:
        d = a.client.dir
        digest, rec = _common.namespace({"engine": "lmcache", "page_bytes": PB, **NS})
        assert os.path.basename(d) == f"meta-llama-Llama-3.1-8B_rank0_{digest}"
        assert _common.read_namespace(a.client._store) == rec
        assert json.loads(rec)["revision"] == "0e9e39f2"
    finally:
        a.close()
    with KvxConnector(path=str(tmp_path / "l2"), page_bytes=PB, nosync=True, **NS) as c:
        assert c.dir == d and put_get(c, "k", data) == data
    with KvxConnector(path=str(tmp_path / "l2"), page_bytes=PB, nosync=True, **NS) as c:  # a restart
        assert c.dir == d and put_get(c, "k") == data
    dirs = {d}
    for change in ({"revision": "ffff0000"}, {"dtype": "float16"}, {"chunk_size": 512}, {"layout": "layer_first"},
                   {"namespace": {"tp_size": 2}}):
        with KvxConnector(path=str(tmp_path / "l2"), page_bytes=PB, nosync=True, **dict(NS, **change)) as c:
            assert c.dir not in dirs, change
            dirs.add(c.dir)
            assert put_get(c, "k") is None, change  # never this namespace's page


# PROMISE: ENGINE-28
def test_hand_named_store_of_another_namespace_refused(tmp_path):
    """A hand-named directory (per_rank_path) records the namespace it was made under: the same opens it, another
    is refused with kvx.ShapeError (KVX_ESHAPE) and reads nothing; no namespace params: path/rank<N> as before."""
    d = str(tmp_path / "mine")
    with KvxConnector(path=d, per_rank_path=True, page_bytes=PB, nosync=True, **NS) as c:
        put_get(c, "k", rand_bytes(8, PB))
    with KvxConnector(path=d, per_rank_path=True, page_bytes=PB, nosync=True, **NS) as c:
        assert put_get(c, "k") is not None
    with pytest.raises(kvx.ShapeError) as e:
        KvxConnector(path=d, per_rank_path=True, page_bytes=PB, nosync=True, **dict(NS, revision="other"))
    assert e.value.code == kvx.ESHAPE and "another namespace" in str(e.value)
    with KvxConnector(path=str(tmp_path / "plain"), page_bytes=PB, nosync=True) as c:
        assert c.dir == str(tmp_path / "plain" / "rank0") and c.namespace is None
    with pytest.raises(ValueError):
        KvxConnector(path=str(tmp_path / "nopb"), nosync=True, **NS)  # page_bytes is part of the namespace


# PROMISE: ENGINE-28
def test_namespace_record_outlives_eviction(tmp_path):
    """The record is written once, so it sits in the oldest shard, which eviction drops first. Found by an
    attack: after enough sets the store held rev-A's pages but no record, and a hand-named directory reopened
    under rev-B took it for a store from before namespaces and served rev-A's pages. Each flush now puts the
    record again when its eviction took it: the store still records rev-A, and rev-B is refused."""
    d = str(tmp_path / "by-hand")
    kw = dict(path=d, per_rank_path=True, page_bytes=PB, capacity="1MiB", nosync=True)
    with KvxConnector(**kw, **NS) as c:
        record = c.namespace[1]
        for i in range(0, 200, 2):
            f = c.submit_batch_set(["k%d" % i, "k%d" % (i + 1)], [memoryview(rand_bytes(i, PB))] * 2)
            assert drain_until(c, [f])[f][1]
        assert c._store.stat()["evictions"] > 0
    with kvx.Store.open(d, readonly=True) as st:
        assert _common.read_namespace(st) == record
    with pytest.raises(kvx.ShapeError):
        KvxConnector(**kw, **dict(NS, revision="other"))


# PROMISE: ENGINE-28
def test_model_path_config_digest_is_the_revision(tmp_path):
    """No revision given: a local model directory's config files are digested as the revision, so changed weights
    config under the same model name opens another store."""
    m = tmp_path / "model"
    m.mkdir()
    (m / "config.json").write_text('{"hidden_size": 4096}')
    kw = dict(path=str(tmp_path / "l2"), page_bytes=PB, nosync=True, model=str(m), dtype="bfloat16")
    with KvxConnector(**kw) as c:
        d1 = c.dir
        assert json.loads(c.namespace[1])["revision"].startswith("config:")
        put_get(c, "k", rand_bytes(9, PB))
    (m / "config.json").write_text('{"hidden_size": 8192}')
    with KvxConnector(**kw) as c:
        assert c.dir != d1 and put_get(c, "k") is None
