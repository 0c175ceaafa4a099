"""The stand-in base class (kvx/integrations/_hicache_standin.py) is
SGLang's HiCacheStorage at the pinned commit, method for method: compared
with a list recorded from that commit (the data below, read from
sgl-project/sglang python/sglang/srt/mem_cache/hicache_storage.py at
001067fffe33427bee0ed2f007fb7551a1d76b44), and, where SGLang is installed,
the methods kvx implements or relies on are compared with the installed
class."""
import dataclasses
import inspect

import pytest

from kvx.integrations import _hicache_standin as standin
from kvx.integrations import sglang as sg
from kvx.integrations.sglang import KvxHiCacheStorage

PINNED = "001067fffe33427bee0ed2f007fb7551a1d76b44"
REQ = inspect.Parameter.empty

# HiCacheStorage at PINNED: method -> (parameters after self, as (name, default); abstract)
METHODS = {
    "register_mem_pool_host": ([("mem_pool_host", REQ)], False),
    "register_mem_host_pool_v2": ([("host_pool", REQ), ("host_pool_name", REQ)], False),
    "batch_exists_v2": ([("keys", REQ), ("pool_transfers", None), ("extra_info", None)], False),
    "batch_get_v2": ([("transfers", REQ), ("extra_info", None)], False),
    "batch_set_v2": ([("transfers", REQ), ("extra_info", None)], False),
    "batch_get_v1": ([("keys", REQ), ("host_indices", REQ), ("extra_info", None)], False),
    "batch_set_v1": ([("keys", REQ), ("host_indices", REQ), ("extra_info", None)], False),
    "get": ([("key", REQ), ("target_location", None), ("target_sizes", None)], True),
    "batch_get": ([("keys", REQ), ("target_locations", None), ("target_sizes", None)], True),
    "set": ([("key", REQ), ("value", None), ("target_location", None), ("target_sizes", None)], True),
    "batch_set": ([("keys", REQ), ("values", None), ("target_locations", None), ("target_sizes", None)], True),
    "exists": ([("key", REQ)], True),
    "batch_exists": ([("keys", REQ), ("extra_info", None)], False),
    "clear": ([], False),
    "get_stats": ([], False),
}
# the data types of that file (and StorageMetrics, of SGLang's metrics collector): their fields, in order
FIELDS = {
    "HiCacheStorageConfig": ["tp_rank", "tp_size", "pp_rank", "pp_size", "attn_cp_rank", "attn_cp_size",
                             "is_mla_model", "enable_storage_metrics", "is_page_first_layout", "model_name",
                             "dp_rank", "dp_size", "tp_lcm_size", "should_split_heads", "extra_config"],
    "HiCacheStorageExtraInfo": ["prefix_keys", "extra_info"],
    "PoolTransfer": ["name", "host_indices", "device_indices", "keys", "hit_policy", "nodes_to_load",
                     "indices_from_pool"],
    "PoolTransferResult": ["kv_hit_pages", "extra_pool_hit_pages"],
    "StorageMetrics": ["prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth"],
}
POOL_NAMES = ["kv", "mamba", "swa", "indexer", "deepseek_v4_c4", "deepseek_v4_c4_indexer", "deepseek_v4_c128",
              "deepseek_v4_c4_state", "deepseek_v4_c4_indexer_state", "deepseek_v4_c128_state", "draft",
              "draft_indexer", "draft_swa"]
HIT_POLICIES = ["all_pages", "trailing_pages"]


def shape(cls, name):
    """(parameters after self as (name, default), abstract) of cls.name, or None when cls has no such method."""
    fn = getattr(cls, name, None)
    if not callable(fn):
        return None
    params = list(inspect.signature(fn).parameters.values())[1:]
    return [(p.name, p.default) for p in params], bool(getattr(fn, "__isabstractmethod__", False))


def differences(cls, methods=METHODS, exact=True):
    """How cls differs from the recorded methods: each missing or changed one (and, exact, each public method
    the record lacks)."""
    out = []
    for name, want in methods.items():
        got = shape(cls, name)
        if got is None:
            out.append(f"{name}: missing")
        elif got != want:
            out.append(f"{name}: {got} != recorded {want}")
    if exact:
        public = {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}
        out += [f"{n}: not in the pinned class" for n in sorted(public - set(methods))]
    return out


def test_standin_is_the_pinned_class():
    """Every method of the pinned HiCacheStorage, with its parameters, defaults and abstract set, and nothing
    else; the data types' fields and the pool names and hit policies."""
    assert differences(standin.HiCacheStorage) == []
    for cls_name, fields in FIELDS.items():
        assert [f.name for f in dataclasses.fields(getattr(standin, cls_name))] == fields, cls_name
    assert [p.value for p in standin.PoolName] == POOL_NAMES
    assert [p.value for p in standin.PoolHitPolicy] == HIT_POLICIES
    assert PINNED in (standin.__doc__ or "")


def test_the_comparison_catches_a_removed_or_changed_method():
    """The check has teeth: a stand-in without batch_get_v2, or with a parameter renamed, fails it."""
    attrs = {k: v for k, v in vars(standin.HiCacheStorage).items() if k not in ("__dict__", "__weakref__")}
    without = type("HiCacheStorage", standin.HiCacheStorage.__bases__, {k: v for k, v in attrs.items()
                                                                       if k != "batch_get_v2"})
    assert differences(without) == ["batch_get_v2: missing"]

    def batch_exists(self, keys, extra=None):
        return 0
    renamed = type("HiCacheStorage", standin.HiCacheStorage.__bases__, dict(attrs, batch_exists=batch_exists))
    assert [d.split(":")[0] for d in differences(renamed)] == ["batch_exists"]


def test_adapter_takes_every_pinned_call():
    """KvxHiCacheStorage implements every pinned method SGLang calls on a backend, with the pinned parameters
    and defaults (so a caller's keyword arguments reach it), and no abstract method is left."""
    want = {n: (params, False) for n, (params, _) in METHODS.items()}
    assert differences(KvxHiCacheStorage, want, exact=False) == []
    assert not getattr(KvxHiCacheStorage, "__abstractmethods__", set())
    own = {n for n in METHODS if n in vars(KvxHiCacheStorage)}
    assert own == set(METHODS)  # none left to the base class's NotImplementedError or None


@pytest.mark.skipif(not sg.HAVE_SGLANG, reason="SGLang is not installed here (it needs torch and an index): the "
                    "stand-in is compared with the pinned commit's record above instead")
def test_installed_sglang_has_what_kvx_relies_on():
    """Where SGLang is installed, its HiCacheStorage still has every method kvx implements or relies on, with the
    same parameters (a newer SGLang may add methods: they are not failures)."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
    # parameters only: whether upstream marks a method abstract may change without breaking kvx, which
    # implements every one of them
    problems = [f"{n}: {shape(HiCacheStorage, n)} != recorded {params}" for n, (params, _) in METHODS.items()
                if shape(HiCacheStorage, n) is None or shape(HiCacheStorage, n)[0] != params]
    assert problems == [], problems


def test_with_sglang_importable_the_adapter_uses_its_classes(tmp_path):
    """Where SGLang imports, the adapter subclasses SGLang's HiCacheStorage, returns SGLang's PoolTransferResult
    and a subclass of SGLang's StorageMetrics (its collector asserts isinstance), and the check above runs
    against it: here with a stand-in SGLang package (the stand-in's classes under SGLang's module names, and a
    StorageMetrics of its own) in a fresh interpreter."""
    from conftest import run_child
    pkg = tmp_path / "fake" / "sglang" / "srt"
    for sub in ("mem_cache", "observability"):
        (pkg / sub).mkdir(parents=True)
    for d in (pkg.parent, pkg, pkg / "mem_cache", pkg / "observability"):
        (d / "__init__.py").write_text("")
    (pkg / "mem_cache" / "hicache_storage.py").write_text(
        "from kvx.integrations._hicache_standin import *\n"
        "from kvx.integrations._hicache_standin import HiCacheStorage, PoolTransferResult, PoolName\n")
    (pkg / "observability" / "metrics_collector.py").write_text(
        "import dataclasses\n@dataclasses.dataclass\nclass StorageMetrics:\n"
        "    prefetch_pgs: list = dataclasses.field(default_factory=list)\n"
        "    backup_pgs: list = dataclasses.field(default_factory=list)\n"
        "    prefetch_bandwidth: list = dataclasses.field(default_factory=list)\n"
        "    backup_bandwidth: list = dataclasses.field(default_factory=list)\n")
    rc, out = run_child(f"""
        import sys
        sys.path.insert(0, {str(tmp_path / "fake")!r})
        import kvx.integrations.sglang as sg
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
        from sglang.srt.observability.metrics_collector import StorageMetrics
        assert sg.HAVE_SGLANG and issubclass(sg.KvxHiCacheStorage, HiCacheStorage)
        from sglang_driver import MHAHostPool, create_dynamic_backend, storage_config
        import test_sglang_standin as t
        t.test_installed_sglang_has_what_kvx_relies_on()
        ex = {{"backend_name": "kvx", "module_path": "kvx.integrations.sglang", "class_name": "KvxHiCacheStorage",
              "path": {str(tmp_path / "l3")!r}, "page_bytes": 65536, "capacity": "64MiB", "nosync": True}}
        b = create_dynamic_backend(storage_config(ex), MHAHostPool(page_size=4))
        m = b.get_stats()
        assert isinstance(m, StorageMetrics) and m.kvx["role"] == "writer", type(m).__mro__
        r = b.batch_exists_v2(["a"])
        assert type(r).__module__ == "kvx.integrations._hicache_standin" and r.kv_hit_pages == 0
        b.close()
        print("ok")
    """)
    assert rc == 0 and "ok" in out.splitlines(), out
