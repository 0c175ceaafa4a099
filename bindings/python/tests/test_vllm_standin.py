"""The stand-in (kvx/integrations/_vllm_standin.py) is vLLM's secondary-tier
interface at the pinned commits, compared with a list recorded from them
(the data below, read from vllm-project/vllm: vllm/v1/kv_offload/tiering/
base.py at 061245c7e1e7bb485a53ec8b7b75362faff2fcfb, vllm/v1/kv_offload/
base.py at 0105e232b7fa4e1b59ec87531f167c0443a5095d, file_mapper.py at
0078e9d2b020be709d7d756877106fd1015ea4f4); where vLLM is installed, the
installed classes are compared with the same list."""
import dataclasses
import inspect

import pytest

from conftest import run_child
from kvx.integrations import _vllm_standin as standin
from kvx.integrations import vllm as kv
from kvx.integrations.vllm import KvxSecondaryTier

REQ = inspect.Parameter.empty

# SecondaryTierManager at 061245c7: method -> (parameters after self/cls as (name, default), abstract)
METHODS = {
    "__init__": ([("offloading_spec", REQ), ("primary_kv_view", REQ), ("tier_type", REQ),
                  ("backpressure_detector", None)], False),
    "lookup": ([("key", REQ), ("req_context", REQ)], True),
    "submit_store": ([("job_metadata", REQ)], True),
    "submit_load": ([("job_metadata", REQ)], True),
    "get_finished_jobs": ([], True),
    "supports_lazy_promotion_allocation": ([], False),
    "has_pending_work": ([], False),
    "take_events": ([], False),
    "touch": ([("keys", REQ), ("req_context", REQ)], False),
    "on_new_request": ([("req_context", REQ)], True),
    "on_request_finished": ([("req_context", REQ)], False),
    "serve_external_requests": ([("parent", REQ)], False),
    "on_schedule_end": ([("context", REQ)], False),
    "drain_jobs": ([], True),
    "shutdown": ([], False),
    "build_metric_definitions": ([("extra_config", REQ)], False),  # a classmethod
    "get_stats": ([], False),
}
PROPERTIES = ["block_size_bytes", "bp_detector"]
# dataclasses of those files: their fields, in order
FIELDS = {
    "TransferJob": ["job_id", "_keys", "_chunk_ids", "is_promotion", "req_context", "submit_time"],
    "JobResult": ["job_id", "success", "successful_keys", "transfer_time", "transfer_bytes"],
    "OffloadingEvent": ["keys", "medium", "removed", "locality", "ownership", "removal_expected"],
    "RequestOffloadingContext": ["policy"],
    "OffloadingKVEventsConfig": ["enable_kv_cache_events", "self_describing_kv_events"],
}
ENUMS = {"LookupResult": ["MISS", "HIT", "HIT_PENDING", "RETRY"], "Medium": ["CPU", "STORAGE"],
         "Locality": ["LOCAL", "REMOTE"], "OffloadPolicy": ["CHUNK_LEVEL", "REQUEST_LEVEL"]}
# FileMapper's hashed run config at 0078e9d2 (always present, in order)
FILE_MAPPER_FIELDS = ["model_name", "tokens_per_hash", "blocks_per_file", "tp_size", "pp_size", "pcp_size",
                      "dcp_size", "dtype", "kv_cache_groups", "inference_engine"]


def shape(cls, name):
    fn = inspect.getattr_static(cls, name, None)
    if fn is None:
        return None
    abstract = bool(getattr(fn, "__isabstractmethod__", False))
    params = list(inspect.signature(getattr(cls, name)).parameters.values())
    if not isinstance(fn, classmethod):
        params = params[1:]  # self
    return [(p.name, p.default) for p in params], abstract


def differences(cls, methods=METHODS, exact=True):
    out = []
    for name, want in methods.items():
        got = shape(cls, name)
        if got is None:
            out.append(f"{name}: missing")
        elif got != want:
            out.append(f"{name}: {got} != recorded {want}")
    if exact:
        public = {n for n, v in vars(cls).items() if callable(v) or isinstance(v, classmethod)}
        public = {n for n in public if not n.startswith("_") or n == "__init__"}
        out += [f"{n}: not in the pinned class" for n in sorted(public - set(methods))]
    return out


# PROMISE: PY-19
def test_standin_is_the_pinned_interface():
    """Every method of the pinned SecondaryTierManager with its parameters, defaults and abstract set, and nothing
    else; its properties; the data types' fields; the enums; the OffloadKey packing; the pins named."""
    assert differences(standin.SecondaryTierManager) == []
    assert all(isinstance(vars(standin.SecondaryTierManager)[p], property) for p in PROPERTIES)
    for name, fields in FIELDS.items():
        assert [f.name for f in dataclasses.fields(getattr(standin, name))] == fields, name
    for name, members in ENUMS.items():
        assert [m.name for m in getattr(standin, name)] == members, name
    assert standin.make_offload_key(b"\x01" * 32, 3) == b"\x01" * 32 + b"\x00\x00\x00\x03"
    assert standin.get_offload_group_idx(standin.make_offload_key(b"h", 7)) == 7
    for pin in (standin.PINNED_TIERING, standin.PINNED_BASE, standin.PINNED_FILE_MAPPER):
        assert pin in standin.__doc__ and pin in kv.__doc__


def test_the_comparison_catches_a_removed_or_changed_method():
    attrs = {k: v for k, v in vars(standin.SecondaryTierManager).items() if k not in ("__dict__", "__weakref__")}
    without = type("SecondaryTierManager", standin.SecondaryTierManager.__bases__,
                   {k: v for k, v in attrs.items() if k != "drain_jobs"})
    assert differences(without) == ["drain_jobs: missing"]

    def lookup(self, key, ctx):
        return None
    renamed = type("SecondaryTierManager", standin.SecondaryTierManager.__bases__, dict(attrs, lookup=lookup))
    assert [d.split(":")[0] for d in differences(renamed)] == ["lookup"]


# PROMISE: PY-19
def test_tier_implements_every_pinned_call():
    """KvxSecondaryTier implements every abstract method, with the pinned parameters; its constructor takes the
    base's four parameters by the names the factory passes; run_config has FileMapper's fields."""
    assert not getattr(KvxSecondaryTier, "__abstractmethods__", set())
    want = {n: (p, False) for n, (p, _) in METHODS.items() if n != "__init__"}
    assert differences(KvxSecondaryTier, want, exact=False) == []
    own = {n for n, (_, abstract) in METHODS.items() if abstract}
    assert own <= set(vars(KvxSecondaryTier))
    init = inspect.signature(KvxSecondaryTier.__init__).parameters
    for name, default in METHODS["__init__"][0]:
        assert name in init and init[name].default == default
    assert KvxSecondaryTier.medium == kv.Medium.STORAGE
    from vllm_driver import make_spec
    assert list(kv.run_config(make_spec()))[:len(FILE_MAPPER_FIELDS)] == FILE_MAPPER_FIELDS


@pytest.mark.skipif(not kv.HAVE_VLLM, reason="vLLM is not installed here (it needs torch and an index): the "
                    "stand-in is compared with the pinned commits' record above instead")
def test_installed_vllm_has_what_kvx_relies_on():
    from vllm.v1.kv_offload.tiering.base import SecondaryTierManager
    problems = [f"{n}: {shape(SecondaryTierManager, n)} != recorded {p}" for n, (p, _) in METHODS.items()
                if shape(SecondaryTierManager, n) is None or shape(SecondaryTierManager, n)[0] != p]
    assert problems == [], problems


def test_with_vllm_importable_the_tier_uses_its_classes(tmp_path):
    """Where vLLM imports, the tier subclasses vLLM's SecondaryTierManager and answers with vLLM's JobResult and
    LookupResult: here with a stand-in vLLM package (the stand-in under vLLM's module names) in a fresh
    interpreter, driven through the factory."""
    pkg = tmp_path / "fake" / "vllm" / "v1" / "kv_offload"
    (pkg / "tiering").mkdir(parents=True)
    for d in (pkg.parent.parent, pkg.parent, pkg, pkg / "tiering"):
        (d / "__init__.py").write_text("")
    (pkg / "base.py").write_text("from kvx.integrations._vllm_standin import *\n")
    (pkg / "tiering" / "base.py").write_text("from kvx.integrations._vllm_standin import *\n")
    rc, out = run_child(f"""
        import sys
        sys.path.insert(0, {str(tmp_path / "fake")!r})
        import vllm.v1.kv_offload.tiering.base as up
        import kvx.integrations.vllm as kv
        assert kv.HAVE_VLLM and kv._Base is up.SecondaryTierManager and kv.JobResult is up.JobResult
        from vllm_driver import Manager, Primary, create_secondary_tier, key, make_spec, tier_config
        p = Primary(8, 4096)
        t = create_secondary_tier(tier_config({str(tmp_path / "s")!r}, revision="r"), p.view, make_spec())
        m = Manager(t)
        r = m.store([key(1)], [0])
        assert type(r) is up.JobResult and r.success
        assert m.lookup([key(1)]) == [up.LookupResult.HIT]
        t.shutdown()
        print("ok")
    """)
    assert rc == 0 and "ok" in out, out
