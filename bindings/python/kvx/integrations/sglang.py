"""kvx as an SGLang HiCache L3 storage backend (HiCacheStorage).

SGLang loads it with ``--hicache-storage-backend dynamic`` and an extra
config naming the class::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvx",
        "module_path": "kvx.integrations.sglang", "class_name": "KvxHiCacheStorage",
        "path": "/var/cache/kvx-sglang", "page_bytes": 2097152, "capacity": "64GiB"}'

and constructs ``KvxHiCacheStorage(storage_config, kwargs)``
(StorageBackendFactory._create_dynamic_backend), then hands it the host KV
pool through ``register_mem_pool_host``.

Contract mirrored (sgl-project/sglang, as read for this module; docs/ENGINES.md
names the files and commit): python/sglang/srt/mem_cache/hicache_storage.py
(HiCacheStorage: get, batch_get, set, batch_set, exists, batch_exists ->
leading count, batch_get_v1 / batch_set_v1 -> per-key bools over the host
pool's pages, "raise rather than return None"),
python/sglang/srt/mem_cache/storage/backend_factory.py (the dynamic loader:
extra_config keys backend_name, module_path, class_name; the class must
subclass HiCacheStorage), and the cache controller's zero-copy page I/O
(batch_get_v1 results counted up to the first False).

Keys are SGLang's page hashes (get_hash_str: a SHA-256 hex chain); pages are
kvx keyed pages. The zero-copy v1 calls take the host pool's page pointers
from ``mem_pool_host.get_page_buffer_meta(host_indices)``: one or more
buffers per page (MHA page_first: K and V; MLA: one), stored as keyed pages
``key`` (the first buffer) and ``key + b"\\x00%d" % j`` (buffer j >= 1), read
in place and written in place. A caller's key holding a NUL byte is refused,
so no key of the generic interface names another page's buffer. A page is
reported got only when all of its buffers were; a missing one leaves its
buffers untouched. The number of buffers per page (the host pool's once a v1
call has shown it, else 1) is recorded in the store with every set (the
keyed page ``b"\\x00kvx-sglang-parts"``), so ``exists`` and ``batch_exists``
check every buffer of a page from the start, after a restart too.

Each (model, tp, pp, cp, dp) rank runs in its own process with its own store
directory, ``<path>/<model>_tp<r>of<n>[_pp..][_cp..][_dp..]``, unless
extra_config says ``"per_rank_path": true`` (path is already this rank's) or
path holds ``{rank}``. Failures raise (kvx.Error and its subclasses), never
return None: SGLang's prefetch and backup threads are not restarted.
"""
import ctypes
import threading

import kvx

from . import _common

try:  # the real base class when SGLang is installed (the dynamic loader checks issubclass)
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
    HAVE_SGLANG = True
except Exception:  # ImportError, or SGLang's own imports (torch) failing
    HAVE_SGLANG = False
    from ._hicache_standin import HiCacheStorage as _Base

__all__ = ["KvxHiCacheStorage", "HAVE_SGLANG"]

_SEP = b"\x00"  # part keys: key + NUL + j; a caller's key holding a NUL is refused
_PARTS_KEY = b"\x00kvx-sglang-parts"  # the buffers per page of the pages set last (decimal), in the store


def rank_tag(cfg):
    """The directory name of this rank: model, tp rank/size, and pp, cp, dp when in use."""
    g = lambda name, d: getattr(cfg, name, d)  # noqa: E731
    model = g("model_name", None)
    tag = (_common.tag_safe(model.replace("/", "-")) + "_") if model else ""
    tag += f"tp{g('tp_rank', 0)}of{g('tp_size', 1)}"
    if g("pp_size", 1) > 1:
        tag += f"_pp{g('pp_rank', 0)}of{g('pp_size', 1)}"
    if (g("attn_cp_size", 1) or 1) > 1:
        tag += f"_cp{g('attn_cp_rank', 0)}of{g('attn_cp_size', 1)}"
    if (g("dp_size", 1) or 1) > 1:
        tag += f"_dp{g('dp_rank', 0)}of{g('dp_size', 1)}"
    return tag


def _as_buffer(obj, writable, what):
    """A contiguous byte memoryview of obj, zero-copy: any buffer (numpy arrays, bytearray, ctypes), or a CPU
    tensor (through .numpy()), or an object with data_ptr()/numel()/element_size() (pinned host memory)."""
    if obj is None:
        raise kvx.InvalidError(f"KVX_EINVALID: {what}: no buffer given")
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
            n = int(obj.numel()) * int(obj.element_size())
            m = memoryview((ctypes.c_ubyte * n).from_address(int(obj.data_ptr())))
        if m is None:
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what}: {type(obj).__name__} is not a buffer")
    if not m.c_contiguous or (writable and m.readonly):
        _common.raise_kvx(kvx.InvalidError, kvx.EINVALID,
                          f"{what}: not a contiguous{' writable' if writable else ''} buffer")
    return m.cast("B") if (m.ndim != 1 or m.format != "B") else m


def _ptr_buffer(ptr, size, i):
    if not ptr or size <= 0:
        _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"page buffer {i}: pointer {ptr:#x}, {size} bytes")
    return memoryview((ctypes.c_ubyte * int(size)).from_address(int(ptr)))


class KvxHiCacheStorage(_Base):
    """HiCacheStorage over a kvx keyed store (see the module doc).

    extra_config: path (required), page_bytes (required to create the store; checked against an existing one;
    at least the largest page buffer), capacity (default "64GiB"), per_rank_path, nosync (tests and benchmarks
    only), verify.
    """

    def __init__(self, storage_config, kwargs=None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.storage_config = storage_config
        self.dir = _common.store_dir(extra.get("path"), rank_tag(storage_config),
                                     bool(extra.get("per_rank_path", False)))
        self._store = _common.open_keyed_store(self.dir, extra.get("page_bytes"), extra.get("capacity", "64GiB"),
                                               nosync=bool(extra.get("nosync", False)),
                                               verify=bool(extra.get("verify", False)))
        self.page_bytes = self._store.page_bytes
        self.mem_pool_host = (kwargs or {}).get("mem_pool_host")
        self._parts_mu = threading.Lock()
        self._parts_seen = None  # the host pool's buffers per page, once a v1 call has seen it
        try:
            self._parts_stored = self._read_parts()  # None: no record (a new store, or one of an older kvx)
        except BaseException:
            self._store.close()
            raise

    # ---- life cycle -----------------------------------------------------------

    def close(self):
        """Close the store (idempotent). Everything set so far is durable already."""
        self._store.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- keys ---------------------------------------------------------------

    @staticmethod
    def _keys(keys, what):
        if isinstance(keys, (str, bytes)):
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what}: keys is a list of keys, not one key")
        out = [_common.key_bytes(k, i) for i, k in enumerate(keys)]
        for i, k in enumerate(out):
            if _SEP in k:  # the part separator: such a key could name another page's buffer
                _common.raise_kvx(kvx.InvalidError, kvx.EINVALID,
                                  f"{what}: keys[{i}] holds a NUL byte (kvx's SGLang adapter keeps NUL for the "
                                  "keys of a page's buffers)")
        return out

    @staticmethod
    def _part_keys(keys, parts):
        """Buffer j of a page: key itself for j 0 (a one-buffer page is stored under its key alone), then
        key + NUL + j, which no caller's key can be (_keys refuses a NUL)."""
        if parts == 1:
            return keys
        return [k if j == 0 else k + _SEP + b"%d" % j for k in keys for j in range(parts)]

    def _read_parts(self):
        """The buffers per page recorded in the store, or None (no record, or an unreadable one)."""
        (v,) = self._store.keyed_get([_PARTS_KEY])
        if v is None:
            return None
        with v:
            rec = bytes(v.page)
        return int(rec) if rec.isdigit() and 1 <= int(rec) <= 4096 else None

    def _parts(self):
        """Buffers per page for exists/batch_exists: the host pool's once a v1 call has seen it, else the
        store's record (the pages set last, by this process or one before it), else 1."""
        return self._parts_seen or self._parts_stored or 1

    def _put(self, keys, bufs, parts):
        """One keyed put of every page, with the record of parts (the buffers per page exists and
        batch_exists check: the pool's, or 1 before any v1 call), then a flush: durable when this returns."""
        for i, b in enumerate(bufs):
            if not 1 <= b.nbytes <= self.page_bytes:
                _common.raise_kvx(kvx.InvalidError, kvx.EINVALID,
                                  f"page {i} holds {b.nbytes} bytes (a page is 1..{self.page_bytes})")
        with self._parts_mu:
            if self._parts_stored not in (None, parts):  # another shape than recorded: the record is replaced
                self._store.keyed_delete([_PARTS_KEY])
            self._parts_stored = parts
        # the record goes with every put: a held record is skipped, an evicted one is written again
        with self._store.batch() as b:  # flushes on exit: 0 = durable; an exception drops only these pages
            b.keyed_put(list(keys) + [_PARTS_KEY], list(bufs) + [b"%d" % parts])

    # ---- the generic (copying) interface -----------------------------------

    def get(self, key, target_location=None, target_sizes=None):
        """The page into target_location (returned), or a new bytearray when none is given; None when not
        held."""
        k = self._keys([key], "get")
        if target_location is None:
            (v,) = self._store.keyed_get(k)
            if v is None:
                return None
            with v:
                return bytearray(v.page)
        ok = self._store.keyed_get_into(k, [_as_buffer(target_location, True, "get")])
        return target_location if ok[0] else None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """[target or None] per key (one C call)."""
        ks = self._keys(keys, "batch_get")
        if target_locations is None:
            out = []
            for v in self._store.keyed_get(ks):
                if v is None:
                    out.append(None)
                else:
                    with v:
                        out.append(bytearray(v.page))
            return out
        if len(target_locations) != len(ks):
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID,
                              f"batch_get: {len(ks)} keys but {len(target_locations)} targets")
        bufs = [_as_buffer(t, True, f"batch_get target {i}") for i, t in enumerate(target_locations)]
        ok = self._store.keyed_get_into(ks, bufs)
        return [t if o else None for t, o in zip(target_locations, ok)]

    def set(self, key, value=None, target_location=None, target_sizes=None):
        """Store value (any buffer or CPU tensor) under key; True once durable (a key already held is kept)."""
        src = value if value is not None else target_location
        self._put(self._keys([key], "set"), [_as_buffer(src, False, "set")], self._parts_seen or 1)
        return True

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """Store every value under its key in one put and one flush; True once all are durable."""
        ks = self._keys(keys, "batch_set")
        src = values if values is not None else target_locations
        if src is None or len(src) != len(ks):
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"batch_set: {len(ks)} keys but "
                              f"{0 if src is None else len(src)} values")
        if ks:
            self._put(ks, [_as_buffer(v, False, f"batch_set value {i}") for i, v in enumerate(src)],
                      self._parts_seen or 1)
        return True

    def exists(self, key):
        """Whether key's page is held (every one of its buffers, for multi-buffer pages)."""
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys, extra_info=None):
        """How many leading keys are held (all of their page buffers, for multi-buffer pages: as many as the
        host pool gives, or as the store recorded before the pool was seen, e.g. right after a restart)."""
        ks = self._keys(keys, "batch_exists")
        if not ks:
            return 0
        parts = self._parts()
        if parts == 1:
            return self._store.keyed_exists(ks)[1]
        held = self._store.keyed_exists(self._part_keys(ks, parts))[0]
        for i in range(len(ks)):
            if not all(held[i * parts:(i + 1) * parts]):
                return i
        return len(ks)

    # ---- zero-copy over the host pool (interface v1) -------------------------

    def _page_buffers(self, keys, host_indices, writable):
        pool = getattr(self, "mem_pool_host", None)
        if pool is None:
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID,
                              "no host pool: register_mem_pool_host() comes before batch_get_v1/batch_set_v1")
        page_size = int(getattr(pool, "page_size", 0) or 0)
        if page_size and len(host_indices) != len(keys) * page_size:
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{len(keys)} keys but {len(host_indices)} host "
                              f"indices (page_size {page_size})")
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        ptrs = list(ptrs)
        sizes = [int(sizes)] * len(ptrs) if isinstance(sizes, int) else list(sizes)
        if not keys or len(ptrs) % len(keys) or len(sizes) != len(ptrs):
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID,
                              f"{len(keys)} keys but {len(ptrs)} page buffers ({len(sizes)} sizes) from the host pool")
        parts = len(ptrs) // len(keys)
        self._parts_seen = parts
        return parts, [_ptr_buffer(p, s, i) for i, (p, s) in enumerate(zip(ptrs, sizes))]

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Read each page straight into the host pool's buffers. -> [bool] per key (True: every buffer of the
        page was filled; False: not held, buffers untouched)."""
        ks = self._keys(keys, "batch_get_v1")
        if not ks:
            return []
        parts, bufs = self._page_buffers(ks, host_indices, True)
        # a page is all its parts or nothing: one whose K is held but whose
        # V was evicted leaves both buffers untouched (group)
        ok = self._store.keyed_get_into(self._part_keys(ks, parts), bufs, group=parts)
        return [ok[i * parts] for i in range(len(ks))]

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Write each page from the host pool's buffers (read in place), one put and one flush. -> [True] per
        key once durable; a failure raises (nothing of this call acknowledged)."""
        ks = self._keys(keys, "batch_set_v1")
        if not ks:
            return []
        parts, bufs = self._page_buffers(ks, host_indices, False)
        self._put(self._part_keys(ks, parts), bufs, parts)
        return [True] * len(ks)

    def clear(self):
        """Not supported: kvx deletes only pages an owner names (DESIGN.md trust rule 2). Returns False."""
        return False

    def get_stats(self):
        return None
