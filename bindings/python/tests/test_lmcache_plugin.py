"""kvx.integrations.lmcache_l2.KvxL2Adapter, LMCache's L2 "plugin" adapter type (issue 37, point 3): usage, key
listing and status from kvx's own index, so LMCache's accounting sees what survived a restart."""
import importlib
import os
import select

import pytest

from conftest import rand_bytes
from kvx.integrations import lmcache_l2
from kvx.integrations.lmcache_l2 import KvxL2Adapter, ObjectKey, key_string, parse_key

PB = 16384


def load_plugin(d):
    """LMCache's plugin factory (plugin_l2_adapter.py at the pinned commit): import module_path, take
    class_name, check it subclasses L2AdapterInterface, pass adapter_params as one dict (no config class here)."""
    cls = getattr(importlib.import_module(d["module_path"]), d["class_name"])
    assert isinstance(cls, type) and issubclass(cls, lmcache_l2.L2AdapterInterface)
    return cls(d.get("adapter_params", {}))


def cfg(path, **kw):
    p = {"path": str(path), "page_bytes": PB, "capacity": "64MiB", "nosync": True}
    p.update(kw)
    return {"type": "plugin", "module_path": "kvx.integrations.lmcache_l2", "class_name": "KvxL2Adapter",
            "adapter_params": p}


def keys_of(n, salt="", model="m/model", start=0):
    return [ObjectKey("/snap/" + "x" * 200 + model if salt == "long" else model, 0, 0,
                      (start + i).to_bytes(32, "little"), salt) for i in range(n)]


def wait(efd, query, task):
    for _ in range(100):
        r = query(task)
        if r is not None:
            return r
        select.select([efd], [], [], 0.1)
        try:
            os.eventfd_read(efd)
        except BlockingIOError:
            pass
    raise TimeoutError(task)


def store(a, keys, datas):
    t = a.submit_store_task(keys, [bytearray(d) for d in datas])
    for _ in range(100):
        done = a.pop_completed_store_tasks()
        if t in done:
            return done[t]
        select.select([a.get_store_event_fd()], [], [], 0.1)
        try:
            os.eventfd_read(a.get_store_event_fd())
        except BlockingIOError:
            pass
    raise TimeoutError(t)


def test_key_string_round_trip():
    for k in keys_of(3, "salt@with@at") + keys_of(2):
        assert parse_key(key_string(k)) == k
    assert parse_key(b"\x00kvx-namespace") is None and parse_key("no-at-signs") is None


# PROMISE: ENGINE-29
def test_usage_after_a_restart_equals_kvx(tmp_path):
    """Loaded by LMCache's plugin factory: after a reopen get_usage() reports what kvx holds (total and per
    cache_salt, long keys included, capacity the store's), list_l2_keys() lists those keys with their sizes, and a
    delete and a store keep it current; the native bridge would report 0 after the reopen."""
    a = load_plugin(cfg(tmp_path / "l2"))
    ka, kb, kl = keys_of(5, "alice"), keys_of(3, "bob", start=10), keys_of(2, "long", start=20)
    sizes = {}
    try:
        assert store(a, ka, [rand_bytes(i, PB) for i in range(5)]).is_successful()
        assert store(a, kb, [rand_bytes(9, PB), rand_bytes(10, PB), rand_bytes(11, 1000)]).is_successful()
        assert store(a, kl, [rand_bytes(12, PB), rand_bytes(13, PB)]).is_successful()
        sizes = {"alice": 5 * PB, "bob": 2 * PB + 1000, "": 0}
        before = a.get_usage()
    finally:
        a.close()
    a = load_plugin(cfg(tmp_path / "l2"))  # the restart
    try:
        u = a.get_usage()
        total = 5 * PB + 2 * PB + 1000 + 2 * PB
        assert u.total_bytes_used == before.total_bytes_used == total
        assert u.total_capacity_bytes == 64 << 20 and a.supports_global_eviction
        assert dict(u.bytes_by_cache_salt) == {"alice": sizes["alice"], "bob": sizes["bob"], "long": 2 * PB}
        page = a.list_l2_keys(page_size=4)
        got, tok = list(page.entries), page.next_page_token
        while tok is not None:
            page = a.list_l2_keys(page_size=4, cursor=tok)
            got += page.entries
            tok = page.next_page_token
        assert sorted(key_string(e.key) for e in got) == sorted(key_string(k) for k in ka + kb + kl)
        assert sum(e.size_bytes for e in got) == total
        assert {key_string(e.key) for e in a.list_l2_keys(model_name="m/model").entries} == \
            {key_string(k) for k in ka + kb}
        a.delete(ka[:2] + kl[:1])
        u = a.get_usage()
        assert u.total_bytes_used == total - 3 * PB
        assert dict(u.bytes_by_cache_salt) == {"alice": 3 * PB, "bob": sizes["bob"], "long": PB}
        assert store(a, ka[2:] + keys_of(1, "carol", start=40), [rand_bytes(50, PB)] * 4).is_successful()
        assert a.get_usage().bytes_by_cache_salt["carol"] == PB  # ka[2:] already held: not counted twice
        assert a.get_usage().total_bytes_used == total - 2 * PB
        st = a.report_status()
        assert st["is_healthy"] and st["keys"] == 8 and st["bytes_used"] == total - 2 * PB
        t = a.submit_lookup_and_lock_task(kl + ka)
        assert wait(a.get_lookup_and_lock_event_fd(), a.query_lookup_and_lock_result, t) == \
            [False, True, False, False, True, True, True]
        out = [bytearray(PB) for _ in range(2)]
        t = a.submit_load_task(kl, out)
        assert wait(a.get_load_event_fd(), a.query_load_result, t) == [False, True]
        assert bytes(out[1]) == rand_bytes(13, PB)
    finally:
        a.close()
    assert len({a.get_store_event_fd(), a.get_lookup_and_lock_event_fd(), a.get_load_event_fd()}) == 3


def test_bad_params_close_what_they_opened(tmp_path):
    with pytest.raises(ValueError):
        KvxL2Adapter({"page_bytes": PB})  # no path
    a = KvxL2Adapter({"path": str(tmp_path / "x"), "page_bytes": PB, "nosync": True})
    a.close()
    a.close()
    with pytest.raises(ValueError):
        a.submit_lookup_and_lock_task(keys_of(1))


# Recorded from LMCache/LMCache lmcache/v1/distributed/l2_adapters/base.py at 000e8777 (data, not upstream code).
UPSTREAM_ABSTRACT = {"get_store_event_fd", "get_lookup_and_lock_event_fd", "get_load_event_fd", "submit_store_task",
                     "pop_completed_store_tasks", "submit_lookup_and_lock_task", "query_lookup_and_lock_result",
                     "submit_unlock", "submit_load_task", "query_load_result", "close"}
UPSTREAM_CONCRETE = {"register_listener", "delete", "list_l2_keys", "get_usage", "report_status",
                     "supports_global_eviction", "_notify_keys_stored", "_notify_keys_deleted",
                     "_notify_keys_accessed"}


def test_standin_matches_the_pinned_interface():
    """The stand-in's abstract set is upstream's at the pinned commit; KvxL2Adapter implements all of it and
    overrides the usage-facing methods (list_l2_keys, report_status, delete)."""
    from kvx.integrations import _lmcache_standin as s
    base = lmcache_l2.L2AdapterInterface
    if base is s.L2AdapterInterface:
        assert base.__abstractmethods__ == frozenset(UPSTREAM_ABSTRACT)
    for m in UPSTREAM_ABSTRACT | UPSTREAM_CONCRETE:
        assert hasattr(base, m), m
    assert not KvxL2Adapter.__abstractmethods__
    for m in ("list_l2_keys", "report_status", "delete"):
        assert getattr(KvxL2Adapter, m) is not getattr(base, m), m
