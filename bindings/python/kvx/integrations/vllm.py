"""kvx as a vLLM secondary offload tier (TieringOffloadingSpec), persistent
across restarts.

vLLM's TieringOffloadingSpec keeps a CPU primary tier and an ordered list of
secondary tiers; only the CPU tier touches the GPU, and a secondary tier
copies primary host slots to and from its medium. vLLM loads this one with
no patch (docs/ENGINES.md, "vLLM", has the whole config)::

    "secondary_tiers": [{"type": "KvxSecondaryTier",
                         "module_path": "kvx.integrations.vllm",
                         "path": "/var/cache/kvx-vllm", "capacity": "64GiB"}]

SecondaryTierFactory pops ``type`` and ``module_path``, imports the module
and builds ``KvxSecondaryTier(offloading_spec=..., primary_kv_view=...,
tier_type=..., **the rest)`` (an optional ``backpressure_detector`` too).

Pinned upstream: vllm-project/vllm, tiering/base.py, tiering/fs/manager.py
and tiering/manager.py at 061245c7e1e7bb485a53ec8b7b75362faff2fcfb (the
TransferJob(job_id, keys, chunk_ids, ...) / JobResult(successful_keys,
transfer_time, transfer_bytes) shape), kv_offload/base.py at
0105e232b7fa4e1b59ec87531f167c0443a5095d, file_mapper.py, tiering/spec.py
and docs/features/kv_offloading_usage.md at
0078e9d2b020be709d7d756877106fd1015ea4f4, and the factory's out-of-tree
``module_path`` loading (vLLM PR 51007). Where vLLM is not importable the
base class and types are ``_vllm_standin.py``'s, recorded from those files.

How it works:

- Keys: vLLM's OffloadKey bytes (block hash + 4-byte group index) are the
  keyed pages' keys; a page is one primary slot (``primary_kv_view.strides
  [0]`` bytes), read and written in place in the primary view.
- Store: ``<path>/<model>_dp<i>_<digest16>``, the digest
  (``_common.namespace``) over the fields FileMapper hashes for its run
  config (model, tokens per hash, blocks per file, parallel sizes, dtype,
  KV-cache groups, formats), the model revision and the slot size; the
  store records it. One writer per store: each data-parallel engine has its
  own; a second engine on the same directory (another server) opens it
  read-only (``role: auto``): it serves the first one's pages, and its store
  jobs fail (a failed JobResult, counted).
- Never raises into vLLM once built: every failure (store closed, full,
  damaged, read-only, an I/O error) is a failed JobResult (a partial load
  names its ``successful_keys``), counted in ``kvx_stats()`` and logged at
  most every 30 s per kind. A damaged page is a miss or a failed load,
  never wrong bytes (every page is CRC-checked before it is copied). Only
  construction raises, with a message naming the option: a missing path, a
  bad capacity, a non-collision-resistant block hash without the opt-in, a
  directory held by another writer with ``role: writer``.
- Lookups: as upstream's AsyncLookupManager: a key's first lookup answers
  RETRY, each step's new keys go to a lookup thread as one kvx call
  (``keyed_exists``) at ``on_schedule_end``, later lookups answer HIT or
  MISS from that verdict until the request finishes.
- Stores: one writer thread; the store jobs waiting are put in one write
  batch and flushed together (group commit); a job succeeds only once its
  flush returned: its pages are durable. Loads: ``n_read_threads`` threads,
  one ``keyed_get_into`` call per job, straight into the primary slots.
- Events (``enable_kv_events`` and vLLM's KV events on): stored keys as
  ``removed=False`` events (as the file tier), and the keys kvx's eviction
  removed (``Store.evicted()``) as ``removed=True`` events with
  Medium.STORAGE, and only those.
"""
import logging
import os
import queue
import threading
import time

import kvx

from . import _common
from . import _vllm_standin as _standin

try:  # vLLM's own classes where it is installed (the factory needs a SecondaryTierManager)
    from vllm.v1.kv_offload import base as _up_base
    from vllm.v1.kv_offload.tiering import base as _up_tiering
    _Base = _up_tiering.SecondaryTierManager
    JobResult = _up_tiering.JobResult
    LookupResult = _up_base.LookupResult
    Medium = _up_base.Medium
    Locality = _up_base.Locality
    OffloadingEvent = _up_base.OffloadingEvent
    RequestOffloadingContext = _up_base.RequestOffloadingContext
    HAVE_VLLM = True
except Exception:  # ImportError, or vLLM's own imports (torch) failing
    HAVE_VLLM = False
    _Base = _standin.SecondaryTierManager
    JobResult = _standin.JobResult
    LookupResult = _standin.LookupResult
    Medium = _standin.Medium
    Locality = _standin.Locality
    OffloadingEvent = _standin.OffloadingEvent
    RequestOffloadingContext = _standin.RequestOffloadingContext

__all__ = ["KvxSecondaryTier", "HAVE_VLLM", "run_config"]

log = logging.getLogger("kvx.integrations.vllm")


_BAD_KEYS_MAX = 65536  # failed loads remembered as MISS (oldest forgotten first)


class _Touch:
    """A touch for the lookup thread: keys to count as used."""

    __slots__ = ("keys",)

    def __init__(self, keys):
        self.keys = keys

HASH_BYTES = 32  # a SHA-256 block hash (sha256, sha256_cbor); xxhash's are 16
_NON_CRYPTO = ("xxhash", "xxhash_cbor")
_LOG_EVERY = 30.0
_STOP = object()


def run_config(spec):
    """The fields vLLM's FileMapper hashes for a run (file_mapper.py at the pin: from_offloading_spec with
    parallel_agnostic=True, as the file tier builds it), from the OffloadingSpec."""
    cfg = spec.config
    par = cfg.parallel
    agnostic = bool(getattr(par, "is_parallelism_agnostic", False) or getattr(cfg, "replicated_layout", False))
    groups = [{"tokens_per_block": g.tokens_per_block, "layer_names": list(g.layer_names)} for g in cfg.groups]
    f = {"model_name": cfg.model.name, "tokens_per_hash": cfg.cache.tokens_per_hash,
         "blocks_per_file": spec.blocks_per_chunk, "tp_size": 1 if agnostic else par.tp_size,
         "pp_size": 1 if agnostic else par.pp_size, "pcp_size": 1 if agnostic else par.pcp_size,
         "dcp_size": 1 if agnostic else par.dcp_size, "dtype": str(cfg.model.dtype), "kv_cache_groups": groups,
         "inference_engine": "vllm"}
    if not agnostic:
        f["parallel_agnostic"] = False
    if agnostic and getattr(cfg, "replicated_layout", False):
        f["replicated_layout"] = True
    if getattr(cfg, "canonical_layout", False):
        f["canonical_format"] = str(getattr(cfg, "kv_cache_layout", None))
    if getattr(spec, "storage_format", None) is not None:
        f["storage_format"] = str(spec.storage_format)
    return f


def _hash_algo(spec, given):
    """The prefix-caching hash algorithm: the tier's own param, else the vLLM config's when the spec carries
    one (older specs: spec.vllm_config.cache_config), else None (unknown: checked on the keys instead)."""
    if given:
        return str(given)
    vc = getattr(spec, "vllm_config", None)
    algo = getattr(getattr(vc, "cache_config", None), "prefix_caching_hash_algo", None)
    return str(algo) if algo else None


class KvxSecondaryTier(_Base):
    """A vLLM SecondaryTierManager over a kvx keyed store (module docstring)."""

    medium = Medium.STORAGE

    def __init__(self, offloading_spec, primary_kv_view, tier_type, path=None, capacity="64GiB",
                 enable_kv_events=False, locality=None, n_read_threads=8, role="auto", revision=None,
                 model_path=None, prefix_caching_hash_algo=None, allow_non_cryptographic_hash=False,
                 per_rank_path=False, shard_bytes=0, nosync=False, verify=False, backpressure_detector=None):
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = Locality(locality) if locality is not None else None
        if role not in ("auto", "writer", "reader"):
            raise ValueError(f"kvx vllm tier: role is \"auto\", \"writer\" or \"reader\", not {role!r}")
        algo = _hash_algo(offloading_spec, prefix_caching_hash_algo)
        self._allow_any_hash = bool(allow_non_cryptographic_hash)
        if algo in _NON_CRYPTO and not self._allow_any_hash:
            raise ValueError(
                f"kvx vllm tier: --prefix-caching-hash-algo {algo} is not collision resistant: two prompts whose "
                "block hashes collide would read each other's KV from a persistent store. Use sha256 or "
                "sha256_cbor, or set \"allow_non_cryptographic_hash\": true in the tier's config to accept it")
        self._bs = int(self.block_size_bytes)
        v = primary_kv_view
        try:
            self._flat = v if (v.ndim == 1 and v.format == "B") else v.cast("B")
        except (TypeError, ValueError) as e:
            raise ValueError(f"kvx vllm tier: the primary view ({v.format!r}, shape {v.shape}) is not one "
                             f"C-contiguous run of bytes: {e}") from None
        self._slots = len(self._flat) // self._bs if self._bs else 0
        if self._bs <= 0 or self._slots <= 0:
            raise ValueError(f"kvx vllm tier: the primary view has no slots (stride {self._bs}, {len(self._flat)} "
                             "bytes)")

        # the store: named by the namespace, opened as the writer, else (auto) read-only
        spec = offloading_spec
        fields = dict(run_config(spec))
        fields["revision"] = _common.model_revision(spec.config.model.name, revision, model_path, adapter="vllm")
        fields["slot_bytes"] = self._bs
        self.namespace = _common.namespace(fields)
        dp = int(getattr(spec.config.parallel, "data_parallel_index", 0) or 0)
        tag = f"{_common.tag_safe(spec.config.model.name)}_dp{dp}_{self.namespace[0]}"
        self.dir = _common.store_dir(path, tag, bool(per_rank_path))
        self._record = self.namespace[1] if len(self.namespace[1]) <= self._bs else \
            b'{"kvx_namespace_digest":"' + self.namespace[0].encode() + b'"}'
        self.role = None
        self._store = self._open(role, capacity, int(shard_bytes or 0), bool(nosync), bool(verify))

        self._events = None
        if enable_kv_events:
            if spec.kv_events_config.enable_kv_cache_events:
                self._events = []
            else:
                log.warning("kvx vllm tier %s: enable_kv_events is set but vLLM's KV cache events are off: no "
                            "events", tier_type)
        self._ev_mu = threading.Lock()
        self._stats_mu = threading.Lock()
        self._stats = {k: 0 for k in ("stores", "stores_failed", "chunks_stored", "bytes_stored", "loads",
                                      "loads_failed", "loads_partial", "chunks_loaded", "chunks_load_missed",
                                      "bytes_loaded", "lookups", "lookup_hits", "lookup_batches",
                                      "lookups_failed", "evicted_keys", "evicted_dropped")}
        self._last_failure = ""
        self._logged = {}
        self._bad_hash = False

        # jobs: submitted -> a queue -> a worker -> _finished; _inflight counts until get_finished_jobs
        self._finished = queue.SimpleQueue()
        self._missed = queue.SimpleQueue()  # keys to mark missing (evicted, failed loads), for the scheduler
        self._cv = threading.Condition()
        self._inflight = 0
        self._closed = False
        # keys whose load failed (damaged, or gone since the lookup): MISS until stored again. kvx_store_keyed_contains
        # reads no page, so without this a damaged page would answer HIT again after its load failed. Bounded.
        self._bad = {}
        self._bad_mu = threading.Lock()  # readers add and trim, the writer removes: never iterated while changed
        self._wq = queue.SimpleQueue()
        self._rq = queue.SimpleQueue()
        self._lq = queue.SimpleQueue()
        self._lres = queue.SimpleQueue()
        # lookup state, scheduler thread only: key -> [result, in_flight, req_ids, generation]
        self._lk = {}
        self._lk_req = {}
        self._lk_batch = []
        self._gen = 0
        self._threads = [threading.Thread(target=self._writer, name="kvx_vllm_writer", daemon=True),
                         threading.Thread(target=self._lookup_worker, name="kvx_vllm_lookup", daemon=True)]
        self._threads += [threading.Thread(target=self._reader, name=f"kvx_vllm_reader{i}", daemon=True)
                          for i in range(max(1, int(n_read_threads)))]
        for t in self._threads:
            t.start()
        self._take_evicted()
        log.info("kvx vllm tier %s: %s store %s (%d-byte slots, %d slots in the primary view)", tier_type,
                 self.role, self.dir, self._bs, self._slots)

    # ---- setup ---------------------------------------------------------------------------------------------

    def _open(self, role, capacity, shard_bytes, nosync, verify):
        st = None
        if role in ("auto", "writer"):
            try:
                if os.path.exists(self.dir):
                    st = kvx.Store.open(self.dir, nowait=True, nosync=nosync, verify=verify)
                else:
                    os.makedirs(os.path.dirname(os.path.abspath(self.dir)), exist_ok=True)
                    st = kvx.Store.create(self.dir, page_bytes=self._bs, capacity=_common.parse_size(capacity),
                                          shard_bytes=shard_bytes, nowait=True, nosync=nosync, verify=verify)
            except (kvx.Error, OSError) as e:
                busy = isinstance(e, kvx.BusyError)
                denied = isinstance(e, OSError) or getattr(e, "code", 0) in (-13, -30, -1)  # EACCES, EROFS, EPERM
                if role == "writer" or not (busy or denied) or not os.path.exists(os.path.join(self.dir, "STORE")):
                    why = ("held by another process's writer (another engine on this path): give each engine its "
                           "own path, or \"role\": \"auto\" to read the other's pages") if busy else str(e)
                    msg = f"kvx vllm tier: cannot open {self.dir} as its writer: {why}"
                    if isinstance(e, kvx.Error):
                        _common.raise_kvx(type(e), e.code, msg)
                    raise OSError(e.errno, msg) from e
                log.warning("kvx vllm tier: %s is %s: opened read-only; this engine reads its pages and its "
                            "store jobs fail", self.dir, "held by another engine's writer" if busy else
                            f"not writable here ({e})")
                st = None
        if st is None:
            st = kvx.Store.open(self.dir, readonly=True, verify=verify)
            self.role = "reader"
        else:
            self.role = "writer"
        try:
            if not st.keyed or st.page_bytes != self._bs:
                _common.raise_kvx(kvx.ShapeError, kvx.ESHAPE, f"{self.dir} is not a keyed store of {self._bs}-byte "
                                  "pages (the primary slot size)")
            rec = _common.read_namespace(st)
            if rec is not None and rec != self._record:
                _common.raise_kvx(kvx.ShapeError, kvx.ESHAPE, f"{self.dir} holds the pages of another namespace "
                                  f"({rec[:200].decode(errors='replace')}): give another path")
            if rec is None and self.role == "writer":
                with st.batch() as b:
                    b.keyed_put([_common.NAMESPACE_KEY], [self._record])
        except BaseException:
            st.close()
            raise
        return st

    # ---- failures and stats --------------------------------------------------------------------------------

    def _count(self, **kw):
        with self._stats_mu:
            for k, v in kw.items():
                self._stats[k] += v

    def _fail(self, what, e):
        msg = f"{what}: {type(e).__name__}: {e}"
        now = time.monotonic()
        with self._stats_mu:
            self._last_failure = msg
            due = now - self._logged.get(what, -1e9) >= _LOG_EVERY
            if due:
                self._logged[what] = now
        if due:
            log.warning("kvx vllm tier %s: %s (the job fails; logged at most every %ds)", self.tier_type, msg,
                        int(_LOG_EVERY))

    def kvx_stats(self):
        """This tier's counters since it was built, the store's (stat()), its directory, role and namespace."""
        with self._stats_mu:
            out = dict(self._stats, last_failure=self._last_failure)
        try:
            out["store"] = self._store.stat()
        except Exception:
            out["store"] = None
        out.update(dir=self.dir, role=self.role, namespace=self.namespace[0])
        return out

    def _hash_ok(self, keys):
        if self._allow_any_hash or self._bad_hash:
            return not self._bad_hash
        for k in keys:
            if len(k) != HASH_BYTES + 4:
                self._bad_hash = True
                log.error("kvx vllm tier %s: offload keys of %d-byte block hashes, not SHA-256's %d: vLLM runs "
                          "a non-collision-resistant --prefix-caching-hash-algo (xxhash): the tier is off (every "
                          "lookup a miss, every job failed). Use sha256, or set \"allow_non_cryptographic_hash\": "
                          "true in the tier's config to accept it", self.tier_type, len(k) - 4, HASH_BYTES)
                return False
        return True

    # ---- jobs ----------------------------------------------------------------------------------------------

    def _submit(self, q, job, store):
        with self._cv:
            self._inflight += 1
        try:
            keys = list(job.keys)
            cids = job.chunk_ids
            cids = cids.tolist() if hasattr(cids, "tolist") else [int(c) for c in cids]
            if len(keys) != len(cids):
                raise ValueError(f"{len(keys)} keys but {len(cids)} chunk ids")
            if not self._hash_ok(keys):
                raise ValueError("the tier is off: a non-collision-resistant block hash")
            if self._closed:
                raise ValueError("the tier is shut down")
            if store and self.role != "writer":
                raise PermissionError(f"{self.dir} is open read-only here (another engine writes it)")
            q.put((job.job_id, keys, cids, time.monotonic()))
        except Exception as e:
            self._fail("store" if store else "load", e)
            self._count(**({"stores_failed": 1} if store else {"loads_failed": 1}))
            self._done(JobResult(job_id=job.job_id, success=False))

    def _done(self, result, missed=None):
        if missed:
            self._missed.put(missed)
        self._finished.put(result)
        with self._cv:
            self._cv.notify_all()

    def _slot(self, c):
        c = int(c)
        if not 0 <= c < self._slots:
            raise IndexError(f"chunk id {c} is outside the primary view's {self._slots} slots")
        return self._flat[c * self._bs:(c + 1) * self._bs]

    def _writer(self):
        # the jobs waiting go in one flush, up to 256 MiB and a quarter of the store (a group over its
        # capacity would fail whole: KVX_ECAPACITY); the capacity is the store's for its whole life
        cap = 256 << 20
        try:
            cap = min(cap, max(self._bs, self._store.stat()["capacity_bytes"] // 4))
        except Exception:  # noqa: BLE001 (a closed store: the group's own flush says so)
            pass
        while True:
            item = self._wq.get()
            if item is _STOP:
                return
            group, stop = [item], False
            size = len(item[1]) * self._bs
            while size < cap:
                try:
                    nxt = self._wq.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                group.append(nxt)
                size += len(nxt[1]) * self._bs
            self._store_group(group)
            if stop:
                return

    def _store_group(self, group):
        """One flush for the group's jobs. A group that fails whole (a job's bad chunk id, a group over what the
        store can take) is stored again job by job: a job fails for its own reasons only (PY-13)."""
        t0 = time.monotonic()
        ok = False
        try:
            with self._store.batch() as b:  # an exception inside drops the batch's pages: nothing is durable
                for _, keys, cids, _ in group:
                    b.keyed_put(keys, [self._slot(c) for c in cids])
            ok = True  # the with block flushed: durable
        except Exception as e:
            if len(group) > 1:
                for job in group:
                    self._store_group([job])
                return
            self._fail("store", e)
        if ok:
            _common.keep_namespace(self._store, self._record, logger=log)
        dt = time.monotonic() - t0
        ev = self._take_evicted()
        for job_id, keys, cids, t_sub in group:
            n = len(keys)
            if ok:
                with self._bad_mu:
                    for k in keys:
                        self._bad.pop(k, None)
                self._count(stores=1, chunks_stored=n, bytes_stored=n * self._bs)
                if self._events is not None and keys:
                    with self._ev_mu:
                        self._events.append(OffloadingEvent(keys=keys, medium=self.medium, removed=False,
                                                            locality=self.locality))
            else:
                self._count(stores_failed=1)
            self._done(JobResult(job_id=job_id, success=ok, transfer_time=dt, transfer_bytes=n * self._bs),
                       missed=ev)
            ev = None

    def _take_evicted(self):
        """The keys kvx's evictions removed since the last call (a writer's flushes evict): reported as removed
        events, and marked missing in the lookup state."""
        try:
            ev, dropped = self._store.evicted()
        except Exception as e:
            self._fail("evicted", e)
            return None
        ev = [k for k in ev if k != _common.NAMESPACE_KEY]
        if dropped:
            log.warning("kvx vllm tier %s: %d evicted keys were not kept for the removed events", self.tier_type,
                        dropped)
        if not ev and not dropped:
            return None
        self._count(evicted_keys=len(ev), evicted_dropped=int(dropped))
        if ev and self._events is not None:
            with self._ev_mu:
                self._events.append(OffloadingEvent(keys=ev, medium=self.medium, removed=True,
                                                    locality=self.locality))
        return ev

    def _reader(self):
        while True:
            item = self._rq.get()
            if item is _STOP:
                self._rq.put(_STOP)  # the next reader stops too
                return
            job_id, keys, cids, _ = item
            t0 = time.monotonic()
            try:
                oks = self._store.keyed_read_into(keys, [self._slot(c) for c in cids])
            except Exception as e:
                self._fail("load", e)
                oks = [False] * len(keys)
            dt = time.monotonic() - t0
            good = [k for k, ok in zip(keys, oks) if ok]
            bad = [k for k, ok in zip(keys, oks) if not ok]
            with self._bad_mu:
                for k in bad:
                    self._bad[k] = True
                    while len(self._bad) > _BAD_KEYS_MAX:
                        self._bad.pop(next(iter(self._bad)), None)
            self._count(loads=1, chunks_loaded=len(good), bytes_loaded=len(good) * self._bs,
                        chunks_load_missed=len(bad), loads_failed=1 if bad else 0,
                        loads_partial=1 if bad and good else 0)
            if not bad:
                res = JobResult(job_id=job_id, success=True, transfer_time=dt, transfer_bytes=len(keys) * self._bs)
            else:
                res = JobResult(job_id=job_id, success=False, successful_keys=tuple(good) if good else None,
                                transfer_time=dt, transfer_bytes=len(good) * self._bs)
            self._done(res, missed=bad)

    # ---- lookups (upstream's AsyncLookupManager, one kvx call per step) ------------------------------------

    def _lookup_worker(self):
        while True:
            batch = self._lq.get()
            if batch is _STOP:
                return
            if isinstance(batch, _Touch):
                try:  # a use for kvx's eviction order; nothing to answer
                    self._store.keyed_contains(batch.keys)
                except Exception as e:
                    self._fail("touch", e)
                continue
            keys = [k for k, _ in batch]
            try:  # held without reading the pages: a load reads and checks each one
                held, _ = self._store.keyed_contains(keys)
                held = [h and k not in self._bad for k, h in zip(keys, held)]
            except Exception as e:
                self._fail("lookup", e)
                self._count(lookups_failed=len(keys))
                held = [False] * len(keys)
            self._lres.put([(k, g, bool(h)) for (k, g), h in zip(batch, held)])

    def _drain_lookups(self):
        while True:
            try:
                keys = self._missed.get_nowait()
            except queue.Empty:
                break
            for k in keys:
                s = self._lk.get(k)
                if s is not None and not s[1]:
                    s[0] = False
        while True:
            try:
                res = self._lres.get_nowait()
            except queue.Empty:
                break
            for k, gen, held in res:
                s = self._lk.get(k)
                if s is None or s[3] != gen:
                    continue
                if not s[2]:  # no request asks any more
                    del self._lk[k]
                    continue
                s[0], s[1] = held, False

    def lookup(self, key, req_context):
        try:
            if self._closed or not self._hash_ok((key,)):
                return LookupResult.MISS
            self._drain_lookups()
            s = self._lk.get(key)
            if s is None:
                s = self._lk[key] = [None, False, set(), self._gen]
                self._lk_batch.append((key, self._gen))
                self._gen += 1
            rid = req_context.req_id
            s[2].add(rid)
            self._lk_req.setdefault(rid, set()).add(key)
            if s[0] is None:
                return LookupResult.RETRY
            self._count(lookups=1, lookup_hits=1 if s[0] else 0)
            return LookupResult.HIT if s[0] else LookupResult.MISS
        except Exception as e:
            self._fail("lookup", e)
            return LookupResult.MISS

    def on_schedule_end(self, context):
        try:
            self._drain_lookups()
            batch, self._lk_batch = self._lk_batch, []
            live = []
            for k, gen in batch:
                s = self._lk.get(k)
                if s is not None and s[3] == gen and s[0] is None:
                    s[1] = True
                    live.append((k, gen))
            if live and not self._closed:
                self._count(lookup_batches=1)
                self._lq.put(live)
        except Exception as e:
            self._fail("lookup", e)

    def on_request_finished(self, req_context):
        try:
            for k in self._lk_req.pop(req_context.req_id, ()):
                s = self._lk.get(k)
                if s is None:
                    continue
                s[2].discard(req_context.req_id)
                if not s[2] and not s[1]:
                    del self._lk[k]
        except Exception as e:
            self._fail("lookup", e)

    # ---- the SecondaryTierManager interface ----------------------------------------------------------------

    def on_new_request(self, req_context):
        return RequestOffloadingContext()

    def submit_store(self, job_metadata):
        self._submit(self._wq, job_metadata, True)

    def submit_load(self, job_metadata):
        self._submit(self._rq, job_metadata, False)

    def get_finished_jobs(self):
        out = []
        try:
            self._drain_lookups()
            while True:
                try:
                    out.append(self._finished.get_nowait())
                except queue.Empty:
                    break
        except Exception as e:
            self._fail("finished", e)
        if out:
            with self._cv:
                self._inflight -= len(out)
                self._cv.notify_all()
        return out

    def take_events(self):
        if self._events is None:
            return []
        with self._ev_mu:
            ev, self._events = self._events, []
        return ev

    def has_pending_work(self):
        with self._cv:
            busy = self._inflight > 0
        return busy or any(s[1] for s in self._lk.values()) or bool(self._lk_batch)

    def supports_lazy_promotion_allocation(self):
        return False

    def touch(self, keys, req_context):
        """Marks the keys recently used in kvx's eviction order: one keyed_contains call on the lookup thread
        (nothing is read; never blocks the scheduler)."""
        if self._closed or not keys:
            return
        try:
            keys = [k for k in keys if isinstance(k, (bytes, bytearray))]
            if keys:
                self._lq.put(_Touch(keys))
        except Exception as e:
            self._fail("touch", e)

    def drain_jobs(self):
        """Wait until every submitted job has run; their results wait for get_finished_jobs()."""
        with self._cv:
            self._cv.wait_for(lambda: self._finished.qsize() >= self._inflight)

    def shutdown(self):
        """Run the jobs submitted, stop the threads, close the store. Idempotent; jobs submitted later fail."""
        if self._closed:
            return
        self._closed = True
        self._wq.put(_STOP)
        self._rq.put(_STOP)
        self._lq.put(_STOP)
        for t in self._threads:
            t.join()
        try:
            self._store.close()
        except Exception as e:
            self._fail("close", e)

    @classmethod
    def build_metric_definitions(cls, extra_config):
        return {}

    def get_stats(self):
        return None  # vLLM's OffloadingConnectorStats are not built here: kvx_stats() has the counters
