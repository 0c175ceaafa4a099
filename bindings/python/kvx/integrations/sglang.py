"""kvx as an SGLang HiCache L3 storage backend (HiCacheStorage).

SGLang loads it with ``--hicache-storage-backend dynamic`` and an extra
config naming the class::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvx",
        "module_path": "kvx.integrations.sglang", "class_name": "KvxHiCacheStorage",
        "interface_v1": 1, "path": "/var/cache/kvx-sglang", "page_bytes": 2097152,
        "capacity": "64GiB"}'

and constructs ``KvxHiCacheStorage(storage_config, kwargs)``
(StorageBackendFactory._create_dynamic_backend), then hands it the host KV
pool through ``register_mem_pool_host`` (hybrid models: their other pools
through ``register_mem_host_pool_v2``).

Contract mirrored: sgl-project/sglang at commit 001067ff (docs/ENGINES.md,
"SGLang", names the files; ``_hicache_standin.py`` has the interface):
HiCacheStorage's v1 (zero-copy over the host pool), v2 (hybrid pools),
generic and stats methods; the dynamic loader; the cache controller, which
backs MLA models up from TP rank 0 only (``backup_skip``), all-reduces the
ranks' hit counts with MIN, counts batch_get_v1 results up to the first
False, and runs the backup and prefetch threads in loops that catch only
``queue.Empty`` (an exception ends the thread, and HiCache never restarts
it).

Failure convention (upstream's backends'): a runtime failure (ENOSPC, EIO,
a full or closed store, any kvx.Error but InvalidError) is a miss or a
failed write, never an exception: ``False``, ``[False] * n``, ``0`` or
``None``, counted in get_stats() and logged (at most every 30 s per kind);
the next call tries again. Only a programming error raises: a bad key,
pointer or count (kvx.InvalidError naming it), a missing host pool, a call
SGLang's interface does not define. Setup raises too (a rank's directory
held by another process: kvx.BusyError; another page size or namespace:
kvx.ShapeError), so a misconfigured launch fails at once.

Stores: one directory per writing rank, named after the rank and a digest
of what makes its pages' bytes (_common.namespace: model and revision,
dtype, page size in tokens, host layout, the page's buffer sizes, MLA and
hybrid, and the parallel ranks that split the pages), ``<path>/<model>_
<ranks>_<digest16>``; the namespace is recorded in the store too. MLA
models (and SGLang's other rank-replicated caches) keep one copy of the KV
for all TP ranks: TP rank 0 writes the store ``<path>/<model>_mla[_pp..]
[_cp..][_dp..]_<digest>``, the other TP ranks open it read-only (once it
exists) and answer from it, so the MIN over the ranks' hits is rank 0's
count. ``"per_rank_path": true`` (or ``{rank}`` in path) names the
directory by hand; its recorded namespace must then match.

Pages are kvx keyed pages. A page's buffers (MHA page_first: K and V; MLA:
one) are stored as ``key`` (buffer 0) and ``key + NUL + j`` (buffer j); a
hybrid pool's buffer j as ``key + NUL + pool + NUL + j``; when that would
pass 255 bytes, ``NUL + SHA-256(key) + the same suffix``. A caller's key
holding a NUL is refused, so no caller's key names another page's buffer.
The buffers per page of the KV pool are recorded in the store
(``b"\\x00kvx-sglang-parts"``) so exists counts whole pages after a restart.
"""
import array
import ctypes
import dataclasses
import hashlib
import logging
import operator
import os
import sys
import threading
import time

import kvx

from . import _common
from . import _hicache_standin as _standin

try:  # the real base class when SGLang is installed (the dynamic loader checks issubclass)
    from sglang.srt.mem_cache import hicache_storage as _upstream
    _Base = _upstream.HiCacheStorage
    HAVE_SGLANG = True
except Exception:  # ImportError, or SGLang's own imports (torch) failing
    HAVE_SGLANG = False
    _upstream = _standin
    _Base = _standin.HiCacheStorage

# the v2 types: SGLang's own where it has them (an older SGLang may lack some)
PoolName = getattr(_upstream, "PoolName", _standin.PoolName)
PoolHitPolicy = getattr(_upstream, "PoolHitPolicy", _standin.PoolHitPolicy)
PoolTransferResult = getattr(_upstream, "PoolTransferResult", _standin.PoolTransferResult)

__all__ = ["KvxHiCacheStorage", "HAVE_SGLANG", "rank_tag"]

log = logging.getLogger("kvx.integrations.sglang")

_SEP = b"\x00"  # component keys: key + NUL + ...; a caller's key holding a NUL is refused
_PARTS_KEY = b"\x00kvx-sglang-parts"  # the KV pool's buffers per page (decimal), in the store
_LOG_EVERY = 30.0  # seconds between two warnings of one kind of failure
_FOLLOWER_RETRY = 1.0  # seconds between two tries of a follower to open rank 0's store
_GIB = float(1 << 30)


class _Unavailable(Exception):
    """No store to answer from: closed, or (an MLA follower) rank 0's not there yet."""


def rank_tag(cfg):
    """The directory name a rank had before stores were named by namespace (the "old name" an existing store is
    adopted from): model, tp rank/size, and pp, cp, dp when in use."""
    g = lambda name, d: getattr(cfg, name, d)  # noqa: E731
    model = g("model_name", None)
    tag = (_common.tag_safe(model.replace("/", "-")) + "_") if model else ""
    tag += f"tp{g('tp_rank', 0)}of{g('tp_size', 1)}"
    return tag + _other_ranks(cfg)


def _other_ranks(cfg):
    g = lambda name, d: getattr(cfg, name, d)  # noqa: E731
    tag = ""
    if (g("pp_size", 1) or 1) > 1:
        tag += f"_pp{g('pp_rank', 0)}of{g('pp_size', 1)}"
    if (g("attn_cp_size", 1) or 1) > 1:
        tag += f"_cp{g('attn_cp_rank', 0)}of{g('attn_cp_size', 1)}"
    if (g("dp_size", 1) or 1) > 1:
        tag += f"_dp{g('dp_rank', 0)}of{g('dp_size', 1)}"
    return tag


def _pool_tag(name):
    """A v2 pool's name as key bytes (None for the KV pool, whose pages are the v1 pages)."""
    v = getattr(name, "value", name)
    if not isinstance(v, str) or not 1 <= len(v) <= 64 or not v.isprintable() or "\x00" in v:
        _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"pool name {name!r} (1..64 printable characters)")
    return None if v == "kv" else v.encode()


def _component_key(key, pool, j):
    """The key of buffer j of key's page in pool (a _pool_tag; None: the KV pool)."""
    if pool is None and j == 0:
        return key
    suffix = _SEP + (pool + _SEP if pool else b"") + b"%d" % j
    if len(key) + len(suffix) <= _common.KEY_MAX:
        return key + suffix
    # a long key: its digest, after a NUL (no caller's key starts with one), so any key of 1..255 bytes has pages
    return _SEP + hashlib.sha256(key).digest() + suffix


def _component_keys(keys, pool, parts):
    if pool is None and parts == 1:
        return list(keys)
    return [_component_key(k, pool, j) for k in keys for j in range(parts)]


def _as_buffer(obj, writable, what):
    """A contiguous byte memoryview of obj, zero-copy: any buffer (numpy arrays, bytearray, ctypes), or a CPU
    tensor (through .numpy()), or an object with data_ptr()/numel()/element_size() (pinned host memory)."""
    if obj is None:
        _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what}: no buffer given")
    try:
        m = memoryview(obj)
    except TypeError:
        m = None
        if hasattr(obj, "numpy"):
            try:
                m = memoryview(obj.numpy())
            except Exception:
                m = None
        dev = getattr(getattr(obj, "device", None), "type", "cpu")
        if m is None and dev != "cpu":
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what}: a {dev} tensor (host memory only)")
        if m is None and hasattr(obj, "data_ptr"):
            # numel * element_size bytes from data_ptr are the tensor's only when it is contiguous: an expanded
            # or strided tensor (stride 0, a slice) would be read, and written by get, past its storage
            contiguous = getattr(obj, "is_contiguous", None)
            if not callable(contiguous) or contiguous() is not True:
                _common.raise_kvx(kvx.InvalidError, kvx.EINVALID,
                                  f"{what}: not a contiguous tensor (call .contiguous() first)")
            n = _int_arg(obj.numel(), f"{what}: numel()") * _int_arg(obj.element_size(), f"{what}: element_size()")
            m = _ptr_buffer(obj.data_ptr(), n, what)
        if m is None:
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what}: {type(obj).__name__} is not a buffer")
    if not m.c_contiguous or (writable and m.readonly):
        _common.raise_kvx(kvx.InvalidError, kvx.EINVALID,
                          f"{what}: not a contiguous{' writable' if writable else ''} buffer")
    return m.cast("B") if (m.ndim != 1 or m.format != "B") else m


def _int_arg(v, what):
    """v as an int (any integer type, numpy's and torch's scalars too); a bool, None, a float: kvx.InvalidError."""
    if not isinstance(v, bool):
        try:
            return operator.index(v)
        except TypeError:
            pass
    if hasattr(v, "item") and not isinstance(v, (bool, float)):  # a one-element tensor
        try:
            x = v.item()
            if isinstance(x, int) and not isinstance(x, bool):
                return x
        except Exception:
            pass
    _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what} is {v!r}, not an integer")


def _ptr_buffer(ptr, size, what):
    """size bytes at address ptr, as a byte memoryview (the host pool's pages: read and written in place)."""
    p = _int_arg(ptr, f"{what}: pointer")
    n = _int_arg(size, f"{what}: size")
    if not 0 < p < 1 << 64 or not 0 < n < 1 << 48 or p + n > 1 << 64:
        _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what}: pointer {p:#x}, {n} bytes")
    return memoryview((ctypes.c_ubyte * n).from_address(p))


def _make_transfer_result(final, hits, restorable):
    """PoolTransferResult(kv_hit_pages, extra_pool_hit_pages), with the restorable stops where this SGLang's class
    has a third field for them."""
    cls = PoolTransferResult
    if dataclasses.is_dataclass(cls) and len(dataclasses.fields(cls)) >= 3:
        return cls(final, hits, restorable)
    return cls(final, hits)


class KvxHiCacheStorage(_Base):
    """HiCacheStorage over a kvx keyed store (see the module doc).

    extra_config: path (required), page_bytes (required to create the store; checked against an existing one;
    at least the largest page buffer), capacity (default "64GiB"), revision (the model's revision for the
    namespace: a hub commit or tag; default: a digest of the local model directory's config files, else none,
    said once in the log), per_rank_path, nosync (tests and benchmarks only), verify.
    """

    def __init__(self, storage_config, kwargs=None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        if not extra.get("path") or not isinstance(extra.get("path"), (str, os.PathLike)):
            raise ValueError("kvx: the store path is required (extra_config key \"path\")")
        self.storage_config = storage_config
        self._extra = extra
        self._page_bytes = extra.get("page_bytes")
        self.page_bytes = int(self._page_bytes) if self._page_bytes else None
        g = lambda name, d: getattr(storage_config, name, d)  # noqa: E731
        self.is_mla = bool(g("is_mla_model", False))
        # SGLang's controller backs rank-replicated (MLA) caches up from TP rank 0 only (backup_skip): the others
        # read rank 0's store
        self.follower = self.is_mla and int(g("tp_rank", 0) or 0) != 0
        self._metrics_on = bool(g("enable_storage_metrics", False))
        self.mem_pool_host = (kwargs or {}).get("mem_pool_host")
        self.registered_pools = {}
        self.dir = None
        self.namespace = None  # (digest, record) once the store is named
        self._mu = threading.Lock()  # opening and closing the store
        self._store = None
        self._closed = False
        self._next_try = 0.0
        self._parts_mu = threading.Lock()
        self._parts_seen = None  # the KV pool's buffers per page, once a v1 call or the pool has shown it
        self._parts_stored = None  # the store's record of it
        self._pool_parts_cache = {}
        self._stats_mu = threading.Lock()
        self._counters = dict.fromkeys(("pages_got", "pages_missed", "bytes_got", "pages_set", "bytes_set",
                                        "failed_gets", "failed_sets", "failed_exists", "failed_pages"), 0)
        self._last_failure = None
        self._samples = _standin.StorageMetrics()  # the lists get_stats hands over (when metrics are on)
        self._log_at = {}
        if self.mem_pool_host is not None:
            self._open(required=not self.follower)

    # ---- life cycle -----------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host):
        """The controller hands over its host KV pool (right after construction): the store is named after the
        pool's layout and opened now, so a misconfigured launch fails here."""
        super().register_mem_pool_host(mem_pool_host)
        self._pool_parts_cache.clear()
        if self._store is None and not self._closed:
            self._open(required=not self.follower)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """A hybrid model's other host pool (Mamba, SWA, DSA indexer...). It must give page buffers
        (get_page_buffer_meta): kvx stores pages zero-copy only; else kvx.InvalidError (the launch fails)."""
        _pool_tag(host_pool_name)
        if not callable(getattr(host_pool, "get_page_buffer_meta", None)):
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID,
                              f"host pool {host_pool_name!r} ({type(host_pool).__name__}) has no "
                              "get_page_buffer_meta: kvx stores a pool's pages from their buffers")
        self.registered_pools[host_pool_name] = host_pool
        self._pool_parts_cache.pop(id(host_pool), None)

    def close(self):
        """Close the store (idempotent); later calls answer as misses and failed writes. Everything set so far
        is durable already."""
        with self._mu:
            self._closed = True
            st, self._store = self._store, None
        if st is not None:
            st.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- the store and its name -------------------------------------------------

    def _namespace_fields(self):
        cfg, extra, pool = self.storage_config, self._extra, self.mem_pool_host
        g = lambda name, d: getattr(cfg, name, d)  # noqa: E731
        model = g("model_name", None)
        f = {"engine": "sglang-hicache", "model": model,
             "revision": _common.model_revision(model, extra.get("revision"), extra.get("model_path"), "sglang"),
             "page_bytes": self.page_bytes, "mla": self.is_mla}
        if pool is not None:
            f["dtype"] = str(getattr(pool, "dtype", None))
            f["page_tokens"] = getattr(pool, "page_size", None)
            f["layout"] = getattr(pool, "layout", None)
            f["buffers"] = self._page_shape(pool)
            f["hybrid"] = bool(getattr(pool, "entries", None))
        else:  # the generic interface without a host pool: what extra_config says
            f["dtype"], f["page_tokens"], f["layout"] = extra.get("dtype"), extra.get("page_size"), extra.get("layout")
            f["buffers"], f["hybrid"] = None, False
        if f["layout"] is None and g("is_page_first_layout", None) is not None:
            f["layout"] = "page_first" if g("is_page_first_layout", False) else "other"
        ranks = {}
        if not self.is_mla:  # MHA: each TP rank holds its heads; MLA: every rank the same latent KV
            ranks["tp"] = [g("tp_rank", 0), g("tp_size", 1)]
            if g("tp_lcm_size", None):
                ranks["tp_lcm"] = [g("tp_lcm_size", None), bool(g("should_split_heads", False))]
        if (g("pp_size", 1) or 1) > 1:
            ranks["pp"] = [g("pp_rank", 0), g("pp_size", 1)]
        if (g("attn_cp_size", 1) or 1) > 1:
            ranks["cp"] = [g("attn_cp_rank", 0), g("attn_cp_size", 1)]
        f["ranks"] = ranks
        return f

    @staticmethod
    def _page_shape(pool):
        """The byte sizes of one page's buffers in the host pool (a layout's signature), or None. The indices of
        the pool's first page as SGLang passes them (a torch tensor, where torch is loaded), else an array
        (.tolist(), len, items: what upstream's pools use of them)."""
        n = int(getattr(pool, "page_size", 1) or 1)
        torch = sys.modules.get("torch")
        tries = [lambda: torch.arange(n, dtype=torch.int64)] if torch is not None else []
        tries.append(lambda: array.array("q", range(n)))
        for make in tries:
            try:
                ptrs, sizes = pool.get_page_buffer_meta(make())
                k = len(list(ptrs))
                return [int(sizes)] * k if isinstance(sizes, int) else [int(x) for x in sizes]
            except Exception:
                continue
        return None

    def _store_dir(self, digest):
        extra, cfg = self._extra, self.storage_config
        model = getattr(cfg, "model_name", None)
        tag = (_common.tag_safe(model.replace("/", "-")) + "_") if model else ""
        if self.is_mla:
            tag += "mla"
        else:
            tag += f"tp{getattr(cfg, 'tp_rank', 0)}of{getattr(cfg, 'tp_size', 1)}"
        tag += _other_ranks(cfg) + "_" + digest
        return _common.store_dir(extra.get("path"), tag, bool(extra.get("per_rank_path", False))), tag

    def _open(self, required):
        """Name the store and open it: the writer's (created on first use), or a follower's read-only view of
        rank 0's. required: raise what fails (setup); else a follower's failure leaves it without a store."""
        with self._mu:
            if self._store is not None or self._closed:
                return
            if self.namespace is None:
                self.namespace = _common.namespace(self._namespace_fields())
                self.dir, tag = self._store_dir(self.namespace[0])
                self._auto_named = os.path.basename(self.dir) == tag and not self._extra.get("per_rank_path")
            if self.follower:
                self._open_follower(required)
            else:
                self._open_writer()

    def _open_writer(self):
        extra = self._extra
        if self._auto_named and not os.path.exists(self.dir):
            self._adopt_old_store()
        st = _common.open_keyed_store(self.dir, self._page_bytes, extra.get("capacity", "64GiB"),
                                      nosync=bool(extra.get("nosync", False)), verify=bool(extra.get("verify", False)))
        try:
            rec = _common.read_namespace(st)
            if rec is None:
                if st.stat()["blocks"]:
                    _common.log_once(("recorded", self.dir), logging.INFO, "kvx sglang: %s held pages without a "
                                     "namespace record: recorded this rank's (%s)", self.dir,
                                     self.namespace[1].decode(), logger=log)
                with st.batch() as b:
                    b.keyed_put([_common.NAMESPACE_KEY], [self.namespace[1]])
            elif rec != self.namespace[1]:
                _common.raise_kvx(kvx.ShapeError, kvx.ESHAPE,
                                  f"{self.dir} holds the pages of another namespace ({rec.decode(errors='replace')}), "
                                  f"not this rank's ({self.namespace[1].decode()}): give another path")
            self._parts_stored = self._read_parts(st)
        except BaseException:
            st.close()
            raise
        self._store = st
        self.page_bytes = st.page_bytes

    def _open_follower(self, required):
        now = time.monotonic()
        if now < self._next_try:  # the last try failed a moment ago
            return
        if not os.path.exists(os.path.join(self.dir, "STORE")):  # one stat() a call until rank 0 has made it
            _common.log_once(("follower-wait", self.dir), logging.INFO, "kvx sglang: MLA TP rank %s reads TP rank "
                             "0's store %s, not there yet: misses until it is", self.storage_config.tp_rank,
                             self.dir, logger=log)
            return
        try:
            st = kvx.Store.open(self.dir, readonly=True, verify=bool(self._extra.get("verify", False)))
        except kvx.Error as e:
            if required:
                raise
            self._next_try = now + _FOLLOWER_RETRY
            self._log_failure("open", e)
            return
        try:
            rec = _common.read_namespace(st)
            if rec is not None and rec != self.namespace[1]:
                _common.raise_kvx(kvx.ShapeError, kvx.ESHAPE,
                                  f"{self.dir} holds the pages of another namespace ({rec.decode(errors='replace')})")
            if not st.keyed or (self.page_bytes and st.page_bytes != self.page_bytes):
                _common.raise_kvx(kvx.ShapeError, kvx.ESHAPE, f"{self.dir} is not a keyed store of "
                                  f"{self.page_bytes}-byte pages")
            self._parts_stored = self._read_parts(st)
        except BaseException as e:
            st.close()
            if required or not isinstance(e, kvx.Error):
                raise
            _common.log_once(("follower-bad", self.dir), logging.ERROR, "kvx sglang: MLA TP rank %s cannot read "
                             "rank 0's store: %s (every page a miss)", self.storage_config.tp_rank, e, logger=log)
            self._next_try = float("inf")
            return
        self._store = st
        self.page_bytes = st.page_bytes

    def _adopt_old_store(self):
        """First open under the namespaced name: the store this rank had under its old name (rank_tag; MLA:
        TP rank 0's) is renamed to the new one when it records this very namespace, else left alone and
        reported once (path, size, why; docs/ENGINES.md says how to remove it). Stores of this model and ranks
        under another namespace digest are reported once too."""
        cfg, parent = self.storage_config, os.path.dirname(self.dir)
        if self.is_mla:
            cfg = dataclasses.replace(cfg, tp_rank=0) if dataclasses.is_dataclass(cfg) else cfg
        old = os.path.join(parent, rank_tag(cfg))
        if os.path.exists(os.path.join(old, "STORE")):
            why = None
            try:
                with kvx.Store.open(old, readonly=True) as st:
                    rec = _common.read_namespace(st) if st.keyed else None
            except kvx.Error as e:
                rec, why = None, f"it does not open ({e})"
            if why is None and rec is None:
                why = ("it records no namespace (written before kvx named stores by their layout), so its pages' "
                       "dtype and layout are not known")
            elif why is None and rec != self.namespace[1]:
                why = f"it records another namespace ({rec.decode(errors='replace')})"
            if why is None:
                try:  # a writer holding it: leave it
                    kvx.Store.open(old, nowait=True).close()
                    os.rename(old, self.dir)
                    log.info("kvx sglang: adopted %s as %s (same namespace)", old, self.dir)
                    return
                except (kvx.Error, OSError) as e:
                    why = f"it could not be taken over ({e})"
            _common.log_once(("old-store", old), logging.WARNING, "kvx sglang: left %s alone (%d bytes): %s; this "
                             "rank now uses %s. Remove it when no process uses it (docs/ENGINES.md, \"SGLang\")",
                             old, _common.dir_bytes(old), why, self.dir, logger=log)
        prefix = os.path.basename(self.dir)[:-16]
        try:
            others = [n for n in os.listdir(parent) if n.startswith(prefix) and len(n) == len(prefix) + 16
                      and n != os.path.basename(self.dir)]
        except OSError:
            others = []
        for n in sorted(others):
            p = os.path.join(parent, n)
            _common.log_once(("other-ns", p), logging.INFO, "kvx sglang: %s (%d bytes) holds this model and rank's "
                             "pages of another namespace (another dtype, layout, page size or revision): not read; "
                             "remove it when no process uses it", p, _common.dir_bytes(p), logger=log)

    def _reader(self):
        """The store to answer from (opened now if it was not yet: a follower once rank 0's exists)."""
        st = self._store
        if st is None:
            if self._closed:
                raise _Unavailable("closed")
            self._open(required=False)
            st = self._store
            if st is None:
                raise _Unavailable("closed" if self._closed else "rank 0's store is not there yet")
        return st

    # ---- failures and stats ---------------------------------------------------------

    def _failed(self, what, e, value, pages=0):
        """A failed call: a runtime failure is answered with value (counted, logged); anything else raises."""
        if isinstance(e, kvx.InvalidError) or not isinstance(e, (kvx.Error, OSError, ValueError, _Unavailable)):
            raise e
        if isinstance(e, ValueError) and not self._closed and not (self._store is not None and self._store.closed):
            raise e  # a misuse of the binding (or a config error), not a closed store
        with self._stats_mu:
            self._counters["failed_" + what] += 1
            self._counters["failed_pages"] += pages
            self._last_failure = f"{what}: {e}"
        if not (isinstance(e, _Unavailable) and self.follower):
            self._log_failure(what, e)
        return value

    def _log_failure(self, what, e):
        now = time.monotonic()
        with self._stats_mu:
            at, n = self._log_at.get(what, (0.0, 0))
            if now - at < _LOG_EVERY:
                self._log_at[what] = (at, n + 1)
                return
            self._log_at[what] = (now, 0)
        log.warning("kvx sglang: %s failed: %s (%s)%s", what, e, self.dir,
                    f"; {n} more since the last warning" if n else "")

    def _count(self, got=0, missed=0, bytes_got=0, set_=0, bytes_set=0, seconds=0.0, read=True):
        with self._stats_mu:
            c = self._counters
            c["pages_got"] += got
            c["pages_missed"] += missed
            c["bytes_got"] += bytes_got
            c["pages_set"] += set_
            c["bytes_set"] += bytes_set
            if self._metrics_on:
                pages, nbytes = (got + missed, bytes_got) if read else (set_, bytes_set)
                if pages:
                    (self._samples.prefetch_pgs if read else self._samples.backup_pgs).append(pages)
                    if seconds > 0 and nbytes:
                        bw = self._samples.prefetch_bandwidth if read else self._samples.backup_bandwidth
                        bw.append(nbytes / _GIB / seconds)

    def get_stats(self):
        """SGLang's StorageMetrics (its class where SGLang is installed, so its collector takes it): the pages per
        prefetch and backup batch and their bandwidths (GiB/s) since the last call (with
        --enable-storage-metrics), plus ``.kvx``: this backend's counters since it opened (pages and bytes got,
        missed and set, failures by kind and the last one) and the store's (stat(): pages, bytes, capacity,
        evictions, quarantined...), its directory, role and namespace."""
        with self._stats_mu:
            samples, self._samples = self._samples, _standin.StorageMetrics()
            counters = dict(self._counters, last_failure=self._last_failure)
        m = _metrics_class()()
        m.prefetch_pgs.extend(samples.prefetch_pgs)
        m.backup_pgs.extend(samples.backup_pgs)
        m.prefetch_bandwidth.extend(samples.prefetch_bandwidth)
        m.backup_bandwidth.extend(samples.backup_bandwidth)
        counters.update(dir=self.dir, role="reader (MLA follower of TP rank 0)" if self.follower else "writer",
                        namespace=self.namespace[0] if self.namespace else None)
        st = self._store
        try:
            if st is not None:
                s = st.stat()
                counters["store"] = {k: s[k] for k in ("blocks", "bytes", "shards", "capacity_bytes", "hits", "misses",
                                                       "evictions", "evicted_blocks", "compactions", "quarantined",
                                                       "page_bytes")}
        except (kvx.Error, ValueError) as e:
            counters["store"] = None
            counters["store_error"] = str(e)
        m.kvx = counters
        return m

    # ---- keys -------------------------------------------------------------------

    @staticmethod
    def _keys(keys, what):
        if isinstance(keys, (str, bytes)) or keys is None:
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what}: keys is a list of keys, not {keys!r}")
        out = [_common.key_bytes(k, i) for i, k in enumerate(keys)]
        for i, k in enumerate(out):
            if _SEP in k:  # the component separator: such a key could name another page's buffer
                _common.raise_kvx(kvx.InvalidError, kvx.EINVALID,
                                  f"{what}: keys[{i}] holds a NUL byte (kvx's SGLang adapter keeps NUL for the "
                                  "keys of a page's buffers)")
        return out

    @staticmethod
    def _part_keys(keys, parts):
        """The keys of the KV pages' buffers: key itself for buffer 0, then key + NUL + j (or the digest form)."""
        return _component_keys(keys, None, parts)

    @staticmethod
    def _read_parts(st):
        """The buffers per page recorded in the store, or None (no record, or an unreadable one)."""
        (v,) = st.keyed_get([_PARTS_KEY])
        if v is None:
            return None
        with v:
            rec = bytes(v.page)
        return int(rec) if rec.isdigit() and 1 <= int(rec) <= 4096 else None

    def _parts(self):
        """The KV pool's buffers per page for exists/batch_exists: the host pool's once seen, else the store's
        record (the pages set last, by this process or one before it), else 1."""
        return self._parts_seen or self._parts_stored or 1

    def _writer(self, what):
        st = self._reader()
        if st.readonly:
            _common.log_once(("follower-set", self.dir), logging.WARNING, "kvx sglang: MLA TP rank %s was asked to "
                             "%s: TP rank 0 writes the shared store, this rank only reads it (answered False)",
                             self.storage_config.tp_rank, what, logger=log)
            raise _Unavailable("an MLA follower does not write")
        return st

    def _put(self, keys, bufs, pages, kv_parts=None):
        """One keyed put of every buffer, with the records (the namespace; the KV pool's buffers per page when
        kv_parts is given), then its flush: durable when this returns. A held key is skipped."""
        st = self._writer("set")
        for i, b in enumerate(bufs):
            if not 1 <= b.nbytes <= st.page_bytes:
                _common.raise_kvx(kvx.InvalidError, kvx.EINVALID,
                                  f"page buffer {i} holds {b.nbytes} bytes (a page is 1..{st.page_bytes})")
        keys, bufs = list(keys) + [_common.NAMESPACE_KEY], list(bufs) + [self.namespace[1]]
        if kv_parts is not None:
            with self._parts_mu:
                if self._parts_stored not in (None, kv_parts):  # another shape than recorded: the record is replaced
                    st.keyed_delete([_PARTS_KEY])
                self._parts_stored = kv_parts
            keys.append(_PARTS_KEY)
            bufs.append(b"%d" % kv_parts)
        nbytes = sum(b.nbytes for b in bufs[:len(bufs) - (2 if kv_parts is not None else 1)])
        t0 = time.perf_counter()
        with st.batch() as b:  # flushes on exit: 0 = durable; an exception drops only these pages
            b.keyed_put(keys, bufs)
        _common.keep_namespace(st, self.namespace[1], logger=log)  # the flush's eviction may have taken it
        self._count(set_=pages, bytes_set=nbytes, seconds=time.perf_counter() - t0, read=False)

    # ---- the generic (copying) interface -----------------------------------

    def get(self, key, target_location=None, target_sizes=None):
        """The page into target_location (returned), or a new bytearray when none is given; None when not held
        (or not readable now)."""
        k = self._keys([key], "get")
        dst = None if target_location is None else _as_buffer(target_location, True, "get")
        try:
            st = self._reader()
            if dst is None:
                (v,) = st.keyed_get(k)
                if v is None:
                    self._count(missed=1)
                    return None
                with v:
                    out = bytearray(v.page)
                self._count(got=1, bytes_got=len(out))
                return out
            ok = st.keyed_get_into(k, [dst])
        except Exception as e:
            return self._failed("gets", e, None, 1)
        self._count(got=int(ok[0]), missed=int(not ok[0]), bytes_got=dst.nbytes if ok[0] else 0)
        return target_location if ok[0] else None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """[target or None] per key (one C call)."""
        ks = self._keys(keys, "batch_get")
        if target_locations is not None:
            if len(target_locations) != len(ks):
                _common.raise_kvx(kvx.InvalidError, kvx.EINVALID,
                                  f"batch_get: {len(ks)} keys but {len(target_locations)} targets")
            bufs = [_as_buffer(t, True, f"batch_get target {i}") for i, t in enumerate(target_locations)]
        try:
            st = self._reader()
            t0 = time.perf_counter()
            if target_locations is None:
                out = []
                for v in st.keyed_get(ks):
                    if v is None:
                        out.append(None)
                    else:
                        with v:
                            out.append(bytearray(v.page))
                got = [o is not None for o in out]
                nbytes = sum(len(o) for o in out if o is not None)
            else:
                got = st.keyed_get_into(ks, bufs)
                out = [t if o else None for t, o in zip(target_locations, got)]
                nbytes = sum(b.nbytes for b, o in zip(bufs, got) if o)
        except Exception as e:
            return self._failed("gets", e, [None] * len(ks), len(ks))
        self._count(got=sum(got), missed=len(got) - sum(got), bytes_got=nbytes, seconds=time.perf_counter() - t0)
        return out

    def set(self, key, value=None, target_location=None, target_sizes=None):
        """Store value (any buffer or CPU tensor) under key; True once durable (a key already held is kept),
        False when it could not be stored now."""
        src = value if value is not None else target_location
        k, buf = self._keys([key], "set"), _as_buffer(src, False, "set")
        try:
            self._put(k, [buf], 1)
        except Exception as e:
            return self._failed("sets", e, False, 1)
        return True

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """Store every value under its key in one put and one flush; True once all are durable, False when they
        could not be stored now."""
        ks = self._keys(keys, "batch_set")
        src = values if values is not None else target_locations
        if src is None or len(src) != len(ks):
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"batch_set: {len(ks)} keys but "
                              f"{0 if src is None else len(src)} values")
        bufs = [_as_buffer(v, False, f"batch_set value {i}") for i, v in enumerate(src)]
        if not ks:
            return True
        try:
            self._put(ks, bufs, len(ks))
        except Exception as e:
            return self._failed("sets", e, False, len(ks))
        return True

    def exists(self, key):
        """Whether key's page is held (every one of its buffers, for multi-buffer pages)."""
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys, extra_info=None):
        """How many leading keys are held (all of their page buffers: as many as the host pool gives, or as the
        store recorded before the pool was seen, e.g. right after a restart); 0 when the store cannot answer."""
        ks = self._keys(keys, "batch_exists")
        if not ks:
            return 0
        try:
            return self._leading(self._reader(), ks)
        except Exception as e:
            return self._failed("exists", e, 0)

    def _leading(self, st, ks):
        parts = self._parts()
        if parts == 1:
            return st.keyed_exists(ks)[1]
        held = st.keyed_exists(self._part_keys(ks, parts))[0]
        for i in range(len(ks)):
            if not all(held[i * parts:(i + 1) * parts]):
                return i
        return len(ks)

    # ---- zero-copy over the host pool (interface v1) -------------------------

    def _pool_buffers(self, pool, keys, host_indices, writable, what):
        """(parts, buffers): the host pool's buffers of each key's page (get_page_buffer_meta), checked."""
        if pool is None:
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID,
                              f"{what}: no host pool (register_mem_pool_host() / register_mem_host_pool_v2() first)")
        if host_indices is None:
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what}: no host indices")
        page_size = int(getattr(pool, "page_size", 0) or 0)
        if page_size and len(host_indices) != len(keys) * page_size:
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what}: {len(keys)} keys but {len(host_indices)} "
                              f"host indices (page_size {page_size})")
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        ptrs = list(ptrs)
        sizes = [sizes] * len(ptrs) if isinstance(sizes, int) else list(sizes)
        if not keys or len(ptrs) % len(keys) or len(sizes) != len(ptrs):
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what}: {len(keys)} keys but {len(ptrs)} page "
                              f"buffers ({len(sizes)} sizes) from the host pool")
        return len(ptrs) // len(keys), [_ptr_buffer(p, s, f"{what}: page buffer {i}")
                                        for i, (p, s) in enumerate(zip(ptrs, sizes))]

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Read each page straight into the host pool's buffers. -> [bool] per key (True: every buffer of the
        page was filled; False: not held, or not readable now: its buffers untouched)."""
        ks = self._keys(keys, "batch_get_v1")
        if not ks:
            return []
        parts, bufs = self._pool_buffers(self.mem_pool_host, ks, host_indices, True, "batch_get_v1")
        self._parts_seen = parts
        return self._get_into(ks, None, parts, bufs)

    def _get_into(self, ks, pool, parts, bufs):
        try:
            st = self._reader()
            t0 = time.perf_counter()
            # a page is all its parts or nothing: one whose K is held but whose V was evicted leaves both
            # buffers untouched (group)
            ok = st.keyed_get_into(_component_keys(ks, pool, parts), bufs, group=parts)
        except Exception as e:
            return self._failed("gets", e, [False] * len(ks), len(ks))
        res = [ok[i * parts] for i in range(len(ks))]
        got = sum(res)
        self._count(got=got, missed=len(ks) - got, seconds=time.perf_counter() - t0,
                    bytes_got=sum(b.nbytes for i, b in enumerate(bufs) if res[i // parts]))
        return res

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Write each page from the host pool's buffers (read in place), one put and one flush. -> [True] per
        key once durable; [False] per key when the batch could not be stored (nothing of it acknowledged)."""
        ks = self._keys(keys, "batch_set_v1")
        if not ks:
            return []
        parts, bufs = self._pool_buffers(self.mem_pool_host, ks, host_indices, False, "batch_set_v1")
        self._parts_seen = parts
        try:
            self._put(self._part_keys(ks, parts), bufs, len(ks), kv_parts=parts)
        except Exception as e:
            return self._failed("sets", e, [False] * len(ks), len(ks))
        return [True] * len(ks)

    # ---- hybrid models' pools (interface v2) -------------------------------------

    def _v2_pool(self, name):
        tag = _pool_tag(name)
        pool = self.registered_pools.get(name)
        if pool is None and tag is None:
            pool = self.mem_pool_host
        if pool is None:
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"pool {name!r} is not registered "
                              "(register_mem_host_pool_v2)")
        return tag, pool

    def _pool_parts(self, tag, pool):
        """Buffers per page of a pool (one page's get_page_buffer_meta), for exists."""
        if tag is None:
            return self._parts()
        n = self._pool_parts_cache.get(id(pool))
        if n is None:
            shape = self._page_shape(pool)
            if not shape:
                _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"pool {tag.decode()!r}: get_page_buffer_meta of "
                                  "one page gives no buffers")
            n = self._pool_parts_cache[id(pool)] = len(shape)
        return n

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """PoolTransferResult(usable prefix in pages, {pool: its own prefix}) (SGLang's hit policies: an
        ALL_PAGES pool must hold every page of the KV prefix, a TRAILING_PAGES one the last len(transfer.keys)
        pages of the prefix it ends). The prefix is the longest that every pool can restore."""
        ks = self._keys(keys, "batch_exists_v2")
        kv = self.batch_exists(keys) if ks else 0
        hits = {PoolName.KV: kv} if kv else {}
        stops = set(range(1, kv + 1))
        for t in pool_transfers or []:
            if not stops:
                break
            tag, pool = self._v2_pool(t.name)
            parts = self._pool_parts(tag, pool)
            try:
                held = self._reader().keyed_exists(_component_keys(ks[:kv], tag, parts))[0]
            except Exception as e:
                return self._failed("exists", e, _make_transfer_result(0, {}, []))
            page = [all(held[i * parts:(i + 1) * parts]) for i in range(kv)]
            if getattr(t, "hit_policy", PoolHitPolicy.ALL_PAGES) == PoolHitPolicy.TRAILING_PAGES:
                window = max(1, len(t.keys) if getattr(t, "keys", None) else 1)
                ok = {p for p in range(1, kv + 1) if all(page[max(0, p - window):p])}
            else:
                first_missing = page.index(False) if False in page else kv
                ok = set(range(1, first_missing + 1))
            if ok:
                hits[t.name] = max(ok)
            stops &= ok
        restorable = sorted(stops)
        return _make_transfer_result(restorable[-1] if restorable else 0, hits, restorable)

    def _v2_buffers(self, t, writable, what):
        tag, pool = self._v2_pool(t.name)
        ks = self._keys(t.keys or [], f"{what} ({t.name})")
        if not ks:
            return tag, ks, 0, []
        parts, bufs = self._pool_buffers(pool, ks, t.host_indices, writable, f"{what} ({t.name})")
        if tag is None:
            self._parts_seen = parts
        return tag, ks, parts, bufs

    def batch_get_v2(self, transfers, extra_info=None):
        """Read each transfer's pages into its pool's buffers. -> {pool name: [bool] per key} (a page True only
        when every buffer of it was filled; a missing one's buffers untouched)."""
        out = {}
        for t in transfers or []:
            tag, ks, parts, bufs = self._v2_buffers(t, True, "batch_get_v2")
            out[t.name] = self._get_into(ks, tag, parts, bufs) if ks else []
        return out

    def batch_set_v2(self, transfers, extra_info=None):
        """Write every transfer's pages from their pools' buffers in one put and one flush. -> {pool name: [True]
        per key} once durable, [False] per key when they could not be stored."""
        plan = [(t,) + self._v2_buffers(t, False, "batch_set_v2") for t in transfers or []]
        keys, bufs, kv_parts, pages = [], [], None, 0
        for t, tag, ks, parts, b in plan:
            keys += _component_keys(ks, tag, parts)
            bufs += b
            pages += len(ks)
            if tag is None and ks:
                kv_parts = parts
        out = {t.name: [True] * len(ks) for t, _, ks, _, _ in plan}
        if keys:
            try:
                self._put(keys, bufs, pages, kv_parts=kv_parts)
            except Exception as e:
                return self._failed("sets", e, {t.name: [False] * len(ks) for t, _, ks, _, _ in plan}, pages)
        return out

    # ---- clear ----------------------------------------------------------------------

    def clear(self):
        """Delete every page of this rank's store (the owner's delete, durable on return; the bytes go at the next
        compaction). -> True; a store that could not be cleared raises (SGLang then reports the failure). An MLA
        follower holds no store of its own: TP rank 0 clears the shared one."""
        if self.follower:
            log.info("kvx sglang: MLA TP rank %s: TP rank 0 clears the shared store %s",
                     getattr(self.storage_config, "tp_rank", "?"), self.dir)
            return True
        st = self._store
        if st is None:
            if self._closed:
                raise ValueError("kvx: clear() of a closed SGLang backend")
            self._open(required=True)
            st = self._store
        keys = [k for k in st.keyed_keys() if k != _common.NAMESPACE_KEY]
        if keys:
            st.keyed_delete(keys)
            left = sum(st.keyed_exists(keys)[0])
            if left:  # put again meanwhile (a backup running during clear)
                raise kvx.Error(f"kvx: clear() of {self.dir}: {left} pages were stored again while it ran")
        with self._parts_mu:
            self._parts_stored = None
        log.info("kvx sglang: cleared %s (%d pages)", self.dir, len(keys))
        return True


_metrics_cls = None


def _metrics_class():
    """SGLang's StorageMetrics (its collector asserts isinstance), subclassed to carry .kvx; the stand-in's where
    SGLang is not installed."""
    global _metrics_cls
    if _metrics_cls is None:
        base = _standin.StorageMetrics
        if HAVE_SGLANG:
            for mod in ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector"):
                try:
                    base = getattr(__import__(mod, fromlist=["StorageMetrics"]), "StorageMetrics")
                    break
                except Exception:
                    continue
        _metrics_cls = type("KvxStorageMetrics", (base,), {"__doc__": "StorageMetrics with kvx's counters (.kvx)."})
    return _metrics_cls
