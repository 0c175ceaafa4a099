"""Drives a secondary tier as vLLM's tiering manager does, without vLLM.

Reproduced from vllm-project/vllm (docs/ENGINES.md, "vLLM", names the
commits): the factory's out-of-tree loading (PR 51007, and tiering/spec.py
at 0078e9d2: ``create_secondary_tier(tier_config, primary_kv_view, spec)``:
``type`` and ``module_path`` popped, the class imported from the module and
built with ``offloading_spec``, ``primary_kv_view``, ``tier_type`` and the
rest of the config as keywords), and TieringOffloadingManager at 061245c7
(tiering/manager.py): store jobs after a primary store completes
(``TransferJob(job_id, _keys, _chunk_ids=<int32 slots>, is_promotion=False,
req_context)``), lookups per key with RETRY until ``on_schedule_end``
resolved them, promotions as load jobs into allocated slots, results
polled with ``get_finished_jobs()`` (a failed promotion keeps exactly its
``successful_keys``), ``take_events()``, ``drain_jobs()``, ``shutdown()``.
The primary view is a bytearray of N slots, shaped as upstream's
(num_chunks, slot_bytes) memoryview.
"""
import array
import hashlib
import mmap
import importlib
import time

from kvx.integrations import _vllm_standin as S
from kvx.integrations import vllm as kv

LookupResult = kv.LookupResult


def make_spec(model="Qwen/Qwen3-8B", dtype="bfloat16", tokens_per_hash=16, blocks_per_chunk=1, dp=0, tp=1,
              events=False, layers=4, agnostic=False, extra=None):
    cfg = S.OffloadingConfig(
        groups=(S.OffloadingGroupConfig(tokens_per_block=16 * blocks_per_chunk,
                                        layer_names=tuple(f"model.layers.{i}.self_attn" for i in range(layers))),),
        worker_kv_bytes_per_block=4096, enable_kv_cache_events=events, extra_config=dict(extra or {}),
        engine_id=f"engine_dp{dp}", model=S.OffloadingModelConfig(name=model, dtype=dtype),
        cache=S.OffloadingCacheConfig(tokens_per_hash=tokens_per_hash, blocks_per_chunk=blocks_per_chunk),
        parallel=S.OffloadingParallelConfig(rank=0, world_size=tp, tp_size=tp, pp_size=1, pcp_size=1, dcp_size=1,
                                            data_parallel_index=dp, is_parallelism_agnostic=agnostic))
    return S.OffloadingSpec(cfg)


class Primary:
    """The CPU primary tier's memory: n slots of slot_bytes, and the 2-D memoryview vLLM hands a tier."""

    def __init__(self, n, slot_bytes, aligned=False):
        """aligned: the slots in an anonymous mmap (4096-aligned, as vLLM's pinned host tensor is), not a
        bytearray."""
        self.n, self.slot = n, slot_bytes
        self.buf = mmap.mmap(-1, n * slot_bytes) if aligned else bytearray(n * slot_bytes)
        self.view = memoryview(self.buf).cast("B", (n, slot_bytes))

    def fill(self, i, seed):
        self.buf[i * self.slot:(i + 1) * self.slot] = chunk_bytes(seed, self.slot)

    def get(self, i):
        return bytes(self.buf[i * self.slot:(i + 1) * self.slot])


def chunk_bytes(seed, n):
    out = bytearray()
    c = 0
    while len(out) < n:
        out += hashlib.sha256(b"chunk%d/%d" % (seed, c)).digest()
        c += 1
    return bytes(out[:n])


def key(i, group=0, hash_bytes=32):
    """An OffloadKey as vLLM makes it: a SHA-256 block hash (or a 16-byte xxhash) + the group index."""
    h = hashlib.sha256(b"block%d" % i).digest()[:hash_bytes]
    return S.make_offload_key(h, group)


def create_secondary_tier(tier_config, primary_kv_view, spec):
    """SecondaryTierFactory.create_secondary_tier for an out-of-tree tier (module_path)."""
    config = dict(tier_config)
    tier_type = config.pop("type", None)
    if not tier_type:
        raise ValueError("Secondary tier configuration must include 'type'")
    module_path = config.pop("module_path", None)
    cls = getattr(importlib.import_module(module_path), tier_type)
    if not issubclass(cls, kv._Base):
        raise TypeError(f"{tier_type} is not a SecondaryTierManager")
    return cls(offloading_spec=spec, primary_kv_view=primary_kv_view, tier_type=tier_type, **config)


def tier_config(path, **kw):
    return {"type": "KvxSecondaryTier", "module_path": "kvx.integrations.vllm", "path": str(path), **kw}


class Manager:
    """The calls TieringOffloadingManager makes on one secondary tier."""

    def __init__(self, tier):
        self.tier = tier
        self.next_id = 0
        self.results = {}
        self.req = 0

    def ctx(self):
        self.req += 1
        return S.ReqContext(req_id=f"req-{self.req}")

    def _job(self, keys, slots, promotion, ctx=None):
        job = S.TransferJob(job_id=self.next_id, _keys=list(keys), _chunk_ids=array.array("i", slots),
                            is_promotion=promotion, req_context=ctx or self.ctx())
        self.next_id += 1
        return job

    def submit_store(self, keys, slots):
        job = self._job(keys, slots, False)
        self.tier.submit_store(job)
        return job.job_id

    def submit_load(self, keys, slots):
        job = self._job(keys, slots, True)
        self.tier.submit_load(job)
        return job.job_id

    def poll(self):
        for r in self.tier.get_finished_jobs():
            assert r.job_id not in self.results, f"job {r.job_id} finished twice"
            self.results[r.job_id] = r

    def wait(self, job_ids, timeout=30):
        end = time.monotonic() + timeout
        while True:
            self.poll()
            if all(j in self.results for j in job_ids):
                return [self.results.pop(j) for j in job_ids]
            assert time.monotonic() < end, f"jobs {job_ids} never finished"
            time.sleep(0.001)

    def store(self, keys, slots):
        (r,) = self.wait([self.submit_store(keys, slots)])
        return r

    def load(self, keys, slots):
        (r,) = self.wait([self.submit_load(keys, slots)])
        return r

    def lookup(self, keys, timeout=10):
        """Each key's LookupResult, as the scheduler gets it: lookups, then on_schedule_end, until none RETRYs."""
        ctx = self.ctx()
        end = time.monotonic() + timeout
        while True:
            res = [self.tier.lookup(k, ctx) for k in keys]
            self.tier.on_schedule_end(S.ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
            if LookupResult.RETRY not in res:
                self.tier.on_request_finished(ctx)
                return res
            assert time.monotonic() < end, "lookups never resolved"
            time.sleep(0.001)
