"""get_stats(): SGLang's StorageMetrics (what --enable-storage-metrics
feeds its histograms, as the Mooncake and 3FS backends return it), with
kvx's counters beside them."""
import array
import random

import kvx.integrations.sglang as sg
from sglang_driver import MHAHostPool, create_dynamic_backend, page_hashes, storage_config

PAGE = 4


def extra(path, **kw):
    e = {"backend_name": "kvx", "module_path": "kvx.integrations.sglang", "class_name": "KvxHiCacheStorage",
         "interface_v1": 1, "path": str(path), "page_bytes": 65536, "capacity": "64MiB", "nosync": True}
    e.update(kw)
    return e


def indices(pages):
    out = array.array("q")
    for p in pages:
        out.extend(range(p * PAGE, (p + 1) * PAGE))
    return out


def keys(n, seed):
    rng = random.Random(seed)
    return page_hashes([rng.randrange(150000) for _ in range(n * PAGE)], PAGE)


def metrics_class():
    """The StorageMetrics SGLang's collector asserts (its own where SGLang is installed, else the stand-in's)."""
    if sg.HAVE_SGLANG:
        for mod in ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector"):
            try:
                return __import__(mod, fromlist=["StorageMetrics"]).StorageMetrics
            except Exception:
                continue
    from kvx.integrations._hicache_standin import StorageMetrics
    return StorageMetrics


# PROMISE: ENGINE-20
def test_get_stats_returns_storage_metrics(tmp_path):
    """With storage metrics on, get_stats() is a StorageMetrics whose lists hold the pages of each backup and
    prefetch batch and their bandwidths since the last call (then empty again), and whose .kvx holds the
    backend's counters (pages got, missed, set; bytes; failures) and the store's (pages, bytes, capacity...).
    It returned None, so --enable-storage-metrics showed nothing for kvx."""
    pool = MHAHostPool(page_size=PAGE)
    b = create_dynamic_backend(storage_config(extra(tmp_path / "l3"), metrics=True), pool)
    try:
        ks = keys(5, 1)
        for p in range(5):
            pool.fill_page(p, seed=p)
        assert b.batch_set_v1(ks[:3], indices(range(3))) == [True] * 3
        assert b.batch_set_v1(ks[3:], indices(range(3, 5))) == [True] * 2
        assert b.batch_get_v1(ks + keys(1, 2), indices(range(10, 16))) == [True] * 5 + [False]
        m = b.get_stats()
        assert isinstance(m, metrics_class())
        assert m.backup_pgs == [3, 2] and m.prefetch_pgs == [6]
        assert len(m.backup_bandwidth) == 2 and len(m.prefetch_bandwidth) == 1
        assert all(x > 0 for x in m.backup_bandwidth + m.prefetch_bandwidth)
        page = 2 * pool.element_bytes()
        k = m.kvx
        assert (k["pages_set"], k["bytes_set"], k["pages_got"], k["pages_missed"], k["bytes_got"]) == \
            (5, 5 * page, 5, 1, 5 * page)
        assert k["failed_gets"] == k["failed_sets"] == k["failed_exists"] == 0 and k["last_failure"] is None
        assert k["store"]["blocks"] >= 10 and k["store"]["capacity_bytes"] == 64 << 20
        assert k["dir"] == b.dir and k["role"] == "writer" and k["namespace"] == b.namespace[0]
        m2 = b.get_stats()  # the lists are since the last call; the counters since the backend opened
        assert m2.backup_pgs == m2.prefetch_pgs == m2.backup_bandwidth == m2.prefetch_bandwidth == []
        assert m2.kvx["pages_set"] == 5
    finally:
        b.close()


def test_get_stats_without_metrics_keeps_no_samples(tmp_path):
    """Without --enable-storage-metrics no samples pile up (nobody reads them); the counters still count."""
    pool = MHAHostPool(page_size=PAGE)
    b = create_dynamic_backend(storage_config(extra(tmp_path / "l3")), pool)
    try:
        ks = keys(2, 3)
        assert b.batch_set_v1(ks, indices(range(2))) == [True, True]
        m = b.get_stats()
        assert m.backup_pgs == [] and m.kvx["pages_set"] == 2
    finally:
        b.close()
